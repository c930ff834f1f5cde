"""Calibration (kernels/calibration.py, nodes/calibration.py) on the CPU with a fake timer: the
fastest allowed path is chosen, 8-bit only where allowed, choices survive a restart (a second
process times nothing), bad files are ignored with a log line, writes are atomic, and a compiled
model reads the stored choices without graph breaks."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tritonkit.kernels import calibration as C
from tritonkit.kernels import prepare as P
from tritonkit.kernels import runtime
from tritonkit.nodes import attention as N
from tritonkit.nodes import calibration as NC

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


class FakeTimer:
    """``timer(name, fn)``: a fixed time per path name, counted; never runs fn (fast)."""

    def __init__(self, times: dict):
        self.times = times
        self.asked = []

    def __call__(self, name, fn):
        self.asked.append(name)
        return _timed(self.times[name])


def _timed(t):
    """A fake timing: its time, or the exception it stands for, raised."""
    if isinstance(t, Exception):
        raise t
    return t


@pytest.fixture(autouse=True)
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(C.ENV_DIR, str(tmp_path / "calib"))
    for var in (C.ENV_ENABLE, NC.ATTN_PATH_ENV, NC.FP8_PATH_ENV, "TRITONKIT_FORCE_ARCH"):
        monkeypatch.delenv(var, raising=False)
    C.reset()
    N.reset_stats()
    N._logged.clear()
    yield tmp_path / "calib"
    C.set_timer(None)
    C.set_deferral(None)
    C.reset()


def store_file(d: Path) -> Path:
    [f] = list(d.glob("calibration-*.json"))
    return f


def noop():
    return None


CANDS = {"comfy": noop, "exact": noop, "int8": noop}


# ----------------------------------------------------------------------------- the chooser

def test_the_store_follows_the_kernels_sources(tmp_path):
    # pack_version (in every store's key) digests the kernels' sources: an update that changes a kernel
    # and not pyproject's version must not reuse picks timed on the old code
    import importlib.util
    import shutil

    def version_of(root):
        spec = importlib.util.spec_from_file_location(f"tk_cal_{root.name}", root / "kernels" / "calibration.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.pack_version()

    roots = []
    for name, body in (("a", "X = 1\n"), ("b", "X = 1\n"), ("c", "X = 2\n")):
        root = tmp_path / name
        (root / "kernels").mkdir(parents=True)
        shutil.copy(C.__file__, root / "kernels" / "calibration.py")
        (root / "kernels" / "attention.py").write_text(body)
        (root / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "9.9.9"\n')
        roots.append(root)
    a, b, c = (version_of(r) for r in roots)
    assert a.startswith("9.9.9+") and a == b and c != a
    assert C.pack_version() == C.pack_version() and C.pack_version() != a


def test_picks_fastest_and_stores_it(store):
    t = FakeTimer({"comfy": 3.0, "exact": 1.0, "int8": 2.0})
    C.set_timer(t)
    assert C.choose(CPU, "k1", CANDS, "comfy", what="k one") == "exact"
    assert sorted(t.asked) == ["comfy", "exact", "int8"]
    data = json.loads(store_file(store).read_text())
    assert data["format"] == C.FORMAT and data["env"] == C.environment(CPU)
    e = data["entries"]["k1"]
    assert e["choice"] == "exact" and e["timings_ms"] == {"comfy": 3.0, "exact": 1.0, "int8": 2.0}
    assert e["default"] == "comfy"
    # second call: stored, no timing
    assert C.choose(CPU, "k1", CANDS, "comfy") == "exact"
    assert len(t.asked) == 3 and C.COUNTERS["calibrations"] == 1


def test_comfyuis_path_is_kept_unless_another_is_clearly_faster(store):
    # within the margin: ComfyUI's own path stays (a 2 % win flips from one process to the next)
    near = {"comfy": 1.0, "exact": 1.0 * (1 - C.PREFER_MARGIN / 2), "int8": 1.2}
    assert C.pick_fastest(near, "exact", prefer="comfy") == "comfy"
    assert C.pick_fastest(near, "exact") == "exact"                      # no preference: the fastest
    far = {"comfy": 1.0, "exact": 1.0 * (1 - 2 * C.PREFER_MARGIN), "int8": 1.2}
    assert C.pick_fastest(far, "comfy", prefer="comfy") == "exact"
    assert C.pick_fastest({"exact": 2.0, "int8": 1.0}, "exact", prefer="comfy") == "int8"  # not timed
    assert C.pick_fastest({}, "exact", prefer="comfy") == "exact"
    # through the chooser, stored with the preference it was made under
    C.set_timer(FakeTimer(near))
    assert C.choose(CPU, "kp", CANDS, "exact", prefer="comfy") == "comfy"
    e = json.loads(store_file(store).read_text())["entries"]["kp"]
    assert e["choice"] == "comfy" and e["prefer"] == "comfy" and e["margin"] == C.PREFER_MARGIN


class BurstTimer(FakeTimer):
    """A FakeTimer whose paths also have a time a call in bursts of back-to-back calls (``burst``)."""

    def __init__(self, times: dict, bursts: dict):
        super().__init__(times)
        self.bursts = bursts
        self.burst_asked = []

    def burst(self, name, fn):
        self.burst_asked.append(name)
        return _timed(self.bursts[name])


def test_close_long_paths_are_chosen_by_their_bursts(store):
    # WAN's class on an H100: exact and 8-bit tie alone, 8-bit is 14 % faster back to back
    slow = C.PATH_BURST_MIN_MS * 10
    t = BurstTimer({"comfy": slow * 1.3, "exact": slow, "int8": slow * 1.01},
                   {"comfy": slow * 0.5, "exact": slow * 1.1, "int8": slow * 0.95})
    C.set_timer(t)
    assert C.path_finalists(t.times) == ["exact", "int8"]  # comfy 30 % behind alone: not in the bursts
    assert C.choose(CPU, "kb0", CANDS, "comfy", prefer="comfy") == "exact" and t.burst_asked == []  # not asked for
    assert C.choose(CPU, "kb", CANDS, "comfy", prefer="comfy", bursts=True) == "int8"
    assert sorted(t.burst_asked) == ["exact", "int8"]  # one round: the bursts parted them by more than DECISIVE
    e = json.loads(store_file(store).read_text())["entries"]["kb"]
    assert e["choice"] == "int8" and set(e["bursts_ms"]) == {"exact", "int8"}
    assert "bursts_ms" not in json.loads(store_file(store).read_text())["entries"]["kb0"]
    assert e["timings_ms"]["exact"] == pytest.approx(slow)  # the times alone are kept too
    assert C.COUNTERS["path_playoffs"] == 1
    # ComfyUI's path among the close ones keeps its margin in the bursts too
    t2 = BurstTimer({"comfy": slow, "exact": slow * 1.02, "int8": slow * 2},
                    {"comfy": slow, "exact": slow * (1 - C.PREFER_MARGIN / 2), "int8": slow})
    C.set_timer(t2)
    assert C.choose(CPU, "kc", CANDS, "exact", prefer="comfy", bursts=True) == "comfy"
    # close in their bursts: every round, interleaved (A B, then B A)
    assert t2.burst_asked == ["comfy", "exact", "exact", "comfy"][:2 * C.PATH_PLAYOFF_ROUNDS]


def test_a_close_third_path_alone_is_in_the_bursts(store):
    # a cold WAN workflow on an H100: 8-bit timed third alone (a slow moment), fastest back to back. Every path
    # within PATH_PLAYOFF_WITHIN goes to the bursts; a second round only for those within DECISIVE of the best
    slow = C.PATH_BURST_MIN_MS * 10
    t = BurstTimer({"comfy": slow * 1.106, "exact": slow, "int8": slow * 1.109},
                   {"comfy": slow * 1.24, "exact": slow * 1.10, "int8": slow * 0.98})
    C.set_timer(t)
    assert C.choose(CPU, "k3", CANDS, "comfy", prefer="comfy", bursts=True) == "int8"
    assert sorted(t.burst_asked) == ["comfy", "exact", "int8"]  # one round: int8 led by more than DECISIVE
    e = json.loads(store_file(store).read_text())["entries"]["k3"]
    assert set(e["bursts_ms"]) == {"comfy", "exact", "int8"}
    t = BurstTimer({"comfy": slow * 1.2, "exact": slow, "int8": slow * 1.01},
                   {"comfy": slow * 1.3, "exact": slow, "int8": slow * (1 + C.PATH_BURST_DECISIVE / 2)})
    C.set_timer(t)
    assert C.choose(CPU, "k4", CANDS, "comfy", prefer="comfy", bursts=True) == "exact"
    # round 1 all three; round 2, reversed, only the two within DECISIVE of the best
    assert t.burst_asked == ["exact", "int8", "comfy", "int8", "exact"][:3 + 2 * (C.PATH_PLAYOFF_ROUNDS > 1)]


def test_short_paths_and_failing_bursts(store):
    fast = C.PATH_BURST_MIN_MS / 2
    assert C.path_finalists({"comfy": fast, "exact": fast}) == []  # too short a call to load the GPU in a burst
    assert C.path_finalists({"exact": 50.0}) == []
    assert C.path_finalists({"exact": 50.0, "int8": 50.0 * (C.PATH_PLAYOFF_WITHIN + 0.01)}) == []
    assert C.path_finalists({"int8": 50.5, "comfy": 50.0, "exact": 50.2}) == ["comfy", "exact", "int8"]  # all close
    t = BurstTimer({"comfy": fast * 3, "exact": fast, "int8": fast * 1.01}, {})
    C.set_timer(t)
    assert C.choose(CPU, "ks", CANDS, "comfy", bursts=True) == "exact" and t.burst_asked == []
    # a path that fails in its burst is not chosen, and its error is stored
    slow = C.PATH_BURST_MIN_MS * 4
    t = BurstTimer({"comfy": slow * 2, "exact": slow, "int8": slow},
                   {"exact": RuntimeError("illegal memory access"), "int8": slow * 1.2})
    C.set_timer(t)
    assert C.choose(CPU, "kf", CANDS, "comfy", bursts=True) == "int8"
    e = json.loads(store_file(store).read_text())["entries"]["kf"]
    assert "illegal memory access" in e["errors"]["exact"] and "bursts_ms" not in e
    # a fake timer without bursts times none
    C.set_timer(FakeTimer({"comfy": slow * 2, "exact": slow, "int8": slow * 1.01}))
    assert C.choose(CPU, "kn", CANDS, "comfy", bursts=True) == "exact"


def test_failing_candidate_is_not_chosen(store):
    C.set_timer(FakeTimer({"comfy": 3.0, "exact": RuntimeError("out of resources"), "int8": 2.0}))
    assert C.choose(CPU, "k", CANDS, "exact") == "int8"
    e = json.loads(store_file(store).read_text())["entries"]["k"]
    assert "exact" in e["errors"] and "out of resources" in e["errors"]["exact"]


def test_a_skipped_candidate_is_neither_compiled_nor_timed(store, monkeypatch):
    """``skip()`` is asked only when a class is about to be timed; what it names is not run (not
    even prepared), the default never drops out, and the stored entry says why."""
    t = FakeTimer({"comfy": 3.0, "exact": 1.0, "int8": 2.0})
    C.set_timer(t)
    C.set_deferral(True)
    ran = []
    cands = {n: (lambda n=n: ran.append(n)) for n in CANDS}
    monkeypatch.setattr(P.Prepared, "done", lambda self: True)
    asked = []

    def skip():
        asked.append(1)
        return {"exact": "cannot win here", "int8": "nor this", "nope": "not a candidate"}

    assert C.choose(CPU, "ks", cands, "int8", prefer="comfy", skip=skip) == "comfy"  # prepared: ComfyUI's runs
    assert sorted(ran) == ["int8"] and len(asked) == 1                                 # exact: not compiled
    assert C.choose(CPU, "ks", cands, "int8", prefer="comfy", skip=skip) == "int8"
    assert sorted(t.asked) == ["comfy", "int8"] and len(asked) == 2
    e = json.loads(store_file(store).read_text())["entries"]["ks"]
    assert e["not_timed"] == {"exact": "cannot win here"} and set(e["timings_ms"]) == {"comfy", "int8"}
    assert C.choose(CPU, "ks", cands, "int8", prefer="comfy", skip=skip) == "int8"  # stored: skip not asked
    assert len(asked) == 2 and len(t.asked) == 2
    # the default alone left: stored without timing anything
    C.set_deferral(False)
    assert C.choose(CPU, "k1", cands, "exact", skip=lambda: {"comfy": "x", "int8": "y"}) == "exact"
    e = json.loads(store_file(store).read_text())["entries"]["k1"]
    assert e["choice"] == "exact" and e["timings_ms"] == {} and set(e["not_timed"]) == {"comfy", "int8"}
    assert len(t.asked) == 2


needs_async = pytest.mark.skipif(not P.available(), reason="this Triton has no asynchronous compile mode (3.4+)")


@needs_async
def test_a_new_shape_class_runs_comfyuis_path_while_its_candidates_compile(store, monkeypatch):
    """Deferred calibration: the first call prepares every candidate but ComfyUI's own (their
    launches become background compiles) and runs ComfyUI's, which has nothing to compile (not the
    default, whose kernels would hold the model until they compiled); calls while the compiles run
    keep it; the first call after they are done times and stores the choice."""
    t = FakeTimer({"comfy": 3.0, "exact": 1.0, "int8": 2.0})
    C.set_timer(t)
    C.set_deferral(True)
    prepared = []
    cands = {n: (lambda n=n: prepared.append((n, P.preparing()))) for n in CANDS}
    ready = {"now": False}
    monkeypatch.setattr(P.Prepared, "done", lambda self: ready["now"])
    assert C.choose(CPU, "kd", cands, "int8", prefer="comfy") == "comfy"
    assert sorted(prepared) == [("exact", True), ("int8", True)]  # ComfyUI's path has nothing to compile
    assert t.asked == [] and not store.exists() and C.COUNTERS["prepared"] == 1
    assert C.choose(CPU, "kd", cands, "int8", prefer="comfy") == "comfy"  # still compiling
    assert t.asked == [] and len(prepared) == 2 and C.COUNTERS["deferred_calls"] == 2
    assert C.pending(CPU, "kd") and not C.pending(CPU, "other")  # the nodes say why ComfyUI's path ran
    ready["now"] = True
    assert C.choose(CPU, "kd", cands, "int8", prefer="comfy") == "exact"  # ready: timed now
    assert not C.pending(CPU, "kd")
    assert sorted(t.asked) == ["comfy", "exact", "int8"] and len(prepared) == 2
    assert json.loads(store_file(store).read_text())["entries"]["kd"]["choice"] == "exact"
    assert C.choose(CPU, "kd", cands, "int8", prefer="comfy") == "exact" and len(t.asked) == 3
    assert not C._PENDING


@needs_async
def test_a_class_is_timed_only_once_no_other_class_compiles(store, monkeypatch):
    """Two new shape classes: the first's compiles finish while the second's still run. Its calls keep
    ComfyUI's path (a timing now would compete with those compiles for the GIL) until the pool is idle;
    then each is timed at its next call."""
    t = FakeTimer({"comfy": 3.0, "exact": 1.0, "int8": 2.0})
    C.set_timer(t)
    C.set_deferral(True)
    ready = {}

    class Fake:  # one class's background compiles, done when the test says so
        def __init__(self, fns):
            self.names, self.key = sorted(fns), current[0]

        def done(self):
            return ready[self.key]

        def wait(self, timeout=None):
            assert ready[self.key], "waited for compiles that were not done"

    made, current = [], [None]

    def fake_prepare(fns):
        f = Fake(fns)
        made.append(f)
        return f

    monkeypatch.setattr(P, "prepare", fake_prepare)
    monkeypatch.setattr(P, "busy", lambda: not all(ready[f.key] for f in made))  # the pool, as prepare.busy
    cands = {n: (lambda: None) for n in CANDS}
    for key in ("ka", "kb"):
        ready[key], current[0] = False, key
        assert C.choose(CPU, key, cands, "int8", prefer="comfy") == "comfy"
        assert made[-1].names == ["exact", "int8"] and made[-1].key == key
    ready["ka"] = True  # ka's compiles done, kb's not: ka is not timed yet
    assert C.choose(CPU, "ka", cands, "int8", prefer="comfy") == "comfy"
    assert t.asked == [] and C.pending(CPU, "ka") and C.pending(CPU, "kb")
    ready["kb"] = True
    assert C.choose(CPU, "ka", cands, "int8", prefer="comfy") == "exact"
    assert sorted(t.asked) == ["comfy", "exact", "int8"] and not C.pending(CPU, "ka")
    assert C.choose(CPU, "kb", cands, "int8", prefer="comfy") == "exact" and len(t.asked) == 6
    assert not C._PENDING
    # a class timed at once (a compiled model's eager first call) does not wait for the others
    ready["kc"], ready["kd"], current[0] = False, True, "kc"
    assert C.choose(CPU, "kc", cands, "int8", prefer="comfy") == "comfy"
    current[0] = "kd"
    with C.synchronous():
        assert C.choose(CPU, "kd", cands, "int8", prefer="comfy") == "exact"
    assert len(t.asked) == 9 and C.pending(CPU, "kc")


@needs_async
def test_without_comfyuis_path_the_interim_runs_not_the_default(store, monkeypatch):
    """An fp8 layer below sm89 (ComfyUI's path is not a candidate), small-M: the default is the fused
    linear, but while the class compiles its calls take decode + matmul, whose kernel is the only one
    waited for; the fused linear compiles in the background and is timed once ready."""
    t = FakeTimer({"decode": 2.0, "fused": 1.0})
    C.set_timer(t)
    C.set_deferral(True)
    prepared, waited = [], []
    cands = {n: (lambda n=n: prepared.append(n)) for n in ("decode", "fused")}
    ready = {"now": False}
    monkeypatch.setattr(P.Prepared, "done", lambda self: ready["now"])
    orig_wait = P.Prepared.wait
    monkeypatch.setattr(P.Prepared, "wait", lambda self, timeout=None: waited.append(len(self)) or orig_wait(self, timeout))
    for _ in range(2):
        assert C.choose(CPU, "kf", cands, "fused", prefer="torch", interim="decode") == "decode"
    assert prepared == ["decode", "fused"] and waited == [0] and t.asked == []  # decode's kernels waited for, alone
    ready["now"] = True
    assert C.choose(CPU, "kf", cands, "fused", prefer="torch", interim="decode") == "fused"
    assert sorted(t.asked) == ["decode", "fused"]
    # no interim given: the default runs meanwhile, as before
    C.set_timer(FakeTimer({"decode": 2.0, "fused": 1.0}))
    ready["now"] = False
    assert C.choose(CPU, "kf2", cands, "fused", prefer="torch") == "fused"


@needs_async
def test_synchronous_calibration_compiles_first_then_times_at_the_first_call(store, monkeypatch):
    # a compiled model's eager first call (nodes/calibration.py) and TRITONKIT_CALIBRATION_DEFER=0
    t = FakeTimer({"comfy": 3.0, "exact": 1.0, "int8": 2.0})
    C.set_timer(t)
    C.set_deferral(True)
    prepared = []
    cands = {n: (lambda n=n: prepared.append((n, P.preparing()))) for n in CANDS}
    with C.synchronous():
        assert not C.deferring()
        assert C.choose(CPU, "ks", cands, "int8", prefer="comfy") == "exact"
    assert sorted(prepared) == [("exact", True), ("int8", True)] and sorted(t.asked) == ["comfy", "exact", "int8"]
    assert C.deferring()
    monkeypatch.setenv(C.DEFER_ENV, "0")
    assert not C.deferring()
    assert C.choose(CPU, "ks2", cands, "int8", prefer="comfy") == "exact" and len(t.asked) == 6
    # a fake clock alone (no set_deferral) neither prepares nor defers: the tests above this one
    C.set_deferral(None)
    monkeypatch.delenv(C.DEFER_ENV)
    assert not C.deferring()
    prepared.clear()
    assert C.choose(CPU, "ks3", cands, "int8", prefer="comfy") == "exact" and prepared == []


@needs_async
def test_a_stored_choice_missing_from_tritons_cache_compiles_in_the_background(store, monkeypatch):
    """A restart with the calibration stored but Triton's cache cleared: the stored choice's first call
    compiles its kernels in the background and runs ComfyUI's path (or the interim) until they are
    ready; nothing is timed again. Kernels that Triton's cache holds (settle() answers at once) run the
    stored choice at once, as before; so does a call timed at once (synchronous())."""
    t = FakeTimer({"comfy": 3.0, "exact": 1.0, "int8": 2.0, "decode": 2.0, "fused": 1.0})
    C.set_timer(t)
    assert C.choose(CPU, "ka", CANDS, "int8", prefer="comfy") == "exact"  # timed in a first process
    fp8 = {"decode": noop, "fused": noop}
    assert C.choose(CPU, "kf", fp8, "fused", prefer="torch", interim="decode") == "fused"
    asked = len(t.asked)
    C.reset()  # a new process: the choices come from the file
    C.set_deferral(True)
    prepared = []
    cands = {n: (lambda n=n: prepared.append((n, P.preparing()))) for n in CANDS}
    state = {"cached": False, "done": False}
    waits = []
    monkeypatch.setattr(P.Prepared, "settle", lambda self, timeout: waits.append(timeout) or state["cached"])
    monkeypatch.setattr(P.Prepared, "done", lambda self: state["done"])
    assert C.choose(CPU, "ka", cands, "int8", prefer="comfy") == "comfy"
    assert prepared == [("exact", True)]  # the stored choice's kernels only, started in the background
    assert C.pending(CPU, "ka") and C.COUNTERS["warmed"] == 1 and C.COUNTERS["deferred_calls"] == 1
    assert C.choose(CPU, "ka", cands, "int8", prefer="comfy") == "comfy" and len(prepared) == 1
    state["done"] = True
    assert C.choose(CPU, "ka", cands, "int8", prefer="comfy") == "exact" and not C.pending(CPU, "ka")
    assert C.choose(CPU, "ka", cands, "int8", prefer="comfy") == "exact" and len(prepared) == 1
    # below sm89 (no ComfyUI path): the interim's kernel is waited for, the stored fused linear compiles
    state["done"] = False
    fp8 = {n: (lambda n=n: prepared.append((n, P.preparing()))) for n in ("decode", "fused")}
    prepared.clear()
    assert C.choose(CPU, "kf", fp8, "fused", prefer="torch", interim="decode") == "decode"
    assert prepared == [("fused", True), ("decode", True)]
    assert waits == [C.WARM_WAIT_S, 0.0]  # once one was not in Triton's cache, the others are not waited for
    with C.synchronous():  # a compiled model's eager first call waits for them
        assert C.choose(CPU, "kf", fp8, "fused", prefer="torch", interim="decode") == "fused"
    assert not C._WARMING and len(t.asked) == asked  # nothing timed again
    # kernels in Triton's cache: the stored choice at its first call
    C.reset()
    C.set_deferral(True)
    state["cached"] = True
    prepared.clear()
    assert C.choose(CPU, "ka", cands, "int8", prefer="comfy") == "exact"
    assert prepared == [("exact", True)] and not C.pending(CPU, "ka") and C.COUNTERS["warmed"] == 0
    assert waits[-1] == C.WARM_WAIT_S
    # not deferring (TRITONKIT_CALIBRATION_DEFER=0): compiled at its first launch, nothing prepared
    C.reset()
    monkeypatch.setenv(C.DEFER_ENV, "0")
    prepared.clear()
    assert C.choose(CPU, "ka", cands, "int8", prefer="comfy") == "exact" and prepared == []


def test_default_without_timing(store, monkeypatch):
    # CPU without an injected timer: can't be timed -> the default, nothing written
    assert not C.can_time(CPU)
    assert C.choose(CPU, "k", CANDS, "int8") == "int8"
    assert not store.exists()
    # TRITONKIT_CALIBRATION=0: the default even where a timer exists
    t = FakeTimer({"comfy": 1.0, "exact": 2.0, "int8": 3.0})
    C.set_timer(t)
    monkeypatch.setenv(C.ENV_ENABLE, "0")
    assert C.choose(CPU, "k", CANDS, "exact") == "exact"
    assert t.asked == [] and not store.exists()
    with pytest.raises(ValueError, match="default"):
        C.choose(CPU, "k", CANDS, "nope")


def _second_process(store_dir: Path, key: str) -> dict:
    script = textwrap.dedent(f"""
        import json, sys, types
        pkg = types.ModuleType("tritonkit"); pkg.__path__ = [{str(REPO)!r}]; sys.modules["tritonkit"] = pkg
        from tritonkit.kernels import calibration as C
        asked = []
        C.set_timer(lambda name, fn: asked.append(name) or 1.0)
        cands = {{"comfy": lambda: None, "exact": lambda: None, "int8": lambda: None}}
        choice = C.choose("cpu", {key!r}, cands, "comfy")
        print(json.dumps({{"choice": choice, "asked": asked, "counters": C.COUNTERS}}))
    """)
    env = {**os.environ, C.ENV_DIR: str(store_dir)}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_choice_survives_a_restart_without_timing(store):
    C.set_timer(FakeTimer({"comfy": 3.0, "exact": 2.0, "int8": 0.5}))
    assert C.choose(CPU, "attention|x", CANDS, "comfy") == "int8"
    out, _ = _second_process(store, "attention|x")
    assert out["choice"] == "int8"
    assert out["asked"] == [] and out["counters"]["timed_runs"] == 0 and out["counters"]["calibrations"] == 0
    # a key the first process never measured is timed there (the fake timer answers 1.0 for all: first wins)
    out, _ = _second_process(store, "attention|other")
    assert out["asked"] == ["comfy", "exact", "int8"]


@pytest.mark.parametrize("content, words", [
    ("{not json", "not JSON"),
    (json.dumps({"format": "something-else", "version": 1, "entries": {}}), "not a TritonKit calibration file"),
    ("[1, 2, 3]", "not a TritonKit calibration file"),
    (None, "another GPU"),   # right format, another environment
])
def test_bad_files_are_ignored_with_a_log_line(store, caplog, content, words):
    C.set_timer(FakeTimer({"comfy": 3.0, "exact": 1.0, "int8": 2.0}))
    C.choose(CPU, "k", CANDS, "comfy")
    path = store_file(store)
    if content is None:
        data = json.loads(path.read_text())
        data["env"] = {**data["env"], "gpu": "NVIDIA GeForce RTX 3090", "driver": "555.42"}
        data["entries"]["k"]["choice"] = "int8"
        content = json.dumps(data)
    path.write_text(content)
    C.reset()
    t = FakeTimer({"comfy": 3.0, "exact": 1.0, "int8": 2.0})
    C.set_timer(t)
    with caplog.at_level(logging.WARNING, logger="TritonKit"):
        assert C.choose(CPU, "k", CANDS, "comfy") == "exact"   # measured again, not read from the bad file
    msgs = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
    assert len(msgs) == 1 and words in msgs[0] and str(path) in msgs[0]
    assert len(t.asked) == 3
    assert json.loads(path.read_text())["entries"]["k"]["choice"] == "exact"  # rewritten, valid


def test_writes_are_atomic(store, monkeypatch):
    C.set_timer(FakeTimer({"comfy": 3.0, "exact": 1.0, "int8": 2.0}))
    C.choose(CPU, "k1", CANDS, "comfy")
    path = store_file(store)
    before = path.read_text()

    def broken_dump(obj, f, **kw):
        f.write('{"format": "tritonkit-calib')   # half a file, then the disk fills up
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(C.json, "dump", broken_dump)
    assert C.choose(CPU, "k2", CANDS, "comfy") == "exact"  # still chosen, kept in memory
    assert path.read_text() == before                         # the old file intact
    assert [p.name for p in store.iterdir()] == [path.name]   # no temporary file left behind


def test_forced_path_env(store, monkeypatch, caplog):
    t = FakeTimer({"comfy": 3.0, "exact": 1.0, "int8": 2.0})
    C.set_timer(t)
    monkeypatch.setenv(NC.ATTN_PATH_ENV, "sdpa")
    assert NC.pick(CPU, "k", dict(CANDS), "exact", NC.ATTN_PATH_ENV, NC.ATTN_PATHS, "x") == "comfy"
    assert t.asked == []
    monkeypatch.setenv(NC.ATTN_PATH_ENV, "int8")
    with caplog.at_level(logging.WARNING, logger="TritonKit"):
        # not allowed for this call (e.g. attn_precision=fp32): calibrated among the allowed ones
        assert NC.pick(CPU, "k", {"comfy": noop, "exact": noop}, "exact", NC.ATTN_PATH_ENV, NC.ATTN_PATHS,
                       "x") == "exact"
    assert any("not possible" in r.getMessage() for r in caplog.records)


# ----------------------------------------------------------------------------- attention node

def qkv(L=32, H=2, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, L, H * D, generator=g) for _ in range(3))


def sdpa_backend(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False,
                 **kwargs):
    b, _, hd = q.shape
    dh = hd // heads
    q, k, v = (t.view(b, -1, heads, dh).transpose(1, 2) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).reshape(b, -1, heads * dh)


@pytest.fixture
def forced_cpu(monkeypatch):
    monkeypatch.setenv("TRITONKIT_FORCE_TRITON_ON_CPU", "1")


def test_attention_auto_uses_the_measured_path(store, forced_cpu):
    q, k, v = qkv()
    ov = N.make_override("auto")
    t = FakeTimer({"comfy": 0.5, "exact": 1.0, "int8": 2.0})
    C.set_timer(t)
    calls = []
    func = lambda *a, **kw: calls.append(1) or sdpa_backend(*a, **kw)  # noqa: E731
    func.__name__ = "attention_pytorch"
    out = ov(func, q, k, v, 2)
    assert sorted(t.asked) == ["comfy", "exact", "int8"]
    torch.testing.assert_close(out, sdpa_backend(q, k, v, 2))
    assert calls and N.stats()["fallback"] == 1
    # exact fastest for another shape class: our kernel serves it
    q2, k2, v2 = qkv(L=80, seed=1)
    C.set_timer(FakeTimer({"comfy": 2.0, "exact": 1.0, "int8": 3.0}))
    out = ov(func, q2, k2, v2, 2)
    torch.testing.assert_close(out, sdpa_backend(q2, k2, v2, 2), rtol=1e-4, atol=1e-4)
    assert N.stats()["served_exact"] == 1
    entries = C.stored_choices(CPU)
    assert {e["choice"] for k_, e in entries.items() if k_.startswith("attention|")} == {"comfy", "exact"}


def test_attention_auto_times_its_close_long_paths_in_bursts(store, forced_cpu):
    # the node asks for the bursts: exact and 8-bit tie alone, 8-bit wins back to back (as at WAN's class)
    q, k, v = qkv()
    slow = C.PATH_BURST_MIN_MS * 5
    t = BurstTimer({"comfy": slow * 1.5, "exact": slow, "int8": slow * 1.01},
                   {"exact": slow * 1.1, "int8": slow * 0.95})
    C.set_timer(t)
    N.make_override("auto")(sdpa_backend, q, k, v, 2)
    assert sorted(set(t.burst_asked)) == ["exact", "int8"] and N.stats()["served_int8"] == 1


def test_attention_8bit_never_picked_when_not_allowed(store, forced_cpu):
    q, k, v = qkv()
    t = FakeTimer({"comfy": 3.0, "exact": 2.0, "int8": 0.1})  # 8-bit would win on time
    C.set_timer(t)
    ov = N.make_override("auto")
    ov(sdpa_backend, q, k, v, 2, attn_precision=torch.float32)
    ov(sdpa_backend, q, k, v, 2, low_precision_attention=False)
    assert "int8" not in t.asked and N.stats()["served_int8"] == 0 and N.stats()["served_exact"] == 2
    # the exact mode never calibrates (and never runs 8-bit)
    t.asked.clear()
    N.make_override("exact")(sdpa_backend, q, k, v, 2)
    assert t.asked == [] and N.stats()["served_int8"] == 0


def test_attention_times_the_8bit_path_only_where_the_roofline_lets_it_win(store, forced_cpu, monkeypatch):
    from tritonkit.kernels import roofline as R
    asked_rates = []
    r = {}

    def rates(device, dtype):
        asked_rates.append(dtype)
        return dict(r)
    monkeypatch.setattr(R, "rates", rates)
    ov = N.make_override("auto")
    q, k, v = (t.to(torch.bfloat16) for t in qkv())
    # rates scaled to this tiny class: a matmul far faster than memory, so 32 tokens of head 16 are
    # bound by their bytes, and the 8-bit pre-pass's extra bytes cannot be won back
    r.update(matmul_tflops=1.0, copy_gbps=1.0)
    t = FakeTimer({"comfy": 0.5, "exact": 1.0, "int8": 0.1})
    C.set_timer(t)
    out = ov(sdpa_backend, q, k, v, 2)
    torch.testing.assert_close(out, sdpa_backend(q, k, v, 2))
    assert sorted(t.asked) == ["comfy", "exact"] and asked_rates == [torch.bfloat16]
    [e] = [e for k_, e in C.stored_choices(CPU).items() if k_.startswith("attention|")]
    assert e["choice"] == "comfy" and "up to 32 queries and 32 keys" in e["not_timed"]["int8"]
    # the same class's key still names the 8-bit path (a traced graph asks the same key)
    assert all(k_.endswith("comfy,exact,int8") for k_ in C.stored_choices(CPU) if k_.startswith("attention|"))
    # a matmul slow for its memory (80 tokens, bucket 128): compute-bound, the 8-bit path is timed
    r.update(matmul_tflops=1e-3, copy_gbps=1.0)
    q2, k2, v2 = (t.to(torch.bfloat16) for t in qkv(L=80, seed=1))
    t2 = FakeTimer({"comfy": 0.5, "exact": 1.0, "int8": 2.0})
    C.set_timer(t2)
    ov(sdpa_backend, q2, k2, v2, 2)
    assert sorted(t2.asked) == ["comfy", "exact", "int8"]
    # switched off: timed at every size
    monkeypatch.setenv(R.ENV, "0")
    r.update(matmul_tflops=1.0, copy_gbps=1.0)
    q3, k3, v3 = (t.to(torch.bfloat16) for t in qkv(L=8, seed=2))
    t3 = FakeTimer({"comfy": 0.5, "exact": 1.0, "int8": 2.0})
    C.set_timer(t3)
    ov(sdpa_backend, q3, k3, v3, 2)
    assert sorted(t3.asked) == ["comfy", "exact", "int8"]


def test_attention_default_without_timing(store, forced_cpu):
    """No timer on the CPU: the conservative constants (exact for a short sequence), nothing stored."""
    q, k, v = qkv()
    N.make_override("auto")(sdpa_backend, q, k, v, 2)
    assert N.stats()["served_exact"] == 1 and not store.exists()


def test_describe_shows_measured_choices(store, forced_cpu):
    C.set_timer(FakeTimer({"comfy": 0.5, "exact": 1.0, "int8": 2.0}))
    q, k, v = qkv()
    N.make_override("auto")(sdpa_backend, q, k, v, 2)

    class M:
        load_device = torch.device("cpu")

    text = N.describe("auto", M())
    assert "1 shape classes measured" in text and "-> comfy (comfy 0.500 ms, exact 1.000 ms, int8 2.000 ms)" in text
    # a class chosen by its bursts shows them too
    slow = C.PATH_BURST_MIN_MS * 2
    C.set_timer(BurstTimer({"comfy": slow * 2, "exact": slow, "int8": slow}, {"exact": slow * 1.2, "int8": slow}))
    q2, k2, v2 = qkv(L=80, seed=1)
    N.make_override("auto")(sdpa_backend, q2, k2, v2, 2)
    text = N.describe("auto", M())
    assert f"-> int8 (comfy {2 * slow:.3f} ms, exact {slow:.3f} ms, int8 {slow:.3f} ms; back to back " in text


# ----------------------------------------------------------------------------- torch.compile

class Tiny(torch.nn.Module):
    def __init__(self, ov):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)
        self.ov = ov

    def forward(self, x):
        h = self.lin(x)
        return self.ov(sdpa_backend, h, h, h, 2)


_COMPILED_SCRIPT = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
import conftest  # noqa: F401  (the tritonkit package)
from tritonkit.kernels import calibration as C
from tritonkit.nodes import attention as N
from test_calibration import FakeTimer, Tiny
torch.manual_seed(0)
model = Tiny(N.make_override("auto"))
x = torch.randn(1, 32, 32)
t = FakeTimer({"comfy": 0.5, "exact": 1.0, "int8": 2.0})
C.set_timer(t)
with torch.no_grad():
    ref = model(x)                       # the first (eager) call calibrates
    assert len(t.asked) == 3, t.asked
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # a graph break raises
    out = compiled(x)
torch.testing.assert_close(out, ref)
assert len(t.asked) == 3, t.asked        # nothing timed while tracing
print("compiled ok")
"""


def test_compiled_model_reads_stored_choices_without_graph_breaks(store):
    # In its own process, as tests/test_attention.py's custom-op test: after many Triton-interpreter
    # runs in one process, a dispatcher call of the op while Dynamo computes fake values segfaulted
    # inside torch 2.14 (seen once in this file, 2026-11-23); a fresh process has not.
    env = dict(os.environ, TRITONKIT_FORCE_TRITON_ON_CPU="1", **{C.ENV_DIR: str(store)})
    r = subprocess.run([sys.executable, "-c", _COMPILED_SCRIPT, str(Path(__file__).parent)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0 and "compiled ok" in r.stdout, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])


@pytest.fixture(scope="module")
def comfy():
    path = str(os.environ.get("TK_COMFYUI", REPO / ".comfyui"))
    if not os.path.isfile(os.path.join(path, "comfy", "patcher_extension.py")):
        pytest.skip("ComfyUI sources are not in .comfyui (scripts/setup_env.sh)")
    if path not in sys.path:
        sys.path.insert(0, path)
    import comfy.cli_args
    if not torch.cuda.is_available():
        comfy.cli_args.args.cpu = True
    import comfy.ops
    import comfy.patcher_extension
    return comfy


class Executor:
    """What ComfyUI hands an APPLY_MODEL wrapper: calls the (compiled) model."""

    def __init__(self, fn):
        self.fn = fn
        self.class_obj = self

    def __call__(self, x, t, c_concat, c_crossattn, control, transformer_options, **kwargs):
        return self.fn(x)


@pytest.mark.parametrize("compile_key", ["torch.compile", "tritonkit_compile"])  # TorchCompileModel, ours
def test_first_call_of_a_compiled_model_is_eager_and_calibrates(store, forced_cpu, comfy, compile_key):
    assert compile_key in NC.COMPILE_KEYS
    torch.manual_seed(0)
    model = Tiny(N.make_override("auto"))
    x = torch.randn(1, 32, 32)
    topts = {"wrappers": {comfy.patcher_extension.WrappersMP.APPLY_MODEL: {compile_key: [object()]}}}
    t = FakeTimer({"comfy": 0.5, "exact": 1.0, "int8": 2.0})   # the default here would be exact
    C.set_timer(t)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        ex = Executor(compiled)
        with torch.no_grad():
            ref = sdpa_backend(*(model.lin(x),) * 3, 2)
            out1 = NC.calibrated_first_call(ex, x, None, None, None, None, topts)   # eager, calibrates
            assert len(t.asked) == 3 and N.stats()["fallback"] == 1
            out2 = NC.calibrated_first_call(ex, x, None, None, None, None, topts)   # compiled, stored choice
            assert len(t.asked) == 3
            # a restart: memory forgotten, the store on disk says the signature is calibrated
            C.reset()
            C.set_timer(t)
            out3 = NC.calibrated_first_call(ex, x, None, None, None, None, topts)
            assert len(t.asked) == 3
    finally:
        torch._dynamo.reset()
    for o in (out1, out2, out3):
        torch.testing.assert_close(o, ref, rtol=1e-4, atol=1e-4)
    entries = C.stored_choices(CPU)
    [run] = [v for k_, v in entries.items() if k_.startswith("run|")]
    assert len(run["keys"]) == 1 and run["keys"][0].startswith("attention|")


# ----------------------------------------------------------------------------- fp8 linear

def test_fp8_linear_uses_the_measured_path(store, forced_cpu, comfy):
    from tritonkit.nodes import fp8_fallback as F
    g = torch.Generator().manual_seed(0)
    lin = comfy.ops.manual_cast.Linear(32, 16, dtype=torch.float8_e4m3fn)
    lin.weight = torch.nn.Parameter((torch.randn(16, 32, generator=g) * 0.2).to(torch.float8_e4m3fn),
                                    requires_grad=False)
    lin.bias = torch.nn.Parameter(torch.randn(16, generator=g), requires_grad=False)
    cfg = F.LayerConfig(name="lin", kind="linear", fused=True, allow_cpu=True, calibrate=True)
    fwd = F.make_forward(lin, cfg, None)
    F.STATS.reset()
    x4, x64 = torch.randn(4, 32, generator=g), torch.randn(64, 32, generator=g)
    ref = lambda x: torch.nn.functional.linear(x.double(), lin.weight.double(), lin.bias.double())  # noqa: E731
    t = FakeTimer({"torch": 0.1, "decode": 1.0, "fused": 2.0})
    C.set_timer(t)
    torch.testing.assert_close(fwd(x4).double(), ref(x4), rtol=1e-4, atol=1e-4)
    assert F.STATS.layers["lin"] == "torch (measured faster)" and sorted(t.asked) == ["decode", "fused", "torch"]
    t.times = {"torch": 3.0, "decode": 2.0, "fused": 1.0}
    torch.testing.assert_close(fwd(x64).double(), ref(x64), rtol=1e-4, atol=1e-4)
    assert F.STATS.layers["lin"] == "fused-linear" and len(t.asked) == 6
    fwd(x4)                                      # stored: the 4-token bucket keeps torch, nothing timed
    assert F.STATS.layers["lin"] == "torch (measured faster)" and len(t.asked) == 6
    keys = sorted(k for k in C.stored_choices(CPU) if k.startswith("fp8_linear|"))
    assert [k.split("|")[6] for k in keys] == ["M4", "M64"] and all("N16|K32" in k for k in keys)
    # forcing a path
    os.environ[NC.FP8_PATH_ENV] = "decode"
    try:
        fwd(x4)
        assert F.STATS.layers["lin"] == "decode"
    finally:
        del os.environ[NC.FP8_PATH_ENV]


def test_fp8_linear_times_the_fused_path_only_where_the_roofline_lets_it_win(store, forced_cpu, comfy, monkeypatch):
    from tritonkit.kernels import roofline as R
    from tritonkit.nodes import fp8_fallback as F
    g = torch.Generator().manual_seed(1)
    lin = comfy.ops.manual_cast.Linear(64, 48, dtype=torch.float8_e4m3fn)
    lin.weight = torch.nn.Parameter((torch.randn(48, 64, generator=g) * 0.2).to(torch.float8_e4m3fn),
                                    requires_grad=False)
    lin.bias = None
    # fused=False: the default is the decode (on the CPU a fused default would be kept: never skipped)
    cfg = F.LayerConfig(name="lin", kind="linear", fused=False, allow_cpu=True, calibrate=True)
    fwd = F.make_forward(lin, cfg, None)
    # rates scaled to this tiny layer: one FLOP per byte moved, so one token streams the weight (the
    # fused linear can gain 60 %) and 33 tokens are compute-bound (4 %)
    bounds = []

    def rates(device, dtype):
        bounds.append(dtype)
        return {"matmul_tflops": 1e-3, "copy_gbps": 1.0}
    monkeypatch.setattr(R, "rates", rates)
    t = FakeTimer({"torch": 3.0, "decode": 2.0, "fused": 1.0})
    C.set_timer(t)
    ref = lambda x: torch.nn.functional.linear(x.double(), lin.weight.double())  # noqa: E731
    x1, x64 = torch.randn(1, 64, generator=g), torch.randn(64, 64, generator=g)
    torch.testing.assert_close(fwd(x1).double(), ref(x1), rtol=1e-4, atol=1e-4)
    assert sorted(t.asked) == ["decode", "fused", "torch"] and F.STATS.layers["lin"] == "fused-linear"
    torch.testing.assert_close(fwd(x64).double(), ref(x64), rtol=1e-4, atol=1e-4)
    assert sorted(t.asked[3:]) == ["decode", "torch"] and F.STATS.layers["lin"] == "decode"
    [e] = [v for k, v in C.stored_choices(CPU).items() if "|M64|" in k]
    assert "fused" in e["not_timed"] and "from 33 tokens" in e["not_timed"]["fused"]
    assert bounds == [torch.float32, torch.float32]
    # the key still names the fused path (a traced graph asks the same key), and forcing it still works
    assert all("decode,fused,torch" in k for k in C.stored_choices(CPU) if k.startswith("fp8_linear|"))
    monkeypatch.setenv(NC.FP8_PATH_ENV, "fused")
    torch.testing.assert_close(fwd(x64).double(), ref(x64), rtol=1e-4, atol=1e-4)
    assert F.STATS.layers["lin"] == "fused-linear" and len(t.asked) == 5


def test_route_lists_the_stored_choices(store, monkeypatch):
    from tritonkit.nodes import routes
    C.set_timer(FakeTimer({"comfy": 3.0, "exact": 1.0, "int8": 2.0}))
    C.choose(CPU, "attention|k", CANDS, "comfy", what="attention head 128")
    (store / "calibration-broken.json").write_text("{oops")
    monkeypatch.setenv(NC.FP8_PATH_ENV, "fused")
    monkeypatch.delenv("TRITONKIT_COMPILE_WORKERS", raising=False)
    info = routes.calibration_info()
    assert info["dir"] == str(store) and info["timing"] is True
    assert info["forced"] == {NC.ATTN_PATH_ENV: None, NC.FP8_PATH_ENV: "fused"}
    good = [f for f in info["files"] if "entries" in f]
    bad = [f for f in info["files"] if "error" in f]
    assert len(good) == 1 and good[0]["entries"]["attention|k"]["choice"] == "exact"
    assert len(bad) == 1 and bad[0]["path"].endswith("calibration-broken.json")
    assert "calibration" in routes.ROUTES
    cw = info["compile_workers"]  # none on this CPU: the compiles run in threads
    assert cw["workers"] == 0 and cw["alive"] == 0 and "thread_compiles" in cw["counters"]
    monkeypatch.setenv("TRITONKIT_COMPILE_WORKERS", "3")
    cw = routes.calibration_info()["compile_workers"]
    assert cw["workers"] == 3 and cw["setting"] == "3"


# ----------------------------------------------------------------------------- on a GPU

def _attention_process(seed: int, L: int, H: int, body: str, env: dict) -> dict:
    """Runs ``body`` in a new process on the GPU, after a set-up that gives it ``call()``: the Attention
    node's ``auto`` on bf16 (1, L, H·128) q, k, v drawn from ``seed`` (``sdpa_backend`` as ComfyUI's
    function), and ``N``, ``C``; returns the JSON ``body`` prints last."""
    script = textwrap.dedent(f"""
        import json, sys, types, torch
        pkg = types.ModuleType("tritonkit"); pkg.__path__ = [{str(REPO)!r}]; sys.modules["tritonkit"] = pkg
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_calibration import sdpa_backend
        from tritonkit.nodes import attention as N
        from tritonkit.kernels import calibration as C
        dev = torch.device("cuda")
        g = torch.Generator(device=dev).manual_seed({seed})
        q, k, v = (torch.randn(1, {L}, {H} * 128, device=dev, generator=g, dtype=torch.bfloat16) for _ in range(3))
        def attention_pytorch(*a, **kw):  # ComfyUI's function's name: a part of the stored key
            return sdpa_backend(*a, **kw)
        call = lambda: N.make_override("auto")(attention_pytorch, q, k, v, {H})
    """) + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
def test_gpu_calibration_is_timed_once_and_reused_by_a_second_process(store):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(1, 4096, 24 * 128, device=dev, generator=g, dtype=torch.bfloat16) for _ in range(3))

    def attention_pytorch(*a, **kw):
        return sdpa_backend(*a, **kw)

    out = N.make_override("auto")(attention_pytorch, q, k, v, 24)
    torch.testing.assert_close(out.float(), sdpa_backend(q.float(), k.float(), v.float(), 24), rtol=3e-2, atol=3e-2)
    [entry] = [e for key, e in C.stored_choices(dev).items() if key.startswith("attention|")]
    assert set(entry["timings_ms"]) == {"comfy", "exact", "int8"} and all(t > 0 for t in entry["timings_ms"].values())
    assert C.COUNTERS["calibrations"] == 1
    counters = _attention_process(0, 4096, 24, """
        call()
        print(json.dumps(C.COUNTERS))
    """, {**os.environ, C.ENV_DIR: str(store)})
    assert counters["calibrations"] == 0 and counters["timed_runs"] == 0 and counters["autotunes"] == 0, counters


@pytest.mark.gpu
def test_gpu_stored_choice_with_an_empty_triton_cache_compiles_in_the_background(store, tmp_path):
    """A new process with the calibration stored (our exact kernel chosen) but an empty Triton cache:
    the first call gives ComfyUI's result while the kernel compiles in the background, nothing is
    timed, and once it is ready the calls run the exact kernel; every output is right."""
    if not P.available():
        pytest.skip("this Triton has no asynchronous compile mode: a stored choice compiles at its first launch")
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(2)
    q, k, v = (torch.randn(1, 2048, 12 * 128, device=dev, generator=g, dtype=torch.bfloat16) for _ in range(3))
    def attention_pytorch(*a, **kw):  # named as in _attention_process: the name is a part of the key
        return sdpa_backend(*a, **kw)

    N.make_override("auto")(attention_pytorch, q, k, v, 12)
    path = store_file(store)
    data = json.loads(path.read_text())
    [key] = [key for key in data["entries"] if key.startswith("attention|")]
    data["entries"][key]["choice"] = "exact"  # as a first process that measured it fastest would store it
    path.write_text(json.dumps(data))
    env = {**os.environ, C.ENV_DIR: str(store), "TRITON_CACHE_DIR": str(tmp_path / "empty-triton-cache")}
    env.pop(C.DEFER_ENV, None)  # (the GPU tests' fixture sets it for this process) the user's default: deferring
    res = _attention_process(2, 2048, 12, """
        ref = sdpa_backend(q.double(), k.double(), v.double(), 12).float()
        cos = lambda o: torch.nn.functional.cosine_similarity(o.float().flatten(), ref.flatten(), dim=0).item()
        out = [cos(call())]
        first = dict(N.stats(), warming=len(C._WARMING))
        for pend, _ in list(C._WARMING.values()):
            pend.wait(timeout=600)
        out += [cos(call()), cos(call())]
        print(json.dumps({"first": first, "then": N.stats(), "cos": out, "counters": C.COUNTERS}))
    """, env)
    assert res["first"]["fallback"] == 1 and res["first"]["warming"] == 1, res  # ComfyUI's path meanwhile
    assert res["then"]["served_exact"] == 2, res  # the stored choice once its kernel is ready
    assert res["counters"]["warmed"] == 1 and res["counters"]["calibrations"] == 0, res
    assert res["counters"]["timed_runs"] == 0 and res["counters"]["autotunes"] == 0, res
    assert all(c > 0.9999 for c in res["cos"]), res


@pytest.mark.gpu
def test_gpu_deferred_calibration_runs_comfyuis_path_until_the_candidates_compiled(store, monkeypatch):
    """An eager model's new shape class: the first call starts the candidates' compiles in the
    background and gives ComfyUI's result; once they are done, the next call times all three paths
    and stores the choice; every call's output is right."""
    monkeypatch.delenv(C.DEFER_ENV, raising=False)
    if not C.deferring():
        pytest.skip("this Triton has no asynchronous compile mode: the calibration times at the first call")
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    q, k, v = (torch.randn(1, 3000, 20 * 128, device=dev, generator=g, dtype=torch.bfloat16) for _ in range(3))
    ref = sdpa_backend(q.double(), k.double(), v.double(), 20).float()
    override = N.make_override("auto")

    def call():
        return override(lambda *a, **kw: sdpa_backend(*a, **kw), q, k, v, 20)

    cos = lambda o: torch.nn.functional.cosine_similarity(o.float().flatten(), ref.flatten(), dim=0).item()  # noqa: E731
    out = call()
    # prepared: the calibration's candidates (with their kernels' block configs); ComfyUI's path ran
    assert cos(out) > 0.9999 and C.COUNTERS["prepared"] >= 1 and C.COUNTERS["calibrations"] == 0
    [pending] = list(C._PENDING.values())  # (no compile at all where earlier tests compiled these kernels)
    assert not [key for key in C.stored_choices(dev) if key.startswith("attention|")]
    pending.wait(timeout=600)
    out = call()
    [entry] = [e for key, e in C.stored_choices(dev).items() if key.startswith("attention|")]
    assert set(entry["timings_ms"]) == {"comfy", "exact", "int8"}, entry
    assert C.COUNTERS["calibrations"] == 1 and not C._PENDING
    tol = 0.999 if entry["choice"] == "int8" else 0.9999
    assert cos(out) > tol and cos(call()) > tol


def test_store_folder(store, monkeypatch, tmp_path):
    assert C.store_dir() == str(store)                       # TRITONKIT_CALIBRATION_DIR wins
    monkeypatch.delenv(C.ENV_DIR)
    monkeypatch.setattr(C, "_base_dir", lambda: str(tmp_path / "user" / "tritonkit"))  # what the nodes set
    assert C.store_dir() == str(tmp_path / "user" / "tritonkit")
    monkeypatch.setattr(C, "_base_dir", None)
    monkeypatch.setattr(C.sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", r"C:\Users\me\AppData\Local")
    assert C.store_dir() == os.path.join(r"C:\Users\me\AppData\Local", "tk", "calibration")  # short, off %TEMP%


@pytest.mark.gpu
def test_cuda_timer_measures_the_gpu_not_the_hosts_latency():
    # 2 ms of host Python before a microsecond kernel: timed from an idle GPU that is 2 ms; the
    # timer queues the call behind a GPU spin and measures the kernel
    import time as _time
    x = torch.zeros(4096, device="cuda")

    def host_heavy():
        _time.sleep(0.002)
        x.add_(1.0)

    ms = C.cuda_timer(host_heavy)
    assert 0 < ms < 0.5, ms
    big = torch.randn(4096, 4096, device="cuda")
    assert C.cuda_timer(lambda: big @ big) > 0.01  # real GPU work still counts
    alone = C.cuda_timer(lambda: big @ big)
    assert 0.5 * alone < C.burst_ms(lambda: big @ big, 8, untimed=4) < 2 * alone  # back to back: the same work


class _FakeEvent:
    """torch.cuda.Event on the host clock, for the timer's logic on a CPU-only machine."""
    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        import time as _time
        self.t = _time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


@pytest.fixture
def fake_cuda(monkeypatch):
    """CUDA's pieces of the timer stood in for (host-clock events, no synchronisation, no L2 buffer)."""
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(C, "_l2_flush_buffer", lambda: torch.empty(16))


def test_interleaved_timer_rounds_and_failures(monkeypatch, fake_cuda):
    # the GPU timer's logic with CUDA's pieces stood in for: every candidate warmed first, then the
    # timed calls in rounds A B C A B C; a candidate that raises is reported, the others timed
    monkeypatch.setattr(C, "_sleep_cycles_per_ms", lambda dev: None)
    calls, warmed = [], []
    boom = RuntimeError("out of resources")

    def cand(name, fail_at=None):
        def fn():
            calls.append(name)
            if fail_at is not None and calls.count(name) == fail_at:
                raise boom
        return fn
    fns = {"a": cand("a"), "b": cand("b"), "w": cand("w", fail_at=1), "t": cand("t", fail_at=3)}
    res = C.cuda_timer_interleaved(fns, warmup=2, reps=3, on_warm=warmed.append)
    assert warmed == ["a", "b", "w", "t"]
    assert calls[:7] == ["a", "a", "b", "b", "w", "t", "t"]   # warm-ups (w failed in its first)
    assert calls[7:] == ["a", "b", "t", "a", "b", "a", "b"]    # rounds; t raised in its first timed call
    assert res["w"] is boom and res["t"] is boom
    assert all(isinstance(res[n], float) and res[n] >= 0 for n in "ab")
    assert C.cuda_timer(cand("x"), warmup=1, reps=3) >= 0
    with pytest.raises(RuntimeError):
        C.cuda_timer(cand("y", fail_at=1))


def _driven_clock(monkeypatch):
    """A clock the test advances, read by the timer's host side and by the stand-in CUDA events
    alike: the timer's logic without a busy CI machine's scheduling in its figures."""
    import types
    now = [0.0]

    class ClockEvent(_FakeEvent):
        def record(self):
            self.t = now[0]
    monkeypatch.setattr(torch.cuda, "Event", ClockEvent)
    monkeypatch.setattr(C, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    return now


def test_a_long_candidate_is_timed_fewer_rounds(monkeypatch, fake_cuda):
    # LONG_REPS timings of LONG_MS or more are enough for it; the short one gets every round
    now = _driven_clock(monkeypatch)
    monkeypatch.setattr(C, "_sleep_cycles_per_ms", lambda dev: None)
    monkeypatch.setattr(C, "LONG_MS", 1.0)
    calls = []

    def cand(name, ms):
        def fn():
            calls.append(name)
            now[0] += ms / 1e3
        return fn
    res = C.cuda_timer_interleaved({"long": cand("long", 3.0), "short": cand("short", 0.05)}, warmup=1, reps=7)
    assert calls.count("long") == 1 + C.LONG_REPS and calls.count("short") == 1 + 7
    assert res["long"] == pytest.approx(3.0) and res["short"] == pytest.approx(0.05)


def _queued_clock(monkeypatch):
    """A clock the test drives, with a GPU queue: a call takes its host time at once and leaves its GPU time
    queued (``drain`` runs it), which a synchronisation waits for and an event recorded after it lands behind.
    Returns (now, queued, drain)."""
    import types
    now, queued = [0.0], [0.0]

    def drain(*a):
        now[0] += queued[0]
        queued[0] = 0.0

    class QueueEvent(_FakeEvent):
        def record(self):
            self.t = now[0] + queued[0]

        def synchronize(self):
            drain()
    monkeypatch.setattr(torch.cuda, "Event", QueueEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", drain)
    monkeypatch.setattr(C, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    return now, queued, drain


def test_a_call_of_single_ms_is_warmed_once_and_timed_once(monkeypatch, fake_cuda):
    now, queued, drain = _queued_clock(monkeypatch)
    monkeypatch.setattr(C, "_sleep_cycles_per_ms", lambda dev: None)
    calls = []

    def cand(name, gpu_ms, host_ms=0.1, first_host_ms=None):
        def fn():
            calls.append(name)
            h = first_host_ms if first_host_ms is not None and calls.count(name) == 1 else host_ms
            drain()  # the host's work before the launch (a block-config tuning) waits for the GPU too
            now[0] += h / 1e3
            queued[0] += gpu_ms / 1e3
        return fn
    gpu = {"wan": 30.0, "tuned": 33.0, "mid": 5.0, "short": 0.05}
    fns = {"wan": cand("wan", 30.0), "tuned": cand("tuned", 33.0, first_host_ms=500.0),
           "mid": cand("mid", 5.0), "short": cand("short", 0.05)}
    res = C.cuda_timer_interleaved(fns, warmup=2, reps=7)
    # wan: one warm-up (its GPU time outlasted its issue), one timing; tuned: its first call's host side
    # (a tuning) outlasted its GPU time, so it is warmed again, then timed once; mid: LONG_REPS; short: all
    assert [calls.count(n) for n in ("wan", "tuned", "mid", "short")] == [1 + 1, 2 + 1, 2 + C.LONG_REPS, 2 + 7]
    for n, ms in gpu.items():
        assert res[n] == pytest.approx(ms + 0.1, rel=1e-6)
    assert C.SINGLE_MS > C.LONG_MS


def test_light_warm_ups_stand_in_for_whole_calls(monkeypatch, fake_cuda):
    # where a candidate has a light call (its launches on a few programs), the warm-ups run that, twice
    # even for a call of SINGLE_MS or more, and the host time they measure sets the spin; the whole
    # call runs only to be timed (once at SINGLE_MS, every round when short)
    now, queued, _ = _queued_clock(monkeypatch)
    spins = []
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: spins.append(cycles), raising=False)
    monkeypatch.setattr(C, "_sleep_cycles_per_ms", lambda dev: 1000.0)
    calls = []

    def cand(name, gpu_ms, host_ms=0.2):
        def fn():
            calls.append(name)
            now[0] += host_ms / 1e3
            queued[0] += gpu_ms / 1e3
        return fn
    fns = {"long": cand("long", 30.0), "short": cand("short", 0.05), "plain": cand("plain", 0.05)}
    light = {"long": cand("long-light", 0.01), "short": cand("short-light", 0.01)}
    warmed, s0 = [], C.COUNTERS["stalled_timings"]
    res = C.cuda_timer_interleaved(fns, warmup=2, reps=3, on_warm=warmed.append, light=light)
    assert calls[:6] == ["long-light", "long-light", "short-light", "short-light", "plain", "plain"]
    assert warmed == ["long", "short", "plain"]
    assert calls[6:] == ["long", "short", "plain"] + ["short", "plain"] * 2
    assert res["long"] == pytest.approx(30.2) and res["short"] == pytest.approx(0.25)
    assert spins[0] == pytest.approx((2 * 0.2 + 0.05) * 1000, abs=1)  # from the light call's host time
    assert C.COUNTERS["stalled_timings"] == s0


def test_a_burst_times_only_its_calls_after_the_untimed_ones(monkeypatch, fake_cuda):
    now = _driven_clock(monkeypatch)
    calls = []

    def fn():  # slower once the GPU has been loaded for a while (its clocks drop at the power cap)
        calls.append(1)
        now[0] += (1.0 if len(calls) <= 3 else 2.0) / 1e3
    assert C.burst_ms(fn, 6, untimed=3) == pytest.approx(2.0) and len(calls) == 6
    calls.clear()
    assert C.burst_ms(fn, 4) == pytest.approx((3 * 1.0 + 2.0) / 4)


def test_a_timed_call_held_up_on_the_host_is_timed_again(monkeypatch, fake_cuda):
    # the GPU spin ahead of a call lasts twice its host time; a call whose host side took longer (a
    # background compile held the GIL) let the GPU wait inside the timing: it is timed again.
    # On a clock the test drives: on the real one a busy CI machine held up an ordinary
    # 10-microsecond call past its 50-microsecond spin, and counted a third stall.
    now = _driven_clock(monkeypatch)
    spins = []
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: spins.append(cycles), raising=False)
    monkeypatch.setattr(C, "_sleep_cycles_per_ms", lambda dev: 1000.0)
    calls = []

    def fn():
        calls.append(1)
        # warm-up 1, timed 1 ok (call 2), then two stalled calls
        now[0] += 0.05 if len(calls) in (3, 4) else 1e-5
    s0 = C.COUNTERS["stalled_timings"]
    res = C.cuda_timer_interleaved({"f": fn}, warmup=1, reps=3)
    assert C.COUNTERS["stalled_timings"] - s0 == 2 and len(calls) == 1 + 3 + 2
    assert res["f"] == pytest.approx(0.01)  # the stalled timings (50 ms) are not in the median
    # a stalled call is timed again behind a spin that covers twice its held-up issue (capped); the
    # next round starts from the short spin
    assert spins[0] == spins[1] == spins[4] < 1000 and spins[2] == spins[3] == int(C.LEAD_MAX_MS * 1000)


def test_the_models_queued_gpu_work_is_not_the_calibrations_time(store, monkeypatch, fake_cuda):
    """A class met at the end of a forward finds the GPU still running the model's queued work. That wait
    happens before the calibration's clock starts, not in its ``took_s`` (HunyuanVideo's and WAN's last
    Linear at 32k tokens counted 0.35-0.54 s of it, for timings of 0.06 ms a call); the candidates are
    timed and chosen as before."""
    import random
    import time
    drain = random.uniform(0.2, 0.3)
    syncs = []

    def synchronize(*a):
        if not syncs:  # the first: the forward's queued work
            time.sleep(drain)
        syncs.append(time.perf_counter())
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(C, "can_time", lambda device: True)
    monkeypatch.setattr(C, "_sleep_cycles_per_ms", lambda dev: None)
    slow, fast = random.uniform(4e-3, 6e-3), random.uniform(0.5e-3, 1e-3)
    calls = []
    cands = {"torch": lambda: calls.append("torch") or time.sleep(slow),
             "decode": lambda: calls.append("decode") or time.sleep(fast)}
    t0 = time.perf_counter()
    with C.synchronous():
        choice = C.choose(CPU, "fp8_linear|N64|K3072|M32768", cands, "torch", prefer="torch")
    wall = time.perf_counter() - t0
    entry = C.stored_choices(CPU)["fp8_linear|N64|K3072|M32768"]
    assert choice == "decode" and set(calls) == {"torch", "decode"}
    assert entry["timings_ms"]["decode"] < entry["timings_ms"]["torch"]
    assert wall >= drain and entry["took_s"] < wall - drain + 0.05 and entry["took_s"] < drain
    assert len(syncs) > 1  # the timer's own synchronisations came after the drain
