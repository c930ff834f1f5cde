"""nodes/compile_aot.py without ComfyUI: what an ahead-of-time entry's key holds (it stands in for the
guards that cannot be saved), which guards an entry keeps, and when it is switched off. The
compile, save and load through ComfyUI's models are in test_compile_model.py."""
from __future__ import annotations

import dataclasses
import os
import types

import pytest
import torch


@pytest.fixture
def aot():
    from tritonkit.nodes import compile_aot
    return compile_aot


@dataclasses.dataclass(frozen=True)
class Cfg:
    name: str
    fused: bool


def _patched(mod, cfg):
    def forward_comfy_cast_weights(x):
        return x
    forward_comfy_cast_weights.tritonkit_fp8 = cfg
    mod.forward_comfy_cast_weights = forward_comfy_cast_weights
    return mod


def test_token_dim_is_a_wildcard_and_volatile_entries_are_left_out(aot):
    skip = ("block_index",)
    a = (torch.zeros(1, 4096, 64), {"block_index": 3, "patches": {}})
    b = (torch.zeros(1, 1024, 64), {"block_index": 7, "patches": {}})
    assert aot.fingerprint(a, skip) == aot.fingerprint(b, skip)
    assert aot.fingerprint(a, skip, tokens="exact") != aot.fingerprint(b, skip, tokens="exact")
    # what the compiled graph depends on is in the key: dtype, static sizes, non-volatile options
    assert aot.fingerprint((torch.zeros(1, 4096, 64, dtype=torch.float16), a[1]), skip) != aot.fingerprint(a, skip)
    assert aot.fingerprint((torch.zeros(1, 4096, 32), a[1]), skip) != aot.fingerprint(a, skip)
    assert aot.fingerprint((a[0], {"block_index": 3, "patches": {"x": 1}}), skip) != aot.fingerprint(a, skip)
    assert aot.token_dim(torch.zeros(2, 8, 64)) is None          # too short for a token dim
    assert aot.token_dim(torch.zeros(1, 24, 4096, 128)) == 2


def test_call_fingerprint_is_the_plain_one_walked_once_per_model_call(aot, monkeypatch):
    skip = ("block_index",)
    override = lambda *a: None  # noqa: E731
    topts = {"block_index": 0, "patches": {"p": [1, 2]}, "optimized_attention_override": override,
             "wrappers": {"apply_model": {"k": [override]}}}
    kwargs = {"img": torch.zeros(1, 4096, 64), "vec": torch.zeros(1, 64), "transformer_options": topts,
              "attn_mask": None}
    aot.new_call()
    walks = []
    real = aot.fingerprint
    monkeypatch.setattr(aot, "fingerprint", lambda v, *a, **k: (walks.append(v is topts), real(v, *a, **k))[1])
    got = {}
    for i in range(5):  # the blocks of one call: only the per-block entry changes
        topts["block_index"] = i
        kwargs["img"] = torch.zeros(1, 1024 * (i + 1), 64)
        for tokens in ("token", "exact", "any"):
            got[i, tokens] = aot.call_fingerprint(kwargs, skip, tokens)
    assert sum(walks) == 3  # the options walked once per token setting, not once per block
    for (i, tokens), fp in got.items():
        kwargs["img"] = torch.zeros(1, 1024 * (i + 1), 64)
        assert fp == real(kwargs, skip, tokens=tokens)
    # an entry replaced within the call is seen; one changed in place is seen from the next call
    topts["patches"] = {"p": [3]}
    assert aot.call_fingerprint(kwargs, skip, "token") == real(kwargs, skip, tokens="token")
    topts["patches"]["p"].append(4)
    stale = aot.call_fingerprint(kwargs, skip, "token")
    aot.new_call()
    fresh = aot.call_fingerprint(kwargs, skip, "token")
    assert fresh == real(kwargs, skip, tokens="token") and fresh != stale
    for i in range(aot._DICT_MEMO_MAX + 3):  # bounded
        aot.call_fingerprint(dict(kwargs, transformer_options=dict(topts, n=i)), skip, "token")
    assert len(aot._DICT_MEMO) <= aot._DICT_MEMO_MAX
    aot.new_call()


def test_module_key_sees_patches_and_parameters_but_not_layer_names(aot):
    def block(cfg_name, fused=True, dtype=torch.float32, out=8):
        m = torch.nn.Sequential(torch.nn.Linear(8, out), torch.nn.LayerNorm(out))
        _patched(m[0], Cfg(cfg_name, fused))
        return m.to(dtype)

    base = aot.module_fingerprint(block("double_blocks.0.lin"))
    assert aot.module_fingerprint(block("double_blocks.7.lin")) == base       # one entry for every block
    assert aot.module_fingerprint(block("double_blocks.0.lin", fused=False)) != base
    assert aot.module_fingerprint(block("x", dtype=torch.float16)) != base
    assert aot.module_fingerprint(block("x", out=16)) != base
    unpatched = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    assert aot.module_fingerprint(unpatched) != base
    eps = block("x")
    eps[1].eps = 1e-3
    assert aot.module_fingerprint(eps) != base


def test_functions_are_keyed_by_name_and_the_packs_settings(aot):
    def override(func, *a, **k):
        return func(*a, **k)
    override.tritonkit_mode = "exact"
    other = types.FunctionType(override.__code__, override.__globals__, "override")
    other.__qualname__ = override.__qualname__
    other.tritonkit_mode = "8-bit"
    assert aot.fingerprint({"optimized_attention_override": override}) != \
        aot.fingerprint({"optimized_attention_override": other})
    other.tritonkit_mode = "exact"
    assert aot.fingerprint({"optimized_attention_override": override}) == \
        aot.fingerprint({"optimized_attention_override": other})


class _Entry:
    def __init__(self, name, guard_type, is_global=False):
        self.name, self.guard_type, self.is_global = name, guard_type, is_global


def test_the_guards_an_entry_keeps(aot):
    entries = [_Entry("L['img']", "TENSOR_MATCH"), _Entry("", "SHAPE_ENV"), _Entry("", "GLOBAL_STATE"),
               _Entry("L['self']._modules['lin']._parameters['weight']", "TENSOR_MATCH"),
               _Entry("L['self']._modules['norm']", "TYPE_MATCH"),
               _Entry("L['transformer_options']['sigmas']", "TENSOR_MATCH"),
               _Entry("G['_TRACE_CHOICES']", "DICT_KEYS_MATCH", is_global=True),
               _Entry("L['attn_mask']", "CONSTANT_MATCH"), _Entry("L['vec']", "TENSOR_MATCH")]
    everything = lambda es: [True] * len(es)  # noqa: E731
    kept = aot.aot_guard_filter(everything)(entries)
    assert [e.name for e, k in zip(entries, kept) if k] == ["L['img']", "", "", "L['vec']"]
    # the regional compile's own filter still applies
    no_vec = lambda es: [e.name != "L['vec']" for e in es]  # noqa: E731
    assert not aot.aot_guard_filter(no_vec)(entries)[-1]


def test_code_key_follows_the_source_files(aot, tmp_path, monkeypatch):
    mod_dir = tmp_path / "fake_comfy"
    mod_dir.mkdir()
    src = mod_dir / "layers.py"
    src.write_text("import torch\nclass Block(torch.nn.Module):\n    def forward(self, x):\n        return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    layers = importlib.import_module("fake_comfy.layers")
    key = aot.code_key(layers.Block())
    assert aot.code_key(layers.Block()) == key
    aot._files_digest.cache_clear()
    (mod_dir / "math.py").write_text("# a new file beside the block's: ComfyUI was updated\n")
    assert aot.code_key(layers.Block()) != key
    aot._files_digest.cache_clear()
    st = os.stat(src)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert aot.code_key(layers.Block()) != key


def test_switch_and_stance(aot, monkeypatch):
    monkeypatch.setenv(aot.ENV, "0")
    assert not aot.enabled()
    monkeypatch.setenv(aot.ENV, "1")
    assert aot.enabled() == aot.available()
    assert aot.stance() == "default"
    if hasattr(torch.compiler, "set_stance"):
        with torch.compiler.set_stance("force_eager"):
            assert aot.stance() == "force_eager"
        assert aot.stance() == "default"


def test_guard_failure_is_told_from_other_errors(aot):
    assert aot.guard_failure(RuntimeError("GuardManager check failed, reason: ..."))
    assert not aot.guard_failure(RuntimeError("CUDA out of memory"))
    assert not aot.guard_failure(ValueError("GuardManager check failed"))


def test_saved_any_sees_the_class_entries_on_disk(aot, tmp_path):
    e = aot.Entries("comfy.ldm.flux.layers.DoubleStreamBlock", None, "default|auto", lambda x: x, lambda: None,
                    {}, None, 8)
    assert not e.saved_any()  # no folder yet (outside sampling)
    e.folder = str(tmp_path / "aot-[x]")  # glob characters in the folder name
    os.makedirs(e.folder)
    assert not e.saved_any()
    (tmp_path / "aot-[x]" / "SingleStreamBlock-abc.bin").write_bytes(b"x")  # another class's entry
    assert not e.saved_any()
    with open(e.path("abc"), "wb") as f:
        f.write(b"x")
    assert e.saved_any()


def test_compile_workers_start_early_only_where_a_compile_is_coming(monkeypatch):
    """The Triton Compile Model starts Inductor's compile workers when sampling starts, on CUDA,
    when some class has no ahead-of-time entry yet (or is on Dynamo's path)."""
    from torch._inductor import async_compile as ac

    from tritonkit.nodes import compile_model as cm
    calls = []
    monkeypatch.setattr(ac, "maybe_warm_pool", lambda: calls.append("warm"))
    monkeypatch.setattr(ac.AsyncCompile, "use_process_pool", classmethod(lambda cls: calls.append("probe")))
    monkeypatch.setattr(ac, "get_compile_threads", lambda: 4)
    assert not cm.warm_compile_workers(torch.device("cpu")) and not cm.warm_compile_workers(None)
    assert calls == []
    assert cm.warm_compile_workers(torch.device("cuda", 0)) and calls == ["warm", "probe"]
    monkeypatch.setenv(cm.WARM_ENV, "0")
    assert not cm.warm_compile_workers(torch.device("cuda", 0)) and calls == ["warm", "probe"]
    monkeypatch.delenv(cm.WARM_ENV)
    monkeypatch.setattr(ac, "get_compile_threads", lambda: 1)  # Inductor compiles in this process
    calls.clear()
    assert not cm.warm_compile_workers(torch.device("cuda", 0)) and calls == []

    def comp(aot_state):
        return types.SimpleNamespace(aot=aot_state)

    def entries(saved, broken=None):
        return types.SimpleNamespace(saved_any=lambda: saved, broken=broken)

    assert not cm._needs_compile([comp(entries(True)), comp(entries(True))])  # a warm restart loads all
    assert cm._needs_compile([comp(entries(True)), comp(entries(False))])
    assert cm._needs_compile([comp(entries(True, broken="graph break")), comp(entries(True))])
    assert cm._needs_compile([comp(None)])  # Dynamo's path
