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
    // A window in flight, as a stream keeps it (verbsnet-perf stream's default is 32): the
    // receive side's matching scans the posted receives.
    for (name, w, sends_first) in [
        ("window32_recvs_first_64B", 32, false),
        ("window16_sends_first_64B", 16, true),
    ] {
        let mut p = Pair::new(bench_cfg(true), Knobs::default());
        g.throughput(Throughput::Elements(w as u64));
        g.bench_function(BenchmarkId::new(name, 64), |b| {
            b.iter(|| p.window_round(&data[..64], w, sends_first))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
