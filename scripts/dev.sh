#!/usr/bin/env bash
# The two developer commands of the README:
#   bash scripts/dev.sh demo [--serve]   set up, start a real ComfyUI (CPU) with the pack, run the bundled
#                                         self-test workflow and print its report (--serve keeps the server up)
#   bash scripts/dev.sh test [pytest args] set up, then run the tests against every supported ComfyUI line:
#       pass 1: the whole suite against ComfyUI 0.3.75 (.comfyui/, or TK_COMFYUI)
#       pass 2: the tests marked `comfyui` (they run real ComfyUI code; conftest marks the obvious ones)
#               against ComfyUI 0.8.0 (.comfyui-0.8.0/ with its packages in .comfyui-0.8.0-site/)
#       pass 3, only where TK_COMFYUI_NEWEST names a ComfyUI tree (a newer release than the two above, which
#               CI cannot download: e.g. upstream's master checked out by hand) and TK_COMFYUI_NEWEST_SITE the
#               packages it needs beyond the venv (pip install --no-deps --target: its comfy-kitchen,
#               comfy-aimdo, torchaudio, ...): the comfyui-marked tests against it
#     All run in one random order seed (TK_TEST_SEED, printed; set it to reproduce a run, 'off' for
#     file order). TK_TEST_LINES="0.3.75" (or "0.8.0", or "newest") runs one pass only. Exits non-zero if
#     any pass fails or a comfyui-only pass selects no test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmd="${1:-}"; shift || true

version_of() {  # the __version__ in a ComfyUI tree's comfyui_version.py
  sed -n 's/^__version__ = "\(.*\)"/\1/p' "$1/comfyui_version.py" 2>/dev/null || true
}

summary_of() {  # pytest's last summary line in a log ("3 passed, 1 skipped in 9.1s")
  grep -E "(passed|failed|error|skipped|deselected|no tests ran).* in [0-9.]+s" "$1" | tail -n 1 | tr -d '='
}

run_pass() {  # label, log file, then the command (its output also goes to the log)
  local label="$1" log="$2"; shift 2
  echo "[test] ===== $label ====="
  local start=$SECONDS rc=0
  "$@" 2>&1 | tee "$log" || rc=${PIPESTATUS[0]}
  echo "[test] $label: exit $rc in $((SECONDS - start)) s" | tee -a "$log"
  return "$rc"
}

comfyui_pass() {  # pass number, ComfyUI tree, the folder of its extra packages, then pytest's arguments: the
  # comfyui-marked tests against that tree (uses the test command's logs, py, status and summaries)
  local n="$1" tree="$2" site="$3"; shift 3
  local label="pass $n: comfyui-marked tests against ComfyUI $(version_of "$tree") ($tree)"
  run_pass "$label" "$logs/$n" env TK_COMFYUI="$tree" TK_COMFYUI_SITE="$site" TK_TEST_ONLY_COMFYUI=1 \
    PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" "$py" -m pytest "$@" || status=1
  if grep -q "^\[test\] .*: exit 5 in" "$logs/$n"; then
    echo "[test] pass $n selected no test (pytest exit 5): it must run the comfyui-marked tests" >&2
  fi
  summaries+=("$label: $(summary_of "$logs/$n")")
}

case "$cmd" in
  demo)
    bash "$root/scripts/setup_env.sh"
    exec "${TK_VENV:-$root/.venv}/bin/python" "$root/scripts/demo.py" "$@" ;;
  test)
    bash "$root/scripts/setup_env.sh"
    if [ "${TK_BROWSER_TESTS:-1}" = "1" ]; then bash "$root/scripts/setup_browser.sh"; fi
    cd "$root"
    py="${TK_VENV:-$root/.venv}/bin/python"
    app="${TK_COMFYUI:-$root/.comfyui}"
    app8="${TK_COMFYUI_080:-$root/.comfyui-0.8.0}"
    site8="${TK_COMFYUI_080_SITE:-$root/.comfyui-0.8.0-site}"
    lines="${TK_TEST_LINES:-0.3.75 0.8.0${TK_COMFYUI_NEWEST:+ newest}}"
    if [ -z "${TK_TEST_SEED:-}" ]; then TK_TEST_SEED=$(( (RANDOM << 15 | RANDOM) + 1 )); fi
    export TK_TEST_SEED
    echo "[test] test order seed: $TK_TEST_SEED (reproduce: TK_TEST_SEED=$TK_TEST_SEED bash scripts/dev.sh test ...)"
    logs="$(mktemp -d)"; trap 'rm -rf "$logs"' EXIT
    status=0; summaries=()
    for line in $lines; do
      case "$line" in
        0.3.75)
          label="pass 1: whole suite against ComfyUI $(version_of "$app") ($app)"
          run_pass "$label" "$logs/1" env -u TK_COMFYUI_SITE -u TK_TEST_ONLY_COMFYUI TK_COMFYUI="$app" \
            "$py" -m pytest "$@" || status=1
          summaries+=("$label: $(summary_of "$logs/1")") ;;
        0.8.0)
          comfyui_pass 2 "$app8" "$site8" "$@" ;;
        newest)
          comfyui_pass 3 "${TK_COMFYUI_NEWEST:?TK_TEST_LINES has newest: set TK_COMFYUI_NEWEST to a ComfyUI tree}" \
            "${TK_COMFYUI_NEWEST_SITE:-}" "$@" ;;
        *)
          echo "[test] unknown ComfyUI line in TK_TEST_LINES: $line (known: 0.3.75 0.8.0 newest)" >&2; exit 2 ;;
      esac
    done
    echo "[test] ===== summary (seed $TK_TEST_SEED) ====="
    for s in "${summaries[@]}"; do echo "[test] $s"; done
    exit "$status" ;;
  *)
    echo "usage: bash scripts/dev.sh demo [--serve] | test [pytest args]" >&2; exit 2 ;;
esac
