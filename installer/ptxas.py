"""One ptxas for every Triton compile of a ComfyUI process.

torch's Inductor points Triton at torch's own ptxas (``torch/bin/ptxas``, in the Linux CUDA wheels)
the first time it compiles a kernel in a process, by setting ``TRITON_PTXAS_PATH``. ptxas's version
is part of Triton's cache key, so a kernel compiled before that moment (the pack's kernels, and
Inductor's first ones while its worker pool starts) and the same kernel compiled after it are two
cache entries. Which kernels fall on which side depends on timing, so a restarted ComfyUI misses
Triton's cache for kernels it compiled the time before. Setting the same path when the pack loads
gives the whole process one ptxas from the start, except where torch's ptxas is older than the one
Triton ships (a GPU newer than torch's CUDA would then fail in the pack's kernels too). Pure
functions over explicit paths; ``TRITONKIT_PIN_PTXAS=0`` leaves the environment alone."""
from __future__ import annotations

import os
import re
import subprocess

from ..diagnostics import environment as envmod

DISABLE_ENV = "TRITONKIT_PIN_PTXAS"
# where a torch version sets TRITON_PTXAS_PATH to its own ptxas (the function's name, searched as text
# so that nothing of Inductor is imported when the pack loads)
_INDUCTOR_FILES = ("_inductor/runtime/compile_tasks.py", "_inductor/async_compile.py",
                   "_inductor/compile_worker/__main__.py")
_MARK = "def _set_triton_ptxas_path"


def torch_ptxas(torch_dir: str | None) -> str | None:
    """The ptxas this torch's Inductor switches Triton to, or None where it switches to none: the
    same test as Inductor's (``<torch>/bin/ptxas``, an executable file; on Windows torch ships none
    by that name), and only for a torch whose Inductor has that switch."""
    if not torch_dir:
        return None
    exe = os.path.join(torch_dir, "bin", "ptxas")
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        return None
    for rel in _INDUCTOR_FILES:
        try:
            with open(os.path.join(torch_dir, *rel.split("/")), encoding="utf-8") as f:
                if _MARK in f.read():
                    return exe
        except OSError:
            continue
    return None


def _release(text: str) -> tuple | None:
    m = re.search(r"release (\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def ptxas_versions(paths: list, popen=subprocess.Popen) -> list:
    """(major, minor) of ``ptxas --version`` ("release 13.0") for each of ``paths``, or None where it
    cannot be read; the processes run side by side (this is on ComfyUI's start-up path)."""
    procs = []
    for p in paths:
        try:
            procs.append(popen([p, "--version"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        except (OSError, ValueError):
            procs.append(None)
    out = []
    for proc in procs:
        try:
            out.append(_release(proc.communicate(timeout=20)[0]) if proc is not None else None)
        except subprocess.SubprocessError:
            proc.kill()
            out.append(None)
    return out


def pin(env: dict, torch_dir: str | None, triton_dir: str | None = None, versions=ptxas_versions) -> str | None:
    """Sets ``TRITON_PTXAS_PATH`` in ``env`` to :func:`torch_ptxas` where neither the user nor
    anything else has set it (and the pin is not switched off), unless torch's ptxas is older than
    the Triton package's own (``versions`` reads both; an unreadable one does not stop the pin).
    Returns the path it set, else None."""
    if env.get("TRITON_PTXAS_PATH") or env.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    exe = torch_ptxas(torch_dir)
    if not exe:
        return None
    own = envmod.bundled_ptxas(triton_dir, "linux") if triton_dir else None
    if own and os.path.isfile(own):
        mine, theirs = versions([exe, own])
        if mine and theirs and mine < theirs:
            return None
    env["TRITON_PTXAS_PATH"] = exe
    return exe


def installed_dir(package: str) -> str | None:
    """An installed package's folder (``torch``, ``triton``), found without importing it."""
    import importlib.util
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    locs = list(getattr(spec, "submodule_search_locations", None) or []) if spec else []
    return locs[0] if locs else None
