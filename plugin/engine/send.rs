//! The sending side of a connection.

use std::collections::VecDeque;

use super::wire::{
    self, CtsBuf, CtsEntry, EagerHeader, Keys, SmallTrailer, CTS_ENTRY_LEN_STRIPED, EAGER_HDR_LEN,
    REC_TOO_BIG, SMALL_TRAILER_LEN,
};
use super::{
    piece_index, piece_parse, stage_sge, wc_error, wr_id, wr_parse, Action, MemRead, ReqError,
    ReqId, Slots, StageBytes, Stall, Stats, WrKind, CTS_RING_ENTRIES, INLINE_SIGNAL_EVERY,
    MAX_INLINE_UNACKED, MAX_SEND_REQUESTS, MAX_SPECULATIVE, SPLIT_ALIGN,
};
use crate::transport::{SendOpcode, SendWr, Sge, Wc, WcStatus};

/// Fixed parameters of a send engine, agreed in the connection handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendParams {
    /// Largest payload sent eagerly: min(our `VERBSNET_EAGER_LIMIT`, the receiver's bounce
    /// buffer size).
    pub eager_limit: u64,
    /// Largest direct send posted inline, its request completing at the post
    /// (`VERBSNET_INLINE_SIZE`, capped at what QP 0 granted: `QueuePair::max_inline_data`);
    /// 0: none.
    pub inline_max: u64,
    /// Credit gating on.
    pub credits: bool,
    /// QPs of the connection (`1..=MAX_QPS_PER_CONNECTION`, `VERBSNET_IB_QPS_PER_CONNECTION`,
    /// the sender's, which the receiver adopts). QP 0 carries everything of one QP; the others
    /// only the RDMA WRITE WITH IMMs of direct sends' pieces ([`super::Action::PostSendQp`]).
    pub qps: u8,
    /// Split each direct send evenly over all QPs in [`super::SPLIT_ALIGN`]-byte pieces
    /// (`VERBSNET_IB_SPLIT_DATA_ON_QPS`); otherwise each send goes whole on one QP, round robin
    /// by the receive buffer's index ([`wr_plan`]).
    pub split: bool,
    /// Receive WRs the receiver posted before the handshake finished (initial credits).
    pub initial_credits: u64,
    /// Our staging area for eager headers: `MAX_SEND_REQUESTS * EAGER_HDR_LEN` bytes (addr, lkey).
    pub hdr_stage: (u64, u32),
    /// Our staging word for the refusal record: 8 bytes (addr, lkey).
    pub rec_stage: (u64, u32),
    /// The receiver's record region (addr, rkey): the record slot, the small-send ring, the
    /// CTS mirror and the wake word, [`wire::REC_REGION_LEN`] bytes in all.
    pub peer_rec_ring: (u64, u32),
    /// Our CTS ring, which the receiver RDMA-writes: `CTS_RING_ENTRIES * cts_entry_len(rkeys)`
    /// bytes.
    pub cts_ring: u64,
    /// The receiver's devices (`1..=MAX_DEVS`; more than one: it listens on a virtual device,
    /// `makeVDevice`): each buffer of its CTS entries carries that many rkeys, and the entries
    /// are [`wire::cts_entry_len`]`(rkeys)` bytes.
    pub rkeys: u8,
    /// Our credit word (cumulative credits granted), which the receiver RDMA-writes: 8 bytes.
    pub credit_word: u64,
    /// Our landing ring ([`wire::LANDING_LEN`] bytes, addr and lkey): the receiver's CTS
    /// mirror is RDMA-read into its first [`wire::MIRROR_LEN`] bytes; the two words behind
    /// are the sources of the wake word WRITEs.
    pub landing: (u64, u32),
    /// Pull the clear-to-send (`VERBSNET_CTS_PULL`): once eight entries are in hand, ask the
    /// receiver to stop pushing them and RDMA-read its mirror when one is needed. Off: the
    /// receiver pushes every entry, as before wire version 9.
    pub cts_pull: bool,
    /// Sequence number of the first send and the first receive (0 in production; tests start
    /// near wrap points).
    pub first_seq: u64,
    /// Generation of every request slot's first use (0 in production; tests start near the
    /// 24-bit `wr_id` generation wrap).
    pub first_gen: u32,
}

/// The WRs a direct send of `size` bytes into the receive buffer with global index `g` (its
/// receive's CTS `base` + the buffer's index) posts over `qps` QPs, as `(QP index, offset,
/// length)`, in QP order; each is an RDMA WRITE WITH IMM (length 0: a zero-length one).
///
/// NCCL IB's shape (`src/transport/net_ib/p2p.cc`, `ncclIbMultiSend`; `common.h`,
/// `ncclIbCommBaseGetQpForRequest`): with `split` every QP gets one WR, piece `i` (offset
/// `i * chunk`, `chunk = ⌈⌈size / qps⌉ / SPLIT_ALIGN⌉ × SPLIT_ALIGN` bytes, the last shorter)
/// on QP `i`, and QPs past the end of the payload a zero-length one. Without `split` the whole
/// payload goes on QP `g % qps` (NCCL takes its request id; the buffer's index tells the
/// receiver the QP without a message), plus, when that is not QP 0, a zero-length WR on QP 0,
/// so that every direct send consumes one receive WR of QP 0 in send order. One QP: one WR.
/// (A small send is not planned here: one inline RDMA WRITE on QP 0, no receive WR,
/// [`SendEngine::isend`].)
pub fn wr_plan(size: u64, g: u64, qps: u8, split: bool) -> impl Iterator<Item = (u8, u64, u64)> {
    let n = u64::from(qps.max(1));
    let chunk = size.div_ceil(n).div_ceil(SPLIT_ALIGN) * SPLIT_ALIGN;
    let q = g % n;
    let (qs, zero_on_qp0) = if split {
        (0..n, false)
    } else {
        (q..q + 1, q != 0)
    };
    qs.map(move |i| {
        if split {
            let off = (i * chunk).min(size);
            (i as u8, off, chunk.min(size - off))
        } else {
            (i as u8, 0, size)
        }
    })
    .chain(zero_on_qp0.then_some((0, 0, 0)))
}

/// Whether [`wr_plan`] sends a direct send into the buffer with global index `g` whole, as one
/// WR on QP 0: one QP, or round robin (no `split`) and `g % qps` = 0. Such a buffer expects one
/// arrival at the receiver, and only such a send may go inline or small.
pub fn whole_on_qp0(g: u64, qps: u8, split: bool) -> bool {
    qps <= 1 || (!split && g.is_multiple_of(u64::from(qps)))
}

#[derive(Debug)]
struct SendReq {
    s: u64,
    size: u64,
    tag: i32,
    wc_done: bool,
    matched: bool,
    error: Option<ReqError>,
    progress_ns: u64,
    stall_reported: bool,
    /// A direct send over several QPs: bit `q` = its WR on QP `q` has not completed yet.
    pieces: u128,
    /// WRs it went in (0: one direct WRITE_WITH_IMM, or not direct).
    npieces: u8,
    /// Inline sends posted before it: its WR on QP 0 completing shows them acknowledged too
    /// (WRs of a QP complete in order).
    inline_before: u64,
}

/// A receive group whose clear-to-send we have read and which is not fully matched: its
/// entry (buffer `i`'s global index is `e.base + i`, round robin QP) and which buffers are
/// matched.
#[derive(Debug)]
struct Group {
    e: CtsEntry,
    /// Bit `i`: buffer `i` is matched to a send.
    used: u8,
}

impl Group {
    /// The first unmatched buffer tagged `tag`.
    fn find(&self, tag: i32) -> Option<usize> {
        (0..self.e.n as usize).find(|&i| self.used & (1 << i) == 0 && self.e.bufs[i].tag == tag)
    }

    fn full(&self) -> bool {
        self.used.count_ones() == self.e.n
    }
}

/// The known groups, oldest first: a ring over slots that stay allocated, so that a new
/// group's entry is decoded into a free slot where it lies. (A `Group` is about 490 bytes,
/// its eight buffers with room for eight rkeys each; pushing a blank one onto a `VecDeque`
/// to decode into copied that much per clear-to-send.) Grows as a `VecDeque` does, to the
/// most groups ever known at once, and never shrinks.
#[derive(Debug, Default)]
struct Groups {
    slots: Vec<Group>,
    /// The oldest group's slot.
    head: usize,
    len: usize,
}

impl Groups {
    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The slot of group `i` (0 = the oldest), for `i <= len` while `slots` is not empty:
    /// `head + i` is then below twice the slot count, so one subtraction wraps it (a division
    /// on every lookup measured about 60 instructions per message).
    #[inline]
    fn slot(&self, i: usize) -> usize {
        let k = self.head + i;
        debug_assert!(i <= self.len && k < 2 * self.slots.len());
        if k >= self.slots.len() {
            k - self.slots.len()
        } else {
            k
        }
    }

    fn get(&self, i: usize) -> Option<&Group> {
        (i < self.len).then(|| &self.slots[self.slot(i)])
    }

    fn front(&self) -> Option<&Group> {
        self.get(0)
    }

    fn back(&self) -> Option<&Group> {
        self.len.checked_sub(1).and_then(|i| self.get(i))
    }

    fn pop_front(&mut self) {
        if self.len > 0 {
            self.head = self.slot(1);
            self.len -= 1;
        }
    }

    fn pop_back(&mut self) {
        self.len = self.len.saturating_sub(1);
    }

    /// A new newest group, nothing matched; its entry holds what the slot held before, for
    /// the caller to overwrite (`CtsEntry::decode_into` and `CtsEntry::decode_compact` write
    /// every field a reader uses: the header and buffers `0..n`).
    fn push_slot(&mut self) -> &mut Group {
        if self.len == self.slots.len() {
            // Full (or never used): contiguous from slot 0 again, one slot more at the end.
            self.slots.rotate_left(self.head);
            self.head = 0;
            self.slots.push(Group {
                e: CtsEntry::BLANK,
                used: 0,
            });
        }
        let k = self.slot(self.len);
        self.len += 1;
        let g = &mut self.slots[k];
        g.used = 0;
        g
    }

    fn push_back(&mut self, g: Group) {
        *self.push_slot() = g;
    }

    fn iter(&self) -> impl Iterator<Item = &Group> {
        (0..self.len).map(|i| &self.slots[self.slot(i)])
    }
}

impl std::ops::Index<usize> for Groups {
    type Output = Group;
    fn index(&self, i: usize) -> &Group {
        self.get(i).expect("a known group")
    }
}

impl std::ops::IndexMut<usize> for Groups {
    fn index_mut(&mut self, i: usize) -> &mut Group {
        assert!(i < self.len, "a known group");
        let k = self.slot(i);
        &mut self.slots[k]
    }
}

/// Why `isend` last answered "retry later".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    Credit,
    Cts,
    /// The front group has no unmatched buffer with this tag.
    Tag(i32),
    Slots,
}

/// The send engine. See the module docs of [`crate::engine`] for the protocol.
#[derive(Debug)]
pub struct SendEngine {
    p: SendParams,
    reqs: Slots<SendReq>,
    /// Where `take_entry` copies a landed full CTS entry to decode it, whole (its tail word is
    /// the slot's end; a compact entry is copied onto the stack). Never zeroed: only the bytes
    /// just copied are read.
    entry_scratch: [u8; CTS_ENTRY_LEN_STRIPED],
    next_s: u64,
    next_r: u64,
    next_base: u64,
    /// Known receive groups not fully matched, in posting order (front = the oldest).
    groups: Groups,
    /// Speculative eager sends (issued when no receive was known) not yet matched, in send order.
    unassigned: VecDeque<ReqId>,
    /// Receive WRs the receiver has posted so far (cumulative, both kinds), as far as we know.
    credits_granted: u64,
    /// Receive WRs our sends consumed so far: the `k`-th send (counted from the first) that
    /// consumes one takes the receiver's WR `k`, in posting order (RC: one RQ, consumed in
    /// order); small sends consume none.
    credits_used: u64,
    /// The zero-length receive WRs the receiver announced in CTS entries and that our sends
    /// have not consumed yet, as `[start, end)` WR index ranges in posting order. A SEND must
    /// never consume one.
    zeros: VecDeque<(u64, u64)>,
    /// What we know of each receive WR below this index is exact: the CTS entries read so far
    /// announced every zero-length WR below the highest `credits` they carried.
    exact_below: u64,
    /// From the credit word: every WR from this index on (below the credits granted) is
    /// bounce-backed.
    z_end: u64,
    failed: Option<ReqError>,
    actions: Vec<Action>,
    stats: Stats,
    refusing: Option<(u64, Refusal, bool)>,
    /// Refused for want of a credit since the last credit-consuming send: the next one tells
    /// the receiver (eager header flag, record bit 62), which grows its queue.
    starved: bool,
    /// Inline sends posted so far (the next one's inline sequence number).
    inline_posted: u64,
    /// Inline sends known acknowledged: every one below this number (a signaled one's
    /// completion covers those before it).
    inline_acked: u64,
    /// `inline_posted` when the last flush write was posted ([`SendEngine::flush_inline`]).
    inline_flushed: u64,
    /// When the oldest unacknowledged inline send was posted, and whether its stall was
    /// reported (hang watchdog).
    inline_since: Option<(u64, bool)>,
    /// What the receiver's wake word says, as we last wrote it: it pushes its compact CTS
    /// entries (true, [`wire::WAKE_PUSH`], where every connection starts) or leaves them in its
    /// mirror for us to READ (false).
    pushing: bool,
    /// The READ of the receiver's CTS mirror.
    read: Pull,
    /// The landing ring holds a completed READ's snapshot of the mirror, consulted for every
    /// entry not in the CTS ring until the next READ is posted (not only right after the
    /// READ: an entry behind a grouped one still on its way in the CTS ring is taken once that
    /// one landed; the receiver never writes it if it saw us pulling). Immutable meanwhile;
    /// the sequence words tell an older lap's slot.
    landing_valid: bool,
    /// The receive whose entry the landing ring's snapshot was found not to hold (or not
    /// whole): while the snapshot stays (`landing_valid`), the same slot gives the same answer,
    /// so the polls that follow skip it until the entry comes through the CTS ring or a new
    /// READ lands. Most polls of a pulling sender find nothing new, and this spares each a
    /// second slot read.
    landing_lacks: Option<u64>,
    /// `next_r` when the last READ was posted: the entries taken since (from the landing
    /// ring, or from the CTS ring where the receiver wrote them meanwhile) tell whether the
    /// receiver is ahead.
    read_from: u64,
    /// One-buffer entries the receiver pushed since we last asked it to stop (or since the
    /// connection began): at [`SendEngine::probe_every`] of them we try pulling again.
    pushed_since: u64,
    /// Pushed entries after which a sender that is being pushed tries pulling again
    /// ([`PROBE_MIN`]; doubled up to [`PROBE_MAX`] after each pull phase that brought fewer
    /// than [`PROBE_PAID`] entries, back to the minimum after one that brought more).
    probe_every: u64,
    /// `next_r` when we last asked the receiver to stop pushing: the entries known since
    /// tell, when we ask for pushes again, whether that pull phase paid.
    pull_since: u64,
    /// READs that may still find fewer than [`PULL_MIN_PER_READ`] receives known before a
    /// receiver that a READ found posting ahead is taken to post just in time
    /// ([`AHEAD_READS`] after each READ that found at least that many, one fewer after each
    /// that did not; 0 before any).
    ahead_reads_left: u32,
    /// READs in a row that a send waited for and that brought no entry, each followed by
    /// another READ later rather than by the wake word ([`READ_PATIENCE`]); back to 0 once
    /// any entry arrives ([`SendEngine::adopt_newest`]) or the wake word goes.
    empty_reads: u32,
    /// The caller's fine clock (ns, [`SendEngine::set_clock`]) as last given: the comm reads
    /// one only while [`SendEngine::wants_clock`] (a READ is in flight, or a send may READ or
    /// is pausing), so every other call keeps its coarse clock. 0 before any.
    clock_ns: u64,
    /// `clock_ns` when the last READ was posted and when its completion was polled: a pause
    /// after an empty READ is a multiple of that round trip.
    read_times: (u64, u64),
    /// The fine clock's time at which a send that needs an entry may READ again, after an
    /// empty READ ([`READ_PATIENCE`]); `None`: at once.
    pause_until: Option<u64>,
    /// Refused `isend` calls while a pause lasts: it also ends after
    /// [`READ_PAUSE_MAX_CALLS`] of them, so a caller that gives no clock (its time never
    /// moves) still gets its next READ.
    pause_calls: u64,
}

/// Where the sender's RDMA READ of the receiver's CTS mirror stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pull {
    /// None in flight (the landing ring holds the last one's snapshot, if any).
    Idle,
    /// Posted, not completed: the landing ring is being written. `woke`: the wake word
    /// ([`wire::WAKE_PUSH`]) was written just before it on QP 0.
    InFlight { woke: bool },
    /// Completed: the landing ring holds the mirror as the READ found it, and
    /// `poll_peer_writes` has not yet decided what the READ means (`after_entries`).
    Landed { woke: bool },
}

/// Known receive groups in hand at which a sender that is being pushed CTS entries asks the
/// receiver to stop (the receiver is ahead: one READ will bring many).
const PULL_AT_GROUPS: usize = 8;

/// A READ a send waited for that brought fewer entries than this, from a receiver that none
/// of the last [`AHEAD_READS`] READs found this many receives ahead, says it posts each
/// receive about when the sender needs it (a ping-pong with one receive posted): it is asked
/// to push again, which costs it no more WRs than the READs would and the sender no round
/// trip per entry.
///
/// A receiver that READs found this many ahead is, when a READ then brings fewer, usually only
/// re-posting slower than we send: a proxy that makes one step per op per loop, as NCCL's does
/// (`src/transport/net.cc`: each `recvProxyProgress` call posts one receive or tests one),
/// re-posts one receive every other pass in a stream both ways, while its own sends go out
/// every pass. Asking it to push then costs it a WRITE per receive on the CPU its own sends
/// need, and the pair settles with one side pushing every entry and the other refused most of
/// its `isend`s: on rxe, a 64 B stream both ways under that order ran at 0.78x the rate
/// (0.59-0.82 by round) with this rule applied to it too (docs/performance.md, "NCCL's proxy
/// order"). We keep pulling: each READ brings what was posted meanwhile.
const PULL_MIN_PER_READ: u64 = 4;

/// READs in a row that find fewer than [`PULL_MIN_PER_READ`] receives known after which a
/// receiver that an earlier READ found posting ahead is asked to push on the next such READ
/// ([`PULL_MIN_PER_READ`]): a connection that turns from a stream to a ping-pong pays this many
/// READ round trips once (about 13 ms on rxe, microseconds on a NIC). Under NCCL's proxy order
/// a stream both ways has long runs of READs that bring 1-3 between ones that bring many: with
/// 4 or 5 such READs in a row a 4 KiB stream both ways on rxe went back to one side pushing
/// every entry in every round, and with 32 an 8 B one in 2 of 4 rounds (docs/performance.md,
/// "NCCL's proxy order").
pub(crate) const AHEAD_READS: u32 = 256;

/// Pushed one-buffer entries after which a sender that is being pushed tries pulling again,
/// at first and after a pull phase that paid. Pushing is sticky: a receiver that pushes
/// spends a WR per receive and falls behind the sends, so entries arrive one by one just in
/// time and [`PULL_AT_GROUPS`] are never in hand; once it stops pushing it often gets ahead
/// again (in a stream both ways on rxe, READs then brought 26 entries each). A probe that
/// finds it still behind costs a wake word, a READ, the wake word back and a second READ
/// (and up to [`READ_PATIENCE`] READs more when its first READ comes back empty).
const PROBE_MIN: u64 = 32;

/// The longest interval between probes, in pushed entries: a pattern where pushes are right
/// (the receiver posts each receive just before the send needs it) pays one probe, 4 to 7
/// WRs, per this many messages.
const PROBE_MAX: u64 = 1024;

/// A pull phase that brought at least this many entries paid for its probe: the next probe
/// comes after [`PROBE_MIN`] pushed entries again; one that brought fewer doubles the
/// interval.
const PROBE_PAID: u64 = 2 * PROBE_MIN;

/// READs after an empty one before the sender asks for pushes: a READ a send waited for that
/// brought no entry is followed by up to this many more, each after a pause twice as long as
/// the one before ([`READ_PAUSE_RTTS`], then twice and four times that many of the last READ's
/// round trips on the caller's fine clock, at most [`READ_PAUSE_MAX_NS`]); the wake word comes
/// only after the last of them came back empty too. A receiver whose process is busy sending
/// (traffic both ways) re-posts its receives in bursts, a while after the data landed: a READ
/// sent right after our last send finds none of them, and asking for pushes then would cost it
/// a WR per receive (pushing is sticky, see [`PROBE_MIN`]); the READ a little later brings the
/// whole burst. A receiver that stays idle costs 1 + this many READs before the wake word,
/// spread over 18 round trips (4 READs, pauses of 2, 4 and 8).
pub(crate) const READ_PATIENCE: u32 = 3;

/// The first pause after an empty READ, in that READ's round trips, from its post to the
/// poll that found its completion (the next pauses are twice and four times as long). Timed
/// on the caller's fine clock ([`SendEngine::set_clock`]): counted in the caller's refused
/// `isend` calls instead (`3ec1619`), the same rule left a 64 B stream both ways on rxe at
/// 1.07–1.53 WRs per message by boot and round, where on the clock it took 1.07–1.12 in all 7
/// rounds of two boots, 3 of them with a 4 ms cap (docs/performance.md, "The READ pause on a
/// fine clock").
pub(crate) const READ_PAUSE_RTTS: u64 = 2;

/// The longest pause before a READ after an empty one, in nanoseconds: it bounds the wait of
/// a send whose receiver posts just after an empty READ when the round trip itself is long
/// (a loaded soft-RoCE peer: hundreds of microseconds; a hardware NIC's READ takes a few).
pub(crate) const READ_PAUSE_MAX_NS: u64 = 1_000_000;

/// The longest pause before a READ after an empty one, in refused `isend` calls: where the
/// caller gives no clock, its time never moves, and only this ends the pause.
pub(crate) const READ_PAUSE_MAX_CALLS: u64 = 1 << 16;

impl SendEngine {
    /// A send engine for a freshly connected comm.
    pub fn new(p: SendParams) -> SendEngine {
        let mut e = SendEngine {
            next_s: p.first_seq,
            next_r: p.first_seq,
            next_base: p.first_seq,
            credits_granted: p.initial_credits,
            credits_used: 0,
            zeros: VecDeque::new(),
            exact_below: p.initial_credits,
            z_end: 0,
            reqs: Slots::with_first_gen(MAX_SEND_REQUESTS, p.first_gen),
            entry_scratch: [0; CTS_ENTRY_LEN_STRIPED],
            groups: Groups::default(),
            unassigned: VecDeque::new(),
            failed: None,
            actions: Vec::new(),
            stats: Stats {
                pinned_bytes: wire::send_comm_buffers(p.rkeys).iter().sum::<usize>() as u64,
                ..Stats::default()
            },
            refusing: None,
            starved: false,
            inline_posted: 0,
            inline_acked: 0,
            inline_flushed: 0,
            inline_since: None,
            pushing: true,
            read: Pull::Idle,
            read_from: p.first_seq,
            landing_valid: false,
            landing_lacks: None,
            pushed_since: 0,
            ahead_reads_left: 0,
            probe_every: PROBE_MIN,
            pull_since: p.first_seq,
            empty_reads: 0,
            clock_ns: 0,
            read_times: (0, 0),
            pause_until: None,
            pause_calls: 0,
            p,
        };
        if e.p.cts_pull {
            // The sources of the wake word WRITEs: never rewritten, so a WRITE posted without
            // inline may read its word whenever the NIC gets to it.
            let words = e.p.landing.0 + wire::MIRROR_LEN as u64;
            e.actions.push(Action::Stage {
                addr: words,
                bytes: StageBytes::from(&wire::WAKE_PUSH.to_le_bytes()[..]),
            });
            e.actions.push(Action::Stage {
                addr: words + 8,
                bytes: StageBytes::from(&wire::WAKE_PULL.to_le_bytes()[..]),
            });
        }
        e
    }

    /// The receive sequence number whose CTS is expected next (CTS ring slot
    /// `r % CTS_RING_ENTRIES`).
    pub fn expected_cts(&self) -> u64 {
        self.next_r
    }

    /// Reads what the receiver RDMA-wrote into our memory since the last call and feeds it in:
    /// the clear-to-send entries in order from the CTS ring, then the credit word. Call it
    /// before `isend` and whenever the comm makes progress. An entry not (fully) written yet is
    /// left for a later call (the sequence word at both ends says so, see [`wire`]); a corrupt
    /// or out-of-sequence one fails the comm. Returns whether a CTS arrived.
    pub fn poll_peer_writes<M: MemRead + ?Sized>(&mut self, now: u64, mem: &M) -> bool {
        let mut got = false;
        let word = mem.read_u64(self.p.credit_word);
        let len = wire::cts_entry_len(self.p.rkeys);
        while self.failed.is_none() {
            let r = self.next_r;
            let at = self.p.cts_ring + (r % CTS_RING_ENTRIES as u64) * len as u64;
            match self.take_entry(now, at, len, r, mem) {
                Some(true) => {
                    got = true;
                    continue;
                }
                Some(false) => {}
                None => break,
            }
            // Pushed or not, the same entry may be in the landing ring, once a READ of the
            // mirror completed (not while one is in flight: it may be landing).
            if !self.landing_valid || self.landing_lacks == Some(r) {
                break;
            }
            let at = self.p.landing.0 + wire::mirror_slot(r) - wire::MIRROR_AT as u64;
            match self.take_entry(now, at, wire::CTS_COMPACT_LEN, r, mem) {
                Some(true) => {
                    got = true;
                    self.stats.cts_pulled += 1;
                }
                Some(false) => {
                    self.landing_lacks = Some(r);
                    break;
                }
                None => break,
            }
        }
        if let Some(word) = word.filter(|&w| w != 0) {
            self.handle_credit(word);
        }
        if self.failed.is_none() {
            self.after_entries();
        }
        got
    }

    /// Takes receive `r`'s entry from the slot at `at` (of `len` bytes: the CTS ring's stride,
    /// or [`wire::CTS_COMPACT_LEN`] in the landing ring, which holds compact entries only) as
    /// the newest known group. `Some(true)`: taken; `Some(false)`: not (fully) there; `None`:
    /// the comm failed (an unreadable slot, a corrupt or out-of-sequence entry).
    fn take_entry<M: MemRead + ?Sized>(
        &mut self,
        now: u64,
        at: u64,
        len: usize,
        r: u64,
        mem: &M,
    ) -> Option<bool> {
        let unreadable = || ReqError::Local(format!("CTS slot at {at:#x} is not readable"));
        // The head sequence word first: most polls find no new entry, and then the rest needs
        // no copy. Once it names the entry, the entry is copied once, up to where its tail word
        // ends (a compact entry's at 64, a full one's at the slot's end), and the decoder
        // (`decode_compact` or `decode_into`) checks both words of the copy: a tail not landed
        // yet leaves the entry for a later poll.
        let Some(head) = mem.read_u64(at) else {
            self.fail(unreadable());
            return None;
        };
        if CtsEntry::head_pending(head, r) {
            return Some(false);
        }
        if len == wire::CTS_COMPACT_LEN && head & wire::CTS_COMPACT == 0 {
            self.fail(ReqError::Protocol(format!(
                "the CTS mirror's slot for receive {r} holds a full entry (head {head:#x}); it \
                 holds compact ones only"
            )));
            return None;
        }
        let stride = wire::cts_entry_len(self.p.rkeys);
        let end = CtsEntry::tail_at(head, stride) + 8;
        // The tail word on its own before the copy: the receiver's WRITE lands in address
        // order, the tail last, so once the tail names the entry a copy read after it is
        // whole. (A copy alone reads the tail last, and could pair an entry's new tail with
        // body bytes read before they landed.)
        let Some(tail) = mem.read_u64(at + end as u64 - 8) else {
            self.fail(unreadable());
            return None;
        };
        match CtsEntry::landed(head, tail, r) {
            Ok(true) => {}
            Ok(false) => return Some(false),
            Err(m) => {
                self.fail(ReqError::Protocol(m));
                return None;
            }
        }
        // Decoded where it is kept, the newest known group (no copy of the entry); taken out
        // again unless it landed whole and valid.
        let decoded = if head & wire::CTS_COMPACT != 0 {
            // NCCL's usual receive: its 64 bytes on the stack, decoded without the cases of
            // a full entry.
            let mut b = [0u8; wire::CTS_COMPACT_LEN];
            if !mem.read(at, &mut b) {
                self.fail(unreadable());
                return None;
            }
            CtsEntry::decode_compact(&b, r, &mut self.groups.push_slot().e)
        } else {
            // Copied into the engine's scratch, whole: a full entry ends at the slot's end.
            let b = &mut self.entry_scratch[..stride];
            if !mem.read(at, &mut b[..end]) {
                self.fail(unreadable());
                return None;
            }
            CtsEntry::decode_into(
                &self.entry_scratch[..stride],
                r,
                &mut self.groups.push_slot().e,
            )
        };
        match decoded {
            Ok(true) => {
                // A one-buffer entry the receiver wrote into the CTS ring (not the landing
                // ring's compact stride) while asked to push: toward a probe.
                if self.pushing
                    && len != wire::CTS_COMPACT_LEN
                    && self.groups.back().is_some_and(|g| g.e.n == 1)
                {
                    self.pushed_since += 1;
                }
                self.adopt_newest(now).ok().map(|()| true)
            }
            Ok(false) => {
                self.groups.pop_back();
                Some(false)
            }
            Err(m) => {
                self.groups.pop_back();
                self.fail(ReqError::Protocol(m));
                None
            }
        }
    }

    /// Whether we pull: `VERBSNET_CTS_PULL` is on and the receiver was asked to stop pushing
    /// its CTS entries (a receive posted since is learnt of by a READ, when a send needs it).
    pub fn pulls(&self) -> bool {
        self.p.cts_pull && !self.pushing
    }

    /// After the entries were read: what a completed READ of the mirror means, and whether
    /// to ask the receiver to stop pushing.
    ///
    /// - A READ (a send waited for it) followed by no entry, or by fewer than
    ///   [`PULL_MIN_PER_READ`] from a receiver that none of the last [`AHEAD_READS`] READs
    ///   found that many ahead (the receiver had not posted the one the send needs, or posts
    ///   each just in time), is followed by
    ///   the wake word ([`wire::WAKE_PUSH`]) and a second READ, in that order on QP 0: either
    ///   that READ finds the entry, or the receiver sees the word when it posts the receive
    ///   and pushes it (its `after_execute`). A second READ that finds nothing leaves us
    ///   waiting for the push, not polling with READs. Before that, a READ that brought no
    ///   entry at all is followed by up to [`READ_PATIENCE`] more, each after a longer pause
    ///   (the pause timed on the caller's fine clock, [`SendEngine::set_clock`]).
    /// - While the receiver pushes, with [`PULL_AT_GROUPS`] receives known (the receiver is
    ///   ahead) or [`SendEngine::probe_every`] one-buffer entries pushed since the last pull
    ///   phase (a probe: it may be ahead once it stops pushing), all known receives of one
    ///   buffer on one device (the entries the receiver mirrors: grouped and multi-device ones
    ///   are always written, and a READ would bring none of them) and no speculative send
    ///   unmatched, the wake word goes to [`wire::WAKE_PULL`].
    fn after_entries(&mut self) {
        if let Pull::Landed { woke } = self.read {
            self.read = Pull::Idle;
            let took = self.next_r.wrapping_sub(self.read_from);
            // Whether READs lately found the receiver posting ahead, before this one counts.
            let ahead = self.ahead_reads_left > 0;
            self.ahead_reads_left = if self.groups.len() >= PULL_MIN_PER_READ as usize {
                AHEAD_READS
            } else {
                self.ahead_reads_left.saturating_sub(1)
            };
            if !woke && self.pulls() && took == 0 && self.empty_reads < READ_PATIENCE {
                // A send waited for this READ and it brought nothing: the receiver may be
                // busy; the send READs again after a pause, not at its next try.
                self.empty_reads += 1;
                let (posted, landed) = self.read_times;
                let rtt = landed.saturating_sub(posted).max(1);
                let rtts = READ_PAUSE_RTTS << (self.empty_reads - 1);
                let pause = rtt.saturating_mul(rtts).min(READ_PAUSE_MAX_NS);
                self.pause_until = Some(landed.saturating_add(pause));
                self.pause_calls = 0;
            } else if !woke && self.pulls() && took < PULL_MIN_PER_READ && (took == 0 || !ahead) {
                // A send waited for this READ, and too few entries came since it went (maybe
                // none, not the one the send needs): ask for pushes, and READ again behind the
                // wake word for what the receiver posted before it sees the word.
                let paid = self.next_r.wrapping_sub(self.pull_since) >= PROBE_PAID;
                self.probe_every = if paid {
                    PROBE_MIN
                } else {
                    (self.probe_every * 2).min(PROBE_MAX)
                };
                self.empty_reads = 0;
                self.pause_until = None;
                self.post_wake(true);
                self.post_read(true);
            }
            // Else the second READ after the wake word (the receiver pushes from here on), or
            // one that paid off.
        }
        if self.p.cts_pull
            && self.pushing
            && self.read == Pull::Idle
            && (self.groups.len() >= PULL_AT_GROUPS || self.pushed_since >= self.probe_every)
            && self.unassigned.is_empty()
            && self.p.rkeys == 1
            && self.groups.iter().all(|g| g.e.n == 1)
        {
            self.post_wake(false);
        }
    }

    /// RDMA-writes the wake word into the receiver's record region (unsignaled, from one of
    /// the two constant words behind our landing ring; inline when 8 bytes fit).
    fn post_wake(&mut self, push: bool) {
        let src = self.p.landing.0 + wire::MIRROR_LEN as u64 + if push { 0 } else { 8 };
        let sge = Sge {
            addr: src,
            length: 8,
            lkey: self.p.landing.1,
        };
        let opcode = SendOpcode::RdmaWrite {
            remote_addr: self.p.peer_rec_ring.0 + wire::WAKE_AT as u64,
            rkey: self.p.peer_rec_ring.1,
        };
        self.actions.push(Action::PostSend(SendWr {
            inline: 8 <= self.p.inline_max,
            ..SendWr::one(wr_id(WrKind::Wake, 0, u32::from(push)), sge, opcode)
        }));
        self.pushing = push;
        if !push {
            self.pushed_since = 0;
            self.pull_since = self.next_r;
        }
        self.stats.wake_writes += 1;
    }

    /// RDMA-reads the receiver's whole CTS mirror into our landing ring (signaled: its
    /// completion lets `poll_peer_writes` look there). `woke`: the wake word went just before.
    fn post_read(&mut self, woke: bool) {
        let sge = Sge {
            addr: self.p.landing.0,
            length: wire::MIRROR_LEN as u32,
            lkey: self.p.landing.1,
        };
        let opcode = SendOpcode::RdmaRead {
            remote_addr: self.p.peer_rec_ring.0 + wire::MIRROR_AT as u64,
            rkey: self.p.peer_rec_ring.1,
        };
        self.actions.push(Action::PostSend(SendWr {
            signaled: true,
            ..SendWr::one(wr_id(WrKind::CtsRead, 0, u32::from(woke)), sge, opcode)
        }));
        self.read = Pull::InFlight { woke };
        self.read_times = (self.clock_ns, self.clock_ns);
        self.landing_valid = false;
        self.read_from = self.next_r;
        self.stats.cts_reads += 1;
    }

    /// Whether the engine needs the caller's fine clock ([`SendEngine::set_clock`]) before
    /// its next `isend` or completion: a READ of the receiver's mirror is in flight (its round
    /// trip is timed, from its post to the poll that finds its completion), or we pull and
    /// know no receive (the send may post a READ, or be pausing after an empty one). The
    /// comm's own clock is the kernel's coarse tick (milliseconds, cheap to read on every
    /// call), far coarser than a READ's round trip; a fine one is read only here.
    pub fn wants_clock(&self) -> bool {
        matches!(self.read, Pull::InFlight { .. }) || self.pulls() && self.groups.is_empty()
    }

    /// The caller's fine monotonic clock, in nanoseconds (any origin), given where
    /// [`SendEngine::wants_clock`] says so: before an `isend`, and before feeding the
    /// completions of a poll. A caller that never gives one gets pauses bounded by 65,536
    /// refused calls (`READ_PAUSE_MAX_CALLS`).
    pub fn set_clock(&mut self, now_ns: u64) {
        self.clock_ns = self.clock_ns.max(now_ns);
    }

    /// [`SendEngine::set_clock`] with `fine()`'s reading, only when the engine
    /// [`SendEngine::wants_clock`]: what the comm does at its two call sites and the simulated
    /// pair at each of its steps, so the clock is read only where the engine asks.
    pub fn clock_if_wanted(&mut self, fine: impl FnOnce() -> u64) {
        if self.wants_clock() {
            self.set_clock(fine());
        }
    }

    /// Whether a send that needs an entry may READ now: no pause, or its end has come on the
    /// fine clock (or the caller refused [`READ_PAUSE_MAX_CALLS`] calls meanwhile). The
    /// pause after an empty READ is [`READ_PAUSE_RTTS`] of its round trips, doubled for each
    /// further empty READ in a row, at most [`READ_PAUSE_MAX_NS`] (`after_entries`).
    fn pause_over(&mut self) -> bool {
        let Some(until) = self.pause_until else {
            return true;
        };
        self.pause_calls += 1;
        if self.clock_ns >= until || self.pause_calls > READ_PAUSE_MAX_CALLS {
            self.pause_until = None;
            return true;
        }
        false
    }

    /// The fine clock's readings at the last READ's post and at its completion's poll, and
    /// the end of the pause after it, if any (tests).
    #[cfg(test)]
    pub(crate) fn debug_read_times(&self) -> (u64, u64, Option<u64>) {
        (self.read_times.0, self.read_times.1, self.pause_until)
    }

    /// Whether a READ of the receiver's CTS mirror is posted and not yet completed (tests).
    #[cfg(test)]
    pub(crate) fn debug_read_in_flight(&self) -> bool {
        matches!(self.read, Pull::InFlight { .. })
    }

    /// Receive WRs our sends consumed so far (small sends consume none).
    pub fn wrs_consumed(&self) -> u64 {
        self.credits_used
    }

    /// Credits available now (granted minus used); meaningful with gating on.
    pub fn credits_available(&self) -> u64 {
        self.credits_granted.saturating_sub(self.credits_used)
    }

    /// The credit and matching state in one line, for test failures and debugging: the next
    /// receive WR a send consumes (`k`), the credits granted, what is known of zero-length
    /// WRs, the known groups, unmatched speculative sends and the current refusal.
    pub fn debug_state(&self) -> String {
        format!(
            "k={} granted={} exact_below={} z_end={} zeros={:?} groups={} unassigned={} \
             refusing={:?}",
            self.credits_used,
            self.credits_granted,
            self.exact_below,
            self.z_end,
            self.zeros,
            self.groups.len(),
            self.unassigned.len(),
            self.refusing
        )
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Requests in use.
    pub fn in_flight(&self) -> usize {
        self.reqs.in_use()
    }

    /// Whether actions are queued that no executor has taken yet.
    #[inline]
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// Whether [`SendEngine::isend`] of `tag` would start a direct send from what this engine
    /// knows already: a request slot is free, the front group has an unmatched buffer tagged
    /// `tag`, and a credit is in hand (credit gating on). The comm then starts the send without
    /// polling first, as NCCL IB's `isend` reads only its CTS FIFO
    /// (`src/transport/net_ib/p2p.cc`, `ncclIbIsend`). `false` says nothing: the comm makes
    /// progress and asks `isend`, which decides (and counts a refusal).
    pub fn can_start_direct(&self, tag: i32) -> bool {
        self.failed.is_none()
            && !self.slots_full()
            && self.groups.front().is_some_and(|g| g.find(tag).is_some())
            && !self.credit_short()
    }

    /// Every request slot is in use.
    fn slots_full(&self) -> bool {
        self.reqs.in_use() == MAX_SEND_REQUESTS
    }

    /// Credit gating is on and the next send's receive WR is not granted yet.
    fn credit_short(&self) -> bool {
        self.p.credits && self.credits_used >= self.credits_granted
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

    /// Starts sending `size` bytes at `addr` (covered by `lkeys`: one lkey per device of this
    /// end, QP `q` using [`Keys::at`]`(q)`) with `tag`.
    ///
    /// Matching follows NCCL's IB transport (`src/transport/net_ib/p2p.cc`, `ncclIbIsend`):
    /// receive groups form a FIFO in posting order and a send may only take the first unmatched
    /// buffer with its tag in the **front** group (the oldest not fully matched). Answers:
    /// - With the front group's clear-to-send read, the send is written straight into its
    ///   buffer: one RDMA_WRITE_WITH_IMM of the payload (any size, zero copy, no bounce
    ///   buffer), which consumes one receive WR at the peer. The receiver posts a zero-length
    ///   receive WR in `irecv` for every buffer its posted WRs do not cover already, so such a
    ///   send needs nothing more from the receiver, as in NCCL IB where `ncclIbIrecv` posts one
    ///   receive WR per `irecv`.
    /// - A small send (at most [`wire::SMALL_MAX`] bytes into a one-buffer receive, see
    ///   `small_fits`) goes instead as one inline RDMA WRITE, no immediate, into the receive's
    ///   slot of the receiver's small-send ring: no receive WR, no credit; the request
    ///   completes at the post.
    /// - With no receive known at all, an eager-sized send goes out at once (MPI-style eager: a
    ///   SEND into a bounce buffer) when the receive WR it would consume is known to be
    ///   bounce-backed, and is matched when its receive's clear-to-send arrives, by the same
    ///   rule the receiver applies on arrival: the k-th send with tag `t` takes the k-th buffer
    ///   with tag `t` in posting order. Where a group is known this is the front-group rule.
    /// - `Ok(None)` = "retry later", never an error (ext-net README): no request slot; no credit
    ///   (credit gating on: the receive WR this send would consume is not posted yet); the
    ///   front group has no unmatched buffer with this tag (its tag is used, or the group
    ///   holding it is not at the front yet); or no receive is known and the send is too large
    ///   for a bounce buffer, too many speculative sends are unmatched, or the next receive WR
    ///   is a zero-length one (a receive is posted whose clear-to-send is on its way).
    /// - With several QPs (`qps` > 1) a direct send posts all its WRs here ([`wr_plan`]), each
    ///   a signaled RDMA WRITE WITH IMM on its own QP, and completes when all completed: a
    ///   receive whose sends started needs no later call on this comm (the liveness rule of
    ///   `docs/protocol.md`, "No send waits for the receiver's next call"). Exactly one of them
    ///   is on QP 0, so it consumes one receive WR there as with one QP; the ones on data QPs
    ///   need no credit: the receiver posted their receive WRs before writing the CTS.
    /// - `Err(Usage)` when the matched buffer is smaller than the send: nothing is written, the
    ///   receiver is told, and the comm is failed (every later call returns the error).
    pub fn isend(
        &mut self,
        now: u64,
        addr: u64,
        lkeys: Keys,
        size: u64,
        tag: i32,
    ) -> Result<Option<ReqId>, ReqError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.slots_full() {
            return Ok(self.refuse(now, Refusal::Slots));
        }
        // The receive WR this send consumes (counted from the connection's first).
        let k = self.credits_used;
        // The buffer of the front group this send takes, or None: no group known (speculative
        // eager send, matched when its clear-to-send arrives).
        let dest = match self.groups.front() {
            Some(g) => match g.find(tag) {
                Some(i) => Some(i),
                None => return Ok(self.refuse(now, Refusal::Tag(tag))),
            },
            // Pulling: the entry is (or will be) in the receiver's mirror; a READ brings it
            // and every one posted since, where a speculative eager send would cost the
            // receiver a bounce-backed receive WR to re-post.
            None if self.pulls() => {
                if self.read == Pull::Idle && self.pause_over() {
                    self.post_read(false);
                }
                return Ok(self.refuse(now, Refusal::Cts));
            }
            None if size <= self.p.eager_limit
                && self.unassigned.len() < MAX_SPECULATIVE
                && self.bounce_backed(k) =>
            {
                None
            }
            None => return Ok(self.refuse(now, Refusal::Cts)),
        };
        // A small send consumes no receive WR: it needs no credit.
        let small = dest.is_some_and(|i| self.small_fits(i, size));
        if !small && self.credit_short() {
            return Ok(self.refuse(now, Refusal::Credit));
        }
        self.refusing = None;
        let s = self.next_s;
        let req = SendReq {
            s,
            size,
            tag,
            wc_done: false,
            matched: dest.is_some(),
            error: None,
            progress_ns: now,
            stall_reported: false,
            pieces: 0,
            npieces: 0,
            inline_before: self.inline_posted,
        };
        let Some(id) = self.reqs.insert(req) else {
            return Ok(None);
        };
        self.next_s = s.wrapping_add(1);
        let target = dest.map(|i| self.take(0, i));
        if let (true, Some((r, _, _, _))) = (small, target) {
            self.post_small(now, id, r, (addr, lkeys, size), s);
            return Ok(Some(id));
        }
        self.credits_used += 1;
        while self
            .zeros
            .front()
            .is_some_and(|&(_, end)| end <= self.credits_used)
        {
            self.zeros.pop_front();
        }
        let starved = std::mem::take(&mut self.starved);
        match target {
            Some((r, i, _, buf)) if size > buf.cap => {
                let e = ReqError::Usage(format!(
                    "send of {size} bytes (tag {tag}) is larger than the matching receive buffer \
                     of {} bytes (receive {r}, buffer {i}); nothing was written",
                    buf.cap
                ));
                // Tell the receiver, so its request fails too instead of waiting forever.
                self.post_record(id, r, i, REC_TOO_BIG | size, starved);
                self.reqs.remove(id);
                self.fail(e.clone());
                Err(e)
            }
            Some((r, i, g, buf)) => {
                self.stats.rendezvous += 1;
                if !whole_on_qp0(g, self.p.qps, self.p.split) {
                    self.post_pieces(id, g, (addr, lkeys, size), (r, i, buf), starved);
                    return Ok(Some(id));
                }
                let inline = self.take_inline(now, id, size);
                self.actions.push(Action::PostSend(SendWr {
                    wr_id: match inline {
                        Some((n, _)) => wr_id(WrKind::Inline, 0, n as u32),
                        None => wr_id(WrKind::Direct, id.gen, id.slot),
                    },
                    sgl: [
                        Sge {
                            addr,
                            length: size as u32,
                            lkey: lkeys.at(0),
                        },
                        Sge::default(),
                    ],
                    num_sge: u8::from(size > 0),
                    opcode: SendOpcode::RdmaWriteWithImm {
                        remote_addr: buf.addr,
                        rkey: buf.rkeys.at(0),
                        imm: wire::imm_encode(r, i, false, starved),
                    },
                    signaled: inline.is_none_or(|(_, signaled)| signaled),
                    inline: inline.is_some(),
                }));
                Ok(Some(id))
            }
            None => {
                self.unassigned.push_back(id);
                self.stats.eager += 1;
                let hdr_addr = self.p.hdr_stage.0 + u64::from(id.slot) * EAGER_HDR_LEN as u64;
                let hdr = EagerHeader {
                    tag,
                    seq: s,
                    size,
                    starved,
                }
                .encode();
                let hdr = stage_sge(&mut self.actions, hdr_addr, self.p.hdr_stage.1, &hdr);
                self.actions.push(Action::PostSend(SendWr {
                    wr_id: wr_id(WrKind::Eager, id.gen, id.slot),
                    sgl: [
                        hdr,
                        Sge {
                            addr,
                            length: size as u32,
                            lkey: lkeys.at(0),
                        },
                    ],
                    num_sge: if size == 0 { 1 } else { 2 },
                    opcode: SendOpcode::Send,
                    signaled: true,
                    inline: false,
                }));
                Ok(Some(id))
            }
        }
    }

    /// Whether a direct send of `size` bytes into buffer `i` of the front group goes as a small
    /// send (wire version 8, [`wire::SmallTrailer`]): a one-buffer receive announced by a
    /// compact clear-to-send (one device at the receiver), a payload of at most
    /// [`wire::SMALL_MAX`] bytes that fits its buffer and, with the trailer, the inline limit,
    /// room for one more unacknowledged inline send, and a send that [`wr_plan`] would put
    /// whole on QP 0 (with `VERBSNET_IB_SPLIT_DATA_ON_QPS` every send is split over the QPs,
    /// as in NCCL IB). Also when the next receive WR is a zero-length one: it then stays at the
    /// head of the receive queue until a send that consumes WRs comes, and a speculative eager
    /// send (which needs a bounce-backed WR next) waits for its clear-to-send meanwhile; going
    /// direct instead to consume it measured worse (docs/protocol.md, "Small sends").
    fn small_fits(&self, i: usize, size: u64) -> bool {
        self.p.rkeys == 1
            && size <= wire::SMALL_MAX
            && self.inline_fits(size + SMALL_TRAILER_LEN as u64)
            && self.groups.front().is_some_and(|g| {
                g.e.n == 1
                    && size <= g.e.bufs[i].cap
                    && whole_on_qp0(g.e.base.wrapping_add(i as u64), self.p.qps, self.p.split)
            })
    }

    /// Posts send `id` (sequence number `s`, `size` bytes at `addr`) as a small send into
    /// receive `r`'s slot of the receiver's small-send ring: one inline RDMA WRITE, no
    /// immediate, of the payload and its trailer, ending at the slot's end, on QP 0. It
    /// consumes no receive WR; the receiver polls the slot. The request completes now, as an
    /// inline send's does ([`SendEngine::take_inline`]), whose signaling and acknowledgement
    /// rules it follows.
    fn post_small(
        &mut self,
        now: u64,
        id: ReqId,
        r: u64,
        (addr, lkeys, size): (u64, Keys, u64),
        s: u64,
    ) {
        let (n, signaled) = self
            .take_inline(now, id, size + SMALL_TRAILER_LEN as u64)
            .expect("small_fits checked the inline room");
        self.stats.rendezvous += 1;
        self.stats.small_sends += 1;
        // The request's eager-header slot holds the trailer: a small send is never eager, and
        // the inline post copies it at once.
        let at = self.p.hdr_stage.0 + u64::from(id.slot) * EAGER_HDR_LEN as u64;
        let trailer = SmallTrailer {
            size: size as u32,
            s_low: s as u32,
        }
        .encode(r);
        let tail = stage_sge(&mut self.actions, at, self.p.hdr_stage.1, &trailer);
        let data = Sge {
            addr,
            length: size as u32,
            lkey: lkeys.at(0),
        };
        self.actions.push(Action::PostSend(SendWr {
            wr_id: wr_id(WrKind::Inline, 0, n as u32),
            sgl: if size > 0 {
                [data, tail]
            } else {
                [tail, Sge::default()]
            },
            num_sge: if size > 0 { 2 } else { 1 },
            opcode: SendOpcode::RdmaWrite {
                remote_addr: self.p.peer_rec_ring.0 + wire::small_slot(r) + wire::SMALL_MAX - size,
                rkey: self.p.peer_rec_ring.1,
            },
            signaled,
            inline: true,
        }));
    }

    /// Posts direct send `id` of `size` bytes inline when it is small enough
    /// (`SendParams::inline_max`) and fewer than [`MAX_INLINE_UNACKED`] inline sends are
    /// unacknowledged: the request completes now (the transport copied the payload at the post,
    /// as `IBV_SEND_INLINE` does, so the caller may reuse its buffer), and its WR is signaled
    /// one time in [`INLINE_SIGNAL_EVERY`]. Returns its inline sequence number and whether its
    /// WR is signaled, or `None`: an ordinary direct send, completing on its own completion.
    ///
    /// NCCL IB completes every send on its WR's completion (`src/transport/net_ib/p2p.cc`,
    /// `ncclIbTest`); what NCCL may rely on is only that a completed send's buffer can be
    /// reused (ext-net README, `test`), which the copy gives a round trip earlier. A failure
    /// that comes after the request completed fails the comm: the next call reports it.
    fn take_inline(&mut self, now: u64, id: ReqId, size: u64) -> Option<(u64, bool)> {
        if !self.inline_fits(size) {
            return None;
        }
        let n = self.inline_posted;
        self.inline_posted += 1;
        self.inline_since.get_or_insert((now, false));
        self.stats.inline_sends += 1;
        if let Some(req) = self.reqs.get_mut(id) {
            req.wc_done = true;
        }
        Some((n, (n + 1).is_multiple_of(INLINE_SIGNAL_EVERY)))
    }

    /// Whether a WR of `len` bytes may go inline now: inline sends are on, `len` is within
    /// `SendParams::inline_max`, and fewer than [`MAX_INLINE_UNACKED`] are unacknowledged.
    fn inline_fits(&self, len: u64) -> bool {
        self.p.inline_max != 0
            && len <= self.p.inline_max
            && self.inline_posted - self.inline_acked < MAX_INLINE_UNACKED
    }

    /// Inline sends whose acknowledgement has not been seen (their requests completed at the
    /// post; the last of them may be unsignaled, see [`SendEngine::flush_inline`]).
    pub fn inline_unacked(&self) -> u64 {
        self.inline_posted - self.inline_acked
    }

    /// For a comm about to close (and for the watchdog): whether inline sends are not known to
    /// be acknowledged. When the newest was posted unsignaled and no flush covers it, queues a
    /// signaled zero-length RDMA WRITE into the receiver's record ring (it writes nothing and
    /// consumes no receive WR), whose completion shows that every WR before it was
    /// acknowledged (WRs of a QP complete in order). `false` once the comm failed: nothing
    /// more will be acknowledged. The tcp transport sends only what is staged before its
    /// goodbye, and verbs leave posted WRs to the QP's destruction, so a send comm closes only
    /// after this says `false` (or a bound passed: `Comm::close`).
    pub fn flush_inline(&mut self) -> bool {
        if self.failed.is_some() || self.inline_unacked() == 0 {
            return false;
        }
        if !self.inline_covered() {
            self.inline_flushed = self.inline_posted;
            let last = self.inline_posted - 1;
            self.actions.push(Action::PostSend(SendWr {
                wr_id: wr_id(WrKind::InlineFlush, 0, last as u32),
                sgl: [Sge::default(); 2],
                num_sge: 0,
                opcode: SendOpcode::RdmaWrite {
                    remote_addr: self.p.peer_rec_ring.0,
                    rkey: self.p.peer_rec_ring.1,
                },
                signaled: true,
                inline: false,
            }));
        }
        true
    }

    /// Whether a signaled WR (the newest inline send's own, or a flush) will show the newest
    /// inline send acknowledged.
    fn inline_covered(&self) -> bool {
        self.inline_posted.is_multiple_of(INLINE_SIGNAL_EVERY)
            || self.inline_flushed == self.inline_posted
    }

    /// A signaled inline WR (or a flush) with inline sequence number `idx` (low 32 bits)
    /// completed: it and every inline send before it were acknowledged.
    fn inline_acked_through(&mut self, now: u64, idx: u32) {
        // At most MAX_INLINE_UNACKED are outstanding, so the low 32 bits name one.
        let back = u64::from((self.inline_posted as u32).wrapping_sub(idx));
        let through = self.inline_posted.saturating_sub(back) + 1;
        self.inline_acked_below(now, through);
    }

    /// Every inline send below inline sequence number `through` is known acknowledged.
    fn inline_acked_below(&mut self, now: u64, through: u64) {
        if through <= self.inline_acked {
            return;
        }
        self.inline_acked = through.min(self.inline_posted);
        self.inline_since = (self.inline_unacked() > 0).then_some((now, false));
    }

    /// Whether receive WR `k` (counted from the connection's first) is known to be
    /// bounce-backed, so that a SEND may consume it. Below `exact_below` the CTS entries read
    /// so far tell exactly; above it, the credit word's mark does (the zero-length WRs of CTS
    /// entries not read yet are all below the mark of a later credit word). Anything else is
    /// unknown: no SEND.
    fn bounce_backed(&self, k: u64) -> bool {
        if k < self.exact_below {
            !self.zeros.iter().any(|&(a, b)| a <= k && k < b)
        } else {
            k >= self.z_end
        }
    }

    fn refuse(&mut self, now: u64, why: Refusal) -> Option<ReqId> {
        match why {
            Refusal::Credit => {
                self.stats.credit_stalls += 1;
                self.starved = true;
            }
            Refusal::Cts => self.stats.cts_waits += 1,
            Refusal::Tag(_) => self.stats.tag_waits += 1,
            Refusal::Slots => self.stats.slots_full += 1,
        }
        match &mut self.refusing {
            Some((_, w, _)) if *w == why => {}
            _ => self.refusing = Some((now, why, false)),
        }
        None
    }

    /// Posts every WR of direct send `id` (payload `(addr, lkeys, size)`) into buffer `i` (global
    /// index `g`) of receive `r` over the connection's QPs ([`wr_plan`]): each a signaled RDMA
    /// WRITE WITH IMM naming `r` and `i` (the starved bit on QP 0's only), on QP 0 as
    /// [`Action::PostSend`], on a data QP as [`Action::PostSendQp`]. The send completes when
    /// all of them completed (`handle_wc`).
    fn post_pieces(
        &mut self,
        id: ReqId,
        g: u64,
        (addr, lkeys, size): (u64, Keys, u64),
        (r, i, buf): (u64, usize, CtsBuf),
        starved: bool,
    ) {
        let mut bits = 0u128;
        let mut n = 0u8;
        for (qp, off, len) in wr_plan(size, g, self.p.qps, self.p.split) {
            bits |= 1 << qp;
            n += 1;
            let wr = SendWr {
                wr_id: wr_id(WrKind::Piece, id.gen, piece_index(id.slot, qp)),
                sgl: [
                    Sge {
                        addr: addr + off,
                        length: len as u32,
                        lkey: lkeys.at(qp),
                    },
                    Sge::default(),
                ],
                num_sge: u8::from(len > 0),
                opcode: SendOpcode::RdmaWriteWithImm {
                    remote_addr: buf.addr + off,
                    rkey: buf.rkeys.at(qp),
                    imm: wire::imm_encode(r, i, false, starved && qp == 0),
                },
                signaled: true,
                inline: false,
            };
            if qp == 0 {
                self.actions.push(Action::PostSend(wr));
            } else {
                self.stats.data_qp_writes += 1;
                self.actions.push(Action::PostSendQp { qp, wr });
            }
        }
        if let Some(req) = self.reqs.get_mut(id) {
            req.pieces = bits;
            req.npieces = n;
        }
    }

    /// Stages the 8-byte refusal record `value` (with [`REC_TOO_BIG`]) for buffer `buf_idx` of
    /// receive `r` and posts, unsignaled (the comm fails with the refusal anyway), the
    /// WRITE_WITH_IMM on QP 0 that delivers it into the receiver's record slot (immediate:
    /// `r`, `buf_idx`, the record bit, `starved`). The comm fails right after, so this runs
    /// at most once per comm and one staging word and one record slot suffice.
    fn post_record(&mut self, id: ReqId, r: u64, buf_idx: usize, value: u64, starved: bool) {
        let (stage, lkey) = self.p.rec_stage;
        let sge = stage_sge(&mut self.actions, stage, lkey, &value.to_le_bytes());
        let opcode = SendOpcode::RdmaWriteWithImm {
            remote_addr: self.p.peer_rec_ring.0,
            rkey: self.p.peer_rec_ring.1,
            imm: wire::imm_encode(r, buf_idx, true, starved),
        };
        self.actions.push(Action::PostSend(SendWr::one(
            wr_id(WrKind::ErrNotify, id.gen, id.slot),
            sge,
            opcode,
        )));
    }

    /// Marks buffer `i` of known group `g` (0 = the front) matched, drops fully matched groups
    /// from the front, and returns (receive `r`, buffer index, the buffer's global index, the
    /// buffer).
    fn take(&mut self, g: usize, i: usize) -> (u64, usize, u64, CtsBuf) {
        let grp = &mut self.groups[g];
        debug_assert!(grp.used & (1 << i) == 0);
        grp.used |= 1 << i;
        let out = (grp.e.r, i, grp.e.base.wrapping_add(i as u64), grp.e.bufs[i]);
        while self.groups.front().is_some_and(Group::full) {
            self.groups.pop_front();
        }
        out
    }

    /// Feeds a clear-to-send read from our CTS ring, then matches the speculative eager sends
    /// waiting for a buffer with their tag (in send order: the k-th send with tag `t` takes the
    /// k-th buffer with tag `t`, as the receiver matches them). Errors: the entry is out of
    /// sequence (a protocol violation; the comm fails).
    pub fn handle_cts(&mut self, now: u64, e: CtsEntry) -> Result<(), ReqError> {
        self.groups.push_back(Group { e, used: 0 });
        self.adopt_newest(now)
    }

    /// [`SendEngine::handle_cts`] of the entry just pushed as the newest group (taken out
    /// again if it is out of sequence).
    fn adopt_newest(&mut self, now: u64) -> Result<(), ReqError> {
        let e = &self.groups.back().expect("the caller pushed it").e;
        let wrong = if e.r != self.next_r || e.base != self.next_base {
            Some(format!(
                "CTS for receive {} with base {} arrived, expected receive {} with base {}",
                e.r, e.base, self.next_r, self.next_base
            ))
        } else if e.bufs[0].rkeys.len() != self.p.rkeys {
            Some(format!(
                "CTS for receive {} carries {} rkeys per buffer, expected {} (the receiver's \
                 devices, from its listen handle)",
                e.r,
                e.bufs[0].rkeys.len(),
                self.p.rkeys
            ))
        } else {
            None
        };
        if let Some(m) = wrong {
            self.groups.pop_back();
            let err = ReqError::Protocol(m);
            self.fail(err.clone());
            return Err(err);
        }
        let (n, credits, zeros) = (e.n, e.credits, e.zeros);
        self.stats.cts += 1;
        self.next_r = self.next_r.wrapping_add(1);
        // The receiver is posting: no pause before the next READ, and a later empty READ
        // starts the count again.
        self.empty_reads = 0;
        self.pause_until = None;
        self.next_base = self.next_base.wrapping_add(u64::from(n));
        self.credits_granted = self.credits_granted.max(credits);
        if zeros > 0 {
            // This irecv's zero-length WRs are the last `zeros` of `credits`.
            let start = credits.saturating_sub(u64::from(zeros));
            self.zeros.push_back((start, credits));
        }
        self.exact_below = self.exact_below.max(credits);
        // Only this new group can take a waiting send: each had no unmatched buffer with its
        // tag in any older group when it was sent (it is sent speculatively only while no group
        // is known) or when an older group's CTS was fed here, and buffers are never unmatched
        // again; so `find_any` would find this group's first unmatched buffer with the tag, and
        // that is what is looked up here (without scanning every group once per waiting send:
        // a stream holds up to 16 of them). Stops once every buffer of the group is matched.
        let mut k = 0;
        while k < self.unassigned.len() {
            let id = self.unassigned[k];
            let Some(req) = self.reqs.get(id) else {
                self.unassigned.remove(k);
                continue;
            };
            let (tag, size) = (req.tag, req.size);
            // The new group is the last (`take` pops only full groups from the front).
            let Some(newest) = self.groups.back().filter(|g| !g.full()) else {
                break;
            };
            let g = self.groups.len() - 1;
            let found = newest.find(tag).map(|i| (g, i));
            debug_assert_eq!(found, self.find_any(tag));
            let Some((g, i)) = found else {
                k += 1;
                continue;
            };
            self.unassigned.remove(k);
            let (r, i, _, buf) = self.take(g, i);
            if size > buf.cap {
                // The receiver sees the same mismatch when it matches the arrival, and fails
                // its comm itself: no notification needed.
                let err = ReqError::Usage(format!(
                    "send of {size} bytes (tag {tag}) is larger than the matching receive \
                     buffer of {} bytes (receive {r}, buffer {i})",
                    buf.cap
                ));
                if let Some(req) = self.reqs.get_mut(id) {
                    req.error = Some(err.clone());
                }
                self.fail(err);
                return Ok(());
            }
            if let Some(req) = self.reqs.get_mut(id) {
                req.progress_ns = now;
                req.matched = true;
            }
        }
        Ok(())
    }

    /// The earliest known group with an unmatched buffer tagged `tag`, and that buffer.
    fn find_any(&self, tag: i32) -> Option<(usize, usize)> {
        self.groups
            .iter()
            .enumerate()
            .find_map(|(g, grp)| grp.find(tag).map(|i| (g, i)))
    }

    /// Feeds the credit word read from our memory ([`wire::credit_word`]: the credits granted
    /// so far and where the zero-length receive WRs end).
    pub fn handle_credit(&mut self, word: u64) {
        let (granted, z_end) = wire::credit_word_decode(word, self.credits_granted);
        self.credits_granted = self.credits_granted.max(granted);
        self.z_end = self.z_end.max(z_end);
    }

    /// Feeds one completion of any QP of the connection (QP 0 and the data QPs alike: the
    /// `wr_id` says which WR it was). A send over several QPs completes with the last of its
    /// WRs.
    pub fn handle_wc(&mut self, now: u64, wc: &Wc) {
        let Some((kind, gen, index)) = wr_parse(wc.wr_id) else {
            self.fail(ReqError::Local(format!(
                "completion with unknown wr_id {:#x}",
                wc.wr_id
            )));
            return;
        };
        let (slot, qp) = match kind {
            WrKind::Piece => piece_parse(index),
            _ => (index, 0),
        };
        if matches!(kind, WrKind::Inline | WrKind::InlineFlush) && wc.status == WcStatus::Success {
            self.inline_acked_through(now, index);
            return;
        }
        if kind == WrKind::CtsRead && wc.status == WcStatus::Success {
            if let Pull::InFlight { woke } = self.read {
                self.read = Pull::Landed { woke };
                self.read_times.1 = self.clock_ns;
                self.landing_valid = true;
                self.landing_lacks = None;
            }
            return;
        }
        if kind == WrKind::InlineFlush {
            // The flush carries no data: the inline sends before it completed, or completed with
            // their own error (unsignaled WRs too), which fails the comm. It fails when the peer
            // went meanwhile (a close racing the peer's own): nothing is left to wait for.
            self.inline_acked_below(now, self.inline_posted);
            return;
        }
        if wc.status != WcStatus::Success {
            self.stats.error_completions += 1;
            let what = match kind {
                WrKind::Eager => "eager SEND".to_string(),
                WrKind::Direct => "RDMA WRITE WITH IMM of the payload".to_string(),
                WrKind::ErrNotify => "RDMA WRITE WITH IMM of a refusal record".to_string(),
                WrKind::Piece => format!("RDMA WRITE WITH IMM of a payload piece on QP {qp}"),
                WrKind::Inline => "RDMA WRITE of an inline send (WITH IMM into its buffer, \
                                   or a small send's into the small-send ring; its request \
                                   had completed at the post; the peer may lack its data)"
                    .to_string(),
                WrKind::InlineFlush => "zero-length RDMA WRITE after inline sends (their \
                                        requests had completed; the peer may lack their data)"
                    .to_string(),
                WrKind::CtsRead => "RDMA READ of the receiver's CTS mirror".to_string(),
                WrKind::Wake => "RDMA WRITE of the receiver's wake word".to_string(),
                _ => "send-side WR".to_string(),
            };
            if wc.status != WcStatus::WrFlush || self.failed.is_none() {
                self.fail(wc_error(wc.status, &what));
            }
            return;
        }
        let Some((_, req)) = self.reqs.by_wr_mut(slot, gen) else {
            return;
        };
        match kind {
            WrKind::Eager | WrKind::Direct => {
                req.wc_done = true;
                req.progress_ns = now;
            }
            WrKind::Piece => {
                req.pieces &= !(1u128 << qp);
                req.progress_ns = now;
                req.wc_done = req.pieces == 0;
            }
            _ => {}
        }
        // A WR on QP 0 completed after every inline send posted before it.
        let before = req.inline_before;
        if matches!(kind, WrKind::Eager | WrKind::Direct) || (kind == WrKind::Piece && qp == 0) {
            self.inline_acked_below(now, before);
        }
    }

    /// Marks the comm failed; every outstanding request reports `e`.
    pub fn fail(&mut self, e: ReqError) {
        if self.failed.is_none() {
            self.failed = Some(e.clone());
        }
        for (_, r) in self.reqs.iter_mut() {
            if r.error.is_none() && !(r.wc_done && r.matched) {
                r.error = Some(e.clone());
            }
        }
    }

    /// Polls request `id`: `Ok(Some(size))` once done (the slot is then free), `Ok(None)`
    /// while in progress.
    pub fn test(&mut self, id: ReqId) -> Result<Option<u64>, ReqError> {
        let Some(req) = self.reqs.get(id) else {
            return Err(ReqError::Local(format!(
                "test of an unknown or finished send request {id:?}"
            )));
        };
        if let Some(e) = req.error.clone() {
            self.reqs.remove(id);
            return Err(e);
        }
        if req.wc_done && req.matched {
            let size = req.size;
            self.reqs.remove(id);
            self.stats.ops += 1;
            self.stats.bytes += size;
            return Ok(Some(size));
        }
        Ok(None)
    }

    /// Requests (and a refusal streak) idle for at least `timeout_ns`, each reported once.
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
            let waiting_for = if r.pieces != 0 {
                let qps: Vec<String> = (0..128u32)
                    .filter(|&q| r.pieces & (1 << q) != 0)
                    .map(|q| q.to_string())
                    .collect();
                format!(
                    "the completion of {} of its {} RDMA WRITE WITH IMMs, on QP {} (the peer \
                     has not acknowledged them: it may be dead, or those QPs' path broken)",
                    qps.len(),
                    r.npieces,
                    qps.join(", ")
                )
            } else if !r.wc_done {
                "the completion of a posted send: the peer has not acknowledged it (it may be \
                 dead, or not polling; with credits off it may have no receive posted: see the \
                 RNR counters)"
                    .to_string()
            } else if !r.matched {
                format!(
                    "the receiver's clear-to-send for send {} (the peer has not posted the \
                     matching irecv)",
                    r.s
                )
            } else {
                "the caller to test it: it completed, but test was not called on it".to_string()
            };
            out.push(Stall {
                req: id,
                what: format!("send {} ({} bytes, tag {})", r.s, r.size, r.tag),
                idle_ns: now - r.progress_ns,
                waiting_for,
            });
        }
        if let Some((since, reported)) = self.inline_since {
            if !reported && now.saturating_sub(since) >= timeout_ns {
                if self.inline_covered() {
                    self.inline_since = Some((since, true));
                    out.push(Stall {
                        req: ReqId {
                            slot: u32::MAX,
                            gen: 0,
                        },
                        what: format!(
                            "{} inline sends (completed to the caller at their post)",
                            self.inline_unacked()
                        ),
                        idle_ns: now - since,
                        waiting_for: "the peer to acknowledge them: it may be dead, or not \
                                      polling (with credits off it may have no receive posted: \
                                      see the RNR counters)"
                            .to_string(),
                    });
                } else {
                    // The newest went unsignaled and nothing followed it: ask for a completion
                    // instead of reporting a stall no completion could have ended.
                    self.flush_inline();
                    self.inline_since = Some((now, false));
                }
            }
        }
        // How the clear-to-send is expected to come (docs/protocol.md, "The pulled
        // clear-to-send").
        let cts_way = match (self.read, self.pulls()) {
            (Pull::InFlight { .. }, _) => {
                "; an RDMA READ of the receiver's CTS mirror is in flight (the peer's NIC has \
                 not answered it)"
            }
            (_, true) if self.empty_reads > 0 => {
                "; READs of the receiver's CTS mirror found it not posted; another goes after a \
                 pause, then the receiver is asked to write it"
            }
            (_, true) => "; a READ of the receiver's CTS mirror will fetch it",
            (_, false) if self.p.cts_pull && self.stats.wake_writes > 0 => {
                "; the receiver was asked to write it (a READ found it not posted)"
            }
            _ => "",
        };
        if let Some((since, why, reported)) = &mut self.refusing {
            if !*reported && now.saturating_sub(*since) >= timeout_ns {
                *reported = true;
                let waiting_for = match why {
                    Refusal::Credit => "a credit: the receiver has re-posted no receive WRs (it \
                                        is not calling irecv/test, or VERBSNET_RQ_DEPTH is too \
                                        small)"
                        .to_string(),
                    Refusal::Cts => format!(
                        "a clear-to-send: the peer has not posted the matching irecv (a send \
                         waits for it when it is larger than the eager limit, when 16 eager \
                         sends are unmatched already, when the peer's next receive WR is a \
                         zero-length one, or while it pulls entries){cts_way}"
                    ),
                    Refusal::Tag(tag) => format!(
                        "a receive buffer with tag {tag} in the oldest posted receive: its \
                         buffers with that tag are matched already, and it completes only when \
                         the sends of its other tags arrive (another sender sharing this comm is \
                         behind, or the receiver has not posted the receive holding tag {tag})"
                    ),
                    Refusal::Slots => "a free request slot: all send requests are in use (the \
                                       caller is not testing them, or they are stalled \
                                       themselves)"
                        .to_string(),
                };
                out.push(Stall {
                    req: ReqId {
                        slot: u32::MAX,
                        gen: 0,
                    },
                    what: "isend (answering 'retry later')".to_string(),
                    idle_ns: now - *since,
                    waiting_for,
                });
            }
        }
        out
    }
}

impl super::ActionQueue for SendEngine {
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
