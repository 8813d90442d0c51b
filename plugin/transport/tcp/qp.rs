//! The tcp queue pair's state machine: an RC requester and responder over one non-blocking
//! stream, driven by its owner's calls and, while the owner does not poll, by the device's NIC
//! thread (`super::nic`, which also holds this state behind the owner's handle; the protocol is
//! described in the parent module's documentation).
//!
//! This file holds the QP's state, the error state every half shares, and the entry points
//! (the [`QueuePair`] calls the handle forwards, and [`TcpQp::service`] for the NIC thread);
//! the rest is split by role:
//! - [`requester`]: send WRs, PSNs, ACK/NAK/RNR NAK handling, in-order send completions;
//! - [`responder`]: receive WRs, where each message's payload goes, ACKs and NAKs;
//! - [`io`]: the socket: staging and writing frames, reading and cutting the stream into frames.
//!
//! Time is passed in: only the entry points (`post_send`, `poll_cq`, `end_batch`, `goodbye`,
//! `service`) and the socket reads in [`io`] read the clock (before each phase, and after each read that returned
//! bytes, so a frame is handled at its arrival), and hand `now` down to what decides
//! retransmissions (the RNR timer).
//!
//! Call order inside [`TcpQp::poll_cq`]: flush the out-queue → read and process frames →
//! retire decided send WRs → flush again (ACKs/NAKs just generated, retransmissions whose RNR
//! timer expired) → hand out completions. [`TcpQp::service`] does the same but hands nothing
//! out (completions queue for the owner), and gives way to the owner before every socket call
//! once the owner waits for the state (`preempt`).

mod io;
mod requester;
mod responder;

use std::collections::VecDeque;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use self::io::{Staged, TxPayload, INLINE_MAX, RX_BUF_LEN, SPARE_INLINE_MAX, TX_BUF_CAP};
use self::requester::SendEntry;
use self::responder::{recv_wc, Done, RxState};
use super::registry::Registry;
use super::wire::{ConnInfo, DataEndpoint, Frame, NakCode, CONN_INFO_LEN, HEADER_LEN};
use crate::mem::Region;
use crate::transport::{
    set_keepalive, QpConfig, QpCounters, RecvWr, Result, SendWr, TransportError, Wc, WcStatus,
    DATA_ACCEPT_TIMEOUT, MAX_SEND_SGE, PEER_SILENT,
};

#[cfg(doc)]
use crate::transport::QueuePair;

/// An RC queue pair over a TCP stream (its state; the owner holds it through
/// `super::nic::TcpQueuePair`).
pub(super) struct TcpQp {
    /// Our 24-bit QP number (logs, `local_info`).
    qp_num: u32,
    /// A data QP whose peer connects to it ([`TcpQp::listen_data`]), until
    /// [`TcpQp::establish_data`] accepted the peer's stream.
    data_listen: Option<DataListen>,
    /// The peer's QP number, learnt in `establish`.
    remote_qp_num: u32,
    /// PSN of our first send WR (in `local_info`).
    initial_psn: u32,
    cfg: QpConfig,
    /// The device's memory registry (lkeys and rkeys).
    registry: Arc<Registry>,
    state: QpState,
    /// The data channel; `None` until `establish` and after the owner dropped the QP. Shared
    /// with the NIC thread while it waits on the socket (`poll(2)`), never used by it for I/O
    /// outside this state's lock.
    stream: Option<Arc<TcpStream>>,
    /// The stream failed or hit EOF: no more I/O on it.
    io_dead: bool,
    /// `post_send` starts transmitting at once (off only in white-box tests that stage by hand).
    doorbell: bool,
    /// Inside a caller's batch (`begin_batch`): `poll_cq` leaves what it generated queued.
    in_batch: bool,
    /// The peer closed the connection or the stream failed (`peer_closed()`).
    peer_closed: bool,
    /// The peer's goodbye (BYE frame) arrived before it closed (`peer_closed_orderly()`).
    peer_orderly: bool,
    /// The stream's keepalive expired: the peer host went silent (`peer_gone_reason()`).
    peer_silent: bool,
    /// Our own goodbye: once queued, no data frame starts and nothing follows the BYE.
    closing: Closing,
    /// The NIC thread is running [`TcpQp::service`] (its socket loops give way on `preempt`).
    servicing: bool,
    /// Set by the owner while it waits for this state: the NIC thread stops before its next
    /// socket call, so the owner waits for at most one non-blocking call.
    preempt: Arc<AtomicBool>,
    /// When the owner last called `poll_cq` (the NIC thread leaves the QP alone until it has
    /// not for a while).
    last_poll: Option<Instant>,
    /// Read system calls made (tests: what a skipped read saves).
    #[cfg(test)]
    rx_syscalls: u64,

    // Requester.
    /// Posted send WRs not yet completed, in posting order; PSNs are consecutive.
    sq: VecDeque<SendEntry>,
    /// PSN of the next posted send WR.
    next_psn: u32,
    /// Oldest PSN not yet acknowledged.
    snd_una: u32,
    /// PSN of the next message to put on the wire (rewound by RNR NAKs: go-back-N).
    snd_nxt: u32,
    /// No data frame goes out before this instant (RNR timer running).
    rnr_wait_until: Option<Instant>,
    /// Bytes staged for the socket: headers, control frames, small payloads.
    tx_buf: Vec<u8>,
    /// Bytes of `tx_buf` already written.
    tx_off: usize,
    /// The frames in `tx_buf`, in order (to drop unsent data frames on error).
    tx_frames: VecDeque<Staged>,
    /// A large payload written straight from registered memory after `tx_buf` drains.
    tx_payload: Option<TxPayload>,
    /// The gathered ranges' vector of the last payload, kept for the next WR's (a warm QP
    /// allocates nothing per WR, as a NIC's post does not).
    spare_segs: Vec<(u32, Region)>,
    /// Inline copies of retired WRs, kept for the next inline WRs (at most
    /// [`SPARE_INLINE_MAX`]).
    spare_inline: Vec<Vec<u8>>,
    /// The last small READ response's vector, kept for the next READ's bytes.
    spare_read: Option<Vec<u8>>,
    /// Control frames (ACK, RNR NAK, NAK, READ response) waiting to be staged, in generation
    /// order.
    ctrl: VecDeque<Frame>,
    /// The bytes of each READ response in `ctrl`, in the same order (read from memory when
    /// the request was carried out), and their total, bounded by `READ_QUEUE_MAX`.
    read_payloads: VecDeque<Vec<u8>>,
    read_queued: usize,
    /// The ACK owed for messages flagged unsignaled: sent with the next frame staged, merged
    /// into the next ACK or NAK, or before our BYE (`wire::FLAG_UNSIGNALED`).
    deferred_ack: Option<u32>,

    // Responder.
    /// Posted receive WRs, consumed in FIFO order.
    rq: VecDeque<RecvWr>,
    /// PSN of the next message the responder will carry out.
    rcv_nxt: u32,
    /// The message being received is flagged unsignaled (its ACK may wait).
    rx_unsignaled: bool,
    /// An RNR NAK for `rcv_nxt` went out: discard messages until it is retransmitted.
    rnr_nak_outstanding: bool,
    /// Staging for incoming headers and small payloads; `rx_buf[rx_start..rx_end]` is unread.
    rx_buf: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    rx: RxState,
    /// When the last read found the socket drained (`None`: it may hold more).
    rx_drained_at: Option<Instant>,
    /// Polls that skipped the read since then ([`io::RX_SKIP_POLLS`]).
    rx_skips: u32,

    /// Completions not yet handed out by `poll_cq`.
    cq: VecDeque<Wc>,
    counters: QpCounters,
}

/// Where our own goodbye stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Closing {
    /// No goodbye.
    Open,
    /// The BYE frame is queued behind the frames already staged.
    ByeQueued,
    /// The BYE frame is staged: nothing more is staged after it.
    ByeStaged,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QpState {
    /// Created; receives may be posted, sends may not.
    Init,
    /// Established: ready to send and receive.
    Ready,
    /// Failed: every WR completes, with an error status.
    Error,
}

/// Why the QP enters the error state (decides the status of outstanding WRs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    /// A WR failed, or the responder refused a message: the rest flushes.
    Local,
    /// EOF or a socket error: outstanding sends `RetryExceeded`, receives `WrFlush`.
    PeerClosed,
    /// The peer sent a malformed or out-of-protocol frame: the oldest WR of each queue
    /// `RemoteInvalidRequest`, the rest `WrFlush`.
    Protocol,
}

impl TcpQp {
    /// A QP in the INIT state whose first send WR gets `initial_psn`.
    pub(super) fn new(
        qp_num: u32,
        initial_psn: u32,
        cfg: QpConfig,
        registry: Arc<Registry>,
    ) -> TcpQp {
        TcpQp {
            qp_num,
            data_listen: None,
            remote_qp_num: 0,
            initial_psn,
            cfg,
            registry,
            state: QpState::Init,
            stream: None,
            io_dead: false,
            doorbell: true,
            in_batch: false,
            peer_closed: false,
            peer_orderly: false,
            peer_silent: false,
            closing: Closing::Open,
            servicing: false,
            preempt: Arc::new(AtomicBool::new(false)),
            last_poll: None,
            #[cfg(test)]
            rx_syscalls: 0,
            sq: VecDeque::new(),
            next_psn: initial_psn,
            snd_una: initial_psn,
            snd_nxt: initial_psn,
            rnr_wait_until: None,
            tx_buf: Vec::with_capacity(TX_BUF_CAP + INLINE_MAX + HEADER_LEN),
            tx_off: 0,
            tx_frames: VecDeque::new(),
            tx_payload: None,
            spare_segs: Vec::with_capacity(MAX_SEND_SGE),
            spare_inline: Vec::with_capacity(SPARE_INLINE_MAX),
            spare_read: None,
            ctrl: VecDeque::new(),
            read_payloads: VecDeque::new(),
            read_queued: 0,
            deferred_ack: None,
            rq: VecDeque::new(),
            rcv_nxt: 0,
            rx_unsignaled: false,
            rnr_nak_outstanding: false,
            rx_buf: vec![0; RX_BUF_LEN],
            rx_start: 0,
            rx_end: 0,
            rx: RxState::Header,
            rx_drained_at: None,
            rx_skips: 0,
            cq: VecDeque::new(),
            counters: QpCounters::default(),
        }
    }

    /// The source of the payload being sent was deregistered before its frame was out (a
    /// use-after-dereg by the application). The frame cannot be finished from memory, and a
    /// short frame would desynchronise the stream: the WR completes `LocalProtection` and the
    /// connection is shut down (the peer sees it close).
    fn source_gone(&mut self, psn: u32) {
        if let Some(e) = self.entry_mut(psn) {
            if e.status.is_none() || e.status == Some(WcStatus::Success) {
                e.status = Some(WcStatus::LocalProtection);
            }
        }
        self.io_dead = true;
        self.tx_buf.clear();
        self.tx_frames.clear();
        self.tx_off = 0;
        self.tx_payload = None;
        self.clear_ctrl();
        if let Some(s) = &self.stream {
            let _ = s.shutdown(Shutdown::Both); // nothing more can be sent on it
        }
        self.enter_error(
            Cause::Local,
            &format!("the memory of message {psn:#x} was deregistered while it was being sent"),
        );
    }

    /// Drops every queued control frame and READ response (nothing more can be sent).
    fn clear_ctrl(&mut self) {
        self.ctrl.clear();
        self.read_payloads.clear();
        self.read_queued = 0;
    }

    /// The peer broke the protocol: NAK (best effort, so a conforming peer learns why) and
    /// enter the error state.
    fn protocol_error(&mut self, why: String) {
        if self.state == QpState::Error {
            return;
        }
        self.ctrl.push_back(Frame::Nak {
            psn: self.rcv_nxt,
            code: NakCode::InvalidRequest,
        });
        self.enter_error(Cause::Protocol, &why);
    }

    /// EOF or a socket error: no more I/O; the QP enters the error state.
    fn connection_lost(&mut self, why: String) {
        self.io_dead = true;
        self.peer_closed = true;
        self.tx_buf.clear();
        self.tx_frames.clear();
        self.tx_off = 0;
        self.tx_payload = None;
        self.clear_ctrl();
        self.rx_start = 0;
        self.rx_end = 0;
        if let Some(s) = &self.stream {
            let _ = s.shutdown(Shutdown::Both); // the connection is gone either way
        }
        if self.state == QpState::Error {
            debug!(
                qp_num = self.qp_num,
                "connection lost after the QP failed: {why}"
            );
        }
        self.enter_error(Cause::PeerClosed, &why);
    }

    /// Moves the QP to the error state: the receive queue completes now, send WRs complete in
    /// order from `retire_sq` (with the status decided here), later WRs flush.
    fn enter_error(&mut self, cause: Cause, why: &str) {
        if self.state == QpState::Error {
            return;
        }
        if self.peer_orderly || self.closing != Closing::Open {
            // The peer's goodbye, or our own close: an expected end, not a failure worth a
            // warning.
            debug!(
                qp_num = self.qp_num,
                remote_qp_num = self.remote_qp_num,
                "tcp QP enters the error state: {why}"
            );
        } else {
            warn!(
                qp_num = self.qp_num,
                remote_qp_num = self.remote_qp_num,
                ?cause,
                "tcp QP enters the error state: {why}"
            );
        }
        self.state = QpState::Error;
        self.rnr_wait_until = None;
        self.drop_unsent_data();

        let mut recv_status = match cause {
            Cause::Protocol => WcStatus::RemoteInvalidRequest,
            Cause::Local | Cause::PeerClosed => WcStatus::WrFlush,
        };
        if let RxState::Payload {
            done: Done::Recv { wr_id, .. } | Done::RecvImm { wr_id, .. },
            ..
        } = std::mem::replace(&mut self.rx, RxState::Drain)
        {
            self.cq.push_back(recv_wc(wr_id, recv_status));
            recv_status = WcStatus::WrFlush;
        }
        for wr in self.rq.drain(..) {
            self.cq.push_back(recv_wc(wr.wr_id, recv_status));
            recv_status = WcStatus::WrFlush;
        }

        let mut first = true;
        for e in self.sq.iter_mut() {
            match e.status {
                Some(WcStatus::Success) => {}
                Some(_) => first = false,
                None => {
                    e.status = Some(match cause {
                        Cause::PeerClosed => WcStatus::RetryExceeded,
                        Cause::Protocol if first => WcStatus::RemoteInvalidRequest,
                        _ => WcStatus::WrFlush,
                    });
                    first = false;
                }
            }
        }
    }
}

/// The entry points: the owner's [`QueuePair`] calls (forwarded by the handle, one at a time,
/// under the state's lock) and the NIC thread's [`TcpQp::service`].
impl TcpQp {
    pub(super) fn local_info(&self) -> Vec<u8> {
        let mut v = ConnInfo {
            qp_num: self.qp_num,
            initial_psn: self.initial_psn,
        }
        .encode();
        if let Some(l) = &self.data_listen {
            v.extend_from_slice(&l.endpoint.encode());
        }
        v
    }

    /// A data QP the peer connects to: listens on an ephemeral port of `local`; `local_info`
    /// then carries the address and a random token ([`DataEndpoint`]).
    pub(super) fn listen_data(&mut self, local: IpAddr) -> Result<()> {
        if self.state != QpState::Init || self.data_listen.is_some() {
            return Err(TransportError::Unavailable(format!(
                "tcp QP {:#08x}: listen_data on a QP already listening or connected",
                self.qp_num
            )));
        }
        let io = |op: String| move |source| TransportError::Io { op, source };
        let listener = TcpListener::bind(SocketAddr::new(local, 0)).map_err(io(format!(
            "listen for the data stream of tcp QP {:#08x} on {local}",
            self.qp_num
        )))?;
        let addr = listener.local_addr().map_err(io("getsockname".into()))?;
        let token = (u64::from(super::random_u32()) << 32) | u64::from(super::random_u32());
        self.data_listen = Some(DataListen {
            listener,
            endpoint: DataEndpoint { addr, token },
        });
        Ok(())
    }

    /// Connects a data QP: the side whose peer listens connects and presents the token; the
    /// side that listens accepts (within [`DATA_ACCEPT_TIMEOUT`]) and checks it. Then as
    /// [`TcpQp::establish`] on that stream.
    pub(super) fn establish_data(&mut self, remote: &[u8]) -> Result<()> {
        if self.state != QpState::Init {
            return Err(TransportError::Unavailable(format!(
                "tcp QP {:#08x} is already connected",
                self.qp_num
            )));
        }
        let (base, ep) = match remote.len() {
            CONN_INFO_LEN => (remote, None),
            n if n == CONN_INFO_LEN + DataEndpoint::LEN => {
                let ep = DataEndpoint::decode(&remote[CONN_INFO_LEN..])
                    .map_err(TransportError::Protocol)?;
                (&remote[..CONN_INFO_LEN], Some(ep))
            }
            n => {
                return Err(TransportError::Protocol(format!(
                    "tcp data QP connection info is {n} bytes, expected {CONN_INFO_LEN} or {} \
                     (is the peer using another transport?)",
                    CONN_INFO_LEN + DataEndpoint::LEN
                )))
            }
        };
        let info = ConnInfo::decode(base).map_err(TransportError::Protocol)?;
        let stream = match (self.data_listen.take(), ep) {
            (None, Some(ep)) => self.connect_data(ep)?,
            (Some(l), None) => self.accept_data(l)?,
            (Some(_), Some(_)) => {
                return Err(TransportError::Protocol(format!(
                    "tcp data QP {:#08x}: both ends listen (both called listen_data)",
                    self.qp_num
                )))
            }
            (None, None) => {
                return Err(TransportError::Protocol(format!(
                    "tcp data QP {:#08x}: neither end listens (the connecting side must call \
                     listen_data before local_info)",
                    self.qp_num
                )))
            }
        };
        self.attach(info, stream, "data")
    }

    /// Connects to the peer's data listener and presents its token.
    fn connect_data(&self, ep: DataEndpoint) -> Result<TcpStream> {
        let op = |what: &str| {
            format!(
                "{what} the data stream of tcp QP {:#08x} to {}",
                self.qp_num, ep.addr
            )
        };
        let mut s =
            TcpStream::connect_timeout(&ep.addr, DATA_ACCEPT_TIMEOUT).map_err(|source| {
                TransportError::Io {
                    op: op("connect"),
                    source,
                }
            })?;
        s.write_all(&ep.token.to_be_bytes())
            .map_err(|source| TransportError::Io {
                op: op("present the token on"),
                source,
            })?;
        Ok(s)
    }

    /// Accepts the peer's data stream on `l` within [`DATA_ACCEPT_TIMEOUT`]: the first
    /// connection that presents the token (others, e.g. a port scanner, are closed and
    /// skipped).
    fn accept_data(&self, l: DataListen) -> Result<TcpStream> {
        let deadline = Instant::now() + DATA_ACCEPT_TIMEOUT;
        let at = l.endpoint.addr;
        let timed_out = || TransportError::Io {
            op: format!(
                "accept the data stream of tcp QP {:#08x} on {at}: the peer did not connect \
                 with its token within {} s (it died, or a firewall blocks {at})",
                self.qp_num,
                DATA_ACCEPT_TIMEOUT.as_secs()
            ),
            source: std::io::ErrorKind::TimedOut.into(),
        };
        l.listener
            .set_nonblocking(true)
            .map_err(|source| TransportError::Io {
                op: format!("set_nonblocking on the data listener {at}"),
                source,
            })?;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out());
            }
            match l.listener.accept() {
                Ok((mut s, peer)) => {
                    let mut token = [0u8; 8];
                    let got = s
                        .set_nonblocking(false)
                        .and_then(|()| s.set_read_timeout(Some(left)))
                        .and_then(|()| s.read_exact(&mut token))
                        .and_then(|()| s.set_read_timeout(None));
                    match got {
                        Ok(()) if u64::from_be_bytes(token) == l.endpoint.token => return Ok(s),
                        Ok(()) => {
                            debug!(qp_num = self.qp_num, %peer, "data stream with a wrong token: closed")
                        }
                        Err(e) => {
                            debug!(qp_num = self.qp_num, %peer, "data stream without a token: {e}")
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1).min(left));
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(TransportError::Io {
                        op: format!(
                            "accept the data stream of tcp QP {:#08x} on {at}",
                            self.qp_num
                        ),
                        source,
                    })
                }
            }
        }
    }

    pub(super) fn establish(&mut self, remote: &[u8], oob: TcpStream) -> Result<()> {
        if self.state != QpState::Init {
            return Err(TransportError::Unavailable(format!(
                "tcp QP {:#08x} is already connected",
                self.qp_num
            )));
        }
        let info = ConnInfo::decode(remote).map_err(TransportError::Protocol)?;
        self.attach(info, oob, "set-up")
    }

    /// Makes `oob` (the set-up stream, or a data QP's own stream: `what`) the QP's data
    /// stream and moves the QP to ready.
    fn attach(&mut self, info: ConnInfo, oob: TcpStream, what: &str) -> Result<()> {
        oob.set_nonblocking(true)
            .map_err(|source| TransportError::Io {
                op: "set_nonblocking on the tcp data stream".into(),
                source,
            })?;
        oob.set_nodelay(true).map_err(|source| TransportError::Io {
            op: "set TCP_NODELAY on the tcp data stream".into(),
            source,
        })?;
        if let Some(bound) = self.cfg.oob_keepalive {
            if let Err(e) = set_keepalive(&oob, bound) {
                warn!(
                    qp_num = self.qp_num,
                    "TCP keepalive on the tcp data stream: {e}"
                );
            }
        }
        debug!(
            qp_num = self.qp_num,
            remote_qp_num = info.qp_num,
            peer = ?oob.peer_addr().ok(),
            stream = what,
            "tcp QP established"
        );
        self.remote_qp_num = info.qp_num;
        self.rcv_nxt = info.initial_psn;
        self.stream = Some(Arc::new(oob));
        self.state = QpState::Ready;
        Ok(())
    }

    /// All or nothing: a batch that does not fit, or holds a WR with too many SGEs or an
    /// inline WR longer than [`TcpQp::max_inline_data`], is refused whole (`Resource`). On a
    /// QP in the error state the WRs are accepted and complete with `WrFlush` (as verbs do).
    /// After [`TcpQp::goodbye`] every post is refused (`Unavailable`).
    ///
    /// An inline WR ([`SendWr::inline`]) is gathered here, from registered memory, into its
    /// SQ entry: its first transmission and every retransmission send that copy. An SGE
    /// outside every registered region fails the WR with `LocalProtection` when its turn
    /// comes, as for a WR read at staging.
    pub(super) fn post_send(&mut self, wrs: &[SendWr]) -> Result<()> {
        self.refuse_after_goodbye("post_send")?;
        if self.state == QpState::Init {
            return Err(TransportError::Unavailable(format!(
                "tcp QP {:#08x}: post_send before establish (the QP is not ready to send)",
                self.qp_num
            )));
        }
        if let Some(wr) = wrs.iter().find(|wr| usize::from(wr.num_sge) > MAX_SEND_SGE) {
            return Err(TransportError::Resource(format!(
                "tcp QP {:#08x}: send WR {:#x} has {} SGEs, max_send_sge is {MAX_SEND_SGE}",
                self.qp_num, wr.wr_id, wr.num_sge
            )));
        }
        if let Some((wr, why)) = wrs.iter().find_map(|wr| Some((wr, wr.bad_read()?))) {
            return Err(TransportError::Resource(format!(
                "tcp QP {:#08x}: send WR {:#x}: {why}",
                self.qp_num, wr.wr_id
            )));
        }
        let max_inline = self.max_inline_data();
        if let Some(wr) = wrs
            .iter()
            .find(|wr| wr.inline && wr.byte_len() > u64::from(max_inline))
        {
            return Err(TransportError::Resource(format!(
                "tcp QP {:#08x}: inline send WR {:#x} of {} bytes exceeds the QP's \
                 max_inline_data {max_inline}",
                self.qp_num,
                wr.wr_id,
                wr.byte_len()
            )));
        }
        let cap = self.cfg.max_send_wr as usize;
        if self.sq.len() + wrs.len() > cap {
            return Err(TransportError::Resource(format!(
                "tcp QP {:#08x}: send queue full: {} WRs outstanding + {} posted > max_send_wr {}",
                self.qp_num,
                self.sq.len(),
                wrs.len(),
                cap
            )));
        }
        for wr in wrs {
            // In the error state the WR flushes: nothing to copy.
            let (inline, status) = if wr.inline && self.state == QpState::Ready {
                match self.copy_inline(wr) {
                    Some(copy) => (Some(copy), None),
                    None => (None, Some(WcStatus::LocalProtection)),
                }
            } else {
                (None, None)
            };
            self.sq.push_back(SendEntry {
                wr: *wr,
                psn: self.next_psn,
                status,
                rnr_naks: 0,
                inline,
            });
            self.next_psn = self.next_psn.wrapping_add(1);
        }
        // Ring the doorbell: start transmitting now, as a NIC does, instead of waiting for
        // the next poll_cq (a CTS or a send would otherwise sit queued until the caller polls).
        if self.doorbell && self.stream.is_some() && !self.io_dead {
            self.flush_tx(Instant::now());
        }
        Ok(())
    }

    /// All or nothing, like `post_send`. Legal before `establish`; on a QP in the error state
    /// the WRs complete with `WrFlush`.
    pub(super) fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<()> {
        self.refuse_after_goodbye("post_recv")?;
        let cap = self.cfg.max_recv_wr as usize;
        if self.rq.len() + wrs.len() > cap {
            return Err(TransportError::Resource(format!(
                "tcp QP {:#08x}: receive queue full: {} WRs posted + {} new > max_recv_wr {}",
                self.qp_num,
                self.rq.len(),
                wrs.len(),
                cap
            )));
        }
        self.counters.post_recv_calls += 1;
        self.counters.recv_wrs_posted += wrs.len() as u64;
        if self.state == QpState::Error {
            self.cq
                .extend(wrs.iter().map(|wr| recv_wc(wr.wr_id, WcStatus::WrFlush)));
        } else {
            self.rq.extend(wrs.iter().copied());
        }
        Ok(())
    }

    pub(super) fn poll_cq(&mut self, out: &mut Vec<Wc>, max: usize) -> Result<usize> {
        let now = Instant::now();
        self.last_poll = Some(now);
        if self.stream.is_some() && !self.io_dead {
            self.flush_tx(now);
            // Again: the flush may have written megabytes.
            self.poll_rx(Instant::now());
            self.retire_sq();
            if !self.in_batch {
                self.flush_tx(Instant::now());
            }
        }
        self.retire_sq();
        let n = max.min(self.cq.len());
        out.extend(self.cq.drain(..n));
        Ok(n)
    }

    /// ACKs (and NAKs, retransmissions) `poll_cq` generates wait in the out-queue for the
    /// next `post_send`, whose doorbell writes them with the new frames in one `sendmsg`, or
    /// for [`QueuePair::end_batch`].
    pub(super) fn begin_batch(&mut self) {
        self.in_batch = true;
    }

    pub(super) fn end_batch(&mut self) {
        self.in_batch = false;
        if self.stream.is_some() && !self.io_dead {
            self.flush_tx(Instant::now());
        }
    }

    pub(super) fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    /// True once the peer's BYE frame arrived (it then also counts as closed).
    pub(super) fn peer_closed_orderly(&self) -> bool {
        self.peer_orderly
    }

    /// Why the peer went, when the stream's keepalive expired.
    pub(super) fn peer_gone_reason(&self) -> Option<&'static str> {
        self.peer_silent.then_some(PEER_SILENT)
    }

    /// The owner announces an orderly close: a BYE frame is queued behind what is already
    /// staged for the socket (control frames and the frames of messages already started go
    /// first, in order; a message not yet started is never sent), and the QP writes what the
    /// socket takes now, without blocking. Nothing is sent after the BYE; later posts are
    /// refused. Best effort: what the socket did not take before the QP is dropped is lost,
    /// and the peer then sees a plain close. Idempotent.
    pub(super) fn goodbye(&mut self) {
        if self.closing != Closing::Open || self.stream.is_none() {
            return;
        }
        debug!(qp_num = self.qp_num, "goodbye: BYE queued");
        if let Some(psn) = self.deferred_ack.take() {
            self.push_ack(psn);
        }
        self.ctrl.push_back(Frame::Bye);
        self.closing = Closing::ByeQueued;
        if !self.io_dead {
            self.flush_tx(Instant::now());
        }
    }

    fn refuse_after_goodbye(&self, what: &str) -> Result<()> {
        if self.closing == Closing::Open {
            return Ok(());
        }
        Err(TransportError::Unavailable(format!(
            "tcp QP {:#08x}: {what} after goodbye (the QP is closing)",
            self.qp_num
        )))
    }

    /// The NIC thread's call while the owner does not poll: what `poll_cq` does, minus
    /// handing out completions (they queue for the owner). Not inside the owner's batch (its
    /// ACKs wait for the batch's send). Before each socket call it gives way when the owner
    /// waits for the state (`preempt`): the state is consistent between any two calls.
    pub(super) fn service(&mut self, now: Instant) {
        if self.in_batch {
            return;
        }
        self.servicing = true;
        if self.stream.is_some() && !self.io_dead {
            self.flush_tx(now);
            if !self.yielding() {
                self.read_rx(Instant::now());
            }
            self.retire_sq();
            if !self.yielding() {
                self.flush_tx(Instant::now());
            }
        }
        self.retire_sq();
        self.servicing = false;
    }

    /// Inside a [`TcpQp::service`] call that must give way to the owner.
    pub(super) fn yielding(&self) -> bool {
        self.servicing && self.preempt.load(Ordering::Relaxed)
    }

    /// The flag the owner sets while it waits for this state.
    pub(super) fn preempt_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.preempt)
    }

    /// When the owner last called `poll_cq`.
    pub(super) fn last_poll(&self) -> Option<Instant> {
        self.last_poll
    }

    /// Inside the owner's batch.
    pub(super) fn in_batch(&self) -> bool {
        self.in_batch
    }

    /// What the NIC thread waits for on this QP's behalf between services: the socket (to
    /// read; to write too while staged bytes wait for room) and the RNR timer. `None` when
    /// there is no socket to wait on (not established, failed, dropped).
    pub(super) fn interest(&self) -> Option<Interest> {
        let stream = self.stream.as_ref().filter(|_| !self.io_dead)?;
        Some(Interest {
            stream: Arc::clone(stream),
            write: !self.tx_buf.is_empty() || self.tx_payload.is_some(),
            // Only while it can resend: after goodbye or in the error state the timer never
            // clears (nothing is staged), and waking for it would spin.
            deadline: self
                .rnr_wait_until
                .filter(|_| self.state == QpState::Ready && self.closing == Closing::Open),
        })
    }

    /// The owner drops the QP: the stream leaves the state (the caller shuts it down, so the
    /// peer sees the close at once, as at a process death), and the QP does no more I/O.
    pub(super) fn take_stream(&mut self) -> Option<Arc<TcpStream>> {
        self.io_dead = true;
        self.stream.take()
    }

    /// Our QP number.
    pub(super) fn qp_num(&self) -> u32 {
        self.qp_num
    }

    pub(super) fn counters(&self) -> QpCounters {
        self.counters
    }

    /// The largest inline send WR this QP takes: what `QpConfig::max_inline_data` asked,
    /// capped at the payload size the QP copies into its out-buffer anyway (`INLINE_MAX`).
    pub(super) fn max_inline_data(&self) -> u32 {
        self.cfg.max_inline_data.min(INLINE_MAX as u32)
    }
}

/// The listening end of a data QP before its peer connected ([`TcpQp::listen_data`]).
struct DataListen {
    listener: TcpListener,
    /// Where it listens and the token the peer must present.
    endpoint: DataEndpoint,
}

/// What the NIC thread waits on for an idle QP ([`TcpQp::interest`]).
pub(super) struct Interest {
    /// The QP's socket (kept open by this clone until the wait ends).
    pub(super) stream: Arc<TcpStream>,
    /// Staged bytes wait for room in the socket.
    pub(super) write: bool,
    /// The RNR timer runs out then (while the QP may resend).
    pub(super) deadline: Option<Instant>,
}

#[cfg(test)]
mod tests;
