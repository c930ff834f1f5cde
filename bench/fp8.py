"""fp8 casts and the fused fp8-weight linear against their anchors, measured in one run.

    python bench/fp8.py [--quick] [--json out.json]

* decode e4m3fn -> bf16 (and fp16), encode bf16 -> e4m3fn: GB/s counted as bytes read + bytes
  written, against a device-to-device copy moving the same number of bytes and against torch's
  own cast (``w.to(bf16)`` / ``x.to(float8_e4m3fn)``). Goal: >= 85% of the copy, >= 3.5x torch.
* fused W8A16 linear (bf16 activations, e4m3fn weights, bf16 bias) on Flux's layer shapes
  (N x K = 3072x12288, 12288x3072, 3072x3072, 3072x9216) against torch's bf16 ``F.linear`` with
  a bf16 weight (goal >= 0.95x at M = 4608) and against ComfyUI's fallback, cast + ``F.linear``
  (goal >= 3x at M = 1 and 16).

Timings: triton.testing.do_bench (median, L2 flushed between calls); the autotuner runs first."""
from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLUX_SHAPES = [(3072, 12288), (12288, 3072), (3072, 3072), (3072, 9216)]


def _import_pack():
    pkg = types.ModuleType("tritonkit")
    pkg.__path__ = [str(ROOT)]
    sys.modules.setdefault("tritonkit", pkg)
    from tritonkit.kernels import fp8, fp8_linear
    return fp8, fp8_linear


def bench_casts(fp8, n, rep):
    import torch
    from triton.testing import do_bench
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(n, device="cuda", generator=g) * 0.05).to(torch.float8_e4m3fn)
    rows = []
    traffic = 3 * n  # 1 byte read + 2 written per element
    src = torch.empty(traffic // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t_copy = do_bench(lambda: dst.copy_(src), rep=rep)
    for dt in (torch.bfloat16, torch.float16):
        out = torch.empty(n, dtype=dt, device="cuda")
        t_ours = do_bench(lambda: fp8.decode(w, dt, out=out), rep=rep)
        t_torch = do_bench(lambda: w.to(dt), rep=rep)
        assert torch.equal(fp8.decode(w, dt).view(torch.int16), w.to(dt).view(torch.int16))
        rows.append(dict(op=f"decode e4m3fn->{str(dt)[6:]}", n=n, ms=t_ours, torch_ms=t_torch, copy_ms=t_copy,
                         gbs=traffic / t_ours / 1e6, torch_gbs=traffic / t_torch / 1e6, copy_gbs=traffic / t_copy / 1e6))
    x = w.to(torch.bfloat16)
    q = torch.empty(n, dtype=torch.float8_e4m3fn, device="cuda")
    t_ours = do_bench(lambda: fp8.encode(x, torch.float8_e4m3fn, out=q), rep=rep)
    t_torch = do_bench(lambda: x.to(torch.float8_e4m3fn), rep=rep)
    rows.append(dict(op="encode bf16->e4m3fn", n=n, ms=t_ours, torch_ms=t_torch, copy_ms=t_copy,
                     gbs=traffic / t_ours / 1e6, torch_gbs=traffic / t_torch / 1e6, copy_gbs=traffic / t_copy / 1e6))
    return rows


def sweep_decode(fp8, n, rep):
    """Block size / warps of the decode kernel (the shipped values are DECODE_BLOCK/DECODE_WARPS)."""
    import torch
    from triton.testing import do_bench
    w = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    out = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    res = []
    saved = fp8.DECODE_BLOCK, fp8.DECODE_WARPS
    try:
        for block in (1024, 2048, 4096, 8192, 16384):
            for warps in (4, 8):
                fp8.DECODE_BLOCK, fp8.DECODE_WARPS = block, warps
                t = do_bench(lambda: fp8.decode(w, torch.bfloat16, out=out), rep=rep)
                res.append(dict(block=block, warps=warps, ms=t, gbs=3 * n / t / 1e6))
    finally:
        fp8.DECODE_BLOCK, fp8.DECODE_WARPS = saved
    return res


def bench_linear(fp8, fl, shapes, ms_list, rep):
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for N, K in shapes:
        w8 = (torch.randn(N, K, device="cuda", generator=g) * 0.02).to(torch.float8_e4m3fn)
        wbf = w8.to(torch.bfloat16)
        b = torch.randn(N, device="cuda", generator=g).to(torch.bfloat16)
        for M in ms_list:
            x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
            y = fl.linear(x, w8, b)  # autotunes
            err = ((y.float() - F.linear(x, wbf, b).float()).abs().max() / y.float().abs().max()).item()
            t_ours = do_bench(lambda: fl.linear(x, w8, b), rep=rep)
            t_bf16 = do_bench(lambda: F.linear(x, wbf, b), rep=rep)
            t_cast = do_bench(lambda: F.linear(x, w8.to(torch.bfloat16), b), rep=rep)
            t_dec = do_bench(lambda: F.linear(x, fp8.decode(w8, torch.bfloat16), b), rep=rep)
            best = next((v for k, v in fl.tuning.cache().items()
                         if k.startswith("fp8_linear_config|") and f"|M{fl.m_bucket(M)}|N{N}|K{K}|" in k), None)
            rows.append(dict(N=N, K=K, M=M, ms=t_ours, bf16_ms=t_bf16, cast_mm_ms=t_cast, decode_mm_ms=t_dec,
                             tflops=2 * M * N * K / t_ours / 1e9, bf16_tflops=2 * M * N * K / t_bf16 / 1e9,
                             weight_gbs=N * K / t_ours / 1e6, rel_err=err,
                             vs_bf16=t_bf16 / t_ours, vs_cast_mm=t_cast / t_ours, config=str(best)))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer shapes and sizes")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import torch
    import triton
    fp8, fl = _import_pack()
    rep = 50 if a.quick else 200
    env = dict(device=torch.cuda.get_device_name(0), cc=".".join(map(str, torch.cuda.get_device_capability())),
               torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
               command="python bench/fp8.py" + (" --quick" if a.quick else ""))
    print(json.dumps(env))
    casts = []
    for n in ((3072 * 12288,) if a.quick else (3072 * 12288, 256 * 1024 * 1024)):
        casts += bench_casts(fp8, n, rep)
    print("\n| op | elements | ours GB/s | torch cast GB/s | copy GB/s | % of copy | x torch |")
    print("|---|---|---|---|---|---|---|")
    for r in casts:
        print(f"| {r['op']} | {r['n']:,} | {r['gbs']:.0f} | {r['torch_gbs']:.0f} | {r['copy_gbs']:.0f} | "
              f"{100 * r['gbs'] / r['copy_gbs']:.0f}% | {r['torch_ms'] / r['ms']:.2f}x |")
    sweep = sweep_decode(fp8, 3072 * 12288, rep)
    print("\ndecode block sweep (e4m3fn->bf16, 37.7 M):",
          ", ".join(f"{s['block']}/{s['warps']}w {s['gbs']:.0f}" for s in sweep))
    ms_list = (1, 16, 4608) if a.quick else (1, 16, 256, 1024, 4608)
    lin = bench_linear(fp8, fl, FLUX_SHAPES, ms_list, rep)
    print("\n| N x K | M | fused ms | TFLOPS | weight GB/s | bf16 F.linear ms | torch cast+mm ms | our decode+mm ms "
          "| fused vs bf16 | fused vs cast+mm | decode+mm vs cast+mm | config |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in lin:
        cfg = r["config"].replace(", num_ctas: 1", "").replace(", maxnreg: None", "")
        print(f"| {r['N']}x{r['K']} | {r['M']} | {r['ms']:.4f} | {r['tflops']:.0f} | {r['weight_gbs']:.0f} | "
              f"{r['bf16_ms']:.4f} | {r['cast_mm_ms']:.4f} | {r['decode_mm_ms']:.4f} | {r['vs_bf16']:.2f}x | "
              f"{r['vs_cast_mm']:.2f}x | {r['cast_mm_ms'] / r['decode_mm_ms']:.2f}x | {cfg} |")
    if a.json:
        Path(a.json).write_text(json.dumps(dict(env=env, casts=casts, sweep=sweep, linear=lin), indent=1))


if __name__ == "__main__":
    main()
