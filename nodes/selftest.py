"""Triton Self-Test: the vector add of the triton-windows README as a node, with the
environment report and the triage of known failures."""
from __future__ import annotations

import json

from ..diagnostics.selftest import DEFAULT_N, format_report, full_report


def run_selftest(device: str = "auto", n: int = DEFAULT_N) -> tuple[str, dict]:
    rep = full_report(device=device, n=n)
    return format_report(rep), rep


class TritonSelfTest:
    CATEGORY = "TritonKit"
    FUNCTION = "run"
    OUTPUT_NODE = True
    RETURN_TYPES = ("STRING", "BOOLEAN")
    RETURN_NAMES = ("report", "passed")
    OUTPUT_TOOLTIPS = ("The environment report as text.", "True when Triton compiled and ran the vector add correctly.")
    DESCRIPTION = ("Runs the vector-add test of the triton-windows README through Triton, compares it with torch, "
                   "and reports versions, GPU class, C compiler, caches and, for a failure, the known cause and fix.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "device": (["auto", "cuda", "cpu"], {"default": "auto", "tooltip":
                       "auto: the GPU when there is one, else the CPU through the Triton interpreter."}),
            "n": ("INT", {"default": DEFAULT_N, "min": 1, "max": 1 << 26, "tooltip": "Number of elements to add."}),
        }}

    @classmethod
    def IS_CHANGED(cls, **kwargs):
        return float("nan")  # the environment can change between runs: always run

    def run(self, device="auto", n=DEFAULT_N):
        text, rep = run_selftest(device=device, n=n)
        tri = (rep.get("selftest") or {}).get("triage") or rep["triton"].get("import_error")
        ui = {"text": [text], "tritonkit": [json.dumps({"ok": rep["ok"], "triage": tri and {
            k: tri[k] for k in ("key", "title", "fix", "error")}})]}
        return {"ui": ui, "result": (text, bool(rep["ok"]))}


NODE_CLASS_MAPPINGS = {"TritonKitSelfTest": TritonSelfTest}
NODE_DISPLAY_NAME_MAPPINGS = {"TritonKitSelfTest": "Triton Self-Test"}
