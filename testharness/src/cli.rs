//! Command line, shaped like nccl-tests' `*_perf` binaries.

use std::fmt;

use clap::{Parser, ValueEnum};

use crate::data::{DataType, RedOp};

/// `NCCL_NET_MAX_REQUESTS`: the most requests NCCL keeps outstanding per comm (v7+; v6 had 8),
/// so the largest `--window`.
pub const MAX_REQUESTS: usize = nccl_net_verbsnet::ffi::abi::NCCL_NET_MAX_REQUESTS as usize;

/// The collective to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Collective {
    /// Ring all-reduce: reduce-scatter, then all-gather.
    #[value(name = "all_reduce", alias = "allreduce", alias = "all-reduce")]
    AllReduce,
    /// Ring all-gather.
    #[value(name = "all_gather", alias = "allgather", alias = "all-gather")]
    AllGather,
    /// Ring reduce-scatter.
    #[value(
        name = "reduce_scatter",
        alias = "reducescatter",
        alias = "reduce-scatter"
    )]
    ReduceScatter,
    /// Each rank sends to rank+1 and receives from rank-1.
    Sendrecv,
    /// Each rank sends block p of its input to rank p over a full mesh of connections; with
    /// `--shared-comms K`, K local senders share each connection (NCCL_NET_SHARED_COMMS).
    #[value(name = "alltoall", alias = "all_to_all", alias = "all-to-all")]
    Alltoall,
    /// Point-to-point stream between 2 ranks, like perftest's `ib_send_bw`: rank 0 sends, rank
    /// 1 receives, `--window` messages in flight; `--bidir`: both ranks send and receive.
    Stream,
    /// Point-to-point ping-pong between 2 ranks, like perftest's `ib_send_lat`: rank 0 sends,
    /// rank 1 echoes; one-way latency = round trip / 2.
    Latency,
}

impl Collective {
    /// Name as in the nccl-tests binary names (`all_reduce_perf` → `all_reduce`).
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Sendrecv => "sendrecv",
            Collective::Alltoall => "alltoall",
            Collective::Stream => "stream",
            Collective::Latency => "latency",
        }
    }

    /// Whether this is one of the point-to-point modes ([`Collective::Stream`],
    /// [`Collective::Latency`]): 2 ranks, perftest-shaped output, no collective data layout.
    pub fn is_p2p(self) -> bool {
        matches!(self, Collective::Stream | Collective::Latency)
    }

    /// Whether the `redop` column (and `-o`) applies.
    pub fn reduces(self) -> bool {
        matches!(self, Collective::AllReduce | Collective::ReduceScatter)
    }

    /// busbw = algbw × factor (nccl-tests' PERFORMANCE.md): 2(n-1)/n for all-reduce, (n-1)/n for
    /// all-gather, reduce-scatter (whose size is the total over ranks) and alltoall (size: the
    /// bytes each rank sends, its own block included), 1 for sendrecv (and the point-to-point
    /// modes, which print no busbw).
    pub fn busbw_factor(self, nranks: usize) -> f64 {
        let n = nranks as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather | Collective::ReduceScatter | Collective::Alltoall => {
                (n - 1.0) / n
            }
            Collective::Sendrecv | Collective::Stream | Collective::Latency => 1.0,
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `--transport`: sets `VERBSNET_TRANSPORT` for the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// The userspace TCP transport.
    Tcp,
    /// RDMA verbs.
    Ib,
    /// ib when a usable device exists, else tcp.
    Auto,
}

impl Transport {
    /// The `VERBSNET_TRANSPORT` value.
    pub fn env_value(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Ib => "ib",
            Transport::Auto => "auto",
        }
    }
}

/// `--proxy`: how the harness's proxy calls the plugin. Both are calls NCCL's proxy may make
/// (`src/transport/net.cc`); they differ in how soon completions are looked at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Proxy {
    /// Every pass makes one step per op, as NCCL's proxy does (`src/transport/net.cc`): a
    /// receive posted into a free slot or, when none was, the oldest receive tested; a send
    /// isent once (a refused one retried on a later pass) or, when none started, the oldest
    /// send tested. Completions are seen within a pass or two of happening.
    #[default]
    Eager,
    /// The least polite order NCCL may use: every receive slot posted ahead, then every send
    /// whose data is ready isent, retrying "retry later" without calling anything else, and
    /// only then receives and sends tested (completions consumed late, never a call made just
    /// to pump progress). A plugin must move data for posted receives without the receiver
    /// calling it again.
    Lazy,
}

impl Proxy {
    /// The value as typed.
    pub fn name(self) -> &'static str {
        match self {
            Proxy::Eager => "eager",
            Proxy::Lazy => "lazy",
        }
    }
}

/// `--baseline`: a reference run over something that is not the plugin, in the same run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Baseline {
    /// After the plugin run, the same ranks stream the same bytes over a plain
    /// `std::net::TcpStream` ring (rank r → r+1) and print a second table with the ratio.
    Tcp,
}

impl Baseline {
    /// The value as typed.
    pub fn name(self) -> &'static str {
        match self {
            Baseline::Tcp => "tcp",
        }
    }
}

/// Runs nccl-tests-style collectives across processes through the verbsnet NCCL net plugin,
/// loaded exactly as NCCL loads it (NCCL_NET_PLUGIN, default "verbsnet").
#[derive(Clone, Debug, Parser)]
#[command(
    name = "verbsnet-perf",
    version,
    after_help = "\
Sizes take K/M/G suffixes (powers of 1024), e.g. 8, 64K, 32M, 1G.

Launching:
  verbsnet-perf all_reduce --ranks 4 -b 8 -e 128M -f 2      local: 4 processes on 127.0.0.1
  verbsnet-perf sendrecv --rank R --nranks N --master host:port
  mpirun -np N verbsnet-perf all_gather ...                  (OMPI_COMM_WORLD_*, PMI_*, SLURM_*,
                                                              or RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT)

Environment: NCCL_NET_PLUGIN (plugin to load), NCCL_NET (expected plugin name),
VERBSNET_TRANSPORT (set by --transport), VERBSNET_STATS_FILE (set per rank by --stats)."
)]
pub struct Args {
    /// Collective to run.
    #[arg(value_enum)]
    pub collective: Collective,

    /// Smallest size in bytes.
    #[arg(short = 'b', long = "minbytes", value_name = "SIZE", default_value = "32M", value_parser = parse_size)]
    pub min_bytes: u64,

    /// Largest size in bytes [default: minbytes].
    #[arg(short = 'e', long = "maxbytes", value_name = "SIZE", value_parser = parse_size)]
    pub max_bytes: Option<u64>,

    /// Multiply the size by this factor between steps [default: 2].
    #[arg(short = 'f', long = "stepfactor", value_name = "FACTOR")]
    pub step_factor: Option<u64>,

    /// Add this many bytes between steps (used when -f is not given).
    #[arg(short = 'i', long = "stepbytes", value_name = "SIZE", value_parser = parse_size)]
    pub step_bytes: Option<u64>,

    /// Timed iterations per size [default: 20; stream and latency: 1000 messages or round
    /// trips].
    #[arg(short = 'n', long = "iters", value_name = "N")]
    pub iters_arg: Option<u32>,

    /// Untimed warm-up iterations per size [default: 1; stream and latency: iters / 10, at
    /// least the window].
    #[arg(short = 'w', long = "warmup_iters", value_name = "N")]
    pub warmup_arg: Option<u32>,

    /// Data-checked iterations per size (0 = no check).
    #[arg(short = 'c', long = "check", value_name = "N", default_value_t = 1)]
    pub check: u32,

    /// Reduction operator.
    #[arg(short = 'o', long = "op", value_enum, default_value_t = RedOp::Sum)]
    pub op: RedOp,

    /// Element type.
    #[arg(short = 'd', long = "datatype", value_enum, default_value_t = DataType::Float)]
    pub datatype: DataType,

    /// stream: messages in flight per direction (sends posted ahead of their completions, and
    /// receives posted ahead, each on its own registered slot, as NCCL's proxy posts a step per
    /// slot); latency: receives posted ahead. At most NCCL_NET_MAX_REQUESTS (32; 8 for a v6
    /// table) [default: stream 32, latency 8 (NCCL_STEPS)].
    #[arg(short = 'W', long, value_name = "N")]
    pub window: Option<usize>,

    /// stream: both ranks send and receive at once (perftest's `-b`); the bandwidth printed is
    /// the sum of both directions, as perftest prints it.
    #[arg(long)]
    pub bidir: bool,

    /// stream and latency: time every isend, irecv and test the proxy makes (wall time, by
    /// what the call did: started a request or answered "retry later", found it done or
    /// pending) and print each rank's calls per iteration and mean µs per call after each
    /// size (`call_times` in --json): the plugin's own cost per message, apart from the
    /// proxy's. Off by default: two clock reads per call (about 50 ns).
    #[arg(long)]
    pub call_times: bool,

    /// Idle passes of the proxy loop spent spinning (no system call) before it yields the core
    /// (perftest's loops never yield). 0: yield at once, the best choice where ranks share
    /// cores with each other or other work, and on soft-RoCE (rxe progresses in kernel threads
    /// a spinning rank starves). Not alltoall, which always yields.
    #[arg(long, value_name = "PASSES", default_value_t = 0)]
    pub spin: u32,

    /// Bytes per proxy slot (NCCL SIMPLE step: NCCL_BUFFSIZE 4 MiB / 8 steps).
    #[arg(long, value_name = "SIZE", default_value = "512K", value_parser = parse_size)]
    pub chunk: u64,

    /// Local mode: spawn this many ranks of this program on 127.0.0.1.
    #[arg(long, value_name = "N", conflicts_with_all = ["rank", "nranks", "master"])]
    pub ranks: Option<usize>,

    /// This process's rank (with --nranks; overrides launcher variables).
    #[arg(long, value_name = "R", requires = "nranks")]
    pub rank: Option<usize>,

    /// Number of ranks (with --rank).
    #[arg(long, value_name = "N", requires = "rank")]
    pub nranks: Option<usize>,

    /// host:port of the rendezvous served by rank 0 [default: MASTER_ADDR:MASTER_PORT].
    #[arg(long, value_name = "HOST:PORT")]
    pub master: Option<String>,

    /// Plugin transport; sets VERBSNET_TRANSPORT for the ranks [default: leave it as is].
    #[arg(long, value_enum)]
    pub transport: Option<Transport>,

    /// Plugin device index to use.
    #[arg(long, default_value_t = 0)]
    pub dev: i32,

    /// NIC fusion: fuse these 2 to 8 distinct physical devices (comma list, e.g. 0,1; at most
    /// 4 for ncclNet v9-v11) into one virtual device with the plugin's makeVDevice, as NCCL's
    /// topology code does (src/graph/topo.cc), and run on it instead of --dev. Needs v9+.
    #[arg(long, value_name = "DEVS", value_parser = parse_vdevice, conflicts_with = "dev")]
    pub vdevice: Option<DevList>,

    /// alltoall: K senders of each rank per peer, each with its own tag, as NCCL's local ranks
    /// of a node under NCCL_NET_SHARED_COMMS (PXN). As NCCL: with the plugin's maxRecvs > 1
    /// they share one connection and the receiver groups them into irecvs of up to maxRecvs
    /// buffers; with maxRecvs 1 each sender gets its own connection. 1..=8.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub shared_comms: usize,

    /// How the proxy calls the plugin: eager (default: completions seen at once) or lazy
    /// (receives posted ahead, sends spun on, completions consumed late).
    #[arg(long, value_enum, default_value_t = Proxy::Eager)]
    pub proxy: Proxy,

    /// alltoall: each shared sender's next piece becomes ready after a random delay of up to
    /// this many microseconds (seeded by --seed), so the senders of a connection drift apart.
    #[arg(long, value_name = "US", default_value_t = 100)]
    pub skew_us: u64,

    /// Seed of the alltoall skew and of the order of tags inside each grouped receive.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// ncclNet ABI version to drive (6..=12) [default: the newest the plugin exports, probed
    /// v12 → v6 as NCCL does].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(6..=12))]
    pub net_version: Option<u32>,

    /// After the plugin run, stream the same bytes per ring link over plain TCP sockets between
    /// the same ranks, and report that bandwidth and the ratio plugin/baseline per size.
    #[arg(long, value_enum, value_name = "KIND")]
    pub baseline: Option<Baseline>,

    /// Print one JSON object (rows, average bus bandwidth) instead of the table.
    #[arg(long)]
    pub json: bool,

    /// After the run, print the plugin's per-rank counters (from VERBSNET_STATS_FILE).
    #[arg(long)]
    pub stats: bool,

    /// Local mode: kill all ranks after this many seconds (0 = never).
    #[arg(short = 'T', long, value_name = "SECONDS", default_value_t = 0)]
    pub timeout: u64,

    /// Test hook: this rank damages its result before each check.
    #[arg(long, hide = true)]
    pub debug_corrupt_rank: Option<usize>,

    /// Test hook: this rank fails at start-up (before the rendezvous).
    #[arg(long, hide = true)]
    pub debug_fail_rank: Option<usize>,

    /// Fault trials (`stream`, `latency`): after this many messages received, the receiving
    /// end stops calling the plugin for good (the process stays alive, its comms open): the
    /// peer's `isend` then answers "retry later", waiting for receives that never come, until
    /// the peer is killed or cut off (`testharness/softroce/twohost-trials.sh`, `*_retry`).
    #[arg(long, hide = true, value_name = "MESSAGES")]
    pub debug_stall_recv_after: Option<u64>,
}

impl Args {
    /// Checks the combinations clap cannot express.
    ///
    /// # Errors
    /// A message for the user.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_bytes() < self.min_bytes {
            return Err(format!(
                "maxbytes ({}) is smaller than minbytes ({})",
                self.max_bytes(),
                self.min_bytes
            ));
        }
        if self.step_factor == Some(0) || self.step_factor == Some(1) {
            return Err("stepfactor must be at least 2".into());
        }
        if self.step_factor.is_none() && self.step_bytes == Some(0) {
            return Err("stepbytes must be positive".into());
        }
        if self.chunk == 0 || self.chunk & 7 != 0 || self.chunk > (1 << 30) {
            return Err(format!(
                "chunk must be a multiple of 8 bytes, at most 1G, not {}",
                self.chunk
            ));
        }
        if self.ranks == Some(0) || self.nranks == Some(0) {
            return Err("the number of ranks must be positive".into());
        }
        if let (Some(r), Some(n)) = (self.rank, self.nranks) {
            if r >= n {
                return Err(format!("rank {r} is not below nranks {n}"));
            }
        }
        if self.iters() == 0 {
            return Err("iters must be positive".into());
        }
        if self.collective.is_p2p() {
            if self.ranks.or(self.nranks).is_some_and(|n| n != 2) {
                return Err(format!(
                    "{} runs between exactly 2 ranks (rank 0 and rank 1)",
                    self.collective
                ));
            }
            if let Some(w) = self.window {
                if !(1..=MAX_REQUESTS).contains(&w) {
                    return Err(format!(
                        "--window must be 1..={MAX_REQUESTS} (NCCL_NET_MAX_REQUESTS: the most \
                         requests NCCL keeps per comm), not {w}"
                    ));
                }
            }
            if self.bidir && self.collective != Collective::Stream {
                return Err("--bidir applies to stream only".into());
            }
            if self.proxy != Proxy::Eager {
                return Err(format!(
                    "--proxy applies to the collectives; {} calls the plugin as NCCL's proxy \
                     does for one point-to-point connection",
                    self.collective
                ));
            }
        } else if self.window.is_some() || self.bidir || self.call_times {
            return Err(
                "--window, --bidir and --call-times apply to stream and latency only".into(),
            );
        }
        if !(1..=8).contains(&self.shared_comms) {
            return Err(format!(
                "--shared-comms must be 1..=8, not {}",
                self.shared_comms
            ));
        }
        if self.shared_comms > 1 && self.collective != Collective::Alltoall {
            return Err("--shared-comms applies to alltoall only".into());
        }
        if self.baseline.is_some()
            && (self.collective == Collective::Alltoall || self.collective.is_p2p())
        {
            return Err(format!(
                "--baseline streams ring links; {} has no ring",
                self.collective
            ));
        }
        Ok(())
    }

    /// Timed iterations per size (`-n`, or the mode's default).
    pub fn iters(&self) -> u32 {
        self.iters_arg
            .unwrap_or(if self.collective.is_p2p() { 1000 } else { 20 })
    }

    /// Untimed warm-up iterations per size (`-w`, or the mode's default).
    pub fn warmup_iters(&self) -> u32 {
        self.warmup_arg.unwrap_or(if self.collective.is_p2p() {
            (self.iters() / 10).max(self.window() as u32)
        } else {
            1
        })
    }

    /// The point-to-point window (`-W`, or the mode's default).
    pub fn window(&self) -> usize {
        self.window.unwrap_or(match self.collective {
            Collective::Stream => MAX_REQUESTS,
            _ => crate::coll::SLOTS,
        })
    }

    /// The effective largest size.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes.unwrap_or(self.min_bytes)
    }

    /// The requested sizes, nccl-tests style.
    pub fn sizes(&self) -> Vec<u64> {
        let step = match (self.step_factor, self.step_bytes) {
            (None, Some(bytes)) => Step::Add(bytes),
            (factor, _) => Step::Mul(factor.unwrap_or(2)),
        };
        size_sweep(self.min_bytes, self.max_bytes(), step)
    }
}

/// `--vdevice`: the physical devices to fuse, in the order given (2 to
/// [`MAX_VDEVICE_DEVS`] distinct indices, as [`parse_vdevice`] checks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevList(pub Vec<i32>);

impl fmt::Display for DevList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s: Vec<String> = self.0.iter().map(i32::to_string).collect();
        f.write_str(&s.join(","))
    }
}

/// The most physical devices one virtual device fuses: NCCL's `NCCL_NET_MAX_DEVS_PER_NIC`
/// (ncclNet v12; 4 for v9-v11, checked once the table is known).
pub const MAX_VDEVICE_DEVS: usize =
    nccl_net_verbsnet::ffi::abi::NCCL_NET_MAX_DEVS_PER_NIC_V12 as usize;

/// Parses `--vdevice`: a comma list of 2 to [`MAX_VDEVICE_DEVS`] distinct device indices
/// (`0,1`). NCCL never asks for a virtual device of one device (`src/graph/topo.cc`:
/// `ncclTopoMakeVnic` skips a group of 1) and places each physical device in one group.
///
/// # Errors
/// A message naming the rule broken.
pub fn parse_vdevice(s: &str) -> Result<DevList, String> {
    let mut devs = Vec::new();
    for x in s.split(',').map(str::trim) {
        let d: i32 = x
            .parse()
            .ok()
            .filter(|d| *d >= 0)
            .ok_or_else(|| format!("{x:?} is not a device index (a list such as 0,1)"))?;
        if devs.contains(&d) {
            return Err(format!(
                "device {d} is listed twice: a virtual device fuses distinct physical devices \
                 (NCCL puts each device in one group: src/graph/topo.cc)"
            ));
        }
        devs.push(d);
    }
    if devs.len() < 2 || devs.len() > MAX_VDEVICE_DEVS {
        return Err(format!(
            "{} device(s): a virtual device fuses 2 to {MAX_VDEVICE_DEVS} physical devices \
             (4 for ncclNet v9-v11; NCCL never calls makeVDevice for one: src/graph/topo.cc, \
             ncclTopoMakeVnic); for one device use --dev",
            devs.len()
        ));
    }
    Ok(DevList(devs))
}

/// How sizes grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Multiply by a factor (≥ 2).
    Mul(u64),
    /// Add bytes (> 0).
    Add(u64),
}

/// min, min·f, min·f², … ≤ max (or min, min+s, …). A min of 0 with a factor yields just 0.
pub fn size_sweep(min: u64, max: u64, step: Step) -> Vec<u64> {
    let mut sizes = Vec::new();
    let mut size = min;
    while size <= max {
        sizes.push(size);
        let next = match step {
            Step::Mul(f) => size.saturating_mul(f),
            Step::Add(s) => size.saturating_add(s),
        };
        if next <= size {
            break;
        }
        size = next;
    }
    sizes
}

/// Parses `8`, `64K`, `32M`, `1G` (also `kb`/`KiB`-style spellings; powers of 1024).
///
/// # Errors
/// A message naming the bad value.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    if num.is_empty() {
        return Err(format!("{s:?} is not a size (examples: 8, 64K, 32M, 1G)"));
    }
    let n: u64 = num
        .parse()
        .map_err(|e| format!("{s:?} is not a size: {e}"))?;
    let mult: u64 = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => {
            return Err(format!(
                "{s:?} has an unknown suffix {suffix:?} (use K, M or G)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_size("32M"), Ok(32 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2KiB"), Ok(2048));
        assert_eq!(parse_size("3MB"), Ok(3 << 20));
        assert_eq!(parse_size("100b"), Ok(100));
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }

    #[test]
    fn sweep_multiplies_or_adds() {
        assert_eq!(size_sweep(8, 128, Step::Mul(2)), vec![8, 16, 32, 64, 128]);
        assert_eq!(size_sweep(8, 100, Step::Mul(4)), vec![8, 32]);
        assert_eq!(size_sweep(8, 1 << 20, Step::Mul(4)).len(), 9);
        assert_eq!(size_sweep(1, 10, Step::Add(4)), vec![1, 5, 9]);
        assert_eq!(size_sweep(32, 32, Step::Mul(2)), vec![32]);
        assert_eq!(size_sweep(0, 64, Step::Mul(2)), vec![0]);
        // Saturation ends the sweep instead of wrapping around.
        assert_eq!(
            size_sweep(u64::MAX - 1, u64::MAX, Step::Mul(2)),
            vec![u64::MAX - 1, u64::MAX]
        );
    }

    #[test]
    fn busbw_factors_follow_nccl_tests() {
        assert_eq!(Collective::AllReduce.busbw_factor(2), 1.0);
        assert_eq!(Collective::AllReduce.busbw_factor(4), 1.5);
        assert_eq!(Collective::AllGather.busbw_factor(4), 0.75);
        assert_eq!(Collective::ReduceScatter.busbw_factor(2), 0.5);
        assert_eq!(Collective::Sendrecv.busbw_factor(8), 1.0);
        assert_eq!(Collective::AllReduce.busbw_factor(1), 0.0);
    }

    #[test]
    fn cli_defaults_and_flags() {
        let a = Args::try_parse_from(["verbsnet-perf", "all_reduce"]).unwrap();
        assert_eq!(a.min_bytes, 32 << 20);
        assert_eq!(a.max_bytes(), 32 << 20);
        assert_eq!(a.iters(), 20);
        assert_eq!(a.warmup_iters(), 1);
        assert_eq!(a.check, 1);
        assert_eq!(a.op, RedOp::Sum);
        assert_eq!(a.datatype, DataType::Float);
        assert_eq!(a.chunk, 512 << 10);
        assert_eq!(a.sizes(), vec![32 << 20]);
        assert_eq!(a.baseline, None);
        assert_eq!(a.proxy, Proxy::Eager);

        let a = Args::try_parse_from([
            "verbsnet-perf",
            "reduce_scatter",
            "-b",
            "8",
            "-e",
            "1M",
            "-f",
            "4",
            "-n",
            "2",
            "-w",
            "0",
            "-c",
            "3",
            "-o",
            "max",
            "-d",
            "f64",
            "--ranks",
            "3",
            "--transport",
            "tcp",
            "--json",
            "--baseline",
            "tcp",
            "--proxy",
            "lazy",
        ])
        .unwrap();
        assert_eq!(a.proxy, Proxy::Lazy);
        assert_eq!(a.collective, Collective::ReduceScatter);
        assert_eq!(a.sizes().len(), 9);
        assert_eq!(a.op, RedOp::Max);
        assert_eq!(a.datatype, DataType::Float64);
        assert_eq!(a.ranks, Some(3));
        assert_eq!(a.transport, Some(Transport::Tcp));
        assert!(a.json);
        assert_eq!(a.baseline, Some(Baseline::Tcp));
        assert!(a.validate().is_ok());

        let a =
            Args::try_parse_from(["x", "sendrecv", "-b", "1K", "-e", "4K", "-i", "1K"]).unwrap();
        assert_eq!(a.sizes(), vec![1024, 2048, 3072, 4096]);

        let a = Args::try_parse_from(["x", "allreduce", "-d", "int32", "-o", "prod"]).unwrap();
        assert_eq!(a.collective, Collective::AllReduce);
        assert_eq!(a.datatype, DataType::Int32);
    }

    #[test]
    fn point_to_point_defaults_follow_perftest_and_nccl() {
        let a = Args::try_parse_from(["x", "stream"]).unwrap();
        assert_eq!(
            (a.iters(), a.warmup_iters(), a.window(), a.spin),
            (1000, 100, 32, 0)
        );
        assert!(a.validate().is_ok());
        let a = Args::try_parse_from(["x", "latency", "-n", "50"]).unwrap();
        assert_eq!((a.iters(), a.warmup_iters(), a.window()), (50, 8, 8));
        let a = Args::try_parse_from(["x", "stream", "-n", "10", "-w", "0", "-W", "4"]).unwrap();
        assert_eq!((a.iters(), a.warmup_iters(), a.window()), (10, 0, 4));
        let a = Args::try_parse_from(["x", "sendrecv", "--spin", "7"]).unwrap();
        assert_eq!((a.iters(), a.warmup_iters(), a.spin), (20, 1, 7));
    }

    #[test]
    fn vdevice_lists_follow_nccls_rules() {
        let a = Args::try_parse_from(["x", "all_reduce", "--vdevice", "0,1"]).unwrap();
        assert_eq!(a.vdevice, Some(DevList(vec![0, 1])));
        assert_eq!(a.vdevice.unwrap().to_string(), "0,1");
        assert_eq!(parse_vdevice("3, 1,2"), Ok(DevList(vec![3, 1, 2])));
        assert_eq!(parse_vdevice("0,1,2,3,4,5,6,7").map(|l| l.0.len()), Ok(8));
        for (bad, rule) in [
            ("0", "fuses 2 to 8"),
            ("0,0", "listed twice"),
            ("1,0,1", "listed twice"),
            ("0,1,2,3,4,5,6,7,8", "fuses 2 to 8"),
            ("0,-1", "not a device index"),
            ("0,x", "not a device index"),
            ("", "not a device index"),
        ] {
            let e = parse_vdevice(bad).unwrap_err();
            assert!(e.contains(rule), "{bad:?}: {e}");
        }
        // Through clap: refused at parse time; --dev and --vdevice exclude each other.
        assert!(Args::try_parse_from(["x", "all_reduce", "--vdevice", "0"]).is_err());
        assert!(
            Args::try_parse_from(["x", "all_reduce", "--vdevice", "0,1", "--dev", "1"]).is_err()
        );
    }

    #[test]
    fn cli_rejects_bad_combinations() {
        assert!(Args::try_parse_from(["x", "all_reduce", "--ranks", "2", "--rank", "0"]).is_err());
        assert!(Args::try_parse_from(["x", "all_reduce", "--rank", "0"]).is_err());
        assert!(Args::try_parse_from(["x", "bcast"]).is_err());
        let a = Args::try_parse_from(["x", "all_reduce", "-b", "1M", "-e", "1K"]).unwrap();
        assert!(a.validate().is_err());
        let a = Args::try_parse_from(["x", "all_reduce", "-f", "1"]).unwrap();
        assert!(a.validate().is_err());
        let a = Args::try_parse_from([
            "x",
            "all_reduce",
            "--rank",
            "2",
            "--nranks",
            "2",
            "--master",
            "h:1",
        ])
        .unwrap();
        assert!(a.validate().is_err());
    }
}
