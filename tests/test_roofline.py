"""The roofline bounds on the fused fp8-weight linear and the 8-bit attention (kernels/roofline.py):
the bounds themselves, when they drop the fused / 8-bit candidate, and, on a GPU, this GPU's rates
measured once and read back by a second process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tritonkit.kernels import calibration as C
from tritonkit.kernels import roofline as R

REPO = Path(__file__).resolve().parents[1]
# rates of the order of an H100's (a dense bf16 matmul, a device-to-device copy) and an RTX 3090's
HOPPER = {"matmul_tflops": 700.0, "copy_gbps": 3000.0}
GA102 = {"matmul_tflops": 65.0, "copy_gbps": 850.0}


@pytest.fixture(autouse=True)
def clean(tmp_path, monkeypatch):
    monkeypatch.setenv(C.ENV_DIR, str(tmp_path / "calib"))
    monkeypatch.delenv(R.ENV, raising=False)
    C.reset()
    R._RATES.clear()
    yield
    C.set_timer(None)
    C.reset()
    R._RATES.clear()


def paths_ms(M, N, K, r, act=2):
    """Each path's roofline time, written out on its own (seconds)."""
    bw, f = r["copy_gbps"] * 1e9, r["matmul_tflops"] * 1e12
    io = act * (M * K + M * N) / bw
    decode_then_mm = 3 * N * K / bw + max(2 * M * N * K / f, 2 * N * K / bw + io)
    fused = max(2 * M * N * K / f, N * K / bw + io)
    return decode_then_mm, fused


@pytest.mark.parametrize("r", [HOPPER, GA102], ids=["hopper", "ga102"])
@pytest.mark.parametrize("N,K", [(3072, 3072), (12288, 3072), (3072, 15360)])
def test_bound_is_the_share_the_decode_path_spends_beyond_the_fused_one(r, N, K):
    last = 1.0
    for M in (1, 16, 256, 1024, 4097, 16385, 32768):
        b = R.fused_gain_bound(M, N, K, r)
        d, f = paths_ms(M, N, K, r)
        assert b == pytest.approx(1 - f / d, rel=1e-9)
        assert 0.0 < b <= last + 1e-12       # more tokens: the matmul's FLOPs hide the decode more
        last = b
    # one token: every path streams the weight; decode + matmul moves 5 bytes a weight, the fused 1
    assert R.fused_gain_bound(1, N, K, r) == pytest.approx(0.8, abs=0.01)


def test_where_the_fused_candidate_is_timed(monkeypatch):
    monkeypatch.setattr(R, "rates", lambda device, dtype: dict(HOPPER))
    cuda = torch.device("cuda")
    # HunyuanVideo's 18,616 tokens (bucket 32768) on a 3072x3072 layer: about 2 %, not timed
    why = R.fused_not_worth_timing(cuda, 32768, 3072, 3072, torch.bfloat16)
    assert why is not None and "from 16385 tokens" in why and "700 TFLOPS" in why
    # Flux's 4,608 (bucket 8192, bound taken at 4097 tokens): about 9 % on Hopper rates, timed
    assert R.fused_gain_bound(4097, 3072, 3072, HOPPER) > R.FUSED_MIN_GAIN
    assert R.fused_not_worth_timing(cuda, 8192, 3072, 3072, torch.bfloat16) is None
    # ... but not on an RTX 3090's: its matmul is 11x slower, its memory 3.5x
    monkeypatch.setattr(R, "rates", lambda device, dtype: dict(GA102))
    assert R.fused_not_worth_timing(cuda, 8192, 3072, 3072, torch.float16) is not None
    assert R.fused_not_worth_timing(cuda, 256, 3072, 3072, torch.float16) is None
    # rates unknown (CPU, a fake clock, a GPU out of memory): always timed
    monkeypatch.setattr(R, "rates", lambda device, dtype: None)
    assert R.fused_not_worth_timing(cuda, 32768, 3072, 3072, torch.bfloat16) is None
    # switched off: always timed
    monkeypatch.setattr(R, "rates", lambda device, dtype: dict(HOPPER))
    monkeypatch.setenv(R.ENV, "0")
    assert R.fused_not_worth_timing(cuda, 32768, 3072, 3072, torch.bfloat16) is None


def attention_times(B, H, Lq, Lk, D, r, act=2):
    """A 16-bit attention's roofline time and the 8-bit one's best case, written out (seconds)."""
    bw, f = r["copy_gbps"] * 1e9, r["matmul_tflops"] * 1e12
    qk = pv = 2 * B * H * Lq * Lk * D
    sixteen = max((qk + pv) / f, act * B * H * D * (Lq + Lk + Lk + Lq) / bw)   # Q, K, V read, O written
    prepass = (act + 1) * B * H * D * Lk / bw                                  # K read, int8 K written
    main = max(qk / (4 * f) + pv / (2 * f), B * H * D * (act * Lq + Lk + Lk + act * Lq) / bw)
    return sixteen, prepass + main


@pytest.mark.parametrize("r", [HOPPER, GA102], ids=["hopper", "ga102"])
@pytest.mark.parametrize("B,H,D", [(1, 24, 128), (2, 10, 64), (2, 8, 40)])
def test_int8_attention_bound(r, B, H, D):
    last = -10.0
    for L in (64, 256, 512, 1024, 4096, 32768):
        b = R.int8_attention_gain_bound(B, H, L, L, D, r)
        exact, int8 = attention_times(B, H, L, L, D, r)
        assert b == pytest.approx(1 - int8 / exact, rel=1e-9)
        assert b >= last - 1e-12  # more keys: the FLOPs the int8 rate speeds up take over
        last = b
    # long sequences: compute-bound, the int8 rates' gain shows (Q·K at 4x, P·V at 2x: 62.5 %)
    assert R.int8_attention_gain_bound(B, H, 32768, 32768, D, r) == pytest.approx(0.625, abs=0.01)


def test_where_the_8bit_attention_is_timed(monkeypatch):
    monkeypatch.setattr(R, "rates", lambda device, dtype: dict(HOPPER))
    cuda = torch.device("cuda")
    # HunyuanVideo's 256-token text refiner on Hopper rates: bound by bytes, not timed
    why = R.int8_attention_not_worth_timing(cuda, 1, 24, 256, 256, 128, torch.bfloat16)
    assert why is not None and "up to 256 queries and 256 keys" in why and "700 TFLOPS" in why
    # a UNet's cross-attention (4096 queries, 77 keys: bucket 128): not timed either
    assert R.int8_attention_not_worth_timing(cuda, 2, 10, 4096, 128, 64, torch.float16) is not None
    # HunyuanVideo's and Flux's joint attention, SDXL's 4096 and 1024 tokens: timed
    for shape in [(1, 24, 32768, 32768, 128), (1, 24, 8192, 8192, 128), (2, 10, 4096, 4096, 64),
                  (2, 20, 1024, 1024, 64)]:
        assert R.int8_attention_not_worth_timing(cuda, *shape, torch.bfloat16) is None, shape
    # an RTX 3090's matmul is slow for its memory: the refiner's class is compute-bound there, timed
    monkeypatch.setattr(R, "rates", lambda device, dtype: dict(GA102))
    assert R.int8_attention_not_worth_timing(cuda, 1, 24, 256, 256, 128, torch.float16) is None
    # fp32 attention (8-bit is not allowed there anyway), rates unknown, switched off: no bound
    monkeypatch.setattr(R, "rates", lambda device, dtype: dict(HOPPER))
    assert R.int8_attention_not_worth_timing(cuda, 1, 24, 256, 256, 128, torch.float32) is None
    monkeypatch.setenv(R.ENV, "0")
    assert R.int8_attention_not_worth_timing(cuda, 1, 24, 256, 256, 128, torch.bfloat16) is None
    monkeypatch.delenv(R.ENV)
    monkeypatch.setattr(R, "rates", lambda device, dtype: None)
    assert R.int8_attention_not_worth_timing(cuda, 1, 24, 256, 256, 128, torch.bfloat16) is None


def test_no_rates_off_a_gpu_or_under_a_fake_clock():
    assert R.rates(torch.device("cpu"), torch.bfloat16) is None
    C.set_timer(lambda name, fn: 1.0)
    assert R.rates(torch.device("cuda"), torch.bfloat16) is None


@pytest.mark.gpu
def test_gpu_rates_are_measured_once_and_read_back_by_a_second_process(tmp_path):
    dev = torch.device("cuda")
    r = R.rates(dev, torch.bfloat16)
    assert r is not None and r["matmul_tflops"] > 5 and r["copy_gbps"] > 100, r
    assert C.recall(dev, "rates|bfloat16") == r
    script = textwrap.dedent(f"""
        import json, sys, types, torch
        pkg = types.ModuleType("tritonkit"); pkg.__path__ = [{str(REPO)!r}]; sys.modules["tritonkit"] = pkg
        from tritonkit.kernels import roofline as R
        called = []
        R._measure = lambda *a: called.append(1) or {{"matmul_tflops": 1.0, "copy_gbps": 1.0}}
        r = R.rates(torch.device("cuda"), torch.bfloat16)
        print(json.dumps({{"rates": r, "measured": len(called)}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ}, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"rates": r, "measured": 0}
