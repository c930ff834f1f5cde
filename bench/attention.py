"""Attention benchmark: TritonKit exact and 8-bit vs PyTorch SDPA (FA2 "flash" and cuDNN backends),
sageattention (Triton, int8 QK) and comfy-kitchen's int8_attention (CUDA, INT8 Q/K/V/P; the kernel
library current ComfyUI depends on), where importable, on the shapes of real diffusion models.

Our 8-bit mode is measured in its P·V variants: ``ours_8bit`` (auto, what the node runs: the
variant timed fastest on this GPU), ``ours_8bit_fp8`` (fp8 e4m3 P·V, sm89+ only),
``ours_8bit_halfpv`` (P·V in the input dtype) and ``ours_8bit_f16acc`` (opt-in fp16-accumulate
P·V, aimed at GeForce cards); exact mode likewise: ``ours_exact`` (auto: TMA or pointer loads,
timed), ``ours_exact_ptr`` (pointer loads), ``ours_exact_tma`` (TMA), ``ours_exact_tma_ws``
(TMA + warp specialisation, opt-in) and ``ours_exact_gluon`` (kernels/attention_hopper.py's Gluon
kernel, its block config timed), the TMA ones sm90+, the Gluon one sm90 only.

TFLOPS = 4·B·H·L²·D / t (forward, non-causal). Times are whole calls as a ComfyUI node makes them:
ours and Sage include their quantisation / smoothing pre-passes. Accuracy is measured on sampled
query rows against a float64 reference: cosine similarity (global and worst row) and relative
L2 error (global and worst row), on normal inputs and on inputs with DiT-like outlier channels.

    python bench/attention.py [--dtype bf16|fp16] [--shapes flux,sdxl,...] [--rounds 3] [--json out.json]

Timing is interleaved: per shape every method is compiled, checked and warmed first, then timed in
``--rounds`` rounds (A B C … A B C …), each a ``do_bench`` of ``--rep`` ms after ``--warmup`` ms of
the method's own calls: at the power cap a call runs at the clocks the calls before it left, and a
5 ms warm-up timed the 8-bit kernel's fp8 P·V at 4.64-5.12 ms a call after the exact kernel and at
4.45-4.58 after itself (HunyuanVideo's shape, H100, 2026-11-26; kernels/trials.py). A method's figure is
its median over the rounds with the min–max; the ratios (ours / cuDNN, ours / FA2) are taken per
round, against the anchor timed in the same round, and reported as median (min–max).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import threading
import time
import types
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[1]
if "tritonkit" not in sys.modules:
    _pkg = types.ModuleType("tritonkit")
    _pkg.__path__ = [str(REPO)]
    sys.modules["tritonkit"] = _pkg
from tritonkit.kernels import attention as A  # noqa: E402
from tritonkit.kernels import calibration as C  # noqa: E402

SHAPES = {
    "sdxl": (2, 10, 4096, 64),
    "flux": (1, 24, 4608, 128),
    "hunyuan": (1, 24, 16384, 128),
    "wan14b": (1, 40, 32760, 128),
    "sd15": (2, 8, 4096, 40),
}


def sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

    def f(q, k, v):
        with sdpa_kernel([be]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)
    return f


def sage():
    try:
        from sageattention import sageattn
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"

    def f(q, k, v):
        return sageattn(q, k, v, tensor_layout="HND", is_causal=False)
    return f, None


def kitchen():
    try:
        import comfy_kitchen as ck
        if hasattr(ck, "int8_attention_is_available") and not ck.int8_attention_is_available():
            return None, "comfy_kitchen int8_attention not available on this GPU/build"
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"

    def f(q, k, v):
        return ck.int8_attention(q, k, v)
    return f, None


def ours(mode, pv="auto", tma="auto"):
    import os

    def f(q, k, v):
        # exact mode's opt-in TMA path (sm90+) is switched per call by its environment variable
        old = os.environ.get("TRITONKIT_ATTN_TMA")
        os.environ["TRITONKIT_ATTN_TMA"] = tma
        try:
            return A.attention(q, k, v, layout="bhld", mode=mode, pv=pv)
        finally:
            if old is None:
                del os.environ["TRITONKIT_ATTN_TMA"]
            else:
                os.environ["TRITONKIT_ATTN_TMA"] = old
    return f


def make_inputs(shape, dtype, outliers, seed=0):
    B, H, L, D = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.float32, generator=g) for _ in range(3))
    if outliers:
        ch = torch.randperm(D, device="cuda", generator=g)[: max(1, D // 16)]
        k[..., ch] += 30.0 * torch.randn(len(ch), device="cuda", generator=g)
        q[..., ch] *= 8.0
        k *= 0.25
    return q.to(dtype), k.to(dtype), v.to(dtype)


def accuracy(out, q, k, v, rows):
    qs = q[:, :, rows].double()
    s = qs @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    ref = torch.softmax(s, -1) @ v.double()
    o = out[:, :, rows].double()
    o2, r2 = o.reshape(-1, o.shape[-1]), ref.reshape(-1, ref.shape[-1])
    finite = bool(torch.isfinite(out).all())
    cos_row = torch.nn.functional.cosine_similarity(o2, r2, dim=-1)
    rel_row = (o2 - r2).norm(dim=-1) / r2.norm(dim=-1).clamp_min(1e-12)
    return {"cos": torch.nn.functional.cosine_similarity(o.flatten(), ref.flatten(), dim=0).item(),
            "min_row_cos": cos_row.min().item(), "rel": ((o - ref).norm() / ref.norm()).item(),
            "max_row_rel": rel_row.max().item(), "finite": finite}


def kernel_reports():
    """Registers, spills, shared memory and the MMA instructions of every attention kernel the JIT
    compiled in this run (the real, specialised binaries), with their block config."""
    reps = []
    for dev_cache in A.attn_fwd_kernel.device_caches.values():
        for ck in list(dev_cache[0].values()):
            try:
                ck._init_handles()
                names = ck.src.fn.arg_names
                consts = {}
                for key, val in ck.src.constants.items():
                    name = names[key[0]] if isinstance(key, tuple) else key
                    if name in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "INT8", "MASK_KIND", "ALIGN8", "IS_CAUSAL",
                                "PV_MODE", "USE_TMA", "WARP_SPEC"):
                        consts[name] = val
                ptx = ck.asm["ptx"]
                reps.append({**consts, "num_warps": ck.metadata.num_warps, "num_stages": ck.metadata.num_stages,
                             "n_regs": ck.n_regs, "n_spills": ck.n_spills, "shared": ck.metadata.shared,
                             "wgmma": "wgmma" in ptx, "mma_sync": "mma.sync" in ptx,
                             "fp8_mma": ".e4m3.e4m3" in ptx, "int8_mma": ".s8.s8" in ptx,
                             "tma": "cp.async.bulk.tensor" in ptx, "setmaxnreg": "setmaxnreg" in ptx,
                             "cp_async": "cp.async" in ptx,
                             "ld_v4": "ld.global.v4" in ptx, "ld_scalar_b16": ptx.count("ld.global.b16")})
            except Exception as e:  # noqa: BLE001
                reps.append({"error": f"{type(e).__name__}: {e}"})
    return reps


def settle(call, max_s: float = 60.0, gemm_ms: float = 1.0):
    """Calls ``call`` until every block-config choice has settled (kernels/tuning.py: no configs left
    compiling in the background, during which the first config runs untimed, and no playoff left
    running in the calls, kernels/trials.py), at most ``max_s`` seconds: ``auto`` is then timed at the
    config it settled on. Each call comes after a bf16 GEMM of about ``gemm_ms``, as in a model's block:
    the GPU stays behind the host, so the playoff's events time the GPU's work. (Back to back, the
    8-bit kernel's calls at Flux's shape timed 0.64 ms in the playoff against 0.45 alone on an H100,
    2026-11-26: about 0.4 ms of host time a call, and the GPU idle between the events.)"""
    from tritonkit.kernels import tuning
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    reps = max(1, round(gemm_ms / max(C.cuda_timer(lambda: a @ a), 1e-3)))
    t0 = time.perf_counter()
    while tuning.unsettled() and time.perf_counter() - t0 < max_s:
        for _ in range(reps):
            a @ a
        call()
    torch.cuda.synchronize()
    return tuning.unsettled()


def host_path_counts() -> dict:
    """The pack's host fast-path counters (kernels/attention.py's replays, kernels/fast_launch.py's direct
    launches), to difference around a timed round, and the host's CPU time: this thread's (``cpu_ms``, which
    includes do_bench's spin in its synchronisations: about the round's wall time) and the whole process's
    (``proc_cpu_ms``, every thread: more than this thread's means another thread, a background compile, ran
    during the round and shared the GIL with the calls)."""
    from tritonkit.kernels import fast_launch
    return {"replayed": A.REPLAY_COUNTERS["replayed"], "stored": A.REPLAY_COUNTERS["stored"],
            "fast_launches": fast_launch.COUNTERS["fast_launches"], "plans": fast_launch.COUNTERS["plans"],
            "plan_failures": fast_launch.COUNTERS["plan_failures"], "cpu_ms": time.thread_time() * 1e3,
            "proc_cpu_ms": time.process_time() * 1e3}


def warm_gpu(seconds):
    """Keeps the GPU busy with bf16 matmuls for ``seconds``, so that the first shape is not timed
    while clocks and power settle."""
    if seconds <= 0:
        return
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
    del a
    torch.cuda.empty_cache()


def gpu_and_bench_rounds(fns: dict, rounds: int, rep: int):
    """``rounds`` interleaved rounds of the calls ``fns`` (name -> call): each round the calibration's GPU timer over
    all of them (each call after an L2 flush, queued behind a spin), then ``do_bench`` of ``rep`` ms each. Returns
    ({name: [GPU ms a round]}, {name: [do_bench ms a round]})."""
    gpu = {n: [] for n in fns}
    bench = {n: [] for n in fns}
    for _ in range(rounds):
        t = C.cuda_timer_interleaved(fns, warmup=2, reps=15)
        for n, f in fns.items():
            gpu[n].append(t[n])
            bench[n].append(triton.testing.do_bench(f, warmup=5, rep=rep))
    return gpu, bench


def round_ratios(row, live, field="ms_rounds"):
    """Per-round speed ratios of our methods against the anchors timed in the same round (``field``: do_bench's
    ``ms_rounds`` or the queued GPU time's ``gpu_ms_rounds``): {"<ours>/<anchor>": [median, min, max]}."""
    out = {}
    for anchor in ("sdpa_cudnn", "sdpa_fa2", "sage", "kitchen_int8"):
        if anchor not in live:
            continue
        for m in live:
            if not m.startswith("ours"):
                continue
            r = [a / b for a, b in zip(row[anchor][field], row[m][field])]
            if not r or any(x != x for x in r):  # a round the GPU timer could not time
                continue
            out[f"{m}/{anchor}"] = [statistics.median(r), min(r), max(r)]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--rep", type=int, default=200, help="do_bench rep (ms)")
    ap.add_argument("--warmup", type=int, default=250,
                    help="ms of a method's own calls before each timing (do_bench warmup): the GPU's clocks "
                         "follow the power the calls before drew")
    ap.add_argument("--json", default=None)
    ap.add_argument("--methods", default=None, help="comma-separated subset of the methods")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per shape")
    ap.add_argument("--gpu-reps", type=int, default=15,
                    help="a round's interleaved repetitions of the queued GPU timing (kernels/calibration.py)")
    ap.add_argument("--warm-s", type=float, default=3.0,
                    help="seconds of bf16 matmuls before the first shape, so that the clocks have settled "
                         "(the first shape of a cold GPU read 136-347 TFLOPS across rounds on an H100)")
    ap.add_argument("--calibration-dir", default=None,
                    help="where `auto` stores its timed picks (default: a new empty folder, so this run times "
                         "them on these shapes instead of reading picks another process made on other shapes)")
    args = ap.parse_args()
    import os
    import tempfile
    os.environ[C.ENV_DIR] = args.calibration_dir or tempfile.mkdtemp(prefix="tk_attn_bench_cal_")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    dev = torch.cuda.get_device_name()
    import importlib.metadata as md
    vers = {}
    for dist in ("sageattention", "comfy-kitchen"):
        try:
            vers[dist] = md.version(dist)
        except Exception:  # noqa: BLE001
            vers[dist] = "not installed"
    env = {"device": dev, "cc": A._device_cc(torch.device("cuda")), "torch": torch.__version__,
           "triton": triton.__version__, "cudnn": torch.backends.cudnn.version(), **vers,
           "dtype": str(dtype), "calibration_dir": os.environ[C.ENV_DIR]}
    print(json.dumps(env))
    warm_gpu(args.warm_s)
    sage_fn, sage_err = sage()
    kitchen_fn, kitchen_err = kitchen()
    errors = {"sage": sage_err, "kitchen_int8": kitchen_err}
    methods = {"sdpa_fa2": sdpa("flash"), "sdpa_cudnn": sdpa("cudnn"), "sage": sage_fn,
               "kitchen_int8": kitchen_fn,
               "ours_exact": ours("exact"), "ours_exact_ptr": ours("exact", tma="0"),
               "ours_exact_tma": ours("exact", tma="1"),
               "ours_exact_tma_ws": ours("exact", tma="ws"), "ours_exact_gluon": ours("exact", tma="gluon"),
               "ours_8bit": ours("int8"), "ours_8bit_fp8": ours("int8", "fp8"),
               "ours_8bit_halfpv": ours("int8", "half"), "ours_8bit_f16acc": ours("int8", "f16acc")}
    if args.methods:
        methods = {n: f for n, f in methods.items() if n in args.methods.split(",")}
    results = []
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        B, H, L, D = shape
        flops = 4 * B * H * L * L * D
        q, k, v = make_inputs(shape, dtype, False)
        qo, ko, vo = make_inputs(shape, dtype, True, seed=1)
        rows = torch.randperm(L, device="cuda")[:256].sort().values
        row = {"shape": name, "BHLD": shape}
        live = {}
        for mname, fn in methods.items():
            if fn is None:
                row[mname] = {"error": errors.get(mname) or "not available"}
                continue
            try:
                out = fn(q, k, v)
                torch.cuda.synchronize()
                acc = accuracy(out, q, k, v, rows)
                del out
                acc_o = accuracy(fn(qo, ko, vo), qo, ko, vo, rows)
                # the block-config playoff runs in settle()'s calls between GEMMs, as in a model's block; in
                # do_bench's back-to-back calls first, it timed the host in its first turns and mis-ranked
                # (kernels/trials.py); then the warm-up for every method
                pending = settle(lambda: fn(q, k, v))
                triton.testing.do_bench(lambda: fn(q, k, v), warmup=25, rep=25)
                row[mname] = {**acc, "outliers": {k2: acc_o[k2] for k2 in ("cos", "min_row_cos", "rel", "finite")},
                              "ms_rounds": [], "unsettled": pending}
                live[mname] = fn
            except Exception as e:  # noqa: BLE001
                row[mname] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}
            torch.cuda.empty_cache()
        for _ in range(max(1, args.rounds)):  # A B C ... A B C ...
            for mname, fn in live.items():
                before = host_path_counts()
                row[mname]["ms_rounds"].append(triton.testing.do_bench(lambda: fn(q, k, v), warmup=args.warmup,
                                                                                rep=args.rep))
                # per round, how the calls went: replayed (the host fast path) or full, direct launches, and the
                # host's CPU time. A host-bound round shows calls that were not replayed (new plans, stored
                # calls) or process CPU time beyond this thread's; fewer calls alone only mean do_bench sized
                # its repetitions from a slow first estimate
                row[mname].setdefault("host_rounds", []).append(
                    {n: round(c - before[n], 3) for n, c in host_path_counts().items()}
                    | {"threads": sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())})
            # the same calls' GPU time, each after the L2 flush and queued behind a GPU spin, so that the host's issue
            # of a call is hidden as a model's other layers hide it (kernels/calibration.py's timer); do_bench's
            # back-to-back loop above times max(host, GPU) a call, and at SDXL's shape the 8-bit call's host time
            # (0.16-0.32 ms on the H200 machines' hosts, 2026-11-28) is about its GPU time
            gpu = C.cuda_timer_interleaved({n: (lambda f=f: f(q, k, v)) for n, f in live.items()},
                                           reps=args.gpu_reps)
            for mname in live:
                t = gpu.get(mname)
                row[mname].setdefault("gpu_ms_rounds", []).append(t if isinstance(t, float) else float("nan"))
        for mname in live:
            ms = row[mname]["ms_rounds"]
            row[mname].update(ms=statistics.median(ms), tflops=flops / statistics.median(ms) / 1e9,
                              tflops_min=flops / max(ms) / 1e9, tflops_max=flops / min(ms) / 1e9)
        row["ratios"] = round_ratios(row, live)
        row["gpu_ratios"] = round_ratios(row, live, "gpu_ms_rounds")
        results.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, qo, ko, vo
        torch.cuda.empty_cache()

    # markdown table
    names = list(methods)
    print("\n| shape (B,H,L,D) | " + " | ".join(names) + " | ours/cuDNN exact | ours/cuDNN 8-bit | ours/FA2 exact"
          " | GPU time: ours/cuDNN exact | GPU time: ours/cuDNN 8-bit |")
    print("|---" * (len(names) + 6) + "|")
    for r in results:
        cells = []
        for n in names:
            m = r.get(n, {"error": "not run"})
            cells.append("n/a" if "error" in m else
                         f"{m['tflops']:.0f} ({m['tflops_min']:.0f}-{m['tflops_max']:.0f}; cos {m['cos']:.5f})"
                         + (" †" if m.get("unsettled") else ""))
        rr = r.get("ratios", {})

        def ratio(key, rr=rr):
            x = rr.get(key)
            return f"{x[0]:.2f}x ({x[1]:.2f}-{x[2]:.2f})" if x else "n/a"
        gr = r.get("gpu_ratios", {})
        print(f"| {r['shape']} {tuple(r['BHLD'])} | " + " | ".join(cells)
              + f" | {ratio('ours_exact/sdpa_cudnn')} | {ratio('ours_8bit/sdpa_cudnn')} | {ratio('ours_exact/sdpa_fa2')}"
              + f" | {ratio('ours_exact/sdpa_cudnn', gr)} | {ratio('ours_8bit/sdpa_cudnn', gr)} |")
    if any(r.get(n, {}).get("unsettled") for r in results for n in names):
        print("\n† timed with a block-config choice unsettled after 60 s of calls (a playoff still running "
              "alternates its finalists: the figure mixes them); see the autotune choices below")
    print("\nper-round ratios, median (min-max), do_bench | GPU time (calls queued behind a spin):")
    for r in results:
        for key, x in sorted(r.get("ratios", {}).items()):
            y = r.get("gpu_ratios", {}).get(key)
            print(f"  {r['shape']}: {key} {x[0]:.3f} ({x[1]:.3f}-{x[2]:.3f})"
                  + (f" | {y[0]:.3f} ({y[1]:.3f}-{y[2]:.3f})" if y else ""))
    print("\nautotune choices:", {str(k): v for k, v in A.tune_cache().items()})
    kreps = kernel_reports()
    for r in kreps:
        print("kernel:", json.dumps(r))
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "results": results, "kernels": kreps,
                                               "tune": {str(k): v for k, v in A.tune_cache().items()}}, indent=1))


if __name__ == "__main__":
    main()
