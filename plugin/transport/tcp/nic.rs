//! The tcp transport's "NIC": the handle an owner holds for a QP ([`TcpQueuePair`]) and the
//! device's background thread that carries on the QPs their owners are not polling, as a NIC
//! carries on RDMA traffic whatever the process does.
//!
//! **Sharing.** A QP's state ([`TcpQp`]) sits behind a mutex that the owner's handle and the
//! NIC thread share. The owner takes it on every call with `try_lock`, which, with the thread
//! away, is one uncontended atomic: the hot path gains nothing else but a plain store (the
//! time its poll read anyway) and a flag load. The thread only ever `try_lock`s, and services a QP only while its owner is
//! away: while the owner waits for the lock it sets `preempt`, and the thread's socket loops
//! stop before their next call ([`TcpQp::yielding`]), so an owner waits for at most one
//! non-blocking socket call of the thread.
//!
//! **When the thread steps in.** A QP is handed to the thread at `handshake_complete` (or its
//! owner's first data-path call after `establish`, a post, a poll, a batch, if that comes
//! first): until then the stream may still carry the rest of the caller's handshake (the
//! plugin's acceptor reads the connector's "ready" message on it after `establish`), which the
//! thread must not take for frames. A QP is *idle* when its owner has not called `poll_cq` for
//! [`IDLE_AFTER`] (1 ms; the owner stores the time its poll read anyway, one plain store) and
//! is not inside a batch (`begin_batch` … `end_batch`: the ACKs held
//! there wait for the batch's send). Only idle QPs are serviced ([`TcpQp::service`]: read and
//! carry out frames, acknowledge, retire acknowledged sends into the CQ, retransmit after RNR
//! timers, notice EOF; completions queue for the owner). 1 ms because an owner that polls at
//! all polls far more often (NCCL's proxy: about 1 µs per poll and comm; even a sweep of a
//! thousand comms comes back within it), so a busy QP is never contended, while a peer waiting
//! on a QP whose owner went away waits milliseconds (below), not for ever. Mistaking a slow poller for an
//! idle one only costs a shared read.
//!
//! **How it waits.** Between rounds the thread sleeps in one `poll(2)` on a waker socket and
//! the sockets of the idle QPs (readable; writable too where staged bytes wait for room), with
//! a timeout: the nearest RNR timer, and, while some owner is active, the next look at it:
//! 1 ms after the look that found it active at first, then an eighth of how long it has been
//! active, at most [`MAX_CHECK`] (16 ms; [`check_after`]). So a QP whose owner stops polling
//! is taken over 1-2 ms after its last poll when the owner had polled briefly (a receive
//! posted, then never called again), and at most 16 ms after a long run of polling; with
//! owners polling steadily the thread looks about 60 times a second, plus one wake per owner
//! that comes back to a QP the thread had taken (a fixed 1 ms look woke it 1,100 times a
//! second, about 3 % of a core under load; backed off: 200-500 wakeups a second and under
//! 1.5 % on the loaded 2-core machine, `docs/performance.md`), and with every QP idle and quiet
//! it does not wake at all until a frame arrives or a timer runs out. An
//! owner's call on a QP the thread waits on wakes it (once per return of the owner), so that
//! it stops waiting on that socket and sees what the owner changed.
//!
//! **Lifetime.** The thread holds QPs weakly ([`Weak`]): a dropped QP is gone. Its handle's
//! drop takes the socket out of the state and shuts it down (the peer sees the close at once,
//! exactly as at a process death; the thread's own reference, held only across one `poll(2)`,
//! is woken by the shutdown and let go). Each device starts its thread with the first
//! QP handed to it and stops it, joining it, when its last QP is dropped, so no thread outlives
//! the QPs (nothing runs when NCCL unloads the plugin after closing every comm); at process
//! exit a running thread just ends with the process.
//!
//! **Memory.** The thread runs the same code as the owner, under the same registry rules, so a
//! registration's drop still waits for at most one non-blocking socket call, and nothing
//! touches memory after its deregistration returned.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use tracing::{debug, warn};

use super::qp::TcpQp;
use crate::transport::{QpCounters, QueuePair, RecvWr, Result, SendWr, Wc};

/// A QP whose owner has not polled it for this long (and is not inside a batch) is serviced
/// by the NIC thread.
pub(super) const IDLE_AFTER: Duration = Duration::from_millis(1);

/// Longest the thread waits before looking at an active owner again (see [`check_after`]).
pub(super) const MAX_CHECK: Duration = Duration::from_millis(16);

/// How long after a check that found the owner active the thread looks again: an eighth of how
/// long the owner has been active without a pause, between [`IDLE_AFTER`] and [`MAX_CHECK`].
/// An owner that just started (or polls in bursts) is taken over 1-2 ms after its last poll;
/// one that polled for a long run, at most 16 ms after it, and the thread wakes about 60 times
/// a second instead of 1,000 while owners poll.
fn check_after(active_for: Duration) -> Duration {
    (active_for / 8).clamp(IDLE_AFTER, MAX_CHECK)
}

/// The clock origin of [`Shared::last_poll`].
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// One QP as its owner and the NIC thread share it.
pub(super) struct Shared {
    core: Mutex<TcpQp>,
    /// Set by the owner while it waits for `core` (the thread gives way before its next
    /// socket call). The same flag as the state's own ([`TcpQp::preempt_flag`]).
    preempt: Arc<AtomicBool>,
    /// When the owner last called `poll_cq`, in ns after [`epoch`] (0: never).
    last_poll: AtomicU64,
    /// The thread waits on this QP's socket: the owner's next call wakes it.
    watched: AtomicBool,
    /// The thread serving the QP, once registered.
    worker: OnceLock<Arc<Worker>>,
}

/// The owner's handle of a tcp QP: forwards each [`QueuePair`] call to the state under its
/// lock. Dropping it closes the connection (see the module documentation).
pub(super) struct TcpQueuePair {
    shared: Arc<Shared>,
    /// The device's NIC; `None`: no background progress (white-box tests).
    nic: Option<Arc<Nic>>,
    /// `establish` succeeded: the next data-path call arms the QP.
    established: bool,
    /// Handed to the thread (or tried to): the owner made a data-path call after `establish`.
    armed: bool,
    /// Counted in `nic`'s live QPs.
    registered: bool,
    /// [`TcpQp::max_inline_data`], fixed at creation (read without the state's lock).
    max_inline_data: u32,
}

impl TcpQueuePair {
    /// A handle over `core`, serviced by `nic` once established.
    pub(super) fn new(core: TcpQp, nic: Option<Arc<Nic>>) -> TcpQueuePair {
        let _ = epoch(); // set before any poll it measures
        let preempt = core.preempt_flag();
        let max_inline_data = core.max_inline_data();
        TcpQueuePair {
            shared: Arc::new(Shared {
                core: Mutex::new(core),
                preempt,
                last_poll: AtomicU64::new(0),
                watched: AtomicBool::new(false),
                worker: OnceLock::new(),
            }),
            nic,
            established: false,
            armed: false,
            registered: false,
            max_inline_data,
        }
    }

    /// At `handshake_complete` or the owner's first data-path call after `establish` (a post,
    /// a poll, a batch, goodbye), whichever comes first, hands the QP to the thread. Not at
    /// `establish` itself: until then the caller may still use the stream for the rest of its
    /// handshake (the plugin's acceptor reads the connector's "ready" message from it after
    /// `establish`), and the thread must not read those bytes as frames. One branch on the
    /// hot path.
    fn arm(&mut self) {
        if self.armed || !self.established {
            return;
        }
        self.armed = true;
        if let Some(nic) = &self.nic {
            self.registered = nic.register(&self.shared);
        }
    }

    /// The state, for the owner: an uncontended `try_lock` while the thread is away;
    /// otherwise the thread is asked to give way and the owner waits for it (at most one
    /// non-blocking socket call).
    fn core(&self) -> MutexGuard<'_, TcpQp> {
        match self.shared.core.try_lock() {
            Ok(g) => g,
            // A panic inside the state is caught where it happens (the thread) or ends the
            // owner's call; the state is used as is, like the registry's.
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => {
                self.shared.preempt.store(true, Ordering::Relaxed);
                let g = self.shared.core.lock().unwrap_or_else(|e| e.into_inner());
                self.shared.preempt.store(false, Ordering::Relaxed);
                g
            }
        }
    }

    /// After an owner's call: if the thread was waiting on this QP's socket, wake it so that
    /// it sees the owner back (and what the call changed). Once per return of the owner.
    fn wake_if_watched(&self) {
        if self.shared.watched.load(Ordering::Relaxed)
            && self.shared.watched.swap(false, Ordering::Relaxed)
        {
            if let Some(w) = self.shared.worker.get() {
                w.wake();
            }
        }
    }

    /// The shared state (tests: what the thread still holds).
    #[cfg(test)]
    pub(super) fn shared(&self) -> Weak<Shared> {
        Arc::downgrade(&self.shared)
    }

    /// Whether the thread waits on this QP's socket (tests).
    #[cfg(test)]
    pub(super) fn watched(&self) -> bool {
        self.shared.watched.load(Ordering::Relaxed)
    }

    /// Runs `f` on the state (tests).
    #[cfg(test)]
    pub(super) fn with_core<R>(&self, f: impl FnOnce(&mut TcpQp) -> R) -> R {
        f(&mut self.core())
    }
}

impl QueuePair for TcpQueuePair {
    fn local_info(&self) -> Vec<u8> {
        self.core().local_info()
    }

    fn establish(&mut self, remote: &[u8], oob: TcpStream) -> Result<()> {
        self.core().establish(remote, oob)?;
        self.established = true;
        Ok(())
    }

    fn listen_data(&mut self, local: std::net::IpAddr) -> Result<()> {
        self.core().listen_data(local)
    }

    fn establish_data(&mut self, remote: &[u8]) -> Result<()> {
        self.core().establish_data(remote)?;
        self.established = true;
        Ok(())
    }

    fn handshake_complete(&mut self) {
        self.arm();
    }

    fn post_send(&mut self, wrs: &[SendWr]) -> Result<()> {
        let r = self.core().post_send(wrs);
        self.wake_if_watched();
        self.arm();
        r
    }

    fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<()> {
        let r = self.core().post_recv(wrs);
        self.wake_if_watched();
        self.arm();
        r
    }

    fn poll_cq(&mut self, out: &mut Vec<Wc>, max: usize) -> Result<usize> {
        let mut core = self.core();
        let r = core.poll_cq(out, max);
        let at = core.last_poll().unwrap_or_else(Instant::now);
        drop(core);
        // A plain store (one writer), of the time the poll read anyway: the thread reads it
        // between rounds.
        let ns = at.saturating_duration_since(epoch()).as_nanos();
        self.shared.last_poll.store(
            u64::try_from(ns).unwrap_or(u64::MAX).max(1),
            Ordering::Relaxed,
        );
        self.wake_if_watched();
        self.arm();
        r
    }

    fn batches(&self) -> bool {
        true
    }

    fn begin_batch(&mut self) {
        self.core().begin_batch();
        self.arm();
    }

    fn end_batch(&mut self) {
        self.core().end_batch();
        self.wake_if_watched();
        self.arm();
    }

    fn goodbye(&mut self) {
        self.core().goodbye();
        self.wake_if_watched();
        self.arm();
    }

    fn peer_closed(&self) -> bool {
        self.core().peer_closed()
    }

    fn peer_closed_orderly(&self) -> bool {
        self.core().peer_closed_orderly()
    }

    fn peer_gone_reason(&self) -> Option<&'static str> {
        self.core().peer_gone_reason()
    }

    fn counters(&self) -> QpCounters {
        self.core().counters()
    }

    fn max_inline_data(&self) -> u32 {
        self.max_inline_data
    }
}

impl Drop for TcpQueuePair {
    /// Closes the connection now (a `shutdown`, so the peer sees EOF even while the thread's
    /// wait still holds the socket) and lets the thread go: it stops when this was the
    /// device's last QP.
    fn drop(&mut self) {
        let stream = self.core().take_stream();
        if let Some(s) = stream {
            let _ = s.shutdown(Shutdown::Both);
        }
        if self.registered {
            if let Some(nic) = &self.nic {
                nic.unregister();
            }
        }
    }
}

/// A device's NIC: its thread while it has established QPs.
pub(super) struct Nic {
    /// Device name, for the thread's name and logs.
    dev: String,
    state: Mutex<Option<Running>>,
}

struct Running {
    worker: Arc<Worker>,
    thread: JoinHandle<()>,
    /// Registered QPs not yet dropped.
    live: usize,
}

/// What the owners share with one running thread.
pub(super) struct Worker {
    stop: AtomicBool,
    /// QPs registered since the thread's last round.
    new: Mutex<Vec<Weak<Shared>>>,
    /// Written to wake the thread (non-blocking; a full socket already means "wake").
    waker: UnixStream,
    /// Times the thread returned from `poll(2)` (tests).
    wakeups: AtomicU64,
}

impl Worker {
    fn wake(&self) {
        let _ = (&self.waker).write(&[1]);
    }
}

impl Nic {
    /// The NIC of device `dev`; no thread runs until a QP is established.
    pub(super) fn new(dev: String) -> Arc<Nic> {
        Arc::new(Nic {
            dev,
            state: Mutex::new(None),
        })
    }

    fn state(&self) -> MutexGuard<'_, Option<Running>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands an established QP to the thread, starting it if needed. False (with a warning)
    /// when no thread could be started: the QP then progresses only while its owner polls.
    fn register(&self, qp: &Arc<Shared>) -> bool {
        let mut st = self.state();
        if st.is_none() {
            match self.start() {
                Ok(r) => *st = Some(r),
                Err(e) => {
                    warn!(
                        dev = %self.dev,
                        "cannot start the tcp transport's progress thread ({e}): its QPs \
                         progress only while their owner polls"
                    );
                    return false;
                }
            }
        }
        let Some(r) = st.as_mut() else {
            return false;
        };
        r.live += 1;
        let _ = qp.worker.set(Arc::clone(&r.worker));
        r.worker
            .new
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(qp));
        r.worker.wake();
        true
    }

    /// A registered QP was dropped; the last one stops the thread and waits for it to end
    /// (it ends within one round: it is woken, and never blocks on an owner).
    fn unregister(&self) {
        let ending = {
            let mut st = self.state();
            match st.as_mut() {
                Some(r) if r.live > 1 => {
                    r.live -= 1;
                    None
                }
                Some(_) => st.take(),
                None => None,
            }
        };
        if let Some(r) = ending {
            r.worker.stop.store(true, Ordering::Release);
            r.worker.wake();
            if r.thread.join().is_err() {
                warn!(dev = %self.dev, "the tcp progress thread had panicked");
            }
            debug!(dev = %self.dev, "tcp progress thread stopped (no QP left)");
        }
    }

    fn start(&self) -> io::Result<Running> {
        let (rx, tx) = UnixStream::pair()?;
        rx.set_nonblocking(true)?;
        tx.set_nonblocking(true)?;
        let worker = Arc::new(Worker {
            stop: AtomicBool::new(false),
            new: Mutex::new(Vec::new()),
            waker: tx,
            wakeups: AtomicU64::new(0),
        });
        let w = Arc::clone(&worker);
        // Linux thread names hold 15 bytes.
        let name: String = format!("vnet-{}-nic", self.dev).chars().take(15).collect();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || run(&w, &rx))?;
        debug!(dev = %self.dev, "tcp progress thread started");
        Ok(Running {
            worker,
            thread,
            live: 0,
        })
    }

    /// Whether the thread runs (tests).
    #[cfg(test)]
    pub(super) fn running(&self) -> bool {
        self.state().is_some()
    }

    /// The thread's wakeups so far (tests); `None` when it does not run.
    #[cfg(test)]
    pub(super) fn wakeups(&self) -> Option<u64> {
        self.state()
            .as_ref()
            .map(|r| r.worker.wakeups.load(Ordering::Relaxed))
    }
}

/// A QP as the thread tracks it.
struct Watched {
    qp: Weak<Shared>,
    /// When the thread got it (an owner that never polled counts as active until then).
    since: Instant,
    /// Start of the owner's current run of activity, as the checks saw it; `None` while idle.
    streak: Option<Instant>,
}

impl Watched {
    /// The owner is active at `now`: when to look again.
    fn next_check(&mut self, now: Instant) -> Instant {
        let start = *self.streak.get_or_insert(now);
        now + check_after(now.saturating_duration_since(start))
    }
}

/// The thread: rounds of "service every idle QP, then wait" until stopped.
fn run(worker: &Worker, waker: &UnixStream) {
    let mut qps: Vec<Watched> = Vec::new();
    let mut warned_poll = false;
    while !worker.stop.load(Ordering::Acquire) {
        let now = Instant::now();
        qps.extend(
            worker
                .new
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .drain(..)
                .map(|qp| Watched {
                    qp,
                    since: now,
                    streak: None,
                }),
        );
        let mut wake_at: Option<Instant> = None;
        let mut earliest = |t: Instant| {
            wake_at = Some(wake_at.map_or(t, |w| w.min(t)));
        };
        let mut waits: Vec<(Arc<TcpStream>, PollFlags)> = Vec::new();
        qps.retain_mut(|w| {
            let Some(qp) = w.qp.upgrade() else {
                return false; // dropped by its owner
            };
            let last_poll = match qp.last_poll.load(Ordering::Relaxed) {
                0 => w.since,
                ns => (epoch() + Duration::from_nanos(ns)).max(w.since),
            };
            let idle_at = last_poll + IDLE_AFTER;
            if now < idle_at {
                let next = w.next_check(now);
                earliest(next.max(idle_at));
                return true;
            }
            let mut core = match qp.core.try_lock() {
                Ok(g) => g,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                Err(TryLockError::WouldBlock) => {
                    // The owner is inside a call: active.
                    earliest(w.next_check(now));
                    return true;
                }
            };
            if core.in_batch() {
                earliest(w.next_check(now));
                return true;
            }
            w.streak = None;
            if catch_unwind(AssertUnwindSafe(|| core.service(now))).is_err() {
                warn!(
                    qp_num = core.qp_num(),
                    "the tcp progress thread caught a panic while servicing a QP"
                );
            }
            if let Some(i) = core.interest() {
                let mut flags = PollFlags::POLLIN;
                if i.write {
                    flags |= PollFlags::POLLOUT;
                }
                if let Some(d) = i.deadline {
                    // A timer already out with bytes still waiting for room: the socket's
                    // room (POLLOUT) is what lets it resend, not the clock (no spinning).
                    if !i.write || d > Instant::now() {
                        earliest(d);
                    }
                }
                waits.push((i.stream, flags));
                qp.watched.store(true, Ordering::Relaxed);
            }
            true
        });
        let timeout = match wake_at {
            None => PollTimeout::NONE,
            Some(t) => {
                // Rounded up: waking before the deadline would only spin.
                let us = t.saturating_duration_since(Instant::now()).as_micros();
                PollTimeout::try_from(us.div_ceil(1000)).unwrap_or(PollTimeout::MAX)
            }
        };
        let mut fds = Vec::with_capacity(1 + waits.len());
        fds.push(PollFd::new(waker.as_fd(), PollFlags::POLLIN));
        fds.extend(waits.iter().map(|(s, f)| PollFd::new(s.as_fd(), *f)));
        match poll(&mut fds, timeout) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => {
                if !warned_poll {
                    warned_poll = true;
                    warn!("tcp progress thread: poll(2) failed ({e}); checking every 1 ms");
                }
                std::thread::sleep(IDLE_AFTER);
            }
        }
        worker.wakeups.fetch_add(1, Ordering::Relaxed);
        let mut buf = [0u8; 64];
        while matches!((&*waker).read(&mut buf), Ok(n) if n > 0) {}
        // `fds` borrows `waits`: both end here, so no socket is held past this round.
    }
}
