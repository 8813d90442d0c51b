//! The slot bodies, written once for every ABI version.
//!
//! Each function here is one table slot, made by `entry!` (panic containment, the slot's
//! name in its WARN, the argument casts: [`super::boundary`]); the version adapters
//! (`v7.rs` … `v12.rs`) put them in their tables, instantiating the generic ones with the
//! version's size type (`int` up to v8, `size_t` from v9) or properties struct, and a few thin
//! forwarders adapt a version's extra arguments (v10's profiler handles) to the same body.
//! Every body checks its arguments, calls the version-independent API ([`crate::api`]), then
//! writes its out-parameters — only on success, except `*request`/`*comm`, which are always
//! overwritten on success (NULL = "not now, call again", ext-net README; `*request` may hold
//! `NCCL_NET_OPTIONAL_RECV_COMPLETION` on input in v9+).

use std::ffi::{c_int, c_void};
use std::fmt::Display;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};

use tracing::info;

use super::abi::{
    ncclDebugLogger_t, ncclNetCommConfig_v10_t, ncclNetDeviceHandle_v8_t, ncclProfilerCallback_t,
    ncclResult_t, NCCL_NET_OPTIONAL_RECV_COMPLETION, NCCL_PTR_HOST,
};
use super::boundary::{
    self, arc_into_raw, arg, array, entry, from_raw, handle, into_raw, optional, out,
};
use crate::api::{
    self, Class, Context, Error, InitArgs, ListenComm, MrHandle, NetComm, Op, ReqHandle, SendComm,
};
use crate::engine::wire::MAX_RECVS;
use crate::mem::Region;

/// Every table's `name`: final at load time (NCCL 2.28+ matches `NCCL_NET` against it before
/// `init`).
pub(crate) const NAME: &std::ffi::CStr = c"verbsnet";

/// The ABI version of the table whose `init` NCCL called last (0 before any), for logs.
static ABI_VERSION: AtomicU32 = AtomicU32::new(0);

/// The ABI version NCCL is using (the table whose `init` was called), 0 before `init`.
pub fn abi_version() -> u32 {
    ABI_VERSION.load(Ordering::Relaxed)
}

/// A size as a version passes it: `int` (v7/v8 data path, v7 `regMr`) or `size_t` (v9+).
pub(crate) trait WireSize: Copy + Display {
    /// Whether this is the v9+ form (`size_t`): those versions may preset `*request` to
    /// `NCCL_NET_OPTIONAL_RECV_COMPLETION` in `irecv`.
    const V9_PLUS: bool;
    /// The size in bytes, `None` if negative.
    fn bytes(self) -> Option<u64>;
}

impl WireSize for c_int {
    const V9_PLUS: bool = false;
    fn bytes(self) -> Option<u64> {
        u64::try_from(self).ok()
    }
}

impl WireSize for usize {
    const V9_PLUS: bool = true;
    fn bytes(self) -> Option<u64> {
        Some(self as u64)
    }
}

/// A properties struct of one version, filled from the version-independent one.
pub(crate) trait FromProps {
    /// The struct for `p`.
    fn from_props(p: &api::Properties) -> Self;
}

/// A `vProps` struct of one version (`ncclNetVDeviceProps_v9_t`: 4 devices;
/// `ncclNetVDeviceProps_v12_t`: 8), as `makeVDevice` reads it and `getProperties` fills it.
pub(crate) trait VProps {
    /// `ndevs`, as NCCL wrote it.
    fn ndevs(&self) -> c_int;
    /// `devs`, the whole array: its length is what the struct can name (4 or 8).
    fn devs(&self) -> &[c_int];
}

/// The device list of `v`, or a `Usage` error (`ncclInvalidUsage`, as NCCL IB refuses every
/// `makeVDevice` it cannot do) when `ndevs` is outside `0..=` the struct's capacity.
fn vprops_devs<V: VProps>(v: &V) -> Result<&[c_int], Error> {
    let cap = v.devs().len();
    usize::try_from(v.ndevs())
        .ok()
        .filter(|&n| n <= cap)
        .map(|n| &v.devs()[..n])
        .ok_or_else(|| {
            Error::new(
                Op::MakeVDevice,
                Class::Usage,
                format!(
                    "makeVDevice props name {} devices (this table's struct holds 0..={cap})",
                    v.ndevs()
                ),
            )
        })
}

/// A size NCCL passed that is negative (or, for `regMr`, beyond the address space).
fn bad_size(op: Op, what: impl Display) -> Error {
    Error::new(op, Class::InvalidArgument, what.to_string())
}

fn log_version(v: u32, ctx: &Context) {
    let prev = ABI_VERSION.swap(v, Ordering::Relaxed);
    if prev != v {
        info!(
            target: "verbsnet::init",
            "NCCL uses the ncclNet v{v} table ({})",
            ctx.comm_id()
                .map_or_else(|| "one process-wide context".into(), |_| "a context per communicator".to_string())
        );
    }
}

/// The traffic class a v10+ config carries (NULL: unset).
fn config_tc(config: Option<&ncclNetCommConfig_v10_t>) -> i32 {
    config.map_or(api::TRAFFIC_CLASS_UNDEF, |c| c.trafficClass)
}

// ---- init / finalize ----

entry! {
    /// `init(logFunction)` (v7–v9); `V` is the table's version, for the log.
    fn init<const V: u32>(logger: ncclDebugLogger_t) as "init", Op::Init {
        let ctx = api::init(InitArgs {
            logger: super::logger::sink(logger),
            comm_id: None,
            traffic_class: api::TRAFFIC_CLASS_UNDEF,
        })?;
        log_version(V, &ctx);
    }
}

/// `init(logFunction, profFunction)` (v10). verbsnet records no profiler events yet, so the
/// callback is not kept.
pub(crate) unsafe extern "C" fn init_prof<const V: u32>(
    logger: ncclDebugLogger_t,
    _prof: ncclProfilerCallback_t,
) -> ncclResult_t {
    // SAFETY: the same argument, under the same contract, as the v7–v9 init's.
    unsafe { init::<V>(logger) }
}

entry! {
    /// `init(ctx, commId, config, logFunction, profFunction)` (v11+): a new context per
    /// communicator; `config` may be NULL (no traffic class).
    fn init_ctx<const V: u32>(
        ctx: *mut *mut c_void,
        comm_id: u64,
        config: *mut ncclNetCommConfig_v10_t,
        logger: ncclDebugLogger_t,
        _prof: ncclProfilerCallback_t,
    ) as "init", Op::Init {
        let ctx = out!(ctx, "ctx");
        let tc = config_tc(optional!(config));
        let c = api::init(InitArgs {
            logger: super::logger::sink(logger),
            comm_id: Some(comm_id),
            traffic_class: tc,
        })?;
        log_version(V, &c);
        *ctx = arc_into_raw(c);
    }
}

entry! {
    /// `finalize(ctx)` (v11+): NCCL calls it once per `init`, unconditionally.
    fn finalize(ctx: *mut c_void) as "finalize", Op::Close {
        api::finalize(arg!(finalize ctx));
    }
}

// ---- devices and properties ----

entry! {
    /// `devices(ndev)` (every version).
    fn devices(ndev: *mut c_int) as "devices", Op::Properties {
        let n = api::devices()?;
        *out!(ndev, "ndev") = c_int::try_from(n).unwrap_or(c_int::MAX);
    }
}

entry! {
    /// `getProperties(dev, props)` for any version's struct `P`.
    fn get_properties<P: FromProps>(dev: c_int, props: *mut P)
        as "getProperties", Op::Properties
    {
        let p = api::properties(dev)?;
        *out!(props, "props") = P::from_props(&p);
    }
}

entry! {
    /// `makeVDevice(d, props)` (v9+): a virtual device over `props.devs` (NIC fusion, made by
    /// NCCL's topology code, `src/graph/topo.cc`), its index written to `d`.
    fn make_vdevice<V: VProps>(d: *mut c_int, props: *mut V) as "makeVDevice", Op::MakeVDevice {
        let v = optional!(props).ok_or_else(|| boundary::null_arg(OP, "props"))?;
        let devs = vprops_devs(v)?;
        let out = out!(d, "d");
        *out = api::make_vdevice(devs)?;
    }
}

// ---- listen / connect / accept ----

entry! {
    /// `listen(dev, handle, listenComm)` (v7–v10).
    fn listen(dev: c_int, handle: *mut c_void, listen_comm: *mut *mut c_void)
        as "listen", Op::Listen
    {
        let ctx = api::legacy_context()?;
        let handle = handle!(handle);
        let listen_comm = out!(listen_comm, "listenComm");
        *listen_comm = into_raw(api::listen(ctx, dev, handle)?);
    }
}

entry! {
    /// `listen(ctx, dev, handle, listenComm)` (v11+).
    fn listen_ctx(ctx: *mut c_void, dev: c_int, handle: *mut c_void, listen_comm: *mut *mut c_void)
        as "listen", Op::Listen
    {
        let ctx = arg!(ctx ctx);
        let handle = handle!(handle);
        let listen_comm = out!(listen_comm, "listenComm");
        *listen_comm = into_raw(api::listen(ctx, dev, handle)?);
    }
}

/// What `connect` writes to `*sendComm`: the comm, or NULL for "call again" (ext-net README).
fn send_comm_ptr(c: Option<SendComm>) -> *mut c_void {
    c.map_or(ptr::null_mut(), |c| into_raw(NetComm::Send(c)))
}

entry! {
    /// `connect(dev, handle, sendComm, sendDevComm)` (v7–v9). `sendDevComm` may be NULL and is
    /// left untouched (host plugin).
    fn connect(
        dev: c_int,
        handle: *mut c_void,
        send_comm: *mut *mut c_void,
        _send_dev_comm: *mut *mut ncclNetDeviceHandle_v8_t,
    ) as "connect", Op::Connect {
        let ctx = api::legacy_context()?;
        let handle = handle!(handle);
        let send_comm = out!(send_comm, "sendComm");
        *send_comm = send_comm_ptr(api::connect(ctx, dev, handle, api::TRAFFIC_CLASS_UNDEF)?);
    }
}

entry! {
    /// `connect(dev, config, handle, sendComm, sendDevComm)` (v10): `config` may be NULL
    /// (NCCL's GDR probe) and is read, never kept.
    fn connect_cfg(
        dev: c_int,
        config: *mut ncclNetCommConfig_v10_t,
        handle: *mut c_void,
        send_comm: *mut *mut c_void,
        _send_dev_comm: *mut *mut ncclNetDeviceHandle_v8_t,
    ) as "connect", Op::Connect {
        let tc = config_tc(optional!(config));
        let ctx = api::legacy_context()?;
        let handle = handle!(handle);
        let send_comm = out!(send_comm, "sendComm");
        *send_comm = send_comm_ptr(api::connect(ctx, dev, handle, tc)?);
    }
}

entry! {
    /// `connect(ctx, dev, handle, sendComm, sendDevComm)` (v11+).
    fn connect_ctx(
        ctx: *mut c_void,
        dev: c_int,
        handle: *mut c_void,
        send_comm: *mut *mut c_void,
        _send_dev_comm: *mut *mut ncclNetDeviceHandle_v8_t,
    ) as "connect", Op::Connect {
        let ctx = arg!(ctx ctx);
        let handle = handle!(handle);
        let send_comm = out!(send_comm, "sendComm");
        *send_comm = send_comm_ptr(api::connect(ctx, dev, handle, api::TRAFFIC_CLASS_UNDEF)?);
    }
}

entry! {
    /// `accept(listenComm, recvComm, recvDevComm)` (every version).
    fn accept(
        listen_comm: *mut c_void,
        recv_comm: *mut *mut c_void,
        _recv_dev_comm: *mut *mut ncclNetDeviceHandle_v8_t,
    ) as "accept", Op::Accept {
        let l: &mut ListenComm = arg!(mut listen_comm, "listenComm");
        let recv_comm = out!(recv_comm, "recvComm");
        // NULL = "call again" (ext-net README).
        *recv_comm = l
            .accept()?
            .map_or(ptr::null_mut(), |c| into_raw(NetComm::Recv(c)));
    }
}

// ---- memory registration ----

entry! {
    /// `regMr(comm, data, size, type, mhandle)`: `int` size in v7, `size_t` from v8.
    fn reg_mr<S: WireSize>(
        comm: *mut c_void,
        data: *mut c_void,
        size: S,
        type_: c_int,
        mhandle: *mut *mut c_void,
    ) as "regMr", Op::RegMr {
        let c: &NetComm = arg!(comm, "comm");
        let bytes = size.bytes().and_then(|s| usize::try_from(s).ok());
        let size = bytes.ok_or_else(|| bad_size(OP, format!("regMr of {size} bytes")))?;
        if type_ != NCCL_PTR_HOST as c_int {
            return Err(Error::new(
                OP,
                Class::Internal,
                format!(
                    "regMr of memory type {type_}: verbsnet supports host memory only (ptrSupport \
                     = NCCL_PTR_HOST), so NCCL should stage GPU buffers through host memory"
                ),
            ));
        }
        if data.is_null() && size > 0 {
            return Err(super::boundary::null_arg(OP, "data"));
        }
        if (data as u64).checked_add(size as u64).is_none() {
            return Err(bad_size(
                OP,
                format!("regMr of {size} bytes at {data:p}: the range wraps the address space"),
            ));
        }
        let mhandle = out!(mhandle, "mhandle");
        // SAFETY: NCCL guarantees [data, data+size) stays valid until deregMr (ext-net README);
        // deregMr drops the MrHandle and with it every Region clone of this range.
        let region = unsafe { Region::from_raw(data as u64, size) };
        let mh = into_raw(c.reg_mr(region)?);
        api::mr_given(mh as usize, c as *const NetComm as usize);
        *mhandle = mh;
    }
}

entry! {
    /// `deregMr(comm, mhandle)` (every version). `comm` is not used (it may be NULL); a
    /// handle that is not a live registration (freed twice, or after its comm was closed,
    /// which frees what was left registered) is refused, never freed twice.
    fn dereg_mr(_comm: *mut c_void, mhandle: *mut c_void) as "deregMr", Op::RegMr {
        if mhandle.is_null() {
            return Err(boundary::null_arg(OP, "mhandle"));
        }
        if !api::mr_taken(mhandle as usize) {
            return Err(Error::new(
                OP,
                Class::InvalidArgument,
                format!(
                    "deregMr of {mhandle:p}, which is not a live registration: it was \
                     deregistered already, or its comm was closed (closeSend/closeRecv free \
                     what is left registered; NCCL deregisters first)"
                ),
            ));
        }
        let mh: Box<MrHandle> = arg!(take mhandle, "mhandle");
        drop(mh);
    }
}

// ---- data path ----

/// What `isend`/`irecv`/`iflush` write to `*request`: the plugin-owned handle inside its comm,
/// or NULL ("retry later" for a send or receive; "complete" for a flush).
fn req_ptr(r: Option<&ReqHandle>) -> *mut c_void {
    r.map_or(ptr::null_mut(), |h| ptr::from_ref(h).cast_mut().cast())
}

entry! {
    /// `isend(sendComm, data, size, tag, mhandle, request)`: `int` size (v7/v8), `size_t` (v9).
    fn isend<S: WireSize>(
        send_comm: *mut c_void,
        data: *mut c_void,
        size: S,
        tag: c_int,
        mhandle: *mut c_void,
        request: *mut *mut c_void,
    ) as "isend", Op::Isend {
        let c: &NetComm = arg!(send_comm, "sendComm");
        let c = c.as_send(OP)?;
        let mh: &MrHandle = arg!(mhandle, "mhandle");
        let request = out!(request, "request");
        let size = size
            .bytes()
            .ok_or_else(|| bad_size(OP, format!("isend of {size} bytes")))?;
        let r = c.isend(data as u64, size, tag, mh)?;
        *request = req_ptr(r);
    }
}

/// `isend(…, mhandle, phandle, request)` (v10+): the profiler handle is accepted and ignored
/// (verbsnet records no profiler events).
pub(crate) unsafe extern "C" fn isend_p(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    _phandle: *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: the same arguments, under the same contract, as v9's isend.
    unsafe { isend::<usize>(send_comm, data, size, tag, mhandle, request) }
}

entry! {
    /// `irecv(recvComm, n, data, sizes, tags, mhandles, request)`: `int*` sizes (v7/v8),
    /// `size_t*` (v9).
    fn irecv<S: WireSize>(
        recv_comm: *mut c_void,
        n: c_int,
        data: *mut *mut c_void,
        sizes: *mut S,
        tags: *mut c_int,
        mhandles: *mut *mut c_void,
        request: *mut *mut c_void,
    ) as "irecv", Op::Irecv {
        let c: &NetComm = arg!(recv_comm, "recvComm");
        let c = c.as_recv(OP)?;
        let request = out!(request, "request");
        let n = usize::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_RECVS).contains(n))
            .ok_or_else(|| bad_size(OP, format!("irecv of {n} buffers; maxRecvs is {MAX_RECVS}")))?;
        let data = array!(data, n, "data");
        let sizes = array!(sizes, n, "sizes");
        let tags = array!(tags, n, "tags");
        let mhandles = array!(mhandles, n, "mhandles");
        // v9+: NCCL may preset *request to NCCL_NET_OPTIONAL_RECV_COMPLETION (nccl_net.h); older
        // versions leave it unspecified, so it is read only there.
        let optional =
            S::V9_PLUS && *request as usize == NCCL_NET_OPTIONAL_RECV_COMPLETION as usize;
        // On the stack (every call of the hot path allocates nothing): slots past `n` hold
        // buffer 0's handle and are never read.
        let mh0: &MrHandle = arg!(mhandles[0], "mhandle");
        let mut bufs = [(0u64, 0u64, 0 as c_int, mh0); MAX_RECVS];
        for i in 0..n {
            let mh: &MrHandle = arg!(mhandles[i], "mhandle");
            let s = sizes[i]
                .bytes()
                .ok_or_else(|| bad_size(OP, format!("irecv buffer {i} of {} bytes", sizes[i])))?;
            bufs[i] = (data[i] as u64, s, tags[i], mh);
        }
        let r = c.irecv(&mut bufs[..n], optional)?;
        // Always overwritten: a real request, even for optional ones.
        *request = req_ptr(r);
    }
}

/// `irecv(…, mhandles, phandles, request)` (v10+): profiler handles accepted and ignored.
#[allow(clippy::too_many_arguments)] // the ABI's signature
pub(crate) unsafe extern "C" fn irecv_p(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    _phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: the same arguments, under the same contract, as v9's irecv.
    unsafe { irecv::<usize>(recv_comm, n, data, sizes, tags, mhandles, request) }
}

entry! {
    /// `iflush` (every version, `int*` sizes) on a receive comm: host memory needs no flush; a
    /// NULL request means "complete" (ext-net README).
    fn iflush(
        recv_comm: *mut c_void,
        _n: c_int,
        _data: *mut *mut c_void,
        _sizes: *mut c_int,
        _mhandles: *mut *mut c_void,
        request: *mut *mut c_void,
    ) as "iflush", Op::Iflush {
        let c: &NetComm = arg!(recv_comm, "recvComm");
        let c = c.as_recv(OP)?;
        let request = out!(request, "request");
        *request = req_ptr(c.iflush()?);
    }
}

entry! {
    /// `test(request, done, sizes)` (every version, `int*` sizes; `sizes` may be NULL, else it
    /// has room for the request's n sizes, 1 for a send).
    fn test(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) as "test", Op::Test {
        let h: &ReqHandle = arg!(request, "request");
        let done = out!(done, "done");
        // The handle holds its comm, which NCCL keeps open while testing.
        let r = api::test(h)?;
        if let (Some(v), false) = (&r, sizes.is_null()) {
            // NCCL passes room for the request's sizes: 1 for a send, n for a grouped receive.
            let out = array!(mut sizes, v.len(), "sizes");
            for (o, &s) in out.iter_mut().zip(v.iter()) {
                // Sizes never exceed maxP2pBytes (1 GiB), so they fit an int.
                *o = c_int::try_from(s).map_err(|_| {
                    Error::new(OP, Class::Internal, format!("completed size {s} exceeds int"))
                })?;
            }
        }
        *done = c_int::from(r.is_some());
    }
}

// ---- close ----

/// Closes `c`, then frees the registrations its caller never deregistered (NCCL deregisters
/// first; other callers may not): the QP is gone, so nothing writes into them any more.
#[allow(clippy::boxed_local)] // the box's address is the key regMr recorded the handles under
fn close_and_free(c: Box<NetComm>) {
    let at = &*c as *const NetComm as usize;
    c.close();
    for mh in api::mrs_left_by(at) {
        // SAFETY: each came from `into_raw` in regMr through this comm and was not
        // deregistered (deregMr forgets it); the caller may not use it after the close.
        drop(unsafe { from_raw::<MrHandle>(mh as *mut c_void) });
    }
}

entry! {
    /// `closeSend(sendComm)`: logs the counters and releases the QP and buffers, then the
    /// registrations made through it and not deregistered.
    fn close_send(send_comm: *mut c_void) as "closeSend", Op::Close {
        let c: Box<NetComm> = arg!(take send_comm, "sendComm");
        close_and_free(c);
    }
}

entry! {
    /// `closeRecv(recvComm)`: logs the counters and releases the QP and buffers.
    fn close_recv(recv_comm: *mut c_void) as "closeRecv", Op::Close {
        let c: Box<NetComm> = arg!(take recv_comm, "recvComm");
        close_and_free(c);
    }
}

entry! {
    /// `closeListen(listenComm)`.
    fn close_listen(listen_comm: *mut c_void) as "closeListen", Op::Close {
        let l: Box<ListenComm> = arg!(take listen_comm, "listenComm");
        drop(l);
    }
}
