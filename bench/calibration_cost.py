"""What a cold calibration of one attention shape class costs, and what it picks: the Triton Attention node in
``auto`` meets a shape class with an empty calibration store, times ComfyUI's attention and both kernel modes (each
kernel mode's block configs tuned first), then runs on through the playoff in its calls until every pick is final.

Each measurement runs in its own process (an empty calibration store, this process's Triton cache: the first,
discarded process fills it, so the compiles are not what is timed). Configurations are interleaved A B A B:

* ``before``: every candidate warmed twice and timed LONG_REPS times (``calibration.SINGLE_MS`` = infinity), the
  paths chosen by their times alone (no bursts: ``calibration.PATH_PLAYOFF_WITHIN`` = 0);
* ``key-at-compile``: as now, but Triton's key computed at its first compile, in the calibrating call, not at
  the start (``TRITONKIT_TRITON_KEY_AHEAD=0``);
* ``whole-warm-ups``: as now, but each block config warmed by a whole call, not by its launches on one program
  of the attention kernel's grid (``TRITONKIT_LIGHT_WARMUP=0``);
* ``now``: the pack as it is (a candidate of ``SINGLE_MS`` or more a call warmed once and timed once; the paths
  close to the fastest alone timed again in bursts of back-to-back calls).

Per process: the calibration's seconds (the first call, timed at once as a compiled model's first call is; its
block-config tunings inside), the calls and seconds until the playoff settled, what was chosen, and the chosen
path's ms a call back to back against the other paths' (through the node in ``exact`` and ``8-bit``, each with its
own settled config; ComfyUI's SDPA): what a worse pick would cost; and where the calibrating call's seconds went,
by the timer's functions (candidates timed alone with their warm-ups, bursts, waits for compiles; nested timings
subtracted). Each process starts as the pack does at ComfyUI's start (``compile_pool.start_at_launch``). With
``--arch`` below sm90, SDPA runs without cuDNN (as torch runs it on such a GPU, and as bench/workflow.py's
``@arch`` runs do).

    python bench/calibration_cost.py [--shape wan] [--rounds 3] [--arch 86] [--configs before,now] [--json out.json]

Needs a CUDA GPU."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {"wan": (1, 40, 32760, 128), "hunyuan": (1, 24, 18616, 128), "flux": (1, 24, 4608, 128),
          "sdxl": (2, 10, 4096, 64)}
# calibration attributes set in the child, and "_env": its environment's additions
CONFIGS = {"before": {"SINGLE_MS": float("inf"), "PATH_PLAYOFF_WITHIN": 0.0},
           "key-at-compile": {"_env": {"TRITONKIT_TRITON_KEY_AHEAD": "0"}},
           "whole-warm-ups": {"_env": {"TRITONKIT_LIGHT_WARMUP": "0"}}, "now": {}}


def _trace_timers(C, tuning, prepare) -> dict:
    """Where a calibrating call's seconds go: the timing functions of kernels/calibration.py and kernels/tuning.py
    wrapped, each one's own seconds (nested timings subtracted), calls and candidates given.
    name -> (seconds, calls, candidates)."""
    out, stack = {}, []

    def wrap(mod, name, label, count):
        fn = getattr(mod, name)

        def timed(*a, **kw):
            stack.append(0.0)
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                dt = time.perf_counter() - t0
                inner = stack.pop()
                if stack:
                    stack[-1] += dt
                t, c, k = out.get(label, (0.0, 0, 0))
                out[label] = (t + dt - inner, c + 1, k + count(a))
        setattr(mod, name, timed)

    wrap(C, "cuda_timer_interleaved", "timed alone", lambda a: len(a[0]))
    wrap(C, "burst_ms", "bursts", lambda a: a[1])
    wrap(prepare.Prepared, "wait", "compiles waited for", lambda a: 1)
    return out


def child(args) -> dict:
    """One process's cold calibration (the environment names the store and the configuration)."""
    import threading

    import torch
    # bench/attention_host.py: ComfyUI's attention_pytorch, as the node is handed it (its import makes the
    # checkout importable as the package ``tritonkit``)
    from attention_host import attention_pytorch
    from tritonkit.kernels import compile_pool
    from tritonkit.nodes.arch import card_instructions
    card_instructions(os.environ)  # what the pack's __init__ does at ComfyUI's start: the forced arch's MMA, then
    compile_pool.start_at_launch(background=True)  # the compile workers
    from tritonkit.kernels import calibration as C
    from tritonkit.kernels import prepare, tuning
    from tritonkit.nodes import attention as NA
    from tritonkit.nodes.arch import ARCH_ENV, CUDNN_SDPA_ARCHS
    for name, value in json.loads(os.environ.get("TK_BENCH_CALIBRATION", "{}")).items():
        setattr(C, name, value)
    arch = os.environ.get(ARCH_ENV)
    if arch and int(arch) not in CUDNN_SDPA_ARCHS:
        torch.backends.cuda.enable_cudnn_sdp(False)
    B, H, L, D = SHAPES[args.shape]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, L, H * D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    auto = NA.make_override("auto")
    for t in threading.enumerate():  # ComfyUI's start and a model's load leave it seconds
        if t.name == "tritonkit-triton-key":
            t.join(timeout=10)
    trace = _trace_timers(C, tuning, prepare)
    torch.cuda.synchronize()
    c0 = dict(C.COUNTERS)
    t0 = time.perf_counter()
    with C.synchronous():
        auto(attention_pytorch, q, k, v, H)
    torch.cuda.synchronize()
    cal_s = time.perf_counter() - t0
    frozen = {n: [round(t, 3), c, k] for n, (t, c, k) in trace.items()}  # the calibrating call's share
    counters = {n: round(C.COUNTERS[n] - c0[n], 4) for n in ("calibrations", "autotunes", "calibration_s",
                                                              "autotune_s", "timed_runs", "stalled_timings",
                                                              "path_playoffs")}
    t1, calls = time.perf_counter(), 0
    while tuning.unsettled() and calls < 400:  # the playoff in the model's calls
        auto(attention_pytorch, q, k, v, H)
        calls += 1
    torch.cuda.synchronize()
    settle_s = time.perf_counter() - t1
    choice = [e for e in C.store_for(q.device).entries.values() if isinstance(e, dict) and "choice" in e]
    exact, eight = NA.make_override("exact"), NA.make_override("8-bit")
    paths = {"comfy": lambda: attention_pytorch(q, k, v, H), "exact": lambda: exact(attention_pytorch, q, k, v, H),
             "int8": lambda: eight(attention_pytorch, q, k, v, H)}
    for fn in paths.values():  # each path's block configs settled (tuned, playoff run) before it is timed
        for _ in range(400):
            fn()
            if not tuning.unsettled():
                break
    steady = {n: [] for n in paths}
    for _ in range(3):  # interleaved, back to back within each
        for n, fn in paths.items():
            steady[n].append(C.burst_ms(fn, args.calls + 1, untimed=1))
    picked = choice[0]["choice"] if choice else None
    return {"device": torch.cuda.get_device_name(), "single_ms": C.SINGLE_MS, "path_playoff_within": C.PATH_PLAYOFF_WITHIN,
            "calibration_call_s": round(cal_s, 3), "bursts_ms": choice[0].get("bursts_ms") if choice else None,
            "counters": counters, "trace": frozen, "playoff_calls": calls, "playoff_s": round(settle_s, 3), "choice": picked,
            "timings_ms": choice[0].get("timings_ms") if choice else None,
            "configs": {k.split("|")[4]: list(c) for k, c in tuning.cache().items()},
            "steady_ms": {n: round(statistics.median(t), 4) for n, t in steady.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="wan", choices=sorted(SHAPES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10, help="back-to-back calls per steady timing")
    ap.add_argument("--arch", default=None, help="TRITONKIT_FORCE_ARCH for every process (86: an RTX 30xx's path)")
    ap.add_argument("--configs", default="before,now", help="which configurations, interleaved: before (a long call "
                    "warmed twice and timed LONG_REPS times, paths by their times alone), key-at-compile (Triton's "
                    "key computed in the calibrating call), whole-warm-ups (block configs warmed by whole calls), now")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("TK_RESULT " + json.dumps(child(args)), flush=True)
        return
    import torch
    if not torch.cuda.is_available():
        sys.exit("bench/calibration_cost.py needs a CUDA GPU")
    env0 = dict(os.environ)
    if args.arch:
        env0["TRITONKIT_FORCE_ARCH"] = str(args.arch)

    def one(config: str) -> dict:
        env = dict(env0, TRITONKIT_CALIBRATION_DIR=tempfile.mkdtemp(prefix="tk-calcost-"))
        env.update(CONFIGS[config].get("_env", {}))
        env["TK_BENCH_CALIBRATION"] = json.dumps({k: v for k, v in CONFIGS[config].items() if k != "_env"})
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--shape", args.shape,
               "--calls", str(args.calls)]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        for line in p.stdout.splitlines():
            if line.startswith("TK_RESULT "):
                return json.loads(line[len("TK_RESULT "):])
        raise SystemExit(f"{config}: no result (rc {p.returncode})\n{p.stderr[-3000:]}")

    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or not configs:
        sys.exit(f"--configs: unknown {unknown or args.configs!r}; known: {', '.join(CONFIGS)}")
    first = one("now")  # fills the Triton cache: not counted
    print(f"warm-up process (compiles, not counted): {first['calibration_call_s']} s", flush=True)
    res = {c: [] for c in configs}
    for r in range(args.rounds):
        for c in (configs if r % 2 == 0 else configs[::-1]):
            x = one(c)
            res[c].append(x)
            best = min(x["steady_ms"].values())
            print(f"{c}: calibration {x['calibration_call_s']} s (tunings {x['counters']['autotune_s']} s), playoff "
                  f"{x['playoff_calls']} calls {x['playoff_s']} s, chose {x['choice']} {x['timings_ms']} bursts {x['bursts_ms']}, configs "
                  f"{x['configs']}, steady ms {x['steady_ms']} (chosen / best "
                  f"{x['steady_ms'].get(x['choice'], float('nan')) / best:.3f}); its seconds "
                  f"(s, calls, candidates): {x['trace']}", flush=True)
    print(f"\n{first['device']}, shape {args.shape} {SHAPES[args.shape]}"
          + (f", TRITONKIT_FORCE_ARCH={args.arch}" if args.arch else "") + f": median (min–max) of {args.rounds}")
    print("| configuration | calibration s | playoff s | chosen ÷ best path, steady |\n|---|---|---|---|")
    for c, xs in res.items():
        cal = [x["calibration_call_s"] for x in xs]
        pl = [x["playoff_s"] for x in xs]
        q = [x["steady_ms"].get(x["choice"], float("nan")) / min(x["steady_ms"].values()) for x in xs]
        print(f"| {c} | {statistics.median(cal):.2f} ({min(cal):.2f}–{max(cal):.2f}) | "
              f"{statistics.median(pl):.2f} ({min(pl):.2f}–{max(pl):.2f}) | "
              f"{statistics.median(q):.3f} ({min(q):.3f}–{max(q):.3f}) |")
    if args.json:
        Path(args.json).write_text(json.dumps({"first": first, "runs": res}, indent=1))


if __name__ == "__main__":
    main()
