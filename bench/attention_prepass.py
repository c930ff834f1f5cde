"""The 8-bit mode's pre-pass (kernels/attention.py, ``_prepare_8bit``: quant_qkv_kernel, one launch) at
several launch shapes (``attention.PREPASS``), against a device-to-device copy of the same bytes. The
pre-pass is memory-bound: the copy is its ceiling.

    python bench/attention_prepass.py [--shapes flux,hunyuan,sdxl,wan14b] [--rounds 5] [--rep 30]

Per shape and V form (16-bit P·V: no V copy; fp8 P·V: the fp8 Vᵀ copy and its block scales), every
launch shape is timed once a round, in the same order each round (A B C … A B C …); the figures are the
median (min-max) over the rounds, GB/s counts the bytes the pre-pass must move (Q, K (and V) read once
each, their 8-bit copies written; K's sampled rows for its mean not counted), and ``x copy`` is the
copy's time over the pre-pass's, per round. Every launch shape's outputs are compared with the
default's: int8 Q and fp8 V bit for bit, int8 K within 1."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention import A, SHAPES  # noqa: E402  (the pack's kernels, through bench/attention.py's import shim)

DEFAULT = dict(A.PREPASS)
# overrides of the default; the first is the default itself, the reference of the output check
GRID = [
    {},
    {"block_q": 128, "quant_warps": 8},
    {"quant_warps": 2},
    {"quant_warps": 8},
    {"block_q": 32},
    {"block_q": 128},
]


def _name(over):
    return ",".join(f"{k}={v}" for k, v in over.items()) or "default"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="flux,hunyuan,sdxl,wan14b")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rep", type=int, default=30)
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    for sname in a.shapes.split(","):
        B, H, L, D = SHAPES[sname]
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        st = (q.stride(0), q.stride(1), q.stride(2))
        block_d = A.block_d_for(D)
        for fp8 in (False, True):
            elems = B * H * L * D
            # read Q, K (and V), write int8 Q, K (and fp8 V)
            moved = elems * (2 + 2 + 1 + 1) + (elems * (2 + 1) if fp8 else 0)
            src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")  # read and written: moved
            dst = torch.empty_like(src)

            def pre(fp8=fp8):
                return A._prepare_8bit(q, st, k, st, v, st, B, H, H, L, L, D, block_d, D ** -0.5 * A.LOG2E, 128,
                                       fp8, perm_v=fp8)

            meths, ref = {}, None
            for over in GRID:
                A.PREPASS.clear()
                A.PREPASS.update(DEFAULT, **over)
                try:
                    out = pre()
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
                    print(f"  {sname} fp8={fp8} {_name(over)}: FAILED {type(e).__name__}: {str(e)[:200]}")
                    continue
                if ref is None:
                    ref = [t.clone() if t is not None else None for t in out]
                else:
                    dq = (out[0] != ref[0]).sum().item()
                    dk = (out[2].int() - ref[2].int()).abs().max().item()
                    dv = (out[4].view(torch.uint8) != ref[4].view(torch.uint8)).sum().item() if fp8 else 0
                    if dq or dk > 1 or dv:
                        print(f"  {sname} fp8={fp8} {_name(over)}: outputs DIFFER (Q {dq}, K max {dk}, V {dv})")
                        continue
                meths[_name(over)] = dict(over)
            times = {n: [] for n in meths}
            copy = []
            for _ in range(a.rounds):
                copy.append(triton.testing.do_bench(lambda: dst.copy_(src), warmup=5, rep=a.rep))
                for n, over in meths.items():
                    A.PREPASS.clear()
                    A.PREPASS.update(DEFAULT, **over)
                    times[n].append(triton.testing.do_bench(pre, warmup=5, rep=a.rep))
            A.PREPASS.clear()
            A.PREPASS.update(DEFAULT)
            cm = statistics.median(copy)
            print(f"| {sname} {(B, H, L, D)} {'fp8 V' if fp8 else '16-bit V'} | us med (min-max) | GB/s | "
                  f"x copy med (min-max) |")
            print(f"| copy of {moved / 1e6:.0f} MB | {cm * 1e3:.1f} ({min(copy) * 1e3:.1f}-{max(copy) * 1e3:.1f}) | "
                  f"{moved / cm / 1e6:.0f} (read+write) | |")
            for n in sorted(meths, key=lambda n: statistics.median(times[n])):
                t = times[n]
                m = statistics.median(t)
                r = [c / x for c, x in zip(copy, t)]
                print(f"| {n} | {m * 1e3:.1f} ({min(t) * 1e3:.1f}-{max(t) * 1e3:.1f}) | {moved / m / 1e6:.0f} | "
                      f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f}) |", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
