"""The pack's background Triton compiles, run in worker processes instead of this process's threads.

A Triton compile holds this process's GIL for all but its last step: the Python front end, and the
MLIR/LLVM passes, whose binding (``PassManager.run``) does not release it; only ptxas runs outside.
The compiles that :mod:`kernels.prepare` hands to its thread pool therefore run one at a time,
against every other Python thread of ComfyUI's process, and slow the thread that matters most: the
model's, and Inductor's tracing under the Triton Compile Model. On an H100 (2026-11-25, HunyuanVideo
natively through the Triton Compile Model, the calibration stored, Triton's cache empty) the
eager glue's 6 kernels compiled in the background, while Inductor traced the blocks, made the trace
2-4 s slower: what they had cost in ComfyUI's thread before.

Here a compile that Triton's asynchronous mode submits is done twice, cheaply: a worker process
compiles it into Triton's cache folder (the same folder, the same key: the same source, signature,
constants, target, options and environment), then the thread calls Triton's own compile, which finds
it in the cache and only loads it. Whatever the worker could not do (a kernel outside the pack, a
worker that failed to start or died, a key that differs after all) costs only that: Triton's compile
then compiles it in the thread, as before. Nothing a worker gives is trusted but the cache entry
Triton checks itself.

Workers start in the background at ComfyUI's start (:func:`start_at_launch`, from the pack's
``__init__``), else the first time a compile is submitted; until one has imported Triton and the pack's
kernels, compiles run in the threads. Each worker is a Python process with torch imported (about 600 MB
resident on Linux) from ComfyUI's start until IDLE_S after its last compile, and the gain is a second or
more once per cold cache. So by default (``TRITONKIT_COMPILE_WORKERS`` unset, or ``cold``) they start only
when that is now: where Triton's cache folder holds nothing the pack compiled with this Triton and these
kernel sources (:func:`cold`, a small marker file that the first background compile writes into the
folder; ``install.py`` empties it with the folder), and only as many as a tenth of the machine's RAM
holds (:func:`cold_workers`); once idle they exit for good. A model that Triton's cache holds no kernels
for, on a cache another model warmed, is the same case: a node that patches it starts them
(:func:`start_for_model`; the marker also lists the models the pack compiled for). Measured on an H100
(2026-11-27, HunyuanVideo natively with both nodes after Flux, 12 steps, 7 runs in four calls against 4 in two): a
first step of 3.06-3.92 s against 5.04-6.29 with the compiles in threads, and 4.45-5.18 s of cold cost over
the steady steps against 5.80-7.89. Workers started with ComfyUI (``auto``, the bound) gave 2.15-2.60 s and
3.27 s; the rest is their start, seconds in which the first compiles run in threads. Making those compiles
wait for the workers instead gave a shorter first step (2.48-3.17 s) and the kernels later by as much (4.34 s
of cold cost against 4.45 in the one pair timed whole): dropped. ``0`` turns them off, ``auto`` (one core
less than the machine has, at most MAX_WORKERS) or a number turns them on at every start. Measured
(Triton 3.6.0, torch 2.11, HunyuanVideo eager @86, every cache empty, 8 workers against the threads,
A B A B): the cold calibration's extra time 4.51-4.88 s against 5.55-5.57 on an H100, 6.15-6.32 against
7.53-7.73 on an H200 (twentieth session); on H100s, with the launchers and the decode kernel compiled
ahead too, 2.2-2.5 s against 3.4-4.1 (twenty-second session, BENCHMARKS.md); with the calibration stored
and the blocks compiled by the Triton Compile Model, 4 workers gave 10.4-11.0 s against 11.6-12.7 on
the H200 and no gain beyond Inductor's own spread on the H100s (8 workers too).

This file is also the worker: ``python compile_pool.py ROOT ROOT_PATH`` reads pickled jobs on stdin and
answers on stdout.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Optional

log = logging.getLogger("TritonKit")

WORKERS_ENV = "TRITONKIT_COMPILE_WORKERS"
# The marker file, in Triton's cache folder, that says the pack's kernels were compiled there (cold()), and
# for which models (seen()): {"triton": ..., "kernels": ..., "models": [fingerprint, ...]}.
MARK_FILE = "tritonkit-compiled.json"
# The marker keeps this many models' fingerprints, the latest.
MAX_MODELS = 64
# Without the variable, workers start on a cold cache only, at most as many as RAM_SHARE of the machine's
# RAM holds at WORKER_RAM bytes each (the resident size of a worker on Linux, torch and Triton imported).
WORKER_RAM = 600 * 2**20
RAM_SHARE = 0.10
# With the variable set to "auto": one core less than the machine has, at most this many.
MAX_WORKERS = 8
# A worker that dies is replaced, at most this many times in a process; then the pool closes.
MAX_RESPAWNS = 4
# A job a worker has not answered in this many seconds is taken from it: the worker is stopped (and
# replaced, as one that died) and the thread compiles the kernel. The pack's largest kernels compile in
# 1-5 s on an H100's host (2026-11-25); a compile that a worker is stuck in must not hold up a model
# whose first call waits for it (a compiled model's eager first call, kernels/prepare.py).
JOB_TIMEOUT_S = 120.0
# Workers that have had no job for this many seconds exit, and their memory comes back; the next compile
# submitted starts them again (the threads compile until they are ready). Started with ComfyUI, they
# wait this long for a first prompt.
IDLE_S = 300.0
# The pack's modules whose kernels the workers compile, imported before a worker says it is ready.
KERNEL_MODULES = ("kernels.fp8", "kernels.fp8_linear", "kernels.attention")
# Names of the variables Triton's asynchronous compile closes over (JITFunction._do_compile's
# ``async_compile``, Triton 3.4 to 3.8): the kernel, its ASTSource, the target, the options, the
# environment that keys the cache.
_CLOSURE = ("self", "src", "target", "options")
# "0": the Gluon kernels compile in a thread of this process, as before 2026-11-27 (A/B runs)
GLUON_ENV = "TRITONKIT_GLUON_IN_WORKERS"

COUNTERS = {"worker_compiles": 0, "worker_errors": 0, "thread_compiles": 0, "worker_starts": 0, "cache_hits": 0,
            "worker_idle_exits": 0}

_HERE = os.path.dirname(os.path.abspath(__file__))
# the package this file belongs to ("ComfyUI-TritonKit" as ComfyUI imports the folder, "tritonkit" in
# tests) and the folder that holds it; None when run as a script (the worker)
_ROOT = __name__.rsplit(".", 2)[0] if __name__.count(".") >= 2 else None
_ROOT_PATH = os.path.dirname(_HERE)


def _by_default() -> bool:
    """Whether the variable leaves the choice to the pack (unset or ``cold``): workers on a cold cache only."""
    return os.environ.get(WORKERS_ENV, "").strip().lower() in ("", "cold")


def workers() -> int:
    """How many worker processes: ``TRITONKIT_COMPILE_WORKERS`` as a number, or ``auto`` (one core less
    than the machine has, at most MAX_WORKERS); unset or ``cold``, what :func:`start_at_launch` decided for
    this process (0 unless Triton's cache was cold at ComfyUI's start); 0 turns them off."""
    if _by_default():
        return _cold_n
    raw = os.environ.get(WORKERS_ENV, "").strip().lower()
    if raw == "auto":
        return max(1, min((os.cpu_count() or 2) - 1, MAX_WORKERS))
    try:
        return max(0, int(raw))
    except ValueError:
        log.warning("TritonKit: %s=%r is neither a number, auto nor cold; no compile workers", WORKERS_ENV, raw)
        return 0


# the number of workers the default (cold) gives this process, decided once at ComfyUI's start
_cold_n = 0


def cold_workers(cpu_count: Optional[int], ram_bytes: Optional[int]) -> int:
    """How many workers a cold cache gets on a machine with ``cpu_count`` cores and ``ram_bytes`` of RAM:
    one core less than it has, at most MAX_WORKERS, and no more than RAM_SHARE of its RAM holds; none
    where either is unknown."""
    if not cpu_count or not ram_bytes:
        return 0
    return max(0, min(cpu_count - 1, MAX_WORKERS, int(RAM_SHARE * ram_bytes // WORKER_RAM)))


def stamp() -> dict:
    """What the pack's compiled kernels in Triton's cache depend on, beside the GPU: Triton's version and
    the kernel modules' sources (Triton keys its cache by both, so either changing makes it cold)."""
    import triton
    h = hashlib.sha256()
    for name in KERNEL_MODULES:
        with open(os.path.join(_HERE, name.split(".")[-1] + ".py"), "rb") as f:
            h.update(f.read())
    return {"triton": getattr(triton, "__version__", "?"), "kernels": h.hexdigest()[:16]}


def _marker(cache_dir: Optional[str]) -> Optional[dict]:
    """The marker's content; None where there is none or it can't be read."""
    if not cache_dir:
        return None
    try:
        with open(os.path.join(cache_dir, MARK_FILE), encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) else None


def cold(cache_dir: Optional[str], want: dict) -> bool:
    """Whether Triton's cache folder holds nothing the pack compiled with ``want`` (:func:`stamp`): no
    marker, an unreadable one, or one of another Triton or other kernel sources."""
    m = _marker(cache_dir)
    return m is None or {k: m.get(k) for k in want} != want


def seen(cache_dir: Optional[str], want: dict, model: str) -> bool:
    """Whether the marker says the pack compiled ``model``'s kernels (a fingerprint the nodes make) into
    Triton's cache folder with ``want``."""
    m = _marker(cache_dir)
    return m is not None and {k: m.get(k) for k in want} == want and model in (m.get("models") or ())


_marked = False
# the fingerprints of the models the nodes patched in this process, for the marker
_models: list = []
_models_lock = threading.Lock()


def mark_compiled(cache_dir: Optional[str] = None) -> None:
    """Writes the marker, with the models patched so far, after a background compile succeeded: once per
    process, and again once a node patched a model the marker does not list (written whole or not at all;
    a folder that can't take it only means workers at the next start)."""
    global _marked
    with _models_lock:
        if _marked:
            return
        _marked = True
        mine = list(_models)
    cache_dir = cache_dir or _cache_dir()
    if not cache_dir:
        return
    try:
        want = stamp()
        m = None if cold(cache_dir, want) else _marker(cache_dir)
        listed = [x for x in (m or {}).get("models") or () if isinstance(x, str)]
        new = [x for x in mine if x not in listed]
        if m is not None and not new:
            return
        os.makedirs(cache_dir, exist_ok=True)
        tmp = os.path.join(cache_dir, f"{MARK_FILE}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(dict(want, models=(listed + new)[-MAX_MODELS:]), f)
        os.replace(tmp, os.path.join(cache_dir, MARK_FILE))
    except Exception as e:  # noqa: BLE001
        log.debug("TritonKit: could not mark Triton's cache as compiled (%s)", e)


def _ram_bytes() -> Optional[int]:
    try:
        import psutil  # ComfyUI's own dependency (comfy/model_management.py)
        return int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001
        return None


def _is_jit(obj) -> bool:
    """A JITFunction, Gluon's included (a subclass)."""
    return any(t.__name__ == "JITFunction" for t in type(obj).__mro__)


def _unwrap(obj):
    """The JITFunction under Triton's autotuner / heuristics wrappers."""
    seen = 0
    while obj is not None and not _is_jit(obj) and hasattr(obj, "fn") and seen < 8:
        obj, seen = obj.fn, seen + 1
    return obj


def _cache_dir() -> Optional[str]:
    try:
        from triton import knobs
        return knobs.cache.dir
    except Exception:  # noqa: BLE001 - an older Triton: the worker reads the same environment
        return None


def _closure(compile_fn) -> Optional[dict]:
    """The variables Triton's asynchronous compile closure closes over, by name; None for another
    callable."""
    code = getattr(compile_fn, "__code__", None)
    cells = getattr(compile_fn, "__closure__", None)
    if code is None or not cells or not all(n in code.co_freevars for n in _CLOSURE):
        return None
    try:
        return {n: c.cell_contents for n, c in zip(code.co_freevars, cells)}
    except ValueError:  # an empty cell
        return None


def job_of(compile_fn) -> Optional[dict]:
    """What a worker needs to compile what Triton's ``compile_fn`` (its asynchronous compile closure)
    would, or None where a worker can't: not Triton's closure, a kernel outside the pack, a kernel
    that is not the module's attribute of its name, arguments that don't pickle."""
    env = _closure(compile_fn) if _ROOT is not None else None
    if env is None:
        return None
    jit, src = env["self"], env["src"]
    gluon = bool(getattr(jit, "is_gluon", lambda: False)())
    if gluon and os.environ.get(GLUON_ENV, "1").strip() == "0":
        return None
    fn = getattr(jit, "fn", None)
    module, name = getattr(fn, "__module__", None), getattr(fn, "__name__", None)
    if not module or not name or not module.startswith(_ROOT + ".") or module not in sys.modules:
        return None
    if _unwrap(getattr(sys.modules[module], name, None)) is not jit:
        return None  # made by a factory, or replaced: the worker would compile another kernel
    try:
        job = {"module": module[len(_ROOT) + 1:], "name": name,
               "signature": src.signature, "constexprs": src.constants, "attrs": src.attrs,
               "target": env["target"], "options": dict(env["options"].__dict__),
               "env_vars": env.get("env_vars"), "cache_dir": _cache_dir(),
               "gluon": gluon}
        pickle.dumps(job)
    except Exception:  # noqa: BLE001 - anything unusual: the thread compiles it
        return None
    return job


class _Pool:
    """Worker processes, each answering one job at a time."""

    def __init__(self, n: int, restart: bool = True):
        self.n = n
        # whether a compile after the idle exit starts them again (set by the user); the default's workers,
        # started for a cold cache, are not: the pool closes then, and later compiles (a new shape class's
        # few kernels, on a warm cache) run in the threads, which is sooner than a worker importing torch
        self.restart = restart
        self._idle: list = []
        self._cond = threading.Condition()
        self._alive = 0       # started and ready
        self._starting = 0
        self._respawns = 0
        self._started = False
        self._last_use = time.monotonic()
        self.closed = False

    def start(self) -> None:
        """Starts the workers (again, after they exited idle), in the background."""
        with self._cond:
            if self._started or self.closed:
                return
            self._started = True
            self._starting = self.n
            self._last_use = time.monotonic()
        for _ in range(self.n):
            threading.Thread(target=self._spawn, name="tritonkit-compile-worker-start", daemon=True).start()
        threading.Thread(target=self._exit_when_idle, name="tritonkit-compile-worker-idle", daemon=True).start()

    def _exit_when_idle(self) -> None:
        """Stops every worker once none has had a job for IDLE_S seconds (and none is starting)."""
        with self._cond:
            while True:
                if self.closed or not self._started:
                    return
                idle_for = time.monotonic() - self._last_use
                if idle_for >= IDLE_S and self._starting == 0 and len(self._idle) == self._alive:
                    procs, self._idle = self._idle, []
                    self._alive = 0
                    self._started = False
                    self.closed = not self.restart
                    break
                self._cond.wait(timeout=min(max(IDLE_S - idle_for, 0.05), 30.0))
        COUNTERS["worker_idle_exits"] += len(procs)
        log.info("TritonKit: %d compile worker(s) had no compile for %.0f s and exited; %s", len(procs), IDLE_S,
                 "the next compile starts them again" if self.restart else "later compiles run in threads")
        for p in procs:
            _stop(p)

    def _spawn(self) -> None:
        proc = None
        try:
            flags = getattr(subprocess, "CREATE_NO_WINDOW", 0) if os.name == "nt" else 0
            proc = subprocess.Popen([sys.executable, "-u", os.path.abspath(__file__), _ROOT, _ROOT_PATH],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    creationflags=flags)
            msg = pickle.load(proc.stdout)
            if not (isinstance(msg, tuple) and msg and msg[0] == "ready"):
                raise RuntimeError(f"unexpected first message {msg!r}")
        except Exception as e:  # noqa: BLE001
            if proc is not None:
                proc.kill()
            with self._cond:
                self._starting -= 1
                if self._alive == 0 and self._starting == 0:
                    self.closed = True
                self._cond.notify_all()
            log.info("TritonKit: a compile worker did not start (%s: %s); compiles run in ComfyUI's process",
                     type(e).__name__, e)
            return
        with self._cond:
            self._starting -= 1
            closed = self.closed
            if not closed:
                COUNTERS["worker_starts"] += 1
                self._alive += 1
                self._idle.append(proc)
            self._cond.notify_all()
        if closed:  # the pool closed while this worker started: nothing would ever stop it
            _stop(proc)

    def ready(self) -> bool:
        with self._cond:
            return self._alive > 0 and not self.closed

    def run(self, job: dict) -> bool:
        """Has a worker compile ``job``; whether it did. Waits for a free worker; False at once when
        none is left."""
        with self._cond:
            while not self._idle:
                if self.closed or (self._alive == 0 and self._starting == 0):
                    return False
                self._cond.wait(timeout=1.0)
            proc = self._idle.pop()
            self._last_use = time.monotonic()
        timed_out = threading.Event()

        def stop():
            timed_out.set()
            proc.kill()  # its answer pipe closes: the read below fails and the worker is replaced

        watchdog = threading.Timer(JOB_TIMEOUT_S, stop)
        watchdog.daemon = True
        watchdog.start()
        try:
            pickle.dump(job, proc.stdin)
            proc.stdin.flush()
            ok, detail = pickle.load(proc.stdout)
        except Exception:  # noqa: BLE001 - the worker died or was stopped: replace it
            if timed_out.is_set():
                log.warning("TritonKit: a compile worker gave no answer in %.0f s for %s; it was stopped and the "
                            "kernel compiles in ComfyUI's process", JOB_TIMEOUT_S, job.get("name"))
            proc.kill()
            with self._cond:
                self._alive -= 1
                respawn = self._respawns < MAX_RESPAWNS and not self.closed
                if respawn:
                    self._respawns += 1
                    self._starting += 1
                elif self._alive == 0:
                    self.closed = True
                self._cond.notify_all()
            if respawn:
                threading.Thread(target=self._spawn, daemon=True).start()
            return False
        finally:
            watchdog.cancel()
        with self._cond:
            self._idle.append(proc)
            self._last_use = time.monotonic()
            self._cond.notify_all()
        if not ok:
            COUNTERS["worker_errors"] += 1
            log.debug("TritonKit compile worker: %s", detail)
        return bool(ok)

    def close(self) -> None:
        with self._cond:
            self.closed = True
            procs, self._idle = self._idle, []
            self._alive -= len(procs)
            self._cond.notify_all()
        for p in procs:
            _stop(p)


def _stop(proc) -> None:
    """Ends an idle worker: its input closed (it returns), killed if it does not within 5 s."""
    try:
        proc.stdin.close()
        proc.wait(timeout=5)
    except Exception:  # noqa: BLE001
        proc.kill()


_pool: Optional[_Pool] = None
_pool_lock = threading.Lock()


def pool() -> Optional[_Pool]:
    """The process's worker pool (not started), or None where workers are off or can't run here."""
    global _pool
    with _pool_lock:
        if _pool is None and _ROOT is not None and workers() > 0 and sys.executable:
            _pool = _Pool(workers(), restart=not _by_default())
            import atexit
            atexit.register(_pool.close)
        return _pool


def status() -> dict:
    """How many workers this process has (0: the compiles run in threads), how many are up now, and the
    counters (the route ``/tritonkit/calibration`` shows it)."""
    p = _pool
    return {"workers": workers(), "setting": os.environ.get(WORKERS_ENV, "").strip() or "cold",
            "alive": p._alive if p is not None else 0, "counters": dict(COUNTERS)}


def start() -> None:
    """Starts the workers in the background (nothing waits for them)."""
    p = pool()
    if p is not None:
        p.start()


def start_at_launch(background: bool = False) -> bool:
    """At ComfyUI's start (the pack's ``__init__``): starts the workers where a CUDA GPU is there to
    compile for and they are turned on, or, by default, where Triton's cache is cold (:func:`cold`, with
    :func:`cold_workers` of them); whether it did. A worker needs seconds to import torch: started when
    the first model was patched, they were not ready for its first step (see the docstring).
    ``background``: the default's check (it imports Triton) runs in a thread, off ComfyUI's start-up; True
    then says only that it runs. Then Triton's own key is computed in another thread too (launchers.warm_key)."""
    if background:
        from . import launchers
        launchers.warm_key_in_background()
    default = _by_default()
    if not default and workers() <= 0:
        return False
    import torch
    if not torch.cuda.is_available():
        return False
    if default:
        if background:
            threading.Thread(target=_start_if_cold, name="tritonkit-compile-worker-check", daemon=True).start()
            return True
        return _start_if_cold()
    start()
    return pool() is not None


def _start_if_cold() -> bool:
    return _start_by_default(lambda: cold(_cache_dir(), stamp()),
                             "Triton's cache holds none of the pack's kernels yet: %d compile worker(s) start for the "
                             "first run (%s=0 turns them off)")


def _start_by_default(needed, message: str) -> bool:
    """The default's workers (:func:`cold_workers` of them, exiting idle for good), started where ``needed()``
    says so; whether they did. A pool of earlier ones that exited idle is replaced. ``message`` is logged with
    their number and the variable's name."""
    global _cold_n, _pool
    n = cold_workers(os.cpu_count(), _ram_bytes())
    try:
        if n <= 0 or not needed():
            return False
    except Exception as e:  # noqa: BLE001 - Triton that does not import: the self-test says why
        log.debug("TritonKit: no compile workers (%s: %s)", type(e).__name__, e)
        return False
    with _pool_lock:
        if _pool is not None and _pool.closed:  # earlier default workers, exited idle for good
            _pool = None
    _cold_n = n
    log.info(message, n, WORKERS_ENV)
    start()
    return pool() is not None


def start_for_model(model: str) -> bool:
    """When a node patches a model (``model``: a fingerprint of it and the node's settings, which the nodes
    make), by default: workers start, as many as for a cold cache, where the marker does not list the model
    and none run in this process. Whether they did. A cache that another model warmed gave none at ComfyUI's
    start, and the model's first step then compiled its kernels in 15 threads against the model's own
    (see the module's docstring). The marker lists the model after its first successful background compile.
    Workers set by the variable (a number, ``auto``) start at the first compile anyway; ``0`` keeps them off."""
    global _marked
    with _models_lock:
        if model not in _models:
            _models.append(model)
            _marked = False
    if not _by_default() or (_pool is not None and not _pool.closed):
        return False
    import torch
    if not torch.cuda.is_available():
        return False
    return _start_by_default(lambda: not seen(_cache_dir(), stamp(), model),
                             "Triton's cache holds none of this model's kernels yet: %d compile worker(s) start for "
                             "its first run (%s=0 turns them off)")


class RoutingExecutor(Executor):
    """A thread pool whose compiles go through a worker process where one can do them."""

    def __init__(self, threads: int):
        self._threads = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tritonkit-prepare")

    def submit(self, fn, /, *args, **kwargs):
        """The compile ``fn`` in a thread (through a worker where one can do it), then its kernel's
        launcher (kernels/launchers.py): the future is done when both are."""
        from . import launchers
        p = pool()
        job = job_of(fn) if p is not None and not args and not kwargs else None
        if job is not None:
            fut = self._threads.submit(launchers.compiled, _via_worker, p, job, fn)
        else:
            COUNTERS["thread_compiles"] += 1
            fut = self._threads.submit(launchers.compiled, fn, *args, **kwargs)
        fut.add_done_callback(_mark_when_done)
        return fut

    def shutdown(self, wait: bool = True, **kwargs):
        self._threads.shutdown(wait=wait, **kwargs)


def _mark_when_done(fut) -> None:
    if not _marked and not fut.cancelled() and fut.exception() is None:
        mark_compiled()


def _cached(compile_fn) -> bool:
    """Whether Triton's cache holds what ``compile_fn`` compiles (its own compile would only load it), by
    Triton's own key: a warm restart then loads at once instead of queueing behind a worker's compiles
    (a stored calibration choice waits only 50 ms for its kernels, kernels/calibration.py). False where
    that can't be told here (another Triton's internals): the worker's round trip answers it then."""
    try:
        import hashlib
        from triton import knobs
        from triton.compiler import compiler as tc
        if knobs.runtime.add_stages_inspection_hook is not None or knobs.compilation.always_compile:
            return False
        env = _closure(compile_fn)
        if env is None:
            return False
        src, env_vars = env["src"], env.get("env_vars")
        if env_vars is None:
            from triton._C.libtriton import get_cache_invalidating_env_vars
            env_vars = get_cache_invalidating_env_vars()
        key = tc.get_cache_key(src, tc.make_backend(env["target"]), env["options"], env_vars=env_vars)
        manager = tc.get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest())
        name = f"{src.name[:150]}.json"
        return bool((manager.get_group(name) or {}).get(name))
    except Exception:  # noqa: BLE001
        return False


def _via_worker(p: _Pool, job: dict, fn):
    """In the pool's thread: a kernel that Triton's cache holds is loaded (no worker started for it);
    else a ready worker compiles it, or, with none ready (they start now), Triton's compile here."""
    if _cached(fn):
        COUNTERS["cache_hits"] += 1
        return fn()
    p.start()
    if p.ready() and p.run(job):
        COUNTERS["worker_compiles"] += 1
    else:
        COUNTERS["thread_compiles"] += 1
    return fn()  # Triton's own compile: a cache hit where the worker compiled it, else the compile


# ----------------------------------------------------------------------------- the worker

def _compile(job: dict) -> None:
    import importlib
    import inspect
    import triton
    from triton.compiler import ASTSource
    if job.get("cache_dir"):
        try:
            from triton import knobs
            knobs.cache.dir = job["cache_dir"]
        except Exception:  # noqa: BLE001 - an older Triton: the inherited environment
            pass
    if job.get("gluon"):  # a Gluon kernel's source makes its IR its own way
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource  # noqa: F811
    mod = importlib.import_module(f"{_WORKER_ROOT}.{job['module']}")
    jit = _unwrap(getattr(mod, job["name"]))
    src = ASTSource(jit, job["signature"], job["constexprs"], job["attrs"])
    kw = {}
    if job.get("env_vars") is not None and "_env_vars" in inspect.signature(triton.compile).parameters:
        kw["_env_vars"] = job["env_vars"]
    triton.compile(src, target=job["target"], options=job["options"], **kw)


_WORKER_ROOT = None


def _worker_main(root: str, root_path: str) -> None:
    global _WORKER_ROOT
    import importlib
    import types
    # answers go to the real stdout; anything printed (Triton's warnings, C++ output) to stderr
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    _WORKER_ROOT = root
    if root not in sys.modules:  # the pack's folder as a package, without running its __init__ (ComfyUI's nodes)
        pkg = types.ModuleType(root)
        pkg.__path__ = [root_path]
        sys.modules[root] = pkg
    for name in KERNEL_MODULES:
        importlib.import_module(f"{root}.{name}")
    pickle.dump(("ready", os.getpid()), out)
    out.flush()
    while True:
        try:
            job = pickle.load(inp)
        except EOFError:
            return
        t0 = time.perf_counter()
        try:
            _compile(job)
            answer = (True, time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - the thread compiles it and raises Triton's error there
            answer = (False, f"{type(e).__name__}: {e}"[:2000])
        pickle.dump(answer, out)
        out.flush()


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0] or ".") == _HERE:
        sys.path.pop(0)  # this folder's modules (fp8, tuning, ...) are the package's, not top-level ones
    _worker_main(sys.argv[1], sys.argv[2])
