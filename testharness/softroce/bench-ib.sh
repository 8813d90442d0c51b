#!/bin/bash
# bench-ib.sh: baseline numbers on soft-RoCE, in ONE VM boot: perftest (ib_write_bw, ib_send_bw,
# ib_write_bw -b, ib_send_lat) on rxe0 in loopback, verbsnet on the same device, and a table of
# ratios ours/perftest per size. Numbers only: nothing here asserts a speed.
#
# usage: testharness/softroce/bench-ib.sh
# env:   BENCH_SIZES (default "64 4096 65536 1048576"), BENCH_ROUNDS (default 3),
#        BENCH_BYTES (bytes per run, default 67108864: iterations = BENCH_BYTES / size, clamped
#        to 100..5000; verbsnet-perf sendrecv at most 1000), BENCH_WINDOW (pair_bench messages in
#        flight, default 16), BENCH_LAT_ITERS (1000), BENCH_LOGS (default target/bench-ib),
#        GID (index, default 1), VM_BENCH_TIMEOUT (default 1800 s), and run-in-vm.sh's SOFTROCE_*.
#
# Each round measures every size with every tool back to back (perftest, then verbsnet), so a
# ratio compares runs a few seconds apart; the table shows, per cell, the median over the rounds
# and, for ratios, the median of the per-round ratios with their range. The host's load moves
# rxe numbers by 2x from one minute to the next (TCG, vCPUs on shared cores): read ranges, not
# digits. verbsnet is measured two ways:
#   pair     examples/pair_bench.rs: one process, a testkit comm pair, a one-way stream with
#            BENCH_WINDOW messages in flight; and an 8-byte ping-pong (one-way = RTT/2)
#   sendrecv verbsnet-perf sendrecv --transport ib --ranks 2 --json (when the harness exists):
#            two processes, each sends to the other at once (both directions loaded), compared
#            with ib_write_bw -b, whose figure is the sum of both directions
# MB/s are 2^20 bytes per second (perftest's unit). Raw results: $BENCH_LOGS/results.tsv
# ("round tool size values..."); the markdown table goes to stdout.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"
SIZES=${BENCH_SIZES:-"64 4096 65536 1048576"}
BYTES=${BENCH_BYTES:-67108864}
ROUNDS=${BENCH_ROUNDS:-3}
LAT_ITERS=${BENCH_LAT_ITERS:-1000}
iters_for() { local n=$((BYTES / $1)); [ $n -lt 100 ] && n=100; [ $n -gt 5000 ] && n=5000; echo $n; }

# ----------------------------------------------------------------------------------- guest side
if [ "${1:-}" = --guest ]; then
    set +e
    logs=$2
    # shellcheck source=/dev/null
    . "$logs/manifest.env" # PAIR_BIN, PLUGIN_SO, PERF_BIN
    out=$logs/results.tsv
    : > "$out"
    GID=${GID:-1}
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
            echo "bench: $tool -s $size failed (client $rc, server $src)"
            tail -n 5 "$log" "$log.srv"
            return
        fi
        # bw: bytes iters peak avg msgrate -> "KEY SIZE avg"
        # lat: bytes iters min max typical avg ... -> "KEY SIZE typical avg"
        case $key in
            *lat) record "$key $size $(echo "$row" | awk '{ print $5, $6 }')" ;;
            *) record "$key $size $(echo "$row" | awk '{ print $4 }')" ;;
        esac
    }

    # pair ARGS: examples/pair_bench, one process
    pair() {
        local log=$logs/pair-r$round.log
        "$PAIR_BIN" --window "${BENCH_WINDOW:-16}" "$@" >> "$log" 2>&1 \
            || { echo "bench: pair_bench $* failed"; tail -n 3 "$log"; return; }
        local line
        line=$(tail -n 1 "$log")
        case $line in
            bw\ *) record "pair_bw $(echo "$line" | sed -E 's/.*size=([0-9]+).*mbps=([0-9.]+).*/\1 \2/')" ;;
            lat\ *) record "pair_lat $(echo "$line" | sed -E 's/.*size=([0-9]+).*typical_us=([0-9.]+) avg_us=([0-9.]+).*/\1 \2 \3/')" ;;
        esac
    }

    # sr SIZE ITERS: verbsnet-perf sendrecv, two processes; "sendrecv SIZE time_us algbw_GBps"
    sr() {
        local s=$1 n=$2 log=$logs/sendrecv-$1-r$round
        env NCCL_NET_PLUGIN="$PLUGIN_SO" timeout 600 "$PERF_BIN" sendrecv --transport ib \
            --ranks 2 --json -b "$s" -e "$s" -n "$n" -w $((n / 10 + 1)) > "$log.json" 2> "$log.err" \
            || { echo "bench: sendrecv $s failed"; tail -n 5 "$log.err"; return; }
        record "$3 $s $(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["rows"][0]["out_of_place"]
print(r["time_us"], r["algbw"])' "$log.json")"
    }

    for round in $(seq 1 "$ROUNDS"); do
        for s in $SIZES; do
            n=$(iters_for "$s")
            pf ib_write_bw write_bw "$s" "$n"
            pf ib_send_bw send_bw "$s" "$n"
            pair --sizes "$s" --min-iters "$n" --max-iters "$n" --lat-iters 0
            if [ -n "$PERF_BIN" ]; then
                pf ib_write_bw write_bw_bidir "$s" "$n" -b
                sr "$s" $((n > 1000 ? 1000 : n)) sendrecv
            fi
        done
        pf ib_send_lat send_lat 8 "$LAT_ITERS"
        pair --sizes "" --lat-size 8 --lat-iters "$LAT_ITERS"
        [ -n "$PERF_BIN" ] && sr 8 "$LAT_ITERS" sendrecv_lat
    done
    echo "bench: raw results in $out"
    exit 0
fi

# ------------------------------------------------------------------------------------ host side
logs=${BENCH_LOGS:-$ROOT/target/bench-ib}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
rm -f "$logs"/*.log "$logs"/*.srv "$logs"/*.json "$logs"/*.err "$logs"/results.tsv
echo "bench: building (cargo build --release)" >&2
cargo build -p verbsnet --release --lib --example pair_bench
perf=
if [ -f testharness/Cargo.toml ]; then
    cargo build -p testharness --release --bin verbsnet-perf
    perf=$ROOT/target/release/verbsnet-perf
fi
printf 'PAIR_BIN=%q\nPLUGIN_SO=%q\nPERF_BIN=%q\n' "$ROOT/target/release/examples/pair_bench" \
    "$ROOT/target/release/libnccl-net-verbsnet.so" "$perf" > "$logs/manifest.env"
share=(-w "$ROOT")
case "$logs" in "$ROOT"/*) ;; *) share+=(-w "$logs") ;; esac
echo "bench: host load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$HERE/run-in-vm.sh" "${share[@]}" -T "${VM_BENCH_TIMEOUT:-1800}" -- \
    bash "$HERE/bench-ib.sh" --guest "$logs"
echo "bench: host load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# the table
python3 - "$logs/results.tsv" "$SIZES" <<'PY'
import statistics, sys

res = {}  # (tool, size) -> {round: [values]}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 4:
        res.setdefault((f[1], int(f[2])), {})[int(f[0])] = [float(x) for x in f[3:]]
sizes = [int(s) for s in sys.argv[2].split()]
MIB = 1 << 20

def vals(tool, size, col=0, scale=1.0):
    return {r: v[col] * scale for r, v in res.get((tool, size), {}).items() if len(v) > col}

def med(d):
    return f"{statistics.median(d.values()):.1f}" if d else "-"

def ratio(a, b):
    rs = sorted(a[r] / b[r] for r in a if r in b and b[r] > 0)
    if not rs:
        return "-"
    m = statistics.median(rs)
    return f"{m:.2f}" if len(rs) == 1 else f"{m:.2f} ({rs[0]:.2f}-{rs[-1]:.2f})"

def human(s):
    return f"{s // MIB} MiB" if s >= MIB else f"{s // 1024} KiB" if s >= 1024 else f"{s} B"

rounds = len({r for d in res.values() for r in d})
print()
print(f"Bandwidth, MB/s (2^20 B/s), median of {rounds} round(s); ratios: median of the per-round")
print("ratios (range). sendrecv: verbsnet-perf algbw x 2 (both directions), as perftest -b sums.")
print()
print("| size | ib_write_bw | ib_send_bw | verbsnet pair | pair / write_bw | ib_write_bw -b | verbsnet sendrecv | sendrecv / write_bw -b |")
print("|---|---|---|---|---|---|---|---|")
for s in sizes:
    w, sd, p = vals("write_bw", s), vals("send_bw", s), vals("pair_bw", s)
    wb = vals("write_bw_bidir", s)
    sr = vals("sendrecv", s, 1, 2 * 1e9 / MIB)  # GB/s per direction -> MB/s both
    print(f"| {human(s)} | {med(w)} | {med(sd)} | {med(p)} | {ratio(p, w)} | {med(wb)} | {med(sr)} | {ratio(sr, wb)} |")
print()
print("Latency, 8 B, us, median of the rounds.")
print()
print("| tool | typical (median) | average |")
print("|---|---|---|")
print(f"| ib_send_lat (one-way) | {med(vals('send_lat', 8, 0))} | {med(vals('send_lat', 8, 1))} |")
print(f"| verbsnet pair ping-pong, RTT/2 | {med(vals('pair_lat', 8, 0))} | {med(vals('pair_lat', 8, 1))} |")
if res.get(("sendrecv_lat", 8)):
    print(f"| verbsnet-perf sendrecv 8 B, time per iteration | - | {med(vals('sendrecv_lat', 8, 0))} |")
PY
