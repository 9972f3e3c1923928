#!/usr/bin/env bash
# KEDA's built-in `redis` scaler and hoist's `external` and
# `external-push` triggers, side by side, called by the real KEDA operator
# (scripts/controlplane.sh): N ScaledObjects on one Redis list, once per
# row (a scaler and KEDA's pollingInterval).
# For each: Redis commands per second (`INFO commandstats`) and Redis's own
# CPU, KEDA operator's CPU and RSS (and hoist's), the time from one push to
# the list to the Deployments' 0 → 1, and from emptying the list to every
# Deployment back at 0. A benchmark: it prints and records, never fails
# anything. Part 9 of scripts/bench.sh; runs alone too:
#
#   scripts/bench-keda.sh
#
# Knobs (environment):
#   BENCH_KEDA_OBJECTS="100 1000"   ScaledObjects per row
#   BENCH_KEDA_ROWS="keda:5 hoist:5 push:5 push:60 push:300"
#                                   SCALER:INTERVAL: `keda` (KEDA's `redis`),
#                                   `hoist` (`external`) or `push`
#                                   (`external-push`), at that pollingInterval
#                                   of the ScaledObjects (s)
#   BENCH_KEDA_SOURCE_INTERVAL=5    how often hoist polls the list (s): its
#                                   triggers' pollingInterval, whatever KEDA's
#   BENCH_KEDA_WINDOW=60            seconds over which load is measured
#   BENCH_DOC=docs/BENCHMARKS.md    where the table goes ("-": standard output)
#   BENCH_KEDA_SECTION=bench-keda   the markers in BENCH_DOC it goes between
#   KEDA_OPERATOR_ARGS              more arguments for KEDA's operator
#                                   (scripts/controlplane.sh), e.g. its API
#                                   client's "--kube-api-qps 200 --kube-api-burst 1000"
#   BENCH_KEEP=1                    keep the work directory
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

OBJECTS="${BENCH_KEDA_OBJECTS:-100 1000}"
ROWS="${BENCH_KEDA_ROWS:-keda:5 hoist:5 push:5 push:60 push:300}"
SOURCE_INTERVAL="${BENCH_KEDA_SOURCE_INTERVAL:-5}"
WINDOW="${BENCH_KEDA_WINDOW:-60}"
DOC="${BENCH_DOC:-docs/BENCHMARKS.md}"
SECTION="${BENCH_KEDA_SECTION:-bench-keda}"
started_at=$(date +%s)

scripts/deps.sh redis-server redis-tools
scripts/layer-tool.sh kubectl
cargo build --locked --release --bin hoist --bin hoist-load
scripts/controlplane.sh build
HOIST="$ROOT/target/release/hoist"
LOAD="$ROOT/target/release/hoist-load"

work="$(mktemp -d /tmp/hoist-bench-keda.XXXXXX)"
plane="$work/plane"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  CONTROLPLANE_DIR="$plane" scripts/controlplane.sh down >/dev/null 2>&1 || true
  if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# The HPA controller at Kubernetes' default sync period, as in a cluster.
export KUBECONFIG
KUBECONFIG="$(CONTROLPLANE_DIR="$plane" HPA_SYNC_PERIOD=15s CONTROLPLANE_PARENT=$$ \
  scripts/controlplane.sh up | tail -n 1)"
operator_pid="$(cat "$plane/pids/keda-operator")"

read -r redis_port grpc_port admin_port <<<"$("$LOAD" free-ports 3)"
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$work" --maxclients 10000 >"$work/redis.log" 2>&1 &
redis_pid=$!
pids+=("$redis_pid")
# hoist as a passthrough scaler: no cluster access here (KEDA's side is
# what is measured), callers trusted (loopback only). Its JSON log says
# when each activation push left (debug level, hoist::grpc alone).
cat >"$work/hoist.toml" <<EOF
state_file = ""
[grpc]
listen = "127.0.0.1:$grpc_port"
trust_callers = true
[admin]
listen = "127.0.0.1:$admin_port"
[kubernetes]
enabled = false
[log]
format = "json"
level = "hoist::grpc=debug,info"
EOF
"$HOIST" serve --config "$work/hoist.toml" >"$work/hoist.log" 2>&1 &
hoist_pid=$!
pids+=("$hoist_pid")
for port in "$redis_port" "$grpc_port"; do
  for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
done
redis() { redis-cli -p "$redis_port" "$@"; }

# ticks PID (utime + stime with its children), rss_mib PID.
source scripts/proc.sh
# Calls per command Redis ran ("name calls" lines), INFO itself not counted.
command_calls() { redis info commandstats | awk -F'[:=,]' '/^cmdstat_/ && $1 != "cmdstat_info" {sub("cmdstat_", "", $1); print $1, $3}'; }
total() { awk '{n += $2} END {print n + 0}' "$1"; }
# "llen 1.0, ping 0.2": per second between two command_calls files.
per_command() {
  awk -v ms="$3" 'NR == FNR {before[$1] = $2; next} {d = $2 - before[$1]; if (d > 0) printf "%s%s %.1f", (n++ ? ", " : ""), $1, d * 1000 / ms}' "$1" "$2"
}
now_ms() { echo $(( ${EPOCHREALTIME/./} / 1000 )); }

# objects MODE N NAMESPACE INTERVAL: N Deployments at 0 and their
# ScaledObjects, KEDA polling each every INTERVAL seconds.
objects() {
  local mode="$1" n="$2" namespace="$3" interval="$4" i trigger
  case "$mode" in
  keda)
    trigger="  - type: redis
    metadata: {address: \"127.0.0.1:$redis_port\", listName: jobs, listLength: \"5\"}"
    ;;
  *)
    trigger="  - type: $( [ "$mode" = push ] && echo external-push || echo external)
    metadata: {scalerAddress: \"127.0.0.1:$grpc_port\", scaler: redis, address: \"127.0.0.1:$redis_port\", listName: jobs, listLength: \"5\", pollingInterval: \"$SOURCE_INTERVAL\"}"
    ;;
  esac
  echo "apiVersion: v1
kind: Namespace
metadata: {name: $namespace}"
  for i in $(seq "$n"); do
    echo "---
apiVersion: apps/v1
kind: Deployment
metadata: {name: worker-$i, namespace: $namespace}
spec:
  replicas: 0
  selector: {matchLabels: {app: worker-$i}}
  template:
    metadata: {labels: {app: worker-$i}}
    spec: {containers: [{name: app, image: registry.invalid/worker:1}]}
---
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: worker-$i, namespace: $namespace}
spec:
  scaleTargetRef: {name: worker-$i}
  pollingInterval: $interval
  cooldownPeriod: 30
  minReplicaCount: 0
  maxReplicaCount: 10
  triggers:
$trigger"
  done
}

replicas_at_one() { # namespace: how many Deployments ask for 1 or more
  kubectl get deployments -n "$1" -o jsonpath='{range .items[*]}{.spec.replicas}{"\n"}{end}' |
    awk '$1 >= 1 {n++} END {print n + 0}'
}
seconds() { awk -v ms="$1" 'BEGIN {printf "%.1f", ms / 1000}'; }

rows=()
commands_by_row=()
writes_by_row=()
for n in $OBJECTS; do
  for row in $ROWS; do
    mode="${row%%:*}" interval="${row#*:}"
    namespace="bench-$mode-$interval-$n"
    case "$mode" in
    keda) label="KEDA \`redis\`" ;;
    hoist) label="hoist \`external\`" ;;
    push) label="hoist \`external-push\`" ;;
    *) echo "BENCH_KEDA_ROWS: $row is not keda|hoist|push:SECONDS" >&2; exit 2 ;;
    esac
    echo "== $n ScaledObjects, $label, pollingInterval $interval s"
    redis del jobs >/dev/null
    objects "$mode" "$n" "$namespace" "$interval" >"$work/$namespace.yaml"
    audit_from=$(stat -c %s "$plane/logs/audit.log")
    created=$(now_ms)
    kubectl create -f "$work/$namespace.yaml" >/dev/null
    # Set up: KEDA has made an HPA for every ScaledObject.
    for _ in $(seq 600); do
      made=$(kubectl get hpa -n "$namespace" --no-headers 2>/dev/null | wc -l)
      [ "$made" -ge "$n" ] && break
      sleep 1
    done
    hpas_s=$(seconds $(( $(now_ms) - created )))
    # KEDA goes on writing each new ScaledObject's status (about seven
    # patches each) for minutes after the last HPA when its API client is
    # at its rate limit: load is measured once those writes have stopped
    # (none for 20 s), so that it is the idle cost and not the setup's.
    for _ in $(seq 240); do
      quiet=$(python3 scripts/bench-keda-timeline.py --status-writes-since "$plane/logs/audit.log" "$audit_from" "$namespace" 20)
      [ "$quiet" = 0 ] && break
      sleep 5
    done
    settled_s=$(seconds $(( $(now_ms) - created )))
    echo "   $made HPAs after $hpas_s s; KEDA's status writes done after $settled_s s; settling 20 s"
    sleep 20
    # Idle load: every ScaledObject inactive, KEDA polling each one.
    command_calls >"$work/calls0"
    op0=$(ticks "$operator_pid") hoist0=$(ticks "$hoist_pid") redis0=$(ticks "$redis_pid") t0=$(now_ms)
    sleep "$WINDOW"
    op1=$(ticks "$operator_pid") hoist1=$(ticks "$hoist_pid") redis1=$(ticks "$redis_pid") t1=$(now_ms)
    command_calls >"$work/calls1"
    c0=$(total "$work/calls0") c1=$(total "$work/calls1")
    hz=$(getconf CLK_TCK)
    elapsed_ms=$((t1 - t0))
    per_second=$(awk -v c=$((c1 - c0)) -v ms="$elapsed_ms" 'BEGIN {printf "%.1f", c * 1000 / ms}')
    operator_cpu=$(awk -v t=$((op1 - op0)) -v hz="$hz" -v ms="$elapsed_ms" 'BEGIN {printf "%.1f", t * 100000 / hz / ms}')
    hoist_cpu=$(awk -v t=$((hoist1 - hoist0)) -v hz="$hz" -v ms="$elapsed_ms" 'BEGIN {printf "%.1f", t * 100000 / hz / ms}')
    redis_cpu=$(awk -v t=$((redis1 - redis0)) -v hz="$hz" -v ms="$elapsed_ms" 'BEGIN {printf "%.1f", t * 100000 / hz / ms}')
    by_command=$(per_command "$work/calls0" "$work/calls1" "$elapsed_ms")
    operator_rss=$(rss_mib "$operator_pid")
    hoist_rss=$(rss_mib "$hoist_pid")
    clients=$(redis info clients | awk -F: '/^connected_clients/ {print $2 + 0}')
    # One push: the time until the first and the last Deployment ask for 1.
    operator_log_lines=$(wc -l <"$plane/logs/keda-operator.log")
    pushed=$(now_ms)
    redis lpush jobs job >/dev/null
    first="" last=""
    while [ $(( $(now_ms) - pushed )) -lt 180000 ]; do
      up=$(replicas_at_one "$namespace")
      at=$(( $(now_ms) - pushed ))
      [ -z "$first" ] && [ "$up" -ge 1 ] && first=$at
      if [ "$up" -ge "$n" ]; then last=$at; break; fi
      sleep 0.2
    done
    first_s=$( [ -n "$first" ] && seconds "$first" || echo "none in 180")
    last_s=$( [ -n "$last" ] && seconds "$last" || echo "not all in 180")
    # The list emptied: until every Deployment is back at 0 (KEDA's
    # cooldown, then its next poll of each ScaledObject).
    redis del jobs >/dev/null
    emptied=$(now_ms) zero=""
    zero_limit=$(( (interval + 30 + 180) * 1000 ))
    while [ $(( $(now_ms) - emptied )) -lt "$zero_limit" ]; do
      if [ "$(replicas_at_one "$namespace")" -eq 0 ]; then zero=$(( $(now_ms) - emptied )); break; fi
      sleep 0.5
    done
    zero_s=$( [ -n "$zero" ] && seconds "$zero" || echo "not all in $(( zero_limit / 1000 ))")
    # When hoist pushed, and when KEDA read each Deployment's scale, wrote
    # it and wrote the ScaledObject's status (hoist's log, the API server's
    # audit log); and how long its API client waited on its own rate limit
    # meanwhile (client-go logs waits over 1 s): why the push took as long
    # as it did.
    writes=$(python3 scripts/bench-keda-timeline.py "$plane/logs/audit.log" "$work/hoist.log" "$namespace" "$pushed")
    throttled=$(tail -n +"$((operator_log_lines + 1))" "$plane/logs/keda-operator.log" | python3 -c '
import re, sys
# client-go: "Waited before sending request" with its delay (Go duration),
# logged at KEDA'"'"'s info level for waits over 1 s, at most once a second.
waits = []
for line in sys.stdin:
    if "Waited before sending request" not in line:
        continue
    found = re.search(r"delay\W+([0-9.]+)(ms|s|m)\b", line)
    if found:
        value, unit = float(found.group(1)), found.group(2)
        waits.append(value / 1000 if unit == "ms" else value * 60 if unit == "m" else value)
print(f"{len(waits)} waits over 1 s logged, longest {max(waits):.1f} s" if waits else "no wait over 1 s logged")
')
    gave_up=$(tail -n +"$((operator_log_lines + 1))" "$plane/logs/keda-operator.log" | grep -c 'rate: Wait(n=1) would exceed context deadline' || true)
    throttled="$throttled; $gave_up calls given up at its rate limiter (\`rate: Wait(n=1) would exceed context deadline\`); set-up: every HPA after $hpas_s s, the status writes done after $settled_s s"
    writes_by_row+=("- $n ScaledObjects, $label, pollingInterval $interval s: $writes; KEDA's API client: $throttled")
    echo "   ${writes_by_row[-1]}"
    hoist_cells=$( [ "$mode" = keda ] && echo "–" || echo "$hoist_cpu % / $hoist_rss MiB")
    rows+=("| $n | $label | $interval s | $per_second | $redis_cpu % | $clients | $operator_cpu % | $operator_rss MiB | $hoist_cells | $first_s s | $last_s s | $zero_s s |")
    commands_by_row+=("- $n ScaledObjects, $label, pollingInterval $interval s: ${by_command:-none}")
    echo "   ${rows[-1]}"
    echo "   Redis commands per second: ${by_command:-none}"
    kubectl delete namespace "$namespace" --wait=true --timeout=600s >/dev/null
    sleep 10
  done
done

finished_at=$(date +%s)
versions="$(scripts/controlplane.sh versions)"
table="$work/table.md"
{
  echo "- When: $(date -u -d "@$started_at" '+%Y-%m-%d %H:%M UTC'), $(( (finished_at - started_at) / 60 )) min, $(nproc) CPUs, hoist at $(git rev-parse --short HEAD); $versions; $(redis-server --version | cut -d' ' -f3)."
  if [ -n "${KEDA_OPERATOR_ARGS:-}" ]; then
    echo "- KEDA's operator with \`$KEDA_OPERATOR_ARGS\`."
  else
    echo "- KEDA's operator with its defaults (its API client at \`--kube-api-qps 20\`, \`--kube-api-burst 30\`)."
  fi
  echo "- Every ScaledObject: the row's \`pollingInterval\`, \`cooldownPeriod: 30\`, \`minReplicaCount: 0\`, one Redis list \`jobs\` with \`listLength: \"5\"\`; hoist polls the list every $SOURCE_INTERVAL s (its triggers' \`pollingInterval\` metadata), whatever KEDA's interval. The HPA controller syncs every 15 s. Load is measured over $WINDOW s with every ScaledObject inactive, once KEDA made every HPA and its status writes for them stopped (none for 20 s), and 20 s more. Last job → 0: from emptying the list until every Deployment is at 0."
  knobs=""
  [ -n "${KEDA_OPERATOR_ARGS:-}" ] && knobs+="KEDA_OPERATOR_ARGS=\"$KEDA_OPERATOR_ARGS\" "
  [ "$OBJECTS" != "100 1000" ] && knobs+="BENCH_KEDA_OBJECTS=\"$OBJECTS\" "
  [ "$ROWS" != "keda:5 hoist:5 push:5 push:60 push:300" ] && knobs+="BENCH_KEDA_ROWS=\"$ROWS\" "
  [ "$SECTION" != bench-keda ] && knobs+="BENCH_KEDA_SECTION=$SECTION "
  echo "- Command: \`${knobs}scripts/bench-keda.sh\` (part 9 of \`scripts/bench.sh\`)."
  echo
  echo "| ScaledObjects | scaler | pollingInterval | Redis commands/s | Redis CPU | Redis clients | KEDA operator CPU | KEDA operator RSS | hoist CPU / RSS | push → first 0 → 1 | push → every 0 → 1 | last job → every 1 → 0 |"
  echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  printf '%s\n' "${rows[@]}"
  echo
  echo "Redis commands per second, by command:"
  echo
  printf '%s\n' "${commands_by_row[@]}"
  echo
  echo "After the push, in seconds: when hoist pushed (its log); when KEDA read each Deployment's scale, wrote it, and wrote the ScaledObject's status (the API server's audit log); its API client's own waits (operator log):"
  echo
  printf '%s\n' "${writes_by_row[@]}"
} >"$table"
if [ "$DOC" = "-" ]; then
  cat "$table"
else
  python3 - "$DOC" "$table" "$SECTION" <<'EOF'
import sys
doc, table, section = sys.argv[1], open(sys.argv[2]).read(), sys.argv[3]
text = open(doc).read()
start = text.index(f"<!-- {section}:begin")
start = text.index("\n", start) + 1
stop = text.index(f"<!-- {section}:end -->")
open(doc, "w").write(text[:start] + "\n" + table + "\n" + text[stop:])
EOF
  echo "recorded in $DOC"
fi
