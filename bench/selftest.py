"""Cold/warm timings of the self-test's vector add on the GPU.

    python bench/selftest.py [--n 98432] [--fresh-cache]

Cold = the first call in a fresh process, with an empty Triton cache when --fresh-cache is
given (a real compile), else whatever the cache holds. Warm = median of 100 calls. Anchor:
torch's own ``x + y`` and a device-to-device copy of the same bytes."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(n: int) -> dict:
    pkg = types.ModuleType("tritonkit")
    pkg.__path__ = [str(ROOT)]
    sys.modules["tritonkit"] = pkg
    import time
    import torch
    import triton
    from tritonkit.kernels import vector_add
    x = torch.rand(n, device="cuda")
    y = torch.rand(n, device="cuda")
    out = torch.empty_like(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    vector_add.add(x, y, out=out)
    torch.cuda.synchronize()
    cold = time.perf_counter() - t0
    assert torch.equal(out, x + y)
    from triton.testing import do_bench
    warm = do_bench(lambda: vector_add.add(x, y, out=out), rep=200)
    torch_add = do_bench(lambda: torch.add(x, y, out=out), rep=200)
    copy = do_bench(lambda: out.copy_(x), rep=200)
    return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
            "n": n, "cold_first_call_ms": cold * 1e3, "warm_ms": warm, "torch_add_ms": torch_add, "copy_ms": copy}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=98_432)
    ap.add_argument("--fresh-cache", action="store_true")
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.n)))
        return
    env = dict(os.environ)
    if a.fresh_cache:
        env["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="tk-triton-cache-")
    for label in ("cold (fresh process)", "second process (cache hit)"):
        r = subprocess.run([sys.executable, __file__, "--child", "--n", str(a.n)], env=env, capture_output=True,
                           text=True, check=True)
        res = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"{label}: " + json.dumps(res))


if __name__ == "__main__":
    main()
