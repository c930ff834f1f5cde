"""Compile workers for a model the pack has not compiled for yet (kernels/compile_pool.py).

By default the workers start at ComfyUI's start only where Triton's cache holds none of the pack's kernels.
A second model on a cache that a first one warmed got none: on an H100 (2026-11-27, ComfyUI 0.8.0,
HunyuanVideo natively with both nodes after Flux) its kernels compiled in 15 threads beside the model's,
and its first step took 5.04-6.29 s. So a node that patches a model names it here: a fingerprint of the
model's architecture and the node's settings, and the workers start where the cache's marker does not list
it (first steps of 3.49-3.92 s then, kernels/compile_pool.py).
"""
from __future__ import annotations

import hashlib
import logging
import re

import torch

from ..kernels import compile_pool

log = logging.getLogger("TritonKit")


def _stable_repr(v) -> str:
    """``repr`` without memory addresses (an object in the configuration is the same in every process)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(v))


def fingerprint(model, what: str) -> str:
    """What decides the kernels a node compiles for ``model`` (a ComfyUI ModelPatcher), hashed: ``what``
    (the node, its mode, the GPU architecture it plans for), the diffusion model's class, its
    ``unet_config`` and its dtypes. Two checkpoints of one architecture share it; another architecture,
    configuration or setting does not."""
    base = getattr(model, "model", None)
    dm = getattr(base, "diffusion_model", None)
    cls = type(dm if dm is not None else base)
    cfg = getattr(getattr(base, "model_config", None), "unet_config", None)
    parts = [what, f"{cls.__module__}.{cls.__qualname__}",
             repr(sorted((str(k), _stable_repr(v)) for k, v in cfg.items())) if isinstance(cfg, dict) else "",
             str(getattr(base, "manual_cast_dtype", None)), str(getattr(dm, "dtype", None))]
    return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()[:16]


def start_for(model, what: str) -> bool:
    """At a node's patch: the workers for ``model``'s first run on a CUDA device, where the cache lacks its
    kernels (compile_pool.start_for_model); whether they started. Never raises: without workers the
    kernels compile in threads, as before."""
    dev = getattr(model, "load_device", None)
    try:
        if dev is None or torch.device(dev).type != "cuda":
            return False
        return compile_pool.start_for_model(fingerprint(model, what))
    except Exception as e:  # noqa: BLE001
        log.debug("TritonKit: no compile workers for this model (%s: %s)", type(e).__name__, e)
        return False
