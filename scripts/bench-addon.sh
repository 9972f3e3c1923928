#!/usr/bin/env bash
# hoist's interceptor beside the KEDA HTTP add-on v0.15.0, in one run, on
# one real node (scripts/controlplane.sh with CONTROLPLANE_NODE=1; needs
# root), the same app behind both: both proxies as pods installed as their
# users install them (hoist by its chart, the add-on from its own
# manifests), KEDA as pods. Part 10 of scripts/bench.sh; runs alone too:
#
#   scripts/bench-addon.sh
#
# What it measures (tables between the bench-addon markers of
# docs/BENCHMARKS.md, with the goals of issue 39 marked met or not):
#   - warm path: wrk at 1 and 64 keep-alive connections to the app's pod
#     directly, through hoist's HTTP route, the add-on's interceptor, nginx
#     (placed as a pod is, below) and hoist's TCP route: requests/s, p50/p99, the
#     proxy's CPU per request, RSS. hoist (the chart's directToPods) and
#     nginx send to the app's pod, the add-on v0.15.0 (which cannot) to
#     its Service's ClusterIP; wrk reaches each proxy's pod directly.
#   - the same at one fixed rate (hoist-load pace, an open loop): the
#     proxy's CPU per request when every proxy does the same work a second.
#   - cold start: an app at zero woken by one request, its pod Ready 0, 2
#     and 10 s after it starts, BENCH_ADDON_COLD_SAMPLES wake-ups each
#     (scripts/bench-addon.py cold): request → answer and answer − Ready.
#   - 1,000 routes: the processes' memory with them, and one more route's
#     update latency (API write → the proxy answers it).
#   - scale-down: last request → replicas 0, same settings for both.
#
# CPUs: the proxies (hoist's pod, the add-on's interceptor, nginx) on the
# last CPU, everything else of the cluster and wrk on CPU 0, with
# taskset. hoist's pod gets the CPU limit the add-on's interceptor has
# (1 CPU), so both runtimes size themselves to one core (tokio's workers,
# Go's GOMAXPROCS).
#
# Knobs (environment):
#   BENCH_SECONDS=5                 length of each wrk point
#   BENCH_REPEAT=3                  runs per warm point, interleaved; the median is shown
#   BENCH_ADDON_COLD_SAMPLES=10     wake-ups per proxy and readiness delay
#   BENCH_ADDON_ROUTES=1000         routes in the memory and update rows
#   BENCH_ADDON_RATE=4000           requests/s of the fixed-rate points (well below what the add-on answers at most)
#   BENCH_DOC=docs/BENCHMARKS.md    where the tables go ("-": standard output)
#   BENCH_KEEP=1                    keep the work directory and leave the node up
#   BENCH_ADDON_PROFILES=DIR        also `perf record -g` each proxy's extra point into DIR/VIA.data
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

SECONDS_PER_POINT="${BENCH_SECONDS:-5}"
REPEAT="${BENCH_REPEAT:-3}"
COLD_SAMPLES="${BENCH_ADDON_COLD_SAMPLES:-10}"
ROUTES="${BENCH_ADDON_ROUTES:-1000}"
PACE_RATE="${BENCH_ADDON_RATE:-4000}"
DOC="${BENCH_DOC:-docs/BENCHMARKS.md}"
started_at=$(date +%s)
say() { echo "== $*" >&2; }

packages=()
command -v wrk >/dev/null 2>&1 || packages+=(wrk)
command -v nginx >/dev/null 2>&1 || packages+=(nginx)
command -v perf >/dev/null 2>&1 || packages+=(linux-perf)
[ ${#packages[@]} -eq 0 ] || scripts/deps.sh "${packages[@]}"
scripts/layer-tool.sh helm
scripts/layer-tool.sh kubectl

say "building hoist and hoist-load (release): the image's binaries"
cargo build --locked --release --bin hoist --bin hoist-load
export HOIST_IMAGE_BINARY="$ROOT/target/release/hoist"
export CONTROLPLANE_NODE=1 CONTROLPLANE_DIR="$ROOT/target/controlplane/bench-addon"
# The HPA controller at its Kubernetes default, as in scripts/bench-keda.sh.
export HPA_SYNC_PERIOD=15s

work="$(mktemp -d /tmp/hoist-bench-addon.XXXXXX)"
results="$work/results.jsonl"
: >"$results"
nginx_pid=""
cleanup() {
  [ -n "$nginx_pid" ] && kill "$nginx_pid" 2>/dev/null || true
  declare -F nginx_netns_down >/dev/null && nginx_netns_down
  if [ "${BENCH_KEEP:-0}" = 1 ]; then
    echo "work directory kept: $work; the node is still up (scripts/controlplane.sh down with CONTROLPLANE_DIR=$CONTROLPLANE_DIR)" >&2
  else
    scripts/controlplane.sh down || true
    rm -rf "$work"
  fi
}
trap cleanup EXIT

source scripts/proc.sh
source scripts/proxy-bench.sh
WRK_BENCH=addon-warm
cpus=$(nproc)
PROXY_CPU=$((cpus - 1))
CLIENT=(taskset -c 0)

say "the node, KEDA and the add-on (scripts/controlplane.sh up, addon)"
kubeconfig="$(scripts/controlplane.sh up | tail -1)"
scripts/controlplane.sh addon
k() { kubectl --kubeconfig "$kubeconfig" "$@"; }
k create namespace bench >/dev/null

say "hoist by its chart, the interceptor in process"
cat >"$work/hoist-values.yaml" <<EOF
image: {repository: localhost/hoist, tag: test, pullPolicy: Never}
resources:
  requests: {cpu: 100m, memory: 64Mi}
  limits: {cpu: "1", memory: 1Gi}
interceptor:
  mode: inProcess
  httpRoutes:
    - {name: web, host: web.bench, upstream: "web.bench.svc.cluster.local:8080"}
  tcpRoutes:
    - {name: raw, listen: "0.0.0.0:9100", upstream: "web.bench.svc.cluster.local:8080"}
config:
  interceptor:
    allowed_hosts:
      bench: ["*.bench"]
    max_routes_per_namespace: 200
EOF
helm --kubeconfig "$kubeconfig" install hoist deploy/helm/hoist -n keda --values "$work/hoist-values.yaml" >/dev/null
k rollout status -n keda deployment/hoist --timeout=180s >/dev/null

say "the app: hoist-load upstream, one replica, its Service; the add-on's route to it"
PYTHONDONTWRITEBYTECODE=1 python3 - "$work/web.json" <<'EOF'
import json, sys
sys.path.insert(0, "scripts")
bench = __import__("bench-addon")
json.dump({"apiVersion": "v1", "kind": "List", "items": [
    bench.app("web", replicas=1), bench.service("web"),
    *bench.addon_route("web", target="web", route_only=True)]}, open(sys.argv[1], "w"))
EOF
k apply -f "$work/web.json" >/dev/null
k rollout status -n bench deployment/web --timeout=180s >/dev/null

# The one pod of a Deployment (after a rollout, once the old one is gone).
one_pod() {
  local tries=0
  until [ "$(k get pods -n "$1" -l "$2" -o name | wc -l)" = 1 ]; do
    tries=$((tries + 1))
    [ "$tries" -lt 600 ] || { echo "more than one pod for $1/$2 after 5 min" >&2; return 1; }
    sleep 0.5
  done
}
pod_ip() { one_pod "$1" "$2" && k get pods -n "$1" -l "$2" -o jsonpath='{.items[0].status.podIP}'; }
# The host pid of a pod's process: the one whose command is $2, in the
# pod's cgroup.
pod_pid() {
  local uid pid
  one_pod "$1" "$3"
  uid="$(k get pods -n "$1" -l "$3" -o jsonpath='{.items[0].metadata.uid}')"
  for pid in $(pgrep -x "$2"); do
    grep -q "$uid" "/proc/$pid/cgroup" 2>/dev/null && { echo "$pid"; return 0; }
  done
  echo "no process $2 in the pod of $1/$3" >&2
  return 1
}
web_ip="$(pod_ip bench app=web)"
web_service="$(k get service -n bench web -o jsonpath='{.spec.clusterIP}'):8080"
hoist_ip="$(pod_ip keda app.kubernetes.io/name=hoist,app.kubernetes.io/component=scaler)"
addon_ip="$(pod_ip keda app.kubernetes.io/instance=interceptor)"
hoist_pid="$(pod_pid keda hoist app.kubernetes.io/name=hoist,app.kubernetes.io/component=scaler)"
addon_pid="$(pod_pid keda interceptor app.kubernetes.io/instance=interceptor)"
addon_scaler_pid="$(pod_pid keda scaler app.kubernetes.io/instance=external-scaler)"
addon_operator_pid="$(pod_pid keda operator app.kubernetes.io/instance=operator)"
echo "   app $web_ip (Service $web_service), hoist $hoist_ip (pid $hoist_pid), the add-on's interceptor $addon_ip (pid $addon_pid)" >&2

memory() { # COLUMN: one JSON line per process with this column's RSS
  local column="$1"
  {
    echo "hoist (scaler and interceptor in one process)|$hoist_pid"
    echo "the add-on's interceptor|$addon_pid"
    echo "the add-on's scaler|$addon_scaler_pid"
    echo "the add-on's operator|$addon_operator_pid"
  } | while IFS='|' read -r name pid; do
    echo "{\"bench\":\"addon-memory-point\",\"process\":\"$name\",\"column\":\"$column\",\"rss_mib\":$(rss_mib "$pid" 2>/dev/null || echo null)}"
  done >>"$results"
}
sleep 10
memory idle

# nginx is no pod (no image of it is built here), but it sits where one
# would: in a network namespace of its own (unshare's, held by a process,
# so nothing is mounted and it goes when they end), on a veth in the
# node's bridge (scripts/node.sh's hoist0) with an address of the pod
# range the node's IPAM does not reach in this run (.250), so its clients
# and its upstream cross the same bridge, conntrack and kube-proxy rules
# as the pods'.
say "nginx in a network namespace on the node's bridge, to the app's pod"
netns_holder=""
nginx_netns_down() {
  [ -n "$netns_holder" ] && kill "$netns_holder" 2>/dev/null || true
  ip link del hbn-host 2>/dev/null || true
}
nginx_netns_down
stream_module="$(nginx_stream_module)"
bridge_ip="$(ip -4 -o addr show hoist0 | awk '{print $4}' | cut -d/ -f1)"
nginx_ip="${bridge_ip%.*}.250"
unshare --net sleep infinity &
netns_holder=$!
sleep 0.2
in_netns() { nsenter -t "$netns_holder" -n "$@"; }
ip link add hbn-host type veth peer name hbn-pod
ip link set hbn-pod netns "$netns_holder"
ip link set hbn-host master hoist0 up
in_netns ip addr add "$nginx_ip/24" dev hbn-pod
in_netns ip link set hbn-pod up
in_netns ip link set lo up
in_netns ip route add default via "$bridge_ip"
# To the app's pod, as hoist (the chart's interceptor.directToPods) dials
# it: the same path for the two whose CPU is compared.
nginx_config "$work/nginx" "$stream_module" "$nginx_ip:8080" "$nginx_ip:9100" "$web_ip:8080"
# Not through in_netns: a function in the background is a subshell, and
# $! would be its pid rather than nginx's (nsenter and taskset exec).
nsenter -t "$netns_holder" -n taskset -c "$PROXY_CPU" nginx -c "$work/nginx/nginx.conf" -p "$work/nginx" \
  >"$work/nginx/out.log" 2>&1 &
nginx_pid=$!

# Everything of the cluster on CPU 0 (the control plane's process groups,
# containerd's shims, every pod's processes), then the proxies on the
# last CPU.
pin_cluster() {
  local pid group
  for group in "$CONTROLPLANE_DIR"/pids/*; do
    for pid in $(pgrep -s "$(cat "$group")" 2>/dev/null); do taskset -a -p -c 0 "$pid" >/dev/null 2>&1 || true; done
  done
  for pid in $(pgrep -f containerd-shim) $(grep -l kubepods /proc/[0-9]*/cgroup 2>/dev/null | cut -d/ -f3); do
    taskset -a -p -c 0 "$pid" >/dev/null 2>&1 || true
  done
  for pid in "$hoist_pid" "$addon_pid" "$nginx_pid"; do
    taskset -a -p -c "$PROXY_CPU" "$pid" >/dev/null
  done
}
pin_cluster
sleep 1

say "warm path: wrk, ${SECONDS_PER_POINT} s points, $REPEAT runs each"
for address in "$hoist_ip:8080" "$addon_ip:8080" "$nginx_ip:8080" "$hoist_ip:9100"; do
  "${CLIENT[@]}" wrk -t1 -c64 -d1s -H 'Host: web.bench' "http://$address/" >/dev/null
done
for connections in 1 64; do
  for rep in $(seq "$REPEAT"); do
    wrk_point http direct "$connections" "$web_ip:8080" >>"$results"
    wrk_point http hoist "$connections" "$hoist_ip:8080" "$hoist_pid" >>"$results"
    wrk_point http addon "$connections" "$addon_ip:8080" "$addon_pid" >>"$results"
    wrk_point http nginx "$connections" "$nginx_ip:8080" "$nginx_pid" >>"$results"
    wrk_point tcp hoist-tcp "$connections" "$hoist_ip:9100" "$hoist_pid" >>"$results"
  done
done
memory warm

# The same work per second for every proxy: wrk's closed loop lets each
# set its own rate, and one that answers faster than wrk asks idles
# between requests, which its CPU per request then counts too.
say "fixed rate: hoist-load pace, $PACE_RATE requests/s, $REPEAT runs each"
pace_point() { # VIA ADDRESS PID (with its children: nginx's worker)
  local pid pids=() args=()
  pids=($(with_children "$3"))
  for pid in "${pids[@]}"; do args+=(--pid "$pid"); done
  "${CLIENT[@]}" "$ROOT/target/release/hoist-load" --threads 1 pace --target "$2" --rate "$PACE_RATE" \
    --seconds "$SECONDS_PER_POINT" --label "$1" "${args[@]}" 2>&1 >>"$results" | sed 's/^ */   /' >&2 ||
    echo "   pace point for $1 failed" >&2
}
for rep in $(seq "$REPEAT"); do
  pace_point hoist "$hoist_ip:8080" "$hoist_pid"
  pace_point addon "$addon_ip:8080" "$addon_pid"
  pace_point nginx "$nginx_ip:8080" "$nginx_pid"
  pace_point hoist-tcp "$hoist_ip:9100" "$hoist_pid"
done

# Where each proxy's CPU goes: one more 64-connection point each, with
# perf counting the process's system calls and context switches, and its
# user and system time apart.
perf_point() { # VIA ADDRESS PID (with its children: nginx's worker)
  local via="$1" address="$2" out before after pids
  pids=($(with_children "$3"))
  local pid
  pid="$(IFS=,; echo "${pids[*]}")"
  wrk_report_script
  before="$(user_system "${pids[@]}")"
  # Every call, and apart the ones that move bytes (both proxies make at
  # least four a request: read the request, write it on, read the answer,
  # write it back) and the ones that wait for sockets.
  local calls=raw_syscalls:sys_enter,context-switches name
  for name in recvfrom sendto read write readv writev recvmsg sendmsg epoll_wait epoll_pwait futex; do
    calls+=",syscalls:sys_enter_$name"
  done
  perf stat -x, -e "$calls" -p "$pid" -o "$work/perf-$via.csv" \
    -- sleep "$((SECONDS_PER_POINT + 1))" 2>/dev/null &
  local perf_pid=$!
  if [ -n "${BENCH_ADDON_PROFILES:-}" ]; then
    mkdir -p "$BENCH_ADDON_PROFILES"
    perf record -q -F 999 -g -p "$pid" -o "$BENCH_ADDON_PROFILES/$via.data" \
      -- sleep "$((SECONDS_PER_POINT + 1))" 2>/dev/null &
    perf_pid="$perf_pid $!"
  fi
  sleep 0.5
  out=$("${CLIENT[@]}" wrk -t1 -c64 -d"${SECONDS_PER_POINT}s" -H 'Host: web.bench' \
    -s "$work/report.lua" "http://$address/" | grep '^BENCHJSON' | sed 's/^BENCHJSON //') || true
  wait $perf_pid || true
  after="$(user_system "${pids[@]}")"
  # A point that fails is left out, not the run.
  python3 - "$via" "$out" "$work/perf-$via.csv" "$before" "$after" "$(getconf CLK_TCK)" \
    >>"$results" <<'PY' || echo "   perf point for $via failed" >&2
import json, sys
via, out, csv, before, after, hz = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
if not out:
    sys.exit(0)
requests = json.loads("{" + out + "}")["requests"]
counts = {}
for line in open(csv):
    fields = line.strip().split(",")
    if len(fields) > 2 and fields[0].replace(".", "").isdigit():
        counts[fields[2]] = float(fields[0])
(u0, s0), (u1, s1) = ([int(x) for x in t.split()] for t in (before, after))
def per_request(*names):
    return sum(counts.get("syscalls:sys_enter_" + name, 0) for name in names) / requests
print(json.dumps({"bench": "addon-perf", "via": via, "requests": requests,
                  "syscalls_per_request": counts.get("raw_syscalls:sys_enter", 0) / requests,
                  "data_calls_per_request": per_request("recvfrom", "sendto", "read", "write", "readv",
                                                        "writev", "recvmsg", "sendmsg"),
                  "wait_calls_per_request": per_request("epoll_wait", "epoll_pwait"),
                  "futex_per_request": per_request("futex"),
                  "switches_per_request": counts.get("context-switches", 0) / requests,
                  "user_us_per_request": (u1 - u0) * 1e6 / hz / requests,
                  "system_us_per_request": (s1 - s0) * 1e6 / hz / requests}))
PY
}
if command -v perf >/dev/null 2>&1; then
  say "where the CPU goes: perf's counts at 64 connections"
  perf_point hoist "$hoist_ip:8080" "$hoist_pid"
  perf_point nginx "$nginx_ip:8080" "$nginx_pid"
  perf_point hoist-tcp "$hoist_ip:9100" "$hoist_pid"
  perf_point addon "$addon_ip:8080" "$addon_pid"
fi
kill "$nginx_pid" 2>/dev/null || true
wait "$nginx_pid" 2>/dev/null || true
nginx_pid=""
nginx_netns_down

bench_py() { taskset -c 0 python3 scripts/bench-addon.py "$@" --kubeconfig "$kubeconfig"; }
say "cold start: $COLD_SAMPLES wake-ups per proxy at readiness delays 0, 2 and 10 s"
bench_py cold --hoist "$hoist_ip:8080" --addon "$addon_ip:8080" --samples "$COLD_SAMPLES" >>"$results"

say "scale-down: one request a second for 60 s, then last answer → 0"
bench_py scale-down --hoist "$hoist_ip:8080" --addon "$addon_ip:8080" >>"$results"

say "$ROUTES routes"
bench_py routes --addon "$addon_ip:8080" --count "$ROUTES" >>"$results"
# hoist's: config routes (the chart's httpRoutes), which a new pod reads
# at start; declared routes would need as many ScaledObjects, each one
# Deployment and KEDA's HPA.
python3 - "$work/hoist-routes.yaml" "$ROUTES" <<'EOF'
import sys
path, count = sys.argv[1], int(sys.argv[2])
with open(path, "w") as out:
    out.write("interceptor:\n  httpRoutes:\n")
    out.write('    - {name: web, host: web.bench, upstream: "web.bench.svc.cluster.local:8080"}\n')
    for i in range(count):
        out.write(f'    - {{name: rt-{i}, host: rt-{i}.bench, upstream: "web.bench.svc.cluster.local:8080"}}\n')
EOF
began=$(date +%s.%N)
helm --kubeconfig "$kubeconfig" upgrade hoist deploy/helm/hoist -n keda --reuse-values \
  --values "$work/hoist-routes.yaml" >/dev/null
k rollout status -n keda deployment/hoist --timeout=300s >/dev/null
hoist_ip="$(pod_ip keda app.kubernetes.io/name=hoist,app.kubernetes.io/component=scaler)"
until [ "$(curl -s -o /dev/null -w '%{http_code}' -H "Host: rt-$((ROUTES - 1)).bench" "http://$hoist_ip:8080/")" = 200 ]; do sleep 0.1; done
routed=$(date +%s.%N)
hoist_pid="$(pod_pid keda hoist app.kubernetes.io/name=hoist,app.kubernetes.io/component=scaler)"
echo "{\"bench\":\"addon-routes\",\"via\":\"hoist\",\"routes\":$ROUTES,\"how\":\"$ROUTES config routes (the chart's httpRoutes): helm upgrade → the new pod answers the last in $(awk -v a="$began" -v b="$routed" 'BEGIN {printf "%.0f", b - a}') s\"}" >>"$results"
sleep 10
addon_pid="$(pod_pid keda interceptor app.kubernetes.io/instance=interceptor)"
memory routes
say "route updates with the $ROUTES in place"
bench_py update --hoist "$hoist_ip:8080" --addon "$addon_ip:8080" >>"$results"

finished_at=$(date +%s)
wrk_version="$(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2 || true)" # wrk -v exits 1
addon_version="$(go -C tools/http-add-on list -m -f '{{.Version}}' github.com/kedacore/http-add-on)"
summary="- When: $(date -u -d "@$started_at" '+%Y-%m-%d %H:%M UTC'), $(( (finished_at - started_at) / 60 )) min, $cpus CPUs, hoist at $(git rev-parse --short HEAD) (release build, its image); $(scripts/controlplane.sh versions); the KEDA HTTP add-on $addon_version (its config/default, images built here); $(nginx -v 2>&1 | sed 's/.*: //'); $wrk_version.
- One node; the proxies (hoist's pod, with a 1-CPU limit as the add-on's interceptor has; the add-on's interceptor; nginx, \`worker_processes 1\`, in a network namespace on the node's bridge as a pod would be) on CPU $PROXY_CPU, the rest of the cluster, wrk and the requests' sender on CPU 0. The app is \`hoist-load upstream\` (one thread) in a pod; hoist (the chart's \`interceptor.directToPods\`) and nginx forward to its pod's address, the add-on v0.15.0 (which cannot) to its Service's ClusterIP; wrk reaches each proxy at its pod address. The HPA controller syncs every 15 s; kube-proxy (iptables) at its defaults.
- Command: \`scripts/bench-addon.sh\` (part 10 of \`scripts/bench.sh\`)."
python3 - "$results" "$summary" <<'EOF'
import json, sys
path, summary = sys.argv[1], sys.argv[2]
lines = [json.loads(l) for l in open(path) if l.startswith("{")]
by_process = {}
for l in lines:
    if l.get("bench") == "addon-memory-point":
        by_process.setdefault(l["process"], {"bench": "addon-memory", "process": l["process"]})[l["column"]] = l["rss_mib"]
with open(path, "a") as out:
    for record in by_process.values():
        out.write(json.dumps(record) + "\n")
    out.write(json.dumps({"bench": "addon-meta", "summary": summary}) + "\n")
EOF
python3 scripts/bench-addon.py report --results "$results" --doc "$DOC"
