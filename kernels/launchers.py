"""Triton's kernel launchers built in the background, where the kernel is compiled, not at its first launch.

Triton before 3.8 launches a compiled kernel through a small C module made for the kernel's signature:
the first launch of a kernel in a process (``CompiledKernel._init_handles``) writes that module's source
and, unless Triton's cache holds it already, builds it with the system's C compiler. On an H100's host
that is 0.3-0.4 s a signature, in the thread that launches: a cold HunyuanVideo calibration @86 spent
1.8 s of its timing steps in 5 such builds (Triton 3.6.0, cProfile of the first calls, 2026-11-26), after
every kernel itself had been compiled in the background. The module is cached by the hash of its source,
which depends only on the kernel's signature (the configs of one kernel share it).

So the background compile (kernels/compile_pool.py, kernels/prepare.py) builds the launcher too, right
after the kernel, by constructing Triton's own launcher class for it: Triton's later first launch finds
the module in its cache and only loads it. Triton 3.8 and later build nothing there (a generic launcher),
and the call costs microseconds. Whatever fails here is left to Triton's first launch, as before.
``TRITONKIT_PREBUILD_LAUNCHERS=0`` leaves every launcher to Triton's first launch (for A/B runs).

Triton's own key, the hash of its sources and libraries that its first compile or cache load in a process
computes, is computed at ComfyUI's start instead, in a thread (:func:`warm_key`): 0.42 s of a cold WAN
calibrating call on an H100 host (cProfile, 2026-11-27), in every process, Triton's cache warm or not.
``TRITONKIT_TRITON_KEY_AHEAD=0`` leaves it to the first compile.

Loading each compiled kernel's module onto the GPU here too (``CompiledKernel._init_handles``, 13 ms a block
config of the attention kernels on that host) was tried and dropped: with the key ahead it took 0.55 s off that
calibrating call (2.93 -> 2.38 s, 2 processes each), but a cold WAN 14B round with both nodes, where the loads
ran beside the model's steps, took 1.65 s longer (17.2 against 15.55 s for 4 steps, one pair, H100).
"""
from __future__ import annotations

import os
import threading
import time

ENV = "TRITONKIT_PREBUILD_LAUNCHERS"
KEY_ENV = "TRITONKIT_TRITON_KEY_AHEAD"

# launchers built (or found in Triton's cache) here, and the seconds it took
COUNTERS = {"launchers_built": 0, "launcher_s": 0.0}
_seen: set = set()        # the signatures whose launcher is built or being built in this process
_lock = threading.Lock()


def _signature_key(kernel):
    src = getattr(kernel, "src", None)
    sig = getattr(src, "signature", None)
    if sig is None:
        return None
    meta = getattr(kernel, "metadata", None)
    return (repr(sorted(sig.items(), key=lambda kv: str(kv[0]))),
            repr(getattr(meta, "tensordesc_meta", None)))


def prebuild(kernel) -> bool:
    """Builds (or loads from Triton's cache) the launcher of ``kernel``, a Triton CompiledKernel, unless
    one of the same signature was built in this process already; whether it did. Never raises."""
    if _off(ENV):
        return False
    try:
        key = _signature_key(kernel)
        if key is None:
            return False
        with _lock:
            if key in _seen:
                return False
            _seen.add(key)
        from triton.runtime import driver
        t0 = time.perf_counter()
        driver.active.launcher_cls(kernel.src, kernel.metadata)
        with _lock:
            COUNTERS["launchers_built"] += 1
            COUNTERS["launcher_s"] += time.perf_counter() - t0
        return True
    except Exception:  # noqa: BLE001 - Triton's first launch builds it, as before
        return False


def _off(name: str) -> bool:
    return os.environ.get(name, "1").strip().lower() in ("0", "false", "no", "off")


def warm_key() -> bool:
    """Triton's own key (lru-cached in Triton) computed now, where a CUDA GPU is there to compile for; whether
    it was. Never raises."""
    if _off(KEY_ENV):
        return False
    try:
        import torch
        if not torch.cuda.is_available():
            return False
        try:
            from triton.runtime.cache import triton_key
        except ImportError:  # Triton before 3.4
            from triton.compiler.compiler import triton_key
        triton_key()
        return True
    except Exception:  # noqa: BLE001 - Triton's first compile computes it, as before
        return False


def warm_key_in_background() -> None:
    """:func:`warm_key` in a daemon thread (ComfyUI's start goes on)."""
    threading.Thread(target=warm_key, name="tritonkit-triton-key", daemon=True).start()


def compiled(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` (a Triton compile, returning the compiled kernel), then its launcher."""
    kernel = fn(*args, **kwargs)
    prebuild(kernel)
    return kernel
