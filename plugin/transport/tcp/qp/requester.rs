//! The requester half of the tcp QP: send WRs in posting order, their PSNs, ACK/NAK/RNR NAK
//! handling (go-back-N after the RNR timer), and in-order completion. Time is passed in: the
//! RNR timer is compared with the caller's `now`, never with a clock read here.

use std::time::Instant;

use tracing::{debug, warn};

use super::io::{Staged, TxPayload, INLINE_MAX, SPARE_INLINE_MAX};
use super::responder::{Done, Sink, READ_MAX};
use super::{Cause, Closing, QpState, TcpQp};
use crate::transport::tcp::wire::{self, Frame, NakCode, MAX_MSG_LEN};
use crate::transport::{SendOpcode, SendWr, Wc, WcOpcode, WcStatus};

pub(super) struct SendEntry {
    pub(super) wr: SendWr,
    pub(super) psn: u32,
    /// Completion status once decided (`Success` when acknowledged).
    pub(super) status: Option<WcStatus>,
    /// RNR NAKs received for this WR.
    pub(super) rnr_naks: u32,
    /// An inline WR's gathered bytes, copied at the post ([`SendWr::inline`]): every
    /// transmission of the message (the first, and each after an RNR NAK) sends this copy,
    /// never the memory the SGEs name. `None` for other WRs (read from registered memory when
    /// staged).
    pub(super) inline: Option<Vec<u8>>,
}

/// `rnr_retry` value meaning "retry forever" (IB spec).
pub(super) const RNR_RETRY_INFINITE: u8 = 7;

impl TcpQp {
    /// Stages the message at `snd_nxt`, if the QP may send it now. A WR whose SGEs do not
    /// resolve fails here (`LocalProtection`, `LocalLength`) and blocks the ones behind it; it
    /// completes once everything before it is acknowledged (completions stay in order). An
    /// inline WR's payload is its copy from the post ([`SendEntry::inline`]).
    pub(super) fn stage_data(&mut self, now: Instant) -> bool {
        if self.state != QpState::Ready || self.closing != Closing::Open {
            return false;
        }
        if let Some(t) = self.rnr_wait_until {
            if now < t {
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
        let read = matches!(entry.wr.opcode, SendOpcode::RdmaRead { .. });
        let (limit, what) = if read {
            (
                READ_MAX,
                "RDMA READ longer than the tcp transport's READ limit",
            )
        } else {
            (MAX_MSG_LEN, "send WR longer than the tcp message limit")
        };
        if total > u64::from(limit) {
            debug!(
                qp_num = self.qp_num,
                wr_id = entry.wr.wr_id,
                total,
                "{what}"
            );
            entry.status = Some(WcStatus::LocalLength);
            return false;
        }
        let len = total as u32; // fits: checked against a limit of at most MAX_MSG_LEN above
        let mut segs = std::mem::take(&mut self.spare_segs);
        segs.clear();
        // An inline WR was gathered at its post: nothing to resolve. A READ sends no payload:
        // its SGE is where the response lands (checked when it comes, as a NIC does).
        let sges = if entry.inline.is_some() || read {
            &[][..]
        } else {
            entry.wr.sges()
        };
        for sge in sges.iter().filter(|s| s.length > 0) {
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
            SendOpcode::RdmaRead { remote_addr, rkey } => Frame::ReadReq {
                psn,
                len,
                remote_addr,
                rkey,
            },
        };
        let start = self.tx_buf.len();
        let mut header = frame.encode();
        // A READ is always answered: no unsignaled flag on its request.
        if !entry.wr.signaled && !read {
            header[29] |= wire::FLAG_UNSIGNALED;
        }
        self.tx_buf.extend_from_slice(&header);
        if let Some(copy) = &entry.inline {
            // Taken at the post (at most `max_inline_data` <= INLINE_MAX bytes, `len` of them).
            self.tx_buf.extend_from_slice(copy);
        } else if read {
            // The request is the header alone.
        } else if len as usize <= INLINE_MAX {
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
        }
        if len as usize <= INLINE_MAX || entry.inline.is_some() || read {
            segs.clear();
            self.spare_segs = segs;
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

    /// Requester: cumulative ACK.
    pub(super) fn on_ack(&mut self, psn: u32) {
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
    pub(super) fn on_rnr_nak(&mut self, psn: u32, timer: u8, now: Instant) {
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
        self.rnr_wait_until = Some(now + delay);
    }

    /// Requester: the responder refused `psn` and is now in the error state.
    pub(super) fn on_nak(&mut self, psn: u32, code: NakCode) {
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
    pub(super) fn nak_in_window(&mut self, psn: u32, what: &str) -> bool {
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

    /// Marks every message before `end` acknowledged. An RDMA READ succeeds only when its
    /// response landed ([`Self::read_landed`]), and that response comes before any ACK or NAK
    /// of a later message: an acknowledgement past a READ still waiting is a protocol error.
    pub(super) fn ack_before(&mut self, end: u32) {
        let Some(base) = self.sq.front().map(|e| e.psn) else {
            self.snd_una = end;
            return;
        };
        while self.snd_una != end {
            let idx = self.snd_una.wrapping_sub(base) as usize;
            if let Some(e) = self.sq.get_mut(idx) {
                if e.status.is_none() {
                    if matches!(e.wr.opcode, SendOpcode::RdmaRead { .. }) {
                        let psn = e.psn;
                        return self.protocol_error(format!(
                            "acknowledgement past RDMA READ {psn:#x}, whose response did not come"
                        ));
                    }
                    e.status = Some(WcStatus::Success);
                }
            }
            self.snd_una = self.snd_una.wrapping_add(1);
        }
    }

    /// Requester: the response to our READ `psn` (`len` bytes follow). It acknowledges every
    /// message before it; its bytes land in the READ's SGE, and the READ succeeds once they
    /// are all in ([`Done::Read`]). A response for anything but an outstanding READ, or of
    /// another length, is a protocol error; a destination outside every registered region
    /// fails the READ `LocalProtection` (its bytes are dropped).
    pub(super) fn on_read_resp(&mut self, psn: u32, len: u32) {
        if !self.nak_in_window(psn, "READ response") {
            return;
        }
        let (read, decided, want, sge) = match self.entry_mut(psn) {
            Some(e) => (
                matches!(e.wr.opcode, SendOpcode::RdmaRead { .. }),
                e.status.is_some(),
                e.wr.byte_len(),
                e.wr.sges().first().copied(),
            ),
            None => return, // unreachable: in the window
        };
        if !read || decided || want != u64::from(len) {
            return self.protocol_error(format!(
                "READ response of {len} bytes for psn {psn:#x}, which is not an RDMA READ of \
                 {len} bytes still waiting"
            ));
        }
        self.ack_before(psn);
        let n = len as usize;
        if n == 0 {
            return self.read_landed(psn);
        }
        let dest = sge.and_then(|g| {
            Some((
                g.lkey,
                self.registry
                    .resolve(g.lkey, g.addr, g.length)?
                    .slice(0, n)
                    .ok()?,
            ))
        });
        match dest {
            Some((key, region)) => self.expect_payload(
                n,
                Sink::Memory {
                    region,
                    key,
                    off: 0,
                },
                Done::Read(psn),
            ),
            None => {
                if let Some(e) = self.entry_mut(psn) {
                    e.status = Some(WcStatus::LocalProtection);
                }
                self.discard(n);
            }
        }
    }

    /// Requester: every byte of READ `psn`'s response is in its destination.
    pub(super) fn read_landed(&mut self, psn: u32) {
        if let Some(e) = self.entry_mut(psn) {
            if e.status.is_none() {
                e.status = Some(WcStatus::Success);
            }
        }
        self.ack_before(psn.wrapping_add(1));
    }

    /// An inline WR's gathered bytes, copied now (its post) from registered memory, each SGE
    /// while its key stays registered; `None` when an SGE lies outside every registered
    /// region (the WR then fails `LocalProtection`, as a WR staged from memory does).
    pub(super) fn copy_inline(&mut self, wr: &SendWr) -> Option<Vec<u8>> {
        // A retired WR's copy when there is one (inline WRs are at most INLINE_MAX bytes).
        let mut copy = self.spare_inline.pop().unwrap_or_default();
        copy.clear();
        for sge in wr.sges().iter().filter(|s| s.length > 0) {
            let copied = self
                .registry
                .resolve(sge.lkey, sge.addr, sge.length)
                .and_then(|r| {
                    self.registry
                        .while_registered(sge.lkey, || r.append_to(0, r.len(), &mut copy))
                });
            if !matches!(copied, Some(Ok(()))) {
                debug!(
                    qp_num = self.qp_num,
                    wr_id = wr.wr_id,
                    lkey = sge.lkey,
                    addr = sge.addr,
                    length = sge.length,
                    "inline SGE outside every registered region"
                );
                return None;
            }
        }
        Some(copy)
    }

    pub(super) fn entry_mut(&mut self, psn: u32) -> Option<&mut SendEntry> {
        let base = self.sq.front()?.psn;
        self.sq.get_mut(psn.wrapping_sub(base) as usize)
    }

    /// Completes decided send WRs from the head of the SQ, in posting order. The WR whose
    /// payload is still being written waits (its memory must stay valid until it completes).
    pub(super) fn retire_sq(&mut self) {
        while let Some(e) = self.sq.front() {
            if self.tx_payload.as_ref().is_some_and(|p| p.psn == e.psn) {
                return;
            }
            let status = match e.status {
                Some(s) => s,
                None if self.state == QpState::Error => WcStatus::WrFlush,
                None => return,
            };
            let read = matches!(e.wr.opcode, SendOpcode::RdmaRead { .. });
            let wc = Wc {
                wr_id: e.wr.wr_id,
                status,
                opcode: match e.wr.opcode {
                    SendOpcode::Send => WcOpcode::Send,
                    SendOpcode::RdmaRead { .. } => WcOpcode::RdmaRead,
                    _ => WcOpcode::RdmaWrite,
                },
                // what a READ brought (`ibv_poll_cq(3)`); at most READ_MAX, so it fits
                byte_len: if read && status == WcStatus::Success {
                    e.wr.byte_len() as u32
                } else {
                    0
                },
                imm: None,
            };
            let signaled = e.wr.signaled;
            if let Some(copy) = self.sq.pop_front().and_then(|e| e.inline) {
                if self.spare_inline.len() < SPARE_INLINE_MAX {
                    self.spare_inline.push(copy);
                }
            }
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
}
