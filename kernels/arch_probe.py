"""Whether the installed Triton runs ``tl.dot`` on tensor cores for a GPU arch, found by compiling.

Triton 3.3 stopped lowering ``tl.dot`` to tensor-core MMA below sm80 (triton-lang/triton#5066:
MMAv1 deprecated, "fallback to FMA for computeCapability < 80"); Turing (GTX 16xx / RTX 20xx,
sm75) kept its MMA up to Triton 3.2. With 3.3 and later every dot of the pack's attention and fused
fp8 linear runs on the FMA units there: an RTX 2080 Ti has 13.4 TFLOPS of fp32 FMA against
53.8 TFLOPS of fp16 tensor-core MMA with fp32 accumulation (Turing whitepaper rates; not measured
here), and ComfyUI's own paths (SDPA, cuBLAS) use the tensor cores. Cross-compiled here with
Triton 3.8, the exact attention kernel at head 128 has 0 MMA and ~8,200 FMA instructions for sm75
against 128 MMA for sm80, and the fused linear spills 2.5-6.5 KB a thread there.

Not a version check: forks (triton-windows, Turing ports) may restore the MMA, so a 16x16 fp16 dot
is compiled for the arch once per process (Triton's cache keeps it for the next) and its layout
read: an ``nvidia_mma`` encoding means tensor cores. sm80 and newer always have them.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch
import triton
import triton.language as tl

log = logging.getLogger("TritonKit")

_FOUND: dict = {}  # compute capability -> True / False (None: the probe could not compile)


@triton.jit
def _probe_dot_kernel(a_ptr, c_ptr):
    r = tl.arange(0, 16)
    a = tl.load(a_ptr + r[:, None] * 16 + r[None, :])
    tl.store(c_ptr + r[:, None] * 16 + r[None, :], tl.dot(a, a))


def _compile_probe(cc: int) -> bool:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    src = ASTSource(fn=_probe_dot_kernel, signature={"a_ptr": "*fp16", "c_ptr": "*fp32"}, constexprs={})
    k = triton.compile(src, target=GPUTarget("cuda", cc, 32))
    return "nvidia_mma" in k.asm["ttgir"]


def dot_has_tensor_cores(cc: Optional[int]) -> Optional[bool]:
    """True / False: whether this Triton lowers ``tl.dot`` to tensor-core MMA on ``sm{cc}``; None
    off a GPU (``cc`` None) or where the probe does not compile (then nothing is ruled out). Under
    ``torch.compile`` tracing only an answer found before is read (eager calls look it up first)."""
    if cc is None:
        return None
    if cc >= 80:
        return True
    if cc in _FOUND or torch.compiler.is_compiling():
        return _FOUND.get(cc)
    try:
        found = _compile_probe(cc)
    except Exception as e:  # noqa: BLE001 - an interpreter-only Triton, a broken toolchain
        log.info("TritonKit: could not compile the tensor-core probe for sm%s (%s: %s); assuming tensor cores",
                 cc, type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
        found = None
    _FOUND[cc] = found
    if found is False:
        log.info("TritonKit: Triton %s runs tl.dot without tensor cores on sm%s (Triton 3.3+ dropped MMA below "
                 "sm80): the pack's attention and fused fp8 linear stay off there; ComfyUI's paths serve it",
                 getattr(triton, "__version__", "?"), cc)
    return found


def no_tensor_cores_reason(cc: Optional[int]) -> Optional[str]:
    """The fallback reason the nodes give where :func:`dot_has_tensor_cores` is False, else None."""
    if dot_has_tensor_cores(cc) is not False:
        return None
    return (f"sm{cc} with Triton {getattr(triton, '__version__', '?')}: tl.dot runs without tensor cores below sm80 "
            "(Triton 3.3+), so ComfyUI's tensor-core path is faster")
