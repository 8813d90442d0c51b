#!/bin/bash
# bench-ib.sh: verbsnet against perftest on soft-RoCE, in ONE VM boot. perftest's ib_send_bw,
# ib_write_bw (one way and -b), ib_send_lat on rxe0 in loopback, and verbsnet-perf's stream,
# stream --bidir and latency through the plugin on the same device, rounds interleaved; then
# the work per message on each side (from --stats) and the system calls per message (strace).
# Numbers only: nothing here asserts a speed (docs/performance.md, "How to measure").
#
# usage: testharness/softroce/bench-ib.sh            (build, boot, measure, print the tables)
#        testharness/softroce/bench-ib.sh --tables DIR (print the tables of an earlier run's logs)
# env:   BENCH_SIZES (default "8 64 4096 65536 1048576"), BENCH_ROUNDS (3), BENCH_BYTES (bytes
#        per bandwidth run, default 33554432: iterations = BENCH_BYTES / size, clamped to
#        BENCH_MIN_ITERS..BENCH_MAX_ITERS, default 200..5000), BENCH_WINDOW (verbsnet-perf -W,
#        default 32 = NCCL_NET_MAX_REQUESTS), BENCH_LAT_SIZES ("8"), BENCH_LAT_ITERS (1000),
#        BENCH_LAT_SPIN (100: the latency mode is run a second time with --spin 100, idle passes
#        that poll without yielding as ib_send_lat's loop does; 0, or a --spin in
#        BENCH_PERF_ARGS: only the one run),
#        BENCH_STRACE_SIZE (64), BENCH_STRACE_ITERS ("500 2000": two runs, the difference is
#        per message), BENCH_PERF_ARGS (more verbsnet-perf flags, e.g. "--spin 128"),
#        BENCH_LOGS (target/bench-ib), GID (index, 1), VM_BENCH_TIMEOUT (2400 s), and
#        run-in-vm.sh's SOFTROCE_*.
#
# Each round measures every size with every tool back to back, so a ratio compares runs
# seconds apart; the tables show per cell the median over the rounds and, for ratios, the
# median of the per-round ratios with their range. Under TCG the host's load moves rxe numbers
# by 2x from one minute to the next: read ranges and ratios, not absolute digits.
# MB/s are 2^20 bytes per second (perftest's unit). Raw results: $BENCH_LOGS/results.tsv
# ("round key size values..."), strace tables $BENCH_LOGS/strace-*.txt.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"
SIZES=${BENCH_SIZES:-"8 64 4096 65536 1048576"}
BYTES=${BENCH_BYTES:-33554432}
ROUNDS=${BENCH_ROUNDS:-3}
MIN_ITERS=${BENCH_MIN_ITERS:-200}
MAX_ITERS=${BENCH_MAX_ITERS:-5000}
WINDOW=${BENCH_WINDOW:-32}
LAT_SIZES=${BENCH_LAT_SIZES:-8}
LAT_ITERS=${BENCH_LAT_ITERS:-1000}
LAT_SPIN=${BENCH_LAT_SPIN:-100}
STRACE_SIZE=${BENCH_STRACE_SIZE:-64}
STRACE_ITERS=${BENCH_STRACE_ITERS:-"500 2000"}
iters_for() {
    local n=$((BYTES / $1))
    [ "$n" -lt "$MIN_ITERS" ] && n=$MIN_ITERS
    [ "$n" -gt "$MAX_ITERS" ] && n=$MAX_ITERS
    echo "$n"
}

# ----------------------------------------------------------------------------------- guest side
if [ "${1:-}" = --guest ]; then
    set +e
    logs=$2
    # shellcheck source=/dev/null
    . "$logs/manifest.env" # PLUGIN_SO, PERF_BIN
    out=$logs/results.tsv
    : > "$out"
    GID=${GID:-1}
    export NCCL_NET_PLUGIN=$PLUGIN_SO
    read -r -a perf_args <<< "${BENCH_PERF_ARGS:-}"
    round=0
    echo "bench: in the VM: kernel $(uname -r), $(nproc) vCPUs; rxe0 active_mtu $(ibv_devinfo -d rxe0 | awk '/active_mtu/ { print $2 }')"
    record() { echo "$round $*" >> "$out"; echo "bench: round $round: $*"; }

    # pf TOOL KEY SIZE ITERS [ARGS]: perftest server + client on rxe0
    pf() {
        local tool=$1 key=$2 size=$3 n=$4 log; shift 4
        log=$logs/$key-$size-r$round.log
        timeout 300 "$tool" -d rxe0 -x "$GID" -F -s "$size" -n "$n" "$@" > "$log.srv" 2>&1 &
        local sp=$! rc try
        # the server needs a moment to listen (and the previous one to let go of the port)
        for try in 1 2 3 4 5 6 7 8 9 10; do
            sleep 0.5
            timeout 300 "$tool" -d rxe0 -x "$GID" -F -s "$size" -n "$n" "$@" 127.0.0.1 > "$log" 2>&1
            rc=$?
            grep -q "Couldn't connect" "$log" || break
            echo "bench: $tool: the server is not listening yet (try $try)" >&2
        done
        [ $rc = 0 ] || kill "$sp" 2>/dev/null
        wait $sp
        local src=$? row
        row=$(grep -E "^ *$size +[0-9]+ " "$log" | tail -n 1)
        if [ $rc != 0 ] || [ $src != 0 ] || [ -z "$row" ]; then
            echo "bench: $tool -s $size $* failed (client $rc, server $src)"
            tail -n 5 "$log" "$log.srv"
            return
        fi
        # bw: bytes iters peak avg msgrate -> "KEY SIZE avg_MBps Mpps"
        # lat: bytes iters min max typical avg ... -> "KEY SIZE typical avg"
        case $key in
            *lat) record "$key $size $(echo "$row" | awk '{ print $5, $6 }')" ;;
            *) record "$key $size $(echo "$row" | awk '{ print $4, $5 }')" ;;
        esac
    }

    # vp MODE KEY SIZE ITERS [ARGS]: verbsnet-perf MODE through the plugin on rxe0, 2 ranks
    vp() {
        local mode=$1 key=$2 s=$3 n=$4 log; shift 4
        log=$logs/$key-$s-r$round
        timeout 900 "$PERF_BIN" "$mode" --transport ib --ranks 2 --json --stats -b "$s" -e "$s" \
            -n "$n" -w $((n / 10 + 1)) -W "$WINDOW" "${perf_args[@]}" "$@" -T 800 \
            > "$log.json" 2> "$log.err" \
            || { echo "bench: verbsnet-perf $mode $* -b $s failed"; tail -n 5 "$log.err"; return; }
        # "KEY SIZE a b": stream: MB/s Mpps; latency: typical avg. "KEY_work SIZE ...": per
        # message, rank 0 then rank 1: WRs posted, post calls, completions; then whether the
        # plugin reported post calls and completions itself (1) or they were derived (0).
        local vals
        vals=$(python3 - "$log.json" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
r = v["rows"][0]
main = (f'{r["bw_MBps"]} {r["msg_rate_Mpps"]}' if v["mode"] == "stream"
        else f'{r["t_typical_us"]} {r["t_avg_us"]}')
w = v.get("work_per_message") or {}
ranks = {x["rank"]: x for x in w.get("ranks", [])}
def f(rank, k):
    return ranks.get(rank, {}).get(k, 0.0)
both = w.get("both") or {}
work = " ".join(f"{f(r, 'wrs_posted')} {f(r, 'post_calls')} {f(r, 'completions')}" for r in (0, 1))
work += f" {int(both.get('post_calls_reported', False))} {int(both.get('completions_reported', False))}"
print(main)
print(work)
PY
)
        [ -n "$vals" ] || { echo "bench: verbsnet-perf $mode -b $s: no JSON"; return; }
        record "$key $s $(echo "$vals" | sed -n 1p)"
        record "${key}_work $s $(echo "$vals" | sed -n 2p)"
    }

    for round in $(seq 1 "$ROUNDS"); do
        for s in $SIZES; do
            n=$(iters_for "$s")
            pf ib_send_bw send_bw "$s" "$n"
            pf ib_write_bw write_bw "$s" "$n"
            vp stream stream "$s" "$n"
            pf ib_send_bw send_bw_bidir "$s" "$n" -b
            pf ib_write_bw write_bw_bidir "$s" "$n" -b
            vp stream stream_bidir "$s" "$n" --bidir
        done
        for s in $LAT_SIZES; do
            pf ib_send_lat send_lat "$s" "$LAT_ITERS"
            vp latency latency "$s" "$LAT_ITERS"
            # (not when BENCH_PERF_ARGS sets --spin already: verbsnet-perf takes it once)
            if [ "$LAT_SPIN" -gt 0 ] && [[ " ${perf_args[*]} " != *" --spin"* ]]; then
                vp latency latency_spin "$s" "$LAT_ITERS" --spin "$LAT_SPIN"
            fi
        done
    done

    # System calls per message on each side: strace -c -f of each side in its own process, at
    # two message counts; the difference of the counts over the difference of the messages
    # leaves out start-up and connection set-up.
    round=0
    free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
    for n in $STRACE_ITERS; do
        port=$(free_port)
        for r in 1 0; do
            VERBSNET_SOCKET_ADDR=127.0.0.1 timeout 900 strace -c -f -o "$logs/strace-stream-r$r-$n.txt" \
                "$PERF_BIN" stream --transport ib --rank $r --nranks 2 --master "127.0.0.1:$port" \
                -b "$STRACE_SIZE" -e "$STRACE_SIZE" -n "$n" -w 0 -c 0 -W "$WINDOW" \
                "${perf_args[@]}" > "$logs/strace-stream-r$r-$n.out" 2>&1 &
        done
        wait
        # perftest: the server (receiver) and the client (sender)
        timeout 900 strace -c -f -o "$logs/strace-send_bw-r1-$n.txt" \
            ib_send_bw -d rxe0 -x "$GID" -F -s "$STRACE_SIZE" -n "$n" > "$logs/strace-send_bw-r1-$n.out" 2>&1 &
        for try in 1 2 3 4 5 6 7 8 9 10; do
            sleep 1
            timeout 900 strace -c -f -o "$logs/strace-send_bw-r0-$n.txt" \
                ib_send_bw -d rxe0 -x "$GID" -F -s "$STRACE_SIZE" -n "$n" 127.0.0.1 \
                > "$logs/strace-send_bw-r0-$n.out" 2>&1
            grep -q "Couldn't connect" "$logs/strace-send_bw-r0-$n.out" || break
        done
        wait
        echo "bench: strace runs of $n messages done"
    done
    echo "bench: raw results in $out"
    exit 0
fi

# ------------------------------------------------------------------------------------ host side
# run_bench: build, boot, measure; the results and the settings they were taken with go to $logs
run_bench() {
    mkdir -p "$logs"
    logs=$(cd "$logs" && pwd)
    rm -f "$logs"/*.log "$logs"/*.srv "$logs"/*.json "$logs"/*.err "$logs"/*.out \
        "$logs"/strace-*.txt "$logs"/results.tsv
    echo "bench: building (cargo build --release)" >&2
    cargo build -p verbsnet --release --lib
    cargo build -p testharness --release --bin verbsnet-perf
    printf 'PLUGIN_SO=%q\nPERF_BIN=%q\n' "$ROOT/target/release/libnccl-net-verbsnet.so" \
        "$ROOT/target/release/verbsnet-perf" > "$logs/manifest.env"
    printf 'SIZES=%q\nLAT_SIZES=%q\nSTRACE_SIZE=%q\nSTRACE_ITERS=%q\nWINDOW=%q\nLAT_SPIN=%q\n' \
        "$SIZES" "$LAT_SIZES" "$STRACE_SIZE" "$STRACE_ITERS" "$WINDOW" "$LAT_SPIN" \
        > "$logs/settings.env"
    local share=(-w "$ROOT") started
    case "$logs" in "$ROOT"/*) ;; *) share+=(-w "$logs") ;; esac
    echo "bench: host load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    started=$(date +%s)
    "$HERE/run-in-vm.sh" "${share[@]}" -T "${VM_BENCH_TIMEOUT:-2400}" -- \
        bash "$HERE/bench-ib.sh" --guest "$logs"
    echo "bench: host load after: $(cut -d' ' -f1-3 /proc/loadavg);" \
        "$(($(date +%s) - started)) s in the VM" >&2
}

if [ "${1:-}" = --tables ]; then
    logs=${2:?--tables needs the directory of an earlier run}
    # shellcheck source=/dev/null
    [ -f "$logs/settings.env" ] && . "$logs/settings.env"
else
    logs=${BENCH_LOGS:-$ROOT/target/bench-ib}
    run_bench
fi

# the tables
python3 - "$logs" "$SIZES" "$LAT_SIZES" "$STRACE_SIZE" "$STRACE_ITERS" "$WINDOW" "$LAT_SPIN" <<'PY'
import glob, os, re, statistics, sys

logs, sizes, lat_sizes = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
strace_size, strace_iters, window = sys.argv[4], [int(x) for x in sys.argv[5].split()], sys.argv[6]
lat_spin = sys.argv[7]
sizes = [int(s) for s in sizes]
lat_sizes = [int(s) for s in lat_sizes]
res = {}  # (key, size) -> {round: [values]}
for line in open(os.path.join(logs, "results.tsv")):
    f = line.split()
    if len(f) >= 4:
        res.setdefault((f[1], int(f[2])), {})[int(f[0])] = [float(x) for x in f[3:]]
MIB = 1 << 20
rounds = len({r for d in res.values() for r in d})

def vals(key, size, col=0):
    return {r: v[col] for r, v in res.get((key, size), {}).items() if len(v) > col}

def med(d, fmt="{:.1f}"):
    return fmt.format(statistics.median(d.values())) if d else "-"

def ratio(a, b):
    rs = sorted(a[r] / b[r] for r in a if r in b and b[r] > 0)
    if not rs:
        return "-"
    m = statistics.median(rs)
    return f"{m:.2f}" if len(rs) == 1 else f"{m:.2f} ({rs[0]:.2f}-{rs[-1]:.2f})"

def human(s):
    return f"{s // MIB} MiB" if s >= MIB else f"{s // 1024} KiB" if s >= 1024 else f"{s} B"

TARGET = {64: "≥ 0.8 send", 4096: "≥ 0.8 send", 65536: "≥ 0.9 send", 1048576: "≥ 0.95 write"}

print()
print(f"One way: verbsnet-perf stream (-W {window}) against ib_send_bw and ib_write_bw (default")
print(f"depths), MB/s = 2^20 B/s and Mpps, median of {rounds} round(s); ratios: median of the")
print("per-round ratios (range).")
print()
print("| size | ib_send_bw | ib_write_bw | stream | stream Mpps | stream / send_bw | stream / write_bw | target |")
print("|---|---|---|---|---|---|---|---|")
for s in sizes:
    sb, wb, st = vals("send_bw", s), vals("write_bw", s), vals("stream", s)
    print(f"| {human(s)} | {med(sb)} | {med(wb)} | {med(st)} | {med(vals('stream', s, 1), '{:.4f}')} "
          f"| {ratio(st, sb)} | {ratio(st, wb)} | {TARGET.get(s, '-')} |")
print()
print("Both ways: stream --bidir against perftest -b; every figure is the sum of both directions.")
print()
print("| size | ib_send_bw -b | ib_write_bw -b | stream --bidir | bidir / send_bw -b | bidir / write_bw -b |")
print("|---|---|---|---|---|---|")
for s in sizes:
    sb, wb, st = vals("send_bw_bidir", s), vals("write_bw_bidir", s), vals("stream_bidir", s)
    print(f"| {human(s)} | {med(sb)} | {med(wb)} | {med(st)} | {ratio(st, sb)} | {ratio(st, wb)} |")
print()
print("Latency, one way (ib_send_lat; verbsnet-perf latency: round trip / 2), us, median of the rounds;")
print("target: latency / ib_send_lat <= 1.2 at 8 B. verbsnet-perf's idle passes yield the core at")
print("once by default (its --spin 0); ib_send_lat polls without yielding, as the --spin rows do.")
print()
print("| size | ib_send_lat typical | ib_send_lat avg | latency typical | latency avg | ratio typical | ratio avg |")
print("|---|---|---|---|---|---|---|")
for s in lat_sizes:
    lt, la = vals("send_lat", s, 0), vals("send_lat", s, 1)
    for key, label in (("latency", ""), ("latency_spin", f", --spin {lat_spin}")):
        vt, va = vals(key, s, 0), vals(key, s, 1)
        if not vt:
            continue
        print(f"| {human(s)}{label} | {med(lt, '{:.2f}')} | {med(la, '{:.2f}')} | {med(vt, '{:.2f}')} "
              f"| {med(va, '{:.2f}')} | {ratio(vt, lt)} | {ratio(va, la)} |")

print()
print("Work per message on each side (verbsnet-perf --stats; the counters of a run, warm-up and")
print("checks included, over the messages it moved; median of the rounds). stream: rank 0 sends,")
print("rank 1 receives; bidir and latency: both do both. WRs posted = send-side WRs (data, CTS and")
print("credit writes) + receive WRs; target for small messages: both sides together <= 1.25 WRs and")
print("<= 1.25 post calls. perftest ib_send_bw for reference: 1 WR and 1 post call per message on")
print("each side (a SEND; a receive WR), one receive completion per message and one send")
print("completion per 100 (its default -Q 100).")
print()
print("| mode | size | WRs posted: rank 0 / rank 1 / both | post calls: rank 0 / rank 1 / both | completions polled: rank 0 / rank 1 / both |")
print("|---|---|---|---|---|")
notes = set()
for key, mode, ss in (("stream_work", "stream", sizes), ("stream_bidir_work", "stream --bidir", sizes),
                      ("latency_work", "latency", lat_sizes),
                      ("latency_spin_work", f"latency --spin {lat_spin}", lat_sizes)):
    for s in ss:
        if not vals(key, s):
            continue
        cols = []
        for base in (0, 1, 2):
            a, b = vals(key, s, base), vals(key, s, 3 + base)
            both = {r: a[r] + b[r] for r in a if r in b}
            cols.append(f"{med(a, '{:.2f}')} / {med(b, '{:.2f}')} / {med(both, '{:.2f}')}")
        pr, cr = vals(key, s, 6), vals(key, s, 7)
        if pr and not all(pr.values()):
            cols[1] += " (≤)"
            notes.add("(≤) post calls: the plugin reports no sq_post_calls, so each send-side WR counts as "
                      "one call (an upper bound) + rq_post_calls.")
        if cr and not all(cr.values()):
            cols[2] += " (d)"
            notes.add("(d) completions: the plugin reports no wcs_polled; derived as one per send-side WR "
                      "(verbsnet signals each) + one per arrived message.")
        if a:
            print(f"| {mode} | {human(s)} | {cols[0]} | {cols[1]} | {cols[2]} |")
for n in sorted(notes):
    print()
    print(n)

def strace_calls(path):
    calls = {}
    try:
        for line in open(path):
            t = line.split()
            if len(t) >= 5 and re.match(r"^[0-9.]+$", t[0]) and t[-1] != "total":
                calls[t[-1]] = calls.get(t[-1], 0) + int(t[3])
    except OSError:
        pass
    return calls

# verbsnet-perf's own calls: idle passes (yield, nap) and the rendezvous it serves (rank 0)
HARNESS = {"sched_yield", "clock_nanosleep", "nanosleep", "accept4"}

if len(strace_iters) >= 2:
    lo, hi = strace_iters[0], strace_iters[-1]
    print()
    print(f"System calls per message (strace -c -f of each side, {strace_size} B one way, runs of {lo} and")
    print(f"{hi} messages: (calls at {hi} - calls at {lo}) / {hi - lo}; start-up and set-up cancel out,")
    print("what is left of them is noise of a few hundredths). On rxe every ibv_post_send is a write(2)")
    print("(a hardware NIC rings a doorbell in mapped memory instead); ibv_post_recv and ibv_poll_cq")
    print("make none. \"harness\": verbsnet-perf's idle passes (sched_yield, clock_nanosleep) and the")
    print("rendezvous rank 0 serves (accept4), not the plugin's.")
    print()
    print("| tool | side | all but the harness's | by call | harness |")
    print("|---|---|---|---|---|")
    for tool, label in (("stream", "verbsnet-perf stream"), ("send_bw", "ib_send_bw")):
        for r, side in ((0, "sender"), (1, "receiver")):
            a = strace_calls(os.path.join(logs, f"strace-{tool}-r{r}-{lo}.txt"))
            b = strace_calls(os.path.join(logs, f"strace-{tool}-r{r}-{hi}.txt"))
            if not a or not b:
                print(f"| {label} | {side} | - | (no strace table) |")
                continue
            per = {k: (b.get(k, 0) - a.get(k, 0)) / (hi - lo) for k in set(a) | set(b)}
            per = {k: v for k, v in per.items() if abs(v) >= 0.005}
            ours = {k: v for k, v in per.items() if k not in HARNESS}
            theirs = {k: v for k, v in per.items() if k in HARNESS}
            def show(d):
                return ", ".join(f"{k} {v:.2f}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])) or "-"
            print(f"| {label} | {side} | {sum(ours.values()):.2f} | {show(ours)} | {show(theirs)} |")
PY
