//! The tcp queue pair: an RC requester and responder over one non-blocking stream, driven
//! entirely by `poll_cq` (the protocol is described in the parent module's documentation).
//!
//! This file holds the QP's state, the error state every half shares, and the [`QueuePair`]
//! entry points; the rest is split by role:
//! - [`requester`]: send WRs, PSNs, ACK/NAK/RNR NAK handling, in-order send completions;
//! - [`responder`]: receive WRs, where each message's payload goes, ACKs and NAKs;
//! - [`io`]: the socket: staging and writing frames, reading and cutting the stream into frames.
//!
//! Time is passed in: only the entry points (`post_send`, `poll_cq`, `end_batch`) and the
//! socket reads in [`io`] read the clock (before each phase, and after each read that returned
//! bytes, so a frame is handled at its arrival), and hand `now` down to what decides
//! retransmissions (the RNR timer).
//!
//! Call order inside [`QueuePair::poll_cq`]: flush the out-queue → read and process frames →
//! retire decided send WRs → flush again (ACKs/NAKs just generated, retransmissions whose RNR
//! timer expired) → hand out completions.

mod io;
mod requester;
mod responder;

use std::collections::VecDeque;
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, warn};

use self::io::{Staged, TxPayload, INLINE_MAX, RX_BUF_LEN, TX_BUF_CAP};
use self::requester::SendEntry;
use self::responder::{recv_wc, Done, RxState};
use super::registry::Registry;
use super::wire::{ConnInfo, Frame, NakCode, HEADER_LEN};
use crate::transport::{
    QpConfig, QpCounters, QueuePair, RecvWr, Result, SendWr, TransportError, Wc, WcStatus,
    MAX_SEND_SGE,
};

/// An RC queue pair over a TCP stream.
pub(super) struct TcpQp {
    /// Our 24-bit QP number (logs, `local_info`).
    qp_num: u32,
    /// The peer's QP number, learnt in `establish`.
    remote_qp_num: u32,
    /// PSN of our first send WR (in `local_info`).
    initial_psn: u32,
    cfg: QpConfig,
    /// The device's memory registry (lkeys and rkeys).
    registry: Arc<Registry>,
    state: QpState,
    /// The data channel; `None` until `establish`.
    stream: Option<TcpStream>,
    /// The stream failed or hit EOF: no more I/O on it.
    io_dead: bool,
    /// `post_send` starts transmitting at once (off only in white-box tests that stage by hand).
    doorbell: bool,
    /// Inside a caller's batch (`begin_batch`): `poll_cq` leaves what it generated queued.
    in_batch: bool,
    /// The peer closed the connection or the stream failed (`peer_closed()`).
    peer_closed: bool,

    // Requester.
    /// Posted send WRs not yet completed, in posting order; PSNs are consecutive.
    sq: VecDeque<SendEntry>,
    /// PSN of the next posted send WR.
    next_psn: u32,
    /// Oldest PSN not yet acknowledged.
    snd_una: u32,
    /// PSN of the next message to put on the wire (rewound by RNR NAKs: go-back-N).
    snd_nxt: u32,
    /// No data frame goes out before this instant (RNR timer running).
    rnr_wait_until: Option<Instant>,
    /// Bytes staged for the socket: headers, control frames, small payloads.
    tx_buf: Vec<u8>,
    /// Bytes of `tx_buf` already written.
    tx_off: usize,
    /// The frames in `tx_buf`, in order (to drop unsent data frames on error).
    tx_frames: VecDeque<Staged>,
    /// A large payload written straight from registered memory after `tx_buf` drains.
    tx_payload: Option<TxPayload>,
    /// Control frames (ACK, RNR NAK, NAK) waiting to be staged, in generation order.
    ctrl: VecDeque<Frame>,

    // Responder.
    /// Posted receive WRs, consumed in FIFO order.
    rq: VecDeque<RecvWr>,
    /// PSN of the next message the responder will carry out.
    rcv_nxt: u32,
    /// An RNR NAK for `rcv_nxt` went out: discard messages until it is retransmitted.
    rnr_nak_outstanding: bool,
    /// Staging for incoming headers and small payloads; `rx_buf[rx_start..rx_end]` is unread.
    rx_buf: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    rx: RxState,
    /// When the last read found the socket drained (`None`: it may hold more).
    rx_drained_at: Option<Instant>,
    /// Polls that skipped the read since then ([`io::RX_SKIP_POLLS`]).
    rx_skips: u32,

    /// Completions not yet handed out by `poll_cq`.
    cq: VecDeque<Wc>,
    counters: QpCounters,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QpState {
    /// Created; receives may be posted, sends may not.
    Init,
    /// Established: ready to send and receive.
    Ready,
    /// Failed: every WR completes, with an error status.
    Error,
}

/// Why the QP enters the error state (decides the status of outstanding WRs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    /// A WR failed, or the responder refused a message: the rest flushes.
    Local,
    /// EOF or a socket error: outstanding sends `RetryExceeded`, receives `WrFlush`.
    PeerClosed,
    /// The peer sent a malformed or out-of-protocol frame: the oldest WR of each queue
    /// `RemoteInvalidRequest`, the rest `WrFlush`.
    Protocol,
}

impl TcpQp {
    /// A QP in the INIT state whose first send WR gets `initial_psn`.
    pub(super) fn new(
        qp_num: u32,
        initial_psn: u32,
        cfg: QpConfig,
        registry: Arc<Registry>,
    ) -> TcpQp {
        TcpQp {
            qp_num,
            remote_qp_num: 0,
            initial_psn,
            cfg,
            registry,
            state: QpState::Init,
            stream: None,
            io_dead: false,
            doorbell: true,
            in_batch: false,
            peer_closed: false,
            sq: VecDeque::new(),
            next_psn: initial_psn,
            snd_una: initial_psn,
            snd_nxt: initial_psn,
            rnr_wait_until: None,
            tx_buf: Vec::with_capacity(TX_BUF_CAP + INLINE_MAX + HEADER_LEN),
            tx_off: 0,
            tx_frames: VecDeque::new(),
            tx_payload: None,
            ctrl: VecDeque::new(),
            rq: VecDeque::new(),
            rcv_nxt: 0,
            rnr_nak_outstanding: false,
            rx_buf: vec![0; RX_BUF_LEN],
            rx_start: 0,
            rx_end: 0,
            rx: RxState::Header,
            rx_drained_at: None,
            rx_skips: 0,
            cq: VecDeque::new(),
            counters: QpCounters::default(),
        }
    }

    /// The source of the payload being sent was deregistered before its frame was out (a
    /// use-after-dereg by the application). The frame cannot be finished from memory, and a
    /// short frame would desynchronise the stream: the WR completes `LocalProtection` and the
    /// connection is shut down (the peer sees it close).
    fn source_gone(&mut self, psn: u32) {
        if let Some(e) = self.entry_mut(psn) {
            if e.status.is_none() || e.status == Some(WcStatus::Success) {
                e.status = Some(WcStatus::LocalProtection);
            }
        }
        self.io_dead = true;
        self.tx_buf.clear();
        self.tx_frames.clear();
        self.tx_off = 0;
        self.tx_payload = None;
        self.ctrl.clear();
        if let Some(s) = &self.stream {
            let _ = s.shutdown(Shutdown::Both); // nothing more can be sent on it
        }
        self.enter_error(
            Cause::Local,
            &format!("the memory of message {psn:#x} was deregistered while it was being sent"),
        );
    }

    /// The peer broke the protocol: NAK (best effort, so a conforming peer learns why) and
    /// enter the error state.
    fn protocol_error(&mut self, why: String) {
        if self.state == QpState::Error {
            return;
        }
        self.ctrl.push_back(Frame::Nak {
            psn: self.rcv_nxt,
            code: NakCode::InvalidRequest,
        });
        self.enter_error(Cause::Protocol, &why);
    }

    /// EOF or a socket error: no more I/O; the QP enters the error state.
    fn connection_lost(&mut self, why: String) {
        self.io_dead = true;
        self.peer_closed = true;
        self.tx_buf.clear();
        self.tx_frames.clear();
        self.tx_off = 0;
        self.tx_payload = None;
        self.ctrl.clear();
        self.rx_start = 0;
        self.rx_end = 0;
        if let Some(s) = &self.stream {
            let _ = s.shutdown(Shutdown::Both); // the connection is gone either way
        }
        if self.state == QpState::Error {
            debug!(
                qp_num = self.qp_num,
                "connection lost after the QP failed: {why}"
            );
        }
        self.enter_error(Cause::PeerClosed, &why);
    }

    /// Moves the QP to the error state: the receive queue completes now, send WRs complete in
    /// order from `retire_sq` (with the status decided here), later WRs flush.
    fn enter_error(&mut self, cause: Cause, why: &str) {
        if self.state == QpState::Error {
            return;
        }
        warn!(
            qp_num = self.qp_num,
            remote_qp_num = self.remote_qp_num,
            ?cause,
            "tcp QP enters the error state: {why}"
        );
        self.state = QpState::Error;
        self.rnr_wait_until = None;
        self.drop_unsent_data();

        let mut recv_status = match cause {
            Cause::Protocol => WcStatus::RemoteInvalidRequest,
            Cause::Local | Cause::PeerClosed => WcStatus::WrFlush,
        };
        if let RxState::Payload {
            done: Done::Recv { wr_id, .. } | Done::RecvImm { wr_id, .. },
            ..
        } = std::mem::replace(&mut self.rx, RxState::Drain)
        {
            self.cq.push_back(recv_wc(wr_id, recv_status));
            recv_status = WcStatus::WrFlush;
        }
        for wr in self.rq.drain(..) {
            self.cq.push_back(recv_wc(wr.wr_id, recv_status));
            recv_status = WcStatus::WrFlush;
        }

        let mut first = true;
        for e in self.sq.iter_mut() {
            match e.status {
                Some(WcStatus::Success) => {}
                Some(_) => first = false,
                None => {
                    e.status = Some(match cause {
                        Cause::PeerClosed => WcStatus::RetryExceeded,
                        Cause::Protocol if first => WcStatus::RemoteInvalidRequest,
                        _ => WcStatus::WrFlush,
                    });
                    first = false;
                }
            }
        }
    }
}

impl QueuePair for TcpQp {
    fn local_info(&self) -> Vec<u8> {
        ConnInfo {
            qp_num: self.qp_num,
            initial_psn: self.initial_psn,
        }
        .encode()
    }

    fn establish(&mut self, remote: &[u8], oob: TcpStream) -> Result<()> {
        if self.state != QpState::Init {
            return Err(TransportError::Unavailable(format!(
                "tcp QP {:#08x} is already connected",
                self.qp_num
            )));
        }
        let info = ConnInfo::decode(remote).map_err(TransportError::Protocol)?;
        oob.set_nonblocking(true)
            .map_err(|source| TransportError::Io {
                op: "set_nonblocking on the tcp data stream".into(),
                source,
            })?;
        oob.set_nodelay(true).map_err(|source| TransportError::Io {
            op: "set TCP_NODELAY on the tcp data stream".into(),
            source,
        })?;
        debug!(
            qp_num = self.qp_num,
            remote_qp_num = info.qp_num,
            peer = ?oob.peer_addr().ok(),
            "tcp QP established"
        );
        self.remote_qp_num = info.qp_num;
        self.rcv_nxt = info.initial_psn;
        self.stream = Some(oob);
        self.state = QpState::Ready;
        Ok(())
    }

    /// All or nothing: a batch that does not fit is refused whole. On a QP in the error state
    /// the WRs are accepted and complete with `WrFlush` (as verbs do).
    fn post_send(&mut self, wrs: &[SendWr]) -> Result<()> {
        if self.state == QpState::Init {
            return Err(TransportError::Unavailable(format!(
                "tcp QP {:#08x}: post_send before establish (the QP is not ready to send)",
                self.qp_num
            )));
        }
        if let Some(wr) = wrs.iter().find(|wr| usize::from(wr.num_sge) > MAX_SEND_SGE) {
            return Err(TransportError::Resource(format!(
                "tcp QP {:#08x}: send WR {:#x} has {} SGEs, max_send_sge is {MAX_SEND_SGE}",
                self.qp_num, wr.wr_id, wr.num_sge
            )));
        }
        let cap = self.cfg.max_send_wr as usize;
        if self.sq.len() + wrs.len() > cap {
            return Err(TransportError::Resource(format!(
                "tcp QP {:#08x}: send queue full: {} WRs outstanding + {} posted > max_send_wr {}",
                self.qp_num,
                self.sq.len(),
                wrs.len(),
                cap
            )));
        }
        for wr in wrs {
            self.sq.push_back(SendEntry {
                wr: *wr,
                psn: self.next_psn,
                status: None,
                rnr_naks: 0,
            });
            self.next_psn = self.next_psn.wrapping_add(1);
        }
        // Ring the doorbell: start transmitting now, as a NIC does, instead of waiting for
        // the next poll_cq (a CTS or a send would otherwise sit queued until the caller polls).
        if self.doorbell && self.stream.is_some() && !self.io_dead {
            self.flush_tx(Instant::now());
        }
        Ok(())
    }

    /// All or nothing, like `post_send`. Legal before `establish`; on a QP in the error state
    /// the WRs complete with `WrFlush`.
    fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<()> {
        let cap = self.cfg.max_recv_wr as usize;
        if self.rq.len() + wrs.len() > cap {
            return Err(TransportError::Resource(format!(
                "tcp QP {:#08x}: receive queue full: {} WRs posted + {} new > max_recv_wr {}",
                self.qp_num,
                self.rq.len(),
                wrs.len(),
                cap
            )));
        }
        self.counters.post_recv_calls += 1;
        self.counters.recv_wrs_posted += wrs.len() as u64;
        if self.state == QpState::Error {
            self.cq
                .extend(wrs.iter().map(|wr| recv_wc(wr.wr_id, WcStatus::WrFlush)));
        } else {
            self.rq.extend(wrs.iter().copied());
        }
        Ok(())
    }

    fn poll_cq(&mut self, out: &mut Vec<Wc>, max: usize) -> Result<usize> {
        if self.stream.is_some() && !self.io_dead {
            self.flush_tx(Instant::now());
            // Again: the flush may have written megabytes.
            self.poll_rx(Instant::now());
            self.retire_sq();
            if !self.in_batch {
                self.flush_tx(Instant::now());
            }
        }
        self.retire_sq();
        let n = max.min(self.cq.len());
        out.extend(self.cq.drain(..n));
        Ok(n)
    }

    /// ACKs (and NAKs, retransmissions) `poll_cq` generates wait in the out-queue for the
    /// next `post_send`, whose doorbell writes them with the new frames in one `sendmsg`, or
    /// for [`QueuePair::end_batch`].
    fn begin_batch(&mut self) {
        self.in_batch = true;
    }

    fn end_batch(&mut self) {
        self.in_batch = false;
        if self.stream.is_some() && !self.io_dead {
            self.flush_tx(Instant::now());
        }
    }

    fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    fn counters(&self) -> QpCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    use super::io::STAGE_READ_MAX;
    use super::*;
    use crate::mem::Region;
    use crate::transport::tcp::wire::HEADER_LEN;
    use crate::transport::{SendOpcode, Sge};

    fn established() -> (TcpQp, TcpStream, Region, u32) {
        let registry = Arc::new(Registry::new(1));
        let cfg = QpConfig {
            max_recv_wr: 16,
            max_send_wr: 16,
            min_rnr_timer: 1,
            rnr_retry: 7,
            timeout: 14,
            retry_cnt: 7,
            traffic_class: 0,
            service_level: 0,
            oob_keepalive: None,
        };
        let mut qp = TcpQp::new(1, 100, cfg, Arc::clone(&registry));
        qp.doorbell = false;
        let region = Region::alloc(64 << 10);
        let lkey = registry.insert(region.clone()).expect("register");
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let s = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (peer, _) = l.accept().expect("accept");
        let info = ConnInfo {
            qp_num: 2,
            initial_psn: 7,
        }
        .encode();
        qp.establish(&info, s).expect("establish");
        (qp, peer, region, lkey)
    }

    fn send_of(region: &Region, lkey: u32, len: u32) -> SendWr {
        SendWr {
            wr_id: 1,
            sgl: [
                Sge {
                    addr: region.addr(),
                    length: len,
                    lkey,
                },
                Sge::default(),
            ],
            num_sge: 1,
            opcode: SendOpcode::Send,
            signaled: true,
        }
    }

    fn frames_in(buf: &[u8]) -> Vec<Frame> {
        let mut v = Vec::new();
        let mut off = 0;
        while off + HEADER_LEN <= buf.len() {
            let mut h = [0u8; HEADER_LEN];
            h.copy_from_slice(&buf[off..off + HEADER_LEN]);
            let f = Frame::decode(&h).expect("frame");
            off += HEADER_LEN;
            if let Frame::Send { len, .. } = f {
                off += len as usize;
            }
            v.push(f);
        }
        v
    }

    #[test]
    fn error_keeps_control_frames_and_drops_data_not_begun() {
        let (mut qp, _peer, region, lkey) = established();
        qp.post_send(&[send_of(&region, lkey, 16); 3])
            .expect("post");
        qp.push_ack(6);
        assert!(qp.stage_frames(Instant::now()));
        qp.push_ack(7); // queued behind the data, not staged yet
        assert_eq!(qp.tx_frames.len(), 4);
        assert_eq!(qp.tx_buf.len(), 32 + 3 * 48);
        qp.enter_error(Cause::Local, "test");
        assert_eq!(frames_in(&qp.tx_buf), [Frame::Ack { psn: 6 }]);
        assert_eq!(qp.tx_off, 0);
        assert_eq!(qp.tx_frames.len(), 1);
        assert!(
            qp.stage_frames(Instant::now()),
            "the queued ACK still goes out"
        );
        assert_eq!(
            frames_in(&qp.tx_buf),
            [Frame::Ack { psn: 6 }, Frame::Ack { psn: 7 }]
        );
    }

    #[test]
    fn error_finishes_the_frame_being_written() {
        let (mut qp, _peer, region, lkey) = established();
        qp.post_send(&[send_of(&region, lkey, 16); 3])
            .expect("post");
        assert!(qp.stage_frames(Instant::now()));
        let first_end = 48;
        qp.tx_off = 40; // 8 bytes of the first frame still to write
        let rest = qp.tx_buf[40..first_end].to_vec();
        qp.enter_error(Cause::Local, "test");
        assert_eq!(qp.tx_buf, rest);
        assert_eq!(qp.tx_frames.len(), 1);
    }

    #[test]
    fn error_drops_a_large_payload_whose_header_is_not_out() {
        let (mut qp, _peer, region, lkey) = established();
        qp.post_send(&[send_of(&region, lkey, 32 << 10)])
            .expect("post");
        assert!(qp.stage_frames(Instant::now()));
        assert!(qp.tx_payload.is_some());
        qp.enter_error(Cause::Local, "test");
        assert!(qp.tx_buf.is_empty());
        assert!(qp.tx_payload.is_none());
        // No payload in flight: the WR flushes at once.
        qp.retire_sq();
        assert_eq!(qp.cq.len(), 1);
    }

    #[test]
    fn error_keeps_a_large_payload_whose_header_is_out() {
        for tx_off in [10, 32] {
            let (mut qp, _peer, region, lkey) = established();
            qp.post_send(&[send_of(&region, lkey, 32 << 10)])
                .expect("post");
            assert!(qp.stage_frames(Instant::now()));
            if tx_off == 32 {
                // Header fully written: tx_buf drained.
                qp.tx_buf.clear();
                qp.tx_frames.clear();
                qp.tx_off = 0;
            } else {
                qp.tx_off = tx_off;
            }
            qp.enter_error(Cause::Local, "test");
            assert_eq!(qp.tx_buf.len(), 32 - tx_off.min(32));
            assert!(qp.tx_payload.is_some(), "tx_off {tx_off}");
            qp.retire_sq();
            assert!(qp.cq.is_empty(), "the WR waits for its payload");
        }
    }

    #[test]
    fn a_large_payload_mostly_bypasses_the_staging_buffer() {
        let (mut qp, mut peer, region, key) = established();
        let len = 48 << 10;
        let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut bytes = Frame::Write {
            psn: 7,
            len: len as u32,
            remote_addr: region.addr(),
            rkey: key,
        }
        .encode()
        .to_vec();
        bytes.extend_from_slice(&payload);
        peer.write_all(&bytes).expect("peer write");
        // The header comes with a bounded staged read (so little of the payload is copied
        // twice), the rest of the payload straight into the region.
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while qp.rcv_nxt != 8 && Instant::now() < deadline {
            qp.read_rx(Instant::now());
            assert!(
                qp.rx_end <= STAGE_READ_MAX,
                "a staged read took {} bytes",
                qp.rx_end
            );
        }
        assert_eq!(qp.rcv_nxt, 8, "the WRITE was not carried out");
        assert!(matches!(qp.rx, RxState::Header));
        let mut got = vec![0u8; len];
        region.read(0, &mut got).expect("read region");
        assert!(got == payload, "payload differs");
        assert_eq!(qp.ctrl.back(), Some(&Frame::Ack { psn: 7 }));
    }

    /// Reads `n` frames (with their payloads) from the raw peer, waiting at most 10 s.
    fn read_frames(peer: &mut TcpStream, n: usize) -> Vec<(Frame, Vec<u8>)> {
        use std::io::Read;
        peer.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .expect("timeout");
        let mut out = Vec::new();
        while out.len() < n {
            let mut h = [0u8; HEADER_LEN];
            peer.read_exact(&mut h).expect("peer read header");
            let f = Frame::decode(&h).expect("frame");
            let len = match f {
                Frame::Send { len, .. }
                | Frame::Write { len, .. }
                | Frame::WriteImm { len, .. } => len as usize,
                _ => 0,
            };
            let mut payload = vec![0u8; len];
            peer.read_exact(&mut payload).expect("peer read payload");
            out.push((f, payload));
        }
        out
    }

    fn poll_all(qp: &mut TcpQp) -> Vec<Wc> {
        let mut wcs = Vec::new();
        qp.poll_cq(&mut wcs, 64).expect("poll");
        wcs
    }

    /// Many WRs posted in one call, small (copied into the out-buffer) and large (gathered
    /// from registered memory behind their header), reach the peer intact and in order, and
    /// complete only as the peer's (cumulative) ACKs arrive, in posting order.
    #[test]
    fn a_posted_batch_arrives_in_order_and_completes_only_when_acknowledged() {
        let (mut qp, mut peer, region, lkey) = established();
        qp.doorbell = true;
        let pattern: Vec<u8> = (0..region.len()).map(|i| (i * 7 % 253) as u8).collect();
        region.write(0, &pattern).expect("fill");
        let lens: Vec<u32> = (0..12)
            .map(|i| {
                if i % 4 == 3 {
                    20_000 + i * 1000
                } else {
                    8 + i * 3
                }
            })
            .collect();
        let wrs: Vec<SendWr> = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let mut wr = send_of(&region, lkey, len);
                wr.wr_id = i as u64;
                wr.sgl[0].addr = region.addr() + (i as u64) * 512;
                wr
            })
            .collect();
        qp.post_send(&wrs).expect("post");
        // The doorbell wrote what fit; polling finishes the rest (no ACK can have come).
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while (qp.tx_payload.is_some() || !qp.tx_buf.is_empty()) && Instant::now() < deadline {
            assert!(poll_all(&mut qp).is_empty(), "a completion before any ACK");
        }
        let got = read_frames(&mut peer, wrs.len());
        for (i, (f, payload)) in got.iter().enumerate() {
            assert_eq!(
                *f,
                Frame::Send {
                    psn: 100 + i as u32,
                    len: lens[i]
                },
                "frame {i}"
            );
            let at = i * 512;
            assert!(
                payload[..] == pattern[at..at + lens[i] as usize],
                "payload of frame {i} differs"
            );
        }
        assert!(poll_all(&mut qp).is_empty(), "completed without an ACK");
        // A cumulative ACK of the first 5 completes exactly those, in order.
        peer.write_all(&Frame::Ack { psn: 104 }.encode())
            .expect("ack");
        let mut done = Vec::new();
        while done.len() < 5 && Instant::now() < deadline {
            done.extend(poll_all(&mut qp).iter().map(|w| (w.wr_id, w.status)));
        }
        assert_eq!(
            done,
            (0..5).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
        );
        assert!(poll_all(&mut qp).is_empty(), "only the acknowledged ones");
        peer.write_all(&Frame::Ack { psn: 111 }.encode())
            .expect("ack");
        while done.len() < 12 && Instant::now() < deadline {
            done.extend(poll_all(&mut qp).iter().map(|w| (w.wr_id, w.status)));
        }
        assert_eq!(
            done,
            (0..12).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
        );
    }

    /// Inside a batch, the ACK `poll_cq` generates waits for the batch's next `post_send`
    /// and leaves in the same write, ahead of the new frame; a batch that posts nothing
    /// sends it at `end_batch`. Outside a batch it leaves in the same `poll_cq`.
    #[test]
    fn a_batch_holds_acks_until_its_send_or_its_end() {
        let (mut qp, mut peer, region, lkey) = established();
        qp.doorbell = true;
        let write = |psn: u32| {
            let mut b = Frame::Write {
                psn,
                len: 4,
                remote_addr: region.addr(),
                rkey: lkey,
            }
            .encode()
            .to_vec();
            b.extend_from_slice(&[1, 2, 3, 4]);
            b
        };
        let carried = |qp: &mut TcpQp, psn: u32| {
            let deadline = Instant::now() + std::time::Duration::from_secs(10);
            while qp.rcv_nxt != psn.wrapping_add(1) && Instant::now() < deadline {
                poll_all(qp);
            }
            assert_eq!(
                qp.rcv_nxt,
                psn.wrapping_add(1),
                "message {psn} not carried out"
            );
        };
        // 1: held, then sent with the batch's SEND, ACK first.
        qp.begin_batch();
        peer.write_all(&write(7)).expect("peer write");
        carried(&mut qp, 7);
        assert_eq!(
            frames_in(&qp.tx_buf[qp.tx_off..])
                .into_iter()
                .chain(qp.ctrl.iter().copied())
                .collect::<Vec<_>>(),
            [Frame::Ack { psn: 7 }],
            "the ACK waits inside the batch"
        );
        qp.post_send(&[send_of(&region, lkey, 8)]).expect("post");
        qp.end_batch();
        let got = read_frames(&mut peer, 2);
        assert_eq!(got[0].0, Frame::Ack { psn: 7 });
        assert_eq!(got[1].0, Frame::Send { psn: 100, len: 8 });
        // 2: a batch that posts nothing sends the ACK at its end.
        qp.begin_batch();
        peer.write_all(&write(8)).expect("peer write");
        carried(&mut qp, 8);
        qp.end_batch();
        assert_eq!(read_frames(&mut peer, 1)[0].0, Frame::Ack { psn: 8 });
        // 3: no batch: the ACK leaves in the poll that generated it.
        peer.write_all(&write(9)).expect("peer write");
        carried(&mut qp, 9);
        assert!(
            qp.ctrl.is_empty() && qp.tx_buf.is_empty(),
            "nothing left queued"
        );
        assert_eq!(read_frames(&mut peer, 1)[0].0, Frame::Ack { psn: 9 });
    }

    /// After a read that drained the socket, the next [`io::RX_SKIP_POLLS`] polls (within the
    /// window) may skip the read, never more in a row: bytes already there are taken in by
    /// the poll after.
    #[test]
    fn a_drained_socket_is_not_read_on_every_poll_but_data_waits_a_bounded_number_of_polls() {
        let (mut qp, mut peer, region, lkey) = established();
        let now = Instant::now();
        qp.poll_rx(now); // EAGAIN: drained
        assert_eq!(qp.rx_drained_at, Some(now));
        let mut b = Frame::Write {
            psn: 7,
            len: 4,
            remote_addr: region.addr(),
            rkey: lkey,
        }
        .encode()
        .to_vec();
        b.extend_from_slice(&[9; 4]);
        peer.write_all(&b).expect("peer write");
        std::thread::sleep(std::time::Duration::from_millis(50)); // it is in our socket now
        for k in 0..io::RX_SKIP_POLLS {
            qp.poll_rx(now); // within the window: skipped
            assert_eq!(qp.rcv_nxt, 7, "skipped poll {k} read nothing");
        }
        qp.poll_rx(now); // never more skips in a row
        assert_eq!(qp.rcv_nxt, 8, "the next poll took the message in");
        // Past the window a poll always reads.
        peer.write_all(&{
            let mut b = b.clone();
            b[4..8].copy_from_slice(&8u32.to_be_bytes());
            b
        })
        .expect("peer write");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let t = qp.rx_drained_at.expect("drained");
        qp.poll_rx(t + io::RX_SKIP_WINDOW);
        assert_eq!(qp.rcv_nxt, 9, "a poll after the window reads");
    }
}
