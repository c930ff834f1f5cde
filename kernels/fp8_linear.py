"""Fused fp8-weight linear (W8A16): ``y = x @ (decode(W) * scale).T + bias``.

The weight stays fp8 in memory ([N, K], float8_e4m3fn or float8_e5m2, read as raw bytes) and is
decoded in registers inside the K loop, so a layer reads N*K bytes of weight instead of the
3*N*K of "cast to bf16, then matmul" (1 read + 2 written by the cast, 2 read by the matmul).
Activations are fp16 or bf16 (fp32 too, for CPU users), accumulation is fp32, the optional
scale (per tensor or per output channel) and bias (any float dtype, or fp8 bytes) are applied to
the fp32 accumulator, and the result has the activations' dtype.

The product is computed transposed, ``acc[BLOCK_N, BLOCK_M] = W_tile @ x_tile.T``: the decoded
weight is the first dot operand, which the tensor-core instructions take from registers (no
round trip through shared memory after the decode), and the token dimension M becomes the
narrow side of the MMA, which gives a real small-M path (BLOCK_M = 16 for 1..16 tokens).

Decode in the loop, per activation dtype (all bit operations, no fp8 type, sm75..sm120):
* fp16, e4m3fn: ``((b & 0x7F) << 7) | ((b & 0x80) << 8)`` read as fp16 is exactly the value
  / 256 (subnormals included); the 256 goes into the epilogue scale. e5m2: ``b << 8``.
* bf16: the fp32 bits of the value (see kernels/fp8.py), top half. sm75 has no bf16 MMA: there
  the op falls back to decode + torch matmul for bf16 activations, and for every dtype where the
  installed Triton has no tensor-core tl.dot below sm80 (3.3 and later: kernels/arch_probe.py).

Tuned on the user's GPU per (M bucket, N, K, formats) among the M bucket's configs, once per GPU
(kernels/tuning.py): configs that do not fit its shared memory are not picked. Exposed as the custom op
``torch.ops.tritonkit.fp8_linear`` with a fake implementation (compile-safe, opaque to Inductor).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
import triton.runtime.errors

from . import fast_launch, tuning
from .arch_probe import dot_has_tensor_cores
from .device import capability
from .runtime import OP_NAMESPACE, cdiv, eager_plain, next_pow2, op_exists
from .runtime import launch as launch_kernel
from .fp8 import LAUNCHES, _FMT, decode, fp8_bits_to_f32_bits, launchable, wrapping_int_math

_ACT = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}


@triton.jit
def decode_weight_tile(wb, FMT: tl.constexpr, ACT: tl.constexpr):
    """uint8 tile -> the activation dtype. For ACT 0 (fp16) with e4m3fn the values are / 256."""
    if ACT == 0:
        b = wb.to(tl.uint16)
        if FMT == 0:
            h = ((b & 0x7F) << 7) | ((b & 0x80) << 8)
            h = tl.where((b & 0x7F) == 0x7F, h | 0x7E00, h)  # NaN code stays NaN
        else:
            h = b << 8
        return h.to(tl.float16, bitcast=True)
    elif ACT == 1:
        u = fp8_bits_to_f32_bits(wb.to(tl.uint32), FMT)
        return (u >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return fp8_bits_to_f32_bits(wb.to(tl.uint32), FMT).to(tl.float32, bitcast=True)


@triton.jit
def w8a16_linear_kernel(x_ptr, w_ptr, bias_ptr, scale_ptr, out_ptr, M, N, K, stride_xm, stride_om,
                        FMT: tl.constexpr, ACT: tl.constexpr, BIAS: tl.constexpr, SCALE: tl.constexpr,
                        EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_K: tl.constexpr, GROUP: tl.constexpr):
    """x: [M, K] (row stride stride_xm); w: [N, K] uint8, contiguous; out: [M, N] (row stride
    stride_om). BIAS 0 none, 1 float, 2 e4m3fn bytes, 3 e5m2 bytes. SCALE 0 none, 1 one fp32,
    2 one fp32 per output channel."""
    pid = tl.program_id(0)
    num_pid_n = (N + BLOCK_N - 1) // BLOCK_N
    num_pid_m = (M + BLOCK_M - 1) // BLOCK_M
    num_in_group = GROUP * num_pid_m
    group_id = pid // num_in_group
    first_n = group_id * GROUP
    group_size = tl.minimum(num_pid_n - first_n, GROUP)
    pid_n = first_n + (pid % num_in_group) % group_size
    pid_m = (pid % num_in_group) // group_size

    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :]
    x_ptrs = x_ptr + offs_m[None, :].to(tl.int64) * stride_xm + offs_k[:, None]
    acc = tl.full((BLOCK_N, BLOCK_M), 0.0, tl.float32)
    for k in range(0, (K + BLOCK_K - 1) // BLOCK_K):
        if EVEN_K:
            wb = tl.load(w_ptrs)
            xt = tl.load(x_ptrs)
        else:
            krem = K - k * BLOCK_K
            wb = tl.load(w_ptrs, mask=offs_k[None, :] < krem, other=0)
            xt = tl.load(x_ptrs, mask=offs_k[:, None] < krem, other=0.0)
        w = decode_weight_tile(wb, FMT, ACT)
        if ACT == 2:
            acc = tl.dot(w, xt, acc, input_precision="ieee")
        else:
            acc = tl.dot(w, xt, acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K

    if ACT == 0 and FMT == 0:
        acc = acc * 256.0
    if SCALE == 1:
        acc = acc * tl.load(scale_ptr)
    elif SCALE == 2:
        acc = acc * tl.load(scale_ptr + offs_n)[:, None]
    if BIAS == 1:
        acc = acc + tl.load(bias_ptr + offs_n).to(tl.float32)[:, None]
    elif BIAS >= 2:
        bb = tl.load(bias_ptr + offs_n).to(tl.uint32)
        acc = acc + fp8_bits_to_f32_bits(bb, BIAS - 2).to(tl.float32, bitcast=True)[:, None]
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_ptrs = out_ptr + rm[None, :].to(tl.int64) * stride_om + rn[:, None]
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rn[:, None] < N) & (rm[None, :] < M))


def _cfg(bn, bm, bk, warps, stages, group=8) -> tuple:
    """A candidate config: (BLOCK_N, BLOCK_M, BLOCK_K, GROUP, num_warps, num_stages)."""
    return (bn, bm, bk, group, warps, stages)


# (M bucket upper bound, configs). The small-M rows are bandwidth-bound GEMVs: narrow BLOCK_M,
# long BLOCK_K, enough CTAs over N; the large rows are tensor-core tiles.
# Not a candidate any more: (128, 16, 128, 4 warps, 4 stages). ptxas spills 1.2-1.3 KB a thread from
# it for sm80, 86, 89 and 90 (its 128x128 decoded tile in registers; the others here spill 0-0.3 KB),
# and it lost on every layer of Flux and HunyuanVideo at one token on an H100 and an H200 (1.37-3.79x
# the best, 149 tunings, 2026-11); it cost two compiles of a cold first step.
CONFIGS_BY_BUCKET = (
    (16, [_cfg(64, 16, 256, 4, 4), _cfg(64, 16, 128, 4, 5), _cfg(32, 16, 256, 4, 4),
          _cfg(32, 16, 512, 4, 3), _cfg(16, 16, 512, 4, 3)]),
    (64, [_cfg(64, 32, 128, 4, 4), _cfg(128, 32, 128, 4, 4), _cfg(64, 64, 128, 4, 4), _cfg(128, 64, 64, 4, 4),
          _cfg(64, 32, 256, 4, 3), _cfg(128, 64, 128, 8, 3)]),
    (512, [_cfg(128, 64, 64, 4, 4), _cfg(128, 128, 64, 4, 4), _cfg(128, 128, 64, 8, 3), _cfg(64, 128, 64, 4, 4),
           _cfg(128, 64, 128, 4, 3), _cfg(64, 64, 128, 4, 4)]),
    (None, [_cfg(128, 128, 64, 4, 4), _cfg(128, 128, 64, 8, 3), _cfg(128, 256, 64, 8, 3), _cfg(256, 128, 64, 8, 3),
            _cfg(128, 128, 128, 8, 3), _cfg(128, 256, 64, 8, 4), _cfg(64, 128, 64, 4, 4)]),
)


def m_bucket(M: int) -> int:
    return min(next_pow2(max(M, 1)), 8192)


def _configs_for_bucket(bucket: int):
    for hi, cs in CONFIGS_BY_BUCKET:
        if hi is None or bucket <= hi:
            return cs
    raise AssertionError("unreachable")


def _launch_cuda(args, consts, M, N, K, device):
    """Launches with the config picked for (M bucket, N, K, formats) on this GPU: timed once per
    GPU, candidates compiled in parallel, then stored (kernels/tuning.py); a config that does not
    fit this GPU's shared memory is not picked.

    ``EVEN_K`` (no masks in the K loop) whenever the config's K tile divides K: K = 256 and 768
    (the time and vector embedders) then share the 3072-feature layers' binary for the 128- and
    256-wide tiles, where one flag for every config (K % 512) compiled each candidate twice."""

    def launch(c, warmup=False):
        bn, bm, bk, group, warps, stages = c
        grid = (cdiv(N, bn) * cdiv(M, bm),)
        kw = dict(consts, EVEN_K=K % bk == 0, BLOCK_N=bn, BLOCK_M=bm, BLOCK_K=bk, GROUP=group, num_warps=warps,
                  num_stages=stages)
        plan = None if warmup else fast_launch.args_key(args, kw)  # (kernels/fast_launch.py)
        return launch_kernel(w8a16_linear_kernel, grid, *args, warmup=warmup, plan=plan, **kw)

    cc = capability(device)
    bucket = m_bucket(M)
    key = "fp8_linear_config|sm{}|M{}|N{}|K{}|{}".format(
        cc, bucket, N, K, "|".join(f"{k}{v}" for k, v in sorted(consts.items())))
    cands = _configs_for_bucket(bucket)
    cfg = tuning.pick(device, key, cands, run=launch, warm=lambda c: launch(c, warmup=True))
    try:
        return launch(cfg)
    except triton.runtime.errors.OutOfResources as too_big:
        for c in cands:  # untimed (TRITONKIT_AUTOTUNE=0): the first that fits this GPU
            if c != cfg:
                try:
                    return launch(c)
                except triton.runtime.errors.OutOfResources:
                    continue
        raise too_big


def _cpu_blocks(M, N, K):
    # the interpreter pays per Triton op, not per element: few programs, few K steps
    p2 = next_pow2
    return dict(BLOCK_N=max(16, min(p2(N), 256)), BLOCK_M=max(16, min(p2(M), 64)),
                BLOCK_K=max(16, min(p2(K), 512)), GROUP=8)


def cuda_supports(act_dtype: torch.dtype, device) -> bool:
    """bf16 MMA needs sm80; fp16 works from sm75 where this Triton's tl.dot has tensor cores there
    (Triton 3.3+ runs it on FMA units below sm80: kernels/arch_probe.py)."""
    cc = capability(device)
    if cc < 80 and dot_has_tensor_cores(cc) is False:
        return False
    return act_dtype != torch.bfloat16 or cc >= 80


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, decode(weight) * scale, bias)`` with the weight decoded inside the matmul.
    x: [..., K] fp16/bf16/fp32; weight: [N, K] float8_e4m3fn/float8_e5m2; scale: 1 or N values;
    bias: N values (float, or fp8)."""
    if weight.dtype not in _FMT or weight.dim() != 2:
        raise TypeError(f"weight must be a 2-D float8_e4m3fn/float8_e5m2 tensor, got {weight.dtype} {tuple(weight.shape)}")
    if x.dtype not in _ACT:
        raise TypeError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    N, K = weight.shape
    if x.shape[-1] != K:
        raise ValueError(f"x has {x.shape[-1]} features, the weight expects {K}")
    lead = x.shape[:-1]
    if x.is_cuda and not cuda_supports(x.dtype, x.device):
        w = decode(weight, x.dtype, scale.reshape(-1, 1) if scale is not None and scale.numel() > 1 else scale)
        b = bias.to(x.dtype) if bias is not None else None
        return torch.nn.functional.linear(x, w, b)
    x2 = x.reshape(-1, K)
    if not x.is_cuda and x.dtype == torch.bfloat16:
        # The interpreter's dot multiplies bf16 as raw uint16: give it the (exact) fp32 values;
        # products and the fp32 accumulation are the same as a bf16 MMA's.
        x2 = x2.to(torch.float32)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    LAUNCHES["linear"] += 1
    if M == 0 or N == 0:
        return out.reshape(*lead, N)
    w = weight.contiguous().view(torch.uint8)
    if scale is None:
        smode, s = 0, None
    else:
        s = scale.to(device=x.device, dtype=torch.float32).reshape(-1).contiguous()
        if s.numel() not in (1, N):
            raise ValueError(f"scale must have 1 or {N} elements, got {s.numel()}")
        smode = 1 if s.numel() == 1 else 2
    if bias is None:
        bmode, b = 0, None
    else:
        b = bias.reshape(-1).contiguous()
        if b.numel() != N:
            raise ValueError(f"bias must have {N} elements, got {b.numel()}")
        if b.dtype in _FMT:
            bmode, b = 2 + _FMT[b.dtype], b.view(torch.uint8)
        else:
            bmode = 1
    dummy = w
    args = (x2, w, b if b is not None else dummy, s if s is not None else dummy, out, M, N, K,
            x2.stride(0), out.stride(0))
    consts = dict(FMT=_FMT[weight.dtype], ACT=_ACT[x2.dtype], BIAS=bmode, SCALE=smode)
    if x.is_cuda:
        _launch_cuda(args, consts, M, N, K, x.device)
    else:
        blocks = _cpu_blocks(M, N, K)
        grid = (cdiv(N, blocks["BLOCK_N"]) * cdiv(M, blocks["BLOCK_M"]),)
        with wrapping_int_math():
            launchable(w8a16_linear_kernel, x.device.type)[grid](
                *args, **consts, EVEN_K=K % blocks["BLOCK_K"] == 0, **blocks)
    return out.reshape(*lead, N)


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                     scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """In torch, fp32 math: ``F.linear(x.float(), weight.float() * scale, bias.float())``, then
    rounded to x's dtype."""
    w = weight.to(torch.float32)
    if scale is not None:
        s = scale.to(device=w.device, dtype=torch.float32)
        w = w * (s.reshape(-1, 1) if s.numel() > 1 else s.reshape(()))
    b = bias.to(torch.float32) if bias is not None else None
    return torch.nn.functional.linear(x.to(torch.float32), w, b).to(x.dtype)


# ----------------------------------------------------------------------------- custom op
if not op_exists("fp8_linear"):
    @torch.library.custom_op(f"{OP_NAMESPACE}::fp8_linear", mutates_args=())
    def _fp8_linear_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                       scale: Optional[torch.Tensor]) -> torch.Tensor:
        return linear(x, weight, bias, scale)

    @_fp8_linear_op.register_fake
    def _(x, weight, bias, scale):
        return x.new_empty((*x.shape[:-1], weight.shape[0]))


def linear_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
              scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """:func:`linear` through the custom op (compile-safe); eager calls on plain tensors skip the
    dispatcher (``runtime.eager_plain``)."""
    if eager_plain(x):
        return linear(x, weight, bias, scale)
    return torch.ops.tritonkit.fp8_linear(x, weight, bias, scale)


# ----------------------------------------------------------------------------- cross-compile specs
def _lspec(act_ty, fmt, act, bias_ty, bias, scale, bn, bm, bk):
    sig = {"x_ptr": act_ty, "w_ptr": "*u8", "bias_ptr": bias_ty, "scale_ptr": "*fp32", "out_ptr": act_ty,
           "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_om": "i32",
           "FMT": "constexpr", "ACT": "constexpr", "BIAS": "constexpr", "SCALE": "constexpr", "EVEN_K": "constexpr",
           "BLOCK_N": "constexpr", "BLOCK_M": "constexpr", "BLOCK_K": "constexpr", "GROUP": "constexpr"}
    consts = {"FMT": fmt, "ACT": act, "BIAS": bias, "SCALE": scale, "EVEN_K": True,
              "BLOCK_N": bn, "BLOCK_M": bm, "BLOCK_K": bk, "GROUP": 8}
    return (w8a16_linear_kernel, sig, consts)


# (spec, minimum compute capability)
COMPILE_SPECS = [
    (_lspec("*fp16", 0, 0, "*u8", 2, 1, 64, 16, 128), 75),     # fp16 acts, e4m3fn weight+bias, tensor scale, small M
    (_lspec("*bf16", 0, 1, "*bf16", 1, 2, 64, 32, 64), 80),    # bf16 acts (Ampere+), per-channel scale
]
