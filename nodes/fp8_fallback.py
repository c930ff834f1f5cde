"""Triton fp8 Fallback: fp8 weights through this pack's Triton kernels instead of torch's cast.

ComfyUI keeps fp8 checkpoints in fp8 and upcasts every weight on every forward with
``weight.to(dtype)`` (comfy/ops.py ``cast_bias_weight``). Below sm89 that cast is what
``TorchCompileModel`` turns into Triton code with an ``fp8e4nv`` pointer, which official Triton
refuses; everywhere it is slower than it needs to be. This node, on a clone of the MODEL,
object-patches ``forward_comfy_cast_weights`` of every ComfyUI op whose weight is fp8 (the
per-module route of docs: comfyui-internals §B.6, option 2):

* plain Linear layers without LoRA-in-lowvram patches -> the fused W8A16 linear
  (``torch.ops.tritonkit.fp8_linear``: the weight is decoded inside the matmul);
* every other fp8 op (Linear with weight functions, Conv, GroupNorm/LayerNorm/RMSNorm) ->
  ``torch.ops.tritonkit.fp8_decode`` then ComfyUI's own functional call, weight functions
  (LoRA patches in lowvram mode) applied after the decode exactly as ComfyUI applies them;
* small fp8 parameters that are not in a ComfyUI op (Flux's QK-norm scales, WAN's modulation)
  and the fp8 biases of the patched layers are decoded once, here, to the compute dtype (an
  object patch of the parameter): a bias is a few KB, and decoding it on every call was half of
  the kernel launches of a Flux step (bench/workflow.py).

Both ops are opaque custom ops, so under ``torch.compile`` Inductor calls them and never emits
code that reads an fp8 tensor. On a GPU with native fp8 (sm89+, not forced lower) ``auto`` leaves
the compiled graph to ComfyUI's own cast, which Inductor compiles natively there and which
measured as fast or faster; eager calls keep the Triton decode. Patches live on the clone only (ModelPatcher applies object
patches when it loads the model and restores the originals when it unloads), so bypassing or
deleting the node restores ComfyUI's behaviour. Per call, a layer falls back to ComfyUI's own
forward when its weights are not on the compute device (offloaded/lowvram weights on the CPU),
for CPU tensors (unless ``TRITONKIT_FORCE_TRITON_ON_CPU=1``), or for unsupported dtypes; each
reason is logged once. ``comfy.model_management.cast_to`` is never patched (ComfyUI's hook
breaker restores it).
"""
from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Optional

import torch

from .arch import ARCH_ENV, arch_forced, effective_arch, parse_arch  # noqa: F401 (parse_arch: tests)


def force_triton_on_cpu() -> bool:
    # imported here, not at module import: the node must register (and say why) without Triton
    from ..kernels.runtime import force_triton_on_cpu as forced
    return forced()

log = logging.getLogger("TritonKit")

MODES = ("auto", "fused-linear", "cast-only", "off")
PREDECODE_MAX_NUMEL = 1 << 20     # fp8 parameters outside ComfyUI ops decoded once up to this size
# auto on a GPU uses the fused linear only where it measured faster than our decode + torch's
# matmul (BENCHMARKS.md, fp8 section, H200): few tokens (<= 16, the weight-streaming regime, e.g.
# Flux's modulation layers that see one token per image) on layers wide enough to give every SM
# work (>= 64 output features per SM: a 12288-wide layer, not a 3072-wide one). Everything else
# uses the decode + cuBLAS, which beats ComfyUI's cast + matmul 1.2-2.5x on every measured shape.
FUSED_MAX_TOKENS = 16
FUSED_MIN_FEATURES_PER_SM = 64
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
WRAPPER_KEY = "tritonkit_fp8_fallback"

_logged: set = set()


def log_once(key: str, msg: str, level: int = logging.INFO) -> None:
    if key not in _logged:
        _logged.add(key)
        log.log(level, "TritonKit fp8: %s", msg)


# ----------------------------------------------------------------------------- per-run accounting
class RunStats:
    """What the patched layers did since the last reset (eager calls only; compiled graphs are
    counted through the kernel launch counters)."""

    def __init__(self):
        self.layers: dict = {}
        self.fallbacks: collections.Counter = collections.Counter()
        self.launches0: collections.Counter = collections.Counter()

    @staticmethod
    def _launch_counter() -> collections.Counter:
        from ..kernels import fp8
        return fp8.LAUNCHES

    def reset(self):
        self.layers = {}
        self.fallbacks = collections.Counter()
        self.launches0 = collections.Counter(self._launch_counter())

    def launches(self) -> dict:
        now = self._launch_counter()
        return {k: now[k] - self.launches0.get(k, 0) for k in now if now[k] - self.launches0.get(k, 0)}


STATS = RunStats()


def _record(name: str, path: str) -> None:
    if not torch.compiler.is_compiling():
        STATS.layers[name] = path


def _fallback(name: str, reason: str) -> None:
    if not torch.compiler.is_compiling():
        STATS.fallbacks[reason] += 1
        log_once("fallback:" + reason, f"{reason}: those calls use ComfyUI's torch cast (first seen on {name})")


# ----------------------------------------------------------------------------- patched forwards
@dataclass(frozen=True)
class LayerConfig:
    name: str
    kind: str               # linear, conv, groupnorm, layernorm, rmsnorm
    fused: bool             # Linear through the fused W8A16 kernel when the call allows it
    fused_max_tokens: Optional[int] = None  # ... for at most this many rows of activations
    arch: Optional[int] = None  # effective compute capability (None on CPU)
    allow_cpu: bool = False     # run the Triton path on CPU tensors (the interpreter)
    compile_native: bool = False  # under torch.compile, leave ComfyUI's cast to Inductor (see below)


def _eligible(m, x, cfg: LayerConfig) -> Optional[str]:
    """None when this call can take the Triton path, else why not."""
    w = m.weight
    if w is None or w.dtype not in FP8_DTYPES:
        return "weight is no longer fp8"
    if type(x) is not torch.Tensor:
        return "input is not a plain tensor"
    if w.device != x.device or (m.bias is not None and m.bias.device != x.device):
        return "weights not on the compute device (offloaded)"
    if x.device.type == "cpu":
        if not cfg.allow_cpu:
            return "CPU tensors (set TRITONKIT_FORCE_TRITON_ON_CPU=1 to use the Triton interpreter)"
    elif x.device.type != "cuda":
        return f"{x.device.type} tensors"
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"{x.dtype} activations"
    return None


def _decode(t, dtype, scale=None):
    from ..kernels.fp8 import decode_op
    return decode_op(t, dtype, scale)


def _cast_bias(m, dtype):
    b = m.bias
    if b is None:
        return None
    b = _decode(b, dtype) if b.dtype in FP8_DTYPES else b.to(dtype)
    for f in m.bias_function:
        b = f(b)
    return b


def _cast_weight(m, dtype):
    """ComfyUI's cast_bias_weight for the weight, with our decode instead of ``.to(dtype)``."""
    scale = getattr(m, "scale_weight", None)
    if len(m.weight_function) > 0:
        w = _decode(m.weight, dtype)
        for f in m.weight_function:
            w = f(w)
        if scale is not None:  # scaled fp8: weight functions see the unscaled weight, as in ComfyUI
            w = w * scale.to(device=w.device, dtype=w.dtype)
        return w
    return _decode(m.weight, dtype, scale)


def _fused_ok(m, x, cfg: LayerConfig) -> bool:
    if not cfg.fused or len(m.weight_function) > 0 or len(m.bias_function) > 0:
        return False
    if x.device.type == "cpu":
        return True
    if cfg.fused_max_tokens is not None and x.numel() // max(1, x.shape[-1]) > cfg.fused_max_tokens:
        return False
    if x.dtype == torch.float16:
        return True
    return x.dtype == torch.bfloat16 and (cfg.arch is None or cfg.arch >= 80)


def _forward(m, orig, cfg: LayerConfig, rms_norm, x, *args, **kwargs):
    if cfg.compile_native and torch.compiler.is_compiling():
        # auto on sm89+: Inductor compiles ComfyUI's own fp8 cast there (fp8e4nv is native) and
        # that measured faster than calling our decode op from the compiled graph (Flux-dev on an
        # H200: 0.137 vs 0.144 s/step); eager calls keep our decode, which beats torch's cast
        return orig(m, x, *args, **kwargs)
    why = _eligible(m, x, cfg)
    if why is not None:
        _fallback(cfg.name, why)
        return orig(m, x, *args, **kwargs)
    dtype = x.dtype
    F = torch.nn.functional
    if cfg.kind == "linear":
        if _fused_ok(m, x, cfg):
            from ..kernels.fp8_linear import linear_op
            b = m.bias
            if b is not None and b.dtype not in FP8_DTYPES:
                b = b.to(dtype)
            _record(cfg.name, "fused-linear")
            return linear_op(x, m.weight, b, getattr(m, "scale_weight", None))
        _record(cfg.name, "decode")
        return F.linear(x, _cast_weight(m, dtype), _cast_bias(m, dtype))
    _record(cfg.name, "decode")
    w, b = _cast_weight(m, dtype), _cast_bias(m, dtype)
    if cfg.kind == "conv":
        return m._conv_forward(x, w, b)
    if cfg.kind == "groupnorm":
        return F.group_norm(x, m.num_groups, w, b, m.eps)
    if cfg.kind == "layernorm":
        return F.layer_norm(x, m.normalized_shape, w, b, m.eps)
    return rms_norm(x, w, m.eps)


def make_forward(module, cfg: LayerConfig, rms_norm=None):
    """The replacement for ``module.forward_comfy_cast_weights`` (an instance attribute, so
    a plain function). The class's own method stays the fallback."""
    orig = type(module).forward_comfy_cast_weights

    def forward_comfy_cast_weights(x, *args, **kwargs):
        return _forward(module, orig, cfg, rms_norm, x, *args, **kwargs)

    forward_comfy_cast_weights.tritonkit_fp8 = cfg
    return forward_comfy_cast_weights


# ----------------------------------------------------------------------------- planning
@dataclass
class Plan:
    mode: str
    arch: Optional[int]
    device: str
    compute_dtype: Optional[torch.dtype]
    fast_fp8: bool
    layers: dict = field(default_factory=dict)     # name -> LayerConfig
    predecode: dict = field(default_factory=dict)  # param name -> (param, dtype)
    predecoded_biases: int = 0                     # how many of those are biases of patched layers
    skipped: dict = field(default_factory=dict)    # reason -> [names]
    notes: list = field(default_factory=list)

    @property
    def active(self) -> bool:
        return bool(self.layers or self.predecode)


def _kind(m) -> Optional[str]:
    import comfy.rmsnorm
    if isinstance(m, torch.nn.Linear):
        return "linear"
    if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
        return "conv"
    if isinstance(m, torch.nn.GroupNorm):
        return "groupnorm"
    if isinstance(m, torch.nn.LayerNorm):
        return "layernorm"
    rms = tuple(c for c in (getattr(torch.nn, "RMSNorm", None), comfy.rmsnorm.RMSNorm) if isinstance(c, type))
    if rms and isinstance(m, rms):
        return "rmsnorm"
    return None


def _plain_fp8(t) -> bool:
    return isinstance(t, torch.Tensor) and type(t) in (torch.Tensor, torch.nn.Parameter) and t.dtype in FP8_DTYPES


def plan_model(model, mode: str = "auto") -> Plan:
    """Which fp8 layers of ``model`` (a ComfyUI ModelPatcher) take which path."""
    import comfy.ops

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    base = model.model
    config = getattr(base, "model_config", None)
    fast = bool(getattr(config, "optimizations", {}).get("fp8", False))
    device = torch.device(model.load_device)
    arch = effective_arch(device)
    allow_cpu = force_triton_on_cpu()
    plan = Plan(mode=mode, arch=arch, device=str(device), compute_dtype=getattr(base, "manual_cast_dtype", None),
                fast_fp8=fast)
    if mode == "off":
        return plan
    if device.type == "cpu" and not allow_cpu:
        plan.notes.append("the model runs on the CPU: torch's cast is kept (set TRITONKIT_FORCE_TRITON_ON_CPU=1 "
                          "to run the Triton kernels through the interpreter)")
        return plan
    if device.type not in ("cuda", "cpu"):
        plan.notes.append(f"the model runs on {device.type}: torch's cast is kept")
        return plan

    dm = model.get_model_object("diffusion_model")
    native_fp8_mm = arch is not None and arch >= 89 and fast
    compile_native = mode == "auto" and device.type == "cuda" and arch is not None and arch >= 89
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 0
    op_params = set()
    for name, m in dm.named_modules():
        if not isinstance(m, comfy.ops.CastWeightBiasOp):
            continue
        w = getattr(m, "weight", None)
        if not _plain_fp8(w):
            q = getattr(w, "_qdata", None)  # ComfyUI's QuantizedTensor (mixed-precision checkpoints)
            if isinstance(q, torch.Tensor) and q.dtype in FP8_DTYPES:
                plan.skipped.setdefault("QuantizedTensor (mixed-precision) layers are not handled", []).append(name)
            continue
        op_params.add(f"{name}.weight")
        op_params.add(f"{name}.bias")
        kind = _kind(m)
        if kind is None:
            plan.skipped.setdefault(f"{type(m).__name__} layers are not handled", []).append(name)
            continue
        if kind == "linear" and native_fp8_mm and mode == "auto" and (
                isinstance(m, comfy.ops.fp8_ops.Linear) or getattr(m, "scale_weight", None) is not None):
            plan.skipped.setdefault("native fp8 matmul (torch._scaled_mm) kept", []).append(name)
            continue
        fused = kind == "linear" and mode in ("auto", "fused-linear")
        limit = None
        if fused and mode == "auto" and device.type == "cuda":
            fused = w.shape[0] >= FUSED_MIN_FEATURES_PER_SM * sm_count
            limit = FUSED_MAX_TOKENS
        plan.layers[name] = LayerConfig(name=name, kind=kind, fused=fused, fused_max_tokens=limit, arch=arch,
                                        allow_cpu=allow_cpu, compile_native=compile_native)

    dtype = plan.compute_dtype or torch.float32
    for name in plan.layers:
        b = model.get_model_object(f"diffusion_model.{name}.bias")
        if _plain_fp8(b) and b.numel() <= PREDECODE_MAX_NUMEL:
            plan.predecode[f"{name}.bias"] = (b, dtype)
            plan.predecoded_biases += 1
    for pname, _ in dm.named_parameters():
        if pname in op_params:
            continue
        # the original, even while another clone's patches are applied (ComfyUI keeps models loaded)
        p = model.get_model_object(f"diffusion_model.{pname}")
        if not _plain_fp8(p):
            continue
        if p.numel() <= PREDECODE_MAX_NUMEL:
            plan.predecode[pname] = (p, dtype)
        else:
            plan.skipped.setdefault("large fp8 parameters outside ComfyUI ops", []).append(pname)

    if fast and arch is not None and arch < 89:
        plan.notes.append(f"fp8_e4m3fn_fast: no native fp8 matmul on sm{arch}; its Linear layers use the fused "
                          "W8A16 linear where it is faster (auto: few tokens on wide layers), else the Triton decode + "
                          "torch's matmul" if mode != "cast-only" else
                          f"fp8_e4m3fn_fast: no native fp8 matmul on sm{arch}; cast-only decodes its weights")
    if compile_native and plan.layers:
        plan.notes.append(f"under TorchCompileModel, sm{arch} compiles ComfyUI's own fp8 cast natively, which "
                          "measured faster there: compiled graphs keep it; eager calls use the Triton decode")
    if arch == 75:
        plan.notes.append("sm75 has no bf16 tensor cores: the fused linear runs for fp16 activations only, "
                          "bf16 layers decode then use torch's matmul")
    return plan


def _predecoded(p: torch.Tensor, dtype: torch.dtype, use_triton: bool) -> torch.nn.Parameter:
    if use_triton:
        from ..kernels.fp8 import decode
        v = decode(p.detach(), dtype)
    else:
        v = p.detach().to(dtype)  # same values, bit for bit (every fp8 value is exact in fp16/bf16/fp32)
    return torch.nn.Parameter(v, requires_grad=False)


def apply_plan(model, plan: Plan) -> None:
    """Adds the object patches of ``plan`` to ``model`` (a clone) and the per-run summary."""
    import comfy.patcher_extension
    import comfy.rmsnorm

    dm = model.get_model_object("diffusion_model")
    for name, cfg in plan.layers.items():
        mod = dm.get_submodule(name)
        model.add_object_patch(f"diffusion_model.{name}.forward_comfy_cast_weights",
                               make_forward(mod, cfg, comfy.rmsnorm.rms_norm))
    for pname, (p, dtype) in plan.predecode.items():
        use_triton = p.device.type == "cuda" or force_triton_on_cpu()
        model.add_object_patch(f"diffusion_model.{pname}", _predecoded(p, dtype, use_triton))
    if plan.active:
        model.remove_wrappers_with_key(comfy.patcher_extension.WrappersMP.OUTER_SAMPLE, WRAPPER_KEY)
        model.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.OUTER_SAMPLE, WRAPPER_KEY,
                                   _make_summary_wrapper(len(plan.layers)))


def _make_summary_wrapper(n_layers: int):
    def outer_sample(executor, *args, **kwargs):
        STATS.reset()
        try:
            return executor(*args, **kwargs)
        finally:
            log.info("TritonKit fp8: %s", run_summary(n_layers))
    return outer_sample


def run_summary(n_layers: int) -> str:
    paths = collections.Counter(STATS.layers.values())
    launches = STATS.launches()
    parts = [f"{len(STATS.layers)}/{n_layers} patched fp8 layers ran through Triton"
             + (f" ({', '.join(f'{k} {v}' for k, v in sorted(paths.items()))})" if paths else "")]
    parts.append("kernel launches: " + (", ".join(f"{k} {v}" for k, v in sorted(launches.items())) or "none"))
    if STATS.fallbacks:
        parts.append("torch fallbacks: " + "; ".join(f"{r} x{n}" for r, n in STATS.fallbacks.most_common()))
    else:
        parts.append("torch fallbacks: none")
    return "; ".join(parts)


def describe(plan: Plan) -> str:
    where = f"sm{plan.arch}" if plan.arch is not None else plan.device
    if arch_forced():
        where += f" (forced by {ARCH_ENV})"
    lines = [f"Triton fp8 Fallback: {plan.mode} on {where}"]
    if plan.mode == "off":
        lines.append("off: the model is returned unchanged (torch's casts)")
    kinds = collections.Counter(("fused W8A16 linear" + (f" (<= {c.fused_max_tokens} tokens, else decode)"
                                                          if c.fused_max_tokens else "")
                                 if c.fused else f"Triton decode ({c.kind})") for c in plan.layers.values())
    if plan.layers:
        lines.append(f"{len(plan.layers)} fp8 layers patched: " + ", ".join(f"{n} -> {k}" for k, n in kinds.most_common()))
    if plan.predecode:
        dt = str(next(iter(plan.predecode.values()))[1]).replace("torch.", "")
        other = len(plan.predecode) - plan.predecoded_biases
        what = ([f"{plan.predecoded_biases} fp8 biases of those layers"] if plan.predecoded_biases else []) + \
               ([f"{other} small fp8 parameters outside ComfyUI ops"] if other else [])
        lines.append(" and ".join(what) + f" decoded once to {dt}")
    for reason, names in plan.skipped.items():
        lines.append(f"left on torch: {len(names)} ({reason})")
    lines.extend(plan.notes)
    if plan.mode != "off" and not plan.active and not plan.notes:
        lines.append("no fp8 weights found in the diffusion model: nothing to do")
    return "\n".join(lines)


def patch_model(model, mode: str = "auto"):
    """(patched clone or the model itself, report text)."""
    if mode != "off":
        try:
            from ..kernels import fp8, fp8_linear  # noqa: F401  (Triton and the custom ops)
        except Exception as e:  # a broken Triton install: the self-test node says why and how to fix it
            text = (f"Triton fp8 Fallback: {mode}: the Triton kernels could not be loaded ({type(e).__name__}: {e}); "
                    "the model is returned unchanged (torch's casts). Run the Triton Self-Test node for the cause.")
            log_once("import-error", text, logging.WARNING)
            return model, text
    plan = plan_model(model, mode)
    text = describe(plan)
    if not plan.active:
        log_once("report:" + text, text.replace("\n", "; "))
        return model, text
    clone = model.clone()
    apply_plan(clone, plan)
    log.info("%s", text.replace("\n", "; "))
    return clone, text


class TritonFp8Fallback:
    CATEGORY = "TritonKit"
    FUNCTION = "patch"
    RETURN_TYPES = ("MODEL",)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("The model with its fp8 weights going through the Triton kernels (a patched clone).",)
    DESCRIPTION = ("Makes the fp8 weights of the diffusion model go through Triton kernels instead of torch's cast: "
                   "a fused fp8-weight linear for Linear layers and a bit-exact decode elsewhere. Needed for "
                   "TorchCompileModel on fp8 models below sm89 with official Triton, and faster than torch's cast "
                   "on every GPU. Per model, reversible (bypass the node), keeps LoRA and offloading working.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": ("MODEL",),
            "mode": (list(MODES), {"default": "auto", "tooltip":
                     "auto: every fp8 layer through Triton: the decode then torch's op, and for Linear layers the "
                     "fused fp8-weight linear where it measured faster (<= 16 tokens on wide layers); on sm89+ a checkpoint loaded as fp8_e4m3fn_fast keeps torch's native fp8 "
                     "matmul; under TorchCompileModel on sm89+ the compiled graph keeps Inductor's native fp8 cast, which measured "
                     "as fast or faster. fused-linear: the fused linear for every Linear, native fp8 ones included. "
                     "cast-only: only replace the cast (decode, then torch's matmul). off: unchanged."}),
        }}

    def patch(self, model, mode="auto"):
        out, text = patch_model(model, mode)
        return {"ui": {"text": [text]}, "result": (out,)}


NODE_CLASS_MAPPINGS = {"TritonKitFp8Fallback": TritonFp8Fallback}
NODE_DISPLAY_NAME_MAPPINGS = {"TritonKitFp8Fallback": "Triton fp8 Fallback"}
