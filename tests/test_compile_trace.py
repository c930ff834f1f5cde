"""bench/compile_trace.py on CPU: Triton compiles for a GPU target without a GPU, so the tracer's hit /
miss records, its ptxas column and its several-keys listing are checked on real compiles."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from compile_utils import compile_for

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))


@pytest.fixture
def trace(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    import compile_trace
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    if not compile_trace.install():
        pytest.skip("this Triton has no compilation listener")
    yield compile_trace
    compile_trace.uninstall()


def test_records_misses_hits_and_keys(trace, tmp_path):
    from tritonkit.kernels import vector_add
    import triton
    kernel, sig, consts = vector_add.COMPILE_SPECS[0]
    compile_for(kernel, sig, consts, 86)
    compile_for(kernel, sig, consts, 86)   # Triton's cache: a hit
    compile_for(kernel, sig, consts, 80)   # another target: the same kernel under a second key
    recs = trace.records()
    assert [r["hit"] for r in recs] == [False, True, False], recs
    assert {r["name"] for r in recs} == {kernel.__name__} and {r["ptxas"] for r in recs} == {"bundled"}
    s = trace.summary(recs, str(tmp_path / "triton"))
    assert (s["compiles"], s["hits"], s["misses"], s["inductor_misses"]) == (3, 1, 2, 0), s
    assert s["miss_s"] > 0 and s["names_under_several_keys"] == [(kernel.__name__, 2)], s
    # one after the other here: the wall seconds with a miss compiling are the misses' own seconds
    assert s["miss_busy_s"] == pytest.approx(sum(r["t1"] - r["t0"] for r in recs if r["hit"] is False), abs=0.02)
    assert s["misses_by_name"] == {kernel.__name__: (2, pytest.approx(s["miss_s"], abs=0.02))}, s
    trace.uninstall()
    assert trace.records() == [] and triton.compile.__module__ == "triton.compiler.compiler"


def test_busy_seconds_count_overlaps_once():
    import compile_trace
    recs = [{"t0": 0.0, "t1": 2.0}, {"t0": 1.0, "t1": 3.0}, {"t0": 5.0, "t1": 6.0}, {"t0": 5.5, "t1": 5.8}]
    assert compile_trace.busy_s(recs) == pytest.approx(4.0)
    assert compile_trace.busy_s([]) == 0.0


def test_timeline_counts_misses_from_the_first_call():
    import compile_trace
    miss = lambda n, t0, t1: {"name": n, "hit": False, "s": t1 - t0, "t0": t0, "t1": t1, "ptxas": "bundled"}  # noqa: E731
    recs = [miss("a", 10.5, 11.2), miss("b", 10.6, 12.9), {**miss("c", 11.0, 11.01), "hit": True}, miss("d", 12.1, 13.4)]
    t = compile_trace.summary(recs, origin=10.0, marks=(11.5, 13.0))["timeline"]
    assert (t["first_start_s"], t["last_end_s"]) == (0.5, 3.4)
    assert t["running_at"] == [[1.5, 1], [3.0, 1]]       # b at 1.5 s (a done, d not yet), d at 3.0 s
    assert t["started_by_s"] == [[1.0, 2, 0], [2.0, 2, 1], [3.0, 3, 2], [4.0, 3, 3]]
    assert "timeline" not in compile_trace.summary(recs)  # no origin: no timeline


def test_c_builds_are_counted_by_thread_and_timed_from_the_first_call(trace):
    import triton.runtime.build as tb
    if trace._build_saved is None:
        pytest.skip("this Triton has no triton.runtime.build._build")
    assert tb._build.__name__ == "_build" and tb._build is not trace._build_saved  # wrapped while installed
    b = [{"name": "__triton_launcher", "s": 0.3, "thread": "MainThread", "t0": 11.0},
         {"name": "cuda_utils", "s": 0.2, "thread": "MainThread", "t0": 9.0},
         {"name": "__triton_launcher", "s": 0.4, "thread": "tritonkit-prepare_0", "t0": 10.5}]
    c = trace.summary([], origin=10.0, builds=b)["c_builds"]
    assert (c["main_thread"], c["main_thread_s"], c["other_threads"], c["other_threads_s"]) == (2, 0.5, 1, 0.4)
    assert c["main_thread_at"] == [["__triton_launcher", 1.0, 0.3], ["cuda_utils", -1.0, 0.2]]
    assert "c_builds" not in trace.summary([])  # no build records given: nothing said
    saved = trace._build_saved
    trace.uninstall()
    assert tb._build is saved and trace.builds() == []
