"""ComfyUI (0.3.75 or 0.8.0, the tree ``TK_COMFYUI`` names) imported in-process, with this pack
loaded the way ComfyUI loads it.

Why in-process rather than a server driven through ``/prompt``: the benchmark needs a timer
around every diffusion-model call (an ``APPLY_MODEL`` wrapper, ComfyUI's own extension point),
``torch.cuda`` peak-memory counters, the dynamo/Inductor counters and the final latent as a
tensor, all of which live in the process that runs the model. The nodes are still ComfyUI's
own classes, called with the same inputs the executor would pass (``UNETLoader.load_unet``,
``KSampler.sample``, the V3 ``TorchCompileModel.execute``) and the pack is loaded with
``nodes.load_custom_node`` exactly as ComfyUI loads ``custom_nodes/`` at start-up; what is
skipped is only the HTTP/executor layer, which does no work on tensors.

Nothing here parses ``sys.argv``: ComfyUI's ``args`` keep their defaults, except ``cpu``
(set before ``comfy.model_management`` is imported) for CPU-only runs.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_STATE: dict = {}


def comfyui_dir() -> Path:
    return Path(os.environ.get("TK_COMFYUI", REPO / ".comfyui"))


def _kitchen_overlay(cdir: Path) -> None:
    """ComfyUI 0.8+ needs comfy-kitchen (and its frontend packages); where they are not installed
    in this Python but sit in an overlay folder (``TK_COMFYUI_SITE``, or ``<tree>-site`` next to
    the tree, as scripts/setup_env.sh lays them out), that folder goes first on sys.path."""
    if not (cdir / "comfy" / "quant_ops.py").is_file():
        return
    try:
        import comfy_kitchen  # noqa: F401
        return
    except ImportError:
        pass
    for site in (os.environ.get("TK_COMFYUI_SITE"), f"{cdir}-site"):
        if site and (Path(site) / "comfy_kitchen").is_dir() and site not in sys.path:
            sys.path.insert(0, site)
            return


def setup(device: str, models_dir: str | os.PathLike, pack: bool = True) -> dict:
    """Imports ComfyUI (once per process) for ``device`` ("cpu" or "cuda"), registers
    ``models_dir`` as a ``diffusion_models`` folder and loads this pack. Returns a dict with
    the modules and the node classes (by node id)."""
    if _STATE:
        import folder_paths
        folder_paths.add_model_folder_path("diffusion_models", str(models_dir), is_default=True)
        return _STATE
    cdir = comfyui_dir()
    if not (cdir / "nodes.py").is_file():
        raise RuntimeError(f"ComfyUI not found at {cdir} (set TK_COMFYUI or run scripts/setup_env.sh)")
    if str(cdir) not in sys.path:
        sys.path.insert(0, str(cdir))
    _kitchen_overlay(cdir)
    import comfy.options  # noqa: F401  (args parsing stays off: defaults)
    import comfy.cli_args
    if device == "cpu":
        comfy.cli_args.args.cpu = True
    import folder_paths
    folder_paths.add_model_folder_path("diffusion_models", str(models_dir), is_default=True)
    import comfy.model_management as mm
    import comfy.patcher_extension
    import comfy.utils
    import nodes
    from comfy_extras import nodes_torch_compile

    comfy.utils.PROGRESS_BAR_ENABLED = False
    pack_ok = None
    if pack:
        pack_ok = asyncio.run(nodes.load_custom_node(str(REPO)))
    classes = dict(nodes.NODE_CLASS_MAPPINGS)
    classes["TorchCompileModel"] = nodes_torch_compile.TorchCompileModel
    imported_directly = []
    if pack and os.environ.get("TK_BENCH_IMPORT_UNREGISTERED") == "1":
        # Development aid only: node modules that exist but are not (yet) in the pack's
        # registration list are imported from the loaded package and reported as such.
        import importlib
        pkg = str(REPO).replace(".", "_x_")
        for mod_name in ("fp8_fallback", "attention"):
            if (REPO / "nodes" / f"{mod_name}.py").is_file():
                try:
                    mod = importlib.import_module(f"{pkg}.nodes.{mod_name}")
                    for k, v in mod.NODE_CLASS_MAPPINGS.items():
                        if k not in classes:
                            classes[k] = v
                            imported_directly.append(k)
                except Exception as e:  # noqa: BLE001
                    logging.warning("could not import nodes.%s: %s", mod_name, e)
    _STATE.update(nodes=nodes, mm=mm, folder_paths=folder_paths, patcher_extension=comfy.patcher_extension,
                  classes=classes, pack_loaded=pack_ok, comfyui_dir=str(cdir),
                  imported_directly=imported_directly)
    logging.getLogger().setLevel(logging.WARNING)
    return _STATE


def call_node(name: str, **inputs):
    """Runs one node the way the executor does (V1: an instance's FUNCTION; V3: the classmethod
    ``execute``) and returns its outputs as a tuple."""
    cls = _STATE["classes"].get(name)
    if cls is None:
        raise KeyError(f"node {name!r} is not registered (pack loaded: {_STATE.get('pack_loaded')})")
    if hasattr(cls, "FUNCTION") and not hasattr(cls, "define_schema"):
        out = getattr(cls(), cls.FUNCTION)(**inputs)
    else:
        out = cls.execute(**inputs)
    if asyncio.iscoroutine(out):
        out = asyncio.run(out)
    if isinstance(out, dict):
        out = out.get("result", ())
    if hasattr(out, "args") and hasattr(out, "result"):
        out = out.args
    return tuple(out)


def node_module(name: str):
    """The module that defines node ``name`` (where its counters live)."""
    cls = _STATE["classes"].get(name)
    return sys.modules.get(cls.__module__) if cls is not None else None
