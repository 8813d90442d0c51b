//! Configuration from `VERBSNET_*` environment variables, parsed once in `init`.
//!
//! Every knob is declared once, in [`KNOBS`]: name, type and range ([`Kind`]), default,
//! documentation and NCCL IB equivalent. The parser takes its ranges and error texts from
//! there, [`Config::describe`] its names, and docs/configuration.md's knob tables are generated
//! from it ([`doc_table`]; a unit test fails when the page differs and `VERBSNET_BLESS=1`
//! regenerates it); another test checks the registry's default texts against
//! [`Config::default`]. A bad value fails `init` with an error naming the variable, the value
//! and what is accepted, e.g.
//! `VERBSNET_RQ_DEPTH="abc" is not valid: expected an integer in 1..=32768`.
//!
//! Rules common to every knob: an unset or empty (all-whitespace) value means "use the
//! default"; surrounding whitespace is ignored; keywords are case-insensitive.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::Duration;

/// Which transport to use (`VERBSNET_TRANSPORT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportChoice {
    /// ib when a usable verbs device exists, else tcp (the choice is logged).
    Auto,
    /// Real verbs; init fails when none is usable.
    Ib,
    /// The userspace TCP stand-in.
    Tcp,
}

/// How much the plugin logs (`VERBSNET_DEBUG`). Ordered: `None < Warn < ... < Trace`.
///
/// Each level includes the ones before it; `Warn` also passes `ERROR` events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DebugLevel {
    /// Nothing at all.
    None,
    /// Errors and warnings.
    Warn,
    /// Plus setup lines (devices, effective configuration, connections).
    Info,
    /// Plus unusual-but-handled conditions.
    Debug,
    /// Plus per-request hot-path events (costly).
    Trace,
}

impl DebugLevel {
    /// The keyword accepted by `VERBSNET_DEBUG`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            DebugLevel::None => "none",
            DebugLevel::Warn => "warn",
            DebugLevel::Info => "info",
            DebugLevel::Debug => "debug",
            DebugLevel::Trace => "trace",
        }
    }
}

/// The plugin's effective configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `VERBSNET_TRANSPORT`: auto | ib | tcp.
    pub transport: TransportChoice,
    /// `VERBSNET_RQ_DEPTH`: receive WRs (and bounce buffers) per connection.
    pub rq_depth: u32,
    /// `VERBSNET_RQ_BATCH`: receive WRs posted per `post_recv` call.
    pub rq_batch: u32,
    /// `VERBSNET_RQ_LOW_WATER`: refill the RQ when fewer than this many WRs are posted (at
    /// full depth; at a smaller adaptive depth, as far below it).
    pub rq_low_water: u32,
    /// `VERBSNET_RQ_MIN_DEPTH`: receive WRs a connection starts with and shrinks back to; it
    /// grows by `rq_batch` (up to `rq_depth`) each time its RQ runs dry. `= rq_depth`: fixed.
    pub rq_min_depth: u32,
    /// `VERBSNET_RQ_SHRINK_AFTER`: idle time without the RQ running dry before the depth
    /// shrinks by a batch (`None` = never).
    pub rq_shrink_after: Option<Duration>,
    /// `VERBSNET_RQ_POOL_SIZE`: bytes of bounce buffers the receive comms of one device in this
    /// process may grow by, together.
    pub rq_pool_size: u64,
    /// `VERBSNET_EAGER_BUF_SIZE`: payload bytes of one bounce buffer.
    pub eager_buf_size: u32,
    /// `VERBSNET_EAGER_LIMIT`: largest message sent eagerly (SEND into a bounce buffer); larger
    /// ones use rendezvous (CTS, then zero-copy RDMA WRITE with immediate).
    pub eager_limit: u32,
    /// `VERBSNET_CREDITS`: credit gating on (1) or off (0, rely on RNR retry as NCCL does).
    pub credits: bool,
    /// `VERBSNET_RNR_TIMER`: IB-encoded minimum RNR NAK timer (0..=31).
    pub rnr_timer: u8,
    /// `VERBSNET_RNR_RETRY`: RNR retries (0..=7, 7 = forever).
    pub rnr_retry: u8,
    /// `VERBSNET_IB_TIMEOUT`: IB-encoded ACK timeout (1..=31).
    pub ib_timeout: u8,
    /// `VERBSNET_IB_RETRY_CNT`: transport retries (0..=7).
    pub ib_retry_cnt: u8,
    /// `VERBSNET_IB_TC`: GRH traffic class of RC QPs (0..=255); a communicator's
    /// `trafficClass` (ncclNet v10+) overrides it.
    pub ib_tc: u8,
    /// `VERBSNET_IB_SL`: service level of RC QPs (0..=15).
    pub ib_sl: u8,
    /// `VERBSNET_IB_HCA`: device filter (`[^][=]name[:port],...`).
    pub ib_hca: Option<String>,
    /// `VERBSNET_IB_GID_INDEX`: force a GID index (default: automatic RoCE v2 IPv4 choice).
    pub ib_gid_index: Option<u32>,
    /// `VERBSNET_SOCKET_ADDR`: IP address for the out-of-band listener (and tcp data).
    pub socket_addr: Option<IpAddr>,
    /// `VERBSNET_SOCKET_IFNAME`: interface list (`[^][=]name,...`, NCCL_SOCKET_IFNAME's
    /// syntax) whose first address the listener uses; see [`crate::ifselect`].
    pub socket_ifname: Option<String>,
    /// `NCCL_SOCKET_IFNAME` as set (used when `VERBSNET_SOCKET_IFNAME` is unset).
    pub nccl_socket_ifname: Option<String>,
    /// `NCCL_SOCKET_FAMILY` as set (`AF_INET` or `AF_INET6`; other values are ignored, as NCCL
    /// does).
    pub nccl_socket_family: Option<String>,
    /// `VERBSNET_SOCKET_KEEPALIVE`: bound for noticing a silent peer host on an ib
    /// connection's set-up socket with TCP keepalive (0 = off).
    pub socket_keepalive: Option<Duration>,
    /// `VERBSNET_HANG_TIMEOUT`: seconds without progress before the watchdog WARNs (0 = off).
    pub hang_timeout: Option<Duration>,
    /// `VERBSNET_STATS_INTERVAL`: seconds between periodic counter lines (0 = off).
    pub stats_interval: Option<Duration>,
    /// `VERBSNET_STATS_FILE`: file each comm appends one JSON line of counters to when it closes.
    pub stats_file: Option<String>,
    /// `VERBSNET_DEBUG`: how much the plugin logs. Default `warn`, or `info` when
    /// `NCCL_DEBUG` is `INFO` or `TRACE` and `VERBSNET_DEBUG` is unset.
    pub debug: DebugLevel,
    /// `VERBSNET_CONNECT_TIMEOUT`: longest a `connect` or an `accept` may take before it fails
    /// naming the peer and the stage reached (`None` = no deadline).
    pub connect_timeout: Option<Duration>,
    /// `VERBSNET_PEER_CHECK_INTERVAL`: how often a comm with work outstanding asks the set-up
    /// socket whether the peer closed (the data path itself makes no such system call).
    pub peer_check_interval: Duration,
    /// Tests only, never read from the environment: the sequence number of a send comm's first
    /// send and receive (production: 0). Tests start near the 29-bit immediate wrap, the CTS
    /// ring's and record ring's slot wrap, to exercise them without 2^29 messages. Keep it more
    /// than a few thousand below 2^64: a CTS entry's sequence word is `r + 1`, which is 0 (read
    /// as "not written yet") for `r = 2^64 - 1` — unreachable from 0 in practice.
    #[doc(hidden)]
    pub test_first_seq: u64,
    /// Tests only, never read from the environment: the generation every send request slot
    /// starts at (production: 0), so a test crosses the 24-bit generation field of `wr_id`s
    /// and the 32-bit wrap of request handles without 2^24 reuses of a slot.
    #[doc(hidden)]
    pub test_first_gen: u32,
}

/// Default `VERBSNET_RQ_DEPTH`.
pub const DEFAULT_RQ_DEPTH: u32 = 128;

/// Default `VERBSNET_RQ_BATCH` at `depth`: the registry's rule `min(16, rq_depth)`.
fn default_rq_batch(depth: u32) -> u32 {
    depth.min(16)
}

/// Default `VERBSNET_RQ_LOW_WATER` at `depth` and the batch in effect:
/// `max(1, rq_depth - rq_batch)`.
fn default_rq_low_water(depth: u32, batch: u32) -> u32 {
    depth.saturating_sub(batch).max(1)
}

/// Default `VERBSNET_RQ_MIN_DEPTH` at `depth`: `min(2, rq_depth)`.
fn default_rq_min_depth(depth: u32) -> u32 {
    depth.min(2)
}

impl Default for Config {
    fn default() -> Self {
        let rq_batch = default_rq_batch(DEFAULT_RQ_DEPTH);
        Config {
            transport: TransportChoice::Auto,
            rq_depth: DEFAULT_RQ_DEPTH,
            rq_batch,
            rq_low_water: default_rq_low_water(DEFAULT_RQ_DEPTH, rq_batch),
            rq_min_depth: default_rq_min_depth(DEFAULT_RQ_DEPTH),
            rq_shrink_after: Some(Duration::from_secs(2)),
            rq_pool_size: 256 << 20,
            eager_buf_size: 8192,
            eager_limit: 8192,
            credits: true,
            rnr_timer: 12,
            rnr_retry: 7,
            ib_timeout: 20,
            ib_retry_cnt: 6,
            ib_tc: 0,
            ib_sl: 0,
            ib_hca: None,
            ib_gid_index: None,
            socket_addr: None,
            socket_ifname: None,
            nccl_socket_ifname: None,
            nccl_socket_family: None,
            socket_keepalive: Some(Duration::from_secs(20)),
            hang_timeout: Some(Duration::from_secs(60)),
            stats_interval: None,
            stats_file: None,
            debug: DebugLevel::Warn,
            connect_timeout: Some(Duration::from_secs(DEFAULT_CONNECT_TIMEOUT_S)),
            peer_check_interval: Duration::from_millis(DEFAULT_PEER_CHECK_INTERVAL_MS),
            test_first_seq: 0,
            test_first_gen: 0,
        }
    }
}

/// A rejected environment value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The variable, e.g. `VERBSNET_RQ_DEPTH`.
    pub var: String,
    /// The value as given.
    pub value: String,
    /// What is accepted, e.g. "an integer in 1..=32768".
    pub expected: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}={:?} is not valid: expected {}",
            self.var, self.value, self.expected
        )
    }
}

impl std::error::Error for ConfigError {}

/// One `VERBSNET_*` knob: the single registry entry the parser (ranges, error texts),
/// [`Config::describe`] (names and values), [`Config::default`] (checked against `default` by
/// a test) and docs/configuration.md (its tables are generated from these entries:
/// [`doc_table`]) all read.
#[derive(Clone, Copy, Debug)]
pub struct Knob {
    /// The environment variable, e.g. `VERBSNET_RQ_DEPTH`.
    pub var: &'static str,
    /// The short name used by [`Config::describe`], e.g. `rq_depth`.
    pub key: &'static str,
    /// The default, as text: a value the parser accepts (and which gives [`Config::default`]),
    /// or for a default derived from other knobs the rule, e.g. `min(16, rq_depth)`.
    pub default: &'static str,
    /// Type and range; [`Knob::accepted`] renders it for errors and the documentation.
    pub kind: Kind,
    /// The documentation section the knob is listed in.
    pub group: Group,
    /// What the knob does and why that default (Markdown; the documentation's table cell).
    pub doc: &'static str,
    /// NCCL IB's equivalent (Markdown), or `none`.
    pub nccl_ib: &'static str,
    /// Renders this knob's value in `config` for [`Config::describe`].
    show: fn(&Config) -> String,
}

/// A knob's type and accepted range: declared once, read by the parser and rendered into
/// error messages and the documentation by [`Knob::accepted`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One of these keywords (case-insensitive).
    Choice(&'static [&'static str]),
    /// `1`/`0`, `true`/`false`, `on`/`off`, `yes`/`no`.
    Bool,
    /// A decimal integer in `lo..=hi`.
    Int {
        /// Smallest value.
        lo: u32,
        /// Largest value.
        hi: u32,
    },
    /// A decimal integer from `lo` up to a bound set by other knobs (`hi` names it).
    IntBelow {
        /// Smallest value.
        lo: u32,
        /// The bound, as an expression of other knobs.
        hi: &'static str,
    },
    /// An integer in `lo..=hi`, or `-1` for automatic.
    IntOrAuto {
        /// Smallest value.
        lo: u32,
        /// Largest value.
        hi: u32,
    },
    /// A byte count in `0..=hi`.
    Bytes {
        /// Largest value.
        hi: u32,
    },
    /// A byte count from 0 up to the value of the knob `hi`.
    BytesBelow {
        /// The knob bounding it.
        hi: &'static str,
    },
    /// Seconds, fractions allowed; `zero` says what 0 means (`None`: 0 is refused).
    Seconds {
        /// The meaning of 0, e.g. `off`.
        zero: Option<&'static str>,
    },
    /// Free-form text, checked by the parser; the description of what is accepted.
    Text(&'static str),
}

/// The section of docs/configuration.md a knob is listed in, in the page's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// "Transport selection".
    Transport,
    /// "Receive queue".
    ReceiveQueue,
    /// "Eager and rendezvous".
    Eager,
    /// "Flow control and IB transport timers".
    FlowControl,
    /// "Devices and addresses".
    Devices,
    /// "Diagnostics".
    Diagnostics,
    /// "Connection set-up and peer liveness".
    Setup,
}

impl Group {
    /// Every group, in the page's order.
    pub const ALL: [Group; 7] = [
        Group::Transport,
        Group::ReceiveQueue,
        Group::Eager,
        Group::FlowControl,
        Group::Devices,
        Group::Diagnostics,
        Group::Setup,
    ];

    /// The marker naming the group's generated table in docs/configuration.md.
    #[must_use]
    pub fn marker(self) -> &'static str {
        match self {
            Group::Transport => "transport",
            Group::ReceiveQueue => "receive-queue",
            Group::Eager => "eager",
            Group::FlowControl => "flow-control",
            Group::Devices => "devices",
            Group::Diagnostics => "diagnostics",
            Group::Setup => "setup",
        }
    }
}

impl Knob {
    /// What the knob accepts, exactly as its errors say it (for knobs bounded by another, the
    /// error appends the bound in effect: `(here 1..=4)`), e.g. `an integer in 1..=32768`.
    #[must_use]
    pub fn accepted(&self) -> String {
        match self.kind {
            Kind::Choice(words) => format!("one of {}", words.join(", ")),
            Kind::Bool => "a boolean: 1, 0, true, false, on, off, yes, no".to_string(),
            Kind::Int { lo, hi } => format!("an integer in {lo}..={hi}"),
            Kind::IntBelow { lo, hi } => format!("an integer in {lo}..={hi}"),
            Kind::IntOrAuto { lo, hi } => format!("an integer in {lo}..={hi}, or -1 for auto"),
            Kind::Bytes { hi } => format!("an integer number of bytes in 0..={hi}"),
            Kind::BytesBelow { hi } => format!("an integer number of bytes in 0..={hi}"),
            Kind::Seconds { zero: Some(z) } => {
                format!("a number of seconds >= 0 (fractions allowed, 0 = {z})")
            }
            Kind::Seconds { zero: None } => "a number of seconds > 0 (fractions allowed)".into(),
            Kind::Text(t) => t.to_string(),
        }
    }

    /// The fixed integer range of an `Int`, `IntOrAuto` or `Bytes` knob.
    fn range(&self) -> Option<(u32, u32)> {
        match self.kind {
            Kind::Int { lo, hi } | Kind::IntOrAuto { lo, hi } => Some((lo, hi)),
            Kind::Bytes { hi } => Some((0, hi)),
            Kind::IntBelow { lo, .. } => Some((lo, u32::MAX)),
            Kind::BytesBelow { .. } => Some((0, u32::MAX)),
            _ => None,
        }
    }
}

/// The Markdown table of one documentation section, generated from [`KNOBS`]: what
/// docs/configuration.md holds between `<!-- knobs:MARKER -->` and `<!-- /knobs -->` (a unit
/// test fails when the page differs; `VERBSNET_BLESS=1 cargo test --lib config` rewrites it).
#[must_use]
pub fn doc_table(group: Group) -> String {
    let cell = |s: &str| s.replace('|', "\\|");
    let mut t = String::from(
        "| variable | default | accepted | what it does and why that default | NCCL IB equivalent |\n\
         |---|---|---|---|---|\n",
    );
    for k in KNOBS.iter().filter(|k| k.group == group) {
        let _ = writeln!(
            t,
            "| `{}` | `{}` | {} | {} | {} |",
            k.var,
            k.default,
            cell(&k.accepted()),
            cell(k.doc),
            cell(k.nccl_ib)
        );
    }
    t
}

/// Largest `VERBSNET_RQ_DEPTH`.
pub const MAX_RQ_DEPTH: u32 = 32768;
/// Largest `VERBSNET_EAGER_BUF_SIZE` (1 MiB).
pub const MAX_EAGER_BUF_SIZE: u32 = 1 << 20;

/// Default `VERBSNET_CONNECT_TIMEOUT` in seconds.
pub const DEFAULT_CONNECT_TIMEOUT_S: u64 = 120;
/// Default `VERBSNET_PEER_CHECK_INTERVAL` in milliseconds.
pub const DEFAULT_PEER_CHECK_INTERVAL_MS: u64 = 1000;

/// Every knob, in parse (and `describe`) order: a knob bounded by another comes after it.
pub const KNOBS: &[Knob] = &[
    Knob {
        var: "VERBSNET_TRANSPORT",
        key: "transport",
        default: "auto",
        kind: Kind::Choice(&["auto", "ib", "tcp"]),
        group: Group::Transport,
        doc: "`ib`: real verbs; `init` fails when no usable device is found. `tcp`: the userspace \
             TCP stand-in (same engine, same wire protocol). `auto` uses verbs when a usable \
             device exists and falls back to tcp otherwise, logging the choice, so one build runs \
             both on RDMA hosts and on laptops/CI.",
        nccl_ib:
            "none (NCCL picks its transport with `NCCL_NET` / `NCCL_IB_DISABLE`; select verbsnet \
             itself with `NCCL_NET_PLUGIN=verbsnet`)",
        show: |c| {
            match c.transport {
                TransportChoice::Auto => "auto",
                TransportChoice::Ib => "ib",
                TransportChoice::Tcp => "tcp",
            }
            .to_string()
        },
    },
    Knob {
        var: "VERBSNET_RQ_DEPTH",
        key: "rq_depth",
        default: "128",
        kind: Kind::Int {
            lo: 1,
            hi: MAX_RQ_DEPTH,
        },
        group: Group::ReceiveQueue,
        doc: "The most receive WRs (and bounce buffers) a connection grows to. 128 is a common \
             driver default and comfortably above the 32 requests NCCL keeps outstanding per comm \
             (`NCCL_NET_MAX_REQUESTS`). Raise it to 512–1024 when a bursty receiver stalls (eager \
             sends waiting for credits, or RNR NAKs with credits off); the price is memory, see \
             above.",
        nccl_ib:
            "receiver QP `max_recv_wr` = 256, compile-time; NCCL IB posts one zero-byte receive \
             per `irecv` instead of a standing pool",
        show: |c| c.rq_depth.to_string(),
    },
    Knob {
        var: "VERBSNET_RQ_BATCH",
        key: "rq_batch",
        default: "min(16, rq_depth)",
        kind: Kind::IntBelow {
            lo: 1,
            hi: "VERBSNET_RQ_DEPTH",
        },
        group: Group::ReceiveQueue,
        doc: "Receive WRs chained into one `ibv_post_recv` call. 16 amortizes the doorbell (one \
             MMIO write per batch) without holding many buffers back; it shrinks with a smaller \
             depth, so `VERBSNET_RQ_DEPTH=4` alone gives batch 4.",
        nccl_ib: "none (one WR per `irecv`)",
        show: |c| c.rq_batch.to_string(),
    },
    Knob {
        var: "VERBSNET_RQ_LOW_WATER",
        key: "rq_low_water",
        default: "max(1, rq_depth - rq_batch)",
        kind: Kind::IntBelow {
            lo: 1,
            hi: "VERBSNET_RQ_DEPTH-VERBSNET_RQ_BATCH+1",
        },
        group: Group::ReceiveQueue,
        doc:
            "Refill when fewer than this many receive WRs are posted. The default refills as soon \
             as one whole batch fits, keeping the queue nearly full (112 of 128 at the defaults; \
             1 at depth 4). The upper bound guarantees a refill never overfills the queue \
             (`low_water - 1 + batch ≤ depth`). A smaller value means fewer, larger refills and a \
             lower floor of posted receives.",
        nccl_ib: "none",
        show: |c| c.rq_low_water.to_string(),
    },
    Knob {
        var: "VERBSNET_RQ_MIN_DEPTH",
        key: "rq_min_depth",
        default: "min(2, rq_depth)",
        kind: Kind::IntBelow {
            lo: 1,
            hi: "VERBSNET_RQ_DEPTH",
        },
        group: Group::ReceiveQueue,
        doc:
            "Receive WRs a connection starts with and shrinks back to. 2 keeps an idle connection \
             at about 60 KiB pinned (NCCL opens one receive comm per channel per peer, thousands \
             in an alltoall); a busy one doubles its depth each time its sender waits for a \
             credit (counter `rq_grows`), so a burst costs a few credit waits, never RNR. Set it \
             to `VERBSNET_RQ_DEPTH` for a fixed depth.",
        nccl_ib: "none (NCCL IB posts one zero-byte receive per `irecv`)",
        show: |c| c.rq_min_depth.to_string(),
    },
    Knob {
        var: "VERBSNET_RQ_SHRINK_AFTER",
        key: "rq_shrink_after",
        default: "2",
        kind: Kind::Seconds {
            zero: Some("never shrink"),
        },
        group: Group::ReceiveQueue,
        doc:
            "Without growing for this long, the depth shrinks by one batch towards `rq_min_depth` \
             (`rq_shrinks`). 2 s is far longer than the gaps between NCCL's steps inside a \
             collective, and short enough that an idle communicator gives its buffers back within \
             seconds. Posted WRs cannot be taken back on verbs (no \"unpost\"), so the buffers \
             above the new depth return to the pool as messages consume them, and credits stay \
             exact.",
        nccl_ib: "none",
        show: |c| match c.rq_shrink_after {
            Some(d) => format!("{}s", d.as_secs_f64()),
            None => "never".into(),
        },
    },
    Knob {
        var: "VERBSNET_RQ_POOL_SIZE",
        key: "rq_pool_size",
        default: "268435456",
        kind: Kind::Bytes { hi: u32::MAX },
        group: Group::ReceiveQueue,
        doc:
            "Bytes of bounce buffers (registered in slabs of 16 as needed) that all receive comms \
             of one device in this process may grow by together. 256 MiB is about 256 receive \
             comms at the full default depth at the same time. When it is used up a queue stops \
             growing (`pool_exhausted`): credit-gated senders wait for credits, they never meet \
             RNR. `0`: every queue stays at `rq_min_depth`.",
        nccl_ib: "none",
        show: |c| c.rq_pool_size.to_string(),
    },
    Knob {
        var: "VERBSNET_EAGER_BUF_SIZE",
        key: "eager_buf_size",
        default: "8192",
        kind: Kind::Bytes {
            hi: MAX_EAGER_BUF_SIZE,
        },
        group: Group::Eager,
        doc: "Payload bytes of one bounce buffer. 8 KiB holds NCCL's small messages (LL/LL128 \
             protocol chunks, small collectives) in one SEND, and keeps the per-comm pool at \
             about 1 MiB. `0` disables the eager path entirely.",
        nccl_ib: "none (NCCL IB has no eager path: every message is a receiver-driven RDMA WRITE)",
        show: |c| c.eager_buf_size.to_string(),
    },
    Knob {
        var: "VERBSNET_EAGER_LIMIT",
        key: "eager_limit",
        default: "eager_buf_size",
        kind: Kind::BytesBelow {
            hi: "VERBSNET_EAGER_BUF_SIZE",
        },
        group: Group::Eager,
        doc: "Largest message sent eagerly (SEND into a bounce buffer, one copy on the receiver, \
             no round trip). Larger messages use rendezvous: the receiver sends a CTS, the sender \
             does a zero-copy RDMA WRITE with immediate. The default sends everything that fits a \
             bounce buffer eagerly; lower it to trade latency for fewer copies. It follows \
             `VERBSNET_EAGER_BUF_SIZE` when only that is set; a limit above the buffer size is an \
             error naming both variables.",
        nccl_ib:
            "`NCCL_IB_AR_THRESHOLD` (8192) is the closest size threshold, but it only splits data \
             and immediate, it does not change the protocol",
        show: |c| c.eager_limit.to_string(),
    },
    Knob {
        var: "VERBSNET_CREDITS",
        key: "credits",
        default: "1",
        kind: Kind::Bool,
        group: Group::FlowControl,
        doc: "Credit gating: the receiver grants one credit per posted receive buffer and the \
             sender never has more eager SENDs in flight than credits, so an `isend` never \
             outruns the receiver's posted receives and RNR NAKs do not happen. `0` sends without \
             waiting for credits, mimicking NCCL IB, which relies on RNR retry (below) as its \
             safety net; useful to compare behaviour, or when credit returns add latency.",
        nccl_ib: "none; NCCL IB's CTS FIFO gates data writes, and RNR retry covers the rest",
        show: |c| if c.credits { "on" } else { "off" }.to_string(),
    },
    Knob {
        var: "VERBSNET_RNR_TIMER",
        key: "rnr_timer",
        default: "12",
        kind: Kind::Int { lo: 0, hi: 31 },
        group: Group::FlowControl,
        doc: "Minimum RNR NAK timer our QPs advertise: how long a sender waits before retrying a \
             SEND that found no posted receive. 12 = 0.64 ms, as NCCL IB: short enough not to add \
             visible latency, long enough for the receiver to refill.",
        nccl_ib: "`min_rnr_timer = 12`, compile-time",
        show: |c| c.rnr_timer.to_string(),
    },
    Knob {
        var: "VERBSNET_RNR_RETRY",
        key: "rnr_retry",
        default: "7",
        kind: Kind::Int { lo: 0, hi: 7 },
        group: Group::FlowControl,
        doc:
            "How many times the HCA retries after an RNR NAK; 7 means forever, as NCCL IB. A slow \
             receiver then stalls the sender instead of killing the connection with \
             `IBV_WC_RNR_RETRY_EXC_ERR`; the hang watchdog (`VERBSNET_HANG_TIMEOUT`) reports such \
             stalls. Set 0–6 to turn an endless stall into an error while debugging.",
        nccl_ib: "`rnr_retry = 7`, compile-time",
        show: |c| c.rnr_retry.to_string(),
    },
    Knob {
        var: "VERBSNET_IB_TIMEOUT",
        key: "ib_timeout",
        default: "20",
        kind: Kind::Int { lo: 1, hi: 31 },
        group: Group::FlowControl,
        doc:
            "ACK timeout of our RC QPs: 4.096 µs × 2^20 ≈ 4.3 s, as NCCL since 2.23. Large enough \
             to ride out fabric congestion and link flaps; with the default 6 retries a silent \
             peer (powered off, cable cut) fails every outstanding WR after (6 + 1) × 4.3 s ≈ 30 \
             s. (0, \"wait forever\", is not accepted.)",
        nccl_ib: "`NCCL_IB_TIMEOUT`, default 20 since NCCL 2.23 (18 in 2.14–2.22, 14 before)",
        show: |c| c.ib_timeout.to_string(),
    },
    Knob {
        var: "VERBSNET_IB_RETRY_CNT",
        key: "ib_retry_cnt",
        default: "6",
        kind: Kind::Int { lo: 0, hi: 7 },
        group: Group::FlowControl,
        doc: "Transport retries after an ACK timeout before the WR fails with \
             `IBV_WC_RETRY_EXC_ERR` (reported as `ncclRemoteError`). The bound for a silent peer \
             is (retry_cnt + 1) × ACK timeout: 7 × 4.3 s ≈ 30 s at the defaults, well under the \
             minutes after which frameworks give up on a collective (PyTorch's NCCL watchdog: 10 \
             min) and under our own `VERBSNET_HANG_TIMEOUT` (60 s), so the transport names the \
             failure before the watchdog guesses. Not 7 (NCCL's default): soft-RoCE (`rdma_rxe`) \
             treats 7 as \"retry for ever\" (its completer counts retries down only when the \
             value is not 7), so with 7 a powered-off peer is never reported on rxe; on hardware \
             NICs 7 bounds at ≈ 34 s, one retry more than 6. Measured across two VMs: \
             [troubleshooting](troubleshooting.md#a-peer-host-or-its-link-goes-silent).",
        nccl_ib: "`NCCL_IB_RETRY_CNT`, default 7",
        show: |c| c.ib_retry_cnt.to_string(),
    },
    // -- traffic class and service level (issue 9) --
    Knob {
        var: "VERBSNET_IB_TC",
        key: "ib_tc",
        default: "0",
        kind: Kind::Int { lo: 0, hi: 255 },
        group: Group::FlowControl,
        doc:
            "The GRH traffic class of every RC QP (on RoCE the IP header's DSCP/ECN byte: DSCP 26 \
             is `104`, with ECN-capable `106`). A communicator's `trafficClass` overrides it when \
             set (not -1): NCCL passes it in the v11/v12 `init` config, or in the v10 `connect` \
             config (`ncclConfig_t.trafficClass`). The value in effect is printed in each \
             connection's INFO line (`traffic class N SL M`). On InfiniBand it only matters when \
             the path uses a GRH.",
        nccl_ib: "`NCCL_IB_TC`, default 0",
        show: |c| c.ib_tc.to_string(),
    },
    Knob {
        var: "VERBSNET_IB_SL",
        key: "ib_sl",
        default: "0",
        kind: Kind::Int { lo: 0, hi: 15 },
        group: Group::FlowControl,
        doc:
            "The InfiniBand service level of every RC QP (address vector `sl`); fabrics map it to \
             virtual lanes. Shown in each connection's INFO line.",
        nccl_ib: "`NCCL_IB_SL`, default 0",
        show: |c| c.ib_sl.to_string(),
    },
    Knob {
        var: "VERBSNET_IB_HCA",
        key: "ib_hca",
        default: "all active ports",
        kind: Kind::Text("a non-empty device list [^][=]name[:port],..."),
        group: Group::Devices,
        doc:
            "Which verbs devices and ports to use. Same syntax as NCCL: a prefix match by default \
             (`mlx5_1` also matches `mlx5_10`), `=` for exact names, `^` to exclude, `:port` for \
             one port. Unset uses every ACTIVE port.",
        nccl_ib: "`NCCL_IB_HCA`, default all",
        show: |c| show_opt_str(c.ib_hca.as_deref(), "all"),
    },
    Knob {
        var: "VERBSNET_IB_GID_INDEX",
        key: "ib_gid_index",
        default: "auto",
        kind: Kind::IntOrAuto { lo: 0, hi: 255 },
        group: Group::Devices,
        doc: "Force the GID table index on RoCE. Auto picks a RoCE v2 GID holding an IPv4-mapped \
             address, as NCCL does, which is right for routed RoCE v2 fabrics; force an index \
             when the host has several and auto picks the wrong one. `-1` is accepted so NCCL \
             settings can be copied verbatim.",
        nccl_ib: "`NCCL_IB_GID_INDEX`, default -1 (auto, RoCE v2, `AF_INET`)",
        show: |c| c.ib_gid_index.map_or("auto".to_string(), |g| g.to_string()),
    },
    Knob {
        var: "VERBSNET_SOCKET_ADDR",
        key: "socket_addr",
        default: "auto",
        kind: Kind::Text("an IPv4 or IPv6 address, e.g. 10.0.0.1 or fd00::1"),
        group: Group::Devices,
        doc: "The local address of the out-of-band listener that exchanges connection metadata \
             (and, with `tcp`, of the data sockets). When set it is used as is and no interface \
             is chosen. Auto chooses an interface as below.",
        nccl_ib: "none (NCCL takes the address of `NCCL_SOCKET_IFNAME`)",
        show: |c| c.socket_addr.map_or("auto".to_string(), |a| a.to_string()),
    },
    Knob {
        var: "VERBSNET_SOCKET_IFNAME",
        key: "socket_ifname",
        default: "auto",
        kind: Kind::Text(
            "an interface list as NCCL_SOCKET_IFNAME: [^][=]name[,name...] (prefixes)",
        ),
        group: Group::Devices,
        doc: "The interfaces whose first address the listener uses; takes precedence over \
             `NCCL_SOCKET_IFNAME`. See [the set-up interface](#the-set-up-interface) below.",
        nccl_ib: "`NCCL_SOCKET_IFNAME`",
        show: |c| show_opt_str(c.socket_ifname.as_deref(), "auto"),
    },
    Knob {
        var: "VERBSNET_SOCKET_KEEPALIVE",
        key: "socket_keepalive",
        default: "20",
        kind: Kind::Seconds { zero: Some("off") },
        group: Group::Devices,
        doc: "TCP keepalive on the set-up socket of every connection (ib; tcp: its data stream, \
             while idle), so that a peer **host** \
             that goes silent (power loss, cut link: no FIN) fails the comm's requests with \
             `ncclRemoteError` within this bound even when no WR is in flight for the transport's \
             retry budget to expire (a receive never times out; a sender waiting for a CTS posts \
             nothing). First probe after half the bound idle, then every tenth, five unanswered: \
             10 s + 5 × 2 s at the default. The peer's kernel answers, so a busy peer process \
             never trips it. 20 s: under the transport's ≈ 30 s budget and far under framework \
             timeouts; measured 14–17 s across two VMs \
             ([troubleshooting](troubleshooting.md#a-peer-host-or-its-link-goes-silent)).",
        nccl_ib: "none (NCCL IB relies on the QP's retry budget only)",
        show: |c| show_duration(c.socket_keepalive),
    },
    Knob {
        var: "VERBSNET_HANG_TIMEOUT",
        key: "hang_timeout",
        default: "60",
        kind: Kind::Seconds { zero: Some("off") },
        group: Group::Diagnostics,
        doc: "A request that makes no progress for this long is reported with a WARN instead of \
             hanging silently. 60 s is well above the transport retry budget at the defaults \
             (about 30 s, see `VERBSNET_IB_RETRY_CNT`), so a report means a real stall, typically \
             endless RNR retry or a peer that stopped posting receives.",
        nccl_ib: "none (NCCL IB hangs silently on infinite RNR retry)",
        show: |c| show_duration(c.hang_timeout),
    },
    Knob {
        var: "VERBSNET_STATS_INTERVAL",
        key: "stats_interval",
        default: "0",
        kind: Kind::Seconds { zero: Some("off") },
        group: Group::Diagnostics,
        doc: "Seconds between periodic INFO lines with the plugin's counters. Off by default: it \
             is a debugging aid and the lines are noisy.",
        nccl_ib: "none",
        show: |c| show_duration(c.stats_interval),
    },
    Knob {
        var: "VERBSNET_STATS_FILE",
        key: "stats_file",
        default: "unset",
        kind: Kind::Text("a file path"),
        group: Group::Diagnostics,
        doc: "When set, every comm appends one JSON object with its counters (side, ops, bytes, \
             eager, rendezvous, credit_stalls, cts_waits, rq_post_calls, rq_wrs_posted, \
             rq_min_level, RNR counters, ...) to this file as it closes; with ncclNet v11/v12 the \
             object also names its communicator (`\"comm_id\": \"0x…\"`, NCCL's `commId`), so \
             counters can be grouped per communicator. The `dev_*` RNR counters are device-wide \
             (every QP on the port) and given as moved while the comm existed. See \
             [troubleshooting](troubleshooting.md) for reading them. `verbsnet-perf --stats` uses \
             it.",
        nccl_ib: "none",
        show: |c| show_opt_str(c.stats_file.as_deref(), "off"),
    },
    Knob {
        var: "VERBSNET_DEBUG",
        key: "debug",
        default: "warn (info when NCCL_DEBUG is INFO or TRACE)",
        kind: Kind::Choice(&["none", "warn", "info", "debug", "trace"]),
        group: Group::Diagnostics,
        doc: "How much the plugin logs; see [Logging](#logging-verbsnet_debug-and-nccl_debug).",
        nccl_ib: "`NCCL_DEBUG` (see below)",
        show: |c| c.debug.as_str().to_string(),
    },
    // Connection set-up and peer liveness (issue 12).
    Knob {
        var: "VERBSNET_CONNECT_TIMEOUT",
        key: "connect_timeout",
        default: "120",
        kind: Kind::Seconds {
            zero: Some("no deadline"),
        },
        group: Group::Setup,
        doc:
            "Longest a `connect` or an `accept` may take. A `connect` that has not finished fails \
             with `ncclRemoteError` naming the listener's address and the stage reached (TCP \
             connect, handshake, QP exchange, RTR/RTS); an `accept` that completed no connection \
             for this long fails naming what the pending handshakes reached. 120 s is twice \
             NCCL's own socket connect retry window (`NCCL_SOCKET_RETRY_CNT`=34 × \
             `NCCL_SOCKET_RETRY_SLEEP_MSEC`, `src/misc/socket.cc`), so a rank that starts late \
             still makes it, while a dead or unreachable peer is an error instead of a silent \
             hang (a kernel SYN retry alone takes about 127 s). The hang watchdog \
             (`VERBSNET_HANG_TIMEOUT`) reports a connect or accept without progress first. \
             Connections that have not shown the listen comm's nonce are dropped after 10 s (or \
             this value when shorter).",
        nccl_ib: "none: NCCL IB's connect/accept have no deadline",
        show: |c| show_duration(c.connect_timeout),
    },
    Knob {
        var: "VERBSNET_PEER_CHECK_INTERVAL",
        key: "peer_check_interval",
        default: "1",
        kind: Kind::Seconds { zero: None },
        group: Group::Setup,
        doc: "How often a comm asks its set-up socket whether the peer closed. The data path \
             (`isend`/`irecv`/`test`) makes no system call of its own: a dead peer is learnt from \
             the transport (error completions; on tcp the data stream's EOF) and from this check, \
             made at most once per interval. 1 s bounds how late a peer's exit is noticed when \
             the transport says nothing (ib: the peer's QP is gone but nothing was outstanding), \
             at one `read` per second per comm.",
        nccl_ib: "none (NCCL IB learns peer death from completions only)",
        show: |c| format!("{}s", c.peer_check_interval.as_secs_f64()),
    },
];

impl Config {
    /// Parses the process environment.
    ///
    /// # Errors
    /// The first variable whose value is rejected (see [`Config::from_lookup`]).
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// The knobs `get` sets (non-blank), in [`KNOBS`] order: where the effective configuration
    /// came from (every other knob has its default).
    pub fn set_by(get: impl Fn(&str) -> Option<String>) -> Vec<&'static str> {
        KNOBS
            .iter()
            .filter(|k| get(k.var).is_some_and(|v| !v.trim().is_empty()))
            .map(|k| k.var)
            .collect()
    }

    /// Parses variables from `get` (tests pass a map). `get` is also asked for `NCCL_DEBUG`
    /// (the default of [`Config::debug`]).
    ///
    /// # Errors
    /// The first variable, in [`KNOBS`] order, whose value has the wrong type, is out of range
    /// or breaks a cross-field rule (`rq_batch <= rq_depth`,
    /// `rq_low_water <= rq_depth - rq_batch + 1`, `eager_limit <= eager_buf_size`).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let env = Lookup(&get);
        let mut c = Config::default();

        if let Some(v) = env.value("VERBSNET_TRANSPORT") {
            c.transport = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => TransportChoice::Auto,
                "ib" => TransportChoice::Ib,
                "tcp" => TransportChoice::Tcp,
                _ => return Err(invalid("VERBSNET_TRANSPORT", &v)),
            };
        }

        if let Some(n) = env.int("VERBSNET_RQ_DEPTH", None)? {
            c.rq_depth = n;
        }
        // The derived defaults follow the depth in effect (the rules in the registry).
        let depth = c.rq_depth;
        c.rq_batch = env
            .int("VERBSNET_RQ_BATCH", Some(depth))?
            .unwrap_or(default_rq_batch(depth));
        let batch = c.rq_batch;
        // batch <= depth, so the bound is >= 1.
        let low_max = depth - batch + 1;
        c.rq_low_water = env
            .int("VERBSNET_RQ_LOW_WATER", Some(low_max))?
            .unwrap_or(default_rq_low_water(depth, batch));
        c.rq_min_depth = env
            .int("VERBSNET_RQ_MIN_DEPTH", Some(depth))?
            .unwrap_or(default_rq_min_depth(depth));
        if let Some(t) = env.seconds("VERBSNET_RQ_SHRINK_AFTER")? {
            c.rq_shrink_after = t;
        }
        if let Some(b) = env.int("VERBSNET_RQ_POOL_SIZE", None)? {
            c.rq_pool_size = u64::from(b);
        }

        if let Some(n) = env.int("VERBSNET_EAGER_BUF_SIZE", None)? {
            c.eager_buf_size = n;
        }
        // Default: follows the buffer size.
        c.eager_limit = env
            .int("VERBSNET_EAGER_LIMIT", Some(c.eager_buf_size))?
            .unwrap_or(c.eager_buf_size);

        if let Some(v) = env.value("VERBSNET_CREDITS") {
            c.credits = match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "on" | "yes" => true,
                "0" | "false" | "off" | "no" => false,
                _ => return Err(invalid("VERBSNET_CREDITS", &v)),
            };
        }

        for (var, field) in [
            ("VERBSNET_RNR_TIMER", &mut c.rnr_timer),
            ("VERBSNET_RNR_RETRY", &mut c.rnr_retry),
            ("VERBSNET_IB_TIMEOUT", &mut c.ib_timeout),
            ("VERBSNET_IB_RETRY_CNT", &mut c.ib_retry_cnt),
            ("VERBSNET_IB_TC", &mut c.ib_tc),
            ("VERBSNET_IB_SL", &mut c.ib_sl),
        ] {
            if let Some(n) = env.small(var)? {
                *field = n;
            }
        }

        c.ib_hca = env.value("VERBSNET_IB_HCA").map(|v| v.trim().to_string());
        // -1 is NCCL_IB_GID_INDEX's spelling of "auto"; accept it for copied settings.
        c.ib_gid_index = match env.value("VERBSNET_IB_GID_INDEX") {
            Some(v) if v.trim() == "-1" => None,
            _ => env.int("VERBSNET_IB_GID_INDEX", None)?,
        };
        if let Some(v) = env.value("VERBSNET_SOCKET_ADDR") {
            let addr = v.trim().parse::<IpAddr>();
            c.socket_addr = Some(addr.map_err(|_| invalid("VERBSNET_SOCKET_ADDR", &v))?);
        }
        if let Some(v) = env.value("VERBSNET_SOCKET_IFNAME") {
            crate::ifselect::IfList::parse(&v)
                .map_err(|_| invalid("VERBSNET_SOCKET_IFNAME", &v))?;
            c.socket_ifname = Some(v.trim().to_string());
        }
        c.nccl_socket_ifname = env.value("NCCL_SOCKET_IFNAME");
        c.nccl_socket_family = env.value("NCCL_SOCKET_FAMILY");

        if let Some(t) = env.seconds("VERBSNET_SOCKET_KEEPALIVE")? {
            c.socket_keepalive = t;
        }
        if let Some(t) = env.seconds("VERBSNET_HANG_TIMEOUT")? {
            c.hang_timeout = t;
        }
        c.stats_interval = env.seconds("VERBSNET_STATS_INTERVAL")?.flatten();
        c.stats_file = env
            .value("VERBSNET_STATS_FILE")
            .map(|v| v.trim().to_string());

        c.debug = match env.value("VERBSNET_DEBUG") {
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "none" => DebugLevel::None,
                "warn" => DebugLevel::Warn,
                "info" => DebugLevel::Info,
                "debug" => DebugLevel::Debug,
                "trace" => DebugLevel::Trace,
                _ => return Err(invalid("VERBSNET_DEBUG", &v)),
            },
            None => debug_default(env.value("NCCL_DEBUG").as_deref()),
        };

        // Connection set-up and peer liveness.
        if let Some(t) = env.seconds("VERBSNET_CONNECT_TIMEOUT")? {
            c.connect_timeout = t;
        }
        if let Some(t) = env.seconds("VERBSNET_PEER_CHECK_INTERVAL")? {
            c.peer_check_interval = t.ok_or_else(|| {
                let v = env
                    .value("VERBSNET_PEER_CHECK_INTERVAL")
                    .unwrap_or_default();
                invalid("VERBSNET_PEER_CHECK_INTERVAL", &v)
            })?;
        }

        Ok(c)
    }

    /// The effective configuration on one line, in [`KNOBS`] order, for the INFO log:
    /// `transport=auto rq_depth=128 rq_batch=16 ... debug=warn`.
    #[must_use]
    pub fn describe(&self) -> String {
        let mut line = String::new();
        for knob in KNOBS {
            if !line.is_empty() {
                line.push(' ');
            }
            let _ = write!(line, "{}={}", knob.key, (knob.show)(self));
        }
        line
    }
}

/// The registry entry for `var`, if it is a knob.
#[must_use]
pub fn knob(var: &str) -> Option<&'static Knob> {
    KNOBS.iter().find(|k| k.var == var)
}

/// The `VERBSNET_*` names in `env` that are not knobs (typos such as `VERBSNET_RQDEPTH`),
/// sorted, so `init` can WARN about them. Other variables are ignored.
#[must_use]
pub fn unknown_vars(env: impl Iterator<Item = (String, String)>) -> Vec<String> {
    let mut unknown: Vec<String> = env
        .map(|(name, _)| name)
        .filter(|name| name.starts_with("VERBSNET_") && knob(name).is_none())
        .collect();
    unknown.sort();
    unknown.dedup();
    unknown
}

/// The knob an unknown `VERBSNET_*` name was probably meant to be (at most two single-character
/// edits away, ignoring case), for a "did you mean" hint.
#[must_use]
pub fn suggest(name: &str) -> Option<&'static str> {
    let name = name.to_ascii_uppercase();
    KNOBS
        .iter()
        .map(|k| (edit_distance(&name, k.var), k.var))
        .filter(|&(d, _)| d <= 2)
        .min_by_key(|&(d, _)| d)
        .map(|(_, var)| var)
}

/// `NCCL_DEBUG=INFO|TRACE` ⇒ `info` (so our setup lines show next to NCCL's), else `warn`.
/// NCCL's own TRACE does not turn on our hot-path events: that takes `VERBSNET_DEBUG`.
fn debug_default(nccl_debug: Option<&str>) -> DebugLevel {
    match nccl_debug.map(|v| v.trim().to_ascii_uppercase()).as_deref() {
        Some("INFO") | Some("TRACE") => DebugLevel::Info,
        _ => DebugLevel::Warn,
    }
}

/// The getter, with "empty = unset" applied.
struct Lookup<'a, F: Fn(&str) -> Option<String>>(&'a F);

impl<F: Fn(&str) -> Option<String>> Lookup<'_, F> {
    /// The raw value of `var`, or `None` when unset or blank.
    fn value(&self, var: &str) -> Option<String> {
        (self.0)(var).filter(|v| !v.trim().is_empty())
    }

    /// An integer in the knob's range (its [`Kind`]); `bound` is the upper bound in effect for
    /// a knob bounded by another (the error's `expected` then adds it).
    fn int(&self, var: &'static str, bound: Option<u32>) -> Result<Option<u32>, ConfigError> {
        let Some(v) = self.value(var) else {
            return Ok(None);
        };
        let (lo, hi) = knob(var)
            .and_then(Knob::range)
            .expect("an integer knob has a range in the registry");
        let hi = bound.map_or(hi, |b| b.min(hi));
        let n = v.trim().parse::<u64>().ok();
        match n.and_then(|n| u32::try_from(n).ok()) {
            Some(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
            _ => Err(invalid_in(var, &v, lo, hi)),
        }
    }

    /// An integer knob whose range fits a `u8`.
    fn small(&self, var: &'static str) -> Result<Option<u8>, ConfigError> {
        Ok(self
            .int(var, None)?
            .map(|n| u8::try_from(n).expect("registry range fits u8")))
    }

    /// Seconds (fractions allowed): `Some(None)` for 0 (off), `None` when unset.
    fn seconds(&self, var: &'static str) -> Result<Option<Option<Duration>>, ConfigError> {
        let Some(v) = self.value(var) else {
            return Ok(None);
        };
        let secs = v.trim().parse::<f64>().ok().filter(|s| *s >= 0.0);
        let Some(d) = secs.and_then(|s| Duration::try_from_secs_f64(s).ok()) else {
            return Err(invalid(var, &v));
        };
        Ok(Some((!d.is_zero()).then_some(d)))
    }
}

/// The error for `var=value`, with the registry's accepted text.
fn invalid(var: &'static str, value: &str) -> ConfigError {
    let expected = knob(var).map_or_else(|| "a valid value".to_string(), Knob::accepted);
    ConfigError {
        var: var.to_string(),
        value: value.to_string(),
        expected,
    }
}

/// Like [`invalid`]; when the registry's range names another knob, appends the bound in
/// effect, e.g. `an integer in 1..=VERBSNET_RQ_DEPTH (here 1..=4)`.
fn invalid_in(var: &'static str, value: &str, lo: u32, hi: u32) -> ConfigError {
    let mut e = invalid(var, value);
    if e.expected.contains("VERBSNET_") {
        let _ = write!(e.expected, " (here {lo}..={hi})");
    }
    e
}

fn show_opt_str(v: Option<&str>, none: &str) -> String {
    match v {
        None => none.to_string(),
        Some(s) if s.contains(char::is_whitespace) => format!("{s:?}"),
        Some(s) => s.to_string(),
    }
}

fn show_duration(d: Option<Duration>) -> String {
    d.map_or("off".to_string(), |d| format!("{}s", d.as_secs_f64()))
}

/// Levenshtein distance over bytes (names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    fn ok(vars: &[(&str, &str)]) -> Config {
        parse(vars).unwrap_or_else(|e| panic!("{vars:?} rejected: {e}"))
    }

    fn err(vars: &[(&str, &str)]) -> String {
        match parse(vars) {
            Ok(c) => panic!("{vars:?} accepted: {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn no_variables_gives_the_documented_defaults() {
        let c = ok(&[]);
        assert_eq!(c, Config::default());
        assert_eq!(c.transport, TransportChoice::Auto);
        assert_eq!((c.rq_depth, c.rq_batch, c.rq_low_water), (128, 16, 112));
        assert_eq!((c.eager_buf_size, c.eager_limit), (8192, 8192));
        assert!(c.credits);
        assert_eq!((c.rnr_timer, c.rnr_retry), (12, 7));
        assert_eq!((c.ib_timeout, c.ib_retry_cnt), (20, 6));
        assert_eq!(c.hang_timeout, Some(Duration::from_secs(60)));
        assert_eq!(c.socket_keepalive, Some(Duration::from_secs(20)));
        assert_eq!(c.stats_interval, None);
        assert_eq!(c.debug, DebugLevel::Warn);
    }

    #[test]
    fn empty_and_blank_values_are_unset() {
        let all_blank: Vec<(&str, &str)> = KNOBS.iter().map(|k| (k.var, "")).collect();
        assert_eq!(ok(&all_blank), Config::default());
        assert_eq!(ok(&[("VERBSNET_RQ_DEPTH", "  ")]).rq_depth, 128);
        assert_eq!(ok(&[("VERBSNET_IB_HCA", " ")]).ib_hca, None);
    }

    #[test]
    fn transport_is_case_insensitive() {
        assert_eq!(
            ok(&[("VERBSNET_TRANSPORT", "auto")]).transport,
            TransportChoice::Auto
        );
        assert_eq!(
            ok(&[("VERBSNET_TRANSPORT", "IB")]).transport,
            TransportChoice::Ib
        );
        assert_eq!(
            ok(&[("VERBSNET_TRANSPORT", " Tcp ")]).transport,
            TransportChoice::Tcp
        );
        assert_eq!(
            err(&[("VERBSNET_TRANSPORT", "rdma")]),
            r#"VERBSNET_TRANSPORT="rdma" is not valid: expected one of auto, ib, tcp"#
        );
    }

    #[test]
    fn rq_depth_bounds() {
        assert_eq!(ok(&[("VERBSNET_RQ_DEPTH", "1")]).rq_depth, 1);
        assert_eq!(ok(&[("VERBSNET_RQ_DEPTH", "1024")]).rq_depth, 1024);
        assert_eq!(ok(&[("VERBSNET_RQ_DEPTH", "32768")]).rq_depth, 32768);
        let msg = "is not valid: expected an integer in 1..=32768";
        assert_eq!(
            err(&[("VERBSNET_RQ_DEPTH", "abc")]),
            format!(r#"VERBSNET_RQ_DEPTH="abc" {msg}"#)
        );
        assert_eq!(
            err(&[("VERBSNET_RQ_DEPTH", "0")]),
            format!(r#"VERBSNET_RQ_DEPTH="0" {msg}"#)
        );
        assert_eq!(
            err(&[("VERBSNET_RQ_DEPTH", "32769")]),
            format!(r#"VERBSNET_RQ_DEPTH="32769" {msg}"#)
        );
        assert_eq!(
            err(&[("VERBSNET_RQ_DEPTH", "-1")]),
            format!(r#"VERBSNET_RQ_DEPTH="-1" {msg}"#)
        );
        assert_eq!(
            err(&[("VERBSNET_RQ_DEPTH", "99999999999999999999999")]),
            format!(r#"VERBSNET_RQ_DEPTH="99999999999999999999999" {msg}"#)
        );
    }

    #[test]
    fn rq_defaults_adapt_to_depth() {
        let c = ok(&[("VERBSNET_RQ_DEPTH", "4")]);
        assert_eq!((c.rq_depth, c.rq_batch, c.rq_low_water), (4, 4, 1));
        let c = ok(&[("VERBSNET_RQ_DEPTH", "1")]);
        assert_eq!((c.rq_depth, c.rq_batch, c.rq_low_water), (1, 1, 1));
        let c = ok(&[("VERBSNET_RQ_DEPTH", "20")]);
        assert_eq!((c.rq_depth, c.rq_batch, c.rq_low_water), (20, 16, 4));
        let c = ok(&[("VERBSNET_RQ_DEPTH", "1024")]);
        assert_eq!((c.rq_depth, c.rq_batch, c.rq_low_water), (1024, 16, 1008));
        let c = ok(&[("VERBSNET_RQ_BATCH", "32")]);
        assert_eq!((c.rq_depth, c.rq_batch, c.rq_low_water), (128, 32, 96));
    }

    #[test]
    fn rq_batch_and_low_water_explicit() {
        let c = ok(&[
            ("VERBSNET_RQ_DEPTH", "64"),
            ("VERBSNET_RQ_BATCH", "8"),
            ("VERBSNET_RQ_LOW_WATER", "57"),
        ]);
        assert_eq!((c.rq_depth, c.rq_batch, c.rq_low_water), (64, 8, 57));
        let c = ok(&[("VERBSNET_RQ_BATCH", "128"), ("VERBSNET_RQ_LOW_WATER", "1")]);
        assert_eq!((c.rq_batch, c.rq_low_water), (128, 1));
    }

    #[test]
    fn rq_cross_field_errors_name_the_bounding_variable() {
        assert_eq!(
            err(&[("VERBSNET_RQ_DEPTH", "4"), ("VERBSNET_RQ_BATCH", "16")]),
            r#"VERBSNET_RQ_BATCH="16" is not valid: expected an integer in 1..=VERBSNET_RQ_DEPTH (here 1..=4)"#
        );
        assert_eq!(
            err(&[("VERBSNET_RQ_BATCH", "0")]),
            r#"VERBSNET_RQ_BATCH="0" is not valid: expected an integer in 1..=VERBSNET_RQ_DEPTH (here 1..=128)"#
        );
        assert_eq!(
            err(&[("VERBSNET_RQ_BATCH", "x")]),
            r#"VERBSNET_RQ_BATCH="x" is not valid: expected an integer in 1..=VERBSNET_RQ_DEPTH (here 1..=128)"#
        );
        assert_eq!(
            err(&[
                ("VERBSNET_RQ_BATCH", "64"),
                ("VERBSNET_RQ_LOW_WATER", "100")
            ]),
            r#"VERBSNET_RQ_LOW_WATER="100" is not valid: expected an integer in 1..=VERBSNET_RQ_DEPTH-VERBSNET_RQ_BATCH+1 (here 1..=65)"#
        );
        assert_eq!(
            err(&[("VERBSNET_RQ_LOW_WATER", "0")]),
            r#"VERBSNET_RQ_LOW_WATER="0" is not valid: expected an integer in 1..=VERBSNET_RQ_DEPTH-VERBSNET_RQ_BATCH+1 (here 1..=113)"#
        );
        assert_eq!(ok(&[("VERBSNET_RQ_LOW_WATER", "113")]).rq_low_water, 113);
    }

    #[test]
    fn eager_sizes() {
        let c = ok(&[("VERBSNET_EAGER_BUF_SIZE", "4096")]);
        assert_eq!((c.eager_buf_size, c.eager_limit), (4096, 4096));
        let c = ok(&[("VERBSNET_EAGER_BUF_SIZE", "1048576")]);
        assert_eq!((c.eager_buf_size, c.eager_limit), (1 << 20, 1 << 20));
        let c = ok(&[("VERBSNET_EAGER_BUF_SIZE", "0")]);
        assert_eq!((c.eager_buf_size, c.eager_limit), (0, 0));
        let c = ok(&[("VERBSNET_EAGER_LIMIT", "1024")]);
        assert_eq!((c.eager_buf_size, c.eager_limit), (8192, 1024));
        let c = ok(&[("VERBSNET_EAGER_LIMIT", "0")]);
        assert_eq!(c.eager_limit, 0);
        assert_eq!(
            err(&[("VERBSNET_EAGER_BUF_SIZE", "1048577")]),
            r#"VERBSNET_EAGER_BUF_SIZE="1048577" is not valid: expected an integer number of bytes in 0..=1048576"#
        );
        assert_eq!(
            err(&[("VERBSNET_EAGER_BUF_SIZE", "8k")]),
            r#"VERBSNET_EAGER_BUF_SIZE="8k" is not valid: expected an integer number of bytes in 0..=1048576"#
        );
    }

    #[test]
    fn eager_limit_above_buffer_names_both_variables() {
        assert_eq!(
            err(&[("VERBSNET_EAGER_LIMIT", "16384")]),
            r#"VERBSNET_EAGER_LIMIT="16384" is not valid: expected an integer number of bytes in 0..=VERBSNET_EAGER_BUF_SIZE (here 0..=8192)"#
        );
        assert_eq!(
            err(&[
                ("VERBSNET_EAGER_BUF_SIZE", "4096"),
                ("VERBSNET_EAGER_LIMIT", "8192")
            ]),
            r#"VERBSNET_EAGER_LIMIT="8192" is not valid: expected an integer number of bytes in 0..=VERBSNET_EAGER_BUF_SIZE (here 0..=4096)"#
        );
    }

    #[test]
    fn credits_booleans() {
        for v in ["1", "true", "TRUE", "on", "On", "yes", " yes "] {
            assert!(ok(&[("VERBSNET_CREDITS", v)]).credits, "{v}");
        }
        for v in ["0", "false", "off", "OFF", "no", "No"] {
            assert!(!ok(&[("VERBSNET_CREDITS", v)]).credits, "{v}");
        }
        assert_eq!(
            err(&[("VERBSNET_CREDITS", "2")]),
            r#"VERBSNET_CREDITS="2" is not valid: expected a boolean: 1, 0, true, false, on, off, yes, no"#
        );
    }

    #[test]
    fn ib_timers_and_retries() {
        let c = ok(&[
            ("VERBSNET_RNR_TIMER", "0"),
            ("VERBSNET_RNR_RETRY", "0"),
            ("VERBSNET_IB_TIMEOUT", "1"),
            ("VERBSNET_IB_RETRY_CNT", "0"),
        ]);
        assert_eq!(
            (c.rnr_timer, c.rnr_retry, c.ib_timeout, c.ib_retry_cnt),
            (0, 0, 1, 0)
        );
        let c = ok(&[
            ("VERBSNET_RNR_TIMER", "31"),
            ("VERBSNET_RNR_RETRY", "7"),
            ("VERBSNET_IB_TIMEOUT", "31"),
            ("VERBSNET_IB_RETRY_CNT", "7"),
        ]);
        assert_eq!(
            (c.rnr_timer, c.rnr_retry, c.ib_timeout, c.ib_retry_cnt),
            (31, 7, 31, 7)
        );
        assert_eq!(
            err(&[("VERBSNET_RNR_TIMER", "32")]),
            r#"VERBSNET_RNR_TIMER="32" is not valid: expected an integer in 0..=31"#
        );
        assert_eq!(
            err(&[("VERBSNET_RNR_RETRY", "8")]),
            r#"VERBSNET_RNR_RETRY="8" is not valid: expected an integer in 0..=7"#
        );
        assert_eq!(
            err(&[("VERBSNET_IB_TIMEOUT", "0")]),
            r#"VERBSNET_IB_TIMEOUT="0" is not valid: expected an integer in 1..=31"#
        );
        assert_eq!(
            err(&[("VERBSNET_IB_TIMEOUT", "256")]),
            r#"VERBSNET_IB_TIMEOUT="256" is not valid: expected an integer in 1..=31"#
        );
        assert_eq!(
            err(&[("VERBSNET_IB_RETRY_CNT", "seven")]),
            r#"VERBSNET_IB_RETRY_CNT="seven" is not valid: expected an integer in 0..=7"#
        );
    }

    #[test]
    fn ib_device_selection() {
        let c = ok(&[
            ("VERBSNET_IB_HCA", " ^=mlx5_0:1,mlx5_1 "),
            ("VERBSNET_IB_GID_INDEX", "3"),
        ]);
        assert_eq!(c.ib_hca.as_deref(), Some("^=mlx5_0:1,mlx5_1"));
        assert_eq!(c.ib_gid_index, Some(3));
        assert_eq!(ok(&[("VERBSNET_IB_GID_INDEX", "0")]).ib_gid_index, Some(0));
        assert_eq!(
            ok(&[("VERBSNET_IB_GID_INDEX", "255")]).ib_gid_index,
            Some(255)
        );
        assert_eq!(ok(&[("VERBSNET_IB_GID_INDEX", "-1")]).ib_gid_index, None);
        assert_eq!(
            err(&[("VERBSNET_IB_GID_INDEX", "256")]),
            r#"VERBSNET_IB_GID_INDEX="256" is not valid: expected an integer in 0..=255, or -1 for auto"#
        );
        assert_eq!(
            err(&[("VERBSNET_IB_GID_INDEX", "-2")]),
            r#"VERBSNET_IB_GID_INDEX="-2" is not valid: expected an integer in 0..=255, or -1 for auto"#
        );
    }

    #[test]
    fn socket_address_and_interface() {
        let c = ok(&[
            ("VERBSNET_SOCKET_ADDR", "10.0.0.1"),
            ("VERBSNET_SOCKET_IFNAME", "eth0"),
        ]);
        assert_eq!(c.socket_addr, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(c.socket_ifname.as_deref(), Some("eth0"));
        assert_eq!(
            err(&[("VERBSNET_SOCKET_IFNAME", "^=")]),
            r#"VERBSNET_SOCKET_IFNAME="^=" is not valid: expected an interface list as NCCL_SOCKET_IFNAME: [^][=]name[,name...] (prefixes)"#
        );
        let c = ok(&[
            ("NCCL_SOCKET_IFNAME", "^docker"),
            ("NCCL_SOCKET_FAMILY", "AF_INET6"),
        ]);
        assert_eq!(c.socket_ifname, None);
        assert_eq!(c.nccl_socket_ifname.as_deref(), Some("^docker"));
        assert_eq!(c.nccl_socket_family.as_deref(), Some("AF_INET6"));
        let c = ok(&[("VERBSNET_SOCKET_ADDR", " fd00::1 ")]);
        assert_eq!(c.socket_addr, Some("fd00::1".parse().unwrap()));
        assert_eq!(
            err(&[("VERBSNET_SOCKET_ADDR", "10.0.0.1:5000")]),
            r#"VERBSNET_SOCKET_ADDR="10.0.0.1:5000" is not valid: expected an IPv4 or IPv6 address, e.g. 10.0.0.1 or fd00::1"#
        );
        assert_eq!(
            err(&[("VERBSNET_SOCKET_ADDR", "host.example")]),
            r#"VERBSNET_SOCKET_ADDR="host.example" is not valid: expected an IPv4 or IPv6 address, e.g. 10.0.0.1 or fd00::1"#
        );
    }

    #[test]
    fn durations() {
        let c = ok(&[
            ("VERBSNET_HANG_TIMEOUT", "2.5"),
            ("VERBSNET_STATS_INTERVAL", "10"),
        ]);
        assert_eq!(c.hang_timeout, Some(Duration::from_millis(2500)));
        assert_eq!(c.stats_interval, Some(Duration::from_secs(10)));
        let c = ok(&[
            ("VERBSNET_HANG_TIMEOUT", "0"),
            ("VERBSNET_STATS_INTERVAL", "0.0"),
        ]);
        assert_eq!((c.hang_timeout, c.stats_interval), (None, None));
        let msg = "is not valid: expected a number of seconds >= 0 (fractions allowed, 0 = off)";
        for bad in ["-1", "abc", "inf", "NaN", "1e30", "10s"] {
            assert_eq!(
                err(&[("VERBSNET_HANG_TIMEOUT", bad)]),
                format!("VERBSNET_HANG_TIMEOUT={bad:?} {msg}")
            );
        }
        assert_eq!(
            err(&[("VERBSNET_STATS_INTERVAL", "-0.5")]),
            format!(r#"VERBSNET_STATS_INTERVAL="-0.5" {msg}"#)
        );
    }

    #[test]
    fn connect_timeout_and_peer_check_interval() {
        let c = ok(&[
            ("VERBSNET_CONNECT_TIMEOUT", "2.5"),
            ("VERBSNET_PEER_CHECK_INTERVAL", "0.25"),
        ]);
        assert_eq!(c.connect_timeout, Some(Duration::from_millis(2500)));
        assert_eq!(c.peer_check_interval, Duration::from_millis(250));
        let c = ok(&[("VERBSNET_CONNECT_TIMEOUT", "0")]);
        assert_eq!(c.connect_timeout, None);
        assert_eq!(
            err(&[("VERBSNET_PEER_CHECK_INTERVAL", "0")]),
            r#"VERBSNET_PEER_CHECK_INTERVAL="0" is not valid: expected a number of seconds > 0 (fractions allowed)"#
        );
        assert_eq!(
            err(&[("VERBSNET_CONNECT_TIMEOUT", "-1")]),
            r#"VERBSNET_CONNECT_TIMEOUT="-1" is not valid: expected a number of seconds >= 0 (fractions allowed, 0 = no deadline)"#
        );
    }

    #[test]
    fn debug_level() {
        let cases = [
            ("none", DebugLevel::None),
            ("WARN", DebugLevel::Warn),
            ("info", DebugLevel::Info),
            ("Debug", DebugLevel::Debug),
            ("trace", DebugLevel::Trace),
        ];
        for (v, level) in cases {
            assert_eq!(ok(&[("VERBSNET_DEBUG", v)]).debug, level, "{v}");
        }
        assert!(DebugLevel::None < DebugLevel::Warn && DebugLevel::Debug < DebugLevel::Trace);
        assert_eq!(
            err(&[("VERBSNET_DEBUG", "verbose")]),
            r#"VERBSNET_DEBUG="verbose" is not valid: expected one of none, warn, info, debug, trace"#
        );
    }

    #[test]
    fn debug_default_follows_nccl_debug() {
        assert_eq!(ok(&[("NCCL_DEBUG", "INFO")]).debug, DebugLevel::Info);
        assert_eq!(ok(&[("NCCL_DEBUG", "trace")]).debug, DebugLevel::Info);
        assert_eq!(ok(&[("NCCL_DEBUG", "WARN")]).debug, DebugLevel::Warn);
        assert_eq!(ok(&[("NCCL_DEBUG", "VERSION")]).debug, DebugLevel::Warn);
        let c = ok(&[("NCCL_DEBUG", "INFO"), ("VERBSNET_DEBUG", "none")]);
        assert_eq!(c.debug, DebugLevel::None);
        let c = ok(&[("NCCL_DEBUG", "WARN"), ("VERBSNET_DEBUG", "trace")]);
        assert_eq!(c.debug, DebugLevel::Trace);
    }

    #[test]
    fn describe_lists_every_knob_in_order() {
        assert_eq!(
            Config::default().describe(),
            "transport=auto rq_depth=128 rq_batch=16 rq_low_water=112 rq_min_depth=2 \
             rq_shrink_after=2s rq_pool_size=268435456 eager_buf_size=8192 \
             eager_limit=8192 credits=on rnr_timer=12 rnr_retry=7 ib_timeout=20 ib_retry_cnt=6 \
             ib_tc=0 ib_sl=0 ib_hca=all ib_gid_index=auto socket_addr=auto socket_ifname=auto socket_keepalive=20s \
             hang_timeout=60s \
             stats_interval=off stats_file=off debug=warn connect_timeout=120s \
             peer_check_interval=1s"
        );
        let c = ok(&[
            ("VERBSNET_TRANSPORT", "tcp"),
            ("VERBSNET_RQ_DEPTH", "4"),
            ("VERBSNET_CREDITS", "off"),
            ("VERBSNET_IB_HCA", "mlx5_0:1"),
            ("VERBSNET_IB_GID_INDEX", "3"),
            ("VERBSNET_SOCKET_ADDR", "10.0.0.1"),
            ("VERBSNET_SOCKET_IFNAME", "eth0"),
            ("VERBSNET_HANG_TIMEOUT", "0"),
            ("VERBSNET_STATS_INTERVAL", "0.5"),
            ("VERBSNET_DEBUG", "trace"),
        ]);
        assert_eq!(
            c.describe(),
            "transport=tcp rq_depth=4 rq_batch=4 rq_low_water=1 rq_min_depth=2 \
             rq_shrink_after=2s rq_pool_size=268435456 eager_buf_size=8192 \
             eager_limit=8192 credits=off rnr_timer=12 rnr_retry=7 ib_timeout=20 ib_retry_cnt=6 \
             ib_tc=0 ib_sl=0 ib_hca=mlx5_0:1 ib_gid_index=3 socket_addr=10.0.0.1 socket_ifname=eth0 \
             socket_keepalive=20s hang_timeout=off stats_interval=0.5s stats_file=off debug=trace \
             connect_timeout=120s peer_check_interval=1s"
        );
    }

    #[test]
    fn traffic_class_and_service_level_are_bounded() {
        let c = ok(&[("VERBSNET_IB_TC", "106"), ("VERBSNET_IB_SL", "15")]);
        assert_eq!((c.ib_tc, c.ib_sl), (106, 15));
        assert_eq!((Config::default().ib_tc, Config::default().ib_sl), (0, 0));
        assert_eq!(
            err(&[("VERBSNET_IB_TC", "256")]),
            r#"VERBSNET_IB_TC="256" is not valid: expected an integer in 0..=255"#
        );
        assert_eq!(
            err(&[("VERBSNET_IB_SL", "16")]),
            r#"VERBSNET_IB_SL="16" is not valid: expected an integer in 0..=15"#
        );
    }

    #[test]
    fn the_sources_of_the_configuration_are_named() {
        let m: std::collections::HashMap<&str, &str> = [
            ("VERBSNET_RQ_DEPTH", "256"),
            ("VERBSNET_CREDITS", " "),
            ("VERBSNET_DEBUG", "info"),
        ]
        .into_iter()
        .collect();
        let by = Config::set_by(|k| m.get(k).map(|v| v.to_string()));
        assert_eq!(
            by,
            vec!["VERBSNET_RQ_DEPTH", "VERBSNET_DEBUG"],
            "blank means default"
        );
        assert!(Config::set_by(|_| None).is_empty());
    }

    #[test]
    fn registry_is_complete_and_unique() {
        assert_eq!(KNOBS.len(), 27);
        for (i, k) in KNOBS.iter().enumerate() {
            assert!(k.var.starts_with("VERBSNET_"), "{}", k.var);
            assert_eq!(k.var, format!("VERBSNET_{}", k.key.to_ascii_uppercase()));
            assert!(KNOBS[i + 1..].iter().all(|o| o.var != k.var), "{}", k.var);
            assert!(!k.accepted().is_empty() && !k.doc.is_empty() && !k.default.is_empty());
            assert!(!k.nccl_ib.is_empty(), "{}", k.var);
        }
        // Every field of Config appears in describe().
        let d = Config::default().describe();
        assert_eq!(d.split(' ').count(), KNOBS.len());
    }

    #[test]
    fn every_knob_rejects_garbage_with_its_registry_text() {
        // Free-form knobs accept any non-empty text.
        let free = [
            "VERBSNET_IB_HCA",
            "VERBSNET_SOCKET_IFNAME",
            "VERBSNET_STATS_FILE",
        ];
        for k in KNOBS.iter().filter(|k| !free.contains(&k.var)) {
            let e = parse(&[(k.var, "bogus?")]).expect_err(k.var);
            assert_eq!(e.var, k.var);
            assert_eq!(e.value, "bogus?");
            assert!(e.expected.starts_with(&k.accepted()), "{e}");
        }
        for var in free {
            assert!(parse(&[(var, "bogus?")]).is_ok(), "{var}");
        }
    }

    #[test]
    fn unknown_vars_flags_typos_only() {
        let env = [
            ("VERBSNET_RQDEPTH", "512"),
            ("VERBSNET_RQ_DEPTH", "512"),
            ("PATH", "/bin"),
            ("NCCL_DEBUG", "INFO"),
            ("VERBSNET_TRANSPORTS", "tcp"),
            ("VERBSNET_RQDEPTH", "1"),
            ("verbsnet_rq_depth", "1"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        assert_eq!(
            unknown_vars(env.into_iter()),
            vec!["VERBSNET_RQDEPTH", "VERBSNET_TRANSPORTS"]
        );
        let known = KNOBS.iter().map(|k| (k.var.to_string(), String::new()));
        assert!(unknown_vars(known).is_empty());
    }

    #[test]
    fn suggest_finds_the_intended_knob() {
        assert_eq!(suggest("VERBSNET_RQDEPTH"), Some("VERBSNET_RQ_DEPTH"));
        assert_eq!(suggest("VERBSNET_TRANSPORTS"), Some("VERBSNET_TRANSPORT"));
        assert_eq!(suggest("verbsnet_ib_timout"), Some("VERBSNET_IB_TIMEOUT"));
        assert_eq!(suggest("VERBSNET_FOO"), None);
    }

    /// The registry's `default` text and [`Config::default`] say the same: every literal
    /// default parses to exactly the default configuration; the derived ones are the listed
    /// rules (a literal default that does not parse would land here and fail).
    #[test]
    fn registry_defaults_are_the_default_config() {
        let derived = [
            ("VERBSNET_RQ_BATCH", "min(16, rq_depth)"),
            ("VERBSNET_RQ_LOW_WATER", "max(1, rq_depth - rq_batch)"),
            ("VERBSNET_RQ_MIN_DEPTH", "min(2, rq_depth)"),
            ("VERBSNET_EAGER_LIMIT", "eager_buf_size"),
            ("VERBSNET_IB_HCA", "all active ports"),
            ("VERBSNET_STATS_FILE", "unset"),
            (
                "VERBSNET_DEBUG",
                "warn (info when NCCL_DEBUG is INFO or TRACE)",
            ),
            ("VERBSNET_SOCKET_ADDR", "auto"),
            ("VERBSNET_SOCKET_IFNAME", "auto"),
            // Spelt -1 in the environment, as NCCL_IB_GID_INDEX.
            ("VERBSNET_IB_GID_INDEX", "auto"),
        ];
        let d = Config::default();
        for k in KNOBS {
            if let Some((_, rule)) = derived.iter().find(|(v, _)| *v == k.var) {
                assert_eq!(k.default, *rule, "{}", k.var);
                continue;
            }
            let c = parse(&[(k.var, k.default)]).unwrap_or_else(|e| panic!("{}: {e}", k.var));
            assert_eq!(c, d, "{}={} is not Config::default()", k.var, k.default);
        }
        // The derived rules, evaluated at the default and at a small depth.
        assert_eq!((d.rq_batch, d.rq_low_water, d.rq_min_depth), (16, 112, 2));
        assert_eq!(d.eager_limit, d.eager_buf_size);
        let c = ok(&[("VERBSNET_RQ_DEPTH", "4")]);
        assert_eq!((c.rq_batch, c.rq_low_water, c.rq_min_depth), (4, 1, 2));
        let c = ok(&[("VERBSNET_RQ_DEPTH", "1")]);
        assert_eq!((c.rq_batch, c.rq_low_water, c.rq_min_depth), (1, 1, 1));
        let c = ok(&[("VERBSNET_RQ_DEPTH", "64"), ("VERBSNET_RQ_BATCH", "8")]);
        assert_eq!(c.rq_low_water, 56);
        assert_eq!(ok(&[("VERBSNET_EAGER_BUF_SIZE", "1024")]).eager_limit, 1024);
        assert_eq!(ok(&[("NCCL_DEBUG", "INFO")]).debug, DebugLevel::Info);
    }

    /// The parser takes its ranges from the registry: each fixed range's ends are accepted and
    /// one past them refused; every keyword of a choice parses.
    #[test]
    fn registry_ranges_are_what_the_parser_enforces() {
        let mut checked = 0;
        for k in KNOBS {
            let fixed = match k.kind {
                Kind::Int { lo, hi } | Kind::IntOrAuto { lo, hi } => Some((lo, hi)),
                Kind::Bytes { hi } => Some((0, hi)),
                _ => None,
            };
            if let Some((lo, hi)) = fixed {
                for v in [lo, hi].map(|n| n.to_string()) {
                    parse(&[(k.var, &v)]).unwrap_or_else(|e| panic!("{}={v}: {e}", k.var));
                }
                let above = (u64::from(hi) + 1).to_string();
                assert_eq!(parse(&[(k.var, &above)]).unwrap_err().var, k.var);
                if lo > 0 {
                    let below = (lo - 1).to_string();
                    assert_eq!(parse(&[(k.var, &below)]).unwrap_err().var, k.var);
                }
                checked += 1;
            }
            if let Kind::Choice(words) = k.kind {
                for w in words {
                    parse(&[(k.var, w)]).unwrap_or_else(|e| panic!("{}={w}: {e}", k.var));
                    let upper = w.to_ascii_uppercase();
                    assert!(parse(&[(k.var, &upper)]).is_ok(), "{}={upper}", k.var);
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 12, "integer and choice knobs checked");
        assert_eq!(
            parse(&[("VERBSNET_IB_GID_INDEX", "-1")])
                .unwrap()
                .ib_gid_index,
            None
        );
    }

    /// docs/configuration.md's knob tables are generated from the registry: the page holds,
    /// between `<!-- knobs:MARKER -->` and `<!-- /knobs -->`, exactly [`doc_table`]'s output,
    /// and its example INFO line is `describe()` of the defaults. `VERBSNET_BLESS=1` rewrites
    /// the page instead of failing (then review the diff).
    #[test]
    fn documentation_tables_are_generated_from_the_registry() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
        let doc = std::fs::read_to_string(path).expect("docs/configuration.md");
        let mut out = String::new();
        let mut rest = doc.as_str();
        let mut listed = 0;
        for g in Group::ALL {
            let open = format!("<!-- knobs:{} -->\n", g.marker());
            let start = rest
                .find(&open)
                .unwrap_or_else(|| panic!("docs/configuration.md lacks {open:?} (in order)"));
            let body = start + open.len();
            let end = body
                + rest[body..]
                    .find("<!-- /knobs -->")
                    .expect("an end marker after each table");
            out.push_str(&rest[..body]);
            out.push_str(&doc_table(g));
            rest = &rest[end..];
            listed += KNOBS.iter().filter(|k| k.group == g).count();
        }
        out.push_str(rest);
        assert_eq!(listed, KNOBS.len(), "every knob is in one group");
        let describe = Config::default().describe();
        assert!(
            doc.contains(&format!("NET/verbsnet : configuration {describe}\n")),
            "docs/configuration.md's example INFO line differs from the defaults: {describe}"
        );
        if out != doc {
            if std::env::var_os("VERBSNET_BLESS").is_some() {
                std::fs::write(path, &out).expect("rewrite docs/configuration.md");
            } else {
                panic!(
                    "docs/configuration.md's knob tables differ from plugin/config.rs's KNOBS; \
                     rerun with VERBSNET_BLESS=1 to regenerate them and review the diff"
                );
            }
        }
    }
}
