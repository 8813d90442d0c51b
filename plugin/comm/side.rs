//! What differs between the two ends of a connection: which engine, which buffers, what a
//! poll reads or posts afterwards, where the engine's actions land. [`SendSide`] and
//! [`RecvSide`] implement the sealed [`Side`](sealed::Side) trait the comm's core
//! ([`super::core`]) is generic over, so every difference is a static call, and
//! [`CommSink`] is the comm's [`ActionSink`]: the one executor ([`Executor`]) carries
//! out the engine's actions on the QP and the registered buffers through it.

use std::sync::Arc;

use tracing::warn;

use super::buffers::{RecvBuffers, RecvMem, Regions, SendBuffers};
use super::mr::Mr;
use super::pool::BouncePool;
use super::{Class, Error, Op};
use crate::engine::wire::{Keys, MAX_RECVS};
use crate::engine::{
    ActionSink, BounceSource, Executor, RecvBuf, RecvEngine, ReqError, ReqId, SendEngine, Sizes,
    Stall, Stats, MAX_RECV_REQUESTS, MAX_SEND_REQUESTS,
};
use crate::mem::Region;
use crate::transport::{QueuePair, RecvWr, SendWr, Wc};

pub(super) mod sealed {
    use std::sync::Arc;

    use super::super::pool::BouncePool;
    use super::{Error, Executor, QueuePair, ReqError, ReqId, Sizes, Stall, Stats, Wc};

    /// Pool bounce buffers (addr, lkey) a dropped comm gives back to their pool.
    pub type Held = (Arc<BouncePool>, Vec<(u64, u32)>);

    /// What the comm's core needs from the end it drives; implemented by
    /// [`super::SendSide`] and [`super::RecvSide`] only.
    pub trait Side: Sized + Send + 'static {
        /// `"send"` or `"recv"` (the stats file's `side`).
        const NAME: &'static str;
        /// Request slots (the engine's pool size).
        const MAX_REQUESTS: usize;
        /// The engine's counters.
        fn stats(&self) -> &Stats;
        /// Requests in use.
        fn in_flight(&self) -> usize;
        /// Whether the engine queued actions that were not carried out yet.
        fn has_actions(&self) -> bool;
        /// The engine's first fatal error.
        fn failure(&self) -> Option<&ReqError>;
        /// Fails the engine: every outstanding request reports `e`.
        fn fail(&mut self, e: ReqError);
        /// Fails the engine after carrying out its actions failed part way: the actions after
        /// the failure were dropped, so a receive whose copy was among them must report `e`
        /// too, not the data it lacks (the receive side fails every request it holds, complete
        /// or not; [`crate::engine::RecvEngine::fail_all`]).
        fn fail_execution(&mut self, e: ReqError) {
            self.fail(e);
        }
        /// Requests idle for `timeout_ns`, each once.
        fn stalls(&mut self, now: u64, timeout_ns: u64) -> Vec<Stall>;
        /// Gives the engine the fine clock (`fine` reads it) where it wants one: before an
        /// `isend`, and before a poll's completions are fed (a send comm timing the READ of
        /// its clear-to-send, [`crate::engine::SendEngine::wants_clock`]; nothing on a
        /// receive comm).
        fn clock_if_wanted(&mut self, _fine: fn() -> u64) {}
        /// Feeds one completion to the engine.
        fn handle_wc(&mut self, now: u64, wc: &Wc);
        /// After a CQ poll: the sender reads the CTS ring and credit word, the receiver
        /// takes the small sends in its small-send ring, re-posts, grows from the pool and
        /// returns the credits it owes. True when what it
        /// read can have changed what `test` answers (the sender read a CTS, which matches
        /// speculative sends; the receiver took a small send from its small-send ring).
        fn after_poll(&mut self, now: u64) -> bool;
        /// Takes what the peer RDMA-wrote into this side's memory and the engine has not taken
        /// yet (the receiver's small sends; nothing on a send comm): before a dead or closed
        /// peer fails the engine. True when it took something.
        fn take_landed(&mut self, _now: u64) -> bool {
            false
        }
        /// Carries out the engine's actions with `exec` on the connection's `qps` (QP 0
        /// first) and this side's buffers.
        fn execute(
            &mut self,
            exec: &mut Executor,
            qps: &mut [Box<dyn QueuePair>],
        ) -> Result<(), Error>;
        /// Extra `name=value` words for a stall report.
        fn stall_counters(&self, _out: &mut Vec<String>) {}
        /// `test`: the sizes when done.
        fn test(&mut self, id: ReqId) -> Result<Option<Sizes>, ReqError>;
        /// On drop: the pool buffers the engine still holds, to give back after the QP.
        fn release(&mut self) -> Option<Held>;
        /// Before an orderly close: whether WRs the peer has not acknowledged back requests
        /// that completed already (a send comm's inline sends); queues what makes their
        /// acknowledgement show ([`crate::engine::SendEngine::flush_inline`]). `false` on a
        /// receive comm.
        fn close_pending(&mut self) -> bool {
            false
        }
    }
}

/// Which end of a connection a [`super::Comm`] is: [`SendSide`] (made by `connect`, has
/// `isend`) or [`RecvSide`] (made by `accept`, has `irecv` and `iflush`). Sealed: only those
/// two.
pub trait Role: sealed::Side {}
impl Role for SendSide {}
impl Role for RecvSide {}

/// The sender's half of a comm: its engine and protocol buffers.
pub struct SendSide {
    engine: SendEngine,
    bufs: SendBuffers,
}

/// The eager-copy destinations of one receive request: its buffers' regions, by index.
type Dests = [Option<Region>; MAX_RECVS];

/// The receiver's half of a comm: its engine, protocol buffers and the destination regions of
/// the posted receives (per request slot, per buffer: the eager copy target).
pub struct RecvSide {
    engine: RecvEngine,
    bufs: RecvBuffers,
    dst: Vec<Dests>,
}

impl SendSide {
    pub(super) fn new(engine: SendEngine, bufs: SendBuffers) -> SendSide {
        SendSide { engine, bufs }
    }

    /// The engine's `isend` (see [`SendEngine::isend`]).
    pub(super) fn isend(
        &mut self,
        now: u64,
        data: u64,
        lkeys: Keys,
        size: u64,
        tag: i32,
    ) -> Result<Option<ReqId>, ReqError> {
        self.engine.isend(now, data, lkeys, size, tag)
    }

    /// Whether `isend` of `tag` can start without a poll first
    /// ([`SendEngine::can_start_direct`]).
    pub(super) fn can_start(&self, tag: i32) -> bool {
        self.engine.can_start_direct(tag)
    }
}

impl RecvSide {
    pub(super) fn new(engine: RecvEngine, bufs: RecvBuffers) -> RecvSide {
        let dst = (0..MAX_RECV_REQUESTS).map(|_| Default::default()).collect();
        RecvSide { engine, bufs, dst }
    }

    /// The engine's `irecv` (see [`RecvEngine::irecv`]); a started request remembers `dests`
    /// (one per buffer), where its eager messages are copied. Only those are written: a
    /// slot's regions were cleared when its last request completed ([`sealed::Side::test`]).
    pub(super) fn irecv(
        &mut self,
        now: u64,
        bufs: &[RecvBuf],
        dests: &[Option<Region>],
    ) -> Result<Option<ReqId>, ReqError> {
        let r = self.engine.irecv(now, bufs);
        if let Ok(Some(id)) = &r {
            let d = &mut self.dst[id.slot as usize];
            for (d, r) in d.iter_mut().zip(dests) {
                d.clone_from(r);
            }
        }
        r
    }

    /// Whether `irecv` can start without a poll first ([`RecvEngine::can_start`]).
    pub(super) fn can_start(&self) -> bool {
        self.engine.can_start()
    }
}

impl sealed::Side for SendSide {
    const NAME: &'static str = "send";
    const MAX_REQUESTS: usize = MAX_SEND_REQUESTS;
    fn close_pending(&mut self) -> bool {
        self.engine.flush_inline()
    }
    fn stats(&self) -> &Stats {
        self.engine.stats()
    }
    fn in_flight(&self) -> usize {
        self.engine.in_flight()
    }
    #[inline]
    fn has_actions(&self) -> bool {
        self.engine.has_actions()
    }
    #[inline]
    fn failure(&self) -> Option<&ReqError> {
        self.engine.failure()
    }
    fn fail(&mut self, e: ReqError) {
        self.engine.fail(e)
    }
    fn stalls(&mut self, now: u64, timeout_ns: u64) -> Vec<Stall> {
        self.engine.stalls(now, timeout_ns)
    }
    #[inline]
    fn clock_if_wanted(&mut self, fine: fn() -> u64) {
        self.engine.clock_if_wanted(fine);
    }
    #[inline]
    fn handle_wc(&mut self, now: u64, wc: &Wc) {
        self.engine.handle_wc(now, wc)
    }
    #[inline]
    fn after_poll(&mut self, now: u64) -> bool {
        let written = [
            &self.bufs.cts_ring,
            &self.bufs.credit_word,
            &self.bufs.landing,
        ];
        self.engine.poll_peer_writes(now, &Regions(&written))
    }
    #[inline]
    fn execute(
        &mut self,
        exec: &mut Executor,
        qps: &mut [Box<dyn QueuePair>],
    ) -> Result<(), Error> {
        let (qp, data) = split_qps(qps)?;
        let sink = &mut CommSink {
            qp,
            data,
            staging: &[&self.bufs.hdr, &self.bufs.rec, &self.bufs.landing],
            recv: None,
        };
        exec.execute(&mut self.engine, sink)
    }
    fn stall_counters(&self, out: &mut Vec<String>) {
        out.push(format!(
            "credits_available={}",
            self.engine.credits_available()
        ));
    }
    #[inline]
    fn test(&mut self, id: ReqId) -> Result<Option<Sizes>, ReqError> {
        self.engine.test(id).map(|o| o.map(|s| Sizes::of(&[s])))
    }
    fn release(&mut self) -> Option<sealed::Held> {
        None
    }
}

impl sealed::Side for RecvSide {
    const NAME: &'static str = "recv";
    const MAX_REQUESTS: usize = MAX_RECV_REQUESTS;
    fn fail_execution(&mut self, e: ReqError) {
        self.engine.fail_all(e)
    }
    fn stats(&self) -> &Stats {
        self.engine.stats()
    }
    fn in_flight(&self) -> usize {
        self.engine.in_flight()
    }
    #[inline]
    fn has_actions(&self) -> bool {
        self.engine.has_actions()
    }
    #[inline]
    fn failure(&self) -> Option<&ReqError> {
        self.engine.failure()
    }
    fn fail(&mut self, e: ReqError) {
        self.engine.fail(e)
    }
    fn stalls(&mut self, now: u64, timeout_ns: u64) -> Vec<Stall> {
        self.engine.stalls(now, timeout_ns)
    }
    #[inline]
    fn handle_wc(&mut self, now: u64, wc: &Wc) {
        self.engine.handle_wc(now, wc, &RecvMem(&self.bufs))
    }
    #[inline]
    fn take_landed(&mut self, now: u64) -> bool {
        self.engine.poll_small(now, &RecvMem(&self.bufs))
    }
    #[inline]
    fn after_poll(&mut self, now: u64) -> bool {
        let small = self.take_landed(now);
        self.engine
            .after_poll(now, &mut PoolSource(&self.bufs.pool));
        small
    }
    #[inline]
    fn execute(
        &mut self,
        exec: &mut Executor,
        qps: &mut [Box<dyn QueuePair>],
    ) -> Result<(), Error> {
        let (qp, data) = split_qps(qps)?;
        let sink = &mut CommSink {
            qp,
            data,
            // The control staging, and the record region's CTS mirror.
            staging: &[&self.bufs.ctrl, &self.bufs.rec_ring],
            recv: Some((&self.bufs, &self.dst)),
        };
        exec.execute(&mut self.engine, sink)?;
        if !self.engine.has_published() {
            return Ok(());
        }
        // The mirror stores above before the wake word load in `after_execute` (a store-load
        // order: only a full fence gives it; `RecvEngine::after_execute` says why it matters).
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if self.engine.after_execute(&RecvMem(&self.bufs)) {
            exec.execute(&mut self.engine, sink)?;
        }
        Ok(())
    }
    #[inline]
    fn test(&mut self, id: ReqId) -> Result<Option<Sizes>, ReqError> {
        let r = self.engine.test(id);
        if !matches!(r, Ok(None)) {
            if let Some(d) = self.dst.get_mut(id.slot as usize) {
                // `irecv` filled one entry per buffer: a completed receive's sizes say how many.
                let n = match &r {
                    Ok(Some(sizes)) => sizes.len().min(d.len()),
                    _ => d.len(),
                };
                for e in &mut d[..n] {
                    *e = None;
                }
            }
        }
        r
    }
    fn release(&mut self) -> Option<sealed::Held> {
        let held = self.engine.release_all();
        (!held.is_empty()).then(|| (self.bufs.pool.clone(), held))
    }
}

/// Posts the receive engine's first actions (its initial receive WRs) on `qp`, before the QP
/// can receive anything; the engine stages nothing and copies nothing yet.
///
/// # Errors
/// [`Op::Buffers`]: a post failed, or the engine asked for more than posts.
pub(super) fn post_initial(qp: &mut dyn QueuePair, engine: &mut RecvEngine) -> Result<(), Error> {
    let exec = &mut Executor::default();
    let sink = &mut CommSink {
        qp,
        data: &mut [],
        staging: &[],
        recv: None,
    };
    exec.execute(engine, sink).map_err(|e| {
        Error::new(
            Op::Buffers,
            Class::System,
            "posting the initial receive queue failed",
        )
        .because(e)
    })
}

/// Where a comm carries out its engine's actions ([`Executor`]): its QP, its staging
/// buffers, and on the receive side its bounce buffers, the pool and the destinations of the
/// posted receives.
struct CommSink<'a> {
    /// QP 0: eager SENDs, direct writes, CTS and credit writes, the receive queue.
    qp: &'a mut dyn QueuePair,
    /// The data QPs, QP 1 first: WRITE WITH IMMs of payload pieces (sender), their
    /// zero-length receive WRs (receiver).
    data: &'a mut [Box<dyn QueuePair>],
    /// The buffers `Stage` actions write into.
    staging: &'a [&'a Mr],
    /// The receive side's: what eager copies read and write, where bounce buffers go back.
    recv: Option<(&'a RecvBuffers, &'a [Dests])>,
}

/// `post_send` / `post_recv` (QP 0) or `… on data QP n`, for an error.
fn post_what(call: &str, qp: usize) -> String {
    if qp == 0 {
        call.to_string()
    } else {
        format!("{call} on data QP {qp}")
    }
}

impl CommSink<'_> {
    /// QP `qp` of the connection (0: QP 0, then the data QPs); `what` names the WRs for the
    /// internal error of a `qp` the connection does not have.
    fn qp_at(&mut self, qp: usize, what: &str) -> Result<&mut dyn QueuePair, Error> {
        let n = self.data.len() + 1;
        match qp {
            0 => Ok(&mut *self.qp),
            i if i < n => Ok(&mut *self.data[i - 1]),
            _ => Err(Error::new(
                Op::Progress,
                Class::Internal,
                format!("{what} for QP {qp} of a connection of {n} QPs"),
            )),
        }
    }

    fn recv(&self, what: &str) -> Result<(&RecvBuffers, &[Dests]), Error> {
        self.recv.ok_or_else(|| {
            Error::new(
                Op::Progress,
                Class::Internal,
                format!("{what} on a send comm"),
            )
        })
    }
}

impl ActionSink for CommSink<'_> {
    type Error = Error;

    /// In order: what an earlier stage wrote is visible to the NIC and the peer's READs no
    /// later than this one's bytes (the receive engine stores a mirror entry's head word in a
    /// stage of its own, after the rest).
    #[inline]
    fn stage(&mut self, addr: u64, bytes: &[u8]) -> Result<(), Error> {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        Regions(self.staging).stage(addr, bytes)
    }

    /// On QP `qp` of the connection; a `qp` the connection does not have is an internal
    /// error (the engine's bug), not a post.
    #[inline]
    fn post_send(&mut self, qp: usize, wrs: &[SendWr]) -> Result<(), Error> {
        self.qp_at(qp, "send WRs")?.post_send(wrs).map_err(|e| {
            Error::new(Op::Progress, Class::System, post_what("post_send", qp)).because(e)
        })
    }

    /// On QP `qp` of the connection (data QPs: their zero-length receive WRs); a `qp` the
    /// connection does not have is an internal error (the engine's bug), not a post.
    fn post_recv(&mut self, qp: usize, wrs: &[RecvWr]) -> Result<(), Error> {
        self.qp_at(qp, "receive WRs")?.post_recv(wrs).map_err(|e| {
            Error::new(Op::Progress, Class::System, post_what("post_recv", qp)).because(e)
        })
    }

    fn copy(&mut self, src: u64, req: ReqId, buf: usize, len: u64) -> Result<(), Error> {
        let (bufs, dst) = self.recv("an eager copy")?;
        let d = dst.get(req.slot as usize).and_then(|d| d[buf].as_ref());
        let slab: Option<Arc<Mr>>;
        let from = if bufs.bounce.region.contains(src, len) {
            Some(&bufs.bounce.region)
        } else if bufs.rec_ring.region.contains(src, len) {
            // A small send's payload, in the small-send ring.
            Some(&bufs.rec_ring.region)
        } else {
            slab = bufs.pool.slab(src, len);
            slab.as_ref().map(|s| &s.region)
        };
        match (d, from) {
            (Some(d), Some(from)) => d
                .copy_from(0, from, (src - from.addr()) as usize, len as usize)
                .map_err(|e| Error::new(Op::Progress, Class::Internal, "eager copy").because(e)),
            _ => Err(Error::new(
                Op::Progress,
                Class::Internal,
                format!(
                    "eager copy of {len} bytes at {src:#x} into request {req:?}: unknown buffer"
                ),
            )),
        }
    }

    fn return_bounce(&mut self, b: &[(u64, u32)]) -> Result<(), Error> {
        self.recv("returning bounce buffers")?.0.pool.give(b);
        Ok(())
    }
}

/// A connection's QP 0 and its data QPs.
type QpSplit<'a> = (&'a mut dyn QueuePair, &'a mut [Box<dyn QueuePair>]);

/// QP 0 and the data QPs of a comm's `qps` (never empty: a comm has its QP 0).
fn split_qps(qps: &mut [Box<dyn QueuePair>]) -> Result<QpSplit<'_>, Error> {
    match qps.split_first_mut() {
        Some((qp, data)) => Ok((&mut **qp, data)),
        None => Err(Error::new(
            Op::Progress,
            Class::Internal,
            "a comm without a QP",
        )),
    }
}

/// The shared pool of the device as the receive engine's [`BounceSource`]: a registration that
/// fails is one WARN and no buffers (the queue then stays at its depth).
struct PoolSource<'a>(&'a BouncePool);

impl BounceSource for PoolSource<'_> {
    fn take(&mut self, k: u32) -> Vec<(u64, u32)> {
        self.0.take(k as usize).unwrap_or_else(|e| {
            warn!("the receive queue cannot grow: {}", e.report());
            Vec::new()
        })
    }
}
