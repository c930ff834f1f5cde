"""Where an attention call's time goes, and the same calls of another checkout of the pack beside
them: per-kernel GPU durations (torch.profiler) of whole calls of the pack's attention at real
shapes (exact and 8-bit: its pre-pass kernels, the fp8 V copy), the host's time to issue a call,
and the wall time per call back to back (beside SDPA's cuDNN backend, in the (B, H, L, D) layout).

    python bench/attention_parts.py [--shapes flux,sdxl,...] [--rounds 5] [--baseline DIR]

``--baseline DIR``: a second tree of the pack (e.g. ``git archive <rev> | tar -x -C DIR``), loaded as
its own package; every call is then timed for both trees in interleaved rounds (A B A B ...), with
the same tensors and configs, and reported as median (min-max) with the per-round ratio.
Configs: each method's first candidate on this GPU (what timing-off runs), plus ``auto`` (the
tuner's pick, timed by each tree on its own)."""
from __future__ import annotations

import argparse
import collections
import importlib
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SHAPES = {"sdxl": (2, 10, 4096, 64), "flux": (1, 24, 4608, 128), "hunyuan": (1, 24, 16384, 128),
          "wan14b": (1, 40, 32760, 128), "sd15": (2, 8, 4096, 40)}


def load_tree(name: str, root: Path):
    """The attention module of the pack at ``root``, imported as package ``name``."""
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(root)]
        sys.modules[name] = pkg
    return importlib.import_module(f"{name}.kernels.attention")


def profile(f, n=20):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof
    with prof(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
        for _ in range(n):
            f()
        torch.cuda.synchronize()
    d, cnt = collections.defaultdict(float), collections.Counter()
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            d[e.name[:60]] += e.device_time / n
            cnt[e.name[:60]] += 1
    return d, cnt


def profile_host(f, n=200, top=14):
    """cProfile of n calls back to back (GPU synchronised at the end only)."""
    import cProfile
    import io
    import pstats
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        f()
    pr.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(top)
    print("\n".join(ln for ln in buf.getvalue().splitlines() if ln.strip())[-4000:])


def per_call(f, n):
    """(host ms to issue one call, wall ms per call) over n calls back to back."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    t_host = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    return t_host * 1e3, (time.perf_counter() - t0) / n * 1e3


def methods(A, cc, D):
    bd = A.block_d_for(D)
    out = [("exact auto", dict()), ("8bit auto", dict(mode="int8")),
           ("8bit half", dict(mode="int8", pv="half", config=A.candidates(cc, bd, 2, True)[0]))]
    if A.fp8_pv_supported(cc):
        out.append(("8bit fp8", dict(mode="int8", pv="fp8", config=A.candidates(cc, bd, 2, "int8-fp8pv")[0])))
    return out


def tree_call(A, cal_dir, q, k, v, H, layout, kw):
    def f():
        os.environ["TRITONKIT_CALIBRATION_DIR"] = cal_dir
        return A.attention(q, k, v, H, layout=layout, **kw)
    return f


def cudnn_call(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def f():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)
    return f


def med(xs):
    return f"{statistics.median(xs):.4f} ({min(xs):.4f}-{max(xs):.4f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="sdxl,flux,hunyuan")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=50, help="calls per timed round, at most")
    ap.add_argument("--baseline", default=None, help="another tree of the pack to time beside this one")
    ap.add_argument("--layouts", default="bhld,bld")
    ap.add_argument("--profile-host", action="store_true",
                    help="also print where the host's time to issue a call goes (cProfile, this tree)")
    args = ap.parse_args()
    os.environ["TRITONKIT_CALIBRATION_DEFER"] = "0"  # `auto` times its pick at its first call
    trees = {"this": load_tree("tritonkit", REPO)}
    if args.baseline:
        trees["base"] = load_tree("tritonkit_base", Path(args.baseline).resolve())
    # each tree's `auto` times and stores its own picks (the store's key names the pack's version,
    # which two checkouts may share)
    cal_dirs = {t: tempfile.mkdtemp(prefix=f"tk_parts_{t}_") for t in trees}
    cc = trees["this"].capability(torch.device("cuda"))
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton",
          importlib.import_module("triton").__version__, "trees", {k: m.__file__ for k, m in trees.items()})
    for sname in args.shapes.split(","):
        B, H, L, D = SHAPES[sname]
        flops = 4 * B * H * L * L * D
        for layout in args.layouts.split(","):
            torch.manual_seed(0)
            shape = (B, H, L, D) if layout == "bhld" else (B, L, H * D)
            q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for name, kw in methods(trees["this"], cc, D):
                calls = {t: tree_call(A, cal_dirs[t], q, k, v, H, layout, kw) for t, A in trees.items()}
                for t, f in calls.items():
                    d, cnt = profile(f)
                    if args.profile_host and t == "this":
                        profile_host(f)
                    print(f"{sname} {layout} {name} [{t}]: GPU sum {sum(d.values()) * 1e-3:.4f} ms")
                    for kname, us in sorted(d.items(), key=lambda x: -x[1]):
                        print(f"    {us * 1e-3:8.4f} ms  x{cnt[kname] // 20}  {kname}")
                if layout == "bhld":
                    calls["cudnn"] = cudnn_call(q, k, v)  # the anchor, timed in the same rounds
                host, wall = collections.defaultdict(list), collections.defaultdict(list)
                # about 30 ms of calls a round (at least 5 calls), at most --calls
                n = max(5, min(args.calls, int(30 / max(per_call(calls["this"], 3)[1], 1e-3))))
                for r in range(args.rounds):
                    order = list(calls) if r % 2 == 0 else list(calls)[::-1]
                    for t in order:
                        h, w = per_call(calls[t], n)
                        host[t].append(h)
                        wall[t].append(w)
                line = [f"{sname} {layout} {name}:"]
                for t in calls:
                    tf = [flops / (w * 1e-3) / 1e12 for w in wall[t]]
                    line.append(f"[{t}] wall ms {med(wall[t])}, {statistics.median(tf):.0f} TFLOPS, "
                                f"host ms {med(host[t])}")
                for other in ("base", "cudnn"):
                    if other in calls:
                        rat = [b / a for a, b in zip(wall["this"], wall[other])]
                        line.append(f"{other}/this {med(rat)}")
                print(" ".join(line), flush=True)


if __name__ == "__main__":
    main()
