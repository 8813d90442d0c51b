//! Wire formats of the verbsnet protocol (little-endian), with size checks.
//!
//! Three things cross the wire besides user data:
//!
//! **Eager header** — the first [`EAGER_HDR_LEN`] bytes of every eager SEND; the payload follows.
//!
//! | off | size | field |
//! |----:|-----:|-------|
//! | 0 | 2 | magic `0x5645` ("VE") |
//! | 2 | 1 | version (1) |
//! | 3 | 1 | kind (1 = eager) |
//! | 4 | 4 | tag (i32) |
//! | 8 | 8 | send sequence number `s` (u64) |
//! | 16 | 8 | payload size in bytes (u64) |
//! | 24 | 1 | flags: bit 0 = the sender waited for a credit since its last send (the
//! receiver grows its queue) |
//! | 25 | 7 | reserved (0) |
//!
//! **Clear-to-send (CTS) entry** — [`CTS_ENTRY_LEN`] bytes RDMA-written by the receiver into
//! slot `r % ring_entries` of the sender's CTS ring when it posts receive `r`. The sequence word
//! is written at both ends; the sender accepts the entry only when both equal `r + 1` (modulo
//! 2^63: bit 63 flags a compact entry, below), so a torn or stale entry is never used.
//!
//! | off | size | field |
//! |----:|-----:|-------|
//! | 0 | 8 | `r + 1` (head sequence word, never 0) |
//! | 8 | 8 | credits granted so far (cumulative receive WRs posted, of both kinds) |
//! | 16 | 8 | `base`: sequence number of the first send this receive takes |
//! | 24 | 4 | `n`: buffers in this (grouped) receive, 1..=8 |
//! | 28 | 4 | `zeros`: zero-length receive WRs this `irecv` posted; they are the last `zeros` of the `credits` WRs |
//! | 32 | 24×8 | per buffer: addr u64, capacity u64, rkey u32, tag i32 |
//! | 224 | 1 | `d`: rkeys per buffer, 1 (a receiver on one device) or its devices (a virtual one) |
//! | 225 | 23 | reserved |
//! | 248 | 8 | `r + 1` (tail sequence word) |
//!
//! A receiver on a virtual device of `d` > 1 physical ones (`makeVDevice`) registers each
//! buffer on every device, and the sender writes a piece on QP `q` with the rkey of the device
//! QP `q` runs on at the receiver (`q % d`, as NCCL IB's `devIndex`). Its entries are
//! [`CTS_ENTRY_LEN_STRIPED`] (512) bytes: the first 224 as above, then at 256 + 4 × (7k + j − 1)
//! buffer `k`'s rkey of device `j` (1 ≤ j < d), and the tail sequence word in the last 8 bytes
//! ([`cts_entry_len`]). The listen handle tells the sender `d` before it allocates its ring.
//!
//! **Compact CTS entry** (wire version 7) — a receive of one buffer with one rkey (`n` = 1,
//! `d` = 1: NCCL's usual receive) is written as its first 56 bytes (header and buffer 0, laid
//! out as above) and the tail sequence word at 56: [`CTS_COMPACT_LEN`] (64) bytes, the size of
//! NCCL IB's CTS element. Both sequence words carry bit 63 ([`CTS_COMPACT`]), so the reader
//! knows from the head where the tail is ([`CtsEntry::tail_at`]); the rest of the slot keeps an
//! older lap's bytes, which the reader ignores. The ring's stride stays [`cts_entry_len`].
//!
//! **Credit word** — 8 bytes the receiver RDMA-writes into the sender's credit word when it
//! re-posts receive WRs and the sender may be short of credits: bits 39..0 = the low 40 bits of
//! the credits granted so far, bits 63..40 = how many of the most recently posted WRs are
//! bounce-backed, counted back from the last one to the last zero-length one (saturating at
//! 2^24 − 1). One aligned 8-byte word, so the two fields are never seen torn apart
//! ([`credit_word`], [`credit_word_decode`]).
//!
//! **Direct write** — once the sender has read the CTS of the receive its send matches, it
//! writes the payload straight into the receive buffer with one RDMA_WRITE_WITH_IMM (any size,
//! 0 included); the receiver takes the size from the completion's `byte_len`
//! (`ibv_poll_cq(3)`: "relevant for … RDMA Write with immediate") and the buffer from the
//! immediate.
//!
//! **Records** — 8 bytes written by the sender's RDMA_WRITE_WITH_IMM into the receiver's
//! record slot, the first 8 bytes of its record region (wire version 9; before, a ring of one
//! slot per receive buffer). A **refusal record** when it refuses a send that is larger than its
//! matching buffer: the size with bit 63 ([`REC_TOO_BIG`]) set (nothing was written); the
//! immediate names the receive and buffer. A refusal fails the send comm, so a connection
//! carries at most one record and one slot holds it. Records go on QP 0 only.
//!
//! **Small-send ring** (wire version 8) — behind the record ring, in the same registration
//! and under the same rkey, [`SMALL_SLOTS`] slots of [`SMALL_SLOT_LEN`] (128) bytes, slot
//! `r % SMALL_SLOTS` for receive `r`. A direct send of at most [`SMALL_MAX`] (112) bytes into
//! a one-buffer receive whose clear-to-send is compact is one inline RDMA WRITE (no immediate)
//! of the payload and a 16-byte trailer, ending at the slot's end: the payload right-aligned
//! at `112 − size`, then the trailer word `size | (s mod 2^32) << 32` (`s` the send's sequence
//! number) and the sequence word `(r + 1) mod 2^63` with bit 63 set ([`SmallTrailer`]). It
//! consumes no receive WR. The receiver polls the sequence word of the slot of its oldest
//! receive not matched yet and copies the payload out; only then can the receive complete, so
//! the slot is free again by the time receive `r + 32` is posted (at most 32 receives are
//! outstanding) and its clear-to-send lets the sender write there. The sequence word names one
//! receive, so an older lap's trailer is never taken for a newer one and needs no clearing. The
//! reader relies on a WRITE landing in address order (the trailer last), as the CTS ring does.
//!
//! **CTS mirror and wake word** (wire version 9) — behind the small-send ring, in the same
//! registration and under the same rkey: [`MIRROR_SLOTS`] slots of [`CTS_COMPACT_LEN`] bytes
//! ([`MIRROR_LEN`] at [`MIRROR_AT`]), slot `r % MIRROR_SLOTS` for receive `r`, then the 8-byte
//! wake word at [`WAKE_AT`]. The receiver stores every compact CTS entry there, bytes 8..64
//! first and the head sequence word last, so a reader that sees the head and reads in address
//! order sees the rest; an older lap's entry names an older receive and is never taken for a
//! newer one (at most 32 receives are outstanding, so slot `r % 32` is reused only after receive
//! `r` completed). Receive `r` completes before the sender took its entry only through
//! speculative eager sends, which go only while the receiver pushes: entry `r` is then in the
//! CTS ring, or in the snapshot of the READ that followed the wake word, which the sender keeps
//! until its next READ, and a newer lap in the mirror does not change either. The sender writes
//! the wake word:
//! [`WAKE_PUSH`] (0, where a connection starts) asks the receiver to RDMA-write each compact
//! entry into the CTS ring too, [`WAKE_PULL`] (1) not to: the sender RDMA-reads the whole
//! mirror into a landing ring of the same layout when it needs an entry. Grouped and
//! multi-device entries are always written, never mirrored.
//!
//! **Immediate data** of a WRITE_WITH_IMM: bit 31 = record (1: a record into the record
//! ring; 0: a direct write of the payload), bit 30 = the sender waited for a credit since its
//! last credit-consuming send (the receiver grows its queue), bits 29..3 = low 27 bits of the
//! receive sequence number `r` (the group the send matched), bits 2..0 = buffer index `i`. At
//! most `MAX_RECV_REQUESTS` (32) receives are outstanding, so 27 bits name the group
//! unambiguously; the receiver checks that `(r, i)` is the buffer its own matching gives the
//! send (for an arrival on a data QP, several QPs per connection: that it is a buffer of a
//! posted receive that expects one there and is not complete).

/// Most buffers in one grouped receive (reported as `maxRecvs`).
pub const MAX_RECVS: usize = 8;
/// Bytes of the eager header.
pub const EAGER_HDR_LEN: usize = 32;
/// Offset of a 256-byte CTS entry's tail sequence word (the head one is at 0; a striped
/// entry's is its last 8 bytes too).
pub const CTS_TAIL_SEQ: usize = CTS_ENTRY_LEN - 8;
/// Bytes of one CTS entry whose buffers carry one rkey each (a receiver on one device).
pub const CTS_ENTRY_LEN: usize = 256;
/// Bytes of one CTS entry whose buffers carry up to [`MAX_DEVS`] rkeys (a receiver on a
/// virtual device).
pub const CTS_ENTRY_LEN_STRIPED: usize = 512;
/// Bytes a receiver writes for a CTS entry of one buffer with one rkey (the common case: NCCL
/// posts one buffer per receive unless connections are shared): the 32-byte header, the
/// buffer's 24 bytes and the tail sequence word, into a slot of the ring's stride. NCCL IB's
/// CTS element is 64 bytes per buffer too (`ncclIbSendFifo`, `src/transport/net_ib/common.h`).
/// A quarter of the 256 bytes crosses the wire: on a NIC one PCIe read of 64 bytes, on
/// soft-RoCE less packet to allocate, copy and checksum (`ib_write_lat` on rxe in the VM:
/// 9.4–10.1 µs at 64 bytes, 11.1–15.6 µs at 256; docs/performance.md).
pub const CTS_COMPACT_LEN: usize = 64;
/// Bit 63 of both sequence words of a compact entry ([`CTS_COMPACT_LEN`] bytes, tail word at
/// offset 56): the reader finds the tail from the head alone, so a compact entry and a full
/// one in the same slot (an older lap) are never mistaken for each other.
pub const CTS_COMPACT: u64 = 1 << 63;
/// Most physical devices behind one virtual device: `NCCL_NET_MAX_DEVS_PER_NIC` of
/// `net_v12.h` (v9–v11 tables allow 4).
pub const MAX_DEVS: usize = 8;

/// Bytes of one CTS entry of a receiver whose buffers carry `rkeys` rkeys each (its devices).
#[must_use]
pub const fn cts_entry_len(rkeys: u8) -> usize {
    if rkeys > 1 {
        CTS_ENTRY_LEN_STRIPED
    } else {
        CTS_ENTRY_LEN
    }
}

/// One memory key per device of a (virtual) device, in the device's order: what a buffer
/// registered on all of them is known by. [`Keys::at`] gives the key for QP `q`, which runs on
/// device `q % len` (NCCL IB: `devIndex = qpIndex % ndevs`, `src/transport/net_ib/connect.cc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keys {
    keys: [u32; MAX_DEVS],
    n: u8,
}

impl Default for Keys {
    fn default() -> Keys {
        Keys::one(0)
    }
}

impl From<u32> for Keys {
    fn from(k: u32) -> Keys {
        Keys::one(k)
    }
}

impl Keys {
    /// The key of a buffer on one device.
    #[must_use]
    pub const fn one(k: u32) -> Keys {
        let mut keys = [0; MAX_DEVS];
        keys[0] = k;
        Keys { keys, n: 1 }
    }

    /// One key per device, `1..=MAX_DEVS` of them; `None` otherwise.
    #[must_use]
    pub fn new(keys: &[u32]) -> Option<Keys> {
        if keys.is_empty() || keys.len() > MAX_DEVS {
            return None;
        }
        let mut k = [0; MAX_DEVS];
        k[..keys.len()].copy_from_slice(keys);
        Some(Keys {
            keys: k,
            n: keys.len() as u8,
        })
    }

    /// The key QP `qp` uses: device `qp % len`'s.
    #[must_use]
    pub fn at(&self, qp: u8) -> u32 {
        self.keys[usize::from(qp % self.n.max(1))]
    }

    /// Devices (keys): `1..=MAX_DEVS`.
    #[must_use]
    pub fn len(&self) -> u8 {
        self.n
    }

    /// Always false: a buffer has a key on at least one device.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The keys, device 0 first.
    #[must_use]
    pub fn as_slice(&self) -> &[u32] {
        &self.keys[..usize::from(self.n)]
    }
}
/// Bit 63 of a record: the send was larger than the receive buffer and was refused.
pub const REC_TOO_BIG: u64 = 1 << 63;
/// Bytes of the record slot at the start of the record region: one 8-byte record (a refusal
/// fails the send comm, so a connection carries at most one), padded to 64 so that the
/// small-send ring behind it starts on a cache line. (Wire version 8 kept a ring of one record
/// per receive buffer, 2 KiB; version 9 spends the room on the CTS mirror, and an idle
/// connection still pins 16 pages.)
pub const REC_RING_LEN: usize = 64;
/// Slots of the small-send ring: one per outstanding receive (slot `r % SMALL_SLOTS`).
pub const SMALL_SLOTS: usize = super::MAX_RECV_REQUESTS;
/// Bytes of one small-send slot: the payload, right-aligned, then the 16-byte trailer.
pub const SMALL_SLOT_LEN: usize = 128;
/// Bytes of the trailer that ends every small send ([`SmallTrailer`]).
pub const SMALL_TRAILER_LEN: usize = 16;
/// Largest payload of a small send, in bytes.
pub const SMALL_MAX: u64 = (SMALL_SLOT_LEN - SMALL_TRAILER_LEN) as u64;
/// Slots of the receiver's CTS mirror: one per outstanding receive (slot `r % MIRROR_SLOTS`),
/// each a compact entry of [`CTS_COMPACT_LEN`] bytes.
pub const MIRROR_SLOTS: usize = super::MAX_RECV_REQUESTS;
/// Bytes of the CTS mirror, which the sender RDMA-reads whole (and of its landing ring).
pub const MIRROR_LEN: usize = MIRROR_SLOTS * CTS_COMPACT_LEN;
/// Offset of the CTS mirror from the start of the record region: behind the small-send ring.
pub const MIRROR_AT: usize = REC_RING_LEN + SMALL_SLOTS * SMALL_SLOT_LEN;
/// Offset of the wake word from the start of the record region: behind the CTS mirror.
pub const WAKE_AT: usize = MIRROR_AT + MIRROR_LEN;
/// Wake word value: the receiver RDMA-writes every compact CTS entry to the sender (the value
/// of a fresh, zeroed registration: a connection starts pushing).
pub const WAKE_PUSH: u64 = 0;
/// Wake word value: the receiver only stores its compact CTS entries in the mirror, and the
/// sender RDMA-reads them.
pub const WAKE_PULL: u64 = 1;
/// Bytes the receiver registers for the record ring, the small-send ring, the CTS mirror and
/// the wake word, in that order.
pub const REC_REGION_LEN: usize = WAKE_AT + 8;

/// Offset of receive `r`'s CTS mirror slot from the start of the record region.
#[must_use]
pub const fn mirror_slot(r: u64) -> u64 {
    (MIRROR_AT + (r % MIRROR_SLOTS as u64) as usize * CTS_COMPACT_LEN) as u64
}

/// Offset of receive `r`'s small-send slot from the start of the record region.
#[must_use]
pub const fn small_slot(r: u64) -> u64 {
    (REC_RING_LEN + (r % SMALL_SLOTS as u64) as usize * SMALL_SLOT_LEN) as u64
}

/// The 16-byte trailer that ends a small send (see the module docs): the payload's size, the
/// low 32 bits of the send's sequence number, and the receive it fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmallTrailer {
    /// Payload bytes (at most [`SMALL_MAX`]), right before the trailer.
    pub size: u32,
    /// The send's sequence number, low 32 bits.
    pub s_low: u32,
}

impl SmallTrailer {
    /// The sequence word of receive `r`: `(r + 1) mod 2^63` with bit 63 set, never 0 (a slot
    /// not written yet holds none).
    #[must_use]
    pub const fn seq_word(r: u64) -> u64 {
        (r.wrapping_add(1) & !(1 << 63)) | 1 << 63
    }

    /// The trailer of a small send for receive `r`.
    #[must_use]
    pub fn encode(&self, r: u64) -> [u8; SMALL_TRAILER_LEN] {
        let mut b = [0u8; SMALL_TRAILER_LEN];
        let w = u64::from(self.size) | u64::from(self.s_low) << 32;
        b[..8].copy_from_slice(&w.to_le_bytes());
        b[8..].copy_from_slice(&Self::seq_word(r).to_le_bytes());
        b
    }

    /// The trailer whose first word is `w`, in receive `r`'s slot, read after its sequence
    /// word (at byte 8) was seen to be [`SmallTrailer::seq_word`]`(r)`: the sender writes the
    /// sequence word last, so only a reader that checks it first and then reads the rest sees
    /// the rest whole (an older lap's size word read before the new sequence word could pass
    /// for a send of 0 bytes). `Err` for a size above [`SMALL_MAX`].
    pub fn decode(w: u64, r: u64) -> Result<SmallTrailer, String> {
        let t = SmallTrailer {
            size: w as u32,
            s_low: (w >> 32) as u32,
        };
        if u64::from(t.size) > SMALL_MAX {
            return Err(format!(
                "a small send of {} bytes into receive {r}'s slot (at most {SMALL_MAX})",
                t.size
            ));
        }
        Ok(t)
    }
}

/// The registered buffers of a send comm to a receiver on one device, in bytes, in the order
/// the comm allocates them: eager-header staging (one header per send slot), record staging
/// (the one 8-byte refusal record a comm may send), the CTS ring the receiver writes, the credit word it
/// writes, and the landing ring its CTS mirror is RDMA-read into, followed by the two wake
/// word values the sender RDMA-writes from ([`LANDING_LEN`]; [`send_comm_buffers`]`(1)`).
pub const SEND_COMM_BUFFERS: [usize; 5] = send_comm_buffers(1);

/// Bytes of the sender's landing ring ([`MIRROR_LEN`]) and the two 8-byte words behind it that
/// hold [`WAKE_PUSH`] and [`WAKE_PULL`], the sources of its wake word WRITEs.
pub const LANDING_LEN: usize = MIRROR_LEN + 16;

/// [`SEND_COMM_BUFFERS`] for a receiver whose buffers carry `rkeys` rkeys each (its devices):
/// the CTS ring's entries are [`cts_entry_len`]`(rkeys)` bytes.
#[must_use]
pub const fn send_comm_buffers(rkeys: u8) -> [usize; 5] {
    [
        super::MAX_SEND_REQUESTS * EAGER_HDR_LEN,
        8,
        super::CTS_RING_ENTRIES * cts_entry_len(rkeys),
        8,
        LANDING_LEN,
    ]
}

/// Bytes of one bounce buffer, header included: the distance between two in a receive comm's
/// registration or a pool slab.
#[must_use]
pub const fn bounce_stride(eager_buf_size: u64) -> u64 {
    EAGER_HDR_LEN as u64 + eager_buf_size
}

/// The most a receive comm registers, in bytes, in allocation order: its bounce buffers at the
/// full depth `rq_depth × (EAGER_HDR_LEN + eager_buf_size)` (its own and those it may grow by
/// from the pool), the record ring and the small-send ring the sender writes
/// ([`REC_REGION_LEN`]), and the control staging (`CTRL_STAGE_SLOTS` CTS entries of
/// [`cts_entry_len`]`(rkeys)` bytes, `rkeys` its devices).
#[must_use]
pub fn recv_comm_buffers(rq_depth: u32, eager_buf_size: u32, rkeys: u8) -> [u64; 3] {
    [
        u64::from(rq_depth) * bounce_stride(eager_buf_size.into()),
        REC_REGION_LEN as u64,
        (super::CTRL_STAGE_SLOTS * cts_entry_len(rkeys)) as u64,
    ]
}

const MAGIC: u16 = 0x5645;
const VERSION: u8 = 1;
const KIND_EAGER: u8 = 1;

/// Header of an eager SEND.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EagerHeader {
    /// Sender's tag.
    pub tag: i32,
    /// Send sequence number.
    pub seq: u64,
    /// Payload bytes following the header.
    pub size: u64,
    /// The sender waited for a credit since its last credit-consuming send.
    pub starved: bool,
}

impl EagerHeader {
    /// Serializes the header.
    pub fn encode(&self) -> [u8; EAGER_HDR_LEN] {
        let mut b = [0u8; EAGER_HDR_LEN];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2] = VERSION;
        b[3] = KIND_EAGER;
        b[4..8].copy_from_slice(&self.tag.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.size.to_le_bytes());
        b[24] = u8::from(self.starved);
        b
    }

    /// Parses and validates a header; `None` for anything malformed.
    pub fn decode(b: &[u8]) -> Option<EagerHeader> {
        if b.len() < EAGER_HDR_LEN
            || u16::from_le_bytes([b[0], b[1]]) != MAGIC
            || b[2] != VERSION
            || b[3] != KIND_EAGER
        {
            return None;
        }
        Some(EagerHeader {
            tag: i32::from_le_bytes(b[4..8].try_into().ok()?),
            seq: u64::from_le_bytes(b[8..16].try_into().ok()?),
            size: u64::from_le_bytes(b[16..24].try_into().ok()?),
            starved: b[24] & 1 != 0,
        })
    }
}

/// One receive buffer announced in a CTS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtsBuf {
    /// Receiver virtual address.
    pub addr: u64,
    /// Capacity in bytes.
    pub cap: u64,
    /// Remote keys for RDMA writes into it: one per device of the receiver (a write on QP `q`
    /// uses [`Keys::at`]`(q)`).
    pub rkeys: Keys,
    /// Tag the receive expects for this buffer.
    pub tag: i32,
}

impl CtsBuf {
    /// Zero address, capacity and tag, one rkey 0 (also [`CtsBuf::default`]); a constant, so
    /// that [`CtsEntry::BLANK`] can repeat it.
    pub const BLANK: CtsBuf = CtsBuf {
        addr: 0,
        cap: 0,
        rkeys: Keys::one(0),
        tag: 0,
    };
}

impl Default for CtsBuf {
    fn default() -> CtsBuf {
        CtsBuf::BLANK
    }
}

/// A clear-to-send entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtsEntry {
    /// Receive sequence number.
    pub r: u64,
    /// Cumulative credits granted.
    pub credits: u64,
    /// First send sequence number this receive takes.
    pub base: u64,
    /// Number of valid entries in `bufs`.
    pub n: u32,
    /// Zero-length receive WRs this receive's `irecv` posted: the last `zeros` of the
    /// `credits` WRs granted (a SEND must never consume one).
    pub zeros: u32,
    /// The buffers.
    pub bufs: [CtsBuf; MAX_RECVS],
}

impl CtsEntry {
    /// Serializes the entry for a ring of stride `len` ([`cts_entry_len`] of its buffers' rkey
    /// count: every buffer carries as many): the bytes to write at the slot's start, `len` of
    /// them, or [`CTS_COMPACT_LEN`] for one buffer with one rkey (sequence words flagged
    /// [`CTS_COMPACT`]).
    pub fn encode(&self, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; self.encoded_len(len)];
        self.encode_into(&mut b);
        b
    }

    /// How many bytes [`CtsEntry::encode`] gives for a ring of stride `len`: `len`, or
    /// [`CTS_COMPACT_LEN`] for one buffer with one rkey.
    #[must_use]
    pub fn encoded_len(&self, len: usize) -> usize {
        CtsEntry::len_of(self.announced(), len)
    }

    /// The buffers the entry announces (`bufs[..n]`).
    fn announced(&self) -> &[CtsBuf] {
        &self.bufs[..(self.n as usize).min(MAX_RECVS)]
    }

    /// [`CtsEntry::encoded_len`] of an entry announcing `bufs`.
    #[must_use]
    pub fn len_of(bufs: &[CtsBuf], len: usize) -> usize {
        if CtsEntry::compact(bufs) {
            CTS_COMPACT_LEN
        } else {
            len
        }
    }

    /// One buffer with one rkey: the 64-byte compact form.
    fn compact(bufs: &[CtsBuf]) -> bool {
        bufs.len() == 1 && bufs[0].rkeys.len() == 1
    }

    /// [`CtsEntry::encode`] into `b` (zeroed, [`CtsEntry::encoded_len`] bytes long), without
    /// allocating.
    pub fn encode_into(&self, b: &mut [u8]) {
        let e = self;
        CtsEntry::encode_parts(e.r, e.credits, e.base, e.zeros, e.announced(), b);
    }

    /// [`CtsEntry::encode_into`] of the entry of receive `r` with these fields and buffers
    /// (`1..=MAX_RECVS`, each with the same number of rkeys), without building the entry: what
    /// the receiver's `irecv` stages. `b` is zeroed and [`CtsEntry::len_of`] bytes long; the
    /// slots of a full entry past the last buffer stay zero, as a default buffer encodes.
    pub fn encode_parts(
        r: u64,
        credits: u64,
        base: u64,
        zeros: u32,
        bufs: &[CtsBuf],
        b: &mut [u8],
    ) {
        let d = bufs.first().map_or(1, |b| b.rkeys.len());
        // A compact entry is the full one's first 56 bytes (header and buffer 0) and its tail.
        let compact = CtsEntry::compact(bufs);
        let len = b.len();
        let seq = seq_word(r, compact);
        b[0..8].copy_from_slice(&seq.to_le_bytes());
        b[8..16].copy_from_slice(&credits.to_le_bytes());
        b[16..24].copy_from_slice(&base.to_le_bytes());
        b[24..28].copy_from_slice(&(bufs.len() as u32).to_le_bytes());
        b[28..32].copy_from_slice(&zeros.to_le_bytes());
        for (k, buf) in bufs.iter().enumerate() {
            let o = 32 + 24 * k;
            b[o..o + 8].copy_from_slice(&buf.addr.to_le_bytes());
            b[o + 8..o + 16].copy_from_slice(&buf.cap.to_le_bytes());
            b[o + 16..o + 20].copy_from_slice(&buf.rkeys.at(0).to_le_bytes());
            b[o + 20..o + 24].copy_from_slice(&buf.tag.to_le_bytes());
            for j in 1..usize::from(d) {
                let x = ext_rkey(k, j);
                if let Some(dst) = b.get_mut(x..x + 4) {
                    dst.copy_from_slice(&buf.rkeys.at(j as u8).to_le_bytes());
                }
            }
        }
        if !compact {
            b[224] = d;
        }
        b[len - 8..len].copy_from_slice(&seq.to_le_bytes());
    }

    /// The head sequence word of a raw entry (`r + 1` once written, 0 before; flagged
    /// [`CTS_COMPACT`] in a compact entry).
    pub fn head_seq(b: &[u8]) -> Option<u64> {
        Some(u64::from_le_bytes(b.get(0..8)?.try_into().ok()?))
    }

    /// Where the tail sequence word of the entry whose head word is `head` lies, in a ring of
    /// stride `len`: at 56 in a compact entry, else in the slot's last 8 bytes.
    #[must_use]
    pub fn tail_at(head: u64, len: usize) -> usize {
        if head & CTS_COMPACT != 0 {
            CTS_COMPACT_LEN - 8
        } else {
            len - 8
        }
    }

    /// What a slot's two sequence words (`head` at offset 0, `tail` in its last 8 bytes) say
    /// about the entry of receive `expect_r`: `Ok(true)` both name it (the whole entry has
    /// landed: decode it), `Ok(false)` not (fully) written yet (nothing, an older lap's entry,
    /// or only its head so far), `Err` a slot that holds something else (corrupt). The same
    /// decision [`CtsEntry::decode`] makes first, so a reader may look at the two words alone
    /// before it copies the whole entry.
    ///
    /// `tail` is the word at [`CtsEntry::tail_at`] of `head`: a compact entry's flag must be
    /// on both words.
    pub fn landed(head: u64, tail: u64, expect_r: u64) -> Result<bool, String> {
        let want = seq_word(expect_r, false);
        let want_head = want | (head & CTS_COMPACT);
        if head == want_head && tail == want_head {
            return Ok(true);
        }
        // An older lap's entry (or nothing yet): not ready. Anything else is corrupt.
        let stale = |v: u64| stale_seq(v, want);
        if (stale(head) && stale(tail)) || head == want_head {
            // (head == want: the tail has not landed yet)
            return Ok(false);
        }
        Err(format!(
            "CTS slot holds sequence {head}/{tail}, expected {want}"
        ))
    }

    /// Whether a slot whose head sequence word is `head` holds nothing of receive `expect_r`'s
    /// entry yet: nothing at all, or an older lap's entry. A reader that sees this needs not
    /// read the tail (where [`CtsEntry::landed`] would also catch a corrupt tail word: the
    /// entry is checked whole once its head names it).
    #[must_use]
    pub fn head_pending(head: u64, expect_r: u64) -> bool {
        let want = seq_word(expect_r, false);
        head & !CTS_COMPACT != want && stale_seq(head, want)
    }

    /// Parses an entry that should hold receive `expect_r`, all of `b` (its length is the
    /// ring's stride, [`cts_entry_len`]: the tail sequence word is its last 8 bytes).
    /// `Ok(None)`: not (fully) written yet. `Err`: a complete entry that is not the expected
    /// one or is malformed (an rkey count `d` outside what its length holds).
    pub fn decode(b: &[u8], expect_r: u64) -> Result<Option<CtsEntry>, String> {
        let mut e = CtsEntry::BLANK;
        Ok(CtsEntry::decode_into(b, expect_r, &mut e)?.then_some(e))
    }

    /// An entry with no buffer filled in (every field 0, every buffer's rkeys one key 0): what
    /// [`CtsEntry::decode_into`] writes over.
    pub const BLANK: CtsEntry = CtsEntry {
        r: 0,
        credits: 0,
        base: 0,
        n: 0,
        zeros: 0,
        bufs: [CtsBuf::BLANK; MAX_RECVS],
    };

    /// [`CtsEntry::decode`] into `out`, where the reader keeps it (the sender decodes into
    /// its newest known group, with no copy of the entry; a compact head is handed to
    /// [`CtsEntry::decode_compact`]): `Ok(true)` the entry landed and
    /// `out` holds it (buffers past `out.n` are left as they were), `Ok(false)` not (fully)
    /// written yet, `out` untouched. `Err` as `decode`; `out` may be partly written.
    pub fn decode_into(b: &[u8], expect_r: u64, out: &mut CtsEntry) -> Result<bool, String> {
        let len = b.len();
        if len != CTS_ENTRY_LEN && len != CTS_ENTRY_LEN_STRIPED {
            return Err(format!("CTS entry of {len} bytes"));
        }
        let u64_at = |o: usize| le_u64(b, o);
        let u32_at = |o: usize| le_u32(b, o);
        let head = u64_at(0);
        if let (true, Some(c)) = (head & CTS_COMPACT != 0, b.first_chunk()) {
            // A compact entry's bytes past its tail are an older lap's.
            return CtsEntry::decode_compact(c, expect_r, out);
        }
        if !CtsEntry::landed(head, u64_at(CtsEntry::tail_at(head, len)), expect_r)? {
            return Ok(false);
        }
        let n = u32_at(24);
        if n == 0 || n as usize > MAX_RECVS {
            return Err(format!(
                "CTS for receive {expect_r} announces {n} buffers (1..=8)"
            ));
        }
        let d = usize::from(b[224]);
        let most = if len == CTS_ENTRY_LEN { 1 } else { MAX_DEVS };
        if d == 0 || d > most {
            return Err(format!(
                "CTS for receive {expect_r} carries {d} rkeys per buffer in a {len}-byte entry \
                 (1..={most})"
            ));
        }
        for (k, buf) in out.bufs.iter_mut().enumerate().take(n as usize) {
            let o = 32 + 24 * k;
            let rkeys = if d == 1 {
                Keys::one(u32_at(o + 16))
            } else {
                let mut rk = [0u32; MAX_DEVS];
                rk[0] = u32_at(o + 16);
                for (j, r) in rk.iter_mut().enumerate().take(d).skip(1) {
                    *r = u32_at(ext_rkey(k, j));
                }
                Keys::new(&rk[..d]).unwrap_or_default()
            };
            *buf = CtsEntry::buf_at(b, o, rkeys);
        }
        CtsEntry::header_into(b, expect_r, n, out);
        Ok(true)
    }

    /// Buffer fields at offset `o` of an entry's bytes `b` (address, capacity, tag; its rkeys
    /// read by the caller: one at `o + 16`, more in a striped entry's tail). The layout
    /// [`CtsEntry::encode_parts`] writes.
    #[inline]
    fn buf_at(b: &[u8], o: usize, rkeys: Keys) -> CtsBuf {
        CtsBuf {
            addr: le_u64(b, o),
            cap: le_u64(b, o + 8),
            rkeys,
            tag: le_u32(b, o + 20) as i32,
        }
    }

    /// The header of receive `expect_r`'s entry `b`, announcing `n` buffers, into `out`: the
    /// credits at 8, the base at 16 and the zero-length WRs at 28.
    #[inline]
    fn header_into(b: &[u8], expect_r: u64, n: u32, out: &mut CtsEntry) {
        out.r = expect_r;
        out.credits = le_u64(b, 8);
        out.base = le_u64(b, 16);
        out.n = n;
        out.zeros = le_u32(b, 28);
    }

    /// [`CtsEntry::decode_into`] of a compact entry ([`CTS_COMPACT_LEN`] bytes, both sequence
    /// words flagged [`CTS_COMPACT`]): one buffer with one rkey, the header and buffer 0 laid
    /// out as in a full entry, the tail sequence word at 56. What the sender decodes for
    /// NCCL's usual receive, with no length or rkey-count cases to weigh. The caller has seen
    /// [`CTS_COMPACT`] on the head word (a slot that may hold a full entry, or nothing yet,
    /// goes to [`CtsEntry::decode_into`]). `Ok(false)`: not (fully) written yet (an older
    /// lap's entry, or this one's head without its tail), `out` untouched. `Err`: a head
    /// without the flag, not the entry of `expect_r` (a later lap), or a count of buffers
    /// other than 1.
    pub fn decode_compact(
        b: &[u8; CTS_COMPACT_LEN],
        expect_r: u64,
        out: &mut CtsEntry,
    ) -> Result<bool, String> {
        let head = le_u64(b, 0);
        if head & CTS_COMPACT == 0 {
            return Err(format!(
                "CTS for receive {expect_r}: a full entry's head {head:#x} where a compact one \
                 is read"
            ));
        }
        if !CtsEntry::landed(head, le_u64(b, CTS_COMPACT_LEN - 8), expect_r)? {
            return Ok(false);
        }
        let n = le_u32(b, 24);
        if n != 1 {
            return Err(format!(
                "CTS for receive {expect_r} announces {n} buffers (1 in a compact entry)"
            ));
        }
        out.bufs[0] = CtsEntry::buf_at(b, 32, Keys::one(le_u32(b, 48)));
        CtsEntry::header_into(b, expect_r, 1, out);
        Ok(true)
    }
}

/// The little-endian word at offset `o` of an entry's bytes `b` (inside them: the decoders
/// check the entry's length first).
#[inline]
fn le_u64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default())
}

/// [`le_u64`] of a 4-byte word.
#[inline]
fn le_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or_default())
}

/// The sequence word of receive `r`'s CTS entry: `r + 1` modulo 2^63 (never 0 but once in
/// 2^63 receives), with [`CTS_COMPACT`] on for a compact entry.
#[must_use]
pub fn seq_word(r: u64, compact: bool) -> u64 {
    let seq = r.wrapping_add(1) & !CTS_COMPACT;
    if compact {
        seq | CTS_COMPACT
    } else {
        seq
    }
}

/// Whether the sequence word `v` (compact flag ignored) is 0 or an older lap's than `want`
/// (sequences count modulo 2^63, below the compact flag).
fn stale_seq(v: u64, want: u64) -> bool {
    let v = v & !CTS_COMPACT;
    v == 0 || want.wrapping_sub(v) & !CTS_COMPACT < (1 << 62)
}

/// Offset of buffer `k`'s rkey of device `j` (1 ≤ j < [`MAX_DEVS`]) in a striped CTS entry.
const fn ext_rkey(k: usize, j: usize) -> usize {
    CTS_ENTRY_LEN + 4 * (k * (MAX_DEVS - 1) + j - 1)
}
const _: () = assert!(ext_rkey(MAX_RECVS - 1, MAX_DEVS - 1) + 4 <= CTS_ENTRY_LEN_STRIPED - 8);

/// Immediate bit 31: the WRITE_WITH_IMM carries a record (refusal or size), not a payload.
pub const IMM_RECORD: u32 = 1 << 31;
/// Immediate bit 30: the sender waited for a credit since its last credit-consuming send.
pub const IMM_STARVED: u32 = 1 << 30;
const IMM_R_BITS: u32 = 27;
const IMM_R_MASK: u64 = (1 << IMM_R_BITS) - 1;

/// What a WRITE_WITH_IMM's immediate says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Imm {
    /// Low 27 bits of the receive sequence number the send matched.
    pub r_low: u32,
    /// Buffer index inside that receive.
    pub buf: usize,
    /// A record, refusal or size (true), or a direct write of the payload (false).
    pub record: bool,
    /// The sender waited for a credit since its last credit-consuming send.
    pub starved: bool,
}

/// Packs the immediate of a WRITE_WITH_IMM for buffer `buf_idx` of receive `r`.
pub fn imm_encode(r: u64, buf_idx: usize, record: bool, starved: bool) -> u32 {
    let mut v = (((r & IMM_R_MASK) as u32) << 3) | (buf_idx as u32 & 7);
    if record {
        v |= IMM_RECORD;
    }
    if starved {
        v |= IMM_STARVED;
    }
    v
}

/// Unpacks an immediate.
pub fn imm_decode(imm: u32) -> Imm {
    Imm {
        r_low: (imm >> 3) & IMM_R_MASK as u32,
        buf: (imm & 7) as usize,
        record: imm & IMM_RECORD != 0,
        starved: imm & IMM_STARVED != 0,
    }
}

/// True when the 27-bit `low` matches sequence number `seq`.
pub fn imm_matches(low: u32, seq: u64) -> bool {
    u64::from(low) == seq & IMM_R_MASK
}

const CREDIT_LOW_BITS: u32 = 40;
const CREDIT_LOW_MASK: u64 = (1 << CREDIT_LOW_BITS) - 1;
const CREDIT_TAIL_MAX: u64 = (1 << (64 - CREDIT_LOW_BITS)) - 1;

/// The credit word for `granted` WRs posted so far, the last zero-length one being WR
/// `z_end − 1` (`z_end` = 0: none yet). See the module docs.
pub fn credit_word(granted: u64, z_end: u64) -> u64 {
    let tail = granted.saturating_sub(z_end).min(CREDIT_TAIL_MAX);
    (granted & CREDIT_LOW_MASK) | (tail << CREDIT_LOW_BITS)
}

/// Reads a credit word against the credits known so far (`known`, which the word's 40-bit
/// count extends: counts only grow, by far less than 2^39 between two reads). Returns
/// `(granted, z_end)` where every WR in `z_end..granted` is bounce-backed (a lower bound when
/// the tail saturated).
pub fn credit_word_decode(word: u64, known: u64) -> (u64, u64) {
    let low = word & CREDIT_LOW_MASK;
    let tail = word >> CREDIT_LOW_BITS;
    let mut g = (known & !CREDIT_LOW_MASK) | low;
    if g < known && known - g > (1 << (CREDIT_LOW_BITS - 1)) {
        g += 1 << CREDIT_LOW_BITS;
    }
    (g, g.saturating_sub(tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eager_header_round_trips_and_rejects_garbage() {
        let h = EagerHeader {
            tag: -3,
            seq: u64::MAX - 1,
            size: 4096,
            starved: true,
        };
        let b = h.encode();
        assert_eq!(EagerHeader::decode(&b), Some(h));
        let mut bad = b;
        bad[0] ^= 1;
        assert_eq!(EagerHeader::decode(&bad), None);
        assert_eq!(EagerHeader::decode(&b[..31]), None);
    }

    #[test]
    fn cts_round_trips_and_detects_stale_and_corrupt() {
        let mut bufs = [CtsBuf::default(); MAX_RECVS];
        bufs[1] = CtsBuf {
            addr: 0x1000,
            cap: 77,
            rkeys: Keys::one(9),
            tag: 5,
        };
        let e = CtsEntry {
            r: 41,
            credits: 300,
            base: 90,
            n: 2,
            zeros: 3,
            bufs,
        };
        let b = e.encode(CTS_ENTRY_LEN);
        assert_eq!(b.len(), CTS_ENTRY_LEN);
        assert_eq!(CtsEntry::decode(&b, 41), Ok(Some(e)));
        // The previous lap's entry is "not ready", not an error.
        assert_eq!(CtsEntry::decode(&b, 41 + 512), Ok(None));
        assert_eq!(CtsEntry::decode(&[0u8; 256], 0), Ok(None));
        // Head written, tail not yet: not ready.
        let mut torn = b.clone();
        torn[248..256].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(CtsEntry::decode(&torn, 41), Ok(None));
        // A newer entry than expected: the ring was overrun.
        assert!(CtsEntry::decode(&b, 30).is_err());
        let mut badn = b.clone();
        badn[24..28].copy_from_slice(&9u32.to_le_bytes());
        assert!(CtsEntry::decode(&badn, 41).is_err());
        // The two sequence words alone decide "landed" as decode does (a reader looks at them
        // before it copies the entry).
        let words = |e: &[u8]| {
            let w = |o: usize| u64::from_le_bytes(e[o..o + 8].try_into().unwrap());
            (w(0), w(CTS_TAIL_SEQ))
        };
        for (entry, r, landed) in [
            (b.clone(), 41, Ok(true)),
            (b.clone(), 41 + 512, Ok(false)),
            (vec![0u8; CTS_ENTRY_LEN], 0, Ok(false)),
            (torn, 41, Ok(false)),
        ] {
            let (head, tail) = words(&entry);
            assert_eq!(CtsEntry::landed(head, tail, r), landed, "receive {r}");
            assert_eq!(
                CtsEntry::decode(&entry, r).map(|o| o.is_some()),
                landed,
                "decode agrees for receive {r}"
            );
        }
        let (head, tail) = words(&b);
        assert!(CtsEntry::landed(head, tail, 30).is_err(), "overrun");
        // The head alone says "nothing yet" for an empty slot or an older lap's entry, and
        // never for the entry itself (torn or whole, compact or not) or a newer one.
        assert!(CtsEntry::head_pending(0, 0));
        assert!(CtsEntry::head_pending(head, 41 + 512));
        assert!(!CtsEntry::head_pending(head, 41));
        assert!(!CtsEntry::head_pending(head | CTS_COMPACT, 41));
        assert!(
            !CtsEntry::head_pending(head, 30),
            "overrun: checked with the tail"
        );
        for (entry, r) in [(vec![0u8; CTS_ENTRY_LEN], 0), (b.clone(), 41 + 512)] {
            let (head, tail) = words(&entry);
            assert_eq!(CtsEntry::landed(head, tail, r), Ok(false), "pending agrees");
        }
    }

    /// A receiver on a virtual device of `d` devices announces `d` rkeys per buffer in a
    /// 512-byte entry (tail word last); the count is checked against what the length holds.
    #[test]
    fn striped_cts_entries_carry_one_rkey_per_device_and_refuse_bad_counts() {
        for d in [2u8, 3, 8] {
            let keys: Vec<u32> = (0..u32::from(d)).map(|j| 0x100 + j).collect();
            let mut bufs = [CtsBuf::default(); MAX_RECVS];
            for (k, b) in bufs.iter_mut().enumerate() {
                let ks: Vec<u32> = keys.iter().map(|x| x + 0x1000 * k as u32).collect();
                *b = CtsBuf {
                    addr: 0x1000 * k as u64,
                    cap: 64,
                    rkeys: Keys::new(&ks).unwrap(),
                    tag: k as i32,
                };
            }
            let e = CtsEntry {
                r: 7,
                credits: 9,
                base: 3,
                n: 8,
                zeros: 1,
                bufs,
            };
            let len = cts_entry_len(d);
            assert_eq!(len, CTS_ENTRY_LEN_STRIPED);
            let b = e.encode(len);
            assert_eq!(CtsEntry::decode(&b, 7), Ok(Some(e)), "{d} devices");
            assert_eq!(e.bufs[5].rkeys.at(d + 1), 0x5101, "QP d+1 is on device 1");
            // The tail word is the entry's last: not landed until it is.
            let mut torn = b.clone();
            torn[len - 8..].fill(0);
            assert_eq!(CtsEntry::decode(&torn, 7), Ok(None));
            let mut bad = b.clone();
            bad[224] = 9;
            assert!(CtsEntry::decode(&bad, 7)
                .unwrap_err()
                .contains("9 rkeys per buffer"));
        }
        // A 256-byte entry holds one rkey per buffer (two buffers: one would be compact).
        let mut one = CtsEntry {
            r: 1,
            credits: 1,
            base: 0,
            n: 2,
            zeros: 0,
            bufs: [CtsBuf::default(); MAX_RECVS],
        }
        .encode(CTS_ENTRY_LEN);
        assert_eq!(one[224], 1);
        one[224] = 2;
        assert!(CtsEntry::decode(&one, 1).unwrap_err().contains("(1..=1)"));
        assert!(CtsEntry::decode(&one[..255], 1).is_err());
        assert_eq!(Keys::new(&[]), None);
        assert_eq!(Keys::new(&[1; 9]), None);
        assert_eq!(Keys::one(5).at(200), 5);
    }

    /// One buffer with one rkey: 64 bytes written at the slot's start, both sequence words
    /// flagged; the slot's other bytes (an older lap's full entry) are not read.
    #[test]
    fn compact_cts_entries_are_64_bytes_and_never_mistaken_for_full_ones() {
        let mut bufs = [CtsBuf::default(); MAX_RECVS];
        bufs[0] = CtsBuf {
            addr: 0x7f00_1234_5000,
            cap: 1 << 20,
            rkeys: Keys::one(0xabc),
            tag: -2,
        };
        let e = CtsEntry {
            r: 70,
            credits: 12,
            base: 33,
            n: 1,
            zeros: 1,
            bufs,
        };
        let c = e.encode(CTS_ENTRY_LEN);
        assert_eq!(c.len(), CTS_COMPACT_LEN);
        // The slot held receive 6's full entry (one lap of 64 earlier, two buffers).
        let mut old = e;
        old.r = 6;
        old.n = 2;
        let mut slot = old.encode(CTS_ENTRY_LEN);
        assert_eq!(
            CtsEntry::decode(&slot, 70),
            Ok(None),
            "the older lap: not ready"
        );
        // Only the compact entry's head landed: its tail is read at 56, not at 248.
        slot[..8].copy_from_slice(&c[..8]);
        let head = CtsEntry::head_seq(&slot).unwrap();
        assert_eq!(CtsEntry::tail_at(head, CTS_ENTRY_LEN), 56);
        assert_eq!(CtsEntry::decode(&slot, 70), Ok(None), "torn: tail not yet");
        slot[..CTS_COMPACT_LEN].copy_from_slice(&c);
        assert_eq!(CtsEntry::decode(&slot, 70), Ok(Some(e)));
        // In a striped ring's slot the same 64 bytes decode the same way.
        let mut wide = vec![0u8; CTS_ENTRY_LEN_STRIPED];
        wide[..CTS_COMPACT_LEN].copy_from_slice(&c);
        assert_eq!(CtsEntry::decode(&wide, 70), Ok(Some(e)));
        // A compact entry announcing two buffers is corrupt.
        let mut bad = slot.clone();
        bad[24..28].copy_from_slice(&2u32.to_le_bytes());
        assert!(CtsEntry::decode(&bad, 70)
            .unwrap_err()
            .contains("1 in a compact entry"));
        // A full entry's head with the flag off is looked for at the slot's end: the compact
        // tail at 56 alone does not make it landed.
        let mut unflagged = slot.clone();
        unflagged[..8].copy_from_slice(&seq_word(70, false).to_le_bytes());
        assert_eq!(CtsEntry::decode(&unflagged, 70), Ok(None));
        // Overrun: a compact entry of a later lap than expected is an error.
        assert!(CtsEntry::decode(&slot, 6).is_err());
        // The sender's own path, the 64 bytes alone: the same entry, the same refusals.
        let c64: [u8; CTS_COMPACT_LEN] = c[..].try_into().unwrap();
        let mut out = CtsEntry::BLANK;
        assert_eq!(CtsEntry::decode_compact(&c64, 70, &mut out), Ok(true));
        assert_eq!(out, e);
        let mut torn = c64;
        torn[56..].copy_from_slice(&seq_word(6, true).to_le_bytes());
        let mut untouched = CtsEntry::BLANK;
        assert_eq!(
            CtsEntry::decode_compact(&torn, 70, &mut untouched),
            Ok(false),
            "head landed, tail an older lap's"
        );
        assert_eq!(untouched, CtsEntry::BLANK);
        let two: [u8; CTS_COMPACT_LEN] = bad[..CTS_COMPACT_LEN].try_into().unwrap();
        assert!(CtsEntry::decode_compact(&two, 70, &mut out)
            .unwrap_err()
            .contains("1 in a compact entry"));
        let full: [u8; CTS_COMPACT_LEN] = unflagged[..CTS_COMPACT_LEN].try_into().unwrap();
        assert!(CtsEntry::decode_compact(&full, 70, &mut out)
            .unwrap_err()
            .contains("full entry"));
    }

    #[test]
    fn cts_sequence_wraps() {
        let e = CtsEntry {
            r: u64::MAX - 1,
            credits: 1,
            base: 0,
            n: 1,
            zeros: 0,
            bufs: [CtsBuf::default(); 8],
        };
        for n in [1, 2] {
            // compact (one buffer) and full
            let e = CtsEntry { n, ..e };
            let mut slot = vec![0u8; CTS_ENTRY_LEN];
            let b = e.encode(CTS_ENTRY_LEN);
            slot[..b.len()].copy_from_slice(&b);
            assert_eq!(CtsEntry::decode(&slot, u64::MAX - 1), Ok(Some(e)), "n {n}");
            // The next lap's receive (64 later) finds it "not ready", across the wrap.
            assert_eq!(
                CtsEntry::decode(&slot, (u64::MAX - 1).wrapping_add(64)),
                Ok(None)
            );
        }
        // Ring slot indices stay consistent across the 2^64 wrap (512 divides 2^64).
        assert_eq!(
            (u64::MAX % 512 + 1) % 512,
            0u64.wrapping_add(u64::MAX).wrapping_add(1) % 512
        );
    }

    #[test]
    fn imm_packs_and_wraps() {
        let d = imm_decode(imm_encode(0x0800_0005, 7, false, true));
        assert_eq!(
            d,
            Imm {
                r_low: 5,
                buf: 7,
                record: false,
                starved: true
            }
        );
        assert!(imm_matches(d.r_low, 0x0800_0005));
        assert!(imm_matches(d.r_low, 5));
        assert!(!imm_matches(d.r_low, 6));
        let d = imm_decode(imm_encode(u64::MAX, 0, true, false));
        assert_eq!(
            (d.r_low, d.buf, d.record, d.starved),
            ((1 << 27) - 1, 0, true, false)
        );
    }

    #[test]
    fn credit_words_carry_count_and_zero_mark_and_extend_across_the_40_bit_wrap() {
        assert_eq!(credit_word_decode(credit_word(34, 34), 2), (34, 34));
        assert_eq!(credit_word_decode(credit_word(40, 34), 34), (40, 34));
        assert_eq!(credit_word_decode(credit_word(7, 0), 0), (7, 0));
        // A count past 2^40 read against a known count just below it.
        let g = (1u64 << 40) + 5;
        assert_eq!(
            credit_word_decode(credit_word(g, g - 3), g - 20),
            (g, g - 3)
        );
        // A saturated tail gives a conservative mark: at most the last 2^24 - 1 are known.
        let g = 1u64 << 30;
        let (got, z) = credit_word_decode(credit_word(g, 0), g - 1);
        assert_eq!((got, z), (g, g - CREDIT_TAIL_MAX));
    }
}
