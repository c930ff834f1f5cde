"""Importing the pack the way ComfyUI does (its folder path, any folder name), outside a server."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LOAD = textwrap.dedent("""
    import importlib.util, json, os, sys
    pack = sys.argv[1]
    name = pack.replace(".", "_x_")  # ComfyUI's module name for a custom node folder
    spec = importlib.util.spec_from_file_location(name, os.path.join(pack, "__init__.py"),
                                                  submodule_search_locations=[pack])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    print(json.dumps({"nodes": sorted(mod.NODE_CLASS_MAPPINGS), "web": mod.WEB_DIRECTORY,
                      "triton_cache": os.environ.get("TRITON_CACHE_DIR"),
                      "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
                      "mma_v3": os.environ.get("DISABLE_MMA_V3")}))
""")


def _pack_copy(tmp_path, folder_name):
    """The pack under another folder name, made of links to the repository's files."""
    pack = tmp_path / folder_name
    pack.mkdir()
    for item in REPO.iterdir():
        if item.name.startswith(".") or item.name in ("tests",):
            continue
        (pack / item.name).symlink_to(item, target_is_directory=item.is_dir())
    return pack


def _load(pack, env_extra=None, drop=()):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", *drop)}
    env.update(env_extra or {})
    r = subprocess.run([sys.executable, "-c", LOAD, str(pack)], capture_output=True, text=True, env=env,
                       timeout=300, cwd=pack.parent)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_a_simulated_older_card_compiles_with_its_mma_from_import(tmp_path):
    """TRITONKIT_FORCE_ARCH=86: Triton's DISABLE_MMA_V3 is set while the pack loads, before its compile workers
    start (they keep the environment they start with); a forced sm90 leaves it unset."""
    pack = _pack_copy(tmp_path, "ComfyUI-TritonKit")
    clean = {"DISABLE_MMA_V3": ""}
    res, err = _load(pack, {"TRITONKIT_FORCE_ARCH": "86"}, drop=clean)
    assert res["mma_v3"] == "1" and "could not" not in err, err
    res, _ = _load(pack, {"TRITONKIT_FORCE_ARCH": "90"}, drop=clean)
    assert res["mma_v3"] is None


def test_pack_imports_under_any_folder_name_outside_comfyui(tmp_path):
    res, err = _load(_pack_copy(tmp_path, "Some.Other-Name"))
    assert {"TritonKitSelfTest", "TritonKitAttention", "TritonKitFp8Fallback", "TritonKitCompileModel"} <= set(res["nodes"])
    assert res["web"] == "./web"
    assert "could not" not in err, err


def test_pack_applies_short_cache_folders_from_install_settings(tmp_path):
    pack = _pack_copy(tmp_path, "ComfyUI-TritonKit")
    (pack / "tritonkit_settings.json").write_text(json.dumps(
        {"triton_cache_dir": str(tmp_path / "tk" / "t"), "inductor_cache_dir": str(tmp_path / "tk" / "i")}))
    res, _ = _load(pack)
    assert res["triton_cache"] == str(tmp_path / "tk" / "t")
    assert res["inductor_cache"] == str(tmp_path / "tk" / "i")
    # a folder the user set on purpose wins
    res, _ = _load(pack, {"TRITON_CACHE_DIR": str(tmp_path / "mine")})
    assert res["triton_cache"] == str(tmp_path / "mine")
    assert res["inductor_cache"] == str(tmp_path / "tk" / "i")


def test_all_nodes_register_when_triton_is_broken(tmp_path):
    shadow = tmp_path / "shadow" / "triton"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('DLL load failed while importing libtriton: x')\n")
    res, err = _load(_pack_copy(tmp_path, "pack"), {"PYTHONPATH": str(shadow.parent)})
    assert {"TritonKitSelfTest", "TritonKitAttention", "TritonKitFp8Fallback", "TritonKitCompileModel"} <= set(res["nodes"]), err
