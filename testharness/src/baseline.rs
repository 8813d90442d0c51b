//! `--baseline tcp`: the same ranks stream the same bytes over a plain TCP ring, for a
//! reference measured in the same run as the plugin.
//!
//! After the plugin sweep each rank listens on the address it reaches rank 0 from (so the
//! address family and host are those of the bootstrap; `127.0.0.1` in `--ranks N` mode),
//! the ranks exchange those addresses through the rendezvous, and rank r connects a
//! [`std::net::TcpStream`] to rank r+1 and accepts one from rank r-1. The streams are plain:
//! blocking, default socket buffers (kernel autotuning), `TCP_NODELAY` on.
//!
//! Per size, one iteration moves exactly the bytes the collective's plan moves over each ring
//! link (the sum of its sends to the successor and of its receives from the predecessor; for
//! sendrecv the message itself) as one continuous stream: a writer thread `write_all`s the
//! input in pieces of at most `--chunk` bytes while the rank's main thread `read_exact`s from
//! the predecessor into the output, also in pieces of at most `--chunk`. No reduction, no
//! per-piece dependency: for the collectives other than sendrecv it is an upper bound of what
//! the ring could do over TCP, not the same algorithm. Warm-up and timed iteration counts are
//! those of the plugin run; time is the mean per timed iteration, the maximum over ranks; the
//! bytes of the last iteration are checked.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::bootstrap::Bootstrap;
use crate::cputime::{CpuUse, Sched};

/// Errors of the baseline.
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// How long ring setup may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(120);

/// A read or write that makes no progress for this long fails the baseline.
const IO_TIMEOUT: Duration = Duration::from_secs(120);

/// The plain TCP ring of one rank.
pub struct TcpRing {
    rank: usize,
    prev: usize,
    /// To rank+1.
    next_stream: TcpStream,
    /// From rank-1.
    prev_stream: TcpStream,
    /// The address the ring listened on (for the header and JSON).
    addr: SocketAddr,
}

/// One rank's baseline result for one size: microseconds per timed iteration, wrong bytes in
/// the last iteration, CPU use of both threads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankResult {
    /// Mean time per timed iteration.
    pub time_us: f64,
    /// Bytes of the last received stream that differ from the predecessor's input.
    pub wrong: u64,
    /// CPU time and run-queue wait per timed iteration, reader and writer thread together.
    pub cpu: Option<CpuUse>,
}

impl TcpRing {
    /// Builds the ring: listen, exchange addresses, connect to rank+1, accept from rank-1.
    ///
    /// # Errors
    /// Socket or rendezvous failures, or a peer that is not rank-1.
    pub fn connect(boot: &mut Bootstrap, rank: usize, nranks: usize) -> Result<TcpRing> {
        let ip = boot.local_ip().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let listener =
            TcpListener::bind((ip, 0)).map_err(|e| format!("baseline: listen on {ip}: {e}"))?;
        let addr = listener.local_addr()?;
        let addrs = boot.allgather(addr.to_string().as_bytes())?;
        let next = (rank + 1) % nranks;
        let prev = (rank + nranks - 1) % nranks;
        let next_addr: SocketAddr = std::str::from_utf8(&addrs[next])?
            .parse()
            .map_err(|e| format!("baseline: rank {next} sent a bad address: {e}"))?;
        // A connect completes from the listen backlog, before the peer accepts: connecting
        // first and accepting second cannot deadlock around the ring.
        let mut next_stream = TcpStream::connect_timeout(&next_addr, SETUP_TIMEOUT)
            .map_err(|e| format!("baseline: connect to rank {next} at {next_addr}: {e}"))?;
        next_stream.set_nodelay(true)?;
        next_stream.write_all(&(rank as u32).to_le_bytes())?;
        listener.set_nonblocking(true)?;
        let start = Instant::now();
        let mut prev_stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if start.elapsed() > SETUP_TIMEOUT {
                        return Err(format!(
                            "baseline: rank {prev} did not connect within {SETUP_TIMEOUT:?}"
                        )
                        .into());
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(e.into()),
            }
        };
        prev_stream.set_nonblocking(false)?;
        prev_stream.set_nodelay(true)?;
        prev_stream.set_read_timeout(Some(SETUP_TIMEOUT))?;
        let mut hello = [0u8; 4];
        prev_stream.read_exact(&mut hello)?;
        let who = u32::from_le_bytes(hello) as usize;
        if who != prev {
            return Err(
                format!("baseline: expected rank {prev} to connect, got rank {who}").into(),
            );
        }
        for s in [&next_stream, &prev_stream] {
            s.set_read_timeout(Some(IO_TIMEOUT))?;
            s.set_write_timeout(Some(IO_TIMEOUT))?;
        }
        Ok(TcpRing {
            rank,
            prev,
            next_stream,
            prev_stream,
            addr,
        })
    }

    /// The address this rank's ring listener had.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Streams `send_bytes` to rank+1 and `recv_bytes` from rank-1 per iteration: `warmup`
    /// untimed iterations, a barrier, then `iters` timed ones, in pieces of at most `io_max`
    /// bytes per call.
    ///
    /// # Errors
    /// Socket errors or timeouts.
    pub fn measure(
        &mut self,
        boot: &mut Bootstrap,
        send_bytes: usize,
        recv_bytes: usize,
        warmup: u32,
        iters: u32,
        io_max: usize,
    ) -> Result<RankResult> {
        let input = pattern(self.rank, send_bytes);
        let mut output = vec![0u8; recv_bytes];
        let io_max = io_max.max(1);
        self.stream(&input, &mut output, warmup, io_max)?;
        boot.barrier()?;
        let start = Instant::now();
        let used = self.stream(&input, &mut output, iters, io_max)?;
        let time_us = start.elapsed().as_secs_f64() * 1e6 / f64::from(iters.max(1));
        let expected = pattern(self.prev, recv_bytes);
        let wrong = if iters > 0 {
            output.iter().zip(&expected).filter(|(a, b)| a != b).count() as u64
        } else {
            0
        };
        Ok(RankResult {
            time_us,
            wrong,
            cpu: used.map(|u| CpuUse::per_iter(u, iters)),
        })
    }

    /// `iters` times: write `input` to rank+1 (a second thread) while reading `output` from
    /// rank-1. Returns the CPU use of both threads (unknown if either cannot tell).
    fn stream(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        iters: u32,
        io_max: usize,
    ) -> Result<Option<Sched>> {
        if iters == 0 || (input.is_empty() && output.is_empty()) {
            return Ok(Some(Sched::default()));
        }
        let next = &mut self.next_stream;
        let prev = &mut self.prev_stream;
        std::thread::scope(|s| -> Result<Option<Sched>> {
            let writer = s.spawn(move || -> (io::Result<()>, Option<Sched>) {
                crate::cputime::measure(|| -> io::Result<()> {
                    for _ in 0..iters {
                        for piece in input.chunks(io_max) {
                            next.write_all(piece)?;
                        }
                    }
                    Ok(())
                })
            });
            let (r, read_used) = crate::cputime::measure(|| -> io::Result<()> {
                for _ in 0..iters {
                    for piece in output.chunks_mut(io_max) {
                        prev.read_exact(piece)?;
                    }
                }
                Ok(())
            });
            let (w, write_used) = writer
                .join()
                .map_err(|_| "baseline: the writer thread panicked")?;
            r.map_err(|e| format!("baseline: reading from rank {}: {e}", self.prev))?;
            w.map_err(|e| format!("baseline: writing to rank {}: {e}", (self.rank + 1)))?;
            Ok(match (read_used, write_used) {
                (Some(a), Some(b)) => Some(a.plus(b)),
                _ => None,
            })
        })
    }
}

/// Deterministic bytes of `rank`'s baseline input.
fn pattern(rank: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i % 251) as u8).wrapping_add((rank as u8).wrapping_mul(37)) ^ 0x5A)
        .collect()
}

/// Combines per-rank results: the slowest rank's time, wrong bytes and CPU use summed.
pub fn combine(all: &[RankResult]) -> RankResult {
    all.iter().fold(
        RankResult {
            time_us: 0.0,
            wrong: 0,
            cpu: (!all.is_empty()).then(CpuUse::default),
        },
        |acc, r| RankResult {
            time_us: acc.time_us.max(r.time_us),
            wrong: acc.wrong + r.wrong,
            cpu: match (acc.cpu, r.cpu) {
                (Some(a), Some(b)) => Some(a.plus(b)),
                _ => None,
            },
        },
    )
}

/// Wire form of a [`RankResult`] for the rendezvous all-gather (CPU figures negative when
/// unknown).
pub fn encode(r: &RankResult) -> Vec<u8> {
    let mut v = r.time_us.to_le_bytes().to_vec();
    v.extend_from_slice(&r.wrong.to_le_bytes());
    let c = r.cpu.unwrap_or(CpuUse {
        cpu_us: -1.0,
        runq_us: -1.0,
    });
    v.extend_from_slice(&c.cpu_us.to_le_bytes());
    v.extend_from_slice(&c.runq_us.to_le_bytes());
    v
}

/// Inverse of [`encode`].
pub fn decode(b: &[u8]) -> Option<RankResult> {
    if b.len() != 32 {
        return None;
    }
    let f = |o: usize| -> Option<f64> { Some(f64::from_le_bytes(b[o..o + 8].try_into().ok()?)) };
    let (cpu_us, runq_us) = (f(16)?, f(24)?);
    Some(RankResult {
        time_us: f(0)?,
        wrong: u64::from_le_bytes(b[8..16].try_into().ok()?),
        cpu: (cpu_us >= 0.0 && runq_us >= 0.0).then_some(CpuUse { cpu_us, runq_us }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::{run_ranks, Placement};

    #[test]
    fn results_round_trip_and_combine() {
        let a = RankResult {
            time_us: 12.5,
            wrong: 0,
            cpu: Some(CpuUse {
                cpu_us: 3.0,
                runq_us: 0.5,
            }),
        };
        let b = RankResult {
            time_us: 20.0,
            wrong: 3,
            cpu: Some(CpuUse {
                cpu_us: 4.0,
                runq_us: 0.0,
            }),
        };
        assert_eq!(decode(&encode(&a)), Some(a));
        assert_eq!(decode(&encode(&a)[1..]), None);
        let unknown = RankResult { cpu: None, ..b };
        assert_eq!(decode(&encode(&unknown)), Some(unknown));
        assert_eq!(
            combine(&[a, b]),
            RankResult {
                time_us: 20.0,
                wrong: 3,
                cpu: Some(CpuUse {
                    cpu_us: 7.0,
                    runq_us: 0.5
                }),
            }
        );
        assert_eq!(combine(&[a, unknown]).cpu, None);
        assert_ne!(pattern(0, 300), pattern(1, 300));
    }

    #[test]
    fn a_ring_of_three_threads_streams_and_checks() {
        let n = 3;
        let results = run_ranks(n, move |rank, boot| {
            let mut ring = TcpRing::connect(boot, rank, n).unwrap();
            assert!(ring.addr().ip().is_loopback());
            let r = ring.measure(boot, 100_000, 100_000, 1, 2, 4096).unwrap();
            let z = ring.measure(boot, 0, 0, 1, 1, 4096).unwrap();
            (r, z)
        });
        for (r, z) in results {
            assert_eq!(r.wrong, 0);
            assert!(r.time_us > 0.0 && r.time_us.is_finite());
            assert_eq!(z.wrong, 0);
        }
    }

    #[test]
    fn a_single_rank_rings_to_itself() {
        let p = Placement {
            rank: 0,
            nranks: 1,
            master: None,
            source: "test",
        };
        let mut boot = Bootstrap::connect(&p, Duration::from_secs(5)).unwrap();
        let mut ring = TcpRing::connect(&mut boot, 0, 1).unwrap();
        let r = ring.measure(&mut boot, 10_000, 10_000, 0, 3, 1000).unwrap();
        assert_eq!(r.wrong, 0);
    }
}
