"""Warm restarts without Dynamo: the Triton Compile Model's block graphs as saved AOT-compiled functions.

After a restart, Inductor's FX-graph and AOTAutograd caches hand back the compiled code, but
Dynamo still traces every block class again: 8.6 s of a 13.2 s warm first step on an H100 for
Flux (2026-11-23), which is most of it. torch's ahead-of-time compile
(``torch.compile(fullgraph=True)(...).aot_compile``, ``torch.compiler.load_compiled_function``;
torch 2.10+, experimental there) saves the traced bytecode, the guards and the compiled graph in
one file, which a new process loads and calls without tracing.

What this file adds to the regional compile (nodes/compile_model.py):

* **Entries.** One AOT-compiled function per (block class, options, entry key), compiled at the
  first block call that has no entry and written to
  ``<inductor cache>/tritonkit_compile/aot-<version key>/``; a later process loads it at its
  first call with that key.
* **Guards.** Dynamo's guards on the call's tensor arguments (dtypes, devices, ranks, the static
  sizes, the dynamic token dim) and on the global torch state are kept and checked at every call.
  Those on the block module, its parameters, globals, functions and ``transformer_options`` are
  not: saving them pickles those objects, and ComfyUI's are not all picklable (its op classes are
  defined inside classes, comfy-kitchen's QuantizedTensor layout parameters too). The entry key
  stands in for them: the block's module tree (each submodule's class, simple attributes and
  object-patched functions, e.g. the fp8 Fallback's per-layer forward and its config; each
  parameter's class, dtype, device, sizes, strides and subclass layout), the call's non-tensor
  arguments (``transformer_options`` without ComfyUI's per-block entries, the attention override
  and its mode), and a version key of torch, Triton, Python, ComfyUI, comfy-kitchen and the source
  files the block's code comes from (the pack's own, and every ``.py`` beside the files of the
  block's classes), so an update of any of them compiles afresh.
* **Falling back.** Where a class cannot be AOT-compiled (a graph break: ``fullgraph``), an entry
  cannot be saved or loaded (corrupt, foreign), or a loaded entry's guards fail, that class or
  key goes through the ordinary ``torch.compile`` path, logged once per reason. Past the node's
  ``cache_size_limit`` a new key runs eagerly, as Dynamo does past its limit. Entries honour
  Dynamo's stance (the calibration's first call runs eagerly). ``TRITONKIT_COMPILE_AOT=0``
  switches the whole file off.

Measured (full-size Flux and HunyuanVideo @86 with both nodes, torch 2.11): the first step after a
restart costs 0.7-1.5 s over a steady step on an H100 and an H200 (2026-11-24, with the pack's
ptxas pin, installer/ptxas.py; 4.4-9.1 s before it, of which ~4 s were Triton kernels compiled
again under a second cache key); the cold compile costs the same as Dynamo's path on one machine.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import importlib.util
import inspect
import logging
import os
import re
import threading
import time
from typing import Callable, Optional

import torch

log = logging.getLogger("TritonKit")

ENV = "TRITONKIT_COMPILE_AOT"
FOLDER_PREFIX = "aot-"
TOKEN_DIM_MIN = 16          # a dim this large (not the first or last) is a token dim
# Guards an entry keeps: on the call's tensor arguments (dtype, device, sizes, strides, the dynamic
# token dim through the shape environment) and torch's global state (grad mode, autocast...): of
# torch's "portable" set (torch.compiler.keep_portable_guards_unsafe, with which torch also leaves
# the module's globals out of the file), those not on the block module. The rest is what the entry
# key describes (the module tree with its parameters, non-tensor arguments, transformer_options):
# a guard on any of them pickles that object into the file, and ComfyUI's are not all picklable
# (op classes defined inside classes; comfy-kitchen's QuantizedTensor layout parameters, a class
# inside a class: seen on an H200 with ComfyUI 0.8.0; locks in transformer_options).
_KEPT_GUARDS = frozenset({"TENSOR_MATCH", "SHAPE_ENV", "GLOBAL_STATE"})
_SELF = re.compile(r"\bself\b")
OVER_LIMIT = "over the cache size limit"  # an entry key whose calls run eagerly
_OFF = ("0", "false", "no", "off")


def available() -> bool:
    """The installed torch has ahead-of-time compile and load (torch 2.10+)."""
    try:
        return importlib.util.find_spec("torch._dynamo.aot_compile") is not None and \
            callable(getattr(torch.compiler, "load_compiled_function", None))
    except (ImportError, ValueError):
        return False


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in _OFF and available()


def _aot_enabled():
    """torch's switch for ``.aot_compile`` on compiled functions (off by default in torch 2.11, on
    in later ones), on while the function is made."""
    import contextlib
    if hasattr(torch._dynamo.config, "enable_aot_compile"):
        return torch._dynamo.config.patch(enable_aot_compile=True)
    return contextlib.nullcontext()


def stance() -> str:
    """Dynamo's current stance (``torch.compiler.set_stance``): an entry's call honours it as a
    compiled function does ("force_eager": the pack's calibration runs a compiled model's first call
    eagerly; "eager_on_recompile": no new entry is compiled)."""
    st = getattr(torch._dynamo.eval_frame, "_stance", None)
    return getattr(st, "stance", "default") or "default"


_logged: set = set()


def log_once(key: str, msg: str, level: int = logging.INFO) -> None:
    if key not in _logged:
        _logged.add(key)
        log.log(level, "TritonKit compile: %s", msg)


# ----------------------------------------------------------------------------- guards
def aot_guard_filter(base: Callable) -> Callable:
    """``base``'s choice (the regional compile's filter), narrowed to the guards a saved entry can
    keep (_KEPT_GUARDS): none on globals, on the block (``self``) or inside ``transformer_options``."""

    def keep(entries):
        out = []
        for e, k in zip(entries, base(entries)):
            name = getattr(e, "name", "") or ""
            out.append(bool(k) and not getattr(e, "is_global", False) and
                       getattr(e, "guard_type", "") in _KEPT_GUARDS and "transformer_options" not in name and
                       _SELF.search(name) is None)
        return out

    return keep


# ----------------------------------------------------------------------------- entry keys
def token_dim(v) -> Optional[int]:
    """The token dimension of a tensor input (the largest dim between the first and the last, of
    at least TOKEN_DIM_MIN), or None."""
    if type(v) is not torch.Tensor or v.dim() < 3:
        return None
    sizes = v.shape[1:-1]
    d = max(range(len(sizes)), key=lambda i: sizes[i])
    return d + 1 if sizes[d] >= TOKEN_DIM_MIN else None


def _simple(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str, torch.dtype, torch.device))


def fingerprint(v, skip: tuple = (), depth: int = 0, tokens: str = "token"):
    """A hashable description of ``v`` for the entry key: values of simple things, dtype / rank /
    device / sizes of tensors (``tokens``: "token" writes the token dim as ``*``, "any" leaves all
    sizes out, "exact" keeps them), the qualified name and the pack's config of functions, the
    class of other objects; dict entries named in ``skip`` are left out."""
    if _simple(v):
        return v if not isinstance(v, (torch.dtype, torch.device)) else str(v)
    if isinstance(v, torch.Tensor):
        d = token_dim(v) if tokens == "token" else None
        return ("T", str(v.dtype), v.device.type, type(v).__name__,
                v.dim() if tokens == "any" else tuple("*" if i == d else s for i, s in enumerate(v.shape)))
    if depth > 6:
        return type(v).__qualname__
    if isinstance(v, (tuple, list)):
        return (type(v).__name__,) + tuple(fingerprint(x, skip, depth + 1, tokens) for x in v)
    if isinstance(v, dict):
        return ("dict",) + tuple(sorted(((str(k), fingerprint(x, skip, depth + 1, tokens))
                                         for k, x in v.items() if k not in skip), key=lambda kv: kv[0]))
    if isinstance(v, torch.nn.Module):
        return ("module", type(v).__module__, type(v).__qualname__)
    if callable(v) and hasattr(v, "__qualname__"):
        own = getattr(v, "__dict__", {})
        return ("fn", getattr(v, "__module__", ""), v.__qualname__) + tuple(
            sorted((k, fingerprint(x, skip, depth + 1, tokens)) for k, x in own.items() if k.startswith("tritonkit")))
    if dataclasses.is_dataclass(v):  # a per-layer config: its behaviour, not the layer's name
        return ("dc", type(v).__qualname__) + tuple(
            (f.name, fingerprint(getattr(v, f.name), skip, depth + 1, tokens))
            for f in dataclasses.fields(v) if f.name != "name")
    return ("obj", type(v).__module__, type(v).__qualname__)


def tensor_fingerprint(t: torch.Tensor, depth: int = 0) -> tuple:
    """What Dynamo's guard on a parameter checks, for the entry key: class, dtype, device, sizes,
    strides, requires_grad; for a wrapper subclass (comfy-kitchen's QuantizedTensor) also its
    layout (``__tensor_flatten__``'s context) and inner tensors."""
    out = (type(t).__module__, type(t).__qualname__, str(t.dtype), t.device.type, tuple(t.shape),
           tuple(t.stride()) if t.layout == torch.strided else None, t.requires_grad)
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is not None and depth < 3:
        try:
            names, ctx = flatten()
        except Exception:  # noqa: BLE001 - a subclass whose flatten needs more: its class serves
            return out
        out += (fingerprint(ctx, depth=1, tokens="exact"),) + tuple(
            (n, tensor_fingerprint(getattr(t, n), depth + 1)) for n in names
            if isinstance(getattr(t, n, None), torch.Tensor))
    return out


def module_fingerprint(block: torch.nn.Module) -> tuple:
    """The block's module tree: per submodule its class, simple attributes and instance-level
    functions (object patches), and its parameters' and buffers' dtypes, shapes and classes."""
    out = []
    for name, m in block.named_modules():
        attrs = tuple(sorted((k, fingerprint(x)) for k, x in vars(m).items()
                             if not k.startswith("_") and k != "training" and
                             (_simple(x) or callable(x) or
                              (isinstance(x, (tuple, list)) and all(_simple(i) for i in x)))))
        tens = tuple((k,) + tensor_fingerprint(t)
                     for k, t in list(m._parameters.items()) + list(m._buffers.items()) if t is not None)
        out.append((name, type(m).__module__, type(m).__qualname__, attrs, tens))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _files_digest(folders: tuple) -> str:
    """Size and mtime of every .py file in ``folders`` (an update of ComfyUI or the pack changes it)."""
    h = hashlib.sha256()
    for folder in folders:
        for path in sorted(glob.glob(os.path.join(folder, "*.py"))):
            try:
                st = os.stat(path)
            except OSError:
                continue
            h.update(f"{path}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _dist_version(name: str) -> str:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:  # noqa: BLE001 - not installed
        return "-"


def code_key(block: torch.nn.Module) -> str:
    """A digest of where the block's traced code comes from: the folders of its classes' files
    (ComfyUI's, e.g. comfy/ldm/flux and comfy), the pack's nodes/ and kernels/, and the versions of
    ComfyUI and comfy-kitchen."""
    folders = set()
    for m in block.modules():
        try:
            folders.add(os.path.dirname(os.path.abspath(inspect.getfile(type(m)))))
        except (TypeError, OSError):
            pass
    here = os.path.dirname(os.path.abspath(__file__))
    folders.update({here, os.path.join(os.path.dirname(here), "kernels")})
    comfy_ver = "-"
    try:
        import comfyui_version  # ComfyUI's root module
        comfy_ver = getattr(comfyui_version, "__version__", "-")
    except Exception:  # noqa: BLE001 - an older ComfyUI without it: the files' digest still serves
        pass
    return f"{_files_digest(tuple(sorted(folders)))}|{comfy_ver}|{_dist_version('comfy-kitchen')}"


def block_key(block: torch.nn.Module) -> str:
    """The block's part of every entry key (module_fingerprint and code_key), as one digest: made
    once per block per sampling run, so a block call hashes only its own arguments."""
    return hashlib.sha256(repr((module_fingerprint(block), code_key(block))).encode()).hexdigest()[:24]


# The fingerprints of the dicts a block call gets (``transformer_options``) within one model call:
# ComfyUI hands every block the same dict, changing only its per-block entries (VOLATILE_OPTIONS,
# left out of the key), and walking it took 25-35 us a block call on the host (Flux: 57 a step).
# Keyed by the dict's own entries, (name, id of the value), holding the values so no id is reused
# while the memo lives; the regional compile's APPLY_MODEL wrapper empties it at every model call
# (new_call), so what a later call changes in place is seen.
_DICT_MEMO: dict = {}
_DICT_MEMO_MAX = 64


def new_call() -> None:
    """Forgets the per-call fingerprints (see _DICT_MEMO): at the start of every model call."""
    _DICT_MEMO.clear()


def _dict_fingerprint(d: dict, skip: tuple, tokens: str):
    """``fingerprint(d, skip, 1, tokens)``, once per model call for the same entries."""
    items = [(k, v) for k, v in d.items() if k not in skip]
    snap = (tokens, skip, tuple((k, id(v)) for k, v in items))
    hit = _DICT_MEMO.get(snap)
    if hit is None:
        if len(_DICT_MEMO) >= _DICT_MEMO_MAX:
            _DICT_MEMO.clear()
        hit = _DICT_MEMO[snap] = ([v for _, v in items], fingerprint(d, skip, 1, tokens))
    return hit[1]


def call_fingerprint(kwargs: dict, skip: tuple, tokens: str):
    """``fingerprint(kwargs, skip, tokens=tokens)`` with the dict arguments through the per-call memo."""
    return ("dict",) + tuple(sorted(((str(k), _dict_fingerprint(x, skip, tokens) if type(x) is dict
                                      else fingerprint(x, skip, 1, tokens))
                                     for k, x in kwargs.items() if k not in skip), key=lambda kv: kv[0]))


# ----------------------------------------------------------------------------- entries
class Entries:
    """One block class's AOT-compiled functions (for one set of options): in memory, on disk."""

    def __init__(self, region: str, folder: str, opts_key: str, base_filter: Callable, source: Callable,
                 torch_options: dict, dynamic, limit: int):
        self.region = region
        self.folder = folder
        self.opts_key = opts_key
        self.base_filter = base_filter
        self.source = source            # the class's forward (a fresh function: see compile_model)
        self.torch_options = torch_options
        self.dynamic = dynamic
        self.limit = limit
        self.fns: dict = {}             # entry key -> AOT-compiled function, or None (use Dynamo)
        self.broken = None              # why this class cannot go ahead-of-time, once found
        self.compiled = 0
        self.loaded = 0
        self.load_s = 0.0
        self.lock = threading.Lock()

    def _name(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]", "_", self.region.rsplit(".", 1)[-1])

    def path(self, key: str) -> str:
        return os.path.join(self.folder, f"{self._name()}-{key}.bin")

    def saved_any(self) -> bool:
        """Whether this class has an entry on disk in ``folder`` (of any key): a run that finds
        none will compile."""
        return bool(self.folder) and bool(glob.glob(os.path.join(glob.escape(self.folder), f"{self._name()}-*.bin")))

    def key(self, block: str, args, kwargs, skip: tuple) -> str:
        """The entry key of a call: the block's digest (:func:`block_key`) and the call's arguments
        without the ``skip`` entries of its dicts. The pack's calibrated choices are not in it: as on Dynamo's path (compile_model.TRACE_CHOICES_SOURCE),
        a block keeps the paths of the size it was traced at."""
        sizes = {None: "token", False: "exact", True: "any"}[self.dynamic]
        desc = (self.region, self.opts_key, block, fingerprint(args, skip, tokens=sizes),
                call_fingerprint(kwargs, skip, sizes),
                torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        return hashlib.sha256(repr(desc).encode()).hexdigest()[:24]

    def lookup(self, key: str):
        """The entry for ``key``: this process's, else loaded from disk, else None (compile it)."""
        if key in self.fns:
            return self.fns[key]
        path = self.path(key)
        if not os.path.isfile(path):
            return None
        t0 = time.perf_counter()
        try:
            with open(path, "rb") as f:
                fn = torch.compiler.load_compiled_function(f)
        except Exception as e:  # noqa: BLE001 - corrupt, foreign or from another torch: compile afresh
            log_once(f"load:{self.region}:{type(e).__name__}",
                     f"could not load the saved {self.region.rsplit('.', 1)[-1]} ({type(e).__name__}: "
                     f"{str(e)[:200]}); compiling it afresh", logging.WARNING)
            return None
        self.load_s += time.perf_counter() - t0
        self.loaded += 1
        self.fns[key] = fn
        return fn

    def compile(self, key: str, block, args, kwargs):
        """AOT-compiles the class for this call (its token dims already marked dynamic), saves it;
        the function, or None when this class cannot go ahead-of-time (then Dynamo serves it)."""
        if self.broken:
            self.fns[key] = None
            return None
        if sum(callable(f) for f in self.fns.values()) >= self.limit:
            # as Dynamo does past its recompile limit: this variant runs eagerly
            self.fns[key] = OVER_LIMIT
            log_once(f"limit:{self.region}", f"{self.region.rsplit('.', 1)[-1]} has {self.limit} compiled variant(s), "
                     "the cache_size_limit: calls of another shape or dtype run eagerly")
            return OVER_LIMIT
        opts = dict(self.torch_options, guard_filter_fn=aot_guard_filter(self.base_filter))
        # the regional compile's per-call forward on the block (a closure over these entries and their
        # lock) is not part of the traced code and must not be pickled with the block's guard state
        installed = vars(block).pop("forward", None)
        try:
            with _aot_enabled():
                c = torch.compile(self.source, backend="inductor", fullgraph=True, options=opts, dynamic=self.dynamic)
            fn = c.aot_compile(((block,) + tuple(args), dict(kwargs)))
        except Exception as e:  # noqa: BLE001 - a graph break, an unsupported construct: Dynamo's path
            self.broken = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            self.fns[key] = None
            log_once(f"aot:{self.region}", f"{self.region.rsplit('.', 1)[-1]} cannot be compiled ahead of time "
                     f"({self.broken}); it compiles through Dynamo and re-traces after a restart")
            return None
        finally:
            if installed is not None:
                block.forward = installed
        self.compiled += 1
        self.fns[key] = fn
        try:
            os.makedirs(self.folder, exist_ok=True)
            fn.save_compiled_function(self.path(key))
        except Exception as e:  # noqa: BLE001 - unpicklable guard or a full disk: works now, not saved
            log_once(f"save:{self.region}:{type(e).__name__}",
                     f"could not save the compiled {self.region.rsplit('.', 1)[-1]} ({type(e).__name__}: "
                     f"{str(e)[:200]}); a restart compiles it again", logging.WARNING)
        return fn

    def drop(self, key: str, why: str) -> None:
        """Routes ``key`` to Dynamo's path for the rest of the process."""
        self.fns[key] = None
        log_once(f"guard:{self.region}:{key}", f"a saved {self.region.rsplit('.', 1)[-1]} does not fit this call "
                 f"({why[:200]}); it compiles through Dynamo")


def guard_failure(e: BaseException) -> bool:
    return isinstance(e, RuntimeError) and "GuardManager check failed" in str(e)
