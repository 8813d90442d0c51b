#!/usr/bin/env bash
# CPU-only self test of the stock-NCCL GPU check (docs/gpu-check.md): everything in
# testharness/gpu that can be tested without a GPU, NCCL or nvcc.
#
#     bash testharness/gpu/selftest.sh
#
# 1. bash -n and shellcheck (when installed) on the scripts; py_compile on the Python.
# 2. report.c unit tests (gcc, with ASan/UBSan when available).
# 3. allreduce_check.cu compiles as C and as C++ against fake_nccl.h.
# 4. run-gpu-check.sh's log assertions against the sample NCCL logs in testdata/ (one per
#    NCCL version's wording, and each way a run can fall back or fail), its table check,
#    ratio table, byte parser and version compare.
# 5. run-gpu-check.sh end to end with VERBSNET_GPU_FAKE=1 (gcc + fake NCCL, 2 real
#    processes): a passing run, wrong results, a hang (inner and outer timeout), an NCCL
#    async error, a plugin with another name, a plugin that links libibverbs, a missing
#    plugin, an exhausted time budget; what $OUT holds afterwards.
# 6. torch_allreduce.py with the gloo backend on the CPU (when torch imports), also with
#    one corrupted element.
#
# Environment: SELFTEST_PLUGIN (default target/release/libnccl_net_verbsnet.so when it exists,
# else a stand-in .so built here), SELFTEST_TORCH_PYTHON (default python3).
# Ends with "selftest: N passed, N failed"; exit status 0 only when none failed.

set -uo pipefail

GPU_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$GPU_DIR/../.." && pwd)"
CHECK="$GPU_DIR/run-gpu-check.sh"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/verbsnet-gpu-selftest.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "  pass  $*"; }
fail() { FAILED=$((FAILED + 1)); echo "  FAIL  $*"; }
# expect_grep NAME FILE FIXED-STRING: pass when FILE contains the string.
expect_grep() {
    if grep -qF -- "$3" "$2"; then
        pass "$1"
    else
        fail "$1: '$3' not in $2"
        sed 's/^/        | /' "$2" | tail -n 30
    fi
}

echo "== 1. syntax and lint"
for f in "$CHECK" "$GPU_DIR/selftest.sh"; do
    if bash -n "$f"; then pass "bash -n $(basename "$f")"; else fail "bash -n $(basename "$f")"; fi
    if command -v shellcheck >/dev/null 2>&1; then
        if shellcheck "$f"; then pass "shellcheck $(basename "$f")"; else fail "shellcheck $(basename "$f")"; fi
    else
        echo "  skip  shellcheck not installed (apt-get install shellcheck)"
    fi
done
if python3 -c "import py_compile, sys; py_compile.compile(sys.argv[1], cfile='$TMP/t.pyc', doraise=True)" "$GPU_DIR/torch_allreduce.py"; then
    pass "py_compile torch_allreduce.py"
else
    fail "py_compile torch_allreduce.py"
fi

echo "== 2. report.c unit tests"
SAN=("-fsanitize=address,undefined" -fno-omit-frame-pointer)
if ! echo 'int main(void){return 0;}' | gcc "${SAN[@]}" -x c - -o "$TMP/san" 2>/dev/null; then
    SAN=()
fi
CFLAGS=(-std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -O1 "${SAN[@]}")
if gcc "${CFLAGS[@]}" -o "$TMP/report_test" "$GPU_DIR/report_test.c" "$GPU_DIR/report.c" -lm; then
    if "$TMP/report_test"; then pass "report_test"; else fail "report_test"; fi
else
    fail "report_test build"
fi

echo "== 3. allreduce_check.cu against fake_nccl.h"
if gcc "${CFLAGS[@]}" -DVERBSNET_FAKE_NCCL -x c "$GPU_DIR/allreduce_check.cu" -x none "$GPU_DIR/report.c" -ldl -o "$TMP/arc_fake"; then
    pass "compiles as C (-Wall -Wextra -Werror)"
else
    fail "compiles as C"
fi
if g++ -std=c++17 -D_GNU_SOURCE -DVERBSNET_FAKE_NCCL -Wall -Wextra -Werror -fsyntax-only -x c++ "$GPU_DIR/allreduce_check.cu"; then
    pass "compiles as C++ (what nvcc does with it)"
else
    fail "compiles as C++"
fi
if "$TMP/arc_fake" --rank 0 >"$TMP/usage.txt" 2>&1; then
    fail "missing arguments rejected"
else
    expect_grep "missing arguments rejected with usage" "$TMP/usage.txt" "usage:"
fi

echo "== 4. log assertions (testdata/)"
# shellcheck source=testharness/gpu/run-gpu-check.sh disable=SC1091
source "$CHECK"
for log in "$GPU_DIR"/testdata/*.log; do
    name="$(basename "$log")"
    net=verbsnet version="" external=1
    while IFS= read -r kv; do
        case "$kv" in
            net=*) net="${kv#net=}" ;;
            version=*) version="${kv#version=}" ;;
            external=*) external="${kv#external=}" ;;
        esac
    done < <(sed -n 's/^#selftest expect=[a-z]* //p' "$log" | tr ' ' '\n')
    # The #selftest lines are the test's, not NCCL's: check the log without them.
    grep -v '^#selftest ' "$log" >"$TMP/log" || true
    vn_check_nccl_log "$TMP/log" "$net" "$version" "$external" >"$TMP/out" 2>&1
    rc=$?
    if [[ "$name" == pass-* && "$rc" -ne 0 ]] || [[ "$name" == fail-* && "$rc" -eq 0 ]]; then
        fail "$name: check returned $rc"
        sed 's/^/        | /' "$TMP/out"
        continue
    fi
    ok=1
    while IFS= read -r want; do
        if ! grep -qF -- "$want" "$TMP/out"; then
            ok=0
            fail "$name: output lacks '$want'"
            sed 's/^/        | /' "$TMP/out"
        fi
    done < <(sed -n 's/^#selftest want=//p' "$log")
    [[ "$ok" == 1 ]] && pass "$name ($([[ $rc -eq 0 ]] && echo accepted || echo rejected))"
done

if vn_check_table "$GPU_DIR/testdata/table-ours.txt" 3 >"$TMP/out"; then pass "table: good table accepted"; else fail "table: good table"; cat "$TMP/out"; fi
if vn_check_table "$GPU_DIR/testdata/table-wrong.txt" 3 >"$TMP/out"; then
    fail "table: wrong results accepted"
else
    expect_grep "table: wrong results rejected" "$TMP/out" "FAIL: wrong results: 1048576 B: 7 wrong"
fi
if vn_check_table "$GPU_DIR/testdata/table-short.txt" 3 >"$TMP/out"; then
    fail "table: short table accepted"
else
    expect_grep "table: short table rejected" "$TMP/out" "table has 2 sizes, expected 3"
fi
if vn_check_table "$TMP/none.txt" 3 >"$TMP/out"; then fail "table: missing table accepted"; else pass "table: missing table rejected"; fi
vn_ratio_table "$GPU_DIR/testdata/table-ours.txt" "$GPU_DIR/testdata/table-socket.txt" >"$TMP/ratio"
# ours 40/1000/1000 us vs theirs 20/2000/4000 us: ratios 0.50, 2.00, 4.00.
if awk '$1 == 8 && $4 == "0.50" {a=1} $1 == 1048576 && $4 == "2.00" {b=1} $1 == 2097152 && $4 == "4.00" {c=1} END {exit !(a && b && c)}' "$TMP/ratio"; then
    pass "ratio table from the time column"
else
    fail "ratio table"
    cat "$TMP/ratio"
fi
expect_grep "ratio table: mean for >= 1 MiB" "$TMP/ratio" "sizes >= 1 MiB: 3.00 (2 sizes)"
for c in "256M 268435456" "4k 4096" "1GiB 1073741824" "100 100" "64KB 65536"; do
    read -r text bytes <<<"$c"
    if [[ "$(vn_parse_bytes "$text")" == "$bytes" ]]; then pass "vn_parse_bytes $text"; else fail "vn_parse_bytes $text -> $(vn_parse_bytes "$text")"; fi
done
if vn_parse_bytes "12X" >/dev/null || vn_parse_bytes "" >/dev/null; then fail "vn_parse_bytes rejects junk"; else pass "vn_parse_bytes rejects junk"; fi
if [[ "$(vn_sweep_count 8 268435456)" == 26 && "$(vn_sweep_count 8 4194304)" == 20 ]]; then pass "vn_sweep_count"; else fail "vn_sweep_count"; fi
if vn_version_ge 2.32.3 2.26.0 && vn_version_ge 2.26.0 2.26.0 && ! vn_version_ge 2.9.1 2.26.0 && ! vn_version_ge 2.25.1 2.26.0; then
    pass "vn_version_ge"
else
    fail "vn_version_ge"
fi

echo "== 5. run-gpu-check.sh end to end with the fake NCCL"
PLUGIN="${SELFTEST_PLUGIN:-$REPO/target/release/libnccl_net_verbsnet.so}"
cat >"$TMP/plugin.c" <<'EOF'
/* Stand-in plugins: only the first member (the name) of the v8 table is read by the fake. */
#ifndef NAME
#define NAME "verbsnet"
#endif
struct table { const char *name; void *rest[18]; };
__attribute__((visibility("default"))) const struct table ncclNetPlugin_v8 = { NAME, { 0 } };
#ifdef USE_VERBS
void ibv_get_device_list(void);
void vn_use(void) { ibv_get_device_list(); }
#endif
EOF
gcc -shared -fPIC -o "$TMP/libnccl_net_verbsnet.so" "$TMP/plugin.c"
gcc -shared -fPIC -DNAME='"othernet"' -o "$TMP/othername.so" "$TMP/plugin.c"
echo 'void ibv_get_device_list(void) {}' >"$TMP/ibv.c"
gcc -shared -fPIC -Wl,-soname,libibverbs.so.1 -o "$TMP/libibverbs.so.1" "$TMP/ibv.c"
gcc -shared -fPIC -DUSE_VERBS -o "$TMP/verbsdep.so" "$TMP/plugin.c" -L"$TMP" -l:libibverbs.so.1
if [[ ! -f "$PLUGIN" ]]; then
    echo "  note  $PLUGIN not built: using a stand-in .so that has only the v8 table's name"
    PLUGIN="$TMP/libnccl_net_verbsnet.so"
fi

# fake_run NAME EXPECTED_RC [VAR=value ...] [-- ARGS...]: runs the check, output in $TMP/NAME.
fake_run() {
    local name="$1" want="$2"
    shift 2
    local -a envs=() args=()
    while [[ $# -gt 0 && "$1" != -- ]]; do envs+=("$1"); shift; done
    [[ $# -gt 0 ]] && shift
    args=("$@")
    mkdir -p "$TMP/$name"
    env VERBSNET_GPU_FAKE=1 VERBSNET_GPU_MAX_BYTES=1M "VERBSNET_PLUGIN_SO=$PLUGIN" "OUT=$TMP/$name/out" \
        "${envs[@]}" bash "$CHECK" "${args[@]}" >"$TMP/$name/stdout" 2>&1
    local rc=$?
    if [[ "$rc" -eq "$want" ]]; then
        pass "$name: exit $rc"
    else
        fail "$name: exit $rc, expected $want"
        sed 's/^/        | /' "$TMP/$name/stdout" | tail -n 40
    fi
}

fake_run ok 0
expect_grep "ok: summary says PASS and FAKE" "$TMP/ok/out/summary.txt" "GPU check: PASS (FAKE NCCL SELF-TEST"
expect_grep "ok: verbsnet step passed" "$TMP/ok/out/summary.txt" "PASS  verbsnet"
expect_grep "ok: socket step passed" "$TMP/ok/out/summary.txt" "PASS  socket"
expect_grep "ok: ratio table in summary" "$TMP/ok/out/summary.txt" "busbw ratio verbsnet"
expect_grep "ok: plugin load proven from the log" "$TMP/ok/out/check.log" "NCCL loaded the plugin: NET/Plugin: Loaded net plugin verbsnet (v8)"
expect_grep "ok: both ranks' logs kept" "$TMP/ok/out/nccl-verbsnet.log" "===== verbsnet rank 1: exit 0 ====="
expect_grep "ok: ranks got different NCCL_HOSTID" "$TMP/ok/out/nccl-verbsnet.log" "NCCL_HOSTID set by environment to verbsnet-gpu-check-host1"
expect_grep "ok: socket run had no plugin" "$TMP/ok/out/nccl-socket.log" "Using network Socket"
if grep -q 'Loaded net plugin' "$TMP/ok/out/nccl-socket.log"; then fail "ok: socket run loaded a plugin"; else pass "ok: socket run loaded no plugin"; fi
nfiles="$(find "$TMP/ok/out" -type f | wc -l)"
badnames="$(find "$TMP/ok/out" -mindepth 1 | sed "s|$TMP/ok/out/||" | grep -vE '^[A-Za-z0-9._-]+$')"
if [[ "$nfiles" -le 8 && -z "$badnames" ]]; then
    pass "ok: \$OUT holds $nfiles plain-named files (the device returns at most 8)"
else
    fail "ok: \$OUT holds $nfiles files, odd names: $badnames"
fi

fake_run wrong 1 VERBSNET_FAKE_CORRUPT_BYTES=4096 -- --skip-socket
expect_grep "wrong: reason names the size" "$TMP/wrong/out/summary.txt" "wrong results: 4096 B: 1 wrong"
expect_grep "wrong: rank exit explained" "$TMP/wrong/out/summary.txt" "exit 1: wrong results"

fake_run hang-inner 1 VERBSNET_FAKE_HANG_BYTES=1024 VERBSNET_GPU_SIZE_TIMEOUT=2 -- --skip-socket
expect_grep "hang-inner: reason" "$TMP/hang-inner/out/summary.txt" "all_reduce of 1024 bytes did not complete in time (hang?)"

fake_run hang-outer 1 VERBSNET_FAKE_HANG_BYTES=1024 VERBSNET_GPU_RUN_TIMEOUT=3 -- --skip-socket
expect_grep "hang-outer: reason" "$TMP/hang-outer/out/summary.txt" "killed after 3s by timeout (hang?)"

fake_run async 1 VERBSNET_FAKE_ASYNC_ERROR_BYTES=2048 -- --skip-socket
expect_grep "async: reason" "$TMP/async/out/summary.txt" "NCCL async error 6"

fake_run other-name 1 "VERBSNET_PLUGIN_SO=$TMP/othername.so" -- --skip-socket
expect_grep "other-name: NCCL refused NCCL_NET=verbsnet" "$TMP/other-name/out/summary.txt" "Failed to initialize any NET plugin"

fake_run verbs-needed 1 "VERBSNET_PLUGIN_SO=$TMP/verbsdep.so" "LD_LIBRARY_PATH=$TMP"
expect_grep "verbs-needed: preflight names it" "$TMP/verbs-needed/stdout" "MISSING a plugin without a NEEDED verbs library (it has: libibverbs.so.1"
expect_grep "verbs-needed: preflight step failed" "$TMP/verbs-needed/out/summary.txt" "FAIL  preflight"

fake_run no-plugin 1 "VERBSNET_PLUGIN_SO=$TMP/nonexistent.so"
expect_grep "no-plugin: preflight names it" "$TMP/no-plugin/stdout" "MISSING plugin $TMP/nonexistent.so"

fake_run preflight-missing 1 "VERBSNET_PLUGIN_SO=$TMP/nonexistent.so" -- --preflight
fake_run preflight-ok 0 -- --preflight
fake_run no-budget 1 VERBSNET_GPU_BUDGET_S=20
expect_grep "no-budget: reason" "$TMP/no-budget/out/summary.txt" "no time left in the budget"

fake_run bad-arg 2 -- --frobnicate
fake_run help 0 -- --help
expect_grep "help: prints the usage" "$TMP/help/stdout" "--preflight"

# The fake refuses two ranks with one NCCL_HOSTID, as NCCL 2.30+ does; the log check must say so.
mkdir -p "$TMP/samehost"
for r in 0 1; do
    env TMPDIR="$TMP/samehost" NCCL_DEBUG=INFO NCCL_HOSTID=same NCCL_NET=verbsnet "NCCL_NET_PLUGIN=$PLUGIN" \
        "$TMP/arc_fake" --rank "$r" --nranks 2 --id-file "$TMP/samehost/id" --max-bytes 64 >"$TMP/samehost/r$r.log" 2>&1 &
done
wait
vn_check_nccl_log "$TMP/samehost/r1.log" verbsnet "" 1 >"$TMP/out"
expect_grep "same NCCL_HOSTID: duplicate-GPU refusal reported" "$TMP/out" "Multiple Ranks are using the same GPU"

echo "== 6. torch_allreduce.py (gloo, CPU)"
TPY="${SELFTEST_TORCH_PYTHON:-python3}"
if "$TPY" -c 'import torch.distributed' >/dev/null 2>&1; then
    if timeout 120 "$TPY" "$GPU_DIR/torch_allreduce.py" --backend gloo --log-dir "$TMP/torch-ok" --sizes 8,4K,1M >"$TMP/torch-ok.txt" 2>&1; then
        pass "torch gloo: exit 0"
    else
        fail "torch gloo"
        tail -n 20 "$TMP/torch-ok.txt"
    fi
    expect_grep "torch gloo: PASS line" "$TMP/torch-ok.txt" "torch-check: PASS: 2 ranks"
    expect_grep "torch gloo: rank 1 had its own NCCL_HOSTID" "$TMP/torch-ok/rank1.log" "NCCL_HOSTID=verbsnet-gpu-check-host1"
    if VERBSNET_TORCH_CORRUPT_BYTES=4096 timeout 120 "$TPY" "$GPU_DIR/torch_allreduce.py" --backend gloo --log-dir "$TMP/torch-bad" --sizes 8,4K >"$TMP/torch-bad.txt" 2>&1; then
        fail "torch gloo with a corrupted element passed"
    else
        pass "torch gloo with a corrupted element: non-zero exit"
    fi
    expect_grep "torch gloo corrupt: names the size" "$TMP/torch-bad/rank1.log" "1 of 1024 elements wrong at 4096 bytes"
    expect_grep "torch gloo corrupt: table #wrong" "$TMP/torch-bad.txt" "# Out of bounds values : 1 FAILED"
else
    echo "  skip  no torch for $TPY (set SELFTEST_TORCH_PYTHON to a python with torch)"
fi

echo "selftest: $PASSED passed, $FAILED failed"
[[ "$FAILED" -eq 0 ]]
