"""Block configs that tie when timed alone: do they tie inside a model?

On an H200 the 8-bit attention's (128, 64, 8, 3) and (64, 64, 4, 3) timed 7.65 and 7.66 ms a call at
HunyuanVideo's shape @86 as the calibration times them, yet HunyuanVideo ran 1.022 s/step with the
first and 1.066 with the second (2026-11-24). This times each config three ways, interleaved over
rounds:

* isolated: as the calibration does (``calibration.cuda_timer_interleaved``: L2 flushed, queued
  behind a GPU spin);
* sustained: ``--burst`` calls back to back, per call (the GPU under load, as a step's attention);
* in context: each call between two bf16 GEMMs of the block's projection sizes, per call, the
  GEMMs' own time taken off (L2 contents and power draw as inside a block).

    python3 bench/config_ties.py [--configs 128,64,8,3 64,64,4,3] [--tokens 18616] [--heads 24]
                                 [--rounds 5] [--burst 20] [--arch 86] [--json out.json]

Below sm90 the configs compile with the card's MMA instruction (``DISABLE_MMA_V3=1``, mma.sync: nodes/arch.py)
unless the environment sets it; figures before the forty-ninth session were wgmma code.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def _pack():
    pkg = types.ModuleType("tritonkit")
    pkg.__path__ = [str(REPO)]
    sys.modules.setdefault("tritonkit", pkg)
    from tritonkit.kernels import attention as A
    from tritonkit.kernels import calibration as C
    return A, C


def events_ms(fn, n: int = 1) -> float:
    """Milliseconds per call of ``fn`` run ``n`` times back to back (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=["128,64,8,3", "64,64,4,3"])
    ap.add_argument("--tokens", type=int, default=18616)
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--mode", default="int8", choices=["int8", "exact"])
    ap.add_argument("--pv", default="half")
    ap.add_argument("--arch", type=int, default=86)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--burst", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 0
    A, C = _pack()
    from tritonkit.nodes.arch import card_mma
    card_mma(a.arch, os.environ)  # the simulated card's MMA instruction (mma.sync, not wgmma), before any compile
    dev = torch.device("cuda")
    hd = a.heads * a.head_dim
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(1, a.tokens, hd, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
    x = torch.randn(a.tokens, hd, device=dev, dtype=torch.bfloat16, generator=g)
    w1 = torch.randn(hd, 3 * hd, device=dev, dtype=torch.bfloat16, generator=g) / hd ** 0.5
    w2 = torch.randn(hd, hd, device=dev, dtype=torch.bfloat16, generator=g) / hd ** 0.5
    cfgs = [tuple(int(t) for t in c.split(",")) for c in a.configs]
    calls = {c: (lambda c=c: A.attention(q, k, v, a.heads, mode=a.mode, config=c, pv=a.pv, arch=a.arch))
             for c in cfgs}
    gemms = lambda: (x @ w1, x @ w2)  # noqa: E731
    for fn in list(calls.values()) + [gemms]:
        fn()
    torch.cuda.synchronize()
    res = {c: {"isolated": [], "sustained": [], "in_context": []} for c in cfgs}
    for r in range(a.rounds):
        order = cfgs if r % 2 == 0 else cfgs[::-1]
        iso = C.cuda_timer_interleaved({c: calls[c] for c in order})
        for c in order:
            res[c]["isolated"].append(iso[c])
            res[c]["sustained"].append(events_ms(calls[c], a.burst))
            base = events_ms(gemms, a.burst)
            ctx = events_ms(lambda c=c: (x @ w1, calls[c](), x @ w2), a.burst)
            res[c]["in_context"].append(ctx - base)
    gpu = torch.cuda.get_device_name()
    import triton
    print(f"{gpu}, torch {torch.__version__}, Triton {triton.__version__}; {a.mode} attention, "
          f"B1 H{a.heads} L{a.tokens} D{a.head_dim}, pv {a.pv}, @{a.arch} (DISABLE_MMA_V3="
          f"{os.environ.get('DISABLE_MMA_V3', '')}); ms a call, median (min-max) of "
          f"{a.rounds} rounds")
    print("| config | isolated | sustained | in context |")
    print("|---|---:|---:|---:|")
    for c in cfgs:
        cells = [f"{statistics.median(t):.3f} ({min(t):.3f}-{max(t):.3f})" for t in res[c].values()]
        print(f"| {','.join(map(str, c))} | " + " | ".join(cells) + " |")
    if a.json:
        Path(a.json).write_text(json.dumps({"gpu": gpu, "args": vars(a), "results": {
            ",".join(map(str, c)): v for c, v in res.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
