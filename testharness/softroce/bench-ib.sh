#!/bin/bash
# bench-ib.sh: baseline numbers on soft-RoCE, in ONE VM boot: perftest (ib_write_bw, ib_send_bw,
# ib_write_bw -b, ib_send_lat) on rxe0 in loopback, then verbsnet on the same device, and a table
# of ratios ours/perftest per size. Numbers only: nothing here asserts a speed.
#
# usage: testharness/softroce/bench-ib.sh
# env:   BENCH_SIZES (default "64 4096 65536 262144 1048576"), BENCH_BYTES (bytes per size and
#        tool, default 134217728: iterations = BENCH_BYTES / size clamped to 200..5000),
#        BENCH_WINDOW (verbsnet pair_bench sends in flight, default 16), BENCH_LAT_ITERS (1000),
#        BENCH_LOGS (default target/bench-ib), GID (index, default 1), VM_BENCH_TIMEOUT (900 s),
#        plus run-in-vm.sh's SOFTROCE_*.
#
# verbsnet is measured two ways:
#   pair     examples/pair_bench.rs: one process, a testkit comm pair, a one-way stream with
#            BENCH_WINDOW messages in flight, and an 8-byte ping-pong (one-way = RTT/2)
#   sendrecv verbsnet-perf sendrecv --transport ib --ranks 2 --json (when the harness exists):
#            two processes, each sends to the other at once, so both directions are loaded;
#            compared with ib_write_bw -b (perftest's bidirectional figure is the sum of both)
# MB/s are 2^20 bytes per second (perftest's unit). Results: $BENCH_LOGS/results.tsv and a
# markdown table on stdout.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"
SIZES=${BENCH_SIZES:-"64 4096 65536 262144 1048576"}
BYTES=${BENCH_BYTES:-134217728}
iters_for() { local n=$((BYTES / $1)); [ $n -lt 200 ] && n=200; [ $n -gt 5000 ] && n=5000; echo $n; }

# ----------------------------------------------------------------------------------- guest side
if [ "${1:-}" = --guest ]; then
    set +e
    logs=$2
    # shellcheck source=/dev/null
    . "$logs/manifest.env" # PAIR_BIN, PLUGIN_SO, PERF_BIN
    out=$logs/results.tsv
    : > "$out"
    GID=${GID:-1}
    echo "bench: in the VM: kernel $(uname -r), $(nproc) vCPUs; rxe0 active_mtu $(ibv_devinfo -d rxe0 | awk '/active_mtu/ { print $2 }')"
    # pf TOOL KEY SIZE ITERS [ARGS]: perftest server + client on rxe0; appends "KEY SIZE value..."
    pf() {
        local tool=$1 key=$2 size=$3 n=$4; shift 4
        timeout 300 "$tool" -d rxe0 -x "$GID" -F -s "$size" -n "$n" "$@" > "$logs/srv.log" 2>&1 &
        local sp=$! rc try
        # the server needs a moment to listen (and the previous one to let go of the port)
        for try in 1 2 3 4 5 6 7 8 9 10; do
            sleep 0.5
            timeout 300 "$tool" -d rxe0 -x "$GID" -F -s "$size" -n "$n" "$@" 127.0.0.1 \
                > "$logs/$key-$size.log" 2>&1
            rc=$?
            grep -q "Couldn't connect" "$logs/$key-$size.log" || break
            echo "bench: $tool: the server is not listening yet (try $try)" >&2
        done
        [ $rc = 0 ] || kill "$sp" 2>/dev/null
        wait $sp
        local src=$?
        local row
        row=$(grep -E "^ *$size +[0-9]+ " "$logs/$key-$size.log" | tail -n 1)
        if [ $rc != 0 ] || [ $src != 0 ] || [ -z "$row" ]; then
            echo "bench: $tool -s $size failed (client $rc, server $src)"
            tail -n 5 "$logs/$key-$size.log" "$logs/srv.log"
            return
        fi
        # bw: bytes iters peak avg msgrate; lat: bytes iters min max typical avg stdev p99 p99.9
        echo "$key $size $row" | awk '{ $3 = ""; print }' | tr -s ' ' >> "$out"
        echo "bench: $key $row"
    }
    for s in $SIZES; do pf ib_write_bw write_bw "$s" "$(iters_for "$s")"; done
    for s in $SIZES; do pf ib_send_bw send_bw "$s" "$(iters_for "$s")"; done
    if [ -n "$PERF_BIN" ]; then
        for s in $SIZES; do pf ib_write_bw write_bw_bidir "$s" "$(iters_for "$s")" -b; done
    fi
    pf ib_send_lat send_lat 8 "${BENCH_LAT_ITERS:-1000}"

    # verbsnet, one process
    n_min=$(iters_for 1073741824) n_max=$(iters_for 1)
    "$PAIR_BIN" --sizes "${SIZES// /,}" --bytes "$BYTES" --min-iters "$n_min" --max-iters "$n_max" \
        --window "${BENCH_WINDOW:-16}" --lat-size 8 --lat-iters "${BENCH_LAT_ITERS:-1000}" \
        > "$logs/pair.log" 2>&1
    rc=$?
    sed 's/^/bench: pair /' "$logs/pair.log"
    [ $rc = 0 ] || echo "bench: pair_bench failed ($rc)"
    awk '/^bw / { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                  print "pair_bw", v["size"], v["iters"], v["mbps"] }
         /^lat / { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                  print "pair_lat", v["size"], v["iters"], v["min_us"], v["typical_us"], v["avg_us"], v["p99_us"] }' \
        "$logs/pair.log" >> "$out"

    # verbsnet, two processes through the plugin as NCCL loads it
    if [ -n "$PERF_BIN" ]; then
        for s in $SIZES; do
            n=$(iters_for "$s")
            env NCCL_NET_PLUGIN="$PLUGIN_SO" timeout 600 "$PERF_BIN" sendrecv --transport ib \
                --ranks 2 --json -b "$s" -e "$s" -n "$n" -w $((n / 10 + 1)) \
                > "$logs/sendrecv-$s.json" 2> "$logs/sendrecv-$s.err"
            rc=$?
            [ $rc = 0 ] || { echo "bench: sendrecv $s failed ($rc)"; tail -n 5 "$logs/sendrecv-$s.err"; }
            python3 - "$logs/sendrecv-$s.json" "$s" >> "$out" <<'PY'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception:
    sys.exit(0)
for r in j.get("rows", []):
    m = r["out_of_place"]
    print("sendrecv", r["size"], m["time_us"], m["algbw"])
PY
        done
        n=${BENCH_LAT_ITERS:-1000}
        env NCCL_NET_PLUGIN="$PLUGIN_SO" timeout 600 "$PERF_BIN" sendrecv --transport ib \
            --ranks 2 --json -b 8 -e 8 -n "$n" -w $((n / 10 + 1)) \
            > "$logs/sendrecv-lat.json" 2> "$logs/sendrecv-lat.err"
        python3 - "$logs/sendrecv-lat.json" >> "$out" <<'PY'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception:
    sys.exit(0)
for r in j.get("rows", []):
    print("sendrecv_lat", r["size"], r["out_of_place"]["time_us"])
PY
    fi
    echo "bench: results in $out"
    exit 0
fi

# ------------------------------------------------------------------------------------ host side
logs=${BENCH_LOGS:-$ROOT/target/bench-ib}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
rm -f "$logs"/*.log "$logs"/*.json "$logs"/*.err "$logs"/results.tsv
echo "bench: building (cargo build --release)" >&2
cargo build -p verbsnet --release --lib --example pair_bench
perf=
if [ -f testharness/src/perf.rs ]; then
    cargo build -p testharness --release --bin verbsnet-perf
    perf=$ROOT/target/release/verbsnet-perf
fi
printf 'PAIR_BIN=%q\nPLUGIN_SO=%q\nPERF_BIN=%q\n' "$ROOT/target/release/examples/pair_bench" \
    "$ROOT/target/release/libnccl-net-verbsnet.so" "$perf" > "$logs/manifest.env"
share=(-w "$ROOT")
case "$logs" in "$ROOT"/*) ;; *) share+=(-w "$logs") ;; esac
"$HERE/run-in-vm.sh" "${share[@]}" -T "${VM_BENCH_TIMEOUT:-900}" -- \
    bash "$HERE/bench-ib.sh" --guest "$logs"

# the table
python3 - "$logs/results.tsv" "$SIZES" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 3:
        rows.setdefault(f[0], {})[int(f[1])] = f[2:]
sizes = [int(s) for s in sys.argv[2].split()]

def bw(key, s, col):
    try:
        return float(rows[key][s][col])
    except (KeyError, IndexError, ValueError):
        return None

def fmt(v, d=1):
    return "-" if v is None else f"{v:.{d}f}"

def ratio(a, b):
    return "-" if a is None or not b else f"{a / b:.2f}"

def human(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB" if s >= 1024 else f"{s} B"

print()
print("Bandwidth, MB/s (2^20 B/s); perftest columns are BW average.")
print()
print("| size | ib_write_bw | ib_send_bw | verbsnet pair | pair / write_bw | ib_write_bw -b (sum) | verbsnet sendrecv (sum) | sendrecv / write_bw -b |")
print("|---|---|---|---|---|---|---|---|")
for s in sizes:
    w, sd = bw("write_bw", s, 2), bw("send_bw", s, 2)
    p = bw("pair_bw", s, 1)
    wb = bw("write_bw_bidir", s, 2)
    # verbsnet-perf algbw is GB/s (1e9) per direction; both directions run at once
    sr = bw("sendrecv", s, 1)
    sr = None if sr is None else 2 * sr * 1e9 / (1 << 20)
    print(f"| {human(s)} | {fmt(w)} | {fmt(sd)} | {fmt(p)} | {ratio(p, w)} | {fmt(wb)} | {fmt(sr)} | {ratio(sr, wb)} |")
print()
print("Latency, 8 B, us (one-way).")
print()
print("| tool | typical | avg |")
print("|---|---|---|")
if "send_lat" in rows:
    r = rows["send_lat"][8]
    print(f"| ib_send_lat | {float(r[3]):.2f} | {float(r[4]):.2f} |")
if "pair_lat" in rows:
    r = rows["pair_lat"][8]
    print(f"| verbsnet pair ping-pong (RTT/2) | {float(r[2]):.2f} | {float(r[3]):.2f} |")
if "sendrecv_lat" in rows:
    r = rows["sendrecv_lat"][8]
    print(f"| verbsnet-perf sendrecv 8 B (time per iteration) | - | {float(r[0]):.2f} |")
PY
