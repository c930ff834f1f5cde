"""The Gluon exact kernel (kernels/attention_hopper.py) at every block config it could use, beside
the Triton kernel's TMA candidates and the anchors SDPA cuDNN and FA2, on the shapes of real
models. Whole calls as the node makes them (``attention(..., config=...)``); interleaved rounds
(every method once per round), median (min-max), x cuDNN per round; accuracy against an fp32
SDPA reference. sm90 only.

    python bench/attention_hopper.py [--shapes sdxl,flux,hunyuan,wan14b] [--rounds 3] [--rep 40]

With --int8 also the 8-bit kernels (Triton's at its candidates, the Gluon one at several configs,
16-bit and fp8 P·V), with the worst row's cosine. The configs that win go into
attention_hopper.CANDIDATES / CANDIDATES8, where `auto` times them on the user's GPU."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention import A, SHAPES, sdpa  # noqa: E402  (the pack's kernels, through bench/attention.py's import shim)

import tritonkit.kernels.attention_hopper as AH  # noqa: E402

GRID = {128: [(64, 128, 4, (1, 1)), (64, 128, 4, (1, 2))],
        64: [(64, 128, 4, 2), (64, 128, 4, 3)]}
GRID_WS = {128: [(128, 128, 4, 2), (128, 64, 4, 2)],
           64: [(128, 128, 4, 3), (128, 128, 4, 2), (128, 64, 4, 3), (192, 128, 4, 2), (192, 128, 4, 3)]}

GRID8 = {(128, True): [(128, 128, 4, 2), (128, 128, 4, 3)],
         (128, False): [(128, 128, 4, 2), (128, 64, 4, 3)],
         (64, True): [(128, 128, 4, 2), (128, 128, 4, 3), (128, 128, 4, 4)],
         (64, False): [(128, 128, 4, 3), (192, 128, 4, 2)]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="sdxl,flux,hunyuan,wan14b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=250,
                    help="ms of a form's own calls before each timing: clocks follow the power drawn before")
    ap.add_argument("--int8", action="store_true", help="also the 8-bit kernels: Triton's and the Gluon one")
    ap.add_argument("--only", default=None, help="name prefixes of the methods to run, separated by commas, or by '|' "
                    "where a prefix holds a comma (e.g. 'ws(128, 128, 4, 2)|g8'); the anchors always")
    a = ap.parse_args()
    cc = A._device_cc(torch.device("cuda"))
    print(torch.cuda.get_device_name(), f"sm{cc}", "torch", torch.__version__, "triton", triton.__version__,
          "cudnn", torch.backends.cudnn.version(), flush=True)
    for sname in a.shapes.split(","):
        B, H, L, D = SHAPES[sname]
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
        flops = 4 * B * H * L * L * D
        o = torch.empty_like(q)
        meths = {"cudnn": lambda: sdpa("cudnn")(q, k, v), "fa2": lambda: sdpa("flash")(q, k, v)}
        for cfg in A.candidates(cc, D, 2, "exact-tma"):
            meths[f"tma{cfg}"] = (lambda cfg=cfg: A.attention(q, k, v, layout="bhld", config=cfg + (A.TMA_ON,), out=o))
        for cfg in GRID_WS[D]:
            meths[f"ws{cfg}"] = (lambda cfg=cfg: A.attention(q, k, v, layout="bhld", config=cfg + (A.GLUON_WS,),
                                                             out=o))
        for cfg in GRID_WS[D]:
            if cfg[0] == 128:
                meths[f"pp{cfg}"] = (lambda cfg=cfg: A.attention(q, k, v, layout="bhld",
                                                                 config=cfg + (A.GLUON_PP,), out=o))
        for cfg in GRID[D]:
            if AH.smem_bytes(cfg, D) > A._SMEM["sm90"] - 2048:
                continue
            meths[f"gluon{cfg}"] = (lambda cfg=cfg: A.attention(q, k, v, layout="bhld", config=cfg + (A.GLUON,),
                                                                out=o))
        if a.int8:
            for pv, var in ((0, A.G8_HALF), (1, A.G8_FP8)):
                tag = "fp8" if pv else "half"
                for cfg in A.candidates(cc, D, 2, "int8-fp8pv" if pv else True):
                    meths[f"tri8{tag}{cfg}"] = (lambda cfg=cfg, pv=pv: A.attention(
                        q, k, v, layout="bhld", mode="int8", config=cfg + (pv,), out=o))
                for cfg in GRID8[(D, bool(pv))]:
                    meths[f"g8{tag}{cfg}"] = (lambda cfg=cfg, var=var, tag=tag: A.attention(
                        q, k, v, layout="bhld", mode="int8", config=cfg + (var,), out=o, pv=tag))
        if a.only:
            prefixes = tuple(a.only.split("|" if "|" in a.only else ","))
            meths = {n: f for n, f in meths.items() if n in ("cudnn", "fa2") or n.startswith(prefixes)}
        ok = {}
        for name, f in meths.items():
            try:
                o.fill_(float("nan"))
                out = f()
                torch.cuda.synchronize()
                cos = torch.nn.functional.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0).item()
                row = torch.nn.functional.cosine_similarity(out.float().reshape(-1, D), ref.reshape(-1, D), dim=-1)
                err = ((out.float() - ref).norm() / ref.norm()).item()
                print(f"  {sname} {name}: cos {cos:.6f} worst row {row.min().item():.5f} rel {err:.2e} "
                      f"finite {bool(torch.isfinite(out).all())}", flush=True)
                ok[name] = f
            except Exception as e:  # noqa: BLE001
                print(f"  {sname} {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
        times = {n: [] for n in ok}
        for _ in range(a.rounds):
            for n, f in ok.items():
                times[n].append(triton.testing.do_bench(f, warmup=a.warmup, rep=a.rep))
        print(f"| {sname} {(B, H, L, D)} | ms med (min-max) | TFLOPS | x cuDNN med (min-max) |")
        for n in sorted(ok, key=lambda n: statistics.median(times[n])):
            t = times[n]
            m = statistics.median(t)
            r = [c / x for c, x in zip(times["cudnn"], t)] if "cudnn" in times else [float("nan")]
            print(f"| {n} | {m:.4f} ({min(t):.4f}-{max(t):.4f}) | {flops / m / 1e9:.0f} | "
                  f"{statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f}) |", flush=True)
        del q, k, v, ref, o
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
