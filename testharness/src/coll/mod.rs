//! Collectives as ring schedules ("plans", [`plan`]), and the per-connection proxy that executes
//! them.
//!
//! A [`Plan`] is what one rank sends to its ring successor and receives from its predecessor,
//! in order, cut into pieces of at most one proxy slot. Both neighbours derive their plans from
//! the same sizes, so rank r's sends match rank r+1's receives piece for piece.
//!
//! The proxy ([`Ring::run`]) is modelled on NCCL's net proxy: per connection [`SLOTS`] slots
//! (NCCL_STEPS) in one registered send FIFO and one registered receive FIFO; irecv is posted
//! ahead into the free receive slots; a send slot is filled ("the GPU produced it") once the
//! data it carries is available and isend is retried while the plugin returns no request; only
//! the oldest request of each direction is tested; a completed receive is consumed at once
//! (copied or reduced into the work buffer), which frees its slot for the next irecv. The
//! default, [`Proxy::Eager`], makes one step per op per pass as NCCL's proxy does (one irecv,
//! or else one test of a receive; one isend, or else one test of a send); [`Proxy::Lazy`] calls
//! the plugin in the least polite order NCCL may (every receive posted ahead, sends spun on,
//! completions consumed late).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::cli::Proxy;
use crate::data::{reduce_into, DataType, RedOp};
use crate::deviations;
use crate::plugin::{self, Fifo, Handle, ListenComm, Net, RecvComm, SendComm};

pub mod plan;

pub(crate) use plan::pieces;
pub use plan::{
    all_gather_plan, all_reduce_plan, reduce_scatter_plan, segment, sendrecv_plan, Plan, RecvOp,
    SendOp, Src,
};

/// Slots per connection direction (NCCL_STEPS).
pub const SLOTS: usize = 8;

/// Without any completion for this long, a run fails instead of hanging.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(120);

/// Without any progress for this long, an idle pass of [`Ring::run`] sleeps for [`NAP`]
/// instead of only yielding (see `idle_wait`).
pub const SPIN_BEFORE_NAP: Duration = Duration::from_micros(500);

/// How long an idle pass sleeps once [`SPIN_BEFORE_NAP`] has passed without progress.
pub const NAP: Duration = Duration::from_micros(20);

/// What an idle pass of the proxy loop does: yield for the first [`SPIN_BEFORE_NAP`] without
/// progress, then sleep [`NAP`] per pass until something moves.
///
/// Ranks are processes that may outnumber the cores (`--ranks 4` on a 2-core host), and
/// `sched_yield` gives a core to another runnable task only for a moment: a rank that keeps
/// polling while its peer has the work holds a core the peer needs, and a busy rank is
/// scheduled behind tasks that slept. Short naps leave the core to whoever produces the data
/// and cost at most about one nap of latency once the wait is already longer than the spin.
pub(crate) fn idle_wait(idle_for: Duration) {
    if idle_for < SPIN_BEFORE_NAP {
        std::thread::yield_now();
    } else {
        std::thread::sleep(NAP);
    }
}

/// How a proxy loop waits while nothing moves (`--spin N`, default 0): the first `N` idle
/// passes only spin, without a system call (perftest's loops never yield; on cores of its own
/// a rank may get its answer sooner), then each idle pass yields, and naps once
/// [`SPIN_BEFORE_NAP`] has passed (`idle_wait`). Yielding at once is the default because a
/// spinning rank holds a core its peer, another tenant or the kernel needs: measured
/// 2026-12-01, spinning 128 passes made the tcp `sendrecv` 2-3x slower on the loaded 2-core
/// host, and an 8-byte `latency` on rxe in the soft-RoCE VM 10x slower (rxe's work runs in
/// kernel context the spinning rank starves).
pub(crate) struct Idle {
    spin: u32,
    passes: u32,
    /// When the spinning ended (read only after it has).
    since: Option<Instant>,
}

impl Idle {
    /// A loop that has just moved something, spinning `spin` idle passes before yielding.
    pub(crate) fn new(spin: u32) -> Idle {
        Idle {
            spin,
            passes: 0,
            since: None,
        }
    }

    /// A pass moved something.
    pub(crate) fn progressed(&mut self) {
        self.passes = 0;
    }

    /// A pass moved nothing: spins, yields or naps. Returns how long nothing has moved
    /// (counted from the end of the spin; zero while spinning).
    pub(crate) fn wait(&mut self) -> Duration {
        self.passes = self.passes.saturating_add(1);
        if self.passes <= self.spin {
            std::hint::spin_loop();
            return Duration::ZERO;
        }
        if self.passes == self.spin + 1 {
            self.since = Some(Instant::now());
        }
        let waited = self.since.get_or_insert_with(Instant::now).elapsed();
        idle_wait(waited);
        waited
    }
}

/// How long connect/accept may take before the ring setup fails.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(120);

/// Errors of the ring.
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Checks the size `test` reported for a receive of `expected` bytes; a missing or different
/// size is a contract deviation NCCL does not depend on ([`deviations`]), not an error: the
/// data check decides whether the bytes are right. `what` names the receive.
pub(crate) fn check_size(reported: Option<usize>, expected: usize, what: impl FnOnce() -> String) {
    match reported {
        None => deviations::note(deviations::SIZE_UNWRITTEN, || {
            format!("{} ({expected} bytes sent)", what())
        }),
        Some(n) if n != expected => deviations::note(deviations::SIZE_WRONG, || {
            format!("{}: {n} bytes reported, {expected} sent", what())
        }),
        Some(_) => {}
    }
}

/// This rank's two connections (to the successor and from the predecessor) with their FIFOs.
///
/// Sends outlive the call that posted them, as in NCCL: a collective is over for its caller
/// once its last piece was received and its last send was taken by `isend` (NCCL's kernel
/// does not wait for the network to finish a send; the proxy tests it later and frees the
/// slot, `src/transport/net.cc`). The next call tests them before reusing their slots, and
/// [`Ring::drain`] waits for all of them before the rank blocks outside the plugin.
pub struct Ring<'n> {
    net: &'n Net,
    rank: usize,
    prev: usize,
    send: SendComm<'n>,
    recv: RecvComm<'n>,
    send_fifo: Fifo<'n>,
    recv_fifo: Fifo<'n>,
    /// Sends taken by `isend` and not yet tested done, oldest first (at most [`SLOTS`]).
    sends_in_flight: VecDeque<plugin::Request<'n>>,
    /// Sends taken by `isend` since the ring was made: send `k` uses slot `k % SLOTS`.
    sends_posted: usize,
    /// Idle passes spent spinning before yielding ([`Idle`]; `--spin`).
    spin: u32,
    /// Receives posted and not yet consumed, oldest first (at most [`SLOTS`]); they may belong
    /// to coming calls ([`Ring::expect_recvs`]).
    recvs_posted: VecDeque<plugin::Request<'n>>,
    /// Receives posted since the ring was made: receive `k` uses slot `k % SLOTS`.
    recvs_posted_total: usize,
    /// Receives consumed since the ring was made.
    recvs_consumed: usize,
    /// Receives the calls so far and the announced ones consume in all: the most ever posted.
    recv_budget: usize,
}

impl<'n> Ring<'n> {
    /// Connects to the successor's handle and accepts the predecessor on `listen`, polling
    /// both (neither is assumed to finish in one call), closes the listen comm right after
    /// accept, then registers one FIFO of [`SLOTS`] × `chunk` bytes per direction.
    ///
    /// # Errors
    /// Plugin errors or a timeout.
    pub fn connect(
        net: &'n Net,
        dev: i32,
        rank: usize,
        handles: &[Handle],
        listen: ListenComm<'n>,
        chunk: usize,
    ) -> Result<Ring<'n>> {
        let n = handles.len();
        let next = (rank + 1) % n;
        let prev = (rank + n - 1) % n;
        // The plugin may keep connection progress in the handle: keep the same one throughout.
        let mut handle = handles[next].clone();
        let mut listen = Some(listen);
        let mut send = None;
        let mut recv = None;
        let start = Instant::now();
        while send.is_none() || recv.is_none() {
            if send.is_none() {
                send = net.connect(dev, &mut handle)?;
            }
            if recv.is_none() {
                if let Some(l) = listen.as_mut() {
                    recv = net.accept(l)?;
                }
                if recv.is_some() {
                    if let Some(l) = listen.take() {
                        net.close_listen(l)?;
                    }
                }
            }
            if start.elapsed() > CONNECT_TIMEOUT {
                return Err(format!(
                    "rank {rank}: ring setup incomplete after {CONNECT_TIMEOUT:?}: connect to rank \
                     {next} {}, accept from rank {prev} {}",
                    if send.is_some() { "done" } else { "pending" },
                    if recv.is_some() { "done" } else { "pending" },
                )
                .into());
            }
            if send.is_none() || recv.is_none() {
                std::thread::yield_now();
            }
        }
        let (send, recv) = (send.expect("loop exit"), recv.expect("loop exit"));
        let send_fifo = net.reg_mr(&send, SLOTS, chunk)?;
        let recv_fifo = net.reg_mr(&recv, SLOTS, chunk)?;
        Ok(Ring {
            net,
            rank,
            prev,
            send,
            recv,
            send_fifo,
            recv_fifo,
            sends_in_flight: VecDeque::with_capacity(SLOTS),
            sends_posted: 0,
            spin: 0,
            recvs_posted: VecDeque::with_capacity(SLOTS),
            recvs_posted_total: 0,
            recvs_consumed: 0,
            recv_budget: 0,
        })
    }

    /// Announces that the coming calls will consume `n` more receives, as NCCL's proxy knows
    /// the operations launched ahead of the one the GPU runs (`src/transport/net.cc`:
    /// `recvProxyProgress` gives each operation its base step on the connection when the
    /// operation reaches the proxy and posts its receives from there, while earlier operations
    /// are still in progress): each call then posts receives ahead into every free slot, also
    /// for the calls after it (capacity and tag do not depend on the call), so a peer's send
    /// of the next call finds its receive posted. Never more than announced: no receive is
    /// left posted when the calls are over.
    pub fn expect_recvs(&mut self, n: usize) {
        self.recv_budget = self.recv_budget.max(self.recvs_consumed + n);
    }

    /// Idle passes to spin through before yielding (`--spin`; 0 after connect).
    pub fn set_spin(&mut self, passes: u32) {
        self.spin = passes;
    }

    /// Bytes per slot.
    pub fn chunk(&self) -> usize {
        self.send_fifo.slot_size()
    }

    /// Executes `plan` with `proxy`'s calling order: sends read `input` or `work`, receives land
    /// in `work`.
    ///
    /// # Errors
    /// Plugin errors or no progress for [`STALL_TIMEOUT`].
    pub fn run(
        &mut self,
        proxy: Proxy,
        plan: &Plan,
        input: &[u8],
        work: &mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> Result<()> {
        match proxy {
            Proxy::Eager => self.run_eager(plan, input, work, dtype, op),
            Proxy::Lazy => self.run_lazy(plan, input, work, dtype, op),
        }
    }

    /// Consumes the completed receive `idx` of `plan` from FIFO slot `slot`: copies or reduces
    /// it into `work` ("the GPU consumed it"), which frees the slot.
    #[allow(clippy::too_many_arguments)]
    fn consume(
        &self,
        plan: &Plan,
        idx: usize,
        slot: usize,
        size: Option<usize>,
        work: &mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> Result<()> {
        let r = plan.recvs[idx];
        check_size(size, r.len, || {
            format!("receive {idx} from rank {} (tag {})", self.prev, self.prev)
        });
        let data = &self
            .recv_fifo
            .slot(slot)
            .ok_or("completed receive slot still busy")?[..r.len];
        let dst = &mut work[r.off..r.off + r.len];
        if r.reduce {
            reduce_into(dtype, op, dst, data);
        } else {
            dst.copy_from_slice(data);
        }
        Ok(())
    }

    /// `--proxy lazy` ([`Proxy::Lazy`]): every free receive slot posted; then every send whose
    /// data is there isent, each retried on "retry later" without any other call; only then
    /// the receives (consumed) and the sends tested, oldest first, as far as they are done.
    ///
    /// Send `k` is attempted only while `k < c + SLOTS` (`c`: receives consumed, unless all
    /// are): a rank never spins on a piece whose receive its successor can post only after
    /// this rank consumes more. With a plugin that takes a send once its receive is posted, a
    /// rank spinning on its successor then has consumed more than that successor, which cannot
    /// hold all the way round the ring, so the spins end.
    fn run_lazy(
        &mut self,
        plan: &Plan,
        input: &[u8],
        work: &mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> Result<()> {
        let net = self.net;
        let chunk = self.chunk();
        let (tag, prev_tag) = (self.rank as i32, self.prev as i32);
        let (nsends, nrecvs) = (plan.sends.len(), plan.recvs.len());
        let base = self.sends_posted;
        let mut next_send = 0;
        self.expect_recvs(nrecvs);
        // The ring's queue; put back at the end, possibly with receives of the next calls.
        let mut recvs_posted = std::mem::take(&mut self.recvs_posted);
        let mut recvs_done = 0;
        let mut idle = Idle::new(self.spin);
        let rank = self.rank;
        let state = |what: &str, sd: usize, inflight: usize, rd: usize, posted: usize| {
            format!(
                "rank {rank}: --proxy lazy: {what}: sends {sd}/{nsends} taken by isend \
                 ({inflight} in flight), receives {rd}/{nrecvs} done ({posted} posted)"
            )
        };
        while next_send < nsends || recvs_done < nrecvs {
            let mut progressed = false;
            // 1. Receives posted ahead into every free slot.
            while self.recvs_posted_total < self.recv_budget && recvs_posted.len() < SLOTS {
                let slot = self.recvs_posted_total % SLOTS;
                match net.irecv(&mut self.recv, &mut self.recv_fifo, slot, chunk, prev_tag)? {
                    Some(req) => {
                        recvs_posted.push_back(req);
                        self.recvs_posted_total += 1;
                        progressed = true;
                    }
                    None => break,
                }
            }
            // 2. Every send whose data is there, each isend retried until taken.
            while next_send < nsends
                && self.sends_in_flight.len() < SLOTS
                && (recvs_done == nrecvs || next_send < recvs_done + SLOTS)
                && !matches!(plan.sends[next_send].after, Some(i) if i >= recvs_done)
            {
                let s = plan.sends[next_send];
                let src: &[u8] = match s.src {
                    Src::Input => input,
                    Src::Work => work,
                };
                let slot = (base + next_send) % SLOTS;
                self.send_fifo
                    .slot_mut(slot)
                    .ok_or("send slot still busy")?[..s.len]
                    .copy_from_slice(&src[s.off..s.off + s.len]);
                let mut spin = Idle::new(self.spin);
                loop {
                    if let Some(req) =
                        net.isend(&mut self.send, &mut self.send_fifo, slot, s.len, tag)?
                    {
                        self.sends_in_flight.push_back(req);
                        self.sends_posted += 1;
                        break;
                    }
                    if spin.wait() > STALL_TIMEOUT {
                        return Err(state(
                            &format!(
                                "isend {next_send} answered \"retry later\" for {STALL_TIMEOUT:?} \
                                 (the successor posts its receives ahead and tests them only after \
                                 its own sends: the plugin must take a send whose receive is \
                                 posted without the receiver calling it again)"
                            ),
                            next_send,
                            self.sends_in_flight.len(),
                            recvs_done,
                            recvs_posted.len(),
                        )
                        .into());
                    }
                }
                next_send += 1;
                progressed = true;
            }
            // 3. Completions, consumed late and in order: receives, then sends.
            while recvs_done < nrecvs {
                let Some(req) = recvs_posted.front_mut() else {
                    break;
                };
                let Some(size) = net.test(&mut self.recv_fifo, req)? else {
                    break;
                };
                let slot = req.slot();
                self.consume(plan, recvs_done, slot, size, work, dtype, op)?;
                recvs_posted.pop_front();
                recvs_done += 1;
                self.recvs_consumed += 1;
                progressed = true;
            }
            while let Some(req) = self.sends_in_flight.front_mut() {
                if net.test(&mut self.send_fifo, req)?.is_none() {
                    break;
                }
                self.sends_in_flight.pop_front();
                progressed = true;
            }
            if progressed {
                idle.progressed();
            } else if idle.wait() > STALL_TIMEOUT {
                return Err(state(
                    &format!("no progress for {STALL_TIMEOUT:?}"),
                    next_send,
                    self.sends_in_flight.len(),
                    recvs_done,
                    recvs_posted.len(),
                )
                .into());
            }
        }
        self.recvs_posted = recvs_posted;
        Ok(())
    }

    /// The default proxy ([`Proxy::Eager`]): each pass makes one step per op, as NCCL's proxy
    /// thread calls each op's progress once per loop (`src/proxy.cc`, `progressOps`) and each
    /// makes one step (`src/transport/net.cc`): the receive op posts one receive into the next
    /// free slot or, when it posted none, tests the oldest receive (consumed at once); the send
    /// op fills the next send slot once its data is there and isends it once or, when it
    /// started none, tests the oldest send.
    fn run_eager(
        &mut self,
        plan: &Plan,
        input: &[u8],
        work: &mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> Result<()> {
        let net = self.net;
        let chunk = self.chunk();
        let tag = self.rank as i32;
        let prev_tag = self.prev as i32;
        let base = self.sends_posted;
        let mut staged: Option<usize> = None;
        let mut next_send = 0;
        self.expect_recvs(plan.recvs.len());
        // The ring's queue; put back at the end, possibly with receives of the next calls.
        let mut recvs_posted = std::mem::take(&mut self.recvs_posted);
        let mut recvs_done = 0;
        let mut idle = Idle::new(self.spin);

        while next_send < plan.sends.len() || staged.is_some() || recvs_done < plan.recvs.len() {
            let mut progressed = false;

            // The receive op's step: post one receive ahead into the next free slot (of this
            // call and, as announced, of the next ones) or, only when it posted none, test the
            // oldest receive of this call and consume it at once.
            let mut recv_posted = false;
            if self.recvs_posted_total < self.recv_budget && recvs_posted.len() < SLOTS {
                let slot = self.recvs_posted_total % SLOTS;
                if let Some(req) =
                    net.irecv(&mut self.recv, &mut self.recv_fifo, slot, chunk, prev_tag)?
                {
                    recvs_posted.push_back(req);
                    self.recvs_posted_total += 1;
                    recv_posted = true;
                    progressed = true;
                }
            }
            if let Some(req) = recvs_posted
                .front_mut()
                .filter(|_| !recv_posted && recvs_done < plan.recvs.len())
            {
                if let Some(size) = net.test(&mut self.recv_fifo, req)? {
                    let slot = req.slot();
                    self.consume(plan, recvs_done, slot, size, work, dtype, op)?;
                    recvs_posted.pop_front();
                    recvs_done += 1;
                    self.recvs_consumed += 1;
                    progressed = true;
                }
            }

            // Fill the next send slot once its data is there.
            if staged.is_none()
                && next_send < plan.sends.len()
                && self.sends_in_flight.len() < SLOTS
            {
                let s = plan.sends[next_send];
                if !matches!(s.after, Some(i) if i >= recvs_done) {
                    let src: &[u8] = match s.src {
                        Src::Input => input,
                        Src::Work => work,
                    };
                    let slot = self
                        .send_fifo
                        .slot_mut((base + next_send) % SLOTS)
                        .ok_or("send slot still busy")?;
                    slot[..s.len].copy_from_slice(&src[s.off..s.off + s.len]);
                    staged = Some(next_send);
                    next_send += 1;
                }
            }

            // The send op's step: isend the filled slot (no request means "not now") or, only
            // when it started none, test the oldest send (of this call or an earlier one).
            let mut sent = false;
            if let Some(i) = staged {
                let len = plan.sends[i].len;
                if let Some(req) = net.isend(
                    &mut self.send,
                    &mut self.send_fifo,
                    (base + i) % SLOTS,
                    len,
                    tag,
                )? {
                    self.sends_in_flight.push_back(req);
                    self.sends_posted += 1;
                    staged = None;
                    sent = true;
                    progressed = true;
                }
            }
            if let Some(req) = self.sends_in_flight.front_mut().filter(|_| !sent) {
                if net.test(&mut self.send_fifo, req)?.is_some() {
                    self.sends_in_flight.pop_front();
                    progressed = true;
                }
            }

            if progressed {
                idle.progressed();
            } else if idle.wait() > STALL_TIMEOUT {
                return Err(format!(
                    "rank {}: no progress for {STALL_TIMEOUT:?}: sends {next_send}/{} staged \
                         ({} in flight, the last not yet taken: {}), receives {recvs_done}/{} \
                         done ({} posted)",
                    self.rank,
                    plan.sends.len(),
                    self.sends_in_flight.len(),
                    staged.is_some(),
                    plan.recvs.len(),
                    recvs_posted.len(),
                )
                .into());
            }
        }
        self.recvs_posted = recvs_posted;
        Ok(())
    }

    /// Tests the sends still in flight until all are done, as NCCL's proxy keeps testing
    /// them: call it before the rank blocks outside the plugin (a barrier), since a plugin
    /// may need more calls to finish a send it took.
    ///
    /// # Errors
    /// Plugin errors or no progress for [`STALL_TIMEOUT`].
    pub fn drain(&mut self) -> Result<()> {
        let net = self.net;
        let mut idle = Idle::new(self.spin);
        while let Some(req) = self.sends_in_flight.front_mut() {
            if net.test(&mut self.send_fifo, req)?.is_some() {
                self.sends_in_flight.pop_front();
                idle.progressed();
                continue;
            }
            if idle.wait() > STALL_TIMEOUT {
                return Err(format!(
                    "rank {}: {} send(s) not done after {STALL_TIMEOUT:?} (the receiver has \
                     consumed them: the plugin did not complete the send)",
                    self.rank,
                    self.sends_in_flight.len()
                )
                .into());
            }
        }
        Ok(())
    }

    /// Waits for the sends in flight ([`Ring::drain`]), deregMr both FIFOs, then closeSend and
    /// closeRecv.
    ///
    /// # Errors
    /// Plugin errors.
    pub fn close(mut self) -> Result<()> {
        self.drain()?;
        let Ring {
            net,
            send,
            recv,
            send_fifo,
            recv_fifo,
            ..
        } = self;
        net.dereg_mr(&send, send_fifo)?;
        net.dereg_mr(&recv, recv_fifo)?;
        net.close_send(send)?;
        net.close_recv(recv)?;
        Ok(())
    }
}
