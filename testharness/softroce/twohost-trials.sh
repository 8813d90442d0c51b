#!/bin/bash
# twohost-trials.sh: what a silent or lossy peer costs, measured across two soft-RoCE VMs
# (run-two-vms.sh). Not part of CI (each silent-peer trial waits for the error bound, ~20-30 s);
# the results go into docs/troubleshooting.md ("A peer host or its link goes silent").
#
# usage: testharness/softroce/twohost-trials.sh [TRIAL...]
#   default: loss5 mtu kill9_eager cut_eager cut_rdv kill9_retry cut_retry linkdown_eager
#            linkdown_rdv poweroff_rdv
#   (poweroff_* ends vm-b, so it must be last; run poweroff_eager in a second call)
# env:   TRIALS_LOGS (default target/twohost-trials), TRIALS_CAP (seconds a survivor may wait
#        for its error before the trial counts as a hang, default 90), VERBSNET_* as usual.
#
# Every trial runs verbsnet-perf sendrecv between rank 0 on vm-a (the survivor, whose clock
# times the trial) and rank 1 on vm-b, with eager (4 KiB, under VERBSNET_EAGER_LIMIT) or
# rendezvous (1 MiB) messages, many iterations, then injects at t0, once traffic flows.
# The *_retry trials run `stream` instead (rank 0 sends 4 KiB messages, rank 1 receives) with
# rank 1 stalling after 200 messages (`--debug-stall-recv-after`: alive, comms open, no more
# calls), so at t0 rank 0's isend is answering "retry later" with nothing in flight (issue 19:
# that isend must still learn of the peer's death or a cut wire):
#   cut_*       vm-a drops every frame on its NIC both ways (tc: netem loss 100% egress,
#               matchall drop ingress): the wire is cut, nobody is told
#   linkdown_*  vm-b sets its NIC down (`ip link set eth0 down`): vm-a is told nothing
#   poweroff_*  vm-b powers off at once (sysrq o: no process exits, no FIN, no RST)
#   kill9_*     vm-b's rank gets SIGKILL (its kernel closes the sockets)
#   loss5       no fault: 5% loss both ways (netem), a short run that must complete, 0 wrong
#   mtu         no fault: vm-b's NIC at MTU 1500, vm-a's at 9000 (path MTU lines)
# and reports the survivor's time from t0 to its exit, its exit status, whether it printed
# ncclRemoteError, and the plugin's WARN lines. One line per trial:
#   trial <name>: <seconds> s to exit <rc> (ncclRemoteError: yes|no) <first cause>
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"

if [ "${1:-}" = --guest ]; then
    set +e
    logs=$2; shift 2
    # shellcheck source=/dev/null
    . "$logs/manifest.env"
    role=$TWOVM_ROLE other=a nic=$TWOVM_IFNAME
    [ "$role" = a ] && other=b
    cap=${TRIALS_CAP:-90}
    barrier() {
        : > "$logs/.barrier.$1.$role"
        local i
        for i in $(seq 3000); do
            [ -e "$logs/.barrier.$1.$other" ] && return 0
            sleep 0.1
        done
        return 1
    }
    now() { date +%s.%N; }
    port=29600
    export NCCL_NET_PLUGIN=$PLUGIN_SO VERBSNET_DEBUG=${VERBSNET_DEBUG:-info}
    for trial in "$@"; do
        port=$((port + 1))
        mode=sendrecv
        case $trial in
            *_eager) size=(-b 4K -e 4K -n 1000000 -w 1) ;;
            *_rdv) size=(-b 1M -e 1M -n 100000 -w 1) ;;
            *_retry) mode=stream size=(-b 4K -e 4K -n 1000000 -w 1 --debug-stall-recv-after 200) ;;
            loss5) size=(-b 8 -e 1M -f 8 -n 3 -w 1) ;;
            mtu) size=(-b 8 -e 256K -f 8 -n 2 -w 1) ;;
            *) echo "twohost-trials: unknown trial $trial" >&2; exit 2 ;;
        esac
        case $trial in
            loss5) tc qdisc add dev "$nic" root netem loss 5% ;;
            mtu) [ "$role" = b ] && ip link set "$nic" mtu 1500 ;;
        esac
        c0=$(cat "/sys/class/infiniband/rxe0/ports/1/hw_counters/completer_retry_err" 2>/dev/null)
        barrier "$trial.start" || { echo "twohost-trials: vm-$role: no peer at $trial" >&2; exit 1; }
        log=$logs/$trial.$role.log
        r=0; [ "$role" = b ] && r=1
        "$PERF_BIN" "$mode" "${size[@]}" --transport ib --rank $r --nranks 2 \
            --master "192.0.2.1:$port" > "$log" 2>&1 &
        pid=$!
        if [ "$role" = a ]; then
            case $trial in
                loss5 | mtu)
                    t0=$(now)
                    wait "$pid"; rc=$?
                    t1=$(now)
                    tc qdisc del dev "$nic" root 2>/dev/null
                    wrong=$(awk '/^ *[0-9]+ +[0-9]+ / && NF >= 13 { w += $9 + $13; n++ } END { print n + 0, w + 0 }' "$log")
                    c1=$(cat "/sys/class/infiniband/rxe0/ports/1/hw_counters/completer_retry_err" 2>/dev/null)
                    printf 'trial %s: completed in %.1f s, exit %s, %s result rows, %s wrong, vm-a completer_retry_err +%s; %s\n' \
                        "$trial" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$rc" \
                        "${wrong% *}" "${wrong#* }" "$((c1 - c0))" \
                        "$(grep -m1 -oE 'QP connected \(RTS\)[^d]*' "$log" | sed 's/ *$//') $(grep -m1 -oE ' mtu=[0-9]+' "$log")"
                    : > "$logs/.fault.$trial"
                    ;;
                *)
                    for _ in $(seq 600); do
                        grep -q 'send comm .*connected' "$log" && break
                        sleep 0.1
                    done
                    sleep 3 # traffic flows
                    t0=$(now)
                    case $trial in
                        cut_*)
                            tc qdisc add dev "$nic" root netem loss 100%
                            tc qdisc add dev "$nic" ingress
                            tc filter add dev "$nic" parent ffff: matchall action drop
                            ;;
                        *) : > "$logs/.fault.$trial" ;;
                    esac
                    exited=0
                    for _ in $(seq $((cap * 20))); do
                        kill -0 "$pid" 2>/dev/null || { exited=1; break; }
                        sleep 0.05
                    done
                    t1=$(now)
                    if [ $exited = 1 ]; then wait "$pid"; rc=$?; else kill -9 "$pid"; rc=hang; fi
                    tc qdisc del dev "$nic" root 2>/dev/null
                    tc qdisc del dev "$nic" ingress 2>/dev/null
                    remote=no; grep -q ncclRemoteError "$log" && remote=yes
                    printf 'trial %s: %.1f s from the fault to exit %s (ncclRemoteError: %s); %s\n' "$trial" \
                        "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$rc" "$remote" \
                        "$(grep -m1 -E 'WARN' "$log" | cut -c1-400)"
                    ;;
            esac
        else
            for _ in $(seq $((cap * 50 + 600))); do
                [ -e "$logs/.fault.$trial" ] && break
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.02
            done
            case $trial in
                linkdown_*) ip link set "$nic" down ;;
                poweroff_*) echo o > /proc/sysrq-trigger; sleep 60 ;;
                kill9_*) kill -9 "$pid" ;;
            esac
        fi
        # vm-b is gone after a power-off: nothing more to run
        case $trial in poweroff_*) kill -9 "$pid" 2>/dev/null; exit 0 ;; esac
        barrier "$trial.end"
        kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
        case $trial in
            loss5) tc qdisc del dev "$nic" root 2>/dev/null ;;
            mtu) [ "$role" = b ] && ip link set "$nic" mtu 9000 ;;
            linkdown_*)
                if [ "$role" = b ]; then
                    ip link set "$nic" up
                    for _ in $(seq 100); do
                        grep -qs '^0000:0000:0000:0000:0000:ffff:' /sys/class/infiniband/rxe0/ports/1/gids/1 \
                            && [ "$(cat /sys/class/infiniband/rxe0/ports/1/state)" = "4: ACTIVE" ] && break
                        sleep 0.1
                    done
                fi
                ;;
        esac
        barrier "$trial.restored"
        sleep 1
    done
    exit 0
fi

logs=${TRIALS_LOGS:-$ROOT/target/twohost-trials}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
rm -f "$logs"/*.log "$logs"/.barrier.* "$logs"/.fault.*
trials=("$@")
[ ${#trials[@]} -gt 0 ] || trials=(loss5 mtu kill9_eager cut_eager cut_rdv kill9_retry cut_retry linkdown_eager linkdown_rdv poweroff_rdv)
cargo build --release --workspace
printf 'PLUGIN_SO=%q\nPERF_BIN=%q\n' "$ROOT/target/release/libnccl-net-verbsnet.so" \
    "$ROOT/target/release/verbsnet-perf" > "$logs/manifest.env"
share=(-w "$ROOT")
case "$logs" in "$ROOT"/*) ;; *) share+=(-w "$logs") ;; esac
TWOVM_KEEP_SURVIVOR=1 "$HERE/run-two-vms.sh" "${share[@]}" -T 1500 -- bash "$HERE/twohost-trials.sh" --guest "$logs" "${trials[@]}"
