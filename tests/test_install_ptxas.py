"""installer/ptxas.py: the pack gives a process the ptxas Inductor would switch Triton to, from the start."""
import json
import os
import stat
import subprocess
import sys

import pytest

from tritonkit.installer import ptxas


def _torch(tmp_path, exe=True, mark=True, where="_inductor/runtime/compile_tasks.py"):
    t = tmp_path / "torch"
    (t / "bin").mkdir(parents=True)
    f = t / "bin" / "ptxas"
    f.write_text("#!/bin/sh\n")
    if exe:
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    src = t.joinpath(*where.split("/"))
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text("def _set_triton_ptxas_path() -> None:\n    pass\n" if mark else "def other():\n    pass\n")
    return t


@pytest.mark.parametrize("where", ["_inductor/runtime/compile_tasks.py", "_inductor/async_compile.py"])
def test_torch_ptxas_follows_inductor(tmp_path, where):
    t = _torch(tmp_path, where=where)
    assert ptxas.torch_ptxas(str(t)) == str(t / "bin" / "ptxas")


@pytest.mark.skipif(sys.platform == "win32", reason="executable bits")
def test_torch_ptxas_none_without_executable_switch_or_folder(tmp_path):
    assert ptxas.torch_ptxas(str(_torch(tmp_path / "a", exe=False))) is None
    assert ptxas.torch_ptxas(str(_torch(tmp_path / "b", mark=False))) is None  # an Inductor that never switches
    assert ptxas.torch_ptxas(str(tmp_path / "missing")) is None
    assert ptxas.torch_ptxas(None) is None


def test_pin_sets_only_where_nobody_has(tmp_path):
    t = _torch(tmp_path)
    env = {}
    assert ptxas.pin(env, str(t)) == str(t / "bin" / "ptxas")
    assert env == {"TRITON_PTXAS_PATH": str(t / "bin" / "ptxas")}
    mine = {"TRITON_PTXAS_PATH": "/opt/cuda/bin/ptxas"}
    assert ptxas.pin(mine, str(t)) is None and mine == {"TRITON_PTXAS_PATH": "/opt/cuda/bin/ptxas"}
    for off in ("0", "off", "False"):
        env = {"TRITONKIT_PIN_PTXAS": off}
        assert ptxas.pin(env, str(t)) is None and "TRITON_PTXAS_PATH" not in env
    env = {}
    assert ptxas.pin(env, str(tmp_path / "no-torch")) is None and env == {}


def test_pin_agrees_with_the_installed_inductor():
    """What the pack sets at load is what this machine's Inductor sets at its first compile (both
    None where torch ships no ptxas, as on CPU wheels)."""
    pytest.importorskip("torch")
    code = ("import json, os\n"
            "f = None\n"
            "for m in ('torch._inductor.runtime.compile_tasks', 'torch._inductor.async_compile'):\n"
            "    try:\n        f = f or getattr(__import__(m, fromlist=['x']), '_set_triton_ptxas_path', None)\n"
            "    except ImportError:\n        pass\n"
            "f and f()\n"
            "print(json.dumps(os.environ.get('TRITON_PTXAS_PATH')))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_PTXAS_PATH", "TRITONKIT_PIN_PTXAS")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    inductor = json.loads(r.stdout.strip().splitlines()[-1])
    d = ptxas.installed_dir("torch")
    assert d and os.path.isfile(os.path.join(d, "__init__.py"))
    assert ptxas.torch_ptxas(d) == inductor


def _triton(tmp_path):
    tdir = tmp_path / "triton"
    (tdir / "backends" / "nvidia" / "bin").mkdir(parents=True)
    (tdir / "backends" / "nvidia" / "bin" / "ptxas").write_bytes(b"triton's")
    return tdir


def test_no_pin_where_torchs_ptxas_is_older_than_tritons(tmp_path):
    t, tdir = _torch(tmp_path), _triton(tmp_path)
    versions = {str(t / "bin" / "ptxas"): (12, 6), str(tdir / "backends" / "nvidia" / "bin" / "ptxas"): (12, 8)}

    def read(paths):
        return [versions.get(p) for p in paths]
    env = {}
    assert ptxas.pin(env, str(t), str(tdir), versions=read) is None and env == {}
    versions[str(t / "bin" / "ptxas")] = (13, 0)  # newer (or the same): pinned, as Inductor would
    assert ptxas.pin(env, str(t), str(tdir), versions=read) == str(t / "bin" / "ptxas")
    env = {}
    assert ptxas.pin(env, str(t), str(tdir), versions=lambda ps: [None] * len(ps)) == str(t / "bin" / "ptxas")  # unreadable


@pytest.mark.skipif(sys.platform == "win32", reason="shell scripts stand in for ptxas")
def test_ptxas_versions_reads_each_release(tmp_path):
    def fake(name, text):
        f = tmp_path / name
        f.write_text(f"#!/bin/sh\nprintf '%s\\n' '{text}'\n")
        f.chmod(0o755)
        return str(f)
    new = fake("new", "Cuda compilation tools, release 13.0, V13.0.88")
    old = fake("old", "Cuda compilation tools, release 12.8, V12.8.93")
    garbage = fake("garbage", "no version here")
    assert ptxas.ptxas_versions([new, old, garbage, str(tmp_path / "missing")]) == [(13, 0), (12, 8), None, None]


@pytest.mark.skipif(sys.platform == "win32", reason="executable bits")
def test_cache_fingerprint_names_the_pinned_ptxas(tmp_path):
    """install.py's stale-cache record names the ptxas ComfyUI's process will use: torch's where the
    pack pins it, Triton's own where the pin is off."""
    from tritonkit.installer import caches
    t = _torch(tmp_path)
    (t / "__init__.py").write_text("")
    tdir = _triton(tmp_path)
    assert str(t / "bin" / "ptxas") in caches.ptxas_identity(str(tdir), {}, "linux", str(t))
    off = caches.ptxas_identity(str(tdir), {"TRITONKIT_PIN_PTXAS": "0"}, "linux", str(t))
    assert str(tdir / "backends" / "nvidia" / "bin" / "ptxas") in off
    from tritonkit.installer.common import find_package_dir
    assert find_package_dir([str(tmp_path / "none"), str(tmp_path)], "torch") == str(t)
