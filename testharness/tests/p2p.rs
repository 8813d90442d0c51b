//! End-to-end: `verbsnet-perf stream` and `verbsnet-perf latency` (the point-to-point modes,
//! shaped like perftest's `ib_send_bw` and `ib_send_lat`) between two rank processes, through
//! the real plugin over its tcp transport and through the fixture plugin (a plugin that is not
//! verbsnet, answering "retry later" often). Checks the output's shape, the message counts and
//! the data checks; no timing is asserted (a shared machine), only that times are consistent
//! with each other.
//!
//! The plugin must be built in the same profile first:
//! `cargo build --release -p verbsnet && cargo test --release -p testharness`.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

mod common;
use common::{run_json, show};

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_verbsnet-perf"))
}

/// A `verbsnet-perf` command with no `NCCL_*`, `VERBSNET_*` or `FIXTURE_NET_*` variable of
/// the caller, on the tcp transport, with the verbsnet plugin from next to the binary.
fn perf(args: &[&str]) -> Command {
    let so = exe().with_file_name("libnccl-net-verbsnet.so");
    assert!(
        so.exists(),
        "{} is missing: build the plugin first (cargo build --release -p verbsnet)",
        so.display()
    );
    let mut c = common::perf(args);
    c.args(["--ranks", "2", "--transport", "tcp"]);
    c
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("{k} is not a number in {v}"))
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} is not a count in {v}"))
}

/// Exit 0, no wrong message, one row per size (`sizes`) with `iters` timed messages.
fn assert_clean(o: &Output, v: &Value, mode: &str, sizes: &[u64], iters: u64) {
    assert!(o.status.success(), "{}", show(o));
    assert_eq!(v["mode"], mode, "{}", show(o));
    assert_eq!(v["ok"], true, "{}", show(o));
    assert_eq!(v["out_of_bounds"], 0, "{}", show(o));
    assert_eq!(v["deviations"], serde_json::json!([]), "{}", show(o));
    let rows = v["rows"].as_array().expect("rows");
    let got: Vec<u64> = rows.iter().map(|r| u(r, "size")).collect();
    assert_eq!(got, sizes, "{}", show(o));
    for r in rows {
        assert_eq!(u(r, "iters"), iters, "{r}");
        assert_eq!(u(r, "wrong"), 0, "{r}");
    }
}

/// What the two ranks did (`ends`): messages sent and received per rank.
fn ends(v: &Value) -> Vec<(u64, u64)> {
    v["ends"]
        .as_array()
        .expect("ends")
        .iter()
        .map(|e| (u(e, "sent"), u(e, "received")))
        .collect()
}

#[test]
fn one_way_stream_moves_every_message_and_reports_perftest_columns() {
    let (warm, iters, check) = (20u64, 300u64, 3u64);
    let sizes = [8u64, 64, 512, 4096, 32768];
    let (o, v) = run_json(&mut perf(&[
        "stream", "-b", "8", "-e", "32K", "-f", "8", "-n", "300", "-w", "20", "-c", "3", "-W",
        "16", "--stats",
    ]));
    assert_clean(&o, &v, "stream", &sizes, iters);
    assert_eq!(v["bidir"], false);
    assert_eq!(v["window"], 16);
    let per_size = warm + iters + check;
    let n = per_size * sizes.len() as u64;
    // One way: rank 0 only sends, rank 1 only receives, every message once.
    assert_eq!(ends(&v), [(n, 0), (0, n)], "{}", show(&o));
    assert_eq!(u(&v, "messages"), n);
    for r in v["rows"].as_array().expect("rows") {
        let (size, secs) = (u(r, "size") as f64, f(r, "time_us") / 1e6);
        assert!(secs > 0.0 && secs.is_finite(), "{r}");
        // The three rates are one measurement in three units.
        let mib_per_s = iters as f64 * size / 1048576.0 / secs;
        assert!((f(r, "bw_MBps") / mib_per_s - 1.0).abs() < 1e-9, "{r}");
        assert!((f(r, "bw_Gbps") / (f(r, "bw_MBps") * 1048576.0 * 8.0 / 1e9) - 1.0).abs() < 1e-9);
        assert!(
            (f(r, "msg_rate_Mpps") * 1e6 * secs / iters as f64 - 1.0).abs() < 1e-9,
            "{r}"
        );
    }
    // Work per message: the sender has only a send comm, whose data WR per message is one
    // eager SEND or one rendezvous WRITE_WITH_IMM; the receiver posts receive WRs.
    let work = &v["work_per_message"];
    assert_eq!(u(work, "messages"), n);
    let ranks = work["ranks"].as_array().expect("work ranks");
    assert_eq!(ranks.len(), 2, "{work}");
    // One data WR per message, plus the READs of the receiver's CTS mirror and the wake word
    // writes of the pulled clear-to-send (docs/protocol.md, "The pulled clear-to-send"), plus
    // at most one zero-length flush write at the close when the last inline send went
    // unsignaled ("Inline sends").
    let sent = &v["stats"][0]["send_totals"];
    let pull_wrs = f(sent, "cts_reads") + f(sent, "wake_writes");
    assert!(
        pull_wrs > 0.0,
        "a stream with 16 receives posted ahead pulls: {sent}"
    );
    let extra = f(&ranks[0], "send_wrs") * n as f64 - n as f64 - pull_wrs;
    assert!(
        extra.abs() < 1e-6 || (extra - 1.0).abs() < 1e-6,
        "{work} {sent}"
    );
    assert_eq!(f(&ranks[0], "recv_wrs"), 0.0, "{work}");
    assert!(f(&ranks[1], "recv_wrs") > 0.0, "{work}");
    let both = &work["both"];
    let sum = f(&ranks[0], "wrs_posted") + f(&ranks[1], "wrs_posted");
    assert!((f(both, "wrs_posted") - sum).abs() < 1e-9, "{work}");
    // Every receive but a small send's (8 and 64 bytes: at most 112, wire version 8)
    // completes only after its receive WR was posted; a small send consumes none.
    let not_small = (n - 2 * per_size) as f64 / n as f64;
    assert!(f(both, "recv_wrs") >= not_small, "{work}");
}

#[test]
fn bidirectional_stream_sends_both_ways_and_sums_the_directions() {
    let (warm, iters, check) = (10u64, 200u64, 2u64);
    let (o, v) = run_json(&mut perf(&[
        "stream", "--bidir", "-b", "64", "-e", "64K", "-f", "32", "-n", "200", "-w", "10", "-c",
        "2",
    ]));
    let sizes = [64u64, 2048, 65536];
    assert_clean(&o, &v, "stream", &sizes, iters);
    assert_eq!(v["bidir"], true);
    let per_rank = (warm + iters + check) * sizes.len() as u64;
    assert_eq!(
        ends(&v),
        [(per_rank, per_rank), (per_rank, per_rank)],
        "{}",
        show(&o)
    );
    assert_eq!(u(&v, "messages"), 2 * per_rank);
    for r in v["rows"].as_array().expect("rows") {
        assert_eq!(u(r, "directions"), 2, "{r}");
        let secs = f(r, "time_us") / 1e6;
        assert!(
            (f(r, "msg_rate_Mpps") * 1e6 * secs / (2 * iters) as f64 - 1.0).abs() < 1e-9,
            "{r}"
        );
    }
}

#[test]
fn latency_ping_pong_reports_consistent_statistics() {
    let (warm, iters, check) = (10u64, 150u64, 2u64);
    let sizes = [8u64, 256, 8192];
    let (o, v) = run_json(&mut perf(&[
        "latency", "-b", "8", "-e", "8K", "-f", "32", "-n", "150", "-w", "10", "-c", "2",
    ]));
    assert_clean(&o, &v, "latency", &sizes, iters);
    let per_rank = (warm + iters + check) * sizes.len() as u64;
    // Rank 1 answers every message of rank 0, one for one.
    assert_eq!(
        ends(&v),
        [(per_rank, per_rank), (per_rank, per_rank)],
        "{}",
        show(&o)
    );
    for r in v["rows"].as_array().expect("rows") {
        let (min, max) = (f(r, "t_min_us"), f(r, "t_max_us"));
        assert!(min > 0.0 && min <= max, "{r}");
        for k in ["t_typical_us", "t_avg_us", "t_99_us", "t_999_us"] {
            let t = f(r, k);
            assert!(min <= t && t <= max, "{k} outside [min, max]: {r}");
        }
        assert!(f(r, "t_99_us") <= f(r, "t_999_us"), "{r}");
        assert!(f(r, "t_stdev_us") <= max - min, "{r}");
    }
}

#[test]
fn table_output_has_perftest_columns_and_a_footer() {
    let o = perf(&["stream", "-b", "4K", "-e", "4K", "-n", "50", "-w", "5"])
        .output()
        .expect("run");
    assert!(o.status.success(), "{}", show(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let header = text
        .lines()
        .find(|l| l.contains("BW average[MB/sec]"))
        .unwrap_or_else(|| panic!("no column header\n{}", show(&o)));
    assert!(
        header.starts_with('#') && header.contains("MsgRate[Mpps]") && header.contains("#wrong")
    );
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 1, "{}", show(&o));
    let row = &rows[0];
    assert_eq!(row.len(), 6, "{row:?}");
    assert_eq!((row[0], row[1], row[5]), ("4096", "50", "0"));
    assert!(row[2].parse::<f64>().is_ok_and(|x| x > 0.0), "{row:?}");
    assert!(
        text.contains("one way: rank 0 sends, rank 1 receives"),
        "{text}"
    );
    assert!(text.contains("# Out of bounds values : 0 OK"), "{text}");
    assert!(
        text.contains("Point-to-point test concluded: stream"),
        "{text}"
    );

    let o = perf(&[
        "latency", "-b", "8", "-e", "8", "-n", "50", "-w", "5", "--stats",
    ])
    .output()
    .expect("run");
    assert!(o.status.success(), "{}", show(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("t_typical[usec]") && text.contains("99% percentile[usec]"));
    let row: Vec<&str> = text
        .lines()
        .find(|l| !l.starts_with('#') && !l.trim().is_empty())
        .expect("a row")
        .split_whitespace()
        .collect();
    assert_eq!(row.len(), 10, "{row:?}");
    assert_eq!((row[0], row[1], row[9]), ("8", "50", "0"));
    // --stats: the plugin's counters, then the work per message with both ranks.
    let work = text
        .lines()
        .skip_while(|l| !l.starts_with("# Work per message"))
        .collect::<Vec<_>>();
    assert!(work.len() >= 6, "{text}");
    assert!(work[0].contains("messages moved in the run"), "{text}");
    for name in ["WRs posted", "post calls", "completions polled"] {
        let line = work
            .iter()
            .find(|l| l.starts_with(&format!("# {name}")))
            .unwrap_or_else(|| panic!("no {name} line\n{text}"));
        let nums: Vec<f64> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        assert!(nums.len() >= 3, "{line}");
        // rank 0 + rank 1 = both
        assert!((nums[0] + nums[1] - nums[2]).abs() < 2e-3, "{line}");
    }
}

#[test]
fn damaged_messages_are_counted_and_fail_the_run() {
    for mode in ["stream", "latency"] {
        let (o, v) = run_json(&mut perf(&[
            mode,
            "-b",
            "64",
            "-e",
            "64",
            "-n",
            "40",
            "-w",
            "4",
            "-c",
            "2",
            "--debug-corrupt-rank",
            "1",
        ]));
        assert_eq!(o.status.code(), Some(1), "{mode}: {}", show(&o));
        assert_eq!(v["ok"], false);
        // Every message rank 1 receives is damaged, and the row counts all of its size:
        // warm-up, timed and checked.
        assert_eq!(
            u(&v["rows"][0], "wrong"),
            40 + 4 + 2,
            "{mode}: {}",
            show(&o)
        );
    }
}

#[test]
fn point_to_point_settings_are_checked_before_any_rank_starts() {
    for (args, says) in [
        (&["stream", "--ranks", "3"][..], "exactly 2 ranks"),
        (
            &["stream", "--ranks", "2", "-W", "33"],
            "--window must be 1..=32",
        ),
        (
            &["latency", "--ranks", "2", "--bidir"],
            "--bidir applies to stream only",
        ),
        (
            &["sendrecv", "--ranks", "2", "-W", "4"],
            "apply to stream and latency only",
        ),
        (
            &["stream", "--ranks", "2", "--proxy", "lazy"],
            "--proxy applies to the collectives",
        ),
        (
            &["stream", "--ranks", "2", "--baseline", "tcp"],
            "has no ring",
        ),
    ] {
        let o = Command::new(exe()).args(args).output().expect("run");
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", show(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(says),
            "{args:?} should say {says:?}: {}",
            show(&o)
        );
    }
}

#[test]
fn another_plugin_that_answers_retry_later_carries_both_modes() {
    // The fixture plugin refuses 40% of isend/irecv calls (a NULL request) and reports 25% of
    // finished requests late: the proxy must retry, and the v8 table's int sizes apply.
    for args in [
        &[
            "stream", "-b", "8", "-e", "64K", "-f", "64", "-n", "100", "-w", "10", "-c", "2",
        ][..],
        &[
            "stream", "--bidir", "-b", "1K", "-e", "1K", "-n", "100", "-w", "10",
        ],
        &[
            "latency", "-b", "8", "-e", "4K", "-f", "512", "-n", "60", "-w", "5", "-c", "2",
        ],
    ] {
        let mut c = perf(args);
        c.env("NCCL_NET_PLUGIN", env!("FIXTURE_NET_SO"));
        let (o, v) = run_json(&mut c);
        assert!(o.status.success(), "{args:?}: {}", show(&o));
        assert_eq!(v["ok"], true, "{args:?}: {}", show(&o));
        assert_eq!(v["plugin"]["name"], "fixture", "{args:?}");
        let retries: u64 = v["ends"]
            .as_array()
            .expect("ends")
            .iter()
            .map(|e| u(e, "isend_retries"))
            .sum();
        assert!(
            retries > 0,
            "{args:?}: the fixture refused no isend?\n{}",
            show(&o)
        );
    }
}

/// `call_times` of one row: per rank, `kind` → (calls per iteration, mean µs), kinds with calls.
fn call_times(row: &Value) -> Vec<Value> {
    row["call_times"]
        .as_array()
        .unwrap_or_else(|| panic!("no call_times in {row}"))
        .clone()
}

#[test]
fn call_times_count_every_plugin_call_by_what_it_did() {
    // verbsnet: in a ping-pong each rank starts one send per round trip and tests exactly one
    // send and one receive to completion (the sends are drained inside the timed part).
    let mut c = perf(&[
        "latency",
        "-b",
        "8",
        "-e",
        "8",
        "-n",
        "200",
        "-w",
        "20",
        "--call-times",
    ]);
    let (o, v) = run_json(&mut c);
    assert_clean(&o, &v, "latency", &[8], 200);
    let ranks = call_times(&v["rows"][0]);
    assert_eq!(ranks.len(), 2, "{}", show(&o));
    for t in &ranks {
        assert_eq!(u(t, "iterations"), 200, "{t}");
        assert_eq!(f(&t["isend"], "per_iter"), 1.0, "{t}");
        assert_eq!(f(&t["test_done"], "per_iter"), 2.0, "{t}");
        for k in ["isend", "irecv", "test_done"] {
            assert!(f(&t[k], "us") > 0.0, "{k} took no time? {t}");
        }
        let parts: f64 = [
            "isend",
            "isend_retry",
            "irecv",
            "irecv_retry",
            "test_done",
            "test_pending",
        ]
        .iter()
        .filter(|k| !t[**k].is_null())
        .map(|k| f(&t[*k], "per_iter") * f(&t[*k], "us"))
        .sum();
        let total = f(t, "plugin_us_per_iter");
        assert!(
            (parts - total).abs() <= 1e-6 * total.max(1.0),
            "{parts} vs {total}: {t}"
        );
    }
    // Without the flag the rows carry none.
    let (o, v) = run_json(&mut perf(&[
        "latency", "-b", "8", "-e", "8", "-n", "20", "-w", "2",
    ]));
    assert!(v["rows"][0]["call_times"].is_null(), "{}", show(&o));

    // The fixture plugin answers 40% of isend/irecv calls "retry later": those are counted
    // apart. One way, the sender only sends and the receiver only receives.
    let mut c = perf(&[
        "stream",
        "-b",
        "64",
        "-e",
        "64",
        "-n",
        "300",
        "-w",
        "10",
        "--call-times",
    ]);
    c.env("NCCL_NET_PLUGIN", env!("FIXTURE_NET_SO"));
    let (o, v) = run_json(&mut c);
    assert_clean(&o, &v, "stream", &[64], 300);
    let ranks = call_times(&v["rows"][0]);
    let (tx, rx) = (&ranks[0], &ranks[1]);
    assert_eq!(f(&tx["isend"], "per_iter"), 1.0, "{tx}");
    assert!(
        f(&tx["isend_retry"], "per_iter") > 0.0,
        "no refused isend? {tx}"
    );
    assert!(tx["irecv"].is_null() && rx["isend"].is_null(), "{tx} {rx}");
    assert!(
        f(&rx["irecv_retry"], "per_iter") > 0.0,
        "no refused irecv? {rx}"
    );
    assert_eq!(f(&rx["test_done"], "per_iter"), 1.0, "{rx}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        !stdout.contains("#  plugin calls"),
        "--json prints no text lines: {stdout}"
    );
}

/// The order of one rank's calls as the fixture plugin saw them (`FIXTURE_NET_TRACE`: a letter
/// per call), cut into the steps of the proxy's ops: an `isend` or `irecv` that started (`S`,
/// `R`), one answered "retry later" with the test that follows it in the same step (`s`/`r`,
/// then `T`/`t` or `U`/`u`), or a test alone. Returns, per step, whether it was the sending
/// direction's.
fn steps_by_direction(trace: &str) -> Vec<bool> {
    let mut out = Vec::new();
    let mut it = trace.chars().peekable();
    while let Some(c) = it.next() {
        match c {
            's' if matches!(it.peek(), Some('T' | 't')) => {
                it.next();
            }
            'r' if matches!(it.peek(), Some('U' | 'u')) => {
                it.next();
            }
            'S' | 's' | 'T' | 't' | 'R' | 'r' | 'U' | 'u' => {}
            _ => panic!("unknown letter {c:?} in the trace {trace}"),
        }
        out.push(matches!(c, 'S' | 's' | 'T' | 't'));
    }
    out
}

#[test]
fn a_pass_makes_one_step_per_direction_as_nccls_proxy_does() {
    // NCCL's proxy thread calls every op's progress once per loop, and each makes one step of
    // its connection (src/proxy.cc: progressOps; src/transport/net.cc: recvProxyProgress posts
    // one receive or tests one, sendProxyProgress isends one step or tests one). So while both
    // directions of a --bidir stream have work, the plugin sees their steps alternate: a rank
    // that keeps starting sends still tests its receives every other pass. (A greedy pass that
    // posted every free receive, isent until refused and tested as far as done, had 440-480
    // runs of same-direction steps per rank in this run; one step per op leaves one run at the
    // end of each phase, where one direction finished first.)
    let dir = std::env::temp_dir().join(format!("verbsnet-p2p-trace-{}", std::process::id()));
    // A directory left by an earlier run with the same pid would add its traces.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let prefix = dir.join("calls");
    let mut c = perf(&[
        "stream", "--bidir", "-b", "64", "-e", "64", "-n", "300", "-w", "10", "-c", "1",
    ]);
    c.env("NCCL_NET_PLUGIN", env!("FIXTURE_NET_SO"))
        .env("FIXTURE_NET_TRACE", &prefix);
    let (o, v) = run_json(&mut c);
    assert_clean(&o, &v, "stream", &[64], 300);
    let traces: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(traces.len(), 2, "one trace per rank process");
    for t in traces {
        let steps = steps_by_direction(&t);
        let sends = steps.iter().filter(|&&s| s).count();
        // 311 messages each way: at least one step per isend that started and per receive.
        assert!(sends >= 311 && steps.len() - sends >= 311, "{t}");
        let neighbours = steps.windows(2).filter(|w| w[0] == w[1]).count();
        let run_starts = steps
            .windows(3)
            .filter(|w| w[0] != w[1] && w[1] == w[2])
            .count()
            + usize::from(steps.len() >= 2 && steps[0] == steps[1]);
        // Three phases (warm-up, timed, checked), each may end with a run of one direction.
        assert!(
            run_starts <= 6,
            "{run_starts} runs of steps of one direction ({neighbours} pairs of same-direction \
             neighbours): {t}"
        );
    }
}
