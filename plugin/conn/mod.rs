//! Connection set-up: the listen handle and the non-blocking connect/accept state machines.
//!
//! NCCL's contract (ext-net README): `listen` fills an opaque 128-byte handle that NCCL ships to
//! the peer; `connect` and `accept` must not block — they return success with a NULL comm
//! until the connection is ready, and NCCL calls them again with the same handle / listen
//! comm. A connect's state waits between calls in the registry of the plugin context that
//! made it ([`Connects`]), under an id stored in the handle's last 8 bytes (NCCL IB keeps its
//! connect state in the handle too); an id the registry does not know starts a fresh connect,
//! so a forged handle is never dereferenced.
//!
//! By concern:
//! - [`handle`]: the 128-byte handle's layout and codec;
//! - `hello`: the handshake messages and their non-blocking framed I/O;
//! - [`listen`]: the listen comm, its pending handshakes and rate-limited refusals (`refusals`):
//!   a listener no bad client can break;
//! - [`connect`]: one connect's state machine, and [`Connects`], the parked connects of one
//!   plugin context, freed at its `finalize` and at their deadline.
//!
//! ## Handshake over the out-of-band TCP stream
//! 1. sender → receiver: `Hello` (nonce, QP info, CTS ring and credit word addresses/rkeys,
//!    credit gating, first sequence number);
//! 2. the receiver creates its QP, **posts its receive queue**, moves the QP to RTR/RTS, and
//!    replies with its `Hello` (QP info, record ring, initial credits, bounce buffer size);
//! 3. the sender moves its QP to RTR/RTS and sends `RDY!`; it hands its comm to NCCL;
//! 4. the receiver reads `RDY!` and hands its comm to NCCL.
//!
//! So neither comm exists before both QPs are ready and the receive queue is posted: the
//! first `isend` can never outrun the peer's receive resources.

pub mod connect;
pub mod handle;
mod hello;
pub mod listen;
mod refusals;

use crate::comm::Failure;
use crate::config::Config;
use crate::transport::QpConfig;

pub use connect::Connects;
pub use handle::{Handle, HANDLE_SIZE};
pub use hello::HELLO_VERSION;
pub use listen::{Listen, HELLO_DEADLINE, MAX_PENDING_HANDSHAKES, REFUSAL_LOG_INTERVAL};

/// The set-up step that failed (listen, accept, connect and their handshake stages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Reading the 128-byte handle NCCL passed to `connect`.
    Handle,
    /// Opening the listening socket.
    Listen,
    /// Accepting connections (the listener's own failures and its deadline).
    Accept,
    /// The TCP connect to the listener, and the connect's deadline.
    Connect,
    /// Exchanging hellos (QP info, buffers) with the peer.
    Hello,
    /// Creating or connecting the QP.
    QpSetup,
    /// Allocating and registering the comm's protocol buffers.
    Buffers,
}

/// An error of connection set-up.
pub type Error = Failure<Stage>;

/// The QP settings every connection asks for under `cfg` (public so that `verbsnet-perf doctor`
/// checks them against the device's limits).
pub fn qp_config(cfg: &Config) -> QpConfig {
    // Sender: data WRs (2 per rendezvous) for every request slot; receiver: CTS and credit writes.
    // Receiver: the bounce-backed WRs of the full depth, and the zero-length ones that cover
    // the posted receive buffers (`engine::MAX_ZERO_WRS`).
    QpConfig {
        max_recv_wr: cfg.rq_depth + crate::engine::MAX_ZERO_WRS,
        max_send_wr: 2 * crate::engine::MAX_SEND_REQUESTS as u32
            + crate::engine::CTRL_STAGE_SLOTS as u32,
        min_rnr_timer: cfg.rnr_timer,
        rnr_retry: cfg.rnr_retry,
        timeout: cfg.ib_timeout,
        retry_cnt: cfg.ib_retry_cnt,
        traffic_class: cfg.ib_tc,
        service_level: cfg.ib_sl,
        oob_keepalive: cfg.socket_keepalive,
    }
}
