#!/bin/bash
# twohost-suite.sh: the plugin across TWO soft-RoCE hosts (two VMs, two kernels, one virtual wire;
# run-two-vms.sh), in one boot of each. CI runs it after vm-suite.sh.
#
# usage: testharness/softroce/twohost-suite.sh
# env:   TWOHOST_TIMEOUT (seconds for the VMs, default 600), TWOHOST_LOGS (per-step logs,
#        default target/twohost-suite), plus what run-two-vms.sh / run-in-vm.sh understand.
#
# On the host it builds the plugin and verbsnet-perf (`cargo build --release --workspace`, what CI
# ran before: nothing is rebuilt), then boots vm-a (192.0.2.1) and vm-b (192.0.2.2), each with a
# decoy `docker0` carrying 172.17.0.1/16 that comes BEFORE the NIC in interface order (what a
# Docker host looks like: the same docker0 address on every host). Every step runs
# verbsnet-perf in its multi-host mode (--rank/--nranks/--master 192.0.2.1:PORT, the rendezvous
# over the wire), ranks 0..k-1 on vm-a and the rest on vm-b, over ib, small sizes:
#   allreduce_2x1          all_reduce, 2 ranks, one per host
#   allreduce_2x2          all_reduce, 4 ranks, two per host
#   sendrecv_2x1           sendrecv, 2 ranks
#   alltoall_2x2_shared4   alltoall, 4 ranks, --shared-comms 4 (skewed senders)
#   allreduce_2x2_4qp_sS   all_reduce, 4 ranks, VERBSNET_IB_QPS_PER_CONNECTION=4, split S (0: round
#                          robin, 1: VERBSNET_IB_SPLIT_DATA_ON_QPS=1); the logs say "4 QPs"
#   alltoall_2x2_4qp_sS    alltoall --shared-comms 4 up to 1 MiB with 4 QPs, split S
#   ifname_eth0            sendrecv with NCCL_SOCKET_IFNAME=eth0
#   ifname_exclude_exact   sendrecv with VERBSNET_SOCKET_IFNAME=^=docker0,lo and
#                          NCCL_SOCKET_IFNAME=docker0 (VERBSNET's wins)
#   family_inet6           sendrecv with NCCL_SOCKET_FAMILY=AF_INET6 (ULA fd00::1/2 on eth0)
#   mtu_1500_9000          sendrecv with vm-b's NIC at MTU 1500 (vm-a 9000): both QPs 1024,
#                          and the INFO line says it is the smaller of the two ports
# A step passes when every rank exits 0, rank 0 reports no wrong element, and on EACH host the
# log names rxe0, the automatic GID (index 1, this host's ::ffff:192.0.2.x, never fe80::), the
# path MTU, and the out-of-band address on eth0 (never the decoy). One PASS/FAIL line per step
# (printed by vm-a), then "twohost-suite: N passed, M failed"; exit 0 only when all passed.
# After a failed step vm-a checks that vm-b still answers on the wire; if not (the emulated
# wire broke: "WIRE" line), both stop and the host boots them again once (exit 3 if it breaks
# again).
# Logs: $TWOHOST_LOGS/<step>.rank<R>.log. ~2-3 min on 2 cores (boot ~15 s, steps 5-20 s each).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"

# ----------------------------------------------------------------------------------- guest side
if [ "${1:-}" = --guest ]; then
    set +e
    logs=$2
    # shellcheck source=/dev/null
    . "$logs/manifest.env" # PLUGIN_SO, PERF_BIN
    role=$TWOVM_ROLE idx=$TWOVM_INDEX other=a
    [ "$role" = a ] && other=b
    passed=0; failed=0; failures=()
    secs() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f s", b - a }'; }
    # wire_up: whether the other host answers on the wire. A TCP connect to a port nobody
    # listens on (9) is refused by a live peer at once; a broken wire gives "No route to host"
    # (ARP failed) or no answer. Needs nothing but bash (the guest has no ping).
    wire_up() {
        local out
        out=$(timeout 5 bash -c "exec 3<>/dev/tcp/$TWOVM_PEER/9" 2>&1)
        [[ $out == *"Connection refused"* ]]
    }
    # barrier NAME: both hosts reach NAME (files in the shared log directory), 180 s at most;
    # exit 3 once the other host found the wire down
    barrier() {
        : > "$logs/.barrier.$1.$role"
        local i
        for i in $(seq 1800); do
            [ -e "$logs/.barrier.$1.$other" ] && return 0
            [ -e "$logs/.wire_down" ] && exit 3
            sleep 0.1
        done
        # the other VM is gone or stuck: every later step would wait as long
        echo "twohost-suite: FAIL  vm-$role: the other host never reached $1; stopping"
        exit 1
    }
    port=29500

    # perf_step NAME PER_HOST [VAR=VALUE...] -- VERBSNET-PERF ARGS...
    perf_step() {
        local name=$1 per=$2 t0 envs=() pids=() r j rc=0 missing=() mtu_want= qps_want=
        shift 2
        while [ "$1" != -- ]; do envs+=("$1"); shift; done
        shift
        for e in "${envs[@]}"; do
            [[ $e == MTU_WANT=* ]] && mtu_want=${e#MTU_WANT=}
            [[ $e == QPS_WANT=* ]] && qps_want=${e#QPS_WANT=}
        done
        port=$((port + 1))
        barrier "$name.start" || return
        t0=$(date +%s.%N)
        for j in $(seq 0 $((per - 1))); do
            r=$((idx * per + j))
            env VERBSNET_DEBUG=info NCCL_NET_PLUGIN="$PLUGIN_SO" "${envs[@]}" \
                timeout -k 5 150 "$PERF_BIN" "$@" --transport ib --rank "$r" --nranks $((2 * per)) \
                --master "192.0.2.1:$port" > "$logs/$name.rank$r.log" 2>&1 &
            pids+=($!)
        done
        for j in "${!pids[@]}"; do
            wait "${pids[$j]}" || { rc=$?; missing+=("rank $((idx * per + j)) exit $rc"); }
        done
        local mine=()
        for j in $(seq 0 $((per - 1))); do mine+=("$logs/$name.rank$((idx * per + j)).log"); done
        if [ "$role" = a ]; then
            local bad
            bad=$(awk '/^ *[0-9]+ +[0-9]+ / && NF >= 13 && ($9 != "0" || $13 != "0")' "${mine[0]}")
            [ -z "$bad" ] || missing+=("wrong elements: $bad")
            grep -q 'Out of bounds values : 0 OK' "${mine[0]}" || missing+=("no 'Out of bounds values : 0 OK'")
            grep -qE '^ *[0-9]+ +[0-9]+ ' "${mine[0]}" || missing+=("no result rows")
        fi
        local l gidline mtus oob
        for l in "${mine[@]}"; do
            gidline=$(grep -m1 'GID chosen' "$l")
            [[ $gidline == *"dev=rxe0:1 gid_index=1 gid=::ffff:$TWOVM_SELF"* ]] \
                || missing+=("${l##*/}: not the automatic IPv4-mapped GID of rxe0 (${gidline:-none})")
            ! grep -q 'gid=fe80' "$l" || missing+=("${l##*/}: a link-local GID")
            mtus=$(grep 'QP connected' "$l" | grep -oE '(^|[ ,])mtu=[0-9]+' | tr -d ' ,' | sort -u | tr '\n' ' ')
            [ -n "$mtus" ] || missing+=("${l##*/}: no path MTU line")
            [ -z "$mtu_want" ] || [ "$mtus" = "mtu=$mtu_want " ] \
                || missing+=("${l##*/}: path MTU ${mtus:-none}, want $mtu_want")
            [ -z "$mtu_want" ] || grep -q 'path MTU is the smaller of' "$l" \
                || missing+=("${l##*/}: no INFO line on the MTU mismatch")
            [ -z "$qps_want" ] || grep -q "connected.*$qps_want QPs" "$l" \
                || missing+=("${l##*/}: no comm connected with $qps_want QPs")
            oob=$(grep -m1 -oE 'out-of-band address [^ ;]+( \([^)]*\))?' "$l")
            [[ $oob == *"$TWOVM_SELF"* || ($name == family_inet6 && $oob == *"fd00::$((idx + 1))"*) ]] \
                || missing+=("${l##*/}: ${oob:-no out-of-band address}")
        done
        {
            if [ ${#missing[@]} = 0 ]; then
                echo "PASS vm-$role: ${gidline#*dev=} ${mtus}${oob}"
            else
                echo "FAIL vm-$role: ${missing[*]}"
            fi
            echo "TIME $(secs "$t0")"
        } > "$logs/.result.$name.$role"
        barrier "$name.end" || return
        [ "$role" = a ] || return 0
        local ra rb
        ra=$(head -n 1 "$logs/.result.$name.a"); rb=$(head -n 1 "$logs/.result.$name.b" 2>/dev/null)
        if [[ $ra == PASS* && $rb == PASS* ]]; then
            passed=$((passed + 1))
            printf 'twohost-suite: PASS  %-22s %s | %s (%s)\n' "$name" "${ra#PASS }" "${rb#PASS }" \
                "$(sed -n 's/^TIME //p' "$logs/.result.$name.a")"
        else
            failed=$((failed + 1)); failures+=("$name")
            printf 'twohost-suite: FAIL  %-22s %s | %s\n' "$name" "$ra" "${rb:-vm-b: no result}"
            for l in "$logs/$name".rank*.log; do
                echo "---- last lines of $l"; tail -n 15 "$l" | sed 's/^/    /'
            done
            # A dead virtual wire (QEMU's socket netdev between the VMs; seen once mid-step,
            # both VMs alive) fails this step and every later one: say so and stop.
            if ! wire_up; then
                echo "twohost-suite: WIRE  vm-b ($TWOVM_PEER) no longer answers on the wire (a TCP" \
                    "connect to it was not refused): the emulated network between the VMs failed" \
                    "during $name, not necessarily the plugin; stopping"
                : > "$logs/.wire_down"
                exit 3
            fi
        fi
    }

    echo "twohost-suite: vm-$role: kernel $(uname -r), $(nproc) vCPU, $(ip -br addr | tr -s ' ' | tr '\n' ';')"
    small=(-b 8 -e 1M -f 8 -n 2 -w 1 -T 120)
    perf_step allreduce_2x1 1 -- all_reduce "${small[@]}"
    perf_step allreduce_2x2 2 -- all_reduce "${small[@]}"
    perf_step sendrecv_2x1 1 -- sendrecv "${small[@]}"
    perf_step alltoall_2x2_shared4 2 -- alltoall --shared-comms 4 -b 16K -e 256K -f 16 --chunk 4K \
        -n 2 -w 1 --skew-us 300 -T 120
    # several QPs per connection (issue 23): data pieces on QPs 1..3 race QP 0 across the wire
    for sp in 0 1; do
        perf_step "allreduce_2x2_4qp_s$sp" 2 VERBSNET_IB_QPS_PER_CONNECTION=4 \
            VERBSNET_IB_SPLIT_DATA_ON_QPS=$sp QPS_WANT=4 -- all_reduce "${small[@]}"
        perf_step "alltoall_2x2_4qp_s$sp" 2 VERBSNET_IB_QPS_PER_CONNECTION=4 \
            VERBSNET_IB_SPLIT_DATA_ON_QPS=$sp QPS_WANT=4 -- alltoall --shared-comms 4 -b 16K -e 1M -f 8 \
            --chunk 64K -n 2 -w 1 --skew-us 300 -T 120
    done
    tiny=(-b 8 -e 64K -f 32 -n 2 -w 1 -T 120)
    perf_step ifname_eth0 1 NCCL_SOCKET_IFNAME=eth0 -- sendrecv "${tiny[@]}"
    # VERBSNET_SOCKET_IFNAME wins over NCCL_SOCKET_IFNAME (docker0 would not reach the peer)
    perf_step ifname_exclude_exact 1 'VERBSNET_SOCKET_IFNAME=^=docker0,lo' NCCL_SOCKET_IFNAME=docker0 \
        -- sendrecv "${tiny[@]}"
    ip -6 addr add "fd00::$((idx + 1))/64" dev "$TWOVM_IFNAME" nodad
    perf_step family_inet6 1 NCCL_SOCKET_FAMILY=AF_INET6 -- sendrecv "${tiny[@]}"
    ip -6 addr del "fd00::$((idx + 1))/64" dev "$TWOVM_IFNAME"
    # rxe follows its netdev's MTU (1500 -> path MTU 1024); the QPs take the smaller of both ends
    [ "$role" = b ] && ip link set "$TWOVM_IFNAME" mtu 1500
    sleep 0.5
    perf_step mtu_1500_9000 1 MTU_WANT=1024 -- sendrecv -b 8 -e 256K -f 8 -n 2 -w 1 -T 120
    [ "$role" = b ] && ip link set "$TWOVM_IFNAME" mtu 9000
    [ "$role" = a ] || exit 0
    echo "twohost-suite: $passed passed, $failed failed${failures[*]:+ (${failures[*]})}"
    [ "$failed" = 0 ]
    exit
fi

# ------------------------------------------------------------------------------------ host side
logs=${TWOHOST_LOGS:-$ROOT/target/twohost-suite}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
rm -f "$logs"/*.log "$logs"/.barrier.* "$logs"/.result.*
t0=$(date +%s)
echo "twohost-suite: building the plugin and verbsnet-perf (cargo build --release --workspace)" >&2
cargo build --release --workspace
so=$ROOT/target/release/libnccl-net-verbsnet.so
perf=$ROOT/target/release/verbsnet-perf
printf 'PLUGIN_SO=%q\nPERF_BIN=%q\n' "$so" "$perf" > "$logs/manifest.env"
echo "twohost-suite: booting vm-a and vm-b (logs: ${logs#"$ROOT"/})" >&2
share=(-w "$ROOT")
case "$logs" in "$ROOT"/*) ;; *) share+=(-w "$logs") ;; esac
set +e
for attempt in 1 2; do
    rm -f "$logs"/.barrier.* "$logs"/.result.* "$logs"/.wire_down
    SOFTROCE_DECOYS="docker0=172.17.0.1/16" "$HERE/run-two-vms.sh" "${share[@]}" \
        -T "${TWOHOST_TIMEOUT:-600}" -- bash "$HERE/twohost-suite.sh" --guest "$logs"
    rc=$?
    # 3: vm-a found the wire between the VMs dead after a failed step (WIRE line above).
    # Boot both again once: a second dead wire fails the suite.
    [ "$rc" = 3 ] && [ "$attempt" = 1 ] || break
    echo "twohost-suite: the virtual wire failed; booting both VMs again (once)" >&2
done
set -e
case $rc in
    0) ;;
    3) echo "twohost-suite: FAIL (the virtual wire between the VMs failed twice)" >&2 ;;
    124) echo "twohost-suite: FAIL (the VMs timed out after ${TWOHOST_TIMEOUT:-600} s)" >&2 ;;
    255) echo "twohost-suite: FAIL (a VM or its rxe setup failed)" >&2 ;;
esac
echo "twohost-suite: exit status $rc after $(( $(date +%s) - t0 )) s" >&2
exit $rc
