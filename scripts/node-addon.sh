# The KEDA HTTP add-on as its users install it, on the node of
# scripts/controlplane.sh, beside KEDA (sourced by scripts/node.sh, not
# run; `scripts/controlplane.sh addon` installs it on a node that is up).
# The add-on's own manifests from its Go module (config/default: its two
# CRDs, the interceptor with its proxy and admin Services and its own
# ScaledObject, the external scaler, the operator, their RBAC), applied
# with kubectl's kustomize, as its Makefile's `deploy` does with ko. What
# differs: the images are the ones built here
# (localhost/keda-http-{interceptor,scaler,operator}:test;
# scripts/node-images.sh) in place of ko's references, pulled never.
# Not part of `up`: its pods (and KEDA polling its interceptor's
# ScaledObject every second) would run beside every earlier step of
# tests/node.rs, and every `up` with a node would pay its install; the
# test installs it at the step that uses it.
# Uses from the caller: DIR, TOOLS, say, fail, k, k_retry, and
# module_config and kustomize_apply (scripts/node-keda.sh).

node_addon_up() {
  local d addon_version
  d="$DIR/addon-install"
  addon_version="$(go -C "$TOOLS/http-add-on" list -m -f '{{.Version}}' github.com/kedacore/http-add-on)"
  local began=$SECONDS
  node_addon_images_import
  local imported=$SECONDS
  module_config http-add-on github.com/kedacore/http-add-on "$d"
  local images="" part
  for part in interceptor scaler operator; do
    images+="
- name: ko://github.com/kedacore/http-add-on/$part
  newName: localhost/keda-http-$part
  newTag: test"
  done
  cat >"$d/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- config/default
images:$images
patches:
- target: {kind: Deployment}
  patch: |
    - op: add
      path: /spec/template/spec/containers/0/imagePullPolicy
      value: Never
EOF
  kustomize_apply "$d" crd/httpscaledobjects.http.keda.sh crd/interceptorroutes.http.keda.sh
  local applied=$SECONDS
  # A ko:// reference left would be pulled, and never start.
  ! grep -q 'image: ko://' "$d/manifests.yaml" || fail "an image of the add-on was not replaced ($d/manifests.yaml)"
  k wait -n keda --for condition=Available --timeout 180s deployment/keda-add-ons-http-interceptor \
    deployment/keda-add-ons-http-scaler deployment/keda-add-ons-http-operator >/dev/null ||
    fail "the add-on's pods are not Available: $(k get pods -n keda -o wide 2>&1)"
  say "the KEDA HTTP add-on $addon_version as pods in namespace keda (its config/default):" \
    "images $((imported - began)) s, apply $((applied - imported)) s, pods Available $((SECONDS - applied)) s"
}
