"""kernels/compile_pool.py on the CPU: a compile that Triton's asynchronous mode submits is done by a
worker process into Triton's cache, and the thread's own compile only loads it (the same cubin as a
compile here); what a worker can't do (a kernel outside the pack, a dead worker, workers off) the
thread compiles, as before. Targets are GPU architectures: Triton compiles them without a GPU."""
from __future__ import annotations

import json
import os
import time

import pytest

from tritonkit.kernels import compile_pool as CP
from tritonkit.kernels import fp8

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(not hasattr(getattr(triton, "knobs", None), "cache"),
                                reason="this Triton has no knobs (3.4+): the pack compiles in threads")


def _tritons_closure(jit, cc: int, **options):
    """What JITFunction._do_compile hands the asynchronous mode's executor: a closure over the
    kernel, its ASTSource, the target, the parsed options and the cache's environment."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    spec = next(s for s in fp8.COMPILE_SPECS if s[0] is jit) if any(s[0] is jit for s in fp8.COMPILE_SPECS) else None
    sig, consts = (spec[1], spec[2]) if spec else options.pop("spec")
    self, src, target = jit, ASTSource(jit, sig, consts), GPUTarget("cuda", cc, 32)
    options = make_backend(target).parse_options({"num_warps": 4, **options})
    env_vars = get_cache_invalidating_env_vars()

    def async_compile():  # Triton's calls self.compile, which is triton.compile once the kernel has run
        return getattr(self, "compile", triton.compile)(src, target=target, options=options.__dict__,
                                                         _env_vars=env_vars)
    return async_compile


@pytest.fixture
def pool(monkeypatch, tmp_path):
    """One fresh worker, Triton's cache in a new folder, ASTSource.make_ir counted (it runs only on a
    cache miss: a compile in this process)."""
    from triton.compiler import compiler as tc
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    monkeypatch.setenv(CP.WORKERS_ENV, "1")
    monkeypatch.setattr(CP, "_pool", None)
    made = []
    real = tc.ASTSource.make_ir
    monkeypatch.setattr(tc.ASTSource, "make_ir", lambda self, *a, **kw: made.append(self.fn.__name__) or real(self, *a, **kw))
    for k in CP.COUNTERS:
        monkeypatch.setitem(CP.COUNTERS, k, 0)
    p = CP.pool()
    p.start()
    import time
    t0 = time.monotonic()
    while not p.ready() and not p.closed and time.monotonic() - t0 < 240:
        time.sleep(0.05)
    assert p.ready(), "the compile worker did not start"
    yield p, made
    p.close()


def test_tritons_async_compile_closes_over_what_a_worker_needs():
    """The installed Triton's _do_compile still hands the executor a closure over self, src, target
    and options: job_of depends on those names (Triton 3.4 to 3.8 have them)."""
    from triton.runtime.jit import JITFunction
    if not hasattr(JITFunction, "_do_compile"):
        pytest.skip("this Triton has no _do_compile (before 3.4): no asynchronous compiles")
    nested = [c for c in JITFunction._do_compile.__code__.co_consts
              if hasattr(c, "co_freevars") and c.co_name == "async_compile"]
    assert nested, "JITFunction._do_compile has no async_compile closure any more: compile_pool must follow"
    assert set(CP._CLOSURE) <= set(nested[0].co_freevars), nested[0].co_freevars


def test_a_worker_compiles_into_tritons_cache_and_the_thread_only_loads(pool, tmp_path, monkeypatch):
    p, made = pool
    jit = fp8.COMPILE_SPECS[1][0]
    fn = _tritons_closure(jit, 86)
    job = CP.job_of(fn)
    assert job is not None and job["module"] == "kernels.fp8" and job["name"] == jit.fn.__name__, job
    ex = CP.RoutingExecutor(2)
    try:
        kernel = ex.submit(fn).result(timeout=300)
    finally:
        ex.shutdown()
    assert CP.COUNTERS["worker_compiles"] == 1 and CP.COUNTERS["thread_compiles"] == 0, CP.COUNTERS
    assert made == [], made  # nothing compiled in this process: Triton's compile found the worker's entry
    # the same compile again (a warm restart): a hit in Triton's cache, loaded in the thread, no worker asked
    sent = []
    monkeypatch.setattr(p, "run", lambda job: sent.append(job) or True)
    ex = CP.RoutingExecutor(1)
    try:
        again = ex.submit(_tritons_closure(jit, 86)).result(timeout=300)
    finally:
        ex.shutdown()
    assert sent == [] and CP.COUNTERS["cache_hits"] == 1 and made == [], (sent, CP.COUNTERS, made)
    assert again.asm["cubin"] == kernel.asm["cubin"]
    # the same binary as a compile here, in another cache folder
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "elsewhere"))
    here = _tritons_closure(jit, 86)()
    assert made == [jit.fn.__name__]
    assert kernel.asm["cubin"] == here.asm["cubin"] and len(kernel.asm["cubin"]) > 0


def test_what_a_worker_cant_do_compiles_in_the_thread(pool):
    """A kernel outside the pack has no job; a dead worker's job is compiled by the thread (and the
    worker replaced); each gives Triton's kernel."""
    import triton.language as tl
    p, made = pool

    @triton.jit
    def outside(x_ptr, BLOCK: tl.constexpr):
        tl.store(x_ptr + tl.arange(0, BLOCK), tl.arange(0, BLOCK))

    fn = _tritons_closure(outside, 80, spec=({"x_ptr": "*i32", "BLOCK": "constexpr"}, {"BLOCK": 64}))
    assert CP.job_of(fn) is None
    assert CP.job_of(lambda: None) is None
    ex = CP.RoutingExecutor(1)
    try:
        assert len(ex.submit(fn).result(timeout=300).asm["cubin"]) > 0
        assert made == ["outside"] and CP.COUNTERS["thread_compiles"] == 1
        p._idle[0].kill()  # the worker dies before its next job
        p._idle[0].wait()
        jit = fp8.COMPILE_SPECS[0][0]
        assert len(ex.submit(_tritons_closure(jit, 80)).result(timeout=300).asm["cubin"]) > 0
    finally:
        ex.shutdown()
    assert made == ["outside", jit.fn.__name__], made
    assert CP.COUNTERS["thread_compiles"] == 2 and CP.COUNTERS["worker_compiles"] == 0, CP.COUNTERS


@pytest.mark.skipif(os.name == "nt", reason="stops the worker with SIGSTOP")
def test_a_worker_that_gives_no_answer_is_stopped_and_the_thread_compiles(pool, monkeypatch, caplog):
    """A worker stuck in a compile holds nothing up past JOB_TIMEOUT_S: it is killed (and replaced), a
    warning says so, and the thread compiles the kernel. Here the worker is frozen (SIGSTOP)."""
    import logging
    import signal
    p, made = pool
    monkeypatch.setattr(CP, "JOB_TIMEOUT_S", 1.0)
    stuck = p._idle[0]
    os.kill(stuck.pid, signal.SIGSTOP)
    jit = fp8.COMPILE_SPECS[0][0]
    ex = CP.RoutingExecutor(1)
    try:
        with caplog.at_level(logging.WARNING, logger="TritonKit"):
            kernel = ex.submit(_tritons_closure(jit, 86)).result(timeout=300)
    finally:
        ex.shutdown()
    assert len(kernel.asm["cubin"]) > 0
    assert made == [jit.fn.__name__], made  # compiled here, by the thread
    assert CP.COUNTERS["thread_compiles"] == 1 and CP.COUNTERS["worker_compiles"] == 0, CP.COUNTERS
    assert stuck.wait(timeout=30) is not None  # killed, not left frozen
    assert "gave no answer in 1 s" in caplog.text, caplog.text
    assert p._respawns == 1


def test_idle_workers_exit_and_the_next_compile_starts_them_again(pool, monkeypatch):
    """Workers with no compile for IDLE_S exit (their memory comes back); a kernel that Triton's cache holds
    starts none; a compile submitted then is done by the thread while they start again, and the next ones
    by a worker."""
    import time
    p, made = pool
    first = p._idle[0]
    cached = fp8.COMPILE_SPECS[0][0]
    ex = CP.RoutingExecutor(1)
    try:
        assert len(ex.submit(_tritons_closure(cached, 90)).result(timeout=300).asm["cubin"]) > 0
    finally:
        ex.shutdown()
    assert CP.COUNTERS["worker_compiles"] == 1
    CP.COUNTERS["worker_compiles"] = 0
    monkeypatch.setattr(CP, "IDLE_S", 0.3)
    with p._cond:
        p._cond.notify_all()  # the idle watcher re-reads IDLE_S
    assert first.wait(timeout=30) is not None  # exited
    assert not p.ready() and CP.COUNTERS["worker_idle_exits"] == 1
    monkeypatch.setattr(CP, "IDLE_S", 300.0)
    jit = fp8.COMPILE_SPECS[0][0]
    ex = CP.RoutingExecutor(1)
    try:
        ex.submit(_tritons_closure(cached, 90)).result(timeout=300)
        assert CP.COUNTERS["cache_hits"] == 1 and not p._started  # loaded; no worker started for it
        assert len(ex.submit(_tritons_closure(jit, 80)).result(timeout=300).asm["cubin"]) > 0
        assert made == [jit.fn.__name__] and CP.COUNTERS["thread_compiles"] == 1  # none ready: the thread
        t0 = time.monotonic()
        while not p.ready() and time.monotonic() - t0 < 240:
            time.sleep(0.05)
        assert p.ready() and CP.COUNTERS["worker_starts"] == 2 and p._idle[0] is not first
        assert len(ex.submit(_tritons_closure(jit, 86)).result(timeout=300).asm["cubin"]) > 0  # another target
    finally:
        ex.shutdown()
    assert made == [jit.fn.__name__] and CP.COUNTERS["worker_compiles"] == 1, (made, CP.COUNTERS)


def test_the_cold_defaults_workers_exit_for_good(monkeypatch):
    """The default's workers (started for a cold cache) are not started again after their idle exit: the
    pool closes and later compiles run in the threads. A worker that never answers stands in for a real one."""
    import subprocess
    import sys
    monkeypatch.setattr(CP, "_pool", None)
    monkeypatch.setattr(CP, "_cold_n", 1)
    monkeypatch.delenv(CP.WORKERS_ENV, raising=False)
    monkeypatch.setattr(CP, "IDLE_S", 0.2)
    procs = []

    def fake_spawn(self):
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
        procs.append(proc)
        with self._cond:
            self._starting -= 1
            self._alive += 1
            self._idle.append(proc)
            self._cond.notify_all()
    monkeypatch.setattr(CP._Pool, "_spawn", fake_spawn)
    p = CP.pool()
    assert p.n == 1 and p.restart is False
    p.start()
    t0 = time.monotonic()
    while not procs and time.monotonic() - t0 < 30:  # started from a thread of its own
        time.sleep(0.02)
    assert procs[0].wait(timeout=30) is not None  # exited idle
    while not p.closed and time.monotonic() - t0 < 30:
        time.sleep(0.02)
    assert p.closed and not p.ready()
    p.start()  # what a compile submitted now does: nothing is started again
    assert len(procs) == 1 and p.run({"name": "k"}) is False
    monkeypatch.setattr(CP, "_pool", None)
    monkeypatch.setenv(CP.WORKERS_ENV, "2")
    assert CP.pool().restart is True  # set by the user: started again, as before


def test_a_worker_that_comes_up_after_the_pool_closed_is_stopped(monkeypatch):
    """A worker still importing when the pool closes (ComfyUI exiting, a replacement in flight) is stopped
    once it is up, not left running with nothing to stop it."""
    procs = []
    real = CP.subprocess.Popen
    monkeypatch.setattr(CP.subprocess, "Popen", lambda *a, **kw: procs.append(real(*a, **kw)) or procs[-1])
    starts = CP.COUNTERS["worker_starts"]
    p = CP._Pool(1)
    p._starting, p.closed = 1, True
    p._spawn()
    assert len(procs) == 1 and procs[0].wait(timeout=30) is not None
    assert p._idle == [] and p._alive == 0 and p._starting == 0 and CP.COUNTERS["worker_starts"] == starts


@pytest.mark.parametrize("value", [None, "0", "many"])
def test_no_workers_unless_turned_on(monkeypatch, value):
    """Off by default (a worker costs a process with torch imported), with 0, and with a value that
    is no number (a log line)."""
    if value is None:
        monkeypatch.delenv(CP.WORKERS_ENV, raising=False)
    else:
        monkeypatch.setenv(CP.WORKERS_ENV, value)
    monkeypatch.setattr(CP, "_pool", None)
    monkeypatch.setattr(CP, "_cold_n", 0)  # the default: none unless ComfyUI's start found the cache cold
    assert CP.workers() == 0 and CP.pool() is None
    CP.start()  # nothing to start, nothing raised
    ex = CP.RoutingExecutor(1)
    try:
        assert ex.submit(lambda: 7).result(timeout=10) == 7  # everything in the threads
    finally:
        ex.shutdown()


def test_workers_auto_and_a_number(monkeypatch):
    monkeypatch.setenv(CP.WORKERS_ENV, "auto")
    assert CP.workers() == max(1, min((os.cpu_count() or 2) - 1, CP.MAX_WORKERS))
    monkeypatch.setenv(CP.WORKERS_ENV, "3")
    assert CP.workers() == 3


def test_started_at_launch_only_where_turned_on_and_a_gpu_is_there(monkeypatch):
    """The pack's __init__ starts the workers at ComfyUI's start when TRITONKIT_COMPILE_WORKERS is set:
    here the GPU is faked, the pool's start recorded."""
    import torch
    started = []
    monkeypatch.setattr(CP._Pool, "start", lambda self: started.append(self.n))
    monkeypatch.setattr(CP, "_pool", None)
    monkeypatch.setenv(CP.WORKERS_ENV, "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert CP.start_at_launch() is False and started == []
    monkeypatch.setenv(CP.WORKERS_ENV, "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert CP.start_at_launch() is False and started == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert CP.start_at_launch() is True and started == [2]


def test_cold_workers_are_bounded_by_cores_and_a_tenth_of_the_ram():
    gib = 2**30
    assert CP.cold_workers(16, 128 * gib) == CP.MAX_WORKERS
    assert CP.cold_workers(4, 128 * gib) == 3
    assert CP.cold_workers(16, 32 * gib) == int(0.1 * 32 * gib // CP.WORKER_RAM) == 5
    assert CP.cold_workers(16, 8 * gib) == 1
    assert CP.cold_workers(16, 4 * gib) == 0
    assert CP.cold_workers(1, 128 * gib) == 0
    assert CP.cold_workers(None, 128 * gib) == 0 and CP.cold_workers(16, None) == 0


def test_the_marker_says_warm_only_for_this_triton_and_these_kernels(tmp_path, monkeypatch, caplog):
    cache = tmp_path / "triton-cache"
    want = CP.stamp()
    assert set(want) == {"triton", "kernels"} and len(want["kernels"]) == 16
    assert CP.cold(str(cache), want) and CP.cold(None, want)
    monkeypatch.setattr(CP, "_marked", False)
    CP.mark_compiled(str(cache))
    assert not CP.cold(str(cache), want)
    assert [p.name for p in cache.iterdir()] == [CP.MARK_FILE]  # written whole: no temporary file left
    assert CP.cold(str(cache), dict(want, triton="0.0"))  # another Triton
    assert CP.cold(str(cache), dict(want, kernels="0" * 16))  # other kernel sources
    (cache / CP.MARK_FILE).write_text("{not json")
    assert CP.cold(str(cache), want)
    CP.mark_compiled(str(cache))  # once per process: a second call writes nothing
    assert CP.cold(str(cache), want)


def test_by_default_workers_start_on_a_cold_cache_only(tmp_path, monkeypatch):
    """Unset: at ComfyUI's start, workers (as many as cold_workers gives) where Triton's cache holds none of
    the pack's kernels; a successful background compile marks the cache, and the next start has none."""
    import torch
    cache = tmp_path / "triton-cache"
    started = []
    monkeypatch.setattr(CP._Pool, "start", lambda self: started.append(self.n))
    monkeypatch.setattr(CP, "_pool", None)
    monkeypatch.setattr(CP, "_cold_n", 0)
    monkeypatch.setattr(CP, "_marked", False)
    monkeypatch.setattr(CP, "_cache_dir", lambda: str(cache))
    monkeypatch.setattr(CP, "_ram_bytes", lambda: 64 * 2**30)
    monkeypatch.setattr(CP.os, "cpu_count", lambda: 6)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv(CP.WORKERS_ENV, raising=False)
    assert CP.start_at_launch() is True and started == [5] and CP.workers() == 5
    assert CP.pool().n == 5

    monkeypatch.setattr(CP, "_pool", None)  # a compile in the threads (no worker pool) marks the cache too
    monkeypatch.setattr(CP, "_cold_n", 0)
    ex = CP.RoutingExecutor(1)
    try:
        assert ex.submit(lambda: 7).result(timeout=10) == 7
        for _ in range(100):  # the done-callback runs in the pool's thread, after the result is set
            if (cache / CP.MARK_FILE).exists():
                break
            time.sleep(0.05)
    finally:
        ex.shutdown()
    assert not CP.cold(str(cache), CP.stamp())

    started.clear()  # the next ComfyUI start: warm, no workers
    assert CP.start_at_launch() is False and started == [] and CP.workers() == 0
    monkeypatch.setenv(CP.WORKERS_ENV, "cold")
    assert CP.start_at_launch() is False and started == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # nor on a machine without a CUDA GPU
    (cache / CP.MARK_FILE).unlink()
    assert CP.start_at_launch() is False and started == []


def _fake_gpu_machine(monkeypatch, cache):
    """A default setup with a CUDA GPU faked, Triton's cache in ``cache``, 6 cores and 64 GiB; the pool's
    start recorded (its worker count), nothing spawned."""
    import torch
    started = []
    monkeypatch.setattr(CP._Pool, "start", lambda self: started.append(self.n))
    monkeypatch.setattr(CP, "_pool", None)
    monkeypatch.setattr(CP, "_cold_n", 0)
    monkeypatch.setattr(CP, "_marked", False)
    monkeypatch.setattr(CP, "_models", [])
    monkeypatch.setattr(CP, "_cache_dir", lambda: str(cache))
    monkeypatch.setattr(CP, "_ram_bytes", lambda: 64 * 2**30)
    monkeypatch.setattr(CP.os, "cpu_count", lambda: 6)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv(CP.WORKERS_ENV, raising=False)
    return started


def _compile_in_the_threads(cache) -> None:
    """A successful background compile (a stand-in) through the pack's executor; waits for the marker's write."""
    before = (cache / CP.MARK_FILE).read_text() if (cache / CP.MARK_FILE).exists() else None
    ex = CP.RoutingExecutor(1)
    try:
        assert ex.submit(lambda: 7).result(timeout=10) == 7
        for _ in range(200):  # the done-callback runs in the pool's thread, after the result is set
            if (cache / CP.MARK_FILE).exists() and (cache / CP.MARK_FILE).read_text() != before:
                break
            time.sleep(0.05)
    finally:
        ex.shutdown()


def test_a_model_the_warm_cache_lacks_starts_workers_at_its_patch(tmp_path, monkeypatch):
    """A cache another model warmed starts no workers at ComfyUI's start; a node patching a model the marker
    does not list starts them (as many as for a cold cache), once; after its first compile the marker lists
    it, and the next process patching it starts none, while another model still gets them."""
    import random
    import torch
    cache = tmp_path / "triton-cache"
    started = _fake_gpu_machine(monkeypatch, cache)
    first, second = (f"{random.getrandbits(64):016x}" for _ in range(2))
    CP.start_for_model(first)  # the first model, on a cold cache
    _compile_in_the_threads(cache)
    assert json.loads((cache / CP.MARK_FILE).read_text()) == dict(CP.stamp(), models=[first])

    started.clear()  # a new ComfyUI process on the warm cache
    monkeypatch.setattr(CP, "_pool", None)
    monkeypatch.setattr(CP, "_cold_n", 0)
    monkeypatch.setattr(CP, "_marked", False)
    monkeypatch.setattr(CP, "_models", [])
    assert CP.start_at_launch() is False and started == [] and CP.workers() == 0
    assert CP.start_for_model(first) is False and started == [] and CP.pool() is None
    assert CP.start_for_model(second) is True and started == [5] and CP.workers() == 5
    assert CP.pool().restart is False  # they exit idle for good, as the cold start's
    assert CP.start_for_model(second) is False and started == [5]  # running: not again
    monkeypatch.setattr(CP, "_pool", None)  # the workers' pool aside: the threads compile
    _compile_in_the_threads(cache)
    assert json.loads((cache / CP.MARK_FILE).read_text())["models"] == [first, second]

    monkeypatch.setattr(CP, "_cold_n", 0)  # the next process: both listed
    assert CP.start_for_model(second) is False and CP.start_for_model(first) is False and started == [5]
    third = f"{random.getrandbits(64):016x}"
    monkeypatch.setenv(CP.WORKERS_ENV, "0")  # turned off: never
    assert CP.start_for_model(third) is False
    monkeypatch.delenv(CP.WORKERS_ENV)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # no CUDA GPU: never
    assert CP.start_for_model(third) is False and started == [5]


def test_a_model_after_the_cold_starts_workers_exited_gets_new_ones(tmp_path, monkeypatch):
    """The workers started for a cold cache close for good once idle; a new model's patch replaces that closed
    pool with a new one."""
    cache = tmp_path / "triton-cache"
    started = _fake_gpu_machine(monkeypatch, cache)
    assert CP.start_at_launch() is True and started == [5]
    CP.start_for_model("a" * 16)  # met while those run: no second pool
    assert started == [5]
    _compile_in_the_threads(cache)
    old = CP.pool()
    old.closed = True  # exited idle (restart False)
    assert CP.start_for_model("b" * 16) is True and started == [5, 5]
    assert CP.pool() is not old and not CP.pool().closed


def test_the_marker_keeps_the_latest_models_and_reads_an_older_one(tmp_path, monkeypatch):
    """A marker written before it listed models still says warm, and lists none; at most MAX_MODELS are kept,
    the latest; a marker of another Triton lists nothing (its models' kernels are not there)."""
    cache = tmp_path / "triton-cache"
    cache.mkdir()
    want = CP.stamp()
    (cache / CP.MARK_FILE).write_text(json.dumps(want))
    assert not CP.cold(str(cache), want) and not CP.seen(str(cache), want, "m")
    monkeypatch.setattr(CP, "MAX_MODELS", 3)
    names = [f"m{i}" for i in range(5)]
    for name in names:  # each patched in its own process, then compiled
        monkeypatch.setattr(CP, "_models", [name])
        monkeypatch.setattr(CP, "_marked", False)
        CP.mark_compiled(str(cache))
    assert json.loads((cache / CP.MARK_FILE).read_text())["models"] == names[-3:]
    assert CP.seen(str(cache), want, "m4") and not CP.seen(str(cache), want, "m0")
    assert not CP.seen(str(cache), dict(want, triton="0.0"), "m4")
    (cache / CP.MARK_FILE).write_text(json.dumps(dict(want, triton="0.0", models=["m9"])))
    monkeypatch.setattr(CP, "_models", ["m5"])
    monkeypatch.setattr(CP, "_marked", False)
    CP.mark_compiled(str(cache))
    assert json.loads((cache / CP.MARK_FILE).read_text()) == dict(want, models=["m5"])


def test_the_pack_s_start_checks_the_cache_in_a_thread(tmp_path, monkeypatch):
    """From the pack's __init__ the default's check (it imports Triton) runs off ComfyUI's start-up: the call
    returns at once and the workers start from the thread."""
    import threading
    import torch
    started = []
    monkeypatch.setattr(CP._Pool, "start", lambda self: started.append((self.n, threading.current_thread().name)))
    monkeypatch.setattr(CP, "_pool", None)
    monkeypatch.setattr(CP, "_cold_n", 0)
    monkeypatch.setattr(CP, "_cache_dir", lambda: str(tmp_path / "triton-cache"))
    monkeypatch.setattr(CP, "_ram_bytes", lambda: 64 * 2**30)
    monkeypatch.setattr(CP.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv(CP.WORKERS_ENV, raising=False)
    assert CP.start_at_launch(background=True) is True
    t0 = time.monotonic()
    while not started and time.monotonic() - t0 < 30:
        time.sleep(0.02)
    assert started == [(3, "tritonkit-compile-worker-check")] and CP.workers() == 3


def test_a_failed_compile_does_not_mark_the_cache(tmp_path, monkeypatch):
    cache = tmp_path / "triton-cache"
    monkeypatch.setattr(CP, "_pool", None)
    monkeypatch.setattr(CP, "_cold_n", 0)
    monkeypatch.setattr(CP, "_marked", False)
    monkeypatch.setattr(CP, "_cache_dir", lambda: str(cache))
    monkeypatch.delenv(CP.WORKERS_ENV, raising=False)
    ex = CP.RoutingExecutor(1)

    def boom():
        raise RuntimeError("compile failed")
    try:
        with pytest.raises(RuntimeError):
            ex.submit(boom).result(timeout=10)
    finally:
        ex.shutdown()
    assert not (cache / CP.MARK_FILE).exists() and CP._marked is False


def test_the_worker_imports_the_pack_under_comfyuis_module_name(tmp_path, monkeypatch):
    """ComfyUI 0.8 imports a custom node folder under its path ("." as "_x_"), so the pack's root module
    name has slashes (backslashes and a drive on Windows): the worker, given that name, imports the
    kernels under it and compiles a job into Triton's cache."""
    import pickle
    import subprocess
    import sys
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    root = str(tmp_path / "custom_nodes" / "ComfyUI-TritonKit").replace(".", "_x_")
    proc = subprocess.Popen([sys.executable, CP.__file__, root, CP._ROOT_PATH],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready = pickle.load(proc.stdout)
        assert ready[0] == "ready", ready
        job = CP.job_of(_tritons_closure(fp8.COMPILE_SPECS[2][0], 80))
        assert job is not None
        pickle.dump(job, proc.stdin)
        proc.stdin.flush()
        ok, detail = pickle.load(proc.stdout)
        assert ok is True and detail > 0, detail
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    assert proc.returncode == 0
    assert any(f.endswith(".cubin") for _, _, fs in os.walk(tmp_path / "cache") for f in fs)


def test_a_worker_compiles_a_gluon_kernel_too(pool, monkeypatch):
    """The Gluon kernels (kernels/attention_hopper.py, built on first use) are the module's attributes by name, so
    a worker compiles them (with Gluon's own source class) and the thread only loads the result: a compile in a
    thread would hold ComfyUI's GIL while the model's steps and the calibration's timings wait."""
    from tritonkit.kernels import attention_hopper as AH
    if not AH.gluon_available():
        pytest.skip("this Triton has no Gluon Hopper API (Triton < 3.5)")
    import torch
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    p, made = pool
    real = GluonASTSource.make_ir
    monkeypatch.setattr(GluonASTSource, "make_ir", lambda self, *a, **kw: made.append(self.fn.__name__) or real(self, *a, **kw))
    jit, sig, consts, opts = AH.compile_spec8(torch.bfloat16, 128, AH.candidates8(128, True)[0], fp8_pv=True)
    assert jit is AH.attn_fwd_hopper_ws8 and AH.KERNEL_NAMES[2] == "attn_fwd_hopper_ws8"
    self, src, target = jit, GluonASTSource(jit, sig, consts), GPUTarget("cuda", 90, 32)
    options = make_backend(target).parse_options({"num_warps": opts["num_warps"], "num_stages": opts["num_stages"]})
    env_vars = get_cache_invalidating_env_vars()

    def async_compile():  # what JITFunction._do_compile hands the executor (its names), for a Gluon kernel
        return getattr(self, "compile", triton.compile)(src, target=target, options=options.__dict__,
                                                         _env_vars=env_vars)
    job = CP.job_of(async_compile)
    assert job is not None and job["gluon"] is True and job["module"] == "kernels.attention_hopper", job
    assert job["name"] == "attn_fwd_hopper_ws8"
    monkeypatch.setenv(CP.GLUON_ENV, "0")
    assert CP.job_of(async_compile) is None  # as before: the thread compiles it
    monkeypatch.delenv(CP.GLUON_ENV)
    ex = CP.RoutingExecutor(1)
    try:
        kernel = ex.submit(async_compile).result(timeout=600)
    finally:
        ex.shutdown()
    assert CP.COUNTERS["worker_compiles"] == 1 and CP.COUNTERS["thread_compiles"] == 0, CP.COUNTERS
    assert made == [], made  # the worker's compile, loaded here from Triton's cache
    assert len(kernel.asm["cubin"]) > 0 and "wgmma" in kernel.asm["ptx"]
    with pytest.raises(AttributeError):
        AH.not_a_kernel  # noqa: B018 - the module's __getattr__ answers only the kernels' names
