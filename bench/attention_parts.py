"""Where an attention call's GPU time goes: per-kernel GPU durations (torch.profiler) of whole
calls of the pack's attention at real shapes and fixed configs, exact and 8-bit (its quantisation
pre-passes, the K mean, the fp8 V copy), both layouts; with the host's time to issue a call and the
wall time per call back to back.

    python bench/attention_parts.py"""
from __future__ import annotations
import collections
import sys
import time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention import A  # noqa: E402  (bench/attention.py's import shim)


def profile(f, n=20):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    from torch.profiler import profile as prof, ProfilerActivity
    with prof(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
        for _ in range(n):
            f()
        torch.cuda.synchronize()
    d = collections.defaultdict(float)
    cnt = collections.Counter()
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            d[e.name[:60]] += e.device_time / n
            cnt[e.name[:60]] += 1
    return d, cnt


def main():
    shapes = {"flux": (1, 24, 4608, 128), "hunyuan": (1, 24, 16384, 128)}
    for sname, (B, H, L, D) in shapes.items():
        for layout in ("bhld", "bld"):
            torch.manual_seed(0)
            if layout == "bhld":
                q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            else:
                q, k, v = (torch.randn(B, L, H * D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for name, kw in [("exact(128,128,8,3)", dict(config=(128, 128, 8, 3))),
                             ("8bit half(128,64,4,3)", dict(mode="int8", pv="half", config=(128, 64, 4, 3))),
                             ("8bit half(128,128,8,3)", dict(mode="int8", pv="half", config=(128, 128, 8, 3))),
                             ("8bit fp8(128,128,8,3)", dict(mode="int8", pv="fp8", config=(128, 128, 8, 3)))]:
                f = lambda: A.attention(q, k, v, H, layout=layout, **kw)  # noqa: E731
                d, cnt = profile(f)
                # wall per call, back to back
                torch.cuda.synchronize(); t0 = time.perf_counter()
                for _ in range(50):
                    f()
                t_host = (time.perf_counter() - t0) / 50
                torch.cuda.synchronize(); t_all = (time.perf_counter() - t0) / 50
                tot = sum(d.values())
                print(f"{sname} {layout} {name}: GPU sum {tot*1e-3:.4f} ms, host issue {t_host*1e3:.4f} ms, "
                      f"wall {t_all*1e3:.4f} ms/call")
                for kname, us in sorted(d.items(), key=lambda x: -x[1]):
                    print(f"    {us*1e-3:8.4f} ms  x{cnt[kname]//20}  {kname}")


if __name__ == "__main__":
    main()
