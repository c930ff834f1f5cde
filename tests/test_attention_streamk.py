"""kernels/attention_streamk.py: the stream-K schedule of the warp-specialised kernels' last wave and the
fixup that merges its segments. On CPU: the schedule covers every key block of the last tiles exactly once, at
most two segments a program; the fixup (Triton interpreter) merges segments made in float64 from fresh random
data into the exact attention of the tail tiles, output poisoned first, against the float64 reference."""
from __future__ import annotations

import math

import pytest
import torch

from tritonkit.kernels import attention as A
from tritonkit.kernels import attention_streamk as SK
from tritonkit.kernels import runtime


@pytest.mark.parametrize("n_tiles,n_blocks,grid", [(864, 36, 132), (3072, 128, 132), (10240, 256, 132),
                                                   (13, 40, 10), (3, 33, 8), (864, 36, 114)])
def test_the_schedule_covers_each_tail_block_once(n_tiles, n_blocks, grid):
    n_dp, units = SK.schedule(n_tiles, n_blocks, grid)
    r = n_tiles - n_dp
    assert n_dp % grid == 0 and units == r * n_blocks and 0 < r < grid
    seen = torch.zeros(r, n_blocks, dtype=torch.int32)
    slots = set()
    for p in range(grid):
        segs = SK.segments(p, n_dp, units, n_blocks, grid)
        assert len(segs) <= 2
        for tile, j0, j1, slot in segs:
            assert n_dp <= tile < n_tiles and 0 <= j0 < j1 <= n_blocks
            assert slot not in slots and slot // 2 == p
            slots.add(slot)
            seen[tile - n_dp, j0:j1] += 1
    assert bool((seen == 1).all())
    tab = SK._table(n_dp, units, n_blocks, grid)
    for i in range(r):
        listed = [int(x) for x in tab[i] if x >= 0]
        assert sorted(listed) == sorted(s for p in range(grid) for t, _, _, s in SK.segments(p, n_dp, units,
                                                                                             n_blocks, grid)
                                        if t == n_dp + i)
    dev = torch.device("cpu")  # the launch's copy: the same slots, one copy per shape class
    assert torch.equal(SK.table(n_dp, units, n_blocks, grid, dev), tab)
    assert SK.table(n_dp, units, n_blocks, grid, dev) is SK.table(n_dp, units, n_blocks, grid, dev)


@pytest.mark.parametrize("n_tiles,n_blocks,grid", [(792, 36, 132), (640, 32, 132), (20, 4, 132), (140, 36, 132)])
def test_stream_k_is_left_out_where_it_cant_pay(n_tiles, n_blocks, grid):
    # a full last wave; a last wave 85 % full; runs shorter than MIN_UNITS blocks (20 tiles of 4, 8 tiles of 36)
    assert SK.schedule(n_tiles, n_blocks, grid) == (n_tiles, 0)


def _segment(q, k, v, j0, j1, bn, scale):
    """(acc, m, l) of keys [j0·bn, j1·bn) in the kernels' exp2 domain, float64."""
    kk, vv = k[j0 * bn:j1 * bn].double(), v[j0 * bn:j1 * bn].double()
    s = (q.double() @ kk.T) * scale * math.log2(math.e)
    m = s.amax(1)
    p = torch.exp2(s - m[:, None])
    return p @ vv, m, p.sum(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fixup_merges_the_segments_into_exact_attention(dtype, poison, monkeypatch):
    gen = torch.Generator().manual_seed(123)
    B, H, Lq, bm, bn, D, grid = 1, 3, 200, 128, 16, 16, 4  # 2 query tiles a head, 6 tiles on 4 programs
    n_m = -(-Lq // bm)
    Lk = 7 * bn
    n_blocks = Lk // bn
    n_tiles = B * H * n_m
    monkeypatch.setattr(SK, "MIN_UNITS", 1)
    monkeypatch.setattr(SK, "MIN_IDLE_SHARE", 0.0)
    n_dp, units = SK.schedule(n_tiles, n_blocks, grid)
    assert units and n_dp == 4
    q = torch.randn(B, H, Lq, D, generator=gen) * 2
    k = torch.randn(B, H, Lk, D, generator=gen)
    v = torch.randn(B, H, Lk, D, generator=gen)
    scale = D ** -0.5
    wo = poison(torch.empty(2 * grid, bm, D))
    wml = poison(torch.empty(2 * grid, 2, bm))
    for p in range(grid):
        for tile, j0, j1, slot in SK.segments(p, n_dp, units, n_blocks, grid):
            mb, bh = tile % n_m, tile // n_m
            rows = q[bh // H, bh % H, mb * bm:(mb + 1) * bm]
            acc, m, l = _segment(rows, k[bh // H, bh % H], v[bh // H, bh % H], j0, j1, bn, scale)
            n = rows.shape[0]
            wo[slot, :n], wml[slot, 0, :n], wml[slot, 1, :n] = acc.float(), m.float(), l.float()
            wo[slot, n:], wml[slot, 0, n:], wml[slot, 1, n:] = 0.0, 0.0, 1.0  # rows past L_q: finite
    o = poison(torch.empty(B, H, Lq, D, dtype=dtype))
    tab = SK._table(n_dp, units, n_blocks, grid)

    def launch_fn(kern, g, *args, warmup=False, **kw):
        with A._interpreted_device_calls("cpu"):  # tl.zeros & co. interpreted too, as in attention()
            runtime.launch(runtime.kernel_for(kern, "cpu"), g, *args, **kw)

    SK.fixup(wo, wml, tab, o, n_dp, n_m, H, Lq, (o.stride(0), o.stride(1), o.stride(2)), bm, D, launch_fn)
    ref = torch.softmax((q.double() @ k.double().transpose(-1, -2)) * scale, -1) @ v.double()
    for tile in range(n_dp, n_tiles):
        mb, bh = tile % n_m, tile // n_m
        got = o[bh // H, bh % H, mb * bm:(mb + 1) * bm].double()
        want = ref[bh // H, bh % H, mb * bm:(mb + 1) * bm]
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        assert torch.isfinite(got).all()
        assert torch.allclose(got, want, atol=tol, rtol=tol), (tile, (got - want).abs().max().item())
    # the whole tiles are the kernel's: the fixup leaves them alone
    first = o[0, 0, :bm]
    assert torch.isnan(first.float()).all()


def test_merge_reference_is_softmax_attention():
    gen = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(8, 16, generator=gen), torch.randn(40, 16, generator=gen), torch.randn(40, 16, generator=gen)
    parts = [_segment(q, k, v, a, b, 8, 0.25) for a, b in ((0, 2), (2, 3), (3, 5))]
    ref = torch.softmax(q.double() @ k.double().T * 0.25, -1) @ v.double()
    assert torch.allclose(SK.merge_reference(parts), ref, atol=1e-12)
