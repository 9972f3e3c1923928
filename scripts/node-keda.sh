# KEDA as users install it, on the node of scripts/controlplane.sh
# (sourced by scripts/node.sh, not run): KEDA's own manifests from its Go
# module (config/minimal: the CRDs, RBAC, the operator and the metrics
# adapter with their Services and the APIService; not the admission
# webhooks, whose image is not built here), applied with kubectl's
# kustomize. What differs from `kubectl apply -k` of KEDA's release:
#   - the images are the ones built here (localhost/keda-operator:test,
#     localhost/keda-adapter:test; scripts/node-images.sh), pulled never;
#   - KEDA_OPERATOR_ARGS, when set, are added to the operator's arguments.
# The operator makes its own certificates (--enable-cert-rotation, KEDA's
# default) and writes the APIService's caBundle; the API server reaches
# the adapter through its Service, kube-proxy's rules and the pod bridge.
# Uses from the caller: DIR, TOOLS, say, fail, k, k_retry.

node_keda_up() {
  local d keda_version
  d="$DIR/keda-install"
  keda_version="$(go -C "$TOOLS/keda" list -m -f '{{.Version}}' github.com/kedacore/keda/v2)"
  module_config keda github.com/kedacore/keda/v2 "$d"
  local extra_args="" arg
  for arg in ${KEDA_OPERATOR_ARGS:-}; do
    extra_args+="
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: \"$arg\""
  done
  cat >"$d/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- config/minimal
images:
- name: ghcr.io/kedacore/keda
  newName: localhost/keda-operator
  newTag: test
- name: ghcr.io/kedacore/keda-metrics-apiserver
  newName: localhost/keda-adapter
  newTag: test
patches:
- target: {kind: Deployment, name: keda-operator}
  patch: |
    - op: replace
      path: /spec/template/spec/containers/0/imagePullPolicy
      value: Never$extra_args
- target: {kind: Deployment, name: keda-metrics-apiserver}
  patch: |
    - op: replace
      path: /spec/template/spec/containers/0/imagePullPolicy
      value: Never
EOF
  kustomize_apply "$d" crd/scaledobjects.keda.sh
  k wait -n keda --for condition=Available --timeout 240s deployment/keda-operator deployment/keda-metrics-apiserver >/dev/null ||
    fail "KEDA's pods are not Available: $(k get pods -n keda -o wide 2>&1)"
  local deadline=$((SECONDS + 120))
  until k get --raw /apis/external.metrics.k8s.io/v1beta1 >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "the external metrics API is not served: $(k get apiservice v1beta1.external.metrics.k8s.io -o jsonpath='{.status.conditions}' 2>&1)"
    sleep 1
  done
  say "KEDA $keda_version as pods in namespace keda (its config/minimal)"
}

# module_config WRAPPER MODULE DIR: DIR afresh, with the module's config/
# (from Go's module cache, as the wrapper in tools/ pins it), writable.
module_config() {
  local module_dir
  module_dir="$(go -C "$TOOLS/$1" list -m -f '{{.Dir}}' "$2")" ||
    fail "$2 is not in Go's module cache (scripts/controlplane.sh build)"
  rm -rf "$3"
  mkdir -p "$3"
  cp -r "$module_dir/config" "$3/config"
  chmod -R u+w "$3/config"
}

# kustomize_apply DIR CRD...: kubectl's kustomize of DIR (its
# kustomization.yaml) into DIR/manifests.yaml, applied, and each CRD
# established. Server-side: the CRDs are too large for the last-applied
# annotation.
kustomize_apply() {
  local d="$1"
  shift
  k kustomize "$d" >"$d/manifests.yaml" || fail "kustomize of $d failed"
  k_retry apply --server-side --force-conflicts -f "$d/manifests.yaml" >/dev/null
  k_retry wait --for condition=established --timeout 60s "$@" >/dev/null
}
