//! RNR ("receiver not ready") at plugin level, on a real verbs device: a connected comm pair
//! (testkit) whose receiver has a tiny receive queue (depth 2, batch 1, low-water 1) and a burst
//! of eager messages the receiver is slow to pick up.
//!
//! - credits off: the sender posts the whole burst at once; the SENDs beyond the two posted
//!   receive WRs are answered with RNR NAKs and retried by the QP (`rnr_retry` 7 = forever)
//!   until the receiver catches up. Everything arrives, and the device's RNR counters
//!   (rxe: sysfs `hw_counters/rcvd_rnr_err`, `send_rnr_err`) move.
//! - credits on: the sender stalls on credits instead; the device's RNR counters stay exactly
//!   where they were.
//! - a receive comm that closes while the sender has a send pending (waiting for its
//!   clear-to-send, or stuck in RNR retry) makes the sender's `test` fail with a remote error
//!   within a bounded number of polls instead of hanging.
//!
//! Transport ib only. Run in the soft-RoCE VM (`testharness/softroce/vm-suite.sh`); on a host
//! without a verbs device every test prints `SKIP` and passes. The device counters are
//! device-wide, so the tests here serialize on one lock, and nothing else may use the device
//! while they run (the VM suite runs one test binary at a time).
//! `VERBSNET_TEST_IB_HCA` picks the device (default: the first usable verbs port).

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nccl_net_verbsnet::comm::{Class, SendComm};
use nccl_net_verbsnet::config::{Config, TransportChoice};
use nccl_net_verbsnet::engine::sim::pattern;
use nccl_net_verbsnet::engine::ReqId;
use nccl_net_verbsnet::testkit::{connect, open_device, Buf, Link};
use nccl_net_verbsnet::transport::DeviceRnrCounters;

/// Messages in a burst: far more than the receiver's 2 receive WRs.
const BURST: usize = 16;
/// Bytes between two messages in the send and receive buffers.
const STRIDE: usize = 4096;
/// Hang guard: a test that has not finished by then fails instead of hanging CI. (Not a
/// performance assertion: the exchange takes milliseconds even under TCG.)
const DEADLINE: Duration = Duration::from_secs(120);

static DEVICE: Mutex<()> = Mutex::new(());

fn serialize() -> MutexGuard<'static, ()> {
    DEVICE.lock().unwrap_or_else(|p| p.into_inner())
}

fn base_cfg() -> Config {
    Config {
        transport: TransportChoice::Ib,
        ib_hca: std::env::var("VERBSNET_TEST_IB_HCA")
            .ok()
            .map(|h| format!("={h}")),
        ..Config::default()
    }
}

/// The receiver: a receive queue of 2, refilled one WR at a time when it runs empty.
fn recv_cfg() -> Config {
    Config {
        rq_depth: 2,
        rq_min_depth: 2,
        rq_batch: 1,
        rq_low_water: 1,
        ..base_cfg()
    }
}

fn send_cfg(credits: bool) -> Config {
    Config {
        credits,
        ..base_cfg()
    }
}

/// A connected pair, or `None` after a SKIP line on hosts without a verbs device.
fn link(test: &str, send: &Config, recv: &Config) -> Option<Link> {
    let (dev, kind) = match open_device(send) {
        Ok(d) => d,
        Err(e) => {
            println!("SKIP {test}: {e}");
            return None;
        }
    };
    Some(connect(&dev, kind, send, recv, 1_000_000).expect("connect"))
}

fn counters(l: &Link) -> DeviceRnrCounters {
    l.dev.rnr_counters()
}

/// Both RNR counters, or a SKIP when the device exposes none (not rxe).
fn rnr_pair(c: DeviceRnrCounters) -> Option<(u64, u64)> {
    Some((c.rcvd_rnr_err?, c.send_rnr_err?))
}

fn size_of(i: usize) -> usize {
    // eager sizes, all different, 1..=~4 KiB
    1 + (i * 257) % (STRIDE - 1)
}

struct Guard(Instant, &'static str);

impl Guard {
    fn check(&self, what: &str) {
        assert!(
            self.0.elapsed() < DEADLINE,
            "{}: {what} still not done after {DEADLINE:?} (hang)",
            self.1
        );
    }
}

/// Polls `test` on every unfinished send once; records completions.
fn pump_sends(send: &SendComm, ids: &[ReqId], done: &mut [bool], sizes: &[usize]) {
    for (k, id) in ids.iter().enumerate() {
        if done[k] {
            continue;
        }
        match send.test(*id) {
            Ok(Some(s)) => {
                assert_eq!(s, vec![sizes[k] as u64], "send {k}");
                done[k] = true;
            }
            Ok(None) => {}
            Err(e) => panic!("send {k} failed: {e}"),
        }
    }
}

/// Reads one numeric field of the JSON line of `side` in a stats file.
fn stat(file: &str, side: &str, key: &str) -> u64 {
    let text = std::fs::read_to_string(file).expect("stats file");
    let line = text
        .lines()
        .find(|l| l.contains(&format!("\"side\":\"{side}\"")))
        .unwrap_or_else(|| panic!("no {side} line in {text}"));
    let pat = format!("\"{key}\":");
    let at = line
        .find(&pat)
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        + pat.len();
    line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap()
}

struct Outcome {
    before: (u64, u64),
    after: (u64, u64),
    stats_file: String,
}

/// The burst: the sender posts what it can while the receiver does nothing (long enough for
/// SENDs beyond the receive queue to be NAKed when nothing holds them back), then the receiver
/// posts one irecv at a time and waits for it while the sender keeps posting and testing.
fn burst(test: &'static str, credits: bool) -> Option<Outcome> {
    let _lock = serialize();
    let stats_file = format!("/tmp/verbsnet-rnr-{}-{test}.jsonl", std::process::id());
    let _ = std::fs::remove_file(&stats_file);
    let mut s_cfg = send_cfg(credits);
    let mut r_cfg = recv_cfg();
    s_cfg.stats_file = Some(stats_file.clone());
    r_cfg.stats_file = Some(stats_file.clone());
    let l = link(test, &s_cfg, &r_cfg)?;
    let Some(before) = rnr_pair(counters(&l)) else {
        println!("SKIP {test}: the device has no RNR counters");
        return None;
    };
    let g = Guard(Instant::now(), test);
    let sb = Buf::new(&l.dev, BURST * STRIDE).unwrap();
    let rb = Buf::new(&l.dev, BURST * STRIDE).unwrap();
    let sizes: Vec<usize> = (0..BURST).map(size_of).collect();
    for (i, &n) in sizes.iter().enumerate() {
        sb.fill(i * STRIDE, &pattern(i as u64, n));
    }
    let mut ids: Vec<ReqId> = Vec::new();
    let mut done = vec![false; BURST];
    let post = |ids: &mut Vec<ReqId>| {
        while ids.len() < BURST {
            let i = ids.len();
            match l
                .send
                .isend(sb.addr(i * STRIDE), sizes[i] as u64, 7, &sb.mr)
            {
                Ok(Some(h)) => ids.push(h),
                Ok(None) => break,
                Err(e) => panic!("isend {i}: {e}"),
            }
        }
    };

    // Phase 1: the receiver is busy elsewhere.
    post(&mut ids);
    if credits {
        assert!(
            ids.len() < BURST,
            "credit gating let all {BURST} sends out to a receive queue of 2"
        );
        // Give RNR every chance to happen if gating were broken.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(300) {
            pump_sends(&l.send, &ids, &mut done, &sizes);
            post(&mut ids);
        }
    } else {
        assert_eq!(
            ids.len(),
            BURST,
            "without credits every isend starts at once"
        );
        // Until the device has NAKed at least one SEND (the receive queue holds 2 of 16).
        while rnr_pair(counters(&l)).unwrap().0 == before.0 {
            g.check("the first RNR NAK");
            pump_sends(&l.send, &ids, &mut done, &sizes);
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert!(
        done.iter().all(|d| !d),
        "an eager send completed before its receive was posted"
    );

    // Phase 2: the receiver catches up, one irecv at a time.
    for i in 0..BURST {
        let r = loop {
            match l
                .recv
                .irecv(&[(rb.addr(i * STRIDE), STRIDE as u64, 7, &rb.mr)])
            {
                Ok(Some(r)) => break r,
                Ok(None) => {}
                Err(e) => panic!("irecv {i}: {e}"),
            }
            g.check("irecv");
            post(&mut ids);
            pump_sends(&l.send, &ids, &mut done, &sizes);
        };
        loop {
            match l.recv.test(r) {
                Ok(Some(got)) => {
                    assert_eq!(got, vec![sizes[i] as u64], "receive {i}");
                    break;
                }
                Ok(None) => {}
                Err(e) => panic!("receive {i} failed: {e}"),
            }
            g.check(&format!("receive {i}"));
            post(&mut ids);
            pump_sends(&l.send, &ids, &mut done, &sizes);
        }
        assert_eq!(
            rb.get(i * STRIDE, sizes[i]),
            pattern(i as u64, sizes[i]),
            "bytes of message {i}"
        );
    }
    while !done.iter().all(|&d| d) {
        g.check("the sends");
        pump_sends(&l.send, &ids, &mut done, &sizes);
    }
    let after = rnr_pair(counters(&l)).unwrap();
    l.send.close();
    l.recv.close();
    Some(Outcome {
        before,
        after,
        stats_file,
    })
}

#[test]
fn credits_off_burst_completes_through_rnr_retry_and_device_counters_move() {
    let Some(o) = burst("credits_off", false) else {
        return;
    };
    println!(
        "credits off: rcvd_rnr_err {} -> {}, send_rnr_err {} -> {}",
        o.before.0, o.after.0, o.before.1, o.after.1
    );
    assert!(o.after.0 > o.before.0, "rcvd_rnr_err did not move");
    assert!(o.after.1 > o.before.1, "send_rnr_err did not move");
    // The comms' own view, from VERBSNET_STATS_FILE.
    assert_eq!(stat(&o.stats_file, "send", "credit_stalls"), 0);
    assert_eq!(stat(&o.stats_file, "send", "ops"), BURST as u64);
    assert_eq!(stat(&o.stats_file, "recv", "ops"), BURST as u64);
    assert_eq!(stat(&o.stats_file, "recv", "rq_min_level"), 0);
    // The comms report the device counters as moved during their life, which holds the burst.
    let moved = stat(&o.stats_file, "send", "dev_rcvd_rnr_err");
    assert!(moved >= o.after.0 - o.before.0 && moved > 0, "{moved}");
    let sent = stat(&o.stats_file, "recv", "dev_send_rnr_err");
    assert!(sent >= o.after.1 - o.before.1 && sent > 0, "{sent}");
    let _ = std::fs::remove_file(&o.stats_file);
}

#[test]
fn credits_on_burst_never_draws_an_rnr_nak() {
    let Some(o) = burst("credits_on", true) else {
        return;
    };
    println!(
        "credits on: rcvd_rnr_err {} -> {}, send_rnr_err {} -> {}",
        o.before.0, o.after.0, o.before.1, o.after.1
    );
    assert_eq!(
        o.after, o.before,
        "RNR counters moved with credit gating on"
    );
    assert!(stat(&o.stats_file, "send", "credit_stalls") > 0);
    assert_eq!(stat(&o.stats_file, "send", "ops"), BURST as u64);
    assert_eq!(stat(&o.stats_file, "recv", "ops"), BURST as u64);
    let _ = std::fs::remove_file(&o.stats_file);
}

/// Polls at most this often after the receiver closed.
const CLOSE_POLLS: u64 = 1_000_000;

/// Closes the receive comm under a pending send and expects the sender's `test` to report a
/// remote error within `CLOSE_POLLS` polls. `stuck_in_rnr`: credits off and more sends than
/// receive WRs, so that the last one is in RNR retry when the receiver goes; otherwise one
/// eager send that arrived but waits for the clear-to-send the receiver never sends.
fn close_under_pending_send(test: &'static str, stuck_in_rnr: bool) {
    let _lock = serialize();
    let Some(l) = link(test, &send_cfg(!stuck_in_rnr), &recv_cfg()) else {
        return;
    };
    let g = Guard(Instant::now(), test);
    let sb = Buf::new(&l.dev, 4 * STRIDE).unwrap();
    let n = if stuck_in_rnr { 4 } else { 1 };
    let before = counters(&l).rcvd_rnr_err;
    let mut ids = Vec::new();
    for i in 0..n {
        let h = l
            .send
            .isend(sb.addr(i * STRIDE), 100, 0, &sb.mr)
            .unwrap()
            .expect("isend starts (credits or none needed)");
        ids.push(h);
    }
    // Let the sends reach the receiver (and, with RNR, draw a NAK) before it goes.
    let t = Instant::now();
    loop {
        for id in &ids {
            assert_eq!(
                l.send.test(*id),
                Ok(None),
                "a send finished without a receive"
            );
        }
        let nak = match (before, counters(&l).rcvd_rnr_err) {
            (Some(b), Some(a)) => a > b,
            _ => true, // no counters: time alone
        };
        if t.elapsed() > Duration::from_millis(50) && (!stuck_in_rnr || nak) {
            break;
        }
        g.check("the first sends");
        std::thread::sleep(Duration::from_millis(1));
    }
    let Link { send, recv, .. } = l;
    recv.close();
    let mut err = None;
    let mut first = 0;
    'poll: for polls in 0..CLOSE_POLLS {
        for (k, id) in ids.iter().enumerate() {
            match send.test(*id) {
                Ok(None) => {}
                Ok(Some(s)) => panic!("send completed after the receiver closed: {s:?}"),
                Err(e) => {
                    println!("{test}: send {k} failed after {polls} polls: {e}");
                    err = Some(e);
                    first = k;
                    break 'poll;
                }
            }
        }
        g.check("the error");
    }
    match err {
        Some(e) if e.class() == Class::Remote => {
            let m = e.to_string();
            assert!(m.contains("closed"), "{m}")
        }
        other => panic!("expected a remote error within {CLOSE_POLLS} polls, got {other:?}"),
    }
    // The other pending sends and every later isend fail the same way; close does not hang.
    for id in ids.iter().skip(first + 1) {
        assert!(matches!(send.test(*id), Err(e) if e.class() == Class::Remote));
    }
    assert!(matches!(
        send.isend(sb.addr(0), 8, 0, &sb.mr),
        Err(e) if e.class() == Class::Remote
    ));
    send.close();
}

#[test]
fn receiver_closing_under_a_send_waiting_for_its_cts_fails_the_send_remotely() {
    close_under_pending_send("close_waiting_cts", false);
}

#[test]
fn receiver_closing_under_a_send_in_rnr_retry_fails_the_send_remotely() {
    close_under_pending_send("close_in_rnr", true);
}
