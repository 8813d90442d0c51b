#!/bin/bash
# build-initramfs.sh [CACHE_DIR]: prepare the boot files of the soft-RoCE VM in CACHE_DIR
# (default $SOFTROCE_CACHE or /var/tmp/verbsnet-softroce):
#   initramfs.cpio.gz  static busybox, the virtio/9p modules of the host's Debian kernel, and
#                      initramfs-init.sh as /init (mounts the host root over 9p and chroots)
#   vmlinuz            that kernel (bzImage)
#   vmlinux            the same kernel uncompressed (ELF); QEMU boots it through its PVH entry,
#                      which saves the ~5 s of in-guest XZ decompression under TCG
#   kver               the kernel version the files belong to
# Needs: linux-image-amd64 busybox-static kmod cpio python3 (see install-deps.sh). < 1 s.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${1:-${SOFTROCE_CACHE:-/var/tmp/verbsnet-softroce}}

die() { echo "build-initramfs: $*" >&2; exit 1; }

# newest Debian kernel whose modules are installed
KVER=${KVER:-$(for d in /lib/modules/*-amd64; do [ -d "$d" ] && echo "${d##*/}"; done | sort -V | tail -n 1)}
if [ -z "$KVER" ] || [ ! -f "/boot/vmlinuz-$KVER" ]; then
    die "no Debian kernel in /boot and /lib/modules (run install-deps.sh: linux-image-amd64)"
fi
BUSYBOX=$(command -v busybox || true)
[ -n "$BUSYBOX" ] || die "busybox not found (busybox-static)"
if LC_ALL=C ldd "$BUSYBOX" >/dev/null 2>&1; then
    die "$BUSYBOX is dynamically linked; the initramfs needs busybox-static"
fi

mkdir -p "$CACHE"
ROOT=$(mktemp -d)
trap 'rm -rf "$ROOT"' EXIT
mkdir -p "$ROOT"/{bin,dev,proc,sys,job,newroot,etc,lib/mod}
cp "$BUSYBOX" "$ROOT/bin/busybox"
for applet in sh mount insmod mkdir cat echo chroot poweroff sync sleep; do
    ln -s busybox "$ROOT/bin/$applet"
done
printf '#!/bin/sh\nexec /bin/chroot /newroot /sbin/modprobe "$@"\n' > "$ROOT/bin/modprobe-in-root"
chmod 755 "$ROOT/bin/modprobe-in-root"
install -m 755 "$HERE/initramfs-init.sh" "$ROOT/init"

# Only what is needed to reach the host root: virtio-pci and 9p, with their dependencies in load
# order. Everything else (ib_core, rdma_rxe, dummy, ...) comes from the host root later.
: > "$ROOT/etc/modules.list"
for m in virtio_pci 9pnet_virtio 9p; do
    modprobe -S "$KVER" --show-depends "$m"
done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' | while read -r path; do
    name=$(basename "$path")
    case "$name" in
        *.ko.xz)  name=${name%.xz};  xz -dc "$path" > "$ROOT/lib/mod/$name" ;;
        *.ko.zst) name=${name%.zst}; zstd -qdc "$path" > "$ROOT/lib/mod/$name" ;;
        *.ko)     cp "$path" "$ROOT/lib/mod/$name" ;;
        *) die "unexpected module file $path" ;;
    esac
    echo "$name" >> "$ROOT/etc/modules.list"
done

(cd "$ROOT" && find . | cpio -o -H newc --quiet | gzip -1) > "$CACHE/initramfs.cpio.gz.new"
mv "$CACHE/initramfs.cpio.gz.new" "$CACHE/initramfs.cpio.gz"
cp "/boot/vmlinuz-$KVER" "$CACHE/vmlinuz.new" && mv "$CACHE/vmlinuz.new" "$CACHE/vmlinuz"

# The bzImage carries the kernel as an XZ stream; unpack it to the ELF vmlinux.
rm -f "$CACHE/vmlinux"
if command -v python3 >/dev/null; then
    # shellcheck disable=SC2015 # the fallback also covers a failing mv
    python3 - "$CACHE/vmlinuz" "$CACHE/vmlinux.new" <<'PY' && mv "$CACHE/vmlinux.new" "$CACHE/vmlinux" \
        || { rm -f "$CACHE/vmlinux.new"; echo "build-initramfs: no vmlinux (booting the bzImage, ~5 s slower)" >&2; }
import lzma, sys
blob = open(sys.argv[1], "rb").read()
start = blob.find(b"\xfd7zXZ\x00")
if start < 0:
    sys.exit(1)
elf = lzma.LZMADecompressor().decompress(blob[start:])
if not elf.startswith(b"\x7fELF"):
    sys.exit(1)
open(sys.argv[2], "wb").write(elf)
PY
fi
echo "$KVER" > "$CACHE/kver"
echo "build-initramfs: $CACHE ready for kernel $KVER" >&2
