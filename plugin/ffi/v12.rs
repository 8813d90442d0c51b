//! `ncclNetPlugin_v12` (NCCL 2.30+, probed first): the functions of v11; properties with an
//! 8-wide `vProps` and `railId`/`planeId` (-1: unknown), so their layout differs from v11
//! (net_v12.h).

use super::abi::{
    ncclNetDeviceType, ncclNetProperties_v12_t, ncclNetVDeviceProps_v12_t, ncclNet_v12_t,
};
use super::boundary::Table;
use super::shim::{self, FromProps, VProps};
use crate::api::Properties;
use std::ffi::c_int;

impl FromProps for ncclNetProperties_v12_t {
    fn from_props(p: &Properties) -> Self {
        let mut v = ncclNetVDeviceProps_v12_t {
            ndevs: p.vprops.1 as i32,
            ..Default::default()
        };
        v.devs.copy_from_slice(&p.vprops.0);
        ncclNetProperties_v12_t {
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
            vProps: v,
            maxP2pBytes: p.max_p2p_bytes as usize,
            maxCollBytes: p.max_coll_bytes as usize,
            maxMultiRequestSize: p.max_multi_request_size,
            railId: p.rail_id,
            planeId: p.plane_id,
        }
    }
}

impl VProps for ncclNetVDeviceProps_v12_t {
    fn ndevs(&self) -> c_int {
        self.ndevs
    }
    fn devs(&self) -> &[c_int] {
        &self.devs
    }
}

/// The v12 table.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v12: Table<ncclNet_v12_t> = Table::new(ncclNet_v12_t {
    name: shim::NAME.as_ptr(),
    init: Some(shim::init_ctx::<12>),
    devices: Some(shim::devices),
    getProperties: Some(shim::get_properties::<ncclNetProperties_v12_t>),
    listen: Some(shim::listen_ctx),
    connect: Some(shim::connect_ctx),
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
    makeVDevice: Some(shim::make_vdevice::<ncclNetVDeviceProps_v12_t>),
    finalize: Some(shim::finalize),
    setNetAttr: None,
});
