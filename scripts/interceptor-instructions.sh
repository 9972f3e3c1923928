#!/usr/bin/env bash
# Instructions per proxied request in hoist's interceptor, counted by
# valgrind's callgrind (user space only; stable on a noisy machine, where
# CPU time per request moves by ±20 % between runs): the HTTP route's
# direct path against the TCP relay, the same upstream behind both, on
# loopback.
#
#   scripts/interceptor-instructions.sh [HOIST_BINARY]
#
# Three runs of the release binary under callgrind: idle (start-up and
# shutdown only), then REQUESTS requests through the HTTP route, then as
# many through the TCP route (hoist-load pace, 16 keep-alive
# connections, an open loop). Per request: (the run's total − the idle
# run's) ÷ REQUESTS. Knobs: INSTRUCTIONS_RATE=1000 (requests/s; callgrind
# runs the proxy about 50× slower), INSTRUCTIONS_SECONDS=10.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
RATE="${INSTRUCTIONS_RATE:-1000}"
SECONDS_OF_LOAD="${INSTRUCTIONS_SECONDS:-10}"
REQUESTS=$((RATE * SECONDS_OF_LOAD))

command -v valgrind >/dev/null 2>&1 || scripts/deps.sh valgrind
if [ $# -gt 0 ]; then
  HOIST="$1"
else
  cargo build --locked --release --bin hoist --bin hoist-load >&2
  HOIST="$ROOT/target/release/hoist"
fi
LOAD="$ROOT/target/release/hoist-load"
[ -x "$LOAD" ] || cargo build --locked --release --bin hoist-load >&2

work="$(mktemp -d /tmp/hoist-instructions.XXXXXX)"
upstream_pid=""
cleanup() {
  [ -n "$upstream_pid" ] && kill "$upstream_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

read -r app grpc admin http tcp <<<"$("$LOAD" free-ports 5)"
"$LOAD" --threads 1 upstream --listen "127.0.0.1:$app" 2>/dev/null &
upstream_pid=$!
cat >"$work/hoist.toml" <<EOF
state_file = ""
[grpc]
listen = "127.0.0.1:$grpc"
trust_callers = true
[admin]
listen = "127.0.0.1:$admin"
[interceptor]
http_listen = "127.0.0.1:$http"
[[interceptor.http_routes]]
name = "web"
host = "web.bench"
upstream = "127.0.0.1:$app"
[[interceptor.tcp_routes]]
name = "raw"
listen = "127.0.0.1:$tcp"
upstream = "127.0.0.1:$app"
EOF

# instructions PORT: the run's total, with REQUESTS requests to PORT (none
# without one).
instructions() {
  local out="$work/callgrind.out" pid
  valgrind --tool=callgrind --callgrind-out-file="$out" "$HOIST" serve --config "$work/hoist.toml" \
    >"$work/hoist.log" 2>&1 &
  pid=$!
  # Until both listeners accept (callgrind starts the proxy slowly), and
  # a moment more: a SIGTERM before hoist handles it would end it without
  # its shutdown, and a SIGINT would be lost (a background job's is
  # ignored until hoist takes it over).
  for _ in $(seq 600); do
    (exec 3<>"/dev/tcp/127.0.0.1/$http" && exec 4<>"/dev/tcp/127.0.0.1/$tcp") 2>/dev/null && break
    sleep 0.1
  done
  sleep 3
  if [ $# -gt 0 ]; then
    "$LOAD" --threads 1 pace --target "127.0.0.1:$1" --rate "$RATE" --seconds "$SECONDS_OF_LOAD" \
      --connections 16 >"$work/pace.json" 2>/dev/null
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r["answered"]==int(sys.argv[2]) and r["failed"]==0 else "not every request was answered: %s" % r)' \
      "$work/pace.json" "$REQUESTS"
  fi
  kill -TERM "$pid"
  wait "$pid" || true
  callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}

idle=$(instructions)
http_total=$(instructions "$http")
tcp_total=$(instructions "$tcp")
python3 - "$idle" "$http_total" "$tcp_total" "$REQUESTS" <<'EOF'
import sys
idle, http, tcp, requests = (int(x) for x in sys.argv[1:])
h, t = (http - idle) / requests, (tcp - idle) / requests
print(f"instructions per request ({requests:,} requests each, user space, callgrind):")
print(f"  HTTP route (direct path): {h:,.0f}")
print(f"  TCP relay:                {t:,.0f}")
print(f"  HTTP ÷ TCP:               {h / t:.2f}")
EOF
