"""ComfyUI-TritonKit install script.

ComfyUI-Manager runs it after cloning (cwd = this folder, COMFYUI_PATH set, no stdin);
users can run it by hand with the Python that runs ComfyUI:

    python_embeded\\python.exe custom_nodes\\ComfyUI-TritonKit\\install.py --check

``--check`` prints the environment report and the Triton self-test and changes nothing;
it exits 0 when Triton works, 1 when it does not.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
PACK = "_tritonkit_pack"


def load_pack_module(name: str):
    """Imports ``<pack>.<name>`` without running the pack's ``__init__`` (which registers
    ComfyUI nodes): a bare parent package whose path is this folder is enough for the
    relative imports inside."""
    if PACK not in sys.modules:
        pkg = types.ModuleType(PACK)
        pkg.__path__ = [HERE]
        sys.modules[PACK] = pkg
    return importlib.import_module(f"{PACK}.{name}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Make Triton work in this ComfyUI's Python, and check it.")
    p.add_argument("--check", action="store_true", help="only detect and report; change nothing")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="where the self-test runs")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    selftest = load_pack_module("diagnostics.selftest")
    rep = selftest.full_report(device=args.device)
    if args.json:
        print(json.dumps(rep, indent=2, default=str))
    else:
        print(selftest.format_report(rep))
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
