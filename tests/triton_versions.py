"""Cross-compiles the pack's kernels with the Triton this process imports, as the pack would use them there.

Run by tests/test_triton_versions.py once per Triton of ``.triton-versions/<v>`` (that folder first on
PYTHONPATH, the venv's torch beside it): every compile spec of kernels/attention.py (the TMA ones only where
this Triton has tensor descriptors), kernels/fp8.py, kernels/fp8_linear.py, kernels/vector_add.py, and
kernels/attention_hopper.py's Gluon forms (each form's first candidate, both head sizes) where
``gluon_available()``, each down to the cubin for each of its archs; then each kernel family once through
Triton's interpreter (the CPU path). Prints one JSON line: {"triton", "compiled", "failed": [[what, cc, error]],
"skipped": [[what, cc, why]], "interpreted_failed": [[what, error]], "gluon", "tensor_descriptors", "fast_launch"}
(kernels/fast_launch.py's direct launches: whether this Triton's JIT launches as they do).

    PYTHONPATH=.triton-versions/3.3.1 .venv/bin/python tests/triton_versions.py
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest  # noqa: E402,F401  (imports the pack as ``tritonkit``)
import torch  # noqa: E402
import triton  # noqa: E402

from compile_utils import compile_for, compile_gluon, map_in_processes  # noqa: E402
from tritonkit.kernels import attention as A  # noqa: E402
from tritonkit.kernels import attention_hopper as AH  # noqa: E402
from tritonkit.kernels import fast_launch, fp8, fp8_linear, vector_add  # noqa: E402

# (Triton minor, arch) pairs this Triton cannot compile for, whatever the kernel: the pack's kernels fall back
# there as on any compile error
KNOWN = {((3, 3), 75): "Triton 3.3 dropped Turing (its MMA lowering fails on sm75; installer/triton_pkg.py)",
         ((3, 2), 120): "Triton 3.2 predates sm120 (its MMA lowering asserts and aborts the process)"}


def triton_minor() -> tuple:
    return tuple(int(x) for x in triton.__version__.split(".")[:2])


def jobs() -> list:
    """(what, source, index, cc): source 'attn' / 'fp8' / 'fp8_linear' / 'vector_add' / 'gluon' / 'gluon8'."""
    out = []
    for i, (k, _, consts, opts) in enumerate(A.COMPILE_SPECS):
        what = f"attention spec {i} ({k.__name__}" + (f", int8 {consts['INT8']}, P·V {consts['PV_MODE']}, "
                                                      f"TMA {consts['USE_TMA']}" if "INT8" in consts else "") + ")"
        out += [(what, "attn", i, cc) for cc in opts["archs"]]
    out += [(f"fp8 spec {i}", "fp8", i, cc) for i in range(len(fp8.COMPILE_SPECS)) for cc in (75, 86, 89, 90, 120)]
    out += [(f"fp8_linear spec {i}", "fp8_linear", i, cc) for i, (_, least) in enumerate(fp8_linear.COMPILE_SPECS)
            for cc in (75, 80, 86, 89, 90, 120) if cc >= least]
    out += [(f"vector_add spec {i}", "vector_add", i, cc) for i in range(len(vector_add.COMPILE_SPECS))
            for cc in (75, 86, 90)]
    for head in AH.HEADS:
        for ws in (False, True, "pp"):
            out.append((f"Gluon exact head {head} ws {ws}", "gluon", (head, ws), 90))
        for fp8_pv in (False, True):
            out.append((f"Gluon 8-bit head {head} fp8 P·V {fp8_pv}", "gluon8", (head, fp8_pv), 90))
    return out


def skip_reason(job) -> str | None:
    what, src, i, cc = job
    if (triton_minor(), cc) in KNOWN:
        return KNOWN[(triton_minor(), cc)]
    if src == "attn" and A.COMPILE_SPECS[i][2].get("USE_TMA") and not A.tensor_descriptors_available():
        return "no tensor descriptors in this Triton: the pack offers no TMA candidate"
    if src in ("gluon", "gluon8") and not AH.gluon_available():
        return "gluon_available() is False with this Triton: the pack offers no Gluon form"
    return None


def compile_job(job):
    what, src, i, cc = job
    try:
        if src in ("gluon", "gluon8"):
            head, flag = i
            if src == "gluon":
                compile_gluon(AH.compile_spec(torch.bfloat16, head, AH.candidates(head, flag)[0], flag), cc)
            else:
                compile_gluon(AH.compile_spec8(torch.bfloat16, head, AH.candidates8(head, flag)[0], flag), cc)
        elif src == "attn":
            kernel, sig, consts, opts = A.COMPILE_SPECS[i]
            compile_for(kernel, sig, consts, cc, opts["num_warps"], opts["num_stages"])
        elif src == "fp8_linear":
            kernel, sig, consts = fp8_linear.COMPILE_SPECS[i][0]
            compile_for(kernel, sig, consts, cc)
        else:
            kernel, sig, consts = {"fp8": fp8, "vector_add": vector_add}[src].COMPILE_SPECS[i]
            compile_for(kernel, sig, consts, cc)
        return None
    except Exception as e:  # noqa: BLE001 - reported, with the compiler's last lines
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        return f"{type(e).__name__}: {' | '.join(lines[-4:])}"[:600]


def interpreted() -> list:
    """The CPU path (Triton's interpreter, as the self-test and CPU-only machines run the kernels): each kernel
    family once on small inputs against its torch reference; [what, error] for each that fails."""
    torch.manual_seed(0)
    x, y = torch.randn(1000), torch.randn(1000)
    w = (torch.randn(64, 48) * 0.1).to(torch.float8_e4m3fn)
    a = torch.randn(5, 48)
    q, k, v = (torch.randn(1, 2, 40, 64) for _ in range(3))
    ref = A.attention_reference(q, k, v, layout="bhld")
    checks = {
        "vector_add": lambda: torch.allclose(vector_add.add(x, y), x + y),
        "fp8 decode": lambda: torch.equal(fp8.decode(w, torch.float32), w.float()),
        "fp8 fused linear": lambda: torch.allclose(fp8_linear.linear(a, w), a @ w.float().t(), atol=1e-4),
        "attention exact": lambda: bool((A.attention(q, k, v, layout="bhld", config=(32, 32, 4, 1)) - ref)
                                        .abs().max() < 1e-4),
        "attention 8-bit": lambda: torch.nn.functional.cosine_similarity(
            A.attention(q, k, v, layout="bhld", mode="int8", config=(32, 32, 4, 1)).flatten(), ref.flatten(),
            dim=0) > 0.999,
    }
    out = []
    for what, check in checks.items():
        try:
            if not check():
                out.append([what, "wrong result"])
        except Exception as e:  # noqa: BLE001 - reported
            out.append([what, f"{type(e).__name__}: {e}"[:400]])
    return out


def main() -> int:
    todo, skipped = [], []
    for job in jobs():
        why = skip_reason(job)
        if why:
            skipped.append([job[0], job[3], why])
        else:
            todo.append(job)
    errors = map_in_processes(compile_job, todo)
    failed = [[job[0], job[3], err] for job, err in zip(todo, errors) if err]
    print(json.dumps({"triton": triton.__version__, "triton_file": triton.__file__, "compiled": len(todo) - len(failed),
                      "failed": failed, "skipped": skipped, "interpreted_failed": interpreted(),
                      "gluon": AH.gluon_available(),
                      "tensor_descriptors": A.tensor_descriptors_available(),
                      "fast_launch": fast_launch.convention_ok()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
