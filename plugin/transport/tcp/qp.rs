//! The tcp queue pair: an RC requester and responder over one non-blocking stream, driven
//! entirely by `poll_cq` (the protocol is described in the parent module's documentation).
//!
//! Call order inside [`QueuePair::poll_cq`]: flush the out-queue → read and process frames →
//! retire decided send WRs → flush again (ACKs/NAKs just generated, retransmissions whose RNR
//! timer expired) → hand out completions.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, warn};

use super::registry::Registry;
use super::wire::{self, ConnInfo, Frame, FrameError, NakCode, HEADER_LEN, MAX_MSG_LEN};
use crate::mem::Region;
use crate::transport::{
    QpConfig, QpCounters, QueuePair, RecvWr, Result, SendOpcode, SendWr, TransportError, Wc,
    WcOpcode, WcStatus, MAX_SEND_SGE,
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

struct SendEntry {
    wr: SendWr,
    psn: u32,
    /// Completion status once decided (`Success` when acknowledged).
    status: Option<WcStatus>,
    /// RNR NAKs received for this WR.
    rnr_naks: u32,
}

/// A frame in `tx_buf`: where it ends, and whether it carries a message (not ACK/NAK).
#[derive(Clone, Copy)]
struct Staged {
    end: usize,
    data: bool,
}

/// A payload being written from registered memory; `segs` are exactly the gathered ranges.
struct TxPayload {
    /// The message it belongs to: that WR must not complete while this is in flight.
    psn: u32,
    /// Each gathered range with the key that registers it.
    segs: Vec<(u32, Region)>,
    seg: usize,
    off: usize,
}

enum RxState {
    /// Expecting a frame header.
    Header,
    /// Expecting `remaining` payload bytes of the current data frame.
    Payload {
        remaining: usize,
        sink: Sink,
        done: Done,
    },
    /// The QP is in the error state: every byte read is dropped (only EOF matters).
    Drain,
}

/// Where payload bytes go.
enum Sink {
    Discard,
    /// The destination range (exactly the payload's length), the key that registers it, and
    /// bytes written so far.
    Memory {
        region: Region,
        key: u32,
        off: usize,
    },
}

/// What to do once a payload is complete.
enum Done {
    Nothing,
    /// RDMA WRITE: acknowledge.
    Ack(u32),
    /// SEND: complete the receive WR, acknowledge.
    Recv {
        wr_id: u64,
        psn: u32,
        len: u32,
    },
    /// RDMA WRITE with immediate: complete the receive WR, acknowledge.
    RecvImm {
        wr_id: u64,
        psn: u32,
        len: u32,
        imm: u32,
    },
}

/// A data request as the responder sees it.
#[derive(Clone, Copy)]
enum Request {
    Send,
    Write {
        remote_addr: u64,
        rkey: u32,
    },
    WriteImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
}

/// Outcome of one socket write attempt.
enum TxStep {
    /// Nothing is staged.
    Idle,
    Wrote(usize),
    Blocked,
    Failed(String),
    /// The payload's memory was deregistered before its frame was out.
    SourceGone(u32),
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
            cq: VecDeque::new(),
            counters: QpCounters::default(),
        }
    }

    // ---------------------------------------------------------------------------------------
    // Output.

    /// Writes staged bytes until the socket would block, staging more frames as room frees.
    fn flush_tx(&mut self) {
        let mut budget = IO_BUDGET;
        while !self.io_dead {
            match self.write_some() {
                TxStep::Wrote(n) => {
                    budget = budget.saturating_sub(n);
                    if budget == 0 {
                        return;
                    }
                }
                TxStep::Blocked => return,
                TxStep::Failed(why) => {
                    // Take in what the peer sent before it went (its last ACKs) first.
                    self.read_rx();
                    return self.connection_lost(why);
                }
                TxStep::SourceGone(psn) => return self.source_gone(psn),
                TxStep::Idle => {
                    if !self.stage_frames() {
                        return;
                    }
                }
            }
        }
    }

    /// One write: the rest of `tx_buf`, else the next piece of `tx_payload`.
    fn write_some(&mut self) -> TxStep {
        let Some(stream) = self.stream.as_mut() else {
            return TxStep::Blocked;
        };
        if self.tx_off < self.tx_buf.len() {
            let step = classify_write(stream.write(&self.tx_buf[self.tx_off..]));
            if let TxStep::Wrote(n) = step {
                self.tx_off += n;
                if self.tx_off >= self.tx_buf.len() {
                    self.tx_buf.clear();
                    self.tx_frames.clear();
                    self.tx_off = 0;
                }
            }
            return step;
        }
        let Some(p) = self.tx_payload.as_mut() else {
            return TxStep::Idle;
        };
        let Some((key, seg)) = p.segs.get(p.seg) else {
            self.tx_payload = None;
            return TxStep::Wrote(0);
        };
        let rest = seg.len().saturating_sub(p.off);
        let step = match self
            .registry
            .while_registered(*key, || seg.send_from(p.off, rest, stream.as_fd()))
        {
            None => return TxStep::SourceGone(p.psn),
            Some(r) => classify_write(r),
        };
        if let TxStep::Wrote(n) = step {
            p.off += n;
            if p.off >= seg.len() {
                p.seg += 1;
                p.off = 0;
                if p.seg >= p.segs.len() {
                    self.tx_payload = None;
                }
            }
        }
        step
    }

    /// Moves control frames, then data frames, into `tx_buf` until it is full or a large
    /// payload is pending. Returns whether anything was staged.
    fn stage_frames(&mut self) -> bool {
        let mut staged = false;
        while self.tx_buf.len() < TX_BUF_CAP && self.tx_payload.is_none() {
            if let Some(f) = self.ctrl.pop_front() {
                self.tx_buf.extend_from_slice(&f.encode());
                self.tx_frames.push_back(Staged {
                    end: self.tx_buf.len(),
                    data: false,
                });
                staged = true;
                continue;
            }
            if !self.stage_data() {
                break;
            }
            staged = true;
        }
        staged
    }

    /// Stages the message at `snd_nxt`, if the QP may send it now. A WR whose SGEs do not
    /// resolve fails here (`LocalProtection`, `LocalLength`) and blocks the ones behind it; it
    /// completes once everything before it is acknowledged (completions stay in order).
    fn stage_data(&mut self) -> bool {
        if self.state != QpState::Ready {
            return false;
        }
        if let Some(t) = self.rnr_wait_until {
            if Instant::now() < t {
                return false;
            }
            self.rnr_wait_until = None;
        }
        let Some(base) = self.sq.front().map(|e| e.psn) else {
            return false;
        };
        let idx = self.snd_nxt.wrapping_sub(base) as usize;
        let Some(entry) = self.sq.get_mut(idx) else {
            return false;
        };
        if entry.status.is_some() {
            return false;
        }
        let total = entry.wr.byte_len();
        if total > u64::from(MAX_MSG_LEN) {
            debug!(
                qp_num = self.qp_num,
                wr_id = entry.wr.wr_id,
                total,
                "send WR longer than the tcp message limit"
            );
            entry.status = Some(WcStatus::LocalLength);
            return false;
        }
        let len = total as u32; // fits: checked against MAX_MSG_LEN above
        let mut segs = Vec::with_capacity(MAX_SEND_SGE);
        for sge in entry.wr.sges().iter().filter(|s| s.length > 0) {
            match self.registry.resolve(sge.lkey, sge.addr, sge.length) {
                Some(r) => segs.push((sge.lkey, r)),
                None => {
                    debug!(
                        qp_num = self.qp_num,
                        wr_id = entry.wr.wr_id,
                        lkey = sge.lkey,
                        addr = sge.addr,
                        length = sge.length,
                        "SGE outside every registered region"
                    );
                    entry.status = Some(WcStatus::LocalProtection);
                    return false;
                }
            }
        }
        let psn = entry.psn;
        let frame = match entry.wr.opcode {
            SendOpcode::Send => Frame::Send { psn, len },
            SendOpcode::RdmaWrite { remote_addr, rkey } => Frame::Write {
                psn,
                len,
                remote_addr,
                rkey,
            },
            SendOpcode::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => Frame::WriteImm {
                psn,
                len,
                remote_addr,
                rkey,
                imm,
            },
        };
        let start = self.tx_buf.len();
        self.tx_buf.extend_from_slice(&frame.encode());
        if len as usize <= INLINE_MAX {
            for (key, r) in &segs {
                let tx_buf = &mut self.tx_buf;
                let copied = self
                    .registry
                    .while_registered(*key, || r.append_to(0, r.len(), tx_buf));
                if !matches!(copied, Some(Ok(()))) {
                    // Deregistered since `resolve` (or, unreachable, out of range): never send
                    // a short frame; drop it and fail the WR instead.
                    self.tx_buf.truncate(start);
                    entry.status = Some(WcStatus::LocalProtection);
                    return false;
                }
            }
        } else {
            self.tx_payload = Some(TxPayload {
                psn,
                segs,
                seg: 0,
                off: 0,
            });
        }
        self.tx_frames.push_back(Staged {
            end: self.tx_buf.len(),
            data: true,
        });
        self.snd_nxt = self.snd_nxt.wrapping_add(1);
        true
    }

    /// On entering the error state: drops data frames not yet begun (their WRs flush and
    /// must not run at the peer), keeping control frames and the frame being written (the
    /// stream must stay framed).
    fn drop_unsent_data(&mut self) {
        let last = self.tx_frames.len().saturating_sub(1);
        let mut kept = Vec::with_capacity(self.tx_buf.len().saturating_sub(self.tx_off));
        let mut frames = VecDeque::new();
        let mut keep_payload = self.tx_frames.is_empty(); // its header is out already
        let mut start = 0;
        for (i, f) in self.tx_frames.iter().enumerate() {
            let (s, e) = (start, f.end.min(self.tx_buf.len()));
            start = e;
            if e <= self.tx_off {
                continue; // written
            }
            let begun = s < self.tx_off;
            if begun || !f.data {
                kept.extend_from_slice(&self.tx_buf[s.max(self.tx_off)..e]);
                frames.push_back(Staged {
                    end: kept.len(),
                    data: f.data,
                });
                keep_payload |= i == last;
            }
        }
        if !keep_payload {
            self.tx_payload = None;
        }
        self.tx_buf = kept;
        self.tx_frames = frames;
        self.tx_off = 0;
    }

    /// Queues an ACK for `psn`, merging it into a queued ACK (ACKs are cumulative).
    fn push_ack(&mut self, psn: u32) {
        if let Some(Frame::Ack { psn: p }) = self.ctrl.back_mut() {
            *p = psn;
            return;
        }
        self.push_ctrl(Frame::Ack { psn });
    }

    fn push_ctrl(&mut self, f: Frame) {
        if self.ctrl.len() >= MAX_CTRL_QUEUE {
            // Only a peer that sends without ever reading our replies gets here.
            return self.protocol_error(format!(
                "{MAX_CTRL_QUEUE} control frames are queued: the peer does not read"
            ));
        }
        self.ctrl.push_back(f);
    }

    // ---------------------------------------------------------------------------------------
    // Input.

    /// Reads what the socket has (up to a budget) and processes every complete frame.
    ///
    /// A read that returns fewer bytes than asked for means the socket is drained for now:
    /// the loop stops there instead of paying one more system call for `EAGAIN`. Reads into
    /// the staging buffer ask for at most [`STAGE_READ_MAX`] bytes while a header or a small
    /// payload is expected, so a large payload that follows is read straight into its
    /// destination instead of being copied twice.
    fn read_rx(&mut self) {
        let mut budget = IO_BUDGET;
        let mut drained = false;
        loop {
            self.process_rx();
            if self.io_dead || budget == 0 || drained {
                return;
            }
            let Some(stream) = self.stream.as_mut() else {
                return;
            };
            let buffered = self.rx_end - self.rx_start;
            let (r, asked) = match &mut self.rx {
                RxState::Payload {
                    remaining,
                    sink: Sink::Memory { region, key, off },
                    ..
                } if buffered == 0 && *remaining >= DIRECT_READ_MIN => {
                    // Large payload: straight from the socket into the destination.
                    let want = (*remaining).min(budget);
                    let r = self
                        .registry
                        .while_registered(*key, || region.recv_into(*off, want, stream.as_fd()));
                    let r = match r {
                        None => {
                            self.sink_gone();
                            continue;
                        }
                        Some(Ok(n)) => {
                            *off += n;
                            *remaining -= n;
                            Ok(n)
                        }
                        Some(Err(e)) => Err(e),
                    };
                    (r, want)
                }
                rx => {
                    if buffered == 0 {
                        self.rx_start = 0;
                        self.rx_end = 0;
                    } else if self.rx_end == self.rx_buf.len() {
                        self.rx_buf.copy_within(self.rx_start..self.rx_end, 0);
                        self.rx_start = 0;
                        self.rx_end = buffered;
                    }
                    // Headers and small payloads: a bounded read, so that little of a large
                    // payload behind them lands here. Discarded bytes: as much as fits.
                    let cap = match rx {
                        RxState::Header
                        | RxState::Payload {
                            sink: Sink::Memory { .. },
                            ..
                        } => STAGE_READ_MAX,
                        _ => usize::MAX,
                    };
                    let end = self.rx_buf.len().min(self.rx_end.saturating_add(cap));
                    let asked = end - self.rx_end;
                    let r = match stream.read(&mut self.rx_buf[self.rx_end..end]) {
                        Ok(n) => {
                            self.rx_end += n;
                            Ok(n)
                        }
                        Err(e) => Err(e),
                    };
                    (r, asked)
                }
            };
            match r {
                Ok(0) => return self.connection_lost("the peer closed the connection".into()),
                Ok(n) => {
                    budget = budget.saturating_sub(n);
                    drained = n < asked;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.connection_lost(format!("read: {e}")),
            }
        }
    }

    /// Consumes buffered bytes: headers, and payload bytes for the current frame.
    fn process_rx(&mut self) {
        loop {
            let buffered = self.rx_end - self.rx_start;
            match &mut self.rx {
                RxState::Drain => {
                    self.rx_start = self.rx_end;
                    return;
                }
                RxState::Header => {
                    if buffered < HEADER_LEN {
                        return;
                    }
                    let mut h = [0u8; HEADER_LEN];
                    h.copy_from_slice(&self.rx_buf[self.rx_start..self.rx_start + HEADER_LEN]);
                    self.rx_start += HEADER_LEN;
                    match Frame::decode(&h) {
                        Ok(f) => self.on_frame(f),
                        Err(e) => self.bad_frame(e),
                    }
                }
                RxState::Payload {
                    remaining, sink, ..
                } => {
                    if *remaining > 0 {
                        let n = (*remaining).min(buffered);
                        if n == 0 {
                            return;
                        }
                        let src = &self.rx_buf[self.rx_start..self.rx_start + n];
                        if let Sink::Memory { region, key, off } = sink {
                            match self
                                .registry
                                .while_registered(*key, || region.write(*off, src))
                            {
                                None => {
                                    self.sink_gone();
                                    continue;
                                }
                                Some(Err(e)) => {
                                    return self
                                        .protocol_error(format!("internal: receive range: {e}"));
                                }
                                Some(Ok(())) => *off += n,
                            }
                        }
                        self.rx_start += n;
                        *remaining -= n;
                        if *remaining > 0 {
                            return;
                        }
                    }
                    if let RxState::Payload { done, .. } =
                        std::mem::replace(&mut self.rx, RxState::Header)
                    {
                        self.finish(done);
                    }
                }
            }
        }
    }

    fn bad_frame(&mut self, e: FrameError) {
        self.protocol_error(format!("malformed frame header: {e}"));
    }

    fn on_frame(&mut self, f: Frame) {
        match f {
            Frame::Send { psn, len } => self.on_request(psn, len, Request::Send),
            Frame::Write {
                psn,
                len,
                remote_addr,
                rkey,
            } => self.on_request(psn, len, Request::Write { remote_addr, rkey }),
            Frame::WriteImm {
                psn,
                len,
                remote_addr,
                rkey,
                imm,
            } => self.on_request(
                psn,
                len,
                Request::WriteImm {
                    remote_addr,
                    rkey,
                    imm,
                },
            ),
            Frame::Ack { psn } => self.on_ack(psn),
            Frame::RnrNak { psn, timer } => self.on_rnr_nak(psn, timer),
            Frame::Nak { psn, code } => self.on_nak(psn, code),
        }
    }

    /// Responder: a data frame header. Decides where its payload goes.
    fn on_request(&mut self, psn: u32, len: u32, req: Request) {
        let n = len as usize; // len <= MAX_MSG_LEN (validated by decode)
        if psn != self.rcv_nxt {
            if self.rnr_nak_outstanding {
                // Sent after the message we refused; it comes again after the retransmission.
                return self.discard(n);
            }
            return self.protocol_error(format!(
                "message with psn {psn:#x} while expecting {:#x}",
                self.rcv_nxt
            ));
        }
        if !matches!(req, Request::Write { .. }) && self.rq.is_empty() {
            self.counters.rnr_naks_sent += 1;
            self.rnr_nak_outstanding = true;
            debug!(qp_num = self.qp_num, psn, "no receive WR posted: RNR NAK");
            self.push_ctrl(Frame::RnrNak {
                psn,
                timer: self.cfg.min_rnr_timer,
            });
            return self.discard(n);
        }
        self.rnr_nak_outstanding = false;
        self.rcv_nxt = psn.wrapping_add(1);
        match req {
            Request::Send => {
                let Some(wr) = self.rq.pop_front() else {
                    return; // unreachable: checked non-empty above
                };
                if len > wr.sge.length {
                    return self.refuse_recv(
                        wr.wr_id,
                        WcStatus::LocalLength,
                        psn,
                        NakCode::InvalidRequest,
                        format!(
                            "a {len}-byte SEND does not fit the {}-byte receive buffer",
                            wr.sge.length
                        ),
                    );
                }
                let done = Done::Recv {
                    wr_id: wr.wr_id,
                    psn,
                    len,
                };
                if len == 0 {
                    return self.expect_payload(0, Sink::Discard, done);
                }
                let dest = self
                    .registry
                    .resolve(wr.sge.lkey, wr.sge.addr, wr.sge.length)
                    .and_then(|r| r.slice(0, n).ok());
                match dest {
                    Some(region) => {
                        let key = wr.sge.lkey;
                        self.expect_payload(
                            n,
                            Sink::Memory {
                                region,
                                key,
                                off: 0,
                            },
                            done,
                        );
                    }
                    None => self.refuse_recv(
                        wr.wr_id,
                        WcStatus::LocalProtection,
                        psn,
                        NakCode::Operation,
                        format!(
                            "receive WR {:#x} has an SGE outside every registered region \
                             (lkey {:#x})",
                            wr.wr_id, wr.sge.lkey
                        ),
                    ),
                }
            }
            Request::Write { remote_addr, rkey } => {
                if len == 0 {
                    // IB: a zero-length RDMA WRITE checks neither rkey nor address.
                    return self.expect_payload(0, Sink::Discard, Done::Ack(psn));
                }
                match self.registry.resolve(rkey, remote_addr, len) {
                    Some(region) => self.expect_payload(
                        n,
                        Sink::Memory {
                            region,
                            key: rkey,
                            off: 0,
                        },
                        Done::Ack(psn),
                    ),
                    None => self.refuse(
                        psn,
                        NakCode::Access,
                        format!(
                            "RDMA WRITE of {len} bytes at {remote_addr:#x} with rkey {rkey:#x} \
                             is outside every registered region"
                        ),
                    ),
                }
            }
            Request::WriteImm {
                remote_addr,
                rkey,
                imm,
            } => {
                let Some(wr) = self.rq.pop_front() else {
                    return; // unreachable: checked non-empty above
                };
                let done = Done::RecvImm {
                    wr_id: wr.wr_id,
                    psn,
                    len,
                    imm,
                };
                if len == 0 {
                    return self.expect_payload(0, Sink::Discard, done);
                }
                match self.registry.resolve(rkey, remote_addr, len) {
                    Some(region) => self.expect_payload(
                        n,
                        Sink::Memory {
                            region,
                            key: rkey,
                            off: 0,
                        },
                        done,
                    ),
                    None => self.refuse_recv(
                        wr.wr_id,
                        WcStatus::LocalProtection,
                        psn,
                        NakCode::Access,
                        format!(
                            "RDMA WRITE with immediate of {len} bytes at {remote_addr:#x} with \
                             rkey {rkey:#x} is outside every registered region"
                        ),
                    ),
                }
            }
        }
    }

    fn expect_payload(&mut self, remaining: usize, sink: Sink, done: Done) {
        if matches!(self.rx, RxState::Drain) {
            return; // the QP failed while handling this header
        }
        self.rx = RxState::Payload {
            remaining,
            sink,
            done,
        };
    }

    fn discard(&mut self, n: usize) {
        self.expect_payload(n, Sink::Discard, Done::Nothing);
    }

    /// A payload arrived completely.
    fn finish(&mut self, done: Done) {
        match done {
            Done::Nothing => {}
            Done::Ack(psn) => self.push_ack(psn),
            Done::Recv { wr_id, psn, len } => {
                self.cq.push_back(Wc {
                    wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::Recv,
                    byte_len: len,
                    imm: None,
                });
                self.push_ack(psn);
            }
            Done::RecvImm {
                wr_id,
                psn,
                len,
                imm,
            } => {
                self.cq.push_back(Wc {
                    wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::RecvRdmaWithImm,
                    byte_len: len,
                    imm: Some(imm),
                });
                self.push_ack(psn);
            }
        }
    }

    /// The destination of the payload being received was deregistered mid-message (IB: the
    /// MR was invalidated): refuse the message, writing nothing more.
    fn sink_gone(&mut self) {
        let RxState::Payload { done, .. } = std::mem::replace(&mut self.rx, RxState::Header) else {
            return;
        };
        let why = "its destination was deregistered while it arrived".to_string();
        match done {
            Done::Recv { wr_id, psn, .. } => self.refuse_recv(
                wr_id,
                WcStatus::LocalProtection,
                psn,
                NakCode::Operation,
                why,
            ),
            Done::RecvImm { wr_id, psn, .. } => {
                self.refuse_recv(wr_id, WcStatus::LocalProtection, psn, NakCode::Access, why)
            }
            Done::Ack(psn) => self.refuse(psn, NakCode::Access, why),
            Done::Nothing => self.enter_error(Cause::Local, "internal: discarded payload"),
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

    /// Responder error that consumed a receive WR: complete it with `status`, then
    /// [`Self::refuse`].
    fn refuse_recv(&mut self, wr_id: u64, status: WcStatus, psn: u32, code: NakCode, why: String) {
        self.cq.push_back(recv_wc(wr_id, status));
        self.refuse(psn, code, why);
    }

    /// Responder error: NAK message `psn` and enter the error state (as rxe does for class
    /// A/C errors), dropping its payload.
    fn refuse(&mut self, psn: u32, code: NakCode, why: String) {
        self.push_ctrl(Frame::Nak { psn, code });
        self.enter_error(Cause::Local, &format!("refused message {psn:#x}: {why}"));
    }

    /// Requester: cumulative ACK.
    fn on_ack(&mut self, psn: u32) {
        let in_flight = self.snd_nxt.wrapping_sub(self.snd_una);
        let newly = psn.wrapping_add(1).wrapping_sub(self.snd_una);
        if newly > in_flight {
            return self.protocol_error(format!(
                "ACK for psn {psn:#x}, but only {:#x}..{:#x} are outstanding",
                self.snd_una, self.snd_nxt
            ));
        }
        self.ack_before(psn.wrapping_add(1));
    }

    /// Requester: RNR NAK; go back to `psn` after the timer, or fail it when out of retries.
    fn on_rnr_nak(&mut self, psn: u32, timer: u8) {
        if !self.nak_in_window(psn, "RNR NAK") {
            return;
        }
        self.ack_before(psn);
        self.counters.rnr_naks_received += 1;
        self.snd_nxt = psn;
        let rnr_retry = self.cfg.rnr_retry;
        let Some(entry) = self.entry_mut(psn) else {
            return; // unreachable: in the window
        };
        entry.rnr_naks += 1;
        let naks = entry.rnr_naks;
        let wr_id = entry.wr.wr_id;
        if rnr_retry != RNR_RETRY_INFINITE && naks > u32::from(rnr_retry) {
            entry.status = Some(WcStatus::RnrRetryExceeded);
            warn!(
                qp_num = self.qp_num,
                remote_qp_num = self.remote_qp_num,
                wr_id,
                rnr_naks = naks,
                rnr_retry = self.cfg.rnr_retry,
                "RNR retries exhausted: the peer never posted a receive WR"
            );
            return;
        }
        let delay = wire::rnr_timer(timer);
        debug!(
            qp_num = self.qp_num,
            psn,
            wr_id,
            ?delay,
            "RNR NAK: retransmitting after the RNR timer"
        );
        self.rnr_wait_until = Some(Instant::now() + delay);
    }

    /// Requester: the responder refused `psn` and is now in the error state.
    fn on_nak(&mut self, psn: u32, code: NakCode) {
        if !self.nak_in_window(psn, "NAK") {
            return;
        }
        self.ack_before(psn);
        self.snd_nxt = psn;
        if let Some(entry) = self.entry_mut(psn) {
            entry.status = Some(code.status());
        }
    }

    /// A NAK must name an outstanding message; anything else is a protocol violation.
    fn nak_in_window(&mut self, psn: u32, what: &str) -> bool {
        let in_flight = self.snd_nxt.wrapping_sub(self.snd_una);
        if psn.wrapping_sub(self.snd_una) < in_flight {
            return true;
        }
        self.protocol_error(format!(
            "{what} for psn {psn:#x}, but only {:#x}..{:#x} are outstanding",
            self.snd_una, self.snd_nxt
        ));
        false
    }

    /// Marks every message before `end` acknowledged.
    fn ack_before(&mut self, end: u32) {
        let Some(base) = self.sq.front().map(|e| e.psn) else {
            self.snd_una = end;
            return;
        };
        while self.snd_una != end {
            let idx = self.snd_una.wrapping_sub(base) as usize;
            if let Some(e) = self.sq.get_mut(idx) {
                if e.status.is_none() {
                    e.status = Some(WcStatus::Success);
                }
            }
            self.snd_una = self.snd_una.wrapping_add(1);
        }
    }

    fn entry_mut(&mut self, psn: u32) -> Option<&mut SendEntry> {
        let base = self.sq.front()?.psn;
        self.sq.get_mut(psn.wrapping_sub(base) as usize)
    }

    // ---------------------------------------------------------------------------------------
    // Completions and errors.

    /// Completes decided send WRs from the head of the SQ, in posting order. The WR whose
    /// payload is still being written waits (its memory must stay valid until it completes).
    fn retire_sq(&mut self) {
        while let Some(e) = self.sq.front() {
            if self.tx_payload.as_ref().is_some_and(|p| p.psn == e.psn) {
                return;
            }
            let status = match e.status {
                Some(s) => s,
                None if self.state == QpState::Error => WcStatus::WrFlush,
                None => return,
            };
            let wc = Wc {
                wr_id: e.wr.wr_id,
                status,
                opcode: match e.wr.opcode {
                    SendOpcode::Send => WcOpcode::Send,
                    _ => WcOpcode::RdmaWrite,
                },
                byte_len: 0,
                imm: None,
            };
            let signaled = e.wr.signaled;
            self.sq.pop_front();
            if status != WcStatus::Success || signaled {
                self.cq.push_back(wc);
            }
            if status != WcStatus::Success {
                self.enter_error(
                    Cause::Local,
                    &format!("send WR {:#x} completed with {status}", wc.wr_id),
                );
            }
        }
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
            self.flush_tx();
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
            self.flush_tx();
            self.read_rx();
            self.retire_sq();
            self.flush_tx();
        }
        self.retire_sq();
        let n = max.min(self.cq.len());
        out.extend(self.cq.drain(..n));
        Ok(n)
    }

    fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    fn counters(&self) -> QpCounters {
        self.counters
    }
}

fn recv_wc(wr_id: u64, status: WcStatus) -> Wc {
    Wc {
        wr_id,
        status,
        opcode: WcOpcode::Recv,
        byte_len: 0,
        imm: None,
    }
}

fn classify_write(r: io::Result<usize>) -> TxStep {
    match r {
        Ok(0) => TxStep::Failed("write: the socket accepted no bytes".into()),
        Ok(n) => TxStep::Wrote(n),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => TxStep::Blocked,
        Err(e) if e.kind() == io::ErrorKind::Interrupted => TxStep::Wrote(0),
        Err(e) => TxStep::Failed(format!("write: {e}")),
    }
}

/// `rnr_retry` value meaning "retry forever" (IB spec).
const RNR_RETRY_INFINITE: u8 = 7;

/// `tx_buf` is refilled once drained; staging stops when it holds this many bytes.
const TX_BUF_CAP: usize = 64 * 1024;

/// Payloads up to this size are copied into `tx_buf` with their header (one write for many
/// small messages); larger ones are written straight from registered memory.
const INLINE_MAX: usize = 16 * 1024;

/// Size of the receive staging buffer.
const RX_BUF_LEN: usize = 64 * 1024;

/// Payload remainders at least this large are read straight into their destination.
const DIRECT_READ_MIN: usize = 16 * 1024;

/// Most bytes one read into the staging buffer asks for while a header or a small payload is
/// expected: whatever of a large payload comes along is copied twice, so this bounds that copy
/// (at most [`DIRECT_READ_MIN`] bytes per large message) while still taking in dozens of
/// control frames per system call.
const STAGE_READ_MAX: usize = DIRECT_READ_MIN;

/// Bytes one `poll_cq` writes, and reads, at most (bounds the time of one call).
const IO_BUDGET: usize = 16 * 1024 * 1024;

/// Control frames queued at most before the peer is declared broken.
const MAX_CTRL_QUEUE: usize = 64 * 1024;

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};

    use super::*;
    use crate::transport::Sge;

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
        assert!(qp.stage_frames());
        qp.push_ack(7); // queued behind the data, not staged yet
        assert_eq!(qp.tx_frames.len(), 4);
        assert_eq!(qp.tx_buf.len(), 32 + 3 * 48);
        qp.enter_error(Cause::Local, "test");
        assert_eq!(frames_in(&qp.tx_buf), [Frame::Ack { psn: 6 }]);
        assert_eq!(qp.tx_off, 0);
        assert_eq!(qp.tx_frames.len(), 1);
        assert!(qp.stage_frames(), "the queued ACK still goes out");
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
        assert!(qp.stage_frames());
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
        assert!(qp.stage_frames());
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
            assert!(qp.stage_frames());
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
            qp.read_rx();
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
}
