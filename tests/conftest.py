"""Shared fixtures. The pack is imported as a package named ``tritonkit`` whatever its
folder is called (a bare parent package whose path is the repository root), the same way
install.py loads it and the same relative imports ComfyUI relies on."""
from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

if "tritonkit" not in sys.modules:
    _pkg = types.ModuleType("tritonkit")
    _pkg.__path__ = [str(REPO)]
    sys.modules["tritonkit"] = _pkg

GPU_ARCHS = (75, 80, 86, 89, 90, 120)


def _cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped on CPU-only machines, reason shown)")
    config.addinivalue_line("markers", "comfyui: starts a real ComfyUI server")
    config.addinivalue_line("markers", "browser: drives headless Chromium against a real ComfyUI")


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; torch.cuda.is_available() is False on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def comfy_base(tmp_path_factory):
    return tmp_path_factory.mktemp("comfy")


@pytest.fixture(scope="session")
def comfy_server(tmp_path_factory):
    """One real ComfyUI server (CPU) with the pack, shared by the end-to-end tests that don't
    need a special environment. Tests that do (a broken Triton, forced kernels) start their own."""
    from comfy_harness import ComfyServer, comfyui_available
    if not comfyui_available():
        pytest.fail("ComfyUI is not set up: run scripts/setup_env.sh (the README's test command does)")
    srv = ComfyServer(tmp_path_factory.mktemp("comfy-shared"))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def poison():
    """Fills a tensor with NaN (floats) or 0xAB bytes so an unwritten output can't pass."""
    import torch

    def _poison(t):
        if t.dtype.is_floating_point:
            t.fill_(float("nan"))
        else:
            t.view(torch.uint8).fill_(0xAB)
        return t
    return _poison
