#!/usr/bin/env bash
# Runs bench/workflow.py on a GPU machine that has torch/triton/safetensors but neither ComfyUI
# nor its extra requirements. Prepare here first (both paths are git-ignored):
#   bash bench/device_workflow.sh --prepare     # .device/comfyui.tar.gz + .device/whl/*.whl
# then on the GPU machine, from the repository root (carry .device):
#   bash bench/device_workflow.sh [workflow.py args...]     # results in $OUT (or artifacts/workflow)
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
  du -sh .device
  exit 0
fi

OUT="${OUT:-artifacts/workflow}"
mkdir -p "$OUT" /tmp/tk_comfy
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tk_site \
  .device/whl/*.whl || exit 1
export PYTHONPATH=/tmp/tk_site${PYTHONPATH:+:$PYTHONPATH}
tar -xzf .device/comfyui.tar.gz -C /tmp/tk_comfy || exit 1
export TK_COMFYUI=/tmp/tk_comfy/.comfyui PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/tk_inductor}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/nvidia-smi.txt"
python3 bench/workflow.py --preset gpu --models-dir /tmp/tk_models --out "$OUT" "$@" 2>&1 | tee "$OUT/log.txt"
