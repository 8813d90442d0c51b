//! The version-independent plugin API: the one layer every ABI adapter in [`crate::ffi`] calls.
//!
//! NCCL's net ABI changed shape six times (v7 … v12) but not meaning; this module holds the
//! meaning once, with Rust types instead of `void*`:
//! - a [`Context`] per NCCL communicator (v11+: one per `init(ctx, commId, config)`, ended by
//!   `finalize`; v7–v10: one process-wide context made by the first `init`, never finalized),
//!   holding what belongs to the communicator: its `commId`, its traffic class and its
//!   connects in progress (freed at its `finalize` even when NCCL abandoned them);
//! - the shared plugin state (configuration, transport, devices with their verbs contexts
//!   and PDs), opened by the first context and reference-counted by contexts: the last
//!   context to go releases it, so `init` → … → `finalize` → `dlclose` cycles leak nothing;
//! - typed comms: [`ListenComm`], [`SendComm`], [`RecvComm`] (NCCL holds a [`NetComm`], which
//!   is one of the last two, because `regMr` accepts either);
//! - the other objects NCCL holds a pointer to (`handles.rs`): a registration ([`MrHandle`],
//!   from `regMr`) and a request ([`ReqHandle`], from `isend`/`irecv`). A comm below hands out
//!   request ids ([`crate::engine::ReqId`]); each API comm owns one handle per request slot,
//!   made with it, and a handle holds its comm, so [`test()`] finds the comm from the handle
//!   alone, in safe code;
//! - one error type, [`Error`] (a [`Failure`] of an API [`Op`], wrapping the lower layers'
//!   errors as its source), whose [`Class`] [`crate::ffi`] maps to `ncclResult_t` in one place.
//!
//! Rules taken from NCCL (ext-net README `plugins/net/README.md`, `src/include/plugin/net/net_v*.h`,
//! `src/transport/net.cc`) are cited where they apply.

use std::ffi::{c_char, CStr, CString};
use std::sync::{Arc, Mutex};

use tracing::info;

pub use crate::comm::{Class, Failure};
use crate::conn::{Connects, Listen, HANDLE_SIZE};
use crate::engine::wire::MAX_RECVS;
use crate::net::{self, Net};

mod handles;

#[cfg(test)]
pub(crate) use self::handles::LIVE_MR_ADDRS;
pub use self::handles::{
    mr_given, mr_taken, mrs_left_by, test, MrHandle, NetComm, RecvComm, ReqHandle, Request,
    SendComm,
};

/// The plugin API call that failed (one per table slot family).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `init` (v7–v12), and a call made before `init` succeeded.
    Init,
    /// `devices`/`getProperties`.
    Properties,
    /// `makeVDevice` (v9+).
    MakeVDevice,
    /// `listen`.
    Listen,
    /// `connect`.
    Connect,
    /// `accept`.
    Accept,
    /// `regMr`/`deregMr`.
    RegMr,
    /// `isend`.
    Isend,
    /// `irecv`.
    Irecv,
    /// `iflush`.
    Iflush,
    /// `test`.
    Test,
    /// `finalize`, `close*`.
    Close,
}

/// An error of a plugin API call.
pub type Error = Failure<Op>;

/// The largest message verbsnet moves in one `isend`/`irecv` (1 GiB), advertised as
/// `maxP2pBytes` (v9+). It is what truly works on both transports: the tcp transport caps one
/// WR at 1 GiB (`transport/tcp/wire.rs` `MAX_MSG_LEN`), a verbs WR is limited by the port's
/// `max_msg_sz` (2 GiB on mlx5 and rxe), and `test` reports sizes as `int` in every version.
/// It equals what NCCL assumes for v8 and older plugins (`MAX_NET_SIZE`, nccl_net.h), and lies
/// inside (0, 1 TiB], the range NCCL accepts (`src/transport/net.cc`).
pub const MAX_P2P_BYTES: u64 = 1 << 30;

/// `maxCollBytes` (v9+): verbsnet has no collective (CollNet) offload; NCCL's IB transport
/// reports 512 MiB (`MAX_COLLNET_SIZE`), and so do we.
pub const MAX_COLL_BYTES: u64 = 512 << 20;

/// The traffic class value meaning "not set" (`NCCL_NET_TRAFFIC_CLASS_UNDEF`, net_v10.h).
pub const TRAFFIC_CLASS_UNDEF: i32 = -1;

/// The plugin state shared by every context of the process.
struct Shared {
    net: Arc<Net>,
    /// Live contexts (the legacy one counts once).
    users: usize,
}

static SHARED: Mutex<Option<Shared>> = Mutex::new(None);
/// The process-wide context of v7–v10 (`init` without a context).
static LEGACY: Mutex<Option<Arc<Context>>> = Mutex::new(None);
/// Device names handed out by `getProperties`: NCCL may keep `props.name` after the context
/// that produced it is finalized, so names are interned for the process (one per distinct
/// device name, not per cycle).
static NAMES: Mutex<Vec<&'static CStr>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What `init` passes, in version-independent form.
#[derive(Clone)]
pub struct InitArgs {
    /// NCCL's logger (`None` in tests and the harness: the plugin then logs to stderr).
    pub logger: crate::log::Logger,
    /// The communicator id (v11+), `None` for the process-wide context of v7–v10.
    pub comm_id: Option<u64>,
    /// The communicator's `trafficClass` (v11+ `init` config), or [`TRAFFIC_CLASS_UNDEF`].
    pub traffic_class: i32,
}

/// One NCCL communicator's view of the plugin (v11+), or the process-wide one (v7–v10).
pub struct Context {
    net: Arc<Net>,
    comm_id: Option<u64>,
    traffic_class: Option<u8>,
    /// The connects this context started, between NCCL's `connect` calls.
    connects: Connects,
}

impl Context {
    /// The communicator id (`None` for the v7–v10 process-wide context).
    pub fn comm_id(&self) -> Option<u64> {
        self.comm_id
    }

    /// The traffic class this context sets on its QPs (`None`: `VERBSNET_IB_TC`).
    pub fn traffic_class(&self) -> Option<u8> {
        self.traffic_class
    }

    /// The shared plugin state.
    pub fn net(&self) -> &Arc<Net> {
        &self.net
    }

    /// Connects this context started that wait for NCCL's next `connect` call.
    pub fn connects_waiting(&self) -> usize {
        self.connects.waiting()
    }

    fn label(&self) -> String {
        self.comm_id.map_or_else(
            || "process-wide context".into(),
            |id| format!("commId {id:#x}"),
        )
    }
}

impl Drop for Context {
    /// The last context releases the shared state (and with it the devices' verbs contexts and
    /// PDs once no comm holds them any more).
    fn drop(&mut self) {
        let mut g = lock(&SHARED);
        // Only contexts made from the shared state count (tests make others).
        if let Some(s) = g.as_mut().filter(|s| Arc::ptr_eq(&s.net, &self.net)) {
            s.users = s.users.saturating_sub(1);
            if s.users == 0 {
                // NCCL unloads the plugin now and makes its virtual devices again after the
                // next load, unless NCCL_NET_PLUGIN_REF_COUNT keeps it (src/plugin/net.cc).
                if !s.net.cfg.nccl_plugin_ref_count {
                    net::forget_vdevices();
                }
                *g = None;
                info!(target: "verbsnet::init", "last context finalized: plugin state released");
            }
        }
    }
}

fn traffic_class(tc: i32, what: &str) -> Result<Option<u8>, Error> {
    if tc == TRAFFIC_CLASS_UNDEF {
        return Ok(None);
    }
    u8::try_from(tc).map(Some).map_err(|_| {
        Error::new(
            Op::Init,
            Class::Usage,
            format!(
            "{what} trafficClass {tc} is outside 0..=255 (an IPv6 traffic class / DSCP<<2 byte; \
             -1 = unset)"
        ),
        )
    })
}

/// Opens the shared state if needed and counts one more user.
fn acquire(logger: crate::log::Logger) -> Result<Arc<Net>, Error> {
    let mut g = lock(&SHARED);
    if let Some(s) = g.as_mut() {
        crate::log::init(
            logger,
            crate::log::level().unwrap_or(crate::config::DebugLevel::Warn),
        );
        s.users += 1;
        return Ok(s.net.clone());
    }
    let net = Arc::new(net::open_net(logger).map_err(|e| e.lift(Op::Init))?);
    *g = Some(Shared {
        net: net.clone(),
        users: 1,
    });
    Ok(net)
}

/// `init`. With a `comm_id` (v11+), makes a new context for that communicator; without (v7–v10),
/// makes the process-wide context on the first call and keeps it on later calls (NCCL may call
/// a v8 `init` more than once; the first configuration stays).
pub fn init(args: InitArgs) -> Result<Arc<Context>, Error> {
    let tc = traffic_class(args.traffic_class, "the communicator's")?;
    if args.comm_id.is_none() {
        let mut legacy = lock(&LEGACY);
        if let Some(c) = legacy.as_ref() {
            crate::log::init(
                args.logger.clone(),
                crate::log::level().unwrap_or(crate::config::DebugLevel::Warn),
            );
            return Ok(c.clone());
        }
        let ctx = Arc::new(Context {
            net: acquire(args.logger.clone())?,
            comm_id: None,
            traffic_class: tc,
            connects: Connects::new(),
        });
        *legacy = Some(ctx.clone());
        return Ok(ctx);
    }
    let ctx = Arc::new(Context {
        net: acquire(args.logger.clone())?,
        comm_id: args.comm_id,
        traffic_class: tc,
        connects: Connects::new(),
    });
    info!(
        target: "verbsnet::init",
        "{}: initialized (traffic class {})",
        ctx.label(),
        tc.map_or_else(|| "from VERBSNET_IB_TC".into(), |t| t.to_string())
    );
    Ok(ctx)
}

/// The process-wide context of v7–v10, made by their `init`.
pub fn legacy_context() -> Result<Arc<Context>, Error> {
    lock(&LEGACY).clone().ok_or_else(before_init)
}

/// `finalize(ctx)` (v11+): ends the communicator's context and frees the connects it started
/// that NCCL abandoned (an abort mid-connect), even while its comms are still open. The shared
/// state goes with the last context (comms still open keep their own device references).
pub fn finalize(ctx: Arc<Context>) {
    match ctx.connects.release() {
        0 => info!(target: "verbsnet::init", "{}: finalized", ctx.label()),
        n => info!(
            target: "verbsnet::init",
            "{}: finalized; {n} unfinished connect(s) released",
            ctx.label()
        ),
    }
    drop(ctx);
}

/// The shared state of any live context (for `devices`/`getProperties`, which take none).
pub fn net() -> Result<Arc<Net>, Error> {
    lock(&SHARED)
        .as_ref()
        .map(|s| s.net.clone())
        .ok_or_else(before_init)
}

fn before_init() -> Error {
    Error::new(
        Op::Init,
        Class::Internal,
        "the plugin is used before init succeeded",
    )
}

/// Live contexts (tests).
pub fn contexts() -> usize {
    lock(&SHARED).as_ref().map_or(0, |s| s.users)
}

/// `devices`: the physical devices, then the virtual ones made so far ([`make_vdevice`]).
pub fn devices() -> Result<usize, Error> {
    Ok(net::dev_count(&*net()?))
}

/// `makeVDevice(d, props)` (v9+): a virtual device over the physical devices `devs`; returns
/// its index (see [`net::make_vdevice`]). NCCL's topology code calls it for each group of
/// NICs it fuses (`src/graph/topo.cc`, `ncclTopoMakeVnic`), then `devices` and
/// `getProperties` of the new index.
pub fn make_vdevice(devs: &[i32]) -> Result<i32, Error> {
    net::make_vdevice(&*net()?, devs).map_err(|e| e.lift(Op::MakeVDevice))
}

/// `ptrSupport`'s bit for host memory (`NCCL_PTR_HOST` in `net_device.h`; `ffi::abi` asserts
/// the two agree).
pub const PTR_HOST: i32 = 0x1;

/// A device's properties, version-independent (each adapter copies what its struct has).
#[derive(Clone, Copy, Debug)]
pub struct Properties {
    /// `name`, unique per device, valid for the process.
    pub name: *const c_char,
    /// `pciPath` (realpath in sysfs) or NULL.
    pub pci_path: *const c_char,
    /// `guid`: the NIC chip (ib: `sys_image_guid`, as NCCL's IB transport reports).
    pub guid: u64,
    /// `ptrSupport`: [`PTR_HOST`] only.
    pub ptr_support: i32,
    /// `regIsGlobal` (v8+): 0.
    pub reg_is_global: i32,
    /// `forceFlush` (v9+): 0 (host memory needs no flush).
    pub force_flush: i32,
    /// `speed` in Mbps.
    pub speed: i32,
    /// `port`.
    pub port: i32,
    /// `latency` in µs.
    pub latency: f32,
    /// `maxComms`.
    pub max_comms: i32,
    /// `maxRecvs`.
    pub max_recvs: i32,
    /// `vProps` (v9+): the physical devices behind this one (`{1, [dev]}` for a physical
    /// device, as NCCL IB reports: every device is its own virtual NIC), as (indices, count).
    pub vprops: ([i32; crate::engine::wire::MAX_DEVS], usize),
    /// `maxP2pBytes` (v9+).
    pub max_p2p_bytes: u64,
    /// `maxCollBytes` (v9+).
    pub max_coll_bytes: u64,
    /// `maxMultiRequestSize` (v11+): 1 (no multi-request support).
    pub max_multi_request_size: i32,
    /// `railId` (v12): -1, unknown.
    pub rail_id: i16,
    /// `planeId` (v12): -1, unknown.
    pub plane_id: i16,
}

fn intern(s: &CStr) -> &'static CStr {
    let mut names = lock(&NAMES);
    if let Some(n) = names.iter().find(|n| **n == s) {
        return n;
    }
    let leaked: &'static CStr = Box::leak(CString::from(s).into_boxed_c_str());
    names.push(leaked);
    leaked
}

/// `getProperties(dev)`.
pub fn properties(dev: i32) -> Result<Properties, Error> {
    let net = net()?;
    let d = net::device(&net, dev).map_err(|e| e.lift(Op::Properties))?;
    let mut vprops = ([0i32; crate::engine::wire::MAX_DEVS], d.indices.len());
    vprops.0[..d.indices.len()].copy_from_slice(&d.indices);
    Ok(Properties {
        name: intern(&d.name_c).as_ptr(),
        pci_path: d
            .pci_c
            .as_deref()
            .map_or(std::ptr::null(), |c| intern(c).as_ptr()),
        guid: d.props.guid,
        ptr_support: PTR_HOST,
        reg_is_global: 0,
        force_flush: 0,
        speed: d.props.speed_mbps,
        port: d.props.port,
        latency: d.props.latency_us,
        max_comms: d.props.max_comms,
        max_recvs: MAX_RECVS as i32,
        vprops,
        max_p2p_bytes: MAX_P2P_BYTES,
        max_coll_bytes: MAX_COLL_BYTES,
        max_multi_request_size: 1,
        rail_id: -1,
        plane_id: -1,
    })
}

/// A listen comm: accepts one connection (NCCL closes it right after).
pub struct ListenComm {
    listen: Listen,
    ctx: Arc<Context>,
}

/// The effective configuration of a connection: the shared one with the communicator's
/// traffic class, the per-connection one (v10 `connect` config) when set, else this context's;
/// `VERBSNET_IB_TC`/`_SL` beat it when set (`conn::traffic_class_and_sl`).
fn conn_config(ctx: &Context, conn_tc: Option<u8>) -> crate::config::Config {
    let mut cfg = ctx.net.cfg.clone();
    cfg.comm_traffic_class = conn_tc.or(ctx.traffic_class);
    cfg
}

/// `listen(ctx, dev)`: fills the 128-byte handle NCCL ships to the peer.
pub fn listen(
    ctx: Arc<Context>,
    dev: i32,
    handle: &mut [u8; HANDLE_SIZE],
) -> Result<ListenComm, Error> {
    ctx.connects.expire(crate::comm::now_ns());
    let net = ctx.net.clone();
    let d = net::device(&net, dev).map_err(|e| e.lift(Op::Listen))?;
    let cfg = conn_config(&ctx, None);
    let listen = Listen::new(
        d.devs,
        d.props.name.clone(),
        net.kind,
        net.listen_ip,
        &cfg,
        handle,
    )
    .map_err(|e| e.lift(Op::Listen))?;
    Ok(ListenComm { listen, ctx })
}

/// One non-blocking step of `connect(ctx, dev, handle)`: `Ok(None)` = call again with the same
/// handle (ext-net README), the connect's state kept by `ctx`. `traffic_class` is the v10
/// per-connection config (-1 = unset).
pub fn connect(
    ctx: Arc<Context>,
    dev: i32,
    handle: &mut [u8; HANDLE_SIZE],
    traffic_class: i32,
) -> Result<Option<SendComm>, Error> {
    let tc = self::traffic_class(traffic_class, "the connection's")?;
    let d = net::device(&ctx.net, dev).map_err(|e| e.lift(Op::Connect))?;
    let cfg = conn_config(&ctx, tc);
    let comm = ctx
        .connects
        .step(handle, &d.devs, &d.props.name, &cfg)
        .map_err(|e| e.lift(Op::Connect))?;
    Ok(comm.map(|mut comm| {
        // Tagged before it is shared: nothing refers to it yet.
        comm.set_comm_id(ctx.comm_id);
        SendComm::new(comm, ctx)
    }))
}

impl ListenComm {
    /// One non-blocking step of `accept`: `Ok(None)` = call again.
    pub fn accept(&mut self) -> Result<Option<RecvComm>, Error> {
        let accepted = self.listen.accept().map_err(|e| e.lift(Op::Accept))?;
        Ok(accepted.map(|mut comm| {
            // Tagged before it is shared: nothing refers to it yet.
            comm.set_comm_id(self.ctx.comm_id);
            RecvComm::new(comm, self.ctx.clone())
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(tc: Option<u8>) -> Context {
        let cfg = crate::config::Config {
            ib_tc: Some(7),
            ..Default::default()
        };
        Context {
            net: Arc::new(Net {
                cfg,
                kind: crate::transport::Kind::Tcp,
                devs: Vec::new(),
                listen_ip: std::net::Ipv4Addr::LOCALHOST.into(),
            }),
            comm_id: Some(1),
            traffic_class: tc,
            connects: Connects::new(),
        }
    }

    #[test]
    fn a_connections_traffic_class_beats_the_contexts_and_the_knob_is_kept() {
        assert_eq!(conn_config(&ctx(None), None).comm_traffic_class, None);
        assert_eq!(
            conn_config(&ctx(Some(106)), None).comm_traffic_class,
            Some(106)
        );
        assert_eq!(
            conn_config(&ctx(Some(106)), Some(40)).comm_traffic_class,
            Some(40)
        );
        assert_eq!(conn_config(&ctx(None), Some(0)).comm_traffic_class, Some(0));
        // VERBSNET_IB_TC stays, to beat it (conn::traffic_class_and_sl)
        assert_eq!(conn_config(&ctx(Some(106)), None).ib_tc, Some(7));
        assert_eq!(traffic_class(-1, "x"), Ok(None));
        assert_eq!(traffic_class(255, "x"), Ok(Some(255)));
        assert!(
            matches!(traffic_class(256, "the communicator's"), Err(e) if e.class() == Class::Usage && e.to_string().contains("256"))
        );
        assert!(matches!(traffic_class(-2, "x"), Err(e) if e.class() == Class::Usage));
    }
}
