"""ComfyUI-TritonKit: Triton self-test, Triton attention, fp8 fallback casts.

ComfyUI imports this folder as a package under whatever name it was cloned as, so every
import inside is relative. Each feature registers on its own: one failing (a broken Triton,
an old ComfyUI) never stops the others, and importing the pack never fails."""
import importlib
import logging
import os

log = logging.getLogger("TritonKit")

NODE_CLASS_MAPPINGS = {}
NODE_DISPLAY_NAME_MAPPINGS = {}
WEB_DIRECTORY = "./web"

# Short Triton/Inductor cache folders that install.py chose where Windows long paths are off
# (tritonkit_settings.json beside this file); a user's own TRITON_CACHE_DIR/TORCHINDUCTOR_CACHE_DIR win.
try:
    importlib.import_module(".installer.longpaths", __name__).apply_settings(__path__[0])
except Exception:
    log.exception("TritonKit: could not apply tritonkit_settings.json")

# One ptxas for the whole process, the one Inductor switches Triton to at its first compile
# (installer/ptxas.py): otherwise kernels compiled before and after that switch are cached under
# two keys and a restarted ComfyUI compiles some of them again.
try:
    _ptxas = importlib.import_module(".installer.ptxas", __name__)
    _pinned = _ptxas.pin(os.environ, _ptxas.installed_dir("torch"), _ptxas.installed_dir("triton"))
    if _pinned:
        log.debug("TritonKit: Triton uses torch's ptxas %s from the start (TRITONKIT_PIN_PTXAS=0 stops this)",
                  _pinned)
except Exception:
    log.exception("TritonKit: could not choose ptxas")

# A simulated older GPU (TRITONKIT_FORCE_ARCH below 90): Triton compiles tl.dot with that card's mma.sync, not
# Hopper's wgmma (nodes/arch.py), set before the compile workers below start and before any compile.
try:
    if importlib.import_module(".nodes.arch", __name__).card_instructions(os.environ):
        log.info("TritonKit: TRITONKIT_FORCE_ARCH=%s: Triton compiles without wgmma (DISABLE_MMA_V3=1), as that "
                 "card's Triton must", os.environ.get("TRITONKIT_FORCE_ARCH"))
except Exception:
    log.exception("TritonKit: could not apply TRITONKIT_FORCE_ARCH's instructions")

# Compile workers (kernels/compile_pool.py), where Triton's cache holds none of the pack's kernels yet or the user
# turned them on (TRITONKIT_COMPILE_WORKERS): started now, in the background (the check too), so that they have
# imported torch and Triton before the first step needs them.
try:
    importlib.import_module(".kernels.compile_pool", __name__).start_at_launch(background=True)
except Exception:
    log.exception("TritonKit: could not start the compile workers")

_FEATURES = ("selftest", "attention", "fp8_fallback", "compile_model")

for _name in _FEATURES:
    try:
        _mod = importlib.import_module(f".nodes.{_name}", __name__)
        NODE_CLASS_MAPPINGS.update(_mod.NODE_CLASS_MAPPINGS)
        NODE_DISPLAY_NAME_MAPPINGS.update(_mod.NODE_DISPLAY_NAME_MAPPINGS)
    except Exception:
        log.exception("TritonKit: could not load the %s nodes", _name)

# The Triton panel's HTTP routes: only inside a running ComfyUI server (nodes/routes.py checks).
try:
    importlib.import_module(".nodes.routes", __name__).register()
except Exception:
    log.exception("TritonKit: could not register the Triton panel's routes")

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
