//! `ncclNetPlugin_v9` (NCCL 2.24–2.25): `size_t` sizes in `isend`/`irecv` (not in `test` or
//! `iflush`), properties with `forceFlush`, `vProps` and size limits, and `makeVDevice` (NIC
//! fusion: a virtual device over up to 4 physical ones, `api::make_vdevice`; net_v9.h,
//! src/graph/topo.cc).

use super::abi::{
    ncclNetDeviceType, ncclNetProperties_v9_t, ncclNetVDeviceProps_v9_t, ncclNet_v9_t,
};
use super::boundary::Table;
use super::shim::{self, FromProps, VProps};
use crate::api::Properties;
use std::ffi::c_int;

/// The physical devices behind a device: `{1, [dev]}` for a physical one (every device is its
/// own virtual NIC, as NCCL IB reports), its devices for a virtual one (at most 4 fit: a
/// virtual device made through v12 with more reports its first 4).
pub(crate) fn vprops_v9(p: &Properties) -> ncclNetVDeviceProps_v9_t {
    let mut v = ncclNetVDeviceProps_v9_t::default();
    let n = p.vprops.1.min(v.devs.len());
    v.ndevs = n as i32;
    v.devs[..n].copy_from_slice(&p.vprops.0[..n]);
    v
}

impl VProps for ncclNetVDeviceProps_v9_t {
    fn ndevs(&self) -> c_int {
        self.ndevs
    }
    fn devs(&self) -> &[c_int] {
        &self.devs
    }
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
            vProps: vprops_v9(p),
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
    makeVDevice: Some(shim::make_vdevice::<ncclNetVDeviceProps_v9_t>),
});
