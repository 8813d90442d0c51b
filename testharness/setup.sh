#!/bin/bash
# setup.sh: make sure this host can build verbsnet (README's first command runs it).
# Installs, when missing, the Debian packages the build needs: libclang-dev (bindgen over our
# ABI header and rdma-sys's verbs types), libibverbs-dev, librdmacm-dev and pkg-config
# (rdma-sys's build script), gcc and libc6-dev (verbsnet-perf's C logger and the test fixture
# plugin, built with the cc crate). Nothing links libibverbs at run time: the plugin loads it with
# dlopen when VERBSNET_TRANSPORT is ib or auto, so a host without rdma-core still runs tcp.
set -euo pipefail
PKGS=(libclang-dev libibverbs-dev librdmacm-dev pkg-config gcc libc6-dev)
missing=()
for p in "${PKGS[@]}"; do
  st=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
  [[ $st == ii* ]] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "setup: missing build packages: ${missing[*]}" >&2
  echo "setup: run as root, or: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
