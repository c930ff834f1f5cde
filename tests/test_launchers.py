"""kernels/launchers.py: a background compile builds its kernel's launcher too, once per signature, through
Triton's own launcher class; a failure there is left to Triton's first launch. On the CPU with a stand-in
driver (Triton's driver needs a GPU); on a GPU, a kernel prebuilt here launches without a C build in the
launching thread."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from tritonkit.kernels import compile_pool as CP
from tritonkit.kernels import launchers as L

triton = pytest.importorskip("triton")


def kernel(sig, meta=None):
    return SimpleNamespace(src=SimpleNamespace(signature=sig), metadata=SimpleNamespace(tensordesc_meta=meta))


@pytest.fixture
def driver(monkeypatch):
    import triton.runtime as tr
    built = []

    class Launcher:
        def __init__(self, src, metadata):
            if getattr(src, "fail", False):
                raise RuntimeError("no C compiler")
            built.append((src, threading.current_thread().name))

    monkeypatch.setattr(tr, "driver", SimpleNamespace(active=SimpleNamespace(launcher_cls=Launcher)))
    monkeypatch.setattr(L, "_seen", set())
    for k in L.COUNTERS:
        monkeypatch.setitem(L.COUNTERS, k, 0)
    return built


def test_one_launcher_per_signature_and_failures_are_left_to_triton(driver):
    a, a2 = kernel({"x": "*fp16", "n": "i32", "B": "constexpr"}), kernel({"x": "*fp16", "n": "i32", "B": "constexpr"})
    b = kernel({"x": "*bf16", "n": "i32", "B": "constexpr"})
    assert L.prebuild(a) is True and L.prebuild(a2) is False and L.prebuild(b) is True
    assert [s for s, _ in driver] == [a.src, b.src] and L.COUNTERS["launchers_built"] == 2
    # another tensor-descriptor layout is another launcher
    assert L.prebuild(kernel({"x": "*fp16", "n": "i32", "B": "constexpr"}, meta=[{"block": [64, 64]}])) is True
    bad = kernel({"y": "*fp32"})
    bad.src.fail = True
    assert L.prebuild(bad) is False and L.COUNTERS["launchers_built"] == 3
    assert L.prebuild(SimpleNamespace()) is False and L.prebuild(None) is False


def test_turned_off_nothing_is_built(driver, monkeypatch):
    monkeypatch.setenv(L.ENV, "0")
    assert L.prebuild(kernel({"x": "*fp16"})) is False and driver == []


def test_the_routing_executor_builds_the_launcher_in_its_thread(driver, monkeypatch):
    monkeypatch.delenv(CP.WORKERS_ENV, raising=False)
    monkeypatch.setattr(CP, "_pool", None)
    k = kernel({"x": "*fp32"})
    ex = CP.RoutingExecutor(1)
    try:
        assert ex.submit(lambda: k).result(timeout=30) is k
        assert ex.submit(lambda: kernel({"x": "*fp32"})).result(timeout=30) is not None  # same signature
    finally:
        ex.shutdown()
    assert [s for s, _ in driver] == [k.src] and driver[0][1].startswith("tritonkit-prepare")


@pytest.mark.gpu
def test_a_prebuilt_kernel_launches_without_a_c_build_in_its_thread(tmp_path, monkeypatch):
    import torch
    import triton.runtime.build as tb
    from triton import knobs

    from tritonkit.kernels import vector_add
    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path / "cache"))  # nothing built before
    monkeypatch.setattr(L, "_seen", set())
    builds = []
    real = tb._build

    def build(name, *a, **kw):  # the launchers' builds, by thread (Triton's driver builds a helper module too)
        if name == "__triton_launcher":
            builds.append(threading.current_thread().name)
        return real(name, *a, **kw)
    monkeypatch.setattr(tb, "_build", build)
    jit = vector_add.add_kernel
    n = vector_add.BLOCK_SIZE
    x = torch.randn(n, device="cuda")
    out = torch.full_like(x, float("nan"))
    # compiled as a launch would, not launched (no launcher yet), then its launcher built in another thread
    ck = jit.warmup(x, x, out, n, BLOCK_SIZE=n, grid=(1,))
    t = threading.Thread(target=L.prebuild, args=(ck,), name="bg")
    t.start()
    t.join()
    ahead = list(builds)
    jit[(1,)](x, x, out, n, BLOCK_SIZE=n)  # the first launch: Triton's own launcher, from its cache
    torch.cuda.synchronize()
    assert torch.equal(out, x + x)
    assert "MainThread" not in builds[len(ahead):], (ahead, builds)
    assert all(b == "bg" for b in ahead)


def test_triton_s_key_is_computed_ahead_where_a_gpu_is_there(monkeypatch):
    import torch
    import triton.runtime.cache as tc
    calls = []
    monkeypatch.setattr(tc, "triton_key", lambda: calls.append(threading.current_thread().name) or "key")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert L.warm_key() is False and calls == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert L.warm_key() is True and len(calls) == 1
    monkeypatch.setenv(L.KEY_ENV, "0")
    assert L.warm_key() is False and len(calls) == 1
    monkeypatch.delenv(L.KEY_ENV)
    L.warm_key_in_background()
    for _ in range(500):
        if len(calls) == 2:
            break
        threading.Event().wait(0.01)
    assert calls[1] == "tritonkit-triton-key"


def test_comfyui_s_start_computes_triton_s_key_in_the_background(monkeypatch):
    started = []
    monkeypatch.setattr(L, "warm_key_in_background", lambda: started.append(1))
    monkeypatch.setenv(CP.WORKERS_ENV, "0")
    assert CP.start_at_launch(background=True) is False and started == [1]
    assert CP.start_at_launch() is False and started == [1]
