"""End-to-end fp8 workflows through ComfyUI's own code: what a user gains from the pack.

    UNETLoader (fp8) → [TritonKitFp8Fallback] → [TritonKitAttention] → [TorchCompileModel] → KSampler

Models are random-weight instances of the real architectures (Flux-dev, HunyuanVideo T2V),
written with ``safetensors`` as fp8 e4m3fn (and, for Flux, legacy "scaled fp8" with
per-layer ``scale_weight``) by ``tests/tiny_models.py``; full-size ones are drawn on the GPU
and written to ``--models-dir`` (default a temp folder), never downloaded.

ComfyUI (the tree ``TK_COMFYUI`` names, else ``.comfyui/``: 0.3.75 or 0.8.0) runs **in-process**
(``bench/_comfy_inproc.py`` says why): its node classes are called directly with the inputs the executor would give them,
conditioning tensors are fed directly (no text encoders, no VAE) and the latent is zeros, as
from ``EmptyLatentImage``. One forward per step (cfg 1, as Flux-dev/HunyuanVideo are run).

Per run it measures:

* s/step: median over steps 2..N, robust to a single slow step (the mean is in the JSON as
  ``s_per_step_mean``). The first step is excluded for every run and reported on its own as
  ``first step``; for compiled runs ``compile`` = first step − s/step, the time a user waits for
  Inductor. A compiled run whose first call ran eagerly to calibrate compiles in
  step 2: its s/step starts after the last step that compiled (``timed_from_step``). Steps are timed with an ``APPLY_MODEL`` wrapper that synchronises the
  GPU around each diffusion-model call.
* peak GPU memory (``torch.cuda.max_memory_allocated`` over the whole KSampler call, weights
  included).
* the final latent against the same model's ``default`` eager run: relative error
  ``‖x − ref‖ / ‖ref‖`` and cosine similarity.
* for compiled runs: dynamo frames compiled, graph breaks, frames compiled after the first
  step (a recompile per step shows up here), and how many Triton kernels Inductor generated
  that use the ``fp8e4nv`` type (what official Triton refuses below sm89).
* the pack's own counters (attention calls served / fallen back, fp8 kernel calls) where the
  node modules expose them.

Configurations (``--plan``, comma-separated ``MODEL:CONFIG[:compiled][@ARCH]``):
``MODEL`` ∈ flux, flux-scaled, flux-scaledin (scaled with input scales), hunyuan, hunyuan-scaled, wan, wan-scaled
(WAN 2.1 T2V); ``CONFIG`` ∈ default, fp8 (Fallback
``auto``), fp8-cast (``cast-only``), attn-exact, attn-8bit, attn-auto, both (fp8 ``auto`` +
attention ``auto``, the nodes' defaults), both-exact, both-8bit, both-cast (fp8 ``cast-only``
+ attention ``auto``), default-twin (ComfyUI's default once more: the floor of a ratio); ``@86`` simulates an RTX 3090 on the GPU at hand: the pack runs with
``TRITONKIT_FORCE_ARCH=86`` and, because torch's SDPA prefers its cuDNN backend only on
sm90/sm100 (``check_prefer_cudnn_attention`` in torch's sdp_utils.cpp) and FlashAttention-2
everywhere else, the cuDNN SDPA backend is switched off for the run, so ComfyUI's own
attention is what it is on that card. ``default@86`` is therefore a run of its own, and the
@86 rows are compared with it. ComfyUI's fp8 path is the same below and above sm89 in eager;
compiled, Inductor's fp8e4nv kernels (counted per run) are what official Triton refuses on a
real sm86, so ``default:compiled@86`` measures a run that card cannot make: for such runs one
fp8e4nv kernel is also compiled for that arch (to the cubin) and the outcome (Triton's error) is
recorded, not raised.

On ComfyUI 0.8+ the scaled-fp8 models load as comfy-kitchen ``QuantizedTensor`` layers, whose path
ComfyUI picks at load from ``comfy.model_management.supports_fp8_compute``: fp8 matmul on sm89+,
full precision (dequantize every forward) below. ``@86`` forces that answer to False while the
model loads and runs, as on an RTX 30xx, so a scaled model gets a separate load for its @86 runs.
Each fp8-node run records the node's text, the fp8 layers patched (QuantizedTensor ones
included), those the node left on ComfyUI's path and why. Runs are made in
the order given; with ``--budget-s`` a run that would not finish in the time left is skipped
(and listed).

``MODEL:CONFIG:regional`` runs the same nodes, then the pack's **Triton Compile Model** (regional
compilation: each block class compiled once) instead of ``TorchCompileModel``; its ``compile`` is the
cold compile when the cache folders start empty (``--compile-cache fresh``: no ``_cold_compile`` for
these runs, the caches are the point), then three steps at the preset's second size (Flux 768²,
HunyuanVideo 49 frames: ``second_res.compile_s``), and with ``--restart`` the same run again in a new
process on the same caches (``warm_restart.compile_s``). Each regional row is also compared with its
twins: s/step against the same configuration under ``TorchCompileModel`` and the final latent against
the same configuration eager. Put the regional runs first in a plan: a ``TorchCompileModel`` run
before them fills Triton's kernel cache, and part of a later "cold" compile would come from it.

Presets: ``tiny`` (CPU, CI: 1+1-block Flux at 64×64 and 1+1-block HunyuanVideo hidden 256),
``flux-1024`` (Flux-dev 12B at 1024×1024, 512 text tokens), ``hunyuan`` (HunyuanVideo 13B at
544×960, 33 frames → 9×68×120 latent, 18,360 image tokens + 256 text tokens), ``wan`` (WAN 2.1 T2V 14B at
832×480, 81 frames → 21×60×104 latent, 32,760 video tokens, 512 text tokens), ``gpu`` (Flux and HunyuanVideo,
Flux first).

Reproducible figures: ``--rounds N`` runs the plan N times interleaved (per model, A B C C B A A B C …,
so a drift of the GPU's clocks or temperature hits every configuration alike, and none always runs
in the same place of a round); each run is
compared with the default run of the same round, and the summary gives per configuration the
median s/step and its min–max, and the median and min–max of the per-round ratio against the
default (a configuration is "never slower" only where the smallest ratio is ≥ 1). Every run
records what the pack's calibration chose and timed during it (``calibration``; a run that
finds every choice stored times nothing), and ``--calibration-dir`` says where the choices are
kept (a second process with the same folder must time nothing).

Output: ``--out DIR`` gets ``workflow.json`` and ``workflow.md`` (rewritten after every run,
so a run stopped early still leaves what it measured).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import gc
import glob
import json
import logging
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

import _comfy_inproc as inproc  # noqa: E402
import compile_trace  # noqa: E402
import tiny_models as tm  # noqa: E402

FP8_NODE = "TritonKitFp8Fallback"
ATTN_NODE = "TritonKitAttention"
COMPILE_NODE = "TritonKitCompileModel"
ARCH_ENV = "TRITONKIT_FORCE_ARCH"

# config name → (fp8 mode or None, attention mode or None)
CONFIGS = {
    "default": (None, None),
    "fp8": ("auto", None),
    "fp8-cast": ("cast-only", None),
    "attn-exact": (None, "exact"),
    "attn-8bit": (None, "8-bit"),
    "attn-auto": (None, "auto"),
    "both": ("auto", "auto"),
    "both-exact": ("auto", "exact"),
    "both-8bit": ("auto", "8-bit"),
    "both-cast": ("cast-only", "auto"),
    # ComfyUI's default again, as a configuration of its own: its ratio to ``default`` in the same
    # round is the bench's floor, what a run's place in the round and the process alone make of the
    # same workflow
    "default-twin": (None, None),
}

# model key → (architecture config name, scaled fp8, UNETLoader weight_dtype). The scaled-fp8
# file is loaded with fp8_e4m3fn too: "default" gives the same fp8 model on an sm89+ GPU or a
# 24 GB card, but would upcast the tiny model on CPU.
MODELS = {
    "flux": ("flux", False, "fp8_e4m3fn"),
    "flux-scaled": ("flux", True, "fp8_e4m3fn"),
    # scaled fp8 with input scales (a 0-element marker): on ComfyUI 0.8+ its layers are not marked
    # full-precision, so on sm89+ ComfyUI runs them on comfy-kitchen's fp8 matmul, and @86 (no fp8
    # compute) on the full-precision path: the case where the @86 simulation changes ComfyUI's choice
    "flux-scaledin": ("flux", "scale_input", "fp8_e4m3fn"),
    "hunyuan": ("hunyuan", False, "fp8_e4m3fn"),
    "hunyuan-scaled": ("hunyuan", True, "fp8_e4m3fn"),
    "wan": ("wan", False, "fp8_e4m3fn"),
    "wan-scaled": ("wan", True, "fp8_e4m3fn"),
}

PRESETS = {
    "tiny": dict(device="cpu", steps=2,  # tiny Flux is 0.56 B parameters (hidden 3072 is forced): ~20 s/step on 2 cores
                 flux=dict(config=tm.FLUX_TINY_CONFIG, width=64, height=64, frames=0, tokens=8, guidance=3.5,
                           second=dict(width=48, height=48)),
                 hunyuan=dict(config=tm.HUNYUAN_VIDEO_TINY_CONFIG, width=64, height=64, frames=5, tokens=8,
                              guidance=6.0, second=dict(frames=9)),
                 wan=dict(config=tm.WAN_TINY_CONFIG, width=64, height=64, frames=5, tokens=8, guidance=5.0,
                          second=dict(frames=9)),
                 # the CI plan (tests/test_workflow_bench.py): on CPU the fused linear runs through the
                 # Triton interpreter at ~2 s a launch, so CI patches with cast-only there
                 plan="hunyuan:default,hunyuan:attn-exact,hunyuan:attn-8bit,hunyuan:both-cast,"
                      "hunyuan:both-cast:compiled,hunyuan-scaled:default,hunyuan-scaled:fp8-cast"),
    "flux-1024": dict(device="cuda", steps=6,
                      flux=dict(config=tm.FLUX_DEV_CONFIG, width=1024, height=1024, frames=0, tokens=512,
                                guidance=3.5, second=dict(width=768, height=768)),
                      plan="flux:default,flux:both,flux:default:compiled,flux:both:compiled,flux:both@86,"
                           "flux:fp8,flux:attn-exact,flux:attn-8bit,flux:both:compiled@86"),
    "hunyuan": dict(device="cuda", steps=4,
                    hunyuan=dict(config=tm.HUNYUAN_VIDEO_CONFIG, width=960, height=544, frames=33, tokens=256,
                                 guidance=6.0, steps=4, second=dict(frames=49)),
                    plan="hunyuan:default,hunyuan:both,hunyuan:both@86,hunyuan:default:compiled,"
                         "hunyuan:both:compiled"),
    # WAN 2.1 T2V 14B at 832×480, 81 frames (21 latent frames: 32 760 video tokens, the attention bench's
    # wan14b shape), 512 text tokens (umT5's padded length); cfg 1 here (WAN runs cfg 5-6: twice the calls)
    "wan": dict(device="cuda", steps=4,
                wan=dict(config=tm.WAN21_14B_CONFIG, width=832, height=480, frames=81, tokens=512, guidance=5.0,
                         steps=4, second=dict(frames=49)),
                plan="wan:default,wan:both,wan:attn-8bit,wan:both@86"),
}
# The GPU plans, in order of priority (a run that does not fit --budget-s is skipped and listed).
# Each model: the five configurations the issue names (default, fp8, attention exact / 8-bit, both)
# eager, natively and as on an RTX 3090 (@86), then compiled. The eager @86 pack runs are cheap; a
# compiled run costs its first step (Inductor, ~75-90 s at this size).
_FLUX_RUNS = ("flux:default,flux:fp8,flux:attn-exact,flux:attn-8bit,flux:both,"
              "flux:default@86,flux:fp8@86,flux:attn-exact@86,flux:attn-8bit@86,flux:both@86,"
              "flux:default:compiled,flux:both:compiled@86,flux:fp8:compiled,flux:both:compiled,"
              "flux:attn-8bit:compiled,flux:attn-exact:compiled")
_HUNYUAN_RUNS = ("hunyuan:default,hunyuan:fp8,hunyuan:attn-exact,hunyuan:attn-8bit,hunyuan:both,"
                 "hunyuan:default@86,hunyuan:fp8@86,hunyuan:attn-exact@86,hunyuan:attn-8bit@86,hunyuan:both@86,"
                 "hunyuan:default:compiled,hunyuan:both:compiled@86,hunyuan:both:compiled,hunyuan:fp8:compiled")
# Scaled-fp8 files (QuantizedTensor layers on ComfyUI 0.8+): native runs first, then the @86 ones
# (their own load: ComfyUI picks the full-precision path at load below sm89).
_SCALED_RUNS = ("flux-scaled:default,flux-scaled:fp8,flux-scaled:both,flux-scaled:default:compiled,"
                "flux-scaled:both:compiled,flux-scaled:default@86,flux-scaled:fp8@86,flux-scaled:both@86,"
                "flux-scaled:default:compiled@86,flux-scaled:fp8:compiled@86,flux-scaled:both:compiled@86")
_HUNYUAN_SCALED_RUNS = _SCALED_RUNS.replace("flux-scaled", "hunyuan-scaled")
PRESETS["gpu-flux"] = dict(PRESETS["flux-1024"], plan=_FLUX_RUNS)
PRESETS["gpu-hunyuan"] = dict(PRESETS["hunyuan"], plan=_HUNYUAN_RUNS)
PRESETS["gpu-scaled"] = dict(PRESETS["flux-1024"], plan=_SCALED_RUNS)
PRESETS["gpu-hunyuan-scaled"] = dict(PRESETS["hunyuan"], plan=_HUNYUAN_SCALED_RUNS)
PRESETS["gpu"] = dict(device="cuda", steps=6, flux=PRESETS["flux-1024"]["flux"],
                      hunyuan=dict(PRESETS["hunyuan"]["hunyuan"]),
                      plan=",".join((_FLUX_RUNS, _HUNYUAN_RUNS, _SCALED_RUNS)))


@dataclasses.dataclass
class Run:
    model: str
    config: str
    compiled: bool = False
    arch: str = "native"
    tag: str = ""
    round: int = 1
    regional: bool = False  # through the pack's Triton Compile Model instead of TorchCompileModel

    @property
    def base_label(self) -> str:
        """The configuration, the same in every round."""
        return f"{self.model}:{self.config}{':regional' if self.regional else ''}" + \
               f"{':compiled' if self.compiled else ''}" + ("" if self.arch == "native" else f"@{self.arch}") + self.tag

    @property
    def label(self) -> str:
        return self.base_label + (f"#r{self.round}" if self.round > 1 else "")

    @classmethod
    def parse(cls, spec: str) -> "Run":
        spec = spec.strip()
        arch = "native"
        if "@" in spec:
            spec, arch = spec.split("@", 1)
        parts = spec.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("compiled", "regional")):
            raise ValueError(f"bad run spec {spec!r}: MODEL:CONFIG[:compiled|:regional][@ARCH]")
        if parts[0] not in MODELS or parts[1] not in CONFIGS:
            raise ValueError(f"bad run spec {spec!r}: models {list(MODELS)}, configs {list(CONFIGS)}")
        mode = parts[2] if len(parts) == 3 else None
        return cls(parts[0], parts[1], mode == "compiled", arch, regional=mode == "regional")


def _pack_arch_module():
    """The pack's nodes/arch.py (no relative imports, no ComfyUI), for its CUDNN_SDPA_ARCHS."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_tritonkit_arch", REPO / "nodes" / "arch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CUDNN_SDPA_ARCHS = tuple(str(a) for a in _pack_arch_module().CUDNN_SDPA_ARCHS)


def sdpa_backend(arch: str, device: str) -> str | None:
    """What ComfyUI's PyTorch attention runs on for a run at ``arch`` ("native" or "86"...)."""
    if device != "cuda":
        return None
    if arch == "native":
        p = torch.cuda.get_device_properties(0)
        arch = f"{p.major}{p.minor}"
    return "cuDNN" if arch in CUDNN_SDPA_ARCHS else "flash"


@contextlib.contextmanager
def _cold_compile(compiled: bool, own_cache: str | None = None):
    """No FX-graph / AOTAutograd cache hits for a compiled run: every run pays (and reports) the
    compile a user's first run pays, and a run with another SDPA backend setting (the @86
    simulation) cannot reuse a graph traced with cuDNN attention (a cache hit did, before).

    ``own_cache`` (``--warm-rounds``): Inductor's caches in that folder instead, one per model,
    configuration and arch, so the first round of a configuration compiles cold and its later
    rounds load the same graphs from its own folder, never another configuration's (s/step is
    the same code either way; the cold compile is reported from the first round)."""
    if not compiled:
        yield
        return
    if own_cache is not None:
        try:
            from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
        except ImportError:  # an older torch: every round cold
            temporary_cache_dir = None
        if temporary_cache_dir is not None:
            with temporary_cache_dir(own_cache):
                yield
            return
    import torch._functorch.config as fcfg
    import torch._inductor.config as icfg
    with icfg.patch(fx_graph_cache=False), fcfg.patch(enable_autograd_cache=False):
        yield


@contextlib.contextmanager
def _sdpa_as_on(arch: str, device: str):
    """SDPA's backend choice as torch makes it on a GPU of ``arch``: cuDNN off below sm90."""
    if device != "cuda" or arch == "native" or arch in CUDNN_SDPA_ARCHS:
        yield
        return
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


# --------------------------------------------------------------------------- helpers
def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def _env(**kv):
    old = {k: os.environ.get(k) for k in kv}
    for k, v in kv.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def compare(x: torch.Tensor, ref: torch.Tensor) -> dict:
    x, ref = x.double().flatten(), ref.double().flatten()
    finite = bool(torch.isfinite(x).all())
    rel = float((x - ref).norm() / ref.norm().clamp_min(1e-30))
    cos = float(torch.nn.functional.cosine_similarity(x, ref, dim=0))
    return {"rel_err": rel, "cosine": cos, "finite": finite}


def _counter_snapshot(mod) -> dict:
    """Flattens the numeric counters a node module exposes (module-level dicts/Counters whose
    name mentions 'count' or 'stat', or a ``counters()``/``stats()`` function) into {name: n}."""
    out = {}
    if mod is None:
        return out
    if callable(getattr(mod, "stats", None)):  # the nodes' documented counters
        try:
            val = mod.stats()
            if isinstance(val, dict):
                return _flatten(val)
        except Exception:
            pass
    for attr in dir(mod):
        low = attr.lower()
        if not any(k in low for k in ("count", "stat")) or attr.startswith("__"):
            continue
        try:
            val = getattr(mod, attr)
            if callable(val) and not isinstance(val, dict):
                if attr.startswith("_") or getattr(val, "__module__", None) != mod.__name__:
                    continue
                try:
                    val = val()
                except TypeError:
                    continue
            if isinstance(val, dict):
                for k, v in _flatten(val).items():
                    out[f"{attr}.{k}"] = v
        except Exception:
            continue
    return out


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = v
    return out


def _delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def _fp8_storage(w) -> bool:
    """A weight stored in fp8: a plain fp8 tensor, or (ComfyUI 0.8+) a QuantizedTensor with fp8 storage."""
    if w is None:
        return False
    q = getattr(w, "_qdata", None)
    return (q.dtype if isinstance(q, torch.Tensor) else w.dtype) in FP8_DTYPES


def _quantized_layers(model) -> int:
    """ComfyUI 0.8+ QuantizedTensor layers (fp8 storage) of the diffusion model."""
    dm = model.get_model_object("diffusion_model")
    return sum(1 for _, mod in dm.named_modules()
               if isinstance(getattr(getattr(mod, "weight", None), "_qdata", None), torch.Tensor)
               and mod.weight._qdata.dtype in FP8_DTYPES)


def _fp8_op_kinds(model) -> dict:
    """ComfyUI ops of the diffusion model whose weight is stored in fp8 (QuantizedTensor ones included), counted
    by class name (ComfyUI names each op after the torch layer it stands for: Linear, LayerNorm, RMSNorm, ...)."""
    import comfy.ops
    dm = model.get_model_object("diffusion_model")
    return dict(collections.Counter(type(mod).__name__ for _, mod in dm.named_modules()
                                    if isinstance(mod, comfy.ops.CastWeightBiasOp)
                                    and _fp8_storage(getattr(mod, "weight", None))))


def _left_on_torch(text: str) -> dict:
    """The fp8 node's "left on torch: N (reason)" lines as {reason: N}."""
    import re
    return {m.group(2): int(m.group(1)) for m in re.finditer(r"left on torch: (\d+) \((.*?)\)(?::|$)", text, re.M)}


def _fp8_launches(mod) -> dict:
    try:
        return dict(mod.STATS._launch_counter())
    except Exception:  # noqa: BLE001
        return {}


def _fp8_run_stats(mod, fp8_layers: int, patched: int) -> dict:
    """The fp8 node's per-run accounting (``STATS``: layers that ran through Triton, kernel
    launches, torch fallbacks by reason), reset by its OUTER_SAMPLE wrapper at each run."""
    out = {"fp8_layers": fp8_layers, "layers_patched": patched}
    st = getattr(mod, "STATS", None) if mod is not None else None
    if st is None:
        return out
    try:
        layers = dict(st.layers)
        out["layers_through_triton"] = len(layers)
        for path in set(layers.values()):
            out[f"layers_{path}"] = sum(1 for v in layers.values() if v == path)
        for reason, n in st.fallbacks.items():
            out[f"fallback: {reason}"] = n
    except Exception as e:  # noqa: BLE001
        out["stats_error"] = f"{type(e).__name__}: {e}"
    return out


def _calibration_module(attn_mod):
    """The pack's kernels/calibration.py as the nodes loaded it (None without the pack)."""
    return getattr(getattr(attn_mod, "calib", None), "C", None)


def _compile_workers_ready(attn_mod):
    """How many compile workers (kernels/compile_pool.py) had started when the sampler began; None when
    they are off."""
    C = _calibration_module(attn_mod)
    pool = sys.modules.get(C.__name__.rsplit(".", 1)[0] + ".compile_pool") if C is not None else None
    p = getattr(pool, "_pool", None)
    return None if p is None else p._alive


def _calibration_state(attn_mod) -> dict:
    C = _calibration_module(attn_mod)
    if C is None:
        return {}
    snap = C.snapshot()
    pkg = C.__name__.rsplit(".", 1)[0]
    pool = sys.modules.get(pkg + ".compile_pool")  # kernels/compile_pool.py, once loaded
    lau = sys.modules.get(pkg + ".launchers")      # kernels/launchers.py, once loaded
    counters = {**dict(C.COUNTERS), **(dict(pool.COUNTERS) if pool is not None else {}),
                **(dict(lau.COUNTERS) if lau is not None else {})}
    return {"counters": counters, "dir": snap["dir"], "timing": snap["timing"],
            "entries": {k: v for st in snap["stores"] for k, v in st["entries"].items()
                        if "choice" in v or "config" in v}}


_PREPARE_CALLS: list = []  # TK_BENCH_TRACE_COMPILES: [perf_counter, compiles started, first candidate] a call


def _trace_prepare(attn_mod) -> None:
    """Records when the pack's kernels/prepare.py started background compiles (once a process)."""
    C = _calibration_module(attn_mod)
    mod = sys.modules.get(C.__name__.rsplit(".", 1)[0] + ".prepare") if C is not None else None
    if mod is None or getattr(mod.prepare, "_traced", False):
        return
    orig = mod.prepare

    def prepare(fns):
        out = orig(fns)
        _PREPARE_CALLS.append([time.perf_counter(), len(out), str(next(iter(fns), ""))[:40]])
        return out
    prepare._traced = True
    mod.prepare = prepare


def _calibration_counter(attn_mod):
    """A function giving the calibration's work so far (see StepTimer), or None without the pack."""
    C = _calibration_module(attn_mod)
    if C is None:
        return None
    return lambda: sum(C.COUNTERS.get(k, 0) for k in ("calibrations", "autotunes", "deferred_calls"))


def _calibration_delta(before: dict, after: dict) -> dict:
    """What the calibration measured during one run: shape classes timed, candidate runs, and the
    choices it made (with their timings); every choice in the store is in the JSON's meta."""
    if not after:
        return {}
    c0, c1 = before.get("counters", {}), after["counters"]
    new = {k: v for k, v in after["entries"].items() if before.get("entries", {}).get(k) != v}
    out = {k: c1.get(k, 0) - c0.get(k, 0) for k in ("calibrations", "timed_runs", "autotunes", "prepared",
                                                      "deferred_calls", "stalled_timings", "warmed",
                                                      "worker_compiles", "thread_compiles", "worker_starts",
                                                      "cache_hits", "playoffs", "playoffs_not_run",
                                                      "playoffs_in_model", "playoffs_resumed", "launchers_built")}
    out.update({k: round(c1[k] - c0.get(k, 0.0), 3) for k in ("calibration_s", "autotune_s", "launcher_s")
                if k in c1})
    return {**out, "timing": after["timing"], "dir": after["dir"],
            "new_choices": {k: {"choice": v["choice"], "timings_ms": v.get("timings_ms", {}), "took_s": v.get("took_s"),
                                **({"not_timed": v["not_timed"]} if v.get("not_timed") else {})}
                            for k, v in new.items() if "choice" in v},
            "rates": {k: v for k, v in new.items() if k.startswith("rates|")},
            # block-config picks of the kernels' tuner, with every candidate's median (kernels/tuning.py)
            "new_configs": {k: {"config": v["config"], "candidates_ms": v.get("candidates_ms", {}),
                                **{f: v[f] for f in ("playoff", "playoff_sustained_ms", "playoff_in_model_ms",
                                                     "tune_s", "compile_wait_s") if f in v}}
                            for k, v in new.items() if "config" in v}}


def _compile_phases(top: int = 12) -> dict:
    """Seconds spent so far in this process in torch's timed compile phases (dynamo tracing,
    AOTAutograd, Inductor, cache loads: ``torch._dynamo.utils.compile_times``), the largest first:
    where a (warm) first step spends its time."""
    try:
        from torch._dynamo.utils import compile_times
        headers, values = compile_times(repr="csv", aggregate=True)
        phases = {}
        for h, v in zip(headers, values):
            try:
                phases[h] = round(float(v), 3)
            except (TypeError, ValueError):
                continue
        return dict(sorted(phases.items(), key=lambda kv: -kv[1])[:top])
    except Exception as e:  # noqa: BLE001 - an older/newer torch: the bench still runs
        return {"unavailable": f"{type(e).__name__}: {e}"}


# --compile-backend census: Dynamo traces as under TorchCompileModel, every graph's operations are
# counted (``graph_census`` in the run's record) and the graph then runs eagerly. Two configurations'
# censuses say whether the pack changed the graph Inductor would get, without Inductor's minutes.
CENSUS_BACKEND = "tritonkit_census"
_CENSUS: list = []


def census_backend(gm, example_inputs):
    ops = collections.Counter()
    for n in gm.graph.nodes:
        if n.op in ("call_function", "call_method", "call_module"):
            ops[f"{n.op}:{getattr(n.target, '__name__', None) or n.target}"] += 1
    _CENSUS.append({"nodes": len(gm.graph.nodes), "inputs": len(example_inputs), "ops": dict(sorted(ops.items()))})
    return gm.forward


def _register_census_backend() -> None:
    from torch._dynamo import list_backends, register_backend
    if CENSUS_BACKEND not in list_backends(exclude_tags=()):
        register_backend(name=CENSUS_BACKEND)(census_backend)


def _dynamo_counters() -> dict:
    from torch._dynamo.utils import counters
    return {"frames": counters["frames"].get("total", 0), "frames_ok": counters["frames"].get("ok", 0),
            "graph_breaks": sum(counters["graph_break"].values()),
            "graph_break_reasons": sorted(counters["graph_break"].keys())[:5],
            "unique_graphs": counters["stats"].get("unique_graphs", 0)}


def _inductor_dir() -> str | None:
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        return cache_dir()
    except Exception:
        return os.environ.get("TORCHINDUCTOR_CACHE_DIR")


def _inductor_files_since(d: str, since: float):
    """(path, text) of each .py file under Inductor's cache dir ``d`` written since ``since``, in
    path order; files that cannot be read are skipped."""
    for path in sorted(glob.glob(os.path.join(d, "**", "*.py"), recursive=True)):
        try:
            if os.path.getmtime(path) < since:
                continue
            text = open(path, encoding="utf-8", errors="replace").read()
        except OSError:
            continue
        yield path, text


def _fp8e4nv_kernels(since: float, d: str | None = None) -> dict:
    """Triton kernels Inductor wrote since ``since`` (in ``d``, default its cache folder) and how many
    use the fp8e4nv type."""
    d = d or _inductor_dir()
    if not d or not os.path.isdir(d):
        return {"triton_kernels": 0, "fp8e4nv_kernels": 0}
    wrapped = [0, 0]   # kernels inside Inductor's output code (async_compile.triton('name', '''src'''))
    loose = [0, 0]     # kernel source files on their own
    for _, text in _inductor_files_since(d, since):
        if "async_compile.triton(" in text:
            for chunk in text.split("async_compile.triton(")[1:]:
                wrapped[0] += 1
                wrapped[1] += "fp8e4nv" in chunk
        elif "@triton.jit" in text:
            loose[0] += 1
            loose[1] += "fp8e4nv" in text
    n, bad = wrapped if wrapped[0] else loose
    return {"triton_kernels": n, "fp8e4nv_kernels": bad}


def _compile_fp8e4nv_kernel_for(since: float, cc: int, d: str | None = None) -> dict:
    """Compiles (for sm``cc``, to the cubin) the first Inductor kernel written since ``since``
    that uses fp8e4nv: what a real GPU of that arch would do with this compiled graph. Official
    Triton refuses fp8e4nv below sm89; the error is recorded, never raised."""
    import re
    d = d or _inductor_dir()
    if not d or not os.path.isdir(d):
        return {"status": "no Inductor cache dir"}
    sources = []  # (name, kernel source): kernel files, and kernels inside Inductor's output code
    wrapped = re.compile(r"async_compile\.triton\('([^']+)', '{3}(.*?)'{3}", re.S)
    for path, text in _inductor_files_since(d, since):
        if "async_compile.triton(" in text:
            sources += [(m.group(1), m.group(2)) for m in wrapped.finditer(text)]
        elif "@triton.jit" in text:
            sources.append((os.path.basename(path), text))
    tmp = None
    for name, text in sources:
        if "fp8e4nv" not in text:
            continue
        tmp = tmp or tempfile.mkdtemp(prefix="tk_bench_kernel_")
        path = os.path.join(tmp, f"{re.sub(r'[^A-Za-z0-9_]', '_', name)}.py")
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            import types
            sys.path.insert(0, str(REPO / "tests"))
            from compile_utils import compile_for
            mod = types.ModuleType("tk_bench_kernel")
            mod.__file__ = path
            exec(compile(text, path, "exec"), mod.__dict__)
            kern = next(v for v in mod.__dict__.values() if hasattr(v, "triton_meta") and hasattr(v, "fn"))
            meta = kern.triton_meta
            consts = dict(meta.get("constants", {}))
            consts.update(kern.configs[0].kwargs)
            sig = dict(meta["signature"])
            for k in consts:
                sig[k] = "constexpr"
            compile_for(kern.fn, sig, consts, cc)
            return {"status": f"compiled for sm{cc}", "kernel": name}
        except Exception as e:  # noqa: BLE001 - the point: record why this arch cannot run it
            return {"status": "error", "kernel": name, "error": f"{type(e).__name__}: {str(e)[:600]}"}
    return {"status": "no fp8e4nv kernel"}


@contextlib.contextmanager
def _fp8_compute_as_on(arch: str):
    """ComfyUI's own fp8-compute answer as on a GPU of ``arch``: below sm89
    ``comfy.model_management.supports_fp8_compute`` is False (ComfyUI 0.8+'s pick_operations then
    disables the fp8 formats of QuantizedTensor layers: the full-precision path)."""
    if arch == "native" or int(arch) >= 89:
        yield
        return
    import comfy.model_management as mm
    was = mm.supports_fp8_compute
    mm.supports_fp8_compute = lambda *a, **k: False
    try:
        yield
    finally:
        mm.supports_fp8_compute = was


def _fp8_compute_key(arch: str) -> str:
    return "native" if arch == "native" or int(arch) >= 89 else "no-fp8-compute"


SIM_MMA = ("auto", "sync", "wgmma")


def sim_mma(runs, choice: str, environ) -> str:
    """How Triton compiles ``tl.dot`` for this process's runs, set in ``environ`` before the first compile:
    ``sync`` (DISABLE_MMA_V3=1: ``mma.sync``, the only MMA an RTX 30xx / 40xx's Triton emits) for a plan whose
    runs are all simulated below sm90, ``wgmma`` (Hopper's, as before the forty-ninth session) otherwise; ``auto``
    picks sync where the plan allows it. One setting a process: Triton's in-memory kernels are not keyed on it
    (nodes/arch.py). Returns what the run records."""
    if choice not in SIM_MMA:
        raise ValueError(f"--sim-mma must be one of {SIM_MMA}, got {choice!r}")
    sims = sorted({r.arch for r in runs if r.arch != "native" and int(r.arch) < 90})
    other = sorted({r.label for r in runs if r.arch == "native" or int(r.arch) >= 90})
    if choice == "sync" and other:
        raise SystemExit(f"--sim-mma sync: the plan also runs {', '.join(other)} on this GPU's own instructions, "
                         "and one process compiles with or without wgmma; run the simulated configurations "
                         "(@86, @89) in a plan of their own")
    if choice == "wgmma" or not sims or other:
        environ.pop("DISABLE_MMA_V3", None)
        why = "as chosen" if choice == "wgmma" else ("no simulated run" if not sims else
                                                   "the plan mixes native and simulated runs")
        return f"wgmma where the GPU has it ({why})"
    environ["DISABLE_MMA_V3"] = "1"
    return f"mma.sync for the simulated sm{'/'.join(sims)} runs (DISABLE_MMA_V3=1)"


def versions(device: str) -> dict:
    v = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton
        v["triton"] = triton.__version__
    except Exception as e:  # pragma: no cover
        v["triton"] = f"unavailable ({e})"
    try:
        sys.path.insert(0, str(inproc.comfyui_dir()))
        import comfyui_version
        v["comfyui"] = comfyui_version.__version__
    except Exception:
        v["comfyui"] = "?"
    v["triton_mma_v3"] = "off (DISABLE_MMA_V3)" if os.environ.get("DISABLE_MMA_V3", "").lower() in (
        "1", "true", "on") else "on"
    if device == "cuda" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        v["gpu"] = p.name
        v["sm"] = f"{p.major}{p.minor}"
        v["gpu_mem_gib"] = round(p.total_memory / 2**30, 1)
        try:
            import subprocess
            v["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                         capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception:
            pass
    else:
        v["cpu"] = platform.processor() or platform.machine()
        v["cpu_count"] = os.cpu_count()
    return v


# --------------------------------------------------------------------------- models and inputs
def _depth(cfg: dict) -> int:
    """A config's block count (Flux / HunyuanVideo: double-stream blocks; WAN: blocks)."""
    return cfg.get("depth", cfg.get("num_layers", 0))


def model_name(key: str, spec: dict) -> str:
    arch, scaled, _ = MODELS[key]
    size = "tiny" if _depth(spec["config"]) <= 2 else "full"
    kind = {True: "scaledfp8", "scale_input": "scaledinfp8"}.get(scaled, "fp8e4m3fn")
    return f"tk_bench_{arch}_{size}_{kind}.safetensors"


def load_estimate_s(device: str, spec: dict, written: bool) -> float:
    """What loading a model (writing it first unless ``written``) and its first two runs may cost,
    for --budget-s: a full-size model on the GPU takes 11-15 s to write and seconds to load (an
    interleaved plan loads a scaled-fp8 model again whenever the arch changes: @86 and native load
    differently). A whole cold HunyuanVideo process @86 with the file to write, 7 steps, took 36 s on
    an H100 (2026-11-26); at 120 s this refused two 60-s calls their only run."""
    if device != "cuda" or _depth(spec["config"]) <= 2:
        return 5.0
    return 20.0 if written else 60.0


def model_file(models_dir: Path, key: str, spec: dict, gen_device: str) -> tuple[str, dict, float]:
    """Writes (once) the random fp8 model for ``key`` and returns (file name, description,
    seconds spent writing)."""
    _, scaled, _ = MODELS[key]
    cfg = spec["config"]
    name = model_name(key, spec)
    path = models_dir / name
    t0 = time.perf_counter()
    if not path.exists():
        tm.write_model(path, cfg, dtype=torch.float8_e4m3fn, scaled_fp8=scaled, seed=0, device=gen_device)
    desc = tm.describe(cfg, torch.float8_e4m3fn, scaled)
    return name, desc, time.perf_counter() - t0


def conditioning(desc: dict, spec: dict, seed: int):
    g = torch.Generator().manual_seed(seed)
    cond = torch.randn((1, spec["tokens"], desc["context_dim"]), generator=g)
    extra = {"guidance": spec["guidance"]}
    if desc.get("vec_dim"):
        extra["pooled_output"] = torch.randn((1, desc["vec_dim"]), generator=g)
    return [[cond, extra]]


def empty_latent(model, spec: dict) -> dict:
    lf = model.get_model_object("latent_format")
    down = getattr(lf, "spacial_downscale_ratio", 8)
    h, w = spec["height"] // down, spec["width"] // down
    if spec.get("frames"):
        t = (spec["frames"] - 1) // 4 + 1  # HunyuanVideo's and WAN's VAEs: 4x temporal compression
        return {"samples": torch.zeros((1, lf.latent_channels, t, h, w))}
    return {"samples": torch.zeros((1, lf.latent_channels, h, w))}


def image_tokens(latent: dict) -> int:
    s = latent["samples"].shape
    return math.prod(s[2:-2]) * (s[-2] // 2) * (s[-1] // 2)


def timed_steps(steps_t: list, frame_marks: list | None, calib_marks: list) -> tuple:
    """(index of the first timed step, indices of the steps that calibrated, seconds the calibration
    added on top of its steps or None).

    Step 1 is never timed. A compiled run (``frame_marks``: Dynamo's frame count at each step's start,
    then at the end) is timed from the step after the last one in which Dynamo compiled: the pack's
    calibration runs a compiled model's first call eagerly when a shape class is not measured yet,
    so Inductor then compiles in step 2. An eager run (``calib_marks``: the calibration's work count at
    each step's start, then at the end) is timed from the step after the last one that calibrated:
    a new shape class is timed at a later call than its first while its candidates compile in the
    background (kernels/prepare.py), and until then it runs its default path."""
    n = len(steps_t)
    first_timed = 1
    if frame_marks is not None:
        compiling = [i for i in range(n) if frame_marks[i + 1] > frame_marks[i]]
        if compiling and compiling[-1] + 1 < n:
            first_timed = max(1, compiling[-1] + 1)
    calibrating = [i for i in range(n) if len(calib_marks) > i + 1 and calib_marks[i + 1] > calib_marks[i]]
    extra = None
    if frame_marks is None and calibrating and calibrating[-1] + 1 < n:
        first_timed = max(first_timed, calibrating[-1] + 1)
        extra = round(sum(steps_t[:first_timed]) - first_timed * statistics.median(steps_t[first_timed:]), 3)
    return first_timed, calibrating, extra


# --------------------------------------------------------------------------- one run
class StepTimer:
    """An APPLY_MODEL wrapper: GPU-synchronised start/end of every diffusion-model call and the
    dynamo frame count at each start."""

    def __init__(self, device, profile: int = 0, kernel_call: int = 0, calib_count=None):
        self.device = device
        self.starts, self.ends, self.frames = [], [], []
        # the pack's calibration work done so far (shape classes timed, configs tuned, calls that
        # ran a default while candidates compiled), at each call's start: which steps calibrated
        self.calib_count = calib_count or (lambda: 0)
        self.calib: list = []
        self.profile = profile      # profile this many first calls (cProfile; PROFILE_ENV)
        self.profiles: list = []
        self.kernel_call = kernel_call  # this call (1-based) under torch.profiler (KERNEL_TIME_ENV)
        self.kernel_time: dict | None = None

    def __call__(self, executor, *args, **kwargs):
        _sync(self.device)
        self.frames.append(_dynamo_counters()["frames"])
        self.calib.append(self.calib_count())
        self.starts.append(time.perf_counter())
        if len(self.starts) == self.kernel_call and self.device == "cuda":
            out, self.kernel_time = _kernel_time(lambda: executor(*args, **kwargs))
            self.ends.append(time.perf_counter())
            return out
        prof = None
        if len(self.starts) <= self.profile:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        try:
            out = executor(*args, **kwargs)
            _sync(self.device)
        finally:
            if prof is not None:
                prof.disable()
                self.profiles.append(_profile_top(prof))
        self.ends.append(time.perf_counter())
        return out


    def step_times(self) -> list[float]:
        s = self.starts
        return [s[i + 1] - s[i] for i in range(len(s) - 1)] + ([self.ends[-1] - s[-1]] if s else [])


# TK_BENCH_KERNEL_TIME=1: the last diffusion-model call of every run under torch.profiler, in the JSON
# as ``kernel_time``: the call's wall time, its GPU kernels' summed time, the span from the first
# kernel's start to the last one's end and the GPU's idle time inside it (where the GPU waited for
# the host), the kernels that took longest, and the idle gaps with the host work that ran in them
# (idle_gaps). Two runs whose kernels sum alike but whose calls differ in wall time differ on the host.
KERNEL_TIME_ENV = "TK_BENCH_KERNEL_TIME"


GAP_MIN_US = 20.0  # an idle stretch shorter than this between two kernels is the launch itself


def idle_gaps(kernels: list, host: list, top: int = 10) -> dict:
    """Where the GPU waited for the host in one profiled call. ``kernels``: (start_us, end_us, name)
    of the GPU kernels; ``host``: (start_us, end_us, name) of the host's events (torch ops, runtime
    calls, compiled regions). Every idle stretch of GAP_MIN_US or more between one kernel's end and
    the next one's start is a gap; per gap the host events that ran in it (the longest first: the
    work the GPU waited for). Returns the gaps' count and sum, their sum by the kernel that ended
    them, the sum of the gaps during which the host waited on the GPU itself (a synchronising call:
    nothing to win there by issuing faster), and the ``top`` longest gaps."""
    ks = sorted(kernels)
    gaps = []
    end, prev = (ks[0][1], ks[0][2]) if ks else (0.0, "")
    for s, e, n in ks[1:]:
        if s - end >= GAP_MIN_US:
            gaps.append((s - end, end, s, prev, n))
        if e > end:
            end, prev = e, n
    # host calls that wait for the GPU (a copy from pageable memory too: the host waits until it is staged)
    sync_words = ("Synchronize", "cudaMemcpy", "_local_scalar_dense", "aten::item")

    def during(a, b):
        out = {}
        for hs, he, hn in host:
            ov = min(he, b) - max(hs, a)
            if ov > 0:
                out[hn] = out.get(hn, 0.0) + ov
        return out

    by_next: dict = {}
    sync_us = 0.0
    rows = []
    for g, a, b, pn, nn in gaps:
        by_next[nn[:60]] = by_next.get(nn[:60], 0.0) + g
        d = during(a, b)
        if any(any(w in hn for w in sync_words) for hn in d):
            sync_us += g
        rows.append((g, pn, nn, d))
    rows.sort(key=lambda r: -r[0])
    return {"count": len(gaps), "sum_ms": round(sum(g[0] for g in gaps) / 1e3, 3),
            "waiting_on_gpu_ms": round(sync_us / 1e3, 3),
            "by_next_kernel_ms": [[n, round(us / 1e3, 3)] for n, us in
                                  sorted(by_next.items(), key=lambda kv: -kv[1])[:top]],
            "longest": [{"ms": round(g / 1e3, 3), "after": pn[:60], "before": nn[:60],
                         "host": [[hn[:70], round(us / 1e3, 3)] for hn, us in
                                  sorted(d.items(), key=lambda kv: -kv[1])[:6]]} for g, pn, nn, d in rows[:top]]}


def _kernel_time(call, kernels: int = 20):
    """``call()`` under torch's profiler: the GPU's busy and idle time, the ``kernels`` kernels (by name) with the
    most time, the idle gaps (:func:`idle_gaps`)."""
    from torch.profiler import ProfilerActivity, profile
    t0 = time.perf_counter()
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            out = call()
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - the profiler must not fail the run: the call is made again
        torch.cuda.synchronize()
        return call(), {"error": f"{type(e).__name__}: {e}"[:300]}
    wall_ms = (time.perf_counter() - t0) * 1e3
    try:
        ks = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(e.time_range.end - e.time_range.start for e in ks) / 1e3
        span = (max(e.time_range.end for e in ks) - min(e.time_range.start for e in ks)) / 1e3 if ks else 0.0
        by_name: dict = {}
        for e in ks:
            by_name[e.name[:70]] = by_name.get(e.name[:70], 0.0) + (e.time_range.end - e.time_range.start) / 1e3
        rec = {"wall_ms": round(wall_ms, 2), "kernels": len(ks), "kernel_ms": round(busy, 2),
               "span_ms": round(span, 2), "gpu_idle_in_span_ms": round(span - busy, 2),
               "top": [[n, round(ms, 2)] for n, ms in sorted(by_name.items(), key=lambda kv: -kv[1])[:kernels]]}
        host = [(e.time_range.start, e.time_range.end, e.name) for e in p.events()
                if e.device_type == torch.autograd.DeviceType.CPU]
        rec["gaps"] = idle_gaps([(e.time_range.start, e.time_range.end, e.name) for e in ks], host)
    except Exception as e:  # noqa: BLE001
        rec = {"wall_ms": round(wall_ms, 2), "error": f"{type(e).__name__}: {e}"[:300]}
    return out, rec

# TK_BENCH_PROFILE=N: cProfile the first N diffusion-model calls of every run, in the JSON as
# ``first_calls_profile`` (where a first step's seconds go: calibration, Triton compiles, Dynamo,
# cache loads; Dynamo-compiled frames are only partly seen). TK_BENCH_PROFILE_RESTART=N: the same
# for the --restart process only (the cold run stays unprofiled).
PROFILE_ENV = "TK_BENCH_PROFILE"
PROFILE_RESTART_ENV = "TK_BENCH_PROFILE_RESTART"  # the same, for the --restart process only
# TK_BENCH_TRACE_COMPILES=1: every triton.compile of a run, hit or miss, in the JSON as
# ``triton_compiles`` (bench/compile_trace.py); the --restart process inherits it
TRACE_ENV = "TK_BENCH_TRACE_COMPILES"


def _profile_top(prof, n: int = 30) -> dict:
    """The ``n`` functions with the most cumulative and the most own time, ``file:line(name)``."""
    import pstats
    st = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)

    def name(k):
        f, line, fn = k
        parts = f.replace("\\", "/").split("/")
        return f"{'/'.join(parts[-2:])}:{line}({fn})" if f != "~" else fn

    rows = [(name(k), v[1], v[2], v[3]) for k, v in st.items()]
    total = max((r[3] for r in rows), default=0.0)
    return {"total_s": round(total, 3),
            "cumulative": [[r[0], r[1], round(r[3], 3)] for r in sorted(rows, key=lambda r: -r[3])[:n]],
            "own": [[r[0], r[1], round(r[2], 3)] for r in sorted(rows, key=lambda r: -r[2])[:n]]}


REGIONAL_OPTS = dict(mode="default", dynamic="auto", parts="blocks", cache_size_limit=16)


def _second_resolution(st, m, run_opts: dict, cond, neg, latent, seed: int, device: str, node_mod) -> dict:
    """Three more steps at another latent size on the compiled model: what the new size costs
    (the first two steps over the third), and how many graphs it compiled."""
    import comfy.patcher_extension as pe
    m2 = m.clone()
    m2.remove_wrappers_with_key(pe.WrappersMP.APPLY_MODEL, "tritonkit_bench_timer")
    timer = StepTimer(device)
    m2.add_wrapper_with_key(pe.WrappersMP.APPLY_MODEL, "tritonkit_bench_timer", timer)
    frames0 = _dynamo_counters()["frames"]
    inproc.call_node("KSampler", model=m2, seed=seed, steps=3, cfg=1.0, sampler_name="euler", scheduler="simple",
                     positive=cond, negative=neg, latent_image=latent, denoise=1.0)
    _sync(device)
    t = timer.step_times()
    out = {"latent_shape": list(latent["samples"].shape), "step_times_s": [round(x, 5) for x in t],
           "frames_compiled": _dynamo_counters()["frames"] - frames0}
    if len(t) >= 2:
        # what the new size costs over steady steps: a first call calibrating its new shape
        # classes (eagerly) and any compile, in whichever of the first steps they happen
        out["compile_s"] = sum(t[:-1]) - (len(t) - 1) * t[-1]
    if node_mod is not None and callable(getattr(node_mod, "stats", None)):
        out["compile_node"] = node_mod.stats()
    return out


def run_one(st: dict, base, run: Run, cond, neg, latent, steps: int, seed: int, device: str,
            compile_backend: str, second_latent=None, regional_opts: dict | None = None,
            warm_rounds: str | None = None) -> dict:
    import comfy.patcher_extension as pe
    fp8_mode, attn_mode = CONFIGS[run.config]
    rec = {"run": run.label, "model": run.model, "config": run.config, "fp8": fp8_mode, "attention": attn_mode,
           "compiled": run.compiled, "regional": run.regional, "arch": run.arch, "steps": steps,
           "sdpa": sdpa_backend(run.arch, device), "round": run.round, "base_label": run.base_label}
    own_cache = None
    if warm_rounds and run.compiled:
        own_cache = os.path.join(warm_rounds, run.base_label.replace(":", "-").replace("@", "-at"))
        rec["inductor_cache"] = "warm" if os.path.isdir(own_cache) else "cold"
    compile_mod = inproc.node_module(COMPILE_NODE) if run.regional else None
    torch._dynamo.reset()
    from torch._dynamo.utils import counters
    counters.clear()
    arch_env = None if run.arch == "native" else run.arch
    fp8_mod, attn_mod = inproc.node_module(FP8_NODE), inproc.node_module(ATTN_NODE)
    trace_from, builds_from = len(compile_trace.records()), len(compile_trace.builds())
    if os.environ.get(TRACE_ENV):
        _trace_prepare(attn_mod)
    census_from = len(_CENSUS)
    with _env(**{ARCH_ENV: arch_env}), _sdpa_as_on(run.arch, device), _cold_compile(run.compiled, own_cache), \
            _fp8_compute_as_on(run.arch):
        m = base
        if fp8_mode:
            out = st["classes"][FP8_NODE]().patch(model=m, mode=fp8_mode)
            m = out["result"][0]
            rec["fp8_node_text"] = out["ui"]["text"][0]
        if attn_mode:
            m = inproc.call_node(ATTN_NODE, model=m, mode=attn_mode)[0]
        if run.compiled:
            if compile_backend == "census":
                _register_census_backend()
            m = inproc.call_node("TorchCompileModel", model=m,
                                 backend=CENSUS_BACKEND if compile_backend == "census" else compile_backend)[0]
        if run.regional:
            # no _cold_compile here: whether this run is cold or warm is the state of the cache
            # folders (--compile-cache), which is what this node is about
            rec["regional_opts"] = dict(regional_opts or REGIONAL_OPTS)
            m = inproc.call_node(COMPILE_NODE, model=m, **rec["regional_opts"])[0]
        patched_layers = sum(1 for k in getattr(m, "object_patches", {}) if k.endswith(".forward_comfy_cast_weights"))
        base_fp8_kinds = _fp8_op_kinds(base)
        base_fp8_layers = sum(base_fp8_kinds.values())
        m = m.clone()
        timer = StepTimer(device, int(os.environ.get(PROFILE_ENV, "0") or 0),
                          kernel_call=steps if os.environ.get(KERNEL_TIME_ENV) else 0,
                          calib_count=_calibration_counter(attn_mod))
        m.add_wrapper_with_key(pe.WrappersMP.APPLY_MODEL, "tritonkit_bench_timer", timer)
        c_fp8, c_attn = _counter_snapshot(fp8_mod), _counter_snapshot(attn_mod)
        calib_before = _calibration_state(attn_mod)
        l_fp8 = _fp8_launches(fp8_mod)
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        rec["compile_workers_ready"] = _compile_workers_ready(attn_mod)
        t_start = time.time()
        t0 = time.perf_counter()
        out = inproc.call_node("KSampler", model=m, seed=seed, steps=steps, cfg=1.0, sampler_name="euler",
                               scheduler="simple", positive=cond, negative=neg, latent_image=latent, denoise=1.0)[0]
        _sync(device)
        rec["wall_s"] = time.perf_counter() - t0
        rec["t_start"], rec["t_end"] = round(t_start, 3), round(time.time(), 3)  # to match GPU clock samples
        dynamo_main = _dynamo_counters()  # before the second resolution adds its frames
        if run.regional:
            rec["compile_node"] = compile_mod.stats()
            rec["compile_node_summary"] = compile_mod.STATS.summary()
            if second_latent is not None:
                rec["second_res"] = _second_resolution(st, m, rec["regional_opts"], cond, neg, second_latent, seed,
                                                       device, compile_mod)
    if len(_CENSUS) > census_from:
        rec["graph_census"] = _CENSUS[census_from:]
    steps_t = timer.step_times()
    rec["step_times_s"] = [round(x, 5) for x in steps_t]
    rec["first_step_s"] = steps_t[0] if steps_t else None
    if timer.profiles:
        rec["first_calls_profile"] = timer.profiles
    if timer.kernel_time is not None:
        rec["kernel_time"] = timer.kernel_time
    if os.environ.get(TRACE_ENV):
        origin = timer.starts[0] if timer.starts else None
        if origin is not None:
            rec["prepare_calls"] = [[round(t - origin, 2), n, what] for t, n, what in _PREPARE_CALLS
                                    if t >= origin - 30][:80]
            _PREPARE_CALLS.clear()
        rec["triton_compiles"] = compile_trace.summary(compile_trace.records()[trace_from:],
                                                       os.environ.get("TRITON_CACHE_DIR"), origin=origin,
                                                       marks=tuple(timer.ends[:3]),
                                                       builds=compile_trace.builds()[builds_from:])
    # timed steps: from step 2, or for a compiled run from the step after the last one in which
    # dynamo compiled (the pack's calibration runs a compiled model's first call eagerly when a
    # shape class is not measured yet, so Inductor then compiles in step 2)
    compiled = run.compiled or run.regional
    first_timed, calibrating, extra = timed_steps(
        steps_t, timer.frames + [dynamo_main["frames"]] if compiled else None,  # not the second size's frames
        timer.calib[:len(steps_t)] + [timer.calib_count()])
    rec["calibrating_steps"] = [i + 1 for i in calibrating]
    # an eager run whose calibration worked up to its last step has no step on its settled paths: its
    # s/step (from step 2) holds the calibration, and the rounds' summary reports it apart (summarize)
    rec["steady"] = bool(compiled or not calibrating or calibrating[-1] + 1 < len(steps_t))
    if extra is not None:
        rec["calibration_extra_s"] = extra
    rest = steps_t[first_timed:]
    rec["timed_from_step"] = first_timed + 1
    # the median of the timed steps: one slow step (an allocator or lazy-load hiccup, seen at 0.75 s
    # among 0.25 s steps on an H100) moves a mean by a third and the median not at all
    rec["s_per_step"] = statistics.median(rest) if rest else (steps_t[0] if steps_t else None)
    rec["s_per_step_mean"] = sum(rest) / len(rest) if rest else rec["s_per_step"]
    rec["forward_calls"] = len(timer.starts)
    if (run.compiled or run.regional) and rec["first_step_s"] is not None and rest:
        rec["compile_s"] = steps_t[first_timed - 1] - rec["s_per_step"]
        if first_timed >= 2:  # step 1 ran eagerly to calibrate: what that cost on top of a step
            rec["calibration_step_s"] = steps_t[0] - rec["s_per_step"]
    if device == "cuda":
        rec["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        rec["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    if run.compiled or run.regional:
        dc = dynamo_main
        rec["dynamo"] = dc
        rec["compile_phases_s"] = _compile_phases()
        rec["dynamo"]["frames_after_first_step"] = dc["frames"] - (timer.frames[1] if len(timer.frames) > 1 else dc["frames"])
        # Recompiles: frames compiled after the first step that compiled anything (a compiled model
        # whose first call ran eagerly for calibration compiles in step 2: that is its compile, not a recompile).
        marks = timer.frames + [dc["frames"]]
        first = next((i for i in range(len(marks) - 1) if marks[i + 1] > marks[i]), None)
        rec["dynamo"]["first_compiling_step"] = None if first is None else first + 1
        rec["dynamo"]["recompiles"] = 0 if first is None else marks[-1] - marks[first + 1]
        if device == "cuda" and compile_backend == "inductor":
            # a run with its own cache folder (--warm-rounds) counts every kernel there: a warm round
            # writes none, it loads the first round's
            since = 0.0 if own_cache else t_start - 1
            rec["inductor"] = _fp8e4nv_kernels(since, own_cache)
            if run.arch != "native" and rec["inductor"]["fp8e4nv_kernels"]:
                # what this graph does on a real GPU of that arch: official Triton refuses fp8e4nv below sm89
                rec["inductor"]["compile_for_arch"] = _compile_fp8e4nv_kernel_for(since, int(run.arch), own_cache)
    rec["fp8_counters"] = _delta(c_fp8, _counter_snapshot(fp8_mod))
    rec["quantized_layers"] = _quantized_layers(base)
    if fp8_mode:
        rec["fp8_counters"].update(_fp8_run_stats(fp8_mod, base_fp8_layers, patched_layers))
        rec["fp8_layers_by_op"] = base_fp8_kinds
        left = _left_on_torch(rec.get("fp8_node_text", ""))
        rec["fp8_counters"]["layers_left_on_comfyui"] = sum(n for r, n in left.items() if "kept" not in r)
        rec["fp8_left_reasons"] = left
    # kernel launches of the pack's fp8 kernels in this run, for every run: a run without the
    # node must have none (object patches of an earlier clone must not leak into it)
    rec["fp8_counters"].update({f"launches_{k}": v for k, v in _delta(l_fp8, _fp8_launches(fp8_mod)).items()})
    rec["attention_counters"] = _delta(c_attn, _counter_snapshot(attn_mod))
    # the attention configs picked by timing so far in this process (one pick per shape class; a
    # slower pick is the first suspect when the same run differs between processes)
    try:
        rec["attention_tuned"] = {str(k): list(v) for k, v in attn_mod.A.tune_cache().items()}
    except Exception:  # noqa: BLE001 - no node module / no Triton: nothing tuned
        rec["attention_tuned"] = {}
    rec["calibration"] = _calibration_delta(calib_before, _calibration_state(attn_mod))
    rec["latent"] = out["samples"].detach().float().cpu()
    del m, out, timer
    torch._dynamo.reset()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return rec


# --------------------------------------------------------------------------- reporting
def _fmt(x, nd=3):
    if x is None:
        return "–"
    if isinstance(x, float):
        if x != 0 and (abs(x) < 10 ** -nd or abs(x) >= 1e5):
            return f"{x:.2e}"
        return f"{x:.{nd}f}"
    return str(x)


def annotate(results: list[dict]) -> None:
    """Accuracy against the same model's native default eager run; speed-up against the default
    run of the same simulated arch (``default@86`` for @86 rows, else the native one), eager and
    in the same compile mode."""
    base, by_round = {}, {}
    for r in results:
        if r.get("error") or r.get("skipped"):
            continue
        if r["config"] == "default":  # keyed by mode: eager (False), compiled (True), "regional"
            mode = "regional" if r.get("regional") else r["compiled"]
            base.setdefault((r["model"], mode, r["arch"]), r)
            by_round.setdefault((r["model"], mode, r["arch"], r.get("round", 1)), r)

    def default(r, compiled):
        # the default of the same round first (interleaved runs), then the first one
        rnd = r.get("round", 1)
        return (by_round.get((r["model"], compiled, r["arch"], rnd))
                or by_round.get((r["model"], compiled, "native", rnd))
                or base.get((r["model"], compiled, r["arch"])) or base.get((r["model"], compiled, "native")))

    _annotate_regional(results)
    for r in results:
        if r.get("error") or r.get("skipped"):
            continue
        ref = base.get((r["model"], False, "native"))
        if ref is not None and "latent" in r and "latent" in ref:
            r.update(compare(r["latent"], ref["latent"]))
        eager = default(r, False)
        if eager is not None and r.get("s_per_step") and eager.get("s_per_step"):
            r["speedup_vs_default_eager"] = eager["s_per_step"] / r["s_per_step"]
            r["default_eager_ref"] = eager["run"]
        same = default(r, "regional" if r.get("regional") else r["compiled"])
        if same is not None and r.get("s_per_step") and same.get("s_per_step"):
            r["speedup_vs_default_same_mode"] = same["s_per_step"] / r["s_per_step"]
        if r["compiled"] and same is not None and same is not r and "latent" in r and "latent" in same:
            # compiled runs also against the compiled default: Inductor's own numerics apart
            r.update({f"{k}_vs_default_compiled": v for k, v in compare(r["latent"], same["latent"]).items()
                      if k != "finite"})


def _annotate_regional(results: list[dict]) -> None:
    """Regional-compile rows (and TorchCompileModel rows) against their twins: s/step against the
    same configuration under TorchCompileModel, the final latent against the same configuration
    run eagerly (the same graph's eager twin)."""
    ok = [r for r in results if not r.get("error") and not r.get("skipped")]

    def twin(r, compiled, regional):
        for o in ok:
            if (o["model"], o["config"], o["arch"]) == (r["model"], r["config"], r["arch"]) and \
                    o["compiled"] == compiled and bool(o.get("regional")) == regional:
                return o
        return None

    for r in ok:
        if not (r["compiled"] or r.get("regional")):
            continue
        eager = twin(r, False, False)
        if eager is not None and "latent" in r and "latent" in eager:
            c = compare(r["latent"], eager["latent"])
            r["cosine_vs_eager_twin"], r["rel_err_vs_eager_twin"] = c["cosine"], c["rel_err"]
        if r.get("regional"):
            tcm = twin(r, True, False)
            if tcm is not None and tcm.get("s_per_step") and r.get("s_per_step"):
                r["s_per_step_vs_torchcompile"] = r["s_per_step"] / tcm["s_per_step"]
                r["torchcompile_compile_s"] = tcm.get("compile_s")


def markdown(meta: dict, results: list[dict]) -> str:
    v = meta["versions"]
    lines = [f"Device: {v.get('gpu', v.get('cpu'))}" + (f" (sm{v['sm']}, {v['gpu_mem_gib']} GiB), driver {v.get('driver', '?')}" if "gpu" in v else f", {v.get('cpu_count')} cores") +
             f"; torch {v['torch']}, Triton {v['triton']}, Python {v['python']}, ComfyUI {v['comfyui']}.",
             f"Command: `{meta['command']}`", ""]
    for key, m in meta.get("models", {}).items():
        lines.append(f"- `{key}`: {m['params'] / 1e9:.2f} B parameters, {m['size']}, {m.get('image_tokens')} image + "
                     f"{m.get('text_tokens')} text tokens, {m.get('steps', meta['steps'])} steps euler/simple, cfg 1"
                     + (f"; file written in {m['write_s']:.0f} s, loaded by UNETLoader in {m['load_s']:.1f} s"
                        if "load_s" in m else ""))
    lines += ["", "| run | fp8 Fallback | Attention | compiled | arch | s/step | × default (same mode) | × default eager "
              "| first step (s) | compile (s) | peak GiB | rel err | cosine | notes |",
              "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        if r.get("skipped") or r.get("error"):
            lines.append(f"| {r['run']} | | | | | | | | | | | | | {'skipped: ' + r['skipped'] if r.get('skipped') else 'FAILED: ' + r['error'][:200].replace('|', '/')} |")
            continue
        notes = []
        if r.get("arch") != "native" and r.get("sdpa"):
            notes.append(f"ComfyUI's SDPA on {r['sdpa']}; × against {r.get('default_eager_ref', '?')}")
        if r.get("dynamo"):
            d = r["dynamo"]
            notes.append(f"{d['frames']} frame(s) compiled, {d['graph_breaks']} graph break(s), "
                         f"compiled in step {d.get('first_compiling_step')}, {d.get('recompiles')} recompile(s) after it")
        if r.get("regional"):
            sr, wr = r.get("second_res") or {}, r.get("warm_restart") or {}
            notes.append("regional: cold compile " + _fmt(r.get("compile_s"), 1) + " s"
                         + (f" (TorchCompileModel {_fmt(r.get('torchcompile_compile_s'), 1)} s)"
                            if r.get("torchcompile_compile_s") is not None else "")
                         + (f", 2nd size {sr.get('latent_shape')} {_fmt(sr.get('compile_s'), 1)} s "
                            f"({sr.get('frames_compiled')} frame(s))" if sr else "")
                         + (f", warm restart {_fmt(wr.get('compile_s'), 1)} s" if "compile_s" in wr else
                            f", warm restart FAILED: {wr.get('error', '')[:80]}" if wr else "")
                         + (f", s/step x{_fmt(r['s_per_step_vs_torchcompile'], 3)} of TorchCompileModel"
                            if r.get("s_per_step_vs_torchcompile") else ""))
            if r.get("compile_node_summary"):
                notes.append(r["compile_node_summary"].replace("|", "/")[:300])
        if r.get("cosine_vs_eager_twin") is not None:
            notes.append(f"vs eager twin: cos {_fmt(r['cosine_vs_eager_twin'], 6)}")
        if r.get("cosine_vs_default_compiled") is not None:
            notes.append(f"vs default compiled: rel err {_fmt(r['rel_err_vs_default_compiled'], 4)}, "
                         f"cos {_fmt(r['cosine_vs_default_compiled'], 5)}")
        if r.get("inductor"):
            notes.append(f"{r['inductor']['fp8e4nv_kernels']}/{r['inductor']['triton_kernels']} Inductor kernels use fp8e4nv")
            cf = r["inductor"].get("compile_for_arch")
            if cf:
                notes.append(f"sm{r['arch']} compile of an fp8e4nv kernel: {cf['status']}"
                             + (f" ({cf['error'][:160]})" if cf.get("error") else ""))
        if r.get("fp8") and r.get("fp8_counters"):
            fc = r["fp8_counters"]
            notes.append(f"fp8 node: {fc.get('layers_patched', 0)}/{fc.get('fp8_layers', 0)} fp8 layers patched "
                         f"({r.get('quantized_layers', 0)} QuantizedTensor), "
                         f"{fc.get('layers_left_on_comfyui', 0)} left on ComfyUI's path")


        if r.get("steady") is False:
            notes.append("calibrated in every step: its s/step holds the calibration")
        cal = r.get("calibration") or {}
        if cal.get("calibrations"):
            picks = {}
            for v in cal["new_choices"].values():
                picks[v["choice"]] = picks.get(v["choice"], 0) + 1
            notes.append(f"calibrated {cal['calibrations']} shape classes ("
                         + ", ".join(f"{k} {n}" for k, n in sorted(picks.items())) + ")")
        for k in ("attention_counters", "fp8_counters"):
            if r.get(k):
                notes.append(", ".join(f"{a}={b}" for a, b in sorted(r[k].items())[:6]))
        lines.append("| " + " | ".join([
            r["run"], r["fp8"] or "–", r["attention"] or "–",
            "regional" if r.get("regional") else ("yes (own cache, warm)" if r.get("inductor_cache") == "warm"
                                                 else "yes") if r["compiled"] else "no", r["arch"],
            _fmt(r.get("s_per_step")), _fmt(r.get("speedup_vs_default_same_mode"), 2),
            _fmt(r.get("speedup_vs_default_eager"), 2), _fmt(r.get("first_step_s"), 2), _fmt(r.get("compile_s"), 1),
            _fmt(r.get("peak_mem_gib"), 2), _fmt(r.get("rel_err"), 4), _fmt(r.get("cosine"), 5),
            "; ".join(notes)]) + " |")
    return "\n".join(lines) + "\n"


def _spread(xs: list) -> dict:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return {}
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1], "n": len(xs)}


def summarize(results: list[dict]) -> list[dict]:
    """Per configuration over the rounds: s/step and the per-round ratios against the default
    (same mode, and eager), each as median / min / max, over its steady rounds.

    A round whose run calibrated in every step (``steady`` False: a cold shape class timed at its last
    step, or a short run) has no step on the paths the calibration settled; it is not a figure of
    those paths. It is left out of the ratios and "never slower" and reported on its own
    (``calibrating_rounds``): its ratio, and the seconds its steps took beyond the same
    configuration's steady rounds (median of their step sums), the calibration's price once. With no
    steady round at all, every round counts as before."""
    groups: dict = {}
    for r in results:
        if r.get("error") or r.get("skipped") or r.get("s_per_step") is None:
            continue
        groups.setdefault(r.get("base_label", r["run"]), []).append(r)
    out = []
    for label, every in groups.items():
        steady = [r for r in every if r.get("steady", True)]
        rs, calibrating = (steady, [r for r in every if not r.get("steady", True)]) if steady else (every, [])
        row = {"config": label, "rounds": len(every), "s_per_step": _spread([r["s_per_step"] for r in rs]),
               "x_default_same_mode": _spread([r.get("speedup_vs_default_same_mode") for r in rs]),
               "x_default_eager": _spread([r.get("speedup_vs_default_eager") for r in rs])}
        if calibrating:
            sums = [sum(r["step_times_s"]) for r in rs if r.get("step_times_s")]
            base = statistics.median(sums) if sums else None
            row["calibrating_rounds"] = [
                {"run": r["run"], "x_default_same_mode": r.get("speedup_vs_default_same_mode"),
                 "s_more_than_steady": (round(sum(r["step_times_s"]) - base, 3)
                                        if base is not None and r.get("step_times_s") else None)}
                for r in calibrating]
        x = row["x_default_same_mode"]
        if x and rs[0]["config"] != "default":
            row["never_slower"] = x["min"] >= 1.0
        out.append(row)
    return out


def _summary_markdown(summary: list[dict]) -> list[str]:
    if not summary or max(r["rounds"] for r in summary) < 2:
        return []

    def sp(d, nd=3):
        return f"{_fmt(d['median'], nd)} ({_fmt(d['min'], nd)}–{_fmt(d['max'], nd)})" if d else "–"
    lines = ["", "Interleaved rounds: median (min–max) over the rounds; × = the round's default s/step ÷ this "
             "run's, so ≥ 1 at the minimum means never slower in any round. A round that calibrated in every "
             "step is not in them: the last column gives its × and the seconds its steps took beyond the "
             "configuration's steady rounds.", "",
             "| configuration | rounds | s/step | × default (same mode) | × default eager | never slower "
             "| calibrating in every step |",
             "| --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in summary:
        ns = "" if "never_slower" not in r else ("yes" if r["never_slower"] else "**no**")
        cal = "; ".join(f"{c['run']}: {_fmt(c['x_default_same_mode'], 3)}×, "
                        f"+{_fmt(c['s_more_than_steady'], 2)} s" for c in r.get("calibrating_rounds", ()))
        lines.append(f"| {r['config']} | {r['rounds']} | {sp(r['s_per_step'], 4)} | {sp(r['x_default_same_mode'])} "
                     f"| {sp(r['x_default_eager'])} | {ns} | {cal or '–'} |")
    return lines


def write_outputs(out_dir: Path | None, meta: dict, results: list[dict]) -> tuple[dict, str]:
    annotate(results)
    clean = [{k: v for k, v in r.items() if k != "latent"} for r in results]
    summary = summarize(results)
    doc = {**meta, "runs": clean, "summary": summary}
    md = markdown(meta, results) + "\n".join(_summary_markdown(summary)) + "\n"
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "workflow.json").write_text(json.dumps(doc, indent=1, default=str))
        (out_dir / "workflow.md").write_text(md)
    return doc, md


# --------------------------------------------------------------------------- driver
def _converts_scaled_fp8() -> bool:
    """ComfyUI 0.8+: scaled-fp8 files load as QuantizedTensor layers whose path (comfy-kitchen's
    fp8 matmul or full precision) is chosen at load from supports_fp8_compute, so @86 runs of a
    scaled model get their own load."""
    import comfy.utils
    return hasattr(comfy.utils, "convert_old_quants")


def interleave(runs: list, rounds: int) -> list:
    """The plan ``rounds`` times, interleaved per model, every second round in reverse order
    (A B C, C B A, A B C …): no configuration always runs in the same place of a round, after the
    same neighbour, so a position effect cannot pass for a configuration's (the compiled native Flux
    gap of 2026-11-24 was not one: it held with the order reversed). A model's runs stay together so
    it is loaded once."""
    if rounds < 1:
        raise ValueError(f"--rounds must be at least 1, not {rounds}")
    order: dict = {}
    for r in runs:
        order.setdefault(r.model, []).append(r)
    out = []
    for group in order.values():
        for i in range(1, rounds + 1):
            out.extend(dataclasses.replace(r, round=i) for r in (group if i % 2 else group[::-1]))
    return out


def run_bench(preset: str = "tiny", plan: str | None = None, steps: int | None = None, out_dir=None,
              models_dir=None, budget_s: float | None = None, compile_backend: str = "inductor",
              seed: int = 0, command: str | None = None, log=print, overrides: dict | None = None,
              rounds: int = 1, second_res: bool = True, restart: bool = False,
              regional_opts: dict | None = None, warm_rounds: bool = False) -> dict:
    """Builds the models, runs the plan and returns {"meta", "runs", "markdown", "results"}
    (``results`` keep the final latents as tensors)."""
    t_begin = time.perf_counter()
    p = dict(PRESETS[preset])
    for k, v in (overrides or {}).items():
        p[k] = dict(p[k], **v) if isinstance(v, dict) else v
    device = p["device"]
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"preset {preset!r} needs a CUDA GPU")
    steps_cli = steps
    steps = steps or p["steps"]
    runs = [Run.parse(s) for s in (plan or p["plan"]).split(",") if s.strip()]
    seen_labels: dict = {}
    for r in runs:  # a repeated run gets "#2", "#3"… in its label
        n = seen_labels[r.label] = seen_labels.get(r.label, 0) + 1
        if n > 1:
            r.tag = f"#{n}"
    runs = interleave(runs, rounds)
    models_dir = Path(models_dir or tempfile.mkdtemp(prefix="tk_bench_models_"))
    models_dir.mkdir(parents=True, exist_ok=True)
    out_dir = Path(out_dir) if out_dir else None
    st = inproc.setup(device, models_dir)
    meta = {"preset": preset, "device": device, "steps": steps, "seed": seed, "compile_backend": compile_backend,
            "rounds": rounds,
            "command": command or f"run_bench(preset={preset!r})", "versions": versions(device),
            "pack_loaded": st["pack_loaded"], "nodes_not_registered_by_pack": st.get("imported_directly", []),
            "models": {}, "env": {k: os.environ[k] for k in os.environ
                                                                    if k.startswith("TRITONKIT_")}}
    missing = [n for n in (FP8_NODE, ATTN_NODE) if n not in st["classes"]]
    if missing:
        log(f"[workflow] nodes not registered: {missing}; runs that need them will fail")
    results: list[dict] = []
    loaded: dict = {}
    own_caches = tempfile.mkdtemp(prefix="tk_inductor_rounds_") if warm_rounds else None
    meta["warm_rounds"] = bool(warm_rounds)
    seen_compile: dict = {}
    seen_step: dict = {}

    def left():
        return None if budget_s is None else budget_s - (time.perf_counter() - t_begin)

    for run in runs:
        arch_key = MODELS[run.model][0]
        spec = p.get(arch_key)
        if spec is None:
            results.append({"run": run.label, "model": run.model, "config": run.config, "compiled": run.compiled,
                            "arch": run.arch, "skipped": f"preset {preset} has no {arch_key} model"})
            continue
        load_key = (run.model, _fp8_compute_key(run.arch) if _converts_scaled_fp8() and MODELS[run.model][1]
                    else "native")
        if load_key not in loaded:
            est = load_estimate_s(device, spec, (Path(models_dir) / model_name(run.model, spec)).exists())
            if left() is not None and left() < est:
                results.append({"run": run.label, "model": run.model, "config": run.config, "compiled": run.compiled,
                                "arch": run.arch, "skipped": f"time budget ({left():.0f} s left, model not built)"})
                continue
            # free the previous model's GPU memory before the next one
            for k in list(loaded):
                del loaded[k]
            st["mm"].unload_all_models()
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
            log(f"[workflow] writing {run.model} ({spec['config']['arch']}, depth {_depth(spec['config'])}) "
                f"to {models_dir}")
            name, desc, write_s = model_file(models_dir, run.model, spec, device)
            t0 = time.perf_counter()
            with _fp8_compute_as_on(run.arch):  # ComfyUI 0.8+ picks the QuantizedTensor path at load
                model = inproc.call_node("UNETLoader", unet_name=name, weight_dtype=MODELS[run.model][2])[0]
            load_s = time.perf_counter() - t0
            cond = conditioning(desc, spec, seed)
            neg = conditioning(desc, spec, seed + 1)
            latent = empty_latent(model, spec)
            loaded[load_key] = (model, cond, neg, latent)
            size = f"{spec['width']}×{spec['height']}" + (f"×{spec['frames']} frames" if spec.get("frames") else "")
            meta["models"].setdefault(run.model, {})
            meta["models"][run.model] = {**meta["models"][run.model], "arch": desc["arch"], "params": desc["params"], "size": size,
                                         "latent_shape": list(latent["samples"].shape),
                                         "image_tokens": image_tokens(latent), "text_tokens": spec["tokens"],
                                         "weight_dtype": MODELS[run.model][2], "scaled_fp8": desc["scaled_fp8"],
                                         "file": name, "write_s": write_s, "load_s": load_s,
                                         "steps": steps_cli or spec.get("steps") or steps,
                                         "manual_cast_dtype": str(model.model.manual_cast_dtype),
                                         "ops": type(model.model.diffusion_model.double_blocks[0].img_attn.qkv).__qualname__
                                         if hasattr(model.model.diffusion_model, "double_blocks") else "?",
                                         f"quantized_layers_{load_key[1]}": _quantized_layers(model)}
        model, cond, neg, latent = loaded[load_key]
        n_steps = steps_cli or spec.get("steps") or steps
        est = (n_steps + 1) * seen_step.get(run.model, 1.0) + 10
        second = None
        if run.regional and second_res and spec.get("second"):
            second = empty_latent(model, dict(spec, **spec["second"]))
            est += 3 * seen_step.get(run.model, 1.0) * second["samples"].numel() / latent["samples"].numel()
        if run.compiled and not (own_caches and run.round > 1):
            # the census backend traces only (no Inductor): Dynamo's seconds
            est += seen_compile.get(run.model, 30.0 if compile_backend == "census" or device != "cuda" else 120.0)
        if left() is not None and left() < est:
            results.append({"run": run.label, "model": run.model, "config": run.config, "compiled": run.compiled,
                            "arch": run.arch, "skipped": f"time budget ({left():.0f} s left, ~{est:.0f} s needed)"})
            write_outputs(out_dir, meta, results)
            continue
        log(f"[workflow] {run.label} …")
        try:
            rec = run_one(st, model, run, cond, neg, latent, n_steps, seed, device, compile_backend,
                          second_latent=second, regional_opts=regional_opts, warm_rounds=own_caches)
            if rec.get("s_per_step"):
                seen_step[run.model] = max(seen_step.get(run.model, 0), rec["s_per_step"])
            if rec.get("compile_s") and rec.get("inductor_cache") != "warm":
                seen_compile[run.model] = max(seen_compile.get(run.model, 0), rec["compile_s"] * 1.2)
            log(f"[workflow]   {rec['s_per_step']:.4f} s/step, first step {rec['first_step_s']:.2f} s"
                + (f", peak {rec['peak_mem_gib']:.2f} GiB" if "peak_mem_gib" in rec else ""))
        except Exception as e:
            tb = traceback.format_exc()
            log(f"[workflow]   FAILED: {e}\n{tb}")
            rec = {"run": run.label, "model": run.model, "config": run.config, "compiled": run.compiled,
                   "arch": run.arch, "error": f"{type(e).__name__}: {e}", "traceback": tb[-4000:]}
            torch._dynamo.reset()
            gc.collect()
        results.append(rec)
        write_outputs(out_dir, meta, results)
    if restart:
        for i, rec in enumerate(results):
            if rec.get("regional") and not rec.get("error") and not rec.get("skipped"):
                log(f"[workflow] {rec['run']}: warm restart in a new process …")
                rec["warm_restart"] = warm_restart(rec, preset, models_dir, out_dir, i, seed, overrides, regional_opts)
                write_outputs(out_dir, meta, results)
    meta["total_s"] = time.perf_counter() - t_begin
    cal = _calibration_state(inproc.node_module(ATTN_NODE))
    if cal:  # every choice the pack's calibration holds for this GPU at the end, with its timings
        meta["calibration"] = {"dir": cal["dir"], "timing": cal["timing"], "counters": cal["counters"],
                               "choices": cal["entries"]}
    doc, md = write_outputs(out_dir, meta, results)
    return {"meta": meta, "runs": doc["runs"], "markdown": md, "results": results}


def warm_restart(rec: dict, preset: str, models_dir, out_dir, index: int, seed: int, overrides: dict | None,
                 regional_opts: dict | None) -> dict:
    """The same regional run again in a new Python process with the same cache folders (the
    environment carries TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR): 2 steps, no second size.
    Returns its first-step compile time, its step times and the node's counters."""
    import subprocess
    # its own outputs go to a temporary folder (the GPU tool brings back few files); what matters
    # is copied into this run's record
    sub_out = Path(tempfile.mkdtemp(prefix="tk_bench_restart_")) / f"restart-{index}"
    label = rec["run"].split("#")[0]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--preset", preset, "--plan", label, "--steps", "2",
           "--models-dir", str(models_dir), "--out", str(sub_out), "--no-second-res", "--seed", str(seed),
           "--regional-opts", json.dumps(regional_opts or REGIONAL_OPTS)]
    if overrides:
        cmd += ["--overrides-json", json.dumps(overrides)]
    t0 = time.perf_counter()
    # the environment this bench started with, as a restarted ComfyUI would have it: not what this
    # process set since (Inductor sets TRITON_PTXAS_PATH at its first compile, the pack at load)
    env = dict(_START_ENV or os.environ)
    if os.environ.get(PROFILE_RESTART_ENV):
        env[PROFILE_ENV] = os.environ[PROFILE_RESTART_ENV]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    out = {"wall_s": time.perf_counter() - t0, "returncode": p.returncode}
    try:
        sub = json.loads((sub_out / "workflow.json").read_text())["runs"][0]
    except (OSError, ValueError, IndexError) as e:
        out["error"] = f"{type(e).__name__}: {e}; stderr: {p.stderr[-2000:]}"
        return out
    if sub.get("error"):
        out["error"] = sub["error"]
        return out
    for k in ("compile_s", "calibration_step_s", "first_step_s", "s_per_step", "step_times_s", "compile_node",
              "compile_node_summary", "dynamo", "calibration", "compile_phases_s", "first_calls_profile",
              "triton_compiles"):
        if k in sub:
            out[k] = sub[k]
    # what the pack logged in that process (what a warm first step spent its time on)
    out["log"] = [ln[:300] for ln in (p.stdout + p.stderr).splitlines() if "TritonKit" in ln][-30:]
    return out


_START_ENV: dict | None = None  # main()'s environment once its options are applied


def _set_compile_cache(arg: str | None) -> str | None:
    """--compile-cache: Inductor's and Triton's cache folders for this process and its restarts
    ("fresh": a new temporary folder, so the first compile is cold)."""
    if not arg:
        return None
    root = Path(tempfile.mkdtemp(prefix="tk_compile_cache_") if arg == "fresh" else arg).resolve()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
    os.environ["TRITON_CACHE_DIR"] = str(root / "triton")
    return str(root)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--plan", help="comma-separated MODEL:CONFIG[:compiled][@ARCH] (default: the preset's)")
    ap.add_argument("--steps", type=int, help="sampling steps per run (default: the preset's)")
    ap.add_argument("--out", default="artifacts/workflow", help="folder for workflow.json / workflow.md")
    ap.add_argument("--models-dir", help="where the random fp8 models are written (default: a temp folder)")
    ap.add_argument("--budget-s", type=float, help="skip runs that would not finish within this many seconds")
    ap.add_argument("--compile-backend", default="inductor", help="backend given to TorchCompileModel ('census': "
                    "Dynamo's graphs are counted by operation, then run eagerly: what the pack changes in the graph)")
    ap.add_argument("--hunyuan-frames", type=int, help="override the HunyuanVideo frame count")
    ap.add_argument("--hunyuan-size", help="override the HunyuanVideo WxH, e.g. 960x544")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the plan this many times, interleaved per model (A B A B …), and report the median "
                         "and min–max per configuration")
    ap.add_argument("--calibration-dir", help="where the pack keeps its calibration choices (sets "
                                              "TRITONKIT_CALIBRATION_DIR; default: ComfyUI's user folder)")
    ap.add_argument("--expect-stored", action="store_true",
                    help="exit 1 if any run timed a path or an attention config (a second process with the same "
                         "--calibration-dir must find every choice stored)")
    ap.add_argument("--compile-cache", help="folder for Inductor's and Triton's caches (made if missing), or "
                    "'fresh' for a new empty one: MODEL:CONFIG:regional runs are cold in an empty one")
    ap.add_argument("--restart", action="store_true", help="after the plan, run every :regional run again in a "
                    "new process on the same caches (the warm-restart compile time)")
    ap.add_argument("--no-second-res", action="store_true", help=":regional runs skip the three steps at the "
                    "preset's second size (Flux 768², HunyuanVideo 49 frames)")
    ap.add_argument("--regional-opts", help="JSON options of the Triton Compile Model node, default "
                    + json.dumps(REGIONAL_OPTS))
    ap.add_argument("--warm-rounds", action="store_true", help="compiled (TorchCompileModel) runs keep Inductor's "
                    "caches per model, configuration and arch: round 1 compiles cold, later rounds load their own "
                    "configuration's graphs (their compile column is then a cache load)")
    ap.add_argument("--sim-mma", choices=SIM_MMA, default="auto",
                    help="how Triton compiles tl.dot for @86 / @89 runs on an sm90+ GPU: sync (mma.sync, as those "
                         "cards' Triton must; the plan must hold simulated runs only), wgmma (Hopper's), auto "
                         "(sync where the plan holds simulated runs only)")
    ap.add_argument("--overrides-json", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    plan_runs = [Run.parse(s) for s in (a.plan or PRESETS[a.preset]["plan"]).split(",") if s.strip()]
    mma = sim_mma(plan_runs, a.sim_mma, os.environ)  # before anything compiles
    print(f"[workflow] Triton's MMA: {mma}")
    if os.environ.get(TRACE_ENV) and not compile_trace.install():
        print(f"[workflow] {TRACE_ENV}: this Triton has no compilation listener; nothing is traced")
    # the pack's INFO lines (calibration, compile summaries): a --restart process's are kept in the JSON
    logging.basicConfig()
    logging.getLogger("TritonKit").setLevel(logging.INFO)
    cache_root = _set_compile_cache(a.compile_cache)
    ov = json.loads(a.overrides_json) if a.overrides_json else {}
    if a.calibration_dir:
        os.environ["TRITONKIT_CALIBRATION_DIR"] = a.calibration_dir
    if a.hunyuan_frames or a.hunyuan_size:
        ov["hunyuan"] = {}
        if a.hunyuan_frames:
            ov["hunyuan"]["frames"] = a.hunyuan_frames
        if a.hunyuan_size:
            w, h = (int(x) for x in a.hunyuan_size.lower().split("x"))
            ov["hunyuan"].update(width=w, height=h)
    global _START_ENV
    _START_ENV = dict(os.environ)
    cmd = "python bench/workflow.py " + " ".join(sys.argv[1:] if argv is None else argv)
    ropts = dict(REGIONAL_OPTS, **json.loads(a.regional_opts)) if a.regional_opts else None
    if cache_root:
        print(f"[workflow] compile caches in {cache_root}")
    res = run_bench(a.preset, a.plan, a.steps, a.out, a.models_dir, a.budget_s, a.compile_backend, a.seed, cmd,
                    overrides=ov, rounds=a.rounds, second_res=not a.no_second_res, restart=a.restart,
                    regional_opts=ropts, warm_rounds=a.warm_rounds)
    print(res["markdown"])
    if a.expect_stored:
        timed = {r["run"]: r["calibration"] for r in res["results"]
                 if any((r.get("calibration") or {}).get(k) for k in ("calibrations", "timed_runs", "autotunes"))}
        meta_cal = res["meta"].get("calibration", {})
        print(f"[workflow] --expect-stored: calibration counters of this process {meta_cal.get('counters')}; "
              f"runs that timed something: {sorted(timed) or 'none'}")
        if timed or not meta_cal:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
