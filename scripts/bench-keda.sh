#!/usr/bin/env bash
# KEDA's built-in `redis` (or `kafka`, below) scaler and hoist's `external` and
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
# Its Kafka part (BENCH_KEDA_SOURCE=kafka), a table of its own: KEDA's
# built-in `kafka` scaler beside hoist's, on the real broker of
# scripts/kafka.sh (JMX on a loopback port): N ScaledObjects on one topic
# `jobs` of 12 partitions, each with a consumer group of its own or G
# groups shared among them. The broker's own counts: requests per second by
# request type and its open connections (JMX, tools/kafka/BrokerMetrics.java),
# its CPU; one message produced (lag 1 for every group) → the Deployments'
# 0 → 1; every group committed to the end → every Deployment at 0.
#
#   BENCH_KEDA_SOURCE=kafka scripts/bench-keda.sh
#
# Knobs (environment):
#   BENCH_KEDA_SOURCE=redis         `redis` or `kafka`
#   BENCH_KEDA_OBJECTS="100 1000"   ScaledObjects per row
#   BENCH_KEDA_ROWS="keda:5 hoist:5 push:5 push:60 push:300"
#                                   SCALER:INTERVAL: `keda` (KEDA's `redis`
#                                   or `kafka`), `hoist` (`external`) or
#                                   `push` (`external-push`), at that
#                                   pollingInterval of the ScaledObjects (s);
#                                   with kafka "keda:5 hoist:5 push:60"
#   BENCH_KEDA_KAFKA_GROUPS         consumer groups the ScaledObjects share
#                                   (ScaledObject i: group i mod G); unset:
#                                   one group per ScaledObject
#   BENCH_KEDA_SOURCE_INTERVAL=5    how often hoist polls the source (s): its
#                                   triggers' pollingInterval, whatever KEDA's
#   BENCH_KEDA_WINDOW=60            seconds over which load is measured
#   BENCH_DOC=docs/BENCHMARKS.md    where the table goes ("-": standard output)
#   BENCH_KEDA_SECTION=bench-keda   the markers in BENCH_DOC it goes between
#                                   (bench-keda-kafka with kafka)
#   KEDA_OPERATOR_ARGS              more arguments for KEDA's operator
#                                   (scripts/controlplane.sh), e.g. its API
#                                   client's "--kube-api-qps 200 --kube-api-burst 1000"
#   BENCH_KEEP=1                    keep the work directory
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

SOURCE="${BENCH_KEDA_SOURCE:-redis}"
case "$SOURCE" in
redis) default_rows="keda:5 hoist:5 push:5 push:60 push:300" default_section=bench-keda ;;
kafka) default_rows="keda:5 hoist:5 push:60" default_section=bench-keda-kafka ;;
*) echo "BENCH_KEDA_SOURCE: $SOURCE is not redis|kafka" >&2; exit 2 ;;
esac
OBJECTS="${BENCH_KEDA_OBJECTS:-100 1000}"
ROWS="${BENCH_KEDA_ROWS:-$default_rows}"
GROUPS_SHARED="${BENCH_KEDA_KAFKA_GROUPS:-}"
SOURCE_INTERVAL="${BENCH_KEDA_SOURCE_INTERVAL:-5}"
WINDOW="${BENCH_KEDA_WINDOW:-60}"
DOC="${BENCH_DOC:-docs/BENCHMARKS.md}"
SECTION="${BENCH_KEDA_SECTION:-$default_section}"
started_at=$(date +%s)

if [ "$SOURCE" = redis ]; then scripts/deps.sh redis-server redis-tools; else scripts/kafka.sh build; fi
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
  if [ "$SOURCE" = kafka ]; then KAFKA_DIR="$work/kafka" scripts/kafka.sh down >/dev/null 2>&1 || true; fi
  if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# The HPA controller at Kubernetes' default sync period, as in a cluster.
export KUBECONFIG
KUBECONFIG="$(CONTROLPLANE_DIR="$plane" HPA_SYNC_PERIOD=15s CONTROLPLANE_PARENT=$$ \
  scripts/controlplane.sh up | tail -n 1)"
operator_pid="$(cat "$plane/pids/keda-operator")"

read -r redis_port grpc_port admin_port jmx_port <<<"$("$LOAD" free-ports 4)"
if [ "$SOURCE" = redis ]; then
  redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work" --maxclients 10000 >"$work/redis.log" 2>&1 &
  source_pid=$!
  pids+=("$source_pid")
  source_port="$redis_port"
else
  bootstrap="$(KAFKA_DIR="$work/kafka" KAFKA_JMX_PORT="$jmx_port" KAFKA_PARENT=$$ scripts/kafka.sh up | tail -n 1)"
  source_pid="$(cat "$work/kafka/pid")"
  source_port="${bootstrap##*:}"
  kafka_version="$(basename "$(ls "$ROOT"/target/kafka/lib/kafka_2.13-*.jar)" .jar)"
  "$LOAD" kafka-groups create-topic --bootstrap "$bootstrap" --topic jobs --partitions 12
fi
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
for port in "$source_port" "$grpc_port"; do
  for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
done
redis() { redis-cli -p "$redis_port" "$@"; }

# ticks PID (utime + stime with its children), rss_mib PID.
source scripts/proc.sh
# Calls per command Redis ran ("name calls" lines), INFO itself not counted;
# with Kafka, the broker's requests by type since it started.
command_calls() {
  if [ "$SOURCE" = redis ]; then
    redis info commandstats | awk -F'[:=,]' '/^cmdstat_/ && $1 != "cmdstat_info" {sub("cmdstat_", "", $1); print $1, $3}'
  else
    # Less the node's own KRaft traffic (its broker's heartbeats to its
    # controller), the same in every row.
    java "$ROOT/tools/kafka/BrokerMetrics.java" "127.0.0.1:$jmx_port" |
      awk '$1 == "requests" && $2 !~ /^(BrokerHeartbeat|BrokerRegistration|ControllerRegistration)$/ {print $2, $3}'
  fi
}
# Redis's connected clients; the broker's connections on its PLAINTEXT
# listener (the one every client here uses).
source_clients() {
  if [ "$SOURCE" = redis ]; then
    redis info clients | awk -F: '/^connected_clients/ {print $2 + 0}'
  else
    java "$ROOT/tools/kafka/BrokerMetrics.java" "127.0.0.1:$jmx_port" | awk '$1 == "connections" && $2 == "PLAINTEXT" {print $3}'
  fi
}
# The groups of a row: ScaledObject i is in group_of i (1-based), named
# `workers-N` in every row: hoist keeps polling a trigger for
# `polling.idle_after` (10 min) after KEDA last asked, so a row's groups of
# their own would leave the previous row's polls running beside its own.
groups_of_row() { echo "${GROUPS_SHARED:-$1}"; }
group_of() { echo $(( ($1 - 1) % $2 + 1 )); }
# Nothing waiting: the list empty, every group at the end of the topic.
source_empty() { # groups
  if [ "$SOURCE" = redis ]; then
    redis del jobs >/dev/null
  else
    "$LOAD" kafka-groups catch-up --bootstrap "$bootstrap" --topic jobs --group-prefix workers --groups "$1"
  fi
}
# One job: a list entry, or one message (lag 1 for every group).
source_push() {
  if [ "$SOURCE" = redis ]; then
    redis lpush jobs job >/dev/null
  else
    "$LOAD" kafka-groups produce --bootstrap "$bootstrap" --topic jobs
  fi
}
total() { awk '{n += $2} END {print n + 0}' "$1"; }
# "llen 1.0, ping 0.2": per second between two command_calls files.
per_command() {
  awk -v ms="$3" 'NR == FNR {before[$1] = $2; next} {d = $2 - before[$1]; if (d > 0) printf "%s%s %.1f", (n++ ? ", " : ""), $1, d * 1000 / ms}' "$1" "$2"
}
now_ms() { echo $(( ${EPOCHREALTIME/./} / 1000 )); }

# The trigger of ScaledObject I (MODE GROUPS I).
trigger() {
  local mode="$1" groups="$2" i="$3" source
  if [ "$SOURCE" = redis ]; then
    source="address: \"127.0.0.1:$redis_port\", listName: jobs, listLength: \"5\""
  else
    source="bootstrapServers: \"$bootstrap\", consumerGroup: workers-$(group_of "$i" "$groups"), topic: jobs, lagThreshold: \"5\""
  fi
  case "$mode" in
  keda)
    echo "  - type: $SOURCE
    metadata: {$source}"
    ;;
  *)
    echo "  - type: $( [ "$mode" = push ] && echo external-push || echo external)
    metadata: {scalerAddress: \"127.0.0.1:$grpc_port\", scaler: $SOURCE, $source, pollingInterval: \"$SOURCE_INTERVAL\"}"
    ;;
  esac
}

# objects MODE N NAMESPACE INTERVAL GROUPS: N Deployments at 0 and their
# ScaledObjects, KEDA polling each every INTERVAL seconds.
objects() {
  local mode="$1" n="$2" namespace="$3" interval="$4" groups="$5" i
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
$(trigger "$mode" "$groups" "$i")"
  done
}

replicas_at_one() { # namespace: how many Deployments ask for 1 or more
  # Retried: at 1,000 ScaledObjects the API server, busy with KEDA's
  # writes after a push, at times resets a read's stream (INTERNAL_ERROR).
  local listed tries=0
  until listed=$(kubectl get deployments -n "$1" -o jsonpath='{range .items[*]}{.spec.replicas}{"\n"}{end}' 2>"$work/kubectl.err"); do
    tries=$((tries + 1))
    [ "$tries" -lt 5 ] || { cat "$work/kubectl.err" >&2; return 1; }
    sleep 0.5
  done
  awk '$1 >= 1 {n++} END {print n + 0}' <<<"$listed"
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
    keda) label="KEDA \`$SOURCE\`" ;;
    hoist) label="hoist \`external\`" ;;
    push) label="hoist \`external-push\`" ;;
    *) echo "BENCH_KEDA_ROWS: $row is not keda|hoist|push:SECONDS" >&2; exit 2 ;;
    esac
    groups=$(groups_of_row "$n")
    [ "$SOURCE" = kafka ] && label="$label, $groups groups"
    echo "== $n ScaledObjects, $label, pollingInterval $interval s"
    source_empty "$groups"
    objects "$mode" "$n" "$namespace" "$interval" "$groups" >"$work/$namespace.yaml"
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
    op0=$(ticks "$operator_pid") hoist0=$(ticks "$hoist_pid") source0=$(ticks "$source_pid") t0=$(now_ms)
    sleep "$WINDOW"
    op1=$(ticks "$operator_pid") hoist1=$(ticks "$hoist_pid") source1=$(ticks "$source_pid") t1=$(now_ms)
    command_calls >"$work/calls1"
    c0=$(total "$work/calls0") c1=$(total "$work/calls1")
    hz=$(getconf CLK_TCK)
    elapsed_ms=$((t1 - t0))
    per_second=$(awk -v c=$((c1 - c0)) -v ms="$elapsed_ms" 'BEGIN {printf "%.1f", c * 1000 / ms}')
    operator_cpu=$(awk -v t=$((op1 - op0)) -v hz="$hz" -v ms="$elapsed_ms" 'BEGIN {printf "%.1f", t * 100000 / hz / ms}')
    hoist_cpu=$(awk -v t=$((hoist1 - hoist0)) -v hz="$hz" -v ms="$elapsed_ms" 'BEGIN {printf "%.1f", t * 100000 / hz / ms}')
    source_cpu=$(awk -v t=$((source1 - source0)) -v hz="$hz" -v ms="$elapsed_ms" 'BEGIN {printf "%.1f", t * 100000 / hz / ms}')
    by_command=$(per_command "$work/calls0" "$work/calls1" "$elapsed_ms")
    operator_rss=$(rss_mib "$operator_pid")
    hoist_rss=$(rss_mib "$hoist_pid")
    clients=$(source_clients)
    # One push: the time until the first and the last Deployment ask for 1.
    operator_log_lines=$(wc -l <"$plane/logs/keda-operator.log")
    pushed=$(now_ms)
    source_push
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
    # The list emptied (the groups caught up: from when the last group's
    # commit is done): until every Deployment is back at 0 (KEDA's
    # cooldown, then its next poll of each ScaledObject).
    source_empty "$groups"
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
    rows+=("| $n | $label | $interval s | $per_second | $source_cpu % | $clients | $operator_cpu % | $operator_rss MiB | $hoist_cells | $first_s s | $last_s s | $zero_s s |")
    commands_by_row+=("- $n ScaledObjects, $label, pollingInterval $interval s: ${by_command:-none}")
    echo "   ${rows[-1]}"
    echo "   $( [ "$SOURCE" = redis ] && echo "Redis commands" || echo "the broker's requests") per second: ${by_command:-none}"
    kubectl delete namespace "$namespace" --wait=true --timeout=600s >/dev/null
    sleep 10
  done
done

finished_at=$(date +%s)
versions="$(scripts/controlplane.sh versions)"
table="$work/table.md"
{
  if [ "$SOURCE" = redis ]; then source_version="$(redis-server --version | cut -d' ' -f3)"; else source_version="Apache Kafka ${kafka_version#kafka_2.13-} (one KRaft node, scripts/kafka.sh)"; fi
  echo "- When: $(date -u -d "@$started_at" '+%Y-%m-%d %H:%M UTC'), $(( (finished_at - started_at) / 60 )) min, $(nproc) CPUs, hoist at $(git rev-parse --short HEAD); $versions; $source_version."
  if [ -n "${KEDA_OPERATOR_ARGS:-}" ]; then
    echo "- KEDA's operator with \`$KEDA_OPERATOR_ARGS\`."
  else
    echo "- KEDA's operator with its defaults (its API client at \`--kube-api-qps 20\`, \`--kube-api-burst 30\`)."
  fi
  if [ "$SOURCE" = redis ]; then
    echo "- Every ScaledObject: the row's \`pollingInterval\`, \`cooldownPeriod: 30\`, \`minReplicaCount: 0\`, one Redis list \`jobs\` with \`listLength: \"5\"\`; hoist polls the list every $SOURCE_INTERVAL s (its triggers' \`pollingInterval\` metadata), whatever KEDA's interval. The HPA controller syncs every 15 s. Load is measured over $WINDOW s with every ScaledObject inactive, once KEDA made every HPA and its status writes for them stopped (none for 20 s), and 20 s more. Last job → 0: from emptying the list until every Deployment is at 0."
  else
    echo "- Every ScaledObject: the row's \`pollingInterval\`, \`cooldownPeriod: 30\`, \`minReplicaCount: 0\`, one Kafka trigger on the topic \`jobs\` (12 partitions) with \`lagThreshold: \"5\"\` and a consumer group \`workers-N\` (each ScaledObject its own, or the row's groups shared in turn; the same groups in every row), every group committed at the end of every partition; hoist reads each group's lag every $SOURCE_INTERVAL s (its triggers' \`pollingInterval\` metadata), whatever KEDA's interval. The HPA controller syncs every 15 s. Load is measured over $WINDOW s with every ScaledObject inactive, once KEDA made every HPA and its status writes for them stopped (none for 20 s), and 20 s more; requests and connections are the broker's own (JMX: \`kafka.network:type=RequestMetrics,name=RequestsPerSec\` counts, \`socket-server-metrics\` \`connection-count\` on the listener every client uses, read at the window's end). Produce: one message into partition 0 (lag 1 for every group). Caught up → 0: from when every group's commit to the end is done until every Deployment is at 0."
  fi
  knobs=""
  [ -n "${KEDA_OPERATOR_ARGS:-}" ] && knobs+="KEDA_OPERATOR_ARGS=\"$KEDA_OPERATOR_ARGS\" "
  [ "$OBJECTS" != "100 1000" ] && knobs+="BENCH_KEDA_OBJECTS=\"$OBJECTS\" "
  [ "$SOURCE" != redis ] && knobs+="BENCH_KEDA_SOURCE=$SOURCE "
  [ -n "$GROUPS_SHARED" ] && knobs+="BENCH_KEDA_KAFKA_GROUPS=$GROUPS_SHARED "
  [ "$ROWS" != "$default_rows" ] && knobs+="BENCH_KEDA_ROWS=\"$ROWS\" "
  [ "$SECTION" != "$default_section" ] && knobs+="BENCH_KEDA_SECTION=$SECTION "
  if [ "$SOURCE" = redis ]; then
    echo "- Command: \`${knobs}scripts/bench-keda.sh\` (part 9 of \`scripts/bench.sh\`)."
  else
    echo "- Command: \`${knobs}scripts/bench-keda.sh\` (not run by \`scripts/bench.sh\`)."
  fi
  echo
  if [ "$SOURCE" = redis ]; then
    echo "| ScaledObjects | scaler | pollingInterval | Redis commands/s | Redis CPU | Redis clients | KEDA operator CPU | KEDA operator RSS | hoist CPU / RSS | push → first 0 → 1 | push → every 0 → 1 | last job → every 1 → 0 |"
  else
    echo "| ScaledObjects | scaler, groups | pollingInterval | broker requests/s | broker CPU | broker connections | KEDA operator CPU | KEDA operator RSS | hoist CPU / RSS | produce → first 0 → 1 | produce → every 0 → 1 | caught up → every 1 → 0 |"
  fi
  echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  printf '%s\n' "${rows[@]}"
  echo
  if [ "$SOURCE" = redis ]; then echo "Redis commands per second, by command:"; else echo "The broker's requests per second, by request type:"; fi
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
