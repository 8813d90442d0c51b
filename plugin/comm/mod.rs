//! Send and receive comms: the driver between the protocol engine and a connection's
//! transport QPs.
//!
//! A comm owns its QPs (one, or `VERBSNET_IB_QPS_PER_CONNECTION` per device, spread over the
//! devices of a virtual device), its engine, and the plugin-owned registered buffers the
//! protocol needs (sender: eager-header and record staging, the CTS ring, the credit word;
//! receiver: its own bounce buffers, the shared pool's, the record ring, control staging).
//! Every entry makes progress before it answers "not yet": it polls the CQs, reads the CTS
//! ring and credit word, feeds the engine, and carries out the engine's actions. `test` always
//! does; `isend` and `irecv` skip it when the engine can start the request from what it knows
//! already and no peer check or watchdog turn is due (as NCCL IB's `isend` and `irecv` post
//! without polling), so a "retry later" always follows a poll, the peer is still asked about
//! once per `VERBSNET_PEER_CHECK_INTERVAL`, and a request the engine could start at once costs
//! no CQ poll (a speculative eager send, or one whose clear-to-send has not been read yet,
//! still polls first). Nothing blocks. A started request is an engine [`ReqId`]; what NCCL
//! holds a pointer to is the API layer's (`crate::api`).
//!
//! Data-path calls on one comm come from one NCCL progress thread; `regMr`/`deregMr` may come
//! from NCCL's service thread at the same time (ext-net README), so the mutable state sits
//! behind a mutex that is uncontended on the data path.
//!
//! By concern:
//! - this file: [`Comm`] (the typed entries: `isend`, `irecv`, `test`, `progress`, `close`)
//!   and the comm's error ([`Op`], [`Error`]);
//! - `mr.rs`: registered memory ([`Mr`]: NCCL's buffers and the plugin's own);
//! - `buffers.rs`: the comm's protocol buffers in the engine's layout, the handshake's
//!   [`PeerParams`], and how the engine reads them;
//! - [`pool`] (`pool.rs`): the shared bounce pool receive queues grow from;
//! - `side.rs`: what differs between the ends ([`SendSide`], [`RecvSide`], [`Role`]) and the
//!   comm's sink for the one action executor ([`crate::engine::Executor`]);
//! - `core.rs`: what both ends share: QP progress, the CQ feed, the peer checks, the sticky
//!   error, the counters;
//! - `watch.rs`: the hang watchdog, the periodic stats, the close record, the peer-check timer.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use tracing::warn;

pub use crate::error::{message, Class, Failure, Source};

mod buffers;
mod core;
mod mr;
pub mod pool;
mod side;
mod watch;

pub use self::buffers::PeerParams;
pub(crate) use self::buffers::{RecvBuffers, SendBuffers};
pub use self::mr::Mr;
pub use self::side::{RecvSide, Role, SendSide};

use self::core::Core;
use crate::config::Config;
use crate::engine::wire::MAX_RECVS;
use crate::engine::{
    RecvBuf, RecvEngine, RecvParams, ReqError, ReqId, SendEngine, SendParams, Sizes,
};
use crate::log::Label;
use crate::mem::Region;
use crate::transport::{Device, QueuePair};

/// Nanoseconds since the first call in this process (monotonic), at the resolution of the
/// kernel's tick (`CLOCK_MONOTONIC_COARSE`: 1–4 ms, `clock_gettime(2)`). Every plugin call
/// reads it (hang watchdog, peer checks, the receive queue's shrink timer, connect deadlines:
/// all in milliseconds to seconds), and the coarse clock is a plain read of the vDSO's data
/// page, where the precise one reads the TSC or, in a VM, the hypervisor's clock page
/// (docs/performance.md, "CPU per call and the comparison with NCCL IB"). Falls back to
/// [`Instant`] where the coarse clock is missing.
pub fn now_ns() -> u64 {
    static BASE: OnceLock<Option<u64>> = OnceLock::new();
    static BASE_INSTANT: OnceLock<Instant> = OnceLock::new();
    let coarse = || {
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
            .ok()
            .map(timespec_ns)
    };
    match BASE.get_or_init(coarse) {
        Some(base) => coarse().map_or(0, |t| t.saturating_sub(*base)),
        None => BASE_INSTANT.get_or_init(Instant::now).elapsed().as_nanos() as u64,
    }
}

/// Nanoseconds since the first call of this function in this process, on the precise
/// monotonic clock ([`Instant`], `CLOCK_MONOTONIC`): read only where a pause must be timed to
/// an RDMA READ's round trip (microseconds; [`now_ns`] moves in ticks of milliseconds): before
/// an `isend` that pulls its clear-to-send and knows no receive, and before a poll's
/// completions are fed while that READ is in flight ([`SendEngine::wants_clock`]).
pub fn fine_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// The coarse clock's resolution in nanoseconds (`clock_getres(2)` of
/// `CLOCK_MONOTONIC_COARSE`: the kernel's tick, 4 ms at `HZ=250`), or 0 where [`now_ns`] uses
/// [`Instant`].
pub fn clock_res_ns() -> u64 {
    static RES: OnceLock<u64> = OnceLock::new();
    *RES.get_or_init(|| {
        nix::time::clock_getres(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
            .ok()
            .map_or(0, timespec_ns)
    })
}

/// A `timespec` (of `clock_gettime` or `clock_getres`) in nanoseconds.
fn timespec_ns(t: nix::sys::time::TimeSpec) -> u64 {
    (t.tv_sec() as u64).saturating_mul(1_000_000_000) + t.tv_nsec() as u64
}

/// Whether more than `limit` nanoseconds have surely passed between two [`now_ns`] readings
/// `since` and `now`. Each reading may lag the true time by up to one tick
/// ([`clock_res_ns`]), so their difference can exceed the true interval by almost a tick: a
/// deadline checked this way fires up to a tick late, never early (a connect timeout of 1.5 s
/// never fails a connect after 1.497 s).
pub fn past(now: u64, since: u64, limit: u64) -> bool {
    now.saturating_sub(since) > limit.saturating_add(clock_res_ns())
}

/// The longest an orderly close waits for the peer to acknowledge sends whose requests
/// completed already ([`Comm::goodbye`]).
pub const CLOSE_DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

/// The comm operation that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `regMr`: registering NCCL's buffer.
    RegMr,
    /// Allocating or registering the comm's own protocol buffers.
    Buffers,
    /// `isend`.
    Isend,
    /// `irecv`.
    Irecv,
    /// `test`.
    Test,
    /// Progress inside any entry: polling, posting WRs, staging, eager copies.
    Progress,
    /// Checking what a comm will pin against verbsnet's cap and `RLIMIT_MEMLOCK`.
    Limits,
}

/// An error of a comm operation.
pub type Error = Failure<Op>;

impl Error {
    /// An engine error of `op` (its text is the engine's).
    pub fn req(op: Op, e: ReqError) -> Error {
        let class = match e {
            ReqError::Usage(_) => Class::Usage,
            ReqError::Remote(_) | ReqError::Protocol(_) => Class::Remote,
            ReqError::Local(_) => Class::System,
        };
        Failure::wrap(op, class, e)
    }
}

/// One end of a connection, typed by its [`Role`]: [`SendComm`] or [`RecvComm`].
///
/// Call order: `connect` makes a [`SendComm`] and `accept` a [`RecvComm`] (see
/// `crate::conn`); then any number of `isend` (send) or `irecv` (receive), each returning a
/// request id or "retry later", and `test` on each request until done (both ends); `progress`
/// may be called at any time; `close` last, after which no request of the comm may be used.
/// Each entry runs with the comm's [`Label`] entered (its `label` starts every log line of the
/// call) and makes progress (CQ poll, peer writes, the engine's actions, watchdog) unless it
/// is an `isend` or `irecv` the engine can start at once.
pub struct Comm<R: Role> {
    core: Mutex<Core<R>>,
    /// The devices its QPs run on: one, or a virtual device's physical ones (QP `q` on
    /// `devs[q % len]`); NCCL's buffers are registered on all of them.
    devs: Vec<Arc<dyn Device>>,
    label: String,
    /// `label`, as the log lines of the comm's calls start with it.
    log_label: Label,
    cfg: Config,
    /// The NCCL communicator (ncclNet v11+ `commId`) this comm belongs to, for the stats.
    comm_id: Option<u64>,
}

/// The sending end (from `connect`): `isend`, `test`.
pub type SendComm = Comm<SendSide>;
/// The receiving end (from `accept`): `irecv`, `iflush`, `test`.
pub type RecvComm = Comm<RecvSide>;

impl<R: Role> Comm<R> {
    /// Request slots of a comm of this end: the most requests in flight at once, and the range
    /// of [`ReqId::slot`].
    pub const MAX_REQUESTS: usize = <R as side::sealed::Side>::MAX_REQUESTS;

    fn with_side(
        devs: Vec<Arc<dyn Device>>,
        qps: Vec<Box<dyn QueuePair>>,
        side: R,
        label: String,
        cfg: &Config,
    ) -> Comm<R> {
        Comm {
            core: Mutex::new(Core::new(&devs[0], qps, side, cfg)),
            devs,
            log_label: Label::new(&label),
            label,
            cfg: cfg.clone(),
            comm_id: None,
        }
    }

    /// Tags the comm with its communicator (ncclNet v11+ `commId`): its label and its
    /// `VERBSNET_STATS_FILE` line (`"comm_id"`) carry it, so counters group by communicator.
    pub(crate) fn set_comm_id(&mut self, comm_id: Option<u64>) {
        if let Some(id) = comm_id {
            self.label = format!("{} [commId {id:#x}]", self.label);
            self.log_label.set(&self.label);
        }
        self.comm_id = comm_id;
    }

    /// The devices this comm runs on (for `regMr`: [`Mr::register_all`]): one, or the
    /// physical devices of a virtual one, device 0 first (QP 0's).
    pub fn devices(&self) -> &[Arc<dyn Device>] {
        &self.devs
    }

    /// A registration made through another comm (or another device) does not fit this one.
    fn check_keys(&self, op: Op, mr: &Mr) -> Result<(), Error> {
        if usize::from(mr.lkeys().len()) == self.devs.len() {
            return Ok(());
        }
        Err(Error::new(
            op,
            Class::InvalidArgument,
            format!(
                "a buffer registered on {} device(s) passed to a comm on {} (regMr it through \
                 the comm that uses it)",
                mr.lkeys().len(),
                self.devs.len()
            ),
        ))
    }

    /// The comm's label (`send comm <local> -> <peer> (<dev>)`, `recv comm … <- …`, with
    /// `[commId …]` when NCCL gave one).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The comm's state, for a call that may change it: forgets [`Core::quiet`].
    #[inline]
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Core<R>>, Error> {
        let mut g = self.lock_keeping_quiet()?;
        g.quiet = None;
        Ok(g)
    }

    /// The comm's state with [`Core::quiet`] as the last call left it (for `test` only).
    #[inline]
    fn lock_keeping_quiet(&self) -> Result<std::sync::MutexGuard<'_, Core<R>>, Error> {
        self.core.lock().map_err(|_| {
            Error::new(
                Op::Progress,
                Class::Internal,
                format!("{}: state poisoned by an earlier panic", self.label),
            )
        })
    }

    /// `test`: `Ok(Some(sizes))` when done (one size for a send, n for a grouped receive).
    pub fn test(&self, id: ReqId) -> Result<Option<Sizes>, Error> {
        let _label = self.log_label.enter();
        let mut g = self.lock_keeping_quiet()?;
        // The last call on this comm was a `test` of this request that found it pending and
        // nothing new: asking the engine again would give the same answer.
        let quiet = g.quiet.take() == Some(id);
        g.sticky_call(|g| {
            // A request an earlier call completed (its actions carried out) is reported
            // without polling again, as NCCL IB's `ncclIbTest` returns at once for a request
            // with no events left (`src/transport/net_ib/p2p.cc`): the next call polls.
            let asked = !g.side.has_actions();
            if asked && !quiet {
                match g.side.test(id) {
                    Ok(None) => {}
                    r => return r.map_err(|e| Error::req(Op::Test, e)),
                }
            }
            // A poll that fed nothing leaves the answer just given (most calls of a caller
            // spinning on `test`).
            let changed = g.progress(now_ns());
            if asked && matches!(changed, Ok(false)) {
                g.quiet = Some(id);
                return Ok(None);
            }
            let r = g.side.test(id);
            changed?;
            r.map_err(|e| Error::req(Op::Test, e))
        })
    }

    /// Makes progress without starting anything (polls the CQ, reads the CTS ring, posts what
    /// the engine queued). The plugin calls this inside every entry; tests use it to pump one
    /// side of a pair.
    pub fn progress(&self) -> Result<(), Error> {
        let _label = self.log_label.enter();
        let mut g = self.lock()?;
        g.sticky_call(|g| g.progress(now_ns()).map(|_| ()))
    }

    /// The error every call of this comm returns from now on, once a call returned a usage or
    /// remote error.
    pub fn sticky_error(&self) -> Option<Error> {
        self.lock().ok().and_then(|g| g.sticky().cloned())
    }

    /// The request whose next `test` may answer without asking the engine first (the last
    /// call on this comm was a `test` of it that found it pending and fed nothing; see
    /// `Core::quiet`). Reading it changes nothing: tests check that the mark is set where they
    /// rely on it.
    pub fn quiet(&self) -> Option<ReqId> {
        self.core.lock().ok().and_then(|g| g.quiet)
    }

    /// Requests in use (the pool returns to 0 when every request was tested to completion).
    pub fn in_flight(&self) -> usize {
        self.lock().map_or(0, |g| g.side.in_flight())
    }

    /// The comm's counters as `(name, value)` pairs: engine, QP, and device counters (`dev_*`,
    /// where the device has them: device-wide, as moved since this comm was created).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        self.lock().map_or_else(|_| Vec::new(), |g| g.counters())
    }

    /// Logs the counters (INFO) and appends them to `VERBSNET_STATS_FILE` if set: what
    /// [`Comm::close`] reports, for an owner that drops the comm itself.
    pub fn report_close(&self) {
        if let Ok(g) = self.core.lock() {
            g.report_close(&self.label, self.comm_id, &self.cfg);
        }
    }

    /// Tells the peer this is an orderly close, not a death ([`QueuePair::goodbye`]): a comm
    /// dropped without it, as in a process's death, says nothing.
    ///
    /// First it makes progress until the peer acknowledged every send whose request already
    /// completed (a send comm's inline sends, `VERBSNET_INLINE_SIZE`), for at most
    /// [`CLOSE_DRAIN`]: the transports drop what is not sent when the QP goes (tcp sends only
    /// what is staged before its goodbye; verbs leave posted WRs to the QP's destruction), and
    /// NCCL, which saw those sends complete, may close right after them. A comm that failed or
    /// whose peer closed does not wait; one whose peer does not acknowledge within the bound
    /// closes anyway (with a WARN that names what may not have arrived).
    pub fn goodbye(&self) {
        let start = Instant::now();
        loop {
            let Ok(mut g) = self.lock() else {
                return;
            };
            // A peer that closed (NCCL closes the two ends in no fixed order) or died takes
            // nothing more: no wait, and no WARN for the close of a peer that said goodbye.
            g.begin_close();
            if g.peer_closed() || !g.side.close_pending() {
                break;
            }
            if start.elapsed() > CLOSE_DRAIN {
                warn!(
                    "{}: closing with sends the peer has not acknowledged within {:?} (their \
                     requests completed at the post, VERBSNET_INLINE_SIZE): the peer may not \
                     have received them",
                    self.label, CLOSE_DRAIN
                );
                break;
            }
            if g.progress(now_ns()).is_err() {
                break;
            }
            drop(g);
            std::thread::yield_now();
        }
        if let Ok(mut g) = self.lock() {
            g.goodbye();
        }
    }

    /// `close`: [`Comm::goodbye`], [`Comm::report_close`], then the QP and the buffers go (the
    /// QP first: after it nothing writes into any buffer).
    pub fn close(self) {
        self.goodbye();
        self.report_close();
    }
}

impl SendComm {
    /// A send comm over the established QPs of one connection (QP 0 first, at least one, at
    /// most `engine::MAX_QPS_PER_CONNECTION`), splitting data over them when `split`.
    pub(crate) fn new(
        devs: Vec<Arc<dyn Device>>,
        qps: Vec<Box<dyn QueuePair>>,
        split: bool,
        bufs: SendBuffers,
        peer: &PeerParams,
        cfg: &Config,
        label: String,
    ) -> SendComm {
        let engine = SendEngine::new(SendParams {
            qps: u8::try_from(qps.len()).unwrap_or(u8::MAX),
            split,
            eager_limit: u64::from(cfg.eager_limit).min(peer.eager_buf_size),
            // What QP 0 granted of `VERBSNET_INLINE_SIZE` (`conn::qp_config`).
            inline_max: u64::from(qps[0].max_inline_data()),
            credits: cfg.credits,
            initial_credits: peer.initial_credits,
            hdr_stage: bufs.hdr.at(),
            rec_stage: bufs.rec.at(),
            peer_rec_ring: peer.rec_ring,
            cts_ring: bufs.cts_ring.at().0,
            credit_word: bufs.credit_word.at().0,
            landing: bufs.landing.at(),
            cts_pull: cfg.cts_pull,
            first_seq: peer.first_seq,
            first_gen: cfg.test_first_gen,
            rkeys: peer.rkeys.max(1),
        });
        Comm::with_side(devs, qps, SendSide::new(engine, bufs), label, cfg)
    }

    /// `isend` of `size` bytes at `data` (inside `mr`) with `tag`: `Ok(None)` = retry later.
    pub fn isend(&self, data: u64, size: u64, tag: i32, mr: &Mr) -> Result<Option<ReqId>, Error> {
        let _label = self.log_label.enter();
        mr.check_within(Op::Isend, data, size)?;
        self.check_keys(Op::Isend, mr)?;
        let mut g = self.lock()?;
        g.sticky_call(|g| {
            let now = now_ns();
            let startable = g.side.can_start(tag);
            g.progress_unless_startable(now, startable)?;
            side::sealed::Side::clock_if_wanted(&mut g.side, fine_ns);
            let r = g.side.isend(now, data, mr.lkeys(), size, tag);
            let id = g.after_engine_call(r, Op::Isend)?;
            g.execute()?;
            Ok(id)
        })
    }
}

impl RecvComm {
    /// Creates the receive engine of a connection of `qps` QPs (the sender's count, and its
    /// `split`) and posts its initial receive WRs on `qp` (QP 0; before the QP can receive
    /// anything: the data QPs get their zero-length receive WRs in `irecv`). Returns the
    /// engine; [`RecvComm::announce`] then says what to tell the sender.
    pub(crate) fn prepare(
        qp: &mut dyn QueuePair,
        (qps, split, devs): (u8, bool, u8),
        bufs: &RecvBuffers,
        peer: &PeerParams,
        cfg: &Config,
    ) -> Result<RecvEngine, Error> {
        let mut engine = RecvEngine::new(RecvParams {
            qps,
            split,
            rq_depth: cfg.rq_depth,
            rq_min: buffers::rq_min(cfg),
            shrink_after_ns: cfg
                .rq_shrink_after
                .map_or(u64::MAX, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64),
            rq_batch: cfg.rq_batch,
            rq_low_water: cfg.rq_low_water,
            eager_buf_size: u64::from(cfg.eager_buf_size),
            bounce: bufs.bounce.at(),
            rec_ring: bufs.rec_ring.region.addr(),
            ctrl_stage: bufs.ctrl.at(),
            peer_cts_ring: peer.cts_ring,
            peer_credit_word: peer.credit_word,
            // What QP 0 granted (`conn::listen` asks for one compact CTS entry).
            inline_max: u64::from(qp.max_inline_data()),
            credits: peer.credits,
            first_seq: peer.first_seq,
            rkeys: devs,
        });
        side::post_initial(qp, &mut engine)?;
        Ok(engine)
    }

    /// What the sender needs to know about a receiver's buffers.
    pub(crate) fn announce(bufs: &RecvBuffers, engine: &RecvEngine, cfg: &Config) -> PeerParams {
        PeerParams {
            rec_ring: bufs.rec_ring.remote(),
            initial_credits: engine.granted(),
            eager_buf_size: u64::from(cfg.eager_buf_size),
            ..PeerParams::default()
        }
    }

    /// A receive comm over the established QPs of one connection (QP 0 first).
    pub(crate) fn new(
        devs: Vec<Arc<dyn Device>>,
        qps: Vec<Box<dyn QueuePair>>,
        bufs: RecvBuffers,
        engine: RecvEngine,
        cfg: &Config,
        label: String,
    ) -> RecvComm {
        Comm::with_side(devs, qps, RecvSide::new(engine, bufs), label, cfg)
    }

    /// `irecv` of `(addr, capacity, tag, registration)` buffers: `Ok(None)` = retry later.
    pub fn irecv<M: AsRef<Mr>>(
        &self,
        bufs: &[(u64, u64, i32, &M)],
    ) -> Result<Option<ReqId>, Error> {
        let _label = self.log_label.enter();
        if bufs.is_empty() || bufs.len() > MAX_RECVS {
            return Err(Error::new(
                Op::Irecv,
                Class::InvalidArgument,
                format!("irecv of {} buffers; maxRecvs is {MAX_RECVS}", bufs.len()),
            ));
        }
        // A receive of one buffer (NCCL's point-to-point receives) builds arrays of one.
        if bufs.len() == 1 {
            self.irecv_in::<1, M>(bufs)
        } else {
            self.irecv_in::<MAX_RECVS, M>(bufs)
        }
    }

    /// [`Comm::irecv`] of `bufs` (1..=`N` buffers) with arrays of `N` on the stack, filled up
    /// to `bufs.len()` (the rest is never read).
    #[inline]
    fn irecv_in<const N: usize, M: AsRef<Mr>>(
        &self,
        bufs: &[(u64, u64, i32, &M)],
    ) -> Result<Option<ReqId>, Error> {
        let mut regions: [Option<Region>; N] = std::array::from_fn(|_| None);
        let mut rb = [RecvBuf::default(); N];
        for (i, &(addr, cap, tag, mr)) in bufs.iter().enumerate() {
            let mr = mr.as_ref();
            regions[i] = Some(mr.sub(Op::Irecv, addr, cap)?);
            self.check_keys(Op::Irecv, mr)?;
            rb[i] = RecvBuf {
                addr,
                cap,
                rkeys: mr.rkeys(),
                tag,
            };
        }
        let rb = &rb[..bufs.len()];
        let mut g = self.lock()?;
        g.sticky_call(|g| {
            let now = now_ns();
            let startable = g.side.can_start();
            g.progress_unless_startable(now, startable)?;
            let r = g.side.irecv(now, rb, &regions[..rb.len()]);
            let id = g.after_engine_call(r, Op::Irecv)?;
            g.execute()?;
            Ok(id)
        })
    }

    /// `iflush` of received buffers: host memory needs no flush (the data is visible to the
    /// CPU once the receive completed), so this is always done at once (`Ok(None)`: NCCL's
    /// "no request, complete", ext-net README).
    pub fn iflush(&self) -> Result<Option<ReqId>, Error> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::TransportError;

    /// Stand-ins for the ops of the layers above (conn, api).
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Above {
        Conn,
        Api,
    }

    #[test]
    fn a_deadline_in_coarse_ticks_fires_a_tick_late_never_early() {
        let res = clock_res_ns();
        // Linux reports the coarse clock's resolution as its tick (1 to 10 ms).
        assert!(res > 0 && res <= 10_000_000, "{res}");
        let (since, limit) = (5_000_000_000, 1_500_000_000);
        assert!(!past(since + limit, since, limit));
        assert!(!past(since + limit + res, since, limit));
        assert!(past(since + limit + res + 1, since, limit));
        assert!(
            !past(0, since, limit),
            "a reading before `since` is not past"
        );
    }

    fn enomem() -> TransportError {
        TransportError::Io {
            op: "ibv_reg_mr".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOMEM),
        }
    }

    #[test]
    fn a_failure_keeps_its_cause_as_source_and_reports_the_chain_then_the_fix() {
        let e = Error::new(
            Op::RegMr,
            Class::System,
            "registering 64 bytes at 0x1000 failed",
        )
        .fix("; raise RLIMIT_MEMLOCK")
        .because(enomem());
        assert_eq!(e.to_string(), "registering 64 bytes at 0x1000 failed");
        let src = std::error::Error::source(&e).expect("the transport error");
        assert!(src.downcast_ref::<TransportError>().is_some());
        let os = std::io::Error::from_raw_os_error(libc::ENOMEM);
        assert_eq!(
            e.report(),
            format!(
                "registering 64 bytes at 0x1000 failed: ibv_reg_mr: {os}; raise RLIMIT_MEMLOCK"
            )
        );
        assert_eq!((e.op(), e.class()), (Op::RegMr, Class::System));
    }

    #[test]
    fn a_wrapper_is_transparent_and_a_lifted_failure_keeps_class_fix_and_text() {
        let e = Error::req(Op::Isend, ReqError::Usage("send of 9 bytes into 4".into()));
        assert_eq!(e.class(), Class::Usage);
        assert_eq!(e.to_string(), "invalid usage: send of 9 bytes into 4");
        assert!(
            std::error::Error::source(&e).is_none(),
            "its text is the cause's"
        );
        let low = Error::new(Op::Buffers, Class::System, "a 64-byte protocol buffer")
            .because_source(message("out of memory"))
            .fix(" (lower VERBSNET_RQ_DEPTH)");
        let up = low.clone().lift(Above::Conn);
        assert_eq!(up.class(), Class::System);
        assert_eq!(up.op(), Above::Conn);
        assert_eq!(up.to_string(), low.to_string());
        assert_eq!(up.report(), low.report());
        assert_eq!(
            up.report(),
            "a 64-byte protocol buffer: out of memory (lower VERBSNET_RQ_DEPTH)"
        );
        let top = up.lift(Above::Api);
        assert_eq!(top.report(), low.report());
        assert_eq!(top.class(), Class::System);
    }
}
