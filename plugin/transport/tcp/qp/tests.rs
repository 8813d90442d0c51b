//! The tcp QP's own tests (state, requester and responder at the byte level).

use std::io::Write;
use std::net::{TcpListener, TcpStream};

use super::io::STAGE_READ_MAX;
use super::*;
use crate::mem::Region;
use crate::transport::tcp::wire::{self, HEADER_LEN};
use crate::transport::{SendOpcode, Sge};

fn established() -> (TcpQp, TcpStream, Region, u32) {
    let registry = Arc::new(Registry::new(1));
    let cfg = QpConfig {
        max_recv_wr: 16,
        max_send_wr: 16,
        max_inline_data: 0,
        min_rnr_timer: 1,
        rnr_retry: 7,
        timeout: 14,
        retry_cnt: 7,
        traffic_class: 0,
        service_level: 0,
        oob_keepalive: None,
    };
    let mut qp = TcpQp::new(1, 100, cfg, Arc::clone(&registry));
    qp.doorbell = false;
    let region = Region::alloc(64 << 10);
    let lkey = registry.insert(region.clone()).expect("register");
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let s = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (peer, _) = l.accept().expect("accept");
    let info = ConnInfo {
        qp_num: 2,
        initial_psn: 7,
    }
    .encode();
    qp.establish(&info, s).expect("establish");
    (qp, peer, region, lkey)
}

fn send_of(region: &Region, lkey: u32, len: u32) -> SendWr {
    SendWr {
        wr_id: 1,
        sgl: [
            Sge {
                addr: region.addr(),
                length: len,
                lkey,
            },
            Sge::default(),
        ],
        num_sge: 1,
        opcode: SendOpcode::Send,
        signaled: true,
        inline: false,
    }
}

fn frames_in(buf: &[u8]) -> Vec<Frame> {
    let mut v = Vec::new();
    let mut off = 0;
    while off + HEADER_LEN <= buf.len() {
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&buf[off..off + HEADER_LEN]);
        let f = Frame::decode(&h).expect("frame");
        off += HEADER_LEN;
        if let Frame::Send { len, .. } = f {
            off += len as usize;
        }
        v.push(f);
    }
    v
}

#[test]
fn error_keeps_control_frames_and_drops_data_not_begun() {
    let (mut qp, _peer, region, lkey) = established();
    qp.post_send(&[send_of(&region, lkey, 16); 3])
        .expect("post");
    qp.push_ack(6);
    assert!(qp.stage_frames(Instant::now()));
    qp.push_ack(7); // queued behind the data, not staged yet
    assert_eq!(qp.tx_frames.len(), 4);
    assert_eq!(qp.tx_buf.len(), 32 + 3 * 48);
    qp.enter_error(Cause::Local, "test");
    assert_eq!(frames_in(&qp.tx_buf), [Frame::Ack { psn: 6 }]);
    assert_eq!(qp.tx_off, 0);
    assert_eq!(qp.tx_frames.len(), 1);
    assert!(
        qp.stage_frames(Instant::now()),
        "the queued ACK still goes out"
    );
    assert_eq!(
        frames_in(&qp.tx_buf),
        [Frame::Ack { psn: 6 }, Frame::Ack { psn: 7 }]
    );
}

#[test]
fn error_finishes_the_frame_being_written() {
    let (mut qp, _peer, region, lkey) = established();
    qp.post_send(&[send_of(&region, lkey, 16); 3])
        .expect("post");
    assert!(qp.stage_frames(Instant::now()));
    let first_end = 48;
    qp.tx_off = 40; // 8 bytes of the first frame still to write
    let rest = qp.tx_buf[40..first_end].to_vec();
    qp.enter_error(Cause::Local, "test");
    assert_eq!(qp.tx_buf, rest);
    assert_eq!(qp.tx_frames.len(), 1);
}

#[test]
fn error_drops_a_large_payload_whose_header_is_not_out() {
    let (mut qp, _peer, region, lkey) = established();
    qp.post_send(&[send_of(&region, lkey, 32 << 10)])
        .expect("post");
    assert!(qp.stage_frames(Instant::now()));
    assert!(qp.tx_payload.is_some());
    qp.enter_error(Cause::Local, "test");
    assert!(qp.tx_buf.is_empty());
    assert!(qp.tx_payload.is_none());
    // No payload in flight: the WR flushes at once.
    qp.retire_sq();
    assert_eq!(qp.cq.len(), 1);
}

#[test]
fn error_keeps_a_large_payload_whose_header_is_out() {
    for tx_off in [10, 32] {
        let (mut qp, _peer, region, lkey) = established();
        qp.post_send(&[send_of(&region, lkey, 32 << 10)])
            .expect("post");
        assert!(qp.stage_frames(Instant::now()));
        if tx_off == 32 {
            // Header fully written: tx_buf drained.
            qp.tx_buf.clear();
            qp.tx_frames.clear();
            qp.tx_off = 0;
        } else {
            qp.tx_off = tx_off;
        }
        qp.enter_error(Cause::Local, "test");
        assert_eq!(qp.tx_buf.len(), 32 - tx_off.min(32));
        assert!(qp.tx_payload.is_some(), "tx_off {tx_off}");
        qp.retire_sq();
        assert!(qp.cq.is_empty(), "the WR waits for its payload");
    }
}

#[test]
fn a_large_payload_mostly_bypasses_the_staging_buffer() {
    let (mut qp, mut peer, region, key) = established();
    let len = 48 << 10;
    let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let mut bytes = Frame::Write {
        psn: 7,
        len: len as u32,
        remote_addr: region.addr(),
        rkey: key,
    }
    .encode()
    .to_vec();
    bytes.extend_from_slice(&payload);
    peer.write_all(&bytes).expect("peer write");
    // The header comes with a bounded staged read (so little of the payload is copied
    // twice), the rest of the payload straight into the region.
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while qp.rcv_nxt != 8 && Instant::now() < deadline {
        qp.read_rx(Instant::now());
        assert!(
            qp.rx_end <= STAGE_READ_MAX,
            "a staged read took {} bytes",
            qp.rx_end
        );
    }
    assert_eq!(qp.rcv_nxt, 8, "the WRITE was not carried out");
    assert!(matches!(qp.rx, RxState::Header));
    let mut got = vec![0u8; len];
    region.read(0, &mut got).expect("read region");
    assert!(got == payload, "payload differs");
    assert_eq!(qp.ctrl.back(), Some(&Frame::Ack { psn: 7 }));
}

/// Reads `n` frames (with their payloads) from the raw peer, waiting at most 10 s.
fn read_frames(peer: &mut TcpStream, n: usize) -> Vec<(Frame, Vec<u8>)> {
    use std::io::Read;
    peer.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    let mut out = Vec::new();
    while out.len() < n {
        let mut h = [0u8; HEADER_LEN];
        peer.read_exact(&mut h).expect("peer read header");
        let f = Frame::decode(&h).expect("frame");
        let len = match f {
            Frame::Send { len, .. } | Frame::Write { len, .. } | Frame::WriteImm { len, .. } => {
                len as usize
            }
            _ => 0,
        };
        let mut payload = vec![0u8; len];
        peer.read_exact(&mut payload).expect("peer read payload");
        out.push((f, payload));
    }
    out
}

fn poll_all(qp: &mut TcpQp) -> Vec<Wc> {
    let mut wcs = Vec::new();
    qp.poll_cq(&mut wcs, 64).expect("poll");
    wcs
}

/// Many WRs posted in one call, small (copied into the out-buffer) and large (gathered
/// from registered memory behind their header), reach the peer intact and in order, and
/// complete only as the peer's (cumulative) ACKs arrive, in posting order.
#[test]
fn a_posted_batch_arrives_in_order_and_completes_only_when_acknowledged() {
    let (mut qp, mut peer, region, lkey) = established();
    qp.doorbell = true;
    let pattern: Vec<u8> = (0..region.len()).map(|i| (i * 7 % 253) as u8).collect();
    region.write(0, &pattern).expect("fill");
    let lens: Vec<u32> = (0..12)
        .map(|i| {
            if i % 4 == 3 {
                20_000 + i * 1000
            } else {
                8 + i * 3
            }
        })
        .collect();
    let wrs: Vec<SendWr> = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let mut wr = send_of(&region, lkey, len);
            wr.wr_id = i as u64;
            wr.sgl[0].addr = region.addr() + (i as u64) * 512;
            wr
        })
        .collect();
    qp.post_send(&wrs).expect("post");
    // The doorbell wrote what fit; polling finishes the rest (no ACK can have come).
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while (qp.tx_payload.is_some() || !qp.tx_buf.is_empty()) && Instant::now() < deadline {
        assert!(poll_all(&mut qp).is_empty(), "a completion before any ACK");
    }
    let got = read_frames(&mut peer, wrs.len());
    for (i, (f, payload)) in got.iter().enumerate() {
        assert_eq!(
            *f,
            Frame::Send {
                psn: 100 + i as u32,
                len: lens[i]
            },
            "frame {i}"
        );
        let at = i * 512;
        assert!(
            payload[..] == pattern[at..at + lens[i] as usize],
            "payload of frame {i} differs"
        );
    }
    assert!(poll_all(&mut qp).is_empty(), "completed without an ACK");
    // A cumulative ACK of the first 5 completes exactly those, in order.
    peer.write_all(&Frame::Ack { psn: 104 }.encode())
        .expect("ack");
    let mut done = Vec::new();
    while done.len() < 5 && Instant::now() < deadline {
        done.extend(poll_all(&mut qp).iter().map(|w| (w.wr_id, w.status)));
    }
    assert_eq!(
        done,
        (0..5).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    assert!(poll_all(&mut qp).is_empty(), "only the acknowledged ones");
    peer.write_all(&Frame::Ack { psn: 111 }.encode())
        .expect("ack");
    while done.len() < 12 && Instant::now() < deadline {
        done.extend(poll_all(&mut qp).iter().map(|w| (w.wr_id, w.status)));
    }
    assert_eq!(
        done,
        (0..12).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
}

/// Inside a batch, the ACK `poll_cq` generates waits for the batch's next `post_send`
/// and leaves in the same write, ahead of the new frame; a batch that posts nothing
/// sends it at `end_batch`. Outside a batch it leaves in the same `poll_cq`.
#[test]
fn a_batch_holds_acks_until_its_send_or_its_end() {
    let (mut qp, mut peer, region, lkey) = established();
    qp.doorbell = true;
    let write = |psn: u32| {
        let mut b = Frame::Write {
            psn,
            len: 4,
            remote_addr: region.addr(),
            rkey: lkey,
        }
        .encode()
        .to_vec();
        b.extend_from_slice(&[1, 2, 3, 4]);
        b
    };
    // 1: held, then sent with the batch's SEND, ACK first.
    qp.begin_batch();
    peer.write_all(&write(7)).expect("peer write");
    carried(&mut qp, 7);
    assert_eq!(
        queued(&qp),
        [Frame::Ack { psn: 7 }],
        "the ACK waits inside the batch"
    );
    qp.post_send(&[send_of(&region, lkey, 8)]).expect("post");
    qp.end_batch();
    let got = read_frames(&mut peer, 2);
    assert_eq!(got[0].0, Frame::Ack { psn: 7 });
    assert_eq!(got[1].0, Frame::Send { psn: 100, len: 8 });
    // 2: a batch that posts nothing sends the ACK at its end.
    qp.begin_batch();
    peer.write_all(&write(8)).expect("peer write");
    carried(&mut qp, 8);
    qp.end_batch();
    assert_eq!(read_frames(&mut peer, 1)[0].0, Frame::Ack { psn: 8 });
    // 3: no batch: the ACK leaves in the poll that generated it.
    peer.write_all(&write(9)).expect("peer write");
    carried(&mut qp, 9);
    assert!(
        qp.ctrl.is_empty() && qp.tx_buf.is_empty(),
        "nothing left queued"
    );
    assert_eq!(read_frames(&mut peer, 1)[0].0, Frame::Ack { psn: 9 });
}

/// A message flagged unsignaled is acknowledged only with the next frame the QP sends
/// anyway: no ACK of its own; the next signaled message's ACK covers it (cumulative); our
/// own data frame carries it (ACK first); our goodbye sends it before the BYE.
#[test]
fn an_unsignaled_message_is_acknowledged_only_with_the_next_frame_sent() {
    let (mut qp, mut peer, region, lkey) = established();
    qp.doorbell = true;
    let write = |psn: u32, unsignaled: bool| {
        let mut b = write_frame(psn, &region, lkey);
        if unsignaled {
            b[29] |= wire::FLAG_UNSIGNALED;
        }
        b
    };
    // 1: two unsignaled WRITEs: nothing queued; a signaled one: one ACK covering all.
    peer.write_all(&write(7, true)).expect("peer write");
    peer.write_all(&write(8, true)).expect("peer write");
    carried(&mut qp, 8);
    assert_eq!(queued(&qp), [], "no ACK of its own");
    assert_eq!(qp.deferred_ack, Some(8));
    peer.write_all(&write(9, false)).expect("peer write");
    carried(&mut qp, 9);
    assert_eq!(read_frames(&mut peer, 1)[0].0, Frame::Ack { psn: 9 });
    assert_eq!(qp.deferred_ack, None);
    // 2: an unsignaled WRITE, then our own SEND: the ACK goes ahead of it, same write.
    peer.write_all(&write(10, true)).expect("peer write");
    carried(&mut qp, 10);
    assert_eq!(queued(&qp), []);
    qp.post_send(&[send_of(&region, lkey, 8)]).expect("post");
    let got = read_frames(&mut peer, 2);
    assert_eq!(got[0].0, Frame::Ack { psn: 10 });
    assert_eq!(got[1].0, Frame::Send { psn: 100, len: 8 });
    // 3: an unsignaled WRITE, then goodbye: ACK, then BYE.
    peer.write_all(&write(11, true)).expect("peer write");
    carried(&mut qp, 11);
    qp.goodbye();
    let got = read_frames(&mut peer, 2);
    assert_eq!(got[0].0, Frame::Ack { psn: 11 });
    assert_eq!(got[1].0, Frame::Bye);
}

/// Polls `qp` until it has carried out message `psn` (its `rcv_nxt` passed it), for at most
/// 10 s; fails the test otherwise.
fn carried(qp: &mut TcpQp, psn: u32) {
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while qp.rcv_nxt != psn.wrapping_add(1) && Instant::now() < deadline {
        poll_all(qp);
    }
    assert_eq!(
        qp.rcv_nxt,
        psn.wrapping_add(1),
        "message {psn} not carried out"
    );
}

/// The frames `qp` has queued and not sent yet: its data and ACK buffer, then its control
/// frames.
fn queued(qp: &TcpQp) -> Vec<Frame> {
    frames_in(&qp.tx_buf[qp.tx_off..])
        .into_iter()
        .chain(qp.ctrl.iter().copied())
        .collect()
}

/// Waits until the QP's socket holds at least `n` unread bytes (the peer's write has
/// arrived), without reading them: an event, not a time.
fn wait_in_socket(qp: &TcpQp, n: usize) {
    let stream = qp.stream.as_ref().expect("established");
    let mut buf = vec![0u8; n];
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match stream.peek(&mut buf) {
            Ok(k) if k >= n => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("peek: {e}"),
        }
        assert!(Instant::now() < deadline, "the peer's bytes never arrived");
        std::thread::yield_now();
    }
}

fn write_frame(psn: u32, region: &Region, lkey: u32) -> Vec<u8> {
    let mut b = Frame::Write {
        psn,
        len: 4,
        remote_addr: region.addr(),
        rkey: lkey,
    }
    .encode()
    .to_vec();
    b.extend_from_slice(&[9; 4]);
    b
}

/// After a read that drained the socket, the next [`io::RX_SKIP_POLLS`] polls (within the
/// window) make no read system call even with bytes waiting, never more in a row: the
/// poll after takes them in. Past the window a poll always reads. (The bytes' arrival is
/// awaited with `peek`, and the reads are counted, so no sleep decides the outcome.)
#[test]
fn a_drained_socket_is_not_read_on_every_poll_but_data_waits_a_bounded_number_of_polls() {
    let (mut qp, mut peer, region, lkey) = established();
    let now = Instant::now();
    qp.poll_rx(now); // EAGAIN: drained
    assert_eq!(qp.rx_drained_at, Some(now));
    let b = write_frame(7, &region, lkey);
    peer.write_all(&b).expect("peer write");
    wait_in_socket(&qp, b.len());
    let reads = qp.rx_syscalls;
    for k in 0..io::RX_SKIP_POLLS {
        qp.poll_rx(now); // within the window: skipped
        assert_eq!(qp.rcv_nxt, 7, "skipped poll {k} took nothing in");
    }
    assert_eq!(qp.rx_syscalls, reads, "a skipped poll made a read call");
    qp.poll_rx(now); // never more skips in a row
    assert_eq!(qp.rcv_nxt, 8, "the next poll took the message in");
    assert!(qp.rx_syscalls > reads);
    // Past the window a poll always reads.
    let b = write_frame(8, &region, lkey);
    peer.write_all(&b).expect("peer write");
    wait_in_socket(&qp, b.len());
    let t = qp.rx_drained_at.expect("drained");
    let reads = qp.rx_syscalls;
    qp.poll_rx(t + io::RX_SKIP_WINDOW);
    assert_eq!(qp.rcv_nxt, 9, "a poll after the window reads");
    assert!(qp.rx_syscalls > reads);
}

/// The NIC thread's service gives way to an owner waiting for the state before any socket
/// call (`preempt`), leaving everything for the owner; without it, it does what a poll
/// does, minus handing out completions.
#[test]
fn service_gives_way_to_a_waiting_owner_before_any_socket_call() {
    let (mut qp, mut peer, region, lkey) = established();
    let b = write_frame(7, &region, lkey);
    peer.write_all(&b).expect("peer write");
    wait_in_socket(&qp, b.len());
    qp.post_send(&[send_of(&region, lkey, 8)]).expect("post"); // no doorbell: queued
    qp.preempt.store(true, Ordering::Relaxed);
    let reads = qp.rx_syscalls;
    qp.service(Instant::now());
    assert_eq!(qp.rx_syscalls, reads, "read while the owner waited");
    assert_eq!(
        qp.rcv_nxt, 7,
        "carried a message out while the owner waited"
    );
    assert_eq!(qp.snd_nxt, 100, "staged a message while the owner waited");
    assert!(!qp.servicing);
    qp.preempt.store(false, Ordering::Relaxed);
    qp.service(Instant::now());
    assert_eq!(qp.rcv_nxt, 8, "the service carries the WRITE out");
    assert_eq!(qp.snd_nxt, 101, "and sends the queued SEND");
    let got = read_frames(&mut peer, 2);
    assert_eq!(got[0].0, Frame::Send { psn: 100, len: 8 });
    assert_eq!(got[1].0, Frame::Ack { psn: 7 });
    assert!(
        qp.cq.is_empty(),
        "nothing completed yet (no ACK from the peer)"
    );
}

/// Polls `qp` until it has taken in its `naks`th RNR NAK and staged and written message
/// `psn` again (its `snd_nxt` passed it and nothing is left to write), for at most 10 s.
fn resent(qp: &mut TcpQp, psn: u32, naks: u64) {
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while (qp.counters().rnr_naks_received != naks
        || qp.snd_nxt != psn.wrapping_add(1)
        || !qp.tx_buf.is_empty())
        && Instant::now() < deadline
    {
        assert!(poll_all(qp).is_empty(), "a completion before any ACK");
    }
    assert_eq!(
        qp.counters().rnr_naks_received,
        naks,
        "RNR NAK not taken in"
    );
    assert_eq!(qp.snd_nxt, psn.wrapping_add(1), "message {psn} not resent");
    assert!(qp.tx_buf.is_empty(), "message {psn} not written");
}

/// An inline SEND is copied at its post: its source, overwritten and then deregistered
/// right after `post_send` returned, is never read again. The first transmission and both
/// retransmissions after RNR NAKs (the responder had no receive WR posted, then it had one)
/// carry the bytes of the post, and the WR completes `Success` on the ACK.
#[test]
fn an_inline_send_that_meets_rnr_naks_is_resent_from_its_copy() {
    let (mut qp, mut peer, region, lkey) = established();
    qp.cfg.max_inline_data = 256;
    assert_eq!(qp.max_inline_data(), 256);
    let original: Vec<u8> = (0..200).map(|i| (i * 7 % 251) as u8).collect();
    region.write(0, &original).expect("fill");
    let mut wr = send_of(&region, lkey, 200);
    wr.inline = true;
    qp.post_send(&[wr]).expect("post");
    region.write(0, &[0xee; 200]).expect("overwrite");
    let first = read_frames_after_poll(&mut qp, &mut peer);
    assert_eq!(first.0, Frame::Send { psn: 100, len: 200 });
    assert!(
        first.1 == original,
        "first transmission: not the posted bytes"
    );
    // No receive WR at the responder: RNR NAK, the QP resends after the timer (0.01 ms).
    peer.write_all(&Frame::RnrNak { psn: 100, timer: 1 }.encode())
        .expect("rnr nak");
    resent(&mut qp, 100, 1);
    let again = read_frames(&mut peer, 1).remove(0);
    assert_eq!(again.0, Frame::Send { psn: 100, len: 200 });
    assert!(again.1 == original, "retransmission: not the posted bytes");
    // Deregistered meanwhile: still resent from the copy, no `LocalProtection`.
    qp.registry.remove(lkey);
    peer.write_all(&Frame::RnrNak { psn: 100, timer: 1 }.encode())
        .expect("rnr nak");
    resent(&mut qp, 100, 2);
    let last = read_frames(&mut peer, 1).remove(0);
    assert_eq!(last.0, Frame::Send { psn: 100, len: 200 });
    assert!(
        last.1 == original,
        "second retransmission: not the posted bytes"
    );
    // A receive WR was posted at last: the responder acknowledges.
    peer.write_all(&Frame::Ack { psn: 100 }.encode())
        .expect("ack");
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    let mut done = Vec::new();
    while done.is_empty() && Instant::now() < deadline {
        done = poll_all(&mut qp);
    }
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!((done[0].wr_id, done[0].status), (1, WcStatus::Success));
}

/// The first frame `qp` writes (its doorbell is off: the first poll stages it).
fn read_frames_after_poll(qp: &mut TcpQp, peer: &mut TcpStream) -> (Frame, Vec<u8>) {
    assert!(poll_all(qp).is_empty());
    read_frames(peer, 1).remove(0)
}

/// An inline WR longer than `max_inline_data` refuses the whole post, the WRs before it
/// included (nothing queued); an inline WR whose SGE lies outside registered memory is
/// accepted and fails `LocalProtection` in its turn, as a WR read at staging does.
#[test]
fn an_inline_post_is_checked_at_the_post() {
    let (mut qp, mut peer, region, lkey) = established();
    qp.cfg.max_inline_data = 1 << 20;
    assert_eq!(qp.max_inline_data(), 16 << 10, "capped at INLINE_MAX");
    qp.cfg.max_inline_data = 64;
    let mut long = send_of(&region, lkey, 65);
    long.inline = true;
    let e = qp
        .post_send(&[send_of(&region, lkey, 8), long])
        .expect_err("an inline WR over max_inline_data");
    assert!(
        matches!(&e, TransportError::Resource(m) if m.contains("65 bytes") && m.contains("max_inline_data 64")),
        "{e}"
    );
    assert!(qp.sq.is_empty(), "nothing of the refused post queued");
    let mut bad = send_of(&region, lkey.wrapping_add(1), 8);
    bad.inline = true;
    bad.wr_id = 2;
    qp.post_send(&[bad]).expect("accepted");
    assert_eq!(qp.sq[0].status, Some(WcStatus::LocalProtection));
    let wcs = poll_all(&mut qp);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (2, WcStatus::LocalProtection)
    );
    peer.set_nonblocking(true).expect("nonblocking");
    let mut buf = [0u8; 64];
    assert!(
        matches!(std::io::Read::read(&mut peer, &mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "nothing sent"
    );
}
