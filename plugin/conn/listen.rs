//! The listen comm: a non-blocking listener whose `accept` steps every pending handshake,
//! refuses bad or silent clients (rate-limited log: `refusals`) and fails only for its own
//! reasons or its deadline.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::handle::{Handle, HANDLE_SIZE};
use super::hello::{Hello, HelloError, HelloReader, Wire, READY};
use super::refusals::{refusal_of_io, Refusal, Refusals};
use super::{create_qps, qp_config, qp_devices, qps_note, Error, Stage};
use crate::comm::{Class, RecvBuffers, RecvComm};
use crate::config::Config;
use crate::engine::wire::CTS_COMPACT_LEN;
use crate::engine::RecvEngine;
use crate::transport::{Device, Kind, QueuePair};

/// Most handshakes one listen comm keeps in progress; a new connection beyond it evicts the
/// oldest handshake that has not yet shown the listen comm's nonce.
pub const MAX_PENDING_HANDSHAKES: usize = 128;
/// Longest an unauthenticated connection (one whose hello has not arrived) is kept: a real peer
/// sends its hello in the same call that sees its TCP connect complete, so only a silent or
/// hostile client waits this long. `VERBSNET_CONNECT_TIMEOUT` is used when it is shorter.
pub const HELLO_DEADLINE: Duration = Duration::from_secs(10);
/// Refused connections are logged at most once per this interval (the first one at once, the
/// rest as one summary line with counts per reason).
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// New connections taken from the kernel's backlog per `accept` call (each is stepped at once,
/// so a real peer's hello is read before a flood behind it can evict it).
const ACCEPTS_PER_CALL: usize = 256;

/// A listen comm.
pub struct Listen {
    listener: TcpListener,
    handle: Handle,
    /// The device it listens on: one, or a virtual device's physical ones (QP `q` of a
    /// connection on `devs[q % len]`).
    devs: Vec<Arc<dyn Device>>,
    dev_name: String,
    cfg: Config,
    pending: Vec<Accepting>,
    refusals: Refusals,
    /// When `accept` started waiting for its next connection (reset by each success).
    waiting_since: Option<u64>,
    /// The hang watchdog reported this wait already.
    warned_wait: bool,
    /// How long an unauthenticated connection is kept.
    hello_deadline: Duration,
}

struct Accepting {
    wire: Wire,
    peer: SocketAddr,
    reader: HelloReader,
    stage: AcceptStage,
    /// When the listener took the connection (ns, [`crate::comm::now_ns`]).
    since: u64,
}

impl Accepting {
    /// True once the peer showed the listen comm's nonce (a real peer).
    fn authenticated(&self) -> bool {
        !matches!(self.stage, AcceptStage::Hello)
    }

    fn stage_name(&self) -> &'static str {
        match self.stage {
            AcceptStage::Hello if self.wire.inb.is_empty() && self.reader.len.is_none() => {
                "handshake (no byte of the peer's hello arrived)"
            }
            AcceptStage::Hello => "handshake (the peer's hello is incomplete)",
            AcceptStage::Reply { .. } if !self.wire.out.is_empty() => {
                "QP exchange (sending our reply)"
            }
            AcceptStage::Reply { .. } | AcceptStage::Done => {
                "RTR/RTS (waiting for the peer's ready message)"
            }
        }
    }
}

// One accept in progress at a time per listen comm in practice: size does not matter.
#[allow(clippy::large_enum_variant)]
enum AcceptStage {
    Hello,
    Reply {
        /// The connection's QPs, QP 0 first: as many as the sender's hello named.
        qps: Vec<Box<dyn QueuePair>>,
        /// The sender's `VERBSNET_IB_SPLIT_DATA_ON_QPS`, adopted.
        split: bool,
        /// The sender's devices (for the INFO line).
        peer_devs: u8,
        bufs: RecvBuffers,
        engine: RecvEngine,
        /// The sender's traffic class and SL, which this end's QP uses.
        tc: u8,
        sl: u8,
    },
    Done,
}

fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(crate::comm::now_ns());
    h.write_u32(std::process::id());
    h.finish()
}

/// A failed step of one pending handshake: the peer's fault (refuse it and go on) or the
/// listener's own (the error `accept` returns).
enum StepError {
    Refuse(Refusal, String),
    Own(Error),
}

impl From<Error> for StepError {
    fn from(e: Error) -> StepError {
        StepError::Own(e)
    }
}

impl Listen {
    /// Opens a non-blocking listener on `ip` (port chosen by the OS) and writes the handle.
    pub fn new(
        devs: Vec<Arc<dyn Device>>,
        dev_name: String,
        kind: Kind,
        ip: IpAddr,
        cfg: &Config,
        out: &mut [u8; HANDLE_SIZE],
    ) -> Result<Listen, Error> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| {
            Error::new(
                Stage::Listen,
                Class::System,
                format!("cannot listen on {ip}"),
            )
            .because(e)
            .fix(" (set VERBSNET_SOCKET_ADDR or VERBSNET_SOCKET_IFNAME to a local address)")
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::new(Stage::Listen, Class::System, "listener").because(e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::new(Stage::Listen, Class::System, "listener").because(e))?;
        let handle = Handle {
            nonce: random_u64(),
            kind,
            addr,
            devs: devs.len() as u8,
        };
        handle.write(out);
        Ok(Listen {
            listener,
            handle,
            devs,
            dev_name,
            cfg: cfg.clone(),
            pending: Vec::new(),
            refusals: Refusals::new(),
            waiting_since: None,
            warned_wait: false,
            hello_deadline: cfg
                .connect_timeout
                .map_or(HELLO_DEADLINE, |t| t.min(HELLO_DEADLINE)),
        })
    }

    /// Where this listener accepts connections.
    pub fn addr(&self) -> SocketAddr {
        self.handle.addr
    }

    /// Connections refused since listen (bad or silent clients).
    pub fn refused(&self) -> u64 {
        self.refusals.total
    }

    /// Handshakes in progress (at most [`MAX_PENDING_HANDSHAKES`]).
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Sets how long a connection that has not shown this listen comm's nonce is kept
    /// (default [`HELLO_DEADLINE`], or `VERBSNET_CONNECT_TIMEOUT` when shorter); tests shorten it.
    pub fn set_hello_deadline(&mut self, d: Duration) {
        self.hello_deadline = d;
    }

    fn hello_deadline_ns(&self) -> u64 {
        self.hello_deadline.as_nanos() as u64
    }

    /// One non-blocking step of `accept`: `Ok(Some(comm))` once a connection completed.
    ///
    /// A bad peer (junk, a wrong nonce, a lying or stalled handshake, a reset) never makes this
    /// return an error: its connection is closed and counted in the rate-limited refusal log.
    /// Errors are the listener's own failures (the listening socket, local resources) and a
    /// wait for a connection longer than `VERBSNET_CONNECT_TIMEOUT`, which names what the
    /// pending handshakes reached.
    pub fn accept(&mut self) -> Result<Option<RecvComm>, Error> {
        let now = crate::comm::now_ns();
        let since = *self.waiting_since.get_or_insert(now);
        let at = self.handle.addr;
        for _ in 0..ACCEPTS_PER_CALL {
            match self.listener.accept() {
                Ok((s, peer)) => {
                    if let Err(e) = s.set_nonblocking(true) {
                        self.refusals.refuse(
                            at,
                            peer,
                            Refusal::Socket,
                            &format!("set_nonblocking: {e}"),
                        );
                        continue;
                    }
                    let _ = s.set_nodelay(true);
                    if self.pending.len() >= MAX_PENDING_HANDSHAKES {
                        self.evict_oldest();
                    }
                    self.pending.push(Accepting {
                        wire: Wire::new(s),
                        peer,
                        reader: HelloReader { len: None },
                        stage: AcceptStage::Hello,
                        since: now,
                    });
                    // Step it at once: a real peer's hello is usually there already.
                    let i = self.pending.len() - 1;
                    if let Some(c) = self.step_or_refuse(i)? {
                        return Ok(Some(self.accepted(c)));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ECONNABORTED | libc::EPROTO | libc::EPERM | libc::ENETDOWN)
                    ) =>
                {
                    // The connection died in the backlog: the peer's doing, not ours.
                    self.refusals
                        .refuse(at, at, Refusal::Closed, &format!("accept: {e}"));
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    // Out of descriptors: free one held by an unauthenticated handshake, retry
                    // on the next call; the shortage is the process's, not a reason to fail.
                    self.evict_oldest();
                    warn!(
                        "accept on {at}: {e}; {} handshakes pending (raise `ulimit -n` if this \
                         repeats)",
                        self.pending.len()
                    );
                    break;
                }
                Err(e) => {
                    let msg = format!("accept on {at}");
                    return Err(Error::new(Stage::Accept, Class::System, msg).because(e));
                }
            }
        }
        let hello_deadline = self.hello_deadline_ns();
        let full_deadline = self.cfg.connect_timeout.map(|t| t.as_nanos() as u64);
        let mut i = 0;
        while i < self.pending.len() {
            let a = &self.pending[i];
            let late = if a.authenticated() {
                full_deadline.is_some_and(|d| crate::comm::past(now, a.since, d))
            } else {
                crate::comm::past(now, a.since, hello_deadline)
            };
            if late {
                let a = self.pending.swap_remove(i);
                let detail = format!(
                    "no progress in {:.1} s, stage reached: {} (VERBSNET_CONNECT_TIMEOUT)",
                    now.saturating_sub(a.since) as f64 / 1e9,
                    a.stage_name()
                );
                self.refusals.refuse(at, a.peer, Refusal::Deadline, &detail);
                continue;
            }
            let before = self.pending.len();
            if let Some(c) = self.step_or_refuse(i)? {
                return Ok(Some(self.accepted(c)));
            }
            if self.pending.len() == before {
                i += 1;
            }
        }
        self.refusals.tick(at, now);
        self.watch_wait(now, since)?;
        Ok(None)
    }

    /// Bookkeeping after a handshake completed.
    fn accepted(&mut self, c: RecvComm) -> RecvComm {
        self.waiting_since = None;
        self.warned_wait = false;
        c
    }

    /// The hang watchdog and the deadline of a wait for a connection.
    fn watch_wait(&mut self, now: u64, since: u64) -> Result<(), Error> {
        let waited = now.saturating_sub(since);
        let what = || {
            let best = self
                .pending
                .iter()
                .filter(|a| a.authenticated())
                .map(|a| format!("{} from {}", a.stage_name(), a.peer))
                .next();
            match best {
                Some(b) => format!("stage reached: {b}"),
                None => format!(
                    "stage reached: TCP connect (no peer holding this handle connected; {} other \
                     handshakes pending, {} refused)",
                    self.pending.len(),
                    self.refusals.total
                ),
            }
        };
        if let Some(t) = self.cfg.connect_timeout {
            if crate::comm::past(now, since, t.as_nanos() as u64) {
                self.waiting_since = None;
                return Err(Error::new(
                    Stage::Accept,
                    Class::Remote,
                    format!(
                    "accept on {}: no connection completed within VERBSNET_CONNECT_TIMEOUT={} s; \
                     {}. Is the connecting rank alive (see its log)? Raise \
                     VERBSNET_CONNECT_TIMEOUT if ranks start far apart",
                    self.handle.addr,
                    t.as_secs_f64(),
                    what()
                ),
                ));
            }
        }
        if let Some(h) = self.cfg.hang_timeout {
            if !self.warned_wait && waited > h.as_nanos() as u64 {
                self.warned_wait = true;
                warn!(
                    "accept on {} has made no progress for {:.1} s; {} (VERBSNET_HANG_TIMEOUT sets \
                     this report's delay; VERBSNET_CONNECT_TIMEOUT fails the accept)",
                    self.handle.addr,
                    waited as f64 / 1e9,
                    what()
                );
            }
        }
        Ok(())
    }

    /// Drops the oldest unauthenticated handshake (else the oldest of all) to make room.
    fn evict_oldest(&mut self) {
        let pick = |auth: bool| {
            self.pending
                .iter()
                .enumerate()
                .filter(|(_, a)| a.authenticated() == auth)
                .min_by_key(|(_, a)| a.since)
                .map(|(i, _)| i)
        };
        if let Some(i) = pick(false).or_else(|| pick(true)) {
            let a = self.pending.remove(i);
            let detail = format!(
                "{MAX_PENDING_HANDSHAKES} handshakes pending, this one the oldest; stage reached: {}",
                a.stage_name()
            );
            self.refusals
                .refuse(self.handle.addr, a.peer, Refusal::Evicted, &detail);
        }
    }

    /// Steps pending handshake `i`; a refused one is removed (and logged), a completed one is
    /// removed and returned.
    fn step_or_refuse(&mut self, i: usize) -> Result<Option<RecvComm>, Error> {
        match self.step(i) {
            Ok(Some(c)) => {
                self.pending.swap_remove(i);
                Ok(Some(c))
            }
            Ok(None) => Ok(None),
            Err(StepError::Refuse(why, detail)) => {
                let a = self.pending.swap_remove(i);
                self.refusals.refuse(self.handle.addr, a.peer, why, &detail);
                Ok(None)
            }
            Err(StepError::Own(e)) => {
                self.pending.swap_remove(i);
                Err(e)
            }
        }
    }

    fn step(&mut self, i: usize) -> Result<Option<RecvComm>, StepError> {
        let kind_byte = self.handle_kind_byte();
        let a = &mut self.pending[i];
        if let AcceptStage::Hello = a.stage {
            let h = match a.reader.poll(&mut a.wire) {
                Ok(Some(h)) => h,
                Ok(None) => return Ok(None),
                Err(HelloError::Io(e)) => {
                    return Err(StepError::Refuse(refusal_of_io(&e), e.to_string()))
                }
                Err(HelloError::Bad(m)) => return Err(StepError::Refuse(Refusal::Malformed, m)),
            };
            if h.nonce != self.handle.nonce || h.role != 1 {
                return Err(StepError::Refuse(
                    Refusal::Nonce,
                    format!(
                        "nonce {:#x} role {} (a stale or foreign handle)",
                        h.nonce, h.role
                    ),
                ));
            }
            if h.kind != kind_byte {
                return Err(StepError::Refuse(
                    Refusal::Transport,
                    format!(
                        "the peer runs transport {} but this listener runs {}: set the same \
                         VERBSNET_TRANSPORT on every rank",
                        h.kind,
                        self.handle.kind.as_str()
                    ),
                ));
            }
            // The sender's traffic class and SL, as NCCL IB's receiver adopts the sender's
            // (`ncclIbAccept`, `net_ib/connect.cc`): one class on both ends of a connection.
            let mut qpc = qp_config(&self.cfg);
            qpc.traffic_class = h.tc;
            // The receive comm posts its CTS entries and credit words inline when they fit:
            // it asks for one compact entry (`VERBSNET_INLINE_SIZE` caps it; 0: none), as NCCL
            // IB asks for one FIFO element with `NCCL_IB_USE_INLINE` (`net_ib/connect.cc`).
            qpc.max_inline_data = self
                .cfg
                .inline_size
                .map_or(CTS_COMPACT_LEN as u32, |n| n.min(CTS_COMPACT_LEN as u32));
            qpc.service_level = h.sl;
            // The sender's QP count and split too (NCCL IB takes the larger count of both
            // sides, `ncclIbAccept`, `net_ib/connect.cc`; verbsnet lets the sender decide).
            let n = h.qps();
            // What this rank would make: its setting per device of the side with more.
            let (own_n, own_split) = (
                usize::from(self.cfg.ib_qps_per_connection) * qp_devices(self.devs.len(), h.devs.0),
                self.cfg.ib_split_data_on_qps,
            );
            if (n, h.split) != (own_n, own_split) {
                info!(
                    target: "verbsnet::init",
                    "accept on {}: the sender {} asks for {n} QPs per connection, split {}; this \
                     rank's setting is {own_n}, split {}: the sender's values apply \
                     (VERBSNET_IB_QPS_PER_CONNECTION / VERBSNET_IB_SPLIT_DATA_ON_QPS)",
                    self.handle.addr,
                    a.peer,
                    if h.split { "on" } else { "off" },
                    if own_split { "on" } else { "off" },
                );
            }
            // The receiver's devices as the sender read them from our handle; QP `q` runs on
            // our device `q % devs` whatever the sender's count (`create_qps`).
            let own = self.devs.len() as u8;
            if h.devs.1 != own {
                return Err(StepError::Refuse(
                    Refusal::Malformed,
                    format!(
                        "the hello names {} receiver devices, this listener has {own} (a handle \
                         of another listener?)",
                        h.devs.1
                    ),
                ));
            }
            let mut qps = create_qps(&self.devs, &self.dev_name, &qpc, n, false)?;
            let bufs = RecvBuffers::alloc(&self.devs[0], &self.cfg, own)
                .map_err(|e| e.lift(Stage::Buffers))?;
            let engine = RecvComm::prepare(
                &mut *qps[0],
                (n as u8, h.split, own),
                &bufs,
                &h.p,
                &self.cfg,
            )
            .map_err(|e| e.lift(Stage::Buffers))?;
            let oob =
                a.wire.stream.try_clone().map_err(|e| {
                    Error::new(Stage::QpSetup, Class::System, "dup socket").because(e)
                })?;
            // The peer's QP info is the peer's data: a version or content it cannot use refuses
            // that peer, it does not fail the listener.
            qps[0].establish(&h.qp_info[0], oob).map_err(|e| {
                StepError::Refuse(
                    Refusal::QpInfo,
                    format!("stage RTR/RTS: connecting our QP to its QP info failed: {e}"),
                )
            })?;
            // Data QPs before the reply goes out (tcp: each connects its own stream to the
            // sender's data QP, which accepts it once it has the reply).
            for (i, (qp, info)) in qps.iter_mut().zip(&h.qp_info).enumerate().skip(1) {
                qp.establish_data(info).map_err(|e| {
                    StepError::Refuse(
                        Refusal::QpInfo,
                        format!(
                            "stage RTR/RTS: connecting our data QP {i} of {n} to its QP info \
                             failed: {e}"
                        ),
                    )
                })?;
            }
            let reply = Hello {
                kind: h.kind,
                role: 2,
                nonce: h.nonce,
                qp_info: qps.iter().map(|q| q.local_info()).collect(),
                split: h.split,
                devs: h.devs,
                p: RecvComm::announce(&bufs, &engine, &self.cfg),
                tc: h.tc,
                sl: h.sl,
            };
            a.wire.out.extend_from_slice(&reply.encode());
            a.stage = AcceptStage::Reply {
                qps,
                split: h.split,
                peer_devs: h.devs.0,
                bufs,
                engine,
                tc: h.tc,
                sl: h.sl,
            };
        }
        if let AcceptStage::Reply { .. } = a.stage {
            let io = |e: io::Error| StepError::Refuse(refusal_of_io(&e), e.to_string());
            if !a.wire.flush().map_err(io)? {
                return Ok(None);
            }
            let Some(b) = a.wire.read_exact_nb(READY.len()).map_err(io)? else {
                return Ok(None);
            };
            if b != READY {
                return Err(StepError::Refuse(
                    Refusal::Malformed,
                    "bad ready message".into(),
                ));
            }
            let AcceptStage::Reply {
                mut qps,
                split,
                peer_devs,
                bufs,
                engine,
                tc,
                sl,
            } = std::mem::replace(&mut a.stage, AcceptStage::Done)
            else {
                unreachable!()
            };
            // The streams are the QPs' from here (tcp: its progress thread may read them).
            for qp in &mut qps {
                qp.handshake_complete();
            }
            let label = format!(
                "recv comm {} <- {} ({})",
                self.handle.addr, a.peer, self.dev_name
            );
            info!(
                target: "verbsnet::init",
                "{label}: connected; RQ depth {} posted in batches of {}, low-water {}, credits {} granted \
                 initially, credit gating {} (the sender's VERBSNET_CREDITS), traffic class {} SL {} \
                 (the sender's){}",
                self.cfg.rq_depth,
                self.cfg.rq_batch,
                self.cfg.rq_low_water,
                engine.granted(),
                if engine.credits() { "on" } else { "off" },
                tc,
                sl,
                qps_note(qps.len(), split, (self.devs.len(), peer_devs.into()))
            );
            return Ok(Some(RecvComm::new(
                self.devs.clone(),
                qps,
                bufs,
                engine,
                &self.cfg,
                label,
            )));
        }
        Ok(None)
    }

    fn handle_kind_byte(&self) -> u8 {
        match self.handle.kind {
            Kind::Ib => 1,
            Kind::Tcp => 2,
        }
    }
}

impl Drop for Listen {
    fn drop(&mut self) {
        self.refusals.flush(self.handle.addr, crate::comm::now_ns());
    }
}
