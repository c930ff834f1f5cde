"""Calibration: time a few interchangeable paths once on the user's GPU, keep the fastest, remember it.

The nodes' ``auto`` modes have several ways to run the same call (ComfyUI's SDPA / our exact /
our 8-bit attention; torch's cast + mm / our decode + mm / our fused fp8 linear). Which is fastest
depends on the GPU, the driver, torch and Triton, so instead of thresholds measured on one card,
the first call of a shape class on a device times every allowed candidate on the real tensors
(:func:`choose`), picks the fastest, and stores the choice with its timings in a JSON file keyed
by GPU name, compute capability, driver, CUDA, torch, Triton and pack version (with a digest of the
kernels' sources, :func:`pack_version`). Later calls, later runs and restarts read the choice and
time nothing.

* Store: one file per environment, ``calibration-<id>.json`` in :func:`store_dir` (the
  ``TRITONKIT_CALIBRATION_DIR`` variable, else the folder the nodes set: ComfyUI's user folder,
  else a per-user cache folder). Written atomically (a temporary file in the same folder, then
  ``os.replace``). A file that is not valid JSON, not ours, or written for another environment is
  ignored with one log line (and replaced on the next write), never an error.
* ``TRITONKIT_CALIBRATION=0`` switches timing off: calls use the caller's conservative default.
  A device that can't be timed (CPU, the Triton interpreter) uses the default too.
* A new shape class does not stall the model while its candidates compile: its first call starts
  their compiles in the background (kernels/prepare.py) and runs a path that has nothing left to
  compile (see :func:`choose`); the first call after they are ready times them. So the compiles of
  every shape class a first step meets overlap each other and the model's own work. :func:`synchronous` (a compiled model's eager
  first call), ``TRITONKIT_CALIBRATION_DEFER=0`` or a Triton without asynchronous compiles time at
  the first call instead (after compiling the candidates all at once). A stored choice whose kernels
  are not in Triton's cache (cleared by hand) compiles the same way, in the background, with the
  same paths run meanwhile (:func:`_stored`).
* Under ``torch.compile`` tracing nothing is timed: :func:`choose` returns the stored choice or
  the default (the nodes make the first call of a compiled model eager so it gets calibrated).
* Timing: CUDA events, a few warm-ups, the median of several repetitions taken in interleaved
  rounds over the candidates, each call queued behind a GPU spin so that the GPU's time is
  measured, not the host's latency in issuing the call (:func:`cuda_timer_interleaved`); tests
  inject a fake timer with :func:`set_timer`.

This module knows nothing of ComfyUI: the nodes install a progress-bar factory
(:func:`set_progress_factory`) and the folder (:func:`set_base_dir`).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import logging
import math
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from typing import Callable, Optional

import torch

log = logging.getLogger("TritonKit")

FORMAT = "tritonkit-calibration"
FORMAT_VERSION = 1
ENV_ENABLE = "TRITONKIT_CALIBRATION"
ENV_DIR = "TRITONKIT_CALIBRATION_DIR"
WARMUP = 2
REPS = 7
# A candidate whose first LONG_REPS timings have a median of LONG_MS or more is timed no more: at
# milliseconds a call, CUDA events after an L2 flush vary by far less than the candidates differ, and
# the long calls (HunyuanVideo's 7-11 ms attention, the fused linear at 32k tokens) were most of a
# first calibration's GPU time (2.2 of 2.75 s on an H100, 2026-11-24).
LONG_MS = 2.0
LONG_REPS = 3
# A candidate whose GPU time is SINGLE_MS or more a call is warmed once and timed once. WAN's 32,760-key
# attention class runs 30-40 ms a call; timing its 15 block configs and 3 paths five calls each (two
# warm-ups, LONG_REPS) took 3.9 s of a cold step on an H100 (2026-11-27). One timing of such a call ranks
# the configs well enough to pick the playoff's finalists, which are timed again in the model's calls
# (kernels/trials.py), and the paths it separates differ by far more than one call varies.
SINGLE_MS = 10.0
# Timed alone (one call after an L2 flush, behind a GPU spin), paths within a few percent of each other can rank the
# other way round in a run of calls, where the GPU's power draw sets its clocks. On an H100 at WAN's 32,760-key
# class the exact kernel timed 31.1-33.1 ms a call alone against the 8-bit one's 31.3-32.8, and back to back
# 34.9-35.2 against 27.9-30.5 (ComfyUI's cuDNN 36-38 alone, 38.2-39.0 back to back); timed alone, the calibration
# took exact in 5 of 12 processes (bench/calibration_cost.py, 2026-11-27). So where the fastest path alone takes
# PATH_BURST_MIN_MS or more a call (shorter calls cannot make a burst long enough to load the GPU: at most
# PATH_BURST_MAX calls), it and every path within PATH_PLAYOFF_WITHIN of it are timed again in bursts of
# back-to-back calls, about PATH_BURST_MS each with the second half timed (as kernels/trials.py times block
# configs), up to PATH_PLAYOFF_ROUNDS rounds interleaved, and the choice between them goes by those timings. With
# bursts the same H100 took 8-bit in 8 of 8 processes at that class. A second round runs only where it can decide
# (PATH_BURST_DECISIVE): 0.28 s more at HunyuanVideo's class. Only the best two alone were timed again until a cold
# WAN workflow on an H100 timed the 8-bit path third alone (comfy 33.98, exact 30.73, 8-bit 34.08 ms; 29.9-32.9 ms
# in the other processes measured) and stored exact, which ran 1.09x the default where 8-bit runs 1.14-1.19x
# (2026-11-27): a third burst is five calls, about 0.17 s at that class. Callers ask for it
# (``choose(..., bursts=True)``) where the paths' kernels differ in kind (attention: cuDNN's, the exact and the
# 8-bit kernels). The fp8 linear's paths run the same cuBLAS GEMM after a decode or a cast: in the same WAN run
# their bursts took 0.7 s a class at 32,768 tokens and moved decode's lead from 7.5-8.7 % alone to 0.8-3.4 %,
# inside ComfyUI's PREFER_MARGIN, so the choice went to the slower path.
PATH_PLAYOFF_WITHIN = 1.25
PATH_BURST_MS = 150.0
PATH_BURST_MAX = 32
PATH_BURST_MIN_MS = PATH_BURST_MS / PATH_BURST_MAX
PATH_PLAYOFF_ROUNDS = 2
# The second round runs only where the first round's best two bursts came within this of each other, and only for
# the paths within this of the best: the H100's bursts
# parted them by 10-16 % in every process (WAN: 30.5-31.9 against 34.7-36.2 ms; HunyuanVideo 6.12-6.23 against
# 6.85-7.02), where one round decides.
PATH_BURST_DECISIVE = 0.05
# ComfyUI's own path (``prefer``) is kept unless another candidate measured at least this much
# faster: the timings of two paths within a few percent flip from one process or machine to the next
# (an H100 timed int8 attention 0.867 ms against SDPA's 0.888 in one process, 1.228 against 0.883 in
# another), and a pick that is not clearly faster in isolation is no gain inside the model.
PREFER_MARGIN = 0.05

_lock = threading.RLock()
_stores: dict = {}          # env id -> Store
_device_env: dict = {}      # str(device) -> env id
# (str(device), key) -> choice: a plain dict, read under torch.compile tracing without a graph break
_CHOICES: dict = {}
# (str(device), size-free key) -> choice: what a graph traced with dynamic token counts uses (see
# choose() and prime()); written in eager code only, once per model call
_TRACE_CHOICES: dict = {}
# the fields of a key that hold a token-count bucket (nodes/calibration.py's keys), and what a
# dynamic (symbolic) token count writes there
SIZE_FIELDS = ("Lq", "Lk", "M")
ANY_SIZE = "*"
_SIZE_RE = re.compile(r"\|(%s)(\d+|\*)(?=\||$)" % "|".join(SIZE_FIELDS))
_base_dir = None  # a path or a function returning one
_timer: Optional[Callable] = None
_progress_factory: Optional[Callable] = None
_recording: Optional[set] = None
# calibrations: shape classes timed; timed_runs: candidate timings; autotunes: block-config timings
# (kernels/tuning.py); loads: store files read; calibration_s / autotune_s: seconds they took (the
# calibrations' include the autotunes run inside them, not the background compiles before them);
# prepared: shape classes whose candidates were compiled ahead of their timing (kernels/prepare.py);
# deferred_calls: calls that ran an interim path while those compiles ran (see choose)
# warmed: stored choices whose kernels compiled in the background at their first call (see _stored)
# playoffs / playoffs_not_run: block-config playoffs run (or started in the model's calls), and not run
# because their path was not chosen; playoffs_in_model: those settled in the model's calls;
# playoffs_resumed: playoffs in the model's calls a stored record left unsettled, started again
# (kernels/tuning.py, kernels/trials.py); path_playoffs: shape classes whose close paths were timed in bursts
COUNTERS = {"calibrations": 0, "timed_runs": 0, "autotunes": 0, "loads": 0, "calibration_s": 0.0, "autotune_s": 0.0,
            "prepared": 0, "deferred_calls": 0, "stalled_timings": 0, "warmed": 0, "playoffs": 0,
            "playoffs_not_run": 0, "playoffs_in_model": 0, "playoffs_resumed": 0, "path_playoffs": 0}
# (str(device), key) -> kernels.prepare.Prepared: shape classes whose candidates compile in the background
_PENDING: dict = {}
# (str(device), key) of the choices whose kernels are loaded in this process (timed here, or warmed:
# see _stored), and (str(device), key) -> (Prepared, the path run meanwhile) for those still compiling
_READY: set = set()
_WARMING: dict = {}
# How long a stored choice's first call waits for its kernels before it runs another path meanwhile:
# kernels in Triton's cache load in milliseconds, a compile takes from a few tenths of a second up.
# Once one has not loaded in that time (Triton's cache was cleared), the process waits no more: a
# HunyuanVideo step has a few dozen stored choices
WARM_WAIT_S = 0.05
_cold_cache_seen = False
DEFER_ENV = "TRITONKIT_CALIBRATION_DEFER"
_defer_override: Optional[bool] = None
# set inside synchronous(): a shape class is timed at its first call (a compiled model's eager first call)
_SYNC = contextvars.ContextVar("tritonkit_calibration_sync", default=False)
# (shape-class key, path name) while a candidate path of that class runs in its timing; the kernels'
# tuner (kernels/tuning.py) holds the playoffs it meets there until the class's choice is made
_OWNER = contextvars.ContextVar("tritonkit_calibration_owner", default=None)
# called as fn(key, chosen, path names) once a shape class's choice is made, before it is stored
_CHOICE_HOOKS: list = []


def timing_owner() -> Optional[tuple]:
    """(shape-class key, path name) of the candidate path being timed in this thread, else None."""
    return _OWNER.get()


def on_choice(fn: Callable) -> None:
    """Registers ``fn(key, chosen, path names)``, called when a shape class's paths have been timed and
    one chosen (kernels/tuning.py settles its held playoffs there)."""
    if fn not in _CHOICE_HOOKS:
        _CHOICE_HOOKS.append(fn)


def _owned(owner: tuple, fn: Callable) -> Callable:
    """``fn`` run as ``owner``'s candidate (:func:`timing_owner`)."""
    def run():
        tok = _OWNER.set(owner)
        try:
            return fn()
        finally:
            _OWNER.reset(tok)
    return run


_logged: set = set()


def log_once(key: str, msg: str, *args, level=logging.WARNING):
    """Logs ``msg`` the first time ``key`` is seen (the nodes' calibration messages too; reset() forgets)."""
    if key not in _logged:
        _logged.add(key)
        log.log(level, msg, *args)


# ----------------------------------------------------------------------------- settings

def timing_enabled() -> bool:
    return os.environ.get(ENV_ENABLE, "1").strip().lower() not in ("0", "false", "no", "off")


def set_base_dir(path) -> None:
    """The folder the nodes want the store in (ComfyUI's user folder + /tritonkit): a path, or a
    function returning one (asked each time, so a folder set after the pack loaded counts)."""
    global _base_dir
    _base_dir = path


def set_timer(fn: Optional[Callable]) -> None:
    """Replaces the CUDA-event timer: ``fn(path_name, callable) -> milliseconds``. With a timer set, any
    device (CPU included) is timed; tests use this with a fake clock."""
    global _timer
    _timer = fn


def set_deferral(flag: Optional[bool]) -> None:
    """Whether a new shape class runs an interim path while its candidates compile in the
    background, and is timed at a later call (:func:`choose`): True / False, or None for the
    automatic answer (:func:`deferring`). Tests set it with a fake timer."""
    global _defer_override
    _defer_override = flag


def deferring() -> bool:
    """Whether :func:`choose` defers the timing of a new shape class (see the module docstring):
    not inside :func:`synchronous`, not with ``TRITONKIT_CALIBRATION_DEFER=0``, and, unless
    :func:`set_deferral` says otherwise, only with the CUDA timer where Triton compiles
    asynchronously."""
    if _SYNC.get() or os.environ.get(DEFER_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if _defer_override is not None:
        return _defer_override
    if _timer is not None:
        return False
    from . import prepare
    return prepare.available()


@contextlib.contextmanager
def synchronous():
    """Every new shape class met inside is timed at its first call (its candidates still compile in
    parallel first): a compiled model's first call runs eagerly to calibrate everything it meets."""
    tok = _SYNC.set(True)
    try:
        yield
    finally:
        _SYNC.reset(tok)


def set_progress_factory(fn: Optional[Callable]) -> None:
    """``fn(total) -> object with update(n)``, shown while a calibration runs (ComfyUI's ProgressBar)."""
    global _progress_factory
    _progress_factory = fn


def _user_cache_dir() -> str:
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.environ.get("USERPROFILE") or tempfile.gettempdir()
        return os.path.join(base, "tk", "calibration")  # short: Windows' 260-character limit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tritonkit", "calibration")


def store_dir() -> str:
    env = os.environ.get(ENV_DIR, "").strip()
    if env:
        return env
    base = _base_dir() if callable(_base_dir) else _base_dir
    return base or _user_cache_dir()


@functools.lru_cache(maxsize=None)
def pack_version() -> str:
    """pyproject.toml's version and a digest of the kernels' sources (this folder's ``*.py``): a pick
    timed on one revision of the kernels is not kept for another. A user's update through the Manager
    is a ``git pull`` that leaves the version number alone, and a stored pick between two kernel forms
    can turn with their code (2026-11-28: the 8-bit pre-pass's change made fp8 P·V 5-6 % faster at
    Flux's shape, past the 16-bit form the stored picks hold)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(os.path.dirname(here), "pyproject.toml")
    try:
        with open(path, encoding="utf-8") as f:
            m = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M)
        version = m.group(1) if m else "unknown"
    except OSError:
        version = "unknown"
    digest = hashlib.sha256()
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read() + b"\0")
    return f"{version}+{digest.hexdigest()[:12]}"


def _driver_version() -> str:
    try:
        import pynvml  # optional: the driver build (e.g. 570.86.15)
        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # noqa: BLE001 - pynvml missing or NVML unusable: the CUDA driver API version
        pass
    try:
        return f"cuda-driver-api {torch._C._cuda_getDriverVersion()}"
    except Exception:  # noqa: BLE001
        return "unknown"


def mma_v3_disabled() -> bool:
    """Triton's DISABLE_MMA_V3 is on (as Triton reads it): tl.dot compiles to mma.sync, not wgmma, on sm90+."""
    return os.environ.get("DISABLE_MMA_V3", "").lower() in ("1", "true", "on")


def environment(device) -> dict:
    """What a timing depends on, for ``device``."""
    import triton
    dev = torch.device(device)
    env = {"torch": torch.__version__, "triton": getattr(triton, "__version__", "unknown"),
           "pack": pack_version(), "device_type": dev.type}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        env.update(gpu=props.name, cc=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                   cuda=torch.version.cuda or "", driver=_driver_version())
        if props.major >= 9 and mma_v3_disabled():  # a simulated older card (nodes/arch.py): other kernels
            env["mma_v3"] = "off"
    else:
        env.update(gpu=dev.type)
    return env


def env_id(env: dict) -> str:
    return hashlib.sha1(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- store

class Store:
    """The choices of one environment, mirrored in one JSON file."""

    def __init__(self, directory: str, env: dict):
        self.env = env
        self.id = env_id(env)
        self.path = os.path.join(directory, f"calibration-{self.id}.json")
        self.entries: dict = {}
        self._load()

    def _load(self):
        COUNTERS["loads"] += 1
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            log.warning("TritonKit calibration: ignoring %s (unreadable or not JSON: %s); it will be "
                        "measured again and rewritten", self.path, e)
            return
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != FORMAT_VERSION:
            log.warning("TritonKit calibration: ignoring %s (not a TritonKit calibration file of version %s); "
                        "it will be measured again and rewritten", self.path, FORMAT_VERSION)
            return
        if data.get("env") != self.env:
            log.warning("TritonKit calibration: ignoring %s (measured for another GPU, driver, torch, Triton or "
                        "pack version); it will be measured again and rewritten", self.path)
            return
        entries = data.get("entries")
        if not isinstance(entries, dict):
            log.warning("TritonKit calibration: ignoring %s (no entries)", self.path)
            return
        self.entries = {k: v for k, v in entries.items() if isinstance(v, dict)}

    def get(self, key: str) -> Optional[dict]:
        return self.entries.get(key)

    def put(self, key: str, entry: dict) -> None:
        self.entries[key] = entry
        self.save()

    def save(self) -> None:
        data = {"format": FORMAT, "version": FORMAT_VERSION, "env": self.env, "entries": self.entries}
        directory = os.path.dirname(self.path)
        tmp = None
        try:
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".calibration-", suffix=".tmp", dir=directory)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
            tmp = None
        except OSError as e:
            log_once("save:" + self.path, "TritonKit calibration: could not write %s (%s); choices are kept "
                      "for this process only", self.path, e)
        finally:
            if tmp is not None and os.path.exists(tmp):
                os.remove(tmp)


def store_for(device) -> Store:
    dkey = str(torch.device(device))
    with _lock:
        eid = _device_env.get(dkey)
        if eid is not None and eid in _stores and os.path.dirname(_stores[eid].path) == store_dir():
            return _stores[eid]
        env = environment(device)
        st = Store(store_dir(), env)
        _stores[st.id] = st
        _device_env[dkey] = st.id
        for k, v in st.entries.items():
            if "choice" in v:
                _CHOICES[(dkey, k)] = v["choice"]
        return st


def reset() -> None:
    """Forget every loaded store and choice in memory (tests; a changed folder)."""
    global _cold_cache_seen
    with _lock:
        _stores.clear()
        _device_env.clear()
        _CHOICES.clear()
        _TRACE_CHOICES.clear()
        _PENDING.clear()
        _READY.clear()
        _WARMING.clear()
        _logged.clear()
        _cold_cache_seen = False
        for k in COUNTERS:
            COUNTERS[k] = 0.0 if k.endswith("_s") else 0


def snapshot() -> dict:
    """Every loaded store: path, environment, entries (for the route and the benchmarks)."""
    with _lock:
        return {"dir": store_dir(), "timing": timing_enabled(),
                "stores": [{"path": s.path, "env": s.env, "entries": dict(s.entries)} for s in _stores.values()]}


def stored_choices(device) -> dict:
    """key -> entry of ``device``'s store (loads it)."""
    return dict(store_for(device).entries)


# ----------------------------------------------------------------------------- timing

_flush_buffers: dict = {}


def _l2_flush_buffer() -> torch.Tensor:
    """A buffer twice the L2 cache of the current GPU: zeroed before each timed call, so every
    candidate reads its weights from memory as it does inside a model, not from a warm L2."""
    dev = torch.cuda.current_device()
    buf = _flush_buffers.get(dev)
    if buf is None:
        l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or (64 << 20)
        buf = _flush_buffers[dev] = torch.empty(2 * l2, dtype=torch.int8, device=f"cuda:{dev}")
    return buf


# The longest GPU spin put ahead of one timed call (see cuda_timer).
LEAD_MAX_MS = 20.0
# A timed call whose host side took longer than its spin is timed again, up to this many times: the
# GPU waited for the host within the timing (an H200 timed a 0.43 ms decode + matmul at 36 ms while
# background compiles of other shape classes held the GIL, 2026-11-24).
STALL_RETRIES = 3
_sleep_rate: dict = {}      # device index -> torch.cuda._sleep cycles per GPU millisecond


def _sleep_cycles_per_ms(dev: int) -> Optional[float]:
    """``torch.cuda._sleep`` cycles per millisecond of GPU time on ``dev``, measured once; None
    where this torch has no ``_sleep``."""
    if not hasattr(torch.cuda, "_sleep"):
        return None
    rate = _sleep_rate.get(dev)
    if rate is None:
        n = 1_000_000
        torch.cuda._sleep(n)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(n)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        rate = _sleep_rate[dev] = n / ms if ms > 0 else 0.0
    return rate or None


def cuda_timer(fn: Callable, warmup: int = WARMUP, reps: int = REPS) -> float:
    """Median milliseconds the GPU spends on ``fn()`` (:func:`cuda_timer_interleaved` with one
    candidate)."""
    res = cuda_timer_interleaved({"fn": fn}, warmup, reps)["fn"]
    if isinstance(res, Exception):
        raise res
    return res


def cuda_timer_interleaved(fns: dict, warmup: int = WARMUP, reps: int = REPS,
                           on_warm: Optional[Callable] = None, light: Optional[dict] = None) -> dict:
    """Median milliseconds the GPU spends on each ``fns[name]()``, or the exception it raised:
    each is warmed ``warmup`` times (``on_warm(name)`` after that), then the candidates are timed
    in ``reps`` interleaved rounds (A B C A B C ...) with CUDA events, the L2 cache flushed before
    each timed call (a candidate of LONG_MS or more a call: LONG_REPS rounds; of SINGLE_MS or more: one
    warm-up, where the GPU took longer than the host, and one round).

    ``light[name]``, where given, warms ``name`` instead of ``fns[name]``: the same launches on a few
    programs of their grids. A warm-up is there to load each kernel and take its launch path once (a
    block config's first launch loads its module: 13 ms on an H100) and to measure the host's issue,
    which the light call shares; a whole call of WAN's attention is 30-40 ms of GPU time that tells the
    timer nothing more.

    Interleaved, so that a GPU whose clocks drift while it works (a long calibration heats it)
    gives every candidate the same share of fast and slow moments: timed one after the other, the
    last candidates ran on the warmest GPU.

    The GPU's time, not the host's latency in issuing the call: before each timed call the GPU
    is given a spin kernel (``torch.cuda._sleep``) about twice as long as the host took to issue
    that call, so every kernel of it is queued before the start event is reached. Inside a
    model the GPU has the previous layers' work queued the same way, and a path's per-call Python
    is hidden behind it. (Timing from an idle GPU counted that Python: 0.2-0.5 ms of it made our
    attention kernels time 0.19-0.86 ms where the kernel alone takes ~0.35 ms, and ComfyUI's SDPA,
    one C++ call, won picks it loses inside the model.)"""
    out: dict = {}
    host: dict = {}
    for name, fn in fns.items():
        wfn = light.get(name) if light else None
        try:
            ts = []
            for _ in range(max(1, warmup)):
                t0 = time.perf_counter()
                (wfn or fn)()
                t1 = time.perf_counter()
                ts.append(t1 - t0)
                torch.cuda.synchronize()
                tail = time.perf_counter() - t1  # the GPU work still queued when the host was done
                if wfn is None and tail * 1e3 >= SINGLE_MS and tail > ts[-1]:
                    break  # a long call the GPU, not the host, takes: this one warm-up loaded it
            host[name] = min(ts)
        except Exception as e:  # noqa: BLE001 - the caller decides what a failing candidate means
            out[name] = e
        if on_warm is not None:
            on_warm(name)
    if not host:
        return out
    flush = _l2_flush_buffer()
    rate = _sleep_cycles_per_ms(torch.cuda.current_device())
    lead = {n: int(min(LEAD_MAX_MS, 2e3 * h + 0.05) * rate) if rate else 0 for n, h in host.items()}
    times: dict = {n: [] for n in host}
    for _ in range(reps):
        for name in host:
            if name in out:
                continue
            if len(times[name]) >= LONG_REPS and statistics.median(times[name]) >= LONG_MS:
                continue
            if times[name] and times[name][0] >= SINGLE_MS:
                continue
            spin = lead[name]
            for attempt in range(1 + STALL_RETRIES):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                flush.zero_()
                if spin:
                    torch.cuda._sleep(spin)
                try:
                    t_host = time.perf_counter()
                    start.record()
                    fns[name]()
                    end.record()
                    t_host = time.perf_counter() - t_host
                    end.synchronize()
                except Exception as e:  # noqa: BLE001
                    out[name] = e
                    break
                # the spin ran out before the call was issued: the GPU waited for the host (another
                # thread held the GIL, a background compile), and that wait is in the timing. Timed
                # again behind a spin twice as long as the held-up issue (a retry behind the same short
                # spin is held up the same way: 44-47 stalls in a cold HunyuanVideo calibration on an
                # H100); the next round starts from the short spin again
                if rate and t_host * 1e3 * rate > spin and attempt < STALL_RETRIES:
                    COUNTERS["stalled_timings"] += 1
                    spin = max(spin, int(min(LEAD_MAX_MS, 2e3 * t_host + 0.05) * rate))
                    continue
                times[name].append(start.elapsed_time(end))
                break
    for name, ts in times.items():
        if name not in out:
            out[name] = statistics.median(ts)
    return out


def burst_ms(fn: Callable, calls: int, untimed: int = 0) -> float:
    """Milliseconds a call of ``fn()`` run ``calls`` times back to back after an L2 flush, the first
    ``untimed`` of them outside the timing (they bring the GPU to the clocks a run of such calls holds)."""
    flush = _l2_flush_buffer()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    flush.zero_()
    for _ in range(untimed):
        fn()
    start.record()
    for _ in range(calls - untimed):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (calls - untimed)


def _error_text(e: Exception) -> str:
    """A failed candidate's error, as the stored entry keeps it: its type and first line."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def path_finalists(timings: dict) -> list:
    """The paths of ``timings`` (name -> ms alone) to time again in bursts, fastest first: the fastest and every
    other within PATH_PLAYOFF_WITHIN of it, where it takes PATH_BURST_MIN_MS or more a call; else []."""
    order = sorted(timings, key=timings.get)
    if not order or timings[order[0]] < PATH_BURST_MIN_MS:
        return []
    fin = [n for n in order if timings[n] <= timings[order[0]] * PATH_PLAYOFF_WITHIN]
    return fin if len(fin) > 1 else []


def path_playoff(fns: dict, alone: dict) -> dict:
    """Milliseconds a call of each ``fns[name]()`` in bursts (:func:`burst_ms`: about PATH_BURST_MS, the second
    half timed) taken in up to PATH_PLAYOFF_ROUNDS interleaved rounds (the next only while the fastest and the
    runner-up are within PATH_BURST_DECISIVE of each other, and only for the paths within that of the fastest),
    their median; or the exception it raised.
    ``alone``: each one's time alone, which sizes its bursts. A test's fake timer (:func:`set_timer`) times
    the bursts with its ``burst(name, fn)`` method; one without it times none ({})."""
    fake = getattr(_timer, "burst", None) if _timer is not None else None
    if _timer is not None and fake is None:
        return {}
    times: dict = {n: [] for n in fns}
    out: dict = {}
    names = list(fns)
    for r in range(PATH_PLAYOFF_ROUNDS):
        if r:
            last = {n: ts[-1] for n, ts in times.items() if ts and n not in out}
            best = min(last.values(), default=0.0)
            names = [n for n in names if n in last and last[n] <= best * (1 + PATH_BURST_DECISIVE)]
            if len(names) < 2:
                break
        for n in (names if r % 2 == 0 else names[::-1]):
            if n in out:
                continue
            calls = max(2, min(PATH_BURST_MAX, math.ceil(PATH_BURST_MS / max(alone[n], 1e-3))))
            try:
                times[n].append(fake(n, fns[n]) if fake is not None else burst_ms(fns[n], calls, untimed=calls // 2))
            except Exception as e:  # noqa: BLE001 - a path that fails here is not chosen
                out[n] = e
    for n, ts in times.items():
        if n not in out:
            out[n] = statistics.median(ts)
    return out


def _interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def timer_is_fake() -> bool:
    """True while a test's fake clock (:func:`set_timer`) stands in for the GPU's."""
    return _timer is not None


def can_time(device) -> bool:
    if _timer is not None:
        return True
    dev = torch.device(device)
    return dev.type == "cuda" and not _interpreter() and torch.cuda.is_available()


def _compiling() -> bool:
    try:
        return torch.compiler.is_compiling()
    except Exception:  # noqa: BLE001
        return False


class recording:
    """Context manager: collects the keys :func:`choose` is asked for (the nodes keep, per model
    input signature, which shape classes a run needs)."""

    def __enter__(self):
        global _recording
        self.keys = set()
        self._prev = _recording
        _recording = self.keys
        return self.keys

    def __exit__(self, *exc):
        global _recording
        _recording = self._prev
        return False


def pending(device, key: str) -> bool:
    """Whether ``key``'s candidates, or its stored choice's kernels, are compiling in the background,
    its calls on an interim path (asked per attention call that takes ComfyUI's path: nothing pending
    is two dict checks)."""
    if not _PENDING and not _WARMING:
        return False
    k = (str(torch.device(device)), key)
    return k in _PENDING or k in _WARMING


def lookup(device, key: str) -> Optional[str]:
    """The stored choice for ``key`` on ``device``, from memory only (safe while tracing)."""
    return _CHOICES.get((str(device), key))


def pick_fastest(timings: dict, default: str, prefer: Optional[str] = None,
                 margin: float = PREFER_MARGIN) -> str:
    """The fastest of ``timings`` (name -> ms); ``prefer`` (ComfyUI's own path) wins unless the
    fastest is at least ``margin`` faster than it; ``default`` when nothing was timed."""
    if not timings:
        return default
    best = min(timings, key=timings.get)
    if prefer in timings and best != prefer and timings[best] > timings[prefer] * (1.0 - margin):
        return prefer
    return best


def settled(dkey: str, key: str) -> Optional[str]:
    """The choice for ``key`` on the device named ``dkey`` (``str(torch.device)``) where it is final in this
    process (chosen or stored, its kernels loaded: what :func:`choose` returns at once from then on), else
    None. For callers that remember a decision made from it (nodes/attention.py)."""
    k = (dkey, key)
    return _CHOICES.get(k) if k in _READY else None


def choose(device, key: str, candidates: dict, default: str, *, what: str = "",
           prefer: Optional[str] = None, skip: Optional[Callable[[], dict]] = None,
           interim: Optional[str] = None, bursts: bool = False) -> str:
    """The path to use for the shape class ``key`` on ``device``.

    ``candidates`` maps each allowed path name to a no-argument callable running the call that
    way (only paths whose accuracy the caller allows). The stored choice when there is one;
    else, where timing is possible and allowed, every candidate is timed once here and the
    fastest is stored (``prefer``, ComfyUI's own path, unless another is PREFER_MARGIN faster:
    see :func:`pick_fastest`); else ``default``.

    ``skip()``, asked only when the class is about to be compiled and timed: name -> why, the
    candidates that can't win here and are neither compiled nor timed (never ``default``); the
    stored entry says why.

    While the candidates compile in the background (deferred calibration) the calls run ``prefer``
    where it is a candidate (ComfyUI's own path: nothing of ours to compile), else ``interim``,
    else ``default``. The default is what an untimed GPU runs, and it may need compiles of its own
    (the fused linear's block configs, an attention kernel's): run meanwhile, it held the model
    until they were done, behind every other class's compiles in the pool. On an H100's cold
    HunyuanVideo @86 step (2026-11-25) the model met its second attention class 8 s into the step,
    and that class's compiles began only then.

    ``bursts``: where the two fastest paths alone are close and long, they are timed again in bursts of
    back-to-back calls and the choice between them goes by those (:func:`path_finalists`, PATH_PLAYOFF_WITHIN)."""
    if default not in candidates:
        raise ValueError(f"default {default!r} is not among the candidates {list(candidates)}")
    if _compiling():
        # A traced key has no token buckets (ANY_SIZE, see token_bucket): it reads the choice
        # prime() set for it, in eager code, before this model call (the shape classes of this
        # call, from its stored signature). A graph with dynamic token dims then serves other
        # sizes with the choice of the call it was traced in: a new size costs no recompile, at
        # worst the path measured for another bucket runs (every path is numerically valid, only
        # its speed differs). The Triton Compile Model drops the guards on _TRACE_CHOICES for that
        # reason; under TorchCompileModel they stay, and a changed choice recompiles.
        table = _TRACE_CHOICES if ANY_SIZE in key else _CHOICES
        hit = table.get((str(device), key))
        return hit if hit in candidates else default
    if len(candidates) == 1:
        return default
    if _recording is not None:
        _recording.add(key)
    dkey = str(torch.device(device))
    k = (dkey, key)
    hit = _CHOICES.get(k)
    if hit in candidates:
        return hit if k in _READY else _stored(k, hit, candidates, default, prefer, interim)
    if not timing_enabled() or not can_time(device):
        return default
    with _lock:
        st = store_for(device)
        hit = _CHOICES.get(k)
        if hit in candidates:
            return hit if k in _READY else _stored(k, hit, candidates, default, prefer, interim)
        skipped = {n: why for n, why in (skip() if skip is not None else {}).items()
                   if n in candidates and n != default}
        if skipped:
            candidates = {n: fn for n, fn in candidates.items() if n not in skipped}
        now = _meanwhile(candidates, default, prefer, interim)
        if len(candidates) > 1 and _prepare_first(dkey, key, candidates, now, prefer):
            return now
        bar = _progress_factory(len(candidates)) if _progress_factory is not None else None
        step = (lambda name: bar.update(1)) if bar is not None else None  # noqa: E731
        timings, errors = {}, {}
        if _timer is None:
            # The model's GPU work queued so far finishes here, before the clock starts: the timer's first
            # warm-up would wait for it anyway. A class met at the end of a forward (a model's last Linear,
            # HunyuanVideo's and WAN's N=64 projection at 32k tokens) counted 0.35-0.54 s of that wait as its
            # calibration's, for timings of 0.06 ms a call (H100 and H200, 2026-11-27).
            try:
                torch.cuda.synchronize(device)
            except Exception:  # noqa: BLE001 - the timer meets the same error per candidate and falls back
                pass
        t0 = time.perf_counter()
        # the candidates' own block configs are tuned at once here, not deferred (kernels/tuning.py):
        # each candidate is timed at its best
        owned = {name: _owned((key, name), fn) for name, fn in candidates.items()}
        with synchronous():
            if len(candidates) == 1:
                results = {}  # the others skipped: nothing to compare
            elif _timer is not None:
                results = {}
                for name, fn in owned.items():
                    try:
                        results[name] = _timer(name, fn)
                    except Exception as e:  # noqa: BLE001
                        results[name] = e
                    if step is not None:
                        step(name)
            else:
                results = cuda_timer_interleaved(owned, on_warm=step)
            fin = path_finalists({n: r for n, r in results.items() if not isinstance(r, Exception)}) if bursts else []
            timed_bursts = path_playoff({n: owned[n] for n in fin}, results) if fin else {}
        for name, res in results.items():
            if isinstance(res, Exception):  # a path that fails here is simply not chosen
                errors[name] = _error_text(res)
            else:
                timings[name] = float(res)
                COUNTERS["timed_runs"] += 1
        for name, res in timed_bursts.items():
            if isinstance(res, Exception):  # nor one that fails in its bursts (its time alone is kept)
                errors[name] = _error_text(res)
        sustained = {n: float(t) for n, t in timed_bursts.items() if not isinstance(t, Exception)}
        if len(sustained) > 1:  # the close paths: chosen by their bursts (the others were further behind alone)
            choice = pick_fastest(sustained, default, prefer)
            COUNTERS["path_playoffs"] += 1
        else:
            choice = pick_fastest({n: t for n, t in timings.items() if n not in errors}, default, prefer)
        for hook in _CHOICE_HOOKS:  # the chosen path's held config playoffs run, the others' are dropped
            try:
                hook(key, choice, list(candidates))
            except Exception as e:  # noqa: BLE001 - the choice stands; its configs stay the first pass's
                log_once(f"choice-hook:{type(e).__name__}", "TritonKit calibration: settling the block configs "
                         "of %s failed (%s: %s); the configs of the first timing are kept", what or key,
                         type(e).__name__, e)
        entry = {"choice": choice, "default": default, "timings_ms": {k: round(v, 5) for k, v in timings.items()},
                 "what": what, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "took_s": round(time.perf_counter() - t0, 4)}  # its timing, its candidates' tunings included
        if prefer in timings:
            entry["prefer"], entry["margin"] = prefer, PREFER_MARGIN
        if len(sustained) > 1:
            entry["bursts_ms"] = {k: round(v, 5) for k, v in sustained.items()}
        if skipped:
            entry["not_timed"] = skipped
        if errors:
            entry["errors"] = errors
        COUNTERS["calibrations"] += 1
        COUNTERS["calibration_s"] += time.perf_counter() - t0
        _CHOICES[k] = choice
        _READY.add(k)  # its candidates just ran: their kernels are loaded
        st.put(key, entry)
        log.info("TritonKit calibration on %s: %s -> %s (%s; %.1f s, stored in %s)", st.env.get("gpu"), what or key,
                 choice, "; ".join([", ".join(f"{k} {v:.3f} ms" for k, v in timings.items()) or "no candidate ran"]
                                   + (["back to back " + ", ".join(f"{k} {v:.3f} ms" for k, v in sustained.items())]
                                      if len(sustained) > 1 else [])
                                   + [f"{k} not timed: {why}" for k, why in skipped.items()]),
                 time.perf_counter() - t0, st.path)
        return choice


def _prepare_first(dkey: str, key: str, candidates: dict, now: str,
                   prefer: Optional[str]) -> bool:
    """Before a shape class is timed, its candidates' kernels are compiled, in the background
    (kernels/prepare.py), all at once. True when the timing waits for a later call: the compiles
    were just started, or still run, and :func:`deferring` (this call then runs ``now``).
    Deferring, a class is timed only once no compile of the pool runs (prepare.busy()): a timed call
    competes with the compiles for the GIL, and one that the host held up is timed again
    (STALL_RETRIES). A cold HunyuanVideo first step spent 4.7-13.2 s timing and timed 18-81 calls
    again (H100, H200, 2026-11-25) while its other classes compiled; the model can go on with the
    interim paths meanwhile. Timed at once (synchronous()), other compiles may still run.
    ``prefer`` (ComfyUI's own path) has nothing of ours to compile and is not run."""
    if _timer is not None and _defer_override is None:
        return False  # a test's fake clock: nothing to compile ahead
    from . import prepare
    if not prepare.available():
        return False
    pend = _PENDING.get((dkey, key))
    defer = deferring()
    if pend is None:
        COUNTERS["prepared"] += 1
        if defer:
            # ``now`` runs meanwhile: its kernels first, waited for (ComfyUI's own path has none, the
            # fp8 decode kernel is one for every layer); the others compile in the background
            first = prepare.prepare({now: candidates[now]}) if now != prefer else None
            _PENDING[(dkey, key)] = prepare.prepare({n: fn for n, fn in candidates.items()
                                                     if n not in (prefer, now)})
            if first is not None:
                first.wait()
            COUNTERS["deferred_calls"] += 1
            log_once("deferred", "TritonKit calibration: each new shape class runs ComfyUI's path (or another "
                     "with nothing to compile) while its candidates compile in the background, and is timed at "
                     "a later call once they are ready",
                     level=logging.INFO)
            return True
        pend = prepare.prepare({n: fn for n, fn in candidates.items() if n != prefer})
    elif defer and (not pend.done() or prepare.busy()):
        COUNTERS["deferred_calls"] += 1
        return True
    _PENDING.pop((dkey, key), None)
    pend.wait()  # done, or about to be timed: every kernel in its cache before the timed runs launch it
    return False


def _meanwhile(candidates: dict, default: str, prefer: Optional[str], interim: Optional[str]) -> str:
    """The path a class's calls run while its kernels compile in the background (see :func:`choose`)."""
    return prefer if prefer in candidates else interim if interim in candidates else default


def _stored(k: tuple, hit: str, candidates: dict, default: str, prefer: Optional[str],
            interim: Optional[str]) -> str:
    """The first calls in this process of the stored choice ``hit`` of ``k`` (device, key), whose kernels may be missing from
    Triton's cache: it was cleared, the calibration was not (by hand, or a cache of another folder).
    Those kernels then compiled one after another as the model launched them: in a HunyuanVideo
    step that compiled the Triton Compile Model's blocks, the eager glue's fused-linear configs and
    decode kernels took 3.4-3.8 s (H100, H200, 2026-11-25). Deferring (:func:`deferring`), they
    compile in the background (kernels/prepare.py) and the calls run what a new class runs
    meanwhile (``prefer``, else ``interim``, else ``default``: see :func:`choose`) until they are
    ready. Kernels that Triton's cache holds load within WARM_WAIT_S, and the choice runs at once,
    as it did before (until one has not: then none is waited for)."""
    global _cold_cache_seen
    from . import prepare
    with _lock:
        if k in _READY:
            return hit
        warming = _WARMING.get(k)
        if warming is not None:
            pend, now = warming
            if not pend.done() and deferring():
                COUNTERS["deferred_calls"] += 1
                return now
            del _WARMING[k]  # ready (or a call inside synchronous(): it waits for them)
        else:
            now = _meanwhile(candidates, default, prefer, interim)
            if hit == prefer or now == hit or not deferring() or not prepare.available():
                _READY.add(k)  # ComfyUI's path (nothing of ours), or compiled at its first launch as before
                return hit
            pend = prepare.prepare({hit: candidates[hit]})
            if not pend.settle(0.0 if _cold_cache_seen else WARM_WAIT_S):
                _cold_cache_seen = True
                if now != prefer:  # the interim's own kernels (the fp8 decode: one for every layer), waited for
                    prepare.prepare({now: candidates[now]}).wait()
                _WARMING[k] = (pend, now)
                COUNTERS["warmed"] += 1
                COUNTERS["deferred_calls"] += 1
                log_once("warming", "TritonKit calibration: a stored choice's kernels are not in Triton's cache; they "
                         "compile in the background, and its calls run ComfyUI's path (or another with nothing to "
                         "compile) until they are ready", level=logging.INFO)
                return now
        pend.wait()  # every kernel in its JIT cache before this thread launches it
        _READY.add(k)
        return hit


def remember(device, key: str, value: dict) -> None:
    """Stores a record that is not a timed choice (the attention autotune pick, run signatures)."""
    if _compiling():
        return
    with _lock:
        st = store_for(device)
        st.put(key, value)


def recall(device, key: str) -> Optional[dict]:
    if _compiling():
        return None
    with _lock:
        return store_for(device).get(key)


def token_bucket(n) -> str:
    """The bucket field of a key for the token count ``n``: its pow2 bucket, or ANY_SIZE while
    torch.compile traces. There ``n`` may be symbolic (a dim compiled dynamic), and bucketing it
    would make Dynamo specialise the dim to this exact size (a guard ``s0 == 4608``), so every new
    resolution or frame count would recompile (see :func:`choose`). Dynamo cannot tell a symbolic
    size from a static one in traced code (``isinstance(n, int)`` is true for both), hence every
    traced key is size-free."""
    if _compiling():
        return ANY_SIZE
    return str(pow2_bucket(n))


def size_free(key: str) -> str:
    """``key`` with every token-count bucket replaced by ANY_SIZE: the key a traced call with
    dynamic token counts asks for."""
    return _SIZE_RE.sub(lambda m: f"|{m.group(1)}{ANY_SIZE}", key)


def _largest_bucket(key: str) -> int:
    return max((int(v) for _, v in _SIZE_RE.findall(key) if v != ANY_SIZE), default=0)


def prime(device, keys) -> None:
    """Sets, outside any traced code, the choices a graph traced with dynamic token counts reads
    (``_TRACE_CHOICES``): for each size-free key, the stored choice of ``keys`` (the shape classes
    of the model call about to run), the largest token bucket winning where several share one
    size-free key (that call costs the most). Unchanged entries are not written again."""
    dkey = str(torch.device(device))
    best: dict = {}
    for k in keys:
        choice = _CHOICES.get((dkey, k))
        if choice is None:
            continue
        sf, size = size_free(k), _largest_bucket(k)
        if sf not in best or size > best[sf][0]:
            best[sf] = (size, choice)
    for sf, (_, choice) in best.items():
        if _TRACE_CHOICES.get((dkey, sf)) != choice:
            _TRACE_CHOICES[(dkey, sf)] = choice


def pow2_bucket(n: int, lo: int = 1, hi: int = 1 << 20) -> int:
    """The power of two at or above ``n``, clamped to [lo, hi]: the token / key-length bucket."""
    n = max(lo, min(int(n), hi))
    return 1 << (n - 1).bit_length()
