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
//! is written at both ends; the sender accepts the entry only when both equal `r + 1`, so a torn
//! or stale entry is never used.
//!
//! | off | size | field |
//! |----:|-----:|-------|
//! | 0 | 8 | `r + 1` (head sequence word, never 0) |
//! | 8 | 8 | credits granted so far (cumulative receive WRs posted) |
//! | 16 | 8 | `base`: sequence number of the first send this receive takes |
//! | 24 | 4 | `n`: buffers in this (grouped) receive, 1..=8 |
//! | 28 | 4 | reserved |
//! | 32 | 24×8 | per buffer: addr u64, capacity u64, rkey u32, tag i32 |
//! | 224 | 24 | reserved |
//! | 248 | 8 | `r + 1` (tail sequence word) |
//!
//! **Rendezvous completion record** — 8 bytes written by the sender's RDMA_WRITE_WITH_IMM into
//! slot `(r % REC_SLOTS) * MAX_RECVS + i` of the receiver's record ring, right after the data
//! WRITE on the same QP (RC keeps them in order): the bytes actually sent, with bit 63 set when
//! the send was refused because it was larger than the receive buffer (nothing was written).
//!
//! **Immediate data** of that WRITE_WITH_IMM: bits 31..3 = low 29 bits of the receive
//! sequence number `r` (the group the send matched), bits 2..0 = buffer index `i`. At most
//! `MAX_RECV_REQUESTS` (32) receives are outstanding, so 29 bits name the group unambiguously;
//! the receiver checks that `(r, i)` is the buffer its own matching gives the send.

/// Most buffers in one grouped receive (reported as `maxRecvs`).
pub const MAX_RECVS: usize = 8;
/// Bytes of the eager header.
pub const EAGER_HDR_LEN: usize = 32;
/// Bytes of one CTS entry.
pub const CTS_ENTRY_LEN: usize = 256;
/// Record slots per receive comm: at least the receive request limit, so a slot is free again
/// by the time its index comes round.
pub const REC_SLOTS: usize = 32;
/// Bit 63 of a record: the send was larger than the receive buffer and was refused.
pub const REC_TOO_BIG: u64 = 1 << 63;
/// Bit 62 of a record: the sender waited for a credit since its last credit-consuming send
/// (the receiver grows its queue); not part of the size.
pub const REC_STARVED: u64 = 1 << 62;

/// The registered buffers of a send comm, in bytes, in the order the comm allocates them:
/// eager-header staging (one header per send slot), record staging (one 8-byte record per send
/// slot), the CTS ring the receiver writes, and the credit word it writes.
pub const SEND_COMM_BUFFERS: [usize; 4] = [
    super::MAX_SEND_REQUESTS * EAGER_HDR_LEN,
    super::MAX_SEND_REQUESTS * 8,
    super::CTS_RING_ENTRIES * CTS_ENTRY_LEN,
    8,
];

/// Bytes of one bounce buffer, header included: the distance between two in a receive comm's
/// registration or a pool slab.
#[must_use]
pub const fn bounce_stride(eager_buf_size: u64) -> u64 {
    EAGER_HDR_LEN as u64 + eager_buf_size
}

/// The most a receive comm registers, in bytes, in allocation order: its bounce buffers at the
/// full depth `rq_depth × (EAGER_HDR_LEN + eager_buf_size)` (its own and those it may grow by
/// from the pool), the record ring the sender writes (`REC_SLOTS × MAX_RECVS` records of 8
/// bytes), and the control staging (`CTRL_STAGE_SLOTS` CTS entries).
#[must_use]
pub fn recv_comm_buffers(rq_depth: u32, eager_buf_size: u32) -> [u64; 3] {
    [
        u64::from(rq_depth) * bounce_stride(eager_buf_size.into()),
        (REC_SLOTS * MAX_RECVS * 8) as u64,
        (super::CTRL_STAGE_SLOTS * CTS_ENTRY_LEN) as u64,
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtsBuf {
    /// Receiver virtual address.
    pub addr: u64,
    /// Capacity in bytes.
    pub cap: u64,
    /// Remote key for RDMA writes into it.
    pub rkey: u32,
    /// Tag the receive expects for this buffer.
    pub tag: i32,
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
    /// The buffers.
    pub bufs: [CtsBuf; MAX_RECVS],
}

impl CtsEntry {
    /// Serializes the entry.
    pub fn encode(&self) -> [u8; CTS_ENTRY_LEN] {
        let mut b = [0u8; CTS_ENTRY_LEN];
        let seq = self.r.wrapping_add(1);
        b[0..8].copy_from_slice(&seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.credits.to_le_bytes());
        b[16..24].copy_from_slice(&self.base.to_le_bytes());
        b[24..28].copy_from_slice(&self.n.to_le_bytes());
        for (k, buf) in self.bufs.iter().enumerate() {
            let o = 32 + 24 * k;
            b[o..o + 8].copy_from_slice(&buf.addr.to_le_bytes());
            b[o + 8..o + 16].copy_from_slice(&buf.cap.to_le_bytes());
            b[o + 16..o + 20].copy_from_slice(&buf.rkey.to_le_bytes());
            b[o + 20..o + 24].copy_from_slice(&buf.tag.to_le_bytes());
        }
        b[248..256].copy_from_slice(&seq.to_le_bytes());
        b
    }

    /// The head sequence word of a raw entry (`r + 1` once written, 0 before).
    pub fn head_seq(b: &[u8]) -> Option<u64> {
        Some(u64::from_le_bytes(b.get(0..8)?.try_into().ok()?))
    }

    /// Parses an entry that should hold receive `expect_r`. `Ok(None)`: not (fully) written yet.
    /// `Err`: a complete entry that is not the expected one or is malformed.
    pub fn decode(b: &[u8], expect_r: u64) -> Result<Option<CtsEntry>, String> {
        if b.len() < CTS_ENTRY_LEN {
            return Err(format!("CTS entry of {} bytes", b.len()));
        }
        let want = expect_r.wrapping_add(1);
        let head = u64::from_le_bytes(b[0..8].try_into().unwrap_or_default());
        let tail = u64::from_le_bytes(b[248..256].try_into().unwrap_or_default());
        if head != want || tail != want {
            // An older lap's entry (or nothing yet): not ready. Anything else is corrupt.
            let stale = |v: u64| v == 0 || want.wrapping_sub(v) < (1 << 62);
            if stale(head) && stale(tail) {
                return Ok(None);
            }
            if head == want {
                return Ok(None); // tail not landed yet
            }
            return Err(format!(
                "CTS slot holds sequence {head}/{tail}, expected {want}"
            ));
        }
        let n = u32::from_le_bytes(b[24..28].try_into().unwrap_or_default());
        if n == 0 || n as usize > MAX_RECVS {
            return Err(format!(
                "CTS for receive {expect_r} announces {n} buffers (1..=8)"
            ));
        }
        let mut bufs = [CtsBuf::default(); MAX_RECVS];
        for (k, buf) in bufs.iter_mut().enumerate().take(n as usize) {
            let o = 32 + 24 * k;
            *buf = CtsBuf {
                addr: u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default()),
                cap: u64::from_le_bytes(b[o + 8..o + 16].try_into().unwrap_or_default()),
                rkey: u32::from_le_bytes(b[o + 16..o + 20].try_into().unwrap_or_default()),
                tag: i32::from_le_bytes(b[o + 20..o + 24].try_into().unwrap_or_default()),
            };
        }
        Ok(Some(CtsEntry {
            r: expect_r,
            credits: u64::from_le_bytes(b[8..16].try_into().unwrap_or_default()),
            base: u64::from_le_bytes(b[16..24].try_into().unwrap_or_default()),
            n,
            bufs,
        }))
    }
}

/// Packs the immediate of a rendezvous WRITE_WITH_IMM: receive `r` (low 29 bits), buffer `buf_idx`.
pub fn imm_encode(r: u64, buf_idx: usize) -> u32 {
    (((r & 0x1fff_ffff) as u32) << 3) | (buf_idx as u32 & 7)
}

/// Unpacks an immediate into (low 29 bits of `r`, buffer index).
pub fn imm_decode(imm: u32) -> (u32, usize) {
    (imm >> 3, (imm & 7) as usize)
}

/// True when the 29-bit `low` matches sequence number `seq`.
pub fn imm_matches(low: u32, seq: u64) -> bool {
    u64::from(low) == seq & 0x1fff_ffff
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
            rkey: 9,
            tag: 5,
        };
        let e = CtsEntry {
            r: 41,
            credits: 300,
            base: 90,
            n: 2,
            bufs,
        };
        let b = e.encode();
        assert_eq!(CtsEntry::decode(&b, 41), Ok(Some(e)));
        // The previous lap's entry is "not ready", not an error.
        assert_eq!(CtsEntry::decode(&b, 41 + 512), Ok(None));
        assert_eq!(CtsEntry::decode(&[0u8; 256], 0), Ok(None));
        // Head written, tail not yet: not ready.
        let mut torn = b;
        torn[248..256].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(CtsEntry::decode(&torn, 41), Ok(None));
        // A newer entry than expected: the ring was overrun.
        assert!(CtsEntry::decode(&b, 30).is_err());
        let mut badn = b;
        badn[24..28].copy_from_slice(&9u32.to_le_bytes());
        assert!(CtsEntry::decode(&badn, 41).is_err());
    }

    #[test]
    fn cts_sequence_wraps() {
        let e = CtsEntry {
            r: u64::MAX - 1,
            credits: 1,
            base: 0,
            n: 1,
            bufs: [CtsBuf::default(); 8],
        };
        assert_eq!(CtsEntry::decode(&e.encode(), u64::MAX - 1), Ok(Some(e)));
        // Ring slot indices stay consistent across the 2^64 wrap (512 divides 2^64).
        assert_eq!(
            (u64::MAX % 512 + 1) % 512,
            0u64.wrapping_add(u64::MAX).wrapping_add(1) % 512
        );
    }

    #[test]
    fn imm_packs_and_wraps() {
        let imm = imm_encode(0x2000_0005, 7);
        let (low, i) = imm_decode(imm);
        assert_eq!((low, i), (5, 7));
        assert!(imm_matches(low, 0x2000_0005));
        assert!(imm_matches(low, 5));
        assert!(!imm_matches(low, 6));
    }
}
