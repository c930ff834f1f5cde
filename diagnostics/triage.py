"""Maps a Triton failure (exception text, traceback and the C compiler's own output) to the known
cause and its fix.

The entries follow the troubleshooting sections of the triton-windows README and what users'
machines really print (tests/fixtures/triage/corpus.json: real texts from public issue threads,
with the compiler, OS and locale they came from). Patterns match on stable tokens rather than
English sentences, because Windows localises the text around them:

- compiler and linker codes (``C1083``, ``LNK1104``), Python's own ``[WinError N]`` / ``[Errno N]``
  prefixes and its untranslated "DLL load failed while importing <module>";
- file and module names (``Python.h``, ``python3XY.lib``, ``libtriton``, ``cuda_utils``, ``.triton``,
  ``tmp.pid_``, ``ptxas``, ``fp8e4nv``).

Order matters: the first matching entry wins, so an entry comes before every broader one that can
also match its texts (the embedded Python without headers compiles ``cuda_utils.c``, so the
Python-headers entry must come before the stale-``cuda_utils`` one). tests/test_triage_corpus.py
checks that for every text of the corpus the expected entry is the first that matches, and lists
which later entries also match, so a new entry cannot silently take over older texts."""
from __future__ import annotations

import re
import subprocess
import traceback
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TriageEntry:
    key: str
    title: str
    patterns: tuple[str, ...]  # regular expressions, searched case-insensitively, ^/$ per line
    fix: str
    # for the README's troubleshooting table (scripts/gen_troubleshooting.py)
    shows: str = ""    # what the user sees, as markdown
    cause: str = ""    # the cause in a few words
    remedy: str = ""   # the fix in a few words
    _compiled: tuple = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_compiled", tuple(re.compile(p, re.IGNORECASE | re.MULTILINE)
                                                    for p in self.patterns))

    def match(self, text: str) -> str | None:
        """The text of the first pattern match, or None."""
        for rx in self._compiled:
            m = rx.search(text)
            if m:
                return m.group(0)
        return None

    def matches(self, text: str) -> bool:
        return self.match(text) is not None


# a Windows path inside Python's repr of it: any characters but the closing quote
_Q = r"[^'\"\n]*"

ENTRIES: tuple[TriageEntry, ...] = (
    TriageEntry(
        "shadowed-triton",
        "A local 'triton.py' or 'triton' folder hides the Triton package",
        (r"No module named 'triton\.\w+'; 'triton' is not a package",
         r"module 'triton' has no attribute 'jit'",
         r"triton is shadowed"),
        "Rename the file or folder called 'triton' (e.g. a test script named triton.py) in the current "
        "directory or on PYTHONPATH; Python imports it instead of the real package.",
        shows="`No module named 'triton.language'; 'triton' is not a package`",
        cause="a `triton.py` or `triton` folder hides the package", remedy="rename it"),
    TriageEntry(
        "setuptools-impimporter",
        "Outdated setuptools (pkgutil.ImpImporter)",
        (r"module 'pkgutil' has no attribute 'ImpImporter'",),
        "Update setuptools in the same Python: 'python -m ensurepip -U', 'python -m pip install -U pip setuptools' "
        "(use python_embeded\\python.exe -m pip for the portable build).",
        shows="`module 'pkgutil' has no attribute 'ImpImporter'`",
        cause="old setuptools", remedy="`python -m pip install -U pip setuptools`"),
    TriageEntry(
        "triton-ops-missing",
        "An outdated package imports triton.ops (removed in Triton 3.1)",
        (r"No module named 'triton\.ops'",),
        "Some package is outdated, most likely bitsandbytes: 'python -m pip install -U bitsandbytes'.",
        shows="`No module named 'triton.ops'`",
        cause="outdated bitsandbytes", remedy="`python -m pip install -U bitsandbytes`"),
    TriageEntry(
        "triton-torch-mismatch",
        "The Triton package is not the version this torch was built for",
        (r"cannot import name '(AttrsDescriptor|triton_key|ASTSource|get_cuda_stream|CompiledKernel)' "
         r"from 'triton[\w.]*'",
         r"module 'triton[\w.]*' has no attribute '(AttrsDescriptor|triton_key|ASTSource|runtime)'"),
        "torch imports Triton names that this Triton version does not have (for example torch 2.6 expects "
        "Triton 3.2, torch 2.7 Triton 3.3): run 'install.py', which installs the Triton (triton-windows on "
        "Windows) whose major.minor matches your torch, then clear the caches.",
        shows="`cannot import name 'AttrsDescriptor' from 'triton...'`",
        cause="Triton's major.minor is not the one torch expects",
        remedy="`install.py` installs the Triton matched to torch"),
    TriageEntry(
        "python-h-missing",
        "Python headers or import library missing (include/, libs/)",
        (  # the C compiler's own message about the headers, in any compiler's wording or locale:
         r"\bC1083\b[^\n]*\b(?:Python|pyconfig)\.h\b",                     # MSVC: cannot open include file
         r"(?:include file|cannot open|can't open)[^\n]*\b(?:Python|pyconfig)\.h\b",  # TinyCC
         r"error: '?(?:Python|pyconfig)\.h'?:",                                # gcc: '<file>: <strerror>'
         r"\b(?:Python|pyconfig)\.h\b\W{0,3}[^\n]{0,10}(?:No such file|not found|cannot open)",  # gcc, clang
         # the linker's: MSVC LNK1104/LNK1181, GNU ld, TinyCC
         r"LNK11(?:04|81)[^\n]*\bpython3\d*t?(?:_d)?\.lib\b",
         r"cannot find -lpython3",
         r"library '?python3\d*'? not found"),
        "The Python folder lacks include/ (Python.h, pyconfig.h) or libs/ (python3XY.lib): run 'install.py' "
        "(it copies them from a CPython of the same minor version), or 'install.py --include-libs-from "
        "python_3.X.Y_include_libs.zip'; on Linux install the python3-dev (python3-devel) package.",
        shows="`Python.h: No such file`, `C1083 ... Python.h`, `include file 'Python.h' not found`, "
              "`LNK1104: cannot open file 'python3XY.lib'`",
        cause="no `include`/`libs` in the (embedded) Python folder",
        remedy="`install.py` (or `install.py --include-libs-from python_3.X.Y_include_libs.zip`); "
               "Linux: python3-dev"),
    TriageEntry(
        "dll-libtriton",
        "vcredist DLLs too old (DLL load failed while importing libtriton)",
        (r"DLL load failed while importing libtriton",),  # Python's prefix is never localised
        "Install the latest vc_redist.x64.exe (https://aka.ms/vs/17/release/vc_redist.x64.exe), then run "
        "'install.py --fix-vcredist' to copy msvcp140.dll, vcruntime140.dll and vcruntime140_1.dll (>= 14.42) "
        "from System32 into the Python folder.",
        shows="`DLL load failed while importing libtriton` (any language after the colon)",
        cause="vcredist DLLs older than 14.42", remedy="install vc_redist, `install.py --fix-vcredist`"),
    TriageEntry(
        "dll-cuda-utils",
        "Stale cache or wrong include/libs (DLL load failed while importing cuda_utils)",
        (r"DLL load failed while importing (?:cuda_utils|__triton_launcher)",
         r"cuda_utils[\w.-]*\.(?:pyd|so)[^\n]*undefined symbol"),
        "Clear Triton's and TorchInductor's caches ('install.py --clear-caches'), make sure you run the Python you "
        "installed into, and that include/libs in the Python folder come from the same Python minor version.",
        shows="`DLL load failed while importing cuda_utils` (any language after the colon)",
        cause="stale caches, wrong Python, wrong include/libs",
        remedy="`install.py` (checks include/libs, clears caches when the set-up changed), or "
               "`install.py --clear-caches`"),
    TriageEntry(
        "py-ssize-t-clean",
        "Launcher built against another Python (PY_SSIZE_T_CLEAN)",
        (r"PY_SSIZE_T_CLEAN",),
        "A cached launcher was built for another Python or Triton: clear the caches ('install.py --clear-caches'); "
        "if it comes back, the Triton package does not match torch: run 'install.py'.",
        shows="`PY_SSIZE_T_CLEAN macro must be defined`",
        cause="stale caches (or a Triton not matched to torch)", remedy="`install.py --clear-caches`"),
    TriageEntry(
        "cache-file-locked",
        "A cache file is held by another process (ComfyUI, antivirus) or sits on a network share",
        (r"WinError 32\]",
         r"WinError 5\][^\n]*\.(?:pyd|dll|cubin|so)'",
         r"Device or resource busy[^\n]*(?:\.triton|triton|cuda_utils)",
         r"Stale file handle"),
        "Another process has the file open: close every other ComfyUI/Python that uses Triton (a loaded "
        "cuda_utils.pyd cannot be deleted while it runs), and exclude the Triton and Inductor cache folders "
        "from the antivirus' real-time scan. On a network or synced folder (NFS, OneDrive) set TRITON_CACHE_DIR "
        "and TORCHINDUCTOR_CACHE_DIR to a local disk.",
        shows="`[WinError 32]`, `[WinError 5] ... .pyd`, `Device or resource busy`",
        cause="a cache file in use by another process, the antivirus, or a network share",
        remedy="close other ComfyUI windows; exclude the cache folders from the antivirus; local cache folders"),
    TriageEntry(
        "permission-dot-triton",
        "No access to the .triton folder (WinError 5)",
        (r"(?:WinError 5|Errno 13)\][^\n]*[\\/]\.triton\b",
         r"Access is denied[^\n]*[\\/]\.triton\b"),
        "Your user folder's permissions block ~/.triton: fix them, or set TRITON_CACHE_DIR to a folder you own "
        "(install.py sets a short one for the pack).",
        shows="`PermissionError: [WinError 5] ... .triton` (any language)",
        cause="user-folder permissions", remedy="fix them or set `TRITON_CACHE_DIR`"),
    TriageEntry(
        "disk-full",
        "The disk that holds a cache folder is full",
        (r"Errno 28\]", r"No space left on device", r"WinError 112\]", r"\bENOSPC\b"),
        "The disk with the Triton/Inductor caches (or the temp folder) is full: free space there, or move the "
        "caches with TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR to a disk with room; 'install.py "
        "--clear-caches' empties the old ones.",
        shows="`[Errno 28] No space left on device`, `[WinError 112]`",
        cause="the disk of the cache or temp folder is full",
        remedy="free space, or move the caches; `install.py --clear-caches`"),
    TriageEntry(
        "fp8e4nv-arch",
        "fp8 e4m3fn is not supported by Triton below sm89",
        (r"fp8e4nv[^\n]*not supported", r"fp8e4nv data type is not supported"),
        "Official Triton rejects float8_e4m3fn below sm89 (RTX 30xx and older). Put the 'Triton fp8 Fallback' node "
        "after the model loader (it decodes fp8 from raw bytes), or use triton-windows >= 3.5.0.post21.",
        shows="`fp8e4nv data type is not supported on CUDA arch < 89`, `type fp8e4nv not supported`",
        cause="fp8 e4m3fn on RTX 30xx and older", remedy="the Triton fp8 Fallback node"),
    TriageEntry(
        "cpu-tensor-pointer",
        "A CPU tensor reached a Triton kernel (model offloading)",
        (r"Pointer argument \(at \d+\) cannot be accessed from Triton",),
        "Part of the model was offloaded to the CPU while compiled: start ComfyUI with --gpu-only (or --highvram), "
        "or use this pack's nodes, which fall back to torch for CPU tensors.",
        shows="`Pointer argument ... cannot be accessed from Triton (cpu tensor?)`",
        cause="model offloading under compile", remedy="`--gpu-only`, or this pack's nodes"),
    TriageEntry(
        "winerror-183",
        "os.rename race in torch < 2.6 (WinError 183)",
        (r"WinError 183\]",),
        "Fixed in PyTorch 2.6: upgrade torch (and then the matching triton-windows with install.py).",
        shows="`FileExistsError: [WinError 183]`", cause="torch < 2.6", remedy="upgrade torch"),
    TriageEntry(
        "long-paths",
        "Windows 260-character path limit",
        (r"WinError 206\]", r"filename or extension is too long",
         # Triton's cache writes through tmp.pid_<pid>_<uuid> folders: a missing file there is the path limit
         r"(?:Errno 2|WinError 3)\][^\n]*[\\/]+tmp\.pid_",
         r"No such file or directory:[^\n]*torchinductor_\S*[\\/]+triton[\\/]"),
        "Enable Windows long paths (LongPathsEnabled=1 in the registry, then reboot); install.py also sets a short "
        "cache folder for the pack.",
        shows="`[WinError 206]` / `No such file or directory: '...\\tmp.pid_...'`",
        cause="Windows 260-character limit",
        remedy="enable long paths; `install.py` says how and gives the pack short cache folders"),
    TriageEntry(
        "torch-cpu-only",
        "torch is a CPU-only build",
        (r"Torch not compiled with CUDA enabled",),
        "This torch has no CUDA (a CPU-only wheel, often pulled in by another package's requirements): reinstall "
        "the CUDA build into the same Python, e.g. 'python -m pip install --force-reinstall torch torchvision "
        "torchaudio --index-url https://download.pytorch.org/whl/cu128' (pick the cuXXX your driver supports), "
        "then run 'install.py' again for the matching Triton. On a Mac there is no CUDA: Triton's GPU path "
        "does not apply.",
        shows="`Torch not compiled with CUDA enabled`", cause="a CPU-only torch wheel",
        remedy="reinstall torch from the CUDA index, then `install.py`"),
    TriageEntry(
        "cuda-driver-too-old",
        "The NVIDIA driver is older than the CUDA that torch/Triton were built with",
        (r"CUDA driver version is insufficient",
         r"cudaErrorInsufficientDriver",
         r"provided PTX was compiled with an unsupported toolchain",
         r"CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
        "Update the NVIDIA driver (the CUDA version nvidia-smi shows must be at least torch.version.cuda and the "
        "CUDA of the Triton build), or install a torch built for an older CUDA and the Triton matched to it.",
        shows="`CUDA driver version is insufficient`, `PTX was compiled with an unsupported toolchain`",
        cause="NVIDIA driver older than torch's/Triton's CUDA", remedy="update the driver"),
    TriageEntry(
        "ptxas-too-old",
        "The ptxas Triton ran is older than the PTX it generates or the GPU",
        (r"Unsupported \.version \d+\.\d+; current version is",
         r"Value 'sm_\d+\w?' is not defined for option 'gpu-name'",
         r"ptxas[^\n]*fatal[^\n]*(?:Unsupported|not defined)"),
        "Triton used an older ptxas than the one it ships (TRITON_PTXAS_PATH, or CUDA_PATH's bin): unset "
        "TRITON_PTXAS_PATH, or update the CUDA toolkit at CUDA_PATH, or reinstall the Triton package with "
        "'install.py' (triton-windows bundles a matching ptxas). Where the pack set TRITON_PTXAS_PATH to "
        "torch's own ptxas (as torch.compile does), TRITONKIT_PIN_PTXAS=0 leaves Triton's.",
        shows="`ptxas ... Unsupported .version 8.6; current version is '8.5'`",
        cause="an old ptxas (CUDA_PATH or TRITON_PTXAS_PATH)",
        remedy="unset `TRITON_PTXAS_PATH`, update CUDA, or `install.py`"),
    TriageEntry(
        "ptxas-missing",
        "Triton cannot find ptxas",
        (r"Cannot find ptxas", r"ptxas(?:\.exe)?'?:? (?:No such file|not found)"),
        "Reinstall the Triton package with 'install.py' (triton-windows >= 3.2 bundles ptxas.exe), or point "
        "TRITON_PTXAS_PATH to ptxas from a CUDA toolkit at least as new as Triton's CUDA.",
        shows="`Cannot find ptxas.exe`", cause="an incomplete or hand-patched Triton",
        remedy="`install.py`, or set `TRITON_PTXAS_PATH`"),
    TriageEntry(
        "ptxas-failed",
        "ptxas failed without saying why",
        (r"`?ptxas`? failed with error code", r"PTXAS error:"),
        "ptxas itself failed. Its own lines (above, or in 'install.py --check') say why; with no lines, an antivirus "
        "blocking ptxas.exe in the temp folder or a ptxas from an older CUDA (TRITON_PTXAS_PATH, CUDA_PATH) are the "
        "usual causes: allow it, unset TRITON_PTXAS_PATH, or reinstall Triton with 'install.py'.",
        shows="`` `ptxas` failed with error code ``", cause="ptxas blocked or mismatched",
        remedy="`install.py --check` shows ptxas' output"),
    TriageEntry(
        "linux-triton-on-windows",
        "The upstream Linux 'triton' (or a hand-patched copy) runs on Windows",
        (r"Triton only support CUDA 10\.0 or higher",
         r"/sbin/ldconfig", r"\bldconfig\b[^\n]*(?:WinError 2|not found|No such file)",
         r"libcuda\.so[^\n]*(?:cannot found|not found)",
         r"\bdlfcn\.h\b", r"undeclared function '(?:dlopen|dlsym|posix_memalign)'"),
        "On Windows this is the Linux 'triton' package (or one edited by hand): 'install.py' replaces it with the "
        "triton-windows wheel matched to torch. On Linux, 'libcuda.so ... not found' means the NVIDIA driver is "
        "not visible (a container without GPU access, or WSL without /usr/lib/wsl/lib).",
        shows="`ldconfig`, `libcuda.so`, `dlfcn.h`, `posix_memalign`, "
              "`Triton only support CUDA 10.0 or higher`",
        cause="the upstream Linux `triton` on Windows (or hand-patches of it)",
        remedy="don't patch site-packages: `install.py` replaces it with the matching `triton-windows`"),
    TriageEntry(
        "cuda-h-missing",
        "cuda.h not found when building Triton's launcher",
        (r"\bcuda\.h\b\W{0,3}[^\n]{0,10}(?:No such file|not found|cannot open)",
         r"\bC1083\b[^\n]*\bcuda\.h\b", r"error: '?cuda\.h'?:",
         r"(?:include file|cannot open|can't open)[^\n]*\bcuda\.h\b"),
        "Triton ships cuda.h in triton/backends/nvidia/include: reinstall the Triton package with 'install.py' "
        "(triton-windows on Windows); don't point CUDA_PATH at a partial toolkit.",
        shows="`cuda.h: No such file or directory`", cause="an incomplete Triton package or CUDA_PATH",
        remedy="`install.py`"),
    TriageEntry(
        "wrong-cc",
        "The CC environment variable does not name one C compiler",
        (r"cc_cmd: \['[^']*;'",                              # CC holds a ;-separated list
         r"\[\s*'[A-Za-z]:[\\/]" + _Q + r"[A-Za-z]:[\\/]" + _Q + r"cl\.exe'",  # a path pasted twice
         r"(?s)_execute_child.{0,400}WinError 5\]\s*[^'\n]*$",  # CreateProcess on a folder: access denied
         r"CC environment variable[^\n]*(?:not found|does not exist)"),
        "CC must be the full path of one compiler executable (e.g. ...\\Hostx64\\x64\\cl.exe), not a folder or "
        "a list: fix it, or remove CC to let triton-windows use its bundled TinyCC.",
        shows="`cc_cmd: ['...cl.exe;...']`, `[WinError 2]`/`[WinError 5]` starting the compiler",
        cause="`CC` set to a folder, a list or a stale path", remedy="fix or remove `CC`"),
    TriageEntry(
        "c-compile-failed",
        "The C compiler failed building Triton's launcher",
        (r"Failed to compile\. cc_cmd",
         r"CalledProcessError: Command '\['" + _Q + r"(?:tcc|cl|gcc|clang|cc)(?:\.exe)?'"
         r"[^\n]*(?:cuda_utils|__triton_launcher|main)\.c'"),
        "Triton's C launcher did not compile. The compiler's own lines (shown first) say why; the most common cause "
        "is missing include/libs in the Python folder: run 'install.py --check', which captures the compiler's "
        "output, and 'install.py' to fix include/libs.",
        shows="`Failed to compile. cc_cmd`, `CalledProcessError` for tcc/cl/gcc",
        cause="the launcher's C compile failed for another reason",
        remedy="`install.py --check` shows the compiler's output"),
    TriageEntry(
        "no-driver",
        "No GPU driver visible to Triton",
        (r"\b0 active drivers", r"no active driver"),
        "Triton found no usable GPU backend. On a machine without an NVIDIA GPU the self-test runs on the CPU through "
        "the Triton interpreter; otherwise update the NVIDIA driver, check that torch.cuda.is_available() is True, "
        "and that the Triton package matches torch ('install.py').",
        shows="`0 active drivers`", cause="no NVIDIA driver (or a Triton not matched to torch)",
        remedy="update the driver; `install.py`"),
    TriageEntry(
        "no-c-compiler",
        "No C compiler for Triton's launcher",
        (r"Failed to find C compiler", r"Please specify via CC environment variable"),
        "Triton builds a small C launcher: install triton-windows >= 3.2.0.post13 (bundles TinyCC) on Windows, or "
        "gcc on Linux, or point CC to MSVC/GCC/Clang.",
        shows="`Failed to find C compiler`", cause="no C compiler",
        remedy="`install.py` (triton-windows bundles TinyCC); Linux: gcc"),
    TriageEntry(
        "triton-missing",
        "Triton is not installed",
        (r"No module named 'triton'\s*$",),
        "Run 'install.py' in this pack's folder with the Python that runs ComfyUI: it installs the Triton "
        "package that matches your torch (triton-windows on Windows).",
        shows="`No module named 'triton'`",
        cause="missing or wrong Triton package", remedy="`install.py` installs `triton-windows` matched to torch"),
)

UNKNOWN = TriageEntry(
    "unknown", "Unknown error", (), "This failure is not one of the known ones: the decisive lines and the "
    "traceback below say where it came from. Please report it with the full report.")


def classify_text(text: str, entries: tuple[TriageEntry, ...] = ENTRIES) -> TriageEntry:
    for entry in entries:
        if entry.matches(text):
            return entry
    return UNKNOWN


def all_matches(text: str, entries: tuple[TriageEntry, ...] = ENTRIES) -> list[tuple[str, str]]:
    """Every entry that matches ``text``, in table order, with what it matched."""
    out = []
    for entry in entries:
        m = entry.match(text)
        if m is not None:
            out.append((entry.key, m))
    return out


_STRONG = re.compile(  # what compilers, linkers and the OS say: these lead
    r"\bfatal\b|\berror\b\s*:|\berror [A-Z]*\d+|\b[CL]\d{4}\b|\bLNK\d{4}\b|\bWinError \d+|\bErrno \d+"
    r"|\bnot found\b|\bno such file\b|\bcannot open\b|\bDLL load failed",
    re.IGNORECASE)
_DECISIVE = re.compile(
    r"\b(?:error|fatal|failed|denied|cannot|not found|no such file|not supported|insufficient)\b"
    r"|^\s*[\w.]+(?:Error|Exception|Warning)\b",
    re.IGNORECASE)
_FRAME = re.compile(r'^\s*File "|^\s*[\^~]+\s*$|^Traceback \(most recent call last\)')


def decisive_lines(text: str, limit: int = 10) -> list[str]:
    """The lines that say what went wrong, without traceback frames, deduplicated, at most ``limit``:
    first what the compiler, linker or OS said (error codes, "fatal", "error:"), then the exception
    lines, each group in the order of the text."""
    strong, weak, seen = [], [], set()
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line in seen or _FRAME.search(raw) or not (_STRONG.search(line) or _DECISIVE.search(line)):
            continue
        seen.add(line)
        (strong if _STRONG.search(line) else weak).append(line if len(line) <= 400 else line[:400] + " ...")
    return (strong + weak)[:limit]


def process_output(exc: BaseException) -> str:
    """What subprocesses in the exception chain printed, where Python kept it
    (``CalledProcessError.output``/``.stderr``, e.g. ptxas' or a compiler's)."""
    parts, seen = [], set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, subprocess.CalledProcessError):
            for data in (e.output, e.stderr):
                if data:
                    parts.append(data.decode(errors="replace") if isinstance(data, bytes) else str(data))
        e = e.__cause__ or e.__context__
    return "\n".join(p.rstrip() for p in parts)


def classify(exc: BaseException, native_output: str = "") -> dict:
    """Triage of an exception: the matching entry, the message, the full traceback, the output the
    C compiler / ptxas printed (``native_output``: captured from the process' stdout/stderr, see
    diagnostics.capture; plus what the exception chain kept), and the decisive lines."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    compiler_out = "\n".join(x for x in (native_output.strip(), process_output(exc).strip()) if x)
    text = f"{compiler_out}\n{type(exc).__name__}: {exc}\n{tb}"
    entry = classify_text(text)
    return {"key": entry.key, "title": entry.title, "fix": entry.fix, "patterns": list(entry.patterns),
            "error": f"{type(exc).__name__}: {exc}", "traceback": tb, "compiler_output": compiler_out,
            "decisive": decisive_lines(text)}
