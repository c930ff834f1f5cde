"""Preparing a calibration's candidates: their Triton kernels compiled in the background.

A first calibration on a cold Triton cache spends most of its time compiling: HunyuanVideo's first
step @86 on an H100 made 49 Triton compiles (45 s of compile time in all, 2026-11-24), and as the
model met one shape class after the other, each class's candidates were compiled (in parallel
among themselves) and timed before the model went on: a compile was running for 13 of the step's
20 s.

:func:`prepare` runs each candidate of a shape class once with every launch of the pack's kernels
turned into a compile (``runtime.launch`` while :data:`runtime.PREPARING` is set), nothing run on
the GPU but the torch operations between them, and hands the compiles to a thread pool through
Triton's asynchronous compile mode (``triton.runtime._async_compile``: a compile becomes a future in
the kernel's cache, and the first launch of that kernel waits for it). The calibration
(kernels/calibration.py) then lets the model go on with its default path, and times the candidates
at a later call of the same shape class, once :meth:`Prepared.done`: the compiles of every shape
class the model meets overlap each other and the model's own work.

Where this Triton has no asynchronous compile mode, :func:`available` is False and the calibration
compiles and times at the first call, as before.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable, Optional

from . import compile_pool, runtime

# At most this many compiles at once, and one core less than the machine has. A compile in a thread holds
# the GIL for all but ptxas (Triton's MLIR passes included) while the model keeps running Python in this
# process: kernels/compile_pool.py moves the compiles to worker processes where they are turned on.
MAX_THREADS = 16
_pool: Optional[compile_pool.RoutingExecutor] = None
_mode = None  # the one asynchronous compile mode of every preparing run (see _shared_mode)
_pool_lock = threading.Lock()
_in_flight: list = []  # the futures of every prepare() not yet seen done (see busy)


def _async_module():
    try:
        from triton.runtime import _async_compile as ac
    except Exception:  # noqa: BLE001 - an older Triton, or none usable
        return None
    if not hasattr(ac, "active_mode") or not hasattr(ac, "AsyncCompileMode"):
        return None
    return ac


def available() -> bool:
    """Whether this Triton compiles asynchronously (Triton 3.4+)."""
    return _async_module() is not None


def threads() -> int:
    """One core less than the machine has, at most MAX_THREADS; ``TRITONKIT_PREPARE_THREADS`` sets
    another number. Fewer did not help: with 4 an H100's cold HunyuanVideo @86 first step took
    16.8 s against 14.6 with 15 (2026-11-25)."""
    try:
        n = int(os.environ.get("TRITONKIT_PREPARE_THREADS", "0"))
    except ValueError:
        n = 0
    return n if n > 0 else max(1, min((os.cpu_count() or 2) - 1, MAX_THREADS))


def _executor() -> compile_pool.RoutingExecutor:
    """The threads that wait for the compiles; each compile is done by a worker process where one can
    (kernels/compile_pool.py: a compile in a thread holds this process's GIL)."""
    global _pool
    if _pool is None:
        _pool = compile_pool.RoutingExecutor(threads())
    return _pool


def busy() -> bool:
    """Whether a compile that :func:`prepare` started still runs. The calibration and the tuner time
    only once none does (kernels/calibration.py)."""
    with _pool_lock:
        _in_flight[:] = [f for f in _in_flight if not f.done()]
        return bool(_in_flight)


def _shared_mode(ac):
    """One ``AsyncCompileMode`` for the process: it keeps each compile's future by Triton's cache key,
    so a kernel that two shape classes share (the same block config of the fused linear at two layer
    shapes) is compiled once even while the first compile still runs (some Triton releases put a
    kernel compiled in the background into the JIT cache only when :meth:`Prepared.finalize` asks
    for it, so the cache alone would not see it)."""
    global _mode
    with _pool_lock:
        if _mode is None:
            _mode = ac.AsyncCompileMode(_executor())
        return _mode


def preparing() -> bool:
    """True inside :func:`prepare` (kernels/tuning.py then only compiles a key's block configs)."""
    return runtime.PREPARING.get() is not None


def _futures(compiled: list) -> list:
    """The futures of the compiles a preparing run waits for: those its launches started, and those
    they found in flight already (another shape class's preparing run started them)."""
    out, seen = [], set()
    for f in [vars(k).get("future") for k in compiled if hasattr(k, "__dict__")]:
        if f is not None and id(f) not in seen:
            seen.add(id(f))
            out.append(f)
    return out


class Prepared:
    """The compiles :func:`prepare` started for one shape class."""

    def __init__(self, futures: list, failed: dict, kernels: list = ()):
        self.futures = futures
        self.failed = failed    # candidate name -> the error its preparing run raised
        # what the launches got: Triton's FutureKernel for a compile in flight, else the compiled kernel
        self.kernels = [k for k in kernels if type(k).__name__ == "FutureKernel"]

    def done(self) -> bool:
        """Every compile finished (succeeded or failed: a failed one fails the candidate's timed run)."""
        return all(f.done() for f in self.futures)

    def settle(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds for every compile to finish (kernels that Triton's cache
        holds load in milliseconds); whether they all did. Nothing is finalized."""
        deadline = time.monotonic() + timeout
        while not self.done() and time.monotonic() < deadline:
            time.sleep(0.001)
        return self.done()

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits for every compile, then :meth:`finalize`."""
        for f in self.futures:
            try:
                f.result(timeout=timeout)
            except Exception:  # noqa: BLE001 - see done()
                pass
        self.finalize()

    def finalize(self) -> None:
        """Puts the finished kernels in their JIT function's cache, here, before anything launches them.
        Some Triton releases (3.6) put a compile's kernel there only when its future is asked for its
        result, not when it was submitted: a launch before that compiled the same kernel again, in the
        launching thread (an H100's cold HunyuanVideo step compiled every fused-linear config twice)."""
        for k in self.kernels:
            try:
                k.result()
            except Exception:  # noqa: BLE001 - see done()
                pass

    def __len__(self) -> int:
        return len(self.futures)


def prepare(fns: dict) -> Prepared:
    """Runs each ``fns[name]()`` with its kernel launches turned into background compiles (see the
    module docstring) and returns them as one :class:`Prepared`. A candidate that raises here is
    noted, not raised: its timed run shows what it does."""
    ac = _async_module()
    failed: dict = {}
    if ac is None:
        return Prepared([], failed)
    mode = _shared_mode(ac)
    compiled: list = []
    tok_mode = ac.active_mode.set(mode)
    tok_prep = runtime.PREPARING.set(compiled)
    try:
        for name, fn in fns.items():
            try:
                fn()
            except Exception as e:  # noqa: BLE001
                failed[name] = e
    finally:
        runtime.PREPARING.reset(tok_prep)
        ac.active_mode.reset(tok_mode)
    futures = _futures(compiled)
    with _pool_lock:
        _in_flight.extend(futures)
    return Prepared(futures, failed, compiled)


# ----------------------------------------------------------------------------- a compiled graph's calls
# Under torch.compile the pack's custom ops run with real tensors, outside the calibration that readies
# an eager call's kernels (kernels/calibration.py: _stored). A Triton Compile Model's first step, with the
# calibration stored and Triton's cache empty, compiled the 8-bit attention's kernels in the model's
# thread as the fresh graphs first ran them: 4.6 s of HunyuanVideo's 15.2 s compile step on an H100
# (2026-11-26). :func:`ready` lets such a call run another path while they compile in the background.
SETTLE_S = 0.05  # kernels that Triton's cache holds load within this (as kernels/calibration.WARM_WAIT_S)
_READY: dict = {}  # call key -> Prepared while its kernels compile, True once they are ready
_ready_lock = threading.Lock()


def known_ready(key) -> bool:
    """Whether :func:`ready` has answered True for ``key`` (one dict lookup)."""
    return _READY.get(key) is True


def ready(key, fn: Callable[[], object]) -> bool:
    """Whether the kernels that ``fn()`` launches are compiled. The first call of ``key`` prepares them
    (:func:`prepare`); where Triton's cache holds them they load within SETTLE_S and the answer is
    True; else they compile in the background, and this call and the later ones of ``key`` get False
    (the caller runs another path) until they are done. A preparing run that raised, or a Triton
    without asynchronous compiles: True (the launch compiles, or raises, as it would have)."""
    st = _READY.get(key)
    if st is True:
        return True
    with _ready_lock:
        st = _READY.get(key)
        if st is True:
            return True
        if st is None:
            if not available():
                _READY[key] = True
                return True
            st = prepare({"call": fn})
            if not st.failed and not st.settle(SETTLE_S):
                _READY[key] = st
                return False
        elif not st.done():
            return False
        st.wait()  # every kernel in its JIT cache before this thread launches it
        _READY[key] = True
        return True
