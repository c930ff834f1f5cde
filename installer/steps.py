"""install.py's steps in order, each reported in one line, and the exit status.

1 Python  2 include/libs  3 vcredist  4 Triton package  5 caches  6 long paths  7 Windows hand-fixes
8 self-test. ``Context.check`` makes every step detect and report only."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from ..diagnostics import environment as envmod
from . import caches, include_libs, longpaths, pyfolder, triton_pkg, vcredist, windows_fixes
from .common import Context, StepResult


@dataclass
class Options:
    check: bool = False
    python_dir: str | None = None
    include_libs_from: str | None = None
    clear_caches: bool = False
    fix_vcredist: bool = False
    no_pip: bool = False
    yes: bool = False
    device: str = "auto"
    pack_dir: str | None = None      # the pack folder (for its settings file); None: none written
    install_py: str | None = None    # this install.py, to run the self-test in another Python


def _gpu_cc_of_running() -> tuple[int, int] | None:
    try:
        import torch
        if torch.cuda.is_available():
            return tuple(torch.cuda.get_device_capability(0))
    except Exception:
        return None
    return None


def report_from_output(out: str) -> dict | None:
    """The JSON report of ``<python> install.py --check --json`` in its combined output: stderr comes
    first and may hold braces of its own (the compiler's lines the self-test echoes), so the report is
    the last top-level object that starts a line and parses."""
    dec = json.JSONDecoder()
    starts = [0] if out.startswith("{") else []
    starts += [i + 1 for i in range(len(out)) if out[i] == "\n" and out.startswith("{", i + 1)]
    for i in reversed(starts):
        try:
            obj, _ = dec.raw_decode(out, i)
        except ValueError:
            continue
        if isinstance(obj, dict) and "selftest" in obj:
            return obj
    return None


def selftest_step(target: pyfolder.PythonTarget, opts: Options, ctx: Context) -> tuple[StepResult, dict | None]:
    """Runs the Triton self-test in the target Python: in-process for the running one, as
    ``<python> install.py --check --json`` for another one that can run here."""
    if target.running:
        import importlib
        importlib.invalidate_caches()  # pip may have just installed or removed Triton
        from ..diagnostics import selftest
        rep = selftest.full_report(device=opts.device)
    else:
        runnable = (target.platform == "win32") == (ctx.platform == "win32")
        if not runnable or not opts.install_py or not target.exe:
            return StepResult("self-test", "skipped", f"{target.exe or target.folder} can't run on this machine; "
                              "run the self-test there: <python> install.py --check"), None
        cmd = [target.exe] + (["-s"] if target.embedded else []) + [opts.install_py, "--check", "--json",
                                                                     "--device", opts.device]
        rc, out = ctx.run(cmd, timeout=900)
        rep = report_from_output(out)
        if rep is None:
            tail = "\n".join(out.strip().splitlines()[-5:])
            return StepResult("self-test", "failed", f"the self-test in {target.exe} did not report (exit {rc}): "
                              f"{tail}", f"run it there to see why: {' '.join(cmd)}"), None
    st = rep.get("selftest") or {}
    tri = st.get("triage") or (rep.get("triton") or {}).get("import_error")
    if st.get("ok"):
        return StepResult("self-test", "ok", f"Triton works: vector add on {st.get('device')} matches torch "
                          f"({st.get('backend')})"), rep
    if tri:
        return StepResult("self-test", "failed", f"Triton does not work: {tri['title']} [{tri['key']}]",
                          tri["fix"]), rep
    return StepResult("self-test", "failed", "Triton does not work (see the report)",
                      "read the report below; python install.py --check shows it again"), rep


def run(opts: Options, ctx: Context, emit: Callable[[StepResult], None] = lambda r: None,
        selftest: Callable | None = selftest_step) -> dict:
    """Runs every step; ``emit`` gets each result as it is made. Returns
    {"ok", "target", "steps": [StepResult], "report": self-test report or None}."""
    results: list[StepResult] = []

    def add(r: StepResult) -> StepResult:
        results.append(r)
        emit(r)
        return r

    out = {"ok": False, "target": None, "steps": results, "report": None}
    try:
        target = pyfolder.from_folder(opts.python_dir, ctx) if opts.python_dir else pyfolder.from_running()
    except pyfolder.TargetError as exc:
        add(StepResult("python", "failed", str(exc).split("; ", 1)[0], str(exc).split("; ", 1)[-1]))
        return out
    out["target"] = target.to_dict()
    add(pyfolder.describe(target))

    add(include_libs.step(target.base_folder, target.version, target.platform, ctx, source=opts.include_libs_from,
                          include_dir=target.include_dir))
    add(vcredist.step(target.base_folder, target.platform, ctx, fix=opts.fix_vcredist))

    cc = _gpu_cc_of_running() if target.running and not opts.no_pip else None
    pkg = add(triton_pkg.step(target, ctx, no_pip=opts.no_pip, cc=cc))

    torch = triton_pkg.dist_info("torch", target.site_packages)
    dists = envmod.triton_distributions(target.site_packages)
    triton_dir = windows_fixes.find_triton_dir(target.site_packages)
    fp = caches.fingerprint(target, ctx.env, dists, torch[0] if torch else None, triton_dir)
    dirs = longpaths.effective_cache_dirs(envmod.cache_dirs(env=ctx.env, platform=ctx.platform, home=ctx.home),
                                          opts.pack_dir, ctx.env)
    force = opts.clear_caches or pkg.status == "done"
    reason = "--clear-caches" if opts.clear_caches else ("the Triton package changed" if force else None)
    add(caches.step(target, dirs, fp, ctx, force=force, reason=reason))

    add(longpaths.step(ctx.platform, ctx, opts.pack_dir))
    want = triton_pkg.wanted_triton(torch[0], torch[1]) if torch else None
    add(windows_fixes.step(target.platform, target.site_packages, dists, want))

    if selftest is not None:
        st, rep = selftest(target, opts, ctx)
        out["report"] = rep
        add(st)
    out["ok"] = not any(r.failed for r in results)
    return out


def to_json(out: dict) -> dict:
    base = dict(out["report"]) if out.get("report") else {"selftest": None}
    base.update(ok=out["ok"], target=out["target"], steps=[r.to_dict() for r in out["steps"]])
    return base


def summary(out: dict, check: bool) -> str:
    failed = [r.step for r in out["steps"] if r.failed]
    todo = [r.step for r in out["steps"] if r.status == "todo"]
    if failed:
        return f"install.py: {len(failed)} step(s) need you: {', '.join(failed)} (see the lines above)"
    if check and todo:
        return f"install.py --check: nothing changed; install.py would set up: {', '.join(todo)}"
    return "install.py: " + ("checked, nothing changed; " if check else "") + "Triton is set up for this Python"
