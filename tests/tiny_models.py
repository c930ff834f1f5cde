"""Random-weight checkpoints of real diffusion architectures that ComfyUI 0.3.75 detects and
loads, tiny for CI and full-size for the GPU benchmark, plus API-format workflow builders.

Nothing here imports ComfyUI: the key names and shapes below are written from ComfyUI's model
classes (comfy/ldm/flux, comfy/ldm/hunyuan_video, comfy/ldm/wan, openaimodel) and checked against them by
tests/test_tiny_models.py (a meta-device instance of ComfyUI's own class must have exactly
these parameters).

What ComfyUI's detection fixes (comfy/model_detection.py, 0.3.75), and so what "tiny" can be:

* Flux: ``num_heads`` is hard-coded 24 and ``axes_dim`` [16, 56, 56] (sum 128), and the model
  requires hidden_size // num_heads == sum(axes_dim), so hidden_size is always 3072 and the
  head size 128. Only the depth, ``context_in_dim`` (txt_in) and ``vec_in_dim`` (vector_in)
  can shrink. The tiny Flux is 1 double + 1 single block at hidden 3072: 558 M parameters
  (~1.1 GB bf16, ~0.56 GB fp8).
* HunyuanVideo: ``num_heads = hidden_size // 128`` and axes_dim sums to 128, so the head size
  is 128 and the hidden size any multiple of 128; ``vec_in_dim`` is fixed 768 when vector_in
  exists. The tiny one is hidden 256 (2 heads of 128), 1 double + 1 single block.
* WAN 2.1 (text-to-video): ``num_heads = dim // 128`` (head size 128), the patch (1, 2, 2), ``freq_dim`` 256
  and ``text_dim`` 4096 are fixed; ``dim``, ``ffn_dim`` and the block count are read off the tensors. The tiny
  one is dim 256 (2 heads), ffn 512, 1 block (its text embedding keeps the 4096-wide input: 2.5 M parameters).
* SD1.5: model_channels 320 and context_dim 768 are required for the SD15 match, heads are
  fixed at 8 (``num_head_channels`` -1), so head size = channels / 8. The tiny UNet keeps 2
  levels (320, 640 channels: head sizes 40 and 80, the middle block at 640 also 80) with one
  res block + one transformer per level: a UNet-only file for ``UNETLoader``.

Dtypes: ``dtype`` applies to the weights of Linear layers; with an fp8 dtype norms, biases and
conv weights stay bf16 as in real fp8 checkpoints. ``scaled_fp8=True`` writes the legacy
"scaled fp8" format: every Linear weight fp8 with a float32 ``<layer>.scale_weight``
(absmax / fp8-max) and the marker tensor ``scaled_fp8`` of the fp8 dtype with 2 elements
(ComfyUI then leaves optimizations["fp8"] off: no input scaling); ``scaled_fp8="scale_input"``
writes a 0-element marker and a ``<layer>.scale_input`` of 1.0 for every Linear instead.
``scaled_fp8="comfy_quant"`` writes ComfyUI 0.8's quantized format instead: per Linear layer a
``<layer>.comfy_quant`` (the JSON ``{"format": ...}`` as uint8 bytes) and a float32
``<layer>.weight_scale``, with the layouts mixed by layer name (see :func:`quant_format`):
``dtype``, the other fp8 format (those also get an ``input_scale``), or left bf16 unquantized.

Weights: normal(0, 0.02) (biases too), norm scales 1, norm biases 0; each tensor drawn from
its own generator seeded by (seed, name), so a tensor's values don't depend on the config's
other tensors or the dtype (the fp8 and bf16 files of one seed hold the same weights).

ComfyUI on CPU (0.3.75): UNETLoader with weight_dtype "default" loads every file, fp8 ones
included, as float32 (``model weight dtype torch.float32``); fp8 weights stay fp8 in memory
(cast per forward, ``manual cast: torch.float32``) only with weight_dtype "fp8_e4m3fn"/
"fp8_e5m2", or with a scaled-fp8 file. Casting the tiny Flux's 531 M fp8 weights costs seconds
per forward on 2 cores; HunyuanVideo tiny (6.1 M, the same double/single-stream blocks) is the
cheap model for interpreter-heavy tests.

Usage in a test (see tests/test_tiny_models.py)::

    import tiny_models as tm
    from comfy_harness import ComfyServer, TEST_NODES
    info = tm.cached_models(tm.FLUX_TINY_CONFIG, [(torch.bfloat16, False)])[0]   # made once per machine
    with ComfyServer(tmp_path / "base", extra_packs=TEST_NODES) as srv:
        name = tm.install_model(info, srv.base / "models")                     # symlink into diffusion_models
        prompt = tm.flux_workflow(name, "fp8_e4m3fn", patch_nodes=[("TritonKitFp8Fallback", {"mode": "auto"})])
        entry = srv.run(prompt)
        stats = json.loads(entry["outputs"][tm.NODE_OUT]["tritonkit_latent"][0])  # shape, finite, mean, std…
        latent = safetensors.torch.load_file(srv.base / "output" / stats["file"])["latent"]

Counting calls from the pack under test: ``sys.modules.get("tritonkit_test_counters")`` exists
in a server that loaded the test nodes; ``.counts[key] += 1`` there and read the counters back
with a ``TritonKitTestCounters`` node (its UI output ``tritonkit_counters``)."""
from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import zlib
from pathlib import Path
from typing import Iterable, Iterator

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
INIT_STD = 0.02

# --------------------------------------------------------------------------- configs
# Flux: hidden 3072 / 24 heads / head 128 are forced by ComfyUI's detection (see above).
FLUX_DEV_CONFIG = dict(arch="flux", hidden_size=3072, num_heads=24, depth=19, depth_single_blocks=38,
                       context_in_dim=4096, vec_in_dim=768, in_channels=16, out_channels=16,
                       patch_size=2, mlp_ratio=4.0, qkv_bias=True, guidance_embed=True)
FLUX_TINY_CONFIG = dict(FLUX_DEV_CONFIG, depth=1, depth_single_blocks=1, context_in_dim=32, vec_in_dim=32)

HUNYUAN_VIDEO_CONFIG = dict(arch="hunyuan_video", hidden_size=3072, num_heads=24, depth=20,
                            depth_single_blocks=40, context_in_dim=4096, vec_in_dim=768,
                            in_channels=16, out_channels=16, patch_size=(1, 2, 2), mlp_ratio=4.0,
                            qkv_bias=True, guidance_embed=True, refiner_blocks=2)
HUNYUAN_VIDEO_TINY_CONFIG = dict(HUNYUAN_VIDEO_CONFIG, hidden_size=256, num_heads=2, depth=1,
                                 depth_single_blocks=1, context_in_dim=32)

# WAN 2.1 text-to-video (ComfyUI's WanModel, model_type "t2v"): detection reads dim, ffn_dim, the block count,
# in/out channels; it fixes num_heads = dim // 128, patch (1, 2, 2), freq_dim 256, qk norms; text_dim stays the
# class default 4096 (umT5-XXL's width). 14B: dim 5120, 40 heads, 40 blocks; 1.3B: dim 1536, 12 heads, 30 blocks.
WAN21_14B_CONFIG = dict(arch="wan", dim=5120, ffn_dim=13824, num_layers=40, num_heads=40, in_channels=16,
                        out_channels=16, text_dim=4096, freq_dim=256, patch_size=(1, 2, 2))
WAN21_1_3B_CONFIG = dict(WAN21_14B_CONFIG, dim=1536, ffn_dim=8960, num_layers=30, num_heads=12)
WAN_TINY_CONFIG = dict(WAN21_14B_CONFIG, dim=256, ffn_dim=512, num_layers=1, num_heads=2)

# SD1.5 proper: channel_mult (1, 2, 4, 4), attention on the first 3 levels, 2 res blocks each.
SD15_CONFIG = dict(arch="sd15", model_channels=320, channel_mult=(1, 2, 4, 4), num_res_blocks=2,
                   attention_levels=(0, 1, 2), num_heads=8, context_dim=768, in_channels=4,
                   out_channels=4, transformer_depth=1)
SD15_TINY_CONFIG = dict(SD15_CONFIG, channel_mult=(1, 2), num_res_blocks=1, attention_levels=(0, 1))


def _check_flux_like(cfg):
    if cfg["hidden_size"] % 128 or cfg["hidden_size"] // cfg["num_heads"] != 128:
        raise ValueError("ComfyUI's Flux/HunyuanVideo need head size 128 (axes_dim sums to 128)")
    if cfg["arch"] == "flux" and cfg["num_heads"] != 24:
        raise ValueError("ComfyUI 0.3.75 hard-codes 24 heads for Flux: hidden_size must be 3072")
    if cfg["arch"] == "hunyuan_video" and cfg.get("vec_in_dim") not in (None, 768):
        raise ValueError("ComfyUI 0.3.75 hard-codes vec_in_dim 768 for HunyuanVideo")


# --------------------------------------------------------------------------- tensor specs
# A spec is (name, shape, kind); kind: "linear" (a Linear's weight), "bias", "norm" (scale 1),
# "norm_bias" (0), "conv" (a conv weight).

def _linear(prefix, n_out, n_in, bias=True):
    out = [(f"{prefix}.weight", (n_out, n_in), "linear")]
    if bias:
        out.append((f"{prefix}.bias", (n_out,), "bias"))
    return out


def _mlp_embedder(prefix, n_in, h):
    return _linear(f"{prefix}.in_layer", h, n_in) + _linear(f"{prefix}.out_layer", h, h)


def _flux_double_block(p, h, d, mlp, qkv_bias):
    for s in ("img", "txt"):
        yield from _linear(f"{p}.{s}_mod.lin", 6 * h, h)
        yield from _linear(f"{p}.{s}_attn.qkv", 3 * h, h, bias=qkv_bias)
        yield f"{p}.{s}_attn.norm.query_norm.scale", (d,), "norm"
        yield f"{p}.{s}_attn.norm.key_norm.scale", (d,), "norm"
        yield from _linear(f"{p}.{s}_attn.proj", h, h)
        yield from _linear(f"{p}.{s}_mlp.0", mlp, h)
        yield from _linear(f"{p}.{s}_mlp.2", h, mlp)


def _flux_single_block(p, h, d, mlp):
    yield from _linear(f"{p}.linear1", 3 * h + mlp, h)
    yield from _linear(f"{p}.linear2", h, h + mlp)
    yield f"{p}.norm.query_norm.scale", (d,), "norm"
    yield f"{p}.norm.key_norm.scale", (d,), "norm"
    yield from _linear(f"{p}.modulation.lin", 3 * h, h)


def _last_layer(h, out_features):
    yield from _linear("final_layer.linear", out_features, h)
    yield from _linear("final_layer.adaLN_modulation.1", 2 * h, h)


def flux_specs(cfg: dict) -> list[tuple]:
    _check_flux_like(cfg)
    h, d = cfg["hidden_size"], cfg["hidden_size"] // cfg["num_heads"]
    mlp, p = int(h * cfg["mlp_ratio"]), cfg["patch_size"]
    out = list(_linear("img_in", h, cfg["in_channels"] * p * p))
    out += _mlp_embedder("time_in", 256, h)
    if cfg.get("vec_in_dim"):
        out += _mlp_embedder("vector_in", cfg["vec_in_dim"], h)
    if cfg.get("guidance_embed"):
        out += _mlp_embedder("guidance_in", 256, h)
    out += _linear("txt_in", h, cfg["context_in_dim"])
    for i in range(cfg["depth"]):
        out += _flux_double_block(f"double_blocks.{i}", h, d, mlp, cfg["qkv_bias"])
    for i in range(cfg["depth_single_blocks"]):
        out += _flux_single_block(f"single_blocks.{i}", h, d, mlp)
    out += _last_layer(h, p * p * cfg["out_channels"])
    return out


def hunyuan_video_specs(cfg: dict) -> list[tuple]:
    """ComfyUI's own key names (what Comfy-Org's repackaged HunyuanVideo files use)."""
    _check_flux_like(cfg)
    h, d = cfg["hidden_size"], cfg["hidden_size"] // cfg["num_heads"]
    mlp, ps, ctx = int(h * cfg["mlp_ratio"]), tuple(cfg["patch_size"]), cfg["context_in_dim"]
    out = [("img_in.proj.weight", (h, cfg["in_channels"], *ps), "conv"), ("img_in.proj.bias", (h,), "bias")]
    out += _mlp_embedder("time_in", 256, h)
    if cfg.get("vec_in_dim"):
        out += _mlp_embedder("vector_in", 768, h)
    if cfg.get("guidance_embed"):
        out += _mlp_embedder("guidance_in", 256, h)
    out += _linear("txt_in.input_embedder", h, ctx)
    out += _mlp_embedder("txt_in.t_embedder", 256, h)
    out += _mlp_embedder("txt_in.c_embedder", ctx, h)
    for i in range(cfg.get("refiner_blocks", 2)):
        p = f"txt_in.individual_token_refiner.blocks.{i}"
        out += _linear(f"{p}.adaLN_modulation.1", 2 * h, h)
        out += [(f"{p}.norm1.weight", (h,), "norm"), (f"{p}.norm1.bias", (h,), "norm_bias")]
        out += _linear(f"{p}.self_attn.qkv", 3 * h, h)
        out += _linear(f"{p}.self_attn.proj", h, h)
        out += [(f"{p}.norm2.weight", (h,), "norm"), (f"{p}.norm2.bias", (h,), "norm_bias")]
        out += _linear(f"{p}.mlp.0", 4 * h, h)
        out += _linear(f"{p}.mlp.2", h, 4 * h)
    for i in range(cfg["depth"]):
        out += _flux_double_block(f"double_blocks.{i}", h, d, mlp, cfg["qkv_bias"])
    for i in range(cfg["depth_single_blocks"]):
        out += _flux_single_block(f"single_blocks.{i}", h, d, mlp)
    out += _last_layer(h, ps[-1] * ps[-1] * cfg["out_channels"])
    return out


def _check_wan(cfg):
    if cfg["dim"] % 128 or cfg["dim"] // cfg["num_heads"] != 128:
        raise ValueError("ComfyUI's WAN detection sets num_heads = dim // 128: the head size must be 128")
    if cfg["text_dim"] != 4096 or cfg["freq_dim"] != 256 or tuple(cfg["patch_size"]) != (1, 2, 2):
        raise ValueError("ComfyUI's WAN detection fixes text_dim 4096, freq_dim 256 and patch (1, 2, 2)")


def _wan_attention(p, h):
    out = []
    for n in ("q", "k", "v", "o"):
        out += _linear(f"{p}.{n}", h, h)
    out += [(f"{p}.norm_q.weight", (h,), "norm"), (f"{p}.norm_k.weight", (h,), "norm")]
    return out


def wan_specs(cfg: dict) -> list[tuple]:
    """ComfyUI's WanModel keys (t2v; what Comfy-Org's repackaged WAN 2.1 files use)."""
    _check_wan(cfg)
    h, f, ps = cfg["dim"], cfg["ffn_dim"], tuple(cfg["patch_size"])
    out = [("patch_embedding.weight", (h, cfg["in_channels"], *ps), "conv"), ("patch_embedding.bias", (h,), "bias")]
    out += _linear("text_embedding.0", h, cfg["text_dim"]) + _linear("text_embedding.2", h, h)
    out += _linear("time_embedding.0", h, cfg["freq_dim"]) + _linear("time_embedding.2", h, h)
    out += _linear("time_projection.1", 6 * h, h)
    for i in range(cfg["num_layers"]):
        p = f"blocks.{i}"
        out.append((f"{p}.modulation", (1, 6, h), "bias"))
        out += _wan_attention(f"{p}.self_attn", h)
        out += [(f"{p}.norm3.weight", (h,), "norm"), (f"{p}.norm3.bias", (h,), "norm_bias")]
        out += _wan_attention(f"{p}.cross_attn", h)
        out += _linear(f"{p}.ffn.0", f, h) + _linear(f"{p}.ffn.2", h, f)
    out.append(("head.modulation", (1, 2, h), "bias"))
    out += _linear("head.head", ps[0] * ps[1] * ps[2] * cfg["out_channels"], h)
    return out


def _groupnorm(prefix, c):
    return [(f"{prefix}.weight", (c,), "norm"), (f"{prefix}.bias", (c,), "norm_bias")]


def _conv(prefix, n_out, n_in, k):
    return [(f"{prefix}.weight", (n_out, n_in, k, k), "conv"), (f"{prefix}.bias", (n_out,), "bias")]


def _resblock(p, c_in, c_out, emb):
    out = _groupnorm(f"{p}.in_layers.0", c_in) + _conv(f"{p}.in_layers.2", c_out, c_in, 3)
    out += _linear(f"{p}.emb_layers.1", c_out, emb)
    out += _groupnorm(f"{p}.out_layers.0", c_out) + _conv(f"{p}.out_layers.3", c_out, c_out, 3)
    if c_in != c_out:
        out += _conv(f"{p}.skip_connection", c_out, c_in, 1)
    return out


def _spatial_transformer(p, c, ctx, depth):
    out = _groupnorm(f"{p}.norm", c) + _conv(f"{p}.proj_in", c, c, 1)
    for j in range(depth):
        b = f"{p}.transformer_blocks.{j}"
        for a, kv_dim in (("attn1", c), ("attn2", ctx)):
            out += _linear(f"{b}.{a}.to_q", c, c, bias=False)
            out += _linear(f"{b}.{a}.to_k", c, kv_dim, bias=False)
            out += _linear(f"{b}.{a}.to_v", c, kv_dim, bias=False)
            out += _linear(f"{b}.{a}.to_out.0", c, c)
        out += _linear(f"{b}.ff.net.0.proj", 8 * c, c)
        out += _linear(f"{b}.ff.net.2", c, 4 * c)
        for n in ("norm1", "norm2", "norm3"):
            out += [(f"{b}.{n}.weight", (c,), "norm"), (f"{b}.{n}.bias", (c,), "norm_bias")]
    out += _conv(f"{p}.proj_out", c, c, 1)
    return out


def sd_unet_specs(cfg: dict) -> list[tuple]:
    """An SD1.x-style UNet (no label embedding, conv proj_in), ComfyUI/LDM key names."""
    mc, ctx, depth = cfg["model_channels"], cfg["context_dim"], cfg["transformer_depth"]
    emb, nrb, att = 4 * mc, cfg["num_res_blocks"], set(cfg["attention_levels"])
    out = _linear("time_embed.0", emb, mc) + _linear("time_embed.2", emb, emb)
    out += _conv("input_blocks.0.0", mc, cfg["in_channels"], 3)
    chans, ch, n = [mc], mc, 1
    for level, mult in enumerate(cfg["channel_mult"]):
        for _ in range(nrb):
            out += _resblock(f"input_blocks.{n}.0", ch, mult * mc, emb)
            ch = mult * mc
            if level in att:
                out += _spatial_transformer(f"input_blocks.{n}.1", ch, ctx, depth)
            chans.append(ch)
            n += 1
        if level != len(cfg["channel_mult"]) - 1:
            out += _conv(f"input_blocks.{n}.0.op", ch, ch, 3)
            chans.append(ch)
            n += 1
    out += _resblock("middle_block.0", ch, ch, emb) + _spatial_transformer("middle_block.1", ch, ctx, depth)
    out += _resblock("middle_block.2", ch, ch, emb)
    n = 0
    for level, mult in reversed(list(enumerate(cfg["channel_mult"]))):
        for i in range(nrb + 1):
            ich = chans.pop()
            out += _resblock(f"output_blocks.{n}.0", ch + ich, mult * mc, emb)
            ch, k = mult * mc, 1
            if level in att:
                out += _spatial_transformer(f"output_blocks.{n}.1", ch, ctx, depth)
                k = 2
            if level and i == nrb:
                out += _conv(f"output_blocks.{n}.{k}.conv", ch, ch, 3)
            n += 1
    out += _groupnorm("out.0", mc) + _conv("out.2", cfg["out_channels"], mc, 3)
    return out


def specs_for(cfg: dict) -> list[tuple]:
    return {"flux": flux_specs, "hunyuan_video": hunyuan_video_specs, "sd15": sd_unet_specs,
            "wan": wan_specs}[cfg["arch"]](cfg)


def param_count(cfg: dict) -> int:
    return sum(math.prod(s) for _, s, _ in specs_for(cfg))


# --------------------------------------------------------------------------- tensors
def _seed_for(seed: int, name: str) -> int:
    return (seed * 0x9E3779B1 + zlib.crc32(name.encode())) & 0x7FFF_FFFF_FFFF


def _base_tensor(name, shape, kind, seed, device, std):
    if kind == "norm":
        return torch.ones(shape, dtype=torch.float32, device=device)
    if kind == "norm_bias":
        return torch.zeros(shape, dtype=torch.float32, device=device)
    g = torch.Generator(device=device).manual_seed(_seed_for(seed, name))
    return torch.randn(shape, generator=g, dtype=torch.float32, device=device).mul_(std)


def quant_format(name: str, dtype):
    """The layout a Linear weight gets in a ``comfy_quant`` file: by a hash of its name, ``dtype``,
    the other fp8 format, or None (unquantized, bf16)."""
    other = torch.float8_e5m2 if dtype == torch.float8_e4m3fn else torch.float8_e4m3fn
    return (dtype, other, None)[zlib.crc32(name.encode()) % 3]


def _comfy_quant_bytes(fmt) -> torch.Tensor:
    conf = {"format": str(fmt).replace("torch.", "")}
    return torch.tensor(list(json.dumps(conf).encode("utf-8")), dtype=torch.uint8)


def _variant(name, kind, t, dtype, scaled_fp8):
    """The tensors one spec becomes in a file of ``dtype`` (``t``: the float32 base values)."""
    if kind == "linear" and scaled_fp8 == "comfy_quant":
        fmt = quant_format(name, dtype)
        if fmt is None:
            return [(name, t.to(torch.bfloat16).cpu())]
        fmax = torch.finfo(fmt).max
        scale = t.abs().amax().clamp_min(1e-12) / fmax
        layer = name[: -len(".weight")]
        out = [(name, (t / scale).clamp_(-fmax, fmax).to(fmt).cpu()),
               (f"{layer}.weight_scale", scale.reshape(()).to(torch.float32).cpu()),
               (f"{layer}.comfy_quant", _comfy_quant_bytes(fmt))]
        if fmt != dtype:
            out.append((f"{layer}.input_scale", torch.ones((), dtype=torch.float32)))
        return out
    if kind == "linear" and scaled_fp8:
        fmax = torch.finfo(dtype).max
        scale = t.abs().amax().clamp_min(1e-12) / fmax
        out = [(name, (t / scale).clamp_(-fmax, fmax).to(dtype).cpu()),
               (name[: -len("weight")] + "scale_weight", scale.reshape(()).to(torch.float32).cpu())]
        if scaled_fp8 == "scale_input":
            out.append((name[: -len("weight")] + "scale_input", torch.ones((), dtype=torch.float32)))
        return out
    if kind == "linear":
        return [(name, t.to(dtype).cpu())]
    return [(name, t.to(torch.bfloat16 if dtype in FP8_DTYPES else dtype).cpu())]


def _check_variant(dtype, scaled_fp8):
    if scaled_fp8 not in (False, True, "scale_input", "comfy_quant"):
        raise ValueError(f"scaled_fp8 must be False, True, 'scale_input' or 'comfy_quant', not {scaled_fp8!r}")
    if scaled_fp8 and dtype not in FP8_DTYPES:
        raise ValueError("scaled_fp8 needs an fp8 dtype")


def _scaled_marker(dtype, scaled_fp8):
    # ComfyUI: a 2-element marker turns model_config.optimizations["fp8"] off (weights scaled,
    # inputs not: no scale_input parameters); any other size turns it on, and then every
    # scaled Linear has a scale_input parameter (we write 1.0).
    return torch.zeros((0,) if scaled_fp8 == "scale_input" else (2,), dtype=dtype)


def iter_tensors(cfg: dict, dtype=torch.bfloat16, scaled_fp8: bool = False, seed: int = 0,
                 device="cpu", std: float = INIT_STD) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (name, CPU tensor) one at a time, so a full-size model never has to be in memory
    at once. ``device`` is where the random numbers are drawn (a GPU is much faster at full size)."""
    _check_variant(dtype, scaled_fp8)
    for name, shape, kind in specs_for(cfg):
        yield from _variant(name, kind, _base_tensor(name, shape, kind, seed, device, std), dtype, scaled_fp8)
    if scaled_fp8 and scaled_fp8 != "comfy_quant":
        yield "scaled_fp8", _scaled_marker(dtype, scaled_fp8)


def make_state_dict(cfg: dict, dtype=torch.bfloat16, scaled_fp8: bool = False, seed: int = 0,
                    device="cpu") -> dict[str, torch.Tensor]:
    """The whole state dict in memory (tiny configs; for full size use write_model/write_models)."""
    return dict(iter_tensors(cfg, dtype, scaled_fp8, seed, device))


def make_flux_state_dict(config: dict = FLUX_TINY_CONFIG, dtype=torch.bfloat16, scaled_fp8=False, seed=0, device="cpu"):
    return make_state_dict(config, dtype, scaled_fp8, seed, device)


def make_hunyuan_video_state_dict(config: dict = HUNYUAN_VIDEO_TINY_CONFIG, dtype=torch.bfloat16, scaled_fp8=False,
                                  seed=0, device="cpu"):
    return make_state_dict(config, dtype, scaled_fp8, seed, device)


def make_wan_state_dict(config: dict = WAN_TINY_CONFIG, dtype=torch.bfloat16, scaled_fp8=False, seed=0, device="cpu"):
    return make_state_dict(config, dtype, scaled_fp8, seed, device)


def make_sd15_state_dict(config: dict = SD15_TINY_CONFIG, dtype=torch.float16, seed=0, device="cpu"):
    return make_state_dict(config, dtype, False, seed, device)


# --------------------------------------------------------------------------- streaming safetensors
_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
              torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2", torch.int64: "I64",
              torch.int32: "I32", torch.uint8: "U8", torch.int8: "I8", torch.bool: "BOOL"}


def _tensor_meta(cfg, dtype, scaled_fp8):
    """(name, dtype, shape) of every tensor iter_tensors yields, in order, without making any."""
    other = torch.bfloat16 if dtype in FP8_DTYPES else dtype
    for name, shape, kind in specs_for(cfg):
        if kind == "linear" and scaled_fp8 == "comfy_quant":
            fmt = quant_format(name, dtype)
            yield name, (fmt or torch.bfloat16), tuple(shape)
            if fmt is not None:
                layer = name[: -len(".weight")]
                yield f"{layer}.weight_scale", torch.float32, ()
                yield f"{layer}.comfy_quant", torch.uint8, tuple(_comfy_quant_bytes(fmt).shape)
                if fmt != dtype:
                    yield f"{layer}.input_scale", torch.float32, ()
            continue
        yield name, (dtype if kind == "linear" else other), tuple(shape)
        if kind == "linear" and scaled_fp8:
            yield name[: -len("weight")] + "scale_weight", torch.float32, ()
            if scaled_fp8 == "scale_input":
                yield name[: -len("weight")] + "scale_input", torch.float32, ()
    if scaled_fp8 and scaled_fp8 != "comfy_quant":
        yield "scaled_fp8", dtype, tuple(_scaled_marker(dtype, scaled_fp8).shape)


class _StreamWriter:
    """A safetensors file written tensor by tensor: the header (names, dtypes, shapes, offsets)
    is fixed up front from ``metas``; ``add`` must then get the same tensors in the same order."""

    def __init__(self, path, metas, metadata=None):
        self.header, offset, self.order = {}, 0, []
        for name, dt, shape in metas:
            n = math.prod(shape) * torch.empty((), dtype=dt).element_size()
            self.header[name] = {"dtype": _ST_DTYPES[dt], "shape": list(shape), "data_offsets": [offset, offset + n]}
            self.order.append(name)
            offset += n
        if metadata:
            self.header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        hb = json.dumps(self.header, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(f"{self.path.name}.part{os.getpid()}")
        self.f = open(self.tmp, "wb")
        self.f.write(struct.pack("<Q", len(hb)))
        self.f.write(hb)
        self.i = 0

    def add(self, name, t):
        want = self.order[self.i] if self.i < len(self.order) else None
        h = self.header.get(want)
        if name != want or list(t.shape) != h["shape"] or _ST_DTYPES[t.dtype] != h["dtype"]:
            raise RuntimeError(f"tensor stream out of step at {want}: got {name} {t.dtype} {tuple(t.shape)}")
        if t.numel():
            self.f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)
        self.i += 1

    def close(self):
        self.f.close()
        if self.i != len(self.order):
            self.tmp.unlink()
            raise RuntimeError(f"{self.path}: {len(self.order) - self.i} tensors never written")
        self.tmp.replace(self.path)

    def abort(self):
        self.f.close()
        self.tmp.unlink(missing_ok=True)


def write_safetensors_stream(path, metas: Iterable[tuple], tensors: Iterable[tuple[str, torch.Tensor]],
                             metadata: dict | None = None):
    """Writes a safetensors file one tensor at a time: ``metas`` (name, dtype, shape) fixes the
    header up front, ``tensors`` then yields (name, tensor) for the same names in the same order."""
    w = _StreamWriter(path, metas, metadata)
    try:
        for name, t in tensors:
            w.add(name, t)
    except BaseException:
        w.abort()
        raise
    w.close()
    return Path(path)


def describe(cfg: dict, dtype=torch.bfloat16, scaled_fp8=False) -> dict:
    """What a test needs to make matching conditioning and latents."""
    d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items()}
    d["dtype"] = str(dtype).replace("torch.", "")
    d["scaled_fp8"] = scaled_fp8
    d["params"] = param_count(cfg)
    d["latent_channels"] = cfg["in_channels"]
    if cfg["arch"] in ("flux", "hunyuan_video"):
        d["head_dim"] = cfg["hidden_size"] // cfg["num_heads"]
        d["head_dims"] = [d["head_dim"]]
        d["context_dim"] = cfg["context_in_dim"]
        d["vec_dim"] = cfg.get("vec_in_dim") or 0
        d["latent_dims"] = 3 if cfg["arch"] == "hunyuan_video" else 2
    elif cfg["arch"] == "wan":
        d["head_dim"] = cfg["dim"] // cfg["num_heads"]
        d["head_dims"] = [d["head_dim"]]
        d["context_dim"] = cfg["text_dim"]
        d["vec_dim"] = 0
        d["latent_dims"] = 3
    else:
        mc = cfg["model_channels"]
        d["head_dims"] = sorted({m * mc // cfg["num_heads"] for m in cfg["channel_mult"]})
        d["vec_dim"] = 0
        d["latent_dims"] = 2
    return d


def write_models(cfg: dict, targets, seed: int = 0, device="cpu", std: float = INIT_STD) -> list[dict]:
    """Writes several files of one model in one pass (the random numbers are drawn once):
    ``targets`` = [(path, dtype, scaled_fp8), ...]. Memory: one tensor at a time. Returns one
    ``describe`` dict (plus "path") per target."""
    writers, out = [], []
    for path, dtype, scaled in targets:
        _check_variant(dtype, scaled)
        info = describe(cfg, dtype, scaled)
        info["seed"] = seed
        writers.append((_StreamWriter(path, _tensor_meta(cfg, dtype, scaled),
                                      {"tritonkit_tiny_model": json.dumps(info)}), dtype, scaled))
        out.append(dict(info, path=str(path)))
    try:
        for name, shape, kind in specs_for(cfg):
            base = _base_tensor(name, shape, kind, seed, device, std)
            for w, dtype, scaled in writers:
                for n, t in _variant(name, kind, base, dtype, scaled):
                    w.add(n, t)
        for w, dtype, scaled in writers:
            if scaled and scaled != "comfy_quant":
                w.add("scaled_fp8", _scaled_marker(dtype, scaled))
    except BaseException:
        for w, _, _ in writers:
            w.abort()
        raise
    for w, _, _ in writers:
        w.close()
    return out


def write_model(path, cfg: dict, dtype=torch.bfloat16, scaled_fp8=False, seed=0, device="cpu") -> dict:
    """Streams a random model of ``cfg`` to ``path`` (memory: one tensor at a time)."""
    return write_models(cfg, [(path, dtype, scaled_fp8)], seed, device)[0]


# --------------------------------------------------------------------------- file cache
FORMAT_VERSION = 2
_DTYPE_NAMES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                "fp8_e4m3fn": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def cache_dir() -> Path:
    return Path(os.environ.get("TK_TINY_MODEL_CACHE", Path.home() / ".cache" / "tritonkit" / "tiny_models"))


def _dtype_name(dtype):
    return {v: k for k, v in _DTYPE_NAMES.items()}[dtype]


def cached_file_name(cfg: dict, dtype, scaled_fp8=False, seed=0) -> str:
    key = json.dumps([FORMAT_VERSION, describe(cfg), seed, INIT_STD], sort_keys=True)
    h = hashlib.sha1(key.encode()).hexdigest()[:10]
    sc = {False: "", True: "_scaled", "scale_input": "_scaledin", "comfy_quant": "_quant"}[scaled_fp8]
    return f"tk_{cfg['arch']}_{_dtype_name(dtype)}{sc}_s{seed}_{h}.safetensors"


def cached_models(cfg: dict, variants, seed: int = 0, directory=None) -> list[dict]:
    """Files of ``cfg`` for each (dtype, scaled_fp8) in ``variants``, made once per machine in
    ``cache_dir()`` (env TK_TINY_MODEL_CACHE) and reused; missing ones are made in one pass.
    Returns describe() dicts with "path" (the cached file) and "name" (its file name)."""
    d = Path(directory or cache_dir())
    targets = [(d / cached_file_name(cfg, dt, sc, seed), dt, sc) for dt, sc in variants]
    missing = [t for t in targets if not t[0].exists()]
    if missing:
        write_models(cfg, missing, seed)
    out = []
    for path, dt, sc in targets:
        info = describe(cfg, dt, sc)
        out.append(dict(info, seed=seed, path=str(path), name=path.name))
    return out


def install_model(info: dict, models_dir, subdir: str = "diffusion_models") -> str:
    """Symlinks a cached file into a ComfyUI base directory's models/<subdir>; returns the name
    to give the loader."""
    dst = Path(models_dir) / subdir / info["name"]
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists():
        dst.symlink_to(Path(info["path"]).resolve())
    return info["name"]



def make_tiny_flux(path, dtype=torch.bfloat16, scaled_fp8=False, seed=0, config: dict | None = None) -> dict:
    """Flux-dev architecture (guidance_in, vector_in), 1 double + 1 single block at ComfyUI's
    forced hidden 3072 / 24 heads / head 128; context_in_dim 32, vec_in_dim 32."""
    return write_model(path, config or FLUX_TINY_CONFIG, dtype, scaled_fp8, seed)


def make_tiny_hunyuan_video(path, dtype=torch.bfloat16, scaled_fp8=False, seed=0, config: dict | None = None) -> dict:
    """HunyuanVideo T2V architecture (3D patch embed, token refiner, guidance_in, vector_in 768),
    hidden 256 = 2 heads of 128, 1 double + 1 single block, context_in_dim 32."""
    return write_model(path, config or HUNYUAN_VIDEO_TINY_CONFIG, dtype, scaled_fp8, seed)


def make_tiny_wan(path, dtype=torch.bfloat16, scaled_fp8=False, seed=0, config: dict | None = None) -> dict:
    """WAN 2.1 T2V architecture (3D patch embed, text / time embeddings, self + cross attention with qk
    norms, modulation), dim 256 = 2 heads of 128, 1 block, text_dim 4096."""
    return write_model(path, config or WAN_TINY_CONFIG, dtype, scaled_fp8, seed)


def make_tiny_sd15(path, seed=0, dtype=torch.float16, config: dict | None = None) -> dict:
    """An SD1.5 UNet only (load with UNETLoader, not CheckpointLoaderSimple): 320/640 channels,
    8 heads, so head sizes 40 and 80; context 768."""
    return write_model(path, config or SD15_TINY_CONFIG, dtype, False, seed)


# --------------------------------------------------------------------------- workflows (API format)
# Fixed node ids, so tests can find the parts: the loader, the patch chain (PATCH_BASE, +1, ...),
# the conditioning, the latent, the sampler and the output node reporting the latent.
NODE_LOADER, NODE_POS, NODE_NEG, NODE_LATENT, NODE_SAMPLER, NODE_OUT = "1", "2", "3", "4", "5", "6"
PATCH_BASE = 10


def _patch_chain(prompt: dict, model_ref: list, patch_nodes) -> list:
    """patch_nodes: [(class_type, {inputs but 'model'}) or "ClassType", ...], applied in order;
    each gets the previous MODEL on its input named 'model'."""
    for i, p in enumerate(patch_nodes or ()):
        cls, inputs = (p, {}) if isinstance(p, str) else p
        nid = str(PATCH_BASE + i)
        prompt[nid] = {"class_type": cls, "inputs": {**inputs, "model": model_ref}}
        model_ref = [nid, 0]
    return model_ref


def sampling_workflow(unet_name: str, weight_dtype: str = "default", patch_nodes=(), steps: int = 2,
                      width: int = 64, height: int = 64, frames: int = 0, seed: int = 0, cfg: float = 1.0,
                      sampler: str = "euler", scheduler: str = "simple", tokens: int = 8,
                      guidance: float = 3.5, denoise: float = 1.0, latent_mode: str = "randn",
                      negative: bool = False, prefix: str = "tritonkit_test", save_latent: bool = True) -> dict:
    """UNETLoader → patch_nodes… → KSampler(TritonKitTestConditioning, TritonKitTestLatent) →
    TritonKitTestLatentStats. Conditioning and latent shapes are taken from the loaded model."""
    prompt = {NODE_LOADER: {"class_type": "UNETLoader", "inputs": {"unet_name": unet_name, "weight_dtype": weight_dtype}}}
    model = _patch_chain(prompt, [NODE_LOADER, 0], patch_nodes)
    cond = {"seed": seed, "tokens": tokens, "guidance": guidance, "batch_size": 1, "std": 1.0,
            "model": [NODE_LOADER, 0]}
    prompt[NODE_POS] = {"class_type": "TritonKitTestConditioning", "inputs": dict(cond)}
    prompt[NODE_NEG] = {"class_type": "TritonKitTestConditioning", "inputs": dict(cond, seed=seed + 1)}
    prompt[NODE_LATENT] = {"class_type": "TritonKitTestLatent",
                           "inputs": {"width": width, "height": height, "frames": frames, "batch_size": 1,
                                      "seed": seed, "mode": latent_mode, "model": [NODE_LOADER, 0]}}
    prompt[NODE_SAMPLER] = {"class_type": "KSampler", "inputs": {
        "model": model, "seed": seed, "steps": steps, "cfg": cfg, "sampler_name": sampler, "scheduler": scheduler,
        "positive": [NODE_POS, 0], "negative": [NODE_NEG, 0], "latent_image": [NODE_LATENT, 0], "denoise": denoise}}
    prompt[NODE_OUT] = {"class_type": "TritonKitTestLatentStats",
                        "inputs": {"samples": [NODE_SAMPLER, 0], "filename_prefix": prefix, "save": save_latent}}
    return prompt


def flux_workflow(unet_name: str, weight_dtype: str = "default", patch_nodes=(), steps: int = 2, **kw) -> dict:
    """Flux dev: cfg 1 (guidance-distilled, one forward per step), 64x64 px → 8x8 latent → 16 tokens."""
    return sampling_workflow(unet_name, weight_dtype, patch_nodes, steps, **kw)


def hunyuan_video_workflow(unet_name: str, weight_dtype: str = "default", patch_nodes=(), steps: int = 2,
                           frames: int = 2, **kw) -> dict:
    """HunyuanVideo: a 5-D latent of ``frames`` latent frames (64x64 px → 8x8), cfg 1, guidance 6."""
    kw.setdefault("guidance", 6.0)
    return sampling_workflow(unet_name, weight_dtype, patch_nodes, steps, frames=frames, **kw)


def wan_workflow(unet_name: str, weight_dtype: str = "default", patch_nodes=(), steps: int = 2,
                 frames: int = 2, **kw) -> dict:
    """WAN 2.1 T2V: a 5-D latent of ``frames`` latent frames (64x64 px → 8x8), cfg 1 (one forward a step; WAN
    runs cfg 5-6 in practice, twice the calls of the same shapes), 8 text tokens of 4096."""
    kw.setdefault("guidance", -1.0)  # no guidance input
    return sampling_workflow(unet_name, weight_dtype, patch_nodes, steps, frames=frames, **kw)


def sd15_workflow(unet_name: str, weight_dtype: str = "default", patch_nodes=(), steps: int = 2,
                  cfg: float = 2.0, **kw) -> dict:
    """SD1.5: cfg 2 so both cond and uncond go through the model; 77 tokens of 768 like CLIP-L."""
    kw.setdefault("tokens", 77)
    kw.setdefault("scheduler", "normal")
    return sampling_workflow(unet_name, weight_dtype, patch_nodes, steps, cfg=cfg, **kw)
