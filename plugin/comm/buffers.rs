//! A comm's own registered buffers, in the layout the engine gives
//! ([`crate::engine::wire::SEND_COMM_BUFFERS`], [`crate::engine::wire::recv_comm_buffers`]),
//! allocated before the handshake so their addresses can be announced ([`PeerParams`]), and
//! how the engine reads and the executor writes them.

use std::sync::Arc;

use super::mr::Mr;
use super::pool::BouncePool;
use super::{Class, Error, Op};
use crate::config::Config;
use crate::engine::MemRead;
use crate::transport::Device;

/// What the peer announced about its side in the handshake (see `conn::Hello`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerParams {
    /// Sender → receiver: its CTS ring (addr, rkey).
    pub cts_ring: (u64, u32),
    /// Sender → receiver: its credit word (addr, rkey).
    pub credit_word: (u64, u32),
    /// Sender → receiver: whether it gates on credits.
    pub credits: bool,
    /// Receiver → sender: its record ring (addr, rkey).
    pub rec_ring: (u64, u32),
    /// Receiver → sender: initial credits (receive WRs posted before the reply).
    pub initial_credits: u64,
    /// Receiver → sender: bounce buffer payload size.
    pub eager_buf_size: u64,
    /// First sequence number (chosen by the sender).
    pub first_seq: u64,
    /// The receiver's devices (`1..=MAX_DEVS`, more on a virtual device): the rkeys each buffer
    /// of its CTS entries carries. The sender reads it from the listen handle and the receiver
    /// checks it against its own.
    pub rkeys: u8,
}

/// The sender's protocol buffers, allocated before the handshake so their addresses can be
/// announced.
pub(crate) struct SendBuffers {
    /// Eager-header staging, one slot per request.
    pub(super) hdr: Mr,
    /// Completion-record staging, one slot per request.
    pub(super) rec: Mr,
    /// The CTS ring the receiver writes.
    pub(super) cts_ring: Mr,
    /// The credit word the receiver writes.
    pub(super) credit_word: Mr,
    /// The landing ring the receiver's CTS mirror is RDMA-read into, and the wake word
    /// values ([`crate::engine::wire::LANDING_LEN`]).
    pub(super) landing: Mr,
}

impl SendBuffers {
    /// Allocates and registers the sender's buffers (one registration) for a receiver on
    /// `rkeys` devices (its CTS entries' size).
    ///
    /// # Errors
    /// [`Op::Buffers`]: the allocation or registration failed.
    pub(crate) fn alloc(dev: &dyn Device, rkeys: u8) -> Result<SendBuffers, Error> {
        // The engine's layout: header staging, record staging, CTS ring, credit word, landing
        // ring (and the wake word values).
        let [hdr, rec, cts_ring, credit_word, landing] =
            Mr::alloc_parts(dev, crate::engine::wire::send_comm_buffers(rkeys))?;
        Ok(SendBuffers {
            hdr,
            rec,
            cts_ring,
            credit_word,
            landing,
        })
    }

    /// What the receiver needs to know about our buffers.
    pub(crate) fn announce(&self, cfg: &Config, first_seq: u64) -> PeerParams {
        PeerParams {
            cts_ring: self.cts_ring.remote(),
            credit_word: self.credit_word.remote(),
            credits: cfg.credits,
            first_seq,
            ..PeerParams::default()
        }
    }
}

/// The receiver's protocol buffers and engine, created before the handshake reply so the
/// receive queue is posted before the peer can send.
pub(crate) struct RecvBuffers {
    /// The comm's own `rq_min_depth` bounce buffers.
    pub(super) bounce: Mr,
    /// The record ring the sender writes refusal records into.
    pub(super) rec_ring: Mr,
    /// CTS and credit-write staging.
    pub(super) ctrl: Mr,
    /// Where the buffers above `rq_min_depth` come from.
    pub(super) pool: Arc<BouncePool>,
}

/// The receive depth a comm starts with (and shrinks back to).
pub(super) fn rq_min(cfg: &Config) -> u32 {
    cfg.rq_min_depth.clamp(1, cfg.rq_depth)
}

impl RecvBuffers {
    /// Allocates and registers the comm's own buffers (`rq_min_depth` bounce buffers and the
    /// rings); the full-depth footprint is checked against [`crate::limits::MAX_COMM_BYTES`]
    /// first, and an allocation failure is an error.
    ///
    /// # Errors
    /// [`Op::Limits`] (over a cap) or [`Op::Buffers`].
    /// `rkeys` is the comm's devices (its CTS entries' size).
    pub(crate) fn alloc(
        dev: &Arc<dyn Device>,
        cfg: &Config,
        rkeys: u8,
    ) -> Result<RecvBuffers, Error> {
        crate::limits::check_cap(cfg).map_err(|e| e.lift(Op::Limits))?;
        let stride = crate::engine::wire::bounce_stride(cfg.eager_buf_size.into()) as usize;
        // The engine's layout (the bounce buffers at full depth are what the cap counts).
        let [_, rec, ctrl] =
            crate::engine::wire::recv_comm_buffers(cfg.rq_depth, cfg.eager_buf_size, rkeys)
                .map(|n| n as usize);
        let own = rq_min(cfg) as usize * stride;
        let [bounce, rec_ring, ctrl] = Mr::alloc_parts(&**dev, [own, rec, ctrl])?;
        Ok(RecvBuffers {
            bounce,
            rec_ring,
            ctrl,
            pool: BouncePool::for_device(dev, stride, cfg.rq_pool_size),
        })
    }
}

/// What the receive engine reads: bounce buffers (its own and the pool's) and the record ring.
pub(super) struct RecvMem<'a>(pub(super) &'a RecvBuffers);

impl MemRead for RecvMem<'_> {
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        let b = self.0;
        if Regions(&[&b.bounce, &b.rec_ring]).read(addr, out) {
            return true;
        }
        b.pool
            .slab(addr, out.len() as u64)
            .is_some_and(|s| Regions(&[&*s]).read(addr, out))
    }

    /// One atomic load, the record ring looked at first: the word a pending `test` reads is
    /// the small-send slot's sequence word there (`RecvEngine::poll_small`), and the default
    /// copy through [`MemRead::read`] cost it about 100 instructions per call. An aligned word
    /// of the ring is loaded before any region table is built; the rest (an unaligned word,
    /// the bounce buffers, the pool) goes through the tables.
    #[inline]
    fn read_u64(&self, addr: u64) -> Option<u64> {
        let b = self.0;
        let ring = &b.rec_ring.region;
        if ring.contains(addr, 8) {
            if let Ok(v) = ring.load_u64((addr - ring.addr()) as usize) {
                return Some(v);
            }
        }
        Regions(&[&b.rec_ring, &b.bounce])
            .read_u64(addr)
            .or_else(|| {
                b.pool
                    .slab(addr, 8)
                    .and_then(|s| Regions(&[&*s]).read_u64(addr))
            })
    }
}

/// Registered buffers as one address space for the engine's reads ([`MemRead`]) and the
/// executor's stages.
pub(super) struct Regions<'a>(pub(super) &'a [&'a Mr]);

impl Regions<'_> {
    /// Writes `bytes` at `addr`, inside one of the buffers (a `Stage` action).
    ///
    /// # Errors
    /// An `Internal` error when no buffer holds the range (the engine staged outside its
    /// layout).
    #[inline]
    pub(super) fn stage(&self, addr: u64, bytes: &[u8]) -> Result<(), Error> {
        let o = self
            .0
            .iter()
            .find(|o| o.region.contains(addr, bytes.len() as u64))
            .ok_or_else(|| {
                Error::new(
                    Op::Progress,
                    Class::Internal,
                    format!("stage address {addr:#x} outside protocol buffers"),
                )
            })?;
        o.region
            .write((addr - o.region.addr()) as usize, bytes)
            .map_err(|e| Error::wrap(Op::Progress, Class::Internal, e))
    }
}

impl MemRead for Regions<'_> {
    #[inline]
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        self.0
            .iter()
            .find(|o| o.region.contains(addr, out.len() as u64))
            .is_some_and(|o| {
                o.region
                    .read((addr - o.region.addr()) as usize, out)
                    .is_ok()
            })
    }

    /// One atomic load for an aligned word (the CTS slots' head words and the credit word
    /// are), a copy otherwise.
    #[inline]
    fn read_u64(&self, addr: u64) -> Option<u64> {
        let o = self.0.iter().find(|o| o.region.contains(addr, 8))?;
        let off = (addr - o.region.addr()) as usize;
        o.region.load_u64(off).ok().or_else(|| {
            let mut w = [0u8; 8];
            o.region
                .read(off, &mut w)
                .ok()
                .map(|()| u64::from_le_bytes(w))
        })
    }
}
