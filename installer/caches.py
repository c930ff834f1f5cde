"""Step 5: stale Triton / TorchInductor caches.

A kernel cached by another Python, torch, Triton, CUDA toolchain or C compiler fails in odd ways
("DLL load failed while importing cuda_utils", "PY_SSIZE_T_CLEAN macro must be defined").
Several ComfyUI installs on one machine (portable + desktop, say) share ``~/.triton/cache`` and the
Inductor cache, so the record beside each cache folder (``<cache>.tritonkit-fingerprint.json``)
keeps one fingerprint per install, keyed by its Python (path normalised: case on Windows, links).

The rule, per cache folder, when install.py runs for install X:

- X's first run only records X's fingerprint: nothing it built can be stale yet.
- The folder is emptied when, compared with X's *own* last fingerprint, something the cached
  kernels depend on changed: the Python minor version (a patch release keeps the ABI), torch,
  torch's CUDA, Triton, the ptxas Triton uses, CUDA_PATH or the C compiler. The message names X
  and the changes.
- ... unless the folder was already emptied for that same change after X last recorded (another
  install sharing the folder saw the same machine-wide change first, e.g. a new CUDA_PATH or CC):
  X's old entries went with that clearing, so a second one would only cost rebuilds.
- Installs that differ from each other are never a reason to clear. Triton keys its kernels by
  its own build and the source, its launchers by the source and the install's own include/lib
  folders and names them with the Python ABI suffix; Inductor keys by torch, Triton, CUDA and the
  GPU. Entries of different installs don't collide, and clearing on a difference between installs
  made each install rebuild after every run of the other (what this replaces).
- ``--clear-caches``, or a changed Triton package, clears regardless.

Deletion stays inside the two cache folders: links inside them are removed as links, never
followed, and a folder that looks like anything but a cache (a drive root, the home folder, the
temp folder itself) is refused."""
from __future__ import annotations

import json
import ntpath
import os
import re
import stat

from ..diagnostics import environment as envmod
from . import ptxas as ptxasmod
from .common import Context, StepResult, find_package_dir

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


def ptxas_identity(triton_dir: str | None, env: dict, platform: str, torch_dir: str | None = None) -> str | None:
    """Which ptxas Triton will use in ComfyUI (TRITON_PTXAS_PATH, torch's where the pack pins it as
    Inductor does, the bundled one, or CUDA_PATH's), by path, size and date."""
    if env.get("TRITON_PTXAS_PATH"):
        return _file_id(env["TRITON_PTXAS_PATH"]) or env["TRITON_PTXAS_PATH"]
    pinned = ptxasmod.pin(dict(env), torch_dir, triton_dir if platform != "win32" else None)
    if pinned:
        return _file_id(pinned)
    exe = "ptxas.exe" if platform == "win32" else "ptxas"
    cands = []
    if triton_dir:
        cands.append(envmod.bundled_ptxas(triton_dir, platform))
    if env.get("CUDA_PATH"):
        cands.append(os.path.join(env["CUDA_PATH"], "bin", exe))
    for c in cands:
        ident = _file_id(c)
        if ident:
            return ident
    return None


def install_id(target) -> str:
    """The key of an install in the shared record: its Python, normalised so that one install
    reached by two spellings (case on Windows, a link) is one key."""
    path = target.exe or target.folder
    if os.path.exists(path):
        path = os.path.realpath(path)
    return ntpath.normcase(ntpath.normpath(path)) if target.platform == "win32" else os.path.normpath(path)


def fingerprint(target, env: dict, dists: dict[str, str], torch_version: str | None,
                triton_dir: str | None = None, which=None) -> dict:
    """What the cached kernels depend on. ``target`` is a pyfolder.PythonTarget."""
    import shutil as _sh

    cc = envmod.c_compiler(env=env, platform=target.platform, triton_dir=triton_dir, which=which or _sh.which)
    return {
        "install": install_id(target),
        "python": target.version_str,
        "torch": torch_version,
        "torch_cuda": torch_cuda_version(target.site_packages),
        "triton": ", ".join(f"{k} {v}" for k, v in sorted(dists.items())) or None,
        "ptxas": ptxas_identity(triton_dir, env, target.platform, find_package_dir(target.site_packages, "torch")),
        "cuda_path": env.get("CUDA_PATH"),
        "c_compiler": f"{cc['kind']} {cc['path']}" if cc.get("kind") else None,
    }


# what makes an install's cached kernels stale when it changes ("install" is the key, not compared)
RELEVANT = ("python", "torch", "torch_cuda", "triton", "ptxas", "cuda_path", "c_compiler")
FORMAT = 2


def _minor(version) -> str | None:
    return ".".join(str(version).split(".")[:2]) if version else None


def changes(old: dict | None, new: dict) -> list[str]:
    """What changed between two fingerprints of one install, as 'field: old -> new' (the Python
    by its minor version)."""
    if old is None:
        return []
    out = []
    for k in RELEVANT:
        a, b = old.get(k), new.get(k)
        if k == "python" and _minor(a) == _minor(b):
            continue
        if a != b:
            out.append(f"{k}: {a} -> {b}")
    return out


def _empty_state() -> dict:
    return {"format": FORMAT, "generation": 0, "cleared": None, "installs": {}}


def _migrate(data: dict) -> dict:
    """A record of the first format (one fingerprint, 'python': '<version> <path>') as the first
    install of a shared one."""
    state = _empty_state()
    version, _, path = str(data.get("python") or "").partition(" ")
    fp = {k: data.get(k) for k in RELEVANT}
    fp["python"] = version or None
    fp["install"] = path or "(unknown install)"
    state["generation"] = 1
    state["installs"][fp["install"]] = {"fingerprint": fp, "generation": 1}
    return state


def read_state(cache_dir: str) -> dict:
    """The shared record beside ``cache_dir``: {"format", "generation", "cleared": {"generation",
    "changes"} or None, "installs": {id: {"fingerprint", "generation"}}}. A missing, unreadable or
    linked file reads as empty."""
    path = fingerprint_path(cache_dir)
    if os.path.islink(path):
        return _empty_state()
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return _empty_state()
    if not isinstance(data, dict):
        return _empty_state()
    if data.get("format") != FORMAT:
        return _migrate(data) if "python" in data else _empty_state()
    if not isinstance(data.get("installs"), dict):
        return _empty_state()
    return data


def read_fingerprint(cache_dir: str, install: str) -> dict | None:
    rec = read_state(cache_dir)["installs"].get(install)
    return rec["fingerprint"] if rec else None


def write_state(cache_dir: str, state: dict) -> None:
    path = fingerprint_path(cache_dir)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def assess(state: dict, fp: dict) -> dict:
    """Whether the folder of ``state`` must be emptied for the install of ``fp``: {"install",
    "known" (it has a record), "changed" (vs its own last fingerprint), "already_cleared" (those
    changes were cleared for after its last record), "stale" (clear), "others" (other installs)}."""
    me = fp["install"]
    rec = state["installs"].get(me)
    changed = changes(rec["fingerprint"], fp) if rec else []
    cleared = state.get("cleared") or {}
    already = bool(changed) and rec is not None and cleared.get("generation", -1) > rec.get("generation", 0) \
        and set(changed) <= set(cleared.get("changes") or [])
    return {"install": me, "known": rec is not None, "changed": changed, "already_cleared": already,
            "stale": bool(changed) and not already, "others": sorted(k for k in state["installs"] if k != me)}


def record(state: dict, fp: dict, cleared_for: list[str] | None) -> dict:
    """``state`` with the folder's clearing (when ``cleared_for`` is not None) and then ``fp``
    recorded: a clearing comes before the install's new record, so its entries count as newer."""
    new = json.loads(json.dumps(state))
    if cleared_for is not None:
        new["generation"] += 1
        new["cleared"] = {"generation": new["generation"], "changes": sorted(cleared_for),
                          "by": fp["install"]}
    new["generation"] += 1
    new["installs"][fp["install"]] = {"fingerprint": fp, "generation": new["generation"]}
    return new


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


def _describe(name: str, a: dict) -> str:
    why = f"{name}: {a['install']} changed since its last run ({'; '.join(a['changed'])})"
    if a["others"]:
        why += f"; shared with {len(a['others'])} other install(s): {', '.join(a['others'])}"
    return why


def step(target, cache_dirs: dict[str, str], fp: dict, ctx: Context, force: bool = False,
         reason: str | None = None) -> StepResult:
    """Compares ``fp`` with this install's last fingerprint in the shared record beside each cache
    folder; clears those the rule above makes stale (all with ``force``); records ``fp``. ``reason``
    says why ``force`` is set."""
    fp = dict(fp)
    fp.setdefault("install", install_id(target))
    to_clear, why, notes, sizes, details, states = [], [], [], {}, {"caches": {}}, {}
    for name, d in cache_dirs.items():
        exists = os.path.isdir(d)
        sizes[name] = envmod.folder_size(d) if exists else 0
        states[name] = read_state(d)
        a = assess(states[name], fp)
        details["caches"][name] = {"path": d, "exists": exists, "bytes": sizes[name], "changed": a["changed"],
                                   "had_fingerprint": a["known"], "install": a["install"], "others": a["others"],
                                   "already_cleared": a["already_cleared"]}
        if a["already_cleared"]:
            notes.append(f"{name}: {a['install']} changed ({'; '.join(a['changed'])}), but another install "
                         "sharing the folder already had it cleared for that since")
        if exists and (force or a["stale"]):
            to_clear.append(name)
            if a["stale"]:
                why.append(_describe(name, a))
    if force and reason:
        why.insert(0, reason)
    note = (" (" + "; ".join(notes) + ")") if notes else ""
    sized = ", ".join(f"{n} cache {cache_dirs[n]} ({envmod.human_bytes(sizes[n])})" for n in to_clear)
    if ctx.check:
        if to_clear:
            return StepResult("caches", "todo", f"would clear {sized} ({'; '.join(why)})", None, details)
        return StepResult("caches", "ok", "caches match the current set-up" + _first_note(details, True) + note,
                          None, details)
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
    for name, d in cache_dirs.items():
        if any(x.startswith(name + ":") for x in refused):
            continue
        cleared_for = details["caches"][name]["changed"] if name in cleared else None
        try:
            write_state(d, record(states[name], fp, cleared_for))
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
    return StepResult("caches", "ok", "caches match the current set-up" + _first_note(details) + _shared_note(details)
                      + note, None, details)


def _shared_note(details: dict) -> str:
    others = sorted({o for c in details["caches"].values() for o in c["others"]})
    if not others:
        return ""
    return (f" (shared with {len(others)} other install(s), whose kernels are kept: {', '.join(others)})")


def _first_note(details: dict, check: bool = False) -> str:
    first = [n for n, c in details["caches"].items() if not c["had_fingerprint"] and c["exists"]]
    if not first:
        return ""
    install = details["caches"][first[0]]["install"]
    if check:
        return f" (no fingerprint yet for {install} beside the {', '.join(first)} cache: install.py records one)"
    return (f" (first run for {install}: fingerprint recorded; existing {', '.join(first)} cache kept, "
            "--clear-caches clears it)")
