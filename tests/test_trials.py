"""The block-config playoff in the model's calls (kernels/trials.py), on the CPU with a fake clock: the
finalists take turns, a timing is read only once the GPU has passed its end mark, the pick is the fastest
median times its weight, made once; calls under CUDA graph capture or in a preparing run are not timed.
Through the tuner (kernels/tuning.py): a GPU key whose configs come close starts the playoff in the
model's calls instead of the bursts, stores the provisional pick at once and the settled one after."""
from __future__ import annotations

import pytest
import torch

from tritonkit.kernels import calibration as C
from tritonkit.kernels import trials as TR
from tritonkit.kernels import tuning as T

A, B, D = (128, 64, 4, 3, 0), (64, 64, 4, 3, 0), (128, 128, 8, 3, 1)


class FakeClock:
    """A GPU that runs each launch for ``cost[config]`` ms; marks are its times, and the GPU has reached
    every mark up to ``reached`` (None: all). ``waiting``: the GPU is ahead of the host, through a call's
    start before its launches are done (a host-bound model, or calls back to back)."""

    def __init__(self, cost):
        self.cost, self.now, self.reached, self.capture = cost, 0.0, None, False
        self.marks = 0
        self.waiting = False

    def capturing(self):
        return self.capture

    def mark(self):
        self.marks += 1
        return self.now

    def ready(self, end):
        return self.reached is None or end <= self.reached

    def passed(self, start):
        return self.waiting

    def ms(self, start, end):
        return end - start

    def launch(self, c):
        self.now += self.cost[c]


def model_call(trial, clock):
    c = trial.next()
    clock.launch(c)
    TR.end_call()
    return c


def test_finalists_take_turns_and_the_fastest_median_wins_once():
    clock = FakeClock({A: 10.0, B: 9.0})
    settled = []
    trial = TR.Trial([A, B], None, lambda best, med: settled.append((best, med)), clock)
    runs = [model_call(trial, clock) for _ in range(2 * TR.SAMPLES)]
    assert runs == [A, B] * TR.SAMPLES and settled == []  # the last timings are read at the next call
    assert model_call(trial, clock) == B
    assert settled == [(B, {A: 10.0, B: 9.0})]
    assert [model_call(trial, clock) for _ in range(3)] == [B] * 3 and len(settled) == 1
    assert clock.marks == 4 * TR.SAMPLES  # the calls after the pick are not timed


def test_a_weight_and_a_noisy_sample_decide_by_the_weighted_median():
    # D (fp8 P·V) is 5 % faster but weighted 1.1: A stays; one slow outlier of A does not move its median
    clock = FakeClock({A: 10.0, B: 11.0, D: 9.5})
    settled = []
    trial = TR.Trial([A, B, D], lambda c: 1.1 if c[4] == 1 else 1.0, lambda b, m: settled.append(b), clock)
    cost = clock.cost
    for i in range(3 * TR.SAMPLES + 1):
        cost[A] = 30.0 if i == 0 else 10.0
        model_call(trial, clock)
    assert settled == [A]


def test_a_timing_is_read_only_once_the_gpu_passed_it():
    clock = FakeClock({A: 10.0, B: 9.0})
    clock.reached = 0.0  # the GPU is behind: nothing read yet
    settled = []
    trial = TR.Trial([A, B], None, lambda b, m: settled.append(b), clock)
    runs = [model_call(trial, clock) for _ in range(2 * TR.SAMPLES)]
    # every timing taken, none read: the calls go on with the provisional config, untimed
    assert [model_call(trial, clock) for _ in range(3)] == [A] * 3 and clock.marks == 4 * TR.SAMPLES
    assert runs == [A, B] * TR.SAMPLES and settled == [] and not trial.settled
    clock.reached = None
    assert model_call(trial, clock) == B and settled == [B]


def test_graph_capture_and_preparing_runs_are_not_timed_and_a_failed_call_is_dropped():
    clock = FakeClock({A: 10.0, B: 9.0})
    trial = TR.Trial([A, B], None, lambda b, m: None, clock)
    clock.capture = True
    assert [model_call(trial, clock) for _ in range(4)] == [A] * 4 and clock.marks == 0
    clock.capture = False
    assert trial.next(untimed=True) == A and clock.marks == 0
    TR.end_call()  # nothing pending: no mark
    assert clock.marks == 0
    trial.next()  # a call whose launch raised: no end_call; the next call drops it
    model_call(trial, clock)
    assert sum(len(s) for s in trial.samples.values()) + len(trial._inflight) == 1


def test_timings_the_gpu_waited_for_the_host_in_are_set_aside():
    # the trial's first calls come back to back (a warm-up): the GPU waits for the host inside their windows,
    # which time B's heavier host work (30 ms) instead of its kernel. Set aside, they don't decide; B, short of
    # MIN_VALID timings, gets the schedule once more
    clock = FakeClock({A: 10.0, B: 9.0})
    settled = []
    trial = TR.Trial([A, B], None, lambda best, med: settled.append((best, med)), clock)
    runs = []
    for i in range(4 * TR.SAMPLES + 1):
        clock.waiting = i < 2 * (TR.SAMPLES - TR.MIN_VALID + 1)
        clock.cost[B] = 30.0 if clock.waiting else 9.0
        runs.append(model_call(trial, clock))
    assert runs == [A, B] * 2 * TR.SAMPLES + [B]
    assert settled == [(B, {A: 10.0, B: 9.0})] and not trial.fell_back
    assert trial.waited == {A: TR.SAMPLES - TR.MIN_VALID + 1, B: TR.SAMPLES - TR.MIN_VALID + 1}


def test_a_host_bound_model_keeps_the_fastest_alone():
    # every call's window holds host time: no timing was valid, so the schedule is not repeated and the
    # provisional pick stays
    clock = FakeClock({A: 10.0, B: 9.0})
    clock.waiting = True
    settled = []
    trial = TR.Trial([A, B], None, lambda best, med: settled.append((best, med)), clock)
    runs = [model_call(trial, clock) for _ in range(2 * TR.SAMPLES + 1)]
    assert runs == [A, B] * TR.SAMPLES + [A] and settled == [(A, {})] and trial.fell_back
    assert clock.marks == 2 * TR.SAMPLES  # start marks only: no end marked for a window set aside
    assert trial.waited == {A: TR.SAMPLES, B: TR.SAMPLES}


def test_a_finalist_short_after_the_repeat_leaves_the_fastest_alone():
    # the GPU led in A's first calls only: the schedule runs once more (a timing was valid), B stays short of
    # MIN_VALID, and the provisional pick stays
    clock = FakeClock({A: 10.0, B: 9.0})
    settled = []
    trial = TR.Trial([A, B], None, lambda best, med: settled.append((best, med)), clock)
    runs = []
    for i in range(4 * TR.SAMPLES + 1):
        clock.waiting = i != 0
        runs.append(model_call(trial, clock))
    assert runs == [A, B] * 2 * TR.SAMPLES + [A] and settled == [(A, {A: 10.0})] and trial.fell_back
    assert trial.waited == {A: 2 * TR.SAMPLES - 1, B: 2 * TR.SAMPLES}


@pytest.mark.parametrize("stretch", [1, 4])
def test_a_finalist_whose_calls_raise_leaves_the_trial(stretch):
    # also where its calls raise in a turn's untimed first half
    clock = FakeClock({A: 10.0, B: 9.0})
    settled = []
    trial = TR.Trial([A, B], None, lambda best, med: settled.append((best, med)), clock, stretch=stretch)
    runs = []
    for _ in range(2 * TR.SAMPLES * stretch + 4):
        c = trial.next()
        runs.append(c)
        if c == B:
            continue  # its launch raised (the caller falls back): no end_call
        clock.launch(c)
        TR.end_call()
    assert runs.count(B) == TR.MAX_LOST  # handed out no more once it lost that many calls
    assert settled == [(A, {A: 10.0})] and trial.next() == A


class PowerCappedClock(FakeClock):
    """A GPU under a power cap: a call takes ``cost[c]`` ms times (1 + SLOW × heat), where heat follows
    the power the calls before it drew (``draw[c]``, 0-1; an exponential average, HEAT_KEEP kept per call):
    the 8-bit attention's 16-bit P·V, faster at full clocks, draws more and runs at lower ones."""
    SLOW, HEAT_KEEP = 0.1, 0.7

    def __init__(self, cost, draw):
        super().__init__(cost)
        self.draw, self.heat = draw, 0.0

    def launch(self, c):
        self.now += self.cost[c] * (1 + self.SLOW * self.heat)
        self.heat = self.HEAT_KEEP * self.heat + (1 - self.HEAT_KEEP) * self.draw[c]


def test_turns_of_consecutive_calls_pick_what_runs_faster_back_to_back():
    half, fp8 = (128, 128, 4, 2, 3), (128, 128, 4, 2, 4)
    cost, draw = {half: 9.7, fp8: 10.0}, {half: 1.0, fp8: 0.0}

    def back_to_back(c, n=40):
        clock = PowerCappedClock(cost, draw)
        t = []
        for _ in range(n):
            t0 = clock.now
            clock.launch(c)
            t.append(clock.now - t0)
        return t[-1]

    assert back_to_back(fp8) < back_to_back(half)  # fp8 is the faster one in a model's run of calls

    def playoff(stretch):
        clock, settled = PowerCappedClock(cost, draw), []
        trial = TR.Trial([half, fp8], None, lambda best, med: settled.append(best), clock, stretch=stretch)
        for _ in range(2 * TR.SAMPLES * stretch + 1):
            model_call(trial, clock)
            if settled:
                break
        return settled

    assert playoff(1) == [half]  # call by call, each runs at the clocks the other one's draw left
    assert playoff(TR.stretch_for(10.0)) == [fp8]


@pytest.fixture
def tuner(tmp_path, monkeypatch):
    monkeypatch.setenv(C.ENV_DIR, str(tmp_path / "calib"))
    monkeypatch.delenv(TR.ENV, raising=False)
    C.reset()
    T.reset()
    stored = {}
    monkeypatch.setattr(C, "recall", lambda dev, key: stored.get(key))
    monkeypatch.setattr(C, "remember", lambda dev, key, rec: stored.update({key: dict(rec)}))
    yield stored
    C.reset()
    T.reset()


def test_the_tuner_runs_a_gpu_playoff_in_the_models_calls(tuner, monkeypatch):
    alone = {A: 10.0, B: 10.1, D: 30.0}  # A and B tie alone; B is faster in the model
    monkeypatch.setattr(T, "time_all", lambda device, fns, light=None: {c: alone[c] for c in fns})
    monkeypatch.setattr(T, "_sustained_ms", lambda *a: pytest.fail("no bursts where the model's calls decide"))
    clock = FakeClock({A: 10.0, B: 9.0, D: 30.0})
    monkeypatch.setattr(T, "_clock", lambda device: clock)
    gpu = torch.device("cuda")
    p0, m0 = C.COUNTERS["playoffs"], C.COUNTERS["playoffs_in_model"]

    def call():
        c = T.pick(gpu, "k|m", [A, B, D], run=lambda c: None, in_model=True)
        clock.launch(c)
        TR.end_call()
        return c

    assert call() == A  # the tuning call runs the first pass's fastest
    assert "k|m" not in T.cache() and tuner["k|m"]["config"] == list(A)
    assert tuner["k|m"]["playoff"] == "in the model's calls" and C.COUNTERS["playoffs"] == p0 + 1
    n = TR.stretch_for(10.0)  # turns of about STRETCH_MS: 15 calls of 10 ms
    assert n == 15 and tuner["k|m"]["playoff_turn_calls"] == n
    runs = [call() for _ in range(2 * TR.MIN_TURNS * n + 1)]
    assert runs[:2 * TR.MIN_TURNS * n] == ([A] * n + [B] * n) * TR.MIN_TURNS and runs[-1] == B
    assert clock.marks == 2 * TR.MIN_TURNS * (n - n // 2) * 2  # the second half of each turn, start and end
    assert T.cache()["k|m"] == B and C.COUNTERS["playoffs_in_model"] == m0 + 1
    rec = tuner["k|m"]
    assert rec["config"] == list(B) and rec["ms"] == 10.1 and "playoff" not in rec
    assert rec["playoff_in_model_ms"] == {"128,64,4,3,0": 10.0, "64,64,4,3,0": 9.0}
    assert rec["playoff_host_bound"] == {"set_aside": 0, "kept_fastest_alone": False}
    # a new process reads the settled pick: no timing, no playoff
    T.reset()
    assert call() == B and T.cache()["k|m"] == B
    # a caller that does not time its calls, or TRITONKIT_PLAYOFF_IN_MODEL=0: the bursts, as before
    bursts = []
    monkeypatch.setattr(T, "_sustained_ms", lambda device, fns, est: bursts.append(list(fns)) or {A: 2.0, B: 1.0})
    assert T.pick(gpu, "k|b", [A, B, D], run=lambda c: None) == B and len(bursts) == T.PLAYOFF_ROUNDS
    monkeypatch.setenv(TR.ENV, "0")
    assert T.pick(gpu, "k|b0", [A, B, D], run=lambda c: None, in_model=True) == B
    assert len(bursts) == 2 * T.PLAYOFF_ROUNDS and "k|b0" not in T._TRIALS


def test_a_calibrations_chosen_path_starts_its_playoff_in_the_models_calls(tuner, monkeypatch):
    alone = {A: 10.0, B: 10.1, D: 30.0}
    monkeypatch.setattr(T, "time_all", lambda device, fns, light=None: {c: alone[c] for c in fns})
    monkeypatch.setattr(T, "_sustained_ms", lambda *a: pytest.fail("no bursts"))
    clock = FakeClock({A: 10.0, B: 9.0, D: 30.0})
    monkeypatch.setattr(T, "_clock", lambda device: clock)
    gpu = torch.device("cuda")

    def path(key):
        return lambda: T.pick(gpu, key, [A, B, D], run=lambda c: None, in_model=True)

    monkeypatch.setattr(C, "_timer", lambda name, fn: (fn(), {"exact": 2.0, "int8": 1.0}[name])[1])
    # the calibration's own store on the CPU (no GPU here to name it); the paths tune for the "GPU"
    assert C.choose(torch.device("cpu"), "cls", {"exact": path("k|exact"), "int8": path("k|int8")}, "exact") == "int8"
    assert set(T._TRIALS) == {"k|int8"} and T.cache()["k|exact"] == A
    assert T.unsettled() == 1  # the playoff still to run in the calls
    assert tuner["k|exact"]["playoff"] == "not run: the calibration chose int8, not exact"
    assert tuner["k|int8"]["playoff"] == "in the model's calls"
    for _ in range(2 * TR.MIN_TURNS * TR.stretch_for(10.0) + 1):
        c = T.pick(gpu, "k|int8", [A, B, D], run=lambda c: None, in_model=True)
        clock.launch(c)
        TR.end_call()
    assert T.cache()["k|int8"] == B and tuner["k|int8"]["config"] == list(B)


@pytest.mark.gpu
def test_on_a_gpu_the_faster_of_two_matmuls_is_picked_from_their_calls():
    dev = torch.device("cuda")
    a, b = torch.randn(4096, 4096, device=dev), torch.randn(1024, 4096, device=dev)
    work = {"big": lambda: a @ a, "small": lambda: b @ a}
    settled = []
    trial = TR.Trial(["big", "small"], None, lambda best, med: settled.append((best, med)), TR.CudaClock())
    for _ in range(20 * TR.SAMPLES):
        a @ a  # the GPU behind the host, as in a model: each call is queued before the GPU reaches it
        work[trial.next()]()
        TR.end_call()
        if settled:
            break
        torch.cuda.synchronize()
    assert settled and settled[0][0] == "small", settled
    med = settled[0][1]
    assert 2.0 < med["big"] / med["small"] < 8.0, med  # 4x the FLOPs


@pytest.mark.gpu
def test_on_a_gpu_a_window_the_gpu_waited_in_is_set_aside():
    # the GPU idle at the start mark and the host slow to launch (1 ms): the GPU is through the start before the
    # launch, so the timing would hold host time; queued behind a matmul, the same call is timed
    import time
    dev = torch.device("cuda")
    a = torch.randn(4096, 4096, device=dev)
    big, small = torch.empty_like(a), torch.empty_like(a[:1])
    torch.mm(a, a, out=big)  # warm: no allocation (a cudaMalloc may synchronise) inside the test's windows
    torch.mm(a[:1], a, out=small)
    trial = TR.Trial(["x"], None, lambda best, med: None, TR.CudaClock())
    torch.cuda.synchronize()
    trial.next()
    time.sleep(1e-3)
    torch.mm(a[:1], a, out=small)
    TR.end_call()
    assert trial.waited == {"x": 1} and not trial._inflight
    for _ in range(4):
        torch.mm(a, a, out=big)
    trial.next()
    torch.mm(a[:1], a, out=small)
    TR.end_call()
    torch.cuda.synchronize()
    assert trial.waited == {"x": 1} and len(trial._inflight) == 1


class FakePending:
    """kernels.prepare.Prepared of a background compile that finishes when the test says."""

    def __init__(self, fns):
        self.fns, self.finished, self.waited = dict(fns), False, False

    def done(self):
        return self.finished

    def wait(self, timeout=None):
        for fn in self.fns.values():
            fn()
        self.waited = True


def test_a_playoff_left_unsettled_starts_again_in_the_next_process(tuner, monkeypatch):
    alone = {A: 10.0, B: 10.1, D: 30.0}  # A and B tie alone; B is faster in the model
    monkeypatch.setattr(T, "time_all", lambda device, fns, light=None: {c: alone[c] for c in fns})
    clock = FakeClock({A: 10.0, B: 9.0, D: 30.0})
    monkeypatch.setattr(T, "_clock", lambda device: clock)
    gpu = torch.device("cuda")
    warmed = []

    def call(warm=None):
        c = T.pick(gpu, "k|r", [A, B, D], run=lambda c: None, warm=warm, in_model=True)
        clock.launch(c)
        TR.end_call()
        return c

    n = TR.stretch_for(10.0)
    for _ in range(n + 2):  # the run ends in B's first turn: the record keeps the first pass's pick
        call()
    assert tuner["k|r"]["playoff"] == T.IN_MODEL and tuner["k|r"]["config"] == list(A)
    # a new process: the finalists compile in the background first, the stored pick running meanwhile
    T.reset()
    monkeypatch.setattr(T, "time_all", lambda *a, **kw: pytest.fail("nothing is timed alone again"))
    monkeypatch.setattr(T.prepare, "available", lambda: True)
    monkeypatch.setattr(T.prepare, "busy", lambda: False)
    pending = []
    monkeypatch.setattr(T.prepare, "prepare", lambda fns: pending.append(FakePending(fns)) or pending[-1])
    resumed = C.COUNTERS["playoffs_resumed"]
    marks = clock.marks
    assert [call(warmed.append) for _ in range(3)] == [A] * 3 and clock.marks == marks
    assert len(pending) == 1 and set(pending[0].fns) == {A, B} and "k|r" not in T._TRIALS
    pending[0].finished = True
    runs = [call(warmed.append) for _ in range(2 * TR.MIN_TURNS * n + 1)]
    assert pending[0].waited and warmed == [A, B]  # both finalists compiled before their turns
    assert runs[:2 * TR.MIN_TURNS * n] == ([A] * n + [B] * n) * TR.MIN_TURNS and runs[-1] == B
    assert C.COUNTERS["playoffs_resumed"] == resumed + 1
    rec = tuner["k|r"]
    assert rec["config"] == list(B) and "playoff" not in rec and set(rec["playoff_in_model_ms"]) == {
        "128,64,4,3,0", "64,64,4,3,0"}
    # the process after: the settled pick, nothing run again
    T.reset()
    assert call() == B and "k|r" not in T._TRIALS and T.cache()["k|r"] == B
    # a record that names no close finalists is the pick as it is
    tuner["k|x"] = {"config": list(D), "playoff": T.IN_MODEL, "candidates_ms": {"128,128,8,3,1": 30.0}}
    assert T.pick(gpu, "k|x", [A, B, D], run=lambda c: None, in_model=True) == D and T.cache()["k|x"] == D
