"""ComfyUI side of the calibration (kernels/calibration.py): where the store lives, the progress
bar, forcing a path, the fp8 linear chooser, the first call of a compiled model, and the text
the nodes show.

* Store folder: ``<ComfyUI user folder>/tritonkit`` (survives updates of the pack, and on a
  Windows portable install it sits inside the portable folder, far from the 260-character
  limit); ``TRITONKIT_CALIBRATION_DIR`` wins.
* ``TRITONKIT_ATTN_PATH=sdpa|exact|int8`` and ``TRITONKIT_FP8_PATH=torch|decode|fused`` force a
  path in the nodes' ``auto`` mode (where the call allows it); ``TRITONKIT_CALIBRATION=0``
  switches timing off (the conservative defaults).
* Under ``TorchCompileModel`` (or the pack's Triton Compile Model) nothing can be timed inside the traced graph, so an APPLY_MODEL
  wrapper makes the first call of a compiled model with a new input signature run eagerly
  (``torch.compiler.set_stance("force_eager")``): that call calibrates every shape class it
  meets (timed at once, not deferred: see kernels/calibration.py), the signature and its shape
  classes are stored, and the next call compiles with the stored choices. A later process that
  finds them stored runs compiled from the first call.
* An eager model's new shape classes keep their default path for the calls during which their
  candidates compile in the background, and are timed at a later call
  (``TRITONKIT_CALIBRATION_DEFER=0``: at the first call).
"""
from __future__ import annotations

import logging
import os
from typing import Optional

import torch

from ..kernels import calibration as C
from ..kernels import roofline

log = logging.getLogger("TritonKit")

ATTN_PATH_ENV = "TRITONKIT_ATTN_PATH"
FP8_PATH_ENV = "TRITONKIT_FP8_PATH"
ATTN_PATHS = {"sdpa": "comfy", "comfy": "comfy", "exact": "exact", "int8": "int8", "8-bit": "int8"}
FP8_PATHS = {"torch": "torch", "decode": "decode", "fused": "fused", "fused-linear": "fused"}
WRAPPER_KEY = "tritonkit_calibration"
# APPLY_MODEL wrapper keys of the compiling nodes: ComfyUI's TorchCompileModel
# (comfy_api/torch_helpers/torch_compile.py) and the pack's Triton Compile Model (nodes/compile_model.py)
COMPILE_KEYS = ("torch.compile", "tritonkit_compile")


def setup() -> None:
    """Points the store at ComfyUI's user folder and shows ComfyUI's progress bar while timing
    (each where ComfyUI is importable)."""
    try:
        import folder_paths
        C.set_base_dir(lambda: os.path.join(folder_paths.get_user_directory(), "tritonkit"))
    except Exception:  # noqa: BLE001 - outside ComfyUI: the per-user cache folder
        pass
    try:
        import comfy.utils
        C.set_progress_factory(lambda total: comfy.utils.ProgressBar(total))
    except Exception:  # noqa: BLE001
        pass


def forced(env: str, table: dict) -> Optional[str]:
    """The path the user forces through ``env`` (None when unset); an unknown value is logged once."""
    raw = os.environ.get(env, "").strip().lower()
    if not raw or raw == "auto":
        return None
    if raw not in table:
        C.log_once("bad:" + env + raw, "TritonKit: %s=%s is not one of %s; ignored", env, raw,
                  ", ".join(sorted(set(table))))
        return None
    return table[raw]


def pick(device, key: str, candidates: dict, default: str, env: str, table: dict, what: str,
         prefer: Optional[str] = None, skip=None, interim: Optional[str] = None, bursts: bool = False) -> str:
    """The forced path when it is a candidate here, else the calibrated (or default) one
    (``prefer``: ComfyUI's own path, kept unless another is clearly faster; ``skip``, ``interim``,
    ``bursts``: see kernels/calibration.choose)."""
    f = None if torch.compiler.is_compiling() else forced(env, table)
    if f is not None:
        if f in candidates:
            return f
        C.log_once("notallowed:" + env + f + key, "TritonKit: %s=%s is not possible for %s; using %s", env, f, what,
                  default)
    return C.choose(device, key, candidates, default, what=what, prefer=prefer, skip=skip, interim=interim,
                    bursts=bursts)


# ----------------------------------------------------------------------------- fp8 linear

def fp8_linear_key(m, x, allowed, cc=None) -> str:
    w = m.weight
    K = x.shape[-1]
    M = x.numel() // max(1, K)
    where = f"sm{cc}" if cc is not None else x.device.type
    return (f"fp8_linear|{where}|N{w.shape[0]}|K{w.shape[1]}|{str(w.dtype).replace('torch.', '')}"
            f"|{str(x.dtype).replace('torch.', '')}|M{C.token_bucket(M)}|scaled{int(getattr(m, 'scale_weight', None) is not None)}"
            f"|bias{int(m.bias is not None)}|{','.join(sorted(allowed))}")


def fp8_linear_path(m, x, default: str, runs: dict, cc=None) -> str:
    """'torch' / 'decode' / 'fused' for this call of an fp8 Linear (``runs``: path -> callable,
    only the paths this call allows; ``cc``: the compute capability the paths are chosen for).
    The fused linear is not timed where this GPU's rates bound its gain below the calibration's
    noise (kernels/roofline.py); the key still names it, so a traced graph reads the same key."""
    key = fp8_linear_key(m, x, runs, cc)
    N, K = m.weight.shape[0], x.shape[-1]
    bucket = C.token_bucket(x.numel() // max(1, K))

    def skip() -> dict:
        why = roofline.fused_not_worth_timing(x.device, int(bucket), N, K, x.dtype) if "fused" in runs else None
        return {"fused": why} if why else {}

    # below sm89 ComfyUI's path is not a candidate: while the class's candidates compile, its calls
    # take decode + matmul, whose one decode kernel serves every layer (the fused linear's configs
    # would have to compile first)
    return pick(x.device, key, runs, default, FP8_PATH_ENV, FP8_PATHS,
                f"fp8 linear {N}x{m.weight.shape[1]} at {bucket} tokens", prefer="torch", skip=skip,
                interim="decode")


# ----------------------------------------------------------------------------- attention

# Whether torch's SDPA may use its cuDNN backend (it changes what "ComfyUI's attention" costs; the
# benchmarks switch it off to run as on an sm86). Read in eager code only (the APPLY_MODEL wrapper
# refreshes it before every model call), so the key needs no torch._C call inside a traced graph.
_sdpa_cudnn: Optional[bool] = None


def refresh_backend_state() -> None:
    global _sdpa_cudnn
    try:
        _sdpa_cudnn = bool(torch.backends.cuda.cudnn_sdp_enabled())
    except Exception:  # noqa: BLE001 - an old torch
        _sdpa_cudnn = None


def attention_key(func_name, q, k, heads, bhld, mask, allowed, cc=None, kv_rows=None) -> str:
    """The calibration key of an attention call's shape class; with ``kv_rows`` (True / False), the class also names
    whether K and V fold into rows as the exact kernel's TMA paths read them (kernels/attention.py ``kv_rows``):
    where they don't, only the pointer-load exact kernel serves the call (at Flux's shape it timed 0.55 ms against
    0.39 through TMA, H200), so one layout's timing must not decide the other's. (Flux's and HunyuanVideo's single
    blocks pass V as a view into their fused projection: such a view folds into rows of the projection's stride.)"""
    if not torch.compiler.is_compiling():
        refresh_backend_state()
    D = q.shape[-1] if bhld else q.shape[-1] // heads
    Lq = q.shape[-2] if bhld else q.shape[1]
    Lk = k.shape[-2] if bhld else k.shape[1]
    mk = "none" if mask is None else f"{'bool' if mask.dtype == torch.bool else 'add'}{mask.ndim}"
    where = f"sm{cc}" if cc is not None else q.device.type
    if q.device.type == "cuda" and _sdpa_cudnn is not None:
        where += "+cudnn-sdpa" if _sdpa_cudnn else "-cudnn-sdpa"
    return (f"attention|{where}|{func_name}|{str(q.dtype).replace('torch.', '')}|D{D}|H{heads}"
            f"|Lq{C.token_bucket(Lq)}|Lk{C.token_bucket(Lk)}|mask-{mk}|{'bhld' if bhld else 'bld'}"
            + ("" if kv_rows is None else "|kv2d" if kv_rows else "|kvstrided")
            + f"|{','.join(sorted(allowed))}")


# ----------------------------------------------------------------------------- compiled models

def _signature(x, args, kwargs) -> str:
    parts = [f"x{tuple(x.shape)}{str(x.dtype).replace('torch.', '')}"]
    for name, v in list(enumerate(args)) + sorted(kwargs.items(), key=lambda kv: str(kv[0])):
        if isinstance(v, torch.Tensor):
            parts.append(f"{name}{tuple(v.shape)}")
    return "|".join(parts)


def _compiled(transformer_options) -> bool:
    wrappers = (transformer_options or {}).get("wrappers", {})
    try:
        import comfy.patcher_extension
        apply = wrappers.get(comfy.patcher_extension.WrappersMP.APPLY_MODEL, {})
    except Exception:  # noqa: BLE001
        return False
    return any(apply.get(k) for k in COMPILE_KEYS)


def calibrated_first_call(executor, x, t, c_concat=None, c_crossattn=None, control=None, transformer_options=None,
                          **kwargs):
    """APPLY_MODEL wrapper: see the module docstring."""
    call = lambda: executor(x, t, c_concat, c_crossattn, control, transformer_options, **kwargs)  # noqa: E731
    refresh_backend_state()
    if (not isinstance(x, torch.Tensor) or not _compiled(transformer_options) or not C.timing_enabled()
            or not C.can_time(x.device) or not hasattr(torch.compiler, "set_stance")):
        return call()
    model_name = type(getattr(executor, "class_obj", None)).__name__
    sig = f"run|{model_name}|" + _signature(x, (c_concat, c_crossattn), kwargs)
    rec = C.recall(x.device, sig)
    if isinstance(rec, dict) and all(C.lookup(torch.device(x.device), k) is not None for k in rec.get("keys", [])):
        # the choices a block traced with dynamic token counts reads (C.prime): this call's
        C.prime(x.device, rec.get("keys", []))
        return call()
    log.info("TritonKit calibration: the first call of this compiled model (%s) runs eagerly to measure its "
             "paths on this GPU; later calls run compiled", model_name)
    with C.recording() as keys, C.synchronous(), torch.compiler.set_stance("force_eager"):
        out = call()
    C.remember(x.device, sig, {"keys": sorted(keys)})
    C.prime(x.device, keys)
    return out


def add_wrapper(model) -> None:
    """Adds :func:`calibrated_first_call` to ``model`` (a clone) once (a ComfyUI ModelPatcher;
    anything else is left alone)."""
    try:
        import comfy.patcher_extension
    except ImportError:
        return
    if not hasattr(model, "add_wrapper_with_key"):
        return
    wt = comfy.patcher_extension.WrappersMP.APPLY_MODEL
    model.remove_wrappers_with_key(wt, WRAPPER_KEY)
    model.add_wrapper_with_key(wt, WRAPPER_KEY, calibrated_first_call)


# ----------------------------------------------------------------------------- text

def describe(device, prefix: str) -> list[str]:
    """Lines for the node's text: how auto chooses here and what is stored for this GPU."""
    dev = torch.device(device) if device is not None else None
    if dev is None:
        return []
    lines = []
    if not C.timing_enabled():
        lines.append(f"calibration off ({C.ENV_ENABLE}=0): auto uses the conservative defaults")
        return lines
    if not C.can_time(dev):
        lines.append("calibration: this device can't be timed; auto uses the conservative defaults")
        return lines
    try:
        entries = {k: v for k, v in C.stored_choices(dev).items() if k.startswith(prefix) and "choice" in v}
    except Exception as e:  # noqa: BLE001 - the text must never fail the node
        return [f"calibration store unavailable ({type(e).__name__}: {e})"]
    if not entries:
        lines.append(f"calibration: each new shape class is timed once on this GPU, at one of its first calls "
                     f"(its candidates compile in the background meanwhile; stored in {C.store_dir()})")
        return lines
    lines.append(f"calibration: {len(entries)} shape classes measured on this GPU ({C.store_dir()}):")
    for k, v in sorted(entries.items())[:12]:
        t = ", ".join([f"{n} {ms:.3f} ms" for n, ms in v.get("timings_ms", {}).items()]
                      + [f"{n} not timed" for n in v.get("not_timed", {})])
        if v.get("bursts_ms"):  # the close paths timed again back to back, which chose between them
            t += "; back to back " + ", ".join(f"{n} {ms:.3f} ms" for n, ms in v["bursts_ms"].items())
        lines.append(f"  {v.get('what') or k} -> {v['choice']} ({t})")
    if len(entries) > 12:
        lines.append(f"  ... {len(entries) - 12} more at GET /tritonkit/calibration")
    return lines


setup()
