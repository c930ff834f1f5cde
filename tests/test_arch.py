"""nodes/arch.py: a simulated older GPU compiles with that card's MMA instruction."""
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def arch():
    spec = importlib.util.spec_from_file_location("_tk_arch_test", REPO / "nodes" / "arch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("forced, before, after", [
    ("86", None, "1"), ("sm_89", None, "1"), ("8.0", None, "1"), ("75", None, "1"),
    ("90", None, None), ("120", None, None), ("", None, None), ("not-an-arch", None, None),
    ("86", "0", "0"),  # the user's own answer, either way, stays
    ("86", "1", "1"),
])
def test_forced_arch_below_90_compiles_without_wgmma(arch, forced, before, after):
    env = {arch.ARCH_ENV: forced} if forced else {}
    if before is not None:
        env[arch.MMA_V3_ENV] = before
    set_now = arch.card_instructions(env)
    assert env.get(arch.MMA_V3_ENV) == after
    assert set_now == (after if before is None else None)


def test_a_benchs_simulated_arch_takes_the_same_rule(arch):
    env = {}
    assert arch.card_mma(89, env) == "1" and env == {arch.MMA_V3_ENV: "1"}
    for a, env in ((90, {}), (None, {}), (86, {arch.MMA_V3_ENV: "0"})):
        before = dict(env)
        assert arch.card_mma(a, env) is None and env == before


def test_triton_honours_the_switch(monkeypatch):
    """The installed Triton compiles the simulated sm89 path's 8-bit kernel for sm90 with wgmma, and with
    mma.sync under DISABLE_MMA_V3=1: what the simulation relies on (CPU cross-compiles)."""
    import torch
    sys.path.insert(0, str(REPO / "tests"))
    from compile_utils import compile_for
    from tritonkit.kernels import attention as A

    fn, sig, consts, opts = A._spec(torch.bfloat16, True, 128, (64, 64, 4, 3), [90], pv_mode=1)
    ptx = {}
    for value in (None, "1"):
        if value is None:
            monkeypatch.delenv("DISABLE_MMA_V3", raising=False)
        else:
            monkeypatch.setenv("DISABLE_MMA_V3", value)
        ptx[value] = compile_for(fn, sig, consts, 90, opts["num_warps"], opts["num_stages"]).asm["ptx"]
    assert "wgmma" in ptx[None] and "mma.sync" not in ptx[None]
    assert "mma.sync" in ptx["1"] and "wgmma" not in ptx["1"]
