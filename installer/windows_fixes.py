"""Step 7: the ten hand-patches of Triton for Windows (seed 003), recognised instead of applied.

Those errors (ldconfig, -fPIC, libcuda.so.1, cuda.h, linker 1104/1120/1181, dlopen, posix_memalign,
grep, ptxas path, WinError 32) all come from running the upstream Linux ``triton`` package on
Windows. Patching site-packages by hand breaks on every reinstall and drifts from the Triton
version; the matching ``triton-windows`` wheel has all of it built in. This module recognises the
situation (upstream ``triton`` on Windows, or a site-packages already hand-patched) and an error
text from it, and says what to do instead."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .common import StepResult, find_package_dir


@dataclass(frozen=True)
class HandFix:
    number: int
    key: str
    title: str
    symptoms: tuple[str, ...]   # regular expressions over an error text
    files: tuple[str, ...]      # files the guide edits, relative to the triton package folder
    markers: tuple[str, ...]    # text the guide's patch leaves in those files (its own comments/messages)
    code_markers: tuple[str, ...] = ()  # Windows code that upstream 'triton' never contains (checked only there)


FIXES: tuple[HandFix, ...] = (
    HandFix(1, "ldconfig", "ldconfig is Linux-only (CUDA library search)",
            (r"ldconfig",), ("backends/nvidia/driver.py",),
            ("# Windows-compatible CUDA library detection", "we don't check for libcuda.so.1")),
    HandFix(2, "fpic", "-fPIC is not a Windows compiler flag",
            (r"-fPIC",), ("runtime/build.py",),
            ("# -fPIC is not supported on Windows MSVC", "ensure we compile for 64-bit (x64) architecture")),
    HandFix(3, "libcuda-so", "libcuda.so.1 is the Linux name of the CUDA driver (nvcuda.dll on Windows)",
            (r"libcuda\.so",), ("backends/nvidia/driver.py",),
            ("# Windows uses nvcuda.dll, Linux uses libcuda.so.1",), ("libraries = ['nvcuda']",)),
    HandFix(4, "cuda-h", "cuda.h not found when building cuda_utils",
            (r"cuda\.h'? (file )?not found", r"cannot open (include|source) file:? '?cuda\.h"),
            ("backends/nvidia/driver.py",), ("def cuda_include_dirs(",)),
    HandFix(5, "linker", "linker errors 1104 / 1120 / 1181 (python3XY.lib, cuda.lib, unresolved symbols)",
            (r"LNK11(04|20|81)", r"\berror (1104|1120|1181)\b"), ("runtime/build.py", "backends/nvidia/driver.py"),
            ("# On Windows, add Python library directory for linking",
             "# On Windows, link against cuda.lib (import library for nvcuda.dll)")),
    HandFix(6, "dlopen", "dlopen/dlsym don't exist on Windows (LoadLibrary/GetProcAddress)",
            (r"\bdlopen\b", r"\bdlsym\b", r"dlfcn\.h"), ("backends/nvidia/driver.c",),
            ("Failed to open nvcuda.dll. Error: %lu",)),
    HandFix(7, "posix-memalign", "posix_memalign doesn't exist on Windows (_aligned_malloc)",
            (r"posix_memalign",), ("backends/nvidia/driver.c",), (), ("_aligned_malloc(size, alignment)",)),
    HandFix(8, "grep", "the grep command doesn't exist on Windows",
            (r"No such file or directory: '?grep'?", r"WinError 2\].*grep", r"'grep' is not recognized"),
            ("tools/build_extern.py",), ("# Windows-compatible: use Python file reading instead of grep",)),
    HandFix(9, "ptxas", "ptxas.exe / ptxas-blackwell.exe not found",
            (r"Cannot find ptxas(-blackwell)?(\.exe)?",), ("backends/nvidia/compiler.py", "knobs.py"),
            ("# ptxas-blackwell is only needed for very specific cases",
             "# On Windows, also check CUDA installation paths if default path doesn't exist")),
    HandFix(10, "winerror-32", "PermissionError [WinError 32] deleting temporary PTX files",
            (r"WinError 32",), ("backends/nvidia/compiler.py",),
            ("# On Windows, skip deletion - files may be locked",)),
)


def classify(error_text: str) -> HandFix | None:
    """The hand-fix whose error this is (first match), or None."""
    for fix in FIXES:
        if any(re.search(p, error_text or "", re.IGNORECASE) for p in fix.symptoms):
            return fix
    return None


def find_triton_dir(site_packages: list[str]) -> str | None:
    return find_package_dir(site_packages, "triton")


def hand_patches(triton_dir: str, upstream: bool) -> list[HandFix]:
    """The fixes of the guide found applied in ``triton_dir``; ``upstream``: the package is the
    plain 'triton' distribution (where any Windows code is a hand-patch)."""
    found = []
    cache: dict[str, str] = {}
    for fix in FIXES:
        markers = fix.markers + (fix.code_markers if upstream else ())
        if not markers:
            continue
        for rel in fix.files:
            if rel not in cache:
                try:
                    with open(os.path.join(triton_dir, *rel.split("/")), encoding="utf-8", errors="replace") as f:
                        cache[rel] = f.read()
                except OSError:
                    cache[rel] = ""
            if any(m in cache[rel] for m in markers):
                found.append(fix)
                break
    return found


def advice(want: tuple[int, int] | None) -> str:
    spec = f"triton-windows>={want[0]}.{want[1]},<{want[0]}.{want[1] + 1}" if want else "triton-windows"
    return (f"uninstall 'triton' and install the matching triton-windows: python -m pip uninstall -y triton, then "
            f"python -m pip install --force-reinstall \"{spec}\" (install.py does this without --no-pip)")


def step(platform: str, site_packages: list[str], dists: dict[str, str],
         want: tuple[int, int] | None = None) -> StepResult:
    if platform != "win32":
        return StepResult("windows fixes", "skipped", "not Windows: the ten Windows hand-patches don't apply")
    tdir = find_triton_dir(site_packages)
    upstream = "triton" in dists
    patched = hand_patches(tdir, upstream) if tdir else []
    details = {"triton_dir": tdir, "upstream_triton": dists.get("triton"),
               "hand_patched": [f"{f.number}. {f.title}" for f in patched]}
    numbers = ", ".join(str(f.number) for f in patched)
    if upstream:
        msg = (f"the upstream Linux 'triton' {dists['triton']} is installed on Windows: it fails with the errors "
               "the hand-patch guide patches (ldconfig, -fPIC, libcuda.so.1, cuda.h, linker 1104/1120/1181, dlopen, "
               "posix_memalign, grep, ptxas path, WinError 32)")
        if patched:
            msg += f"; its site-packages copy is hand-patched (fixes {numbers} found)"
        return StepResult("windows fixes", "failed", msg, advice(want), details)
    if patched:
        return StepResult("windows fixes", "failed", f"triton-windows {dists.get('triton-windows', '?')} in "
                          f"{tdir} was edited by hand (fixes {numbers} of the guide found); edits are lost on "
                          "reinstall and can break it", advice(want), details)
    if tdir is None:
        return StepResult("windows fixes", "ok", "no Triton package to check (none installed)", None, details)
    return StepResult("windows fixes", "ok", "the Triton package is triton-windows without hand-patches: none of "
                      "the guide's ten fixes is needed", None, details)
