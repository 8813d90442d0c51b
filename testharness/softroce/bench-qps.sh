#!/bin/bash
# bench-qps.sh: one-way stream bandwidth through the plugin with 1 and several QPs per
# connection (VERBSNET_IB_QPS_PER_CONNECTION, split on and off), and optionally an older build,
# rounds interleaved (the order of the configs rotates each round), in ONE VM boot on
# soft-RoCE (or on the host over tcp with --tcp).
# Numbers only: nothing here asserts a speed (docs/performance.md, "Several QPs per connection").
#
# usage: testharness/softroce/bench-qps.sh [--tcp]
# env:   QPS_SIZES (default "4096 65536 1048576"), QPS_ROUNDS (3), QPS_BYTES (bytes per run,
#        default 33554432: iterations = QPS_BYTES / size, clamped to 200..3000), QPS_WINDOW
#        (verbsnet-perf -W, 32), QPS_CONFIGS (default "1q 4q 4q-split": label per config,
#        NNq = NN QPs round robin, NNq-split = NN QPs with VERBSNET_IB_SPLIT_DATA_ON_QPS=1),
#        QPS_BEFORE (a directory holding an older build's libnccl-net-verbsnet.so and
#        verbsnet-perf: measured too, as "before"), QPS_LOGS (target/bench-qps), run-in-vm.sh's
#        SOFTROCE_*.
# Output: per size and config the median MB/s (2^20 B/s) over the rounds and the median of the
# per-round ratios to "1q" with their range. Raw: $QPS_LOGS/results.tsv.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"
SIZES=${QPS_SIZES:-"4096 65536 1048576"}
ROUNDS=${QPS_ROUNDS:-3}
BYTES=${QPS_BYTES:-33554432}
WINDOW=${QPS_WINDOW:-32}
CONFIGS=${QPS_CONFIGS:-"1q 4q 4q-split"}

# measure LOGS TRANSPORT: every round, every size, every config back to back
measure() {
    local logs=$1 transport=$2 round s n cfg so bin q split log
    local out=$logs/results.tsv
    : > "$out"
    # shellcheck source=/dev/null
    . "$logs/manifest.env" # PLUGIN_SO, PERF_BIN, BEFORE
    local configs=$CONFIGS
    [ -n "$BEFORE" ] && configs="before $configs"
    for round in $(seq 1 "$ROUNDS"); do
        for s in $SIZES; do
            n=$((BYTES / s))
            [ $n -lt 200 ] && n=200
            [ $n -gt 3000 ] && n=3000
            # the order rotates by one each round, so no config always follows the same one
            local -a cl=($configs)
            local k rot=()
            for k in "${!cl[@]}"; do rot+=("${cl[$(((k + round - 1) % ${#cl[@]}))]}"); done
            for cfg in "${rot[@]}"; do
                so=$PLUGIN_SO bin=$PERF_BIN q=1 split=0
                case $cfg in
                    before) so=$BEFORE/libnccl-net-verbsnet.so bin=$BEFORE/verbsnet-perf ;;
                    *q-split) q=${cfg%q-split} split=1 ;;
                    *q) q=${cfg%q} ;;
                esac
                log=$logs/$cfg-$s-r$round
                if [ "$cfg" = before ]; then
                    env NCCL_NET_PLUGIN="$so" timeout 600 "$bin" stream --transport "$transport" \
                        --ranks 2 --json -b "$s" -e "$s" -n "$n" -w $((n / 10 + 1)) -W "$WINDOW" \
                        > "$log.json" 2> "$log.err" || { echo "qps: $cfg $s failed"; tail -n 5 "$log.err"; continue; }
                else
                    env NCCL_NET_PLUGIN="$so" VERBSNET_IB_QPS_PER_CONNECTION="$q" \
                        VERBSNET_IB_SPLIT_DATA_ON_QPS="$split" timeout 600 "$bin" stream \
                        --transport "$transport" --ranks 2 --json -b "$s" -e "$s" -n "$n" \
                        -w $((n / 10 + 1)) -W "$WINDOW" \
                        > "$log.json" 2> "$log.err" || { echo "qps: $cfg $s failed"; tail -n 5 "$log.err"; continue; }
                fi
                local bw
                bw=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["rows"][0]["bw_MBps"])' "$log.json")
                echo "$round $cfg $s $bw" >> "$out"
                echo "qps: round $round: $cfg $s $bw MB/s"
            done
        done
    done
}

if [ "${1:-}" = --guest ]; then
    measure "$2" ib
    exit 0
fi

tables() {
    python3 - "$1/results.tsv" <<'PY'
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
by = {}
for r, cfg, s, bw in rows:
    by.setdefault((int(s), cfg), {})[int(r)] = float(bw)
sizes = sorted({s for s, _ in by})
cfgs = []
for _, c in by:
    if c not in cfgs:
        cfgs.append(c)
print(f"{'size':>9} {'config':>10} {'MB/s (median)':>14} {'vs 1q (median, range)':>24}")
for s in sizes:
    for c in cfgs:
        v = by.get((s, c))
        if not v:
            continue
        base = by.get((s, "1q"), {})
        ratios = [v[r] / base[r] for r in v if r in base and base[r] > 0]
        rat = (f"{st.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
               if ratios else "-")
        print(f"{s:>9} {c:>10} {st.median(v.values()):>14.1f} {rat:>24}")
PY
}

transport=ib
[ "${1:-}" = --tcp ] && transport=tcp
logs=${QPS_LOGS:-$ROOT/target/bench-qps}
[ $transport = tcp ] && logs=${QPS_LOGS:-$ROOT/target/bench-qps-tcp}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
rm -f "$logs"/*.json "$logs"/*.err "$logs"/results.tsv
cargo build -p verbsnet --release --lib >&2
cargo build -p testharness --release --bin verbsnet-perf >&2
before=${QPS_BEFORE:-}
[ -n "$before" ] && before=$(cd "$before" && pwd)
printf 'PLUGIN_SO=%q\nPERF_BIN=%q\nBEFORE=%q\n' "$ROOT/target/release/libnccl-net-verbsnet.so" \
    "$ROOT/target/release/verbsnet-perf" "$before" > "$logs/manifest.env"
echo "qps: host load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
if [ $transport = tcp ]; then
    measure "$logs" tcp
else
    share=(-w "$ROOT")
    case "$logs" in "$ROOT"/*) ;; *) share+=(-w "$logs") ;; esac
    [ -n "$before" ] && share+=(-w "$before")
    QPS_SIZES=$SIZES QPS_ROUNDS=$ROUNDS QPS_BYTES=$BYTES QPS_WINDOW=$WINDOW QPS_CONFIGS=$CONFIGS \
        "$HERE/run-in-vm.sh" "${share[@]}" -T "${VM_BENCH_TIMEOUT:-2400}" -- \
        bash "$HERE/bench-qps.sh" --guest "$logs"
fi
echo "qps: host load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
tables "$logs"
