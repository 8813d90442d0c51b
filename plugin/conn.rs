//! Connection set-up: the listen handle and the non-blocking connect/accept state machines.
//!
//! NCCL's contract (ext-net README): `listen` fills an opaque 128-byte handle that NCCL ships to
//! the peer; `connect` and `accept` must not block — they return success with a NULL comm
//! until the connection is ready, and NCCL calls them again with the same handle / listen
//! comm. We keep the connect state in a process-wide registry under an id stored in the
//! handle's last 8 bytes (NCCL IB keeps its connect state in the handle too); an id the
//! registry does not know starts a fresh connect, so a forged handle is never dereferenced.
//!
//! ## Handle (128 bytes, little-endian)
//! | off | size | field |
//! |----:|-----:|-------|
//! | 0 | 8 | magic `VNETHDL1` |
//! | 8 | 8 | nonce (random per listen comm; a connection with another nonce is refused) |
//! | 16 | 1 | address family (4 or 6) |
//! | 17 | 1 | transport (1 = ib, 2 = tcp) |
//! | 18 | 2 | TCP port |
//! | 20 | 16 | IP address (IPv4 in the first 4 bytes) |
//! | 120 | 8 | connect state id (0 as shipped by `listen`) |
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

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tracing::{info, warn};

use crate::comm::{
    message, Class, Failure, PeerParams, RecvBuffers, RecvComm, SendBuffers, SendComm,
};

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
use crate::config::Config;
use crate::engine::RecvEngine;
use crate::transport::{Device, Kind, QpConfig, QueuePair};

/// Bytes of NCCL's opaque handle (`NCCL_NET_HANDLE_MAXSIZE`).
pub const HANDLE_SIZE: usize = 128;
const HANDLE_MAGIC: &[u8; 8] = b"VNETHDL1";
const STATE_OFF: usize = 120;
const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"VNHE");
/// Wire version of the handshake and the data protocol. 2: a rendezvous immediate names the
/// receive it matched (`engine::wire`), and matching follows the front-group rule; a peer of
/// version 1 is refused at connect time instead of misplacing data.
pub const HELLO_VERSION: u16 = 2;
const READY: &[u8; 4] = b"RDY!";
const MAX_HELLO: usize = 1024;

/// The decoded listen handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    /// Random nonce of the listen comm.
    pub nonce: u64,
    /// Transport the listener runs.
    pub kind: Kind,
    /// Where the listener accepts the out-of-band connection.
    pub addr: SocketAddr,
}

impl Handle {
    /// Serializes into the first 120 bytes of `b`; the state word is zeroed.
    pub fn write(&self, b: &mut [u8; HANDLE_SIZE]) {
        b.fill(0);
        b[0..8].copy_from_slice(HANDLE_MAGIC);
        b[8..16].copy_from_slice(&self.nonce.to_le_bytes());
        b[17] = match self.kind {
            Kind::Ib => 1,
            Kind::Tcp => 2,
        };
        b[18..20].copy_from_slice(&self.addr.port().to_le_bytes());
        match self.addr.ip() {
            IpAddr::V4(a) => {
                b[16] = 4;
                b[20..24].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                b[16] = 6;
                b[20..36].copy_from_slice(&a.octets());
            }
        }
    }

    /// Parses a handle; errors name what is wrong with it.
    pub fn read(b: &[u8; HANDLE_SIZE]) -> Result<Handle, Error> {
        if &b[0..8] != HANDLE_MAGIC {
            return Err(Error::new(
                Stage::Handle,
                Class::InvalidArgument,
                "the connect handle was not made by verbsnet's listen (wrong magic): both ranks must \
                 use the same NCCL net plugin",
            ));
        }
        let kind = match b[17] {
            1 => Kind::Ib,
            2 => Kind::Tcp,
            k => {
                return Err(Error::new(
                    Stage::Handle,
                    Class::InvalidArgument,
                    format!("connect handle names unknown transport {k}"),
                ))
            }
        };
        let port = u16::from_le_bytes([b[18], b[19]]);
        let ip = match b[16] {
            4 => IpAddr::V4(Ipv4Addr::new(b[20], b[21], b[22], b[23])),
            6 => IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(&b[20..36]).expect("16 bytes"),
            )),
            f => {
                return Err(Error::new(
                    Stage::Handle,
                    Class::InvalidArgument,
                    format!("connect handle has address family {f}"),
                ))
            }
        };
        Ok(Handle {
            nonce: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            kind,
            addr: SocketAddr::new(ip, port),
        })
    }
}

/// One side's handshake message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Hello {
    kind: u8,
    role: u8,
    nonce: u64,
    qp_info: Vec<u8>,
    p: PeerParams,
}

impl Hello {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(128 + self.qp_info.len());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
        b.extend_from_slice(&HELLO_VERSION.to_le_bytes());
        b.push(self.kind);
        b.push(self.role);
        b.extend_from_slice(&self.nonce.to_le_bytes());
        b.extend_from_slice(&(self.qp_info.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.qp_info);
        let p = &self.p;
        for v in [
            p.cts_ring.0,
            u64::from(p.cts_ring.1),
            p.credit_word.0,
            u64::from(p.credit_word.1),
            u64::from(p.credits),
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [
            p.first_seq,
            p.rec_ring.0,
            u64::from(p.rec_ring.1),
            p.initial_credits,
            p.eager_buf_size,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let len = (b.len() - 4) as u32;
        b[0..4].copy_from_slice(&len.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Hello> {
        let mut c = Cursor(b);
        if c.u32()? != HELLO_MAGIC || c.u16()? != HELLO_VERSION {
            return None;
        }
        let kind = c.u8()?;
        let role = c.u8()?;
        let nonce = c.u64()?;
        let n = c.u16()? as usize;
        let qp_info = c.take(n)?.to_vec();
        let mut v = [0u64; 10];
        for x in v.iter_mut() {
            *x = c.u64()?;
        }
        Some(Hello {
            kind,
            role,
            nonce,
            qp_info,
            p: PeerParams {
                cts_ring: (v[0], v[1] as u32),
                credit_word: (v[2], v[3] as u32),
                credits: v[4] != 0,
                first_seq: v[5],
                rec_ring: (v[6], v[7] as u32),
                initial_credits: v[8],
                eager_buf_size: v[9],
            },
        })
    }
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (h, t) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = t;
        Some(h)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// Non-blocking framed I/O on the handshake stream. Reads never go past the current frame,
/// so the stream can be handed to the tcp transport right after the handshake.
struct Wire {
    stream: TcpStream,
    out: Vec<u8>,
    inb: Vec<u8>,
    want: usize,
}

impl Wire {
    fn new(stream: TcpStream) -> Wire {
        Wire {
            stream,
            out: Vec::new(),
            inb: Vec::new(),
            want: 0,
        }
    }

    /// Writes queued bytes; true once all are out.
    fn flush(&mut self) -> io::Result<bool> {
        while !self.out.is_empty() {
            match self.stream.write(&self.out) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Reads exactly `n` bytes in total across calls; `Some` once complete.
    fn read_exact_nb(&mut self, n: usize) -> io::Result<Option<Vec<u8>>> {
        if self.want == 0 {
            self.want = n;
            self.inb.clear();
        }
        while self.inb.len() < self.want {
            let mut buf = [0u8; 512];
            let k = (self.want - self.inb.len()).min(buf.len());
            match self.stream.read(&mut buf[..k]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the connection",
                    ))
                }
                Ok(m) => self.inb.extend_from_slice(&buf[..m]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.want = 0;
        Ok(Some(std::mem::take(&mut self.inb)))
    }
}

/// Reads one length-prefixed hello across calls.
struct HelloReader {
    len: Option<usize>,
}

/// Why a hello could not be read.
enum HelloError {
    /// The stream failed or closed.
    Io(io::Error),
    /// The bytes are not a hello of our version.
    Bad(String),
}

impl std::fmt::Display for HelloError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HelloError::Io(e) => write!(f, "{e}"),
            HelloError::Bad(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for HelloError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // The text is the io error's already.
            HelloError::Io(e) => e.source(),
            HelloError::Bad(_) => None,
        }
    }
}

impl std::fmt::Debug for HelloError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl HelloReader {
    fn poll(&mut self, w: &mut Wire) -> Result<Option<Hello>, HelloError> {
        if self.len.is_none() {
            match w.read_exact_nb(4).map_err(HelloError::Io)? {
                None => return Ok(None),
                Some(b) => {
                    let n = u32::from_le_bytes(b[..4].try_into().expect("4 bytes")) as usize;
                    if n == 0 || n > MAX_HELLO {
                        return Err(HelloError::Bad(format!("handshake message of {n} bytes")));
                    }
                    self.len = Some(n);
                }
            }
        }
        let n = self.len.expect("set");
        match w.read_exact_nb(n).map_err(HelloError::Io)? {
            None => Ok(None),
            Some(b) => Hello::decode(&b).map(Some).ok_or_else(|| {
                HelloError::Bad(format!(
                    "malformed handshake message (not a verbsnet hello of version \
                     {HELLO_VERSION}: both ranks must run the same verbsnet)"
                ))
            }),
        }
    }
}

/// The QP settings every connection asks for under `cfg` (public so that `verbsnet-perf doctor`
/// checks them against the device's limits).
pub fn qp_config(cfg: &Config) -> QpConfig {
    // Sender: data WRs (2 per rendezvous) for every request slot; receiver: CTS and credit writes.
    QpConfig {
        max_recv_wr: cfg.rq_depth,
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
    dev: Arc<dyn Device>,
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
        qp: Box<dyn QueuePair>,
        bufs: RecvBuffers,
        engine: RecvEngine,
    },
    Done,
}

/// Why a connection was refused (the keys of the refusal summary).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Refusal {
    Deadline,
    Evicted,
    Closed,
    Malformed,
    Nonce,
    Transport,
    QpInfo,
    Socket,
}

impl Refusal {
    fn as_str(self) -> &'static str {
        match self {
            Refusal::Deadline => "past the handshake deadline",
            Refusal::Evicted => "evicted (too many pending handshakes)",
            Refusal::Closed => "closed or reset by the peer",
            Refusal::Malformed => "malformed handshake",
            Refusal::Nonce => "wrong nonce",
            Refusal::Transport => "wrong transport",
            Refusal::QpInfo => "unusable QP info",
            Refusal::Socket => "socket error",
        }
    }
}

/// Rate-limited log of refused connections: the first refusal of an interval is logged at
/// once with its reason; the others are counted and summarized when the interval has passed.
struct Refusals {
    window_start: u64,
    logged_in_window: bool,
    counts: std::collections::BTreeMap<Refusal, u64>,
    total: u64,
}

impl Refusals {
    fn new() -> Refusals {
        Refusals {
            window_start: crate::comm::now_ns(),
            logged_in_window: false,
            counts: Default::default(),
            total: 0,
        }
    }

    fn refuse(&mut self, at: SocketAddr, peer: SocketAddr, why: Refusal, detail: &str) {
        self.total += 1;
        if !self.logged_in_window {
            self.logged_in_window = true;
            warn!(
                "refused connection from {peer} on {at}: {}: {detail} (further refusals are \
                 summarized every {} s)",
                why.as_str(),
                REFUSAL_LOG_INTERVAL.as_secs()
            );
        } else {
            *self.counts.entry(why).or_default() += 1;
        }
    }

    /// Logs the summary of the interval if it is over.
    fn tick(&mut self, at: SocketAddr, now: u64) {
        if now.saturating_sub(self.window_start) < REFUSAL_LOG_INTERVAL.as_nanos() as u64 {
            return;
        }
        self.flush(at, now);
    }

    fn flush(&mut self, at: SocketAddr, now: u64) {
        let n: u64 = self.counts.values().sum();
        if n > 0 {
            let parts: Vec<String> = self
                .counts
                .iter()
                .map(|(k, v)| format!("{v} {}", k.as_str()))
                .collect();
            warn!(
                "refused {n} more connection(s) on {at} in the last {:.0} s: {} ({} refused since \
                 listen; only peers holding this listen comm's handle can connect)",
                now.saturating_sub(self.window_start) as f64 / 1e9,
                parts.join(", "),
                self.total
            );
        }
        self.counts.clear();
        self.window_start = now;
        self.logged_in_window = false;
    }
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

fn refusal_of_io(e: &io::Error) -> Refusal {
    match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => Refusal::Closed,
        _ => Refusal::Socket,
    }
}

impl Listen {
    /// Opens a non-blocking listener on `ip` (port chosen by the OS) and writes the handle.
    pub fn new(
        dev: Arc<dyn Device>,
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
        };
        handle.write(out);
        Ok(Listen {
            listener,
            handle,
            dev,
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
    pub fn accept(&mut self) -> Result<Option<Box<RecvComm>>, Error> {
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
            let age = now.saturating_sub(a.since);
            let late = if a.authenticated() {
                full_deadline.is_some_and(|d| age > d)
            } else {
                age > hello_deadline
            };
            if late {
                let a = self.pending.swap_remove(i);
                let detail = format!(
                    "no progress in {:.1} s, stage reached: {} (VERBSNET_CONNECT_TIMEOUT)",
                    age as f64 / 1e9,
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
    fn accepted(&mut self, c: Box<RecvComm>) -> Box<RecvComm> {
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
            if waited > t.as_nanos() as u64 {
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
    fn step_or_refuse(&mut self, i: usize) -> Result<Option<Box<RecvComm>>, Error> {
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

    fn step(&mut self, i: usize) -> Result<Option<Box<RecvComm>>, StepError> {
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
            let mut qp = self.dev.create_qp(&qp_config(&self.cfg)).map_err(|e| {
                let msg = format!("creating a QP on {}", self.dev_name);
                Error::new(Stage::QpSetup, Class::System, msg).because(e)
            })?;
            let bufs =
                RecvBuffers::alloc(&self.dev, &self.cfg).map_err(|e| e.lift(Stage::Buffers))?;
            let engine = RecvComm::prepare(&mut *qp, &bufs, &h.p, &self.cfg)
                .map_err(|e| e.lift(Stage::Buffers))?;
            let oob =
                a.wire.stream.try_clone().map_err(|e| {
                    Error::new(Stage::QpSetup, Class::System, "dup socket").because(e)
                })?;
            // The peer's QP info is the peer's data: a version or content it cannot use refuses
            // that peer, it does not fail the listener.
            qp.establish(&h.qp_info, oob).map_err(|e| {
                StepError::Refuse(
                    Refusal::QpInfo,
                    format!("stage RTR/RTS: connecting our QP to its QP info failed: {e}"),
                )
            })?;
            let reply = Hello {
                kind: h.kind,
                role: 2,
                nonce: h.nonce,
                qp_info: qp.local_info(),
                p: RecvComm::announce(&bufs, &engine, &self.cfg),
            };
            a.wire.out.extend_from_slice(&reply.encode());
            a.stage = AcceptStage::Reply { qp, bufs, engine };
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
                mut qp,
                bufs,
                engine,
            } = std::mem::replace(&mut a.stage, AcceptStage::Done)
            else {
                unreachable!()
            };
            // The stream is the QP's from here (tcp: its progress thread may read it).
            qp.handshake_complete();
            let label = format!(
                "recv comm {} <- {} ({})",
                self.handle.addr, a.peer, self.dev_name
            );
            info!(
                target: "verbsnet::init",
                "{label}: connected; RQ depth {} posted in batches of {}, low-water {}, credits {} granted \
                 initially, credit gating {} (the sender's VERBSNET_CREDITS), traffic class {} SL {}",
                self.cfg.rq_depth,
                self.cfg.rq_batch,
                self.cfg.rq_low_water,
                engine.granted(),
                if engine.credits() { "on" } else { "off" },
                self.cfg.ib_tc,
                self.cfg.ib_sl
            );
            return Ok(Some(RecvComm::new(
                self.dev.clone(),
                qp,
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

/// State of one `connect` in progress.
pub struct Connecting {
    handle: Handle,
    stage: ConnectStage,
    /// When this connect started (ns, [`crate::comm::now_ns`]).
    started: u64,
    /// When it last reached a new stage.
    progressed: u64,
    /// The hang watchdog reported this connect already.
    warned: bool,
}

enum ConnectStage {
    Connecting(socket2::Socket),
    Hello {
        wire: Wire,
        reader: HelloReader,
        qp: Box<dyn QueuePair>,
        bufs: SendBuffers,
        first_seq: u64,
    },
    Ready {
        wire: Wire,
        qp: Box<dyn QueuePair>,
        bufs: SendBuffers,
        peer: PeerParams,
    },
    Done,
}

/// Connect states between `connect` calls, by the id their handle carries. NCCL keeps only
/// the handle, so the state lives here; an id is never reused, and a handle whose id is not
/// here (forged, stale, or from another process) starts a fresh connect.
fn registry() -> &'static Mutex<HashMap<u64, Box<Connecting>>> {
    static R: OnceLock<Mutex<HashMap<u64, Box<Connecting>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// The next parked state's id (0 means "none" in a handle).
static NEXT_PARKED: AtomicU64 = AtomicU64::new(1);

impl Connecting {
    /// Finds the connect state stored in `handle`, or starts a new one there.
    pub fn resume_or_start(handle: &mut [u8; HANDLE_SIZE]) -> Result<Box<Connecting>, Error> {
        let id = u64::from_le_bytes(handle[STATE_OFF..].try_into().expect("8 bytes"));
        let h = Handle::read(handle)?;
        if id != 0 {
            let mut parked = registry().lock().unwrap_or_else(PoisonError::into_inner);
            // Only the connect this handle describes: a copied handle buffer carrying the id
            // of another connect (another listener) starts its own instead of taking that one.
            if parked.get(&id).is_some_and(|c| c.handle == h) {
                return Ok(parked.remove(&id).expect("present"));
            }
        }
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
        }))
    }

    /// Keeps this state for the next call, its id in `handle`.
    pub fn park(self: Box<Self>, handle: &mut [u8; HANDLE_SIZE]) {
        let id = NEXT_PARKED.fetch_add(1, Ordering::Relaxed);
        registry()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, self);
        handle[STATE_OFF..].copy_from_slice(&id.to_le_bytes());
    }

    /// Clears the state word of `handle` (done or failed).
    pub fn clear(handle: &mut [u8; HANDLE_SIZE]) {
        handle[STATE_OFF..].fill(0);
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
    pub fn step(
        &mut self,
        dev: &Arc<dyn Device>,
        dev_name: &str,
        cfg: &Config,
    ) -> Result<Option<Box<SendComm>>, Error> {
        let before = std::mem::discriminant(&self.stage);
        let r = self.step_inner(dev, dev_name, cfg);
        let now = crate::comm::now_ns();
        if std::mem::discriminant(&self.stage) != before {
            self.progressed = now;
            self.warned = false;
        }
        if !matches!(r, Ok(None)) {
            return r;
        }
        let elapsed = now.saturating_sub(self.started);
        if let Some(t) = cfg.connect_timeout {
            if elapsed > t.as_nanos() as u64 {
                return Err(Error::new(
                    Stage::Connect,
                    Class::Remote,
                    format!(
                    "connect to {} timed out after {:.1} s (VERBSNET_CONNECT_TIMEOUT={} s); stage \
                     reached: {}. Check that the peer is alive and calls accept (its log), and \
                     that {} is reachable from here; raise VERBSNET_CONNECT_TIMEOUT if ranks \
                     start far apart",
                    self.handle.addr,
                    elapsed as f64 / 1e9,
                    t.as_secs_f64(),
                    self.stage_name(),
                    self.handle.addr
                ),
                ));
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
        dev: &Arc<dyn Device>,
        dev_name: &str,
        cfg: &Config,
    ) -> Result<Option<Box<SendComm>>, Error> {
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
            let qp = dev.create_qp(&qp_config(cfg)).map_err(|e| {
                let msg = format!("creating a QP on {dev_name}");
                Error::new(Stage::QpSetup, Class::System, msg).because(e)
            })?;
            let bufs = SendBuffers::alloc(&**dev).map_err(|e| e.lift(Stage::Buffers))?;
            // 0 in production; tests start near the wrap points (`Config::test_first_seq`).
            let first_seq = cfg.test_first_seq;
            let hello = Hello {
                kind: match self.handle.kind {
                    Kind::Ib => 1,
                    Kind::Tcp => 2,
                },
                role: 1,
                nonce: self.handle.nonce,
                qp_info: qp.local_info(),
                p: bufs.announce(cfg, first_seq),
            };
            let mut wire = Wire::new(stream);
            wire.out.extend_from_slice(&hello.encode());
            self.stage = ConnectStage::Hello {
                wire,
                reader: HelloReader { len: None },
                qp,
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
                mut qp,
                bufs,
                first_seq,
                ..
            } = std::mem::replace(&mut self.stage, ConnectStage::Done)
            else {
                unreachable!()
            };
            let oob = wire
                .stream
                .try_clone()
                .map_err(|e| Error::new(Stage::QpSetup, Class::System, "dup socket").because(e))?;
            qp.establish(&h.qp_info, oob).map_err(|e| {
                let msg = format!("connecting the QP to {}", self.handle.addr);
                Error::new(Stage::QpSetup, Class::System, msg).because(e)
            })?;
            let mut wire = wire;
            wire.out.extend_from_slice(READY);
            let peer = PeerParams { first_seq, ..h.p };
            self.stage = ConnectStage::Ready {
                wire,
                qp,
                bufs,
                peer,
            };
        }
        if let ConnectStage::Ready { wire, .. } = &mut self.stage {
            if !wire.flush().map_err(|e| remote(Arc::new(e)))? {
                return Ok(None);
            }
            let ConnectStage::Ready {
                mut qp,
                bufs,
                peer,
                wire,
            } = std::mem::replace(&mut self.stage, ConnectStage::Done)
            else {
                unreachable!()
            };
            qp.handshake_complete();
            let local = wire
                .stream
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            let label = format!("send comm {local} -> {} ({dev_name})", self.handle.addr);
            info!(
                target: "verbsnet::init",
                "{label}: connected; eager limit {} B, credit gating {}, {} initial credits, \
                 traffic class {} SL {}",
                u64::from(cfg.eager_limit).min(peer.eager_buf_size),
                if cfg.credits { "on" } else { "off" },
                peer.initial_credits,
                cfg.ib_tc,
                cfg.ib_sl
            );
            return Ok(Some(SendComm::new(
                dev.clone(),
                qp,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_round_trips_and_rejects_foreign_bytes() {
        let h = Handle {
            nonce: 0x1234_5678_9abc_def0,
            kind: Kind::Tcp,
            addr: "127.0.0.1:4567".parse().unwrap(),
        };
        let mut b = [0u8; HANDLE_SIZE];
        h.write(&mut b);
        assert_eq!(Handle::read(&b).unwrap(), h);
        let h6 = Handle {
            nonce: 1,
            kind: Kind::Ib,
            addr: "[::1]:99".parse().unwrap(),
        };
        h6.write(&mut b);
        assert_eq!(Handle::read(&b).unwrap(), h6);
        b[0] = b'X';
        assert!(
            matches!(Handle::read(&b), Err(e) if e.class() == Class::InvalidArgument && e.to_string().contains("same NCCL net plugin"))
        );
    }

    #[test]
    fn hello_round_trips_and_rejects_truncation() {
        let h = Hello {
            kind: 2,
            role: 1,
            nonce: 77,
            qp_info: vec![1, 2, 3],
            p: PeerParams {
                cts_ring: (0x1000, 5),
                credit_word: (0x2000, 6),
                credits: true,
                rec_ring: (0x3000, 7),
                initial_credits: 128,
                eager_buf_size: 8192,
                first_seq: 9,
            },
        };
        let b = h.encode();
        assert_eq!(
            u32::from_le_bytes(b[..4].try_into().unwrap()) as usize,
            b.len() - 4
        );
        assert_eq!(Hello::decode(&b[4..]), Some(h));
        assert_eq!(Hello::decode(&b[4..b.len() - 1]), None);
    }
}
