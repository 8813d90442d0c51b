//! What a comm tells the operator on its own: the hang watchdog (`VERBSNET_HANG_TIMEOUT`: a
//! request idle that long is reported once, with what it waits for and the counters), the
//! periodic stats line (`VERBSNET_STATS_INTERVAL`), the close line and its
//! `VERBSNET_STATS_FILE` record, and when to ask the transport whether the peer is still there
//! (`VERBSNET_PEER_CHECK_INTERVAL`). The timers and the texts live here; the comm's core
//! ([`super::core`]) runs them with its engine's answers.

use std::io::Write;

use tracing::{info, warn};

use super::now_ns;
use crate::config::Config;
use crate::engine::{ReqError, Stall};

/// Watchdog, periodic-stats and peer-check timers of one comm (nanoseconds of [`now_ns`]).
pub(super) struct Watch {
    hang_ns: Option<u64>,
    stats_ns: Option<u64>,
    last_check: u64,
    last_stats: u64,
    warned_failure: bool,
    /// The peer's going was reported (one WARN; the checks stop).
    pub(super) warned_peer: bool,
    /// `VERBSNET_PEER_CHECK_INTERVAL` in ns, and when the set-up socket was last asked.
    peer_check_ns: u64,
    last_peer_check: u64,
}

impl Watch {
    pub(super) fn new(cfg: &Config) -> Watch {
        let now = now_ns();
        Watch {
            hang_ns: cfg.hang_timeout.map(|d| d.as_nanos() as u64),
            stats_ns: cfg.stats_interval.map(|d| d.as_nanos() as u64),
            last_check: now,
            last_stats: now,
            warned_failure: false,
            warned_peer: false,
            peer_check_ns: cfg.peer_check_interval.as_nanos() as u64,
            last_peer_check: now,
        }
    }

    /// Whether to ask the transport about the peer now: at most once per
    /// `VERBSNET_PEER_CHECK_INTERVAL`, on every kind of call, until the peer was reported
    /// gone. Also with nothing in flight: an `isend` answering "retry later" (waiting for a
    /// credit or a clear-to-send) or an `irecv` on an idle comm must learn that the peer died
    /// or closed, or NCCL would wait for ever. And also when the poll brought completions:
    /// they may have waited in the CQ since long before the peer went (the tcp transport's
    /// progress thread, like a NIC, completes work while nobody calls). The ib transport reads
    /// its set-up socket (one non-blocking `recv` per interval); the tcp transport only looks
    /// at its state.
    #[inline]
    pub(super) fn peer_check_due(&mut self, now: u64) -> bool {
        if !self.peer_check_pending(now) {
            return false;
        }
        self.last_peer_check = now;
        true
    }

    #[inline]
    fn peer_check_pending(&self, now: u64) -> bool {
        !self.warned_peer && now.saturating_sub(self.last_peer_check) >= self.peer_check_ns
    }

    /// Whether neither a peer check nor a watchdog turn is due at `now` (asked without taking
    /// either): an `isend` or `irecv` the engine can start at once may then skip its progress
    /// without delaying a peer check or a stall report.
    #[inline]
    pub(super) fn nothing_due(&self, now: u64) -> bool {
        !self.peer_check_pending(now) && !self.turn_pending(now)
    }

    /// The comm's failure, as one WARN the first time it is seen.
    #[inline]
    pub(super) fn failure(&mut self, e: Option<&ReqError>) {
        if let Some(e) = e {
            if !self.warned_failure {
                self.warned_failure = true;
                warn!("{e}");
            }
        }
    }

    /// The comm's failure needs no WARN of its own (an orderly close of both ends).
    pub(super) fn silence_failure(&mut self) {
        self.warned_failure = true;
    }

    /// Whether a watchdog turn is due (at most one a second); the turn is then taken.
    #[inline]
    pub(super) fn turn_due(&mut self, now: u64) -> bool {
        if !self.turn_pending(now) {
            return false;
        }
        self.last_check = now;
        true
    }

    #[inline]
    fn turn_pending(&self, now: u64) -> bool {
        now.saturating_sub(self.last_check) >= 1_000_000_000
    }

    /// The hang timeout (ns), when the watchdog is on.
    pub(super) fn hang_ns(&self) -> Option<u64> {
        self.hang_ns
    }

    /// Whether the periodic stats line is due (asked in a watchdog turn).
    pub(super) fn stats_due(&mut self, now: u64) -> bool {
        match self.stats_ns {
            Some(iv) if now.saturating_sub(self.last_stats) >= iv => {
                self.last_stats = now;
                true
            }
            _ => false,
        }
    }
}

/// `name=value` words, space-separated.
pub(super) fn line(counters: &[(&str, u64)]) -> String {
    counters
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The WARN for a stalled request: what, for how long, what it waits for, and `counters`
/// (engine, QP and device, plus the side's own words).
pub(super) fn report_stall(s: &Stall, counters: &str) {
    warn!(
        "{} has made no progress for {:.1} s; waiting for {}. Counters: {}. \
         (VERBSNET_HANG_TIMEOUT sets this report's delay; 0 turns it off)",
        s.what,
        s.idle_ns as f64 / 1e9,
        s.waiting_for,
        counters
    );
}

/// The periodic stats line (engine counters).
pub(super) fn report_stats(counters: &[(&str, u64)]) {
    info!("stats {}", line(counters));
}

/// The close line (INFO), and the comm's `VERBSNET_STATS_FILE` record when a file is set: one
/// JSON object per line, `side` (`"send"`/`"recv"`), `comm` (the label), `comm_id` (a string,
/// so the harness does not sum it as a counter) and every counter.
pub(super) fn report_close(
    side: &str,
    label: &str,
    comm_id: Option<u64>,
    counters: &[(&str, u64)],
    stats_file: Option<&str>,
) {
    info!(target: "verbsnet::init", "closing {label}: {}", line(counters));
    let Some(path) = stats_file else {
        return;
    };
    let mut s = format!(
        "{{\"side\":\"{side}\",\"comm\":\"{}\"",
        label.replace(['"', '\\'], "'")
    );
    if let Some(id) = comm_id {
        s.push_str(&format!(",\"comm_id\":\"{id:#x}\""));
    }
    for (k, v) in counters {
        s.push_str(&format!(",\"{k}\":{v}"));
    }
    s.push('}');
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| writeln!(f, "{s}"));
}
