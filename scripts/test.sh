#!/usr/bin/env bash
# The test command: installs what the suite needs on a fresh machine
# (build tools for librdkafka, redis-server and redis-cli from Debian, and
# helm, when missing), then runs every test. Tests start their own redis-server
# processes on free ports and Kafka's mock cluster in-process; nothing
# needs to be running beforehand. HOIST_TEST_KAFKA_BOOTSTRAP=host:port
# adds a run against a real Kafka broker.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh redis-server redis-tools
# helm, for tests/helm.rs (renders deploy/helm/hoist); see scripts/helm.sh.
scripts/helm.sh
# A short fuzz smoke run of every parser first (no panics on arbitrary
# input), then the suite, whose summary closes the output.
FUZZ_SECONDS="${FUZZ_SECONDS:-5}" scripts/fuzz-smoke.sh
# Benchmarks are built (they must keep compiling) but not run: timing
# belongs to `cargo bench`, never to pass/fail tests.
cargo build --locked --benches
cargo test --locked --lib --bins --tests "$@"
