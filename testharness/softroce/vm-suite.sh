#!/bin/bash
# vm-suite.sh: the ib transport's CI suite on soft-RoCE, in ONE VM boot. This is what CI calls.
#
# usage: testharness/softroce/vm-suite.sh
# env:   VM_SUITE_TIMEOUT (seconds for the whole VM, default 900), VM_SUITE_LOGS (directory for
#        the per-step logs, default target/vm-suite), CARGO_PROFILE_ARGS (for the test binaries,
#        e.g. --release to reuse a `cargo test --release` build), plus everything run-in-vm.sh
#        understands (SOFTROCE_*). Needs install-deps.sh (qemu, kernel, rdma-core, ...) and a
#        Rust toolchain.
#
# On the host it builds everything (test binaries with `cargo test --workspace --no-run`, the
# plugin and verbsnet-perf with `cargo build --release --workspace`: the commands CI runs
# before, so nothing is rebuilt), checks that nothing links libibverbs, then boots the VM once
# and runs, in order, against rxe0:
#   1. conformance       tests/transport_conformance.rs, its ib:: half: the verbs-behaviour
#                        suite every transport passes (tcp runs it on the host), one test at a
#                        time (RNR counts come from device-wide counters)
#      ib_transport      tests/ib_transport.rs (what only ib has: GID, filter, device limits)
#   2. plugin_pair       tests/plugin_pair.rs with VERBSNET_TEST_TRANSPORT=ib
#   3. scenarios         tests/scenarios.rs with VERBSNET_TEST_TRANSPORT=ib (when it exists)
#   4. rnr               tests/rnr.rs (RNR retry with device counters, credits, closed peer)
#   5. perf_*            verbsnet-perf all_reduce --ranks 2 and 4, sendrecv --ranks 2, and
#                        alltoall --ranks 4 --shared-comms 2, 4, 8 (skewed senders) over ib,
#                        small sizes: exit 0, #wrong 0, and the log names rxe0, the GID index and
#                        the MTU; the header's getProperties name is "rxe0" (no ':1', as NCCL
#                        IB's), with a speed and no pciPath (when the harness exists)
#   6. doctor_*          verbsnet-perf doctor on rxe0: exit 0 and the port/GID/depth/memlock/
#                        counter lines when healthy, --json; provoked faults (forced empty or
#                        link-local GID index, RQ depth over max_cqe, a typo'd knob, an unresolvable plugin,
#                        low memlock without CAP_IPC_LOCK) each with its verdict and fix; and
#                        --listen/--peer over rxe0 (path MTU, latency, bandwidth)
#   5. lifecycle         testharness/tests/lifecycle.rs over ib: 23 init/finalize/dlclose
#                        cycles leave fds, threads and `rdma resource` counts at baseline (heap:
#                        on the host, 400 cycles over tcp);
#                        two v11 communicators finalized in turn (the one with trafficClass 106
#                        shows "traffic class 106 SL 10" in its connections' INFO lines: its
#                        trafficClass is the SL too, low 4 bits, as VERBSNET_IB_SL is unset)
#      explorer          tests/explorer.rs over ib: the contract explorer through the v12 table
#                        (VM_EXPLORER_CASES sequences, default 60; VM_EXPLORER_DEATH_CASES of the
#                        peer-death profile, default 8); its "explorer[...]: N
#                        sequences, M calls ... transport ib" line
#      liveness          tests/liveness.rs over ib: issue 19's receive-all-then-spin-sends
#                        pattern, peer death and close bounds
#      hot_path          tests/hot_path.rs over ib: a warm connection's isend, irecv and test
#                        allocate nothing on either side (8 B to 256 KiB, two callers, and
#                        12 QPs split)
#   6. perf_*            verbsnet-perf over ib, small sizes: all_reduce --ranks 2 and 4,
#                        all_gather, reduce_scatter and sendrecv --ranks 2 through ncclNet v12
#                        (the default, newest) and v8; an all_reduce smoke run through v7, v9,
#                        v10 and v11; VERBSNET_IB_TC=106 VERBSNET_IB_SL=3 shown on every connection.
#                        Each: exit 0, #wrong 0, the symbol used, and the log names rxe0, the
#                        GID index and the MTU (when the harness exists); with --proxy lazy
#                        (receives posted ahead, sends spun on, completions consumed late):
#                        all_reduce --ranks 4, and alltoall --ranks 4 --shared-comms 4; with
#                        VERBSNET_IB_QPS_PER_CONNECTION=4: all_reduce --ranks 4 and alltoall
#                        --ranks 4 --shared-comms 4, each split on and off (the split alltoall
#                        with --proxy lazy; "4 QPs (split on|off)" on the connections' INFO lines)
#      multi_qp          tests/multi_qp.rs over ib: 1, 2, 4, 8 QPs per connection, split on and
#                        off, data checked; the receiver adopts the sender's count
# then boots a second VM with two rxe devices (SOFTROCE_NETDEV=veth SOFTROCE_NDEVS=2, GID
# index 0) for NIC fusion (makeVDevice, issue 23):
#      vdev_multi_qp     tests/multi_qp.rs's virtual-device test over rxe0 and rxe1: QPs on both
#                        devices, one side physical or reordered, data checked
#      vdev_table        tests/vdevice.rs: makeVDevice, devices, getProperties and data through
#                        the v12 table, and the virtual devices made again after a reload
#      vdev_*            verbsnet-perf --vdevice 0,1 (all_reduce 2 and 4 ranks, 2 QPs per device
#                        split; alltoall --shared-comms 2 through the v9 table): #wrong 0, the
#                        device "rxe0+rxe1" made by makeVDevice on every connection
# A test binary that prints SKIP in the VM (no device found) counts as a failure. Each step
# prints one summary line, the run ends with "vm-suite: N passed, M failed"; the exit status is
# 0 only when every step passed (255: the VM failed, 124: timeout). Full logs of every step are
# in $VM_SUITE_LOGS/<step>.log.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"

# ----------------------------------------------------------------------------------- guest side
if [ "${1:-}" = --guest ]; then
    set +e # every step runs; failures are counted, not fatal
    logs=$2
    # shellcheck source=/dev/null
    . "$logs/manifest.env"  # BIN_<test>=..., PLUGIN_SO, PERF_BIN (written by the host side)
    : "${BIN_transport_conformance:?}" "${BIN_ib_transport:?}" "${BIN_plugin_pair:?}" "${BIN_rnr:?}"
    passed=0; failed=0; failures=()
    pass() { passed=$((passed + 1)); printf 'vm-suite: PASS  %-18s %s\n' "$1" "$2"; }
    fail() {
        failed=$((failed + 1)); failures+=("$1")
        printf 'vm-suite: FAIL  %-18s %s\n' "$1" "$2"
        echo "---- last lines of $logs/$1.log"
        tail -n 40 "$logs/$1.log" | sed 's/^/    /'
        echo "----"
    }
    secs() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f s", b - a }'; }

    # test_step NAME BINARY [ENV=VALUE...]: a Rust test binary, all tests (or those $TEST_FILTER
    # selects), none skipped
    test_step() {
        local name=$1 bin=$2 t0 rc result; shift 2
        t0=$(date +%s.%N)
        # shellcheck disable=SC2086 # TEST_FILTER is a word list
        env RUST_BACKTRACE=1 "$@" "$bin" ${TEST_FILTER:-} --nocapture > "$logs/$name.log" 2>&1
        rc=$?
        result=$(grep -E '^test result:' "$logs/$name.log" | tail -n 1 | sed 's/^test result: //; s/; finished.*//')
        if [ $rc != 0 ]; then
            fail "$name" "exit $rc: ${result:-no result line} ($(secs "$t0"))"
        elif grep -qE '(^|[^[:alnum:]_])SKIP[ :]' "$logs/$name.log"; then
            fail "$name" "tests skipped inside the VM: $(grep -m1 -E 'SKIP[ :]' "$logs/$name.log")"
        else
            pass "$name" "$result ($(secs "$t0"))"
        fi
    }

    # perf_step NAME ARGS...: verbsnet-perf over ib, exit 0, no wrong elements, rxe0/GID/MTU logged
    # (PERF_ENV: extra VAR=VALUE words for the run; PERF_EXPECT: a line the log must contain)
    perf_step() {
        local name=$1 t0 rc log missing=(); shift
        log=$logs/$name.log
        t0=$(date +%s.%N)
        # shellcheck disable=SC2086 # PERF_ENV is a word list
        env VERBSNET_DEBUG=info NCCL_NET_PLUGIN="$PLUGIN_SO" ${PERF_ENV:-} \
            timeout -k 5 120 "$PERF_BIN" "$@" --transport ib > "$log" 2>&1
        rc=$?
        if [ $rc != 0 ]; then fail "$name" "exit $rc ($(secs "$t0"))"; return; fi
        # the table's #wrong columns are the 9th and 13th fields of a data row
        local bad
        bad=$(awk '/^ *[0-9]+ +[0-9]+ / && NF >= 13 && ($9 != "0" || $13 != "0")' "$log")
        if [ -n "$bad" ]; then fail "$name" "wrong elements: $bad"; return; fi
        grep -q 'Out of bounds values : 0 OK' "$log" || missing+=("'Out of bounds values : 0 OK'")
        grep -qE '^ *[0-9]+ +[0-9]+ ' "$log" || missing+=("result rows")
        grep -q 'rxe0' "$log" || missing+=("rxe0")
        # getProperties through the table, as NCCL IB names the port (net_ib/init.cc): the verbs
        # device without ':port', a speed, and no pciPath (rxe has no PCI device)
        local dev_name=${PERF_DEV_NAME:-rxe0} dev_re
        dev_re=${dev_name//+/\\+}
        grep -qE "^# transport: .*dev [0-9]+ of [0-9]+: \"$dev_re\" speed [1-9][0-9]* Mbps " "$log" \
            || missing+=("the header's device \"$dev_name\" with a speed")
        ! grep -qE '^# transport: .* pci ' "$log" || missing+=("no pciPath for rxe")
        grep -qE 'gid_index[=: ]+[0-9]' "$log" || missing+=("the GID index")
        grep -qE 'mtu[=: ]+[0-9]+' "$log" || missing+=("the MTU")
        grep -qE '^# plugin: verbsnet \(ncclNetPlugin_v[0-9]+\)' "$log" || missing+=("the table used")
        if [ -n "${PERF_EXPECT:-}" ]; then
            grep -qF "$PERF_EXPECT" "$log" || missing+=("'$PERF_EXPECT'")
        fi
        if [ ${#missing[@]} -gt 0 ]; then
            fail "$name" "the output lacks ${missing[*]}"; return
        fi
        local avg gid mtu
        avg=$(grep -m1 'Avg bus bandwidth' "$log" | awk -F: '{ gsub(/ /, "", $2); print $2 }')
        gid=$(grep -m1 -oE 'gid_index[=: ]+[0-9]+' "$log" | grep -oE '[0-9]+$')
        mtu=$(grep -m1 -oE 'mtu[=: ]+[0-9]+' "$log" | grep -oE '[0-9]+$')
        local sym
        sym=$(grep -m1 -oE 'ncclNetPlugin_v[0-9]+' "$log")
        pass "$name" "0 wrong, $sym, rxe0 gid_index=$gid mtu=$mtu, avg busbw ${avg} GB/s ($(secs "$t0"))"
    }

    # doctor_step NAME EXIT "ENV=V ..." "ARGS ..." PATTERN...: `verbsnet-perf doctor` on rxe0
    # (NCCL_NET=verbsnet, the plugin by path, counters read 1 s apart) must exit EXIT and print
    # a line matching each PATTERN (grep -E). $DOCTOR_WRAP (words) runs before the binary.
    doctor_step() {
        local name=$1 want=$2 envs=$3 dargs=$4 t0 rc log missing=() p; shift 4
        log=$logs/$name.log
        t0=$(date +%s.%N)
        # shellcheck disable=SC2086 # envs, dargs and DOCTOR_WRAP are word lists
        env NCCL_NET_PLUGIN="$PLUGIN_SO" NCCL_NET=verbsnet $envs \
            timeout -k 5 60 ${DOCTOR_WRAP:-} "$PERF_BIN" doctor --interval 1 $dargs > "$log" 2>&1
        rc=$?
        if [ "$rc" != "$want" ]; then fail "$name" "exit $rc, expected $want ($(secs "$t0"))"; return; fi
        for p in "$@"; do grep -qE -- "$p" "$log" || missing+=("'$p'"); done
        if [ ${#missing[@]} -gt 0 ]; then fail "$name" "no line matches ${missing[*]}"; return; fi
        pass "$name" "exit $rc, $# line(s) as expected ($(secs "$t0"))"
    }

    devs=$(cd /sys/class/infiniband 2>/dev/null && echo *)
    echo "vm-suite: in the VM: kernel $(uname -r), $(nproc) vCPUs, verbs devices: ${devs:-none}"
    # The second boot (SOFTROCE_NDEVS=2: rxe0 and rxe1 on a veth pair, which reach each other
    # only through GID 0, IPv6 link-local): NIC fusion (makeVDevice, issue 23).
    if [ "${3:-}" = vdev ]; then
        export VERBSNET_IB_GID_INDEX=0
        TEST_FILTER=virtual test_step vdev_multi_qp "$BIN_multi_qp" RUST_TEST_THREADS=1 \
            VERBSNET_TEST_TRANSPORT=ib
        test_step vdev_table "$BIN_vdevice" RUST_TEST_THREADS=1 VERBSNET_TEST_TRANSPORT=ib
        vsmall=(-b 8 -e 256K -f 8 -n 2 -w 1 -T 100 --vdevice 0,1)
        PERF_DEV_NAME="rxe0+rxe1" PERF_EXPECT="made virtual device [2] rxe0+rxe1" \
            perf_step vdev_allreduce_2 all_reduce --ranks 2 "${vsmall[@]}"
        PERF_DEV_NAME="rxe0+rxe1" PERF_EXPECT="4 QPs (split on), over 2 devices (peer: 2)" \
            PERF_ENV="VERBSNET_IB_QPS_PER_CONNECTION=2 VERBSNET_IB_SPLIT_DATA_ON_QPS=1" \
            perf_step vdev_allreduce_4_qps2_split all_reduce --ranks 4 "${vsmall[@]}"
        PERF_DEV_NAME="rxe0+rxe1" PERF_EXPECT="Using virtual device [2] rxe0+rxe1 (vProps 0,1)" \
            perf_step vdev_alltoall_4_shared2_v9 alltoall --ranks 4 --shared-comms 2 \
            --net-version 9 "${vsmall[@]}"
        echo "vm-suite: $passed passed, $failed failed${failures[*]:+ (${failures[*]})}"
        [ "$failed" = 0 ]
        exit
    fi
    TEST_FILTER=ib:: test_step conformance "$BIN_transport_conformance" RUST_TEST_THREADS=1
    test_step ib_transport "$BIN_ib_transport" RUST_TEST_THREADS=2
    test_step plugin_pair "$BIN_plugin_pair" RUST_TEST_THREADS=2 VERBSNET_TEST_TRANSPORT=ib
    if [ -n "${BIN_scenarios:-}" ]; then
        test_step scenarios "$BIN_scenarios" RUST_TEST_THREADS=2 VERBSNET_TEST_TRANSPORT=ib
    else
        echo "vm-suite: ----  scenarios          not in this tree (tests/scenarios.rs)"
    fi
    # one thread: the RNR counters are device-wide
    test_step rnr "$BIN_rnr" RUST_TEST_THREADS=1
    if [ -n "${BIN_lifecycle:-}" ]; then
        test_step lifecycle "$BIN_lifecycle" RUST_TEST_THREADS=1 VERBSNET_TRANSPORT=ib VERBSNET_DEBUG=info \
            VERBSNET_TEST_CYCLES=3,20
        # communicator a: no trafficClass (0, SL 0); b: trafficClass 106, which is also the
        # SL (its low 4 bits: 10) as VERBSNET_IB_SL is unset (NCCL IB's rule)
        for want in "traffic class 0 SL 0" "traffic class 106 SL 10"; do
            grep -qF "$want" "$logs/lifecycle.log" \
                || fail lifecycle "no connection INFO line with '$want' in lifecycle.log"
        done
    fi
    # the contract explorer through the v12 table over ib (issue 19); rxe under QEMU is slow,
    # so fewer sequences than on the host (VM_EXPLORER_CASES; the death profile waits out its
    # 5 s bound in each sequence: VM_EXPLORER_DEATH_CASES)
    if [ -n "${BIN_explorer:-}" ]; then
        test_step explorer "$BIN_explorer" RUST_TEST_THREADS=1 VERBSNET_TEST_TRANSPORT=ib \
            VERBSNET_EXPLORER_CASES="${VM_EXPLORER_CASES:-60}" \
            VERBSNET_EXPLORER_CASES_DEATH="${VM_EXPLORER_DEATH_CASES:-8}"
        grep -qE 'explorer\[[a-z]+\]: [0-9]+ sequences, [0-9]+ calls .*transport ib' "$logs/explorer.log" \
            || fail explorer "no 'explorer[...]: N sequences, M calls ... transport ib' line in explorer.log"
    fi
    # issue 19's pattern (receives, then sends spun without receiver calls) and peer death bounds
    if [ -n "${BIN_liveness:-}" ]; then
        test_step liveness "$BIN_liveness" RUST_TEST_THREADS=1 VERBSNET_TEST_TRANSPORT=ib
    fi
    # no heap allocation in a warm connection's calls (issue 22), over ib
    if [ -n "${BIN_hot_path:-}" ]; then
        test_step hot_path "$BIN_hot_path" RUST_TEST_THREADS=1 VERBSNET_TEST_TRANSPORT=ib
    fi
    # several QPs per connection (issue 23): data QPs as ordinary RC QPs on rxe0
    if [ -n "${BIN_multi_qp:-}" ]; then
        # (its virtual-device test needs two devices: the second boot runs it)
        TEST_FILTER="--skip virtual" test_step multi_qp "$BIN_multi_qp" RUST_TEST_THREADS=1 \
            VERBSNET_TEST_TRANSPORT=ib
    fi
    if [ -n "${PERF_BIN:-}" ]; then
        small=(-b 8 -e 1M -f 8 -n 2 -w 1)
        # the main collectives through the newest table (v12, the default) and v8
        perf_step perf_allreduce_2 all_reduce --ranks 2 "${small[@]}" -T 100
        perf_step perf_allreduce_4 all_reduce --ranks 4 "${small[@]}" -T 100
        perf_step perf_allgather_2 all_gather --ranks 2 "${small[@]}" -T 100
        perf_step perf_reducescatter_2 reduce_scatter --ranks 2 "${small[@]}" -T 100
        perf_step perf_sendrecv_2 sendrecv --ranks 2 "${small[@]}" -T 100
        # NCCL's shared comms: K skewed senders per connection, grouped receives of n = K
        shared=(-b 16K -e 256K -f 16 --chunk 4K -n 2 -w 1 --skew-us 300 -T 100)
        for k in 2 4 8; do
            perf_step "perf_alltoall_4_shared$k" alltoall --ranks 4 --shared-comms "$k" "${shared[@]}"
        done
        for c in all_reduce all_gather reduce_scatter sendrecv; do
            perf_step "perf_${c//_/}_2_v8" "$c" --ranks 2 --net-version 8 "${small[@]}" -T 100
        done
        perf_step perf_allreduce_4_v8 all_reduce --ranks 4 --net-version 8 "${small[@]}" -T 100
        # a smoke run through every other version
        for v in 7 9 10 11; do
            perf_step "perf_smoke_v$v" all_reduce --ranks 2 --net-version "$v" -b 8 -e 64K -f 8 -n 2 -w 1 -T 100
        done
        PERF_ENV="VERBSNET_IB_TC=106 VERBSNET_IB_SL=3" PERF_EXPECT="traffic class 106 SL 3" \
            perf_step perf_tc_106 sendrecv --ranks 2 -b 8 -e 64K -f 8 -n 2 -w 1 -T 100
        # --proxy lazy: every receive posted ahead, sends spun on, completions consumed late
        # (the least polite order NCCL may call in)
        perf_step perf_allreduce_4_lazy all_reduce --ranks 4 --proxy lazy "${small[@]}" -T 100
        perf_step perf_alltoall_4_shared4_lazy \
            alltoall --ranks 4 --shared-comms 4 --proxy lazy "${shared[@]}"
        # several QPs per connection (issue 23): 4 QPs, data split over them / round robin
        PERF_ENV="VERBSNET_IB_QPS_PER_CONNECTION=4 VERBSNET_IB_SPLIT_DATA_ON_QPS=1" \
            PERF_EXPECT="4 QPs (split on)" \
            perf_step perf_allreduce_4_qps4_split all_reduce --ranks 4 "${small[@]}" -T 100
        PERF_ENV="VERBSNET_IB_QPS_PER_CONNECTION=4 VERBSNET_IB_SPLIT_DATA_ON_QPS=0" \
            PERF_EXPECT="4 QPs (split off)" \
            perf_step perf_alltoall_4_shared4_qps4 \
            alltoall --ranks 4 --shared-comms 4 "${shared[@]}"
        PERF_ENV="VERBSNET_IB_QPS_PER_CONNECTION=4 VERBSNET_IB_SPLIT_DATA_ON_QPS=0" \
            PERF_EXPECT="4 QPs (split off)" \
            perf_step perf_allreduce_4_qps4 all_reduce --ranks 4 "${small[@]}" -T 100
        PERF_ENV="VERBSNET_IB_QPS_PER_CONNECTION=4 VERBSNET_IB_SPLIT_DATA_ON_QPS=1" \
            PERF_EXPECT="4 QPs (split on)" \
            perf_step perf_alltoall_4_shared4_qps4_split \
            alltoall --ranks 4 --shared-comms 4 --proxy lazy "${shared[@]}"
    else
        echo "vm-suite: ----  perf_*             verbsnet-perf not in this tree (testharness)"
    fi
    if [ -n "${PERF_BIN:-}" ] && "$PERF_BIN" doctor --help > /dev/null 2>&1; then
        doctor_step doctor_ok 0 "" "" \
            '^ok +plugin\.devices +rxe0 \([1-9][0-9]* Mbps\)' \
            '^ok +transport +auto: ib \(rxe0\)' '^ok +port rxe0:1 +ACTIVE, Ethernet, active MTU [0-9]+' \
            '^ok +gid rxe0:1 +index 1 ::ffff:192\.0\.2\.1 RoCE v2' '^ok +depth\.(rq|sq|cq) rxe0' \
            '^ok +memlock' '^ok +counters rxe0:1 +none moved' 'doctor: [0-9]+ ok, 0 warn, 0 fail'
        doctor_step doctor_json 0 "" "--json" '"exit":0' '"verdict":"ok"' '"name":"gid rxe0:1"'
        doctor_step doctor_gid_index 2 "VERBSNET_IB_GID_INDEX=5" "" \
            '^fail +port rxe0:1 .*GID 5 is empty.*fix: unset VERBSNET_IB_GID_INDEX' \
            '^fail +gid rxe0:1 .*\[1\] ::ffff:192\.0\.2\.1 the automatic choice' \
            '^warn +transport +auto: tcp .*none is usable'
        doctor_step doctor_gid_linklocal 1 "VERBSNET_IB_GID_INDEX=0" "" \
            '^warn +gid rxe0:1 +index 0 fe80:.*fix: .*link-local.*unset VERBSNET_IB_GID_INDEX'
        doctor_step doctor_depth 2 "VERBSNET_RQ_DEPTH=32768" "" \
            '^fail +depth\.cq rxe0 .*fix: set VERBSNET_RQ_DEPTH <= [0-9]+'
        doctor_step doctor_typo 1 "VERBSNET_RQDEPTH=512" "" \
            '^warn +env VERBSNET_RQDEPTH .*fix: rename it to VERBSNET_RQ_DEPTH'
        doctor_step doctor_plugin 2 "NCCL_NET_PLUGIN=/nonexistent/libnccl-net-verbsnet.so" "" \
            '^fail +plugin\.load .*fix: .*LD_LIBRARY_PATH'
        # root has CAP_IPC_LOCK: drop it (bounding and inheritable sets) and lower the limit
        DOCTOR_WRAP="prlimit --memlock=65536:65536 setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock" \
            doctor_step doctor_memlock 2 "" "--comms 4" \
            '^fail +memlock +RLIMIT_MEMLOCK 64 KiB .*CAP_IPC_LOCK no.*ENOMEM.*fix: raise the limit'
        # a real connection through the plugin over rxe0, both ends in this VM
        env NCCL_NET_PLUGIN="$PLUGIN_SO" NCCL_NET=verbsnet timeout -k 5 60 "$PERF_BIN" doctor \
            --interval 0 --listen 127.0.0.1:29650 --pings 200 --bw-bytes 16M > "$logs/doctor_listen.log" 2>&1 &
        lpid=$!
        doctor_step doctor_peer 0 "" "--peer 127.0.0.1:29650 --pings 200 --bw-bytes 16M" \
            '^ok +peer\.transport +here ib \(rxe0\)' '^ok +peer\.mtu +here 4096, peer 4096: path MTU 4096' \
            '^ok +peer\.connect' '^ok +peer\.latency +[0-9.]+ us' '^ok +peer\.bandwidth +[0-9.]+ GB/s'
        wait "$lpid" || fail doctor_listen "the listening side exited $?"
    else
        echo "vm-suite: ----  doctor_*           verbsnet-perf doctor not in this tree"
    fi
    echo "vm-suite: $passed passed, $failed failed${failures[*]:+ (${failures[*]})}"
    [ "$failed" = 0 ]
    exit
fi

# ------------------------------------------------------------------------------------ host side
logs=${VM_SUITE_LOGS:-$ROOT/target/vm-suite}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
rm -f "$logs"/*.log
t0=$(date +%s)

tests=(transport_conformance ib_transport plugin_pair rnr)
[ -f tests/scenarios.rs ] && tests+=(scenarios)
[ -f testharness/tests/lifecycle.rs ] && tests+=(lifecycle)
[ -f tests/explorer.rs ] && tests+=(explorer)
[ -f tests/liveness.rs ] && tests+=(liveness)
[ -f tests/hot_path.rs ] && tests+=(hot_path)
[ -f tests/multi_qp.rs ] && tests+=(multi_qp)
[ -f tests/vdevice.rs ] && tests+=(vdevice)
# The workspace-wide commands CI runs before (testharness/run-tests.sh), so that nothing is
# rebuilt: per-package builds unify dependency features differently and rebuild the plugin.
echo "vm-suite: building the tests (cargo test --workspace --no-run ${CARGO_PROFILE_ARGS:-})" >&2
# "name executable" of each integration test binary in tests/ and testharness/tests/
built_tests() {
    # shellcheck disable=SC2086 # CARGO_PROFILE_ARGS is a word list
    cargo test --workspace --no-run ${CARGO_PROFILE_ARGS:-} \
        --message-format=json-render-diagnostics \
    | python3 -c '
import json, os, sys
tests = [os.path.join(sys.argv[1], "tests"), os.path.join(sys.argv[1], "testharness", "tests")]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
       and m["target"]["kind"] == ["test"] \
       and os.path.dirname(m["target"]["src_path"]) in tests:
        print(m["target"]["name"], m["executable"])' "$ROOT"
}
declare -A bins=()
while IFS=' ' read -r name exe; do
    bins[$name]=$exe
done < <(built_tests)
for t in "${tests[@]}"; do
    [ -n "${bins[$t]:-}" ] || { echo "vm-suite: no $t test binary was built" >&2; exit 1; }
done

echo "vm-suite: building the plugin and verbsnet-perf (cargo build --release --workspace)" >&2
cargo build --release --workspace
so=$ROOT/target/release/libnccl-net-verbsnet.so
perf=
# the harness is real once its --help knows the collectives
if "$ROOT/target/release/verbsnet-perf" --help 2>/dev/null | grep -q all_reduce; then
    perf=$ROOT/target/release/verbsnet-perf
fi

# The plugin must load where rdma-core is absent: nothing may link libibverbs.
for f in "${bins[@]}" "$so" ${perf:+"$perf"}; do
    if readelf -d "$f" | grep -q 'NEEDED.*libibverbs'; then
        echo "vm-suite: ${f#"$ROOT"/} has a NEEDED entry for libibverbs (call it through dl.rs)" >&2
        exit 1
    fi
done

{
    for t in "${tests[@]}"; do printf 'BIN_%s=%q\n' "$t" "${bins[$t]}"; done
    printf 'PLUGIN_SO=%q\nPERF_BIN=%q\n' "$so" "$perf"
} > "$logs/manifest.env"
echo "vm-suite: built in $(( $(date +%s) - t0 )) s; booting the soft-RoCE VM (logs: ${logs#"$ROOT"/})" >&2

share=(-w "$ROOT")
case "$logs" in "$ROOT"/*) ;; *) share+=(-w "$logs") ;; esac
set +e
"$HERE/run-in-vm.sh" "${share[@]}" -T "${VM_SUITE_TIMEOUT:-900}" -- bash "$HERE/vm-suite.sh" --guest "$logs"
rc=$?
# NIC fusion needs two devices: a second, short boot with rxe0 and rxe1 (veth pair)
echo "vm-suite: booting a second VM with two rxe devices (SOFTROCE_NDEVS=2) for makeVDevice" >&2
SOFTROCE_NETDEV=veth SOFTROCE_NDEVS=2 "$HERE/run-in-vm.sh" "${share[@]}" -T 300 -- \
    bash "$HERE/vm-suite.sh" --guest "$logs" vdev
rc2=$?
[ "$rc" != 0 ] || rc=$rc2
set -e
case $rc in
    0) ;;
    124) echo "vm-suite: FAIL (the VM timed out after ${VM_SUITE_TIMEOUT:-900} s)" >&2 ;;
    255) echo "vm-suite: FAIL (the VM or the rxe setup failed)" >&2 ;;
esac
echo "vm-suite: exit status $rc after $(( $(date +%s) - t0 )) s" >&2
exit $rc
