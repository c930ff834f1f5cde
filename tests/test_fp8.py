"""fp8 decode/encode kernels: bit-exact against torch's casts (Triton interpreter on CPU, the real
kernels on a GPU), the custom ops under torch.compile, and cross-compilation sm75..sm120."""
import importlib
import sys
import types

import pytest
import torch

from compile_utils import ARCHS, compile_for
from conftest import REPO
from tritonkit.kernels import fp8

CODES = torch.arange(256, dtype=torch.int32).to(torch.uint8)
ALL16 = torch.arange(65536, dtype=torch.int32).to(torch.int16)
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def assert_bits_equal(y, ref, nan_bits=True):
    """Bit-exact; with nan_bits=False NaN results only need to be NaN in both."""
    assert y.dtype == ref.dtype and y.shape == ref.shape
    yb, rb = y.reshape(-1).view(BITS.get(y.dtype, torch.uint8)), ref.reshape(-1).view(BITS.get(y.dtype, torch.uint8))
    if not nan_bits:
        nan = torch.isnan(ref.reshape(-1).float())
        assert torch.equal(torch.isnan(y.reshape(-1).float()), nan)
        yb, rb = yb[~nan], rb[~nan]
    bad = (yb != rb).nonzero().flatten()
    assert bad.numel() == 0, [(int(i), hex(int(yb[i]) & 0xFFFFFFFF), hex(int(rb[i]) & 0xFFFFFFFF)) for i in bad[:8]]


def all_fp32_specials():
    g = torch.Generator().manual_seed(7)
    rnd = torch.randn(30000, generator=g) * torch.exp2(torch.randint(-40, 24, (30000,), generator=g).float())
    edges = [0.0, -0.0, 448, 449, 464, 464.0001, 479.99, 480, 481, 1e30, float("inf"), -float("inf"), float("nan"),
             2.0 ** -6, 2.0 ** -9, 2.0 ** -10, 2.0 ** -10 * 1.0001, 3 * 2.0 ** -10, 2.0 ** -14, 2.0 ** -16, 2.0 ** -17,
             2.0 ** -17 * 1.001, 57344, 61439.99, 61440, 65504, 65536, 1e-40, -1e-40, -2.0 ** -10, -464, -500]
    neg_nan = torch.tensor([0x7FC00000 | (1 << 31)], dtype=torch.int64).to(torch.int32).view(torch.float32)
    return torch.cat([rnd, torch.tensor(edges), -torch.tensor(edges), neg_nan])


# ----------------------------------------------------------------------------- decode
@pytest.mark.parametrize("dtype", fp8.OUT_DTYPES)
@pytest.mark.parametrize("fmt", fp8.FP8_DTYPES)
def test_decode_all_256_codes_bit_exact(fmt, dtype, poison):
    x = CODES.view(fmt)
    out = poison(torch.empty(256, dtype=dtype))
    fp8.decode(x, dtype, out=out)
    assert_bits_equal(out, x.to(dtype))  # NaN payloads included (torch's CPU patterns)


@pytest.mark.parametrize("dtype", fp8.OUT_DTYPES)
@pytest.mark.parametrize("fmt", fp8.FP8_DTYPES)
def test_decode_with_scales_matches_torch(fmt, dtype):
    # All codes in every row; per-tensor and per-row scales, including ones that overflow fp16
    # (x 1e3, x 3e4) and underflow it into subnormals / zero (x 1e-6).
    x = CODES.repeat(6).reshape(6, 256).view(fmt)
    for s in (torch.tensor(0.0123), torch.tensor([1.0, 1e3, 3e4, 1e-6, 0.37, 2.0 ** -20]), torch.tensor([7.5])):
        y = fp8.decode(x, dtype, s)
        assert_bits_equal(y, fp8.decode_reference(x, dtype, s), nan_bits=False)


@pytest.mark.parametrize("dtype", fp8.OUT_DTYPES)
@pytest.mark.parametrize("fmt", fp8.FP8_DTYPES)
def test_decode_with_scale_rounded_to_the_output_dtype_matches_torch(fmt, dtype, poison):
    """round_scale: ``x.to(dtype) * s.to(dtype)`` in torch (comfy-kitchen's eager dequantize),
    scales that round up/down in fp16 and bf16, overflow fp16, or make subnormal products."""
    x = CODES.view(fmt)
    for sv in (0.0123, 1 / 3, 0.0370001, 7.1234567, 3e4, 1e-6, 2.0 ** -20 * 1.7, 1e-30):
        s = torch.tensor(sv)
        out = poison(torch.empty(256, dtype=dtype))
        fp8.decode(x, dtype, s, out=out, round_scale=True)
        assert_bits_equal(out, x.to(dtype) * s.to(dtype), nan_bits=False)
        assert_bits_equal(out, fp8.decode_reference(x, dtype, s, round_scale=True), nan_bits=False)


def test_decode_random_tensors_and_shapes(poison):
    g = torch.Generator().manual_seed(1)
    for shape in [(1,), (3, 5), (17, 33, 2), (70_001,)]:
        x = (torch.randn(shape, generator=g) * 40).to(torch.float8_e4m3fn)
        out = poison(torch.empty(shape, dtype=torch.bfloat16))
        fp8.decode(x, torch.bfloat16, out=out)
        assert torch.equal(out.view(torch.int16), x.to(torch.bfloat16).view(torch.int16))
    e = torch.empty(0, 4, dtype=torch.float8_e5m2)
    assert fp8.decode(e, torch.float16).shape == (0, 4)


def test_decode_rejects_bad_input():
    with pytest.raises(TypeError):
        fp8.decode(torch.zeros(3), torch.float16)
    with pytest.raises(ValueError, match="scale"):
        fp8.decode(torch.zeros(4, 3, dtype=torch.float8_e4m3fn), torch.float16, torch.ones(5))


# ----------------------------------------------------------------------------- encode
def test_torch_saturation_probe():
    sat = fp8.torch_saturates_e4m3fn()
    got = int(torch.tensor([1e4]).to(torch.float8_e4m3fn).view(torch.uint8)[0])
    assert got == (0x7E if sat else 0x7F)


@pytest.mark.parametrize("fmt", fp8.FP8_DTYPES)
@pytest.mark.parametrize("src", [torch.float16, torch.bfloat16])
def test_encode_every_16bit_pattern_bit_exact(src, fmt, poison):
    x = ALL16.view(src)  # every fp16/bf16 value: ±0, subnormals, overflow, ±inf, NaNs of both signs
    out = poison(torch.empty(65536, dtype=fmt))
    fp8.encode(x, fmt, out=out)
    assert_bits_equal(out, x.to(fmt))


@pytest.mark.parametrize("fmt", fp8.FP8_DTYPES)
def test_encode_fp32_edges_and_random_bit_exact(fmt):
    x = all_fp32_specials()
    assert_bits_equal(fp8.encode(x, fmt), x.to(fmt))
    s = torch.tensor(0.37)
    assert_bits_equal(fp8.encode(x, fmt, scale=s), fp8.encode_reference(x, fmt, scale=s))
    x2 = x[: 40 * 700].reshape(40, 700)
    s2 = torch.rand(40, generator=torch.Generator().manual_seed(3)) * 4 + 0.01
    assert_bits_equal(fp8.encode(x2, fmt, scale=s2), fp8.encode_reference(x2, fmt, scale=s2))


@pytest.mark.parametrize("fmt", fp8.FP8_DTYPES)
def test_encode_both_overflow_policies(fmt):
    # The policy torch does not use here is checked against the same C++ algorithm in torch ops
    # (encode_reference), itself checked against torch's cast for the policy torch does use.
    x = torch.cat([all_fp32_specials(), ALL16.view(torch.float16).float()])
    native = fmt == torch.float8_e4m3fn and fp8.torch_saturates_e4m3fn()
    assert_bits_equal(fp8._encode_bits_torch(x, fmt, native).view(fmt), x.to(fmt))
    for sat in (True, False):
        assert_bits_equal(fp8.encode(x, fmt, saturate=sat), fp8.encode_reference(x, fmt, saturate=sat))
    big = torch.tensor([470.0, 1e6, float("inf"), -float("inf"), 60000.0, 1e9])
    y = fp8.encode(big, fmt, saturate=True).view(torch.uint8).tolist()
    assert y == ([0x7E, 0x7E, 0x7E, 0xFE, 0x7E, 0x7E] if fmt == torch.float8_e4m3fn else
                 [0x5F, 0x7B, 0x7B, 0xFB, 0x7B, 0x7B])
    y = fp8.encode(big, fmt, saturate=False).view(torch.uint8).tolist()
    assert y == ([0x7F, 0x7F, 0x7F, 0xFF, 0x7F, 0x7F] if fmt == torch.float8_e4m3fn else
                 [0x5F, 0x7C, 0x7C, 0xFC, 0x7B, 0x7C])


@pytest.mark.parametrize("fmt", fp8.FP8_DTYPES)
def test_round_trips(fmt):
    codes = CODES.view(fmt)
    finite = ~torch.isnan(codes.float())
    for dt in fp8.OUT_DTYPES:
        back = fp8.encode(fp8.decode(codes, dt), fmt)
        assert torch.equal(back.view(torch.uint8)[finite], CODES[finite])
    g = torch.Generator().manual_seed(5)
    w = torch.randn(64, 96, generator=g).to(torch.bfloat16) * 3
    scale = w.abs().amax(dim=1).float() / torch.finfo(fmt).max
    q = fp8.encode(w, fmt, scale=scale)
    assert_bits_equal(q, fp8.encode_reference(w, fmt, scale=scale))
    deq = fp8.decode(q, torch.float32, scale)
    rel = ((deq - w.float()).abs() / w.float().abs().clamp_min(1e-3)).max()
    assert rel <= (2.0 ** -4 if fmt == torch.float8_e4m3fn else 2.0 ** -3) + 1e-6


# ----------------------------------------------------------------------------- custom ops
def test_custom_ops_fake_and_schema():
    x = CODES[:64].view(torch.float8_e4m3fn).reshape(8, 8)
    # (test_schema can't run on fp8 inputs: its checker multiplies them, which torch doesn't implement)
    torch.library.opcheck(torch.ops.tritonkit.fp8_decode.default, (x, None, torch.bfloat16),
                          test_utils=("test_faketensor",))
    torch.library.opcheck(torch.ops.tritonkit.fp8_encode.default, (torch.randn(8, 8), torch.tensor(0.5), torch.float8_e5m2, -1),
                          test_utils=("test_schema", "test_faketensor"))


def test_custom_ops_compile_with_no_graph_break():
    def f(w, x, s):
        y = fp8.decode_op(w, torch.float32, s) * 2
        return fp8.encode_op(y + x, torch.float8_e4m3fn)

    w = (torch.randn(16, 16) * 10).to(torch.float8_e4m3fn)
    x, s = torch.randn(16, 16), torch.tensor(0.5)
    torch._dynamo.reset()
    cf = torch.compile(f, backend="aot_eager", fullgraph=True)  # fullgraph: any graph break raises
    assert torch.equal(cf(w, x, s).view(torch.uint8), f(w, x, s).view(torch.uint8))


def test_ops_defined_once_when_the_pack_is_imported_twice():
    # ComfyUI imports the pack under a path-derived module name; a second copy must reuse the ops.
    pkg = types.ModuleType("tritonkit_second_copy")
    pkg.__path__ = [str(REPO)]
    sys.modules["tritonkit_second_copy"] = pkg
    try:
        mod = importlib.import_module("tritonkit_second_copy.kernels.fp8")
        lin = importlib.import_module("tritonkit_second_copy.kernels.fp8_linear")
        assert mod.decode_op(CODES[:8].view(torch.float8_e5m2), torch.float16).dtype == torch.float16
        # Whichever copy defined an op, its launches count where every copy reads them (one
        # process-wide counter; a copy-local one lost the fused-linear launches of test_fp8_node
        # when this test ran first).
        assert mod.LAUNCHES is fp8.LAUNCHES and lin.LAUNCHES is fp8.LAUNCHES
        before = dict(fp8.LAUNCHES)
        w = (torch.randn(4, 8) * 4).to(torch.float8_e4m3fn)
        torch.ops.tritonkit.fp8_linear(torch.randn(2, 8), w, None, None)
        torch.ops.tritonkit.fp8_decode(w, None, torch.float32)
        assert fp8.LAUNCHES["linear"] == before.get("linear", 0) + 1
        assert fp8.LAUNCHES["decode"] == before.get("decode", 0) + 1
    finally:
        for k in [k for k in sys.modules if k.startswith("tritonkit_second_copy")]:
            del sys.modules[k]


# ----------------------------------------------------------------------------- cross-compile
@pytest.mark.parametrize("cc", ARCHS)
@pytest.mark.parametrize("spec", range(len(fp8.COMPILE_SPECS)))
def test_fp8_casts_compile_for_every_arch(cc, spec):
    kernel, sig, consts = fp8.COMPILE_SPECS[spec]
    k = compile_for(kernel, sig, consts, cc)
    assert len(k.asm["cubin"]) > 0 and f"sm_{cc}" in k.asm["ptx"]
    assert "fp8e4nv" not in k.asm["ttir"] and "e4m3" not in k.asm["ptx"]


@pytest.mark.parametrize("cc", ARCHS)
def test_a_kernel_with_an_fp8e4nv_pointer_fails_below_sm89(cc):
    """The failure this pack avoids: what Inductor generates for ``fp8_e4m3fn.to(bf16)``."""
    import triton
    import triton.language as tl

    @triton.jit
    def upcast(x_ptr, o_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(o_ptr + offs, tl.load(x_ptr + offs).to(tl.float32))

    sig, consts = {"x_ptr": "*fp8e4nv", "o_ptr": "*fp32", "BLOCK": "constexpr"}, {"BLOCK": 128}
    if cc < 89:
        with pytest.raises(Exception, match="fp8e4nv"):
            compile_for(upcast, sig, consts, cc)
    else:
        assert len(compile_for(upcast, sig, consts, cc).asm["cubin"]) > 0


# ----------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", fp8.FP8_DTYPES)
def test_gpu_decode_all_codes_match_torch_cuda_and_cpu(fmt, poison):
    x = CODES.cuda().view(fmt)
    for dt in fp8.OUT_DTYPES:
        out = poison(torch.empty(256, dtype=dt, device="cuda"))
        fp8.decode(x, dt, out=out)
        assert_bits_equal(out.cpu(), x.cpu().to(dt))                  # torch CPU, NaN bits included
        assert_bits_equal(out.cpu(), x.to(dt).cpu(), nan_bits=False)  # torch CUDA
        s = torch.tensor([1e3, 1e-6, 0.3, 5.0], device="cuda")
        xs = x.repeat(4).reshape(4, 256)
        assert_bits_equal(fp8.decode(xs, dt, s).cpu(), fp8.decode_reference(xs.cpu(), dt, s.cpu()), nan_bits=False)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", fp8.FP8_DTYPES)
def test_gpu_encode_matches_torch_cuda(fmt):
    # torch's CUDA cast drops the sign of NaN inputs (-NaN -> 0x7F), its CPU cast keeps it (0xFF,
    # which the kernel matches): NaN results are compared as NaN here, bit-exact against the CPU.
    for src in (torch.float16, torch.bfloat16):
        x = ALL16.cuda().view(src)
        y = fp8.encode(x, fmt).cpu()
        assert_bits_equal(y, x.to(fmt).cpu(), nan_bits=False)
        assert_bits_equal(y, x.cpu().to(fmt))
    x = all_fp32_specials().cuda()
    assert_bits_equal(fp8.encode(x, fmt).cpu(), x.to(fmt).cpu(), nan_bits=False)
    assert_bits_equal(fp8.encode(x, fmt).cpu(), x.cpu().to(fmt))
    big = (torch.randn(3_000_017, device="cuda") * 100).to(torch.bfloat16)
    assert_bits_equal(fp8.encode(big, fmt).cpu(), big.to(fmt).cpu())
    w = fp8.encode(big, fmt)  # with torch <= 2.11 e4m3fn overflow (|x| >= 480) is NaN, as torch's cast gives
    assert_bits_equal(fp8.decode(w, torch.bfloat16).cpu(), w.to(torch.bfloat16).cpu(), nan_bits=False)  # CUDA: 0x7FFF
    assert_bits_equal(fp8.decode(w, torch.bfloat16).cpu(), w.cpu().to(torch.bfloat16))


def test_eager_op_wrappers_skip_the_dispatcher_and_compiled_ones_keep_it(monkeypatch):
    # eager calls on plain tensors run the implementation (no per-call dispatch cost); traced
    # calls (and fake/subclass tensors) go through the custom op
    from tritonkit.kernels import fp8_linear as fl
    calls = []
    monkeypatch.setattr(fp8, "decode", lambda *a, **kw: calls.append("decode") or torch.zeros(2, 2))
    monkeypatch.setattr(fl, "linear", lambda *a, **kw: calls.append("linear") or torch.zeros(2, 2))
    w = torch.zeros(2, 2, dtype=torch.float8_e4m3fn)
    fp8.decode_op(w, torch.float32)
    fl.linear_op(torch.zeros(2, 2), w)
    assert calls == ["decode", "linear"]


def test_warm_decode_compiles_each_variant_as_a_weight_launches_it(monkeypatch):
    # off CUDA, or switched off: nothing; on CUDA each variant runs in a preparing run (compile only)
    assert fp8.warm_decode(torch.device("cpu"), {(torch.float8_e4m3fn, torch.bfloat16, True, True, True)}) is None
    from tritonkit.kernels import prepare
    got = {}
    monkeypatch.setattr(prepare, "available", lambda: True)
    monkeypatch.setattr(prepare, "prepare", lambda fns: got.update(fns) or "prepared")
    v1, v2 = (torch.float8_e4m3fn, torch.bfloat16, True, True, True), (torch.float8_e5m2, torch.float16, False, False, False)
    assert fp8.warm_decode(torch.device("cuda"), [v1, v2, v1]) == "prepared" and set(got) == {v1, v2}
    monkeypatch.setenv(fp8.WARM_ENV, "0")
    assert fp8.warm_decode(torch.device("cuda"), [v1]) is None
    # what each runs: the decode of a 16- (or 17-) element tensor of that kind, its launch not counted
    calls = []
    real = fp8.decode

    def decode(x, dtype, scale=None, round_scale=False):
        fp8.LAUNCHES["decode"] += 1
        calls.append((x.dtype, x.numel(), dtype, None if scale is None else scale.tolist(), round_scale))
        return real(x, dtype, scale, round_scale=round_scale)
    monkeypatch.setattr(fp8, "decode", decode)
    n = fp8.LAUNCHES["decode"]
    fp8._warm_one(torch.device("cpu"), *v1)
    fp8._warm_one(torch.device("cpu"), *v2)
    assert calls == [(torch.float8_e4m3fn, 16, torch.bfloat16, [1.0], True), (torch.float8_e5m2, 17, torch.float16, None, False)]
    assert fp8.LAUNCHES["decode"] == n


@pytest.mark.gpu
def test_gpu_a_warmed_decode_compiles_nothing_at_the_weights_first_call():
    from triton import knobs
    from tritonkit.kernels import prepare
    if not prepare.available() or not hasattr(knobs.compilation, "listener"):
        pytest.skip("this Triton compiles nothing in the background (3.4+)")
    dev = torch.device("cuda")
    # a variant no other test launches: e5m2 codes to fp16 with a rounded per-tensor scale
    w = (torch.randn(3072, 3072, device=dev) * 0.1).to(torch.float8_e5m2)
    scale = torch.tensor(0.0123, device=dev)
    prep = fp8.warm_decode(dev, {(w.dtype, torch.float16, True, True, w.numel() % 16 == 0)})
    prep.wait()
    compiled = []
    saved = knobs.compilation.listener
    knobs.compilation.listener = lambda *a, **kw: compiled.append(kw.get("src"))
    try:
        out = fp8.decode(w, torch.float16, scale, round_scale=True)
        torch.cuda.synchronize()
    finally:
        knobs.compilation.listener = saved
    assert compiled == []
    ref = (w.float() * scale.half().float()).half()
    assert torch.equal(out, ref)
