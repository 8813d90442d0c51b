//! A fixed number of engine rounds (the criterion bench's `engine_round`: irecv + isend + wait
//! for both, no I/O), so an instruction counter can compare builds independent of load:
//!
//! ```text
//! cargo build --release --example engine_rounds
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/engine_rounds 8 1 2000   # SIZE CREDITS(0|1) ROUNDS
//! ```
//! Instructions per round = (Ir at 2N rounds − Ir at N rounds) / N, start-up cancelled out.
use nccl_net_verbsnet::engine::sim::{Knobs, Pair, PairCfg};

fn main() {
    let a: Vec<u64> = std::env::args()
        .skip(1)
        .map(|s| s.parse().expect("SIZE CREDITS ROUNDS"))
        .collect();
    let (size, credits, rounds) = (a[0] as usize, a[1] != 0, a[2]);
    let cfg = PairCfg {
        rq_depth: 64,
        rq_batch: 16,
        rq_low_water: 48,
        eager_buf_size: 8192,
        eager_limit: 8192,
        credits,
        ..PairCfg::default()
    };
    let mut p = Pair::new(cfg, Knobs::default());
    let data = vec![7u8; size];
    for _ in 0..rounds {
        let r = p.irecv(&[(0, 65536, 0)]).expect("irecv");
        let s = p.isend(0, &data, 0).expect("isend");
        p.wait_recv(r).expect("recv");
        p.wait_send(s).expect("send");
    }
}
