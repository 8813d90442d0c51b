//! Credit study: credit gating on/off × receive-queue depth × message size, on a burst workload
//! over a real transport (tcp on loopback by default; `--transport ib` on a verbs device).
//!
//! Each configuration connects one send/receive pair and runs bursts of `--burst` messages (256):
//! a sender thread issues every message of a burst as fast as `isend` accepts them (retrying
//! "retry later"), a receiver thread posts `irecv`s as fast as the plugin allows (at most 32
//! outstanding, NCCL's limit) and tests them in order. A message's latency is from the sender's
//! first `isend` attempt for it to the receiver's `test` returning it, so it includes credit
//! waits (credits on) and RNR stalls (credits off). Bursts are separated by a barrier; the first
//! `--warmup` bursts are not measured. RNR NAKs: the QP counters on tcp, the device's
//! `rcvd_rnr_err` on ib. Each configuration runs `--repeat` times (3) on a fresh connection; the
//! table shows the median run per column (RNR NAKs and credit stalls per run, warmup included)
//! and the largest latency of all runs.
//!
//! Output: a markdown table on stdout; `--csv FILE` also writes the numbers for
//! `benches/credit_study_plot.py`.
//!
//! Each depth runs fixed (`VERBSNET_RQ_MIN_DEPTH` = depth: the whole queue posted from the
//! start) and, with `--modes fixed,adaptive` (the default), adaptive: the default minimum depth
//! (2), growing from the shared pool up to that depth when the queue runs dry.
//!
//! ```sh
//! cargo bench --bench credit_study -- [--transport tcp|ib] [--bursts 20] [--warmup 2]
//!     [--burst 256] [--depths 4,16,64,256] [--sizes 8,4096,65536] [--repeat 3]
//!     [--modes fixed,adaptive] [--credits on,off] [--csv FILE]
//! ```
use std::sync::{Arc, Barrier};
use std::time::Instant;

use nccl_net_verbsnet::comm::{Comm, Role};
use nccl_net_verbsnet::config::{Config, TransportChoice};
use nccl_net_verbsnet::engine::ReqId;
use nccl_net_verbsnet::engine::MAX_RECV_REQUESTS;
use nccl_net_verbsnet::testkit::{connect, open_device, Buf};
use nccl_net_verbsnet::transport::{Device, Kind};

struct Args {
    transport: TransportChoice,
    bursts: usize,
    warmup: usize,
    burst: usize,
    depths: Vec<u32>,
    sizes: Vec<usize>,
    repeat: usize,
    /// Fixed depth, adaptive depth from the default minimum, or both.
    modes: Vec<bool>,
    credits: Vec<bool>,
    csv: Option<String>,
}

fn parse_list<T: std::str::FromStr>(v: &str) -> Vec<T> {
    v.split(',')
        .map(|x| {
            x.trim()
                .parse()
                .ok()
                .expect("a comma-separated list of numbers")
        })
        .collect()
}

/// A comma-separated list of `words`, each mapped to its value (`--modes fixed,adaptive`).
fn parse_words(flag: &str, v: &str, words: [(&str, bool); 2]) -> Vec<bool> {
    v.split(',')
        .map(|w| {
            words
                .iter()
                .find(|(name, _)| *name == w.trim())
                .map(|&(_, b)| b)
                .unwrap_or_else(|| {
                    panic!("{flag} {w}: expected {} and/or {}", words[0].0, words[1].0)
                })
        })
        .collect()
}

fn args() -> Args {
    let mut a = Args {
        transport: match std::env::var("VERBSNET_TEST_TRANSPORT").as_deref() {
            Ok("ib") => TransportChoice::Ib,
            _ => TransportChoice::Tcp,
        },
        bursts: 20,
        warmup: 2,
        burst: 256,
        depths: vec![4, 16, 64, 256],
        sizes: vec![8, 4096, 65536],
        repeat: 3,
        modes: vec![false, true],
        credits: vec![true, false],
        csv: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--transport" => {
                a.transport = match v().as_str() {
                    "ib" => TransportChoice::Ib,
                    "tcp" => TransportChoice::Tcp,
                    t => panic!("--transport {t}: expected tcp or ib"),
                }
            }
            "--bursts" => a.bursts = v().parse().expect("--bursts N"),
            "--warmup" => a.warmup = v().parse().expect("--warmup N"),
            "--burst" => a.burst = v().parse().expect("--burst N"),
            "--depths" => a.depths = parse_list(&v()),
            "--sizes" => a.sizes = parse_list(&v()),
            "--repeat" => a.repeat = v().parse::<usize>().expect("--repeat N").max(1),
            "--csv" => a.csv = Some(v()),
            "--modes" => a.modes = parse_words(&k, &v(), [("fixed", false), ("adaptive", true)]),
            "--credits" => a.credits = parse_words(&k, &v(), [("on", true), ("off", false)]),
            // `cargo bench` passes --bench; filters are not supported.
            _ => {}
        }
    }
    a
}

struct Row {
    credits: bool,
    depth: u32,
    min_depth: u32,
    grows: u64,
    size: usize,
    msgs: usize,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    rnr: u64,
    credit_stalls: u64,
    msgs_per_s: f64,
}

fn counter<R: Role>(c: &Comm<R>, name: &str) -> u64 {
    c.counters()
        .iter()
        .find(|(k, _)| *k == name)
        .map_or(0, |(_, v)| *v)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn run(
    a: &Args,
    dev: &Arc<dyn Device>,
    kind: Kind,
    credits: bool,
    (depth, adaptive): (u32, bool),
    size: usize,
) -> Row {
    let base = Config {
        transport: a.transport,
        ..Config::default()
    };
    let send_cfg = Config {
        credits,
        ..base.clone()
    };
    let batch = depth.min(16);
    let min_depth = if adaptive {
        Config::default().rq_min_depth.min(depth)
    } else {
        depth
    };
    let recv_cfg = Config {
        rq_depth: depth,
        rq_min_depth: min_depth,
        rq_batch: batch,
        rq_low_water: (depth - batch).max(1),
        ..base
    };
    let l = connect(dev, kind, &send_cfg, &recv_cfg, 5_000_000).expect("connect");
    let sb = Buf::new(dev, size.max(1)).unwrap();
    let rb = Buf::new(dev, MAX_RECV_REQUESTS * size.max(1)).unwrap();
    let total = a.warmup + a.bursts;
    let n = a.burst;
    let barrier = Barrier::new(2);
    let origin = Instant::now();
    let ns = |t: Instant| t.duration_since(origin).as_nanos() as u64;
    let dev_rnr_before = dev.rnr_counters().rcvd_rnr_err.unwrap_or(0);
    let (wanted, done) = std::thread::scope(|s| {
        let (l, sb, rb, barrier) = (&l, &sb, &rb, &barrier);
        let sender = s.spawn(move || {
            let mut wanted = vec![0u64; total * n];
            let mut pending: Vec<ReqId> = Vec::new();
            for b in 0..total {
                barrier.wait();
                for k in 0..n {
                    wanted[b * n + k] = ns(Instant::now());
                    loop {
                        match l.send.isend(sb.addr(0), size as u64, 0, &sb.mr).unwrap() {
                            Some(h) => {
                                pending.push(h);
                                break;
                            }
                            None => {
                                pending.retain(|&id| l.send.test(id).unwrap().is_none());
                            }
                        }
                    }
                }
                while !pending.is_empty() {
                    pending.retain(|&id| l.send.test(id).unwrap().is_none());
                }
                barrier.wait();
            }
            wanted
        });
        let receiver = s.spawn(move || {
            let mut done = vec![0u64; total * n];
            let mut outstanding = std::collections::VecDeque::new();
            for b in 0..total {
                barrier.wait();
                let (mut posted, mut got) = (0, 0);
                while got < n {
                    while posted < n && outstanding.len() < MAX_RECV_REQUESTS {
                        let slot = posted % MAX_RECV_REQUESTS;
                        let off = slot * size.max(1);
                        match l
                            .recv
                            .irecv(&[(rb.addr(off), size as u64, 0, &rb.mr)])
                            .unwrap()
                        {
                            Some(h) => {
                                outstanding.push_back(h);
                                posted += 1;
                            }
                            None => break,
                        }
                    }
                    while let Some(&id) = outstanding.front() {
                        match l.recv.test(id).unwrap() {
                            Some(_) => {
                                done[b * n + got] = ns(Instant::now());
                                outstanding.pop_front();
                                got += 1;
                            }
                            None => break,
                        }
                    }
                }
                barrier.wait();
            }
            done
        });
        (sender.join().unwrap(), receiver.join().unwrap())
    });
    // Counters cover the whole run, warmup included (2 of 22 bursts by default). The device
    // counters (ib) are device-wide: only their change during this run counts.
    let rnr = counter(&l.send, "rnr_naks_received")
        + dev
            .rnr_counters()
            .rcvd_rnr_err
            .unwrap_or(0)
            .saturating_sub(dev_rnr_before);
    let credit_stalls = counter(&l.send, "credit_stalls");
    let skip = a.warmup * n;
    let mut lat: Vec<f64> = wanted[skip..]
        .iter()
        .zip(&done[skip..])
        .map(|(w, d)| d.saturating_sub(*w) as f64 / 1e3)
        .collect();
    let measured_ns = done[total * n - 1] - wanted[skip];
    lat.sort_by(|x, y| x.partial_cmp(y).unwrap());
    let row = Row {
        credits,
        depth,
        min_depth,
        grows: counter(&l.recv, "rq_grows"),
        size,
        msgs: lat.len(),
        p50_us: percentile(&lat, 0.50),
        p99_us: percentile(&lat, 0.99),
        max_us: *lat.last().unwrap(),
        rnr,
        credit_stalls,
        msgs_per_s: lat.len() as f64 / (measured_ns as f64 / 1e9),
    };
    l.send.close();
    l.recv.close();
    row
}

/// The median run of `runs` for each column (the machine is shared: single runs are noisy);
/// `max` is the largest of all runs, `msgs` their sum.
fn median_row(runs: Vec<Row>) -> Row {
    let med = |f: &dyn Fn(&Row) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(|x, y| x.partial_cmp(y).unwrap());
        v[v.len() / 2]
    };
    Row {
        credits: runs[0].credits,
        depth: runs[0].depth,
        min_depth: runs[0].min_depth,
        grows: med(&|r| r.grows as f64) as u64,
        size: runs[0].size,
        msgs: runs.iter().map(|r| r.msgs).sum(),
        p50_us: med(&|r| r.p50_us),
        p99_us: med(&|r| r.p99_us),
        max_us: runs.iter().map(|r| r.max_us).fold(0.0, f64::max),
        rnr: med(&|r| r.rnr as f64) as u64,
        credit_stalls: med(&|r| r.credit_stalls as f64) as u64,
        msgs_per_s: med(&|r| r.msgs_per_s),
    }
}

fn main() {
    let a = args();
    let probe = Config {
        transport: a.transport,
        ..Config::default()
    };
    let (dev, kind) = match open_device(&probe) {
        Ok(d) => d,
        Err(e) => {
            println!("SKIP credit_study: {e}");
            return;
        }
    };
    let name = dev.props().name;
    println!(
        "# credit study on {name}: {} bursts of {} messages per run ({} warmup bursts not \
         measured), {} runs per configuration (median of the runs; max over all), RNR timer 12 \
         (0.64 ms), RNR retry 7",
        a.bursts, a.burst, a.warmup, a.repeat
    );
    println!();
    println!(
        "| credits | RQ depth | size (B) | p50 (µs) | p99 (µs) | max (µs) | RNR NAKs | credit stalls | rq_grows | msgs/s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for &credits in &a.credits {
        for &depth in &a.depths {
            for &size in &a.sizes {
                for &adaptive in &a.modes {
                    let runs: Vec<Row> = (0..a.repeat)
                        .map(|_| run(&a, &dev, kind, credits, (depth, adaptive), size))
                        .collect();
                    rows.push(median_row(runs));
                    let r = rows.last().expect("just pushed");
                    println!(
                        "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {:.0} |",
                        if r.credits { "on" } else { "off" },
                        if r.min_depth == r.depth {
                            format!("{} fixed", r.depth)
                        } else {
                            format!("{}..{} adaptive", r.min_depth, r.depth)
                        },
                        r.size,
                        r.p50_us,
                        r.p99_us,
                        r.max_us,
                        r.rnr,
                        r.credit_stalls,
                        r.grows,
                        r.msgs_per_s
                    );
                }
            }
        }
    }
    if let Some(path) = &a.csv {
        let mut s = String::from(
            "credits,depth,min_depth,size,msgs,p50_us,p99_us,max_us,rnr,credit_stalls,rq_grows,msgs_per_s\n",
        );
        for r in &rows {
            s.push_str(&format!(
                "{},{},{},{},{},{:.3},{:.3},{:.3},{},{},{},{:.1}\n",
                u8::from(r.credits),
                r.depth,
                r.min_depth,
                r.size,
                r.msgs,
                r.p50_us,
                r.p99_us,
                r.max_us,
                r.rnr,
                r.credit_stalls,
                r.grows,
                r.msgs_per_s
            ));
        }
        std::fs::write(path, s).expect("write --csv file");
    }
}
