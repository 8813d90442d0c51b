#!/bin/sh
# /init of the soft-RoCE VM (busybox sh, PID 1). Copied into the initramfs by
# build-initramfs.sh; not meant to run on the host.
#
# 1. load the virtio + 9p modules the initramfs carries,
# 2. mount the `job` share (config, env and command from run-in-vm.sh) and the host's root
#    filesystem (`hostroot`, read-only) at /newroot,
# 3. give the new root fresh proc/sys/dev and tmpfs scratch dirs, mount the rw shares,
# 4. chroot into it and run the job's stage2.sh; write its exit status to /job/rc; power off.
export PATH=/bin
KERNEL_LOG=0
NEW=/newroot
P9="trans=virtio,version=9p2000.L,msize=512000"

off() {
    sync
    # keep "reboot: Power down" off the console unless kernel messages were asked for
    [ "$KERNEL_LOG" = 1 ] || echo 0 > /proc/sys/kernel/printk
    poweroff -f
}

fail() {
    echo "vm-init: $*"
    echo 255 > /job/rc 2>/dev/null
    off
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
while read -r ko; do
    insmod "/lib/mod/$ko" || echo "vm-init: insmod $ko failed"
done < /etc/modules.list

mount -t 9p -o "$P9,cache=none" job /job || fail "cannot mount the job share"
# shellcheck disable=SC1091 # written by run-in-vm.sh
. /job/config
mount -t 9p -o "$P9,ro,cache=loose" hostroot "$NEW" || fail "cannot mount the host root"

# The kernel runs /proc/sys/kernel/modprobe for request_module() (rdma_rxe asks for the crc32
# shash that way); that path resolves in the initramfs, so forward it into the host root.
echo /bin/modprobe-in-root > /proc/sys/kernel/modprobe

mount -t proc proc "$NEW/proc"
mount -t sysfs sysfs "$NEW/sys"
mount -t devtmpfs devtmpfs "$NEW/dev"
mkdir -p "$NEW/dev/pts" "$NEW/dev/shm" 2>/dev/null
mount -t devpts devpts "$NEW/dev/pts"
for d in /dev/shm /tmp /var/tmp; do
    mount -t tmpfs -o mode=1777 tmpfs "$NEW$d"
done
mount -t tmpfs -o mode=755 tmpfs "$NEW/run"
for d in $TMPFS_DIRS; do
    mount -t tmpfs -o mode=755 tmpfs "$NEW$d" || echo "vm-init: tmpfs on $d failed"
done
mkdir -p "$NEW/run/vmjob"
mount --bind /job "$NEW/run/vmjob"
n=0
for d in $RW_DIRS; do
    # the mount point may lie under a fresh tmpfs (/tmp, /var/tmp): recreate it there
    mkdir -p "$NEW$d" 2>/dev/null
    mount -t 9p -o "$P9,cache=mmap" "share$n" "$NEW$d" || fail "cannot mount share$n on $d"
    n=$((n + 1))
done

chroot "$NEW" /bin/bash /run/vmjob/stage2.sh
rc=$?
echo "$rc" > /job/rc
off
