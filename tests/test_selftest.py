import json
import subprocess
import sys
from pathlib import Path

import pytest

from tritonkit.diagnostics import environment as env
from tritonkit.diagnostics import selftest, triage

REPO = Path(__file__).resolve().parents[1]


def test_selftest_cpu_passes_and_reports():
    rep = selftest.full_report(device="cpu", n=4099)
    st = rep["selftest"]
    assert st["ok"], st
    assert st["max_abs_diff"] == 0.0
    assert st["first_call_s"] > 0 and st["warm_ms"] > 0
    assert st["backend"] in ("Triton interpreter", "triton-cpu backend")
    text = selftest.format_report(rep)
    assert text.startswith("Triton self-test: PASS")
    assert "torch " in text and "C compiler:" in text and "triton cache:" in text
    if rep["ptxas"]["path"]:  # the Triton package's own, or TRITON_PTXAS_PATH's
        assert f"ptxas: {rep['ptxas']['path']}" in text


def test_ptxas_in_use(tmp_path):
    tdir = tmp_path / "triton"
    (tdir / "backends" / "nvidia" / "bin").mkdir(parents=True)
    (tdir / "backends" / "nvidia" / "bin" / "ptxas.exe").write_bytes(b"p")
    own = env.ptxas_in_use({}, str(tdir), "win32")
    assert own == {"path": str(tdir / "backends" / "nvidia" / "bin" / "ptxas.exe"), "source": "Triton's own",
                   "exists": True}
    pinned = env.ptxas_in_use({"TRITON_PTXAS_PATH": str(tmp_path / "torch" / "bin" / "ptxas")}, str(tdir), "linux")
    assert pinned["source"] == "TRITON_PTXAS_PATH" and not pinned["exists"]
    assert env.ptxas_in_use({}, None)["path"] is None
    rep = {"ptxas": pinned}
    assert "; MISSING)" in next(ln for ln in _report_lines(rep) if ln.startswith("ptxas:"))


def _report_lines(extra: dict) -> list:
    rep = selftest.collect_environment()
    rep.update(extra)
    return selftest.format_report(rep).splitlines()


def test_report_says_where_tl_dot_has_no_tensor_cores(monkeypatch):
    # a Turing card under Triton 3.3+: the report says the pack's kernels stay off (kernels/arch_probe.py)
    from tritonkit.kernels import arch_probe
    monkeypatch.setattr(arch_probe, "_FOUND", {75: False})
    assert selftest._tensor_core_dot((7, 5)) is False and selftest._tensor_core_dot((8, 6)) is True
    assert selftest._tensor_core_dot(None) is None
    gpu = {"name": "NVIDIA GeForce RTX 2080 Ti", "cc": "7.5", **env.gpu_class((7, 5)), "tensor_core_dot": False}
    [line] = [ln for ln in _report_lines({"gpu": gpu}) if "tl.dot on this GPU" in ln]
    assert "no tensor cores" in line and "stay off" in line
    gpu["tensor_core_dot"] = True
    assert not [ln for ln in _report_lines({"gpu": gpu}) if "tl.dot on this GPU" in ln]


def test_selftest_calls_from_several_threads_all_pass_and_keep_the_descriptors():
    # the node (ComfyUI's execution thread) and the Triton tab's route (an executor thread) can
    # start a self-test together: each must pass, and stdout/stderr must point where they did
    import os
    from thread_utils import run_in_threads
    before = [os.fstat(fd) for fd in (1, 2)]
    results, errors = run_in_threads(lambda i: selftest.run_vector_add(device="cpu", n=4099 + i, warm_runs=2))
    after = [os.fstat(fd) for fd in (1, 2)]
    assert not errors, errors
    assert [r["ok"] for r in results] == [True] * 4, [r["triage"] for r in results]
    assert [(s.st_dev, s.st_ino) for s in after] == [(s.st_dev, s.st_ino) for s in before]


@pytest.mark.parametrize("message, passes", [
    (f"{selftest.AST_RACE} (before=48, after=110)", True),  # CPython 3.11's, from a finalizer: once more
    ("error return without exception set", False),          # any other SystemError is a finding
])
def test_selftest_runs_the_first_call_again_after_cpythons_ast_race(monkeypatch, message, passes):
    from tritonkit.kernels import vector_add
    real, calls = vector_add.add, []

    def add(*a, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise SystemError(message)
        return real(*a, **kw)
    monkeypatch.setattr(vector_add, "add", add)
    st = selftest.run_vector_add(device="cpu", n=1031, warm_runs=1)
    assert st["ok"] is passes, st
    if passes:
        assert st["max_abs_diff"] == 0.0 and st["triage"] is None and message in st["retried_after"]
        rep = selftest.full_report(device="cpu", n=1031)
        rep["selftest"] = st
        assert "the first call ran twice" in selftest.format_report(rep)
    else:
        assert st["triage"] is not None and "retried_after" not in st and len(calls) == 1


def test_report_of_a_run_that_failed_after_its_first_call():
    rep = selftest.full_report(device="cpu", n=4099)
    rep["selftest"].update(ok=False, warm_ms=None)
    text = selftest.format_report(rep)
    assert text.startswith("Triton self-test: FAIL") and "warm: not measured" in text


def test_selftest_bad_device_is_a_clear_failure():
    st = selftest.run_vector_add(device="tpu")
    assert not st["ok"]
    assert "device must be" in st["triage"]["error"]
    assert st["triage"]["key"] == "unknown"


def test_selftest_cuda_without_gpu_explains(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    st = selftest.run_vector_add(device="cuda")
    assert not st["ok"] and "torch.cuda.is_available() is False" in st["triage"]["error"]


# every troubleshooting entry of the seeds, as users see the message
SAMPLES = {
    "shadowed-triton": "ModuleNotFoundError: No module named 'triton.language'; 'triton' is not a package",
    "setuptools-impimporter": "AttributeError: module 'pkgutil' has no attribute 'ImpImporter'. Did you mean: 'zipimporter'",
    "permission-dot-triton": "PermissionError: [WinError 5] Access is denied: 'C:\\\\Users\\\\me\\\\.triton'",
    "dll-libtriton": "ImportError: DLL load failed while importing libtriton: The specified module could not be found.",
    "dll-cuda-utils": "ImportError: DLL load failed while importing cuda_utils: The specified module could not be found.",
    "py-ssize-t-clean": "SystemError: PY_SSIZE_T_CLEAN macro must be defined for '#' formats",
    "fp8e4nv-arch": "AssertionError: fp8e4nv data type is not supported on CUDA arch < 89",
    "cpu-tensor-pointer": "ValueError: Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)",
    "triton-ops-missing": "ModuleNotFoundError: No module named 'triton.ops'",
    "winerror-183": "FileExistsError: [WinError 183] Cannot create a file when that file already exists: 'x'",
    "long-paths": "OSError: [WinError 206] The filename or extension is too long",
    "triton-missing": "ModuleNotFoundError: No module named 'triton'",
}


@pytest.mark.parametrize("key,message", sorted(SAMPLES.items()))
def test_triage_maps_each_known_failure(key, message):
    entry = triage.classify_text(message)
    assert entry.key == key
    assert len(entry.fix) > 20


def test_triage_new_fp8_message_and_long_path_traceback():
    assert triage.classify_text("ValueError: type fp8e4nv not supported in this architecture. The supported fp8 "
                                "dtypes are ('fp8e4b15', 'fp8e5')").key == "fp8e4nv-arch"
    tb = ("torch._inductor.exc.InductorError: FileNotFoundError: [Errno 2] No such file or directory: "
          "'C:\\\\Users\\\\me\\\\AppData\\\\Local\\\\Temp\\\\torchinductor_me\\\\triton\\\\0\\\\LONGNAME'")
    assert triage.classify_text(tb).key == "long-paths"


def test_triage_unknown_keeps_traceback():
    try:
        raise KeyError("something new")
    except KeyError as e:
        res = triage.classify(e)
    assert res["key"] == "unknown" and "KeyError" in res["traceback"]


@pytest.mark.parametrize("torch_v,want", [("2.3.1", None), ("2.4.0", (3, 1)), ("2.5.1+cu124", (3, 1)),
                                          ("2.6.0", (3, 2)), ("2.7.1", (3, 3)), ("2.8.0", (3, 4)),
                                          ("2.9.0", (3, 5)), ("2.10.0", (3, 6)), ("2.11.0", (3, 6)),
                                          ("2.12.1", (3, 7)), ("2.13.0", (3, 7)), ("2.14.1+cu130", (3, 8)),
                                          ("2.15.0", (3, 9)), ("2.16.0", (3, 10))])
def test_triton_for_torch_table(torch_v, want):
    assert env.triton_for_torch(torch_v) == want


def test_triton_match_on_windows_flags_plain_triton():
    m = env.triton_match("2.9.0", {"triton": "3.5.0"}, platform="win32")
    assert not m["ok"] and any("plain 'triton'" in p for p in m["problems"])
    assert env.triton_match("2.9.0", {"triton-windows": "3.5.1.post21"}, platform="win32")["ok"]
    assert not env.triton_match("2.9.0", {"triton-windows": "3.4.0"}, platform="win32")["ok"]
    assert not env.triton_match("2.9.0", {}, platform="linux")["ok"]


def test_torch_declared_triton_beats_the_table():
    req = ['triton==3.6.0; platform_system == "Linux"', "sympy>=1.13"]
    assert env.torch_declared_triton(req) == (3, 6)
    assert env.torch_declared_triton(["sympy"]) is None
    assert env.triton_match("2.11.0", {"triton": "3.6.0"}, platform="linux", declared=(3, 6))["ok"]
    assert not env.triton_match("2.11.0", {"triton": "3.5.1"}, platform="linux", declared=(3, 6))["ok"]


@pytest.mark.parametrize("cc,cls,fp8,bf16", [((12, 0), "sm120", True, True), ((8, 9), "sm89", True, True),
                                             ((9, 0), "sm90", True, True), ((8, 6), "sm86", False, True),
                                             ((7, 5), "sm75", False, False), ((6, 1), "sm61", False, False)])
def test_gpu_class(cc, cls, fp8, bf16):
    g = env.gpu_class(cc)
    assert (g["class"], g["fp8_native"], g["bf16"]) == (cls, fp8, bf16)


def test_python_kind_fake_trees(tmp_path):
    emb = tmp_path / "ComfyUI_windows_portable" / "python_embeded"
    emb.mkdir(parents=True)
    (emb / "python312._pth").write_text("python312.zip\n.\n")
    assert env.python_kind(emb, platform="win32") == "embedded"
    fp = tmp_path / "FramePack" / "system" / "python"
    fp.mkdir(parents=True)
    assert env.python_kind(fp, platform="win32") == "embedded"
    venv = tmp_path / "venv"
    (venv / "Scripts").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = C:\\Python312\n")
    assert env.python_kind(venv / "Scripts", platform="win32") == "venv"
    conda = tmp_path / "miniconda3" / "envs" / "comfy"
    (conda / "conda-meta").mkdir(parents=True)
    assert env.python_kind(conda, platform="win32") == "conda"
    assert env.python_kind("C:\\Users\\me\\AppData\\Local\\Programs\\Python\\Python312", platform="win32") == "user"
    assert env.python_kind("C:\\Program Files\\WindowsApps\\PythonSoftwareFoundation.Python.3.12_3.12.2032.0_x64",
                           platform="win32") == "msstore"
    assert env.python_kind("C:\\Python312", platform="win32") == "system"


def test_cache_dirs_windows_and_env_override():
    d = env.cache_dirs(env={"TEMP": "C:\\Users\\me\\AppData\\Local\\Temp"}, platform="win32",
                       home="C:\\Users\\me", user="me")
    assert d == {"triton": "C:\\Users\\me\\.triton\\cache",
                 "inductor": "C:\\Users\\me\\AppData\\Local\\Temp\\torchinductor_me"}
    d = env.cache_dirs(env={"TRITON_CACHE_DIR": "/x/t", "TORCHINDUCTOR_CACHE_DIR": "/x/i"}, platform="linux",
                       home="/home/me", user="me")
    assert d == {"triton": "/x/t", "inductor": "/x/i"}


def test_c_compiler_order(tmp_path):
    tcc = tmp_path / "triton" / "runtime" / "tcc"
    tcc.mkdir(parents=True)
    (tcc / "tcc.exe").write_bytes(b"MZ")
    none = lambda name: None  # noqa: E731
    assert env.c_compiler(env={"CC": "cl;"}, platform="win32")["note"]
    assert env.c_compiler(env={}, platform="win32", triton_dir=str(tmp_path / "triton"), which=none)["kind"] == \
        "TinyCC (bundled)"
    assert env.c_compiler(env={"VCINSTALLDIR": "C:\\VS"}, platform="win32", which=none)["kind"] == "MSVC"
    assert env.c_compiler(env={}, platform="linux", which=lambda n: "/usr/bin/gcc" if n == "gcc" else None)["kind"] == "gcc"


def _run_check(*args, env_extra=None, cwd=REPO):
    import os
    e = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, str(REPO / "install.py"), "--check", *args], cwd=cwd, env=e,
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)


def test_install_check_text_and_json():
    r = _run_check("--device", "cpu")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("Triton self-test: PASS")
    r = _run_check("--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["ok"] is True and rep["selftest"]["max_abs_diff"] == 0.0


def test_install_check_with_shadowing_triton_fails_with_triage(tmp_path):
    (tmp_path / "triton.py").write_text("# a user's test script, unluckily named\nprint('hi')\n")
    r = _run_check("--device", "cpu", env_extra={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Triton self-test: FAIL" in r.stdout
    assert "[shadowed-triton]" in r.stdout


@pytest.mark.gpu
def test_selftest_cuda_passes():
    rep = selftest.full_report(device="cuda")
    assert rep["ok"], selftest.format_report(rep)
    assert rep["gpu"]["cc"] and rep["selftest"]["backend"].startswith("CUDA")


def test_report_names_a_simulated_gpu_and_a_leftover_mma_switch():
    assert env.simulation({}, (9, 0)) == {"forced_arch": None, "mma_v3_disabled": False, "note": None}
    sim = env.simulation({"TRITONKIT_FORCE_ARCH": "86", "DISABLE_MMA_V3": "1"}, (9, 0))
    assert sim == {"forced_arch": "86", "mma_v3_disabled": True, "note": None}
    lines = _report_lines({"simulation": sim})
    assert "Simulated GPU: TRITONKIT_FORCE_ARCH=86; Triton's tl.dot without wgmma (DISABLE_MMA_V3)" in lines
    # set with no forced arch on a Hopper GPU: only slower matmuls, so the report says to unset it
    left = env.simulation({"DISABLE_MMA_V3": "True"}, (9, 0))
    assert left["mma_v3_disabled"] and "unset it" in left["note"]
    assert any("unset it" in ln for ln in _report_lines({"simulation": left}))
    assert env.simulation({"DISABLE_MMA_V3": "1"}, (8, 6))["note"] is None  # no wgmma there anyway
    assert env.simulation({"DISABLE_MMA_V3": "yes"}, (9, 0))["mma_v3_disabled"] is False  # Triton reads 1/true/on
    assert not any(ln.startswith("Simulated GPU") for ln in _report_lines({"simulation": env.simulation({}, None)}))
