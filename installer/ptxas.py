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


def triton_ptxas(triton_dir: str | None) -> str | None:
    """The ptxas the Triton package ships (Linux name), where present."""
    exe = os.path.join(triton_dir, "backends", "nvidia", "bin", "ptxas") if triton_dir else None
    return exe if exe and os.path.isfile(exe) else None


def ptxas_version(path: str, run=subprocess.run) -> tuple | None:
    """(major, minor) of ``ptxas --version`` ("release 13.0"), or None where it cannot be read."""
    try:
        out = run([path, "--version"], capture_output=True, text=True, timeout=20).stdout or ""
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def pin(env: dict, torch_dir: str | None, triton_dir: str | None = None, version=ptxas_version) -> str | None:
    """Sets ``TRITON_PTXAS_PATH`` in ``env`` to :func:`torch_ptxas` where neither the user nor
    anything else has set it (and the pin is not switched off), unless torch's ptxas is older than
    the Triton package's own (``version`` reads both; an unreadable one does not stop the pin).
    Returns the path it set, else None."""
    if env.get("TRITON_PTXAS_PATH") or env.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    exe = torch_ptxas(torch_dir)
    if not exe:
        return None
    own = triton_ptxas(triton_dir)
    if own:
        mine, theirs = version(exe), version(own)
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
