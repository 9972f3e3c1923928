#!/usr/bin/env bash
# The test command: installs what the suite needs on a fresh machine
# (build tools for librdkafka, redis-server and redis-cli, buildah and
# promtool from Debian, kubernetes-validate from PyPI, helm and kubectl,
# and the real Kubernetes control plane with KEDA and a node built from
# their Go modules, and a real Kafka broker's jars from Maven Central, when missing),
# then runs every test. Tests start their own redis-server processes on free
# ports, a real Kafka broker (scripts/kafka.sh, once per test binary that
# needs one) and, for injected faults only, Kafka's mock cluster in-process;
# nothing needs to be running beforehand.
set -euo pipefail
cd "$(dirname "$0")/.."

# procps: `kill`, with which tests/reload.rs sends SIGHUP to a real hoist.
scripts/deps.sh redis-server redis-tools procps
# helm, for tests/helm.rs (renders deploy/helm/hoist), and kubectl (its
# built-in kustomize builds the KEDA sidecar in tests/validate.rs); see
# scripts/layer-tool.sh.
scripts/layer-tool.sh helm
scripts/layer-tool.sh kubectl
# For tests/controlplane.rs and tests/walkthrough.rs: the real control plane (etcd, kube-apiserver,
# kube-controller-manager, KEDA's operator and adapter), built here from
# their Go modules (tools/kubernetes, tools/keda) by scripts/controlplane.sh;
# openssl makes its certificates, curl and python3 check and pick ports.
scripts/deps.sh openssl curl
command -v go >/dev/null 2>&1 || scripts/deps.sh golang-go
scripts/controlplane.sh build
# For tests/node.rs: the control plane with a node (CONTROLPLANE_NODE=1):
# containerd, kubelet, kube-proxy, kube-scheduler, CoreDNS and the KEDA
# HTTP add-on, built by the same `build`, and from Debian runc, the CNI
# plugins, iptables, conntrack and what the node's images are built with
# (scripts/node.sh).
scripts/deps.sh runc containernetworking-plugins iptables conntrack iproute2 util-linux libc6-dev
# For tests/kafka.rs: a real Apache Kafka broker (KRaft), its jars fetched
# by Maven from Maven Central into target/kafka/lib (tools/kafka/pom.xml),
# run by Java 17 (scripts/kafka.sh).
scripts/deps.sh default-jre-headless maven
scripts/kafka.sh build
# For tests/validate.rs: buildah (builds the image, scripts/image.sh) and
# promtool (checks the alert rules) from Debian, kubernetes-validate
# (Kubernetes' schemas) from PyPI, the PrometheusRule schema from npm.
scripts/deps.sh buildah promtool ca-certificates
if ! command -v kubernetes-validate >/dev/null 2>&1; then
  python3 -m pip --version >/dev/null 2>&1 || scripts/deps.sh python3-pip
  pip_install=(python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate==1.37.0)
  "${pip_install[@]}" 2>/dev/null || "${pip_install[@]}" --break-system-packages
fi
# The Prometheus Operator's PrometheusRule schema, from npm (the operator
# publishes no package of its CRDs on the registries reached here).
if [ ! -d target/test-tools/node_modules/@kubernetes-models/prometheus-operator ]; then
  command -v npm >/dev/null 2>&1 || scripts/deps.sh npm
  npm install --silent --no-audit --no-fund --prefix target/test-tools \
    @kubernetes-models/prometheus-operator@6.0.0 >/dev/null
fi
# A short fuzz smoke run of every parser first (no panics on arbitrary
# input), then the suite, whose summary closes the output.
FUZZ_SECONDS="${FUZZ_SECONDS:-5}" scripts/fuzz-smoke.sh
# Benchmarks are built (they must keep compiling) but not run: timing
# belongs to `cargo bench`, never to pass/fail tests.
cargo build --locked --benches
# --no-fail-fast: every test binary runs, so one failure does not hide others.
if [ $# -gt 0 ]; then
  cargo test --locked --no-fail-fast --lib --bins --tests "$@"
  exit
fi
# tests/node.rs spends most of its six minutes waiting for pods, KEDA and
# cooldowns, so it runs beside the other binaries rather than after them:
# its binary is started directly (a second `cargo test` would wait for
# the first one's lock), its output kept and printed at the end, and the
# other binaries skip its one test by name.
cargo test --locked --no-run --lib --bins --tests
node_test="$(cargo test --locked --no-run --test node --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "node" and m.get("executable"):
        print(m["executable"])')"
node_log="target/test-node.log"
"$node_test" --nocapture >"$node_log" 2>&1 &
node_pid=$!
status=0
cargo test --locked --no-fail-fast --lib --bins --tests -- \
  --skip hoist_keda_and_workloads_run_as_pods_on_a_real_node || status=$?
node_status=0
wait "$node_pid" || node_status=$?
echo "--- tests/node.rs (run beside the others; its output, $node_log):"
cat "$node_log"
echo "--- tests/node.rs: exit status $node_status"
[ "$status" -eq 0 ] && [ "$node_status" -eq 0 ]
