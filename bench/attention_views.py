"""Attention on K / V that are views, as Flux's and HunyuanVideo's single blocks pass them: Q and K normed and
rotated (contiguous copies), V a view into the block's fused projection, whose rows hold Q, K, V and the MLP's input
(3·H·D + 4·H·D elements: 21504 at Flux's and HunyuanVideo's width). Exact mode reads such a V through TMA since
its 2-D row view may have rows longer than its heads (kernels/attention.py ``_row_fold``); before, only the pointer
loads served it. Methods, one process, interleaved rounds:

- ``cudnn`` / ``fa2``: torch's SDPA on the same views (the anchors; ComfyUI's default on Linux Hopper, 0.8.0 / 0.33)
- ``exact_ptr``: exact mode with pointer loads only (``TRITONKIT_ATTN_TMA=0``: what served V before)
- ``exact``: exact mode as the node runs it (``auto``: pointer loads and the Gluon / TMA forms, timed)
- ``exact_contig``: the same call with V contiguous (what the double blocks' concatenated V gets)
- ``int8``: 8-bit mode as the node runs it, on the views

Times: the calibration's GPU timer (each call after an L2 flush, queued behind a spin; ``gpu``) and ``do_bench``
(``bench``), median and min–max over ``--rounds``; × cuDNN per round. Cosines against a float64 reference on
sampled rows.

    python bench/attention_views.py [--shapes flux,hunyuan] [--rounds 3] [--rep 40]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
import attention as BA  # noqa: E402
from attention import A, C  # noqa: E402

# (B, H, L, D, MLP width): L = image tokens + 512 text tokens at the bench's usual sizes
SHAPES = {"flux": (1, 24, 4608, 128, 12288), "hunyuan": (1, 24, 16384, 128, 12288)}


def make_views(shape, seed=0):
    B, H, L, D, mlp = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    proj = torch.randn(B, L, 3 * H * D + mlp, device="cuda", generator=g).to(torch.bfloat16)
    qkv = proj[..., :3 * H * D].view(B, L, 3, H, D).permute(2, 0, 3, 1, 4)
    q, k = (x.contiguous() for x in qkv[:2])  # ComfyUI's norm and RoPE make new tensors
    return q, k, qkv[2], proj


def methods(q, k, v):
    vc = v.contiguous()
    cudnn, fa2 = BA.sdpa("cudnn"), BA.sdpa("flash")
    exact, exact_ptr, int8 = BA.ours("exact"), BA.ours("exact", tma="0"), BA.ours("int8")
    return {"cudnn": lambda: cudnn(q, k, v), "fa2": lambda: fa2(q, k, v), "exact_ptr": lambda: exact_ptr(q, k, v),
            "exact": lambda: exact(q, k, v), "exact_contig": lambda: exact(q, k, vc), "int8": lambda: int8(q, k, v)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="flux,hunyuan")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep", type=int, default=40, help="do_bench's ms a measurement")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to time")
        return 0
    os.environ.setdefault(C.ENV_DIR, tempfile.mkdtemp())
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}; bf16", flush=True)
    BA.warm_gpu(5)
    shown = set()
    for name in args.shapes.split(","):
        B, H, L, D, mlp = SHAPES[name]
        q, k, v, _proj = make_views(SHAPES[name])
        assert not v.is_contiguous() and v.stride(2) == 3 * H * D + mlp
        fns = methods(q, k, v)
        rows = torch.randperm(L, device="cuda")[:256].sort().values
        acc = {}
        for m, f in fns.items():
            out = f()
            BA.settle(f)
            acc[m] = BA.accuracy(f(), q, k, v, rows)
            del out
        torch.cuda.synchronize()
        flops = 4 * B * H * L * L * D
        gpu, bench = BA.gpu_and_bench_rounds(fns, args.rounds, args.rep)
        print(f"\n{name} (B{B} H{H} L{L} D{D}; V a view, rows of {v.stride(2)} elements)")
        print("| method | GPU time ms | × cuDNN (GPU time) | do_bench ms | × cuDNN (do_bench) | TFLOPS | cos (worst row) |")
        print("|---|---|---|---|---|---|---|")
        for m in fns:
            def cell(series, ref):
                r = [a / b for a, b in zip(ref, series)]
                return f"{statistics.median(r):.3f} ({min(r):.3f}–{max(r):.3f})"
            a = acc[m]
            print(f"| {m} | {statistics.median(gpu[m]):.4f} ({min(gpu[m]):.4f}–{max(gpu[m]):.4f}) | "
                  f"{cell(gpu[m], gpu['cudnn'])} | {statistics.median(bench[m]):.4f} | "
                  f"{cell(bench[m], bench['cudnn'])} | {flops / statistics.median(bench[m]) / 1e9:.0f} | "
                  f"{a['cos']:.6f} ({a['min_row_cos']:.6f}){'' if a['finite'] else ' NaN/inf'} |", flush=True)
        for key, pick in A.tune_cache().items():  # the block configs and variants auto settled on
            if key not in shown:
                shown.add(key)
                print(f"choice {key}: {pick}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
