"""The "Triton fp8 Fallback" node: planning and patching on ComfyUI's own ops (in process, CPU,
kernels through the Triton interpreter), then the real thing in a ComfyUI 0.3.75 server, and on a
GPU the compile story (no fp8e4nv in Inductor's code, which compiles for sm80/sm86)."""
import collections
import json
import logging
import os
import re
import sys
import types

import pytest
import torch

from conftest import REPO

FP8 = torch.float8_e4m3fn


@pytest.fixture(scope="module")
def comfy():
    """ComfyUI's modules in this process, on the CPU (the tree TK_COMFYUI names, else .comfyui)."""
    from comfy_harness import comfyui_dir
    path = str(comfyui_dir())
    if not os.path.isfile(os.path.join(path, "comfy", "ops.py")):
        pytest.skip(f"ComfyUI sources are not in {path} (scripts/setup_env.sh)")
    if path not in sys.path:
        sys.path.insert(0, path)
    try:
        import comfy.cli_args
        if not torch.cuda.is_available():
            comfy.cli_args.args.cpu = True
        import comfy.model_patcher
        import comfy.ops
    except ImportError as e:  # e.g. a GPU box without ComfyUI's requirements
        pytest.skip(f"ComfyUI's modules don't import here: {e}")
    return comfy


class PlainScaleNorm(torch.nn.Module):
    """An RMSNorm whose scale is a plain parameter outside any ComfyUI op: Flux's and HunyuanVideo's QK norm up to
    ComfyUI 0.8 (``comfy.ldm.flux.layers.RMSNorm``, a ComfyUI ``operations.RMSNorm`` in later versions), and
    the shape of the small fp8 parameters newer models still keep outside ops (WAN's modulation)."""

    def __init__(self, dim, dtype=None, device=None):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.empty(dim, dtype=dtype, device=device))

    def forward(self, x):
        import comfy.rmsnorm
        return comfy.rmsnorm.rms_norm(x, self.scale, 1e-6)


@pytest.fixture
def node(monkeypatch):
    from tritonkit.nodes import fp8_fallback
    monkeypatch.setenv("TRITONKIT_FORCE_TRITON_ON_CPU", "1")
    monkeypatch.delenv("TRITONKIT_FORCE_ARCH", raising=False)
    return fp8_fallback


def build(comfy, ops=None, dtype=FP8, fast=False, seed=0, device="cpu", compute_dtype=torch.float32):
    """A small diffusion model made of ComfyUI ops the way UNETLoader builds an fp8 model:
    every parameter in the fp8 storage dtype, compute dtype float32 on the CPU."""
    ops = ops or comfy.ops.manual_cast

    class DM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.img_in = ops.Linear(32, 64, dtype=dtype, device=device)
            self.qk = PlainScaleNorm(64, dtype=dtype, device=device)      # a plain fp8 parameter
            self.norm = ops.LayerNorm(64, dtype=dtype, device=device)
            self.conv = ops.Conv1d(4, 4, 3, padding=1, dtype=dtype, device=device)
            self.out = ops.Linear(64, 16, dtype=dtype, device=device)

        def forward(self, x):
            h = self.norm(self.qk(self.img_in(x)))
            h = self.conv(h.reshape(h.shape[0], 4, -1)).reshape(h.shape)
            return self.out(h)

    class Base(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.diffusion_model = DM()
            self.manual_cast_dtype = compute_dtype
            self.model_config = types.SimpleNamespace(optimizations={"fp8": fast})

    base = Base()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in base.named_parameters():
            if "scale_weight" in name:
                p.fill_(0.05)
            elif "scale_input" not in name:
                p.copy_((torch.randn(p.shape, generator=g) * 0.5).to(p.dtype))
    mp = comfy.model_patcher.ModelPatcher(base, torch.device(device), torch.device(device))
    return base, mp


def run(base, x):
    with torch.no_grad():
        return base.diffusion_model(x)


X = torch.randn(2, 3, 32, generator=torch.Generator().manual_seed(9))


def patched_with_lora(node, base, mp, lora):
    """ComfyUI's output on X with the weight functions ``lora()`` sets, and the node's patched
    clone ("auto") with ``lora()`` applied again after patching."""
    lora()
    ref = run(base, X)
    clone, _ = node.patch_model(mp, "auto")
    clone.patch_model()
    lora()
    return ref, clone


def test_patch_is_exact_counted_and_reversible(comfy, node):
    from tritonkit.kernels import fp8
    base, mp = build(comfy)
    ref = run(base, X)
    clone, text = node.patch_model(mp, "auto")
    assert clone is not mp and clone.model is mp.model
    assert "4 fp8 layers patched: 2 -> fused W8A16 linear" in text, text
    assert "4 fp8 biases of those layers and 1 small fp8 parameters outside ComfyUI ops decoded once" in text, text
    assert not mp.object_patches  # the input MODEL is untouched
    clone.patch_model()
    try:
        dm = base.diffusion_model
        assert dm.qk.scale.dtype == torch.float32 and dm.img_in.weight.dtype == FP8
        # fp8 biases are decoded once, at patch time, not on every call (the Flux bench found
        # half of a step's kernel launches decoding 3072-element biases)
        assert all(getattr(dm, n).bias.dtype == torch.float32 for n in ("img_in", "out", "norm", "conv"))
        before = dict(fp8.LAUNCHES)
        node.STATS.reset()
        out = run(base, X)
        launches = {k: v - before.get(k, 0) for k, v in fp8.LAUNCHES.items() if v - before.get(k, 0)}
        assert launches == {"linear": 2, "decode": 2}  # the two weights of norm and conv; no bias
        assert node.STATS.layers == {"img_in": "fused-linear", "out": "fused-linear", "norm": "decode", "conv": "decode"}
        assert not node.STATS.fallbacks
        # fp32 compute: our decode is exact, the fused linear sums in another order
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        # the node run again while this clone is still applied (ComfyUI keeps loaded models patched)
        plan2 = node.plan_model(mp, "cast-only")
        assert set(plan2.layers) == {"img_in", "out", "norm", "conv"}
        assert set(plan2.predecode) == {"qk.scale", "img_in.bias", "out.bias", "norm.bias", "conv.bias"}
        assert all(p.dtype == FP8 for p, _ in plan2.predecode.values())  # the originals, not this clone's
    finally:
        clone.unpatch_model()
    assert base.diffusion_model.qk.scale.dtype == FP8 and base.diffusion_model.out.bias.dtype == FP8
    before = dict(fp8.LAUNCHES)
    assert torch.equal(run(base, X), ref) and dict(fp8.LAUNCHES) == before


def test_cast_only_and_off(comfy, node):
    base, mp = build(comfy)
    ref = run(base, X)
    clone, text = node.patch_model(mp, "cast-only")
    assert "4 -> Triton decode" not in text and "fused" not in text, text
    clone.patch_model()
    try:
        node.STATS.reset()
        torch.testing.assert_close(run(base, X), ref, rtol=0, atol=0)  # decode + torch's own ops: identical
        assert set(node.STATS.layers.values()) == {"decode"}
    finally:
        clone.unpatch_model()
    same, text = node.patch_model(mp, "off")
    assert same is mp and "unchanged" in text


def test_cpu_without_force_keeps_torch(comfy, node, monkeypatch):
    monkeypatch.delenv("TRITONKIT_FORCE_TRITON_ON_CPU")
    base, mp = build(comfy)
    same, text = node.patch_model(mp, "auto")
    assert same is mp and "TRITONKIT_FORCE_TRITON_ON_CPU" in text


def test_lora_weight_functions_and_offloaded_weights_fall_back_cleanly(comfy, node, caplog):
    base, mp = build(comfy)
    dm = base.diffusion_model

    def lora():  # a lowvram LoRA patch: callables applied after the upcast (ModelPatcher.load sets them)
        dm.img_in.weight_function = [lambda w: w * 1.5]
        dm.out.bias_function = [lambda b: b + 0.25]

    ref, clone = patched_with_lora(node, base, mp, lora)
    try:
        node.STATS.reset()
        torch.testing.assert_close(run(base, X), ref, rtol=1e-5, atol=1e-5)
        assert node.STATS.layers["img_in"] == "decode" and node.STATS.layers["out"] == "decode"
        # weights somewhere else than the activations (offloaded): ComfyUI's own forward
        cfg = dm.img_in.forward_comfy_cast_weights.tritonkit_fp8
        meta_w = torch.nn.Parameter(torch.empty(64, 32, dtype=FP8, device="meta"), requires_grad=False)
        fake = types.SimpleNamespace(weight=meta_w, bias=None)
        assert node._eligible(fake, X, cfg) == "weights not on the compute device (offloaded)"
        # a bias elsewhere: a decoded one is moved per call (as ComfyUI moves it), an fp8 one falls back
        fake = types.SimpleNamespace(weight=dm.img_in.weight, bias=torch.zeros(64, device="meta"))
        assert node._eligible(fake, X, cfg) is None
        fake.bias = torch.zeros(64, dtype=FP8, device="meta")
        assert node._eligible(fake, X, cfg) == "fp8 bias not on the compute device (offloaded)"
        with caplog.at_level(logging.INFO, logger="TritonKit"):
            for _ in range(3):
                node._fallback(cfg, "weights not on the compute device (offloaded)")
        assert sum("offloaded" in r.getMessage() for r in caplog.records) <= 1  # once per reason
    finally:
        clone.unpatch_model()
        dm.img_in.weight_function = []
        dm.out.bias_function = []


def test_scaled_fp8_layers(comfy, node):
    if not hasattr(comfy.ops, "scaled_fp8_ops"):
        pytest.skip("ComfyUI >= 0.8 loads scaled fp8 as QuantizedTensor layers (the test_quantized_* tests)")
    ops = comfy.ops.scaled_fp8_ops(fp8_matrix_mult=False, scale_input=False, override_dtype=FP8)
    base, mp = build(comfy, ops=ops)
    assert base.diffusion_model.img_in.scale_weight is not None
    ref = run(base, X)
    clone, text = node.patch_model(mp, "auto")
    clone.patch_model()
    try:
        node.STATS.reset()
        torch.testing.assert_close(run(base, X), ref, rtol=1e-5, atol=1e-5)
        assert node.STATS.layers["img_in"] == "fused-linear"
    finally:
        clone.unpatch_model()


def test_the_weights_decode_variants_are_known_at_patch_time(comfy, node):
    # what kernels/fp8.py's warm_decode compiles while the model loads: one variant per kind of weight
    base, mp = build(comfy, compute_dtype=torch.bfloat16)
    plan = node.plan_model(mp, "auto")
    assert node.decode_variants(plan, base.diffusion_model) == {(FP8, torch.bfloat16, False, False, True)}
    if hasattr(comfy.ops, "scaled_fp8_ops"):
        ops = comfy.ops.scaled_fp8_ops(fp8_matrix_mult=False, scale_input=False, override_dtype=FP8)
        base, mp = build(comfy, ops=ops, compute_dtype=torch.float16)
        got = node.decode_variants(node.plan_model(mp, "auto"), base.diffusion_model)
        assert (FP8, torch.float16, True, False, True) in got, got


def test_unhandled_layers_are_reported(comfy, node):
    base, mp = build(comfy)
    dm = base.diffusion_model
    dm.emb = comfy.ops.manual_cast.Embedding(10, 8, dtype=FP8)
    plan = node.plan_model(mp, "auto")
    assert plan.skipped == {"Embedding layers are not handled": ["emb"]}
    assert "left on torch: 1 (Embedding layers are not handled): emb" in node.describe(plan)


def test_pre_kitchen_quantized_tensor_is_reported(comfy, node):
    """ComfyUI 0.3.x's own QuantizedTensor (files with _quantization_metadata, before comfy-kitchen):
    left on ComfyUI's path with its reason, the other fp8 layers still served."""
    qo = pytest.importorskip("comfy.quant_ops")
    if not hasattr(qo.QuantizedTensor, "_layout_type") and "layout_params" not in qo.QuantizedTensor.__init__.__code__.co_varnames:
        pytest.skip("this ComfyUI's QuantizedTensor is comfy-kitchen's (the test_quantized_* tests)")
    base, mp = build(comfy)
    dm = base.diffusion_model
    q = dm.out.weight.detach().clone()
    dm.out.weight = torch.nn.Parameter(qo.QuantizedTensor(q, "TensorCoreFP8Layout", {"scale": torch.tensor(1.0),
                                                                                     "orig_dtype": torch.float32}),
                                       requires_grad=False)
    plan = node.plan_model(mp, "auto")
    assert plan.skipped == {"QuantizedTensor layers of ComfyUI before 0.8 (no comfy-kitchen) are not handled": ["out"]}
    assert {"img_in", "norm", "conv"} <= set(plan.layers)


# ----------------------------------------------------------------------------- ComfyUI 0.8+ QuantizedTensor
E5M2 = torch.float8_e5m2
FP8_FORMATS = {FP8: "float8_e4m3fn", E5M2: "float8_e5m2"}


@pytest.fixture
def kitchen(comfy):
    """ComfyUI 0.8+ with comfy-kitchen's QuantizedTensor."""
    if not hasattr(comfy.ops, "mixed_precision_ops") or "disabled" not in comfy.ops.mixed_precision_ops.__code__.co_varnames:
        pytest.skip("this ComfyUI has no comfy-kitchen QuantizedTensor layers (0.8+)")
    try:
        from comfy_kitchen.tensor import QuantizedTensor
    except ImportError as e:
        pytest.skip(f"comfy-kitchen does not import: {e}")
    return QuantizedTensor


def _comfy_quant(fmt):
    return torch.tensor(list(json.dumps({"format": fmt}).encode("utf-8")), dtype=torch.uint8)


def build_quantized(comfy, fp8_compute=False, compute_dtype=torch.float32, seed=0, device="cpu"):
    """A small model the way ComfyUI 0.8 loads a quantized / scaled-fp8 file: mixed_precision_ops
    Linear layers loaded from a state dict with per-layer ``comfy_quant`` (an e4m3fn layer, an
    e5m2 layer with an input scale, an unquantized Linear) next to legacy fp8 ops (a Conv1d
    and an fp8 RMSNorm scale of a plain fp8 checkpoint). fp8_compute=False is a GPU below sm89
    (ComfyUI disables the fp8 formats: the full-precision path)."""
    disabled = set() if fp8_compute else {"float8_e4m3fn", "float8_e5m2"}
    ops = comfy.ops.mixed_precision_ops({"mixed_ops": True}, compute_dtype, disabled=disabled)
    g = torch.Generator().manual_seed(seed)

    class DM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.img_in = ops.Linear(32, 64)
            self.mid = ops.Linear(64, 64)
            self.plain = ops.Linear(64, 64)
            self.qk = PlainScaleNorm(64, dtype=FP8)
            self.conv = comfy.ops.manual_cast.Conv1d(4, 4, 3, padding=1, dtype=FP8)
            self.out = ops.Linear(64, 16)

        def forward(self, x):
            h = self.qk(self.mid(self.img_in(x)))
            h = self.conv(h.reshape(h.shape[0], 4, -1)).reshape(h.shape)
            return self.out(self.plain(h))

    dm = DM()
    sd = {}
    for name, fmt, n_out, n_in, input_scale in (("img_in", FP8, 64, 32, False), ("mid", E5M2, 64, 64, True),
                                                ("out", FP8, 16, 64, False), ("plain", None, 64, 64, False)):
        w = torch.randn(n_out, n_in, generator=g) * 0.05
        sd[f"{name}.bias"] = torch.randn(n_out, generator=g) * 0.1
        if fmt is None:
            sd[f"{name}.weight"] = w
            continue
        scale = w.abs().amax() / torch.finfo(fmt).max
        sd[f"{name}.weight"] = (w / scale).to(fmt)
        sd[f"{name}.weight_scale"] = scale.float()
        sd[f"{name}.comfy_quant"] = _comfy_quant(FP8_FORMATS[fmt])
        if input_scale:
            sd[f"{name}.input_scale"] = torch.tensor(0.02)
    sd["qk.scale"] = (torch.rand(64, generator=g) + 0.5).to(FP8)
    sd["conv.weight"] = (torch.randn(4, 4, 3, generator=g) * 0.3).to(FP8)
    sd["conv.bias"] = (torch.randn(4, generator=g) * 0.1).to(FP8)
    missing, unexpected = dm.load_state_dict(sd, strict=False)
    assert not missing and not unexpected, (missing, unexpected)

    class Base(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.diffusion_model = dm
            self.manual_cast_dtype = compute_dtype
            self.model_config = types.SimpleNamespace(optimizations={"fp8": False})

    base = Base().to(device)
    return base, comfy.model_patcher.ModelPatcher(base, torch.device(device), torch.device(device))


QUANT_LAYERS = {"img_in", "mid", "out"}
AWKWARD_SCALES = (0.0370001, 1 / 3, 7.1234567, 1.37e-3, 2.0 ** -20 * 1.7, 3e4, 1e-30, 448.0)


@pytest.mark.parametrize("fmt", [FP8, E5M2])
def test_quantized_decode_is_bit_exact_against_comfyuis_dequantize(comfy, node, kitchen, fmt):
    """All 256 codes times awkward scales (fp16/bf16 rounding ties, fp16 overflow, bf16
    subnormals), to each compute dtype: the node's decode of a QuantizedTensor equals the
    tensor's own dequantize() bit for bit (NaN codes: NaN)."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fmt).reshape(16, 16)
    layout = {FP8: "TensorCoreFP8E4M3Layout", E5M2: "TensorCoreFP8E5M2Layout"}[fmt]
    probe = kitchen(codes, layout, kitchen.from_float(torch.ones(2, 2), layout)._params)
    rounding = dict(node.comfy_dequant_rounding(probe, torch.device("cpu")))
    assert rounding[torch.bfloat16] is True and rounding[torch.float16] is True  # comfy-kitchen eager
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        for sv in AWKWARD_SCALES:
            params = type(probe._params)(scale=torch.tensor(sv), orig_dtype=dt, orig_shape=(16, 16))
            qt = kitchen(codes, layout, params)
            assert node.quantized_problem(qt) is None
            m = types.SimpleNamespace(weight=qt, weight_function=[])
            cfg = node.LayerConfig(name="l", kind="linear", fused=False, quant=tuple(rounding.items()))
            got, ref = node._cast_weight(m, dt, cfg), qt.dequantize()
            assert node._same_bits(got, ref), (dt, sv)
            assert torch.isnan(ref).any() or fmt == E5M2 and sv == 3e4  # the NaN codes were checked too


@pytest.mark.parametrize("mode", ["cast-only", "auto"])
def test_quantized_layers_are_served_and_match_comfyui(comfy, node, kitchen, mode):
    base, mp = build_quantized(comfy)
    dm = base.diffusion_model
    assert isinstance(dm.img_in.weight, kitchen) and dm.img_in._full_precision_mm
    assert dm.mid.weight._qdata.dtype == E5M2 and dm.plain.weight.dtype == torch.float32
    ref = run(base, X)
    clone, text = node.patch_model(mp, mode)
    assert "3 of them ComfyUI QuantizedTensor layers (e4m3fn 2, e5m2 1)" in text, text
    assert "1 carry an input scale" in text, text
    clone.patch_model()
    try:
        from tritonkit.kernels import fp8
        node.STATS.reset()
        before = dict(fp8.LAUNCHES)
        out = run(base, X)
        launches = {k: v - before.get(k, 0) for k, v in fp8.LAUNCHES.items() if v - before.get(k, 0)}
        assert set(node.STATS.layers) == QUANT_LAYERS | {"conv"} and not node.STATS.fallbacks
        # The decoded weights are ComfyUI's bit for bit (test above); the products are not: ComfyUI's
        # QuantizedTensor linear multiplies by a contiguous transposed copy of the weight
        # (aten.t, then addmm dequantizes it), we call F.linear on the [N, K] weight as for every
        # other layer, and the GEMM sums in another order (fp32 here: ~1 ulp); the fused linear
        # (CPU auto: every Linear) sums in its own order too.
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
        assert launches == ({"decode": 4} if mode == "cast-only" else {"linear": 3, "decode": 1})
    finally:
        clone.unpatch_model()
    assert isinstance(dm.img_in.weight, kitchen) and torch.equal(run(base, X), ref)


def test_quantized_layers_decode_variants_carry_comfyuis_rounding(comfy, node, kitchen):
    base, mp = build_quantized(comfy, compute_dtype=torch.bfloat16)
    plan = node.plan_model(mp, "auto")
    got = node.decode_variants(plan, base.diffusion_model)
    rs = {dict(plan.layers[n].quant)[torch.bfloat16] for n in QUANT_LAYERS}
    assert len(rs) == 1, rs  # the same probe for every layer of one layout
    rs = bool(rs.pop())
    assert got == {(FP8, torch.bfloat16, True, rs, True), (E5M2, torch.bfloat16, True, rs, True),
                   (FP8, torch.bfloat16, False, False, True)}, got  # the e4m3fn, e5m2 layers, the fp8 Conv1d


def test_quantized_weight_functions_see_the_dequantized_weight(comfy, node, kitchen):
    """A lowvram LoRA patch on a QuantizedTensor layer: ComfyUI applies the weight function to
    the dequantized (scaled) weight; so does the node (bit-exact, decode path)."""
    base, mp = build_quantized(comfy)
    dm = base.diffusion_model
    seen = []

    def lora():
        dm.img_in.weight_function = [lambda w: seen.append(w.clone()) or w * 1.5 + 0.001]
        dm.out.bias_function = [lambda b: b + 0.25]

    ref, clone = patched_with_lora(node, base, mp, lora)
    try:
        node.STATS.reset()
        torch.testing.assert_close(run(base, X), ref, rtol=1e-5, atol=1e-6)  # GEMM order: see above
        assert node.STATS.layers["img_in"] == "decode" and node.STATS.layers["out"] == "decode"
        assert len(seen) == 2 and torch.equal(seen[0], seen[1])  # ComfyUI's call, then ours: same weight
        # an offloaded QuantizedTensor (its fp8 storage elsewhere than the activations): ComfyUI's forward
        cfg = dm.img_in.forward_comfy_cast_weights.tritonkit_fp8
        w = dm.img_in.weight
        away = kitchen(torch.empty(w._qdata.shape, dtype=w._qdata.dtype, device="meta"), w._layout_cls, w._params)
        assert node._eligible(types.SimpleNamespace(weight=away, bias=None), X, cfg) == \
            "weights not on the compute device (offloaded)"
    finally:
        clone.unpatch_model()
        dm.img_in.weight_function = []
        dm.out.bias_function = []


def test_quantized_bad_layers_stay_on_comfyuis_path_with_a_reason(comfy, node, kitchen, caplog):
    """nvfp4, an unknown layout, corrupt scales (NaN, inf, 0, negative, per-channel shape): each
    layer named with its reason, left to ComfyUI; the model still runs (no crash) and the good
    layers are served."""
    base, mp = build_quantized(comfy)
    dm = base.diffusion_model
    extra = {}
    for name, scale in (("nan", float("nan")), ("inf", float("inf")), ("zero", 0.0), ("neg", -0.01),
                        ("rows", None), ("nvfp4", None), ("unknown", None), ("good", 0.01)):
        lin = type(dm.img_in)(32, 32)
        w = torch.randn(32, 32, generator=torch.Generator().manual_seed(3)) * 0.05
        if name == "nvfp4":
            qt = kitchen.from_float(w, "TensorCoreNVFP4Layout")
        else:
            qt = kitchen.from_float(w, "TensorCoreFP8E4M3Layout", scale=torch.tensor(0.01))
            if name == "rows":
                qt._params = dataclasses_replace(qt._params, scale=torch.full((32,), 0.01))
            elif name == "unknown":
                qt._layout_cls = "NoSuchLayout"
            elif scale is not None:
                qt._params = dataclasses_replace(qt._params, scale=torch.tensor(scale))
        lin.weight = torch.nn.Parameter(qt, requires_grad=False)
        lin.quant_format, lin.layout_type = ("nvfp4" if name == "nvfp4" else "float8_e4m3fn"), qt._layout_cls
        lin.bias = torch.nn.Parameter(torch.zeros(32), requires_grad=False)
        lin._full_precision_mm = True
        setattr(dm, f"bad_{name}", lin)
        extra[name] = lin
    with caplog.at_level(logging.INFO, logger="TritonKit"):
        plan = node.plan_model(mp, "auto")
    text = node.describe(plan)
    reasons = {n: r for r, names in plan.skipped.items() for n in names}
    for name in ("nan", "inf", "zero", "neg"):
        assert reasons[f"bad_{name}"] == "corrupt weight scale (NaN, inf, zero or negative)", reasons
    assert "weight scale of shape (32,)" in reasons["bad_rows"]
    assert reasons["bad_nvfp4"] == "TensorCoreNVFP4Layout layout: no Triton kernel for it"
    assert reasons["bad_unknown"] == "unknown quantized layout 'NoSuchLayout'"
    assert "bad_good" in plan.layers and QUANT_LAYERS <= set(plan.layers)
    assert "left on torch: 4 (corrupt weight scale (NaN, inf, zero or negative)): bad_nan, bad_inf, bad_zero, ..." in text
    assert sum("corrupt weight scale" in r.getMessage() for r in caplog.records) == 1  # logged once
    # the run: without the unknown layout, which newer ComfyUI (0.33) cannot even clone (ModelPatcher's size
    # reads each QuantizedTensor's state_dict, which looks the layout up and raises KeyError)
    del dm.bad_unknown, extra["unknown"]
    clone, _ = node.patch_model(mp, "cast-only")
    clone.patch_model()
    try:
        x = torch.randn(3, 32)
        for name, lin in extra.items():
            if name not in ("nan", "inf"):  # ComfyUI's own forward on these: finite numbers
                assert torch.isfinite(lin(x)).all(), name
        assert run(base, X).shape == (2, 3, 16)
    finally:
        clone.unpatch_model()


def dataclasses_replace(obj, **kw):
    import dataclasses
    return dataclasses.replace(obj, **kw)


def test_quantized_layers_on_comfy_kitchens_fp8_matmul(comfy, node, kitchen, monkeypatch):
    """Layers on comfy-kitchen's fp8 matmul (ComfyUI found fp8 compute): every mode but auto on
    a real sm89+ GPU serves them, switching the clone's layers to the full-precision path;
    unpatching restores ComfyUI's choice."""
    base, mp = build_quantized(comfy, fp8_compute=True)
    dm = base.diffusion_model
    assert not dm.img_in._full_precision_mm
    clone, text = node.patch_model(mp, "cast-only")
    assert "3 taken off comfy-kitchen's fp8 matmul onto the full-precision path" in text, text
    clone.patch_model()
    try:
        assert dm.img_in._full_precision_mm and dm.mid._full_precision_mm
        node.STATS.reset()
        out = run(base, X)
        assert set(node.STATS.layers) == QUANT_LAYERS | {"conv"}
    finally:
        clone.unpatch_model()
    assert not dm.img_in._full_precision_mm
    ref, _ = build_quantized(comfy)
    torch.testing.assert_close(out, run(ref, X), rtol=1e-5, atol=1e-6)  # ComfyUI's full-precision path
    # auto on a (simulated) sm89+ CUDA device keeps comfy-kitchen's fp8 matmul
    plan = node.Plan(mode="auto", arch=90, device="cuda", compute_dtype=None, fast_fp8=False)
    q, why = node._plan_quantized(plan, "img_in", dm.img_in, dm.img_in.weight, torch.device("cuda"), "auto", 90)
    assert q is None and why == "native fp8 matmul (comfy-kitchen's QuantizedTensor linear) kept"


def test_quantized_model_compiles_without_graph_breaks(comfy, node, kitchen):
    from torch._dynamo.utils import counters
    base, mp = build_quantized(comfy)
    clone, _ = node.patch_model(mp, "cast-only")
    clone.patch_model()
    try:
        node.STATS.reset()
        ref = run(base, X)
        assert set(node.STATS.layers) == QUANT_LAYERS | {"conv"}
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(base.diffusion_model, backend="aot_eager", fullgraph=True)
        with torch.no_grad():
            assert torch.equal(compiled(X), ref)
        assert not counters["graph_break"]
    finally:
        clone.unpatch_model()
        torch._dynamo.reset()


@pytest.mark.parametrize("traced", [True, False])
def test_compiled_quantized_layers_dequantize_in_torch_ops_on_native_fp8(comfy, node, kitchen, monkeypatch, traced):
    """auto on sm89+ under torch.compile (compile_native): a QuantizedTensor layer's graph holds its
    dequantize as torch operations, rounded as ComfyUI rounds (Inductor fuses them into one kernel),
    not comfy-kitchen's ``dequantize_fp8`` custom op, whose every call picks a backend in Python on
    the host; the values are ComfyUI's. TRITONKIT_TRACED_DEQUANT=0 keeps ComfyUI's path there."""
    import dataclasses
    monkeypatch.setenv(node.TRACED_DEQUANT_ENV, "1" if traced else "0")
    base, mp = build_quantized(comfy, seed=3)
    dm = base.diffusion_model
    plan = node.plan_model(mp, "auto")  # on the CPU: the QuantizedTensor layers, their rounding probed
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(11))
    for name, inp in (("img_in", x), ("mid", torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(12)))):
        m = getattr(dm, name)
        cfg = dataclasses.replace(plan.layers[name], compile_native=True,
                                  traced_dequant=plan.layers[name].quant is not None and node._traced_dequant_on())
        assert cfg.traced_dequant == traced
        orig = type(m).forward_comfy_cast_weights
        with torch.no_grad():
            ref = orig(m, inp)
            torch._dynamo.reset()
            graphs.clear()
            out = torch.compile(lambda t: node._forward(m, orig, cfg, None, t), backend=capture, fullgraph=True)(inp)
        assert len(graphs) == 1
        assert ("comfy_kitchen" in graphs[0]) == (not traced), graphs[0]
        # ComfyUI's linear multiplies by a transposed copy of the weight (see the test above): ~1 ulp
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
        if traced:  # the weight decoded in the graph is ComfyUI's dequantize, bit for bit
            want = m.weight.dequantize().to(inp.dtype)
            got = node._traced_dequant_linear(m, torch.eye(want.shape[1], dtype=inp.dtype), cfg) - \
                (m.bias.to(inp.dtype) if m.bias is not None else 0)
            torch.testing.assert_close(got.t(), want, rtol=1e-6, atol=1e-7)
    torch._dynamo.reset()


def test_arch_override_and_fast_fp8(comfy, node, monkeypatch):
    assert node.parse_arch("86") == 86 and node.parse_arch("sm_75") == 75 and node.parse_arch("8.9") == 89
    monkeypatch.setenv("TRITONKIT_FORCE_ARCH", "86")
    base, mp = build(comfy, ops=comfy.ops.fp8_ops, fast=True)
    plan = node.plan_model(mp, "auto")
    assert plan.arch == 86 and plan.layers["img_in"].fused
    assert any("fp8_e4m3fn_fast" in n for n in plan.notes)
    monkeypatch.setenv("TRITONKIT_FORCE_ARCH", "90")  # native fp8 matmul kept in auto, replaced on request
    plan = node.plan_model(mp, "auto")
    assert "img_in" not in plan.layers and "native fp8 matmul (torch._scaled_mm) kept" in plan.skipped
    assert node.plan_model(mp, "fused-linear").layers["img_in"].fused
    monkeypatch.setenv("TRITONKIT_FORCE_ARCH", "75")
    plan = node.plan_model(mp, "auto")
    assert any("sm75" in n for n in plan.notes)
    # Triton 3.3+ has no tensor-core tl.dot on sm75 (kernels/arch_probe.py): no layer takes the fused linear
    import triton
    fma_only = tuple(int(p) for p in triton.__version__.split(".")[:2]) >= (3, 3)
    assert all(not c.fused for c in plan.layers.values()) == fma_only and plan.layers
    assert any("without tensor cores" in n for n in plan.notes) == fma_only
    x16 = X.to(torch.bfloat16)
    m = types.SimpleNamespace(weight_function=[], bias_function=[])
    assert not node._fused_ok(m, x16.to("meta"), plan.layers["img_in"])  # bf16 on sm75: no bf16 MMA


def test_compiled_graphs_keep_comfyuis_cast_only_where_inductor_compiles_it_natively(comfy, node, monkeypatch):
    """auto on a real sm89+ GPU: under torch.compile the patched forward gives the call back to
    ComfyUI's forward (Inductor's native fp8 cast measured faster than our op in a compiled graph);
    below sm89 (a real one or TRITONKIT_FORCE_ARCH) and in explicit modes the Triton path stays."""
    calls = []
    orig = lambda m, x, *a, **k: calls.append("comfy") or "comfy"  # noqa: E731
    m = types.SimpleNamespace(weight=None, bias=None)  # the Triton path would reject it: "no longer fp8"
    monkeypatch.setattr(node, "_fallback", lambda name, why: calls.append(why))
    native = node.LayerConfig(name="l", kind="linear", fused=False, arch=90, compile_native=True)
    below = node.LayerConfig(name="l", kind="linear", fused=False, arch=86, compile_native=False)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert node._forward(m, orig, native, None, X) == "comfy" and calls == ["comfy"]
    calls.clear()
    node._forward(m, orig, below, None, X)
    assert calls == ["weight is no longer fp8", "comfy"]  # went through the Triton path's checks
    calls.clear()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    node._forward(m, orig, native, None, X)
    assert calls == ["weight is no longer fp8", "comfy"]  # eager: the Triton path
    # the plan sets it for auto on a CUDA device of sm89+ only
    monkeypatch.setenv("TRITONKIT_FORCE_TRITON_ON_CPU", "1")
    base, mp = build(comfy)
    assert not any(c.compile_native for c in node.plan_model(mp, "auto").layers.values())  # CPU


def test_patched_model_compiles_without_graph_breaks(comfy, node):
    base, mp = build(comfy)
    ref = run(base, X)
    clone, _ = node.patch_model(mp, "auto")
    clone.patch_model()
    try:
        torch._dynamo.reset()
        compiled = torch.compile(base.diffusion_model, backend="aot_eager", fullgraph=True)
        with torch.no_grad():
            torch.testing.assert_close(compiled(X), ref, rtol=1e-5, atol=1e-5)
    finally:
        clone.unpatch_model()
        torch._dynamo.reset()


def fp8_reads(gm) -> list:
    """(op, source line) of every op in an ATen graph that reads a float8 tensor, the pack's own
    custom ops aside: below sm89 that is what Inductor turns into Triton code with an ``fp8e4nv``
    pointer (ComfyUI's ``weight.to(dtype)``, ``cast_to``'s ``copy_``, a dequantize)."""
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or str(n.target).startswith("tritonkit."):
            continue
        vals = [a.meta.get("val") for a in n.all_input_nodes]
        if any(isinstance(v, torch.Tensor) and v.dtype in (FP8, E5M2) for v in vals):
            where = [ln.strip() for ln in (n.meta.get("stack_trace") or "").splitlines()
                     if ln.strip().strip("^~")][-1:]  # the source line, not the caret line under it
            out.append((str(n.target), where))
    return out


class _Traced(Exception):
    """Raised by the inspecting backend once it has the graph: the graph is never run."""


def trace_fp8_reads(module, x) -> list:
    """Traces ``module(x)`` with torch.compile (fullgraph) down to the ATen graph AOTAutograd hands to
    a compiler (Inductor's input) and returns :func:`fp8_reads` of it. The graph is not run."""
    from torch._dynamo.backends.common import aot_autograd
    reads = []

    def fw_compiler(gm, _inputs):
        reads.extend(fp8_reads(gm))
        raise _Traced()

    torch._dynamo.reset()
    compiled = torch.compile(module, backend=aot_autograd(fw_compiler=fw_compiler), fullgraph=True)
    try:
        with torch.no_grad():
            compiled(x)
    except Exception as e:  # noqa: BLE001 - Dynamo wraps the backend's exception
        cause = e
        while cause is not None and not isinstance(cause, _Traced):
            cause = cause.__cause__ or getattr(cause, "inner_exception", None)
        if cause is None:
            raise
    else:
        raise AssertionError("the inspecting backend was never called")
    finally:
        torch._dynamo.reset()
    return reads


@pytest.mark.parametrize("variant", ["fp8", "quantized"])
def test_compiled_graph_keeps_no_comfy_fp8_cast_when_a_bias_sits_on_another_device(comfy, node, monkeypatch,
                                                                                     request, variant):
    """Below sm89 no patched layer may hand ComfyUI's fp8 cast to a compiled graph. The H100 case
    (HunyuanVideo, TorchCompileModel @86, 4 fp8e4nv kernels; a second run of a model loaded before):
    ComfyUI had loaded the checkpoint on the CPU, the second run's decoded biases were made from those
    CPU originals, and ComfyUI sets a later clone's object patches on an already loaded model without
    moving them (apply_plan). Each layer with such a bias (the patch-embedding Conv3d, the token
    refiner's LayerNorms) fell back to ComfyUI's cast_bias_weight, which Inductor compiles to fp8e4nv
    code. Now the biases are made on the load device, and a decoded (non-fp8) bias found elsewhere is
    moved to the activations as ComfyUI moves it: only the fp8 weight has to be where the decode runs.

    CPU-only stand-in for the CUDA/CPU pair: the activations on the CPU, the biases on the meta
    device, so the graph is traced, inspected and never run."""
    monkeypatch.setenv("TRITONKIT_FORCE_ARCH", "86")
    if variant == "quantized":
        request.getfixturevalue("kitchen")
        base, mp = build_quantized(comfy)
        layers = {"img_in", "mid", "out", "conv"}
    else:
        base, mp = build(comfy)
        layers = {"img_in", "out", "norm", "conv"}
    clone, _ = node.patch_model(mp, "auto")
    assert layers <= {k.split(".")[1] for k in clone.object_patches if k.endswith(".forward_comfy_cast_weights")}
    clone.patch_model()
    try:
        assert trace_fp8_reads(base.diffusion_model, X) == []  # on one device: the kernels only
        dm = base.diffusion_model
        for name in sorted(layers):
            mod = getattr(dm, name)
            assert mod.bias.dtype == torch.float32  # decoded once by the node, or a QuantizedTensor layer's own
            mod.bias = torch.nn.Parameter(mod.bias.detach().to("meta"), requires_grad=False)
        assert trace_fp8_reads(dm, X) == []
    finally:
        clone.unpatch_model()


def test_node_registers_and_explains_with_a_broken_triton(tmp_path):
    """With a Triton whose import fails (old vcredist DLLs on Windows), the node still registers and
    returns the model unchanged, saying why."""
    import subprocess
    shadow = tmp_path / "shadow" / "triton"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('DLL load failed while importing libtriton')\n")
    script = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("tk_pack", {str(REPO / "__init__.py")!r},
                                              submodule_search_locations=[{str(REPO)!r}])
m = importlib.util.module_from_spec(spec); sys.modules["tk_pack"] = m; spec.loader.exec_module(m)
assert "TritonKitFp8Fallback" in m.NODE_CLASS_MAPPINGS, sorted(m.NODE_CLASS_MAPPINGS)
model = object()
out = m.NODE_CLASS_MAPPINGS["TritonKitFp8Fallback"]().patch(model, "auto")
assert out["result"][0] is model
print(out["ui"]["text"][0])
"""
    r = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(shadow.parent)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "could not be loaded" in r.stdout and "libtriton" in r.stdout, r.stdout


def test_node_registration():
    import importlib
    pack = importlib.import_module("tritonkit")
    from tritonkit.nodes import fp8_fallback
    assert fp8_fallback.NODE_DISPLAY_NAME_MAPPINGS == {"TritonKitFp8Fallback": "Triton fp8 Fallback"}
    spec = fp8_fallback.TritonFp8Fallback.INPUT_TYPES()["required"]
    assert spec["mode"][0] == ["auto", "fused-linear", "cast-only", "off"]
    assert fp8_fallback.TritonFp8Fallback.CATEGORY == "TritonKit"
    del pack


# ----------------------------------------------------------------------------- a real ComfyUI
SUMMARY = re.compile(r"TritonKit fp8: (\d+)/(\d+) patched fp8 layers ran through Triton(?: \(([^)]*)\))?; "
                     r"kernel launches: ([^;]*); torch fallbacks: (.*)")


def _fp8_linear_weights(path):
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        return sum(1 for k in f.keys() if k.endswith(".weight") and f.get_slice(k).get_dtype() in ("F8_E4M3", "F8_E5M2"))


@pytest.fixture(scope="module")
def forced_server(tmp_path_factory):
    """A ComfyUI server with the Triton path forced on CPU (the interpreter) and the test nodes."""
    from comfy_harness import TEST_NODES, ComfyServer, comfyui_available
    if not comfyui_available():
        pytest.fail("ComfyUI is not set up: run scripts/setup_env.sh")
    srv = ComfyServer(tmp_path_factory.mktemp("fp8-forced"), env={"TRITONKIT_FORCE_TRITON_ON_CPU": "1"},
                      extra_packs=TEST_NODES)
    srv.start()
    yield srv
    srv.stop()


def _loads_comfy_quant() -> bool:
    from comfy_harness import comfyui_dir
    p = comfyui_dir() / "comfy" / "utils.py"
    return p.is_file() and "def convert_old_quants" in p.read_text()


@pytest.mark.comfyui
@pytest.mark.parametrize("arch,variant", [("hunyuan", "fp8"), ("hunyuan", "scaled"), ("hunyuan", "quant"),
                                          ("wan", "fp8"), ("wan", "scaled")])
def test_real_comfyui_sampling_through_the_kernels(forced_server, arch, variant):
    """UNETLoader(weight_dtype fp8_e4m3fn, or a legacy scaled-fp8 file; on ComfyUI 0.8+ also a
    file with per-layer comfy_quant metadata mixing e4m3fn, e5m2 (with input scales) and bf16
    Linear layers, loaded as fp8_e4m3fn so that its norms and conv are legacy fp8 layers in the
    same model) -> Triton fp8 Fallback
    (Triton forced on CPU: the interpreter) -> KSampler 2 steps, through /prompt; equals the
    unpatched run, and every fp8 layer of the model ran through our kernels. The model is the
    tiny HunyuanVideo: its double/single-stream blocks are Flux's own classes, and at 6 M
    parameters the interpreter gets through it (ComfyUI's Flux detection forces hidden 3072:
    0.5 G fp8 weights per forward, hours in the interpreter). WAN 2.1's tiny T2V model too (its
    own block class: self- and cross-attention projections, the text and time embeddings, the FFN)."""
    import tiny_models as tm
    from safetensors import safe_open

    srv = forced_server
    if variant == "quant" and not _loads_comfy_quant():
        pytest.skip("this ComfyUI (< 0.8) does not load comfy_quant files")
    scaled = {"fp8": False, "scaled": True, "quant": "comfy_quant"}[variant]
    cfg = tm.WAN_TINY_CONFIG if arch == "wan" else tm.HUNYUAN_VIDEO_TINY_CONFIG
    workflow = tm.wan_workflow if arch == "wan" else tm.hunyuan_video_workflow
    info = tm.cached_models(cfg, [(FP8, scaled)])[0]
    n_linear = _fp8_linear_weights(info["path"])
    assert n_linear > 10
    name = tm.install_model(info, srv.base / "models")
    dtype = "default" if variant == "scaled" else "fp8_e4m3fn"
    latents = {}
    log_start = len(srv.log())
    for label, patch in (("torch", []), ("triton", [("TritonKitFp8Fallback", {"mode": "auto"})])):
        prompt = workflow(name, dtype, patch_nodes=patch, steps=2, frames=2, prefix=f"{arch}_{variant}_{label}")
        entry = srv.run(prompt, timeout=400)
        stats = json.loads(entry["outputs"][tm.NODE_OUT]["tritonkit_latent"][0])
        assert stats["finite"], stats
        with safe_open(str(srv.base / "output" / stats["file"]), "pt") as f:
            latents[label] = f.get_tensor("latent")
        if patch:
            text = entry["outputs"][str(tm.PATCH_BASE)]["text"][0]
    log = srv.log()[log_start:]
    assert text.startswith("Triton fp8 Fallback: auto on cpu"), text
    m = re.search(r"(\d+) fp8 layers patched: (\d+) -> fused W8A16 linear", text)
    assert m, text
    n_layers, n_fused = int(m.group(1)), int(m.group(2))
    assert n_fused == n_linear and n_layers >= n_linear, (text, n_linear)
    q = re.search(r"(\d+) of them ComfyUI QuantizedTensor layers \(([^)]*)\)", text)
    if variant == "quant" or (variant == "scaled" and _loads_comfy_quant()):  # ComfyUI 0.8+: loaded quantized
        assert q and int(q.group(1)) == n_linear, text
    if variant == "quant":
        fmts = collections.Counter(str(tm.quant_format(k, FP8)).replace("torch.float8_", "")
                                   for k, _, kind in tm.specs_for(cfg) if kind == "linear")
        fmts.pop("None")
        assert q.group(2) == ", ".join(f"{k} {v}" for k, v in sorted(fmts.items())), text
        assert n_layers > n_linear, text  # its fp8 norms and conv: legacy fp8 layers, served too
    assert "left on torch" not in text, text
    runs = [s for s in SUMMARY.findall(log)]
    assert len(runs) == 1, log[-3000:]
    ran, total, paths, launches, fallbacks = runs[0]
    assert int(ran) == int(total) == n_layers and fallbacks == "none", runs[0]
    launches = dict((k, int(v)) for k, v in (p.rsplit(" ", 1) for p in launches.split(", ")))
    assert launches["linear"] >= 2 * n_linear, launches  # every Linear, every step
    a, b = latents["torch"].float(), latents["triton"].float()
    rel = ((a - b).norm() / a.norm()).item()
    assert rel < 1e-4, rel  # fp32 compute on CPU: the decode is exact, the fused sum order differs


# ----------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_torch_compile_emits_no_fp8e4nv_and_compiles_for_sm80_sm86(comfy, node, monkeypatch, tmp_path):
    """Inductor on the patched model (as TorchCompileModel compiles diffusion_model): the Triton
    kernels it generates have no fp8e4nv anywhere and compile for sm80 and sm86; the same model
    compiled unpatched does have an fp8e4nv kernel, which fails for sm86."""
    from compile_utils import compile_for
    monkeypatch.delenv("TRITONKIT_FORCE_TRITON_ON_CPU")
    monkeypatch.setenv("TRITONKIT_FORCE_ARCH", "86")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    import torch._inductor.config as icfg
    monkeypatch.setattr(icfg, "fx_graph_cache", False)
    base, mp = build(comfy, device="cuda", compute_dtype=torch.bfloat16)
    x = X.to("cuda", torch.bfloat16)

    def compiled_kernels(model_fn):
        torch._dynamo.reset()
        from torch._inductor.utils import run_and_get_code
        out, codes = run_and_get_code(torch.compile(model_fn), x)
        return out, "\n".join(codes)

    with torch.no_grad():
        ref = run(base, x)
        out0, code0 = compiled_kernels(base.diffusion_model)
        assert "fp8e4nv" in code0  # the unpatched cast: what official Triton refuses below sm89
        # fused-linear: both custom ops in the graph (auto would pick the decode for these narrow layers)
        clone, text = node.patch_model(mp, "fused-linear")
        assert "sm86" in text
        clone.patch_model(device_to=torch.device("cuda"))
        try:
            out1, code1 = compiled_kernels(base.diffusion_model)
        finally:
            clone.unpatch_model()
    torch.testing.assert_close(out1.float(), ref.float(), rtol=2e-2, atol=2e-2)
    assert "fp8e4nv" not in code1 and "tritonkit.fp8_linear" in code1 and "tritonkit.fp8_decode" in code1
    kernels = _inductor_kernels(code1)
    assert kernels, code1[:2000]
    for cc in (80, 86):
        for name, (fn, sig, consts) in kernels.items():
            assert len(compile_for(fn, sig, consts, cc).asm["cubin"]) > 0, name
    bad = _inductor_kernels(code0)
    fp8_kernels = [v for v in bad.values() if "fp8e4nv" in str(v[1])]
    assert fp8_kernels
    with pytest.raises(Exception, match="fp8e4nv"):
        compile_for(*fp8_kernels[0], 86)


@pytest.mark.gpu
def test_gpu_auto_on_native_fp8_leaves_compiled_casts_to_inductor(comfy, node, monkeypatch, tmp_path):
    """auto on a real sm89+ GPU: eager calls decode through Triton, a compiled graph keeps
    ComfyUI's cast (no call to our op in Inductor's code); forced below sm89 it calls our op."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs a GPU with native fp8 (sm89+)")
    from tritonkit.kernels import fp8
    monkeypatch.delenv("TRITONKIT_FORCE_TRITON_ON_CPU")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    import torch._inductor.config as icfg
    monkeypatch.setattr(icfg, "fx_graph_cache", False)
    from torch._inductor.utils import run_and_get_code
    base, mp = build(comfy, device="cuda", compute_dtype=torch.bfloat16)
    x = X.to("cuda", torch.bfloat16)
    codes = {}
    with torch.no_grad():
        ref = run(base, x)
        for arch in (None, "86"):
            if arch:
                monkeypatch.setenv("TRITONKIT_FORCE_ARCH", arch)
            clone, text = node.patch_model(mp, "auto")
            assert ("compiles ComfyUI's own fp8 cast natively" in text) == (arch is None), text
            clone.patch_model(device_to=torch.device("cuda"))
            try:
                before = fp8.LAUNCHES["decode"]
                torch.testing.assert_close(run(base, x).float(), ref.float(), rtol=2e-2, atol=2e-2)
                assert fp8.LAUNCHES["decode"] > before  # eager: the Triton decode
                torch._dynamo.reset()
                out, code = run_and_get_code(torch.compile(base.diffusion_model), x)
                codes[arch] = "\n".join(code)
                torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
            finally:
                clone.unpatch_model()
    assert "tritonkit.fp8_decode" not in codes[None] and "fp8e4nv" in codes[None]
    assert "tritonkit.fp8_decode" in codes["86"] and "fp8e4nv" not in codes["86"]


@pytest.mark.gpu
def test_gpu_quantized_layers_bit_exact_and_compiled_without_fp8e4nv(comfy, node, kitchen, monkeypatch, tmp_path):
    """On this GPU's comfy-kitchen backend: the decode of QuantizedTensor weights equals their
    dequantize() bit for bit (all codes, awkward scales, every compute dtype the probe matched),
    and a bf16 model of QuantizedTensor + legacy fp8 layers, as below sm89, runs through the
    kernels eager and under Inductor with no fp8e4nv in the generated code, no graph break."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code
    monkeypatch.delenv("TRITONKIT_FORCE_TRITON_ON_CPU")
    monkeypatch.setenv("TRITONKIT_FORCE_ARCH", "86")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    import torch._inductor.config as icfg
    monkeypatch.setattr(icfg, "fx_graph_cache", False)
    dev = torch.device("cuda")
    checked = 0
    for fmt, layout in ((FP8, "TensorCoreFP8E4M3Layout"), (E5M2, "TensorCoreFP8E5M2Layout")):
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fmt).reshape(16, 16).to(dev)
        params = kitchen.from_float(torch.ones(2, 2, device=dev), layout)._params
        rounding = dict(node.comfy_dequant_rounding(kitchen(codes, layout, params), dev))
        assert any(v is not None for v in rounding.values()), rounding
        for dt, rs in rounding.items():
            if rs is None:
                continue
            for sv in AWKWARD_SCALES:
                p = type(params)(scale=torch.tensor(sv, device=dev), orig_dtype=dt, orig_shape=(16, 16))
                qt = kitchen(codes, layout, p)
                cfg = node.LayerConfig(name="l", kind="linear", fused=False, quant=tuple(rounding.items()))
                got = node._cast_weight(types.SimpleNamespace(weight=qt, weight_function=[]), dt, cfg)
                assert node._same_bits(got, qt.dequantize()), (fmt, dt, sv, rs)
                checked += 1
    assert checked >= 2 * len(AWKWARD_SCALES)
    base, mp = build_quantized(comfy, compute_dtype=torch.bfloat16, device="cuda")
    x = X.to(dev, torch.bfloat16)
    with torch.no_grad():
        ref = run(base, x)
        clone, text = node.patch_model(mp, "auto")
        assert "sm86" in text and "3 of them ComfyUI QuantizedTensor layers" in text, text
        clone.patch_model(device_to=dev)
        try:
            node.STATS.reset()
            torch.testing.assert_close(run(base, x).float(), ref.float(), rtol=2e-2, atol=2e-2)
            assert set(node.STATS.layers) == QUANT_LAYERS | {"conv"} and not node.STATS.fallbacks
            torch._dynamo.reset()
            counters.clear()
            out, code = run_and_get_code(torch.compile(base.diffusion_model), x)
            code = "\n".join(code)
        finally:
            clone.unpatch_model()
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    assert "fp8e4nv" not in code and "tritonkit.fp8_decode" in code
    assert not counters["graph_break"], dict(counters["graph_break"])


@pytest.mark.gpu
def test_gpu_native_quantized_layers_compile_their_dequantize(comfy, node, kitchen, monkeypatch, tmp_path):
    """auto on a real sm89+ GPU, ComfyUI 0.8's QuantizedTensor layers on the full-precision path:
    Inductor's code decodes the weights itself (fp8e4nv loads) and calls neither comfy-kitchen's
    dequantize op nor ours; the output is the eager model's. TRITONKIT_TRACED_DEQUANT=0: ComfyUI's
    op stays in the graph."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs a GPU with native fp8 (sm89+)")
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code
    monkeypatch.delenv("TRITONKIT_FORCE_TRITON_ON_CPU")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    import torch._inductor.config as icfg
    monkeypatch.setattr(icfg, "fx_graph_cache", False)
    dev = torch.device("cuda")
    codes = {}
    for traced in ("1", "0"):
        monkeypatch.setenv(node.TRACED_DEQUANT_ENV, traced)
        base, mp = build_quantized(comfy, compute_dtype=torch.bfloat16, device="cuda", seed=4)
        x = X.to(dev, torch.bfloat16)
        with torch.no_grad():
            ref = run(base, x)
            clone, text = node.patch_model(mp, "auto")
            assert "3 of them ComfyUI QuantizedTensor layers" in text, text
            assert ("dequantize the QuantizedTensor layers in Inductor's own kernel" in text) == (traced == "1"), text
            clone.patch_model(device_to=dev)
            try:
                torch._dynamo.reset()
                counters.clear()
                out, code = run_and_get_code(torch.compile(base.diffusion_model), x)
                codes[traced] = "\n".join(code)
            finally:
                clone.unpatch_model()
        torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
        assert not counters["graph_break"], dict(counters["graph_break"])
    assert "comfy_kitchen.dequantize_fp8" not in codes["1"] and "tritonkit.fp8_decode" not in codes["1"]
    assert "fp8e4nv" in codes["1"]
    assert "comfy_kitchen.dequantize_fp8" in codes["0"]


def _inductor_kernels(code: str) -> dict:
    """The Triton kernels in Inductor's output code: {name: (JITFunction, signature, constexprs)}."""
    ns: dict = {}
    out = {}
    blocks = re.split(r"\n(?=[a-zA-Z_0-9]+ = async_compile\.triton\()", code)
    for blk in blocks:
        m = re.match(r"([a-zA-Z_0-9]+) = async_compile\.triton\('([^']+)', '''(.*?)''', device_str='cuda'\)", blk, re.S)
        if not m:
            continue
        src = m.group(3)
        mod = types.ModuleType(m.group(2))
        path = os.path.join(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/tmp"), f"tk_{m.group(2)}.py")
        with open(path, "w") as f:
            f.write(src)
        mod.__file__ = path
        exec(compile(src, path, "exec"), mod.__dict__)
        kern = mod.__dict__[m.group(2)]
        meta = kern.triton_meta
        consts = dict(meta.get("constants", {}))
        cfg = kern.configs[0]
        consts.update(cfg.kwargs)
        sig = dict(meta["signature"])
        for k in consts:
            sig[k] = "constexpr"
        out[m.group(2)] = (kern.fn, sig, consts)
        ns[m.group(2)] = kern
    return out
