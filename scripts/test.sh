#!/usr/bin/env bash
# The test command: installs what the suite needs on a fresh machine
# (redis-server and redis-cli from Debian when missing), then runs every
# test. Tests start their own redis-server processes on free ports; nothing
# needs to be running beforehand.
set -euo pipefail
cd "$(dirname "$0")/.."

need_packages=()
command -v redis-server >/dev/null 2>&1 || need_packages+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_packages+=(redis-tools)

if [ ${#need_packages[@]} -gt 0 ]; then
  echo "installing ${need_packages[*]} ..."
  if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
  elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "error: ${need_packages[*]} missing and no root or sudo to install it" >&2
    exit 1
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_packages[@]}" >/dev/null
fi

cargo test --locked --all-targets "$@"
