"""Triton Compile Model: regional ``torch.compile`` of a diffusion model's repeated blocks.

``TorchCompileModel`` compiles the whole ``diffusion_model``: Dynamo unrolls every block, so
Inductor compiles Flux's 19 + 38 identical blocks (HunyuanVideo's 20 + 40, WAN's 40) one by one,
and a new resolution or frame count compiles everything again. This node compiles each *block
class* once and runs every block of that class through the same compiled code (torch's
"regional compilation" recipe):

* Regions: the block lists of the diffusion model (``find_regions``): the elements of its own
  ``nn.ModuleList``s (Flux/Chroma/HunyuanVideo ``double_blocks``/``single_blocks``, WAN ``blocks``,
  SD3 ``joint_blocks``), and of nested lists a class with MIN_NESTED_BLOCKS or more elements (the
  UNets' ``transformer_blocks`` inside their SpatialTransformers...; not HunyuanVideo's two
  token-refiner blocks). With ``parts`` = blocks+glue the
  top-level modules that contain no block (embedders, final layer) are compiled too, each class
  once; the rest of the forward stays eager.
* One compiled function per (block class, options): ``torch.compile`` of the class's
  ``forward`` with ``inline_inbuilt_nn_modules`` (torch's default): a block's parameters are
  graph inputs, not constants, so every block of the class passes the same guards and runs the
  same graph, and weights that ComfyUI patches in place (LoRA) never recompile. The function
  gets its own copy of the code object, so its compiled entries and recompile budget
  (``cache_size_limit``) are its own: ComfyUI's ``TorchCompileModel`` and other compiled
  models keep theirs.
* Shapes: ``auto`` marks the token (sequence) dimension of the block inputs dynamic from the
  first compile (``torch._dynamo.maybe_mark_dynamic``), so a new resolution, frame count or
  prompt length reuses the compiled code; anything else that changes recompiles once, with the
  changed dims dynamic (torch's automatic dynamic).
* Guards: ComfyUI writes per-block bookkeeping into ``transformer_options`` (``block_index``,
  ``block``, ``activations_shape``, ``uuids``...); guards on those entries are dropped (they would
  compile one graph per block), guards on the rest (the attention override, patches) stay. So are
  the guards on the pack's calibrated path choices (the Attention and fp8 Fallback nodes in auto):
  a compiled block keeps the paths measured for the size it was traced at (see
  ``TRACE_CHOICES_SOURCE``).
* Installed per call by an ``APPLY_MODEL`` wrapper on a clone (the way ComfyUI's own
  ``set_torch_compile_wrapper`` installs its compiled model), removed after the call: bypassing
  the node restores ComfyUI's behaviour. A block whose weights are not all on the compute device
  (lowvram/offloaded) or that carries lowvram LoRA weight functions runs eagerly (logged once);
  under ComfyUI's ``TorchCompileModel`` the node steps aside (that node compiles everything).
* Warm restarts: where the installed torch has ahead-of-time compile (2.10+), each block class is
  compiled through it and saved, and a new process loads it without tracing (nodes/compile_aot.py:
  what keys an entry, which guards it keeps, when it falls back to the path below). Otherwise, and
  for classes that cannot go ahead-of-time, Dynamo traces them again after a restart and
  Inductor's FX-graph and AOTAutograd caches (on by default, in the Inductor cache folder) hand back
  the compiled code. After a run that compiled, torch's portable cache artefacts
  (``torch.compiler.save_cache_artifacts``) are written to ``<inductor cache>/tritonkit_compile/``
  under a key of the torch, Triton, Python, pack and device versions, and loaded at the first run
  of a later process. Being inside the Inductor cache folder, they are cleared with it
  (``install.py``'s cache step). Each run's log line says what compiled, how long it took and
  what came from the caches.
"""
from __future__ import annotations

import collections
import hashlib
import inspect
import logging
import os
import platform
import threading
import time
import types
from dataclasses import dataclass, field
from typing import Optional

import torch

from . import compile_aot

log = logging.getLogger("TritonKit")

PARTS = ("blocks", "blocks+glue")
MODES = ("default", "max-autotune-no-cudagraphs")
DYNAMIC = ("auto", "torch", "false", "true")
DEFAULT_CACHE_SIZE_LIMIT = 16
WRAPPER_KEY = "tritonkit_compile"
COMFY_COMPILE_KEY = "torch.compile"           # ComfyUI's set_torch_compile_wrapper
ARTIFACT_FOLDER = "tritonkit_compile"
MAX_STRUCTURES = 4                            # differently built blocks of one class (SDXL: depths)
# A class found only in nested lists (not in a list of the diffusion model itself) is compiled when
# the model has at least this many of it: HunyuanVideo's 2 TokenRefinerBlocks run on the text tokens
# alone, and their compile (a third graph) cost more of a cold start than they ever save.
MIN_NESTED_BLOCKS = 4
# transformer_options entries ComfyUI rewrites per block, per call or per prompt: guards on them
# would compile one graph per block (block_index), per prompt (uuids) or per resolution ("img_slice": the
# text and image token counts, which Flux and HunyuanVideo set before their single blocks since upstream's
# 2026-02-16 change, between ComfyUI 0.11 and 0.18, and which their SingleStreamBlock reads through
# ``transformer_options.copy()``: a resolution change recompiled it, seen with ComfyUI 0.33.0)
VOLATILE_OPTIONS = ("block_index", "block", "total_blocks", "block_type", "activations_shape",
                    "original_shape", "uuids", "cond_or_uncond", "sigmas", "sample_sigmas",
                    "transformer_index", "current_index", "img_slice")

_logged: set = set()
_lock = threading.Lock()


def log_once(key: str, msg: str, level: int = logging.INFO) -> None:
    if key not in _logged:
        _logged.add(key)
        log.log(level, "TritonKit compile: %s", msg)


# ----------------------------------------------------------------------------- regions
@dataclass
class Region:
    """Blocks of one class that run through one compiled function."""
    cls: type
    paths: list = field(default_factory=list)     # module paths inside the diffusion model
    kind: str = "block"                            # block or glue

    @property
    def name(self) -> str:
        return self.cls.__name__


def _structure(m: torch.nn.Module) -> tuple:
    return tuple((n, type(c).__name__) for n, c in m.named_modules())


def _is_container(m) -> bool:
    return isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict))


def find_regions(dm: torch.nn.Module, parts: str = "blocks") -> list[Region]:
    """The repeated blocks of ``dm``: the elements of its ``nn.ModuleList``s that sit in a list of
    ``dm`` itself (a model's main block list, like Flux's double_blocks, even of depth 1), or whose
    class has MIN_NESTED_BLOCKS or more such elements in the model's nested lists (one per list, like
    the UNets' transformer_blocks), in at most MAX_STRUCTURES different builds; outermost first
    (nothing inside a chosen block is chosen again). With ``parts`` = blocks+glue also the
    top-level children that hold no block. Modules that are containers themselves, that define no
    ``forward`` of their own, or that carry their own ``forward`` attribute are left out."""
    cands: list[tuple[str, torch.nn.Module]] = []
    top: set = set()  # classes found in a module list that is a direct child of dm
    for path, mod in dm.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and path:
            for i, k in enumerate(mod):
                if _is_container(k) or type(k).forward is torch.nn.Module.forward or "forward" in vars(k):
                    continue
                cands.append((f"{path}.{i}", k))
                if "." not in path:
                    top.add(type(k))
    count = collections.Counter(type(k) for _, k in cands)
    builds = collections.defaultdict(set)
    for _, k in cands:
        builds[type(k)].add(_structure(k))
    by_cls: dict[type, Region] = {}
    taken: list[str] = []

    def inside(path):
        return any(path.startswith(t + ".") for t in taken)

    for path, k in cands:  # preorder: outer blocks come first
        cls = type(k)
        if (count[cls] < MIN_NESTED_BLOCKS and cls not in top) or len(builds[cls]) > MAX_STRUCTURES \
                or inside(path):
            continue
        by_cls.setdefault(cls, Region(cls)).paths.append(path)
        taken.append(path)
    if parts == "blocks+glue":
        for name, child in dm.named_children():
            if any(t == name or t.startswith(name + ".") for t in taken) or _is_container(child):
                continue
            if type(child).forward is torch.nn.Module.forward or "forward" in vars(child):
                continue
            reg = by_cls.get(type(child))
            if reg is None:
                reg = by_cls[type(child)] = Region(type(child), kind="glue")
            reg.paths.append(name)
    return list(by_cls.values())


# ----------------------------------------------------------------------------- compiled functions
# The calibrated choices a traced block reads (kernels/calibration.py ``_TRACE_CHOICES``, set per
# model call for that call's shape classes). A guard on them would recompile a block whenever a
# new resolution or frame count was measured faster with another path; without it the graph keeps
# the paths of the size it was traced at (each is numerically valid, only the speed differs), which
# costs less than a recompile of every block class (7-15 s on HunyuanVideo).
TRACE_CHOICES_SOURCE = "._TRACE_CHOICES"


def _guard_filter(entries):
    """Drops the guards on ComfyUI's per-block/per-call transformer_options entries and on the
    calibrated choices read while tracing."""
    keep = []
    for e in entries:
        name = getattr(e, "name", "") or ""
        volatile = "transformer_options" in name and any(f"'{k}'" in name for k in VOLATILE_OPTIONS)
        keep.append(not (volatile or TRACE_CHOICES_SOURCE in name))
    return keep


def _fresh_function(fn):
    """``fn`` with a code object of its own: Dynamo keeps its compiled entries and recompile count
    on the code object, so this function's are separate from every other compile of ``fn``."""
    code = fn.__code__.replace()
    new = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    return new


@dataclass
class Options:
    mode: str = "default"
    dynamic: str = "auto"
    parts: str = "blocks"
    cache_size_limit: int = DEFAULT_CACHE_SIZE_LIMIT

    def check(self) -> "Options":
        for val, allowed, what in ((self.mode, MODES, "mode"), (self.dynamic, DYNAMIC, "dynamic"),
                                   (self.parts, PARTS, "parts")):
            if val not in allowed:
                raise ValueError(f"Triton Compile Model: {what} must be one of {', '.join(allowed)}, not {val!r}")
        if not isinstance(self.cache_size_limit, int) or not 1 <= self.cache_size_limit <= 1024:
            raise ValueError("Triton Compile Model: cache_size_limit must be a whole number from 1 to 1024 "
                             f"(compiled variants kept per block class), not {self.cache_size_limit!r}")
        return self


@dataclass
class Compiled:
    """One block class's compiled forward and what it cost."""
    region: str
    fn: object
    graphs: int = 0          # graphs compiled through this function (Dynamo's or ahead-of-time)
    compile_s: float = 0.0   # time of the calls that compiled
    calls: int = 0
    aot: Optional[compile_aot.Entries] = None  # the ahead-of-time entries, where torch has them


_COMPILED: dict = {}
# torch.compile(recompile_limit=...) (newer torch): a limit for this function alone
PER_COMPILE_LIMIT = "recompile_limit" in inspect.signature(torch.compile).parameters


def _torch_dynamic(dynamic: str):
    return {"auto": None, "torch": None, "false": False, "true": True}[dynamic]


POINTWISE_TUNE_ENV = "TRITONKIT_COMPILE_POINTWISE_TUNE"  # 1: Inductor's pointwise autotuning, as before
REDUCTION_TUNE_ENV = "TRITONKIT_COMPILE_REDUCTION_TUNE"  # 1: Inductor's reduction autotuning, as before


def _env_on(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "yes", "on")


def _can_filter_reductions() -> bool:
    try:
        from torch._inductor import config as ic
        return isinstance(getattr(ic.test_configs, "force_filter_reduction_configs", None), bool)
    except Exception:  # noqa: BLE001 - an Inductor without it tunes its reductions, as before
        return False


def _inductor_overrides(mode: str = "default") -> dict:
    """Inductor settings this node sets beyond the mode's: one block config per kernel where
    Inductor would otherwise compile several and time them at the first call.

    * Pointwise kernels (``triton.autotune_pointwise`` off): Inductor's one default config
      instead of 2 (1-D) or 6 (2-D). On an H100 (2026-11-25, both nodes, native, two cold
      processes each way) the block graphs held 51 instead of 72 Triton kernels for HunyuanVideo
      and 36 instead of 53-97 for Flux, compiled in 13.2-14.6 s instead of 15.3-17.4 (HunyuanVideo)
      and 11.9-12.4 s instead of 13.4-16.0 (Flux), and ran as fast (0.926-0.927 against 0.930
      s/step; 0.151-0.153 against 0.155-0.158). ``TRITONKIT_COMPILE_POINTWISE_TUNE=1`` restores it.
    * Reductions without a layout hint (``ReductionHint.DEFAULT``, e.g. a layer norm over a
      dynamic token count: 2 of HunyuanVideo's 27): Inductor compiles 6 configs of each, one after
      another in one worker, the last kernels the compile waits for. Its own one-config choice
      (``test_configs.force_filter_reduction_configs``, the rule its deterministic mode uses)
      instead, where the installed Inductor has it. ``TRITONKIT_COMPILE_REDUCTION_TUNE=1``
      restores the tuning.

    The ``max-autotune`` modes tune both anyway (the reductions' filter is left off there)."""
    out = {}
    if not _env_on(POINTWISE_TUNE_ENV):
        out["triton.autotune_pointwise"] = False
    if mode == "default" and not _env_on(REDUCTION_TUNE_ENV) and _can_filter_reductions():
        out["test_configs.force_filter_reduction_configs"] = True
    return out


def compiled_for(cls: type, opts: Options) -> Compiled:
    """The compiled forward of block class ``cls`` for ``opts`` (one per process)."""
    overrides = _inductor_overrides(opts.mode)
    key = (cls, opts.mode, opts.dynamic, opts.cache_size_limit, tuple(sorted(overrides.items())))
    with _lock:
        c = _COMPILED.get(key)
        if c is None:
            options = {"guard_filter_fn": _guard_filter, **overrides}
            if opts.mode != "default":
                from torch._inductor import list_mode_options
                options.update(list_mode_options(opts.mode, _torch_dynamic(opts.dynamic)))
            kw = {}
            if PER_COMPILE_LIMIT:
                kw["recompile_limit"] = opts.cache_size_limit
            fn = torch.compile(_fresh_function(cls.forward), backend="inductor", options=options,
                               dynamic=_torch_dynamic(opts.dynamic), **kw)
            c = _COMPILED[key] = Compiled(f"{cls.__module__}.{cls.__qualname__}", fn)
            if compile_aot.enabled() and opts.dynamic != "torch":
                # torch's automatic dynamic (recompile once as dynamic) is Dynamo's own: that
                # setting keeps Dynamo's path
                c.aot = compile_aot.Entries(c.region, None, "|".join([opts.mode, opts.dynamic]
                                                                      + [f"{k}={v}" for k, v in key[-1]]),
                                            _guard_filter,
                                            _fresh_function(cls.forward),
                                            {k: v for k, v in options.items() if k != "guard_filter_fn"},
                                            _torch_dynamic(opts.dynamic), opts.cache_size_limit)
    return c


def _mark_tokens(values) -> None:
    """Hints the token dimension of each tensor input dynamic: for tensors of 3+ dims, the largest
    dim between the first and the last, if it is at least compile_aot.TOKEN_DIM_MIN."""
    for v in values:
        d = compile_aot.token_dim(v)
        if d is not None:
            torch._dynamo.maybe_mark_dynamic(v, d)


_MISS = object()


def _run_aot(comp: Compiled, block, block_key, args, kwargs, mark: bool):
    """The block call through the class's ahead-of-time entry for this call (loaded from disk or
    compiled and saved here), or _MISS where Dynamo's path serves it. The token dims are marked
    dynamic on the inputs of the call that compiles only: a saved entry's guards come back without
    the compile-time markings (torch pickles the example tensors without them), so a loaded entry
    refuses marked inputs, and an entry compiled in this process accepts unmarked ones."""
    entries = comp.aot
    stance = compile_aot.stance()
    if stance == "force_eager":  # the calibration's first call (nodes/calibration.py), as Dynamo does
        return type(block).forward(block, *args, **kwargs)
    key = entries.key(block_key, args, kwargs, VOLATILE_OPTIONS)
    fn = entries.fns.get(key, _MISS)
    if fn is _MISS:
        with entries.lock:
            fn = entries.lookup(key)
            if fn is None and key not in entries.fns:
                if stance == "eager_on_recompile":
                    return type(block).forward(block, *args, **kwargs)
                if mark:
                    _mark_tokens(args)
                    _mark_tokens(kwargs.values())
                t0 = time.perf_counter()
                fn = entries.compile(key, block, args, kwargs)
                if callable(fn):
                    out = fn(block, *args, **kwargs)
                    comp.graphs += 1
                    comp.compile_s += time.perf_counter() - t0
                    # an ahead-of-time compile is a Dynamo capture that torch does not count: counted
                    # here as one compiled frame and graph, so whoever reads Dynamo's counters (the
                    # bench's compiling step, a user's torch._dynamo.utils.counters) sees it
                    counters = _dynamo_counters()
                    for group, name in (("frames", "total"), ("frames", "ok"), ("stats", "unique_graphs")):
                        counters[group][name] += 1
                    return out
    if fn is None:
        return _MISS
    if fn is compile_aot.OVER_LIMIT:
        return type(block).forward(block, *args, **kwargs)
    try:
        return fn(block, *args, **kwargs)
    except RuntimeError as e:
        if not compile_aot.guard_failure(e):
            raise
        entries.drop(key, str(e))
        return _MISS


def make_runner(block: torch.nn.Module, comp: Compiled, mark: bool, block_key=None):
    """The ``forward`` installed on ``block`` while the model runs: the class's compiled forward
    with ``block`` as ``self`` (its ahead-of-time entry where there is one: ``block_key`` is the
    block's part of the entry key)."""
    fn = comp.fn
    counters = _dynamo_counters()

    def forward(*args, **kwargs):
        # folder: set when sampling starts (outer_sample); a call outside ComfyUI's sampler takes Dynamo's path
        if block_key is not None and comp.aot.broken is None and comp.aot.folder is not None:
            out = _run_aot(comp, block, block_key, args, kwargs, mark)
            if out is not _MISS:
                comp.calls += 1
                return out
        if mark:
            _mark_tokens(args)
            _mark_tokens(kwargs.values())
        before = counters["stats"]["unique_graphs"]
        t0 = time.perf_counter()
        out = fn(block, *args, **kwargs)
        new = counters["stats"]["unique_graphs"] - before
        if new:
            comp.graphs += new
            comp.compile_s += time.perf_counter() - t0
        comp.calls += 1
        return out

    forward.tritonkit_compile = comp
    return forward


def _dynamo_counters():
    from torch._dynamo.utils import counters
    return counters


# ----------------------------------------------------------------------------- eligibility per call
def block_problem(block: torch.nn.Module, device: torch.device, frozen: Optional[list] = None) -> Optional[str]:
    """None when ``block`` can run compiled on ``device``, else why not. Parameters that require
    grad are switched off into ``frozen`` (see ``make_wrappers``)."""
    for p in block.parameters():
        if p.device != device:
            return "weights not on the compute device (lowvram/offloaded): those blocks run eagerly"
        if p.requires_grad and frozen is not None:
            p.requires_grad_(False)
            frozen.append(p)
    for m in block.modules():
        if getattr(m, "weight_function", None) or getattr(m, "bias_function", None):
            return "lowvram LoRA weight functions on the block: those blocks run eagerly"
    return None


# ----------------------------------------------------------------------------- cache artefacts
def _pack_version() -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        with open(os.path.join(here, "pyproject.toml"), encoding="utf-8") as f:
            ver = next((ln.split("=", 1)[1].strip().strip('"') for ln in f if ln.startswith("version")), "?")
    except OSError:
        ver = "?"
    with open(os.path.abspath(__file__), "rb") as f:
        return f"{ver}+{hashlib.sha256(f.read()).hexdigest()[:12]}"


def artifact_key(device: Optional[torch.device] = None) -> str:
    """A key that changes with torch, Triton, Python, the pack and the device."""
    try:
        import triton
        tv = triton.__version__
    except Exception:  # noqa: BLE001 - a CPU install without Triton still compiles (C++)
        tv = "none"
    dev = "cpu"
    if device is not None and device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        dev = f"{p.name}-sm{p.major}{p.minor}"
    parts = (torch.__version__, tv, platform.python_version(), _pack_version(), dev)
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def artifact_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    return os.path.join(cache_dir(), ARTIFACT_FOLDER)


def artifact_path(device=None) -> str:
    return os.path.join(artifact_dir(), f"artifacts-{artifact_key(device)}.bin")


def portable_cache_available() -> bool:
    return callable(getattr(torch.compiler, "save_cache_artifacts", None)) and \
        callable(getattr(torch.compiler, "load_cache_artifacts", None))


_LOADED: dict = {}


def load_artifacts(device=None) -> Optional[str]:
    """Loads this set-up's saved artefacts into torch's local caches (once per process); returns
    what happened, or None when there was nothing to load."""
    if not portable_cache_available():
        return None
    path = artifact_path(device)
    if path in _LOADED:
        return _LOADED[path]
    msg = None
    if os.path.isfile(path):
        t0 = time.perf_counter()
        try:
            with open(path, "rb") as f:
                torch.compiler.load_cache_artifacts(f.read())
            msg = f"loaded saved compile artefacts ({os.path.getsize(path) / 2**20:.1f} MiB) in " \
                  f"{time.perf_counter() - t0:.2f} s"
        except Exception as e:  # noqa: BLE001 - a corrupt/foreign file: compile afresh and say so
            msg = f"could not load {path} ({type(e).__name__}: {e}); compiling afresh"
            log.warning("TritonKit compile: %s", msg)
    _LOADED[path] = msg
    return msg


def save_artifacts(device=None) -> Optional[str]:
    """Writes torch's portable cache artefacts of this process (atomically)."""
    if not portable_cache_available():
        return None
    res = torch.compiler.save_cache_artifacts()
    if not res:
        return None
    data = res[0]
    path = artifact_path(device)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------- per-run accounting
def _cache_counters() -> dict:
    c = _dynamo_counters()
    return {"fx_hit": c["inductor"].get("fxgraph_cache_hit", 0),
            "fx_miss": c["inductor"].get("fxgraph_cache_miss", 0),
            "aot_hit": c["aot_autograd"].get("autograd_cache_hit", 0),
            "aot_miss": c["aot_autograd"].get("autograd_cache_miss", 0)}


class RunStats:
    """What the last run of a compiled model did (for the log line, the bench and the tests)."""

    def __init__(self):
        self.reset()

    def reset(self, comps=()):
        self.comps = list(comps)
        self.graphs0 = {id(c): c.graphs for c in self.comps}
        self.time0 = {id(c): c.compile_s for c in self.comps}
        self.cache0 = _cache_counters()
        self.eager: collections.Counter = collections.Counter()
        self.compiled_calls = 0
        self.stepped_aside = False
        self.loaded = None
        self.aot0 = {id(c): (c.aot.loaded, c.aot.load_s, c.aot.compiled) if c.aot else (0, 0.0, 0)
                     for c in self.comps}

    def aot(self) -> tuple:
        """(entries loaded, seconds loading them, entries compiled ahead-of-time) in this run."""
        n = s = k = 0
        for c in self.comps:
            if c.aot:
                n0, s0, k0 = self.aot0[id(c)]
                n, s, k = n + c.aot.loaded - n0, s + c.aot.load_s - s0, k + c.aot.compiled - k0
        return n, s, k

    def graphs(self) -> dict:
        return {c.region.rsplit(".", 1)[-1]: c.graphs - self.graphs0[id(c)] for c in self.comps}

    def compile_s(self) -> float:
        return sum(c.compile_s - self.time0[id(c)] for c in self.comps)

    def cache(self) -> dict:
        now = _cache_counters()
        return {k: now[k] - self.cache0[k] for k in now}

    def summary(self) -> str:
        if self.stepped_aside:
            return "stepped aside: ComfyUI's TorchCompileModel compiles this whole model"
        g = self.graphs()
        n = sum(g.values())
        cache = self.cache()
        parts = []
        aot_n, aot_s, aot_k = self.aot()
        if aot_n:
            parts.append(f"{aot_n} compiled block graph(s) loaded ahead-of-time in {aot_s:.2f} s (no tracing)")
        if n:
            src = "from the caches" if cache["fx_hit"] and not cache["fx_miss"] else \
                  "compiled fresh" if not cache["fx_hit"] else "partly from the caches"
            parts.append(f"{n} graph(s) compiled ({', '.join(f'{k} {v}' for k, v in g.items() if v)}) in "
                         f"{self.compile_s():.1f} s, {src}: FX-graph cache {cache['fx_hit']} hit(s) / "
                         f"{cache['fx_miss']} miss(es), AOTAutograd cache {cache['aot_hit']} / {cache['aot_miss']}")
            if aot_k:
                parts.append(f"{aot_k} of them saved ahead-of-time for the next restart")
        elif not aot_n:
            parts.append("no new compile (reused the compiled blocks)")
        parts.append(f"{self.compiled_calls} block calls compiled")
        if self.eager:
            parts.append("eager: " + "; ".join(f"{r} x{k}" for r, k in self.eager.most_common()))
        if self.loaded:
            parts.append(self.loaded)
        return "; ".join(parts)


STATS = RunStats()


def stats() -> dict:
    """The last run's counters (the bench's ``_counter_snapshot`` reads this)."""
    g = STATS.graphs() if STATS.comps else {}
    out = {"graphs": sum(g.values()), "compiled_block_calls": STATS.compiled_calls,
           "eager_block_calls": sum(STATS.eager.values()), "compile_s": STATS.compile_s() if STATS.comps else 0.0}
    out.update({f"cache_{k}": v for k, v in STATS.cache().items()})
    aot_n, aot_s, aot_k = STATS.aot() if STATS.comps else (0, 0.0, 0)
    out.update(aot_loaded=aot_n, aot_load_s=aot_s, aot_compiled=aot_k)
    out.update({f"graphs_{k}": v for k, v in g.items()})
    return out


# ----------------------------------------------------------------------------- installing
def _has_comfy_compile(transformer_options) -> bool:
    try:
        import comfy.patcher_extension as pe
        return bool(transformer_options.get("wrappers", {}).get(pe.WrappersMP.APPLY_MODEL, {}).get(COMFY_COMPILE_KEY))
    except Exception:  # noqa: BLE001
        return False


def make_wrappers(regions: list[Region], opts: Options):
    """(APPLY_MODEL wrapper, OUTER_SAMPLE wrapper) that install the compiled forwards."""
    import comfy.utils
    mark = opts.dynamic == "auto"
    comps = {r.cls: compiled_for(r.cls, opts) for r in regions}
    # Parameters switched to requires_grad=False for the run: a checkpoint's weights load with
    # requires_grad on, a LoRA-patched weight is a new Parameter with it off, and Dynamo's guards
    # check the flag: without this the first LoRA would compile every block class again. Sampling
    # never needs gradients; the flags are restored when the run ends.
    frozen: list = []
    # The run's plan, made at its first call (ComfyUI loads the model, lowvram or not, before it):
    # the blocks that run compiled with their installed forwards, and the eager ones with reasons.
    plan: dict = {"key": None, "compiled": [], "eager": collections.Counter()}

    def make_plan(base, device):
        compiled, eager = [], collections.Counter()
        for r in regions:
            comp = comps[r.cls]
            for p in r.paths:
                block = comfy.utils.get_attr(base, f"diffusion_model.{p}")
                why = block_problem(block, device, frozen) if device is not None else None
                if why is None and "forward" in vars(block):
                    why = "the block's forward is patched by someone else: those blocks run eagerly"
                if why is not None:
                    eager[why] += 1
                    log_once("eager:" + why, why)
                    continue
                key = compile_aot.block_key(block) if comp.aot else None
                compiled.append((block, make_runner(block, comp, mark, key)))
        plan.update(key=(id(base), device), compiled=compiled, eager=eager)

    def apply_model(executor, *args, **kwargs):
        # BaseModel.apply_model(x, t, c_concat, c_crossattn, control, transformer_options, **kw)
        topts = kwargs.get("transformer_options", args[5] if len(args) > 5 else None) or {}
        if _has_comfy_compile(topts):
            STATS.stepped_aside = True
            log_once("aside", "ComfyUI's TorchCompileModel is on this model too: it compiles the whole model, "
                              "so the regional compile steps aside (use one of the two)")
            return executor(*args, **kwargs)
        x = args[0] if args else kwargs.get("x")
        device = x.device if isinstance(x, torch.Tensor) else None
        base = executor.class_obj
        if plan["key"] != (id(base), device):
            make_plan(base, device)
        STATS.eager.update(plan["eager"])
        compile_aot.new_call()
        installed = []
        try:
            for block, forward in plan["compiled"]:
                if "forward" not in vars(block):
                    block.forward = forward
                    installed.append(block)
            STATS.compiled_calls += len(installed)
            if PER_COMPILE_LIMIT:
                return executor(*args, **kwargs)
            # an older torch has only the global limit: raised (never lowered) while this model runs
            limit = torch._dynamo.config.cache_size_limit
            with torch._dynamo.config.patch(cache_size_limit=max(limit, opts.cache_size_limit)):
                return executor(*args, **kwargs)
        finally:
            for block in installed:
                vars(block).pop("forward", None)

    def prepare(device) -> bool:
        """Points the ahead-of-time entries at this set-up's folder, and starts Inductor's compile
        workers where a compile is coming. True when it started them."""
        folder = os.path.join(artifact_dir(), compile_aot.FOLDER_PREFIX + artifact_key(device))
        for c in comps.values():
            if c.aot is not None:
                c.aot.folder = folder
        return _needs_compile(comps.values()) and warm_compile_workers(device)

    def outer_sample(executor, *args, **kwargs):
        device = _model_device(executor)
        loaded = load_artifacts(device)
        prepare(device)
        STATS.reset(comps.values())
        STATS.loaded = loaded
        plan["key"] = None
        try:
            return executor(*args, **kwargs)
        finally:
            for p in frozen:
                p.requires_grad_(True)
            frozen.clear()
            plan.update(key=None, compiled=[], eager=collections.Counter())
            if sum(STATS.graphs().values()) and not STATS.stepped_aside:
                try:
                    path = save_artifacts(device)
                    if path:
                        log.debug("TritonKit compile: cache artefacts written to %s", path)
                except Exception as e:  # noqa: BLE001 - a full disk must not fail the run
                    log_once("save:" + type(e).__name__, f"could not write the cache artefacts: {e}",
                             logging.WARNING)
            log.info("TritonKit compile: %s", STATS.summary())

    outer_sample.prepare = prepare
    return apply_model, outer_sample


WARM_ENV = "TRITONKIT_COMPILE_WARM"


def warm_compile_workers(device: Optional[torch.device]) -> bool:
    """Starts Inductor's compile worker processes now (when the node runs, and again when
    sampling starts), where Inductor itself starts them only when its backend is first called,
    after Dynamo has traced the first block. The workers take seconds to import torch; until they
    answer, Inductor compiles each kernel in this process, one after the other (4.0 s of an 18.3 s
    cold Flux compile on an H100, 2026-11-24). Started at sampling, they were ready by the end of
    the eager calibration step; where the calibration is stored the first step compiles at once,
    and 3 to 13 of HunyuanVideo's kernels still compiled here (0.75-3.0 s, H100, 2026-11-26), so
    the node starts them when it runs, while ComfyUI encodes the prompt and loads the model. A
    second call does nothing new. A no-op off CUDA, and where Inductor compiles in one process
    (``compile_threads`` 1, as on Windows) or its warm pool is switched off (``TORCH_WARM_POOL=0``,
    or ``TRITONKIT_COMPILE_WARM=0`` for this early start alone). True when it started them."""
    if device is None or device.type != "cuda" or \
            os.environ.get(WARM_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    try:
        from torch._inductor import async_compile as ac
        threads = getattr(ac, "get_compile_threads", None)
        if threads is None or threads() <= 1:
            return False
        ac.maybe_warm_pool()
        # the readiness probe is sent with the first kernel otherwise, which then compiles here
        ac.AsyncCompile.use_process_pool()
        return True
    except Exception as e:  # noqa: BLE001 - an Inductor without these: it starts its pool itself
        log_once("warm:" + type(e).__name__, f"could not start Inductor's compile workers early ({e}); "
                 "Inductor starts them at its first compile", logging.DEBUG)
        return False


def _needs_compile(comps) -> bool:
    """Whether this run will likely compile: a class on Dynamo's path (a restart there still calls
    Inductor, which starts its workers anyway), or one with no ahead-of-time entry on disk."""
    return any(c.aot is None or c.aot.broken is not None or not c.aot.saved_any() for c in comps)


def _model_device(executor) -> Optional[torch.device]:
    try:
        guider = executor.class_obj
        dev = guider.model_patcher.load_device
        return torch.device(dev)
    except Exception:  # noqa: BLE001
        return None


def describe(regions: list[Region], opts: Options) -> str:
    blocks = [r for r in regions if r.kind == "block"]
    glue = [r for r in regions if r.kind == "glue"]
    lines = [f"Triton Compile Model: mode {opts.mode}, dynamic {opts.dynamic}, {opts.parts}, "
             f"up to {opts.cache_size_limit} compiled variants per class"]
    if blocks:
        lines.append("compiles once per class, reused by every block: " +
                     ", ".join(f"{r.name} x{len(r.paths)}" for r in blocks))
    if glue:
        lines.append("glue compiled per class: " + ", ".join(f"{r.name} x{len(r.paths)}" for r in glue))
    lines.append("compiles at the first sampling step; the log says what compiled, in how long, and what came "
                 "from the caches" + ("" if portable_cache_available() else
                                      " (this torch has no portable cache artefacts: Inductor's caches only)"))
    if compile_aot.enabled() and opts.dynamic != "torch":
        lines.append("each block class is saved compiled ahead of time: a restart loads it without tracing")
    done = [c for c in _COMPILED.values() if c.graphs and any(c.region.endswith("." + r.cls.__qualname__)
                                                             for r in regions)]
    if done:
        lines.append("already compiled in this process: " + ", ".join(
            f"{c.region.rsplit('.', 1)[-1]} {c.graphs} graph(s) in {c.compile_s:.1f} s" for c in done))
    return "\n".join(lines)


def compile_model(model, mode: str = "default", dynamic: str = "auto", parts: str = "blocks",
                  cache_size_limit: int = DEFAULT_CACHE_SIZE_LIMIT):
    """(clone with the regional compile installed, text for the node)."""
    import comfy.patcher_extension as pe
    opts = Options(mode, dynamic, parts, int(cache_size_limit)).check()
    dm = model.get_model_object("diffusion_model")
    regions = find_regions(dm, parts)
    if not regions:
        raise ValueError("Triton Compile Model: found no repeated blocks in this model's diffusion model "
                         f"({type(dm).__name__}); use ComfyUI's TorchCompileModel for it instead")
    clone = model.clone()
    apply_model, outer_sample = make_wrappers(regions, opts)
    try:
        outer_sample.prepare(torch.device(model.load_device))
    except Exception as e:  # noqa: BLE001 - sampling starts them anyway
        log_once("prepare:" + type(e).__name__, f"could not start the compile workers at patch time ({e})",
                 logging.DEBUG)
    clone.remove_wrappers_with_key(pe.WrappersMP.APPLY_MODEL, WRAPPER_KEY)
    clone.remove_wrappers_with_key(pe.WrappersMP.OUTER_SAMPLE, WRAPPER_KEY)
    clone.add_wrapper_with_key(pe.WrappersMP.APPLY_MODEL, WRAPPER_KEY, apply_model)
    clone.add_wrapper_with_key(pe.WrappersMP.OUTER_SAMPLE, WRAPPER_KEY, outer_sample)
    text = describe(regions, opts)
    if (getattr(model, "wrappers", None) or {}).get(pe.WrappersMP.APPLY_MODEL, {}).get(COMFY_COMPILE_KEY):
        text += "\nTorchCompileModel is already on this model: it compiles the whole model and this node steps aside"
    log.info("%s", text.replace("\n", "; "))
    return clone, text


class TritonCompileModel:
    CATEGORY = "TritonKit"
    FUNCTION = "patch"
    RETURN_TYPES = ("MODEL",)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("The model with its repeated blocks compiled (a clone; bypass the node to undo).",)
    DESCRIPTION = ("Compiles each repeated block class of the diffusion model once (Flux, Chroma, HunyuanVideo, WAN, "
                   "SD/SDXL transformer blocks...) and runs every block through it: seconds of compile instead of "
                   "minutes, new resolutions and frame counts reuse the compiled code, and restarts load it from "
                   "the caches. Use instead of TorchCompileModel; works with the Triton Attention and fp8 Fallback "
                   "nodes and with LoRAs.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": ("MODEL",),
            "mode": (list(MODES), {"default": "default", "tooltip":
                     "default: Inductor's default (fast to compile). max-autotune-no-cudagraphs: also times "
                     "alternative kernels for the matrix products (slower to compile, sometimes faster to run)."}),
            "dynamic": (list(DYNAMIC), {"default": "auto", "tooltip":
                        "auto: the token dimension is compiled dynamic from the start, so another resolution, frame "
                        "count or prompt length reuses the compiled blocks. torch: torch's automatic dynamic (the "
                        "first shape static, a change recompiles once as dynamic). false: one compile per shape. "
                        "true: every dimension dynamic."}),
            "parts": (list(PARTS), {"default": "blocks", "tooltip":
                      "blocks: only the repeated blocks (where nearly all the time goes). blocks+glue: also the "
                      "embedders and the final layer, each class once."}),
            "cache_size_limit": ("INT", {"default": DEFAULT_CACHE_SIZE_LIMIT, "min": 1, "max": 1024, "tooltip":
                                 "How many compiled variants (shapes, dtypes) each block class keeps before it falls "
                                 "back to eager. Raises torch's limit only while this model runs."}),
        }}

    def patch(self, model, mode="default", dynamic="auto", parts="blocks", cache_size_limit=DEFAULT_CACHE_SIZE_LIMIT):
        out, text = compile_model(model, mode, dynamic, parts, cache_size_limit)
        return {"ui": {"text": [text]}, "result": (out,)}


NODE_CLASS_MAPPINGS = {"TritonKitCompileModel": TritonCompileModel}
NODE_DISPLAY_NAME_MAPPINGS = {"TritonKitCompileModel": "Triton Compile Model"}
