//! The receiving side of a connection: receive requests, matching arrivals to them (NCCL's
//! front-group rule), eager copies and refusal records; the receive queue and the credits it
//! returns are in `rq.rs`.

use std::collections::VecDeque;

use super::wire::{
    self, CtsBuf, CtsEntry, EagerHeader, SmallTrailer, CTS_COMPACT_LEN, CTS_ENTRY_LEN_STRIPED,
    EAGER_HDR_LEN, MAX_RECVS, REC_TOO_BIG,
};
use super::{
    stage_sge, wc_error, wr_parse, Action, MemRead, ReqError, ReqId, Sizes, Slots, StageBytes,
    Stall, Stats, WrKind, CTRL_STAGE_SLOTS, CTS_RING_ENTRIES, MAX_RECV_REQUESTS,
};
use crate::transport::{RecvWr, SendOpcode, SendWr, Wc, WcOpcode, WcStatus};

mod rq;

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
    /// Our record region ([`wire::REC_REGION_LEN`] bytes): the record ring, read on refusal
    /// records, and behind it the small-send ring, polled for small sends.
    pub rec_ring: u64,
    /// Staging for CTS and credit writes: `CTRL_STAGE_SLOTS * cts_entry_len(rkeys)` bytes
    /// (addr, lkey).
    pub ctrl_stage: (u64, u32),
    /// The sender's CTS ring: `CTS_RING_ENTRIES * cts_entry_len(rkeys)` bytes (addr, rkey).
    pub peer_cts_ring: (u64, u32),
    /// The sender's credit word, 8 bytes (addr, rkey).
    pub peer_credit_word: (u64, u32),
    /// Longest control WRITE posted inline (`IBV_SEND_INLINE`): what QP 0 granted of
    /// [`wire::CTS_COMPACT_LEN`] (`conn::listen`; 0 with `VERBSNET_INLINE_SIZE=0`). A CTS
    /// entry or credit word no longer than it is copied into the WR at the post, so the NIC
    /// does not read it from the staging slot (one PCIe read less per receive on hardware;
    /// NCCL IB's `NCCL_IB_USE_INLINE`, `src/transport/net_ib/`, sizes its QPs the same way).
    pub inline_max: u64,
    /// The sender gates on credits: send credit updates.
    pub credits: bool,
    /// QPs of the connection (the sender's `qps`): with more than one, direct sends also
    /// arrive on the data QPs, which get zero-length receive WRs ([`super::Action::PostRecvQp`]).
    pub qps: u8,
    /// The sender splits each direct send over all QPs (`VERBSNET_IB_SPLIT_DATA_ON_QPS`);
    /// otherwise buffer `g` (global index) arrives on QP `g % qps` (and QP 0).
    pub split: bool,
    /// First send/receive sequence number (as the sender's).
    pub first_seq: u64,
    /// The devices this end's buffers are registered on (`1..=MAX_DEVS`: a virtual device's,
    /// `makeVDevice`): every [`RecvBuf`] carries that many rkeys, and the CTS entries are
    /// [`wire::cts_entry_len`]`(rkeys)` bytes.
    pub rkeys: u8,
}

impl RecvParams {
    /// Bytes of one CTS entry of this connection.
    pub fn cts_entry_len(&self) -> usize {
        wire::cts_entry_len(self.rkeys)
    }

    /// Registered bytes of the comm besides its bounce buffers: the record ring and the
    /// control staging slots, as [`wire::recv_comm_buffers`] lays them out.
    pub fn fixed_bytes(&self) -> u64 {
        let [_, rec_ring, ctrl] = wire::recv_comm_buffers(0, 0, self.rkeys);
        rec_ring + ctrl
    }
}

/// One buffer of a (grouped) receive: the user buffer's address, its capacity in bytes, the
/// remote keys the sender may write with (one per device of this end, [`RecvParams::rkeys`])
/// and the tag it expects. The buffer its CTS entry announces, field for field, so `irecv`
/// encodes the entry from the buffers it was given.
pub type RecvBuf = CtsBuf;

#[derive(Debug)]
struct RecvReq {
    r: u64,
    /// The global index of buffer 0 (the CTS entry's `base`).
    base: u64,
    n: u32,
    /// Each buffer's capacity in bytes (a larger arrival fails the comm).
    caps: [u64; MAX_RECVS],
    /// Each buffer's tag (the matching rule). The buffers' addresses and rkeys go out in the
    /// clear-to-send and are not kept: the request is written whole at every `irecv`, and
    /// without them it is 368 bytes, half of what it was.
    tags: [i32; MAX_RECVS],
    /// Bit `i`: buffer `i` is matched (its eager SEND or its QP 0 arrival came).
    used: u8,
    /// Bit `i`: buffer `i` is complete (every arrival it expects came).
    done: u8,
    /// Bytes arrived into each buffer so far (its size once complete).
    sizes: [u64; MAX_RECVS],
    /// Arrivals counted per buffer (several QPs: one per QP it uses).
    got: [u8; MAX_RECVS],
    /// Per buffer, bit `q`: an arrival on data QP `q` came.
    seen: [u128; MAX_RECVS],
    /// Complete buffers.
    arrived: u32,
    error: Option<ReqError>,
    progress_ns: u64,
    stall_reported: bool,
}

impl RecvReq {
    /// The first unmatched buffer tagged `tag` (the matching rule within one receive).
    fn free_buf(&self, tag: i32) -> Option<usize> {
        (0..self.n as usize).find(|&i| self.used & (1 << i) == 0 && self.tags[i] == tag)
    }

    /// Buffers not matched yet.
    fn unmatched(&self) -> u32 {
        self.n - self.used.count_ones()
    }

    /// Whether every buffer is matched.
    fn all_matched(&self) -> bool {
        self.unmatched() == 0
    }

    /// Marks buffer `i` matched; true if it was not yet (one unmatched buffer fewer).
    fn match_buf(&mut self, i: usize) -> bool {
        let newly = self.used & (1 << i) == 0;
        self.used |= 1 << i;
        newly
    }
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
    /// Buffers of the receives in `order` not matched to a send yet (what
    /// `cover_posted_receives` must cover), kept as they change instead of summed per call.
    unmatched: u32,
    /// How many receives at the front of `order` have every buffer matched: `find_buf` starts
    /// after them (in a stream, the receives waiting for their `test` pile up there).
    matched_prefix: usize,
    next_r: u64,
    next_base: u64,
    next_arrival: u64,
    unexpected: VecDeque<Unexpected>,
    /// Bounce-backed receive WRs posted and not yet seen consumed.
    posted_b: u32,
    /// Zero-length receive WRs posted and not yet seen consumed.
    posted_z: u32,
    /// Per data QP (QP `q` at `q - 1`): zero-length receive WRs posted and not yet seen
    /// consumed.
    data_posted: Vec<u32>,
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
    /// `after_poll` ran and nothing it reads changed since: set at its end, cleared by every
    /// other call that changes what it reads (`irecv`, `handle_wc`, `fail`, `release_all`;
    /// not `test`, which only hands requests back). A settled engine's next `after_poll` only
    /// checks the clock (the shrink timer) and the pool (buffers asked for).
    settled: bool,
    /// When the RQ last ran dry (or the depth last changed).
    pressure_ns: u64,
    granted: u64,
    consumed: u64,
    last_credit_sent: u64,
    /// Control WRITEs (CTS and credit) posted so far.
    ctrl_seq: u64,
    /// Control WRITEs known complete (a signaled one completed at or after them).
    ctrl_done: u64,
    /// Compact CTS entries `irecv` stored in the mirror, (receive, bytes), that
    /// [`RecvEngine::after_execute`] has not pushed or left to the sender's READ yet; each
    /// holds a control staging slot in reserve (`slots_full`).
    published: Vec<(u64, [u8; CTS_COMPACT_LEN])>,
    /// Emptied receive-WR lists of executed posts ([`super::ActionQueue::recycle_recv_lists`]),
    /// at most as many as one call posts (`RecvEngine::spare_lists_max`), each with room for
    /// `recv_list_len` WRs: a warm engine's posts allocate nothing.
    spare_recv_lists: Vec<Vec<RecvWr>>,
    /// The most WRs one post has asked for so far (every kept list is grown to it when it
    /// comes back, so any list fits any post).
    recv_list_len: usize,
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
            unmatched: 0,
            matched_prefix: 0,
            next_r: p.first_seq,
            next_base: p.first_seq,
            next_arrival: p.first_seq,
            unexpected: VecDeque::new(),
            posted_b: 0,
            posted_z: 0,
            data_posted: vec![0; usize::from(p.qps.max(1)) - 1],
            z_end: 0,
            free_bufs: (0..p.rq_min).rev().collect(),
            extra: Vec::new(),
            spare: Vec::new(),
            owned: p.rq_min,
            target: p.rq_min,
            wanted: 0,
            settled: false,
            pressure_ns: 0,
            granted: 0,
            consumed: 0,
            last_credit_sent: 0,
            ctrl_seq: 0,
            ctrl_done: 0,
            published: Vec::new(),
            spare_recv_lists: Vec::new(),
            recv_list_len: 0,
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

    /// Whether actions are queued that no executor has taken yet, or entries published in the
    /// mirror wait for [`RecvEngine::after_execute`] (which the comm runs with the executor).
    #[inline]
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty() || !self.published.is_empty()
    }

    /// Whether [`RecvEngine::irecv`] would start a receive from what this engine knows
    /// already: a request slot and a control staging slot are free. The comm then starts it
    /// without polling first, as NCCL IB's `irecv` only posts (`src/transport/net_ib/p2p.cc`,
    /// `ncclIbIrecv`). `false` says nothing: the comm makes progress and asks `irecv`, which
    /// decides.
    pub fn can_start(&self) -> bool {
        self.failed.is_none() && !self.slots_full()
    }

    /// No request slot or no control staging slot is free.
    fn slots_full(&self) -> bool {
        self.reqs.in_use() == MAX_RECV_REQUESTS
            || self.ctrl_outstanding() as usize + self.published.len() >= CTRL_STAGE_SLOTS
    }

    /// The first fatal error of this comm, if any.
    #[inline]
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
    /// for what the bounce-backed ones do not cover; several QPs: zero-length WRs on each data
    /// QP, `cover_data_qps` in `rq.rs`), then sends the clear-to-send, so that the sends
    /// matching this receive need nothing more from this comm.
    pub fn irecv(&mut self, now: u64, bufs: &[RecvBuf]) -> Result<Option<ReqId>, ReqError> {
        self.settled = false;
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if bufs.is_empty() || bufs.len() > MAX_RECVS {
            return Err(ReqError::Usage(format!(
                "irecv of {} buffers (1..={MAX_RECVS})",
                bufs.len()
            )));
        }
        if let Some(b) = bufs.iter().find(|b| b.rkeys.len() != self.p.rkeys) {
            return Err(ReqError::Usage(format!(
                "irecv of a buffer registered on {} device(s); this comm runs on {} (register \
                 buffers through the comm that uses them)",
                b.rkeys.len(),
                self.p.rkeys
            )));
        }
        if self.slots_full() {
            self.stats.slots_full += 1;
            return Ok(None);
        }
        let n = bufs.len() as u32;
        let mut caps = [0; MAX_RECVS];
        let mut tags = [0; MAX_RECVS];
        for (i, b) in bufs.iter().enumerate() {
            caps[i] = b.cap;
            tags[i] = b.tag;
        }
        let r = self.next_r;
        let base = self.next_base;
        let req = RecvReq {
            r,
            base,
            n,
            caps,
            tags,
            used: 0,
            done: 0,
            sizes: [0; MAX_RECVS],
            got: [0; MAX_RECVS],
            seen: [0; MAX_RECVS],
            arrived: 0,
            error: None,
            progress_ns: now,
            stall_reported: false,
        };
        let id = self.reqs.insert(req).expect("slot checked");
        self.order.push_back(id);
        self.unmatched += n;
        self.next_r = r.wrapping_add(1);
        self.next_base = base.wrapping_add(u64::from(n));

        // Eager messages held for want of a buffer with their tag, in arrival order: only this
        // receive can have one for them. Every older receive had no unmatched buffer with a
        // held message's tag when the message arrived, or when the older receive was posted and
        // offered the held messages, and buffers are never unmatched again; so `find_buf`
        // would find this receive's first unmatched buffer with the tag, and that is what is
        // looked up here (without scanning the older receives once per held message: a
        // stream's speculative eager sends leave up to MAX_SPECULATIVE held). Stops once every
        // buffer of this receive is matched.
        let mut k = 0;
        while k < self.unexpected.len() && self.failed.is_none() {
            let Some(req) = self.reqs.get(id) else { break };
            if req.all_matched() {
                break;
            }
            let u = self.unexpected[k];
            let free = req.free_buf(u.tag);
            debug_assert_eq!(free.map(|i| (id, i)), self.find_buf(u.tag));
            match free {
                Some(i) => {
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
        self.cover_data_qps();

        // `len` bytes, or the 64-byte compact entry for one buffer on one device
        // (wire::CTS_COMPACT_LEN): the WRITE carries what `encode_parts` gave.
        let len = self.p.cts_entry_len();
        let granted = self.granted;
        let n_bytes = CtsEntry::len_of(bufs, len);
        if n_bytes == CTS_COMPACT_LEN {
            let mut e = [0u8; CTS_COMPACT_LEN];
            CtsEntry::encode_parts(r, granted, base, zeros, bufs, &mut e);
            // Published in the mirror, which the sender may RDMA-read: the head sequence word
            // last, so a reader that sees it (and reads in address order, as a READ does) sees
            // the rest ([`RecvEngine::after_execute`] then pushes it if the sender asks).
            let at = self.p.rec_ring + wire::mirror_slot(r);
            self.actions.push(Action::Stage {
                addr: at + 8,
                bytes: StageBytes::from(&e[8..]),
            });
            self.actions.push(Action::Stage {
                addr: at,
                bytes: StageBytes::from(&e[..8]),
            });
            self.published.push((r, e));
        } else {
            let mut entry = [0u8; CTS_ENTRY_LEN_STRIPED];
            CtsEntry::encode_parts(r, granted, base, zeros, bufs, &mut entry[..n_bytes]);
            let pushed = self.push_cts(r, &entry[..n_bytes]);
            debug_assert!(pushed, "a staging slot was checked free");
        }
        self.last_credit_sent = self.granted;
        Ok(Some(id))
    }

    /// Whether `irecv` published a CTS entry in the mirror that [`RecvEngine::after_execute`]
    /// has not decided on yet: the comm (and the simulated pair) then calls it right after
    /// executing this engine's actions, in the same call.
    pub fn has_published(&self) -> bool {
        !self.published.is_empty()
    }

    /// After the executor carried out `irecv`'s actions (the mirror stores done) and a full
    /// fence: reads the wake word through `mem` and, when it asks for pushes
    /// ([`wire::WAKE_PUSH`]), RDMA-writes the entries published since the last call into the
    /// sender's CTS ring (inline when they fit, as before the mirror existed); with
    /// [`wire::WAKE_PULL`] they stay in the mirror for the sender to read. Returns whether it
    /// queued actions (execute them in the same call).
    ///
    /// Why after the executor and a fence, and not in `irecv`: the sender writes the wake word
    /// and then RDMA-reads the mirror on the same QP, so the responder carries out the write
    /// before the read. Either the read sees the entry (stored before it), or the entry was
    /// stored after the read, hence after the wake word landed, and this load, ordered after
    /// the store, sees the word: the sender never waits for an entry nobody sends
    /// (docs/protocol.md, "The pulled clear-to-send"). A receiver that never calls again is
    /// covered: the decision is made within the `irecv` call that posted the receive.
    pub fn after_execute<M: MemRead + ?Sized>(&mut self, mem: &M) -> bool {
        if self.published.is_empty() {
            return false;
        }
        let push = match mem.read_u64(self.p.rec_ring + wire::WAKE_AT as u64) {
            Some(wire::WAKE_PUSH) => true,
            Some(wire::WAKE_PULL) => false,
            Some(v) => {
                self.published.clear();
                self.fail(ReqError::Protocol(format!(
                    "the sender wrote {v:#x} into the wake word (0: push, 1: pull)"
                )));
                return false;
            }
            None => {
                self.published.clear();
                self.fail(ReqError::Local("the wake word is not readable".into()));
                return false;
            }
        };
        // Taken in order, by copy (the vector keeps its capacity: no allocation per receive).
        let mut queued = false;
        let mut k = 0;
        while let Some(&(r, e)) = self.published.get(k) {
            if !push {
                self.stats.cts_pulled += 1;
            } else if self.push_cts(r, &e) {
                queued = true;
            } else {
                // No staging slot (never: `irecv` counts the published entries against them);
                // the rest waits for the next call rather than being lost.
                break;
            }
            k += 1;
        }
        self.published.drain(..k);
        queued
    }

    /// RDMA-writes CTS entry `bytes` of receive `r` into its slot of the sender's CTS ring,
    /// through a control staging slot (inline when it fits what QP 0 granted). False when no
    /// staging slot is free (nothing queued).
    fn push_cts(&mut self, r: u64, bytes: &[u8]) -> bool {
        let Some((stage, cts_id, signaled)) = self.ctrl_slot(WrKind::Cts) else {
            return false;
        };
        let len = self.p.cts_entry_len();
        let sge = stage_sge(&mut self.actions, stage, self.p.ctrl_stage.1, bytes);
        let opcode = SendOpcode::RdmaWrite {
            remote_addr: self.p.peer_cts_ring.0 + (r % CTS_RING_ENTRIES as u64) * len as u64,
            rkey: self.p.peer_cts_ring.1,
        };
        self.actions.push(Action::PostSend(SendWr {
            signaled,
            inline: u64::from(sge.length) <= self.p.inline_max,
            ..SendWr::one(cts_id, sge, opcode)
        }));
        self.stats.cts += 1;
        true
    }

    /// The buffer the next send tagged `tag` takes: the first unmatched buffer with that tag in
    /// the oldest posted receive that has one. The sender applies the same rule (see
    /// [`crate::engine::SendEngine::isend`]), so both sides agree without extra messages.
    fn find_buf(&mut self, tag: i32) -> Option<(ReqId, usize)> {
        self.front_unmatched();
        let from = |start: usize| {
            self.order
                .range(start..)
                .find_map(|&id| Some((id, self.reqs.get(id)?.free_buf(tag)?)))
        };
        let found = from(self.matched_prefix);
        debug_assert_eq!(found, from(0), "matched_prefix {}", self.matched_prefix);
        found
    }

    /// Moves `matched_prefix` past the receives at the front of `order` whose buffers are all
    /// matched, so that `order[matched_prefix]` is the oldest receive not fully matched, and
    /// returns that receive: its id, buffer count and sequence number (one lookup each, for
    /// `poll_small`, which asks on every poll).
    #[inline]
    fn front_unmatched(&mut self) -> Option<(ReqId, u32, u64)> {
        // Buffers are never unmatched again: the prefix only grows, until `retire`.
        loop {
            let &id = self.order.get(self.matched_prefix)?;
            let r = self.reqs.get(id)?;
            if !r.all_matched() {
                return Some((id, r.n, r.r));
            }
            self.matched_prefix += 1;
        }
    }

    /// Frees request `id` (its `test` reported it): out of its slot, its unmatched buffers out
    /// of `unmatched`, out of `order` with `matched_prefix` kept on the same receives.
    fn retire(&mut self, id: ReqId) {
        if let Some(r) = self.reqs.get(id) {
            self.unmatched -= r.unmatched();
        }
        self.reqs.remove(id);
        if let Some(p) = self.order.iter().position(|&o| o == id) {
            // Most receives complete in order: the oldest, which `pop_front` takes cheaper.
            if p == 0 {
                self.order.pop_front();
            } else {
                self.order.remove(p);
            }
            if p < self.matched_prefix {
                self.matched_prefix -= 1;
            }
        }
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
        self.unmatched -= u32::from(req.match_buf(i));
        req.done |= 1 << i;
        req.arrived += 1;
        if req.seen[i] != 0 {
            let e = ReqError::Protocol(format!(
                "eager send {} (tag {}) matched receive {} buffer {i}, which a data QP's WRITE \
                 WITH IMM named already",
                u.s, u.tag, req.r
            ));
            req.error = Some(e.clone());
            self.fail(e);
            return;
        }
        if u.size > req.caps[i] {
            let e = ReqError::Usage(format!(
                "the peer sent {} bytes (send {}, tag {}) into a receive buffer of {} bytes \
                 (receive {}, buffer {i}); nothing was written",
                u.size, u.s, u.tag, req.caps[i], req.r
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

    /// Feeds one completion of any QP of the connection (the `wr_id` says which WR it was, and
    /// for a data QP's receive WR which QP). `mem` reads bounce headers and records.
    /// Re-posting what it frees waits for [`RecvEngine::after_poll`].
    pub fn handle_wc<M: MemRead + ?Sized>(&mut self, now: u64, wc: &Wc, mem: &M) {
        self.settled = false;
        let Some((kind, _, index)) = wr_parse(wc.wr_id) else {
            self.fail(ReqError::Local(format!(
                "completion with unknown wr_id {:#x}",
                wc.wr_id
            )));
            return;
        };
        if kind == WrKind::DataZero {
            self.data_arrival(now, index, wc);
            return;
        }
        if matches!(kind, WrKind::Bounce | WrKind::Zero) || wc.status != WcStatus::Success {
            // Small sends the sender posted before this arrival landed before it (one QP
            // delivers in order): take them first, so that `next_arrival` is this arrival's
            // send, and so that an error completion (of any WR: the QP failed) loses none of
            // them.
            self.poll_small(now, mem);
        }
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
    fn eager_arrival<M: MemRead + ?Sized>(
        &mut self,
        now: u64,
        s: u64,
        index: u32,
        at: u64,
        wc: &Wc,
        mem: &M,
    ) {
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

    /// A WRITE_WITH_IMM landed on QP 0: a direct write of a send's payload into the buffer its
    /// immediate names (size: `byte_len`; several QPs: that of the piece on QP 0, maybe a
    /// zero-length WRITE whose payload went on a data QP) or a refusal record. `s` counts
    /// arrivals on QP 0, small sends included: it is the send's sequence number (every send
    /// but a small one consumes exactly one receive WR of QP 0, in send order, with any number
    /// of QPs, and the small sends before it were taken first, [`RecvEngine::poll_small`]).
    ///
    /// The buffer named must be the one our own matching gives the next send with its tag;
    /// anything else is a protocol error that fails the comm.
    fn write_arrival<M: MemRead + ?Sized>(&mut self, now: u64, s: u64, wc: &Wc, mem: &M) {
        let Some(imm) = wc.imm.map(wire::imm_decode) else {
            self.fail(ReqError::Protocol(format!(
                "a WRITE WITH IMM (send {s}) arrived without an immediate"
            )));
            return;
        };
        let i = imm.buf;
        // The immediate names the receive and buffer the sender matched; it must be the buffer
        // our own matching gives the next send with that buffer's tag.
        let named = self.named(imm.r_low);
        let tag = named
            .and_then(|id| self.reqs.get(id))
            .filter(|r| i < r.n as usize)
            .map(|r| r.tags[i]);
        let ok = named.is_some() && tag.and_then(|t| self.find_buf(t)) == named.map(|id| (id, i));
        let Some(id) = named.filter(|_| ok) else {
            self.fail(ReqError::Protocol(format!(
                "{} (imm {:#x}: receive {} mod 2^27, buffer {i}) for send {s} names no \
                 unmatched buffer this receiver would give it",
                if imm.record {
                    "a refusal record"
                } else {
                    "a direct write"
                },
                wc.imm.unwrap_or(0),
                imm.r_low,
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
        self.unmatched -= u32::from(req.match_buf(i));
        if !imm.record {
            self.stats.rendezvous += 1;
            self.add_arrival(id, i, 0, wc.byte_len);
            return;
        }
        req.done |= 1 << i;
        req.arrived += 1;
        let cap = req.caps[i];
        // The one record slot (a refusal fails the sender's comm: at most one per connection).
        let mut rb = [0u8; 8];
        let rec = mem.read(rec_ring, &mut rb).then(|| u64::from_le_bytes(rb));
        let e = match rec {
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

    /// Takes the small sends that landed in the small-send ring ([`wire::SmallTrailer`]), in
    /// send order: while the oldest receive not fully matched has one buffer, and its slot's
    /// trailer names it and the next send, the payload is copied into the buffer (queued as an
    /// action, carried out before `test` can report the receive), and the receive is complete. A trailer for a later send waits for the
    /// arrivals before it (on the CQ). Call it after every poll of the CQ; returns whether it
    /// took any. A malformed trailer, or one whose payload does not fit the buffer, fails the
    /// comm.
    ///
    /// Most calls find nothing (a pending `test` asks on every poll), so that answer is kept
    /// cheap: one load of the oldest unmatched receive's sequence word, inline; taking what
    /// landed is a call of its own.
    #[inline]
    pub fn poll_small<M: MemRead + ?Sized>(&mut self, now: u64, mem: &M) -> bool {
        // A receiver on a virtual device gets no small sends (its CTS entries are not compact).
        if self.p.rkeys != 1 || self.failed.is_some() {
            return false;
        }
        let Some((_, 1, r)) = self.front_unmatched() else {
            return false;
        };
        let at = self.p.rec_ring + wire::small_slot(r) + wire::SMALL_MAX + 8;
        if mem
            .read_u64(at)
            .is_some_and(|w| w != SmallTrailer::seq_word(r))
        {
            return false;
        }
        self.take_small(now, mem)
    }

    /// [`RecvEngine::poll_small`]'s taking, once the front receive's sequence word matched (or
    /// could not be read: that fails the comm here).
    #[inline(never)]
    fn take_small<M: MemRead + ?Sized>(&mut self, now: u64, mem: &M) -> bool {
        let mut took = false;
        while self.failed.is_none() {
            // The oldest receive not fully matched: the next send into a posted receive fills it
            // (the front-group rule), and a small send only goes into a known receive.
            let Some((id, 1, r)) = self.front_unmatched() else {
                break;
            };
            let slot = self.p.rec_ring + wire::small_slot(r);
            let at = slot + wire::SMALL_MAX;
            let unreadable =
                || ReqError::Local(format!("small-send slot at {at:#x} is not readable"));
            // The sequence word first (an acquire load), then the word before it: the sender's
            // WRITE lands in address order, the sequence word last.
            match mem.read_u64(at + 8) {
                Some(w) if w == SmallTrailer::seq_word(r) => {}
                Some(_) => break,
                None => {
                    self.fail(unreadable());
                    break;
                }
            }
            let Some(w) = mem.read_u64(at) else {
                self.fail(unreadable());
                break;
            };
            let t = match SmallTrailer::decode(w, r) {
                Ok(t) => t,
                Err(m) => {
                    self.fail(ReqError::Protocol(m));
                    break;
                }
            };
            let s = self.next_arrival;
            if t.s_low != s as u32 {
                // A send after one whose arrival is still in the CQ.
                break;
            }
            let size = u64::from(t.size);
            let req = self.reqs.get_mut(id).expect("found above");
            req.progress_ns = now;
            self.unmatched -= u32::from(req.match_buf(0));
            self.next_arrival = s.wrapping_add(1);
            self.settled = false;
            self.stats.rendezvous += 1;
            self.stats.small_sends += 1;
            // As a direct write's arrival: its size, and a size above the buffer's capacity
            // fails the comm.
            self.add_arrival(id, 0, 0, t.size);
            if self.failed.is_some() {
                break;
            }
            if size > 0 {
                self.actions.push(Action::Copy {
                    src: at - size,
                    req: id,
                    buf: 0,
                    len: size,
                });
            }
            // The trailer stays: its sequence word names this receive only, and the slot's next
            // lap (receive r + SMALL_SLOTS) is written only after this receive completed and
            // that receive's clear-to-send went out.
            took = true;
        }
        took
    }

    /// The posted receive whose sequence number is `r_low` mod 2^27 (an immediate's).
    fn named(&self, r_low: u32) -> Option<ReqId> {
        self.order.iter().copied().find(|&id| {
            self.reqs
                .get(id)
                .is_some_and(|r| wire::imm_matches(r_low, r.r))
        })
    }

    /// Arrivals buffer `g` (global index) expects: one per QP its send uses ([`super::send::wr_plan`]):
    /// split, every QP; round robin, QP 0 alone when `g % qps` is 0, else that QP and QP 0.
    pub(super) fn expected_arrivals(&self, g: u64) -> u8 {
        let qps = self.p.qps.max(1);
        if super::send::whole_on_qp0(g, qps, self.p.split) {
            1
        } else if self.p.split {
            qps
        } else {
            2
        }
    }

    /// Whether buffer `g` (global index) gets an arrival on data QP `q` (`q` ≥ 1).
    pub(super) fn uses_qp(&self, g: u64, q: u8) -> bool {
        q < self.p.qps && (self.p.split || g % u64::from(self.p.qps) == u64::from(q))
    }

    /// Counts an arrival of `bytes` on QP `qp` into buffer `i` of receive `id` (its QP 0
    /// arrival was checked, or a data QP's, [`RecvEngine::data_arrival`]); the buffer is
    /// complete once every arrival it expects came, its size the sum. A sum above its
    /// capacity fails the comm.
    fn add_arrival(&mut self, id: ReqId, i: usize, qp: u8, bytes: u32) {
        let Some(req) = self.reqs.get(id) else {
            return;
        };
        let want = self.expected_arrivals(req.base.wrapping_add(i as u64));
        let req = self.reqs.get_mut(id).expect("found above");
        req.sizes[i] += u64::from(bytes);
        req.got[i] += 1;
        if qp > 0 {
            req.seen[i] |= 1u128 << qp;
        }
        let cap = req.caps[i];
        if req.sizes[i] > cap {
            let e = ReqError::Protocol(format!(
                "the peer wrote {} bytes into a receive buffer of {cap} bytes (receive {}, \
                 buffer {i}; the last write on QP {qp})",
                req.sizes[i], req.r
            ));
            req.error = Some(e.clone());
            self.fail(e);
            return;
        }
        if req.got[i] == want {
            req.done |= 1 << i;
            req.arrived += 1;
        }
    }

    /// A WRITE_WITH_IMM consumed a zero-length receive WR of data QP `qp`: a piece (maybe empty)
    /// of the send into the buffer its immediate names. It may come before the QP 0 arrival of
    /// the same buffer (QPs are not ordered with each other); the buffer holds its count and
    /// bytes until then. It must name a posted receive, a buffer in range that is not
    /// complete, that expects an arrival on this QP and had none there yet; anything else
    /// is a protocol error that fails the comm.
    fn data_arrival(&mut self, now: u64, qp: u32, wc: &Wc) {
        let q = match u8::try_from(qp) {
            Ok(q) if q >= 1 && usize::from(q) <= self.data_posted.len() => q,
            _ => {
                self.fail(ReqError::Local(format!(
                    "a receive completion for data QP {qp} of a connection of {} QPs",
                    self.p.qps
                )));
                return;
            }
        };
        let posted = &mut self.data_posted[usize::from(q) - 1];
        *posted = posted.saturating_sub(1);
        if wc.status != WcStatus::Success {
            self.stats.error_completions += 1;
            if wc.status != WcStatus::WrFlush || self.failed.is_none() {
                self.fail(wc_error(
                    wc.status,
                    &format!("zero-length receive WR on data QP {q}"),
                ));
            }
            return;
        }
        let imm = match (wc.opcode, wc.imm) {
            (WcOpcode::RecvRdmaWithImm, Some(imm)) => wire::imm_decode(imm),
            (op, _) => {
                self.fail(ReqError::Protocol(format!(
                    "a {op:?} completion without an immediate consumed a receive WR of data \
                     QP {q} (only RDMA WRITE WITH IMMs of payload pieces may)"
                )));
                return;
            }
        };
        let i = imm.buf;
        let named = self.named(imm.r_low);
        let why = match named.and_then(|id| self.reqs.get(id).map(|r| (id, r))) {
            _ if imm.record => Some("a record (records go on QP 0 only)"),
            None => Some("no posted receive"),
            Some((_, r)) if i >= r.n as usize => Some("a buffer beyond the receive's"),
            Some((_, r)) if r.done & (1 << i) != 0 => Some("a buffer already complete"),
            Some((_, r)) if !self.uses_qp(r.base.wrapping_add(i as u64), q) => {
                Some("a buffer whose send does not use this QP")
            }
            Some((_, r)) if r.seen[i] & (1u128 << q) != 0 => {
                Some("a buffer that had its arrival on this QP already")
            }
            Some(_) => None,
        };
        let (Some(id), None) = (named, why) else {
            self.fail(ReqError::Protocol(format!(
                "a WRITE WITH IMM on data QP {q} (imm {:#x}: receive {} mod 2^27, buffer {i}) \
                 names {}",
                wc.imm.unwrap_or(0),
                imm.r_low,
                why.unwrap_or("no posted receive")
            )));
            return;
        };
        if let Some(req) = self.reqs.get_mut(id) {
            req.progress_ns = now;
        }
        self.add_arrival(id, i, q, wc.byte_len);
    }

    /// Marks the comm failed; every outstanding request reports `e`.
    pub fn fail(&mut self, e: ReqError) {
        self.settled = false;
        if self.failed.is_none() {
            self.failed = Some(e.clone());
        }
        for (_, r) in self.reqs.iter_mut() {
            if r.error.is_none() && r.arrived < r.n {
                r.error = Some(e.clone());
            }
        }
    }

    /// Marks the comm failed, and every request it holds, complete or not, reports `e`: for an
    /// executor that failed part way through the actions, which may have dropped the copy
    /// (eager or small send) of a receive this engine holds complete.
    pub fn fail_all(&mut self, e: ReqError) {
        self.fail(e.clone());
        for (_, r) in self.reqs.iter_mut() {
            if r.error.is_none() {
                r.error = Some(e.clone());
            }
        }
    }

    /// Polls request `id`: `Ok(Some(sizes))` once every buffer received its send (the slot is
    /// then free; `sizes[i]` = bytes received into buffer `i`), `Ok(None)` while in progress.
    pub fn test(&mut self, id: ReqId) -> Result<Option<Sizes>, ReqError> {
        // (Leaves `settled` alone: what `after_poll` does depends on the receive queue and the
        // credits, never on the requests `test` hands back.)
        let Some(req) = self.reqs.get(id) else {
            return Err(ReqError::Local(format!(
                "test of an unknown or finished receive request {id:?}"
            )));
        };
        if let Some(e) = req.error.clone() {
            // The comm failed (a usage error leaves the send/receive pairing undefined): every
            // later call returns the error too.
            self.retire(id);
            self.fail(e.clone());
            return Err(e);
        }
        if req.arrived < req.n {
            return Ok(None);
        }
        let sizes = Sizes::of(&req.sizes[..req.n as usize]);
        self.retire(id);
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

    /// For receive `id` with several QPs: each buffer that has some of its arrivals but not all,
    /// as "buffer `i`: QP 0, 2" naming the QPs whose arrival is still missing (QP 0's is the one
    /// that matches the buffer). Empty when no buffer is partly arrived.
    fn missing_qps(&self, id: ReqId) -> Vec<String> {
        let Some(r) = self.reqs.get(id) else {
            return Vec::new();
        };
        (0..r.n as usize)
            .filter(|&i| r.got[i] > 0 && r.done & (1 << i) == 0)
            .map(|i| {
                let g = r.base.wrapping_add(i as u64);
                let qps: Vec<String> = (0..self.p.qps)
                    .filter(|&q| {
                        let arrived = if q == 0 {
                            r.used & (1 << i) != 0
                        } else {
                            r.seen[i] & (1u128 << q) != 0
                        };
                        (q == 0 || self.uses_qp(g, q)) && !arrived
                    })
                    .map(|q| q.to_string())
                    .collect();
                format!("buffer {i}: QP {}", qps.join(", "))
            })
            .collect()
    }

    /// Requests idle for at least `timeout_ns`, each reported once.
    pub fn stalls(&mut self, now: u64, timeout_ns: u64) -> Vec<Stall> {
        let mut out = Vec::new();
        let stalled: Vec<ReqId> = self
            .reqs
            .iter_mut()
            .filter(|(_, r)| {
                !r.stall_reported
                    && r.error.is_none()
                    && now.saturating_sub(r.progress_ns) >= timeout_ns
            })
            .map(|(id, _)| id)
            .collect();
        for id in stalled {
            let missing = self.missing_qps(id);
            let Some(r) = self.reqs.get_mut(id) else {
                continue;
            };
            r.stall_reported = true;
            let waiting_for = if r.arrived < r.n && !missing.is_empty() {
                format!(
                    "data from the sender: {} of {} buffers filled; part of a buffer's data \
                     arrived and the rest has not, on {} (the peer's WRITE WITH IMMs there are \
                     not acknowledged: that QP's path or the peer may be broken; see the sender's \
                     stalled sends)",
                    r.arrived,
                    r.n,
                    missing.join("; ")
                )
            } else if r.arrived < r.n {
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
    fn recycle_recv_lists(&mut self, spent: &mut Vec<Vec<RecvWr>>) {
        let max = self.spare_lists_max();
        while let Some(mut v) = spent.pop() {
            if self.spare_recv_lists.len() >= max {
                spent.clear();
                break;
            }
            // Grown here, once per list, to the longest post seen: whichever post takes it
            // next then fits.
            v.reserve(self.recv_list_len);
            self.spare_recv_lists.push(v);
        }
    }

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
