//! End-to-end: run the `verbsnet-perf` binary with local ranks through the real plugin over
//! its tcp transport and check exit codes, the #wrong columns and where the plugin came from.
//!
//! The plugin must be built in the same profile first:
//! `cargo build --release -p verbsnet && cargo test --release -p testharness`
//! (or without `--release` for both).

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

mod common;
use common::{perf, show};

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_verbsnet-perf"))
}

/// `target/<profile>/libnccl-net-verbsnet.so`, next to the binary; panics with the build
/// command when it is missing.
fn plugin() -> PathBuf {
    let dir = exe()
        .parent()
        .expect("binary has a directory")
        .to_path_buf();
    let so = dir.join("libnccl-net-verbsnet.so");
    if !so.exists() {
        let profile = dir.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        let flag = if profile == "release" {
            " --release"
        } else {
            ""
        };
        let dangling = if so.symlink_metadata().is_ok() {
            " (the symlink is there but its target is not: cargo copies a dependency's cdylib \
             into target/<profile> only when that package itself is built)"
        } else {
            ""
        };
        panic!(
            "{} is missing{dangling}: build the plugin first with `cargo build{flag} -p verbsnet`",
            so.display()
        );
    }
    so
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|e| panic!("canonicalize {}: {e}", p.display()))
}

/// Runs with `--json` and returns the object.
fn run_json(args: &[&str]) -> (Output, Value) {
    let _ = plugin();
    common::run_json(&mut perf(args))
}

/// Asserts a clean run: exit 0, every #wrong 0, the plugin from next to the binary.
fn assert_clean(coll: &str, nranks: usize, o: &Output, v: &Value) {
    assert!(
        o.status.success(),
        "{coll} with {nranks} ranks failed\n{}",
        show(o)
    );
    assert_eq!(v["collective"], coll);
    assert_eq!(v["nranks"], nranks);
    assert_eq!(v["ok"], true, "{}", show(o));
    assert_eq!(v["out_of_bounds"], 0, "{}", show(o));
    let rows = v["rows"].as_array().expect("rows");
    assert!(!rows.is_empty());
    for r in rows {
        for placement in ["out_of_place", "in_place"] {
            assert_eq!(
                r[placement]["wrong"],
                0,
                "{coll} n={nranks} row {r}\n{}",
                show(o)
            );
            // A measured time (a transfer takes time), and algbw derived from it as
            // nccl-tests does: bytes / time, in GB/s.
            let t = r[placement]["time_us"].as_f64().expect("time");
            assert!(t > 0.0 && t.is_finite(), "{coll} row {r}");
            let size = r["size"].as_f64().expect("size");
            let algbw = r[placement]["algbw"].as_f64().expect("algbw");
            let want = size / (t * 1e3);
            assert!(
                (algbw - want).abs() <= 1e-9 * want.max(1.0),
                "{coll} row {r}: algbw {algbw} GB/s, size / time gives {want}"
            );
        }
    }
    let want = canonical(&plugin());
    let got = PathBuf::from(v["plugin"]["file"].as_str().expect("plugin.file"));
    assert_eq!(got, want, "plugin loaded from an unexpected file");
    for r in v["ranks"].as_array().expect("ranks") {
        assert_eq!(PathBuf::from(r["plugin_file"].as_str().unwrap()), want);
    }
    assert_eq!(v["plugin"]["name"], "verbsnet");
    // verbsnet keeps the parts of the contract NCCL does not depend on, too.
    assert_eq!(v["deviations"], serde_json::json!([]), "{}", show(o));
}

fn sweep(coll: &str) {
    for n in [2, 3, 4] {
        let ranks = n.to_string();
        let (o, v) = run_json(&[
            coll,
            "--ranks",
            &ranks,
            "-b",
            "8",
            "-e",
            "1M",
            "-f",
            "4",
            "-n",
            "2",
            "-w",
            "1",
            "--transport",
            "tcp",
        ]);
        assert_clean(coll, n, &o, &v);
        // 8, 32, ..., 1M: 9 sizes.
        assert_eq!(v["rows"].as_array().unwrap().len(), 9);
    }
}

/// Counter `key` summed over the ranks' `--stats` totals of a `--json` run (0 where a rank
/// has none).
fn stats_total(v: &Value, key: &str) -> u64 {
    v["stats"]
        .as_array()
        .expect("stats array")
        .iter()
        .map(|r| r["totals"][key].as_f64().unwrap_or(0.0) as u64)
        .sum()
}

#[test]
fn all_reduce_2_3_4_ranks() {
    sweep("all_reduce");
}

#[test]
fn all_gather_2_3_4_ranks() {
    sweep("all_gather");
}

#[test]
fn reduce_scatter_2_3_4_ranks() {
    sweep("reduce_scatter");
}

#[test]
fn sendrecv_2_3_4_ranks() {
    sweep("sendrecv");
}

#[test]
fn all_reduce_types_and_ops() {
    for (d, op) in [
        ("int32", "prod"),
        ("double", "max"),
        ("float", "min"),
        ("int32", "sum"),
    ] {
        let (o, v) = run_json(&[
            "all_reduce",
            "--ranks",
            "3",
            "-b",
            "1K",
            "-e",
            "256K",
            "-f",
            "16",
            "-n",
            "1",
            "-w",
            "0",
            "-c",
            "2",
            "-d",
            d,
            "-o",
            op,
            "--transport",
            "tcp",
        ]);
        assert_clean("all_reduce", 3, &o, &v);
        assert_eq!(v["datatype"], d);
        assert_eq!(v["op"], op);
    }
}

#[test]
fn small_chunks_pipeline_many_slots() {
    // 64 KiB of data through 4 KiB slots: 16 pieces per segment, all 8 slots busy.
    let (o, v) = run_json(&[
        "all_reduce",
        "--ranks",
        "2",
        "-b",
        "256K",
        "-n",
        "3",
        "--chunk",
        "4K",
        "--transport",
        "tcp",
    ]);
    assert_clean("all_reduce", 2, &o, &v);
}

/// Parses the text table and returns the #wrong columns of every row.
fn wrong_columns(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(cols.len(), 13, "row {l:?}");
            (cols[8].to_string(), cols[12].to_string())
        })
        .collect()
}

#[test]
fn table_output_has_header_rows_and_footer() {
    let _ = plugin();
    let o = perf(&[
        "sendrecv",
        "--ranks",
        "2",
        "-b",
        "8",
        "-e",
        "64K",
        "-f",
        "8",
        "-n",
        "2",
        "--transport",
        "tcp",
    ])
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("# verbsnet-perf sendrecv: nranks 2"), "{out}");
    assert!(
        // the newest table, as NCCL's loader picks (v12 first)
        out.contains("# plugin: verbsnet (ncclNetPlugin_v12) from"),
        "{out}"
    );
    assert!(
        out.contains(&canonical(&plugin()).display().to_string()),
        "{out}"
    );
    assert!(out.contains("# transport: VERBSNET_TRANSPORT=tcp"), "{out}");
    assert!(
        out.contains("out-of-place") && out.contains("in-place"),
        "{out}"
    );
    let wrong = wrong_columns(&out);
    // 8, 64, 512, 4K, 32K.
    assert_eq!(wrong.len(), 5, "{out}");
    assert!(wrong.iter().all(|(a, b)| a == "0" && b == "0"), "{out}");
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
    assert!(out.contains("# Avg bus bandwidth"), "{out}");
}

#[test]
fn stats_lists_counters_per_rank() {
    let (o, v) = run_json(&[
        "all_gather",
        "--ranks",
        "2",
        "-b",
        "64K",
        "-n",
        "2",
        "--transport",
        "tcp",
        "--stats",
    ]);
    assert_clean("all_gather", 2, &o, &v);
    let stats = v["stats"].as_array().expect("stats array");
    assert_eq!(stats.len(), 2, "{}", show(&o));
    for (r, s) in stats.iter().enumerate() {
        assert_eq!(s["rank"], r);
        // One send comm and one recv comm per rank, each closed once.
        assert_eq!(s["send_records"], 1, "{s}");
        assert_eq!(s["recv_records"], 1, "{s}");
        assert!(!s["totals"].as_object().unwrap().is_empty(), "{s}");
    }
    // The text form prints a table.
    let o = perf(&[
        "all_gather",
        "--ranks",
        "2",
        "-b",
        "64K",
        "-n",
        "1",
        "--transport",
        "tcp",
        "--stats",
    ])
    .output()
    .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("# Plugin counters"), "{}", show(&o));
    assert!(
        out.contains("rank 0") && out.contains("rank 1"),
        "{}",
        show(&o)
    );
}

#[test]
fn wrong_data_fails_the_run() {
    let (o, v) = run_json(&[
        "all_reduce",
        "--ranks",
        "2",
        "-b",
        "1K",
        "-n",
        "1",
        "--transport",
        "tcp",
        "--debug-corrupt-rank",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert_eq!(v["ok"], false);
    assert!(v["out_of_bounds"].as_u64().unwrap() > 0);
}

// The tests below need the plugin file but not a working transport.

#[test]
fn missing_plugin_is_reported_with_every_attempt() {
    let o = perf(&["all_reduce", "-b", "8"])
        .env("NCCL_NET_PLUGIN", "no-such-plugin")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("dlopen(libnccl-net-no-such-plugin.so)"),
        "{err}"
    );
}

#[test]
fn wrong_net_name_is_rejected() {
    let _ = plugin();
    let o = perf(&["all_reduce", "-b", "8"])
        .env("NCCL_NET", "IB")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("expected \"IB\""), "{err}");
}

#[test]
fn a_failing_rank_fails_the_launch_and_shows_its_stderr() {
    let _ = plugin();
    let o = perf(&[
        "sendrecv",
        "--ranks",
        "2",
        "-b",
        "8",
        "--transport",
        "tcp",
        "--debug-fail-rank",
        "1",
    ])
    .output()
    .unwrap();
    assert!(!o.status.success(), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("rank 1 failed (exit code 2)"), "{err}");
    assert!(err.contains("failing on purpose"), "{err}");
}

#[test]
fn baseline_tcp_adds_a_table_and_json_fields() {
    let args = [
        "sendrecv",
        "--ranks",
        "2",
        "-b",
        "64K",
        "-e",
        "1M",
        "-f",
        "4",
        "-n",
        "2",
        "--transport",
        "tcp",
        "--baseline",
        "tcp",
    ];
    let (o, v) = run_json(&args);
    assert_clean("sendrecv", 2, &o, &v);
    assert_eq!(v["baseline"]["kind"], "tcp", "{}", show(&o));
    let rows = v["rows"].as_array().unwrap();
    // 64K, 256K, 1M.
    assert_eq!(rows.len(), 3);
    for r in rows {
        let b = &r["baseline"];
        for key in [
            "time_us",
            "algbw",
            "busbw",
            "ratio_out_of_place",
            "ratio_in_place",
        ] {
            let x = b[key]
                .as_f64()
                .unwrap_or_else(|| panic!("baseline.{key} in {r}\n{}", show(&o)));
            assert!(x.is_finite() && x > 0.0, "baseline.{key} = {x} in {r}");
        }
        assert_eq!(b["wrong"], 0);
        // CPU figures: numbers where the kernel reports them (Linux schedstat), else null.
        for v in [
            &b["cpu_us"],
            &b["runq_us"],
            &r["out_of_place"]["cpu_us"],
            &r["in_place"]["runq_us"],
        ] {
            assert!(v.is_null() || v.as_f64().is_some_and(|x| x >= 0.0), "{r}");
        }
    }

    // The text form: the usual table (13 columns), then the baseline table (12 columns).
    let o = perf(&args).output().unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let at = out
        .find("# Baseline (tcp): plain TCP ring")
        .unwrap_or_else(|| panic!("no baseline section\n{out}"));
    let (main, base) = out.split_at(at);
    assert_eq!(wrong_columns(main).len(), 3, "{out}");
    assert!(base.contains("ratio"), "{out}");
    let base_rows: Vec<Vec<&str>> = base
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(base_rows.len(), 3, "{out}");
    for (cols, size) in base_rows.iter().zip(["65536", "262144", "1048576"]) {
        assert_eq!(cols.len(), 12, "{cols:?}\n{out}");
        assert_eq!(cols[0], size);
        for (i, c) in cols.iter().enumerate().skip(1) {
            if i >= 8 && *c == "N/A" {
                continue; // CPU figures where the kernel does not report them
            }
            let x: f64 = c.parse().unwrap_or_else(|e| panic!("{c:?}: {e}\n{out}"));
            assert!(x.is_finite() && x >= 0.0, "{c}");
        }
    }
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
}

#[test]
fn every_net_version_carries_all_reduce_and_the_default_is_the_newest() {
    for v in ["7", "8", "9", "10", "11", "12"] {
        let (o, j) = run_json(&[
            "all_reduce",
            "--ranks",
            "3",
            "-b",
            "8",
            "-e",
            "1M",
            "-f",
            "32",
            "-n",
            "2",
            "-w",
            "1",
            "--transport",
            "tcp",
            "--net-version",
            v,
        ]);
        assert_clean("all_reduce", 3, &o, &j);
        assert_eq!(j["plugin"]["symbol"], format!("ncclNetPlugin_v{v}"));
    }
    let (o, j) = run_json(&[
        "sendrecv",
        "--ranks",
        "2",
        "-b",
        "8",
        "-e",
        "8",
        "--transport",
        "tcp",
    ]);
    assert_clean("sendrecv", 2, &o, &j);
    assert_eq!(j["plugin"]["symbol"], "ncclNetPlugin_v12");
}

#[test]
fn main_collectives_through_the_v8_table() {
    for coll in ["all_reduce", "all_gather", "reduce_scatter", "sendrecv"] {
        let (o, j) = run_json(&[
            coll,
            "--ranks",
            "2",
            "-b",
            "8",
            "-e",
            "1M",
            "-f",
            "8",
            "-n",
            "2",
            "-w",
            "1",
            "--transport",
            "tcp",
            "--net-version",
            "8",
        ]);
        assert_clean(coll, 2, &o, &j);
        assert_eq!(j["plugin"]["symbol"], "ncclNetPlugin_v8");
    }
}

#[test]
fn an_unknown_net_version_is_refused_before_any_rank_starts() {
    let o = perf(&["sendrecv", "--ranks", "2", "--net-version", "13"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--net-version") && err.contains("13"), "{err}");
}

/// alltoall over a full mesh, each connection shared by K senders with their own tags whose
/// pieces become ready after seeded random delays, so one runs ahead of another: the plugin
/// must answer "retry later" for a tag that is not in the oldest posted receive, never fail,
/// and put every piece in its place (NCCL_NET_SHARED_COMMS, net_ib/p2p.cc).
#[test]
fn alltoall_with_shared_comms_and_skewed_senders_delivers_every_block() {
    for k in ["1", "2", "4", "8"] {
        let (o, v) = run_json(&[
            "alltoall",
            "--ranks",
            "4",
            "--shared-comms",
            k,
            "--skew-us",
            "300",
            "-b",
            "16K",
            "-e",
            "1M",
            "-f",
            "8",
            "--chunk",
            "4K",
            "-n",
            "2",
            "-w",
            "1",
            "--stats",
            "--transport",
            "tcp",
        ]);
        assert_clean("alltoall", 4, &o, &v);
        assert_eq!(v["shared_comms"]["senders"].as_u64(), k.parse().ok());
        // verbsnet's maxRecvs is 8: one shared connection, all K senders in one receive.
        assert_eq!(v["shared_comms"]["connections_per_peer"], 1);
        assert_eq!(v["shared_comms"]["receive_group"].as_u64(), k.parse().ok());
        let total = |key: &str| stats_total(&v, key);
        println!(
            "K={k}: tag_waits={} unexpected={} eager={} error_completions={}",
            total("tag_waits"),
            total("unexpected"),
            total("eager"),
            total("error_completions")
        );
        assert_eq!(total("error_completions"), 0);
        // 16 KiB … 1 MiB over 4 ranks in 4 KiB pieces: every size moves data.
        assert!(total("eager") > 0);
        if k == "8" {
            // Eight senders with up to 300 us between pieces never stay in step: the fast ones
            // meet receives whose buffer for their tag is taken.
            assert!(
                total("tag_waits") > 0,
                "no send was ever refused for its tag"
            );
        }
    }
}

/// The plugin logs through the logger `init` gets, as under NCCL: its WARN reaches the
/// harness (counted per rank, kept, printed in NCCL's format), and `NCCL_DEBUG` /
/// `NCCL_DEBUG_SUBSYS` decide what prints.
#[test]
fn plugin_lines_reach_the_harness_through_the_logger() {
    // A typo'd knob: verbsnet WARNs at init ("ignoring unknown variable"), and the run is fine.
    let _ = plugin();
    let o = perf(&[
        "all_reduce",
        "--ranks",
        "2",
        "-b",
        "8",
        "-e",
        "8",
        "-n",
        "1",
        "--transport",
        "tcp",
        "--json",
    ])
    .env("VERBSNET_RQDEPTH", "512")
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let v: Value = serde_json::from_str(
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .unwrap(),
    )
    .unwrap();
    for (r, log) in v["plugin_log"]
        .as_array()
        .expect("plugin_log")
        .iter()
        .enumerate()
    {
        assert!(log["warn"].as_u64().unwrap() >= 1, "rank {r}: {log}");
        let w = log["warnings"][0].as_str().unwrap();
        assert!(
            w.contains("NET/verbsnet : ignoring unknown variable VERBSNET_RQDEPTH"),
            "{w}"
        );
    }
    // NCCL's WARN format on stderr: `host:pid:tid [0] file:line NCCL WARN NET/verbsnet : ...`.
    let err = String::from_utf8_lossy(&o.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("NCCL WARN"))
        .unwrap_or_else(|| panic!("no NCCL WARN line\n{}", show(&o)));
    let (who, rest) = line.split_once(" [0] ").expect("host:pid:tid [0]");
    assert_eq!(
        who.rsplit(' ').next().unwrap().split(':').count(),
        3,
        "{line}"
    );
    assert!(
        rest.contains(".rs:") && rest.contains(" NCCL WARN NET/verbsnet : "),
        "{line}"
    );
    // The text table says so too.
    let o = perf(&[
        "sendrecv",
        "--ranks",
        "2",
        "-b",
        "8",
        "-e",
        "8",
        "-n",
        "1",
        "--transport",
        "tcp",
    ])
    .env("VERBSNET_RQDEPTH", "512")
    .output()
    .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("# Plugin WARN lines (through NCCL's logger): rank 0: 1, rank 1: 1"),
        "{}",
        show(&o)
    );

    // NCCL_DEBUG=INFO with NET in NCCL_DEBUG_SUBSYS: the plugin's INFO lines print as NCCL's.
    let args = [
        "sendrecv",
        "--ranks",
        "2",
        "-b",
        "8",
        "-e",
        "8",
        "-n",
        "1",
        "--transport",
        "tcp",
    ];
    let o = perf(&args)
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "INIT,NET")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(" [0] NCCL INFO NET/verbsnet : using transport tcp"),
        "{err}"
    );
    // NCCL_DEBUG=WARN: no INFO line; NCCL_DEBUG=NONE: nothing, even with the typo's WARN.
    let o = perf(&args).env("NCCL_DEBUG", "WARN").output().unwrap();
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("NCCL INFO"),
        "{}",
        show(&o)
    );
    let o = perf(&args)
        .env("NCCL_DEBUG", "NONE")
        .env("VERBSNET_RQDEPTH", "512")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("NCCL WARN"),
        "{}",
        show(&o)
    );
}

/// A failing init: the harness's error carries the plugin's WARN when NCCL_DEBUG hides it.
#[test]
fn a_failed_init_reports_the_plugins_warning() {
    let _ = plugin();
    let o = perf(&["sendrecv", "-b", "8"])
        .env("VERBSNET_TRANSPORT", "carrier-pigeon")
        .env("NCCL_DEBUG", "NONE")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("init returned"), "{err}");
    assert!(
        err.contains("the plugin's last WARN: NET/verbsnet : ") && err.contains("carrier-pigeon"),
        "{err}"
    );
}

/// `--proxy lazy` through verbsnet: every receive posted ahead, sends spun on, completions
/// consumed late. The ring collectives whose sends wait for their receives run.
#[test]
fn lazy_proxy_runs_the_ring_collectives() {
    for coll in ["all_reduce", "all_gather", "reduce_scatter"] {
        for n in ["2", "4"] {
            let (o, v) = run_json(&[
                coll,
                "--ranks",
                n,
                "-b",
                "8",
                "-e",
                "1M",
                "-f",
                "4",
                "-n",
                "2",
                "--transport",
                "tcp",
                "--proxy",
                "lazy",
            ]);
            assert_clean(coll, n.parse().unwrap(), &o, &v);
            assert_eq!(v["proxy"], "lazy");
        }
    }
}

/// sendrecv under `--proxy lazy`: each rank spins on sends far ahead of its receives, which
/// hung while verbsnet returned credits only when the receiving comm was called again (issue
/// 19): a send matching a posted receive must need nothing more from the receiver.
#[test]
fn lazy_proxy_runs_sendrecv() {
    for n in ["2", "4"] {
        let (o, v) = run_json(&[
            "sendrecv",
            "--ranks",
            n,
            "-b",
            "8",
            "-e",
            "1M",
            "-f",
            "4",
            "-n",
            "2",
            "--transport",
            "tcp",
            "--proxy",
            "lazy",
        ]);
        assert_clean("sendrecv", n.parse().unwrap(), &o, &v);
    }
}

/// alltoall with shared comms under `--proxy lazy` (the vm-suite runs it on ib too).
#[test]
fn lazy_proxy_runs_alltoall_with_shared_comms() {
    for k in ["1", "4"] {
        let (o, v) = run_json(&[
            "alltoall",
            "--ranks",
            "4",
            "--shared-comms",
            k,
            "-b",
            "16K",
            "-e",
            "1M",
            "-f",
            "8",
            "--chunk",
            "4K",
            "-n",
            "2",
            "--transport",
            "tcp",
            "--proxy",
            "lazy",
        ]);
        assert_clean("alltoall", 4, &o, &v);
    }
}

/// Several QPs per connection (`VERBSNET_IB_QPS_PER_CONNECTION=4`, issue 23), split on and
/// off, in an all_reduce ring and a shared-comms alltoall over tcp (each QP its own TCP
/// stream): every byte lands (#wrong 0), no error completion, and every comm of every rank
/// has the 4 QPs the sender asked for (the receivers adopt it).
#[test]
fn four_qps_per_connection_split_on_and_off_carry_all_reduce_and_alltoall() {
    for split in ["0", "1"] {
        for (coll, extra) in [
            ("all_reduce", &[][..]),
            ("alltoall", &["--shared-comms", "4", "--chunk", "4K"][..]),
        ] {
            let _ = plugin();
            let mut args = vec![
                coll,
                "--ranks",
                "4",
                "-b",
                "8",
                "-e",
                "4M",
                "-f",
                "8",
                "-n",
                "2",
                "-w",
                "1",
                "--stats",
                "--transport",
                "tcp",
            ];
            args.extend_from_slice(extra);
            let mut c = perf(&args);
            c.env("VERBSNET_IB_QPS_PER_CONNECTION", "4")
                .env("VERBSNET_IB_SPLIT_DATA_ON_QPS", split);
            let (o, v) = common::run_json(&mut c);
            assert_clean(coll, 4, &o, &v);
            let total = |key: &str| stats_total(&v, key);
            assert_eq!(total("error_completions"), 0, "{coll} split {split}");
            let qps = total("qps");
            let ops = total("ops");
            assert!(
                qps > 0 && qps % 4 == 0 && ops > 0,
                "{coll} split {split}: qps total {qps}, ops {ops}\n{}",
                show(&o)
            );
            // The data QPs carried pieces of the messages that went directly.
            let pieces = total("data_qp_writes");
            assert!(
                pieces > 0,
                "{coll} split {split}: no RDMA WRITE on a data QP\n{}",
                show(&o)
            );
        }
    }
}

/// NIC fusion (`makeVDevice`, issue 23) on verbsnet: with `VERBSNET_TCP_DEVICES=2` (two tcp
/// devices, each with its own memory keys) `--vdevice 0,1` makes device 2, `tcp0+tcp1`, as
/// NCCL's topology code does, through the v12 table and the v9 one (NCCL 2.24's). An
/// all_reduce ring and a shared-comms alltoall on it, 2 QPs per device split on and off: every
/// byte lands (#wrong 0) although each QP's WRs must carry its own device's keys, no error
/// completion, every comm has 2 QPs × 2 devices, and the data QPs carried pieces.
#[test]
fn a_virtual_device_over_two_tcp_devices_carries_all_reduce_and_alltoall() {
    for (version, split) in [("12", "0"), ("12", "1"), ("9", "1")] {
        for (coll, extra) in [
            ("all_reduce", &[][..]),
            ("alltoall", &["--shared-comms", "2", "--chunk", "4K"][..]),
        ] {
            let _ = plugin();
            let what = format!("{coll} v{version} split {split}");
            let mut args = vec![
                coll,
                "--ranks",
                "3",
                "-b",
                "8",
                "-e",
                "2M",
                "-f",
                "16",
                "-n",
                "2",
                "-w",
                "1",
                "--stats",
                "--transport",
                "tcp",
                "--vdevice",
                "0,1",
                "--net-version",
                version,
            ];
            args.extend_from_slice(extra);
            let mut c = perf(&args);
            c.env("VERBSNET_TCP_DEVICES", "2")
                .env("VERBSNET_IB_QPS_PER_CONNECTION", "2")
                .env("VERBSNET_IB_SPLIT_DATA_ON_QPS", split);
            let (o, v) = common::run_json(&mut c);
            assert_clean(coll, 3, &o, &v);
            let d = &v["device"];
            assert_eq!(d["name"], "tcp0+tcp1", "{what}: {d}");
            assert_eq!(d["vdevice"]["vprops"], serde_json::json!([0, 1]), "{what}");
            let total = |key: &str| stats_total(&v, key);
            assert_eq!(total("error_completions"), 0, "{what}");
            assert!(total("ops") > 0, "{what}");
            // Every comm of every rank: 2 QPs per device × 2 devices.
            for r in v["stats"].as_array().expect("stats") {
                let comms = r["records"].as_u64().unwrap_or(0);
                let qps = r["totals"]["qps"].as_f64().unwrap_or(0.0) as u64;
                assert!(
                    comms > 0 && qps == 4 * comms,
                    "{what}: {comms} comms, {qps} QPs"
                );
            }
            assert!(total("data_qp_writes") > 0, "{what}\n{}", show(&o));
        }
    }
    // NCCL_IB_MERGE_NICS=0 (VERBSNET_IB_MERGE_NICS's fallback): makeVDevice refuses to merge
    // (ncclInvalidUsage, as NCCL IB), and the run stops before any connection.
    let mut c = perf(&[
        "all_reduce",
        "--ranks",
        "2",
        "--transport",
        "tcp",
        "--vdevice",
        "0,1",
    ]);
    c.env("VERBSNET_TCP_DEVICES", "2")
        .env("NCCL_IB_MERGE_NICS", "0");
    let o = c.output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("makeVDevice returned ncclInvalidUsage (5)")
            && err.contains("VERBSNET_IB_MERGE_NICS=0"),
        "{}",
        show(&o)
    );
}
