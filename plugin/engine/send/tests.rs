//! Unit tests of the send engine (`super`), fed by hand.

use super::*;
use crate::engine::wire::{CTS_ENTRY_LEN, MAX_RECVS, SMALL_SLOT_LEN};

fn params(credits: bool, initial: u64) -> SendParams {
    SendParams {
        qps: 1,
        split: false,
        eager_limit: 64,
        inline_max: 0,
        credits,
        initial_credits: initial,
        hdr_stage: (0x10_0000, 1),
        rec_stage: (0x20_0000, 2),
        peer_rec_ring: (0x30_0000, 3),
        cts_ring: 0x50_0000,
        credit_word: 0x60_0000,
        landing: (0x70_0000, 7),
        cts_pull: false,
        first_seq: 0,
        first_gen: 0,
        rkeys: 1,
    }
}

fn cts(r: u64, base: u64, credits: u64, bufs: &[(u64, i32)]) -> CtsEntry {
    let mut b = [CtsBuf::default(); MAX_RECVS];
    for (i, &(cap, tag)) in bufs.iter().enumerate() {
        b[i] = CtsBuf {
            addr: 0x4000_0000 + i as u64 * 0x1000,
            cap,
            rkeys: Keys::one(77),
            tag,
        };
    }
    CtsEntry {
        r,
        credits,
        base,
        n: bufs.len() as u32,
        zeros: 0,
        bufs: b,
    }
}

#[test]
fn credit_gating_refuses_at_zero_and_resumes_on_credit() {
    let mut e = SendEngine::new(params(true, 2));
    assert!(e.isend(0, 0x1000, Keys::one(5), 8, 0).unwrap().is_some());
    assert!(e.isend(0, 0x1000, Keys::one(5), 8, 0).unwrap().is_some());
    assert_eq!(e.isend(0, 0x1000, Keys::one(5), 8, 0).unwrap(), None);
    assert_eq!(e.stats().credit_stalls, 1);
    e.handle_credit(wire::credit_word(3, 0));
    assert!(e.isend(0, 0x1000, Keys::one(5), 8, 0).unwrap().is_some());
    assert_eq!(e.credits_available(), 0);
}

#[test]
fn credits_off_never_refuses_for_credit() {
    let mut e = SendEngine::new(params(false, 0));
    for _ in 0..10 {
        assert!(e.isend(0, 0x1000, Keys::one(5), 8, 0).unwrap().is_some());
    }
    assert_eq!(e.stats().credit_stalls, 0);
}

#[test]
fn a_send_whose_cts_is_known_is_one_write_with_imm_into_its_buffer() {
    let mut e = SendEngine::new(params(true, 8));
    assert_eq!(e.isend(0, 0x1000, Keys::one(5), 1000, 9).unwrap(), None);
    assert_eq!(e.stats().cts_waits, 1);
    e.handle_cts(1, cts(0, 0, 8, &[(4096, 9), (64, 9)]))
        .unwrap();
    for (k, size) in [1000u64, 0].into_iter().enumerate() {
        let id = e.isend(2, 0x1000, Keys::one(5), size, 9).unwrap().unwrap();
        let acts = e.drain_actions();
        assert_eq!(acts.len(), 1, "{acts:?}");
        match &acts[0] {
            Action::PostSend(wr) => {
                assert_eq!(
                    wr.opcode,
                    SendOpcode::RdmaWriteWithImm {
                        remote_addr: 0x4000_0000 + k as u64 * 0x1000,
                        rkey: 77,
                        imm: wire::imm_encode(0, k, false, false)
                    }
                );
                assert_eq!(wr.byte_len(), size);
                assert_eq!(wr.num_sge, u8::from(size > 0));
                assert!(wr.signaled);
            }
            a => panic!("{a:?}"),
        }
        assert_eq!(e.test(id).unwrap(), None);
        e.handle_wc(
            3,
            &Wc {
                wr_id: wr_id(WrKind::Direct, id.gen, id.slot),
                status: WcStatus::Success,
                opcode: crate::transport::WcOpcode::RdmaWrite,
                byte_len: 0,
                imm: None,
            },
        );
        assert_eq!(e.test(id).unwrap(), Some(size));
    }
    assert_eq!((e.stats().rendezvous, e.stats().eager), (2, 0));
}

#[test]
fn a_speculative_send_never_consumes_a_zero_length_receive_wr() {
    // Two bounce-backed WRs at first; the receiver then posted receive 0 with 3 zero-length
    // WRs (credits 5, the zeros are WRs 2..5), and the sender matched all of receive 0.
    let mut e = SendEngine::new(params(true, 2));
    e.handle_cts(
        0,
        CtsEntry {
            zeros: 3,
            ..cts(0, 0, 5, &[(64, 1); 3])
        },
    )
    .unwrap();
    for _ in 0..3 {
        assert!(e.isend(0, 0x1000, Keys::one(5), 8, 1).unwrap().is_some());
    }
    // WR 3 is zero-length: no speculative SEND, although a credit is there.
    assert_eq!(e.credits_available(), 2);
    assert_eq!(e.isend(1, 0x1000, Keys::one(5), 8, 1).unwrap(), None);
    assert_eq!(e.stats().cts_waits, 1);
    // The receiver re-posted 3 bounce-backed WRs (5..8): still WR 3 and 4 first.
    e.handle_credit(wire::credit_word(8, 5));
    assert_eq!(e.isend(2, 0x1000, Keys::one(5), 8, 1).unwrap(), None);
    // A CTS: the next sends go direct and consume WRs 3 and 4; then WR 5 may take a SEND.
    e.handle_cts(3, cts(1, 3, 8, &[(64, 1); 2])).unwrap();
    for _ in 0..2 {
        assert!(e.isend(4, 0x1000, Keys::one(5), 8, 1).unwrap().is_some());
    }
    assert!(e.isend(5, 0x1000, Keys::one(5), 8, 1).unwrap().is_some());
    let sends = e
        .drain_actions()
        .into_iter()
        .filter_map(|a| match a {
            Action::PostSend(wr) => Some(wr.opcode),
            _ => None,
        })
        .collect::<Vec<_>>();
    assert_eq!(sends.len(), 6);
    assert!(sends[..5]
        .iter()
        .all(|o| matches!(o, SendOpcode::RdmaWriteWithImm { .. })));
    assert_eq!(sends[5], SendOpcode::Send);
    assert_eq!(e.stats().eager, 1);
}

#[test]
fn too_large_send_fails_and_notifies_receiver() {
    let mut e = SendEngine::new(params(true, 8));
    e.handle_cts(0, cts(0, 0, 8, &[(100, 0)])).unwrap();
    let err = e.isend(0, 0x1000, Keys::one(5), 1000, 0).unwrap_err();
    assert!(
        matches!(err, ReqError::Usage(ref m) if m.contains("1000 bytes") && m.contains("100 bytes")),
        "{err}"
    );
    let acts = e.drain_actions();
    assert_eq!(acts.len(), 2);
    assert_eq!(
        acts[0],
        Action::Stage {
            addr: 0x20_0000,
            bytes: StageBytes::from(&(REC_TOO_BIG | 1000).to_le_bytes()[..])
        }
    );
    assert_eq!(e.in_flight(), 0);
}

#[test]
fn eager_before_cts_completes_only_after_cts_validates_it() {
    let mut e = SendEngine::new(params(true, 8));
    let id = e.isend(0, 0x1000, Keys::one(5), 60, 4).unwrap().unwrap();
    e.handle_wc(
        1,
        &Wc {
            wr_id: wr_id(WrKind::Eager, id.gen, id.slot),
            status: WcStatus::Success,
            opcode: crate::transport::WcOpcode::Send,
            byte_len: 0,
            imm: None,
        },
    );
    assert_eq!(e.test(id).unwrap(), None, "no CTS yet");
    e.handle_cts(2, cts(0, 0, 8, &[(50, 4)])).unwrap();
    assert!(matches!(e.test(id), Err(ReqError::Usage(_))), "60 > 50");
}

#[test]
fn speculative_eager_sends_are_capped_so_the_cts_ring_cannot_overrun() {
    let mut e = SendEngine::new(params(false, 0));
    for _ in 0..MAX_SPECULATIVE {
        assert!(e.isend(0, 0x1000, Keys::one(5), 8, 0).unwrap().is_some());
    }
    assert_eq!(
        e.isend(0, 0x1000, Keys::one(5), 8, 0).unwrap(),
        None,
        "no receive known"
    );
    assert_eq!(e.stats().cts_waits, 1);
    e.handle_cts(0, cts(0, 0, 0, &[(8, 0)])).unwrap();
    assert!(
        e.isend(0, 0x1000, Keys::one(5), 8, 0).unwrap().is_some(),
        "one matched: one more"
    );
    const { assert!(MAX_SPECULATIVE + MAX_RECV_REQUESTS_FOR_RING < CTS_RING_ENTRIES) };
}

/// Receives that can be posted (and their CTS unread) at once.
const MAX_RECV_REQUESTS_FOR_RING: usize = crate::engine::MAX_RECV_REQUESTS;

#[test]
fn out_of_sequence_cts_fails_the_comm() {
    let mut e = SendEngine::new(params(true, 8));
    assert!(e.handle_cts(0, cts(1, 0, 8, &[(50, 4)])).is_err());
    assert!(matches!(
        e.isend(0, 0, Keys::one(0), 1, 0),
        Err(ReqError::Protocol(_))
    ));
}

#[test]
fn slot_limit_returns_none_then_recovers() {
    let mut e = SendEngine::new(params(false, 0));
    // Receives for every slot: 32 groups of 8 buffers, and one more for the retry.
    for r in 0..=(MAX_SEND_REQUESTS / MAX_RECVS) as u64 {
        e.handle_cts(0, cts(r, r * 8, 0, &[(8, 0); 8])).unwrap();
    }
    let mut ids = Vec::new();
    for _ in 0..MAX_SEND_REQUESTS {
        ids.push(e.isend(0, 0x1000, Keys::one(5), 8, 0).unwrap().unwrap());
    }
    assert_eq!(e.isend(0, 0x1000, Keys::one(5), 8, 0).unwrap(), None);
    assert_eq!(e.stats().slots_full, 1);
    let id = ids[0];
    e.handle_wc(
        0,
        &Wc {
            wr_id: wr_id(WrKind::Eager, id.gen, id.slot),
            status: WcStatus::Success,
            opcode: crate::transport::WcOpcode::Send,
            byte_len: 0,
            imm: None,
        },
    );
    assert_eq!(e.test(id).unwrap(), Some(8));
    assert!(e.isend(0, 0x1000, Keys::one(5), 8, 0).unwrap().is_some());
}

fn eager_wc(e: &mut SendEngine, now: u64, id: ReqId) {
    e.handle_wc(
        now,
        &Wc {
            wr_id: wr_id(WrKind::Eager, id.gen, id.slot),
            status: WcStatus::Success,
            opcode: crate::transport::WcOpcode::Send,
            byte_len: 0,
            imm: None,
        },
    );
}

#[test]
fn stalls_name_their_cause_once_per_request_and_per_refusal_streak() {
    let mut e = SendEngine::new(params(true, 2));
    let a = e.isend(0, 0x1000, Keys::one(5), 8, 3).unwrap().unwrap();
    let b = e.isend(0, 0x1000, Keys::one(5), 9, 3).unwrap().unwrap();
    assert_eq!(
        e.isend(10, 0x1000, Keys::one(5), 8, 3).unwrap(),
        None,
        "no credit"
    );
    eager_wc(&mut e, 20, a);
    assert!(e.stalls(60, 100).is_empty(), "not idle long enough");
    let s = e.stalls(200, 100);
    assert_eq!(s.len(), 3, "{s:?}");
    let by = |what: &str| s.iter().find(|x| x.what.starts_with(what)).unwrap();
    assert_eq!(by("send 0").what, "send 0 (8 bytes, tag 3)");
    assert!(by("send 0")
        .waiting_for
        .starts_with("the receiver's clear-to-send for send 0"));
    assert!(by("send 1")
        .waiting_for
        .starts_with("the completion of a posted send"));
    assert_eq!(by("isend").req.slot, u32::MAX);
    assert!(by("isend").waiting_for.starts_with("a credit"));
    assert_eq!(by("isend").idle_ns, 190);
    // Once each, however long the stall lasts and however often isend is refused.
    assert_eq!(e.isend(300, 0x1000, Keys::one(5), 8, 3).unwrap(), None);
    assert!(e.stalls(10_000, 100).is_empty());
    // CTS and credits arrive: both sends complete; the caller tests only b.
    e.handle_cts(10_100, cts(0, 0, 4, &[(64, 3), (64, 3)]))
        .unwrap();
    eager_wc(&mut e, 10_100, b);
    assert_eq!(e.test(b).unwrap(), Some(9));
    // A new refusal streak after a success is a new stall.
    assert!(e
        .isend(10_200, 0x1000, Keys::one(5), 8, 3)
        .unwrap()
        .is_some());
    assert!(e
        .isend(10_200, 0x1000, Keys::one(5), 8, 3)
        .unwrap()
        .is_some());
    assert_eq!(e.isend(10_300, 0x1000, Keys::one(5), 8, 3).unwrap(), None);
    let s = e.stalls(10_500, 100);
    let whats: Vec<&str> = s.iter().map(|x| x.what.as_str()).collect();
    assert!(whats.contains(&"isend (answering 'retry later')"), "{s:?}");
    // `a` completed long ago but was never tested: that is what it waits for (it was
    // reported once already, so only a fresh request shows the wording).
    assert!(!whats.iter().any(|w| w.starts_with("send 0")), "{s:?}");
    let mut f = SendEngine::new(params(true, 1));
    let c = f.isend(0, 0x1000, Keys::one(5), 8, 3).unwrap().unwrap();
    f.handle_cts(0, cts(0, 0, 1, &[(64, 3)])).unwrap();
    eager_wc(&mut f, 0, c);
    let s = f.stalls(1000, 100);
    assert_eq!(s.len(), 1);
    assert!(
        s[0].waiting_for.starts_with("the caller to test it"),
        "{s:?}"
    );
}

/// Our CTS ring and credit word as the receiver would write them.
struct Written {
    ring: Vec<u8>,
    credit: u64,
}

impl MemRead for Written {
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        if addr == 0x60_0000 && out.len() == 8 {
            out.copy_from_slice(&self.credit.to_le_bytes());
            return true;
        }
        let Some(off) = addr.checked_sub(0x50_0000).map(|o| o as usize) else {
            return false;
        };
        match self.ring.get(off..off + out.len()) {
            Some(b) => {
                out.copy_from_slice(b);
                true
            }
            None => false,
        }
    }
}

#[test]
fn peer_writes_are_read_in_order_and_a_torn_entry_waits() {
    let mut e = SendEngine::new(params(true, 0));
    let mut w = Written {
        ring: vec![0; CTS_RING_ENTRIES * CTS_ENTRY_LEN],
        credit: 5,
    };
    assert!(!e.poll_peer_writes(0, &w), "nothing written yet");
    assert_eq!(e.credits_available(), 5, "the credit word is read too");
    // Entry 0 complete, entry 1 torn (head written, tail not yet).
    // (one buffer each: the 64-byte compact entries, written at the slots' starts)
    let zero = cts(0, 0, 5, &[(64, 1)]).encode(CTS_ENTRY_LEN);
    assert_eq!(zero.len(), crate::engine::wire::CTS_COMPACT_LEN);
    w.ring[..zero.len()].copy_from_slice(&zero);
    let one = cts(1, 1, 6, &[(64, 2)]).encode(CTS_ENTRY_LEN);
    w.ring[CTS_ENTRY_LEN..CTS_ENTRY_LEN + 8].copy_from_slice(&one[..8]);
    assert!(e.poll_peer_writes(1, &w));
    assert_eq!(e.expected_cts(), 1, "the torn entry is left for later");
    // (it is decoded into a new group, which goes again: only entry 0's group is known)
    assert!(
        e.debug_state().contains(" groups=1 "),
        "{}",
        e.debug_state()
    );
    w.ring[CTS_ENTRY_LEN..CTS_ENTRY_LEN + one.len()].copy_from_slice(&one);
    assert!(e.poll_peer_writes(2, &w));
    assert_eq!(e.expected_cts(), 2);
    assert_eq!(e.stats().cts, 2);
    // Garbage in the next slot fails the comm as a protocol violation.
    // (a head far ahead of any lap, compact flag off: its tail is the slot's last word)
    w.ring[2 * CTS_ENTRY_LEN..2 * CTS_ENTRY_LEN + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    w.ring[3 * CTS_ENTRY_LEN - 8..3 * CTS_ENTRY_LEN].copy_from_slice(&77u64.to_le_bytes());
    e.poll_peer_writes(3, &w);
    assert!(
        matches!(e.failure(), Some(ReqError::Protocol(_))),
        "{:?}",
        e.failure()
    );
    assert!(
        e.debug_state().contains(" groups=2 "),
        "{}",
        e.debug_state()
    );
}

/// A CTS entry being written while the sender reads it: its body lands before its tail word,
/// so body bytes read before the tail word are an older lap's (zeros here).
struct LandingCts {
    entry: Vec<u8>,
    tail_seen: std::cell::Cell<bool>,
}

impl MemRead for LandingCts {
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        let tail = self.entry.len() - 8;
        for (i, o) in out.iter_mut().enumerate() {
            let off = (addr + i as u64).wrapping_sub(0x50_0000) as usize;
            *o = match off {
                0..8 => self.entry[off],
                _ if off >= tail && off < self.entry.len() => {
                    self.tail_seen.set(true);
                    self.entry[off]
                }
                _ if off < tail && self.tail_seen.get() => self.entry[off],
                _ => 0,
            };
        }
        true
    }
}

#[test]
fn a_cts_entry_is_read_tail_word_first() {
    let mut e = SendEngine::new(params(true, 0));
    let entry = cts(0, 0, 5, &[(4096, 1)]).encode(CTS_ENTRY_LEN);
    let mem = LandingCts {
        entry,
        tail_seen: std::cell::Cell::new(false),
    };
    assert!(e.poll_peer_writes(0, &mem));
    // The buffer the entry announced, whole: a send goes to its address with its rkey.
    e.isend(1, 0x1000, Keys::one(5), 1000, 1).unwrap().unwrap();
    let wr = posted(e.drain_actions())[0];
    assert_eq!(
        wr.opcode,
        SendOpcode::RdmaWriteWithImm {
            remote_addr: 0x4000_0000,
            rkey: 77,
            imm: wire::imm_encode(0, 0, false, false)
        }
    );
}

fn mqp_params(qps: u8, split: bool) -> SendParams {
    SendParams {
        qps,
        split,
        ..params(true, 8)
    }
}

fn ok(wr_id: u64) -> Wc {
    Wc {
        wr_id,
        status: WcStatus::Success,
        opcode: crate::transport::WcOpcode::RdmaWrite,
        byte_len: 0,
        imm: None,
    }
}

/// (QP, wr_id, opcode, local addr, length) of the WRs among `acts`.
fn wrs(acts: &[Action]) -> Vec<(u8, u64, SendOpcode, u64, u32)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::PostSend(w) => Some((0, w)),
            Action::PostSendQp { qp, wr } => Some((*qp, wr)),
            _ => None,
        })
        .map(|(q, w)| (q, w.wr_id, w.opcode, w.sgl[0].addr, w.sgl[0].length))
        .collect()
}

/// The immediate of a WR among `wrs`' output (panics on another opcode).
fn imm_of(op: SendOpcode) -> u32 {
    match op {
        SendOpcode::RdmaWriteWithImm { imm, .. } => imm,
        other => panic!("not a WRITE WITH IMM: {other:?}"),
    }
}

#[test]
fn a_split_send_posts_a_write_with_imm_on_every_qp_at_isend_and_completes_with_the_last() {
    let mut e = SendEngine::new(mqp_params(2, true));
    e.handle_cts(1, cts(0, 0, 8, &[(4096, 9), (4096, 9), (4096, 9)]))
        .unwrap();
    // 300 bytes over 2 QPs: chunk 256: [0, 256) on QP 0, [256, 300) on QP 1, both WRITE WITH
    // IMMs naming receive 0, buffer 0, posted at once.
    let id = e.isend(2, 0x1000, Keys::one(5), 300, 9).unwrap().unwrap();
    let w = wrs(&e.drain_actions());
    let at = 0x4000_0000;
    let imm = wire::imm_encode(0, 0, false, false);
    assert_eq!(
        w,
        [
            (
                0,
                wr_id(WrKind::Piece, 0, piece_index(id.slot, 0)),
                SendOpcode::RdmaWriteWithImm {
                    remote_addr: at,
                    rkey: 77,
                    imm
                },
                0x1000,
                256
            ),
            (
                1,
                wr_id(WrKind::Piece, 0, piece_index(id.slot, 1)),
                SendOpcode::RdmaWriteWithImm {
                    remote_addr: at + 256,
                    rkey: 77,
                    imm
                },
                0x1100,
                44
            ),
        ]
    );
    assert_eq!(e.stats().data_qp_writes, 1);
    assert_eq!(e.stats().rendezvous, 1);
    // QP 1 completes first: not done yet; QP 0's next: done, and nothing more is posted.
    e.handle_wc(3, &ok(w[1].1));
    assert_eq!(e.test(id), Ok(None));
    e.handle_wc(4, &ok(w[0].1));
    assert!(
        e.drain_actions().is_empty(),
        "no record, nothing after isend"
    );
    assert_eq!(e.test(id), Ok(Some(300)));

    // 128 bytes: one 128-byte piece on QP 0 and a zero-length WRITE WITH IMM on QP 1 (every
    // split send consumes one receive WR on every QP), into buffer 1.
    let id = e.isend(6, 0x1000, Keys::one(5), 128, 9).unwrap().unwrap();
    let acts = e.drain_actions();
    let w = wrs(&acts);
    assert_eq!(
        w.iter().map(|w| (w.0, w.4)).collect::<Vec<_>>(),
        [(0, 128), (1, 0)]
    );
    assert!(w
        .iter()
        .all(|w| imm_of(w.2) == wire::imm_encode(0, 1, false, false)));
    let empty = acts.iter().find_map(|a| match a {
        Action::PostSendQp { wr, .. } => Some(wr.num_sge),
        _ => None,
    });
    assert_eq!(empty, Some(0), "the empty piece has no SGE");
    assert_eq!(e.stats().data_qp_writes, 2);
    e.handle_wc(7, &ok(w[0].1));
    assert_eq!(e.test(id), Ok(None));
    e.handle_wc(7, &ok(w[1].1));
    assert_eq!(e.test(id), Ok(Some(128)));
    // A credit-gated split send needs one credit (QP 0's WR), as with one QP.
    assert_eq!(e.credits_available(), 8 - 2);
}

#[test]
fn round_robin_sends_go_on_the_buffers_qp_with_a_zero_length_write_on_qp_0() {
    let mut e = SendEngine::new(mqp_params(3, false));
    e.handle_cts(1, cts(0, 0, 8, &[(4096, 9), (4096, 9), (4096, 9)]))
        .unwrap();
    // Buffers 3 and 4 (global indices: CTS base 3): QPs 0 and 1.
    e.handle_cts(1, cts(1, 3, 8, &[(4096, 9), (4096, 9)]))
        .unwrap();
    let mut plans = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(e.isend(2, 0x1000, Keys::one(5), 1000, 9).unwrap().unwrap());
        plans.push(
            wrs(&e.drain_actions())
                .iter()
                .map(|w| (w.0, w.4, wire::imm_decode(imm_of(w.2)).buf))
                .collect::<Vec<_>>(),
        );
    }
    // Buffer g whole on QP g % 3: a direct WRITE_WITH_IMM on QP 0; elsewhere the payload on
    // its QP and a zero-length WRITE WITH IMM on QP 0.
    assert_eq!(
        plans,
        [
            vec![(0, 1000, 0)],
            vec![(1, 1000, 1), (0, 0, 1)],
            vec![(2, 1000, 2), (0, 0, 2)],
            vec![(0, 1000, 0)],
            vec![(1, 1000, 1), (0, 0, 1)],
        ]
    );
    assert_eq!(e.stats().data_qp_writes, 3);
    let st = e.stalls(2 + 5_000, 1_000);
    let s2 = st.iter().find(|s| s.what.starts_with("send 2 ")).unwrap();
    assert!(
        s2.waiting_for
            .starts_with("the completion of 2 of its 2 RDMA WRITE WITH IMMs, on QP 0, 2"),
        "{s2:?}"
    );
    // An error completion of the piece on QP 2 fails the comm, naming the QP.
    e.handle_wc(
        9,
        &Wc {
            status: WcStatus::RetryExceeded,
            ..ok(wr_id(WrKind::Piece, 0, piece_index(ids[2].slot, 2)))
        },
    );
    for id in ids {
        match e.test(id) {
            Err(ReqError::Remote(m)) => {
                assert!(
                    m.starts_with("RDMA WRITE WITH IMM of a payload piece on QP 2 completed"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
    }
}

/// The send WRs among `acts`.
fn posted(acts: Vec<Action>) -> Vec<SendWr> {
    acts.into_iter()
        .filter_map(|a| match a {
            Action::PostSend(wr) => Some(wr),
            _ => None,
        })
        .collect()
}

/// A send engine with inline sends up to 64 bytes and `n` one-buffer receives of 4 KiB (tag 0)
/// whose CTS entries were read.
fn inline_engine(n: u64) -> SendEngine {
    let mut e = SendEngine::new(SendParams {
        inline_max: 64,
        ..params(true, n)
    });
    for r in 0..n {
        e.handle_cts(0, cts(r, r, n, &[(4096, 0)])).unwrap();
    }
    e
}

/// Sends `size` bytes with tag 0 at `now`, which must go inline: done at once.
fn send_inline(e: &mut SendEngine, now: u64, size: u64) {
    let id = e
        .isend(now, 0x1000, Keys::one(5), size, 0)
        .unwrap()
        .unwrap();
    // Done before any completion: the payload was copied into the WR.
    assert_eq!(e.test(id).unwrap(), Some(size));
}

#[test]
fn an_inline_send_completes_at_its_post_and_one_in_sixteen_is_signaled() {
    let mut e = inline_engine(40);
    // 64 bytes: inline, but with a small send's trailer above inline_max, so each goes as an
    // RDMA WRITE WITH IMM into its buffer.
    for _ in 0..40 {
        send_inline(&mut e, 1, 64);
    }
    let wrs = posted(e.drain_actions());
    assert_eq!(wrs.len(), 40);
    assert!(wrs.iter().all(|w| w.inline
        && w.byte_len() == 64
        && matches!(w.opcode, SendOpcode::RdmaWriteWithImm { .. })));
    assert_eq!(e.stats().small_sends, 0);
    let signaled: Vec<usize> = (0..40).filter(|&i| wrs[i].signaled).collect();
    assert_eq!(signaled, vec![15, 31]);
    assert_eq!((e.stats().inline_sends, e.stats().rendezvous), (40, 40));
    assert_eq!(e.inline_unacked(), 40);
    // WR 31's completion covers the 32 before it (one QP completes in order).
    e.handle_wc(2, &ok(wrs[31].wr_id));
    assert_eq!(e.inline_unacked(), 8);
    // Closing: the newest (39) went unsignaled, so a flush write shows its acknowledgement.
    assert!(e.flush_inline());
    let flush = posted(e.drain_actions());
    assert_eq!(flush.len(), 1, "{flush:?}");
    assert!(flush[0].signaled && !flush[0].inline && flush[0].num_sge == 0);
    assert_eq!(
        flush[0].opcode,
        SendOpcode::RdmaWrite {
            remote_addr: 0x30_0000,
            rkey: 3
        }
    );
    // Asked again before it completed: no second flush.
    assert!(e.flush_inline());
    assert!(posted(e.drain_actions()).is_empty());
    e.handle_wc(3, &ok(flush[0].wr_id));
    assert_eq!(e.inline_unacked(), 0);
    assert!(!e.flush_inline());
}

#[test]
fn a_small_send_is_one_inline_write_into_its_ring_slot_and_takes_no_credit() {
    // Credits for 2 receive WRs, CTS entries for 40 one-buffer receives.
    let mut e = SendEngine::new(SendParams {
        inline_max: 256,
        ..params(true, 2)
    });
    for r in 0..40 {
        e.handle_cts(0, cts(r, r, 2, &[(4096, 0)])).unwrap();
    }
    for (r, size) in [8u64, 0, 112, 100].into_iter().cycle().take(36).enumerate() {
        let id = e.isend(1, 0x1000, Keys::one(5), size, 0).unwrap().unwrap();
        assert_eq!(e.test(id).unwrap(), Some(size), "done at the post");
        let acts = e.drain_actions();
        let trailer = acts
            .iter()
            .find_map(|a| match a {
                Action::Stage { addr, bytes } => Some((*addr, bytes.to_vec())),
                _ => None,
            })
            .expect("the trailer is staged");
        let want = SmallTrailer {
            size: size as u32,
            s_low: r as u32,
        }
        .encode(r as u64);
        assert_eq!(trailer.1, want);
        let wr = posted(acts)[0];
        assert!(wr.inline);
        assert_eq!(wr.signaled, (r + 1) % 16 == 0, "send {r}");
        assert_eq!(wr.byte_len(), size + SMALL_TRAILER_LEN as u64);
        assert_eq!(wr.sges().last().unwrap().addr, trailer.0);
        if size > 0 {
            assert_eq!((wr.sgl[0].addr, wr.sgl[0].length), (0x1000, size as u32));
        }
        // Right-aligned: the trailer ends at the slot's end.
        let slot = 0x30_0000 + wire::small_slot(r as u64);
        assert_eq!(
            wr.opcode,
            SendOpcode::RdmaWrite {
                remote_addr: slot + wire::SMALL_MAX - size,
                rkey: 3
            }
        );
        assert_eq!(
            slot + SMALL_SLOT_LEN as u64,
            slot + wire::SMALL_MAX - size + wr.byte_len()
        );
    }
    // None consumed a receive WR: both credits are still there.
    assert_eq!(e.credits_available(), 2);
    assert_eq!(e.stats().small_sends, 36);
    // Above SMALL_MAX a send is a WRITE WITH IMM and takes a credit.
    e.isend(1, 0x1000, Keys::one(5), 113, 0).unwrap().unwrap();
    let wr = posted(e.drain_actions())[0];
    assert!(matches!(wr.opcode, SendOpcode::RdmaWriteWithImm { .. }));
    assert_eq!(e.credits_available(), 1);
}

#[test]
fn a_small_send_needs_a_one_buffer_receive_that_fits_it() {
    let mut e = SendEngine::new(SendParams {
        inline_max: 256,
        ..params(true, 8)
    });
    // A grouped receive, then a one-buffer receive of 4 bytes.
    e.handle_cts(0, cts(0, 0, 8, &[(4096, 0), (4096, 1)]))
        .unwrap();
    e.handle_cts(0, cts(1, 2, 8, &[(4, 0)])).unwrap();
    e.isend(1, 0x1000, Keys::one(5), 8, 0).unwrap().unwrap();
    e.isend(1, 0x1000, Keys::one(5), 8, 1).unwrap().unwrap();
    let wrs = posted(e.drain_actions());
    assert!(wrs
        .iter()
        .all(|w| matches!(w.opcode, SendOpcode::RdmaWriteWithImm { .. })));
    // Too big for its buffer: refused with a record, not written into the ring.
    assert!(e.isend(1, 0x1000, Keys::one(5), 8, 0).is_err());
    let rec = posted(e.drain_actions());
    assert_eq!(rec.len(), 1, "{rec:?}");
    assert!(
        matches!(rec[0].opcode, SendOpcode::RdmaWriteWithImm { imm, .. } if wire::imm_decode(imm).record),
        "{rec:?}"
    );
    assert_eq!(e.stats().small_sends, 0);
}

#[test]
fn a_small_sized_send_goes_small_past_a_zero_length_wr_and_direct_once_inline_is_full() {
    let mut e = SendEngine::new(SendParams {
        inline_max: 256,
        ..params(true, 2)
    });
    // 80 one-buffer receives; the first CTS announces WRs 2..10 as zero-length.
    let mut first = cts(0, 0, 10, &[(4096, 0)]);
    first.zeros = 8;
    e.handle_cts(0, first).unwrap();
    for r in 1..80 {
        e.handle_cts(0, cts(r, r, 10, &[(4096, 0)])).unwrap();
    }
    let opcode = |e: &mut SendEngine| posted(e.drain_actions())[0].opcode;
    // Two larger sends take WRs 0 and 1; WR 2 is zero-length. Small sends take no WR, so it
    // stays next (the trade-off in docs/protocol.md, "Small sends").
    for _ in 0..2 {
        e.isend(1, 0x1000, Keys::one(5), 200, 0).unwrap().unwrap();
        e.drain_actions();
    }
    for _ in 0..4 {
        e.isend(1, 0x1000, Keys::one(5), 8, 0).unwrap().unwrap();
        assert!(matches!(opcode(&mut e), SendOpcode::RdmaWrite { .. }));
    }
    assert_eq!(e.wrs_consumed(), 2);
    assert_eq!(e.stats().small_sends, 4);
    // Every send so far was inline; small ones up to 64 unacknowledged: the next small-sized
    // send is an ordinary direct write, signaled, completing on its completion, and takes WR 2.
    for _ in 0..(MAX_INLINE_UNACKED - e.inline_unacked()) {
        e.isend(1, 0x1000, Keys::one(5), 8, 0).unwrap().unwrap();
    }
    e.drain_actions();
    assert_eq!(e.inline_unacked(), MAX_INLINE_UNACKED);
    let id = e.isend(1, 0x1000, Keys::one(5), 8, 0).unwrap().unwrap();
    let wr = posted(e.drain_actions())[0];
    assert!(matches!(wr.opcode, SendOpcode::RdmaWriteWithImm { .. }));
    assert!(!wr.inline && wr.signaled);
    assert_eq!(e.test(id).unwrap(), None, "completes on its completion");
    assert_eq!(e.wrs_consumed(), 3);
}

#[test]
fn inline_sends_stop_at_the_unacknowledged_bound_and_above_the_size() {
    let n = MAX_INLINE_UNACKED + 2;
    let mut e = inline_engine(n);
    for _ in 0..MAX_INLINE_UNACKED {
        send_inline(&mut e, 1, 64);
    }
    let wrs = posted(e.drain_actions());
    // At the bound the newest is signaled, so the queue always drains.
    assert!(wrs.last().unwrap().signaled);
    // The next send is an ordinary direct one: it completes on its own completion.
    let id = e.isend(1, 0x1000, Keys::one(5), 64, 0).unwrap().unwrap();
    let wr = posted(e.drain_actions())[0];
    assert!(!wr.inline && wr.signaled);
    assert_eq!(e.test(id).unwrap(), None);
    e.handle_wc(2, &ok(wr.wr_id));
    assert_eq!(e.test(id).unwrap(), Some(64));
    // Once acknowledged, inline again; but never above inline_max.
    e.handle_wc(2, &ok(wrs.last().unwrap().wr_id));
    assert_eq!(e.inline_unacked(), 0);
    let id = e.isend(3, 0x1000, Keys::one(5), 65, 0).unwrap().unwrap();
    assert!(!posted(e.drain_actions())[0].inline);
    assert_eq!(e.test(id).unwrap(), None);
    assert_eq!(e.stats().inline_sends, MAX_INLINE_UNACKED);
}

#[test]
fn a_failed_inline_send_fails_the_comm_after_its_request_completed() {
    let mut e = inline_engine(3);
    let a = e.isend(1, 0x1000, Keys::one(5), 8, 0).unwrap().unwrap();
    assert_eq!(e.test(a).unwrap(), Some(8));
    let wr = posted(e.drain_actions())[0];
    e.handle_wc(
        2,
        &Wc {
            status: WcStatus::RetryExceeded,
            ..ok(wr.wr_id)
        },
    );
    let err = e.isend(3, 0x1000, Keys::one(5), 8, 0).unwrap_err();
    assert!(
        err.to_string().contains("inline send"),
        "the error names the inline send: {err}"
    );
    assert!(
        !e.flush_inline(),
        "a failed comm waits for nothing at close"
    );
}

#[test]
fn an_unsignaled_inline_tail_gets_a_flush_from_the_watchdog_then_a_stall_report() {
    let mut e = inline_engine(3);
    for _ in 0..3 {
        send_inline(&mut e, 0, 8);
    }
    assert!(posted(e.drain_actions()).iter().all(|w| !w.signaled));
    // No completion could ever show these: the watchdog asks for one instead of reporting.
    let s = 1_000_000_000;
    assert!(e.stalls(2 * s, s).is_empty());
    let flush = posted(e.drain_actions());
    assert_eq!(flush.len(), 1);
    assert!(flush[0].signaled);
    // The flush is not acknowledged either (a dead peer): now it is reported.
    let st = e.stalls(4 * s, s);
    assert_eq!(st.len(), 1, "{st:?}");
    assert!(st[0].what.starts_with("3 inline sends"), "{st:?}");
    e.handle_wc(5 * s, &ok(flush[0].wr_id));
    assert_eq!(e.inline_unacked(), 0);
}

#[test]
fn a_later_completion_on_qp0_acknowledges_inline_sends_and_a_failed_flush_ends_the_wait() {
    let mut e = inline_engine(4);
    for _ in 0..2 {
        send_inline(&mut e, 0, 8);
    }
    // An ordinary direct send (above inline_max) after them: its completion covers them.
    let big = e.isend(0, 0x1000, Keys::one(5), 100, 0).unwrap().unwrap();
    let wrs = posted(e.drain_actions());
    assert_eq!(wrs.iter().filter(|w| w.inline).count(), 2);
    assert_eq!(e.inline_unacked(), 2);
    e.handle_wc(1, &ok(wrs[2].wr_id));
    assert_eq!(e.test(big).unwrap(), Some(100));
    assert_eq!(e.inline_unacked(), 0);
    assert!(!e.flush_inline(), "nothing to flush");
    // One more inline send, its flush failing (the peer closed meanwhile): no wait is left,
    // and the comm is not failed by it.
    send_inline(&mut e, 2, 8);
    e.drain_actions();
    assert!(e.flush_inline());
    let flush = posted(e.drain_actions())[0];
    e.handle_wc(
        3,
        &Wc {
            status: WcStatus::WrFlush,
            ..ok(flush.wr_id)
        },
    );
    assert!(!e.flush_inline());
    assert!(e.failure().is_none());
    assert_eq!(e.stats().error_completions, 0);
}

/// The groups' ring keeps its order through pops at both ends, wraps, and growth while its
/// oldest group is not in slot 0; a slot taken again is handed out with nothing matched.
#[test]
fn the_groups_ring_keeps_posting_order_through_wraps_and_growth() {
    let mut g = Groups::default();
    let push = |g: &mut Groups, r: u64| {
        let s = g.push_slot();
        assert_eq!(s.used, 0, "a slot handed out again has nothing matched");
        s.e.r = r;
        s.used = 0b1;
    };
    let order = |g: &Groups| g.iter().map(|x| x.e.r).collect::<Vec<_>>();
    for r in 0..3 {
        push(&mut g, r);
    }
    g.pop_front();
    g.pop_front();
    assert_eq!(order(&g), [2]);
    // Wraps into the two freed slots, then grows with the oldest group in slot 2.
    for r in 3..8 {
        push(&mut g, r);
    }
    assert_eq!(order(&g), [2, 3, 4, 5, 6, 7]);
    assert_eq!(
        (g.len(), g.front().map(|x| x.e.r), g.back().map(|x| x.e.r)),
        (6, Some(2), Some(7))
    );
    assert_eq!(g[1].e.r, 3);
    g[5].used = 0b11;
    assert_eq!(g.get(5).map(|x| x.used), Some(0b11));
    assert!(g.get(6).is_none());
    g.pop_back();
    push(&mut g, 8);
    assert_eq!(order(&g), [2, 3, 4, 5, 6, 8]);
    while !g.is_empty() {
        g.pop_front();
    }
    g.pop_front();
    g.pop_back();
    assert_eq!((g.len(), order(&g)), (0, vec![]));
    g.push_back(Group {
        e: CtsEntry::BLANK,
        used: 0,
    });
    assert_eq!(order(&g), [CtsEntry::BLANK.r]);
}
