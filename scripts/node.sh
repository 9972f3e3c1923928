# The node of scripts/controlplane.sh (sourced by it, not run): containerd
# with Debian's runc and CNI plugins, kubelet, kube-proxy (iptables mode),
# kube-scheduler and CoreDNS as host processes, and the images its pods
# run. `up` starts it when CONTROLPLANE_NODE=1; `down` undoes everything
# it did, also after a failed `up`.
#
# What it touches outside CONTROLPLANE_DIR, all of it undone by node_down:
#   - the bridge NODE_BRIDGE (10.244.0.1/24, no uplink) and the pods' veths;
#   - iptables and ip6tables: kube-proxy's and kubelet's KUBE-* chains,
#     and two rules in mangle's FORWARD (comment "hoist-node") that drop
#     anything between the bridge and any other interface: pods reach only
#     each other, the host and Services;
#   - net.ipv4.ip_forward (pod → Service → pod is routed by the host),
#     restored to what it was;
#   - cgroups `kubepods` in every v1 hierarchy (kubelet's cgroupfs driver);
#   - mounts under CONTROLPLANE_DIR (kubelet's root, pod volumes, container
#     root filesystems, sandbox netns and shm);
#   - the paths kubelet and containerd hardcode (see NODE_OUTSIDE_PATHS),
#     removed by `down` when `up` found them absent.
# Uses from the caller: DIR, BIN, ROOT, APISERVER_PORT, say, fail, start,
# stop, running, wait_for, k, k_retry, kubeconfig, cert, free_port.
# The images its pods run: scripts/node-images.sh; KEDA's pods:
# scripts/node-keda.sh; the KEDA HTTP add-on's: scripts/node-addon.sh.

NODE_NAME="hoist-node"
NODE_BRIDGE="hoist0"
NODE_POD_CIDR="10.244.0.0/24"
NODE_HOST_IP="10.244.0.1"
# The Service range is the API server's --service-cluster-ip-range.
NODE_DNS_IP="10.0.0.10"
NODE_CLUSTER_DOMAIN="cluster.local"
NODE_CNI_BIN="/usr/lib/cni"
# Forwarding between the bridge and any other interface, either way, is
# dropped: pods reach each other, the host and Services, nothing else, and
# nothing else reaches them.
NODE_FORWARD_DROPS=("-i $NODE_BRIDGE ! -o $NODE_BRIDGE" "! -i $NODE_BRIDGE -o $NODE_BRIDGE")
source "$ROOT/scripts/node-images.sh"
source "$ROOT/scripts/node-keda.sh"
source "$ROOT/scripts/node-addon.sh"
# Paths outside CONTROLPLANE_DIR that kubelet, containerd's shims and the
# CNI library write to whatever their configuration says.
NODE_OUTSIDE_PATHS=(/var/lib/kubelet /var/log/containers /var/log/pods /run/containerd
  /var/lib/cni /run/netns /usr/libexec/kubernetes)

node_enabled() { [ "${CONTROLPLANE_NODE:-0}" = 1 ]; }
node_dir() { echo "$DIR/node"; }
ctr_() { "$BIN/ctr" --address "$DIR/node/containerd.sock" "$@"; }

# What the node needs from Debian (scripts/deps.sh installs what is
# missing): runc, the CNI plugins, iptables, conntrack (kube-proxy clears
# stale UDP entries with it), libc6-dev (the static pause), buildah and
# Redis (the images).
NODE_DEBIAN_PACKAGES=(runc containernetworking-plugins iptables conntrack iproute2 util-linux
  libc6-dev buildah redis-server redis-tools ca-certificates)
node_deps() { "$ROOT/scripts/deps.sh" "${NODE_DEBIAN_PACKAGES[@]}"; }

# The node's own checks before it touches the machine: each names the cause.
node_preflight() {
  [ "$(id -u)" = 0 ] || fail "the node needs root (kubelet, containerd, iptables, cgroups)"
  [ "${CONTROLPLANE_VERSIONS:-current}" = current ] ||
    fail "the node is built for the current versions only (CONTROLPLANE_VERSIONS=current)"
  [ -d /sys/fs/cgroup/memory ] || [ -f /sys/fs/cgroup/cgroup.controllers ] ||
    fail "no cgroup memory controller mounted under /sys/fs/cgroup"
  ! ip link show "$NODE_BRIDGE" >/dev/null 2>&1 ||
    fail "interface $NODE_BRIDGE exists: another node is up (its CONTROLPLANE_DIR's down), or remove it"
  [ -w /proc/sys/net/ipv4/ip_forward ] || fail "/proc/sys/net/ipv4/ip_forward is not writable"
}

# Before the API server starts: the bridge with the host's address on it,
# which the API server listens on and advertises, so that pods reach it.
node_network_up() {
  local d
  d="$(node_dir)"
  mkdir -p "$d"
  # Which outside paths exist now: `down` removes only those it made.
  : >"$d/outside-preexisting"
  for path in "${NODE_OUTSIDE_PATHS[@]}"; do
    [ -e "$path" ] && echo "$path" >>"$d/outside-preexisting"
  done
  cat /proc/sys/net/ipv4/ip_forward >"$d/ip_forward.orig"
  ip netns list 2>/dev/null | awk '{print $1}' | sort >"$d/netns.before" || true
  ip link add "$NODE_BRIDGE" type bridge
  echo "$NODE_BRIDGE" >"$d/bridge"
  ip addr add "$NODE_HOST_IP/24" dev "$NODE_BRIDGE"
  ip link set "$NODE_BRIDGE" up
  # Pods and Services stay on this machine: nothing from the bridge is
  # forwarded anywhere but back onto the bridge. In mangle's FORWARD,
  # which runs before filter's, where kube-proxy and kubelet put their
  # ACCEPTs first.
  for ipt in iptables ip6tables; do
    for rule in "${NODE_FORWARD_DROPS[@]}"; do
      # shellcheck disable=SC2086 # a rule is words
      "$ipt" -w -t mangle -I FORWARD $rule -m comment --comment hoist-node -j DROP
    done
  done
  echo 1 >/proc/sys/net/ipv4/ip_forward
}

# The node's certificates, signed by the cluster CA: kubelet's client
# (Node authorizer: system:node:NAME in system:nodes) and serving
# certificate, the API server's client of kubelets, kube-scheduler's and
# kube-proxy's clients, CoreDNS's client.
node_pki() {
  cert kubelet "system:node:$NODE_NAME" system:nodes "IP:$NODE_HOST_IP,IP:127.0.0.1,DNS:$NODE_NAME" ca
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters "" ca
  cert kube-scheduler system:kube-scheduler "" "" ca
  cert kube-proxy system:kube-proxy "" "" ca
  cert coredns coredns "" "" ca
}

# More API server arguments for the node (with --authorization-mode
# Node,RBAC: kubelets authorized by the Node authorizer): the API server authenticating to kubelets with its own
# certificate and reaching them by InternalIP (the node's name does not
# resolve).
node_apiserver_args() {
  NODE_APISERVER_ARGS=(
    --enable-admission-plugins NodeRestriction
    --kubelet-client-certificate "$DIR/pki/apiserver-kubelet-client.crt"
    --kubelet-client-key "$DIR/pki/apiserver-kubelet-client.key"
    --kubelet-certificate-authority "$DIR/pki/ca.crt"
    --kubelet-preferred-address-types InternalIP
  )
}

node_containerd_up() {
  local d
  d="$(node_dir)"
  mkdir -p "$d/containerd/root" "$d/containerd/state" "$d/cni/net.d" "$d/cni/ipam" "$d/cni/cache"
  cat >"$d/cni/net.d/10-hoist.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "hoist-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$NODE_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$d/cni/ipam",
        "ranges": [[{"subnet": "$NODE_POD_CIDR", "gateway": "$NODE_HOST_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "loopback"}
  ]
}
EOF
  # restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, and runc
  # fails every sandbox that asks for a lower oom_score_adj than its own.
  # netns_mounts_under_state_dir: the pods' network namespaces under this
  # directory, not /run/netns.
  cat >"$d/containerd/config.toml" <<EOF
version = 4
root = '$d/containerd/root'
state = '$d/containerd/state'

[debug]
  level = 'info'

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = '$d/containerd.sock'
  [plugins.'io.containerd.server.v1.ttrpc']
    address = '$d/containerd.sock.ttrpc'
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = 'localhost/pause:test'
  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '$(command -v runc)'
          Root = '$d/containerd/runc'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['$NODE_CNI_BIN']
      conf_dir = '$d/cni/net.d'
      max_conf_num = 1
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
  [plugins.'io.containerd.internal.v1.opt']
    path = '$d/containerd/opt'
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
EOF
  # The shims are started by containerd; PATH is how it finds them.
  start containerd env PATH="$BIN:$PATH" "$BIN/containerd" --config "$d/containerd/config.toml"
  wait_for containerd 60 ctr_ version
}

node_kubelet_up() {
  local d kubelet_port healthz_port
  d="$(node_dir)"
  kubelet_port="$(free_port)"
  healthz_port="$(free_port)"
  mkdir -p "$d/kubelet/root" "$d/kubelet/pki" "$d/kubelet/plugins" "$d/kubelet/pod-logs"
  kubeconfig "$d/kubelet/kubeconfig" kubelet
  # failCgroupV1: false, since kubelet 1.35 refuses cgroup v1 otherwise
  # (this machine is v1); no anonymous access, every request authenticated
  # by certificate or token and authorized by the API server.
  cat >"$d/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_HOST_IP
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz_port
tlsCertFile: $DIR/pki/kubelet.crt
tlsPrivateKeyFile: $DIR/pki/kubelet.key
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $DIR/pki/ca.crt
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$d/containerd.sock
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
clusterDNS: [$NODE_DNS_IP]
clusterDomain: $NODE_CLUSTER_DOMAIN
resolvConf: ""
volumePluginDir: $d/kubelet/plugins
podLogsDir: $d/kubelet/pod-logs
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
rotateCertificates: false
serverTLSBootstrap: false
EOF
  start kubelet "$BIN/kubelet" --config "$d/kubelet/config.yaml" --kubeconfig "$d/kubelet/kubeconfig" \
    --root-dir "$d/kubelet/root" --cert-dir "$d/kubelet/pki" \
    --hostname-override "$NODE_NAME" --node-ip "$NODE_HOST_IP" --v 1
  wait_for kubelet 90 curl -sf "http://127.0.0.1:$healthz_port/healthz"
}

node_scheduler_up() {
  kubeconfig "$DIR/kube-scheduler.kubeconfig" kube-scheduler
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$DIR/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig "$DIR/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig "$DIR/kube-scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false
}

node_proxy_up() {
  local d
  d="$(node_dir)"
  mkdir -p "$d/kube-proxy"
  kubeconfig "$d/kube-proxy/kubeconfig" kube-proxy
  # Leaves conntrack's sysctls and route_localnet as they are, and opens
  # NodePorts on the bridge's address only.
  cat >"$d/kube-proxy/config.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: $d/kube-proxy/kubeconfig
hostnameOverride: $NODE_NAME
clusterCIDR: $NODE_POD_CIDR
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:$(free_port)
metricsBindAddress: 127.0.0.1:$(free_port)
nodePortAddresses: ["$NODE_HOST_IP/32"]
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  localhostNodePorts: false
EOF
  start kube-proxy "$BIN/kube-proxy" --config "$d/kube-proxy/config.yaml" --v 1
}

# Cluster DNS: CoreDNS on the host's bridge address, behind the Service
# kube-dns (NODE_DNS_IP) whose EndpointSlice names that address. It
# answers cluster.local only: no forwarder, pods resolve nothing outside.
node_dns_up() {
  local d dns_port
  d="$(node_dir)"
  dns_port="$(free_port)"
  mkdir -p "$d/coredns"
  kubeconfig "$d/coredns/kubeconfig" coredns
  cat >"$d/coredns/Corefile" <<EOF
.:$dns_port {
    bind $NODE_HOST_IP
    errors
    kubernetes $NODE_CLUSTER_DOMAIN in-addr.arpa ip6.arpa {
        kubeconfig $d/coredns/kubeconfig hoist-test
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    cache 5
}
EOF
  cat >"$d/coredns/rbac.yaml" <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: hoist-test:coredns
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: hoist-test:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: hoist-test:coredns
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: coredns
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
spec:
  clusterIP: $NODE_DNS_IP
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: $dns_port}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: $dns_port}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-host
  namespace: kube-system
  labels:
    kubernetes.io/service-name: kube-dns
addressType: IPv4
endpoints:
- addresses: [$NODE_HOST_IP]
  conditions: {ready: true}
ports:
- {name: dns, port: $dns_port, protocol: UDP}
- {name: dns-tcp, port: $dns_port, protocol: TCP}
EOF
  k_retry apply -f "$d/coredns/rbac.yaml" >/dev/null
  start coredns "$BIN/coredns" -conf "$d/coredns/Corefile"
  echo "DNS=$NODE_HOST_IP:$dns_port" >>"$DIR/ports.env"
}

# After the control plane: the node's processes, the images, and a Ready
# Node.
node_up() {
  node_containerd_up
  node_images_import
  node_scheduler_up
  node_proxy_up
  node_dns_up
  node_kubelet_up
  k_retry wait --for condition=Ready --timeout 120s "node/$NODE_NAME" >/dev/null
  # Schedulable once the node lifecycle controller lifted the not-ready taint.
  local deadline=$((SECONDS + 60))
  until [ -z "$(k get node "$NODE_NAME" -o jsonpath='{.spec.taints}')" ]; do
    [ $SECONDS -lt $deadline ] || fail "node $NODE_NAME still tainted: $(k get node "$NODE_NAME" -o jsonpath='{.spec.taints}')"
    sleep 0.5
  done
  say "node $NODE_NAME Ready ($NODE_POD_CIDR on $NODE_BRIDGE; images: ${NODE_IMAGES[*]})"
}

# --- down --------------------------------------------------------------

# pids of our shims: containerd's runc shim started for this node's socket.
node_shim_pids() {
  local sock="$1" pid
  for exe in /proc/[0-9]*/exe; do
    pid="${exe#/proc/}"
    pid="${pid%/exe}"
    [ "$(readlink "$exe" 2>/dev/null)" = "$BIN/containerd-shim-runc-v2" ] || continue
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$sock" && echo "$pid"
  done
  return 0
}

# Every `kubepods` cgroup directory, in every hierarchy, deepest first.
node_kubepods_cgroups() {
  find /sys/fs/cgroup -mindepth 2 -maxdepth 3 -type d -name kubepods 2>/dev/null |
    while read -r top; do find "$top" -depth -type d; done
}

node_kill_cgroup_processes() {
  local dir pid
  while read -r dir; do
    for procs in "$dir/cgroup.procs"; do
      [ -f "$procs" ] || continue
      while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done <"$procs"
    done
  done < <(node_kubepods_cgroups)
}

node_remove_cgroups() {
  local dir
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    [ -n "$(node_kubepods_cgroups)" ] || return 0
    node_kill_cgroup_processes
    node_kubepods_cgroups | while read -r dir; do rmdir "$dir" 2>/dev/null || true; done
    sleep 0.5
  done
  [ -z "$(node_kubepods_cgroups)" ] || say "left behind: cgroups $(node_kubepods_cgroups | tr '\n' ' ')"
}

# Every mount at or under DIR/node, deepest first.
node_mounts() {
  findmnt -rn -o TARGET 2>/dev/null | awk -v d="$(node_dir)" 'index($0, d) == 1' | sort -r
}

node_unmount_all() {
  local target
  for _ in 1 2 3 4 5; do
    [ -n "$(node_mounts)" ] || return 0
    node_mounts | while read -r target; do
      umount "$target" 2>/dev/null || umount -l "$target" 2>/dev/null || true
    done
  done
  [ -z "$(node_mounts)" ] || say "left behind: mounts $(node_mounts | tr '\n' ' ')"
}

# Every KUBE-* chain and every rule that jumps to one, in every table of
# iptables and ip6tables, and our own FORWARD rule.
node_iptables_clean() {
  local ipt table chain rule
  for ipt in iptables ip6tables; do
    for rule in "${NODE_FORWARD_DROPS[@]}"; do
      # shellcheck disable=SC2086 # a rule is words
      while "$ipt" -w -t mangle -D FORWARD $rule -m comment --comment hoist-node -j DROP 2>/dev/null; do :; done
    done
    for table in filter nat mangle raw; do
      # Rules in built-in chains that jump to KUBE-* chains first.
      { "$ipt-save" -t "$table" 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-' | grep -vE '^-A KUBE-' || true; } |
        while read -r rule; do
          eval "\"\$ipt\" -w -t \"\$table\" -D ${rule#-A }" 2>/dev/null || true
        done
      for chain in $("$ipt-save" -t "$table" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p'); do
        "$ipt" -w -t "$table" -F "$chain" 2>/dev/null || true
      done
      for chain in $("$ipt-save" -t "$table" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p'); do
        "$ipt" -w -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
  done
}

node_kube_chains() {
  { iptables-save 2>/dev/null; ip6tables-save 2>/dev/null; } | grep -E '^:KUBE-' || true
}

# Undoes node_network_up and everything the node's processes did. Safe to
# run again, and after an `up` that stopped anywhere.
node_down() {
  local d
  d="$(node_dir)"
  [ -d "$d" ] || return 0
  for name in kube-proxy kubelet kube-scheduler coredns; do stop "$name"; done
  # Containers first, while containerd still runs their shims.
  if running containerd; then
    local task
    for task in $(ctr_ -n k8s.io tasks ls -q 2>/dev/null); do
      ctr_ -n k8s.io tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
    done
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      for task in $(ctr_ -n k8s.io tasks ls -q 2>/dev/null); do
        ctr_ -n k8s.io tasks delete -f "$task" >/dev/null 2>&1 || true
      done
      [ -z "$(ctr_ -n k8s.io tasks ls -q 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  stop containerd
  node_kill_cgroup_processes
  local pid
  for pid in $(node_shim_pids "$d/containerd.sock"); do kill -KILL "$pid" 2>/dev/null || true; done
  node_unmount_all
  node_remove_cgroups
  node_iptables_clean
  if [ -f "$d/bridge" ]; then
    # The pods' veths went with their namespaces; any left are on the bridge.
    for link in $(ip -o link show master "$NODE_BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
      ip link del "$link" 2>/dev/null || true
    done
    ip link del "$NODE_BRIDGE" 2>/dev/null || true
    rm -f "$d/bridge"
  fi
  if [ -f "$d/ip_forward.orig" ]; then
    cat "$d/ip_forward.orig" >/proc/sys/net/ipv4/ip_forward
    rm -f "$d/ip_forward.orig"
  fi
  if [ -f "$d/outside-preexisting" ]; then
    for path in "${NODE_OUTSIDE_PATHS[@]}"; do
      grep -qxF "$path" "$d/outside-preexisting" && continue
      [ -e "$path" ] || continue
      if findmnt -rn -o TARGET | awk -v p="$path" 'index($0, p) == 1' | grep -q .; then
        say "left behind: $path (something is mounted under it)"
      else
        rm -rf "$path"
      fi
    done
    rm -f "$d/outside-preexisting"
  fi
  # containerd's root holds the imported images unpacked (about 1 GB a
  # run, and every `up` imports them again): gone, once nothing is mounted
  # in it. What stays is small: configs, kubelet's directory, the logs.
  if [ -d "$d/containerd/root" ]; then
    if findmnt -rn -o TARGET | awk -v p="$d/containerd/root" 'index($0, p) == 1' | grep -q .; then
      say "left behind: $d/containerd/root (something is mounted under it)"
    else
      rm -rf "$d/containerd/root"
    fi
  fi
  [ -z "$(node_kube_chains)" ] || say "left behind: iptables chains $(node_kube_chains | tr '\n' ' ')"
}
