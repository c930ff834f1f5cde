"""The block-config playoff run in the model's own calls, timed with CUDA events.

kernels/tuning.py ranks a key's block configs by timing each alone (after an L2 flush, behind a GPU
spin), and where the best two (or the best of another kernel variant) come within PLAYOFF_WITHIN of
each other it holds a playoff: configs that tie alone can differ by 8-10 % under load (the 8-bit
attention at HunyuanVideo's and WAN's shapes, 2026-11-24/25). Timed in synthetic bursts of about
150 ms, three rounds, that playoff was about 1 s of a cold HunyuanVideo step on an H100 (2026-11-26).

Here the playoff runs in the calls the model makes anyway: while a key is on trial each of its calls
runs the next finalist in turn, between a start and an end CUDA event recorded on the calling stream,
and once every finalist has SAMPLES timings that have completed, the fastest by median (times its
weight) is the key's config from then on. The model's calls are the load the bursts imitate (the
attention between its block's GEMMs), they cost no extra GPU time, and the host never waits: an event
pair is read only once the GPU has passed it (``Event.query``).

A call made while a CUDA graph is captured, or inside a preparing run (kernels/prepare.py: launches
only compile), runs the provisional config untimed. ``TRITONKIT_PLAYOFF_IN_MODEL=0`` keeps the bursts.
"""
from __future__ import annotations

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

    def ms(self, start, end) -> float:
        return start.elapsed_time(end)


class Trial:
    """One key's playoff in the model's calls: ``finalists`` (configs, the provisional best first) take
    turns; ``settle(best, medians)`` is called once, when every finalist has SAMPLES timings."""

    def __init__(self, finalists: list, weight: Optional[Callable], settle: Callable, clock):
        self.finalists = list(finalists)
        self.weight = weight
        self.clock = clock
        self._settle = settle
        self._turn = 0
        self._inflight: list = []  # (config, start mark, end mark) not yet read
        self.samples: dict = {c: [] for c in self.finalists}
        self._lost: dict = {c: 0 for c in self.finalists}  # calls handed out that never ended
        self.settled = False
        self._lock = threading.Lock()

    @property
    def provisional(self):
        return self.finalists[0]

    def next(self, untimed: bool = False):
        """The config this call runs. Unless ``untimed`` (or a CUDA graph is being captured), its start
        is marked and :func:`end_call` marks its end after the launch."""
        prev = getattr(_local, "pending", None)
        _local.pending = None
        if prev is not None:  # a call that never ended (it raised): dropped, and counted against its config
            prev[0]._lose(prev[1])
        finished = None
        with self._lock:
            if self.settled:
                return self.best
            self._read()
            live = [c for c in self.finalists if self._lost[c] < MAX_LOST]
            if all(len(self.samples[c]) >= SAMPLES for c in live):
                finished = self._finish()
            elif untimed or self.clock.capturing():
                return self.provisional
            else:
                c = self._next_finalist()
                if c is None:
                    return self.provisional  # every timing taken, some still on the GPU
        if finished is not None:
            # outside this trial's lock: settling takes the tuner's lock and the calibration store's
            self._settle(*finished)
            return self.best
        _local.pending = (self, c, self.clock.mark())
        return c

    def _next_finalist(self):
        """The next finalist, in turn, that still needs timings, or None."""
        for _ in range(len(self.finalists)):
            c = self.finalists[self._turn % len(self.finalists)]
            self._turn += 1
            if self._lost[c] < MAX_LOST and \
                    len(self.samples[c]) + sum(1 for f, _, _ in self._inflight if f == c) < SAMPLES:
                return c
        return None

    def _lose(self, c) -> None:
        with self._lock:
            self._lost[c] += 1

    def _end(self, c, start) -> None:
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
