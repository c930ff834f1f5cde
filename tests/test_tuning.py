"""Block-config choice (kernels/tuning.py) on the CPU with a fake timer: the fastest candidate
is picked and stored, a new process (the in-memory picks cleared) reads it back without timing,
a stored config that is no candidate any more is timed afresh, every candidate is compiled before
the timing, in parallel, a candidate that fails is not picked, and timing can be switched off."""
from __future__ import annotations

import threading

import pytest
import torch

from tritonkit.kernels import calibration as C
from tritonkit.kernels import tuning as T

CPU = torch.device("cpu")
CANDS = [(128, 64, 4, 3), (64, 64, 4, 2), (128, 128, 8, 2)]


@pytest.fixture(autouse=True)
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(C.ENV_DIR, str(tmp_path / "calib"))
    for var in (T.ENV, T.ENV_OLD):
        monkeypatch.delenv(var, raising=False)
    C.reset()
    T.reset()
    yield
    C.reset()
    T.reset()


class Bench:
    """Stands in for tuning.time_ms: runs fn once (it records the candidate) and returns that
    candidate's time."""

    def __init__(self, times):
        self.times, self.timed = times, []

    def __call__(self, device, fn):
        fn()
        c = self.current
        self.timed.append(c)
        if isinstance(self.times[c], Exception):
            raise self.times[c]
        return self.times[c]


def runner(bench):
    def run(c):
        bench.current = c
    return run


def test_fastest_is_picked_stored_and_read_back_without_timing(monkeypatch):
    times = {CANDS[0]: 2.0, CANDS[1]: 0.5, CANDS[2]: 1.0}
    bench = Bench(times)
    monkeypatch.setattr(T, "time_ms", bench)
    a0 = C.COUNTERS["autotunes"]
    assert T.pick(CPU, "k|a", CANDS, run=runner(bench)) == CANDS[1]
    assert sorted(bench.timed) == sorted(CANDS) and C.COUNTERS["autotunes"] == a0 + 1
    rec = C.recall(CPU, "k|a")
    assert 0 <= rec.pop("compile_wait_s") <= rec.pop("tune_s")  # where the tuning's seconds went
    assert rec == {"config": list(CANDS[1]), "ms": 0.5,
                   "candidates_ms": {",".join(map(str, c)): t for c, t in times.items()}}
    assert T.pick(CPU, "k|a", CANDS, run=runner(bench)) == CANDS[1] and len(bench.timed) == 3

    # a new process: nothing in memory, the store on disk
    T.cache().clear()
    C.reset()
    assert T.pick(CPU, "k|a", CANDS, run=runner(bench)) == CANDS[1]
    assert len(bench.timed) == 3 and C.COUNTERS["autotunes"] == 0


def test_a_stored_config_that_is_no_candidate_is_timed_again(monkeypatch):
    bench = Bench({CANDS[0]: 1.0, CANDS[1]: 3.0})
    monkeypatch.setattr(T, "time_ms", bench)
    C.remember(CPU, "k|b", {"config": [1, 2, 3, 4], "ms": 0.1})
    assert T.pick(CPU, "k|b", CANDS[:2], run=runner(bench)) == CANDS[0]
    assert len(bench.timed) == 2 and C.recall(CPU, "k|b")["config"] == list(CANDS[0])


def test_a_failing_candidate_is_never_picked_and_all_failing_gives_the_first(monkeypatch):
    bench = Bench({CANDS[0]: RuntimeError("out of resources"), CANDS[1]: 2.0, CANDS[2]: 1.5})
    monkeypatch.setattr(T, "time_ms", bench)
    assert T.pick(CPU, "k|c", CANDS, run=runner(bench)) == CANDS[2]
    err = RuntimeError("no")
    bench2 = Bench({c: err for c in CANDS})
    monkeypatch.setattr(T, "time_ms", bench2)
    assert T.pick(CPU, "k|d", CANDS, run=runner(bench2)) == CANDS[0]
    assert C.recall(CPU, "k|d") is None  # nothing measured, nothing stored


def test_candidates_compile_in_parallel_before_timing(monkeypatch):
    bench = Bench({CANDS[0]: 1.0, CANDS[1]: 2.0, CANDS[2]: 3.0})
    monkeypatch.setattr(T, "time_ms", bench)
    monkeypatch.setattr(T.os, "cpu_count", lambda: 8)  # CI has 2 cores: a worker per candidate
    warmed, threads, barrier = [], set(), threading.Barrier(len(CANDS), timeout=10)

    def warm(c):
        assert not bench.timed, "compiled after the timing started"
        threads.add(threading.get_ident())
        barrier.wait()  # all candidates compile at once, or this times out
        warmed.append(c)
        if c == CANDS[2]:
            raise RuntimeError("does not compile here")  # left to the timed run

    assert T.pick(CPU, "k|e", CANDS, run=runner(bench), warm=warm) == CANDS[0]
    assert sorted(warmed) == sorted(CANDS) and len(threads) == len(CANDS)
    assert threading.get_ident() not in threads


@pytest.mark.parametrize("var", [T.ENV, T.ENV_OLD])
def test_timing_off_takes_the_first_candidate(monkeypatch, var):
    monkeypatch.setenv(var, "0")
    bench = Bench({c: 1.0 for c in CANDS})
    monkeypatch.setattr(T, "time_ms", bench)
    assert T.pick(CPU, "k|f", CANDS[::-1], run=runner(bench)) == CANDS[2]
    assert bench.timed == [] and C.recall(CPU, "k|f") is None


def test_a_weight_makes_a_less_accurate_candidate_earn_its_pick(monkeypatch):
    # weight(c) multiplies c's time: a variant weighted 1.03 must be over 3 % faster to win
    slow_exact, fast_approx = (128, 64, 4, 3, 0), (128, 64, 4, 3, 1)
    weight = lambda c: 1.03 if c[4] == 1 else 1.0  # noqa: E731
    bench = Bench({slow_exact: 1.0, fast_approx: 0.98})
    monkeypatch.setattr(T, "time_ms", bench)
    assert T.pick(CPU, "k|w1", [slow_exact, fast_approx], run=runner(bench), weight=weight) == slow_exact
    bench.times[fast_approx] = 0.9
    assert T.pick(CPU, "k|w2", [slow_exact, fast_approx], run=runner(bench), weight=weight) == fast_approx
    assert C.recall(CPU, "k|w2")["config"] == list(fast_approx)


class NoisyBench(Bench):
    """Each candidate's timings in turn (the last one repeats)."""

    def __call__(self, device, fn):
        fn()
        c = self.current
        self.timed.append(c)
        seq = self.times[c]
        return seq[min(self.timed.count(c), len(seq)) - 1]


def test_close_candidates_are_timed_again_interleaved(monkeypatch):
    lucky, steady, slow = CANDS
    # lucky's first timing is an outlier; its later ones are slower than steady's
    bench = NoisyBench({lucky: [0.9, 1.2, 1.2, 1.2], steady: [1.0], slow: [2.0]})
    monkeypatch.setattr(T, "time_ms", bench)
    assert T.pick(CPU, "k|p1", CANDS, run=runner(bench)) == steady
    assert bench.timed[:3] == list(CANDS)
    assert bench.timed[3:] == [lucky, steady, steady, lucky, lucky, steady][:2 * T.PLAYOFF_ROUNDS]  # A B B A A B
    stored = C.recall(CPU, "k|p1")
    assert (stored["config"], stored["ms"]) == (list(steady), 1.0)
    assert stored["candidates_ms"] == {",".join(map(str, lucky)): 1.2, ",".join(map(str, steady)): 1.0,
                                       ",".join(map(str, slow)): 2.0}  # medians, playoff timings included
    # a runner-up further than PLAYOFF_WITHIN behind: one timing each
    far = NoisyBench({lucky: [1.0], steady: [1.0 * T.PLAYOFF_WITHIN * 1.01], slow: [3.0]})
    monkeypatch.setattr(T, "time_ms", far)
    assert T.pick(CPU, "k|p2", CANDS, run=runner(far)) == lucky and len(far.timed) == 3


def test_a_calibrations_playoffs_run_only_for_the_path_it_chooses(monkeypatch):
    """Tuned inside a calibration's candidate paths (kernels/calibration.py), each path's close configs
    get their playoff only once the calibration has chosen: the chosen path's runs and can change its
    config; the losing path keeps its first pass's fastest, stored with a note, and its configs are
    timed once each."""
    lucky, steady, slow = CANDS
    i_lucky, i_steady, i_slow = (c + (1,) for c in CANDS)
    # in each path the lucky config's first timing is an outlier: the playoff finds steady faster
    bench = NoisyBench({lucky: [0.9, 1.2], steady: [1.0], slow: [2.0],
                        i_lucky: [0.9, 1.2], i_steady: [1.0], i_slow: [2.0]})
    monkeypatch.setattr(T, "time_ms", bench)
    provisional = {}

    def path(key, cands):
        def fn():
            provisional[key] = T.pick(CPU, key, cands, run=runner(bench))
        return fn

    paths = {"exact": path("k|exact", CANDS), "int8": path("k|int8", [i_lucky, i_steady, i_slow])}
    monkeypatch.setattr(C, "_timer", lambda name, fn: (fn(), {"exact": 2.0, "int8": 1.0}[name])[1])  # runs the path
    a0, p0, n0 = (C.COUNTERS[k] for k in ("autotunes", "playoffs", "playoffs_not_run"))
    assert C.choose(CPU, "cls", paths, "exact") == "int8"
    assert provisional == {"k|exact": lucky, "k|int8": i_lucky}  # the first pass's fastest, while timing
    assert (C.COUNTERS["autotunes"], C.COUNTERS["playoffs"], C.COUNTERS["playoffs_not_run"]) == (a0 + 2, p0 + 1, n0 + 1)
    # the chosen path's playoff ran (its configs timed again) and picked steady; the losing path's did not
    assert bench.timed.count(i_lucky) == 1 + T.PLAYOFF_ROUNDS and bench.timed.count(i_steady) == 1 + T.PLAYOFF_ROUNDS
    assert [bench.timed.count(c) for c in CANDS] == [1, 1, 1] and bench.timed.count(i_slow) == 1
    assert T.cache()["k|int8"] == i_steady and T.cache()["k|exact"] == lucky
    chosen, lost = C.recall(CPU, "k|int8"), C.recall(CPU, "k|exact")
    assert chosen["config"] == list(i_steady) and "playoff" not in chosen
    assert lost["config"] == list(lucky) and lost["playoff"] == "not run: the calibration chose int8, not exact"
    # outside a calibration the playoff runs at once, as before
    T.cache().clear()
    bench.timed.clear()
    assert T.pick(CPU, "k|alone", CANDS, run=runner(bench)) == steady
    # and inside one with TRITONKIT_PLAYOFF_HOLD=0 (A/B runs): both paths' playoffs run, as before
    monkeypatch.setenv(T.HOLD_ENV, "0")
    bench.timed.clear()
    paths = {"exact": path("k|exact2", CANDS), "int8": path("k|int82", [i_lucky, i_steady, i_slow])}
    assert C.choose(CPU, "cls2", paths, "exact") == "int8"
    assert [bench.timed.count(c) for c in CANDS] == [1 + T.PLAYOFF_ROUNDS, 1 + T.PLAYOFF_ROUNDS, 1]
    assert T.cache()["k|exact2"] == steady and "playoff" not in C.recall(CPU, "k|exact2")


def test_the_store_is_read_and_written_outside_the_tuners_lock(monkeypatch):
    """A calibration holds its lock while its candidates tune (they take the tuner's lock); a tuner that
    read or wrote the store (the calibration's lock) under its own lock could deadlock against it, with
    a background compile thread's pick in between."""
    seen = []
    monkeypatch.setattr(C, "recall", lambda *a: seen.append(("recall", T._LOCK.locked())) or None)
    monkeypatch.setattr(C, "remember", lambda *a: seen.append(("remember", T._LOCK.locked())))
    bench = Bench({CANDS[0]: 2.0, CANDS[1]: 0.5, CANDS[2]: 1.0})
    monkeypatch.setattr(T, "time_ms", bench)
    assert T.pick(CPU, "k|lock", CANDS, run=runner(bench)) == CANDS[1]
    assert seen == [("recall", False), ("remember", False)]


def test_inside_a_preparing_run_every_config_is_compiled_and_none_timed(monkeypatch):
    # kernels/prepare.py runs a calibration's candidates with launches turned into compiles: the
    # tuner then compiles (warms) every config, times none, picks nothing, and the run goes on
    # with the first config
    from tritonkit.kernels import runtime
    bench = Bench({c: 1.0 for c in CANDS})
    monkeypatch.setattr(T, "time_ms", bench)
    warmed = []
    tok = runtime.PREPARING.set([])
    try:
        assert T.pick(CPU, "k|prep", CANDS, run=runner(bench), warm=warmed.append) == CANDS[0]
    finally:
        runtime.PREPARING.reset(tok)
    assert sorted(warmed) == sorted(CANDS) and bench.timed == []
    assert "k|prep" not in T.cache() and C.recall(CPU, "k|prep") is None
    # the next call outside a preparing run times them as usual
    bench.times[CANDS[2]] = 0.2
    assert T.pick(CPU, "k|prep", CANDS, run=runner(bench)) == CANDS[2] and sorted(bench.timed) == sorted(CANDS)


def test_where_the_calibration_defers_a_new_key_runs_its_first_config_until_the_rest_compiled(monkeypatch):
    from tritonkit.kernels import prepare
    if not prepare.available():
        pytest.skip("this Triton has no asynchronous compile mode (3.4+)")
    bench = Bench({CANDS[0]: 2.0, CANDS[1]: 0.5, CANDS[2]: 1.0})
    monkeypatch.setattr(T, "time_ms", bench)
    ready = {"now": False}
    monkeypatch.setattr(prepare.Prepared, "done", lambda self: ready["now"])
    warmed = []
    warm = lambda c: warmed.append((c, prepare.preparing()))  # noqa: E731
    C.set_deferral(True)
    try:
        assert T.pick(CPU, "k|defer", CANDS, run=runner(bench), warm=warm) == CANDS[0]
        assert sorted(warmed) == sorted((c, True) for c in CANDS) and bench.timed == []
        assert T.pick(CPU, "k|defer", CANDS, run=runner(bench), warm=warm) == CANDS[0]  # still compiling
        assert len(warmed) == 3 and bench.timed == [] and "k|defer" not in T.cache()
        assert T.unsettled() == 1  # benches wait on this before timing `auto`
        ready["now"] = True
        busy = {"now": True}  # its configs compiled, another key's compiles still run: not timed yet
        monkeypatch.setattr(prepare, "busy", lambda: busy["now"])
        assert T.pick(CPU, "k|defer", CANDS, run=runner(bench), warm=warm) == CANDS[0]
        assert bench.timed == []
        busy["now"] = False
        assert T.pick(CPU, "k|defer", CANDS, run=runner(bench), warm=warm) == CANDS[1]  # timed now
        assert T.unsettled() == 0
        assert sorted(bench.timed) == sorted(CANDS) and C.recall(CPU, "k|defer")["config"] == list(CANDS[1])
        # inside a calibration's timing (synchronous) a new key is timed at once
        with C.synchronous():
            assert T.pick(CPU, "k|sync", CANDS, run=runner(bench), warm=warm) == CANDS[1]
        assert len(bench.timed) == 6
    finally:
        C.set_deferral(None)


def test_on_a_gpu_the_playoff_times_the_two_in_bursts_and_picks_between_them(monkeypatch):
    # the burst timings decide between the best two; the alone timings still rank the rest
    lucky, steady, slow = CANDS
    bench = Bench({lucky: 1.0, steady: 1.05, slow: 3.0})
    monkeypatch.setattr(T, "time_all", lambda device, fns, light=None: {c: bench.times[c] for c in fns})
    bursts = []

    def sustained(device, fns, est):
        bursts.append((list(fns), dict(est)))
        return {c: {lucky: 1.3, steady: 1.1}[c] for c in fns}  # in bursts steady is the faster
    monkeypatch.setattr(T, "_sustained_ms", sustained)
    gpu = torch.device("cuda")
    monkeypatch.setattr(C, "recall", lambda *a: None)
    stored = {}
    monkeypatch.setattr(C, "remember", lambda dev, key, rec: stored.update({key: rec}))
    assert T.pick(gpu, "k|burst", CANDS, run=runner(bench)) == steady
    assert [f for f, _ in bursts] == [[lucky, steady], [steady, lucky], [lucky, steady]][:T.PLAYOFF_ROUNDS]
    assert bursts[0][1] == {lucky: 1.0, steady: 1.05}  # each burst sized by the time alone
    rec = stored["k|burst"]
    assert rec["config"] == list(steady) and rec["ms"] == 1.05
    assert rec["playoff_sustained_ms"] == {",".join(map(str, lucky)): 1.3, ",".join(map(str, steady)): 1.1}


def test_the_playoff_takes_the_best_of_each_close_variant(monkeypatch):
    # the best two are one variant; the other variant's best, close behind alone, is faster in
    # bursts (as fp8 P·V at WAN's shape on an H200): it joins the playoff and wins it
    a0, b0, c1, d1, far2 = (128, 64, 4, 3, 0), (128, 64, 4, 4, 0), (128, 128, 8, 3, 1), (128, 64, 8, 3, 1), \
        (64, 64, 4, 3, 2)
    alone = {a0: 34.4, b0: 35.5, c1: 36.4, d1: 40.2, far2: 34.4 * T.FAMILY_WITHIN * 1.01}
    monkeypatch.setattr(T, "time_all", lambda device, fns, light=None: {c: alone[c] for c in fns})
    bursts = []

    def sustained(device, fns, est):
        bursts.append(list(fns))
        return {c: {a0: 38.3, b0: 38.0, c1: 34.7}[c] for c in fns}
    monkeypatch.setattr(T, "_sustained_ms", sustained)
    monkeypatch.setattr(C, "recall", lambda *a: None)
    stored = {}
    monkeypatch.setattr(C, "remember", lambda dev, key, rec: stored.update({key: rec}))
    family = lambda c: c[4]  # noqa: E731
    assert T.pick(torch.device("cuda"), "k|fam", list(alone), run=lambda c: None, family=family) == c1
    assert bursts[0] == [a0, b0, c1] and bursts[1] == [c1, b0, a0]  # d1 is c1's family, far2 too far
    assert set(stored["k|fam"]["playoff_sustained_ms"]) == {",".join(map(str, c)) for c in (a0, b0, c1)}
    # without families: the best two only
    bursts.clear()
    T.cache().clear()
    assert T.pick(torch.device("cuda"), "k|nofam", list(alone), run=lambda c: None) == b0
    assert bursts[0] == [a0, b0]
    # a weight counts in choosing the finalists: c1 weighted (36.4 * 1.27 alone) is no longer within
    # FAMILY_WITHIN of the best, so it is not timed in bursts and the 16-bit pair decides
    bursts.clear()
    T.cache().clear()
    w = lambda c: 34.4 / 36.4 * T.FAMILY_WITHIN * 1.01 if c[4] == 1 else 1.0  # noqa: E731
    assert T.pick(torch.device("cuda"), "k|famw", list(alone), run=lambda c: None, family=family, weight=w) == b0
    assert bursts[0] == [a0, b0]
    # another variant's best from further behind than PLAYOFF_WITHIN, within FAMILY_WITHIN: it plays
    bursts.clear()
    T.cache().clear()
    alone[c1] = 34.4 * (T.PLAYOFF_WITHIN + T.FAMILY_WITHIN) / 2
    alone[d1] = alone[c1] * 1.01  # still c1's family's second
    assert T.PLAYOFF_WITHIN < alone[c1] / 34.4 < T.FAMILY_WITHIN
    assert T.pick(torch.device("cuda"), "k|famfar", list(alone), run=lambda c: None, family=family) == c1
    assert bursts[0] == [a0, b0, c1]


@pytest.mark.gpu
def test_gpu_burst_timing_is_per_call():
    dev = torch.device("cuda")
    a = torch.randn(2048, 2048, device=dev)
    one = C.cuda_timer(lambda: a @ a)
    res = T._sustained_ms(dev, {"mm": lambda: a @ a, "bad": lambda: 1 / 0}, {"mm": one, "bad": 1.0})
    assert isinstance(res["bad"], ZeroDivisionError)
    assert 0.3 * one < res["mm"] < 3 * one, (res, one)
