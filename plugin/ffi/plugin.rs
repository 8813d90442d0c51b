//! The exported `ncclNetPlugin_v8` table.
use super::abi::ncclNet_v8_t;

/// The table NCCL finds with `dlsym("ncclNetPlugin_v8")`.
#[repr(transparent)]
pub struct PluginTable(ncclNet_v8_t);

// SAFETY: the table is immutable after load; `name` points to a 'static C string.
unsafe impl Sync for PluginTable {}

/// `name` is final at load time: NCCL 2.28+ matches `NCCL_NET` against it before `init`.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v8: PluginTable = PluginTable(ncclNet_v8_t {
    name: c"verbsnet".as_ptr(),
    init: None,
    devices: None,
    getProperties: None,
    listen: None,
    connect: None,
    accept: None,
    regMr: None,
    regMrDmaBuf: None,
    deregMr: None,
    isend: None,
    irecv: None,
    iflush: None,
    test: None,
    closeSend: None,
    closeRecv: None,
    closeListen: None,
    getDeviceMr: None,
    irecvConsumed: None,
});
