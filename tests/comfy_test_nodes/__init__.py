"""Test-only ComfyUI nodes (V1 API): conditioning and latents of the right shapes for a loaded
diffusion model without text encoders or a VAE, a latent report for /history, and call counters.

Linked into ``custom_nodes/`` by tests (``ComfyServer(extra_packs={...})``); never shipped.

Counters: ``sys.modules["tritonkit_test_counters"].counts`` is a ``collections.Counter`` shared
by everything in the server process (this pack, the pack under test, anything); the
``TritonKitTestCounters`` node reports it as JSON in its UI output (and can reset it)."""
from __future__ import annotations

import collections
import json
import math
import os
import sys
import types

import torch

import comfy.model_management
import folder_paths


def counters() -> collections.Counter:
    mod = sys.modules.get("tritonkit_test_counters")
    if mod is None:
        mod = types.ModuleType("tritonkit_test_counters")
        mod.counts = collections.Counter()
        mod.shapes = collections.defaultdict(list)
        sys.modules["tritonkit_test_counters"] = mod
    return mod.counts


counters()


def _unet_config(model) -> dict:
    return dict(getattr(model.model.model_config, "unet_config", {}) or {})


def _model_dims(model) -> tuple[int, int, str]:
    """(context dim, pooled dim or 0, image_model) of a loaded MODEL."""
    cfg = _unet_config(model)
    kind = cfg.get("image_model", "unet")
    if "context_in_dim" in cfg:
        ctx = cfg["context_in_dim"]
    elif cfg.get("context_dim"):
        ctx = cfg["context_dim"]
    elif str(kind).startswith("wan"):
        # WAN's text width is not in its detected config (the class default, umT5's 4096): read it off the model
        ctx = model.get_model_object("diffusion_model").text_embedding[0].weight.shape[1]
    else:
        raise ValueError(f"TritonKitTestConditioning: can't tell the context dim of {kind}: give context_dim")
    pooled = cfg.get("vec_in_dim") or cfg.get("adm_in_channels") or 0
    if kind == "unet" and cfg.get("adm_in_channels"):
        raise ValueError("TritonKitTestConditioning: SDXL-style ADM conditioning is not supported")
    return int(ctx), int(pooled), kind


class TritonKitTestConditioning:
    """Random CONDITIONING (B, tokens, context_dim) + pooled_output (B, pooled_dim) + guidance,
    from a seed. Dims come from ``model`` unless given (> 0)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
                    "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFF}),
                    "tokens": ("INT", {"default": 8, "min": 1, "max": 4096}),
                    "guidance": ("FLOAT", {"default": 3.5, "min": -1.0, "max": 100.0, "step": 0.1}),
                    "batch_size": ("INT", {"default": 1, "min": 1, "max": 64}),
                    "std": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 100.0, "step": 0.01})},
                "optional": {
                    "model": ("MODEL",),
                    "context_dim": ("INT", {"default": 0, "min": 0, "max": 16384}),
                    "pooled_dim": ("INT", {"default": 0, "min": 0, "max": 16384})}}

    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "make"
    CATEGORY = "testing/tritonkit"

    def make(self, seed, tokens, guidance, batch_size, std, model=None, context_dim=0, pooled_dim=0):
        ctx, pooled, kind = (0, 0, "given")
        if model is not None:
            ctx, pooled, kind = _model_dims(model)
        ctx = context_dim or ctx
        pooled = pooled_dim or pooled
        if not ctx:
            raise ValueError("TritonKitTestConditioning: connect a model or give context_dim")
        g = torch.Generator().manual_seed(seed)
        cond = torch.randn((batch_size, tokens, ctx), generator=g) * std
        extra = {}
        if pooled:
            extra["pooled_output"] = torch.randn((batch_size, pooled), generator=g) * std
        if guidance >= 0:
            extra["guidance"] = guidance
        return ([[cond, extra]],)


class TritonKitTestLatent:
    """A LATENT for ``model`` (channels and 4-D/5-D from its latent format) or of ``channels``:
    zeros or randn(seed). ``frames`` > 0 gives a 5-D video latent of that many latent frames."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
                    "width": ("INT", {"default": 64, "min": 8, "max": 16384, "step": 8}),
                    "height": ("INT", {"default": 64, "min": 8, "max": 16384, "step": 8}),
                    "frames": ("INT", {"default": 0, "min": 0, "max": 1024}),
                    "batch_size": ("INT", {"default": 1, "min": 1, "max": 64}),
                    "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFF}),
                    "mode": (["randn", "zeros"],)},
                "optional": {
                    "model": ("MODEL",),
                    "channels": ("INT", {"default": 0, "min": 0, "max": 1024})}}

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "make"
    CATEGORY = "testing/tritonkit"

    def make(self, width, height, frames, batch_size, seed, mode, model=None, channels=0):
        ch, down = 4, 8
        if model is not None:
            lf = model.get_model_object("latent_format")
            ch = lf.latent_channels
            down = getattr(lf, "spacial_downscale_ratio", 8)
        ch = channels or ch
        shape = (batch_size, ch) + ((frames,) if frames else ()) + (height // down, width // down)
        if mode == "zeros":
            t = torch.zeros(shape)
        else:
            t = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        return ({"samples": t},)


class TritonKitTestLatentStats:
    """Reports a LATENT as JSON in the UI output ``tritonkit_latent`` (shape, finite, mean, std,
    absmax) and, with ``save``, writes it to <output>/tritonkit_test/<prefix>_<n>.safetensors
    (key "latent", float32; the JSON's "file" is relative to the output directory)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",),
                             "filename_prefix": ("STRING", {"default": "tritonkit_test"}),
                             "save": ("BOOLEAN", {"default": True})}}

    RETURN_TYPES = ()
    FUNCTION = "report"
    OUTPUT_NODE = True
    CATEGORY = "testing/tritonkit"

    def report(self, samples, filename_prefix, save):
        t = samples["samples"].detach().to("cpu", torch.float32)
        finite = bool(torch.isfinite(t).all())
        info = {"shape": list(t.shape), "finite": finite,
                "mean": float(t.mean()) if t.numel() else 0.0,
                "std": float(t.std()) if t.numel() > 1 else 0.0,
                "absmax": float(t.abs().max()) if t.numel() else 0.0,
                "nonfinite": int((~torch.isfinite(t)).sum())}
        if save:
            from safetensors.torch import save_file
            out_dir = os.path.join(folder_paths.get_output_directory(), "tritonkit_test")
            os.makedirs(out_dir, exist_ok=True)
            n = 0
            while os.path.exists(os.path.join(out_dir, f"{filename_prefix}_{n:05d}.safetensors")):
                n += 1
            name = f"{filename_prefix}_{n:05d}.safetensors"
            save_file({"latent": t.contiguous()}, os.path.join(out_dir, name))
            info["file"] = f"tritonkit_test/{name}"
        return {"ui": {"tritonkit_latent": [json.dumps(info)]}}

    @classmethod
    def IS_CHANGED(cls, **kwargs):
        return float("nan")


class TritonKitTestCountCalls:
    """MODEL → MODEL that counts diffusion-model calls (``counts[name]``) and records the
    latent-input shapes in ``shapes[name]``, through a unet function wrapper (chains any
    wrapper already set)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "name": ("STRING", {"default": "diffusion_model"})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing/tritonkit"

    def patch(self, model, name):
        m = model.clone()
        prev = m.model_options.get("model_function_wrapper")

        def wrapper(apply_model, args):
            counters()[name] += 1
            sys.modules["tritonkit_test_counters"].shapes[name].append(list(args["input"].shape))
            if prev is not None:
                return prev(apply_model, args)
            return apply_model(args["input"], args["timestep"], **args["c"])

        m.set_model_unet_function_wrapper(wrapper)
        return (m,)


class TritonKitTestAttentionProbe:
    """MODEL → MODEL that sees every attention call routed through ComfyUI's
    ``transformer_options["optimized_attention_override"]`` hook and counts it:
    ``counts[name]`` (calls), ``counts[f"{name}.head_dim.{D}"]``, and the distinct call
    signatures (q/k shapes, heads, skip_reshape, mask shape, dtype) in ``shapes[name]``. It
    chains an override already set by an earlier node (then it sees the calls first and passes
    them on), else calls the backend the model chose."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "name": ("STRING", {"default": "attention"})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing/tritonkit"

    def patch(self, model, name):
        m = model.clone()
        topts = m.model_options.setdefault("transformer_options", {})
        prev = topts.get("optimized_attention_override")

        def probe(func, *args, **kwargs):
            q, k = args[0], args[1]
            heads = args[3] if len(args) > 3 else kwargs["heads"]  # WAN passes heads= by keyword
            skip = bool(kwargs.get("skip_reshape", False))
            d = q.shape[-1] if skip else q.shape[-1] // heads
            mask = args[4] if len(args) > 4 else kwargs.get("mask")
            c = counters()
            c[name] += 1
            c[f"{name}.head_dim.{d}"] += 1
            sig = {"q": list(q.shape), "k": list(k.shape), "heads": heads, "skip_reshape": skip,
                   "mask": None if mask is None else list(mask.shape), "dtype": str(q.dtype).replace("torch.", ""),
                   "head_dim": d}
            sigs = sys.modules["tritonkit_test_counters"].shapes[name]
            if sig not in sigs:
                sigs.append(sig)
            if prev is not None:
                return prev(func, *args, **kwargs)
            return func(*args, **kwargs)

        topts["optimized_attention_override"] = probe
        return (m,)


class TritonKitTestCounters:
    """Output node: reports the shared counters (and recorded shapes) as JSON in the UI output
    ``tritonkit_counters``; ``reset`` clears them afterwards. Connect ``anything`` to a node
    that must run first (e.g. the sampler's LATENT)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"reset": ("BOOLEAN", {"default": True})},
                "optional": {"anything": ("*",)}}

    RETURN_TYPES = ()
    FUNCTION = "report"
    OUTPUT_NODE = True
    CATEGORY = "testing/tritonkit"

    @classmethod
    def VALIDATE_INPUTS(cls, input_types=None, **kwargs):
        return True

    def report(self, reset, anything=None):
        mod = sys.modules["tritonkit_test_counters"]
        out = {"counts": dict(counters()), "shapes": {k: v for k, v in mod.shapes.items()}}
        if reset:
            counters().clear()
            mod.shapes.clear()
        return {"ui": {"tritonkit_counters": [json.dumps(out)]}}

    @classmethod
    def IS_CHANGED(cls, **kwargs):
        return float("nan")


NODE_CLASS_MAPPINGS = {
    "TritonKitTestConditioning": TritonKitTestConditioning,
    "TritonKitTestLatent": TritonKitTestLatent,
    "TritonKitTestLatentStats": TritonKitTestLatentStats,
    "TritonKitTestCountCalls": TritonKitTestCountCalls,
    "TritonKitTestAttentionProbe": TritonKitTestAttentionProbe,
    "TritonKitTestCounters": TritonKitTestCounters,
}
NODE_DISPLAY_NAME_MAPPINGS = {k: k.replace("TritonKitTest", "TritonKit Test ") for k in NODE_CLASS_MAPPINGS}
