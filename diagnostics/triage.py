"""Maps a Triton failure (exception text + traceback) to the known cause and its fix.

Entries follow the troubleshooting sections of the triton-windows README and the
issues users hit in ComfyUI. Order matters: the first matching entry wins, so the
more specific patterns come first."""
from __future__ import annotations

import re
import traceback
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class TriageEntry:
    key: str
    title: str
    patterns: tuple[str, ...]  # regular expressions, searched case-insensitively
    fix: str

    def matches(self, text: str) -> bool:
        return any(re.search(p, text, re.IGNORECASE | re.MULTILINE) for p in self.patterns)


ENTRIES: tuple[TriageEntry, ...] = (
    TriageEntry(
        "shadowed-triton",
        "A local 'triton.py' or 'triton' folder hides the Triton package",
        (r"No module named 'triton\.\w+'; 'triton' is not a package",
         r"module 'triton' has no attribute 'jit'",
         r"triton is shadowed"),
        "Rename the file or folder called 'triton' (e.g. a test script named triton.py) in the current "
        "directory or on PYTHONPATH; Python imports it instead of the real package.",
    ),
    TriageEntry(
        "setuptools-impimporter",
        "Outdated setuptools (pkgutil.ImpImporter)",
        (r"module 'pkgutil' has no attribute 'ImpImporter'",),
        "Update setuptools in the same Python: 'python -m ensurepip -U', 'python -m pip install -U pip setuptools' "
        "(use python_embeded\\python.exe -m pip for the portable build).",
    ),
    TriageEntry(
        "dll-libtriton",
        "vcredist DLLs too old (DLL load failed while importing libtriton)",
        (r"DLL load failed while importing libtriton",),
        "Install the latest vc_redist.x64.exe (https://aka.ms/vs/17/release/vc_redist.x64.exe), then run "
        "'install.py --fix-vcredist' to copy msvcp140.dll, vcruntime140.dll and vcruntime140_1.dll (>= 14.42) "
        "from System32 into the Python folder.",
    ),
    TriageEntry(
        "dll-cuda-utils",
        "Stale cache or wrong include/libs (DLL load failed while importing cuda_utils)",
        (r"DLL load failed while importing cuda_utils", r"cuda_utils.*(cannot open|undefined symbol|ImportError)"),
        "Clear Triton's and TorchInductor's caches ('install.py --clear-caches'), make sure you run the Python you "
        "installed into, and that include/libs in the Python folder come from the same Python minor version.",
    ),
    TriageEntry(
        "py-ssize-t-clean",
        "Launcher built against another Python (PY_SSIZE_T_CLEAN)",
        (r"PY_SSIZE_T_CLEAN",),
        "A cached launcher was built for another Python: clear the caches ('install.py --clear-caches').",
    ),
    TriageEntry(
        "permission-dot-triton",
        "No access to the .triton folder (WinError 5)",
        (r"WinError 5\].*\.triton", r"Permission(Error)?.*[\\/]\.triton", r"Access is denied.*\.triton"),
        "Your user folder's permissions block ~/.triton: fix them, or set TRITON_CACHE_DIR to a folder you own "
        "(install.py sets a short one for the pack).",
    ),
    TriageEntry(
        "fp8e4nv-arch",
        "fp8 e4m3fn is not supported by Triton below sm89",
        (r"fp8e4nv.*not supported", r"type fp8e4nv not supported", r"fp8e4nv data type is not supported"),
        "Official Triton rejects float8_e4m3fn below sm89 (RTX 30xx and older). Put the 'Triton fp8 Fallback' node "
        "after the model loader (it decodes fp8 from raw bytes), or use triton-windows >= 3.5.0.post21.",
    ),
    TriageEntry(
        "cpu-tensor-pointer",
        "A CPU tensor reached a Triton kernel (model offloading)",
        (r"Pointer argument \(at \d+\) cannot be accessed from Triton \(cpu tensor\?\)", r"cannot be accessed from Triton \(cpu tensor"),
        "Part of the model was offloaded to the CPU while compiled: start ComfyUI with --gpu-only (or --highvram), "
        "or use this pack's nodes, which fall back to torch for CPU tensors.",
    ),
    TriageEntry(
        "triton-ops-missing",
        "An outdated package imports triton.ops (removed in Triton 3.1)",
        (r"No module named 'triton\.ops'",),
        "Some package is outdated, most likely bitsandbytes: 'python -m pip install -U bitsandbytes'.",
    ),
    TriageEntry(
        "winerror-183",
        "os.rename race in torch < 2.6 (WinError 183)",
        (r"FileExistsError.*WinError 183", r"WinError 183"),
        "Fixed in PyTorch 2.6: upgrade torch (and then the matching triton-windows with install.py).",
    ),
    TriageEntry(
        "long-paths",
        "Windows 260-character path limit",
        (r"WinError 206", r"filename or extension is too long",
         r"No such file or directory:.*torchinductor_\S*[\\/]+triton[\\/]"),
        "Enable Windows long paths (LongPathsEnabled=1 in the registry, then reboot); install.py also sets a short "
        "cache folder for the pack.",
    ),
    TriageEntry(
        "no-driver",
        "No GPU driver visible to Triton",
        (r"0 active drivers", r"no active driver"),
        "Triton found no usable GPU backend. On a machine without an NVIDIA GPU the self-test runs on the CPU through "
        "the Triton interpreter; otherwise update the NVIDIA driver and check that torch.cuda.is_available() is True.",
    ),
    TriageEntry(
        "no-c-compiler",
        "No C compiler for Triton's launcher",
        (r"Failed to find C compiler", r"Please specify via CC environment variable"),
        "Triton builds a small C launcher: install triton-windows >= 3.2.0.post13 (bundles TinyCC) on Windows, or "
        "gcc on Linux, or point CC to MSVC/GCC/Clang.",
    ),
    TriageEntry(
        "python-h-missing",
        "Python headers missing (include/libs)",
        (r"Python\.h.*(No such file|cannot open)", r"cannot open file 'python3\d+\.lib'", r"LNK1104.*python3\d+\.lib"),
        "The Python folder lacks include/ and libs/: run 'install.py' (it copies them from a matching CPython), "
        "or on Linux install the python3-dev package.",
    ),
    TriageEntry(
        "triton-missing",
        "Triton is not installed",
        (r"No module named 'triton'$", r"No module named 'triton'\s*$"),
        "Run 'install.py' in this pack's folder with the Python that runs ComfyUI: it installs the Triton "
        "package that matches your torch (triton-windows on Windows).",
    ),
)

UNKNOWN = TriageEntry(
    "unknown", "Unknown error", (), "This failure is not one of the known ones: the traceback below says where it came "
    "from. Please report it with the full report.")


def classify_text(text: str) -> TriageEntry:
    for entry in ENTRIES:
        if entry.matches(text):
            return entry
    return UNKNOWN


def classify(exc: BaseException) -> dict:
    """Triage of an exception: the matching entry, the message and the full traceback."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    entry = classify_text(f"{type(exc).__name__}: {exc}\n{tb}")
    return {**asdict(entry), "patterns": list(entry.patterns), "error": f"{type(exc).__name__}: {exc}", "traceback": tb}
