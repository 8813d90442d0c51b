//! The handshake over the out-of-band TCP stream: one [`Hello`] each way, then `RDY!` from
//! the connecting side, all with non-blocking framed I/O ([`Wire`]) that never reads past the
//! current frame (the stream goes to the tcp transport right after).

use std::io::{self, Read, Write};
use std::net::TcpStream;

use crate::comm::PeerParams;

const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"VNHE");
/// Wire version of the handshake and the data protocol. 2: a rendezvous immediate names the
/// receive it matched (`engine::wire`), and matching follows the front-group rule. 3: a send
/// whose clear-to-send is known is one WRITE WITH IMM of its payload (size in `byte_len`), the
/// immediate has a record bit and a starved bit, CTS entries announce zero-length receive WRs
/// and the credit word carries where they end. 4: the hello ends with the connection's traffic
/// class and SL, which the receiver adopts. 5: several QPs per connection
/// (`VERBSNET_IB_QPS_PER_CONNECTION`): the hello carries the QP count, the split flag
/// (`VERBSNET_IB_SPLIT_DATA_ON_QPS`) and one QP info per QP; the receiver adopts the sender's
/// count and split and replies with as many QP infos. 6: virtual devices (`makeVDevice`):
/// after the split flag, the sender's device count and the receiver's (from the listen
/// handle; the receiver checks it and echoes both), and CTS entries carry one rkey per
/// receiver device. 7: a receive of one buffer on one device has a 64-byte compact CTS entry
/// (`engine::wire::CTS_COMPACT_LEN`, sequence words flagged `CTS_COMPACT`). 8: the receiver's
/// record region holds the small-send ring behind the record ring (`engine::wire::SMALL_SLOTS`
/// slots), which small direct sends RDMA-write without an immediate. 9: behind the small-send
/// ring, the receiver's record region holds the CTS mirror and the wake word
/// (`engine::wire::MIRROR_AT`, `WAKE_AT`), which the sender RDMA-reads and RDMA-writes (the
/// pulled clear-to-send). A peer of another version is refused at connect time instead of
/// misplacing data.
pub const HELLO_VERSION: u16 = 9;
pub(super) const READY: &[u8; 4] = b"RDY!";
/// Longest QP info of one QP (`QueuePair::local_info`: at most 256 bytes).
const MAX_QP_INFO: usize = 256;
/// Longest hello: the fixed fields and [`MAX_QPS`] QP infos of [`MAX_QP_INFO`] bytes each.
const MAX_HELLO: usize = 256 + MAX_QPS * (2 + MAX_QP_INFO);
/// Most QPs a hello may name: `engine::MAX_QPS_PER_CONNECTION`.
const MAX_QPS: usize = crate::engine::MAX_QPS_PER_CONNECTION;

/// One side's handshake message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Hello {
    pub(super) kind: u8,
    pub(super) role: u8,
    pub(super) nonce: u64,
    /// One QP info per QP of the connection (QP 0 first): `1..=MAX_QPS_PER_CONNECTION` of
    /// them (the QP count is their number).
    pub(super) qp_info: Vec<Vec<u8>>,
    /// Data split over the QPs (`VERBSNET_IB_SPLIT_DATA_ON_QPS`): the sender's, which the
    /// receiver adopts and echoes.
    pub(super) split: bool,
    /// (the sender's devices, the receiver's), each `1..=MAX_DEVS`: QP `q` runs on device
    /// `q % devs` of its side, and the receiver's buffers carry `devs.1` rkeys.
    pub(super) devs: (u8, u8),
    pub(super) p: PeerParams,
    /// The connection's traffic class: the sender's choice (`super::traffic_class_and_sl`),
    /// which the receiver adopts and echoes.
    pub(super) tc: u8,
    /// The connection's SL (0..=15; a hello with more is malformed), as `tc`.
    pub(super) sl: u8,
}

impl Hello {
    pub(super) fn encode(&self) -> Vec<u8> {
        let infos: usize = self.qp_info.iter().map(|i| 2 + i.len()).sum();
        let mut b = Vec::with_capacity(128 + infos);
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
        b.extend_from_slice(&HELLO_VERSION.to_le_bytes());
        b.push(self.kind);
        b.push(self.role);
        b.extend_from_slice(&self.nonce.to_le_bytes());
        // The count as u16 (128 does not fit a signed byte; room to grow), then the split flag.
        b.extend_from_slice(&(self.qp_info.len() as u16).to_le_bytes());
        b.push(u8::from(self.split));
        b.extend_from_slice(&[self.devs.0, self.devs.1]);
        for info in &self.qp_info {
            b.extend_from_slice(&(info.len() as u16).to_le_bytes());
            b.extend_from_slice(info);
        }
        let p = &self.p;
        for v in [
            p.cts_ring.0,
            u64::from(p.cts_ring.1),
            p.credit_word.0,
            u64::from(p.credit_word.1),
            u64::from(p.credits),
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [
            p.first_seq,
            p.rec_ring.0,
            u64::from(p.rec_ring.1),
            p.initial_credits,
            p.eager_buf_size,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&[self.tc, self.sl]);
        let len = (b.len() - 4) as u32;
        b[0..4].copy_from_slice(&len.to_le_bytes());
        b
    }

    /// Parses a hello (after its length prefix). `Err`: why it is not a hello of this
    /// version (the version, a QP count outside `1..=MAX_QPS_PER_CONNECTION`, a QP info over
    /// 256 bytes, an SL over 15, a split flag not 0/1, truncated or trailing bytes).
    fn decode(b: &[u8]) -> Result<Hello, String> {
        let short = || "a truncated handshake message".to_string();
        let mut c = Cursor(b);
        if c.u32().ok_or_else(short)? != HELLO_MAGIC {
            return Err("not a verbsnet hello (bad magic)".into());
        }
        let version = c.u16().ok_or_else(short)?;
        if version != HELLO_VERSION {
            return Err(format!("a hello of version {version}, not {HELLO_VERSION}"));
        }
        let kind = c.u8().ok_or_else(short)?;
        let role = c.u8().ok_or_else(short)?;
        let nonce = c.u64().ok_or_else(short)?;
        let qps = usize::from(c.u16().ok_or_else(short)?);
        if qps == 0 || qps > MAX_QPS {
            return Err(format!(
                "a hello naming {qps} QPs per connection (VERBSNET_IB_QPS_PER_CONNECTION must be \
                 in 1..={MAX_QPS})"
            ));
        }
        let split = match c.u8().ok_or_else(short)? {
            0 => false,
            1 => true,
            f => return Err(format!("a hello with split flag {f} (not 0 or 1)")),
        };
        let devs = (c.u8().ok_or_else(short)?, c.u8().ok_or_else(short)?);
        let max = crate::engine::wire::MAX_DEVS as u8;
        if !(1..=max).contains(&devs.0) || !(1..=max).contains(&devs.1) {
            return Err(format!(
                "a hello naming {} sender and {} receiver devices (1..={max} each)",
                devs.0, devs.1
            ));
        }
        let mut qp_info = Vec::with_capacity(qps);
        for i in 0..qps {
            let n = usize::from(c.u16().ok_or_else(short)?);
            if n > MAX_QP_INFO {
                return Err(format!(
                    "a hello whose QP info {i} is {n} bytes (at most {MAX_QP_INFO})"
                ));
            }
            let info = c.take(n).ok_or_else(|| {
                format!("a hello naming {qps} QPs that carries only {i} QP infos")
            })?;
            qp_info.push(info.to_vec());
        }
        let mut v = [0u64; 10];
        for x in v.iter_mut() {
            *x = c.u64().ok_or_else(short)?;
        }
        let tc = c.u8().ok_or_else(short)?;
        let sl = c.u8().ok_or_else(short)?;
        if sl > 15 {
            return Err(format!("a hello with SL {sl} (at most 15)"));
        }
        if !c.0.is_empty() {
            return Err(format!(
                "a hello with {} bytes after its end (more QP infos than its count of {qps}?)",
                c.0.len()
            ));
        }
        Ok(Hello {
            kind,
            role,
            nonce,
            qp_info,
            split,
            devs,
            p: PeerParams {
                cts_ring: (v[0], v[1] as u32),
                credit_word: (v[2], v[3] as u32),
                credits: v[4] != 0,
                first_seq: v[5],
                rec_ring: (v[6], v[7] as u32),
                initial_credits: v[8],
                eager_buf_size: v[9],
                rkeys: devs.1,
            },
            tc,
            sl,
        })
    }

    /// The QP count (at least 1 in a decoded hello).
    pub(super) fn qps(&self) -> usize {
        self.qp_info.len()
    }
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (h, t) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = t;
        Some(h)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// Non-blocking framed I/O on the handshake stream. Reads never go past the current frame,
/// so the stream can be handed to the tcp transport right after the handshake.
pub(super) struct Wire {
    pub(super) stream: TcpStream,
    pub(super) out: Vec<u8>,
    pub(super) inb: Vec<u8>,
    want: usize,
}

impl Wire {
    pub(super) fn new(stream: TcpStream) -> Wire {
        Wire {
            stream,
            out: Vec::new(),
            inb: Vec::new(),
            want: 0,
        }
    }

    /// Writes queued bytes; true once all are out.
    pub(super) fn flush(&mut self) -> io::Result<bool> {
        while !self.out.is_empty() {
            match self.stream.write(&self.out) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Reads exactly `n` bytes in total across calls; `Some` once complete.
    pub(super) fn read_exact_nb(&mut self, n: usize) -> io::Result<Option<Vec<u8>>> {
        if self.want == 0 {
            self.want = n;
            self.inb.clear();
        }
        while self.inb.len() < self.want {
            let mut buf = [0u8; 512];
            let k = (self.want - self.inb.len()).min(buf.len());
            match self.stream.read(&mut buf[..k]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the connection",
                    ))
                }
                Ok(m) => self.inb.extend_from_slice(&buf[..m]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.want = 0;
        Ok(Some(std::mem::take(&mut self.inb)))
    }
}

/// Reads one length-prefixed hello across calls.
pub(super) struct HelloReader {
    pub(super) len: Option<usize>,
}

/// Why a hello could not be read.
pub(super) enum HelloError {
    /// The stream failed or closed.
    Io(io::Error),
    /// The bytes are not a hello of our version.
    Bad(String),
}

impl std::fmt::Display for HelloError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HelloError::Io(e) => write!(f, "{e}"),
            HelloError::Bad(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for HelloError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // The text is the io error's already.
            HelloError::Io(e) => e.source(),
            HelloError::Bad(_) => None,
        }
    }
}

impl std::fmt::Debug for HelloError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl HelloReader {
    pub(super) fn poll(&mut self, w: &mut Wire) -> Result<Option<Hello>, HelloError> {
        if self.len.is_none() {
            match w.read_exact_nb(4).map_err(HelloError::Io)? {
                None => return Ok(None),
                Some(b) => {
                    let n = u32::from_le_bytes(b[..4].try_into().expect("4 bytes")) as usize;
                    if n == 0 || n > MAX_HELLO {
                        return Err(HelloError::Bad(format!("handshake message of {n} bytes")));
                    }
                    self.len = Some(n);
                }
            }
        }
        let n = self.len.expect("set");
        match w.read_exact_nb(n).map_err(HelloError::Io)? {
            None => Ok(None),
            Some(b) => Hello::decode(&b).map(Some).map_err(|why| {
                HelloError::Bad(format!(
                    "malformed handshake message: {why} (both ranks must run the same verbsnet)"
                ))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(qps: usize) -> Hello {
        Hello {
            kind: 2,
            role: 1,
            nonce: 77,
            qp_info: (0..qps).map(|i| vec![i as u8; 1 + i % 40]).collect(),
            split: true,
            devs: (2, 3),
            p: PeerParams {
                cts_ring: (0x1000, 5),
                credit_word: (0x2000, 6),
                credits: true,
                rec_ring: (0x3000, 7),
                initial_credits: 128,
                eager_buf_size: 8192,
                first_seq: 9,
                rkeys: 3,
            },
            tc: 106,
            sl: 10,
        }
    }

    #[test]
    fn hello_round_trips_and_rejects_truncation() {
        let h = hello(1);
        let b = h.encode();
        assert_eq!(
            u32::from_le_bytes(b[..4].try_into().unwrap()) as usize,
            b.len() - 4
        );
        assert_eq!(Hello::decode(&b[4..]), Ok(h));
        assert_eq!(
            Hello::decode(&b[4..b.len() - 1]),
            Err("a truncated handshake message".into())
        );
        // the SL field is 4 bits: more is not a hello
        let mut bad = b.clone();
        *bad.last_mut().unwrap() = 16;
        assert_eq!(
            Hello::decode(&bad[4..]),
            Err("a hello with SL 16 (at most 15)".into())
        );
        // a version 8 hello (no CTS mirror) is refused by its version
        let mut v8 = b[4..].to_vec();
        v8[4..6].copy_from_slice(&8u16.to_le_bytes());
        assert_eq!(
            Hello::decode(&v8),
            Err("a hello of version 8, not 9".into())
        );
    }

    /// Up to 128 QPs (NCCL IB's `NCCL_IB_MAX_QPS`) of 256-byte infos fit a hello; a count of
    /// 0 or above 128, or a count its infos do not match, is malformed with a clear reason.
    #[test]
    fn hello_carries_up_to_128_qp_infos_and_refuses_bad_counts() {
        for qps in [1, 2, 8, 128] {
            let h = hello(qps);
            let b = h.encode();
            assert_eq!(Hello::decode(&b[4..]).map(|h| h.qps()), Ok(qps));
        }
        let mut big = hello(128);
        big.qp_info = vec![vec![7; MAX_QP_INFO]; 128];
        let b = big.encode();
        assert!(b.len() - 4 <= MAX_HELLO, "{} bytes", b.len());
        assert_eq!(Hello::decode(&b[4..]), Ok(big));

        // the count sits after magic, version, kind, role and nonce
        let count_at = 4 + 4 + 2 + 1 + 1 + 8;
        let with_count = |h: &Hello, n: u16| {
            let mut b = h.encode();
            b[count_at..count_at + 2].copy_from_slice(&n.to_le_bytes());
            b
        };
        let h = hello(2);
        let refused = |b: Vec<u8>| Hello::decode(&b[4..]).unwrap_err();
        assert_eq!(
            refused(with_count(&h, 0)),
            "a hello naming 0 QPs per connection (VERBSNET_IB_QPS_PER_CONNECTION must be in \
             1..=128)"
        );
        assert_eq!(
            refused(with_count(&h, 129)),
            "a hello naming 129 QPs per connection (VERBSNET_IB_QPS_PER_CONNECTION must be in \
             1..=128)"
        );
        // fewer infos than the count says: the parameters are read as infos, and it ends short
        assert!(Hello::decode(&with_count(&h, 3)[4..]).is_err());
        // more infos than the count says: trailing bytes
        assert!(refused(with_count(&h, 1)).contains("after its end"));
        let mut split = h.encode();
        split[count_at + 2] = 2;
        assert_eq!(refused(split), "a hello with split flag 2 (not 0 or 1)");
        // the device counts follow the split flag: 1..=8 each
        for (at, v, want) in [
            (
                3,
                0,
                "a hello naming 0 sender and 3 receiver devices (1..=8 each)",
            ),
            (
                4,
                9,
                "a hello naming 2 sender and 9 receiver devices (1..=8 each)",
            ),
        ] {
            let mut b = h.encode();
            b[count_at + at] = v;
            assert_eq!(refused(b), want);
        }
    }
}
