"""Shared fixtures. The pack is imported as a package named ``tritonkit`` whatever its
folder is called (a bare parent package whose path is the repository root), the same way
install.py loads it and the same relative imports ComfyUI relies on.

Test order: random by default (modules shuffled, then the tests inside each module, so module
fixtures still start once), seeded by ``TK_TEST_SEED`` (an integer reproduces a run,
``TK_TEST_SEED=off`` keeps the file order); the seed is printed at the start and at the end.

The ``comfyui`` marker selects the tests that run against a real ComfyUI tree (a server, ComfyUI
imported in this process or in a subprocess); ``scripts/dev.sh test`` runs them a second time
against ComfyUI 0.8.0 (``TK_TEST_ONLY_COMFYUI=1`` keeps only those). Tests that use the
``comfy_server`` fixture or the in-process ``comfy`` fixture get it automatically; a test that
starts a ComfyServer without it fails, saying so."""
from __future__ import annotations

import os
import random
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

# The ComfyUI tree's extra packages (ComfyUI 0.8.0's comfy-kitchen, frontend, ...), first on the
# path of this process (in-process imports) and of its subprocesses, as scripts/dev.sh also does.
from comfy_harness import comfyui_dir, comfyui_site, comfyui_version  # noqa: E402

_site = comfyui_site()
if _site is not None and str(_site) not in sys.path:
    sys.path.insert(0, str(_site))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(_site)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(_site)])


def _cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


# The tests' background compiles leave Triton's cache folder unmarked (kernels/compile_pool.py: a marked folder
# starts no compile workers at ComfyUI's start); the tests of the marker reset this themselves.
from tritonkit.kernels import compile_pool as _compile_pool  # noqa: E402

_compile_pool._marked = True

# fixtures that mean "this test runs real ComfyUI code" (see the module docstring)
COMFYUI_FIXTURES = ("comfy_server", "comfy")


def _seed():
    """The order seed: TK_TEST_SEED, or a fresh one (None: file order)."""
    raw = os.environ.get("TK_TEST_SEED", "").strip()
    if raw.lower() in ("off", "none", "0"):
        return None
    if not raw:
        return random.SystemRandom().randrange(1, 2**31)
    if not raw.isdigit():
        raise pytest.UsageError(f"TK_TEST_SEED must be a positive integer or 'off', got {raw!r}")
    return int(raw)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped on CPU-only machines, reason shown)")
    config.addinivalue_line("markers", "comfyui: runs against a real ComfyUI tree (server, in-process or "
                                       "subprocess import); scripts/dev.sh test runs these on every supported line")
    config.addinivalue_line("markers", "browser: drives headless Chromium against a real ComfyUI")
    config.stash[_SEED_KEY] = _seed()


_SEED_KEY = pytest.StashKey()


def pytest_report_header(config):
    seed = config.stash[_SEED_KEY]
    order = (f"test order: random, seed {seed} (reproduce: TK_TEST_SEED={seed})" if seed is not None
             else "test order: file order (TK_TEST_SEED=off)")
    return [order, f"ComfyUI: {comfyui_version(comfyui_dir())} at {comfyui_dir()}"]


def pytest_terminal_summary(terminalreporter, config):
    seed = config.stash[_SEED_KEY]
    if seed is not None:
        terminalreporter.write_line(f"test order seed: {seed} (reproduce: TK_TEST_SEED={seed}); "
                                    f"ComfyUI {comfyui_version(comfyui_dir())}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(f in getattr(item, "fixturenames", ()) for f in COMFYUI_FIXTURES):
            item.add_marker(pytest.mark.comfyui)
    if os.environ.get("TK_TEST_ONLY_COMFYUI") == "1":
        # scripts/dev.sh's pass against another ComfyUI line: only the tests that use ComfyUI
        # (composes with any -m/-k the caller gives; nothing left is pytest's exit code 5)
        keep = [item for item in items if item.get_closest_marker("comfyui")]
        config.hook.pytest_deselected(items=[item for item in items if not item.get_closest_marker("comfyui")])
        items[:] = keep
    seed = config.stash[_SEED_KEY]
    if seed is not None:
        rng = random.Random(seed)
        modules: dict = {}
        for item in items:
            modules.setdefault(item.nodeid.split("::")[0], []).append(item)
        groups = list(modules.values())
        rng.shuffle(groups)
        for group in groups:
            rng.shuffle(group)
        items[:] = [item for group in groups for item in group]
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; torch.cuda.is_available() is False on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def _gpu_calibration_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gpu-calibration")


@pytest.fixture(autouse=True)
def _host_fast_path_forgotten():
    """Each test starts without the host fast path's kept state (the attention node's decisions, replayed
    calls, direct-launch plans): a test that changes what a decision depends on in ways a process never
    does (a monkeypatched probe or planner) must not find another test's decision kept."""
    yield
    for name, attr in (("tritonkit.nodes.attention", "_memo"), ("tritonkit.kernels.attention", "_REPLAYS"),
                       ("tritonkit.kernels.fast_launch", "_PLANS")):
        mod = sys.modules.get(name)
        if mod is not None and isinstance(getattr(mod, attr, None), dict):
            getattr(mod, attr).clear()


@pytest.fixture(autouse=True)
def _gpu_tests_keep_their_calibration(request, monkeypatch):
    """GPU tests time and store choices (attention configs tuned on 2 heads...): into the test
    session's own folder, never the user's calibration store, where a bench or ComfyUI would
    then read them as this GPU's picks. And they time at the first call."""
    if "gpu" in request.node.keywords and not os.environ.get("TRITONKIT_CALIBRATION_DIR"):
        monkeypatch.setenv("TRITONKIT_CALIBRATION_DIR", str(request.getfixturevalue("_gpu_calibration_dir")))
    if "gpu" in request.node.keywords:
        # a GPU test's first call of a shape class is timed at once (as a compiled model's first call
        # is); the deferred calibration has its own GPU test, which removes this
        monkeypatch.setenv("TRITONKIT_CALIBRATION_DEFER", "0")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # read by comfy_harness.ComfyServer: a server started for an unmarked test is refused
    os.environ["TK_TEST_MARKED_COMFYUI"] = "1" if item.get_closest_marker("comfyui") else "0"


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
