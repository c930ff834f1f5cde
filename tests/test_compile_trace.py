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
