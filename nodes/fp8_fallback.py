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
  and the fp8 biases of the patched layers are decoded once, here, to the compute dtype on the
  load device (an object patch of the parameter): a bias is a few KB, and decoding it on every call was half of
  the kernel launches of a Flux step (bench/workflow.py).

ComfyUI 0.8+ loads scaled-fp8 files (``convert_old_quants``) and files with per-layer
``comfy_quant`` metadata as comfy-kitchen ``QuantizedTensor`` weights under
``mixed_precision_ops`` (the scale inside the tensor). Their fp8 layouts (e4m3fn, e5m2; one scale
per tensor) are served the same way: ``fp8_decode`` with the scale folded in, rounded exactly as
ComfyUI's own ``dequantize()`` rounds on this device (comfy-kitchen's eager backend rounds the
scale to the compute dtype first, its CUDA/Triton backends multiply in fp32: the node checks which,
once per device and format, on all 256 codes), so the weight (and what LoRA weight functions
see) is ComfyUI's bit for bit; the fused linear takes the same scale. On a GPU with fp8 compute
ComfyUI runs these layers on comfy-kitchen's fp8 matmul: ``auto`` keeps that on sm89+, the other
modes (and an arch forced below sm89) move the clone's layers to the full-precision path
(an object patch of ``_full_precision_mm``) and serve them. An ``input_scale`` is used only by
that fp8 matmul, as in ComfyUI. Layouts it can't serve (nvfp4, unknown ones, transposed or padded
storage) and corrupt scales (NaN, inf, <= 0, not one value) stay on ComfyUI's path, listed by
reason and logged once.

Both ops are opaque custom ops, so under ``torch.compile`` Inductor calls them and never emits
code that reads an fp8 tensor. On a GPU with native fp8 (sm89+, not forced lower) ``auto`` leaves
the compiled graph to ComfyUI's own cast, which Inductor compiles natively there and which
measured as fast or faster; eager calls keep the Triton decode. A QuantizedTensor layer's
dequantize is written there in torch operations with ComfyUI's rounding (``_traced_dequant_linear``),
since ComfyUI's goes through comfy-kitchen's custom op, whose calls cost the compiled graph 0.14-0.34 ms
of host time each. Patches live on the clone only (ModelPatcher applies object
patches when it loads the model and restores the originals when it unloads), so bypassing or
deleting the node restores ComfyUI's behaviour. Per call, a layer falls back to ComfyUI's own
forward when its weights are not on the compute device (offloaded/lowvram weights on the CPU),
for CPU tensors (unless ``TRITONKIT_FORCE_TRITON_ON_CPU=1``), or for unsupported dtypes; each
reason is logged once. ``comfy.model_management.cast_to`` is never patched (ComfyUI's hook
breaker restores it).
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
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


# Both take the layer's config, not its name: reading ``cfg.name`` while Dynamo traces would guard
# the graph on it, and a regional compile (one graph per block class, nodes/compile_model.py) would
# then recompile for every block (seen on an H100: Flux hit the recompile limit of 16).
def _record(cfg: "LayerConfig", path: str) -> None:
    if not torch.compiler.is_compiling():
        STATS.layers[cfg.name] = path


def _fallback(cfg: "LayerConfig", reason: str) -> None:
    if not torch.compiler.is_compiling():
        STATS.fallbacks[reason] += 1
        log_once("fallback:" + reason, f"{reason}: those calls use ComfyUI's torch cast (first seen on {cfg.name})")


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
    # ComfyUI 0.8+ QuantizedTensor weight: ((compute dtype, round_scale), ...) as probed from
    # ComfyUI's own dequantize on this device (round_scale None: no rounding of ours matches)
    quant: Optional[tuple] = None
    calibrate: bool = False     # auto: torch / decode / fused measured per shape (nodes/calibration.py)
    traced_dequant: bool = False  # compile_native QuantizedTensor linear: see _traced_dequant_linear


def _eligible(m, x, cfg: LayerConfig) -> Optional[str]:
    """None when this call can take the Triton path, else why not."""
    w = m.weight
    if cfg.quant is not None:
        if not _is_quantized(w):
            return "weight is no longer a QuantizedTensor"
        w = w._qdata
    if w is None or w.dtype not in FP8_DTYPES:
        return "weight is no longer fp8"
    if type(x) is not torch.Tensor:
        return "input is not a plain tensor"
    if w.device != x.device:
        return "weights not on the compute device (offloaded)"
    # Only fp8 tensors have to be where the decode runs. A bias that is already decoded (the node's
    # own, decoded once; a QuantizedTensor layer's) is moved to the activations as ComfyUI's
    # cast_bias_weight moves it. Falling back for it handed ComfyUI's fp8 cast of the weight to
    # compiled graphs: fp8e4nv code below sm89 (seen on an H100, see apply_plan).
    if m.bias is not None and m.bias.device != x.device and m.bias.dtype in FP8_DTYPES:
        return "fp8 bias not on the compute device (offloaded)"
    if x.device.type == "cpu":
        if not cfg.allow_cpu:
            return "CPU tensors (set TRITONKIT_FORCE_TRITON_ON_CPU=1 to use the Triton interpreter)"
    elif x.device.type != "cuda":
        return f"{x.device.type} tensors"
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"{x.dtype} activations"
    if cfg.quant is not None and dict(cfg.quant).get(x.dtype) is None:
        return (f"ComfyUI's dequantize to {x.dtype} on this device rounds in a way the Triton decode does not "
                "reproduce")
    return None


def _decode(t, dtype, scale=None, round_scale=False):
    from ..kernels.fp8 import decode_op
    return decode_op(t, dtype, scale, round_scale)


def _cast_bias(m, dtype, device):
    b = m.bias
    if b is None:
        return None
    b = _decode(b, dtype) if b.dtype in FP8_DTYPES else b.to(device=device, dtype=dtype)
    for f in m.bias_function:
        b = f(b)
    return b


def _cast_weight(m, dtype, cfg: Optional["LayerConfig"] = None):
    """ComfyUI's cast_bias_weight for the weight, with our decode instead of ``.to(dtype)``."""
    if cfg is not None and cfg.quant is not None:
        # ComfyUI 0.8+: weight.dequantize() (the scale inside, rounded as ComfyUI rounds it), then
        # the weight functions see the dequantized weight
        w = _decode(m.weight._qdata, dtype, m.weight._params.scale, dict(cfg.quant)[dtype])
        for f in m.weight_function:
            w = f(w)
        return w
    scale = getattr(m, "scale_weight", None)
    if len(m.weight_function) > 0:
        w = _decode(m.weight, dtype)
        for f in m.weight_function:
            w = f(w)
        if scale is not None:  # scaled fp8: weight functions see the unscaled weight, as in ComfyUI
            w = w * scale.to(device=w.device, dtype=w.dtype)
        return w
    return _decode(m.weight, dtype, scale)


def _fused_possible(m, x, cfg: LayerConfig) -> bool:
    if len(m.weight_function) > 0 or len(m.bias_function) > 0:
        return False
    if x.device.type == "cpu" or x.dtype == torch.float16:
        return True
    return x.dtype == torch.bfloat16 and (cfg.arch is None or cfg.arch >= 80)


def _fused_ok(m, x, cfg: LayerConfig) -> bool:
    if not cfg.fused or not _fused_possible(m, x, cfg):
        return False
    if x.device.type == "cpu":
        return True
    return cfg.fused_max_tokens is None or x.numel() // max(1, x.shape[-1]) <= cfg.fused_max_tokens


def _fused_linear(m, x, dtype, cfg: LayerConfig):
    from ..kernels.fp8_linear import linear_op
    b = m.bias
    if b is not None and b.dtype not in FP8_DTYPES:
        b = b.to(device=x.device, dtype=dtype)
    if cfg.quant is not None:
        w, scale = m.weight._qdata, m.weight._params.scale
        if dict(cfg.quant)[dtype]:
            scale = scale.to(dtype)  # the scale ComfyUI's dequantize multiplies by
        return linear_op(x, w, b, scale)
    return linear_op(x, m.weight, b, getattr(m, "scale_weight", None))


def _calibrated_path(m, orig, cfg: LayerConfig, x, args, kwargs) -> str:
    """auto: 'torch' / 'decode' / 'fused', measured once per layer shape and token bucket."""
    from . import calibration as calib
    dtype = x.dtype
    default = "fused" if _fused_ok(m, x, cfg) else "decode"
    runs = {"decode": lambda: torch.nn.functional.linear(x, _cast_weight(m, dtype, cfg),
                                                         _cast_bias(m, dtype, x.device))}
    if cfg.arch is None or cfg.arch >= 89:
        # below sm89 ComfyUI's own cast is what TorchCompileModel turns into fp8e4nv code that Triton
        # refuses (seen: an H100 @86 picked it for one shape class, 1 of 33 Inductor kernels fp8e4nv)
        runs["torch"] = lambda: orig(m, x, *args, **kwargs)
    if _fused_possible(m, x, cfg):
        runs["fused"] = lambda: _fused_linear(m, x, dtype, cfg)
    return calib.fp8_linear_path(m, x, default, runs, cfg.arch)


def _traced_dequant_linear(m, x, cfg: LayerConfig):
    """A QuantizedTensor layer's linear under torch.compile on sm89+ (``compile_native``): ComfyUI's
    ``weight.dequantize()`` written as torch operations, rounded as ComfyUI's rounds on this device
    (``cfg.quant``), which Inductor fuses into one kernel of its own. ComfyUI's own path calls
    comfy-kitchen's ``dequantize_fp8`` custom op from the compiled graph, and each such call picks
    its backend in Python: 0.14-0.34 ms of host time per layer (an H100's profile, Flux-dev, ComfyUI
    0.8.0), where the GPU runs the decode in 0.05."""
    from ..kernels.fp8 import decode_reference
    dtype = x.dtype
    w = decode_reference(m.weight._qdata, dtype, m.weight._params.scale, dict(cfg.quant)[dtype])
    return torch.nn.functional.linear(x, w, _cast_bias(m, dtype, x.device))


TRACED_DEQUANT_ENV = "TRITONKIT_TRACED_DEQUANT"  # 0: compiled graphs call ComfyUI's dequantize (as before)


def _traced_dequant_on() -> bool:
    return os.environ.get(TRACED_DEQUANT_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _forward(m, orig, cfg: LayerConfig, rms_norm, x, *args, **kwargs):
    if cfg.compile_native and torch.compiler.is_compiling():
        # auto on sm89+: Inductor compiles ComfyUI's own fp8 cast there (fp8e4nv is native) and
        # that measured faster than calling our decode op from the compiled graph (Flux-dev on an
        # H200: 0.137 vs 0.144 s/step); eager calls keep our decode, which beats torch's cast
        if (cfg.traced_dequant and len(m.weight_function) == 0 and len(m.bias_function) == 0
                and _eligible(m, x, cfg) is None):
            return _traced_dequant_linear(m, x, cfg)
        return orig(m, x, *args, **kwargs)
    why = _eligible(m, x, cfg)
    if why is not None:
        _fallback(cfg, why)
        return orig(m, x, *args, **kwargs)
    dtype = x.dtype
    F = torch.nn.functional
    if cfg.kind == "linear":
        path = _calibrated_path(m, orig, cfg, x, args, kwargs) if cfg.calibrate else (
            "fused" if _fused_ok(m, x, cfg) else "decode")
        if path == "torch":
            _record(cfg, "torch (measured faster)")
            return orig(m, x, *args, **kwargs)
        if path == "fused":
            _record(cfg, "fused-linear")
            return _fused_linear(m, x, dtype, cfg)
        _record(cfg, "decode")
        return F.linear(x, _cast_weight(m, dtype, cfg), _cast_bias(m, dtype, x.device))
    _record(cfg, "decode")
    w, b = _cast_weight(m, dtype, cfg), _cast_bias(m, dtype, x.device)
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


# ----------------------------------------------------------------------------- ComfyUI 0.8+ QuantizedTensor
# ComfyUI 0.8 loads scaled-fp8 files (convert_old_quants) and files with per-layer ``comfy_quant``
# metadata under comfy.ops.mixed_precision_ops: the Linear weight is a comfy-kitchen
# QuantizedTensor (fp8 storage in ``_qdata``, the per-tensor scale in ``_params.scale``,
# ``_params.orig_dtype`` the compute dtype). Below sm89 ComfyUI disables its fp8 formats and
# every forward goes cast_bias_weight -> ``weight.dequantize()``; that is what the node replaces.
PROBE_SCALES = (0.0370001, 1 / 3, 7.1234567, 1.37e-3)  # values that round differently in fp16/bf16
_ROUNDING: dict = {}


def _is_quantized(t) -> bool:
    """A comfy-kitchen QuantizedTensor (ComfyUI 0.8+)."""
    return isinstance(t, torch.Tensor) and hasattr(t, "_qdata") and hasattr(t, "_params") and hasattr(t, "_layout_cls")


def quantized_problem(w) -> Optional[str]:
    """None when the QuantizedTensor ``w`` is a per-tensor fp8 layout the Triton decode computes
    exactly as ComfyUI does, else why not (the reason a layer stays on ComfyUI's path)."""
    if not _is_quantized(w):
        return "QuantizedTensor layers of ComfyUI before 0.8 (no comfy-kitchen) are not handled"
    name = w._layout_cls
    try:
        from comfy_kitchen.tensor import TensorCoreFP8Layout
        layout = w.layout_cls
    except ImportError as e:
        return f"comfy-kitchen does not import ({e})"
    except Exception:
        return f"unknown quantized layout {name!r}"
    if not (isinstance(layout, type) and issubclass(layout, TensorCoreFP8Layout)) or \
            getattr(layout.dequantize, "__func__", None) is not TensorCoreFP8Layout.dequantize.__func__:
        return f"{name} layout: no Triton kernel for it"
    q, p = w._qdata, w._params
    if q.dtype not in FP8_DTYPES:
        return f"{name} layout with {str(q.dtype).replace('torch.', '')} storage (not fp8)"
    if getattr(p, "transposed", False) or q.dim() != 2 or tuple(q.shape) != tuple(p.orig_shape):
        return f"{name} layout with a transposed or padded storage"
    if getattr(p, "orig_dtype", None) not in (torch.float16, torch.bfloat16, torch.float32):
        return f"{name} layout with compute dtype {getattr(p, 'orig_dtype', None)}"
    s = getattr(p, "scale", None)
    if not isinstance(s, torch.Tensor) or not s.dtype.is_floating_point:
        return "weight scale missing or not a float tensor"
    if s.numel() != 1:
        return f"weight scale of shape {tuple(s.shape)} (a per-tensor fp8 scale has 1 value)"
    if s.device.type == "meta":
        return "weight scale on the meta device"
    v = float(s.detach().reshape(()).float().cpu())
    if not math.isfinite(v) or v <= 0:
        return "corrupt weight scale (NaN, inf, zero or negative)"
    return None


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns, NaN payloads aside."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.reshape(-1).cpu(), b.reshape(-1).cpu()
    nan = torch.isnan(a)
    if not torch.equal(nan, torch.isnan(b)):
        return False
    view = torch.int32 if a.dtype == torch.float32 else torch.int16
    return torch.equal(a[~nan].view(view), b[~nan].view(view))


def comfy_dequant_rounding(w, device) -> tuple:
    """How ComfyUI's own ``dequantize()`` of ``w``'s layout rounds on ``device``, per compute
    dtype: ((dtype, round_scale), ...) with round_scale True (the scale rounded to the dtype first:
    comfy-kitchen's eager backend, ``x.to(dtype) * scale.to(dtype)``), False (one fp32 multiply,
    then one rounding: its CUDA/Triton backends) or None (neither: those calls stay on ComfyUI's
    path). Measured once per (device, layout, fp8 format) on all 256 codes times a few scales."""
    from ..kernels.fp8 import decode_reference
    key = (str(device), w._layout_cls, w._qdata.dtype)
    if key in _ROUNDING:
        return _ROUNDING[key]
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(w._qdata.dtype).reshape(16, 16).to(device)
    out = []
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        verdict = None
        try:
            got = []
            for sv in PROBE_SCALES:
                sc = torch.tensor(sv, dtype=torch.float32, device=device)
                params = dataclasses.replace(w._params, scale=sc, orig_dtype=dt, orig_shape=(16, 16))
                got.append((sc, type(w)(codes, w._layout_cls, params).dequantize()))
            for rs in (True, False):
                if all(_same_bits(g, decode_reference(codes, dt, sc, round_scale=rs)) for sc, g in got):
                    verdict = rs
                    break
        except Exception as e:  # a layout/backend that can't dequantize this probe: ComfyUI's path
            log_once(f"probe:{key}:{dt}", f"could not check how ComfyUI dequantizes {w._layout_cls} to {dt} "
                     f"({type(e).__name__}: {e}); those calls stay on ComfyUI's path", logging.WARNING)
        out.append((dt, verdict))
    _ROUNDING[key] = tuple(out)
    return _ROUNDING[key]


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
    quantized: collections.Counter = field(default_factory=collections.Counter)  # served QuantizedTensor layers by format
    full_precision: list = field(default_factory=list)  # QuantizedTensor layers moved off comfy-kitchen's fp8 matmul
    input_scaled: int = 0                           # served layers that also carry an input_scale

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


def _skip(plan: Plan, reason: str, name: str, level: int = logging.INFO) -> None:
    names = plan.skipped.setdefault(reason, [])
    names.append(name)
    if len(names) == 1:
        log_once("skip:" + reason, f"{reason}: {name} (and any other such layer) stays on ComfyUI's path", level)


def _plan_quantized(plan: Plan, name: str, m, w, device, mode: str, arch: Optional[int]):
    """(the LayerConfig.quant of a QuantizedTensor layer we serve, None) or (None, why not)."""
    why = quantized_problem(w)
    if why is None and not (isinstance(m, torch.nn.Linear) or hasattr(m, "in_features")):
        why = f"QuantizedTensor weights in {type(m).__name__} layers are not handled"
    if why is not None:
        return None, why
    native = not getattr(m, "_full_precision_mm", True)
    if native and mode == "auto" and device.type == "cuda" and arch is not None and arch >= 89:
        return None, "native fp8 matmul (comfy-kitchen's QuantizedTensor linear) kept"
    try:
        rounding = comfy_dequant_rounding(w, device)
    except Exception as e:  # ComfyUI's own dequantize fails on the probe: leave the layer to it
        return None, f"ComfyUI's dequantize could not be checked ({type(e).__name__}: {e})"
    if all(rs is None for _, rs in rounding):
        return None, (f"ComfyUI's dequantize of {w._layout_cls} on {device} matches no rounding the Triton "
                      "decode implements")
    if native:
        # comfy-kitchen's fp8 matmul path (fp8 compute: sm89+, or an arch forced lower on one):
        # the layer's forward only reaches forward_comfy_cast_weights on the full-precision path
        plan.full_precision.append(name)
    plan.quantized[str(w._qdata.dtype).replace("torch.float8_", "")] += 1
    if isinstance(getattr(m, "input_scale", None), torch.Tensor):
        plan.input_scaled += 1
    return rounding, None


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
    no_tc = None
    if arch is not None and arch < 80:  # a real sm75, or one simulated by TRITONKIT_FORCE_ARCH
        try:
            from ..kernels.arch_probe import no_tensor_cores_reason
            no_tc = no_tensor_cores_reason(arch)
        except ImportError:  # no usable Triton: the layers' own fallbacks say so
            pass
    op_params = set()
    for name, m in dm.named_modules():
        if not isinstance(m, comfy.ops.CastWeightBiasOp):
            continue
        w = getattr(m, "weight", None)
        quant = None
        if not _plain_fp8(w):
            if not (isinstance(w, torch.Tensor) and (hasattr(w, "_qdata") or hasattr(w, "_layout_type"))):
                continue
            # ComfyUI's QuantizedTensor (0.8+: scaled-fp8 and comfy_quant checkpoints)
            quant, why = _plan_quantized(plan, name, m, w, device, mode, arch)
            if why is not None:
                _skip(plan, why, name, logging.WARNING if "corrupt" in why or "unknown" in why else logging.INFO)
                continue
        op_params.add(f"{name}.weight")
        op_params.add(f"{name}.bias")
        kind = "linear" if quant is not None else _kind(m)
        if kind is None:
            plan.skipped.setdefault(f"{type(m).__name__} layers are not handled", []).append(name)
            continue
        if kind == "linear" and native_fp8_mm and mode == "auto" and (
                isinstance(m, comfy.ops.fp8_ops.Linear) or getattr(m, "scale_weight", None) is not None):
            plan.skipped.setdefault("native fp8 matmul (torch._scaled_mm) kept", []).append(name)
            continue
        fused = kind == "linear" and mode in ("auto", "fused-linear") and no_tc is None
        limit = None
        if fused and mode == "auto" and device.type == "cuda":
            fused = w.shape[0] >= FUSED_MIN_FEATURES_PER_SM * sm_count
            limit = FUSED_MAX_TOKENS
        plan.layers[name] = LayerConfig(name=name, kind=kind, fused=fused, fused_max_tokens=limit, arch=arch,
                                        allow_cpu=allow_cpu, compile_native=compile_native, quant=quant,
                                        calibrate=kind == "linear" and mode == "auto",
                                        traced_dequant=compile_native and quant is not None and kind == "linear"
                                        and _traced_dequant_on())

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
        if any(c.traced_dequant for c in plan.layers.values()):
            plan.notes.append("compiled graphs dequantize the QuantizedTensor layers in Inductor's own kernel, rounded as "
                              f"ComfyUI rounds, not through comfy-kitchen's op ({TRACED_DEQUANT_ENV}=0 keeps the op)")
    if no_tc is not None and plan.layers:
        plan.notes.append(f"{no_tc}: no fused linear, the layers decode then use torch's matmul")
    elif arch == 75:
        plan.notes.append("sm75 has no bf16 tensor cores: the fused linear runs for fp16 activations only, "
                          "bf16 layers decode then use torch's matmul")
    return plan


def _predecoded(p: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.nn.Parameter:
    """``p`` decoded to ``dtype`` on ``device``, the device the model runs on."""
    v = p.detach().to(device)
    if device.type == "cuda" or force_triton_on_cpu():
        from ..kernels.fp8 import decode
        v = decode(v, dtype)
    else:
        v = v.to(dtype)  # same values, bit for bit (every fp8 value is exact in fp16/bf16/fp32)
    return torch.nn.Parameter(v, requires_grad=False)


def decode_variants(plan: Plan, dm) -> set:
    """The decode launches the patched layers' weights make without weight functions (LoRA), as
    kernels/fp8.py's warm_decode takes them: (fp8 dtype, compute dtype, per-tensor scale?, round_scale?,
    numel a multiple of 16?). Per-row scales are left out (their row length specializes the kernel too)."""
    dtype = plan.compute_dtype
    out: set = set()
    if dtype is None:
        return out
    for name, cfg in plan.layers.items():
        m = dm.get_submodule(name)
        w = getattr(m, "weight", None)
        if cfg.quant is not None:
            codes, scale, rs = w._qdata, w._params.scale, dict(cfg.quant).get(dtype)
        else:
            codes, scale, rs = w, getattr(m, "scale_weight", None), False
        if not isinstance(codes, torch.Tensor) or codes.dtype not in FP8_DTYPES:
            continue
        if scale is not None and (not isinstance(scale, torch.Tensor) or scale.numel() != 1):
            continue
        out.add((codes.dtype, dtype, scale is not None, bool(rs) and scale is not None, codes.numel() % 16 == 0))
    return out


def apply_plan(model, plan: Plan) -> None:
    """Adds the object patches of ``plan`` to ``model`` (a clone) and the per-run summary."""
    import comfy.patcher_extension
    import comfy.rmsnorm

    dm = model.get_model_object("diffusion_model")
    for name, cfg in plan.layers.items():
        mod = dm.get_submodule(name)
        model.add_object_patch(f"diffusion_model.{name}.forward_comfy_cast_weights",
                               make_forward(mod, cfg, comfy.rmsnorm.rms_norm))
    for name in plan.full_precision:
        model.add_object_patch(f"diffusion_model.{name}._full_precision_mm", True)
    # Decoded parameters are made on the load device, wherever the original is. ComfyUI moves an
    # object-patched tensor only when it loads the weights: a clone of a model that is already loaded
    # gets its object patches set as they are (ModelPatcher.partially_load). And the original a later
    # clone reads (get_model_object: ComfyUI's backup from the first clone's patch_model) is the tensor
    # from before the first load, on the CPU where ComfyUI loaded the checkpoint there (it does when
    # the GPU has less free memory than the host: an H100 80 GB in a 128 GB box, a 24 GB card).
    # Decoded where it lay, a second run's biases stayed on the CPU, their layers fell back to
    # ComfyUI's cast, and TorchCompileModel compiled that to fp8e4nv code below sm89 (HunyuanVideo
    # @86 on an H100: its Conv3d and LayerNorms; the H200, which loads to the GPU, had none).
    device = torch.device(model.load_device)
    for pname, (p, dtype) in plan.predecode.items():
        model.add_object_patch(f"diffusion_model.{pname}", _predecoded(p, dtype, device))
    if device.type == "cuda" and plan.layers:
        from ..kernels.fp8 import warm_decode
        try:  # the weights' decode kernel compiles while the model loads (kernels/fp8.py: warm_decode)
            warm_decode(device, decode_variants(plan, dm))
        except Exception as e:  # noqa: BLE001 - it then compiles at the first step, as before
            log_once(f"warm:{type(e).__name__}", f"Triton fp8 Fallback: the decode kernel was not compiled ahead "
                     f"({type(e).__name__}: {e}); it compiles at the first step", logging.DEBUG)
    if plan.active and plan.mode == "auto":
        from . import calibration as calib
        calib.add_wrapper(model)  # under TorchCompileModel: the first call runs eagerly and calibrates
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
    if plan.quantized:
        line = (f"{sum(plan.quantized.values())} of them ComfyUI QuantizedTensor layers ("
                + ", ".join(f"{k} {n}" for k, n in sorted(plan.quantized.items()))
                + "): the per-tensor scale folded into the decode, rounded as ComfyUI's dequantize rounds it")
        if plan.full_precision:
            line += f"; {len(plan.full_precision)} taken off comfy-kitchen's fp8 matmul onto the full-precision path"
        if plan.input_scaled:
            line += (f"; {plan.input_scaled} carry an input scale, which only the fp8 matmul uses (unused on the "
                     "full-precision path, as in ComfyUI)")
        lines.append(line)
    if plan.predecode:
        dt = str(next(iter(plan.predecode.values()))[1]).replace("torch.", "")
        other = len(plan.predecode) - plan.predecoded_biases
        what = ([f"{plan.predecoded_biases} fp8 biases of those layers"] if plan.predecoded_biases else []) + \
               ([f"{other} small fp8 parameters outside ComfyUI ops"] if other else [])
        lines.append(" and ".join(what) + f" decoded once to {dt}")
    if plan.mode == "auto" and any(c.calibrate for c in plan.layers.values()):
        from . import calibration as calib
        lines.append("auto: each Linear shape and token bucket takes the fastest of torch's cast + mm, the decode + "
                     "mm and the fused linear, measured on this GPU at its first call (the rule above is the "
                     "default where nothing is timed)")
        lines.extend(calib.describe(plan.device, "fp8_linear|"))
    for reason, names in plan.skipped.items():
        line = f"left on torch: {len(names)} ({reason})"
        if "kept" not in reason:  # a choice needs no list; a layer we could not serve is named
            line += ": " + ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        lines.append(line)
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
    if plan.layers:
        from . import compile_workers
        compile_workers.start_for(model, f"fp8|{mode}|sm{plan.arch}")
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
                   "TorchCompileModel on fp8 models below sm89 with official Triton; auto times torch's cast against the "
                   "Triton paths per layer shape on your GPU and keeps the fastest. Per model, reversible (bypass the "
                   "node), keeps LoRA and offloading working.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": ("MODEL",),
            "mode": (list(MODES), {"default": "auto", "tooltip":
                     "auto: Linear layers take the fastest of torch's cast + mm, the Triton decode + mm and the fused "
                     "fp8-weight linear, timed once per shape on this GPU (TRITONKIT_FP8_PATH=torch|decode|fused "
                     "forces one); other fp8 layers the decode, then torch's op; on sm89+ a checkpoint loaded as fp8_e4m3fn_fast keeps torch's native fp8 "
                     "matmul; under TorchCompileModel on sm89+ the compiled graph keeps Inductor's native fp8 cast, which measured "
                     "as fast or faster; ComfyUI 0.8's QuantizedTensor fp8 layers on comfy-kitchen's fp8 matmul (sm89+) "
                     "are kept there. fused-linear: the fused linear for every Linear, native fp8 ones included. "
                     "cast-only: only replace the cast (decode, then torch's matmul). off: unchanged."}),
        }}

    def patch(self, model, mode="auto"):
        out, text = patch_model(model, mode)
        return {"ui": {"text": [text]}, "result": (out,)}


NODE_CLASS_MAPPINGS = {"TritonKitFp8Fallback": TritonFp8Fallback}
NODE_DISPLAY_NAME_MAPPINGS = {"TritonKitFp8Fallback": "Triton fp8 Fallback"}
