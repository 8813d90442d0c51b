//! Frame headers and connection info of the tcp transport: encoding and validating decoding.
//!
//! The byte layouts are specified in the parent module's documentation; the size constants
//! below are asserted at compile time.

use std::fmt;
use std::time::Duration;

use crate::transport::WcStatus;

/// Bytes of every frame header.
pub(super) const HEADER_LEN: usize = 32;

/// First two header bytes, `"VN"`.
pub(super) const MAGIC: u16 = 0x564e;

/// Wire version; a peer with another version is refused in `establish` and per frame.
/// 2: the BYE frame (version 1 had no way to announce an orderly close; a version-1 peer
/// would take a BYE for a malformed frame, so the two are refused at `establish` instead).
/// 3: the unsignaled flag. 4: RDMA READ (the READ request and READ response frames).
pub(super) const VERSION: u8 = 4;

/// Flag bit of a data frame's byte 29 (wire version 3): the requester's WR is unsignaled, so
/// it needs no prompt ACK; the responder acknowledges it with the next frame it sends anyway
/// or the next ACK it owes (ACKs are cumulative). As a NIC's coalesced ACKs: an unsignaled WR
/// leaves the send queue only when a later completion is polled.
pub(super) const FLAG_UNSIGNALED: u8 = 1;

/// Whether the data frame header `h` carries [`FLAG_UNSIGNALED`].
pub(super) fn unsignaled(h: &[u8; HEADER_LEN]) -> bool {
    h[29] & FLAG_UNSIGNALED != 0
}

/// Largest payload of one message (1 GiB): longer send WRs complete with
/// [`WcStatus::LocalLength`], and a header announcing more is a protocol violation.
pub(super) const MAX_MSG_LEN: u32 = 1 << 30;

/// Bytes of [`ConnInfo`] on the wire.
pub(super) const CONN_INFO_LEN: usize = 12;

/// First four bytes of [`ConnInfo`].
const CONN_INFO_MAGIC: [u8; 4] = *b"VNTQ";

const _: () = assert!(HEADER_LEN == 32);
const _: () = assert!(CONN_INFO_LEN <= 256);
const _: () = assert!(MAX_MSG_LEN as u64 <= u32::MAX as u64);

/// RNR NAK timer values of the IB spec (table of `min_rnr_timer` encodings), in microseconds,
/// indexed by the 5-bit code.
const RNR_TIMER_US: [u64; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// The delay an IB-encoded RNR timer code stands for (only the low 5 bits count).
pub(super) fn rnr_timer(code: u8) -> Duration {
    Duration::from_micros(RNR_TIMER_US[usize::from(code & 0x1f)])
}

/// Why a responder refused a message (the `syndrome` byte of a NAK frame).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NakCode {
    /// Bad rkey or bounds of an RDMA write: the requester completes `RemoteAccess`.
    Access = 1,
    /// Malformed request or a SEND longer than the receive buffer: `RemoteInvalidRequest`.
    InvalidRequest = 2,
    /// The responder could not carry the request out (e.g. its receive WR had a bad lkey):
    /// `RemoteOperation`.
    Operation = 3,
}

impl NakCode {
    /// The completion status the requester reports for this NAK.
    pub(super) fn status(self) -> WcStatus {
        match self {
            NakCode::Access => WcStatus::RemoteAccess,
            NakCode::InvalidRequest => WcStatus::RemoteInvalidRequest,
            NakCode::Operation => WcStatus::RemoteOperation,
        }
    }

    fn from_wire(b: u8) -> Option<NakCode> {
        match b {
            1 => Some(NakCode::Access),
            2 => Some(NakCode::InvalidRequest),
            3 => Some(NakCode::Operation),
            _ => None,
        }
    }
}

/// One decoded, validated frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Frame {
    /// Two-sided SEND; `len` payload bytes follow.
    Send {
        /// Message sequence number.
        psn: u32,
        /// Payload bytes that follow the header.
        len: u32,
    },
    /// RDMA WRITE; `len` payload bytes follow.
    Write {
        /// Message sequence number.
        psn: u32,
        /// Payload bytes that follow the header.
        len: u32,
        /// Responder virtual address of the first byte.
        remote_addr: u64,
        /// Responder region's remote key.
        rkey: u32,
    },
    /// RDMA WRITE with immediate; `len` payload bytes follow.
    WriteImm {
        /// Message sequence number.
        psn: u32,
        /// Payload bytes that follow the header.
        len: u32,
        /// Responder virtual address of the first byte.
        remote_addr: u64,
        /// Responder region's remote key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ request (wire version 4): no payload follows; the responder answers with a
    /// [`Frame::ReadResp`] carrying `len` bytes from `[remote_addr, remote_addr + len)`.
    ReadReq {
        /// Message sequence number.
        psn: u32,
        /// Bytes asked for.
        len: u32,
        /// Responder virtual address of the first byte.
        remote_addr: u64,
        /// Responder region's remote key.
        rkey: u32,
    },
    /// RDMA READ response: `len` payload bytes follow, what READ request `psn` asked for. It
    /// also acknowledges every message before `psn` (as an IB READ response does), and is
    /// sent before any later ACK or NAK.
    ReadResp {
        /// The READ request answered.
        psn: u32,
        /// Payload bytes that follow the header.
        len: u32,
    },
    /// Cumulative acknowledgement: every message up to and including `psn` was carried out.
    Ack {
        /// Last message acknowledged.
        psn: u32,
    },
    /// Receiver not ready for message `psn` (every earlier one is acknowledged): retransmit it
    /// and everything after it once the RNR timer `timer` (IB code) has passed.
    RnrNak {
        /// Message refused.
        psn: u32,
        /// The responder's IB-encoded `min_rnr_timer`.
        timer: u8,
    },
    /// Message `psn` failed at the responder (every earlier one is acknowledged); the
    /// responder's QP is in the error state.
    Nak {
        /// Message that failed.
        psn: u32,
        /// Why.
        code: NakCode,
    },
    /// The sender closes its QP in order (its owner called `goodbye`): every frame it will
    /// ever send came before this one, and the connection closes next. All fields are zero.
    Bye,
}

const OP_SEND: u8 = 0x01;
const OP_WRITE: u8 = 0x02;
const OP_WRITE_IMM: u8 = 0x03;
const OP_READ_REQ: u8 = 0x04;
const OP_READ_RESP: u8 = 0x14;
const OP_ACK: u8 = 0x10;
const OP_RNR_NAK: u8 = 0x11;
const OP_NAK: u8 = 0x12;
const OP_BYE: u8 = 0x13;

/// A header that fails validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FrameError {
    /// The first two bytes are not [`MAGIC`].
    Magic(u16),
    /// Unknown wire version.
    Version(u8),
    /// Unknown opcode.
    Opcode(u8),
    /// A data frame longer than [`MAX_MSG_LEN`].
    Length(u32),
    /// A field that must be zero for this opcode is not.
    NonZero(&'static str),
    /// Bad NAK code or RNR timer.
    Syndrome(u8),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Magic(m) => write!(f, "bad frame magic {m:#06x} (expected {MAGIC:#06x})"),
            FrameError::Version(v) => write!(f, "frame version {v} (expected {VERSION})"),
            FrameError::Opcode(o) => write!(f, "unknown frame opcode {o:#04x}"),
            FrameError::Length(l) => {
                write!(f, "frame length {l} exceeds the {MAX_MSG_LEN}-byte limit")
            }
            FrameError::NonZero(field) => write!(f, "frame field `{field}` must be zero"),
            FrameError::Syndrome(s) => write!(f, "bad NAK syndrome {s}"),
        }
    }
}

impl Frame {
    /// The header bytes.
    pub(super) fn encode(&self) -> [u8; HEADER_LEN] {
        let (op, psn, len, addr, rkey, imm, syndrome) = match *self {
            Frame::Send { psn, len } => (OP_SEND, psn, len, 0, 0, 0, 0),
            Frame::Write {
                psn,
                len,
                remote_addr,
                rkey,
            } => (OP_WRITE, psn, len, remote_addr, rkey, 0, 0),
            Frame::WriteImm {
                psn,
                len,
                remote_addr,
                rkey,
                imm,
            } => (OP_WRITE_IMM, psn, len, remote_addr, rkey, imm, 0),
            Frame::ReadReq {
                psn,
                len,
                remote_addr,
                rkey,
            } => (OP_READ_REQ, psn, len, remote_addr, rkey, 0, 0),
            Frame::ReadResp { psn, len } => (OP_READ_RESP, psn, len, 0, 0, 0, 0),
            Frame::Ack { psn } => (OP_ACK, psn, 0, 0, 0, 0, 0),
            Frame::RnrNak { psn, timer } => (OP_RNR_NAK, psn, 0, 0, 0, 0, timer),
            Frame::Nak { psn, code } => (OP_NAK, psn, 0, 0, 0, 0, code as u8),
            Frame::Bye => (OP_BYE, 0, 0, 0, 0, 0, 0),
        };
        let mut h = [0u8; HEADER_LEN];
        h[0..2].copy_from_slice(&MAGIC.to_be_bytes());
        h[2] = VERSION;
        h[3] = op;
        h[4..8].copy_from_slice(&psn.to_be_bytes());
        h[8..12].copy_from_slice(&len.to_be_bytes());
        h[12..16].copy_from_slice(&rkey.to_be_bytes());
        h[16..24].copy_from_slice(&addr.to_be_bytes());
        h[24..28].copy_from_slice(&imm.to_be_bytes());
        h[28] = syndrome;
        h
    }

    /// Parses and validates a header: every field must be legal for the opcode.
    pub(super) fn decode(h: &[u8; HEADER_LEN]) -> Result<Frame, FrameError> {
        let be32 = |o: usize| u32::from_be_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        let magic = u16::from_be_bytes([h[0], h[1]]);
        if magic != MAGIC {
            return Err(FrameError::Magic(magic));
        }
        if h[2] != VERSION {
            return Err(FrameError::Version(h[2]));
        }
        let op = h[3];
        let psn = be32(4);
        let len = be32(8);
        let rkey = be32(12);
        let mut a = [0u8; 8];
        a.copy_from_slice(&h[16..24]);
        let remote_addr = u64::from_be_bytes(a);
        let imm = be32(24);
        let syndrome = h[28];
        let flags = h[29];
        if h[30..32] != [0, 0] || flags & !FLAG_UNSIGNALED != 0 {
            return Err(FrameError::NonZero("reserved"));
        }
        let zero = |v: u64, field: &'static str| {
            if v == 0 {
                Ok(())
            } else {
                Err(FrameError::NonZero(field))
            }
        };
        match op {
            OP_SEND | OP_WRITE | OP_WRITE_IMM | OP_READ_REQ | OP_READ_RESP => {
                if len > MAX_MSG_LEN {
                    return Err(FrameError::Length(len));
                }
                zero(u64::from(syndrome), "syndrome")?;
            }
            OP_ACK | OP_RNR_NAK | OP_NAK | OP_BYE => {
                zero(u64::from(flags), "reserved")?;
                zero(u64::from(len), "length")?;
                zero(u64::from(rkey), "rkey")?;
                zero(remote_addr, "remote_addr")?;
                zero(u64::from(imm), "imm")?;
            }
            _ => return Err(FrameError::Opcode(op)),
        }
        match op {
            OP_SEND => {
                zero(u64::from(rkey), "rkey")?;
                zero(remote_addr, "remote_addr")?;
                zero(u64::from(imm), "imm")?;
                Ok(Frame::Send { psn, len })
            }
            OP_WRITE => {
                zero(u64::from(imm), "imm")?;
                Ok(Frame::Write {
                    psn,
                    len,
                    remote_addr,
                    rkey,
                })
            }
            OP_READ_REQ => {
                zero(u64::from(flags), "reserved")?;
                zero(u64::from(imm), "imm")?;
                Ok(Frame::ReadReq {
                    psn,
                    len,
                    remote_addr,
                    rkey,
                })
            }
            OP_READ_RESP => {
                zero(u64::from(flags), "reserved")?;
                zero(u64::from(rkey), "rkey")?;
                zero(remote_addr, "remote_addr")?;
                zero(u64::from(imm), "imm")?;
                Ok(Frame::ReadResp { psn, len })
            }
            OP_WRITE_IMM => Ok(Frame::WriteImm {
                psn,
                len,
                remote_addr,
                rkey,
                imm,
            }),
            OP_ACK => {
                zero(u64::from(syndrome), "syndrome")?;
                Ok(Frame::Ack { psn })
            }
            OP_BYE => {
                zero(u64::from(psn), "psn")?;
                zero(u64::from(syndrome), "syndrome")?;
                Ok(Frame::Bye)
            }
            OP_RNR_NAK => {
                if syndrome > 31 {
                    return Err(FrameError::Syndrome(syndrome));
                }
                Ok(Frame::RnrNak {
                    psn,
                    timer: syndrome,
                })
            }
            _ => match NakCode::from_wire(syndrome) {
                Some(code) => Ok(Frame::Nak { psn, code }),
                None => Err(FrameError::Syndrome(syndrome)),
            },
        }
    }
}

/// What a data QP that listens (`listen_data`) adds to its `local_info`, after the
/// [`ConnInfo`]: where its peer connects its own stream, and the random token it presents
/// there first (8 bytes, big-endian), so that a stray connection is not taken for the peer.
/// [`DataEndpoint::LEN`] bytes: family (4 or 6), 16 address bytes (IPv4: the first 4, the
/// rest 0), port (big-endian), token (big-endian).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct DataEndpoint {
    /// Where the data QP listens.
    pub(super) addr: std::net::SocketAddr,
    /// What the connecting side writes first.
    pub(super) token: u64,
}

impl DataEndpoint {
    /// Encoded length.
    pub(super) const LEN: usize = 27;

    /// The [`DataEndpoint::LEN`] bytes.
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::LEN);
        let mut ip = [0u8; 16];
        match self.addr.ip() {
            std::net::IpAddr::V4(a) => {
                v.push(4);
                ip[..4].copy_from_slice(&a.octets());
            }
            std::net::IpAddr::V6(a) => {
                v.push(6);
                ip = a.octets();
            }
        }
        v.extend_from_slice(&ip);
        v.extend_from_slice(&self.addr.port().to_be_bytes());
        v.extend_from_slice(&self.token.to_be_bytes());
        v
    }

    /// Parses the bytes after a data QP's [`ConnInfo`].
    pub(super) fn decode(b: &[u8]) -> Result<DataEndpoint, String> {
        if b.len() != Self::LEN {
            return Err(format!(
                "tcp data endpoint is {} bytes, expected {}",
                b.len(),
                Self::LEN
            ));
        }
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&b[1..17]);
        let ip = match b[0] {
            4 => std::net::IpAddr::from([ip[0], ip[1], ip[2], ip[3]]),
            6 => std::net::IpAddr::from(ip),
            f => {
                return Err(format!(
                    "tcp data endpoint has address family {f}, not 4 or 6"
                ))
            }
        };
        let port = u16::from_be_bytes([b[17], b[18]]);
        if port == 0 {
            return Err("tcp data endpoint names port 0".into());
        }
        let token = u64::from_be_bytes(b[19..27].try_into().expect("8 bytes"));
        Ok(DataEndpoint {
            addr: std::net::SocketAddr::new(ip, port),
            token,
        })
    }
}

/// What `local_info` carries: enough to check that both ends speak this protocol, plus the
/// first message sequence number of the sender (verbs: `sq_psn`, learnt by the peer as its
/// `rq_psn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ConnInfo {
    /// 24-bit QP number (for logs and checks only).
    pub(super) qp_num: u32,
    /// Sequence number of the first message this QP will send.
    pub(super) initial_psn: u32,
}

impl ConnInfo {
    /// The [`CONN_INFO_LEN`] bytes of `local_info`.
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(CONN_INFO_LEN);
        v.extend_from_slice(&CONN_INFO_MAGIC);
        v.push(VERSION);
        v.extend_from_slice(&(self.qp_num & 0x00ff_ffff).to_be_bytes()[1..]);
        v.extend_from_slice(&self.initial_psn.to_be_bytes());
        v
    }

    /// Parses a peer's `local_info`.
    pub(super) fn decode(b: &[u8]) -> Result<ConnInfo, String> {
        if b.len() != CONN_INFO_LEN {
            return Err(format!(
                "tcp connection info is {} bytes, expected {CONN_INFO_LEN} (is the peer using \
                 another transport?)",
                b.len()
            ));
        }
        if b[0..4] != CONN_INFO_MAGIC {
            return Err(format!(
                "tcp connection info has magic {:02x?}, expected {:02x?} (is the peer using \
                 another transport?)",
                &b[0..4],
                CONN_INFO_MAGIC
            ));
        }
        if b[4] != VERSION {
            return Err(format!(
                "tcp wire version {} of the peer is not {VERSION} (mixed plugin versions?)",
                b[4]
            ));
        }
        let qp_num = u32::from_be_bytes([0, b[5], b[6], b[7]]);
        if qp_num == 0 {
            return Err("tcp connection info names QP number 0".to_string());
        }
        Ok(ConnInfo {
            qp_num,
            initial_psn: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
        })
    }
}
