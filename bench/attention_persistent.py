"""The warp-specialised Gluon kernels (exact: warp-specialised and ping-pong; 8-bit: 16-bit and fp8 P·V),
two schedules of the same compiled kernel interleaved with SDPA's cuDNN backend (kernels/attention_hopper.py's
module switches):

* ``--ab persistent``: persistent (at most a program an SM, each taking every grid-th tile) against a program
  a tile (``PERSISTENT``), stream-K off in both;
* ``--ab streamk``: persistent with stream-K for the last wave (kernels/attention_streamk.py, the default; where
  its schedule takes it) against persistent without (``STREAM_K``).

ms a call, median (min-max) over the rounds, × cuDNN, each form's B ÷ A ratio round by round, and the cosine
(global / worst row) against an fp32 SDPA reference (shapes up to 16k tokens). The thirty-sixth session's A/Bs
(BENCHMARKS.md). sm90 only.

    python bench/attention_persistent.py [--ab persistent|streamk] [--shapes sdxl,flux,hunyuan] [--rounds 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention import SHAPES, A, sdpa  # noqa: E402  (the pack's kernels, through bench/attention.py's import shim)
from tritonkit.kernels import attention_hopper as AH  # noqa: E402


def forms(D: int) -> dict:
    """name -> (config, mode, pv) of the Gluon warp-specialised forms at head D."""
    st = 2 if D == 128 else 3
    return {"ws": ((128, 128, 4, st, A.GLUON_WS), "exact", "auto"),
            "pp": ((128, 128, 4, st, A.GLUON_PP), "exact", "auto"),
            "g8half": ((128, 128, 4, st, A.G8_HALF), "int8", "half"),
            "g8fp8": ((128, 128, 4, 2, A.G8_FP8), "int8", "fp8")}


def cosines(out, ref, D):
    f = torch.nn.functional.cosine_similarity
    return f(out.flatten(), ref.flatten(), dim=0).item(), f(out.reshape(-1, D), ref.reshape(-1, D), dim=1).min().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="sdxl,flux,hunyuan")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ab", choices=("persistent", "streamk"), default="persistent")
    a = ap.parse_args()
    # (name, PERSISTENT, STREAM_K) of A and B
    arms = ([("persistent", True, False), ("a-tile", False, False)] if a.ab == "persistent"
            else [("stream-k", True, True), ("whole-tiles", True, False)])
    default = (AH.PERSISTENT, AH.STREAM_K)
    print(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count, "SMs, torch",
          torch.__version__, "triton", triton.__version__, flush=True)
    for name in a.shapes.split(","):
        B, H, L, D = SHAPES[name]
        g = torch.Generator(device="cuda").manual_seed(1)
        q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        o = torch.empty_like(q)
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float()) if L <= 16384 else None
        fns = {"cudnn": lambda: sdpa("cudnn")(q, k, v)}
        for m, (cfg, mode, pv) in forms(D).items():
            for arm, persistent, streamk in arms:
                def f(cfg=cfg, mode=mode, pv=pv, persistent=persistent, streamk=streamk):
                    AH.PERSISTENT, AH.STREAM_K = persistent, streamk
                    return A.attention(q, k, v, layout="bhld", mode=mode, config=cfg, out=o, pv=pv)
                fns[f"{m}-{arm}"] = f
        acc = {}
        for n, f in fns.items():
            o.fill_(float("nan"))
            out = f().float() if n == "cudnn" else (f(), o.float())[1]
            if ref is not None:
                c, worst = cosines(out, ref, D)
                acc[n] = f"cos {c:.6f} / worst row {worst:.5f}{'' if torch.isfinite(out).all() else ' NON-FINITE'}"
        t = {n: [] for n in fns}
        for r in range(a.rounds):  # A B ... then ... B A
            for n, f in (list(fns.items()) if r % 2 == 0 else list(fns.items())[::-1]):
                t[n].append(triton.testing.do_bench(f, warmup=100, rep=40))
        AH.PERSISTENT, AH.STREAM_K = default
        print(f"== {name} {(B, H, L, D)}: {B * H * triton.cdiv(L, 128)} tiles of 128 rows", flush=True)
        for n, x in t.items():
            rat = statistics.median([c / y for c, y in zip(t["cudnn"], x)])
            print(f"  {n:20s} {statistics.median(x):.4f} ms ({min(x):.4f}-{max(x):.4f})  x cuDNN {rat:.3f}  "
                  f"{acc.get(n, '')}", flush=True)
        (na, *_), (nb, *_) = arms
        for m in forms(D):
            ta, tb = t[f"{m}-{na}"], t[f"{m}-{nb}"]
            print(f"  {m}: {nb} / {na} by round: " + " ".join(f"{y / x:.3f}" for x, y in zip(ta, tb)), flush=True)


if __name__ == "__main__":
    main()
