"""install.py step 1: which Python, of which kind, on fake Windows and POSIX trees."""
from __future__ import annotations

import sys

import pytest

from fixtures.install_fakes import add_dist, make_ctx, portable_tree, system_cpython
from tritonkit.installer import pyfolder


def test_portable_embedded_python(tmp_path):
    py = portable_tree(tmp_path / "ComfyUI_windows_portable")
    ctx = make_ctx(tmp_path, platform="linux")  # a Windows tree examined from Linux: never run
    t = pyfolder.from_folder(str(py), ctx)
    assert t.platform == "win32" and t.kind == "embedded" and t.embedded
    assert t.version == (3, 12, 7)  # minor from python312.dll's name, patch from its PE version resource
    assert t.folder == t.base_folder == str(py)
    assert str(py / "Lib" / "site-packages") in t.site_packages
    assert str(tmp_path / "ComfyUI_windows_portable" / "ComfyUI") in t.site_packages  # from the ._pth
    assert ctx.commands == []
    r = pyfolder.describe(t)
    assert r.status == "ok" and "Python 3.12.7 (embedded)" in r.message


def test_framepack_system_python_and_pth_only(tmp_path):
    py = tmp_path / "FramePack" / "system" / "python"
    py.mkdir(parents=True)
    (py / "python.exe").write_bytes(b"MZ")
    (py / "python310._pth").write_text("python310.zip\n.\n")
    t = pyfolder.from_folder(str(py), make_ctx(tmp_path, platform="linux"))
    assert t.kind == "embedded" and t.version == (3, 10, None)


def test_system_user_conda_venv_msstore(tmp_path):
    ctx = make_ctx(tmp_path, platform="linux")
    sysdir = system_cpython(tmp_path / "Python312")
    t = pyfolder.from_folder(str(sysdir / "python.exe"), ctx)  # python.exe itself is accepted too
    assert t.kind == "system" and t.version[:2] == (3, 12)

    user = system_cpython(tmp_path / "Users" / "me" / "AppData" / "Local" / "Programs" / "Python" / "Python312")
    assert pyfolder.from_folder(str(user), ctx).kind == "user"

    conda = tmp_path / "miniconda3" / "envs" / "comfy"
    system_cpython(conda, minor=11)
    (conda / "conda-meta").mkdir()
    t = pyfolder.from_folder(str(conda), ctx)
    assert t.kind == "conda" and t.base_folder == str(conda) and t.version[:2] == (3, 11)

    venv = tmp_path / "venv"
    (venv / "Scripts").mkdir(parents=True)
    (venv / "Scripts" / "python.exe").write_bytes(b"MZ")
    (venv / "Lib" / "site-packages").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {sysdir}\ninclude-system-site-packages = false\nversion = 3.12.7\n")
    for given in (venv, venv / "Scripts"):
        t = pyfolder.from_folder(str(given), ctx)
        assert t.kind == "venv" and t.version == (3, 12, 7)
        assert t.base_folder == str(sysdir)  # include/libs and the DLLs belong to the base installation
        assert t.site_packages == [str(venv / "Lib" / "site-packages")]

    store = tmp_path / "Program Files" / "WindowsApps" / "PythonSoftwareFoundation.Python.3.12_3.12.2032.0_x64"
    system_cpython(store)
    t = pyfolder.from_folder(str(store), ctx)
    assert t.kind == "msstore"
    r = pyfolder.describe(t)
    assert r.status == "warn" and "Microsoft Store" in r.message and r.fix


def test_posix_prefix(tmp_path):
    prefix = tmp_path / "env"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python3").write_text("#!/bin/false\n")
    (prefix / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    add_dist(prefix / "lib" / "python3.11" / "site-packages", "torch", "2.6.0")
    t = pyfolder.from_folder(str(prefix), make_ctx(tmp_path, platform="linux"))
    assert t.platform != "win32" and t.version[:2] == (3, 11)
    assert t.include_dir == str(prefix / "include" / "python3.11")


def test_probe_is_used_when_the_python_runs_here(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python3").write_text("")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.9.1\n")

    def run(argv, timeout=None):
        return 0, ('{"version": [3, 12, 3], "prefix": "%s", "base_prefix": "/opt/py312", "executable": "x", '
                   '"path": ["%s"], "include": "/opt/py312/include/python3.12"}' % (venv, tmp_path))
    t = pyfolder.from_folder(str(venv), make_ctx(tmp_path, platform="linux", run=run))
    assert t.version == (3, 12, 3) and t.base_folder == "/opt/py312" and t.site_packages == [str(tmp_path)]


def test_errors_say_what_to_do(tmp_path):
    ctx = make_ctx(tmp_path, platform="linux")
    with pytest.raises(pyfolder.TargetError, match="no such folder"):
        pyfolder.from_folder(str(tmp_path / "missing"), ctx)
    (tmp_path / "empty").mkdir()
    with pytest.raises(pyfolder.TargetError, match="no python.exe"):
        pyfolder.from_folder(str(tmp_path / "empty"), ctx)
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "python.exe").write_bytes(b"MZ")
    with pytest.raises(pyfolder.TargetError, match="cannot tell which Python version"):
        pyfolder.from_folder(str(tmp_path / "odd"), ctx)


def test_running_interpreter():
    t = pyfolder.from_running()
    assert t.running and t.version == tuple(sys.version_info[:3])
    assert t.exe == sys.executable and t.site_packages
