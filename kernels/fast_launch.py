"""Launching a compiled Triton kernel again without Triton's per-call dispatch.

``kernel[grid](*args)`` costs the host 30-45 us a launch in Triton 3.6 on an H100 machine's host: the JIT
binds the arguments, specialises each one (type, 16-byte alignment, value 1), hashes that into its cache
key, looks the compiled kernel up, checks the globals it used, builds the launch metadata, and only then
calls the kernel's launcher. An 8-bit attention call makes three launches (its statistics, its
quantisation, the attention kernel): 0.29-0.31 ms of host time a call at SDXL's and Flux's shapes against
0.19 for exact (``.device`` host profile, 2026-11-27), more than the GPU's 0.26 ms at SDXL.

A caller that knows what its arguments specialise on passes a ``plan`` key with the launch: every shape,
stride, scalar, constexpr and pointer alignment the arguments carry must follow from it (kernels/attention.py
keys a call by its tensors' shapes, strides, dtypes, 16-byte alignments, the scale and the block config).
The first launch under a key goes through Triton as always and keeps the compiled kernel it returns; a
later launch under the same key calls that kernel's launcher directly with the same argument list Triton
builds (every parameter in order, constexprs included). Triton's own path is taken instead when:

- the installed Triton's launch convention is not the one this was written against: Triton 3.4 or later
  (``triton.knobs``) whose ``JITFunction.run`` launches with exactly the call :data:`JIT_LAUNCH` spells (read from
  its source once; so a later Triton that changes the convention gets its own path, not a wrong launch). The
  same in 3.4.0, 3.5.1, 3.6.0, 3.7.1 and 3.8.0 (tests/triton_versions.py checks each);
- a launch hook is set (a profiler such as Proton wants each launch's metadata);
- the compile is asynchronous (a future, not a compiled kernel) or not CUDA;
- ``TRITONKIT_FAST_LAUNCH=0``.

A direct launch that raises drops its plan and the launch is made again through Triton, logged once.
"""
from __future__ import annotations

import inspect
import logging
import os
import threading

log = logging.getLogger("tritonkit")

ENV = "TRITONKIT_FAST_LAUNCH"
MAX_PLANS = 1024  # a model's shape classes × block configs tried; cleared whole when full

COUNTERS = {"fast_launches": 0, "plans": 0, "plan_failures": 0}
_PLANS: dict = {}
_TAILS: dict = {}  # (kernel, positional count, constexpr names) -> the parameters after the positional ones
_lock = threading.Lock()
_logged: set = set()


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _log_once(reason: str, msg: str) -> None:
    if reason not in _logged:
        _logged.add(reason)
        log.info("TritonKit fast launch: %s", msg)


_convention = None
_knobs = _driver = None

# The launch in Triton's ``JITFunction.run`` (whitespace removed) that :func:`launch` repeats: the compiled
# kernel's launcher called with the grid, the stream, the function, its packed metadata, the launch metadata, the
# two hooks and every bound parameter in order (constexprs included)
JIT_LAUNCH = ("kernel.run(grid_0,grid_1,grid_2,stream,kernel.function,kernel.packed_metadata,launch_metadata,"
              "knobs.runtime.launch_enter_hook,knobs.runtime.launch_exit_hook,*bound_args.values())")


def jit_launches_as_expected(run=None) -> bool:
    """Whether ``run`` (the installed ``JITFunction.run``) launches with the call :data:`JIT_LAUNCH` spells;
    False where its source can't be read."""
    import inspect
    import re
    try:
        if run is None:
            from triton.runtime.jit import JITFunction
            run = JITFunction.run
        src = inspect.getsource(run)
    except Exception:  # noqa: BLE001 - no source (a frozen install) or no such method: Triton's own path
        return False
    return JIT_LAUNCH in re.sub(r"\s+", "", src)


def convention_ok() -> bool:
    """Whether the installed Triton launches as ``CompiledKernel.run(gx, gy, gz, stream, function,
    packed_metadata, launch_metadata, enter_hook, exit_hook, *every parameter)``: 3.4 or later, its JIT's launch
    read from its source (:func:`jit_launches_as_expected`)."""
    global _convention, _knobs, _driver
    if _convention is None:
        try:
            import triton
            from triton import knobs  # 3.4+
            from triton.runtime import driver
            major, minor = (int(x) for x in triton.__version__.split(".")[:2])
            _knobs, _driver = knobs, driver
            _convention = (major, minor) >= (3, 4) and jit_launches_as_expected()
            if not _convention and (major, minor) >= (3, 4):
                _log_once("convention", f"Triton {triton.__version__} launches differently from the form this "
                                        "was written against: every launch goes through Triton's own path")
        except Exception:  # noqa: BLE001 - an older or unusual Triton: its own path
            _convention = False
    return _convention


def _hooks_empty() -> bool:
    """No launch hook set (None before Triton 3.5, an empty chain from 3.5)."""
    rt = _knobs.runtime
    for h in (rt.launch_enter_hook, rt.launch_exit_hook):
        if h is not None and getattr(h, "calls", True):
            return False
    return True


def _tail(kernel, n_args: int, kwargs: dict):
    """The values Triton's binder gives the parameters after the ``n_args`` positional ones (keyword
    arguments, then defaults), in the kernel's parameter order; None where one has no value."""
    names = tuple(sorted(kwargs))
    key = (kernel, n_args, names)
    spec = _TAILS.get(key)
    if spec is None:
        fn = getattr(kernel, "fn", None)
        params = list(inspect.signature(fn).parameters.values())[n_args:]
        spec = tuple((p.name, p.default) for p in params)
        _TAILS[key] = spec
    out = []
    for name, default in spec:
        if name in kwargs:
            out.append(kwargs[name])
        elif default is inspect.Parameter.empty:
            return None
        else:
            out.append(default)
    return tuple(out)


class _Plan:
    __slots__ = ("launcher", "function", "packed", "tail")

    def __init__(self, launcher, function, packed, tail):
        self.launcher, self.function, self.packed, self.tail = launcher, function, packed, tail


def _make_plan(compiled, kernel, n_args: int, kwargs: dict):
    if compiled is None or hasattr(compiled, "result") or not hasattr(compiled, "packed_metadata"):
        return None  # a future (asynchronous compile) or something else than a CompiledKernel
    tail = _tail(kernel, n_args, kwargs)
    if tail is None:
        return None
    launcher = compiled.run  # a property: loads the module and its launcher the first time
    return _Plan(launcher, compiled.function, compiled.packed_metadata, tail)


def launch(kernel, grid, args: tuple, kwargs: dict, plan):
    """``kernel[grid](*args, **kwargs)``, directly through the kernel's launcher where ``plan`` (a
    hashable key, see the module's text) has been launched before. Returns nothing."""
    if not (enabled() and convention_ok() and _hooks_empty()) or callable(grid):
        kernel[grid](*args, **kwargs)
        return
    key = (kernel, plan)
    p = _PLANS.get(key)
    if p is not None:
        drv = _driver.active
        stream = drv.get_current_stream(drv.get_current_device())
        g = tuple(grid) + (1, 1)
        try:
            p.launcher(g[0], g[1], g[2], stream, p.function, p.packed, None, None, None, *args, *p.tail)
            COUNTERS["fast_launches"] += 1
            return
        except Exception as e:  # noqa: BLE001 - Triton's own path, once more, below
            with _lock:
                _PLANS.pop(key, None)
                COUNTERS["plan_failures"] += 1
            _log_once(f"fail:{type(e).__name__}", f"a direct launch failed ({type(e).__name__}: {e}); "
                                                 "this kernel launches through Triton again")
    compiled = kernel.run(*args, grid=grid, warmup=False, **kwargs)
    try:
        made = _make_plan(compiled, kernel, len(args), kwargs)
    except Exception as e:  # noqa: BLE001 - no plan: Triton's path every time
        made = None
        _log_once(f"plan:{type(e).__name__}", f"no direct launch for a kernel ({type(e).__name__}: {e})")
    if made is not None:
        with _lock:
            if len(_PLANS) >= MAX_PLANS:
                _PLANS.clear()
            _PLANS[key] = made
            COUNTERS["plans"] += 1


def args_key(args: tuple, kwargs: dict) -> tuple:
    """A plan key for a launch whose tensors are read only through their pointers, every shape and stride
    it uses passed as an int argument (the fp8 decode / encode and the fused fp8 linear): each tensor's
    dtype, device and 16-byte alignment, each other argument's value, and the keyword arguments
    (constexprs, num_warps, num_stages). What Triton specialises on (a pointer's alignment, an int's
    divisibility by 16 or being 1) follows from it."""
    return tuple((a.dtype, a.device.index, a.data_ptr() % 16 == 0) if hasattr(a, "data_ptr") else a
                 for a in args) + tuple(sorted(kwargs.items()))


def clear() -> None:
    with _lock:
        _PLANS.clear()
        _TAILS.clear()
