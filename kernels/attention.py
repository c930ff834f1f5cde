"""FlashAttention-style forward attention in Triton, for diffusion models.

Two modes:

* ``exact``: fp16 / bf16 (or fp32) Q, K, V; Q·Kᵀ on tensor cores with fp32 accumulation, fp32
  online softmax (``exp2`` with ``log2(e)`` folded into the scale), P·V in the input dtype with
  an fp32 accumulator.
* ``int8`` (the node's "8-bit"): SageAttention-style. K is smoothed (its mean over the sequence is
  subtracted: exact for softmax, since it shifts every score of a row by the same constant), then
  Q is quantised to int8 with one scale per row (the softmax scale and ``log2(e)`` folded in) and
  K with one scale per block of ``BLOCK_N`` keys; Q·Kᵀ runs as an int8 dot with int32
  accumulation and is rescaled in fp32; P·V stays in fp16/bf16 with an fp32 accumulator. A
  per-row Q scale costs nothing over Sage's per-block one (the row scale rides on the FMA that
  applies the softmax scale anyway) and is more robust to outlier tokens.

Both take any head size up to 256 (padded in-kernel to the next power of two, the padding masked
off), any L_q / L_kv (cross-attention, lengths that are not block multiples), batch, heads, GQA,
the two layouts ComfyUI passes ((B, L, H·D) and (B, H, L, D), read through strides without a
copy), boolean or additive masks broadcast from (L_k), (L_q, L_k), (B, L_q, L_k) or
(B, H, L_q, L_k), a custom softmax scale, optional (top-left aligned) causal masking and 64-bit
row offsets when a tensor is big enough to need them. Rows whose every key is masked give 0
(never NaN).

The public entry is :func:`attention`; it goes through the custom op ``tritonkit::attention``
(``torch.library.custom_op`` + ``register_fake``), so ``torch.compile`` / ComfyUI's
TorchCompileModel keeps it inside the graph as one opaque call instead of breaking the graph or
trying to trace the launcher (a ``triton_op`` would let Inductor look inside, but the launcher
does host-side work — config choice with a timed autotune, the quantisation pre-pass — that is not
traceable, and Inductor has nothing to fuse into an attention kernel anyway).

:func:`attention_reference` is the torch reference (float64 by default).
"""
from __future__ import annotations

import math
import os
import threading

import torch
import triton
import triton.language as tl

from .runtime import kernel_for

LOG2E = 1.4426950408889634
MAX_HEAD_DIM = 256
MODES = ("exact", "int8")

# ----------------------------------------------------------------------------- kernels


@triton.jit
def attn_fwd_kernel(Q, K, V, O, Mask, QS, KS,
                    qk_scale, Lq, Lk, H, KV_GROUP,
                    stride_qb, stride_qh, stride_ql,
                    stride_kb, stride_kh, stride_kl,
                    stride_vb, stride_vh, stride_vl,
                    stride_ob, stride_oh, stride_ol,
                    stride_mb, stride_mh, stride_mm, stride_mn,
                    stride_qsb, stride_qsh, stride_ksb, stride_ksh,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    MASK_KIND: tl.constexpr, IS_CAUSAL: tl.constexpr, INT8: tl.constexpr,
                    DOT_F32: tl.constexpr, INT64: tl.constexpr, ALIGN8: tl.constexpr = False):
    """One program = BLOCK_M query rows of one (batch, head). 1-D grid, query blocks fastest, so
    the programs of one head run together and share its K/V in L2."""
    PAD_D: tl.constexpr = HEAD_DIM != BLOCK_D
    if ALIGN8:
        # Every row start is 16-byte aligned (the launcher checked): tell the compiler, so rows of
        # e.g. 40 or 80 elements still load as 16-byte vectors (Triton only infers alignment from
        # strides that are multiples of 16).
        stride_qb = tl.multiple_of(stride_qb, 8)
        stride_qh = tl.multiple_of(stride_qh, 8)
        stride_ql = tl.multiple_of(stride_ql, 8)
        stride_kb = tl.multiple_of(stride_kb, 8)
        stride_kh = tl.multiple_of(stride_kh, 8)
        stride_kl = tl.multiple_of(stride_kl, 8)
        stride_vb = tl.multiple_of(stride_vb, 8)
        stride_vh = tl.multiple_of(stride_vh, 8)
        stride_vl = tl.multiple_of(stride_vl, 8)
        stride_ob = tl.multiple_of(stride_ob, 8)
        stride_oh = tl.multiple_of(stride_oh, 8)
        stride_ol = tl.multiple_of(stride_ol, 8)
    pid = tl.program_id(0)
    num_m = (Lq + BLOCK_M - 1) // BLOCK_M
    start_m = pid % num_m
    off_hz = pid // num_m
    b = (off_hz // H).to(tl.int64)
    h = off_hz % H
    hk = (h // KV_GROUP).to(tl.int64)
    h = h.to(tl.int64)

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    if INT64:
        offs_m_o = offs_m.to(tl.int64)
    else:
        offs_m_o = offs_m
    m_ok = offs_m < Lq
    d_ok = offs_d < HEAD_DIM

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m_o[:, None] * stride_ql + offs_d[None, :]
    K_base = K + b * stride_kb + hk * stride_kh
    V_base = V + b * stride_vb + hk * stride_vh
    Mask_base = Mask + b * stride_mb + h * stride_mh
    KS_base = KS + b * stride_ksb + hk * stride_ksh
    if INT8:
        q = tl.load(q_ptrs, mask=m_ok[:, None], other=0)
        qc = tl.load(QS + b * stride_qsb + h * stride_qsh + offs_m, mask=m_ok, other=0.0)
    else:
        q = tl.load(q_ptrs, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
        qc = qk_scale * 1.4426950408889634

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    if IS_CAUSAL:
        hi = tl.minimum(Lk, (start_m + 1) * BLOCK_M)
        full_end = (tl.minimum(start_m * BLOCK_M, Lk) // BLOCK_N) * BLOCK_N
    else:
        hi = Lk
        full_end = (Lk // BLOCK_N) * BLOCK_N
    # Two passes over the keys: blocks that need no bound or causal check, then the rest (the
    # partial last block, the diagonal blocks of causal attention). static_range keeps `stage` a
    # compile-time constant, so the first pass carries no masking code.
    for stage in tl.static_range(2):
        if stage == 1:
            lo = full_end
            hi_s = hi
        else:
            lo = 0
            hi_s = full_end
        for start_n in range(lo, hi_s, BLOCK_N):
            cols = start_n + offs_n
            if INT64:
                cols_o = cols.to(tl.int64)
            else:
                cols_o = cols
            n_ok = cols < Lk
            k_ptrs = K_base + cols_o[:, None] * stride_kl + offs_d[None, :]
            if INT8:
                # int8 K is a padded contiguous copy: only the rows need a bound
                if stage == 1:
                    k = tl.load(k_ptrs, mask=n_ok[:, None], other=0)
                else:
                    k = tl.load(k_ptrs)
                qk = tl.dot(q, tl.trans(k)).to(tl.float32)
                ks = tl.load(KS_base + start_n // BLOCK_N)
                c = qc * ks
                c2 = c[:, None]
            else:
                if stage == 1:
                    k = tl.load(k_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
                elif PAD_D:
                    k = tl.load(k_ptrs, mask=d_ok[None, :], other=0.0)
                else:
                    k = tl.load(k_ptrs)
                if DOT_F32:
                    qk = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
                else:
                    qk = tl.dot(q, tl.trans(k))
                c = qc
                c2 = qc
            if MASK_KIND != 0 or stage == 1:
                s = qk * c2
                if MASK_KIND != 0:
                    m_ptrs = Mask_base + offs_m_o[:, None] * stride_mm + cols_o[None, :] * stride_mn
                    if MASK_KIND == 1:
                        keep = tl.load(m_ptrs, mask=m_ok[:, None] & n_ok[None, :], other=0)
                        s = tl.where(keep != 0, s, float("-inf"))
                    else:
                        add = tl.load(m_ptrs, mask=m_ok[:, None] & n_ok[None, :], other=0.0)
                        s = s + add.to(tl.float32) * 1.4426950408889634
                if stage == 1:
                    s = tl.where(n_ok[None, :], s, float("-inf"))
                    if IS_CAUSAL:
                        s = tl.where(offs_m[:, None] >= cols[None, :], s, float("-inf"))
                m_ij = tl.maximum(m_i, tl.max(s, 1))
                # a row that has seen only masked keys so far keeps m = -inf: subtract 0 instead
                m_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
                p = tl.math.exp2(s - m_safe[:, None])
                alpha = tl.math.exp2(m_i - m_safe)
            else:
                m_ij = tl.maximum(m_i, tl.max(qk, 1) * c)
                p = tl.math.exp2(qk * c2 - m_ij[:, None])
                alpha = tl.math.exp2(m_i - m_ij)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            v_ptrs = V_base + cols_o[:, None] * stride_vl + offs_d[None, :]
            if stage == 1:
                v = tl.load(v_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            elif PAD_D:
                v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
            else:
                v = tl.load(v_ptrs)
            if DOT_F32:
                acc = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), acc)
            else:
                acc = tl.dot(p.to(v.dtype), v, acc)
            m_i = m_ij
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m_o[:, None] * stride_ol + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


@triton.jit
def quant_int8_kernel(X, Mean, Out, Scale, L, H, mult,
                      stride_xb, stride_xh, stride_xl,
                      stride_ob, stride_oh, stride_ol,
                      stride_sb, stride_sh,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,
                      PER_ROW: tl.constexpr, SUB_MEAN: tl.constexpr, INT64: tl.constexpr):
    """int8 copy of one (B, H, L, D)-strided tensor into a contiguous (B, H, L, BLOCK_D) buffer
    (padding columns = 0), ``x = (x - mean) * mult``, with a scale per row (PER_ROW) or per block
    of BLOCK_L rows; round half away from zero, as SageAttention does."""
    pid = tl.program_id(0)
    num_l = (L + BLOCK_L - 1) // BLOCK_L
    blk = pid % num_l
    off_hz = pid // num_l
    b = (off_hz // H).to(tl.int64)
    h = (off_hz % H).to(tl.int64)
    rows = blk * BLOCK_L + tl.arange(0, BLOCK_L)
    if INT64:
        rows_o = rows.to(tl.int64)
    else:
        rows_o = rows
    offs_d = tl.arange(0, BLOCK_D)
    r_ok = rows < L
    d_ok = offs_d < HEAD_DIM
    ok = r_ok[:, None] & d_ok[None, :]
    x = tl.load(X + b * stride_xb + h * stride_xh + rows_o[:, None] * stride_xl + offs_d[None, :],
                mask=ok, other=0.0).to(tl.float32)
    if SUB_MEAN:
        mu = tl.load(Mean + (b * H + h) * HEAD_DIM + offs_d, mask=d_ok, other=0.0)
        x = tl.where(ok, x - mu[None, :], 0.0)
    x = x * mult
    if PER_ROW:
        amax = tl.max(tl.abs(x), 1)
        scale = tl.maximum(amax, 1e-30) / 127.0
        y = x / scale[:, None]
    else:
        amax = tl.max(tl.max(tl.abs(x), 1), 0)
        scale = tl.maximum(amax, 1e-30) / 127.0
        y = x / scale
    y = tl.where(y >= 0, y + 0.5, y - 0.5)
    tl.store(Out + b * stride_ob + h * stride_oh + rows_o[:, None] * stride_ol + offs_d[None, :],
             y.to(tl.int8), mask=r_ok[:, None])
    if PER_ROW:
        tl.store(Scale + b * stride_sb + h * stride_sh + rows, scale, mask=r_ok)
    else:
        tl.store(Scale + b * stride_sb + h * stride_sh + blk, scale)


# ----------------------------------------------------------------------------- configurations


def block_d_for(head_dim: int) -> int:
    """The padded head size the kernel computes with (a power of two, at least 16)."""
    return max(16, triton.next_power_of_2(head_dim))


def arch_family(cc: int) -> str:
    if cc < 80:
        return "sm75"
    if cc == 80 or cc == 87:
        return "sm80"
    if cc < 90:
        return "sm86"  # sm86 / sm89: ~100 KB shared memory
    if cc < 100:
        return "sm90"
    if cc >= 120:
        return "sm120"
    return "sm100"


# Shared memory per block the configs may use (bytes, with a margin for Triton's scratch).
_SMEM = {"sm75": 64 * 1024, "sm80": 160 * 1024, "sm86": 96 * 1024, "sm90": 227 * 1024,
         "sm100": 227 * 1024, "sm120": 96 * 1024}

# Candidate (BLOCK_M, BLOCK_N, num_warps, num_stages) per arch family and padded head size
# (<= 64, 128, 256). The first one is the default when timing is switched off or impossible.
_CANDIDATES = {
    "sm75": {64: [(64, 64, 4, 2), (128, 32, 4, 2)],
             128: [(64, 64, 4, 2), (64, 32, 4, 2)],
             256: [(64, 32, 4, 1), (32, 32, 4, 1)]},
    "sm80": {64: [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3)],
             128: [(128, 64, 8, 3), (128, 64, 4, 3), (128, 32, 4, 3)],
             256: [(64, 64, 4, 2), (64, 32, 4, 2)]},
    "sm86": {64: [(128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 3)],
             128: [(128, 64, 8, 2), (64, 64, 4, 3), (128, 32, 4, 2)],
             256: [(64, 32, 4, 2), (32, 32, 4, 2)]},
    "sm90": {64: [(128, 128, 8, 3), (128, 64, 4, 3), (128, 128, 4, 3)],
             128: [(128, 128, 8, 2), (128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 3)],
             256: [(128, 64, 8, 2), (64, 64, 4, 2)]},
}
# int8 Q·K has its own lists where they differ (measured on H200: 4 warps win for int8 at 128).
_CANDIDATES_INT8 = {
    "sm90": {64: [(128, 64, 4, 3), (128, 128, 8, 3), (128, 128, 4, 3)],
             128: [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 4)],
             256: [(128, 64, 8, 2), (64, 64, 4, 2)]},
}
_CANDIDATES["sm120"] = _CANDIDATES["sm86"]
_CANDIDATES["sm100"] = _CANDIDATES["sm90"]
_CANDIDATES_INT8["sm100"] = _CANDIDATES_INT8["sm90"]

# Interpreter (CPU): the block sizes only change how many numpy steps run.
CPU_CONFIG = (32, 32, 4, 1)


def _dbucket(block_d: int) -> int:
    return 64 if block_d <= 64 else block_d


def _smem_bytes(cfg, block_d, in_bytes, int8):
    bm, bn, _, stages = cfg
    kb = 1 if int8 else in_bytes
    return stages * bn * block_d * (kb + in_bytes) + bm * block_d * kb


def candidates(cc: int, block_d: int, in_bytes: int = 2, int8: bool = False):
    fam = arch_family(cc)
    table = _CANDIDATES_INT8.get(fam, _CANDIDATES[fam]) if int8 else _CANDIDATES[fam]
    cands = table[_dbucket(block_d)]
    fit = [c for c in cands if _smem_bytes(c, block_d, in_bytes, int8) <= _SMEM[fam]]
    return fit or cands[-1:]


def supported_dtypes(cc: int | None):
    """Input dtypes the kernel serves on this arch (None = CPU interpreter)."""
    if cc is None:
        return (torch.float16, torch.bfloat16, torch.float32)
    if cc < 80:
        return (torch.float16,)  # Turing: no bf16 tensor cores, no tf32
    return (torch.float16, torch.bfloat16, torch.float32)


def int8_supported(cc: int | None) -> bool:
    """int8 Q·Kᵀ: CPU interpreter and sm80+. Turing's int8 mma lowering is not trusted (Triton
    3.3+ miscompiles it, SageAttention #197), so 8-bit falls back to exact there."""
    return cc is None or cc >= 80


# ----------------------------------------------------------------------------- launcher

_TUNE_CACHE: dict = {}
_TUNE_LOCK = threading.Lock()


def autotune_enabled() -> bool:
    return os.environ.get("TRITONKIT_ATTN_AUTOTUNE", "1").strip().lower() not in ("0", "false", "no", "off")


def tune_cache() -> dict:
    """(key) -> chosen (BLOCK_M, BLOCK_N, num_warps, num_stages); one timing per key per process."""
    return _TUNE_CACHE


def _pow2_bucket(n: int) -> int:
    return triton.next_power_of_2(max(16, min(int(n), 32768)))


def _normalize_mask(mask, B, H, Lq, Lk, device):
    """(kind, tensor, strides(b, h, m, n)) with broadcast dims at stride 0; kind 0 none, 1 bool,
    2 additive."""
    if mask is None:
        return 0, None, (0, 0, 0, 0)
    if mask.device != device:
        raise ValueError(f"mask on {mask.device}, q on {device}")
    if mask.dtype == torch.bool:
        kind = 1
    elif mask.dtype.is_floating_point:
        kind = 2
        if mask.dtype != torch.float32:
            mask = mask.to(torch.float32)
    else:
        raise ValueError(f"mask dtype {mask.dtype} (bool or float only)")
    while mask.ndim < 4:
        mask = mask.unsqueeze(0)
    if mask.ndim != 4:
        raise ValueError(f"mask with {mask.ndim} dims")
    mask = mask.expand(B, H, Lq, Lk)  # raises on shapes that do not broadcast
    strides = tuple(0 if mask.shape[i] == 1 else mask.stride(i) for i in range(4))
    return kind, mask, strides


def _split(x, heads, bhld):
    """(tensor with contiguous last dim, B, H, L, D, strides (b, h, l))."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if bhld:
        B, H, L, D = x.shape
        return x, B, H, L, D, (x.stride(0), x.stride(1), x.stride(2))
    B, L, HD = x.shape
    if HD % heads:
        raise ValueError(f"last dim {HD} is not a multiple of heads={heads}")
    D = HD // heads
    try:
        xv = x.view(B, L, heads, D)
    except RuntimeError:
        xv = x.reshape(B, L, heads, D)
    return xv, B, heads, L, D, (xv.stride(0), xv.stride(2), xv.stride(1))


def _quantize(x, strides, B, H, L, D, block_d, mult, per_row, block_l, mean=None):
    dev = x.device
    out = torch.empty((B, H, L, block_d), dtype=torch.int8, device=dev)
    nblk = triton.cdiv(L, block_l)
    scale = torch.empty((B, H, L if per_row else nblk), dtype=torch.float32, device=dev)
    int64 = max(L * max(strides[2], 1), L * block_d) >= INT64_THRESHOLD
    grid = (nblk * B * H,)
    kernel_for(quant_int8_kernel, dev.type)[grid](
        x, mean if mean is not None else scale, out, scale, L, H, float(mult),
        strides[0], strides[1], strides[2],
        out.stride(0), out.stride(1), out.stride(2),
        scale.stride(0), scale.stride(1),
        HEAD_DIM=D, BLOCK_D=block_d, BLOCK_L=block_l, PER_ROW=per_row, SUB_MEAN=mean is not None,
        INT64=int64, num_warps=4)
    return out, scale


_INTERP_LOCK = threading.RLock()


class _interpreted_device_calls:
    """While the Triton interpreter runs these kernels on CPU tensors (``runtime.kernel_for``),
    calls from a kernel into ``@triton.jit`` library functions (``tl.zeros``, ``tl.max``, ...) must
    be interpreted too, as they are under ``TRITON_INTERPRET=1``. Patched only for the duration of
    a CPU launch, under a lock; restored afterwards."""

    def __init__(self, device_type):
        self.active = device_type == "cpu" and not _interpreter_global()

    def __enter__(self):
        if self.active:
            from triton.runtime.interpreter import InterpretedFunction
            from triton.runtime.jit import JITFunction
            _INTERP_LOCK.acquire()
            self._orig = JITFunction.__call__

            def _call(jit_self, *args, **kwargs):
                # InterpretedFunction.__call__ would patch triton.language for the callee and never
                # undo it (tl.core stays patched and later GPU compiles in this process break):
                # patch, run the rewritten function, restore.
                from triton.runtime import interpreter as _ti
                f = InterpretedFunction(jit_self.fn)
                scope = _ti._patch_lang(jit_self.fn)
                try:
                    return f.rewrite()(*args, **kwargs)
                finally:
                    if hasattr(scope, "restore"):
                        scope.restore()
            JITFunction.__call__ = _call
        return self

    def __exit__(self, *exc):
        if self.active:
            from triton.runtime.jit import JITFunction
            JITFunction.__call__ = self._orig
            _INTERP_LOCK.release()


def _interpreter_global() -> bool:
    from .runtime import interpreter_active, triton_cpu_backend_available
    return interpreter_active() or triton_cpu_backend_available()


def _device_cc(device) -> int | None:
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def check_supported(q, k, v, heads: int, bhld: bool, mode: str = "exact", mask=None) -> str | None:
    """None when :func:`attention` serves these inputs on their device, else the reason it would
    not (the node falls back to ComfyUI's function for that reason)."""
    if mode not in MODES:
        return f"unknown mode {mode!r}"
    if not (q.dtype == k.dtype == v.dtype):
        return f"mixed dtypes {q.dtype}/{k.dtype}/{v.dtype}"
    if not (q.device == k.device == v.device):
        return "q, k, v on different devices"
    if q.device.type not in ("cuda", "cpu"):
        return f"{q.device.type} tensors"
    cc = _device_cc(q.device)
    if q.dtype not in supported_dtypes(cc):
        where = f"sm{cc}" if cc is not None else "CPU"
        return f"dtype {q.dtype} on {where}"
    nd = 4 if bhld else 3
    if q.ndim != nd or k.ndim != nd or v.ndim != nd:
        return f"{q.ndim}-d q (expected {nd}-d for skip_reshape={bhld})"
    if bhld:
        D = q.shape[-1]
        hq, hk = q.shape[1], k.shape[1]
    else:
        if heads <= 0 or q.shape[-1] % heads:
            return f"q width {q.shape[-1]} not divisible by heads={heads}"
        D = q.shape[-1] // heads
        if k.shape[-1] % D or v.shape[-1] != k.shape[-1]:
            return f"k/v width {k.shape[-1]} not a multiple of head size {D}"
        hq, hk = heads, k.shape[-1] // D
    if k.shape[-1] != (D if bhld else hk * D) or v.shape[-1] != k.shape[-1]:
        return "q, k and v head sizes differ"
    if D > MAX_HEAD_DIM:
        return f"head size {D} > {MAX_HEAD_DIM}"
    if hk == 0 or hq % hk:
        return f"{hq} query heads over {hk} key/value heads"
    if q.shape[0] != k.shape[0] or k.shape[0] != v.shape[0] or k.shape[-2 if bhld else 1] != v.shape[-2 if bhld else 1]:
        return "batch or key length mismatch"
    if bhld and v.shape[1] != hk:
        return "k and v head counts differ"
    if q.shape[-2 if bhld else 1] == 0 or k.shape[-2 if bhld else 1] == 0 or q.shape[0] == 0:
        return "empty sequence"
    if mask is not None:
        if not (mask.dtype == torch.bool or mask.dtype.is_floating_point):
            return f"mask dtype {mask.dtype}"
        if mask.ndim > 4:
            return f"{mask.ndim}-d mask"
        Lq = q.shape[-2 if bhld else 1]
        Lk = k.shape[-2 if bhld else 1]
        shape = (1,) * (4 - mask.ndim) + tuple(mask.shape)
        if shape[-1] != Lk or shape[-2] not in (1, Lq) or shape[1] not in (1, hq) or shape[0] not in (1, q.shape[0]):
            return f"mask shape {tuple(mask.shape)} for L_q={Lq}, L_k={Lk}"
    return None


# Row offsets switch to 64-bit when an offset can reach this (tests lower it to exercise the path).
INT64_THRESHOLD = 2 ** 31


def _launch(q, k, v, mask, heads, bhld, out_bhld, scale, int8, causal, cfg=None, out=None):
    dev = q.device
    q4, B, H, Lq, D, sq = _split(q, heads, bhld)
    hk_guess = heads if bhld else (k.shape[-1] // D if D else heads)
    k4, Bk, Hk, Lk, Dk, sk = _split(k, hk_guess, bhld)
    v4, _, Hv, Lv, Dv, sv = _split(v, hk_guess, bhld)
    if Dk != D or Dv != D or Lv != Lk or Bk != B or Hv != Hk or H % Hk:
        raise ValueError("q, k, v shapes do not fit together")
    if D > MAX_HEAD_DIM:
        raise ValueError(f"head size {D} > {MAX_HEAD_DIM}")
    cc = _device_cc(dev)
    if int8 and not int8_supported(cc):
        raise ValueError(f"int8 attention needs sm80+ (got sm{cc})")
    if q.dtype not in supported_dtypes(cc):
        raise ValueError(f"dtype {q.dtype} not supported on sm{cc}")
    block_d = block_d_for(D)
    sm_scale = float(scale) if scale is not None else 1.0 / math.sqrt(D)
    kind, m4, ms = _normalize_mask(mask, B, H, Lq, Lk, dev)

    shape = (B, H, Lq, D) if out_bhld else (B, Lq, H * D)
    if out is None:
        o = torch.empty(shape, dtype=q.dtype, device=dev)
    else:
        if tuple(out.shape) != shape or out.dtype != q.dtype or out.device != dev or out.stride(-1) != 1:
            raise ValueError(f"out must be {shape} {q.dtype} on {dev} with a contiguous last dim")
        o = out
    if out_bhld:
        so = (o.stride(0), o.stride(1), o.stride(2))
    else:
        ov = o.view(B, Lq, H, D)
        so = (ov.stride(0), ov.stride(2), ov.stride(1))

    dot_f32 = dev.type == "cpu" and q.dtype == torch.bfloat16  # interpreter: bf16 dot is wrong there
    big = INT64_THRESHOLD
    int64 = max(Lq * sq[2], Lk * sk[2], Lk * sv[2], Lq * so[2], Lq * ms[2], Lk * ms[3],
                (Lq + Lk) * block_d) >= big
    kern = kernel_for(attn_fwd_kernel, dev.type)
    align8 = (D % 8 == 0
              and all(st % 8 == 0 for st in (*sq, *sk, *sv, *so))
              and all(t.data_ptr() % 16 == 0 for t in (q4, k4, v4, o)))

    mean = None
    if int8:
        # K smoothing: the per-(b, head, channel) mean over the sequence, accumulated in fp32
        mean = torch.mean(k4, dim=2 if bhld else 1, dtype=torch.float32).contiguous()
        if not bhld:
            mean = mean.view(B, Hk, D).contiguous()
        qi, qs = _quantize(q4, sq, B, H, Lq, D, block_d, sm_scale * LOG2E, True, 64)

    def run(c, o_out):
        bm, bn, nw, ns = c
        if int8:
            ki, ks = _quantize(k4, sk, B, Hk, Lk, D, block_d, 1.0, False, bn, mean=mean)
            qa, ka = qi, ki
            sqa, ska = (qi.stride(0), qi.stride(1), qi.stride(2)), (ki.stride(0), ki.stride(1), ki.stride(2))
            qs_, ks_ = qs, ks
            qss, kss = (qs.stride(0), qs.stride(1)), (ks.stride(0), ks.stride(1))
        else:
            qa, ka, sqa, ska = q4, k4, sq, sk
            qs_ = ks_ = o_out  # unused pointers
            qss = kss = (0, 0)
        grid = (triton.cdiv(Lq, bm) * B * H,)
        kern[grid](
            qa, ka, v4, o_out, m4 if m4 is not None else o_out, qs_, ks_,
            sm_scale, Lq, Lk, H, H // Hk,
            sqa[0], sqa[1], sqa[2], ska[0], ska[1], ska[2], sv[0], sv[1], sv[2],
            so[0], so[1], so[2], ms[0], ms[1], ms[2], ms[3],
            qss[0], qss[1], kss[0], kss[1],
            HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=bm, BLOCK_N=bn,
            MASK_KIND=kind, IS_CAUSAL=bool(causal), INT8=bool(int8), DOT_F32=dot_f32, INT64=int64,
            ALIGN8=align8, num_warps=nw, num_stages=ns)

    if cfg is None:
        cfg = choose_config(dev, cc, q.dtype, block_d, int8, kind, causal, Lq, Lk, run, o)
    run(cfg, o)
    return o


def choose_config(dev, cc, dtype, block_d, int8, kind, causal, Lq, Lk, run=None, o=None):
    if cc is None:
        return CPU_CONFIG
    cands = candidates(cc, block_d, torch.tensor([], dtype=dtype).element_size(), int8)
    if len(cands) == 1 or not autotune_enabled() or run is None:
        return cands[0]
    key = (cc, str(dtype), block_d, int8, kind, bool(causal), _pow2_bucket(Lq), _pow2_bucket(Lk))
    hit = _TUNE_CACHE.get(key)
    if hit is not None:
        return hit
    with _TUNE_LOCK:
        hit = _TUNE_CACHE.get(key)
        if hit is not None:
            return hit
        best, best_t = None, float("inf")
        for c in cands:
            try:
                t = triton.testing.do_bench(lambda: run(c, o), warmup=5, rep=20)
            except Exception:  # e.g. out of resources for this config on this GPU
                continue
            if t < best_t:
                best, best_t = c, t
        best = best or cands[0]
        _TUNE_CACHE[key] = best
        return best


# ----------------------------------------------------------------------------- custom op

def _attention_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                    heads: int, bhld: bool, out_bhld: bool, scale: float | None, int8: bool,
                    causal: bool, block_m: int, block_n: int, num_warps: int, num_stages: int) -> torch.Tensor:
    cfg = (block_m, block_n, num_warps, num_stages) if block_m > 0 else None
    with _interpreted_device_calls(q.device.type):
        return _launch(q, k, v, mask, heads, bhld, out_bhld, scale, int8, causal, cfg)


def _attention_fake(q, k, v, mask, heads, bhld, out_bhld, scale, int8, causal, block_m, block_n, num_warps,
                    num_stages):
    if bhld:
        B, H, Lq, D = q.shape
    else:
        B, Lq, HD = q.shape
        H, D = heads, HD // heads
    shape = (B, H, Lq, D) if out_bhld else (B, Lq, H * D)
    return q.new_empty(shape)


try:
    _attention_op = torch.library.custom_op("tritonkit::attention", mutates_args=())(_attention_impl)
    _attention_op.register_fake(_attention_fake)
except Exception:  # noqa: BLE001 - e.g. a torch that refuses a second registration (pack imported twice)
    _attention_op = _attention_impl


def attention(q, k, v, heads: int | None = None, *, mask=None, layout: str = "bld", out_layout: str | None = None,
              scale: float | None = None, mode: str = "exact", causal: bool = False, config=None, out=None):
    """Softmax attention of q, k, v.

    layout "bld": (B, L, H·D) with ``heads`` = H (k/v may have fewer heads: GQA);
    layout "bhld": (B, H, L, D) (``heads`` ignored). out_layout defaults to the input layout.
    mask: bool (True = keep) or additive float, broadcastable from (L_k), (L_q, L_k),
    (B, L_q, L_k) or (B, H, L_q, L_k). mode: "exact" or "int8". config: (BLOCK_M, BLOCK_N,
    num_warps, num_stages) to skip the choice (tests). out: write into this tensor (eager only: it
    bypasses the custom op; tests poison it first)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    bhld = layout == "bhld"
    if not bhld and layout != "bld":
        raise ValueError("layout must be 'bld' or 'bhld'")
    out_bhld = (out_layout or layout) == "bhld"
    if bhld:
        heads = q.shape[1]
    elif heads is None:
        raise ValueError("layout 'bld' needs heads")
    bm, bn, nw, ns = config if config is not None else (0, 0, 0, 0)
    if out is not None:
        with _interpreted_device_calls(q.device.type):
            return _launch(q, k, v, mask, int(heads), bhld, out_bhld, None if scale is None else float(scale),
                           mode == "int8", bool(causal), tuple(config) if config is not None else None, out)
    op = _attention_op
    if q.device.type == "cpu" and not torch.compiler.is_compiling():
        # Eager CPU (the interpreter) calls the implementation directly, not through the
        # dispatcher: a custom-op call that runs the Triton interpreter inside it crashed torch
        # 2.14's dispatcher intermittently in CI (segfault in OpOverload.__call__).
        op = _attention_impl
    return op(q, k, v, mask, int(heads), bhld, out_bhld,
                         None if scale is None else float(scale), mode == "int8", bool(causal),
                         bm, bn, nw, ns)


# ----------------------------------------------------------------------------- reference

def attention_reference(q, k, v, heads: int | None = None, *, mask=None, layout: str = "bld",
                        out_layout: str | None = None, scale: float | None = None, causal: bool = False,
                        dtype=torch.float64):
    """Plain softmax(q·kᵀ·scale + mask)·v in ``dtype`` (float64 by default); fully masked rows
    give 0. Same arguments as :func:`attention`."""
    bhld = layout == "bhld"
    if bhld:
        qh, kh, vh = q, k, v
    else:
        B, Lq, HD = q.shape
        D = HD // heads
        qh = q.view(B, Lq, heads, D).transpose(1, 2)
        kh = k.reshape(B, k.shape[1], -1, D).transpose(1, 2)
        vh = v.reshape(B, v.shape[1], -1, D).transpose(1, 2)
    qh, kh, vh = qh.to(dtype), kh.to(dtype), vh.to(dtype)
    H, Hk = qh.shape[1], kh.shape[1]
    if Hk != H:
        kh = kh.repeat_interleave(H // Hk, dim=1)
        vh = vh.repeat_interleave(H // Hk, dim=1)
    D = qh.shape[-1]
    s = (qh @ kh.transpose(-1, -2)) * (scale if scale is not None else 1.0 / math.sqrt(D))
    Lq, Lk = s.shape[-2], s.shape[-1]
    if mask is not None:
        m = mask
        while m.ndim < 4:
            m = m.unsqueeze(0)
        if m.dtype == torch.bool:
            s = s.masked_fill(~m, float("-inf"))
        else:
            s = s + m.to(dtype)
    if causal:
        keep = torch.ones(Lq, Lk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    out = p @ vh
    if (out_layout or layout) == "bhld":
        return out
    return out.transpose(1, 2).reshape(out.shape[0], Lq, -1)


# ----------------------------------------------------------------------------- compile specs

def _attn_signature(in_ty: str, kv_in_ty: str, mask_ty: str, out_ty: str):
    sig = {"Q": f"*{in_ty}", "K": f"*{in_ty}", "V": f"*{kv_in_ty}", "O": f"*{out_ty}", "Mask": f"*{mask_ty}",
           "QS": "*fp32", "KS": "*fp32", "qk_scale": "fp32"}
    for n in ("Lq", "Lk", "H", "KV_GROUP"):
        sig[n] = "i32"
    for t in ("q", "k", "v", "o"):
        for d in ("b", "h", "l"):
            sig[f"stride_{t}{d}"] = "i32"
    for d in ("b", "h", "m", "n"):
        sig[f"stride_m{d}"] = "i32"
    for n in ("stride_qsb", "stride_qsh", "stride_ksb", "stride_ksh"):
        sig[n] = "i32"
    for n in ("HEAD_DIM", "BLOCK_D", "BLOCK_M", "BLOCK_N", "MASK_KIND", "IS_CAUSAL", "INT8", "DOT_F32", "INT64",
              "ALIGN8"):
        sig[n] = "constexpr"
    return sig


_TY = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
_FAMILY_ARCHS = {"sm75": (75,), "sm80": (80,), "sm86": (86, 89), "sm90": (90,), "sm120": (120,)}


def _spec(dtype, int8, head_dim, cfg, archs, mask_kind=0, causal=False, int64=False, align8=False):
    bm, bn, nw, ns = cfg
    ty = _TY[dtype]
    sig = _attn_signature("i8" if int8 else ty, ty, {0: "fp32", 1: "i1", 2: "fp32"}[mask_kind], ty)
    consts = {"HEAD_DIM": head_dim, "BLOCK_D": block_d_for(head_dim), "BLOCK_M": bm, "BLOCK_N": bn,
              "MASK_KIND": mask_kind, "IS_CAUSAL": causal, "INT8": int8, "DOT_F32": False, "INT64": int64,
              "ALIGN8": align8}
    return (attn_fwd_kernel, sig, consts, {"archs": tuple(archs), "num_warps": nw, "num_stages": ns})


def _quant_spec(ty, per_row, sub_mean, block_l, archs):
    sig = {"X": f"*{ty}", "Mean": "*fp32", "Out": "*i8", "Scale": "*fp32", "L": "i32", "H": "i32", "mult": "fp32"}
    for n in ("stride_xb", "stride_xh", "stride_xl", "stride_ob", "stride_oh", "stride_ol", "stride_sb", "stride_sh"):
        sig[n] = "i32"
    for n in ("HEAD_DIM", "BLOCK_D", "BLOCK_L", "PER_ROW", "SUB_MEAN", "INT64"):
        sig[n] = "constexpr"
    return (quant_int8_kernel, sig, {"HEAD_DIM": 80, "BLOCK_D": 128, "BLOCK_L": block_l, "PER_ROW": per_row,
                                     "SUB_MEAN": sub_mean, "INT64": False},
            {"archs": tuple(archs), "num_warps": 4, "num_stages": 1})


def _compile_specs():
    """(kernel, signature, constexprs, options), options = {"archs", "num_warps", "num_stages"}.

    Covers, on every arch, every compile-time branch of the kernels with the arch's default
    config: exact (fp16 on sm75, bf16 elsewhere) and int8 (sm80+) at head size 128; padded head
    sizes (40 -> 64 with fp32 inputs on sm80+ (fp16 on sm75), a bool mask and causal; 160 -> 256
    with int8 on sm80+, an additive mask and 64-bit offsets); both quantisation variants. :func:`all_compile_specs` adds every other
    candidate block config (what the autotune may pick); CI compiles it when
    TRITONKIT_EXHAUSTIVE_COMPILE=1 (several minutes of ptxas on a CPU)."""
    specs = []
    for fam, archs in _FAMILY_ARCHS.items():
        cc = archs[0]
        dtypes = supported_dtypes(cc)
        dt = torch.bfloat16 if torch.bfloat16 in dtypes else torch.float16
        i8 = int8_supported(cc)
        specs.append(_spec(dt, False, 128, candidates(cc, 128, 2, False)[0], archs))
        dt40 = torch.float32 if torch.float32 in dtypes else torch.float16
        specs.append(_spec(dt40, False, 40, candidates(cc, 64, dt40.itemsize, False)[0], archs,
                           mask_kind=1, causal=True, align8=True))
        specs.append(_spec(dt, i8, 160, candidates(cc, 256, 2, i8)[0], archs, mask_kind=2, int64=True))
        if i8:
            specs.append(_spec(torch.float16, True, 128, candidates(cc, 128, 2, True)[0], archs))
            specs.append(_quant_spec(_TY[dt], True, False, 64, archs))
            specs.append(_quant_spec("fp16", False, True, 64, archs))
    return specs


def all_compile_specs():
    """COMPILE_SPECS plus every candidate (BLOCK_M, BLOCK_N, warps, stages) of every arch, head-size
    bucket, mode and half dtype."""
    specs = list(COMPILE_SPECS)
    for fam, archs in _FAMILY_ARCHS.items():
        cc = archs[0]
        half = [d for d in (torch.float16, torch.bfloat16) if d in supported_dtypes(cc)]
        for bd in (64, 128, 256):
            for dtype in half:
                for int8 in ((False, True) if int8_supported(cc) else (False,)):
                    for cfg in candidates(cc, bd, 2, int8):
                        specs.append(_spec(dtype, int8, bd, cfg, archs))
    return specs


COMPILE_SPECS = _compile_specs()
