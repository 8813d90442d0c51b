//! The receive queue of a receive engine: how many receive WRs it keeps posted (batches, the
//! low-water mark, growing from the driver's pool when it runs dry, shrinking when idle),
//! the zero-length WRs that cover posted receives, and the credits returned to the sender.
//! The depth rules are documented on each function; the protocol on [`crate::engine`].

use super::RecvEngine;
use crate::engine::wire;
use crate::engine::{
    stage_sge, wr_id, Action, BounceSource, WrKind, CTRL_SIGNAL_EVERY, CTRL_STAGE_SLOTS,
    MAX_SPECULATIVE, MAX_ZERO_WRS, ZERO_BATCH,
};
use crate::transport::{RecvWr, SendOpcode, SendWr, Sge};

impl RecvEngine {
    /// Receive WRs per post call at the current depth: `rq_batch` at full depth, at most half
    /// the depth below it (so a small queue is refilled before it runs dry under one message
    /// at a time, and running dry means more messages in flight than the depth).
    pub(super) fn batch(&self) -> u32 {
        if self.target >= self.p.rq_depth {
            self.p.rq_batch
        } else {
            self.p.rq_batch.min(self.target / 2).max(1)
        }
    }

    /// The refill mark: `rq_low_water` at full depth; below it, as soon as one batch fits.
    fn low_water(&self) -> u32 {
        if self.target >= self.p.rq_depth {
            self.p.rq_low_water
        } else {
            (self.target + 1 - self.batch()).max(1)
        }
    }

    /// Address and lkey of bounce buffer `id`.
    pub(super) fn buf(&self, id: u32) -> Option<(u64, u32)> {
        if id < self.p.rq_min {
            Some((
                self.p.bounce.0 + u64::from(id) * self.bounce_stride(),
                self.p.bounce.1,
            ))
        } else {
            self.extra
                .get((id - self.p.rq_min) as usize)
                .copied()
                .flatten()
        }
    }

    /// Bytes of registered memory this comm holds: its bounce buffers, the record ring and the
    /// control staging slots.
    pub fn pinned_bytes(&self) -> u64 {
        u64::from(self.owned) * self.bounce_stride() + self.p.fixed_bytes()
    }

    pub(super) fn account(&mut self) {
        self.stats.rq_depth = u64::from(self.target);
        self.stats.pinned_bytes = self.pinned_bytes();
    }

    /// Bounce buffers from the driver's pool, answering what `grow` asked for (`bufs` may be
    /// fewer than asked, or none: the pool is exhausted; the depth then stays where it is and
    /// a credit-gated sender waits for credits, it never meets RNR). Each is `EAGER_HDR_LEN +
    /// eager_buf_size` bytes (addr, lkey).
    fn add_bounce(&mut self, asked: u32, bufs: &[(u64, u32)]) {
        self.wanted = self.wanted.saturating_sub(asked);
        if (bufs.len() as u32) < asked {
            self.stats.pool_exhausted += 1;
        }
        for &b in bufs {
            let id = match self.spare.pop() {
                Some(id) => {
                    self.extra[(id - self.p.rq_min) as usize] = Some(b);
                    id
                }
                None => {
                    self.extra.push(Some(b));
                    self.p.rq_min + self.extra.len() as u32 - 1
                }
            };
            self.free_bufs.push(id);
            self.owned += 1;
        }
        if self.failed.is_none() {
            self.refill(None);
        }
        self.account();
    }

    /// Every pool buffer the comm holds (posted or not), for the driver to give back once the
    /// QP is destroyed (a closed comm's posted WRs can no longer be written).
    pub fn release_all(&mut self) -> Vec<(u64, u32)> {
        self.settled = false;
        self.free_bufs.retain(|&id| id < self.p.rq_min);
        self.spare.clear();
        self.owned = self.owned.min(self.p.rq_min);
        self.extra.drain(..).flatten().collect()
    }

    /// The RQ ran dry: double the depth (by at least a batch, up to `rq_depth`); the buffers
    /// it needs are taken from the pool at the end of this poll ([`RecvEngine::after_poll`]).
    /// Doubling reaches the full default depth from 2 in six steps, so a
    /// burst pays a few credit waits, not one per batch.
    pub(super) fn grow(&mut self, now: u64) {
        self.pressure_ns = now;
        if self.target >= self.p.rq_depth || self.wanted > 0 {
            return;
        }
        let k = self
            .target
            .max(self.p.rq_batch)
            .min(self.p.rq_depth - self.target);
        self.target += k;
        self.stats.rq_grows += 1;
        let need = self.target.saturating_sub(self.owned);
        if need > 0 {
            self.wanted = need;
        }
    }

    /// Whether the queue has been idle above its minimum for `shrink_after_ns`.
    fn shrink_due(&self, now: u64) -> bool {
        self.target > self.p.rq_min
            && now.saturating_sub(self.pressure_ns) >= self.p.shrink_after_ns
    }

    /// Idle long enough: shrink the depth by a batch (down to `rq_min`). Buffers above the
    /// depth go back to the pool as they come free; posted ones cannot be taken back (a verbs
    /// RQ has no "unpost"), so credits stay exact: a consumed WR beyond the depth is simply
    /// not re-posted, and not granted again.
    fn maybe_shrink(&mut self, now: u64) {
        if self.shrink_due(now) {
            self.target -= self.batch().min(self.target - self.p.rq_min);
            self.pressure_ns = now;
            self.stats.rq_shrinks += 1;
        }
        let mut give = Vec::new();
        while self.owned > self.target {
            let Some(pos) = self.free_bufs.iter().rposition(|&id| id >= self.p.rq_min) else {
                break;
            };
            let id = self.free_bufs.swap_remove(pos);
            let idx = (id - self.p.rq_min) as usize;
            if let Some(b) = self.extra[idx].take() {
                give.push(b);
                self.spare.push(id);
                self.owned -= 1;
            }
        }
        if !give.is_empty() {
            self.actions.push(Action::ReturnBounce(give));
        }
    }

    fn bounce_stride(&self) -> u64 {
        wire::bounce_stride(self.p.eager_buf_size)
    }

    /// An empty receive-WR list for a post of `n` WRs: a recycled one when there is one.
    pub(super) fn recv_list(&mut self, n: usize) -> Vec<RecvWr> {
        self.recv_list_len = self.recv_list_len.max(n);
        let mut v = self.spare_recv_lists.pop().unwrap_or_default();
        v.reserve(n);
        v
    }

    /// Emptied receive-WR lists kept for reuse, at most: as many as one call can post (the
    /// bounce RQ's batch, QP 0's zero-length WRs, and each data QP's zero-length WRs).
    pub(super) fn spare_lists_max(&self) -> usize {
        usize::from(self.p.qps) + 2
    }

    /// Posts up to `max_k` receive WRs (bounded by free bounce buffers) in one post call.
    pub(super) fn post_batch(&mut self, max_k: u32) -> bool {
        let k = max_k.min(self.free_bufs.len() as u32);
        if k == 0 {
            return false;
        }
        let stride = self.bounce_stride();
        let mut wrs = self.recv_list(k as usize);
        wrs.extend((0..k).map(|_| {
            let b = self.free_bufs.pop().expect("counted");
            let (addr, lkey) = self.buf(b).expect("a held buffer");
            RecvWr {
                wr_id: wr_id(WrKind::Bounce, 0, b),
                sge: Sge {
                    addr,
                    length: stride as u32,
                    lkey,
                },
            }
        }));
        self.posted_b += k;
        self.granted += u64::from(k);
        self.stats.rq_post_calls += 1;
        self.stats.rq_wrs_posted += u64::from(k);
        self.actions.push(Action::PostRecv(wrs));
        true
    }

    /// Posts `k` zero-length receive WRs in one post call (no buffer: only a WRITE_WITH_IMM may
    /// consume one; a SEND into one would fail with a length error, which the sender avoids by
    /// never sending below `z_end`).
    fn post_zeros(&mut self, k: u32) {
        if k == 0 {
            return;
        }
        let mut wrs = self.recv_list(k as usize);
        wrs.resize(
            k as usize,
            RecvWr {
                wr_id: wr_id(WrKind::Zero, 0, 0),
                sge: Sge::default(),
            },
        );
        self.posted_z += k;
        self.granted += u64::from(k);
        self.z_end = self.granted;
        self.stats.rq_post_calls += 1;
        self.stats.rq_wrs_posted += u64::from(k);
        self.stats.zero_wrs += u64::from(k);
        self.actions.push(Action::PostRecv(wrs));
    }

    /// Credit gating on: makes the receive WRs posted cover every buffer of the posted
    /// receives, so that each send matching one of them finds a WR, and a credit, without any
    /// further call on this comm (as NCCL IB's one receive WR per `irecv`). Returns how many
    /// zero-length WRs it posted.
    ///
    /// Each send but a small one consumes the next WR in posting order (one RQ, RC), so the WRs
    /// not seen
    /// consumed yet must number at least the unmatched buffers, plus what speculative eager
    /// sends in flight may take without filling one of them: those go only into
    /// bounce-backed WRs (the sender knows which WRs are zero-length from the CTS entries), so
    /// at most the bounce-backed WRs not seen consumed, and at most [`MAX_SPECULATIVE`]. What
    /// is missing is posted as zero-length WRs (no memory). A queue at most 16 deep thus keeps
    /// about one zero-length WR per posted buffer, like NCCL IB; a deeper one rarely needs
    /// any. When some are missing it posts at least [`ZERO_BATCH`] (up to [`MAX_ZERO_WRS`]
    /// posted): the next receives then find them posted, and a run of receives costs one
    /// receive post call per batch, not one per receive. The extra ones only delay eager
    /// SENDs (which never go into a zero-length WR) until direct writes consumed them.
    pub(super) fn cover_posted_receives(&mut self) -> u32 {
        if !self.p.credits {
            return 0;
        }
        debug_assert_eq!(
            self.unmatched,
            self.order
                .iter()
                .filter_map(|&id| self.reqs.get(id))
                .map(|r| r.unmatched())
                .sum::<u32>()
        );
        let need = self.unmatched + self.posted_b.min(MAX_SPECULATIVE as u32);
        let k = need.saturating_sub(self.posted_b + self.posted_z);
        if k == 0 {
            return 0;
        }
        // Post ahead: at least ZERO_BATCH at a time (they cost no memory), so that a run of
        // receives posts them in one call per batch instead of one per `irecv`. Never more
        // than MAX_ZERO_WRS posted (`k` alone always fits: `need` <= MAX_ZERO_WRS).
        let room = MAX_ZERO_WRS.saturating_sub(self.posted_z);
        let k = k.max(ZERO_BATCH.min(room));
        self.post_zeros(k);
        k
    }

    /// Several QPs per connection: makes the zero-length receive WRs of every data QP `q`
    /// cover the arrivals the posted receives may still get on `q`, so that every RDMA WRITE
    /// WITH IMM a send puts on `q` finds a receive WR without any further call on this comm
    /// (the sender posts them all at `isend` and checks no credit for them).
    ///
    /// The buffers that may still consume a WR of `q` are those of the posted receives that
    /// are not complete, use `q` (split: every buffer; round robin: those whose global index
    /// is `q` mod `qps`) and had no arrival on `q` yet. Each consumes at most one (the sender
    /// puts at most one WR per buffer on each QP), and a buffer filled eagerly none, so
    /// counting it is harmless. Posted WRs not seen consumed are at least that many after
    /// this call; a WR consumed but not yet polled is counted on both sides (its buffer has
    /// not been seen arriving on `q`), so the WRs really in the queue cover every arrival
    /// still to come. A send writes only into buffers whose CTS it read, and this runs before
    /// the CTS of the receive it adds. Posted in batches of at least [`ZERO_BATCH`], never
    /// more than [`MAX_ZERO_WRS`] posted per QP (the need is at most 32 × 8 = 256, below
    /// it); the QP holds [`crate::engine::DATA_QP_RECV_WRS`].
    pub(super) fn cover_data_qps(&mut self) {
        for q in 1..self.p.qps.max(1) {
            let need: u32 = self
                .order
                .iter()
                .filter_map(|&id| self.reqs.get(id))
                .map(|r| {
                    (0..r.n as usize)
                        .filter(|&i| {
                            r.done & (1 << i) == 0
                                && r.seen[i] & (1u128 << q) == 0
                                && self.uses_qp(r.base.wrapping_add(i as u64), q)
                        })
                        .count() as u32
                })
                .sum();
            let posted = self.data_posted[usize::from(q) - 1];
            let k = need.saturating_sub(posted);
            if k == 0 {
                continue;
            }
            let room = MAX_ZERO_WRS.saturating_sub(posted);
            let k = k.max(ZERO_BATCH.min(room));
            self.data_posted[usize::from(q) - 1] += k;
            self.stats.data_qp_zero_wrs += u64::from(k);
            let mut wrs = self.recv_list(k as usize);
            wrs.resize(
                k as usize,
                RecvWr {
                    wr_id: wr_id(WrKind::DataZero, 0, u32::from(q)),
                    sge: Sge::default(),
                },
            );
            self.actions.push(Action::PostRecvQp { qp: q, wrs });
        }
    }

    /// Adapts the depth (with `now`: shrinks after idle), then, below the low-water mark,
    /// posts whole batches while they fit; if nothing at all is posted (bounce buffers held by
    /// unmatched eager messages), posts what is free so the sender is never left without a
    /// receive WR.
    pub(super) fn refill(&mut self, now: Option<u64>) {
        if let Some(now) = now {
            self.maybe_shrink(now);
        }
        let batch = self.batch();
        if self.posted_b < self.low_water() {
            while self.posted_b + batch <= self.target && self.free_bufs.len() as u32 >= batch {
                self.post_batch(batch);
            }
        }
        if self.posted_b == 0 {
            self.post_batch(batch.min(self.target));
        }
        self.account();
    }

    /// After a poll's completions were fed: re-posts what they freed (whole batches, see
    /// `refill`) and returns the credits the sender may be short of; then, when the queue grew
    /// during the poll, takes the new bounce buffers from `pool` and posts them. Re-posting once
    /// per poll rather than per completion is what lets a receiver see its queue run dry: when
    /// the eager arrivals of one poll consumed every bounce-backed WR, the sender had more in
    /// flight than the depth (with credits off it met RNR), and the depth grows.
    ///
    /// The growth finishes inside this call: its posts follow the refill's and the credit
    /// write, and their credits go with the next CTS or credit write.
    ///
    /// Repeated with nothing changed in between, it has nothing to do (what it posts, returns
    /// and shrinks leaves nothing for a second pass), unless the shrink timer ran out or
    /// buffers asked of the pool are still missing: a settled engine returns after checking
    /// those two (most polls find the CQ empty).
    #[inline]
    pub fn after_poll(&mut self, now: u64, pool: &mut dyn BounceSource) {
        if self.settled && self.wanted == 0 && !self.shrink_due(now) {
            return;
        }
        self.settle(now, pool);
    }

    /// [`RecvEngine::after_poll`]'s work, when there is some.
    #[inline(never)]
    fn settle(&mut self, now: u64, pool: &mut dyn BounceSource) {
        if self.failed.is_none() {
            self.refill(Some(now));
        }
        self.flush_credits();
        if self.wanted > 0 {
            let asked = self.wanted;
            let got = pool.take(asked);
            self.add_bounce(asked, &got);
        }
        self.settled = true;
    }

    /// Sends an explicit credit update when the sender may be short of credits.
    pub fn flush_credits(&mut self) {
        if !self.p.credits || self.failed.is_some() {
            return;
        }
        let delta = self.granted - self.last_credit_sent;
        let sender_view = self.last_credit_sent.saturating_sub(self.consumed);
        // The sender is short when it holds fewer credits than a batch: at full depth
        // `rq_batch`, below it half the depth (a queue of 2 is not short with one credit left:
        // the next CTS carries the rest, and a sender that does run out says so and the queue
        // grows), so a small queue does not cost a credit write per message.
        let short = if self.target >= self.p.rq_depth {
            u64::from(self.p.rq_batch)
        } else {
            u64::from(self.target / 2).max(1)
        };
        if delta == 0 || (sender_view >= short && delta < u64::from(self.p.rq_batch)) {
            return;
        }
        let Some((stage, id, signaled)) = self.ctrl_slot(WrKind::Credit) else {
            return;
        };
        let word = wire::credit_word(self.granted, self.z_end).to_le_bytes();
        let sge = stage_sge(&mut self.actions, stage, self.p.ctrl_stage.1, &word);
        let opcode = SendOpcode::RdmaWrite {
            remote_addr: self.p.peer_credit_word.0,
            rkey: self.p.peer_credit_word.1,
        };
        self.actions.push(Action::PostSend(SendWr {
            signaled,
            inline: 8 <= self.p.inline_max,
            ..SendWr::one(id, sge, opcode)
        }));
        self.last_credit_sent = self.granted;
        self.stats.credit_msgs += 1;
    }

    /// A control staging slot for the next CTS or credit WRITE: its address, its `wr_id` and
    /// whether the WRITE is signaled; `None` while all [`CTRL_STAGE_SLOTS`] are in flight.
    ///
    /// Selective signaling, as NCCL IB's CTS writes (`src/transport/net_ib/p2p.cc`,
    /// `ncclIbPostFifo`: one signaled write per FIFO wrap, so that its send queue drains): only
    /// every [`CTRL_SIGNAL_EVERY`]-th control WRITE is signaled. Work requests on
    /// one QP complete in posting order, so the completion of a signaled one (its `wr_id`
    /// carries its control sequence number) frees its slot and every slot before it
    /// ([`RecvEngine::ctrl_completed`]); until then the unsignaled ones keep both their
    /// staging slot and their send-queue slot. [`CTRL_STAGE_SLOTS`] is a multiple of the
    /// period, so when every slot is in flight the newest is signaled and the slots always
    /// come free: the send queue never holds more than these 64 control WRITEs (its
    /// capacity, `conn::qp_config`, reserves [`CTRL_STAGE_SLOTS`] for them). An
    /// unsignaled WRITE that fails still completes, with its error (verbs: errors always
    /// generate a completion; the QP then flushes every later WR), so it fails the comm as a
    /// signaled one would.
    pub(super) fn ctrl_slot(&mut self, kind: WrKind) -> Option<(u64, u64, bool)> {
        if self.ctrl_outstanding() as usize >= CTRL_STAGE_SLOTS {
            return None;
        }
        let seq = self.ctrl_seq;
        let slot = seq % CTRL_STAGE_SLOTS as u64;
        self.ctrl_seq += 1;
        let signaled = self.ctrl_seq & u64::from(CTRL_SIGNAL_EVERY - 1) == 0;
        Some((
            self.p.ctrl_stage.0 + slot * self.p.cts_entry_len() as u64,
            wr_id(kind, 0, seq as u32),
            signaled,
        ))
    }

    /// Control WRITEs posted and not known complete.
    pub(super) fn ctrl_outstanding(&self) -> u64 {
        self.ctrl_seq - self.ctrl_done
    }

    /// The control WRITE with sequence number `seq` (low 32 bits, from its `wr_id`) completed,
    /// so did every one before it (posting order): their staging slots are free.
    pub(super) fn ctrl_completed(&mut self, seq: u32) {
        let ahead = (seq.wrapping_add(1)).wrapping_sub(self.ctrl_done as u32);
        if u64::from(ahead) <= self.ctrl_outstanding() {
            self.ctrl_done += u64::from(ahead);
        }
    }
}
