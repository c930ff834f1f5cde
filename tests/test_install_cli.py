"""install.py end to end, run the way ComfyUI-Manager runs it: ``[python, "install.py", ...]`` with the
pack folder as cwd, COMFYUI_PATH set and no stdin, against fake portable trees."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.install_fakes import DLL_NEW, DLL_OLD, portable_tree, snapshot, write_include_libs
from tritonkit.installer import include_libs as il
from tritonkit.installer import vcredist

REPO = Path(__file__).resolve().parents[1]


def _repo_droppings() -> set[str]:
    """Files install.py could leave in the pack folder by mistake."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(REPO):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".venv", ".comfyui", "__pycache__", "node_modules")]
        for n in filenames + dirnames:
            if "tritonkit-" in n or n.startswith(il.STAGING_PREFIX) or n == "tritonkit_settings.json" \
                    or n.endswith(".tritonkit-fingerprint.json"):
                out.add(os.path.join(dirpath, n))
    return out


def manager_run(tmp_path: Path, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    """Like ComfyUI-Manager's execute_install_script: cwd = pack, env + COMFYUI_PATH, stdin closed."""
    home = tmp_path / "home"
    env = {**os.environ, "COMFYUI_PATH": str(tmp_path / "ComfyUI_windows_portable" / "ComfyUI"),
           "COMFYUI_FOLDERS_BASE_PATH": str(tmp_path / "ComfyUI_windows_portable" / "ComfyUI"),
           "HOME": str(home), "TRITON_CACHE_DIR": str(tmp_path / "caches" / "triton"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "caches" / "inductor"), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "install.py", *args], cwd=str(REPO), env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def portable(tmp_path):
    (tmp_path / "home").mkdir()
    root = tmp_path / "ComfyUI_windows_portable"
    py = portable_tree(root, vcredist=DLL_NEW)
    src = write_include_libs(tmp_path / "python_3.12.7_include_libs")
    cache = tmp_path / "caches" / "triton" / "ab"
    cache.mkdir(parents=True)
    (cache / "kernel.cubin").write_bytes(b"k" * 100)
    return py, src


def test_manager_style_install_of_a_fake_portable_tree(tmp_path, portable):
    py, src = portable
    lib_before = snapshot(py / "Lib")
    droppings = _repo_droppings()
    r = manager_run(tmp_path, "--python-dir", str(py), "--include-libs-from", str(src), "--no-pip", "--yes")
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    lines = out.splitlines()
    assert lines[0].startswith("[ok] python: Python 3.12.7 (embedded)")
    assert any(ln.startswith("[done] include/libs: installed include/ and libs/ for Python 3.12") for ln in lines)
    assert any(ln.startswith("[ok] vcredist: new enough") for ln in lines)
    assert any(ln.startswith("[skipped] triton package: --no-pip") for ln in lines)
    assert any(ln.startswith("[ok] caches:") for ln in lines)
    assert any(ln.startswith("[skipped] self-test:") for ln in lines)
    assert lines[-1] == "install.py: Triton is set up for this Python"
    assert il.status(str(py), (3, 12)) == []
    assert (py / "libs" / "python312.lib").is_file() and (py / "include" / "Python.h").is_file()
    assert snapshot(py / "Lib") == lib_before
    assert (tmp_path / "caches" / "triton" / "ab" / "kernel.cubin").exists()  # first run keeps caches
    assert os.path.isfile(str(tmp_path / "caches" / "triton") + ".tritonkit-fingerprint.json")
    assert _repo_droppings() == droppings

    tree = snapshot(tmp_path / "ComfyUI_windows_portable")
    again = manager_run(tmp_path, "--python-dir", str(py), "--include-libs-from", str(src), "--no-pip", "--yes")
    assert again.returncode == 0, again.stdout
    assert "[ok] include/libs:" in again.stdout
    assert snapshot(tmp_path / "ComfyUI_windows_portable") == tree  # second run is a no-op

    cleared = manager_run(tmp_path, "--python-dir", str(py), "--no-pip", "--clear-caches")  # no --yes: no stdin
    assert cleared.returncode == 0, cleared.stdout
    assert "[done] caches: cleared triton cache" in cleared.stdout and "freed 100 B" in cleared.stdout
    assert os.listdir(tmp_path / "caches" / "triton") == []


def test_check_leaves_everything_byte_identical(tmp_path, portable):
    py, src = portable
    for n in ("vcruntime140.dll", "vcruntime140_1.dll"):
        (py / n).write_bytes(DLL_OLD.read_bytes())
    before = snapshot(tmp_path)
    droppings = _repo_droppings()
    r = manager_run(tmp_path, "--check", "--python-dir", str(py), "--include-libs-from", str(src), "--fix-vcredist",
                    "--clear-caches", "--no-pip")
    assert r.returncode == 1, r.stdout + r.stderr  # old vcredist and nothing to copy from: not working
    assert "Set-up (install.py --check: nothing was changed):" in r.stdout
    assert "[to do] include/libs:" in r.stdout and "[FAILED] vcredist:" in r.stdout
    assert "[to do] caches: would clear triton cache" in r.stdout
    assert snapshot(tmp_path) == before
    assert _repo_droppings() == droppings


def test_json_output_and_failure_exit(tmp_path, portable):
    py, src = portable
    (py / "vcruntime140.dll").write_bytes(DLL_OLD.read_bytes())
    r = manager_run(tmp_path, "--json", "--python-dir", str(py), "--include-libs-from", str(src), "--no-pip")
    assert r.returncode == 1
    rep = json.loads(r.stdout)
    assert rep["ok"] is False and rep["target"]["kind"] == "embedded" and rep["target"]["version"] == "3.12.7"
    by_step = {s["step"]: s for s in rep["steps"]}
    assert by_step["include/libs"]["status"] == "done"
    assert by_step["vcredist"]["status"] == "failed"
    assert "vc_redist" in by_step["vcredist"]["fix"] and "--fix-vcredist" in by_step["vcredist"]["fix"]
    assert vcredist.pe_file_version(str(py / "vcruntime140.dll"))[:2] == (14, 29)


def test_bad_python_dir_and_bad_source(tmp_path, portable):
    py, src = portable
    r = manager_run(tmp_path, "--python-dir", str(tmp_path / "nowhere"), "--no-pip")
    assert r.returncode == 1 and "[FAILED] python:" in r.stdout and "no such folder" in r.stdout
    r = manager_run(tmp_path, "--python-dir", str(py), "--include-libs-from", str(tmp_path / "missing.zip"),
                    "--no-pip", "--yes")
    assert r.returncode == 1
    assert "[FAILED] include/libs:" in r.stdout and "no such file or folder" in r.stdout
    assert not (py / "include").exists()
    assert "install.py: 1 step(s) need you: include/libs" in r.stdout


def test_manager_style_with_include_libs_from_nuget(tmp_path, portable, monkeypatch):
    from fixtures.install_fakes import Server, nupkg_bytes
    py, _ = portable
    srv = Server()
    try:
        srv.serve_nuget({"3.12.7": nupkg_bytes(12, 7)})
        monkeypatch.setenv("TRITONKIT_NUGET_BASE", srv.base)  # a mirror on 127.0.0.1 instead of api.nuget.org
        r = manager_run(tmp_path, "--python-dir", str(py), "--no-pip")
    finally:
        srv.close()
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"downloading {srv.base}/python/3.12.7/python.3.12.7.nupkg" in r.stdout
    assert "from NuGet" in r.stdout
    assert il.status(str(py), (3, 12)) == []


def test_manager_style_plain_run_in_this_python(tmp_path):
    """Exactly Manager's command line, `python install.py`, for the interpreter running it (Linux here):
    every step, the self-test on the CPU, exit 0, and the cache fingerprints written beside the caches."""
    (tmp_path / "home").mkdir()
    droppings = _repo_droppings()
    r = manager_run(tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    steps = [ln.split("]")[1].split(":")[0].strip() for ln in r.stdout.splitlines() if ln.startswith("[")]
    assert steps == ["python", "include/libs", "vcredist", "triton package", "caches", "long paths",
                     "windows fixes", "self-test"]
    assert "[ok] self-test: Triton works" in r.stdout and "Triton self-test: PASS" in r.stdout
    assert os.path.isfile(str(tmp_path / "caches" / "triton") + ".tritonkit-fingerprint.json")
    assert _repo_droppings() == droppings


def test_never_asks_under_manager_or_without_a_terminal():
    from tritonkit.installer.common import Context, is_interactive

    class Tty:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    class Closed:
        def isatty(self):
            raise ValueError("I/O operation on closed file")

    assert is_interactive({}, Tty(True), Tty(True))
    assert not is_interactive({"COMFYUI_PATH": "C:\\ComfyUI"}, Tty(True), Tty(True))  # Manager, console stdin
    assert not is_interactive({}, Tty(True), Tty(False))  # stdout piped to Manager's log
    assert not is_interactive({}, None, Tty(True)) and not is_interactive({}, Closed(), Tty(True))

    def never(q):
        raise AssertionError("asked: " + q)
    assert Context(interactive=False, ask=never).confirm("Install?")
    assert Context(interactive=True, assume_yes=True, ask=never).confirm("Install?")
    assert not Context(interactive=True, ask=lambda q: "no").confirm("Install?")


@pytest.mark.skipif(sys.platform == "win32", reason="closes fd 0 in the child")
def test_runs_with_stdin_closed(tmp_path, portable):
    py, src = portable
    env = {**os.environ, "COMFYUI_PATH": str(tmp_path), "HOME": str(tmp_path / "home"),
           "TRITON_CACHE_DIR": str(tmp_path / "caches" / "triton"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "caches" / "inductor")}
    r = subprocess.run([sys.executable, "install.py", "--python-dir", str(py), "--include-libs-from", str(src),
                        "--no-pip"], cwd=str(REPO), env=env, preexec_fn=lambda: os.close(0),
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[done] include/libs" in r.stdout


def test_selftest_of_another_python_survives_echoed_compiler_output(tmp_path):
    """The self-test echoes the compiler's lines to stderr, which comes before the JSON report in the
    combined output of '<python> install.py --check --json'; braces in them must not break parsing."""
    from fixtures.install_fakes import make_ctx
    from tritonkit.installer import pyfolder, steps

    report = {"ok": False, "selftest": {"ok": False, "triage": {
        "key": "python-h-missing", "title": "Python headers or import library missing (include/, libs/)",
        "fix": "run install.py", "error": "CalledProcessError"}}, "triton": {"import_error": None}}
    noise = ("C:\\T\\main.c(3): error C2143: syntax error: missing ';' before '{'\n"
             "{ not json either\n")
    ctx = make_ctx(tmp_path, run=lambda argv, timeout=None: (1, noise + json.dumps(report, indent=2) + "\n"))
    target = pyfolder.from_folder(str(portable_tree(tmp_path / "p")), ctx)
    opts = steps.Options(check=True, install_py=str(REPO / "install.py"))
    ctx.platform = target.platform  # a Windows tree checked from a Windows install.py
    r, rep = steps.selftest_step(target, opts, ctx)
    assert rep == report
    assert r.status == "failed" and "[python-h-missing]" in r.message
    assert steps.report_from_output("no report at all {") is None
