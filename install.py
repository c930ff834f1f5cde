"""ComfyUI-TritonKit install script: makes Triton work in the Python that runs ComfyUI.

ComfyUI-Manager runs it after cloning (cwd = this folder, COMFYUI_PATH set, no stdin, no
timeout); users can run it by hand with the Python that runs ComfyUI:

    python_embeded\\python.exe custom_nodes\\ComfyUI-TritonKit\\install.py

Steps (one line each: done / ok / skipped why / FAILED why -> what to do): find the Python and its
kind; include/ and libs/ into its folder; the vcredist DLLs; the Triton package matched to torch;
stale Triton/Inductor caches; Windows long paths; the ten Windows hand-patches; the Triton self-test.
It never asks anything without a terminal, deletes only inside its own staging folders and the two
cache folders, and exits 0 only when Triton works.

``--check`` does every detection, prints the self-test report and changes nothing.
``TRITONKIT_NUGET_BASE`` points the NuGet download of include/libs at a mirror (default: api.nuget.org).
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
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="where the self-test runs")
    p.add_argument("--python-dir", metavar="DIR",
                   help="set up the Python in DIR (the folder of python.exe, a venv, a prefix) instead of this one")
    p.add_argument("--include-libs-from", metavar="PATH|URL",
                   help="take include/ and libs/ from this folder, zip/nupkg file or URL")
    p.add_argument("--clear-caches", action="store_true", help="clear the Triton and TorchInductor caches")
    p.add_argument("--fix-vcredist", action="store_true",
                   help="copy newer vcredist DLLs from System32 into the Python folder (keeping backups)")
    p.add_argument("--no-pip", action="store_true", help="don't check, install or uninstall the Triton package")
    p.add_argument("--yes", action="store_true",
                   help="never ask (the default without a terminal, e.g. under ComfyUI-Manager)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    common = load_pack_module("installer.common")
    steps = load_pack_module("installer.steps")
    text = not args.json

    def say(msg: str) -> None:
        if text and not args.check:
            print(msg, flush=True)

    ctx = common.Context(check=args.check, assume_yes=args.yes, interactive=common.is_interactive(os.environ, sys.stdin, sys.stdout),
                         log=lambda m: say("  " + m),
                         nuget_base=os.environ.get("TRITONKIT_NUGET_BASE") or common.NUGET_BASE)
    opts = steps.Options(check=args.check, python_dir=args.python_dir, include_libs_from=args.include_libs_from,
                         clear_caches=args.clear_caches, fix_vcredist=args.fix_vcredist, no_pip=args.no_pip,
                         yes=args.yes, device=args.device, pack_dir=HERE,
                         install_py=os.path.abspath(__file__))
    out = steps.run(opts, ctx, emit=lambda r: say(r.line()))
    if args.json:
        print(json.dumps(steps.to_json(out), indent=2, default=str))
        return 0 if out["ok"] else 1
    selftest = load_pack_module("diagnostics.selftest")
    if args.check:
        if out["report"]:
            print(selftest.format_report(out["report"]))
            print()
        print("Set-up (install.py --check: nothing was changed):")
        for r in out["steps"]:
            print(r.line())
    elif out["report"]:
        print()
        print(selftest.format_report(out["report"]))
    print(steps.summary(out, args.check), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
