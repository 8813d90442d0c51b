//! `ncclNetPlugin_v7` (NCCL 2.19): 19 members; properties without `regIsGlobal`; `int` sizes
//! on the data path and in `regMr` (net_v7.h).

use std::ffi::c_int;

use super::abi::{ncclNetDeviceType, ncclNetProperties_v7_t, ncclNet_v7_t};
use super::boundary::Table;
use super::shim::{self, FromProps};
use crate::api::Properties;

impl FromProps for ncclNetProperties_v7_t {
    fn from_props(p: &Properties) -> Self {
        ncclNetProperties_v7_t {
            name: p.name as *mut _,
            pciPath: p.pci_path as *mut _,
            guid: p.guid,
            ptrSupport: p.ptr_support,
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

/// The v7 table NCCL 2.19 finds with `dlsym`.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v7: Table<ncclNet_v7_t> = Table::new(ncclNet_v7_t {
    name: shim::NAME.as_ptr(),
    init: Some(shim::init::<7>),
    devices: Some(shim::devices),
    getProperties: Some(shim::get_properties::<ncclNetProperties_v7_t>),
    listen: Some(shim::listen),
    connect: Some(shim::connect),
    accept: Some(shim::accept),
    regMr: Some(shim::reg_mr::<c_int>),
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
