"""kernels/fast_launch.py: a launch repeated under its plan key goes straight to the compiled kernel's launcher,
with the argument list Triton builds (every parameter in order, keyword arguments and defaults after the
positional ones); hooks, an old Triton, the variable, a failing direct launch and an asynchronous compile all
take Triton's path. On the CPU with stand-ins for the kernel and Triton's driver; on a GPU, a real kernel and
the 8-bit / exact attention calls give the same outputs as Triton's path."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

triton = pytest.importorskip("triton")

from tritonkit.kernels import fast_launch as F  # noqa: E402
from tritonkit.kernels import runtime as R  # noqa: E402


def _fn(a, b, n, BLOCK, FLAG=False, EXTRA=7):  # noqa: N803 - a kernel's parameters
    pass


class Compiled:
    def __init__(self, calls):
        self.calls = calls
        self.function, self.packed_metadata = object(), object()
        self.fail = False

    @property
    def run(self):
        def launcher(*a):
            if self.fail:
                raise TypeError("bad argument")
            self.calls.append(("direct", a))
        return launcher


class Kernel:
    """A JITFunction's surface: ``fn``, ``run(*args, grid, warmup, **kw)`` returning its compiled kernel,
    and ``kernel[grid](...)``."""

    def __init__(self):
        self.fn = _fn
        self.calls = []
        self.compiled = Compiled(self.calls)

    def run(self, *args, grid, warmup, **kwargs):
        self.calls.append(("triton", args, kwargs, grid))
        return self.compiled

    def __getitem__(self, grid):
        return lambda *a, **kw: self.run(*a, grid=grid, warmup=False, **kw)


@pytest.fixture
def fake(monkeypatch):
    stream = object()
    drv = SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda dev: stream)
    hooks = SimpleNamespace(launch_enter_hook=None, launch_exit_hook=SimpleNamespace(calls=[]))
    monkeypatch.setattr(F, "_convention", True)
    monkeypatch.setattr(F, "_driver", SimpleNamespace(active=drv))
    monkeypatch.setattr(F, "_knobs", SimpleNamespace(runtime=hooks))
    monkeypatch.setattr(F, "_PLANS", {})
    monkeypatch.setattr(F, "_TAILS", {})
    monkeypatch.setattr(F, "_logged", set())
    for k in F.COUNTERS:
        monkeypatch.setitem(F.COUNTERS, k, 0)
    monkeypatch.delenv(F.ENV, raising=False)
    return SimpleNamespace(stream=stream, hooks=hooks)


def test_second_launch_under_a_plan_goes_to_the_launcher_with_every_parameter(fake):
    k = Kernel()
    a, b = object(), object()
    R.launch(k, (3,), a, b, 10, BLOCK=64, num_warps=4, plan=("call", 1))
    assert [c[0] for c in k.calls] == ["triton"] and k.calls[0][2] == {"BLOCK": 64, "num_warps": 4}
    a2, b2 = object(), object()
    R.launch(k, (3,), a2, b2, 10, BLOCK=64, num_warps=4, plan=("call", 1))
    kind, args = k.calls[1]
    assert kind == "direct"
    # grid padded to 3-D, the stream, the kernel's function and metadata, no launch metadata or hooks, then
    # the positional arguments, the keyword ones in parameter order (num_warps is an option, not one), defaults
    assert args == (3, 1, 1, fake.stream, k.compiled.function, k.compiled.packed_metadata, None, None, None,
                    a2, b2, 10, 64, False, 7)
    assert F.COUNTERS == {"fast_launches": 1, "plans": 1, "plan_failures": 0}


def test_another_key_or_another_kernel_is_a_new_plan(fake):
    k1, k2 = Kernel(), Kernel()
    R.launch(k1, (1,), 1, 2, 3, BLOCK=16, plan="p")
    R.launch(k1, (1,), 1, 2, 3, BLOCK=32, plan="q")
    R.launch(k2, (1,), 1, 2, 3, BLOCK=16, plan="p")
    assert [c[0] for c in k1.calls + k2.calls] == ["triton"] * 3
    R.launch(k1, (1,), 1, 2, 3, BLOCK=32, plan="q")
    assert k1.calls[-1][0] == "direct" and k1.calls[-1][1][-3] == 32


def test_without_a_plan_key_or_compiling_only_triton_launches(fake):
    k = Kernel()
    for _ in range(2):
        R.launch(k, (1,), 1, 2, 3, BLOCK=16)
    assert [c[0] for c in k.calls] == ["triton"] * 2
    R.launch(k, (1,), 1, 2, 3, BLOCK=16, plan="p", warmup=True)
    R.launch(k, (1,), 1, 2, 3, BLOCK=16, plan="p", warmup=True)
    assert [c[0] for c in k.calls] == ["triton"] * 4 and k.calls[-1][0] == "triton" and not F._PLANS


@pytest.mark.parametrize("why", ["hook", "variable", "old-triton"])
def test_hooks_the_variable_and_an_old_triton_keep_tritons_path(fake, monkeypatch, why):
    if why == "hook":
        fake.hooks.launch_exit_hook.calls.append(lambda *a: None)  # e.g. Proton
    elif why == "variable":
        monkeypatch.setenv(F.ENV, "0")
    else:
        monkeypatch.setattr(F, "_convention", False)
    k = Kernel()
    for _ in range(3):
        R.launch(k, (1,), 1, 2, 3, BLOCK=16, plan="p")
    assert [c[0] for c in k.calls] == ["triton"] * 3 and F.COUNTERS["fast_launches"] == 0


def test_a_failing_direct_launch_drops_its_plan_and_launches_through_triton(fake, caplog):
    k = Kernel()
    R.launch(k, (1,), 1, 2, 3, BLOCK=16, plan="p")
    k.compiled.fail = True
    with caplog.at_level("INFO", logger="tritonkit"):
        R.launch(k, (1,), 1, 2, 3, BLOCK=16, plan="p")
    assert [c[0] for c in k.calls] == ["triton", "triton"]  # the failed call made once more, through Triton
    assert F.COUNTERS["plan_failures"] == 1 and "TypeError" in caplog.text
    k.compiled.fail = False
    R.launch(k, (1,), 1, 2, 3, BLOCK=16, plan="p")  # the plan made again by that launch
    assert k.calls[-1][0] == "direct"


def test_a_future_or_a_missing_parameter_makes_no_plan(fake):
    k = Kernel()
    k.compiled = SimpleNamespace(result=lambda: None)  # an asynchronous compile's future
    R.launch(k, (1,), 1, 2, 3, BLOCK=16, plan="p")
    assert not F._PLANS
    k2 = Kernel()
    R.launch(k2, (1,), 1, 2, 3, plan="p")  # BLOCK has no default and was not given: Triton's business
    assert not F._PLANS and F.COUNTERS["plans"] == 0


def test_the_plans_are_bounded(fake, monkeypatch):
    monkeypatch.setattr(F, "MAX_PLANS", 3)
    k = Kernel()
    for i in range(5):
        R.launch(k, (1,), 1, 2, 3, BLOCK=16, plan=i)
    assert 1 <= len(F._PLANS) <= 3


def test_the_installed_triton_is_judged_by_its_version_and_its_jits_launch():
    F._convention = None
    ok = F.convention_ok()
    major, minor = (int(x) for x in triton.__version__.split(".")[:2])
    assert ok == ((major, minor) >= (3, 4))
    assert F.jit_launches_as_expected()  # the venv's Triton (3.8) launches as the direct launch does


def _run_from_source(tmp_path, extra: str):
    """A ``run`` function with a source file (inspect reads it) launching as Triton's JIT does, with ``extra``
    inserted before the parameters."""
    import importlib.util
    f = tmp_path / "fake_jit.py"
    f.write_text("def run(self, kernel, grid_0, grid_1, grid_2, stream, launch_metadata, knobs, bound_args):\n"
                 "    kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata,\n"
                 "               launch_metadata, knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook,\n"
                 f"               {extra}*bound_args.values())\n")
    spec = importlib.util.spec_from_file_location("fake_jit", f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.run


def test_a_jit_that_launches_otherwise_gets_tritons_own_path(monkeypatch, tmp_path):
    """A Triton whose ``JITFunction.run`` calls its launcher differently (here: one more argument before the
    parameters, as a later Triton might add) or whose source can't be read is not launched directly, whatever
    its version says."""
    from triton.runtime.jit import JITFunction
    assert F.jit_launches_as_expected(_run_from_source(tmp_path, ""))  # the form it was written against
    changed = _run_from_source(tmp_path, "None, ")
    assert not F.jit_launches_as_expected(changed)
    assert not F.jit_launches_as_expected(len)  # a builtin: no source
    monkeypatch.setattr(JITFunction, "run", changed)
    monkeypatch.setattr(F, "_convention", None)
    assert not F.convention_ok()


def test_an_args_key_names_what_the_launch_specialises_on():
    """args_key: tensors by dtype, device and 16-byte alignment (not their values or addresses), other
    arguments by value, keyword arguments in any order."""
    import torch
    a, b = torch.zeros(64, dtype=torch.uint8), torch.ones(64, dtype=torch.uint8)
    k = F.args_key((a, 64, 1), {"BLOCK": 16, "num_warps": 4})
    assert k == F.args_key((b, 64, 1), {"num_warps": 4, "BLOCK": 16}) and hash(k) == hash(F.args_key((b, 64, 1), {
        "num_warps": 4, "BLOCK": 16}))
    assert k != F.args_key((a[1:], 64, 1), {"BLOCK": 16, "num_warps": 4})  # misaligned
    assert k != F.args_key((a.view(torch.int8), 64, 1), {"BLOCK": 16, "num_warps": 4})
    assert k != F.args_key((a, 65, 1), {"BLOCK": 16, "num_warps": 4})
    assert k != F.args_key((a, 64, 1), {"BLOCK": 32, "num_warps": 4})


# ----------------------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_a_real_kernel_launches_directly_with_the_same_result():
    import torch

    from tritonkit.kernels import vector_add
    F._convention = None
    before = F.COUNTERS["fast_launches"]
    n = vector_add.BLOCK_SIZE
    for i in range(3):
        x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        out = torch.full_like(x, float("nan"))
        R.launch(vector_add.add_kernel, (1,), x, y, out, n, BLOCK_SIZE=n, plan=("add", n))
        torch.cuda.synchronize()
        assert torch.equal(out, x + y)
    assert F.COUNTERS["fast_launches"] - before == 2


def _first_config_of_each_variant(A, cc, dtype, D, int8):
    hopper = A.attention_hopper.eligible(cc, dtype, D, False, False)
    if int8:
        variants = A.pv_modes_for("auto", cc, True) + ((A.G8_HALF, A.G8_FP8) if hopper else ())
    else:
        variants = A.tma_variants_for(cc, dtype, hopper)
    cands = A.variant_candidates(cc, A.block_d_for(D), 2, int8, variants)
    return list({c[4]: c for c in reversed(cands)}.values())


@pytest.mark.gpu
@pytest.mark.parametrize("mode,shape", [("int8", (1, 4, 1024, 128)), ("exact", (1, 4, 1024, 128)),
                                        ("int8", (2, 3, 600, 64)), ("exact", (2, 3, 600, 64))])
def test_attention_calls_launched_directly_match_tritons_path(mode, shape, monkeypatch):
    """Each kernel variant's first config: a call through Triton's path and the same inputs' call launched
    directly (its plan made by a call on other tensors) give the same bits, close to a float64 reference."""
    import torch

    from tritonkit.kernels import attention as A
    B, H, L, D = shape
    dtype = torch.bfloat16
    major, minor = torch.cuda.get_device_capability()
    gen = torch.Generator(device="cuda").manual_seed(11)

    def inputs():
        return [torch.randn(B, L, H * D, device="cuda", dtype=dtype, generator=gen) for _ in range(3)]

    def call(qkv, cfg):
        out = torch.full((B, L, H * D), float("nan"), device="cuda", dtype=dtype)
        A.attention(*qkv, H, mode=mode, config=cfg, out=out)
        return out

    first, second = inputs(), inputs()
    ref = A.attention_reference(*second, H).to(torch.float32)
    configs = _first_config_of_each_variant(A, major * 10 + minor, dtype, D, mode == "int8")
    assert configs
    for cfg in configs:
        monkeypatch.setenv(F.ENV, "0")
        slow = call(second, cfg)
        monkeypatch.setenv(F.ENV, "1")
        call(first, cfg)  # makes the plans
        before = F.COUNTERS["fast_launches"]
        fast = call(second, cfg)
        torch.cuda.synchronize()
        assert F.COUNTERS["fast_launches"] > before, cfg
        assert torch.equal(fast, slow), cfg
        assert torch.isfinite(fast).all()
        cos = torch.nn.functional.cosine_similarity(fast.float().flatten(), ref.flatten(), dim=0)
        assert cos > (0.999 if mode == "int8" else 0.9999), (cfg, float(cos))


@pytest.mark.gpu
def test_fp8_decode_and_fused_linear_launch_directly_with_the_same_result(monkeypatch):
    """The fp8 decode and the fused W8A16 linear key their launches (args_key): a repeat on new tensors of the
    same kind goes to the launcher directly and gives the same bits as Triton's path on the same inputs."""
    import torch

    from tritonkit.kernels import fp8 as F8
    from tritonkit.kernels import fp8_linear as FL
    F._convention = None
    gen = torch.Generator(device="cuda").manual_seed(5)
    w = (torch.randn(384, 256, device="cuda", generator=gen) * 0.1).to(torch.float8_e4m3fn)
    s = torch.full((1,), 0.37, device="cuda")
    x = torch.randn(7, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(384, device="cuda", dtype=torch.bfloat16, generator=gen)
    FL.linear(x, w, b, s)  # its block config tuned first
    monkeypatch.setenv(F.ENV, "0")  # Triton's path every time
    slow_d, slow_l = F8.decode(w, torch.bfloat16, s), FL.linear(x, w, b, s)
    monkeypatch.delenv(F.ENV)
    F.clear()
    F8.decode(w, torch.bfloat16, s), FL.linear(x, w, b, s)  # through Triton once more: the plans made
    w2, x2 = w.clone(), x.clone()
    before = F.COUNTERS["fast_launches"]
    fast_d, fast_l = F8.decode(w2, torch.bfloat16, s), FL.linear(x2, w2, b, s)
    torch.cuda.synchronize()
    assert F.COUNTERS["fast_launches"] - before == 2
    assert torch.equal(fast_d, slow_d) and torch.equal(fast_l, slow_l)
    ref = FL.linear_reference(x.double(), w, b.double(), s).float()
    assert torch.allclose(fast_l.float(), ref, rtol=2e-2, atol=2e-2)
