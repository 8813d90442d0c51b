//! One rank of `verbsnet-perf stream` and `verbsnet-perf latency`: the point-to-point modes
//! between rank 0 and rank 1, measured and printed as perftest's `ib_send_bw` and
//! `ib_send_lat` print them, over the proxy of [`crate::p2p`].
//!
//! - `stream`: rank 0 sends, rank 1 receives (`--bidir`: both), `-n` messages per size after
//!   `-w` warm-up messages, `--window` in flight. Time: from a barrier to the rank's last
//!   completion, the slower rank's. BW average = bytes / time (both directions summed with
//!   `--bidir`, as perftest's `-b` prints it), MB = 2^20 B (perftest's unit), Gb = 10^9 bit;
//!   MsgRate = messages / time in millions per second.
//! - `latency`: rank 0 sends, rank 1 sends the same size back as soon as it has it; per round
//!   trip half its time on rank 0 (one-way latency, as `ib_send_lat`), then min, max, median
//!   (perftest's "typical"), mean, standard deviation, 99 % and 99.9 % percentiles. Before
//!   the first message each rank times `test` of a pending receive (the call a proxy's idle
//!   pass makes) and the header prints its CPU cost per call (`idle_test_ns` in `--json`).
//! - `--call-times` (both modes): the wall time of every `isend`, `irecv` and `test` of the
//!   timed messages, by what the call did ([`crate::calltimes`]), one line per rank after each
//!   size's row (`call_times` in the row's JSON).
//!
//! After the timed messages each size moves `-c` fully checked messages (every byte); the
//! timed ones check their 8-byte stamps. `#wrong`: messages whose bytes were wrong.

use std::io::Write;
use std::time::Instant;

use serde_json::{json, Value};

use super::{gather_logs, warn_summary, Result, Session, EXIT_WRONG};
use crate::bootstrap::Bootstrap;
use crate::calltimes::CallTimes;
use crate::cli::{Collective, MAX_REQUESTS};
use crate::cputime::{self, CpuUse};
use crate::deviations;
use crate::p2p::{Directions, EndStats, Endpoint, Phase};
use crate::plugin::{Handle, ListenComm};
use crate::stats::{self, RankStats, Work};

/// `NCCL_NET_MAX_REQUESTS` of the v6 ABI (`NCCL_NET_MAX_REQUESTS_V6`).
const MAX_REQUESTS_V6: usize = 8;

/// 2^20: perftest's MB.
const MIB: f64 = 1_048_576.0;

/// One size of `stream`, combined over ranks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StreamRow {
    /// Bytes per message.
    pub size: u64,
    /// Timed messages per direction.
    pub iters: u64,
    /// Directions moving (1, or 2 with `--bidir`).
    pub directions: u64,
    /// Seconds, the slower rank's.
    pub secs: f64,
    /// Wrong messages, summed over ranks (timed and checked).
    pub wrong: u64,
    /// CPU time and run-queue wait per timed message, summed over ranks.
    pub cpu: Option<CpuUse>,
}

impl StreamRow {
    fn messages(&self) -> f64 {
        (self.iters * self.directions) as f64
    }

    /// MB/s (2^20 B), all directions summed.
    pub fn mbps(&self) -> f64 {
        rate(self.messages() * self.size as f64 / MIB, self.secs)
    }

    /// Gb/s (10^9 bit), all directions summed.
    pub fn gbps(&self) -> f64 {
        rate(self.messages() * self.size as f64 * 8.0 / 1e9, self.secs)
    }

    /// Millions of messages per second, all directions summed.
    pub fn mpps(&self) -> f64 {
        rate(self.messages() / 1e6, self.secs)
    }

    fn to_json(self) -> Value {
        json!({
            "size": self.size,
            "iters": self.iters,
            "directions": self.directions,
            "time_us": self.secs * 1e6,
            "bw_MBps": self.mbps(),
            "bw_Gbps": self.gbps(),
            "msg_rate_Mpps": self.mpps(),
            "wrong": self.wrong,
            "cpu_us": self.cpu.map(|c| c.cpu_us),
            "runq_us": self.cpu.map(|c| c.runq_us),
        })
    }
}

/// `test` calls each rank of a `latency` run times on a pending receive before the first
/// message ([`Endpoint::idle_test_ns`]): enough for a stable figure, a few ms of a run.
const IDLE_TEST_CALLS: u32 = 20_000;

fn rate(amount: f64, secs: f64) -> f64 {
    if secs > 0.0 {
        amount / secs
    } else {
        0.0
    }
}

/// One size of `latency` (microseconds, one way = round trip / 2, on rank 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyRow {
    /// Bytes per message.
    pub size: u64,
    /// Timed round trips.
    pub iters: u64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// Median (perftest's "typical").
    pub typical: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation (population).
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Wrong messages, summed over ranks.
    pub wrong: u64,
    /// CPU time and run-queue wait per round trip, summed over ranks.
    pub cpu: Option<CpuUse>,
}

impl LatencyRow {
    /// The row of `samples` (one-way µs, any order; empty gives zeroes).
    pub fn from_samples(size: u64, samples: &mut [f64]) -> LatencyRow {
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let at = |q: f64| {
            if n == 0 {
                0.0
            } else {
                // The smallest sample with at least q of them at or below it.
                samples[((q * n as f64).ceil() as usize).clamp(1, n) - 1]
            }
        };
        let avg = if n == 0 {
            0.0
        } else {
            samples.iter().sum::<f64>() / n as f64
        };
        let var = if n == 0 {
            0.0
        } else {
            samples.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64
        };
        LatencyRow {
            size,
            iters: n as u64,
            min: samples.first().copied().unwrap_or(0.0),
            max: samples.last().copied().unwrap_or(0.0),
            typical: if n == 0 {
                0.0
            } else if n % 2 == 1 {
                samples[n / 2]
            } else {
                (samples[n / 2 - 1] + samples[n / 2]) / 2.0
            },
            avg,
            stdev: var.sqrt(),
            p99: at(0.99),
            p999: at(0.999),
            wrong: 0,
            cpu: None,
        }
    }

    fn to_json(self) -> Value {
        json!({
            "size": self.size,
            "iters": self.iters,
            "t_min_us": self.min,
            "t_max_us": self.max,
            "t_typical_us": self.typical,
            "t_avg_us": self.avg,
            "t_stdev_us": self.stdev,
            "t_99_us": self.p99,
            "t_999_us": self.p999,
            "wrong": self.wrong,
            "cpu_us": self.cpu.map(|c| c.cpu_us),
            "runq_us": self.cpu.map(|c| c.runq_us),
        })
    }
}

/// The column headings of `stream` (perftest's, plus `#wrong`).
pub fn stream_header() -> String {
    format!(
        "# {:>10} {:>12} {:>20} {:>20} {:>14} {:>7}",
        "#bytes",
        "#iterations",
        "BW average[MB/sec]",
        "BW average[Gb/sec]",
        "MsgRate[Mpps]",
        "#wrong"
    )
}

/// One `stream` line.
pub fn format_stream_row(r: &StreamRow) -> String {
    format!(
        "  {:>10} {:>12} {:>20.2} {:>20.4} {:>14.6} {:>7}",
        r.size,
        r.iters,
        r.mbps(),
        r.gbps(),
        r.mpps(),
        r.wrong
    )
}

/// The column headings of `latency` (perftest's, plus `#wrong`).
pub fn latency_header() -> String {
    format!(
        "# {:>10} {:>12} {:>12} {:>12} {:>16} {:>12} {:>14} {:>21} {:>23} {:>7}",
        "#bytes",
        "#iterations",
        "t_min[usec]",
        "t_max[usec]",
        "t_typical[usec]",
        "t_avg[usec]",
        "t_stdev[usec]",
        "99% percentile[usec]",
        "99.9% percentile[usec]",
        "#wrong"
    )
}

/// One `latency` line.
pub fn format_latency_row(r: &LatencyRow) -> String {
    format!(
        "  {:>10} {:>12} {:>12.2} {:>12.2} {:>16.2} {:>12.2} {:>14.2} {:>21.2} {:>23.2} {:>7}",
        r.size, r.iters, r.min, r.max, r.typical, r.avg, r.stdev, r.p99, r.p999, r.wrong
    )
}

/// What one rank sends rank 0 after each size: seconds, wrong messages, CPU and run-queue µs
/// per timed iteration (negative: unknown), then (latency, rank 0 only) the samples.
fn encode(secs: f64, wrong: u64, cpu: Option<CpuUse>) -> Vec<u8> {
    let c = cpu.unwrap_or(CpuUse {
        cpu_us: -1.0,
        runq_us: -1.0,
    });
    json!([secs, wrong, c.cpu_us, c.runq_us])
        .to_string()
        .into_bytes()
}

fn decode(b: &[u8]) -> Option<(f64, u64, Option<CpuUse>)> {
    let v: Value = serde_json::from_slice(b).ok()?;
    let (cpu_us, runq_us) = (v[2].as_f64()?, v[3].as_f64()?);
    Some((
        v[0].as_f64()?,
        v[1].as_u64()?,
        (cpu_us >= 0.0 && runq_us >= 0.0).then_some(CpuUse { cpu_us, runq_us }),
    ))
}

/// The slower rank's time, the summed wrong messages and CPU use (unknown if any rank could
/// not tell).
fn combine(all: &[Vec<u8>]) -> Result<(f64, u64, Option<CpuUse>)> {
    let mut out = (0.0f64, 0u64, Some(CpuUse::default()));
    for b in all {
        let (s, w, c) = decode(b).ok_or("a rank sent a malformed result")?;
        out.0 = out.0.max(s);
        out.1 += w;
        out.2 = match (out.2, c) {
            (Some(a), Some(b)) => Some(a.plus(b)),
            _ => None,
        };
    }
    Ok(out)
}

/// Checks the point-to-point settings against the plugin: the window against the ABI's
/// request limit, the largest size against `maxP2pBytes` (v9+) and `int` sizes (v6-v8).
fn check_limits(s: &Session<'_>, window: usize, largest: u64) -> Result<()> {
    let version = s.net.version();
    let max_requests = if version < 7 {
        MAX_REQUESTS_V6
    } else {
        MAX_REQUESTS
    };
    if window > max_requests {
        return Err(format!(
            "--window {window}: NCCL keeps at most {max_requests} requests per comm with a v{version} \
             table (NCCL_NET_MAX_REQUESTS)"
        )
        .into());
    }
    if let Some(max) = s.props.max_p2p_bytes {
        if largest > max {
            return Err(format!(
                "{largest} B messages: the plugin's maxP2pBytes is {max}; NCCL never sends more \
                 in one isend"
            )
            .into());
        }
    }
    if version < 9 && largest > i32::MAX as u64 {
        return Err(format!("{largest} B messages: ncclNet v{version} sizes are int").into());
    }
    Ok(())
}

/// Runs `stream` or `latency` on this rank; returns the exit code.
///
/// # Errors
/// Plugin, rendezvous or proxy failures.
pub(super) fn run(
    s: &Session<'_>,
    boot: &mut Bootstrap,
    handles: &[Vec<u8>],
    listen: ListenComm<'_>,
) -> Result<i32> {
    let args = s.args;
    let (rank, n) = (s.place.rank, s.place.nranks);
    let mode = args.collective;
    if n != 2 {
        return Err(format!(
            "{mode} runs between exactly 2 ranks; this run has {n} (use --ranks 2)"
        )
        .into());
    }
    let peer = 1 - rank;
    let window = args.window();
    let sizes = args.sizes();
    let largest = sizes.iter().copied().max().unwrap_or(0);
    check_limits(s, window, largest)?;
    let slot = usize::try_from(largest.max(1))?;
    let dirs = match mode {
        Collective::Stream if !args.bidir => Directions {
            send: rank == 0,
            recv: rank == 1,
        },
        _ => Directions {
            send: true,
            recv: true,
        },
    };
    let peer_handle =
        Handle::from_bytes(&handles[peer]).ok_or("a rank sent a handle of the wrong size")?;
    let mut ep = Endpoint::connect(
        s.net,
        s.dev,
        rank,
        peer,
        &peer_handle,
        listen,
        dirs,
        window,
        slot,
    )?;
    ep.set_spin(args.spin);
    if args.debug_corrupt_rank == Some(rank) {
        ep.corrupt_received();
    }
    if let Some(n) = args.debug_stall_recv_after {
        ep.stall_receiving_after(n);
    }
    boot.barrier()?;
    // The ping-pong's ranks both receive: each times its idle `test` while nobody sends.
    let idle_ns: Vec<f64> = if mode == Collective::Latency {
        // -1: the plugin held the receive back ("retry later"), nothing was timed.
        let mine = ep.idle_test_ns(IDLE_TEST_CALLS)?.unwrap_or(-1.0);
        let all = boot.allgather(mine.to_string().as_bytes())?;
        boot.barrier()?;
        all.iter()
            .map(|b| {
                std::str::from_utf8(b)
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(-1.0)
            })
            .collect()
    } else {
        Vec::new()
    };
    // After the idle test, which must not pay for the clock reads.
    s.net.set_call_timing(args.call_times);

    let root = rank == 0;
    let out = std::io::stdout();
    let (warm, iters, check) = (
        u64::from(args.warmup_iters()),
        u64::from(args.iters()),
        u64::from(args.check),
    );
    if root && !args.json {
        let mut o = out.lock();
        writeln!(o, "# verbsnet-perf {mode}: nranks {n} ({})", s.place.source)?;
        let what = match mode {
            Collective::Stream if args.bidir => format!(
                "both ways: each rank sends and receives, {window} messages in flight per \
                 direction; BW and MsgRate are the sum of both directions (perftest -b)"
            ),
            Collective::Stream => format!(
                "one way: rank 0 sends, rank 1 receives; {window} messages in flight, receives \
                 posted ahead"
            ),
            _ => format!(
                "ping-pong: rank 0 sends, rank 1 sends it back; {window} receives posted ahead; \
                 t = round trip / 2"
            ),
        };
        writeln!(o, "#  {what}")?;
        writeln!(
            o,
            "#  minBytes {} maxBytes {} warmup iters: {warm} iters: {iters} validation: {check} \
             (messages with every byte checked) spin: {}; MB = 2^20 B, Gb = 10^9 bit",
            args.min_bytes,
            args.max_bytes(),
            args.spin
        )?;
        s.write_plugin_lines(&mut o)?;
        if !idle_ns.is_empty() {
            let per: Vec<String> = idle_ns
                .iter()
                .enumerate()
                .map(|(r, &ns)| {
                    if ns < 0.0 {
                        format!("rank {r} not timed (irecv answered retry later)")
                    } else {
                        format!("rank {r} {ns:.0} ns")
                    }
                })
                .collect();
            writeln!(
                o,
                "#  idle test() of a pending receive, CPU per call ({IDLE_TEST_CALLS} calls \
                 before any message): {}",
                per.join(", ")
            )?;
        }
        writeln!(o, "#")?;
        let header = if mode == Collective::Stream {
            stream_header()
        } else {
            latency_header()
        };
        writeln!(o, "{header}")?;
        o.flush()?;
    }

    let mut rows = Vec::with_capacity(sizes.len());
    let mut total_wrong = 0;
    for &bytes in &sizes {
        let size = usize::try_from(bytes)?;
        let wrong_before = ep.stats().wrong;
        let (line, row, calls) = if mode == Collective::Stream {
            ep.stream(warm, size, Phase::Stamped)?;
            boot.barrier()?;
            s.net.take_call_times();
            let start = Instant::now();
            let (timed, used) = cputime::measure(|| ep.stream(iters, size, Phase::Stamped));
            timed?;
            let secs = start.elapsed().as_secs_f64();
            let calls = s.net.take_call_times();
            ep.stream(check, size, Phase::Checked)?;
            let wrong = ep.stats().wrong - wrong_before;
            let cpu = used.map(|u| CpuUse::per_iter(u, u32::try_from(iters).unwrap_or(u32::MAX)));
            let (secs, wrong, cpu) = combine(&boot.allgather(&encode(secs, wrong, cpu))?)?;
            let r = StreamRow {
                size: bytes,
                iters,
                directions: if args.bidir { 2 } else { 1 },
                secs,
                wrong,
                cpu,
            };
            total_wrong += wrong;
            (format_stream_row(&r), r.to_json(), calls)
        } else {
            ping_pong(&mut ep, rank, warm, size, Phase::Stamped, None)?;
            boot.barrier()?;
            let mut samples = Vec::with_capacity(if root { iters as usize } else { 0 });
            s.net.take_call_times();
            let (timed, used) = cputime::measure(|| {
                ping_pong(
                    &mut ep,
                    rank,
                    iters,
                    size,
                    Phase::Stamped,
                    Some(&mut samples),
                )
            });
            timed?;
            let calls = s.net.take_call_times();
            ping_pong(&mut ep, rank, check, size, Phase::Checked, None)?;
            let wrong = ep.stats().wrong - wrong_before;
            let cpu = used.map(|u| CpuUse::per_iter(u, u32::try_from(iters).unwrap_or(u32::MAX)));
            let (_, wrong, cpu) = combine(&boot.allgather(&encode(0.0, wrong, cpu))?)?;
            let mut r = LatencyRow::from_samples(bytes, &mut samples);
            r.wrong = wrong;
            r.cpu = cpu;
            total_wrong += wrong;
            (format_latency_row(&r), r.to_json(), calls)
        };
        let print = root && !args.json;
        if print {
            let mut o = out.lock();
            writeln!(o, "{line}")?;
            o.flush()?;
        }
        let unit = if mode == Collective::Stream {
            "message per direction"
        } else {
            "round trip"
        };
        rows.push(with_call_times(
            row,
            (args.call_times, unit),
            &calls,
            iters,
            boot,
            print,
        )?);
    }

    let end = ep.stats();
    ep.close()?;
    let ends: Vec<Value> = boot
        .allgather(end_json(&end).to_string().as_bytes())?
        .iter()
        .map(|b| serde_json::from_slice(b).unwrap_or(Value::Null))
        .collect();
    let messages: u64 = ends.iter().filter_map(|e| e["sent"].as_u64()).sum();
    let stats = s.gather_stats(boot)?;
    let (logs, devs) = gather_logs(boot)?;
    boot.barrier()?;

    if root {
        let mut o = out.lock();
        if args.json {
            let work = work_json(&stats, messages);
            let obj = json!({
                "mode": mode.name(),
                "collective": mode.name(),
                "nranks": n,
                "bidir": args.bidir,
                "window": window,
                "idle_test_ns": (!idle_ns.is_empty()).then_some(&idle_ns),
                "iters": iters,
                "warmup_iters": warm,
                "check": check,
                "spin": args.spin,
                "plugin": s.plugin_json(),
                "transport": std::env::var("VERBSNET_TRANSPORT").ok(),
                "device": s.device_json(),
                "ranks": s.ranks,
                "rows": rows,
                "ends": ends,
                "messages": messages,
                "out_of_bounds": total_wrong,
                "ok": total_wrong == 0,
                "stats": args.stats.then(|| stats.iter().map(RankStats::to_json).collect::<Vec<_>>()),
                "work_per_message": args.stats.then_some(work),
                "plugin_log": logs,
                "deviations": devs,
            });
            writeln!(o, "{obj}")?;
        } else {
            if let Some(line) = warn_summary(&logs) {
                writeln!(o, "{line}")?;
            }
            for line in deviations::lines(&devs) {
                writeln!(o, "{line}")?;
            }
            writeln!(
                o,
                "# Out of bounds values : {total_wrong} {}\n#\n# Point-to-point test concluded: {mode}",
                if total_wrong == 0 { "OK" } else { "FAILED" }
            )?;
            if args.stats {
                write!(o, "{}", stats::format_table(&stats))?;
                write!(o, "{}", stats::format_work(&stats, messages))?;
            }
        }
        o.flush()?;
    }
    Ok(if root && total_wrong > 0 {
        EXIT_WRONG
    } else {
        0
    })
}

/// With `--call-times` (`on`): gathers every rank's [`CallTimes`] of the timed `iters`
/// iterations (`unit`: stream, a message per direction; latency, a round trip), prints one line per
/// rank after the size's row when `print`, and adds them to the row's JSON as `call_times`
/// (one object per rank, in rank order). Returns `row`, unchanged when off.
///
/// # Errors
/// Rendezvous failures, or a rank that sent a malformed record.
fn with_call_times(
    mut row: Value,
    (on, unit): (bool, &str),
    mine: &CallTimes,
    iters: u64,
    boot: &mut Bootstrap,
    print: bool,
) -> Result<Value> {
    if !on {
        return Ok(row);
    }
    let record = json!({"times": mine.to_json(iters), "line": mine.line(iters)});
    let all = boot.allgather(record.to_string().as_bytes())?;
    let mut per_rank = Vec::with_capacity(all.len());
    for (r, b) in all.iter().enumerate() {
        let mut v: Value =
            serde_json::from_slice(b).map_err(|e| format!("rank {r}'s call times: {e}"))?;
        let line = v["line"]
            .as_str()
            .ok_or(format!("rank {r} sent malformed call times"))?;
        if print {
            let mut o = std::io::stdout().lock();
            writeln!(o, "#  plugin calls, rank {r}, per {unit}: {line}")?;
            o.flush()?;
        }
        per_rank.push(v["times"].take());
    }
    row["call_times"] = Value::Array(per_rank);
    Ok(row)
}

/// `k` round trips of `size` bytes: rank 0 sends and waits for the answer (recording half of
/// each round trip in `samples`, µs), rank 1 answers each message it receives; then every
/// send is waited for.
fn ping_pong(
    ep: &mut Endpoint<'_>,
    rank: usize,
    k: u64,
    size: usize,
    phase: Phase,
    mut samples: Option<&mut Vec<f64>>,
) -> Result<()> {
    let first = ep.recvs_done();
    let rx_end = first + k;
    for i in 1..=k {
        // Message i-1 of the peer is in once `first + i` receives are done.
        if rank == 0 {
            let start = Instant::now();
            ep.send_one(size, phase, rx_end)?;
            ep.recv_until(first + i, size, phase, rx_end)?;
            if let Some(s) = samples.as_deref_mut() {
                s.push(start.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
        } else {
            ep.recv_until(first + i, size, phase, rx_end)?;
            ep.send_one(size, phase, rx_end)?;
        }
    }
    ep.finish_sends(size, phase)
}

fn end_json(e: &EndStats) -> Value {
    json!({
        "sent": e.sent,
        "received": e.received,
        "wrong": e.wrong,
        "isend_retries": e.isend_retries,
    })
}

/// `--json`'s `work_per_message`: per rank and both together (see [`Work`]).
fn work_json(stats: &[RankStats], messages: u64) -> Value {
    let per: Vec<(usize, Work)> = stats
        .iter()
        .filter(|r| r.records > 0)
        .map(|r| (r.rank, Work::of(r).per(messages)))
        .collect();
    let both = per.iter().map(|(_, w)| *w).reduce(Work::plus);
    json!({
        "messages": messages,
        "ranks": per.iter().map(|(r, w)| {
            let mut v = w.to_json();
            v["rank"] = json!(r);
            v
        }).collect::<Vec<_>>(),
        "both": both.map(|w| w.to_json()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_statistics_follow_perftest() {
        let mut xs: Vec<f64> = (1..=1000).rev().map(f64::from).collect();
        let r = LatencyRow::from_samples(8, &mut xs);
        assert_eq!((r.min, r.max, r.iters), (1.0, 1000.0, 1000));
        assert_eq!(r.typical, 500.5);
        assert_eq!(r.avg, 500.5);
        assert_eq!(r.p99, 990.0);
        assert_eq!(r.p999, 999.0);
        assert!((r.stdev - 288.67499).abs() < 1e-3, "{}", r.stdev);
        let r = LatencyRow::from_samples(8, &mut [3.0, 1.0, 2.0]);
        assert_eq!((r.typical, r.p99), (2.0, 3.0));
        let r = LatencyRow::from_samples(8, &mut []);
        assert_eq!((r.iters, r.avg, r.p99), (0, 0.0, 0.0));
    }

    #[test]
    fn stream_rates_use_perftest_units() {
        let r = StreamRow {
            size: 1 << 20,
            iters: 100,
            directions: 1,
            secs: 0.5,
            wrong: 0,
            cpu: None,
        };
        assert_eq!(r.mbps(), 200.0);
        assert!((r.gbps() - 100.0 * 1048576.0 * 8.0 / 1e9 / 0.5).abs() < 1e-9);
        assert!((r.mpps() - 0.0002).abs() < 1e-12);
        let both = StreamRow { directions: 2, ..r };
        assert_eq!(both.mbps(), 400.0);
        let line = format_stream_row(&r);
        assert_eq!(
            line.split_whitespace().collect::<Vec<_>>(),
            ["1048576", "100", "200.00", "1.6777", "0.000200", "0"]
        );
        let h = stream_header();
        assert!(h.starts_with('#'));
        for col in [
            "#bytes",
            "#iterations",
            "BW average[MB/sec]",
            "BW average[Gb/sec]",
        ] {
            assert!(h.contains(col), "{h}");
        }
        assert!(latency_header().contains("t_typical[usec]"));
    }

    #[test]
    fn results_travel_and_combine() {
        let a = encode(
            2.0,
            1,
            Some(CpuUse {
                cpu_us: 1.0,
                runq_us: 0.5,
            }),
        );
        let b = encode(3.0, 2, None);
        assert_eq!(decode(&a).map(|d| d.0), Some(2.0));
        let (s, w, c) = combine(&[a.clone(), a.clone()]).unwrap();
        assert_eq!((s, w), (2.0, 2));
        assert_eq!(
            c,
            Some(CpuUse {
                cpu_us: 2.0,
                runq_us: 1.0
            })
        );
        let (s, w, c) = combine(&[a, b]).unwrap();
        assert_eq!((s, w, c), (3.0, 3, None));
        assert!(combine(&[b"[1]".to_vec()]).is_err());
    }
}
