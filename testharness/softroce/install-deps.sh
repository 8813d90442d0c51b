#!/bin/bash
# install-deps.sh: install (with apt-get) whatever the soft-RoCE VM harness and the ib transport
# build need and is not installed yet. Debian 12 / Ubuntu 22.04+ hosts, run as root.
#
#   testharness/softroce/install-deps.sh          # install what is missing
#   testharness/softroce/install-deps.sh --check  # only list what is missing (exit 1 if any)
#
# The list, by role:
#   VM:        qemu-system-x86 (TCG is enough), linux-image-amd64 (a distro kernel that ships
#              rdma_rxe.ko, ib_uverbs.ko and the virtio/9p modules), busybox-static (the initramfs
#              shell), kmod (modprobe --show-depends), cpio, python3 (kernel ELF extraction),
#              iproute2 (`ip`, `rdma` inside the guest), xz-utils
#   verbs:     rdma-core, ibverbs-providers (librxe), ibverbs-utils (ibv_devinfo),
#              libibverbs1, perftest (optional perf sanity)
#   build:     libibverbs-dev, librdmacm-dev, pkg-config (rdma-sys's build script),
#              libclang-dev (bindgen)
set -euo pipefail
PKGS=(qemu-system-x86 linux-image-amd64 busybox-static kmod cpio python3 iproute2 xz-utils
      rdma-core ibverbs-providers ibverbs-utils libibverbs1 perftest
      libibverbs-dev librdmacm-dev pkg-config libclang-dev)
missing=()
for p in "${PKGS[@]}"; do
  st=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
  [[ $st == ii* ]] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi
echo "install-deps: missing: ${missing[*]}"
[ "${1:-}" = --check ] && exit 1
[ "$(id -u)" = 0 ] || { echo "install-deps: run as root (apt-get install)" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# INITRD=No: the kernel package's postinst would otherwise run update-initramfs, which is slow
# (most of the install time) and useless here: the VM boots our own initramfs.
INITRD=No apt-get install -y -q --no-install-recommends "${missing[@]}"
