"""Fused fp8-weight linear: numerics in the Triton interpreter, the custom op under torch.compile,
cross-compilation sm75..sm120, and on a GPU the Flux layer shapes at small and large M."""
import pytest
import torch

from compile_utils import ARCHS, compile_for, spill_bytes
from tritonkit.kernels import fp8_linear as fl

ULP = {torch.float32: 2.0 ** -20, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def assert_close_to_reference(y, ref, dtype, k):
    # The reference is fp32 math rounded once; the kernel accumulates in fp32 in another order.
    scale = ref.float().abs().max().clamp_min(1.0)
    err = (y.float() - ref.float()).abs().max() / scale
    assert err <= 2 * ULP[dtype] + k * 2.0 ** -22, (err.item(), ULP[dtype])


def make(M, N, K, act, fmt, seed=0, lead=()):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, M, K, generator=g).to(act)
    w = (torch.randn(N, K, generator=g) * 0.4).to(fmt)
    return x, w, g


@pytest.mark.parametrize("act", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fmt", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_linear_matches_reference(act, fmt):
    for (M, N, K), bias_kind, scale_kind in [((1, 48, 80), "fp8", "channel"), ((37, 64, 96), "float", "tensor"),
                                            ((5, 33, 130), None, None)]:
        x, w, g = make(M, N, K, act, fmt)
        bias = {"fp8": torch.randn(N, generator=g).to(fmt), "float": torch.randn(N, generator=g).to(act), None: None}[bias_kind]
        scale = {"channel": torch.rand(N, generator=g) + 0.5, "tensor": torch.tensor(0.3), None: None}[scale_kind]
        y = fl.linear(x, w, bias, scale)
        assert y.shape == (M, N) and y.dtype == act
        assert_close_to_reference(y, fl.linear_reference(x, w, bias, scale), act, K)


def test_linear_special_inputs():
    x, w, g = make(3, 16, 32, torch.float16, torch.float8_e4m3fn, lead=(2,))
    y = fl.linear(x, w)
    assert y.shape == (2, 3, 16)
    assert_close_to_reference(y, fl.linear_reference(x, w), torch.float16, 32)
    xt = torch.randn(32, 6).to(torch.float16).t()  # non-contiguous rows
    assert_close_to_reference(fl.linear(xt, w), fl.linear_reference(xt, w), torch.float16, 32)
    assert fl.linear(torch.zeros(0, 32, dtype=torch.float16), w).shape == (0, 16)
    # a NaN weight code stays NaN in the output column (no silent 480 from the bit trick)
    wn = w.clone()
    wn.view(torch.uint8)[5, 0] = 0x7F
    y = fl.linear(x[0], wn)
    assert torch.isnan(y[:, 5]).all() and not torch.isnan(y[:, :5]).any()
    with pytest.raises(ValueError, match="features"):
        fl.linear(torch.zeros(2, 31), w)
    with pytest.raises(TypeError):
        fl.linear(x, w.to(torch.float16))


def test_m_bucket_and_configs():
    assert [fl.m_bucket(m) for m in (1, 16, 17, 4608, 100000)] == [1, 16, 32, 8192, 8192]
    block_m = lambda b: {c[1] for c in fl._configs_for_bucket(b)}  # noqa: E731 - (BLOCK_N, BLOCK_M, ...)
    assert block_m(1) == {16} and block_m(16) == {16}  # the small-M path
    assert min(block_m(8192)) >= 128
    assert block_m(32) and max(block_m(32)) <= 64


def test_cuda_launcher_candidates_without_masks_where_their_k_tile_divides_k(monkeypatch):
    # every small-M candidate of the GPU launcher, run in the interpreter: EVEN_K (no masks in the K
    # loop) exactly where the config's K tile divides K, so K = 256 / 768 (the embedders) share the
    # 3072-feature layers' binaries for the 128- and 256-wide tiles; masked or not, the same result
    from tritonkit.kernels import fp8 as f8
    runs = []  # (BLOCK_N, BLOCK_M, BLOCK_K, EVEN_K, the output it wrote)

    def run_in_interpreter(kernel, grid, *args, warmup=False, **kw):
        out = args[4]
        out.fill_(float("nan"))  # poisoned before every candidate
        kw = {k: v for k, v in kw.items() if k not in ("num_warps", "num_stages")}
        with f8.wrapping_int_math():
            f8.launchable(kernel, "cpu")[grid](*args, **kw)
        runs.append((kw["BLOCK_N"], kw["BLOCK_M"], kw["BLOCK_K"], kw["EVEN_K"], out.clone()))

    def every_candidate(device, key, cands, run, warm=None, **_):
        for c in cands[1:]:
            run(c)
        return cands[0]  # launched last by the launcher
    monkeypatch.setattr(fl, "launch_kernel", run_in_interpreter)
    monkeypatch.setattr(fl, "capability", lambda dev: 86)
    monkeypatch.setattr(fl.tuning, "pick", every_candidate)
    cands = fl._configs_for_bucket(1)
    binaries = set()
    for K in (256, 768, 1536):
        runs.clear()
        x, w, g = make(1, 48, K, torch.float16, torch.float8_e4m3fn, seed=K)
        scale = torch.rand(48, generator=g) + 0.5
        out = torch.empty((1, 48), dtype=torch.float16)
        args = (x, w.view(torch.uint8), w.view(torch.uint8), scale, out, 1, 48, K, x.stride(0), out.stride(0))
        fl._launch_cuda(args, dict(FMT=0, ACT=0, BIAS=0, SCALE=2), 1, 48, K, torch.device("cpu"))
        ref = fl.linear_reference(x, w, None, scale)
        assert sorted(r[:3] for r in runs) == sorted(c[:3] for c in cands)
        for bn, bm, bk, even_k, y in runs:
            assert even_k == (K % bk == 0), (K, bk)
            assert_close_to_reference(y, ref, torch.float16, K)
            binaries.add((bn, bm, bk, even_k))
    masked = {b[:3] for b in binaries if not b[3]}
    assert masked == {c[:3] for c in cands if c[2] == 512}  # only the 512-deep tiles mask, at K 256 / 768
    assert len(binaries) == len(cands) + len(masked)


def test_linear_op_fake_and_compile_without_graph_break():
    x, w, g = make(4, 32, 64, torch.float32, torch.float8_e4m3fn)
    b = torch.randn(32, generator=g)
    torch.library.opcheck(torch.ops.tritonkit.fp8_linear.default, (x, w, b, None), test_utils=("test_faketensor",))

    def f(x, w, b):
        return torch.relu(fl.linear_op(x * 2, w, b)) + 1

    torch._dynamo.reset()
    cf = torch.compile(f, backend="aot_eager", fullgraph=True)
    assert torch.equal(cf(x, w, b), f(x, w, b))


@pytest.mark.parametrize("cc", ARCHS)
@pytest.mark.parametrize("spec", range(len(fl.COMPILE_SPECS)))
def test_fused_linear_compiles_for_every_arch(cc, spec):
    (kernel, sig, consts), min_cc = fl.COMPILE_SPECS[spec]
    if cc < min_cc:
        pytest.skip(f"bf16 MMA needs sm{min_cc}; on sm{cc} the op decodes and uses torch's matmul")
    k = compile_for(kernel, sig, consts, cc, num_warps=4, num_stages=3)
    assert len(k.asm["cubin"]) > 0 and f"sm_{cc}" in k.asm["ptx"]
    assert "fp8e4nv" not in k.asm["ttgir"]


@pytest.mark.parametrize("cc", [86, 90])
def test_small_m_candidates_do_not_spill(cc):
    # the one-token candidates are bandwidth-bound GEMVs; one that spills its decoded tile to local
    # memory (the former 128x16x128: 1.2-1.3 KB a thread on sm80-90) only costs a cold step's compiles
    for bn, bm, bk, group, warps, stages in fl._configs_for_bucket(1):
        kernel, sig, consts = fl._lspec("*bf16", 0, 1, "*bf16", 1, 1, bn, bm, bk)
        spilled = spill_bytes(compile_for(kernel, sig, consts, cc, num_warps=warps, num_stages=stages), cc)
        if spilled is None:
            pytest.skip("this Triton has no ptxas of its own")
        assert spilled <= 512, ((bn, bm, bk, warps, stages), f"sm{cc}", spilled)


# (out N, in K) as in the issue, and the time / vector embedders' inputs (K tiles that divide K or not)
FLUX_SHAPES = [(3072, 12288), (12288, 3072), (3072, 3072), (3072, 9216), (3072, 256), (3072, 768)]


@pytest.mark.gpu
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("N,K", FLUX_SHAPES)
def test_gpu_linear_flux_shapes(act, N, K):
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(N, K, device="cuda", generator=g) * 0.05).to(torch.float8_e4m3fn)
    bias = torch.randn(N, device="cuda", generator=g).to(act)
    for M in (1, 16, 300, 4608):
        x = torch.randn(M, K, device="cuda", generator=g).to(act)
        y = fl.linear_op(x, w, bias, torch.tensor(0.7, device="cuda"))
        assert_close_to_reference(y, fl.linear_reference(x, w, bias, torch.tensor(0.7, device="cuda")), act, K)


@pytest.mark.gpu
def test_gpu_linear_e5m2_fp8_bias_channel_scale():
    g = torch.Generator(device="cuda").manual_seed(1)
    N, K = 640, 1000  # K not a multiple of the K tile: the masked loop
    w = (torch.randn(N, K, device="cuda", generator=g) * 0.1).to(torch.float8_e5m2)
    b = torch.randn(N, device="cuda", generator=g).to(torch.float8_e5m2)
    s = torch.rand(N, device="cuda", generator=g) + 0.5
    for M in (3, 77, 1025):
        x = torch.randn(2, M, K, device="cuda", generator=g).to(torch.bfloat16)
        assert_close_to_reference(fl.linear(x, w, b, s), fl.linear_reference(x, w, b, s), torch.bfloat16, K)


def test_compile_count_bench(tmp_path):
    # bench/fp8_linear_compiles.py counts the binaries the launcher's candidates need, through the
    # launcher itself: one a config at one token (EVEN_K there, but masked for K 256 / 768 where the
    # K tile is 512) and the large-M configs, Flux's 64-feature input masked for the 128-deep tile
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "c.json"
    subprocess.run([sys.executable, str(root / "bench" / "fp8_linear_compiles.py"), "--no-compile", "--json", str(out)],
                   check=True, capture_output=True, timeout=300)
    doc = json.loads(out.read_text())["models"]
    one = fl._configs_for_bucket(1)
    deep = sum(c[2] == 512 for c in one)
    for model in ("flux", "hunyuan"):
        assert doc[model]["buckets"]["1 token"] == {"binaries": len(one) + deep, "masked": deep, "compile_s": 0.0}
    large = fl._configs_for_bucket(8192)
    assert doc["flux"]["buckets"]["large"]["binaries"] == len(large) + sum(c[2] > 64 for c in large)
    assert doc["hunyuan"]["buckets"]["large"] == {"binaries": len(large), "masked": 0, "compile_s": 0.0}
