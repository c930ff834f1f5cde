"""The "Triton Compile Model" node (nodes/compile_model.py) on ComfyUI's own model classes, in
process, on the CPU (Inductor's C++ backend): which blocks it finds per architecture, one
compiled graph per block class reused by every block, a new resolution without a recompile,
in-place weight patches (LoRA) without a recompile, the Triton Attention and fp8 Fallback nodes
inside the compiled blocks without graph breaks, offloaded/lowvram blocks kept eager, ComfyUI's
TorchCompileModel left in charge, and a second process served from the caches on disk.

The tiny Flux is ComfyUI's Flux class built from a config (hidden 64, 2 heads, 2 double + 3
single blocks), not a checkpoint: ComfyUI's detection forces hidden 3072, which Inductor on 2
cores would take minutes to compile. Each Inductor compile here costs ~5-10 s; the graphs are
shared between tests through the node's per-process cache of compiled functions, so the order
of the tests matters only for how long they take, never for what they assert (the test that counts
the first compile empties that cache first)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.comfyui  # ComfyUI in this process: scripts/dev.sh runs it against every line

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FLUX_CFG = dict(image_model="flux", in_channels=16, patch_size=2, out_channels=16, vec_in_dim=32,
                context_in_dim=32, hidden_size=64, mlp_ratio=2.0, num_heads=2, depth=2, depth_single_blocks=3,
                axes_dim=[8, 12, 12], theta=10000, qkv_bias=True, guidance_embed=True)
NODE = "TritonKitCompileModel"


def comfyui_dir() -> Path:
    return Path(os.environ.get("TK_COMFYUI", REPO / ".comfyui"))


def setup_comfy(models_dir):
    """ComfyUI in this process on the CPU with the pack loaded (bench/_comfy_inproc.py), and
    ComfyUI's PyTorch attention for the models: on the CPU ComfyUI picks its sub-quadratic
    attention, which asks psutil for free memory inside every block (a graph break that has
    nothing to do with the node)."""
    cdir = comfyui_dir()
    if not (cdir / "comfy" / "ops.py").is_file():
        pytest.skip(f"ComfyUI sources are not in {cdir} (scripts/setup_env.sh, or set TK_COMFYUI)")
    sys.path.insert(0, str(cdir))
    sys.path.insert(0, str(REPO / "bench"))
    import comfy.cli_args
    comfy.cli_args.args.cpu = True
    comfy.cli_args.args.use_pytorch_cross_attention = True
    import _comfy_inproc as inproc
    st = inproc.setup("cpu", models_dir)
    import comfy.ldm.flux.math
    import comfy.ldm.modules.attention as attention
    comfy.ldm.flux.math.optimized_attention = attention.attention_pytorch
    return inproc, st


def tiny_flux(dtype=torch.float32, seed=0):
    """(ModelPatcher, BaseModel) of ComfyUI's Flux class from FLUX_CFG with random weights, built
    in inference mode;
    ``dtype`` fp8 stores the weights in fp8 with float32 compute (ComfyUI's manual cast)."""
    import dataclasses

    import comfy.ldm.flux.model
    import comfy.model_patcher
    import comfy.supported_models
    cfg = dict(FLUX_CFG)
    if "txt_ids_dims" in {f.name for f in dataclasses.fields(comfy.ldm.flux.model.FluxParams)}:
        cfg["txt_ids_dims"] = []  # 0.8.0: which text-id dims carry positions (none for Flux.1)
    mc = comfy.supported_models.Flux(cfg)
    mc.set_inference_dtype(dtype, None if dtype == torch.float32 else torch.float32)
    g = torch.Generator().manual_seed(seed)
    # in inference mode, as UNETLoader runs under ComfyUI's executor: the weights are inference
    # tensors, like the LoRA-patched weights that ModelPatcher makes in the same mode
    with torch.inference_mode():
        base = mc.get_model({})
        for _, p in base.named_parameters():
            p.copy_((torch.randn(p.shape, generator=g) * 0.05).to(p.dtype))
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(base, cpu, cpu), base


def sample(model, h=16, w=16, steps=2, seed=0):
    """KSampler (euler, cfg 1) on a zero latent of h x w, in inference mode; returns the final latent."""
    import nodes
    g = torch.Generator().manual_seed(seed)
    cond = [[torch.randn(1, 16, FLUX_CFG["context_in_dim"], generator=g),
             {"pooled_output": torch.randn(1, FLUX_CFG["vec_in_dim"], generator=g), "guidance": 3.5}]]
    latent = {"samples": torch.zeros(1, 16, h, w)}
    with torch.inference_mode():  # as ComfyUI's executor runs every node
        return nodes.common_ksampler(model, seed, steps, 1.0, "euler", "simple", cond, cond, latent)[0]["samples"]


def cosine(a, b) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


def graph_breaks() -> int:
    from torch._dynamo.utils import counters
    return sum(counters["graph_break"].values())


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """(inproc, node module, Inductor cache dir): the Inductor caches of this module's compiles
    go to a fresh folder, which the second-process test reads back."""
    cache = tmp_path_factory.mktemp("inductor")
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    inproc, st = setup_comfy(tmp_path_factory.mktemp("models"))
    if NODE not in st["classes"]:
        pytest.fail(f"the pack did not register {NODE} (pack loaded: {st['pack_loaded']})")
    yield inproc, inproc.node_module(NODE), cache
    if old is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def flux(env):
    mp, base = tiny_flux()
    return mp, base, sample(mp)


# ----------------------------------------------------------------------------- which blocks
def _meta_model(inproc_env, cfg):
    import comfy.model_detection as md
    import tiny_models as tm
    sd = {n: torch.empty(s, dtype=torch.bfloat16, device="meta") for n, s, _ in tm.specs_for(cfg)}
    mc = md.model_config_from_unet(sd, "")
    with torch.device("meta"):
        return mc.get_model(mc.process_unet_state_dict(dict(sd)), "", device="meta").diffusion_model


def test_regions_per_architecture(env):
    import comfy.ldm.wan.model as wan
    import comfy.ops
    import tiny_models as tm
    _, node, _ = env

    def regions(dm, parts="blocks"):
        return {r.name: (len(r.paths), r.kind, r.paths[0]) for r in node.find_regions(dm, parts)}

    flux = regions(_meta_model(env, tm.FLUX_DEV_CONFIG))
    assert flux == {"DoubleStreamBlock": (19, "block", "double_blocks.0"),
                    "SingleStreamBlock": (38, "block", "single_blocks.0")}, flux
    hv = regions(_meta_model(env, tm.HUNYUAN_VIDEO_CONFIG))
    assert hv["DoubleStreamBlock"][:2] == (20, "block") and hv["SingleStreamBlock"][:2] == (40, "block"), hv
    assert "TokenRefinerBlock" not in hv, hv  # 2 nested blocks on the text tokens: left eager
    # SD1.5: the UNet's input/middle/output lists hold differently built TimestepEmbedSequentials;
    # the repeated block is the BasicTransformerBlock of each SpatialTransformer (7 in SD1.5)
    sd = regions(_meta_model(env, tm.SD15_CONFIG))
    assert sd == {"BasicTransformerBlock": (16, "block", "input_blocks.1.1.transformer_blocks.0")}, sd
    with torch.device("meta"):
        w = wan.WanModel(dim=256, ffn_dim=512, num_heads=2, num_layers=3, text_dim=32, freq_dim=64,
                         operations=comfy.ops.disable_weight_init, device="meta")
    assert regions(w) == {"WanAttentionBlock": (3, "block", "blocks.0")}
    assert regions(_meta_model(env, tm.WAN21_14B_CONFIG)) == {"WanAttentionBlock": (40, "block", "blocks.0")}
    glue = regions(_meta_model(env, tm.FLUX_DEV_CONFIG), "blocks+glue")
    assert {k for k, v in glue.items() if v[1] == "glue"} >= {"MLPEmbedder", "LastLayer", "EmbedND"}, glue
    assert glue["MLPEmbedder"][0] == 3  # time_in, vector_in, guidance_in: one class, one compile

    with pytest.raises(ValueError, match="no repeated blocks"):
        node.compile_model(_FakePatcher(torch.nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="dynamic must be one of"):
        node.compile_model(_FakePatcher(w), dynamic="sometimes")


class _FakePatcher:
    def __init__(self, dm):
        self.dm = dm

    def get_model_object(self, name):
        assert name == "diffusion_model"
        return self.dm


class _Guard:
    def __init__(self, name):
        self.name = name


def test_per_block_and_per_resolution_options_carry_no_guard():
    """The guards a compiled block keeps: none on the transformer_options entries ComfyUI rewrites per block, call,
    prompt or resolution (among them 0.33's ``img_slice``, the text and image token counts set before the single
    blocks, which recompiled SingleStreamBlock at every new resolution), nor on the calibrated choices; every other
    guard stays (the attention override, patches, the tensors)."""
    from tritonkit.nodes import compile_model as node
    dropped = ["L['transformer_options']['img_slice']", "L['transformer_options']['img_slice'][1]",
               "L['transformer_options']['block_index']", "L['transformer_options']['uuids'][0]",
               "G['__import_tritonkit_dot_kernels_dot_calibration']._TRACE_CHOICES['attn|x']"]
    kept = ["L['transformer_options']['optimized_attention_override']", "L['transformer_options']['patches']",
            "L['x']", "L['self']._modules['img_mod']", ""]
    assert node._guard_filter([_Guard(n) for n in dropped + kept]) == [False] * len(dropped) + [True] * len(kept)


# ----------------------------------------------------------------------------- compile once, reuse
def test_compiles_once_per_block_class_and_reuses_it(env, flux, tmp_path, monkeypatch):
    inproc, node, _ = env
    mp, base, ref = flux
    # the counts below are those of a first compile: forget the compiled functions that earlier tests
    # made with the same options (the lowvram and attention tests), as a new process would start, and
    # the ahead-of-time entries they saved (a new process would load those: the restart tests)
    node._COMPILED.clear()
    monkeypatch.setattr(node, "artifact_dir", lambda: str(tmp_path))
    m = inproc.call_node(NODE, model=mp, mode="default", dynamic="auto", parts="blocks", cache_size_limit=16)[0]
    assert m is not mp and not mp.wrappers.get("apply_model", {}).get(node.WRAPPER_KEY)
    breaks0 = graph_breaks()
    out = sample(m)
    st = node.stats()
    # 2 steps x (2 double + 3 single blocks) = 10 block calls, through 2 graphs: one per class
    assert st["compiled_block_calls"] == 10 and st["eager_block_calls"] == 0, st
    assert st["graphs_DoubleStreamBlock"] == 1 and st["graphs_SingleStreamBlock"] == 1, st
    assert graph_breaks() == breaks0
    assert cosine(out, ref) > 0.9999, cosine(out, ref)
    # the blocks run their class's forward again once the model is done (nothing left installed)
    assert all("forward" not in vars(b) for b in base.diffusion_model.double_blocks)

    # another resolution: the token dims are dynamic, nothing recompiles
    ref2 = sample(mp, 24, 16)
    out2 = sample(m, 24, 16)
    st = node.stats()
    assert st["graphs"] == 0 and st["compiled_block_calls"] == 10, st
    assert cosine(out2, ref2) > 0.9999

    # an in-place weight patch (how ComfyUI applies a LoRA): no recompile, the new weights are used
    key = "diffusion_model.double_blocks.1.img_mlp.0.weight"
    diff = torch.randn(base.diffusion_model.double_blocks[1].img_mlp[0].weight.shape,
                       generator=torch.Generator().manual_seed(5)) * 0.5
    lora, eager_lora = m.clone(), mp.clone()
    lora.add_patches({key: (diff,)}, 1.0)
    eager_lora.add_patches({key: (diff,)}, 1.0)
    want = sample(eager_lora)
    got = sample(lora)
    assert node.stats()["graphs"] == 0, node.stats()
    assert cosine(got, want) > 0.9999 and cosine(want, ref) < 0.9999  # the patch mattered
    assert "reused the compiled blocks" in node.STATS.summary()


def test_pointwise_and_reduction_kernels_get_one_config_unless_asked(env, monkeypatch):
    """Inductor's pointwise autotuning is off for the block graphs (fewer kernels to compile, as fast
    on an H100), on again with TRITONKIT_COMPILE_POINTWISE_TUNE=1; the reductions without a layout
    hint get Inductor's one-config filter where it has one (TRITONKIT_COMPILE_REDUCTION_TUNE=1: off;
    off too in the max-autotune mode); the saved entries are kept apart."""
    _, node, _ = env
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw["options"]) or fn)
    monkeypatch.setattr(node, "_COMPILED", {})
    monkeypatch.setattr(node.compile_aot, "enabled", lambda: True)
    monkeypatch.delenv(node.POINTWISE_TUNE_ENV, raising=False)
    monkeypatch.delenv(node.REDUCTION_TUNE_ENV, raising=False)
    red = "test_configs.force_filter_reduction_configs"
    has_filter = node._can_filter_reductions()
    from torch._inductor import config as ic
    assert has_filter == hasattr(ic.test_configs, "force_filter_reduction_configs")

    class Block(torch.nn.Module):
        def forward(self, x):
            return x * 2
    off = node.compiled_for(Block, node.Options())
    assert seen[-1]["triton.autotune_pointwise"] is False
    assert off.aot.torch_options["triton.autotune_pointwise"] is False
    assert (seen[-1].get(red) is True) == has_filter and (off.aot.torch_options.get(red) is True) == has_filter
    assert off.aot.opts_key == "default|auto" + (f"|{red}=True" if has_filter else "") + \
        "|triton.autotune_pointwise=False"  # the options sorted by name
    assert node.compiled_for(Block, node.Options()) is off  # one per class and options
    monkeypatch.setenv(node.POINTWISE_TUNE_ENV, "1")
    monkeypatch.setenv(node.REDUCTION_TUNE_ENV, "1")
    on = node.compiled_for(Block, node.Options())
    assert on is not off and "triton.autotune_pointwise" not in seen[-1] and red not in seen[-1]
    assert on.aot.opts_key == "default|auto"  # what entries saved before these settings existed are keyed by
    monkeypatch.delenv(node.REDUCTION_TUNE_ENV)
    node.compiled_for(Block, node.Options(mode="max-autotune-no-cudagraphs"))
    assert red not in seen[-1] and seen[-1]["max_autotune"] is True


def test_compile_workers_start_when_the_node_runs(env, flux, tmp_path, monkeypatch):
    """The node starts Inductor's compile workers when it runs (before ComfyUI encodes the prompt
    and loads the model), for the model's load device, where a block class has no saved entry;
    not where every class has one (a warm restart compiles nothing)."""
    _, node, _ = env
    compile_aot = node.compile_aot
    mp, _, _ = flux
    started = []
    monkeypatch.setattr(node, "warm_compile_workers", lambda device: started.append(device) or True)
    monkeypatch.setattr(node, "artifact_dir", lambda: str(tmp_path))
    monkeypatch.setattr(compile_aot, "enabled", lambda: True)
    monkeypatch.setattr(node, "_COMPILED", {})
    m, _ = node.compile_model(mp)
    assert started == [torch.device(mp.load_device)], started
    # every class saved: nothing is started
    prepare = m.wrappers["outer_sample"][node.WRAPPER_KEY][0].prepare
    monkeypatch.setattr(compile_aot.Entries, "saved_any", lambda self: True)
    started.clear()
    assert prepare(torch.device("cpu")) is False and started == []
    monkeypatch.setattr(compile_aot.Entries, "saved_any", lambda self: False)
    assert prepare(torch.device("cpu")) is True and started == [torch.device("cpu")]


def test_static_shapes_and_the_cache_size_limit(env, flux):
    inproc, node, _ = env
    mp, _, _ = flux
    m = inproc.call_node(NODE, model=mp, mode="default", dynamic="false", parts="blocks", cache_size_limit=1)[0]
    sample(m, 16, 16, steps=1)
    assert node.stats()["graphs"] == 2  # static shapes: still one graph per class, not one per block
    # a new shape is over the limit of 1 variant per class: those blocks run eagerly, and right
    out = sample(m, 16, 24, steps=1)
    assert node.stats()["graphs"] == 0
    assert cosine(out, sample(mp, 16, 24, steps=1)) > 0.9999


def test_lowvram_blocks_run_eager(env, flux):
    inproc, node, _ = env
    mp, base, ref = flux
    m = inproc.call_node(NODE, model=mp, mode="default", dynamic="auto", parts="blocks", cache_size_limit=16)[0]
    # A weight function on one module of the last single block, as ModelPatcher's loader sets one
    # for a LoRA in lowvram mode (LowVramPatch). It goes through the loader too (a weight wrapper,
    # a new patches uuid): a function set on the module by hand is wiped whenever sampling reloads
    # the model, which it does when the model last ran with other weight patches (the LoRA clone
    # of test_compiles_once_per_block_class_and_reuses_it), so this test would depend on the order.
    low = m.clone()
    low.add_weight_wrapper("diffusion_model.single_blocks.2.linear2.weight", lambda w: w)
    out = sample(low)
    assert base.diffusion_model.single_blocks[2].linear2.weight_function, "the loader set no weight function"
    st = node.stats()
    assert st["eager_block_calls"] == 2 and st["compiled_block_calls"] == 8, st
    assert cosine(out, ref) > 0.9999
    meta = torch.nn.Linear(2, 2, device="meta")
    assert "not on the compute device" in node.block_problem(meta, torch.device("cpu"))


def test_comfy_torch_compile_model_stays_in_charge(env, flux):
    """ComfyUI's TorchCompileModel after our node: it compiles the whole model as it does without
    ours (here with Dynamo's eager backend, to keep Inductor out of it), ours steps aside."""
    from comfy_api.torch_helpers import set_torch_compile_wrapper
    inproc, node, _ = env
    mp, _, ref = flux
    m = inproc.call_node(NODE, model=mp, mode="default", dynamic="auto", parts="blocks", cache_size_limit=16)[0]
    both = m.clone()
    set_torch_compile_wrapper(model=both, backend="eager")
    out = sample(both)
    assert node.STATS.stepped_aside and node.stats()["compiled_block_calls"] == 0
    _, text = node.compile_model(both)   # the other order: the node says so up front
    assert "TorchCompileModel is already on this model" in text
    assert "TorchCompileModel" in node.STATS.summary()
    assert cosine(out, ref) > 0.9999


def test_with_triton_attention_and_fp8_fallback_no_graph_breaks(env, monkeypatch):
    inproc, node, _ = env
    monkeypatch.setenv("TRITONKIT_FORCE_TRITON_ON_CPU", "1")   # the pack's kernels via the Triton interpreter
    mp, _ = tiny_flux(torch.float8_e4m3fn, seed=1)
    m = inproc.call_node("TritonKitFp8Fallback", model=mp, mode="cast-only")[0]
    m = inproc.call_node("TritonKitAttention", model=m, mode="exact")[0]
    ref = sample(m)
    c = inproc.call_node(NODE, model=m, mode="default", dynamic="auto", parts="blocks", cache_size_limit=16)[0]
    breaks0 = graph_breaks()
    out = sample(c)
    st = node.stats()
    assert graph_breaks() == breaks0
    assert st["graphs_DoubleStreamBlock"] == 1 and st["graphs_SingleStreamBlock"] == 1, st
    assert st["compiled_block_calls"] == 10
    attn = inproc.node_module("TritonKitAttention").stats()
    assert attn["served"] > 0 and attn["fallback"] == 0, attn
    assert cosine(out, ref) > 0.9999


def detected(sd: dict, dtype=torch.float32):
    """(ModelPatcher, BaseModel) of the ComfyUI class that model detection finds for the state dict ``sd``, as
    UNETLoader does; ``dtype`` fp8 stores the weights in fp8 with float32 compute."""
    import comfy.model_detection as md
    import comfy.model_patcher
    mc = md.model_config_from_unet(sd, "")
    mc.set_inference_dtype(dtype, None if dtype == torch.float32 else torch.float32)
    with torch.inference_mode():
        base = mc.get_model(mc.process_unet_state_dict(dict(sd)), "")
        base.load_model_weights(sd, "")
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(base, cpu, cpu), base


def tiny_wan(dtype=torch.float32, seed=0):
    """(ModelPatcher, BaseModel) of ComfyUI's WAN 2.1 T2V from tiny_models' tiny config (dim 256, 2 heads, 1
    block): see :func:`detected`."""
    import tiny_models as tm
    return detected(tm.make_wan_state_dict(dtype=dtype, seed=seed), dtype)


def test_wan_with_triton_attention_and_fp8_fallback_no_graph_breaks(env, monkeypatch):
    """WAN 2.1 through both nodes and the Triton Compile Model: one compiled graph for its block class, no
    graph break, every attention call through the kernel (the interpreter), the result as eager."""
    import nodes
    inproc, node, _ = env
    monkeypatch.setenv("TRITONKIT_FORCE_TRITON_ON_CPU", "1")
    mp, _ = tiny_wan(torch.float8_e4m3fn, seed=2)
    m = inproc.call_node("TritonKitFp8Fallback", model=mp, mode="cast-only")[0]
    m = inproc.call_node("TritonKitAttention", model=m, mode="exact")[0]
    g = torch.Generator().manual_seed(3)
    cond = [[torch.randn(1, 8, 4096, generator=g), {}]]
    latent = {"samples": torch.zeros(1, 16, 2, 8, 8)}

    def run(model):
        with torch.inference_mode():
            return nodes.common_ksampler(model, 0, 2, 1.0, "euler", "simple", cond, cond, latent)[0]["samples"]
    attn = inproc.node_module("TritonKitAttention")
    attn.reset_stats()
    ref = run(m)
    served = attn.stats()  # eager calls (a compiled graph's calls are not counted there)
    assert served["served"] == served["served_exact"] == 4 and served["fallback"] == 0, served
    c = inproc.call_node(NODE, model=m, mode="default", dynamic="auto", parts="blocks", cache_size_limit=16)[0]
    breaks0 = graph_breaks()
    kernel_calls = []
    # what the compiled graph's custom op runs, looked up at each call, in the copy of the pack that defined the
    # op (the first imported: kernels/runtime.op_exists), which need not be the one ComfyUI loaded here
    for mod in {id(m): m for name, m in list(sys.modules.items())
                if name.endswith("kernels.attention") and hasattr(m, "_attention_impl")}.values():
        monkeypatch.setattr(mod, "_attention_impl", lambda *a, real=mod._attention_impl, **kw:
                            kernel_calls.append(1) or real(*a, **kw))
    out = run(c)
    st = node.stats()
    assert graph_breaks() == breaks0
    assert st["graphs_WanAttentionBlock"] == 1, st
    assert st["compiled_block_calls"] >= 2, st
    assert len(kernel_calls) == 4  # self- and cross-attention of the block, 2 steps, inside the compiled block
    assert cosine(out, ref) > 0.9999


# ----------------------------------------------------------------------------- new sizes, calibrated nodes
def tiny_hunyuan_video(dtype=torch.float32, seed=0):
    """(ModelPatcher, BaseModel) of ComfyUI's HunyuanVideo from tiny_models' tiny config (hidden
    256, 2 heads, 1 double + 1 single block, 2 token-refiner blocks): see :func:`detected`."""
    import tiny_models as tm
    return detected(tm.make_hunyuan_video_state_dict(dtype=dtype, seed=seed), dtype)


def sample_video(model, frames, h=8, w=8, steps=2, seed=0):
    """KSampler (euler, cfg 1, guidance 6) on a zero HunyuanVideo latent of ``frames`` latent frames."""
    import nodes
    g = torch.Generator().manual_seed(seed)
    cond = [[torch.randn(1, 16, 32, generator=g), {"pooled_output": torch.randn(1, 768, generator=g), "guidance": 6.0}]]
    latent = {"samples": torch.zeros(1, 16, frames, h, w)}
    with torch.inference_mode():
        return nodes.common_ksampler(model, seed, steps, 1.0, "euler", "simple", cond, cond, latent)[0]["samples"]


class PhasedTimer:
    """Calibration timer (kernels/calibration.py ``set_timer``): fixed times per path name from
    ``phases[phase]``, never running the path; ``phase`` moves on between sizes, so another size
    can measure another path faster."""

    def __init__(self, *phases):
        self.phases, self.phase, self.asked = phases, 0, 0

    def __call__(self, name, fn):
        self.asked += 1
        return self.phases[self.phase][name]


FAST_KERNELS = {"comfy": 3.0, "exact": 1.0, "int8": 2.0, "torch": 3.0, "decode": 1.0, "fused": 2.0}
FAST_COMFY = {"comfy": 1.0, "exact": 3.0, "int8": 2.0, "torch": 1.0, "decode": 3.0, "fused": 2.0}


@pytest.fixture
def calibrated(env, tmp_path, monkeypatch):
    """(inproc, node, calibration module, set_timer): the pack's kernels through the Triton
    interpreter, an empty calibration store, a fake timer."""
    import importlib
    inproc, node, _ = env
    monkeypatch.setenv("TRITONKIT_FORCE_TRITON_ON_CPU", "1")
    monkeypatch.setenv("TRITONKIT_CALIBRATION_DIR", str(tmp_path / "calibration"))
    for var in ("TRITONKIT_CALIBRATION", "TRITONKIT_ATTN_PATH", "TRITONKIT_FP8_PATH"):
        monkeypatch.delenv(var, raising=False)
    C = importlib.import_module(node.__name__.rsplit(".nodes", 1)[0] + ".kernels.calibration")
    C.reset()
    yield inproc, node, C
    C.set_timer(None)
    C.reset()
    # the paths measured here fall back to ComfyUI's attention on purpose: leave no such count
    # to the tests that read the attention node's counters
    inproc.node_module("TritonKitAttention").reset_stats()


def _calibrated_compile(inproc, mp):
    m = inproc.call_node("TritonKitFp8Fallback", model=mp, mode="auto")[0]
    m = inproc.call_node("TritonKitAttention", model=m, mode="auto")[0]
    return m, inproc.call_node(NODE, model=m, mode="default", dynamic="auto", parts="blocks", cache_size_limit=16)[0]


def test_hunyuan_video_frame_change_with_calibrated_nodes_no_recompile(calibrated):
    """fp8 Fallback (auto) and Attention (auto) before the node: another frame count (64 -> 96
    tokens, another pow2 bucket) reuses the compiled blocks. Before the fix the calibration key
    bucketed the token count while tracing, which specialised the dynamic token dim (a guard
    ``s0 == 64``) and recompiled both stream blocks."""
    inproc, node, C = calibrated
    timer = PhasedTimer(FAST_KERNELS)
    C.set_timer(timer)
    m, c = _calibrated_compile(inproc, tiny_hunyuan_video(torch.float8_e4m3fn)[0])
    breaks0 = graph_breaks()
    # each size: the first step runs eagerly and calibrates (nodes/calibration.py), the second compiles
    sample_video(c, 3)
    st = node.stats()
    assert st["graphs_DoubleStreamBlock"] == 1 and st["graphs_SingleStreamBlock"] == 1, st
    asked = timer.asked
    assert asked > 0
    out = sample_video(c, 5)
    st = node.stats()
    assert timer.asked > asked  # the new size was calibrated (new token buckets)
    assert st["graphs"] == 0 and st["compiled_block_calls"] == 4, st  # 2 steps x 2 blocks (the refiner's stay eager)
    assert graph_breaks() == breaks0
    assert cosine(out, sample_video(m, 5)) > 0.9999


def test_flux_bucket_crossing_resolution_with_calibrated_nodes_no_recompile(calibrated):
    """Flux 16x16 -> 24x24 latent (80 -> 160 tokens: pow2 bucket 128 -> 256), with the second size
    measuring ComfyUI's paths faster: the compiled blocks are reused with the paths of the size
    they were traced at (the node drops the guards on those choices), and the result matches."""
    inproc, node, C = calibrated
    timer = PhasedTimer(FAST_KERNELS, FAST_COMFY)
    C.set_timer(timer)
    m, c = _calibrated_compile(inproc, tiny_flux(torch.float8_e4m3fn, seed=2)[0])
    breaks0 = graph_breaks()
    sample(c)
    st = node.stats()
    assert st["graphs_DoubleStreamBlock"] == 1 and st["graphs_SingleStreamBlock"] == 1, st
    timer.phase = 1
    out = sample(c, 24, 24)
    st = node.stats()
    assert st["graphs"] == 0 and st["compiled_block_calls"] == 10, st
    assert graph_breaks() == breaks0
    assert any(k.startswith("attention|") and "|Lq256|" in k and v["choice"] == "comfy"
               for k, v in C.stored_choices(torch.device("cpu")).items()), "the new bucket was not calibrated"
    assert cosine(out, sample(m, 24, 24)) > 0.9999


# ----------------------------------------------------------------------------- warm restart
def child_main(out_path, sizes=((16, 16),)):
    """A second process: builds the same tiny Flux, samples it through the node at each of
    ``sizes`` (the compile counters summed over them), writes the stats, the log and the latents."""
    import logging
    records = []

    class Keep(logging.Handler):
        def emit(self, rec):
            records.append(rec.getMessage())

    logging.getLogger("TritonKit").addHandler(Keep())
    logging.getLogger("TritonKit").setLevel(logging.INFO)
    inproc, _ = setup_comfy(Path(out_path).parent)
    node = inproc.node_module(NODE)
    mp, _ = tiny_flux()
    m = inproc.call_node(NODE, model=mp, mode="default", dynamic="auto", parts="blocks", cache_size_limit=16)[0]
    total: dict = {}
    latents = []
    for h, w in sizes:
        latents.append(sample(m, h, w))
        for k, v in node.stats().items():
            total[k] = total.get(k, 0) + v
    torch.save(latents, str(out_path) + ".pt")
    Path(out_path).write_text(json.dumps({"stats": total, "log": records}))


def _child(cache: Path, out: Path, sizes=((16, 16),), **env_extra) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache), PYTHONPATH=os.pathsep.join(
        [str(TESTS)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]), **env_extra)
    code = f"import test_compile_model as t; t.child_main({str(out)!r}, {tuple(sizes)!r})"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                       cwd=str(out.parent))
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(out.read_text())
    res["latents"] = torch.load(str(out) + ".pt")
    return res


def test_second_process_loads_from_the_caches(env, tmp_path):
    """More ComfyUI processes on this module's Inductor cache folder (its C++ runtime already
    built, which costs ~25 s in an empty one). The first compiles the tiny Flux, or finds it
    there. Where torch has ahead-of-time compile, the second loads both block classes without
    tracing them, also at a second resolution, and samples what the first sampled; with it
    switched off (TRITONKIT_COMPILE_AOT=0) Dynamo traces them again and Inductor's FX-graph cache
    serves both graphs."""
    from tritonkit.nodes import compile_aot
    _, node, cache = env
    first = _child(cache, tmp_path / "first.json")
    assert first["stats"]["graphs"] in (0, 2), first["stats"]  # 0: a test before this one saved them
    if node.portable_cache_available():
        art = list((cache / node.ARTIFACT_FOLDER).glob("artifacts-*.bin"))
        assert art and art[0].stat().st_size > 0, "no cache artefacts written"
    if compile_aot.available():
        saved = list((cache / node.ARTIFACT_FOLDER).glob(f"{compile_aot.FOLDER_PREFIX}*/*.bin"))
        assert len(saved) >= 2, saved
        warm = _child(cache, tmp_path / "warm.json", sizes=((16, 16), (24, 16)))
        st = warm["stats"]
        assert st["graphs"] == 0 and st["aot_loaded"] == 2 and st["compiled_block_calls"] == 20, st
        assert any("loaded ahead-of-time" in line for line in warm["log"]), warm["log"]
        assert not any("does not fit" in line or "could not" in line for line in warm["log"]), warm["log"]
        assert cosine(warm["latents"][0], first["latents"][0]) > 0.9999
        assert warm["latents"][1].shape[-2:] == (24, 16) and torch.isfinite(warm["latents"][1]).all()
    # without ahead-of-time entries (an older torch): the first such process fills Inductor's FX-graph
    # cache (an ahead-of-time compile does not write it); in the next Dynamo traces each block class
    # again (2 graphs) and Inductor serves both from that cache: no fresh code generation
    _child(cache, tmp_path / "off1.json", TRITONKIT_COMPILE_AOT="0")
    off = _child(cache, tmp_path / "off.json", TRITONKIT_COMPILE_AOT="0")
    st = off["stats"]
    assert st["graphs"] == 2 and st["cache_fx_hit"] == 2 and st["cache_fx_miss"] == 0, st
    assert st["aot_loaded"] == 0 and st["aot_compiled"] == 0, st
    summary = [line for line in off["log"] if "graph(s) compiled" in line]
    assert summary and "from the caches" in summary[-1], off["log"]
    assert cosine(off["latents"][0], first["latents"][0]) > 0.9999
    if node.portable_cache_available():
        assert any("loaded saved compile artefacts" in line for line in off["log"]), off["log"]


def test_a_corrupt_saved_block_compiles_afresh(env, tmp_path):
    """A saved ahead-of-time block that cannot be loaded (a truncated write, another torch's
    format) is reported once and compiled again, and the run samples what an intact one does."""
    from tritonkit.nodes import compile_aot
    if not compile_aot.available():
        pytest.skip(f"torch {torch.__version__} has no ahead-of-time compile (torch.compiler.load_compiled_function)")
    _, node, _ = env
    cache = tmp_path / "inductor"
    first = _child(cache, tmp_path / "first.json")
    saved = sorted((cache / node.ARTIFACT_FOLDER).glob(f"{compile_aot.FOLDER_PREFIX}*/*.bin"))
    assert len(saved) == 2 and first["stats"]["aot_compiled"] == 2, (saved, first["stats"])
    saved[0].write_bytes(saved[0].read_bytes()[:100])   # truncated
    saved[1].write_bytes(b"not a compiled function")    # foreign
    again = _child(cache, tmp_path / "again.json")
    st = again["stats"]
    assert st["aot_loaded"] == 0 and st["aot_compiled"] == 2 and st["graphs"] == 2, st
    assert sum("could not load the saved" in line for line in again["log"]) == 2, again["log"]
    assert cosine(again["latents"][0], first["latents"][0]) > 0.9999
    assert all(p.stat().st_size > 1000 for p in saved)  # written again, whole


def test_artefacts_live_in_the_cache_folder_install_py_clears(env, tmp_path, monkeypatch):
    """The artefacts sit inside the Inductor cache folder that install.py's cache step measures
    and empties (diagnostics.environment.cache_dirs: the same folder torch uses), under a key that
    changes with the pack's code."""
    from tritonkit.diagnostics import environment
    from tritonkit.installer import caches
    _, node, _ = env
    short = tmp_path / "tk" / "inductor"           # a short folder as tritonkit_settings.json sets it
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(short))
    assert environment.cache_dirs(dict(os.environ))["inductor"] == str(short)
    path = Path(node.artifact_path())
    assert path.parent == short / node.ARTIFACT_FOLDER and node.artifact_key() in path.name
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x" * 10)
    freed, errors = caches.empty_folder(str(short))
    assert not errors and freed >= 10 and not path.exists() and short.is_dir()
    key = node.artifact_key()
    monkeypatch.setattr(node, "_pack_version", lambda: "another")
    assert node.artifact_key() != key
