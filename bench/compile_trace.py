"""Which Triton compiles a bench process ran, and whether each came from Triton's cache.

``TK_BENCH_TRACE_COMPILES=1`` makes ``bench/workflow.py`` install this before ComfyUI and the pack
load: every ``triton.compile`` of the process (the pack's kernels and those Inductor compiles in this
process; its worker processes are not seen) is recorded with its kernel name, wall seconds, cache
hit or miss, and the ptxas Triton was pointed at then (``TRITON_PTXAS_PATH``, or ``bundled``).
Triton's C-module builds (``triton.runtime.build._build``: a launcher per kernel signature before Triton
3.8, at the kernel's first launch unless kernels/launchers.py built it ahead) are recorded too, with
their thread: ``summary``'s ``c_builds``.
A warm restart that still compiles shows here which kernels missed and why their cache key moved:
``summary`` also lists the kernel names that have more than one entry in Triton's cache folder
(the same kernel stored under two keys)."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

_records: list[dict] = []
_builds: list[dict] = []  # Triton's C-module builds: {"name", "s", "thread", "t0"}
_local = threading.local()
_installed = False
_saved: tuple = ()  # what install() replaced, for uninstall()


def records() -> list[dict]:
    return _records


def install() -> bool:
    """Wraps Triton's compile entry points once; False where Triton is missing or has no listener."""
    global _installed
    if _installed:
        return True
    try:
        import triton
        import triton.compiler as tc
        import triton.compiler.compiler as tcc
        from triton import knobs
    except Exception:
        return False
    if not hasattr(knobs, "compilation") or not hasattr(knobs.compilation, "listener"):
        return False
    orig = tcc.compile

    def listener(*_, **kw):
        _local.last = (getattr(kw.get("src"), "name", "?"), bool(kw.get("cache_hit")))

    def compile(*args, **kwargs):  # noqa: A001 - the name Triton's callers look up
        _local.last = None
        t0 = time.perf_counter()
        ptxas = os.environ.get("TRITON_PTXAS_PATH") or "bundled"
        try:
            return orig(*args, **kwargs)
        finally:
            name, hit = _local.last or (getattr(args[0] if args else None, "name", "?"), None)
            t1 = time.perf_counter()
            _records.append({"name": name, "hit": hit, "s": round(t1 - t0, 4), "ptxas": ptxas,
                             "thread": threading.current_thread().name, "t0": t0, "t1": t1})

    global _saved
    _saved = (knobs.compilation.listener, orig, tc.compile, triton.compile)
    knobs.compilation.listener = listener
    tcc.compile = tc.compile = triton.compile = compile
    _install_build()
    _installed = True
    return True


_build_saved = None


def _install_build() -> None:
    """Wraps ``triton.runtime.build._build`` (a C compiler run) where this Triton has it."""
    global _build_saved
    try:
        import triton.runtime.build as tb
        orig = tb._build
    except Exception:  # noqa: BLE001 - another Triton: no C-module builds recorded
        return

    def _build(name, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return orig(name, *args, **kwargs)
        finally:
            _builds.append({"name": name, "s": round(time.perf_counter() - t0, 4),
                            "thread": threading.current_thread().name, "t0": t0})
    _build_saved = orig
    tb._build = _build


def builds() -> list[dict]:
    return _builds


def uninstall() -> None:
    """Puts Triton's entry points and listener back (tests) and forgets the records."""
    global _installed, _saved
    if not _installed:
        return
    import triton
    import triton.compiler as tc
    import triton.compiler.compiler as tcc
    from triton import knobs
    knobs.compilation.listener, tcc.compile, tc.compile, triton.compile = _saved
    global _build_saved
    if _build_saved is not None:
        import triton.runtime.build as tb
        tb._build, _build_saved = _build_saved, None
    _installed, _saved = False, ()
    _records.clear()
    _builds.clear()


def busy_s(recs: list[dict]) -> float:
    """Wall seconds during which at least one of ``recs`` was compiling (the union of their
    intervals): against their summed seconds it says how many ran at once."""
    total, end = 0.0, None
    for r in sorted(recs, key=lambda r: r["t0"]):
        if end is None or r["t0"] >= end:
            total += r["t1"] - r["t0"]
            end = r["t1"]
        elif r["t1"] > end:
            total += r["t1"] - end
            end = r["t1"]
    return total


def _started_by(miss: list[dict], origin: float, step: float = 1.0) -> list:
    """[second, misses started by then, finished by then] at every ``step`` seconds from ``origin``
    until the last miss ends: whether the compiles were all asked for at once or came one by one."""
    end = max(r["t1"] for r in miss) - origin
    out, t = [], step
    while t < end + step:
        out.append([round(t, 1), sum(1 for r in miss if r["t0"] - origin < t), sum(1 for r in miss if r["t1"] - origin < t)])
        t += step
    return out[:40]


def summary(recs: list[dict], cache_dir: str | None = None, top: int = 12, origin: float | None = None,
            marks: tuple = (), builds: list[dict] | None = None) -> dict:
    """Counts, seconds and the slowest misses of ``recs``; with ``cache_dir`` (Triton's), the kernel
    names stored under more than one key. ``miss_busy_s``: wall seconds with a miss compiling (the
    compiles' share of a first step's wall time, however many ran at once); ``misses_by_name``:
    count and summed seconds per kernel. With ``origin`` (a ``time.perf_counter()``, the first model
    call's start), ``timeline``: when the misses compiled, in seconds from it (the first miss's start,
    the last one's end, how many were running at each of ``marks``: the ends of the first steps)."""
    miss = [r for r in recs if r["hit"] is False]
    by_name: dict = {}
    for r in miss:
        n, s = by_name.get(r["name"][:60], (0, 0.0))
        by_name[r["name"][:60]] = (n + 1, round(s + r["s"], 2))
    out = {"compiles": len(recs), "hits": sum(1 for r in recs if r["hit"]), "misses": len(miss),
           "miss_s": round(sum(r["s"] for r in miss), 2), "all_s": round(sum(r["s"] for r in recs), 2),
           "miss_busy_s": round(busy_s(miss), 2), "hit_s": round(sum(r["s"] for r in recs if r["hit"]), 2),
           "misses_by_name": dict(sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]),
           # Inductor's kernels (triton_poi_…, triton_per_…) compiled in this process, not in its workers
           "inductor_misses": sum(1 for r in miss if r["name"].startswith("triton_")),
           "inductor_miss_s": round(sum(r["s"] for r in miss if r["name"].startswith("triton_")), 2),
           "ptxas": sorted({r["ptxas"] for r in recs}),
           "slowest_misses": [[r["name"][:80], r["s"], r["ptxas"][-40:]]
                              for r in sorted(miss, key=lambda r: -r["s"])[:top]]}
    if origin is not None and miss:
        out["timeline"] = {"first_start_s": round(min(r["t0"] for r in miss) - origin, 2),
                           "last_end_s": round(max(r["t1"] for r in miss) - origin, 2),
                           "running_at": [[round(m - origin, 2), sum(1 for r in miss if r["t0"] <= m < r["t1"])]
                                          for m in marks],
                           "started_by_s": _started_by(miss, origin),
                           # every miss, by start: [name, start, seconds, thread]
                           "misses": [[r["name"][:24], round(r["t0"] - origin, 2), round(r["s"], 2),
                                       r.get("thread", "?")[-12:]] for r in sorted(miss, key=lambda r: r["t0"])][:80]}
    if builds is not None:
        main = [b for b in builds if b["thread"] == "MainThread"]
        out["c_builds"] = {"main_thread": len(main), "main_thread_s": round(sum(b["s"] for b in main), 2),
                           "other_threads": len(builds) - len(main),
                           "other_threads_s": round(sum(b["s"] for b in builds if b not in main), 2)}
        if origin is not None:  # which, and when from the first model call's start (before it: negative)
            out["c_builds"]["main_thread_at"] = [[b["name"], round(b["t0"] - origin, 2), b["s"]] for b in main][:12]
    if cache_dir and Path(cache_dir).is_dir():
        keys: dict[str, int] = {}
        for meta in Path(cache_dir).glob("*/*.json"):
            if not meta.name.startswith("__grp__"):
                keys[meta.stem] = keys.get(meta.stem, 0) + 1
        out["cache_names"] = len(keys)
        out["names_under_several_keys"] = sorted((n[:80], k) for n, k in keys.items() if k > 1)[:top]
    return out
