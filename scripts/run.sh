#!/usr/bin/env bash
# The run command: installs the build prerequisites when missing, builds
# hoist in release mode and serves on the default ports (gRPC
# 0.0.0.0:9090, admin 0.0.0.0:9091). Extra arguments go to `hoist serve`,
# e.g. `scripts/run.sh --config hoist.toml`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh
exec cargo run --locked --release --bin hoist -- serve "$@"
