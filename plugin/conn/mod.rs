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
//! 1. sender → receiver: `Hello` (nonce, the QP count and split flag
//!    (`VERBSNET_IB_QPS_PER_CONNECTION` × the larger device count of both sides, a virtual
//!    device's from `makeVDevice`; `VERBSNET_IB_SPLIT_DATA_ON_QPS`), both sides' device counts
//!    (the receiver's read from the handle, which sized the CTS ring), one QP info per QP (QP
//!    `q` on device `q % devices`), CTS ring and credit word addresses/rkeys, credit gating,
//!    first sequence number, the traffic class and SL the receiver adopts:
//!    [`traffic_class_and_sl`]);
//! 2. the receiver checks the device count the sender read from its handle, creates as many
//!    QPs (QP `q` on its device `q % devices`) with the sender's traffic class and SL (adopting the
//!    sender's count and split, an INFO line when its own setting differs), **posts its receive
//!    queue** (QP 0's; data QPs get theirs in `irecv`), moves every QP to RTR/RTS (tcp: each data QP
//!    connects its own stream to the sender's data QP), and replies with its `Hello` (one QP
//!    info per QP, record ring, initial credits, bounce buffer size, the traffic class, SL,
//!    count and split echoed);
//! 3. the sender moves its QPs to RTR/RTS (tcp: its data QPs accept the receiver's streams)
//!    and sends `RDY!`; it hands its comm to NCCL;
//! 4. the receiver reads `RDY!` and hands its comm to NCCL.
//!
//! So neither comm exists before both QPs are ready and the receive queue is posted: the
//! first `isend` can never outrun the peer's receive resources.

pub mod connect;
pub mod handle;
mod hello;
pub mod listen;
mod refusals;

use std::sync::Arc;

use crate::comm::{Class, Failure};
use crate::config::Config;
use crate::transport::{Device, QpConfig, QueuePair};

// The knob's range and the engine's bound are one number.
const _: () = assert!(
    crate::config::MAX_QPS_PER_CONNECTION as usize == crate::engine::MAX_QPS_PER_CONNECTION
);

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

/// The traffic class and service level a connecting side uses under `cfg`, by NCCL IB's rule
/// (`ncclIbConnectImpl`, `src/transport/net_ib/connect.cc`, NCCL 2.30.7), with
/// `VERBSNET_IB_TC`/`VERBSNET_IB_SL` in the place of `NCCL_IB_TC`/`NCCL_IB_SL`:
///
/// - traffic class: the knob when set, else the communicator's `trafficClass` when NCCL
///   passed one, else 0;
/// - SL: the knob when set, else the communicator's `trafficClass` itself, else 0 (the knob
///   `VERBSNET_IB_TC` never feeds the SL). NCCL IB puts the traffic class unmasked into the
///   4-bit SL field and the device keeps the low bits (mlx5: 4 on InfiniBand, 3 as the
///   priority on RoCE); verbsnet keeps the low 4 bits itself, so the SL it prints and carries
///   is the one on the wire.
///
/// The accepting side does not apply this rule: it adopts the values the connecting side's
/// hello carries (`hello::Hello::tc`/`sl`), as NCCL IB's receiver adopts the sender's
/// (`ncclIbAccept`: `rtrAttr->tc`/`sl` from the remote metadata).
pub fn traffic_class_and_sl(cfg: &Config) -> (u8, u8) {
    let comm = cfg.comm_traffic_class;
    let tc = cfg.ib_tc.or(comm).unwrap_or(0);
    let sl = cfg.ib_sl.or(comm.map(|t| t & 0x0f)).unwrap_or(0);
    (tc, sl)
}

/// The QP settings a connecting side asks for under `cfg` (public so that `verbsnet-perf
/// doctor` checks them against the device's limits); the accepting side replaces the traffic
/// class and SL with the connecting side's.
pub fn qp_config(cfg: &Config) -> QpConfig {
    let (traffic_class, service_level) = traffic_class_and_sl(cfg);
    // Sender: data WRs (2 per rendezvous) for every request slot; receiver: CTS and credit writes.
    // Receiver: the bounce-backed WRs of the full depth, and the zero-length ones that cover
    // the posted receive buffers (`engine::MAX_ZERO_WRS`).
    QpConfig {
        max_recv_wr: cfg.rq_depth + crate::engine::MAX_ZERO_WRS,
        max_send_wr: 2 * crate::engine::MAX_SEND_REQUESTS as u32
            + crate::engine::CTRL_STAGE_SLOTS as u32,
        max_inline_data: cfg.inline_size.unwrap_or(crate::config::INLINE_SIZE_IB),
        min_rnr_timer: cfg.rnr_timer,
        rnr_retry: cfg.rnr_retry,
        timeout: cfg.ib_timeout,
        retry_cnt: cfg.ib_retry_cnt,
        traffic_class,
        service_level,
        oob_keepalive: cfg.socket_keepalive,
    }
}

/// The settings of a connection's data QPs (QPs 1 and up, `VERBSNET_IB_QPS_PER_CONNECTION`)
/// from its QP 0's `qp0`: they carry only RDMA WRITE WITH IMMs of payload pieces. The sending
/// side needs no receive queue (0 WRs; ib rounds up to 1) and room for one WR per send request
/// ([`crate::engine::MAX_SEND_REQUESTS`]: a send puts at most one WR on each data QP); the
/// receiving side never sends on them (1) and keeps the zero-length receive WRs those writes
/// consume ([`crate::engine::DATA_QP_RECV_WRS`]). Their CQs are sized from these (ib: send +
/// receive WRs), so every completion fits.
pub fn data_qp_config(qp0: &QpConfig, sender: bool) -> QpConfig {
    QpConfig {
        max_recv_wr: if sender {
            0
        } else {
            crate::engine::DATA_QP_RECV_WRS
        },
        max_send_wr: if sender {
            crate::engine::MAX_SEND_REQUESTS as u32
        } else {
            1
        },
        // Only QP 0 carries inline sends (a send of one WR there).
        max_inline_data: 0,
        ..qp0.clone()
    }
}

/// The QP count of a connection the connecting side makes with `cfg` from `devs` devices to
/// a listener on `peer_devs`: `VERBSNET_IB_QPS_PER_CONNECTION` × the larger device count, as
/// NCCL IB (`ncclIbConnect`, `src/transport/net_ib/connect.cc`: `nqps = qpsPerConn ×
/// max(local ndevs, remote ndevs)`), so every device of both sides gets QPs.
///
/// # Errors
/// [`Stage::QpSetup`] when that exceeds [`crate::engine::MAX_QPS_PER_CONNECTION`].
fn conn_qps(cfg: &Config, devs: usize, peer_devs: u8) -> Result<usize, Error> {
    let per = usize::from(cfg.ib_qps_per_connection);
    let d = qp_devices(devs, peer_devs);
    let n = per * d;
    if n > crate::engine::MAX_QPS_PER_CONNECTION {
        return Err(Error::new(
            Stage::QpSetup,
            Class::Usage,
            format!(
                "VERBSNET_IB_QPS_PER_CONNECTION={per} × {d} devices (a virtual device) makes \
                 {n} QPs per connection, above {}; lower VERBSNET_IB_QPS_PER_CONNECTION",
                crate::engine::MAX_QPS_PER_CONNECTION
            ),
        ));
    }
    Ok(n)
}

/// The device count a connection's QPs are spread over: the larger of both sides' (each gets
/// `VERBSNET_IB_QPS_PER_CONNECTION` QPs per device of it, [`conn_qps`]; the receiver compares
/// what its own setting would make with the sender's count).
fn qp_devices(devs: usize, peer_devs: u8) -> usize {
    devs.max(usize::from(peer_devs)).max(1)
}

/// Creates the `n` QPs of one connection, QP `i` on `devs[i % devs.len()]` (NCCL IB's
/// `devIndex = qpIndex % ndevs`, `net_ib/connect.cc`; one device: all on it), QP 0 with `qp0`,
/// the others with [`data_qp_config`], after checking each device's share against its limit
/// ([`Device::max_qps`]).
///
/// # Errors
/// [`Stage::QpSetup`], naming `VERBSNET_IB_QPS_PER_CONNECTION` when a device's share is above
/// its limit or a data QP cannot be created (the device ran out of QPs or CQs).
fn create_qps(
    devs: &[Arc<dyn Device>],
    dev_name: &str,
    qp0: &QpConfig,
    n: usize,
    sender: bool,
) -> Result<Vec<Box<dyn QueuePair>>, Error> {
    let share = n.div_ceil(devs.len().max(1));
    for dev in devs {
        if let Some(max) = dev.max_qps() {
            if share > max as usize {
                return Err(Error::new(
                    Stage::QpSetup,
                    Class::System,
                    format!(
                        "{share} QPs per connection on {} (VERBSNET_IB_QPS_PER_CONNECTION, the \
                         connecting side's) exceed what it can hold ({max} QPs or CQs); lower it",
                        dev.props().name
                    ),
                ));
            }
        }
    }
    let data = data_qp_config(qp0, sender);
    let mut qps = Vec::with_capacity(n);
    for i in 0..n {
        let cfg = if i == 0 { qp0 } else { &data };
        let dev = &devs[i % devs.len()];
        let qp = dev.create_qp(cfg).map_err(|e| {
            let msg = if n == 1 {
                format!("creating a QP on {dev_name}")
            } else {
                format!(
                    "creating QP {i} of {n} on {dev_name} (VERBSNET_IB_QPS_PER_CONNECTION={n}, \
                     the connecting side's: lower it if the device runs out of QPs or CQs)"
                )
            };
            Error::new(Stage::QpSetup, Class::System, msg).because(e)
        })?;
        qps.push(qp);
    }
    Ok(qps)
}

/// `", N QPs (split on|off)"` for the INFO line of a connection with more than one QP (empty
/// with one), then `", over D devices (peer: P)"` when either side is a virtual device
/// (`devs` = (this side's, the peer's)).
fn qps_note(n: usize, split: bool, devs: (usize, usize)) -> String {
    let mut s = String::new();
    if n > 1 {
        s = format!(", {n} QPs (split {})", if split { "on" } else { "off" });
    }
    if devs.0 > 1 || devs.1 > 1 {
        s += &format!(", over {} devices (peer: {})", devs.0, devs.1);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(tc: Option<u8>, sl: Option<u8>, comm: Option<u8>) -> Config {
        Config {
            ib_tc: tc,
            ib_sl: sl,
            comm_traffic_class: comm,
            ..Config::default()
        }
    }

    /// NCCL IB's precedence (`ncclIbConnectImpl`, `net_ib/connect.cc`): a set knob beats the
    /// communicator's `trafficClass`, which is the SL too when `VERBSNET_IB_SL` is unset; the
    /// knob `VERBSNET_IB_TC` never feeds the SL.
    #[test]
    fn set_knobs_beat_the_traffic_class_which_is_the_sl_when_unset() {
        // (VERBSNET_IB_TC, VERBSNET_IB_SL, trafficClass) -> (traffic class, SL)
        let table = [
            ((None, None, None), (0, 0)),
            ((None, None, Some(106)), (106, 10)),
            ((None, None, Some(5)), (5, 5)),
            ((Some(7), None, None), (7, 0)),
            ((Some(7), None, Some(106)), (7, 10)),
            ((None, Some(3), Some(106)), (106, 3)),
            ((Some(7), Some(3), Some(106)), (7, 3)),
            ((Some(0), Some(0), Some(106)), (0, 0)),
        ];
        for ((tc, sl, comm), want) in table {
            let c = cfg(tc, sl, comm);
            assert_eq!(traffic_class_and_sl(&c), want, "{tc:?} {sl:?} {comm:?}");
            let q = qp_config(&c);
            assert_eq!((q.traffic_class, q.service_level), want);
        }
    }
}
