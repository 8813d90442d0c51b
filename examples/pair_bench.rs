//! Stream bandwidth and ping-pong latency of a connected comm pair in one process (testkit),
//! over the transport `VERBSNET_TRANSPORT` names (default auto: ib when a verbs device exists).
//! The other `VERBSNET_*` knobs apply to both sides. This is a baseline tool: it prints numbers
//! and asserts nothing about them.
//!
//! ```text
//! cargo build --release --example pair_bench
//! target/release/examples/pair_bench [--sizes 64,4096,65536,1048576] [--window 16]
//!     [--bytes 64M] [--min-iters 100] [--max-iters 5000] [--lat-size 8] [--lat-iters 1000]
//! ```
//!
//! - bandwidth: one send comm streams `iters` messages of each size to one receive comm, with up
//!   to `--window` sends and receives outstanding (each on its own buffer slot). Iterations per
//!   size: `--bytes / size`, clamped to `[--min-iters, --max-iters]`, after 10 % warm-up.
//!   MB/s are 2^20 bytes per second, as perftest prints them.
//! - latency: two pairs (A→B, B→A); A sends `--lat-size` bytes, B answers as soon as it has
//!   them, receives are pre-posted. One-way latency = round trip / 2, as perftest's `*_lat`.
//!
//! One thread drives both ends (sender and receiver progress alternately), so the numbers
//! include the cost of the other side's calls; `verbsnet-perf sendrecv --ranks 2` measures two
//! processes instead. Output: one line per measurement, `key=value` words, easy to grep:
//! `bw size=65536 iters=1024 mbps=27.1 msgs_per_s=433.1` and
//! `lat size=8 iters=1000 min_us=.. typical_us=.. avg_us=.. p99_us=..`.

use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::Instant;

use nccl_net_verbsnet::comm::{Comm, RecvComm, Role, SendComm};

/// Any layer's error (comm calls and testkit helpers).
type Error = Box<dyn std::error::Error + Send + Sync>;
use nccl_net_verbsnet::config::Config;
use nccl_net_verbsnet::engine::ReqId;
use nccl_net_verbsnet::testkit::{connect, open_device, Buf, Link};

struct Opts {
    sizes: Vec<usize>,
    window: usize,
    bytes: usize,
    min_iters: usize,
    max_iters: usize,
    lat_size: usize,
    lat_iters: usize,
    call_iters: usize,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .map(|n| n * mul)
        .map_err(|e| format!("bad size {s:?}: {e}"))
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        sizes: vec![64, 4096, 65536, 262144, 1 << 20],
        window: 16,
        bytes: 64 << 20,
        min_iters: 100,
        max_iters: 5000,
        lat_size: 8,
        lat_iters: 1000,
        call_iters: 0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--sizes" => {
                o.sizes = val()?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(parse_size)
                    .collect::<Result<_, _>>()?
            }
            "--window" => o.window = parse_size(&val()?)?.max(1),
            "--bytes" => o.bytes = parse_size(&val()?)?,
            "--min-iters" => o.min_iters = parse_size(&val()?)?.max(1),
            "--max-iters" => o.max_iters = parse_size(&val()?)?.max(1),
            "--lat-size" => o.lat_size = parse_size(&val()?)?,
            "--lat-iters" => o.lat_iters = parse_size(&val()?)?,
            "--call-iters" => o.call_iters = parse_size(&val()?)?,
            "-h" | "--help" => {
                println!("see the header of examples/pair_bench.rs");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(o)
}

/// A hang guard for the polling loops (not a measurement).
const MAX_POLLS: u64 = 2_000_000_000;

fn isend(c: &SendComm, b: &Buf, off: usize, size: usize) -> Result<Option<ReqId>, Error> {
    Ok(c.isend(b.addr(off), size as u64, 0, &b.mr)?)
}

fn irecv(c: &RecvComm, b: &Buf, off: usize, cap: usize) -> Result<Option<ReqId>, Error> {
    Ok(c.irecv(&[(b.addr(off), cap as u64, 0, &b.mr)])?)
}

/// Streams `iters` messages of `size` bytes; returns the seconds the timed part took.
fn stream(l: &Link, size: usize, window: usize, warm: usize, iters: usize) -> Result<f64, Error> {
    let slot = size.max(1);
    let sb = Buf::new(&l.dev, window * slot)?;
    let rb = Buf::new(&l.dev, window * slot)?;
    sb.fill(0, &vec![0x5a; window * slot]);
    let total = warm + iters;
    let (mut ps, mut pr, mut ds, mut dr) = (0, 0, 0, 0);
    let mut sq: VecDeque<ReqId> = VecDeque::new();
    let mut rq: VecDeque<ReqId> = VecDeque::new();
    let mut t0 = Instant::now();
    let mut polls = 0u64;
    while ds < total || dr < total {
        while pr < total && rq.len() < window {
            match irecv(&l.recv, &rb, (pr % window) * slot, slot)? {
                Some(id) => {
                    rq.push_back(id);
                    pr += 1;
                }
                None => break,
            }
        }
        while ps < total && sq.len() < window {
            match isend(&l.send, &sb, (ps % window) * slot, size)? {
                Some(id) => {
                    sq.push_back(id);
                    ps += 1;
                }
                None => break,
            }
        }
        while let Some(&id) = rq.front() {
            if l.recv.test(id)?.is_none() {
                break;
            }
            rq.pop_front();
            dr += 1;
            if dr == warm {
                t0 = Instant::now();
            }
        }
        while let Some(&id) = sq.front() {
            if l.send.test(id)?.is_none() {
                break;
            }
            sq.pop_front();
            ds += 1;
        }
        polls += 1;
        if polls > MAX_POLLS {
            return Err(Error::from(format!(
                "stream of {size} B stuck: {ds}/{total} sent, {dr}/{total} received"
            )));
        }
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// Polls `id` on `c` to completion, letting `peer` progress in between (a userspace transport
/// moves data only inside plugin calls).
fn wait<A: Role, B: Role>(c: &Comm<A>, id: ReqId, peer: &Comm<B>) -> Result<(), Error> {
    for _ in 0..MAX_POLLS {
        if c.test(id)?.is_some() {
            return Ok(());
        }
        peer.progress()?;
    }
    Err("request stuck".into())
}

fn retry(mut f: impl FnMut() -> Result<Option<ReqId>, Error>) -> Result<ReqId, Error> {
    for _ in 0..MAX_POLLS {
        if let Some(id) = f()? {
            return Ok(id);
        }
    }
    Err("post stuck".into())
}

/// Ping-pong between A (sends on `ab`, receives on `ba`) and B; one-way latencies in us.
fn pingpong(
    ab: &Link,
    ba: &Link,
    size: usize,
    warm: usize,
    iters: usize,
) -> Result<Vec<f64>, Error> {
    let cap = size.max(1);
    let a_s = Buf::new(&ab.dev, cap)?;
    let b_r = Buf::new(&ab.dev, cap)?;
    let b_s = Buf::new(&ba.dev, cap)?;
    let a_r = Buf::new(&ba.dev, cap)?;
    let mut out = Vec::with_capacity(iters);
    let mut b_recv = retry(|| irecv(&ab.recv, &b_r, 0, cap))?;
    let mut a_recv = retry(|| irecv(&ba.recv, &a_r, 0, cap))?;
    for i in 0..warm + iters {
        let t = Instant::now();
        let ping = retry(|| isend(&ab.send, &a_s, 0, size))?;
        wait(&ab.recv, b_recv, &ab.send)?;
        let pong = retry(|| isend(&ba.send, &b_s, 0, size))?;
        wait(&ba.recv, a_recv, &ba.send)?;
        let rtt = t.elapsed().as_secs_f64();
        if i >= warm {
            out.push(rtt * 1e6 / 2.0);
        }
        // pre-post the next round's receives, retire the sends (off the clock)
        b_recv = retry(|| irecv(&ab.recv, &b_r, 0, cap))?;
        a_recv = retry(|| irecv(&ba.recv, &a_r, 0, cap))?;
        wait(&ab.send, ping, &ab.recv)?;
        wait(&ba.send, pong, &ba.recv)?;
    }
    Ok(out)
}

/// The CPU cost of the calls a polling caller makes while nothing arrives: `test` of a posted
/// receive, and `progress` of each comm. Nanoseconds per call, each timed over
/// `iters` calls after `iters / 10` warm-up calls.
fn call_cost(l: &Link, iters: usize) -> Result<Vec<(&'static str, f64)>, Error> {
    let rb = Buf::new(&l.dev, 4096)?;
    let timed = |f: &mut dyn FnMut() -> Result<(), Error>| -> Result<f64, Error> {
        for _ in 0..iters / 10 {
            f()?;
        }
        let t = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        Ok(t.elapsed().as_secs_f64() * 1e9 / iters as f64)
    };
    let mut out = Vec::new();
    let id = retry(|| irecv(&l.recv, &rb, 0, 4096))?;
    out.push((
        "recv_test_pending",
        timed(&mut || {
            if l.recv.test(id)?.is_some() {
                return Err("a receive completed with nothing sent".into());
            }
            Ok(())
        })?,
    ));
    out.push(("recv_progress", timed(&mut || Ok(l.recv.progress()?))?));
    out.push(("send_progress", timed(&mut || Ok(l.send.progress()?))?));
    let sb = Buf::new(&l.dev, 4096)?;
    let sid = retry(|| isend(&l.send, &sb, 0, 8))?;
    wait(&l.recv, id, &l.send)?;
    wait(&l.send, sid, &l.recv)?;
    Ok(out)
}

fn run(o: &Opts) -> Result<(), String> {
    let cfg = Config::from_env().map_err(|e| e.to_string())?;
    let (dev, kind) = open_device(&cfg).map_err(|e| e.to_string())?;
    println!(
        "device name={} transport={} credits={} eager_limit={} rq_depth={} window={}",
        dev.props().name,
        kind.as_str(),
        cfg.credits,
        cfg.eager_limit,
        cfg.rq_depth,
        o.window
    );
    let l = connect(&dev, kind, &cfg, &cfg, 10_000_000).map_err(|e| e.to_string())?;
    if o.call_iters > 0 {
        for (what, ns) in call_cost(&l, o.call_iters).map_err(|e| e.to_string())? {
            println!("call what={what} ns={ns:.0}");
        }
    }
    for &size in &o.sizes {
        let iters = (o.bytes / size.max(1)).clamp(o.min_iters, o.max_iters.max(o.min_iters));
        let warm = (iters / 10).max(1);
        let secs = stream(&l, size, o.window, warm, iters).map_err(|e| e.to_string())?;
        let mbps = (size * iters) as f64 / secs / f64::from(1 << 20);
        println!(
            "bw size={size} iters={iters} secs={secs:.3} mbps={mbps:.2} msgs_per_s={:.0}",
            iters as f64 / secs
        );
    }
    if o.lat_iters > 0 {
        let back = connect(&dev, kind, &cfg, &cfg, 10_000_000).map_err(|e| e.to_string())?;
        let warm = (o.lat_iters / 10).max(1);
        let mut us =
            pingpong(&l, &back, o.lat_size, warm, o.lat_iters).map_err(|e| e.to_string())?;
        us.sort_by(f64::total_cmp);
        let pct = |p: f64| us[((us.len() - 1) as f64 * p).round() as usize];
        println!(
            "lat size={} iters={} min_us={:.2} typical_us={:.2} avg_us={:.2} p99_us={:.2}",
            o.lat_size,
            us.len(),
            us[0],
            pct(0.5),
            us.iter().sum::<f64>() / us.len() as f64,
            pct(0.99)
        );
        back.send.close();
        back.recv.close();
    }
    l.send.close();
    l.recv.close();
    Ok(())
}

fn main() -> ExitCode {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("pair_bench: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pair_bench: {e}");
            ExitCode::FAILURE
        }
    }
}
