//! RNR ("receiver not ready") at plugin level: a connected comm pair (testkit) whose receiver
//! has a tiny receive queue (depth 2, batch 1, low-water 1) and a burst of eager messages the
//! receiver is slow to pick up (its owner does not call it at all meanwhile: the NIC, or the
//! tcp transport's progress thread, answers for it).
//!
//! - credits off: the sender posts the whole burst at once; the SENDs beyond the two posted
//!   receive WRs are answered with RNR NAKs and retried by the QP (`rnr_retry` 7 = forever)
//!   until the receiver catches up. Everything arrives, and the RNR counters move.
//! - credits on: the sender stalls on credits instead; the RNR counters stay exactly where
//!   they were.
//! - a receive comm that closes while the sender has a send pending (waiting for its
//!   clear-to-send, or stuck in RNR retry, which the counters must show before the close)
//!   makes the sender's `test` fail with a remote error instead of hanging.
//!
//! Every test runs on both transports. RNR NAKs are counted where the transport counts them:
//! tcp per QP (the comms' `rnr_naks_received` / `rnr_naks_sent`), verbs per device (rxe: sysfs
//! `hw_counters/rcvd_rnr_err`, `send_rnr_err`); a device without counters skips a test rather
//! than take time for proof. The ib half runs in the soft-RoCE VM
//! (`testharness/softroce/vm-suite.sh`); on a host without a verbs device its tests print
//! `SKIP` and pass. The device counters are device-wide, so the tests here serialize on one
//! lock, and nothing else may use the device while they run (the VM suite runs one test
//! binary at a time). `VERBSNET_TEST_IB_HCA` picks the device (default: the first usable
//! verbs port).

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nccl_net_verbsnet::comm::{Class, SendComm};
use nccl_net_verbsnet::config::{Config, TransportChoice};
use nccl_net_verbsnet::engine::sim::pattern;
use nccl_net_verbsnet::engine::ReqId;
use nccl_net_verbsnet::testkit::{connect, open_device, Buf, Link};
use nccl_net_verbsnet::transport::Kind;

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

fn base_cfg(transport: Kind) -> Config {
    Config {
        transport: match transport {
            Kind::Ib => TransportChoice::Ib,
            Kind::Tcp => TransportChoice::Tcp,
        },
        ib_hca: std::env::var("VERBSNET_TEST_IB_HCA")
            .ok()
            .map(|h| format!("={h}")),
        ..Config::default()
    }
}

/// The receiver: a receive queue of 2, refilled one WR at a time when it runs empty.
fn recv_cfg(transport: Kind) -> Config {
    Config {
        rq_depth: 2,
        rq_min_depth: 2,
        rq_batch: 1,
        rq_low_water: 1,
        ..base_cfg(transport)
    }
}

fn send_cfg(transport: Kind, credits: bool) -> Config {
    Config {
        credits,
        ..base_cfg(transport)
    }
}

/// A connected pair and its transport, or `None` after a SKIP line on hosts without a verbs
/// device (ib).
fn link(test: &str, send: &Config, recv: &Config) -> Option<(Link, Kind)> {
    let (dev, kind) = match open_device(send) {
        Ok(d) => d,
        Err(e) => {
            println!("SKIP {test}: {e}");
            return None;
        }
    };
    Some((
        connect(&dev, kind, send, recv, 1_000_000).expect("connect"),
        kind,
    ))
}

fn counter(v: &[(&'static str, u64)], name: &str) -> u64 {
    v.iter()
        .find(|(k, _)| *k == name)
        .unwrap_or_else(|| panic!("no counter {name} in {v:?}"))
        .1
}

/// RNR NAKs so far, (received by the sender, sent by the receiver): per QP on tcp (the comms'
/// own counters), device-wide on verbs (rxe's `hw_counters`); `None` when the device has no
/// such counters (not rxe).
fn rnr_of(l: &Link, kind: Kind) -> Option<(u64, u64)> {
    match kind {
        Kind::Tcp => Some((
            counter(&l.send.counters(), "rnr_naks_received"),
            counter(&l.recv.counters(), "rnr_naks_sent"),
        )),
        Kind::Ib => {
            let c = l.dev.rnr_counters();
            Some((c.rcvd_rnr_err?, c.send_rnr_err?))
        }
    }
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
    kind: Kind,
    before: (u64, u64),
    after: (u64, u64),
    stats_file: String,
}

/// The burst: the sender posts what it can while the receiver does nothing (long enough for
/// SENDs beyond the receive queue to be NAKed when nothing holds them back), then the receiver
/// posts one irecv at a time and waits for it while the sender keeps posting and testing.
fn burst(test: &'static str, kind: Kind, credits: bool) -> Option<Outcome> {
    let _lock = serialize();
    let stats_file = format!("/tmp/verbsnet-rnr-{}-{test}.jsonl", std::process::id());
    let _ = std::fs::remove_file(&stats_file);
    let mut s_cfg = send_cfg(kind, credits);
    let mut r_cfg = recv_cfg(kind);
    s_cfg.stats_file = Some(stats_file.clone());
    r_cfg.stats_file = Some(stats_file.clone());
    let (l, kind) = link(test, &s_cfg, &r_cfg)?;
    let Some(before) = rnr_of(&l, kind) else {
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
        while rnr_of(&l, kind).unwrap().0 == before.0 {
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
    let after = rnr_of(&l, kind).unwrap();
    l.send.close();
    l.recv.close();
    Some(Outcome {
        kind,
        before,
        after,
        stats_file,
    })
}

fn credits_off_burst_completes_through_rnr_retry_and_the_counters_move(kind: Kind) {
    let test = match kind {
        Kind::Tcp => "tcp_credits_off",
        Kind::Ib => "ib_credits_off",
    };
    let Some(o) = burst(test, kind, false) else {
        return;
    };
    println!(
        "credits off ({}): RNR NAKs received {} -> {}, sent {} -> {}",
        kind.as_str(),
        o.before.0,
        o.after.0,
        o.before.1,
        o.after.1
    );
    assert!(o.after.0 > o.before.0, "no RNR NAK received");
    assert!(o.after.1 > o.before.1, "no RNR NAK sent");
    // The comms' own view, from VERBSNET_STATS_FILE.
    assert_eq!(stat(&o.stats_file, "send", "credit_stalls"), 0);
    assert_eq!(stat(&o.stats_file, "send", "ops"), BURST as u64);
    assert_eq!(stat(&o.stats_file, "recv", "ops"), BURST as u64);
    assert_eq!(stat(&o.stats_file, "recv", "rq_min_level"), 0);
    // The comms report the counters as moved during their life, which holds the burst:
    // verbs the device's, tcp the QP's own.
    let (received, sent) = match o.kind {
        Kind::Ib => ("dev_rcvd_rnr_err", "dev_send_rnr_err"),
        Kind::Tcp => ("rnr_naks_received", "rnr_naks_sent"),
    };
    let moved = stat(&o.stats_file, "send", received);
    assert!(moved >= o.after.0 - o.before.0 && moved > 0, "{moved}");
    let sent = stat(&o.stats_file, "recv", sent);
    assert!(sent >= o.after.1 - o.before.1 && sent > 0, "{sent}");
    let _ = std::fs::remove_file(&o.stats_file);
}

fn credits_on_burst_never_draws_an_rnr_nak(kind: Kind) {
    let test = match kind {
        Kind::Tcp => "tcp_credits_on",
        Kind::Ib => "ib_credits_on",
    };
    let Some(o) = burst(test, kind, true) else {
        return;
    };
    println!(
        "credits on ({}): RNR NAKs received {} -> {}, sent {} -> {}",
        kind.as_str(),
        o.before.0,
        o.after.0,
        o.before.1,
        o.after.1
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

/// Closes the receive comm under a pending send and expects the sender's `test` to report a
/// remote error, never a hang (at the latest at the comm's next peer check,
/// `VERBSNET_PEER_CHECK_INTERVAL`, when no WR of the sender is outstanding at the QP: an eager
/// SEND the receiver's NIC acknowledged that waits for its clear-to-send). `stuck_in_rnr`: credits off and more sends than
/// receive WRs, so that the last one is in RNR retry when the receiver goes (the RNR counters
/// must show it first: a device without counters skips the test); otherwise one eager send
/// that arrived but waits for the clear-to-send the receiver never sends.
fn close_under_pending_send(test: &'static str, kind: Kind, stuck_in_rnr: bool) {
    let _lock = serialize();
    let Some((l, kind)) = link(test, &send_cfg(kind, !stuck_in_rnr), &recv_cfg(kind)) else {
        return;
    };
    let before = rnr_of(&l, kind);
    if stuck_in_rnr && before.is_none() {
        println!("SKIP {test}: the device has no RNR counters to show the send is in RNR retry");
        return;
    }
    let g = Guard(Instant::now(), test);
    let sb = Buf::new(&l.dev, 4 * STRIDE).unwrap();
    let n = if stuck_in_rnr { 4 } else { 1 };
    let mut ids = Vec::new();
    for i in 0..n {
        let h = l
            .send
            .isend(sb.addr(i * STRIDE), 100, 0, &sb.mr)
            .unwrap()
            .expect("isend starts (credits or none needed)");
        ids.push(h);
    }
    // Let the sends reach the receiver (with RNR: until it has NAKed one, by the counters)
    // before it goes.
    let t = Instant::now();
    loop {
        for id in &ids {
            assert_eq!(
                l.send.test(*id),
                Ok(None),
                "a send finished without a receive"
            );
        }
        let nak = match (before, rnr_of(&l, kind)) {
            (Some(b), Some(a)) => a.0 > b.0 && a.1 > b.1,
            _ => false,
        };
        if if stuck_in_rnr {
            nak
        } else {
            t.elapsed() > Duration::from_millis(50)
        } {
            break;
        }
        g.check("the first sends");
        std::thread::sleep(Duration::from_millis(1));
    }
    let Link { send, recv, .. } = l;
    recv.close();
    let mut err = None;
    let mut first = 0;
    let closed = Instant::now();
    'poll: for polls in 0u64.. {
        for (k, id) in ids.iter().enumerate() {
            match send.test(*id) {
                Ok(None) => {}
                Ok(Some(s)) => panic!("send completed after the receiver closed: {s:?}"),
                Err(e) => {
                    println!(
                        "{test}: send {k} failed after {polls} polls, {:?}: {e}",
                        closed.elapsed()
                    );
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
        other => panic!("expected a remote error, got {other:?}"),
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
fn tcp_credits_off_burst_completes_through_rnr_retry_and_the_counters_move() {
    credits_off_burst_completes_through_rnr_retry_and_the_counters_move(Kind::Tcp);
}

#[test]
fn ib_credits_off_burst_completes_through_rnr_retry_and_the_counters_move() {
    credits_off_burst_completes_through_rnr_retry_and_the_counters_move(Kind::Ib);
}

#[test]
fn tcp_credits_on_burst_never_draws_an_rnr_nak() {
    credits_on_burst_never_draws_an_rnr_nak(Kind::Tcp);
}

#[test]
fn ib_credits_on_burst_never_draws_an_rnr_nak() {
    credits_on_burst_never_draws_an_rnr_nak(Kind::Ib);
}

#[test]
fn tcp_receiver_closing_under_a_send_waiting_for_its_cts_fails_the_send_remotely() {
    close_under_pending_send("tcp_close_waiting_cts", Kind::Tcp, false);
}

#[test]
fn ib_receiver_closing_under_a_send_waiting_for_its_cts_fails_the_send_remotely() {
    close_under_pending_send("ib_close_waiting_cts", Kind::Ib, false);
}

#[test]
fn tcp_receiver_closing_under_a_send_in_rnr_retry_fails_the_send_remotely() {
    close_under_pending_send("tcp_close_in_rnr", Kind::Tcp, true);
}

#[test]
fn ib_receiver_closing_under_a_send_in_rnr_retry_fails_the_send_remotely() {
    close_under_pending_send("ib_close_in_rnr", Kind::Ib, true);
}
