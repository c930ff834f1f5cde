"""The block-config playoff run in the model's own calls, timed with CUDA events.

kernels/tuning.py ranks a key's block configs by timing each alone (after an L2 flush, behind a GPU
spin), and where the best two come within PLAYOFF_WITHIN of each other (or the best of another kernel
variant within FAMILY_WITHIN of the best) it holds a playoff: configs that tie alone can differ by 8-10 % under load (the 8-bit
attention at HunyuanVideo's and WAN's shapes, 2026-11-24/25). Timed in synthetic bursts of about
150 ms, three rounds, that playoff was about 1 s of a cold HunyuanVideo step on an H100 (2026-11-26).

Here the playoff runs in the calls the model makes anyway: while a key is on trial its calls run the
finalists in turns, a timed call between a start and an end CUDA event recorded on the calling stream,
and once every finalist has had its turns and their timings have completed, the fastest by median
(times its weight) is the key's config from then on. The model's calls are the load the bursts imitate (the
attention between its block's GEMMs), they cost no extra GPU time, and the host never waits: an event
pair is read only once the GPU has passed it (``Event.query``).

The finalists take turns of consecutive calls, about STRETCH_MS of GPU time each, and only the second
half of each turn is timed: at the GPU's power cap a call runs at the clocks the calls before it left.
On an H100 at WAN's shape (``python3 bench/playoff_turns.py --context --smi 20``, 2026-11-26) the 8-bit
kernel's 16-bit P·V ran at 1665 MHz back to back and its fp8 P·V at 1860, 30.2 against 27.5 ms a call;
alternated call by call, each call ran at the clocks the other one's draw left behind and the 16-bit
form timed faster (28.8 against 29.3 ms): a turn of one call picked the slower form. In turns of 6
calls the order was the back-to-back one (30.7 against 27.3 ms), also between the block's GEMMs (the
block 58.0 against 57.0 ms; back to back 58.2 against 56.9).

A timing counts only where the GPU did not wait for the host inside it: its start is marked before the
call's host work (launches, the config's choice), so where the GPU had already passed that mark when the
call's launches were done, the window holds host time, and the timing is set aside. On an H200 at SDXL's
8-bit shape (``.device/p44a.py``, 2026-11-28) a playoff that began in bench/attention.py's back-to-back
warm-up calls timed its first finalists' turns at 413-430 µs against 204-257 µs between GEMMs, and picked
a form 6 % slower (bench/attention.py now runs its playoff between GEMMs from the start). A finalist
short of MIN_VALID timings after the schedule gets the schedule once more, where any timing so far was
valid; where none was (a host-bound model: the GPU waits for the host in every call anyway), or a finalist
is short after the repeat, the provisional config, the fastest alone, stays. (Repeated for a host-bound
key, the schedule of a small call, 32-call turns, outlasted a test's 400 calls: H200, 2026-11-28.)

A call made while a CUDA graph is captured, or inside a preparing run (kernels/prepare.py: launches
only compile), runs the provisional config untimed. ``TRITONKIT_PLAYOFF_IN_MODEL=0`` keeps the bursts.
"""
from __future__ import annotations

import math
import os
import statistics
import threading
from typing import Callable, Optional

import torch

ENV = "TRITONKIT_PLAYOFF_IN_MODEL"
# timings per finalist before the pick: the model's calls of one key are alike, and a 7-11 ms
# attention call varies by about 1 % between them
SAMPLES = 6
# a finalist whose calls raised (no end marked) this many times leaves the trial
MAX_LOST = 2
# timings a finalist needs (the GPU not waiting for the host inside them) for the pick by medians
MIN_VALID = 3
# a turn: consecutive calls of one finalist, about STRETCH_MS of their time alone (at most STRETCH_MAX
# calls), the second half timed; every finalist takes at least MIN_TURNS turns, interleaved (A B A B)
STRETCH_MS = 150.0
STRETCH_MAX = 32
MIN_TURNS = 2
_local = threading.local()  # .pending: (trial, config, start mark) of this thread's call in flight


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class CudaClock:
    """Start / end marks of a call on ``device``'s current CUDA stream (where the kernels launch): event
    pairs, read once completed."""

    def __init__(self, device=None):
        self.device = device

    def capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def mark(self):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def ready(self, end) -> bool:
        return end.query()

    def passed(self, start) -> bool:
        """Whether the GPU has already passed ``start``: called once the call's launches are done."""
        return start.query()

    def ms(self, start, end) -> float:
        return start.elapsed_time(end)


def stretch_for(est_ms: float) -> int:
    """Calls in a turn of a finalist whose call takes ``est_ms`` alone: about STRETCH_MS of GPU time."""
    return max(1, min(STRETCH_MAX, math.ceil(STRETCH_MS / max(float(est_ms), 1e-3))))


class Trial:
    """One key's playoff in the model's calls: ``finalists`` (configs, the provisional best first) take
    turns of ``stretch`` consecutive calls, the second half of each timed, until every finalist has had
    its turns (at least MIN_TURNS, and SAMPLES timings); ``settle(best, medians)`` is called once, when
    every timing has been read. ``stretch`` 1: a turn is one call, every call timed. A timing the GPU
    waited for the host in is set aside (``waited``); see the module's notes."""

    def __init__(self, finalists: list, weight: Optional[Callable], settle: Callable, clock, stretch: int = 1):
        self.finalists = list(finalists)
        self.weight = weight
        self.clock = clock
        self._settle = settle
        self.stretch = max(1, int(stretch))
        self._warm = self.stretch // 2  # the calls of a turn that run untimed, first
        timed = self.stretch - self._warm
        turns = max(MIN_TURNS if self.stretch > 1 else 1, math.ceil(SAMPLES / timed))
        self._schedule = self.finalists * turns  # turn t: finalist t mod n
        self._k = 0  # calls handed out along the schedule
        self._inflight: list = []  # (config, start mark, end mark) not yet read
        self.samples: dict = {c: [] for c in self.finalists}
        self._lost: dict = {c: 0 for c in self.finalists}  # calls handed out that never ended
        self.waited: dict = {c: 0 for c in self.finalists}  # timings set aside: the GPU waited for the host
        self._repeated = False  # the schedule ran once more for a finalist short of MIN_VALID timings
        self.fell_back = False  # settled on the provisional config: too few timings the host did not hold up
        self.settled = False
        self._lock = threading.Lock()

    @property
    def provisional(self):
        return self.finalists[0]

    def next(self, untimed: bool = False):
        """The config this call runs. Unless ``untimed`` (or a CUDA graph is being captured), it takes
        the schedule's next call, and where that is a timed one its start is marked and :func:`end_call`
        marks its end after the launch."""
        prev = getattr(_local, "pending", None)
        _local.pending = None
        if prev is not None:  # a call that never ended (it raised): dropped, and counted against its config
            prev[0]._lose(prev[1])
        finished = None
        with self._lock:
            if self.settled:
                return self.best
            self._read()
            nxt = None
            if not (untimed or self.clock.capturing()):
                nxt = self._next_call()
            if nxt is None:
                if self._inflight or not self._done():
                    return self.provisional  # untimed, or every call handed out and some still on the GPU
                finished = self._finish()
        if finished is not None:
            # outside this trial's lock: settling takes the tuner's lock and the calibration store's
            self._settle(*finished)
            return self.best
        c, timed = nxt
        # every call of a turn is pending until end_call (a call that raised counts against its config);
        # only the timed ones carry a start mark
        _local.pending = (self, c, self.clock.mark() if timed else None)
        return c

    def _done(self) -> bool:
        return self._k >= len(self._schedule) * self.stretch

    def _next_call(self):
        """(config, timed) of the schedule's next call, a lost finalist's turns skipped; None once the
        schedule is done (run once more where a finalist is short of MIN_VALID timings)."""
        if self._done() and not self._repeated and self._short() and self._any_valid():
            self._repeated = True
            self._schedule = self._schedule * 2
        while not self._done():
            turn, pos = divmod(self._k, self.stretch)
            c = self._schedule[turn]
            if self._lost[c] >= MAX_LOST:
                self._k = (turn + 1) * self.stretch
                continue
            self._k += 1
            return c, pos >= self._warm
        return None

    def _short(self) -> list:
        """The finalists still in the trial with fewer than MIN_VALID timings, read or in flight."""
        have = {c: len(t) for c, t in self.samples.items()}
        for c, _, _ in self._inflight:
            have[c] += 1
        return [c for c in self.finalists if self._lost[c] < MAX_LOST and have[c] < MIN_VALID]

    def _any_valid(self) -> bool:
        """Whether any timing so far was one the GPU did not wait for the host in (read or in flight)."""
        return bool(self._inflight) or any(self.samples.values())

    def _lose(self, c) -> None:
        with self._lock:
            self._lost[c] += 1

    def _end(self, c, start) -> None:
        if start is None:  # an untimed call of a turn's first half
            return
        if self.clock.passed(start):  # the GPU was through the start before the launches: it waited for them
            with self._lock:
                self.waited[c] += 1
            return
        end = self.clock.mark()
        with self._lock:
            if not self.settled:
                self._inflight.append((c, start, end))

    def _read(self) -> None:
        left = []
        for c, start, end in self._inflight:
            if self.clock.ready(end):
                self.samples[c].append(self.clock.ms(start, end))
            else:
                left.append((c, start, end))
        self._inflight = left

    def medians(self) -> dict:
        return {c: statistics.median(s) for c, s in self.samples.items() if s}

    def _finish(self) -> tuple:
        med = {c: t for c, t in self.medians().items() if self._lost[c] < MAX_LOST}
        w = self.weight or (lambda c: 1.0)
        self.fell_back = bool(self._short()) or not med
        if self.fell_back and self._lost[self.provisional] < MAX_LOST:
            self.best = self.provisional
        else:
            self.best = min(med, key=lambda c: med[c] * w(c)) if med else self.provisional
        self.settled = True
        self._inflight = []
        return self.best, med


def end_call() -> None:
    """After the launch of a config a :class:`Trial` gave this thread: marks the call's end."""
    pending = getattr(_local, "pending", None)
    if pending is not None:
        _local.pending = None
        trial, c, start = pending
        trial._end(c, start)
