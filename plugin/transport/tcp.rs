//! The tcp transport: verbs semantics over a TCP stream, for hosts without RDMA.
//!
//! One [`TcpDevice`] (`tcp0`) holds a memory registry and a "NIC": a background thread that
//! carries on the QPs their owners are not polling. Each QP carries its frames on the
//! non-blocking stream of its connection handshake. Everything (sending, receiving,
//! acknowledging, RNR retransmission, noticing a close) happens inside the owner's calls
//! ([`QueuePair::poll_cq`] above all) while the owner polls, and in the device's thread
//! while it does not (`nic`: a QP not polled for 1 ms and not inside its owner's batch), so a
//! send completes whatever the receiving process does next, as on a NIC. No call ever blocks;
//! an owner waits for the thread for at most one non-blocking socket call. No `unsafe` code:
//! memory is touched only through the bounds-checked [`Region`] of a registration (copies, and
//! socket I/O straight into or out of the raw range: [`crate::mem`]).
//!
//! # Semantics (RC, as in `plugin/transport/mod.rs`)
//!
//! - **Keys.** One key per registration, used as both lkey and rkey: random, unique and
//!   nonzero on the device, and not one of the last 65,536 freed. Dropping the [`MemoryRegion`] handle
//!   deregisters it (from any thread, also while a QP polls).
//! - **Deregistration.** A QP (its owner's calls or the device's thread alike) reads or writes
//!   registered memory only while holding the registry's read lock and after checking that the
//!   key is still registered, so once the drop of a [`MemoryRegion`] has returned, no QP
//!   touches that memory again (a drop waits for at most one non-blocking socket call). A destination deregistered while a message lands
//!   is treated like a bad rkey (NAK, nothing more written); a source deregistered while its
//!   WR is being sent (an application bug) fails that WR with `LocalProtection` and shuts the
//!   connection down, because the frame can be neither finished nor cut short.
//! - **Sending.** `post_send` only queues. Each WR gets the next message sequence number (PSN,
//!   `u32`, wrapping; the first is random and travels in `local_info`). `poll_cq` resolves its
//!   SGEs in the registry (an inline WR's: at the post, below) when it puts the message on the wire (an SGE outside every registered
//!   region: `LocalProtection`; more than 1 GiB in all: `LocalLength`). Payloads up to 16 KiB
//!   are copied into the out-buffer with their header; a larger one is gathered straight from
//!   registered memory behind it, so everything ready in one flush (control frames, several
//!   messages, a large payload) leaves in one `sendmsg`. A signaled WR completes when the peer
//!   acknowledges it; an unsignaled one completes only on error. Completions appear in posting
//!   order. The peer acknowledges after carrying a message out (ACKs are cumulative and
//!   coalesced; a message flagged unsignaled is acknowledged only with the next frame the peer
//!   sends anyway, the next ACK it owes, or its goodbye, so that an unsignaled WRITE costs no
//!   `sendmsg` of its own: its WR leaves the send queue when a later one is acknowledged, as
//!   on a NIC, where an unsignaled WR is outstanding until a later completion is polled), inside its owner's `poll_cq` or, while its owner does not poll, in its
//!   device's thread (1-2 ms after the owner's last poll; at most 16 ms after a long run of
//!   polling): a send completes whether or not the peer's owner ever calls again. Inside a caller's batch (`begin_batch` … `end_batch`: one comm entry) those
//!   ACKs wait for the batch's next `post_send`, and leave in its `sendmsg`, or for the batch's
//!   end; the thread never services a QP inside its owner's batch.
//! - **Inline sends.** A WR with `inline` set ([`crate::transport::SendWr::inline`], at most
//!   [`QueuePair::max_inline_data`] bytes: `QpConfig::max_inline_data` capped at 16 KiB, the
//!   size copied into the out-buffer anyway) is gathered by `post_send` itself: its SGEs are
//!   resolved in the registry and their bytes copied into the WR's send-queue entry then (an
//!   SGE outside every registered region: the WR completes `LocalProtection` in its turn).
//!   Its frame, first sent and every retransmission after an RNR NAK, carries that copy, so
//!   the source may be overwritten or deregistered as soon as `post_send` returns, as with
//!   `IBV_SEND_INLINE`. A longer inline WR refuses the whole post (`Resource`): no WR of that
//!   post is queued or sent. On the wire an inline message is an ordinary data frame.
//! - **Receiving.** A SEND or RDMA WRITE with immediate consumes the oldest posted receive WR.
//!   SEND data goes to the receive WR's buffer (`byte_len` = message length, opcode `Recv`);
//!   WRITE-with-immediate data goes to `remote_addr` (rkey and bounds checked), and the receive
//!   WR completes `RecvRdmaWithImm` with `imm` and `byte_len` = write length. Payloads are read
//!   from the socket straight into their destination; headers and small payloads (under
//!   16 KiB) go through a 64 KiB staging buffer, in reads of at most 16 KiB so that little of a
//!   large payload behind them is copied twice. A read that returns less than it asked for ends
//!   the poll's reading (the socket is drained; no extra call for `EAGAIN`), and the next
//!   `poll_cq`, if it comes within 100 µs, does not read at all (never two polls in a row):
//!   a caller polling in a tight loop pays about half the `EAGAIN` reads, and bytes wait at
//!   most one poll.
//! - **RNR.** With no receive WR posted, the responder counts `rnr_naks_sent`, answers RNR_NAK
//!   carrying its `min_rnr_timer`, and discards that message and every later one until the
//!   message comes again (go-back-N). The requester counts `rnr_naks_received`, waits the
//!   decoded timer (IB table: 0 = 655.36 ms, 1 = 0.01 ms ... 31 = 491.52 ms), then resends from
//!   that message, re-reading the source memory (an inline WR: its copy from the post). A WR NAKed more than `rnr_retry` times (7 =
//!   forever) completes `RnrRetryExceeded`.
//! - **Responder errors.** The responder NAKs and enters the error state, writing nothing:
//!
//!   | what the responder found | responder's receive WR | requester's WR |
//!   |---|---|---|
//!   | SEND longer than the receive buffer | `LocalLength` | `RemoteInvalidRequest` |
//!   | receive WR's SGE not registered | `LocalProtection` | `RemoteOperation` |
//!   | WRITE outside a registered region / bad rkey | (none consumed) | `RemoteAccess` |
//!   | WRITE_IMM outside a registered region | `LocalProtection` | `RemoteAccess` |
//!
//!   Zero-length writes check neither rkey nor address (as in IB), and a zero-length SEND does
//!   not look at the receive WR's SGE.
//! - **Error state.** Entered on the first failed WR, a responder error, a malformed frame, or
//!   a lost connection. The failing WR completes with its status, every other outstanding or
//!   later WR with `WrFlush`. A malformed or out-of-protocol frame (bad magic, version, opcode,
//!   reserved field, length over 1 GiB, unexpected PSN, ACK/NAK for a message not outstanding)
//!   completes the oldest WR of each queue with `RemoteInvalidRequest` (the peer is at fault),
//!   and a NAK is sent so a conforming peer learns why. EOF or a socket error sets
//!   `peer_closed()`; outstanding send WRs complete `RetryExceeded`, receives `WrFlush`. A QP
//!   in the error state keeps reading and dropping bytes (to notice EOF) and accepts new WRs,
//!   which complete with `WrFlush`. A send WR whose payload is half written when the QP fails
//!   completes only after that frame is out (its memory stays in use until its completion).
//! - **Closing.** [`QueuePair::goodbye`] queues a BYE frame behind the frames already staged
//!   (a large payload being written is finished first; a message not yet started is never
//!   sent), writes what the socket takes without blocking (the device's thread writes the rest
//!   while the QP lives), sends nothing after it and refuses later posts (`Unavailable`).
//!   Dropping the QP shuts the stream down at once, so the peer sees EOF exactly as at a
//!   process death. A BYE that arrives fails the QP as EOF does (sends `RetryExceeded`,
//!   receives `WrFlush`: nothing after it will be acknowledged or arrive) and makes both
//!   `peer_closed()` and `peer_closed_orderly()` true; EOF alone is a death. A QP already in
//!   the error state drops what it reads (it may have lost the stream's framing), so a BYE
//!   arriving after a failure reads as a plain close.
//! - **Limits.** `post_send`/`post_recv` refuse a whole batch that would exceed
//!   `max_send_wr`/`max_recv_wr`, or that holds an inline WR over `max_inline_data` or an
//!   illegal RDMA READ (`TransportError::Resource`); `post_send` before
//!   `establish` is refused (`Unavailable`).
//! - **RDMA READ.** The responder reads the bytes when it carries the request out and sends
//!   them in a READ_RESP frame queued with its ACKs and NAKs (so it precedes the
//!   acknowledgement of any later message, as an IB READ response does; the requester treats
//!   an acknowledgement past a READ still waiting as a protocol error). A READ longer than
//!   1 MiB (`READ_MAX`: the response is copied) completes `LocalLength` unsent, and a peer
//!   that leaves more than 4 MiB of responses unread is declared broken.
//! - **Not modelled.** `QpConfig::timeout` and `retry_cnt` (an ACK timeout). With the
//!   device's thread a missing ACK is no longer only a peer that has not polled, but this
//!   "NIC" lives in the peer's process: a peer that is alive but stopped (a debugger, SIGSTOP,
//!   a checkpoint) or starved of CPU for seconds acknowledges nothing, where a real NIC still
//!   would, so an ACK timeout would call a live peer dead. What it would catch is covered
//!   otherwise: a dead peer process closes its sockets (EOF at once); a peer host that goes
//!   silent is TCP's to notice: TCP keepalive on the stream (`QpConfig::oob_keepalive`,
//!   `VERBSNET_SOCKET_KEEPALIVE`, as the ib transport sets on its set-up socket) fails an idle
//!   connection within that bound (`peer_gone_reason` says so), and with data in flight TCP's
//!   own retransmission timeout applies (`tcp_retries2`, minutes).
//!
//! # Wire format
//!
//! `local_info` (12 bytes), exchanged in the connection handshake:
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 4 | magic `"VNTQ"` |
//! | 4 | 1 | wire version (4) |
//! | 5 | 3 | QP number (24 bits, big-endian, nonzero) |
//! | 8 | 4 | PSN of the first message this QP sends (big-endian) |
//!
//! A data QP whose peer connects to it (`QueuePair::listen_data`: QPs 1 and up of a
//! connection, on its connecting side) adds 27 bytes: address family (4 or 6), 16 address
//! bytes (IPv4 in the first 4), port and a random 64-bit token (big-endian). Its peer's
//! `establish_data` connects there and writes the token first; the listening side's accepts
//! (within `DATA_ACCEPT_TIMEOUT`, skipping connections with another token) and checks it. So
//! each QP of a connection has its own TCP stream (QP 0: the set-up stream), and the QPs are
//! as independent as verbs QPs: no order holds between them.
//!
//! Then each direction of the stream is a sequence of frames: a 32-byte header, all fields
//! big-endian, followed by `length` payload bytes for the data opcodes:
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 2 | magic `0x564e` (`"VN"`) |
//! | 2 | 1 | version (4; 3 had no RDMA READ, 2 no unsignaled flag, 1 no BYE frame; a peer of another version is refused at `establish`) |
//! | 3 | 1 | opcode |
//! | 4 | 4 | PSN |
//! | 8 | 4 | length: payload bytes (at most 2^30), 0 for control frames; READ_REQ: the bytes asked for (no payload follows) |
//! | 12 | 4 | rkey (WRITE, WRITE_IMM, READ_REQ; else 0) |
//! | 16 | 8 | remote address (WRITE, WRITE_IMM, READ_REQ; else 0) |
//! | 24 | 4 | immediate (WRITE_IMM; else 0) |
//! | 28 | 1 | syndrome: RNR timer code (RNR_NAK), NAK code (NAK); else 0 |
//! | 29 | 1 | flags: bit 0 = unsignaled (SEND, WRITE, WRITE_IMM: the requester's WR needs no prompt ACK); other bits and other opcodes 0 |
//! | 30 | 2 | reserved, 0 |
//!
//! | opcode | name | meaning of PSN |
//! |---|---|---|
//! | `0x01` | SEND | the message's sequence number |
//! | `0x02` | WRITE | the message's sequence number |
//! | `0x03` | WRITE_IMM | the message's sequence number |
//! | `0x04` | READ_REQ | the message's sequence number (an RDMA READ: the responder answers with READ_RESP) |
//! | `0x14` | READ_RESP | the READ_REQ answered; `length` bytes read follow. Acknowledges every message before it; queued with the ACKs and NAKs, so it precedes any later one |
//! | `0x10` | ACK | last message carried out (cumulative; sent after processing, coalesced) |
//! | `0x11` | RNR_NAK | message refused for want of a receive WR; earlier ones are acknowledged |
//! | `0x12` | NAK | message that failed; earlier ones are acknowledged; the sender of the NAK is in the error state. Codes: 1 remote access, 2 invalid request, 3 remote operational error |
//! | `0x13` | BYE | 0. The sender closes its QP in order ([`QueuePair::goodbye`]): every frame it will send came before this one (after the frames it had already staged), and the connection closes next. All other fields 0 |
//!
//! Every header is validated before use: magic, version, opcode, the length cap, and that every
//! field the opcode does not use is zero.
//!
//! Version 2 added BYE. A version-1 peer would take a BYE for a malformed frame (a protocol
//! error at close, with a misleading message), so the versions do not mix: `establish` refuses
//! a peer whose `local_info` names another version ("tcp wire version 1 of the peer is not 2
//! (mixed plugin versions?)"), before any frame flows.

#![forbid(unsafe_code)]

mod nic;
mod qp;
mod registry;
mod wire;

#[cfg(test)]
mod tests;

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use self::nic::{Nic, TcpQueuePair};
use self::qp::TcpQp;
use self::registry::{Registry, TcpMr};
use crate::config::Config;
use crate::mem::Region;
use crate::transport::TransportError;
use crate::transport::{Device, DeviceProps, MemoryRegion, QpConfig, QueuePair, Result};

/// A tcp "device": a memory registry and a QP factory. Cheap; shared between threads.
pub struct TcpDevice {
    index: u32,
    registry: Arc<Registry>,
    /// The background progress of its QPs; `None` only in white-box tests.
    nic: Option<Arc<Nic>>,
}

impl TcpDevice {
    /// Device number `index`, named `tcp<index>`.
    pub fn new(index: u32) -> TcpDevice {
        TcpDevice {
            index,
            registry: Arc::new(Registry::new(
                (u64::from(random_u32()) << 32) | u64::from(random_u32()),
            )),
            nic: Some(Nic::new(format!("tcp{index}"))),
        }
    }

    /// A device whose QPs progress only inside their owner's calls (white-box tests that
    /// stage a race by hand and must not have the NIC thread move data meanwhile).
    #[cfg(test)]
    fn without_nic(index: u32) -> TcpDevice {
        TcpDevice {
            nic: None,
            ..TcpDevice::new(index)
        }
    }
}

impl Device for TcpDevice {
    /// `tcp<n>`, no PCI path, a fixed GUID per device number, 10 Gbps (a nominal figure: the
    /// real rate is whatever the TCP path gives; NCCL only uses it to weigh NICs against each
    /// other), port 1, NCCL's default latency, 65536 comms.
    fn props(&self) -> DeviceProps {
        DeviceProps {
            name: format!("tcp{}", self.index),
            pci_path: None,
            guid: GUID_BASE + u64::from(self.index),
            speed_mbps: SPEED_MBPS,
            port: 1,
            latency_us: 0.0,
            max_comms: MAX_COMMS,
        }
    }

    fn reg_mr(&self, region: Region) -> Result<Arc<dyn MemoryRegion>> {
        Ok(Arc::new(TcpMr::register(&self.registry, region)?))
    }

    fn default_max_inline_data(&self) -> u32 {
        crate::config::INLINE_SIZE_TCP
    }

    /// The QP grants `max_inline_data` up to 16 KiB (a larger request is capped, not refused).
    ///
    /// # Errors
    /// `Resource` when an attribute is out of range: `max_send_wr`/`max_recv_wr` above
    /// 1,048,576, `min_rnr_timer` above 31, `rnr_retry` above 7.
    fn create_qp(&self, cfg: &QpConfig) -> Result<Box<dyn QueuePair>> {
        let bad = |what: String| Err(TransportError::Resource(format!("tcp create_qp: {what}")));
        if cfg.max_send_wr > MAX_QP_WR || cfg.max_recv_wr > MAX_QP_WR {
            return bad(format!(
                "max_send_wr {} / max_recv_wr {} exceed the device limit {MAX_QP_WR}",
                cfg.max_send_wr, cfg.max_recv_wr
            ));
        }
        if cfg.min_rnr_timer > 31 {
            return bad(format!(
                "min_rnr_timer {} is not in 0..=31",
                cfg.min_rnr_timer
            ));
        }
        if cfg.rnr_retry > 7 {
            return bad(format!("rnr_retry {} is not in 0..=7", cfg.rnr_retry));
        }
        let qp_num = loop {
            let n = random_u32() & 0x00ff_ffff;
            if n != 0 {
                break n;
            }
        };
        let core = TcpQp::new(
            qp_num,
            random_u32(),
            cfg.clone(),
            Arc::clone(&self.registry),
        );
        Ok(Box::new(TcpQueuePair::new(core, self.nic.clone())))
    }
}

/// The tcp devices: `VERBSNET_TCP_DEVICES` of them (default one), `tcp0` first, each with its
/// own key registry (a key of one is unknown to the others, as on separate NICs).
pub fn open_devices(cfg: &Config) -> Vec<Arc<dyn Device>> {
    // The data path is the handshake's stream; devices differ only in their keys and names.
    (0..u32::from(cfg.tcp_devices.max(1)))
        .map(|i| Arc::new(TcpDevice::new(i)) as Arc<dyn Device>)
        .collect()
}

/// A random value (key and QP-number starts, initial PSNs); not for cryptography.
fn random_u32() -> u32 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    h.finish() as u32
}

/// GUID of `tcp0` (`"tcp"` in the high bytes); `tcp<n>` adds `n`.
const GUID_BASE: u64 = 0x7463_7000_0000_0001;

/// Reported link speed: 10 Gbps, a nominal figure.
const SPEED_MBPS: i32 = 10_000;

/// Reported `maxComms`.
const MAX_COMMS: i32 = 65_536;

/// Largest `max_send_wr`/`max_recv_wr` (keeps PSN windows far below 2^31).
const MAX_QP_WR: u32 = 1 << 20;
