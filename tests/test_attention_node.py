"""The Triton Attention node: the override's routing (served / fallback, logged once, counted) as
plain functions, then inside a real ComfyUI 0.3.75 with tiny models of real architectures (SD-style
UNet with head sizes 40/80, tiny Flux): unpatched vs patched on the CPU fallback (identical, the
fallback logged once) and with the Triton path forced on CPU (within tolerance, every attention
call through the kernel)."""
from __future__ import annotations

import logging
import math

import pytest
import torch

from tritonkit.nodes import attention as N

FORCE = "TRITONKIT_FORCE_TRITON_ON_CPU"


def sdpa_backend(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False,
                 **kwargs):
    """ComfyUI's attention_pytorch, minus the decorator (what the override receives as func)."""
    if skip_reshape:
        b, _, _, dh = q.shape
    else:
        b, _, dh = q.shape
        dh //= heads
        q, k, v = (t.view(b, -1, heads, dh).transpose(1, 2) for t in (q, k, v))
    if mask is not None:
        if mask.ndim == 2:
            mask = mask.unsqueeze(0)
        if mask.ndim == 3:
            mask = mask.unsqueeze(1)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=kwargs.get("scale"))
    if not skip_output_reshape:
        out = out.transpose(1, 2).reshape(b, -1, heads * dh)
    return out


class Calls:
    def __init__(self, compute=True):
        self.n = 0
        self.compute = compute

    def __call__(self, *args, **kwargs):
        self.n += 1
        return sdpa_backend(*args, **kwargs) if self.compute else "fallback"


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    N.reset_stats()
    N._logged.clear()
    monkeypatch.delenv(FORCE, raising=False)
    yield


def qkv(B=1, L=24, Lk=None, H=2, D=16, dtype=torch.float32, bhld=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    Lk = Lk or L
    mk = (lambda L_: torch.randn(B, H, L_, D, generator=g).to(dtype)) if bhld else \
        (lambda L_: torch.randn(B, L_, H * D, generator=g).to(dtype))
    return mk(L), mk(Lk), mk(Lk)


def test_cpu_falls_back_identically_and_logs_once(caplog):
    ov = N.make_override("exact")
    func = Calls()
    q, k, v = qkv()
    with caplog.at_level(logging.WARNING, logger="TritonKit"):
        for _ in range(3):
            out = ov(func, q, k, v, 2, transformer_options={}, _inside_attn_wrapper=True)
            assert torch.equal(out, sdpa_backend(q, k, v, 2))
    assert func.n == 3
    s = N.stats()
    assert s["served"] == 0 and s["fallback"] == 3
    [reason] = s["reasons"]
    assert reason.startswith("CPU tensors")
    logged = [r for r in caplog.records if "using ComfyUI's attention" in r.getMessage()]
    assert len(logged) == 1


@pytest.mark.parametrize("mode", ["exact", "8-bit", "auto"])
@pytest.mark.parametrize("bhld", [False, True])
def test_forced_cpu_serves_through_the_kernel(mode, bhld, monkeypatch):
    monkeypatch.setenv(FORCE, "1")
    ov = N.make_override(mode)
    func = Calls()
    q, k, v = qkv(L=40, Lk=33, bhld=bhld, dtype=torch.float16)
    mask = torch.rand(40, 33) > 0.2
    kw = dict(skip_reshape=bhld, transformer_options={}, _inside_attn_wrapper=True)
    out = ov(func, q, k, v, 2, mask, **kw)
    ref = sdpa_backend(q.float(), k.float(), v.float(), 2, mask, skip_reshape=bhld)
    assert func.n == 0
    assert out.shape == ref.shape and out.dtype == q.dtype
    cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.double().flatten(), dim=0)
    assert cos > 0.999
    s = N.stats()
    assert s["served"] == 1 and s["fallback"] == 0
    assert s["served_int8" if mode == "8-bit" else "served_exact"] == 1


def test_keyword_arguments_scale_and_output_layout(monkeypatch):
    monkeypatch.setenv(FORCE, "1")
    ov = N.make_override("exact")
    q, k, v = qkv(bhld=True, D=32)
    out = ov(Calls(), q, k, v, heads=2, skip_reshape=True, skip_output_reshape=True, scale=0.05,
             transformer_options={})
    ref = sdpa_backend(q, k, v, 2, skip_reshape=True, skip_output_reshape=True, scale=0.05)
    assert out.shape == (1, 2, 24, 32)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_unservable_calls_fall_back(monkeypatch):
    monkeypatch.setenv(FORCE, "1")
    func = Calls(compute=False)
    q, k, v = qkv(D=320, H=1)
    N.make_override("exact")(func, q, k, v, 1)                       # head size
    q, k, v = qkv(dtype=torch.float64)
    N.make_override("exact")(func, q, k, v, 2)                       # dtype
    q, k, v = qkv()
    N.make_override("8-bit")(func, q, k, v, 2, low_precision_attention=False)
    N.make_override("exact")(func, q, k, v, 2, mask=torch.zeros(3, 5))  # mask that does not fit
    assert func.n == 4
    s = N.stats()
    assert s["served"] == 0 and s["fallback"] == 4
    text = " | ".join(s["reasons"])
    assert "head size 320" in text and "float64" in text and "low_precision_attention" in text and "mask" in text
    # exact mode serves low_precision_attention=False calls
    N.make_override("exact")(func, q, k, v, 2, low_precision_attention=False)
    assert N.stats()["served_exact"] == 1


def test_auto_picks_int8_only_for_long_wide_self_attention(monkeypatch):
    monkeypatch.setenv(FORCE, "1")
    b = N._bind((torch.zeros(1, 2, 2048, 64, dtype=torch.float16),) * 3 + (2,), {"skip_reshape": True})
    assert N.plan("auto", b, True) == ("int8", None)
    b["low_precision_attention"] = False
    assert N.plan("auto", b, True) == ("exact", None)
    b = N._bind((torch.zeros(1, 2, 2048, 40, dtype=torch.float16),) * 3 + (2,), {"skip_reshape": True})
    assert N.plan("auto", b, True) == ("exact", None)
    t = torch.zeros(1, 4096, 8 * 64, dtype=torch.float16)
    ctx = torch.zeros(1, 77, 8 * 64, dtype=torch.float16)
    assert N.plan("auto", N._bind((t, ctx, ctx, 8), {}), True) == ("exact", None)
    assert N.plan("auto", N._bind((t, t, t, 8), {"attn_precision": torch.float32}), True) == ("exact", None)


def test_kernel_error_falls_back(monkeypatch):
    monkeypatch.setenv(FORCE, "1")

    def boom(kmode, b):
        raise RuntimeError("PassManager::run failed\nmore")
    monkeypatch.setattr(N, "run_attention", boom)
    func = Calls()
    q, k, v = qkv()
    for _ in range(2):
        N.make_override("exact")(func, q, k, v, 2)
    assert func.n == 2
    assert list(N.stats()["reasons"]) == ["kernel error (RuntimeError: PassManager::run failed)"]


class FakePatcher:
    load_device = torch.device("cpu")

    def __init__(self):
        self.model_options = {"transformer_options": {}}

    def clone(self):
        import copy
        c = FakePatcher()
        c.model_options = copy.deepcopy(self.model_options)
        return c


def test_node_patches_a_clone_only():
    node = N.TritonAttention()
    m = FakePatcher()
    res = node.patch(m, "auto")
    clone = res["result"][0]
    assert "optimized_attention_override" not in m.model_options["transformer_options"]
    ov = clone.model_options["transformer_options"]["optimized_attention_override"]
    assert ov.tritonkit_mode == "auto"
    text = res["ui"]["text"][0]
    assert text.startswith("Triton Attention: mode=auto") and "CPU" in text
    spec = N.TritonAttention.INPUT_TYPES()["required"]
    assert spec["mode"][0] == ["auto", "exact", "8-bit"]
    assert N.NODE_CLASS_MAPPINGS == {"TritonKitAttention": N.TritonAttention}
    assert N.NODE_DISPLAY_NAME_MAPPINGS == {"TritonKitAttention": "Triton Attention"}
    assert N.TritonAttention.CATEGORY == "TritonKit"


# ----------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["exact", "8-bit"])
def test_cuda_override_serves_and_compiles_without_graph_breaks(mode):
    ov = N.make_override(mode)
    q, k, v = (t.cuda() for t in qkv(L=2048, H=8, D=64, dtype=torch.bfloat16, bhld=True))

    def layer(q, k, v):
        return ov(sdpa_backend, q * 1.0, k, v, q.shape[1], skip_reshape=True, transformer_options={}) + 1

    eager = layer(q, k, v)
    ref = sdpa_backend(q, k, v, 8, skip_reshape=True) + 1
    cos = torch.nn.functional.cosine_similarity(eager.double().flatten(), ref.double().flatten(), dim=0)
    assert cos > 0.999
    assert N.stats()["served"] == 1
    explanation = torch._dynamo.explain(layer)(q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch.testing.assert_close(torch.compile(layer)(q, k, v), eager, rtol=0, atol=0)
