#!/bin/bash
# vm-tests.sh: build the ib transport's integration tests on the host, then run them inside the
# soft-RoCE VM against rxe0. This is what CI calls.
#
# usage: testharness/softroce/vm-tests.sh [extra test-binary args, e.g. a test name or --nocapture]
# env:   VM_TESTS_TIMEOUT (seconds, default 900), CARGO_PROFILE_ARGS (e.g. --release),
#        plus everything run-in-vm.sh understands (SOFTROCE_*).
# Needs: install-deps.sh (qemu, kernel, rdma-core, ...) and a Rust toolchain.
#
# The test binary runs directly (cargo in the guest would spend seconds on fingerprints under
# TCG). Exit status: the tests' (0 = all passed), 255 = VM failure, 124 = timeout.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"

# shellcheck disable=SC2086 # CARGO_PROFILE_ARGS is a word list
bin=$(cargo test -p verbsnet --test ib_transport --no-run ${CARGO_PROFILE_ARGS:-} \
        --message-format=json-render-diagnostics \
      | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
       and m["target"]["name"] == "ib_transport":
        print(m["executable"])')
[ -n "$bin" ] || { echo "vm-tests: no ib_transport test binary was built" >&2; exit 1; }
# The plugin must load where rdma-core is absent: nothing may link libibverbs. The test binary
# contains the whole ib transport, so it is the strict check (the cdylib only once it is used).
for f in "$bin" "$ROOT"/target/{debug,release}/libnccl_net_verbsnet.so; do
    [ -f "$f" ] || continue
    if readelf -d "$f" | grep -q 'NEEDED.*libibverbs'; then
        echo "vm-tests: ${f#"$ROOT"/} has a NEEDED entry for libibverbs (call it through dl.rs)" >&2
        exit 1
    fi
done
echo "vm-tests: running ${bin#"$ROOT"/} in the soft-RoCE VM" >&2
start=$(date +%s)
set +e
"$HERE/run-in-vm.sh" -w "$ROOT" -T "${VM_TESTS_TIMEOUT:-900}" -- \
    env RUST_BACKTRACE=1 RUST_TEST_THREADS="${RUST_TEST_THREADS:-2}" "$bin" "$@"
rc=$?
set -e
echo "vm-tests: exit status $rc after $(( $(date +%s) - start )) s" >&2
exit $rc
