"""Host (Python) cost of one attention call in the pack's launcher, without the GPU: the arch is
faked (sm90), the Triton kernels are replaced by stubs that return at once, and the block-config
pick is already made (every call after a shape class's first). What is left is what the launcher
itself does per call on the CPU: argument checks, strides, views, the config lookup. Exact mode
only: the 8-bit path's K mean and int8 buffers are torch ops that would run (slowly) on CPU
tensors here, not the launcher's own cost. Where a call's GPU time is short (SDXL, SD1.5:
0.2-0.4 ms on an H100) this is what keeps the GPU waiting.

    python bench/launch_overhead.py [--calls 2000] [--json out.json]

Also times Triton's ``triton.cdiv`` / ``triton.next_power_of_2`` from Python against the plain
versions in kernels/runtime.py (the launchers call several per launch)."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[1]
if "tritonkit" not in sys.modules:
    _pkg = types.ModuleType("tritonkit")
    _pkg.__path__ = [str(REPO)]
    sys.modules["tritonkit"] = _pkg
from tritonkit.kernels import attention as A  # noqa: E402
from tritonkit.kernels import runtime as R  # noqa: E402


class _Stub:
    def __getitem__(self, grid):
        return lambda *a, **kw: None

    def run(self, *a, **kw):
        return None


def per_call_us(fn, calls, rounds=5):
    fn()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(out), min(out), max(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import os
    from tritonkit.kernels import tuning
    os.environ.setdefault("TRITONKIT_CALIBRATION_DIR", tempfile.mkdtemp(prefix="tk-overhead-"))
    A._device_cc = lambda dev: 90
    A.kernel_for = lambda fn, device_type: _Stub()
    tuning.time_ms = lambda device, fn: (fn(), 1.0)[1]
    rows = {}
    # SDXL-like and Flux-like heads in both layouts ComfyUI passes (L is irrelevant to the host)
    for name, (B, H, L, D) in {"sdxl_head64": (2, 10, 256, 64), "flux_head128": (1, 24, 256, 128)}.items():
        q, k, v = (torch.randn(B, H, L, D).to(torch.bfloat16) for _ in range(3))
        med, lo, hi = per_call_us(lambda: A._launch(q, k, v, None, H, True, True, None, False, False), args.calls)
        rows[f"{name}/exact/bhld"] = {"us_median": med, "us_min": lo, "us_max": hi}
        q2, k2, v2 = (x.transpose(1, 2).reshape(B, L, H * D) for x in (q, k, v))
        med, lo, hi = per_call_us(lambda: A._launch(q2, k2, v2, None, H, False, False, None, False, False),
                                  args.calls)
        rows[f"{name}/exact/bld"] = {"us_median": med, "us_min": lo, "us_max": hi}
    for name, f in {"triton.cdiv": lambda: triton.cdiv(4608, 128), "runtime.cdiv": lambda: R.cdiv(4608, 128),
                    "triton.next_power_of_2": lambda: triton.next_power_of_2(4608),
                    "runtime.next_pow2": lambda: R.next_pow2(4608)}.items():
        med, lo, hi = per_call_us(f, args.calls * 10)
        rows[name] = {"us_median": med, "us_min": lo, "us_max": hi}
    env = {"python": sys.version.split()[0], "torch": torch.__version__, "triton": triton.__version__}
    print(json.dumps(env))
    for k, r in rows.items():
        print(f"{k:32s} {r['us_median']:8.2f} us/call ({r['us_min']:.2f}-{r['us_max']:.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
