//! The machinery both ends of a connection share ([`Core`]): the QP and its progress (CQ
//! polls fed to the engine, the engine's actions carried out), the peer-death checks, the
//! sticky error, the counters and the watchdog's turn. Generic over the end
//! ([`Role`]): what differs sits in [`super::side`].

use std::sync::Arc;

use tracing::{debug, warn};

use super::side::sealed::Held;
use super::side::Role;
use super::watch::{self, Watch};
use super::{Class, Error, Op};
use crate::config::Config;
use crate::engine::{Executor, ReqError, ReqId};
use crate::transport::{Device, DeviceRnrCounters, QpCounters, QueuePair, Wc, WcStatus};

/// The error of a comm whose peer went without closing its comm.
const PEER_CLOSED: &str = "the peer closed the connection (its process exited or died)";

/// Most CQ polls (of up to 64 completions each) that drain the CQ before a peer's close is
/// reported.
const MAX_DRAIN_POLLS: usize = 1024;

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

/// Bounce buffers to give back to the pool once the QP that may still have them posted is
/// gone (the field is dropped after `Core::qp`).
struct GiveBack(Option<Held>);

impl Drop for GiveBack {
    fn drop(&mut self) {
        if let Some((pool, bufs)) = self.0.take() {
            pool.give(&bufs);
        }
    }
}

/// One comm's QPs, its end ([`Role`]: engine and buffers), and what watches them.
pub(super) struct Core<R: Role> {
    // Drop order: the QPs go before the buffers they may still reference.
    /// The connection's QPs (`VERBSNET_IB_QPS_PER_CONNECTION`, the sender's): QP 0 first,
    /// which carries the receive queue, the control traffic and the set-up stream that tells
    /// of the peer's death; then the data QPs (RDMA WRITE WITH IMMs of payload pieces and,
    /// on the receiver, the zero-length receive WRs they consume).
    qps: Vec<Box<dyn QueuePair>>,
    /// The end: its engine and buffers.
    pub(super) side: R,
    /// Filled by `Drop for Core` with the pool buffers the engine held; dropped after `qp`.
    give_back: GiveBack,
    wcs: Vec<Wc>,
    /// Carries out the engine's actions (keeps its send batch between calls).
    exec: Executor,
    watch: Watch,
    /// The owner is closing the comm ([`Core::begin_close`]): a peer's goodbye that comes
    /// meanwhile is the normal end of both, not a failure to WARN about.
    closing: bool,
    post_errors: u64,
    /// Work completions the CQ polls handed out (counter `wcs_polled`).
    wcs_polled: u64,
    /// Poll rounds, each polling every QP's CQ once (counter `cq_polls`).
    cq_polls: u64,
    /// The first usage or remote error a call returned: every later call returns it too.
    sticky: Option<Error>,
    /// The request the last call on this comm was a `test` of, when that call found it
    /// pending and its poll fed nothing (`Comm::test`); every other call that may change the
    /// comm's state forgets it (`Comm::lock`; only `Comm::quiet` and the close report read
    /// the state without). The engine's answer for that request cannot have changed since, so
    /// the next `test` of it polls without asking first.
    pub(super) quiet: Option<ReqId>,
    /// Some QP holds back what it would send inside a batch ([`QueuePair::batches`]): each
    /// entry opens and closes one on every QP.
    batches: bool,
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

impl<R: Role> Core<R> {
    pub(super) fn new(
        dev: &Arc<dyn Device>,
        qps: Vec<Box<dyn QueuePair>>,
        side: R,
        cfg: &Config,
    ) -> Core<R> {
        debug_assert!(!qps.is_empty(), "a comm has its QP 0");
        Core {
            batches: qps.iter().any(|qp| qp.batches()),
            qps,
            side,
            give_back: GiveBack(None),
            wcs: Vec::new(),
            exec: Executor::default(),
            watch: Watch::new(cfg),
            closing: false,
            post_errors: 0,
            wcs_polled: 0,
            cq_polls: 0,
            sticky: None,
            quiet: None,
            dev_base: dev.rnr_counters(),
            dev: dev.clone(),
        }
    }

    /// The first usage or remote error a call returned.
    pub(super) fn sticky(&self) -> Option<&Error> {
        self.sticky.as_ref()
    }

    /// Engine, QP and device counters (`dev_*`, where the device has them: device-wide, as
    /// moved since this comm was created). The QP counters are summed over the connection's
    /// QPs (`qps`: how many).
    pub(super) fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<(&'static str, u64)> = self.side.stats().fields().to_vec();
        let mut q = QpCounters::default();
        for c in self.qps.iter().map(|qp| qp.counters()) {
            q.rnr_naks_received += c.rnr_naks_received;
            q.rnr_naks_sent += c.rnr_naks_sent;
            q.post_recv_calls += c.post_recv_calls;
            q.recv_wrs_posted += c.recv_wrs_posted;
        }
        v.push(("qps", self.qps.len() as u64));
        // Work per message (issue 22): send-side post calls and WRs as the executor made them,
        // completions as the polls handed them out.
        v.push(("sq_post_calls", self.exec.sq_post_calls()));
        v.push(("sq_wrs_posted", self.exec.sq_wrs_posted()));
        v.push(("wcs_polled", self.wcs_polled));
        v.push(("cq_polls", self.cq_polls));
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

    /// An engine call's result: on an error, the actions it produced before the error (e.g. a
    /// notification to the peer) are still carried out.
    pub(super) fn after_engine_call(
        &mut self,
        r: Result<Option<ReqId>, ReqError>,
        op: Op,
    ) -> Result<Option<ReqId>, Error> {
        match r {
            Ok(v) => Ok(v),
            Err(e) => {
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
    #[inline]
    pub(super) fn sticky_call<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        if let Some(e) = &self.sticky {
            return Err(e.clone());
        }
        let r = if self.batches {
            self.batched(f)
        } else {
            // No batch to close: a panic goes straight to the shim's boundary.
            f(self)
        };
        if let Err(e) = &r {
            if matches!(e.class(), Class::Usage | Class::Remote) {
                self.sticky = Some(e.clone());
            }
        }
        r
    }

    /// `f` inside a batch on every QP ([`QueuePair::begin_batch`]; the tcp transport's): the
    /// batch ends even if `f` panics (the shim catches it), so no ACK stays held.
    fn batched<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T, Error>) -> Result<T, Error> {
        for qp in &mut self.qps {
            qp.begin_batch();
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut *self)));
        for qp in &mut self.qps {
            qp.end_batch();
        }
        r.unwrap_or_else(|p| std::panic::resume_unwind(p))
    }

    /// On the first error completion: when the set-up socket shows the peer closed (a read, on
    /// this error path only), the comm fails with that cause before the completion is fed, so
    /// the error every request reports is "the peer closed", not the flush it caused. True
    /// when the peer closed.
    fn peer_close_first(&mut self, now: u64) -> bool {
        if !self.qps[0].peer_closed() {
            return false;
        }
        self.report_peer_gone(now);
        true
    }

    /// Whether the peer closed or died ([`QueuePair::peer_closed`] of QP 0; ib: a read of the
    /// set-up socket).
    pub(super) fn peer_closed(&self) -> bool {
        self.qps[0].peer_closed()
    }

    /// Tells the peer this is an orderly close ([`QueuePair::goodbye`]), on every QP (ib: QP
    /// 0's set-up stream; tcp: each QP's own stream).
    pub(super) fn goodbye(&mut self) {
        for qp in &mut self.qps {
            qp.goodbye();
        }
    }

    /// Fails the comm because its peer went, with one WARN; quietly (a DEBUG line) when the
    /// owner is closing the comm and the peer closed in order too (NCCL closes the two ends
    /// in no fixed order, so a send comm's close may meet the receive comm's goodbye).
    fn report_peer_gone(&mut self, now: u64) {
        // What the peer wrote into our memory before it went is delivered first, as the
        // completions in the CQ are (the receiver's small sends).
        self.side.take_landed(now);
        self.watch.warned_peer = true;
        let why = peer_gone(&*self.qps[0], R::NAME);
        if self.closing && self.qps[0].peer_closed_orderly() {
            debug!("{why}, while this end closes too");
            self.watch.silence_failure();
        } else {
            warn!("{why}; outstanding requests fail");
        }
        self.side.fail(ReqError::Remote(why));
    }

    /// The owner starts closing the comm (before its last progress calls, `Comm::goodbye`).
    pub(super) fn begin_close(&mut self) {
        self.closing = true;
    }

    /// Polls every QP's CQ once (QP 0 first) and feeds the completions, the CTS ring and
    /// the credit word to the engine (the `wr_id` says what each completion is, whichever QP
    /// it came from); returns how many completions it polled, and whether it fed anything
    /// that can have changed what `test` answers (a completion, a CTS, a failed poll). Makes
    /// no system call of its own (the verbs poll is a read of mapped memory; the tcp transport
    /// reads its data streams).
    #[inline(always)]
    fn poll_and_feed(&mut self, now: u64) -> (usize, bool) {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        let mut polled = Ok(0);
        self.cq_polls += 1;
        for qp in &mut self.qps {
            let r = qp.poll_cq(&mut wcs, 64);
            if r.is_err() && polled.is_ok() {
                polled = r;
            }
        }
        let n = wcs.len();
        self.wcs_polled += n as u64;
        if n > 0 {
            self.side.clock_if_wanted(super::fine_ns);
        }
        let mut peer_gone = self.watch.warned_peer;
        for wc in &wcs {
            if wc.status != WcStatus::Success && !peer_gone {
                peer_gone = self.peer_close_first(now);
            }
            self.side.handle_wc(now, wc);
        }
        let cts = self.side.after_poll(now);
        self.wcs = wcs;
        if let Err(e) = polled {
            let err = ReqError::Remote(format!("polling the completion queue failed: {e}"));
            self.side.fail(err);
            return (0, true);
        }
        (n, n > 0 || cts)
    }

    /// [`Core::progress`] before an `isend` or `irecv`, skipped when the engine can start the
    /// request at once (`startable`, its `can_start` check) and no peer check or watchdog turn
    /// is due (a comm still asks about its peer once per `VERBSNET_PEER_CHECK_INTERVAL` at
    /// whatever call comes).
    pub(super) fn progress_unless_startable(
        &mut self,
        now: u64,
        startable: bool,
    ) -> Result<(), Error> {
        if !(startable && self.watch.nothing_due(now)) {
            self.progress(now)?;
        }
        Ok(())
    }

    /// Polls the CQ, reads the CTS ring and credit word, feeds the engine, executes actions,
    /// and runs the watchdog. `Ok(false)`: nothing it did can have changed what `test`
    /// answers for any request (no completion, no CTS, no failure), so a caller that asked
    /// the engine just before needs not ask again.
    #[inline(always)]
    pub(super) fn progress(&mut self, now: u64) -> Result<bool, Error> {
        let (_, mut changed) = self.poll_and_feed(now);
        if self.watch.peer_check_due(now) && self.qps[0].peer_closed() {
            self.drain_and_report_peer_gone(now);
            changed = true;
        }
        self.execute()?;
        self.watchdog(now);
        Ok(changed || self.side.failure().is_some())
    }

    /// The peer closed or died: the completions the CQ holds already are delivered before
    /// the close is reported.
    #[cold]
    #[inline(never)]
    fn drain_and_report_peer_gone(&mut self, now: u64) {
        for _ in 0..MAX_DRAIN_POLLS {
            if self.poll_and_feed(now).0 == 0 {
                break;
            }
        }
        self.report_peer_gone(now);
    }

    /// Carries out the engine's actions in order ([`Executor`]); a failure
    /// fails the engine, so every outstanding request reports it.
    #[inline]
    pub(super) fn execute(&mut self) -> Result<(), Error> {
        if !self.side.has_actions() {
            return Ok(());
        }
        self.execute_actions()
    }

    /// [`Core::execute`]'s work, when there are actions.
    #[inline(never)]
    fn execute_actions(&mut self) -> Result<(), Error> {
        let r = self.side.execute(&mut self.exec, &mut self.qps);
        if let Err(e) = &r {
            self.post_errors += 1;
            let line = e.report();
            warn!("{line}");
            self.side.fail_execution(ReqError::Local(line));
        }
        r
    }

    /// The watchdog's turn: the comm's failure (once), then at most once a second the stalled
    /// requests and the periodic stats line.
    #[inline]
    fn watchdog(&mut self, now: u64) {
        self.watch.failure(self.side.failure());
        if self.watch.turn_due(now) {
            self.watchdog_turn(now);
        }
    }

    /// [`Core::watchdog`]'s turn, at most once a second.
    #[inline(never)]
    fn watchdog_turn(&mut self, now: u64) {
        if let Some(t) = self.watch.hang_ns() {
            let stalls = self.side.stalls(now, t);
            for s in stalls {
                // Engine, QP and device counters (RNR NAKs tell a credits-off RNR stall apart
                // from a dead peer), and on the send side the credits in hand.
                let mut counters = watch::line(&self.counters());
                let mut extra = Vec::new();
                self.side.stall_counters(&mut extra);
                for w in extra {
                    counters.push(' ');
                    counters.push_str(&w);
                }
                watch::report_stall(&s, &counters);
            }
        }
        if self.watch.stats_due(now) {
            watch::report_stats(&self.side.stats().fields());
        }
    }

    /// The comm's close line and `VERBSNET_STATS_FILE` record (see [`watch::report_close`]).
    pub(super) fn report_close(&self, label: &str, comm_id: Option<u64>, cfg: &Config) {
        watch::report_close(
            R::NAME,
            label,
            comm_id,
            &self.counters(),
            cfg.stats_file.as_deref(),
        );
    }
}
