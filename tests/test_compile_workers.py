"""nodes/compile_workers.py: the fingerprint a node gives a model (what decides its kernels), and the two
nodes naming the models they patch, so compile workers start for one the Triton cache lacks."""
from __future__ import annotations

import random
import types

import pytest
import torch

from tritonkit.nodes import compile_workers as W
from test_fp8_node import build, comfy, node  # noqa: F401  (fixtures)


class Flux(torch.nn.Module):
    pass


class Hunyuan(torch.nn.Module):
    pass


def _patcher(cls, unet_config: dict, dtype=torch.bfloat16, device="cuda"):
    """A stand-in ModelPatcher: model.diffusion_model of ``cls``, model.model_config.unet_config."""
    dm = cls()
    dm.dtype = dtype
    base = types.SimpleNamespace(diffusion_model=dm, model_config=types.SimpleNamespace(unet_config=dict(unet_config)),
                                 manual_cast_dtype=None)
    return types.SimpleNamespace(model=base, load_device=torch.device(device))


def test_one_architecture_and_setting_share_a_fingerprint_and_nothing_else_does():
    rng = random.Random()
    cfg = {"hidden_size": rng.choice([1024, 3072]), "num_heads": rng.choice([8, 24]), "depth": rng.randint(1, 19),
           "guidance_embed": rng.random() < 0.5}
    what = f"fp8|auto|sm{rng.choice([75, 80, 86, 89, 90, 120])}"
    a, b = _patcher(Flux, dict(cfg, ops=object())), _patcher(Flux, dict(cfg, ops=object()))  # two checkpoints, one architecture
    fp = W.fingerprint(a, what)
    assert len(fp) == 16 and int(fp, 16) >= 0 and W.fingerprint(b, what) == fp
    cfg["ops"] = object()
    others = [W.fingerprint(_patcher(Hunyuan, cfg), what),
              W.fingerprint(_patcher(Flux, dict(cfg, depth=cfg["depth"] + 1)), what),
              W.fingerprint(_patcher(Flux, cfg, dtype=torch.float8_e4m3fn), what),
              W.fingerprint(a, what.replace("fp8|", "attention|")),
              W.fingerprint(a, what + "0")]
    assert fp not in others and len(set(others)) == len(others)


def test_workers_are_asked_for_a_cuda_model_only_and_never_raise(monkeypatch):
    asked = []
    monkeypatch.setattr(W.compile_pool, "start_for_model", lambda fp: asked.append(fp) or True)
    cfg = {"hidden_size": 64}
    assert W.start_for(_patcher(Flux, cfg, device="cpu"), "fp8|auto|sm86") is False and asked == []
    assert W.start_for(types.SimpleNamespace(), "fp8|auto|sm86") is False and asked == []
    cuda = _patcher(Flux, cfg)
    assert W.start_for(cuda, "fp8|auto|sm86") is True and asked == [W.fingerprint(cuda, "fp8|auto|sm86")]

    def boom(fp):
        raise RuntimeError("no psutil")
    monkeypatch.setattr(W.compile_pool, "start_for_model", boom)
    assert W.start_for(cuda, "fp8|auto|sm86") is False


def test_the_fp8_node_names_the_model_it_patches(comfy, node, monkeypatch):  # noqa: F811
    """On ComfyUI's own ModelPatcher: the node names the model, its mode and the architecture it plans for;
    a model it leaves unchanged is not named."""
    asked = []
    monkeypatch.setattr(W, "start_for", lambda model, what: asked.append((model, what)) or False)
    monkeypatch.setenv("TRITONKIT_FORCE_ARCH", "86")
    _, mp = build(comfy)
    clone, _ = node.patch_model(mp, "auto")
    assert clone is not mp and asked == [(mp, "fp8|auto|sm86")]
    node.patch_model(mp, "off")
    assert len(asked) == 1


def test_the_attention_node_names_a_cuda_model(monkeypatch):
    """The attention node names the model on a CUDA device (its capability faked here), with its mode and
    the architecture it plans for; on the CPU it does not."""
    from tritonkit.nodes import attention as N
    if N.A is None:
        pytest.skip(f"the attention kernels don't import here: {N._IMPORT_ERROR}")
    asked = []
    monkeypatch.setattr(W, "start_for", lambda model, what: asked.append((model, what)) or False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(N, "capability", lambda dev: 90)
    monkeypatch.setattr(N.arch_probe, "dot_has_tensor_cores", lambda cc: True)
    monkeypatch.setattr(N, "describe", lambda mode, model: "")
    monkeypatch.setenv("TRITONKIT_FORCE_ARCH", "80")

    class Patcher(types.SimpleNamespace):
        def clone(self):
            return Patcher(load_device=self.load_device, model_options={"transformer_options": {}})
    gpu = Patcher(load_device=torch.device("cuda", 0), model_options={"transformer_options": {}})
    N.patch_model(gpu, "8-bit")
    assert asked == [(gpu, "attention|8-bit|sm80")]
    N.patch_model(Patcher(load_device=torch.device("cpu"), model_options={"transformer_options": {}}), "auto")
    assert len(asked) == 1
