//! `alltoall` over a full mesh of plugin connections, with NCCL's shared comms.
//!
//! Every rank has connections to and from every other rank. With `--shared-comms K` each rank
//! has K senders per peer (NCCL's local ranks of a node): sender `j` sends with tag `j`, in its
//! own order and at its own pace. How they map onto the plugin is NCCL's decision, from the
//! device's `maxRecvs` (`src/transport/net.cc`: `sendProxyConnect`/`recvProxyConnect` share a
//! connection only when `maxRecvs > 1`; `recvProxyProgress` groups the receives of a shared
//! connection by at most `maxRecvs`), see [`Sharing::shape`]:
//! - `maxRecvs > 1`: one connection per peer carries all K senders, and the receiving proxy
//!   posts per step one grouped `irecv` per group of up to `maxRecvs` senders, one buffer per
//!   member with a piece in that step, the tags in a seeded random order;
//! - `maxRecvs == 1`: no sharing: K connections per peer, one per sender, one receive per step.
//!
//! The senders of a peer drift apart on purpose: each sender's next piece becomes ready ("its
//! GPU finished it") after a seeded random delay of up to `--skew-us`, and each sender may run
//! up to [`SLOTS`] steps ahead in its own FIFO slots, as a local rank of NCCL may. The plugin
//! must then answer "retry later" (a NULL request) for a sender whose tag is not in the oldest
//! posted receive, and never fail (NCCL's IB transport, `net_ib/p2p.cc`). All calls come from
//! one thread, as from NCCL's proxy progress thread; [`Proxy`] says how politely.
//!
//! Rank `r`'s input block `p` (elements `[p·per, (p+1)·per)`) lands in rank `p`'s output block
//! `r`; sender `j` carries the `j`-th of K near-equal element ranges of each block, cut into
//! pieces of at most one slot.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use nccl_net_verbsnet::engine::sim::Rng;

use crate::cli::Proxy;
use crate::coll::{
    check_size, idle_wait, pieces, segment, Result, CONNECT_TIMEOUT, SLOTS, STALL_TIMEOUT,
};
use crate::plugin::{Fifo, Handle, ListenComm, Net, RecvComm, Request, SendComm, HANDLE_SIZE};

/// How the mesh shares and skews its connections.
#[derive(Clone, Copy, Debug)]
pub struct Sharing {
    /// Senders per peer (1..=8).
    pub senders: usize,
    /// Largest random delay before a sender's next piece is ready, µs.
    pub skew_us: u64,
    /// Seed of the delays and of the tag order inside each grouped receive.
    pub seed: u64,
    /// The device's `maxRecvs` (at least 1).
    pub max_recvs: usize,
}

/// How the senders of one peer map onto connections and grouped receives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Per connection to the peer, its senders (sender indices, i.e. tags).
    pub senders: Vec<Vec<usize>>,
    /// Per connection, its receive groups (sender indices): one grouped `irecv` per group and
    /// step.
    pub groups: Vec<Vec<Vec<usize>>>,
}

impl Shape {
    /// Connections per peer.
    pub fn conns(&self) -> usize {
        self.senders.len()
    }

    /// The largest receive group.
    pub fn group(&self) -> usize {
        self.groups
            .iter()
            .flatten()
            .map(Vec::len)
            .max()
            .unwrap_or(1)
    }
}

impl Sharing {
    /// NCCL's mapping of the senders (see the module docs).
    pub fn shape(&self) -> Shape {
        let k = self.senders.max(1);
        let g = self.max_recvs.max(1);
        if k > 1 && g == 1 {
            Shape {
                senders: (0..k).map(|j| vec![j]).collect(),
                groups: (0..k).map(|j| vec![vec![j]]).collect(),
            }
        } else {
            let all: Vec<usize> = (0..k).collect();
            Shape {
                groups: vec![all.chunks(g).map(<[usize]>::to_vec).collect()],
                senders: vec![all],
            }
        }
    }
}

/// One connection to and from a peer.
struct Conn<'n> {
    send: SendComm<'n>,
    recv: RecvComm<'n>,
    /// `SLOTS × senders` slots: piece `s` of the `i`-th sender uses slot `(s % SLOTS) · k + i`.
    send_fifo: Fifo<'n>,
    /// The same layout for the receive side.
    recv_fifo: Fifo<'n>,
    /// Its senders (sender indices).
    senders: Vec<usize>,
    /// Its receive groups.
    groups: Vec<Vec<usize>>,
}

impl Conn<'_> {
    /// The FIFO slot of sender `j`'s piece `step`.
    fn slot(&self, j: usize, step: usize) -> usize {
        let i = self
            .senders
            .iter()
            .position(|&x| x == j)
            .expect("a sender of this connection");
        (step % SLOTS) * self.senders.len() + i
    }
}

/// This rank's connections to every other rank.
pub struct Mesh<'n> {
    net: &'n Net,
    rank: usize,
    chunk: usize,
    sharing: Sharing,
    calls: u64,
    /// Indexed by peer rank; empty at our own rank.
    peers: Vec<Vec<Conn<'n>>>,
}

/// One sender to one peer during a call.
struct Sender<'n> {
    /// Its connection (index into the peer's connections).
    conn: usize,
    /// `(offset, len)` of each piece in the input.
    pieces: Vec<(usize, usize)>,
    next: usize,
    ready_at: Instant,
    staged: Option<usize>,
    in_flight: VecDeque<Request<'n>>,
    done: usize,
}

/// One posted grouped receive: its request, step, and the sender of each buffer.
struct Posted<'n> {
    req: Request<'n>,
    step: usize,
    members: Vec<usize>,
}

/// One receive group of one connection from one peer during a call.
struct Group<'n> {
    conn: usize,
    members: Vec<usize>,
    /// Steps: the most pieces any member has.
    steps: usize,
    next_step: usize,
    posted: VecDeque<Posted<'n>>,
    done: usize,
}

/// Pieces of sender `j`'s share of a `block`-byte block of `es`-byte elements.
fn share(block: usize, es: usize, k: usize, j: usize, chunk: usize) -> Vec<(usize, usize)> {
    let (a, b) = segment(block / es, k, j);
    let chunk = (chunk - chunk % es).max(es);
    pieces(a * es, (b - a) * es, chunk).collect()
}

impl<'n> Mesh<'n> {
    /// Listens once per connection to each peer (NCCL exchanges one handle per connection).
    /// Returns this rank's `nranks × conns × HANDLE_SIZE` handle bytes (zeros at its own index)
    /// for the allgather, and the listen comms by peer rank and connection.
    ///
    /// # Errors
    /// Plugin errors.
    pub fn listen(
        net: &'n Net,
        dev: i32,
        rank: usize,
        nranks: usize,
        conns: usize,
    ) -> Result<(Vec<u8>, Vec<Vec<ListenComm<'n>>>)> {
        let mut bytes = vec![0u8; nranks * conns * HANDLE_SIZE];
        let mut listens = Vec::with_capacity(nranks);
        for p in 0..nranks {
            let mut mine = Vec::new();
            if p != rank {
                for c in 0..conns {
                    let (h, l) = net.listen(dev)?;
                    let at = (p * conns + c) * HANDLE_SIZE;
                    bytes[at..at + HANDLE_SIZE].copy_from_slice(&h.0);
                    mine.push(l);
                }
            }
            listens.push(mine);
        }
        Ok((bytes, listens))
    }

    /// Connects to every peer with the handles it made for us (`all[p]` is rank `p`'s
    /// [`Mesh::listen`] bytes) and accepts every peer on the listen comms made for it, polling
    /// all of them until done, then registers each connection's FIFOs of `SLOTS × senders`
    /// slots.
    ///
    /// # Errors
    /// Plugin errors, malformed handles, or a timeout.
    pub fn connect(
        net: &'n Net,
        dev: i32,
        rank: usize,
        all: &[Vec<u8>],
        listens: Vec<Vec<ListenComm<'n>>>,
        chunk: usize,
        sharing: Sharing,
    ) -> Result<Mesh<'n>> {
        let n = all.len();
        let shape = sharing.shape();
        let nc = shape.conns();
        let mut handles: Vec<Vec<Handle>> = Vec::with_capacity(n);
        for (p, b) in all.iter().enumerate() {
            let mut hs = Vec::new();
            if p != rank {
                for c in 0..nc {
                    let at = (rank * nc + c) * HANDLE_SIZE;
                    let h = b
                        .get(at..at + HANDLE_SIZE)
                        .and_then(Handle::from_bytes)
                        .ok_or_else(|| {
                            format!(
                                "rank {p} sent {} handle bytes, not {n} × {nc} handles",
                                b.len()
                            )
                        })?;
                    hs.push(h);
                }
            }
            handles.push(hs);
        }
        let mut listens: Vec<Vec<Option<ListenComm<'n>>>> = listens
            .into_iter()
            .map(|v| v.into_iter().map(Some).collect())
            .collect();
        let mut sends: Vec<Vec<Option<SendComm<'n>>>> =
            (0..n).map(|_| (0..nc).map(|_| None).collect()).collect();
        let mut recvs: Vec<Vec<Option<RecvComm<'n>>>> =
            (0..n).map(|_| (0..nc).map(|_| None).collect()).collect();
        let start = Instant::now();
        loop {
            let mut pending = Vec::new();
            for p in (0..n).filter(|&p| p != rank) {
                for c in 0..nc {
                    if sends[p][c].is_none() {
                        sends[p][c] = net.connect(dev, &mut handles[p][c])?;
                    }
                    if recvs[p][c].is_none() {
                        let l = listens[p][c].as_mut().expect("peer listen comm");
                        recvs[p][c] = net.accept(l)?;
                        if recvs[p][c].is_some() {
                            net.close_listen(listens[p][c].take().expect("just used"))?;
                        }
                    }
                    if sends[p][c].is_none() || recvs[p][c].is_none() {
                        pending.push((p, c));
                    }
                }
            }
            if pending.is_empty() {
                break;
            }
            if start.elapsed() > CONNECT_TIMEOUT {
                return Err(format!(
                    "rank {rank}: alltoall mesh incomplete after {CONNECT_TIMEOUT:?}: (peer, \
                     connection) {pending:?} still connecting or accepting"
                )
                .into());
            }
            std::thread::yield_now();
        }
        let mut peers = Vec::with_capacity(n);
        for (sends, recvs) in sends.into_iter().zip(recvs) {
            let mut conns = Vec::new();
            for (c, (send, recv)) in sends.into_iter().zip(recvs).enumerate() {
                let (Some(send), Some(recv)) = (send, recv) else {
                    continue;
                };
                let k = shape.senders[c].len();
                let send_fifo = net.reg_mr(&send, SLOTS * k, chunk)?;
                let recv_fifo = net.reg_mr(&recv, SLOTS * k, chunk)?;
                conns.push(Conn {
                    send,
                    recv,
                    send_fifo,
                    recv_fifo,
                    senders: shape.senders[c].clone(),
                    groups: shape.groups[c].clone(),
                });
            }
            peers.push(conns);
        }
        Ok(Mesh {
            net,
            rank,
            chunk,
            sharing,
            calls: 0,
            peers,
        })
    }

    /// One alltoall of `block` bytes per peer (`es`-byte elements): `input` block `p` goes to
    /// rank `p`, rank `p`'s block for us lands in `output` block `p`; our own block is copied.
    ///
    /// # Errors
    /// Plugin errors or no progress for [`STALL_TIMEOUT`].
    pub fn alltoall(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        block: usize,
        es: usize,
        proxy: Proxy,
    ) -> Result<()> {
        let me = self.rank;
        output[me * block..(me + 1) * block].copy_from_slice(&input[me * block..(me + 1) * block]);
        let k = self.sharing.senders;
        self.calls += 1;
        let mut call = Call {
            net: self.net,
            me,
            chunk: self.chunk,
            skew: self.sharing.skew_us,
            rng: Rng(self.sharing.seed ^ (self.calls << 32) ^ (me as u64) << 16),
            shares: (0..k).map(|j| share(block, es, k, j, self.chunk)).collect(),
            senders: Vec::new(),
            groups: Vec::new(),
            last_progress: Instant::now(),
        };
        let t0 = Instant::now();
        for (p, conns) in self.peers.iter().enumerate() {
            let mut senders = Vec::with_capacity(k);
            // Our own rank has no connections (its block was copied above).
            for j in (0..k).filter(|_| !conns.is_empty()) {
                let delay = call.delay();
                senders.push(Sender {
                    conn: conns
                        .iter()
                        .position(|c| c.senders.contains(&j))
                        .unwrap_or(0),
                    pieces: call.shares[j]
                        .iter()
                        .map(|&(off, len)| (p * block + off, len))
                        .collect(),
                    next: 0,
                    ready_at: t0 + delay,
                    staged: None,
                    in_flight: VecDeque::new(),
                    done: 0,
                });
            }
            call.senders.push(senders);
            let mut groups = Vec::new();
            for (c, conn) in conns.iter().enumerate() {
                for g in &conn.groups {
                    groups.push(Group {
                        conn: c,
                        members: g.clone(),
                        steps: g.iter().map(|&j| call.shares[j].len()).max().unwrap_or(0),
                        next_step: 0,
                        posted: VecDeque::new(),
                        done: 0,
                    });
                }
            }
            call.groups.push(groups);
        }
        match proxy {
            Proxy::Eager => call.run_eager(&mut self.peers, output, input),
            Proxy::Lazy => call.run_lazy(&mut self.peers, output, input),
        }
    }

    /// deregMr every FIFO, then closeSend and closeRecv of every connection.
    ///
    /// # Errors
    /// Plugin errors.
    pub fn close(self) -> Result<()> {
        let net = self.net;
        for conn in self.peers.into_iter().flatten() {
            net.dereg_mr(&conn.send, conn.send_fifo)?;
            net.dereg_mr(&conn.recv, conn.recv_fifo)?;
            net.close_send(conn.send)?;
            net.close_recv(conn.recv)?;
        }
        Ok(())
    }
}

/// The state of one alltoall call.
struct Call<'n> {
    net: &'n Net,
    me: usize,
    chunk: usize,
    skew: u64,
    rng: Rng,
    /// Per sender, its pieces of a block (offset in the block, length).
    shares: Vec<Vec<(usize, usize)>>,
    /// Per peer, per sender.
    senders: Vec<Vec<Sender<'n>>>,
    /// Per peer, its receive groups.
    groups: Vec<Vec<Group<'n>>>,
    last_progress: Instant,
}

impl<'n> Call<'n> {
    fn delay(&mut self) -> Duration {
        Duration::from_micros(self.rng.below(self.skew + 1))
    }

    fn all_done(&self) -> bool {
        self.groups.iter().flatten().all(|g| g.done == g.steps)
            && self
                .senders
                .iter()
                .flatten()
                .all(|s| s.done == s.pieces.len())
    }

    /// Posts the next step of group `gi` of peer `p` if a FIFO slot is free; whether it did.
    fn post_receive(&mut self, conns: &mut [Conn<'n>], p: usize, gi: usize) -> Result<bool> {
        let g = &mut self.groups[p][gi];
        if g.next_step >= g.steps || g.posted.len() >= SLOTS {
            return Ok(false);
        }
        let s = g.next_step;
        let conn = &mut conns[g.conn];
        let mut members: Vec<usize> = g
            .members
            .iter()
            .copied()
            .filter(|&j| s < self.shares[j].len())
            .collect();
        for i in (1..members.len()).rev() {
            members.swap(i, self.rng.below(i as u64 + 1) as usize);
        }
        let slots: Vec<usize> = members.iter().map(|&j| conn.slot(j, s)).collect();
        let caps = vec![self.chunk; members.len()];
        let tags: Vec<i32> = members.iter().map(|&j| j as i32).collect();
        let posted =
            self.net
                .irecv_group(&mut conn.recv, &mut conn.recv_fifo, &slots, &caps, &tags)?;
        Ok(match posted {
            Some(req) => {
                g.posted.push_back(Posted {
                    req,
                    step: s,
                    members,
                });
                g.next_step += 1;
                true
            }
            None => false,
        })
    }

    /// Tests the oldest posted receive of group `gi` of peer `p`; when done, copies its pieces
    /// out (which frees their slots). Whether it completed.
    fn test_receive(
        &mut self,
        conns: &mut [Conn<'n>],
        p: usize,
        gi: usize,
        output: &mut [u8],
        block: usize,
    ) -> Result<bool> {
        let g = &mut self.groups[p][gi];
        let Some(front) = g.posted.front_mut() else {
            return Ok(false);
        };
        let conn = &mut conns[g.conn];
        let Some(sizes) = self.net.test_group(&mut conn.recv_fifo, &mut front.req)? else {
            return Ok(false);
        };
        let s = front.step;
        for (i, (&j, &got)) in front.members.iter().zip(&sizes).enumerate() {
            let (off, len) = self.shares[j][s];
            check_size(got, len, || {
                format!("step {s} from rank {p}, buffer {i} (tag {j})")
            });
            let data = conn
                .recv_fifo
                .slot(conn.slot(j, s))
                .ok_or("completed receive slot still busy")?;
            output[p * block + off..p * block + off + len].copy_from_slice(&data[..len]);
        }
        g.posted.pop_front();
        g.done += 1;
        Ok(true)
    }

    /// Fills sender `j`'s next slot to peer `p` when its piece is ready and a slot is free
    /// (`bound`: the highest piece index the proxy allows now).
    fn stage(
        &mut self,
        conns: &mut [Conn<'n>],
        p: usize,
        j: usize,
        input: &[u8],
        bound: usize,
    ) -> Result<()> {
        let now = Instant::now();
        let snd = &self.senders[p][j];
        if snd.staged.is_some()
            || snd.next >= snd.pieces.len()
            || snd.next > bound
            || snd.in_flight.len() >= SLOTS
            || now < snd.ready_at
        {
            return Ok(());
        }
        let delay = self.delay();
        let snd = &mut self.senders[p][j];
        let conn = &mut conns[snd.conn];
        let (off, len) = snd.pieces[snd.next];
        let slot = conn.slot(j, snd.next);
        let buf = conn
            .send_fifo
            .slot_mut(slot)
            .ok_or("send slot still busy")?;
        buf[..len].copy_from_slice(&input[off..off + len]);
        snd.staged = Some(snd.next);
        snd.next += 1;
        snd.ready_at = now + delay;
        Ok(())
    }

    /// One `isend` of sender `j`'s staged piece to peer `p`; whether the plugin took it.
    fn isend(&mut self, conns: &mut [Conn<'n>], p: usize, j: usize) -> Result<bool> {
        let snd = &mut self.senders[p][j];
        let Some(i) = snd.staged else {
            return Ok(false);
        };
        let conn = &mut conns[snd.conn];
        let len = snd.pieces[i].1;
        let slot = conn.slot(j, i);
        match self
            .net
            .isend(&mut conn.send, &mut conn.send_fifo, slot, len, j as i32)?
        {
            Some(req) => {
                snd.in_flight.push_back(req);
                snd.staged = None;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Tests sender `j`'s oldest send to peer `p`; whether it completed.
    fn test_send(&mut self, conns: &mut [Conn<'n>], p: usize, j: usize) -> Result<bool> {
        let snd = &mut self.senders[p][j];
        let Some(req) = snd.in_flight.front_mut() else {
            return Ok(false);
        };
        if self
            .net
            .test(&mut conns[snd.conn].send_fifo, req)?
            .is_some()
        {
            snd.in_flight.pop_front();
            snd.done += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// Fails the call when nothing moved for [`STALL_TIMEOUT`], with each peer's state.
    fn check_stall(&self) -> Result<()> {
        if self.last_progress.elapsed() <= STALL_TIMEOUT {
            return Ok(());
        }
        let report: Vec<String> = (0..self.groups.len())
            .filter(|&p| p != self.me)
            .map(|p| {
                let recvd: Vec<String> = self.groups[p]
                    .iter()
                    .map(|g| format!("{}/{}", g.done, g.steps))
                    .collect();
                let sent: Vec<String> = self.senders[p]
                    .iter()
                    .map(|s| format!("{}/{}", s.done, s.pieces.len()))
                    .collect();
                format!(
                    "peer {p}: receive steps per group {}, sends per tag {}",
                    recvd.join(" "),
                    sent.join(" ")
                )
            })
            .collect();
        Err(format!(
            "rank {}: alltoall made no progress for {STALL_TIMEOUT:?}: {}",
            self.me,
            report.join("; ")
        )
        .into())
    }

    /// The default proxy: every pass, per peer, each receive group posts one receive into a
    /// free slot or, when it posted none, tests its oldest receive, and each sender stages its
    /// next piece and isends it once or, when it started none, tests its oldest send.
    fn run_eager(
        &mut self,
        peers: &mut [Vec<Conn<'n>>],
        output: &mut [u8],
        input: &[u8],
    ) -> Result<()> {
        let block = output.len() / peers.len().max(1);
        loop {
            let mut progressed = false;
            // One step per op, as NCCL's proxy (`src/transport/net.cc`): a receive group
            // posts one receive or, when it posted none, tests its oldest; a sender isends its
            // staged piece or, when it started none, tests its oldest send.
            for (p, conns) in peers.iter_mut().enumerate() {
                for gi in 0..self.groups[p].len() {
                    progressed |= self.post_receive(conns, p, gi)?
                        || self.test_receive(conns, p, gi, output, block)?;
                }
                for j in 0..self.senders[p].len() {
                    self.stage(conns, p, j, input, usize::MAX)?;
                    progressed |= self.isend(conns, p, j)? || self.test_send(conns, p, j)?;
                }
            }
            if self.all_done() {
                return Ok(());
            }
            if progressed {
                self.last_progress = Instant::now();
            } else {
                self.check_stall()?;
                idle_wait(self.last_progress.elapsed());
            }
        }
    }

    /// `--proxy lazy` (see [`Proxy::Lazy`]): every receive slot posted ahead; then every
    /// ready send isent, round-robin over the senders, spinning on "retry later" until all are
    /// taken, no receive tested meanwhile; only then the receives and sends tested, oldest
    /// first, as far as they are done.
    ///
    /// A sender's piece `k` is attempted only while `k < c + SLOTS`, `c` being the fewest steps
    /// this rank has consumed from any peer's group that still has steps to come: a rank then
    /// never spins on a piece whose receive its peer cannot post before this rank consumes, so
    /// with a plugin that takes a send once its receive is posted no two ranks wait for each
    /// other (the peer it waits for has consumed strictly less, which cannot go round in a
    /// circle).
    fn run_lazy(
        &mut self,
        peers: &mut [Vec<Conn<'n>>],
        output: &mut [u8],
        input: &[u8],
    ) -> Result<()> {
        let block = output.len() / peers.len().max(1);
        loop {
            let mut progressed = false;
            // 1. Receives posted ahead into every free slot of every group.
            for (p, conns) in peers.iter_mut().enumerate() {
                for gi in 0..self.groups[p].len() {
                    while self.post_receive(conns, p, gi)? {
                        progressed = true;
                    }
                }
            }
            // 2. Every ready send isent, round-robin over the senders, each retried on "retry
            //    later" until every one is taken; no receive is tested meanwhile. A sender is
            //    its own local rank (its own proxy op) in NCCL, so one refused send must not
            //    hold back another (front-group matching may refuse a tag until the other
            //    tags of the oldest step arrived): a sender with nothing refused tests its own
            //    sends (late: only once its last isend was taken) and stages its next piece.
            let consumed = self
                .groups
                .iter()
                .flatten()
                .filter(|g| g.done < g.steps)
                .map(|g| g.done)
                .min();
            let bound = consumed.map_or(usize::MAX, |c| c + SLOTS - 1);
            let spin = Instant::now();
            loop {
                let mut refused = None;
                for (p, conns) in peers.iter_mut().enumerate() {
                    for j in 0..self.senders[p].len() {
                        if self.senders[p][j].staged.is_none() {
                            while self.test_send(conns, p, j)? {
                                progressed = true;
                            }
                            self.stage(conns, p, j, input, bound)?;
                        }
                        if self.senders[p][j].staged.is_some() {
                            if self.isend(conns, p, j)? {
                                progressed = true;
                            } else {
                                refused = Some((p, j));
                            }
                        }
                    }
                }
                let Some((p, j)) = refused else {
                    break;
                };
                if spin.elapsed() > STALL_TIMEOUT {
                    self.last_progress = spin;
                    return Err(format!(
                        "rank {}: alltoall --proxy lazy: isend of tag {j} to rank {p} answered \
                         \"retry later\" for {STALL_TIMEOUT:?} while every receive was posted \
                         (the plugin must take a send whose receive is posted without the \
                         receiver calling it again); {}",
                        self.me,
                        self.check_stall()
                            .err()
                            .map(|e| e.to_string())
                            .unwrap_or_default()
                    )
                    .into());
                }
                idle_wait(spin.elapsed());
            }
            // 3. Completions, consumed late: receives, then sends, oldest first.
            for (p, conns) in peers.iter_mut().enumerate() {
                for gi in 0..self.groups[p].len() {
                    while self.test_receive(conns, p, gi, output, block)? {
                        progressed = true;
                    }
                }
                for j in 0..self.senders[p].len() {
                    while self.test_send(conns, p, j)? {
                        progressed = true;
                    }
                }
            }
            if self.all_done() {
                return Ok(());
            }
            if progressed {
                self.last_progress = Instant::now();
            } else {
                self.check_stall()?;
                idle_wait(self.last_progress.elapsed());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_the_block_in_element_aligned_pieces() {
        for (block, es, k, chunk) in [
            (4096, 4, 4, 512),
            (100, 4, 8, 16),
            (12, 4, 8, 8),
            (0, 8, 3, 8),
        ] {
            let mut covered = vec![0u8; block];
            for j in 0..k {
                for (off, len) in share(block, es, k, j, chunk) {
                    assert!(len > 0 && len <= chunk && off % es == 0 && len % es == 0);
                    for b in &mut covered[off..off + len] {
                        *b += 1;
                    }
                }
            }
            assert!(covered.iter().all(|&c| c == 1), "{block} {es} {k} {chunk}");
        }
    }

    /// NCCL shares a connection only when maxRecvs > 1, and groups receives by maxRecvs.
    #[test]
    fn the_shape_follows_max_recvs() {
        let sh = |senders, max_recvs| {
            Sharing {
                senders,
                skew_us: 0,
                seed: 0,
                max_recvs,
            }
            .shape()
        };
        let s = sh(4, 8);
        assert_eq!((s.conns(), s.group()), (1, 4));
        assert_eq!(s.groups, vec![vec![vec![0, 1, 2, 3]]]);
        let s = sh(4, 1);
        assert_eq!((s.conns(), s.group()), (4, 1));
        assert_eq!(s.senders, vec![vec![0], vec![1], vec![2], vec![3]]);
        let s = sh(5, 2);
        assert_eq!((s.conns(), s.group()), (1, 2));
        assert_eq!(s.groups, vec![vec![vec![0, 1], vec![2, 3], vec![4]]]);
        let s = sh(1, 1);
        assert_eq!((s.conns(), s.group()), (1, 1));
    }
}
