//! The system side of the explorer: the plugin behind its `ncclNetPlugin_v12` table, driven
//! by the intents of [`crate::model`], with a reference model of every connection that checks
//! each answer.
//!
//! # The model of one connection
//! Receives (groups of `(tag, capacity)` buffers) and sends (`(tag, size)`) are *wanted* in
//! the order the steps ask for them; they are *posted* (`irecv`) and *started* (`isend`) in
//! that order, receives in posting order and sends in order per tag, each retried after a NULL
//! request as NCCL retries. The k-th send with tag `t` fills the k-th buffer with tag `t` in
//! posting order (NCCL's front-group rule, docs/protocol.md "Matching"). Every buffer is
//! pre-filled with a canary; when `test` reports a receive done, each of its buffers must hold
//! exactly the bytes of its send (a pattern unique to connection, tag and k), the canary after
//! them, and its reported size must be the send's; a send's reported size must be its own.
//! No call may return an error (except, in the death profile, on a comm whose peer died or
//! closed; then see below).
//!
//! # Liveness: when the contract says progress is possible
//! With `front` = the oldest posted receive with a buffer not yet taken by a started send
//! (NCCL's front group), these must happen while the caller calls **only one end**:
//! - **L1** (send end alone): the oldest unstarted send with tag `t` whose buffer lies in
//!   `front` is accepted by `isend` (NCCL IB: `ncclIbIrecv` writes the CTS, and the matching
//!   `ncclIbIsend` needs nothing more from the receiver; `src/transport/net_ib/p2p.cc`).
//! - **L2** (send end alone): a started send whose receive is posted completes (`test` says
//!   done): NCCL IB's send completes on its local CQE, which the peer's NIC acknowledges
//!   without any call of the receiver.
//! - **L0** (receive end alone): `irecv` of the oldest unposted receive is accepted while
//!   fewer than `NCCL_NET_MAX_REQUESTS` (32) receives are outstanding.
//! - **L3** (receive end alone): a posted receive whose every buffer has a started send
//!   completes: started sends reach the receiver without further sender calls (the NIC).
//!
//! The bound: an obligation fails when it is still open after at least [`Bounds::calls`]
//! calls on that connection **and** [`Bounds::wall`] of wall time since the connection last
//! made progress (a send or receive started or completed). Calls are cheap and the machines
//! are shared, so both must pass: a slow machine cannot fail it by wall time alone, a fast
//! one not by calls alone. With both ends called (`Pump`, and the drain that ends every
//! sequence) every request must complete within [`Bounds::drain`].
//!
//! # Death and close of a peer
//! After one end dies (dropped without close: [`crate::common::table::crash`]) or is closed
//! (`closeSend`/`closeRecv`, maybe with requests in flight) at `t0`, every call on the other
//! end made at `t0 +` [`Bounds::death`] or later must fail with `ncclRemoteError`: `isend` and
//! `irecv` (also with nothing in flight, and also an `isend` that was answering "retry later"),
//! and `test`, which may instead report done with the right data (completions the transport
//! delivered before the death come first), but never "in progress". Once a call failed, every
//! later one fails. Then `closeSend`/`closeRecv` of the survivor returns `ncclSuccess`.
//! `Bounds::death` is `VERBSNET_PEER_CHECK_INTERVAL` plus slack: the documented bound for a
//! peer whose process is gone (its sockets close; docs/configuration.md).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::common::table::{self as t, Mem, Ptr, OK};
use crate::model::{Profile, RefState, Side, Step};
use nccl_net_verbsnet::ffi::abi::ncclResult_t;

/// Receive requests NCCL keeps outstanding per comm at most (`NCCL_NET_MAX_REQUESTS`).
const MAX_RECV_OUT: usize = 32;
/// Send requests per comm at most: 32 × `maxRecvs` (8), ext-net README.
const MAX_SEND_OUT: usize = 32 * 8;
/// Bytes of one registered region (larger buffers get a region of their own).
const ARENA: usize = 1 << 20;
/// What every receive buffer holds before its data lands.
const CANARY: u8 = 0xa5;
/// Trace lines kept per connection.
const TRACE_LINES: usize = 48;

/// The bounds of the liveness and death checks.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Wall time without progress before an open obligation fails.
    pub wall: Duration,
    /// Calls on the connection without progress before an open obligation fails.
    pub calls: u64,
    /// Longest a full drain (both ends called) may go without progress.
    pub drain: Duration,
    /// From a peer's death or close to the survivor's calls failing.
    pub death: Duration,
    /// Which obligations the one-sided spins enforce: `[L0, L1, L2, L3]` (all by default;
    /// `VERBSNET_EXPLORER_CHECK` picks some, to look at one at a time).
    pub enforce: [bool; 4],
}

/// One registered region of one end.
struct Arena {
    mem: Mem,
    mh: Ptr,
    used: usize,
    /// Buffers in it that a request may still use.
    live: usize,
}

#[derive(Clone, Copy, Debug)]
struct Place {
    arena: usize,
    off: usize,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum GState {
    Queued,
    Posted(Ptr),
    Done,
    /// Its comm was closed or died with it outstanding.
    Gone,
}

struct Group {
    bufs: Vec<(i32, u32)>,
    /// Per buffer, its ordinal among the buffers of its tag.
    ords: Vec<usize>,
    state: GState,
    places: Vec<Place>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum SState {
    Queued,
    Started(Ptr),
    Done,
    Gone,
}

struct Send {
    tag: i32,
    size: u32,
    k: usize,
    state: SState,
    place: Option<Place>,
}

/// The recent calls of a connection, with repeats folded: a run of the same call, or of the
/// same cycle of up to 4 calls (a retry loop: `isend` NULL, `test` in progress, ...), is kept
/// once with its count.
#[derive(Default)]
struct Trace {
    /// Blocks of calls and how many times each block ran in a row.
    blocks: Vec<(Vec<String>, u64)>,
    /// Calls of the last block's next repetition matched so far.
    partial: usize,
    dropped: u64,
}

impl Trace {
    fn push(&mut self, line: String) {
        if let Some((b, n)) = self.blocks.last_mut() {
            if b[self.partial] == line {
                self.partial += 1;
                if self.partial == b.len() {
                    *n += 1;
                    self.partial = 0;
                }
                return;
            }
            // The repetition broke off: what matched of it stands on its own.
            let done: Vec<String> = b[..self.partial].to_vec();
            self.partial = 0;
            for l in done {
                self.blocks.push((vec![l], 1));
            }
        }
        self.blocks.push((vec![line], 1));
        // Two equal runs of single calls in a row become one block run twice.
        for p in 1..=4 {
            let n = self.blocks.len();
            if n < 2 * p {
                break;
            }
            let tail = &self.blocks[n - 2 * p..];
            if tail.iter().all(|(b, c)| b.len() == 1 && *c == 1)
                && (0..p).all(|i| tail[i].0 == tail[p + i].0)
            {
                let block: Vec<String> = tail[p..].iter().map(|(b, _)| b[0].clone()).collect();
                self.blocks.truncate(n - 2 * p);
                self.blocks.push((block, 2));
                break;
            }
        }
        while self.blocks.len() > TRACE_LINES {
            self.blocks.remove(0);
            self.dropped += 1;
        }
    }

    fn render(&self) -> String {
        let mut s = String::new();
        if self.dropped > 0 {
            let _ = writeln!(s, "    ... ({} earlier calls or runs)", self.dropped);
        }
        for (b, n) in &self.blocks {
            match (b.len(), *n) {
                (1, 1) => {
                    let _ = writeln!(s, "    {}", b[0]);
                }
                (1, n) => {
                    let _ = writeln!(s, "    {}   (x{n})", b[0]);
                }
                (_, n) => {
                    let _ = writeln!(s, "    [ {} ]   (x{n})", b.join(" ; "));
                }
            }
        }
        if let Some((b, _)) = self.blocks.last() {
            for l in &b[..self.partial] {
                let _ = writeln!(s, "    {l}");
            }
        }
        s
    }
}

/// One connection: its two comms, what was wanted, posted and started, and its regions.
pub struct Conn {
    idx: usize,
    key: u64,
    send: Option<Ptr>,
    recv: Option<Ptr>,
    groups: Vec<Group>,
    sends: Vec<Send>,
    bufs_by_tag: BTreeMap<i32, Vec<(usize, usize)>>,
    sends_by_tag: BTreeMap<i32, Vec<usize>>,
    /// Per tag, how many of its sends were started.
    started: BTreeMap<i32, usize>,
    next_post: usize,
    arenas: [Vec<Option<Arena>>; 2],
    trace: Trace,
    calls: u64,
    bounds: Bounds,
    /// The result code of the last call that returned one other than `ncclSuccess`.
    last_err: Option<ncclResult_t>,
}

fn rc_name(rc: ncclResult_t) -> String {
    format!("{rc:?}")
}

fn si(side: Side) -> usize {
    match side {
        Side::Send => 0,
        Side::Recv => 1,
    }
}

impl Conn {
    fn new(idx: usize, gen: u64, send: Ptr, recv: Ptr, bounds: Bounds) -> Conn {
        Conn {
            idx,
            key: (gen << 8) | idx as u64,
            send: Some(send),
            recv: Some(recv),
            groups: Vec::new(),
            sends: Vec::new(),
            bufs_by_tag: BTreeMap::new(),
            sends_by_tag: BTreeMap::new(),
            started: BTreeMap::new(),
            next_post: 0,
            arenas: [Vec::new(), Vec::new()],
            trace: Trace::default(),
            calls: 0,
            bounds,
            last_err: None,
        }
    }

    fn name(&self) -> String {
        format!("conn {}", self.idx)
    }

    fn fail(&self, what: String) -> String {
        format!(
            "{}: {what}\n  {}\n  last calls on {}:\n{}",
            self.name(),
            self.summary(),
            self.name(),
            self.trace.render()
        )
    }

    /// A call returned `rc`: kept in `last_err` (the death checks expect errors).
    fn fail_rc(&mut self, rc: ncclResult_t, what: String) -> String {
        self.last_err = Some(rc);
        self.fail(what)
    }

    fn summary(&self) -> String {
        let posted = self
            .groups
            .iter()
            .filter(|g| matches!(g.state, GState::Posted(_)))
            .count();
        let started = self
            .sends
            .iter()
            .filter(|s| matches!(s.state, SState::Started(_)))
            .count();
        format!(
            "state: receives {} wanted / {} posted / {} done; sends {} wanted / {} started / {} done",
            self.groups.len(),
            posted,
            self.groups
                .iter()
                .filter(|g| g.state == GState::Done)
                .count(),
            self.sends.len(),
            started,
            self.sends.iter().filter(|s| s.state == SState::Done).count()
        )
    }

    fn comm(&self, side: Side) -> Ptr {
        match side {
            Side::Send => self.send,
            Side::Recv => self.recv,
        }
        .expect("comm of an open connection")
    }

    /// Room for `len` bytes on `side`, registering a new region when the newest is full.
    fn alloc(&mut self, side: Side, len: usize) -> Result<Place, String> {
        let len = len.max(1);
        let list = &self.arenas[si(side)];
        if let Some((i, Some(a))) = list.iter().enumerate().next_back() {
            if a.used + len <= a.mem.size() {
                let off = a.used;
                let a = self.arenas[si(side)][i].as_mut().unwrap();
                a.used = (off + len).next_multiple_of(64);
                a.live += 1;
                return Ok(Place { arena: i, off });
            }
        }
        let i = self.new_arena(side, len)?;
        let a = self.arenas[si(side)][i].as_mut().unwrap();
        a.used = len.next_multiple_of(64);
        a.live = 1;
        Ok(Place { arena: i, off: 0 })
    }

    fn new_arena(&mut self, side: Side, len: usize) -> Result<usize, String> {
        let mem = Mem::new(len.max(ARENA), 0);
        self.calls += 1;
        let r = t::reg_mr(self.comm(side), &mem);
        self.trace
            .push(format!("regMr({side:?}, {} bytes) -> {r:?}", mem.size()));
        let mh = r.map_err(|rc| self.fail(format!("regMr returned {}", rc_name(rc))))?;
        self.arenas[si(side)].push(Some(Arena {
            mem,
            mh,
            used: 0,
            live: 0,
        }));
        Ok(self.arenas[si(side)].len() - 1)
    }

    fn arena(&self, side: Side, p: Place) -> &Arena {
        self.arenas[si(side)][p.arena].as_ref().expect("live arena")
    }

    fn release(&mut self, side: Side, p: Place) {
        if let Some(a) = self.arenas[si(side)][p.arena].as_mut() {
            a.live -= 1;
        }
    }

    /// Deregisters the oldest region of `side` that no request uses, except the newest.
    fn dereg_idle(&mut self, side: Side) -> Result<(), String> {
        let list = &self.arenas[si(side)];
        let newest = list.iter().rposition(Option::is_some);
        let Some(i) = list
            .iter()
            .position(|a| a.as_ref().is_some_and(|a| a.live == 0))
            .filter(|&i| Some(i) != newest)
        else {
            return Ok(());
        };
        let a = self.arenas[si(side)][i].take().unwrap();
        self.calls += 1;
        let rc = t::dereg_mr(self.comm(side), a.mh);
        self.trace.push(format!("deregMr({side:?}) -> {rc:?}"));
        if rc != OK {
            return Err(self.fail(format!("deregMr returned {}", rc_name(rc))));
        }
        Ok(())
    }

    /// Deregisters every region still registered (a comm that died without closing left its
    /// registrations alive; deregMr does not use the comm).
    fn dereg_all(&mut self) -> Result<(), String> {
        for side in [Side::Send, Side::Recv] {
            let list = std::mem::take(&mut self.arenas[si(side)]);
            for a in list.into_iter().flatten() {
                self.calls += 1;
                let rc = t::dereg_mr(Ptr::null(), a.mh);
                if rc != OK {
                    return Err(self.fail(format!("deregMr returned {}", rc_name(rc))));
                }
            }
        }
        Ok(())
    }

    fn want_recv(&mut self, bufs: &[(i32, u32)]) {
        let g = self.groups.len();
        let mut ords = Vec::with_capacity(bufs.len());
        for (i, (t, _)) in bufs.iter().enumerate() {
            let v = self.bufs_by_tag.entry(*t).or_default();
            ords.push(v.len());
            v.push((g, i));
        }
        self.groups.push(Group {
            bufs: bufs.to_vec(),
            ords,
            state: GState::Queued,
            places: Vec::new(),
        });
    }

    fn want_send(&mut self, tag: i32, size: u32) {
        let v = self.sends_by_tag.entry(tag).or_default();
        let k = v.len();
        v.push(self.sends.len());
        self.sends.push(Send {
            tag,
            size,
            k,
            state: SState::Queued,
            place: None,
        });
    }

    /// The oldest unstarted send with `tag`.
    fn head(&self, tag: i32) -> Option<usize> {
        let k = self.started.get(&tag).copied().unwrap_or(0);
        self.sends_by_tag.get(&tag).and_then(|v| v.get(k)).copied()
    }

    fn heads(&self) -> Vec<usize> {
        self.sends_by_tag
            .keys()
            .filter_map(|&t| self.head(t))
            .collect()
    }

    fn sends_out(&self) -> usize {
        self.sends
            .iter()
            .filter(|s| matches!(s.state, SState::Started(_)))
            .count()
    }

    fn recvs_out(&self) -> usize {
        self.groups
            .iter()
            .filter(|g| matches!(g.state, GState::Posted(_)))
            .count()
    }

    /// The buffer send `s` fills, if wanted already.
    fn buf_of(&self, s: usize) -> Option<(usize, usize)> {
        let send = &self.sends[s];
        self.bufs_by_tag
            .get(&send.tag)
            .and_then(|v| v.get(send.k))
            .copied()
    }

    /// The send that fills buffer `i` of receive `g`, if wanted already.
    fn send_of(&self, g: usize, i: usize) -> Option<usize> {
        let (tag, _) = self.groups[g].bufs[i];
        let k = self.groups[g].ords[i];
        self.sends_by_tag.get(&tag).and_then(|v| v.get(k)).copied()
    }

    fn taken(&self, g: usize, i: usize) -> bool {
        self.send_of(g, i)
            .is_some_and(|s| self.sends[s].state != SState::Queued)
    }

    /// NCCL's front group: the oldest receive with a buffer no started send has taken.
    fn front(&self) -> Option<usize> {
        (0..self.groups.len()).find(|&g| (0..self.groups[g].bufs.len()).any(|i| !self.taken(g, i)))
    }

    /// One `isend` of send `s` (NCCL's retry of the same send). True when it started.
    fn try_send(&mut self, s: usize) -> Result<bool, String> {
        if self.sends_out() >= MAX_SEND_OUT || self.sends[s].state != SState::Queued {
            return Ok(false);
        }
        let (tag, size, k) = (self.sends[s].tag, self.sends[s].size, self.sends[s].k);
        let place = match self.sends[s].place {
            Some(p) => p,
            None => {
                let p = self.alloc(Side::Send, size as usize)?;
                let data = t::pattern(self.key, tag, k as u64, size as usize);
                self.arena(Side::Send, p).mem.write(p.off, &data);
                self.sends[s].place = Some(p);
                p
            }
        };
        let a = self.arena(Side::Send, place);
        let (addr, mh) = (a.mem.addr(place.off), a.mh);
        self.calls += 1;
        let r = t::isend(self.comm(Side::Send), addr, size as usize, tag, mh);
        let line = format!(
            "isend(send #{s}: tag {tag}, {size} B) -> {}",
            match &r {
                Ok(Some(_)) => "request".to_string(),
                Ok(None) => "NULL (retry later)".to_string(),
                Err(rc) => rc_name(*rc),
            }
        );
        self.trace.push(line);
        match r {
            Err(rc) => Err(self.fail_rc(
                rc,
                format!(
                    "isend of send #{s} (tag {tag}, {size} B) returned {}",
                    rc_name(rc)
                ),
            )),
            Ok(None) => Ok(false),
            Ok(Some(req)) => {
                self.sends[s].state = SState::Started(req);
                *self.started.entry(tag).or_default() += 1;
                Ok(true)
            }
        }
    }

    /// One `irecv` of the oldest unposted receive, if fewer than 32 are outstanding.
    fn try_post(&mut self) -> Result<bool, String> {
        let g = self.next_post;
        if g >= self.groups.len() || self.recvs_out() >= MAX_RECV_OUT {
            return Ok(false);
        }
        if self.groups[g].places.is_empty() {
            let caps: Vec<u32> = self.groups[g].bufs.iter().map(|b| b.1).collect();
            let mut places = Vec::with_capacity(caps.len());
            for cap in caps {
                let p = self.alloc(Side::Recv, cap as usize)?;
                self.arena(Side::Recv, p)
                    .mem
                    .fill(p.off, cap as usize, CANARY);
                places.push(p);
            }
            self.groups[g].places = places;
        }
        let bufs: Vec<(u64, usize, i32, Ptr)> = self.groups[g]
            .bufs
            .iter()
            .zip(&self.groups[g].places)
            .map(|((tag, cap), p)| {
                let a = self.arena(Side::Recv, *p);
                (a.mem.addr(p.off), *cap as usize, *tag, a.mh)
            })
            .collect();
        self.calls += 1;
        let r = t::irecv(self.comm(Side::Recv), &bufs);
        let shape: Vec<String> = self.groups[g]
            .bufs
            .iter()
            .map(|(t, c)| format!("tag {t} cap {c}"))
            .collect();
        let line = format!(
            "irecv(recv #{g}: [{}]) -> {}",
            shape.join(", "),
            match &r {
                Ok(Some(_)) => "request".to_string(),
                Ok(None) => "NULL (retry later)".to_string(),
                Err(rc) => rc_name(*rc),
            }
        );
        self.trace.push(line);
        match r {
            Err(rc) => Err(self.fail_rc(
                rc,
                format!("irecv of receive #{g} returned {}", rc_name(rc)),
            )),
            Ok(None) => Ok(false),
            Ok(Some(req)) => {
                self.groups[g].state = GState::Posted(req);
                self.next_post += 1;
                Ok(true)
            }
        }
    }

    /// One `test` of send `s`. True when done.
    fn test_send(&mut self, s: usize) -> Result<bool, String> {
        let SState::Started(req) = self.sends[s].state else {
            return Ok(false);
        };
        self.calls += 1;
        let r = t::test(req, 1);
        let size = self.sends[s].size;
        self.trace.push(format!(
            "test(send #{s}) -> {}",
            match &r {
                Ok(Some(v)) => format!("done {v:?}"),
                Ok(None) => "in progress".into(),
                Err(rc) => rc_name(*rc),
            }
        ));
        match r {
            Err(rc) => Err(self.fail_rc(rc, format!("test of send #{s} returned {}", rc_name(rc)))),
            Ok(None) => Ok(false),
            Ok(Some(v)) => {
                if v != [size as i32] {
                    return Err(self.fail(format!(
                        "send #{s} of {size} B completed reporting size {v:?}"
                    )));
                }
                self.sends[s].state = SState::Done;
                let p = self.sends[s].place.expect("placed");
                self.release(Side::Send, p);
                Ok(true)
            }
        }
    }

    /// One `test` of receive `g`; when done, checks every buffer. True when done.
    fn test_recv(&mut self, g: usize) -> Result<bool, String> {
        let GState::Posted(req) = self.groups[g].state else {
            return Ok(false);
        };
        let n = self.groups[g].bufs.len();
        self.calls += 1;
        let r = t::test(req, n);
        self.trace.push(format!(
            "test(recv #{g}) -> {}",
            match &r {
                Ok(Some(v)) => format!("done {v:?}"),
                Ok(None) => "in progress".into(),
                Err(rc) => rc_name(*rc),
            }
        ));
        match r {
            Err(rc) => {
                Err(self.fail_rc(rc, format!("test of receive #{g} returned {}", rc_name(rc))))
            }
            Ok(None) => Ok(false),
            Ok(Some(sizes)) => {
                self.check_recv(g, &sizes)?;
                self.groups[g].state = GState::Done;
                for p in self.groups[g].places.clone() {
                    self.release(Side::Recv, p);
                }
                Ok(true)
            }
        }
    }

    /// Every buffer of a completed receive holds its send's bytes, then the canary.
    fn check_recv(&self, g: usize, sizes: &[i32]) -> Result<(), String> {
        for i in 0..self.groups[g].bufs.len() {
            let (tag, cap) = self.groups[g].bufs[i];
            let Some(s) = self
                .send_of(g, i)
                .filter(|&s| self.sends[s].state != SState::Queued)
            else {
                return Err(self.fail(format!(
                    "receive #{g} completed, but buffer {i} (tag {tag}) has no started send"
                )));
            };
            let send = &self.sends[s];
            if sizes[i] != send.size as i32 {
                return Err(self.fail(format!(
                    "receive #{g} buffer {i} (tag {tag}) reports {} B; its send #{s} had {} B \
                     (sizes {sizes:?})",
                    sizes[i], send.size
                )));
            }
            let p = self.groups[g].places[i];
            let got = self.arena(Side::Recv, p).mem.read(p.off, cap as usize);
            let want = t::pattern(self.key, tag, send.k as u64, send.size as usize);
            let n = send.size as usize;
            if got[..n] != want[..] {
                let at = (0..n).find(|&j| got[j] != want[j]).unwrap_or(0);
                return Err(self.fail(format!(
                    "receive #{g} buffer {i} (tag {tag}): byte {at} of {n} differs from send \
                     #{s} ({:#04x}, want {:#04x})",
                    got[at], want[at]
                )));
            }
            if let Some(j) = (n..cap as usize).find(|&j| got[j] != CANARY) {
                return Err(self.fail(format!(
                    "receive #{g} buffer {i} (tag {tag}, capacity {cap}): byte {j} past the \
                     {n}-byte message was written"
                )));
            }
        }
        Ok(())
    }

    /// One round: each end called as asked (every waiting send retried once, every waiting
    /// receive posted while allowed, every outstanding request tested once). True on progress.
    fn round(&mut self, send: bool, recv: bool) -> Result<bool, String> {
        let mut progress = false;
        if recv {
            while self.try_post()? {
                progress = true;
            }
        }
        if send {
            for s in self.heads() {
                progress |= self.try_send(s)?;
            }
            for s in 0..self.sends.len() {
                progress |= self.test_send(s)?;
            }
        }
        if recv {
            for g in 0..self.groups.len() {
                progress |= self.test_recv(g)?;
            }
        }
        Ok(progress)
    }

    /// The open liveness obligations of the ends called (module docs: L0-L3) that are
    /// enforced ([`Bounds::enforce`]).
    fn obligations(&self, send: bool, recv: bool) -> Vec<String> {
        let e = self.bounds.enforce;
        let mut v = self.all_obligations(send, recv);
        v.retain(|o| {
            let l = o.as_bytes()[1] - b'0';
            e[l as usize]
        });
        v
    }

    fn all_obligations(&self, send: bool, recv: bool) -> Vec<String> {
        let mut v = Vec::new();
        let posted = |g: usize| matches!(self.groups[g].state, GState::Posted(_) | GState::Done);
        if send {
            if let Some(f) = self.front().filter(|&f| posted(f)) {
                if self.sends_out() < MAX_SEND_OUT {
                    for s in self.heads() {
                        if let Some((g, i)) = self.buf_of(s).filter(|b| b.0 == f) {
                            let x = &self.sends[s];
                            v.push(format!(
                                "L1: isend of send #{s} (tag {}, {} B) for buffer {i} of the \
                                 front receive #{g}, posted, must be accepted",
                                x.tag, x.size
                            ));
                        }
                    }
                }
            }
            for (s, x) in self.sends.iter().enumerate() {
                if let (SState::Started(_), Some((g, _))) = (x.state, self.buf_of(s)) {
                    if posted(g) {
                        v.push(format!(
                            "L2: send #{s} (tag {}, {} B), started, its receive #{g} posted, \
                             must complete",
                            x.tag, x.size
                        ));
                    }
                }
            }
        }
        if recv {
            if self.next_post < self.groups.len() && self.recvs_out() < MAX_RECV_OUT {
                v.push(format!(
                    "L0: irecv of receive #{} must be accepted ({} outstanding)",
                    self.next_post,
                    self.recvs_out()
                ));
            }
            for (g, grp) in self.groups.iter().enumerate() {
                if matches!(grp.state, GState::Posted(_))
                    && (0..grp.bufs.len()).all(|i| self.taken(g, i))
                {
                    v.push(format!(
                        "L3: receive #{g}, every send for it started, must complete"
                    ));
                }
            }
        }
        v
    }

    /// Calls the ends asked for, at least `rounds` rounds; with `check`, then until no
    /// obligation is open, failing when one stays open past the bound.
    fn spin(
        &mut self,
        send: bool,
        recv: bool,
        rounds: u32,
        check: bool,
        wall: Duration,
    ) -> Result<(), String> {
        let mut last = Instant::now();
        let mut calls_at = self.calls;
        for r in 1u64.. {
            let before = self.calls;
            if self.round(send, recv)? {
                last = Instant::now();
                calls_at = self.calls;
            }
            if r < u64::from(rounds) {
                continue;
            }
            if !check {
                return Ok(());
            }
            let open = self.obligations(send, recv);
            if open.is_empty() {
                return Ok(());
            }
            let idle = last.elapsed();
            let idle_calls = self.calls - calls_at;
            let bound_calls = if send && recv { 0 } else { self.bounds.calls };
            // (A round that made no call cannot progress: the bound's calls never come.)
            let stuck = self.calls == before;
            if idle >= wall && (idle_calls >= bound_calls || stuck) {
                let who = match (send, recv) {
                    (true, false) => "only the send comm was called",
                    (false, true) => "only the receive comm was called",
                    _ => "both comms were called",
                };
                return Err(self.fail(format!(
                    "liveness: {who} for {idle:.2?} ({idle_calls} calls) without progress, and \
                     the contract says this must progress:\n    {}",
                    open.join("\n    ")
                )));
            }
        }
        unreachable!()
    }

    /// Wants whatever makes every wanted send and buffer meet (a receive per extra send, a
    /// send per extra buffer), then drives both ends until all of it completed.
    fn drain(&mut self) -> Result<(), String> {
        let tags: Vec<i32> = self
            .bufs_by_tag
            .keys()
            .chain(self.sends_by_tag.keys())
            .copied()
            .collect();
        for tag in tags {
            let nb = self.bufs_by_tag.get(&tag).map_or(0, Vec::len);
            let ns = self.sends_by_tag.get(&tag).map_or(0, Vec::len);
            for k in nb..ns {
                let s = self.sends_by_tag[&tag][k];
                let size = self.sends[s].size;
                self.want_recv(&[(tag, size.max(1))]);
            }
            for k in ns..nb {
                let (g, i) = self.bufs_by_tag[&tag][k];
                let cap = self.groups[g].bufs[i].1;
                self.want_send(tag, cap - cap / 3);
            }
        }
        let wall = self.bounds.drain;
        let enforce = std::mem::replace(&mut self.bounds.enforce, [true; 4]);
        let r = self.spin(true, true, 1, true, wall);
        self.bounds.enforce = enforce;
        r?;
        if let Some(g) = self.groups.iter().position(|g| g.state != GState::Done) {
            return Err(self.fail(format!("drain left receive #{g} not done")));
        }
        if let Some(s) = self.sends.iter().position(|s| s.state != SState::Done) {
            return Err(self.fail(format!("drain left send #{s} not done")));
        }
        Ok(())
    }

    fn close_end(&mut self, side: Side) -> Result<(), String> {
        let p = match side {
            Side::Send => self.send.take(),
            Side::Recv => self.recv.take(),
        };
        let Some(p) = p else { return Ok(()) };
        // NCCL deregisters before it closes (src/transport/net.cc); another caller may leave
        // its registrations for close to free. Both, alternately.
        let nccl_order = self.calls.is_multiple_of(2);
        let arenas = std::mem::take(&mut self.arenas[si(side)]);
        if nccl_order {
            for a in arenas.iter().flatten() {
                self.calls += 1;
                let rc = t::dereg_mr(p, a.mh);
                self.trace.push(format!("deregMr({side:?}) -> {rc:?}"));
                if rc != OK {
                    return Err(self.fail(format!("deregMr returned {}", rc_name(rc))));
                }
            }
        }
        self.calls += 1;
        let rc = match side {
            Side::Send => t::close_send(p),
            Side::Recv => t::close_recv(p),
        };
        self.trace.push(format!("close{side:?} -> {rc:?}"));
        self.forget(side);
        if rc != OK {
            return Err(self.fail(format!("close{side:?} returned {}", rc_name(rc))));
        }
        if !nccl_order {
            // Close freed them: a late deregMr is refused, never a double free.
            if let Some(a) = arenas.iter().flatten().next() {
                self.calls += 1;
                let rc = t::dereg_mr(Ptr::null(), a.mh);
                self.trace
                    .push(format!("deregMr({side:?}) after close -> {rc:?}"));
                if rc != ncclResult_t::ncclInvalidArgument {
                    return Err(self.fail(format!(
                        "deregMr of a registration its closed comm freed returned {}; expected \
                         ncclInvalidArgument",
                        rc_name(rc)
                    )));
                }
            }
        }
        Ok(())
    }

    /// The requests of `side` are gone with its comm.
    fn forget(&mut self, side: Side) {
        match side {
            Side::Send => {
                for s in &mut self.sends {
                    if matches!(s.state, SState::Started(_)) {
                        s.state = SState::Gone;
                    }
                }
            }
            Side::Recv => {
                for g in &mut self.groups {
                    if matches!(g.state, GState::Posted(_)) {
                        g.state = GState::Gone;
                    }
                }
            }
        }
    }

    /// Closes both ends (`first` first) and deregisters every region.
    fn close(&mut self, first: Side, abort: bool) -> Result<(), String> {
        if !abort {
            self.drain()?;
        }
        let second = match first {
            Side::Send => Side::Recv,
            Side::Recv => Side::Send,
        };
        self.close_end(first)?;
        self.close_end(second)?;
        self.dereg_all()
    }

    /// `victim` dies (`crash`) or is closed; the other end must fail within the bound.
    fn lose_peer(&mut self, victim: Side, crash: bool, seed: u64) -> Result<(), String> {
        let survivor = match victim {
            Side::Send => Side::Recv,
            Side::Recv => Side::Send,
        };
        if crash {
            let p = match victim {
                Side::Send => self.send.take(),
                Side::Recv => self.recv.take(),
            };
            self.calls += 1;
            t::crash(p.expect("open"));
            self.trace.push(format!("(the {victim:?} comm dies)"));
            self.forget(victim);
        } else {
            self.close_end(victim)?;
        }
        let t0 = Instant::now();
        let deadline = t0 + self.bounds.death;
        let mut rng = seed | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        // Half the time the survivor calls nothing until the bound has passed (a first call
        // with nothing new in flight must fail at once).
        if next().is_multiple_of(2) {
            std::thread::sleep(self.bounds.death);
        }
        let mut failed: Option<String> = None;
        let mut late_calls = 0;
        let what = if crash { "died" } else { "was closed" };
        while late_calls < 8 {
            let at = Instant::now();
            let late = at >= deadline;
            let (call, outcome) = self.survivor_call(survivor, next())?;
            let since = at - t0;
            match outcome {
                Outcome::Error(rc) => {
                    if rc != ncclResult_t::ncclRemoteError {
                        return Err(self.fail(format!(
                            "{call}, {since:.2?} after the peer {what}, returned {}; expected \
                             ncclRemoteError",
                            rc_name(rc)
                        )));
                    }
                    failed.get_or_insert(call);
                }
                Outcome::Done if failed.is_none() => {}
                other => {
                    if let Some(first) = &failed {
                        return Err(self.fail(format!(
                            "{call} answered {other:?} after {first} had failed (an error must \
                             stick)"
                        )));
                    }
                    if late {
                        return Err(self.fail(format!(
                            "{call} answered {other:?} {since:.2?} after the peer {what}; \
                             every call from {:.2?} on must fail (ncclRemoteError)",
                            self.bounds.death
                        )));
                    }
                }
            }
            if late {
                late_calls += 1;
            }
        }
        self.close_end(survivor)?;
        self.dereg_all()
    }

    /// One call of the survivor, drawn by `r`: start something new, or test something
    /// outstanding.
    fn survivor_call(&mut self, side: Side, r: u64) -> Result<(String, Outcome), String> {
        match side {
            Side::Send => {
                let out: Vec<usize> = (0..self.sends.len())
                    .filter(|&s| matches!(self.sends[s].state, SState::Started(_)))
                    .collect();
                if out.is_empty() || (r.is_multiple_of(3) && out.len() < MAX_SEND_OUT) {
                    self.last_err = None;
                    let heads = self.heads();
                    let s = if heads.is_empty() {
                        // At most the buffer it will fill, if that is wanted already.
                        let k = self.sends_by_tag.get(&0).map_or(0, Vec::len);
                        let cap = self.bufs_by_tag.get(&0).and_then(|v| v.get(k)).copied();
                        let size = cap.map_or(8, |(g, i)| self.groups[g].bufs[i].1.min(8));
                        self.want_send(0, size);
                        self.sends.len() - 1
                    } else {
                        heads[(r / 3) as usize % heads.len()]
                    };
                    let call = format!("isend of send #{s}");
                    let o = match self.try_send(s) {
                        Ok(true) => Outcome::Started,
                        Ok(false) => Outcome::RetryLater,
                        Err(e) => Outcome::Error(self.last_err.take().ok_or(e)?),
                    };
                    Ok((call, o))
                } else {
                    let s = out[(r / 3) as usize % out.len()];
                    self.last_err = None;
                    let call = format!("test of send #{s}");
                    let o = match self.test_send(s) {
                        Ok(true) => Outcome::Done,
                        Ok(false) => Outcome::InProgress,
                        Err(e) => Outcome::Error(self.last_err.take().ok_or(e)?),
                    };
                    Ok((call, o))
                }
            }
            Side::Recv => {
                let out: Vec<usize> = (0..self.groups.len())
                    .filter(|&g| matches!(self.groups[g].state, GState::Posted(_)))
                    .collect();
                if out.is_empty() || (r.is_multiple_of(3) && out.len() < MAX_RECV_OUT) {
                    self.last_err = None;
                    if self.next_post >= self.groups.len() {
                        // At least the send that will fill it, if that is wanted already.
                        let k = self.bufs_by_tag.get(&0).map_or(0, Vec::len);
                        let s = self.sends_by_tag.get(&0).and_then(|v| v.get(k)).copied();
                        let cap = s.map_or(64, |s| self.sends[s].size.max(64));
                        self.want_recv(&[(0, cap)]);
                    }
                    let call = format!("irecv of receive #{}", self.next_post);
                    let o = match self.try_post() {
                        Ok(true) => Outcome::Started,
                        Ok(false) => Outcome::RetryLater,
                        Err(e) => Outcome::Error(self.last_err.take().ok_or(e)?),
                    };
                    Ok((call, o))
                } else {
                    let g = out[(r / 3) as usize % out.len()];
                    self.last_err = None;
                    let call = format!("test of receive #{g}");
                    let o = match self.test_recv(g) {
                        Ok(true) => Outcome::Done,
                        Ok(false) => Outcome::InProgress,
                        Err(e) => Outcome::Error(self.last_err.take().ok_or(e)?),
                    };
                    Ok((call, o))
                }
            }
        }
    }

    /// Closes whatever is still open, ignoring errors (after a failure).
    fn abandon(&mut self) {
        if let Some(p) = self.send.take() {
            let _ = t::close_send(p);
        }
        if let Some(p) = self.recv.take() {
            let _ = t::close_recv(p);
        }
        for side in [Side::Send, Side::Recv] {
            for a in std::mem::take(&mut self.arenas[si(side)])
                .into_iter()
                .flatten()
            {
                let _ = t::dereg_mr(Ptr::null(), a.mh);
            }
        }
    }
}

impl Drop for Conn {
    /// A connection dropped on a failure closes what is still open.
    fn drop(&mut self) {
        self.abandon();
    }
}

/// What one call of a survivor answered.
#[derive(Debug)]
enum Outcome {
    Started,
    RetryLater,
    InProgress,
    Done,
    Error(ncclResult_t),
}

/// The plugin under test: one context, its connections.
pub struct Sut {
    ctx: Option<Ptr>,
    conns: Vec<Option<Conn>>,
    gens: Vec<u64>,
    threads: usize,
    profile: Profile,
    bounds: Bounds,
    fds_before: usize,
}

impl Sut {
    /// `init`, then the setup's connections.
    pub fn new(state: &RefState, profile: Profile, bounds: Bounds) -> Sut {
        let fds_before = t::fds();
        let ctx = t::init(0xe4b1).unwrap_or_else(|rc| panic!("init returned {rc:?}"));
        let mut sut = Sut {
            ctx: Some(ctx),
            conns: (0..state.setup.conns).map(|_| None).collect(),
            gens: vec![0; state.setup.conns],
            threads: state.setup.threads,
            profile,
            bounds,
            fds_before,
        };
        for i in 0..state.setup.conns {
            sut.connect(i);
        }
        sut
    }

    fn connect(&mut self, i: usize) {
        let limit = self.bounds.drain;
        let (s, r) = t::connect_pair(self.ctx.unwrap(), limit)
            .unwrap_or_else(|e| self.die(format!("conn {i}: {e}")));
        self.gens[i] += 1;
        self.conns[i] = Some(Conn::new(i, self.gens[i], s, r, self.bounds));
    }

    fn die(&self, msg: String) -> ! {
        panic!("{msg}");
    }

    fn conn(&mut self, i: usize) -> &mut Conn {
        self.conns[i].as_mut().expect("step on an open connection")
    }

    fn check(&mut self, r: Result<(), String>) {
        if let Err(e) = r {
            self.die(e);
        }
    }

    /// Runs `f` on every open connection, spread over the setup's threads (one thread per
    /// connection at a time; different connections at once).
    fn each(&mut self, f: impl Fn(&mut Conn) -> Result<(), String> + Sync) {
        let threads = self.threads.max(1);
        let mut buckets: Vec<Vec<&mut Conn>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, c) in self.conns.iter_mut().enumerate() {
            if let Some(c) = c.as_mut() {
                buckets[i % threads].push(c);
            }
        }
        let f = &f;
        let errs: Vec<String> = if threads == 1 {
            let mut errs = Vec::new();
            for c in buckets.pop().unwrap() {
                if let Err(e) = f(c) {
                    errs.push(e);
                    break;
                }
            }
            errs
        } else {
            std::thread::scope(|sc| {
                let hs: Vec<_> = buckets
                    .into_iter()
                    .map(|b| {
                        sc.spawn(move || {
                            for c in b {
                                f(c)?;
                            }
                            Ok::<(), String>(())
                        })
                    })
                    .collect();
                hs.into_iter()
                    .filter_map(|h| {
                        h.join()
                            .unwrap_or_else(|p| std::panic::resume_unwind(p))
                            .err()
                    })
                    .collect()
            })
        };
        if let Some(e) = errs.into_iter().next() {
            self.die(e);
        }
    }

    /// Carries out one step.
    pub fn apply(&mut self, step: &Step) {
        let live = self.profile.liveness;
        let b = self.bounds;
        match step {
            Step::Irecv { conn, bufs } => {
                let c = self.conn(*conn);
                c.want_recv(bufs);
                let r = c.try_post().map(drop);
                self.check(r);
            }
            Step::Isend { conn, tag, size } => {
                let c = self.conn(*conn);
                c.want_send(*tag, *size);
                let h = c.head(*tag).expect("a queued send");
                let r = c.try_send(h).map(drop);
                self.check(r);
            }
            Step::RetrySend { conn, pick } => {
                let c = self.conn(*conn);
                let heads = c.heads();
                if !heads.is_empty() {
                    let r = c.try_send(heads[pick % heads.len()]).map(drop);
                    self.check(r);
                }
            }
            Step::RetryRecv { conn } => {
                let r = self.conn(*conn).try_post().map(drop);
                self.check(r);
            }
            Step::Test { conn, side, pick } => {
                let c = self.conn(*conn);
                let r = match side {
                    Side::Send => {
                        let out: Vec<usize> = (0..c.sends.len())
                            .filter(|&s| matches!(c.sends[s].state, SState::Started(_)))
                            .collect();
                        match out.get(pick % out.len().max(1)) {
                            Some(&s) => c.test_send(s).map(drop),
                            None => Ok(()),
                        }
                    }
                    Side::Recv => {
                        let out: Vec<usize> = (0..c.groups.len())
                            .filter(|&g| matches!(c.groups[g].state, GState::Posted(_)))
                            .collect();
                        match out.get(pick % out.len().max(1)) {
                            Some(&g) => c.test_recv(g).map(drop),
                            None => Ok(()),
                        }
                    }
                };
                self.check(r);
            }
            Step::SendOnly { rounds } => {
                self.each(|c| c.spin(true, false, *rounds, live, b.wall));
            }
            Step::RecvOnly { rounds } => {
                self.each(|c| c.spin(false, true, *rounds, live, b.wall));
            }
            Step::Pump { rounds } => self.each(|c| c.spin(true, true, *rounds, false, b.drain)),
            Step::Idle { ms } => std::thread::sleep(Duration::from_millis(u64::from(*ms))),
            Step::RegMr { conn, side } => {
                let r = self.conn(*conn).new_arena(*side, ARENA).map(drop);
                self.check(r);
            }
            Step::DeregMr { conn, side } => {
                let r = self.conn(*conn).dereg_idle(*side);
                self.check(r);
            }
            Step::Close { conn, first, abort } => {
                let r = self.conn(*conn).close(*first, *abort);
                self.conns[*conn] = None;
                self.check(r);
            }
            Step::Crash { conn, side, seed } => {
                let r = self.conn(*conn).lose_peer(*side, true, *seed);
                self.conns[*conn] = None;
                self.check(r);
            }
            Step::CloseOne { conn, side, seed } => {
                let r = self.conn(*conn).lose_peer(*side, false, *seed);
                self.conns[*conn] = None;
                self.check(r);
            }
            Step::Reconnect { conn } => self.connect(*conn),
        }
    }

    /// Drains and closes every connection, finalizes, and checks that every descriptor the
    /// sequence opened is closed again.
    pub fn teardown(mut self) {
        self.each(|c| c.drain());
        for i in 0..self.conns.len() {
            if let Some(mut c) = self.conns[i].take() {
                let r = c.close(Side::Send, true);
                self.check(r);
            }
        }
        let rc = t::finalize(self.ctx.take().unwrap());
        if rc != OK {
            self.die(format!("finalize returned {rc:?}"));
        }
        let fds = t::fds();
        if fds != self.fds_before {
            self.die(format!(
                "{} file descriptors open before the sequence, {fds} after it closed every comm \
                 and finalized",
                self.fds_before
            ));
        }
    }
}

impl Drop for Sut {
    /// After a failure: close what is open so the next sequence starts clean.
    fn drop(&mut self) {
        self.conns.clear();
        if let Some(ctx) = self.ctx.take() {
            let _ = t::finalize(ctx);
        }
    }
}
