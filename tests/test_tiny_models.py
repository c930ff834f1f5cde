"""Tiny random checkpoints of real architectures (tests/tiny_models.py) in a real ComfyUI server
(CPU; 0.3.75 and 0.8.0): UNETLoader detects and loads them, the test-only nodes (tests/comfy_test_nodes)
feed conditioning and a latent, KSampler runs 2 steps, and the output latent is finite.

The model files are made once per machine in tiny_models.cache_dir() and symlinked into the
server's models/diffusion_models (the first run pays ~20-40 s to draw the tiny Flux's 531 M
random weights on 2 cores)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import tiny_models as tm
from comfy_harness import TEST_NODES, ComfyServer, comfyui_at_least, comfyui_available, comfyui_dir

pytestmark = pytest.mark.comfyui

FP8 = torch.float8_e4m3fn

# How ComfyUI says it loaded a legacy scaled-fp8 file: 0.3.x keeps it on its scaled-fp8 ops; 0.8.0
# converts it on load (comfy.utils.convert_old_quants) to QuantizedTensor weights under its
# mixed-precision ops (the weight dtype it logs is then the compute dtype).
QUANTIZED_LOAD = "Using mixed precision operations"


def _scaled_load_line(scale_input: bool) -> str:
    if comfyui_at_least("0.8.0"):
        return QUANTIZED_LOAD
    return f"Using scaled fp8: fp8 matrix mult: False, scale input: {scale_input}"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not comfyui_available():
        pytest.fail("ComfyUI is not set up: run scripts/setup_env.sh")
    srv = ComfyServer(tmp_path_factory.mktemp("tiny-models"), extra_packs=TEST_NODES)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def flux_files():
    """bf16, fp8 e4m3fn and scaled-fp8 e4m3fn files of the tiny Flux (one pass, cached)."""
    files = tm.cached_models(tm.FLUX_TINY_CONFIG, [(torch.bfloat16, False), (FP8, False), (FP8, True),
                                                   (FP8, "scale_input")])
    return dict(zip(("bf16", "fp8", "scaled", "scaledin"), files))


def _run(server, prompt, info, steps=2, count_name="unet"):
    """Adds a call counter after the patch chain and a counters report; runs; returns
    (latent stats, latent tensor, counters). ``count_name`` names the counter; a run that must
    not share ComfyUI's node cache with a test's own prompt (a reference run) passes another."""
    model_in = prompt[tm.NODE_SAMPLER]["inputs"]["model"]
    prompt["90"] = {"class_type": "TritonKitTestCountCalls", "inputs": {"model": model_in, "name": count_name}}
    prompt["92"] = {"class_type": "TritonKitTestAttentionProbe", "inputs": {"model": ["90", 0], "name": "attn"}}
    prompt[tm.NODE_SAMPLER]["inputs"]["model"] = ["92", 0]
    prompt["91"] = {"class_type": "TritonKitTestCounters", "inputs": {"reset": True, "anything": [tm.NODE_SAMPLER, 0]}}
    entry = server.run(prompt, timeout=300)
    stats = json.loads(entry["outputs"][tm.NODE_OUT]["tritonkit_latent"][0])
    counts = json.loads(entry["outputs"]["91"]["tritonkit_counters"][0])
    latent = None
    if "file" in stats:
        with safe_open(str(server.base / "output" / stats["file"]), "pt") as f:
            latent = f.get_tensor("latent")
    return stats, latent, counts


def _assert_clean_load(server, name):
    log = server.log()
    bad = [ln for ln in log.splitlines() if ("unet missing" in ln or "unet unexpected" in ln)]
    assert not bad, bad[:3]
    assert "no match" not in log, server.log_tail()


# --------------------------------------------------------------------------- offline checks
def test_specs_equal_comfyui_model_parameters():
    """Every tiny and full-size preset has exactly the parameters (names and shapes) of
    ComfyUI's own class built from what model detection reads off our tensors."""
    cfgs = {"flux_tiny": tm.FLUX_TINY_CONFIG, "flux_dev": tm.FLUX_DEV_CONFIG,
            "hunyuan_video_tiny": tm.HUNYUAN_VIDEO_TINY_CONFIG, "hunyuan_video": tm.HUNYUAN_VIDEO_CONFIG,
            "sd15_tiny": tm.SD15_TINY_CONFIG, "sd15": tm.SD15_CONFIG, "wan_tiny": tm.WAN_TINY_CONFIG,
            "wan_1_3b": tm.WAN21_1_3B_CONFIG, "wan_14b": tm.WAN21_14B_CONFIG}
    want_class = {"flux_tiny": "Flux", "flux_dev": "Flux", "hunyuan_video_tiny": "HunyuanVideo",
                  "hunyuan_video": "HunyuanVideo", "sd15_tiny": "SD15", "sd15": "SD15", "wan_tiny": "WAN21_T2V",
                  "wan_1_3b": "WAN21_T2V", "wan_14b": "WAN21_T2V"}
    script = Path(__file__).with_name("_tiny_models_meta_check.py")
    r = subprocess.run([sys.executable, str(script), str(comfyui_dir()), str(Path(__file__).parent), json.dumps(cfgs)],
                       capture_output=True, text=True, timeout=300, cwd=comfyui_dir())
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for name, out in res.items():
        assert out["class"] == want_class[name], (name, out)
        assert out["missing"] == [] and out["unexpected"] == [] and out["shape_mismatch"] == [], (name, out)
        dims = [out["detected"].get(k) for k in ("hidden_size", "model_channels", "dim")]
        assert any(d and d > 0 for d in dims), (name, out)


def test_presets_have_the_real_sizes():
    # Flux dev 11.90 B and HunyuanVideo 12.82 B parameters; SD1.5's UNet 859.52 M.
    assert round(tm.param_count(tm.FLUX_DEV_CONFIG) / 1e6) == 11901
    assert round(tm.param_count(tm.HUNYUAN_VIDEO_CONFIG) / 1e6) == 12821
    assert round(tm.param_count(tm.SD15_CONFIG) / 1e4) == 85952
    assert tm.describe(tm.SD15_TINY_CONFIG)["head_dims"] == [40, 80]
    assert tm.describe(tm.FLUX_TINY_CONFIG)["head_dim"] == 128


def test_streamed_file_equals_state_dict(tmp_path):
    cfg = dict(tm.HUNYUAN_VIDEO_TINY_CONFIG, hidden_size=128, num_heads=1)
    for dtype, scaled in ((torch.bfloat16, False), (FP8, False), (FP8, True), (torch.float8_e5m2, "scale_input")):
        p = tm.write_model(tmp_path / "m.safetensors", cfg, dtype, scaled, seed=3)["path"]
        sd = tm.make_state_dict(cfg, dtype, scaled, seed=3)
        with safe_open(p, "pt") as f:
            assert set(f.keys()) == set(sd)
            meta = json.loads(f.metadata()["tritonkit_tiny_model"])
            assert meta["hidden_size"] == 128 and meta["scaled_fp8"] == scaled
            for k in sd:
                t = f.get_tensor(k)
                assert t.dtype == sd[k].dtype and t.shape == sd[k].shape, k
                assert torch.equal(t.view(torch.uint8) if t.dtype in tm.FP8_DTYPES else t,
                                   sd[k].view(torch.uint8) if t.dtype in tm.FP8_DTYPES else sd[k]), k
        if dtype in tm.FP8_DTYPES:
            assert sd["txt_in.input_embedder.weight"].dtype == dtype
            assert sd["txt_in.input_embedder.bias"].dtype == torch.bfloat16
            assert sd["double_blocks.0.img_attn.norm.key_norm.scale"].dtype == torch.bfloat16
            assert sd["img_in.proj.weight"].dtype == torch.bfloat16  # a conv, not a Linear
        if scaled:
            assert sd["scaled_fp8"].dtype == dtype
            ref = tm.make_state_dict(cfg, torch.float32, seed=3)["single_blocks.0.linear1.weight"]
            deq = sd["single_blocks.0.linear1.weight"].float() * sd["single_blocks.0.linear1.scale_weight"]
            rel = float((deq - ref).norm() / ref.norm())
            assert rel < (0.04 if dtype == FP8 else 0.08), rel


def test_comfy_quant_file(tmp_path):
    """ComfyUI 0.8's per-layer quantization format: layouts mixed by layer, each quantized Linear
    with its weight_scale and comfy_quant JSON; the other fp8 format also has an input_scale;
    the streamed file equals the in-memory state dict; no legacy marker."""
    cfg = dict(tm.HUNYUAN_VIDEO_TINY_CONFIG, hidden_size=128, num_heads=1)
    p = tm.write_model(tmp_path / "q.safetensors", cfg, FP8, "comfy_quant", seed=3)["path"]
    sd = tm.make_state_dict(cfg, FP8, "comfy_quant", seed=3)
    ref = tm.make_state_dict(cfg, torch.float32, seed=3)
    assert "scaled_fp8" not in sd
    seen = set()
    for name, _, kind in tm.specs_for(cfg):
        if kind != "linear":
            continue
        fmt, layer = tm.quant_format(name, FP8), name[: -len(".weight")]
        seen.add(fmt)
        if fmt is None:
            assert sd[name].dtype == torch.bfloat16 and f"{layer}.comfy_quant" not in sd
            continue
        conf = json.loads(bytes(sd[f"{layer}.comfy_quant"].tolist()).decode())
        assert conf == {"format": str(fmt).replace("torch.", "")} and sd[name].dtype == fmt
        assert (f"{layer}.input_scale" in sd) == (fmt != FP8)
        deq = sd[name].float() * sd[f"{layer}.weight_scale"]
        assert float((deq - ref[name]).norm() / ref[name].norm()) < (0.04 if fmt == FP8 else 0.08)
    assert seen == {FP8, torch.float8_e5m2, None}
    with safe_open(p, "pt") as f:
        assert set(f.keys()) == set(sd)
        for k in sd:
            t = f.get_tensor(k)
            assert torch.equal(t.view(torch.uint8) if t.dtype in tm.FP8_DTYPES else t,
                               sd[k].view(torch.uint8) if t.dtype in tm.FP8_DTYPES else sd[k]), k


# --------------------------------------------------------------------------- in ComfyUI
@pytest.mark.parametrize("variant,weight_dtype", [("bf16", "default"), ("bf16", "fp8_e4m3fn"),
                                                  ("fp8", "default"), ("scaled", "default"),
                                                  ("scaledin", "default")])
def test_flux(server, flux_files, variant, weight_dtype):
    info = flux_files[variant]
    name = tm.install_model(info, server.base / "models")
    start = len(server.log())  # what this test's load logs (the server is shared: any test order)
    stats, latent, counts = _run(server, tm.flux_workflow(name, weight_dtype, steps=2, prefix=f"flux_{variant}"), info)
    assert stats["finite"] and stats["shape"] == [1, 16, 8, 8], stats
    assert latent.shape == (1, 16, 8, 8) and torch.isfinite(latent).all() and latent.std() > 0
    assert counts["counts"]["unet"] == 2 and counts["shapes"]["unet"] == [[1, 16, 8, 8]] * 2, counts
    # 1 double + 1 single block, 2 steps; 16 image + 8 text tokens, 24 heads of 128.
    assert counts["counts"]["attn"] == 4 and counts["counts"]["attn.head_dim.128"] == 4, counts
    assert {(tuple(s["q"]), s["heads"], s["skip_reshape"]) for s in counts["shapes"]["attn"]} == {((1, 24, 24, 128), 24, True)}
    _assert_clean_load(server, name)
    log = server.log()[start:]
    assert "model_type FLUX" in log
    if variant in ("scaled", "scaledin"):
        assert _scaled_load_line(variant == "scaledin") in log


@pytest.fixture(scope="module")
def hv_files():
    files = tm.cached_models(tm.HUNYUAN_VIDEO_TINY_CONFIG, [(torch.bfloat16, False), (FP8, False), (FP8, True)])
    return dict(zip(("bf16", "fp8", "scaled"), files))


HV_LATENTS = {}


@pytest.mark.parametrize("variant,weight_dtype", [("bf16", "default"), ("bf16", "fp8_e4m3fn"),
                                                  ("fp8", "fp8_e4m3fn"), ("scaled", "default")])
def test_hunyuan_video(server, hv_files, variant, weight_dtype):
    info = hv_files[variant]
    name = tm.install_model(info, server.base / "models")
    prompt = tm.hunyuan_video_workflow(name, weight_dtype, frames=2, prefix=f"hv_{variant}_{weight_dtype}")
    start = len(server.log())  # what this test's load logs (the server is shared: any test order)
    stats, latent, counts = _run(server, prompt, info)
    log = server.log()[start:]
    assert stats["finite"] and stats["shape"] == [1, 16, 2, 8, 8], stats
    assert torch.isfinite(latent).all() and latent.std() > 0
    HV_LATENTS[(variant, weight_dtype)] = latent
    if (variant, weight_dtype) != ("bf16", "default") and ("bf16", "default") not in HV_LATENTS:
        # the reference run, whatever order the tests run in (the tiny model samples in a second)
        ref_name = tm.install_model(hv_files["bf16"], server.base / "models")
        HV_LATENTS[("bf16", "default")] = _run(server, tm.hunyuan_video_workflow(
            ref_name, "default", frames=2, prefix="hv_bf16_default_ref"), hv_files["bf16"],
            count_name="unet_ref")[1]  # else the bf16-default test's identical prompt comes from the cache
    ref = HV_LATENTS.get(("bf16", "default"))
    if (variant, weight_dtype) != ("bf16", "default"):
        # The same seed gives the same weights in every file: fp8 rounding only moves the result a bit.
        cos = torch.nn.functional.cosine_similarity(latent.flatten(), ref.flatten(), dim=0)
        print(f"cosine vs bf16 {variant}/{weight_dtype}: {float(cos):.5f}")
        assert cos > 0.99, (variant, weight_dtype, float(cos))
    if weight_dtype == "fp8_e4m3fn":
        assert "model weight dtype torch.float8_e4m3fn" in log
    if variant == "scaled":
        assert _scaled_load_line(False) in log
    assert counts["counts"]["unet"] == 2, counts
    # token refiner (2 blocks, text only), 1 double, 1 single block; 2 heads of 128.
    assert counts["counts"]["attn"] == 8 and counts["counts"]["attn.head_dim.128"] == 8, counts
    _assert_clean_load(server, name)


@pytest.fixture(scope="module")
def wan_files():
    files = tm.cached_models(tm.WAN_TINY_CONFIG, [(torch.bfloat16, False), (FP8, False), (FP8, True)])
    return dict(zip(("bf16", "fp8", "scaled"), files))


WAN_LATENTS = {}


@pytest.mark.parametrize("variant,weight_dtype", [("bf16", "default"), ("fp8", "fp8_e4m3fn"), ("scaled", "default")])
def test_wan(server, wan_files, variant, weight_dtype):
    """WAN 2.1 T2V, detected and sampled by ComfyUI: a 5-D latent, self- and cross-attention at head 128."""
    info = wan_files[variant]
    name = tm.install_model(info, server.base / "models")
    start = len(server.log())
    stats, latent, counts = _run(server, tm.wan_workflow(name, weight_dtype, frames=2,
                                                         prefix=f"wan_{variant}_{weight_dtype}"), info)
    log = server.log()[start:]
    assert stats["finite"] and stats["shape"] == [1, 16, 2, 8, 8], stats
    assert torch.isfinite(latent).all() and latent.std() > 0
    WAN_LATENTS[(variant, weight_dtype)] = latent
    if (variant, weight_dtype) != ("bf16", "default"):
        if ("bf16", "default") not in WAN_LATENTS:
            ref_name = tm.install_model(wan_files["bf16"], server.base / "models")
            WAN_LATENTS[("bf16", "default")] = _run(server, tm.wan_workflow(
                ref_name, "default", frames=2, prefix="wan_bf16_default_ref"), wan_files["bf16"],
                count_name="unet_ref")[1]
        ref = WAN_LATENTS[("bf16", "default")]
        cos = torch.nn.functional.cosine_similarity(latent.flatten(), ref.flatten(), dim=0)
        assert cos > 0.99, (variant, weight_dtype, float(cos))
    if variant == "scaled":
        assert _scaled_load_line(False) in log
    assert counts["counts"]["unet"] == 2, counts
    # 1 block, self- and cross-attention, 2 steps; 2 heads of 128; 2 x 4 x 4 = 32 video tokens, 8 text tokens
    assert counts["counts"]["attn"] == 4 and counts["counts"]["attn.head_dim.128"] == 4, counts
    assert {tuple(s["k"])[1] for s in counts["shapes"]["attn"]} == {32, 8}, counts
    _assert_clean_load(server, name)
    assert "WAN21" in log or "model_type FLOW" in log, log[-2000:]


def test_sd15_unet(server):
    info = tm.cached_models(tm.SD15_TINY_CONFIG, [(torch.float16, False)])[0]
    name = tm.install_model(info, server.base / "models")
    stats, latent, counts = _run(server, tm.sd15_workflow(name, prefix="sd15"), info)
    assert stats["finite"] and stats["shape"] == [1, 4, 8, 8], stats
    assert torch.isfinite(latent).all() and latent.std() > 0
    # cfg 2: cond and uncond go through the model together, one call per step (batch 2).
    assert counts["counts"]["unet"] == 2 and counts["shapes"]["unet"] == [[2, 4, 8, 8]] * 2, counts
    # Per step: 2 levels down + middle + 4 up blocks = 7 transformers x (self + cross) = 14 calls;
    # head size 40 at 320 channels, 80 at 640 (8 heads); cross-attention keys are 77 tokens.
    c = counts["counts"]
    assert c["attn"] == 28 and c["attn.head_dim.40"] == 12 and c["attn.head_dim.80"] == 16, counts
    assert any(s["k"][1] == 77 and s["q"][1] != 77 for s in counts["shapes"]["attn"]), counts
    _assert_clean_load(server, name)
    assert "model_type EPS" in server.log()


def test_conditioning_node_dims(server):
    """Explicit dims without a model; the workflow is only validated and run through a
    stats-free path: ConditioningZeroOut consumes it."""
    prompt = {"1": {"class_type": "TritonKitTestConditioning",
                    "inputs": {"seed": 1, "tokens": 5, "guidance": 2.0, "batch_size": 2, "std": 1.0,
                               "context_dim": 24, "pooled_dim": 12}},
              "2": {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["1", 0]}},
              "3": {"class_type": "TritonKitTestLatent",
                    "inputs": {"width": 32, "height": 48, "frames": 3, "batch_size": 1, "seed": 0, "mode": "zeros",
                               "channels": 16}},
              "4": {"class_type": "TritonKitTestLatentStats",
                    "inputs": {"samples": ["3", 0], "filename_prefix": "dims", "save": False}}}
    entry = server.run(prompt, timeout=60)
    stats = json.loads(entry["outputs"]["4"]["tritonkit_latent"][0])
    assert stats["shape"] == [1, 16, 3, 6, 4] and stats["absmax"] == 0.0
