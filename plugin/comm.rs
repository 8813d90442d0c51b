//! Send and receive comms: the driver between the protocol engine and a transport QP.
//!
//! A comm owns one QP, its engine, and the plugin-owned registered buffers the protocol needs
//! (sender: eager-header and record staging, the CTS ring, the credit word; receiver: the
//! bounce pool, the record ring, control staging). Every entry (`isend`, `irecv`, `test`)
//! first makes progress: it polls the CQ, reads the CTS ring and credit word, feeds the engine,
//! and carries out the engine's actions. Nothing blocks.
//!
//! Data-path calls on one comm come from one NCCL progress thread; `regMr`/`deregMr` may come
//! from NCCL's service thread at the same time (ext-net README), so the mutable state sits
//! behind a mutex that is uncontended on the data path.

use std::io::Write;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use tracing::{info, warn};

pub use crate::error::{message, Class, Failure, Source};

pub mod pool;

use self::pool::BouncePool;
use crate::config::Config;
use crate::engine::wire::MAX_RECVS;
use crate::engine::MemRead;
use crate::engine::{
    Action, RecvBuf, RecvEngine, RecvParams, ReqError, ReqId, SendEngine, SendParams, Stall, Stats,
    MAX_RECV_REQUESTS, MAX_SEND_REQUESTS,
};
use crate::mem::Region;
use crate::transport::{Device, DeviceRnrCounters, MemoryRegion, MrKeys, QueuePair, Wc, WcStatus};

/// Nanoseconds since the first call in this process (monotonic).
pub fn now_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

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

/// The error of a comm whose peer went without closing its comm.
const PEER_CLOSED: &str = "the peer closed the connection (its process exited or died)";

/// How the peer of `qp`, the other end of a comm of kind `mine` ("send" or "recv"), went: an
/// orderly close (its `closeSend`/`closeRecv`: the transport saw its goodbye), or the
/// transport's reason for a death when it knows more, else "closed".
fn peer_gone(qp: &dyn QueuePair, mine: &str) -> String {
    if qp.peer_closed_orderly() {
        let theirs = if mine == "send" { "receive" } else { "send" };
        format!(
            "the peer closed its {theirs} comm (an orderly close, not a failure of the peer): \
             this comm can carry nothing more; close it"
        )
    } else {
        qp.peer_gone_reason().unwrap_or(PEER_CLOSED).to_string()
    }
}

/// Most CQ polls (of up to 64 completions each) that drain the CQ before a peer's close is
/// reported.
const MAX_DRAIN_POLLS: usize = 1024;

/// A memory registration handed to NCCL as `mhandle`.
pub struct MrHandle {
    region: Region,
    keys: MrKeys,
    _mr: Arc<dyn MemoryRegion>,
}

/// Start addresses of the `MrHandle`s alive now (unit tests check that close frees them).
#[cfg(test)]
pub(crate) static LIVE_MR_ADDRS: Mutex<Vec<u64>> = Mutex::new(Vec::new());

#[cfg(test)]
impl Drop for MrHandle {
    fn drop(&mut self) {
        let mut v = LIVE_MR_ADDRS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = v.iter().position(|&a| a == self.region.addr()) {
            v.swap_remove(i);
        }
    }
}

impl MrHandle {
    /// Registers `region` on `dev`.
    pub fn register(dev: &dyn Device, region: Region) -> Result<MrHandle, Error> {
        let mr = dev.reg_mr(region.clone()).map_err(|e| {
            let msg = format!(
                "registering {} bytes at {:#x} failed",
                region.len(),
                region.addr()
            );
            Error::new(Op::RegMr, Class::System, msg)
                .fix(enomem_hint(&e, region.len()))
                .because(e)
        })?;
        #[cfg(test)]
        LIVE_MR_ADDRS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(region.addr());
        Ok(MrHandle {
            keys: mr.keys(),
            region,
            _mr: mr,
        })
    }

    /// The registered range containing `[addr, addr+len)` as a sub-region, or an error naming
    /// the ranges.
    fn sub(&self, op: Op, addr: u64, len: u64) -> Result<Region, Error> {
        if !self.region.contains(addr, len) {
            return Err(Error::new(
                op,
                Class::InvalidArgument,
                format!(
                    "buffer {addr:#x}+{len} is not inside its memory registration {:#x}+{} \
                     (regMr the whole buffer first)",
                    self.region.addr(),
                    self.region.len()
                ),
            ));
        }
        self.region
            .slice((addr - self.region.addr()) as usize, len as usize)
            .map_err(|e| Error::wrap(op, Class::InvalidArgument, e))
    }
}

/// A plugin-owned registered buffer.
pub(crate) struct Owned {
    pub(crate) region: Region,
    pub(crate) keys: MrKeys,
    _mr: Arc<dyn MemoryRegion>,
}

impl Owned {
    pub(crate) fn alloc(dev: &dyn Device, len: usize) -> Result<Owned, Error> {
        let region = Region::try_alloc(len).map_err(|e| {
            Error::new(
                Op::Buffers,
                Class::System,
                format!("a {len}-byte protocol buffer"),
            )
            .because_source(message(e))
            .fix(" (lower VERBSNET_RQ_DEPTH or VERBSNET_EAGER_BUF_SIZE)")
        })?;
        let mr = dev.reg_mr(region.clone()).map_err(|e| {
            Error::new(
                Op::Buffers,
                Class::System,
                format!("registering a {len}-byte protocol buffer failed"),
            )
            .fix(enomem_hint(&e, len))
            .because(e)
        })?;
        Ok(Owned {
            keys: mr.keys(),
            region,
            _mr: mr,
        })
    }

    /// One registration cut into consecutive parts of `sizes` bytes (each part starts on a
    /// 64-byte boundary): a comm's small buffers then pin whole pages once, not once each.
    pub(crate) fn alloc_parts<const N: usize>(
        dev: &dyn Device,
        sizes: [usize; N],
    ) -> Result<[Owned; N], Error> {
        let offsets: Vec<usize> = sizes
            .iter()
            .scan(0usize, |at, &n| {
                let o = *at;
                *at = (o + n).next_multiple_of(64);
                Some(o)
            })
            .collect();
        let total = offsets.last().map_or(0, |&o| o) + sizes.last().copied().unwrap_or(0);
        let whole = Owned::alloc(dev, total)?;
        let part = |i: usize| -> Result<Owned, Error> {
            Ok(Owned {
                region: whole
                    .region
                    .slice(offsets[i], sizes[i])
                    .map_err(|e| Error::wrap(Op::Buffers, Class::Internal, e))?,
                keys: whole.keys,
                _mr: whole._mr.clone(),
            })
        };
        let parts: Vec<Owned> = (0..N).map(part).collect::<Result<_, _>>()?;
        parts
            .try_into()
            .map_err(|_| Error::new(Op::Buffers, Class::Internal, "buffer parts"))
    }

    pub(crate) fn at(&self) -> (u64, u32) {
        (self.region.addr(), self.keys.lkey)
    }

    fn remote(&self) -> (u64, u32) {
        (self.region.addr(), self.keys.rkey)
    }
}

/// The `RLIMIT_MEMLOCK` hint for a registration that failed with `ENOMEM`, else nothing.
fn enomem_hint(e: &crate::transport::TransportError, len: usize) -> String {
    match e {
        crate::transport::TransportError::Io { source, .. }
            if source.raw_os_error() == Some(libc::ENOMEM) =>
        {
            crate::limits::enomem_hint(len)
        }
        _ => String::new(),
    }
}

struct Regions<'a>(&'a [&'a Owned]);

impl MemRead for Regions<'_> {
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        self.0
            .iter()
            .find(|o| o.region.contains(addr, out.len() as u64))
            .is_some_and(|o| {
                o.region
                    .read((addr - o.region.addr()) as usize, out)
                    .is_ok()
            })
    }
}

fn stage(owned: &[&Owned], addr: u64, bytes: &[u8]) -> Result<(), Error> {
    let o = owned
        .iter()
        .find(|o| o.region.contains(addr, bytes.len() as u64))
        .ok_or_else(|| {
            Error::new(
                Op::Progress,
                Class::Internal,
                format!("stage address {addr:#x} outside protocol buffers"),
            )
        })?;
    o.region
        .write((addr - o.region.addr()) as usize, bytes)
        .map_err(|e| Error::wrap(Op::Progress, Class::Internal, e))
}

/// What the peer announced about its side in the handshake (see `conn::Hello`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerParams {
    /// Sender → receiver: its CTS ring (addr, rkey).
    pub cts_ring: (u64, u32),
    /// Sender → receiver: its credit word (addr, rkey).
    pub credit_word: (u64, u32),
    /// Sender → receiver: whether it gates on credits.
    pub credits: bool,
    /// Receiver → sender: its record ring (addr, rkey).
    pub rec_ring: (u64, u32),
    /// Receiver → sender: initial credits (receive WRs posted before the reply).
    pub initial_credits: u64,
    /// Receiver → sender: bounce buffer payload size.
    pub eager_buf_size: u64,
    /// First sequence number (chosen by the sender).
    pub first_seq: u64,
}

/// The sender's protocol buffers, allocated before the handshake so their addresses can be
/// announced.
pub(crate) struct SendBuffers {
    hdr: Owned,
    rec: Owned,
    cts_ring: Owned,
    credit_word: Owned,
}

impl SendBuffers {
    pub(crate) fn alloc(dev: &dyn Device) -> Result<SendBuffers, Error> {
        // The engine's layout: header staging, record staging, CTS ring, credit word.
        let [hdr, rec, cts_ring, credit_word] =
            Owned::alloc_parts(dev, crate::engine::wire::SEND_COMM_BUFFERS)?;
        Ok(SendBuffers {
            hdr,
            rec,
            cts_ring,
            credit_word,
        })
    }

    /// What the receiver needs to know about our buffers.
    pub(crate) fn announce(&self, cfg: &Config, first_seq: u64) -> PeerParams {
        PeerParams {
            cts_ring: self.cts_ring.remote(),
            credit_word: self.credit_word.remote(),
            credits: cfg.credits,
            first_seq,
            ..PeerParams::default()
        }
    }
}

/// The receiver's protocol buffers and engine, created before the handshake reply so the
/// receive queue is posted before the peer can send.
pub(crate) struct RecvBuffers {
    /// The comm's own `rq_min_depth` bounce buffers.
    bounce: Owned,
    rec_ring: Owned,
    ctrl: Owned,
    /// Where the buffers above `rq_min_depth` come from.
    pool: Arc<BouncePool>,
}

/// The receive depth a comm starts with (and shrinks back to).
fn rq_min(cfg: &Config) -> u32 {
    cfg.rq_min_depth.clamp(1, cfg.rq_depth)
}

impl RecvBuffers {
    /// Allocates and registers the comm's own buffers (`rq_min_depth` bounce buffers and the
    /// rings); the full-depth footprint is checked against [`crate::limits::MAX_COMM_BYTES`]
    /// first, and an allocation failure is an error.
    pub(crate) fn alloc(dev: &Arc<dyn Device>, cfg: &Config) -> Result<RecvBuffers, Error> {
        crate::limits::check_cap(cfg).map_err(|e| e.lift(Op::Limits))?;
        let stride = crate::engine::wire::bounce_stride(cfg.eager_buf_size.into()) as usize;
        // The engine's layout (the bounce buffers at full depth are what the cap counts).
        let [_, rec, ctrl] =
            crate::engine::wire::recv_comm_buffers(cfg.rq_depth, cfg.eager_buf_size)
                .map(|n| n as usize);
        let own = rq_min(cfg) as usize * stride;
        let [bounce, rec_ring, ctrl] = Owned::alloc_parts(&**dev, [own, rec, ctrl])?;
        Ok(RecvBuffers {
            bounce,
            rec_ring,
            ctrl,
            pool: BouncePool::for_device(dev, stride, cfg.rq_pool_size),
        })
    }
}

/// What the receive engine reads: bounce buffers (its own and the pool's) and the record ring.
struct RecvMem<'a>(&'a RecvBuffers);

impl MemRead for RecvMem<'_> {
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        let b = self.0;
        if Regions(&[&b.bounce, &b.rec_ring]).read(addr, out) {
            return true;
        }
        b.pool
            .slab(addr, out.len() as u64)
            .is_some_and(|s| Regions(&[&s]).read(addr, out))
    }
}

/// Bounce buffers to give back to the pool once the QP that may still have them posted is
/// gone (the field is dropped after `Core::qp`).
struct GiveBack(Option<(Arc<BouncePool>, Vec<PoolBuf>)>);

/// A pool bounce buffer: (addr, lkey).
type PoolBuf = (u64, u32);

impl Drop for GiveBack {
    fn drop(&mut self) {
        if let Some((pool, bufs)) = self.0.take() {
            pool.give(&bufs);
        }
    }
}

/// Watchdog and periodic-stats timers of one comm.
struct Watch {
    hang_ns: Option<u64>,
    stats_ns: Option<u64>,
    last_check: u64,
    last_stats: u64,
    warned_failure: bool,
    warned_peer: bool,
    /// `VERBSNET_PEER_CHECK_INTERVAL` in ns, and when the set-up socket was last asked.
    peer_check_ns: u64,
    last_peer_check: u64,
}

impl Watch {
    fn new(cfg: &Config) -> Watch {
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
}

mod sealed {
    use super::pool::BouncePool;
    use super::{Action, Error, ReqError, ReqId, Stall, Stats, Wc};
    use std::sync::Arc;

    /// Pool bounce buffers (addr, lkey) a dropped comm gives back to their pool.
    pub type Held = (Arc<BouncePool>, Vec<(u64, u32)>);

    /// What [`super::Core`] needs from the end it drives; implemented by
    /// [`super::SendSide`] and [`super::RecvSide`] only.
    pub trait Side: Sized + Send + 'static {
        /// `"send"` or `"recv"` (the stats file's `side`).
        const NAME: &'static str;
        /// Request slots (the engine's pool size).
        const MAX_REQUESTS: usize;
        /// The typed owner a request points back to, from the address of its comm (a
        /// `Comm<Self>`, erased here because the trait cannot name `Comm<Self>` in a bound).
        fn owner(p: *mut ()) -> super::Owner;
        fn stats(&self) -> &Stats;
        fn in_flight(&self) -> usize;
        fn failure(&self) -> Option<&ReqError>;
        fn drain_actions(&mut self) -> Vec<Action>;
        fn fail(&mut self, e: ReqError);
        fn stalls(&mut self, now: u64, timeout_ns: u64) -> Vec<Stall>;
        /// Feeds one completion to the engine.
        fn handle_wc(&mut self, now: u64, wc: &Wc);
        /// After a CQ poll: the sender reads the CTS ring and credit word, the receiver
        /// returns the credits it owes.
        fn after_poll(&mut self, now: u64);
        /// Writes `bytes` into this side's staging buffers at `addr`.
        fn stage(&self, addr: u64, bytes: &[u8]) -> Result<(), Error>;
        /// Carries out `Copy`, `WantBounce` or `ReturnBounce` (receive side only).
        fn local_action(&mut self, a: Action) -> Result<(), Error>;
        /// Extra `name=value` words for a stall report.
        fn stall_counters(&self, _out: &mut Vec<String>) {}
        /// `test`: the sizes when done.
        fn test(&mut self, id: ReqId) -> Result<Option<Vec<u64>>, ReqError>;
        /// On drop: the pool buffers the engine still holds, to give back after the QP.
        fn release(&mut self) -> Option<Held>;
    }
}

/// Which end of a connection a [`Comm`] is: [`SendSide`] (made by `connect`, has `isend`) or
/// [`RecvSide`] (made by `accept`, has `irecv` and `iflush`). Sealed: only those two.
pub trait Role: sealed::Side {}
impl Role for SendSide {}
impl Role for RecvSide {}

/// The sender's half of a comm: its engine and protocol buffers.
pub struct SendSide {
    engine: SendEngine,
    bufs: SendBuffers,
}

/// The receiver's half of a comm: its engine, protocol buffers and the destination regions of
/// the posted receives (per request slot, per buffer: the eager copy target).
pub struct RecvSide {
    engine: RecvEngine,
    bufs: RecvBuffers,
    dst: Vec<[Option<Region>; MAX_RECVS]>,
}

impl sealed::Side for SendSide {
    const NAME: &'static str = "send";
    const MAX_REQUESTS: usize = MAX_SEND_REQUESTS;
    fn owner(p: *mut ()) -> Owner {
        Owner(OwnerPtr::Send(AtomicPtr::new(p.cast())))
    }
    fn stats(&self) -> &Stats {
        self.engine.stats()
    }
    fn in_flight(&self) -> usize {
        self.engine.in_flight()
    }
    fn failure(&self) -> Option<&ReqError> {
        self.engine.failure()
    }
    fn drain_actions(&mut self) -> Vec<Action> {
        self.engine.drain_actions()
    }
    fn fail(&mut self, e: ReqError) {
        self.engine.fail(e)
    }
    fn stalls(&mut self, now: u64, timeout_ns: u64) -> Vec<Stall> {
        self.engine.stalls(now, timeout_ns)
    }
    fn handle_wc(&mut self, now: u64, wc: &Wc) {
        self.engine.handle_wc(now, wc)
    }
    fn after_poll(&mut self, now: u64) {
        let written = [&self.bufs.cts_ring, &self.bufs.credit_word];
        self.engine.poll_peer_writes(now, &Regions(&written));
    }
    fn stage(&self, addr: u64, bytes: &[u8]) -> Result<(), Error> {
        stage(&[&self.bufs.hdr, &self.bufs.rec], addr, bytes)
    }
    fn local_action(&mut self, a: Action) -> Result<(), Error> {
        Err(Error::new(
            Op::Progress,
            Class::Internal,
            format!("{a:?} on a send comm"),
        ))
    }
    fn stall_counters(&self, out: &mut Vec<String>) {
        out.push(format!(
            "credits_available={}",
            self.engine.credits_available()
        ));
    }
    fn test(&mut self, id: ReqId) -> Result<Option<Vec<u64>>, ReqError> {
        self.engine.test(id).map(|o| o.map(|s| vec![s]))
    }
    fn release(&mut self) -> Option<sealed::Held> {
        None
    }
}

impl sealed::Side for RecvSide {
    const NAME: &'static str = "recv";
    const MAX_REQUESTS: usize = MAX_RECV_REQUESTS;
    fn owner(p: *mut ()) -> Owner {
        Owner(OwnerPtr::Recv(AtomicPtr::new(p.cast())))
    }
    fn stats(&self) -> &Stats {
        self.engine.stats()
    }
    fn in_flight(&self) -> usize {
        self.engine.in_flight()
    }
    fn failure(&self) -> Option<&ReqError> {
        self.engine.failure()
    }
    fn drain_actions(&mut self) -> Vec<Action> {
        self.engine.drain_actions()
    }
    fn fail(&mut self, e: ReqError) {
        self.engine.fail(e)
    }
    fn stalls(&mut self, now: u64, timeout_ns: u64) -> Vec<Stall> {
        self.engine.stalls(now, timeout_ns)
    }
    fn handle_wc(&mut self, now: u64, wc: &Wc) {
        self.engine.handle_wc(now, wc, &RecvMem(&self.bufs))
    }
    fn after_poll(&mut self, now: u64) {
        self.engine.after_poll(now);
    }
    fn stage(&self, addr: u64, bytes: &[u8]) -> Result<(), Error> {
        stage(&[&self.bufs.ctrl], addr, bytes)
    }
    fn local_action(&mut self, a: Action) -> Result<(), Error> {
        match a {
            Action::Copy { src, req, buf, len } => {
                let bufs = &self.bufs;
                let d = self
                    .dst
                    .get(req.slot as usize)
                    .and_then(|d| d[buf].as_ref());
                let slab;
                let from = if bufs.bounce.region.contains(src, len) {
                    Some(&bufs.bounce.region)
                } else {
                    slab = bufs.pool.slab(src, len);
                    slab.as_ref().map(|s| &s.region)
                };
                match (d, from) {
                    (Some(d), Some(from)) => d
                        .copy_from(0, from, (src - from.addr()) as usize, len as usize)
                        .map_err(|e| {
                            Error::new(Op::Progress, Class::Internal, "eager copy").because(e)
                        }),
                    _ => Err(Error::new(
                        Op::Progress,
                        Class::Internal,
                        format!(
                            "eager copy of {len} bytes at {src:#x} into request {req:?}: \
                             unknown buffer"
                        ),
                    )),
                }
            }
            Action::WantBounce(k) => {
                let got = self.bufs.pool.take(k as usize).unwrap_or_else(|e| {
                    warn!("the receive queue cannot grow: {}", e.report());
                    Vec::new()
                });
                self.engine.add_bounce(k, &got);
                Ok(())
            }
            Action::ReturnBounce(b) => {
                self.bufs.pool.give(&b);
                Ok(())
            }
            other => Err(Error::new(
                Op::Progress,
                Class::Internal,
                format!("{other:?} is not a receive-side action"),
            )),
        }
    }
    fn test(&mut self, id: ReqId) -> Result<Option<Vec<u64>>, ReqError> {
        let r = self.engine.test(id);
        if !matches!(r, Ok(None)) {
            if let Some(d) = self.dst.get_mut(id.slot as usize) {
                *d = Default::default();
            }
        }
        r
    }
    fn release(&mut self) -> Option<sealed::Held> {
        let held = self.engine.release_all();
        (!held.is_empty()).then(|| (self.bufs.pool.clone(), held))
    }
}

/// The machinery both ends share: the QP and its progress (CQ polling, action execution),
/// the watchdog, the peer-death checks and the sticky error.
struct Core<R: Role> {
    // Drop order: the QP goes before the buffers it may still reference.
    qp: Box<dyn QueuePair>,
    side: R,
    /// Filled by `Drop for Core` with the pool buffers the engine held; dropped after `qp`.
    give_back: GiveBack,
    wcs: Vec<Wc>,
    watch: Watch,
    post_errors: u64,
    /// The first usage or remote error a call returned: every later call returns it too.
    sticky: Option<Error>,
    /// For the device RNR counters in watchdog reports.
    dev: Arc<dyn Device>,
    /// The device RNR counters when this comm was created: they are device-wide and
    /// cumulative, so a comm reports how much they moved during its lifetime.
    dev_base: DeviceRnrCounters,
}

impl<R: Role> Drop for Core<R> {
    fn drop(&mut self) {
        if let Some(held) = self.side.release() {
            self.give_back = GiveBack(Some(held));
        }
    }
}

/// The comm a request belongs to, typed (set once the comm is boxed). Opaque.
pub struct Owner(OwnerPtr);

enum OwnerPtr {
    Send(AtomicPtr<SendComm>),
    Recv(AtomicPtr<RecvComm>),
}

/// The comm of a [`ReqHandle`]: which end, and where it lives.
#[derive(Clone, Copy, Debug)]
pub enum CommPtr {
    /// A request of a send comm.
    Send(*const SendComm),
    /// A request of a receive comm.
    Recv(*const RecvComm),
}

/// A request pointer handed to NCCL: it leads back to its comm.
pub struct ReqHandle {
    comm: Owner,
    slot: u32,
    gen: AtomicU32,
}

impl Owner {
    /// Points the owner at its comm (once, right after the comm is boxed).
    fn set(&self, p: *mut ()) {
        match &self.0 {
            OwnerPtr::Send(a) => a.store(p.cast(), Ordering::Release),
            OwnerPtr::Recv(a) => a.store(p.cast(), Ordering::Release),
        }
    }
}

impl ReqHandle {
    /// The comm this request belongs to.
    pub fn comm(&self) -> CommPtr {
        match &self.comm.0 {
            OwnerPtr::Send(p) => CommPtr::Send(p.load(Ordering::Acquire)),
            OwnerPtr::Recv(p) => CommPtr::Recv(p.load(Ordering::Acquire)),
        }
    }

    /// The request id.
    pub fn id(&self) -> ReqId {
        ReqId {
            slot: self.slot,
            gen: self.gen.load(Ordering::Acquire),
        }
    }
}

/// One end of a connection, typed by its [`Role`]: [`SendComm`] or [`RecvComm`].
///
/// Call order: `connect` makes a [`SendComm`] and `accept` a [`RecvComm`] (see
/// `conn.rs`); then any number of `isend` (send) or `irecv` (receive), each returning a
/// request or "retry later", and `test` on each request until done (both ends); `progress`
/// may be called at any time; `close` last, after which no request of the comm may be used.
/// Each entry first makes progress (CQ poll, peer writes, the engine's actions, watchdog)
/// inside the comm's `comm` tracing span, whose `label` every log line of the comm starts with.
pub struct Comm<R: Role> {
    core: Mutex<Core<R>>,
    dev: Arc<dyn Device>,
    reqs: Box<[ReqHandle]>,
    label: String,
    span: tracing::Span,
    cfg: Config,
    /// The NCCL communicator (ncclNet v11+ `commId`) this comm belongs to, for the stats.
    comm_id: Option<u64>,
}

/// The sending end (from `connect`): `isend`, `test`.
pub type SendComm = Comm<SendSide>;
/// The receiving end (from `accept`): `irecv`, `iflush`, `test`.
pub type RecvComm = Comm<RecvSide>;

/// The comm's span: every event inside starts with `label` (see [`crate::log`]). At `ERROR`
/// level so it is enabled whenever any line is.
fn comm_span(label: &str) -> tracing::Span {
    tracing::error_span!("comm", label = label)
}

impl<R: Role> Comm<R> {
    /// Tags the comm with its communicator (ncclNet v11+ `commId`): its label and its
    /// `VERBSNET_STATS_FILE` line (`"comm_id"`) carry it, so counters group by communicator.
    pub(crate) fn set_comm_id(&mut self, comm_id: Option<u64>) {
        if let Some(id) = comm_id {
            self.label = format!("{} [commId {id:#x}]", self.label);
            self.span = comm_span(&self.label);
        }
        self.comm_id = comm_id;
    }

    fn boxed(dev: Arc<dyn Device>, core: Core<R>, label: String, cfg: &Config) -> Box<Comm<R>> {
        let reqs = (0..R::MAX_REQUESTS as u32)
            .map(|slot| ReqHandle {
                comm: R::owner(std::ptr::null_mut()),
                slot,
                gen: AtomicU32::new(0),
            })
            .collect();
        let mut c = Box::new(Comm {
            core: Mutex::new(core),
            dev,
            reqs,
            span: comm_span(&label),
            label,
            cfg: cfg.clone(),
            comm_id: None,
        });
        // The owner pointers are stored through shared references (atomics), so no `&mut` to
        // the comm is made after `p` is taken: `p` stays valid for the requests' later reads.
        let p: *mut Comm<R> = &mut *c;
        for r in c.reqs.iter() {
            r.comm.set(p.cast());
        }
        c
    }

    fn core(dev: &Arc<dyn Device>, qp: Box<dyn QueuePair>, side: R, cfg: &Config) -> Core<R> {
        Core {
            qp,
            side,
            give_back: GiveBack(None),
            wcs: Vec::new(),
            watch: Watch::new(cfg),
            post_errors: 0,
            sticky: None,
            dev_base: dev.rnr_counters(),
            dev: dev.clone(),
        }
    }

    /// The device this comm runs on (for `regMr`).
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }

    /// The comm's label (`send comm <local> -> <peer> (<dev>)`, `recv comm … <- …`, with
    /// `[commId …]` when NCCL gave one).
    pub fn label(&self) -> &str {
        &self.label
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Core<R>>, Error> {
        self.core.lock().map_err(|_| {
            Error::new(
                Op::Progress,
                Class::Internal,
                format!("{}: state poisoned by an earlier panic", self.label),
            )
        })
    }

    fn handle(&self, id: ReqId) -> &ReqHandle {
        let h = &self.reqs[id.slot as usize];
        h.gen.store(id.gen, Ordering::Release);
        h
    }

    /// `test`: `Ok(Some(sizes))` when done (one size for a send, n for a grouped receive).
    pub fn test(&self, id: ReqId) -> Result<Option<Vec<u64>>, Error> {
        let _span = self.span.enter();
        let mut g = self.lock()?;
        g.sticky_call(|g| {
            let progressed = g.progress(now_ns());
            let r = g.side.test(id);
            progressed?;
            r.map_err(|e| Error::req(Op::Test, e))
        })
    }

    /// Makes progress without starting anything (polls the CQ, reads the CTS ring, posts what
    /// the engine queued). The plugin calls this inside every entry; tests use it to pump one
    /// side of a pair.
    pub fn progress(&self) -> Result<(), Error> {
        let _span = self.span.enter();
        let mut g = self.lock()?;
        g.sticky_call(|g| g.progress(now_ns()))
    }

    /// The error every call of this comm returns from now on, once a call returned a usage or
    /// remote error.
    pub fn sticky_error(&self) -> Option<Error> {
        self.lock().ok().and_then(|g| g.sticky.clone())
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

    /// Logs the counters and appends them to `VERBSNET_STATS_FILE` if set; called on close.
    pub fn close(self) {
        if let Ok(mut g) = self.core.lock() {
            // Tell the peer this is an orderly close, not a death (a comm dropped without
            // `close`, as in a process's death, says nothing).
            g.qp.goodbye();
            let line = g.stats_line();
            info!(target: "verbsnet::init", "closing {}: {line}", self.label);
            if let Some(path) = &self.cfg.stats_file {
                let json = g.stats_json(&self.label, self.comm_id);
                let _ = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .and_then(|mut f| writeln!(f, "{json}"));
            }
        }
    }
}

impl SendComm {
    /// A send comm over an established QP.
    pub(crate) fn new(
        dev: Arc<dyn Device>,
        qp: Box<dyn QueuePair>,
        bufs: SendBuffers,
        peer: &PeerParams,
        cfg: &Config,
        label: String,
    ) -> Box<SendComm> {
        let engine = SendEngine::new(SendParams {
            eager_limit: u64::from(cfg.eager_limit).min(peer.eager_buf_size),
            credits: cfg.credits,
            initial_credits: peer.initial_credits,
            hdr_stage: bufs.hdr.at(),
            rec_stage: bufs.rec.at(),
            peer_rec_ring: peer.rec_ring,
            cts_ring: bufs.cts_ring.at().0,
            credit_word: bufs.credit_word.at().0,
            first_seq: peer.first_seq,
            first_gen: cfg.test_first_gen,
        });
        let core = Comm::core(&dev, qp, SendSide { engine, bufs }, cfg);
        Comm::boxed(dev, core, label, cfg)
    }

    /// `isend` of `size` bytes at `data` (inside `mh`) with `tag`: `Ok(None)` = retry later.
    pub fn isend(
        &self,
        data: u64,
        size: u64,
        tag: i32,
        mh: &MrHandle,
    ) -> Result<Option<&ReqHandle>, Error> {
        let _span = self.span.enter();
        mh.sub(Op::Isend, data, size)?;
        let mut g = self.lock()?;
        g.sticky_call(|g| {
            let now = now_ns();
            g.progress(now)?;
            let r = g.side.engine.isend(now, data, mh.keys.lkey, size, tag);
            let id = g.after_engine_call(r, Op::Isend)?;
            g.execute()?;
            Ok(id)
        })
        .map(|id| id.map(|id| self.handle(id)))
    }
}

impl RecvComm {
    /// Creates the receive engine and posts its initial receive WRs on `qp` (before the QP can
    /// receive anything). Returns the engine and the initial credits to announce.
    pub(crate) fn prepare(
        qp: &mut dyn QueuePair,
        bufs: &RecvBuffers,
        peer: &PeerParams,
        cfg: &Config,
    ) -> Result<RecvEngine, Error> {
        let mut engine = RecvEngine::new(RecvParams {
            rq_depth: cfg.rq_depth,
            rq_min: rq_min(cfg),
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
            credits: peer.credits,
            first_seq: peer.first_seq,
        });
        for a in engine.drain_actions() {
            match a {
                Action::PostRecv(wrs) => qp.post_recv(&wrs).map_err(|e| {
                    Error::new(
                        Op::Buffers,
                        Class::System,
                        "posting the initial receive queue failed",
                    )
                    .because(e)
                })?,
                other => {
                    return Err(Error::new(
                        Op::Buffers,
                        Class::Internal,
                        format!("unexpected initial action {other:?}"),
                    ))
                }
            }
        }
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

    /// A receive comm over an established QP.
    pub(crate) fn new(
        dev: Arc<dyn Device>,
        qp: Box<dyn QueuePair>,
        bufs: RecvBuffers,
        engine: RecvEngine,
        cfg: &Config,
        label: String,
    ) -> Box<RecvComm> {
        let dst = (0..MAX_RECV_REQUESTS).map(|_| Default::default()).collect();
        let core = Comm::core(&dev, qp, RecvSide { engine, bufs, dst }, cfg);
        Comm::boxed(dev, core, label, cfg)
    }

    /// `irecv` of `(addr, capacity, tag, mhandle)` buffers: `Ok(None)` = retry later.
    pub fn irecv(&self, bufs: &[(u64, u64, i32, &MrHandle)]) -> Result<Option<&ReqHandle>, Error> {
        let _span = self.span.enter();
        if bufs.is_empty() || bufs.len() > MAX_RECVS {
            return Err(Error::new(
                Op::Irecv,
                Class::InvalidArgument,
                format!("irecv of {} buffers; maxRecvs is {MAX_RECVS}", bufs.len()),
            ));
        }
        let mut regions: [Option<Region>; MAX_RECVS] = Default::default();
        let mut rb = Vec::with_capacity(bufs.len());
        for (i, &(addr, cap, tag, mh)) in bufs.iter().enumerate() {
            regions[i] = Some(mh.sub(Op::Irecv, addr, cap)?);
            rb.push(RecvBuf {
                addr,
                cap,
                rkey: mh.keys.rkey,
                tag,
            });
        }
        let mut g = self.lock()?;
        g.sticky_call(|g| {
            let now = now_ns();
            g.progress(now)?;
            let r = g.side.engine.irecv(now, &rb);
            if let Ok(Some(id)) = &r {
                g.side.dst[id.slot as usize] = regions;
            }
            let id = g.after_engine_call(r, Op::Irecv)?;
            g.execute()?;
            Ok(id)
        })
        .map(|id| id.map(|id| self.handle(id)))
    }

    /// `iflush` of received buffers: host memory needs no flush (the data is visible to the
    /// CPU once the receive completed), so this is always done at once (`Ok(None)`: NCCL's
    /// "no request, complete", ext-net README).
    pub fn iflush(&self) -> Result<Option<&ReqHandle>, Error> {
        Ok(None)
    }
}

impl<R: Role> Core<R> {
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<(&'static str, u64)> = self.side.stats().fields().to_vec();
        let q = self.qp.counters();
        v.push(("rnr_naks_received", q.rnr_naks_received));
        v.push(("rnr_naks_sent", q.rnr_naks_sent));
        // Device-wide counters (every QP of the port), as moved since this comm was created.
        let d = self.dev.rnr_counters();
        let b = &self.dev_base;
        for (k, val, base) in [
            ("dev_rcvd_rnr_err", d.rcvd_rnr_err, b.rcvd_rnr_err),
            ("dev_send_rnr_err", d.send_rnr_err, b.send_rnr_err),
            (
                "dev_retry_rnr_exceeded_err",
                d.retry_rnr_exceeded_err,
                b.retry_rnr_exceeded_err,
            ),
        ] {
            if let Some(val) = val {
                v.push((k, val.saturating_sub(base.unwrap_or(0))));
            }
        }
        v
    }

    fn stats_line(&self) -> String {
        self.counters()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn stats_json(&self, label: &str, comm_id: Option<u64>) -> String {
        let mut s = format!(
            "{{\"side\":\"{}\",\"comm\":\"{}\"",
            R::NAME,
            label.replace(['"', '\\'], "'")
        );
        if let Some(id) = comm_id {
            // a string: the harness sums numeric fields as counters
            s.push_str(&format!(",\"comm_id\":\"{id:#x}\""));
        }
        for (k, v) in self.counters() {
            s.push_str(&format!(",\"{k}\":{v}"));
        }
        s.push('}');
        s
    }

    fn after_engine_call(
        &mut self,
        r: Result<Option<ReqId>, ReqError>,
        op: Op,
    ) -> Result<Option<ReqId>, Error> {
        match r {
            Ok(v) => Ok(v),
            Err(e) => {
                // Carry out actions produced before the error (e.g. a notification to the peer).
                let _ = self.execute();
                Err(Error::req(op, e))
            }
        }
    }

    /// Runs one data-path call: a comm that already returned a usage or remote error returns
    /// it again without doing anything (on both ends: the peer's comm fails the same way once
    /// it learns of the error); a new usage or remote error is kept for the later calls.
    /// Argument errors (`InvalidArgument`, checked before the comm's state is touched) are not
    /// kept: the call had no effect.
    fn sticky_call<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        if let Some(e) = &self.sticky {
            return Err(e.clone());
        }
        self.qp.begin_batch();
        // The batch ends even if `f` panics (the shim catches it), so no ACK stays held.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut *self)));
        self.qp.end_batch();
        let r = r.unwrap_or_else(|p| std::panic::resume_unwind(p));
        if let Err(e) = &r {
            if matches!(e.class(), Class::Usage | Class::Remote) {
                self.sticky = Some(e.clone());
            }
        }
        r
    }

    /// On the first error completion: when the set-up socket shows the peer closed (a read, on
    /// this error path only), the comm fails with that cause before the completion is fed, so
    /// the error every request reports is "the peer closed", not the flush it caused. True
    /// when the peer closed.
    fn peer_close_first(&mut self) -> bool {
        if !self.qp.peer_closed() {
            return false;
        }
        self.report_peer_gone();
        true
    }

    /// Fails the comm because its peer went, with one WARN.
    fn report_peer_gone(&mut self) {
        self.watch.warned_peer = true;
        let why = peer_gone(&*self.qp, R::NAME);
        warn!("{why}; outstanding requests fail");
        self.side.fail(ReqError::Remote(why));
    }

    /// Polls the CQ once and feeds the completions, the CTS ring and the credit word to the
    /// engine; returns how many completions it polled. Makes no system call of its own (the
    /// verbs poll is a read of mapped memory; the tcp transport reads its data stream).
    fn poll_and_feed(&mut self, now: u64) -> Result<usize, Error> {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        let polled = self.qp.poll_cq(&mut wcs, 64);
        let n = wcs.len();
        let mut peer_gone = self.watch.warned_peer;
        for wc in &wcs {
            if wc.status != WcStatus::Success && !peer_gone {
                peer_gone = self.peer_close_first();
            }
            self.side.handle_wc(now, wc);
        }
        self.side.after_poll(now);
        self.wcs = wcs;
        if let Err(e) = polled {
            let err = ReqError::Remote(format!("polling the completion queue failed: {e}"));
            self.side.fail(err);
            return Ok(0);
        }
        Ok(n)
    }

    /// Whether to ask the transport about the peer now: at most once per
    /// `VERBSNET_PEER_CHECK_INTERVAL`, on every kind of call. Also with nothing in flight: an
    /// `isend` answering "retry later" (waiting for a credit or a clear-to-send) or an `irecv`
    /// on an idle comm must learn that the peer died or closed, or NCCL would wait for ever.
    /// And also when this poll brought completions: they may have waited in the CQ since long
    /// before the peer went (the tcp transport's progress thread, a NIC, completes work while
    /// nobody calls). The ib transport reads its set-up socket (one non-blocking `recv` per
    /// interval); the tcp transport only looks at its state.
    fn peer_check_due(&mut self, now: u64) -> bool {
        if now.saturating_sub(self.watch.last_peer_check) < self.watch.peer_check_ns {
            return false;
        }
        self.watch.last_peer_check = now;
        true
    }

    /// Polls the CQ, reads the CTS ring and credit word, feeds the engine, executes actions,
    /// and runs the watchdog.
    fn progress(&mut self, now: u64) -> Result<(), Error> {
        self.poll_and_feed(now)?;
        if !self.watch.warned_peer && self.peer_check_due(now) && self.qp.peer_closed() {
            // Completions the CQ holds already are delivered before the close is reported.
            for _ in 0..MAX_DRAIN_POLLS {
                if self.poll_and_feed(now)? == 0 {
                    break;
                }
            }
            self.report_peer_gone();
        }
        self.execute()?;
        self.watchdog(now);
        Ok(())
    }

    /// Carries out the engine's actions in order (answering a request for bounce buffers can
    /// produce more: posts of the new buffers).
    fn execute(&mut self) -> Result<(), Error> {
        let mut actions = self.side.drain_actions();
        while !actions.is_empty() {
            self.execute_some(actions)?;
            actions = self.side.drain_actions();
        }
        Ok(())
    }

    fn execute_some(&mut self, actions: Vec<Action>) -> Result<(), Error> {
        let mut sends = Vec::new();
        for a in actions {
            let res = match a {
                Action::Stage { addr, bytes } => self.side.stage(addr, &bytes),
                Action::PostSend(wr) => {
                    sends.push(wr);
                    Ok(())
                }
                Action::PostRecv(wrs) => {
                    self.flush_sends(&mut sends)?;
                    self.qp.post_recv(&wrs).map_err(|e| {
                        Error::new(Op::Progress, Class::System, "post_recv").because(e)
                    })
                }
                other => self.side.local_action(other),
            };
            if let Err(e) = res {
                self.post_errors += 1;
                let line = e.report();
                warn!("{line}");
                self.side.fail(ReqError::Local(line));
                return Err(e);
            }
        }
        self.flush_sends(&mut sends)
    }

    fn flush_sends(&mut self, sends: &mut Vec<crate::transport::SendWr>) -> Result<(), Error> {
        if sends.is_empty() {
            return Ok(());
        }
        let r = self.qp.post_send(sends);
        sends.clear();
        r.map_err(|e| {
            let e = Error::new(Op::Progress, Class::System, "post_send").because(e);
            self.side.fail(ReqError::Local(e.report()));
            e
        })
    }

    fn watchdog(&mut self, now: u64) {
        if let Some(e) = self.side.failure() {
            if !self.watch.warned_failure {
                self.watch.warned_failure = true;
                warn!("{e}");
            }
        }
        if now.saturating_sub(self.watch.last_check) < 1_000_000_000 {
            return;
        }
        self.watch.last_check = now;
        if let Some(t) = self.watch.hang_ns {
            let stalls = self.side.stalls(now, t);
            for s in stalls {
                // Engine, QP and device counters (RNR NAKs tell a credits-off RNR stall apart
                // from a dead peer), and on the send side the credits in hand.
                let mut counters: Vec<String> = self
                    .counters()
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                self.side.stall_counters(&mut counters);
                warn!(
                    "{} has made no progress for {:.1} s; waiting for {}. Counters: {}. \
                     (VERBSNET_HANG_TIMEOUT sets this report's delay; 0 turns it off)",
                    s.what,
                    s.idle_ns as f64 / 1e9,
                    s.waiting_for,
                    counters.join(" ")
                );
            }
        }
        if let Some(iv) = self.watch.stats_ns {
            if now.saturating_sub(self.watch.last_stats) >= iv {
                self.watch.last_stats = now;
                let line: Vec<String> = self
                    .side
                    .stats()
                    .fields()
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                info!("stats {}", line.join(" "));
            }
        }
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
