"""Triton Attention: MODEL -> MODEL, routes the model's attention through this pack's Triton
kernel (exact or 8-bit) via ``transformer_options["optimized_attention_override"]`` on a clone.

Every call the kernel can't serve (CPU tensors, dtype, head size, mask, ``low_precision_attention
=False`` in 8-bit mode, a compile error, a broken Triton) goes to the function ComfyUI would have
called, and each distinct reason is logged once. Counters of served / fallen-back calls live at
module level (``stats()``) and are served at ``GET /tritonkit/attention/stats``."""
from __future__ import annotations

import logging
import os
import threading
from collections import Counter

import torch

from ..kernels.device import capability
from .arch import ARCH_ENV, CUDNN_SDPA_ARCHS, arch_forced, effective_arch

log = logging.getLogger("TritonKit")

try:  # a broken Triton must not stop the node from loading: every call then falls back
    from ..kernels import attention as A
    from ..kernels.runtime import cpu_mode, force_triton_on_cpu
    from ..kernels import arch_probe, fast_launch, roofline
    from . import calibration as calib
    from . import compile_workers
    _IMPORT_ERROR = None
except Exception as _e:  # noqa: BLE001
    A = None
    calib = None
    _IMPORT_ERROR = f"{type(_e).__name__}: {_e}"

MODES = ("auto", "exact", "8-bit")

# auto measures: the first call of a shape class (head size, query/key-length buckets, dtype,
# mask, layout) on a GPU times ComfyUI's own attention (the function the node would fall back to,
# usually PyTorch SDPA), our exact kernel and, where the caller allows low precision, our 8-bit
# one, on the call's real tensors, and keeps the fastest (kernels/calibration.py, stored on disk
# per GPU / driver / torch / Triton / pack version). The constants below are only the
# conservative defaults where nothing can be timed (CPU, the interpreter, TRITONKIT_CALIBRATION=0,
# a compiled graph traced before any eager call); they come from one H200 (BENCHMARKS.md):
# 8-bit from 8192 keys at head size >= 96, ComfyUI's SDPA kept on the archs where torch's SDPA
# prefers cuDNN (arch.CUDNN_SDPA_ARCHS) and for head sizes that are not a multiple of 32.
# Callers that ask for precision (attn_precision=fp32, low_precision_attention=False) and the
# exact mode never get 8-bit. Explicit exact / 8-bit always run our kernels.
AUTO_INT8_MIN_KEYS = 8192
AUTO_INT8_MIN_HEAD = 96

_lock = threading.Lock()
_stats = Counter()
_reasons = Counter()
_logged: set = set()


def stats() -> dict:
    """Calls since start (or reset_stats): served / served_exact / served_int8 / fallback, and the
    fallback reasons with their counts. Under torch.compile only traced calls are counted."""
    with _lock:
        return {**{k: _stats.get(k, 0) for k in ("served", "served_exact", "served_int8", "fallback")},
                "reasons": dict(_reasons)}


def reset_stats():
    with _lock:
        _stats.clear()
        _reasons.clear()


def _compiling() -> bool:
    try:
        return torch.compiler.is_compiling()
    except Exception:
        return False


def _count(kind: str, reason: str | None = None):
    if _compiling():
        return
    with _lock:
        if kind == "fallback":
            _stats["fallback"] += 1
            _reasons[reason] += 1
        else:
            _stats["served"] += 1
            _stats[f"served_{kind}"] += 1
    if reason is not None and reason not in _logged:
        _logged.add(reason)
        log.warning("TritonKit attention: using ComfyUI's attention for %s (logged once per reason)", reason)


def _bind(args, kwargs):
    """ComfyUI's backend signature (q, k, v, heads, mask=None, attn_precision=None,
    skip_reshape=False, skip_output_reshape=False, **kwargs), positional or keyword."""
    names = ("q", "k", "v", "heads", "mask", "attn_precision", "skip_reshape", "skip_output_reshape")
    alias = {"query": "q", "key": "k", "value": "v"}
    b = {}
    for name, val in zip(names, args):
        b[name] = val
    for key, val in kwargs.items():
        b.setdefault(alias.get(key, key), val)
    return b


def _arch(device) -> int | None:
    """The compute capability paths are chosen for (TRITONKIT_FORCE_ARCH wins); None off CUDA."""
    return effective_arch(device) if device.type == "cuda" else None


def sdpa_is_faster(func_name: str | None, cc: int | None, head_dim: int) -> bool:
    """Whether auto should keep ComfyUI's own attention: only when that is PyTorch SDPA and SDPA
    measured faster than our kernels for this GPU class or head size."""
    if func_name != "attention_pytorch" or cc is None:
        return False
    return cc in CUDNN_SDPA_ARCHS or head_dim % 32 != 0


def plan(mode: str, b: dict, force_cpu: bool, func_name: str | None = None) -> tuple[str | None, str | None]:
    """(kernel mode "exact"/"int8" or None, fallback reason or None) for one call."""
    if A is None:
        return None, f"Triton unavailable ({_IMPORT_ERROR})"
    q, k, v = b.get("q"), b.get("k"), b.get("v")
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return None, "a call without q/k/v tensors"
    if q.device.type == "cpu" and not force_cpu:
        return None, "CPU tensors (the Triton path needs a GPU; TRITONKIT_FORCE_TRITON_ON_CPU=1 forces the interpreter)"
    if q.device.type not in ("cuda", "cpu"):
        return None, f"{q.device.type} tensors"
    low_precision_ok = b.get("low_precision_attention", True) is not False
    bhld = bool(b.get("skip_reshape", False))
    heads = b.get("heads")
    if not isinstance(heads, (int, torch.SymInt)):
        return None, "heads not given as an int"
    cc = _arch(q.device)
    no_tc = arch_probe.no_tensor_cores_reason(cc) if cc is not None and cc < 80 else None
    if no_tc is not None:
        return None, no_tc
    if mode == "8-bit":
        if not low_precision_ok:
            return None, "low_precision_attention=False in 8-bit mode"
        if not A.int8_supported(cc):
            return None, f"8-bit attention on sm{cc} (needs sm80+; use exact)"
        kmode = "int8"
    elif mode == "exact":
        kmode = "exact"
    else:  # auto: the conservative default (calibration may choose another allowed path)
        D = q.shape[-1] if bhld else (q.shape[-1] // heads if heads else 0)
        Lk = k.shape[-2] if bhld else (k.shape[1] if k.ndim == 3 else 0)
        if sdpa_is_faster(func_name, cc, D):
            return None, (f"auto: ComfyUI's PyTorch attention (SDPA) measured faster on sm{cc} at head size {D}"
                          if cc else f"auto: ComfyUI's PyTorch attention (SDPA) measured faster at head size {D}")
        kmode = "int8" if (int8_allowed(b, cc) and D >= AUTO_INT8_MIN_HEAD and Lk >= AUTO_INT8_MIN_KEYS) else "exact"
    reason = A.check_supported(q, k, v, heads, bhld, kmode, b.get("mask"))
    if reason is not None:
        return None, reason
    return kmode, None


def int8_allowed(b: dict, cc) -> bool:
    """Whether auto may use 8-bit for this call: the caller allows low precision and the GPU can."""
    return (b.get("low_precision_attention", True) is not False and A.int8_supported(cc)
            and b.get("attn_precision") != torch.float32)


def auto_paths(b: dict, force_cpu: bool, func_name: str | None):
    """For auto: (default path, the kernel modes this call allows) where ComfyUI's attention
    ("comfy") is always allowed, or (None, reason) when only ComfyUI's attention can serve it."""
    kmode, reason = plan("auto", b, force_cpu, func_name)
    if kmode is None and not (reason or "").startswith("auto:"):
        return None, reason
    q, k, v = b["q"], b["k"], b["v"]
    bhld = bool(b.get("skip_reshape", False))
    cc = _arch(q.device)
    allowed = [m for m in ("exact", "int8")
               if (m == "exact" or int8_allowed(b, cc))
               and A.check_supported(q, k, v, b["heads"], bhld, m, b.get("mask")) is None]
    return (kmode or "comfy"), allowed


def _auto_choice(func, args, kwargs, b, force_cpu, settle=None):
    """(kernel mode or None for ComfyUI's attention, fallback reason or None), measured. ``settle``: a
    list that gets (device name, calibration key, choice) where the choice is final in this process."""
    fname = getattr(func, "__name__", None)
    default, allowed = auto_paths(b, force_cpu, fname)
    if default is None:
        if settle is not None:
            settle.append(None)  # nothing timed decides it: the call's own arguments do
        return None, allowed
    cands = {"comfy": lambda: func(*args, **kwargs)}
    for m in allowed:
        cands[m] = (lambda m=m: run_attention(m, b))
    if default not in cands:
        default = "comfy"
    bhld = bool(b.get("skip_reshape", False))
    q = b["q"]
    D = q.shape[-1] if bhld else q.shape[-1] // b["heads"]
    key = calib.attention_key(fname, q, b["k"], b["heads"], bhld, b.get("mask"), cands, _arch(q.device),
                              kv_rows=A.kv_rows(b["k"], b["v"], D, bhld) if A is not None else None)
    Lk = b["k"].shape[-2] if bhld else b["k"].shape[1]
    # (the text only names the shape class in the calibration log; while tracing, Lk may be symbolic)
    what = "" if torch.compiler.is_compiling() else f"attention head {D}, {Lk} keys, {str(q.dtype).replace('torch.', '')}"

    def skip() -> dict:
        # asked in eager code only, when the class is about to be compiled and timed
        if "int8" not in cands:
            return {}
        B, H, Lq = (q.shape[0], q.shape[1], q.shape[2]) if bhld else (q.shape[0], b["heads"], q.shape[1])
        why = roofline.int8_attention_not_worth_timing(
            q.device, int(B), int(H), calib.C.pow2_bucket(Lq), calib.C.pow2_bucket(Lk), int(D), q.dtype)
        return {"int8": why} if why else {}
    # bursts: ComfyUI's attention and the two kernels draw the GPU's power differently, and two of them close alone
    # can part by 15 % in a run of calls (kernels/calibration.py, PATH_PLAYOFF_WITHIN)
    choice = calib.pick(q.device, key, cands, default, calib.ATTN_PATH_ENV, calib.ATTN_PATHS, what, prefer="comfy",
                        skip=skip, bursts=True)
    if settle is not None and not torch.compiler.is_compiling():
        dkey = str(q.device)
        if calib.C.settled(dkey, key) == choice:
            settle.append((dkey, key, choice))
    if choice == "comfy":
        if not torch.compiler.is_compiling() and calib.C.pending(q.device, key):
            return None, f"auto: ComfyUI's attention ({fname}) while the kernels for head size {D} compile (calibrating)"
        return None, f"auto: ComfyUI's attention ({fname}) is faster or the default for head size {D} here"
    return choice, None


def run_attention(kmode: str, b: dict):
    bhld = bool(b.get("skip_reshape", False))
    return A.attention(b["q"], b["k"], b["v"], b["heads"], mask=b.get("mask"),
                       layout="bhld" if bhld else "bld",
                       out_layout="bhld" if b.get("skip_output_reshape", False) else "bld",
                       scale=b.get("scale"), mode=kmode,
                       arch=_arch(b["q"].device) if arch_forced() else None)  # unforced: the device's own


# A call's decision (kernel mode or ComfyUI's attention, and why) made from what _memo_key holds, kept for
# the next call with the same key: every call of a model's step after its first. The checks, the auto
# paths and the calibration key cost 0.06 ms of host time a call on an H100 / H200 machine (2026-11-27), a
# kernel call after them 0.07-0.2 ms, torch's SDPA as ComfyUI calls it 0.03-0.07. An auto decision is kept
# only where the calibration's choice is final here (kernels/calibration.settled), and is checked against it
# at each use. Unmasked eager calls on plain tensors only; TRITONKIT_FAST_LAUNCH=0 turns it off with the
# kernels' direct launches (kernels/fast_launch.py).
MEMO_MAX = 512
_memo: dict = {}
_MEMO_ENVS = (ARCH_ENV, "TRITONKIT_FORCE_TRITON_ON_CPU", "TRITONKIT_ATTN_PATH", "TRITONKIT_ATTN_TMA")
_SCALARS = (bool, int, float, str, type(None), torch.dtype)


def _memo_key(mode: str, func, b: dict):
    q, k, v = b.get("q"), b.get("k"), b.get("v")
    if (b.get("mask") is not None or type(q) is not torch.Tensor or type(k) is not torch.Tensor
            or type(v) is not torch.Tensor or _compiling()):
        return None
    rest = []
    for name, x in b.items():
        if name not in ("q", "k", "v"):
            if not isinstance(x, _SCALARS):
                if isinstance(x, (dict, list)):
                    continue  # transformer_options and the like: none of them decides the path
                return None
            rest.append((name, x))
    rest.sort()
    try:
        cudnn = torch.backends.cuda.cudnn_sdp_enabled()
    except Exception:  # noqa: BLE001 - an old torch
        cudnn = None
    return (mode, getattr(func, "__name__", None), q.device, q.dtype, q.shape, q.stride(), k.dtype, k.shape,
            k.stride(), v.dtype, v.shape, v.stride(), tuple(rest), tuple(os.environ.get(e) for e in _MEMO_ENVS),
            cudnn)


def _remembered(key):
    """The decision kept for ``key`` where it still stands, else None."""
    hit = _memo.get(key)
    if hit is None:
        return None
    kmode, reason, settle = hit
    if settle is not None and calib.C.settled(settle[0], settle[1]) != settle[2]:
        return None
    return kmode, reason


def _remember(key, kmode, reason, settle) -> None:
    if len(_memo) >= MEMO_MAX:
        _memo.clear()
    _memo[key] = (kmode, reason, settle)


def make_override(mode: str):
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")

    def tritonkit_attention_override(func, *args, **kwargs):
        b = _bind(args, kwargs)
        force_cpu = A is not None and force_triton_on_cpu()
        mkey = _memo_key(mode, func, b) if A is not None and fast_launch.enabled() else None
        kept = _remembered(mkey) if mkey is not None else None
        if kept is not None:
            kmode, reason = kept
        elif mode == "auto" and A is not None and calib is not None:
            settle = [] if mkey is not None else None
            kmode, reason = _auto_choice(func, args, kwargs, b, force_cpu, settle)
            if settle:
                _remember(mkey, kmode, reason, settle[0])
        else:
            kmode, reason = plan(mode, b, force_cpu, getattr(func, "__name__", None))
            if mkey is not None:
                _remember(mkey, kmode, reason, None)
        if kmode is not None:
            try:
                out = run_attention(kmode, b)
            except Exception as e:  # compile error, out of resources, ...
                reason = f"kernel error ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
            else:
                _count(kmode)
                return out
        _count("fallback", reason)
        return func(*args, **kwargs)

    tritonkit_attention_override.tritonkit_mode = mode
    return tritonkit_attention_override


def describe(mode: str, model) -> str:
    """What the patched model will run, for the node's text."""
    dev = getattr(model, "load_device", None)
    lines = [f"Triton Attention: mode={mode}"]
    if A is None:
        lines.append(f"Triton unavailable ({_IMPORT_ERROR}): every call uses ComfyUI's attention")
        return "\n".join(lines)
    if dev is None or getattr(dev, "type", "cpu") != "cuda":
        if force_triton_on_cpu():
            lines.append(f"device: CPU, Triton forced ({cpu_mode()}; slow, for testing)")
        else:
            lines.append("device: CPU -> every call uses ComfyUI's attention (the kernels need a GPU)")
            return "\n".join(lines)
        cc = None
    else:
        cc = _arch(dev)
        lines.append(f"device: {torch.cuda.get_device_name(dev)} (sm{cc}"
                     + (f", forced by {ARCH_ENV}" if arch_forced() else "") + ")")
        no_tc = arch_probe.no_tensor_cores_reason(cc)
        if no_tc is not None:
            lines.append(f"{no_tc}: every call uses ComfyUI's attention")
            return "\n".join(lines)
    if mode == "8-bit" and not A.int8_supported(cc):
        lines.append("8-bit needs sm80+: calls use ComfyUI's attention; choose exact")
    elif mode == "8-bit":
        pv = ("fp8 e4m3 or fp16/bf16, whichever times faster on this GPU per shape class (fp8 only when "
              f"{(A.FP8_PV_MARGIN - 1) * 100:.0f}% faster: it is less accurate)" if A.fp8_pv_supported(cc)
              else "fp16/bf16")
        lines.append(f"kernel: int8 Q·K (smoothed K, per-row Q / per-block K scales), P·V {pv}, fp32 accumulation")
    elif mode == "exact":
        gluon = cc is not None and A.attention_hopper.eligible(cc, torch.bfloat16, 128, False, False)
        tma = cc is not None and A.tma_variants_for(cc, torch.bfloat16) == (A.TMA_OFF, A.TMA_ON)
        lines.append("kernel: exact (fp32 softmax and accumulation"
                     + ("; K/V through TMA or pointer loads, whichever times faster on this GPU" if tma else "")
                     + ("; at heads 64/128 without a mask also the Gluon Hopper kernel (asynchronous MMAs, "
                        "warp-specialised), timed beside them" if gluon else "")
                     + ")")
    else:
        lines.append("auto: per shape class, the fastest of ComfyUI's attention, exact and 8-bit"
                     + ("" if A.int8_supported(cc) else " (8-bit not on this GPU)")
                     + " measured on this GPU at its first call (8-bit only where the caller allows low precision)")
        lines.extend(calib.describe(dev if dev is not None else "cpu", "attention|"))
        if calib.forced(calib.ATTN_PATH_ENV, calib.ATTN_PATHS):
            lines.append(f"forced by {calib.ATTN_PATH_ENV}={calib.forced(calib.ATTN_PATH_ENV, calib.ATTN_PATHS)}")
        lines.append(f"defaults where nothing is timed: 8-bit for head size >= {AUTO_INT8_MIN_HEAD} and "
                     f">= {AUTO_INT8_MIN_KEYS} keys, exact elsewhere, ComfyUI's SDPA on "
                     f"sm{'/'.join(str(a) for a in CUDNN_SDPA_ARCHS)} and for head sizes not a multiple of 32")
    lines.append(f"dtypes: {', '.join(str(d).replace('torch.', '') for d in A.supported_dtypes(cc))}; "
                 f"head size <= {A.MAX_HEAD_DIM}; anything else uses ComfyUI's attention (logged once per reason)")
    return "\n".join(lines)


def patch_model(model, mode: str):
    dev = getattr(model, "load_device", None)
    if dev is not None and torch.device(dev).type == "cuda" and torch.cuda.is_available():
        capability(dev)  # looked up here, in eager code: a compiled model's traced calls read it as a constant
        if A is not None:
            arch_probe.dot_has_tensor_cores(_arch(torch.device(dev)))  # likewise (a compile, below sm80 only)
            compile_workers.start_for(model, f"attention|{mode}|sm{_arch(torch.device(dev))}")
    clone = model.clone()
    topts = clone.model_options.setdefault("transformer_options", {})
    topts["optimized_attention_override"] = make_override(mode)
    if mode == "auto" and calib is not None:
        calib.add_wrapper(clone)  # under TorchCompileModel: the first call runs eagerly and calibrates
    return clone, describe(mode, model)


class TritonAttention:
    CATEGORY = "TritonKit"
    FUNCTION = "patch"
    RETURN_TYPES = ("MODEL",)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("The model with its attention routed through the Triton kernel.",)
    DESCRIPTION = ("Runs the model's attention through TritonKit's Triton FlashAttention kernel. exact: fp32 "
                   "softmax/accumulation, same accuracy as PyTorch SDPA. 8-bit: int8 Q·K (SageAttention style) "
                   "and, on GPUs with fp8 MMA (RTX 40xx/50xx, H100), fp8 P·V; faster, cosine >= 0.999. auto: the fastest of ComfyUI's attention, exact and 8-bit, measured on your GPU "
                   "the first time each shape class runs and remembered (8-bit only where the model allows low precision). "
                   "Calls it can't serve use ComfyUI's attention (logged once). Put TorchCompileModel "
                   "after it if you compile.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": ("MODEL",),
            "mode": (list(MODES), {"default": "auto", "tooltip":
                     "auto: times ComfyUI's attention, exact and 8-bit once per shape class on this GPU and keeps the "
                     "fastest (TRITONKIT_ATTN_PATH=sdpa|exact|int8 forces one). exact: fp16/bf16 in, fp32 softmax. "
                     "8-bit: int8 Q·K everywhere it may."}),
        }}

    def patch(self, model, mode="auto"):
        clone, text = patch_model(model, mode)
        return {"ui": {"text": [text]}, "result": (clone,)}


def _register_routes():
    try:
        from aiohttp import web
        from server import PromptServer
        routes = PromptServer.instance.routes
    except Exception:
        return

    @routes.get("/tritonkit/attention/stats")
    async def _attention_stats(request):
        return web.json_response(stats())


_register_routes()

NODE_CLASS_MAPPINGS = {"TritonKitAttention": TritonAttention}
NODE_DISPLAY_NAME_MAPPINGS = {"TritonKitAttention": "Triton Attention"}
