#!/usr/bin/env bash
# Runs bench/workflow.py on a GPU machine that has torch/triton/safetensors but neither ComfyUI
# nor its extra requirements. Prepare here first (every path is git-ignored):
#   bash bench/device_workflow.sh --prepare     # .device/comfyui.tar.gz (0.3.75), .device/comfyui-0.8.0.tar.gz,
#                                               # .device/whl/*.whl (ComfyUI's extras, comfy-kitchen, sageattention)
# then on the GPU machine, from the repository root (carry .device):
#   bash bench/device_workflow.sh [--comfyui 0.8.0] [workflow.py args...]   # results in $OUT (or artifacts/workflow)
#   (--comfyui <another release>: .device/comfyui-<v>.tar.gz and .device/whl-<v>/, prepared by hand)
#   bash bench/device_workflow.sh --setup-only [--comfyui 0.8.0]   # only install/unpack; then `source /tmp/tk_env.sh`
set -o pipefail
cd "$(dirname "$0")/.."

if [ "$1" = "--prepare" ]; then
  mkdir -p .device/whl
  tar -czf .device/comfyui.tar.gz --exclude='__pycache__' --exclude='*.pyc' \
    --exclude='.comfyui/tests' --exclude='.comfyui/tests-unit' --exclude='.comfyui/comfy_api_nodes' \
    --exclude='.comfyui/comfy/text_encoders/*_tokenizer' --exclude='.comfyui/comfy/sd1_tokenizer' \
    --exclude='.comfyui/custom_nodes' --exclude='.comfyui/output' --exclude='.comfyui/input' \
    --exclude='.comfyui/models' --exclude='.comfyui/user' --exclude='.comfyui/temp' .comfyui
  # What `import nodes` needs beyond the GPU image's packages (KINDS.md): torchsde (+trampoline)
  # for k-diffusion, av for comfy_api's video types.
  for p in torchsde==0.2.6 trampoline==0.1.2 av==16.0.1; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .device/whl "$p" || exit 1
  done
  # ComfyUI 0.8.0 (comfy-kitchen era): the upstream tree as scripts/setup_env.sh unpacks it.
  tar -czf .device/comfyui-0.8.0.tar.gz --exclude='__pycache__' --exclude='*.pyc' \
    --exclude='.comfyui-0.8.0/tests' --exclude='.comfyui-0.8.0/tests-unit' \
    --exclude='.comfyui-0.8.0/comfy_api_nodes' --exclude='.comfyui-0.8.0/custom_nodes' \
    --exclude='.comfyui-0.8.0/output' --exclude='.comfyui-0.8.0/input' --exclude='.comfyui-0.8.0/models' \
    --exclude='.comfyui-0.8.0/user' --exclude='.comfyui-0.8.0/temp' .comfyui-0.8.0
  # comfy-kitchen: 0.2.3 (what ComfyUI 0.8.0 shipped with, 0.6 MB) for the workflows; 0.2.40 (its int8
  # attention, an anchor of bench/attention.py) in .device/whl-ck without its 158 MB HIP library, useless on
  # NVIDIA: carry one or the other (.device/whl with av and 0.2.40 together exceed a call's 64 MiB).
  # sageattention 1.0.6: an attention anchor, pure Python + Triton.
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 -d .device/whl comfy-kitchen==0.2.3 || exit 1
  tmp="$(mktemp -d)"; mkdir -p .device/whl-ck
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$tmp" comfy-kitchen==0.2.40 || exit 1
  python3 - "$tmp"/comfy_kitchen-*.whl .device/whl-ck <<'PY' || exit 1
import os, sys, zipfile
src, dest = sys.argv[1], sys.argv[2]
out = os.path.join(dest, os.path.basename(src))
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist():
        if info.filename.startswith("comfy_kitchen/backends/hip/_C"):
            continue
        data = zin.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            data = b"".join(l + b"\n" for l in data.splitlines() if b"backends/hip/_C" not in l)
        zout.writestr(info, data)
PY
  rm -rf "$tmp"
  python3 -m pip download -q --no-deps -d .device/whl sageattention==1.0.6 || exit 1
  du -sh .device .device/*
  exit 0
fi

tree=.comfyui
archive=.device/comfyui.tar.gz
extra=
if [ "$1" = "--comfyui" ]; then
  case "$2" in
    0.3.75) ;;
    0.8.0) tree=.comfyui-0.8.0; archive=.device/comfyui-0.8.0.tar.gz ;;
    *)  # another release, prepared by hand: .device/comfyui-<v>.tar.gz unpacking to .comfyui-<v>/, and the
        # packages it needs beyond .device/whl (its comfy-kitchen, ...) as wheels in .device/whl-<v>/
      tree=".comfyui-$2"; archive=".device/comfyui-$2.tar.gz"; extra=".device/whl-$2"
      if [ ! -f "$archive" ] || [ ! -d "$extra" ]; then
        echo "--comfyui $2: needs $archive and $extra/ (0.3.75 and 0.8.0 come from --prepare)" >&2; exit 2
      fi ;;
  esac
  shift 2
fi
setup_only=0
if [ "$1" = "--setup-only" ]; then setup_only=1; shift; fi

OUT="${OUT:-artifacts/workflow}"
mkdir -p "$OUT" /tmp/tk_comfy
if [ ! -d /tmp/tk_site ]; then
  if ! ls .device/whl/*.whl >/dev/null 2>&1; then
    echo "no /tmp/tk_site and no .device/whl/*.whl to make it: carry .device/whl (an earlier call on this machine" >&2
    echo "may have made /tmp/tk_site; the machine was handed back since)" >&2; exit 2
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tk_site \
    .device/whl/*.whl || exit 1
fi
site=/tmp/tk_site
if [ -n "$extra" ]; then  # this release's own packages, first on the path
  site="/tmp/tk_site_${tree#.comfyui-}:/tmp/tk_site"
  [ -d "/tmp/tk_site_${tree#.comfyui-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target "/tmp/tk_site_${tree#.comfyui-}" "$extra"/*.whl || exit 1
fi
[ -f "/tmp/tk_comfy/$tree/main.py" ] || tar -xzf "$archive" -C /tmp/tk_comfy || exit 1
cat > /tmp/tk_env.sh <<ENV
export PYTHONPATH=$site\${PYTHONPATH:+:\$PYTHONPATH}
export TK_COMFYUI=/tmp/tk_comfy/$tree PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=\${TORCHINDUCTOR_CACHE_DIR:-/tmp/tk_inductor}
ENV
source /tmp/tk_env.sh
[ "$setup_only" = 1 ] && exit 0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/nvidia-smi.txt"
python3 bench/workflow.py --preset gpu --models-dir /tmp/tk_models --out "$OUT" "$@" 2>&1 | tee "$OUT/log.txt"
