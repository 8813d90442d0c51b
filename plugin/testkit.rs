//! In-process helpers for plugin-level tests and benches: open a device of either transport,
//! connect a send/receive comm pair through the real listen/connect/accept state machines,
//! and register plugin-allocated buffers. Everything here is safe Rust over the same code the
//! `ncclNet` shims (v7 … v12) call; configuration is passed explicitly, so tests can differ per
//! pair.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use crate::api::{Error, NetComm, Op};
use crate::comm::{Class, Comm, Mr, RecvComm, Role, SendComm};
use crate::config::{Config, TransportChoice};
use crate::conn::{Connects, Listen, HANDLE_SIZE};
use crate::engine::ReqId;
use crate::mem::Region;
use crate::transport::{self, Device, Kind};

/// The first device of the transport `cfg.transport` names (`Auto` = ib if present, else tcp).
pub fn open_device(cfg: &Config) -> Result<(Arc<dyn Device>, Kind), Error> {
    let ib = || {
        transport::ib::open_devices(cfg)
            .ok()
            .and_then(|d| d.into_iter().next())
    };
    match cfg.transport {
        TransportChoice::Tcp => Ok((first_tcp(cfg)?, Kind::Tcp)),
        TransportChoice::Ib => ib()
            .map(|d| (d, Kind::Ib))
            .ok_or_else(|| Error::new(Op::Init, Class::System, "no verbs device")),
        TransportChoice::Auto => match ib() {
            Some(d) => Ok((d, Kind::Ib)),
            None => Ok((first_tcp(cfg)?, Kind::Tcp)),
        },
    }
}

/// Every device of `cfg`'s transport (tcp: `VERBSNET_TCP_DEVICES` of them; ib and auto: every
/// active verbs port, else tcp's), for tests of several devices and of virtual ones.
///
/// # Errors
/// `cfg.transport` is `ib` and no verbs device is usable.
pub fn open_devices(cfg: &Config) -> Result<(Vec<Arc<dyn Device>>, Kind), Error> {
    let ib = || {
        transport::ib::open_devices(cfg)
            .ok()
            .filter(|d| !d.is_empty())
    };
    match cfg.transport {
        TransportChoice::Tcp => Ok((transport::tcp::open_devices(cfg), Kind::Tcp)),
        TransportChoice::Ib => ib()
            .map(|d| (d, Kind::Ib))
            .ok_or_else(|| Error::new(Op::Init, Class::System, "no verbs device")),
        TransportChoice::Auto => Ok(ib().map_or_else(
            || (transport::tcp::open_devices(cfg), Kind::Tcp),
            |d| (d, Kind::Ib),
        )),
    }
}

fn first_tcp(cfg: &Config) -> Result<Arc<dyn Device>, Error> {
    transport::tcp::open_devices(cfg)
        .into_iter()
        .next()
        .ok_or_else(|| Error::new(Op::Init, Class::System, "no tcp device"))
}

/// A connected send/receive comm pair in one process.
pub struct Link {
    /// Sending side.
    pub send: SendComm,
    /// Receiving side.
    pub recv: RecvComm,
    /// The sender's device 0 (with [`connect`]: the device both use; with [`connect_devs`],
    /// register buffers through `send.devices()` / `recv.devices()`).
    pub dev: Arc<dyn Device>,
}

/// Connects a pair over loopback: `send_cfg` configures the sender (credits, eager limit),
/// `recv_cfg` the receiver (RQ depth, batch, low-water, bounce size). Polls connect and accept
/// alternately, as NCCL's GDR probe does from one thread; fails after `max_polls`.
pub fn connect(
    dev: &Arc<dyn Device>,
    kind: Kind,
    send_cfg: &Config,
    recv_cfg: &Config,
    max_polls: u32,
) -> Result<Link, Error> {
    connect_devs(
        (std::slice::from_ref(dev), std::slice::from_ref(dev)),
        kind,
        send_cfg,
        recv_cfg,
        max_polls,
    )
}

/// The devices of one side of a [`connect_devs`] pair.
pub type Devices<'a> = &'a [Arc<dyn Device>];

/// [`connect`] between a sender on `devs.0` and a receiver on `devs.1` (one device each, or
/// the physical devices of a virtual one, `makeVDevice`: QP `q` runs on device `q % len` of
/// its side).
pub fn connect_devs(
    (send_devs, recv_devs): (Devices<'_>, Devices<'_>),
    kind: Kind,
    send_cfg: &Config,
    recv_cfg: &Config,
    max_polls: u32,
) -> Result<Link, Error> {
    let dev = &send_devs[0];
    let mut handle = [0u8; HANDLE_SIZE];
    let name = dev.props().name;
    let mut listen = Listen::new(
        recv_devs.to_vec(),
        name.clone(),
        kind,
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        recv_cfg,
        &mut handle,
    )
    .map_err(|e| e.lift(Op::Listen))?;
    let (mut send, mut recv) = (None, None);
    let connects = Connects::new();
    for _ in 0..max_polls {
        if send.is_none() {
            send = connects
                .step(&mut handle, send_devs, &name, send_cfg)
                .map_err(|e| e.lift(Op::Connect))?;
        }
        if recv.is_none() {
            recv = listen.accept().map_err(|e| e.lift(Op::Accept))?;
        }
        if let (Some(_), Some(_)) = (&send, &recv) {
            return Ok(Link {
                send: send.expect("set"),
                recv: recv.expect("set"),
                dev: dev.clone(),
            });
        }
        std::thread::yield_now();
    }
    Err(Error::new(
        Op::Connect,
        Class::Internal,
        format!("connect/accept did not finish in {max_polls} polls"),
    ))
}

/// A plugin-allocated, registered buffer (stands in for NCCL's registered buffers).
pub struct Buf {
    /// The memory.
    pub region: Region,
    /// Its registration.
    pub mr: Mr,
}

impl Buf {
    /// Allocates and registers `len` zeroed bytes on `dev`.
    pub fn new(dev: &Arc<dyn Device>, len: usize) -> Result<Buf, Error> {
        let region = Region::alloc(len);
        let mr = Mr::register(&**dev, region.clone()).map_err(|e| e.lift(Op::RegMr))?;
        Ok(Buf { region, mr })
    }

    /// Allocates `len` zeroed bytes and registers them on every device of `devs` (a comm's
    /// `devices()`: one, or a virtual device's), as `regMr` does.
    pub fn on(devs: &[Arc<dyn Device>], len: usize) -> Result<Buf, Error> {
        let region = Region::alloc(len);
        let mr = Mr::register_all(devs, region.clone()).map_err(|e| e.lift(Op::RegMr))?;
        Ok(Buf { region, mr })
    }

    /// Address of byte `off`.
    pub fn addr(&self, off: usize) -> u64 {
        self.region.addr() + off as u64
    }

    /// Writes `data` at `off`.
    pub fn fill(&self, off: usize, data: &[u8]) {
        self.region
            .write(off, data)
            .expect("test buffer write in bounds");
    }

    /// Reads `len` bytes at `off`.
    pub fn get(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.region
            .read(off, &mut v)
            .expect("test buffer read in bounds");
        v
    }
}

/// Polls `test` on request `id` until done or an error, at most `max_polls` times, calling
/// `pump` between polls (e.g. to let the other comm of the pair make progress: a userspace
/// transport moves data only inside plugin calls, as NCCL's proxy threads make them).
pub fn wait_with<R: Role>(
    comm: &Comm<R>,
    id: ReqId,
    max_polls: u64,
    mut pump: impl FnMut(),
) -> Result<Vec<u64>, Error> {
    for _ in 0..max_polls {
        if let Some(s) = comm.test(id).map_err(|e| e.lift(Op::Test))? {
            return Ok(s.to_vec());
        }
        pump();
    }
    Err(not_done(max_polls))
}

/// Polls `test` on request `id` until done or an error, at most `max_polls` times.
pub fn wait<R: Role>(comm: &Comm<R>, id: ReqId, max_polls: u64) -> Result<Vec<u64>, Error> {
    for _ in 0..max_polls {
        if let Some(s) = comm.test(id).map_err(|e| e.lift(Op::Test))? {
            return Ok(s.to_vec());
        }
    }
    Err(not_done(max_polls))
}

fn not_done(max_polls: u64) -> Error {
    Error::new(
        Op::Test,
        Class::Internal,
        format!("request not done after {max_polls} polls"),
    )
}

/// `isend` retried (with receiver progress in between via `pump`) until it starts.
pub fn isend_retry(
    send: &SendComm,
    buf: &Buf,
    off: usize,
    size: usize,
    tag: i32,
    max_polls: u64,
    mut pump: impl FnMut(),
) -> Result<ReqId, Error> {
    for _ in 0..max_polls {
        if let Some(r) = send
            .isend(buf.addr(off), size as u64, tag, &buf.mr)
            .map_err(|e| e.lift(Op::Isend))?
        {
            return Ok(r);
        }
        pump();
    }
    Err(Error::new(
        Op::Isend,
        Class::Internal,
        format!("isend did not start after {max_polls} polls"),
    ))
}

/// Ends `comm` the way the death of its process would (`kill -9`, an abort): the comm is
/// dropped without [`NetComm::close`], so no orderly goodbye reaches the peer; the drop closes
/// its descriptors and destroys its QP, as the kernel does for a dead process. Test support for
/// the peer-death checks of `tests/explorer.rs` and `tests/liveness.rs`.
///
/// `closeSend`/`closeRecv` (which call [`NetComm::close`]) are the orderly path; whatever an
/// orderly close tells the peer must stay out of the comm's `Drop`, or this stops being a
/// crash. A test holding the pointer `connect`/`accept` returned through the ffi table gets
/// the `Box<NetComm>` back with `Box::from_raw` (`plugin/ffi/shim.rs` boxes every comm so).
pub fn crash(comm: Box<NetComm>) {
    drop(comm);
}
