//! Socket I/O of the tcp QP: staging frames into one buffer and writing it (and large
//! payloads straight from registered memory) without blocking; reading the stream into a
//! staging buffer (or straight into a large payload's destination) and cutting it into frames
//! for the requester and the responder. No protocol decisions are made here.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::time::Instant;

use super::responder::{RxState, Sink};
use super::TcpQp;
use crate::mem::Region;
use crate::transport::tcp::wire::{Frame, HEADER_LEN};

/// A frame in `tx_buf`: where it ends, and whether it carries a message (not ACK/NAK).
#[derive(Clone, Copy)]
pub(super) struct Staged {
    pub(super) end: usize,
    pub(super) data: bool,
}

/// A payload being written from registered memory; `segs` are exactly the gathered ranges.
pub(super) struct TxPayload {
    /// The message it belongs to: that WR must not complete while this is in flight.
    pub(super) psn: u32,
    /// Each gathered range with the key that registers it.
    pub(super) segs: Vec<(u32, Region)>,
    pub(super) seg: usize,
    pub(super) off: usize,
}

/// Outcome of one socket write attempt.
pub(super) enum TxStep {
    /// Nothing is staged.
    Idle,
    Wrote(usize),
    Blocked,
    Failed(String),
    /// The payload's memory was deregistered before its frame was out.
    SourceGone(u32),
}

pub(super) fn classify_write(r: io::Result<usize>) -> TxStep {
    match r {
        Ok(0) => TxStep::Failed("write: the socket accepted no bytes".into()),
        Ok(n) => TxStep::Wrote(n),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => TxStep::Blocked,
        Err(e) if e.kind() == io::ErrorKind::Interrupted => TxStep::Wrote(0),
        Err(e) => TxStep::Failed(format!("write: {e}")),
    }
}

/// `tx_buf` is refilled once drained; staging stops when it holds this many bytes.
pub(super) const TX_BUF_CAP: usize = 64 * 1024;

/// Payloads up to this size are copied into `tx_buf` with their header (one write for many
/// small messages); larger ones are written straight from registered memory.
pub(super) const INLINE_MAX: usize = 16 * 1024;

/// Size of the receive staging buffer.
pub(super) const RX_BUF_LEN: usize = 64 * 1024;

/// Payload remainders at least this large are read straight into their destination.
pub(super) const DIRECT_READ_MIN: usize = 16 * 1024;

/// Most bytes one read into the staging buffer asks for while a header or a small payload is
/// expected: whatever of a large payload comes along is copied twice, so this bounds that copy
/// (at most [`DIRECT_READ_MIN`] bytes per large message) while still taking in dozens of
/// control frames per system call.
pub(super) const STAGE_READ_MAX: usize = DIRECT_READ_MIN;

/// Bytes one `poll_cq` writes, and reads, at most (bounds the time of one call).
pub(super) const IO_BUDGET: usize = 16 * 1024 * 1024;

impl TcpQp {
    /// Writes staged bytes until the socket would block, staging more frames as room frees.
    pub(super) fn flush_tx(&mut self, now: Instant) {
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
                    self.read_rx(now);
                    return self.connection_lost(why);
                }
                TxStep::SourceGone(psn) => return self.source_gone(psn),
                TxStep::Idle => {
                    if !self.stage_frames(now) {
                        return;
                    }
                }
            }
        }
    }

    /// One write: the rest of `tx_buf`, else the next piece of `tx_payload`.
    pub(super) fn write_some(&mut self) -> TxStep {
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
    pub(super) fn stage_frames(&mut self, now: Instant) -> bool {
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
            if !self.stage_data(now) {
                break;
            }
            staged = true;
        }
        staged
    }

    /// On entering the error state: drops data frames not yet begun (their WRs flush and
    /// must not run at the peer), keeping control frames and the frame being written (the
    /// stream must stay framed).
    pub(super) fn drop_unsent_data(&mut self) {
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

    /// Reads what the socket has (up to a budget) and processes every complete frame.
    ///
    /// A read that returns fewer bytes than asked for means the socket is drained for now:
    /// the loop stops there instead of paying one more system call for `EAGAIN`. Reads into
    /// the staging buffer ask for at most [`STAGE_READ_MAX`] bytes while a header or a small
    /// payload is expected, so a large payload that follows is read straight into its
    /// destination instead of being copied twice.
    pub(super) fn read_rx(&mut self, now: Instant) {
        let mut budget = IO_BUDGET;
        let mut drained = false;
        loop {
            self.process_rx(now);
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
    pub(super) fn process_rx(&mut self, now: Instant) {
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
                        Ok(f) => self.on_frame(f, now),
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
}
