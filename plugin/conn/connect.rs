//! `connect`: one connect's non-blocking state machine (`Connecting`: TCP connect → hello →
//! QP exchange → RTR/RTS → ready), and [`Connects`], where the connects of one plugin context
//! wait between NCCL's calls.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tracing::{info, warn};

use super::handle::{self, Handle, HANDLE_SIZE};
use super::hello::{Hello, HelloReader, Wire, READY};
use super::{conn_qps, create_qps, qp_config, qps_note, traffic_class_and_sl, Error, Stage};
use crate::comm::{message, Class, PeerParams, SendBuffers, SendComm};
use crate::config::Config;
use crate::transport::{Device, Kind, QueuePair};

/// The connects in progress of one plugin context (`api::Context`), between NCCL's `connect`
/// calls, by the id their handle carries. NCCL keeps only the handle, so the state waits here;
/// an id is never reused (in the process), and a handle whose id is not here (forged, stale, or
/// another context's) starts a fresh connect.
///
/// A connect NCCL abandons (it aborts mid-connect and never calls again with that handle) is
/// freed — its socket, QP and buffers — when its context is finalized ([`Connects::release`])
/// and once its deadline (`VERBSNET_CONNECT_TIMEOUT`) has passed, by the context's next
/// `connect` or `listen` ([`Connects::expire`]). What stays of an expired connect is its
/// timeout error, which a later call with its handle returns (as the connect would have), until
/// that call or the context's finalize.
#[derive(Default)]
pub struct Connects {
    parked: Mutex<HashMap<u64, Parked>>,
}

/// A connect waiting for NCCL's next call.
enum Parked {
    /// In progress.
    Waiting(Box<Connecting>),
    /// Past its deadline, its resources freed: the error its handle's next call returns.
    Expired(Handle, Error),
}

/// The next parked connect's id (0 means "none" in a handle).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Connects {
    /// No connect in progress.
    pub fn new() -> Connects {
        Connects::default()
    }

    /// One non-blocking step of the connect `handle` describes (started by the first call,
    /// resumed by the next ones: NCCL passes the same handle until it gets a comm):
    /// `Ok(Some(comm))` once connected, `Ok(None)` = call again. Expires this context's other
    /// connects past their deadline first.
    ///
    /// # Errors
    /// A handle that is not a verbsnet listen handle ([`Stage::Handle`]), the connect's own
    /// failures, and its deadline (`cfg.connect_timeout`, naming the address and the stage
    /// reached). A failed or finished connect clears the handle's state id.
    pub fn step(
        &self,
        handle: &mut [u8; HANDLE_SIZE],
        devs: &[Arc<dyn Device>],
        dev_name: &str,
        cfg: &Config,
    ) -> Result<Option<SendComm>, Error> {
        self.expire(crate::comm::now_ns());
        let h = Handle::read(handle)?;
        let mut c = match self.resume(handle::state_id(handle), h) {
            Some(Parked::Waiting(c)) => c,
            Some(Parked::Expired(_, e)) => {
                handle::set_state_id(handle, 0);
                return Err(e);
            }
            None => Connecting::start(h, cfg)?,
        };
        let r = c.step(devs, dev_name, cfg);
        match &r {
            Ok(None) => self.park(c, handle),
            Ok(Some(_)) | Err(_) => handle::set_state_id(handle, 0),
        }
        r
    }

    /// Frees every connect whose deadline passed by `now`, keeping only its error.
    pub fn expire(&self, now: u64) {
        let mut parked = self.lock();
        for p in parked.values_mut() {
            if let Parked::Waiting(c) = p {
                if let Some(t) = c.timeout.filter(|_| c.expired(now)) {
                    *p = Parked::Expired(c.handle, c.timed_out(now, t));
                }
            }
        }
    }

    /// Frees every parked connect (the context is finalized); returns how many were in
    /// progress.
    pub fn release(&self) -> usize {
        let parked = std::mem::take(&mut *self.lock());
        parked
            .values()
            .filter(|p| matches!(p, Parked::Waiting(_)))
            .count()
    }

    /// Connects in progress between calls (tests).
    pub fn waiting(&self) -> usize {
        self.lock()
            .values()
            .filter(|p| matches!(p, Parked::Waiting(_)))
            .count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Parked>> {
        self.parked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the connect parked under `id`, if it is the one the handle `h` describes: a copied
    /// handle buffer carrying the id of another connect (another listener) starts its own
    /// instead of taking that one.
    fn resume(&self, id: u64, h: Handle) -> Option<Parked> {
        if id == 0 {
            return None;
        }
        let mut parked = self.lock();
        let ours = match parked.get(&id)? {
            Parked::Waiting(c) => c.handle == h,
            Parked::Expired(handle, _) => *handle == h,
        };
        ours.then(|| parked.remove(&id)).flatten()
    }

    /// Keeps `c` for the next call, its id in `handle`.
    fn park(&self, c: Box<Connecting>, handle: &mut [u8; HANDLE_SIZE]) {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, Parked::Waiting(c));
        handle::set_state_id(handle, id);
    }
}

/// State of one `connect` in progress.
struct Connecting {
    handle: Handle,
    stage: ConnectStage,
    /// When this connect started (ns, [`crate::comm::now_ns`]).
    started: u64,
    /// When it last reached a new stage.
    progressed: u64,
    /// The hang watchdog reported this connect already.
    warned: bool,
    /// `VERBSNET_CONNECT_TIMEOUT` when it started (`None`: no deadline).
    timeout: Option<Duration>,
}

enum ConnectStage {
    Connecting(socket2::Socket),
    Hello {
        wire: Wire,
        reader: HelloReader,
        /// The connection's QPs, QP 0 first (`VERBSNET_IB_QPS_PER_CONNECTION`).
        qps: Vec<Box<dyn QueuePair>>,
        bufs: SendBuffers,
        first_seq: u64,
    },
    Ready {
        wire: Wire,
        qps: Vec<Box<dyn QueuePair>>,
        bufs: SendBuffers,
        peer: PeerParams,
    },
    Done,
}

impl Connecting {
    /// Starts a connect to the listener `h` names: the TCP connect is in flight. Its deadline is
    /// `cfg.connect_timeout` from now.
    fn start(h: Handle, cfg: &Config) -> Result<Box<Connecting>, Error> {
        let sock = socket2::Socket::new(
            socket2::Domain::for_address(h.addr),
            socket2::Type::STREAM,
            None,
        )
        .map_err(|e| Error::new(Stage::Connect, Class::System, "socket").because(e))?;
        sock.set_nonblocking(true)
            .map_err(|e| Error::new(Stage::Connect, Class::System, "socket").because(e))?;
        match sock.connect(&h.addr.into()) {
            Ok(()) => {}
            Err(e)
                if e.raw_os_error() == Some(libc::EINPROGRESS)
                    || e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(connect_error(h.addr, e)),
        }
        let now = crate::comm::now_ns();
        Ok(Box::new(Connecting {
            handle: h,
            stage: ConnectStage::Connecting(sock),
            started: now,
            progressed: now,
            warned: false,
            timeout: cfg.connect_timeout,
        }))
    }

    /// Past its deadline at `now` (`VERBSNET_CONNECT_TIMEOUT` since it started).
    fn expired(&self, now: u64) -> bool {
        self.timeout
            .is_some_and(|t| crate::comm::past(now, self.started, t.as_nanos() as u64))
    }

    /// The error of this connect once past its deadline `t` at `now`: the address, the time
    /// taken and the stage reached.
    fn timed_out(&self, now: u64, t: Duration) -> Error {
        let elapsed = now.saturating_sub(self.started);
        Error::new(
            Stage::Connect,
            Class::Remote,
            format!(
                "connect to {} timed out after {:.1} s (VERBSNET_CONNECT_TIMEOUT={} s); stage \
                 reached: {}. Check that the peer is alive and calls accept (its log), and that \
                 {} is reachable from here; raise VERBSNET_CONNECT_TIMEOUT if ranks start far \
                 apart",
                self.handle.addr,
                elapsed as f64 / 1e9,
                t.as_secs_f64(),
                self.stage_name(),
                self.handle.addr
            ),
        )
    }

    /// The stage this connect has reached, for errors and the hang watchdog.
    fn stage_name(&self) -> &'static str {
        match &self.stage {
            ConnectStage::Connecting(_) => {
                "TCP connect (no answer from the listener's address: wrong address, a firewall \
                 dropping packets, or the host is down)"
            }
            ConnectStage::Hello { wire, .. } if !wire.out.is_empty() => {
                "handshake (sending our hello: the listener does not read)"
            }
            ConnectStage::Hello { .. } => {
                "QP exchange (waiting for the listener's reply: its process does not call accept, \
                 or is stuck)"
            }
            ConnectStage::Ready { .. } | ConnectStage::Done => {
                "RTR/RTS (sending our ready message)"
            }
        }
    }

    /// One non-blocking step: `Ok(Some(comm))` once connected. Fails once `cfg.connect_timeout`
    /// has passed since the connect started, naming the address and the stage reached; the hang
    /// watchdog (`cfg.hang_timeout`) reports a connect that reached no new stage for that long.
    fn step(
        &mut self,
        devs: &[Arc<dyn Device>],
        dev_name: &str,
        cfg: &Config,
    ) -> Result<Option<SendComm>, Error> {
        let before = std::mem::discriminant(&self.stage);
        let r = self.step_inner(devs, dev_name, cfg);
        let now = crate::comm::now_ns();
        if std::mem::discriminant(&self.stage) != before {
            self.progressed = now;
            self.warned = false;
        }
        if !matches!(r, Ok(None)) {
            return r;
        }
        if let Some(t) = cfg.connect_timeout {
            if crate::comm::past(now, self.started, t.as_nanos() as u64) {
                return Err(self.timed_out(now, t));
            }
        }
        if let Some(h) = cfg.hang_timeout {
            let idle = now.saturating_sub(self.progressed);
            if !self.warned && idle > h.as_nanos() as u64 {
                self.warned = true;
                warn!(
                    "connect to {} has made no progress for {:.1} s; stage reached: {} \
                     (VERBSNET_HANG_TIMEOUT sets this report's delay; VERBSNET_CONNECT_TIMEOUT={} \
                     fails the connect)",
                    self.handle.addr,
                    idle as f64 / 1e9,
                    self.stage_name(),
                    cfg.connect_timeout
                        .map_or("0 (off)".to_string(), |t| format!("{} s", t.as_secs_f64()))
                );
            }
        }
        r
    }

    fn step_inner(
        &mut self,
        devs: &[Arc<dyn Device>],
        dev_name: &str,
        cfg: &Config,
    ) -> Result<Option<SendComm>, Error> {
        if let ConnectStage::Connecting(sock) = &self.stage {
            if let Some(e) = sock
                .take_error()
                .map_err(|e| Error::wrap(Stage::Connect, Class::System, e))?
            {
                return Err(connect_error(self.handle.addr, e));
            }
            if sock.peer_addr().is_err() {
                return Ok(None);
            }
            let ConnectStage::Connecting(sock) =
                std::mem::replace(&mut self.stage, ConnectStage::Done)
            else {
                unreachable!()
            };
            let stream: TcpStream = sock.into();
            let _ = stream.set_nodelay(true);
            let mut qpc = qp_config(cfg);
            if cfg.inline_size.is_none() {
                qpc.max_inline_data = devs[0].default_max_inline_data();
            }
            // NCCL IB: `NCCL_IB_QPS_PER_CONNECTION` × the larger device count of both sides
            // (`ncclIbConnect`, `net_ib/connect.cc`).
            let peer_devs = self.handle.devs;
            let n = conn_qps(cfg, devs.len(), peer_devs)?;
            let mut qps = create_qps(devs, dev_name, &qpc, n, true)?;
            // Data QPs: their peer connects to them (tcp: on the set-up stream's address).
            let local_ip = stream
                .local_addr()
                .map_err(|e| Error::new(Stage::QpSetup, Class::System, "getsockname").because(e))?
                .ip();
            for (i, qp) in qps.iter_mut().enumerate().skip(1) {
                qp.listen_data(local_ip).map_err(|e| {
                    let msg = format!("preparing data QP {i} of {n} on {dev_name}");
                    Error::new(Stage::QpSetup, Class::System, msg).because(e)
                })?;
            }
            let bufs =
                SendBuffers::alloc(&*devs[0], peer_devs).map_err(|e| e.lift(Stage::Buffers))?;
            // 0 in production; tests start near the wrap points (`Config::test_first_seq`).
            let first_seq = cfg.test_first_seq;
            let hello = Hello {
                kind: match self.handle.kind {
                    Kind::Ib => 1,
                    Kind::Tcp => 2,
                },
                role: 1,
                nonce: self.handle.nonce,
                qp_info: qps.iter().map(|q| q.local_info()).collect(),
                split: cfg.ib_split_data_on_qps,
                devs: (devs.len() as u8, peer_devs),
                p: bufs.announce(cfg, first_seq),
                tc: qpc.traffic_class,
                sl: qpc.service_level,
            };
            let mut wire = Wire::new(stream);
            wire.out.extend_from_slice(&hello.encode());
            self.stage = ConnectStage::Hello {
                wire,
                reader: HelloReader { len: None },
                qps,
                bufs,
                first_seq,
            };
        }
        let addr = self.handle.addr;
        let remote = move |cause: crate::comm::Source| {
            let msg = format!("handshake with {addr} failed");
            Error::new(Stage::Hello, Class::Remote, msg).because_source(cause)
        };
        if let ConnectStage::Hello { wire, reader, .. } = &mut self.stage {
            wire.flush().map_err(|e| remote(Arc::new(e)))?;
            let Some(h) = reader.poll(wire).map_err(|e| remote(Arc::new(e)))? else {
                return Ok(None);
            };
            if h.nonce != self.handle.nonce || h.role != 2 {
                return Err(remote(message("the reply carries another nonce")));
            }
            let ConnectStage::Hello {
                wire,
                mut qps,
                bufs,
                first_seq,
                ..
            } = std::mem::replace(&mut self.stage, ConnectStage::Done)
            else {
                unreachable!()
            };
            let want_devs = (devs.len() as u8, self.handle.devs);
            if h.qps() != qps.len() || h.split != cfg.ib_split_data_on_qps || h.devs != want_devs {
                return Err(remote(message(format!(
                    "the reply carries {} QP infos (split {}, devices {:?}) for our {} QPs \
                     (split {}, devices {want_devs:?}): the receiver must adopt the sender's \
                     VERBSNET_IB_QPS_PER_CONNECTION (mixed plugin versions?)",
                    h.qps(),
                    h.split,
                    h.devs,
                    qps.len(),
                    cfg.ib_split_data_on_qps
                ))));
            }
            let oob = wire
                .stream
                .try_clone()
                .map_err(|e| Error::new(Stage::QpSetup, Class::System, "dup socket").because(e))?;
            qps[0].establish(&h.qp_info[0], oob).map_err(|e| {
                let msg = format!("connecting the QP to {}", self.handle.addr);
                Error::new(Stage::QpSetup, Class::System, msg).because(e)
            })?;
            let n = qps.len();
            for (i, (qp, info)) in qps.iter_mut().zip(&h.qp_info).enumerate().skip(1) {
                qp.establish_data(info).map_err(|e| {
                    let msg = format!("connecting data QP {i} of {n} to {}", self.handle.addr);
                    Error::new(Stage::QpSetup, Class::System, msg).because(e)
                })?;
            }
            let mut wire = wire;
            wire.out.extend_from_slice(READY);
            // (`h.p.rkeys` is the reply's receiver device count, checked above to be the
            // handle's.)
            let peer = PeerParams { first_seq, ..h.p };
            self.stage = ConnectStage::Ready {
                wire,
                qps,
                bufs,
                peer,
            };
        }
        if let ConnectStage::Ready { wire, .. } = &mut self.stage {
            if !wire.flush().map_err(|e| remote(Arc::new(e)))? {
                return Ok(None);
            }
            let ConnectStage::Ready {
                mut qps,
                bufs,
                peer,
                wire,
            } = std::mem::replace(&mut self.stage, ConnectStage::Done)
            else {
                unreachable!()
            };
            // The streams are the QPs' from here (tcp: its progress thread may read them).
            for qp in &mut qps {
                qp.handshake_complete();
            }
            let local = wire
                .stream
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            let label = format!("send comm {local} -> {} ({dev_name})", self.handle.addr);
            // Ours, as the QP was made with them; the receiver adopted and echoed them.
            let (tc, sl) = traffic_class_and_sl(cfg);
            info!(
                target: "verbsnet::init",
                "{label}: connected; eager limit {} B, credit gating {}, {} initial credits, \
                 traffic class {} SL {}{}",
                u64::from(cfg.eager_limit).min(peer.eager_buf_size),
                if cfg.credits { "on" } else { "off" },
                peer.initial_credits,
                tc,
                sl,
                qps_note(qps.len(), cfg.ib_split_data_on_qps, (devs.len(), peer.rkeys.into()))
            );
            return Ok(Some(SendComm::new(
                devs.to_vec(),
                qps,
                cfg.ib_split_data_on_qps,
                bufs,
                &peer,
                cfg,
                label,
            )));
        }
        Ok(None)
    }
}

fn connect_error(addr: SocketAddr, e: io::Error) -> Error {
    let msg = format!("cannot reach the listener at {addr} (stage: TCP connect)");
    Error::new(Stage::Connect, Class::Remote, msg)
        .because(e)
        .fix(
            " (is the peer alive? is the address reachable? set VERBSNET_SOCKET_ADDR / \
             VERBSNET_SOCKET_IFNAME on the listening rank)",
        )
}
