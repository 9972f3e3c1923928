#!/usr/bin/env bash
# The benchmark command: measures hoist against the limits of its stack and
# against nginx on this machine, and writes the results into
# docs/BENCHMARKS.md (between its `bench:begin` and `bench:end` markers).
# Benchmarks never fail anything: they print and record.
#
#   1. RPC path: GetMetrics / IsActive from cache, 10,000 ScaledObjects,
#      hoist vs a bare tonic server (`hoist-load bare-server`).
#   2. Scale: RSS and CPU of `hoist serve` with 1,000 to 50,000 ScaledObjects.
#   3. Source load: Redis `INFO commandstats`; Kafka mock cluster request log.
#   4. Interceptor: wrk direct, through hoist, a bare hyper proxy and nginx.
#   5. Cold start: held request → push → response (in-process and split).
#   6. Engine and parsers: criterion.
#   7. Declared routes: GetMetricSpec declaring a route → served by every
#      interceptor (in-process, and two split replicas following the scaler).
#   8. Flood: six waves of 5,000 connections through the interceptor; RSS at
#      each peak and after (is the memory given back?).
#   9. KEDA: KEDA's built-in redis scaler beside hoist's external trigger,
#      called by the real KEDA operator (scripts/bench-keda.sh, which
#      writes its own table).
#  10. The KEDA HTTP add-on beside the interceptor, on a real node: warm
#      path (with nginx and hoist's TCP relay), cold start, 1,000 routes,
#      scale-down (scripts/bench-addon.sh, which writes its own table;
#      needs root).
#
# Installs what it needs when missing (redis-server, nginx with its stream
# module, wrk: Debian packages, with apt-get). Takes about 35 minutes on 2
# cores. Knobs (environment):
#   BENCH_ONLY="rpc scale sources interceptor cold-start engine routes flood keda addon"   parts to run
#   BENCH_SECONDS=5      length of each RPC and wrk point
#   BENCH_REPEAT=3       runs per point, interleaved; the report takes the median
#   BENCH_SCALE="1000:1000 10000:1 10000:10000 50000:10000 50000:50000"
#                        ScaledObjects:pollers (Redis lists) per scale row
#   BENCH_PIN=1          servers on the last CPU, load generators on CPU 0
#   BENCH_DOC=docs/BENCHMARKS.md   where the tables go ("-": standard output)
#   BENCH_KEEP=1         keep the work directory (logs, configs, results)
#   BENCH_HOIST=path     measure this hoist binary instead of the one built
#                        (another build of hoist, to compare the two)
#   BENCH_QUIET_WAIT=600 seconds to wait, before a point, for compilers
#                        (rustc) running on the machine to finish; a point
#                        during which one ran is measured once more
set -euo pipefail
cd "$(dirname "$0")/.."

ONLY="${BENCH_ONLY:-rpc scale sources interceptor cold-start engine routes flood keda addon}"
SECONDS_PER_POINT="${BENCH_SECONDS:-5}"
REPEAT="${BENCH_REPEAT:-3}"
SCALE_ROWS="${BENCH_SCALE:-1000:1000 10000:1 10000:10000 50000:10000 50000:50000}"
DOC="${BENCH_DOC:-docs/BENCHMARKS.md}"
COLD_SAMPLES="${BENCH_COLD_SAMPLES:-10}"
started_at=$(date +%s)

wants() { [[ " $ONLY " == *" $1 "* ]]; }

# --- prerequisites ---------------------------------------------------------
packages=(redis-server redis-tools)
if wants interceptor; then
  command -v wrk >/dev/null 2>&1 || packages+=(wrk)
  command -v nginx >/dev/null 2>&1 || packages+=(nginx)
fi
scripts/deps.sh "${packages[@]}"
source scripts/proxy-bench.sh
stream_module=""
wants interceptor && stream_module="$(nginx_stream_module)"

echo "building hoist and hoist-load (release) ..."
cargo build --locked --release --bin hoist --bin hoist-load
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- src scalers build.rs Cargo.toml Cargo.lock 2>/dev/null ||
  commit="$commit with uncommitted changes"
[ -n "${BENCH_HOIST:-}" ] && commit="$commit, measuring the hoist binary $BENCH_HOIST"
HOIST="${BENCH_HOIST:-$PWD/target/release/hoist}"
LOAD="$PWD/target/release/hoist-load"

work="$(mktemp -d /tmp/hoist-bench.XXXXXX)"
results="$work/results.jsonl"
: >"$results"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# --- CPUs ------------------------------------------------------------------
cpus=$(nproc)
if [ "${BENCH_PIN:-1}" = 1 ] && [ "$cpus" -ge 2 ] && command -v taskset >/dev/null 2>&1; then
  SERVER_CPU=$((cpus - 1))
  CLIENT_CPU=0
  SERVER=(taskset -c "$SERVER_CPU")
  CLIENT=(taskset -c "$CLIENT_CPU")
  pinning="servers (hoist, the bare servers, nginx) pinned to CPU $SERVER_CPU, load generators and upstreams (hoist-load, wrk) to CPU $CLIENT_CPU, with \`taskset\`; a pinned tokio runtime runs one worker thread, nginx runs \`worker_processes 1\`"
else
  SERVER=()
  CLIENT=()
  pinning="no pinning: servers and load generators share all $cpus CPUs"
fi

# Other work on the machine (another build, another engineer's tests)
# disturbs the numbers. "Foreign" CPU is the machine's busy time
# (/proc/stat) minus what this script's own processes used: before each
# point the script waits (up to BENCH_QUIET_WAIT s) until the machine is
# quiet, and a point during which foreign work took more than 10 % of a
# core is measured once more. The report says what happened.
QUIET_WAIT="${BENCH_QUIET_WAIT:-600}"
waited=0
redone=0
disturbed=0
machine_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
# Our own CPU: finished children of this shell (`times`, which must run
# in this shell, not in a subshell) plus the background processes.
own_ticks() {
  local children bg=0 pid p stat fields
  times >"$work/times"
  children=$(tail -1 "$work/times" | sed 's/[ms]/ /g' | awk '{printf "%d", ($1 * 60 + $2 + $3 * 60 + $4) * 100}')
  for pid in "${pids[@]}"; do
    for p in "$pid" $(pgrep -P "$pid" 2>/dev/null || true); do
      stat=$(cat "/proc/$p/stat" 2>/dev/null) || continue
      fields=(${stat##*) })
      bg=$((bg + fields[11] + fields[12] + fields[13] + fields[14]))
    done
  done
  echo $((children + bg))
}
window_start() {
  own_ticks >"$work/own0"
  machine0=$(machine_ticks)
  own0=$(cat "$work/own0")
  t0=${EPOCHREALTIME/./}
}
# Prints the foreign CPU since window_start, in % of one core.
foreign_pct() {
  own_ticks >"$work/own1"
  local machine1 own1 t1
  machine1=$(machine_ticks)
  own1=$(cat "$work/own1")
  t1=${EPOCHREALTIME/./}
  awk -v f=$(( (machine1 - machine0) - (own1 - own0) )) -v us=$((t1 - t0)) \
    'BEGIN { p = us > 0 ? f * 1e6 / us : 0; printf "%d", (p < 0 ? 0 : p) }'
}
settle() {
  local start=$SECONDS pct
  while :; do
    window_start
    sleep 1
    foreign_pct >"$work/pct"
    pct=$(cat "$work/pct")
    [ "$pct" -lt 10 ] && break
    if [ $((SECONDS - start)) -ge "$QUIET_WAIT" ]; then
      echo "   (the machine is still busy: ${pct}% of a core in other processes; measuring anyway)" >&2
      break
    fi
  done
  local extra=$((SECONDS - start - 1))
  [ "$extra" -gt 0 ] && waited=$((waited + extra))
  return 0
}
# measure CMD...: runs a measuring command on a quiet machine and appends
# its output to the results; once more if other work took over 10 % of a
# core meanwhile.
measure() {
  local out="$work/point.out" pct attempt
  for attempt in 1 2; do
    settle
    window_start
    "$@" >"$out" || true
    foreign_pct >"$work/pct"
    pct=$(cat "$work/pct")
    [ "$pct" -lt 10 ] && break
    echo "   (other processes used ${pct}% of a core during this point)" >&2
    if [ "$attempt" = 1 ]; then redone=$((redone + 1)); else disturbed=$((disturbed + 1)); fi
  done
  cat "$out" >>"$results"
}

# --- process helpers -------------------------------------------------------
# start LOG CMD...: runs CMD (a plain command, so that $! is its own pid:
# taskset execs it) in the background; its pid is in $last_pid.
start() {
  local log="$1"
  shift
  "$@" >"$log" 2>&1 &
  last_pid=$!
  pids+=("$last_pid")
}
# stop PID: ends a process this script started, and forgets it.
stop() {
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  local kept=() pid
  for pid in "${pids[@]}"; do [ "$pid" = "$1" ] || kept+=("$pid"); done
  pids=("${kept[@]}")
}
wait_port() {
  local port="$1" tries=0
  until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    tries=$((tries + 1))
    if [ "$tries" -gt 300 ]; then
      echo "error: nothing listens on port $port after 30 s" >&2
      return 1
    fi
    sleep 0.1
  done
}
ports() { "$LOAD" free-ports "$1"; }
# ticks PID...: utime + stime of processes and their children.
source scripts/proc.sh
start_redis() { # port [extra args]
  local port="$1"
  shift
  mkdir -p "$work/redis-$port"
  start "$work/redis-$port.log" "${SERVER[@]}" redis-server --port "$port" --bind 127.0.0.1 --save "" \
    --appendonly no --dir "$work/redis-$port" "$@"
  wait_port "$port"
}
hoist_config() { # file grpc-port admin-port [extra TOML]
  # No state file: each run starts fresh, with nothing of an earlier one.
  # Callers trusted: no cluster here, and the route benchmark declares
  # routes from its own gRPC client (single-tenant, loopback only).
  cat >"$1" <<EOF
state_file = ""
[grpc]
listen = "127.0.0.1:$2"
trust_callers = true
[admin]
listen = "127.0.0.1:$3"
$4
EOF
}

# --- 1. RPC path -----------------------------------------------------------
if wants rpc; then
  echo "== 1. RPC path: hoist vs a bare tonic server"
  read -r redis_port grpc_port admin_port bare_port <<<"$(ports 4)"
  start_redis "$redis_port"
  redis_rpc_pid=$last_pid
  hoist_config "$work/rpc.toml" "$grpc_port" "$admin_port" ""
  start "$work/rpc-hoist.log" "${SERVER[@]}" "$HOIST" serve --config "$work/rpc.toml"
  hoist_pid=$last_pid
  start "$work/rpc-bare.log" "${SERVER[@]}" "$LOAD" bare-server --listen "127.0.0.1:$bare_port" --metric-name redis-bench
  bare_pid=$last_pid
  wait_port "$grpc_port"
  wait_port "$bare_port"
  # KEDA's operator multiplexes every call on one connection per scaler
  # address; the last row opens one connection per client instead.
  for method in get-metrics is-active; do
    for point in 1:1 16:1 64:1 64:64; do
      concurrency=${point%:*}
      connections=${point#*:}
      for rep in $(seq "$REPEAT"); do
        for target in hoist bare; do
          if [ "$target" = hoist ]; then port=$grpc_port pid=$hoist_pid; else port=$bare_port pid=$bare_pid; fi
          measure "${CLIENT[@]}" "$LOAD" rpc --target "127.0.0.1:$port" --label "$target" --method "$method" \
            --concurrency "$concurrency" --connections "$connections" --objects 10000 \
            --redis "127.0.0.1:$redis_port" --list bench --server-pid "$pid" \
            --duration "${SECONDS_PER_POINT}s" --warmup 1s
        done
      done
    done
  done
  stop "$hoist_pid"
  stop "$bare_pid"
  stop "$redis_rpc_pid"
fi

# --- 2. Scale ----------------------------------------------------------------
if wants scale; then
  echo "== 2. Scale: RSS and CPU of hoist serve"
  nofile=$(ulimit -n)
  [ "$nofile" = unlimited ] && nofile=1048576
  per_redis=8000
  max_lists=0
  for row in $SCALE_ROWS; do
    lists=${row#*:}
    [ "$lists" -gt "$max_lists" ] && max_lists=$lists
  done
  # Pollers of one Redis server share one connection: the lists are
  # spread over a few servers so that hoist keeps several connections,
  # as with several Redis deployments.
  servers=$(( (max_lists + per_redis - 1) / per_redis ))
  [ "$servers" -gt 4 ] && servers=4
  [ "$servers" -lt 1 ] && servers=1
  read -r -a scale_redis_ports <<<"$(ports "$servers")"
  scale_redis_pids=()
  addresses=""
  for port in "${scale_redis_ports[@]}"; do
    start_redis "$port" --maxclients $((nofile - 64))
    scale_redis_pids+=("$last_pid")
    addresses="${addresses:+$addresses,}127.0.0.1:$port"
  done
  for row in $SCALE_ROWS; do
    objects=${row%:*}
    lists=${row#*:}
    if [ $((servers + 500)) -gt "$nofile" ]; then
      reason="$servers Redis connections and 500 other files do not fit this machine's $nofile open files per process (ulimit -n)"
      echo "   $objects objects / $lists pollers: skipped: $reason"
      printf '{"bench":"scale-skipped","objects":%d,"lists":%d,"reason":"%s"}\n' "$objects" "$lists" "$reason" >>"$results"
      continue
    fi
    for attempt in 1 2; do
      settle
      window_start
      read -r grpc_port admin_port <<<"$(ports 2)"
      hoist_config "$work/scale.toml" "$grpc_port" "$admin_port" "[limits]
max_tracked_triggers = $((objects + 100))"
      start "$work/scale-$objects-$lists.log" "${SERVER[@]}" "$HOIST" serve --config "$work/scale.toml"
      hoist_pid=$last_pid
      wait_port "$grpc_port"
      "${CLIENT[@]}" "$LOAD" scale --target "127.0.0.1:$grpc_port" --admin "127.0.0.1:$admin_port" \
        --server-pid "$hoist_pid" --objects "$objects" --lists "$lists" --redis "$addresses" \
        --interval 10 >"$work/point.out" || echo "   (failed: see above)"
      foreign_pct >"$work/pct"
      stop "$hoist_pid"
      [ "$(cat "$work/pct")" -lt 10 ] && break
      echo "   (other processes used $(cat "$work/pct")% of a core during this row)" >&2
      if [ "$attempt" = 1 ]; then redone=$((redone + 1)); else disturbed=$((disturbed + 1)); fi
    done
    cat "$work/point.out" >>"$results"
  done
  for pid in "${scale_redis_pids[@]}"; do stop "$pid"; done
fi

# --- 3. Source load ----------------------------------------------------------
if wants sources; then
  echo "== 3. Source load: Redis commands and Kafka requests per poll"
  read -r redis_port grpc_port admin_port <<<"$(ports 3)"
  start_redis "$redis_port"
  redis_pid=$last_pid
  hoist_config "$work/sources.toml" "$grpc_port" "$admin_port" ""
  start "$work/sources-hoist.log" "${SERVER[@]}" "$HOIST" serve --config "$work/sources.toml"
  hoist_pid=$last_pid
  wait_port "$grpc_port"
  # Counts, not timings: a busy machine does not change them.
  "${CLIENT[@]}" "$LOAD" redis-load --target "127.0.0.1:$grpc_port" --redis "127.0.0.1:$redis_port" \
    --objects 1000 --interval 1 --intervals 10 >>"$results" || echo "   (failed: see above)"
  "${CLIENT[@]}" "$LOAD" kafka-load --target "127.0.0.1:$grpc_port" --objects 1000 --partitions 1000 \
    --brokers 3 --interval 1 --intervals 10 >>"$results" || echo "   (failed: see above)"
  stop "$hoist_pid"
  stop "$redis_pid"
fi

# --- 4. Interceptor ----------------------------------------------------------
if wants interceptor; then
  echo "== 4. Interceptor: wrk direct, through hoist, a bare hyper proxy and nginx"
  read -r up_port http_port tcp_port grpc_port admin_port nginx_port nginx_tcp_port bare_port <<<"$(ports 8)"
  start "$work/upstream.log" "${CLIENT[@]}" "$LOAD" upstream --listen "127.0.0.1:$up_port"
  upstream_pid=$last_pid
  hoist_config "$work/interceptor.toml" "$grpc_port" "$admin_port" "[interceptor]
http_listen = \"127.0.0.1:$http_port\"
[[interceptor.http_routes]]
name = \"web\"
host = \"web.bench\"
upstream = \"127.0.0.1:$up_port\"
[[interceptor.tcp_routes]]
name = \"raw\"
listen = \"127.0.0.1:$tcp_port\"
upstream = \"127.0.0.1:$up_port\""
  start "$work/interceptor-hoist.log" "${SERVER[@]}" "$HOIST" serve --config "$work/interceptor.toml"
  hoist_pid=$last_pid
  start "$work/bare-proxy.log" "${SERVER[@]}" "$LOAD" bare-proxy --listen "127.0.0.1:$bare_port" --upstream "127.0.0.1:$up_port"
  bare_proxy_pid=$last_pid
  nginx_config "$work/nginx" "$stream_module" "127.0.0.1:$nginx_port" "127.0.0.1:$nginx_tcp_port" "127.0.0.1:$up_port"
  start "$work/nginx/out.log" "${SERVER[@]}" nginx -c "$work/nginx/nginx.conf" -p "$work/nginx"
  nginx_pid=$last_pid
  for port in "$up_port" "$http_port" "$tcp_port" "$bare_port" "$nginx_port"; do wait_port "$port"; done
  nginx_stream=0
  (exec 3<>"/dev/tcp/127.0.0.1/$nginx_tcp_port") 2>/dev/null && nginx_stream=1
  # Warm the pools, then measure.
  for port in "$http_port" "$bare_port" "$nginx_port"; do
    "${CLIENT[@]}" wrk -t1 -c64 -d1s -H 'Host: web.bench' "http://127.0.0.1:$port/" >/dev/null
  done
  for connections in 1 64; do
    for rep in $(seq "$REPEAT"); do
      measure wrk_point http direct "$connections" "127.0.0.1:$up_port"
      measure wrk_point http hoist "$connections" "127.0.0.1:$http_port" "$hoist_pid"
      measure wrk_point http bare-hyper "$connections" "127.0.0.1:$bare_port" "$bare_proxy_pid"
      measure wrk_point http nginx "$connections" "127.0.0.1:$nginx_port" "$nginx_pid"
      measure wrk_point tcp direct "$connections" "127.0.0.1:$up_port"
      measure wrk_point tcp hoist "$connections" "127.0.0.1:$tcp_port" "$hoist_pid"
      if [ "$nginx_stream" = 1 ]; then
        measure wrk_point tcp nginx "$connections" "127.0.0.1:$nginx_tcp_port" "$nginx_pid"
      fi
    done
  done
  stop "$nginx_pid"
  stop "$bare_proxy_pid"
  stop "$hoist_pid"
  stop "$upstream_pid"
fi

# --- 5. Cold start -----------------------------------------------------------
# COLD_SAMPLES routes whose upstreams are free ports (apps at zero): the
# TOML in $routes_toml, the matching hoist-load arguments in $route_args.
cold_routes() {
  routes_toml=""
  route_args=()
  local i port
  read -r -a cold_ports <<<"$(ports "$COLD_SAMPLES")"
  for i in $(seq 0 $((COLD_SAMPLES - 1))); do
    port=${cold_ports[$i]}
    routes_toml+=$(printf '[[interceptor.http_routes]]\nname = "cs%s"\nhost = "cs%s.bench"\nupstream = "127.0.0.1:%s"\n' "$i" "$i" "$port")
    routes_toml+=$'\n'
    route_args+=(--route "cs$i=127.0.0.1:$port")
  done
}
if wants cold-start; then
  echo "== 5. Cold start"
  read -r grpc_port admin_port http_port <<<"$(ports 3)"
  cold_routes
  hoist_config "$work/cold.toml" "$grpc_port" "$admin_port" "[interceptor]
http_listen = \"127.0.0.1:$http_port\"
$routes_toml"
  start "$work/cold-hoist.log" "${SERVER[@]}" "$HOIST" serve --config "$work/cold.toml"
  hoist_pid=$last_pid
  wait_port "$grpc_port"
  measure "${CLIENT[@]}" "$LOAD" cold-start --grpc "127.0.0.1:$grpc_port" --proxy "127.0.0.1:$http_port" \
    --label in-process "${route_args[@]}"
  stop "$hoist_pid"

  # Split: `hoist interceptor` alone, a scaler reading it.
  read -r grpc_port admin_port http_port interceptor_admin <<<"$(ports 4)"
  cold_routes
  cat >"$work/cold-interceptor.toml" <<EOF
[admin]
listen = "127.0.0.1:$interceptor_admin"
[interceptor]
http_listen = "127.0.0.1:$http_port"
$routes_toml
EOF
  start "$work/cold-interceptor.log" "${SERVER[@]}" "$HOIST" interceptor --config "$work/cold-interceptor.toml"
  interceptor_pid=$last_pid
  wait_port "$interceptor_admin"
  hoist_config "$work/cold-scaler.toml" "$grpc_port" "$admin_port" "[interceptor]
endpoints = [\"127.0.0.1:$interceptor_admin\"]"
  start "$work/cold-scaler.log" "${SERVER[@]}" "$HOIST" serve --config "$work/cold-scaler.toml"
  hoist_pid=$last_pid
  wait_port "$grpc_port"
  measure "${CLIENT[@]}" "$LOAD" cold-start --grpc "127.0.0.1:$grpc_port" --proxy "127.0.0.1:$http_port" \
    --label split "${route_args[@]}"
  stop "$hoist_pid"
  stop "$interceptor_pid"
fi

# --- 6. Engine ---------------------------------------------------------------
criterion_args=()
if wants engine; then
  echo "== 6. Engine and parsers (criterion)"
  # Build first, so that our own compilation is not taken for another's.
  cargo bench --locked --bench engine --bench parsers --no-run 2>&1 | tail -1
  settle
  window_start
  CRITERION_HOME="$work/criterion" cargo bench --locked --bench engine --bench parsers -- \
    --warm-up-time 1 --measurement-time 3 2>&1 | grep -E '^[a-zA-Z].*|time:' | grep -v '^Benchmarking' || true
  foreign_pct >"$work/pct"
  [ "$(cat "$work/pct")" -lt 10 ] || disturbed=$((disturbed + 1))
  criterion_args=(--criterion "$work/criterion")
fi

# --- 7. Declared routes --------------------------------------------------------
# The rules allow loopback upstreams (the app is hoist-load's own) and any
# host; followers check the table against the same rules.
ROUTE_RULES='allowed_upstreams = ["127.0.0.1:*"]
denied_networks = []
allowed_hosts = { "*" = ["*"] }'
ROUTE_SAMPLES="${BENCH_ROUTE_SAMPLES:-10}"
if wants routes; then
  echo "== 7. Declared routes reaching the interceptors"
  read -r grpc_port admin_port http_port <<<"$(ports 3)"
  hoist_config "$work/routes.toml" "$grpc_port" "$admin_port" "[interceptor]
http_listen = \"127.0.0.1:$http_port\"
enabled = true
$ROUTE_RULES"
  start "$work/routes-hoist.log" "${SERVER[@]}" "$HOIST" serve --config "$work/routes.toml"
  hoist_pid=$last_pid
  wait_port "$grpc_port"
  measure "${CLIENT[@]}" "$LOAD" route-follow --grpc "127.0.0.1:$grpc_port" \
    --proxy "127.0.0.1:$http_port" --samples "$ROUTE_SAMPLES" --label in-process
  stop "$hoist_pid"

  # Split: a scaler without proxies, two `hoist interceptor` replicas
  # following its table.
  read -r grpc_port admin_port a_admin a_http b_admin b_http <<<"$(ports 6)"
  hoist_config "$work/routes-scaler.toml" "$grpc_port" "$admin_port" "[interceptor]
endpoints = [\"127.0.0.1:$a_admin\", \"127.0.0.1:$b_admin\"]
$ROUTE_RULES"
  start "$work/routes-scaler.log" "${SERVER[@]}" "$HOIST" serve --config "$work/routes-scaler.toml"
  hoist_pid=$last_pid
  wait_port "$admin_port"
  follower_pids=()
  for replica in "a $a_admin $a_http" "b $b_admin $b_http"; do
    read -r name replica_admin replica_http <<<"$replica"
    cat >"$work/routes-interceptor-$name.toml" <<EOF
[admin]
listen = "127.0.0.1:$replica_admin"
[interceptor]
http_listen = "127.0.0.1:$replica_http"
scaler = "127.0.0.1:$admin_port"
$ROUTE_RULES
EOF
    start "$work/routes-interceptor-$name.log" "${SERVER[@]}" "$HOIST" interceptor --config "$work/routes-interceptor-$name.toml"
    follower_pids+=("$last_pid")
    wait_port "$replica_admin"
  done
  wait_port "$grpc_port"
  measure "${CLIENT[@]}" "$LOAD" route-follow --grpc "127.0.0.1:$grpc_port" \
    --proxy "127.0.0.1:$a_http" --proxy "127.0.0.1:$b_http" --samples "$ROUTE_SAMPLES" --label split
  stop "$hoist_pid"
  for pid in "${follower_pids[@]}"; do stop "$pid"; done
fi

# --- 8. Flood ----------------------------------------------------------------
if wants flood; then
  echo "== 8. Flood: waves of 5,000 connections through the interceptor"
  read -r up_port http_port grpc_port admin_port <<<"$(ports 4)"
  start "$work/flood-upstream.log" "${CLIENT[@]}" "$LOAD" upstream --listen "127.0.0.1:$up_port"
  upstream_pid=$last_pid
  # Every connection comes from 127.0.0.1: the per-client cap is lifted.
  hoist_config "$work/flood.toml" "$grpc_port" "$admin_port" "[interceptor]
http_listen = \"127.0.0.1:$http_port\"
max_connections = 10000
max_connections_per_client = 10000
[[interceptor.http_routes]]
name = \"web\"
host = \"web.bench\"
upstream = \"127.0.0.1:$up_port\""
  start "$work/flood-hoist.log" "${SERVER[@]}" "$HOIST" serve --config "$work/flood.toml"
  hoist_pid=$last_pid
  wait_port "$up_port"
  wait_port "$http_port"
  "${CLIENT[@]}" "$LOAD" flood --target "127.0.0.1:$http_port" --pid "$hoist_pid" \
    --connections 5000 --waves 6 --settle 15 >>"$results" || echo "   (failed: see above)"
  stop "$hoist_pid"
  stop "$upstream_pid"
fi

# --- 9. KEDA's own scaler beside hoist -----------------------------------------
if wants keda; then
  echo "== 9. KEDA's built-in redis scaler and hoist, called by the real KEDA"
  settle
  BENCH_DOC="$DOC" scripts/bench-keda.sh || echo "   (failed: see above)"
fi

# --- 10. The KEDA HTTP add-on beside the interceptor -------------------------
if wants addon; then
  echo "== 10. The KEDA HTTP add-on beside hoist's interceptor, on a real node"
  settle
  BENCH_DOC="$DOC" BENCH_SECONDS="$SECONDS_PER_POINT" BENCH_REPEAT="$REPEAT" scripts/bench-addon.sh ||
    echo "   (failed: see above)"
fi

# --- Report ------------------------------------------------------------------
finished_at=$(date +%s)
cpu_model=$(lscpu 2>/dev/null | awk -F: '/Model name/ {gsub(/^ +/, "", $2); print $2; exit}')
memory=$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)
os=$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")
load=$(cut -d' ' -f1-3 /proc/loadavg)
{
  echo "### Machine and conditions of this run"
  echo
  echo "- When: $(date -u -d "@$started_at" '+%Y-%m-%d %H:%M UTC'), $(( (finished_at - started_at) / 60 )) min $(( (finished_at - started_at) % 60 )) s, hoist at $commit."
  echo "- Machine: ${cpu_model:-unknown CPU}, $cpus CPUs, $memory, $os, Linux $(uname -r); $(rustc -V | cut -d' ' -f1-2), release profile."
  echo "- Peers: $(redis-server --version | cut -d' ' -f1-3)$(command -v nginx >/dev/null && echo ", $(nginx -v 2>&1 | sed 's/.*: //')")$(command -v wrk >/dev/null && echo ", $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)")."
  echo "- CPUs: $pinning."
  echo "- Points: ${SECONDS_PER_POINT} s each, $REPEAT run(s) per point, interleaved between the contenders; the run with the median throughput is shown."
  if [ "$redone" -eq 0 ] && [ "$disturbed" -eq 0 ]; then
    echo "- Quiet machine: other processes used less than 10 % of a core during every point (the machine's busy time in /proc/stat minus this run's own processes); the points waited $waited s in all for brief other work to end first. Load average at the end: $load."
  else
    echo "- Other work ran on this machine at times (more than 10 % of a core outside this run's processes, from /proc/stat): the points waited $waited s in all for a quiet machine, $redone points overlapped by it were measured again, and $disturbed measurements were overlapped twice (those numbers are lower and noisier). Load average at the end: $load."
  fi
  echo "- Command: \`scripts/bench.sh\`$( [ "$ONLY" != "rpc scale sources interceptor cold-start engine routes flood keda addon" ] && echo " with BENCH_ONLY=\"$ONLY\"")."
} >"$work/machine.md"
doc_args=(--doc "$DOC")
[ "$DOC" = "-" ] && doc_args=()
"$LOAD" report --results "$results" --machine "$work/machine.md" "${criterion_args[@]}" "${doc_args[@]}"
if [ "${BENCH_KEEP:-0}" = 1 ]; then cp "$results" "$work/results.jsonl.saved"; fi
echo "done in $(( ($(date +%s) - started_at) / 60 )) min; results: $results"
