//! Receive-memory scaling: registered (pinned) bytes and RSS per connection for N idle
//! connections, fixed depth (`VERBSNET_RQ_MIN_DEPTH` = `VERBSNET_RQ_DEPTH`, the only mode
//! before adaptive depth) against adaptive depth (the defaults), and what a burst on some of
//! them grows the pool to. Loopback tcp by default (`VERBSNET_TEST_TRANSPORT=ib` on a verbs
//! device). Prints a markdown table; asserts nothing about the numbers.
//!
//! ```sh
//! cargo bench --bench rx_scaling -- [--comms 1,16,256,1024] [--busy 16]
//! ```
//!
//! - `registered/conn`: the comms' own counter `pinned_bytes` (send + receive side) summed and
//!   divided by N: bytes handed to `reg_mr`.
//! - `pages/conn`: the same in whole 4 KiB pages, as the kernel pins them (each comm registers
//!   its buffers as one region).
//! - `RSS/conn`: growth of the process's VmRSS while the N connections were made, per
//!   connection (includes the sockets' and the comms' own heap, not only registered memory).
//! - after a burst of 4096 eager messages on each of `--busy` of the connections: the depth
//!   they reached and the pool's registered bytes.
use std::sync::Arc;

use nccl_net_verbsnet::comm::{Comm, Role};
use nccl_net_verbsnet::config::{Config, TransportChoice};
use nccl_net_verbsnet::testkit::{connect, open_device, Buf, Link};
use nccl_net_verbsnet::transport::{Device, Kind};

fn counter<R: Role>(c: &Comm<R>, name: &str) -> u64 {
    c.counters()
        .iter()
        .find(|(k, _)| *k == name)
        .map_or(0, |(_, v)| *v)
}

fn vm_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn pages(n: u64) -> u64 {
    n.div_ceil(4096) * 4096
}

/// Bytes the comms of `links` registered, summed; and the same in whole pages per buffer.
fn registered(links: &[Link], cfg: &Config) -> (u64, u64) {
    use nccl_net_verbsnet::engine::wire::{CTS_ENTRY_LEN, EAGER_HDR_LEN, REC_REGION_LEN};
    use nccl_net_verbsnet::engine::{CTRL_STAGE_SLOTS, CTS_RING_ENTRIES, MAX_SEND_REQUESTS};
    let bytes: u64 = links
        .iter()
        .map(|l| counter(&l.send, "pinned_bytes") + counter(&l.recv, "pinned_bytes"))
        .sum();
    // The same buffers as comm/buffers.rs SendBuffers / RecvBuffers register them.
    let stride = (EAGER_HDR_LEN + cfg.eager_buf_size as usize) as u64;
    let min = u64::from(cfg.rq_min_depth.min(cfg.rq_depth));
    let send = [
        (MAX_SEND_REQUESTS * EAGER_HDR_LEN) as u64,
        (MAX_SEND_REQUESTS * 8) as u64,
        (CTS_RING_ENTRIES * CTS_ENTRY_LEN) as u64,
        8,
    ];
    let recv = [
        min * stride,
        REC_REGION_LEN as u64,
        (CTRL_STAGE_SLOTS * CTS_ENTRY_LEN) as u64,
    ];
    // One registration per comm and side (`Mr::alloc_parts`), parts on 64-byte boundaries.
    let whole = |parts: &[u64]| pages(parts.iter().map(|&n| n.next_multiple_of(64)).sum());
    let per = whole(&send) + whole(&recv);
    (bytes, per * links.len() as u64)
}

fn burst(l: &Link, dev: &Arc<dyn Device>, n: usize) {
    let sb = Buf::new(dev, 4096).unwrap();
    let rb = Buf::new(dev, 32 * 4096).unwrap();
    let mut posted = std::collections::VecDeque::new();
    let (mut sent, mut got, mut next) = (0usize, 0usize, 0usize);
    let mut sends = Vec::new();
    while got < n {
        while next < n && posted.len() < 32 {
            let off = (next % 32) * 4096;
            match l.recv.irecv(&[(rb.addr(off), 4096, 0, &rb.mr)]).unwrap() {
                Some(h) => {
                    posted.push_back(h);
                    next += 1;
                }
                None => break,
            }
        }
        while sent < n {
            match l.send.isend(sb.addr(0), 4096, 0, &sb.mr).unwrap() {
                Some(h) => {
                    sends.push(h);
                    sent += 1;
                }
                None => break,
            }
        }
        sends.retain(|&id| l.send.test(id).unwrap().is_none());
        if let Some(&id) = posted.front() {
            if l.recv.test(id).unwrap().is_some() {
                posted.pop_front();
                got += 1;
            }
        }
    }
    while !sends.is_empty() {
        sends.retain(|&id| l.send.test(id).unwrap().is_none());
        l.recv.progress().unwrap();
    }
}

fn main() {
    let mut comms: Vec<usize> = vec![1, 16, 256, 1024];
    let mut busy = 16usize;
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        match k.as_str() {
            "--comms" => {
                comms = it
                    .next()
                    .expect("--comms N,N")
                    .split(',')
                    .map(|x| x.trim().parse().expect("a number"))
                    .collect()
            }
            "--busy" => busy = it.next().expect("--busy N").parse().expect("a number"),
            _ => {}
        }
    }
    let transport = match std::env::var("VERBSNET_TEST_TRANSPORT").as_deref() {
        Ok("ib") => TransportChoice::Ib,
        _ => TransportChoice::Tcp,
    };
    // Sockets: two per connection, plus the listeners while connecting.
    let _ =
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 20_000, 20_000);
    let base = Config {
        transport,
        ..Config::default()
    };
    let (dev, kind): (Arc<dyn Device>, Kind) = match open_device(&base) {
        Ok(d) => d,
        Err(e) => {
            println!("SKIP rx_scaling: {e}");
            return;
        }
    };
    println!(
        "# receive-memory scaling on {}: N idle connections (send + receive comm each), eager \
         buffers of {} B, RQ depth {}",
        dev.props().name,
        base.eager_buf_size,
        base.rq_depth
    );
    println!();
    println!(
        "| mode | N | registered/conn (B) | pages/conn (B) | RSS/conn (KiB) | total registered (MiB) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, min) in [
        ("fixed 128", base.rq_depth),
        ("adaptive 2..128", base.rq_min_depth),
    ] {
        let cfg = Config {
            rq_min_depth: min,
            ..base.clone()
        };
        for &n in &comms {
            let rss0 = vm_rss_kib();
            let links: Vec<Link> = (0..n)
                .map(|_| connect(&dev, kind, &cfg, &cfg, 5_000_000).expect("connect"))
                .collect();
            let rss1 = vm_rss_kib();
            let (bytes, paged) = registered(&links, &cfg);
            println!(
                "| {name} | {n} | {} | {} | {:.1} | {:.1} |",
                bytes / n as u64,
                paged / n as u64,
                rss1.saturating_sub(rss0) as f64 / n as f64,
                bytes as f64 / (1u64 << 20) as f64
            );
            if n == *comms.iter().max().unwrap() && busy > 0 {
                for l in links.iter().take(busy) {
                    burst(l, &dev, 4096);
                }
                let depth: Vec<u64> = links
                    .iter()
                    .take(busy)
                    .map(|l| counter(&l.recv, "rq_depth"))
                    .collect();
                let (bytes, _) = registered(&links, &cfg);
                let stalls: u64 = links
                    .iter()
                    .take(busy)
                    .map(|l| counter(&l.send, "credit_stalls"))
                    .sum();
                let rnr: u64 = links
                    .iter()
                    .map(|l| counter(&l.send, "rnr_naks_received"))
                    .sum();
                println!(
                    "|   after a 4096-message burst on {busy} of them | {n} | {} | | | {:.1} |",
                    bytes / n as u64,
                    bytes as f64 / (1u64 << 20) as f64
                );
                eprintln!(
                    "# {name}: busy depths {:?}; credit stalls {stalls}; RNR NAKs {rnr}",
                    depth
                );
            }
            for l in links {
                l.send.close();
                l.recv.close();
            }
        }
    }
}
