"""The Triton Attention node: the override's routing (served / fallback, logged once, counted) as
plain functions, then inside a real ComfyUI 0.3.75 with tiny models of real architectures (SD-style
UNet with head sizes 40/80, tiny Flux): unpatched vs patched on the CPU fallback (identical, the
fallback logged once) and with the Triton path forced on CPU (within tolerance, every attention
call through the kernel)."""
from __future__ import annotations

import logging
import math
import types

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
    N._memo.clear()
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
    b = N._bind((torch.zeros(1, 2, 8192, 128, dtype=torch.float16),) * 3 + (2,), {"skip_reshape": True})
    assert N.plan("auto", b, True) == ("int8", None)
    b["low_precision_attention"] = False
    assert N.plan("auto", b, True) == ("exact", None)
    b = N._bind((torch.zeros(1, 2, 8192, 64, dtype=torch.float16),) * 3 + (2,), {"skip_reshape": True})
    assert N.plan("auto", b, True) == ("exact", None)  # SDXL-like head size
    b = N._bind((torch.zeros(1, 2, 4608, 128, dtype=torch.float16),) * 3 + (2,), {"skip_reshape": True})
    assert N.plan("auto", b, True) == ("exact", None)  # Flux 1024²: 8-bit does not pay
    t = torch.zeros(1, 16384, 8 * 128, dtype=torch.float16)
    ctx = torch.zeros(1, 77, 8 * 128, dtype=torch.float16)
    assert N.plan("auto", N._bind((t, t, t, 8), {}), True) == ("int8", None)
    assert N.plan("auto", N._bind((t, ctx, ctx, 8), {}), True) == ("exact", None)
    assert N.plan("auto", N._bind((t, t, t, 8), {"attn_precision": torch.float32}), True) == ("exact", None)


def test_auto_keeps_sdpa_where_it_measured_faster(monkeypatch):
    # ComfyUI's SDPA backend on Hopper+ (cuDNN) or at head sizes that are not a multiple of 32
    assert N.sdpa_is_faster("attention_pytorch", 90, 128)
    assert N.sdpa_is_faster("attention_pytorch", 100, 64)  # torch picks cuDNN on sm90/sm100
    assert not N.sdpa_is_faster("attention_pytorch", 120, 64)  # RTX 50xx: torch picks FlashAttention-2
    assert N.sdpa_is_faster("attention_pytorch", 86, 40)
    assert not N.sdpa_is_faster("attention_pytorch", 86, 128)
    assert not N.sdpa_is_faster("attention_pytorch", 89, 64)
    assert not N.sdpa_is_faster("attention_sub_quad", 90, 128)  # other backends: ours is faster
    assert not N.sdpa_is_faster("attention_pytorch", None, 40)  # CPU (forced interpreter)
    # TRITONKIT_FORCE_ARCH makes a newer GPU choose like an older one
    monkeypatch.setenv(N.ARCH_ENV, "sm86")
    assert N._arch(torch.device("cuda", 0)) == 86
    monkeypatch.setenv(N.ARCH_ENV, "90")
    assert N._arch(torch.device("cuda", 0)) == 90
    assert N._arch(torch.device("cpu")) is None
    # on CPU with Triton forced, auto serves SDPA's calls too (no measured reason to defer)
    monkeypatch.setenv(FORCE, "1")
    b = N._bind((torch.zeros(1, 2, 64, 40, dtype=torch.float16),) * 3 + (2,), {"skip_reshape": True})
    assert N.plan("auto", b, True, "attention_pytorch") == ("exact", None)


def test_the_kernel_call_keeps_to_the_forced_arch(monkeypatch):
    # a simulated RTX 3090 (TRITONKIT_FORCE_ARCH=86 on an H100) must not run fp8 P·V or TMA
    seen = {}
    monkeypatch.setattr(N.A, "attention", lambda *a, **kw: seen.update(kw))
    monkeypatch.setenv(N.ARCH_ENV, "86")
    q = types.SimpleNamespace(device=torch.device("cuda", 0))
    N.run_attention("int8", {"q": q, "k": q, "v": q, "heads": 2})
    assert seen["arch"] == 86 and seen["mode"] == "int8"
    N.run_attention("exact", {"q": types.SimpleNamespace(device=torch.device("cpu")), "k": q, "v": q, "heads": 2})
    assert seen["arch"] is None


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


def test_a_repeated_call_reuses_its_decision_until_a_key_part_changes(monkeypatch):
    planned = []
    real = N.plan
    monkeypatch.setattr(N, "plan", lambda *a, **kw: planned.append(a[0]) or real(*a, **kw))
    ov = N.make_override("exact")
    func = Calls()
    q, k, v = qkv()
    for _ in range(3):  # new tensors of the same shapes each call, as a model's steps make them
        out = ov(func, q.clone(), k.clone(), v.clone(), 2, transformer_options={"n": 1})
        assert torch.equal(out, sdpa_backend(q, k, v, 2))
    assert planned == ["exact"] and func.n == 3 and N.stats()["fallback"] == 3
    ov(func, *qkv(L=30), 2)  # another shape
    ov(func, q, k, v, 2, skip_output_reshape=True)  # another argument
    ov(func, q, k, v, 2, mask=torch.ones(24, 24, dtype=torch.bool))  # a mask: decided every call
    ov(func, q, k, v, 2, mask=torch.ones(24, 24, dtype=torch.bool))
    assert planned == ["exact"] * 5
    monkeypatch.setenv(FORCE, "1")  # the environment is part of the key: now the kernel serves
    out = ov(func, q, k, v, 2)
    assert planned == ["exact"] * 6 and N.stats()["served_exact"] == 1 and func.n == 7
    torch.testing.assert_close(out, sdpa_backend(q, k, v, 2), rtol=1e-3, atol=1e-3)


def test_auto_keeps_a_decision_only_while_its_calibration_choice_is_final(monkeypatch):
    monkeypatch.setenv(FORCE, "1")
    final, asked = {}, []
    monkeypatch.setattr(N.calib.C, "settled", lambda dkey, key: asked.append(key) or final.get(key))
    decided = []
    real = N._auto_choice
    monkeypatch.setattr(N, "_auto_choice", lambda *a, **kw: decided.append(1) or real(*a, **kw))
    ov = N.make_override("auto")
    func = Calls()
    q, k, v = qkv(dtype=torch.float16)
    ov(func, q, k, v, 2)
    ov(func, q, k, v, 2)
    assert len(decided) == 2  # no final choice on the CPU: decided each call
    [key] = set(asked)  # the call's calibration key
    assert key.startswith("attention|cpu|")
    final[key] = "exact"  # as when the calibration has chosen and its kernels are loaded
    for _ in range(3):
        ov(func, q, k, v, 2)
    assert len(decided) == 3 and N.stats()["served_exact"] == 5
    final[key] = "comfy"  # the choice changed (a new calibration): the kept decision no longer stands
    ov(func, q, k, v, 2)
    assert len(decided) == 4


def test_calls_whose_k_v_are_strided_views_are_timed_as_a_class_of_their_own(monkeypatch):
    """auto's calibration key names whether K and V fold into rows as the exact kernel's TMA / Gluon paths read them:
    where they don't (here: K / V a window of a longer buffer), only the pointer-load kernel serves exact, and one
    layout's timing must not decide the other's. Views into a fused projection (Flux's single blocks hand V over so)
    fold into rows of the projection's stride: they are the contiguous calls' class."""
    monkeypatch.setenv(FORCE, "1")
    asked = []
    monkeypatch.setattr(N.calib.C, "settled", lambda dkey, key: asked.append(key))
    ov = N.make_override("auto")
    func = Calls()
    for bhld in (True, False):
        B, L, H, D = 2, 24, 2, 16
        fused = torch.randn(B, L + 8, 3, H, D)  # one projection: q, k, v are views into it
        if bhld:
            q, k, v = fused.permute(2, 0, 3, 1, 4)
            opts = {"skip_reshape": True}
        else:
            q, k, v = (fused[:, :, i].reshape(B, L + 8, H * D) if i == 0 else fused[:, :, i].flatten(2)
                       for i in range(3))
            opts = {}
        assert v.stride(-2 if bhld else 1) == 3 * H * D  # a strided view, as in Flux's single blocks
        window = (lambda x: x[:, :, :L]) if bhld else (lambda x: x[:, :L])
        asked.clear()
        ov(func, *(window(x) for x in (q, k, v)), H, **opts)  # K / V: L of L + 8 keys, so a batch is not L rows
        ov(func, *(window(x).contiguous() for x in (q, k, v)), H, **opts)
        strided, rows = asked
        assert "|kvstrided|" in strided and "|kv2d|" in rows, asked
        assert strided.replace("|kvstrided|", "|kv2d|") == rows  # the same shape class otherwise
        asked.clear()
        fl = torch.randn(B, L, 3 * H * D + 40)  # Flux's single blocks: QKV and the MLP's input in one row
        qkv = fl[..., :3 * H * D].view(B, L, 3, H, D)
        q, k = (qkv[:, :, i].permute(0, 2, 1, 3).contiguous() for i in range(2))  # normed and rotated: copies
        v = qkv[:, :, 2].permute(0, 2, 1, 3)
        if not bhld:
            q, k, v = (x.transpose(1, 2).flatten(2) for x in (q, k, v))
        ov(func, q, k, v, H, **opts)
        assert "|kv2d|" in asked[0], asked


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


# ----------------------------------------------------------------------------- real ComfyUI (CPU)

def _comfy():
    import tiny_models as tm
    from comfy_harness import TEST_NODES, ComfyServer, comfyui_available
    return tm, TEST_NODES, ComfyServer, comfyui_available


def _server(tmp_path_factory, name, env):
    tm, TEST_NODES, ComfyServer, comfyui_available = _comfy()
    if not comfyui_available():
        pytest.fail("ComfyUI is not set up: run scripts/setup_env.sh")
    srv = ComfyServer(tmp_path_factory.mktemp(name), env=env, extra_packs=TEST_NODES)
    srv.start()
    return srv


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory):
    srv = _server(tmp_path_factory, "attn-plain", {FORCE: "0"})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def forced_server(tmp_path_factory):
    srv = _server(tmp_path_factory, "attn-forced", {FORCE: "1"})
    yield srv
    srv.stop()


def _install(server, arch):
    tm = _comfy()[0]
    if arch == "sd15":
        info = tm.cached_models(tm.SD15_TINY_CONFIG, [(torch.float16, False)])[0]
        return tm.sd15_workflow, tm.install_model(info, server.base / "models")
    if arch == "wan":
        info = tm.cached_models(tm.WAN_TINY_CONFIG, [(torch.bfloat16, False)])[0]
        return tm.wan_workflow, tm.install_model(info, server.base / "models")
    info = tm.cached_models(tm.FLUX_TINY_CONFIG, [(torch.bfloat16, False)])[0]
    return tm.flux_workflow, tm.install_model(info, server.base / "models")


def _sample(server, arch, mode, prefix):
    """Samples the tiny model (2 steps), patched by the node when mode is given; an attention probe
    after the node counts every attention call. Returns (latent, probe counts, our stats delta,
    node text)."""
    import json

    from safetensors import safe_open
    tm = _comfy()[0]
    wf, name = _install(server, arch)
    patch = [("TritonKitAttention", {"mode": mode})] if mode else []
    prompt = wf(name, patch_nodes=patch + [("TritonKitTestAttentionProbe", {"name": "attn"})], prefix=prefix)
    prompt["91"] = {"class_type": "TritonKitTestCounters", "inputs": {"reset": True, "anything": [tm.NODE_SAMPLER, 0]}}
    before = server.get("/tritonkit/attention/stats")
    entry = server.run(prompt, timeout=600)
    after = server.get("/tritonkit/attention/stats")
    delta = {k: after[k] - before[k] for k in ("served", "served_exact", "served_int8", "fallback")}
    stats = json.loads(entry["outputs"][tm.NODE_OUT]["tritonkit_latent"][0])
    counts = json.loads(entry["outputs"]["91"]["tritonkit_counters"][0])["counts"]
    with safe_open(str(server.base / "output" / stats["file"]), "pt") as f:
        latent = f.get_tensor("latent")
    text = entry["outputs"].get(str(tm.PATCH_BASE), {}).get("text", [None])[0] if mode else None
    return latent, counts, delta, text


# SD-style UNet: 28 attention calls per 2 steps (head sizes 40/80, cross-attention over 77 tokens);
# tiny Flux: 4 (head size 128, (B, H, L, D) layout); tiny WAN: 4 (one block's self- and cross-attention, head 128,
# (B, L, H·D) layout, heads passed by keyword).
EXPECTED_CALLS = {"sd15": 28, "flux": 4, "wan": 4}


@pytest.mark.comfyui
@pytest.mark.parametrize("arch", ["sd15", "flux", "wan"])
def test_comfyui_cpu_falls_back_identically_logged_once(plain_server, arch):
    ref, counts0, d0, _ = _sample(plain_server, arch, None, f"{arch}_ref")
    assert counts0["attn"] == EXPECTED_CALLS[arch]
    assert d0 == {"served": 0, "served_exact": 0, "served_int8": 0, "fallback": 0}
    for mode in ("auto", "8-bit"):
        out, counts, delta, text = _sample(plain_server, arch, mode, f"{arch}_{mode}")
        assert torch.equal(out, ref), f"{arch} {mode}: the CPU fallback changed the result"
        assert counts["attn"] == EXPECTED_CALLS[arch]
        assert delta["served"] == 0 and delta["fallback"] == counts["attn"], delta
        assert text.startswith(f"Triton Attention: mode={mode}") and "uses ComfyUI's attention" in text
    log = plain_server.log()
    lines = [ln for ln in log.splitlines() if "TritonKit attention: using ComfyUI's attention for CPU tensors" in ln]
    assert len(lines) == 1, lines
    assert not [ln for ln in log.splitlines() if "IMPORT FAILED" in ln and "tritonkit" in ln]


# exact: fp32 kernel vs ComfyUI's fp32 attention; 8-bit: int8 Q·K.
LATENT_TOL = {"exact": 2e-3, "8-bit": 5e-2}


@pytest.mark.comfyui
@pytest.mark.parametrize("arch", ["sd15", "flux", "wan"])
def test_comfyui_forced_triton_on_cpu_counts_every_call(forced_server, arch):
    ref, counts0, d0, _ = _sample(forced_server, arch, None, f"{arch}_ref")
    assert d0["served"] == 0 and counts0["attn"] == EXPECTED_CALLS[arch]
    for mode in ("exact", "8-bit"):
        out, counts, delta, text = _sample(forced_server, arch, mode, f"{arch}_{mode}")
        assert counts["attn"] == EXPECTED_CALLS[arch]
        assert delta["fallback"] == 0 and delta["served"] == counts["attn"], delta
        kind = "served_int8" if mode == "8-bit" else "served_exact"
        assert delta[kind] == counts["attn"], delta
        assert "Triton forced" in text
        assert torch.isfinite(out).all()
        rel = float((out - ref).norm() / ref.norm())
        assert rel <= LATENT_TOL[mode], f"{arch} {mode}: latent rel diff {rel:.2e}"
