"""What the runs of one or more ``bench/workflow.py`` results spent their first step on, one line a run.

    python bench/first_steps.py [--smi smi.csv] artifacts/rounds/hun/workflow.json [more workflow.json ...]

Per run: s/step, the first step, the compile (compiled runs) and whether Inductor's cache was the run's
own warm one (``--warm-rounds``), what the pack's calibration did in the run (shape classes timed, block
configs tuned, their seconds), and, with ``TK_BENCH_TRACE_COMPILES=1``, the Triton compiles that missed
the cache: how many, their summed seconds, the wall seconds during which at least one was compiling
(``busy``), and the kernels that took longest. Made to read a GPU call's results in its output tail."""
from __future__ import annotations

import json
import sys


def _f(x, nd=2):
    return "-" if x is None else f"{x:.{nd}f}"


def lines(doc: dict) -> list[str]:
    out = []
    for r in doc.get("runs", []):
        if r.get("error") or r.get("skipped"):
            out.append(f"{r['run']}: {r.get('error') or r.get('skipped')}"[:300])
            continue
        cal = r.get("calibration") or {}
        tc = r.get("triton_compiles") or {}
        parts = [f"{r['run']}: {_f(r.get('s_per_step'), 4)} s/step, first {_f(r.get('first_step_s'))} s"]
        if r.get("compile_s") is not None:
            parts.append(f"compile {_f(r['compile_s'], 1)} s" + (f" ({r['inductor_cache']} cache)"
                                                                  if r.get("inductor_cache") else ""))
            if r.get("calibration_step_s") is not None:
                # the compiled model's eager first call (calibrating, or recording its shape classes),
                # paid before the compile step: the two together are what the user waited
                parts.append(f"eager step 1 +{_f(r['calibration_step_s'], 1)} s before it "
                             f"(both {_f(r['compile_s'] + r['calibration_step_s'], 1)} s)")
        if cal.get("calibrations") or cal.get("autotunes"):
            parts.append(f"calibrated {cal.get('calibrations', 0)} ({_f(cal.get('calibration_s'), 1)} s), "
                         f"tuned {cal.get('autotunes', 0)} ({_f(cal.get('autotune_s'), 1)} s)"
                         + (f", playoffs {cal.get('playoffs', 0)} run / {cal.get('playoffs_not_run')} not"
                            if cal.get("playoffs_not_run") is not None else "")
                         + (f", {cal['playoffs_in_model']} settled in the model's calls"
                            if cal.get("playoffs_in_model") else ""))
        played = [(k, v) for k, v in (cal.get("new_configs") or {}).items()
                  if any(f in v for f in ("playoff", "playoff_sustained_ms", "playoff_in_model_ms"))]
        if played:  # the block-config playoffs: where each ran, what it timed, what it picked
            parts.append("playoffs: " + " | ".join(
                f"{k.split('|')[-5:]} -> {v['config']} "
                + (f"in the model {v['playoff_in_model_ms']}" if "playoff_in_model_ms" in v
                   else f"bursts {v['playoff_sustained_ms']}" if "playoff_sustained_ms" in v else v["playoff"])
                for k, v in played[:6]))
        slow = sorted([(v.get("took_s") or 0.0, "class " + k.split("|")[0] + "|" + "|".join(k.split("|")[-4:]))
                       for k, v in (cal.get("new_choices") or {}).items()]
                      + [(v.get("tune_s") or 0.0, "tuning " + "|".join(k.split("|")[-5:])
                          + f" (compiles {v.get('compile_wait_s')} s)")
                         for k, v in (cal.get("new_configs") or {}).items()], reverse=True)
        if slow and slow[0][0]:  # the longest timings: a class's (its tunings included) and a tuning's own
            parts.append("longest: " + " | ".join(f"{w} {s:.2f} s" for s, w in slow[:5]))
        skipped = sum(1 for v in (cal.get("new_choices") or {}).values() if v.get("not_timed"))
        if skipped or cal.get("rates"):
            rates = "; ".join(f"{k.split('|', 1)[1]} {v.get('matmul_tflops')} TFLOPS, {v.get('copy_gbps')} GB/s"
                              for k, v in (cal.get("rates") or {}).items())
            parts.append(f"{skipped} classes with a candidate not timed (roofline)"
                         + (f", rates {rates}" if rates else ""))
        if cal.get("deferred_calls") or r.get("calibrating_steps"):
            parts.append(f"{cal.get('prepared', 0)} prepared, {cal.get('warmed', 0)} stored warmed, "
                         f"compiles in workers {cal.get('worker_compiles', 0)} / threads {cal.get('thread_compiles', 0)}"
                         + (f", launchers built ahead {cal['launchers_built']} ({_f(cal.get('launcher_s'))} s)"
                            if cal.get("launchers_built") is not None else "")
                         + (f" ({r['compile_workers_ready']} workers ready at the start)"
                            if r.get("compile_workers_ready") is not None else "") + ", "
                         f"{cal.get('deferred_calls', 0)} calls deferred, "
                         f"calibrating steps {r.get('calibrating_steps')}, timed from step {r.get('timed_from_step')}, "
                         f"extra {_f(r.get('calibration_extra_s'))} s, steps {r.get('step_times_s')}")
        if tc:
            names = ", ".join(f"{n} {c}x {s}s" for n, (c, s) in list((tc.get("misses_by_name") or {}).items())[:4])
            parts.append(f"triton misses {tc.get('misses')} ({tc.get('miss_s')} s, busy {tc.get('miss_busy_s')} s"
                         f"; hits {tc.get('hits')} {tc.get('hit_s')} s) [{names}]")
            cb = tc.get("c_builds")
            if cb:
                parts.append(f"C builds in the model's thread {cb['main_thread']} ({cb['main_thread_s']} s), "
                             f"in others {cb['other_threads']} ({cb['other_threads_s']} s)")
            tl = tc.get("timeline")
            if tl:
                parts.append(f"misses compiled from +{tl['first_start_s']} to +{tl['last_end_s']} s of the first call, "
                             f"running at the first calls' ends {tl['running_at']}, "
                             f"[s, started, done] {tl['started_by_s'][:12]}")
        kt = r.get("kernel_time")
        if kt:
            parts.append(f"last call {kt.get('wall_ms')} ms wall, {kt.get('kernels')} kernels {kt.get('kernel_ms')} ms, "
                         f"GPU idle {kt.get('gpu_idle_in_span_ms')} ms" + (f" ({kt['error']})" if kt.get("error") else ""))
            g = kt.get("gaps")
            if g:
                longest = " | ".join(f"{r['ms']} ms before {r['before'][:30]}: "
                                     + ", ".join(f"{n[:40]} {ms}" for n, ms in r["host"][:3])
                                     for r in g["longest"][:3])
                parts.append(f"{g['count']} gaps {g['sum_ms']} ms (waiting on the GPU {g['waiting_on_gpu_ms']} ms); "
                             f"longest: {longest}")
        out.append("; ".join(parts))
    return out


def census_diff(doc: dict) -> list[str]:
    """Per run with a ``graph_census`` (``--compile-backend census``): the operations whose counts
    differ from the default run of the same arch (summed over the run's graphs)."""
    def total(r):
        out: dict = {}
        for g in r.get("graph_census") or []:
            for op, n in g["ops"].items():
                out[op] = out.get(op, 0) + n
        return out
    runs = [r for r in doc.get("runs", []) if r.get("graph_census")]
    base = {r["arch"]: total(r) for r in runs if r.get("config") == "default"}
    lines = []
    for r in runs:
        if r.get("config") == "default" or r["arch"] not in base:
            continue
        mine, ref = total(r), base[r["arch"]]
        diff = {op: (ref.get(op, 0), mine.get(op, 0)) for op in set(mine) | set(ref) if mine.get(op, 0) != ref.get(op, 0)}
        lines.append(f"{r['run']} vs default: {len(diff)} ops differ" + "".join(
            f"\n  {op}: {a} -> {b}" for op, (a, b) in sorted(diff.items())[:40]))
    return lines


def smi_samples(path: str) -> list[tuple]:
    """(epoch seconds, SM MHz, memory MHz, watts, °C, clock event reasons) per line of
    ``nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,
    clocks_event_reasons.active --format=csv,noheader,nounits`` (the machine's local time)."""
    import datetime
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) < 6:
                continue
            try:
                t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                out.append((t, float(parts[1]), float(parts[2]), float(parts[3]), float(parts[4]), parts[5]))
            except ValueError:
                continue
    return out


def clock_lines(doc: dict, samples: list[tuple]) -> list[str]:
    """Per run with ``t_start``/``t_end``: the median SM clock, memory clock, power and temperature
    of the samples inside it, and how many samples had a clock event (throttle) reason set."""
    import statistics
    lines = []
    for r in doc.get("runs", []):
        if "t_start" not in r:
            continue
        inside = [s for s in samples if r["t_start"] <= s[0] <= r["t_end"]]
        if not inside:
            lines.append(f"{r['run']}: no clock samples")
            continue
        med = [statistics.median(s[i] for s in inside) for i in (1, 2, 3, 4)]
        events = sum(1 for s in inside if s[5] not in ("0x0000000000000000", "0x0", "Not Active"))
        lines.append(f"{r['run']}: SM {med[0]:.0f} MHz, mem {med[1]:.0f} MHz, {med[2]:.0f} W, {med[3]:.0f} C "
                     f"({len(inside)} samples, {events} with a clock event reason)")
    return lines


def main(argv: list[str]) -> int:
    samples = []
    if len(argv) >= 2 and argv[0] == "--smi":
        try:
            samples = smi_samples(argv[1])
        except OSError as e:
            print(f"{argv[1]}: {e}")
        argv = argv[2:]
    for path in argv:
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            print(f"{path}: {e}")
            continue
        print(f"== {path}")
        for ln in lines(doc) + census_diff(doc) + (clock_lines(doc, samples) if samples else []):
            print(ln)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
