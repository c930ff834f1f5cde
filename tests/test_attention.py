"""Triton attention kernels: numerics in the interpreter (CPU) over shapes, head sizes, masks,
layouts, dtypes and modes against a float64 reference with poisoned outputs; the custom op under
torch.compile; cross-compilation of every configuration for every arch; the same numerics on CUDA
at real sizes (gpu marker)."""
from __future__ import annotations

import inspect
import math

import pytest
import torch
import triton.language as tl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compile_utils import ARCHS, compile_for, map_in_processes
from tritonkit.kernels import attention as A

# additive masks of -finfo.max overflow to -inf once scaled by log2(e): intended, and silent on GPUs
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

# exact: relative (Frobenius) error vs float64; int8: cosine similarity
EXACT_TOL = {torch.float16: 5e-3, torch.bfloat16: 1e-2, torch.float32: 1e-4}
INT8_COS = 0.999
CPU_CFGS = [(16, 16, 4, 1), (32, 16, 4, 1), (16, 32, 4, 1), (32, 32, 4, 1)]


def make_qkv(B, H, Hk, Lq, Lk, D, dtype, layout, gen, device="cpu", outliers=False):
    def t(h, L):
        x = torch.randn(B, h, L, D, generator=gen, dtype=torch.float32)
        return x
    q, k, v = t(H, Lq), t(Hk, Lk), t(Hk, Lk)
    if outliers:
        # DiT-like activations: a few channels with large magnitude (K gets a per-channel offset,
        # which smoothing removes; Q gets large channels that stay)
        ch = torch.randperm(D, generator=gen)[: max(1, D // 16)]
        k[..., ch] += 30.0 * torch.randn(len(ch), generator=gen)
        q[..., ch] *= 8.0
        k = k * 0.25
    q, k, v = (x.to(dtype).to(device) for x in (q, k, v))
    if layout == "bld":
        q, k, v = (x.transpose(1, 2).reshape(B, x.shape[2], -1) for x in (q, k, v))
    return q, k, v


def make_mask(kind, ndim, B, H, Lq, Lk, gen, device="cpu"):
    if kind == "none":
        return None
    shape = {1: (Lk,), 2: (Lq, Lk), 3: (B, Lq, Lk), 4: (B, H, Lq, Lk), -4: (1, 1, Lq, Lk)}[ndim]
    if kind == "bool":
        return (torch.rand(shape, generator=gen) > 0.3).to(device)
    m = torch.randn(shape, generator=gen) * 2
    m[torch.rand(shape, generator=gen) < 0.2] = float("-inf")
    m[torch.rand(shape, generator=gen) < 0.1] = -torch.finfo(torch.float32).max
    return m.to(device)


def check(out, ref, dtype, mode, what=""):
    assert not torch.isnan(out).any() and not torch.isinf(out).any(), f"NaN/inf in output {what}"
    o, r = out.double(), ref.double()
    if mode == "exact":
        err = ((o - r).norm() / r.norm().clamp_min(1e-12)).item()
        assert err <= EXACT_TOL[dtype], f"rel err {err:.3g} > {EXACT_TOL[dtype]} {what}"
    else:
        if r.norm() == 0:
            assert o.abs().max() == 0
            return
        cos = torch.nn.functional.cosine_similarity(o.flatten(), r.flatten(), dim=0).item()
        assert cos >= INT8_COS, f"cos {cos:.6f} < {INT8_COS} {what}"
        n = (o.norm() / r.norm()).item()  # (a cosine does not see a constant factor)
        assert abs(n - 1) < NORM_TOL, f"|out| / |ref| {n:.4f} {what}"


def run_case(B, H, group, Lq, Lk, D, dtype, layout, out_layout, mode, mask_kind, mask_ndim, causal, scale,
             cfg, seed, poison, outliers=False, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    Hk = H // group
    q, k, v = make_qkv(B, H, Hk, Lq, Lk, D, dtype, layout, gen, device, outliers)
    mask = make_mask(mask_kind, mask_ndim, B, H, Lq, Lk, gen, device)
    shape = (B, H, Lq, D) if out_layout == "bhld" else (B, Lq, H * D)
    out = poison(torch.empty(shape, dtype=dtype, device=device))
    res = A.attention(q, k, v, H, mask=mask, layout=layout, out_layout=out_layout, scale=scale, mode=mode,
                      causal=causal, config=cfg, out=out)
    assert res is out
    ref = A.attention_reference(q, k, v, H, mask=mask, layout=layout, out_layout=out_layout, scale=scale,
                                causal=causal)
    check(out, ref, dtype, mode, f"B{B} H{H}/{Hk} Lq{Lq} Lk{Lk} D{D} {dtype} {layout}->{out_layout} {mode} "
                                 f"mask={mask_kind}/{mask_ndim} causal={causal} scale={scale} cfg={cfg}")
    return out, ref


@settings(max_examples=14, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(B=st.integers(1, 2), H=st.sampled_from([1, 2, 4]), gqa=st.booleans(),
       Lq=st.integers(1, 70), Lk=st.integers(1, 70), D=st.sampled_from([16, 24, 40, 64, 80, 96]),
       dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]),
       layout=st.sampled_from(["bld", "bhld"]), out_same=st.booleans(), mode=st.sampled_from(["exact", "int8"]),
       mask=st.sampled_from(["none", "bool", "add"]), mask_ndim=st.sampled_from([1, 2, 3, 4, -4]),
       causal=st.booleans(), custom_scale=st.booleans(), cfg=st.sampled_from(CPU_CFGS),
       seed=st.integers(0, 2 ** 16))
def test_interpreter_matches_float64(B, H, gqa, Lq, Lk, D, dtype, layout, out_same, mode, mask, mask_ndim, causal,
                                     custom_scale, cfg, seed, poison):
    group = 2 if (gqa and H > 1) else 1
    out_layout = layout if out_same else ("bhld" if layout == "bld" else "bld")
    scale = 0.37 / math.sqrt(D) if custom_scale else None
    run_case(B, H, group, Lq, Lk, D, dtype, layout, out_layout, mode, mask, mask_ndim, causal, scale, cfg, seed,
             poison)


@pytest.mark.parametrize("D", [40, 80, 128, 160, 256])
def test_head_sizes_of_real_models(D, poison):
    # SD1.5 40/80/160, Flux 128, 256 (padded up to the next power of two inside the kernel)
    run_case(1, 2, 1, 33, 47, D, torch.float16, "bld", "bld", "exact", "none", 1, False, None, (16, 16, 4, 1), D,
             poison)
    run_case(1, 2, 1, 33, 47, D, torch.bfloat16, "bhld", "bld", "int8", "none", 1, False, None, (16, 16, 4, 1), D,
             poison)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_int8_with_outliers(dtype, poison):
    run_case(1, 2, 1, 64, 96, 64, dtype, "bhld", "bhld", "int8", "none", 1, False, None, (32, 32, 4, 1), 7, poison,
             outliers=True)
    run_case(1, 2, 1, 64, 96, 64, dtype, "bhld", "bhld", "exact", "none", 1, False, None, (32, 32, 4, 1), 7, poison,
             outliers=True)


def cos_stats(out, ref):
    """(global cosine, worst row cosine, all finite, |out| / |ref|) of (..., D) outputs. A cosine does not
    see a constant factor (an fp8 output divided by 448 once too often read cos 0.9993): the norm ratio
    does."""
    o, r = out.double(), ref.double()
    o2, r2 = o.reshape(-1, o.shape[-1]), r.reshape(-1, r.shape[-1])
    g = torch.nn.functional.cosine_similarity(o.flatten(), r.flatten(), dim=0).item()
    rows = torch.nn.functional.cosine_similarity(o2, r2, dim=-1).min().item()
    return g, rows, bool(torch.isfinite(out).all()), (o.norm() / r.norm()).item()


# the 8-bit outputs' norm against the reference's: their relative errors are 1-4 %
NORM_TOL = 0.1


def make_8bit_inputs(B, H, L, D, dtype, kind, seed, device="cpu"):
    """(B, H, L, D) q, k, v: "normal" or "outliers" (DiT-like: large Q channels, K and V channels
    with big offsets, one V channel 20x the others)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=gen) for _ in range(3))
    if kind == "outliers":
        ch = torch.randperm(D, generator=gen)[: max(1, D // 16)]
        k[..., ch] += 30.0 * torch.randn(len(ch), generator=gen)
        q[..., ch] *= 8.0
        k = k * 0.25
        v[..., ch] += 5.0 * torch.randn(len(ch), generator=gen)
        v[..., ch[0]] *= 20.0
    return tuple(x.to(dtype).to(device) for x in (q, k, v))


EIGHT_BIT_GOAL = (0.999, 0.995)  # global cosine, worst-row cosine vs float64


@pytest.mark.parametrize("kind", ["normal", "outliers"])
@pytest.mark.parametrize("D", [64, 128])
def test_fp8_pv_arithmetic_meets_the_accuracy_goal(kind, D):
    # The fp8 P·V path needs fp8 MMA (sm89+); the interpreter's float8 conversions are not the
    # hardware's, so its arithmetic is checked here through the torch emulation (the GPU test
    # below checks the kernel against the same emulation and the float64 reference).
    q, k, v = make_8bit_inputs(1, 3, 640, D, torch.bfloat16, kind, 5 + D)
    ref = A.attention_reference(q, k, v, layout="bhld")
    for pv in ("fp8", "half"):
        out = A.attention_8bit_emulated(q, k, v, pv=pv)
        g, rows, finite, n = cos_stats(out, ref)
        assert finite and g >= EIGHT_BIT_GOAL[0] and rows >= EIGHT_BIT_GOAL[1], (pv, kind, D, g, rows)
        assert abs(n - 1) < NORM_TOL, (pv, kind, D, n)


@pytest.mark.parametrize("layout, L, perm", [("bhld", 300, False), ("bld", 300, True), ("bhld", 40, False)])
def test_prepass_kernel(layout, L, perm):
    # quant_qkv_kernel alone, in one launch: int8 Q a row, int8 K smoothed by the mean of its sampled
    # keys a block, fp8 Vᵀ a V block (its scale a power of two from the block's max |v|), each against torch on
    # fresh data; every output poisoned first, the padding past L and past the head size written as 0
    gen = torch.Generator().manual_seed(L)
    B, H, D, bd, bn = 2, 3, 40, 64, 32
    q = torch.randn(B, H, L, D, generator=gen).to(torch.bfloat16)
    k = (torch.randn(B, H, L, D, generator=gen) + 3 * torch.randn(D, generator=gen)).to(torch.bfloat16)
    v = torch.randn(B, H, L, D, generator=gen).to(torch.bfloat16)
    v[1, 2, L - 3, 7] = -50.0  # one block's scale from an outlier

    def strided(x):
        if layout == "bhld":
            return x, (x.stride(0), x.stride(1), x.stride(2))
        y = x.transpose(1, 2).contiguous().view(B, L, H, D)
        return y, (y.stride(0), y.stride(2), y.stride(1))
    (qx, sq), (kx, sk), (vx, sv) = strided(q), strided(k), strided(v)
    vb = A.V_BLOCK.value
    n_vb = -(-L // vb)
    nkb = -(-L // bn)
    qi, qs = torch.full((B, H, L, bd), 77, dtype=torch.int8), torch.full((B, H, L), float("nan"))
    ki, ks = torch.full((B, H, L, bd), 77, dtype=torch.int8), torch.full((B, H, nkb), float("nan"))
    vf = torch.full((B, H, bd, n_vb * vb), 3.0).to(torch.float8_e4m3fn)
    vs = torch.full((B, H, n_vb), float("nan"))
    nq, nk, nv = -(-L // 16) * B * H, nkb * B * H, n_vb * B * H
    mult = D ** -0.5 * A.LOG2E
    with A._interpreted_device_calls("cpu"):
        A.kernel_for(A.quant_qkv_kernel, "cpu")[(nq + nk + nv,)](
            qx, kx, vx, qi, qs, ki, ks, vf, vs, L, L, H, H, nq, nk, mult, *sq, *sk, *sv,
            HEAD_DIM=D, BLOCK_D=bd, BLOCK_LQ=16, BLOCK_LK=bn, FP8_V=True, INT64=False, PERM_V=perm)
    x = q.double() * mult
    want_qs = x.abs().amax(-1) / 127
    assert torch.allclose(qs.double(), want_qs, rtol=1e-6)
    assert (qi[..., :D].double() - x / want_qs[..., None]).abs().max() <= 0.5 + 1e-3
    assert qi[..., D:].abs().max() == 0
    rows = (torch.arange(A.K_MEAN_ROWS.value) * L) // A.K_MEAN_ROWS.value
    kc = k.double() - k.double()[:, :, rows].mean(2, keepdim=True)
    kb = torch.nn.functional.pad(kc, (0, 0, 0, nkb * bn - L)).view(B, H, nkb, bn, D)
    want_ks = kb.abs().amax((-1, -2)) / 127
    assert torch.allclose(ks.double(), want_ks, rtol=1e-5)
    kq = ki[..., :D].double().view(B, H, -1, D)
    assert (kq - kc / want_ks.repeat_interleave(bn, 2)[:, :, :L, None]).abs().max() <= 0.5 + 1e-2
    assert ki[..., D:].abs().max() == 0
    vpad = torch.nn.functional.pad(v.double(), (0, 0, 0, n_vb * vb - L)).view(B, H, n_vb, vb, D)
    # the block's scale: the least power of two 2^e with 448 · 2^e ≥ max |v| (e as a float)
    amax = vpad.abs().amax((-1, -2))
    assert torch.equal(vs, A.v_block_exponents(amax)) and vs[1, 2, -1] == -3  # 50 / 448 -> 2^-3
    assert (448 * torch.exp2(vs.double()) >= amax).all() and (448 * torch.exp2(vs.double() - 1) < amax).all()
    want_vs = torch.exp2(vs.double())
    got = vf.float().view(B, H, bd, -1)
    if perm:  # key r is stored at column f(r) within each 32 (attention_hopper._p_operand's order)
        r = torch.arange(n_vb * vb)
        got = got[..., (r & ~15) | (r & 1) | ((r >> 2) & 2) | ((r << 1) & 12)]
    got = got.view(B, H, bd, n_vb, vb).permute(0, 1, 3, 4, 2)
    want = vpad / want_vs[..., None, None]
    # The interpreter's fp32 -> e4m3 conversion is not the hardware's (it keeps the sign and the binade
    # but not the mantissa); the GPU tests check the rounding. Here: every key in its place, in range.
    big = want.abs() >= 2.0 ** -6
    g, w = got[..., :D].double()[big], want[big]
    assert (torch.sign(g) == torch.sign(w)).all() and (g.abs() <= w.abs() * (1 + 2.0 ** -4)).all()
    assert (g.abs() >= w.abs() / 2 * (1 - 2.0 ** -4)).all() and got.abs().max() <= 448
    assert (got[..., :D][want == 0] == 0).all()
    assert got[..., D:].abs().max() == 0


def test_emulation_matches_the_int8_kernel():
    # the emulation's int8 Q·K and online softmax are the kernel's (P·V in the input dtype here)
    q, k, v = make_8bit_inputs(1, 2, 96, 64, torch.float16, "outliers", 9)
    out = A.attention(q, k, v, layout="bhld", mode="int8", config=(32, 32, 4, 1), pv="half")
    emu = A.attention_8bit_emulated(q, k, v, block_n=32, pv="half")
    err = ((out.double() - emu.double()).norm() / emu.double().norm()).item()
    assert err < 2e-3, err



def _int8_call_with_scores(q, k, v, qk_offset, poison, **kw):
    """8-bit mode with the kernel's int32 scores read through the offset (QK_OFFSET, the default) or
    converted one by one."""
    launch, formed = A.launch_kernel, []

    def with_form(kernel, grid, *args, **kwargs):
        if kwargs.get("INT8") and "PV_MODE" in kwargs:
            kwargs["QK_OFFSET"] = qk_offset
            formed.append(qk_offset)
        return launch(kernel, grid, *args, **kwargs)

    A.launch_kernel = with_form
    try:
        out = poison(torch.empty_like(q))
        A.attention(q, k, v, layout="bhld", mode="int8", config=(32, 32, 4, 1, 0), out=out, **kw)
    finally:
        A.launch_kernel = launch
    assert formed == [qk_offset]  # the attention kernel's one launch took the form
    return out


@pytest.mark.parametrize("case", ["outliers", "extreme", "masked"])
def test_int8_scores_through_the_offset_equal_the_converted_ones(case, poison):
    # the int32 Q·Kᵀ accumulated onto 1.5·2^23's bits reads as float score + offset with no conversion; the
    # largest scores int8 allows (127·127 over 256 channels, either sign) stay in the offset's binade
    if case == "extreme":
        D, L = 256, 70
        q = torch.full((1, 2, 40, D), 3.0, dtype=torch.float16)
        sign = torch.where(torch.arange(L) % 3 == 0, 1.0, -1.0)
        k = (2.0 * sign[None, None, :, None]).expand(1, 2, L, D).to(torch.float16).contiguous()
        v = torch.randn(1, 2, L, D, generator=torch.Generator().manual_seed(4)).to(torch.float16)
    else:
        D, L = 64, 83  # a partial last key block: the masked pass's scores too
        q, k, v = make_8bit_inputs(1, 2, L, D, torch.float16, "outliers", 11)
    kw = {}
    if case == "masked":
        keep = torch.rand(L, L, generator=torch.Generator().manual_seed(2)) > 0.3
        keep[:, 0] = True
        kw["mask"] = keep
    offset = _int8_call_with_scores(q, k, v, True, poison, **kw)
    converted = _int8_call_with_scores(q, k, v, False, poison, **kw)
    ref = A.attention_reference(q, k, v, layout="bhld", **kw)
    for out in (offset, converted):
        g, rows, finite, n = cos_stats(out, ref)
        assert finite and g >= EIGHT_BIT_GOAL[0] and rows >= EIGHT_BIT_GOAL[1] and abs(n - 1) < NORM_TOL, \
            (case, g, rows, n)
    # the two forms differ only by the rounding of the offset's row term in the softmax's FMA
    diff = (offset.double() - converted.double()).abs().max().item()
    assert diff <= 1e-3 * ref.double().abs().max().item(), diff

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_f16acc_pv_variant(dtype, poison):
    # opt-in fp16-accumulate P·V (GeForce Ampere/Ada run it at twice the fp32-accumulate rate)
    for kind in ("normal", "outliers"):
        q, k, v = make_8bit_inputs(1, 2, 80, 64, dtype, kind, 3)
        out = poison(torch.empty_like(q))
        A.attention(q, k, v, layout="bhld", mode="int8", config=(32, 32, 4, 1), pv="f16acc", out=out)
        g, rows, finite, n = cos_stats(out, A.attention_reference(q, k, v, layout="bhld"))
        assert finite and g >= EIGHT_BIT_GOAL[0] and rows >= EIGHT_BIT_GOAL[1] and abs(n - 1) < NORM_TOL, \
            (kind, g, rows, n)


def test_pv_argument_checks():
    q = torch.zeros(1, 1, 16, 16, dtype=torch.float16)
    # a variant needs out= (the custom op carries four ints); it used to be dropped, and the default kernel
    # compiled at the Gluon kernel's block config failed deep in Triton
    with pytest.raises(ValueError, match="needs out="):
        A.attention(q, q, q, layout="bhld", config=(192, 128, 4, 2, A.GLUON_WS))
    with pytest.raises(ValueError, match="config must be"):
        A.attention(q, q, q, layout="bhld", config=(16, 16, 4))
    with pytest.raises(ValueError, match="fp8 MMA"):
        A.attention(q, q, q, layout="bhld", mode="int8", pv="fp8")
    with pytest.raises(ValueError, match="mode='int8' only"):
        A.attention(q, q, q, layout="bhld", mode="exact", pv="f16acc")
    with pytest.raises(ValueError, match="pv must be one of"):
        A.attention(q, q, q, layout="bhld", mode="int8", pv="fp4")
    # auto leaves 16-bit and fp8 P·V to the timing where the GPU has fp8 MMA (16-bit first on
    # datacenter Hopper/Blackwell, fp8 first on GeForce Ada/Blackwell); one mode elsewhere
    assert A.pv_modes_for("auto", 90, True) == (0, 1) and A.pv_modes_for("auto", 100, True) == (0, 1)
    assert A.pv_modes_for("auto", 89, True) == (1, 0) and A.pv_modes_for("auto", 120, True) == (1, 0)
    assert A.pv_modes_for("fp8", 90, True) == (1,) and A.pv_modes_for("half", 120, True) == (0,)
    assert A.pv_modes_for("auto", 86, True) == (0,) and A.pv_modes_for("auto", None, True) == (0,)
    assert A.pv_modes_for("auto", 90, False) == (0,) and A.pv_modes_for("f16acc", 86, True) == (2,)
    assert A.pv_modes_for("auto", 89, True)[0] == 1 and A.pv_modes_for("auto", 90, True)[0] == 0


@pytest.mark.parametrize("env, cc, dtype, want", [
    (None, 90, torch.bfloat16, (0, 1)), ("auto", 120, torch.float16, (0, 1)), ("0", 90, torch.bfloat16, (0,)),
    ("1", 90, torch.bfloat16, (1,)), ("ws", 100, torch.float16, (2,)), (None, 89, torch.bfloat16, (0,)),
    ("1", 86, torch.float16, (0,)), (None, 90, torch.float32, (0,)), (None, None, torch.float16, (0,))])
def test_tma_variants_follow_the_environment_and_the_arch(env, cc, dtype, want, monkeypatch):
    if env is None:
        monkeypatch.delenv(A.TMA_ENV, raising=False)
    else:
        monkeypatch.setenv(A.TMA_ENV, env)
    assert A.tma_variants_for(cc, dtype) == want


def test_a_bad_tma_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(A.TMA_ENV, "maybe")
    with pytest.raises(ValueError, match="TRITONKIT_ATTN_TMA must be auto, 0, 1, gluon or ws"):
        A.tma_variants_for(90, torch.bfloat16)


def test_variant_candidates_carry_each_variants_own_configs():
    both = A.variant_candidates(90, 128, 2, True, (0, 1))
    assert [c[:4] for c in both if c[4] == 0] == A.candidates(90, 128, 2, True)
    assert [c[:4] for c in both if c[4] == 1] == A.candidates(90, 128, 2, "int8-fp8pv")
    assert both[0][4] == 0 and both[-1][4] == 1  # the default variant's configs first
    ws = A.variant_candidates(90, 64, 2, False, (A.TMA_WS,))
    assert ws and all(c[2] == 8 and c[4] == A.TMA_WS for c in ws)  # 4-warp WS configs abort Triton 3.6
    # the opt-in warp specialisation keeps the pointer table's 8-warp configs that leave room for its
    # buffers: (128, 128, 8, 3) overflowed the shared memory with them (263 KB, H200)
    ws128 = [c[:4] for c in A.variant_candidates(90, 128, 2, False, (A.TMA_WS,))]
    assert ws128 and set(ws128) < {c for c in A.candidates(90, 128, 2, False) if c[2] == 8}
    assert (128, 128, 8, 3) not in ws128
    tma = A.variant_candidates(90, 64, 2, False, (A.TMA_OFF, A.TMA_ON))
    assert {c[4] for c in tma} == {0, 1} and [c[:4] for c in tma if c[4] == 1] == A.candidates(90, 64, 2, "exact-tma")
    assert [c[:4] for c in tma if c[4] == 0] == A.candidates(90, 64, 2, False)
    # TMA for K / V alone (a padded head: Q through pointers) keeps the pointer loads' configs
    kv = A.variant_candidates(90, 64, 2, False, (A.TMA_OFF, A.TMA_ON), q_tma=False)
    assert [c[:4] for c in kv if c[4] == 1] == A.candidates(90, 64, 2, False)
    assert A.candidates(90, 128, 2, "exact-tma") != A.candidates(90, 128, 2, False)


def test_cross_attention_sd_context(poison):
    # SD1.5 attn2: 8 heads of 40 over 77 text tokens, L_q not a block multiple
    run_case(2, 8, 1, 72, 77, 40, torch.float16, "bld", "bld", "exact", "none", 1, False, None, None, 1, poison)
    run_case(2, 8, 1, 72, 77, 40, torch.float16, "bld", "bld", "int8", "none", 1, False, None, None, 1, poison)


def test_fully_masked_rows_give_zero_not_nan(poison):
    B, H, L, D = 1, 2, 20, 16
    gen = torch.Generator().manual_seed(0)
    q, k, v = make_qkv(B, H, H, L, L, D, torch.float16, "bhld", gen)
    mask = torch.ones(L, L, dtype=torch.bool)
    mask[3] = False
    for mode in A.MODES:
        out = poison(torch.empty(B, H, L, D, dtype=torch.float16))
        A.attention(q, k, v, mask=mask, layout="bhld", mode=mode, config=(16, 16, 4, 1), out=out)
        assert not out.isnan().any()
        assert out[:, :, 3].abs().max() == 0
    add = torch.zeros(L, L)
    add[5] = float("-inf")
    out = poison(torch.empty(B, H, L, D, dtype=torch.float16))
    A.attention(q, k, v, mask=add, layout="bhld", config=(16, 16, 4, 1), out=out)
    assert not out.isnan().any() and out[:, :, 5].abs().max() == 0


def test_hunyuan_style_additive_mask(poison):
    # (1, 1, L) additive mask with -finfo.max on padded text positions, bf16 model
    B, H, L, D = 1, 2, 40, 32
    gen = torch.Generator().manual_seed(3)
    q, k, v = make_qkv(B, H, H, L, L, D, torch.bfloat16, "bhld", gen)
    mask = torch.zeros(1, 1, L, dtype=torch.bfloat16)
    mask[..., 30:] = -torch.finfo(torch.bfloat16).max
    for mode in A.MODES:
        out = poison(torch.empty(B, H, L, D, dtype=torch.bfloat16))
        A.attention(q, k, v, mask=mask, layout="bhld", mode=mode, config=(16, 16, 4, 1), out=out)
        check(out, A.attention_reference(q, k, v, mask=mask, layout="bhld"), torch.bfloat16, mode)


def test_int64_offsets_path(poison, monkeypatch):
    # The 64-bit row offsets (B·H·L·D past 2**31 on a GPU) run here with the threshold lowered.
    monkeypatch.setattr(A, "INT64_THRESHOLD", 1)
    for mode in A.MODES:
        run_case(2, 2, 2, 37, 29, 40, torch.float16, "bld", "bhld", mode, "add", 3, True, None, (16, 16, 4, 1), 5,
                 poison)


@pytest.fixture
def tma_launches(monkeypatch):
    """Exact mode's TMA path forced in the interpreter; collects (USE_TMA, Q_TMA) of every attention launch."""
    monkeypatch.setattr(A, "TMA_IN_INTERPRETER", True)
    monkeypatch.setenv("TRITONKIT_ATTN_TMA", "1")
    flags = []
    real_launch = A.launch_kernel

    def spy(kern, grid, *args, **kw):
        flags.append((kw["USE_TMA"], kw["Q_TMA"]))
        return real_launch(kern, grid, *args, **kw)
    monkeypatch.setattr(A, "launch_kernel", spy)
    return flags


@pytest.mark.parametrize("layout", ["bld", "bhld"])
@pytest.mark.parametrize("D", [40, 64])
def test_tma_tile_addressing_in_the_interpreter(layout, D, poison, tma_launches):
    # Exact mode's TMA path (opt-in, sm90+): K / V tiles through 2-D tensor descriptors, head and
    # batch offsets as row / column coordinates, padding columns and rows past L_k from the
    # neighbouring head (bld) or the zero fill (bhld). GQA, a mask and causal on top.
    flags = tma_launches
    for dtype in (torch.float16, torch.bfloat16):
        run_case(2, 4, 2, 37, 45, D, dtype, layout, layout, "exact", "bool", 2, True, None, (16, 16, 4, 1), D,
                 poison)
    # Q comes through TMA too where the head needs no padding (a padded tile would read the next head)
    assert flags and set(flags) == {(True, D == A.block_d_for(D))}
    gen = torch.Generator().manual_seed(1)
    q, k, v = make_qkv(1, 2, 2, 20, 20, D, torch.float16, layout, gen)
    kv = A._tma_view(*(A._split(x, 2, layout == "bhld")[0] for x in (k, v)), 1, 2, 20, D, layout == "bhld")
    assert kv and kv[2] == kv[3] == ((40, 20, 0) if layout == "bhld" else (20, 0, D))


@pytest.mark.parametrize("layout", ["bld", "bhld"])
@pytest.mark.parametrize("D", [40, 64])
def test_tma_reads_k_and_v_that_fold_into_rows_of_their_own(layout, D, poison, tma_launches):
    # Flux's single blocks hand V over as a view into their fused QKV + MLP projection (rows of 3·H·D + MLP
    # elements, heads side by side) beside contiguous Q / K copies. Here K is a view into another projection laid
    # out per head ((B, L, H, 3, D): heads 3·D apart) and V one like Flux's: each gets its own TMA coordinates.
    B, H, L = 2, 2, 37
    gen = torch.Generator().manual_seed(D)
    for dtype in (torch.float16, torch.bfloat16):
        flux = torch.randn(B, L, 3 * H * D + 24, generator=gen).to(dtype)  # QKV, then (part of) the MLP's input
        per_head = torch.randn(B, L, H, 3, D, generator=gen).to(dtype)
        q = torch.randn(B, H, L, D, generator=gen).to(dtype)
        k = per_head[:, :, :, 1].transpose(1, 2)
        v = flux[..., :3 * H * D].view(B, L, 3, H, D)[:, :, 2].transpose(1, 2)
        if layout == "bld":
            q, k, v = (x.transpose(1, 2).flatten(2) for x in (q, k, v))
        bhld = layout == "bhld"
        k4, v4 = (A._split(x, H, bhld)[0] for x in (k, v))
        kd, vd = A._tma_view2d(k4, B, H, L, D, bhld), A._tma_view2d(v4, B, H, L, D, bhld)
        # ((B, L, H·D) can't hold K's per-head layout: flatten copied it)
        assert kd[1] == (L, 0, 3 * D if bhld else D) and vd[1] == (L, 0, D), (kd[1], vd[1])
        assert kd[0].stride(0) == (3 if bhld else 1) * H * D and vd[0].stride(0) == 3 * H * D + 24
        shape = (B, H, L, D) if bhld else (B, L, H * D)
        out = poison(torch.empty(shape, dtype=dtype))
        A.attention(q, k, v, H, layout=layout, mode="exact", config=(16, 16, 4, 1), out=out)
        check(out, A.attention_reference(q, k, v, H, layout=layout), dtype, "exact", f"{layout} D{D} {dtype}")
    assert tma_launches and {use_tma for use_tma, _ in tma_launches} == {True}


def test_operands_that_do_not_fold_into_rows():
    # what the TMA paths can't read: a window of a longer sequence (a batch is not L rows), heads overlapping in a
    # row, rows not 16-byte aligned; a size-1 batch's stride is anyone's
    x = torch.randn(2, 3, 40, 16)
    assert A._row_fold(x, 3, 40, 16, True) == (16, (120, 40, 0), 16)
    assert A._row_fold(x[:, :, :32], 3, 32, 16, True) is None
    assert A._row_fold(x[:1, :, :32], 3, 32, 16, True) is None  # heads still 40 rows apart
    y = torch.randn(2, 40, 3, 16).transpose(1, 2)  # (B, H, L, D), heads side by side
    assert A._row_fold(y, 3, 40, 16, True) == (48, (40, 0, 16), 48)
    assert A._row_fold(y[:, 1:, :, :8], 2, 40, 8, True) == (48, (40, 0, 16), 24)
    assert A._row_fold(y[:, :, :32], 3, 32, 16, True) is None
    assert A._row_fold(y[:1, :, :32], 3, 32, 16, True) == (48, (32, 0, 16), 48)
    assert A._row_fold(torch.randn(2, 40, 40).as_strided((2, 3, 40, 16), (1600, 8, 40, 1)), 3, 40, 16, True) is None
    assert A._row_fold(torch.randn(2, 3, 40, 20).half()[..., :16], 3, 40, 16, True) is None  # rows of 40 bytes


def test_layouts_match_each_other():
    gen = torch.Generator().manual_seed(11)
    q, k, v = make_qkv(2, 3, 3, 19, 23, 16, torch.float16, "bhld", gen)
    a = A.attention(q, k, v, layout="bhld", out_layout="bld", config=(16, 16, 4, 1))
    bl = [x.transpose(1, 2).reshape(2, x.shape[2], -1) for x in (q, k, v)]
    b = A.attention(*bl, 3, layout="bld", config=(16, 16, 4, 1))
    assert torch.equal(a, b)


def test_default_cpu_config_and_arch_tables():
    assert A.choose_config(torch.device("cpu"), None, torch.float16, 64, False, 0, False, 10, 10) == A.CPU_CONFIG + (0,)
    for cc in ARCHS:
        for bd in (16, 32, 64, 128, 256):
            for int8 in (False, True):
                for in_bytes in (2, 4):
                    cands = A.candidates(cc, bd, in_bytes, int8)
                    assert cands
                    for bm, bn, nw, ns in cands:
                        assert bm & (bm - 1) == 0 and bn & (bn - 1) == 0 and nw in (4, 8) and ns >= 1
    assert A.supported_dtypes(75) == (torch.float16,)
    assert not A.int8_supported(75) and A.int8_supported(80) and A.int8_supported(None)
    assert torch.bfloat16 in A.supported_dtypes(86) and torch.bfloat16 in A.supported_dtypes(None)


def test_check_supported_reasons():
    q = torch.zeros(1, 4, 64, dtype=torch.float16)
    assert A.check_supported(q, q, q, 2, False) is None
    assert A.check_supported(q, q, q, 3, False).startswith("q width")
    assert "head size 320" in A.check_supported(torch.zeros(1, 4, 640, dtype=torch.float16),
                                                torch.zeros(1, 4, 640, dtype=torch.float16),
                                                torch.zeros(1, 4, 640, dtype=torch.float16), 2, False)
    d = torch.zeros(1, 4, 64, dtype=torch.float64)
    assert "dtype torch.float64" in A.check_supported(d, d, d, 2, False)
    assert "mask dtype" in A.check_supported(q, q, q, 2, False, mask=torch.zeros(4, 4, dtype=torch.int32))
    assert "mask shape" in A.check_supported(q, q, q, 2, False, mask=torch.zeros(4, 5))
    assert A.check_supported(q, q, q, 2, False, mask=torch.zeros(1, 4, 4)) is None
    assert A.check_supported(q, q, q, 2, False, mode="fp4").startswith("unknown mode")


_CUSTOM_OP_SCRIPT = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
import conftest  # noqa: F401  (the tritonkit package)
from tritonkit.kernels import attention as A
from test_attention import make_qkv
gen = torch.Generator().manual_seed(2)
q, k, v = make_qkv(1, 2, 2, 24, 20, 16, torch.float16, "bld", gen)
mask = torch.rand(24, 20, generator=gen) > 0.2

def f(q, k, v, mask):
    return A.attention(q * 1.0, k, v, 2, mask=mask, config=(16, 16, 4, 1)) + 1.0

compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v, mask)  # fullgraph: no graph break
eager = f(q, k, v, mask)
assert torch.equal(eager, compiled)
torch.library.opcheck(torch.ops.tritonkit.attention.default,
                      (q, k, v, mask, 2, False, True, None, False, False, 16, 16, 4, 1, "auto"),
                      test_utils=("test_schema", "test_faketensor"))
print("custom op ok")
"""


def test_custom_op_fake_and_compile():
    # In its own process, as before the cause of the dispatcher crashes it once avoided was found (a second
    # copy of the pack redefining the op: the test below).
    import subprocess
    import sys
    from pathlib import Path
    r = subprocess.run([sys.executable, "-c", _CUSTOM_OP_SCRIPT, str(Path(__file__).parent)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "custom op ok" in r.stdout, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])


_SECOND_COPY_SCRIPT = r"""
import sys, types, torch
import torch._library.custom_ops as co
sys.path.insert(0, sys.argv[1])
defined = []
orig = co.get_library_allowing_overwrite
def counting(ns, name):
    defined.append((ns, name))
    return orig(ns, name)
co.get_library_allowing_overwrite = counting
import conftest  # noqa: F401  (the tritonkit package)
from tritonkit.kernels import attention as A
from test_attention import make_qkv
pkg = types.ModuleType("tritonkit_second_copy")
pkg.__path__ = [sys.argv[2]]
sys.modules["tritonkit_second_copy"] = pkg
import importlib
A2 = importlib.import_module("tritonkit_second_copy.kernels.attention")
assert A2 is not A
assert defined.count(("tritonkit", "attention")) == 1, defined
assert A._attention_op is A2._attention_op is torch.ops.tritonkit.attention.default
gen = torch.Generator().manual_seed(int(sys.argv[3]))
q, k, v = make_qkv(1, 2, 2, 24, 20, 16, torch.float16, "bld", gen)
def f(q, k, v):
    return A.attention(q * 1.0, k, v, 2, config=(16, 16, 4, 1)) + 1.0
for _ in range(3):  # the first copy's op, called again after the second copy's import
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v)
    ref = A.attention_reference(q, k, v, 2).to(torch.float16) + 1.0
    assert (compiled.float() - ref.float()).abs().max().item() < 2e-2
print("defined once ok")
"""


def test_attention_op_defined_once_when_the_pack_is_imported_twice():
    """A second copy of the pack (pytest imports the repository as a package beside ``tritonkit``; two copies of
    the folder in custom_nodes) reuses the first copy's op: torch.library.custom_op would replace it, and the
    first copy's OpOverload then pointed at freed dispatcher memory (segfaults, std::bad_alloc, vector::reserve
    in the first compiled call; BENCHMARKS.md, thirty-seventh session)."""
    import subprocess
    import sys
    from pathlib import Path
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    r = subprocess.run([sys.executable, "-c", _SECOND_COPY_SCRIPT, str(Path(__file__).parent),
                        str(Path(__file__).parents[1]), str(seed)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "defined once ok" in r.stdout, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])


def _compile_one(job):
    i, cc = job
    kernel, sig, consts, opts = A.COMPILE_SPECS[i]
    try:
        k = compile_for(kernel, sig, consts, cc, opts["num_warps"], opts["num_stages"])
        ptx = k.asm["ptx"]
        fp8_mma = ".f32.e4m3.e4m3" in ptx  # mma.sync (sm89, sm120) or wgmma (sm90)
        tma = "cp.async.bulk.tensor" in ptx
        return i, cc, None, len(k.asm["cubin"]), f"sm_{cc}" in ptx, "wgmma" in ptx, fp8_mma, tma
    except Exception as e:  # noqa: BLE001
        return i, cc, f"{type(e).__name__}: {str(e)[:400]}", 0, False, False, False, False


def test_compiles_for_every_arch():
    """Every COMPILE_SPECS entry for each of its archs, down to the cubin (ptxas included), in a
    pool of one process per core (each compile is seconds of LLVM + ptxas)."""
    jobs = [(i, cc) for i, spec in enumerate(A.COMPILE_SPECS) for cc in spec[3]["archs"]]
    results = map_in_processes(_compile_one, jobs)
    failed = [(i, cc, err) for i, cc, err, *_ in results if err]
    assert not failed, failed
    for i, cc, _, cubin_len, has_arch, wgmma, fp8_mma, tma in results:
        consts = A.COMPILE_SPECS[i][2]
        assert cubin_len > 0 and has_arch, (i, cc)
        if cc == 90 and A.COMPILE_SPECS[i][0] is A.attn_fwd_kernel and consts["HEAD_DIM"] == 128:
            assert wgmma, f"spec {i}: the Hopper kernel should use wgmma"
        if A.COMPILE_SPECS[i][0] is A.attn_fwd_kernel and consts["USE_TMA"]:
            assert tma, f"spec {i} on sm{cc}: K / V should load through TMA"
        if A.COMPILE_SPECS[i][0] is A.attn_fwd_kernel and consts["PV_MODE"] == 1:
            assert fp8_mma, f"spec {i} on sm{cc}: P·V should run as an e4m3 MMA"
    assert len(results) == len(jobs)


def test_sm86_family_int8_candidates_compile_within_its_shared_memory():
    """The int8 configs of the ~100 KB-shared-memory family that COMPILE_SPECS does not cover (only
    each table's first config is there): on sm86 with 16-bit P·V, on sm89 and sm120 with fp8 P·V,
    down to the cubin, inside the family's shared-memory budget and its own estimate. Compiled as the launcher
    specialises aligned tensors (tt.divisibility): only then are K / V pipelined through shared memory."""
    default = A.candidates(86, 128, 2, True)[0]
    extra = [c for c in A.candidates(86, 128, 2, True) if c != default and c[3] >= 3 and c[0] == 128]
    assert (128, 64, 8, 3) in extra and (128, 64, 8, 4) in extra
    for cc, pv in ((86, 0), (89, 1), (120, 1)):
        for cfg in extra:
            kernel, sig, consts, opts = A._spec(torch.bfloat16, True, 128, cfg, (cc,), pv_mode=pv, align8=True)
            aligned = tuple(n for n in sig if (sig[n].startswith("*") or n.startswith("stride_"))
                            and not n.startswith(("stride_m", "stride_qs", "stride_ks")))
            k = compile_for(kernel, sig, consts, cc, opts["num_warps"], opts["num_stages"], divisible=aligned)
            shared = k.metadata.shared
            assert len(k.asm["cubin"]) and shared <= A._SMEM["sm86"], (cc, cfg, shared)
            assert shared <= A._smem_bytes(cfg, 128, 2, True) + 1024, (cc, cfg, shared)  # the estimate holds


@pytest.mark.parametrize("cc, head, perm", [(90, 128, True), (90, 64, True), (89, 128, False)])
def test_prepass_writes_the_fp8_v_copy_with_vector_stores(cc, head, perm):
    """The fp8 Vᵀ copy's stores are 16-byte vectors, the Gluon kernel's key order (PERM_V) included: with
    the keys relabelled at the store, each key went out as a byte (st.global.b8), twice the pre-pass's
    time at SDXL on an H200 (BENCHMARKS.md, forty-second session). Compiled as the launcher specialises real
    calls: aligned pointers and row strides."""
    (kernel, sig, consts, _), = A._prep_specs("bf16", True, (cc,))
    consts = dict(consts, HEAD_DIM=head, BLOCK_D=head, BLOCK_LQ=64, BLOCK_LK=128, INT64=False, ALIGN8_Q=False,
                  ALIGN8_K=False, ALIGN8_V=False, PERM_V=perm)
    aligned = [n for n in sig if sig[n].startswith("*")] + [f"stride_{t}{d}" for t in "qkv" for d in "bhl"]
    ptx = compile_for(kernel, sig, consts, cc, 4, 1, divisible=tuple(aligned)).asm["ptx"]
    assert "st.global.v4.b32" in ptx and "st.global.b8" not in ptx


def test_the_warp_specialize_request_is_dropped_only_where_tl_range_lacks_it():
    # Triton < 3.4 has no tl.range(warp_specialize=...): the kernel's source loses the request there
    # (tests/test_triton_versions.py compiles it with Triton 3.3); a newer Triton keeps it, once
    want = 1 if A.range_warp_specializes() else 0
    assert want == ("warp_specialize" in inspect.signature(tl.range.__init__).parameters)
    assert A.attn_fwd_kernel.src.count(A.WARP_SPEC_ARG) == want


def test_every_arch_has_specs():
    archs = {cc for spec in A.COMPILE_SPECS for cc in spec[3]["archs"]}
    assert archs == set(ARCHS)


@pytest.mark.skipif("os.environ.get('TRITONKIT_EXHAUSTIVE_COMPILE') != '1'",
                    reason="every candidate block config x arch: minutes of ptxas; set TRITONKIT_EXHAUSTIVE_COMPILE=1")
def test_all_candidate_configs_compile():
    for kernel, sig, consts, opts in A.all_compile_specs():
        for cc in opts["archs"]:
            assert len(compile_for(kernel, sig, consts, cc, opts["num_warps"], opts["num_stages"]).asm["cubin"])


# ----------------------------------------------------------------------------- GPU, real sizes

GPU_CASES = [
    # B, H, group, Lq, Lk, D, layout, mask, mask_ndim, dtype
    (2, 10, 1, 4096, 4096, 64, "bld", "none", 1, torch.float16),      # SDXL
    (1, 24, 1, 4608, 4608, 128, "bhld", "none", 1, torch.bfloat16),   # Flux
    (2, 8, 1, 4096, 77, 40, "bld", "none", 1, torch.float16),         # SD1.5 cross-attention
    (2, 8, 1, 1024, 1024, 80, "bld", "none", 1, torch.bfloat16),      # SD1.5 80
    (2, 8, 1, 256, 256, 160, "bld", "none", 1, torch.float16),        # SD1.5 160
    (1, 4, 1, 1000, 1000, 256, "bhld", "bool", 4, torch.bfloat16),
    (1, 24, 1, 3333, 3333, 128, "bhld", "add", -4, torch.bfloat16),   # HunyuanVideo-style additive mask
    (2, 16, 4, 2048, 2048, 128, "bld", "none", 1, torch.float16),     # GQA
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[f"{c[0]}x{c[1]}x{c[3]}x{c[5]}-{c[7]}" for c in GPU_CASES])
@pytest.mark.parametrize("mode", A.MODES)
def test_cuda_matches_float64(case, mode, poison):
    B, H, group, Lq, Lk, D, layout, mask, mask_ndim, dtype = case
    run_case(B, H, group, Lq, Lk, D, dtype, layout, layout, mode, mask, mask_ndim, False, None, None, 1, poison,
             device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", A.MODES)
def test_cuda_outliers_and_causal(mode, poison):
    run_case(1, 8, 1, 4096, 4096, 128, torch.bfloat16, "bhld", "bhld", mode, "none", 1, False, None, None, 2,
             poison, outliers=True, device="cuda")
    run_case(1, 8, 1, 2000, 2000, 64, torch.float16, "bhld", "bhld", mode, "none", 1, True, None, None, 3,
             poison, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("pv", ["auto", "fp8", "half", "f16acc"])
@pytest.mark.parametrize("kind", ["normal", "outliers"])
@pytest.mark.parametrize("shape", [(2, 10, 4096, 64), (1, 24, 4608, 128), (2, 8, 1024, 40), (1, 4, 1000, 256),
                                   (1, 2, 32760, 128)],
                         ids=lambda s: "x".join(map(str, s)))
def test_cuda_8bit_variants_meet_the_accuracy_goal(shape, kind, pv, poison):
    B, H, L, D = shape
    if pv == "fp8" and not A.fp8_pv_supported(A._device_cc(torch.device("cuda"))):
        pytest.skip("no fp8 MMA on this GPU")
    q, k, v = make_8bit_inputs(B, H, L, D, torch.bfloat16, kind, L + D, device="cuda")
    out = poison(torch.empty_like(q))
    A.attention(q, k, v, layout="bhld", mode="int8", pv=pv, out=out)
    fp8 = pv == "fp8"  # auto's pick is timed (the emulation check covers the forced fp8 runs)
    rows = torch.randperm(L, generator=torch.Generator().manual_seed(0))[:256].cuda()
    ref = A.attention_reference(q[:, :, rows], k, v, layout="bhld")
    g, worst, finite, n = cos_stats(out[:, :, rows], ref)
    assert finite and g >= EIGHT_BIT_GOAL[0] and worst >= EIGHT_BIT_GOAL[1] and abs(n - 1) < NORM_TOL, (g, worst, n)
    if fp8 and B * H * L <= 40000:
        # the fp8 kernel computes what the emulation computes (up to fp32 summation order and the
        # MMA's accumulator precision), for the same key block: K's int8 scales and P's fp8 rounding
        # depend on it (the timed pick above may use 64 or 128 keys a block). Not bit-exact: where
        # the GPU's exp2 and torch's differ next to an e4m3 rounding boundary, P rounds one step
        # (12.5 %) apart. Measured: 0.0050 at head 256, 1000 keys, on both an H100 and an H200; the
        # variant's own error against float64 is ~0.04, a wrong scale or block gives ≥ 0.02.
        for bn in (64, 128):
            out = poison(torch.empty_like(q))
            A.attention(q, k, v, layout="bhld", mode="int8", pv=pv, out=out, config=(64, bn, 4, 1))
            emu = A.attention_8bit_emulated(q.cpu(), k.cpu(), v.cpu(), block_n=bn).to(out.device)
            err = ((out.double() - emu.double()).norm() / emu.double().norm()).item()
            assert err < 1e-2, (bn, err)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", A.MODES)
@pytest.mark.parametrize("layout,shape", [("bld", (2, 10, 1024, 64)), ("bhld", (1, 6, 1500, 128)),
                                          ("bld", (2, 5, 700, 40))])
def test_cuda_replayed_calls_match_the_full_path(layout, shape, mode, monkeypatch):
    """Once a shape class's config is settled, a call with new tensors of the same shapes replays the first
    call's launches (attention._replay): the same bits as the full path on the same inputs, near float64;
    a changed pick, a mask and TRITONKIT_FAST_LAUNCH=0 take the full path."""
    from tritonkit.kernels import fast_launch, tuning
    B, H, L, D = shape
    gen = torch.Generator(device="cuda").manual_seed(5)

    def inputs():
        dims = (B, H, L, D) if layout == "bhld" else (B, L, H * D)
        return [torch.randn(*dims, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3)]

    def call(qkv, mask=None):
        return A.attention(*qkv, H, layout=layout, mode=mode, mask=mask)

    tuning.reset()  # this process's picks forgotten, as in a new process (other tests leave playoffs going)
    for _ in range(1000):  # the first pass and any playoff in the calls (turns of up to 32 calls, repeated)
        call(inputs())
        if not tuning.unsettled():
            break
    torch.cuda.synchronize()
    assert not tuning.unsettled()
    x, y = inputs(), inputs()
    monkeypatch.setenv(fast_launch.ENV, "0")
    full = call(x)
    monkeypatch.setenv(fast_launch.ENV, "1")
    call(y)  # stores the replay (a settled config)
    before = dict(A.REPLAY_COUNTERS)
    replayed = call(x)
    torch.cuda.synchronize()
    assert A.REPLAY_COUNTERS["replayed"] == before["replayed"] + 1
    assert torch.equal(replayed, full)
    ref = A.attention_reference(*x, H, layout=layout).to(torch.float32)
    cos = torch.nn.functional.cosine_similarity(replayed.float().flatten(), ref.flatten(), dim=0)
    assert torch.isfinite(replayed).all() and cos > (0.999 if mode == "int8" else 0.9999), float(cos)
    # a mask: the full path (the replay is for unmasked calls)
    keep = torch.ones(L, dtype=torch.bool, device="cuda")
    keep[-7:] = False
    n = A.REPLAY_COUNTERS["replayed"]
    masked = call(x, mask=keep)
    assert A.REPLAY_COUNTERS["replayed"] == n
    mref = A.attention_reference(*x, H, layout=layout, mask=keep).to(torch.float32)
    assert torch.nn.functional.cosine_similarity(masked.float().flatten(), mref.flatten(), dim=0) > 0.999
    # a changed pick: the full path, which runs the new pick
    key = next(k for k, r in A._REPLAYS.items() if r.cfg == tuning.cache().get(r.skey) and k[4] == x[0].shape)
    r = A._REPLAYS[key]
    others = [c for c in A.variant_candidates(A._device_cc(x[0].device), r.ctx.block_d, 2, r.ctx.int8,
                                              (r.cfg[4],), r.q_tma) if c != r.cfg]
    if others:
        monkeypatch.setitem(tuning.cache(), r.skey, others[0])
        again = call(x)
        assert A.REPLAY_COUNTERS["replayed"] == n
        cos = torch.nn.functional.cosine_similarity(again.float().flatten(), ref.flatten(), dim=0)
        assert cos > (0.999 if mode == "int8" else 0.9999)


@pytest.mark.gpu
@pytest.mark.parametrize("tma", ["1", "ws"])
def test_cuda_exact_tma_path(tma, poison, monkeypatch):
    # the opt-in TMA loads (sm90+; elsewhere this runs the pointer path and checks the same)
    monkeypatch.setenv("TRITONKIT_ATTN_TMA", tma)
    run_case(2, 8, 1, 4096, 4096, 40, torch.float16, "bld", "bld", "exact", "none", 1, False, None, None, 1,
             poison, device="cuda")
    run_case(1, 24, 1, 4608, 4608, 128, torch.bfloat16, "bhld", "bhld", "exact", "none", 1, False, None, None, 2,
             poison, device="cuda")
    run_case(2, 16, 4, 1000, 1100, 128, torch.float16, "bld", "bld", "exact", "bool", 4, True, None, None, 3,
             poison, device="cuda")
    run_case(1, 4, 1, 777, 777, 80, torch.bfloat16, "bhld", "bld", "exact", "add", -4, False, None, None, 4,
             poison, device="cuda")


@pytest.mark.gpu
def test_cuda_64bit_offsets(poison):
    # (B, L, H·D) with L·H·D > 2**31: the last rows sit past the 32-bit range
    B, Lq, Lk, H, D = 1, (1 << 21) + 100, 64, 16, 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Lq, H * D, device="cuda", dtype=torch.float16, generator=gen)
    k = torch.randn(B, Lk, H * D, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn(B, Lk, H * D, device="cuda", dtype=torch.float16, generator=gen)
    for mode in A.MODES:
        out = poison(torch.empty_like(q))
        A.attention(q, k, v, H, mode=mode, out=out)
        tail = slice(Lq - 3000, Lq)
        ref = A.attention_reference(q[:, tail], k, v, H)
        check(out[:, tail], ref, torch.float16, mode, "tail rows")
        head = slice(0, 3000)
        check(out[:, head], A.attention_reference(q[:, head], k, v, H), torch.float16, mode, "head rows")
        del out
    torch.cuda.empty_cache()


@pytest.mark.gpu
def test_cuda_compiled_model_keeps_the_op():
    q = torch.randn(1, 8, 1024, 64, device="cuda", dtype=torch.float16)

    def f(x):
        return A.attention(x * 0.5, x, x, layout="bhld", mode="int8") * 2

    eager = f(q)
    comp = torch.compile(f, fullgraph=True)(q)
    torch.testing.assert_close(comp, eager, rtol=0, atol=0)


@pytest.mark.gpu
def test_cuda_compiled_call_runs_sdpa_while_its_kernels_compile(tmp_path, monkeypatch):
    """A compiled graph's call whose kernels are in no cache (a fresh Triton cache folder, a head size
    no other test compiles) returns SDPA's result while they compile in the background, then the
    kernel's; they are prepared once, from the calling thread."""
    import threading
    import time

    import sys
    monkeypatch.delenv("TRITONKIT_CALIBRATION_DEFER", raising=False)  # the GPU tests' conftest sets it to 0
    if not A.calibration.deferring():
        pytest.skip("this Triton has no asynchronous compiles: the launch compiles, as before")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))
    q, k, v = make_qkv(1, 3, 3, 777, 777, 72, torch.bfloat16, "bld", gen, "cuda")

    def f(q, k, v):
        return A.attention(q, k, v, 3, mode="int8", config=(64, 64, 4, 2))

    ref = A.attention_reference(q, k, v, 3)
    comp = torch.compile(f, fullgraph=True)
    main = threading.get_ident()
    prepared_in, keys = [], []
    # pytest may import the pack twice (as tritonkit and under its folder's name); the op runs the
    # implementation of the copy that registered it first: every copy's prepare module is watched
    copies = {id(m.prepare): m.prepare for name, m in list(sys.modules.items())
              if name.endswith("kernels.attention") and hasattr(m, "prepare")}
    for prepare in copies.values():
        def spy_prepare(fns, orig=prepare.prepare):
            prepared_in.append(threading.get_ident())
            return orig(fns)

        def spy_ready(key, fn, orig=prepare.ready, mod=prepare):
            keys.append((key, mod))
            return orig(key, fn)
        monkeypatch.setattr(prepare, "prepare", spy_prepare)
        monkeypatch.setattr(prepare, "ready", spy_ready)
    first = comp(q, k, v)
    assert keys, (f"the compiled call did not ask prepare.ready (gated: {A._gated(q)}, "
                  f"deferring: {A.calibration.deferring()})")
    key, prepare = keys[0]
    if prepare._READY[key] is True:  # a compile worker's own cache folder held them (an earlier run)
        pytest.skip("the kernels were already in a compile worker's Triton cache")
    check(first, ref, torch.bfloat16, "exact", "the interim SDPA")
    deadline = time.monotonic() + 300
    while prepare._READY[key] is not True and time.monotonic() < deadline:
        comp(q, k, v)
        time.sleep(0.05)
    assert prepare._READY[key] is True, "the kernels did not compile in 300 s"
    out = comp(q, k, v)
    check(out, ref, torch.bfloat16, "int8", "the kernel")
    assert not torch.equal(out, first)  # the 8-bit kernel's result now, not SDPA's
    assert prepared_in == [main]  # prepared once, from the calling thread


# ----------------------------------------------------------------------------- auto's variant choice
# The launcher's choice between kernel variants on a GPU, here on CPU tensors: the arch is faked,
# the kernels are recorders and tuning's timer a fake that answers per variant. What is checked is
# the launcher's side: every variant's configs are timed (each with its whole pre-pass inside the
# timed call), fp8 P·V is taken only when it is FP8_PV_MARGIN faster, TMA when it is faster at
# all, the final launch runs the pick, and a new process reads it from the store without timing.

class _Recorder:
    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        return lambda *a, **kw: self.log.append(("launch", kw))

    def run(self, *a, grid=None, warmup=False, **kw):
        self.log.append(("warm", kw))


class _FakeGPU:
    def __init__(self, monkeypatch, tmp_path, cc, times):
        from tritonkit.kernels import calibration as C
        from tritonkit.kernels import tuning as T
        self.C, self.T, self.log, self.timed, self.times = C, T, [], [], times
        monkeypatch.setenv(C.ENV_DIR, str(tmp_path / "calib"))
        for var in (T.ENV, T.ENV_OLD, A.TMA_ENV):
            monkeypatch.delenv(var, raising=False)
        C.reset()
        T.cache().clear()
        monkeypatch.setattr(A, "_device_cc", lambda dev: cc)
        # the Triton kernel's variants alone (tests/test_attention_hopper.py fakes the Gluon ones)
        monkeypatch.setattr(A.attention_hopper, "gluon_available", lambda: False)
        self.prep = []  # launches of the 8-bit pre-pass kernels
        monkeypatch.setattr(A, "kernel_for", lambda fn, dev_type: _Recorder(self.log) if fn is A.attn_fwd_kernel
                            else _Recorder(self.prep))
        monkeypatch.setattr(T, "time_ms", self.bench)

    def bench(self, device, fn):
        n, p0 = len(self.log), len(self.prep)
        fn()
        kw = self.log[-1][1]
        assert len(self.log) == n + 1 and self.log[-1][0] == "launch"
        if kw["INT8"]:
            # the whole pre-pass (Q / K and, for fp8 P·V, the V copy, one launch) runs inside the
            # timed call, with the BLOCK_N it times
            ((_, quant),) = self.prep[p0:]
            assert quant["FP8_V"] == (kw["PV_MODE"] == 1)
            assert quant["BLOCK_LK"] == kw["BLOCK_N"]
        variant = kw["PV_MODE"] if kw["INT8"] else (2 if kw["WARP_SPEC"] else int(kw["USE_TMA"]))
        self.timed.append((kw["BLOCK_M"], kw["BLOCK_N"], variant))
        return self.times[variant] * (1 + kw["BLOCK_N"] / 1e4)  # the larger block slightly slower

    def new_process(self):
        self.T.cache().clear()
        self.log.clear()
        self.timed.clear()


def _qkv8(L=40, D=64):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, L, D, generator=g).to(torch.float16) for _ in range(3)]


@pytest.mark.parametrize("fp8_speed, want", [(1.01, 0), (1.10, 1)])
def test_auto_takes_fp8_pv_only_when_it_times_enough_faster(fp8_speed, want, monkeypatch, tmp_path):
    gpu = _FakeGPU(monkeypatch, tmp_path, 90, {0: 1.0, 1: 1.0 / fp8_speed})
    q, k, v = _qkv8()
    A._launch(q, k, v, None, 2, True, True, None, True, False)
    assert {t[2] for t in gpu.timed} == {0, 1}
    n = len(A.variant_candidates(90, 64, 2, True, (0, 1)))
    # each once, then the best two and the other variant's best (all within PLAYOFF_WITHIN) again
    assert len(gpu.timed) == n + 3 * gpu.T.PLAYOFF_ROUNDS
    assert {t[2] for t in gpu.timed[n:]} == {0, 1}
    final = gpu.log[-1][1]
    assert gpu.log[-1][0] == "launch" and final["PV_MODE"] == want
    (pick,) = A.tune_cache().values()
    assert pick[4] == want and pick == (final["BLOCK_M"], final["BLOCK_N"], final["num_warps"],
                                        final["num_stages"], want)
    # a new process: the stored pick, no timing
    gpu.new_process()
    A._launch(q, k, v, None, 2, True, True, None, True, False)
    assert gpu.timed == [] and [e[1]["PV_MODE"] for e in gpu.log if e[0] == "launch"] == [want]


@pytest.mark.parametrize("tma_speed, want", [(0.97, A.TMA_OFF), (1.14, A.TMA_ON)])
def test_auto_takes_tma_loads_where_they_time_faster(tma_speed, want, monkeypatch, tmp_path):
    gpu = _FakeGPU(monkeypatch, tmp_path, 90, {0: 1.0, 1: 1.0 / tma_speed})
    q, k, v = _qkv8(L=48, D=40)
    A._launch(q, k, v, None, 2, True, True, None, False, False)
    assert {t[2] for t in gpu.timed} == {A.TMA_OFF, A.TMA_ON}  # never the opt-in warp specialisation
    assert int(gpu.log[-1][1]["USE_TMA"]) == want and not gpu.log[-1][1]["WARP_SPEC"]


def test_fixed_variants_and_timing_off_take_the_default(monkeypatch, tmp_path):
    gpu = _FakeGPU(monkeypatch, tmp_path, 89, {0: 1.0, 1: 2.0})
    q, k, v = _qkv8()
    monkeypatch.setenv(gpu.T.ENV, "0")
    A._launch(q, k, v, None, 2, True, True, None, True, False)  # sm89: fp8 first, untimed
    assert gpu.timed == [] and gpu.log[-1][1]["PV_MODE"] == 1
    monkeypatch.delenv(gpu.T.ENV)
    A._launch(q, k, v, None, 2, True, True, None, True, False, pv="half")
    assert {t[2] for t in gpu.timed} == {0} and gpu.log[-1][1]["PV_MODE"] == 0
    monkeypatch.setenv(A.TMA_ENV, "0")
    A._launch(q, k, v, None, 2, True, True, None, False, False)
    assert not gpu.log[-1][1]["USE_TMA"]


@pytest.mark.parametrize("int8", [False, True])
def test_a_tunings_warm_ups_run_one_program_of_each_candidate(int8, monkeypatch, tmp_path):
    # the timer warms a block config with the call's launches on the attention kernel's first program
    # (the 8-bit pre-pass whole); the timed calls run the whole grid. TRITONKIT_LIGHT_WARMUP=0: no light calls
    gpu = _FakeGPU(monkeypatch, tmp_path, 90, {0: 1.0, 1: 1.0})
    grids = []

    class GridRecorder(_Recorder):
        def __getitem__(self, grid):
            grids.append(grid)
            return super().__getitem__(grid)
    monkeypatch.setattr(A, "kernel_for", lambda fn, dev_type: GridRecorder(gpu.log) if fn is A.attn_fwd_kernel
                        else _Recorder(gpu.prep))
    lights = []  # each timing's light calls (the playoff after the first timing has none)

    def time_all(device, fns, light=None):
        lights.append(light)
        out = {}
        for c, fn in fns.items():
            if light is not None:
                grids.clear()
                p0 = len(gpu.prep)
                light[c]()
                assert grids == [(1,)] and len(gpu.prep) == p0 + (1 if int8 else 0)
            grids.clear()
            out[c] = gpu.bench(device, fn)
            assert grids == [(A.cdiv(q.shape[2], c[0]) * q.shape[0] * q.shape[1],)]
        return out
    monkeypatch.setattr(gpu.T, "time_all", time_all)
    q, k, v = _qkv8(L=300)
    A._launch(q, k, v, None, 2, True, True, None, int8, False)
    assert lights[0] is not None and len(lights[0]) > 1
    gpu.new_process()
    monkeypatch.setenv(gpu.C.ENV_DIR, str(tmp_path / "calib-b"))  # nothing stored: timed again
    gpu.C.reset()
    lights.clear()
    monkeypatch.setenv(gpu.T.LIGHT_ENV, "0")
    A._launch(q, k, v, None, 2, True, True, None, int8, False)
    assert lights and lights[0] is None and gpu.timed


@pytest.mark.parametrize("int8", [False, True])
def test_a_light_call_computes_the_first_tile_only(int8, monkeypatch, tmp_path):
    # in the interpreter, on fresh random data: a tuning's light call (the warm-up) writes the first BLOCK_M rows
    # of batch 0, head 0, right against the float64 reference, and leaves the poisoned rest alone
    from tritonkit.kernels import calibration as C
    from tritonkit.kernels import tuning as T
    monkeypatch.setenv(C.ENV_DIR, str(tmp_path / "calib"))
    C.reset()
    T.cache().clear()
    monkeypatch.setattr(A, "_device_cc", lambda dev: 80)
    gen = torch.Generator().manual_seed(torch.seed() % 2 ** 31)
    B, H, L, D = 2, 2, 160, 32
    q, k, v = (torch.randn(B, H, L, D, generator=gen).to(torch.float16) for _ in range(3))
    out = torch.full((B, H, L, D), float("nan"), dtype=torch.float16)
    seen = {}

    def pick(device, key, cands, run, warm=None, weight=None, family=None, in_model=False, light=None):
        c = next(c for c in cands if c[0] < L)  # a tile smaller than the sequence: the rest stays poisoned
        light(c)
        seen["after"], seen["cfg"] = out.clone(), c
        return c
    monkeypatch.setattr(T, "pick", pick)
    with A._interpreted_device_calls("cpu"):
        A._launch(q, k, v, None, H, True, True, None, int8, False, out=out)
    after, bm = seen["after"], seen["cfg"][0]
    ref = A.attention_reference(q, k, v, layout="bhld")
    check(after[0, 0, :bm], ref[0, 0, :bm], torch.float16, "int8" if int8 else "exact", "the light call's tile")
    assert torch.isnan(after[0, 0, bm:]).all() and torch.isnan(after[0, 1:]).all() and torch.isnan(after[1:]).all()
    check(out, ref, torch.float16, "int8" if int8 else "exact", "the call after it")  # the whole grid then


def test_no_tma_candidates_without_tensor_descriptors(monkeypatch):
    monkeypatch.delenv(A.TMA_ENV, raising=False)
    monkeypatch.setattr(A, "tensor_descriptors_available", lambda: False)  # Triton < 3.4
    assert A.tma_variants_for(90, torch.bfloat16) == (0,)


def test_a_forced_older_arch_keeps_to_its_features(monkeypatch, tmp_path):
    # an H100 simulating an RTX 3090 (the node passes TRITONKIT_FORCE_ARCH's arch): no fp8 P·V,
    # no TMA, sm86's block configs; a higher arch than the device's changes nothing
    gpu = _FakeGPU(monkeypatch, tmp_path, 90, {0: 1.0, 1: 0.5})
    q, k, v = _qkv8()
    A._launch(q, k, v, None, 2, True, True, None, True, False, arch=86)
    assert {t[2] for t in gpu.timed} == {0} and gpu.log[-1][1]["PV_MODE"] == 0
    assert all(k.split("|")[1] == "86" for k in A.tune_cache())
    assert {t[:2] for t in gpu.timed} <= {tuple(c[:2]) for c in A.candidates(86, 64, 2, True)}
    gpu.timed.clear()
    A._launch(q, k, v, None, 2, True, True, None, False, False, arch=86)
    assert {t[2] for t in gpu.timed} == {A.TMA_OFF} and not gpu.log[-1][1]["USE_TMA"]
    gpu.new_process()
    A._launch(q, k, v, None, 2, True, True, None, True, False, arch=100)
    assert {t[2] for t in gpu.timed} == {0, 1} and gpu.log[-1][1]["PV_MODE"] == 1


# ----------------------------------------------------------------------------- a compiled graph's interim path

@pytest.mark.parametrize("layout,out_layout,group,mask_kind,mask_ndim,causal,scale", [
    ("bld", "bld", 1, "none", 0, False, None),
    ("bld", "bhld", 2, "bool", 2, False, 0.3),
    ("bhld", "bld", 1, "float", 4, True, None),
    ("bhld", "bhld", 4, "bool", -4, True, None),
    ("bld", "bld", 2, "float", 1, False, None),
])
def test_sdpa_interim_matches_the_reference(layout, out_layout, group, mask_kind, mask_ndim, causal, scale):
    """What a compiled graph's call runs while its kernels compile: torch's SDPA in the kernels'
    layouts, GQA and mask conventions (a fully masked row gives 0), against float64."""
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))
    B, H, Lq, Lk, D = 2, 4, 24, 24 if causal else 40, 32
    q, k, v = make_qkv(B, H, H // group, Lq, Lk, D, torch.float32, layout, gen)
    mask = make_mask(mask_kind, mask_ndim, B, H, Lq, Lk, gen)
    if mask is not None and mask.ndim >= 2:  # one row with every key masked
        mask[..., 3, :] = False if mask.dtype == torch.bool else float("-inf")
    out = A._sdpa_interim(q, k, v, mask, H, layout == "bhld", out_layout == "bhld", scale, causal)
    ref = A.attention_reference(q, k, v, H, mask=mask, layout=layout, out_layout=out_layout, scale=scale,
                                causal=causal)
    assert out.shape == ref.shape
    check(out, ref, torch.float32, "exact", f"{layout}->{out_layout} group {group} {mask_kind}{mask_ndim}")


def test_compiled_graph_calls_run_sdpa_while_their_kernels_compile(monkeypatch):
    """The custom op (what a compiled graph runs) asks kernels/prepare.ready for its call's kernels;
    until they are ready it returns SDPA's result, then the kernel's. The key tells calls apart by
    shape and stride (the kernels are specialised on them)."""
    keys, state = [], {"ready": False}
    monkeypatch.setattr(A, "_gated", lambda q: True)
    monkeypatch.setattr(A.prepare, "ready", lambda key, fn: keys.append(key) or state["ready"])
    monkeypatch.setattr(A, "_attention_impl", lambda *a: "kernel")
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))
    q, k, v = make_qkv(1, 2, 2, 16, 16, 32, torch.float32, "bld", gen)
    args = (None, 2, False, False, None, True, False, 0, 0, 0, 0, "auto", 0)
    out = A._op_impl(q, k, v, *args)
    check(out, A.attention_reference(q, k, v, 2), torch.float32, "exact")
    state["ready"] = True
    assert A._op_impl(q, k, v, *args) == "kernel"
    A._op_impl(q, torch.cat([k, k], -1)[..., :k.shape[-1]], v, *args)  # the same values at other strides
    assert keys[0] == keys[1], keys
    assert keys[2] != keys[1] and keys[2][6] != keys[1][6], keys
    monkeypatch.setattr(A, "_gated", lambda q: False)  # CPU, a CUDA graph capture, deferral off: straight on
    state["ready"] = False
    assert A._op_impl(q, k, v, *args) == "kernel" and len(keys) == 3
    monkeypatch.setitem(A.prepare._READY, keys[0], True)  # known ready: nothing else is asked

    def not_asked(q):
        raise AssertionError("a call known ready checked its settings")
    monkeypatch.setattr(A, "_gated", not_asked)
    assert A._op_impl(q, k, v, *args) == "kernel" and len(keys) == 3
