"""Step 4: the Triton package that matches torch, installed with the same Python.

Windows: ``triton-windows`` bounded to torch's Triton minor (diagnostics/environment.py's TORCH_TRITON:
torch 2.4-2.5 -> 3.1, 2.6 -> 3.2, ... 2.9 -> 3.5, 2.10-2.11 -> 3.6, 2.12-2.13 -> 3.7, 2.14 -> 3.8; Windows
wheels declare none), installed with ``python -m pip`` (``-s`` for
an embedded Python), after uninstalling a plain ``triton`` that would shadow it. Linux: check that
the ``triton`` torch requires is there. Refuses torch <= 2.3 and GPUs below sm75."""
from __future__ import annotations

import re
from importlib import metadata

from ..diagnostics import environment as envmod
from .common import Context, StepResult


def dist_info(name: str, path: list[str]) -> tuple[str, list[str]] | None:
    """(version, Requires-Dist) of distribution ``name`` found in ``path``; None when absent."""
    want = re.sub(r"[-_.]+", "-", name).lower()
    for dist in metadata.distributions(path=list(path)):
        if re.sub(r"[-_.]+", "-", (dist.metadata["Name"] or "")).lower() == want:
            return dist.version, list(dist.requires or [])
    return None


def wanted_triton(torch_version: str, torch_requires: list[str]) -> tuple[int, int] | None:
    """The Triton minor for this torch: the one torch's metadata declares (Linux wheels, any marker),
    else seed 001's table continued by its rule."""
    return envmod.torch_declared_triton(torch_requires) or envmod.triton_for_torch(torch_version)


def pip_base(exe: str, embedded: bool) -> list[str]:
    # -s: an embedded Python must not pick up the user's site-packages (as ComfyUI-Manager does it)
    return [exe] + (["-s"] if embedded else []) + ["-m", "pip"]


def plan(torch: tuple[str, list[str]] | None, dists: dict[str, str], platform: str,
         cc: tuple[int, int] | None = None) -> dict:
    """What to do: {"status", "message", "fix", "uninstall": [...], "install": spec|None, "want": (x, y)}."""
    res = {"status": "ok", "message": "", "fix": None, "uninstall": [], "install": None, "want": None}
    if torch is None:
        res.update(status="failed", message="torch is not installed in this Python",
                   fix="install ComfyUI's CUDA build of torch first (see ComfyUI's README), then run install.py again")
        return res
    tv, requires = torch
    want = wanted_triton(tv, requires)
    res["want"] = want
    if want is None:
        res.update(status="failed", message=f"torch {tv} is too old for Triton (torch <= 2.3 is not supported)",
                   fix="update torch to >= 2.6 (2.4-2.5 work too), e.g. the torch of a current ComfyUI release")
        return res
    if cc is not None and cc[0] * 10 + cc[1] < 75:
        res.update(status="failed", message=f"the GPU is sm{cc[0]}{cc[1]} (Pascal or older), which Triton does "
                   "not support", fix="nothing to install: the pack's nodes fall back to torch on this GPU")
        return res
    spec_range = f">={want[0]}.{want[1]},<{want[0]}.{want[1] + 1}"
    notes = []
    if cc is not None and cc[0] * 10 + cc[1] == 75 and want >= (3, 3):
        notes.append("sm75 (Turing): official Triton dropped it in 3.3; if kernels fail, try "
                     "triton-windows<3.3 (not guaranteed with torch >= 2.7)")
    if platform == "win32":
        if "triton" in dists:
            res["uninstall"].append("triton")
        have = dists.get("triton-windows")
        have_minor = envmod._minor(have) if have else None
        if have_minor != want:
            res["install"] = f"triton-windows{spec_range}"
        if res["uninstall"] or res["install"]:
            parts = []
            if res["uninstall"]:
                parts.append(f"the plain 'triton' {dists['triton']} (does not work on Windows and shadows "
                             "triton-windows) must be uninstalled")
            if res["install"]:
                parts.append(f"triton-windows {have} does not match torch {tv} (wants {want[0]}.{want[1]}.x)"
                             if have else f"triton-windows {want[0]}.{want[1]}.x is not installed (torch {tv})")
            res.update(status="todo", message="; ".join(parts + notes))
        else:
            res["message"] = f"triton-windows {have} matches torch {tv}" + ("; " + "; ".join(notes) if notes else "")
        return res
    have = dists.get("triton") or dists.get("pytorch-triton")
    have_minor = envmod._minor(have) if have else None
    if have_minor == want:
        res["message"] = f"triton {have} matches torch {tv}" + ("; " + "; ".join(notes) if notes else "")
        return res
    declared = next((r.split(";")[0].strip() for r in requires if re.match(r"^\s*(pytorch-)?triton\b", r)), None)
    if have and not declared:
        res.update(status="warn", message=f"triton {have} with torch {tv}, a build that declares no Triton "
                   f"(e.g. CPU-only); the table says {want[0]}.{want[1]}.x",
                   fix="if Triton kernels fail, install the triton of your CUDA torch build")
        return res
    spec = declared.replace(" ", "") if declared else f"triton{spec_range}"
    res.update(status="failed",
               message=(f"triton {have} does not match torch {tv} (wants {want[0]}.{want[1]}.x)" if have
                        else f"the triton that torch {tv} needs ({spec}) is not installed"),
               fix=f"python -m pip install \"{spec}\" with this Python (or reinstall torch, which brings it)")
    return res


def step(target, ctx: Context, no_pip: bool = False, cc: tuple[int, int] | None = None) -> StepResult:
    """``target`` is a pyfolder.PythonTarget."""
    if no_pip:
        return StepResult("triton package", "skipped", "--no-pip given: the Triton package was not checked or changed")
    torch = dist_info("torch", target.site_packages)
    dists = envmod.triton_distributions(target.site_packages)
    p = plan(torch, dists, target.platform, cc)
    details = {"torch": torch[0] if torch else None, "distributions": dists, "plan": {k: p[k] for k in
               ("uninstall", "install")}}
    if p["status"] != "todo":
        return StepResult("triton package", p["status"], p["message"], p["fix"], details)
    base = pip_base(target.exe, target.embedded)
    commands = []
    if p["uninstall"]:
        commands.append(base + ["uninstall", "-y"] + p["uninstall"])
    if p["install"]:
        commands.append(base + ["install", "--disable-pip-version-check", "--no-input", "-U", p["install"]])
    shown = " && ".join(" ".join(f'"{a}"' if "<" in a or " " in a else a for a in c) for c in commands)
    if ctx.check:
        return StepResult("triton package", "todo", p["message"], f"install.py runs: {shown}", details)
    if not ctx.confirm(f"Run {shown}?"):
        return StepResult("triton package", "skipped", p["message"] + "; you declined", f"run: {shown}", details)
    for cmd in commands:
        ctx.log("running " + " ".join(cmd))
        rc, out = ctx.run(cmd, timeout=None)
        if rc != 0:
            tail = "\n".join(out.strip().splitlines()[-5:])
            return StepResult("triton package", "failed", f"'{' '.join(cmd[-2:])}' failed (exit {rc}): {tail}",
                              f"run it by hand to see the whole error: {' '.join(cmd)}", details)
    after = envmod.triton_distributions(target.site_packages)
    details["distributions_after"] = after
    done = []
    if p["uninstall"]:
        done.append("uninstalled " + ", ".join(p["uninstall"]))
    if p["install"]:
        done.append(f"installed triton-windows {after.get('triton-windows', '?')} ({p['install']})")
    return StepResult("triton package", "done", "; ".join(done), None, details)
