"""Cross-architecture compilation without a GPU: ``triton.compile`` for a GPUTarget runs the
whole pipeline down to the cubin (ptxas included) on a CPU-only machine."""
from __future__ import annotations

ARCHS = (75, 80, 86, 89, 90, 120)


def compile_for(kernel, signature: dict, constexprs: dict, cc: int, num_warps: int = 4, num_stages: int = 3,
                divisible: tuple = ()):
    """``divisible``: the arguments Triton's launcher would specialise as multiples of 16 (pointers to
    aligned tensors, such strides), which its vector loads and stores need."""
    import triton
    import inspect

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(signature)
    if "constexprs" in inspect.signature(ASTSource.__init__).parameters:
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
        src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs or None)
    else:  # Triton 3.2 and older (tests/triton_versions.py): constants by name, no alignment attributes
        if divisible:
            raise NotImplementedError("divisible= needs Triton 3.3+")
        src = ASTSource(fn=kernel, signature=signature, constants=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", cc, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def compile_gluon(spec, cc: int = 90):
    """A Gluon kernel's compile spec (kernels/attention_hopper.py's compile_spec / compile_spec8: kernel,
    signature, constexprs, options) compiled for ``cc``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    kernel, sig, consts, opts = spec
    return triton.compile(GluonASTSource(kernel, sig, consts), target=GPUTarget("cuda", cc, 32),
                          options={"num_warps": opts["num_warps"], "num_stages": opts["num_stages"]})


def ptxas_usage(compiled, cc: int):
    """(registers, bytes of registers spilled a thread (stores)) when ptxas assembles ``compiled``'s PTX
    for ``cc``, as ``ptxas -v`` reports them (a compiled kernel's own figures need a GPU); None when
    Triton has no ptxas here. The ptxas is the one Triton compiled with (``TRITON_PTXAS_PATH`` where
    set, as the pack sets it to torch's, installer/ptxas.py): the PTX's ``.version`` follows that
    ptxas, which an older bundled one refuses."""
    import os
    import re
    import subprocess
    import tempfile

    import triton
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        exe = get_ptxas(cc).path
    except Exception:  # noqa: BLE001 - a Triton without the resolver: its bundled ptxas
        exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                           "ptxas-blackwell" if cc >= 100 else "ptxas")
    if not os.path.exists(exe):
        exe = exe.replace("ptxas-blackwell", "ptxas")
        if not os.path.exists(exe):
            return None
    ptx = compiled.asm["ptx"]
    target = re.search(r"^\.target\s+(sm_\w+)", ptx, re.M).group(1)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        r = subprocess.run([exe, "-v", f"--gpu-name={target}", path, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    regs = re.search(r"Used (\d+) registers", out)
    spill = re.search(r"(\d+) bytes spill stores", out)
    if r.returncode != 0 or regs is None or spill is None:
        raise RuntimeError(f"ptxas -v for {target} failed: {out[-500:]}")
    return int(regs.group(1)), int(spill.group(1))


def spill_bytes(compiled, cc: int):
    """Bytes of registers spilled a thread (stores): :func:`ptxas_usage`'s second figure, or None."""
    usage = ptxas_usage(compiled, cc)
    return None if usage is None else usage[1]


def map_in_processes(fn, jobs: list) -> list:
    """``[fn(job) for job in jobs]`` in a pool of one forked process per core where there are several (each
    compile is seconds of LLVM + ptxas); ``fn`` must be a module-level function."""
    import multiprocessing
    import os

    n = max(1, min(len(jobs), os.cpu_count() or 1))
    if n > 1 and "fork" in multiprocessing.get_all_start_methods():
        with multiprocessing.get_context("fork").Pool(n) as pool:
            return pool.map(fn, jobs, chunksize=1)
    return [fn(job) for job in jobs]
