"""Two block configs timed call by call under four call patterns: is a playoff's turn one call or a stretch?

The 8-bit attention's Gluon kernel has two P·V forms, 16-bit ((128, 128, 4, 2, 3)) and fp8
((128, 128, 4, 2, 4)). `auto`'s playoff in the model's calls (kernels/trials.py) times its finalists
call by call; on a GPU at its power cap a call's clocks follow what the calls before it drew. This
times each config's calls (CUDA events around each call) in rounds, each pattern interleaved:

* ``AA`` / ``BB``: one config back to back (what a model that keeps it runs);
* ``AB``: the two alternating call by call (a turn of one call);
* ``turns``: the two in turns of ``kernels.trials.stretch_for`` calls, the second half of each turn
  timed (what the playoff does now);

alone and, with ``--context``, each call between two bf16 GEMMs of the model's block (its QKV
projection, then its MLP): the call's time, and the block's (the GEMMs run at the clocks the
attention's draw leaves them too). With ``--smi MS`` nvidia-smi samples the SM clock
every MS ms and each row gets the median clock over its calls.

    python3 bench/playoff_turns.py [--shapes wan,hunyuan,flux] [--rounds 2] [--context] [--smi 20]
                                   [--configs 128,128,4,2,3 128,128,4,2,4] [--json out.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
# name: (heads, tokens, model width); head 128
SHAPES = {"wan": (40, 32760, 5120), "hunyuan": (24, 16384, 3072), "flux": (24, 4608, 3072)}


def _pack():
    pkg = types.ModuleType("tritonkit")
    pkg.__path__ = [str(REPO)]
    sys.modules.setdefault("tritonkit", pkg)
    from tritonkit.kernels import attention as A
    from tritonkit.kernels import trials as TR
    return A, TR


def per_call(seq, calls, around=None):
    """[(name, ms of the call, ms of the call with its GEMMs)] of each call in ``seq`` (names into
    ``calls``), CUDA events around each; ``around``: (before, after) run around every call."""
    evs = []
    for name in seq:
        b, s, e, a = (torch.cuda.Event(enable_timing=True) for _ in range(4))
        b.record()
        if around:
            around[0]()
        s.record()
        calls[name]()
        e.record()
        if around:
            around[1]()
        a.record()
        evs.append((name, b, s, e, a))
    torch.cuda.synchronize()
    return [(n, s.elapsed_time(e), b.elapsed_time(a)) for n, b, s, e, a in evs]


def patterns(n: int, stretch: int) -> dict:
    """pattern -> (sequence of "A" / "B", indices of the timed calls)."""
    turns = "".join(("A" if t % 2 == 0 else "B") * stretch for t in range(max(2, -(-n // stretch)) * 2))
    return {"AA": ("A" * n, range(n // 4, n)), "BB": ("B" * n, range(n // 4, n)),
            "AB": ("AB" * (n // 2), range(n // 4, 2 * (n // 2))),
            "turns": (turns, [i for i in range(len(turns)) if i % stretch >= stretch // 2])}


def smi_clock(t0: float, t1: float, rows) -> float | None:
    sel = [c for t, c in rows if t0 <= t <= t1]
    return statistics.median(sel) if sel else None


def read_smi(path: Path) -> list:
    rows = []
    for line in path.read_text().splitlines():
        p = [x.strip() for x in line.split(",")]
        try:
            t = datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((t, float(p[1])))
        except (ValueError, IndexError):
            continue
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="wan,hunyuan,flux")
    ap.add_argument("--configs", nargs=2, default=["128,128,4,2,3", "128,128,4,2,4"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--context", action="store_true", help="also each call between its block's GEMMs")
    ap.add_argument("--ms", type=float, default=600.0, help="about this much of each config's calls a pattern")
    ap.add_argument("--smi", type=int, default=0, help="sample the SM clock every this many ms (nvidia-smi)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 0
    A, TR = _pack()
    dev = torch.device("cuda")
    cfg = {n: tuple(int(t) for t in c.split(",")) for n, c in zip("AB", a.configs)}
    smi = smi_file = None
    if a.smi:
        smi_file = Path(tempfile.mkstemp(suffix=".csv")[1])
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm", "--format=csv,noheader,nounits",
                                f"-lms={a.smi}"], stdout=smi_file.open("w"), stderr=subprocess.DEVNULL)
    import triton
    head = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; "
            f"A = {a.configs[0]}, B = {a.configs[1]}; ms a call (median, timed calls), rounds {a.rounds}")
    rows = []
    for shape in a.shapes.split(","):
        h, L, width = SHAPES[shape]
        g = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(1, h, L, 128, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
        calls = {n: (lambda c=c: A._launch(q, k, v, None, h, True, True, None, True, False, cfg=c))
                 for n, c in cfg.items()}
        around = None
        if a.context:
            x = torch.randn(L, width, device=dev, dtype=torch.bfloat16, generator=g)
            w1, w2, w3 = (torch.randn(i, o, device=dev, dtype=torch.bfloat16, generator=g) / i ** 0.5
                          for i, o in ((width, 3 * width), (width, 4 * width), (4 * width, width)))
            around = (lambda: x @ w1, lambda: (x @ w2) @ w3)
        for fn in calls.values():
            fn()
        torch.cuda.synchronize()
        est = min(statistics.median(t for _, t, _ in per_call("A" * 3, calls)),
                  statistics.median(t for _, t, _ in per_call("B" * 3, calls)))
        n = max(8, min(64, int(a.ms / est)))
        stretch = TR.stretch_for(est)
        pats = patterns(n, stretch)
        for r in range(a.rounds):
            for pname in (list(pats) if r % 2 == 0 else list(pats)[::-1]):
                seq, timed = pats[pname]
                for ctx in ([None, around] if around else [None]):
                    t0 = time.time()
                    res = per_call(seq, calls, ctx)
                    t1 = time.time()
                    timed = set(timed)
                    row = {"shape": shape, "pattern": pname, "context": ctx is not None, "round": r,
                           "stretch": stretch, "t": (t0, t1)}
                    for nm in "AB":
                        ts = [(t, tb) for i, (m, t, tb) in enumerate(res) if m == nm and i in timed]
                        if ts:
                            row[nm] = statistics.median(t for t, _ in ts)
                            row[nm + "_block"] = statistics.median(tb for _, tb in ts)
                    rows.append(row)
                    time.sleep(0.2)
        del q, k, v, calls, around
        torch.cuda.empty_cache()
    if smi is not None:
        smi.terminate()
        smi.wait()
        samples = read_smi(smi_file)
        for row in rows:
            row["sm_mhz"] = smi_clock(*row["t"], samples)
        smi_file.unlink()
    print(head)
    print("| shape | pattern | context | turn calls | A ms | B ms | B/A | A with GEMMs | B with GEMMs | B/A | SM MHz |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for shape in a.shapes.split(","):
        for label, pnames in (("back to back", ("AA", "BB")), ("call by call", ("AB",)), ("turns", ("turns",))):
            for ctx in (False, True):
                sel = [r for r in rows if r["shape"] == shape and r["pattern"] in pnames and r["context"] == ctx]
                if not sel:
                    continue
                am = [r["A"] for r in sel if "A" in r]
                bm = [r["B"] for r in sel if "B" in r]
                ab = [r["A_block"] for r in sel if "A" in r]
                bb = [r["B_block"] for r in sel if "B" in r]
                cell = lambda v: f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" if v else ""  # noqa: E731
                ratio = f"{statistics.median(bm) / statistics.median(am):.3f}" if am and bm else ""
                mhz = {p: [r["sm_mhz"] for r in sel if r["pattern"] == p and r.get("sm_mhz")] for p in pnames}
                clk = " / ".join(f"{statistics.median(v):.0f}" for v in mhz.values() if v)
                blocks = (f"{cell(ab)} | {cell(bb)} | {statistics.median(bb) / statistics.median(ab):.3f}"
                          if ctx and ab and bb else " | | ")
                print(f"| {shape} | {label} | {'GEMMs' if ctx else 'alone'} | {sel[0]['stretch']} | {cell(am)} | "
                      f"{cell(bm)} | {ratio} | {blocks} | {clk} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"head": head, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
