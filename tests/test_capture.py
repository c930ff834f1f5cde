"""diagnostics/capture.py: what child processes print (a C compiler, ptxas) reaches the triage, and
the self-test report shows the compiler's decisive lines first."""
from __future__ import annotations

import os
import subprocess
import sys

from tritonkit.diagnostics import capture, selftest

# what MSVC prints on stdout and TinyCC on stderr when the Python headers are missing
CHILD = ("import sys; print('cuda_utils.c'); "
         "print(r\"C:\\T\\cuda_utils.c(12): fatal error C1083: Cannot open include file: 'Python.h': "
         "No such file or directory\"); sys.stdout.flush(); "
         "print(\"C:/T/cuda_utils.c:13: error: include file 'Python.h' not found\", file=sys.stderr); "
         "sys.exit(2)")


def _compile_like_triton():
    """Runs a 'compiler' the way Triton's build.py does (output not captured by Python)."""
    subprocess.check_call([sys.executable, "-c", CHILD])


def test_native_output_captures_children_and_echoes(capfd):
    cap = capture.Captured()
    try:
        with capture.native_output(cap):
            _compile_like_triton()
    except subprocess.CalledProcessError as exc:
        assert exc.output is None and exc.stderr is None  # Python itself kept nothing
    assert "fatal error C1083" in cap.text and "include file 'Python.h' not found" in cap.text
    assert cap.echoed
    out, err = capfd.readouterr()
    assert "fatal error C1083" in err  # the user still sees it, on the restored stderr


def test_native_output_restores_descriptors_after_an_exception(capfd):
    cap = capture.Captured()
    raised = False
    try:
        with capture.native_output(cap, echo=False):
            os.write(1, b"inside\n")  # descriptor level, as a child or a C library writes
            raise ValueError("boom")
    except ValueError:
        raised = True
    assert raised and "inside" in cap.text and not cap.echoed
    os.write(1, b"after\n")
    out, _ = capfd.readouterr()
    assert "after" in out and "inside" not in out


def test_selftest_triages_the_compilers_own_output(monkeypatch):
    from tritonkit.kernels import vector_add

    def failing_add(x, y, out=None):
        _compile_like_triton()  # raises CalledProcessError with no output kept, like Triton

    monkeypatch.setattr(vector_add, "add", failing_add)
    st = selftest.run_vector_add(device="cpu", n=64)
    tri = st["triage"]
    assert not st["ok"] and tri["key"] == "python-h-missing", tri
    assert "fatal error C1083" in tri["compiler_output"]
    assert tri["decisive"][0].endswith("Cannot open include file: 'Python.h': No such file or directory")


def _report(tri: dict) -> dict:
    rep = selftest.collect_environment()
    rep["selftest"] = {"ok": False, "n": 1, "device": "cpu", "backend": None, "triage": tri}
    return rep


def test_unknown_failure_report_shows_decisive_lines_before_the_traceback(monkeypatch):
    from tritonkit.kernels import vector_add

    def odd_failure(x, y, out=None):
        raise RuntimeError("launcher: error LNK2019: unresolved external symbol __imp_cuGetProcAddress")

    monkeypatch.setattr(vector_add, "add", odd_failure)
    st = selftest.run_vector_add(device="cpu", n=64)
    assert st["triage"]["key"] == "unknown"
    text = selftest.format_report(_report(st["triage"]))
    assert text.index("decisive lines:") < text.index("traceback:")
    dl = text.index("decisive lines:")
    assert "LNK2019" in text[dl:text.index("traceback:")]


def test_known_failure_report_quotes_the_compiler(monkeypatch):
    from tritonkit.kernels import vector_add
    monkeypatch.setattr(vector_add, "add", lambda x, y, out=None: _compile_like_triton())
    st = selftest.run_vector_add(device="cpu", n=64)
    text = selftest.format_report(_report(st["triage"]))
    assert "[python-h-missing]" in text and "the compiler said:" in text and "C1083" in text
    assert "traceback:" not in text
