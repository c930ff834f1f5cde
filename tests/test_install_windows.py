"""install.py steps 6 (long paths, with a faked registry) and 7 (the ten Windows hand-patches of seed 003)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.install_fakes import add_dist, make_ctx
from tritonkit.installer import longpaths, windows_fixes as wf

KEY = ("HKLM", longpaths.KEY, "LongPathsEnabled")


def test_long_paths_on(tmp_path):
    r = longpaths.step("win32", make_ctx(tmp_path, registry={KEY: 1}), str(tmp_path))
    assert r.status == "ok"
    assert not (tmp_path / longpaths.SETTINGS_FILE).exists()


def test_long_paths_off_sets_short_caches_and_says_how(tmp_path):
    pack = tmp_path / "pack"
    pack.mkdir()
    ctx = make_ctx(tmp_path, registry={KEY: 0})
    chk = longpaths.step("win32", make_ctx(tmp_path, registry={KEY: 0}, check=True), str(pack))
    assert chk.status == "todo" and not (pack / longpaths.SETTINGS_FILE).exists()
    r = longpaths.step("win32", ctx, str(pack))
    assert r.status == "done" and "WinError 206" in r.message
    assert "LongPathsEnabled -Value 1" in r.fix and "reboot" in r.fix
    s = json.loads((pack / longpaths.SETTINGS_FILE).read_text())
    short = Path(ctx.env["LOCALAPPDATA"]) / "tk"
    assert s == {"triton_cache_dir": str(short / "t"), "inductor_cache_dir": str(short / "i")}
    assert longpaths.step("win32", ctx, str(pack)).status == "warn"  # second run: nothing new to do
    env = {"TRITON_CACHE_DIR": "D:\\mine"}
    assert longpaths.apply_settings(str(pack), env) == {"TORCHINDUCTOR_CACHE_DIR": str(short / "i")}
    assert env["TRITON_CACHE_DIR"] == "D:\\mine"  # what the user set wins
    eff = longpaths.effective_cache_dirs({"triton": "a", "inductor": "b"}, str(pack), {})
    assert eff == {"triton": str(short / "t"), "inductor": str(short / "i")}


def test_long_paths_unknown_or_not_windows(tmp_path):
    assert longpaths.step("win32", make_ctx(tmp_path), str(tmp_path)).status == "skipped"
    assert longpaths.step("linux", make_ctx(tmp_path, platform="linux"), str(tmp_path)).status == "skipped"


ERRORS = {
    1: "FileNotFoundError: [WinError 2] The system cannot find the file specified: '/sbin/ldconfig'",
    2: "clang: error: unsupported option '-fPIC' for target 'x86_64-pc-windows-msvc'",
    3: "AssertionError: libcuda.so cannot found!",
    4: "fatal error: 'cuda.h' file not found",
    5: "LINK : fatal error LNK1104: cannot open file 'python312.lib'",
    6: "error: call to undeclared function 'dlopen'",
    7: "error: call to undeclared function 'posix_memalign'",
    8: "FileNotFoundError: [WinError 2] The system cannot find the file specified: grep",
    9: "RuntimeError: Cannot find ptxas-blackwell.exe",
    10: "PermissionError: [WinError 32] The process cannot access the file because it is being used",
}


@pytest.mark.parametrize("number", sorted(ERRORS))
def test_each_of_the_ten_errors_is_recognised(number):
    fix = wf.classify(ERRORS[number])
    assert fix is not None and fix.number == number
    assert wf.classify("ZeroDivisionError: division by zero") is None


def _site(tmp_path: Path, dist: str, version: str, files: dict[str, str]) -> Path:
    site = tmp_path / "Lib" / "site-packages"
    (site / "triton").mkdir(parents=True)
    (site / "triton" / "__init__.py").write_text("")
    for rel, text in files.items():
        p = site / "triton" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    add_dist(site, dist, version)
    return site


def test_upstream_triton_on_windows(tmp_path):
    site = _site(tmp_path, "triton", "3.5.0", {"backends/nvidia/driver.c": "void* ptr = _aligned_malloc(size, alignment);"})
    r = wf.step("win32", [str(site)], {"triton": "3.5.0"}, want=(3, 5))
    assert r.status == "failed" and "upstream Linux 'triton'" in r.message
    assert "hand-patched (fixes 7 found)" in r.message
    assert "pip uninstall -y triton" in r.fix and '"triton-windows>=3.5,<3.6"' in r.fix


def test_hand_patched_triton_windows(tmp_path):
    site = _site(tmp_path, "triton-windows", "3.4.0.post20", {
        "backends/nvidia/driver.py": "    # Windows-compatible CUDA library detection\n",
        "backends/nvidia/compiler.py": "  # On Windows, skip deletion - files may be locked and OS will ...\n",
        "backends/nvidia/driver.c": "void* ptr = _aligned_malloc(size, alignment);",  # legit in triton-windows
    })
    r = wf.step("win32", [str(site)], {"triton-windows": "3.4.0.post20"}, want=(3, 4))
    assert r.status == "failed" and "fixes 1, 10 of the guide" in r.message
    assert "--force-reinstall" in r.fix


def test_clean_triton_windows_and_other_platforms(tmp_path):
    site = _site(tmp_path, "triton-windows", "3.5.1.post21", {"backends/nvidia/driver.py": "import os\n"})
    assert wf.step("win32", [str(site)], {"triton-windows": "3.5.1.post21"}).status == "ok"
    assert wf.step("win32", [str(tmp_path / "none")], {}).status == "ok"
    assert wf.step("linux", [str(site)], {"triton": "3.8.0"}).status == "skipped"
