"""FlashAttention-style forward attention in Triton, for diffusion models.

Two modes:

* ``exact``: fp16 / bf16 (or fp32) Q, K, V; Q·Kᵀ on tensor cores with fp32 accumulation, fp32
  online softmax (``exp2`` with ``log2(e)`` folded into the scale), P·V in the input dtype with
  an fp32 accumulator.
* ``int8`` (the node's "8-bit"): SageAttention-style. K is smoothed (its mean over 64 keys sampled
  across the sequence is subtracted: exact for softmax whatever the constant, since it shifts every
  score of a row by the same amount), then
  Q is quantised to int8 with one scale per row (the softmax scale and ``log2(e)`` folded in) and
  K with one scale per block of ``BLOCK_N`` keys; Q·Kᵀ runs as an int8 dot with int32
  accumulation and is rescaled in fp32. A per-row Q scale costs nothing over Sage's per-block
  one (the row scale rides on the FMA that applies the softmax scale anyway) and is more robust
  to outlier tokens. P·V (``pv``): in fp16/bf16 with an fp32 accumulator, or, SageAttention2-style
  where the GPU has fp8 MMA (sm89+), in fp8 e4m3: P (in [0, 1] after the online-softmax rescale)
  times 448, V scaled per block of 128 keys (by a power of two, so that its largest |v| lands in
  (224, 448]) into a transposed fp8 copy, each key block's products summed by the MMA and the blocks
  in fp32 registers; or (opt-in, for GeForce Ampere/Ada
  whose fp16-accumulate MMA runs at twice the fp32-accumulate rate) fp16 operands accumulated in
  fp16 within a key block. :func:`attention_8bit_emulated` is the torch model of this arithmetic.

With ``pv="auto"`` (8-bit) and the default ``TRITONKIT_ATTN_TMA`` (exact, sm90+) the variant is
not chosen by a rule: 16-bit vs fp8 P·V, and pointer vs TMA loads, are candidates of the block
config timing on the user's GPU (:func:`choose_config`, kernels/tuning.py), stored per shape class.

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

import functools
import inspect
import logging
import math
import os

import torch
import triton
import triton.language as tl

from . import attention_hopper, calibration, fast_launch, prepare, trials, tuning
from .device import capability
from .runtime import INTERPRETER_LOCK, OP_NAMESPACE, cdiv, eager_plain, kernel_for, next_pow2, op_exists
from .runtime import launch as launch_kernel

LOG2E = 1.4426950408889634
MAX_HEAD_DIM = 256
MODES = ("exact", "int8")

# ----------------------------------------------------------------------------- kernels
# Small @triton.jit helpers shared by the kernels below; Triton inlines them, so each compiles to
# what it replaces written out in place.


@triton.jit
def _round_strides(stride_b, stride_h, stride_l, MULT: tl.constexpr):
    """The three strides rounded down to multiples of MULT, for strides the launcher knows are
    multiples already (exact): the compiler then knows it too, and vectorises the loads (it only
    infers alignment from strides that are multiples of 16). `(s // m) * m` rather than
    tl.multiple_of: the hint on a kernel argument is dropped (scalar loads, measured in PTX)."""
    return (stride_b // MULT) * MULT, (stride_h // MULT) * MULT, (stride_l // MULT) * MULT


@triton.jit
def _block_batch_head(pid, num_blocks, H):
    """Program pid's (block, batch, head) on a 1-D grid of num_blocks · B · H programs, blocks
    fastest; batch and head as int64 (their offsets may pass 2**31)."""
    blk = pid % num_blocks
    off_hz = pid // num_blocks
    return blk, (off_hz // H).to(tl.int64), (off_hz % H).to(tl.int64)


@triton.jit
def _maybe_int64(offs, INT64: tl.constexpr):
    """offs as int64 when INT64 (a tensor big enough that offs · stride may pass 2**31), else as is."""
    if INT64:
        offs = offs.to(tl.int64)
    return offs


# K's smoothing mean is taken over K_MEAN_ROWS keys spread evenly over the sequence (key i·L_k // 64),
# by every K program of a head alike (the same rows summed in the same order, so the same constant):
# the softmax cancels whatever constant a channel's keys are shifted by, so the mean needs no pass of
# its own over K; a sample of the keys removes the channel offsets that smoothing is for.
K_MEAN_ROWS = tl.constexpr(64)
# fp8 V carries one scale per V_BLOCK keys, found by the program that quantises the block (no pass over
# V before it): a power of two 2^e, the least ≥ max |v| of the block / 448, e ≥ V_EXP_MIN. The copy
# stores e: the kernels rescale their accumulator from one block's scale to the next by 2^(e' - e), an
# exact factor, with no division. The attention kernels' BLOCK_N divides V_BLOCK.
V_BLOCK = attention_hopper.V_BLOCK
V_EXP_MIN = tl.constexpr(-40)
# 8-bit mode's score offset, 1.5·2^23, and its fp32 bits: int32 Q·Kᵀ accumulated onto the bits reads
# as a float of that binade whose last bits are the score (attn_fwd_kernel's QK_OFFSET)
INT_OFF = tl.constexpr(12582912.0)
INT_OFF_BITS = tl.constexpr(0x4B400000)


@triton.jit
def attn_fwd_kernel(Q, K, V, O, Mask, QS, KS, VS, KD, VD, QD,
                    qk_scale, Lq, Lk, H, KV_GROUP, tma_rb, tma_rh, tma_ch, tma_vrb, tma_vrh, tma_vch,
                    tma_qrb, tma_qrh, tma_qch,
                    stride_qb, stride_qh, stride_ql,
                    stride_kb, stride_kh, stride_kl,
                    stride_vb, stride_vh, stride_vl,
                    stride_ob, stride_oh, stride_ol,
                    stride_mb, stride_mh, stride_mm, stride_mn,
                    stride_qsb, stride_qsh, stride_ksb, stride_ksh,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    MASK_KIND: tl.constexpr, IS_CAUSAL: tl.constexpr, INT8: tl.constexpr,
                    DOT_F32: tl.constexpr, INT64: tl.constexpr, ALIGN8: tl.constexpr = False,
                    PV_MODE: tl.constexpr = 0, USE_TMA: tl.constexpr = False, WARP_SPEC: tl.constexpr = False,
                    Q_TMA: tl.constexpr = False, QK_OFFSET: tl.constexpr = True):
    """One program = BLOCK_M query rows of one (batch, head). 1-D grid, query blocks fastest, so
    the programs of one head run together and share its K/V in L2.

    PV_MODE (P·V): 0 = P in V's dtype, fp32 accumulator; 1 = fp8 e4m3 (V is then a transposed,
    block-scaled fp8 copy (B, H, BLOCK_D, L_pad) read through stride_vl as the channel stride, VS
    its scales, one per V_BLOCK keys; P is scaled by 448 into e4m3's range); 2 = fp16 operands with
    fp16 accumulation inside one key block, added to the fp32 accumulator per block.

    USE_TMA (exact mode, Hopper+): K and V tiles come through tensor descriptors KD / VD (TMA
    loads, zero fill past the tensor) over a 2-D view of K / V: the tile of (batch b, kv head hk)
    starts at row b·tma_rb + hk·tma_rh, column hk·tma_ch (V's at b·tma_vrb + hk·tma_vrh, hk·tma_vch: K and V
    may fold differently, e.g. V a view into a fused projection); columns past HEAD_DIM may hold the next
    head's values (Q's padding columns are zero, so they add nothing to Q·Kᵀ, and the output's are
    not stored), rows past L_k the next head's keys (masked like any key past L_k). WARP_SPEC asks
    Triton to warp-specialise the unmasked key loop (producer / consumer warps). Q_TMA (with
    USE_TMA, head sizes that need no padding): the Q tile comes through QD the same way (row
    b·tma_qrb + h·tma_qrh + the block's first row, column h·tma_qch; rows past L_q are not stored).
    A Q tile loaded by TMA stays in shared memory as the MMA's operand instead of taking 64-128
    registers a thread: the 4-warp configs then run without spilling (sm90, Triton 3.6).

    QK_OFFSET (8-bit mode): the int8 Q·Kᵀ accumulates onto INT_OFF's bits, so its int32 scores read as
    fp32 s + INT_OFF, exactly, with no conversion (|s| < 2^22: int8 of at most 127 over up to 256
    channels); INT_OFF comes out per row in the softmax's FMA. Without it every score takes an
    int-to-float conversion (I2FP), as many as the exponentials."""
    PAD_D: tl.constexpr = HEAD_DIM != BLOCK_D
    if ALIGN8:
        # every row start is 16-byte aligned (the launcher checked): rows of e.g. 40 or 80
        # elements still load as 16-byte vectors
        stride_qb, stride_qh, stride_ql = _round_strides(stride_qb, stride_qh, stride_ql, 8)
        stride_kb, stride_kh, stride_kl = _round_strides(stride_kb, stride_kh, stride_kl, 8)
        stride_vb, stride_vh, stride_vl = _round_strides(stride_vb, stride_vh, stride_vl, 8)
        stride_ob, stride_oh, stride_ol = _round_strides(stride_ob, stride_oh, stride_ol, 8)
    if PV_MODE == 1:
        # the fp8 V copy is ours: (B, H, BLOCK_D, L_pad), L_pad a multiple of 128
        stride_vb, stride_vh, stride_vl = _round_strides(stride_vb, stride_vh, stride_vl, 128)
    if INT8:
        # the int8 Q / K copies are ours too: contiguous (B, H, L, BLOCK_D)
        stride_qb, stride_qh, stride_ql = _round_strides(stride_qb, stride_qh, stride_ql, 16)
        stride_kb, stride_kh, stride_kl = _round_strides(stride_kb, stride_kh, stride_kl, 16)
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
    offs_m_o = _maybe_int64(offs_m, INT64)
    m_ok = offs_m < Lq
    d_ok = offs_d < HEAD_DIM

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m_o[:, None] * stride_ql + offs_d[None, :]
    K_base = K + b * stride_kb + hk * stride_kh
    V_base = V + b * stride_vb + hk * stride_vh
    Mask_base = Mask + b * stride_mb + h * stride_mh
    KS_base = KS + b * stride_ksb + hk * stride_ksh
    if USE_TMA:
        tma_row = (b * tma_rb + hk * tma_rh).to(tl.int32)
        tma_col = (hk * tma_ch).to(tl.int32)
        tma_vrow = (b * tma_vrb + hk * tma_vrh).to(tl.int32)
        tma_vcol = (hk * tma_vch).to(tl.int32)
    if PV_MODE == 1:
        VS_base = VS + (b * (H // KV_GROUP) + hk) * ((Lk + V_BLOCK - 1) // V_BLOCK)
        # the accumulator is kept in units of the last block's V scale: each block rescales it by the
        # ratio of the previous scale to its own, 2^(e_prev - e), with the online softmax's alpha
        e_prev = tl.load(VS_base)
    if INT8:
        q = tl.load(q_ptrs, mask=m_ok[:, None], other=0)
        qc = tl.load(QS + b * stride_qsb + h * stride_qsh + offs_m, mask=m_ok, other=0.0)
    elif Q_TMA:
        q = QD.load([(b * tma_qrb + h * tma_qrh + start_m * BLOCK_M).to(tl.int32), (h * tma_qch).to(tl.int32)])
        qc = qk_scale * 1.4426950408889634
    else:
        q = tl.load(q_ptrs, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
        qc = qk_scale * 1.4426950408889634

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # fp8 P·V takes P × 448 (e4m3's range): the factor comes free in the exponent, and the row sums
    # l_i carry it too
    P_LOG2: tl.constexpr = 8.807354922057604 if PV_MODE == 1 else 0.0

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
        for start_n in tl.range(lo, hi_s, BLOCK_N, warp_specialize=WARP_SPEC and stage == 0):
            cols = start_n + offs_n
            cols_o = _maybe_int64(cols, INT64)
            n_ok = cols < Lk
            k_ptrs = K_base + cols_o[:, None] * stride_kl + offs_d[None, :]
            if INT8:
                # int8 K is a padded contiguous copy: only the rows need a bound
                if stage == 1:
                    k = tl.load(k_ptrs, mask=n_ok[:, None], other=0)
                else:
                    k = tl.load(k_ptrs)
                if QK_OFFSET:
                    qk = tl.dot(q, tl.trans(k), tl.full([BLOCK_M, BLOCK_N], INT_OFF_BITS, tl.int32),
                                out_dtype=tl.int32)
                    qk = qk.to(tl.float32, bitcast=True)
                else:
                    qk = tl.dot(q, tl.trans(k)).to(tl.float32)
                ks = tl.load(KS_base + start_n // BLOCK_N)
                c = qc * ks
                c2 = c[:, None]
            else:
                if USE_TMA:
                    k = KD.load([tma_row + start_n, tma_col])
                elif stage == 1:
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
                if INT8 and QK_OFFSET:
                    qk = qk - INT_OFF
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
                p = tl.math.exp2(s - (m_safe - P_LOG2)[:, None])
                alpha = tl.math.exp2(m_i - m_safe)
            elif INT8 and QK_OFFSET:
                # the offset leaves the max exactly; the FMA's row term rounds once, to at most half
                # an ulp of INT_OFF·c (about 1e-4 of a score unit at attention's scales), a factor
                # the block's P and its share of the row sum both carry
                m_ij = tl.maximum(m_i, (tl.max(qk, 1) - INT_OFF) * c)
                p = tl.math.exp2(qk * c2 - (m_ij - P_LOG2 + INT_OFF * c)[:, None])
                alpha = tl.math.exp2(m_i - m_ij)
            else:
                m_ij = tl.maximum(m_i, tl.max(qk, 1) * c)
                p = tl.math.exp2(qk * c2 - (m_ij - P_LOG2)[:, None])
                alpha = tl.math.exp2(m_i - m_ij)
            l_i = l_i * alpha + tl.sum(p, 1)
            if PV_MODE == 1:
                # fp8 V^T: (BLOCK_D, BLOCK_N) tile, keys contiguous (K-major for the fp8 MMA); the
                # copy is zero-padded to a multiple of 128 keys and BLOCK_D channels: no masks
                vt = tl.load(V_base + _maybe_int64(offs_d, INT64)[:, None] * stride_vl + cols_o[None, :])
                # two-level accumulation: one key block's products summed by the MMA (whose fp8
                # accumulator keeps fewer mantissa bits than fp32), then added in fp32 registers;
                # accumulating every block in the MMA lost accuracy with L (cos 0.9989 at L=32760)
                pv = tl.dot(p.to(tl.float8e4nv), tl.trans(vt))
                e_j = tl.load(VS_base + start_n // V_BLOCK)
                acc = acc * (alpha * tl.math.exp2(e_prev - e_j))[:, None] + pv
                e_prev = e_j
            else:
                v_ptrs = V_base + cols_o[:, None] * stride_vl + offs_d[None, :]
                if USE_TMA:
                    v = VD.load([tma_vrow + start_n, tma_vcol])
                elif stage == 1:
                    v = tl.load(v_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
                elif PAD_D:
                    v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
                else:
                    v = tl.load(v_ptrs)
                if PV_MODE == 2:
                    # one block's partial sums in fp16 (2x MMA rate on GeForce), then fp32
                    pv = tl.dot(p.to(tl.float16), v.to(tl.float16), out_dtype=tl.float16)
                    acc = acc * alpha[:, None] + pv.to(tl.float32)
                elif DOT_F32:
                    acc = acc * alpha[:, None]
                    acc = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), acc)
                else:
                    acc = acc * alpha[:, None]
                    acc = tl.dot(p.to(v.dtype), v, acc)
            m_i = m_ij
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    if PV_MODE == 1:
        # from the last block's V units (P's 448 is in l_i too)
        out = acc * (tl.math.exp2(e_prev) / l_safe[:, None])
    else:
        out = acc / l_safe[:, None]
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m_o[:, None] * stride_ol + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


# Triton < 3.4 (torch 2.7's 3.3, 2.6's 3.2) has no ``warp_specialize`` in tl.range: the keyword made every attention
# kernel fail to compile there, so the node served no call. The request is dropped from the kernel's source for such
# a Triton (WARP_SPEC comes only with TMA loads, which a Triton without tensor descriptors gets no candidates for).
WARP_SPEC_ARG = ", warp_specialize=WARP_SPEC and stage == 0"


def range_warp_specializes() -> bool:
    return "warp_specialize" in inspect.signature(tl.range.__init__).parameters


if not range_warp_specializes():
    if hasattr(attn_fwd_kernel, "_unsafe_update_src"):  # Triton 3.3 refuses a plain assignment
        attn_fwd_kernel._unsafe_update_src(attn_fwd_kernel.src.replace(WARP_SPEC_ARG, ""))
    else:  # Triton 3.2 and older: assigning .src resets the kernel's hash
        attn_fwd_kernel.src = attn_fwd_kernel.src.replace(WARP_SPEC_ARG, "")


@triton.jit
def _int8_tile(x, PER_ROW: tl.constexpr):
    """(int8 tile, scale): one scale per row (PER_ROW) or one for the tile, max |x| / 127; rounded
    half away from zero, as SageAttention does."""
    if PER_ROW:
        scale = tl.maximum(tl.max(tl.abs(x), 1), 1e-30) / 127.0
        y = x / scale[:, None]
    else:
        scale = tl.maximum(tl.max(tl.max(tl.abs(x), 1), 0), 1e-30) / 127.0
        y = x / scale
    y = tl.where(y >= 0, y + 0.5, y - 0.5)
    return y.to(tl.int8), scale


@triton.jit
def quant_qkv_kernel(Q, K, V, QO, QS, KO, KS, VO, VS,
                     Lq, Lk, H, HK, NQ, NK, q_mult,
                     stride_qb, stride_qh, stride_ql,
                     stride_kb, stride_kh, stride_kl,
                     stride_vb, stride_vh, stride_vl,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_LQ: tl.constexpr,
                     BLOCK_LK: tl.constexpr, FP8_V: tl.constexpr, INT64: tl.constexpr,
                     ALIGN8_Q: tl.constexpr = False, ALIGN8_K: tl.constexpr = False,
                     ALIGN8_V: tl.constexpr = False, PERM_V: tl.constexpr = False):
    """The 8-bit mode's operands in one launch, from (B, H, L, D)-strided Q, K, V into contiguous,
    zero-padded buffers, each program reading its own rows once (no statistics pass before it):

    * programs [0, NQ): Q · q_mult (softmax scale and log2(e)) to int8 QO (B, H, Lq, BLOCK_D), one
      scale per row in QS (B, H, Lq);
    * programs [NQ, NQ + NK): K minus its mean (over K_MEAN_ROWS sampled keys) to int8 KO (B, HK,
      Lk, BLOCK_D), one scale per BLOCK_LK keys (the attention kernel's BLOCK_N) in KS (B, HK,
      cdiv(Lk, BLOCK_LK));
    * the rest, with FP8_V: V_BLOCK keys of V each, divided by their scale 2^e (the least power of two
      ≥ max |v| over the block's keys and channels / 448; e into VS (B, HK, L_pad / V_BLOCK) as a
      float; no mean subtracted: smoothing V by its mean measured worse at long sequences, cos
      0.99895 vs 0.99927 at L=32760) to fp8 e4m3,
      transposed into VO (B, HK, BLOCK_D, L_pad), L_pad = Lk rounded up to V_BLOCK (keys contiguous:
      the K-major operand the fp8 MMA needs). With PERM_V the keys are stored relabelled within each
      32, in the order the Gluon kernel's fp8 P operand reads them (kernels/attention_hopper.py,
      ``_p_operand``).

    ALIGN8_*: as in attn_fwd_kernel (16-byte rows, vector loads at head sizes 40 / 80)."""
    if ALIGN8_Q:
        stride_qb, stride_qh, stride_ql = _round_strides(stride_qb, stride_qh, stride_ql, 8)
    if ALIGN8_K:
        stride_kb, stride_kh, stride_kl = _round_strides(stride_kb, stride_kh, stride_kl, 8)
    if ALIGN8_V:
        stride_vb, stride_vh, stride_vl = _round_strides(stride_vb, stride_vh, stride_vl, 8)
    # each part in a function of its own: Triton merges a name bound in both arms of an if, and
    # the parts' tiles differ in type and shape
    pid = tl.program_id(0)
    if pid < NQ:
        _quant_q_part(Q, QO, QS, pid, Lq, H, q_mult, stride_qb, stride_qh, stride_ql,
                      HEAD_DIM, BLOCK_D, BLOCK_LQ, INT64)
    elif pid < NQ + NK:
        _quant_k_part(K, KO, KS, pid - NQ, Lk, HK, stride_kb, stride_kh, stride_kl,
                      HEAD_DIM, BLOCK_D, BLOCK_LK, INT64)
    elif FP8_V:
        _quant_v_part(V, VO, VS, pid - NQ - NK, Lk, HK, stride_vb, stride_vh, stride_vl,
                      HEAD_DIM, BLOCK_D, INT64, PERM_V)


@triton.jit
def _quant_q_part(Q, QO, QS, pid, Lq, H, q_mult, stride_qb, stride_qh, stride_ql,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr, INT64: tl.constexpr):
    blk, b, h = _block_batch_head(pid, tl.cdiv(Lq, BLOCK_L), H)
    rows = blk * BLOCK_L + tl.arange(0, BLOCK_L)
    rows_o = _maybe_int64(rows, INT64)
    offs_d = tl.arange(0, BLOCK_D)
    r_ok = rows < Lq
    x = tl.load(Q + b * stride_qb + h * stride_qh + rows_o[:, None] * stride_ql + offs_d[None, :],
                mask=r_ok[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0).to(tl.float32)
    y, scale = _int8_tile(x * q_mult, True)
    base = (b * H + h) * Lq
    tl.store(QO + (base + rows_o[:, None]) * BLOCK_D + offs_d[None, :], y, mask=r_ok[:, None])
    tl.store(QS + base + rows, scale, mask=r_ok)


@triton.jit
def _quant_k_part(K, KO, KS, pid, Lk, HK, stride_kb, stride_kh, stride_kl,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr, INT64: tl.constexpr):
    nkb = tl.cdiv(Lk, BLOCK_L)
    blk, b, h = _block_batch_head(pid, nkb, HK)
    rows = blk * BLOCK_L + tl.arange(0, BLOCK_L)
    rows_o = _maybe_int64(rows, INT64)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    r_ok = rows < Lk
    ok = r_ok[:, None] & d_ok[None, :]
    k_head = K + b * stride_kb + h * stride_kh
    x = tl.load(k_head + rows_o[:, None] * stride_kl + offs_d[None, :], mask=ok, other=0.0).to(tl.float32)
    # the smoothing mean: keys i·Lk // K_MEAN_ROWS (repeats where Lk is smaller), the same in every program
    srows = (_maybe_int64(tl.arange(0, K_MEAN_ROWS), INT64) * Lk) // K_MEAN_ROWS
    xs = tl.load(k_head + srows[:, None] * stride_kl + offs_d[None, :], mask=d_ok[None, :], other=0.0)
    mu = tl.sum(xs.to(tl.float32), 0) * (1.0 / K_MEAN_ROWS)
    y, scale = _int8_tile(tl.where(ok, x - mu[None, :], 0.0), False)
    tl.store(KO + ((b * HK + h) * Lk + rows_o[:, None]) * BLOCK_D + offs_d[None, :], y, mask=r_ok[:, None])
    tl.store(KS + (b * HK + h) * nkb + blk, scale)


@triton.jit
def _quant_v_part(V, VO, VS, pid, Lk, HK, stride_vb, stride_vh, stride_vl,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, INT64: tl.constexpr, PERM_V: tl.constexpr):
    VB: tl.constexpr = V_BLOCK
    n_vb = tl.cdiv(Lk, VB)
    blk, b, h = _block_batch_head(pid, n_vb, HK)
    cols = tl.arange(0, VB)  # the copy's columns, contiguous in VO
    if PERM_V:  # column c holds key π(c): bits 0,1,2,3 of c to 0,3,1,2 (π: attention_hopper._p_operand);
        # permuted on the load (whole rows of V), the store stays contiguous (vector stores)
        keys = (cols & ~15) | (cols & 1) | ((cols << 2) & 8) | ((cols >> 1) & 6)
    else:
        keys = cols
    rows = blk * VB + keys
    rows_o = _maybe_int64(rows, INT64)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (rows < Lk)[:, None] & (offs_d < HEAD_DIM)[None, :]
    x = tl.load(V + b * stride_vb + h * stride_vh + rows_o[:, None] * stride_vl + offs_d[None, :],
                mask=ok, other=0.0).to(tl.float32)
    # e = ceil(log2(max |v| / 448)) from the float's bits (exact: a power of two's mantissa is 0), then
    # x · 2^-e exactly, 2^-e built from its bits
    bits = (tl.max(tl.max(tl.abs(x), 1), 0) * (1.0 / 448.0)).to(tl.int32, bitcast=True)
    e = tl.maximum((bits >> 23) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32), V_EXP_MIN)
    inv = ((127 - e) << 23).to(tl.float32, bitcast=True)
    y = tl.minimum(tl.maximum(x * inv, -448.0), 448.0)
    tl.store(VS + (b * HK + h) * n_vb + blk, e.to(tl.float32))
    cols_o = _maybe_int64(blk * VB + cols, INT64)
    tl.store(VO + ((b * HK + h) * BLOCK_D + offs_d[None, :]) * (n_vb * VB) + cols_o[:, None], y.to(tl.float8e4nv))


# ----------------------------------------------------------------------------- configurations


def block_d_for(head_dim: int) -> int:
    """The padded head size the kernel computes with (a power of two, at least 16)."""
    return max(16, next_pow2(head_dim))


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
    "sm90": {64: [(128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3)],
             128: [(128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 8, 2)],
             256: [(128, 64, 8, 2), (64, 64, 4, 2)]},
}
# Exact mode with TMA loads (sm90+; K, V and, at unpadded heads, Q through tensor descriptors):
# with Q's tile in shared memory, 4-warp configs no longer spill, and two of their CTAs fit an SM
# (98-115 KB of shared memory each), which overlaps one CTA's softmax with the other's MMAs. H100,
# bench/attention_variants.py, 2026-11-25: (128, 64, 4, 2) 519 TFLOPS at HunyuanVideo's shape
# against 498 for (128, 128, 8, 3); (64, 128, 4, 3) 418 at SDXL's head 64 against 362.
_CANDIDATES_TMA = {
    "sm90": {64: [(64, 128, 4, 3), (64, 64, 4, 3), (128, 64, 8, 3)],
             128: [(128, 64, 4, 2), (64, 64, 4, 3), (128, 128, 8, 3)],
             256: [(128, 64, 8, 2), (64, 64, 4, 2)]},
}
# int8 Q·K has its own lists where they differ (measured on H200: 4 warps win for int8 at 128).
# sm86 / sm89 / sm120 (~100 KB of shared memory): an int8 K tile is half the bytes of a 16-bit one,
# so a third stage fits beside 64-key blocks at head 128 (90 KB). Only configs that compile for
# sm86 with no more spills than the default (ptxas -v, Triton 3.8: 388 bytes at (128, 64, 8, 2/3));
# (128, 64, 4, 3), the Hopper int8 pick, spills 1.7 KB there and is left out.
# (128, 64, 8, 4): a fourth stage, 90 KB at sm86 with 16-bit P·V, no spills at sm86 / 89 / 120; as mma.sync code
# (the cards' instruction, DISABLE_MMA_V3=1) on an H200 3 % faster than (128, 64, 8, 3) at HunyuanVideo's and
# Flux's shapes (BENCHMARKS.md, forty-ninth session).
_CANDIDATES_INT8 = {
    "sm86": {64: [(128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 3)],
             128: [(128, 64, 8, 2), (64, 64, 4, 3), (128, 32, 4, 2), (128, 64, 8, 3), (128, 64, 8, 4)],
             256: [(64, 32, 4, 2), (32, 32, 4, 2)]},
    "sm90": {64: [(128, 64, 4, 3), (128, 128, 8, 3), (128, 128, 4, 3)],
             128: [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 4)],
             256: [(128, 64, 8, 2), (64, 64, 4, 2)]},
}
# int8 Q·K + fp8 P·V on Hopper: at head 128, 4 warps spill (P, its fp8 copy and the 128x128 fp32
# accumulator in one warpgroup), 8 warps do not (ptxas: 182-235 registers, 0 spills).
_CANDIDATES_FP8PV = {
    "sm90": {64: [(128, 64, 4, 3), (128, 128, 8, 3), (128, 128, 4, 3)],
             128: [(128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 8, 2)],
             256: [(128, 64, 8, 2), (64, 64, 4, 2)]},
}
_CANDIDATES["sm120"] = _CANDIDATES["sm86"]
_CANDIDATES["sm100"] = _CANDIDATES["sm90"]
_CANDIDATES_INT8["sm100"] = _CANDIDATES_INT8["sm90"]
_CANDIDATES_INT8["sm120"] = _CANDIDATES_INT8["sm86"]
_CANDIDATES_FP8PV["sm100"] = _CANDIDATES_FP8PV["sm90"]
_CANDIDATES_TMA["sm100"] = _CANDIDATES_TMA["sm90"]

# Interpreter (CPU): the block sizes only change how many numpy steps run.
CPU_CONFIG = (32, 32, 4, 1)


def _dbucket(block_d: int) -> int:
    return 64 if block_d <= 64 else block_d


def _smem_bytes(cfg, block_d, in_bytes, int8):
    """A config's shared memory: its Q tile and K / V stages. The 8-bit kernel's follows Triton's allocation,
    ``stages - 1`` ring buffers (measured at sm86 / 89 / 120 with Triton 3.3-3.8: (128, 64, 8, 4) takes 90 KB at
    head 128); the exact kernel's keeps ``stages``, the older, larger estimate its tables were chosen under."""
    bm, bn, _, stages = cfg
    kb = 1 if int8 else in_bytes
    rings = max(stages - 1, 1) if int8 else stages
    return rings * bn * block_d * (kb + in_bytes) + bm * block_d * kb


def candidates(cc: int, block_d: int, in_bytes: int = 2, int8: bool = False):
    fam = arch_family(cc)
    if isinstance(int8, str) and int8.startswith("exact"):  # the tuning key's name for exact + TMA
        int8 = False
        table = _CANDIDATES_TMA.get(fam, _CANDIDATES[fam])
    else:
        table = _CANDIDATES_INT8.get(fam, _CANDIDATES[fam]) if int8 else _CANDIDATES[fam]
    if int8 == "int8-fp8pv":  # the tuning key's name for int8 Q·K with fp8 P·V
        table = _CANDIDATES_FP8PV.get(fam, table)
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


def fp8_pv_supported(cc: int | None) -> bool:
    """fp8 e4m3 MMA (P·V in the 8-bit mode): sm89 (Ada), sm90 (Hopper), sm100+/sm120. Not the
    CPU interpreter (its float8e4nv conversions do not round like the hardware's)."""
    return cc is not None and cc >= 89


PV_MODES = ("auto", "half", "fp8", "f16acc")

# Kernel variants. `auto` does not pick them by rule: they are candidates of the block-config
# timing (kernels/tuning.py), as a fifth element of (BLOCK_M, BLOCK_N, num_warps, num_stages,
# variant), timed on the user's GPU for each shape class and stored with the config. In 8-bit mode
# the variant is the kernel's PV_MODE (0 P·V in the input dtype, 1 fp8 e4m3, 2 fp16-accumulate);
# in exact mode the K / V loads (TMA_OFF pointers, TMA_ON tensor descriptors, TMA_WS descriptors
# and a warp-specialised key loop, GLUON kernels/attention_hopper.py's kernel: asynchronous wgmma,
# each block's softmax beside the previous block's P·V; sm90, heads 64 / 128, no mask; GLUON_WS its
# warp-specialised form: a producer warp for the loads, one or two consumer warpgroups; GLUON_PP
# that with the two consumers' MMAs taking turns).
TMA_OFF, TMA_ON, TMA_WS, GLUON, GLUON_WS, GLUON_PP = 0, 1, 2, 3, 4, 5
GLUON_VARIANTS = (GLUON, GLUON_WS, GLUON_PP)
_GLUON_WS = {GLUON: False, GLUON_WS: True, GLUON_PP: "pp"}
# 8-bit mode's variants beyond the kernel's PV_MODEs: kernels/attention_hopper.py's warp-specialised
# 8-bit kernel with P·V in the input dtype (G8_HALF, PV_MODE 0's arithmetic) or in fp8 (G8_FP8, PV_MODE 1's)
G8_HALF, G8_FP8 = 3, 4
_G8_OF = {0: G8_HALF, 1: G8_FP8}

# fp8 P·V has ~3x the error of 16-bit P·V (rel. L2 3.8 % vs 1.2 %, cos 0.9993 vs 0.99993 on an
# H100, bench/attention.py), so `auto` takes it only where it times at least this much faster:
# its measured time is multiplied by this factor before the comparison. A policy on accuracy, not
# a hardware threshold. (H100, 2026-11-23: fp8 P·V 0.87x the 16-bit one at Flux's 4608 keys,
# 1.09-1.10x at 16384 and 32760 keys; the Gluon 8-bit kernel's, H100 and H200, 2026-11-28: 1.05-1.07x
# at Flux's.)
FP8_PV_MARGIN = 1.03


def pv_modes_for(pv: str, cc: int | None, int8: bool) -> tuple:
    """The kernel PV_MODEs the ``pv`` argument of :func:`attention` leaves to choose from, the
    default first (taken when timing is off): "auto" in 8-bit mode on a GPU with fp8 MMA = both
    16-bit and fp8 P·V, timed (16-bit first on datacenter Hopper / Blackwell, whose 16-bit MMA with
    fp32 accumulation runs at half the fp8 rate like GeForce's but where the kernel is bound by
    the softmax; fp8 first on GeForce Ada / Blackwell, sm89 / sm120, where the fp8 MMA rate is
    2x-4x the fp32-accumulate 16-bit one: by the published per-card rates, not measured here);
    "half" / "fp8" / "f16acc" = that one."""
    if pv not in PV_MODES:
        raise ValueError(f"pv must be one of {PV_MODES}")
    if not int8 or pv == "half":
        if int8 or pv in ("auto", "half"):
            return (0,)
        raise ValueError(f"pv={pv!r} is for mode='int8' only")
    if pv == "auto":
        if not fp8_pv_supported(cc):
            return (0,)
        return (0, 1) if cc in (90, 100, 103) else (1, 0)
    if pv == "fp8":
        if not fp8_pv_supported(cc):
            raise ValueError(f"pv='fp8' needs a GPU with fp8 MMA (sm89+), got {'CPU' if cc is None else f'sm{cc}'}")
        return (1,)
    return (2,)


def int8_supported(cc: int | None) -> bool:
    """int8 Q·Kᵀ: CPU interpreter and sm80+. Turing's int8 mma lowering is not trusted (Triton
    3.3+ miscompiles it, SageAttention #197), so 8-bit falls back to exact there."""
    return cc is None or cc >= 80


# ----------------------------------------------------------------------------- launcher

def autotune_enabled() -> bool:
    return tuning.enabled()


def tune_cache() -> dict:
    """store key -> chosen (BLOCK_M, BLOCK_N, num_warps, num_stages) of this process."""
    return {k: v for k, v in tuning.cache().items() if k.startswith("attn_config|")}


def _pow2_bucket(n: int) -> int:
    return next_pow2(max(16, min(int(n), 32768)))


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


def _align8(x, D, strides) -> bool:
    """Rows of x start on 16-byte boundaries (the kernels' ALIGN8 hint is then exact)."""
    return D % 8 == 0 and all(st % 8 == 0 for st in strides) and x.data_ptr() % 16 == 0


# The 8-bit pre-pass's launch shape: quant_qkv_kernel's Q rows a program and its warps (a K program
# takes the attention kernel's BLOCK_N keys, an fp8-V program V_BLOCK). 64 Q rows and 4 warps: the
# fastest (one tie) at Flux and HunyuanVideo-like, both V forms, of bench/attention_prepass.py
# on an H100 and an H200 (2026-11-28, BENCHMARKS.md), 22-32 % under the 128 rows and 8 warps that were
# fastest while a statistics pass ran before it. A memory-bound copy's launch shape, not a path choice.
PREPASS = {"block_q": 64, "quant_warps": 4}


def _prepare_8bit(q4, sq, k4, sk, v4, sv, B, H, Hk, Lq, Lk, D, block_d, q_mult, block_n, fp8_v, warmup=False,
                  perm_v=False, plan=None):
    """The 8-bit operands of one call, in one launch (quant_qkv_kernel): (int8 Q, its row scales,
    int8 K, its block scales, fp8 Vᵀ or None, V's block scales or None). With ``warmup`` the kernel
    is only compiled; with ``perm_v`` Vᵀ's keys are in the Gluon fp8 kernel's order; ``plan``: the
    call's launch plan key (runtime.launch)."""
    if fp8_v and V_BLOCK.value % block_n:  # (every fp8 P·V candidate's BLOCK_N divides it)
        raise ValueError(f"BLOCK_N {block_n} does not divide the fp8 V scales' block of {V_BLOCK.value} keys")
    dev = q4.device
    l_pad = cdiv(Lk, V_BLOCK.value) * V_BLOCK.value
    int64 = max(Lq * max(sq[2], 1), Lk * max(sk[2], 1), Lk * max(sv[2], 1),
                max(Lq, l_pad) * block_d) >= INT64_THRESHOLD
    al_q, al_k, al_v = _align8(q4, D, sq), _align8(k4, D, sk), fp8_v and _align8(v4, D, sv)
    qi = torch.empty((B, H, Lq, block_d), dtype=torch.int8, device=dev)
    qs = torch.empty((B, H, Lq), dtype=torch.float32, device=dev)
    ki = torch.empty((B, Hk, Lk, block_d), dtype=torch.int8, device=dev)
    nkb = cdiv(Lk, block_n)
    ks = torch.empty((B, Hk, nkb), dtype=torch.float32, device=dev)
    n_vb = l_pad // V_BLOCK.value
    vf = torch.empty((B, Hk, block_d, l_pad), dtype=torch.float8_e4m3fn, device=dev) if fp8_v else None
    vs = torch.empty((B, Hk, n_vb), dtype=torch.float32, device=dev) if fp8_v else None
    block_q = PREPASS["block_q"]
    nq, nk = cdiv(Lq, block_q) * B * H, nkb * B * Hk
    nv = n_vb * B * Hk if fp8_v else 0
    launch_kernel(
        kernel_for(quant_qkv_kernel, dev.type), (nq + nk + nv,),
        q4, k4, v4, qi, qs, ki, ks, vf if fp8_v else qi, vs if fp8_v else qs,
        Lq, Lk, H, Hk, nq, nk, float(q_mult), *sq, *sk, *sv,
        HEAD_DIM=D, BLOCK_D=block_d, BLOCK_LQ=block_q, BLOCK_LK=block_n, FP8_V=fp8_v,
        INT64=int64, ALIGN8_Q=al_q, ALIGN8_K=al_k, ALIGN8_V=al_v, PERM_V=bool(perm_v),
        num_warps=PREPASS["quant_warps"], warmup=warmup, plan=plan)
    return qi, qs, ki, ks, vf, vs


class _interpreted_device_calls:
    """While the Triton interpreter runs these kernels on CPU tensors (``runtime.kernel_for``),
    calls from a kernel into ``@triton.jit`` library functions (``tl.zeros``, ``tl.max``, ...) must
    be interpreted too, as they are under ``TRITON_INTERPRET=1``. Patched only for the duration of
    a CPU launch, under the interpreter's lock (runtime.INTERPRETER_LOCK); restored afterwards."""

    def __init__(self, device_type):
        self.active = device_type == "cpu" and not _interpreter_global()

    def __enter__(self):
        if self.active:
            from triton.runtime.interpreter import InterpretedFunction
            from triton.runtime.jit import JITFunction
            INTERPRETER_LOCK.acquire()
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
            INTERPRETER_LOCK.release()


def _interpreter_global() -> bool:
    from .runtime import interpreter_active, triton_cpu_backend_available
    return interpreter_active() or triton_cpu_backend_available()


_device_cc = capability  # (a module name tests replace to stand in for another GPU)


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


# The TMA path's tile addressing runs in the interpreter when tests set this (its descriptors are
# emulated there; on GPUs the path needs sm90+).
TMA_IN_INTERPRETER = False


TMA_ENV = "TRITONKIT_ATTN_TMA"


@functools.lru_cache(maxsize=None)
def tensor_descriptors_available() -> bool:
    """The installed Triton has host-side tensor descriptors (Triton 3.4+; older ones get no TMA
    candidates)."""
    import importlib.util
    try:
        return importlib.util.find_spec("triton.tools.tensor_descriptor") is not None
    except (ImportError, ValueError):
        return False


def tma_variants_for(cc: int | None, dtype, gluon: bool = False) -> tuple:
    """Exact mode's K / V load variants to choose from, the default first. TRITONKIT_ATTN_TMA:
    unset or "auto" = pointer loads and TMA, timed (sm90+, fp16 / bf16), or, where ``gluon``
    (kernels/attention_hopper.py can serve the call), pointer loads and the Gluon kernel's three
    forms; "0" = pointer loads only;
    "1" = TMA; "gluon" = the Gluon kernel where it can serve the call, else TMA; "ws" = TMA and a
    warp-specialised key loop (opt-in only: Triton 3.6 fails to compile some of its configs on
    sm90, and it measured no faster than TMA alone on an H100)."""
    v = os.environ.get(TMA_ENV, "auto").strip().lower()
    if v not in ("auto", "", "0", "off", "false", "no", "1", "on", "true", "yes", "ws", "gluon"):
        raise ValueError(f"{TMA_ENV} must be auto, 0, 1, gluon or ws, not {v!r}")
    able = ((cc is not None and cc >= 90) or (cc is None and TMA_IN_INTERPRETER)) and \
        dtype in (torch.float16, torch.bfloat16) and tensor_descriptors_available()
    if not able or v in ("0", "off", "false", "no"):
        return (TMA_OFF,)
    if v == "ws":
        return (TMA_WS,)
    if v == "gluon":
        return GLUON_VARIANTS if gluon else (TMA_ON,)
    if v in ("1", "on", "true", "yes"):
        return (TMA_ON,)
    if cc is None:
        return (TMA_OFF,)
    # where the Gluon kernel serves the call, Triton's TMA variant is left out: it timed below both
    # Gluon forms at every shape on an H100 (bench/attention_hopper.py, 2026-11-26); pointer loads
    # stay, the fallback should Gluon fail to compile on this Triton
    return (TMA_OFF,) + GLUON_VARIANTS if gluon else (TMA_OFF, TMA_ON)


def _table(int8: bool, variant: int, q_tma: bool = True):
    """The name candidates() takes for this mode and variant. TMA loads of K / V alone (Q through
    pointers: a padded head) keep the pointer loads' configs: the 4-warp TMA configs need Q's tile
    in shared memory (and timed erratically at SD1.5's padded head 40 on an H100, 2026-11-25). So
    does the opt-in warp specialisation: its buffers need more shared memory (263 KB at
    (128, 128, 8, 3), head 128, over the H200's 227 KB)."""
    if int8:
        return (True, "int8-fp8pv", "int8-f16acc")[variant]
    return "exact-tma" if variant == TMA_ON and q_tma else False


def variant_candidates(cc: int, block_d: int, in_bytes: int, int8: bool, variants, q_tma: bool = True) -> list:
    """Candidates (BLOCK_M, BLOCK_N, num_warps, num_stages, variant) over ``variants``, in their
    order: each variant with its own config list."""
    out = []
    for v in variants:
        if not int8 and v in GLUON_VARIANTS:
            out += [tuple(c) + (v,) for c in attention_hopper.candidates(block_d, ws=_GLUON_WS[v])]
            continue
        if int8 and v in (G8_HALF, G8_FP8):
            out += [tuple(c) + (v,) for c in attention_hopper.candidates8(block_d, fp8_pv=v == G8_FP8)]
            continue
        cands = candidates(cc, block_d, in_bytes, _table(int8, v, q_tma))
        if not int8 and v == TMA_WS:
            # Triton 3.6's warp-specialisation pass aborts on the 4-warp configs (an MLIR
            # dominance assertion, sm90, H100 2026-11-23); 8 warps compile. Its buffers take about
            # one more Q tile of shared memory (263 KB at (128, 128, 8, 3), head 128, H200).
            room = _SMEM[arch_family(cc)]
            cands = [c for c in cands if c[2] == 8
                     and _smem_bytes(c, block_d, in_bytes, False) + c[0] * block_d * in_bytes <= room] or cands
        out += [tuple(c) + (v,) for c in cands]
    return out


def _row_fold(x, Hx, Lx, D, bhld):
    """How one (B, H, L, D) operand (bhld) or (B, L, H, D) view (bld) folds into one 2-D array of 16-byte-aligned
    rows, judged by its strides alone (its base address is the caller's to check): (row stride, (row per batch, row
    per head, column per head), columns), or None. Two patterns, whichever the dims are called: heads first (each
    head's rows one after another, ``sh == L·sl``), or heads side by side in one row (``sh ≥ D``, a row of at least
    H·sh elements; Flux's single blocks pass V as such a view into their fused QKV and MLP projection, rows of
    21504 elements)."""
    sb, sh, sl = (x.stride(0), x.stride(1), x.stride(2)) if bhld else (x.stride(0), x.stride(2), x.stride(1))
    if x.stride(-1) != 1 or (sl * x.element_size()) % 16 or sl < D:
        return None
    one_batch = x.shape[0] == 1  # a size-1 dim's stride is anyone's (torch's views rewrite it)
    if (Hx == 1 or sh == Lx * sl) and (one_batch or sb == Hx * Lx * sl):
        return sl, (Hx * Lx, Lx, 0), D
    if D <= sh and Hx * sh <= sl and (one_batch or sb == Lx * sl):
        return sl, (Lx, 0, sh), (Hx - 1) * sh + D  # no column past the last head's
    return None


def kv_rows(k, v, head_dim: int, bhld: bool) -> bool:
    """Whether K and V, as a caller passes them ((B, H, L, D), or (B, L, H·D) with ``bhld`` False), each fold into
    rows as the TMA and Gluon paths read them (:func:`_row_fold`). Where they don't, exact mode has only the
    pointer-load kernel, while the 8-bit pre-pass makes its own copies (the Attention node's ``auto`` times such
    calls as a class of their own)."""
    for x in (k, v):
        if x.ndim == 4 and bhld:
            x4 = x
        elif x.ndim == 3 and not bhld and head_dim and x.shape[-1] % head_dim == 0:
            x4 = x.unflatten(-1, (x.shape[-1] // head_dim, head_dim))
        else:
            return False
        Hx, Lx = (x4.shape[1], x4.shape[2]) if bhld else (x4.shape[2], x4.shape[1])
        if _row_fold(x4, Hx, Lx, head_dim, bhld) is None:
            return False
    return True


def _tma_view2d(x, B, Hx, Lx, D, bhld):
    """(2-D view, (row per batch, row per head, column per head)) of one (B, H, L, D) operand for
    a TMA descriptor, or None where it does not fold into one 2-D array of 16-byte-aligned rows."""
    fold = None if x.data_ptr() % 16 else _row_fold(x, Hx, Lx, D, bhld)
    if fold is None:
        return None
    sl, coords, cols = fold
    return x.as_strided((B * coords[0], cols), (sl, 1)), coords


def _tma_view(k4, v4, B, Hk, Lk, D, bhld):
    """(2-D K view, 2-D V view, K's (row per batch, row per head, column per head), V's) for the TMA
    descriptors, or None where K or V does not fold into one 2-D array of 16-byte-aligned rows."""
    views = [_tma_view2d(x, B, Hk, Lk, D, bhld) for x in (k4, v4)]
    if None in views:
        return None
    return views[0][0], views[1][0], views[0][1], views[1][1]


def _launch(q, k, v, mask, heads, bhld, out_bhld, scale, int8, causal, cfg=None, out=None, pv="auto", arch=0):
    dev = q.device
    replay_key = None
    if (cfg is None and out is None and mask is None and dev.type == "cuda" and q.stride(-1) == 1
            and k.stride(-1) == 1 and v.stride(-1) == 1 and fast_launch.enabled()):
        replay_key = _replay_key(q, k, v, heads, bhld, out_bhld, scale, int8, causal, pv, arch)
        r = _REPLAYS.get(replay_key)
        if r is not None:
            o = _replay(r, q, k, v, heads, bhld)
            if o is not None:
                return o
    q4, B, H, Lq, D, sq = _split(q, heads, bhld)
    hk_guess = heads if bhld else (k.shape[-1] // D if D else heads)
    k4, Bk, Hk, Lk, Dk, sk = _split(k, hk_guess, bhld)
    v4, _, Hv, Lv, Dv, sv = _split(v, hk_guess, bhld)
    if Dk != D or Dv != D or Lv != Lk or Bk != B or Hv != Hk or H % Hk:
        raise ValueError("q, k, v shapes do not fit together")
    if D > MAX_HEAD_DIM:
        raise ValueError(f"head size {D} > {MAX_HEAD_DIM}")
    cc = _device_cc(dev)
    if arch and cc is not None:
        cc = min(cc, int(arch))  # the features and block configs of an older GPU (TRITONKIT_FORCE_ARCH)
    pv_modes = pv_modes_for(pv, cc, int8)
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

    tma_view = None
    q_view = v_view = None
    if int8:
        variants = pv_modes
        if attention_hopper.eligible(cc, q.dtype, D, kind != 0, causal) and not int64:
            # the Gluon 8-bit kernel beside the Triton one, with each P·V the call allows: 16-bit (V
            # read through TMA: only where V folds into a 2-D view) and fp8, timed like the Triton
            # kernel's (fp8 taken only FP8_PV_MARGIN faster). Its fp8 form led its 16-bit one by 4-13 %
            # at HunyuanVideo's and WAN's sequences on an H100 and an H200 and trailed it by 5-7 % at
            # Flux's (BENCHMARKS.md, twenty-seventh session); since the forty-second session's pre-pass it
            # leads at Flux's too, by 4.5-6.6 %: which wins is the GPU's, the shape's and the code's, for
            # one more compile in a cold first step
            v_view = _tma_view2d(v4, B, Hk, Lk, D, bhld) if align8 else None
            if 0 in pv_modes and v_view is not None:
                variants += (G8_HALF,)
            if 1 in pv_modes:
                variants += (G8_FP8,)
    else:
        gluon = attention_hopper.eligible(cc, q.dtype, D, kind != 0, causal)
        variants = tma_variants_for(cc, q.dtype, gluon)
        if variants != (TMA_OFF,):
            tma_view = _tma_view(k4, v4, B, Hk, Lk, D, bhld) if (align8 and not int64) else None
            if tma_view is None:
                variants = (TMA_OFF,)  # K / V do not fold into 16-byte-aligned 2-D views
        # Q through TMA too where K / V go that way and the head needs no padding (a padded Q tile
        # from a 2-D view would hold the next head's columns; Q's padding must be zeros)
        q_view = _tma_view2d(q4, B, H, Lq, D, bhld) if tma_view is not None and block_d == D else None
        if q_view is None and set(variants) & set(GLUON_VARIANTS):
            variants = tuple(v for v in variants if v not in GLUON_VARIANTS) or (TMA_ON,)

    # Every launch of this call specialises on what this key holds (runtime.launch's plan): a later call
    # with the same key and block config skips Triton's dispatch (kernels/fast_launch.py). CUDA, no mask.
    call_key = None
    if dev.type == "cuda" and m4 is None:
        call_key = (dev.index, q.dtype, B, H, Hk, Lq, Lk, D, sq, sk, sv, so, bhld, out_bhld, sm_scale, int8,
                    bool(causal), pv, cc, q4.data_ptr() % 16, k4.data_ptr() % 16, v4.data_ptr() % 16,
                    o.data_ptr() % 16)
    ctx = _Ctx(int8, B, H, Hk, Lq, Lk, D, block_d, sm_scale, sq, sk, sv, so, ms, kind, bool(causal), dot_f32,
               int64, align8, kern)
    views = (q4, k4, v4, v_view, tma_view, q_view)

    def run(c, o_out, warmup=False, light=False):
        _run(ctx, c, views, o_out, m4, warmup, None if call_key is None or o_out is not o else (call_key, c), light)

    if cfg is None:
        skey = settled = None
        if replay_key is not None and cc is not None:
            skey = config_key(cc, q.dtype, block_d, int8, kind, causal, Lq, Lk, variants, B * H, q_view is not None)
            settled = tuning.cache().get(skey)
        cfg = choose_config(dev, cc, q.dtype, block_d, int8, kind, causal, Lq, Lk, run, o, variants, B * H,
                            q_tma=q_view is not None, skey=skey)
        run(cfg, o)
        trials.end_call()  # where the config's playoff runs in the model's calls, this call is timed
        if settled is not None and settled == cfg:
            _remember(replay_key, _Replay(ctx, skey, settled, (call_key, settled), shape, o.data_ptr() % 16,
                                          q_view is not None))
        return o
    if len(cfg) == 4:
        cfg = tuple(cfg) + (variants[0],)  # an explicit block config runs the default variant
    elif (cfg[4] in (GLUON_VARIANTS if not int8 else (G8_HALF, G8_FP8))) and cfg[4] not in variants:
        raise ValueError("the Gluon kernel can't serve this call (it needs sm90, fp16 / bf16, head 64 or 128, "
                         "no mask, not causal, and Q / K / V foldable into 16-byte-aligned 2-D views)")
    run(cfg, o)
    return o


class _Ctx:
    """What a call's launches need besides its tensors: the scalars its shapes, strides, dtype and
    arguments give. It holds no tensor, so a stored call (:class:`_Replay`) keeps none alive."""
    __slots__ = ("int8", "B", "H", "Hk", "Lq", "Lk", "D", "block_d", "sm_scale", "sq", "sk", "sv", "so", "ms",
                 "kind", "causal", "dot_f32", "int64", "align8", "kern")

    def __init__(self, *values):
        for name, value in zip(self.__slots__, values):
            setattr(self, name, value)


def _run(x, c, views, o_out, m4, warmup=False, plan=None, light=False):
    """The launches of one call with config ``c`` = (BLOCK_M, BLOCK_N, num_warps, num_stages, variant):
    ``x`` its :class:`_Ctx`, ``views`` (q4, k4, v4, V's 2-D view, K / V's 2-D views, Q's 2-D view), the
    mask ``m4`` or None; with ``warmup`` compiled only; ``plan`` the launches' plan key (runtime.launch);
    with ``light`` the attention kernel runs only its grid's first program (the 8-bit pre-pass runs
    whole): a tuning's warm-up, which needs the kernel loaded and its launch path taken, not its GPU
    time (``o_out`` then holds one tile)."""
    q4, k4, v4, v_view, tma_view, q_view = views
    int8, B, H, Hk, Lq, Lk, D, block_d = x.int8, x.B, x.H, x.Hk, x.Lq, x.Lk, x.D, x.block_d
    sm_scale, sq, sk, sv, so, ms = x.sm_scale, x.sq, x.sk, x.sv, x.so, x.ms
    bm, bn, nw, ns, variant = c
    lk = launch_kernel if plan is None else functools.partial(launch_kernel, plan=plan)
    if int8 and variant in (G8_HALF, G8_FP8):
        fp8 = variant == G8_FP8
        qa, qs_, ka, ks_, vf, vsc = _prepare_8bit(q4, sq, k4, sk, v4, sv, B, H, Hk, Lq, Lk, D, block_d,
                                                  sm_scale * LOG2E, bn, fp8, warmup, perm_v=fp8, plan=plan)
        attention_hopper.launch8(qa, qs_, ka, ks_, vf if fp8 else v_view, vsc, o_out, so, B, H, Hk, Lq, Lk,
                                 D, c[:4], lk, warmup, light=light)
        return
    if not int8 and variant in GLUON_VARIANTS:
        attention_hopper.launch(q_view, tma_view, o_out, so, B, H, Hk, Lq, Lk, D, sm_scale, c[:4],
                                lk, warmup, ws=_GLUON_WS[variant], light=light)
        return
    pv_mode = variant if int8 else 0
    ws = not int8 and variant == TMA_WS
    va, sva, vs_ = v4, sv, None
    kd = vd = qd = o_out  # unused pointers unless TMA
    tma = vtma = qtma = (0, 0, 0)
    if not int8 and variant != TMA_OFF:
        from triton.tools.tensor_descriptor import TensorDescriptor
        k2, v2, tma, vtma = tma_view
        kd = TensorDescriptor.from_tensor(k2, [bn, block_d])
        vd = TensorDescriptor.from_tensor(v2, [bn, block_d])
        if q_view is not None:
            qd = TensorDescriptor.from_tensor(q_view[0], [bm, block_d])
            qtma = q_view[1]
    if int8:
        # the whole pre-pass runs per config (K's block scales follow BLOCK_N), so a timed
        # candidate costs what one call with it costs
        qa, qs_, ka, ks_, vf, vsc = _prepare_8bit(q4, sq, k4, sk, v4, sv, B, H, Hk, Lq, Lk, D, block_d,
                                                  sm_scale * LOG2E, bn, pv_mode == 1, warmup, plan=plan)
        if pv_mode == 1:
            va, sva, vs_ = vf, (vf.stride(0), vf.stride(1), vf.stride(2)), vsc
        sqa, ska = (qa.stride(0), qa.stride(1), qa.stride(2)), (ka.stride(0), ka.stride(1), ka.stride(2))
        qss, kss = (qs_.stride(0), qs_.stride(1)), (ks_.stride(0), ks_.stride(1))
    else:
        qa, ka, sqa, ska = q4, k4, sq, sk
        qs_ = ks_ = o_out  # unused pointers
        qss = kss = (0, 0)
    grid = (1,) if light else (cdiv(Lq, bm) * B * H,)
    launch_kernel(
        x.kern, grid, qa, ka, va, o_out, m4 if m4 is not None else o_out, qs_, ks_,
        vs_ if vs_ is not None else o_out, kd, vd, qd,
        sm_scale, Lq, Lk, H, H // Hk, *tma, *vtma, *qtma,
        sqa[0], sqa[1], sqa[2], ska[0], ska[1], ska[2], sva[0], sva[1], sva[2],
        so[0], so[1], so[2], ms[0], ms[1], ms[2], ms[3],
        qss[0], qss[1], kss[0], kss[1],
        HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=bm, BLOCK_N=bn,
        MASK_KIND=x.kind, IS_CAUSAL=x.causal, INT8=bool(int8), DOT_F32=x.dot_f32, INT64=x.int64,
        ALIGN8=x.align8, PV_MODE=pv_mode, USE_TMA=kd is not o_out, WARP_SPEC=ws, Q_TMA=qd is not o_out,
        num_warps=nw, num_stages=ns,
        warmup=warmup, plan=plan)


# ----------------------------------------------------------------------------- replay

# A call whose shape class has a settled config (every call of a model's step after its first) is stored
# here by everything its launches derive from (shapes, strides, dtype, 16-byte alignments, the call's
# arguments): the next such call re-derives only its tensors' views and launches, directly (runtime.launch's
# plan). The checks, the mask, the variants, the config key and the launch arguments of the first call stand
# for it. At SDXL's and Flux's sizes that was most of a call's 0.13-0.22 ms of host time on an H100 machine
# (2026-11-27), where SDPA's call takes 0.025-0.04 ms. CUDA, no mask, no ``out``, no explicit config;
# ``TRITONKIT_FAST_LAUNCH=0`` turns it off with the direct launches.
MAX_REPLAYS = 256
_REPLAYS: dict = {}
REPLAY_COUNTERS = {"replayed": 0, "stored": 0}


class _Replay:
    __slots__ = ("ctx", "skey", "cfg", "plan", "o_shape", "o_align", "q_tma")

    def __init__(self, ctx, skey, cfg, plan, o_shape, o_align, q_tma):
        self.ctx, self.skey, self.cfg, self.plan = ctx, skey, cfg, plan
        self.o_shape, self.o_align, self.q_tma = o_shape, o_align, q_tma


def _remember(key, r) -> None:
    if len(_REPLAYS) >= MAX_REPLAYS:
        _REPLAYS.clear()
    _REPLAYS[key] = r
    REPLAY_COUNTERS["stored"] += 1


def _replay_key(q, k, v, heads, bhld, out_bhld, scale, int8, causal, pv, arch):
    return (q.device.index, q.dtype, k.dtype, v.dtype, q.shape, q.stride(), k.shape, k.stride(), v.shape,
            v.stride(), q.data_ptr() % 16, k.data_ptr() % 16, v.data_ptr() % 16, heads, bhld, out_bhld, scale,
            int8, causal, pv, arch, os.environ.get(TMA_ENV))


def _replay(r, q, k, v, heads, bhld):
    """The output of a stored call's launches on these tensors, or None where the stored call no longer
    stands for them (its shape class's config changed): the caller then takes the full path."""
    if tuning.cache().get(r.skey) != r.cfg:
        return None
    x = r.ctx
    if bhld:
        q4, k4, v4 = q, k, v
    else:
        try:
            q4, k4, v4 = (t.view(x.B, t.shape[1], -1, x.D) for t in (q, k, v))
        except RuntimeError:  # strides that need a copy (as _split makes): the full path
            return None
    variant = r.cfg[4]
    v_view = tma_view = q_view = None
    if x.int8:
        if variant == G8_HALF:
            v_view = _tma_view2d(v4, x.B, x.Hk, x.Lk, x.D, bhld)
            if v_view is None:
                return None
    elif variant != TMA_OFF:
        tma_view = _tma_view(k4, v4, x.B, x.Hk, x.Lk, x.D, bhld)
        if r.q_tma:
            q_view = _tma_view2d(q4, x.B, x.H, x.Lq, x.D, bhld)
        if tma_view is None or (r.q_tma and q_view is None):
            return None
    o = torch.empty(r.o_shape, dtype=q.dtype, device=q.device)
    if o.data_ptr() % 16 != r.o_align:
        return None
    _run(x, r.cfg, (q4, k4, v4, v_view, tma_view, q_view), o, None, False, r.plan)
    REPLAY_COUNTERS["replayed"] += 1
    return o


def config_key(cc, dtype, block_d, int8, kind, causal, Lq, Lk, variants, bh, q_tma) -> str:
    """The tuning key of a call's block config (kernels/tuning.py): see :func:`choose_config`."""
    label = ("int8-pv" if int8 else "exact-v") + "".join(str(v) for v in variants)
    if not int8 and tuple(variants) != (TMA_OFF,) and not q_tma:
        label += "-kv"  # TMA for K / V only: its own candidates (_table)
    return (f"attn_config|{cc}|{dtype}|{block_d}|{label}|{kind}|{bool(causal)}|"
            f"{_pow2_bucket(Lq)}|{_pow2_bucket(Lk)}|bh{next_pow2(max(1, min(int(bh), 1024)))}")


def choose_config(dev, cc, dtype, block_d, int8, kind, causal, Lq, Lk, run=None, o=None, variants=(0,),
                  bh: int = 1, q_tma: bool = True, skey: str | None = None):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages, variant) for this call's tuning key: timed once
    per GPU on its first call over every variant's configs (compiled in parallel), then stored
    (kernels/tuning.py). fp8 P·V's time counts FP8_PV_MARGIN more (it is the less accurate one).
    The key holds the sequence lengths and batch × heads (``bh``), each as a power-of-two bucket:
    the grid's size decides between configs (a pick timed on 2 heads, 512 programs on 132 SMs, lost
    12 % at WAN's 40 heads on an H200, 2026-11-23). ``skey``: that key, where the caller made it already."""
    variants = tuple(variants)
    if cc is None:
        return CPU_CONFIG + (variants[0],)
    if skey is None:
        skey = config_key(cc, dtype, block_d, int8, kind, causal, Lq, Lk, variants, bh, q_tma)
    if run is not None:
        hit = tuning.cache().get(skey)  # every call after the first of its shape class
        if hit is not None:
            return hit
    cands = variant_candidates(cc, block_d, dtype.itemsize, int8, variants, q_tma)
    if run is None:
        return cands[0]
    weight = None
    if int8 and (1 in variants or G8_FP8 in variants) and len(variants) > 1:
        weight = lambda c: FP8_PV_MARGIN if c[4] in (1, G8_FP8) else 1.0  # noqa: E731
    return tuning.pick(dev, skey, cands, run=lambda c: run(c, o), warm=lambda c: run(c, o, warmup=True),
                       weight=weight, family=lambda c: c[4], in_model=True, light=lambda c: run(c, o, light=True))


# ----------------------------------------------------------------------------- custom op

def _attention_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                    heads: int, bhld: bool, out_bhld: bool, scale: float | None, int8: bool,
                    causal: bool, block_m: int, block_n: int, num_warps: int, num_stages: int,
                    pv: str = "auto", arch: int = 0) -> torch.Tensor:
    cfg = (block_m, block_n, num_warps, num_stages) if block_m > 0 else None
    with _interpreted_device_calls(q.device.type):
        return _launch(q, k, v, mask, heads, bhld, out_bhld, scale, int8, causal, cfg, pv=pv, arch=arch)


def _heads_first(q, k, v, heads, bhld):
    """q, k, v as (B, H, L, D), k and v repeated to q's heads (GQA): for the torch paths."""
    if bhld:
        qh, kh, vh = q, k, v
    else:
        B, Lq, HD = q.shape
        D = HD // heads
        qh = q.reshape(B, Lq, heads, D).transpose(1, 2)
        kh = k.reshape(B, k.shape[1], -1, D).transpose(1, 2)
        vh = v.reshape(B, v.shape[1], -1, D).transpose(1, 2)
    if kh.shape[1] != qh.shape[1]:
        r = qh.shape[1] // kh.shape[1]
        kh, vh = kh.repeat_interleave(r, dim=1), vh.repeat_interleave(r, dim=1)
    return qh, kh, vh


def _sdpa_interim(q, k, v, mask, heads, bhld, out_bhld, scale, causal):
    """The same call through torch's SDPA (what ComfyUI's attention runs), in the kernels' layouts and
    mask conventions (a fully masked row gives 0): a compiled graph's calls while their kernels compile."""
    qh, kh, vh = _heads_first(q, k, v, heads, bhld)
    m = mask
    if m is not None:
        while m.ndim < 4:
            m = m.unsqueeze(0)
        if m.dtype != torch.bool:
            m = m.to(qh.dtype)
        if causal:
            keep = torch.ones(qh.shape[2], kh.shape[2], dtype=torch.bool, device=q.device).tril()
            m = (m & keep) if m.dtype == torch.bool else m.masked_fill(~keep, float("-inf"))
    out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=m, is_causal=causal and m is None,
                                                           scale=scale)
    if m is not None:
        out = out.nan_to_num(0.0)
    if out_bhld:
        return out
    return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)


def _gated(q) -> bool:
    """Whether a custom-op call checks that its kernels are compiled first (CUDA, deferring calibration,
    not inside a CUDA graph capture)."""
    return q.device.type == "cuda" and calibration.deferring() and not torch.cuda.is_current_stream_capturing()


def _op_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
             heads: int, bhld: bool, out_bhld: bool, scale: float | None, int8: bool,
             causal: bool, block_m: int, block_n: int, num_warps: int, num_stages: int,
             pv: str = "auto", arch: int = 0) -> torch.Tensor:
    """The custom op: what a compiled graph runs. Where this call's kernels are not compiled yet
    (Triton's cache was empty when the graph was compiled with a stored choice), they compile in the
    background and the calls run torch's SDPA meanwhile (kernels/prepare.ready), as an eager call
    runs ComfyUI's attention while a stored choice's kernels compile; the key holds every shape and
    stride, which the kernels are specialised on."""
    args = (q, k, v, mask, heads, bhld, out_bhld, scale, int8, causal, block_m, block_n, num_warps, num_stages,
            pv, arch)
    key = ("attention", str(q.device), q.dtype, tuple(q.shape), q.stride(), tuple(k.shape), k.stride(),
           tuple(v.shape), v.stride(), None if mask is None else (mask.dtype, tuple(mask.shape), mask.stride()),
           heads, bhld, out_bhld, int8, causal, block_m, block_n, num_warps, num_stages, pv, arch)
    # a key known ready (every call after its first) skips the checks of the device and the settings
    if not prepare.known_ready(key) and _gated(q):
        if not prepare.ready(key, lambda: _attention_impl(*args)):
            calibration.log_once("op-interim", "TritonKit attention: a compiled graph runs attention kernels that "
                                 "are not compiled yet; they compile in the background and those calls run "
                                 "torch's SDPA until they are ready", level=logging.INFO)
            return _sdpa_interim(q, k, v, mask, heads, bhld, out_bhld, scale, causal)
    return _attention_impl(*args)


def _attention_fake(q, k, v, mask, heads, bhld, out_bhld, scale, int8, causal, block_m, block_n, num_warps,
                    num_stages, pv="auto", arch=0):
    if bhld:
        B, H, Lq, D = q.shape
    else:
        B, Lq, HD = q.shape
        H, D = heads, HD // heads
    shape = (B, H, Lq, D) if out_bhld else (B, Lq, H * D)
    return q.new_empty(shape)


# Defined once per process (runtime.op_exists): a second copy of the pack calls the first copy's op.
_OP_DEF = None
if not op_exists("attention"):
    try:
        _OP_DEF = torch.library.custom_op(f"{OP_NAMESPACE}::attention", mutates_args=())(_op_impl)
        _OP_DEF.register_fake(_attention_fake)
    except Exception as e:  # noqa: BLE001 - a torch without custom ops: compiled graphs trace the implementation
        calibration.log_once("op-define", f"TritonKit: the attention op could not be defined ({type(e).__name__}: "
                             f"{e}); torch.compile traces its implementation instead")
_attention_op = torch.ops.tritonkit.attention.default if op_exists("attention") else _op_impl


def attention(q, k, v, heads: int | None = None, *, mask=None, layout: str = "bld", out_layout: str | None = None,
              scale: float | None = None, mode: str = "exact", causal: bool = False, config=None, out=None,
              pv: str = "auto", arch: int | None = None):
    """Softmax attention of q, k, v.

    layout "bld": (B, L, H·D) with ``heads`` = H (k/v may have fewer heads: GQA);
    layout "bhld": (B, H, L, D) (``heads`` ignored). out_layout defaults to the input layout.
    mask: bool (True = keep) or additive float, broadcastable from (L_k), (L_q, L_k),
    (B, L_q, L_k) or (B, H, L_q, L_k). mode: "exact" or "int8". config: (BLOCK_M, BLOCK_N,
    num_warps, num_stages) to skip the choice (tests), with ``out`` also (..., variant): e.g.
    ``GLUON`` for kernels/attention_hopper.py's kernel. out: write into this tensor (eager only: it
    bypasses the custom op; tests poison it first). pv (8-bit mode's P·V): "auto" (fp8 e4m3 or the
    input dtype, whichever times faster on a GPU with fp8 MMA, sm89+: :func:`pv_modes_for`),
    "half" (input dtype), "fp8", or "f16acc"
    (opt-in: fp16 operands, fp16 accumulation within each key block; for GeForce Ampere/Ada).
    arch: a compute capability (86 for sm86) whose features and block configs the call keeps to
    (fp8 P·V from sm89, TMA from sm90), never above the device's own; None = the device's. The
    node passes TRITONKIT_FORCE_ARCH's, so a simulated RTX 3090 runs what an RTX 3090 would."""
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
    if config is not None and len(tuple(config)) not in (4, 5):
        raise ValueError("config must be (BLOCK_M, BLOCK_N, num_warps, num_stages), or with out= also a variant")
    if config is not None and len(tuple(config)) == 5 and out is None:
        # the custom op carries four ints: a variant would be dropped, and the default kernel run at a block
        # config it may not take (BLOCK_M 192 is the Gluon kernel's only)
        raise ValueError("a config with a variant (its fifth entry) needs out=: pass an output tensor, or the "
                         "four-entry config to run the default kernel")
    bm, bn, nw, ns = tuple(config)[:4] if config is not None else (0, 0, 0, 0)
    if out is not None:
        with _interpreted_device_calls(q.device.type):
            return _launch(q, k, v, mask, int(heads), bhld, out_bhld, None if scale is None else float(scale),
                           mode == "int8", bool(causal), tuple(config) if config is not None else None, out,
                           pv=pv, arch=int(arch or 0))
    op = _attention_op
    if eager_plain(q):
        # Eager calls on plain tensors run the implementation directly (runtime.eager_plain): no
        # dispatcher call.
        op = _attention_impl
    return op(q, k, v, mask, int(heads), bhld, out_bhld,
                         None if scale is None else float(scale), mode == "int8", bool(causal),
                         bm, bn, nw, ns, pv, int(arch or 0))


# ----------------------------------------------------------------------------- reference

def attention_reference(q, k, v, heads: int | None = None, *, mask=None, layout: str = "bld",
                        out_layout: str | None = None, scale: float | None = None, causal: bool = False,
                        dtype=torch.float64):
    """Plain softmax(q·kᵀ·scale + mask)·v in ``dtype`` (float64 by default); fully masked rows
    give 0. Same arguments as :func:`attention`."""
    qh, kh, vh = (x.to(dtype) for x in _heads_first(q, k, v, heads, layout == "bhld"))
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


def v_block_exponents(amax: torch.Tensor) -> torch.Tensor:
    """The fp8 V copy's scale exponents, as quant_qkv_kernel finds them: e = ceil(log2(amax / 448)) for
    each block's max |v| (the quotient rounded to fp32 first), at least V_EXP_MIN, as floats."""
    x = amax.float() * torch.tensor(1.0 / 448.0, dtype=torch.float32)
    m, k = torch.frexp(x)  # x = m · 2^k, m in [0.5, 1)
    e = torch.where(m == 0.5, k - 1, k)
    return torch.where(x > 0, e, V_EXP_MIN.value).clamp_min(V_EXP_MIN.value).float()


def attention_8bit_emulated(q, k, v, *, scale: float | None = None, block_n: int = 64, pv: str = "fp8"):
    """The 8-bit mode's arithmetic in plain torch, for (B, H, L, D) q, k, v without mask: smoothed
    K, int8 Q (per-row scales, softmax scale and log2(e) folded in) and K (per block of ``block_n``
    keys), int32-exact Q·K, online softmax over key blocks in fp32, and P·V either in fp8 e4m3
    (pv="fp8": P·448, and V over its scale per block of V_BLOCK keys (a power of two, :func:`v_block_exponents`)
    in e4m3,
    rounded as the hardware's cvt.rn.satfinite does) or in the inputs' dtype (pv="half"). It is the
    reference for what the kernel computes where the Triton interpreter cannot run it (fp8)."""
    B, H, L, D = q.shape
    sm = (scale if scale is not None else 1.0 / math.sqrt(D)) * LOG2E

    def rnd(x):
        return torch.where(x >= 0, torch.floor(x + 0.5), torch.ceil(x - 0.5))

    x = q.float() * sm
    sq = x.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 127.0
    qi = rnd(x / sq)
    Lk = k.shape[2]
    srows = (torch.arange(K_MEAN_ROWS.value) * Lk) // K_MEAN_ROWS.value
    kk = k.float() - k.float()[:, :, srows].mean(2, keepdim=True)
    nblk = (Lk + block_n - 1) // block_n
    kb = torch.nn.functional.pad(kk, (0, 0, 0, nblk * block_n - Lk)).view(B, H, nblk, block_n, D)
    sk = kb.abs().amax((-1, -2), keepdim=True).clamp_min(1e-30) / 127.0
    ki = rnd(kb / sk)
    if pv == "fp8":  # V dequantised: fp8 e4m3 of V / its block scale, times the scale
        vb_ = V_BLOCK.value
        n_vb = (Lk + vb_ - 1) // vb_
        vb = torch.nn.functional.pad(v.float(), (0, 0, 0, n_vb * vb_ - Lk)).view(B, H, n_vb, vb_, D)
        sv = torch.exp2(v_block_exponents(vb.abs().amax((-1, -2), keepdim=True)))
        vq = ((vb / sv).clamp(-448, 448).to(torch.float8_e4m3fn).float() * sv).view(B, H, -1, D)[:, :, :Lk]
    else:
        vq = v.float()
    m = torch.full((B, H, L), float("-inf"))
    li = torch.zeros(B, H, L)
    acc = torch.zeros(B, H, L, D)
    for j in range(nblk):
        lo, hi = j * block_n, min(Lk, (j + 1) * block_n)
        s_ = (qi @ ki[:, :, j, : hi - lo].transpose(-1, -2)) * sq * sk[:, :, j]
        m_new = torch.maximum(m, s_.amax(-1))
        p = torch.exp2(s_ - m_new[..., None])
        alpha = torch.exp2(m - m_new)
        li = li * alpha + p.sum(-1)
        if pv == "fp8":
            pq = (p * 448.0).to(torch.float8_e4m3fn).float()
        else:
            pq = p.to(v.dtype).float()
        acc = acc * alpha[..., None] + pq @ vq[:, :, lo:hi]
        m = m_new
    if pv == "fp8":
        return acc / (448.0 * li[..., None])
    return acc / li[..., None]


# ----------------------------------------------------------------------------- compile specs

def _attn_signature(in_ty: str, kv_in_ty: str, mask_ty: str, out_ty: str, tma_block=None, q_block=None):
    desc = f"tensordesc<{in_ty}[{tma_block[0]}, {tma_block[1]}]>" if tma_block else f"*{out_ty}"
    qdesc = f"tensordesc<{in_ty}[{q_block[0]}, {q_block[1]}]>" if q_block else f"*{out_ty}"
    sig = {"Q": f"*{in_ty}", "K": f"*{in_ty}", "V": f"*{kv_in_ty}", "O": f"*{out_ty}", "Mask": f"*{mask_ty}",
           "QS": "*fp32", "KS": "*fp32", "VS": "*fp32", "KD": desc, "VD": desc, "QD": qdesc, "qk_scale": "fp32"}
    for n in ("Lq", "Lk", "H", "KV_GROUP", "tma_rb", "tma_rh", "tma_ch", "tma_vrb", "tma_vrh", "tma_vch", "tma_qrb",
              "tma_qrh", "tma_qch"):
        sig[n] = "i32"
    for t in ("q", "k", "v", "o"):
        for d in ("b", "h", "l"):
            sig[f"stride_{t}{d}"] = "i32"
    for d in ("b", "h", "m", "n"):
        sig[f"stride_m{d}"] = "i32"
    for n in ("stride_qsb", "stride_qsh", "stride_ksb", "stride_ksh"):
        sig[n] = "i32"
    for n in ("HEAD_DIM", "BLOCK_D", "BLOCK_M", "BLOCK_N", "MASK_KIND", "IS_CAUSAL", "INT8", "DOT_F32", "INT64",
              "ALIGN8", "PV_MODE", "USE_TMA", "WARP_SPEC", "Q_TMA", "QK_OFFSET"):
        sig[n] = "constexpr"
    return sig


_TY = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
_FAMILY_ARCHS = {"sm75": (75,), "sm80": (80,), "sm86": (86, 89), "sm90": (90,), "sm120": (120,)}


def _spec(dtype, int8, head_dim, cfg, archs, mask_kind=0, causal=False, int64=False, align8=False, pv_mode=0,
          tma=False, ws=False):
    bm, bn, nw, ns = cfg
    ty = _TY[dtype]
    bd = block_d_for(head_dim)
    q_tma = tma and bd == head_dim  # the launcher loads Q through TMA where the head needs no padding
    sig = _attn_signature("i8" if int8 else ty, "fp8e4nv" if pv_mode == 1 else ty,
                          {0: "fp32", 1: "i1", 2: "fp32"}[mask_kind], ty, (bn, bd) if tma else None,
                          (bm, bd) if q_tma else None)
    consts = {"HEAD_DIM": head_dim, "BLOCK_D": bd, "BLOCK_M": bm, "BLOCK_N": bn,
              "MASK_KIND": mask_kind, "IS_CAUSAL": causal, "INT8": int8, "DOT_F32": False, "INT64": int64,
              "ALIGN8": align8, "PV_MODE": pv_mode, "USE_TMA": tma, "WARP_SPEC": ws, "Q_TMA": q_tma,
              "QK_OFFSET": True}
    return (attn_fwd_kernel, sig, consts, {"archs": tuple(archs), "num_warps": nw, "num_stages": ns})


def _prep_specs(ty, fp8_v, archs):
    """The 8-bit pre-pass kernel (quant_qkv_kernel) at a padded head (80 -> 128)."""
    opts = {"archs": tuple(archs), "num_warps": 4, "num_stages": 1}
    sig = {"Q": f"*{ty}", "K": f"*{ty}", "V": f"*{ty}", "QO": "*i8", "QS": "*fp32", "KO": "*i8", "KS": "*fp32",
           "VO": "*fp8e4nv" if fp8_v else "*i8", "VS": "*fp32"}
    for n in ("Lq", "Lk", "H", "HK", "NQ", "NK"):
        sig[n] = "i32"
    sig["q_mult"] = "fp32"
    sig.update({f"stride_{t}{d}": "i32" for t in "qkv" for d in "bhl"})
    for n in ("HEAD_DIM", "BLOCK_D", "BLOCK_LQ", "BLOCK_LK", "FP8_V", "INT64", "ALIGN8_Q", "ALIGN8_K", "ALIGN8_V",
              "PERM_V"):
        sig[n] = "constexpr"
    quant = (quant_qkv_kernel, sig, {"HEAD_DIM": 80, "BLOCK_D": 128, "BLOCK_LQ": 64, "BLOCK_LK": 64,
                                     "FP8_V": fp8_v, "INT64": fp8_v, "ALIGN8_Q": True, "ALIGN8_K": not fp8_v,
                                     "ALIGN8_V": fp8_v, "PERM_V": fp8_v}, opts)
    return [quant]


def _compile_specs():
    """(kernel, signature, constexprs, options), options = {"archs", "num_warps", "num_stages"}.

    Covers, on every arch, every compile-time branch of the kernels with the arch's default
    config: exact (fp16 on sm75, bf16 elsewhere) and int8 (sm80+) at head size 128; padded head
    sizes (40 -> 64 with fp32 inputs on sm80+ (fp16 on sm75), a bool mask and causal; 160 -> 256
    with int8 on sm80+, an additive mask and 64-bit offsets); the 8-bit pre-pass kernels, with and
    without the fp8 V copy. :func:`all_compile_specs` adds every other candidate block config
    (what the autotune may pick); CI compiles it when TRITONKIT_EXHAUSTIVE_COMPILE=1 (several
    minutes of ptxas on a CPU)."""
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
            specs.extend(_prep_specs(_TY[dt], False, archs))
            if cc < 90:
                # opt-in fp16-accumulate P·V, for GeForce Ampere / Ada (bf16 inputs: P and V go to fp16)
                specs.append(_spec(torch.bfloat16, True, 64, candidates(cc, 64, 2, True)[0], archs, pv_mode=2))
        if cc >= 90:
            # exact mode's opt-in TMA path (TRITONKIT_ATTN_TMA): the default config at 128, and a
            # padded head size with a bool mask, causal and the warp-specialisation request
            specs.append(_spec(dt, False, 128, candidates(cc, 128, 2, False)[0], archs, align8=True, tma=True))
            if cc == 90:
                specs.append(_spec(dt, False, 40, candidates(cc, 64, 2, False)[0], archs, mask_kind=1, causal=True,
                                   align8=True, tma=True, ws=True))
        fp8_archs = tuple(a for a in archs if fp8_pv_supported(a))
        if fp8_archs:
            # int8 Q·K + fp8 P·V: the default config at 128, a padded head size with a bool mask,
            # causal and 64-bit offsets, and the V quantisation
            c = fp8_archs[0]
            specs.append(_spec(dt, True, 128, candidates(c, 128, 2, "int8-fp8pv")[0], fp8_archs, pv_mode=1,
                               align8=True))
            specs.append(_spec(dt, True, 40, candidates(c, 64, 2, "int8-fp8pv")[0], fp8_archs, pv_mode=1,
                               mask_kind=1, causal=True, int64=True))
            specs.extend(_prep_specs(_TY[dt], True, fp8_archs))
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
                if any(fp8_pv_supported(a) for a in archs):
                    fa = tuple(a for a in archs if fp8_pv_supported(a))
                    for cfg in candidates(fa[0], bd, 2, "int8-fp8pv"):
                        specs.append(_spec(dtype, True, bd, cfg, fa, pv_mode=1))
                if cc >= 90:
                    for cfg in candidates(cc, bd, 2, "exact-tma"):
                        specs.append(_spec(dtype, False, bd, cfg, archs, align8=True, tma=True))
    return specs


COMPILE_SPECS = _compile_specs()
