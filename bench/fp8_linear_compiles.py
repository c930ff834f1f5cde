"""How many binaries of the fused fp8 linear a cold first step compiles for a full-size model, and
what they cost to compile on this host: no GPU needed.

    python bench/fp8_linear_compiles.py [--arch 90] [--model flux|hunyuan|all] [--json out.json]

The layers are the ones the fp8 Fallback node's calibration tunes the fused linear on (M bucket x
N x K, bf16 activations, e4m3fn weights, bf16 bias, one fp32 scale), as recorded by
bench/workflow.py for full-size Flux-dev 1024² and HunyuanVideo 960x544x33. Every layer's
candidates go through the GPU launcher (kernels/fp8_linear.py: ``_launch_cuda``) with the launch
recorded instead of run; the distinct (config, EVEN_K, one token or not) are the binaries Triton
compiles (N, K and the strides are all multiples of 16: one specialization), and each is
cross-compiled for ``--arch`` here, one after the other, into an empty Triton cache.

On a GPU the tuner compiles them in a pool of up to 8 threads, beside the pack's other kernels,
so the summed seconds are CPU time the cold step has to find, not its wall time."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (M bucket, N, K) of the layers tuned in a cold first step (bench/workflow.py, 2026-11, ComfyUI 0.8.0)
LAYERS = {
    "flux": [(1, 18432, 3072), (1, 3072, 256), (1, 3072, 3072), (1, 3072, 768), (1, 6144, 3072),
             (1, 9216, 3072), (4096, 12288, 3072), (4096, 3072, 12288), (4096, 3072, 3072),
             (4096, 3072, 64), (4096, 64, 3072), (4096, 9216, 3072), (512, 12288, 3072),
             (512, 3072, 12288), (512, 3072, 3072), (512, 3072, 4096), (512, 9216, 3072),
             (8192, 21504, 3072), (8192, 3072, 15360)],
    "hunyuan": [(1, 18432, 3072), (1, 3072, 256), (1, 3072, 3072), (1, 3072, 4096), (1, 3072, 768),
                (1, 6144, 3072), (1, 9216, 3072), (256, 12288, 3072), (256, 3072, 12288),
                (256, 3072, 3072), (256, 3072, 4096), (256, 9216, 3072), (8192, 12288, 3072),
                (8192, 21504, 3072), (8192, 3072, 12288), (8192, 3072, 15360), (8192, 3072, 3072),
                (8192, 64, 3072), (8192, 9216, 3072)],
}
CONSTS = dict(FMT=0, ACT=1, BIAS=1, SCALE=1)


def _import_pack():
    pkg = types.ModuleType("tritonkit")
    pkg.__path__ = [str(ROOT)]
    sys.modules.setdefault("tritonkit", pkg)
    from tritonkit.kernels import fp8_linear
    return fp8_linear


def binaries(fl, layers) -> dict:
    """(BLOCK_N, BLOCK_M, BLOCK_K, GROUP, warps, stages, EVEN_K, one token) -> the layers that need it."""
    import torch
    seen: dict = {}
    layer = [None]

    def record(kernel, grid, *args, warmup=False, **kw):
        key = (kw["BLOCK_N"], kw["BLOCK_M"], kw["BLOCK_K"], kw["GROUP"], kw["num_warps"],
               kw["num_stages"], bool(kw["EVEN_K"]), args[5] == 1)
        seen.setdefault(key, []).append(layer[0])

    def every_candidate(device, key, cands, run, warm=None, **_):
        for c in cands:
            (warm or run)(c)
        return cands[0]
    saved = fl.launch_kernel, fl.capability, fl.tuning.pick
    fl.launch_kernel, fl.capability, fl.tuning.pick = record, (lambda dev: 90), every_candidate
    try:
        for M, N, K in layers:
            layer[0] = (M, N, K)
            args = (None, None, None, None, None, M, N, K, K, N)
            fl._launch_cuda(args, CONSTS, M, N, K, torch.device("cpu"))
    finally:
        fl.launch_kernel, fl.capability, fl.tuning.pick = saved
    return seen


def compile_seconds(fl, key, arch: int) -> float:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    bn, bm, bk, group, warps, stages, even_k, one = key
    kernel, sig, consts = fl._lspec("*bf16", CONSTS["FMT"], CONSTS["ACT"], "*bf16", CONSTS["BIAS"],
                                    CONSTS["SCALE"], bn, bm, bk)
    consts = dict(consts, EVEN_K=even_k, GROUP=group)
    if one:
        sig = dict(sig, M="constexpr")
        consts["M"] = 1
    t0 = time.perf_counter()
    triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts), target=GPUTarget("cuda", arch, 32),
                   options={"num_warps": warps, "num_stages": stages})
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--model", choices=["flux", "hunyuan", "all"], default="all")
    ap.add_argument("--no-compile", action="store_true", help="count the binaries only")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    fl = _import_pack()
    out = {"arch": a.arch, "host_cpus": os.cpu_count(), "models": {}}
    print(f"| model | bucket | binaries | of them masked | compile s (sm{a.arch}, one after the other) |")
    print("|---|---|---:|---:|---:|")
    for model in (["flux", "hunyuan"] if a.model == "all" else [a.model]):
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="tk_fl_compiles_")  # each model's compiles cold
        bins = binaries(fl, LAYERS[model])
        rows = {}
        for key, layers in sorted(bins.items()):
            # a binary counts in the largest bucket that launches it (the 65-512-token configs share
            # three with the large-M ones)
            bucket = "1 token" if key[7] else ("65-512 only" if max(m for m, _, _ in layers) <= 512 else "large")
            r = rows.setdefault(bucket, {"binaries": 0, "masked": 0, "compile_s": 0.0})
            r["binaries"] += 1
            r["masked"] += not key[6]
            if not a.no_compile:
                r["compile_s"] += compile_seconds(fl, key, a.arch)
        for bucket, r in rows.items():
            print(f"| {model} | {bucket} | {r['binaries']} | {r['masked']} | "
                  f"{'-' if a.no_compile else round(r['compile_s'], 1)} |", flush=True)
        tot = {k: sum(r[k] for r in rows.values()) for k in ("binaries", "masked", "compile_s")}
        print(f"| {model} | all | {tot['binaries']} | {tot['masked']} | "
              f"{'-' if a.no_compile else round(tot['compile_s'], 1)} |", flush=True)
        out["models"][model] = {"buckets": rows, "total": tot}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
