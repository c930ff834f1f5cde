#!/usr/bin/env bash
# The attention benchmark and the kernels' GPU tests on a GPU machine, in one call. Prepare here
# first: `bash bench/device_workflow.sh --prepare` (writes .device/whl-ck with comfy-kitchen 0.2.40
# and .device/whl with sageattention 1.0.6), then carry .device/whl-attn made by
#   mkdir -p .device/whl-attn && cp .device/whl/sageattention-*.whl .device/whl-ck/*.whl .device/whl-attn/
# On the GPU machine, from the repository root (results in $OUT, else artifacts/attention):
#   bash bench/device_attention.sh [bench/attention.py args...]
# TESTS_S / BENCH_S bound the two parts (seconds; TESTS_S=0 skips the tests).
set -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-artifacts/attention}"
mkdir -p "$OUT"
if ls .device/whl-attn/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-deps .device/whl-attn/*.whl 2>&1 | tail -2
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/tk_triton_cache}"
if [ "${TESTS_S:-170}" != 0 ]; then
  t0=$(date +%s)
  # the summary goes to a file of its own: a long bench log must not push it out of the output that returns
  timeout "${TESTS_S:-170}" python3 -m pytest -q -m gpu tests/test_attention.py tests/test_calibration.py \
    tests/test_fp8.py tests/test_fp8_linear.py tests/test_vector_add.py \
    -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/gpu_tests.txt")"
fi
t0=$(date +%s)
timeout "${BENCH_S:-380}" python3 bench/attention.py --rep 40 --rounds 3 --json "$OUT/attention.json" "$@" \
  > "$OUT/attention.txt" 2>&1
echo "bench rc=$? in $(( $(date +%s) - t0 )) s"
# the tables (the kernels' metadata and Triton's MLIR dumps of failed candidates stay in the file)
sed -n '/^| shape/,$p' "$OUT/attention.txt" | grep -v '^kernel:' | cut -c1-1500
