#!/usr/bin/env bash
# Instructions per plugin call, for any NCCL net plugin: runs `verbsnet-perf latency` (8 B
# ping-pong), `stream` (64 B one way), `bidir` (64 B both ways) or `all_reduce` (2 ranks,
# 8 B-4 KiB) under callgrind and
# prints, per rank, how many `isend`, `irecv` and `test` calls the proxy made and the
# user-space instructions each took on average
# (inclusive: the plugin and the verbs provider below it, e.g. librxe; the kernel's work in a
# system call is not counted). Counted where the harness calls the plugin's table
# (testharness/src/plugin/table.rs), so two plugins are measured the same way.
#
# Instruction counts do not move with the host's load, so two builds compare in one run where
# timings need many interleaved rounds (docs/performance.md, "Instructions per call").
# On soft-RoCE run it inside the VM:
#   testharness/softroce/run-in-vm.sh -w $SHARP -- testharness/softroce/calls-cg.sh \
#       verbsnet=$PWD/target/release/libnccl_net_verbsnet.so nccl-ib=$SHARP/lib/libnccl-net.so
#
# usage: calls-cg.sh [-m latency|stream|bidir|all_reduce] [-n ITERS] [-k] NAME=PLUGIN.so ...
#   -m  the mode (default latency: -b 8 -e 8; stream and bidir: -b 64 -e 64; all_reduce:
#       -b 8 -e 4K -f 8)
#   -n  timed iterations (default 400 for latency, 2000 for stream and bidir, 100 per size for
#       all_reduce; callgrind runs ~50x slower)
#   -k  keep the callgrind files (in a directory under $TMPDIR, default /tmp, printed)
# Other transports: set VERBSNET_TRANSPORT etc. as for any run (tcp works on the host).
set -euo pipefail
cd "$(dirname "$0")/../.."

mode=latency; iters=""; keep=0
while getopts "m:n:k" o; do
    case $o in
        m) mode=$OPTARG ;;
        n) iters=$OPTARG ;;
        k) keep=1 ;;
        *) sed -n '2,23p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { echo "calls-cg: name at least one plugin: NAME=PLUGIN.so" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "calls-cg: valgrind is missing (apt-get install valgrind)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "calls-cg: python3 is missing" >&2; exit 2; }
perf=target/release/verbsnet-perf
[ -x $perf ] || { echo "calls-cg: build $perf first (cargo build --release)" >&2; exit 2; }
case $mode in
    latency) args=(latency -b 8 -e 8 -n "${iters:-400}" -w 20) ;;
    stream) args=(stream -b 64 -e 64 -n "${iters:-2000}" -w 20) ;;
    bidir) args=(stream --bidir -b 64 -e 64 -n "${iters:-2000}" -w 20) ;;
    all_reduce) args=(all_reduce -b 8 -e 4K -f 8 -n "${iters:-100}" -w 10) ;;
    *) echo "calls-cg: mode latency, stream, bidir or all_reduce, not $mode" >&2; exit 2 ;;
esac

out=$(mktemp -d "${TMPDIR:-/tmp}/calls-cg.XXXXXX")
for kv in "$@"; do
    name=${kv%%=*}; so=${kv#*=}
    [ -f "$so" ] || { echo "calls-cg: $so: no such plugin" >&2; exit 2; }
    mkdir -p "$out/$name"
    NCCL_NET_PLUGIN=$so valgrind --tool=callgrind --vgdb=no --trace-children=yes \
        --callgrind-out-file="$out/$name/cg.%p" $perf "${args[@]}" --ranks 2 >"$out/$name/log" 2>&1 ||
        { echo "calls-cg: $name: verbsnet-perf failed; see $out/$name/log" >&2; tail -5 "$out/$name/log" >&2; exit 1; }
    python3 - "$name" "$mode" "$out/$name"/cg.* <<'EOF'
import re, sys
from collections import Counter
name, mode, files = sys.argv[1], sys.argv[2], sys.argv[3:]
# callgrind's format: "fn=(id) name" opens a function, "cfn=" names a callee, "calls=N ..." is
# followed by the line with the inclusive cost of those N calls.
CALLER = re.compile(r"testharness::plugin::table::Table::(isend|irecv|test)$")
rows = []
for f in files:
    names, fn, cfn, pending = {}, None, None, None
    calls, cost = Counter(), Counter()
    cmd = ""
    for line in open(f):
        if line.startswith("cmd:"):
            cmd = line
        key, _, rest = line.rstrip("\n").partition("=")
        if key in ("fn", "cfn"):
            m = re.match(r"\((\d+)\)(?: (.*))?", rest)
            if m:
                if m.group(2) is not None:
                    names[m.group(1)] = m.group(2)
                rest = names.get(m.group(1), rest)
            if key == "fn":
                fn = rest
            else:
                cfn = rest
        elif key == "calls":
            pending = int(rest.split()[0])
        elif pending is not None and line[:1] in "0123456789+-*":
            m = CALLER.search(fn or "")
            # the callee of the harness's Table method is the plugin's function pointer
            if m and cfn and not cfn.startswith(("core::", "alloc::", "testharness::")):
                calls[m.group(1)] += pending
                cost[m.group(1)] += int(line.split()[1])
            pending = None
    rank = re.search(r"--rank (\d+)", cmd)
    if rank and calls:
        rows.append((int(rank.group(1)), calls, cost))
for rank, calls, cost in sorted(rows):
    parts = [f"{k} {calls[k]} x {cost[k] / calls[k]:.0f}" for k in ("isend", "irecv", "test") if calls[k]]
    print(f"# calls-cg: {name} {mode} rank {rank}: " + ", ".join(parts) + " (calls x instructions per call)")
EOF
done
if [ $keep = 1 ]; then echo "# calls-cg: callgrind files in $out"; else rm -rf "$out"; fi
