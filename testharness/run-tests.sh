#!/bin/bash
# run-tests.sh: every test of the project (README's second command; CI runs it).
#  1. installs what the build, the plots and the soft-RoCE VM need (apt, when missing), then the
#     hygiene gates: `cargo fmt --check`, `cargo clippy -D warnings` (with
#     clippy::undocumented_unsafe_blocks denied workspace-wide), `cargo doc` with warnings denied;
#  2. host tests: engine (simulated pair), config, logging, wire formats, the tcp transport,
#     plugin-level pair and scenario tests over tcp, and the harness's multi-process runs of
#     verbsnet-perf through the real .so, `verbsnet-perf doctor` with provoked faults, and a
#     PNG from two --json runs (testharness/plot.py);
#  3. the GPU check's CPU self-test (the check itself needs a GPU machine: docs/gpu-check.md);
#  4. the soft-RoCE VM suite: the ib transport and the plugin on rdma_rxe (QEMU, Debian kernel);
#  5. the two-host suite: the plugin across two soft-RoCE VMs joined by a virtual wire.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash testharness/softroce/install-deps.sh
bash testharness/plot-setup.sh   # matplotlib for testharness/plot.py (tests/plot.rs)
echo "== hygiene gates: rustfmt, clippy (warnings denied, SAFETY comments required), rustdoc"
# rustfmt and clippy come with the toolchain (rustup's default profile); a toolchain without them
# cannot fetch them here (no network), so say so loudly instead of failing the whole run.
if cargo fmt --version > /dev/null 2>&1; then
  cargo fmt --all -- --check
else
  echo "run-tests: GATE SKIPPED: rustfmt is not installed (rustup component add rustfmt)" >&2
fi
if cargo clippy --version > /dev/null 2>&1; then
  cargo clippy --release --workspace --all-targets -- -D warnings
else
  echo "run-tests: GATE SKIPPED: clippy is not installed (rustup component add clippy)" >&2
fi
RUSTDOCFLAGS=-Dwarnings cargo doc --no-deps --workspace --quiet
echo "== build (release: the plugin .so and verbsnet-perf)"
cargo build --release --workspace
echo "== host tests"
# VERBSNET_REQUIRE_PLOT=1: the plot test fails instead of skipping when matplotlib is missing.
VERBSNET_REQUIRE_PLOT=1 cargo test --release --workspace
echo "== GPU check self-test (CPU only: scripts, log assertions, fake-NCCL runs)"
bash testharness/gpu/selftest.sh
echo "== soft-RoCE VM suite"
if [ -x testharness/softroce/vm-suite.sh ]; then
  CARGO_PROFILE_ARGS=--release testharness/softroce/vm-suite.sh
else
  CARGO_PROFILE_ARGS=--release testharness/softroce/vm-tests.sh
fi
echo "== two-host soft-RoCE suite (two VMs, one wire)"
testharness/softroce/twohost-suite.sh
