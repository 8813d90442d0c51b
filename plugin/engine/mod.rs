//! The protocol engine: a pure state machine with no I/O and no clock reads.
//!
//! One [`SendEngine`] drives the sending side of a connection and one [`RecvEngine`] the
//! receiving side (NCCL comms are one-directional). Time is an argument (`now`, nanoseconds
//! from any fixed origin). The engines never touch memory: they emit [`Action`]s — bytes to
//! stage into plugin-owned buffers, WRs to post, bounce-buffer copies — that one executor
//! ([`Executor`]) carries out in order on an [`ActionSink`]: the comm driver's (`crate::comm`,
//! a transport QP) or the simulated pair's. What the engines need to know from outside they
//! ask through arguments: [`MemRead`] (bytes the peer or the NIC wrote) and [`BounceSource`]
//! (more bounce buffers when the receive queue grows).
//!
//! ## The protocol
//! - Sends and receives match in posting order (ext-net README: "send/receive operations
//!   should always match in the order they were posted"); tags choose a buffer inside a
//!   grouped receive. The rule is NCCL's IB transport's (`src/transport/net_ib/p2p.cc`,
//!   `ncclIbIsend`): receives form a FIFO and a send takes the first unmatched buffer with its
//!   tag in the **front** receive (the oldest not fully matched); if the front has none, `isend`
//!   answers "retry later" (several local ranks share one comm under `NCCL_NET_SHARED_COMMS`,
//!   each with its own tag, in whatever order their GPUs finish). Equivalently: the k-th send
//!   with tag `t` fills the k-th buffer with tag `t` in posting order. The receiver applies that
//!   form to every arrival, so both sides agree without extra messages, even for eager sends
//!   issued before any receive was known.
//! - Every `irecv` RDMA-writes a clear-to-send ([`wire::CtsEntry`]) into the sender's CTS ring.
//! - **Direct** (the front receive's CTS is known; any size): one RDMA_WRITE_WITH_IMM of the
//!   payload straight into the receive buffer (zero copy); the immediate names the receive and
//!   buffer, the completion's `byte_len` the size.
//! - **Small** (direct, at most [`wire::SMALL_MAX`] bytes, a one-buffer receive): one inline
//!   RDMA WRITE, no immediate, of the payload and a trailer into the receive's slot of the
//!   receiver's small-send ring ([`wire::SmallTrailer`]); it consumes no receive WR, and the
//!   receiver polls the slot and copies the payload out, in send order.
//! - **Eager** (no receive known at all, size ≤ eager limit): the sender SENDs header + payload
//!   at once into a bounce buffer the receiver pre-posted (MPI-style eager; NCCL's IB transport
//!   would wait); the receiver holds it until a receive with a free buffer of its tag is posted
//!   and copies it, and the sender completes it once that receive's CTS confirmed the buffer is
//!   big enough, so a too-large send fails on both ends.
//! - **The receive queue** holds bounce-backed WRs (for eager SENDs) and zero-length WRs (only
//!   a WRITE_WITH_IMM may consume one). Each send but a small one consumes the next WR in
//!   posting order, so the `k`-th of them takes WR `k`. RQ batching: the receiver posts
//!   `rq_batch` bounce-backed WRs per post call, refilling once per poll when fewer than
//!   `rq_low_water` remain.
//! - **Credits** (optional): a credit is one posted receive WR at the peer. With gating on the
//!   sender never issues an operation that consumes one (eager SEND, WRITE_WITH_IMM) without a
//!   credit, and `irecv` posts zero-length WRs so that the posted WRs cover every posted buffer:
//!   a send matching a posted receive then needs nothing more from the receiver (NCCL IB posts
//!   one receive WR per `irecv`). The CTS entries say which WRs are zero-length, so an eager
//!   SEND never consumes one. The receiver returns credits as it posts, piggybacked on CTS
//!   entries or in an explicit credit write ([`wire::credit_word`]). With gating off the sender
//!   relies on the QP's RNR retry, as NCCL does.
//! - **Several QPs per connection** (`qps` > 1): QP 0 carries everything above; a direct
//!   send posts all its WRs at `isend`, each an RDMA_WRITE_WITH_IMM on its own QP, as NCCL IB
//!   does (split: piece `i` on QP `i`, empty pieces zero-length; round robin: the buffer's QP
//!   `(base + i) % qps` plus a zero-length one on QP 0), so every direct send but a small one
//!   still consumes exactly one receive WR of QP 0, in send order. The receiver keeps zero-length receive WRs
//!   on each data QP that cover the posted buffers, and counts a buffer's arrivals until all
//!   its QPs reported. See `docs/protocol.md`, "Several QPs per connection".

#![forbid(unsafe_code)]

pub mod exec;
pub mod recv;
pub mod send;
pub mod wire;

/// The simulated endpoint pair used by the engine tests and the criterion bench.
#[doc(hidden)]
pub mod sim;

use std::fmt;

use crate::transport::{RecvWr, SendWr, Sge, WcStatus};

pub use exec::{ActionQueue, ActionSink, Executor};
pub use recv::{RecvBuf, RecvEngine, RecvParams};
pub use send::{SendEngine, SendParams};
pub use wire::Keys;

/// The sizes a completed request reports: one for a send, one per buffer (`1..=`
/// [`wire::MAX_RECVS`]) for a grouped receive, in bytes. Kept inline (no allocation per
/// completed `test`); reads as a `&[u64]`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    n: u8,
    v: [u64; wire::MAX_RECVS],
}

impl Sizes {
    /// The first `min(sizes.len(), MAX_RECVS)` of `sizes`.
    #[must_use]
    pub fn of(sizes: &[u64]) -> Sizes {
        let n = sizes.len().min(wire::MAX_RECVS);
        let mut v = [0; wire::MAX_RECVS];
        v[..n].copy_from_slice(&sizes[..n]);
        Sizes { n: n as u8, v }
    }
}

impl std::ops::Deref for Sizes {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        &self.v[..usize::from(self.n)]
    }
}

impl fmt::Debug for Sizes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq<Vec<u64>> for Sizes {
    fn eq(&self, other: &Vec<u64>) -> bool {
        **self == **other
    }
}

/// Send request slots per send comm: NCCL may keep `NCCL_NET_MAX_REQUESTS` (32) requests per
/// comm, times `maxRecvs` (8) on the send side (ext-net README).
pub const MAX_SEND_REQUESTS: usize = 256;
/// Receive request slots per receive comm (`NCCL_NET_MAX_REQUESTS`).
pub const MAX_RECV_REQUESTS: usize = 32;
/// CTS ring entries per send comm. Must exceed the receives that can be complete at the
/// receiver while their CTS is unread at the sender, plus the [`MAX_RECV_REQUESTS`] posted ones.
/// A receive completes before its CTS is read only when speculative eager sends (issued with no
/// receive known) filled it, and at most [`MAX_SPECULATIVE`] of those are unmatched at a time:
/// 32 + 16 < 64. (512 before the cap: 128 KiB pinned per send comm instead of 16 KiB.)
pub const CTS_RING_ENTRIES: usize = 64;
/// Most QPs one connection may have (`VERBSNET_IB_QPS_PER_CONNECTION`): NCCL IB's
/// `NCCL_IB_MAX_QPS` (`src/transport/net_ib/common.h`).
pub const MAX_QPS_PER_CONNECTION: usize = 128;
/// Pieces of a payload split over several QPs are multiples of this many bytes (but the
/// last): NCCL IB's `IB_WRITE_CHUNK_ALIGNMENT` (`src/transport/net_ib/p2p.cc`).
pub const SPLIT_ALIGN: u64 = 128;
const _: () = assert!(MAX_SEND_REQUESTS <= 1 << 16 && MAX_QPS_PER_CONNECTION <= 256);
/// Speculative eager sends (issued before any receive is known) unmatched at a time; one more
/// is "retry later" until a clear-to-send arrives. Bounds the CTS ring ([`CTS_RING_ENTRIES`]).
pub const MAX_SPECULATIVE: usize = 16;
/// Most zero-length receive WRs a receive comm has posted at a time: one per buffer of the
/// posted receives, plus what speculative eager sends in flight may take (see
/// `RecvEngine::irecv`). The QP's receive queue holds them beside the full depth.
pub const MAX_ZERO_WRS: u32 = (MAX_RECV_REQUESTS * wire::MAX_RECVS + MAX_SPECULATIVE) as u32;
/// Fewest zero-length receive WRs posted in one call when some are needed, on QP 0 and on each
/// data QP (`RecvEngine::irecv`).
pub const ZERO_BATCH: u32 = 8;
/// Receive WRs a receiver's data QP must hold: at most [`MAX_ZERO_WRS`] zero-length WRs are
/// posted and not seen consumed on it, plus a batch of room (`conn::data_qp_config`).
pub const DATA_QP_RECV_WRS: u32 = MAX_ZERO_WRS + ZERO_BATCH;
/// Staging slots for CTS and credit writes on the receive side: the receives that can be
/// outstanding (32) and a signaling period (16) more. 48 rather than 64 since wire version 8,
/// so that the small-send ring (4 KiB) fits in the same pages (an idle connection still pins
/// 16 pages, both sides together).
pub const CTRL_STAGE_SLOTS: usize = 48;
/// One control WRITE (CTS or credit) in this many is signaled (see the receive engine's
/// `ctrl_slot`); a power of two, and [`CTRL_STAGE_SLOTS`] is a multiple of it. NCCL IB signals one CTS write per
/// FIFO wrap of 32 (`src/transport/net_ib/p2p.cc`).
pub const CTRL_SIGNAL_EVERY: u32 = 16;

/// One inline send in this many is signaled (the others complete with it: WRs of a QP
/// complete in order), as control writes are ([`CTRL_SIGNAL_EVERY`]).
pub const INLINE_SIGNAL_EVERY: u64 = 16;

/// Most inline sends whose acknowledgement the send engine has not seen yet; past it a direct
/// send completes on its own completion, as without inline sends. A multiple of
/// [`INLINE_SIGNAL_EVERY`], so that at the bound a signaled one is in flight. Send-queue
/// room: [`MAX_SEND_REQUESTS`] requests' WRs plus these.
pub const MAX_INLINE_UNACKED: u64 = 64;
const _: () = assert!(
    CTRL_SIGNAL_EVERY.is_power_of_two() && CTRL_STAGE_SLOTS & (CTRL_SIGNAL_EVERY as usize - 1) == 0
);

/// Reads plugin-owned memory that the peer or the NIC writes (bounce headers, records, the CTS
/// ring, the credit word) for the engine. Implementations copy into `out` (no reference into
/// such memory outlives the call); the engine decides what the bytes mean.
pub trait MemRead {
    /// Fills `out` from `addr`; false if the range is not readable.
    fn read(&self, addr: u64, out: &mut [u8]) -> bool;

    /// The little-endian word at `addr`, or `None` if it is not readable: what a poll reads
    /// most (a CTS slot's head word, the credit word). Implementations may answer an aligned
    /// word with one atomic load instead of a copy.
    fn read_u64(&self, addr: u64) -> Option<u64> {
        let mut w = [0u8; 8];
        self.read(addr, &mut w).then(|| u64::from_le_bytes(w))
    }
}

/// Where a receive engine gets more bounce buffers when its queue grows: the driver's shared
/// pool of the device (`comm::pool`), or the simulated pair's. Asked by
/// [`RecvEngine::after_poll`] at most once per poll, so growing finishes inside that one call.
pub trait BounceSource {
    /// Up to `k` free bounce buffers (addr, lkey), each `EAGER_HDR_LEN + eager_buf_size` bytes
    /// of registered memory; fewer, or none, when the pool is exhausted (or cannot register
    /// more).
    fn take(&mut self, k: u32) -> Vec<(u64, u32)>;
}

/// The bytes an [`Action::Stage`] writes: up to [`StageBytes::INLINE`] bytes (every staged write
/// of a one-buffer message: the compact CTS entry, an eager header, a credit or record word)
/// are kept in the action itself, so staging allocates nothing; longer ones (the CTS entry
/// of a grouped or multi-device receive) on the heap. Reads as a `&[u8]`.
#[derive(Clone)]
pub struct StageBytes(StageRepr);

#[derive(Clone)]
enum StageRepr {
    Inline {
        len: u8,
        b: [u8; StageBytes::INLINE],
    },
    Heap(Vec<u8>),
}

impl StageBytes {
    /// The most bytes kept inline: [`wire::CTS_COMPACT_LEN`].
    pub const INLINE: usize = wire::CTS_COMPACT_LEN;

    /// `len` bytes written by `fill` (which gets them zeroed).
    pub fn filled(len: usize, fill: impl FnOnce(&mut [u8])) -> StageBytes {
        if len <= Self::INLINE {
            let mut b = [0u8; Self::INLINE];
            fill(&mut b[..len]);
            StageBytes(StageRepr::Inline { len: len as u8, b })
        } else {
            let mut v = vec![0u8; len];
            fill(&mut v);
            StageBytes(StageRepr::Heap(v))
        }
    }
}

impl From<&[u8]> for StageBytes {
    fn from(bytes: &[u8]) -> StageBytes {
        StageBytes::filled(bytes.len(), |b| b.copy_from_slice(bytes))
    }
}

impl std::ops::Deref for StageBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            StageRepr::Inline { len, b } => &b[..usize::from(*len)],
            StageRepr::Heap(v) => v,
        }
    }
}

impl PartialEq for StageBytes {
    fn eq(&self, other: &StageBytes) -> bool {
        **self == **other
    }
}

impl Eq for StageBytes {}

impl std::fmt::Debug for StageBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// Queues an [`Action::Stage`] of `bytes` at `addr` (a staging buffer registered under `lkey`)
/// and returns the SGE that sends them from there: the staged control words and headers of
/// the protocol (CTS entry, credit word, refusal record, eager header, small-send trailer).
pub(crate) fn stage_sge(actions: &mut Vec<Action>, addr: u64, lkey: u32, bytes: &[u8]) -> Sge {
    actions.push(Action::Stage {
        addr,
        bytes: StageBytes::from(bytes),
    });
    Sge {
        addr,
        length: bytes.len() as u32,
        lkey,
    }
}

/// What the comm driver must do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Write `bytes` at plugin-owned address `addr` (a staging buffer) before the next post.
    Stage {
        /// Destination address inside a plugin-owned registered buffer.
        addr: u64,
        /// The bytes.
        bytes: StageBytes,
    },
    /// Post one send WR on the connection's first QP (QP 0), which carries every WR that
    /// consumes a receive WR, the CTS and credit writes.
    PostSend(SendWr),
    /// Post one send WR on data QP `qp` (`1..qps`, `VERBSNET_IB_QPS_PER_CONNECTION`): an
    /// RDMA_WRITE_WITH_IMM of a piece of a payload (maybe empty), which consumes one of the
    /// zero-length receive WRs the receiver keeps on that QP.
    PostSendQp {
        /// The QP's index in the connection, 1 or above.
        qp: u8,
        /// The WR.
        wr: SendWr,
    },
    /// Post these receive WRs in one call on QP 0.
    PostRecv(Vec<RecvWr>),
    /// Post these receive WRs (zero-length ones) in one call on data QP `qp` (`1..qps`).
    PostRecvQp {
        /// The QP's index in the connection, 1 or above.
        qp: u8,
        /// The WRs.
        wrs: Vec<RecvWr>,
    },
    /// These bounce buffers (addr, lkey) are no longer used: back to the pool.
    ReturnBounce(Vec<(u64, u32)>),
    /// Copy `len` bytes from the bounce buffer at `src` into buffer `buf` of receive request
    /// `req`, at offset 0.
    Copy {
        /// Plugin-owned source address.
        src: u64,
        /// Receive request.
        req: ReqId,
        /// Buffer index inside the grouped receive.
        buf: usize,
        /// Bytes.
        len: u64,
    },
}

/// A request handle: slot index plus a generation, so a stale handle is detected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReqId {
    /// Slot index.
    pub slot: u32,
    /// Generation of the slot when the request was made.
    pub gen: u32,
}

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReqError {
    /// The send was larger than the matching receive buffer (→ `ncclInvalidUsage`); the comm
    /// is failed with it on both ends.
    Usage(String),
    /// The peer or path failed (→ `ncclRemoteError`).
    Remote(String),
    /// A local failure (→ `ncclSystemError`).
    Local(String),
    /// The peer broke the protocol (→ `ncclRemoteError`).
    Protocol(String),
}

impl fmt::Display for ReqError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReqError::Usage(m) => write!(f, "invalid usage: {m}"),
            ReqError::Remote(m) => write!(f, "remote failure: {m}"),
            ReqError::Local(m) => write!(f, "local failure: {m}"),
            ReqError::Protocol(m) => write!(f, "protocol violation by the peer: {m}"),
        }
    }
}

impl std::error::Error for ReqError {}

/// Maps an error completion to a request error.
pub(crate) fn wc_error(status: WcStatus, what: &str) -> ReqError {
    let m = format!("{what} completed with {status}: {}", status.hint());
    if status.is_remote() {
        ReqError::Remote(m)
    } else {
        ReqError::Local(m)
    }
}

/// Kinds of WR, packed into the top bits of `wr_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum WrKind {
    /// A SEND of header + payload into a bounce buffer (no receive known yet).
    Eager = 1,
    /// A WRITE_WITH_IMM of the payload straight into the matched receive buffer.
    Direct = 2,
    /// A WRITE_WITH_IMM of a refusal record (the send was too large).
    ErrNotify = 4,
    /// A receive WR with a bounce buffer.
    Bounce = 5,
    /// The RDMA WRITE of a clear-to-send entry.
    Cts = 6,
    /// The RDMA WRITE of the credit word.
    Credit = 7,
    /// A zero-length receive WR, consumed only by a WRITE_WITH_IMM.
    Zero = 8,
    /// One of the WRITE_WITH_IMMs of a direct send that uses several QPs (a piece of the
    /// payload, maybe empty, or the zero-length one on QP 0); the `wr_id`'s index holds the
    /// send slot in its low 16 bits and the QP index above ([`piece_index`]).
    Piece = 9,
    /// A zero-length receive WR on a data QP; the `wr_id`'s index is the QP index (1 and up),
    /// so that its completion says which QP it arrived on.
    DataZero = 10,
    /// The RDMA WRITE WITH IMM of a direct send posted inline, whose request completed at the
    /// post; the `wr_id`'s index is the low 32 bits of its inline sequence number.
    Inline = 11,
    /// The signaled zero-length RDMA WRITE that a closing send comm posts after unsignaled
    /// inline sends, so that their acknowledgement shows; the index is the low 32 bits of the
    /// inline sequence number of the last inline send before it.
    InlineFlush = 12,
    /// The RDMA READ of the receiver's CTS mirror into the landing ring (always signaled).
    CtsRead = 13,
    /// The RDMA WRITE of the wake word into the receiver's record region (unsignaled).
    Wake = 14,
}

/// The `wr_id` index of a piece of send slot `slot` on QP `qp` (slots are below 2^16).
pub(crate) fn piece_index(slot: u32, qp: u8) -> u32 {
    slot | (u32::from(qp) << 16)
}

/// Splits a piece's `wr_id` index into (send slot, QP index).
pub(crate) fn piece_parse(index: u32) -> (u32, u8) {
    (index & 0xffff, (index >> 16) as u8)
}

pub(crate) fn wr_id(kind: WrKind, gen: u32, index: u32) -> u64 {
    (u64::from(kind as u8) << 56) | (u64::from(gen & 0x00ff_ffff) << 32) | u64::from(index)
}

pub(crate) fn wr_parse(id: u64) -> Option<(WrKind, u32, u32)> {
    let kind = match (id >> 56) as u8 {
        1 => WrKind::Eager,
        2 => WrKind::Direct,
        4 => WrKind::ErrNotify,
        5 => WrKind::Bounce,
        6 => WrKind::Cts,
        7 => WrKind::Credit,
        8 => WrKind::Zero,
        9 => WrKind::Piece,
        10 => WrKind::DataZero,
        11 => WrKind::Inline,
        12 => WrKind::InlineFlush,
        13 => WrKind::CtsRead,
        14 => WrKind::Wake,
        _ => return None,
    };
    Some((kind, ((id >> 32) & 0x00ff_ffff) as u32, id as u32))
}

/// Counters of one comm, kept by its engine (transport and device counters are added by the
/// driver). Names are stable: they appear in logs, `--stats` and `--json`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Completed operations (sends or receives).
    pub ops: u64,
    /// Payload bytes of completed operations.
    pub bytes: u64,
    /// Messages that went eagerly: a SEND into a bounce buffer, issued before the receive's
    /// clear-to-send was known (one copy at the receiver).
    pub eager: u64,
    /// Messages written straight into their receive buffer after its clear-to-send: one RDMA
    /// WRITE WITH IMM of the payload, any size (zero copy).
    pub rendezvous: u64,
    /// `isend` answered "retry later" for want of a credit.
    pub credit_stalls: u64,
    /// `isend` answered "retry later" because the clear-to-send had not arrived.
    pub cts_waits: u64,
    /// `isend` answered "retry later" because the front receive group had no unmatched buffer
    /// with the send's tag (several senders sharing one comm, one of them ahead).
    pub tag_waits: u64,
    /// "Retry later" because all request slots were in use.
    pub slots_full: u64,
    /// Receive post calls.
    pub rq_post_calls: u64,
    /// Receive WRs posted.
    pub rq_wrs_posted: u64,
    /// Lowest number of receive WRs posted seen after a consumption (receiver).
    pub rq_min_level: u64,
    /// Explicit credit writes sent (receiver).
    pub credit_msgs: u64,
    /// CTS entries sent (receiver) or consumed (sender).
    pub cts: u64,
    /// Eager messages that arrived before a receive with a free buffer of their tag was posted,
    /// held in their bounce buffers until one is (receiver).
    pub unexpected: u64,
    /// Error completions seen.
    pub error_completions: u64,
    /// Receive WRs the comm keeps posted now (receiver; adaptive between `VERBSNET_RQ_MIN_DEPTH`
    /// and `VERBSNET_RQ_DEPTH`).
    pub rq_depth: u64,
    /// Times the depth grew by a batch because the RQ ran dry (receiver).
    pub rq_grows: u64,
    /// Times the depth shrank by a batch after `VERBSNET_RQ_SHRINK_AFTER` without running dry.
    pub rq_shrinks: u64,
    /// Times the shared bounce pool could not give all the buffers asked for (receiver): the
    /// sender then waits for credits, it does not meet RNR.
    pub pool_exhausted: u64,
    /// Registered (pinned) bytes the comm holds now: bounce buffers and rings.
    pub pinned_bytes: u64,
    /// Zero-length receive WRs posted so that the posted WRs cover every posted receive buffer
    /// (receiver, credit gating on; they cost no memory).
    pub zero_wrs: u64,
    /// RDMA WRITE WITH IMMs (payload pieces, maybe empty) posted on the data QPs (QPs 1 and
    /// above of a connection with `VERBSNET_IB_QPS_PER_CONNECTION` > 1; sender).
    pub data_qp_writes: u64,
    /// Zero-length receive WRs posted on the data QPs, which their WRITE WITH IMMs consume
    /// (receiver; several QPs per connection).
    pub data_qp_zero_wrs: u64,
    /// Direct sends posted inline (`VERBSNET_INLINE_SIZE`; sender): their requests completed at
    /// the post, and one WR in [`INLINE_SIGNAL_EVERY`] is signaled. Also counted in
    /// `rendezvous`.
    pub inline_sends: u64,
    /// Small sends: direct sends of at most [`wire::SMALL_MAX`] bytes into a one-buffer
    /// receive, written inline into the receiver's small-send ring with no immediate, so they
    /// consume no receive WR and the receiver polls memory instead of its CQ (sender: posted;
    /// receiver: copied out). Also counted in `rendezvous` and, on the sender, `inline_sends`.
    pub small_sends: u64,
    /// RDMA READs of the receiver's CTS mirror (sender; docs/protocol.md, "The pulled
    /// clear-to-send"): each brings every compact entry published since the last.
    pub cts_reads: u64,
    /// CTS entries that went by READ, not by the receiver's WRITE: taken from the landing
    /// ring (sender), or stored in the mirror only because the sender pulls (receiver).
    pub cts_pulled: u64,
    /// Wake word writes (sender): asking the receiver to push its entries again (a READ came
    /// back without the entry a send needs) or to stop (eight entries in hand).
    pub wake_writes: u64,
}

impl Stats {
    /// `(name, value)` pairs in a fixed order.
    pub fn fields(&self) -> [(&'static str, u64); 28] {
        [
            ("ops", self.ops),
            ("bytes", self.bytes),
            ("eager", self.eager),
            ("rendezvous", self.rendezvous),
            ("credit_stalls", self.credit_stalls),
            ("cts_waits", self.cts_waits),
            ("tag_waits", self.tag_waits),
            ("slots_full", self.slots_full),
            ("rq_post_calls", self.rq_post_calls),
            ("rq_wrs_posted", self.rq_wrs_posted),
            ("rq_min_level", self.rq_min_level),
            ("credit_msgs", self.credit_msgs),
            ("cts", self.cts),
            ("unexpected", self.unexpected),
            ("error_completions", self.error_completions),
            ("rq_depth", self.rq_depth),
            ("rq_grows", self.rq_grows),
            ("rq_shrinks", self.rq_shrinks),
            ("pool_exhausted", self.pool_exhausted),
            ("pinned_bytes", self.pinned_bytes),
            ("zero_wrs", self.zero_wrs),
            ("data_qp_writes", self.data_qp_writes),
            ("data_qp_zero_wrs", self.data_qp_zero_wrs),
            ("inline_sends", self.inline_sends),
            ("small_sends", self.small_sends),
            ("cts_reads", self.cts_reads),
            ("cts_pulled", self.cts_pulled),
            ("wake_writes", self.wake_writes),
        ]
    }
}

/// What a request that made no progress is waiting for (hang watchdog).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stall {
    /// The request (`slot` `u32::MAX` for a streak of `isend` refusals).
    pub req: ReqId,
    /// What stalled, in the peer's terms: `send 4 (512 bytes, tag 7)`, `receive 2 (1 buffer)`,
    /// or `isend (answering 'retry later')`.
    pub what: String,
    /// Nanoseconds since it last made progress.
    pub idle_ns: u64,
    /// What it waits for, in words an operator can act on.
    pub waiting_for: String,
}

/// Request slot table with generations and a free list.
#[derive(Debug)]
pub(crate) struct Slots<T> {
    items: Vec<Option<T>>,
    gens: Vec<u32>,
    free: Vec<u32>,
}

impl<T> Slots<T> {
    pub(crate) fn new(n: usize) -> Self {
        Slots::with_first_gen(n, 0)
    }

    /// Slots whose generations start at `gen` (tests start near the wrap points).
    pub(crate) fn with_first_gen(n: usize, gen: u32) -> Self {
        Slots {
            items: (0..n).map(|_| None).collect(),
            gens: vec![gen; n],
            free: (0..n as u32).rev().collect(),
        }
    }

    /// Puts `v` in a free slot; `None` when every slot is in use. Inlined, so that a request
    /// built in the caller is written into its slot directly (a receive request is 368
    /// bytes).
    #[inline]
    pub(crate) fn insert(&mut self, v: T) -> Option<ReqId> {
        let slot = self.free.pop()?;
        self.items[slot as usize] = Some(v);
        Some(ReqId {
            slot,
            gen: self.gens[slot as usize],
        })
    }

    pub(crate) fn get(&self, id: ReqId) -> Option<&T> {
        (*self.gens.get(id.slot as usize)? == id.gen)
            .then(|| self.items[id.slot as usize].as_ref())
            .flatten()
    }

    pub(crate) fn get_mut(&mut self, id: ReqId) -> Option<&mut T> {
        if *self.gens.get(id.slot as usize)? != id.gen {
            return None;
        }
        self.items[id.slot as usize].as_mut()
    }

    /// Looks a request up by the slot and 24-bit generation carried in a `wr_id`.
    pub(crate) fn by_wr_mut(&mut self, slot: u32, gen24: u32) -> Option<(ReqId, &mut T)> {
        let gen = *self.gens.get(slot as usize)?;
        if gen & 0x00ff_ffff != gen24 {
            return None;
        }
        let id = ReqId { slot, gen };
        self.items[slot as usize].as_mut().map(|v| (id, v))
    }

    /// Frees request `id`'s slot, dropping the request where it lies (a receive request is
    /// 368 bytes; at 720, moving it out to drop it was a third of a completing `test`); false
    /// if `id` is not in use.
    pub(crate) fn remove(&mut self, id: ReqId) -> bool {
        let slot = id.slot as usize;
        if self.gens.get(slot) != Some(&id.gen) || self.items[slot].is_none() {
            return false;
        }
        self.items[slot] = None;
        self.gens[slot] = self.gens[slot].wrapping_add(1);
        self.free.push(id.slot);
        true
    }

    pub(crate) fn in_use(&self) -> usize {
        self.items.len() - self.free.len()
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (ReqId, &mut T)> {
        let gens = &self.gens;
        self.items.iter_mut().enumerate().filter_map(move |(i, v)| {
            v.as_mut().map(|v| {
                (
                    ReqId {
                        slot: i as u32,
                        gen: gens[i],
                    },
                    v,
                )
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wr_ids_round_trip() {
        let id = wr_id(WrKind::Direct, 0x0123_4567, 0xdead_beef);
        assert_eq!(
            wr_parse(id),
            Some((WrKind::Direct, 0x0023_4567, 0xdead_beef))
        );
        assert_eq!(
            wr_parse(wr_id(WrKind::Zero, 0, 0)),
            Some((WrKind::Zero, 0, 0))
        );
        assert_eq!(wr_parse(0), None);
        let id = wr_id(WrKind::Piece, 7, piece_index(255, 127));
        let (kind, gen, index) = wr_parse(id).unwrap();
        assert_eq!(
            (kind, gen, piece_parse(index)),
            (WrKind::Piece, 7, (255, 127))
        );
        assert_eq!(
            wr_parse(wr_id(WrKind::DataZero, 1, 2)),
            Some((WrKind::DataZero, 1, 2))
        );
    }

    #[test]
    fn sizes_read_as_the_slice_given_up_to_max_recvs() {
        let s = Sizes::of(&[64, 7, 0]);
        assert_eq!(&*s, &[64, 7, 0]);
        assert_eq!(s, vec![64, 7, 0]);
        assert_eq!(format!("{s:?}"), "[64, 7, 0]");
        let all: Vec<u64> = (1..=10).collect();
        assert_eq!(&*Sizes::of(&all), &all[..wire::MAX_RECVS]);
        assert!(Sizes::of(&[]).is_empty());
    }

    #[test]
    fn slots_detect_stale_handles_and_refill() {
        let mut s: Slots<u8> = Slots::new(2);
        let a = s.insert(1).unwrap();
        let b = s.insert(2).unwrap();
        assert_eq!(s.insert(3), None);
        assert_eq!(s.in_use(), 2);
        assert!(s.remove(a));
        assert_eq!(s.get(a), None, "stale handle after removal");
        assert!(!s.remove(a), "a stale handle frees nothing");
        let c = s.insert(4).unwrap();
        assert_eq!(c.slot, a.slot);
        assert_ne!(c.gen, a.gen);
        assert_eq!(s.get(c), Some(&4));
        assert_eq!(s.get(b), Some(&2));
    }
}
