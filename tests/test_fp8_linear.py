"""Fused fp8-weight linear: numerics in the Triton interpreter, the custom op under torch.compile,
cross-compilation sm75..sm120, and on a GPU the Flux layer shapes at small and large M."""
import pytest
import torch

from compile_utils import ARCHS, compile_for
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


FLUX_SHAPES = [(3072, 12288), (12288, 3072), (3072, 3072), (3072, 9216)]  # (out N, in K) as in the issue


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
