//! Transports behind one verbs-shaped interface.
//!
//! The protocol engine (`crate::engine`) decides *what* to post; a transport carries it out with
//! the semantics of an RC queue pair (QP):
//!
//! - a SEND or RDMA_WRITE_WITH_IMM consumes exactly one posted receive WR at the peer; with none
//!   posted the peer answers RNR ("receiver not ready"), the sender waits the RNR timer and
//!   retries up to `rnr_retry` times (7 = forever, IB spec), then completes the WR with
//!   [`WcStatus::RnrRetryExceeded`] and the QP enters the error state;
//! - an RDMA_WRITE lands only inside a region registered at the peer whose rkey and bounds match,
//!   otherwise the WR completes with [`WcStatus::RemoteAccess`] and nothing is written;
//! - work requests on one QP execute, and their completions appear, in posting order;
//! - after the first error completion every later WR completes with [`WcStatus::WrFlush`].
//!
//! Implementations: [`tcp`] (a userspace stand-in over TCP sockets, for hosts without RDMA) and
//! `ib` (libibverbs, resolved at run time).
//!
//! Threading: a [`QueuePair`] is driven by one thread at a time (NCCL's progress thread for that
//! comm). A [`Device`] is shared: `reg_mr`/`dereg_mr` arrive from NCCL's service thread while a
//! progress thread polls a QP of the same device, so devices are `Send + Sync`.

use std::fmt;
use std::net::{IpAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use crate::mem::Region;

#[doc(hidden)]
pub mod conformance;
pub mod ib;
pub mod tcp;

/// Longest the listening side of a tcp data QP waits in [`QueuePair::establish_data`] for its
/// peer's connection: the peer connects before it sends the reply that makes the listening
/// side call it, so the connection normally waits in the backlog already.
pub const DATA_ACCEPT_TIMEOUT: Duration = Duration::from_secs(10);

/// Most SGEs the engine puts in one send WR (header + payload for an eager SEND).
pub const MAX_SEND_SGE: usize = 2;

/// One scatter/gather element: `length` bytes at local virtual address `addr`, covered by the
/// memory region whose local key is `lkey`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Local virtual address of the first byte.
    pub addr: u64,
    /// Length in bytes (0 is legal).
    pub length: u32,
    /// Local key of the registered region that contains `[addr, addr + length)`.
    pub lkey: u32,
}

/// The operation of a send WR (names as in `ibv_wr_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOpcode {
    /// Two-sided SEND: lands in the buffer of the peer's next posted receive WR.
    Send,
    /// One-sided write into the peer's registered memory; consumes no receive WR.
    RdmaWrite {
        /// Peer virtual address of the first byte written.
        remote_addr: u64,
        /// The peer region's remote key.
        rkey: u32,
    },
    /// Write plus a 32-bit immediate delivered as a receive completion
    /// ([`WcOpcode::RecvRdmaWithImm`]); consumes one receive WR at the peer.
    RdmaWriteWithImm {
        /// Peer virtual address of the first byte written.
        remote_addr: u64,
        /// The peer region's remote key.
        rkey: u32,
        /// Immediate data (host order here; transports put it on the wire big-endian).
        imm: u32,
    },
    /// One-sided read of the peer's registered memory: [`SendWr::byte_len`] bytes from
    /// `[remote_addr, remote_addr + len)` into the local SGE (`IBV_WR_RDMA_READ`,
    /// `ibv_post_send(3)`). Consumes no receive WR and needs nothing from the peer's process:
    /// its NIC (or the tcp transport's progress) answers. At most one SGE and never inline (a
    /// WR breaking either rule fails the whole post with [`TransportError::Resource`], nothing
    /// of it posted). Completes as [`WcOpcode::RdmaRead`] once the bytes are in local memory,
    /// `byte_len` the bytes read; a bad `rkey` or range completes it `RemoteAccess`. The read
    /// sees every WRITE posted before it on the same QP (the responder executes a QP's
    /// requests in order). Verbs devices keep at most `max_rd_atomic` reads in flight per QP
    /// (1 here); later WRs wait behind them. The tcp transport carries at most 1 MiB per
    /// READ (a longer one completes `LocalLength`).
    /// The send engine READs the receiver's CTS mirror with it (docs/protocol.md, "The pulled
    /// clear-to-send").
    RdmaRead {
        /// Peer virtual address of the first byte read.
        remote_addr: u64,
        /// The peer region's remote key.
        rkey: u32,
    },
}

/// A send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Returned unchanged in the completion.
    pub wr_id: u64,
    /// Gather list; only the first `num_sge` entries are used.
    pub sgl: [Sge; MAX_SEND_SGE],
    /// Number of valid entries in `sgl` (0..=`MAX_SEND_SGE`).
    pub num_sge: u8,
    /// What to do with the gathered bytes.
    pub opcode: SendOpcode,
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
    /// Post the payload inline (verbs: `IBV_SEND_INLINE`, `ibv_post_send(3)`): the transport
    /// copies the gathered bytes during [`QueuePair::post_send`], so the memory the SGEs name
    /// may be reused (or deregistered) as soon as the post returns, and a retransmission
    /// sends the copy. At most [`QueuePair::max_inline_data`] bytes in all: a longer inline WR
    /// fails the whole post ([`TransportError::Resource`], naming the size and the limit)
    /// before any WR of it is posted, so nothing of it is sent. The SGEs must still name
    /// registered memory on tcp (it checks their lkeys at the post: an SGE outside every
    /// registered region completes the WR with [`WcStatus::LocalProtection`]); verbs ignores
    /// the lkey.
    pub inline: bool,
}

impl SendWr {
    /// A WR of one SGE (the control WRITEs and READs of the protocol), unsignaled and not
    /// inline: set `signaled` and `inline` with struct update syntax where they differ.
    #[must_use]
    pub fn one(wr_id: u64, sge: Sge, opcode: SendOpcode) -> SendWr {
        SendWr {
            wr_id,
            sgl: [sge, Sge::default()],
            num_sge: 1,
            opcode,
            signaled: false,
            inline: false,
        }
    }

    /// The valid part of the gather list.
    pub fn sges(&self) -> &[Sge] {
        &self.sgl[..usize::from(self.num_sge).min(MAX_SEND_SGE)]
    }

    /// Total bytes gathered.
    pub fn byte_len(&self) -> u64 {
        self.sges().iter().map(|s| u64::from(s.length)).sum()
    }

    /// What makes this WR an illegal RDMA READ (inline, or more than one SGE), `None` for a
    /// legal one or another opcode: both transports refuse such a post
    /// ([`SendOpcode::RdmaRead`]).
    pub fn bad_read(&self) -> Option<&'static str> {
        if !matches!(self.opcode, SendOpcode::RdmaRead { .. }) {
            None
        } else if self.inline {
            Some("an RDMA READ cannot be inline")
        } else if self.num_sge > 1 {
            Some("an RDMA READ has at most one SGE")
        } else {
            None
        }
    }
}

/// A receive work request with one SGE (the bounce buffer it may fill).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned unchanged in the completion.
    pub wr_id: u64,
    /// Where an incoming SEND's bytes go; `length` is the capacity.
    pub sge: Sge,
}

/// Completion status (names follow `ibv_wc_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    /// The WR completed.
    Success,
    /// An incoming SEND was longer than the receive buffer (`IBV_WC_LOC_LEN_ERR`).
    LocalLength,
    /// A local SGE did not match a registered region (`IBV_WC_LOC_PROT_ERR`).
    LocalProtection,
    /// Local QP failure (`IBV_WC_LOC_QP_OP_ERR`).
    LocalQpOperation,
    /// Flushed because the QP is in the error state (`IBV_WC_WR_FLUSH_ERR`).
    WrFlush,
    /// The peer rejected an RDMA access: bad rkey or out of bounds (`IBV_WC_REM_ACCESS_ERR`).
    RemoteAccess,
    /// The peer found the request malformed (`IBV_WC_REM_INV_REQ_ERR`).
    RemoteInvalidRequest,
    /// The peer failed to carry out the operation (`IBV_WC_REM_OP_ERR`).
    RemoteOperation,
    /// Transport retries exhausted: the peer is unreachable or dead (`IBV_WC_RETRY_EXC_ERR`).
    RetryExceeded,
    /// RNR retries exhausted: the peer had no receive WR posted (`IBV_WC_RNR_RETRY_EXC_ERR`).
    RnrRetryExceeded,
    /// Any other status, with the verbs code.
    Other(u32),
}

impl WcStatus {
    /// True when the failure lies with the peer or the path to it (→ `ncclRemoteError`), false
    /// for a local failure (→ `ncclSystemError`).
    pub fn is_remote(self) -> bool {
        matches!(
            self,
            WcStatus::RemoteAccess
                | WcStatus::RemoteInvalidRequest
                | WcStatus::RemoteOperation
                | WcStatus::RetryExceeded
                | WcStatus::RnrRetryExceeded
        )
    }

    /// What an operator should do about this status.
    pub fn hint(self) -> &'static str {
        match self {
            WcStatus::Success => "none",
            WcStatus::RnrRetryExceeded => {
                "the receiver had no receive WR posted: raise VERBSNET_RQ_DEPTH, turn credit \
                 gating on (VERBSNET_CREDITS=1) or raise VERBSNET_RNR_RETRY"
            }
            WcStatus::RetryExceeded => {
                "the peer stopped answering: it died, or the network path is down \
                 (check the peer's log and the link)"
            }
            WcStatus::RemoteAccess => {
                "the peer rejected an RDMA write: its buffer was deregistered or is smaller than \
                 the data"
            }
            WcStatus::LocalLength => "a message was longer than the receive buffer",
            WcStatus::LocalProtection => "a local buffer was not registered (regMr) or was freed",
            WcStatus::WrFlush => "flushed after an earlier error on the same QP",
            WcStatus::LocalQpOperation => {
                "the local QP could not send: its port or link went down, or (rxe) a \
                 retransmission could not leave the host (check `rdma link` and `ip link`)"
            }
            _ => "see the first error completion on this QP",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            WcStatus::Success => "IBV_WC_SUCCESS",
            WcStatus::LocalLength => "IBV_WC_LOC_LEN_ERR",
            WcStatus::LocalProtection => "IBV_WC_LOC_PROT_ERR",
            WcStatus::LocalQpOperation => "IBV_WC_LOC_QP_OP_ERR",
            WcStatus::WrFlush => "IBV_WC_WR_FLUSH_ERR",
            WcStatus::RemoteAccess => "IBV_WC_REM_ACCESS_ERR",
            WcStatus::RemoteInvalidRequest => "IBV_WC_REM_INV_REQ_ERR",
            WcStatus::RemoteOperation => "IBV_WC_REM_OP_ERR",
            WcStatus::RetryExceeded => "IBV_WC_RETRY_EXC_ERR",
            WcStatus::RnrRetryExceeded => "IBV_WC_RNR_RETRY_EXC_ERR",
            WcStatus::Other(c) => return write!(f, "ibv_wc_status({c})"),
        };
        f.write_str(s)
    }
}

/// What completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOpcode {
    /// A SEND WR of ours.
    Send,
    /// An RDMA_WRITE or RDMA_WRITE_WITH_IMM WR of ours.
    RdmaWrite,
    /// A receive WR consumed by the peer's SEND.
    Recv,
    /// A receive WR consumed by the peer's RDMA_WRITE_WITH_IMM.
    RecvRdmaWithImm,
    /// An RDMA_READ WR of ours: the bytes it read are in local memory.
    RdmaRead,
}

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wc {
    /// The `wr_id` of the completed WR.
    pub wr_id: u64,
    /// Success or the failure.
    pub status: WcStatus,
    /// What completed (meaningful only on success for receives).
    pub opcode: WcOpcode,
    /// Bytes received (receives), bytes read (a successful RDMA READ), or 0.
    pub byte_len: u32,
    /// The immediate data of an RDMA_WRITE_WITH_IMM.
    pub imm: Option<u32>,
}

/// Keys of a registered memory region.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MrKeys {
    /// Local key, used in our SGEs.
    pub lkey: u32,
    /// Remote key, given to the peer for RDMA writes into the region.
    pub rkey: u32,
}

/// A registered memory region; dropping it deregisters the region.
pub trait MemoryRegion: Send + Sync {
    /// The region's keys.
    fn keys(&self) -> MrKeys;
}

/// Queue-pair settings (defaults and reasons in `docs/configuration.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QpConfig {
    /// Receive queue capacity in WRs.
    pub max_recv_wr: u32,
    /// Send queue capacity in WRs.
    pub max_send_wr: u32,
    /// IB-encoded minimum RNR NAK timer (0..=31; 12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// RNR retries before `RnrRetryExceeded` (0..=7, 7 = forever).
    pub rnr_retry: u8,
    /// Largest inline send WR asked for ([`SendWr::inline`]; verbs: `cap.max_inline_data` at
    /// QP creation). The transport may grant less (the device's limit, or 0 where it refuses
    /// inline sends): [`QueuePair::max_inline_data`] says what it granted.
    pub max_inline_data: u32,
    /// IB-encoded local ACK timeout (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Transport retries before `RetryExceeded` (0..=7).
    pub retry_cnt: u8,
    /// GRH traffic class (RoCE: the IP header's DSCP/ECN byte); `VERBSNET_IB_TC` or the
    /// communicator's `trafficClass`.
    pub traffic_class: u8,
    /// Service level (`VERBSNET_IB_SL`, 0..=15).
    pub service_level: u8,
    /// TCP keepalive bound on the connection's set-up ("oob") socket (`VERBSNET_SOCKET_KEEPALIVE`;
    /// `None` = off): `establish` turns keepalive on (ib: the set-up socket; tcp: the same
    /// socket, its data stream) so that a peer host that goes silent makes
    /// [`QueuePair::peer_closed`] true within it while the connection is idle.
    pub oob_keepalive: Option<Duration>,
}

/// Counters a transport keeps per QP (the engine keeps its own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCounters {
    /// RNR NAKs this QP received as a sender (each is one retry after the RNR timer).
    pub rnr_naks_received: u64,
    /// RNR NAKs this QP sent because no receive WR was posted.
    pub rnr_naks_sent: u64,
    /// `post_recv` calls.
    pub post_recv_calls: u64,
    /// Receive WRs posted.
    pub recv_wrs_posted: u64,
}

/// Device-level RNR counters read from the device (rxe: sysfs `hw_counters`). Absent fields: the
/// device has no such counter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceRnrCounters {
    /// `rcvd_rnr_err`: RNR NAKs received.
    pub rcvd_rnr_err: Option<u64>,
    /// `send_rnr_err`: RNR NAKs sent.
    pub send_rnr_err: Option<u64>,
    /// `retry_rnr_exceeded_err`: WRs that exhausted their RNR retries.
    pub retry_rnr_exceeded_err: Option<u64>,
}

/// Properties reported through `getProperties` (units as in `ncclNetProperties_v8_t`). The ib
/// transport fills them as NCCL IB does (`transport::ib::props`, from
/// `src/transport/net_ib/init.cc`): NCCL's topology trusts them (`src/graph/search.cc` shares
/// the bandwidth of nets with equal `guid` and `port`; `src/graph/xml.cc` keys nets by `name`
/// and places them by `pci_path`).
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceProps {
    /// NCCL's `name`: ib: the verbs device, without the port (`mlx5_0`, `rxe0`), as NCCL IB;
    /// tcp: `tcp0`, `tcp1`, ...
    pub name: String,
    /// sysfs path of the PCI device with the function merged to `.0` (and virtual functions
    /// into their card), as NCCL IB; `None` for tcp and software devices (rxe).
    pub pci_path: Option<String>,
    /// The NIC chip (ib: `sys_image_guid` as `ibv_query_device` stores it, unswapped, as NCCL
    /// IB); the functions and ports of one card share it.
    pub guid: u64,
    /// Link speed in Mbps.
    pub speed_mbps: i32,
    /// NCCL's `port`: ib: the verbs port plus the number of earlier devices on the same card
    /// (NCCL IB's `realPort`), so that the functions of a multi-port card are distinct
    /// (`guid`, `port`) pairs; tcp: 1.
    pub port: i32,
    /// Latency in microseconds (0 = NCCL's default).
    pub latency_us: f32,
    /// Max connections (NCCL caps its channels on this NIC by it).
    pub max_comms: i32,
}

/// Transport failures outside completions.
#[derive(Debug)]
pub enum TransportError {
    /// A system call failed.
    Io {
        /// The operation, e.g. "ibv_post_send" or "connect 10.0.0.1:4000".
        op: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The peer broke the protocol or sent malformed data.
    Protocol(String),
    /// The peer closed the connection.
    PeerClosed(String),
    /// A local resource limit was hit (queue full, device limit).
    Resource(String),
    /// The device or library is missing or unusable.
    Unavailable(String),
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportError::Io { op, source } => write!(f, "{op}: {source}"),
            TransportError::Protocol(m) => write!(f, "protocol error: {m}"),
            TransportError::PeerClosed(m) => write!(f, "peer closed the connection: {m}"),
            TransportError::Resource(m) => write!(f, "resource limit: {m}"),
            TransportError::Unavailable(m) => write!(f, "unavailable: {m}"),
        }
    }
}

impl std::error::Error for TransportError {}

/// Result of transport calls.
pub type Result<T> = std::result::Result<T, TransportError>;

/// One device of a transport: memory registration and QP creation. Shared between threads.
pub trait Device: Send + Sync {
    /// Properties for `getProperties`.
    fn props(&self) -> DeviceProps;

    /// Registers `region` for local access and remote writes. The returned region deregisters
    /// when dropped. Errors: the device refused (e.g. `ibv_reg_mr` ENOMEM).
    fn reg_mr(&self, region: Region) -> Result<Arc<dyn MemoryRegion>>;

    /// Creates a QP (RESET→INIT for verbs). Its out-of-band connection info is
    /// [`QueuePair::local_info`]; it becomes usable after [`QueuePair::establish`].
    fn create_qp(&self, cfg: &QpConfig) -> Result<Box<dyn QueuePair>>;

    /// Most QPs (each with its own CQ) the device can hold at all, where it says
    /// (ib: the smaller of `ibv_device_attr::max_qp` and `max_cq`); connection set-up refuses
    /// a `VERBSNET_IB_QPS_PER_CONNECTION` above it with an error naming the knob.
    fn max_qps(&self) -> Option<u32> {
        None
    }

    /// The link layer, for `makeVDevice`, which joins only devices of one (NCCL IB:
    /// `ncclIbMakeVDeviceInternal`, `net_ib/init.cc`): ib `"InfiniBand"` or `"Ethernet"`
    /// (RoCE), tcp `"tcp"`.
    fn link_layer(&self) -> &'static str {
        "tcp"
    }

    /// The [`QpConfig::max_inline_data`] a send comm asks of this device when
    /// `VERBSNET_INLINE_SIZE` is unset: ib [`crate::config::INLINE_SIZE_IB`] (the default),
    /// tcp [`crate::config::INLINE_SIZE_TCP`].
    fn default_max_inline_data(&self) -> u32 {
        crate::config::INLINE_SIZE_IB
    }

    /// Device-wide RNR counters, where the device exposes them.
    fn rnr_counters(&self) -> DeviceRnrCounters {
        DeviceRnrCounters::default()
    }
}

/// An RC queue pair with its own completion queue. Driven by one thread at a time.
pub trait QueuePair: Send {
    /// Bytes the peer needs to connect to this QP (verbs: QPN, PSN, GID, LID, MTU). Sent in the
    /// connection handshake. At most 256 bytes.
    fn local_info(&self) -> Vec<u8>;

    /// Connects to the peer described by `remote` (its `local_info`) and moves the QP to
    /// ready-to-send. `oob` is the handshake's TCP stream, already in non-blocking mode: the tcp
    /// transport carries its frames on it; verbs keep it to notice a dead peer.
    /// Receive WRs posted before this call are honoured. The caller may still read or write
    /// `oob` (its own dup) to finish its handshake until [`QueuePair::handshake_complete`] or
    /// its first data-path call on the QP (a post, a poll, a batch, goodbye), whichever comes
    /// first: from then on the tcp transport reads the stream on its own too (its progress
    /// thread, whenever the owner is not polling).
    fn establish(&mut self, remote: &[u8], oob: TcpStream) -> Result<()>;

    /// Makes this QP a *data QP* (QP 1 and up of a connection,
    /// `VERBSNET_IB_QPS_PER_CONNECTION`) whose peer reaches it: the connecting side calls it
    /// right after `create_qp`, before [`QueuePair::local_info`]. A data QP carries only plain
    /// RDMA WRITEs (no receive WR is ever consumed on it) and has no set-up stream of its own.
    ///
    /// - tcp: the QP listens on an ephemeral port of `local` (the set-up stream's local
    ///   address) and its `local_info` carries that address and a random token; the peer's
    ///   [`QueuePair::establish_data`] connects there and presents the token.
    /// - ib: nothing to do (the default).
    ///
    /// # Errors
    /// tcp: the listening socket could not be opened.
    fn listen_data(&mut self, local: IpAddr) -> Result<()> {
        let _ = local;
        Ok(())
    }

    /// Connects a data QP (see [`QueuePair::listen_data`]) to the peer described by `remote`
    /// and moves it to ready-to-send; no set-up stream: the connection's QP 0 watches the peer.
    ///
    /// - tcp: the side whose peer listens (the accepting side: `remote` carries an address and
    ///   a token) connects, writes the token and returns; the side that listens (it called
    ///   `listen_data`) accepts one connection within [`DATA_ACCEPT_TIMEOUT`] and checks its
    ///   token. The stream becomes the QP's own data stream, so each QP of a connection is an
    ///   independent byte stream, as each verbs QP is an independent flow.
    /// - ib: RTR/RTS as [`QueuePair::establish`], without a stream.
    ///
    /// # Errors
    /// The peer's info is malformed or of another kind; tcp: the connect, the accept (its
    /// timeout) or the token failed.
    fn establish_data(&mut self, remote: &[u8]) -> Result<()>;

    /// The caller's handshake on `oob` is over (the plugin: the acceptor read the connector's
    /// ready message, the connector wrote it): the QP now progresses on its own even if its
    /// owner never calls it again, as a NIC does (tcp: its progress thread takes the QP; verbs
    /// NICs always do, the default does nothing). Receives posted before `establish` then
    /// take messages with no further call.
    fn handshake_complete(&mut self) {}

    /// Posts send WRs in order. Errors: the SQ is full, or the QP is in the error state; an
    /// inline WR ([`SendWr::inline`]) longer than [`QueuePair::max_inline_data`] refuses the
    /// whole list (`Resource`, nothing posted). An inline WR's bytes are copied before this
    /// returns.
    fn post_send(&mut self, wrs: &[SendWr]) -> Result<()>;

    /// Posts receive WRs in one call (one `ibv_post_recv` with a chain). Legal before
    /// [`QueuePair::establish`].
    fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<()>;

    /// Makes progress and appends up to `max` completions to `out`; returns how many.
    /// Never blocks.
    fn poll_cq(&mut self, out: &mut Vec<Wc>, max: usize) -> Result<usize>;

    /// Opens a batch of calls (a comm: one plugin entry). Until [`QueuePair::end_batch`] the
    /// QP may hold back what it would send on its own, so that it leaves with the sends the
    /// batch posts: the tcp transport holds the ACKs `poll_cq` generates until the next
    /// `post_send` (one `sendmsg` for both) or the batch's end. Verbs NICs acknowledge in
    /// hardware: nothing to hold (the default).
    fn begin_batch(&mut self) {}

    /// Whether [`QueuePair::begin_batch`] and [`QueuePair::end_batch`] do anything on this
    /// QP (asked once, when a comm is made: a comm whose QPs hold nothing back skips the two
    /// calls on every entry).
    fn batches(&self) -> bool {
        false
    }

    /// Closes the batch: sends whatever [`QueuePair::begin_batch`] let the QP hold back.
    /// Never blocks. A caller that opens a batch must close it, or the peer's sends wait.
    fn end_batch(&mut self) {}

    /// Announces an orderly close before the owner drops the QP (a comm's `closeSend` /
    /// `closeRecv`): best effort and non-blocking. The peer's
    /// [`QueuePair::peer_closed_orderly`] turns true if the announcement reaches it before the
    /// connection closes; a QP dropped without it looks to the peer exactly like a process
    /// death (this is how tests emulate `kill -9`). After it the QP is closing: further posts
    /// may be refused, and it is meant to be dropped next. Idempotent.
    ///
    /// - tcp: a BYE frame on the data stream, behind every frame already staged (messages not
    ///   yet started are never sent), then nothing more; written without blocking, the rest by
    ///   the device's progress thread while the QP lives.
    /// - ib: an 8-byte marker on the set-up stream (which carries nothing else after the
    ///   handshake); WRs already posted are left to the QP's destruction.
    fn goodbye(&mut self);

    /// True once the peer is gone: its QP closed (orderly or not, see
    /// [`QueuePair::peer_closed_orderly`]), its process exited or died, or its host stopped
    /// answering. From then on every outstanding and later WR completes (with an error, as
    /// flushed or retried-out), none hangs: on tcp the QP fails as soon as it learns of the
    /// close, on ib this call moves the QP to the error state.
    fn peer_closed(&self) -> bool;

    /// True once the peer's [`QueuePair::goodbye`] arrived (then [`QueuePair::peer_closed`]
    /// is true too): the peer closed in order, it did not die. A peer that drops its QP without
    /// goodbye, or dies, never makes it true.
    fn peer_closed_orderly(&self) -> bool;

    /// Once [`QueuePair::peer_closed`] is true: how the peer went, in words for the error, when
    /// the transport can tell more than "it closed" (the ib transport's set-up socket keepalive
    /// expiring means the peer host or its link went silent, not that its process exited).
    fn peer_gone_reason(&self) -> Option<&'static str> {
        None
    }

    /// Per-QP counters.
    fn counters(&self) -> QpCounters;

    /// The largest [`SendWr::inline`] WR this QP takes, in bytes: what the transport granted of
    /// [`QpConfig::max_inline_data`] (verbs: the `cap.max_inline_data` `ibv_create_qp` wrote
    /// back; tcp: the request, capped at the size it copies into its frames). 0: no inline WR.
    fn max_inline_data(&self) -> u32 {
        0
    }
}

/// Why a comm failed when the keepalive of its connection's socket expired
/// ([`QueuePair::peer_gone_reason`]).
pub(crate) const PEER_SILENT: &str = "the peer host stopped answering (no TCP keepalive reply on \
                                      the connection's socket within \
                                      VERBSNET_SOCKET_KEEPALIVE): it lost power, or its link or \
                                      the path to it is down";

/// Turns on TCP keepalive on a connection's socket (the ib transport's set-up socket, the tcp
/// transport's data stream) so that a peer HOST that goes silent (power loss, cut link: no FIN,
/// no RST) makes [`QueuePair::peer_closed`] true within `bound` while the connection is idle,
/// even when no WR is in flight for a retry timer to expire (receives never time out; a sender
/// waiting for credits or a CTS posts nothing). The peer's kernel answers the probes, so a busy
/// or stopped peer process does not trip it. Probes: first after `bound / 2` idle, then every
/// `bound / 10`, 5 unanswered ones => ETIMEDOUT (`tcp(7)`: TCP_KEEPIDLE, TCP_KEEPINTVL,
/// TCP_KEEPCNT; whole seconds, at least 1).
pub(crate) fn set_keepalive(stream: &TcpStream, bound: Duration) -> std::io::Result<()> {
    let secs = bound.as_secs().max(2);
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs((secs / 2).max(1)))
        .with_interval(Duration::from_secs((secs / 10).max(1)))
        .with_retries(5);
    socket2::SockRef::from(stream).set_tcp_keepalive(&ka)
}

/// Human label of a transport kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Real verbs.
    Ib,
    /// The userspace TCP stand-in.
    Tcp,
}

impl Kind {
    /// Lower-case name as used in `VERBSNET_TRANSPORT`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Ib => "ib",
            Kind::Tcp => "tcp",
        }
    }
}
