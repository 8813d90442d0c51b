//! Engine cost of one isend + irecv + test round with no I/O: the simulated pair moves WRs
//! in memory, so this measures the protocol engine (and the simulator's memcpy), not a network.
//! Run: `cargo bench -p verbsnet --bench engine`.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use nccl_net_verbsnet::engine::sim::{Knobs, Pair, PairCfg};

fn round(p: &mut Pair, size: usize, data: &[u8]) {
    let r = p.irecv(&[(0, 65536, 0)]).expect("irecv");
    let s = p.isend(0, &data[..size], 0).expect("isend");
    p.wait_recv(r).expect("recv");
    p.wait_send(s).expect("send");
}

fn bench(c: &mut Criterion) {
    let data = vec![7u8; 65536];
    let mut g = c.benchmark_group("engine_round");
    for (name, size, credits) in [
        ("eager_8B_credits", 8, true),
        ("eager_8B_nocredits", 8, false),
        ("rndv_64KiB", 65536, true),
    ] {
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
        g.throughput(Throughput::Elements(1));
        g.bench_function(BenchmarkId::new(name, size), |b| {
            b.iter(|| round(&mut p, size, &data))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
