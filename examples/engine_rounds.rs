//! A fixed number of engine rounds (the criterion bench's `engine_round`: irecv + isend + wait
//! for both, no I/O), so an instruction counter can compare builds independent of load:
//!
//! ```text
//! cargo build --release --example engine_rounds
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/engine_rounds 8 1 2000   # SIZE CREDITS(0|1) ROUNDS
//! ```
//! Instructions per round = (Ir at 2N rounds − Ir at N rounds) / N, start-up cancelled out.
use nccl_net_verbsnet::engine::sim::{bench_cfg, Knobs, Pair};

fn main() {
    let a: Vec<u64> = std::env::args()
        .skip(1)
        .map(|s| s.parse().expect("SIZE CREDITS ROUNDS"))
        .collect();
    let (size, credits, rounds) = (a[0] as usize, a[1] != 0, a[2]);
    let mut p = Pair::new(bench_cfg(credits), Knobs::default());
    let data = vec![7u8; size];
    for _ in 0..rounds {
        p.round(&data);
    }
}
