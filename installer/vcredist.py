"""Step 3: the Visual C++ runtime DLLs next to python.exe.

triton-windows' ``libtriton.pyd`` is built with a recent MSVC and fails to load ("DLL load failed
while importing libtriton") when the Python folder carries older ``msvcp140.dll`` /
``vcruntime140.dll`` / ``vcruntime140_1.dll`` (Python loads its own copies first). Their file
versions come from the PE version resource, read with pefile."""
from __future__ import annotations

import functools
import os
import shutil

from .common import VCREDIST_URL, Context, StepResult

DLLS = ("msvcp140.dll", "vcruntime140.dll", "vcruntime140_1.dll")
MIN_VERSION = (14, 42)
BACKUP_DIR = "tritonkit-vcredist-backup"


def pe_file_version(path: str) -> tuple[int, int, int, int] | None:
    """The FILEVERSION of a PE file's VS_FIXEDFILEINFO, or None (missing, not PE, no version resource)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _pe_file_version(os.path.abspath(path), (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))


def have_pefile() -> bool:
    import importlib.util
    return importlib.util.find_spec("pefile") is not None


@functools.lru_cache(maxsize=256)
def _pe_file_version(path: str, identity: tuple) -> tuple[int, int, int, int] | None:
    # identity (size, times, inode) makes a replaced file a new cache entry
    try:
        import pefile
    except ImportError:  # requirements.txt not installed yet; step() says so
        return None

    try:
        pe = pefile.PE(path, fast_load=True)
    except (OSError, pefile.PEFormatError):
        return None
    try:
        pe.parse_data_directories(directories=[pefile.DIRECTORY_ENTRY["IMAGE_DIRECTORY_ENTRY_RESOURCE"]])
        infos = getattr(pe, "VS_FIXEDFILEINFO", None)
        if not infos:
            return None
        ms, ls = infos[0].FileVersionMS, infos[0].FileVersionLS
        return (ms >> 16, ms & 0xFFFF, ls >> 16, ls & 0xFFFF)
    except Exception:  # a damaged resource section reads as "no version"
        return None
    finally:
        pe.close()


def fmt(v: tuple | None) -> str:
    return ".".join(map(str, v)) if v else "?"


def inventory(python_folder: str, system32: str | None) -> dict:
    """{dll: {"python": version|None, "python_present": bool, "system32": version|None, ...}}"""
    inv = {}
    for name in DLLS:
        p = os.path.join(python_folder, name)
        s = os.path.join(system32, name) if system32 else None
        inv[name] = {"python_path": p, "python_present": os.path.isfile(p),
                     "python": pe_file_version(p) if os.path.isfile(p) else None,
                     "system32_path": s, "system32_present": bool(s and os.path.isfile(s)),
                     "system32": pe_file_version(s) if s and os.path.isfile(s) else None}
    return inv


def _old(v: tuple | None) -> bool:
    return v is None or tuple(v[:2]) < MIN_VERSION


def _replace_with_backup(src: str, dst: str, version: tuple | None) -> str:
    """Copies ``src`` over ``dst``. The new file is first copied to a temporary name beside ``dst``;
    the old one is then moved (not deleted) into the backup folder (a loaded DLL can be renamed on
    Windows, not overwritten) and the new one renamed into place; on failure the old one goes back."""
    backup_dir = os.path.join(os.path.dirname(dst), BACKUP_DIR)
    os.makedirs(backup_dir, exist_ok=True)
    backup = os.path.join(backup_dir, os.path.basename(dst))
    if os.path.exists(backup):  # the very first original stays as it is; later ones by version
        backup = os.path.join(backup_dir, f"{os.path.basename(dst)}.{fmt(version)}")
    tmp = dst + ".tritonkit-new"
    shutil.copy2(src, tmp)
    try:
        os.replace(dst, backup)
        try:
            os.replace(tmp, dst)
        except OSError:
            os.replace(backup, dst)
            raise
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return backup


def step(python_folder: str, platform: str, ctx: Context, fix: bool = False) -> StepResult:
    if platform != "win32":
        return StepResult("vcredist", "skipped", "not Windows: the MSVC runtime DLLs don't apply")
    if not have_pefile():
        return StepResult("vcredist", "failed", "pefile (in requirements.txt) is missing from the Python running "
                          "install.py, so the DLL versions can't be read",
                          "python -m pip install pefile with that Python (ComfyUI-Manager installs requirements.txt "
                          "before install.py), then run install.py again")
    inv = inventory(python_folder, ctx.system32)
    details = {n: {k: (fmt(v) if k in ("python", "system32") else v) for k, v in d.items()} for n, d in inv.items()}
    old = [n for n, d in inv.items() if d["python_present"] and _old(d["python"])]
    no_sys = [n for n, d in inv.items() if ctx.system32 and not d["python_present"] and not d["system32_present"]]
    sys_old = [n for n, d in inv.items() if not d["python_present"] and d["system32_present"] and _old(d["system32"])]
    need = ".".join(map(str, MIN_VERSION))
    if not old:
        if ctx.system32 is None and not any(d["python_present"] for d in inv.values()):
            return StepResult("vcredist", "skipped", "no vcredist DLLs in the Python folder and no System32 on "
                              "this machine to check", None, details)
        if no_sys or sys_old:
            bad = ", ".join(no_sys + [f"{n} {fmt(inv[n]['system32'])}" for n in sys_old])
            return StepResult("vcredist", "failed", f"the Visual C++ runtime is missing or older than {need} "
                              f"in System32 ({bad})", f"install the latest vc_redist from {VCREDIST_URL}", details)
        have = ", ".join(f"{n} {fmt(d['python'] if d['python_present'] else d['system32'])}"
                         f"{'' if d['python_present'] else ' (System32)'}" for n, d in inv.items()
                         if d["python_present"] or d["system32_present"])
        unchecked = "" if ctx.system32 else "; System32 not checked (not on this machine)"
        return StepResult("vcredist", "ok", f"new enough (>= {need}): {have}{unchecked}", None, details)
    listing = ", ".join(f"{n} {fmt(inv[n]['python'])}" for n in old)
    explain = (f"{listing} in {python_folder} older than {need}: Python loads these before System32's, and "
               "triton-windows' libtriton then fails with 'DLL load failed while importing libtriton'")
    fixable = [n for n in old if inv[n]["system32_present"] and not _old(inv[n]["system32"])
               and tuple(inv[n]["system32"]) > tuple(inv[n]["python"] or (0,))]
    unfixable = [n for n in old if n not in fixable]
    if not fix or ctx.check:
        if unfixable:
            return StepResult("vcredist", "failed", explain, f"install the latest vc_redist from {VCREDIST_URL}, "
                              "then run install.py --fix-vcredist (copies the new DLLs from System32, keeping "
                              "backups)", details)
        status = "todo" if ctx.check and fix else "failed"
        return StepResult("vcredist", status, explain, "run install.py --fix-vcredist: it copies "
                          f"{', '.join(fixable)} from System32 (keeping backups in {BACKUP_DIR}\\)", details)
    if not ctx.confirm(f"Copy {', '.join(fixable)} from System32 into {python_folder} (keeping backups)?"):
        return StepResult("vcredist", "skipped", explain + "; you declined the copy",
                          "run install.py --fix-vcredist --yes", details)
    copied, errors = [], []
    for n in fixable:
        try:
            _replace_with_backup(inv[n]["system32_path"], inv[n]["python_path"], inv[n]["python"])
            copied.append(f"{n} {fmt(inv[n]['python'])} -> {fmt(inv[n]['system32'])}")
        except OSError as exc:
            errors.append(f"{n}: {exc}")
    details["copied"] = copied
    if errors or unfixable:
        why = "; ".join(errors + [f"{n}: System32 has no newer copy" for n in unfixable])
        return StepResult("vcredist", "failed", f"could not update every DLL ({why})",
                          f"close ComfyUI (a running python.exe holds the DLLs), install the latest vc_redist from "
                          f"{VCREDIST_URL}, and run install.py --fix-vcredist again", details)
    return StepResult("vcredist", "done", f"updated {', '.join(copied)} from System32 (old ones kept in "
                      f"{os.path.join(python_folder, BACKUP_DIR)})", None, details)
