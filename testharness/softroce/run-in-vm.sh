#!/bin/bash
# run-in-vm.sh: run a command inside a throw-away QEMU VM that has a real soft-RoCE device
# (rdma_rxe `rxe0`), on a host whose own kernel has no RDMA.
#
# usage: run-in-vm.sh [options] [--] COMMAND [ARGS...]
#   -w DIR   share DIR read-write at the same path (repeatable; default: the current directory).
#            The rest of the host's / is visible read-only.
#   -t DIR   put an empty tmpfs on DIR inside the VM (repeatable; DIR must exist), e.g. caches
#   -T SEC   kill the VM after SEC seconds (default 1800) and exit 124
#   -m MEM   guest memory (default 4G)          -c N  guest vCPUs (default: all host CPUs)
#   -a ACCEL tcg | kvm | auto (default auto: kvm when usable, else tcg)
#
# The guest's root is the host's root over virtio-9p, so host-built binaries run unchanged.
# COMMAND runs as root, in the same working directory, with the caller's environment (minus
# terminal/session variables). Its output is streamed to stdout; the exit status is COMMAND's,
# 255 when the VM or the rxe setup failed, 124 on timeout. The VM has no NIC: nothing leaves it.
#
# Environment: SOFTROCE_NETDEV, SOFTROCE_NDEVS, SOFTROCE_MTU (see guest-setup.sh);
#   SOFTROCE_CACHE (kernel/initramfs cache, default /var/tmp/verbsnet-softroce);
#   SOFTROCE_VERBOSE=1 (kernel messages on the console); SOFTROCE_QEMU_EXTRA (more QEMU args);
#   SOFTROCE_PIDFILE (the VM's stoppable pid is written there).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage() { sed -n '4,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }

shares=(); tmpfs=(); timeout_s=1800; mem=4G; cpus=$(nproc); accel=auto
while getopts "w:t:T:m:c:a:h" opt; do
    case $opt in
        w) shares+=("$(realpath "$OPTARG")") ;;
        t) tmpfs+=("$(realpath "$OPTARG")") ;;
        T) timeout_s=$OPTARG ;;
        m) mem=$OPTARG ;;
        c) cpus=$OPTARG ;;
        a) accel=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || usage
[ ${#shares[@]} -gt 0 ] || shares=("$(pwd)")
for d in "${shares[@]}" "${tmpfs[@]}"; do
    case "$d" in *[[:space:]]*) echo "run-in-vm: paths with spaces are not supported: $d" >&2; exit 2 ;; esac
done

# --- boot files: (re)build when missing, for another kernel, or older than their sources
cache=${SOFTROCE_CACHE:-/var/tmp/verbsnet-softroce}
mkdir -p "$cache"
kver=$(for d in /lib/modules/*-amd64; do [ -d "$d" ] && echo "${d##*/}"; done | sort -V | tail -n 1)
(
    flock 9   # several runs may start at once
    if [ ! -f "$cache/initramfs.cpio.gz" ] || [ "$(cat "$cache/kver" 2>/dev/null)" != "$kver" ] \
        || [ "$HERE/build-initramfs.sh" -nt "$cache/initramfs.cpio.gz" ] \
        || [ "$HERE/initramfs-init.sh" -nt "$cache/initramfs.cpio.gz" ]; then
        "$HERE/build-initramfs.sh" "$cache"
    fi
) 9> "$cache/.lock"

# --- the job share: what the guest's /init and stage2 read, and where the status comes back
job=$(mktemp -d /var/tmp/verbsnet-vmjob.XXXXXX)
trap 'rm -rf "$job"' EXIT
printf 'RW_DIRS="%s"\nTMPFS_DIRS="%s"\nKERNEL_LOG=%s\n' "${shares[*]}" "${tmpfs[*]:-}" \
    "${SOFTROCE_VERBOSE:-0}" > "$job/config"
while IFS= read -r -d '' entry; do
    name=${entry%%=*}
    [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
    case $name in
        PWD | OLDPWD | SHLVL | _ | TERM | HOSTNAME | DISPLAY | SSH_* | TMUX* | BASH_FUNC_*) continue ;;
    esac
    printf 'export %s=%q\n' "$name" "${entry#*=}"
done < <(env -0) > "$job/env.sh"
{
    printf 'cd %q || exit 255\n' "$(pwd)"
    printf '%q ' "$@"
    echo
} > "$job/cmd.sh"
cp "$HERE/guest-setup.sh" "$job/guest-setup.sh"
cat > "$job/stage2.sh" <<'STAGE2'
# runs in the guest, chrooted into the host root (see initramfs-init.sh)
. /run/vmjob/env.sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH TERM=dumb
ulimit -l unlimited 2>/dev/null   # memory registration pins pages
ulimit -n 65536 2>/dev/null
bash /run/vmjob/guest-setup.sh || { echo "run-in-vm: rxe setup failed in the guest" >&2; exit 255; }
bash /run/vmjob/cmd.sh
STAGE2

# --- accelerator. This workplace's /dev/kvm is kvm_pvm, which cannot boot a stock kernel: use TCG.
if [ "$accel" = auto ]; then
    accel=tcg
    if [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ]; then accel=kvm; fi
fi
# shellcheck disable=SC2054 # the commas belong to one QEMU argument
case "$accel" in
    kvm) accel_args=(-accel kvm -cpu host) ;;
    tcg) accel_args=(-accel tcg,thread=multi,tb-size=512 -cpu max) ;;
    *) echo "run-in-vm: unknown accelerator $accel" >&2; exit 2 ;;
esac
kernel=$cache/vmlinuz
[ -f "$cache/vmlinux" ] && kernel=$cache/vmlinux
# no_timer_check: on a loaded host a TCG guest can fail the boot-time IO-APIC timer check and
# panic ("IO-APIC + timer doesn't work"), seen with two VMs booting at once.
cmdline="console=ttyS0 panic=-1 mitigations=off tsc=reliable no_timer_check quiet loglevel=1"
[ "${SOFTROCE_VERBOSE:-0}" = 1 ] && cmdline="console=ttyS0 panic=-1 mitigations=off tsc=reliable no_timer_check loglevel=7"

qemu=(qemu-system-x86_64 -nodefaults -no-user-config -display none -no-reboot
    "${accel_args[@]}" -machine q35 -m "$mem" -smp "$cpus"
    -kernel "$kernel" -initrd "$cache/initramfs.cpio.gz" -append "$cmdline"
    -serial stdio
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
    -virtfs "local,path=$job,mount_tag=job,security_model=none")
for i in "${!shares[@]}"; do
    qemu+=(-virtfs "local,path=${shares[$i]},mount_tag=share$i,security_model=none,multidevs=remap")
done
# shellcheck disable=SC2206 # word splitting wanted
qemu+=(${SOFTROCE_QEMU_EXTRA:-})

set +e
timeout -k 10 "$timeout_s" "${qemu[@]}" < /dev/null &
qemu_pid=$!
# SOFTROCE_PIDFILE: where a caller (run-two-vms.sh) finds the VM to stop it (SIGTERM)
[ -n "${SOFTROCE_PIDFILE:-}" ] && echo "$qemu_pid" > "$SOFTROCE_PIDFILE"
wait "$qemu_pid"
qemu_rc=$?
set -e
if [ "$qemu_rc" = 124 ] || [ "$qemu_rc" = 137 ]; then
    echo "run-in-vm: timed out after ${timeout_s}s" >&2
    exit 124
fi
if [ ! -s "$job/rc" ]; then
    echo "run-in-vm: the VM stopped (qemu status $qemu_rc) without reporting a result" >&2
    exit 255
fi
exit "$(cat "$job/rc")"
