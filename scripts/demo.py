"""The main job: a real ComfyUI (CPU) with this pack, the bundled self-test workflow queued
through /prompt, and its report printed. ``--serve`` leaves the server running for a browser."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from comfy_harness import ComfyServer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--serve", action="store_true", help="keep ComfyUI running after the report (Ctrl+C stops)")
    ap.add_argument("--workflow", default=str(ROOT / "workflows" / "api" / "triton_selftest.json"))
    args = ap.parse_args()
    prompt = json.loads(Path(args.workflow).read_text())
    base = Path(tempfile.mkdtemp(prefix="tritonkit-demo-"))
    srv = ComfyServer(base)
    print(f"[demo] starting ComfyUI 0.3.75 on {srv.url} (base folder {base})", flush=True)
    srv.start()
    try:
        entry = srv.run(prompt, timeout=600)
        ok = True
        for node_id, out in entry["outputs"].items():
            for text in out.get("text", []):
                print(text)
                ok = ok and "FAIL" not in text.splitlines()[0]
        if args.serve:
            print(f"[demo] ComfyUI keeps running at {srv.url} - Ctrl+C to stop", flush=True)
            while True:
                time.sleep(3600)
        return 0 if ok else 1
    except KeyboardInterrupt:
        return 0
    finally:
        srv.stop()


if __name__ == "__main__":
    sys.exit(main())
