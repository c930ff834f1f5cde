"""Which loop structure and block config does the installed Triton turn into the fastest attention
on this GPU? Minimal kernels (not the pack's: no masks, no padding, L a multiple of the blocks,
(B·H, L, D) contiguous) in every structure the pack could use: pointer or TMA loads, Triton's warp
specialisation, BLOCK_M 64 / 128, BLOCK_N 64 / 128, 4 / 8 warps, 2 / 3 stages; exact bf16 and
int8 Q·K (quantised beforehand, so the 8-bit rows time the kernel alone). Beside them the pack's
own kernel at fixed configs (whole calls, the 8-bit ones with their quantisation) and the anchors
SDPA cuDNN and FA2. Interleaved rounds, median (min–max), × cuDNN of the same round's median.

    python bench/attention_variants.py [--shapes flux,hunyuan,sdxl] [--rounds 3] [--rep 30]

The ceiling it measures decides what a kernel change can still gain; the configs that win go into
kernels/attention.py's candidate tables, where `auto` times them on the user's GPU."""
from __future__ import annotations
import argparse
import math
import os
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention import A as OURS  # noqa: E402  (the pack's kernels, through bench/attention.py's import shim)

LOG2E = 1.4426950408889634


@triton.jit
def _tile(L, BLOCK_M: tl.constexpr):
    """This program's query block and batch·head, query blocks fastest."""
    pid = tl.program_id(0)
    nm = L // BLOCK_M
    return pid % nm, pid // nm


@triton.jit
def _start(BLOCK_M: tl.constexpr, D: tl.constexpr):
    """The online softmax's running max, running sum and the output accumulator."""
    return (tl.zeros([BLOCK_M], tl.float32) - float("inf"), tl.zeros([BLOCK_M], tl.float32),
            tl.zeros([BLOCK_M, D], tl.float32))


@triton.jit
def _softmax_step(qk, c, m_i, l_i, acc):
    m_ij = tl.maximum(m_i, tl.max(qk, 1) * c)
    p = tl.math.exp2(qk * c - m_ij[:, None])
    alpha = tl.math.exp2(m_i - m_ij)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    return p, m_ij, l_i, acc


@triton.jit
def exact_ptr(Q, K, V, O, c, L, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
              WS: tl.constexpr):
    sm, bh = _tile(L, BLOCK_M)
    base = bh.to(tl.int64) * L * D
    offs_m = sm * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :])
    m_i, l_i, acc = _start(BLOCK_M, D)
    for start_n in tl.range(0, L, BLOCK_N, warp_specialize=WS):
        k = tl.load(K + base + (start_n + offs_n)[:, None] * D + offs_d[None, :])
        qk = tl.dot(q, tl.trans(k))
        p, m_i, l_i, acc = _softmax_step(qk, c, m_i, l_i, acc)
        v = tl.load(V + base + (start_n + offs_n)[:, None] * D + offs_d[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc)
    tl.store(O + base + offs_m[:, None] * D + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty))


@triton.jit
def exact_tma(QD, KD, VD, OD, c, L, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
              WS: tl.constexpr):
    sm, bh = _tile(L, BLOCK_M)
    row0 = bh * L
    q = QD.load([row0 + sm * BLOCK_M, 0])
    m_i, l_i, acc = _start(BLOCK_M, D)
    for start_n in tl.range(0, L, BLOCK_N, warp_specialize=WS):
        k = KD.load([row0 + start_n, 0])
        qk = tl.dot(q, tl.trans(k))
        p, m_i, l_i, acc = _softmax_step(qk, c, m_i, l_i, acc)
        v = VD.load([row0 + start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
    OD.store([row0 + sm * BLOCK_M, 0], (acc / l_i[:, None]).to(OD.dtype))


@triton.jit
def int8_ptr(Q, K, V, O, QS, KS, L, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
             WS: tl.constexpr):
    sm, bh = _tile(L, BLOCK_M)
    bh = bh.to(tl.int64)
    base = bh * L * D
    offs_m = sm * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :])
    qc = tl.load(QS + bh * L + offs_m)
    m_i, l_i, acc = _start(BLOCK_M, D)
    KS_b = KS + bh * (L // BLOCK_N)
    for start_n in tl.range(0, L, BLOCK_N, warp_specialize=WS):
        k = tl.load(K + base + (start_n + offs_n)[:, None] * D + offs_d[None, :])
        qk = tl.dot(q, tl.trans(k)).to(tl.float32)
        c = qc * tl.load(KS_b + start_n // BLOCK_N)
        m_ij = tl.maximum(m_i, tl.max(qk * c[:, None], 1))
        p = tl.math.exp2(qk * c[:, None] - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(V + base + (start_n + offs_n)[:, None] * D + offs_d[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    tl.store(O + base + offs_m[:, None] * D + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty))


def run_exact_ptr(q, k, v, o, cfg, ws=False):
    BH, L, D = q.shape
    bm, bn, nw, ns = cfg
    return exact_ptr[(L // bm * BH,)](q, k, v, o, LOG2E / math.sqrt(D), L, BLOCK_M=bm, BLOCK_N=bn, D=D, WS=ws,
                              num_warps=nw, num_stages=ns)


def run_exact_tma(q, k, v, o, cfg, ws=False):
    from triton.tools.tensor_descriptor import TensorDescriptor as TD
    BH, L, D = q.shape
    bm, bn, nw, ns = cfg
    f = lambda t, b: TD.from_tensor(t.view(BH * L, D), [b, D])  # noqa: E731
    return exact_tma[(L // bm * BH,)](f(q, bm), f(k, bn), f(v, bn), f(o, bm), LOG2E / math.sqrt(D), L,
                              BLOCK_M=bm, BLOCK_N=bn, D=D, WS=ws, num_warps=nw, num_stages=ns)


def quant(q, k, bn):
    BH, L, D = q.shape
    qf = q.float() * (LOG2E / math.sqrt(D))
    qs = qf.abs().amax(-1).clamp_min(1e-30) / 127
    qi = (qf / qs[..., None]).round().to(torch.int8)
    kf = k.float() - k.float().mean(1, keepdim=True)
    kb = kf.view(BH, L // bn, bn, D)
    ks = kb.abs().amax((-1, -2)).clamp_min(1e-30) / 127
    ki = (kb / ks[..., None, None]).round().to(torch.int8).view(BH, L, D)
    return qi.contiguous(), qs.contiguous(), ki.contiguous(), ks.contiguous()


def run_int8(qi, qs, ki, ks, v, o, cfg, ws=False):
    BH, L, D = qi.shape
    bm, bn, nw, ns = cfg
    return int8_ptr[(L // bm * BH,)](qi, ki, v, o, qs, ks, L, BLOCK_M=bm, BLOCK_N=bn, D=D, WS=ws,
                             num_warps=nw, num_stages=ns)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rep", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="flux,hunyuan")
    a = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    shapes = {"flux": (1, 24, 4608, 128), "hunyuan": (1, 24, 16384, 128), "sdxl": (2, 10, 4096, 64)}
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    for sname in a.shapes.split(","):
        B, H, L, D = shapes[sname]
        torch.manual_seed(0)
        q, k, v = (torch.randn(B * H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
        flops = 4 * B * H * L * L * D
        meths = {}

        def sd(be):
            def f():
                with sdpa_kernel([be]):
                    return torch.nn.functional.scaled_dot_product_attention(*(t.view(B, H, L, D) for t in (q, k, v))).view(B * H, L, D)
            return f
        meths["cudnn"] = sd(SDPBackend.CUDNN_ATTENTION)
        meths["fa2"] = sd(SDPBackend.FLASH_ATTENTION)
        o = torch.empty_like(q)
        cfgs = [(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 4, 2),
                (64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 4, 2), (64, 128, 4, 3)]
        for cfg in cfgs:
            meths[f"ptr{cfg}"] = (lambda cfg=cfg: run_exact_ptr(q, k, v, o, cfg, False))
            meths[f"tma{cfg}"] = (lambda cfg=cfg: run_exact_tma(q, k, v, o, cfg, False))
            if cfg[2] == 8:
                meths[f"tma_ws{cfg}"] = (lambda cfg=cfg: run_exact_tma(q, k, v, o, cfg, True))
        # the pack's kernel at each of its candidate configs for this GPU (whole calls)
        cc = torch.cuda.get_device_capability()
        cc = cc[0] * 10 + cc[1]
        q4, k4, v4 = (t.view(B, H, L, D) for t in (q, k, v))

        def ours(cfg, tma="0", **kw):
            def f():
                old = os.environ.get(OURS.TMA_ENV)
                os.environ[OURS.TMA_ENV] = tma
                try:
                    return OURS.attention(q4, k4, v4, layout="bhld", config=cfg, **kw).view(B * H, L, D)
                finally:
                    if old is None:
                        del os.environ[OURS.TMA_ENV]
                    else:
                        os.environ[OURS.TMA_ENV] = old
            return f
        for cfg in OURS.candidates(cc, D, 2, False):
            meths[f"ours_exact_ptr{cfg}"] = ours(cfg)
        if cc >= 90:
            for cfg in OURS.candidates(cc, D, 2, "exact-tma"):
                meths[f"ours_exact_tma{cfg}"] = ours(cfg, "1")
        for cfg in OURS.candidates(cc, D, 2, True):
            meths[f"ours_8bit_half{cfg}"] = ours(cfg, mode="int8", pv="half")
        if OURS.fp8_pv_supported(cc):
            for cfg in OURS.candidates(cc, D, 2, "int8-fp8pv"):
                meths[f"ours_8bit_fp8{cfg}"] = ours(cfg, mode="int8", pv="fp8")
        qcache = {}
        for cfg in [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 2), (64, 64, 4, 2),
                    (64, 64, 4, 3), (64, 128, 4, 2)]:
            bn = cfg[1]
            if bn not in qcache:
                qcache[bn] = quant(q, k, bn)
            meths[f"i8{cfg}"] = (lambda cfg=cfg, t=qcache[bn]: run_int8(*t, v, o, cfg))
        ok = {}
        for name, f in meths.items():
            try:
                o.fill_(float("nan"))
                r = f()
                out = r if isinstance(r, torch.Tensor) else o
                torch.cuda.synchronize()
                meta = ""
                if r is not None and not isinstance(r, torch.Tensor):
                    meta = f" regs {getattr(r, 'n_regs', '?')} spills {getattr(r, 'n_spills', '?')} smem {r.metadata.shared}"
                cos = torch.nn.functional.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0).item()
                ok[name] = f
                print(f"  {sname} {name}: cos {cos:.6f}{meta}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"  {sname} {name}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
        times = {n: [] for n in ok}
        for _ in range(a.rounds):
            for n, f in ok.items():
                times[n].append(triton.testing.do_bench(f, warmup=10, rep=a.rep))
        base = statistics.median(times["cudnn"])
        print(f"| {sname} | ms med (min-max) | TFLOPS | x cuDNN |")
        for n in sorted(ok, key=lambda n: statistics.median(times[n])):
            t = times[n]
            m = statistics.median(t)
            print(f"| {n} | {m:.4f} ({min(t):.4f}-{max(t):.4f}) | {flops / m / 1e9:.0f} | {base / m:.3f} |", flush=True)


if __name__ == "__main__":
    main()
