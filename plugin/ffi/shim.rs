//! The shim bodies, written once for every ABI version.
//!
//! Each `extern "C"` function here is one table slot's body; the version adapters
//! (`v7.rs` … `v12.rs`) put them in their tables, instantiating the generic ones with the
//! version's size type (`int` up to v8, `size_t` from v9) or properties struct. Every body:
//! - runs inside `guard`: a panic never crosses into NCCL (Rust aborts the process when one
//!   unwinds out of `extern "C"`); it is logged as one WARN and returned as
//!   `ncclInternalError`;
//! - checks its pointers, calls the version-independent API ([`crate::api`]), and writes
//!   out-parameters only on success — except `*request`/`*comm`, which are always overwritten
//!   on success (NULL = "not now, call again", ext-net README; `*request` may hold
//!   `NCCL_NET_OPTIONAL_RECV_COMPLETION` on input in v9+);
//! - maps the error's class ([`Class`]) to `ncclResult_t` in one place, `code`, and
//!   logs its whole report (text, causes, fix) as the WARN.

use std::ffi::{c_int, c_void};
use std::fmt::Display;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use tracing::{info, warn};

use super::abi::{
    ncclDebugLogger_t, ncclNetCommConfig_v10_t, ncclNetDeviceHandle_v8_t, ncclProfilerCallback_t,
    ncclResult_t, NCCL_NET_OPTIONAL_RECV_COMPLETION, NCCL_PTR_HOST,
};
use crate::api::{
    self, Class, CommPtr, Context, Error, InitArgs, ListenComm, MrHandle, NetComm, Op, ReqHandle,
};
use crate::conn::HANDLE_SIZE;
use crate::engine::wire::MAX_RECVS;
use crate::mem::Region;

/// Every table's `name`: final at load time (NCCL 2.28+ matches `NCCL_NET` against it before
/// `init`).
pub(crate) const NAME: &std::ffi::CStr = c"verbsnet";

/// An exported function table (`ncclNet_vN_t`), shareable as a `static`.
#[repr(transparent)]
pub struct Table<T>(pub T);

// SAFETY: a table is immutable after load; `name` points to a 'static C string and the
// function pointers are plain code addresses.
unsafe impl<T> Sync for Table<T> {}

/// The ABI version of the table whose `init` NCCL called last (0 before any), for logs.
static ABI_VERSION: AtomicU32 = AtomicU32::new(0);

/// The ABI version NCCL is using (the table whose `init` was called), 0 before `init`.
pub fn abi_version() -> u32 {
    ABI_VERSION.load(Ordering::Relaxed)
}

/// The one mapping of [`Error`] to `ncclResult_t` (ext-net README: network/hardware failures
/// → system error, NCCL misusing the plugin → internal error, user misconfiguration →
/// invalid usage, the peer failing → remote error).
pub(crate) fn code(e: &Error) -> ncclResult_t {
    match e.class() {
        Class::InvalidArgument => ncclResult_t::ncclInvalidArgument,
        Class::Usage => ncclResult_t::ncclInvalidUsage,
        Class::Remote => ncclResult_t::ncclRemoteError,
        Class::System => ncclResult_t::ncclSystemError,
        Class::Internal => ncclResult_t::ncclInternalError,
    }
}

/// Runs `f`, mapping errors and panics to a result code with a WARN line.
pub(crate) fn guard(slot: &str, f: impl FnOnce() -> Result<(), Error>) -> ncclResult_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => ncclResult_t::ncclSuccess,
        Ok(Err(e)) => {
            // The whole chain: this call's text, each cause, the fix.
            warn!("{slot}: {}", e.report());
            code(&e)
        }
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            // Logging itself may have panicked; don't let a second panic escape.
            let _ =
                catch_unwind(|| warn!("{slot}: internal error (panic: {msg}); please report this"));
            ncclResult_t::ncclInternalError
        }
    }
}

fn null_arg(op: Op, what: &str) -> Error {
    Error::new(op, Class::InvalidArgument, format!("{what} is NULL"))
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

/// Takes a new reference on the context NCCL passes as `ctx` (v11+).
///
/// # Safety
/// `ctx` must be NULL or a pointer `init` returned and `finalize` has not consumed.
unsafe fn ctx_arc(ctx: *mut c_void) -> Result<Arc<Context>, Error> {
    if ctx.is_null() {
        return Err(null_arg(Op::Init, "ctx"));
    }
    let p = ctx as *const Context;
    // SAFETY: p came from Arc::into_raw in init_ctx and its reference is still held (NCCL
    // finalizes a context once, after its last listen/connect).
    unsafe {
        Arc::increment_strong_count(p);
        Ok(Arc::from_raw(p))
    }
}

/// Casts an opaque send/recv comm pointer back.
///
/// # Safety
/// `p` must be NULL or a pointer this plugin returned from connect/accept and not yet closed.
unsafe fn net_comm<'a>(p: *mut c_void, op: Op, what: &str) -> Result<&'a NetComm, Error> {
    // SAFETY: per the contract, p came from Box::into_raw(Box<NetComm>) and is still live.
    unsafe { (p as *const NetComm).as_ref() }.ok_or_else(|| null_arg(op, what))
}

/// Casts an opaque memory handle back.
///
/// # Safety
/// `p` must be NULL or come from this plugin's regMr and not be deregistered.
unsafe fn mr_ref<'a>(p: *mut c_void, op: Op) -> Result<&'a MrHandle, Error> {
    // SAFETY: per the contract, p came from Box::into_raw(Box<MrHandle>).
    unsafe { (p as *const MrHandle).as_ref() }.ok_or_else(|| null_arg(op, "mhandle"))
}

/// # Safety
/// `handle` must be NULL or point to NCCL_NET_HANDLE_MAXSIZE (128) writable bytes.
unsafe fn handle_mut<'a>(handle: *mut c_void, op: Op) -> Result<&'a mut [u8; HANDLE_SIZE], Error> {
    // SAFETY: NCCL's handle buffer is 128 bytes (NCCL_NET_HANDLE_MAXSIZE); checked for NULL.
    unsafe { (handle as *mut [u8; HANDLE_SIZE]).as_mut() }.ok_or_else(|| null_arg(op, "handle"))
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

// ---- init / finalize ----

/// `init(logFunction)` (v7–v9); `V` is the table's version, for the log.
pub(crate) unsafe extern "C" fn init<const V: u32>(logger: ncclDebugLogger_t) -> ncclResult_t {
    guard("init", || {
        let ctx = api::init(InitArgs {
            logger: super::logger::sink(logger),
            comm_id: None,
            traffic_class: api::TRAFFIC_CLASS_UNDEF,
        })?;
        log_version(V, &ctx);
        Ok(())
    })
}

/// `init(logFunction, profFunction)` (v10). verbsnet records no profiler events yet, so the
/// callback is not kept.
pub(crate) unsafe extern "C" fn init_prof<const V: u32>(
    logger: ncclDebugLogger_t,
    _prof: ncclProfilerCallback_t,
) -> ncclResult_t {
    // SAFETY: same contract as init.
    unsafe { init::<V>(logger) }
}

/// `init(ctx, commId, config, logFunction, profFunction)` (v11+): a new context per
/// communicator; `config` may be NULL (no traffic class).
pub(crate) unsafe extern "C" fn init_ctx<const V: u32>(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut ncclNetCommConfig_v10_t,
    logger: ncclDebugLogger_t,
    _prof: ncclProfilerCallback_t,
) -> ncclResult_t {
    guard("init", || {
        if ctx.is_null() {
            return Err(null_arg(Op::Init, "ctx"));
        }
        // SAFETY: NCCL passes NULL or a valid config struct.
        let tc = unsafe { config.as_ref() }.map_or(api::TRAFFIC_CLASS_UNDEF, |c| c.trafficClass);
        let c = api::init(InitArgs {
            logger: super::logger::sink(logger),
            comm_id: Some(comm_id),
            traffic_class: tc,
        })?;
        log_version(V, &c);
        // SAFETY: checked non-NULL above; NCCL passes a writable pointer.
        unsafe { *ctx = Arc::into_raw(c) as *mut c_void };
        Ok(())
    })
}

/// `finalize(ctx)` (v11+): NCCL calls it once per `init`, unconditionally.
pub(crate) unsafe extern "C" fn finalize(ctx: *mut c_void) -> ncclResult_t {
    guard("finalize", || {
        if ctx.is_null() {
            return Err(null_arg(Op::Close, "ctx"));
        }
        // SAFETY: ctx came from Arc::into_raw in init_ctx; finalize consumes that reference once.
        let c = unsafe { Arc::from_raw(ctx as *const Context) };
        api::finalize(c);
        Ok(())
    })
}

// ---- devices and properties ----

pub(crate) unsafe extern "C" fn devices(ndev: *mut c_int) -> ncclResult_t {
    guard("devices", || {
        let n = api::devices()?;
        // SAFETY: NCCL passes a valid int pointer; checked for NULL.
        let out = unsafe { ndev.as_mut() }.ok_or_else(|| null_arg(Op::Properties, "ndev"))?;
        *out = c_int::try_from(n).unwrap_or(c_int::MAX);
        Ok(())
    })
}

/// `getProperties(dev, props)` for any version's struct `P`.
pub(crate) unsafe extern "C" fn get_properties<P: FromProps>(
    dev: c_int,
    props: *mut P,
) -> ncclResult_t {
    guard("getProperties", || {
        let p = api::properties(dev)?;
        // SAFETY: NCCL passes a valid properties struct of this version; checked for NULL.
        let out = unsafe { props.as_mut() }.ok_or_else(|| null_arg(Op::Properties, "props"))?;
        *out = P::from_props(&p);
        Ok(())
    })
}

// ---- listen / connect / accept ----

fn listen_body(
    ctx: Result<Arc<Context>, Error>,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> Result<(), Error> {
    let ctx = ctx?;
    // SAFETY: see handle_mut.
    let h = unsafe { handle_mut(handle, Op::Listen) }?;
    if listen_comm.is_null() {
        return Err(null_arg(Op::Listen, "listenComm"));
    }
    let l = api::listen(ctx, dev, h)?;
    // SAFETY: checked non-NULL above; NCCL passes a writable pointer.
    unsafe { *listen_comm = Box::into_raw(Box::new(l)) as *mut c_void };
    Ok(())
}

/// `listen(dev, handle, listenComm)` (v7–v10).
pub(crate) unsafe extern "C" fn listen(
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> ncclResult_t {
    guard("listen", || {
        listen_body(api::legacy_context(), dev, handle, listen_comm)
    })
}

/// `listen(ctx, dev, handle, listenComm)` (v11+).
pub(crate) unsafe extern "C" fn listen_ctx(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> ncclResult_t {
    guard("listen", || {
        // SAFETY: ctx is NULL or came from init_ctx.
        listen_body(unsafe { ctx_arc(ctx) }, dev, handle, listen_comm)
    })
}

fn connect_body(
    ctx: Result<Arc<Context>, Error>,
    dev: c_int,
    traffic_class: i32,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
) -> Result<(), Error> {
    let ctx = ctx?;
    // SAFETY: see handle_mut.
    let h = unsafe { handle_mut(handle, Op::Connect) }?;
    if send_comm.is_null() {
        return Err(null_arg(Op::Connect, "sendComm"));
    }
    let out = api::connect(ctx, dev, h, traffic_class)?.map_or(ptr::null_mut(), |c| {
        Box::into_raw(Box::new(NetComm::Send(c))) as *mut c_void
    });
    // SAFETY: checked non-NULL above. NULL = "call again" (ext-net README).
    unsafe { *send_comm = out };
    Ok(())
}

/// `connect(dev, handle, sendComm, sendDevComm)` (v7–v9). `sendDevComm` may be NULL and is
/// left untouched (host plugin).
pub(crate) unsafe extern "C" fn connect(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _send_dev_comm: *mut *mut ncclNetDeviceHandle_v8_t,
) -> ncclResult_t {
    guard("connect", || {
        connect_body(
            api::legacy_context(),
            dev,
            api::TRAFFIC_CLASS_UNDEF,
            handle,
            send_comm,
        )
    })
}

/// `connect(dev, config, handle, sendComm, sendDevComm)` (v10): `config` may be NULL (NCCL's
/// GDR probe) and is read, never kept.
pub(crate) unsafe extern "C" fn connect_cfg(
    dev: c_int,
    config: *mut ncclNetCommConfig_v10_t,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _send_dev_comm: *mut *mut ncclNetDeviceHandle_v8_t,
) -> ncclResult_t {
    guard("connect", || {
        // SAFETY: NCCL passes NULL or a valid config for the duration of the call.
        let tc = unsafe { config.as_ref() }.map_or(api::TRAFFIC_CLASS_UNDEF, |c| c.trafficClass);
        connect_body(api::legacy_context(), dev, tc, handle, send_comm)
    })
}

/// `connect(ctx, dev, handle, sendComm, sendDevComm)` (v11+).
pub(crate) unsafe extern "C" fn connect_ctx(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _send_dev_comm: *mut *mut ncclNetDeviceHandle_v8_t,
) -> ncclResult_t {
    guard("connect", || {
        // SAFETY: ctx is NULL or came from init_ctx.
        let ctx = unsafe { ctx_arc(ctx) };
        connect_body(ctx, dev, api::TRAFFIC_CLASS_UNDEF, handle, send_comm)
    })
}

/// `accept(listenComm, recvComm, recvDevComm)` (every version).
pub(crate) unsafe extern "C" fn accept(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    _recv_dev_comm: *mut *mut ncclNetDeviceHandle_v8_t,
) -> ncclResult_t {
    guard("accept", || {
        // SAFETY: listen_comm came from our listen (Box<ListenComm>) and is used by one thread.
        let l = unsafe { (listen_comm as *mut ListenComm).as_mut() }
            .ok_or_else(|| null_arg(Op::Accept, "listenComm"))?;
        if recv_comm.is_null() {
            return Err(null_arg(Op::Accept, "recvComm"));
        }
        let out = l.accept()?.map_or(ptr::null_mut(), |c| {
            Box::into_raw(Box::new(NetComm::Recv(c))) as *mut c_void
        });
        // SAFETY: checked non-NULL above.
        unsafe { *recv_comm = out };
        Ok(())
    })
}

// ---- memory registration ----

/// `regMr(comm, data, size, type, mhandle)`: `int` size in v7, `size_t` from v8.
pub(crate) unsafe extern "C" fn reg_mr<S: WireSize>(
    comm: *mut c_void,
    data: *mut c_void,
    size: S,
    type_: c_int,
    mhandle: *mut *mut c_void,
) -> ncclResult_t {
    guard("regMr", || {
        // SAFETY: comm came from our connect/accept.
        let c = unsafe { net_comm(comm, Op::RegMr, "comm") }?;
        let size = size
            .bytes()
            .and_then(|s| usize::try_from(s).ok())
            .ok_or_else(|| {
                Error::new(
                    Op::RegMr,
                    Class::InvalidArgument,
                    format!("regMr of {size} bytes"),
                )
            })?;
        if type_ != NCCL_PTR_HOST as c_int {
            return Err(Error::new(
                Op::RegMr,
                Class::Internal,
                format!(
                "regMr of memory type {type_}: verbsnet supports host memory only (ptrSupport = \
                 NCCL_PTR_HOST), so NCCL should stage GPU buffers through host memory"
            ),
            ));
        }
        if data.is_null() && size > 0 {
            return Err(null_arg(Op::RegMr, "data"));
        }
        if (data as u64).checked_add(size as u64).is_none() {
            return Err(Error::new(
                Op::RegMr,
                Class::InvalidArgument,
                format!("regMr of {size} bytes at {data:p}: the range wraps the address space"),
            ));
        }
        if mhandle.is_null() {
            return Err(null_arg(Op::RegMr, "mhandle"));
        }
        // SAFETY: NCCL guarantees [data, data+size) stays valid until deregMr (ext-net README);
        // deregMr drops the MrHandle and with it every Region clone of this range.
        let region = unsafe { Region::from_raw(data as u64, size) };
        let mh = Box::into_raw(Box::new(c.reg_mr(region)?));
        c.track_mr(mh as usize);
        // SAFETY: checked non-NULL above.
        unsafe { *mhandle = mh as *mut c_void };
        Ok(())
    })
}

/// `deregMr(comm, mhandle)` (every version).
pub(crate) unsafe extern "C" fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> ncclResult_t {
    guard("deregMr", || {
        if mhandle.is_null() {
            return Err(null_arg(Op::RegMr, "mhandle"));
        }
        // SAFETY: comm is NULL or came from our connect/accept and is not closed yet.
        if let Ok(c) = unsafe { net_comm(comm, Op::RegMr, "comm") } {
            c.untrack_mr(mhandle as usize);
        }
        // SAFETY: mhandle came from Box::into_raw in reg_mr and NCCL deregisters it once.
        drop(unsafe { Box::from_raw(mhandle as *mut MrHandle) });
        Ok(())
    })
}

// ---- data path ----

fn req_ptr(r: Option<&ReqHandle>) -> *mut c_void {
    r.map_or(ptr::null_mut(), |h| h as *const ReqHandle as *mut c_void)
}

fn isend_body<S: WireSize>(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: S,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> Result<(), Error> {
    // SAFETY: send_comm came from our connect.
    let c = unsafe { net_comm(send_comm, Op::Isend, "sendComm") }?.as_send(Op::Isend)?;
    // SAFETY: mhandle came from our regMr.
    let mh = unsafe { mr_ref(mhandle, Op::Isend) }?;
    if request.is_null() {
        return Err(null_arg(Op::Isend, "request"));
    }
    let size = size.bytes().ok_or_else(|| {
        Error::new(
            Op::Isend,
            Class::InvalidArgument,
            format!("isend of {size} bytes"),
        )
    })?;
    let r = c.isend(data as u64, size, tag, mh)?;
    // SAFETY: checked non-NULL; always overwritten.
    unsafe { *request = req_ptr(r) };
    Ok(())
}

/// `isend(sendComm, data, size, tag, mhandle, request)`: `int` size (v7/v8), `size_t` (v9).
pub(crate) unsafe extern "C" fn isend<S: WireSize>(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: S,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    guard("isend", || {
        isend_body(send_comm, data, size, tag, mhandle, request)
    })
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
    guard("isend", || {
        isend_body(send_comm, data, size, tag, mhandle, request)
    })
}

fn irecv_body<S: WireSize>(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut S,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> Result<(), Error> {
    // SAFETY: recv_comm came from our accept.
    let c = unsafe { net_comm(recv_comm, Op::Irecv, "recvComm") }?.as_recv(Op::Irecv)?;
    if request.is_null()
        || data.is_null()
        || sizes.is_null()
        || tags.is_null()
        || mhandles.is_null()
    {
        return Err(null_arg(Op::Irecv, "an irecv array or request"));
    }
    let n = usize::try_from(n)
        .ok()
        .filter(|n| (1..=MAX_RECVS).contains(n))
        .ok_or_else(|| {
            Error::new(
                Op::Irecv,
                Class::InvalidArgument,
                format!("irecv of {n} buffers; maxRecvs is {MAX_RECVS}"),
            )
        })?;
    // v9+: NCCL may preset *request to NCCL_NET_OPTIONAL_RECV_COMPLETION (nccl_net.h); older
    // versions leave it unspecified, so it is read only there.
    let optional = S::V9_PLUS
        // SAFETY: checked non-NULL; NCCL initializes the slot before the call in v9+.
        && unsafe { *request } as usize == NCCL_NET_OPTIONAL_RECV_COMPLETION as usize;
    let mut bufs = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: NCCL passes arrays of n entries; checked non-NULL above.
        let (d, s, t, m) = unsafe { (*data.add(i), *sizes.add(i), *tags.add(i), *mhandles.add(i)) };
        // SAFETY: m came from our regMr.
        let mh = unsafe { mr_ref(m, Op::Irecv) }?;
        let s = s.bytes().ok_or_else(|| {
            Error::new(
                Op::Irecv,
                Class::InvalidArgument,
                format!("irecv buffer {i} of {s} bytes"),
            )
        })?;
        bufs.push((d as u64, s, t, mh));
    }
    let r = c.irecv(&mut bufs, optional)?;
    // SAFETY: checked non-NULL; always overwritten (a real request, even for optional ones).
    unsafe { *request = req_ptr(r) };
    Ok(())
}

/// `irecv(recvComm, n, data, sizes, tags, mhandles, request)`: `int*` sizes (v7/v8),
/// `size_t*` (v9).
pub(crate) unsafe extern "C" fn irecv<S: WireSize>(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut S,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    guard("irecv", || {
        irecv_body(recv_comm, n, data, sizes, tags, mhandles, request)
    })
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
    guard("irecv", || {
        irecv_body(recv_comm, n, data, sizes, tags, mhandles, request)
    })
}

/// `iflush` (every version, `int*` sizes) on a receive comm: host memory needs no flush; a
/// NULL request means "complete" (ext-net README).
pub(crate) unsafe extern "C" fn iflush(
    recv_comm: *mut c_void,
    _n: c_int,
    _data: *mut *mut c_void,
    _sizes: *mut c_int,
    _mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    guard("iflush", || {
        // SAFETY: recv_comm came from our accept.
        let c = unsafe { net_comm(recv_comm, Op::Iflush, "recvComm") }?.as_recv(Op::Iflush)?;
        if request.is_null() {
            return Err(null_arg(Op::Iflush, "request"));
        }
        let r = c.iflush()?;
        // SAFETY: checked non-NULL; always overwritten.
        unsafe { *request = req_ptr(r) };
        Ok(())
    })
}

/// `test(request, done, sizes)` (every version, `int*` sizes; `sizes` may be NULL).
pub(crate) unsafe extern "C" fn test(
    request: *mut c_void,
    done: *mut c_int,
    sizes: *mut c_int,
) -> ncclResult_t {
    guard("test", || {
        // SAFETY: request came from our isend/irecv and NCCL tests it until done.
        let h = unsafe { (request as *const ReqHandle).as_ref() }
            .ok_or_else(|| null_arg(Op::Test, "request"))?;
        if done.is_null() {
            return Err(null_arg(Op::Test, "done"));
        }
        let orphan = || Error::new(Op::Test, Class::Internal, "request without comm");
        // The handle lives inside its comm, which NCCL keeps open while testing; the handle
        // says which kind of comm that is.
        let r = match h.comm() {
            CommPtr::Send(p) => {
                // SAFETY: p is NULL or the live send comm that owns h (above).
                api::test(h, unsafe { p.as_ref() }.ok_or_else(orphan)?)
            }
            CommPtr::Recv(p) => {
                // SAFETY: p is NULL or the live receive comm that owns h (above).
                api::test(h, unsafe { p.as_ref() }.ok_or_else(orphan)?)
            }
        }?;
        // SAFETY: checked non-NULL.
        unsafe { *done = c_int::from(r.is_some()) };
        if let (Some(v), false) = (r, sizes.is_null()) {
            for (i, s) in v.iter().enumerate() {
                // Sizes never exceed maxP2pBytes (1 GiB), so they fit an int.
                let s = c_int::try_from(*s).map_err(|_| {
                    Error::new(
                        Op::Test,
                        Class::Internal,
                        format!("completed size {s} exceeds int"),
                    )
                })?;
                // SAFETY: NCCL passes room for n sizes (1 for a send); sizes may be NULL.
                unsafe { *sizes.add(i) = s };
            }
        }
        Ok(())
    })
}

// ---- close ----

/// closeSend and closeRecv: both hand back a comm boxed by connect/accept.
///
/// # Safety
/// `comm` must be NULL or a comm this plugin returned from connect/accept, not yet closed.
unsafe fn close_comm(slot: &str, what: &str, comm: *mut c_void) -> ncclResult_t {
    guard(slot, || {
        if comm.is_null() {
            return Err(null_arg(Op::Close, what));
        }
        // SAFETY: came from Box::into_raw in connect (send) or accept (recv); NCCL closes it once.
        let leaked = unsafe { Box::from_raw(comm as *mut NetComm) }.close();
        // Registrations the caller never deregistered (NCCL deregisters first; others may
        // not): freed now that the comm and its QP are gone.
        for mh in leaked {
            // SAFETY: each came from Box::into_raw in reg_mr on this comm and was not
            // deregistered (deregMr forgets it); the caller may not use it after close.
            drop(unsafe { Box::from_raw(mh as *mut MrHandle) });
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn close_send(send_comm: *mut c_void) -> ncclResult_t {
    // SAFETY: NCCL passes the sendComm connect returned, once.
    unsafe { close_comm("closeSend", "sendComm", send_comm) }
}

pub(crate) unsafe extern "C" fn close_recv(recv_comm: *mut c_void) -> ncclResult_t {
    // SAFETY: NCCL passes the recvComm accept returned, once.
    unsafe { close_comm("closeRecv", "recvComm", recv_comm) }
}

pub(crate) unsafe extern "C" fn close_listen(listen_comm: *mut c_void) -> ncclResult_t {
    guard("closeListen", || {
        if listen_comm.is_null() {
            return Err(null_arg(Op::Close, "listenComm"));
        }
        // SAFETY: came from Box::into_raw in listen; NCCL closes it once.
        drop(unsafe { Box::from_raw(listen_comm as *mut ListenComm) });
        Ok(())
    })
}
