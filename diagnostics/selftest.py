"""The Triton self-test (the vector add of the triton-windows README) and the report
around it: pass/fail, timings, versions, GPU class, C compiler, caches, include/libs,
and for a failure the triage entry with its fix."""
from __future__ import annotations

import os
import platform as _platform
import statistics
import sys
import sysconfig
import threading
import time

from . import environment as envmod
from .capture import Captured, native_output
from .triage import classify

DEFAULT_N = 98_432  # the triton tutorial's size: not a multiple of the block, so the mask is exercised

# One self-test at a time in a process: the node (ComfyUI's execution thread) and the Triton
# tab's POST /tritonkit/selftest (an executor thread) can start one together, and native_output
# points the process' file descriptors 1 and 2 at a file: two overlapping redirections restore
# each other's file, and the server's log is lost. (The interpreter's own thread-unsafety is
# handled where kernels are launched: kernels/runtime.INTERPRETER_LOCK.)
_RUN_LOCK = threading.Lock()


def _sync(device_type: str) -> None:
    if device_type == "cuda":
        import torch
        torch.cuda.synchronize()


def pick_device(device: str) -> str:
    import torch
    if device not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device must be 'auto', 'cuda' or 'cpu', not {device!r}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for but torch.cuda.is_available() is False "
                           "(a CPU build of torch, or no NVIDIA driver); pick 'auto' or 'cpu'")
    return device


AST_RACE = "AST constructor recursion depth mismatch"


def run_vector_add(device: str = "auto", n: int = DEFAULT_N, warm_runs: int = 10, seed: int = 0) -> dict:
    """Runs the vector add once cold and ``warm_runs`` times warm; compares with torch. Calls
    from several threads run one after another."""
    with _RUN_LOCK:
        return _run_vector_add(device, n, warm_runs, seed)


def _run_vector_add(device: str, n: int, warm_runs: int, seed: int) -> dict:
    res = {"ok": False, "device": device, "backend": None, "n": n, "max_abs_diff": None,
           "first_call_s": None, "warm_ms": None, "triage": None}
    native = Captured()  # what the C compiler / ptxas print while the first call compiles
    try:
        if n <= 0:
            raise ValueError(f"n must be positive, got {n}")
        import torch
        dev = pick_device(device)
        res["device"] = dev
        from ..kernels import vector_add
        from ..kernels.runtime import cpu_mode
        res["backend"] = "CUDA (Triton JIT)" if dev == "cuda" else cpu_mode()
        g = torch.Generator(device="cpu").manual_seed(seed)
        x = torch.rand(n, generator=g).to(dev)
        y = torch.rand(n, generator=g).to(dev)
        out = torch.full_like(x, float("nan"))  # poisoned: an unwritten element shows up as NaN
        _sync(dev)
        t0 = time.perf_counter()
        with native_output(native):
            try:
                vector_add.add(x, y, out=out)
            except SystemError as exc:
                # CPython 3.11 (python/cpython#106905): an error raised while ast.parse builds its tree
                # (a finalizer the garbage collector runs there, e.g. another thread's SQLite
                # connection in ComfyUI's server) surfaces as this SystemError from Triton's parse of
                # the kernel; nothing is wrong with Triton, and the call once more parses it again
                if AST_RACE not in str(exc):
                    raise
                res["retried_after"] = f"{type(exc).__name__}: {exc}"
                vector_add.add(x, y, out=out)
            _sync(dev)
        res["first_call_s"] = time.perf_counter() - t0
        times = []
        for _ in range(max(1, warm_runs)):
            t0 = time.perf_counter()
            vector_add.add(x, y, out=out)
            _sync(dev)
            times.append(time.perf_counter() - t0)
        res["warm_ms"] = statistics.median(times) * 1e3
        ref = vector_add.add_reference(x, y)
        diff = (out - ref).abs()
        res["max_abs_diff"] = float(diff.max()) if not torch.isnan(diff).any() else float("nan")
        res["ok"] = res["max_abs_diff"] == 0.0
        if not res["ok"]:
            raise AssertionError(f"Triton's vector add differs from torch's by {res['max_abs_diff']} "
                                 f"(NaN means elements were not written)")
    except Exception as exc:  # every failure is a finding of the report
        res["ok"] = False
        res["triage"] = classify(exc, native_output=native.text)
    return res


def collect_environment(python_dir: str | None = None) -> dict:
    """Versions, GPU, compiler, caches and include/libs, without running any kernel."""
    rep: dict = {}
    exe_dir = python_dir or os.path.dirname(sys.executable)
    ver = sys.version_info[:2]
    kind = envmod.python_kind(exe_dir if sys.platform == "win32" else sys.prefix,
                              prefix=sys.prefix, base_prefix=sys.base_prefix)
    base_dir = envmod.base_python_dir(sys.prefix, sys.base_prefix)
    rep["python"] = {"version": _platform.python_version(), "executable": sys.executable, "kind": kind,
                     "folder": base_dir, "platform": sys.platform}
    rep["include_libs"] = envmod.include_libs_status(base_dir, ver, include_dir=sysconfig.get_paths().get("include"))
    try:
        import torch
        rep["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                        "cuda_available": torch.cuda.is_available()}
    except Exception as exc:
        rep["torch"] = {"version": None, "error": f"{type(exc).__name__}: {exc}"}
    dists = envmod.triton_distributions()
    triton_dir, triton_version, triton_error = None, None, None
    try:
        import triton
        triton_dir = os.path.dirname(triton.__file__) if getattr(triton, "__file__", None) else None
        triton_version = getattr(triton, "__version__", None)
        if not hasattr(triton, "jit"):
            raise ImportError(f"triton is shadowed: the module at {getattr(triton, '__file__', '?')} is not the "
                              "Triton package")
    except Exception as exc:
        triton_error = classify(exc)
    rep["triton"] = {"version": triton_version, "module_dir": triton_dir, "distributions": dists,
                     "match": envmod.triton_match(rep["torch"].get("version"), dists,
                                                 declared=envmod.torch_declared_triton()),
                     "import_error": triton_error}
    cc = None
    gpu = {"name": None, "cc": None}
    if rep["torch"].get("cuda_available"):
        import torch
        cc = torch.cuda.get_device_capability(0)
        gpu = {"name": torch.cuda.get_device_name(0), "cc": f"{cc[0]}.{cc[1]}"}
    gpu.update(envmod.gpu_class(cc))
    gpu["tensor_core_dot"] = _tensor_core_dot(cc) if triton_error is None else None
    rep["gpu"] = gpu
    rep["simulation"] = envmod.simulation(cc=cc)
    rep["c_compiler"] = envmod.c_compiler(triton_dir=triton_dir)
    rep["cuda_path"] = os.environ.get("CUDA_PATH")
    rep["ptxas"] = envmod.ptxas_in_use(triton_dir=triton_dir)
    dirs = envmod.cache_dirs()
    rep["caches"] = {name: {"path": p, "exists": os.path.isdir(p),
                            "bytes": envmod.folder_size(p) if os.path.isdir(p) else 0} for name, p in dirs.items()}
    return rep


def _tensor_core_dot(cc) -> bool | None:
    """Whether the installed Triton runs tl.dot on this GPU's tensor cores (kernels/arch_probe.py:
    not below sm80 from Triton 3.3 on); None without a GPU."""
    if cc is None:
        return None
    try:
        from ..kernels.arch_probe import dot_has_tensor_cores
        return dot_has_tensor_cores(cc[0] * 10 + cc[1])
    except Exception:  # noqa: BLE001 - the report must not fail on it
        return None


def full_report(device: str = "auto", n: int = DEFAULT_N, python_dir: str | None = None) -> dict:
    rep = collect_environment(python_dir)
    rep["selftest"] = run_vector_add(device=device, n=n)
    rep["ok"] = bool(rep["selftest"]["ok"])
    return rep


def format_report(rep: dict) -> str:
    st = rep.get("selftest") or {}
    lines = []
    if st:
        status = "PASS" if st.get("ok") else "FAIL"
        lines.append(f"Triton self-test: {status} (vector add, n={st.get('n')}, device={st.get('device')}, "
                     f"{st.get('backend') or 'no backend'})")
        if st.get("max_abs_diff") is not None:
            lines.append(f"  max abs diff vs torch: {st['max_abs_diff']:g}")
        if st.get("first_call_s") is not None:
            warm = f"{st['warm_ms']:.3f} ms" if st.get("warm_ms") is not None else "not measured (failed)"
            lines.append(f"  cold (first call, compile or cache load): {st['first_call_s'] * 1e3:.1f} ms; "
                         f"warm: {warm}")
        if st.get("retried_after"):
            lines.append(f"  the first call ran twice: CPython's ast.parse raised {st['retried_after']} "
                         "(python/cpython#106905, an error in a finalizer; not Triton's)")
    py = rep["python"]
    lines.append(f"Python {py['version']} ({py['kind']}) at {py['executable']}")
    il = rep["include_libs"]
    lines.append(f"  include/Python.h: {'yes' if il['include'] else 'MISSING'}"
                 + (f"; libs: {'yes' if il['libs'] else 'MISSING'}" if il.get("libs_file") else ""))
    t = rep["torch"]
    lines.append(f"torch {t.get('version')} (CUDA {t.get('cuda')}, available: {t.get('cuda_available')})"
                 if t.get("version") else f"torch: {t.get('error')}")
    tr = rep["triton"]
    dists = ", ".join(f"{k} {v}" for k, v in tr["distributions"].items()) or "none installed"
    m = tr["match"]
    lines.append(f"Triton {tr.get('version')} [{dists}]; expected for this torch: {m.get('expected')}: "
                 + ("matches" if m["ok"] else "; ".join(m["problems"])))
    g = rep["gpu"]
    lines.append(f"GPU: {g.get('name') or 'none'}" + (f" (sm{g['cc'].replace('.', '')})" if g.get("cc") else "")
                 + f" - {g['label']}; fp8 native: {'yes' if g['fp8_native'] else 'no'}; "
                 f"bf16: {'yes' if g['bf16'] else 'no'}; Triton: {g['triton']}")
    if g.get("tensor_core_dot") is False:
        lines.append(f"  tl.dot on this GPU: FMA units, no tensor cores (Triton {tr.get('version')}; Triton 3.3+ "
                     "dropped MMA below sm80): the pack's attention and fused fp8 linear stay off, ComfyUI's "
                     "paths serve it; the fp8 decode still runs")
    sim = rep.get("simulation") or {}
    if sim.get("forced_arch") or sim.get("mma_v3_disabled"):
        lines.append(f"Simulated GPU: TRITONKIT_FORCE_ARCH={sim.get('forced_arch') or '(not set)'}; Triton's tl.dot "
                     + ("without wgmma (DISABLE_MMA_V3)" if sim.get("mma_v3_disabled") else "as this GPU's own"))
        if sim.get("note"):
            lines.append(f"  {sim['note']}")
    c = rep["c_compiler"]
    lines.append(f"C compiler: {c['kind'] or 'none'}" + (f" ({c['path']})" if c.get("path") else "")
                 + (f" - {c['note']}" if c.get("note") else ""))
    lines.append(f"CUDA_PATH: {rep.get('cuda_path') or '(not set; the bundled/pip toolchain is used)'}")
    px = rep.get("ptxas") or {}
    if px.get("path"):
        lines.append(f"ptxas: {px['path']} ({px['source']}" + ("" if px.get("exists") else "; MISSING") + ")")
    for name, cinfo in rep["caches"].items():
        size = envmod.human_bytes(cinfo["bytes"]) if cinfo["exists"] else "absent"
        lines.append(f"{name} cache: {cinfo['path']} ({size})")
    tri = st.get("triage") or tr.get("import_error")
    if tri:
        lines.append("")
        lines.append(f"Problem: {tri['title']} [{tri['key']}]")
        lines.append(f"  error: {tri['error']}")
        lines.append(f"  fix: {tri['fix']}")
        decisive = tri.get("decisive") or []
        if tri["key"] == "unknown" and decisive:
            lines.append("  decisive lines:")
            lines.extend("    " + ln for ln in decisive)
        elif tri.get("compiler_output") and decisive:
            lines.append("  the compiler said:")
            lines.extend("    " + ln for ln in decisive[:3])
        if tri["key"] == "unknown":
            lines.append("  traceback:")
            lines.extend("    " + ln for ln in tri["traceback"].rstrip().splitlines())
    return "\n".join(lines)
