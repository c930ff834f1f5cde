"""Step 1: find the Python that install.py serves and recognise its kind.

By default that is the interpreter running install.py; ``--python-dir`` names another one (the
folder of python.exe, a venv root, or a POSIX prefix). For that one nothing is imported from it:
its version and packages are read from its files (the DLL name and version resource, ``._pth``,
``pyvenv.cfg``, ``*.dist-info``), and it is run only when it can run on this machine."""
from __future__ import annotations

import glob
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field

from ..diagnostics import environment as envmod
from .common import Context, StepResult


@dataclass
class PythonTarget:
    folder: str                    # the folder of python.exe (Windows) or the prefix (POSIX)
    exe: str | None                # the interpreter, when there is one
    version: tuple                 # (major, minor, micro); micro is None when only the minor is known
    kind: str                      # embedded, venv, conda, msstore, user, system
    base_folder: str               # where include/, libs/ and the vcredist DLLs belong (the base of a venv)
    platform: str                  # win32 or the POSIX platform of the tree
    site_packages: list = field(default_factory=list)
    running: bool = False          # it is the interpreter running install.py
    include_dir: str | None = None  # POSIX: the headers folder (sysconfig's include)
    notes: list = field(default_factory=list)

    @property
    def version_str(self) -> str:
        return ".".join(str(v) for v in self.version if v is not None)

    @property
    def embedded(self) -> bool:
        return self.kind == "embedded"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["version"] = self.version_str
        return d


class TargetError(Exception):
    """The Python folder given is not one install.py can serve (the message says why and what to do)."""


def from_running(platform: str = sys.platform) -> PythonTarget:
    """The interpreter running install.py."""
    import sysconfig

    folder = os.path.dirname(sys.executable) if platform == "win32" else sys.prefix
    kind = envmod.python_kind(folder, prefix=sys.prefix, base_prefix=sys.base_prefix, platform=platform)
    base = envmod.base_python_dir(sys.prefix, sys.base_prefix, platform)
    if platform == "win32" and kind == "embedded":
        base = folder
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    return PythonTarget(folder=folder, exe=sys.executable, version=tuple(sys.version_info[:3]), kind=kind,
                        base_folder=base, platform=platform, site_packages=paths, running=True,
                        include_dir=sysconfig.get_paths().get("include"))


def read_pyvenv_cfg(folder: str) -> dict:
    cfg = {}
    path = os.path.join(folder, "pyvenv.cfg")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if "=" in line:
                    k, v = line.split("=", 1)
                    cfg[k.strip().lower()] = v.strip()
    except OSError:
        pass
    return cfg


def _parse_version(text: str | None) -> tuple | None:
    m = re.match(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not m:
        return None
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)) if m.group(3) else None)


def dll_version(folder: str) -> tuple | None:
    """The version from ``python3XY.dll`` in a Windows Python folder: the minor from its name, the
    patch from its PE version resource (CPython writes micro * 1000 + level * 10 + serial there)."""
    for path in sorted(glob.glob(os.path.join(folder, "python3*.dll"))):
        m = re.fullmatch(r"python3(\d+)\.dll", os.path.basename(path), re.IGNORECASE)
        if not m:
            continue
        minor = int(m.group(1))
        micro = None
        from .vcredist import pe_file_version
        fv = pe_file_version(path)
        if fv and fv[0] == 3 and fv[1] == minor:
            micro = fv[2] // 1000
        return (3, minor, micro)
    return None


def pth_files(folder: str) -> list[str]:
    try:
        return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith("._pth"))
    except OSError:
        return []


def _pth_paths(pth: str) -> list[str]:
    folder = os.path.dirname(pth)
    out = []
    try:
        with open(pth, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if not line or line.startswith("#") or line.startswith("import "):
                    continue
                out.append(os.path.normpath(os.path.join(folder, line.replace("\\", os.sep))))
    except OSError:
        pass
    return out


def _probe(exe: str, ctx: Context) -> dict | None:
    """Runs the target interpreter for its facts; None when it can't run here."""
    code = ("import json, sys, sysconfig; print(json.dumps({'version': list(sys.version_info[:3]), "
            "'prefix': sys.prefix, 'base_prefix': sys.base_prefix, 'executable': sys.executable, "
            "'path': [p for p in sys.path if p], 'include': sysconfig.get_paths().get('include')}))")
    rc, out = ctx.run([exe, "-I", "-c", code], timeout=60)
    if rc != 0:
        return None
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def from_folder(path: str, ctx: Context) -> PythonTarget:
    """The Python installed in ``path`` (``--python-dir``)."""
    path = os.path.abspath(path)
    if os.path.isfile(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise TargetError(f"--python-dir {path}: no such folder; give the folder that holds python.exe "
                          "(e.g. ComfyUI_windows_portable\\python_embeded) or a venv/prefix")
    folder, exe, platform = None, None, None
    for cand in (path, os.path.join(path, "Scripts")):
        if os.path.isfile(os.path.join(cand, "python.exe")):
            folder, exe, platform = cand, os.path.join(cand, "python.exe"), "win32"
            break
    if folder is None:
        for name in ("python3", "python"):
            cand = os.path.join(path, "bin", name)
            if os.path.isfile(cand):
                folder, exe, platform = path, cand, ("linux" if sys.platform == "win32" else sys.platform)
                break
    if folder is None:
        raise TargetError(f"--python-dir {path}: no python.exe (Windows) or bin/python3 (POSIX) there; "
                          "give the folder that holds the Python interpreter")
    # a venv given by its Scripts folder is described by its root
    root = os.path.dirname(folder) if os.path.basename(folder).lower() == "scripts" else folder
    notes = []
    probe = _probe(exe, ctx) if platform == ctx.platform or (platform != "win32" and ctx.platform != "win32") \
        else None
    cfg = read_pyvenv_cfg(root)
    version = tuple(probe["version"]) if probe else None
    if version is None:
        version = _parse_version(cfg.get("version") or cfg.get("version_info"))
    if version is None and platform == "win32":
        version = dll_version(folder) or (dll_version(cfg["home"]) if cfg.get("home") else None)
        if version is None:
            for pth in pth_files(folder):
                m = re.fullmatch(r"python3(\d+)\._pth", os.path.basename(pth), re.IGNORECASE)
                if m:
                    version = (3, int(m.group(1)), None)
    if version is None and platform != "win32":
        libs = sorted(glob.glob(os.path.join(root, "lib", "python3.*")))
        if libs:
            version = _parse_version(os.path.basename(libs[-1])[len("python"):])
    if version is None:
        raise TargetError(f"--python-dir {path}: cannot tell which Python version lives there (no python3XY.dll, "
                          "._pth or pyvenv.cfg, and it can't run on this machine); run install.py with that "
                          "Python instead: <that folder>\\python.exe install.py")
    kind = envmod.python_kind(root, platform=platform, env=ctx.env, home=ctx.home)
    base = root
    if kind == "venv":
        if probe:
            base = probe["base_prefix"]
        elif cfg.get("home"):
            home = cfg["home"]
            base = home if platform == "win32" else os.path.dirname(home.rstrip("/"))
        else:
            notes.append("venv without 'home' in pyvenv.cfg: include/libs are looked for in the venv itself")
    if probe:
        site = [p for p in probe["path"] if os.path.isdir(p)]
        include_dir = probe.get("include")
    else:
        if platform == "win32":
            site = [os.path.join(root, "Lib", "site-packages")]
            for pth in pth_files(folder):
                site += [p for p in _pth_paths(pth) if os.path.isdir(p)]
        else:
            site = sorted(glob.glob(os.path.join(root, "lib", "python3.*", "site-packages")))
        site = [p for i, p in enumerate(site) if os.path.isdir(p) and p not in site[:i]]
        include_dir = None if platform == "win32" else \
            os.path.join(base, "include", f"python{version[0]}.{version[1]}")
    return PythonTarget(folder=folder if kind != "venv" or platform != "win32" else root, exe=exe,
                        version=version, kind=kind, base_folder=base, platform=platform, site_packages=site,
                        running=False, include_dir=include_dir, notes=notes)


def describe(target: PythonTarget) -> StepResult:
    """The step-1 line: which Python, which kind, where include/libs go."""
    where = f"include/libs go to {target.base_folder}" if target.platform == "win32" else \
        f"headers at {target.include_dir}"
    msg = f"Python {target.version_str} ({target.kind}) at {target.exe or target.folder}; {where}"
    if target.notes:
        msg += "; " + "; ".join(target.notes)
    details = target.to_dict()
    if target.kind == "msstore":
        return StepResult("python", "warn", msg + "; this is the Microsoft Store Python, whose packaged layout "
                          "Triton does not support well", "use the ComfyUI portable build or a python.org "
                          "installer Python", details)
    if target.version[:2] < (3, 9):
        return StepResult("python", "failed", msg, "Triton needs Python >= 3.9; use a newer ComfyUI/Python", details)
    return StepResult("python", "ok", msg, None, details)
