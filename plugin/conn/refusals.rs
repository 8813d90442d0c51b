//! Why a listener refused a connection, and the rate-limited log of refusals: a flood of bad
//! clients costs one WARN per interval, never an error of `accept`.

use std::io;
use std::net::SocketAddr;

use tracing::warn;

use super::REFUSAL_LOG_INTERVAL;

/// Why a connection was refused (the keys of the refusal summary).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Refusal {
    Deadline,
    Evicted,
    Closed,
    Malformed,
    Nonce,
    Transport,
    QpInfo,
    Socket,
}

impl Refusal {
    fn as_str(self) -> &'static str {
        match self {
            Refusal::Deadline => "past the handshake deadline",
            Refusal::Evicted => "evicted (too many pending handshakes)",
            Refusal::Closed => "closed or reset by the peer",
            Refusal::Malformed => "malformed handshake",
            Refusal::Nonce => "wrong nonce",
            Refusal::Transport => "wrong transport",
            Refusal::QpInfo => "unusable QP info",
            Refusal::Socket => "socket error",
        }
    }
}

/// Rate-limited log of refused connections: the first refusal of an interval is logged at
/// once with its reason; the others are counted and summarized when the interval has passed.
pub(super) struct Refusals {
    window_start: u64,
    logged_in_window: bool,
    counts: std::collections::BTreeMap<Refusal, u64>,
    pub(super) total: u64,
}

impl Refusals {
    pub(super) fn new() -> Refusals {
        Refusals {
            window_start: crate::comm::now_ns(),
            logged_in_window: false,
            counts: Default::default(),
            total: 0,
        }
    }

    pub(super) fn refuse(&mut self, at: SocketAddr, peer: SocketAddr, why: Refusal, detail: &str) {
        self.total += 1;
        if !self.logged_in_window {
            self.logged_in_window = true;
            warn!(
                "refused connection from {peer} on {at}: {}: {detail} (further refusals are \
                 summarized every {} s)",
                why.as_str(),
                REFUSAL_LOG_INTERVAL.as_secs()
            );
        } else {
            *self.counts.entry(why).or_default() += 1;
        }
    }

    /// Logs the summary of the interval if it is over.
    pub(super) fn tick(&mut self, at: SocketAddr, now: u64) {
        if now.saturating_sub(self.window_start) < REFUSAL_LOG_INTERVAL.as_nanos() as u64 {
            return;
        }
        self.flush(at, now);
    }

    pub(super) fn flush(&mut self, at: SocketAddr, now: u64) {
        let n: u64 = self.counts.values().sum();
        if n > 0 {
            let parts: Vec<String> = self
                .counts
                .iter()
                .map(|(k, v)| format!("{v} {}", k.as_str()))
                .collect();
            warn!(
                "refused {n} more connection(s) on {at} in the last {:.0} s: {} ({} refused since \
                 listen; only peers holding this listen comm's handle can connect)",
                now.saturating_sub(self.window_start) as f64 / 1e9,
                parts.join(", "),
                self.total
            );
        }
        self.counts.clear();
        self.window_start = now;
        self.logged_in_window = false;
    }
}

/// The refusal for a failed read or write on a pending handshake.
pub(super) fn refusal_of_io(e: &io::Error) -> Refusal {
    match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => Refusal::Closed,
        _ => Refusal::Socket,
    }
}
