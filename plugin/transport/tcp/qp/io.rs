//! Socket I/O of the tcp QP: staging frames into one buffer and writing it (and large
//! payloads straight from registered memory) without blocking; reading the stream into a
//! staging buffer (or straight into a large payload's destination) and cutting it into frames
//! for the requester and the responder. No protocol decisions are made here.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use super::responder::{RxState, Sink};
use super::{Closing, TcpQp};
use crate::mem::{self, IoPiece, Region};
use crate::transport::tcp::wire::{self, Frame, HEADER_LEN};
use crate::transport::MAX_SEND_SGE;

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

/// Consecutive polls that may skip the read after a drained one ([`TcpQp::poll_rx`]): 2, so
/// at most two of three polls of a tight loop skip, and bytes wait at most two polls. Each
/// skipped poll costs ~0.1 µs instead of a ~1 µs `recvfrom` that returns `EAGAIN`, so in a
/// loop over many comms (NCCL's proxy) the sweep gets faster by about what the skips delay
/// the detection: measured, 8-byte latency did not grow (docs/performance.md).
pub(super) const RX_SKIP_POLLS: u32 = 2;

/// Polls later than this after a drained read always read ([`TcpQp::poll_rx`]): the bound on
/// what the skips can add for a caller that polls rarely (at most two polls, and never past
/// 1 ms). 1 ms rather than less because a process slowed down (an oversubscribed host, or
/// `strace`, under which polls of one comm come 200-500 µs apart) must still skip; a tight
/// loop (NCCL's proxy: ~1 µs per poll) never comes near it. Measured in docs/performance.md.
pub(super) const RX_SKIP_WINDOW: Duration = Duration::from_millis(1);

/// Bytes one `poll_cq` writes, and reads, at most (bounds the time of one call).
pub(super) const IO_BUDGET: usize = 16 * 1024 * 1024;

/// Inline copies a QP keeps for reuse, at most (a window of small sends in flight).
pub(super) const SPARE_INLINE_MAX: usize = 64;

/// The largest READ response vector a QP keeps for the next READ's bytes: a READ of a
/// receiver's CTS mirror (`engine::wire::MIRROR_LEN`, 2 KiB) fits; a larger one's memory goes
/// back.
const SPARE_READ_MAX: usize = 8 << 10;

impl TcpQp {
    /// The payload was written whole: its ranges' vector is kept for the next WR.
    fn end_payload(&mut self) {
        if let Some(mut p) = self.tx_payload.take() {
            p.segs.clear();
            self.spare_segs = p.segs;
        }
    }

    /// Writes staged bytes until the socket would block, staging more frames as room frees.
    pub(super) fn flush_tx(&mut self, now: Instant) {
        let mut budget = IO_BUDGET;
        while !self.io_dead && !self.yielding() {
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

    /// One gathered write (`sendmsg`): the rest of `tx_buf` and, behind it, what is left of
    /// `tx_payload` (its header is the last frame in `tx_buf`, or out already), so a frame and
    /// its large payload leave in one system call. The payload's keys are held registered for
    /// the call; if one is gone, only `tx_buf` is written and the payload fails on the next
    /// call (`SourceGone`), as when it was written on its own.
    pub(super) fn write_some(&mut self) -> TxStep {
        let Some(stream) = self.stream.as_ref() else {
            return TxStep::Blocked;
        };
        let buffered = self.tx_buf.len().saturating_sub(self.tx_off);
        let mut pieces = [IoPiece::Bytes(&[]); 1 + MAX_SEND_SGE];
        let mut n = 0;
        if buffered > 0 {
            pieces[0] = IoPiece::Bytes(&self.tx_buf[self.tx_off..]);
            n = 1;
        }
        let mut keys = [0u32; MAX_SEND_SGE];
        let mut nkeys = 0;
        let mut psn = None;
        if let Some(p) = &self.tx_payload {
            psn = Some(p.psn);
            for (i, (key, seg)) in p.segs.iter().enumerate().skip(p.seg).take(MAX_SEND_SGE) {
                let off = if i == p.seg { p.off } else { 0 };
                pieces[n] = IoPiece::Region {
                    region: seg,
                    off,
                    len: seg.len().saturating_sub(off),
                };
                n += 1;
                keys[nkeys] = *key;
                nkeys += 1;
            }
        }
        if n == 0 {
            if self.tx_payload.take().is_some() {
                return TxStep::Wrote(0); // every range written: the WR may complete
            }
            return TxStep::Idle;
        }
        let fd = stream.as_fd();
        let r = if nkeys == 0 {
            mem::sendmsg(fd, &pieces[..n])
        } else {
            match self
                .registry
                .while_all_registered(&keys[..nkeys], || mem::sendmsg(fd, &pieces[..n]))
            {
                Some(r) => r,
                None if buffered > 0 => mem::sendmsg(fd, &pieces[..1]),
                None => return TxStep::SourceGone(psn.unwrap_or_default()),
            }
        };
        let step = classify_write(r);
        if let TxStep::Wrote(mut w) = step {
            let t = w.min(buffered);
            self.tx_off += t;
            w -= t;
            if self.tx_off >= self.tx_buf.len() {
                self.tx_buf.clear();
                // A large READ response grew it: give the memory back.
                self.tx_buf.shrink_to(TX_BUF_CAP + INLINE_MAX + HEADER_LEN);
                self.tx_frames.clear();
                self.tx_off = 0;
            }
            if let Some(p) = self.tx_payload.as_mut() {
                while w > 0 {
                    let Some((_, seg)) = p.segs.get(p.seg) else {
                        break;
                    };
                    let t = w.min(seg.len().saturating_sub(p.off));
                    p.off += t;
                    w -= t;
                    if p.off >= seg.len() {
                        p.seg += 1;
                        p.off = 0;
                    }
                }
                if p.seg >= p.segs.len() {
                    self.end_payload();
                }
            }
        }
        step
    }

    /// Moves control frames, then data frames, into `tx_buf` until it is full or a large
    /// payload is pending. Returns whether anything was staged.
    pub(super) fn stage_frames(&mut self, now: Instant) -> bool {
        let mut staged = false;
        if !self.ctrl.is_empty() {
            if let Some(psn) = self.deferred_ack.take() {
                self.push_ack(psn); // merged into a queued ACK, or behind the queued frames
            }
        }
        while self.tx_buf.len() < TX_BUF_CAP
            && self.tx_payload.is_none()
            && self.closing != Closing::ByeStaged
        {
            if let Some(f) = self.ctrl.pop_front() {
                self.tx_buf.extend_from_slice(&f.encode());
                if let Frame::ReadResp { .. } = f {
                    // Its bytes, read when the request was carried out.
                    let bytes = self.read_payloads.pop_front().unwrap_or_default();
                    self.read_queued -= bytes.len();
                    self.tx_buf.extend_from_slice(&bytes);
                    if bytes.capacity() <= SPARE_READ_MAX {
                        self.spare_read = Some(bytes);
                    }
                }
                self.tx_frames.push_back(Staged {
                    end: self.tx_buf.len(),
                    data: false,
                });
                if f == Frame::Bye {
                    self.closing = Closing::ByeStaged; // the last frame this QP sends
                }
                staged = true;
                continue;
            }
            // An ACK owed for unsignaled messages leaves with a data frame that goes anyway:
            // staged ahead of it, taken back if no data frame follows.
            let owed = self.deferred_ack.take().map(|psn| {
                let start = self.tx_buf.len();
                self.tx_buf.extend_from_slice(&Frame::Ack { psn }.encode());
                self.tx_frames.push_back(Staged {
                    end: self.tx_buf.len(),
                    data: false,
                });
                (psn, start)
            });
            if !self.stage_data(now) {
                if let Some((psn, start)) = owed {
                    self.tx_buf.truncate(start);
                    self.tx_frames.pop_back();
                    self.deferred_ack = Some(psn);
                }
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

    /// `poll_cq`'s read: [`Self::read_rx`], except right after a read that found the socket
    /// drained. Nothing on our side tells when the peer's next bytes arrive, so every read
    /// of an idle socket is a system call that returns `EAGAIN`; a caller polling in a tight
    /// loop (NCCL's proxy) would pay one per poll. So after a drained read, up to
    /// [`RX_SKIP_POLLS`] following polls skip the read, but only while they come within
    /// [`RX_SKIP_WINDOW`] of that read: data that lands meanwhile waits at most that many polls
    /// of a tight loop, and a caller that polls less often than the window reads on every poll.
    pub(super) fn poll_rx(&mut self, now: Instant) {
        if let Some(t) = self.rx_drained_at {
            if self.rx_skips < RX_SKIP_POLLS && now.saturating_duration_since(t) < RX_SKIP_WINDOW {
                self.rx_skips += 1;
                return;
            }
        }
        self.rx_skips = 0;
        self.read_rx(now);
    }

    /// Reads what the socket has (up to a budget) and processes every complete frame.
    ///
    /// A read that returns fewer bytes than asked for means the socket is drained for now:
    /// the loop stops there instead of paying one more system call for `EAGAIN`. Reads into
    /// the staging buffer ask for at most [`STAGE_READ_MAX`] bytes while a header or a small
    /// payload is expected, so a large payload that follows is read straight into its
    /// destination instead of being copied twice.
    ///
    /// `now` is the time of the first frame; after each read that returned bytes the clock is
    /// read again, so every frame is handled at its arrival (one call may read up to
    /// [`IO_BUDGET`], milliseconds of data: an RNR NAK behind it must start its timer when it
    /// arrives, as on a NIC, not when the call began).
    pub(super) fn read_rx(&mut self, now: Instant) {
        let mut now = now;
        let mut budget = IO_BUDGET;
        let mut drained = false;
        self.rx_drained_at = None;
        loop {
            self.process_rx(now);
            if self.io_dead || budget == 0 {
                return;
            }
            if drained {
                self.rx_drained_at = Some(now);
                return;
            }
            if self.yielding() {
                return; // the owner waits: it reads next (the socket may hold more)
            }
            let Some(stream) = self.stream.as_ref() else {
                return;
            };
            #[cfg(test)]
            {
                self.rx_syscalls += 1;
            }
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
                    let r = match (&**stream).read(&mut self.rx_buf[self.rx_end..end]) {
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
                    now = Instant::now();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.rx_drained_at = Some(now);
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    if e.kind() == io::ErrorKind::TimedOut {
                        // The keepalive expired: the host, not just the process, went silent.
                        self.peer_silent = true;
                    }
                    return self.connection_lost(format!("read: {e}"));
                }
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
                        Ok(f) => {
                            self.rx_unsignaled = wire::unsignaled(&h);
                            self.on_frame(f, now)
                        }
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
