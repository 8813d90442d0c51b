//! `ncclNetPlugin_v8` (NCCL 2.20–2.23 natively): v7 plus `regIsGlobal` in the properties and a
//! `size_t` size in `regMr`; the data path keeps `int` sizes (net_v8.h).

use std::ffi::c_int;

use super::abi::{ncclNetDeviceType, ncclNetProperties_v8_t, ncclNet_v8_t};
use super::boundary::Table;
use super::shim::{self, FromProps};
use crate::api::Properties;

impl FromProps for ncclNetProperties_v8_t {
    fn from_props(p: &Properties) -> Self {
        ncclNetProperties_v8_t {
            name: p.name as *mut _,
            pciPath: p.pci_path as *mut _,
            guid: p.guid,
            ptrSupport: p.ptr_support,
            regIsGlobal: p.reg_is_global,
            speed: p.speed,
            port: p.port,
            latency: p.latency,
            maxComms: p.max_comms,
            maxRecvs: p.max_recvs,
            netDeviceType: ncclNetDeviceType::NCCL_NET_DEVICE_HOST,
            netDeviceVersion: 0,
        }
    }
}

/// The v8 table.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v8: Table<ncclNet_v8_t> = Table::new(ncclNet_v8_t {
    name: shim::NAME.as_ptr(),
    init: Some(shim::init::<8>),
    devices: Some(shim::devices),
    getProperties: Some(shim::get_properties::<ncclNetProperties_v8_t>),
    listen: Some(shim::listen),
    connect: Some(shim::connect),
    accept: Some(shim::accept),
    regMr: Some(shim::reg_mr::<usize>),
    regMrDmaBuf: None,
    deregMr: Some(shim::dereg_mr),
    isend: Some(shim::isend::<c_int>),
    irecv: Some(shim::irecv::<c_int>),
    iflush: Some(shim::iflush),
    test: Some(shim::test),
    closeSend: Some(shim::close_send),
    closeRecv: Some(shim::close_recv),
    closeListen: Some(shim::close_listen),
    getDeviceMr: None,
    irecvConsumed: None,
});
