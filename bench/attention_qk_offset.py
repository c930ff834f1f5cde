"""The Triton 8-bit kernel's int32 Q·Kᵀ scores: accumulated onto 1.5·2^23's bits (``QK_OFFSET``, the
default: the scores read as floats with no conversion) against an int-to-float conversion a score
(I2FP, as many as the exponentials). Whole calls of kernels/attention.py's ``attention(mode="int8")``
at fixed configs (the first two of each arch's candidate table, both P·V forms), the two forms
interleaved in one process: the calibration's GPU timer (L2 flushed, behind a spin) and ``do_bench``
back to back, median of ``--rounds`` rounds, and the outputs' cosine against bf16 SDPA (a sanity
check) and their largest difference.

    python bench/attention_qk_offset.py [--shapes sdxl,flux,hunyuan,wan14b] [--archs 89,90] [--rounds 3]

``--archs``: the candidate tables (block configs) to take; the kernel is compiled for the GPU it runs
on either way (on an H100 / H200 the @89 rows are sm90 code at an Ada card's configs)."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import triton

os.environ.setdefault("TRITONKIT_FAST_LAUNCH", "0")  # the form is injected per launch: no launch plans
sys.path.insert(0, str(Path(__file__).resolve().parent))
import attention as BA  # noqa: E402
from attention import A, C, SHAPES  # noqa: E402

_FORM = {"qk_offset": True}
_launch = A.launch_kernel


def _launch_with_form(kernel, grid, *args, plan=None, **kwargs):
    if kwargs.get("INT8") and "PV_MODE" in kwargs:
        kwargs["QK_OFFSET"] = _FORM["qk_offset"]
    return _launch(kernel, grid, *args, **kwargs)


def _calls(q, k, v, c5, outs):
    def make(name, flag):
        def f():
            _FORM["qk_offset"] = flag
            A.attention(q, k, v, layout="bhld", mode="int8", config=c5, out=outs[name])
        return f
    return {"offset": make("offset", True), "i2f": make("i2f", False)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="sdxl,flux,hunyuan,wan14b")
    ap.add_argument("--archs", default="89,90")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep", type=int, default=40, help="do_bench's ms a measurement")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to time")
        return 0
    os.environ[C.ENV_DIR] = tempfile.mkdtemp()
    A.launch_kernel = _launch_with_form
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; "
          f"i2f/offset > 1: the offset form is faster", flush=True)
    for shape in args.shapes.split(","):
        B, H, L, D = SHAPES[shape]
        q, k, v = BA.make_inputs(SHAPES[shape], torch.bfloat16, False)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v).float().flatten()
        flops = 4 * B * H * L * L * D
        for arch in (int(a) for a in args.archs.split(",")):
            for pv, kind in ((0, True), (1, "int8-fp8pv")):
                if pv == 1 and not A.fp8_pv_supported(arch):
                    continue
                for cfg in A.candidates(arch, A.block_d_for(D), 2, kind)[:2]:
                    c5 = tuple(cfg) + (pv,)
                    outs = {n: torch.full_like(q, float("nan")) for n in ("offset", "i2f")}
                    fns = _calls(q, k, v, c5, outs)
                    for f in fns.values():
                        f()
                    torch.cuda.synchronize()
                    cos = {n: torch.nn.functional.cosine_similarity(o.float().flatten(), ref, dim=0).item()
                           for n, o in outs.items()}
                    diff = (outs["offset"].float() - outs["i2f"].float()).abs().max().item()
                    gpu, bench = BA.gpu_and_bench_rounds(fns, args.rounds, args.rep)
                    g = {n: statistics.median(x) for n, x in gpu.items()}
                    b = {n: statistics.median(x) for n, x in bench.items()}
                    print(f"{shape} @{arch} P·V {'fp8' if pv else '16-bit'} {cfg}: GPU time offset {g['offset']:.3f} "
                          f"i2f {g['i2f']:.3f} ms, i2f/offset {g['i2f'] / g['offset']:.3f} (rounds "
                          f"{[round(a / o, 3) for a, o in zip(gpu['i2f'], gpu['offset'])]}); do_bench offset "
                          f"{b['offset']:.3f} i2f {b['i2f']:.3f}, {b['i2f'] / b['offset']:.3f} (rounds "
                          f"{[round(a / o, 3) for a, o in zip(bench['i2f'], bench['offset'])]}); offset "
                          f"{flops / b['offset'] / 1e9:.0f} TFLOPS; cos vs SDPA offset {cos['offset']:.6f} i2f "
                          f"{cos['i2f']:.6f}; max |offset - i2f| {diff:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
