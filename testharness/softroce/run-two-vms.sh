#!/bin/bash
# run-two-vms.sh: run a command in TWO throw-away soft-RoCE VMs at once, each with its own kernel
# and an rxe device on a virtio-net NIC, the two NICs joined by a virtual wire.
#
# usage: run-two-vms.sh [run-in-vm.sh options] [--] COMMAND [ARGS...]
#   The options (-w, -t, -T, -m, -c, -a) are run-in-vm.sh's and apply to both VMs; the defaults
#   here are -m 2G -c 1 (two TCG guests on a small host). COMMAND runs in both VMs, as root, in
#   the current directory, with the caller's environment plus, in each VM:
#     TWOVM_ROLE    a | b            TWOVM_INDEX  0 | 1
#     TWOVM_SELF    this VM's address on the wire (a: 192.0.2.1, b: 192.0.2.2); host name vm-a | vm-b
#     TWOVM_PEER    the other VM's address       TWOVM_IFNAME the NIC's name (eth0)
#   A command that needs a barrier or a file from the other VM uses a directory shared with -w
#   (both VMs see the same host directories).
#
# The wire: QEMU's socket netdev over UDP on 127.0.0.1 (`-netdev socket,udp=...,localaddr=...`,
# two free ports picked at start): every Ethernet frame one guest sends is one datagram to the
# other QEMU. No host interface, bridge, tap or address outside loopback is involved; a VM that
# stops (power-off, killed QEMU) just stops answering, as a host that loses power would.
#
# Output: each line is prefixed with "[a] " or "[b] ". Exit status: 0 when both commands
# exited 0; otherwise a's status if it is not 0, else b's (255: a VM or its setup failed, 124:
# -T timeout). Both statuses are printed on the last line ("run-two-vms: a exit X, b exit Y") and,
# with TWOVM_STATUS_FILE=PATH, written there as "X Y". A VM that fails to boot or set up (255)
# stops the other one (which would otherwise wait for its peer until -T), unless
# TWOVM_KEEP_SURVIVOR is set (trials where a VM powers itself off on purpose, also 255).
#
# Environment: SOFTROCE_MTU (both NICs, default 9000), SOFTROCE_MTU_A / SOFTROCE_MTU_B (one
# NIC each, e.g. a path-MTU mismatch), everything else run-in-vm.sh understands (SOFTROCE_*,
# except SOFTROCE_NETDEV and SOFTROCE_ADDR, which this script sets).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage() { sed -n '4,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }

opts=(-m 2G -c 1)
while getopts "w:t:T:m:c:a:h" opt; do
    case $opt in
        w | t | T | m | c | a) opts+=("-$opt" "$OPTARG") ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || usage

# Two UDP ports free on 127.0.0.1 (the kernel picks them; a tiny race with other users remains).
read -r port_a port_b < <(python3 -c '
import socket
s = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
for x in s:
    x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')

# vm ROLE INDEX LOCAL_PORT REMOTE_PORT MAC MTU: one VM, its output prefixed with the role
vm() {
    local role=$1 idx=$2 lport=$3 rport=$4 mac=$5 mtu=$6
    shift 6
    local nic="-netdev socket,id=wire,udp=127.0.0.1:$rport,localaddr=127.0.0.1:$lport"
    nic+=" -device virtio-net-pci,netdev=wire,mac=$mac"
    set +e
    env SOFTROCE_NETDEV=virtio SOFTROCE_ADDR="192.0.2.$((idx + 1))/24" SOFTROCE_MTU="$mtu" \
        TWOVM_ROLE="$role" TWOVM_INDEX="$idx" TWOVM_SELF="192.0.2.$((idx + 1))" \
        TWOVM_PEER="192.0.2.$((2 - idx))" TWOVM_IFNAME=eth0 SOFTROCE_HOSTNAME="vm-$role" \
        SOFTROCE_QEMU_EXTRA="${SOFTROCE_QEMU_EXTRA:-} $nic" SOFTROCE_PIDFILE="$piddir/$role" \
        "$HERE/run-in-vm.sh" "${opts[@]}" -- "$@" 2>&1 | sed -u "s/^/[$role] /"
    return "${PIPESTATUS[0]}"
}

piddir=$(mktemp -d /var/tmp/verbsnet-twovm.XXXXXX)
trap 'rm -rf "$piddir"' EXIT
mtu=${SOFTROCE_MTU:-9000}
vm a 0 "$port_a" "$port_b" 52:54:00:12:34:01 "${SOFTROCE_MTU_A:-$mtu}" "$@" &
pid_a=$!
vm b 1 "$port_b" "$port_a" 52:54:00:12:34:02 "${SOFTROCE_MTU_B:-$mtu}" "$@" &
pid_b=$!
# stop_vm ROLE: SIGTERM to that VM's QEMU (through its `timeout`), if it still runs
stop_vm() { [ -s "$piddir/$1" ] && kill "$(cat "$piddir/$1")" 2>/dev/null; return 0; }
trap 'stop_vm a; stop_vm b' INT TERM
set +e
# When one VM fails to boot or set up (255), the other would wait for it: stop it too.
wait -n -p first "$pid_a" "$pid_b"; rc_first=$?
if [ "$first" = "$pid_a" ]; then
    rc_a=$rc_first
    [ "$rc_a" = 255 ] && [ -z "${TWOVM_KEEP_SURVIVOR:-}" ] && stop_vm b
    wait "$pid_b"; rc_b=$?
else
    rc_b=$rc_first
    [ "$rc_b" = 255 ] && [ -z "${TWOVM_KEEP_SURVIVOR:-}" ] && stop_vm a
    wait "$pid_a"; rc_a=$?
fi
set -e
echo "run-two-vms: a exit $rc_a, b exit $rc_b"
[ -n "${TWOVM_STATUS_FILE:-}" ] && echo "$rc_a $rc_b" > "$TWOVM_STATUS_FILE"
[ "$rc_a" != 0 ] && exit "$rc_a"
exit "$rc_b"
