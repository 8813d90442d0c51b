//! `ncclNetPlugin_v10` (NCCL 2.26–2.27): `init` takes the profiler callback, `connect` a
//! per-connection config (`trafficClass`), `isend`/`irecv` profiler handles; properties as v9
//! (net_v10.h).

use super::abi::{ncclNetProperties_v10_t, ncclNetVDeviceProps_v9_t, ncclNet_v10_t};
use super::boundary::Table;
use super::shim;

/// The v10 table.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v10: Table<ncclNet_v10_t> = Table::new(ncclNet_v10_t {
    name: shim::NAME.as_ptr(),
    init: Some(shim::init_prof::<10>),
    devices: Some(shim::devices),
    getProperties: Some(shim::get_properties::<ncclNetProperties_v10_t>),
    listen: Some(shim::listen),
    connect: Some(shim::connect_cfg),
    accept: Some(shim::accept),
    regMr: Some(shim::reg_mr::<usize>),
    regMrDmaBuf: None,
    deregMr: Some(shim::dereg_mr),
    isend: Some(shim::isend_p),
    irecv: Some(shim::irecv_p),
    iflush: Some(shim::iflush),
    test: Some(shim::test),
    closeSend: Some(shim::close_send),
    closeRecv: Some(shim::close_recv),
    closeListen: Some(shim::close_listen),
    getDeviceMr: None,
    irecvConsumed: None,
    makeVDevice: Some(shim::make_vdevice::<ncclNetVDeviceProps_v9_t>),
});
