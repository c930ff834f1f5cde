"""Flux's attention shape (L 4608, head 128) at several head counts, so that the Gluon kernel's
128-row tiles fill whole or partial waves of the GPU's SMs: the Gluon forms against SDPA's cuDNN
backend, µs a call and a head. Shows whether a partial last wave explains a gap (BENCHMARKS.md,
twenty-fourth session: it does not; cuDNN loses as much to it). sm90 only.

    python bench/attention_waves.py [--heads 22,24,26,33,36] [--seq 4608] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention import A, sdpa  # noqa: E402  (the pack's kernels, through bench/attention.py's import shim)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", default="22,24,26,33,36")
    ap.add_argument("--seq", type=int, default=4608)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(), sms, "SMs, torch", torch.__version__, "triton", triton.__version__)
    L, D = a.seq, 128
    for H in map(int, a.heads.split(",")):
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o = torch.empty_like(q)
        fs = {"cudnn": lambda: sdpa("cudnn")(q, k, v),
              "ws": lambda: A.attention(q, k, v, layout="bhld", config=(128, 128, 4, 2, A.GLUON_WS), out=o),
              "pp": lambda: A.attention(q, k, v, layout="bhld", config=(128, 128, 4, 2, A.GLUON_PP), out=o),
              "plain": lambda: A.attention(q, k, v, layout="bhld", config=(64, 128, 4, 1, A.GLUON), out=o)}
        for f in fs.values():
            f()
        t = {n: [] for n in fs}
        for _ in range(a.rounds):  # interleaved: every method once a round
            for n, f in fs.items():
                t[n].append(triton.testing.do_bench(f, warmup=10, rep=40))
        tiles = -(-L // 128) * H
        print(f"H={H} tiles={tiles} waves={tiles / sms:.2f} " + " ".join(
            f"{n}={statistics.median(x) * 1e3:.1f}us ({statistics.median(x) * 1e3 / H:.2f}/head)"
            for n, x in t.items()), flush=True)


if __name__ == "__main__":
    main()
