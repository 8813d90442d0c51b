//! The proxy of the point-to-point modes (`stream`, `latency`): one rank's end of a connection
//! pair with a peer, driven as NCCL's net proxy drives one point-to-point connection
//! (`src/transport/net.cc`: `sendProxyProgress`, `recvProxyProgress`).
//!
//! - Each direction has one registered FIFO of `window` slots (one per step in flight, as
//!   NCCL's proxy gives each step its own buffer), registered once with `regMr`.
//! - A pass makes one step per direction, as NCCL's proxy thread calls each op's progress
//!   once per loop and each makes one step of its connection (`Endpoint::pass`): the
//!   receiving direction posts one receive into the next free slot (receives are posted ahead
//!   up to the window, at most `NCCL_NET_MAX_REQUESTS`, each with the slot's capacity and the
//!   peer's rank as tag) or, when it posted none, tests its oldest receive once; the sending
//!   direction isends one message while the window has room or, when it started none, tests
//!   its oldest send once. A NULL request ("retry later") is retried on a later pass, after
//!   the other direction has made its step.
//! - Completions are tested oldest first; a completed receive frees its slot for the next
//!   `irecv`.
//! - A pass that moved nothing yields (after `--spin` passes spent spinning) and naps, as the
//!   ring proxy does (`crate::coll::Idle`); nothing moving for [`STALL_TIMEOUT`] fails the
//!   rank with the proxy's state.
//!
//! Data: each message starts with an 8-byte stamp (sender rank and sequence number, the low
//! bytes for shorter messages), written into the send slot before `isend` and checked after the
//! receive completes (a message lost, repeated or out of order shows as wrong). In a checked
//! phase ([`Phase::Checked`]) the sender writes the whole message (stamp + a pattern of the
//! sequence number) and the receiver fills its slot with a sentinel before `irecv` and checks
//! every byte. Timed phases touch only the stamp, so the harness's own cost per message stays
//! a few stores and loads.

use std::collections::VecDeque;
use std::time::Instant;

use crate::coll::{check_size, Idle, CONNECT_TIMEOUT, STALL_TIMEOUT};
use crate::plugin::{Fifo, Handle, ListenComm, Net, RecvComm, Request, SendComm};

/// How long [`Endpoint::idle_test_ns`] retries an `irecv` the plugin answers "retry later".
const IDLE_POST_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Errors of the point-to-point proxy.
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Byte value of a receive slot before a checked receive lands in it.
const SENTINEL: u8 = 0x7F;

/// How carefully a phase moves its messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Only the 8-byte stamp is written and checked (warm-up and timed messages).
    Stamped,
    /// Every byte is written by the sender and checked by the receiver.
    Checked,
}

/// Which directions this rank's end has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Directions {
    /// This rank sends to the peer.
    pub send: bool,
    /// This rank receives from the peer.
    pub recv: bool,
}

/// The stamp of message `seq` from rank `sender`: the sender's rank (mod 8) in the low bits, so
/// even a 1-byte message tells the two ranks apart, and never all zero (fresh memory).
pub fn stamp(sender: usize, seq: u64) -> [u8; 8] {
    ((seq.wrapping_add(1) << 3 | (sender as u64 & 7)) ^ ((sender as u64 + 1) << 56)).to_le_bytes()
}

/// Byte `i` (≥ 8) of message `seq` in a checked phase.
pub fn body_byte(seq: u64, i: usize) -> u8 {
    ((i as u64)
        .wrapping_mul(0x9E37_79B9)
        .wrapping_add(seq.wrapping_mul(0x85EB_CA6B))
        >> 13) as u8
}

/// Writes message `seq` of rank `sender` into `buf` (stamp, and with `full` the body).
pub fn fill(buf: &mut [u8], sender: usize, seq: u64, full: bool) {
    let s = stamp(sender, seq);
    let h = buf.len().min(8);
    buf[..h].copy_from_slice(&s[..h]);
    if full {
        for (i, b) in buf.iter_mut().enumerate().skip(8) {
            *b = body_byte(seq, i);
        }
    }
}

/// Whether `buf` holds message `seq` of rank `sender` (the stamp, and with `full` every byte).
pub fn holds(buf: &[u8], sender: usize, seq: u64, full: bool) -> bool {
    let s = stamp(sender, seq);
    let h = buf.len().min(8);
    buf[..h] == s[..h]
        && (!full
            || buf
                .iter()
                .enumerate()
                .skip(8)
                .all(|(i, &b)| b == body_byte(seq, i)))
}

/// The sending direction: a send comm, its FIFO and the sends in flight.
struct Tx<'n> {
    comm: SendComm<'n>,
    fifo: Fifo<'n>,
    inflight: VecDeque<Request<'n>>,
    /// isends the plugin took (the next send's sequence number).
    posted: u64,
    /// Sends tested done.
    done: u64,
    /// isends answered with a NULL request (retried later).
    refused: u64,
}

/// The receiving direction: a receive comm, its FIFO and the receives posted.
struct Rx<'n> {
    comm: RecvComm<'n>,
    fifo: Fifo<'n>,
    posted_q: VecDeque<Request<'n>>,
    /// irecvs the plugin took.
    posted: u64,
    /// Receives tested done (the next expected sequence number).
    done: u64,
    /// Messages whose bytes were not what the peer sent.
    wrong: u64,
}

/// Counters of one rank's end, for the report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndStats {
    /// Messages this rank sent (isends completed).
    pub sent: u64,
    /// Messages this rank received.
    pub received: u64,
    /// Received messages with wrong bytes.
    pub wrong: u64,
    /// isends answered "retry later" (NULL request) and retried.
    pub isend_retries: u64,
}

/// One rank's end of the point-to-point connections with its peer.
pub struct Endpoint<'n> {
    net: &'n Net,
    rank: usize,
    peer: usize,
    window: usize,
    tx: Option<Tx<'n>>,
    rx: Option<Rx<'n>>,
    /// Test hook: damage every received message before it is checked.
    corrupt: bool,
    /// Idle passes spent spinning before yielding (`--spin`).
    spin: u32,
    /// Stop calling the plugin after this many messages received (fault trials).
    stall_after: Option<u64>,
}

impl<'n> Endpoint<'n> {
    /// Connects to `peer_handle` (when `dirs.send`) and accepts the peer on `listen` (when
    /// `dirs.recv`), polling both as NCCL does (neither is assumed to finish in one call),
    /// closes the listen comm, then registers a FIFO of `window` × `slot` bytes per direction.
    ///
    /// # Errors
    /// Plugin errors, a window of 0, or a timeout.
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        net: &'n Net,
        dev: i32,
        rank: usize,
        peer: usize,
        peer_handle: &Handle,
        listen: ListenComm<'n>,
        dirs: Directions,
        window: usize,
        slot: usize,
    ) -> Result<Endpoint<'n>> {
        if window == 0 {
            return Err("a window of 0 messages".into());
        }
        // The plugin may keep connection progress in the handle: keep the same one throughout.
        let mut handle = peer_handle.clone();
        let mut listen = Some(listen);
        let mut send: Option<SendComm<'n>> = None;
        let mut recv: Option<RecvComm<'n>> = None;
        let start = Instant::now();
        while (dirs.send && send.is_none()) || (dirs.recv && recv.is_none()) {
            if dirs.send && send.is_none() {
                send = net.connect(dev, &mut handle)?;
            }
            if dirs.recv && recv.is_none() {
                if let Some(l) = listen.as_mut() {
                    recv = net.accept(l)?;
                }
            }
            if start.elapsed() > CONNECT_TIMEOUT {
                return Err(format!(
                    "rank {rank}: connections with rank {peer} incomplete after \
                     {CONNECT_TIMEOUT:?}: send {}, receive {}",
                    if send.is_some() { "done" } else { "pending" },
                    if recv.is_some() { "done" } else { "pending" },
                )
                .into());
            }
            std::thread::yield_now();
        }
        if let Some(l) = listen.take() {
            net.close_listen(l)?;
        }
        let slot = slot.max(1);
        let tx = match send {
            Some(comm) => Some(Tx {
                fifo: net.reg_mr(&comm, window, slot)?,
                comm,
                inflight: VecDeque::with_capacity(window),
                posted: 0,
                done: 0,
                refused: 0,
            }),
            None => None,
        };
        let rx = match recv {
            Some(comm) => Some(Rx {
                fifo: net.reg_mr(&comm, window, slot)?,
                comm,
                posted_q: VecDeque::with_capacity(window),
                posted: 0,
                done: 0,
                wrong: 0,
            }),
            None => None,
        };
        Ok(Endpoint {
            net,
            rank,
            peer,
            window,
            tx,
            rx,
            corrupt: false,
            spin: 0,
            stall_after: None,
        })
    }

    /// Idle passes to spin through before yielding (`--spin`).
    pub fn set_spin(&mut self, passes: u32) {
        self.spin = passes;
    }

    /// Test hook (`--debug-corrupt-rank`): from now on, every message this end receives is
    /// damaged (its first byte flipped) before it is checked, so the check must count it.
    pub fn corrupt_received(&mut self) {
        self.corrupt = true;
    }

    /// Fault-trial hook (`--debug-stall-recv-after`): once this end has received `n` messages
    /// it stops calling the plugin for good (the next pass sleeps until the process is
    /// killed), leaving its comms open and its peer's sends without receives.
    pub fn stall_receiving_after(&mut self, n: u64) {
        self.stall_after = Some(n);
    }

    /// What this end has moved so far.
    pub fn stats(&self) -> EndStats {
        EndStats {
            sent: self.tx.as_ref().map_or(0, |t| t.done),
            received: self.rx.as_ref().map_or(0, |r| r.done),
            wrong: self.rx.as_ref().map_or(0, |r| r.wrong),
            isend_retries: self.tx.as_ref().map_or(0, |t| t.refused),
        }
    }

    fn state(&self, what: &str) -> String {
        let tx = self.tx.as_ref().map_or("no send comm".into(), |t| {
            format!(
                "sends {} done, {} in flight, {} isend retries",
                t.done,
                t.posted - t.done,
                t.refused
            )
        });
        let rx = self.rx.as_ref().map_or("no receive comm".into(), |r| {
            format!("receives {} done, {} posted", r.done, r.posted - r.done)
        });
        format!(
            "rank {} (peer {}): {what}: {tx}; {rx}",
            self.rank, self.peer
        )
    }

    /// One pass of the proxy loop: each direction's op makes one step, as NCCL's proxy thread
    /// calls every active op's progress function once per loop (`src/proxy.cc`,
    /// `progressOps`) and each makes at most one step of its connection per call
    /// (`src/transport/net.cc`):
    /// - the receive op (`recvProxyProgress`) posts one receive into the next free slot (up to
    ///   `rx_end`, the window posted at most); only when it posted none (no free slot, all
    ///   posted, or "retry later") does it test its oldest receive, once;
    /// - the send op (`sendProxyProgress`) isends one message (up to `tx_end`, the window in
    ///   flight at most); only when it started none (none to send, the window full, or "retry
    ///   later") does it test its oldest send, once.
    ///
    /// So a rank whose sends keep starting still tests its receives every other pass, and its
    /// peer's clear-to-send is not held behind a burst of sends (a greedy pass that isent
    /// until refused and tested as far as done had one rank of a `--bidir` stream send in
    /// bursts while the other's sends waited, in some runs for the whole run).
    /// With `sends_first` the send op goes first: a ping-pong's reply is isent before the
    /// next receive is posted, whose clear-to-send costs the plugin a WRITE, and the receive
    /// is already posted ahead (the window). Otherwise the receive op goes first, so that the
    /// peer's sends find their clear-to-send (NCCL's proxy posts a step's receive as soon as it
    /// has the step). `size` is every message's length. Returns whether anything moved.
    fn pass(
        &mut self,
        tx_end: u64,
        rx_end: u64,
        size: usize,
        phase: Phase,
        sends_first: bool,
    ) -> Result<bool> {
        if let (Some(n), Some(rx)) = (self.stall_after, self.rx.as_ref()) {
            if rx.done >= n {
                eprintln!(
                    "rank {}: stalled after {} messages received (--debug-stall-recv-after): \
                     no more calls on the plugin",
                    self.rank, rx.done
                );
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                }
            }
        }
        let full = phase == Phase::Checked;
        if sends_first {
            let sent = self.send_step(tx_end, size, full)?;
            let received = self.recv_step(rx_end, size, full)?;
            Ok(sent || received)
        } else {
            let received = self.recv_step(rx_end, size, full)?;
            let sent = self.send_step(tx_end, size, full)?;
            Ok(received || sent)
        }
    }

    /// The receive op's step ([`Self::pass`]): one `irecv`, or else one `test` of the oldest
    /// receive. Returns whether it moved anything.
    fn recv_step(&mut self, rx_end: u64, size: usize, full: bool) -> Result<bool> {
        Ok(self.post_recv(rx_end, full)? || self.test_recv(size, full)?)
    }

    /// The send op's step ([`Self::pass`]): one `isend`, or else one `test` of the oldest
    /// send. Returns whether it moved anything.
    fn send_step(&mut self, tx_end: u64, size: usize, full: bool) -> Result<bool> {
        Ok(self.post_send(tx_end, size, full)? || self.test_send()?)
    }

    /// Tests the oldest posted receive once; when done, checks its bytes and frees its slot.
    /// Returns whether it was done.
    fn test_recv(&mut self, size: usize, full: bool) -> Result<bool> {
        let net = self.net;
        let Some(rx) = self.rx.as_mut() else {
            return Ok(false);
        };
        let Some(req) = rx.posted_q.front_mut() else {
            return Ok(false);
        };
        let Some(got) = net.test(&mut rx.fifo, req)? else {
            return Ok(false);
        };
        let slot = req.slot();
        let seq = rx.done;
        check_size(got, size, || {
            format!("receive {seq} from rank {} (tag {})", self.peer, self.peer)
        });
        let data = &mut rx
            .fifo
            .slot_mut(slot)
            .ok_or("completed receive slot still busy")?[..size];
        if self.corrupt {
            if let Some(b) = data.first_mut() {
                *b ^= 0x5A;
            }
        }
        if !holds(data, self.peer, seq, full) {
            rx.wrong += 1;
        }
        rx.posted_q.pop_front();
        rx.done += 1;
        Ok(true)
    }

    /// Tests the oldest send in flight once; returns whether it was done.
    fn test_send(&mut self) -> Result<bool> {
        let net = self.net;
        let Some(tx) = self.tx.as_mut() else {
            return Ok(false);
        };
        let Some(req) = tx.inflight.front_mut() else {
            return Ok(false);
        };
        if net.test(&mut tx.fifo, req)?.is_none() {
            return Ok(false);
        }
        tx.inflight.pop_front();
        tx.done += 1;
        Ok(true)
    }

    /// Isends the next message when one is left before `tx_end` and the window has room;
    /// returns whether the plugin took it ("retry later" is counted and retried on a later
    /// pass).
    fn post_send(&mut self, tx_end: u64, size: usize, full: bool) -> Result<bool> {
        let net = self.net;
        let w = self.window;
        let Some(tx) = self.tx.as_mut() else {
            return Ok(false);
        };
        if tx.posted >= tx_end || tx.inflight.len() >= w {
            return Ok(false);
        }
        let slot = (tx.posted % w as u64) as usize;
        let buf = tx.fifo.slot_mut(slot).ok_or("send slot still busy")?;
        fill(&mut buf[..size], self.rank, tx.posted, full);
        match net.isend(&mut tx.comm, &mut tx.fifo, slot, size, self.rank as i32)? {
            Some(req) => {
                tx.inflight.push_back(req);
                tx.posted += 1;
                Ok(true)
            }
            None => {
                tx.refused += 1;
                Ok(false)
            }
        }
    }

    /// Posts the next receive when one is left before `rx_end` and the window has room
    /// (`full`: its slot filled with the sentinel first); returns whether the plugin took it.
    fn post_recv(&mut self, rx_end: u64, full: bool) -> Result<bool> {
        let net = self.net;
        let w = self.window;
        let Some(rx) = self.rx.as_mut() else {
            return Ok(false);
        };
        if rx.posted >= rx_end || rx.posted_q.len() >= w {
            return Ok(false);
        }
        let slot = (rx.posted % w as u64) as usize;
        if full {
            rx.fifo
                .slot_mut(slot)
                .ok_or("receive slot still busy")?
                .fill(SENTINEL);
        }
        let cap = rx.fifo.slot_size();
        match net.irecv(&mut rx.comm, &mut rx.fifo, slot, cap, self.peer as i32)? {
            Some(req) => {
                rx.posted_q.push_back(req);
                rx.posted += 1;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Runs passes until `until(self)` holds; idle passes spin, then yield and nap.
    /// `sends_first`: see [`Self::pass`].
    fn drive(
        &mut self,
        tx_end: u64,
        rx_end: u64,
        size: usize,
        phase: Phase,
        sends_first: bool,
        until: impl Fn(&Self) -> bool,
    ) -> Result<()> {
        let mut idle = Idle::new(self.spin);
        while !until(self) {
            if self.pass(tx_end, rx_end, size, phase, sends_first)? {
                idle.progressed();
            } else if idle.wait() > STALL_TIMEOUT {
                return Err(self
                    .state(&format!("no progress for {STALL_TIMEOUT:?}"))
                    .into());
            }
        }
        Ok(())
    }

    /// Moves `msgs` messages of `size` bytes in each direction this end has: sends with up to
    /// the window in flight, receives posted ahead up to the window; returns once all of them
    /// are done (sends tested complete, receives consumed).
    ///
    /// # Errors
    /// Plugin errors or a stall.
    pub fn stream(&mut self, msgs: u64, size: usize, phase: Phase) -> Result<()> {
        let tx_end = self.tx.as_ref().map_or(0, |t| t.posted + msgs);
        let rx_end = self.rx.as_ref().map_or(0, |r| r.posted + msgs);
        self.drive(tx_end, rx_end, size, phase, false, |e| {
            e.tx.as_ref().is_none_or(|t| t.done >= tx_end)
                && e.rx.as_ref().is_none_or(|r| r.done >= rx_end)
        })
    }

    /// Posts one send of `size` bytes (retrying "retry later" on later passes), serving the
    /// receives meanwhile; `rx_end`: receives may be posted ahead up to this count.
    ///
    /// # Errors
    /// Plugin errors, no send comm, or a stall.
    pub fn send_one(&mut self, size: usize, phase: Phase, rx_end: u64) -> Result<()> {
        let goal = self.tx.as_ref().ok_or("no send comm")?.posted + 1;
        self.drive(goal, rx_end, size, phase, true, |e| {
            e.tx.as_ref().is_some_and(|t| t.posted >= goal)
        })
    }

    /// Waits until `goal` receives of `size` bytes are done in all (the passes of
    /// [`Self::send_one`] complete receives too, so the caller counts, never "the next one"),
    /// posting receives ahead up to `rx_end` and testing the sends in flight meanwhile.
    ///
    /// # Errors
    /// Plugin errors, no receive comm, or a stall.
    pub fn recv_until(&mut self, goal: u64, size: usize, phase: Phase, rx_end: u64) -> Result<()> {
        if self.rx.is_none() {
            return Err("no receive comm".into());
        }
        let tx_end = self.tx.as_ref().map_or(0, |t| t.posted);
        self.drive(tx_end, rx_end, size, phase, false, |e| {
            e.rx.as_ref().is_some_and(|r| r.done >= goal)
        })
    }

    /// The CPU cost of one `test` of a receive that is still pending: posts the next receive
    /// (when the window has room) and times `calls` tests of the oldest posted one, in
    /// nanoseconds per call. Call it while the peer sends nothing (between two barriers): a
    /// call that completes the receive ends the measurement with an error, since it would
    /// time a completion instead. The receive stays posted and is consumed as usual later.
    /// This is the call a proxy makes most (it tests its oldest receive on every idle pass),
    /// so its cost is the floor of the plugin's CPU per poll.
    ///
    /// `Ok(None)` when the plugin kept answering the `irecv` with "retry later" for
    /// a second (legal: a plugin may hold receives back until it is ready), so there
    /// is nothing to time.
    ///
    /// # Errors
    /// Plugin errors, no receive comm, or a receive that completed.
    pub fn idle_test_ns(&mut self, calls: u32) -> Result<Option<f64>> {
        let rx_end = self.recvs_posted() + 1;
        let asked = Instant::now();
        while self.recvs_posted() < rx_end && asked.elapsed() < IDLE_POST_WAIT {
            if !self.post_recv(rx_end, false)? {
                std::thread::yield_now();
            }
        }
        let net = self.net;
        let rx = self.rx.as_mut().ok_or("no receive comm")?;
        let Some(req) = rx.posted_q.front_mut() else {
            return Ok(None);
        };
        let start = Instant::now();
        for _ in 0..calls {
            if net.test(&mut rx.fifo, req)?.is_some() {
                return Err("a receive completed while the peer sent nothing".into());
            }
        }
        Ok(Some(
            start.elapsed().as_secs_f64() * 1e9 / f64::from(calls.max(1)),
        ))
    }

    /// Receives posted so far.
    pub fn recvs_posted(&self) -> u64 {
        self.rx.as_ref().map_or(0, |r| r.posted)
    }

    /// Receives done so far.
    pub fn recvs_done(&self) -> u64 {
        self.rx.as_ref().map_or(0, |r| r.done)
    }

    /// Waits until every send posted is done (a ping-pong phase's end).
    ///
    /// # Errors
    /// Plugin errors or a stall.
    pub fn finish_sends(&mut self, size: usize, phase: Phase) -> Result<()> {
        let tx_end = self.tx.as_ref().map_or(0, |t| t.posted);
        let rx_end = self.recvs_posted();
        self.drive(tx_end, rx_end, size, phase, false, |e| {
            e.tx.as_ref().is_none_or(|t| t.done >= t.posted)
        })
    }

    /// deregMr the FIFOs, then closeSend and closeRecv.
    ///
    /// # Errors
    /// Plugin errors, or requests still in flight.
    pub fn close(self) -> Result<()> {
        let net = self.net;
        if let Some(tx) = self.tx {
            net.dereg_mr(&tx.comm, tx.fifo)?;
            net.close_send(tx.comm)?;
        }
        if let Some(rx) = self.rx {
            net.dereg_mr(&rx.comm, rx.fifo)?;
            net.close_recv(rx.comm)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_tell_senders_and_sequence_numbers_apart() {
        assert_ne!(stamp(0, 0), [0; 8]);
        assert_ne!(stamp(0, 0), [SENTINEL; 8]);
        assert_ne!(stamp(0, 5), stamp(1, 5));
        assert_ne!(stamp(0, 5), stamp(0, 6));
        for size in [0usize, 1, 7, 8, 9, 4096] {
            let mut b = vec![SENTINEL; size];
            fill(&mut b, 1, 42, true);
            assert!(holds(&b, 1, 42, true), "size {size}");
            assert!(holds(&b, 1, 42, false), "size {size}");
            if size > 0 {
                assert!(!holds(&b, 1, 43, false), "size {size}");
                assert!(!holds(&b, 0, 42, false), "size {size}");
            }
            if size > 8 {
                b[size - 1] ^= 1;
                assert!(holds(&b, 1, 42, false), "the stamp alone");
                assert!(!holds(&b, 1, 42, true), "size {size}: a changed body byte");
            }
        }
        // A stamped-only message carries the old body: only a checked phase looks at it.
        let mut b = vec![SENTINEL; 64];
        fill(&mut b, 0, 7, false);
        assert!(holds(&b, 0, 7, false) && !holds(&b, 0, 7, true));
    }
}
