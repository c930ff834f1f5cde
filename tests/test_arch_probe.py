"""Whether the installed Triton runs tl.dot on tensor cores for an arch (kernels/arch_probe.py):
the probe's real cross-compile for sm75 / sm80, its cache, and what the nodes do with a no."""
from __future__ import annotations

import logging

import pytest
import torch
import triton

from tritonkit.kernels import arch_probe as P

# Triton 3.3 dropped MMA below sm80 (triton-lang/triton#5066); up to 3.2 Turing had it
FMA_ONLY_ON_SM75 = tuple(int(p) for p in triton.__version__.split(".")[:2]) >= (3, 3)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(P, "_FOUND", {})


def test_the_probe_compiles_a_dot_for_each_arch():
    assert P._compile_probe(80) is True and P._compile_probe(86) is True
    assert P._compile_probe(75) is (not FMA_ONLY_ON_SM75)


def test_answers_are_cached_and_sm80_up_is_not_compiled(monkeypatch):
    compiled = []
    monkeypatch.setattr(P, "_compile_probe", lambda cc: compiled.append(cc) or False)
    assert P.dot_has_tensor_cores(None) is None
    assert P.dot_has_tensor_cores(80) is True and P.dot_has_tensor_cores(120) is True and compiled == []
    assert P.dot_has_tensor_cores(75) is False and P.dot_has_tensor_cores(75) is False and compiled == [75]
    reason = P.no_tensor_cores_reason(75)
    assert reason.startswith("sm75 with Triton ") and "without tensor cores" in reason
    assert P.no_tensor_cores_reason(86) is None and P.no_tensor_cores_reason(None) is None


def test_a_probe_that_does_not_compile_rules_nothing_out(monkeypatch, caplog):
    def boom(cc):
        raise RuntimeError("ptxas not found\nmore")
    monkeypatch.setattr(P, "_compile_probe", boom)
    with caplog.at_level(logging.INFO, logger="TritonKit"):
        assert P.dot_has_tensor_cores(75) is None
    assert P.no_tensor_cores_reason(75) is None
    assert "could not compile the tensor-core probe for sm75 (RuntimeError: ptxas not found)" in caplog.text


def test_traced_code_reads_only_an_answer_found_before(monkeypatch):
    compiled = []
    monkeypatch.setattr(P, "_compile_probe", lambda cc: compiled.append(cc) or False)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert P.dot_has_tensor_cores(75) is None and compiled == []
    P._FOUND[75] = False
    assert P.dot_has_tensor_cores(75) is False and compiled == []


def test_the_attention_node_hands_such_calls_to_comfyui(monkeypatch):
    from tritonkit.nodes import attention as N
    monkeypatch.setenv("TRITONKIT_FORCE_TRITON_ON_CPU", "1")
    monkeypatch.setattr(N, "_arch", lambda device: 75)
    P._FOUND[75] = False
    N.reset_stats()
    q = torch.randn(1, 16, 2 * 32, dtype=torch.float16)
    calls = []

    def comfy_attention(q, k, v, heads, **kw):
        calls.append(1)
        return torch.zeros_like(q)
    for mode in ("exact", "8-bit", "auto"):
        out = N.make_override(mode)(comfy_attention, q, q, q, 2)
        assert torch.equal(out, torch.zeros_like(q))
    assert len(calls) == 3
    s = N.stats()
    assert s["served"] == 0 and s["fallback"] == 3
    assert any("sm75 with Triton" in r and "without tensor cores" in r for r in s["reasons"]), s["reasons"]
    # where the probe says tensor cores (Triton <= 3.2, a fork), sm75 is served in exact mode (another
    # process's answer: the node's kept decisions, made from this process's, are forgotten first)
    P._FOUND[75] = True
    N._memo.clear()
    N.make_override("exact")(comfy_attention, q, q, q, 2)
    assert N.stats()["served_exact"] == 1 and len(calls) == 3


def test_the_fused_linear_decodes_instead(monkeypatch):
    from tritonkit.kernels import fp8_linear as fl
    monkeypatch.setattr(fl, "capability", lambda device: 75)
    P._FOUND[75] = False
    assert not fl.cuda_supports(torch.float16, "cuda") and not fl.cuda_supports(torch.bfloat16, "cuda")
    P._FOUND[75] = True
    assert fl.cuda_supports(torch.float16, "cuda") and not fl.cuda_supports(torch.bfloat16, "cuda")
    monkeypatch.setattr(fl, "capability", lambda device: 86)
    assert fl.cuda_supports(torch.bfloat16, "cuda")
