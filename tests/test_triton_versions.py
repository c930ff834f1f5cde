"""The pack's kernels compile with every Triton that a current torch release pins, not only the venv's.

Users run the Triton their torch pins (install.py matches it): torch 2.6 takes Triton 3.2, 2.7 3.3, 2.8 3.4,
2.9 3.5, 2.10-2.11 3.6, 2.12-2.13 3.7, while this venv has one (3.8, torch 2.14). A kernel written against the newest Triton broke on older ones twice:
``tl.range(warp_specialize=...)`` (3.4+) made every attention kernel fail on Triton 3.3, and an int8 ``tl.dot``
with an int32 accumulator needs ``out_dtype`` on 3.6 (seen on an H200, 2026-11-28). scripts/setup_env.sh puts
each of TK_TRITON_VERSIONS into .triton-versions/<v>; tests/triton_versions.py compiles everything the pack would
compile with that Triton, in a process that imports it first."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DIR = Path(os.environ.get("TK_TRITON_VERSIONS_DIR", REPO / ".triton-versions"))
# the versions the set-up was asked for (its WANTED file), else whatever is there
_WANTED = DIR / "WANTED"
VERSIONS = (_WANTED.read_text().split() if _WANTED.is_file() else
            sorted(p.name for p in DIR.iterdir() if (p / "triton" / "__init__.py").is_file()) if DIR.is_dir() else [])


def _minor(v: str) -> tuple:
    return tuple(int(x) for x in v.split(".")[:2])


@pytest.mark.skipif(not VERSIONS, reason=f"no Triton under {DIR} (scripts/setup_env.sh installs TK_TRITON_VERSIONS)")
@pytest.mark.parametrize("version", VERSIONS or ["none"])
def test_the_kernels_compile_with_this_triton(version):
    if not (DIR / version / "triton" / "__init__.py").is_file():
        pytest.skip(f"triton=={version} could not be installed into {DIR} (scripts/setup_env.sh said why)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(DIR / version)] + [p for p in [os.environ.get(
        "PYTHONPATH")] if p]), TRITON_CACHE_DIR=str(DIR / ".cache" / version))
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, str(REPO / "tests" / "triton_versions.py")], env=env, capture_output=True,
                       text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["triton"] == version and str(DIR / version) in res["triton_file"], res["triton_file"]
    assert not res["failed"], json.dumps(res["failed"], indent=1)[:6000]
    assert not res["interpreted_failed"], res["interpreted_failed"]
    assert res["compiled"] > 60, res
    # what the pack offers follows the Triton: tensor descriptors from 3.4, its Gluon kernels from 3.6
    assert res["tensor_descriptors"] == (_minor(version) >= (3, 4)), res
    assert res["gluon"] == (_minor(version) >= (3, 6)), res
    # direct launches (kernels/fast_launch.py) from 3.4, whose JIT launches as they do; 3.2 and 3.3 call the hooks
    # through CompiledKernel and get Triton's own path
    assert res["fast_launch"] == (_minor(version) >= (3, 4)), res
    if _minor(version) >= (3, 6):
        assert not any("Gluon" in s[0] for s in res["skipped"]), res["skipped"]
