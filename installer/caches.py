"""Step 5: stale Triton / TorchInductor caches.

A kernel cached by another Python, torch, Triton, CUDA toolchain or C compiler fails in odd ways
("DLL load failed while importing cuda_utils", "PY_SSIZE_T_CLEAN macro must be defined"). A
fingerprint of those is kept beside each cache folder (``<cache>.tritonkit-fingerprint.json``);
when it changed since the last run, or with ``--clear-caches``, the caches are emptied.
Deletion stays inside the two cache folders: links inside them are removed as links, never
followed, and a folder that looks like anything but a cache (a drive root, the home folder, the
temp folder itself) is refused."""
from __future__ import annotations

import json
import os
import re
import stat

from ..diagnostics import environment as envmod
from .common import Context, StepResult

FINGERPRINT_SUFFIX = ".tritonkit-fingerprint.json"


def fingerprint_path(cache_dir: str) -> str:
    return os.path.normpath(cache_dir) + FINGERPRINT_SUFFIX


def torch_cuda_version(site_packages: list[str]) -> str | None:
    """torch's CUDA version from torch/version.py, read as text (torch is not imported)."""
    for sp in site_packages:
        try:
            with open(os.path.join(sp, "torch", "version.py"), encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]*)['\"]", text, re.MULTILINE)
        return m.group(1) if m else None
    return None


def _file_id(path: str | None) -> str | None:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{path} ({st.st_size} bytes, mtime {int(st.st_mtime)})"


def ptxas_identity(triton_dir: str | None, env: dict, platform: str) -> str | None:
    """Which ptxas Triton will use (TRITON_PTXAS_PATH, the bundled one, or CUDA_PATH's), by path, size and date."""
    if env.get("TRITON_PTXAS_PATH"):
        return _file_id(env["TRITON_PTXAS_PATH"]) or env["TRITON_PTXAS_PATH"]
    exe = "ptxas.exe" if platform == "win32" else "ptxas"
    cands = []
    if triton_dir:
        cands.append(os.path.join(triton_dir, "backends", "nvidia", "bin", exe))
    if env.get("CUDA_PATH"):
        cands.append(os.path.join(env["CUDA_PATH"], "bin", exe))
    for c in cands:
        ident = _file_id(c)
        if ident:
            return ident
    return None


def fingerprint(target, env: dict, dists: dict[str, str], torch_version: str | None,
                triton_dir: str | None = None, which=None) -> dict:
    """What the cached kernels depend on. ``target`` is a pyfolder.PythonTarget."""
    import shutil as _sh

    cc = envmod.c_compiler(env=env, platform=target.platform, triton_dir=triton_dir, which=which or _sh.which)
    return {
        "python": f"{target.version_str} {target.exe or target.folder}",
        "torch": torch_version,
        "torch_cuda": torch_cuda_version(target.site_packages),
        "triton": ", ".join(f"{k} {v}" for k, v in sorted(dists.items())) or None,
        "ptxas": ptxas_identity(triton_dir, env, target.platform),
        "cuda_path": env.get("CUDA_PATH"),
        "c_compiler": f"{cc['kind']} {cc['path']}" if cc.get("kind") else None,
    }


def read_fingerprint(cache_dir: str) -> dict | None:
    path = fingerprint_path(cache_dir)
    if os.path.islink(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def write_fingerprint(cache_dir: str, fp: dict) -> None:
    path = fingerprint_path(cache_dir)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(fp, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def changes(old: dict | None, new: dict) -> list[str]:
    if old is None:
        return []
    return [f"{k}: {old.get(k)} -> {new.get(k)}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def refuse_reason(cache_dir: str, home: str, env: dict) -> str | None:
    """Why ``cache_dir`` must not be emptied (it looks like more than a cache), or None."""
    p = os.path.normcase(os.path.abspath(cache_dir))
    parts = [x for x in re.split(r"[\\/]+", p) if x]
    if len(parts) < 2 or os.path.dirname(p) == p:
        return f"{cache_dir} is a drive or filesystem root"
    protected = [home, env.get("TEMP"), env.get("TMP"), env.get("USERPROFILE"), env.get("LOCALAPPDATA"),
                 env.get("APPDATA"), "/tmp", "/var/tmp"]
    for q in protected:
        if q and p == os.path.normcase(os.path.abspath(q)):
            return f"{cache_dir} is the folder {q} itself, not a cache inside it"
    return None


def _is_link(entry: os.DirEntry) -> bool:
    if entry.is_symlink():
        return True
    try:  # Windows junctions (and other reparse points) are links too
        st = entry.stat(follow_symlinks=False)
        return bool(getattr(st, "st_file_attributes", 0) & getattr(stat, "FILE_ATTRIBUTE_REPARSE_POINT", 0)) \
            or (hasattr(os.path, "isjunction") and os.path.isjunction(entry.path))
    except OSError:
        return False


def _remove_file(path: str) -> None:
    try:
        os.remove(path)
    except PermissionError:
        os.chmod(path, stat.S_IWRITE | stat.S_IREAD)  # Windows won't delete read-only files
        os.remove(path)


def empty_folder(folder: str) -> tuple[int, list[str]]:
    """Deletes everything inside ``folder`` (kept itself) without following any link:
    returns (bytes freed, errors)."""
    freed, errors = 0, []

    def walk(d: str) -> None:
        nonlocal freed
        try:
            entries = list(os.scandir(d))
        except OSError as exc:
            errors.append(f"{d}: {exc.strerror or exc}")
            return
        for e in entries:
            try:
                if _is_link(e):
                    os.unlink(e.path)  # the link itself (on Windows also a directory link or junction)
                elif e.is_dir(follow_symlinks=False):
                    walk(e.path)
                    os.rmdir(e.path)
                else:
                    size = e.stat(follow_symlinks=False).st_size
                    _remove_file(e.path)
                    freed += size
            except OSError as exc:
                errors.append(f"{e.path}: {exc.strerror or exc}")

    walk(folder)
    return freed, errors


def step(target, cache_dirs: dict[str, str], fp: dict, ctx: Context, force: bool = False,
         reason: str | None = None) -> StepResult:
    """Compares ``fp`` with the fingerprint beside each cache folder; clears those that changed (all
    with ``force``); records ``fp``. ``reason`` says why ``force`` is set."""
    to_clear, why, sizes, details = [], [], {}, {"caches": {}}
    for name, d in cache_dirs.items():
        exists = os.path.isdir(d)
        sizes[name] = envmod.folder_size(d) if exists else 0
        old = read_fingerprint(d)
        ch = changes(old, fp)
        details["caches"][name] = {"path": d, "exists": exists, "bytes": sizes[name], "changed": ch,
                                   "had_fingerprint": old is not None}
        if exists and (force or ch):
            to_clear.append(name)
            if ch:
                why.append(f"{name}: " + "; ".join(ch))
    if force and reason:
        why.insert(0, reason)
    sized = ", ".join(f"{n} cache {cache_dirs[n]} ({envmod.human_bytes(sizes[n])})" for n in to_clear)
    if ctx.check:
        if to_clear:
            return StepResult("caches", "todo", f"would clear {sized} ({'; '.join(why)})", None, details)
        return StepResult("caches", "ok", "caches match the current set-up" + _first_note(details, True), None, details)
    refused, freed, errors, cleared = [], 0, [], []
    for name in to_clear:
        d = cache_dirs[name]
        r = refuse_reason(d, ctx.home, ctx.env)
        if r is None and os.path.islink(d):
            r = f"{d} is itself a link (to {os.path.realpath(d)})"
        if r:
            refused.append(f"{name}: {r}")
            continue
        f, errs = empty_folder(d)
        freed += f
        errors += errs
        cleared.append(name)
    written = []
    for name, d in cache_dirs.items():
        if any(x.startswith(name + ":") for x in refused):
            continue
        try:
            write_fingerprint(d, fp)
            written.append(name)
        except OSError as exc:
            errors.append(f"fingerprint beside {d}: {exc.strerror or exc}")
    details.update(cleared=cleared, freed_bytes=freed, refused=refused, errors=errors)
    if refused or errors:
        msg = "; ".join(refused + errors[:5]) + (f" (and {len(errors) - 5} more)" if len(errors) > 5 else "")
        return StepResult("caches", "failed", f"could not clear every cache: {msg}",
                          "close ComfyUI (it holds files in the caches), then delete the folders by hand: "
                          + ", ".join(cache_dirs[n] for n in to_clear), details)
    if cleared:
        return StepResult("caches", "done", f"cleared {', '.join(f'{n} cache {cache_dirs[n]}' for n in cleared)}, "
                          f"freed {envmod.human_bytes(freed)} ({'; '.join(why) or 'asked for'})", None, details)
    return StepResult("caches", "ok", "caches match the current set-up" + _first_note(details), None, details)


def _first_note(details: dict, check: bool = False) -> str:
    first = [n for n, c in details["caches"].items() if not c["had_fingerprint"] and c["exists"]]
    if first and check:
        return f" (no fingerprint yet beside the {', '.join(first)} cache: install.py records one)"
    if first:
        return f" (first run: fingerprint recorded; existing {', '.join(first)} cache kept, --clear-caches clears it)"
    return ""
