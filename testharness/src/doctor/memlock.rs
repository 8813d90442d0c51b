//! Pinned memory: what the plugin and NCCL register, against `RLIMIT_MEMLOCK`.

#[allow(unused_imports)]
use super::*;

/// NCCL's default `NCCL_BUFFSIZE` (4 MiB): the SIMPLE-protocol buffer of each connection, which
/// NCCL registers through the plugin's `regMr` (so it is pinned too on ib).
pub const NCCL_DEFAULT_BUFFSIZE: u64 = 4 << 20;

/// `CAP_IPC_LOCK`'s bit in `/proc/self/status` `CapEff` (linux/capability.h).
pub(super) const CAP_IPC_LOCK_BIT: u32 = 14;

/// Page size the plugin rounds its registered buffers up to (`mem::Region::alloc`).
pub(super) const PAGE: u64 = 4096;

/// Bytes the plugin pins for one send comm and one receive comm under `cfg`: its protocol
/// buffers (plugin/comm.rs `SendBuffers::alloc`, `RecvBuffers::alloc`), each rounded up to
/// whole pages as `Region::alloc` allocates them.
pub fn pinned_bytes(cfg: &Config) -> (u64, u64) {
    let pages = |b: usize| (b as u64).div_ceil(PAGE) * PAGE;
    let a64 = |b: usize| b.next_multiple_of(64);
    // Each comm registers its own buffers as one region (comm.rs `Owned::alloc_parts`).
    let send = pages(
        a64(MAX_SEND_REQUESTS * EAGER_HDR_LEN)
            + a64(MAX_SEND_REQUESTS * 8)
            + a64(CTS_RING_ENTRIES * CTS_ENTRY_LEN)
            + 8,
    );
    let stride = EAGER_HDR_LEN + cfg.eager_buf_size as usize;
    let min = cfg.rq_min_depth.clamp(1, cfg.rq_depth) as usize;
    // The receive comm's own buffers and rings, plus what it may grow by from the pool at
    // full depth (memlock must cover a busy comm too).
    let recv = pages(a64(min * stride) + a64(REC_REGION_LEN) + CTRL_STAGE_SLOTS * CTS_ENTRY_LEN)
        + pages((cfg.rq_depth as usize - min) * stride);
    (send, recv)
}

/// `NCCL_BUFFSIZE` as NCCL reads it (bytes), else its default.
pub fn nccl_buffsize(v: Option<&str>) -> u64 {
    v.and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(NCCL_DEFAULT_BUFFSIZE)
}

/// RLIMIT_MEMLOCK and CAP_IPC_LOCK of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memlock {
    /// Soft limit in bytes; `None` = unlimited.
    pub soft: Option<u64>,
    /// Hard limit in bytes; `None` = unlimited.
    pub hard: Option<u64>,
    /// `CAP_IPC_LOCK` in the effective set: the limit does not apply.
    pub cap_ipc_lock: bool,
}

/// Reads the limit (`getrlimit`) and the capability (`/proc/self/status`).
pub fn read_memlock() -> Option<Memlock> {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    let (soft, hard) = getrlimit(Resource::RLIMIT_MEMLOCK).ok()?;
    let lim = |v: u64| (v != RLIM_INFINITY).then_some(v);
    let cap = fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        })
        .is_some_and(|bits| bits & (1 << CAP_IPC_LOCK_BIT) != 0);
    Some(Memlock {
        soft: lim(soft),
        hard: lim(hard),
        cap_ipc_lock: cap,
    })
}

pub(super) fn mib(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / f64::from(1 << 20))
    } else {
        format!("{} KiB", b.div_ceil(1024))
    }
}

/// The memlock verdict: the pinned bytes `comms` connections need (each a send and a receive
/// comm of the plugin plus NCCL's `buffsize` buffer for each) against the limit. Over the
/// limit is `fail` on ib (`ibv_reg_mr` fails with ENOMEM at connect time) and `warn` on tcp
/// (which pins nothing, but the same job over RDMA would fail).
pub fn memlock_check(
    cfg: &Config,
    comms: u64,
    buffsize: u64,
    m: Option<Memlock>,
    uses_ib: bool,
) -> Check {
    let (send, recv) = pinned_bytes(cfg);
    let per = send + recv + 2 * buffsize;
    let need = per.saturating_mul(comms.max(1));
    let detail = format!(
        "{comms} connection(s) x ({} send comm + {} recv comm [rq_depth {} x (eager_buf_size {} \
         + {EAGER_HDR_LEN})] + 2 x {} NCCL buffer) = {}",
        mib(send),
        mib(recv),
        cfg.rq_depth,
        cfg.eager_buf_size,
        mib(buffsize),
        mib(need)
    );
    let expect = format!("RLIMIT_MEMLOCK >= {} or CAP_IPC_LOCK", mib(need));
    let fix = "raise the limit: `ulimit -l unlimited` (shell, as root or within the hard limit), \
               LimitMEMLOCK=infinity (systemd unit), `* - memlock unlimited` in \
               /etc/security/limits.conf, `docker run --ulimit memlock=-1`; or lower \
               VERBSNET_RQ_DEPTH / VERBSNET_EAGER_BUF_SIZE";
    let Some(m) = m else {
        return Check::new(
            "memlock",
            Verdict::Warn,
            format!("getrlimit failed; need {detail}"),
        )
        .expect(expect);
    };
    let show = |v: Option<u64>| v.map_or("unlimited".into(), mib);
    let limit = format!(
        "RLIMIT_MEMLOCK {} (hard {}), CAP_IPC_LOCK {}",
        show(m.soft),
        show(m.hard),
        if m.cap_ipc_lock { "yes" } else { "no" }
    );
    if m.cap_ipc_lock || m.soft.is_none_or(|s| s >= need) {
        let why = if m.cap_ipc_lock {
            ": CAP_IPC_LOCK lifts the limit"
        } else {
            ""
        };
        return Check::new(
            "memlock",
            Verdict::Ok,
            format!("{limit}{why}; need {detail}"),
        )
        .expect(expect);
    }
    if uses_ib {
        Check::new(
            "memlock",
            Verdict::Fail,
            format!("{limit}; need {detail}: ibv_reg_mr will fail with ENOMEM (Cannot allocate memory) at connect"),
        )
        .expect(expect)
        .fix(fix)
    } else {
        Check::new(
            "memlock",
            Verdict::Warn,
            format!("{limit}; need {detail}: tcp pins nothing, but the same job over RDMA would fail at connect"),
        )
        .expect(expect)
        .fix(fix)
    }
}
