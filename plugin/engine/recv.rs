//! The receiving side of a connection: receive requests, matching arrivals to them (NCCL's
//! front-group rule), eager copies and refusal records; the receive queue and the credits it
//! returns are in `rq.rs`.

use std::collections::VecDeque;

use super::wire::{
    self, CtsBuf, CtsEntry, EagerHeader, CTS_ENTRY_LEN, EAGER_HDR_LEN, MAX_RECVS, REC_SLOTS,
    REC_TOO_BIG,
};
use super::{
    wc_error, wr_parse, Action, MemRead, ReqError, ReqId, Slots, Stall, Stats, WrKind,
    CTRL_STAGE_SLOTS, CTS_RING_ENTRIES, MAX_RECV_REQUESTS,
};
use crate::transport::{SendOpcode, SendWr, Sge, Wc, WcOpcode, WcStatus};

mod rq;

/// Registered bytes of a receive comm besides its bounce buffers: the record ring and the
/// control staging slots.
pub const RECV_FIXED_BYTES: u64 =
    (REC_SLOTS * MAX_RECVS * 8 + CTRL_STAGE_SLOTS * CTS_ENTRY_LEN) as u64;

/// Fixed parameters of a receive engine, agreed in the connection handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvParams {
    /// Most receive WRs (and bounce buffers) per connection: the depth a busy connection may
    /// grow to.
    pub rq_depth: u32,
    /// Receive WRs (and bounce buffers) a connection starts with and shrinks back to when idle
    /// (`rq_min == rq_depth`: fixed depth, as before adaptive depth existed).
    pub rq_min: u32,
    /// Without the RQ running dry for this long, the depth shrinks by one batch (towards
    /// `rq_min`), nanoseconds.
    pub shrink_after_ns: u64,
    /// Receive WRs per post call.
    pub rq_batch: u32,
    /// Refill when fewer than this many receive WRs are posted.
    pub rq_low_water: u32,
    /// Payload capacity of one bounce buffer; each buffer is `EAGER_HDR_LEN + eager_buf_size`
    /// bytes.
    pub eager_buf_size: u64,
    /// The connection's own bounce buffers: `rq_min` buffers back to back (addr, lkey). The
    /// ones it grows by come from the driver's shared pool (a [`super::BounceSource`]).
    pub bounce: (u64, u32),
    /// Our record ring (`REC_SLOTS * MAX_RECVS * 8` bytes), read on rendezvous arrivals.
    pub rec_ring: u64,
    /// Staging for CTS and credit writes: `CTRL_STAGE_SLOTS * CTS_ENTRY_LEN` bytes (addr, lkey).
    pub ctrl_stage: (u64, u32),
    /// The sender's CTS ring: `CTS_RING_ENTRIES * CTS_ENTRY_LEN` bytes (addr, rkey).
    pub peer_cts_ring: (u64, u32),
    /// The sender's credit word, 8 bytes (addr, rkey).
    pub peer_credit_word: (u64, u32),
    /// The sender gates on credits: send credit updates.
    pub credits: bool,
    /// QPs of the connection (the sender's `qps`): with more than one, direct writes and
    /// size records may arrive out of send order.
    pub qps: u8,
    /// First send/receive sequence number (as the sender's).
    pub first_seq: u64,
}

/// One buffer of a (grouped) receive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvBuf {
    /// Virtual address of the user buffer.
    pub addr: u64,
    /// Capacity in bytes.
    pub cap: u64,
    /// Remote key the sender may write with.
    pub rkey: u32,
    /// Tag expected for this buffer.
    pub tag: i32,
}

#[derive(Debug)]
struct RecvReq {
    r: u64,
    n: u32,
    bufs: [RecvBuf; MAX_RECVS],
    used: u8,
    sizes: [u64; MAX_RECVS],
    arrived: u32,
    error: Option<ReqError>,
    progress_ns: u64,
    stall_reported: bool,
}

/// An eager message that arrived before its receive was posted.
#[derive(Clone, Copy, Debug)]
struct Unexpected {
    s: u64,
    tag: i32,
    size: u64,
    bounce: u32,
}

/// The receive engine. See the module docs of [`crate::engine`] for the protocol.
#[derive(Debug)]
pub struct RecvEngine {
    p: RecvParams,
    reqs: Slots<RecvReq>,
    order: VecDeque<ReqId>,
    next_r: u64,
    next_base: u64,
    next_arrival: u64,
    unexpected: VecDeque<Unexpected>,
    /// Bounce-backed receive WRs posted and not yet seen consumed.
    posted_b: u32,
    /// Zero-length receive WRs posted and not yet seen consumed.
    posted_z: u32,
    /// `granted` right after the last zero-length WR was posted (0: none yet): every WR from
    /// here on is bounce-backed, so the sender may SEND into it.
    z_end: u64,
    free_bufs: Vec<u32>,
    /// Buffers beyond the initial `rq_min`, by id − `rq_min`: (addr, lkey), `None` once
    /// released to the pool.
    extra: Vec<Option<(u64, u32)>>,
    /// Released ids of `extra`, reused first.
    spare: Vec<u32>,
    /// Bounce buffers this comm holds: posted, free, or holding an unmatched message.
    owned: u32,
    /// Receive WRs the comm keeps posted now (`rq_min..=rq_depth`).
    target: u32,
    /// Buffers asked for and not answered yet.
    wanted: u32,
    /// When the RQ last ran dry (or the depth last changed).
    pressure_ns: u64,
    granted: u64,
    consumed: u64,
    last_credit_sent: u64,
    /// Control WRITEs (CTS and credit) posted so far.
    ctrl_seq: u64,
    /// Control WRITEs known complete (a signaled one completed at or after them).
    ctrl_done: u64,
    failed: Option<ReqError>,
    actions: Vec<Action>,
    stats: Stats,
}

impl RecvEngine {
    /// A receive engine; its first actions post the initial receive WRs (before the QP can
    /// receive anything). `initial_credits()` is then what the handshake announces.
    pub fn new(p: RecvParams) -> RecvEngine {
        let mut e = RecvEngine {
            reqs: Slots::new(MAX_RECV_REQUESTS),
            order: VecDeque::new(),
            next_r: p.first_seq,
            next_base: p.first_seq,
            next_arrival: p.first_seq,
            unexpected: VecDeque::new(),
            posted_b: 0,
            posted_z: 0,
            z_end: 0,
            free_bufs: (0..p.rq_min).rev().collect(),
            extra: Vec::new(),
            spare: Vec::new(),
            owned: p.rq_min,
            target: p.rq_min,
            wanted: 0,
            pressure_ns: 0,
            granted: 0,
            consumed: 0,
            last_credit_sent: 0,
            ctrl_seq: 0,
            ctrl_done: 0,
            failed: None,
            actions: Vec::new(),
            stats: Stats {
                rq_min_level: u64::from(p.rq_min),
                rq_depth: u64::from(p.rq_min),
                ..Stats::default()
            },
            p,
        };
        while e.posted_b < e.target && e.post_batch(e.batch().min(e.target - e.posted_b)) {}
        e.last_credit_sent = e.granted;
        e.account();
        e
    }

    /// Receive WRs granted so far (the sender's initial credits right after `new`).
    pub fn granted(&self) -> u64 {
        self.granted
    }

    /// Whether the sender gates on credits (it asked for credit updates in the handshake).
    pub fn credits(&self) -> bool {
        self.p.credits
    }

    /// Receive WRs posted now (as far as the completions seen so far tell): bounce-backed
    /// and zero-length.
    pub fn posted(&self) -> u32 {
        self.posted_b + self.posted_z
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Requests in use.
    pub fn in_flight(&self) -> usize {
        self.reqs.in_use()
    }

    /// The first fatal error of this comm, if any.
    pub fn failure(&self) -> Option<&ReqError> {
        self.failed.as_ref()
    }

    /// Takes the actions produced so far.
    pub fn drain_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// Posts a (grouped) receive of `bufs` (1..=8 buffers). `Ok(None)` = "retry later" (request
    /// slots or control staging full). Matches the eager messages held for want of a buffer,
    /// makes the posted receive WRs cover the posted buffers (credit gating on: zero-length WRs
    /// for what the bounce-backed ones do not cover), then sends the clear-to-send, so that
    /// the sends matching this receive need nothing more from this comm.
    pub fn irecv(&mut self, now: u64, bufs: &[RecvBuf]) -> Result<Option<ReqId>, ReqError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if bufs.is_empty() || bufs.len() > MAX_RECVS {
            return Err(ReqError::Usage(format!(
                "irecv of {} buffers (1..={MAX_RECVS})",
                bufs.len()
            )));
        }
        if self.reqs.in_use() == MAX_RECV_REQUESTS
            || self.ctrl_outstanding() as usize >= CTRL_STAGE_SLOTS
        {
            self.stats.slots_full += 1;
            return Ok(None);
        }
        let n = bufs.len() as u32;
        let mut b = [RecvBuf::default(); MAX_RECVS];
        b[..bufs.len()].copy_from_slice(bufs);
        let r = self.next_r;
        let base = self.next_base;
        let req = RecvReq {
            r,
            n,
            bufs: b,
            used: 0,
            sizes: [0; MAX_RECVS],
            arrived: 0,
            error: None,
            progress_ns: now,
            stall_reported: false,
        };
        let id = self.reqs.insert(req).expect("slot checked");
        self.order.push_back(id);
        self.next_r = r.wrapping_add(1);
        self.next_base = base.wrapping_add(u64::from(n));

        // Eager messages held for want of a buffer with their tag, in arrival order: only this
        // receive can have one for them (every older one had none when they arrived).
        let mut k = 0;
        while k < self.unexpected.len() && self.failed.is_none() {
            let u = self.unexpected[k];
            match self.find_buf(u.tag) {
                Some((id, i)) => {
                    self.unexpected.remove(k);
                    self.deliver_eager(now, id, i, u);
                }
                None => k += 1,
            }
        }
        // A held message too large for its buffer failed the comm: this request reports it
        // from `test`, and every later call fails. The CTS still goes: the sender matches its
        // speculative sends with it and fails the same way.
        if self.failed.is_none() {
            self.refill(Some(now));
        }
        let zeros = self.cover_posted_receives();

        let mut cb = [CtsBuf::default(); MAX_RECVS];
        for (c, u) in cb.iter_mut().zip(bufs) {
            *c = CtsBuf {
                addr: u.addr,
                cap: u.cap,
                rkey: u.rkey,
                tag: u.tag,
            };
        }
        let entry = CtsEntry {
            r,
            credits: self.granted,
            base,
            n,
            zeros,
            bufs: cb,
        };
        let (stage, cts_id, signaled) = self.ctrl_slot(WrKind::Cts).expect("checked above");
        self.actions.push(Action::Stage {
            addr: stage,
            bytes: entry.encode().to_vec(),
        });
        self.actions.push(Action::PostSend(SendWr {
            wr_id: cts_id,
            sgl: [
                Sge {
                    addr: stage,
                    length: CTS_ENTRY_LEN as u32,
                    lkey: self.p.ctrl_stage.1,
                },
                Sge::default(),
            ],
            num_sge: 1,
            opcode: SendOpcode::RdmaWrite {
                remote_addr: self.p.peer_cts_ring.0
                    + (r % CTS_RING_ENTRIES as u64) * CTS_ENTRY_LEN as u64,
                rkey: self.p.peer_cts_ring.1,
            },
            signaled,
        }));
        self.last_credit_sent = self.granted;
        self.stats.cts += 1;
        Ok(Some(id))
    }

    /// The buffer the next send tagged `tag` takes: the first unmatched buffer with that tag in
    /// the oldest posted receive that has one. The sender applies the same rule (see
    /// [`crate::engine::SendEngine::isend`]), so both sides agree without extra messages.
    fn find_buf(&self, tag: i32) -> Option<(ReqId, usize)> {
        self.order.iter().find_map(|&id| {
            let r = self.reqs.get(id)?;
            (0..r.n as usize)
                .find(|&i| r.used & (1 << i) == 0 && r.bufs[i].tag == tag)
                .map(|i| (id, i))
        })
    }

    fn free_bounce(&mut self, b: u32) {
        self.free_bufs.push(b);
    }

    /// Puts eager message `u` into buffer `i` of receive `id` (copy out of its bounce buffer,
    /// which is then free). A message larger than the buffer fails the comm; nothing is written.
    fn deliver_eager(&mut self, now: u64, id: ReqId, i: usize, u: Unexpected) {
        let Some((at, _)) = self.buf(u.bounce) else {
            return;
        };
        let src = at + EAGER_HDR_LEN as u64;
        self.free_bounce(u.bounce);
        let Some(req) = self.reqs.get_mut(id) else {
            return;
        };
        req.progress_ns = now;
        req.used |= 1 << i;
        req.arrived += 1;
        if u.size > req.bufs[i].cap {
            let e = ReqError::Usage(format!(
                "the peer sent {} bytes (send {}, tag {}) into a receive buffer of {} bytes \
                 (receive {}, buffer {i}); nothing was written",
                u.size, u.s, u.tag, req.bufs[i].cap, req.r
            ));
            req.error = Some(e.clone());
            self.fail(e);
            return;
        }
        req.sizes[i] = u.size;
        self.stats.eager += 1;
        if u.size > 0 {
            self.actions.push(Action::Copy {
                src,
                req: id,
                buf: i,
                len: u.size,
            });
        }
    }

    /// Feeds one completion of our QP. `mem` reads bounce headers and records. Re-posting
    /// what it frees waits for [`RecvEngine::after_poll`].
    pub fn handle_wc(&mut self, now: u64, wc: &Wc, mem: &dyn MemRead) {
        let Some((kind, _, index)) = wr_parse(wc.wr_id) else {
            self.fail(ReqError::Local(format!(
                "completion with unknown wr_id {:#x}",
                wc.wr_id
            )));
            return;
        };
        match kind {
            WrKind::Cts | WrKind::Credit => self.ctrl_completed(index),
            WrKind::Bounce => self.posted_b = self.posted_b.saturating_sub(1),
            WrKind::Zero => self.posted_z = self.posted_z.saturating_sub(1),
            _ => {}
        }
        if wc.status != WcStatus::Success {
            self.stats.error_completions += 1;
            let what = match kind {
                WrKind::Bounce => "receive WR",
                WrKind::Zero => "zero-length receive WR",
                WrKind::Cts => "clear-to-send RDMA WRITE",
                _ => "credit RDMA WRITE",
            };
            if wc.status != WcStatus::WrFlush || self.failed.is_none() {
                self.fail(wc_error(wc.status, what));
            }
            return;
        }
        if !matches!(kind, WrKind::Bounce | WrKind::Zero) {
            return;
        }
        self.consumed += 1;
        self.stats.rq_min_level = self.stats.rq_min_level.min(u64::from(self.posted_b));
        if self.posted_b + self.posted_z == 0 {
            // This poll's arrivals took every posted WR: the sender had more in flight than
            // the queue holds (credits off: it met RNR), so the queue grows. Re-posting waits
            // for `after_poll`, so a receiver that polls rarely sees this too.
            self.grow(now);
        }
        // The buffer this arrival consumed, when it was bounce-backed.
        let bounce = if kind == WrKind::Bounce {
            match self.buf(index) {
                Some((at, _)) => Some(at),
                None => {
                    self.fail(ReqError::Local(format!(
                        "receive completion for bounce buffer {index}"
                    )));
                    return;
                }
            }
        } else {
            None
        };
        let s = self.next_arrival;
        match (wc.opcode, bounce) {
            (WcOpcode::Recv, Some(at)) => self.eager_arrival(now, s, index, at, wc, mem),
            (WcOpcode::RecvRdmaWithImm, _) => {
                if bounce.is_some() {
                    self.free_bounce(index);
                }
                self.write_arrival(now, s, wc, mem);
            }
            (op, _) => {
                if bounce.is_some() {
                    self.free_bounce(index);
                }
                self.fail(ReqError::Protocol(format!(
                    "a {op:?} completion consumed a {} receive WR",
                    if bounce.is_some() {
                        "bounce-backed"
                    } else {
                        "zero-length"
                    }
                )));
            }
        }
    }

    /// An eager SEND landed in bounce buffer `index` (at `at`): match it, or hold it until a
    /// receive with a free buffer of its tag is posted.
    fn eager_arrival(&mut self, now: u64, s: u64, index: u32, at: u64, wc: &Wc, mem: &dyn MemRead) {
        let mut hb = [0u8; EAGER_HDR_LEN];
        let hdr = if mem.read(at, &mut hb) {
            EagerHeader::decode(&hb)
        } else {
            None
        };
        let Some(h) = hdr else {
            self.free_bounce(index);
            self.fail(ReqError::Protocol("malformed eager header".into()));
            return;
        };
        if h.seq != s || u64::from(wc.byte_len) != EAGER_HDR_LEN as u64 + h.size {
            self.free_bounce(index);
            self.fail(ReqError::Protocol(format!(
                "eager message {} of {} bytes (WC {} bytes) arrived, expected send {s}",
                h.seq, h.size, wc.byte_len
            )));
            return;
        }
        self.next_arrival = s.wrapping_add(1);
        if h.starved {
            self.grow(now);
        }
        let u = Unexpected {
            s,
            tag: h.tag,
            size: h.size,
            bounce: index,
        };
        match self.find_buf(h.tag) {
            Some((id, i)) => self.deliver_eager(now, id, i, u),
            None => {
                self.stats.unexpected += 1;
                self.unexpected.push_back(u);
            }
        }
    }

    /// A WRITE_WITH_IMM landed: a direct write of a send's payload into the buffer its
    /// immediate names (size: `byte_len`), a refusal record, or (several QPs) a size record
    /// whose send's data landed already. `s` counts arrivals: with one QP it is the send's
    /// sequence number.
    ///
    /// With one QP arrivals come in send order, and the buffer named must be the one our own
    /// matching gives the next send with its tag. With several QPs a size record comes after
    /// later sends' direct writes, so the buffer named must only be an unmatched buffer of a
    /// posted receive (the sender matched it; eager SENDs, which we match ourselves, never
    /// overtake a size record). Anything else is a protocol error that fails the comm.
    fn write_arrival(&mut self, now: u64, s: u64, wc: &Wc, mem: &dyn MemRead) {
        let Some(imm) = wc.imm.map(wire::imm_decode) else {
            self.fail(ReqError::Protocol(format!(
                "a WRITE WITH IMM (send {s}) arrived without an immediate"
            )));
            return;
        };
        let i = imm.buf;
        // The immediate names the receive and buffer the sender matched; it must be the buffer
        // our own matching gives the next send with that buffer's tag.
        let named = self.order.iter().copied().find(|&id| {
            self.reqs
                .get(id)
                .is_some_and(|r| wire::imm_matches(imm.r_low, r.r))
        });
        let tag = named
            .and_then(|id| self.reqs.get(id))
            .filter(|r| i < r.n as usize)
            .map(|r| r.bufs[i].tag);
        let ok = if self.p.qps > 1 {
            named
                .and_then(|id| self.reqs.get(id))
                .is_some_and(|r| i < r.n as usize && r.used & (1 << i) == 0)
        } else {
            named.is_some() && tag.and_then(|t| self.find_buf(t)) == named.map(|id| (id, i))
        };
        let Some(id) = named.filter(|_| ok) else {
            self.fail(ReqError::Protocol(format!(
                "{} (imm {:#x}: receive {} mod 2^27, buffer {i}) for {} {s} names no \
                 unmatched buffer this receiver would give it{}",
                match (imm.record, self.p.qps > 1) {
                    (true, true) => "a record",
                    (true, false) => "a refusal record",
                    (false, _) => "a direct write",
                },
                wc.imm.unwrap_or(0),
                imm.r_low,
                if self.p.qps > 1 { "arrival" } else { "send" },
                if self.p.qps > 1 {
                    " (several QPs: it must name an unmatched buffer of a posted receive)"
                } else {
                    ""
                }
            )));
            return;
        };
        self.next_arrival = s.wrapping_add(1);
        if imm.starved {
            self.grow(now);
        }
        let rec_ring = self.p.rec_ring;
        let req = self.reqs.get_mut(id).expect("found above");
        req.progress_ns = now;
        req.used |= 1 << i;
        req.arrived += 1;
        let cap = req.bufs[i].cap;
        if !imm.record {
            if u64::from(wc.byte_len) > cap {
                let e = ReqError::Protocol(format!(
                    "send {s} wrote {} bytes into a receive buffer of {cap} bytes (receive {}, \
                     buffer {i})",
                    wc.byte_len, req.r
                ));
                req.error = Some(e.clone());
                self.fail(e);
                return;
            }
            req.sizes[i] = u64::from(wc.byte_len);
            self.stats.rendezvous += 1;
            return;
        }
        let slot = (req.r % REC_SLOTS as u64) as usize * MAX_RECVS + i;
        let mut rb = [0u8; 8];
        let rec = mem
            .read(rec_ring + slot as u64 * 8, &mut rb)
            .then(|| u64::from_le_bytes(rb));
        let e = match rec {
            Some(v) if v & REC_TOO_BIG == 0 && self.p.qps > 1 && v <= cap => {
                // A size record: every piece of the send's data was acknowledged before it
                // was posted.
                req.sizes[i] = v;
                self.stats.rendezvous += 1;
                return;
            }
            Some(v) if v & REC_TOO_BIG == 0 && self.p.qps > 1 => ReqError::Protocol(format!(
                "a size record of {v} bytes (arrival {s}) for a receive buffer of {cap} bytes \
                 (receive {}, buffer {i})",
                req.r
            )),
            Some(v) if v & REC_TOO_BIG != 0 => ReqError::Usage(format!(
                "the peer tried to send {} bytes (send {s}) into a receive buffer of {cap} bytes \
                 (receive {}, buffer {i}); nothing was written",
                v & !REC_TOO_BIG,
                req.r
            )),
            _ => ReqError::Protocol(format!("bad refusal record {rec:?}")),
        };
        req.error = Some(e.clone());
        self.fail(e);
    }

    /// Marks the comm failed; every outstanding request reports `e`.
    pub fn fail(&mut self, e: ReqError) {
        if self.failed.is_none() {
            self.failed = Some(e.clone());
        }
        for (_, r) in self.reqs.iter_mut() {
            if r.error.is_none() && r.arrived < r.n {
                r.error = Some(e.clone());
            }
        }
    }

    /// Polls request `id`: `Ok(Some(sizes))` once every buffer received its send (the slot is
    /// then free; `sizes[i]` = bytes received into buffer `i`), `Ok(None)` while in progress.
    pub fn test(&mut self, id: ReqId) -> Result<Option<Vec<u64>>, ReqError> {
        let Some(req) = self.reqs.get(id) else {
            return Err(ReqError::Local(format!(
                "test of an unknown or finished receive request {id:?}"
            )));
        };
        if let Some(e) = req.error.clone() {
            // The comm failed (a usage error leaves the send/receive pairing undefined): every
            // later call returns the error too.
            self.reqs.remove(id);
            self.order.retain(|&o| o != id);
            self.fail(e.clone());
            return Err(e);
        }
        if req.arrived < req.n {
            return Ok(None);
        }
        let sizes = req.sizes[..req.n as usize].to_vec();
        self.reqs.remove(id);
        self.order.retain(|&o| o != id);
        self.stats.ops += 1;
        self.stats.bytes += sizes.iter().sum::<u64>();
        Ok(Some(sizes))
    }

    /// Whether receive `id` has every buffer filled (what `test` would report done), without
    /// consuming it: the simulated pair checks the received bytes at that moment.
    pub(crate) fn complete(&self, id: ReqId) -> bool {
        self.reqs
            .get(id)
            .is_some_and(|r| r.error.is_none() && r.arrived == r.n)
    }

    /// Requests idle for at least `timeout_ns`, each reported once.
    pub fn stalls(&mut self, now: u64, timeout_ns: u64) -> Vec<Stall> {
        let mut out = Vec::new();
        for (id, r) in self.reqs.iter_mut() {
            if r.stall_reported
                || r.error.is_some()
                || now.saturating_sub(r.progress_ns) < timeout_ns
            {
                continue;
            }
            r.stall_reported = true;
            let waiting_for = if r.arrived < r.n {
                format!(
                    "data from the sender: {} of {} buffers filled (the peer has not issued the \
                     matching isend, or cannot: check its log for credit or clear-to-send waits)",
                    r.arrived, r.n
                )
            } else {
                "the caller to test it: it completed, but test was not called on it".to_string()
            };
            out.push(Stall {
                req: id,
                what: format!(
                    "receive {} ({} buffer{})",
                    r.r,
                    r.n,
                    if r.n == 1 { "" } else { "s" }
                ),
                idle_ns: now - r.progress_ns,
                waiting_for,
            });
        }
        out
    }
}

impl super::ActionQueue for RecvEngine {
    fn take_actions(&mut self, out: &mut Vec<Action>) {
        if out.is_empty() {
            std::mem::swap(&mut self.actions, out);
        } else {
            out.append(&mut self.actions);
        }
    }
}

#[cfg(test)]
mod tests;
