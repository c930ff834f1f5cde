"""The simulated consumer paths (``arch=`` / TRITONKIT_FORCE_ARCH) at the consumer card's occupancy. An H200 has
228 KB of shared memory an SM, an RTX 3090 / 4090 / 5090 about 100 KB: a block config whose kernel takes more than
half of that runs one CTA an SM on the card and two (or more) on the H200, and times faster here than it would
there. This compiles each config for the simulated arch (as the card's Triton would, aligned as the launcher
specialises real calls) to read its shared memory and registers, works out the CTAs an SM the card allows, and
times the config on this GPU twice: as it runs here, and with its dynamic shared memory raised until this GPU fits
no more CTAs an SM than the card (Triton's own launches; TRITONKIT_FAST_LAUNCH=0). Interleaved rounds of
``do_bench``, median (min-max) ms.

    python bench/attention_occupancy.py [--arch 89] [--pv fp8] [--shapes hunyuan,flux]
                                        [--configs "64,64,4,3;64,128,4,3"] [--card-smem-kb 100] [--rounds 5]

Below sm90 the configs compile with the card's MMA instruction (``DISABLE_MMA_V3=1``, mma.sync: nodes/arch.py) unless
the environment sets it; the forty-eighth session's figures were wgmma code. Only the occupancy is matched: the
card's clocks, its MMA and exp2 rates and its memory bandwidth are not. The
raise works on Triton's CompiledKernel (its metadata's ``shared``), which Triton 3.6 reads at load and at launch."""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import warnings
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention import A, SHAPES  # noqa: E402  (the pack's kernels, through bench/attention.py's import shim)
from attention_sass import compile_aligned, ptxas_usage  # noqa: E402
from tritonkit.nodes.arch import card_mma  # noqa: E402

RESERVED = 1024  # shared memory the driver keeps for each CTA (sm80+)
REGS_PER_SM = 65536
MAX_THREADS = 1536  # threads an SM on sm86, sm89 and sm120


def ctas_per_sm(shared: int, regs: int, num_warps: int, smem_per_sm: int, max_threads: int = MAX_THREADS) -> int:
    """CTAs an SM of a kernel with ``shared`` bytes of shared memory and ``regs`` registers a thread, on an SM with
    ``smem_per_sm`` bytes (each CTA also takes the driver's RESERVED) and 64 K registers, allotted a warp at a time
    in units of 256 (a thread's count rounded up to 8)."""
    per_warp = -(-((regs + 7) // 8 * 8) * 32 // 256) * 256
    return min(REGS_PER_SM // (per_warp * num_warps), smem_per_sm // (shared + RESERVED),
               max_threads // (num_warps * 32))


def card_ctas(cfg, cc: int, head: int, pv: int, card_smem: int):
    """(CTAs an SM on the card, the kernel's shared memory and registers there) for this config compiled for ``cc``."""
    spec = A._spec(torch.bfloat16, True, head, cfg, (cc,), pv_mode=pv, align8=pv == 1)
    k = compile_aligned(spec, cc)
    usage = ptxas_usage(k, cc)
    if usage is None:
        raise SystemExit(f"no ptxas for sm{cc} beside this Triton: the card's registers cannot be read")
    return ctas_per_sm(k.metadata.shared, usage[0], cfg[2], card_smem), k.metadata.shared, usage[0]


def _kernels() -> dict:
    """This process's loaded attention kernels (Triton's CompiledKernel objects), by id."""
    from triton.compiler.compiler import CompiledKernel
    with warnings.catch_warnings():  # (isinstance on every object wakes torch's deprecated attributes)
        warnings.simplefilter("ignore")
        return {id(o): o for o in gc.get_objects() if isinstance(o, CompiledKernel) and o.name.startswith("attn_fwd")}


def set_shared(kernels, value: int) -> None:
    """Load ``kernels`` again with ``value`` bytes of dynamic shared memory, which their launches then ask for."""
    for ck in kernels:
        ck.metadata = ck.metadata._replace(shared=value)
        ck.packed_metadata = (ck.metadata.num_warps, ck.metadata.num_ctas, value)
        ck.module = None
        ck._run = None
        ck._init_handles()


def ctas_here(ck) -> int | None:
    """CTAs an SM this GPU runs of ``ck`` (the driver's occupancy calculator), or None where it cannot say."""
    try:
        from cuda.bindings import driver as cu
        err, n = cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(cu.CUfunction(ck.function),
                                                                 ck.metadata.num_warps * 32, ck.metadata.shared)
        return int(n) if int(err) == 0 else None
    except Exception:  # noqa: BLE001 - no cuda-python here: the timing still says it
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=89)
    ap.add_argument("--pv", choices=("fp8", "half"), default="fp8")
    ap.add_argument("--shapes", default="hunyuan,flux")
    ap.add_argument("--configs", default="64,64,4,3;64,128,4,3")
    ap.add_argument("--card-smem-kb", type=int, default=100, help="the simulated card's shared memory an SM")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rep", type=int, default=40)
    a = ap.parse_args()
    card_mma(a.arch, os.environ)  # the simulated card's MMA instruction (mma.sync, not wgmma), before any compile
    os.environ["TRITONKIT_FAST_LAUNCH"] = "0"  # (the raise is seen by Triton's launch path only; read at each call)
    pv = 1 if a.pv == "fp8" else 0
    cfgs = [tuple(int(x) for x in c.split(",")) for c in a.configs.split(";")]
    props = torch.cuda.get_device_properties(0)
    sm_smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
    block_max = getattr(props, "shared_memory_per_block_optin", sm_smem - RESERVED)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__,
          f"sm{a.arch} simulated, {a.card_smem_kb} KB an SM; here {sm_smem // 1024} KB; "
          f"DISABLE_MMA_V3={os.environ.get('DISABLE_MMA_V3', '')}", flush=True)
    for sname in a.shapes.split(","):
        B, H, L, D = SHAPES[sname]
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o = torch.empty_like(q)
        def call(cfg):
            return A.attention(q, k, v, layout="bhld", mode="int8", config=cfg + (pv,), out=o, pv=a.pv, arch=a.arch)

        runs, kern, pads = {}, {}, {}
        for cfg in cfgs:
            target, card_shared, regs = card_ctas(cfg, a.arch, D, pv, a.card_smem_kb * 1024)
            before = _kernels()
            call(cfg)
            torch.cuda.synchronize()
            new = [ck for i, ck in _kernels().items() if i not in before] or kern.get(cfg, [])
            kern[cfg] = new
            own = new[0].metadata.shared if new else None
            here = ctas_here(new[0]) if new else None
            pad = None
            if new and (here is None or here > target):
                pad = min(max(sm_smem // target - RESERVED, own), block_max)
            pads[cfg] = (own, pad)
            print(f"{sname} {cfg}: on the card {card_shared} B shared, {regs} registers -> {target} CTAs an SM; "
                  f"here {own} B, {here} CTAs an SM" + (f"; raised to {pad} B" if pad else ""), flush=True)
            runs[f"{cfg}"] = (cfg, None)
            if pad:
                runs[f"{cfg} at the card's occupancy"] = (cfg, pad)
        times = {n: [] for n in runs}
        for _ in range(a.rounds):
            for n, (cfg, pad) in runs.items():
                own, _ = pads[cfg]
                set_shared(kern[cfg], pad or own)
                times[n].append(triton.testing.do_bench(lambda cfg=cfg: call(cfg), warmup=100, rep=a.rep))
        for cfg in cfgs:
            set_shared(kern[cfg], pads[cfg][0])
        print(f"| {sname} {(B, H, L, D)} @{a.arch} {a.pv} | ms med (min-max) |")
        for n in sorted(times, key=lambda n: statistics.median(times[n])):
            t = times[n]
            print(f"| {n} | {statistics.median(t):.4f} ({min(t):.4f}-{max(t):.4f}) |", flush=True)
        del q, k, v, o
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
