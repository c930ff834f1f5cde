#!/usr/bin/env bash
# Headless Chromium for the browser tests (Debian's package; a test tool's own browser download
# cannot work on a closed network). Skips when chromium is already there.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" != "0" ]; then SUDO=sudo; else SUDO=; fi
echo "[setup] installing Debian's chromium"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
