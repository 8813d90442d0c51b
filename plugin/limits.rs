//! Resource limits checked before anything is allocated or pinned, so that a configuration the
//! host cannot back fails with an error naming the knobs, the product, the limit and the fix,
//! never with an abort (`memory allocation of ... failed`) or a bare `ibv_reg_mr: Cannot
//! allocate memory` in the middle of `accept`.
//!
//! What one comm registers (and, on verbs, pins), from the engine's buffer layout
//! ([`crate::engine::wire::recv_comm_buffers`], [`crate::engine::wire::SEND_COMM_BUFFERS`]):
//! - receive comm: `VERBSNET_RQ_DEPTH × (32 + VERBSNET_EAGER_BUF_SIZE)` bytes of bounce
//!   buffers (32 = `EAGER_HDR_LEN`, the eager header), plus the record ring and control
//!   staging (a few KiB), each rounded up to pages;
//! - send comm: eager-header and record staging, the CTS ring and the credit word (a few KiB).
//!
//! Checks: every comm against [`MAX_COMM_BYTES`] (any transport; the memory is allocated on
//! tcp too), and on verbs against `RLIMIT_MEMLOCK` when the process lacks `CAP_IPC_LOCK`
//! (without it the kernel refuses to pin past the limit).

use crate::config::Config;
use crate::engine::wire::EAGER_HDR_LEN;
use crate::engine::wire::{recv_comm_buffers, SEND_COMM_BUFFERS};
use crate::error::{Class, Failure};
use crate::transport::Kind;

/// The check that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// One comm's footprint against [`MAX_COMM_BYTES`].
    Cap,
    /// One comm's footprint against `RLIMIT_MEMLOCK` (verbs, without `CAP_IPC_LOCK`).
    Memlock,
}

/// A failed limit check; comms and `init` lift it into their own errors.
pub type Error = Failure<Check>;

/// Largest number of bytes one comm may register: 1 GiB. NCCL opens one receive comm per
/// channel per peer, so even this is a lot of pinned memory per process; the defaults use
/// about 1 MiB, depth 1024 with 8 KiB buffers about 8 MiB.
pub const MAX_COMM_BYTES: u64 = 1 << 30;

/// Bytes one receive comm and one send comm register with `cfg`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// One receive comm (bounce buffers, record ring, control staging).
    pub recv: u64,
    /// Of which the bounce buffers (`rq_depth × (EAGER_HDR_LEN + eager_buf_size)`, with
    /// `EAGER_HDR_LEN` = 32, page-rounded).
    pub bounce: u64,
    /// One send comm.
    pub send: u64,
}

fn pages(n: u64) -> u64 {
    n.max(1).div_ceil(4096) * 4096
}

/// What one comm of each side registers under `cfg`.
pub fn footprint(cfg: &Config) -> Footprint {
    let r = recv_comm_buffers(cfg.rq_depth, cfg.eager_buf_size, 1);
    let bounce = pages(r[0]);
    Footprint {
        recv: bounce + r[1..].iter().map(|&n| pages(n)).sum::<u64>(),
        bounce,
        send: SEND_COMM_BUFFERS.iter().map(|&n| pages(n as u64)).sum(),
    }
}

fn mib(n: u64) -> String {
    if n >= 1 << 30 {
        format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    }
}

/// One receive comm's footprint against [`MAX_COMM_BYTES`].
///
/// # Errors
/// `Usage` naming `VERBSNET_RQ_DEPTH`, `VERBSNET_EAGER_BUF_SIZE`, their product and the cap.
pub fn check_cap(cfg: &Config) -> Result<Footprint, Error> {
    let f = footprint(cfg);
    if f.recv > MAX_COMM_BYTES {
        return Err(Error::new(Check::Cap, Class::Usage, format!(
            "VERBSNET_RQ_DEPTH={} x (VERBSNET_EAGER_BUF_SIZE={} + {EAGER_HDR_LEN}) = {} bytes ({}) \
             of bounce buffers per receive comm, {} bytes in all, is over verbsnet's cap of {} bytes ({}) \
             per comm: lower VERBSNET_RQ_DEPTH or VERBSNET_EAGER_BUF_SIZE (NCCL opens one receive \
             comm per channel per peer; see docs/configuration.md, Receive queue)",
            cfg.rq_depth,
            cfg.eager_buf_size,
            f.bounce,
            mib(f.bounce),
            f.recv,
            MAX_COMM_BYTES,
            mib(MAX_COMM_BYTES)
        )));
    }
    Ok(f)
}

/// The soft `RLIMIT_MEMLOCK` in bytes; `None` when unlimited or unreadable.
pub fn memlock_limit() -> Option<u64> {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    match getrlimit(Resource::RLIMIT_MEMLOCK) {
        Ok((soft, _)) if soft != RLIM_INFINITY => Some(soft),
        _ => None,
    }
}

/// True when the process holds `CAP_IPC_LOCK` in its effective set (pinning is then not
/// limited by `RLIMIT_MEMLOCK`). Read from `/proc/self/status` (`CapEff`, bit 14).
pub fn has_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// The fix for a low memlock limit, for error messages.
pub const MEMLOCK_FIX: &str = "raise the limit (`ulimit -l unlimited`; systemd \
    LimitMEMLOCK=infinity; `memlock` in /etc/security/limits.conf; docker --ulimit memlock=-1) \
    or lower VERBSNET_RQ_DEPTH / VERBSNET_EAGER_BUF_SIZE";

/// `init`'s check: the cap on any transport, and on verbs `RLIMIT_MEMLOCK` (without
/// `CAP_IPC_LOCK`) against the larger of one receive and one send comm, the least any
/// connection needs (NCCL opens several comms: the limit must cover all of them).
///
/// # Errors
/// `Usage` over the cap (see [`check_cap`]); `System` over `RLIMIT_MEMLOCK`, naming the knobs,
/// the bytes, the limit and [`MEMLOCK_FIX`].
pub fn check(cfg: &Config, kind: Kind) -> Result<(), Error> {
    let f = check_cap(cfg)?;
    if kind != Kind::Ib || has_ipc_lock() {
        return Ok(());
    }
    check_memlock(cfg, f, memlock_limit())
}

fn check_memlock(cfg: &Config, f: Footprint, limit: Option<u64>) -> Result<(), Error> {
    let Some(limit) = limit else {
        return Ok(());
    };
    // The larger side names itself: a receive comm (bounce buffers) at every sane setting.
    let (need, side) = if f.recv >= f.send {
        (f.recv, "receive")
    } else {
        (f.send, "send")
    };
    if need > limit {
        return Err(Error::new(
            Check::Memlock,
            Class::System,
            format!(
                "one {side} comm pins {need} bytes ({}; a receive comm: VERBSNET_RQ_DEPTH={} x \
             (VERBSNET_EAGER_BUF_SIZE={} + {EAGER_HDR_LEN}) of bounce buffers plus rings) but \
             RLIMIT_MEMLOCK is {limit} bytes (`ulimit -l` {}) and the process lacks CAP_IPC_LOCK: \
             {MEMLOCK_FIX}",
                mib(need),
                cfg.rq_depth,
                cfg.eager_buf_size,
                limit / 1024
            ),
        ));
    }
    Ok(())
}

/// A hint to append to a registration that failed with `ENOMEM`: names `RLIMIT_MEMLOCK`.
pub fn enomem_hint(bytes: usize) -> String {
    let limit = memlock_limit().map_or("unlimited".to_string(), |l| {
        format!("{l} bytes (`ulimit -l` {})", l / 1024)
    });
    format!(
        "; pinning {bytes} more bytes failed: RLIMIT_MEMLOCK is {limit}{}: {MEMLOCK_FIX}",
        if has_ipc_lock() {
            " (the process has CAP_IPC_LOCK: the device or the host is out of memory)"
        } else {
            " and the process lacks CAP_IPC_LOCK"
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn footprint_follows_the_knobs() {
        let d = footprint(&Config::default());
        assert_eq!(d.bounce, pages(128 * (8192 + EAGER_HDR_LEN as u64)));
        assert!(d.recv > d.bounce && d.recv < d.bounce + (64 << 10), "{d:?}");
        assert!(d.send < 1 << 20, "{d:?}");
        let big = Config {
            rq_depth: 32768,
            eager_buf_size: 1 << 20,
            ..Config::default()
        };
        assert_eq!(
            footprint(&big).bounce,
            32768 * ((1 << 20) + EAGER_HDR_LEN as u64)
        );
    }

    #[test]
    fn over_the_cap_names_the_knobs_and_the_product() {
        assert!(check_cap(&Config::default()).is_ok());
        let big = Config {
            rq_depth: 32768,
            eager_buf_size: 1 << 20,
            ..Config::default()
        };
        let e = check_cap(&big).unwrap_err().to_string();
        for part in [
            "VERBSNET_RQ_DEPTH=32768",
            "VERBSNET_EAGER_BUF_SIZE=1048576",
            &format!("{} bytes", 32768 * ((1u64 << 20) + EAGER_HDR_LEN as u64)),
            "1073741824",
        ] {
            assert!(e.contains(part), "{part}: {e}");
        }
        // 1024 x 1 MiB is exactly over; 1000 x 1 MiB fits.
        let edge = Config {
            rq_depth: 1000,
            ..big.clone()
        };
        assert!(check_cap(&edge).is_ok());
    }

    #[test]
    fn over_memlock_names_the_limit_and_the_fix() {
        let cfg = Config::default();
        let f = footprint(&cfg);
        assert!(check_memlock(&cfg, f, None).is_ok());
        assert!(check_memlock(&cfg, f, Some(f.recv)).is_ok());
        let e = check_memlock(&cfg, f, Some(64 << 10)).unwrap_err();
        assert_eq!(e.class(), Class::System, "{e:?}");
        let m = e.to_string();
        for part in [
            "one receive comm pins",
            "RLIMIT_MEMLOCK is 65536 bytes",
            "ulimit -l` 64",
            "CAP_IPC_LOCK",
            "VERBSNET_RQ_DEPTH=128",
            "ulimit -l unlimited",
        ] {
            assert!(m.contains(part), "{part}: {m}");
        }
    }
}
