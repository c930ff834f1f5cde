"""install.py step 4: the Triton package matched to torch (pip is faked: commands are recorded)."""
from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.install_fakes import add_dist, make_ctx, portable_tree
from tritonkit.installer import pyfolder, triton_pkg


@pytest.mark.parametrize("torch_v,want", [("2.4.1", "triton-windows>=3.1,<3.2"), ("2.5.0", "triton-windows>=3.1,<3.2"),
                                          ("2.6.0", "triton-windows>=3.2,<3.3"), ("2.7.1", "triton-windows>=3.3,<3.4"),
                                          ("2.8.0", "triton-windows>=3.4,<3.5"), ("2.9.0", "triton-windows>=3.5,<3.6"),
                                          ("2.10.0+cu130", "triton-windows>=3.6,<3.7"),
                                          ("2.11.0+cu130", "triton-windows>=3.6,<3.7"),
                                          ("2.13.0", "triton-windows>=3.7,<3.8"),
                                          ("2.14.1+cu130", "triton-windows>=3.8,<3.9")])
def test_windows_plan_follows_the_table(torch_v, want):
    p = triton_pkg.plan((torch_v, []), {}, "win32")
    assert p["status"] == "todo" and p["install"] == want and p["uninstall"] == []


def test_plan_refusals():
    p = triton_pkg.plan(("2.3.1", []), {}, "win32")
    assert p["status"] == "failed" and "too old" in p["message"] and "torch" in p["fix"]
    p = triton_pkg.plan(("2.6.0", []), {}, "win32", cc=(6, 1))
    assert p["status"] == "failed" and "sm61" in p["message"]
    p = triton_pkg.plan(None, {}, "win32")
    assert p["status"] == "failed" and "torch is not installed" in p["message"]
    p = triton_pkg.plan(("2.7.0", []), {}, "win32", cc=(7, 5))
    assert "Turing" in p["message"] and p["install"] == "triton-windows>=3.3,<3.4"


def test_plain_triton_on_windows_is_uninstalled_and_matching_one_kept():
    p = triton_pkg.plan(("2.9.0", []), {"triton": "3.5.0", "triton-windows": "3.5.1.post21"}, "win32")
    assert p["uninstall"] == ["triton"] and p["install"] is None and "shadows" in p["message"]
    p = triton_pkg.plan(("2.9.0", []), {"triton-windows": "3.5.1.post21"}, "win32")
    assert p["status"] == "ok" and "matches" in p["message"]


def test_linux_uses_torchs_declared_requirement():
    req = ['triton~=3.8.0; platform_system == "Linux" and python_version < "3.15"']
    assert triton_pkg.plan(("2.14.1", req), {"triton": "3.8.0"}, "linux")["status"] == "ok"
    p = triton_pkg.plan(("2.14.1", req), {}, "linux")
    assert p["status"] == "failed" and 'pip install "triton~=3.8.0"' in p["fix"]
    p = triton_pkg.plan(("2.6.0", ["triton==3.2.0"]), {"triton": "3.1.0"}, "linux")
    assert p["status"] == "failed" and "wants 3.2.x" in p["message"]
    # CPU wheels declare no triton: the table's 3.8 for torch 2.14 matches, another minor is only a warning
    assert triton_pkg.plan(("2.14.1+cpu", []), {"triton": "3.8.0"}, "linux")["status"] == "ok"
    p = triton_pkg.plan(("2.14.1+cpu", []), {"triton": "3.6.0"}, "linux")
    assert p["status"] == "warn" and "declares no Triton" in p["message"]


def _embedded_with(tmp_path: Path, torch_v: str, dists: dict) -> pyfolder.PythonTarget:
    py = portable_tree(tmp_path / "p")
    site = py / "Lib" / "site-packages"
    add_dist(site, "torch", torch_v)
    for name, v in dists.items():
        add_dist(site, name, v)
    return pyfolder.from_folder(str(py), make_ctx(tmp_path, platform="linux"))


def test_step_runs_pip_with_the_same_python_and_dash_s(tmp_path):
    target = _embedded_with(tmp_path, "2.9.0", {"triton": "3.5.0"})
    ran = []

    def run(argv, timeout=None):
        ran.append(argv)
        site = Path(target.site_packages[0])
        if "uninstall" in argv:
            for d in site.glob("triton-*.dist-info"):
                (d / "METADATA").unlink()
                d.rmdir()
        else:
            add_dist(site, "triton-windows", "3.5.1.post21")
        return 0, "ok"
    ctx = make_ctx(tmp_path, run=run)
    r = triton_pkg.step(target, ctx)
    assert r.status == "done", r.line()
    exe = target.exe
    assert ran == [[exe, "-s", "-m", "pip", "uninstall", "-y", "triton"],
                   [exe, "-s", "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-U",
                    "triton-windows>=3.5,<3.6"]]
    assert "installed triton-windows 3.5.1.post21" in r.message and "uninstalled triton" in r.message
    assert triton_pkg.step(target, ctx).status == "ok"  # second run: nothing to do


def test_step_check_no_pip_and_pip_failure(tmp_path):
    target = _embedded_with(tmp_path, "2.8.0", {})
    ctx = make_ctx(tmp_path, check=True)
    r = triton_pkg.step(target, ctx)
    assert r.status == "todo" and '"triton-windows>=3.4,<3.5"' in r.fix and ctx.commands == []
    assert triton_pkg.step(target, make_ctx(tmp_path), no_pip=True).status == "skipped"
    ctx = make_ctx(tmp_path, run=lambda argv, timeout=None: (1, "ERROR: No matching distribution found"))
    r = triton_pkg.step(target, ctx)
    assert r.status == "failed" and "No matching distribution" in r.message and "by hand" in r.fix


def test_declined_at_a_terminal(tmp_path):
    target = _embedded_with(tmp_path, "2.8.0", {})
    ctx = make_ctx(tmp_path, interactive=True, ask=lambda q: "n")
    r = triton_pkg.step(target, ctx)
    assert r.status == "skipped" and "declined" in r.message and ctx.commands == []
