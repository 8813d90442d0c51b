//! CPU time and run-queue wait of the calling thread, from Linux's
//! `/proc/thread-self/schedstat` (`on-cpu ns`, `run-queue wait ns`, `timeslices`).
//!
//! On a shared host the wall time of a measurement mixes the work with the time spent waiting
//! for a core; these two numbers separate them (`wall ≈ on-cpu + run-queue wait + sleep`).
//! Unavailable (no procfs, or a kernel without `CONFIG_SCHED_INFO`): `None` everywhere.

use std::fs;

/// A reading of the calling thread's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sched {
    /// Nanoseconds on a CPU.
    pub on_cpu_ns: u64,
    /// Nanoseconds runnable but waiting for a CPU.
    pub runq_ns: u64,
}

impl Sched {
    /// The calling thread's counters now.
    pub fn now() -> Option<Sched> {
        parse(&fs::read_to_string("/proc/thread-self/schedstat").ok()?)
    }

    /// `self - earlier`, saturating.
    pub fn since(self, earlier: Sched) -> Sched {
        Sched {
            on_cpu_ns: self.on_cpu_ns.saturating_sub(earlier.on_cpu_ns),
            runq_ns: self.runq_ns.saturating_sub(earlier.runq_ns),
        }
    }

    /// Component-wise sum.
    pub fn plus(self, other: Sched) -> Sched {
        Sched {
            on_cpu_ns: self.on_cpu_ns.saturating_add(other.on_cpu_ns),
            runq_ns: self.runq_ns.saturating_add(other.runq_ns),
        }
    }
}

/// Per-iteration CPU use of a measurement, summed over threads and ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuUse {
    /// Microseconds on a CPU per iteration.
    pub cpu_us: f64,
    /// Microseconds waiting for a CPU per iteration.
    pub runq_us: f64,
}

impl CpuUse {
    /// `used` spread over `iters` iterations.
    pub fn per_iter(used: Sched, iters: u32) -> CpuUse {
        let n = f64::from(iters.max(1));
        CpuUse {
            cpu_us: used.on_cpu_ns as f64 / 1e3 / n,
            runq_us: used.runq_ns as f64 / 1e3 / n,
        }
    }

    /// Component-wise sum.
    pub fn plus(self, other: CpuUse) -> CpuUse {
        CpuUse {
            cpu_us: self.cpu_us + other.cpu_us,
            runq_us: self.runq_us + other.runq_us,
        }
    }
}

/// Measures `f`'s CPU use on the calling thread.
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, Option<Sched>) {
    let before = Sched::now();
    let r = f();
    let used = match (before, Sched::now()) {
        (Some(b), Some(a)) => Some(a.since(b)),
        _ => None,
    };
    (r, used)
}

fn parse(text: &str) -> Option<Sched> {
    let mut it = text.split_whitespace().map(str::parse::<u64>);
    Some(Sched {
        on_cpu_ns: it.next()?.ok()?,
        runq_ns: it.next()?.ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_lines_parse() {
        assert_eq!(
            parse("123 456 7\n"),
            Some(Sched {
                on_cpu_ns: 123,
                runq_ns: 456
            })
        );
        assert_eq!(parse(""), None);
        assert_eq!(parse("x 1 2"), None);
        let a = Sched {
            on_cpu_ns: 10,
            runq_ns: 5,
        };
        let b = Sched {
            on_cpu_ns: 4,
            runq_ns: 9,
        };
        assert_eq!(
            a.since(b),
            Sched {
                on_cpu_ns: 6,
                runq_ns: 0
            }
        );
        assert_eq!(
            a.plus(b),
            Sched {
                on_cpu_ns: 14,
                runq_ns: 14
            }
        );
        let u = CpuUse::per_iter(a, 2);
        assert_eq!((u.cpu_us, u.runq_us), (0.005, 0.0025));
    }

    #[test]
    fn a_busy_loop_uses_cpu_time_where_available() {
        let (_, used) = measure(|| {
            let t = std::time::Instant::now();
            let mut x = 0u64;
            while t.elapsed() < std::time::Duration::from_millis(30) {
                x = x.wrapping_add(1);
                std::hint::black_box(x);
            }
        });
        if let Some(u) = used {
            // Not a timing assertion: only that the counter moves at all.
            assert!(u.on_cpu_ns > 0, "{u:?}");
        }
    }
}
