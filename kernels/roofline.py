"""What this GPU's matmul and memory sustain, measured once, and the bounds they put on the fused
fp8-weight linear (kernels/fp8_linear.py) and the 8-bit attention before those are compiled and timed.

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

The same rates bound the 8-bit attention (kernels/attention.py) against the 16-bit paths (ComfyUI's
SDPA, the exact kernel) before its block configs are compiled. At a few hundred keys
(HunyuanVideo's 256-token text refiner, a UNet's 77-key cross-attention) a 16-bit attention is bound
by its memory traffic, not its FLOPs, and the 8-bit one moves more bytes (its pre-pass reads K and
writes it again): no int8 rate wins that back. Its candidates were 7 of a native HunyuanVideo cold
step's 23 attention compiles, for a class of 0.01-0.03 ms a call where the 8-bit kernel timed
1.76-2.40x the exact one in all 8 recorded H100 and H200 calibrations (2026-11). Where a GPU's matmul
is slow for its memory (an RTX 3090's rates put that class at 33 %) the bound lets it be timed.

``TRITONKIT_FUSED_BOUND=0`` times the fused linear and the 8-bit attention at every size, as before.
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
# The 8-bit attention's best case against the measured 16-bit matmul rate: int8 Q·K at 4x (2x on
# datacenter cards; GeForce cards run the fp32-accumulate 16-bit matmul at half rate, int8 at twice
# the fp16-accumulate one), P·V at 2x (fp8 on sm89+, fp16 accumulation on GeForce).
INT8_QK_SPEEDUP = 4.0
LOW_PV_SPEEDUP = 2.0
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
                                 "(%s: %s); the fused fp8 linear and the 8-bit attention are timed at every size",
                                 type(e).__name__, e)
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


def int8_attention_gain_bound(B: int, H: int, Lq: int, Lk: int, D: int, r: dict, act_bytes: int = 2) -> float:
    """The most the 8-bit attention can gain over a 16-bit attention of the same call, as a share of
    the latter's time, by a roofline of the rates ``r``. The 16-bit one: both matmuls at the matmul
    rate, or Q, K, V read and O written, whichever is longer. The 8-bit one at its best: K read and
    written as int8 by its pre-pass (the least any design quantises ahead), then Q·K at
    INT8_QK_SPEEDUP and P·V at LOW_PV_SPEEDUP times the rate, or Q and O in 16 bits and K and V in 8
    read and written, whichever is longer."""
    bw, rate = r["copy_gbps"] * 1e9, r["matmul_tflops"] * 1e12
    row = B * H * D                      # elements of one token's Q (or K, V, O) over every head
    mm = 2.0 * B * H * Lq * Lk * D       # the FLOPs of one of the two matmuls
    exact = max(2 * mm / rate, act_bytes * row * (2 * Lq + 2 * Lk) / bw)
    prepass = (act_bytes + 1) * row * Lk / bw
    main = max(mm / (INT8_QK_SPEEDUP * rate) + mm / (LOW_PV_SPEEDUP * rate),
               row * (2 * act_bytes * Lq + 2 * Lk) / bw)
    return 1.0 - (prepass + main) / exact


def int8_attention_not_worth_timing(device, B: int, H: int, Lq_bucket: int, Lk_bucket: int, D: int,
                                    dtype: torch.dtype) -> Optional[str]:
    """Why the 8-bit attention is not timed for this shape class on ``device`` (None: time it). The
    bound is taken at the buckets' most tokens (the 8-bit kernel gains with length), since the choice
    serves the whole class."""
    if not enabled() or dtype not in (torch.float16, torch.bfloat16):
        return None
    r = rates(device, dtype)
    if r is None:
        return None
    bound = int8_attention_gain_bound(B, H, Lq_bucket, Lk_bucket, D, r, torch.finfo(dtype).bits // 8)
    if bound >= FUSED_MIN_GAIN:
        return None
    return (f"at most {100 * max(bound, 0.0):.1f} % faster than 16-bit attention at up to {Lq_bucket} queries and "
            f"{Lk_bucket} keys by this GPU's {r['matmul_tflops']:.0f} TFLOPS and {r['copy_gbps']:.0f} GB/s "
            f"(under {100 * FUSED_MIN_GAIN:.0f} %)")
