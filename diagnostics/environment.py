"""Facts about the Python, torch, Triton, GPU, C compiler and caches that Triton will use.

Every function that looks at the machine takes what it looks at as arguments (paths, the
platform, the environment), with defaults that read the running process, so that tests
can describe a Windows machine on Linux."""
from __future__ import annotations

import getpass
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path, PureWindowsPath

# ---------------------------------------------------------------------------- Python

PYTHON_KINDS = ("embedded", "venv", "conda", "msstore", "user", "system")


def _norm(p: str | os.PathLike) -> str:
    return str(p).replace("\\", "/").rstrip("/").lower()


def python_kind(python_dir: str | os.PathLike, *, prefix: str | None = None, base_prefix: str | None = None,
                platform: str = sys.platform, env: dict | None = None, home: str | None = None) -> str:
    """Which kind of Python installation lives in ``python_dir`` (the folder of python.exe,
    or the prefix on POSIX): embedded, venv, conda, msstore, user or system."""
    env = os.environ if env is None else env
    d = Path(python_dir)
    n = _norm(python_dir)
    if "/windowsapps/" in n + "/" or "pythonsoftwarefoundation.python" in n:
        return "msstore"
    if (d / "pyvenv.cfg").is_file() or (d.parent / "pyvenv.cfg").is_file() or (
            prefix is not None and base_prefix is not None and _norm(prefix) != _norm(base_prefix)):
        return "venv"
    if (d / "conda-meta").is_dir() or (d.parent / "conda-meta").is_dir():
        return "conda"
    try:
        has_pth = any(p.suffix == "._pth" or p.name.endswith("._pth") for p in d.iterdir())
    except OSError:
        has_pth = False
    if has_pth or n.endswith("/python_embeded") or n.endswith("/system/python"):
        return "embedded"
    if platform == "win32":
        if "/appdata/local/programs/python/" in n + "/":
            return "user"
        return "system"
    home = home if home is not None else os.path.expanduser("~")
    if home and n.startswith(_norm(home) + "/"):
        return "user"
    return "system"


def base_python_dir(prefix: str, base_prefix: str, platform: str = sys.platform) -> str:
    """The folder where include/ and libs/ belong: the base installation, not a venv."""
    return base_prefix if platform == "win32" else prefix


def include_libs_status(python_dir: str | os.PathLike, version: tuple[int, int], platform: str = sys.platform,
                        include_dir: str | None = None) -> dict:
    """Whether the headers and (on Windows) the import library Triton's launcher build needs exist."""
    d = Path(python_dir)
    if platform == "win32":
        inc = d / "include"
        lib = d / "libs" / f"python{version[0]}{version[1]}.lib"
        return {"include": (inc / "Python.h").is_file(), "libs": lib.is_file(),
                "include_dir": str(inc), "libs_file": str(lib)}
    inc = Path(include_dir) if include_dir else d / "include" / f"python{version[0]}.{version[1]}"
    return {"include": (inc / "Python.h").is_file(), "libs": True, "include_dir": str(inc), "libs_file": None}


# ---------------------------------------------------------------------------- torch <-> Triton

def _minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"^\s*(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


# torch minor -> the Triton minor it is built against: seed 001's table to 2.9, then what torch's Linux wheels
# require (the pip index's metadata, 2026-11-28: 2.10 and 2.11 triton==3.6.0, 2.12 3.7.0, 2.13 3.7.1, 2.14 ~=3.8.0).
# Seed 001's "one Triton minor per torch minor" stopped at 2.10; continued, it sent torch 2.11-2.14 on Windows
# (whose wheels declare no Triton) to triton-windows 3.7-3.10.
TORCH_TRITON = {4: (3, 1), 5: (3, 1), 6: (3, 2), 7: (3, 3), 8: (3, 4), 9: (3, 5), 10: (3, 6), 11: (3, 6),
                12: (3, 7), 13: (3, 7), 14: (3, 8)}


def triton_for_torch(torch_version: str) -> tuple[int, int] | None:
    """The Triton minor version that a torch minor version is built against (TORCH_TRITON). A torch newer
    than the table is a guess, one Triton minor per torch minor after 2.14 (PyPI had triton 3.9.0 beside
    torch 2.15.0, whose metadata the index did not resolve); torch's own metadata, where it declares one,
    beats this (torch_declared_triton). None for torch <= 2.3."""
    tv = _minor(torch_version)
    if tv is None or tv[0] != 2 or tv[1] <= 3:
        return None
    if tv[1] in TORCH_TRITON:
        return TORCH_TRITON[tv[1]]
    last = max(TORCH_TRITON)
    return (3, TORCH_TRITON[last][1] + tv[1] - last)


def torch_declared_triton(requires: list[str] | None = None) -> tuple[int, int] | None:
    """The Triton minor version the installed torch wheel itself requires (Linux wheels declare
    ``triton==X.Y.Z``; Windows wheels declare none). ``requires`` defaults to torch's metadata."""
    if requires is None:
        from importlib import metadata
        try:
            requires = metadata.requires("torch") or []
        except metadata.PackageNotFoundError:
            return None
    for req in requires:
        m = re.match(r"^\s*(?:pytorch-)?triton\s*(?:==|~=|>=)\s*(\d+)\.(\d+)", req)
        if m:
            return (int(m.group(1)), int(m.group(2)))
    return None


def triton_distributions(path: list[str] | None = None) -> dict[str, str]:
    """Installed distributions that provide the ``triton`` module: {name: version}. ``path`` (folders
    such as another Python's site-packages) is searched instead of the running interpreter's."""
    from importlib import metadata

    found = {}
    if path is not None:
        for dist in metadata.distributions(path=list(path)):
            name = re.sub(r"[-_.]+", "-", (dist.metadata["Name"] or "")).lower()
            if name in ("triton", "triton-windows", "triton-cpu", "pytorch-triton") and name not in found:
                found[name] = dist.version
        return found
    for name in ("triton", "triton-windows", "triton-cpu", "pytorch-triton"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def triton_match(torch_version: str | None, distributions: dict[str, str], platform: str = sys.platform,
                 declared: tuple[int, int] | None = None) -> dict:
    """Whether the installed Triton fits torch. ``declared`` is what torch's own metadata requires
    (see torch_declared_triton), which beats the table where torch declares it."""
    want = declared or (triton_for_torch(torch_version) if torch_version else None)
    wanted_name = "triton-windows" if platform == "win32" else "triton"
    res = {"expected": f"{wanted_name} {want[0]}.{want[1]}.x" if want else None, "ok": False, "problems": []}
    if torch_version and want is None:
        res["problems"].append(f"torch {torch_version} is too old for Triton support here (needs torch >= 2.4)")
    if not distributions:
        res["problems"].append("no Triton package is installed")
        return res
    if platform == "win32" and "triton" in distributions:
        res["problems"].append(f"the plain 'triton' {distributions['triton']} package is installed on Windows; "
                               "it does not work there: uninstall it and install triton-windows")
    name = wanted_name if wanted_name in distributions else next(iter(distributions))
    have = _minor(distributions[name])
    if want and have and have != want and name != "triton-cpu":
        res["problems"].append(f"{name} {distributions[name]} does not match torch {torch_version} "
                               f"(expects {want[0]}.{want[1]}.x)")
    res["ok"] = not res["problems"]
    return res


# ---------------------------------------------------------------------------- GPU

def gpu_class(cc: tuple[int, int] | None) -> dict:
    """What a GPU of compute capability ``cc`` supports, by the classes of seed 001."""
    if cc is None:
        return {"class": "none", "label": "no CUDA GPU", "fp8_native": False, "bf16": False,
                "triton": "runs on the CPU through the Triton interpreter (slow; for tests)"}
    sm = cc[0] * 10 + cc[1]
    if sm >= 100:
        return {"class": f"sm{sm}", "label": "Blackwell (RTX 50xx / B200)", "fp8_native": True, "bf16": True,
                "triton": "needs Triton >= 3.3, torch >= 2.7, CUDA >= 12.8"}
    if sm >= 90:
        return {"class": f"sm{sm}", "label": "Hopper (H100/H200)", "fp8_native": True, "bf16": True,
                "triton": "officially supported"}
    if sm >= 89:
        return {"class": f"sm{sm}", "label": "Ada (RTX 40xx)", "fp8_native": True, "bf16": True,
                "triton": "officially supported"}
    if sm >= 80:
        return {"class": f"sm{sm}", "label": "Ampere (RTX 30xx, A100)", "fp8_native": False, "bf16": True,
                "triton": "officially supported; fp8 e4m3fn needs this pack's fallback or triton-windows >= 3.5.0.post21"}
    if sm >= 75:
        return {"class": f"sm{sm}", "label": "Turing (GTX 16xx / RTX 20xx)", "fp8_native": False, "bf16": False,
                "triton": "official Triton <= 3.2 only (Turing dropped in 3.3); no bf16 tensor cores; fp8 through this "
                          "pack's fallback or triton-windows >= 3.2.0.post21"}
    return {"class": f"sm{sm}", "label": "Pascal or older (GTX 10xx)", "fp8_native": False, "bf16": False,
            "triton": "not supported by Triton"}


# ---------------------------------------------------------------------------- C compiler

def c_compiler(env: dict | None = None, platform: str = sys.platform, triton_dir: str | None = None,
               which=shutil.which) -> dict:
    """The C compiler Triton will build its launcher with, in Triton's own order of preference."""
    env = os.environ if env is None else env
    if env.get("CC"):
        cc = env["CC"]
        note = None
        if platform == "win32" and cc.rstrip().endswith(";"):
            note = "CC ends with ';' (set as a list in the Environment Variables window): make it a plain string"
        return {"kind": "CC", "path": cc, "note": note}
    if platform == "win32":
        if triton_dir:
            tcc = Path(triton_dir) / "runtime" / "tcc" / "tcc.exe"
            if tcc.is_file():
                return {"kind": "TinyCC (bundled)", "path": str(tcc), "note": None}
        if env.get("VCINSTALLDIR") or which("cl"):
            return {"kind": "MSVC", "path": which("cl") or env.get("VCINSTALLDIR"), "note": None}
    for name in ("gcc", "clang", "cc"):
        p = which(name)
        if p:
            return {"kind": name, "path": p, "note": None}
    return {"kind": None, "path": None, "note": "no C compiler found"}


# ---------------------------------------------------------------------------- simulated GPU

def simulation(env: dict | None = None, cc: tuple | None = None) -> dict:
    """What makes this process behave as another GPU: ``TRITONKIT_FORCE_ARCH`` (the pack's choices as on that
    arch) and Triton's ``DISABLE_MMA_V3`` (``tl.dot`` without Hopper's wgmma; the pack sets it with a forced arch
    below 90, nodes/arch.py). ``cc``: this GPU's (major, minor). On an sm90+ GPU with no forced arch the variable
    only slows Triton's matmuls, torch.compile's included: the note says to unset it."""
    env = os.environ if env is None else env
    forced = (env.get("TRITONKIT_FORCE_ARCH") or "").strip() or None
    mma_off = env.get("DISABLE_MMA_V3", "").lower() in ("1", "true", "on")  # as Triton reads it
    note = None
    if mma_off and not forced and cc is not None and cc[0] >= 9:
        note = ("DISABLE_MMA_V3 is set with no TRITONKIT_FORCE_ARCH: Triton and torch.compile run this GPU's "
                "matmuls without wgmma, slower; unset it")
    return {"forced_arch": forced, "mma_v3_disabled": mma_off, "note": note}


# ---------------------------------------------------------------------------- caches

def bundled_ptxas(triton_dir: str, platform: str = sys.platform) -> str:
    """Where the Triton package keeps the ptxas it ships."""
    return os.path.join(triton_dir, "backends", "nvidia", "bin", "ptxas.exe" if platform == "win32" else "ptxas")


def ptxas_in_use(env: dict | None = None, triton_dir: str | None = None, platform: str = sys.platform) -> dict:
    """The ptxas Triton runs in this process: ``TRITON_PTXAS_PATH`` where set (by the user, by
    torch.compile, or by the pack, which sets torch's own as torch.compile would), else the one
    Triton ships. ``{"path", "source", "exists"}``."""
    env = os.environ if env is None else env
    if env.get("TRITON_PTXAS_PATH"):
        path, source = env["TRITON_PTXAS_PATH"], "TRITON_PTXAS_PATH"
    elif triton_dir:
        path = bundled_ptxas(triton_dir, platform)
        source = "Triton's own"
    else:
        return {"path": None, "source": None, "exists": False}
    return {"path": path, "source": source, "exists": os.path.isfile(path)}


def cache_dirs(env: dict | None = None, platform: str = sys.platform, home: str | None = None,
               tmp: str | None = None, user: str | None = None) -> dict[str, str]:
    """Triton's and TorchInductor's cache folders, as those libraries compute them."""
    env = os.environ if env is None else env
    home = home if home is not None else os.path.expanduser("~")
    if user is None:
        try:
            user = getpass.getuser()
        except Exception:
            user = "user"
    if tmp is None:
        tmp = env.get("TEMP") or env.get("TMP") if platform == "win32" else None
        tmp = tmp or tempfile.gettempdir()
    join = (lambda *a: str(PureWindowsPath(*a))) if platform == "win32" else os.path.join
    triton_cache = env.get("TRITON_CACHE_DIR") or join(env.get("TRITON_HOME") or home, ".triton", "cache")
    safe_user = re.sub(r'[\\/:*?"<>|]', "_", user)
    inductor = env.get("TORCHINDUCTOR_CACHE_DIR") or join(tmp, f"torchinductor_{safe_user}")
    return {"triton": triton_cache, "inductor": inductor}


def folder_size(path: str | os.PathLike) -> int:
    """Bytes under ``path`` without following symbolic links (0 if it does not exist)."""
    total = 0
    for root, dirs, files in os.walk(path, followlinks=False):
        for f in files:
            try:
                st = os.lstat(os.path.join(root, f))
            except OSError:
                continue
            total += st.st_size
    return total


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
