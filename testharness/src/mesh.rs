//! `alltoall` over a full mesh of plugin connections, with NCCL's shared comms.
//!
//! Every rank has one send comm to and one receive comm from every other rank. With
//! `--shared-comms K` each connection carries the traffic of K senders of the rank, as NCCL
//! shares one net connection between the local ranks of a node (`NCCL_NET_SHARED_COMMS`, on by
//! default, with PXN): sender `j` sends with tag `j`, in its own order and at its own pace, and
//! the receiving proxy posts one grouped `irecv` per step with one buffer per sender that has a
//! piece in that step (n = K while all have data), the tags in a seeded random order.
//!
//! The senders of a connection drift apart on purpose: each sender's next piece becomes ready
//! ("its GPU finished it") after a seeded random delay of up to `--skew-us`, and each sender may
//! run up to [`SLOTS`] steps ahead in its own FIFO slots, as a local rank of NCCL may. The
//! plugin must then answer "retry later" (a NULL request) for a sender whose tag is not in the
//! oldest posted receive, and never fail (NCCL's IB transport, `net_ib/p2p.cc`). All calls come
//! from one thread, as from NCCL's proxy progress thread.
//!
//! Rank `r`'s input block `p` (elements `[p·per, (p+1)·per)`) lands in rank `p`'s output block
//! `r`; sender `j` carries the `j`-th of K near-equal element ranges of each block, cut into
//! pieces of at most one slot.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use nccl_net_verbsnet::engine::sim::Rng;

use crate::coll::{
    check_size, idle_wait, pieces, segment, Result, CONNECT_TIMEOUT, SLOTS, STALL_TIMEOUT,
};
use crate::plugin::{Fifo, Handle, ListenComm, Net, RecvComm, Request, SendComm, HANDLE_SIZE};

/// The connections to and from one peer.
struct Peer<'n> {
    send: SendComm<'n>,
    recv: RecvComm<'n>,
    /// `SLOTS × K` slots: piece `s` of sender `j` uses slot `(s % SLOTS) · K + j`.
    send_fifo: Fifo<'n>,
    /// The same layout for the receive side.
    recv_fifo: Fifo<'n>,
}

/// How the mesh shares and skews its connections.
#[derive(Clone, Copy, Debug)]
pub struct Sharing {
    /// Senders per connection (1..=8).
    pub senders: usize,
    /// Largest random delay before a sender's next piece is ready, µs.
    pub skew_us: u64,
    /// Seed of the delays and of the tag order inside each grouped receive.
    pub seed: u64,
}

/// This rank's connections to every other rank.
pub struct Mesh<'n> {
    net: &'n Net,
    rank: usize,
    chunk: usize,
    sharing: Sharing,
    calls: u64,
    /// Indexed by peer rank; `None` at our own rank.
    peers: Vec<Option<Peer<'n>>>,
}

/// One sender of one connection during a call.
struct Sender<'n> {
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

/// Pieces of sender `j`'s share of a `block`-byte block of `es`-byte elements.
fn share(block: usize, es: usize, k: usize, j: usize, chunk: usize) -> Vec<(usize, usize)> {
    let (a, b) = segment(block / es, k, j);
    let chunk = (chunk - chunk % es).max(es);
    pieces(a * es, (b - a) * es, chunk).collect()
}

impl<'n> Mesh<'n> {
    /// Listens once per peer (NCCL exchanges one handle per connection). Returns this rank's
    /// `nranks × HANDLE_SIZE` handle bytes (zeros at its own index) for the allgather, and the
    /// listen comms by peer rank.
    ///
    /// # Errors
    /// Plugin errors.
    pub fn listen(
        net: &'n Net,
        dev: i32,
        rank: usize,
        nranks: usize,
    ) -> Result<(Vec<u8>, Vec<Option<ListenComm<'n>>>)> {
        let mut bytes = vec![0u8; nranks * HANDLE_SIZE];
        let mut listens = Vec::with_capacity(nranks);
        for p in 0..nranks {
            if p == rank {
                listens.push(None);
                continue;
            }
            let (h, l) = net.listen(dev)?;
            bytes[p * HANDLE_SIZE..(p + 1) * HANDLE_SIZE].copy_from_slice(&h.0);
            listens.push(Some(l));
        }
        Ok((bytes, listens))
    }

    /// Connects to every peer with the handle it made for us (`all[p]` is rank `p`'s
    /// [`Mesh::listen`] bytes) and accepts every peer on the listen comm made for it, polling
    /// all of them until done, then registers each connection's FIFOs of `SLOTS × K` slots.
    ///
    /// # Errors
    /// Plugin errors, malformed handles, or a timeout.
    pub fn connect(
        net: &'n Net,
        dev: i32,
        rank: usize,
        all: &[Vec<u8>],
        mut listens: Vec<Option<ListenComm<'n>>>,
        chunk: usize,
        sharing: Sharing,
    ) -> Result<Mesh<'n>> {
        let n = all.len();
        let mut handles: Vec<Option<Handle>> = Vec::with_capacity(n);
        for (p, b) in all.iter().enumerate() {
            if p == rank {
                handles.push(None);
                continue;
            }
            let h = b
                .get(rank * HANDLE_SIZE..(rank + 1) * HANDLE_SIZE)
                .and_then(Handle::from_bytes)
                .ok_or_else(|| {
                    format!("rank {p} sent {} handle bytes, not {n} handles", b.len())
                })?;
            handles.push(Some(h));
        }
        let mut sends: Vec<Option<SendComm<'n>>> = (0..n).map(|_| None).collect();
        let mut recvs: Vec<Option<RecvComm<'n>>> = (0..n).map(|_| None).collect();
        let start = Instant::now();
        loop {
            let mut pending = Vec::new();
            for p in (0..n).filter(|&p| p != rank) {
                if sends[p].is_none() {
                    let h = handles[p].as_mut().expect("peer handle");
                    sends[p] = net.connect(dev, h)?;
                }
                if recvs[p].is_none() {
                    let l = listens[p].as_mut().expect("peer listen comm");
                    recvs[p] = net.accept(l)?;
                    if recvs[p].is_some() {
                        net.close_listen(listens[p].take().expect("just used"))?;
                    }
                }
                if sends[p].is_none() || recvs[p].is_none() {
                    pending.push(p);
                }
            }
            if pending.is_empty() {
                break;
            }
            if start.elapsed() > CONNECT_TIMEOUT {
                return Err(format!(
                    "rank {rank}: alltoall mesh incomplete after {CONNECT_TIMEOUT:?}: peers \
                     {pending:?} still connecting or accepting"
                )
                .into());
            }
            std::thread::yield_now();
        }
        let k = sharing.senders;
        let mut peers = Vec::with_capacity(n);
        for (send, recv) in sends.into_iter().zip(recvs) {
            peers.push(match (send, recv) {
                (Some(send), Some(recv)) => {
                    let send_fifo = net.reg_mr(&send, SLOTS * k, chunk)?;
                    let recv_fifo = net.reg_mr(&recv, SLOTS * k, chunk)?;
                    Some(Peer {
                        send,
                        recv,
                        send_fifo,
                        recv_fifo,
                    })
                }
                _ => None,
            });
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
    /// Plugin errors, a piece of the wrong size, or no progress for [`STALL_TIMEOUT`].
    pub fn alltoall(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        block: usize,
        es: usize,
    ) -> Result<()> {
        let me = self.rank;
        output[me * block..(me + 1) * block].copy_from_slice(&input[me * block..(me + 1) * block]);
        let k = self.sharing.senders;
        let skew = self.sharing.skew_us;
        let net = self.net;
        let chunk = self.chunk;
        self.calls += 1;
        let mut rng = Rng(self.sharing.seed ^ (self.calls << 32) ^ (me as u64) << 16);
        let t0 = Instant::now();
        let delay = |rng: &mut Rng| Duration::from_micros(rng.below(skew + 1));
        let shares: Vec<Vec<(usize, usize)>> =
            (0..k).map(|j| share(block, es, k, j, chunk)).collect();
        let steps = shares.iter().map(Vec::len).max().unwrap_or(0);
        // Per peer: K senders, the posted receives, and the next receive step.
        let mut senders: Vec<Vec<Sender<'n>>> = Vec::new();
        let mut posted: Vec<VecDeque<Posted<'n>>> = Vec::new();
        let mut next_step = vec![0usize; self.peers.len()];
        let mut recv_steps_done = vec![0usize; self.peers.len()];
        for p in 0..self.peers.len() {
            senders.push(
                (0..k)
                    .map(|j| Sender {
                        pieces: shares[j]
                            .iter()
                            .map(|&(off, len)| (p * block + off, len))
                            .collect(),
                        next: 0,
                        ready_at: t0 + delay(&mut rng),
                        staged: None,
                        in_flight: VecDeque::new(),
                        done: 0,
                    })
                    .collect(),
            );
            posted.push(VecDeque::new());
        }
        let mut last_progress = Instant::now();
        loop {
            let mut progressed = false;
            let mut all_done = true;
            for (p, peer) in self.peers.iter_mut().enumerate() {
                let Some(peer) = peer.as_mut() else { continue };
                // Receives: post steps ahead into free slots, one grouped irecv per step.
                while next_step[p] < steps && posted[p].len() < SLOTS {
                    let s = next_step[p];
                    let mut members: Vec<usize> = (0..k).filter(|&j| s < shares[j].len()).collect();
                    for i in (1..members.len()).rev() {
                        members.swap(i, rng.below(i as u64 + 1) as usize);
                    }
                    let slots: Vec<usize> = members.iter().map(|&j| (s % SLOTS) * k + j).collect();
                    let caps = vec![chunk; members.len()];
                    let tags: Vec<i32> = members.iter().map(|&j| j as i32).collect();
                    match net.irecv_group(
                        &mut peer.recv,
                        &mut peer.recv_fifo,
                        &slots,
                        &caps,
                        &tags,
                    )? {
                        Some(req) => {
                            posted[p].push_back(Posted {
                                req,
                                step: s,
                                members,
                            });
                            next_step[p] += 1;
                            progressed = true;
                        }
                        None => break,
                    }
                }
                // Test the oldest receive; copy its pieces out at once (frees the slots).
                if let Some(front) = posted[p].front_mut() {
                    if let Some(sizes) = net.test_group(&mut peer.recv_fifo, &mut front.req)? {
                        let s = front.step;
                        for (i, (&j, &got)) in front.members.iter().zip(&sizes).enumerate() {
                            let (off, len) = shares[j][s];
                            check_size(got, len, || {
                                format!("step {s} from rank {p}, buffer {i} (tag {j})")
                            });
                            let slot = (s % SLOTS) * k + j;
                            let data = peer
                                .recv_fifo
                                .slot(slot)
                                .ok_or("completed receive slot still busy")?;
                            output[p * block + off..p * block + off + len]
                                .copy_from_slice(&data[..len]);
                        }
                        posted[p].pop_front();
                        recv_steps_done[p] += 1;
                        progressed = true;
                    }
                }
                if recv_steps_done[p] < steps {
                    all_done = false;
                }
                // Senders: each fills its next slot when its piece is ready, isends it (retry
                // on a NULL request), and tests its oldest send.
                let now = Instant::now();
                for (j, snd) in senders[p].iter_mut().enumerate() {
                    if snd.staged.is_none()
                        && snd.next < snd.pieces.len()
                        && snd.in_flight.len() < SLOTS
                        && now >= snd.ready_at
                    {
                        let (off, len) = snd.pieces[snd.next];
                        let slot = (snd.next % SLOTS) * k + j;
                        let buf = peer
                            .send_fifo
                            .slot_mut(slot)
                            .ok_or("send slot still busy")?;
                        buf[..len].copy_from_slice(&input[off..off + len]);
                        snd.staged = Some(snd.next);
                        snd.next += 1;
                        snd.ready_at = now + delay(&mut rng);
                    }
                    if let Some(i) = snd.staged {
                        let len = snd.pieces[i].1;
                        let slot = (i % SLOTS) * k + j;
                        if let Some(req) =
                            net.isend(&mut peer.send, &mut peer.send_fifo, slot, len, j as i32)?
                        {
                            snd.in_flight.push_back(req);
                            snd.staged = None;
                            progressed = true;
                        }
                    }
                    if let Some(req) = snd.in_flight.front_mut() {
                        if net.test(&mut peer.send_fifo, req)?.is_some() {
                            snd.in_flight.pop_front();
                            snd.done += 1;
                            progressed = true;
                        }
                    }
                    if snd.done < snd.pieces.len() {
                        all_done = false;
                    }
                }
            }
            if all_done {
                return Ok(());
            }
            if progressed {
                last_progress = Instant::now();
            } else if last_progress.elapsed() > STALL_TIMEOUT {
                let report: Vec<String> = (0..self.peers.len())
                    .filter(|&p| p != me)
                    .map(|p| {
                        let sent: Vec<String> = senders[p]
                            .iter()
                            .map(|s| format!("{}/{}", s.done, s.pieces.len()))
                            .collect();
                        format!(
                            "peer {p}: receives {}/{steps}, sends per tag {}",
                            recv_steps_done[p],
                            sent.join(" ")
                        )
                    })
                    .collect();
                return Err(format!(
                    "rank {me}: alltoall made no progress for {STALL_TIMEOUT:?}: {}",
                    report.join("; ")
                )
                .into());
            } else {
                idle_wait(last_progress.elapsed());
            }
        }
    }

    /// deregMr every FIFO, then closeSend and closeRecv of every connection.
    ///
    /// # Errors
    /// Plugin errors.
    pub fn close(self) -> Result<()> {
        let net = self.net;
        for peer in self.peers.into_iter().flatten() {
            net.dereg_mr(&peer.send, peer.send_fifo)?;
            net.dereg_mr(&peer.recv, peer.recv_fifo)?;
            net.close_send(peer.send)?;
            net.close_recv(peer.recv)?;
        }
        Ok(())
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
}
