#!/usr/bin/env bash
# The two developer commands of the README:
#   bash scripts/dev.sh demo [--serve]   set up, start a real ComfyUI (CPU) with the pack, run the bundled
#                                         self-test workflow and print its report (--serve keeps the server up)
#   bash scripts/dev.sh test [pytest args] set up, then run the whole test suite
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmd="${1:-}"; shift || true
case "$cmd" in
  demo)
    bash "$root/scripts/setup_env.sh"
    exec "${TK_VENV:-$root/.venv}/bin/python" "$root/scripts/demo.py" "$@" ;;
  test)
    bash "$root/scripts/setup_env.sh"
    if [ "${TK_BROWSER_TESTS:-1}" = "1" ]; then bash "$root/scripts/setup_browser.sh"; fi
    cd "$root"
    exec "${TK_VENV:-$root/.venv}/bin/python" -m pytest "$@" ;;
  *)
    echo "usage: bash scripts/dev.sh demo [--serve] | test [pytest args]" >&2; exit 2 ;;
esac
