#!/usr/bin/env bash
# A short fuzz run of every target (default 10 s each): proves the
# metadata parsers, the Atom reader and `hoist decide` do not panic on
# arbitrary input, and the direct HTTP/1.1 path's request head
# classifier, chunked re-framer and response head parser keep their
# invariants and read requests as hyper does (http1_differential). Installs cargo-fuzz when missing. Longer runs:
#   FUZZ_SECONDS=600 scripts/fuzz-smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-10}"
command -v cargo-fuzz >/dev/null 2>&1 || cargo install --locked cargo-fuzz
# cargo-fuzz's default address sanitizer needs a nightly compiler; the
# coverage instrumentation itself works on stable.
# New inputs go to a scratch corpus; the committed seeds are only read.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for target in metadata_redis metadata_kafka metadata_servicebus metadata_traffic atom engine_rules \
  http1_request_head http1_rechunk http1_response_head http1_differential; do
  echo "fuzzing $target for ${seconds}s"
  mkdir -p "$scratch/$target"
  RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir tests/fuzz --sanitizer none "$target" \
    "$scratch/$target" "tests/fuzz/corpus/$target" -- -max_total_time="$seconds" -rss_limit_mb=2048 \
    > "$scratch/$target.log" 2>&1 || { tail -n 40 "$scratch/$target.log"; exit 1; }
  grep -E '^(Done|#[0-9]+ +DONE)' "$scratch/$target.log" | tail -n 1 || tail -n 2 "$scratch/$target.log"
done
