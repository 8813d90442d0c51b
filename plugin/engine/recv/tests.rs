//! Unit tests of the receive engine (`super`), fed by hand.

use super::*;
use crate::engine::wire::Keys;

fn params() -> RecvParams {
    RecvParams {
        qps: 1,
        split: false,
        rq_depth: 4,
        rq_min: 4,
        shrink_after_ns: u64::MAX,
        rq_batch: 2,
        rq_low_water: 2,
        eager_buf_size: 64,
        bounce: (0x10_0000, 1),
        rec_ring: 0x20_0000,
        ctrl_stage: (0x30_0000, 2),
        peer_cts_ring: (0x40_0000, 3),
        peer_credit_word: (0x50_0000, 4),
        inline_max: 0,
        credits: true,
        first_seq: 0,
        rkeys: 1,
    }
}

fn buf(tag: i32) -> RecvBuf {
    RecvBuf {
        addr: 0x6000_0000,
        cap: 64,
        rkeys: Keys::one(9),
        tag,
    }
}

#[test]
fn a_receive_without_data_is_reported_once_naming_what_is_missing() {
    let mut e = RecvEngine::new(params());
    e.irecv(0, &[buf(1)]).unwrap().unwrap();
    e.irecv(5, &[buf(1), buf(2), buf(3)]).unwrap().unwrap();
    assert!(e.stalls(50, 100).is_empty());
    let s = e.stalls(200, 100);
    assert_eq!(s.len(), 2, "{s:?}");
    let one = s.iter().find(|x| x.what == "receive 0 (1 buffer)").unwrap();
    assert!(one
        .waiting_for
        .starts_with("data from the sender: 0 of 1 buffers filled"));
    let three = s
        .iter()
        .find(|x| x.what == "receive 1 (3 buffers)")
        .unwrap();
    assert_eq!(three.idle_ns, 195);
    assert!(e.stalls(100_000, 100).is_empty(), "reported once");
}

/// The control WRITEs `e` queued since the last call: (wr_id, signaled). The wake word reads
/// 0 ([`wire::WAKE_PUSH`]): published entries are pushed.
fn ctrl_writes(e: &mut RecvEngine) -> Vec<(u64, bool)> {
    e.after_execute(&Blank);
    e.drain_actions()
        .into_iter()
        .filter_map(|a| match a {
            Action::PostSend(w) => Some((w.wr_id, w.signaled)),
            _ => None,
        })
        .collect()
}

fn wc(wr_id: u64, status: WcStatus) -> Wc {
    Wc {
        wr_id,
        status,
        opcode: WcOpcode::RdmaWrite,
        byte_len: 0,
        imm: None,
    }
}

/// Memory nobody wrote: zeros (no small send landed, no record).
struct Blank;
impl MemRead for Blank {
    fn read(&self, _: u64, out: &mut [u8]) -> bool {
        out.fill(0);
        true
    }
}

#[test]
fn one_cts_write_in_sixteen_is_signaled_and_its_completion_frees_the_slots_before_it() {
    let mut e = RecvEngine::new(params());
    e.drain_actions();
    let mut writes = Vec::new();
    for _ in 0..MAX_RECV_REQUESTS {
        e.irecv(0, &[buf(1)]).unwrap().unwrap();
        writes.extend(ctrl_writes(&mut e));
    }
    assert_eq!(writes.len(), MAX_RECV_REQUESTS, "one CTS per irecv");
    let signaled: Vec<usize> = (0..writes.len()).filter(|&i| writes[i].1).collect();
    assert_eq!(signaled, [15, 31], "the 16th and the 32nd");
    assert_eq!(e.ctrl_outstanding(), 32);
    // The 16th's completion frees the 16 slots up to it; a stale repeat frees nothing more.
    e.handle_wc(1, &wc(writes[15].0, WcStatus::Success), &Blank);
    assert_eq!(e.ctrl_outstanding(), 16);
    e.handle_wc(1, &wc(writes[15].0, WcStatus::Success), &Blank);
    assert_eq!(e.ctrl_outstanding(), 16);
    assert!(e.failure().is_none());
    // An unsignaled write that fails still completes (with its error) and fails the comm.
    e.handle_wc(2, &wc(writes[20].0, WcStatus::RemoteAccess), &Blank);
    let f = e.failure().expect("the comm failed").to_string();
    assert!(
        f.contains("clear-to-send RDMA WRITE completed with IBV_WC_REM_ACCESS_ERR"),
        "{f}"
    );
}

/// The CTS WRITEs `e` queued since the last call: (bytes, posted inline).
fn cts_inline(e: &mut RecvEngine) -> Vec<(u64, bool)> {
    e.after_execute(&Blank);
    e.drain_actions()
        .into_iter()
        .filter_map(|a| match a {
            Action::PostSend(w) if matches!(wr_parse(w.wr_id), Some((WrKind::Cts, ..))) => {
                Some((w.byte_len(), w.inline))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_cts_entry_goes_inline_only_when_it_fits_what_qp_0_granted() {
    // Granted one compact entry: a one-buffer receive's 64-byte entry is inline, a grouped
    // receive's 256-byte one is read from its staging slot.
    let mut e = RecvEngine::new(RecvParams {
        inline_max: wire::CTS_COMPACT_LEN as u64,
        ..params()
    });
    e.drain_actions();
    e.irecv(0, &[buf(1)]).unwrap().unwrap();
    assert_eq!(cts_inline(&mut e), [(64, true)]);
    e.irecv(0, &[buf(1), buf(2), buf(3)]).unwrap().unwrap();
    assert_eq!(cts_inline(&mut e), [(256, false)]);
    // Granted less than an entry (or none: `VERBSNET_INLINE_SIZE=0`): never inline.
    for inline_max in [0, 63] {
        let mut e = RecvEngine::new(RecvParams {
            inline_max,
            ..params()
        });
        e.drain_actions();
        e.irecv(0, &[buf(1)]).unwrap().unwrap();
        assert_eq!(cts_inline(&mut e), [(64, false)], "inline_max {inline_max}");
    }
}

#[test]
fn with_every_control_slot_in_flight_irecv_waits_and_the_newest_write_is_signaled() {
    let mut e = RecvEngine::new(params());
    e.drain_actions();
    let mut last = (0, false);
    // 64 control WRITEs in flight: receives completed by hand (test) to free request slots.
    for i in 0..CTRL_STAGE_SLOTS {
        let id = e.irecv(0, &[buf(1)]).unwrap().unwrap();
        last = *ctrl_writes(&mut e).last().unwrap();
        if i + 1 < CTRL_STAGE_SLOTS {
            let r = e.reqs.get_mut(id).unwrap();
            r.arrived = r.n;
            e.test(id).unwrap().unwrap();
        }
    }
    assert!(last.1, "the 64th control WRITE is signaled");
    assert_eq!(
        e.irecv(0, &[buf(1)]),
        Ok(None),
        "all staging slots in flight"
    );
    e.handle_wc(1, &wc(last.0, WcStatus::Success), &Blank);
    assert_eq!(e.ctrl_outstanding(), 0);
    assert!(e.irecv(0, &[buf(1)]).unwrap().is_some());
}

/// A WRITE_WITH_IMM arrival for buffer `i` of receive `r` on a zero-length receive WR.
fn arrival(r: u64, i: usize, record: bool, byte_len: u32) -> Wc {
    Wc {
        wr_id: super::super::wr_id(WrKind::Zero, 0, 0),
        status: WcStatus::Success,
        opcode: WcOpcode::RecvRdmaWithImm,
        byte_len,
        imm: Some(wire::imm_encode(r, i, record, false)),
    }
}

/// A WRITE_WITH_IMM arrival on data QP `qp` for buffer `i` of receive `r`.
fn on_qp(qp: u32, r: u64, i: usize, byte_len: u32) -> Wc {
    Wc {
        wr_id: super::super::wr_id(WrKind::DataZero, 0, qp),
        ..arrival(r, i, false, byte_len)
    }
}

fn mqp(qps: u8, split: bool) -> RecvEngine {
    RecvEngine::new(RecvParams {
        qps,
        split,
        ..params()
    })
}

#[test]
fn with_several_qps_a_buffer_completes_once_every_qp_it_uses_reported() {
    // Split over 4 QPs: every buffer expects one arrival per QP, data QPs' maybe first.
    let mut e = mqp(4, true);
    let a = e.irecv(0, &[buf(1), buf(1)]).unwrap().unwrap();
    // Two buffers need 2 WRs on each data QP: a batch of 8 on each, before the CTS.
    let acts = e.drain_actions();
    let posts: Vec<(u8, usize)> = acts
        .iter()
        .filter_map(|a| match a {
            Action::PostRecvQp { qp, wrs } => Some((*qp, wrs.len())),
            _ => None,
        })
        .collect();
    assert_eq!(posts, [(1, 8), (2, 8), (3, 8)]);
    assert!(
        matches!(acts.last(), Some(Action::PostSend(_))),
        "the CTS goes last"
    );
    assert_eq!(e.stats().data_qp_zero_wrs, 24);
    // Buffer 1's piece on QP 3 comes first; then buffer 0 on QP 0 (send order there).
    e.handle_wc(1, &on_qp(3, 0, 1, 0), &Blank);
    e.handle_wc(1, &arrival(0, 0, false, 40), &Blank);
    for q in 1..4 {
        e.handle_wc(1, &on_qp(q, 0, 0, if q == 1 { 24 } else { 0 }), &Blank);
    }
    assert!(e.failure().is_none(), "{:?}", e.failure());
    assert_eq!(e.test(a), Ok(None), "buffer 1 has 1 of its 4 arrivals");
    e.handle_wc(1, &arrival(0, 1, false, 7), &Blank);
    e.handle_wc(1, &on_qp(1, 0, 1, 0), &Blank);
    assert_eq!(e.test(a), Ok(None), "QP 2 has not reported buffer 1");
    e.handle_wc(1, &on_qp(2, 0, 1, 0), &Blank);
    assert_eq!(e.test(a), Ok(Some(Sizes::of(&[64, 7]))));
    assert_eq!(e.stats().rendezvous, 2);

    // Round robin over 3 QPs: buffer g on QP g % 3 (and QP 0); buffer 0 needs QP 0 alone.
    let mut e = mqp(3, false);
    let a = e.irecv(0, &[buf(1), buf(1), buf(1)]).unwrap().unwrap();
    assert_eq!(e.stats().data_qp_zero_wrs, 16, "a batch on QPs 1 and 2");
    e.handle_wc(1, &on_qp(2, 0, 2, 50), &Blank);
    e.handle_wc(1, &arrival(0, 0, false, 3), &Blank);
    e.handle_wc(1, &arrival(0, 1, false, 0), &Blank);
    e.handle_wc(1, &arrival(0, 2, false, 0), &Blank);
    assert_eq!(e.test(a), Ok(None), "buffer 1's payload is still on QP 1");
    e.handle_wc(1, &on_qp(1, 0, 1, 9), &Blank);
    assert_eq!(e.test(a), Ok(Some(Sizes::of(&[3, 9, 50]))));
}

#[test]
fn with_several_qps_qp_0_stays_strict_and_a_hostile_data_qp_arrival_fails_the_comm() {
    // QP 0 arrivals come in send order with any number of QPs: the strict check stays.
    let mut e = mqp(4, false);
    e.irecv(0, &[buf(1), buf(1)]).unwrap().unwrap();
    e.handle_wc(1, &arrival(0, 1, false, 8), &Blank);
    let f = e.failure().expect("strict on QP 0").to_string();
    assert!(f.contains("for send 0 names no unmatched buffer"), "{f}");

    // (what, split, data-QP and QP 0 arrivals before, the hostile one, the message)
    type Case = (&'static str, bool, Vec<Wc>, Wc, &'static str);
    let cases: [Case; 8] = [
        (
            "complete",
            true,
            vec![
                arrival(0, 0, false, 1),
                on_qp(1, 0, 0, 0),
                on_qp(2, 0, 0, 0),
                on_qp(3, 0, 0, 0),
            ],
            on_qp(2, 0, 0, 0),
            "a WRITE WITH IMM on data QP 2 (imm 0x0: receive 0 mod 2^27, buffer 0) names a \
             buffer already complete",
        ),
        (
            "twice",
            true,
            vec![on_qp(3, 0, 1, 0)],
            on_qp(3, 0, 1, 0),
            "on data QP 3 (imm 0x1: receive 0 mod 2^27, buffer 1) names a buffer that had its \
             arrival on this QP already",
        ),
        (
            "range",
            true,
            vec![],
            on_qp(1, 0, 2, 0),
            "buffer 2) names a buffer beyond the receive's",
        ),
        (
            "not posted",
            true,
            vec![],
            on_qp(1, 5, 0, 0),
            "receive 5 mod 2^27, buffer 0) names no posted receive",
        ),
        (
            "wrong QP",
            false,
            vec![],
            on_qp(2, 0, 1, 0),
            "names a buffer whose send does not use this QP",
        ),
        (
            "record",
            true,
            vec![],
            Wc {
                wr_id: super::super::wr_id(WrKind::DataZero, 0, 1),
                ..arrival(0, 0, true, 8)
            },
            "names a record (records go on QP 0 only)",
        ),
        (
            "SEND",
            true,
            vec![],
            Wc {
                opcode: WcOpcode::Recv,
                imm: None,
                ..on_qp(1, 0, 0, 0)
            },
            "a Recv completion without an immediate consumed a receive WR of data QP 1",
        ),
        (
            "too big",
            true,
            vec![arrival(0, 0, false, 60)],
            on_qp(1, 0, 0, 5),
            "the peer wrote 65 bytes into a receive buffer of 64 bytes (receive 0, buffer 0; \
             the last write on QP 1)",
        ),
    ];
    for (what, split, before, hostile, want) in cases {
        let mut e = mqp(4, split);
        let id = e.irecv(0, &[buf(1), buf(1)]).unwrap().unwrap();
        for wc in &before {
            e.handle_wc(1, wc, &Blank);
        }
        assert!(e.failure().is_none(), "{what}: {:?}", e.failure());
        e.handle_wc(1, &hostile, &Blank);
        match e.failure() {
            Some(ReqError::Protocol(m)) => assert!(m.contains(want), "{what}: {m}"),
            other => panic!("{what}: {other:?}"),
        }
        assert!(e.test(id).is_err(), "{what}");
    }
}

#[test]
fn a_receive_stalled_on_a_data_qp_names_the_buffer_and_the_qps_still_missing() {
    // Split over 3 QPs: buffer 0 got its QP 0 and QP 2 arrivals, not QP 1's; buffer 1 nothing.
    let mut e = mqp(3, true);
    e.irecv(0, &[buf(1), buf(1)]).unwrap().unwrap();
    e.handle_wc(1, &arrival(0, 0, false, 40), &Blank);
    e.handle_wc(1, &on_qp(2, 0, 0, 0), &Blank);
    assert!(e.failure().is_none(), "{:?}", e.failure());
    let s = e.stalls(1_000, 100);
    assert_eq!(s.len(), 1);
    assert!(
        s[0].waiting_for.contains("0 of 2 buffers filled")
            && s[0].waiting_for.contains("on buffer 0: QP 1 ("),
        "{}",
        s[0].waiting_for
    );
    // Round robin over 2 QPs: buffer 1 (QP 1) got its data-QP arrival, its QP 0 one is missing.
    let mut e = mqp(2, false);
    e.irecv(0, &[buf(1), buf(1)]).unwrap().unwrap();
    e.handle_wc(1, &on_qp(1, 0, 1, 64), &Blank);
    let s = e.stalls(1_000, 100);
    assert!(
        s[0].waiting_for.contains("on buffer 1: QP 0 ("),
        "{}",
        s[0].waiting_for
    );
    // One QP: the wording of before.
    let mut e = mqp(1, false);
    e.irecv(0, &[buf(1)]).unwrap().unwrap();
    let s = e.stalls(1_000, 100);
    assert!(
        s[0].waiting_for.contains("has not issued"),
        "{}",
        s[0].waiting_for
    );
}

/// The record region as the sender's small sends leave it: trailers at given slots, zeros
/// elsewhere.
struct Ring(Vec<(u64, [u8; wire::SMALL_TRAILER_LEN])>);
impl MemRead for Ring {
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        for (i, o) in out.iter_mut().enumerate() {
            let a = addr + i as u64;
            *o = self
                .0
                .iter()
                .find(|(at, t)| a >= *at && a < at + t.len() as u64)
                .map_or(0, |(at, t)| t[(a - at) as usize]);
        }
        true
    }
}

/// The trailer of a small send of `size` bytes (send `s`) into receive `r`, where it lands.
fn landed(r: u64, size: u32, s: u32) -> (u64, [u8; wire::SMALL_TRAILER_LEN]) {
    let at = params().rec_ring + wire::small_slot(r) + wire::SMALL_MAX;
    (at, SmallTrailer { size, s_low: s }.encode(r))
}

#[test]
fn small_sends_are_taken_in_send_order_and_copied_out_once() {
    let mut e = RecvEngine::new(params());
    let a = e.irecv(0, &[buf(1)]).unwrap().unwrap();
    let b = e.irecv(0, &[buf(1)]).unwrap().unwrap();
    e.drain_actions();
    // Send 1's trailer alone: it waits for send 0 (still in the CQ, say).
    assert!(!e.poll_small(1, &Ring(vec![landed(1, 8, 1)])));
    assert_eq!(e.test(b).unwrap(), None);
    // A trailer naming another lap's receive is not taken either.
    assert!(!e.poll_small(1, &Ring(vec![landed(32, 8, 0)])));
    // Both landed: taken in order.
    assert!(e.poll_small(2, &Ring(vec![landed(0, 0, 0), landed(1, 8, 1)])));
    let acts = e.drain_actions();
    let slot1 = params().rec_ring + wire::small_slot(1);
    assert!(acts.iter().any(|x| matches!(x,
        Action::Copy { src, req, buf: 0, len: 8 } if *src == slot1 + wire::SMALL_MAX - 8 && *req == b)));
    // Nothing to copy for the empty one; the trailers stay (they name their receive only).
    assert_eq!(acts.len(), 1, "{acts:?}");
    // Polled again, the same trailers are not taken twice: their receives are matched.
    assert!(!e.poll_small(3, &Ring(vec![landed(0, 0, 0), landed(1, 8, 1)])));
    assert_eq!(e.test(a).unwrap().map(|s| s.to_vec()), Some(vec![0]));
    assert_eq!(e.test(b).unwrap().map(|s| s.to_vec()), Some(vec![8]));
    assert_eq!(e.stats().small_sends, 2);
}

#[test]
fn a_small_send_too_big_for_its_buffer_or_the_slot_fails_the_comm() {
    for (size, want) in [(65u32, "receive buffer of 64 bytes"), (113, "at most 112")] {
        let mut e = RecvEngine::new(params());
        let a = e.irecv(0, &[buf(1)]).unwrap().unwrap();
        e.poll_small(1, &Ring(vec![landed(0, size, 0)]));
        let f = e.failure().expect("failed").to_string();
        assert!(f.contains(want), "{size}: {f}");
        assert!(e.test(a).is_err());
    }
}

/// A trailer being written while the receiver reads it: the size word lands before the
/// sequence word. A reader that took the size word first could see the slot's old zeros and
/// the new sequence word, and report a send of 0 bytes.
struct Landing {
    at: u64,
    new: [u8; wire::SMALL_TRAILER_LEN],
    seq_seen: std::cell::Cell<bool>,
}
impl MemRead for Landing {
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        for (i, o) in out.iter_mut().enumerate() {
            let a = addr + i as u64;
            *o = match a.checked_sub(self.at) {
                // The size word: landed once the sequence word was seen (it was written
                // first), old zeros before.
                Some(d @ 0..=7) if self.seq_seen.get() => self.new[d as usize],
                Some(0..=7) => 0,
                Some(d @ 8..=15) => {
                    self.seq_seen.set(true);
                    self.new[d as usize]
                }
                _ => 0,
            };
        }
        true
    }
}

#[test]
fn a_small_send_is_read_sequence_word_first() {
    let mut e = RecvEngine::new(params());
    let a = e.irecv(0, &[buf(1)]).unwrap().unwrap();
    let (at, new) = landed(0, 8, 0);
    let mem = Landing {
        at,
        new,
        seq_seen: std::cell::Cell::new(false),
    };
    assert!(e.poll_small(1, &mem));
    assert_eq!(e.test(a).unwrap().map(|s| s.to_vec()), Some(vec![8]));
}

#[test]
fn fail_all_fails_a_receive_that_is_complete_but_untested() {
    let mut e = RecvEngine::new(params());
    let a = e.irecv(0, &[buf(1)]).unwrap().unwrap();
    let b = e.irecv(0, &[buf(1)]).unwrap().unwrap();
    assert!(e.poll_small(1, &Ring(vec![landed(0, 8, 0)])));
    assert!(e.complete(a));
    // Its copy was queued; the executor failed before it ran.
    e.fail_all(ReqError::Local("post_send failed".into()));
    for id in [a, b] {
        let err = e.test(id).unwrap_err().to_string();
        assert!(err.contains("post_send failed"), "{err}");
    }
}

/// Memory where only the wake word (at `rec_ring + WAKE_AT`) holds `wake`.
struct Wake(u64);
impl MemRead for Wake {
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        out.fill(0);
        if addr == params().rec_ring + wire::WAKE_AT as u64 && out.len() == 8 {
            out.copy_from_slice(&self.0.to_le_bytes());
        }
        true
    }
}

#[test]
fn a_compact_entry_is_stored_in_the_mirror_head_last_and_pushed_only_while_the_sender_asks() {
    let mut e = RecvEngine::new(params());
    e.drain_actions();
    // Pulled: the entry is in the mirror, nothing is written to the sender, and no control
    // staging slot is held, so receives go on past CTRL_STAGE_SLOTS without a completion.
    for k in 0..(CTRL_STAGE_SLOTS as u64 + 8) {
        let id = e
            .irecv(0, &[buf(1)])
            .unwrap()
            .expect("never short of staging slots");
        assert!(e.has_published());
        let stages: Vec<(u64, Vec<u8>)> = e
            .drain_actions()
            .into_iter()
            .filter_map(|a| match a {
                Action::Stage { addr, bytes } => Some((addr, bytes.to_vec())),
                Action::PostSend(w) => {
                    panic!("receive {k}: a WR before the wake word was read: {w:?}")
                }
                _ => None,
            })
            .collect();
        let at = params().rec_ring + wire::mirror_slot(k);
        assert_eq!(
            stages
                .iter()
                .map(|(a, b)| (*a, b.len()))
                .collect::<Vec<_>>(),
            [(at + 8, 56), (at, 8)],
            "receive {k}: the body and tail, then the head word"
        );
        let mut entry = [0u8; wire::CTS_ENTRY_LEN];
        entry[..8].copy_from_slice(&stages[1].1);
        entry[8..64].copy_from_slice(&stages[0].1);
        let got = CtsEntry::decode(&entry, k).unwrap().expect("a whole entry");
        assert_eq!((got.r, got.n, got.bufs[0].tag), (k, 1, 1));
        assert!(
            !e.after_execute(&Wake(wire::WAKE_PULL)),
            "nothing to execute"
        );
        assert!(!e.has_published());
        assert!(e.drain_actions().is_empty());
        let r = e.reqs.get_mut(id).unwrap();
        r.arrived = r.n;
        e.test(id).unwrap().unwrap();
    }
    assert_eq!(e.ctrl_outstanding(), 0);
    assert_eq!(
        (e.stats().cts, e.stats().cts_pulled),
        (0, CTRL_STAGE_SLOTS as u64 + 8)
    );
    // Pushed: the same entry goes to the sender's CTS ring slot (stride 256).
    e.irecv(0, &[buf(7)]).unwrap().unwrap();
    e.drain_actions();
    assert!(e.after_execute(&Wake(wire::WAKE_PUSH)));
    let writes: Vec<SendWr> = e
        .drain_actions()
        .into_iter()
        .filter_map(|a| match a {
            Action::PostSend(w) => Some(w),
            _ => None,
        })
        .collect();
    let r = CTRL_STAGE_SLOTS as u64 + 8;
    assert_eq!(writes.len(), 1);
    assert_eq!(
        writes[0].opcode,
        SendOpcode::RdmaWrite {
            remote_addr: params().peer_cts_ring.0 + (r % CTS_RING_ENTRIES as u64) * 256,
            rkey: params().peer_cts_ring.1
        }
    );
    assert_eq!(writes[0].byte_len(), 64);
    assert_eq!(e.stats().cts, 1);
    // A grouped receive's entry is not mirrored: it is written at once, whatever the word.
    e.irecv(0, &[buf(1), buf(2)]).unwrap().unwrap();
    assert!(!e.has_published());
    assert_eq!(
        e.drain_actions()
            .iter()
            .filter(|a| matches!(a, Action::PostSend(_)))
            .count(),
        1
    );
}

#[test]
fn a_wake_word_that_is_neither_push_nor_pull_fails_the_comm() {
    let mut e = RecvEngine::new(params());
    e.irecv(0, &[buf(1)]).unwrap().unwrap();
    assert!(!e.after_execute(&Wake(0xdead)));
    let f = e.failure().expect("failed").to_string();
    assert!(f.contains("wake word"), "{f}");
}

#[test]
fn an_entry_published_and_not_decided_on_holds_a_staging_slot_in_reserve() {
    let mut e = RecvEngine::new(params());
    e.drain_actions();
    // CTRL_STAGE_SLOTS - 1 pushed entries in flight (receives completed by hand).
    for _ in 0..CTRL_STAGE_SLOTS - 1 {
        let id = e.irecv(0, &[buf(1)]).unwrap().unwrap();
        assert!(e.after_execute(&Wake(wire::WAKE_PUSH)));
        let r = e.reqs.get_mut(id).unwrap();
        r.arrived = r.n;
        e.test(id).unwrap().unwrap();
    }
    assert_eq!(e.ctrl_outstanding() as usize, CTRL_STAGE_SLOTS - 1);
    // One more is published: it holds the last slot until `after_execute`, so a further
    // irecv waits, and the push then finds its slot.
    e.irecv(0, &[buf(1)]).unwrap().unwrap();
    assert!(e.has_published() && e.has_actions());
    assert_eq!(e.irecv(0, &[buf(1)]), Ok(None));
    assert!(e.after_execute(&Wake(wire::WAKE_PUSH)));
    assert_eq!(e.ctrl_outstanding() as usize, CTRL_STAGE_SLOTS);
    assert_eq!(e.stats().cts, CTRL_STAGE_SLOTS as u64);
}
