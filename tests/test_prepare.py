"""kernels/prepare.py on the CPU: a preparing run turns the pack's kernel launches into compiles
inside Triton's asynchronous compile mode and restores both afterwards, a candidate that raises is
noted and not raised, and readiness follows the compiles' futures. (The compiles themselves need a
GPU target: tests/test_calibration.py's GPU test runs a real deferred calibration.)"""
from __future__ import annotations

from concurrent.futures import Future

import pytest

from tritonkit.kernels import prepare as P
from tritonkit.kernels import runtime

needs_async = pytest.mark.skipif(not P.available(), reason="this Triton has no asynchronous compile mode (3.4+)")


class FakeKernel:
    """What runtime.launch sees of a JIT kernel: ``kernel[grid](...)`` runs, ``run(warmup=True)`` compiles."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *a, **kw: self.calls.append(("launch", grid, a, kw))

    def run(self, *a, grid, warmup, **kw):
        self.calls.append(("warmup" if warmup else "run", grid, a, kw))


def test_launch_runs_normally_and_only_compiles_while_preparing():
    k = FakeKernel()
    runtime.launch(k, (4,), 1, 2, BLOCK=8)
    runtime.launch(k, (4,), 1, 2, BLOCK=8, warmup=True)
    got = []
    tok = runtime.PREPARING.set(got)
    try:
        runtime.launch(k, (2,), 3, BLOCK=16)
    finally:
        runtime.PREPARING.reset(tok)
    assert k.calls == [("launch", (4,), (1, 2), {"BLOCK": 8}), ("warmup", (4,), (1, 2), {"BLOCK": 8}),
                       ("warmup", (2,), (3,), {"BLOCK": 16})]
    assert got == [None]  # what the compile gave (FakeKernel.run returns nothing), for the readiness check


def test_an_interpreted_kernel_always_runs():
    class Interpreted:  # runtime.Serialized: no compile step, only kernel[grid](...)
        calls = []

        def __getitem__(self, grid):
            return lambda *a, **kw: self.calls.append(grid)
    k = Interpreted()
    tok = runtime.PREPARING.set([])
    try:
        runtime.launch(k, (3,), 1)
    finally:
        runtime.PREPARING.reset(tok)
    assert k.calls == [(3,)]


@needs_async
def test_prepare_runs_each_candidate_inside_triton_async_mode_and_restores_it():
    from triton.runtime import _async_compile as ac
    seen = {}

    def cand(name):
        def fn():
            seen[name] = (P.preparing(), ac.active_mode.get())
        return fn

    def broken():
        raise RuntimeError("no such head size")

    p = P.prepare({"a": cand("a"), "b": cand("b"), "bad": broken})
    assert set(seen) == {"a", "b"}
    assert all(flag for flag, _ in seen.values())
    modes = {id(m) for _, m in seen.values()}
    assert len(modes) == 1 and None not in (m for _, m in seen.values())
    P.prepare({"c": cand("c")})
    assert id(seen["c"][1]) in modes  # one mode for every preparing run: a compile in flight is shared
    assert not P.preparing() and ac.active_mode.get() is None             # both restored
    assert list(p.failed) == ["bad"] and "head size" in str(p.failed["bad"])
    assert len(p) == 0 and p.done()                                        # nothing was compiled


def test_compiles_already_in_flight_count_for_readiness():
    # a launch that finds its kernel compiling for another shape class gets that compile's future
    class FutureKernel:
        def __init__(self, fut):
            self.future = fut

        def __getattr__(self, name):  # as Triton's: anything else waits for the compile
            raise AssertionError("blocked on the compile")
    mine, theirs = Future(), Future()
    futs = P._futures([FutureKernel(theirs), object(), None, FutureKernel(mine), FutureKernel(theirs)])
    assert futs == [theirs, mine]


def test_finalize_asks_every_compile_in_flight_for_its_kernel():
    # Triton 3.6 caches a kernel compiled in the background only when its future's result is asked for
    class FutureKernel:
        def __init__(self):
            self.asked = 0
            self.future = Future()

        def result(self):
            self.asked += 1
            if self.asked == 1 and self is broken:
                raise RuntimeError("compile failed")

    ok, broken = FutureKernel(), FutureKernel()
    p = P.Prepared([ok.future, broken.future], {}, [ok, object(), broken])
    assert p.kernels == [ok, broken]
    ok.future.set_result(1)
    broken.future.set_result(1)
    p.wait()
    assert ok.asked == 1 and broken.asked == 1


def test_done_follows_the_futures():
    f1, f2 = Future(), Future()
    p = P.Prepared([f1, f2], {})
    assert not p.done()
    f1.set_result("kernel")
    assert not p.done()
    f2.set_exception(RuntimeError("ptxas failed"))  # a failed compile is done too: its timed run fails
    assert p.done()
    p.wait()  # never raises


def test_settle_waits_at_most_its_timeout_for_the_futures():
    import threading
    import time
    f1, f2 = Future(), Future()
    p = P.Prepared([f1, f2], {})
    f1.set_result("kernel")
    t0 = time.monotonic()
    assert not p.settle(0.02) and time.monotonic() - t0 >= 0.02  # one still compiling
    threading.Timer(0.01, f2.set_result, ("kernel",)).start()  # a kernel from Triton's cache: a file read
    assert p.settle(5.0) and p.done()
    assert P.Prepared([], {}).settle(0.0)  # nothing to compile: every kernel was loaded already


@needs_async
def test_busy_while_any_prepared_compile_runs(monkeypatch):
    # every prepare()'s compiles count, whichever shape class started them; done ones are forgotten
    f1, f2 = Future(), Future()
    futs = iter([[f1], [f2]])
    monkeypatch.setattr(P, "_futures", lambda compiled: next(futs))
    assert not P.busy()
    a, b = P.prepare({"a": lambda: None}), P.prepare({"b": lambda: None})
    assert P.busy()
    f1.set_result("kernel")
    assert a.done() and P.busy()        # a's compile done, b's still runs
    f2.set_exception(RuntimeError("ptxas failed"))
    assert b.done() and not P.busy() and P._in_flight == []


def test_unavailable_triton_prepares_nothing(monkeypatch):
    monkeypatch.setattr(P, "_async_module", lambda: None)
    ran = []
    p = P.prepare({"a": lambda: ran.append(1)})
    assert not P.available() and ran == [] and p.done() and len(p) == 0


@pytest.mark.gpu
def test_gpu_a_preparing_run_compiles_and_launches_nothing():
    import torch
    from tritonkit.kernels import fp8
    if not P.available():
        pytest.skip("this Triton has no asynchronous compile mode (3.4+)")
    x = (torch.randn(3, 1000, device="cuda") * 4).to(torch.float8_e4m3fn)
    scale = torch.rand(3, device="cuda") + 0.5
    out = torch.full((3, 1000), float("nan"), device="cuda", dtype=torch.float16)
    p = P.prepare({"decode": lambda: fp8.decode(x, torch.float16, scale=scale, out=out)})
    p.wait(timeout=300)
    torch.cuda.synchronize()
    assert not p.failed and out.isnan().all(), "the preparing run launched the kernel"
    fp8.decode(x, torch.float16, scale=scale, out=out)  # a normal launch, on what the preparing run compiled
    torch.testing.assert_close(out, fp8.decode_reference(x, torch.float16, scale=scale), rtol=0, atol=0)



def test_ready_prepares_a_key_once_and_answers_from_its_compiles(monkeypatch):
    """kernels/prepare.ready: a first call prepares the key's kernels; ready at once where they load
    within SETTLE_S, else False (another path runs) until their compiles are done, then True for good
    (finalized first). A preparing run that raised, or no asynchronous compiles: True."""
    made = []

    class FakePrepared:
        def __init__(self, futures, failed=None):
            self.futures, self.failed, self.waited = futures, failed or {}, 0

        def settle(self, timeout):
            return self.done()

        def done(self):
            return all(f.done() for f in self.futures)

        def wait(self):
            self.waited += 1

    pending = Future()

    def fake_prepare(fns):
        assert list(fns) == ["call"]
        fns["call"]()
        made.append(FakePrepared([pending]) if len(made) == 0 else FakePrepared([], {"call": ValueError("x")}))
        return made[-1]
    monkeypatch.setattr(P, "available", lambda: True)
    monkeypatch.setattr(P, "prepare", fake_prepare)
    monkeypatch.setattr(P, "_READY", {})
    ran = []
    assert P.ready("a", lambda: ran.append("a")) is False and ran == ["a"]
    assert P.ready("a", lambda: ran.append("again")) is False and ran == ["a"] and len(made) == 1
    pending.set_result(None)
    assert P.ready("a", lambda: ran.append("again")) is True and made[0].waited == 1
    assert P.ready("a", lambda: ran.append("again")) is True and made[0].waited == 1 and len(made) == 1
    assert P.known_ready("a") and not P.known_ready("b")
    assert P.ready("b", lambda: ran.append("b")) is True and made[1].waited == 1  # it raised: the launch shows it
    monkeypatch.setattr(P, "available", lambda: False)
    assert P.ready("c", lambda: ran.append("c")) is True and ran == ["a", "b"]
