"""install.py step 3: vcredist DLL versions read from real PE version resources (fixtures built by
tests/fixtures/vcredist/make_fixtures.sh with mingw-w64)."""
from __future__ import annotations

import shutil
from pathlib import Path

from fixtures.install_fakes import DLL_NEW, DLL_OLD, PY312_DLL, make_ctx, portable_tree, snapshot
from tritonkit.installer import vcredist


def system32(tmp_path: Path, dll: Path | None = DLL_NEW, names=vcredist.DLLS) -> Path:
    d = tmp_path / "Windows" / "System32"
    d.mkdir(parents=True)
    if dll is not None:
        for n in names:
            shutil.copy(dll, d / n)
    return d


def test_pe_versions_of_the_fixtures(tmp_path):
    assert vcredist.pe_file_version(str(DLL_OLD)) == (14, 29, 30133, 0)
    assert vcredist.pe_file_version(str(DLL_NEW)) == (14, 44, 35211, 0)
    assert vcredist.pe_file_version(str(PY312_DLL)) == (3, 12, 7150, 1013)
    (tmp_path / "junk.dll").write_bytes(b"MZ not really a PE file")
    assert vcredist.pe_file_version(str(tmp_path / "junk.dll")) is None
    assert vcredist.pe_file_version(str(tmp_path / "absent.dll")) is None


def test_old_dlls_explained_then_fixed_with_backup(tmp_path):
    py = portable_tree(tmp_path / "p", vcredist=DLL_OLD)
    ctx = make_ctx(tmp_path, system32=str(system32(tmp_path)))
    before = snapshot(py)
    r = vcredist.step(str(py), "win32", ctx)
    assert r.status == "failed"
    assert "vcruntime140.dll 14.29.30133.0" in r.message and "older than 14.42" in r.message
    assert "libtriton" in r.message and "--fix-vcredist" in r.fix
    assert snapshot(py) == before

    check = vcredist.step(str(py), "win32", make_ctx(tmp_path, system32=ctx.system32, check=True), fix=True)
    assert check.status == "todo" and snapshot(py) == before

    r = vcredist.step(str(py), "win32", ctx, fix=True)
    assert r.status == "done", r.line()
    for n in ("vcruntime140.dll", "vcruntime140_1.dll"):
        assert vcredist.pe_file_version(str(py / n))[:2] == (14, 44)
        assert vcredist.pe_file_version(str(py / vcredist.BACKUP_DIR / n))[:2] == (14, 29)
    assert not (py / "msvcp140.dll").exists()  # only DLLs the folder had are replaced
    assert not list(py.glob("*.tritonkit-new"))
    again = vcredist.step(str(py), "win32", ctx, fix=True)
    assert again.status == "ok" and "14.44" in again.message


def test_old_in_python_folder_and_old_in_system32_points_to_installer(tmp_path):
    py = portable_tree(tmp_path / "p", vcredist=DLL_OLD)
    ctx = make_ctx(tmp_path, system32=str(system32(tmp_path, DLL_OLD)))
    r = vcredist.step(str(py), "win32", ctx, fix=True)
    assert r.status == "failed" and "vc_redist" in r.fix and "aka.ms" in r.fix
    assert vcredist.pe_file_version(str(py / "vcruntime140.dll"))[:2] == (14, 29)


def test_missing_in_system32(tmp_path):
    py = portable_tree(tmp_path / "p", vcredist=None)
    r = vcredist.step(str(py), "win32", make_ctx(tmp_path, system32=str(system32(tmp_path, None))))
    assert r.status == "failed" and "missing" in r.message and "vc_redist.x64.exe" in r.fix


def test_new_enough_everywhere(tmp_path):
    py = portable_tree(tmp_path / "p", vcredist=DLL_NEW)
    r = vcredist.step(str(py), "win32", make_ctx(tmp_path, system32=str(system32(tmp_path))))
    assert r.status == "ok" and "msvcp140.dll 14.44.35211.0 (System32)" in r.message


def test_not_windows_and_no_system32(tmp_path):
    assert vcredist.step(str(tmp_path), "linux", make_ctx(tmp_path)).status == "skipped"
    py = portable_tree(tmp_path / "p", vcredist=None)
    assert vcredist.step(str(py), "win32", make_ctx(tmp_path, platform="linux")).status == "skipped"


def test_missing_pefile_is_a_clear_failure(tmp_path, monkeypatch):
    py = portable_tree(tmp_path / "p", vcredist=DLL_OLD)
    monkeypatch.setattr(vcredist, "have_pefile", lambda: False)
    r = vcredist.step(str(py), "win32", make_ctx(tmp_path, system32=str(system32(tmp_path))), fix=True)
    assert r.status == "failed" and "pefile" in r.message and "pip install pefile" in r.fix
    assert vcredist.pe_file_version(str(py / "vcruntime140.dll"))[:2] == (14, 29)  # untouched
