"""kernels/device.py: a CUDA device's compute capability, looked up once, and never an operation of
a graph torch.compile traces (on CPU: the CUDA query is stood in for, Dynamo traces for real)."""
from __future__ import annotations

import pytest
import torch

from tritonkit.kernels import device as D


@pytest.fixture
def fake_cuda(monkeypatch):
    calls = []

    def get_device_capability(index=None):
        calls.append(index)
        return (8, 6)

    monkeypatch.setattr(D, "_CC", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", get_device_capability)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return calls


def test_looked_up_once_per_device(fake_cuda):
    assert D.capability(torch.device("cuda", 0)) == 86
    assert D.capability("cuda:0") == 86 and D.capability(torch.device("cuda")) == 86
    assert fake_cuda == [0]
    assert D.capability(torch.device("cuda", 1)) == 86 and fake_cuda == [0, 1]
    assert D.capability(torch.device("cpu")) is None and D.capability("cpu") is None


def test_traced_code_reads_a_constant(fake_cuda):
    """Looked up in eager code first (the nodes do it when they patch a model), the traced call
    puts no get_device_capability into the graph, and the graph still computes with the value."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append([str(getattr(n.target, "__name__", n.target)) for n in gm.graph.nodes])
        return gm.forward

    def f(x):
        return x * D.capability(torch.device("cuda", 0))

    D.capability(torch.device("cuda", 0))
    torch._dynamo.reset()
    try:
        out = torch.compile(f, backend=backend, fullgraph=True)(torch.ones(3))
    finally:
        torch._dynamo.reset()
    assert torch.equal(out, torch.full((3,), 86.0))
    assert graphs and not any("capability" in op for g in graphs for op in g), graphs
    assert fake_cuda == [0]


def test_not_stored_while_tracing(fake_cuda, monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert D.capability(torch.device("cuda", 0)) == 86
    assert D._CC == {} and fake_cuda == [0]
