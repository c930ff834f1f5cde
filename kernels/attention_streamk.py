"""Stream-K for the warp-specialised Gluon attention kernels' last wave (kernels/attention_hopper.py;
``TRITONKIT_STREAM_K=0`` turns it off: see attention_hopper.STREAM_K).

A persistent grid of G programs over T tiles of ``n_blocks`` key blocks each runs T // G whole tiles a program;
when T is not a multiple of G, the last r = T % G tiles would leave G - r SMs idle for a whole tile (at Flux's
864 tiles on an H100's 132 SMs, 60 SMs for the last 64 µs of a 450 µs call; BENCHMARKS.md, thirty-sixth
session). With stream-K those r tiles' r · n_blocks key blocks ("units") are shared out evenly instead:
program p takes units [p·U // G, (p + 1)·U // G) of U = r · n_blocks, which lie in at most two tiles
(U / G < n_blocks), its *segments*. A segment's unnormalised output (fp32, the row max and the row sum of
the online softmax, in the kernels' exp2 domain) goes to a workspace slot (2p + segment); :func:`fixup`
then merges each tail tile's segments into the output: O = Σ 2^(m_s - m) acc_s / Σ 2^(m_s - m) l_s with
m = max_s m_s.

:func:`schedule` is the host's mirror of the kernels' arithmetic (the kernels compute their own segments
from ``n_dp`` and ``U``); the fixup reads a table from it: for each tail tile, its segments' slots.
:func:`merge_reference` is the torch reference of the fixup.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

MAX_SEGS = 8  # segments a tail tile may have in the table (more: stream-K is not used for that call)
# Stream-K only where the last wave leaves at least this share of the SMs idle and each program's run of the
# tail is this many key blocks at least (a segment pays its own first block and epilogue, and the fixup is a
# launch and a read of the partials: BENCHMARKS.md, thirty-sixth session)
MIN_IDLE_SHARE = 0.4
MIN_UNITS = 8


def schedule(n_tiles: int, n_blocks: int, grid: int):
    """(n_dp, U) for ``n_tiles`` tiles of ``n_blocks`` key blocks on ``grid`` programs: tiles [0, n_dp) are
    whole (program p takes p, p + grid, ...), the last n_tiles - n_dp tiles' U key blocks are shared out as
    above. (n_tiles, 0) where stream-K does not pay: a full last wave, little idle, or short runs."""
    r = n_tiles % grid
    units = r * n_blocks
    if r == 0 or (grid - r) < MIN_IDLE_SHARE * grid or units // grid < MIN_UNITS:
        return n_tiles, 0
    # a tile meets at most ceil(n_blocks / shortest run) + 1 programs' runs
    if -(-n_blocks // (units // grid)) + 1 > MAX_SEGS:
        return n_tiles, 0
    return n_tiles - r, units


def segments(p: int, n_dp: int, units: int, n_blocks: int, grid: int) -> list:
    """Program p's segments: [(tile, first block, end block, slot)], as the kernels compute them."""
    u0, u1 = p * units // grid, (p + 1) * units // grid
    out = []
    u = u0
    while u < u1:
        i = u // n_blocks
        end = min(u1, (i + 1) * n_blocks)
        out.append((n_dp + i, u - i * n_blocks, end - i * n_blocks, 2 * p + len(out)))
        u = end
    return out


@functools.lru_cache(maxsize=64)
def _table(n_dp: int, units: int, n_blocks: int, grid: int):
    """int32 (tail tiles, MAX_SEGS) of workspace slots, -1 past a tile's last segment (CPU)."""
    r = units // n_blocks
    tab = torch.full((r, MAX_SEGS), -1, dtype=torch.int32)
    fill = [0] * r
    for p in range(grid):
        for tile, _j0, _j1, slot in segments(p, n_dp, units, n_blocks, grid):
            i = tile - n_dp
            tab[i, fill[i]] = slot
            fill[i] += 1
    return tab


@functools.lru_cache(maxsize=256)
def table(n_dp: int, units: int, n_blocks: int, grid: int, device) -> torch.Tensor:
    """:func:`_table` on ``device`` (a ``torch.device``), kept per shape class: one host-to-device copy each."""
    return _table(n_dp, units, n_blocks, grid).to(device)


def workspace(grid: int, block_m: int, head_dim: int, device):
    """(partial O: (2·grid, block_m, head_dim) fp32, row max and sum: (2·grid, 2, block_m) fp32): a call's own
    (the caching allocator's blocks, so concurrent calls on other streams never share one)."""
    return (torch.empty((2 * grid, block_m, head_dim), dtype=torch.float32, device=device),
            torch.empty((2 * grid, 2, block_m), dtype=torch.float32, device=device))


@triton.jit
def fixup_kernel(WO, WML, TAB, O, n_dp, n_m, H, Lq, stride_ob, stride_oh, stride_ol,
                 BLOCK_M: tl.constexpr, HEAD_D: tl.constexpr, ROWS: tl.constexpr, MAX_S: tl.constexpr):
    """One program: ROWS rows of one tail tile. Merges the tile's segments (slots from TAB) into O."""
    i = tl.program_id(0)
    rb = tl.program_id(1)
    t = n_dp + i
    mb = t % n_m
    bh = t // n_m
    b = bh // H
    h = bh % H
    r = rb * ROWS + tl.arange(0, ROWS)
    d = tl.arange(0, HEAD_D)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    l = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_D], tl.float32)
    for s in range(MAX_S):
        slot = tl.load(TAB + i * MAX_S + s)
        if slot >= 0:
            ms = tl.load(WML + (slot * 2) * BLOCK_M + r)
            ls = tl.load(WML + (slot * 2 + 1) * BLOCK_M + r)
            a = tl.load(WO + slot.to(tl.int64) * BLOCK_M * HEAD_D + r[:, None] * HEAD_D + d[None, :])
            m_new = tl.maximum(m, ms)
            alpha = tl.exp2(m - m_new)
            beta = tl.exp2(ms - m_new)
            acc = acc * alpha[:, None] + a * beta[:, None]
            l = l * alpha + ls * beta
            m = m_new
    rows = mb * BLOCK_M + r
    out = acc / l[:, None]
    ptrs = O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + rows.to(tl.int64)[:, None] * stride_ol \
        + d[None, :]
    tl.store(ptrs, out.to(O.dtype.element_ty), mask=(rows < Lq)[:, None])


FIXUP_ROWS = 32


def fixup(wo, wml, tab, o, n_dp, n_m, H, Lq, so, block_m, head_dim, launch_fn, warmup=False):
    """Launch :func:`fixup_kernel` over the tail tiles (``tab``'s rows) into ``o`` (strides ``so``: batch,
    head, row) through ``launch_fn`` (kernels/runtime.py's launch: compile-only with ``warmup``)."""
    grid = (tab.shape[0], block_m // FIXUP_ROWS)
    launch_fn(fixup_kernel, grid, wo, wml, tab, o, n_dp, n_m, H, Lq, so[0], so[1], so[2],
              BLOCK_M=block_m, HEAD_D=head_dim, ROWS=FIXUP_ROWS, MAX_S=MAX_SEGS, num_warps=4, warmup=warmup)


def merge_reference(parts):
    """The fixup's arithmetic in float64: ``parts`` a list of (acc (rows, D), m (rows), l (rows)) in the
    exp2 domain; returns the merged, normalised (rows, D)."""
    m = torch.stack([p[1].double() for p in parts]).amax(0)
    num = sum(p[0].double() * torch.exp2(p[1].double() - m)[:, None] for p in parts)
    den = sum(p[2].double() * torch.exp2(p[1].double() - m) for p in parts)
    return num / den[:, None]
