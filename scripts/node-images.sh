# The images the node of scripts/controlplane.sh runs (sourced by
# scripts/node.sh, not run), built here with Debian's buildah (vfs
# storage, chroot isolation, FROM scratch, as scripts/image.sh does),
# kept as docker archives in target/node-images/ and imported into the
# node's containerd (namespace k8s.io), since no registry can be reached.
# Each is built again when what it carries is newer than its archive.

NODE_IMAGES=(localhost/pause:test localhost/redis:test localhost/hoist:test
  localhost/keda-operator:test localhost/keda-adapter:test)
# The KEDA HTTP add-on's, built and imported only when it is installed
# (scripts/node-addon.sh).
NODE_ADDON_IMAGES=(localhost/keda-http-interceptor:test localhost/keda-http-scaler:test
  localhost/keda-http-operator:test)
NODE_IMAGE_DIR="$ROOT/target/node-images"

# image_archive NAME: where the docker-archive of localhost/NAME:test is.
image_archive() { echo "$NODE_IMAGE_DIR/$1.tar"; }

# image_build NAME FILL [ARGS]: FILL ARGS ROOTFS CONTAINER fills a scratch
# container; buildah keeps it in its own vfs storage, removed afterwards.
image_build() {
  local name="$1"
  shift
  local storage
  storage="$(mktemp -d "${TMPDIR:-/tmp}/hoist-node-image.XXXXXX")"
  # shellcheck disable=SC2317
  b() { buildah --root "$storage/root" --runroot "$storage/run" --storage-driver vfs "$@"; }
  local container
  container="$(b from --isolation chroot scratch)"
  local rootfs
  rootfs="$(b mount "$container")"
  if ! "$@" "$rootfs" "$container"; then
    b rm "$container" >/dev/null 2>&1 || true
    rm -rf "$storage"
    fail "building localhost/$name:test failed"
  fi
  b umount "$container" >/dev/null
  mkdir -p "$NODE_IMAGE_DIR"
  rm -f "$(image_archive "$name").tmp"
  b commit --quiet --format docker "$container" "docker-archive:$(image_archive "$name").tmp:localhost/$name:test" >/dev/null
  b rm "$container" >/dev/null 2>&1 || true
  b rmi --all --force >/dev/null 2>&1 || true
  rm -rf "$storage"
  mv "$(image_archive "$name").tmp" "$(image_archive "$name")"
  say "built localhost/$name:test"
}

# copy_binary ROOTFS PATH [DEST]: a binary and every library it links.
copy_binary() {
  local rootfs="$1" binary="$2" dest="${3:-$2}"
  install -D -m 0755 "$binary" "$rootfs$dest"
  ldd "$binary" 2>/dev/null | awk '/=> \// {print $3} /^\t\/[^ ]+ \(/ {print $1}' | while read -r lib; do
    mkdir -p "$rootfs$(dirname "$lib")"
    cp -L "$lib" "$rootfs$lib"
  done
}

base_files() {
  local rootfs="$1"
  printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65532:65532:nobody:/nonexistent:/usr/sbin/nologin\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnobody:x:65532:\n' >"$rootfs/etc/group"
  install -d -m 1777 "$rootfs/tmp"
}

# The pause image: Kubernetes' own pause.c, from the k8s.io/kubernetes
# module, compiled static as its Makefile does.
pause_fill() {
  local rootfs="$1" container="$2" src
  src="$(go -C "$ROOT/tools/kubernetes" list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
  [ -f "$src" ] || { say "no $src in the k8s.io/kubernetes module"; return 1; }
  gcc -Os -Wall -Werror -static -DVERSION=v3.10-hoist -o "$rootfs/pause" "$src" || return 1
  b config --entrypoint '["/pause"]' --user 65535:65535 "$container"
}

redis_fill() {
  local rootfs="$1" container="$2"
  mkdir -p "$rootfs/etc" "$rootfs/data" || return 1
  base_files "$rootfs" || return 1
  copy_binary "$rootfs" "$(command -v redis-server)" /usr/bin/redis-server || return 1
  copy_binary "$rootfs" "$(command -v redis-cli)" /usr/bin/redis-cli || return 1
  chmod 0777 "$rootfs/data"
  b config --workingdir /data --port 6379/tcp \
    --entrypoint '["/usr/bin/redis-server"]' \
    --cmd '["--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"]' "$container"
}

# keda_fill BINARY PATH ROOTFS CONTAINER: a KEDA image laid out as KEDA's
# own (its Dockerfile: the binary at PATH, run as 65532), since KEDA's
# manifests name the command (/keda, /keda-adapter).
keda_fill() {
  local binary="$1" path="$2" rootfs="$3" container="$4"
  mkdir -p "$rootfs/etc/ssl/certs" || return 1
  base_files "$rootfs" || return 1
  copy_binary "$rootfs" "$BIN/$binary" "$path" || return 1
  install -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
  b config --user 65532:65532 --entrypoint "[\"$path\"]" "$container"
}

# addon_fill PART ROOTFS CONTAINER: an add-on image laid out as its
# release's (ko: the binary at /ko-app/PART as the entrypoint, its base
# image's user 65532), since the add-on's manifests name no command and
# ask runAsNonRoot.
addon_fill() {
  keda_fill "keda-http-$1" "/ko-app/$1" "$2" "$3"
}

# hoist's image is scripts/image.sh's, from HOIST_IMAGE_BINARY (default:
# the debug build, made when missing) and the hoist-load beside it: built
# again when either binary changed.
hoist_image() {
  local binary="${HOIST_IMAGE_BINARY:-$ROOT/target/debug/hoist}" stamp
  local load_binary
  load_binary="$(dirname "$binary")/hoist-load"
  if [ -z "${HOIST_IMAGE_BINARY:-}" ] && { [ ! -x "$binary" ] || [ ! -x "$load_binary" ]; }; then
    (cd "$ROOT" && cargo build --locked --bin hoist --bin hoist-load)
  fi
  [ -x "$binary" ] && [ -x "$load_binary" ] || fail "no hoist and hoist-load at $(dirname "$binary") for localhost/hoist:test"
  stamp="$(cat "$binary" "$load_binary" | sha256sum | cut -d' ' -f1)"
  if [ -f "$(image_archive hoist)" ] && [ "$(cat "$NODE_IMAGE_DIR/hoist.stamp" 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  mkdir -p "$NODE_IMAGE_DIR"
  "$ROOT/scripts/image.sh" --binary "$binary" --load-binary "$load_binary" \
    --output "$(image_archive hoist)" --format docker-archive --tag localhost/hoist:test >&2
  echo "$stamp" >"$NODE_IMAGE_DIR/hoist.stamp"
}

# image_fresh NAME SOURCE...: the archive exists and is newer than every
# SOURCE.
image_fresh() {
  local archive source
  archive="$(image_archive "$1")"
  shift
  [ -f "$archive" ] || return 1
  for source in "$@"; do
    [ "$archive" -nt "$source" ] || return 1
  done
}

# Builds the archives (under target/node-images) that are missing or
# older than what they carry.
node_images_build() {
  image_fresh pause "$ROOT/tools/kubernetes/go.sum" || image_build pause pause_fill
  image_fresh redis "$(command -v redis-server)" || image_build redis redis_fill
  image_fresh keda-operator "$BIN/keda-operator" "$ROOT/scripts/node-images.sh" ||
    image_build keda-operator keda_fill keda-operator /keda
  image_fresh keda-adapter "$BIN/keda-adapter" "$ROOT/scripts/node-images.sh" ||
    image_build keda-adapter keda_fill keda-adapter /keda-adapter
  hoist_image
}

node_addon_images_build() {
  local part
  for part in interceptor scaler operator; do
    image_fresh "keda-http-$part" "$BIN/keda-http-$part" "$ROOT/scripts/node-images.sh" ||
      image_build "keda-http-$part" addon_fill "$part"
  done
}

# Imports into containerd's k8s.io namespace every image it lacks, or
# whose archive is newer than the import.
node_images_import() {
  node_images_build
  images_import "${NODE_IMAGES[@]}"
}

node_addon_images_import() {
  node_addon_images_build
  images_import "${NODE_ADDON_IMAGES[@]}"
}

# images_import IMAGE...: those of them containerd lacks, or whose archive
# is newer than their import.
images_import() {
  local present name image
  present="$(ctr_ -n k8s.io images ls -q)"
  for image in "$@"; do
    name="${image#localhost/}"
    name="${name%:test}"
    if ! grep -qxF "$image" <<<"$present" || [ "$(image_archive "$name")" -nt "$(node_dir)/imported-$name" ]; then
      ctr_ -n k8s.io images import "$(image_archive "$name")" >/dev/null ||
        fail "importing $image into containerd failed"
      touch "$(node_dir)/imported-$name"
    fi
  done
}
