"""bench/workflow.py at tiny size on CPU: the end-to-end fp8 workflow (UNETLoader fp8 →
Triton fp8 Fallback → Triton Attention → TorchCompileModel → KSampler) through ComfyUI's own
node classes, with the pack's Triton path forced on CPU (TRITONKIT_FORCE_TRITON_ON_CPU=1,
the Triton interpreter).

The model is the tiny HunyuanVideo (hidden 256, 1 double + 1 single Flux block and the token
refiner, which calls ComfyUI's attention directly): the same comfy.ldm.flux.layers blocks as
Flux, at a size 2 CPU cores sample in about a second a step. (The tiny Flux has to keep
hidden 3072 — ComfyUI's detection forces it — and costs ~20 s a step here.)

The benchmark runs in a subprocess (it imports ComfyUI in-process, whose top-level modules
``nodes``, ``utils``, ``server``… must not leak into the test process). It checks:

* the table and JSON are produced, one row per run;
* every patched run equals the default run within its mode's tolerance;
* every attention call went through the Triton kernel (none fell back), every fp8 layer
  through the fp8 kernels;
* under TorchCompileModel (backend "eager": dynamo only, so this stays fast on CPU), the
  patched model compiles without graph breaks and without a recompile after the first step.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

pytestmark = pytest.mark.comfyui  # the bench imports ComfyUI in its subprocess

PLAN = ("hunyuan:default,hunyuan:attn-exact,hunyuan:attn-8bit,hunyuan:both-cast,hunyuan:both-cast:compiled,"
        "hunyuan:default,hunyuan-scaled:default,hunyuan-scaled:fp8-cast")

# final-latent tolerances against the same model's default run (2 euler steps, fp32 on CPU).
# cast-only decodes fp8 exactly, so it must match to float rounding.
TOL = {"hunyuan-scaled:fp8-cast": (1e-5, 0.999999),
       "hunyuan:attn-exact": (1e-3, 0.99999), "hunyuan:attn-8bit": (5e-2, 0.999),
       "hunyuan:both-cast": (5e-2, 0.999), "hunyuan:both-cast:compiled": (5e-2, 0.999)}


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    from comfy_harness import comfyui_available
    if not comfyui_available():
        pytest.fail("ComfyUI is not set up: run scripts/setup_env.sh (the README's test command does)")
    out = tmp_path_factory.mktemp("workflow")
    env = {**os.environ, "TRITONKIT_FORCE_TRITON_ON_CPU": "1", "PYTHONUNBUFFERED": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TRITONKIT_FORCE_ARCH", None)
    cmd = [sys.executable, str(REPO / "bench" / "workflow.py"), "--preset", "tiny", "--plan", PLAN,
           "--steps", "2", "--compile-backend", "eager", "--out", str(out),
           "--models-dir", str(tmp_path_factory.mktemp("models"))]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-6000:]
    doc = json.loads((out / "workflow.json").read_text())
    return {"doc": doc, "runs": {r["run"]: r for r in doc["runs"]}, "md": (out / "workflow.md").read_text(),
            "log": log}


def _ok(bench, label):
    r = bench["runs"][label]
    assert not r.get("error"), f"{label} failed: {r.get('error')}\n{r.get('traceback', '')[-3000:]}"
    assert not r.get("skipped"), f"{label} skipped: {r['skipped']}"
    return r


def test_table_and_json(bench):
    md, doc = bench["md"], bench["doc"]
    assert "| run | fp8 Fallback | Attention | compiled |" in md
    labels = [r["run"] for r in doc["runs"]]
    assert labels == [s if i != 5 else s + "#2" for i, s in enumerate(PLAN.split(","))], labels
    for label in labels:
        assert f"| {label} |" in md, f"no row for {label}"
    from comfy_harness import comfyui_version
    assert doc["versions"]["comfyui"] == comfyui_version()
    assert doc["pack_loaded"] is True
    assert doc["nodes_not_registered_by_pack"] == []
    m = doc["models"]["hunyuan"]
    assert m["weight_dtype"] == "fp8_e4m3fn" and m["image_tokens"] == 2 * 4 * 4
    for r in doc["runs"]:
        _ok(bench, r["run"])
        assert r["forward_calls"] == 2 and len(r["step_times_s"]) == 2 and r["s_per_step"] > 0
        assert r["finite"], r["run"]


@pytest.mark.parametrize("label", sorted(TOL))
def test_patched_matches_default(bench, label):
    r = _ok(bench, label)
    rel, cos = TOL[label]
    assert r["rel_err"] <= rel and r["cosine"] >= cos, (label, r["rel_err"], r["cosine"])


@pytest.mark.parametrize("label", ["hunyuan:attn-exact", "hunyuan:attn-8bit", "hunyuan:both-cast"])
def test_every_attention_call_served(bench, label):
    c = _ok(bench, label)["attention_counters"]
    # 2 refiner blocks + 1 double + 1 single block = 4 attention calls per forward, 2 forwards
    assert c.get("served", 0) == 8, c
    assert c.get("fallback", 0) == 0, c
    if label == "hunyuan:attn-8bit":
        assert c.get("served_int8", 0) == 8, c
    assert isinstance(_ok(bench, label)["attention_tuned"], dict)  # recorded (empty on CPU: nothing timed)


@pytest.mark.parametrize("label", ["hunyuan:both-cast", "hunyuan:both-cast:compiled", "hunyuan-scaled:fp8-cast"])
def test_every_fp8_layer_through_kernels(bench, label):
    r = _ok(bench, label)
    c = r["fp8_counters"]
    # UNETLoader(fp8_e4m3fn) stores every op's weight in fp8: 36 Linear, 4 LayerNorm, 1 Conv3d, and where this
    # ComfyUI builds the QK norms of the double and single blocks as its RMSNorm ops (after 0.8; before, their
    # scales are plain parameters outside ops), their 6 RMSNorm
    kinds = r["fp8_layers_by_op"]
    assert {k: kinds.get(k) for k in ("Linear", "LayerNorm", "Conv3d")} == {"Linear": 36, "LayerNorm": 4,
                                                                          "Conv3d": 1}, kinds
    assert kinds.get("RMSNorm", 0) in (0, 6) and set(kinds) <= {"Linear", "LayerNorm", "Conv3d", "RMSNorm"}, kinds
    assert c["fp8_layers"] == sum(kinds.values()) and c["layers_patched"] == c["fp8_layers"], c
    # cast-only: one decode launch per fp8 layer per forward, for its weight only (the fp8 biases
    # are decoded once when the node runs; per call they were half of Flux's launches)
    assert c.get("launches_decode", 0) == r["forward_calls"] * c["fp8_layers"], c
    if not r["compiled"]:  # the node counts layers in eager only; the kernels count launches always
        assert c.get("layers_through_triton") == c["fp8_layers"], c
    assert not any(k.startswith("fallback") for k in c), c


@pytest.mark.parametrize("label", ["hunyuan:default", "hunyuan:default#2", "hunyuan-scaled:default"])
def test_default_runs_untouched(bench, label):
    """Runs without the nodes use none of the pack's kernels, also right after patched runs of
    the same model (the clones' object patches and attention override must not leak)."""
    r = _ok(bench, label)
    assert not any(v for k, v in r["fp8_counters"].items() if k.startswith("launches_")), r["fp8_counters"]
    assert r["attention_counters"].get("served", 0) == 0, r["attention_counters"]
    assert r["rel_err"] == 0.0, r["rel_err"]


def test_compiled_no_graph_break_no_recompile(bench):
    r = _ok(bench, "hunyuan:both-cast:compiled")
    d = r["dynamo"]
    assert d["graph_breaks"] == 0, d["graph_break_reasons"]
    assert d["frames_after_first_step"] == 0, d
    assert d["recompiles"] == 0 and d["first_compiling_step"] == 1, d
    # the compiled graph still calls the fp8 kernels (opaque custom ops), every step
    assert r["fp8_counters"].get("launches_decode", 0) >= 2 * r["fp8_counters"]["fp8_layers"], r["fp8_counters"]


# --------------------------------------------------------------------------- no ComfyUI needed
def test_run_spec_parse_and_report():
    import torch
    import workflow as wf
    r = wf.Run.parse("flux:both:compiled@86")
    assert (r.model, r.config, r.compiled, r.arch, r.label) == ("flux", "both", True, "86", "flux:both:compiled@86")
    with pytest.raises(ValueError):
        wf.Run.parse("flux:nope")
    ref = torch.randn(1, 16, 8, 8)
    results = [
        {"run": "flux:default", "model": "flux", "config": "default", "fp8": None, "attention": None,
         "compiled": False, "arch": "native", "s_per_step": 2.0, "first_step_s": 2.5, "latent": ref},
        {"run": "flux:both", "model": "flux", "config": "both", "fp8": "auto", "attention": "auto",
         "compiled": False, "arch": "native", "s_per_step": 1.0, "first_step_s": 1.5, "latent": ref * 1.01},
        {"run": "flux:both:compiled", "model": "flux", "config": "both", "compiled": True, "arch": "native",
         "error": "RuntimeError: boom"},
        {"run": "flux:default:compiled", "model": "flux", "config": "default", "fp8": None, "attention": None,
         "compiled": True, "arch": "native", "s_per_step": 1.0, "first_step_s": 9.0, "latent": ref * 2},
        {"run": "flux:fp8:compiled", "model": "flux", "config": "fp8", "fp8": "auto", "attention": None,
         "compiled": True, "arch": "native", "s_per_step": 0.5, "first_step_s": 9.0, "latent": ref * 2},
    ]
    meta = {"versions": {"cpu": "x", "cpu_count": 2, "torch": "t", "triton": "tr", "python": "p", "comfyui": "c"},
            "command": "cmd", "steps": 2, "models": {}}
    doc, md = wf.write_outputs(None, meta, results)
    both = doc["runs"][1]
    assert both["speedup_vs_default_eager"] == pytest.approx(2.0)
    assert both["cosine"] == pytest.approx(1.0) and both["rel_err"] == pytest.approx(0.01, rel=1e-4)
    assert "FAILED: RuntimeError: boom" in md and "latent" not in doc["runs"][0]
    # compiled runs: speed-up against both defaults, accuracy against the eager and the compiled default
    fc = doc["runs"][4]
    assert fc["speedup_vs_default_same_mode"] == pytest.approx(2.0) and fc["speedup_vs_default_eager"] == pytest.approx(4.0)
    assert fc["rel_err"] == pytest.approx(1.0, rel=1e-4) and fc["rel_err_vs_default_compiled"] == 0.0
    assert "vs default compiled: rel err 0.0000" in md


def test_regional_runs_report_against_their_twins():
    """MODEL:CONFIG:regional rows (Triton Compile Model): s/step against the same configuration
    under TorchCompileModel, the latent against its eager twin, the cold / second-size / warm-restart
    compile times in the notes; a regional default is never taken for the eager default."""
    import torch
    import workflow as wf
    r = wf.Run.parse("flux:both:regional@86")
    assert (r.regional, r.compiled, r.label) == (True, False, "flux:both:regional@86")
    ref = torch.randn(1, 16, 8, 8)
    results = [
        {"run": "flux:both:regional", "model": "flux", "config": "both", "fp8": "auto", "attention": "auto",
         "compiled": False, "regional": True, "arch": "native", "s_per_step": 1.02, "first_step_s": 9.0,
         "compile_s": 7.98, "latent": ref * 1.001, "second_res": {"latent_shape": [1, 16, 6, 6], "compile_s": 0.4,
                                                                   "frames_compiled": 0},
         "warm_restart": {"compile_s": 2.5}, "compile_node_summary": "2 graph(s) compiled"},
        {"run": "flux:default", "model": "flux", "config": "default", "fp8": None, "attention": None,
         "compiled": False, "arch": "native", "s_per_step": 2.0, "first_step_s": 2.5, "latent": ref * 3},
        {"run": "flux:both", "model": "flux", "config": "both", "fp8": "auto", "attention": "auto",
         "compiled": False, "arch": "native", "s_per_step": 1.5, "first_step_s": 1.5, "latent": ref},
        {"run": "flux:both:compiled", "model": "flux", "config": "both", "fp8": "auto", "attention": "auto",
         "compiled": True, "arch": "native", "s_per_step": 1.0, "first_step_s": 70.0, "compile_s": 69.0,
         "latent": ref},
    ]
    meta = {"versions": {"cpu": "x", "cpu_count": 2, "torch": "t", "triton": "tr", "python": "p", "comfyui": "c"},
            "command": "cmd", "steps": 2, "models": {}}
    doc, md = wf.write_outputs(None, meta, results)
    reg = doc["runs"][0]
    assert reg["s_per_step_vs_torchcompile"] == pytest.approx(1.02) and reg["torchcompile_compile_s"] == 69.0
    assert reg["cosine_vs_eager_twin"] == pytest.approx(1.0)
    assert reg["default_eager_ref"] == "flux:default"   # not the regional row itself
    assert "regional: cold compile 8.0 s (TorchCompileModel 69.0 s), 2nd size [1, 16, 6, 6] 0.4 s" in md
    assert "warm restart 2.5 s" in md and "x1.020 of TorchCompileModel" in md


def test_arch_simulation_compares_with_the_default_of_that_arch(monkeypatch, tmp_path):
    """@86 rows are timed against default@86 (ComfyUI's SDPA as torch runs it on an sm86: no cuDNN),
    accuracy stays against the native default; without a default@86 the native one is used."""
    import torch
    import workflow as wf
    assert [wf.sdpa_backend(a, "cuda") for a in ("86", "89", "90", "100", "120")] == \
        ["flash", "flash", "cuDNN", "cuDNN", "flash"]
    assert wf.sdpa_backend("86", "cpu") is None
    flags = []
    monkeypatch.setattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: True)
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", flags.append)
    with wf._sdpa_as_on("86", "cuda"):
        assert flags == [False]
    assert flags == [False, True]
    with wf._sdpa_as_on("90", "cuda"), wf._sdpa_as_on("native", "cuda"), wf._sdpa_as_on("86", "cpu"):
        pass
    assert flags == [False, True]
    # compiled runs never hit Inductor's / AOTAutograd's caches (a hit reused a cuDNN-SDPA graph in an @89 run)
    import torch._functorch.config as fcfg
    import torch._inductor.config as icfg
    was = (icfg.fx_graph_cache, fcfg.enable_autograd_cache)
    with wf._cold_compile(True):
        assert (icfg.fx_graph_cache, fcfg.enable_autograd_cache) == (False, False)
    with wf._cold_compile(False):
        assert (icfg.fx_graph_cache, fcfg.enable_autograd_cache) == was
    assert (icfg.fx_graph_cache, fcfg.enable_autograd_cache) == was
    # --warm-rounds: Inductor's caches in the configuration's own folder for the run, then back
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    before = cache_dir()
    own = str(tmp_path / "flux-both-compiled-at86")
    with wf._cold_compile(True, own):
        assert cache_dir() == own and (icfg.fx_graph_cache, fcfg.enable_autograd_cache) == was
    assert cache_dir() == before
    ref = torch.randn(1, 16, 8, 8)

    def row(config, arch, s, latent, compiled=False):
        return {"run": f"flux:{config}{':compiled' if compiled else ''}" + ("" if arch == "native" else f"@{arch}"),
                "model": "flux", "config": config, "fp8": None, "attention": None, "compiled": compiled,
                "arch": arch, "sdpa": "flash" if arch == "86" else "cuDNN", "s_per_step": s, "first_step_s": s,
                "latent": latent}
    results = [row("default", "native", 1.0, ref), row("default", "86", 1.5, ref * 1.02),
               row("both", "86", 1.0, ref * 1.01), row("both", "native", 0.5, ref),
               row("both", "86", 0.75, ref, compiled=True)]
    meta = {"versions": {"cpu": "x", "cpu_count": 2, "torch": "t", "triton": "tr", "python": "p", "comfyui": "c"},
            "command": "cmd", "steps": 2, "models": {}}
    doc, md = wf.write_outputs(None, meta, results)
    r = {x["run"]: x for x in doc["runs"]}
    assert r["flux:both@86"]["speedup_vs_default_eager"] == pytest.approx(1.5)
    assert r["flux:both@86"]["default_eager_ref"] == "flux:default@86"
    assert r["flux:both@86"]["rel_err"] == pytest.approx(0.01, rel=1e-4)  # against the native default
    assert r["flux:both"]["speedup_vs_default_eager"] == pytest.approx(2.0)
    # no default:compiled@86 (a real sm86 cannot compile ComfyUI's fp8 path): same-mode is the native one
    assert r["flux:both:compiled@86"]["speedup_vs_default_eager"] == pytest.approx(2.0)
    assert "ComfyUI's SDPA on flash; × against flux:default@86" in md


def test_arch_simulation_forces_comfyuis_fp8_compute_answer(monkeypatch):
    """@86 (below sm89): ComfyUI's supports_fp8_compute answers False while the model loads and
    runs (ComfyUI 0.8's pick_operations then disables the fp8 formats, as on an RTX 30xx); @89+
    and native runs keep the real answer. A scaled model gets one load per answer."""
    import types
    import workflow as wf
    mm = types.SimpleNamespace(supports_fp8_compute=lambda *a, **k: True)
    monkeypatch.setitem(sys.modules, "comfy", types.SimpleNamespace(model_management=mm))
    monkeypatch.setitem(sys.modules, "comfy.model_management", mm)
    with wf._fp8_compute_as_on("86"):
        assert mm.supports_fp8_compute("cuda") is False
    assert mm.supports_fp8_compute("cuda") is True
    for arch in ("native", "89", "90"):
        with wf._fp8_compute_as_on(arch):
            assert mm.supports_fp8_compute() is True
    assert [wf._fp8_compute_key(a) for a in ("native", "86", "75", "89", "120")] == \
        ["native", "no-fp8-compute", "no-fp8-compute", "native", "native"]
    text = ("Triton fp8 Fallback: auto on sm86\nleft on torch: 2 (TensorCoreNVFP4Layout layout: no Triton kernel "
            "for it): a, b\nleft on torch: 3 (native fp8 matmul (comfy-kitchen's QuantizedTensor linear) kept)")
    assert wf._left_on_torch(text) == {"TensorCoreNVFP4Layout layout: no Triton kernel for it": 2,
                                       "native fp8 matmul (comfy-kitchen's QuantizedTensor linear) kept": 3}


def test_fp8e4nv_kernel_compile_error_is_recorded_not_raised(monkeypatch, tmp_path):
    """A compiled run @86 records what an sm86 does with Inductor's fp8e4nv kernel (official
    Triton refuses it) instead of failing the bench; sm90 compiles it."""
    import time
    import workflow as wf
    src = '''import triton
import triton.language as tl


@triton.jit
def triton_poi_fp8_cast(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    x = tl.arange(0, XBLOCK)
    tl.store(out_ptr0 + x, tl.load(in_ptr0 + x, mask=x < xnumel).to(tl.float32), mask=x < xnumel)


class _Heuristics:
    fn = triton_poi_fp8_cast
    triton_meta = {"signature": {"in_ptr0": "*fp8e4nv", "out_ptr0": "*fp32", "xnumel": "i32"}, "constants": {}}
    configs = [triton.Config({"XBLOCK": 128})]


kernel = _Heuristics()
'''
    since = time.time() - 1
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / "cab123.py").write_text(src)
    monkeypatch.setattr(wf, "_inductor_dir", lambda: str(tmp_path))
    r86 = wf._compile_fp8e4nv_kernel_for(since, 86)
    assert r86["status"] == "error" and "fp8e4nv" in r86["error"], r86
    assert wf._compile_fp8e4nv_kernel_for(since, 90)["status"] == "compiled for sm90"
    assert wf._compile_fp8e4nv_kernel_for(time.time() + 60, 86)["status"] == "no fp8e4nv kernel"


def test_interleaved_rounds_report_median_spread_and_per_round_ratios():
    import torch
    import workflow as wf
    runs = [wf.Run.parse(x) for x in ("flux:default", "hunyuan:default", "flux:both", "hunyuan:both")]
    order = [r.label for r in wf.interleave(runs, 3)]
    assert order == ["flux:default", "flux:both", "flux:both#r2", "flux:default#r2", "flux:default#r3",
                     "flux:both#r3", "hunyuan:default", "hunyuan:both", "hunyuan:both#r2", "hunyuan:default#r2",
                     "hunyuan:default#r3", "hunyuan:both#r3"]
    with pytest.raises(ValueError):
        wf.interleave(runs, 0)
    ref = torch.randn(1, 16, 8, 8)
    default_s, both_s = [1.0, 1.2, 1.1], [0.9, 1.25, 1.0]   # round 2: both slower than that round's default
    results = []
    for i in range(3):
        for config, s in (("default", default_s[i]), ("both", both_s[i])):
            run = wf.Run("flux", config, round=i + 1)
            results.append({"run": run.label, "base_label": run.base_label, "round": i + 1, "model": "flux",
                            "config": config, "fp8": None, "attention": None, "compiled": False, "arch": "native",
                            "s_per_step": s, "first_step_s": s, "latent": ref,
                            "calibration": {"calibrations": 2 if i == 0 and config == "both" else 0,
                                            "timed_runs": 6 if i == 0 and config == "both" else 0,
                                            "new_choices": {"a": {"choice": "exact"}, "b": {"choice": "comfy"}}
                                            if i == 0 and config == "both" else {}}})
    meta = {"versions": {"cpu": "x", "cpu_count": 2, "torch": "t", "triton": "tr", "python": "p", "comfyui": "c"},
            "command": "cmd", "steps": 2, "models": {}}
    doc, md = wf.write_outputs(None, meta, results)
    runs_by = {r["run"]: r for r in doc["runs"]}
    # each run against the default of its own round
    assert runs_by["flux:both#r2"]["speedup_vs_default_same_mode"] == pytest.approx(1.2 / 1.25)
    assert runs_by["flux:both#r3"]["default_eager_ref"] == "flux:default#r3"
    summ = {r["config"]: r for r in doc["summary"]}
    both = summ["flux:both"]
    ratios = sorted(d / b for d, b in zip(default_s, both_s))
    assert both["rounds"] == 3 and both["x_default_same_mode"]["median"] == pytest.approx(ratios[1])
    assert both["x_default_same_mode"]["min"] == pytest.approx(ratios[0])
    assert both["s_per_step"] == {"median": 1.0, "min": 0.9, "max": 1.25, "n": 3}
    assert both["never_slower"] is False and "never_slower" not in summ["flux:default"]
    assert "| flux:both | 3 | 1.0000 (0.9000–1.2500) |" in md and "**no**" in md
    assert "calibrated 2 shape classes (comfy 1, exact 1)" in md


def test_budget_estimate_for_loading_a_model():
    """--budget-s: a full-size GPU model already written costs seconds to load again (an interleaved
    plan reloads a scaled-fp8 model for every change between @86 and native), not the 120 s of
    writing it; before, every such reload was skipped with 100+ s left."""
    import workflow as wf
    full = wf.PRESETS["gpu-scaled"]["flux"]
    tiny = wf.PRESETS["tiny"]["flux"]
    assert wf.load_estimate_s("cuda", full, written=False) >= 60
    assert wf.load_estimate_s("cuda", full, written=True) <= 30
    assert wf.load_estimate_s("cpu", tiny, written=False) < 30
    assert wf.model_name("flux-scaled", full) != wf.model_name("flux-scaled", tiny)
    assert wf.model_name("flux-scaled", full) != wf.model_name("flux", full)


def test_first_steps_lines():
    import first_steps
    doc = {"runs": [
        {"run": "flux:both@86", "s_per_step": 0.2, "first_step_s": 12.5,
         "calibration": {"calibrations": 20, "calibration_s": 9.0, "autotunes": 30, "autotune_s": 7.5,
                         "new_choices": {"a": {"choice": "decode", "not_timed": {"fused": "x"}},
                                         "b": {"choice": "torch"}},
                         "rates": {"rates|bfloat16": {"matmul_tflops": 700.5, "copy_gbps": 3001.0}}},
         "triton_compiles": {"misses": 40, "miss_s": 41.0, "miss_busy_s": 8.2, "hits": 3, "hit_s": 0.1,
                             "misses_by_name": {"attn_fwd_kernel": [6, 9.1]},
                             "timeline": {"first_start_s": 0.3, "last_end_s": 7.9, "running_at": [[12.5, 0]],
                                          "started_by_s": [[1.0, 30, 0], [2.0, 40, 5]]}}},
        {"run": "flux:both:compiled#r2", "s_per_step": 0.17, "first_step_s": 5.0, "compile_s": 4.8,
         "inductor_cache": "warm"},
        {"run": "flux:fp8", "error": "RuntimeError: boom"},
        {"run": "hun:both:regional", "s_per_step": 0.92, "first_step_s": 5.49, "compile_s": 13.6,
         "calibration_step_s": 4.57},
        {"run": "flux:both:regional", "s_per_step": 0.18, "first_step_s": 0.2,
         "kernel_time": {"wall_ms": 190.0, "kernels": 1800, "kernel_ms": 140.0, "gpu_idle_in_span_ms": 40.0,
                         "gaps": {"count": 57, "sum_ms": 38.5, "waiting_on_gpu_ms": 0.0,
                                  "longest": [{"ms": 2.5, "after": "mm", "before": "rope_kernel",
                                               "host": [["aten::cat", 1.9], ["aten::mul", 0.3]]}]}}},
        {"run": "hun:both:regional#B1", "s_per_step": 0.92, "first_step_s": 0.3, "compile_s": 12.0,
         "calibration": {"prepared": 0, "warmed": 6, "deferred_calls": 12, "worker_compiles": 5, "thread_compiles": 1},
         "calibrating_steps": 1, "compile_workers_ready": 4}]}
    out = first_steps.lines(doc)
    assert out[0].startswith("flux:both@86: 0.2000 s/step, first 12.50 s; calibrated 20 (9.0 s), tuned 30 (7.5 s)")
    assert "triton misses 40 (41.0 s, busy 8.2 s; hits 3 0.1 s) [attn_fwd_kernel 6x 9.1s]" in out[0]
    assert ("misses compiled from +0.3 to +7.9 s of the first call, running at the first calls' ends [[12.5, 0]], "
            "[s, started, done] [[1.0, 30, 0], [2.0, 40, 5]]") in out[0]
    assert "1 classes with a candidate not timed (roofline), rates bfloat16 700.5 TFLOPS, 3001.0 GB/s" in out[0]
    assert out[1] == "flux:both:compiled#r2: 0.1700 s/step, first 5.00 s; compile 4.8 s (warm cache)"
    assert out[2] == "flux:fp8: RuntimeError: boom"
    assert out[3] == ("hun:both:regional: 0.9200 s/step, first 5.49 s; compile 13.6 s; "
                      "eager step 1 +4.6 s before it (both 18.2 s)")
    assert out[4].endswith("57 gaps 38.5 ms (waiting on the GPU 0.0 ms); longest: 2.5 ms before rope_kernel: "
                           "aten::cat 1.9, aten::mul 0.3")
    # stored choices whose kernels compiled in the background (kernels/calibration.py's _stored)
    assert ("0 prepared, 6 stored warmed, compiles in workers 5 / threads 1 (4 workers ready at the start), "
            "12 calls deferred, "
            "calibrating steps 1") in out[5]


def test_kernel_time_records_a_call(monkeypatch):
    """TK_BENCH_KERNEL_TIME's probe on CPU (no kernels to see): the call's result comes back, its wall
    time is recorded, and a profiler failure falls back to the plain call."""
    import torch
    import workflow as wf
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    x = torch.randn(64, 64)
    out, rec = wf._kernel_time(lambda: x @ x)
    assert torch.equal(out, x @ x) and rec["wall_ms"] > 0 and rec["kernels"] == 0 and rec["kernel_ms"] == 0

    class Broken:
        def __init__(self, *a, **k):
            raise RuntimeError("no profiler here")
    monkeypatch.setattr(torch.profiler, "profile", Broken)
    out, rec = wf._kernel_time(lambda: x + 1)
    assert torch.equal(out, x + 1) and "no profiler here" in rec["error"]


def test_idle_gaps_name_the_host_work_the_gpu_waited_for():
    import random

    import workflow as wf
    rng = random.Random(7)
    # kernels back to back (gaps under GAP_MIN_US), then two real gaps: one while the host ran an
    # eager op, one while it waited on the GPU (a synchronising copy); overlapping kernels on two
    # streams leave no gap
    t, kernels = 0.0, []
    for i in range(20):
        d = rng.uniform(5, 50)
        kernels.append((t, t + d, f"k{i}"))
        t += d + rng.uniform(0, wf.GAP_MIN_US * 0.9)
    kernels.append((t + 300.0, t + 400.0, "after_eager"))
    kernels.append((t + 350.0, t + 380.0, "overlapping"))
    kernels.append((t + 1400.0, t + 1500.0, "after_sync"))
    host = [(t + 10.0, t + 290.0, "aten::cat"), (t + 20.0, t + 200.0, "aten::copy_"),
            (t + 500.0, t + 1390.0, "cudaStreamSynchronize"), (t - 5000.0, t + 5000.0, "the call")]
    rng.shuffle(kernels)
    g = wf.idle_gaps(kernels, host, top=5)
    assert g["count"] == 2
    end0 = max(e for s, e, n in kernels if n.startswith("k"))
    assert g["sum_ms"] == pytest.approx((t + 300.0 - end0 + 1000.0) / 1e3, abs=1e-3)
    assert g["waiting_on_gpu_ms"] == pytest.approx(1.0, abs=1e-3)
    assert [r["before"] for r in g["longest"]] == ["after_sync", "after_eager"]
    assert g["longest"][1]["after"] == max(kernels, key=lambda k: k[1] if k[2].startswith("k") else -1)[2]
    eager = dict((n, ms) for n, ms in g["longest"][1]["host"])
    assert eager["aten::cat"] == pytest.approx(0.28, abs=1e-3) and eager["aten::copy_"] == pytest.approx(0.18)
    assert dict(g["by_next_kernel_ms"])["after_sync"] == pytest.approx(1.0, abs=1e-3)
    assert wf.idle_gaps([], host) == {"count": 0, "sum_ms": 0.0, "waiting_on_gpu_ms": 0.0,
                                       "by_next_kernel_ms": [], "longest": []}


def test_timed_steps_skip_the_steps_that_compiled_or_calibrated():
    import workflow
    steps = [9.0, 3.0, 1.0, 1.1, 0.9]
    # eager: the calibration worked in steps 1 and 2 (deferred timing), so s/step starts at step 3
    first, cal, extra = workflow.timed_steps(steps, None, [0, 5, 7, 7, 7, 7])
    assert (first, cal) == (2, [0, 1]) and extra == pytest.approx(9.0 + 3.0 - 2 * 1.0)
    # nothing calibrated: from step 2, as always
    assert workflow.timed_steps(steps, None, [3, 3, 3, 3, 3, 3]) == (1, [], None)
    # calibrating to the last step leaves step 2 on (no step would be left)
    assert workflow.timed_steps(steps, None, [0, 0, 0, 0, 0, 1])[:2] == (1, [4])
    # compiled: Dynamo compiled in step 2 (the eager first call calibrated): from step 3; calibration
    # marks do not move a compiled run's start
    first, cal, extra = workflow.timed_steps(steps, [0, 0, 4, 4, 4, 4], [0, 9, 9, 9, 9, 9])
    assert (first, cal, extra) == (2, [0], None)


def test_default_twin_is_reported_against_the_default():
    import torch
    import workflow
    assert workflow.CONFIGS["default-twin"] == workflow.CONFIGS["default"]
    ref = torch.ones(4)
    runs = [{"run": f"flux:{c}#r{i}", "base_label": f"flux:{c}", "model": "flux", "config": c, "compiled": False,
             "arch": "native", "round": i, "s_per_step": s, "first_step_s": s, "latent": ref}
            for i in (1, 2) for c, s in (("default", 1.0), ("default-twin", 1.02 if i == 1 else 0.99))]
    workflow.annotate(runs)
    twin = {r["run"]: r["speedup_vs_default_same_mode"] for r in runs if r["config"] == "default-twin"}
    assert twin == {"flux:default-twin#r1": pytest.approx(1 / 1.02), "flux:default-twin#r2": pytest.approx(1 / 0.99)}


def test_first_steps_clock_lines(tmp_path):
    import datetime
    import first_steps
    t0 = datetime.datetime(2026, 11, 24, 12, 0, 0)
    rows = [(t0 + datetime.timedelta(seconds=i)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3] +
            f", {1980 if i < 5 else 1755}, 2619, {600 + i}.5, 60, {'0x0000000000000000' if i < 8 else '0x0000000000000004'}"
            for i in range(10)]
    smi = tmp_path / "smi.csv"
    smi.write_text("\n".join(rows + ["garbage line"]) + "\n")
    samples = first_steps.smi_samples(str(smi))
    assert len(samples) == 10 and samples[0][1] == 1980.0
    ts = t0.timestamp()
    doc = {"runs": [{"run": "a", "t_start": ts - 0.5, "t_end": ts + 4.5}, {"run": "b", "t_start": ts + 5.5,
                                                                          "t_end": ts + 9.5}, {"run": "c"}]}
    a, b = first_steps.clock_lines(doc, samples)
    assert a.startswith("a: SM 1980 MHz") and "0 with a clock event" in a
    assert b.startswith("b: SM 1755 MHz") and "2 with a clock event" in b


def test_trace_prepare_records_the_background_compiles_started(monkeypatch):
    import types
    import workflow as wf
    prep = types.ModuleType("fakepack.kernels.prepare")
    prep.prepare = lambda fns: [f"future:{k}" for k in fns]
    monkeypatch.setitem(sys.modules, "fakepack.kernels.prepare", prep)
    cal = types.ModuleType("fakepack.kernels.calibration")
    attn_mod = types.SimpleNamespace(calib=types.SimpleNamespace(C=cal))
    monkeypatch.setattr(wf, "_PREPARE_CALLS", [])
    wf._trace_prepare(attn_mod)
    wf._trace_prepare(attn_mod)  # once: not wrapped twice
    assert prep.prepare({"exact": 1, "int8": 2}) == ["future:exact", "future:int8"]
    assert [c[1:] for c in wf._PREPARE_CALLS] == [[2, "exact"]] and wf._PREPARE_CALLS[0][0] > 0


def test_a_round_that_calibrated_in_every_step_is_reported_apart():
    """A cold round whose calibration worked up to its last step (HunyuanVideo natively, 4 steps, on an
    H100: 0.758× with steps 4.86, 1.07, 1.84, 1.44 s, then 1.143× stored) is not a figure of the settled
    paths: it leaves the ratios and "never slower", and the summary gives its × and the seconds it took
    beyond the steady rounds. A configuration with no steady round keeps every round."""
    import random
    import statistics
    import torch
    import workflow as wf
    rng = random.Random()
    ref = torch.randn(1, 4, 4, 4)
    d_steps = [[rng.uniform(1.0, 1.2) for _ in range(4)] for _ in range(3)]
    b_steps = [[rng.uniform(3.0, 5.0)] + [rng.uniform(1.3, 1.8) for _ in range(3)]] + \
        [[rng.uniform(0.8, 0.95) for _ in range(4)] for _ in range(2)]
    results = []
    for i in range(3):
        for config, steps, steady in (("default", d_steps[i], True), ("both", b_steps[i], i > 0),
                                      ("fp8", b_steps[0], False)):
            run = wf.Run("hunyuan", config, round=i + 1)
            results.append({"run": run.label, "base_label": run.base_label, "round": i + 1, "model": "hunyuan",
                            "config": config, "fp8": None, "attention": None, "compiled": False,
                            "arch": "native", "step_times_s": steps, "s_per_step": statistics.median(steps[1:]),
                            "first_step_s": steps[0], "latent": ref, "steady": steady})
    meta = {"versions": {"cpu": "x", "cpu_count": 2, "torch": "t", "triton": "tr", "python": "p", "comfyui": "c"},
            "command": "cmd", "steps": 4, "models": {}}
    doc, md = wf.write_outputs(None, meta, results)
    summ = {r["config"]: r for r in doc["summary"]}
    both = summ["hunyuan:both"]
    steady_x = sorted(statistics.median(d[1:]) / statistics.median(b[1:]) for d, b in zip(d_steps[1:], b_steps[1:]))
    assert both["rounds"] == 3 and both["x_default_same_mode"]["n"] == 2
    assert both["x_default_same_mode"]["min"] == pytest.approx(steady_x[0])
    assert both["never_slower"] is True
    (cal,) = both["calibrating_rounds"]
    assert cal["run"] == "hunyuan:both"
    assert cal["x_default_same_mode"] == pytest.approx(statistics.median(d_steps[0][1:]) /
                                                       statistics.median(b_steps[0][1:]))
    assert cal["s_more_than_steady"] == pytest.approx(
        sum(b_steps[0]) - statistics.median([sum(b_steps[1]), sum(b_steps[2])]), abs=1e-3)
    # every round calibrating: all of them count, and the configuration is judged on them
    fp8 = summ["hunyuan:fp8"]
    assert fp8["x_default_same_mode"]["n"] == 3 and "calibrating_rounds" not in fp8 and fp8["never_slower"] is False
    assert "calibrated in every step: its s/step holds the calibration" in md
    assert "| hunyuan:both | 3 |" in md and "hunyuan:both: " in md and "| hunyuan:default | 3 |" in md


def test_simulated_runs_compile_with_the_cards_mma():
    import workflow as wf
    sims = [wf.Run.parse(s) for s in ("hunyuan-scaled:default@89", "hunyuan-scaled:both@89", "flux:both@86")]
    mixed = sims + [wf.Run.parse("hunyuan-scaled:both")]
    for choice in ("auto", "sync"):
        env = {}
        assert "mma.sync" in wf.sim_mma(sims, choice, env) and env == {"DISABLE_MMA_V3": "1"}
    env = {"DISABLE_MMA_V3": "1"}  # a leftover from the shell: the plan decides
    assert "mixes native and simulated" in wf.sim_mma(mixed, "auto", env) and env == {}
    env = {}
    assert "as chosen" in wf.sim_mma(sims, "wgmma", env) and env == {}
    with pytest.raises(SystemExit, match="hunyuan-scaled:both on this GPU's own instructions"):
        wf.sim_mma(mixed, "sync", {})
    with pytest.raises(ValueError):
        wf.sim_mma(sims, "mma", {})
    env = {}
    assert "no simulated run" in wf.sim_mma([wf.Run.parse("flux:both"), wf.Run.parse("flux:both@90")], "auto", env)
