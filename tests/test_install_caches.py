"""install.py step 5: fingerprinted Triton/Inductor caches; deletes only inside them, never through links."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from fixtures.install_fakes import make_ctx, portable_tree, snapshot
from tritonkit.installer import caches, pyfolder


def _fill(d: Path, n: int = 3, size: int = 1000) -> None:
    (d / "ab" / "cd").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (d / "ab" / f"k{i}.so").write_bytes(b"x" * size)
    (d / "ab" / "cd" / "deep.json").write_text("{}")


@pytest.fixture
def machine(tmp_path):
    ctx = make_ctx(tmp_path, platform="linux")
    home = Path(ctx.home)
    dirs = {"triton": str(home / ".triton" / "cache"), "inductor": str(Path(ctx.env["TEMP"]) / "torchinductor_me")}
    for d in dirs.values():
        _fill(Path(d))
    # neighbours that must survive
    (home / ".triton" / "dump").mkdir(parents=True)
    (home / ".triton" / "dump" / "keep.txt").write_text("keep")
    (Path(ctx.env["TEMP"]) / "other_app").mkdir()
    (Path(ctx.env["TEMP"]) / "other_app" / "keep.txt").write_text("keep")
    target = pyfolder.from_folder(str(portable_tree(tmp_path / "p")), ctx)
    return ctx, dirs, target, tmp_path


def fp(**kw):
    base = {"python": "3.12.7", "torch": "2.9.0", "torch_cuda": "12.8", "triton": "triton-windows 3.5.1",
            "ptxas": None, "cuda_path": None, "c_compiler": "TinyCC"}
    base.update(kw)
    return base


def _outside(snap: dict, dirs: dict, root: Path) -> dict:
    rels = [os.path.relpath(d, root) for d in dirs.values()]
    return {k: v for k, v in snap.items() if not any(k == r or k.startswith(r + os.sep) for r in rels)
            and not k.endswith(caches.FINGERPRINT_SUFFIX)}


def test_first_run_records_and_keeps(machine):
    ctx, dirs, target, root = machine
    before = snapshot(root)
    r = caches.step(target, dirs, fp(), ctx)
    assert r.status == "ok" and "first run for " + caches.install_id(target) in r.message
    for d in dirs.values():
        assert caches.read_fingerprint(d, caches.install_id(target)) == {**fp(), "install": caches.install_id(target)}
        assert json.loads(Path(caches.fingerprint_path(d)).read_text())["format"] == caches.FORMAT
        assert Path(d, "ab", "k0.so").exists()
    assert _outside(snapshot(root), dirs, root) == _outside(before, dirs, root)
    assert caches.step(target, dirs, fp(), ctx).status == "ok"


def test_fingerprint_change_clears_only_the_two_caches(machine):
    ctx, dirs, target, root = machine
    caches.step(target, dirs, fp(), ctx)
    before = snapshot(root)
    r = caches.step(target, dirs, fp(triton="triton-windows 3.5.2"), ctx)
    assert r.status == "done", r.line()
    assert "triton: triton-windows 3.5.1 -> triton-windows 3.5.2" in r.message
    assert "freed 5.9 KiB" in r.message  # 2 x (3 x 1000 + 2) bytes
    for d in dirs.values():
        assert os.path.isdir(d) and os.listdir(d) == []  # emptied, the folder itself kept
    assert _outside(snapshot(root), dirs, root) == _outside(before, dirs, root)
    assert caches.step(target, dirs, fp(triton="triton-windows 3.5.2"), ctx).status == "ok"


def test_symlink_inside_a_cache_is_not_followed(machine):
    ctx, dirs, target, root = machine
    precious = root / "precious"
    precious.mkdir()
    (precious / "data.bin").write_bytes(b"important" * 100)
    os.symlink(precious, Path(dirs["triton"]) / "ab" / "link_to_dir")
    os.symlink(precious / "data.bin", Path(dirs["inductor"]) / "link_to_file")
    before = snapshot(precious)
    r = caches.step(target, dirs, fp(), ctx, force=True, reason="--clear-caches")
    assert r.status == "done" and "--clear-caches" in r.message
    assert snapshot(precious) == before and (precious / "data.bin").read_bytes().startswith(b"important")
    assert not os.path.lexists(Path(dirs["triton"]) / "ab" / "link_to_dir")  # the link itself is gone
    assert os.listdir(dirs["inductor"]) == []


def test_cache_folder_that_is_a_link_or_a_root_is_refused(machine):
    ctx, dirs, target, root = machine
    elsewhere = root / "elsewhere"
    _fill(elsewhere)
    linked = root / "linked_cache"
    os.symlink(elsewhere, linked)
    r = caches.step(target, {"triton": str(linked)}, fp(), ctx, force=True)
    assert r.status == "failed" and "is itself a link" in r.message
    assert (elsewhere / "ab" / "k0.so").exists()
    assert caches.refuse_reason("/", ctx.home, ctx.env)
    assert caches.refuse_reason(ctx.home, ctx.home, ctx.env)
    assert caches.refuse_reason(ctx.env["TEMP"], ctx.home, ctx.env)
    assert caches.refuse_reason(dirs["triton"], ctx.home, ctx.env) is None


def test_check_mode_reports_and_writes_nothing(machine):
    ctx, dirs, target, root = machine
    caches.step(target, dirs, fp(), ctx)
    before = snapshot(root)
    chk = make_ctx(root, platform="linux", check=True)
    r = caches.step(target, dirs, fp(torch="2.10.0"), chk)
    assert r.status == "todo" and "would clear" in r.message and "torch: 2.9.0 -> 2.10.0" in r.message
    assert snapshot(root) == before


def test_fingerprint_of_a_target(tmp_path):
    ctx = make_ctx(tmp_path, platform="linux")
    py = portable_tree(tmp_path / "p")
    site = py / "Lib" / "site-packages"
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text("__version__ = '2.9.0+cu128'\ncuda: Optional[str] = '12.8'\n")
    tdir = site / "triton"
    (tdir / "backends" / "nvidia" / "bin").mkdir(parents=True)
    (tdir / "backends" / "nvidia" / "bin" / "ptxas.exe").write_bytes(b"ptxas")
    (tdir / "runtime" / "tcc").mkdir(parents=True)
    (tdir / "runtime" / "tcc" / "tcc.exe").write_bytes(b"tcc")
    target = pyfolder.from_folder(str(py), ctx)
    f = caches.fingerprint(target, {}, {"triton-windows": "3.5.1"}, "2.9.0+cu128", str(tdir), which=lambda n: None)
    assert f["torch_cuda"] == "12.8" and f["triton"] == "triton-windows 3.5.1"
    assert "ptxas.exe (5 bytes" in f["ptxas"] and f["c_compiler"].startswith("TinyCC")
    f2 = caches.fingerprint(target, {"CC": "cl"}, {"triton-windows": "3.5.1"}, "2.9.0+cu128", str(tdir))
    assert caches.changes(f, f2) and caches.changes(f, f2)[0].startswith("c_compiler")


# ------------------------------------------------------------------ two installs sharing the caches
@pytest.fixture
def two(machine):
    ctx, dirs, a, root = machine
    b = pyfolder.from_folder(str(portable_tree(root / "desktop")), ctx)
    assert caches.install_id(a) != caches.install_id(b)
    fa = fp(python="3.12.7", torch="2.9.0", triton="triton-windows 3.5.1")
    fb = fp(python="3.13.2", torch="2.10.0", triton="triton-windows 3.6.0", c_compiler="MSVC cl.exe")
    return ctx, dirs, (a, fa), (b, fb), root


def _kernels(dirs) -> dict:
    return {n: sorted(os.listdir(d)) for n, d in dirs.items()}


def test_two_installs_alternating_never_clear(two):
    """The seen bug: install.py for one install cleared the caches the other had filled, and back."""
    ctx, dirs, (a, fa), (b, fb), root = two
    for target, f in [(a, fa), (b, fb)] * 3:
        _fill(Path(dirs["triton"]), n=2)
        before = _kernels(dirs)
        r = caches.step(target, dirs, f, ctx)
        assert r.status == "ok", r.line()
        assert _kernels(dirs) == before
    assert "shared with 1 other install(s), whose kernels are kept: " + caches.install_id(a) in r.message
    state = caches.read_state(dirs["triton"])
    assert set(state["installs"]) == {caches.install_id(a), caches.install_id(b)}
    assert state["cleared"] is None


def test_a_real_change_of_one_install_clears_and_names_it(two):
    ctx, dirs, (a, fa), (b, fb), root = two
    caches.step(a, dirs, fa, ctx)
    caches.step(b, dirs, fb, ctx)
    r = caches.step(b, dirs, {**fb, "triton": "triton-windows 3.6.1"}, ctx)
    assert r.status == "done", r.line()
    assert caches.install_id(b) + " changed since its last run" in r.message
    assert "triton: triton-windows 3.6.0 -> triton-windows 3.6.1" in r.message
    assert "shared with 1 other install(s): " + caches.install_id(a) in r.message
    assert all(os.listdir(d) == [] for d in dirs.values())
    # a's record is kept, and a running again with its unchanged set-up clears nothing
    _fill(Path(dirs["triton"]))
    assert caches.step(a, dirs, fa, ctx).status == "ok" and os.listdir(dirs["triton"])


def test_python_patch_release_keeps_minor_release_clears(two):
    ctx, dirs, (a, fa), _, root = two
    caches.step(a, dirs, fa, ctx)
    assert caches.step(a, dirs, {**fa, "python": "3.12.10"}, ctx).status == "ok"
    r = caches.step(a, dirs, {**fa, "python": "3.13.1"}, ctx)
    assert r.status == "done" and "python: 3.12.10 -> 3.13.1" in r.message


def test_a_machine_wide_change_clears_once_for_both_installs(two):
    """A new CUDA_PATH is seen by both installs; the second finds the folder already cleared for it."""
    ctx, dirs, (a, fa), (b, fb), root = two
    caches.step(a, dirs, fa, ctx)
    caches.step(b, dirs, fb, ctx)
    cuda = "C:\\Program Files\\NVIDIA GPU Computing Toolkit\\CUDA\\v12.8"
    r = caches.step(a, dirs, {**fa, "cuda_path": cuda}, ctx)
    assert r.status == "done" and "cuda_path: None -> " + cuda in r.message
    _fill(Path(dirs["triton"]))  # a compiles again
    before = _kernels(dirs)
    r = caches.step(b, dirs, {**fb, "cuda_path": cuda}, ctx)
    assert r.status == "ok" and "already had it cleared" in r.message, r.line()
    assert _kernels(dirs) == before
    # but b changing more than that (its torch too) still clears
    r = caches.step(b, dirs, {**fb, "cuda_path": "D:\\cuda", "torch": "2.10.1"}, ctx)
    assert r.status == "done"


def test_check_mode_names_the_install_and_writes_nothing(two):
    ctx, dirs, (a, fa), (b, fb), root = two
    caches.step(a, dirs, fa, ctx)
    caches.step(b, dirs, fb, ctx)
    before = snapshot(root)
    chk = make_ctx(root, platform="linux", check=True)
    assert caches.step(a, dirs, fa, chk).status == "ok"
    r = caches.step(a, dirs, {**fa, "torch": "2.9.1"}, chk)
    assert r.status == "todo" and caches.install_id(a) in r.message and "torch: 2.9.0 -> 2.9.1" in r.message
    assert snapshot(root) == before


def test_a_first_format_record_becomes_one_install(machine):
    ctx, dirs, target, root = machine
    me = caches.install_id(target)
    old = {**fp(), "python": f"3.12.7 {me}"}  # what the first format wrote: one fingerprint, version + path
    for d in dirs.values():
        Path(caches.fingerprint_path(d)).write_text(json.dumps(old))
    assert caches.read_fingerprint(dirs["triton"], me)["python"] == "3.12.7"
    assert caches.step(target, dirs, fp(), ctx).status == "ok"  # same set-up: nothing cleared
    r = caches.step(target, dirs, fp(torch="2.9.1"), ctx)
    assert r.status == "done" and me in r.message


def test_one_install_spelled_two_ways_is_one_key(tmp_path):
    ctx = make_ctx(tmp_path)  # a Windows target
    t = pyfolder.from_folder(str(portable_tree(tmp_path / "P")), ctx)
    upper = dataclasses.replace(t, exe="C:\\X\\Python.EXE")
    lower = dataclasses.replace(t, exe="c:/x/python.exe")
    assert caches.install_id(upper) == caches.install_id(lower)
    link = tmp_path / "python-link.exe"
    os.symlink(t.exe, link)  # the same python.exe reached through a link
    assert caches.install_id(dataclasses.replace(t, exe=str(link))) == caches.install_id(t)
