"""What the attention kernel compiles to on GPUs we cannot run: registers and spills (``ptxas -v``) and the
instruction mix of the unmasked key loop (nvdisasm), per arch and block config, on a CPU-only machine.

    python bench/attention_sass.py [--archs 86,89,90,120] [--head 128] [--forms exact,int8,int8-fp8pv]
                                   [--qk-offset on|off|both]

Each kernel is compiled as Triton's launcher specialises it at run time for aligned tensors: every pointer
and every tensor stride a multiple of 16 (``tt.divisibility``), as the 8-bit mode's own copies of Q, K and V
always are. Without that the loads are not vectorised (byte loads of the int8 K tile, no cp.async) and the
registers and spills read nothing like the kernel a GPU runs. Columns: registers, spill bytes (stores), the
loop's instructions, and in it the exponentials (MUFU.EX2), int-to-float conversions (I2F / I2FP), MMAs,
global loads (LDG; LDGSTS: cp.async) and local-memory loads (LDL: spilled values read back)."""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
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

sys.path.insert(0, str(REPO / "tests"))
from compile_utils import compile_for, ptxas_usage  # noqa: E402  (the tests' cross-compile helpers)

_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
# the mask's and the scales' strides are not multiples of 16 at run time; every other stride and pointer is
_NOT_DIVISIBLE = ("stride_mb", "stride_mh", "stride_mm", "stride_mn", "stride_qsb", "stride_qsh", "stride_ksb",
                  "stride_ksh")


def compile_aligned(spec, cc: int):
    """``spec`` (kernels/attention.py's compile spec) compiled for ``cc`` as the launcher specialises aligned
    tensors."""
    fn, sig, consts, opts = spec
    aligned = tuple(n for n in sig if (sig[n].startswith("*") or n.startswith("stride_")) and n not in _NOT_DIVISIBLE)
    return compile_for(fn, sig, consts, cc, opts["num_warps"], opts["num_stages"], divisible=aligned)


def key_loop(compiled) -> list:
    """The SASS instructions of the kernel's first loop (the unmasked key blocks): from the label the first
    backward branch goes to, through that branch."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    try:
        sass = subprocess.run([str(_BIN / "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                              timeout=120).stdout
    finally:
        os.unlink(f.name)
    labels, seq = {}, []
    for line in sass.splitlines():
        lab = re.match(r"^\s*(\.L_x_\d+):", line)
        if lab:
            labels[lab.group(1)] = len(seq)
            continue
        ins = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*)", line)
        if ins:
            seq.append(ins.group(1))
    for i, ins in enumerate(seq):
        br = re.search(r"\bBRA\b.*?(\.L_x_\d+)", ins)
        if br and labels.get(br.group(1), i) < i:
            return seq[labels[br.group(1)]: i + 1]
    return []


def mix(loop: list) -> dict:
    ops = collections.Counter(re.match(r"(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", s).group(1) for s in loop)

    def n(*prefixes):
        return sum(c for op, c in ops.items() if op.split(".")[0] in prefixes)
    return {"instrs": len(loop), "ex2": sum(c for op, c in ops.items() if op.startswith("MUFU.EX2")),
            "i2f": n("I2F", "I2FP"), "mma": n("HMMA", "IMMA", "QMMA", "HGMMA", "IGMMA", "QGMMA"),
            "ldg": n("LDG"), "ldgsts": n("LDGSTS"), "ldl": n("LDL")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default="86,89,90,120")
    ap.add_argument("--head", type=int, default=128)
    ap.add_argument("--forms", default="exact,int8,int8-fp8pv")
    ap.add_argument("--qk-offset", choices=("on", "off", "both"), default="both",
                    help="8-bit forms: the int32 scores read through the offset (on, the default) or converted")
    args = ap.parse_args()
    bd = A.block_d_for(args.head)
    print(f"Triton {triton.__version__}; head {args.head}; the runtime's 16-byte specialisation")
    print("| arch | form | config | QK offset | registers | spill bytes | loop instrs | EX2 | I2F | MMA | LDG | "
          "LDGSTS | LDL |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for cc in (int(a) for a in args.archs.split(",")):
        for form in args.forms.split(","):
            int8, pv = form != "exact", 1 if form == "int8-fp8pv" else 0
            if (int8 and not A.int8_supported(cc)) or (pv == 1 and not A.fp8_pv_supported(cc)):
                continue
            kind = "int8-fp8pv" if pv == 1 else int8
            offsets = ((True, False) if args.qk_offset == "both" else (args.qk_offset == "on",)) if int8 else (None,)
            for cfg in A.candidates(cc, bd, 2, kind):
                for off in offsets:
                    spec = A._spec(torch.bfloat16, int8, args.head, cfg, (cc,), pv_mode=pv, align8=pv == 1)
                    if off is not None:
                        spec[2]["QK_OFFSET"] = off
                    try:
                        k = compile_aligned(spec, cc)
                    except Exception as e:  # noqa: BLE001 - a config this Triton cannot compile: say so
                        print(f"| sm{cc} | {form} | {cfg} | {off} | {type(e).__name__}: {str(e)[:60]} |")
                        continue
                    regs, spill = ptxas_usage(k, cc) or (None, None)
                    m = mix(key_loop(k))
                    shown = "–" if off is None else ("on" if off else "off")
                    print(f"| sm{cc} | {form} | {cfg} | {shown} | {regs} | {spill} | {m['instrs']} | {m['ex2']} | "
                          f"{m['i2f']} | {m['mma']} | {m['ldg']} | {m['ldgsts']} | {m['ldl']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
