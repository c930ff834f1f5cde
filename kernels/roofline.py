"""What this GPU's matmul and memory sustain, measured once, and the bound that puts on the fused
fp8-weight linear (kernels/fp8_linear.py) before it is compiled and timed.

The calibration of an fp8 layer (nodes/fp8_fallback.py) times three paths: ComfyUI's cast + matmul,
our decode + cuBLAS's matmul, and the fused linear. The fused linear differs from decode + matmul in
one thing only: it reads the fp8 weight inside its matmul instead of decoding it to a 16-bit copy
first. Its matmul is Triton's, which at compute-bound sizes is no faster than cuBLAS's (it never won
in 184 calibrations from 4096 tokens up on the H100 and H200: fused ÷ decode 1.03-2.37,
BENCHMARKS.md). So it can gain at most what the decode and the matmul's wider weight read cost, and
by a roofline of this GPU's own rates that bound is small where the matmul is long: 2.4 % at
HunyuanVideo's 18,616 tokens on a 3072×3072 layer of an H100. Timing it there costs a tuning of its
block configs (seven compiles, each candidate milliseconds a call) for a path that cannot win by
more than the calibration's own noise.

The rates are those of this GPU, never a table: a large bf16/fp16 matmul (cuBLAS) and a
device-to-device copy, timed once with the calibration's timer and stored with the calibration
(keyed by GPU, driver, torch, Triton and pack version). The decode runs at 96-99 % of that copy
(BENCHMARKS.md), so the copy's bytes per second stand for it (the decode's share is then at most 4 %
larger than the bound puts it). The 4096³ matmul is not quite the fastest matmul: on an H100 and an
H200 it ran at 758-764 TFLOPS where HunyuanVideo's 18,616 × 3072 × 3072 matmuls reached about 840,
so the bound there is about a tenth lower than at that rate (2.4 % against 2.6 %): far from
FUSED_MIN_GAIN. A larger probe would close that gap but take memory beside a loaded model.

``TRITONKIT_FUSED_BOUND=0`` times the fused linear at every size, as before.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Optional

import torch

from . import calibration

log = logging.getLogger("TritonKit")

ENV = "TRITONKIT_FUSED_BOUND"
# The fused candidate is timed only where the roofline lets it gain at least this share of the decode
# path's time: less is within what the calibration already treats as noise between two paths (its
# PREFER_MARGIN: picks closer than 5 % flipped from one process to the next).
FUSED_MIN_GAIN = calibration.PREFER_MARGIN
MATMUL_N = 4096              # the square matmul whose rate stands for this GPU's peak
COPY_ELEMENTS = 32 << 20     # a 64 MB bf16 copy: far beyond any L2 (the timer flushes it too)
_KEY = "rates|{}"
_RATES: dict = {}            # (str(device), dtype name) -> {"matmul_tflops": ..., "copy_gbps": ...}
_LOCK = threading.Lock()


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _measure(device: torch.device, dtype: torch.dtype) -> dict:
    """This GPU's matmul TFLOPS in ``dtype`` and copy GB/s, with the calibration's timer."""
    with torch.cuda.device(device):
        g = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(MATMUL_N, MATMUL_N, device=device, dtype=dtype, generator=g)
        b = torch.randn(MATMUL_N, MATMUL_N, device=device, dtype=dtype, generator=g)
        ms_mm = calibration.cuda_timer(lambda: torch.mm(a, b))
        del a, b
        src = torch.empty(COPY_ELEMENTS, device=device, dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        ms_cp = calibration.cuda_timer(lambda: dst.copy_(src))
        nbytes = 2 * src.numel() * src.element_size()
        del src, dst
    return {"matmul_tflops": round(2 * MATMUL_N ** 3 / ms_mm / 1e9, 1),
            "copy_gbps": round(nbytes / ms_cp / 1e6, 1)}


def rates(device, dtype: torch.dtype) -> Optional[dict]:
    """This GPU's measured rates (stored, else measured now), or None where they can't be measured
    (not a CUDA device, a test's fake clock, an out-of-memory GPU): then nothing is bounded."""
    dev = torch.device(device)
    if dev.type != "cuda" or calibration.timer_is_fake() or not calibration.can_time(dev):
        return None
    k = (str(dev), _dtype_name(dtype))
    with _LOCK:
        hit = _RATES.get(k)
        if hit is not None:
            return hit
        stored = calibration.recall(dev, _KEY.format(k[1]))
        if _valid(stored):
            _RATES[k] = stored
            return stored
        try:
            r = _measure(dev, dtype)
        except Exception as e:  # noqa: BLE001 - e.g. out of memory beside a loaded model
            calibration.log_once("rates:" + str(k), "TritonKit: could not measure this GPU's matmul and copy rates "
                                 "(%s: %s); the fused fp8 linear is timed at every size", type(e).__name__, e)
            return None
        if not _valid(r):
            return None
        _RATES[k] = r
        calibration.remember(dev, _KEY.format(k[1]), r)
        log.info("TritonKit: %s sustains %.0f TFLOPS (%s matmul) and %.0f GB/s (copy), measured once",
                 calibration.store_for(dev).env.get("gpu"), r["matmul_tflops"], k[1], r["copy_gbps"])
        return r


def _valid(r) -> bool:
    return (isinstance(r, dict) and all(isinstance(r.get(f), (int, float)) and r[f] > 0
                                        for f in ("matmul_tflops", "copy_gbps")))


def fused_gain_bound(M: int, N: int, K: int, r: dict, act_bytes: int = 2) -> float:
    """The most the fused linear can gain over decode + matmul, as a share of the latter's time, by
    a roofline of the rates ``r``: each path takes at least its FLOPs at the matmul rate or its
    bytes at the copy rate, whichever is longer. The decode reads 1 byte and writes 2 a weight, the
    matmul reads the 16-bit copy back; the fused linear reads the fp8 weight once."""
    flops = 2.0 * M * N * K / (r["matmul_tflops"] * 1e12)
    bw = r["copy_gbps"] * 1e9
    io = act_bytes * (M * K + M * N) / bw
    decode = 3.0 * N * K / bw
    matmul = max(flops, 2.0 * N * K / bw + io)
    fused = max(flops, 1.0 * N * K / bw + io)
    return 1.0 - fused / (decode + matmul)


def fused_not_worth_timing(device, M_bucket: int, N: int, K: int, dtype: torch.dtype) -> Optional[str]:
    """Why the fused linear is not timed for this layer shape and token bucket on ``device`` (None:
    time it). The bound is taken at the bucket's fewest tokens, since the choice serves the whole
    bucket."""
    if not enabled():
        return None
    r = rates(device, dtype)
    if r is None:
        return None
    M = max(1, M_bucket // 2 + 1)
    bound = fused_gain_bound(M, N, K, r, torch.finfo(dtype).bits // 8)
    if bound >= FUSED_MIN_GAIN:
        return None
    return (f"at most {100 * max(bound, 0.0):.1f} % faster than decode + matmul from {M} tokens by this GPU's "
            f"{r['matmul_tflops']:.0f} TFLOPS and {r['copy_gbps']:.0f} GB/s (under {100 * FUSED_MIN_GAIN:.0f} %)")
