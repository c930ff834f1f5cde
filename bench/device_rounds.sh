#!/usr/bin/env bash
# Issue 12's measurements in one GPU call, each part bounded in seconds (0 or unset skips it):
#   TESTS_S  the kernels' GPU tests, verbose, to $OUT/gpu_tests.txt (TESTS_FILES / TESTS_K narrow them)
#   FLUX_S   Flux scaled-fp8 eager rounds, @86 / @89 / native: default, both nodes, fp8 Fallback alone
#            (3 rounds, 6 steps; FLUX_PLAN, FLUX_ROUNDS replace the plan and the rounds)
#   BENCH_S  bench/attention.py (3 interleaved rounds; BENCH_SHAPES a subset of its shapes, e.g. wan14b,sd15),
#            its calibration store (the `auto` picks' timings) to attn_cal/
#   HUN_S    HunyuanVideo scaled-fp8 eager rounds, @86 / @89 / native, default against both nodes
#            (2 rounds, 3 steps; HUN_PLAN, HUN_ROUNDS replace the plan and the rounds)
#            FLUX_PLAN / HUN_PLAN: the default plans mix @86 / @89 with native runs, so their simulated runs compile
#            as Hopper (wgmma) code (bench/workflow.py --sim-mma auto says so in the log); a plan of @86 / @89 runs
#            only compiles them with mma.sync, as the cards' Triton does
#   REG_S    issue 13: Flux through the Triton Compile Model @86, cold compile (empty cache folders), the
#            second size, and a warm restart in a new process (4 steps; REG_PLAN, REG_PRESET, REG_STEPS
#            replace the plan, the preset and the steps; TK_BENCH_TRACE_COMPILES=1 prints which Triton
#            compiles of the cold and the restarted process missed Triton's cache)
#   STORED_S issue 13's stored case: HunyuanVideo natively through the Triton Compile Model, the calibration stored
#            by a first process, each later process on empty compile caches (Triton's included), interleaved
#            A B A B (STORED_ORDER): A = TRITONKIT_CALIBRATION_DEFER=0 (the stored choices' kernels compile as the
#            eager glue launches them, one after another), B = they compile in the background, in threads
#            (TRITONKIT_COMPILE_WORKERS=0), and the glue runs ComfyUI's path meanwhile, C = B with
#            TRITONKIT_COMPILE_WORKERS=${STORED_WORKERS:-4} (those compiles in worker processes,
#            kernels/compile_pool.py), D = the default (no variable: workers since Triton's cache is cold);
#            each process at most STORED_S seconds, traced
#   COLD_S   issue 12's cold first step: HunyuanVideo with both nodes @86 (COLD_PLAN), COLD_STEPS (7) steps, every
#            process with its own empty Triton cache and calibration folders, interleaved A B A B (COLD_ORDER);
#            COLD_<letter> (COLD_A, COLD_B...): the environment that letter's processes run with (e.g.
#            COLD_A="TRITONKIT_PLAYOFF_IN_MODEL=0"), COLD_PLAN_<letter> a plan of their own; each process at
#            most COLD_S seconds, traced; COLD_PRESET another preset (gpu-scaled: Flux, with COLD_PLAN=flux-scaled:both@86);
#            COLD_SEED_PLAN (with COLD_SEED_PRESET, default gpu-scaled): a second model on a warm cache. One process
#            first runs that plan (e.g. flux-scaled:both) into a seed Triton cache and calibration folder, and each
#            cold process starts on a copy of both, as a user who ran that model before
#            (e.g. COLD_SEED_PLAN=flux-scaled:both COLD_PLAN=hunyuan-scaled:both COLD_B="TRITONKIT_COMPILE_WORKERS=auto")
#   CAL_S    bench/calibration_cost.py for each of CAL_SPECS ("shape:rounds[:arch] ...", default "wan:3: hunyuan:2:"),
#            CAL_CONFIGS its --configs (default before,now); each spec at most CAL_S seconds
#   REQUIRE_GPU  a word the GPU's name must contain (e.g. H200): the call exits 3 at once otherwise, before any part
#   FLUX_ARGS / HUN_ARGS  more bench/workflow.py options for those parts (e.g. --warm-rounds for compiled rounds)
#   COMFYUI_VERSION  the ComfyUI the workflows run on (default 0.8.0; another needs bench/device_workflow.sh's files)
#   SMI_MS   sample the GPU's clocks, power and temperature every SMI_MS ms into $OUT/smi.csv while the call runs
#            (`python3 bench/first_steps.py --smi $OUT/smi.csv <workflow.json>` gives each run's medians)
# The workflows run on ComfyUI 0.8.0 with a cold calibration (one folder for the whole call).
# Prepare here: `bash bench/device_workflow.sh --prepare`, then carry .device/whl and
# .device/comfyui-0.8.0.tar.gz (and .device/whl-attn for comfy-kitchen 0.2.40 in the attention bench, if the
# 64 MiB a call carries allow). On the GPU machine, from the repository root:
#   TESTS_S=200 FLUX_S=150 BENCH_S=120 HUN_S=230 bash bench/device_rounds.sh
#   STORED_S=150 bash bench/device_rounds.sh
set -o pipefail
cd "$(dirname "$0")/.."
O="${OUT:-artifacts/rounds}"
mkdir -p "$O"
# everything printed also goes to a file whose name sorts first: a device call returns only the first 8 files of
# $OUT, and a filter on the printed lines (cut, grep) then loses nothing
exec > >(tee -a "$O/00_summary.txt") 2>&1
CAL="${CAL_DIR:-/tmp/tk_cal_rounds}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/tk_triton}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ -n "${REQUIRE_GPU:-}" ] && ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q "$REQUIRE_GPU"; then
  echo "not a $REQUIRE_GPU: nothing run"; exit 3
fi
SMI_PID=
if [ -n "${SMI_MS:-}" ]; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader,nounits -lms "$SMI_MS" > "$O/smi.csv" 2>/dev/null &
  SMI_PID=$!
fi
if [ "${TESTS_S:-0}" != 0 ]; then
  t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout "$TESTS_S" python3 -m pytest -v -m gpu ${TESTS_FILES:-tests/test_attention.py tests/test_calibration.py \
    tests/test_fp8.py tests/test_fp8_linear.py tests/test_vector_add.py} ${TESTS_K:+-k "$TESTS_K"} \
    -p no:cacheprovider --tb=short -rf --durations=12 > "$O/gpu_tests.txt" 2>&1
  echo "gpu tests rc=$? in $(( $(date +%s) - t0 )) s"
  grep -E 'FAILED|ERROR' "$O/gpu_tests.txt" | grep -v '^kernel:' | cut -c1-300 | head -20
  grep -E 'passed|failed' "$O/gpu_tests.txt" | tail -1
fi
runs_table() {  # the rounds' summary, then each run's s/step, × default, first step and cosine
  sed -n '/^| configuration/,/^$/p' "$1" 2>/dev/null
  sed -n '/^| run /,/^$/p' "$1" 2>/dev/null | cut -d'|' -f2,7,8,10,14 | head -24
}
if [ "${FLUX_S:-0}" != 0 ]; then
  OUT="$O/flux" timeout "$FLUX_S" bash bench/device_workflow.sh --comfyui "${COMFYUI_VERSION:-0.8.0}" --preset gpu-scaled --steps 6 \
    --rounds "${FLUX_ROUNDS:-3}" --budget-s $(( FLUX_S - 10 )) --calibration-dir "$CAL" \
    --plan "${FLUX_PLAN:-flux-scaled:default@86,flux-scaled:both@86,flux-scaled:fp8@86,flux-scaled:default@89,flux-scaled:both@89,flux-scaled:default,flux-scaled:both,flux-scaled:fp8}" \
    ${FLUX_ARGS:-} > "$O/flux.log" 2>&1
  echo "flux rc=$?"; rm -rf /tmp/tk_models/flux*
  runs_table "$O/flux/workflow.md"
fi
if [ "${BENCH_S:-0}" != 0 ]; then
  # shellcheck disable=SC2046
  python3 -m pip install -q --no-deps $(ls .device/whl/sageattention-*.whl .device/whl-attn/*.whl 2>/dev/null) 2>&1 | tail -1
  t0=$(date +%s)
  # its calibration store (empty at the start) comes back with the figures: each `auto` pick's timings
  rm -rf "$O/attn_cal"
  timeout "$BENCH_S" python3 bench/attention.py --rep 40 --rounds 3 ${BENCH_SHAPES:+--shapes "$BENCH_SHAPES"} \
    --json "$O/attention.json" --calibration-dir "$O/attn_cal" > "$O/attention.txt" 2>&1
  echo "bench rc=$? in $(( $(date +%s) - t0 )) s"
  sed -n '/^| shape/,/^$/p' "$O/attention.txt" | cut -c1-1600
fi
if [ "${HUN_S:-0}" != 0 ]; then
  OUT="$O/hun" timeout "$HUN_S" bash bench/device_workflow.sh --comfyui "${COMFYUI_VERSION:-0.8.0}" --preset gpu-hunyuan-scaled --steps 3 \
    --rounds "${HUN_ROUNDS:-2}" --budget-s $(( HUN_S - 10 )) --calibration-dir "$CAL" \
    --plan "${HUN_PLAN:-hunyuan-scaled:default@86,hunyuan-scaled:both@86,hunyuan-scaled:default@89,hunyuan-scaled:both@89,hunyuan-scaled:default,hunyuan-scaled:both}" \
    ${HUN_ARGS:-} > "$O/hun.log" 2>&1
  echo "hun rc=$?"
  runs_table "$O/hun/workflow.md"
fi
if [ "${REG_S:-0}" != 0 ]; then
  python3 -c "import torch; from torch import compiler as c; print('torch', torch.__version__, 'ahead-of-time load:', callable(getattr(c, 'load_compiled_function', None)))"
  rm -rf /tmp/tk_cc
  OUT="$O/regional" timeout "$REG_S" bash bench/device_workflow.sh --comfyui "${COMFYUI_VERSION:-0.8.0}" --preset "${REG_PRESET:-gpu-scaled}" --steps "${REG_STEPS:-4}" \
    --compile-cache /tmp/tk_cc --restart --budget-s $(( REG_S - 10 )) --calibration-dir "$CAL" \
    --plan "${REG_PLAN:-flux-scaled:both:regional@86}" > "$O/regional.log" 2>&1
  echo "regional rc=$?"
  grep -E 'TritonKit compile:' "$O/regional.log" | cut -c1-400 | tail -8
  sed -n '/^| run /,/^$/p' "$O/regional/workflow.md" 2>/dev/null | head -12
  grep -iE 'regional|restart|second' "$O/regional/workflow.md" 2>/dev/null | grep -v '^| run' | cut -c1-400 | head -12
  if [ -n "${TK_BENCH_TRACE_COMPILES:-}" ]; then  # which Triton compiles missed the cache, cold and restarted
    python3 - "$O/regional/workflow.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    for part, rec in (("cold", r), ("restart", r.get("warm_restart") or {})):
        print(r["run"], part, json.dumps(rec.get("triton_compiles"))[:1500])
PY
  fi
fi
if [ "${CAL_S:-0}" != 0 ]; then
  for spec in ${CAL_SPECS:-wan:3: hunyuan:2:}; do
    IFS=: read -r shape rounds arch <<< "$spec"
    t0=$(date +%s)
    timeout "$CAL_S" python3 bench/calibration_cost.py --shape "$shape" --rounds "${rounds:-3}" ${arch:+--arch "$arch"} \
      --configs "${CAL_CONFIGS:-before,now}" --json "$O/calibration_${shape}_${arch:-native}.json" \
      > "$O/calibration_${shape}_${arch:-native}.txt" 2>&1
    echo "calibration_cost $spec rc=$? in $(( $(date +%s) - t0 )) s"
    sed -n '/: median (min/,$p' "$O/calibration_${shape}_${arch:-native}.txt"
  done
fi
if [ "${STORED_S:-0}" != 0 ]; then
  for r in P0 ${STORED_ORDER:-A1 B1 A2 B2}; do
    case $r in A*) defer=0 workers=0 ;; C*) defer=1 workers=${STORED_WORKERS:-4} ;; D*) defer=1 workers= ;;
      *) defer=1 workers=0 ;; esac
    env -u TRITONKIT_COMPILE_WORKERS ${workers:+TRITONKIT_COMPILE_WORKERS=$workers} \
      OUT="$O/stored_$r" TK_BENCH_TRACE_COMPILES=1 TRITONKIT_CALIBRATION_DEFER=$defer timeout "$STORED_S" \
      bash bench/device_workflow.sh --comfyui "${COMFYUI_VERSION:-0.8.0}" --preset gpu-hunyuan-scaled --steps 5 --no-second-res \
      --compile-cache "/tmp/tk_cc_stored_$r" --calibration-dir /tmp/tk_cal_stored \
      --plan hunyuan-scaled:both:regional > "$O/stored_$r.log" 2>&1
    echo "stored $r (defer $defer, compile workers ${workers:-default}) rc=$?"
    grep -E 'TritonKit compile:' "$O/stored_$r.log" | cut -c1-300 | tail -2
    python3 bench/first_steps.py "$O/stored_$r/workflow.json" | cut -c1-700 | tail -1
  done
fi
if [ "${COLD_S:-0}" != 0 ]; then
  seed=
  if [ -n "${COLD_SEED_PLAN:-}" ]; then
    seed="/tmp/tk_cold_seed_$(date +%s%N)"
    OUT="$O/cold_seed" TRITON_CACHE_DIR="$seed/triton" timeout "$COLD_S" bash bench/device_workflow.sh --comfyui "${COMFYUI_VERSION:-0.8.0}" \
      --preset "${COLD_SEED_PRESET:-gpu-scaled}" --steps 3 --rounds 1 --budget-s $(( COLD_S - 10 )) \
      --calibration-dir "$seed/cal" --plan "$COLD_SEED_PLAN" > "$O/cold_seed.log" 2>&1
    echo "cold seed ($COLD_SEED_PLAN) rc=$?: $(find "$seed/triton" -name '*.json' 2>/dev/null | wc -l) files in its Triton cache"
  fi
  for r in ${COLD_ORDER:-A1 B1 A2 B2}; do
    l=${r%%[0-9]*} && ev="COLD_$l" && pv="COLD_PLAN_$l"
    envs=${!ev:-} plan=${!pv:-}
    tag="${r}_$(date +%s%N)"  # folders of their own: a warm machine keeps /tmp between calls
    if [ -n "$seed" ]; then
      cp -r "$seed/triton" "/tmp/tk_cold_triton_$tag" && cp -r "$seed/cal" "/tmp/tk_cold_cal_$tag"
    fi
    # shellcheck disable=SC2086
    env $envs OUT="$O/cold_$r" TRITON_CACHE_DIR="/tmp/tk_cold_triton_$tag" TK_BENCH_TRACE_COMPILES=1 \
      timeout "$COLD_S" bash bench/device_workflow.sh --comfyui "${COMFYUI_VERSION:-0.8.0}" --preset "${COLD_PRESET:-gpu-hunyuan-scaled}" \
      --steps "${COLD_STEPS:-7}" --rounds 1 --budget-s $(( COLD_S - 10 )) --calibration-dir "/tmp/tk_cold_cal_$tag" \
      --plan "${plan:-${COLD_PLAN:-hunyuan-scaled:both@86}}" > "$O/cold_$r.log" 2>&1
    echo "cold $r (${envs:-default}; ${plan:-${COLD_PLAN:-hunyuan-scaled:both@86}}) rc=$?"
    python3 bench/first_steps.py "$O/cold_$r/workflow.json" | cut -c1-"${COLD_CUT:-1800}" | tail -1
  done
fi
[ -n "$SMI_PID" ] && kill "$SMI_PID" 2>/dev/null
rm -f "$O"/*/nvidia-smi.txt "$O"/*/log.txt
