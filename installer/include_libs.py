"""Step 2: ``include`` and ``libs`` in the Python folder.

Triton builds a small C launcher against the Python it runs in, so it needs ``include\\Python.h``
and ``libs\\python3XY.lib`` there; the embedded Python of ComfyUI's portable build has neither.
(It is ``libs``, not ``Lib``: ``Lib`` holds the standard library and is never touched.)

Sources, in order: ``--include-libs-from PATH|URL``; a full CPython of the same major.minor on
the machine; the official CPython package on NuGet. Every source is verified before anything is
installed (Python.h's version, ``python3XY.lib``, no archive entry escaping its root), and the two
folders are assembled in a staging folder beside their destination and renamed into place."""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import PurePosixPath

from .common import Context, StepResult

STAGING_PREFIX = ".tritonkit-staging-"
OLD_SUFFIX = ".tritonkit-old"
LIB_MAGIC = b"!<arch>\n"  # an MSVC import library is a COFF archive


class SourceError(Exception):
    """A source of include/libs that can't be used; the message says why."""


# ---------------------------------------------------------------------------- verification

def header_version(include_dir: str) -> tuple[int, int] | None:
    """PY_MAJOR_VERSION / PY_MINOR_VERSION of the headers (defined in patchlevel.h, which Python.h includes)."""
    found = {}
    for name in ("patchlevel.h", "Python.h"):
        try:
            with open(os.path.join(include_dir, name), encoding="latin-1") as f:
                text = f.read()
        except OSError:
            continue
        for key in ("MAJOR", "MINOR"):
            m = re.search(rf"^\s*#\s*define\s+PY_{key}_VERSION\s+(\d+)", text, re.MULTILINE)
            if m and key not in found:
                found[key] = int(m.group(1))
    return (found["MAJOR"], found["MINOR"]) if len(found) == 2 else None


def lib_name(version: tuple) -> str:
    return f"python{version[0]}{version[1]}.lib"


def problems(include_dir: str, libs_dir: str, version: tuple) -> list[str]:
    """What is wrong with an include/libs pair for Python ``version`` (empty when it is right)."""
    out = []
    if not os.path.isfile(os.path.join(include_dir, "Python.h")):
        out.append(f"no Python.h in {include_dir}")
    else:
        hv = header_version(include_dir)
        if hv is None:
            out.append(f"{include_dir}: Python.h/patchlevel.h don't define PY_MAJOR_VERSION/PY_MINOR_VERSION")
        elif hv != tuple(version[:2]):
            out.append(f"{include_dir} holds the headers of Python {hv[0]}.{hv[1]}, not {version[0]}.{version[1]} "
                       "(the minor version must match; the patch may differ)")
    lib = os.path.join(libs_dir, lib_name(version))
    if not os.path.isfile(lib):
        out.append(f"no {lib_name(version)} in {libs_dir}")
    else:
        with open(lib, "rb") as f:
            if f.read(len(LIB_MAGIC)) != LIB_MAGIC:
                out.append(f"{lib} is not an import library (damaged or truncated)")
    return out


def status(folder: str, version: tuple) -> list[str]:
    return problems(os.path.join(folder, "include"), os.path.join(folder, "libs"), version)


# ---------------------------------------------------------------------------- archives

def _member_path(name: str) -> PurePosixPath:
    """The entry's path inside the archive; SourceError when it would land outside its root."""
    norm = name.replace("\\", "/")
    p = PurePosixPath(norm)
    if norm.startswith("/") or re.match(r"^[A-Za-z]:", norm) or ".." in p.parts or "\x00" in norm:
        raise SourceError(f"the archive has an entry that escapes its folder ({name!r}); refusing to use it")
    return p


def _zip_layout(zf: zipfile.ZipFile) -> str:
    """The folder inside the archive that holds include/ and libs/ ('' or e.g. 'tools/')."""
    names = [_member_path(i.filename) for i in zf.infolist()]  # validates every entry first
    heads = sorted((p for p in names if p.parts[-2:] == ("include", "Python.h")), key=lambda p: len(p.parts))
    if not heads:
        raise SourceError("the archive has no include/Python.h (expected the NuGet 'python' package layout "
                          "tools/include + tools/libs, or include/ + libs/ at its top)")
    parent = heads[0].parent.parent
    return "" if str(parent) == "." else str(parent) + "/"


def extract_include_libs(zip_path: str, dest: str) -> None:
    """Extracts ``<root>/include`` and ``<root>/libs`` of an archive into ``dest``/include and ``dest``/libs."""
    try:
        zf = zipfile.ZipFile(zip_path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise SourceError(f"{zip_path} is not a valid zip archive ({exc}): the download is corrupt or truncated")
    with zf:
        prefix = _zip_layout(zf)
        try:
            bad = zf.testzip()
        except Exception as exc:  # BadZipFile, zlib.error, EOFError...: the data is damaged
            raise SourceError(f"{zip_path} is damaged ({type(exc).__name__}: {exc}): the download is corrupt "
                              "or truncated")
        if bad is not None:
            raise SourceError(f"{zip_path} is damaged (CRC error in {bad})")
        for info in zf.infolist():
            rel = str(_member_path(info.filename))
            for sub in ("include", "libs"):
                head = f"{prefix}{sub}/"
                if not rel.startswith(head) and rel + "/" != head:
                    continue
                if (info.external_attr >> 16) & 0o170000 == 0o120000:
                    raise SourceError(f"the archive has a symbolic link ({info.filename}); refusing to use it")
                target = os.path.join(dest, sub, *PurePosixPath(rel[len(head):]).parts) if rel + "/" != head \
                    else os.path.join(dest, sub)
                if info.is_dir() or rel + "/" == head:
                    os.makedirs(target, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with zf.open(info) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)


def copy_include_libs(include_src: str, libs_src: str, dest: str) -> None:
    shutil.copytree(include_src, os.path.join(dest, "include"), symlinks=False)
    os.makedirs(os.path.join(dest, "libs"), exist_ok=True)
    for name in os.listdir(libs_src):
        src = os.path.join(libs_src, name)
        if os.path.isfile(src):
            shutil.copy2(src, os.path.join(dest, "libs", name))


def dir_layout(root: str) -> tuple[str, str] | None:
    """(include, libs) of a folder laid out as a CPython install or an unpacked NuGet package."""
    for base in (root, os.path.join(root, "tools")):
        inc, libs = os.path.join(base, "include"), os.path.join(base, "libs")
        if os.path.isfile(os.path.join(inc, "Python.h")) and os.path.isdir(libs):
            return inc, libs
    return None


# ---------------------------------------------------------------------------- network

def download(url: str, dest: str, timeout: float, log=lambda m: None) -> None:
    """Downloads ``url`` to ``dest`` with the standard library only; SourceError when it fails or
    comes back shorter than announced."""
    log(f"downloading {url}")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(dest, "wb") as out:
            expected = resp.headers.get("Content-Length")
            got = 0
            while True:
                chunk = resp.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
                got += len(chunk)
    except urllib.error.HTTPError as exc:
        raise SourceError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SourceError(f"{url}: download failed ({type(exc).__name__}: {reason})") from exc
    except Exception as exc:  # http.client.IncompleteRead and friends: the connection broke mid-way
        raise SourceError(f"{url}: download broke off ({type(exc).__name__}: {exc})") from exc
    if expected is not None and got != int(expected):
        raise SourceError(f"{url}: truncated download ({got} of {expected} bytes)")


def nuget_versions(base: str, timeout: float) -> list[str]:
    url = f"{base.rstrip('/')}/python/index.json"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return list(json.loads(resp.read().decode("utf-8"))["versions"])
    except Exception as exc:
        raise SourceError(f"{url}: cannot list the NuGet versions of 'python' ({type(exc).__name__}: {exc})") from exc


def newest_patch(versions: list[str], version: tuple) -> str | None:
    best = None
    for v in versions:
        m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", v)  # releases only, no -rc/-beta
        if m and (int(m.group(1)), int(m.group(2))) == tuple(version[:2]):
            if best is None or int(m.group(3)) > best[0]:
                best = (int(m.group(3)), v)
    return best[1] if best else None


def nuget_url(base: str, version: str) -> str:
    return f"{base.rstrip('/')}/python/{version}/python.{version}.nupkg"


# ---------------------------------------------------------------------------- local CPython

def local_cpythons(version: tuple, ctx: Context, exclude: str | None = None) -> list[str]:
    """Folders of full CPython installs of this major.minor: registry PythonCore, the py launcher's
    list, the usual install folders. Only those with include/ and libs/ are kept."""
    mm = f"{version[0]}.{version[1]}"
    xy = f"{version[0]}{version[1]}"
    cands = []
    for hive in ("HKCU", "HKLM"):
        for tag in (mm, f"{mm}-64"):
            p = ctx.read_registry(hive, rf"Software\Python\PythonCore\{tag}\InstallPath", "")
            if p:
                cands.append(str(p))
    if ctx.platform == "win32" and ctx.run is not None:
        rc, out = ctx.run(["py", "-0p"], timeout=30)
        if rc == 0:
            for line in out.splitlines():
                m = re.match(r"^\s*-V:(\d+)\.(\d+)\S*\s+\*?\s*(.+?)\s*$", line)
                if m and (int(m.group(1)), int(m.group(2))) == tuple(version[:2]):
                    cands.append(os.path.dirname(m.group(3)))
    env = ctx.env
    drive = env.get("SystemDrive") or ("C:" if ctx.platform == "win32" else None)
    for root, sub in ((drive and drive + os.sep, f"Python{xy}"),
                      (env.get("ProgramFiles"), f"Python{xy}"),
                      (env.get("LOCALAPPDATA") and os.path.join(env["LOCALAPPDATA"], "Programs", "Python"),
                       f"Python{xy}")):
        if root:
            cands.append(os.path.join(root, sub))
    out, seen = [], set()
    for c in cands:
        key = os.path.normcase(os.path.abspath(c))
        if key in seen or (exclude and key == os.path.normcase(os.path.abspath(exclude))):
            continue
        seen.add(key)
        lay = dir_layout(c)
        if lay and not problems(lay[0], lay[1], version):
            out.append(c)
    return out


# ---------------------------------------------------------------------------- install

def clean_stale(folder: str) -> list[str]:
    """Removes staging folders a killed run left behind (only ours, by name)."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for n in names:
        p = os.path.join(folder, n)
        if n.startswith(STAGING_PREFIX) and os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def make_staging(folder: str) -> str:
    return tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=folder)


def install_from_staging(folder: str, staging: str, version: tuple, on_staged=None) -> None:
    """Verifies ``staging``/include + libs, then renames them into ``folder``; existing wrong ones
    are moved aside to ``include.tritonkit-old`` / ``libs.tritonkit-old``, not deleted."""
    bad = problems(os.path.join(staging, "include"), os.path.join(staging, "libs"), version)
    if bad:
        raise SourceError("; ".join(bad))
    if on_staged is not None:
        on_staged(staging)
    for sub in ("include", "libs"):  # never 'Lib': that is the standard library
        dst = os.path.join(folder, sub)
        old = dst + OLD_SUFFIX
        if os.path.lexists(dst):
            if os.path.lexists(old):
                shutil.rmtree(old) if os.path.isdir(old) and not os.path.islink(old) else os.remove(old)
            os.replace(dst, old)
        os.replace(os.path.join(staging, sub), dst)


def _fetch_source(source: str, staging: str, version: tuple, ctx: Context) -> str:
    """Fills ``staging`` with include/ and libs/ from ``source`` (a folder, a zip/nupkg file or a URL);
    returns a description of the source."""
    if re.match(r"^https?://", source):
        archive = os.path.join(staging, "download.zip")
        download(source, archive, ctx.download_timeout, ctx.log)
        extract_include_libs(archive, staging)
        os.remove(archive)
        return source
    if os.path.isdir(source):
        lay = dir_layout(source)
        if lay is None:
            raise SourceError(f"{source} has no include/Python.h + libs/ (nor tools/include + tools/libs)")
        copy_include_libs(lay[0], lay[1], staging)
        return source
    if os.path.isfile(source):
        extract_include_libs(source, staging)
        return source
    raise SourceError(f"{source}: no such file or folder")


def _nuget(staging: str, version: tuple, ctx: Context) -> str:
    tried = []
    if len(version) > 2 and version[2] is not None:
        exact = f"{version[0]}.{version[1]}.{version[2]}"
        url = nuget_url(ctx.nuget_base, exact)
        try:
            return _fetch_source(url, staging, version, ctx)
        except SourceError as exc:
            if "HTTP 404" not in str(exc):
                raise
            tried.append(exact)
    newest = newest_patch(nuget_versions(ctx.nuget_base, ctx.download_timeout), version)
    if newest is None or newest in tried:
        raise SourceError(f"NuGet has no 'python' package for {version[0]}.{version[1]}"
                          + (f" (tried {', '.join(tried)})" if tried else ""))
    return _fetch_source(nuget_url(ctx.nuget_base, newest), staging, version, ctx)


def _remove_staging(staging: str) -> None:
    shutil.rmtree(staging, ignore_errors=True)


def step(folder: str, version: tuple, platform: str, ctx: Context, source: str | None = None,
         include_dir: str | None = None, on_staged=None) -> StepResult:
    if platform != "win32":
        inc = include_dir or os.path.join(folder, "include", f"python{version[0]}.{version[1]}")
        if os.path.isfile(os.path.join(inc, "Python.h")):
            return StepResult("include/libs", "ok", f"Python.h found in {inc} (POSIX needs no libs/)")
        return StepResult("include/libs", "failed", f"no Python.h in {inc}: Triton can't build its launcher",
                          f"install the Python headers (Debian/Ubuntu: apt install python{version[0]}.{version[1]}"
                          f"-dev; Fedora: dnf install python{version[0]}-devel)")
    bad = status(folder, version)
    if not bad and source is None:
        return StepResult("include/libs", "ok", f"{folder}\\include and libs\\{lib_name(version)} are there "
                          f"and match Python {version[0]}.{version[1]}")
    if not bad and source is not None:
        return StepResult("include/libs", "ok", f"{folder}\\include and libs already match Python "
                          f"{version[0]}.{version[1]}; --include-libs-from not needed")
    why = "; ".join(bad)
    if ctx.check:
        return StepResult("include/libs", "todo", why, "install.py (without --check) installs them")
    if not ctx.confirm(f"Install include/ and libs/ for Python {version[0]}.{version[1]} into {folder}?"):
        return StepResult("include/libs", "skipped", why + "; you declined", "run install.py --yes")
    stale = clean_stale(folder)
    sources: list[tuple[str, object]] = []
    if source:
        sources.append(("--include-libs-from", source))
    else:
        for c in local_cpythons(version, ctx, exclude=folder):
            sources.append(("local CPython", c))
        sources.append(("NuGet", None))
    errors = []
    for label, src in sources:
        try:
            staging = make_staging(folder)
        except OSError as exc:
            return StepResult("include/libs", "failed", f"cannot write into {folder} ({exc.strerror or exc})",
                              "run install.py as a user who can write to that folder (or move ComfyUI out of "
                              "a protected folder such as Program Files)", {"errors": errors})
        try:
            desc = _nuget(staging, version, ctx) if src is None else _fetch_source(str(src), staging, version, ctx)
            install_from_staging(folder, staging, version, on_staged)
        except SourceError as exc:
            errors.append(f"{label}: {exc}")
            _remove_staging(staging)
            if label == "--include-libs-from":
                break
            continue
        except OSError as exc:
            _remove_staging(staging)
            return StepResult("include/libs", "failed", f"could not write include/libs into {folder} "
                              f"({exc.strerror or exc}: {getattr(exc, 'filename', '')})",
                              "check the folder's permissions and free space, then run install.py again",
                              {"errors": errors})
        _remove_staging(staging)
        note = f" (cleaned {len(stale)} leftover staging folder(s))" if stale else ""
        return StepResult("include/libs", "done", f"installed include/ and libs/ for Python "
                          f"{version[0]}.{version[1]} into {folder} from {label} {desc}{note}",
                          None, {"source": desc, "errors": errors})
    return StepResult("include/libs", "failed", f"{why}; no usable source: " + " | ".join(errors),
                      "download python_3.X.Y_include_libs.zip for your Python (see the README) and run "
                      "install.py --include-libs-from <that zip or folder>", {"errors": errors})
