#!/usr/bin/env bash
# Builds hoist's container image without a Docker engine, daemon or
# registry: Debian's `buildah` (vfs storage, chroot isolation, its own
# storage directory, removed at the end) assembles it FROM scratch with
# the hoist binary, the shared libraries it links (from `ldd`), the CA
# bundle and a passwd/group entry for uid 65532, and writes it as an OCI
# archive. deploy/Dockerfile builds the same for people with an engine.
#
#   scripts/image.sh [--binary PATH] [--load-binary PATH] [--output FILE]
#                    [--tag NAME:TAG] [--format oci-archive|docker-archive]
#
#   --binary  the hoist to ship (default: `cargo build --release --locked`,
#             target/release/hoist)
#   --load-binary  hoist-load, the project's load and workload tool, shipped
#             beside it as /usr/local/bin/hoist-load (default: the
#             hoist-load beside --binary, which Cargo builds with it)
#   --format  oci-archive (default) or docker-archive (what `ctr images
#             import` takes, as scripts/controlplane.sh's node does)
#   --output  the OCI archive (default: target/image/hoist-<version>.oci.tar)
#   --tag     the image's name inside the archive (default:
#             ghcr.io/example/hoist:<version>, what the manifests expect)
#
# Load it: `podman load -i FILE`, or `skopeo copy oci-archive:FILE
# docker://REGISTRY/hoist:<version>` to push it (deploy/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."

binary=""
load_binary=""
format="oci-archive"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
output="target/image/hoist-$version.oci.tar"
tag="ghcr.io/example/hoist:$version"
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --load-binary) load_binary="$2"; shift 2 ;;
    --format) format="$2"; shift 2 ;;
    --output) output="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    *) echo "error: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done

command -v buildah >/dev/null 2>&1 || scripts/deps.sh buildah
case "$format" in
  oci-archive) commit_format=oci ;;
  docker-archive) commit_format=docker ;;
  *) echo "error: --format is oci-archive or docker-archive, not $format" >&2; exit 2 ;;
esac
if [ -z "$binary" ]; then
  cargo build --release --locked --bin hoist --bin hoist-load
  binary=target/release/hoist
fi
load_binary="${load_binary:-$(dirname "$binary")/hoist-load}"
[ -x "$binary" ] || { echo "error: $binary is not an executable" >&2; exit 1; }
[ -x "$load_binary" ] || { echo "error: $load_binary is not an executable" >&2; exit 1; }
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
git diff --quiet HEAD -- src scalers build.rs Cargo.toml Cargo.lock 2>/dev/null || revision="$revision-dirty"
ca_bundle=/etc/ssl/certs/ca-certificates.crt
[ -f "$ca_bundle" ] || scripts/deps.sh ca-certificates

storage="$(mktemp -d /tmp/hoist-image.XXXXXX)"
b() { buildah --root "$storage/root" --runroot "$storage/run" --storage-driver vfs "$@"; }
container=""
cleanup() {
  [ -n "$container" ] && b rm "$container" >/dev/null 2>&1
  b rmi --all --force >/dev/null 2>&1 || true
  rm -rf "$storage"
}
trap cleanup EXIT

container="$(b from --isolation chroot scratch)"
rootfs="$(b mount "$container")"
install -D -m 0755 "$binary" "$rootfs/usr/local/bin/hoist"
install -D -m 0755 "$load_binary" "$rootfs/usr/local/bin/hoist-load"
# The dynamic loader and every library the binaries link, at their paths.
ldd "$binary" "$load_binary" | awk '/=> \// {print $3} /^\t\/[^ ]+ \(/ {print $1}' | while read -r lib; do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done
install -D -m 0644 "$ca_bundle" "$rootfs/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nhoist:x:65532:65532:hoist:/nonexistent:/usr/sbin/nologin\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nhoist:x:65532:\n' >"$rootfs/etc/group"
install -d -m 1777 "$rootfs/tmp"
install -d -m 0755 -o 65532 -g 65532 "$rootfs/var/lib/hoist"
b umount "$container" >/dev/null

b config \
  --user 65532:65532 \
  --workingdir / \
  --entrypoint '["/usr/local/bin/hoist"]' \
  --cmd '["serve", "--config", "/etc/hoist/hoist.toml"]' \
  --port 9090/tcp --port 9091/tcp --port 8080/tcp \
  --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  --label org.opencontainers.image.title=hoist \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$revision" \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  --label "org.opencontainers.image.description=A KEDA external scaler with Azure Container Apps' scaling behaviour" \
  "$container"
mkdir -p "$(dirname "$output")"
rm -f "$output"
b commit --quiet --format "$commit_format" "$container" "$format:$output:$tag" >/dev/null
echo "wrote $output ($tag, revision $revision)"
