//! Collectives as ring schedules ("plans"), and the per-connection proxy that executes them.
//!
//! A [`Plan`] is what one rank sends to its ring successor and receives from its predecessor,
//! in order, cut into pieces of at most one proxy slot. Both neighbours derive their plans from
//! the same sizes, so rank r's sends match rank r+1's receives piece for piece.
//!
//! The proxy ([`Ring::run`]) is modelled on NCCL's net proxy: per connection [`SLOTS`] slots
//! (NCCL_STEPS) in one registered send FIFO and one registered receive FIFO; irecv is posted
//! ahead into every free receive slot; a send slot is filled ("the GPU produced it") once the
//! data it carries is available and isend is retried while the plugin returns no request; only
//! the oldest request of each direction is tested; a completed receive is consumed at once
//! (copied or reduced into the work buffer), which frees its slot for the next irecv. That is
//! the default, [`Proxy::Eager`]; [`Proxy::Lazy`] calls the plugin in the least polite order
//! NCCL may (every receive posted ahead, sends spun on, completions consumed late).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::cli::Proxy;
use crate::data::{reduce_into, DataType, RedOp};
use crate::deviations;
use crate::plugin::{self, Fifo, Handle, ListenComm, Net, RecvComm, SendComm};

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

/// How long connect/accept may take before the ring setup fails.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(120);

/// Where a send takes its bytes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Src {
    /// The read-only input buffer.
    Input,
    /// The work buffer (results of earlier receives).
    Work,
}

/// One piece sent to the successor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendOp {
    /// Source buffer.
    pub src: Src,
    /// Byte offset in it.
    pub off: usize,
    /// Bytes (1..=slot size).
    pub len: usize,
    /// Index of the receive that must have completed first (the data it forwards).
    pub after: Option<usize>,
}

/// One piece received from the predecessor into the work buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvOp {
    /// Byte offset in the work buffer.
    pub off: usize,
    /// Bytes.
    pub len: usize,
    /// Reduce into the work buffer (else overwrite).
    pub reduce: bool,
}

/// One rank's schedule for one collective call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Sends, in posting order.
    pub sends: Vec<SendOp>,
    /// Receives, in posting order.
    pub recvs: Vec<RecvOp>,
}

/// `[start, end)` in elements of segment `j` when `count` elements are split into `n` parts.
pub fn segment(count: usize, n: usize, j: usize) -> (usize, usize) {
    (j * count / n, (j + 1) * count / n)
}

/// Cuts `[off, off+len)` into pieces of at most `chunk` bytes.
pub(crate) fn pieces(off: usize, len: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len.div_ceil(chunk)).map(move |i| {
        let o = i * chunk;
        (off + o, chunk.min(len - o))
    })
}

/// Builder for ring plans: each step sends one byte range and receives another; a step's sends
/// may depend on the previous step's receives piece by piece.
struct RingSteps {
    plan: Plan,
    chunk: usize,
    /// Receive op indices of the previous step.
    prev_recvs: Vec<usize>,
}

impl RingSteps {
    /// Pieces are whole elements: `chunk` is rounded down to a multiple of `es` (at least one).
    fn new(chunk: usize, es: usize) -> RingSteps {
        RingSteps {
            plan: Plan::default(),
            chunk: (chunk - chunk % es).max(es),
            prev_recvs: Vec::new(),
        }
    }

    /// Adds one step. `forward`: the sent range is the range received in the previous step,
    /// so each send piece waits for the matching receive piece.
    fn step(
        &mut self,
        src: Src,
        send: (usize, usize),
        recv: (usize, usize),
        reduce: bool,
        forward: bool,
    ) {
        for (i, (off, len)) in pieces(send.0, send.1, self.chunk).enumerate() {
            let after = if forward {
                Some(self.prev_recvs[i])
            } else {
                None
            };
            self.plan.sends.push(SendOp {
                src,
                off,
                len,
                after,
            });
        }
        self.prev_recvs.clear();
        for (off, len) in pieces(recv.0, recv.1, self.chunk) {
            self.prev_recvs.push(self.plan.recvs.len());
            self.plan.recvs.push(RecvOp { off, len, reduce });
        }
    }
}

fn modn(x: isize, n: usize) -> usize {
    x.rem_euclid(n as isize) as usize
}

/// Byte range of segment `j` (elements split over `n`, element size `es`).
fn seg_bytes(count: usize, n: usize, j: usize, es: usize) -> (usize, usize) {
    let (a, b) = segment(count, n, j);
    (a * es, (b - a) * es)
}

/// Ring all-reduce of `count` elements in the work buffer: reduce-scatter (n-1 steps, rank r
/// ends owning segment r+1), then all-gather (n-1 steps), as NCCL's ring does.
pub fn all_reduce_plan(count: usize, es: usize, rank: usize, n: usize, chunk: usize) -> Plan {
    let mut b = RingSteps::new(chunk, es);
    let r = rank as isize;
    for k in 0..n.saturating_sub(1) as isize {
        let send = seg_bytes(count, n, modn(r - k, n), es);
        let recv = seg_bytes(count, n, modn(r - k - 1, n), es);
        b.step(Src::Work, send, recv, true, k > 0);
    }
    for k in 0..n.saturating_sub(1) as isize {
        let send = seg_bytes(count, n, modn(r + 1 - k, n), es);
        let recv = seg_bytes(count, n, modn(r - k, n), es);
        b.step(Src::Work, send, recv, false, true);
    }
    b.plan
}

/// Ring all-gather: the work buffer holds `n` blocks of `per` elements, this rank's own block
/// already in place; n-1 steps forward the block received last.
pub fn all_gather_plan(per: usize, es: usize, rank: usize, n: usize, chunk: usize) -> Plan {
    let mut b = RingSteps::new(chunk, es);
    let r = rank as isize;
    let block = |j: usize| (j * per * es, per * es);
    for k in 0..n.saturating_sub(1) as isize {
        b.step(
            Src::Work,
            block(modn(r - k, n)),
            block(modn(r - k - 1, n)),
            false,
            k > 0,
        );
    }
    b.plan
}

/// Ring reduce-scatter: the work buffer holds this rank's `n` input blocks of `per` elements;
/// after n-1 steps block `rank` holds the reduction over all ranks.
pub fn reduce_scatter_plan(per: usize, es: usize, rank: usize, n: usize, chunk: usize) -> Plan {
    let mut b = RingSteps::new(chunk, es);
    let r = rank as isize;
    let block = |j: usize| (j * per * es, per * es);
    for k in 0..n.saturating_sub(1) as isize {
        b.step(
            Src::Work,
            block(modn(r - k - 1, n)),
            block(modn(r - k - 2, n)),
            true,
            k > 0,
        );
    }
    b.plan
}

/// Send all `bytes` of the input to the successor, receive as many from the predecessor.
pub fn sendrecv_plan(bytes: usize, chunk: usize) -> Plan {
    let mut b = RingSteps::new(chunk, 1);
    b.step(Src::Input, (0, bytes), (0, bytes), false, false);
    b.plan
}

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
pub struct Ring<'n> {
    net: &'n Net,
    rank: usize,
    prev: usize,
    send: SendComm<'n>,
    recv: RecvComm<'n>,
    send_fifo: Fifo<'n>,
    recv_fifo: Fifo<'n>,
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
        })
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
        let mut sends_in_flight: VecDeque<plugin::Request<'n>> = VecDeque::new();
        let (mut next_send, mut sends_done) = (0, 0);
        let mut recvs_posted: VecDeque<(plugin::Request<'n>, usize)> = VecDeque::new();
        let (mut next_recv, mut recvs_done) = (0, 0);
        let mut last_progress = Instant::now();
        let state = |what: &str, sd: usize, inflight: usize, rd: usize, posted: usize| {
            format!(
                "rank {}: --proxy lazy: {what}: sends {sd}/{nsends} done ({inflight} in flight), \
                 receives {rd}/{nrecvs} done ({posted} posted)",
                self.rank
            )
        };
        while sends_done < nsends || recvs_done < nrecvs {
            let mut progressed = false;
            // 1. Receives posted ahead into every free slot.
            while next_recv < nrecvs && recvs_posted.len() < SLOTS {
                let slot = next_recv % SLOTS;
                match net.irecv(&mut self.recv, &mut self.recv_fifo, slot, chunk, prev_tag)? {
                    Some(req) => {
                        recvs_posted.push_back((req, next_recv));
                        next_recv += 1;
                        progressed = true;
                    }
                    None => break,
                }
            }
            // 2. Every send whose data is there, each isend retried until taken.
            while next_send < nsends
                && sends_in_flight.len() < SLOTS
                && (recvs_done == nrecvs || next_send < recvs_done + SLOTS)
                && !matches!(plan.sends[next_send].after, Some(i) if i >= recvs_done)
            {
                let s = plan.sends[next_send];
                let src: &[u8] = match s.src {
                    Src::Input => input,
                    Src::Work => work,
                };
                let slot = next_send % SLOTS;
                self.send_fifo
                    .slot_mut(slot)
                    .ok_or("send slot still busy")?[..s.len]
                    .copy_from_slice(&src[s.off..s.off + s.len]);
                let spin = Instant::now();
                loop {
                    if let Some(req) =
                        net.isend(&mut self.send, &mut self.send_fifo, slot, s.len, tag)?
                    {
                        sends_in_flight.push_back(req);
                        break;
                    }
                    if spin.elapsed() > STALL_TIMEOUT {
                        return Err(state(
                            &format!(
                                "isend {next_send} answered \"retry later\" for {STALL_TIMEOUT:?} \
                                 (the successor posts its receives ahead and tests them only after \
                                 its own sends: the plugin must take a send whose receive is \
                                 posted without the receiver calling it again)"
                            ),
                            sends_done,
                            sends_in_flight.len(),
                            recvs_done,
                            recvs_posted.len(),
                        )
                        .into());
                    }
                    idle_wait(spin.elapsed());
                }
                next_send += 1;
                progressed = true;
            }
            // 3. Completions, consumed late and in order: receives, then sends.
            while let Some((req, idx)) = recvs_posted.front_mut() {
                let Some(size) = net.test(&mut self.recv_fifo, req)? else {
                    break;
                };
                let (slot, idx) = (req.slot(), *idx);
                self.consume(plan, idx, slot, size, work, dtype, op)?;
                recvs_posted.pop_front();
                recvs_done += 1;
                progressed = true;
            }
            while let Some(req) = sends_in_flight.front_mut() {
                if net.test(&mut self.send_fifo, req)?.is_none() {
                    break;
                }
                sends_in_flight.pop_front();
                sends_done += 1;
                progressed = true;
            }
            if progressed {
                last_progress = Instant::now();
            } else {
                if last_progress.elapsed() > STALL_TIMEOUT {
                    return Err(state(
                        &format!("no progress for {STALL_TIMEOUT:?}"),
                        sends_done,
                        sends_in_flight.len(),
                        recvs_done,
                        recvs_posted.len(),
                    )
                    .into());
                }
                idle_wait(last_progress.elapsed());
            }
        }
        Ok(())
    }

    /// The default proxy ([`Proxy::Eager`]): each pass posts receives into free slots, tests
    /// the oldest receive (consumed at once), fills and isends the next send once, and tests
    /// the oldest send.
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
        let mut sends_in_flight: VecDeque<plugin::Request<'n>> = VecDeque::new();
        let mut staged: Option<usize> = None;
        let mut next_send = 0;
        let mut sends_done = 0;
        let mut recvs_posted: VecDeque<(plugin::Request<'n>, usize)> = VecDeque::new();
        let mut next_recv = 0;
        let mut recvs_done = 0;
        let mut last_progress = Instant::now();
        let mut idle: u32 = 0;

        while sends_done < plan.sends.len() || recvs_done < plan.recvs.len() {
            let mut progressed = false;

            // Post receives ahead into every free slot.
            while next_recv < plan.recvs.len() && recvs_posted.len() < SLOTS {
                let slot = next_recv % SLOTS;
                let posted =
                    net.irecv(&mut self.recv, &mut self.recv_fifo, slot, chunk, prev_tag)?;
                match posted {
                    Some(req) => {
                        recvs_posted.push_back((req, next_recv));
                        next_recv += 1;
                        progressed = true;
                    }
                    None => break,
                }
            }

            // Test the oldest receive; consume it at once.
            if let Some((req, idx)) = recvs_posted.front_mut() {
                if let Some(size) = net.test(&mut self.recv_fifo, req)? {
                    let (slot, idx) = (req.slot(), *idx);
                    self.consume(plan, idx, slot, size, work, dtype, op)?;
                    recvs_posted.pop_front();
                    recvs_done += 1;
                    progressed = true;
                }
            }

            // Fill the next send slot once its data is there.
            if staged.is_none() && next_send < plan.sends.len() && sends_in_flight.len() < SLOTS {
                let s = plan.sends[next_send];
                if !matches!(s.after, Some(i) if i >= recvs_done) {
                    let src: &[u8] = match s.src {
                        Src::Input => input,
                        Src::Work => work,
                    };
                    let slot = self
                        .send_fifo
                        .slot_mut(next_send % SLOTS)
                        .ok_or("send slot still busy")?;
                    slot[..s.len].copy_from_slice(&src[s.off..s.off + s.len]);
                    staged = Some(next_send);
                    next_send += 1;
                }
            }

            // isend the filled slot; no request means "not now".
            if let Some(i) = staged {
                let len = plan.sends[i].len;
                if let Some(req) =
                    net.isend(&mut self.send, &mut self.send_fifo, i % SLOTS, len, tag)?
                {
                    sends_in_flight.push_back(req);
                    staged = None;
                    progressed = true;
                }
            }

            // Test the oldest send.
            if let Some(req) = sends_in_flight.front_mut() {
                if net.test(&mut self.send_fifo, req)?.is_some() {
                    sends_in_flight.pop_front();
                    sends_done += 1;
                    progressed = true;
                }
            }

            if progressed {
                last_progress = Instant::now();
                idle = 0;
            } else {
                idle += 1;
                if idle & 1023 == 0 && last_progress.elapsed() > STALL_TIMEOUT {
                    return Err(format!(
                        "rank {}: no progress for {STALL_TIMEOUT:?}: sends {sends_done}/{} done \
                         ({} in flight, staged {}), receives {recvs_done}/{} done ({} posted)",
                        self.rank,
                        plan.sends.len(),
                        sends_in_flight.len(),
                        staged.is_some(),
                        plan.recvs.len(),
                        recvs_posted.len(),
                    )
                    .into());
                }
                // Other ranks (and the plugin's threads) may need this core.
                idle_wait(last_progress.elapsed());
            }
        }
        Ok(())
    }

    /// deregMr both FIFOs, then closeSend and closeRecv.
    ///
    /// # Errors
    /// Plugin errors.
    pub fn close(self) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{count_wrong, Expected, Pattern};

    /// Runs the plans of all ranks against each other in memory (each rank's sends are its
    /// successor's receives, in order), honouring the send dependencies, and returns the work
    /// buffers. This checks the schedules, not the plugin.
    fn simulate(
        plans: &[Plan],
        inputs: &[Vec<u8>],
        mut works: Vec<Vec<u8>>,
        dtype: DataType,
        op: RedOp,
    ) -> Vec<Vec<u8>> {
        let n = plans.len();
        // Next send index per rank, next recv index per rank.
        let mut ns = vec![0; n];
        let mut nr = vec![0; n];
        loop {
            let mut moved = false;
            for r in 0..n {
                let next = (r + 1) % n;
                while ns[r] < plans[r].sends.len() {
                    let s = plans[r].sends[ns[r]];
                    if s.after.is_some_and(|i| i >= nr[r]) {
                        break;
                    }
                    let src = match s.src {
                        Src::Input => inputs[r][s.off..s.off + s.len].to_vec(),
                        Src::Work => works[r][s.off..s.off + s.len].to_vec(),
                    };
                    let rv = plans[next].recvs[nr[next]];
                    assert_eq!(
                        rv.len, s.len,
                        "send {} of rank {r} vs recv of {next}",
                        ns[r]
                    );
                    let dst = &mut works[next][rv.off..rv.off + rv.len];
                    if rv.reduce {
                        reduce_into(dtype, op, dst, &src);
                    } else {
                        dst.copy_from_slice(&src);
                    }
                    ns[r] += 1;
                    nr[next] += 1;
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
        for r in 0..n {
            assert_eq!(ns[r], plans[r].sends.len(), "rank {r} stuck");
            assert_eq!(nr[r], plans[r].recvs.len(), "rank {r} stuck");
        }
        works
    }

    fn filled(p: &Pattern, rank: usize, elems: usize, first: usize) -> Vec<u8> {
        let mut b = vec![0u8; elems * p.dtype.size()];
        p.fill(&mut b, rank, first);
        b
    }

    #[test]
    fn segments_cover_everything() {
        for count in [0, 1, 5, 7, 100] {
            for n in 1..6 {
                let mut end = 0;
                for j in 0..n {
                    let (a, b) = segment(count, n, j);
                    assert_eq!(a, end);
                    end = b;
                }
                assert_eq!(end, count);
            }
        }
        let p: Vec<_> = pieces(10, 25, 10).collect();
        assert_eq!(p, vec![(10, 10), (20, 10), (30, 5)]);
        assert_eq!(pieces(0, 0, 10).count(), 0);
    }

    #[test]
    fn all_reduce_plans_compute_the_reduction() {
        for (n, count, chunk) in [
            (1, 10, 8),
            (2, 11, 8),
            (3, 100, 12),
            (4, 1000, 64),
            (5, 3, 4),
        ] {
            for op in [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max] {
                let dtype = DataType::Float;
                let p = Pattern { dtype, op, seed: 9 };
                let plans: Vec<_> = (0..n)
                    .map(|r| all_reduce_plan(count, 4, r, n, chunk))
                    .collect();
                let works = (0..n).map(|r| filled(&p, r, count, 0)).collect();
                let out = simulate(&plans, &vec![vec![]; n], works, dtype, op);
                for (r, w) in out.iter().enumerate() {
                    let wrong = count_wrong(dtype, w, |i| Expected::Reduced {
                        pattern: p,
                        nranks: n,
                        index: i,
                    });
                    assert_eq!(wrong, 0, "n={n} count={count} op={op} rank {r}");
                }
            }
        }
    }

    #[test]
    fn all_gather_plans_collect_every_block() {
        for (n, per, chunk) in [(1, 4, 8), (2, 5, 8), (3, 33, 16), (4, 0, 8)] {
            let dtype = DataType::Int32;
            let p = Pattern {
                dtype,
                op: RedOp::Sum,
                seed: 1,
            };
            let plans: Vec<_> = (0..n)
                .map(|r| all_gather_plan(per, 4, r, n, chunk))
                .collect();
            let works = (0..n)
                .map(|r| {
                    let mut w = vec![0xEEu8; n * per * 4];
                    p.fill(&mut w[r * per * 4..(r + 1) * per * 4], r, 0);
                    w
                })
                .collect();
            let out = simulate(&plans, &vec![vec![]; n], works, dtype, RedOp::Sum);
            for w in &out {
                let wrong = count_wrong(dtype, w, |i| Expected::Input {
                    pattern: p,
                    rank: i / per,
                    index: i % per,
                });
                assert_eq!(wrong, 0, "n={n} per={per}");
            }
        }
    }

    #[test]
    fn reduce_scatter_plans_leave_each_rank_its_block() {
        for (n, per, chunk) in [(1, 4, 8), (2, 5, 8), (3, 33, 16), (4, 17, 24)] {
            let dtype = DataType::Float64;
            let p = Pattern {
                dtype,
                op: RedOp::Sum,
                seed: 2,
            };
            let plans: Vec<_> = (0..n)
                .map(|r| reduce_scatter_plan(per, 8, r, n, chunk))
                .collect();
            let works = (0..n).map(|r| filled(&p, r, n * per, 0)).collect();
            let out = simulate(&plans, &vec![vec![]; n], works, dtype, RedOp::Sum);
            for (r, w) in out.iter().enumerate() {
                let mine = &w[r * per * 8..(r + 1) * per * 8];
                let wrong = count_wrong(dtype, mine, |i| Expected::Reduced {
                    pattern: p,
                    nranks: n,
                    index: r * per + i,
                });
                assert_eq!(wrong, 0, "n={n} per={per} rank {r}");
            }
        }
    }

    #[test]
    fn sendrecv_plans_shift_by_one() {
        let n = 3;
        let dtype = DataType::Float;
        let p = Pattern {
            dtype,
            op: RedOp::Sum,
            seed: 5,
        };
        let plans: Vec<_> = (0..n).map(|_| sendrecv_plan(40, 16)).collect();
        let inputs: Vec<_> = (0..n).map(|r| filled(&p, r, 10, 0)).collect();
        let out = simulate(&plans, &inputs, vec![vec![0; 40]; n], dtype, RedOp::Sum);
        for (r, w) in out.iter().enumerate() {
            assert_eq!(w, &inputs[(r + n - 1) % n]);
        }
    }

    #[test]
    fn forwarded_sends_wait_for_their_receive() {
        let plan = all_reduce_plan(64, 4, 0, 4, 8);
        for s in &plan.sends {
            if let Some(i) = s.after {
                let rv = plan.recvs[i];
                assert_eq!((rv.off, rv.len), (s.off, s.len));
            }
        }
        // 2(n-1) = 6 steps of one 64-byte segment (16 elements) in 8 pieces of 8 bytes.
        assert_eq!(plan.sends.len(), 48);
        assert_eq!(plan.recvs.len(), 48);
        assert_eq!(plan.sends.iter().filter(|s| s.after.is_none()).count(), 8);
    }
}
