"""kernels/attention_hopper.py: the Gluon exact-attention kernel for sm90. On CPU: every candidate
compiles for sm90 down to the cubin with the overlap it exists for (a wgmma wait that leaves one
group in flight), TMA loads and no spills; the launcher offers it only where it can serve the call.
On an sm90 GPU: each candidate against a float64 reference on fresh random data, outputs poisoned,
over both layouts, GQA, fp16 / bf16 and lengths that are not block multiples."""
from __future__ import annotations

import pytest
import torch

from compile_utils import compile_gluon, spill_bytes
from test_attention import EIGHT_BIT_GOAL, NORM_TOL, check, cos_stats, make_8bit_inputs, make_qkv
from tritonkit.kernels import attention as A
from tritonkit.kernels import attention_hopper as AH
from tritonkit.kernels import trials as TR

needs_gluon = pytest.mark.skipif("not __import__('tritonkit.kernels.attention_hopper', "
                                 "fromlist=['x']).gluon_available()",
                                 reason="this Triton has no Gluon Hopper API (Triton < 3.5)")


def _compile(dtype, head, cfg, ws=False, o_tma=True):
    return compile_gluon(AH.compile_spec(dtype, head, cfg, ws, o_tma=o_tma))


@needs_gluon
@pytest.mark.parametrize("ws", [False, True, "pp"])
@pytest.mark.parametrize("head", AH.HEADS)
def test_every_candidate_compiles_for_sm90_with_the_overlap(head, ws):
    for dtype in (torch.bfloat16, torch.float16):
        for cfg in AH.candidates(head, ws):
            k = _compile(dtype, head, cfg, ws)
            ptx = k.asm["ptx"]
            assert len(k.asm["cubin"]) > 0 and "sm_90a" in ptx, (head, cfg)
            assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx, (head, cfg)
            # block j's scores waited for with block j-1's P·V still in flight
            assert "wgmma.wait_group.sync.aligned 1;" in ptx, (head, cfg)
            assert k.metadata.shared <= A._SMEM["sm90"], (head, cfg, k.metadata.shared)
            assert AH.smem_bytes(cfg, head) <= k.metadata.shared, (head, cfg)
            spills = spill_bytes(k, 90)
            assert spills in (None, 0), (head, cfg, spills)
            if ws:  # consumers release K / V slots to the producer warp, registers moved to them
                assert "mbarrier.arrive" in ptx and "setmaxnreg" in ptx, (head, cfg)
                assert TMA_STORE in ptx and "stmatrix" in ptx, (head, cfg)  # whole 64 rows stored by TMA


def _compile8(dtype, head, cfg, fp8_pv, o_tma=True):
    return compile_gluon(AH.compile_spec8(dtype, head, cfg, fp8_pv, o_tma=o_tma))


@needs_gluon
@pytest.mark.parametrize("fp8_pv", [False, True])
@pytest.mark.parametrize("head", AH.HEADS)
def test_every_8bit_candidate_compiles_for_sm90(head, fp8_pv):
    for cfg in AH.candidates8(head, fp8_pv):
        k = _compile8(torch.bfloat16, head, cfg, fp8_pv)
        ptx = k.asm["ptx"]
        assert len(k.asm["cubin"]) > 0 and "setmaxnreg" in ptx, (head, cfg)
        assert ".s32.s8.s8" in ptx, (head, cfg)  # int8 Q·K on the tensor cores
        assert ("e4m3.e4m3" in ptx) == fp8_pv, (head, cfg)
        # the int32 scores read as floats by no instruction: Q·K accumulates onto 0x4B400000 (_int_scores),
        # not added to it a score afterwards (256 add.s32 before, BENCHMARKS.md, fortieth session)
        offset = [ln for ln in ptx.splitlines() if "1262485504" in ln]
        assert offset and not any("add." in ln for ln in offset), (head, cfg, offset[:4])
        assert "wgmma.wait_group.sync.aligned 1;" in ptx and "cp.async.bulk.tensor" in ptx, (head, cfg)
        assert k.metadata.shared <= A._SMEM["sm90"], (head, cfg, k.metadata.shared)
        spills = spill_bytes(k, 90)
        # none with Triton 3.6 and 3.8 since the kernel's items (whole tiles, stream-K segments) take their
        # key-block range as arguments; fp8 P·V at head 128, which holds one more accumulator, spilled
        # 236 bytes before (BENCHMARKS.md, thirty-sixth session); the one exception, three consumers at head 64,
        # is bounded by AH.SPILLS8_ALLOWED (forty-third session)
        assert spills is None or spills <= AH.SPILLS8_ALLOWED.get((head, fp8_pv, cfg[0]), 0), (head, cfg, spills)
        if fp8_pv:  # P relabelled, not shuffled between threads (_p_operand)
            half = _compile8(torch.bfloat16, head, cfg, False).asm["ptx"]
            assert ptx.count("shfl.sync") == half.count("shfl.sync"), (head, cfg)
            # and packed four a register as the MMA reads them, with no byte moved after the conversion
            # (_fp8x4; carried over the loop as bytes, P took 192 prmt in the PTX)
            assert "cvt.rn.satfinite.e4m3x2.f32" in ptx and ptx.count("prmt.b32") == half.count("prmt.b32"), \
                (head, cfg, ptx.count("prmt.b32"))
        assert TMA_STORE in ptx, (head, cfg)


def test_int8_scores_on_the_offset_are_exact_floats():
    """_int_scores' arithmetic: int8 Q·K over up to 256 channels (values within ±127, as the pre-pass
    quantises them) accumulated onto 0x4B400000 is, read as fp32, 1.5·2^23 plus the score, exactly, at
    the bound and inside it."""
    bound = 127 * 127 * 256
    assert bound < 2 ** 22
    s = torch.randint(-bound, bound + 1, (1 << 16,), dtype=torch.int64)
    s[:4] = torch.tensor([-bound, bound, 0, -1])
    q = torch.randint(-127, 128, (64, 256), dtype=torch.int64)
    k = torch.randint(-127, 128, (256, 64), dtype=torch.int64)
    s = torch.cat([s, (q @ k).flatten(), (torch.full((1, 256), 127) @ torch.full((256, 1), -127)).flatten()])
    bits = (s + 0x4B400000).to(torch.int32)
    assert torch.equal(bits.view(torch.float32).double(), 12582912.0 + s.double())


# the TMA store of an output tile (the warp-specialised kernels' epilogue, where O folds into a 2-D view)
TMA_STORE = "cp.async.bulk.tensor.2d.global.shared::cta"


@needs_gluon
def test_the_output_folds_into_rows_of_one_stride_or_is_stored_without_tma():
    """out_descriptor: O as rows of stride_ol elements for both layouts the kernels write (a tile's row
    and column are its element offset's quotient and remainder by stride_ol, as _ws_consumer computes
    them); any other output gets the dummy and O_TMA off."""
    B, H, L, D = 2, 3, 100, 64
    o = torch.empty(B, H, L, D, dtype=torch.bfloat16)  # (B, H, L, D)
    od, on = AH.out_descriptor(o, o.stride()[:3], D, "dummy")
    assert on and list(od.shape) == [B * H * L, D] and list(od.block_shape) == [64, D]
    o = torch.empty(B, L, H * D, dtype=torch.bfloat16)  # (B, L, H·D), ComfyUI's
    ov = o.view(B, L, H, D)
    so = (ov.stride(0), ov.stride(2), ov.stride(1))
    od, on = AH.out_descriptor(o, so, D, "dummy")
    assert on and list(od.shape) == [B * L, H * D]
    off = 1 * so[0] + 2 * so[1]  # batch 1, head 2: its rows from B·L row L, its columns from 2·D
    assert (off // so[2], off % so[2]) == (L, 2 * D)
    t = torch.empty(B, L, H, D, dtype=torch.bfloat16).transpose(1, 2)  # an `out` of another layout
    assert AH.out_descriptor(t, t.stride()[:3], D, "dummy") == ("dummy", False)
    t = torch.empty(B, H, L, D + 8, dtype=torch.bfloat16)[..., :D]  # rows with a gap
    assert AH.out_descriptor(t, t.stride()[:3], D, "dummy") == ("dummy", False)


@needs_gluon
def test_a_descriptor_from_its_template_equals_a_new_one():
    """descriptor: a second view of the shape class's (dtype, shape, strides, block) is its template with the new
    tensor, field for field what from_tensor builds; a misaligned tensor still gets from_tensor's error."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    AH._DESC_TEMPLATES.clear()
    a, b = (torch.empty(6 * 100, 64, dtype=torch.int8) for _ in range(2))
    da, db = AH.descriptor(a, (64, 64)), AH.descriptor(b, (64, 64))
    assert len(AH._DESC_TEMPLATES) == 1 and da.base is a and db.base is b
    ref = TensorDescriptor.from_tensor(b, [64, 64], AH._smem_layout((64, 64), torch.int8))
    assert type(db) is type(ref) and db.__dict__.keys() == ref.__dict__.keys()
    assert all((db.__dict__[n] is b) if n == "base" else db.__dict__[n] == ref.__dict__[n] for n in ref.__dict__)
    assert "base" not in next(iter(AH._DESC_TEMPLATES.values()))[1]  # no tensor kept alive by the cache
    raw = torch.empty(6 * 100 * 64 + 1, dtype=torch.int8)
    with pytest.raises(AssertionError, match="16-byte aligned"):
        AH.descriptor(raw[1:].view(600, 64), (64, 64))
    AH.descriptor(b.view(300, 128), (64, 128))
    assert len(AH._DESC_TEMPLATES) == 2


@needs_gluon
@pytest.mark.parametrize("int8", [False, True])
def test_the_epilogue_without_tma_compiles_without_spills(int8):
    """O_TMA off (an ``out`` that does not fold into rows of one stride): every tile stored from the
    accumulator's registers, as before the TMA store, with no shared buffer for it and no spills."""
    for head in AH.HEADS:
        if int8:
            cfg = AH.candidates8(head, True)[0]
            k, on = _compile8(torch.bfloat16, head, cfg, True, o_tma=False), _compile8(torch.bfloat16, head, cfg, True)
        else:
            cfg = AH.candidates(head, True)[0]
            k, on = _compile(torch.bfloat16, head, cfg, True, o_tma=False), _compile(torch.bfloat16, head, cfg, True)
        assert TMA_STORE not in k.asm["ptx"] and "st.global" in k.asm["ptx"], (head, cfg)
        assert spill_bytes(k, 90) in (None, 0), (head, cfg)
        # the output buffer: 64 rows × head a consumer warpgroup, in O's dtype
        assert on.metadata.shared - k.metadata.shared >= cfg[0] * head * 2, (head, cfg)


def test_eligibility():
    ok = AH.gluon_available()
    assert AH.eligible(90, torch.bfloat16, 128, False, False) == ok
    assert AH.eligible(90, torch.float16, 64, False, False) == ok
    for args in ((89, torch.bfloat16, 128, False, False), (100, torch.bfloat16, 128, False, False),
                 (None, torch.bfloat16, 128, False, False), (90, torch.float32, 128, False, False),
                 (90, torch.bfloat16, 80, False, False), (90, torch.bfloat16, 128, True, False),
                 (90, torch.bfloat16, 128, False, True)):
        assert not AH.eligible(*args), args


def test_variants_offer_gluon_where_it_serves(monkeypatch):
    monkeypatch.setattr(A, "tensor_descriptors_available", lambda: True)
    monkeypatch.delenv(A.TMA_ENV, raising=False)
    assert A.tma_variants_for(90, torch.bfloat16, True) == (A.TMA_OFF,) + A.GLUON_VARIANTS
    assert A.tma_variants_for(90, torch.bfloat16, False) == (A.TMA_OFF, A.TMA_ON)
    monkeypatch.setenv(A.TMA_ENV, "gluon")
    assert A.tma_variants_for(90, torch.bfloat16, True) == A.GLUON_VARIANTS
    assert A.tma_variants_for(90, torch.bfloat16, False) == (A.TMA_ON,)
    monkeypatch.setenv(A.TMA_ENV, "0")
    assert A.tma_variants_for(90, torch.bfloat16, True) == (A.TMA_OFF,)
    cands = A.variant_candidates(90, 128, 2, False, (A.TMA_OFF, A.TMA_ON) + A.GLUON_VARIANTS)
    assert [c[:4] for c in cands if c[4] == A.GLUON] == AH.candidates(128)
    assert [c[:4] for c in cands if c[4] == A.GLUON_WS] == AH.candidates(128, ws=True)


def test_an_explicit_gluon_config_that_cant_serve_is_refused():
    q = torch.randn(1, 2, 32, 40)
    with pytest.raises(ValueError, match="Gluon kernel can't serve"):
        A.attention(q, q, q, layout="bhld", config=(64, 64, 4, 2, A.GLUON), out=torch.empty_like(q))


def _sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


CASES = [  # B, H, group, Lq, Lk, D, dtype, layout
    (1, 24, 1, 4608, 4608, 128, torch.bfloat16, "bhld"),
    (2, 10, 1, 4096, 4096, 64, torch.float16, "bld"),
    (1, 8, 4, 1000, 777, 128, torch.bfloat16, "bld"),
    (2, 4, 2, 333, 4133, 64, torch.bfloat16, "bhld"),
    (1, 3, 1, 17, 50, 128, torch.float16, "bhld"),
    (1, 2, 1, 200, 1, 64, torch.bfloat16, "bld"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(len(CASES)))
def test_cuda_gluon_matches_float64(case, poison):
    if not _sm90():
        pytest.skip("the Gluon kernel is for sm90 (Hopper)")
    if not AH.gluon_available():
        pytest.skip("this Triton has no Gluon Hopper API")
    B, H, group, Lq, Lk, D, dtype, layout = CASES[case]
    gen = torch.Generator().manual_seed(1000 + case)
    q, k, v = make_qkv(B, H, H // group, Lq, Lk, D, dtype, layout, gen, "cuda")
    ref = A.attention_reference(q, k, v, H, layout=layout)
    for variant in A.GLUON_VARIANTS:
        for cfg in AH.candidates(D, ws=A._GLUON_WS[variant]):
            out = poison(torch.empty(ref.shape, dtype=dtype, device="cuda"))
            A.attention(q, k, v, H, layout=layout, config=tuple(cfg) + (variant,), out=out)
            check(out, ref, dtype, "exact", f"case {case} cfg {cfg} variant {variant}")


@pytest.mark.gpu
@pytest.mark.parametrize("D", AH.HEADS)
def test_cuda_gluon_reads_v_as_a_view_into_a_fused_projection(D, poison):
    """Flux's and HunyuanVideo's single blocks: Q and K contiguous, V a view into the block's fused projection (rows
    of 3·H·D + MLP elements), which the Gluon kernels read through V's own TMA coordinates: every exact form and the
    8-bit kernel's 16-bit P·V form against float64."""
    if not _sm90() or not AH.gluon_available():
        pytest.skip("the Gluon kernel is for sm90 (Hopper) with Triton's Gluon API")
    B, H, L = 1, 4, 333
    gen = torch.Generator().manual_seed(4000 + D)
    proj = torch.randn(B, L, 3 * H * D + 64, generator=gen).to(torch.bfloat16).cuda()
    qkv = proj[..., :3 * H * D].view(B, L, 3, H, D).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0].contiguous(), qkv[1].contiguous(), qkv[2]
    assert A._tma_view2d(v, B, H, L, D, True)[1] == (L, 0, D)
    ref = A.attention_reference(q, k, v, H, layout="bhld")
    for variant in A.GLUON_VARIANTS:
        cfg = AH.candidates(D, ws=A._GLUON_WS[variant])[0]
        out = poison(torch.empty(ref.shape, dtype=torch.bfloat16, device="cuda"))
        A.attention(q, k, v, H, layout="bhld", config=tuple(cfg) + (variant,), out=out)
        check(out, ref, torch.bfloat16, "exact", f"V a view, cfg {cfg} variant {variant}")
    out = poison(torch.empty(ref.shape, dtype=torch.bfloat16, device="cuda"))
    A.attention(q, k, v, H, layout="bhld", mode="int8", pv="half",
                config=tuple(AH.candidates8(D, False)[0]) + (A.G8_HALF,), out=out)
    g, worst, finite, n = cos_stats(out, ref)
    assert finite and g >= EIGHT_BIT_GOAL[0] and worst >= EIGHT_BIT_GOAL[1] and abs(n - 1) < NORM_TOL, (g, worst, n)


@pytest.mark.gpu
def test_cuda_auto_times_the_gluon_kernel(poison, monkeypatch):
    if not _sm90() or not AH.gluon_available():
        pytest.skip("the Gluon kernel is for sm90 (Hopper) with Triton's Gluon API")
    monkeypatch.delenv(A.TMA_ENV, raising=False)
    gen = torch.Generator().manual_seed(7)
    q, k, v = make_qkv(1, 24, 24, 4608, 4608, 128, torch.bfloat16, "bld", gen, "cuda")
    ref = A.attention_reference(q, k, v, 24)
    # the timing's playoff runs in the calls themselves, in turns of up to STRETCH_MAX calls (kernels/trials.py)
    for _ in range(2 * TR.MIN_TURNS * TR.STRETCH_MAX * 4):
        out = poison(torch.empty_like(q))
        A.attention(q, k, v, 24, out=out)
        check(out, ref, torch.bfloat16, "exact", "auto")
        if any("|exact-v0345|" in key for key in A.tune_cache()):
            break
    picks = [c for key, c in A.tune_cache().items() if "|exact-v0345|" in key]
    assert picks, A.tune_cache()
    out = poison(torch.empty_like(q))
    A.attention(q, k, v, 24, out=out)  # the stored pick
    check(out, ref, torch.bfloat16, "exact", f"pick {picks[0]}")


def _fake_gluon_gpu(monkeypatch, tmp_path, times, broken=()):
    """A fake sm90 (tests/test_attention.py's _FakeGPU) whose Gluon launches, exact and 8-bit, are
    recorded, not run: each variant times ``times[variant]`` ms (the Triton kernel's by its PV_MODE in
    8-bit mode, as TMA_OFF in exact mode); those in ``broken`` raise as a failed compile would."""
    from test_attention import _FakeGPU
    gpu = _FakeGPU(monkeypatch, tmp_path, 90, {})
    calls = []
    form = {False: A.GLUON, True: A.GLUON_WS, "pp": A.GLUON_PP}

    def record(cfg, variant, warmup):
        if variant in broken:
            raise RuntimeError("fake compile failure")
        calls.append((tuple(cfg), variant, warmup))

    def fake_launch(q_view, kv_views, o, so, B, H, Hk, Lq, Lk, D, sm_scale, cfg, launch_fn, warmup=False, ws=False,
                    light=False):
        assert not light  # a CPU tensor's candidates are timed whole (tuning.time_ms)
        record(cfg, form[ws], warmup)

    def fake_launch8(qi, qs, ki, ks, v_view, vamax, o, so, B, H, Hk, Lq, Lk, D, cfg, launch_fn, warmup=False,
                     pp=False, light=False):
        assert not light
        record(cfg, A.G8_FP8 if isinstance(v_view, torch.Tensor) else A.G8_HALF, warmup)

    def bench(device, fn):
        n = len(calls)
        fn()
        if len(calls) > n:
            return times[calls[-1][1]]
        kw = gpu.log[-1][1]
        return times[kw["PV_MODE"] if kw["INT8"] else A.TMA_OFF]
    monkeypatch.setattr(AH, "launch", fake_launch)
    monkeypatch.setattr(AH, "launch8", fake_launch8)
    monkeypatch.setattr(AH, "gluon_available", lambda: True)
    monkeypatch.setattr(A, "tensor_descriptors_available", lambda: True)
    monkeypatch.setattr(gpu.T, "time_ms", bench)
    g = torch.Generator().manual_seed(0)
    qkv = [torch.randn(1, 2, 256, 128, generator=g).to(torch.bfloat16) for _ in range(3)]
    return gpu, calls, qkv


@pytest.mark.parametrize("fastest", [A.TMA_OFF, A.GLUON, A.GLUON_WS, A.GLUON_PP])
def test_auto_times_the_gluon_forms_and_takes_the_fastest(fastest, monkeypatch, tmp_path):
    times = {v: 1.0 for v in (A.TMA_OFF,) + A.GLUON_VARIANTS}
    times[fastest] = 0.8
    gpu, calls, (q, k, v) = _fake_gluon_gpu(monkeypatch, tmp_path, times)
    A._launch(q, k, v, None, 2, True, True, None, False, False)
    timed = {c[1] for c in calls if not c[2]} | ({A.TMA_OFF} if gpu.log else set())
    assert timed == {A.TMA_OFF} | set(A.GLUON_VARIANTS)  # never Triton's TMA variant beside Gluon
    (pick,) = A.tune_cache().values()
    assert pick[4] == fastest
    if fastest == A.TMA_OFF:
        assert gpu.log[-1][0] == "launch" and not gpu.log[-1][1]["USE_TMA"]
    else:
        assert calls[-1][1] == fastest and not calls[-1][2]


def test_a_gluon_form_that_fails_to_compile_is_passed_over(monkeypatch, tmp_path):
    times = {A.TMA_OFF: 1.0, A.GLUON: 0.9, A.GLUON_WS: 0.5, A.GLUON_PP: 0.5}
    gpu, calls, (q, k, v) = _fake_gluon_gpu(monkeypatch, tmp_path, times, broken=(A.GLUON_WS, A.GLUON_PP))
    A._launch(q, k, v, None, 2, True, True, None, False, False)
    (pick,) = A.tune_cache().values()
    assert pick[4] == A.GLUON and calls[-1][1] == A.GLUON


def test_masked_causal_or_padded_calls_never_reach_gluon(monkeypatch, tmp_path):
    gpu, calls, (q, k, v) = _fake_gluon_gpu(monkeypatch, tmp_path, {0: 1.0, 1: 1.0})
    A._launch(q, k, v, None, 2, True, True, None, False, True)  # causal
    A._launch(q, k, v, torch.ones(256, dtype=torch.bool), 2, True, True, None, False, False)  # masked
    q80, k80, v80 = (t[..., :80].contiguous() for t in (q, k, v))
    A._launch(q80, k80, v80, None, 2, True, True, None, False, False)  # head 80: padded
    assert calls == [] and gpu.log


@pytest.mark.parametrize("fastest", [0, 1, A.G8_HALF, A.G8_FP8])
def test_8bit_auto_times_the_gluon_kernel_beside_the_triton_one(fastest, monkeypatch, tmp_path):
    times = {0: 1.0, 1: 1.0, A.G8_HALF: 1.0, A.G8_FP8: 1.0}
    times[fastest] = 0.8 / (A.FP8_PV_MARGIN if fastest in (1, A.G8_FP8) else 1.0)
    gpu, calls, (q, k, v) = _fake_gluon_gpu(monkeypatch, tmp_path, times)
    A._launch(q, k, v, None, 2, True, True, None, True, False)
    timed = {c[1] for c in calls if not c[2]} | {e[1]["PV_MODE"] for e in gpu.log if e[0] == "launch"}
    assert timed == {0, 1, A.G8_HALF, A.G8_FP8}  # both P·V forms of both kernels
    (pick,) = A.tune_cache().values()
    assert pick[4] == fastest


def test_8bit_gluon_fp8_pv_weighted_like_triton_fp8(monkeypatch, tmp_path):
    # fp8 P·V must time FP8_PV_MARGIN faster than 16-bit P·V to be taken, in either kernel
    times = {0: 1.0, 1: 1.0, A.G8_HALF: 1.0, A.G8_FP8: 1.0 / (A.FP8_PV_MARGIN * 0.99)}
    gpu, calls, (q, k, v) = _fake_gluon_gpu(monkeypatch, tmp_path, times)
    A._launch(q, k, v, None, 2, True, True, None, True, False)
    (pick,) = A.tune_cache().values()
    assert pick[4] in (0, A.G8_HALF)
    # asked for fp8: both fp8 forms, no margin between them, the faster one
    A.tune_cache().clear()
    times = {1: 1.0, A.G8_FP8: 1.0 / (A.FP8_PV_MARGIN * 0.99)}
    gpu, calls, (q, k, v) = _fake_gluon_gpu(monkeypatch, tmp_path, times)
    A._launch(q, k, v, None, 2, True, True, None, True, False, pv="fp8")
    assert {c[1] for c in calls} == {A.G8_FP8}
    (pick,) = A.tune_cache().values()
    assert pick[4] == A.G8_FP8


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["normal", "outliers"])
def test_cuda_gluon_8bit_meets_the_accuracy_goal(kind, poison):
    if not _sm90() or not AH.gluon_available():
        pytest.skip("the Gluon kernel is for sm90 (Hopper) with Triton's Gluon API")
    for (B, H, group, Lq, Lk, D, dtype, layout) in (CASES[0], CASES[2], CASES[3], CASES[4]):
        gen = torch.Generator().manual_seed(2000 + Lq)
        q, k, v = make_qkv(B, H, H // group, Lq, Lk, D, dtype, layout, gen, "cuda", outliers=kind == "outliers")
        rows = torch.randperm(Lq, generator=gen)[:256].sort().values.cuda()
        if layout == "bhld":
            ref = A.attention_reference(q[:, :, rows], k, v, layout="bhld")
        else:
            ref = A.attention_reference(q[:, rows], k, v, H)
        for variant in (A.G8_HALF, A.G8_FP8):
            for cfg in AH.candidates8(D, variant == A.G8_FP8):
                out = poison(torch.empty_like(q) if layout == "bld" else torch.empty(B, H, Lq, D, dtype=dtype,
                                                                                     device="cuda"))
                A.attention(q, k, v, H, layout=layout, mode="int8", pv="fp8" if variant == A.G8_FP8 else "half",
                            config=tuple(cfg) + (variant,), out=out)
                got = out[:, :, rows] if layout == "bhld" else out[:, rows]
                if layout == "bld":
                    got, r = got.reshape(B, len(rows), H, D).transpose(1, 2), ref.reshape(B, len(rows), H, D).transpose(1, 2)
                else:
                    r = ref
                g, worst, finite, n = cos_stats(got, r)
                assert finite and g >= EIGHT_BIT_GOAL[0] and worst >= EIGHT_BIT_GOAL[1] and abs(n - 1) < NORM_TOL, \
                    (Lq, Lk, D, variant, cfg, g, worst, n)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [0, 2, 3])
def test_cuda_stream_k_matches_float64(case, poison, monkeypatch):
    """The warp-specialised forms with stream-K taken (its thresholds lowered where the shape is small):
    segments of the last tiles merged by the fixup, against float64, exact and 8-bit, GQA, odd lengths."""
    if not _sm90() or not AH.gluon_available():
        pytest.skip("the Gluon kernel is for sm90 (Hopper) with Triton's Gluon API")
    from tritonkit.kernels import attention_streamk as SK
    monkeypatch.setattr(AH, "STREAM_K", True)  # whatever TRITONKIT_STREAM_K says
    monkeypatch.setattr(SK, "MIN_UNITS", 1)
    monkeypatch.setattr(SK, "MIN_IDLE_SHARE", 0.0)
    B, H, group, Lq, Lk, D, dtype, layout = CASES[case]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n_dp, units = SK.schedule(B * H * -(-Lq // 128), -(-Lk // 128), sms)
    assert units > 0, "stream-K not taken: the test would test nothing"
    gen = torch.Generator().manual_seed(3000 + case)
    q, k, v = make_qkv(B, H, H // group, Lq, Lk, D, dtype, layout, gen, "cuda")
    ref = A.attention_reference(q, k, v, H, layout=layout)
    for variant in (A.GLUON_WS, A.GLUON_PP):
        for cfg in AH.candidates(D, ws=A._GLUON_WS[variant]):
            out = poison(torch.empty(ref.shape, dtype=dtype, device="cuda"))
            A.attention(q, k, v, H, layout=layout, config=tuple(cfg) + (variant,), out=out)
            check(out, ref, dtype, "exact", f"stream-K case {case} cfg {cfg} variant {variant}")
    q, k, v = make_qkv(B, H, H // group, Lq, Lk, D, dtype, layout, gen, "cuda", outliers=True)
    ref = A.attention_reference(q, k, v, H, layout=layout)
    for variant in (A.G8_HALF, A.G8_FP8):
        for cfg in AH.candidates8(D, variant == A.G8_FP8):
            out = poison(torch.empty(ref.shape, dtype=dtype, device="cuda"))
            A.attention(q, k, v, H, layout=layout, mode="int8", pv="fp8" if variant == A.G8_FP8 else "half",
                        config=tuple(cfg) + (variant,), out=out)
            got, r = (out, ref) if layout == "bhld" else (out.reshape(B, Lq, H, D).transpose(1, 2),
                                                           ref.reshape(B, Lq, H, D).transpose(1, 2))
            g, worst, finite, n = cos_stats(got, r)
            assert finite and g >= EIGHT_BIT_GOAL[0] and worst >= EIGHT_BIT_GOAL[1] and abs(n - 1) < NORM_TOL, \
                (case, variant, cfg, g, worst, n)
