//! The exported `ncclNetPlugin_v8` table and one shim per slot.
//!
//! Every shim: checks its pointers, calls the safe Rust API, writes out-parameters only on
//! success, maps errors to `ncclResult_t` with one WARN naming the cause, and never lets a
//! panic cross into NCCL (Rust aborts the process when a panic unwinds out of `extern "C"`).

use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use tracing::warn;

use super::abi::{
    ncclDebugLogger_t, ncclNetDeviceHandle_v8_t, ncclNetDeviceType, ncclNetProperties_v7_t,
    ncclNetProperties_v8_t, ncclNet_v7_t, ncclNet_v8_t, ncclResult_t, NCCL_PTR_HOST,
};
use super::mem::Region;
use crate::comm::{Comm, Error, MrHandle, ReqHandle};
use crate::conn::{Connecting, Listen, HANDLE_SIZE};
use crate::engine::wire::MAX_RECVS;
use crate::net;

/// The table NCCL finds with `dlsym("ncclNetPlugin_v8")`.
#[repr(transparent)]
pub struct PluginTable(pub(crate) ncclNet_v8_t);

// SAFETY: the table is immutable after load; `name` points to a 'static C string and the
// function pointers are plain code addresses.
unsafe impl Sync for PluginTable {}

/// `name` is final at load time: NCCL 2.28+ matches `NCCL_NET` against it before `init`.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v8: PluginTable = PluginTable(ncclNet_v8_t {
    name: c"verbsnet".as_ptr(),
    init: Some(init),
    devices: Some(devices),
    getProperties: Some(get_properties),
    listen: Some(listen),
    connect: Some(connect),
    accept: Some(accept),
    regMr: Some(reg_mr),
    regMrDmaBuf: None,
    deregMr: Some(dereg_mr),
    isend: Some(isend),
    irecv: Some(irecv),
    iflush: Some(iflush),
    test: Some(test),
    closeSend: Some(close_send),
    closeRecv: Some(close_recv),
    closeListen: Some(close_listen),
    getDeviceMr: None,
    irecvConsumed: None,
});

/// The v7 table, for NCCL 2.19 (newer NCCL probes v8 first). It shares every shim with v8 but
/// `getProperties` (no `regIsGlobal`) and `regMr` (`int` size): ext-net ABI delta v7 → v8.
#[repr(transparent)]
pub struct PluginTableV7(pub(crate) ncclNet_v7_t);

// SAFETY: as for PluginTable.
unsafe impl Sync for PluginTableV7 {}

/// `ncclNetPlugin_v7`, found by NCCL 2.19's loader.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v7: PluginTableV7 = PluginTableV7(ncclNet_v7_t {
    name: c"verbsnet".as_ptr(),
    init: Some(init),
    devices: Some(devices),
    getProperties: Some(get_properties_v7),
    listen: Some(listen),
    connect: Some(connect),
    accept: Some(accept),
    regMr: Some(reg_mr_v7),
    regMrDmaBuf: None,
    deregMr: Some(dereg_mr),
    isend: Some(isend),
    irecv: Some(irecv),
    iflush: Some(iflush),
    test: Some(test),
    closeSend: Some(close_send),
    closeRecv: Some(close_recv),
    closeListen: Some(close_listen),
    getDeviceMr: None,
    irecvConsumed: None,
});

fn code(e: &Error) -> ncclResult_t {
    match e {
        Error::InvalidArgument(_) => ncclResult_t::ncclInvalidArgument,
        Error::Usage(_) => ncclResult_t::ncclInvalidUsage,
        Error::Remote(_) => ncclResult_t::ncclRemoteError,
        Error::System(_) => ncclResult_t::ncclSystemError,
        Error::Internal(_) => ncclResult_t::ncclInternalError,
    }
}

/// Runs `f`, mapping errors and panics to a result code with a WARN line.
fn guard(slot: &str, f: impl FnOnce() -> Result<(), Error>) -> ncclResult_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => ncclResult_t::ncclSuccess,
        Ok(Err(e)) => {
            warn!("{slot}: {e}");
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

fn null_arg(what: &str) -> Error {
    Error::InvalidArgument(format!("{what} is NULL"))
}

fn dev_entry(net: &net::Net, dev: c_int) -> Result<&net::DevEntry, Error> {
    usize::try_from(dev)
        .ok()
        .and_then(|d| net.devs.get(d))
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "device {dev} does not exist (this plugin has {})",
                net.devs.len()
            ))
        })
}

/// Casts an opaque comm pointer back to its comm.
///
/// # Safety
/// `p` must be a pointer this plugin returned from connect/accept and not yet closed.
unsafe fn comm_ref<'a>(p: *mut c_void) -> Result<&'a Comm, Error> {
    // SAFETY: per the contract, p came from Box::into_raw(Box<Comm>) and is still live.
    unsafe { (p as *const Comm).as_ref() }.ok_or_else(|| null_arg("comm"))
}

/// Casts an opaque memory handle back.
///
/// # Safety
/// `p` must come from this plugin's regMr and not be deregistered.
unsafe fn mr_ref<'a>(p: *mut c_void) -> Result<&'a MrHandle, Error> {
    // SAFETY: per the contract, p came from Box::into_raw(Box<MrHandle>).
    unsafe { (p as *const MrHandle).as_ref() }.ok_or_else(|| null_arg("mhandle"))
}

unsafe extern "C" fn init(logger: ncclDebugLogger_t) -> ncclResult_t {
    guard("init", || net::init(logger))
}

unsafe extern "C" fn devices(ndev: *mut c_int) -> ncclResult_t {
    guard("devices", || {
        let net = net::get()?;
        // SAFETY: NCCL passes a valid int pointer; checked for NULL.
        let out = unsafe { ndev.as_mut() }.ok_or_else(|| null_arg("ndev"))?;
        *out = net.devs.len() as c_int;
        Ok(())
    })
}

unsafe extern "C" fn get_properties(
    dev: c_int,
    props: *mut ncclNetProperties_v8_t,
) -> ncclResult_t {
    guard("getProperties", || {
        let net = net::get()?;
        let d = dev_entry(&net, dev)?;
        // SAFETY: NCCL passes a valid properties struct; checked for NULL.
        let out = unsafe { props.as_mut() }.ok_or_else(|| null_arg("props"))?;
        *out = ncclNetProperties_v8_t {
            name: d.name_c.as_ptr() as *mut _,
            pciPath: d
                .pci_c
                .as_ref()
                .map_or(ptr::null_mut(), |c| c.as_ptr() as *mut _),
            guid: d.props.guid,
            ptrSupport: NCCL_PTR_HOST as c_int,
            regIsGlobal: 0,
            speed: d.props.speed_mbps,
            port: d.props.port,
            latency: d.props.latency_us,
            maxComms: d.props.max_comms,
            maxRecvs: MAX_RECVS as c_int,
            netDeviceType: ncclNetDeviceType::NCCL_NET_DEVICE_HOST,
            netDeviceVersion: 0,
        };
        Ok(())
    })
}

unsafe extern "C" fn get_properties_v7(
    dev: c_int,
    props: *mut ncclNetProperties_v7_t,
) -> ncclResult_t {
    if props.is_null() {
        return guard("getProperties", || Err(null_arg("props")));
    }
    let mut p8 = ncclNetProperties_v8_t::default();
    // SAFETY: p8 is a valid local struct.
    let r = unsafe { get_properties(dev, &mut p8) };
    if r == ncclResult_t::ncclSuccess {
        // SAFETY: checked non-NULL above; NCCL passes a valid v7 struct.
        unsafe {
            *props = ncclNetProperties_v7_t {
                name: p8.name,
                pciPath: p8.pciPath,
                guid: p8.guid,
                ptrSupport: p8.ptrSupport,
                speed: p8.speed,
                port: p8.port,
                latency: p8.latency,
                maxComms: p8.maxComms,
                maxRecvs: p8.maxRecvs,
                netDeviceType: p8.netDeviceType,
                netDeviceVersion: p8.netDeviceVersion,
            }
        };
    }
    r
}

unsafe extern "C" fn reg_mr_v7(
    comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    type_: c_int,
    mhandle: *mut *mut c_void,
) -> ncclResult_t {
    match usize::try_from(size) {
        // SAFETY: same contract as reg_mr; the size is the same value widened.
        Ok(size) => unsafe { reg_mr(comm, data, size, type_, mhandle) },
        Err(_) => guard("regMr", || {
            Err(Error::InvalidArgument(format!("regMr of {size} bytes")))
        }),
    }
}

/// # Safety
/// `handle` must point to NCCL_NET_HANDLE_MAXSIZE (128) writable bytes.
unsafe fn handle_mut<'a>(handle: *mut c_void) -> Result<&'a mut [u8; HANDLE_SIZE], Error> {
    // SAFETY: NCCL's handle buffer is 128 bytes (NCCL_NET_HANDLE_MAXSIZE); checked for NULL.
    unsafe { (handle as *mut [u8; HANDLE_SIZE]).as_mut() }.ok_or_else(|| null_arg("handle"))
}

unsafe extern "C" fn listen(
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> ncclResult_t {
    guard("listen", || {
        let net = net::get()?;
        let d = dev_entry(&net, dev)?;
        // SAFETY: see handle_mut.
        let h = unsafe { handle_mut(handle) }?;
        if listen_comm.is_null() {
            return Err(null_arg("listenComm"));
        }
        let l = Listen::new(
            d.dev.clone(),
            d.props.name.clone(),
            net.kind,
            net.listen_ip,
            &net.cfg,
            h,
        )?;
        // SAFETY: checked non-NULL above; NCCL passes a writable pointer.
        unsafe { *listen_comm = Box::into_raw(Box::new(l)) as *mut c_void };
        Ok(())
    })
}

unsafe extern "C" fn connect(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _send_dev_comm: *mut *mut ncclNetDeviceHandle_v8_t,
) -> ncclResult_t {
    guard("connect", || {
        let net = net::get()?;
        let d = dev_entry(&net, dev)?;
        // SAFETY: see handle_mut.
        let h = unsafe { handle_mut(handle) }?;
        if send_comm.is_null() {
            return Err(null_arg("sendComm"));
        }
        let mut c = Connecting::resume_or_start(h)?;
        match c.step(&d.dev, &d.props.name, &net.cfg) {
            Ok(Some(comm)) => {
                Connecting::clear(h);
                // SAFETY: checked non-NULL above.
                unsafe { *send_comm = Box::into_raw(comm) as *mut c_void };
            }
            Ok(None) => {
                c.park(h);
                // SAFETY: checked non-NULL above. NULL = "call again" (ext-net README).
                unsafe { *send_comm = ptr::null_mut() };
            }
            Err(e) => {
                Connecting::clear(h);
                return Err(e);
            }
        }
        Ok(())
    })
}

unsafe extern "C" fn accept(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    _recv_dev_comm: *mut *mut ncclNetDeviceHandle_v8_t,
) -> ncclResult_t {
    guard("accept", || {
        // SAFETY: listen_comm came from our listen (Box<Listen>) and is used by one thread.
        let l = unsafe { (listen_comm as *mut Listen).as_mut() }
            .ok_or_else(|| null_arg("listenComm"))?;
        if recv_comm.is_null() {
            return Err(null_arg("recvComm"));
        }
        let out = l
            .accept()?
            .map_or(ptr::null_mut(), |c| Box::into_raw(c) as *mut c_void);
        // SAFETY: checked non-NULL above.
        unsafe { *recv_comm = out };
        Ok(())
    })
}

unsafe extern "C" fn reg_mr(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    type_: c_int,
    mhandle: *mut *mut c_void,
) -> ncclResult_t {
    guard("regMr", || {
        // SAFETY: comm came from our connect/accept.
        let c = unsafe { comm_ref(comm) }?;
        if type_ != NCCL_PTR_HOST as c_int {
            return Err(Error::Internal(format!(
                "regMr of memory type {type_}: verbsnet supports host memory only (ptrSupport = \
                 NCCL_PTR_HOST), so NCCL should stage GPU buffers through host memory"
            )));
        }
        if data.is_null() && size > 0 {
            return Err(null_arg("data"));
        }
        if mhandle.is_null() {
            return Err(null_arg("mhandle"));
        }
        // SAFETY: NCCL guarantees [data, data+size) stays valid until deregMr (ext-net README);
        // deregMr drops the MrHandle and with it every Region clone of this range.
        let region = unsafe { Region::from_raw(data as u64, size) };
        let mh = MrHandle::register(&**c.device(), region)?;
        // SAFETY: checked non-NULL above.
        unsafe { *mhandle = Box::into_raw(Box::new(mh)) as *mut c_void };
        Ok(())
    })
}

unsafe extern "C" fn dereg_mr(_comm: *mut c_void, mhandle: *mut c_void) -> ncclResult_t {
    guard("deregMr", || {
        if mhandle.is_null() {
            return Err(null_arg("mhandle"));
        }
        // SAFETY: mhandle came from Box::into_raw in reg_mr and NCCL deregisters it once.
        drop(unsafe { Box::from_raw(mhandle as *mut MrHandle) });
        Ok(())
    })
}

unsafe extern "C" fn isend(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    guard("isend", || {
        // SAFETY: send_comm came from our connect.
        let c = unsafe { comm_ref(send_comm) }?;
        // SAFETY: mhandle came from our regMr.
        let mh = unsafe { mr_ref(mhandle) }?;
        if request.is_null() {
            return Err(null_arg("request"));
        }
        let size = u64::try_from(size)
            .map_err(|_| Error::InvalidArgument(format!("isend of {size} bytes")))?;
        let r = c.isend(data as u64, size, tag, mh)?;
        // SAFETY: checked non-NULL; always overwritten (it may hold 0x1 on input).
        unsafe { *request = r.map_or(ptr::null_mut(), |h| h as *const ReqHandle as *mut c_void) };
        Ok(())
    })
}

unsafe extern "C" fn irecv(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    guard("irecv", || {
        // SAFETY: recv_comm came from our accept.
        let c = unsafe { comm_ref(recv_comm) }?;
        if request.is_null()
            || data.is_null()
            || sizes.is_null()
            || tags.is_null()
            || mhandles.is_null()
        {
            return Err(null_arg("an irecv array or request"));
        }
        let n = usize::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_RECVS).contains(n))
            .ok_or_else(|| {
                Error::InvalidArgument(format!("irecv of {n} buffers; maxRecvs is {MAX_RECVS}"))
            })?;
        let mut bufs = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: NCCL passes arrays of n entries; checked non-NULL above.
            let (d, s, t, m) =
                unsafe { (*data.add(i), *sizes.add(i), *tags.add(i), *mhandles.add(i)) };
            // SAFETY: m came from our regMr.
            let mh = unsafe { mr_ref(m) }?;
            let s = u64::try_from(s)
                .map_err(|_| Error::InvalidArgument(format!("irecv buffer {i} of {s} bytes")))?;
            bufs.push((d as u64, s, t, mh));
        }
        let r = c.irecv(&bufs)?;
        // SAFETY: checked non-NULL; always overwritten.
        unsafe { *request = r.map_or(ptr::null_mut(), |h| h as *const ReqHandle as *mut c_void) };
        Ok(())
    })
}

unsafe extern "C" fn iflush(
    _recv_comm: *mut c_void,
    _n: c_int,
    _data: *mut *mut c_void,
    _sizes: *mut c_int,
    _mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    guard("iflush", || {
        // Host memory needs no flush: a NULL request means "complete" (ext-net README).
        if !request.is_null() {
            // SAFETY: checked non-NULL.
            unsafe { *request = ptr::null_mut() };
        }
        Ok(())
    })
}

unsafe extern "C" fn test(
    request: *mut c_void,
    done: *mut c_int,
    sizes: *mut c_int,
) -> ncclResult_t {
    guard("test", || {
        // SAFETY: request came from our isend/irecv and NCCL tests it until done.
        let h =
            unsafe { (request as *const ReqHandle).as_ref() }.ok_or_else(|| null_arg("request"))?;
        // SAFETY: the handle lives inside its comm, which NCCL keeps open while testing.
        let c = unsafe { h.comm().as_ref() }
            .ok_or_else(|| Error::Internal("request without comm".into()))?;
        if done.is_null() {
            return Err(null_arg("done"));
        }
        let r = c.test(h.id())?;
        // SAFETY: checked non-NULL.
        unsafe { *done = c_int::from(r.is_some()) };
        if let (Some(v), false) = (r, sizes.is_null()) {
            for (i, s) in v.iter().enumerate() {
                // SAFETY: NCCL passes room for n sizes (1 for a send); sizes may be NULL.
                unsafe { *sizes.add(i) = *s as c_int };
            }
        }
        Ok(())
    })
}

/// closeSend and closeRecv: both hand back a comm boxed by connect/accept.
///
/// # Safety
/// `comm` must be NULL or a comm this plugin returned from connect/accept, not yet closed.
unsafe fn close_comm(slot: &str, what: &str, comm: *mut c_void) -> ncclResult_t {
    guard(slot, || {
        if comm.is_null() {
            return Err(null_arg(what));
        }
        // SAFETY: came from Box::into_raw in connect (send) or accept (recv); NCCL closes it once.
        unsafe { Box::from_raw(comm as *mut Comm) }.close();
        Ok(())
    })
}

unsafe extern "C" fn close_send(send_comm: *mut c_void) -> ncclResult_t {
    // SAFETY: NCCL passes the sendComm connect returned, once.
    unsafe { close_comm("closeSend", "sendComm", send_comm) }
}

unsafe extern "C" fn close_recv(recv_comm: *mut c_void) -> ncclResult_t {
    // SAFETY: NCCL passes the recvComm accept returned, once.
    unsafe { close_comm("closeRecv", "recvComm", recv_comm) }
}

unsafe extern "C" fn close_listen(listen_comm: *mut c_void) -> ncclResult_t {
    guard("closeListen", || {
        if listen_comm.is_null() {
            return Err(null_arg("listenComm"));
        }
        // SAFETY: came from Box::into_raw in listen; NCCL closes it once.
        drop(unsafe { Box::from_raw(listen_comm as *mut Listen) });
        Ok(())
    })
}
