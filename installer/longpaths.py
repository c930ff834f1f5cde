"""Step 6: Windows' 260-character path limit.

TorchInductor writes files with very long names under %TEMP%\\torchinductor_<user>; with long
paths off that fails ("[WinError 206] The filename or extension is too long"). Enabling them
needs an administrator and a reboot, so install.py says how, and meanwhile gives the pack short
Triton/Inductor cache folders (a small settings file in the pack folder, read when the pack loads;
environment variables the user set win)."""
from __future__ import annotations

import json
import os

from .common import Context, StepResult

KEY = r"SYSTEM\CurrentControlSet\Control\FileSystem"
SETTINGS_FILE = "tritonkit_settings.json"
ENABLE_HOWTO = ("enable long paths (administrator PowerShell: New-ItemProperty -Path "
                "'HKLM:\\SYSTEM\\CurrentControlSet\\Control\\FileSystem' -Name LongPathsEnabled -Value 1 "
                "-PropertyType DWORD -Force), then reboot")


def long_paths_enabled(read_registry) -> bool | None:
    """True/False from the registry; None when it can't be read."""
    v = read_registry("HKLM", KEY, "LongPathsEnabled")
    if v is None:
        return None
    try:
        return int(v) == 1
    except (TypeError, ValueError):
        return None


def short_cache_root(env: dict) -> str | None:
    """A short folder for the pack's caches: %LOCALAPPDATA%\\tk (far shorter than
    %TEMP%\\torchinductor_<user>), else %USERPROFILE%\\tk."""
    base = env.get("LOCALAPPDATA") or env.get("USERPROFILE")
    return os.path.join(base, "tk") if base else None


def read_settings(pack_dir: str) -> dict:
    try:
        with open(os.path.join(pack_dir, SETTINGS_FILE), encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def apply_settings(pack_dir: str, env: dict | None = None) -> dict:
    """Sets TRITON_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR from the settings file where the user has not
    set them; for the pack to call when it loads. Returns what it set."""
    env = os.environ if env is None else env
    s = read_settings(pack_dir)
    applied = {}
    for key, var in (("triton_cache_dir", "TRITON_CACHE_DIR"), ("inductor_cache_dir", "TORCHINDUCTOR_CACHE_DIR")):
        if s.get(key) and not env.get(var):
            env[var] = s[key]
            applied[var] = s[key]
    return applied


def effective_cache_dirs(default: dict[str, str], pack_dir: str | None, env: dict) -> dict[str, str]:
    """The cache folders Triton and Inductor will use once the pack's settings are applied."""
    s = read_settings(pack_dir) if pack_dir else {}
    out = dict(default)
    if s.get("triton_cache_dir") and not env.get("TRITON_CACHE_DIR"):
        out["triton"] = s["triton_cache_dir"]
    if s.get("inductor_cache_dir") and not env.get("TORCHINDUCTOR_CACHE_DIR"):
        out["inductor"] = s["inductor_cache_dir"]
    return out


def step(platform: str, ctx: Context, pack_dir: str | None) -> StepResult:
    if platform != "win32":
        return StepResult("long paths", "skipped", "not Windows: no 260-character path limit")
    enabled = long_paths_enabled(ctx.read_registry)
    if enabled is None:
        return StepResult("long paths", "skipped", "LongPathsEnabled can't be read on this machine (no Windows "
                          "registry here)")
    if enabled:
        return StepResult("long paths", "ok", "long paths are enabled (LongPathsEnabled = 1)")
    root = short_cache_root(ctx.env)
    want = {"triton_cache_dir": os.path.join(root, "t"), "inductor_cache_dir": os.path.join(root, "i")} \
        if root else {}
    msg = "long paths are off (LongPathsEnabled = 0): torch.compile can fail with [WinError 206]"
    user_set = [v for v in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR") if ctx.env.get(v)]
    if not want or pack_dir is None:
        return StepResult("long paths", "warn", msg, ENABLE_HOWTO)
    have = read_settings(pack_dir)
    if all(have.get(k) == v for k, v in want.items()):
        return StepResult("long paths", "warn", msg + f"; the pack already uses the short cache folder {root}",
                          ENABLE_HOWTO, {"settings": have})
    if ctx.check:
        return StepResult("long paths", "todo", msg + f"; install.py would give the pack short cache folders in "
                          f"{root}", ENABLE_HOWTO)
    new = {**have, **want}
    path = os.path.join(pack_dir, SETTINGS_FILE)
    try:
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(new, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as exc:
        return StepResult("long paths", "failed", msg + f"; could not write {path} ({exc.strerror or exc})",
                          ENABLE_HOWTO)
    extra = f" ({', '.join(user_set)} set by you still win)" if user_set else ""
    return StepResult("long paths", "done", msg + f"; set the pack's caches to the short folder {root}{extra}",
                      ENABLE_HOWTO, {"settings": new})
