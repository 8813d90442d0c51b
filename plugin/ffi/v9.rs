//! `ncclNetPlugin_v9` (NCCL 2.24–2.25): `size_t` sizes in `isend`/`irecv` (not in `test` or
//! `iflush`), properties with `forceFlush`, `vProps` and size limits, and a `makeVDevice`
//! slot, NULL here: NCCL then uses the physical devices as they are (net_v9.h, src/plugin/net.cc).

use super::abi::{
    ncclNetDeviceType, ncclNetProperties_v9_t, ncclNetVDeviceProps_v9_t, ncclNet_v9_t,
};
use super::boundary::Table;
use super::shim::{self, FromProps};
use crate::api::Properties;

/// `{1, [dev]}`: every device is its own virtual NIC.
pub(crate) fn vprops_v9(dev: i32) -> ncclNetVDeviceProps_v9_t {
    let mut v = ncclNetVDeviceProps_v9_t {
        ndevs: 1,
        ..Default::default()
    };
    v.devs[0] = dev;
    v
}

impl FromProps for ncclNetProperties_v9_t {
    fn from_props(p: &Properties) -> Self {
        ncclNetProperties_v9_t {
            name: p.name as *mut _,
            pciPath: p.pci_path as *mut _,
            guid: p.guid,
            ptrSupport: p.ptr_support,
            regIsGlobal: p.reg_is_global,
            forceFlush: p.force_flush,
            speed: p.speed,
            port: p.port,
            latency: p.latency,
            maxComms: p.max_comms,
            maxRecvs: p.max_recvs,
            netDeviceType: ncclNetDeviceType::NCCL_NET_DEVICE_HOST,
            netDeviceVersion: 0,
            vProps: vprops_v9(p.dev),
            maxP2pBytes: p.max_p2p_bytes as usize,
            maxCollBytes: p.max_coll_bytes as usize,
        }
    }
}

/// The v9 table.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v9: Table<ncclNet_v9_t> = Table::new(ncclNet_v9_t {
    name: shim::NAME.as_ptr(),
    init: Some(shim::init::<9>),
    devices: Some(shim::devices),
    getProperties: Some(shim::get_properties::<ncclNetProperties_v9_t>),
    listen: Some(shim::listen),
    connect: Some(shim::connect),
    accept: Some(shim::accept),
    regMr: Some(shim::reg_mr::<usize>),
    regMrDmaBuf: None,
    deregMr: Some(shim::dereg_mr),
    isend: Some(shim::isend::<usize>),
    irecv: Some(shim::irecv::<usize>),
    iflush: Some(shim::iflush),
    test: Some(shim::test),
    closeSend: Some(shim::close_send),
    closeRecv: Some(shim::close_recv),
    closeListen: Some(shim::close_listen),
    getDeviceMr: None,
    irecvConsumed: None,
    makeVDevice: None,
});
