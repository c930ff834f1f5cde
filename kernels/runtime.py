"""How a Triton kernel of this pack gets launched on the tensors it is given.

* CUDA tensors: the normal JIT path (a launch repeated under a caller's plan key goes straight to the
  compiled kernel's launcher: kernels/fast_launch.py).
* CPU tensors: the triton-cpu backend when it is installed (``TRITON_CPU_BACKEND=1``),
  otherwise the Triton interpreter (``triton.runtime.interpreter.InterpretedFunction``),
  which runs the same kernel source in numpy. The interpreter is how CI checks numerics
  and how the self-test runs on machines without a GPU.

Importing this module needs Triton; callers that must survive a broken Triton import it
lazily and treat the ImportError like any other failure (see ``diagnostics.triage``).
"""
from __future__ import annotations

import contextvars
import functools
import os
import threading

import torch
import triton

from . import fast_launch

# Tests and CPU-only users can ask for the Triton path on CPU tensors (through the
# interpreter) in the model-patching nodes, which otherwise fall back to torch on CPU.
FORCE_CPU_ENV = "TRITONKIT_FORCE_TRITON_ON_CPU"


def force_triton_on_cpu() -> bool:
    return os.environ.get(FORCE_CPU_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def triton_cpu_backend_available() -> bool:
    """True when the triton-cpu fork is installed and switched on (seed 002)."""
    if os.environ.get("TRITON_CPU_BACKEND", "0") != "1":
        return False
    try:
        from triton.backends import backends
    except Exception:
        return False
    return "cpu" in backends


def interpreter_active() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# The Triton interpreter is not thread-safe: while it runs a kernel it patches triton.language,
# and a launch from another thread meanwhile fails ("Did you forget to add @triton.jit?"; the
# self-test node and the Triton tab's self-test route ran together in CI). Every interpreted
# launch holds this lock (re-entrant: callers that patch more around a launch hold it too).
INTERPRETER_LOCK = threading.RLock()


class Serialized:
    """An interpreted kernel whose launches (``kernel[grid](...)``) hold INTERPRETER_LOCK."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        launch = self.fn[grid]

        def locked(*args, **kwargs):
            with INTERPRETER_LOCK:
                return launch(*args, **kwargs)
        return locked


@functools.lru_cache(maxsize=None)
def interpreter_index_shim() -> bool:
    """Makes the interpreter's tensors usable as Python ints (``range(lo, hi)`` over loop bounds,
    ``int(...)``) with NumPy 2.4+. Before Triton 3.8 the interpreter converts a tensor's one-element
    array with ``int()``, which NumPy 2.4 refuses ("only 0-dimensional arrays can be converted to
    Python scalars"): every kernel with a loop bound computed in the kernel failed on CPU with
    torch 2.11's Triton 3.6 (the H100 machine, 2026-11-26). Triton 3.8 squeezes the array first;
    this does the same for the versions before it. Whether it is installed; never raises."""
    try:
        from triton.runtime import interpreter as ti
        orig = ti._patch_lang_tensor
    except Exception:  # noqa: BLE001 - an interpreter without this hook: left as it is
        return False
    if getattr(orig, "_tritonkit_index", False):
        return True

    def _index(self):
        data = self.handle.data
        return int(data.reshape(-1)[0]) if getattr(data, "size", 0) == 1 else int(data)

    def patched(tensor, *scope):
        # Triton 3.6+ passes a patch scope (its set_attr is undone after the launch); 3.5 and older patch
        # the class directly
        orig(tensor, *scope)
        if scope:
            scope[0].set_attr(tensor, "__index__", _index)
        else:
            tensor.__index__ = _index

    patched._tritonkit_index = True
    ti._patch_lang_tensor = patched
    return True


@functools.lru_cache(maxsize=None)
def _interpreted(jit_fn):
    from triton.runtime.interpreter import InterpretedFunction

    interpreter_index_shim()

    # ``jit_fn`` may be an Autotuner/Heuristics wrapper: unwrap to the JITFunction.
    fn = jit_fn
    while not hasattr(fn, "fn") or hasattr(fn.fn, "fn"):
        fn = fn.fn
    return Serialized(InterpretedFunction(fn.fn))


def kernel_for(jit_fn, device_type: str):
    """The launchable object for ``jit_fn`` on tensors of ``device_type``."""
    if device_type == "cpu":
        if interpreter_active():  # TRITON_INTERPRET=1: Triton interprets every launch itself
            interpreter_index_shim()
        elif not triton_cpu_backend_available():
            return _interpreted(jit_fn)
    return jit_fn


# A list while a calibration prepares its candidates (kernels/prepare.py), else None: every launch
# through :func:`launch` then only compiles its kernel (in the background, where Triton can), runs
# nothing, and adds what the compile gave (a compiled kernel, or the future of one) to the list.
PREPARING: contextvars.ContextVar = contextvars.ContextVar("tritonkit_preparing", default=None)


def launch(kernel, grid, *args, warmup: bool = False, plan=None, **kwargs):
    """``kernel[grid](*args, **kwargs)``; with ``warmup`` (or while a calibration prepares its
    candidates) the kernel is only compiled for these arguments, nothing runs. ``kernel`` comes from
    :func:`kernel_for`: an interpreted one has no compile step and always runs. ``plan``: a key that
    determines everything these arguments specialise on (CUDA tensors only): a launch made before under
    it skips Triton's dispatch (kernels/fast_launch.py)."""
    prepared = PREPARING.get()
    if (warmup or prepared is not None) and hasattr(kernel, "run"):
        compiled = kernel.run(*args, grid=grid, warmup=True, **kwargs)
        if prepared is not None:
            prepared.append(compiled)
        return compiled
    if plan is not None and hasattr(kernel, "run"):
        return fast_launch.launch(kernel, grid, args, kwargs, plan)
    return kernel[grid](*args, **kwargs)


# The pack's torch custom ops (tritonkit::attention, fp8_decode, fp8_encode, fp8_linear) are defined once per
# process. A second import of the pack (pytest's rootdir package beside ``tritonkit``, two copies of the folder in
# custom_nodes) must reuse the first definition: torch.library.custom_op replaces an op defined before, destroying
# the first registration, and an OpOverload the first copy kept then points at freed dispatcher memory (a segfault,
# std::bad_alloc or "vector::reserve" in OpOverload.__call__, BENCHMARKS.md, thirty-seventh session).
OP_NAMESPACE = "tritonkit"


def op_exists(name: str) -> bool:
    """Whether ``tritonkit::<name>`` is defined in this process (by any copy of the pack)."""
    try:
        getattr(getattr(torch.ops, OP_NAMESPACE), name)
        return True
    except (AttributeError, RuntimeError):
        return False


def cpu_mode() -> str:
    """How Triton kernels run on CPU tensors in this process."""
    if triton_cpu_backend_available():
        return "triton-cpu backend"
    return "Triton interpreter"


# Host-side arithmetic for launchers. triton.cdiv / triton.next_power_of_2 are Triton
# constexpr functions in recent Triton (callable from kernels too): ~10 us a call from Python
# through JITFunction.__call__, several per launch. These are the plain versions.
def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def next_pow2(n: int) -> int:
    """The smallest power of two >= n, as triton.next_power_of_2 (which gives 0 for 0)."""
    n = int(n)
    return n if n <= 1 else 1 << (n - 1).bit_length()


def eager_plain(x: torch.Tensor) -> bool:
    """An eager call (not traced by torch.compile) on a plain CPU / CUDA tensor: the kernels'
    ``*_op`` wrappers then call the implementation directly. The custom ops are for compiled graphs
    (and fake or subclass tensors); their Python dispatch costs ~10 us a call, which an eager model
    pays on every attention call and every fp8 layer of a step."""
    return type(x) is torch.Tensor and x.device.type in ("cpu", "cuda") and not torch.compiler.is_compiling()
