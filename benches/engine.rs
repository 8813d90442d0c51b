//! Engine cost of one isend + irecv + test round with no I/O: the simulated pair moves WRs
//! in memory, so this measures the protocol engine (and the simulator's memcpy), not a network.
//! Run: `cargo bench -p verbsnet --bench engine`.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use nccl_net_verbsnet::engine::sim::{bench_cfg, Knobs, Pair};

fn bench(c: &mut Criterion) {
    let data = vec![7u8; 65536];
    let mut g = c.benchmark_group("engine_round");
    for (name, size, credits) in [
        ("eager_8B_credits", 8, true),
        ("eager_8B_nocredits", 8, false),
        ("rndv_64KiB", 65536, true),
    ] {
        let mut p = Pair::new(bench_cfg(credits), Knobs::default());
        g.throughput(Throughput::Elements(1));
        g.bench_function(BenchmarkId::new(name, size), |b| {
            b.iter(|| p.round(&data[..size]))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
