"""Host time of one attention call, as ComfyUI makes it (bld in, bld out, bf16), once its shape class is settled:
torch's SDPA the way ComfyUI's ``attention_pytorch`` calls it, the pack's kernel call (``exact``, ``int8``) and the
Triton Attention node's override around it (``auto``, ``exact``, ``8-bit``), each with the pack's host fast path
off (``TRITONKIT_FAST_LAUNCH=0``: every call through the checks, the config lookup and Triton's dispatch) and on
(replayed calls, direct launches, the node's kept decisions), interleaved A B A B.

The GPU is kept busy (a spin kernel queued first) while a batch of calls is issued, so the host never waits for it:
what is timed is the Python and launch work of a call. Where a model's GPU work between two attention calls is
shorter than this (SDXL's and SD1.5's UNets on a fast GPU), the GPU waits for it.

    python bench/attention_host.py [--shapes sdxl,flux,sd15] [--rounds 6] [--calls 40] [--json out.json]

Needs a CUDA GPU (it measures launches)."""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if "tritonkit" not in sys.modules:
    _pkg = types.ModuleType("tritonkit")
    _pkg.__path__ = [str(REPO)]
    sys.modules["tritonkit"] = _pkg

SHAPES = {"sdxl": (2, 10, 4096, 64), "flux": (1, 24, 4608, 128), "sd15": (2, 8, 4096, 40),
          "hunyuan": (1, 24, 16384, 128)}


def attention_pytorch(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False,
                      **kwargs):
    """ComfyUI's attention_pytorch (bld), minus its decorator."""
    b, _, dim_head = q.shape
    dim_head //= heads
    q, k, v = (t.view(b, -1, heads, dim_head).transpose(1, 2) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)
    return out.transpose(1, 2).reshape(b, -1, heads * dim_head)


def host_us(fn, calls: int) -> float:
    """µs of host time a call, over ``calls`` calls issued behind a GPU spin (the garbage collector held off
    during the batch, as ``timeit`` does)."""
    fn()
    torch.cuda.synchronize()
    gc.collect()
    gc.disable()
    try:
        torch.cuda._sleep(int(2e9 * max(0.02, calls * 1.5e-3)))  # longer than the batch takes to issue
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        dt = time.perf_counter() - t0
    finally:
        gc.enable()
    torch.cuda.synchronize()
    return dt / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="sdxl,flux,sd15")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--settle-calls", type=int, default=600, help="at most this many calls to settle a method")
    ap.add_argument("--calibration-dir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/attention_host.py needs a CUDA GPU")
    os.environ.setdefault("TRITONKIT_CALIBRATION_DIR", args.calibration_dir or tempfile.mkdtemp(prefix="tk-host-"))
    import triton

    from tritonkit.kernels import attention as A
    from tritonkit.kernels import fast_launch, prepare, tuning
    from tritonkit.nodes import attention as NA
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "python": sys.version.split()[0]}
    print(json.dumps(env), flush=True)
    overrides = {m: NA.make_override(m) for m in ("auto", "exact", "8-bit")}
    rows = {}
    for name in args.shapes.split(","):
        B, H, L, D = SHAPES[name]
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, L, H * D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        methods = {
            "sdpa (ComfyUI's call)": lambda: attention_pytorch(q, k, v, H),
            "kernel exact": lambda: A.attention(q, k, v, H, mode="exact"),
            "kernel int8": lambda: A.attention(q, k, v, H, mode="int8"),
            "node exact": lambda: overrides["exact"](attention_pytorch, q, k, v, H),
            "node 8-bit": lambda: overrides["8-bit"](attention_pytorch, q, k, v, H),
            "node auto": lambda: overrides["auto"](attention_pytorch, q, k, v, H),
        }
        for fn in methods.values():  # the calibration, the block-config timing and any playoff in the calls
            for i in range(args.settle_calls):
                fn()
                if i >= 20 and not tuning.unsettled():
                    break
        torch.cuda.synchronize()
        t0 = time.time()
        while prepare.busy() and time.time() - t0 < 60:  # background compiles compete for the host's cores
            time.sleep(0.1)
        times = {(m, e): [] for m in methods for e in ("off", "on")}
        for _ in range(args.rounds):
            for e in ("off", "on"):
                os.environ[fast_launch.ENV] = "0" if e == "off" else "1"
                for m, fn in methods.items():
                    times[(m, e)].append(host_us(fn, args.calls))
        os.environ[fast_launch.ENV] = "1"
        print(f"\n{name} {(B, H, L, D)}: µs of host time a call, median (min–max) of {args.rounds} rounds")
        print("| method | fast path off | on |\n|---|---|---|")
        for m in methods:
            a, b = times[(m, "off")], times[(m, "on")]
            rows[f"{name}/{m}"] = {"off": a, "on": b}
            print(f"| {m} | {statistics.median(a):.0f} ({min(a):.0f}–{max(a):.0f}) | "
                  f"{statistics.median(b):.0f} ({min(b):.0f}–{max(b):.0f}) |", flush=True)
    stats = NA.stats()
    print(f"\nnode: {stats['served']} served, {stats['fallback']} to ComfyUI's attention; replayed calls "
          f"{A.REPLAY_COUNTERS}; direct launches {fast_launch.COUNTERS}")
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "rows": rows, "node": stats,
                                               "replay": dict(A.REPLAY_COUNTERS),
                                               "fast_launch": dict(fast_launch.COUNTERS)}, indent=1))


if __name__ == "__main__":
    main()
