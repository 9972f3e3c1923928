#!/usr/bin/env bash
# Installs what building hoist needs on a fresh Debian/Ubuntu machine:
# a C toolchain, make, pkg-config, and the OpenSSL, libcurl and Cyrus SASL
# headers for librdkafka (the Kafka client, built from source by the
# rdkafka crate with TLS, OAUTHBEARER's OIDC token fetch and GSSAPI), with
# kinit and SASL's GSSAPI plugin for Kafka's `sasl: gssapi`. Extra package
# names given as arguments are installed too (scripts/test.sh adds
# redis-server, and Java and Maven for the Kafka broker; `promtool` stands
# for Debian's `prometheus`). Does nothing when everything is there.
set -euo pipefail

missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
pkg-config --exists openssl 2>/dev/null || missing+=(libssl-dev)
pkg-config --exists libcurl 2>/dev/null || missing+=(libcurl4-openssl-dev)
pkg-config --exists libsasl2 2>/dev/null || missing+=(libsasl2-dev)
dpkg -s libsasl2-modules-gssapi-mit >/dev/null 2>&1 || missing+=(libsasl2-modules-gssapi-mit)
command -v kinit >/dev/null 2>&1 || missing+=(krb5-user)
for package in "$@"; do
  case "$package" in
    redis-server) command -v redis-server >/dev/null 2>&1 || missing+=(redis-server) ;;
    redis-tools) command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools) ;;
    promtool) command -v promtool >/dev/null 2>&1 || missing+=(prometheus) ;;
    buildah) command -v buildah >/dev/null 2>&1 || missing+=(buildah) ;;
    default-jre-headless) command -v java >/dev/null 2>&1 || missing+=(default-jre-headless) ;;
    maven) command -v mvn >/dev/null 2>&1 || missing+=(maven) ;;
    *) dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package") ;;
  esac
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing ${missing[*]} ..."
if [ "$(id -u)" -eq 0 ]; then
  SUDO=""
elif command -v sudo >/dev/null 2>&1; then
  SUDO="sudo"
else
  echo "error: ${missing[*]} missing and no root or sudo to install them" >&2
  exit 1
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
