"""What limits the Hopper attention kernels (kernels/attention_hopper.py), read off the hardware
counters with Nsight Compute: one launch of a Gluon kernel at a real shape, its duration and clock,
the busy share of each pipe (tensor, XU = MUFU's exponentials, FMA, ALU), issue-slot use, and
where its warps stall, in total and per SASS opcode of its hottest loop.

    python bench/attention_ncu.py profile [--methods g8half,ws] [--shapes flux] [--out DIR]
    python bench/attention_ncu.py summary DIR/<method>-<shape>        (a report already taken)

``profile`` runs the workload once outside ncu (its kernels compile there, not under the
profiler), then under ``ncu --clock-control none`` (the GPU's own clocks, as in every other bench),
catching the 4th launch of the kernel (of the call, for cuDNN). Methods: ``g8half`` / ``g8fp8`` (the 8-bit kernel with
16-bit or fp8 P·V), ``ws`` (exact, warp-specialised), ``pp`` (exact, ping-pong), each at its first
block config; ``cudnn`` (SDPA's cuDNN backend, the anchor: its kernel is caught by name). Needs ``ncu`` on the PATH (or under /opt/nvidia/nsight-compute) and a GPU whose
counters it can read; sm90 only (the kernels are Hopper's)."""
from __future__ import annotations

import argparse
import collections
import csv
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "SchedulerStats",
            "WarpStateStats", "Occupancy", "LaunchStats", "SourceCounters", "InstructionStats")
METRICS = ("Duration", "SM Frequency", "Compute (SM) Throughput", "L2 Cache Throughput", "DRAM Throughput",
           "Issue Slots Busy", "No Eligible", "Warp Cycles Per Issued Instruction", "Registers Per Thread",
           "Achieved Occupancy")
PIPES = ("SM: Pipe Tensor Cycles Active", "SM: Inst Executed Pipe Xu", "SM: Pipe Fma Cycles Active",
         "SM: Pipe Alu Cycles Active")


def _calls(method, shape):
    sys.path.insert(0, str(HERE))
    import torch
    from attention import A, SHAPES, sdpa  # noqa: E402  (the pack's kernels, through bench/attention.py's shim)
    B, H, L, D = SHAPES[shape]
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    ws8 = A.attention_hopper.candidates8(D, method == "g8fp8")[0]
    ws = A.attention_hopper.candidates(D, True)[0]
    calls = {
        "g8half": lambda: A.attention(q, k, v, layout="bhld", mode="int8", config=ws8 + (A.G8_HALF,), out=o, pv="half"),
        "g8fp8": lambda: A.attention(q, k, v, layout="bhld", mode="int8", config=ws8 + (A.G8_FP8,), out=o, pv="fp8"),
        "ws": lambda: A.attention(q, k, v, layout="bhld", config=ws + (A.GLUON_WS,), out=o),
        "pp": lambda: A.attention(q, k, v, layout="bhld", config=ws + (A.GLUON_PP,), out=o),
        "cudnn": lambda: sdpa("cudnn")(q, k, v),
    }
    f = calls[method]
    for _ in range(6):
        f()
    torch.cuda.synchronize()


def _ncu() -> str:
    exe = shutil.which("ncu") or next(iter(sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))), None)
    if exe is None:
        raise SystemExit("ncu not found: install Nsight Compute or put it on the PATH")
    return exe


def profile(methods, shapes, out: Path):
    ncu = _ncu()
    out.mkdir(parents=True, exist_ok=True)
    for m in methods:
        for s in shapes:
            base = out / f"{m}-{s}"
            run = [sys.executable, __file__, "run", m, s]
            subprocess.run(run, check=True, capture_output=True)  # compile outside the profiler
            # cuDNN's kernel by its place: after the three randn fills, the 4th of the six calls
            which = ["--launch-skip", "6"] if m == "cudnn" else ["-k", "regex:attn_fwd_hopper", "--launch-skip", "3"]
            cmd = [ncu, "--clock-control", "none", *which, "--launch-count", "1", "-o", str(base), "-f"]
            for sec in SECTIONS:
                cmd += ["--section", sec]
            r = subprocess.run(cmd + run, capture_output=True, text=True)
            if r.returncode != 0 or not Path(f"{base}.ncu-rep").exists():
                print(f"{m} {s}: ncu failed: {(r.stdout + r.stderr)[-800:]}")
                continue
            for page, extra, suffix in (("details", ["--print-details", "all"], "details.txt"),
                                        ("source", ["--csv", "--print-source", "sass"], "sass.csv")):
                with open(f"{base}.{suffix}", "w") as f:
                    subprocess.run([ncu, "-i", f"{base}.ncu-rep", "--page", page] + extra, stdout=f,
                                   stderr=subprocess.STDOUT, check=False)
            summary(base)


def _details(text: str) -> dict:
    got = {}
    for line in text.splitlines():
        for name in METRICS + PIPES:
            if name not in got and re.match(rf"\s*{re.escape(name)}\s", line):
                got[name] = " ".join(line.split()[len(name.split()):])
        m = re.match(r"\s*Stall (.+?)\s+inst\s+([\d.]+)", line)
        if m:
            got.setdefault("stalls", []).append((float(m.group(2)), m.group(1)))
    return got


def _hot_loop(rows, i_src, i_samples):
    """(first, last) row of the backward branch's body holding the most samples among the loops
    that issue both kinds of MMA of a key block (the consumers' main loop)."""
    addr = [int(r[0], 16) for r in rows]
    best = None
    for i, r in enumerate(rows):
        m = re.search(r"BRA (0x[0-9a-f]+)", r[i_src])
        if not m or int(m.group(1), 16) >= addr[i] or int(m.group(1), 16) not in addr:
            continue
        j = addr.index(int(m.group(1), 16))
        body = rows[j:i + 1]
        src = " ".join(x[i_src] for x in body)
        if "GMMA" not in src or len(body) > 1500:
            continue
        n = sum(int(x[i_samples] or 0) for x in body)
        if best is None or n > best[0]:
            best = (n, j, i)
    return best


def summary(base):
    base = str(base)
    d = _details(open(f"{base}.details.txt").read())
    name = next((ln.strip() for ln in open(f"{base}.details.txt") if "(" in ln and "Context" in ln), "")
    print(f"== {os.path.basename(base)}  {name[:120]}")
    for name in METRICS + PIPES:
        if name in d:
            print(f"  {name}: {d[name]}")
    if d.get("stalls"):
        print("  warp stalls (cycles per issued instruction): " +
              ", ".join(f"{k} {v:.2f}" for v, k in sorted(d["stalls"], reverse=True)[:8]))
    rows = [r for r in csv.reader(open(f"{base}.sass.csv")) if r]
    head = next(i for i, r in enumerate(rows) if "Source" in r)
    hdr, rows = rows[head], [r for r in rows[head + 1:] if r and r[0].startswith("0x")]
    i_src, i_s = hdr.index("Source"), hdr.index("Warp Stall Sampling (All Samples)")
    cols = [c for c in hdr if c.startswith("stall_") and "Not Issued" not in c]
    loop = _hot_loop(rows, i_src, i_s)
    if loop is None:
        return
    n, j, i = loop
    print(f"  hottest MMA loop: {i - j + 1} instructions, {n} samples; stalls per opcode (samples):")
    by, cnt = collections.defaultdict(collections.Counter), collections.Counter()
    for r in rows[j:i + 1]:
        op = [t for t in r[i_src].split() if not t.startswith("@")][0].split(".")[0]
        cnt[op] += 1
        for c in cols:
            by[op][c[6:]] += int(r[hdr.index(c)] or 0)
    tot = collections.Counter()
    for c in by.values():
        tot.update(c)
    print("    all: " + ", ".join(f"{k} {v}" for k, v in tot.most_common(8)))
    for op, c in sorted(by.items(), key=lambda kv: -sum(kv[1].values()))[:12]:
        print(f"    {op:10s} x{cnt[op]:<4d} {sum(c.values()):6d}: " + ", ".join(f"{k} {v}" for k, v in c.most_common(4)))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("profile")
    p.add_argument("--methods", default="g8half,ws")
    p.add_argument("--shapes", default="flux")
    p.add_argument("--out", default="ncu-attention")
    r = sub.add_parser("run")
    r.add_argument("method", choices=("g8half", "g8fp8", "ws", "pp", "cudnn"))
    r.add_argument("shape")
    s = sub.add_parser("summary")
    s.add_argument("base", help="DIR/<method>-<shape>: the .details.txt and .sass.csv that profile wrote")
    a = ap.parse_args()
    if a.cmd == "run":
        _calls(a.method, a.shape)
    elif a.cmd == "profile":
        profile(a.methods.split(","), a.shapes.split(","), Path(a.out))
    else:
        summary(a.base)


if __name__ == "__main__":
    main()
