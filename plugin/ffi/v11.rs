//! `ncclNetPlugin_v11` (NCCL 2.28–2.29): `init(ctx, commId, config, …)` once per communicator,
//! `listen`/`connect` with that context, `finalize(ctx)`; `setNetAttr` NULL (optional);
//! properties gain `maxMultiRequestSize` (net_v11.h).

use super::abi::{
    ncclNetDeviceType, ncclNetProperties_v11_t, ncclNetVDeviceProps_v9_t, ncclNet_v11_t,
};
use super::boundary::Table;
use super::shim::{self, FromProps};
use super::v9::vprops_v9;
use crate::api::Properties;

impl FromProps for ncclNetProperties_v11_t {
    fn from_props(p: &Properties) -> Self {
        ncclNetProperties_v11_t {
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
            maxMultiRequestSize: p.max_multi_request_size,
        }
    }
}

/// The v11 table.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v11: Table<ncclNet_v11_t> = Table::new(ncclNet_v11_t {
    name: shim::NAME.as_ptr(),
    init: Some(shim::init_ctx::<11>),
    devices: Some(shim::devices),
    getProperties: Some(shim::get_properties::<ncclNetProperties_v11_t>),
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
    makeVDevice: Some(shim::make_vdevice::<ncclNetVDeviceProps_v9_t>),
    finalize: Some(shim::finalize),
    setNetAttr: None,
});
