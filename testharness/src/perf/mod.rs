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
use crate::cli::{Args, Baseline, Collective};
use crate::coll::{self, Ring};
use crate::cputime::CpuUse;
use crate::deviations;
use crate::mesh::{Mesh, Sharing};
use crate::plugin::{self, Handle, Net, Properties};
use crate::report::{self, BaselineRow, Measure, Row};
use crate::stats::{self, RankStats};
use crate::vdevice::{self, VDevice};

mod job;
mod p2p;

pub use job::{plan_for, Layout};
use job::{Conns, Job};

/// Errors of a rank.
pub type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// How long ranks wait for each other in the rendezvous.
const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(120);

/// A size that takes longer than this gets a progress line on stderr.
const PROGRESS_AFTER: Duration = Duration::from_secs(1);

/// Exit code for a run with wrong data.
pub const EXIT_WRONG: i32 = 1;

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
pub(crate) struct StatsFile {
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

/// What every mode of a rank shares once the plugin is loaded and the ranks have met: the
/// header's plugin lines, the JSON's plugin and device objects, and the end-of-run gathers.
pub(crate) struct Session<'a> {
    pub(crate) args: &'a Args,
    pub(crate) net: &'a Net,
    /// The `NCCL_NET_PLUGIN` value used.
    pub(crate) value: &'a str,
    /// `devices()` as last called (with `--vdevice`: after `makeVDevice`).
    pub(crate) ndev: i32,
    /// The device of every `listen`/`connect`: `--dev`, or the virtual device of `--vdevice`.
    pub(crate) dev: i32,
    /// `--vdevice`: the virtual device made for this run.
    pub(crate) vdevice: Option<&'a VDevice>,
    pub(crate) props: &'a Properties,
    pub(crate) place: &'a bootstrap::Placement,
    /// Per rank: pid, host, plugin file, device (allgathered).
    pub(crate) ranks: &'a [Value],
    pub(crate) stats_file: Option<&'a StatsFile>,
}

impl Session<'_> {
    /// The `# plugin:`, `# transport:`, `#  Using virtual device` (`--vdevice`) and `#  Rank`
    /// lines of the header.
    pub(crate) fn write_plugin_lines(&self, o: &mut impl Write) -> std::io::Result<()> {
        let (net, props) = (self.net, self.props);
        let transport =
            env::var("VERBSNET_TRANSPORT").unwrap_or_else(|_| "unset (plugin default)".into());
        writeln!(
            o,
            "# plugin: {} ({}) from {} [{}]  NCCL_NET_PLUGIN={}",
            net.name(),
            net.symbol(),
            net.path().display(),
            canonical(net.path()).display(),
            self.value,
        )?;
        writeln!(
            o,
            "# transport: VERBSNET_TRANSPORT={transport}; dev {} of {}: \"{}\" speed {} Mbps \
             latency {} us ptrSupport {} maxComms {} maxRecvs {}{}",
            self.dev,
            self.ndev,
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
        if let Some(v) = self.vdevice {
            writeln!(o, "{}", v.line())?;
        }
        for r in self.ranks {
            writeln!(
                o,
                "#  Rank {:>3} Pid {:>7} on {} device {} ({}) plugin {}",
                r["rank"],
                r["pid"],
                r["host"].as_str().unwrap_or("?"),
                self.dev,
                r["device"].as_str().unwrap_or("?"),
                r["plugin_file"].as_str().unwrap_or("?"),
            )?;
        }
        Ok(())
    }

    /// `--json`'s `plugin` object.
    pub(crate) fn plugin_json(&self) -> Value {
        let net = self.net;
        json!({
            "name": net.name(),
            "symbol": net.symbol(),
            "value": self.value,
            "path": net.path().display().to_string(),
            "file": canonical(net.path()).display().to_string(),
        })
    }

    /// `--json`'s `device` object.
    pub(crate) fn device_json(&self) -> Value {
        json!({
            "index": self.dev,
            "count": self.ndev,
            "name": self.props.name,
            "speed_mbps": self.props.speed,
            "ptr_support": ptr_support(self.props.ptr_support),
            "vdevice": self.vdevice.map(VDevice::to_json),
        })
    }

    /// Every rank's plugin counters (`--stats`; empty without it). Collective: every rank
    /// calls it.
    ///
    /// # Errors
    /// Rendezvous failures.
    pub(crate) fn gather_stats(&self, boot: &mut Bootstrap) -> Result<Vec<RankStats>> {
        let Some(f) = self.stats_file else {
            return Ok(Vec::new());
        };
        let mine = f.read(self.place.rank).to_json().to_string();
        Ok(boot
            .allgather(mine.as_bytes())?
            .iter()
            .filter_map(|b| serde_json::from_slice(b).ok())
            .filter_map(|v: Value| RankStats::from_json(&v))
            .collect())
    }
}

/// What the plugin logged through the logger `init` got (per rank), and the contract
/// deviations seen (merged over ranks). Collective: every rank calls it.
///
/// # Errors
/// Rendezvous failures.
pub(crate) fn gather_logs(boot: &mut Bootstrap) -> Result<(Vec<Value>, Value)> {
    let mine = json!({"log": plugin::logger::seen().to_json(), "deviations": deviations::all()});
    let (logs, devs): (Vec<Value>, Vec<Value>) = boot
        .allgather(mine.to_string().as_bytes())?
        .iter()
        .map(|b| serde_json::from_slice::<Value>(b).unwrap_or(Value::Null))
        .map(|v| (v["log"].clone(), v["deviations"].clone()))
        .unzip();
    Ok((logs, deviations::merge(&devs)))
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
        args.warmup_iters(),
        args.iters()
    );
    let sizes = args.sizes();
    let mut rows = Vec::with_capacity(sizes.len());
    for (i, &bytes) in sizes.iter().enumerate() {
        let started = Instant::now();
        let layout = Layout::new(args.collective, bytes, args.datatype, n);
        let plan = plan_for(args.collective, &layout, args.datatype, rank, n, chunk);
        let send: usize = plan.sends.iter().map(|s| s.len).sum();
        let recv: usize = plan.recvs.iter().map(|r| r.len).sum();
        let mine = ring.measure(boot, send, recv, args.warmup_iters(), args.iters(), chunk)?;
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
    // --vdevice: NIC fusion as NCCL's topology code does it, after init and the device
    // listing and before any listen (src/graph/topo.cc: ncclTopoProcessNet).
    let vdev = match &args.vdevice {
        Some(list) => Some(vdevice::make(&net, &list.0, ndev)?),
        None if ndev <= 0 || args.dev >= ndev || args.dev < 0 => {
            return Err(format!(
                "plugin reports {ndev} device(s); --dev {} is not one",
                args.dev
            )
            .into());
        }
        None => None,
    };
    let (dev, ndev) = vdev
        .as_ref()
        .map_or((args.dev, ndev), |v| (v.index, v.devices_after));
    let props = net.properties(dev)?;
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
        let (bytes, listens) = Mesh::listen(&net, dev, place.rank, n, conns)?;
        (bytes, None, listens)
    } else {
        let (handle, listen) = net.listen(dev)?;
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

    let session = Session {
        args,
        net: &net,
        value: &value,
        ndev,
        dev,
        vdevice: vdev.as_ref(),
        props: &props,
        place: &place,
        ranks: &ranks,
        stats_file: stats_file.as_ref(),
    };
    if args.collective.is_p2p() {
        let listen = listen.ok_or("the point-to-point modes listen once")?;
        return p2p::run(&session, &mut boot, &all_handles, listen);
    }

    let chunk = args.chunk as usize;
    let mut conns = match listen {
        Some(listen) => {
            let handles: Vec<Handle> = all_handles
                .iter()
                .map(|b| Handle::from_bytes(b).ok_or("a rank sent a handle of the wrong size"))
                .collect::<std::result::Result<_, _>>()?;
            let mut ring = Ring::connect(&net, dev, place.rank, &handles, listen, chunk)?;
            ring.set_spin(args.spin);
            Conns::Ring(Box::new(ring))
        }
        None => Conns::Mesh(Mesh::connect(
            &net,
            dev,
            place.rank,
            &all_handles,
            listens,
            chunk,
            sharing,
        )?),
    };
    boot.barrier()?;

    let root = place.rank == 0;
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
             chunk: {chunk} slots: {} proxy: {} spin: {}",
            args.min_bytes,
            args.max_bytes(),
            match (args.step_factor, args.step_bytes) {
                (None, Some(b)) => format!("{b}(bytes)"),
                (f, _) => format!("{}(factor)", f.unwrap_or(2)),
            },
            args.warmup_iters(),
            args.iters(),
            args.check,
            coll::SLOTS,
            args.proxy.name(),
            args.spin,
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
        session.write_plugin_lines(&mut o)?;
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
    let stats = session.gather_stats(&mut boot)?;
    let (logs, devs) = gather_logs(&mut boot)?;
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
                "iters": args.iters(),
                "warmup_iters": args.warmup_iters(),
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
                "spin": args.spin,
                "plugin": session.plugin_json(),
                "transport": env::var("VERBSNET_TRANSPORT").ok(),
                "device": session.device_json(),
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
pub(crate) fn warn_summary(logs: &[Value]) -> Option<String> {
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
}
