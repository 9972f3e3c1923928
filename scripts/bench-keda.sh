#!/usr/bin/env bash
# KEDA's built-in `redis` scaler and hoist's `external` and
# `external-push` triggers, side by side, called by the real KEDA operator
# (scripts/controlplane.sh): N ScaledObjects on one Redis list, the same
# intervals, once per scaler.
# For each: Redis commands per second (`INFO commandstats`), KEDA
# operator's CPU and RSS (and hoist's), and the time from one push to the
# list to the Deployments' 0 → 1. A benchmark: it prints and records,
# never fails anything. Part 9 of scripts/bench.sh; runs alone too:
#
#   scripts/bench-keda.sh
#
# Knobs (environment):
#   BENCH_KEDA_OBJECTS="100 1000"   ScaledObjects per row
#   BENCH_KEDA_INTERVAL=5           pollingInterval of every ScaledObject (s)
#   BENCH_KEDA_WINDOW=60            seconds over which load is measured
#   BENCH_DOC=docs/BENCHMARKS.md    where the table goes ("-": standard output)
#   BENCH_KEEP=1                    keep the work directory
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

OBJECTS="${BENCH_KEDA_OBJECTS:-100 1000}"
INTERVAL="${BENCH_KEDA_INTERVAL:-5}"
WINDOW="${BENCH_KEDA_WINDOW:-60}"
DOC="${BENCH_DOC:-docs/BENCHMARKS.md}"
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
pids+=($!)
# hoist as a passthrough scaler: no cluster access here (KEDA's side is
# what is measured), callers trusted (loopback only).
cat >"$work/hoist.toml" <<EOF
state_file = ""
[grpc]
listen = "127.0.0.1:$grpc_port"
trust_callers = true
[admin]
listen = "127.0.0.1:$admin_port"
[kubernetes]
enabled = false
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

# objects MODE N NAMESPACE: N Deployments at 0 and their ScaledObjects.
objects() {
  local mode="$1" n="$2" namespace="$3" i trigger
  case "$mode" in
  keda)
    trigger="  - type: redis
    metadata: {address: \"127.0.0.1:$redis_port\", listName: jobs, listLength: \"5\"}"
    ;;
  *)
    trigger="  - type: $( [ "$mode" = push ] && echo external-push || echo external)
    metadata: {scalerAddress: \"127.0.0.1:$grpc_port\", scaler: redis, address: \"127.0.0.1:$redis_port\", listName: jobs, listLength: \"5\", pollingInterval: \"$INTERVAL\"}"
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
  pollingInterval: $INTERVAL
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

rows=()
commands_by_row=()
for n in $OBJECTS; do
  for mode in keda hoist push; do
    namespace="bench-$mode-$n"
    case "$mode" in
    keda) label="KEDA \`redis\`" ;;
    hoist) label="hoist \`external\`" ;;
    push) label="hoist \`external-push\`" ;;
    esac
    echo "== $n ScaledObjects, $label"
    redis del jobs >/dev/null
    objects "$mode" "$n" "$namespace" >"$work/$namespace.yaml"
    kubectl create -f "$work/$namespace.yaml" >/dev/null
    # Set up: KEDA has made an HPA for every ScaledObject.
    for _ in $(seq 600); do
      made=$(kubectl get hpa -n "$namespace" --no-headers 2>/dev/null | wc -l)
      [ "$made" -ge "$n" ] && break
      sleep 1
    done
    echo "   $made HPAs; settling 20 s"
    sleep 20
    # Idle load: every ScaledObject inactive, KEDA polling each one.
    command_calls >"$work/calls0"
    op0=$(ticks "$operator_pid") hoist0=$(ticks "$hoist_pid") t0=$(now_ms)
    sleep "$WINDOW"
    op1=$(ticks "$operator_pid") hoist1=$(ticks "$hoist_pid") t1=$(now_ms)
    command_calls >"$work/calls1"
    c0=$(total "$work/calls0") c1=$(total "$work/calls1")
    hz=$(getconf CLK_TCK)
    elapsed_ms=$((t1 - t0))
    per_second=$(awk -v c=$((c1 - c0)) -v ms="$elapsed_ms" 'BEGIN {printf "%.1f", c * 1000 / ms}')
    operator_cpu=$(awk -v t=$((op1 - op0)) -v hz="$hz" -v ms="$elapsed_ms" 'BEGIN {printf "%.1f", t * 100000 / hz / ms}')
    hoist_cpu=$(awk -v t=$((hoist1 - hoist0)) -v hz="$hz" -v ms="$elapsed_ms" 'BEGIN {printf "%.1f", t * 100000 / hz / ms}')
    by_command=$(per_command "$work/calls0" "$work/calls1" "$elapsed_ms")
    operator_rss=$(rss_mib "$operator_pid")
    hoist_rss=$(rss_mib "$hoist_pid")
    clients=$(redis info clients | awk -F: '/^connected_clients/ {print $2 + 0}')
    # One push: the time until the first and the last Deployment ask for 1.
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
    first_s=$(awk -v ms="${first:-0}" 'BEGIN {printf "%.1f", ms / 1000}')
    last_s=$( [ -n "$last" ] && awk -v ms="$last" 'BEGIN {printf "%.1f", ms / 1000}' || echo "not all in 180")
    hoist_cells=$( [ "$mode" = keda ] && echo "–" || echo "$hoist_cpu % / $hoist_rss MiB")
    rows+=("| $n | $label | $per_second | $clients | $operator_cpu % | $operator_rss MiB | $hoist_cells | $first_s s | $last_s s |")
    commands_by_row+=("- $n ScaledObjects, $label: ${by_command:-none}")
    echo "   ${rows[-1]}"
    echo "   Redis commands per second: ${by_command:-none}"
    redis del jobs >/dev/null
    kubectl delete namespace "$namespace" --wait=true --timeout=600s >/dev/null
    sleep 10
  done
done

finished_at=$(date +%s)
versions="$(sed -n 's/^KUBERNETES_VERSION="\(.*\)"/Kubernetes \1/p' scripts/controlplane.sh), KEDA $(awk '/kedacore\/keda\/v2 v/ {print $2; exit}' tools/keda/go.mod)"
table="$work/table.md"
{
  echo "- When: $(date -u -d "@$started_at" '+%Y-%m-%d %H:%M UTC'), $(( (finished_at - started_at) / 60 )) min, $(nproc) CPUs, hoist at $(git rev-parse --short HEAD); $versions; $(redis-server --version | cut -d' ' -f3)."
  echo "- Every ScaledObject: \`pollingInterval: $INTERVAL\`, \`minReplicaCount: 0\`, one Redis list \`jobs\` with \`listLength: \"5\"\`; hoist's trigger carries the same \`pollingInterval\`. The HPA controller syncs every 15 s. Load is measured over $WINDOW s with every ScaledObject inactive, after KEDA made all the HPAs and 20 s more."
  echo "- Command: \`scripts/bench-keda.sh\` (part 9 of \`scripts/bench.sh\`)."
  echo
  echo "| ScaledObjects | scaler | Redis commands/s | Redis clients | KEDA operator CPU | KEDA operator RSS | hoist CPU / RSS | push → first 0 → 1 | push → every 0 → 1 |"
  echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  printf '%s\n' "${rows[@]}"
  echo
  echo "Redis commands per second, by command:"
  echo
  printf '%s\n' "${commands_by_row[@]}"
} >"$table"
if [ "$DOC" = "-" ]; then
  cat "$table"
else
  python3 - "$DOC" "$table" <<'EOF'
import sys
doc, table = sys.argv[1], open(sys.argv[2]).read()
text = open(doc).read()
start = text.index("<!-- bench-keda:begin")
start = text.index("\n", start) + 1
stop = text.index("<!-- bench-keda:end -->")
open(doc, "w").write(text[:start] + "\n" + table + "\n" + text[stop:])
EOF
  echo "recorded in $DOC"
fi
