"""The pack inside a real ComfyUI server (CPU; 0.3.75 and 0.8.0): registration, the self-test through
/prompt, and a deliberately broken Triton."""
import json
from pathlib import Path

import pytest

from comfy_harness import REPO, ComfyServer

pytestmark = pytest.mark.comfyui

SELFTEST_WORKFLOW = json.loads((REPO / "workflows" / "api" / "triton_selftest.json").read_text())


def test_object_info_lists_the_selftest_node(comfy_server):
    info = comfy_server.get("/object_info/TritonKitSelfTest")["TritonKitSelfTest"]
    assert info["display_name"] == "Triton Self-Test"
    assert info["output_node"] is True
    assert info["output"] == ["STRING", "BOOLEAN"]
    assert info["input"]["required"]["device"][0] == ["auto", "cuda", "cpu"]
    assert info["input"]["required"]["n"][0] == "INT"
    assert info["python_module"].startswith("custom_nodes.")
    failed = [ln for ln in comfy_server.log().splitlines() if "IMPORT FAILED" in ln and "tritonkit" in ln]
    assert not failed, failed


def test_selftest_workflow_runs_and_reports(comfy_server):
    entry = comfy_server.run(SELFTEST_WORKFLOW, timeout=300)
    out = entry["outputs"]["1"]
    text = out["text"][0]
    assert text.startswith("Triton self-test: PASS"), text
    assert "device=cpu" in text and "max abs diff vs torch: 0" in text
    meta = json.loads(out["tritonkit"][0])
    assert meta == {"ok": True, "triage": None}


def test_pack_loads_and_triages_with_a_broken_triton(tmp_path):
    # A Triton whose compiled core can't load, as with old vcredist DLLs on Windows: torch treats
    # Triton as absent and ComfyUI starts; the pack must load and the self-test must say why.
    shadow = tmp_path / "shadow" / "triton"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ImportError('DLL load failed while importing libtriton: The specified module could not be found.')\n")
    with ComfyServer(tmp_path / "base", env={"PYTHONPATH": str(shadow.parent)}) as srv:
        info = srv.get("/object_info/TritonKitSelfTest")
        assert "TritonKitSelfTest" in info
        entry = srv.run(SELFTEST_WORKFLOW, timeout=300)
        text = entry["outputs"]["1"]["text"][0]
        assert text.startswith("Triton self-test: FAIL"), text
        assert "[dll-libtriton]" in text and "vc_redist" in text
        meta = json.loads(entry["outputs"]["1"]["tritonkit"][0])
        assert meta["ok"] is False and meta["triage"]["key"] == "dll-libtriton"
