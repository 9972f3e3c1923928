#!/usr/bin/env bash
# A real Kubernetes control plane with KEDA, on loopback, for
# tests/controlplane.rs and for trying hoist by hand:
#
#   scripts/controlplane.sh build    # builds every component (see below)
#   scripts/controlplane.sh up       # builds if needed, starts everything,
#                                    # prints the admin kubeconfig's path last
#   scripts/controlplane.sh down     # stops exactly what `up` started
#   scripts/controlplane.sh restart kube-apiserver   # one component again
#   scripts/controlplane.sh versions # "Kubernetes v1.36.5, KEDA v2.21.0"
#   CONTROLPLANE_NODE=1 scripts/controlplane.sh up   # with a node: pods run
#   scripts/controlplane.sh images   # the node's images: builds and imports
#                                    # those missing, prints their names
#   scripts/controlplane.sh addon    # the KEDA HTTP add-on as pods on the
#                                    # node that is up (scripts/node-addon.sh)
#
# What runs: etcd, kube-apiserver (RBAC, ServiceAccount tokens and
# TokenReview, an admin client certificate, the front-proxy CA for the
# aggregated APIs), kube-controller-manager (deployment, replicaset,
# horizontal-pod-autoscaler, garbage-collector, namespace and
# serviceaccount controllers), KEDA's CRDs, KEDA's operator and KEDA's
# metrics adapter (serving external.metrics.k8s.io to the HPA). By default
# there is no kubelet and no scheduler: pods stay Pending, and everything
# listens on loopback only.
#
# The node is opt-in (CONTROLPLANE_NODE=1; needs root): containerd 2 with
# Debian's runc and CNI plugins (a bridge with no uplink), kubelet,
# kube-proxy (iptables), kube-scheduler and CoreDNS, as host processes,
# and the images its pods run (localhost/{pause,redis,hoist,keda-operator,
# keda-adapter}:test) built here with buildah and imported into containerd.
# The API server then listens on the bridge's host address instead of
# loopback. What it touches on the machine and how `down` undoes it:
# scripts/node.sh's header.
#
# Where it comes from: each component is built from its published Go
# module by the wrapper modules in tools/ (go.mod, go.sum and tool lines,
# nothing else): tools/kubernetes (k8s.io/kubernetes and
# go.etcd.io/etcd/server/v3), tools/keda (github.com/kedacore/keda/v2),
# tools/containerd (github.com/containerd/containerd/v2), tools/coredns
# (github.com/coredns/coredns) and tools/http-add-on
# (github.com/kedacore/http-add-on, the KEDA HTTP add-on, for the node).
# Go's own caches (GOCACHE, GOMODCACHE under the home directory) are kept,
# so a second build, also from a fresh clone, only links.
#
# Settings (environment):
#   CONTROLPLANE_DIR     where `up` keeps its PKI, data, logs and pids
#                        (default target/controlplane/run); `down` stops
#                        what was started from there
#   HPA_SYNC_PERIOD      the HPA controller's sync period (default 2s)
#   CONTROLPLANE_PARENT  a pid: `up` leaves a watcher that runs `down`
#                        when that process ends (the test binary's own)
#   KEDA_OPERATOR_ARGS   more arguments for KEDA's operator, e.g.
#                        "--kube-api-qps 100 --kube-api-burst 150"
#   CONTROLPLANE_NODE    1: `up` also starts the node (default 0)
#   HOIST_IMAGE_BINARY   the hoist binary localhost/hoist:test ships, with
#                        the hoist-load beside it (default target/debug/hoist,
#                        built when missing)
#   CONTROLPLANE_VERSIONS  `current` (default): KEDA v2.21.0 on Kubernetes
#                        v1.36.5, from tools/kubernetes and tools/keda;
#                        `previous`: KEDA v2.20.2 on Kubernetes v1.35.4, from
#                        tools/previous/, built into target/controlplane/bin-previous
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
source scripts/services.sh
source scripts/node.sh

case "${CONTROLPLANE_VERSIONS:-current}" in
  current)
    KUBERNETES_VERSION="v1.36.5"
    TOOLS="$ROOT/tools"
    BIN="$ROOT/target/controlplane/bin"
    ;;
  previous)
    KUBERNETES_VERSION="v1.35.4"
    TOOLS="$ROOT/tools/previous"
    BIN="$ROOT/target/controlplane/bin-previous"
    ;;
  *)
    echo "controlplane: CONTROLPLANE_VERSIONS is current or previous, not ${CONTROLPLANE_VERSIONS}" >&2
    exit 2
    ;;
esac
KUBERNETES_MINOR="$(echo "$KUBERNETES_VERSION" | cut -d. -f2)"
DIR="${CONTROLPLANE_DIR:-$ROOT/target/controlplane/run}"
HPA_SYNC_PERIOD="${HPA_SYNC_PERIOD:-2s}"

say() { echo "controlplane: $*" >&2; }
fail() {
  say "$*"
  exit 1
}

# How the binaries are built; change it when a build_* function changes.
BUILD_RECIPE=2
# A wrapper module's requirements, its own Go files (tools/coredns has a
# main) and the recipe: the binaries are built again when they change
# (Go's cache keeps that cheap; the stamp spares even the link when
# nothing did).
stamp_of() {
  {
    cat "$TOOLS/$1/go.mod" "$TOOLS/$1/go.sum"
    find "$TOOLS/$1" -maxdepth 1 -name '*.go' | sort | xargs -r cat
    echo "$BUILD_RECIPE $KUBERNETES_VERSION"
  } | sha256sum | cut -d' ' -f1
}

build_module() {
  local module="$1"
  shift
  local stamp="$BIN/.$module.stamp"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(stamp_of "$module")" ]; then
    return 0
  fi
  command -v go >/dev/null 2>&1 || fail "Go is needed to build the control plane (go 1.26 or later)"
  mkdir -p "$BIN"
  "$@"
  stamp_of "$module" >"$stamp"
}

build_kubernetes() {
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$KUBERNETES_MINOR"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  # One invocation for every k8s.io/kubernetes binary: they share most
  # packages, and one `go build` compiles each of those once.
  say "building Kubernetes $KUBERNETES_VERSION's binaries and etcd ($TOOLS/kubernetes)"
  local commands=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager)
  # The node's binaries, where the wrapper names them (not the previous pair).
  if grep -q 'k8s.io/kubernetes/cmd/kubelet$' "$TOOLS/kubernetes/go.mod"; then
    commands+=(k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
  fi
  go -C "$TOOLS/kubernetes" build -trimpath -ldflags "$ldflags" -o "$BIN/" "${commands[@]}"
  go -C "$TOOLS/kubernetes" build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3
}

build_keda() {
  say "building KEDA's operator and metrics adapter ($TOOLS/keda)"
  go -C "$TOOLS/keda" build -trimpath -ldflags "-s -w" -o "$BIN/keda-operator" github.com/kedacore/keda/v2/cmd/operator
  go -C "$TOOLS/keda" build -trimpath -ldflags "-s -w" -o "$BIN/keda-adapter" github.com/kedacore/keda/v2/cmd/adapter
  # KEDA's CRDs, from the same module.
  local keda_dir
  keda_dir="$(go -C "$TOOLS/keda" list -m -f '{{.Dir}}' github.com/kedacore/keda/v2)"
  rm -rf "$BIN/keda-crds"
  mkdir -p "$BIN/keda-crds"
  cp "$keda_dir"/config/crd/bases/*.yaml "$BIN/keda-crds/"
  chmod -R u+w "$BIN/keda-crds"
}

build_containerd() {
  say "building containerd, its runc shim and ctr ($TOOLS/containerd)"
  go -C "$TOOLS/containerd" build -trimpath -ldflags "-s -w" -o "$BIN/" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr
}

# The KEDA HTTP add-on (tools/http-add-on): its interceptor, external
# scaler and operator, stamped with the version and commit its release
# carries (scripts/node-addon.sh installs them with the module's config/).
# The same -trimpath as KEDA's build: the packages the two wrappers share
# (client-go, controller-runtime, KEDA's APIs) are then compiled once.
build_addon() {
  say "building the KEDA HTTP add-on's interceptor, scaler and operator ($TOOLS/http-add-on)"
  local version
  version="$(go -C "$TOOLS/http-add-on" list -m -f '{{.Version}}' github.com/kedacore/http-add-on)"
  # The tag's commit, as its release images carry it (the module proxy
  # records it; Go's build does not read it back).
  local commit=unknown
  [ "$version" = v0.15.0 ] && commit=4ea8a863bd7c16464dc5afbe9ebc8a26e563fac0
  local ldflags="-s -w -X github.com/kedacore/http-add-on/pkg/build.version=$version"
  ldflags+=" -X github.com/kedacore/http-add-on/pkg/build.gitCommit=$commit"
  local part
  for part in interceptor scaler operator; do
    go -C "$TOOLS/http-add-on" build -trimpath -ldflags "$ldflags" -o "$BIN/keda-http-$part" \
      "github.com/kedacore/http-add-on/$part"
  done
}

build_coredns() {
  say "building CoreDNS ($TOOLS/coredns)"
  # tools/coredns/main.go: CoreDNS with only the plugins the node uses.
  go -C "$TOOLS/coredns" build -trimpath -ldflags "-s -w" -o "$BIN/coredns" .
}

build() {
  build_module kubernetes build_kubernetes
  build_module keda build_keda
  # The node's own modules (the current versions only).
  if [ -d "$TOOLS/containerd" ]; then
    build_module containerd build_containerd
    build_module coredns build_coredns
    build_module http-add-on build_addon
  fi
}

# A free loopback port, held by no one when this returns.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# cert NAME CN O SANS CA [EXTRA_USAGE]: a key and a certificate signed by
# CA (a name under pki/), for both server and client use.
cert() {
  local name="$1" cn="$2" org="$3" sans="$4" ca="$5"
  local pki="$DIR/pki"
  local subject="/CN=$cn"
  [ -n "$org" ] && subject="/O=$org$subject"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -subj "$subject" \
    -out "$pki/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [ -n "$sans" ] && echo "subjectAltName=$sans"
  } >"$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/$ca.crt" -CAkey "$pki/$ca.key" -CAcreateserial \
    -days 2 -sha256 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
}

ca() {
  openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$DIR/pki/$1.key" -subj "/CN=$2" \
    -days 2 -sha256 -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" -out "$DIR/pki/$1.crt" 2>/dev/null
}

pki() {
  mkdir -p "$DIR/pki/keda"
  ca ca "hoist-test-cluster-ca"
  ca front-proxy-ca "hoist-test-front-proxy-ca"
  ca keda-ca "KEDA"
  cert apiserver kube-apiserver "" \
    "IP:127.0.0.1,IP:10.0.0.1,IP:$NODE_HOST_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc" ca
  cert admin admin system:masters "" ca
  cert controller-manager system:kube-controller-manager "" "" ca
  cert front-proxy-client front-proxy-client "" "" front-proxy-ca
  # One certificate for the operator's gRPC metrics service, the adapter's
  # client of it and the adapter's own serving (KEDA's layout: one
  # directory with ca.crt, tls.crt and tls.key).
  cert keda keda-operator "" \
    "DNS:keda-operator.keda.svc,DNS:keda-metrics-apiserver.keda.svc,DNS:localhost,IP:127.0.0.1" keda-ca
  cp "$DIR/pki/keda-ca.crt" "$DIR/pki/keda/ca.crt"
  cp "$DIR/pki/keda.crt" "$DIR/pki/keda/tls.crt"
  cp "$DIR/pki/keda.key" "$DIR/pki/keda/tls.key"
  openssl genrsa -out "$DIR/pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$DIR/pki/sa.key" -pubout -out "$DIR/pki/sa.pub" 2>/dev/null
}

kubeconfig() {
  local file="$1" user="$2"
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: hoist-test
  cluster:
    server: https://$APISERVER_HOST:$APISERVER_PORT
    certificate-authority: $DIR/pki/ca.crt
users:
- name: $user
  user:
    client-certificate: $DIR/pki/$user.crt
    client-key: $DIR/pki/$user.key
contexts:
- name: hoist-test
  context:
    cluster: hoist-test
    user: $user
current-context: hoist-test
EOF
}

# start NAME COMMAND...: in its own session (so `down` stops its whole
# group), its output in logs/NAME.log, its pid in pids/NAME.
start() {
  local name="$1"
  shift
  printf '%q ' "$@" >"$DIR/commands/$name"
  setsid "$@" >>"$DIR/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$DIR/pids/$name"
}

# stop NAME: its whole process group, politely first.
stop() {
  local pid_file="$DIR/pids/$1"
  [ -f "$pid_file" ] || return 0
  stop_group "$(cat "$pid_file")"
  rm -f "$pid_file"
}

# restart NAME: stops one component and starts it again as `up` did (the
# tests restart the API server mid-run); waits until it answers.
restart() {
  local name="${1:?usage: scripts/controlplane.sh restart COMPONENT}"
  [ -f "$DIR/commands/$name" ] || fail "no $name started from $DIR"
  KUBECTL="$(command -v kubectl)"
  stop "$name"
  local command
  command="$(cat "$DIR/commands/$name")"
  eval "start $name $command"
  case "$name" in
    kube-apiserver) wait_for kube-apiserver 90 k get --raw /readyz ;;
    etcd) wait_for etcd 30 curl -sf "$(grep '^ETCD=' "$DIR/ports.env" | cut -d= -f2-)/health" ;;
  esac
  say "restarted $name"
}

running() { [ -f "$DIR/pids/$1" ] && kill -0 "$(cat "$DIR/pids/$1")" 2>/dev/null; }

# wait_for NAME SECONDS CHECK...: until CHECK succeeds, or NAME died, or
# the time is up (then the log's tail says why).
wait_for() {
  local name="$1" seconds="$2"
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if ! running "$name"; then
      tail -n 30 "$DIR/logs/$name.log" >&2 || true
      fail "$name exited (log: $DIR/logs/$name.log)"
    fi
    if [ $SECONDS -ge $deadline ]; then
      tail -n 30 "$DIR/logs/$name.log" >&2 || true
      fail "$name not ready after ${seconds}s (log: $DIR/logs/$name.log)"
    fi
    sleep 0.2
  done
}

k() { "$KUBECTL" --kubeconfig "$DIR/admin.kubeconfig" "$@"; }

# k_retry ARGS...: kubectl, again for up to a minute while it fails (a
# loaded machine's API server can time out a first write).
k_retry() {
  local deadline=$((SECONDS + 60))
  until k "$@"; do
    [ $SECONDS -lt $deadline ] || fail "kubectl $* kept failing"
    sleep 1
  done
}

up() {
  build
  if [ -d "$DIR/pids" ]; then
    for pid_file in "$DIR"/pids/*; do
      [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null &&
        fail "already up from $DIR (scripts/controlplane.sh down first)"
    done
  fi
  KUBECTL="$(command -v kubectl || true)"
  [ -n "$KUBECTL" ] || fail "kubectl is needed (scripts/layer-tool.sh kubectl)"
  if node_enabled; then
    node_deps
    node_preflight
  fi
  # A node left from an earlier run: its mounts must go before its files.
  node_down
  rm -rf "$DIR"
  mkdir -p "$DIR/logs" "$DIR/pids" "$DIR/commands" "$DIR/etcd" "$DIR/keda-ca-dirs"
  # A failed `up` leaves nothing running.
  trap 'status=$?; [ $status -eq 0 ] || { say "up failed: stopping what it started"; down; }' EXIT
  pki
  # Without the node, everything listens on loopback. With it, the API
  # server listens on and advertises the host's address on the pod bridge,
  # where pods (and the `kubernetes` Service's endpoint) reach it.
  APISERVER_HOST=127.0.0.1
  local apiserver_args=(--endpoint-reconciler-type none) authorization_mode=RBAC
  local controllers="deployment-controller,replicaset-controller,horizontal-pod-autoscaler-controller,garbage-collector-controller,namespace-controller,serviceaccount-controller"
  if node_enabled; then
    node_pki
    node_network_up
    node_apiserver_args
    APISERVER_HOST="$NODE_HOST_IP"
    apiserver_args=("${NODE_APISERVER_ARGS[@]}")
    # kubelet's own requests: the Node authorizer, before RBAC.
    authorization_mode=Node,RBAC
    # Services' EndpointSlices, the kube-root-ca.crt ConfigMap every pod's
    # ServiceAccount token volume mounts, and the node lifecycle (it lifts
    # the not-ready taint kubelet registers the node with).
    controllers+=",endpointslice-controller,root-ca-certificate-publisher-controller,node-lifecycle-controller"
  fi

  local etcd_port etcd_peer_port
  etcd_port="$(free_port)"
  etcd_peer_port="$(free_port)"
  APISERVER_PORT="$(free_port)"
  local adapter_port adapter_metrics_port operator_grpc_port operator_metrics_port operator_probe_port
  adapter_port="$(free_port)"
  adapter_metrics_port="$(free_port)"
  operator_grpc_port="$(free_port)"
  operator_metrics_port="$(free_port)"
  operator_probe_port="$(free_port)"
  cat >"$DIR/ports.env" <<EOF
ETCD=http://127.0.0.1:$etcd_port
APISERVER=https://$APISERVER_HOST:$APISERVER_PORT
EOF

  start etcd "$BIN/etcd" --name controlplane --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster "controlplane=http://127.0.0.1:$etcd_peer_port" \
    --listen-metrics-urls "" --log-level warn
  wait_for etcd 30 curl -sf "http://127.0.0.1:$etcd_port/health"

  # Every request of a ServiceAccount outside kube-system (hoist's among
  # them) is written to logs/audit.log with its verb, resource and answer:
  # tests/controlplane.rs reads from it what hoist asked for and whether
  # RBAC allowed it. So is every write to a Deployment's replicas by anyone
  # but the controllers (KEDA's scale from and to zero), and every read of
  # one's scale and every ScaledObject status write by the admin user KEDA
  # runs as here (the read KEDA makes before each such write, the status
  # write after): when KEDA acted and what it waited on, for
  # scripts/bench-keda.sh.
  cat >"$DIR/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  userGroups: ["system:serviceaccounts:kube-system"]
- level: Metadata
  userGroups: ["system:serviceaccounts"]
- level: Metadata
  verbs: ["update", "patch"]
  resources:
  - group: apps
    resources: ["deployments", "deployments/scale"]
- level: Metadata
  users: ["admin"]
  verbs: ["get"]
  resources:
  - group: apps
    resources: ["deployments/scale"]
- level: Metadata
  users: ["admin"]
  verbs: ["update", "patch"]
  resources:
  - group: keda.sh
    resources: ["scaledobjects/status"]
- level: None
EOF
  kubeconfig "$DIR/admin.kubeconfig" admin
  kubeconfig "$DIR/controller-manager.kubeconfig" controller-manager
  start kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address "$APISERVER_HOST" --advertise-address "$APISERVER_HOST" --secure-port "$APISERVER_PORT" \
    "${apiserver_args[@]}" \
    --service-cluster-ip-range 10.0.0.0/24 \
    --authorization-mode "$authorization_mode" \
    --client-ca-file "$DIR/pki/ca.crt" \
    --tls-cert-file "$DIR/pki/apiserver.crt" --tls-private-key-file "$DIR/pki/apiserver.key" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$DIR/pki/sa.pub" \
    --service-account-signing-key-file "$DIR/pki/sa.key" \
    --requestheader-client-ca-file "$DIR/pki/front-proxy-ca.crt" \
    --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User \
    --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$DIR/pki/front-proxy-client.crt" \
    --proxy-client-key-file "$DIR/pki/front-proxy-client.key" \
    --audit-policy-file "$DIR/audit-policy.yaml" \
    --audit-log-path "$DIR/logs/audit.log" --audit-log-format json --audit-log-mode blocking \
    --enable-priority-and-fairness=false \
    --profiling=false
  wait_for kube-apiserver 90 k get --raw /readyz

  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$DIR/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 \
    --leader-elect=false \
    --use-service-account-credentials=true \
    --root-ca-file "$DIR/pki/ca.crt" \
    --controllers "$controllers" \
    --horizontal-pod-autoscaler-sync-period "$HPA_SYNC_PERIOD" \
    --concurrent-horizontal-pod-autoscaler-syncs 5

  if node_enabled; then
    # KEDA runs as pods, installed from its own manifests once the node is
    # up (scripts/node-keda.sh).
    node_up
    node_keda_up
  else
    keda_host_up "$adapter_port" "$adapter_metrics_port" "$operator_grpc_port" "$operator_metrics_port" "$operator_probe_port"
  fi

  if [ -n "${CONTROLPLANE_PARENT:-}" ]; then
    watch_parent "$CONTROLPLANE_PARENT" "$ROOT/scripts/controlplane.sh" CONTROLPLANE_DIR "$DIR"
  fi
  say "up: logs in $DIR/logs; stop with scripts/controlplane.sh down"
  echo "$DIR/admin.kubeconfig"
}

# keda_host_up ADAPTER_PORT ADAPTER_METRICS_PORT OPERATOR_GRPC_PORT
# OPERATOR_METRICS_PORT OPERATOR_PROBE_PORT: KEDA's operator and adapter
# as host processes on loopback (the control plane without a node).
keda_host_up() {
  local adapter_port="$1" adapter_metrics_port="$2" operator_grpc_port="$3" operator_metrics_port="$4" operator_probe_port="$5"
  cat >>"$DIR/ports.env" <<EOF
KEDA_ADAPTER=https://127.0.0.1:$adapter_port
KEDA_OPERATOR_METRICS=http://127.0.0.1:$operator_metrics_port
EOF
  # KEDA: its namespace, its CRDs, and the aggregated external metrics
  # API. Endpoints refuse loopback addresses, so the APIService reaches the
  # adapter through an ExternalName Service (localhost); the adapter's
  # certificate carries the Service's DNS name, which the aggregator checks.
  local ca_bundle
  ca_bundle="$(base64 -w0 <"$DIR/pki/keda-ca.crt")"
  cat >"$DIR/keda-api.yaml" <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: keda
---
apiVersion: v1
kind: Service
metadata:
  name: keda-metrics-apiserver
  namespace: keda
spec:
  type: ExternalName
  externalName: localhost
  ports:
  - name: https
    port: $adapter_port
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1beta1.external.metrics.k8s.io
spec:
  group: external.metrics.k8s.io
  version: v1beta1
  groupPriorityMinimum: 100
  versionPriority: 100
  caBundle: $ca_bundle
  service:
    name: keda-metrics-apiserver
    namespace: keda
    port: $adapter_port
EOF
  k_retry apply --server-side -f "$BIN/keda-crds" >/dev/null
  k_retry apply -f "$DIR/keda-api.yaml" >/dev/null
  k_retry wait --for condition=established --timeout 60s crd/scaledobjects.keda.sh >/dev/null

  start keda-operator env KUBECONFIG="$DIR/admin.kubeconfig" WATCH_NAMESPACE="" \
    POD_NAMESPACE=keda KEDA_CLUSTER_OBJECT_NAMESPACE=keda \
    "$BIN/keda-operator" --leader-elect=false \
    --cert-dir "$DIR/pki/keda" --ca-dir "$DIR/keda-ca-dirs" \
    --metrics-bind-address "127.0.0.1:$operator_metrics_port" \
    --health-probe-bind-address "127.0.0.1:$operator_probe_port" \
    --metrics-service-bind-address "127.0.0.1:$operator_grpc_port" \
    --zap-log-level info --zap-encoder console ${KEDA_OPERATOR_ARGS:-}
  wait_for keda-operator 60 curl -sf "http://127.0.0.1:$operator_probe_port/readyz"

  start keda-adapter env KUBECONFIG="$DIR/admin.kubeconfig" POD_NAMESPACE=keda \
    KEDA_CLUSTER_OBJECT_NAMESPACE=keda WATCH_NAMESPACE="" \
    "$BIN/keda-adapter" \
    --secure-port "$adapter_port" --bind-address 127.0.0.1 \
    --cert-dir "$DIR/pki/keda" \
    --tls-cert-file "$DIR/pki/keda/tls.crt" --tls-private-key-file "$DIR/pki/keda/tls.key" \
    --lister-kubeconfig "$DIR/admin.kubeconfig" \
    --authentication-kubeconfig "$DIR/admin.kubeconfig" \
    --authorization-kubeconfig "$DIR/admin.kubeconfig" \
    --port "$adapter_metrics_port" \
    --metrics-service-address "127.0.0.1:$operator_grpc_port" \
    --metrics-service-grpc-authority keda-operator.keda.svc \
    --zap-log-level info --zap-encoder console
  wait_for keda-adapter 90 k get --raw /apis/external.metrics.k8s.io/v1beta1
}

down() {
  # The node first: its containers, mounts, cgroups, iptables chains and
  # interfaces (scripts/node.sh).
  node_down
  [ -d "$DIR/pids" ] || return 0
  # Newest first: KEDA before the API server, the API server before etcd.
  for name in keda-adapter keda-operator kube-controller-manager kube-apiserver etcd; do
    stop "$name"
  done
}

# images: builds the node's images that are missing, imports into the
# node's containerd those it lacks, and prints their names.
images() {
  running containerd || fail "no node up from $DIR (CONTROLPLANE_NODE=1 scripts/controlplane.sh up)"
  node_images_import
  node_addon_images_import
  printf '%s\n' "${NODE_IMAGES[@]}" "${NODE_ADDON_IMAGES[@]}"
}

# addon: the KEDA HTTP add-on installed on the node that is up, from its
# own manifests (scripts/node-addon.sh).
addon() {
  running containerd || fail "no node up from $DIR (CONTROLPLANE_NODE=1 scripts/controlplane.sh up)"
  KUBECTL="$(command -v kubectl)"
  node_addon_up
}

versions() {
  echo "Kubernetes $KUBERNETES_VERSION, KEDA $(awk '/kedacore\/keda\/v2 v/ {print $2; exit}' "$TOOLS/keda/go.mod")"
}

case "${1:-}" in
  build) build ;;
  versions) versions ;;
  up) up ;;
  down) down ;;
  restart) restart "${2:-}" ;;
  images) images ;;
  addon) addon ;;
  *)
    echo "usage: scripts/controlplane.sh build|up|down|versions|images|addon|restart COMPONENT" >&2
    exit 2
    ;;
esac
