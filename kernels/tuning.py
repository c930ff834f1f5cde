"""Block-config choice for the pack's Triton kernels on the user's GPU.

A kernel with several candidate configs (block sizes, warps, stages) has one picked per key
(shape class, dtypes, variant) by timing each candidate once on this GPU; the pick is:

* kept in memory for the process, and stored in the calibration store (kernels/calibration.py:
  keyed by GPU, driver, torch, Triton and pack version), so it is the same run to run and a
  restart, or a new ComfyUI process, does no timing. Triton's own ``@triton.autotune`` times
  again in every process (that cost 5-7 s of a warm restart's first step on Flux).
* compiled in parallel first: the candidates are compiled in a thread pool (Triton's LLVM passes
  and ptxas run outside the GIL) before they are timed one by one, which is where a first
  calibration spends most of its time (41 Triton compiles, ~25 s of a 65 s first Flux step on an
  H100 when compiled one after the other). Where the calibration defers (kernels/calibration.py),
  a new key's configs compile in the background (kernels/prepare.py) while the first config runs
  untimed, and are timed at the first call after they are ready; inside a calibration's preparing
  run they are only compiled.

``TRITONKIT_AUTOTUNE=0`` (or the older ``TRITONKIT_ATTN_AUTOTUNE=0``) takes each key's first
candidate without timing.
"""
from __future__ import annotations

import functools
import math
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, Sequence

import torch

from . import calibration, prepare, trials

ENV = "TRITONKIT_AUTOTUNE"
ENV_OLD = "TRITONKIT_ATTN_AUTOTUNE"
# "0" runs every playoff at once, also inside a calibration's candidate paths (see _HELD): the behaviour
# before 2026-11-26, for A/B runs
HOLD_ENV = "TRITONKIT_PLAYOFF_HOLD"
# "0": a candidate's warm-ups before its timing are whole calls, not :func:`pick`'s ``light`` ones (A/B runs)
LIGHT_ENV = "TRITONKIT_LIGHT_WARMUP"
MAX_COMPILE_THREADS = 8
_CACHE: dict = {}            # store key -> chosen candidate (a tuple)
_TRIALS: dict = {}           # store key -> kernels.trials.Trial: its playoff runs in the model's calls
_LOCK = threading.Lock()


def enabled() -> bool:
    for name in (ENV, ENV_OLD):
        if os.environ.get(name, "1").strip().lower() in ("0", "false", "no", "off"):
            return False
    return True


def cache() -> dict:
    """The picks of this process: store key -> candidate."""
    return _CACHE


def unsettled() -> int:
    """How many keys have no pick yet in this process: their configs still compiling in the
    background (the first config runs untimed meanwhile, :func:`_deferred`) or their playoff still
    running in the model's calls (kernels/trials.py)."""
    return len(_PENDING) + len(_TRIALS)


def reset() -> None:
    """Forgets this process's picks and playoffs in progress (tests: a new process)."""
    with _LOCK:
        _CACHE.clear()
        _TRIALS.clear()
        _HELD.clear()
        _RESUMING.clear()


# Candidates are timed like calibration candidates (calibration.cuda_timer_interleaved: warm-ups,
# then the median of repetitions taken in interleaved rounds, each after an L2 flush and queued
# behind a GPU spin). Before,
# triton.testing.do_bench ran rep / estimate calls per candidate: ~150 for a 50 us kernel at an
# 8 ms budget; a first Flux step on an H100 (@86, profiled 2026-11-23) spent 3.6 s in 130 of them
# (18,724 calls), where a handful ranks the candidates.
def time_ms(device: torch.device, fn: Callable) -> float:
    """Milliseconds of ``fn()`` off a GPU (the interpreter): the wall clock's median (tests
    replace this function). GPUs go through :func:`time_all`."""
    times = []
    for i in range(calibration.WARMUP + calibration.REPS):
        t0 = time.perf_counter()
        fn()
        if i >= calibration.WARMUP:
            times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def time_all(device: torch.device, fns: dict, light: Optional[dict] = None) -> dict:
    """Milliseconds of each ``fns[key]()`` on ``device``, or the exception it raised: on a GPU the
    candidates are timed in interleaved rounds (calibration.cuda_timer_interleaved: a GPU whose
    clocks drift during the tuning gives each candidate the same share; ``light[key]``, where
    given, its warm-ups), elsewhere one after the other with :func:`time_ms`."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            return calibration.cuda_timer_interleaved(fns, light=light)
    out = {}
    for k, fn in fns.items():
        try:
            out[k] = time_ms(device, fn)
        except Exception as e:  # noqa: BLE001 - e.g. out of resources for this config on this GPU
            out[k] = e
    return out


def compile_parallel(device: torch.device, warm: Callable, cands: Sequence) -> None:
    """Compiles ``warm(c)`` for every candidate in a thread pool, on ``device`` and the caller's
    stream. A candidate that fails to compile (out of shared memory on this GPU...) is left to the
    timed run, which skips it."""
    if len(cands) < 2:
        return
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None

    def one(c):
        try:
            if stream is None:
                warm(c)
                return
            with torch.cuda.device(device), torch.cuda.stream(stream):
                warm(c)
        except Exception:  # noqa: BLE001 - see the docstring
            pass

    workers = max(1, min(len(cands), os.cpu_count() or 1, MAX_COMPILE_THREADS))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tritonkit-compile") as ex:
        list(ex.map(one, cands))


def pick(device: torch.device, key: str, cands: Sequence[tuple], run: Callable,
         warm: Optional[Callable] = None, weight: Optional[Callable] = None,
         family: Optional[Callable] = None, in_model: bool = False, light: Optional[Callable] = None) -> tuple:
    """The config for ``key`` among ``cands`` (tuples): this process's pick, else the stored one,
    else the fastest of ``run(c)`` timed here (after compiling all with ``warm(c)`` in parallel),
    stored. The first candidate when there is one, when timing is off, or when none runs.
    ``weight(c)`` (default 1) multiplies a candidate's time before the comparison: a less accurate
    variant has to be that much faster to be picked. ``family(c)``: the kernel variant ``c`` runs;
    the playoff takes the best of every variant that comes close, besides the best two. Inside a
    calibration's candidate path the playoff waits for the calibration's choice (:data:`_HELD`).
    ``in_model``: the caller runs the returned config at once and calls :func:`kernels.trials.end_call`
    after its launch, so that on a GPU the playoff can run in the model's calls (kernels/trials.py).
    ``light(c)``: ``run(c)``'s launches on a few programs of their grids, for the timer's warm-ups
    (calibration.cuda_timer_interleaved; ``TRITONKIT_LIGHT_WARMUP=0`` warms with ``run(c)``)."""
    hit = _CACHE.get(key)  # the per-call path: one dict lookup
    if hit is not None:
        return hit
    trial = _TRIALS.get(key)
    if trial is not None:  # this key's playoff runs in the model's calls: the next finalist
        return trial.next(untimed=prepare.preparing())
    cands = [tuple(c) for c in cands]
    if len(cands) == 1 or not enabled():
        return cands[0]
    # read (and below written) outside _LOCK: the calibration's lock is never taken under this one,
    # while a calibration holds its own lock and takes this one (its candidates tune, and
    # :func:`_after_choice` settles their playoffs)
    stored = calibration.recall(device, key)
    if (isinstance(stored, dict) and stored.get("playoff") == IN_MODEL and in_model and device.type == "cuda"
            and trials.enabled() and tuple(stored.get("config", ())) in cands and not prepare.preparing()):
        with _LOCK:
            trial = _TRIALS.get(key)
            if trial is None and key not in _CACHE:
                trial = _resume_trial(device, key, cands, stored, warm, weight, family)
        if trial is _COMPILING:
            return tuple(stored["config"])  # the stored pick, while the other finalists compile
        if trial is not None:
            return trial.next()
    rec = None
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            return hit
        cfg = tuple(stored.get("config", ())) if isinstance(stored, dict) else ()
        if cfg in cands:
            _CACHE[key] = cfg
            return cfg
        if prepare.preparing():
            # a calibration prepares its candidates: every config is compiled (in the background),
            # none timed; the first is the one this preparing run goes on with
            if warm is not None:
                for c in cands:
                    try:
                        warm(c)
                    except Exception:  # noqa: BLE001 - the timed run skips a config that fails
                        pass
            return cands[0]
        if warm is not None and _deferred(device, key, cands, warm):
            return cands[0]
        t0 = time.perf_counter()
        if warm is not None:
            if device.type == "cuda" and prepare.available():
                # in the background compile pool, which also knows the compiles already in flight
                prepare.prepare({c: functools.partial(warm, c) for c in cands}).wait()
            else:
                compile_parallel(device, warm, cands)
        t_timed = time.perf_counter()
        if light is not None and os.environ.get(LIGHT_ENV, "1").strip() == "0":
            light = None
        timed = time_all(device, {c: functools.partial(run, c) for c in cands},
                         light=None if light is None else {c: functools.partial(light, c) for c in cands})
        ms = {c: [t] for c, t in timed.items() if not isinstance(t, Exception)}  # candidate -> its timings
        owner = calibration.timing_owner() if os.environ.get(HOLD_ENV, "1").strip() != "0" else None
        if owner is not None and _finalists(ms, weight, family):
            # a calibration's candidate path: its playoff waits for the calibration's choice, and runs
            # only where this path is the one chosen (:func:`_after_choice`)
            best = _fastest(ms, weight)[0] or cands[0]
            _HELD.setdefault(owner, []).append((device, key, cands, ms, run, weight, family, in_model))
            _CACHE[key] = best
        else:
            best, rec = _settle_here(device, key, cands, ms, run, weight, family, in_model)
        calibration.COUNTERS["autotunes"] += 1
        calibration.COUNTERS["autotune_s"] += time.perf_counter() - t0
        if rec is not None:  # where a first tuning's seconds went: waiting for compiles, then the timing
            rec["tune_s"] = round(time.perf_counter() - t0, 4)
            rec["compile_wait_s"] = round(t_timed - t0, 4)
    if rec is not None:
        calibration.remember(device, key, rec)
    return best


def _settle_here(device, key: str, cands, ms: dict, run: Callable, weight: Optional[Callable],
                 family: Optional[Callable], in_model: bool) -> tuple:
    """:func:`_settle` for ``key``, called under _LOCK: (the pick, its record for the store or None).
    Where the playoff can run in the model's calls (``in_model``, on a GPU), it starts there
    (kernels/trials.py): the first pass's fastest runs meanwhile, and is stored as the pick until the
    trial settles."""
    fin = _finalists(ms, weight, family)
    if fin and in_model and device.type == "cuda" and trials.enabled():
        best, rec = _settle(device, cands, ms, run, weight, family, playoff=False)
        rec["playoff"] = IN_MODEL
        _start_trial(device, key, fin, ms, weight, rec)
        return best, rec
    best, rec = _settle(device, cands, ms, run, weight, family)
    _CACHE[key] = best
    return best, rec


IN_MODEL = "in the model's calls"  # a stored record's "playoff" while its playoff runs in the model's calls


def _start_trial(device, key: str, fin: list, ms: dict, weight: Optional[Callable], rec: dict) -> None:
    """The playoff between ``fin`` in the model's calls, in turns of about trials.STRETCH_MS of the fastest
    finalist's calls (timed alone, ``ms``); ``rec`` is stored with its outcome. Under _LOCK."""
    stretch = trials.stretch_for(min(statistics.median(ms[c]) for c in fin))
    _TRIALS[key] = trials.Trial(fin, weight, functools.partial(_trial_settled, device, key, rec),
                                _clock(device), stretch=stretch)
    rec["playoff_turn_calls"] = stretch
    _CACHE.pop(key, None)
    calibration.COUNTERS["playoffs"] += 1


_COMPILING = object()  # _resume_trial: the finalists still compile in the background
_RESUMING: dict = {}    # store key -> (the background compile of a resumed playoff's finalists, them, their ms)


def _resume_trial(device, key: str, cands: list, stored: dict, warm: Optional[Callable],
                  weight: Optional[Callable], family: Optional[Callable]):
    """A stored record whose playoff in the model's calls had not settled when its process ended (a short
    run, or a key with few calls a step: the turns take up to 4 x trials.STRETCH_MAX calls for two
    finalists): the playoff starts again in this process's calls from the stored first-pass timings,
    nothing timed alone. The finalists compile in the background first (``warm``), the stored pick running
    meanwhile (:data:`_COMPILING`). The trial, _COMPILING, or None where the record names no finalists.
    Under _LOCK."""
    if key in _RESUMING:  # its finalists compile: done yet?
        pend, fin, ms = _RESUMING[key]
        if not pend.done() or prepare.busy():
            return _COMPILING
        del _RESUMING[key]
        pend.wait()
    else:
        ms = {}
        for name, t in (stored.get("candidates_ms") or {}).items():
            try:
                c = tuple(int(x) for x in str(name).split(","))
            except ValueError:
                continue
            if c in cands and isinstance(t, (int, float)) and t > 0:
                ms[c] = [float(t)]
        fin = _finalists(ms, weight, family)
        if not fin:
            return None
        if warm is not None and prepare.available():
            _RESUMING[key] = (prepare.prepare({c: functools.partial(warm, c) for c in fin}), fin, ms)
            return _COMPILING
        if warm is not None:
            compile_parallel(device, warm, fin)
    _start_trial(device, key, fin, ms, weight, dict(stored))
    calibration.COUNTERS["playoffs_resumed"] += 1
    return _TRIALS[key]


def _clock(device):
    """The marks a playoff in the model's calls is timed with (tests replace this function)."""
    return trials.CudaClock(device)


def _trial_settled(device, key: str, rec: dict, best: tuple, medians: dict) -> None:
    """A playoff in the model's calls picked ``best`` for ``key``: it is the pick from now on, stored."""
    with _LOCK:
        _CACHE[key] = best
        trial = _TRIALS.pop(key, None)
    calibration.COUNTERS["playoffs_in_model"] += 1
    rec = {k: v for k, v in rec.items() if k != "playoff"}
    rec["config"] = list(best)
    rec["ms"] = rec.get("candidates_ms", {}).get(",".join(map(str, best)), rec.get("ms"))
    rec["playoff_in_model_ms"] = {",".join(map(str, c)): round(t, 5) for c, t in medians.items()}
    if trial is not None:
        # timings set aside because the GPU waited for the host inside them, and whether too few were left
        # for a pick by medians (the fastest alone kept): a host-bound model, read off the store
        rec["playoff_host_bound"] = {"set_aside": sum(trial.waited.values()), "kept_fastest_alone": trial.fell_back}
    calibration.remember(device, key, rec)


def _settle(device, cands, ms: dict, run: Callable, weight: Optional[Callable], family: Optional[Callable],
            playoff: bool = True) -> tuple:
    """(the pick, its record for the store or None) from the first pass's timings ``ms``: after the
    playoff between the close ones (unless ``playoff`` is False), the fastest."""
    sustained = _playoff(device, ms, run, weight, family) if playoff else None
    best, best_ms = _fastest(ms, weight)
    if sustained:
        best = min(sustained, key=lambda c: _score(sustained, c, weight))
    best = best or cands[0]
    if best_ms is None:
        return best, None
    # every candidate's median too: which configs ever win, across GPUs (the bench reports it)
    rec = {"config": list(best), "ms": round(statistics.median(ms[best]), 5), "candidates_ms": {
        ",".join(map(str, c)): round(statistics.median(t), 5) for c, t in ms.items()}}
    if sustained:
        rec["playoff_sustained_ms"] = {",".join(map(str, c)): round(statistics.median(t), 5)
                                       for c, t in sustained.items()}
    return best, rec


# A calibration times each candidate path (kernels/calibration.py) with that path's block configs
# tuned first. The playoff between a path's close configs (bursts of about SUSTAIN_MS, PLAYOFF_ROUNDS
# times) is the costly part of a tuning, and it is worth running only for the path the calibration
# then chooses: on HunyuanVideo's 18,616-key class @86 the exact kernel's two configs always came
# within 1 % of each other alone, and their playoff (about 1 s of the cold first step on an H100 and
# an H200) decided a config for a path that lost to the 8-bit kernel by 30 % (2026-11-26, 12 cold
# calibrations). So a playoff met inside a calibration's candidate is held here, by the calibration's
# (key, path name); the choice settles it: run for the chosen path, for the others not (their first
# pass's fastest config is kept, and stored with a note).
_HELD: dict = {}  # (calibration key, path name) -> [(device, key, cands, ms, run, weight, family), ...]


def _after_choice(calibration_key: str, chosen: str, paths) -> None:
    """A calibration chose ``chosen`` among ``paths`` for ``calibration_key``: the playoffs held for
    the chosen path run now (or start in the model's calls), and the configs they pick replace the
    provisional ones; the other paths' picks are stored as their first pass left them."""
    for name in paths:
        for device, key, cands, ms, run, weight, family, in_model in _HELD.pop((calibration_key, name), []):
            if name == chosen:
                t0 = time.perf_counter()
                with _LOCK:
                    best, rec = _settle_here(device, key, cands, ms, run, weight, family, in_model)
                calibration.COUNTERS["autotune_s"] += time.perf_counter() - t0
            else:
                calibration.COUNTERS["playoffs_not_run"] += 1
                best, rec = _settle(device, cands, ms, run, weight, family, playoff=False)
                if rec is not None:
                    rec["playoff"] = f"not run: the calibration chose {chosen}, not {name}"
            if rec is not None:
                calibration.remember(device, key, rec)


calibration.on_choice(_after_choice)


_PENDING: dict = {}  # key -> kernels.prepare.Prepared: configs compiling in the background


def _deferred(device: torch.device, key: str, cands: list, warm: Callable) -> bool:
    """As a calibration's shape class (kernels/calibration.py): where the calibration defers, a
    new key's configs are compiled in the background (kernels/prepare.py), the first runs untimed
    meanwhile, and the first call after they are ready times them. True while this call is to run
    the first config untimed."""
    if device.type != "cuda" and calibration._defer_override is None:
        return False
    if not calibration.deferring():
        _PENDING.pop(key, None)
        return False
    pend = _PENDING.get(key)
    if pend is None:
        # the first config runs now: compiled first, waited for; the others compile meanwhile
        first = prepare.prepare({cands[0]: functools.partial(warm, cands[0])})
        _PENDING[key] = prepare.prepare({c: functools.partial(warm, c) for c in cands[1:]})
        first.wait()
        calibration.COUNTERS["prepared"] += 1
    elif pend.done() and not prepare.busy():  # timed once no compile runs (kernels/calibration.py)
        del _PENDING[key]
        pend.wait()  # every config in its kernel's cache before the timed runs launch it
        return False
    calibration.COUNTERS["deferred_calls"] += 1
    return True


# One median per candidate ranks them, but two close ones can swap from one timing to the next. On
# an H100 whose cuDNN timings spread 554-688 TFLOPS on one shape (2026-11-23), the tuner kept the
# 8-bit kernel's 16-bit P·V variant at HunyuanVideo's shape, where the interleaved bench measured
# the fp8 one 13 % faster (noise is the likely cause, not established). So when the runner-up is
# within PLAYOFF_WITHIN of the best, the two (and the best of each other kernel variant within it:
# :func:`_finalists`) are timed PLAYOFF_ROUNDS more times (interleaved) and each is ranked by the
# median of its timings: a few more runs of two or three kernels, on the first call of a shape class only.
PLAYOFF_WITHIN = 1.15
# The best of another kernel variant joins the playoff from further behind: alone, one call after a
# GPU spin, a variant can rank 10-20 % off its place in a run of calls, where the power it draws sets
# the clocks. On an H100 at WAN's 32760 keys the 8-bit kernel's fp8 P·V timed 29.2-30.9 ms alone against
# the 16-bit one's 27.6-27.8 (1.15-1.19x with FP8_PV_MARGIN), and 27.3-27.5 against 29.9-30.4 back to
# back (bench/playoff_turns.py, 2026-11-26): at 1.15 it sometimes missed the playoff it then won.
FAMILY_WITHIN = 1.3
PLAYOFF_ROUNDS = 3
# On a GPU the playoff times each finalist in bursts of back-to-back calls (about SUSTAIN_MS each, at
# most SUSTAIN_MAX calls), per call, and the pick goes to the faster of them that way. Timed alone,
# one call after an L2 flush and a GPU spin, the 8-bit attention's (128, 64, 8, 3) and (64, 64, 4, 3)
# tied on an H200 at HunyuanVideo's shape (7.770 and 7.776 ms); in bursts of 20 calls the first took
# 7.93 ms and the second 8.61, between two GEMMs 8.74 and 9.53 (bench/config_ties.py), and HunyuanVideo ran 1.022
# s/step with the first, 1.066 with the second (2026-11-24). The gap needs the GPU under load for a
# while: bursts of 3 calls (20 ms) still tied them (7.85 / 7.93 ms). The alone timings stay the first pass:
# they are what rank the many, and the burst's repeated calls would hold a small kernel's operands in L2.
SUSTAIN_MS = 150.0
SUSTAIN_MAX = 32


def _score(ms: dict, c, weight: Optional[Callable]) -> float:
    """Candidate ``c``'s median time, times its weight."""
    return statistics.median(ms[c]) * (weight(c) if weight is not None else 1.0)


def _fastest(ms: dict, weight: Optional[Callable]) -> tuple:
    """(candidate, its median ms) with the least weighted median time, or (None, None)."""
    if not ms:
        return None, None
    best = min(ms, key=lambda c: _score(ms, c, weight))
    return best, statistics.median(ms[best])


def _sustained_ms(device: torch.device, fns: dict, est: dict) -> dict:
    """Milliseconds per call of each ``fns[c]()`` run in one burst of back-to-back calls (about
    SUSTAIN_MS long by ``est[c]``, its time alone), after an L2 flush; or the exception it raised."""
    out = {}
    with torch.cuda.device(device):
        for c, fn in fns.items():
            n = max(1, min(SUSTAIN_MAX, math.ceil(SUSTAIN_MS / max(est[c], 1e-3))))
            try:
                out[c] = calibration.burst_ms(fn, n)
            except Exception as e:  # noqa: BLE001
                out[c] = e
    return out


def _finalists(ms: dict, weight: Optional[Callable], family: Optional[Callable]) -> list:
    """The candidates of the playoff, best first: the best two when the runner-up is within
    PLAYOFF_WITHIN of the best, and the best of each other ``family`` (kernel variant) within
    FAMILY_WITHIN of it. Timed alone the variants rank differently than under load: on an H200 at
    WAN's 32760 keys the 8-bit kernel's 16-bit P·V (128, 64, 4, 3) timed 34.4 ms alone, its fp8 P·V
    (128, 128, 8, 3) 36.4, and back to back 38.3 against 34.7 ms; with only the best two in the
    playoff (both 16-bit P·V), `auto` never timed the fp8 one under load and took the slower variant
    (2026-11-25)."""
    ranked = sorted(ms, key=lambda c: _score(ms, c, weight))
    if len(ranked) < 2:
        return []
    best = _score(ms, ranked[0], weight)
    close = [c for c in ranked if _score(ms, c, weight) <= best * PLAYOFF_WITHIN]
    out = close[:2]
    if family is not None:
        seen = {family(c) for c in out}
        for c in ranked[1:]:
            if family(c) not in seen and _score(ms, c, weight) <= best * FAMILY_WITHIN:
                seen.add(family(c))
                out.append(c)
    return out if len(out) > 1 else []


def _playoff(device, ms: dict, run: Callable, weight: Optional[Callable],
             family: Optional[Callable] = None) -> Optional[dict]:
    """Times the finalists of ``ms`` (:func:`_finalists`) again, PLAYOFF_ROUNDS times (a candidate
    that fails now is dropped from ``ms``). Off a GPU the timings are added to ``ms`` and None is
    returned; on a GPU they are taken in bursts (SUSTAIN_MS) and returned, candidate -> its burst
    timings, for the pick between them."""
    pair = _finalists(ms, weight, family)
    if not pair:
        return None
    calibration.COUNTERS["playoffs"] += 1
    gpu = device.type == "cuda"
    est = {c: statistics.median(ms[c]) for c in pair}
    sustained: dict = {c: [] for c in pair}
    for r in range(PLAYOFF_ROUNDS):
        fns = {c: functools.partial(run, c) for c in (pair if r % 2 == 0 else pair[::-1]) if c in ms}
        for c, t in (_sustained_ms(device, fns, est) if gpu else time_all(device, fns)).items():
            if isinstance(t, Exception):
                ms.pop(c, None)
                sustained.pop(c, None)
            elif gpu:
                sustained[c].append(t)
            else:
                ms[c].append(t)
    return {c: t for c, t in sustained.items() if t} if gpu else None
