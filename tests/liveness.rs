//! Liveness of the plugin under NCCL's least polite legal caller (issue 19), through the
//! exported `ncclNetPlugin_v12` table.
//!
//! The rule (NCCL's IB transport, `src/transport/net_ib/p2p.cc`): `ncclIbIrecv` posts one
//! receive WR and writes the clear-to-send; from then on the matching `ncclIbIsend` needs
//! nothing more from the receiver. So once a receive is posted, the send that matches it is
//! accepted by `isend` within a bounded number of calls on the **send** comm alone, and its
//! `test` reports done, whatever the receiver does next. A caller may post all its receives,
//! then all its sends, then test.
//!
//! The failure side is live too: once the peer died or closed, the survivor's calls (an
//! `isend` that was answering "retry later", an `irecv` with nothing in flight) fail with
//! `ncclRemoteError` within the documented bound (`VERBSNET_PEER_CHECK_INTERVAL`, here
//! 0.05 s, plus slack for a shared machine).
//!
//! Transport from `VERBSNET_TEST_TRANSPORT` (`tcp` here, `ib` on rxe0 in the soft-RoCE VM).
//! Bounds: `VERBSNET_LIVENESS_BOUND_MS` (an `isend` spin or a completion without progress:
//! 2 s on tcp, 20 s on ib) and at least 100,000 calls; `VERBSNET_LIVENESS_DEATH_MS` (0.75 s on
//! tcp, 5 s on ib).

use std::ffi::c_int;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

mod common;
use common::table::{self as t, Mem, Ptr, Rc, OK};

/// Receives (and then sends) per connection: `NCCL_NET_MAX_REQUESTS`.
const N: usize = 32;
/// Calls of one spin before its wall-clock bound may fail it.
const SPIN_CALLS: u64 = 100_000;

fn env_ms(name: &str, tcp: u64, ib: u64) -> Duration {
    let d = if common::is_ib() { ib } else { tcp };
    Duration::from_millis(
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(d),
    )
}

fn bound() -> Duration {
    env_ms("VERBSNET_LIVENESS_BOUND_MS", 2_000, 20_000)
}

fn death_bound() -> Duration {
    env_ms("VERBSNET_LIVENESS_DEATH_MS", 750, 5_000)
}

fn setup() -> Ptr {
    t::set_env(&[("VERBSNET_PEER_CHECK_INTERVAL", "0.05")]);
    t::init(0x19).unwrap_or_else(|rc| panic!("init returned {rc:?}"))
}

/// Message `k`'s size: eager (small, empty, exactly the 8 KiB eager limit) and rendezvous
/// (just above it, 64 KiB) in turn.
fn size(k: usize) -> usize {
    [1024, 0, 8192, 8193, 65536, 17][k % 6]
}

/// The largest message: each buffer's capacity.
const CAP: usize = 65536;

/// One connection: the send end with its registered source buffers, the receive end with its
/// destination buffers (`N` of each, `CAP` bytes apart).
struct End {
    comm: Ptr,
    mem: Mem,
    mh: Ptr,
    reqs: Vec<Option<Ptr>>,
}

struct Link {
    key: u64,
    tag: i32,
    send: End,
    recv: End,
}

fn end(comm: Ptr, fill: u8) -> End {
    let mem = Mem::new(N * CAP, fill);
    let mh = t::reg_mr(comm, &mem).unwrap_or_else(|rc| panic!("regMr returned {rc:?}"));
    End {
        comm,
        mem,
        mh,
        reqs: vec![None; N],
    }
}

fn link(ctx: Ptr, key: u64, tag: i32) -> Link {
    let (s, r) = t::connect_pair(ctx, Duration::from_secs(60)).unwrap();
    let send = end(s, 0);
    for k in 0..N {
        send.mem
            .write(k * CAP, &t::pattern(key, tag, k as u64, size(k)));
    }
    Link {
        key,
        tag,
        send,
        recv: end(r, 0xa5),
    }
}

/// `irecv` of message `k`'s buffer, retried on the receive comm alone within the bound.
fn post(l: &mut Link, k: usize) {
    let e = &l.recv;
    let buf = [(e.mem.addr(k * CAP), CAP, l.tag, e.mh)];
    let (start, mut calls) = (Instant::now(), 0u64);
    loop {
        calls += 1;
        match t::irecv(e.comm, &buf) {
            Ok(Some(r)) => {
                l.recv.reqs[k] = Some(r);
                return;
            }
            Ok(None) => {}
            Err(rc) => panic!("irecv {k} returned {rc:?}"),
        }
        assert!(
            calls < SPIN_CALLS || start.elapsed() < bound(),
            "irecv {k} with {k} receives outstanding answered retry later for {calls} calls and \
             {:?}",
            start.elapsed()
        );
    }
}

/// `isend` of message `k`, spun to a request with no call on any receive comm: the contract
/// says it must be accepted within the bound, its receive being posted.
fn spin_send(l: &mut Link, k: usize) {
    let e = &l.send;
    let (start, mut calls) = (Instant::now(), 0u64);
    loop {
        calls += 1;
        match t::isend(e.comm, e.mem.addr(k * CAP), size(k), l.tag, e.mh) {
            Ok(Some(r)) => {
                l.send.reqs[k] = Some(r);
                return;
            }
            Ok(None) => {}
            Err(rc) => panic!("isend {k} returned {rc:?}"),
        }
        assert!(
            calls < SPIN_CALLS || start.elapsed() < bound(),
            "isend {k} ({} B, tag {}), whose receive is posted, answered retry later for {calls} \
             calls and {:?} with no call on the receive comm (the issue 19 hang)",
            size(k),
            l.tag,
            start.elapsed()
        );
    }
}

/// Tests the send requests (`send`) and receive requests (`recv`) of `links` until all are
/// done, checking sizes and, for receives, the bytes.
fn complete(links: &mut [&mut Link], send: bool, recv: bool) {
    let (mut start, mut calls) = (Instant::now(), 0u64);
    loop {
        let mut open = 0;
        for l in links.iter_mut() {
            for k in 0..N {
                if send {
                    if let Some(r) = l.send.reqs[k] {
                        calls += 1;
                        match t::test(r, 1) {
                            Ok(Some(v)) => {
                                assert_eq!(v, [size(k) as c_int], "send {k}: reported size");
                                l.send.reqs[k] = None;
                                start = Instant::now();
                            }
                            Ok(None) => open += 1,
                            Err(rc) => panic!("test of send {k} returned {rc:?}"),
                        }
                    }
                }
                if recv {
                    if let Some(r) = l.recv.reqs[k] {
                        calls += 1;
                        match t::test(r, 1) {
                            Ok(Some(v)) => {
                                assert_eq!(v, [size(k) as c_int], "receive {k}: reported size");
                                check(l, k);
                                l.recv.reqs[k] = None;
                                start = Instant::now();
                            }
                            Ok(None) => open += 1,
                            Err(rc) => panic!("test of receive {k} returned {rc:?}"),
                        }
                    }
                }
            }
        }
        if open == 0 {
            return;
        }
        assert!(
            calls < SPIN_CALLS || start.elapsed() < bound(),
            "{open} requests made no progress for {:?} ({calls} calls; send end tested: {send}, \
             receive end tested: {recv})",
            start.elapsed()
        );
    }
}

/// Receive `k` holds message `k`, then the canary.
fn check(l: &Link, k: usize) {
    let got = l.recv.mem.read(k * CAP, CAP);
    let n = size(k);
    assert!(
        got[..n] == t::pattern(l.key, l.tag, k as u64, n)[..],
        "receive {k}: wrong bytes"
    );
    assert!(
        got[n..].iter().all(|&b| b == 0xa5),
        "receive {k}: written past its {n} bytes"
    );
}

fn close(l: Link) {
    assert_eq!(t::dereg_mr(l.send.comm, l.send.mh), OK);
    assert_eq!(t::dereg_mr(l.recv.comm, l.recv.mh), OK);
    assert_eq!(t::close_send(l.send.comm), OK);
    assert_eq!(t::close_recv(l.recv.comm), OK);
}

/// Issue 19's pattern on one thread, four connections (two per direction between two
/// emulated ranks): 32 receives posted on each, then on each 32 sends spun to a request with
/// no call on any receive comm, then everything tested; every byte checked.
#[test]
fn thirty_two_receives_then_thirty_two_sends_spun_without_receiver_calls_one_thread() {
    let _g = common::serial();
    let ctx = setup();
    // Tags as NCCL sets them: the sender's rank.
    let mut links: Vec<Link> = (0..4).map(|i| link(ctx, i, (i / 2) as i32)).collect();
    for l in links.iter_mut() {
        for k in 0..N {
            post(l, k);
        }
    }
    for l in links.iter_mut() {
        for k in 0..N {
            spin_send(l, k);
        }
    }
    let mut all: Vec<&mut Link> = links.iter_mut().collect();
    complete(&mut all, true, true);
    for l in links {
        close(l);
    }
    assert_eq!(t::finalize(ctx), OK);
}

/// The same pattern with two ranks as two threads, both directions at once (two connections
/// each way): each rank posts its 32 receives per connection, both wait for each other, then
/// each spins its 32 sends per connection without calling a receive comm, then tests all.
#[test]
fn thirty_two_receives_then_thirty_two_sends_spun_without_receiver_calls_two_ranks() {
    let _g = common::serial();
    let ctx = setup();
    // links[i]: rank i % 2 sends to the other rank.
    let links: Vec<Link> = (0..4).map(|i| link(ctx, 100 + i, (i % 2) as i32)).collect();
    // Each rank's half: the send ends of its links, the receive ends of the others'.
    let mut sends: [Vec<Link>; 2] = [Vec::new(), Vec::new()];
    for l in links {
        sends[(l.tag) as usize].push(l);
    }
    // A link is driven by two threads (its send end by one rank, its receive end by the
    // other): split each into its ends.
    struct Half {
        sends: Vec<Link>,
        recvs: Vec<Link>,
    }
    let [s0, s1] = sends;
    // Rank 0 receives what rank 1 sends and the other way round. Each rank keeps the whole
    // `Link` of its sends and the receive ends of the peer's: ends are separate objects, so
    // the two threads never touch one comm together.
    let (recv_of_0, send_of_1): (Vec<End>, Vec<(u64, i32, End)>) = s1
        .into_iter()
        .map(|l| (l.recv, (l.key, l.tag, l.send)))
        .unzip();
    let (recv_of_1, send_of_0): (Vec<End>, Vec<(u64, i32, End)>) = s0
        .into_iter()
        .map(|l| (l.recv, (l.key, l.tag, l.send)))
        .unzip();
    let barrier = Arc::new(Barrier::new(2));
    let rank = |mine: Vec<(u64, i32, End)>, theirs: Vec<(u64, i32, End)>, b: Arc<Barrier>| {
        move || {
            // Reassemble a Link per connection with only this rank's end live: the other end
            // is a placeholder never called.
            let mut recvs: Vec<Link> = theirs
                .into_iter()
                .map(|(key, tag, recv)| Link {
                    key,
                    tag,
                    send: placeholder(),
                    recv,
                })
                .collect();
            for l in recvs.iter_mut() {
                for k in 0..N {
                    post(l, k);
                }
            }
            b.wait();
            let mut sends: Vec<Link> = mine
                .into_iter()
                .map(|(key, tag, send)| Link {
                    key,
                    tag,
                    send,
                    recv: placeholder(),
                })
                .collect();
            for l in sends.iter_mut() {
                for k in 0..N {
                    spin_send(l, k);
                }
            }
            // This rank's requests, sends and receives (the placeholder ends have none).
            let mut all: Vec<&mut Link> = sends.iter_mut().chain(recvs.iter_mut()).collect();
            complete(&mut all, true, true);
            Half { sends, recvs }
        }
    };
    let pair = |ends: Vec<End>, sends: &Vec<(u64, i32, End)>| -> Vec<(u64, i32, End)> {
        ends.into_iter()
            .zip(sends.iter())
            .map(|(e, (key, tag, _))| (*key, *tag, e))
            .collect()
    };
    let theirs_0 = pair(recv_of_0, &send_of_1);
    let theirs_1 = pair(recv_of_1, &send_of_0);
    let r0 = std::thread::spawn(rank(send_of_0, theirs_0, barrier.clone()));
    let r1 = std::thread::spawn(rank(send_of_1, theirs_1, barrier));
    let (h0, h1) = (r0.join().unwrap(), r1.join().unwrap());
    for h in [h0, h1] {
        for l in h.sends {
            assert_eq!(t::dereg_mr(l.send.comm, l.send.mh), OK);
            assert_eq!(t::close_send(l.send.comm), OK);
        }
        for l in h.recvs {
            assert_eq!(t::dereg_mr(l.recv.comm, l.recv.mh), OK);
            assert_eq!(t::close_recv(l.recv.comm), OK);
        }
    }
    assert_eq!(t::finalize(ctx), OK);
}

/// An end never called (the other rank owns the real one).
fn placeholder() -> End {
    End {
        comm: Ptr::null(),
        mem: Mem::new(0, 0),
        mh: Ptr::null(),
        reqs: vec![None; N],
    }
}

/// Calls `call` until `deadline` has passed by `after` calls; every call from `deadline` on
/// must fail with `ncclRemoteError`, and once one failed every later one must.
fn survivor(
    what: &str,
    deadline: Instant,
    after: usize,
    mut call: impl FnMut() -> Result<String, Rc>,
) {
    let mut failed: Option<Rc> = None;
    let mut late = 0;
    while late < after {
        let at = Instant::now();
        let r = call();
        match (&r, failed) {
            (Err(rc), _) => {
                assert_eq!(*rc, Rc::ncclRemoteError, "{what}: {rc:?}");
                failed = Some(*rc);
            }
            (Ok(ok), Some(rc)) => panic!("{what}: answered {ok} after an earlier {rc:?}"),
            (Ok(ok), None) => assert!(
                at < deadline,
                "{what}: answered {ok} {:?} after the bound; must fail with ncclRemoteError",
                at - deadline
            ),
        }
        if at >= deadline {
            late += 1;
        }
    }
}

/// The receiver dies (no close) while `isend` answers "retry later" for want of a receive:
/// from the bound on, that `isend` and a `test` of the sends it had accepted fail with
/// `ncclRemoteError`.
#[test]
fn a_peer_dying_while_isend_answers_retry_later_fails_every_later_call_within_the_bound() {
    let _g = common::serial();
    let ctx = setup();
    let (_warns, _cap) = common::capture();
    let mut l = link(ctx, 7, 0);
    // No receive posted: eager sends go out on the initial credits, then "retry later".
    let mut started = Vec::new();
    let mut k = 0;
    let refused = loop {
        let e = &l.send;
        match t::isend(e.comm, e.mem.addr(k * CAP), 64, 0, e.mh) {
            Ok(Some(r)) => {
                started.push(r);
                k += 1;
                assert!(k < N, "{k} sends accepted with no receive posted");
            }
            Ok(None) => break k,
            Err(rc) => panic!("isend {k}: {rc:?}"),
        }
    };
    for _ in 0..1000 {
        assert_eq!(
            t::isend(
                l.send.comm,
                l.send.mem.addr(refused * CAP),
                64,
                0,
                l.send.mh
            ),
            Ok(None)
        );
    }
    t::crash(l.recv.comm);
    let deadline = Instant::now() + death_bound();
    let e = &l.send;
    let mut i = 0usize;
    survivor("the sender after the receiver died", deadline, 16, || {
        i += 1;
        if i.is_multiple_of(2) && !started.is_empty() {
            let r = started[i % started.len()];
            t::test(r, 1).map(|d| format!("test {d:?}"))
        } else {
            t::isend(e.comm, e.mem.addr(refused * CAP), 64, 0, e.mh).map(|r| format!("isend {r:?}"))
        }
    });
    assert_eq!(t::dereg_mr(l.send.comm, l.send.mh), OK);
    assert_eq!(t::close_send(l.send.comm), OK);
    // The dead receiver's registration outlives its comm (it never closed).
    assert_eq!(t::dereg_mr(Ptr::null(), l.recv.mh), OK);
    l.recv.reqs.clear();
    assert_eq!(t::finalize(ctx), OK);
}

/// The receiver dies while a rendezvous `isend` answers "retry later" waiting for the
/// clear-to-send of a receive never posted, nothing in flight on the send comm: from the bound
/// on, that `isend` fails with `ncclRemoteError`.
#[test]
fn a_peer_dying_while_a_rendezvous_isend_waits_for_its_cts_fails_it_within_the_bound() {
    let _g = common::serial();
    let ctx = setup();
    let (_warns, _cap) = common::capture();
    let l = link(ctx, 11, 0);
    let e = &l.send;
    // 64 KiB is above the eager limit: with no receive known it waits for a CTS.
    for _ in 0..1000 {
        assert_eq!(t::isend(e.comm, e.mem.addr(0), CAP, 0, e.mh), Ok(None));
    }
    t::crash(l.recv.comm);
    let deadline = Instant::now() + death_bound();
    survivor(
        "the rendezvous sender after the receiver died",
        deadline,
        16,
        || t::isend(e.comm, e.mem.addr(0), CAP, 0, e.mh).map(|r| format!("isend {r:?}")),
    );
    assert_eq!(t::dereg_mr(l.send.comm, l.send.mh), OK);
    assert_eq!(t::close_send(l.send.comm), OK);
    // The dead receiver's registration outlives its comm (it never closed).
    assert_eq!(t::dereg_mr(Ptr::null(), l.recv.mh), OK);
    assert_eq!(t::finalize(ctx), OK);
}

/// The sender dies after one message; the receiver, with nothing in flight, calls nothing
/// until the bound has passed: its first `irecv` then fails with `ncclRemoteError` (a comm
/// asks about its peer at every call once per `VERBSNET_PEER_CHECK_INTERVAL`, also with
/// nothing in flight).
#[test]
fn a_peer_dying_fails_an_irecv_with_nothing_in_flight_within_the_bound() {
    let _g = common::serial();
    let ctx = setup();
    let (_warns, _cap) = common::capture();
    let mut l = link(ctx, 8, 0);
    post(&mut l, 0);
    spin_send(&mut l, 0);
    let mut all = [&mut l];
    complete(&mut all, true, true);
    t::crash(l.send.comm);
    std::thread::sleep(death_bound());
    let e = &l.recv;
    let buf = [(e.mem.addr(CAP), CAP, 0, e.mh)];
    survivor(
        "the receiver, nothing in flight, after the sender died",
        Instant::now(),
        8,
        || t::irecv(e.comm, &buf).map(|r| format!("irecv {r:?}")),
    );
    assert_eq!(t::dereg_mr(l.recv.comm, l.recv.mh), OK);
    assert_eq!(t::close_recv(l.recv.comm), OK);
    assert_eq!(t::dereg_mr(Ptr::null(), l.send.mh), OK);
    assert_eq!(t::finalize(ctx), OK);
}

/// closeSend and closeRecv with requests in flight (an abort) return `ncclSuccess`; the
/// peer's later calls fail with `ncclRemoteError` within the bound; afterwards every
/// descriptor the connection opened is closed.
#[test]
fn closing_with_requests_in_flight_succeeds_and_the_peer_fails_cleanly() {
    let _g = common::serial();
    let (_warns, _cap) = common::capture();
    // One init/finalize first: descriptors a process opens once are not counted.
    let ctx = setup();
    assert_eq!(t::finalize(ctx), OK);
    let fds = t::fds();
    let ctx = setup();
    let mut l = link(ctx, 9, 0);
    for k in 0..4 {
        post(&mut l, k);
    }
    // Two sends in flight, never tested.
    for k in 0..2 {
        spin_send(&mut l, k);
    }
    assert_eq!(
        t::close_send(l.send.comm),
        OK,
        "closeSend with sends in flight"
    );
    let deadline = Instant::now() + death_bound();
    let e = &l.recv;
    let buf = [(e.mem.addr(5 * CAP), CAP, 0, e.mh)];
    let mut i = 0;
    let reqs: Vec<Ptr> = e.reqs.iter().flatten().copied().collect();
    survivor("the receiver after the sender closed", deadline, 16, || {
        i += 1;
        match i % 3 {
            0 => t::irecv(e.comm, &buf).map(|r| format!("irecv {r:?}")),
            // The two receives no send matched: in progress until the close shows, then failed.
            _ => t::test(reqs[2 + i % 2], 1).map(|d| format!("test {d:?}")),
        }
    });
    assert_eq!(
        t::close_recv(l.recv.comm),
        OK,
        "closeRecv with receives in flight"
    );
    // Both closes freed the registrations left behind (NCCL deregisters first; this caller
    // did not): a late deregMr is refused, never a double free.
    for mh in [l.send.mh, l.recv.mh] {
        assert_eq!(t::dereg_mr(Ptr::null(), mh), Rc::ncclInvalidArgument);
    }
    assert_eq!(t::finalize(ctx), OK);
    drop(l);
    assert_eq!(t::fds(), fds, "descriptors left open after an abort");
}

/// A peer that closes its comm after its requests completed is reported as a close, not as a
/// death: `(closed end, wording the survivor's WARN must carry)`.
fn orderly_close(victim_is_recv: bool) {
    let _g = common::serial();
    let ctx = setup();
    let (warns, _cap) = common::capture();
    let mut l = link(ctx, 10, 0);
    post(&mut l, 0);
    spin_send(&mut l, 0);
    let mut all = [&mut l];
    complete(&mut all, true, true);
    let (wording, what) = if victim_is_recv {
        assert_eq!(t::dereg_mr(l.recv.comm, l.recv.mh), OK);
        assert_eq!(t::close_recv(l.recv.comm), OK);
        ("the peer closed its receive comm", "the sender")
    } else {
        assert_eq!(t::dereg_mr(l.send.comm, l.send.mh), OK);
        assert_eq!(t::close_send(l.send.comm), OK);
        ("the peer closed its send comm", "the receiver")
    };
    let deadline = Instant::now() + death_bound();
    let (s, r) = (&l.send, &l.recv);
    let buf = [(r.mem.addr(CAP), CAP, 0, r.mh)];
    survivor(
        &format!("{what} after an orderly close"),
        deadline,
        4,
        || {
            if victim_is_recv {
                t::isend(s.comm, s.mem.addr(CAP), 64, 0, s.mh).map(|r| format!("isend {r:?}"))
            } else {
                t::irecv(r.comm, &buf).map(|r| format!("irecv {r:?}"))
            }
        },
    );
    // Each failing call WARNs once: keep one of each distinct line for the messages.
    let mut lines = warns.lock().unwrap().clone();
    lines.sort();
    lines.dedup();
    assert!(
        lines.iter().any(|w| w.contains(wording)),
        "no WARN says {wording:?}: {lines:#?}"
    );
    assert!(
        !lines.iter().any(|w| w.contains("died")),
        "an orderly close reported as a death: {lines:#?}"
    );
    if victim_is_recv {
        assert_eq!(t::dereg_mr(l.send.comm, l.send.mh), OK);
        assert_eq!(t::close_send(l.send.comm), OK);
    } else {
        assert_eq!(t::dereg_mr(l.recv.comm, l.recv.mh), OK);
        assert_eq!(t::close_recv(l.recv.comm), OK);
    }
    assert_eq!(t::finalize(ctx), OK);
}

#[test]
fn an_orderly_close_of_the_receive_comm_is_reported_as_a_close() {
    orderly_close(true);
}

#[test]
fn an_orderly_close_of_the_send_comm_is_reported_as_a_close() {
    orderly_close(false);
}
