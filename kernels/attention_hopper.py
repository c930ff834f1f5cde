"""Exact attention for Hopper (sm90) written in Gluon, Triton's lower-level language.

Why a second exact kernel: Triton's compiler does not keep a ``wgmma`` in flight across the
softmax. In the SASS of kernels/attention.py's loop it waits for every Q·Kᵀ and P·V right after
issuing it (``WARPGROUP.DEPBAR.LE gsb0, 0x0``; BENCHMARKS.md, tenth session), so each warpgroup's
tensor cores idle while it computes exponentials, and the best Triton config reached 0.77-0.92x
cuDNN on an H100. Gluon exposes the asynchronous MMA (``warpgroup_mma(..., is_async=True)`` and
``warpgroup_mma_wait(n)``), TMA, mbarriers and warp specialisation, so the overlap
FlashAttention-3 builds by hand can be written out. Three forms, each a variant the tuner times
(kernels/attention.py's ``GLUON``, ``GLUON_WS``, ``GLUON_PP``):

* ``attn_fwd_hopper`` (GLUON): the warps of a CTA do everything. K and V arrive through TMA into
  rings of ``K_STAGES`` / ``V_STAGES`` shared-memory tiles, each slot with its own mbarrier,
  refilled as soon as the MMA that read it has completed (K after its Q·Kᵀ, V after its P·V).
  Each iteration issues block j's Q·Kᵀ and block j-1's P·V back to back, waits for the Q·Kᵀ only
  (``warpgroup_mma_wait(1)``) and computes block j's softmax while the P·V still runs; then it
  waits for the P·V and rescales the accumulator. P stays in registers as the MMA's A operand; Q
  is loaded once and read by every Q·Kᵀ from shared memory. Its 4-warp, 64-row configs take
  74-82 KB of shared memory, so two CTAs share an SM.
* ``attn_fwd_hopper_ws`` (GLUON_WS): warp-specialised (``gl.warp_specialize``). A producer warp
  issues every TMA load, waiting on "empty" mbarriers that the consumers arrive on once their MMA
  has read a slot; BLOCK_M / 64 consumer warpgroups (two at BLOCK_M 128, one Q tile each) run the
  loop above on "full" mbarriers with no CTA-wide barrier, so they drift apart and one's softmax
  overlaps the other's MMAs. ``setmaxnreg`` moves registers from the producer (40) to the
  consumers (232). Each consumer rescales its accumulator after issuing the next Q·Kᵀ, while the
  tensor cores run it, not between the softmax and that issue (FlashAttention-3's order; 1-6 % at
  head 128 on an H100 and an H200, BENCHMARKS.md, thirty-ninth session), and stores a tile's 64 rows
  through a shared-memory buffer and one TMA store that it does not wait for (st.global from the
  accumulator's registers held it about 1 µs at the end of a Flux tile).
* The same with ``PINGPONG`` (GLUON_PP): the two consumers take turns issuing their MMAs (two more
  mbarriers), FlashAttention-3's schedule, instead of leaving the overlap to the warp scheduler.

* ``attn_fwd_hopper_ws8`` (8-bit mode's ``G8_HALF`` / ``G8_FP8``): the warp-specialised schedule over
  kernels/attention.py's 8-bit pre-pass: int8 Q·K on the tensor cores (s32 accumulation, rescaled by Q's
  row and K's block scales), P·V in the input dtype or in fp8 e4m3 (P × 448 against the transposed fp8 V
  copy, one power-of-two scale per V_BLOCK keys, each key block summed by the MMA and the blocks in fp32
  registers, rescaled from one V scale to the next with the softmax's alpha) —
  the Triton 8-bit kernel's arithmetic, so the same accuracy. The softmax is this kernel's limit, not
  the MMAs, so its per-score work is cut to a max, one FMA, the exponential and a sum: the int32 scores
  are floats as the MMA leaves them (it accumulates onto 1.5·2^23's bits, ``_int_scores``), the row's
  scale goes into the FMA and fp8's × 448 into the exponent. P reaches the fp8 MMA with its keys
  relabelled instead of shuffled between threads (``_p_operand``; the pre-pass stores Vᵀ in the same
  order). fp8 P is converted four values a register (``_fp8x4``) in the iteration that issues its MMA,
  beside the next block's Q·Kᵀ (the fp8 form's loop is rotated for that). Both P·V forms are timed where
  the call allows them; on an H100 and an H200 fp8 led at 16k-33k keys and trailed at Flux's 4.6k
  (BENCHMARKS.md, twenty-seventh session).

The plain form's program is one BLOCK_M-row tile of one (batch, head). The warp-specialised forms are
persistent: at most a program an SM, each taking every grid-th tile (a head's tiles neighbours, so the
programs running at once share its K / V in L2), with two Q buffers, so that the next tile's Q arrives while
the consumers still work on this one, and K / V ring slots that count on across tiles. On an H100 a tile
paid about 2.5 µs beyond its key blocks for its Q's first load, its CTA's setup and launch (globaltimer /
clock64 stamps per program, BENCHMARKS.md, thirty-sixth session); persistence took 1-3 % off Flux's and
SDXL's calls. Where the tiles leave the last wave part-filled (TRITONKIT_STREAM_K=0 turns this off), its
tiles' key blocks are shared out over every SM instead (stream-K, kernels/attention_streamk.py): a program's
whole tiles, then up to two segments of the last tiles, whose unnormalised outputs a fixup launch merges.

Scope: sm90, fp16 / bf16, head 64 or 128 (no padding), no mask, not causal, any L_q / L_kv, GQA,
both layouts, Q / K / V foldable into 2-D TMA views (kernels/attention.py's ``_tma_view2d``). A
key block past L_kv is masked to -inf in its scores; rows past L_q are computed but not stored
(TMA fills past the end of the tensor with zeros, and a 2-D view's rows past one head's L are
another head's finite values). kernels/attention.py's launcher offers the three forms to the tuner
where :func:`eligible` holds and the views fold; everything else keeps the Triton kernel. The
reference is kernels/attention.py's ``attention_reference``; bench/attention_hopper.py times every
form and config against SDPA's cuDNN and FA2 backends.
"""
from __future__ import annotations

import functools
import inspect
import os

import torch
import triton.language as tl

from . import attention_streamk as SK

try:  # Gluon's Hopper API (Triton 3.5+; gluon_available() wants 3.6's); the kernels are defined on first use (_build)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                 warpgroup_mma_wait)
except Exception:  # noqa: BLE001 - an older Triton, or a build without it: gluon_available() is False
    gluon = gl = fence_async_shared = mbarrier = tma = warpgroup_mma = warpgroup_mma_wait = None

LOG2E = 1.4426950408889634
HEADS = (64, 128)
# keys a scale of the 8-bit pre-pass's fp8 V copy covers (kernels/attention.py's pre-pass and Triton kernel
# take it from here); every fp8 P·V config's BLOCK_N divides it
V_BLOCK = tl.constexpr(128)

# (BLOCK_M, BLOCK_N, num_warps, stages) per head size; K and V have a ring of ``stages`` tiles each.
# BLOCK_M is 64 rows a warpgroup. Kept: the configs that led their kernel form on an H100
# (bench/attention_hopper.py, 2026-11-26, BENCHMARKS.md): 4 warps and 64 rows, whose 74-82 KB of
# shared memory let two CTAs share an SM (one's softmax beside the other's MMAs).
CANDIDATES = {
    128: [(64, 128, 4, 1)],
    64: [(64, 128, 4, 2), (64, 128, 4, 3)],
}
# The warp-specialised kernel (with or without the ping-pong): BLOCK_M / 64 consumer warpgroups
# (num_warps is always 4, the default partition), one producer warp, K and V rings of ``stages``.
# Head 64 also with three consumers (BLOCK_M 192, not for the ping-pong), as FlashAttention-3 runs it: at
# SDXL's shape on an H100 0.977-0.993× cuDNN against 0.970-0.976 with two (medians of two interleaved runs,
# spreads overlapping; BENCHMARKS.md, thirty-seventh session), so a candidate the tuning times, not a default.
CANDIDATES_WS = {
    128: [(128, 128, 4, 2)],
    64: [(128, 128, 4, 3), (192, 128, 4, 2)],
}


# The 8-bit kernel (always warp-specialised): 16-bit P·V with 128-key blocks; fp8 P·V with 128-key
# blocks too: 64-key blocks avoid its 236 bytes of spills at head 128 (the per-block fp8 sums are one
# more accumulator) but timed 12-18 % slower than them on an H200.
# Head 64 with 16-bit P·V also with three consumers (BLOCK_M 192, the exact kernel's registers): its key loop
# ran 181 µs against 197 with two at SDXL's shape on an H200 (kernel time, BENCHMARKS.md, forty-third session),
# though ptxas spills 16-24 bytes a thread at its 160 registers (SPILLS8_ALLOWED); with fp8 P·V (64 bytes) it was
# no faster, and with 64-key blocks (no spills) 10 % slower.
CANDIDATES8 = {
    (128, True): [(128, 128, 4, 2)],
    (64, True): [(128, 128, 4, 2)],
    (128, False): [(128, 128, 4, 2)],
    (64, False): [(128, 128, 4, 3), (192, 128, 4, 2)],
}
# bytes a consumer thread may spill, by (head, fp8 P·V, BLOCK_M): the tests hold every other candidate to none
SPILLS8_ALLOWED = {(64, False, 192): 32}


def candidates8(head_dim: int, fp8_pv: bool) -> list:
    """(BLOCK_M, BLOCK_N, num_warps, stages) of the 8-bit kernel at this head size and P·V."""
    return list(CANDIDATES8[(head_dim, bool(fp8_pv))])


def smem_bytes(cfg, head_dim: int, in_bytes: int = 2) -> int:
    bm, bn, _, stages = cfg
    ks, vs = stages if isinstance(stages, (tuple, list)) else (stages, stages)
    return (bm + (ks + vs) * bn) * head_dim * in_bytes


def candidates(head_dim: int, ws: bool = False) -> list:
    """(BLOCK_M, BLOCK_N, num_warps, stages) to time at this head size (K and V rings of ``stages``
    tiles each); with ``ws`` the warp-specialised kernel's (BLOCK_M / 64 consumer warpgroups)."""
    cands = (CANDIDATES_WS if ws else CANDIDATES)[head_dim]
    if ws == "pp":  # the ping-pong is between two consumer warpgroups
        cands = [c for c in cands if c[0] == 128]
    return list(cands)


@functools.lru_cache(maxsize=None)
def gluon_available() -> bool:
    """The installed Triton has the Gluon API these kernels are written against (Triton 3.6+): Hopper's
    host-side descriptor and ``gl.warp_specialize`` taking (function, args) pairs. Triton 3.5's Gluon has
    the older ``warp_specialize(default_args, default_partition, worker_args, ...)``, which every
    warp-specialised form failed to compile against (tests/triton_versions.py)."""
    if gl is None:
        return False
    try:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401
        return "functions_and_args" in inspect.signature(gl.warp_specialize).parameters
    except Exception:  # noqa: BLE001 - a build lacking the host-side descriptor or warp_specialize
        return False


def eligible(cc, dtype, head_dim: int, masked: bool, causal: bool) -> bool:
    """This kernel can serve the call (the TMA views are the launcher's own check)."""
    return (cc == 90 and dtype in (torch.float16, torch.bfloat16) and head_dim in HEADS
            and not masked and not causal and gluon_available())


_KERNELS = None  # what _build() returns, in KERNEL_NAMES' order
# The kernels' names, which are also the module's attributes once built (:func:`__getattr__`): kernels/compile_pool.py's
# workers find a kernel by its module and name, so the Gluon kernels compile there, not in a thread of ComfyUI's
# process, whose GIL the compile would hold while the model's steps and the calibration's timings wait for it
KERNEL_NAMES = ("attn_fwd_hopper", "attn_fwd_hopper_ws", "attn_fwd_hopper_ws8")
# setmaxnreg requests of the warp-specialised kernel's worker partitions (a multiple of 8, 24-256)
WS_CONSUMER_REGS = 232
WS_PRODUCER_REGS = 40
# the 8-bit kernel's consumers hold one more accumulator (fp8 P·V's per-block sums)
WS8_CONSUMER_REGS = 240
WS8_PRODUCER_REGS = 24
# three consumer warpgroups (BLOCK_M 192, exact at head 64, as FlashAttention-3 runs head 64): 416 threads share
# the SM's 64 K registers: 160 a worker consumer thread and 24 for the producer warp (no spills; 152 and 168
# spill)
WS3_CONSUMER_REGS = 160
WS3_PRODUCER_REGS = 24


def ws_regs(block_m: int):
    """(consumer, producer) setmaxnreg requests of the exact warp-specialised kernel at this BLOCK_M."""
    return (WS3_CONSUMER_REGS, WS3_PRODUCER_REGS) if block_m == 192 else (WS_CONSUMER_REGS, WS_PRODUCER_REGS)


def ws8_regs(block_m: int):
    """(consumer, producer) setmaxnreg requests of the 8-bit kernel at this BLOCK_M (three consumers share the
    registers as in the exact kernel)."""
    return (WS3_CONSUMER_REGS, WS3_PRODUCER_REGS) if block_m == 192 else (WS8_CONSUMER_REGS, WS8_PRODUCER_REGS)


def _build():
    """The Gluon kernel, defined on first use: importing Gluon costs nothing elsewhere, and a Triton
    without it never reaches here (:func:`eligible`)."""

    @gluon.jit
    def _load(desc, row, col, bars, smem, stage, pred):
        bar = bars.index(stage)
        mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(desc, [row, col], bar, smem.index(stage), pred=pred)

    @gluon.jit
    def _row_tree(s, SUM: gl.constexpr):
        """The rows' max, or with SUM their sum, as a tree: the two halves of a thread's columns
        combined, then the halves of that, down to 8 columns (the MMA layout's lanes hold bits 1-2 of a
        column) for gl.max / gl.sum's shuffles. Those alone combine a thread's 2·N/8 values in one
        chain (N/4 - 1 dependent FMNMX or FADD)."""
        M: gl.constexpr = s.shape[0]
        N: gl.constexpr = s.shape[1]
        x = s
        for i in gl.static_range(N.bit_length() - 4):
            y = gl.reshape(x, [M, 2, N >> (i + 1)])
            if SUM:
                x = gl.sum(y, 1)
            else:
                x = gl.max(y, 1)
        if SUM:
            r = gl.sum(x, 1)
        else:
            r = gl.max(x, 1)
        return gl.convert_layout(r, gl.SliceLayout(1, s.type.layout), assert_trivial=True)

    @gluon.jit
    def _softmax(s, j, m_i, l_i, qk_scale, Lk, BLOCK_N: gl.constexpr, s_layout: gl.constexpr,
                 P_LOG2: gl.constexpr = 0.0, ROW_SCALE: gl.constexpr = False, S_OFF: gl.constexpr = 0.0,
                 TREE: gl.constexpr = False, TREE_SUM: gl.constexpr = False):
        """Block j's online softmax: P = 2^((s - S_OFF)·qk_scale - m) · 2^P_LOG2 (a factor the fp8 P·V
        wants, for free in the exponent; the row sums ``l_i`` carry it too), the rescale factor
        ``alpha`` of the blocks before, the new row max and sums. ``qk_scale``: a scalar, or with
        ROW_SCALE one a row. S_OFF: an offset the scores carry (_int_scores), taken out per row."""
        if (j + 1) * BLOCK_N > Lk:  # the last key block, past L_kv: those scores -inf
            offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            s = gl.where(gl.expand_dims(offs_n < Lk, 0), s, float("-inf"))
        if TREE:  # (the fp8 P·V form: 1-4 % faster at Flux and HunyuanVideo; the other forms were not)
            s_max = _row_tree(s, False)
        else:
            s_max = gl.max(s, 1)
        m_new = gl.maximum(m_i, (s_max - S_OFF) * qk_scale)
        alpha = gl.exp2(m_i - m_new)
        if ROW_SCALE:  # one scale a row (8-bit), folded into the FMA below
            p = gl.exp2(s * gl.expand_dims(qk_scale, 1) - gl.expand_dims(m_new + S_OFF * qk_scale - P_LOG2, 1))
        else:
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_new - P_LOG2, 1))
        if TREE_SUM:  # (8-bit: 0-4 % faster at Flux and HunyuanVideo; exact: up to 5.5 % slower with it)
            l_i = l_i * alpha + _row_tree(p, True)
        else:
            l_i = l_i * alpha + gl.sum(p, 1)
        return p, alpha, m_new, l_i

    @gluon.jit
    def _after_issue(x):
        """``x``, through a move the compiler keeps after the MMAs issued before it (asm with side
        effects is not reordered with the MMAs' own): what is computed from it stays after them."""
        return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=False, pack=1)

    @gluon.jit
    def _int_scores(s):
        """The int8 Q·K's int32 scores as fp32 s + 1.5·2^23, exactly, by no instruction: the MMA adds
        them to an accumulator that starts at 0x4B400000, 1.5·2^23's bits (``_ws_tile``), and
        |Q·K| < 2^22 (int8 of at most 127 over up to 256 channels) keeps the sum a float of that binade
        whose last bits are the score. The offset (INT_OFF) is taken out per row in the softmax's FMA.
        (An integer add a score after the MMA put 64 instructions a thread between the Q·Kᵀ wait and the
        row max; I2F costs more.)"""
        return s.to(gl.float32, bitcast=True)

    @gluon.jit
    def attn_fwd_hopper(QD, KD, VD, O, qk_scale, Lq, Lk, H, KV_GROUP,
                        q_rb, q_rh, q_ch, k_rb, k_rh, k_ch, v_rb, v_rh, v_ch, stride_ob, stride_oh, stride_ol,
                        HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        K_STAGES: gl.constexpr, V_STAGES: gl.constexpr, num_warps: gl.constexpr):
        dtype: gl.constexpr = QD.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, HEAD_D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        gl.static_assert(num_warps == 4, "one warpgroup: its MMA waits cover the whole CTA before a refill")

        n_m = gl.cdiv(Lq, BLOCK_M)
        pid = gl.program_id(0)
        mb = pid % n_m  # row tiles of one head are neighbours in launch order: they share K / V in L2
        bh = pid // n_m
        b = bh // H
        h = bh % H
        hk = h // KV_GROUP
        q_row = b * q_rb + h * q_rh + mb * BLOCK_M
        k_row = b * k_rb + hk * k_rh
        k_col = hk * k_ch
        v_row = b * v_rb + hk * v_rh
        v_col = hk * v_ch
        n_blocks = gl.cdiv(Lk, BLOCK_N)

        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_D], QD.layout)
        k_smem = gl.allocate_shared_memory(dtype, [K_STAGES, BLOCK_N, HEAD_D], KD.layout)
        v_smem = gl.allocate_shared_memory(dtype, [V_STAGES, BLOCK_N, HEAD_D], VD.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bars = gl.allocate_shared_memory(gl.int64, [K_STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(K_STAGES):
            mbarrier.init(k_bars.index(i), count=1)
        for i in gl.static_range(V_STAGES):
            mbarrier.init(v_bars.index(i), count=1)

        mbarrier.expect(q_bar, QD.block_type.nbytes)
        tma.async_copy_global_to_shared(QD, [q_row, h * q_ch], q_bar, q_smem)
        for i in gl.static_range(K_STAGES):
            _load(KD, k_row + i * BLOCK_N, k_col, k_bars, k_smem, i, i < n_blocks)
        for i in gl.static_range(V_STAGES):
            _load(VD, v_row + i * BLOCK_N, v_col, v_bars, v_smem, i, i < n_blocks)

        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
        acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)

        # key block 0: its scores alone, nothing to overlap them with yet
        mbarrier.wait(q_bar, 0)
        mbarrier.wait(k_bars.index(0), 0)
        tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(tok,))
        _load(KD, k_row + K_STAGES * BLOCK_N, k_col, k_bars, k_smem, 0, K_STAGES < n_blocks)
        p, alpha, m_i, l_i = _softmax(s, 0, m_i, l_i, qk_scale, Lk, BLOCK_N, s_layout)
        p_op = gl.convert_layout(p.to(dtype), p_layout)

        for j in range(1, n_blocks):
            ks = j % K_STAGES
            vs = (j - 1) % V_STAGES
            mbarrier.wait(k_bars.index(ks), (j // K_STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(ks).permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            mbarrier.wait(v_bars.index(vs), ((j - 1) // V_STAGES) & 1)
            o_tok = warpgroup_mma(p_op, v_smem.index(vs), acc, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s_tok,))  # block j's scores; block j-1's P·V runs on
            _load(KD, k_row + (j + K_STAGES) * BLOCK_N, k_col, k_bars, k_smem, ks, j + K_STAGES < n_blocks)
            p, alpha, m_i, l_i = _softmax(s, j, m_i, l_i, qk_scale, Lk, BLOCK_N, s_layout)
            acc = warpgroup_mma_wait(0, deps=(o_tok,))
            _load(VD, v_row + (j - 1 + V_STAGES) * BLOCK_N, v_col, v_bars, v_smem, vs,
                  j - 1 + V_STAGES < n_blocks)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            p_op = gl.convert_layout(p.to(dtype), p_layout)

        vs_last = (n_blocks - 1) % V_STAGES
        mbarrier.wait(v_bars.index(vs_last), ((n_blocks - 1) // V_STAGES) & 1)
        o_tok = warpgroup_mma(p_op, v_smem.index(vs_last), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(o_tok,))

        mbarrier.invalidate(q_bar)
        for i in gl.static_range(K_STAGES):
            mbarrier.invalidate(k_bars.index(i))
        for i in gl.static_range(V_STAGES):
            mbarrier.invalidate(v_bars.index(i))

        acc = acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)
        offs_m = mb * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_o)
        offs_d = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, o_layout))
        base = O + b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
        ptrs = base + gl.expand_dims(offs_m.to(gl.int64) * stride_ol, 1) + gl.expand_dims(offs_d, 0)
        gl.store(ptrs, acc.to(O.dtype.element_ty), mask=gl.expand_dims(offs_m < Lq, 1))

    # ---- warp-specialised: a producer warp issues the TMA loads, 1-2 consumer warpgroups compute

    @gluon.jit
    def _tile(t, n_m, H, KV_GROUP):
        """Tile t's (query block, batch·head, batch, head, K/V head): a head's query blocks are
        neighbours in tile order, so the programs running at once share its K / V in L2."""
        bh = t // n_m
        h = bh % H
        return t % n_m, bh, bh // H, h, h // KV_GROUP

    @gluon.jit
    def _ws_schedule(q_smem, k_smem, Lq, Lk, n_dp, sk_units):
        """(query blocks a head, key blocks, program, grid, the program's whole tiles, its items): a
        warp-specialised program's items are its whole tiles, program + it · grid < n_dp, then its
        stream-K segments of the last tiles' ``sk_units`` key blocks (kernels/attention_streamk.py), the
        same in both partitions."""
        BLOCK_M: gl.constexpr = 64 * (q_smem.shape[0] // 2)
        BLOCK_N: gl.constexpr = k_smem.shape[1]
        n_blocks = gl.cdiv(Lk, BLOCK_N)
        pid = gl.program_id(0)
        grid = gl.num_programs(0)
        n_mine = gl.cdiv(n_dp - pid, grid)
        u0 = pid * sk_units // grid
        u1 = (pid + 1) * sk_units // grid
        n_seg = gl.where(u1 > u0, (u1 - 1) // n_blocks - u0 // n_blocks + 1, 0)
        return gl.cdiv(Lq, BLOCK_M), n_blocks, pid, grid, n_mine, n_mine + n_seg

    @gluon.jit
    def _ws_item(it, n_mine, pid, grid, n_dp, sk_units, n_blocks):
        """Item ``it`` of the program: (tile, first key block, key blocks, K / V blocks of the program's
        items before it, workspace slot): a whole tile (slot -1) or a stream-K segment of a last tile,
        whose unnormalised output goes to slot 2 · program + segment."""
        sg = it - n_mine
        u0 = pid * sk_units // grid
        u1 = (pid + 1) * sk_units // grid
        ta = u0 // n_blocks + sg  # the segment's tile among the last ones
        start = gl.maximum(u0, ta * n_blocks)
        end = gl.minimum(u1, (ta + 1) * n_blocks)
        whole = it < n_mine
        tile = gl.where(whole, pid + it * grid, n_dp + ta)
        j0 = gl.where(whole, 0, start - ta * n_blocks)
        n_j = gl.where(whole, n_blocks, end - start)
        g0 = gl.where(whole, it * n_blocks, n_mine * n_blocks + start - u0)
        return tile, j0, n_j, g0, gl.where(whole, -1, 2 * pid + sg)

    @gluon.jit
    def _ws_producer(QD, KD, VD, q_smem, k_smem, v_smem, q_bars, q_empty, k_full, v_full, k_empty, v_empty,
                     Lq, Lk, H, KV_GROUP, n_dp, sk_units, q_rb, q_rh, q_ch, k_rb, k_rh, k_ch, v_rb, v_rh, v_ch):
        """The producer warp, over the program's items (_ws_schedule, _ws_item). A tile's Q
        goes into one of two Q buffers, so the next tile's Q arrives while the consumers still work on
        this one; K and V run through the rings, whose slots count on across tiles. Block j's V tile
        sits at [V row + j·BLOCK_N, V column], or, for the 8-bit form's transposed fp8 V (channels ×
        keys), at [V row, V column + j·BLOCK_N]."""
        # constexprs don't cross into a partition: read them off the buffers' shapes
        NUM_C: gl.constexpr = q_smem.shape[0] // 2
        STAGES: gl.constexpr = k_smem.shape[0]
        BLOCK_N: gl.constexpr = k_smem.shape[1]
        BLOCK_M: gl.constexpr = 64 * NUM_C
        n_m, n_blocks, pid, grid, n_mine, n_items = _ws_schedule(q_smem, k_smem, Lq, Lk, n_dp, sk_units)
        for it in range(0, n_items):  # the program's it-th item: Q buffer it % 2
            t, j0, n_j, g0, slot = _ws_item(it, n_mine, pid, grid, n_dp, sk_units, n_blocks)
            mb, bh, b, h, hk = _tile(t, n_m, H, KV_GROUP)
            qb = it % 2
            # the buffer held tile it - 2's Q: wait until both consumers have begun tile it - 1
            mbarrier.wait(q_empty.index(qb), ((it - 1) // 2) & 1, pred=it >= 1)
            q_row = b * q_rb + h * q_rh + mb * BLOCK_M
            for c in gl.static_range(NUM_C):
                mbarrier.expect(q_bars.index(qb * NUM_C + c), QD.block_type.nbytes)
                tma.async_copy_global_to_shared(QD, [q_row + c * 64, h * q_ch], q_bars.index(qb * NUM_C + c),
                                                q_smem.index(qb * NUM_C + c))
            k_row = b * k_rb + hk * k_rh
            v_row = b * v_rb + hk * v_rh
            for jj in range(n_j):
                j = j0 + jj
                g = g0 + jj  # K / V blocks loaded before this one: ring slot g % STAGES
                st = g % STAGES
                again = g >= STAGES  # the slot held block g - STAGES: wait until every consumer released it
                ph = ((g // STAGES) + 1) & 1
                mbarrier.wait(k_empty.index(st), ph, pred=again)
                mbarrier.expect(k_full.index(st), KD.block_type.nbytes)
                tma.async_copy_global_to_shared(KD, [k_row + j * BLOCK_N, hk * k_ch], k_full.index(st),
                                                k_smem.index(st))
                mbarrier.wait(v_empty.index(st), ph, pred=again)
                mbarrier.expect(v_full.index(st), VD.block_type.nbytes)
                if v_smem.dtype == gl.float8e4nv:
                    tma.async_copy_global_to_shared(VD, [v_row, hk * v_ch + j * BLOCK_N], v_full.index(st),
                                                    v_smem.index(st))
                else:
                    tma.async_copy_global_to_shared(VD, [v_row + j * BLOCK_N, hk * v_ch], v_full.index(st),
                                                    v_smem.index(st))

    @gluon.jit
    def _my_turn(turn, c: gl.constexpr, k):
        """Ping-pong (two consumers, ``turn`` holds two barriers): before issuing its MMAs of turn k,
        consumer 1 waits until consumer 0 has issued its own of turn k, and consumer 0 (from turn 1)
        until consumer 1 has issued those of turn k - 1. The tensor cores then run one warpgroup's
        MMAs while the other computes its softmax (FlashAttention-3's schedule)."""
        if turn.shape[0] == 2:
            if c == 0:
                mbarrier.wait(turn.index(0), (k - 1) & 1, pred=k > 0)
            else:
                mbarrier.wait(turn.index(1), k & 1)

    @gluon.jit
    def _pass_turn(turn, c: gl.constexpr):
        if turn.shape[0] == 2:
            mbarrier.arrive(turn.index(1 - c))

    @gluon.jit
    def _ws_setup(QD, KD, VD, OD, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  PINGPONG: gl.constexpr, O_TMA: gl.constexpr):
        """A warp-specialised program's buffers: two Q buffers of a tile a consumer each (this tile's
        and the next one's) with their full barriers and an empty one a buffer, the K / V rings with
        their full and empty mbarriers (the empty ones released by every consumer), the ping-pong's
        turn barriers, and with O_TMA an output tile a consumer (``OD``'s block, in O's dtype)."""
        NUM_C: gl.constexpr = BLOCK_M // 64
        HEAD_D: gl.constexpr = QD.block_type.shape[1]
        q_smem = gl.allocate_shared_memory(QD.dtype, [2 * NUM_C, 64, HEAD_D], QD.layout)
        k_smem = gl.allocate_shared_memory(KD.dtype, [STAGES, BLOCK_N, HEAD_D], KD.layout)
        v_smem = gl.allocate_shared_memory(VD.dtype, [STAGES] + VD.block_type.shape, VD.layout)
        q_bars = gl.allocate_shared_memory(gl.int64, [2 * NUM_C, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        N_TURN: gl.constexpr = 2 if (PINGPONG and NUM_C == 2) else 1
        turn = gl.allocate_shared_memory(gl.int64, [N_TURN, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(N_TURN):
            mbarrier.init(turn.index(i), count=1)
        for i in gl.static_range(2 * NUM_C):
            mbarrier.init(q_bars.index(i), count=1)
        for i in gl.static_range(2):
            mbarrier.init(q_empty.index(i), count=NUM_C)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_full.index(i), count=1)
            mbarrier.init(v_full.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=NUM_C)
            mbarrier.init(v_empty.index(i), count=NUM_C)
        if O_TMA:  # a consumer's output tile, stored from here by TMA (_ws_tile)
            o_smem = gl.allocate_shared_memory(OD.dtype, [NUM_C, 64, HEAD_D], OD.layout)
        else:
            o_smem = q_smem  # never used
        return q_smem, k_smem, v_smem, q_bars, q_empty, k_full, v_full, k_empty, v_empty, turn, o_smem

    @gluon.jit
    def _ws_run(cons, prod, NUM_C: gl.constexpr, REGS_C: gl.constexpr, REGS_P: gl.constexpr):
        """The warp-specialised kernels' partitions: NUM_C consumer warpgroups (the first is the default
        partition) on ``cons``, the producer warp on ``prod``, with their setmaxnreg requests."""
        if NUM_C == 3:
            gl.warp_specialize([(_ws_consumer0, cons), (_ws_consumer1, cons), (_ws_consumer2, cons),
                                (_ws_producer, prod)], [4, 4, 1], [REGS_C, REGS_C, REGS_P])
        elif NUM_C == 2:
            gl.warp_specialize([(_ws_consumer0, cons), (_ws_consumer1, cons), (_ws_producer, prod)],
                               [4, 1], [REGS_C, REGS_P])
        else:
            gl.warp_specialize([(_ws_consumer0, cons), (_ws_producer, prod)], [1], [REGS_P])

    @gluon.jit(do_not_specialize=["n_dp", "sk_units"])
    def attn_fwd_hopper_ws(QD, KD, VD, O, OD, qk_scale, Lq, Lk, H, KV_GROUP, n_dp, sk_units, WO, WML,
                           q_rb, q_rh, q_ch, k_rb, k_rh, k_ch, v_rb, v_rh, v_ch, stride_ob, stride_oh, stride_ol,
                           HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                           K_STAGES: gl.constexpr, V_STAGES: gl.constexpr, num_warps: gl.constexpr,
                           REGS_C: gl.constexpr, REGS_P: gl.constexpr, PINGPONG: gl.constexpr,
                           O_TMA: gl.constexpr):
        """Tiles t = program, program + grid, ... < n_dp (persistent where the grid is smaller), then
        stream-K segments of the last tiles' ``sk_units`` key blocks into the workspace ``WO`` / ``WML``.
        With O_TMA a whole tile's rows are stored through ``OD`` (O as rows of stride_ol elements)."""
        NUM_C: gl.constexpr = BLOCK_M // 64
        STAGES: gl.constexpr = K_STAGES
        q_smem, k_smem, v_smem, q_bars, q_empty, k_full, v_full, k_empty, v_empty, turn, o_smem = \
            _ws_setup(QD, KD, VD, OD, BLOCK_M, BLOCK_N, STAGES, PINGPONG, O_TMA)
        cons = (O, OD, o_smem, q_smem, k_smem, v_smem, q_bars, q_empty, k_full, v_full, k_empty, v_empty, turn, O,
                O, O, qk_scale, Lq, Lk, H, KV_GROUP, n_dp, sk_units, WO, WML, stride_ob, stride_oh, stride_ol)
        prod = (QD, KD, VD, q_smem, k_smem, v_smem, q_bars, q_empty, k_full, v_full, k_empty, v_empty,
                Lq, Lk, H, KV_GROUP, n_dp, sk_units, q_rb, q_rh, q_ch, k_rb, k_rh, k_ch, v_rb, v_rh, v_ch)
        _ws_run(cons, prod, NUM_C, REGS_C, REGS_P)

    # ---- 8-bit, warp-specialised: int8 Q·K (the pre-pass's smoothed, scaled copies), P·V in fp8 e4m3
    # (P × 448 against the transposed, block-scaled fp8 V) or in the input dtype

    @gluon.jit
    def _fp8x4(x):
        """fp32 ``x`` to fp8 e4m3 (saturating), four a register: two ``cvt.rn.satfinite.e4m3x2.f32`` and
        one move that pairs their halves. In the MMA operand's layout a thread's four consecutive
        values are one register's, so they come out packed as the MMA reads them. Triton's own ``.to``
        converts two at a time and then moves bytes: one LOP3 a score and 2.5 PRMT per four (Triton 3.6,
        sm90), about 2.7 instructions a score in the softmax's loop."""
        return gl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; "
            "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; mov.b32 $0, {lo, hi}; }",
            "=r,r,r,r,r", [x], dtype=gl.float8e4nv, is_pure=True, pack=4)

    @gluon.jit
    def _p_operand(p, dtype: gl.constexpr, p_layout: gl.constexpr):
        """P in ``dtype`` as the P·V MMA's A operand (registers). In fp8 (P × 448 already, from the
        softmax) without moving data between threads: the fp8 operand layout gives a thread keys
        4t..4t+3 and 16+4t..16+4t+3 of each 32 (t = lane % 4), the scores' accumulator layout 2t,
        2t+1, 8+2t, 9+2t, 16+2t, ..., so P's keys are relabelled within each 32, operand key k taking
        P's key π(k) (k's bits 0,1,2,3,4 from bits 0,3,1,2,4): a reshape and a permute that only
        rename, after which the conversion is trivial (asserted). The pre-pass stores Vᵀ's keys in
        the same order (kernels/attention.py, PERM_V). A plain conversion costs a register shuffle
        between threads there (96 SHFL and 639 PRMT in the SASS, against 32 and 64 for 16-bit P)."""
        if dtype == gl.float8e4nv:
            M: gl.constexpr = p.shape[0]
            N: gl.constexpr = p.shape[1]
            x = gl.reshape(p, [M, N // 32, 2, 2, 2, 2, 2])
            x = gl.reshape(gl.permute(x, (0, 1, 2, 4, 5, 3, 6)), [M, N])
            op = _fp8x4(gl.convert_layout(x, p_layout, assert_trivial=True))
        else:
            op = gl.convert_layout(p.to(dtype), p_layout)
        return op

    @gluon.jit
    def _v_operand(v_smem, i):
        """V's tile ``i`` as the P·V MMA's B operand (keys × channels): the fp8 Vᵀ tile (channels ×
        keys) transposed, K-major as the fp8 MMA needs it."""
        if v_smem.dtype == gl.float8e4nv:
            v = v_smem.index(i).permute((1, 0))
        else:
            v = v_smem.index(i)
        return v

    @gluon.jit
    def _store_rows(o_base, acc, r0, Lq, stride_ol, row_o: gl.constexpr, col_o: gl.constexpr):
        """64 output rows from r0 (those before L_q) from the accumulator's registers."""
        rows = r0 + gl.arange(0, 64, layout=row_o)
        offs_d = gl.arange(0, acc.shape[1], layout=col_o)
        ptrs = o_base + gl.expand_dims(rows.to(gl.int64) * stride_ol, 1) + gl.expand_dims(offs_d, 0)
        gl.store(ptrs, acc, mask=gl.expand_dims(rows < Lq, 1))

    @gluon.jit
    def _ws_consumer(c: gl.constexpr, O, OD, o_smem, q_smem, q_bars, q_empty, k_smem, v_smem, k_full, v_full,
                     k_empty, v_empty, turn, QS, KS, VA, qk_scale, Lq, Lk, H, KV_GROUP, n_dp, sk_units, WO, WML,
                     stride_ob, stride_oh, stride_ol):
        """Consumer warpgroup ``c`` of a warp-specialised kernel, over the program's tiles (the
        producer's order): its 64 query rows of each over every key block. Exact (16-bit Q / K: scores
        times ``qk_scale``) or 8-bit (int8 Q / K: the int32 scores times Q's row scales from ``QS`` and
        K's block scale from ``KS``), P·V in V's dtype, or in fp8 with V's block scales' exponents ``VA``
        (one per V_BLOCK keys). The K / V
        ring slots and the ping-pong's turns count on across tiles."""
        BLOCK_M: gl.constexpr = 64 * (q_smem.shape[0] // 2)
        n_m, n_blocks, pid, grid, n_mine, n_items = _ws_schedule(q_smem, k_smem, Lq, Lk, n_dp, sk_units)
        for it in range(0, n_items):  # the program's it-th item
            t, j0, n_j, g0, slot = _ws_item(it, n_mine, pid, grid, n_dp, sk_units, n_blocks)
            mb, bh, b, h, hk = _tile(t, n_m, H, KV_GROUP)
            bhk = b * (H // KV_GROUP) + hk
            o_off = b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
            # the ping-pong turns before it: a key block's, and one more an item
            _ws_tile(c, O, OD, o_smem, q_smem, q_bars, q_empty, it % 2, (it // 2) & 1, k_smem, v_smem, k_full,
                     v_full, k_empty, v_empty, turn, g0, g0 + it, QS, KS, VA, qk_scale, Lq, Lk, j0, n_j, o_off,
                     mb * BLOCK_M, stride_ol, bh * Lq, bhk * n_blocks, bhk * ((Lk + V_BLOCK - 1) // V_BLOCK), slot,
                     WO, WML)
        if o_smem.shape[0] != q_smem.shape[0]:  # O_TMA: the last tile's store has read its buffer
            tma.store_wait(0)

    @gluon.jit
    def _ws_tile(c: gl.constexpr, O, OD, o_smem, q_smem, q_bars, q_empty, qb, q_phase, k_smem, v_smem, k_full,
                 v_full, k_empty, v_empty, turn, g, kt, QS, KS, VA, qk_scale, Lq, Lk, j0, n_j, o_off, row0,
                 stride_ol, qs_base, ks_base, va_base, slot, WO, WML):
        """One item of consumer ``c``: key blocks j0 .. j0 + n_j - 1 of a tile, Q from buffer ``qb``
        (the other buffer, the item before's, is released on ``q_empty`` as this one begins), the item's
        jj-th key block in ring slot (g + jj) % STAGES, ping-pong turns from ``kt``. A whole tile
        (``slot`` < 0) is normalised and stored at element ``o_off`` of O (its 64 rows through the
        consumer's ``o_smem`` buffer and one TMA store where they all lie before L_q and O_TMA is on,
        else from registers); a stream-K segment's unnormalised output, row max and
        row sum go to workspace slot ``slot`` (``WO``: (slots, BLOCK_M, HEAD_D), ``WML``: (slots, 2,
        BLOCK_M), fp32) for kernels/attention_streamk.py's fixup."""
        INT8: gl.constexpr = q_smem.dtype == gl.int8
        NUM_C: gl.constexpr = q_smem.shape[0] // 2
        HEAD_D: gl.constexpr = q_smem.shape[2]
        STAGES: gl.constexpr = k_smem.shape[0]
        BLOCK_N: gl.constexpr = k_smem.shape[1]
        FP8: gl.constexpr = v_smem.dtype == gl.float8e4nv
        PK: gl.constexpr = 32 if FP8 else 16  # the P·V instruction's k
        P_LOG2: gl.constexpr = 8.807354922057604 if FP8 else 0.0  # fp8 P is P × 448 = 2^8.807...
        INT_OFF: gl.constexpr = 12582912.0  # _int_scores' offset, 1.5·2^23
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 32 if INT8 else 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_D, PK])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4 if FP8 else 2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
        q = q_smem.index(qb * NUM_C + c)
        # the Q·K accumulator's start: none (exact, use_acc=False), or the offset _int_scores reads (8-bit)
        if INT8:
            s_zero = gl.full([64, BLOCK_N], 0x4B400000, gl.int32, s_layout)
        else:
            s_zero = gl.zeros([64, BLOCK_N], gl.float32, s_layout)
        o_zero = gl.zeros([64, HEAD_D], gl.float32, o_layout)
        if INT8:
            offs_m = row0 + c * 64 + gl.arange(0, 64, layout=row_s)
            # softmax scale, log2(e) folded in; 1 past L_q (a masked score times 0 would be NaN)
            qsc = gl.load(QS + qs_base + offs_m, mask=offs_m < Lq, other=1.0)
        m_i = gl.full([64], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([64], gl.float32, row_s)
        acc = gl.zeros([64, HEAD_D], gl.float32, o_layout)

        mbarrier.wait(q_bars.index(qb * NUM_C + c), q_phase)
        mbarrier.arrive(q_empty.index(1 - qb))  # the tile before is done with the other Q buffer
        st0 = g % STAGES
        mbarrier.wait(k_full.index(st0), (g // STAGES) & 1)
        _my_turn(turn, c, kt)
        s_tok = warpgroup_mma(q, k_smem.index(st0).permute((1, 0)), s_zero, use_acc=INT8, is_async=True)
        _pass_turn(turn, c)
        s = warpgroup_mma_wait(0, deps=(s_tok,))
        mbarrier.arrive(k_empty.index(st0))
        if INT8:
            p, alpha, m_i, l_i = _softmax(_int_scores(s), j0, m_i, l_i, qsc * gl.load(KS + ks_base + j0), Lk,
                                          BLOCK_N, s_layout, P_LOG2, True, INT_OFF, TREE=FP8, TREE_SUM=True)
        else:
            p, alpha, m_i, l_i = _softmax(s, j0, m_i, l_i, qk_scale, Lk, BLOCK_N, s_layout)
        if FP8:
            # Each iteration makes P into the MMA's operand and issues it beside the next block's Q·Kᵀ:
            # carried over the loop's back edge, fp8 P's bytes were carried one a register and packed
            # again at the MMA (a LOP3 a score and 0.5 PRMT). The last Q·Kᵀ (block n_blocks) reads a K
            # slot without waiting for it (the producer may be filling it with the next tile's block);
            # its result is never used. (The 16-bit forms keep the loop below: this one spilled there
            # with Triton 3.8.)
            p_op = _p_operand(p, v_smem.dtype, p_layout)
            mbarrier.wait(k_full.index((g + 1) % STAGES), ((g + 1) // STAGES) & 1, pred=n_j > 1)
            mbarrier.wait(v_full.index(st0), (g // STAGES) & 1)
            _my_turn(turn, c, kt + 1)
            s_tok = warpgroup_mma(q, k_smem.index((g + 1) % STAGES).permute((1, 0)), s_zero, use_acc=INT8,
                                  is_async=True)
            o_tok = warpgroup_mma(p_op, _v_operand(v_smem, st0), o_zero, use_acc=False, is_async=True)
            _pass_turn(turn, c)
            s = warpgroup_mma_wait(1, deps=(s_tok,))
            # the blocks before block j-1 stay at block j-2's max until block j-1's sum arrives; one FMA
            # then rescales them and adds it. They are also in units of block j-2's V scale (2^e_acc),
            # block j-1's products in its own (2^e_p): the rescale takes 2^(e_acc - e_p) too.
            alpha_prev = alpha
            e_p = gl.load(VA + va_base + j0 * BLOCK_N // V_BLOCK)
            # (the accumulator is zero yet: any value would do; not e_p itself, whose value the loop's
            # first pass would see assigned to e_acc unchanged, and so not carry e_acc round the loop)
            e_acc = e_p + 0.0
            for jj in range(1, n_j):
                st = (g + jj) % STAGES
                e_n = gl.load(VA + va_base + (j0 + jj) * BLOCK_N // V_BLOCK)  # block j's, for its P·V
                mbarrier.arrive(k_empty.index(st))
                p, alpha, m_i, l_i = _softmax(_int_scores(s), j0 + jj, m_i, l_i, qsc * gl.load(KS + ks_base + j0 + jj),
                                              Lk, BLOCK_N, s_layout, P_LOG2, True, INT_OFF, TREE=True,
                                              TREE_SUM=True)
                pv = warpgroup_mma_wait(0, deps=(o_tok,))
                mbarrier.arrive(v_empty.index((g + jj - 1) % STAGES))
                # one key block's products summed by the MMA, the blocks in fp32 registers (the fp8 MMA's
                # accumulator keeps fewer mantissa bits: summing every block in it failed the accuracy
                # goal at 32760 keys with outlier channels). (Here, not beside the next Q·Kᵀ as in the 16-bit
                # forms: P·V's block held across that issue spilled 688 bytes at head 128.)
                acc = acc * gl.expand_dims(gl.convert_layout(alpha_prev * gl.exp2(e_acc - e_p), row_o), 1) + pv
                alpha_prev = alpha
                e_acc = e_p
                e_p = e_n
                p_op = _p_operand(p, v_smem.dtype, p_layout)
                nst = (g + jj + 1) % STAGES
                mbarrier.wait(k_full.index(nst), ((g + jj + 1) // STAGES) & 1, pred=jj + 1 < n_j)
                mbarrier.wait(v_full.index(st), ((g + jj) // STAGES) & 1)
                _my_turn(turn, c, kt + jj + 1)
                s_tok = warpgroup_mma(q, k_smem.index(nst).permute((1, 0)), s_zero, use_acc=INT8, is_async=True)
                o_tok = warpgroup_mma(p_op, _v_operand(v_smem, st), o_zero, use_acc=False, is_async=True)
                _pass_turn(turn, c)
                s = warpgroup_mma_wait(1, deps=(s_tok,))
            pv = warpgroup_mma_wait(0, deps=(o_tok,))
        else:
            p_op = _p_operand(p, v_smem.dtype, p_layout)
            for jj in range(1, n_j):
                st = (g + jj) % STAGES
                pst = (g + jj - 1) % STAGES
                mbarrier.wait(k_full.index(st), ((g + jj) // STAGES) & 1)
                _my_turn(turn, c, kt + jj)
                s_tok = warpgroup_mma(q, k_smem.index(st).permute((1, 0)), s_zero, use_acc=INT8, is_async=True)
                # the blocks before j-1 (at block j-2's max) rescaled to block j-1's while this Q·Kᵀ runs, not
                # between the softmax and the next issue (FlashAttention-3's order); then block j-1's P·V
                acc = acc * gl.expand_dims(_after_issue(gl.convert_layout(alpha, row_o)), 1)
                mbarrier.wait(v_full.index(pst), ((g + jj - 1) // STAGES) & 1)
                o_tok = warpgroup_mma(p_op, _v_operand(v_smem, pst), acc, is_async=True)
                _pass_turn(turn, c)
                s = warpgroup_mma_wait(1, deps=(s_tok,))
                mbarrier.arrive(k_empty.index(st))
                if INT8:
                    p, alpha, m_i, l_i = _softmax(_int_scores(s), j0 + jj, m_i, l_i,
                                                  qsc * gl.load(KS + ks_base + j0 + jj), Lk, BLOCK_N, s_layout,
                                                  P_LOG2, True, INT_OFF, TREE_SUM=True)
                else:
                    p, alpha, m_i, l_i = _softmax(s, j0 + jj, m_i, l_i, qk_scale, Lk, BLOCK_N, s_layout)
                acc = warpgroup_mma_wait(0, deps=(o_tok,))
                mbarrier.arrive(v_empty.index(pst))
                p_op = _p_operand(p, v_smem.dtype, p_layout)
            lst = (g + n_j - 1) % STAGES
            mbarrier.wait(v_full.index(lst), ((g + n_j - 1) // STAGES) & 1)
            _my_turn(turn, c, kt + n_j)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            o_tok = warpgroup_mma(p_op, _v_operand(v_smem, lst), acc, is_async=True)
            _pass_turn(turn, c)
            pv = warpgroup_mma_wait(0, deps=(o_tok,))
        mbarrier.arrive(v_empty.index((g + n_j - 1) % STAGES))
        if FP8:
            # from the last block's V units (P's 448 is in l_i too)
            acc = (acc * gl.expand_dims(gl.convert_layout(alpha_prev * gl.exp2(e_acc - e_p), row_o), 1) + pv) * \
                gl.exp2(e_p)
        else:
            acc = pv
        O_TMA: gl.constexpr = o_smem.shape[0] != q_smem.shape[0]  # o_smem is q_smem where O_TMA is off
        if slot < 0:
            out = (acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)).to(O.dtype.element_ty)
            r0 = row0 + c * 64
            if O_TMA:
                if r0 + 64 <= Lq:
                    # a whole 64 rows: through shared memory and one TMA store, which the consumer does not
                    # wait for (st.global from the accumulator's layout writes half sectors; their issue held
                    # the consumer about 1 us at the end of a Flux tile). O as OD's rows of stride_ol elements;
                    # the buffer's store of the item before has read it.
                    ob = o_smem.index(c)
                    tma.store_wait(0)
                    ob.store(out)
                    fence_async_shared()
                    tma.async_copy_shared_to_global(OD, [(o_off // stride_ol).to(gl.int32) + r0,
                                                         (o_off % stride_ol).to(gl.int32)], ob)
                else:
                    _store_rows(O + o_off, out, r0, Lq, stride_ol, row_o, col_o)
            else:
                _store_rows(O + o_off, out, r0, Lq, stride_ol, row_o, col_o)
        else:  # a stream-K segment: its rows of the tile, every one (the fixup masks past L_q)
            BLOCK_M: gl.constexpr = 64 * NUM_C
            offs_d = gl.arange(0, HEAD_D, layout=col_o)
            r_o = c * 64 + gl.arange(0, 64, layout=row_o)
            ws = WO + slot.to(gl.int64) * (BLOCK_M * HEAD_D)
            gl.store(ws + gl.expand_dims(r_o * HEAD_D, 1) + gl.expand_dims(offs_d, 0), acc)
            r_s = c * 64 + gl.arange(0, 64, layout=row_s)
            gl.store(WML + slot * (2 * BLOCK_M) + r_s, m_i)
            gl.store(WML + slot * (2 * BLOCK_M) + BLOCK_M + r_s, l_i)

    @gluon.jit
    def _ws_consumer0(O, OD, o_smem, q_smem, k_smem, v_smem, q_bars, q_empty, k_full, v_full, k_empty, v_empty,
                      turn, QS, KS, VA, qk_scale, Lq, Lk, H, KV_GROUP, n_dp, sk_units, WO, WML, stride_ob,
                      stride_oh, stride_ol):
        _ws_consumer(0, O, OD, o_smem, q_smem, q_bars, q_empty, k_smem, v_smem, k_full, v_full, k_empty, v_empty,
                     turn, QS, KS, VA, qk_scale, Lq, Lk, H, KV_GROUP, n_dp, sk_units, WO, WML, stride_ob, stride_oh,
                     stride_ol)

    @gluon.jit
    def _ws_consumer1(O, OD, o_smem, q_smem, k_smem, v_smem, q_bars, q_empty, k_full, v_full, k_empty, v_empty,
                      turn, QS, KS, VA, qk_scale, Lq, Lk, H, KV_GROUP, n_dp, sk_units, WO, WML, stride_ob,
                      stride_oh, stride_ol):
        _ws_consumer(1, O, OD, o_smem, q_smem, q_bars, q_empty, k_smem, v_smem, k_full, v_full, k_empty, v_empty,
                     turn, QS, KS, VA, qk_scale, Lq, Lk, H, KV_GROUP, n_dp, sk_units, WO, WML, stride_ob, stride_oh,
                     stride_ol)

    @gluon.jit
    def _ws_consumer2(O, OD, o_smem, q_smem, k_smem, v_smem, q_bars, q_empty, k_full, v_full, k_empty, v_empty,
                      turn, QS, KS, VA, qk_scale, Lq, Lk, H, KV_GROUP, n_dp, sk_units, WO, WML, stride_ob,
                      stride_oh, stride_ol):
        _ws_consumer(2, O, OD, o_smem, q_smem, q_bars, q_empty, k_smem, v_smem, k_full, v_full, k_empty, v_empty,
                     turn, QS, KS, VA, qk_scale, Lq, Lk, H, KV_GROUP, n_dp, sk_units, WO, WML, stride_ob, stride_oh,
                     stride_ol)

    @gluon.jit(do_not_specialize=["n_dp", "sk_units"])
    def attn_fwd_hopper_ws8(QD, KD, VD, O, OD, QS, KS, VA, Lq, Lk, H, KV_GROUP, n_dp, sk_units, WO, WML,
                            q_rb, q_rh, k_rb, k_rh, v_rb, v_rh, v_ch, stride_ob, stride_oh, stride_ol,
                            HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                            STAGES: gl.constexpr, num_warps: gl.constexpr,
                            REGS_C: gl.constexpr, REGS_P: gl.constexpr, PINGPONG: gl.constexpr,
                            O_TMA: gl.constexpr):
        """QD / KD: the pre-pass's int8 Q (B·H·Lq, D) and K (B·Hk·Lk, D); VD: fp8 Vᵀ (B·Hk·D, L_pad)
        or V's own 2-D view (rows v_rb a batch, v_rh a head, columns v_ch a head); QS (B·H·Lq) the
        row scales, KS (B·Hk, cdiv(Lk, BLOCK_N)) the block scales, VA (B·Hk, L_pad / V_BLOCK) fp8 V's scale exponents."""
        NUM_C: gl.constexpr = BLOCK_M // 64
        q_smem, k_smem, v_smem, q_bars, q_empty, k_full, v_full, k_empty, v_empty, turn, o_smem = \
            _ws_setup(QD, KD, VD, OD, BLOCK_M, BLOCK_N, STAGES, PINGPONG, O_TMA)
        cons = (O, OD, o_smem, q_smem, k_smem, v_smem, q_bars, q_empty, k_full, v_full, k_empty, v_empty, turn, QS,
                KS, VA, 1.0, Lq, Lk, H, KV_GROUP, n_dp, sk_units, WO, WML, stride_ob, stride_oh, stride_ol)
        prod = (QD, KD, VD, q_smem, k_smem, v_smem, q_bars, q_empty, k_full, v_full, k_empty, v_empty,
                Lq, Lk, H, KV_GROUP, n_dp, sk_units, q_rb, q_rh, 0, k_rb, k_rh, 0, v_rb, v_rh, v_ch)
        _ws_run(cons, prod, NUM_C, REGS_C, REGS_P)

    return attn_fwd_hopper, attn_fwd_hopper_ws, attn_fwd_hopper_ws8


def kernel(ws: bool = False, int8: bool = False):
    """The plain kernel, with ``ws`` the warp-specialised one, with ``int8`` the 8-bit one (always
    warp-specialised)."""
    global _KERNELS
    if _KERNELS is None:
        built = _build()
        globals().update(zip(KERNEL_NAMES, built))
        _KERNELS = built
    return _KERNELS[2 if int8 else 1 if ws else 0]


def __getattr__(name: str):
    """The Gluon kernels by name (built on first use), as a compile worker imports them."""
    if name in KERNEL_NAMES and gluon is not None:
        kernel()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_GL_DTYPE = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.int8: "int8",
             torch.float8_e4m3fn: "float8e4nv"}


@functools.lru_cache(maxsize=None)
def _smem_layout(block, dtype):
    """The default-swizzle shared layout of a ``block`` tile (4-5 us to build: once per block)."""
    return gl.NVMMASharedLayout.get_default_for(list(block), getattr(gl, _GL_DTYPE[dtype]))


# A validated descriptor per (dtype, shape, strides, block), its tensor left out: a call's descriptors differ
# from its shape class's first ones only in their tensor, so a later one is that template with the new tensor
# (``from_tensor`` checks shapes, strides, layout and alignment anew each time: 4 descriptors were 17 of an 8-bit
# SDXL call's 155 us of host time on an H200 machine, 2026-11-28). Cleared whole when full.
_DESC_TEMPLATES: dict = {}
MAX_DESC_TEMPLATES = 512


def descriptor(view2d, block):
    """A Gluon TMA descriptor over a 2-D view, ``block`` rows × its width, default swizzle."""
    key = (view2d.dtype, view2d.shape, view2d.stride(), tuple(block))
    tpl = _DESC_TEMPLATES.get(key)
    if tpl is not None and view2d.data_ptr() % 16 == 0:  # (the one check that depends on the tensor)
        d = object.__new__(tpl[0])
        d.__dict__.update(tpl[1])
        d.base = view2d
        return d
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    d = TensorDescriptor.from_tensor(view2d, list(block), _smem_layout(tuple(block), view2d.dtype))
    if len(_DESC_TEMPLATES) >= MAX_DESC_TEMPLATES:
        _DESC_TEMPLATES.clear()
    _DESC_TEMPLATES[key] = (type(d), {n: x for n, x in d.__dict__.items() if n != "base"})
    return d


def out_descriptor(o, so, D, dummy):
    """(descriptor, O_TMA) of the warp-specialised kernels' output: O as rows of ``so[2]`` elements (a
    contiguous (B, H, L, D) or (B, L, H, D) output), 64 × D tiles; ``(dummy, False)`` where O does not fold
    into that view (the kernels then store every tile with st.global)."""
    row = so[2]
    if (o.is_contiguous() and o.data_ptr() % 16 == 0 and (row * o.element_size()) % 16 == 0
            and o.numel() % row == 0 and row >= D):
        return descriptor(o.view(-1, row), (64, D)), True
    return dummy, False


# The warp-specialised kernels' grid: a program an SM at most, each taking every grid-th tile (persistent), so
# that a tile's Q and first K / V blocks load while the program's tile before it is still being computed, and no
# CTA is launched and set up a tile. ``PERSISTENT = False``: a program a tile, as before (benches' A / B).
PERSISTENT = True


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


# Stream-K for the last wave of a persistent launch (kernels/attention_streamk.py); TRITONKIT_STREAM_K=0 turns it
# off. It was opt-in for a session: with it on, the GPU suite's first torch.compile calls failed in some runs. The
# cause was the attention op redefined by a second copy of the pack (kernels/runtime.op_exists), with or without
# stream-K (BENCHMARKS.md, thirty-seventh session). Benches set the attribute.
STREAM_K_ENV = "TRITONKIT_STREAM_K"
STREAM_K = os.environ.get(STREAM_K_ENV, "1").strip() not in ("0", "false", "no", "off")


@functools.lru_cache(maxsize=None)
def _no_workspace(device):
    """The workspace arguments of a launch without stream-K (never read): fp32, like the real ones, so
    both launches share a compiled kernel."""
    return torch.zeros(1, dtype=torch.float32, device=device)


def _ws_grid(tiles: int, n_blocks: int, device, light: bool):
    """(grid, whole tiles, stream-K key blocks) of a warp-specialised launch; ``light``: one program, one
    tile."""
    if light:
        return (1,), 1, 0
    if not PERSISTENT or device.type != "cuda":
        return (tiles,), tiles, 0
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    n_dp, units = SK.schedule(tiles, n_blocks, sms) if STREAM_K else (tiles, 0)
    # with stream-K every SM takes a share of the last tiles, also where there are fewer tiles than SMs
    return ((sms if units else min(tiles, sms)),), n_dp, units


def _ws_launch(launch_fn, kern, grid, n_dp, units, args_head, args_tail, o, so, H, Lq, Lk, bm, bn, D, warmup,
               consts):
    """A warp-specialised kernel's launch, and with stream-K the fixup after it (its own workspace)."""
    dev = o.device
    if units:
        wo, wml = SK.workspace(grid[0], bm, D, dev)
    else:
        wo = wml = _no_workspace(dev)
    launch_fn(kern, grid, *args_head, n_dp, units, wo, wml, *args_tail, warmup=warmup, **consts)
    if units:
        n_blocks = (Lk + bn - 1) // bn
        tab = SK.table(n_dp, units, n_blocks, grid[0], dev)
        SK.fixup(wo, wml, tab, o, n_dp, (Lq + bm - 1) // bm, H, Lq, so, bm, D, launch_fn, warmup=warmup)


def launch(q_view, kv_views, o, so, B, H, Hk, Lq, Lk, D, sm_scale, cfg, launch_fn, warmup=False, ws=False,
           light=False):
    """One call. ``q_view`` / ``kv_views``: kernels/attention.py's 2-D views with their (row per
    batch, row per head, column per head); ``so``: the output's (batch, head, row) strides;
    ``launch_fn``: kernels/runtime.py's launch (compile-only with ``warmup``); ``ws``: the
    warp-specialised kernel (BLOCK_M / 64 consumer warpgroups); ``light``: only the grid's first
    program runs (a timer's warm-up: the kernel loaded, its launch path taken, little GPU time)."""
    bm, bn, nw, stages = cfg
    ks, vs = stages if isinstance(stages, (tuple, list)) else (stages, stages)  # (K ring, V ring) in benches
    if ws:
        nw, vs = 4, ks  # the default partition is the first consumer warpgroup; one ring depth
    (q2, (q_rb, q_rh, q_ch)), (k2, v2, (k_rb, k_rh, k_ch), (v_rb, v_rh, v_ch)) = q_view, kv_views
    qd = descriptor(q2, (64 if ws else bm, D))
    kd = descriptor(k2, (bn, D))
    vd = descriptor(v2, (bn, D))
    tiles = ((Lq + bm - 1) // bm) * B * H
    tail = (q_rb, q_rh, q_ch, k_rb, k_rh, k_ch, v_rb, v_rh, v_ch, so[0], so[1], so[2])
    consts = {"HEAD_D": D, "BLOCK_M": bm, "BLOCK_N": bn, "K_STAGES": ks, "V_STAGES": vs, "num_warps": nw}
    if ws:
        od, o_tma = out_descriptor(o, so, D, qd)
        head = (qd, kd, vd, o, od, sm_scale * LOG2E, Lq, Lk, H, H // Hk)
        grid, n_dp, units = _ws_grid(tiles, (Lk + bn - 1) // bn, q2.device, light)
        rc, rp = ws_regs(bm)
        consts.update(REGS_C=rc, REGS_P=rp, PINGPONG=ws == "pp", O_TMA=o_tma)
        _ws_launch(launch_fn, kernel(ws), grid, n_dp, units, head, tail, o, so, H, Lq, Lk, bm, bn, D, warmup, consts)
    else:
        head = (qd, kd, vd, o, sm_scale * LOG2E, Lq, Lk, H, H // Hk)
        launch_fn(kernel(ws), (1,) if light else (tiles,), *head, *tail, warmup=warmup, **consts)


def launch8(qi, qs, ki, ks, v_view, vscale, o, so, B, H, Hk, Lq, Lk, D, cfg, launch_fn, warmup=False, pp=False,
            light=False):
    """One 8-bit call from kernels/attention.py's pre-pass: int8 ``qi`` (B, H, Lq, D) with row
    scales ``qs``, int8 ``ki`` (B, Hk, Lk, D) with block scales ``ks`` (one per BLOCK_N keys),
    ``v_view``: the fp8 Vᵀ copy (B, Hk, D, L_pad) or, for 16-bit P·V, V's 2-D view with its (row
    per batch, row per head, column per head); ``vscale`` its scales' exponents (B, Hk, L_pad / V_BLOCK; fp8 only); ``light``: as
    :func:`launch`."""
    bm, bn, _, stages = cfg
    qd = descriptor(qi.view(B * H * Lq, D), (64, D))
    kd = descriptor(ki.view(B * Hk * Lk, D), (bn, D))
    if isinstance(v_view, torch.Tensor):  # fp8 Vᵀ: channels × keys
        l_pad = v_view.shape[-1]
        vd = descriptor(v_view.view(B * Hk * D, l_pad), (D, bn))
        v_rb, v_rh, v_ch = Hk * D, D, 0
        va = vscale
    else:
        v2, (v_rb, v_rh, v_ch) = v_view
        vd = descriptor(v2, (bn, D))
        va = qs  # unused
    grid, n_dp, units = _ws_grid(((Lq + bm - 1) // bm) * B * H, (Lk + bn - 1) // bn, qi.device, light)
    od, o_tma = out_descriptor(o, so, D, qd)
    rc, rp = ws8_regs(bm)
    consts = {"HEAD_D": D, "BLOCK_M": bm, "BLOCK_N": bn, "STAGES": stages, "num_warps": 4,
              "REGS_C": rc, "REGS_P": rp, "PINGPONG": bool(pp), "O_TMA": o_tma}
    _ws_launch(launch_fn, kernel(int8=True), grid, n_dp, units, (qd, kd, vd, o, od, qs, ks, va, Lq, Lk, H, H // Hk),
               (H * Lq, Lq, Hk * Lk, Lk, v_rb, v_rh, v_ch, so[0], so[1], so[2]), o, so, H, Lq, Lk, bm, bn, D, warmup,
               consts)


def compile_spec8(dtype, head_dim: int, cfg, fp8_pv: bool = True, pp: bool = False, o_tma: bool = True):
    """compile_spec's counterpart for the 8-bit kernel."""
    bm, bn, _, stages = cfg
    ty = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]

    def desc(t, gty, shape):
        return f"tensordesc<{t}[{shape[0]}, {shape[1]}],{_smem_layout(tuple(shape), gty)!r}>"

    vd = desc("fp8e4nv", torch.float8_e4m3fn, (head_dim, bn)) if fp8_pv else desc(ty, dtype, (bn, head_dim))
    sig = {"QD": desc("i8", torch.int8, (64, head_dim)), "KD": desc("i8", torch.int8, (bn, head_dim)), "VD": vd,
           "O": f"*{ty}", "OD": desc(ty, dtype, (64, head_dim)), "QS": "*fp32", "KS": "*fp32", "VA": "*fp32"}
    for n in ("Lq", "Lk", "H", "KV_GROUP", "n_dp", "sk_units", "WO", "WML", "q_rb", "q_rh", "k_rb", "k_rh", "v_rb",
              "v_rh", "v_ch", "stride_ob", "stride_oh", "stride_ol"):
        sig[n] = "*fp32" if n in ("WO", "WML") else "i32"
    rc, rp = ws8_regs(bm)
    consts = {"HEAD_D": head_dim, "BLOCK_M": bm, "BLOCK_N": bn, "STAGES": stages, "num_warps": 4,
              "REGS_C": rc, "REGS_P": rp, "PINGPONG": bool(pp), "O_TMA": o_tma}
    for n in consts:
        sig[n] = "constexpr"
    return kernel(int8=True), sig, consts, {"archs": (90,), "num_warps": 4, "num_stages": 1}


def compile_spec(dtype, head_dim: int, cfg, ws: bool = False, o_tma: bool = True):
    """(kernel, signature, constexprs, options) to compile this kernel for sm90 without a GPU
    (``triton.compile(GluonASTSource(...), target=GPUTarget("cuda", 90, 32))``; tests)."""
    from triton.experimental.gluon import language as gl
    bm, bn, nw, stages = cfg
    ty = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    gty = getattr(gl, _GL_DTYPE[dtype])

    def desc(rows):
        layout = gl.NVMMASharedLayout.get_default_for([rows, head_dim], gty)
        return f"tensordesc<{ty}[{rows}, {head_dim}],{layout!r}>"

    if ws:
        nw = 4
    sig = {"QD": desc(64 if ws else bm), "KD": desc(bn), "VD": desc(bn), "O": f"*{ty}"}
    if ws:
        sig["OD"] = desc(64)
    sig["qk_scale"] = "fp32"
    tail = ("q_rb", "q_rh", "q_ch", "k_rb", "k_rh", "k_ch", "v_rb", "v_rh", "v_ch", "stride_ob", "stride_oh",
            "stride_ol")
    for n in ("Lq", "Lk", "H", "KV_GROUP") + (("n_dp", "sk_units", "WO", "WML") if ws else ()) + tail:
        sig[n] = "*fp32" if n in ("WO", "WML") else "i32"
    consts = {"HEAD_D": head_dim, "BLOCK_M": bm, "BLOCK_N": bn, "K_STAGES": stages, "V_STAGES": stages,
              "num_warps": nw}
    if ws:
        rc, rp = ws_regs(bm)
        consts.update(REGS_C=rc, REGS_P=rp, PINGPONG=ws == "pp", O_TMA=o_tma)
    for n in consts:
        sig[n] = "constexpr"
    return kernel(ws), sig, consts, {"archs": (90,), "num_warps": nw, "num_stages": 1}
