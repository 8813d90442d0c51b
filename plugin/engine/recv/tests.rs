//! Unit tests of the receive engine (`super`), fed by hand.

use super::*;

fn params() -> RecvParams {
    RecvParams {
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
