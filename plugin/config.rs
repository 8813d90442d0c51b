//! Configuration from `VERBSNET_*` environment variables, parsed once in `init`.
//!
//! Every knob, its default, range and reason is listed once, in [`KNOBS`]; the parser takes
//! its error texts from there and [`Config::describe`] its names. `docs/configuration.md`
//! documents the same knobs (a test checks that it names every variable); keep the two in
//! step. A bad value fails `init` with an error naming the variable, the value and what is
//! accepted, e.g.
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

impl Default for Config {
    fn default() -> Self {
        Config {
            transport: TransportChoice::Auto,
            rq_depth: 128,
            rq_batch: 16,
            rq_low_water: 112,
            rq_min_depth: 2,
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

/// One `VERBSNET_*` knob: the single registry entry the parser, [`Config::describe`] and
/// the documentation test read.
#[derive(Clone, Copy, Debug)]
pub struct Knob {
    /// The environment variable, e.g. `VERBSNET_RQ_DEPTH`.
    pub var: &'static str,
    /// The short name used by [`Config::describe`], e.g. `rq_depth`.
    pub key: &'static str,
    /// The default, as text.
    pub default: &'static str,
    /// What is accepted: exactly the `expected` text of a [`ConfigError`] (for knobs bounded by
    /// another knob, the error appends the bound in effect: `(here 1..=4)`).
    pub accepted: &'static str,
    /// What the knob does and why the default.
    pub reason: &'static str,
    /// Renders this knob's value in `config` for [`Config::describe`].
    show: fn(&Config) -> String,
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
        accepted: "one of auto, ib, tcp",
        reason: "auto uses verbs when a usable device exists and falls back to tcp (logged)",
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
        accepted: "an integer in 1..=32768",
        reason: "a common driver default; 512-1024 removes stalls for bursty receivers at \
                 rq_depth x (eager_buf_size + 64) bytes per receive comm",
        show: |c| c.rq_depth.to_string(),
    },
    Knob {
        var: "VERBSNET_RQ_BATCH",
        key: "rq_batch",
        default: "min(16, rq_depth)",
        accepted: "an integer in 1..=VERBSNET_RQ_DEPTH",
        reason: "one post_recv call per 16 WRs amortizes the doorbell",
        show: |c| c.rq_batch.to_string(),
    },
    Knob {
        var: "VERBSNET_RQ_LOW_WATER",
        key: "rq_low_water",
        default: "max(1, rq_depth - rq_batch)",
        accepted: "an integer in 1..=VERBSNET_RQ_DEPTH-VERBSNET_RQ_BATCH+1",
        reason: "refill as soon as one batch fits, keeping the RQ nearly full",
        show: |c| c.rq_low_water.to_string(),
    },
    Knob {
        var: "VERBSNET_RQ_MIN_DEPTH",
        key: "rq_min_depth",
        default: "min(2, rq_depth)",
        accepted: "an integer in 1..=VERBSNET_RQ_DEPTH",
        reason: "an idle connection pins about 60 KiB in all; a busy one grows a batch each \
                 time its RQ runs dry, from the shared pool; = rq_depth for a fixed depth",
        show: |c| c.rq_min_depth.to_string(),
    },
    Knob {
        var: "VERBSNET_RQ_SHRINK_AFTER",
        key: "rq_shrink_after",
        default: "2",
        accepted: "seconds >= 0 (fractions allowed; 0 = never shrink)",
        reason: "longer than the gaps between NCCL's steps, short enough that an idle \
                 communicator gives its bounce buffers back to the pool within seconds",
        show: |c| match c.rq_shrink_after {
            Some(d) => format!("{}s", d.as_secs_f64()),
            None => "never".into(),
        },
    },
    Knob {
        var: "VERBSNET_RQ_POOL_SIZE",
        key: "rq_pool_size",
        default: "268435456",
        accepted: "an integer number of bytes in 0..=4294967295",
        reason: "256 MiB: about 256 receive comms at the full default depth at once, whatever \
                 the number of connections; when it is used up, senders wait for credits",
        show: |c| c.rq_pool_size.to_string(),
    },
    Knob {
        var: "VERBSNET_EAGER_BUF_SIZE",
        key: "eager_buf_size",
        default: "8192",
        accepted: "an integer number of bytes in 0..=1048576",
        reason: "covers NCCL's small LL/LL128 messages; memory is rq_depth x this per comm",
        show: |c| c.eager_buf_size.to_string(),
    },
    Knob {
        var: "VERBSNET_EAGER_LIMIT",
        key: "eager_limit",
        default: "eager_buf_size",
        accepted: "an integer number of bytes in 0..=VERBSNET_EAGER_BUF_SIZE",
        reason: "anything that fits a bounce buffer goes eagerly (one copy, no CTS round trip)",
        show: |c| c.eager_limit.to_string(),
    },
    Knob {
        var: "VERBSNET_CREDITS",
        key: "credits",
        default: "1",
        accepted: "a boolean: 1, 0, true, false, on, off, yes, no",
        reason: "an isend never outruns the receiver's posted receives; 0 mimics NCCL IB \
                 (relies on RNR retry)",
        show: |c| if c.credits { "on" } else { "off" }.to_string(),
    },
    Knob {
        var: "VERBSNET_RNR_TIMER",
        key: "rnr_timer",
        default: "12",
        accepted: "an integer in 0..=31",
        reason: "IB encoding; 12 = 0.64 ms, as NCCL IB's min_rnr_timer",
        show: |c| c.rnr_timer.to_string(),
    },
    Knob {
        var: "VERBSNET_RNR_RETRY",
        key: "rnr_retry",
        default: "7",
        accepted: "an integer in 0..=7",
        reason: "7 = retry forever, as NCCL IB; the hang watchdog reports stalls",
        show: |c| c.rnr_retry.to_string(),
    },
    Knob {
        var: "VERBSNET_IB_TIMEOUT",
        key: "ib_timeout",
        default: "20",
        accepted: "an integer in 1..=31",
        reason: "4.096 us x 2^20 = 4.3 s ACK timeout, as NCCL_IB_TIMEOUT since NCCL 2.23",
        show: |c| c.ib_timeout.to_string(),
    },
    Knob {
        var: "VERBSNET_IB_RETRY_CNT",
        key: "ib_retry_cnt",
        default: "6",
        accepted: "an integer in 0..=7",
        reason: "a silent peer fails WRs after (6+1) x 4.3 s = 30 s; 7 (NCCL's) is endless on rxe",
        show: |c| c.ib_retry_cnt.to_string(),
    },
    // -- traffic class and service level (issue 9) --
    Knob {
        var: "VERBSNET_IB_TC",
        key: "ib_tc",
        default: "0",
        accepted: "an integer in 0..=255",
        reason: "the GRH traffic class (DSCP << 2 | ECN) of RC QPs, as NCCL_IB_TC (default 0);                  a communicator's trafficClass (ncclNet v10+) overrides it when set",
        show: |c| c.ib_tc.to_string(),
    },
    Knob {
        var: "VERBSNET_IB_SL",
        key: "ib_sl",
        default: "0",
        accepted: "an integer in 0..=15",
        reason: "the InfiniBand service level of RC QPs, as NCCL_IB_SL (default 0)",
        show: |c| c.ib_sl.to_string(),
    },
    Knob {
        var: "VERBSNET_IB_HCA",
        key: "ib_hca",
        default: "all active ports",
        accepted: "a non-empty device list [^][=]name[:port],...",
        reason: "same syntax as NCCL_IB_HCA",
        show: |c| show_opt_str(c.ib_hca.as_deref(), "all"),
    },
    Knob {
        var: "VERBSNET_IB_GID_INDEX",
        key: "ib_gid_index",
        default: "auto",
        accepted: "an integer in 0..=255, or -1 for auto",
        reason: "auto picks a RoCE v2 IPv4-mapped GID, as NCCL_IB_GID_INDEX=-1",
        show: |c| c.ib_gid_index.map_or("auto".to_string(), |g| g.to_string()),
    },
    Knob {
        var: "VERBSNET_SOCKET_ADDR",
        key: "socket_addr",
        default: "auto",
        accepted: "an IPv4 or IPv6 address, e.g. 10.0.0.1 or fd00::1",
        reason: "auto uses VERBSNET_SOCKET_IFNAME or the first non-loopback interface",
        show: |c| c.socket_addr.map_or("auto".to_string(), |a| a.to_string()),
    },
    Knob {
        var: "VERBSNET_SOCKET_IFNAME",
        key: "socket_ifname",
        default: "auto",
        accepted: "an interface list as NCCL_SOCKET_IFNAME: [^][=]name[,name...] (prefixes)",
        reason: "auto: NCCL_SOCKET_IFNAME, else NCCL's order (ib*, then not docker/lo/virbr/veth)",
        show: |c| show_opt_str(c.socket_ifname.as_deref(), "auto"),
    },
    Knob {
        var: "VERBSNET_SOCKET_KEEPALIVE",
        key: "socket_keepalive",
        default: "20",
        accepted: "a number of seconds >= 0 (fractions allowed, 0 = off)",
        reason: "a powered-off peer host is noticed within 20 s even with no WR in flight",
        show: |c| show_duration(c.socket_keepalive),
    },
    Knob {
        var: "VERBSNET_HANG_TIMEOUT",
        key: "hang_timeout",
        default: "60",
        accepted: "a number of seconds >= 0 (fractions allowed, 0 = off)",
        reason: "a request idle this long is reported (WARN) instead of hanging silently",
        show: |c| show_duration(c.hang_timeout),
    },
    Knob {
        var: "VERBSNET_STATS_INTERVAL",
        key: "stats_interval",
        default: "0",
        accepted: "a number of seconds >= 0 (fractions allowed, 0 = off)",
        reason: "periodic counter lines are for debugging, off by default",
        show: |c| show_duration(c.stats_interval),
    },
    Knob {
        var: "VERBSNET_STATS_FILE",
        key: "stats_file",
        default: "unset",
        accepted: "a file path",
        reason: "machine-readable counters for verbsnet-perf --stats and scripts; off by default",
        show: |c| show_opt_str(c.stats_file.as_deref(), "off"),
    },
    Knob {
        var: "VERBSNET_DEBUG",
        key: "debug",
        default: "warn (info when NCCL_DEBUG is INFO or TRACE)",
        accepted: "one of none, warn, info, debug, trace",
        reason: "warnings always; setup lines when NCCL itself is asked for INFO",
        show: |c| c.debug.as_str().to_string(),
    },
    // Connection set-up and peer liveness (issue 12).
    Knob {
        var: "VERBSNET_CONNECT_TIMEOUT",
        key: "connect_timeout",
        default: "120",
        accepted: "a number of seconds >= 0 (fractions allowed, 0 = no deadline)",
        reason: "a connect/accept that cannot finish fails naming the peer and stage instead of \
                 hanging; 2x NCCL's ~60 s socket connect retries, so a late peer still makes it",
        show: |c| show_duration(c.connect_timeout),
    },
    Knob {
        var: "VERBSNET_PEER_CHECK_INTERVAL",
        key: "peer_check_interval",
        default: "1",
        accepted: "a number of seconds > 0 (fractions allowed)",
        reason: "the set-up socket is read at most this often to notice a closed peer, so the \
                 data path makes no system call of its own",
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

        c.rq_depth = env
            .int("VERBSNET_RQ_DEPTH", 1, MAX_RQ_DEPTH)?
            .unwrap_or(128);
        let depth = c.rq_depth;
        c.rq_batch = env
            .int("VERBSNET_RQ_BATCH", 1, depth)?
            .unwrap_or(depth.min(16));
        let batch = c.rq_batch;
        // batch <= depth, so the bound is >= 1.
        let low_max = depth - batch + 1;
        c.rq_low_water = env
            .int("VERBSNET_RQ_LOW_WATER", 1, low_max)?
            .unwrap_or((depth - batch).max(1));
        c.rq_min_depth = env
            .int("VERBSNET_RQ_MIN_DEPTH", 1, depth)?
            .unwrap_or(depth.min(2));
        if let Some(t) = env.seconds("VERBSNET_RQ_SHRINK_AFTER")? {
            c.rq_shrink_after = t;
        }
        if let Some(b) = env.int("VERBSNET_RQ_POOL_SIZE", 0, u32::MAX)? {
            c.rq_pool_size = u64::from(b);
        }

        c.eager_buf_size = env
            .int("VERBSNET_EAGER_BUF_SIZE", 0, MAX_EAGER_BUF_SIZE)?
            .unwrap_or(8192);
        c.eager_limit = env
            .int("VERBSNET_EAGER_LIMIT", 0, c.eager_buf_size)?
            .unwrap_or(c.eager_buf_size);

        if let Some(v) = env.value("VERBSNET_CREDITS") {
            c.credits = match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "on" | "yes" => true,
                "0" | "false" | "off" | "no" => false,
                _ => return Err(invalid("VERBSNET_CREDITS", &v)),
            };
        }

        c.rnr_timer = env.small("VERBSNET_RNR_TIMER", 0, 31)?.unwrap_or(12);
        c.rnr_retry = env.small("VERBSNET_RNR_RETRY", 0, 7)?.unwrap_or(7);
        c.ib_timeout = env.small("VERBSNET_IB_TIMEOUT", 1, 31)?.unwrap_or(20);
        c.ib_retry_cnt = env.small("VERBSNET_IB_RETRY_CNT", 0, 7)?.unwrap_or(6);
        c.ib_tc = env.small("VERBSNET_IB_TC", 0, 255)?.unwrap_or(0);
        c.ib_sl = env.small("VERBSNET_IB_SL", 0, 15)?.unwrap_or(0);

        c.ib_hca = env.value("VERBSNET_IB_HCA").map(|v| v.trim().to_string());
        // -1 is NCCL_IB_GID_INDEX's spelling of "auto"; accept it for copied settings.
        c.ib_gid_index = match env.value("VERBSNET_IB_GID_INDEX") {
            Some(v) if v.trim() == "-1" => None,
            _ => env.int("VERBSNET_IB_GID_INDEX", 0, 255)?,
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

    /// An integer in `lo..=hi`. For knobs whose bound comes from another knob, the error's
    /// `expected` adds the bound in effect.
    fn int(&self, var: &'static str, lo: u32, hi: u32) -> Result<Option<u32>, ConfigError> {
        let Some(v) = self.value(var) else {
            return Ok(None);
        };
        let n = v.trim().parse::<u64>().ok();
        match n.and_then(|n| u32::try_from(n).ok()) {
            Some(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
            _ => Err(invalid_in(var, &v, lo, hi)),
        }
    }

    /// An integer in `lo..=hi` that fits a `u8`.
    fn small(&self, var: &'static str, lo: u8, hi: u8) -> Result<Option<u8>, ConfigError> {
        Ok(self.int(var, lo.into(), hi.into())?.map(|n| n as u8))
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
    let expected = knob(var).map_or("a valid value", |k| k.accepted);
    ConfigError {
        var: var.to_string(),
        value: value.to_string(),
        expected: expected.to_string(),
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
            assert!(!k.accepted.is_empty() && !k.reason.is_empty() && !k.default.is_empty());
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
            assert!(e.expected.starts_with(k.accepted), "{e}");
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

    #[test]
    fn documentation_names_every_knob_and_default() {
        let doc = include_str!("../docs/configuration.md");
        for k in KNOBS {
            assert!(
                doc.contains(&format!("`{}`", k.var)),
                "{} undocumented",
                k.var
            );
            assert!(doc.contains(k.default), "{} default {:?}", k.var, k.default);
        }
    }
}
