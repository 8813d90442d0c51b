//! The responder half of the tcp QP: validates each message against the receive queue and the
//! registry, decides where its payload goes, completes receive WRs, and queues ACKs, RNR NAKs
//! and NAKs (the responder errors of the parent module's table).

use std::time::Instant;

use tracing::debug;

use super::{Cause, Closing, TcpQp};
use crate::mem::Region;
use crate::transport::tcp::wire::{Frame, FrameError, NakCode};
use crate::transport::{Wc, WcOpcode, WcStatus};

pub(super) enum RxState {
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
pub(super) enum Sink {
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
pub(super) enum Done {
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
    /// A READ response of ours landed (requester): the READ WR `psn` succeeded.
    Read(u32),
}

/// A data request as the responder sees it.
#[derive(Clone, Copy)]
pub(super) enum Request {
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

pub(super) fn recv_wc(wr_id: u64, status: WcStatus) -> Wc {
    Wc {
        wr_id,
        status,
        opcode: WcOpcode::Recv,
        byte_len: 0,
        imm: None,
    }
}

/// Control frames queued at most before the peer is declared broken.
pub(super) const MAX_CTRL_QUEUE: usize = 64 * 1024;

/// Longest RDMA READ the tcp transport carries (1 MiB): its response is copied out of memory
/// when the request is carried out, so a longer READ WR completes `LocalLength` at the
/// requester without being sent. The engine reads control entries, kilobytes.
pub(super) const READ_MAX: u32 = 1 << 20;

/// Bytes of READ responses queued at most (not yet staged for the socket) before the peer is
/// declared broken: only a peer that asks without ever reading the answers gets there.
pub(super) const READ_QUEUE_MAX: usize = 4 * READ_MAX as usize;

impl TcpQp {
    /// Acknowledges message `psn` as its requester asked: at once (queued), or, flagged
    /// unsignaled, with the next frame we send (the tcp wire's `FLAG_UNSIGNALED`).
    fn ack_done(&mut self, psn: u32) {
        if self.rx_unsignaled {
            self.deferred_ack = Some(psn);
        } else {
            self.push_ack(psn);
        }
    }

    /// Queues an ACK for `psn`, merging it into a queued ACK (ACKs are cumulative).
    pub(super) fn push_ack(&mut self, psn: u32) {
        self.deferred_ack = None; // covered: ACKs are cumulative
        if let Some(Frame::Ack { psn: p }) = self.ctrl.back_mut() {
            *p = psn;
            return;
        }
        self.push_ctrl(Frame::Ack { psn });
    }

    pub(super) fn push_ctrl(&mut self, f: Frame) {
        if self.closing != Closing::Open {
            return; // nothing is sent after our BYE
        }
        if self.ctrl.len() >= MAX_CTRL_QUEUE {
            // Only a peer that sends without ever reading our replies gets here.
            return self.protocol_error(format!(
                "{MAX_CTRL_QUEUE} control frames are queued: the peer does not read"
            ));
        }
        if matches!(
            f,
            Frame::RnrNak { .. } | Frame::Nak { .. } | Frame::ReadResp { .. }
        ) {
            // A NAK, or a READ response, acknowledges every message before the one it names.
            self.deferred_ack = None;
        }
        self.ctrl.push_back(f);
    }

    pub(super) fn bad_frame(&mut self, e: FrameError) {
        self.protocol_error(format!("malformed frame header: {e}"));
    }

    pub(super) fn on_frame(&mut self, f: Frame, now: Instant) {
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
            Frame::ReadReq {
                psn,
                len,
                remote_addr,
                rkey,
            } => self.on_read_req(psn, len, remote_addr, rkey),
            Frame::ReadResp { psn, len } => self.on_read_resp(psn, len),
            Frame::Ack { psn } => self.on_ack(psn),
            Frame::RnrNak { psn, timer } => self.on_rnr_nak(psn, timer, now),
            Frame::Nak { psn, code } => self.on_nak(psn, code),
            Frame::Bye => self.on_bye(),
        }
    }

    /// The peer's goodbye: it closes in order, nothing more comes. The QP fails as at a lost
    /// connection (outstanding sends `RetryExceeded`, receives `WrFlush`: no message after the
    /// BYE will be acknowledged or arrive), with the close marked orderly.
    pub(super) fn on_bye(&mut self) {
        self.peer_orderly = true;
        self.connection_lost("the peer closed its QP in order (goodbye)".into());
    }

    /// Responder: a data frame header. Decides where its payload goes.
    pub(super) fn on_request(&mut self, psn: u32, len: u32, req: Request) {
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

    /// Responder: an RDMA READ request (no payload follows). It needs no receive WR; the bytes
    /// are read now and go back in a READ response queued with the control frames, so it
    /// precedes every ACK or NAK of a later message. A zero-length READ checks neither rkey
    /// nor address (IB); a bad range NAKs it `Access`, as a bad WRITE.
    pub(super) fn on_read_req(&mut self, psn: u32, len: u32, remote_addr: u64, rkey: u32) {
        if psn != self.rcv_nxt {
            if self.rnr_nak_outstanding {
                return; // after the message we refused: it comes again with the retransmission
            }
            return self.protocol_error(format!(
                "READ request with psn {psn:#x} while expecting {:#x}",
                self.rcv_nxt
            ));
        }
        if len > READ_MAX {
            return self.refuse(
                psn,
                NakCode::InvalidRequest,
                format!("RDMA READ of {len} bytes exceeds the tcp transport's {READ_MAX}"),
            );
        }
        self.rnr_nak_outstanding = false;
        self.rcv_nxt = psn.wrapping_add(1);
        // What this QP's earlier WRITEs stored before what this READ loads, as a NIC's
        // responder orders them: a store-load order, which only a full fence gives (the pulled
        // clear-to-send's wake word, then its READ of the mirror, docs/protocol.md).
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        // The last response's vector when kept (small READs: a CTS mirror's entries).
        let mut bytes = self.spare_read.take().unwrap_or_default();
        bytes.clear();
        if len > 0 {
            let read = self.registry.resolve(rkey, remote_addr, len).and_then(|r| {
                self.registry
                    .while_registered(rkey, || r.append_to(0, r.len(), &mut bytes))
            });
            if !matches!(read, Some(Ok(()))) {
                return self.refuse(
                    psn,
                    NakCode::Access,
                    format!(
                        "RDMA READ of {len} bytes at {remote_addr:#x} with rkey {rkey:#x} is \
                         outside every registered region"
                    ),
                );
            }
        }
        if self.read_queued + bytes.len() > READ_QUEUE_MAX {
            return self.protocol_error(format!(
                "{} bytes of READ responses are queued: the peer does not read",
                self.read_queued
            ));
        }
        self.push_ctrl(Frame::ReadResp { psn, len });
        // Queued unless nothing more is sent (after our BYE, or the queue overflowed): the
        // bytes go with the frame, in the same order.
        if matches!(self.ctrl.back(), Some(Frame::ReadResp { psn: p, .. }) if *p == psn) {
            self.read_queued += bytes.len();
            self.read_payloads.push_back(bytes);
        }
    }

    pub(super) fn expect_payload(&mut self, remaining: usize, sink: Sink, done: Done) {
        if matches!(self.rx, RxState::Drain) {
            return; // the QP failed while handling this header
        }
        self.rx = RxState::Payload {
            remaining,
            sink,
            done,
        };
    }

    pub(super) fn discard(&mut self, n: usize) {
        self.expect_payload(n, Sink::Discard, Done::Nothing);
    }

    /// A payload arrived completely.
    pub(super) fn finish(&mut self, done: Done) {
        match done {
            Done::Nothing => {}
            Done::Ack(psn) => self.ack_done(psn),
            Done::Recv { wr_id, psn, len } => {
                self.cq.push_back(Wc {
                    wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::Recv,
                    byte_len: len,
                    imm: None,
                });
                self.ack_done(psn);
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
                self.ack_done(psn);
            }
            Done::Read(psn) => self.read_landed(psn),
        }
    }

    /// The destination of the payload being received was deregistered mid-message (IB: the
    /// MR was invalidated): refuse the message, writing nothing more.
    pub(super) fn sink_gone(&mut self) {
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
            Done::Read(psn) => {
                // Our READ's destination: the WR fails, and the QP with it (as on a NIC).
                if let Some(e) = self.entry_mut(psn) {
                    e.status = Some(WcStatus::LocalProtection);
                }
                self.enter_error(
                    Cause::Local,
                    &format!("the destination of RDMA READ {psn:#x} was deregistered"),
                );
            }
            Done::Nothing => self.enter_error(Cause::Local, "internal: discarded payload"),
        }
    }

    /// Responder error that consumed a receive WR: complete it with `status`, then
    /// [`Self::refuse`].
    pub(super) fn refuse_recv(
        &mut self,
        wr_id: u64,
        status: WcStatus,
        psn: u32,
        code: NakCode,
        why: String,
    ) {
        self.cq.push_back(recv_wc(wr_id, status));
        self.refuse(psn, code, why);
    }

    /// Responder error: NAK message `psn` and enter the error state (as rxe does for class
    /// A/C errors), dropping its payload.
    pub(super) fn refuse(&mut self, psn: u32, code: NakCode, why: String) {
        self.push_ctrl(Frame::Nak { psn, code });
        self.enter_error(Cause::Local, &format!("refused message {psn:#x}: {why}"));
    }
}
