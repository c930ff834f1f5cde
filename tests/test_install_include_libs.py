"""install.py step 2 (include/ and libs/ into the Python folder), on fake Windows trees."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fixtures.install_fakes import (Server, include_libs_zip, make_ctx, nupkg_bytes, portable_tree, snapshot,
                                    system_cpython, write_include_libs)
from tritonkit.installer import include_libs as il

REPO = Path(__file__).resolve().parents[1]
V = (3, 12, 7)


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def _lib_snapshot(py: Path) -> dict:
    return snapshot(py / "Lib")


def assert_installed(py: Path, minor: int = 12):
    assert (py / "include" / "Python.h").is_file()
    assert il.header_version(str(py / "include")) == (3, minor)
    assert (py / "libs" / f"python3{minor}.lib").read_bytes().startswith(b"!<arch>\n")
    assert not [n for n in os.listdir(py) if n.startswith(il.STAGING_PREFIX)]


def test_from_local_cpython_found_in_registry(tmp_path):
    py = portable_tree(tmp_path / "portable")
    lib_before = _lib_snapshot(py)
    cpy = system_cpython(tmp_path / "Python312")
    ctx = make_ctx(tmp_path, registry={("HKLM", r"Software\Python\PythonCore\3.12\InstallPath", ""): str(cpy)})
    r = il.step(str(py), V, "win32", ctx)
    assert r.status == "done", r.line()
    assert "local CPython" in r.message and str(cpy) in r.message
    assert_installed(py)
    assert _lib_snapshot(py) == lib_before  # 'Lib' (the standard library) is never touched
    assert (py / "Lib").is_dir() and (py / "libs").is_dir()


def test_local_cpython_in_usual_folder_and_py_launcher(tmp_path):
    ctx = make_ctx(tmp_path)
    usual = system_cpython(Path(ctx.env["LOCALAPPDATA"]) / "Programs" / "Python" / "Python312")
    launcher = system_cpython(tmp_path / "elsewhere" / "py312")
    system_cpython(tmp_path / "py311", minor=11)

    def run(argv, timeout=None):
        assert argv == ["py", "-0p"]
        return 0, (f" -V:3.13 *        {tmp_path}/py313/python.exe\n -V:3.12          {launcher}/python.exe\n"
                   f" -V:3.11          {tmp_path}/py311/python.exe\n")
    ctx.run = run
    found = il.local_cpythons(V, ctx)
    assert found == [str(launcher), str(usual)]


def test_wrong_version_local_cpython_is_skipped_and_nuget_used(tmp_path, server):
    py = portable_tree(tmp_path / "portable")
    cpy = system_cpython(tmp_path / "Python312", minor=11)  # registered as 3.12 but holds 3.11 headers
    server.serve_nuget({"3.12.7": nupkg_bytes(12, 7)})
    ctx = make_ctx(tmp_path, registry={("HKCU", r"Software\Python\PythonCore\3.12\InstallPath", ""): str(cpy)},
                   nuget_base=server.base)
    r = il.step(str(py), V, "win32", ctx)
    assert r.status == "done" and "NuGet" in r.message, r.line()
    assert_installed(py)
    assert server.hits == ["/python/3.12.7/python.3.12.7.nupkg"]


def test_from_nuget_newest_patch_when_exact_is_missing(tmp_path, server):
    py = portable_tree(tmp_path / "portable")
    server.serve_nuget({"3.11.9": nupkg_bytes(11, 9), "3.12.5": nupkg_bytes(12, 5), "3.12.8": nupkg_bytes(12, 8),
                        "3.12.10-rc1": b"not a release", "3.13.1": nupkg_bytes(13, 1)})
    ctx = make_ctx(tmp_path, nuget_base=server.base)
    r = il.step(str(py), (3, 12, 99), "win32", ctx)
    assert r.status == "done", r.line()
    assert "3.12.8" in r.message
    assert server.hits == ["/python/3.12.99/python.3.12.99.nupkg", "/python/index.json",
                           "/python/3.12.8/python.3.12.8.nupkg"]
    assert (py / "include" / "patchlevel.h").read_text().count("PY_MICRO_VERSION 8")
    assert not (py / "tools").exists() and not (py / "python.nuspec").exists()  # only include/ and libs/ taken


def test_unknown_patch_goes_straight_to_the_index(tmp_path, server):
    py = portable_tree(tmp_path / "portable")
    server.serve_nuget({"3.12.7": nupkg_bytes(12, 7)})
    r = il.step(str(py), (3, 12, None), "win32", make_ctx(tmp_path, nuget_base=server.base))
    assert r.status == "done"
    assert server.hits[0] == "/python/index.json"


def test_wrong_minor_refused(tmp_path):
    py = portable_tree(tmp_path / "portable")
    src = write_include_libs(tmp_path / "src311", 3, 11, 9)
    before = snapshot(py)
    r = il.step(str(py), V, "win32", make_ctx(tmp_path), source=str(src))
    assert r.status == "failed"
    assert "Python 3.11, not 3.12" in r.message
    assert "--include-libs-from" in r.fix
    assert snapshot(py) == before


def test_nuget_package_of_wrong_minor_refused(tmp_path, server):
    py = portable_tree(tmp_path / "portable")
    server.routes["/python/3.12.7/python.3.12.7.nupkg"] = nupkg_bytes(11, 9)  # mislabelled
    server.routes["/python/index.json"] = b'{"versions": ["3.12.7"]}'
    before = snapshot(py)
    r = il.step(str(py), V, "win32", make_ctx(tmp_path, nuget_base=server.base))
    assert r.status == "failed" and "not 3.12" in r.message
    assert snapshot(py) == before


@pytest.mark.parametrize("kind", ["corrupt", "truncated"])
def test_bad_download_leaves_nothing(tmp_path, server, kind):
    py = portable_tree(tmp_path / "portable")
    good = nupkg_bytes()
    if kind == "corrupt":
        bad = bytearray(good)
        bad[len(bad) // 3: len(bad) // 3 + 200] = os.urandom(200)  # damaged in the middle, length intact
        server.routes["/python/3.12.7/python.3.12.7.nupkg"] = bytes(bad)
    else:
        server.routes["/python/3.12.7/python.3.12.7.nupkg"] = ("truncate", good[: len(good) // 2], len(good))
    before = snapshot(py)
    r = il.step(str(py), V, "win32", make_ctx(tmp_path, nuget_base=server.base))
    assert r.status == "failed", r.line()
    text = r.message.lower()
    assert any(w in text for w in ("damaged", "corrupt", "truncated", "broke off", "crc")), r.message
    assert "--include-libs-from" in r.fix
    assert snapshot(py) == before  # no include/, no libs/, no staging folder


def test_not_a_zip_at_all(tmp_path, server):
    py = portable_tree(tmp_path / "portable")
    server.routes["/python/3.12.7/python.3.12.7.nupkg"] = b"<html>captive portal</html>"
    r = il.step(str(py), V, "win32", make_ctx(tmp_path, nuget_base=server.base))
    assert r.status == "failed" and "not a valid zip" in r.message
    assert not (py / "include").exists()


@pytest.mark.parametrize("evil", ["tools/include/../../../escaped.txt", "../escaped.txt", "/abs/escaped.txt",
                                  "C:/escaped.txt", "tools\\..\\..\\escaped.txt"])
def test_zip_slip_refused(tmp_path, server, evil):
    py = portable_tree(tmp_path / "portable")
    server.serve_nuget({"3.12.7": nupkg_bytes(extra={evil: "pwned"})})
    ctx = make_ctx(tmp_path, nuget_base=server.base)
    before = snapshot(tmp_path)
    r = il.step(str(py), V, "win32", ctx)
    assert r.status == "failed" and "escapes its folder" in r.message, r.line()
    assert snapshot(tmp_path) == before
    assert not any(p.name == "escaped.txt" for p in tmp_path.parent.rglob("escaped.txt"))


def test_zip_with_symlink_entry_refused(tmp_path):
    py = portable_tree(tmp_path / "portable")
    z = tmp_path / "links.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("include/Python.h", '#include "patchlevel.h"\n')
        zf.writestr("include/patchlevel.h", "#define PY_MAJOR_VERSION 3\n#define PY_MINOR_VERSION 12\n")
        info = zipfile.ZipInfo("libs/python312.lib")
        info.external_attr = (0o120777 << 16)
        zf.writestr(info, "/etc/passwd")
    r = il.step(str(py), V, "win32", make_ctx(tmp_path), source=str(z))
    assert r.status == "failed" and "symbolic link" in r.message
    assert not (py / "libs").exists()


def test_from_url_and_from_zip_file_and_nupkg_folder(tmp_path, server):
    server.routes["/dl/python_3.12.7_include_libs.zip"] = include_libs_zip(12, 7)
    a = portable_tree(tmp_path / "a")
    r = il.step(str(a), V, "win32", make_ctx(tmp_path), source=server.base + "/dl/python_3.12.7_include_libs.zip")
    assert r.status == "done", r.line()
    assert_installed(a)
    b = portable_tree(tmp_path / "b")
    zp = tmp_path / "inc.zip"
    zp.write_bytes(include_libs_zip(12, 2, top="python_3.12.2_include_libs/"))
    assert il.step(str(b), V, "win32", make_ctx(tmp_path), source=str(zp)).status == "done"
    assert_installed(b)
    c = portable_tree(tmp_path / "c")
    unpacked = tmp_path / "unpacked"
    with zipfile.ZipFile(__import__("io").BytesIO(nupkg_bytes())) as zf:
        zf.extractall(unpacked)
    assert il.step(str(c), V, "win32", make_ctx(tmp_path), source=str(unpacked)).status == "done"
    assert_installed(c)


def test_missing_source_and_http_404(tmp_path, server):
    py = portable_tree(tmp_path / "portable")
    r = il.step(str(py), V, "win32", make_ctx(tmp_path), source=str(tmp_path / "nope"))
    assert r.status == "failed" and "no such file or folder" in r.message
    r = il.step(str(py), V, "win32", make_ctx(tmp_path), source=server.base + "/missing.zip")
    assert r.status == "failed" and "HTTP 404" in r.message


def test_second_run_is_a_noop(tmp_path):
    py = portable_tree(tmp_path / "portable")
    src = write_include_libs(tmp_path / "src")
    assert il.step(str(py), V, "win32", make_ctx(tmp_path), source=str(src)).status == "done"
    after_first = snapshot(tmp_path / "portable")
    r = il.step(str(py), V, "win32", make_ctx(tmp_path), source=str(src))
    assert r.status == "ok", r.line()
    r = il.step(str(py), V, "win32", make_ctx(tmp_path))
    assert r.status == "ok"
    assert snapshot(tmp_path / "portable") == after_first


def test_wrong_existing_folders_are_moved_aside_not_deleted(tmp_path):
    py = portable_tree(tmp_path / "portable")
    write_include_libs(py, 3, 11, 4)  # someone copied Python 3.11's folders
    src = write_include_libs(tmp_path / "src")
    r = il.step(str(py), V, "win32", make_ctx(tmp_path), source=str(src))
    assert r.status == "done"
    assert_installed(py)
    assert il.header_version(str(py / ("include" + il.OLD_SUFFIX))) == (3, 11)
    assert (py / ("libs" + il.OLD_SUFFIX) / "python311.lib").is_file()


def test_check_mode_reports_and_writes_nothing(tmp_path):
    py = portable_tree(tmp_path / "portable")
    ctx = make_ctx(tmp_path, check=True)
    src = write_include_libs(tmp_path / "src")
    before = snapshot(tmp_path)
    r = il.step(str(py), V, "win32", ctx, source=str(src))
    assert r.status == "todo" and "no Python.h" in r.message
    assert snapshot(tmp_path) == before


KILLER = r"""
import os, signal, sys
sys.path.insert(0, {tests!r})
import conftest  # the 'tritonkit' package
from fixtures.install_fakes import make_ctx
from pathlib import Path
from tritonkit.installer import include_libs as il
def die(staging):
    assert os.path.isdir(os.path.join(staging, "include"))
    os.kill(os.getpid(), signal.SIGKILL)  # killed between extract and rename
il.step({py!r}, (3, 12, 7), "win32", make_ctx(Path({tmp!r})), source={src!r}, on_staged=die)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_interrupted_install_leaves_old_state_usable(tmp_path):
    py = portable_tree(tmp_path / "portable")
    write_include_libs(py, 3, 12, 1)
    (py / "libs" / "python312.lib").unlink()  # a half-done hand install: include right, libs incomplete
    before = snapshot(py)
    src = write_include_libs(tmp_path / "src", 3, 12, 7)
    code = KILLER.format(tests=str(REPO / "tests"), py=str(py), tmp=str(tmp_path), src=str(src))
    p = subprocess.run([sys.executable, "-c", code], cwd=str(REPO), capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, p.stderr
    stale = [n for n in os.listdir(py) if n.startswith(il.STAGING_PREFIX)]
    assert len(stale) == 1  # the killed run's staging folder is all that changed
    after = snapshot(py)
    assert {k: v for k, v in after.items() if not k.startswith(il.STAGING_PREFIX)} == before
    assert il.header_version(str(py / "include")) == (3, 12)  # the old include is intact and usable
    r = il.step(str(py), V, "win32", make_ctx(tmp_path), source=str(src))
    assert r.status == "done" and "leftover staging" in r.message
    assert_installed(py)
    assert "PY_MICRO_VERSION 7" in (py / "include" / "patchlevel.h").read_text()


def test_read_only_target_gives_a_clear_error(tmp_path, monkeypatch):
    py = portable_tree(tmp_path / "portable")
    src = write_include_libs(tmp_path / "src")
    if os.geteuid() == 0:
        # root ignores permission bits: make the staging folder creation fail the way a read-only folder does
        def denied(folder):
            raise PermissionError(13, "Permission denied", os.path.join(folder, il.STAGING_PREFIX + "x"))
        monkeypatch.setattr(il, "make_staging", denied)
    else:
        os.chmod(py, 0o555)
    try:
        r = il.step(str(py), V, "win32", make_ctx(tmp_path), source=str(src))
    finally:
        os.chmod(py, 0o755)
    assert r.status == "failed"
    assert "cannot write into" in r.message and "Permission denied" in r.message
    assert "as a user who can write" in r.fix
    assert not (py / "include").exists()


def test_posix_python_headers(tmp_path):
    prefix = tmp_path / "usr"
    inc = prefix / "include" / "python3.12"
    r = il.step(str(prefix), V, "linux", make_ctx(tmp_path, platform="linux"))
    assert r.status == "failed" and "python3.12-dev" in r.fix
    inc.mkdir(parents=True)
    (inc / "Python.h").write_text("")
    assert il.step(str(prefix), V, "linux", make_ctx(tmp_path, platform="linux")).status == "ok"
