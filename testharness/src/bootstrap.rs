//! How ranks find each other: launcher variables, and a small TCP rendezvous served by rank 0
//! (a star: every rank keeps one connection to rank 0, which relays all-gathers).
//!
//! Wire format: frames of `u64 little-endian length` + bytes. A rank's first frame is its
//! hello (`magic "VNPF"`, `u32 rank`, `u32 nranks`, little-endian). An all-gather is one frame
//! from each rank to rank 0 and one frame back holding every rank's bytes, each prefixed by its
//! `u64` length, in rank order.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Where this rank is, and how to reach rank 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub nranks: usize,
    /// `host:port` of the rendezvous (`None` only when `nranks == 1`).
    pub master: Option<String>,
    /// Where rank and size came from, for the header.
    pub source: &'static str,
}

/// Launcher variables for (rank, size), checked in this order.
pub const LAUNCHERS: [(&str, &str, &str); 4] = [
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"),
    ("PMI_RANK", "PMI_SIZE", "PMI"),
    ("SLURM_PROCID", "SLURM_NTASKS", "Slurm"),
    ("RANK", "WORLD_SIZE", "torchrun"),
];

/// Works out the placement from flags (`--rank/--nranks/--master`) and, failing those, from
/// launcher variables read through `get`; with neither, a single rank.
///
/// # Errors
/// Unparsable variables, a rank not below the size, or several ranks and no master address.
pub fn placement(
    rank: Option<usize>,
    nranks: Option<usize>,
    master: Option<&str>,
    get: impl Fn(&str) -> Option<String>,
) -> Result<Placement, String> {
    let (rank, nranks, source) = match (rank, nranks) {
        (Some(r), Some(n)) => (r, n, "flags"),
        _ => {
            let mut found = None;
            for (rv, sv, name) in LAUNCHERS {
                if let (Some(r), Some(s)) = (get(rv), get(sv)) {
                    let r: usize = r.trim().parse().map_err(|e| format!("{rv}={r:?}: {e}"))?;
                    let s: usize = s.trim().parse().map_err(|e| format!("{sv}={s:?}: {e}"))?;
                    found = Some((r, s, name));
                    break;
                }
            }
            found.unwrap_or((0, 1, "single process"))
        }
    };
    if nranks == 0 || rank >= nranks {
        return Err(format!(
            "rank {rank} of {nranks} ({source}) is out of range"
        ));
    }
    let master = match master {
        Some(m) => Some(m.to_string()),
        None => match (get("MASTER_ADDR"), get("MASTER_PORT")) {
            (Some(a), Some(p)) => Some(format!("{a}:{p}")),
            _ => None,
        },
    };
    if nranks > 1 && master.is_none() {
        return Err(format!(
            "{nranks} ranks ({source}) but no rendezvous address: pass --master host:port \
             or set MASTER_ADDR and MASTER_PORT"
        ));
    }
    Ok(Placement {
        rank,
        nranks,
        master,
        source,
    })
}

const MAGIC: &[u8; 4] = b"VNPF";
/// Largest frame accepted (guards against talking to something that is not a rank).
const MAX_FRAME: u64 = 1 << 30;

/// A connected rendezvous.
pub struct Bootstrap {
    rank: usize,
    nranks: usize,
    /// Rank 0: the stream of rank i at index i-1. Other ranks: the stream to rank 0.
    streams: Vec<TcpStream>,
}

impl Bootstrap {
    /// Rank 0 serves `master`, the others connect to it (retrying until `timeout`).
    ///
    /// # Errors
    /// Socket errors, a wrong hello, or ranks missing at `timeout`.
    pub fn connect(p: &Placement, timeout: Duration) -> io::Result<Bootstrap> {
        let mut streams = Vec::new();
        if p.nranks > 1 {
            let master = p.master.as_deref().unwrap_or_default();
            if p.rank == 0 {
                streams = serve(master, p.nranks, timeout)?;
            } else {
                streams.push(join(master, p.rank, p.nranks, timeout)?);
            }
        }
        Ok(Bootstrap {
            rank: p.rank,
            nranks: p.nranks,
            streams,
        })
    }

    /// Every rank's `data`, in rank order.
    ///
    /// # Errors
    /// Socket errors (e.g. a rank died).
    pub fn allgather(&mut self, data: &[u8]) -> io::Result<Vec<Vec<u8>>> {
        if self.nranks == 1 {
            return Ok(vec![data.to_vec()]);
        }
        if self.rank != 0 {
            write_frame(&mut self.streams[0], data)?;
            let all = read_frame(&mut self.streams[0])?;
            return split_all(&all, self.nranks);
        }
        let mut parts = vec![data.to_vec()];
        for (i, s) in self.streams.iter_mut().enumerate() {
            parts.push(read_frame(s).map_err(|e| context(e, &format!("rank {}", i + 1)))?);
        }
        let all = join_all(&parts);
        for (i, s) in self.streams.iter_mut().enumerate() {
            write_frame(s, &all).map_err(|e| context(e, &format!("rank {}", i + 1)))?;
        }
        Ok(parts)
    }

    /// This rank's address on its rendezvous connection (the address the other ranks reach it
    /// by, as far as this rank can tell); `None` for a single rank.
    pub fn local_ip(&self) -> Option<IpAddr> {
        self.streams
            .first()
            .and_then(|s| s.local_addr().ok())
            .map(|a| a.ip())
    }

    /// Returns when every rank has called it.
    ///
    /// # Errors
    /// Socket errors.
    pub fn barrier(&mut self) -> io::Result<()> {
        self.allgather(&[]).map(|_| ())
    }
}

fn context(e: io::Error, who: &str) -> io::Error {
    io::Error::new(e.kind(), format!("bootstrap connection to {who}: {e}"))
}

fn resolve(master: &str) -> io::Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = master
        .to_socket_addrs()
        .map_err(|e| io::Error::new(e.kind(), format!("master address {master:?}: {e}")))?
        .collect();
    if addrs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("master address {master:?} resolves to nothing"),
        ));
    }
    Ok(addrs)
}

/// The environment variable through which `verbsnet-perf --ranks N` hands rank 0 the already
/// bound rendezvous listener (its descriptor number), so the port cannot be taken between the
/// launcher choosing it and rank 0 listening on it.
/// Not `VERBSNET_*`: the plugin warns about unknown variables of its own prefix.
pub const LISTEN_FD_ENV: &str = "VNPERF_LISTEN_FD";

fn serve(master: &str, nranks: usize, timeout: Duration) -> io::Result<Vec<TcpStream>> {
    let addrs = resolve(master)?;
    // The launcher's listener if it passed one; else prefer the given address and, if it is not
    // local (e.g. a name resolving elsewhere), listen on every interface at that port.
    let listener = match crate::fdpass::inherited_listener(LISTEN_FD_ENV, addrs[0].port()) {
        Some(l) => l,
        None => match TcpListener::bind(&addrs[..]) {
            Ok(l) => l,
            Err(_) => TcpListener::bind(("0.0.0.0", addrs[0].port()))
                .map_err(|e| io::Error::new(e.kind(), format!("listen on {master}: {e}")))?,
        },
    };
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + timeout;
    let mut slots: Vec<Option<TcpStream>> = (1..nranks).map(|_| None).collect();
    let mut missing = nranks - 1;
    while missing > 0 {
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false)?;
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(timeout))?;
                let hello = read_frame(&mut s)?;
                s.set_read_timeout(None)?;
                let (r, n) = parse_hello(&hello)?;
                if n != nranks {
                    return Err(bad(format!(
                        "rank {r} says nranks {n}, rank 0 has {nranks}"
                    )));
                }
                if r == 0 || r >= nranks || slots[r - 1].is_some() {
                    return Err(bad(format!(
                        "unexpected or duplicate rank {r} in the rendezvous"
                    )));
                }
                slots[r - 1] = Some(s);
                missing -= 1;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    let absent: Vec<String> = slots
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| s.is_none())
                        .map(|(i, _)| (i + 1).to_string())
                        .collect();
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "rendezvous on {master}: ranks {} did not join within {:?}",
                            absent.join(","),
                            timeout
                        ),
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(slots.into_iter().flatten().collect())
}

fn join(master: &str, rank: usize, nranks: usize, timeout: Duration) -> io::Result<TcpStream> {
    let addrs = resolve(master)?;
    let deadline = Instant::now() + timeout;
    let mut s = loop {
        match TcpStream::connect(&addrs[..]) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("rank {rank}: cannot reach rank 0 at {master} within {timeout:?}: {e}"),
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    s.set_nodelay(true)?;
    write_frame(&mut s, &hello(rank, nranks))?;
    Ok(s)
}

fn hello(rank: usize, nranks: usize) -> Vec<u8> {
    let mut h = MAGIC.to_vec();
    h.extend_from_slice(&(rank as u32).to_le_bytes());
    h.extend_from_slice(&(nranks as u32).to_le_bytes());
    h
}

fn parse_hello(h: &[u8]) -> io::Result<(usize, usize)> {
    if h.len() != 12 || &h[..4] != MAGIC {
        return Err(bad(
            "a peer that is not a verbsnet-perf rank joined the rendezvous".into(),
        ));
    }
    let r = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes"));
    let n = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
    Ok((r as usize, n as usize))
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn write_frame(s: &mut impl Write, data: &[u8]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(8 + data.len());
    buf.extend_from_slice(&(data.len() as u64).to_le_bytes());
    buf.extend_from_slice(data);
    s.write_all(&buf)?;
    s.flush()
}

fn read_frame(s: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 8];
    s.read_exact(&mut len).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::new(
                e.kind(),
                "peer closed the bootstrap connection (rank exited?)",
            )
        } else {
            e
        }
    })?;
    let len = u64::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(bad(format!("bootstrap frame of {len} bytes")));
    }
    let mut data = vec![0u8; len as usize];
    s.read_exact(&mut data)?;
    Ok(data)
}

fn join_all(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut all = Vec::new();
    for p in parts {
        all.extend_from_slice(&(p.len() as u64).to_le_bytes());
        all.extend_from_slice(p);
    }
    all
}

fn split_all(mut all: &[u8], n: usize) -> io::Result<Vec<Vec<u8>>> {
    let mut parts = Vec::with_capacity(n);
    for _ in 0..n {
        if all.len() < 8 {
            return Err(bad("truncated all-gather frame".into()));
        }
        let len = u64::from_le_bytes(all[..8].try_into().expect("8 bytes")) as usize;
        all = &all[8..];
        if all.len() < len {
            return Err(bad("truncated all-gather frame".into()));
        }
        parts.push(all[..len].to_vec());
        all = &all[len..];
    }
    if !all.is_empty() {
        return Err(bad("trailing bytes in all-gather frame".into()));
    }
    Ok(parts)
}

/// Test helper: runs `f` on `n` ranks, one thread each, every rank with a bootstrap connected
/// through a rendezvous on a free loopback port; returns the results in rank order.
#[cfg(test)]
pub(crate) fn run_ranks<T: Send + 'static>(
    n: usize,
    f: impl Fn(usize, &mut Bootstrap) -> T + Send + Copy + 'static,
) -> Vec<T> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let master = format!("127.0.0.1:{port}");
    let threads: Vec<_> = (0..n)
        .map(|rank| {
            let master = master.clone();
            std::thread::spawn(move || {
                let p = Placement {
                    rank,
                    nranks: n,
                    master: Some(master),
                    source: "test",
                };
                let mut b = Bootstrap::connect(&p, Duration::from_secs(20)).unwrap();
                f(rank, &mut b)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn flags_win_over_launcher_variables() {
        let p = placement(
            Some(1),
            Some(3),
            Some("h:5"),
            env(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "8")]),
        )
        .unwrap();
        assert_eq!((p.rank, p.nranks, p.source), (1, 3, "flags"));
        assert_eq!(p.master.as_deref(), Some("h:5"));
    }

    #[test]
    fn launcher_variables_are_detected_in_order() {
        type Case<'a> = (&'a [(&'a str, &'a str)], (usize, usize, &'a str));
        let cases: [Case; 5] = [
            (
                &[("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "4")],
                (2, 4, "Open MPI"),
            ),
            (&[("PMI_RANK", "1"), ("PMI_SIZE", "2")], (1, 2, "PMI")),
            (
                &[("SLURM_PROCID", "3"), ("SLURM_NTASKS", "8")],
                (3, 8, "Slurm"),
            ),
            (&[("RANK", "0"), ("WORLD_SIZE", "2")], (0, 2, "torchrun")),
            // Open MPI first when several are present (srun --mpi=pmix sets both).
            (
                &[
                    ("SLURM_PROCID", "5"),
                    ("SLURM_NTASKS", "6"),
                    ("OMPI_COMM_WORLD_RANK", "1"),
                    ("OMPI_COMM_WORLD_SIZE", "6"),
                ],
                (1, 6, "Open MPI"),
            ),
        ];
        for (vars, want) in cases {
            let mut v = vars.to_vec();
            v.push(("MASTER_ADDR", "10.0.0.1"));
            v.push(("MASTER_PORT", "29500"));
            let p = placement(None, None, None, env(&v)).unwrap();
            assert_eq!((p.rank, p.nranks, p.source), want);
            assert_eq!(p.master.as_deref(), Some("10.0.0.1:29500"));
        }
    }

    #[test]
    fn a_lone_rank_needs_no_master_but_many_do() {
        let p = placement(None, None, None, env(&[])).unwrap();
        assert_eq!((p.rank, p.nranks, p.master), (0, 1, None));
        let e = placement(
            None,
            None,
            None,
            env(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]),
        );
        assert!(e.unwrap_err().contains("MASTER_ADDR"));
        let e = placement(None, None, None, env(&[("RANK", "x"), ("WORLD_SIZE", "2")]));
        assert!(e.unwrap_err().contains("RANK"));
        let e = placement(Some(4), Some(4), Some("h:1"), env(&[]));
        assert!(e.is_err());
        // An explicit --master works with launcher variables.
        let p = placement(
            None,
            None,
            Some("h:9"),
            env(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2")]),
        )
        .unwrap();
        assert_eq!(p.master.as_deref(), Some("h:9"));
    }

    #[test]
    fn frames_round_trip() {
        let parts = vec![b"abc".to_vec(), vec![], vec![7; 300]];
        assert_eq!(split_all(&join_all(&parts), 3).unwrap(), parts);
        assert!(split_all(&join_all(&parts), 4).is_err());
        assert!(split_all(&join_all(&parts), 2).is_err());
        let mut buf = Vec::new();
        write_frame(&mut buf, b"hello").unwrap();
        assert_eq!(read_frame(&mut &buf[..]).unwrap(), b"hello");
        assert_eq!(parse_hello(&hello(3, 7)).unwrap(), (3, 7));
        assert!(parse_hello(b"GET / HTTP/1.1").is_err());
    }

    #[test]
    fn rendezvous_allgather_and_barrier_over_loopback() {
        let n = 4;
        let results = run_ranks(n, |rank, b| {
            let all = b.allgather(&[rank as u8; 3]).unwrap();
            b.barrier().unwrap();
            let again = b.allgather(format!("r{rank}").as_bytes()).unwrap();
            (all, again)
        });
        for (all, again) in results {
            assert_eq!(all.len(), n);
            for (r, part) in all.iter().enumerate() {
                assert_eq!(part, &vec![r as u8; 3]);
                assert_eq!(again[r], format!("r{r}").into_bytes());
            }
        }
    }
}
