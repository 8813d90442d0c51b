//! Unit tests of the receive engine (`super`), fed by hand.

use super::*;

fn params() -> RecvParams {
    RecvParams {
        qps: 1,
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
        credits: true,
        first_seq: 0,
    }
}

fn buf(tag: i32) -> RecvBuf {
    RecvBuf {
        addr: 0x6000_0000,
        cap: 64,
        rkey: 9,
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

/// The control WRITEs `e` queued since the last call: (wr_id, signaled).
fn ctrl_writes(e: &mut RecvEngine) -> Vec<(u64, bool)> {
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

struct NoMem;
impl MemRead for NoMem {
    fn read(&self, _: u64, _: &mut [u8]) -> bool {
        false
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
    e.handle_wc(1, &wc(writes[15].0, WcStatus::Success), &NoMem);
    assert_eq!(e.ctrl_outstanding(), 16);
    e.handle_wc(1, &wc(writes[15].0, WcStatus::Success), &NoMem);
    assert_eq!(e.ctrl_outstanding(), 16);
    assert!(e.failure().is_none());
    // An unsignaled write that fails still completes (with its error) and fails the comm.
    e.handle_wc(2, &wc(writes[20].0, WcStatus::RemoteAccess), &NoMem);
    let f = e.failure().expect("the comm failed").to_string();
    assert!(
        f.contains("clear-to-send RDMA WRITE completed with IBV_WC_REM_ACCESS_ERR"),
        "{f}"
    );
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
    e.handle_wc(1, &wc(last.0, WcStatus::Success), &NoMem);
    assert_eq!(e.ctrl_outstanding(), 0);
    assert!(e.irecv(0, &[buf(1)]).unwrap().is_some());
}

/// Reads `0` everywhere but the record ring, which holds `rec` in every slot.
struct Records(u64);
impl MemRead for Records {
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        let v = if addr >= 0x20_0000 { self.0 } else { 0 };
        out.copy_from_slice(&v.to_le_bytes()[..out.len()]);
        true
    }
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

#[test]
fn with_several_qps_records_may_come_out_of_order_but_must_name_an_unmatched_posted_buffer() {
    let qps = |n| RecvParams { qps: n, ..params() };
    // Out of send order: buffer 1's size record before buffer 0's direct write, then the
    // second receive's before the first is complete.
    let mut e = RecvEngine::new(qps(4));
    let a = e.irecv(0, &[buf(1), buf(1)]).unwrap().unwrap();
    let b = e.irecv(0, &[buf(2)]).unwrap().unwrap();
    e.handle_wc(1, &arrival(0, 1, true, 8), &Records(40));
    e.handle_wc(1, &arrival(1, 0, true, 8), &Records(64));
    assert!(e.failure().is_none(), "{:?}", e.failure());
    assert_eq!(e.test(b), Ok(Some(vec![64])));
    assert_eq!(e.test(a), Ok(None), "buffer 0 has not arrived");
    e.handle_wc(1, &arrival(0, 0, false, 3), &NoMem);
    assert_eq!(e.test(a), Ok(Some(vec![3, 40])));
    assert_eq!(e.stats().rendezvous, 3);
    // The same out-of-order arrival on a one-QP connection breaks its strict check.
    let mut e = RecvEngine::new(qps(1));
    e.irecv(0, &[buf(1), buf(1)]).unwrap().unwrap();
    e.handle_wc(1, &arrival(0, 1, false, 8), &NoMem);
    let f = e.failure().expect("strict with one QP").to_string();
    assert!(f.contains("for send 0 names no unmatched buffer"), "{f}");

    // What stays a protocol error with several QPs: a buffer matched already, an index out
    // of range, a receive not posted, a size record beyond the buffer.
    type Case = (&'static str, Vec<(u64, usize, bool, u64)>, &'static str);
    let cases: [Case; 4] = [
        (
            "matched",
            vec![(0, 0, false, 0), (0, 0, true, 8)],
            "a record (imm 0x80000000: receive 0 mod 2^27, buffer 0) for arrival 1 names no \
             unmatched buffer",
        ),
        (
            "range",
            vec![(0, 2, true, 8)],
            "buffer 2) for arrival 0 names no",
        ),
        ("not posted", vec![(3, 0, false, 0)], "receive 3 mod 2^27"),
        (
            "too big",
            vec![(0, 0, true, 65)],
            "a size record of 65 bytes (arrival 0) for a receive buffer of 64 bytes",
        ),
    ];
    for (what, arrivals, want) in cases {
        let mut e = RecvEngine::new(qps(2));
        let id = e.irecv(0, &[buf(1), buf(1)]).unwrap().unwrap();
        for (r, i, record, v) in arrivals {
            e.handle_wc(1, &arrival(r, i, record, 8), &Records(v));
        }
        match e.test(id) {
            Err(ReqError::Protocol(m)) => assert!(m.contains(want), "{what}: {m}"),
            other => panic!("{what}: {other:?}"),
        }
    }
}
