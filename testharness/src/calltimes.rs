//! Wall time spent inside the plugin's data-path calls (`--call-times`), by what the call
//! did: an `isend` or `irecv` that started a request or answered "retry later", a `test`
//! that reported its request done or still pending.
//!
//! Any plugin, no help from it: the harness reads a monotonic clock around each call
//! ([`crate::plugin::Net::set_call_timing`]). This is what tells a plugin's own cost per message
//! from the transport's: on soft-RoCE an `ibv_post_send` is a system call of about 20 µs, so
//! an `isend` costs that plus the plugin's own work, and a `test` that completes a request
//! costs whatever the plugin does on completion. The clock reads add about 50 ns per call
//! (two vDSO reads), which is why the timing is off unless asked for.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};

/// What a timed call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// `isend` that returned a request.
    IsendStarted,
    /// `isend` that returned NULL ("retry later").
    IsendRefused,
    /// `irecv` that returned a request.
    IrecvStarted,
    /// `irecv` that returned NULL ("retry later").
    IrecvRefused,
    /// `test` that reported the request done.
    TestDone,
    /// `test` that reported the request pending.
    TestPending,
}

impl CallKind {
    /// Every kind, in the order of [`CallTimes`]' fields and of the printed line.
    pub const ALL: [CallKind; 6] = [
        CallKind::IsendStarted,
        CallKind::IsendRefused,
        CallKind::IrecvStarted,
        CallKind::IrecvRefused,
        CallKind::TestDone,
        CallKind::TestPending,
    ];

    /// The name in the printed line and in `--json`.
    pub fn name(self) -> &'static str {
        match self {
            CallKind::IsendStarted => "isend",
            CallKind::IsendRefused => "isend_retry",
            CallKind::IrecvStarted => "irecv",
            CallKind::IrecvRefused => "irecv_retry",
            CallKind::TestDone => "test_done",
            CallKind::TestPending => "test_pending",
        }
    }

    /// The kind of an `isend` that returned a request (`started`) or NULL.
    pub fn isend(started: bool) -> CallKind {
        if started {
            CallKind::IsendStarted
        } else {
            CallKind::IsendRefused
        }
    }

    /// The kind of an `irecv` that returned a request (`started`) or NULL.
    pub fn irecv(started: bool) -> CallKind {
        if started {
            CallKind::IrecvStarted
        } else {
            CallKind::IrecvRefused
        }
    }

    /// The kind of a `test` that reported its request `done` or pending.
    pub fn test(done: bool) -> CallKind {
        if done {
            CallKind::TestDone
        } else {
            CallKind::TestPending
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Calls and their summed wall time, per [`CallKind`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CallTimes {
    calls: [u64; 6],
    nanos: [u64; 6],
}

impl CallTimes {
    /// Counts one call of `kind` that took `took`.
    pub fn add(&mut self, kind: CallKind, took: Duration) {
        let i = kind.index();
        self.calls[i] += 1;
        self.nanos[i] += u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
    }

    /// Calls of `kind`.
    pub fn calls(&self, kind: CallKind) -> u64 {
        self.calls[kind.index()]
    }

    /// Mean wall time of a call of `kind`, µs (0 without calls).
    pub fn mean_us(&self, kind: CallKind) -> f64 {
        let i = kind.index();
        if self.calls[i] == 0 {
            0.0
        } else {
            self.nanos[i] as f64 / self.calls[i] as f64 / 1e3
        }
    }

    /// Wall time inside the plugin, all kinds, µs.
    pub fn total_us(&self) -> f64 {
        self.nanos.iter().sum::<u64>() as f64 / 1e3
    }

    /// `{"iterations": n, "<kind>": {"per_iter": calls / n, "us": mean}, …, "plugin_us_per_iter"}`,
    /// the kinds with calls only.
    pub fn to_json(&self, iters: u64) -> Value {
        let n = iters.max(1) as f64;
        let mut v = json!({
            "iterations": iters,
            "plugin_us_per_iter": self.total_us() / n,
        });
        for k in CallKind::ALL {
            if self.calls(k) > 0 {
                v[k.name()] = json!({
                    "per_iter": self.calls(k) as f64 / n,
                    "us": self.mean_us(k),
                });
            }
        }
        v
    }

    /// One rank's line: calls per iteration × mean µs per call for each kind with calls, then
    /// the plugin's wall time per iteration, e.g. `isend 1.00 × 28.1 µs, irecv 1.00 × 28.3 µs,
    /// test_done 2.00 × 5.6 µs, test_pending 1.50 × 2.1 µs; in the plugin 73.5 µs per
    /// iteration`.
    pub fn line(&self, iters: u64) -> String {
        let n = iters.max(1) as f64;
        let mut out = String::new();
        for k in CallKind::ALL {
            if self.calls(k) == 0 {
                continue;
            }
            if !out.is_empty() {
                out.push_str(", ");
            }
            let _ = write!(
                out,
                "{} {:.2} × {:.1} µs",
                k.name(),
                self.calls(k) as f64 / n,
                self.mean_us(k)
            );
        }
        if out.is_empty() {
            out.push_str("no calls");
        }
        let _ = write!(
            out,
            "; in the plugin {:.1} µs per iteration",
            self.total_us() / n
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_add_up_per_kind_and_print_as_rates_per_iteration() {
        let mut t = CallTimes::default();
        for _ in 0..4 {
            t.add(CallKind::IsendStarted, Duration::from_micros(20));
            t.add(CallKind::TestDone, Duration::from_micros(5));
        }
        t.add(CallKind::TestPending, Duration::from_micros(2));
        t.add(CallKind::TestPending, Duration::from_micros(4));
        assert_eq!(t.calls(CallKind::IsendStarted), 4);
        assert_eq!(t.calls(CallKind::IrecvStarted), 0);
        assert!((t.mean_us(CallKind::TestPending) - 3.0).abs() < 1e-9);
        assert!((t.total_us() - 106.0).abs() < 1e-9);
        assert_eq!(
            t.line(4),
            "isend 1.00 × 20.0 µs, test_done 1.00 × 5.0 µs, test_pending 0.50 × 3.0 µs; \
             in the plugin 26.5 µs per iteration"
        );
        let v = t.to_json(4);
        assert!(
            v["irecv"].is_null(),
            "kinds without calls are left out: {v}"
        );
        assert_eq!(
            v,
            json!({
                "iterations": 4,
                "plugin_us_per_iter": 26.5,
                "isend": {"per_iter": 1.0, "us": 20.0},
                "test_done": {"per_iter": 1.0, "us": 5.0},
                "test_pending": {"per_iter": 0.5, "us": 3.0},
            })
        );
        assert_eq!(
            CallTimes::default().line(10),
            "no calls; in the plugin 0.0 µs per iteration"
        );
    }
}
