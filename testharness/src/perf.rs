//! One rank of a `verbsnet-perf` run: load the plugin, join the rendezvous, build the ring,
//! sweep the sizes (warm-up, timed and checked iterations, out-of-place and in-place), and on
//! rank 0 print the results.

use std::env;
use std::error::Error;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::baseline::{self as tcp_baseline, TcpRing};
use crate::bootstrap::{self, Bootstrap};
use crate::cli::{Args, Baseline, Collective, Proxy};
use crate::coll::{self, Plan, Ring};
use crate::cputime::{self, CpuUse};
use crate::data::{count_wrong, DataType, Expected, Pattern, RedOp};
use crate::deviations;
use crate::mesh::{Mesh, Sharing};
use crate::plugin::{self, Handle, Net};
use crate::report::{self, BaselineRow, Measure, Row};
use crate::stats::{self, RankStats};

/// Errors of a rank.
pub type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// How long ranks wait for each other in the rendezvous.
const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(120);

/// A size that takes longer than this gets a progress line on stderr.
const PROGRESS_AFTER: Duration = Duration::from_secs(1);

/// Byte value of untouched output (never a valid result; see [`Layout`]).
const SENTINEL: u8 = 0x7F;

/// Exit code for a run with wrong data.
pub const EXIT_WRONG: i32 = 1;

/// Buffer shapes of one size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Size column: bytes (total over ranks for all-gather / reduce-scatter).
    pub size: u64,
    /// Count column: size / element size.
    pub count: u64,
    /// Elements per rank block (all-gather / reduce-scatter), or the whole count.
    pub per: usize,
    /// Input elements per rank.
    pub in_elems: usize,
    /// Output elements per rank.
    pub out_elems: usize,
}

impl Layout {
    /// The shapes nccl-tests uses for `bytes` requested: all-reduce and sendrecv move
    /// `bytes / es` elements; all-gather and reduce-scatter split the total over ranks.
    pub fn new(coll: Collective, bytes: u64, dtype: DataType, nranks: usize) -> Layout {
        let es = dtype.size();
        let elems = (bytes / es as u64) as usize;
        let (per, in_elems, out_elems, total) = match coll {
            Collective::AllReduce | Collective::Sendrecv => (elems, elems, elems, elems),
            Collective::AllGather => {
                let per = elems / nranks;
                (per, per, per * nranks, per * nranks)
            }
            Collective::Alltoall => {
                let per = elems / nranks;
                (per, per * nranks, per * nranks, per * nranks)
            }
            Collective::ReduceScatter => {
                let per = elems / nranks;
                (per, per * nranks, per, per * nranks)
            }
        };
        Layout {
            size: (total * es) as u64,
            count: total as u64,
            per,
            in_elems,
            out_elems,
        }
    }

    /// Bytes of the single buffer of an in-place call.
    fn inplace_elems(&self) -> usize {
        self.in_elems.max(self.out_elems)
    }
}

/// The plan of `coll` at `rank` for `layout`.
pub fn plan_for(
    coll: Collective,
    l: &Layout,
    dtype: DataType,
    rank: usize,
    n: usize,
    chunk: usize,
) -> Plan {
    let es = dtype.size();
    match coll {
        Collective::AllReduce => coll::all_reduce_plan(l.in_elems, es, rank, n, chunk),
        Collective::AllGather => coll::all_gather_plan(l.per, es, rank, n, chunk),
        Collective::ReduceScatter => coll::reduce_scatter_plan(l.per, es, rank, n, chunk),
        Collective::Sendrecv => coll::sendrecv_plan(l.in_elems * es, chunk),
        // The mesh derives its pieces from the block size itself.
        Collective::Alltoall => Plan::default(),
    }
}

/// The plugin connections of a run: a ring for the ring collectives, a full mesh for alltoall.
enum Conns<'n> {
    Ring(Ring<'n>),
    Mesh(Mesh<'n>),
}

impl<'n> Conns<'n> {
    fn ring(&mut self) -> Result<&mut Ring<'n>> {
        match self {
            Conns::Ring(r) => Ok(r),
            Conns::Mesh(_) => Err("a ring collective on alltoall's mesh".into()),
        }
    }

    fn close(self) -> Result<()> {
        match self {
            Conns::Ring(r) => r.close(),
            Conns::Mesh(m) => m.close(),
        }
    }
}

/// The buffers of one placement (out-of-place or in-place) of one size.
struct Buffers {
    inplace: bool,
    /// Out-of-place input (empty in place).
    input: Vec<u8>,
    /// Out-of-place output, or the single in-place buffer.
    output: Vec<u8>,
    /// Reduce-scatter work copy; in-place sendrecv staging copy.
    scratch: Vec<u8>,
}

/// What one rank needs to run and check a collective.
struct Job<'a> {
    coll: Collective,
    proxy: Proxy,
    dtype: DataType,
    op: RedOp,
    rank: usize,
    nranks: usize,
    layout: Layout,
    plan: &'a Plan,
}

impl Job<'_> {
    fn es(&self) -> usize {
        self.dtype.size()
    }

    /// Byte range of this rank's block.
    fn my_block(&self) -> std::ops::Range<usize> {
        let b = self.layout.per * self.es();
        self.rank * b..(self.rank + 1) * b
    }

    fn buffers(&self, inplace: bool) -> Buffers {
        let es = self.es();
        let l = &self.layout;
        let scratch = match (self.coll, inplace) {
            (Collective::ReduceScatter, _) => l.in_elems * es,
            (Collective::Sendrecv | Collective::Alltoall, true) => l.in_elems * es,
            _ => 0,
        };
        Buffers {
            inplace,
            input: if inplace {
                Vec::new()
            } else {
                vec![0; l.in_elems * es]
            },
            output: vec![
                SENTINEL;
                if inplace {
                    l.inplace_elems() * es
                } else {
                    l.out_elems * es
                }
            ],
            scratch: vec![0; scratch],
        }
    }

    fn pattern(&self, seed: u64) -> Pattern {
        Pattern {
            dtype: self.dtype,
            op: self.op,
            seed,
        }
    }

    /// Writes this rank's input for `seed` and marks the output as untouched.
    fn init(&self, b: &mut Buffers, seed: u64) {
        let p = self.pattern(seed);
        b.output.fill(SENTINEL);
        if !b.inplace {
            p.fill(&mut b.input, self.rank, 0);
        } else if self.coll == Collective::AllGather {
            let block = self.my_block();
            p.fill(&mut b.output[block], self.rank, 0);
        } else {
            p.fill(&mut b.output, self.rank, 0);
        }
    }

    /// One collective call (including the local copies NCCL's kernels would do).
    fn call(&self, conns: &mut Conns<'_>, b: &mut Buffers) -> Result<()> {
        let (dtype, op) = (self.dtype, self.op);
        let Buffers {
            inplace,
            input,
            output,
            scratch,
        } = b;
        if let Conns::Mesh(mesh) = conns {
            let block = self.layout.per * self.es();
            return if *inplace {
                scratch.copy_from_slice(output);
                mesh.alltoall(scratch, output, block, self.es(), self.proxy)
            } else {
                mesh.alltoall(input, output, block, self.es(), self.proxy)
            };
        }
        let ring = conns.ring()?;
        match (self.coll, *inplace) {
            (Collective::AllReduce, false) => {
                output.copy_from_slice(input);
                ring.run(self.proxy, self.plan, &[], output, dtype, op)
            }
            (Collective::AllReduce | Collective::AllGather, true) => {
                ring.run(self.proxy, self.plan, &[], output, dtype, op)
            }
            (Collective::AllGather, false) => {
                output[self.my_block()].copy_from_slice(input);
                ring.run(self.proxy, self.plan, &[], output, dtype, op)
            }
            (Collective::ReduceScatter, false) => {
                scratch.copy_from_slice(input);
                ring.run(self.proxy, self.plan, &[], scratch, dtype, op)?;
                output.copy_from_slice(&scratch[self.my_block()]);
                Ok(())
            }
            (Collective::ReduceScatter, true) => {
                scratch.copy_from_slice(output);
                ring.run(self.proxy, self.plan, &[], scratch, dtype, op)?;
                let block = self.my_block();
                output[block.clone()].copy_from_slice(&scratch[block]);
                Ok(())
            }
            (Collective::Sendrecv, false) => {
                ring.run(self.proxy, self.plan, input, output, dtype, op)
            }
            (Collective::Sendrecv, true) => {
                scratch.copy_from_slice(output);
                ring.run(self.proxy, self.plan, scratch, output, dtype, op)
            }
            (Collective::Alltoall, _) => Err("alltoall needs the mesh".into()),
        }
    }

    /// Wrong elements of this rank's result for `seed`.
    fn check(&self, b: &Buffers, seed: u64) -> u64 {
        let p = self.pattern(seed);
        let n = self.nranks;
        let per = self.layout.per;
        match self.coll {
            Collective::AllReduce => count_wrong(self.dtype, &b.output, |i| Expected::Reduced {
                pattern: p,
                nranks: n,
                index: i,
            }),
            Collective::AllGather => count_wrong(self.dtype, &b.output, |i| Expected::Input {
                pattern: p,
                rank: i / per,
                index: i % per,
            }),
            Collective::ReduceScatter => {
                let out = if b.inplace {
                    &b.output[self.my_block()]
                } else {
                    &b.output[..]
                };
                let first = self.rank * per;
                count_wrong(self.dtype, out, |i| Expected::Reduced {
                    pattern: p,
                    nranks: n,
                    index: first + i,
                })
            }
            Collective::Sendrecv => {
                let prev = (self.rank + n - 1) % n;
                count_wrong(self.dtype, &b.output, |i| Expected::Input {
                    pattern: p,
                    rank: prev,
                    index: i,
                })
            }
            // Output block q holds rank q's input block for us.
            Collective::Alltoall => count_wrong(self.dtype, &b.output, |i| Expected::Input {
                pattern: p,
                rank: i / per,
                index: self.rank * per + i % per,
            }),
        }
    }

    /// Warm-up, timed iterations (µs per iteration, and this thread's CPU time and run-queue
    /// wait per iteration), then checked iterations.
    fn measure(
        &self,
        ring: &mut Conns<'_>,
        boot: &mut Bootstrap,
        args: &Args,
        inplace: bool,
    ) -> Result<Measure> {
        let mut b = self.buffers(inplace);
        self.init(&mut b, 0);
        for _ in 0..args.warmup_iters {
            self.call(ring, &mut b)?;
        }
        boot.barrier()?;
        let start = Instant::now();
        let (timed, used) = cputime::measure(|| -> Result<()> {
            for _ in 0..args.iters {
                self.call(ring, &mut b)?;
            }
            Ok(())
        });
        timed?;
        let time_us = start.elapsed().as_secs_f64() * 1e6 / f64::from(args.iters);
        let mut wrong = None;
        for c in 0..args.check {
            let seed = u64::from(c) + 1;
            self.init(&mut b, seed);
            self.call(ring, &mut b)?;
            if args.debug_corrupt_rank == Some(self.rank) {
                corrupt(&mut b.output);
            }
            *wrong.get_or_insert(0) += self.check(&b, seed);
        }
        Ok(Measure {
            time_us,
            wrong,
            cpu: used.map(|u| CpuUse::per_iter(u, args.iters)),
        })
    }
}

/// Test hook: damages one byte in every 8 of a result buffer (so the rank's own block of an
/// in-place reduce-scatter is hit too).
fn corrupt(out: &mut [u8]) {
    for b in out.iter_mut().step_by(8) {
        *b ^= 0x5A;
    }
}

/// Wire form of one rank's two measurements: per measurement the time, #wrong (`u64::MAX`:
/// none), CPU and run-queue microseconds (negative: unknown), little-endian.
fn encode_result(results: [Measure; 2]) -> Vec<u8> {
    let mut v = Vec::with_capacity(64);
    for m in results {
        v.extend_from_slice(&m.time_us.to_le_bytes());
        v.extend_from_slice(&m.wrong.map_or(u64::MAX, |w| w).to_le_bytes());
        let c = m.cpu.unwrap_or(CpuUse {
            cpu_us: -1.0,
            runq_us: -1.0,
        });
        v.extend_from_slice(&c.cpu_us.to_le_bytes());
        v.extend_from_slice(&c.runq_us.to_le_bytes());
    }
    v
}

fn decode_result(b: &[u8]) -> Option<[Measure; 2]> {
    if b.len() != 64 {
        return None;
    }
    let f = |o: usize| f64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let u = |o: usize| {
        let x = u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        (x != u64::MAX).then_some(x)
    };
    let m = |o: usize| Measure {
        time_us: f(o),
        wrong: u(o + 8),
        cpu: (f(o + 16) >= 0.0 && f(o + 24) >= 0.0).then(|| CpuUse {
            cpu_us: f(o + 16),
            runq_us: f(o + 24),
        }),
    };
    Some([m(0), m(32)])
}

/// Combines per-rank results: the slowest rank's time, the sum of wrong elements, CPU time
/// and run-queue wait summed over ranks (unknown if any rank could not tell).
pub fn combine(results: &[[Measure; 2]]) -> [Measure; 2] {
    let mut out = [Measure {
        time_us: 0.0,
        wrong: None,
        cpu: Some(CpuUse::default()),
    }; 2];
    for r in results {
        for (m, x) in out.iter_mut().zip(r) {
            m.time_us = m.time_us.max(x.time_us);
            if let Some(w) = x.wrong {
                *m.wrong.get_or_insert(0) += w;
            }
            m.cpu = match (m.cpu, x.cpu) {
                (Some(a), Some(b)) => Some(a.plus(b)),
                _ => None,
            };
        }
    }
    if results.is_empty() {
        out.iter_mut().for_each(|m| m.cpu = None);
    }
    out
}

/// Where this rank's plugin counters go (`--stats`).
struct StatsFile {
    path: PathBuf,
    start: u64,
    ours: bool,
}

impl StatsFile {
    /// Uses `VERBSNET_STATS_FILE` if set (reading only what this run appends), else a fresh
    /// temporary file for this rank, exported before the plugin is loaded.
    fn prepare(rank: usize) -> Result<StatsFile> {
        if let Some(p) = env::var_os("VERBSNET_STATS_FILE").filter(|p| !p.is_empty()) {
            let path = PathBuf::from(p);
            let start = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            return Ok(StatsFile {
                path,
                start,
                ours: false,
            });
        }
        let path = env::temp_dir().join(format!(
            "verbsnet-perf-stats-{}-r{rank}.jsonl",
            std::process::id()
        ));
        fs::File::create(&path).map_err(|e| format!("create {}: {e}", path.display()))?;
        env::set_var("VERBSNET_STATS_FILE", &path);
        Ok(StatsFile {
            path,
            start: 0,
            ours: true,
        })
    }

    fn read(&self, rank: usize) -> RankStats {
        let mut text = String::new();
        if let Ok(mut f) = fs::File::open(&self.path) {
            let _ = f.seek(SeekFrom::Start(self.start));
            let _ = f.read_to_string(&mut text);
        }
        if self.ours {
            let _ = fs::remove_file(&self.path);
        }
        RankStats::parse(rank, &self.path.display().to_string(), &text)
    }
}

/// How NCCL maps the shared senders onto the plugin ([`Sharing::shape`]), for the header.
fn shape_text(sharing: &Sharing) -> String {
    let shape = sharing.shape();
    if sharing.senders == 1 {
        "one connection per peer".into()
    } else if shape.conns() > 1 {
        format!(
            "plugin maxRecvs {}: NCCL does not share connections then (src/transport/net.cc), \
             so {} connections per peer, one receive per step each",
            sharing.max_recvs,
            shape.conns()
        )
    } else {
        format!(
            "plugin maxRecvs {}: one shared connection per peer, receives grouped by up to {}",
            sharing.max_recvs,
            shape.group()
        )
    }
}

fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .or_else(|_| env::var("HOSTNAME"))
        .unwrap_or_else(|_| "?".into())
}

fn canonical(p: &Path) -> PathBuf {
    fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

fn ptr_support(bits: i32) -> String {
    let mut s = Vec::new();
    for (bit, name) in [(1, "HOST"), (2, "CUDA"), (4, "DMABUF")] {
        if bits & bit != 0 {
            s.push(name);
        }
    }
    if s.is_empty() {
        "none".into()
    } else {
        s.join("|")
    }
}

/// `--baseline tcp`: streams each size's per-link bytes over a plain TCP ring between the same
/// ranks (see [`crate::baseline`]). Returns one row per size, combined over ranks, and a
/// description for the header.
fn run_baseline(
    args: &Args,
    boot: &mut Bootstrap,
    rank: usize,
    n: usize,
    chunk: usize,
) -> Result<(Vec<BaselineRow>, String)> {
    let mut ring = TcpRing::connect(boot, rank, n)?;
    let what = format!(
        "plain TCP ring, std::net::TcpStream rank r -> r+1 via {}: blocking, default socket \
         buffers, TCP_NODELAY; per iteration the plan's bytes per link as one stream, in \
         writes/reads of at most {chunk} B; {} warm-up + {} timed iterations",
        ring.addr().ip(),
        args.warmup_iters,
        args.iters
    );
    let sizes = args.sizes();
    let mut rows = Vec::with_capacity(sizes.len());
    for (i, &bytes) in sizes.iter().enumerate() {
        let started = Instant::now();
        let layout = Layout::new(args.collective, bytes, args.datatype, n);
        let plan = plan_for(args.collective, &layout, args.datatype, rank, n, chunk);
        let send: usize = plan.sends.iter().map(|s| s.len).sum();
        let recv: usize = plan.recvs.iter().map(|r| r.len).sum();
        let mine = ring.measure(boot, send, recv, args.warmup_iters, args.iters, chunk)?;
        let all: Vec<_> = boot
            .allgather(&tcp_baseline::encode(&mine))?
            .iter()
            .map(|b| tcp_baseline::decode(b).ok_or("a rank sent a malformed baseline result"))
            .collect::<std::result::Result<_, _>>()?;
        let r = tcp_baseline::combine(&all);
        if r.wrong > 0 {
            return Err(format!(
                "baseline: {} bytes of {} B arrived different from what was sent",
                r.wrong, layout.size
            )
            .into());
        }
        rows.push(BaselineRow {
            size: layout.size,
            time_us: r.time_us,
            wrong: r.wrong,
            cpu: r.cpu,
        });
        let took = started.elapsed();
        if rank == 0 && took > PROGRESS_AFTER {
            eprintln!(
                "# [progress] baseline {}/{} sizes: {} B took {:.1} s",
                i + 1,
                sizes.len(),
                layout.size,
                took.as_secs_f64()
            );
        }
    }
    Ok((rows, what))
}

/// Runs this rank; returns the process exit code.
///
/// # Errors
/// Plugin, rendezvous or ring failures.
pub fn run(args: &Args) -> Result<i32> {
    let place = bootstrap::placement(args.rank, args.nranks, args.master.as_deref(), |k| {
        env::var(k).ok()
    })?;
    if args.debug_fail_rank == Some(place.rank) {
        return Err("failing on purpose (--debug-fail-rank)".into());
    }
    // Everything the plugin reads from the environment is set before it is loaded.
    if let Some(t) = args.transport {
        env::set_var("VERBSNET_TRANSPORT", t.env_value());
    }
    let stats_file = if args.stats {
        Some(StatsFile::prepare(place.rank)?)
    } else {
        None
    };
    let value = env::var("NCCL_NET_PLUGIN")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| plugin::DEFAULT_PLUGIN_VALUE.into());
    let wanted = env::var("NCCL_NET").ok().filter(|v| !v.is_empty());
    let exe_dir = env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    let net = Net::open(
        &value,
        wanted.as_deref(),
        exe_dir.as_deref(),
        args.net_version,
    )?;
    let ndev = net.devices()?;
    if ndev <= 0 || args.dev >= ndev || args.dev < 0 {
        return Err(format!(
            "plugin reports {ndev} device(s); --dev {} is not one",
            args.dev
        )
        .into());
    }
    let props = net.properties(args.dev)?;
    let n = place.nranks;
    let alltoall = args.collective == Collective::Alltoall;
    let sharing = Sharing {
        senders: args.shared_comms,
        skew_us: args.skew_us,
        seed: args.seed,
        max_recvs: usize::try_from(props.max_recvs).unwrap_or(1).max(1),
    };
    // Alltoall listens once per peer (one handle per connection, as NCCL exchanges them).
    let (handle_bytes, listen, listens) = if alltoall {
        let conns = sharing.shape().conns();
        let (bytes, listens) = Mesh::listen(&net, args.dev, place.rank, n, conns)?;
        (bytes, None, listens)
    } else {
        let (handle, listen) = net.listen(args.dev)?;
        (handle.0.to_vec(), Some(listen), Vec::new())
    };

    let mut boot = Bootstrap::connect(&place, RENDEZVOUS_TIMEOUT)?;
    let all_handles = boot.allgather(&handle_bytes)?;
    let me = json!({
        "rank": place.rank,
        "pid": std::process::id(),
        "host": hostname(),
        "plugin_path": net.path().display().to_string(),
        "plugin_file": canonical(net.path()).display().to_string(),
        "device": props.name,
        "transport_env": env::var("VERBSNET_TRANSPORT").ok(),
    });
    let ranks: Vec<Value> = boot
        .allgather(me.to_string().as_bytes())?
        .iter()
        .map(|b| serde_json::from_slice(b).unwrap_or(Value::Null))
        .collect();

    let chunk = args.chunk as usize;
    let mut conns = match listen {
        Some(listen) => {
            let handles: Vec<Handle> = all_handles
                .iter()
                .map(|b| Handle::from_bytes(b).ok_or("a rank sent a handle of the wrong size"))
                .collect::<std::result::Result<_, _>>()?;
            Conns::Ring(Ring::connect(
                &net, args.dev, place.rank, &handles, listen, chunk,
            )?)
        }
        None => Conns::Mesh(Mesh::connect(
            &net,
            args.dev,
            place.rank,
            &all_handles,
            listens,
            chunk,
            sharing,
        )?),
    };
    boot.barrier()?;

    let root = place.rank == 0;
    let transport =
        env::var("VERBSNET_TRANSPORT").unwrap_or_else(|_| "unset (plugin default)".into());
    let out = std::io::stdout();
    if root && !args.json {
        let mut o = out.lock();
        writeln!(
            o,
            "# verbsnet-perf {}: nranks {n} ({})",
            args.collective, place.source
        )?;
        writeln!(
            o,
            "#  minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} validation: {} \
             chunk: {chunk} slots: {} proxy: {}",
            args.min_bytes,
            args.max_bytes(),
            match (args.step_factor, args.step_bytes) {
                (None, Some(b)) => format!("{b}(bytes)"),
                (f, _) => format!("{}(factor)", f.unwrap_or(2)),
            },
            args.warmup_iters,
            args.iters,
            args.check,
            coll::SLOTS,
            args.proxy.name(),
        )?;
        if alltoall {
            writeln!(
                o,
                "#  shared comms: {} sender(s) per peer, tags 0..{}, skew up to {} us per \
                 piece, seed {}; {}",
                sharing.senders,
                sharing.senders - 1,
                sharing.skew_us,
                sharing.seed,
                shape_text(&sharing),
            )?;
        }
        writeln!(
            o,
            "# plugin: {} ({}) from {} [{}]  NCCL_NET_PLUGIN={value}",
            net.name(),
            net.symbol(),
            net.path().display(),
            canonical(net.path()).display(),
        )?;
        writeln!(
            o,
            "# transport: VERBSNET_TRANSPORT={transport}; dev {} of {ndev}: \"{}\" speed {} Mbps \
             latency {} us ptrSupport {} maxComms {} maxRecvs {}{}",
            args.dev,
            props.name,
            props.speed,
            props.latency,
            ptr_support(props.ptr_support),
            props.max_comms,
            props.max_recvs,
            props
                .pci_path
                .as_deref()
                .map(|p| format!(" pci {p}"))
                .unwrap_or_default(),
        )?;
        for r in &ranks {
            writeln!(
                o,
                "#  Rank {:>3} Pid {:>7} on {} device {} ({}) plugin {}",
                r["rank"],
                r["pid"],
                r["host"].as_str().unwrap_or("?"),
                args.dev,
                r["device"].as_str().unwrap_or("?"),
                r["plugin_file"].as_str().unwrap_or("?"),
            )?;
        }
        writeln!(o, "#")?;
        writeln!(o, "{}", report::table_header())?;
        o.flush()?;
    }

    let sizes = args.sizes();
    let mut rows = Vec::with_capacity(sizes.len());
    for (i, &bytes) in sizes.iter().enumerate() {
        let started = Instant::now();
        let layout = Layout::new(args.collective, bytes, args.datatype, n);
        let plan = plan_for(
            args.collective,
            &layout,
            args.datatype,
            place.rank,
            n,
            chunk,
        );
        let job = Job {
            coll: args.collective,
            proxy: args.proxy,
            dtype: args.datatype,
            op: args.op,
            rank: place.rank,
            nranks: n,
            layout,
            plan: &plan,
        };
        let oop = job.measure(&mut conns, &mut boot, args, false)?;
        let ip = job.measure(&mut conns, &mut boot, args, true)?;
        let all: Vec<_> = boot
            .allgather(&encode_result([oop, ip]))?
            .iter()
            .map(|b| decode_result(b).ok_or("a rank sent a malformed result"))
            .collect::<std::result::Result<_, _>>()?;
        let [out_of_place, in_place] = combine(&all);
        let row = Row {
            size: layout.size,
            count: layout.count,
            dtype: args.datatype,
            redop: args.collective.reduces().then_some(args.op),
            root: -1,
            out_of_place,
            in_place,
        };
        if root && !args.json {
            let mut o = out.lock();
            writeln!(o, "{}", report::format_row(args.collective, n, &row))?;
            o.flush()?;
        }
        let took = started.elapsed();
        if root && took > PROGRESS_AFTER {
            eprintln!(
                "# [progress] {}/{} sizes: {} B took {:.1} s",
                i + 1,
                sizes.len(),
                layout.size,
                took.as_secs_f64()
            );
        }
        rows.push(row);
    }

    conns.close()?;
    let baseline = match args.baseline {
        Some(Baseline::Tcp) => Some(run_baseline(args, &mut boot, place.rank, n, chunk)?),
        None => None,
    };
    let stats = match &stats_file {
        Some(f) => {
            let mine = f.read(place.rank).to_json().to_string();
            boot.allgather(mine.as_bytes())?
                .iter()
                .filter_map(|b| serde_json::from_slice(b).ok())
                .filter_map(|v: Value| RankStats::from_json(&v))
                .collect::<Vec<_>>()
        }
        None => Vec::new(),
    };
    // What the plugin logged through the logger `init` got, and the contract deviations seen,
    // per rank.
    let mine = json!({"log": plugin::logger::seen().to_json(), "deviations": deviations::all()});
    let (logs, devs): (Vec<Value>, Vec<Value>) = boot
        .allgather(mine.to_string().as_bytes())?
        .iter()
        .map(|b| serde_json::from_slice::<Value>(b).unwrap_or(Value::Null))
        .map(|v| (v["log"].clone(), v["deviations"].clone()))
        .unzip();
    let devs = deviations::merge(&devs);
    boot.barrier()?;

    let wrong = report::total_wrong(&rows);
    if root {
        let mut o = out.lock();
        if args.json {
            let obj = json!({
                "collective": args.collective.name(),
                "nranks": n,
                "datatype": args.datatype.name(),
                "op": args.op.name(),
                "chunk": chunk,
                "slots": coll::SLOTS,
                "iters": args.iters,
                "warmup_iters": args.warmup_iters,
                "check": args.check,
                "shared_comms": alltoall.then(|| json!({
                    "senders": sharing.senders,
                    "skew_us": sharing.skew_us,
                    "seed": sharing.seed,
                    "max_recvs": sharing.max_recvs,
                    "connections_per_peer": sharing.shape().conns(),
                    "receive_group": sharing.shape().group(),
                })),
                "proxy": args.proxy.name(),
                "plugin": {
                    "name": net.name(),
                    "symbol": net.symbol(),
                    "value": value,
                    "path": net.path().display().to_string(),
                    "file": canonical(net.path()).display().to_string(),
                },
                "transport": env::var("VERBSNET_TRANSPORT").ok(),
                "device": {
                    "index": args.dev,
                    "count": ndev,
                    "name": props.name,
                    "speed_mbps": props.speed,
                    "ptr_support": ptr_support(props.ptr_support),
                },
                "ranks": ranks,
                "rows": rows_with_baseline(args.collective, n, &rows, baseline.as_ref().map(|b| &b.0[..])),
                "baseline": baseline.as_ref().map(|(_, what)| json!({
                    "kind": args.baseline.map(|b| b.name()),
                    "what": what,
                    "io_max": chunk,
                })),
                "out_of_bounds": wrong,
                "ok": wrong == 0,
                "avg_busbw": report::avg_busbw(args.collective, n, &rows),
                "stats": args.stats.then(|| stats.iter().map(RankStats::to_json).collect::<Vec<_>>()),
                "plugin_log": logs,
                "deviations": devs,
            });
            writeln!(o, "{obj}")?;
        } else {
            if let Some((base, what)) = &baseline {
                writeln!(o, "#")?;
                writeln!(
                    o,
                    "# Baseline ({}): {what}",
                    args.baseline.map_or("?", |b| b.name())
                )?;
                writeln!(o, "# ratio = ours busbw / baseline busbw")?;
                writeln!(o, "{}", report::baseline_header())?;
                for (row, b) in rows.iter().zip(base) {
                    writeln!(
                        o,
                        "{}",
                        report::format_baseline_row(args.collective, n, row, b)
                    )?;
                }
            }
            if let Some(line) = warn_summary(&logs) {
                writeln!(o, "{line}")?;
            }
            for line in deviations::lines(&devs) {
                writeln!(o, "{line}")?;
            }
            writeln!(o, "{}", report::footer(args.collective, n, &rows))?;
            if args.stats {
                write!(o, "{}", stats::format_table(&stats))?;
            }
        }
        o.flush()?;
    }
    Ok(if root && wrong > 0 { EXIT_WRONG } else { 0 })
}

/// `# Plugin WARN lines: ...` when any rank's plugin logged a WARN (`logs`: per rank, from
/// [`plugin::logger::Seen::to_json`]).
fn warn_summary(logs: &[Value]) -> Option<String> {
    let counts: Vec<u64> = logs
        .iter()
        .map(|l| l["warn"].as_u64().unwrap_or(0))
        .collect();
    if counts.iter().all(|&c| c == 0) {
        return None;
    }
    let per_rank: Vec<String> = counts
        .iter()
        .enumerate()
        .map(|(r, c)| format!("rank {r}: {c}"))
        .collect();
    let first = logs
        .iter()
        .find_map(|l| l["warnings"].get(0).and_then(Value::as_str))
        .unwrap_or("?");
    Some(format!(
        "# Plugin WARN lines (through NCCL's logger): {}; first: {first}",
        per_rank.join(", ")
    ))
}

/// The rows as JSON, each with its `"baseline"` object when there is one.
fn rows_with_baseline(
    coll: Collective,
    n: usize,
    rows: &[Row],
    base: Option<&[BaselineRow]>,
) -> Value {
    let mut v = report::rows_json(coll, n, rows);
    if let (Some(base), Some(arr)) = (base, v.as_array_mut()) {
        for ((j, row), b) in arr.iter_mut().zip(rows).zip(base) {
            j["baseline"] = report::baseline_json(coll, n, row, b);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_follow_nccl_tests_sizes() {
        let l = Layout::new(Collective::AllReduce, 1024, DataType::Float, 4);
        assert_eq!(
            (l.size, l.count, l.in_elems, l.out_elems),
            (1024, 256, 256, 256)
        );
        let l = Layout::new(Collective::AllGather, 1024, DataType::Float, 4);
        assert_eq!(
            (l.size, l.count, l.per, l.in_elems, l.out_elems),
            (1024, 256, 64, 64, 256)
        );
        let l = Layout::new(Collective::ReduceScatter, 1000, DataType::Float64, 3);
        // 125 elements / 3 ranks = 41 per rank; size rounds down to 123 elements.
        assert_eq!(
            (l.size, l.count, l.per, l.in_elems, l.out_elems),
            (984, 123, 41, 123, 41)
        );
        let l = Layout::new(Collective::AllGather, 8, DataType::Float, 4);
        assert_eq!((l.size, l.count), (0, 0));
        let l = Layout::new(Collective::Sendrecv, 10, DataType::Int32, 2);
        assert_eq!((l.size, l.count), (8, 2));
    }

    #[test]
    fn results_combine_as_max_time_and_summed_wrong() {
        let m = |t: f64, w: Option<u64>, c: Option<(f64, f64)>| Measure {
            time_us: t,
            wrong: w,
            cpu: c.map(|(cpu_us, runq_us)| CpuUse { cpu_us, runq_us }),
        };
        let rs = [
            [m(10.0, Some(0), Some((5.0, 1.0))), m(12.0, Some(1), None)],
            [
                m(15.0, Some(2), Some((7.0, 0.5))),
                m(11.0, Some(0), Some((1.0, 1.0))),
            ],
        ];
        let [a, b] = combine(&rs);
        assert_eq!((a.time_us, a.wrong), (15.0, Some(2)));
        assert_eq!(
            a.cpu,
            Some(CpuUse {
                cpu_us: 12.0,
                runq_us: 1.5
            })
        );
        assert_eq!((b.time_us, b.wrong, b.cpu), (12.0, Some(1), None));
        let [c, _] = combine(&[[m(1.0, None, None), m(1.0, None, None)]]);
        assert_eq!(c.wrong, None);
        let e = encode_result([m(1.5, Some(3), Some((2.0, 0.25))), m(2.5, None, None)]);
        assert_eq!(
            decode_result(&e),
            Some([m(1.5, Some(3), Some((2.0, 0.25))), m(2.5, None, None)])
        );
        assert_eq!(decode_result(&e[1..]), None);
    }

    #[test]
    fn sentinel_is_never_an_expected_value() {
        let s = [SENTINEL; 8];
        let f = f32::from_ne_bytes(s[..4].try_into().unwrap());
        let i = i32::from_ne_bytes(s[..4].try_into().unwrap());
        let d = f64::from_ne_bytes(s);
        // Expected values are integers within ±16·nranks, ±500, or powers of two.
        assert!(f.abs() > 1e30 && !(f as f64).log2().fract().eq(&0.0));
        assert!(i > 1 << 30 && (i as u32).count_ones() > 1);
        assert!(d.abs() > 1e300 && !d.log2().fract().eq(&0.0));
    }

    /// The whole rank logic against an in-memory "ring" is covered by coll's simulation; here
    /// check that the checker flags an untouched output buffer.
    #[test]
    fn untouched_output_is_all_wrong() {
        let layout = Layout::new(Collective::AllReduce, 64, DataType::Float, 2);
        let plan = Plan::default();
        let job = Job {
            coll: Collective::AllReduce,
            proxy: Proxy::Eager,
            dtype: DataType::Float,
            op: RedOp::Sum,
            rank: 0,
            nranks: 2,
            layout,
            plan: &plan,
        };
        let mut b = job.buffers(false);
        job.init(&mut b, 1);
        assert_eq!(job.check(&b, 1), 16);
    }
}
