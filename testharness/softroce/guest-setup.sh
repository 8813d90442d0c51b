#!/bin/bash
# guest-setup.sh: runs INSIDE the VM (chrooted into the host root, as root) before the user's
# command; loads soft-RoCE and creates the rxe device(s). run-in-vm.sh copies it into the job.
#
# Settings (taken from the caller's environment):
#   SOFTROCE_NETDEV  dummy  rxe0 on a dummy netdev `rxenet0` (192.0.2.1/32). Default. Enough for
#                           loopback traffic between QPs of rxe0 (rxe delivers packets addressed
#                           to its own MAC locally).
#                    veth   rxe0 on `rxenet0` (192.0.2.1/24) of a veth pair; SOFTROCE_NDEVS=2 also
#                           puts rxe1 on the peer `rxenet1` (192.0.2.2/24). rxe0<->rxe1 traffic
#                           only works with GID index 0 (the IPv4 route to a local address goes
#                           through lo).
#                    lo     rxe0 on lo (127.0.0.1); only GID index 1 works.
#                    virtio rxe0 on the VM's virtio-net NIC (run-two-vms.sh gives each VM one,
#                           wired to the other VM), address SOFTROCE_ADDR (e.g. 192.0.2.1/24).
#                    none   set up nothing.
#   SOFTROCE_NDEVS   1 (default) or 2 (veth only)
#   SOFTROCE_MTU     netdev MTU (default 9000 => active_mtu 4096; 1500 => 1024)
#   SOFTROCE_ADDR    address/prefix of the virtio NIC (virtio only; default 192.0.2.1/24)
#   SOFTROCE_HOSTNAME the guest's host name (default: unchanged, "(none)")
#   SOFTROCE_DECOYS  space-separated NAME=ADDR/PREFIX: dummy netdevs made up and given an address
#                    BEFORE the NIC, so that they come first in interface order (e.g.
#                    "docker0=172.17.0.1/16", to test the choice of the set-up interface)
set -u
say() { echo "guest-setup: $*" >&2; }
NETDEV=${SOFTROCE_NETDEV:-dummy}
NDEVS=${SOFTROCE_NDEVS:-1}
MTU=${SOFTROCE_MTU:-9000}
[ "$NETDEV" = none ] && exit 0

# crc32_generic: rxe computes its ICRC with the kernel's "crc32" shash
modprobe -a crc32_generic ib_core ib_uverbs rdma_ucm rdma_rxe || { say "modprobe failed"; exit 1; }
ip link set lo up
[ -n "${SOFTROCE_HOSTNAME:-}" ] && hostname "$SOFTROCE_HOSTNAME"
if [ -n "${SOFTROCE_DECOYS:-}" ]; then
    modprobe dummy numdummies=0
    for d in $SOFTROCE_DECOYS; do
        ip link add "${d%%=*}" type dummy && ip link set "${d%%=*}" up \
            && ip addr add "${d#*=}" dev "${d%%=*}" || { say "decoy $d failed"; exit 1; }
    done
fi

netdevs=()
case "$NETDEV" in
dummy)
    [ "$NDEVS" = 1 ] || { say "SOFTROCE_NDEVS=$NDEVS needs SOFTROCE_NETDEV=veth"; exit 1; }
    modprobe dummy numdummies=0
    ip link add rxenet0 type dummy || exit 1
    ip link set rxenet0 mtu "$MTU" up
    ip addr add 192.0.2.1/32 dev rxenet0
    netdevs=(rxenet0)
    ;;
veth)
    modprobe veth
    ip link add rxenet0 type veth peer name rxenet1 || exit 1
    for i in 0 1; do
        # No duplicate address detection: the pair is alone on its link, and while DAD runs
        # (about a second after the link comes up) the IPv6 link-local address behind GID 0,
        # the only GID through which rxe0 and rxe1 reach each other, is tentative.
        sysctl -qw "net.ipv6.conf.rxenet$i.accept_dad=0" 2>/dev/null || true
        ip link set "rxenet$i" mtu "$MTU" up
        ip addr add "192.0.2.$((i + 1))/24" dev "rxenet$i"
    done
    netdevs=(rxenet0)
    [ "$NDEVS" -ge 2 ] && netdevs=(rxenet0 rxenet1)
    ;;
lo)
    netdevs=(lo)
    ;;
virtio)
    # The kernel names it (no udev here): the netdev whose driver is virtio_net.
    modprobe virtio_net || { say "modprobe virtio_net failed"; exit 1; }
    nic=
    for _ in $(seq 100); do
        for d in /sys/class/net/*; do
            [ "$(basename "$(readlink -f "$d/device/driver" 2>/dev/null)")" = virtio_net ] \
                && nic=${d##*/} && break
        done
        [ -n "$nic" ] && break
        sleep 0.05
    done
    [ -n "$nic" ] || { say "no virtio-net NIC in this VM"; exit 1; }
    ip link set "$nic" mtu "$MTU" || { say "ip link set $nic mtu $MTU failed"; exit 1; }
    ip link set "$nic" up
    ip addr add "${SOFTROCE_ADDR:-192.0.2.1/24}" dev "$nic" || exit 1
    netdevs=("$nic")
    ;;
*)
    say "unknown SOFTROCE_NETDEV=$NETDEV (dummy|veth|lo|virtio|none)"
    exit 1
    ;;
esac

for i in "${!netdevs[@]}"; do
    rdma link add "rxe$i" type rxe netdev "${netdevs[$i]}" \
        || { say "rdma link add rxe$i netdev ${netdevs[$i]} failed"; exit 1; }
done

# The GID table is filled asynchronously; wait (up to ~10 s) for the IPv4-mapped RoCE v2 GID at
# index 1 of every device.
for _ in $(seq 200); do
    ready=1
    for i in "${!netdevs[@]}"; do
        grep -qs '^0000:0000:0000:0000:0000:ffff:' "/sys/class/infiniband/rxe$i/ports/1/gids/1" || ready=0
    done
    [ "$ready" = 1 ] && break
    sleep 0.05
done
[ "$ready" = 1 ] || say "warning: the IPv4-mapped GID did not show up"
# Two devices reach each other through GID 0 (IPv6 link-local): wait for it on both, not
# tentative.
if [ "${#netdevs[@]}" -ge 2 ]; then
    for _ in $(seq 200); do
        ready=1
        for i in "${!netdevs[@]}"; do
            grep -qs '^fe80:' "/sys/class/infiniband/rxe$i/ports/1/gids/0" || ready=0
            ip -6 addr show dev "${netdevs[$i]}" 2>/dev/null | grep -q tentative && ready=0
        done
        [ "$ready" = 1 ] && break
        sleep 0.05
    done
    [ "$ready" = 1 ] || say "warning: the link-local GID 0 did not show up on every device"
fi
[ -e /dev/infiniband/uverbs0 ] || { say "/dev/infiniband/uverbs0 is missing"; exit 1; }
exit 0
