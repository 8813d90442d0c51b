//! What the harness's end-to-end tests share: a `verbsnet-perf` command with a clean plugin
//! environment, the way a failed run is shown, and reading its `--json` object.
// Each test file uses what it needs of this module.
#![allow(dead_code)]

use std::process::{Command, Output};

use serde_json::Value;

/// Per-run limit handed to the launcher (`-T`), so a hang fails the test instead of blocking it.
pub const RUN_TIMEOUT_S: &str = "300";

/// A `verbsnet-perf` command with `args` and `-T RUN_TIMEOUT_S`, with no `NCCL_*`,
/// `VERBSNET_*` or `FIXTURE_NET_*` variable of the caller (run-tests.sh sets
/// `VERBSNET_REQUIRE_PLOT`, which the plugin would WARN about as an unknown knob).
pub fn perf(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_verbsnet-perf"));
    c.args(args).args(["-T", RUN_TIMEOUT_S]);
    for (k, _) in std::env::vars() {
        if k.starts_with("NCCL_") || k.starts_with("VERBSNET_") || k.starts_with("FIXTURE_NET_") {
            c.env_remove(k);
        }
    }
    c
}

/// A finished run's status, stdout and stderr, for assertion messages.
pub fn show(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `c` with `--json`; returns the output and the last JSON object line of stdout.
pub fn run_json(c: &mut Command) -> (Output, Value) {
    let o = c.arg("--json").output().expect("run verbsnet-perf");
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON object on stdout\n{}", show(&o)));
    let v = serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON {e}\n{}", show(&o)));
    (o, v)
}
