//! Configuration from `VERBSNET_*` environment variables, parsed once in `init`.
//!
//! Every knob is declared once, as one entry of the list in `knobs.rs`: its [`Config`] field
//! and type, variable, type and range ([`Kind`]), default, parser, how the INFO line shows it,
//! documentation and NCCL IB equivalent. From that list come the [`Config`] struct, the
//! registry [`KNOBS`], [`Config::from_lookup`] (which takes its ranges and error texts from
//! the entries), [`Config::describe`] and docs/configuration.md's knob tables ([`doc_table`];
//! a unit test fails when the page differs and `VERBSNET_BLESS=1` regenerates it); another
//! test parses each entry's default text back to [`Config::default`]. A bad value fails
//! `init` with an error naming the variable, the value and what is accepted, e.g.
//! `VERBSNET_RQ_DEPTH="abc" is not valid: expected an integer in 1..=32768`.
//!
//! Rules common to every knob: an unset or empty (all-whitespace) value means "use the
//! default"; surrounding whitespace is ignored; keywords are case-insensitive.

use std::fmt::Write as _;

mod knobs;
mod parse;
mod registry;
#[cfg(test)]
mod tests;

pub use knobs::{Config, KNOBS};
pub use registry::{doc_table, Group, Kind, Knob};

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

impl TransportChoice {
    /// Every choice, in the order of `VERBSNET_TRANSPORT`'s keywords.
    pub const ALL: [TransportChoice; 3] = [
        TransportChoice::Auto,
        TransportChoice::Ib,
        TransportChoice::Tcp,
    ];

    /// The keyword accepted by `VERBSNET_TRANSPORT`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            TransportChoice::Auto => "auto",
            TransportChoice::Ib => "ib",
            TransportChoice::Tcp => "tcp",
        }
    }
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
    /// Every level, in order (and in the order of `VERBSNET_DEBUG`'s keywords).
    pub const ALL: [DebugLevel; 5] = [
        DebugLevel::None,
        DebugLevel::Warn,
        DebugLevel::Info,
        DebugLevel::Debug,
        DebugLevel::Trace,
    ];

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

/// Largest `VERBSNET_RQ_DEPTH`.
pub const MAX_RQ_DEPTH: u32 = 32768;

/// Largest `VERBSNET_IB_QPS_PER_CONNECTION`: NCCL IB's `NCCL_IB_MAX_QPS`
/// (`src/transport/net_ib/common.h`); the engine's `MAX_QPS_PER_CONNECTION` (connection
/// set-up checks at compile time that they agree).
pub const MAX_QPS_PER_CONNECTION: u32 = 128;
/// Largest `VERBSNET_EAGER_BUF_SIZE` (1 MiB).
pub const MAX_EAGER_BUF_SIZE: u32 = 1 << 20;
/// Largest `VERBSNET_INLINE_SIZE` (16 KiB: the most the tcp transport copies into a frame).
pub const MAX_INLINE_SIZE: u32 = 16 << 10;
/// `VERBSNET_INLINE_SIZE` on ib when unset: what most RDMA NICs take inline in one send WQE
/// without slowing the post (the device may grant less at QP creation).
pub const INLINE_SIZE_IB: u32 = 256;
/// `VERBSNET_INLINE_SIZE` on tcp when unset: the transport copies small payloads into its
/// frames anyway, so copying them at the post costs nothing more.
pub const INLINE_SIZE_TCP: u32 = 4096;

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

/// Default `VERBSNET_DEBUG`: `NCCL_DEBUG=INFO|TRACE` ⇒ `info` (so our setup lines show next to
/// NCCL's), else `warn`. NCCL's own TRACE does not turn on our hot-path events: that takes
/// `VERBSNET_DEBUG`.
fn debug_default(nccl_debug: Option<&str>) -> DebugLevel {
    match nccl_debug.map(|v| v.trim().to_ascii_uppercase()).as_deref() {
        Some("INFO") | Some("TRACE") => DebugLevel::Info,
        _ => DebugLevel::Warn,
    }
}

impl Default for Config {
    /// Every knob at its default: the configuration of an empty environment.
    fn default() -> Self {
        // An empty environment has no value to reject: every parser returns "unset".
        Config::from_lookup(|_| None).unwrap_or_else(|e| unreachable!("{e}"))
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

/// `VERBSNET_*` names that belong to the project's own test and benchmark tools (the test
/// suites, the explorer, the GPU check, the plot test), not to the plugin: prefixes ending in
/// `_` and whole names. They are not knobs, and the plugin does not WARN about them, so a suite
/// that sets `VERBSNET_TEST_TRANSPORT=ib` does not fill its logs with "unknown variable".
pub const TOOL_VARS: &[&str] = &[
    "VERBSNET_TEST_",
    "VERBSNET_EXPLORER_",
    "VERBSNET_LIVENESS_",
    "VERBSNET_SCEN_",
    "VERBSNET_GPU_",
    "VERBSNET_FAKE_",
    "VERBSNET_PLOT_",
    "VERBSNET_BLESS",
    "VERBSNET_REQUIRE_PLOT",
    "VERBSNET_PLUGIN_SO",
    "VERBSNET_NCCL_HOME",
    "VERBSNET_NVCC_FLAGS",
];

fn tool_var(name: &str) -> bool {
    TOOL_VARS.iter().any(|t| {
        if t.ends_with('_') {
            name.starts_with(t)
        } else {
            name == *t
        }
    })
}

/// The `VERBSNET_*` names in `env` that are neither knobs nor the test tools' own
/// ([`TOOL_VARS`]): typos such as `VERBSNET_RQDEPTH`, sorted, so `init` can WARN about them.
/// Other variables are ignored.
#[must_use]
pub fn unknown_vars(env: impl Iterator<Item = (String, String)>) -> Vec<String> {
    let mut unknown: Vec<String> = env
        .map(|(name, _)| name)
        .filter(|name| name.starts_with("VERBSNET_") && knob(name).is_none() && !tool_var(name))
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
