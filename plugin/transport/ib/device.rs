//! Verbs devices: memory regions, QP creation, and discovery of usable ports (the context,
//! protection domain and port facts they share with the QPs live in [`super::context`]).

use std::ffi::CStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rdma_sys::{ibv_access_flags, ibv_device_attr, ibv_gid, ibv_mr, ibv_port_attr, ibv_port_state};
use tracing::{debug, info, warn};

use super::context::{
    query_port, query_port_speed, Context, PortInfo, ProtectionDomain, LINK_LAYER_ETHERNET,
    LINK_LAYER_INFINIBAND, LINK_LAYER_UNSPECIFIED,
};
use super::convert;
use super::dl;
use super::filter::HcaFilter;
use super::gid::{self, GidKind};
use super::props;
use super::qp::IbQueuePair;
use crate::mem::Region;
use crate::transport::{
    Device, DeviceProps, DeviceRnrCounters, MemoryRegion, MrKeys, QpConfig, QueuePair,
    TransportError,
};

/// Where the kernel describes verbs devices.
pub(crate) const SYSFS_IB: &str = "/sys/class/infiniband";

/// One active port of a verbs device, as a [`Device`].
pub struct IbDevice {
    pd: Arc<ProtectionDomain>,
    port: Arc<PortInfo>,
    props: DeviceProps,
    counters_dir: PathBuf,
}

impl IbDevice {
    /// The GID index in use.
    pub fn gid_index(&self) -> u8 {
        self.port.gid_index
    }

    /// The GID in use (network byte order).
    pub fn gid(&self) -> [u8; 16] {
        self.port.gid
    }

    /// True for RoCE (Ethernet link layer), false for InfiniBand.
    pub fn is_roce(&self) -> bool {
        self.port.link_layer == LINK_LAYER_ETHERNET
    }

    /// Active MTU in bytes.
    pub fn active_mtu_bytes(&self) -> u32 {
        convert::mtu_bytes(self.port.active_mtu).unwrap_or(0)
    }
}

impl Device for IbDevice {
    fn props(&self) -> DeviceProps {
        self.props.clone()
    }

    fn link_layer(&self) -> &'static str {
        if self.is_roce() {
            "Ethernet"
        } else {
            "InfiniBand"
        }
    }

    fn reg_mr(&self, region: Region) -> crate::transport::Result<Arc<dyn MemoryRegion>> {
        let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ;
        let verbs = self.pd.ctx.verbs;
        // SAFETY: the PD is alive (we hold it); [addr, addr+len) is valid memory for as long as
        // `region` lives (Region's contract), and the returned MR keeps `region` alive, so the
        // pinned range stays allocated until ibv_dereg_mr.
        let mr = unsafe {
            (verbs.reg_mr)(
                self.pd.pd,
                region.addr() as *mut std::os::raw::c_void,
                region.len(),
                access.0 as i32,
            )
        };
        if mr.is_null() {
            let source = io::Error::last_os_error();
            return Err(TransportError::Io {
                op: format!(
                    "ibv_reg_mr({:#x}, {} bytes) on {}",
                    region.addr(),
                    region.len(),
                    self.port.label()
                ),
                source,
            });
        }
        // SAFETY: mr is a valid ibv_mr just returned by ibv_reg_mr.
        let keys = unsafe {
            MrKeys {
                lkey: (*mr).lkey,
                rkey: (*mr).rkey,
            }
        };
        debug!(dev = %self.port.label(), addr = region.addr(), len = region.len(), lkey = keys.lkey, rkey = keys.rkey, "registered MR");
        Ok(Arc::new(IbMemoryRegion {
            pd: self.pd.clone(),
            mr,
            keys,
            _region: region,
        }))
    }

    fn create_qp(&self, cfg: &QpConfig) -> crate::transport::Result<Box<dyn QueuePair>> {
        Ok(Box::new(IbQueuePair::create(
            self.pd.clone(),
            self.port.clone(),
            cfg,
        )?))
    }

    fn max_qps(&self) -> Option<u32> {
        Some(self.port.max_qp.min(self.port.max_cq))
    }

    fn rnr_counters(&self) -> DeviceRnrCounters {
        read_rnr_counters(&self.counters_dir)
    }
}

/// A registered memory region; deregistered on drop.
pub struct IbMemoryRegion {
    pd: Arc<ProtectionDomain>,
    mr: *mut ibv_mr,
    keys: MrKeys,
    _region: Region,
}

// SAFETY: the MR handle is only passed to ibv_dereg_mr (once, in Drop); keys are plain data.
unsafe impl Send for IbMemoryRegion {}
// SAFETY: as above; &self exposes only the keys.
unsafe impl Sync for IbMemoryRegion {}

impl MemoryRegion for IbMemoryRegion {
    fn keys(&self) -> MrKeys {
        self.keys
    }
}

impl Drop for IbMemoryRegion {
    fn drop(&mut self) {
        // SAFETY: mr came from ibv_reg_mr on self.pd, which is still alive, and is deregistered
        // exactly once here.
        let rc = unsafe { (self.pd.ctx.verbs.dereg_mr)(self.mr) };
        if rc != 0 {
            warn!(dev = %self.pd.ctx.name, rc, lkey = self.keys.lkey, "ibv_dereg_mr failed");
        }
    }
}

/// Reads `rcvd_rnr_err`, `send_rnr_err` and `retry_rnr_exceeded_err` from a `hw_counters`
/// directory.
pub(crate) fn read_rnr_counters(dir: &Path) -> DeviceRnrCounters {
    let read = |name: &str| -> Option<u64> {
        fs::read_to_string(dir.join(name))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    };
    DeviceRnrCounters {
        rcvd_rnr_err: read("rcvd_rnr_err"),
        send_rnr_err: read("send_rnr_err"),
        retry_rnr_exceeded_err: read("retry_rnr_exceeded_err"),
    }
}

/// Opens every verbs device, and returns one [`Device`] per ACTIVE port (link layer InfiniBand
/// or Ethernet) that `cfg.ib_hca` selects and that has a usable GID, in NCCL IB's order and
/// with the properties NCCL IB would report for it ([`props::nccl_properties`]). No device,
/// or no `libibverbs` devices at all (e.g. no RDMA in the kernel), is `Ok(vec![])`.
///
/// # Errors
/// [`TransportError::Unavailable`] when `libibverbs.so.1` cannot be loaded (the message names
/// the packages to install), or when `cfg.ib_hca` is malformed.
pub fn open_devices(cfg: &crate::config::Config) -> Result<Vec<Arc<dyn Device>>, TransportError> {
    let filter = match cfg.ib_hca.as_deref() {
        Some(spec) => HcaFilter::parse(spec).map_err(|e| {
            TransportError::Unavailable(format!("VERBSNET_IB_HCA={spec:?} is not valid: {e}"))
        })?,
        None => HcaFilter::default(),
    };
    let verbs = dl::verbs()?;
    let mut num = 0;
    // SAFETY: num is a valid out-pointer; the list is freed below with ibv_free_device_list.
    let list = unsafe { (verbs.get_device_list)(&mut num) };
    if list.is_null() {
        let e = io::Error::last_os_error();
        info!("no verbs devices: ibv_get_device_list: {e}");
        return Ok(vec![]);
    }
    let mut opened: Vec<OpenPort> = Vec::new();
    for i in 0..usize::try_from(num).unwrap_or(0) {
        // SAFETY: list holds `num` valid device pointers (libibverbs contract).
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            continue;
        }
        // SAFETY: dev is a valid ibv_device; the name is a NUL-terminated string inside it.
        let name = unsafe { CStr::from_ptr((verbs.get_device_name)(dev)) }
            .to_string_lossy()
            .into_owned();
        if !filter.may_select(&name) {
            debug!(dev = %name, "excluded by VERBSNET_IB_HCA");
            continue;
        }
        // SAFETY: dev is valid until ibv_free_device_list; an opened context stays valid after.
        let ctx = unsafe { (verbs.open_device)(dev) };
        if ctx.is_null() {
            warn!(dev = %name, "ibv_open_device failed: {}", io::Error::last_os_error());
            continue;
        }
        let ctx = Arc::new(Context { verbs, ctx, name });
        opened.extend(open_ports(&ctx, &filter, cfg.ib_gid_index));
    }
    // SAFETY: list came from ibv_get_device_list; the opened contexts do not borrow it.
    unsafe { (verbs.free_device_list)(list) };
    if opened.is_empty() {
        info!(filter = ?cfg.ib_hca, "no usable verbs port");
        return Ok(vec![]);
    }
    let facts: Vec<props::PortFacts> = opened.iter().map(|o| o.facts.clone()).collect();
    let mut opened: Vec<Option<OpenPort>> = opened.into_iter().map(Some).collect();
    let mut out: Vec<Arc<dyn Device>> = Vec::new();
    let mut line = Vec::new();
    for (i, props) in props::nccl_properties(&facts) {
        let Some(o) = opened[i].take() else { continue };
        line.push(format!(
            "[{}]{} (port {}, NCCL port {}, guid {:#018x}, {} Mbps, pciPath {})",
            out.len(),
            o.port.label(),
            o.port.port,
            props.port,
            props.guid,
            props.speed_mbps,
            props.pci_path.as_deref().unwrap_or("none")
        ));
        out.push(Arc::new(IbDevice {
            pd: o.pd,
            port: Arc::new(o.port),
            props,
            counters_dir: o.counters_dir,
        }));
    }
    info!("verbs ports in use, in NCCL IB's order: {}", line.join(" "));
    Ok(out)
}

/// One usable port of an opened device, before the list's NCCL properties are known.
struct OpenPort {
    pd: Arc<ProtectionDomain>,
    port: PortInfo,
    counters_dir: PathBuf,
    facts: props::PortFacts,
}

/// The usable ports of one opened device.
fn open_ports(ctx: &Arc<Context>, filter: &HcaFilter, forced_gid: Option<u32>) -> Vec<OpenPort> {
    let verbs = ctx.verbs;
    // SAFETY: ibv_device_attr is plain data; all-zero is a valid value.
    let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: ctx is an open context and attr a valid out-pointer.
    let rc = unsafe { (verbs.query_device)(ctx.ctx, &mut attr) };
    if rc != 0 {
        warn!(dev = %ctx.name, rc, "ibv_query_device failed; skipping the device");
        return vec![];
    }
    let dev_dir = Path::new(SYSFS_IB).join(&ctx.name);
    let full_pci_path = props::pci_path(Path::new(SYSFS_IB), &ctx.name);
    let mut pd: Option<Arc<ProtectionDomain>> = None;
    let mut out: Vec<OpenPort> = Vec::new();
    for port in 1..=attr.phys_port_cnt {
        if !filter.selects(&ctx.name, port) {
            debug!(dev = %ctx.name, port, "excluded by VERBSNET_IB_HCA");
            continue;
        }
        let pa = match query_port(ctx, port) {
            Ok(pa) => pa,
            Err(rc) => {
                warn!(dev = %ctx.name, port, rc, "ibv_query_port failed; skipping the port");
                continue;
            }
        };
        let pattr = &pa.attr;
        if pattr.state != ibv_port_state::IBV_PORT_ACTIVE {
            info!(dev = %ctx.name, port, state = pattr.state, "port not ACTIVE; skipped");
            continue;
        }
        let link_layer = match pattr.link_layer {
            LINK_LAYER_ETHERNET => LINK_LAYER_ETHERNET,
            LINK_LAYER_INFINIBAND | LINK_LAYER_UNSPECIFIED => LINK_LAYER_INFINIBAND,
            other => {
                info!(dev = %ctx.name, port, link_layer = other, "unknown link layer; skipped");
                continue;
            }
        };
        let port_dir = dev_dir.join("ports").join(port.to_string());
        let (gid_index, gid) = match pick_gid(ctx, port, &port_dir, link_layer, pattr, forced_gid) {
            Ok(pick) => {
                if let Some(caveat) = &pick.caveat {
                    warn!(dev = %format!("{}:{port}", ctx.name), index = pick.index, "{caveat}");
                }
                info!(
                    dev = %format!("{}:{port}", ctx.name),
                    gid_index = pick.index,
                    gid = %std::net::Ipv6Addr::from(pick.gid),
                    "GID chosen: {}",
                    pick.why
                );
                (pick.index, pick.gid)
            }
            Err(why) => {
                warn!(dev = %format!("{}:{port}", ctx.name), "{why}");
                continue;
            }
        };
        let pd = match &pd {
            Some(pd) => pd.clone(),
            None => {
                // SAFETY: ctx is an open context.
                let raw = unsafe { (verbs.alloc_pd)(ctx.ctx) };
                if raw.is_null() {
                    warn!(dev = %ctx.name, "ibv_alloc_pd failed: {}", io::Error::last_os_error());
                    return out;
                }
                let p = Arc::new(ProtectionDomain {
                    ctx: ctx.clone(),
                    pd: raw,
                });
                pd = Some(p.clone());
                p
            }
        };
        let info = PortInfo {
            dev: ctx.name.clone(),
            port,
            link_layer,
            gid_index,
            gid,
            lid: pattr.lid,
            active_mtu: pattr.active_mtu,
            max_cqe: attr.max_cqe.max(1) as u32,
            max_qp_wr: attr.max_qp_wr.max(1) as u32,
            max_sge: attr.max_sge.max(0) as u32,
            max_qp: attr.max_qp.max(1) as u32,
            max_cq: attr.max_cq.max(1) as u32,
        };
        let code = convert::speed_code(pattr.active_speed, pa.active_speed_ex);
        let queried = query_port_speed(ctx, port);
        if queried.is_none()
            && !(convert::speed_code_known(code) && convert::width_code_known(pattr.active_width))
        {
            debug!(dev = %ctx.name, port, speed = code, width = pattr.active_width, "unknown port speed or width code; reported by NCCL IB's rule");
        }
        let speed_mbps = convert::port_speed_mbps(queried, code, pattr.active_width);
        info!(
            dev = %info.label(),
            link_layer = if link_layer == LINK_LAYER_ETHERNET { "RoCE" } else { "IB" },
            mtu = convert::mtu_bytes(info.active_mtu).unwrap_or(0),
            speed_mbps,
            gid_index,
            lid = info.lid,
            "verbs port usable"
        );
        out.push(OpenPort {
            pd,
            counters_dir: port_dir.join("hw_counters"),
            facts: props::PortFacts {
                dev: ctx.name.clone(),
                port,
                // As NCCL IB (`net_ib/init.cc`): the NIC chip's GUID, as the struct holds it.
                sys_image_guid: attr.sys_image_guid,
                speed_mbps,
                full_pci_path: full_pci_path.clone(),
                max_qp: attr.max_qp,
            },
            port: info,
        });
    }
    out
}

/// The GID a port uses, as [`pick_gid`] decides it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GidPick {
    /// The `sgid_index`.
    pub(crate) index: u8,
    /// The GID (network order).
    pub(crate) gid: [u8; 16],
    /// Why this one, e.g. "first RoCE v2 GID with an IPv4-mapped address".
    pub(crate) why: String,
    /// A warning about a forced choice (link-local or RoCE v1: it may not route).
    pub(crate) caveat: Option<String>,
}

/// The GID index and GID for a port: forced by `VERBSNET_IB_GID_INDEX`, else index 0 on
/// InfiniBand and the automatic RoCE choice (see [`gid`]) on Ethernet. `Err` (the reason, with
/// the fix) skips the port. `open_ports` and the doctor's survey both decide through here.
pub(crate) fn pick_gid(
    ctx: &Context,
    port: u8,
    port_dir: &Path,
    link_layer: u8,
    pattr: &ibv_port_attr,
    forced: Option<u32>,
) -> Result<GidPick, String> {
    let table_len = u32::try_from(pattr.gid_tbl_len).unwrap_or(0);
    let (index, why) = match (forced, link_layer) {
        (Some(i), _) => (i, "forced by VERBSNET_IB_GID_INDEX".to_owned()),
        (None, LINK_LAYER_INFINIBAND) => (0, "InfiniBand port: GID 0 (routing by LID)".to_owned()),
        (None, _) => {
            let table = gid_table(ctx, port, port_dir, table_len);
            match gid::choose_roce_gid(&table) {
                Some(c) => (c.entry.index, c.reason.to_string()),
                None => {
                    return Err(
                        "no usable RoCE GID (need a RoCE v2 GID with an IPv4 or global \
                                IPv6 address; link-local ones are never chosen automatically): \
                                port skipped; give the netdev an IP address or set \
                                VERBSNET_IB_GID_INDEX"
                            .to_owned(),
                    );
                }
            }
        }
    };
    if index >= table_len.max(1) || index > u32::from(u8::MAX) {
        return Err(format!(
            "GID index {index} is outside the port's GID table (length {table_len}): port \
             skipped; set VERBSNET_IB_GID_INDEX below {} or unset it",
            table_len.clamp(1, 256)
        ));
    }
    let Some(g) = query_gid(ctx, port, index) else {
        return Err(format!("ibv_query_gid(index {index}) failed: port skipped"));
    };
    if g == [0; 16] {
        return Err(format!(
            "GID {index} is empty (no address behind it): port skipped; unset \
             VERBSNET_IB_GID_INDEX for the automatic choice"
        ));
    }
    let mut caveat = None;
    if link_layer == LINK_LAYER_ETHERNET && forced.is_some() {
        let kind = gid::read_gid_kind(port_dir, index);
        if gid::is_link_local(&g) {
            caveat = Some(format!(
                "the forced GID {index} is IPv6 link-local (fe80::/10); it may not route"
            ));
        } else if kind == GidKind::RoceV1 {
            caveat = Some(format!(
                "the forced GID {index} is RoCE v1; it may not route"
            ));
        }
    }
    Ok(GidPick {
        index: index as u8,
        gid: g,
        why,
        caveat,
    })
}

/// The port's GID table from sysfs or, where sysfs has none (some containers), from the device
/// (types then unknown).
pub(crate) fn gid_table(
    ctx: &Context,
    port: u8,
    port_dir: &Path,
    table_len: u32,
) -> Vec<gid::GidEntry> {
    let table = gid::read_gid_table(port_dir, table_len);
    if !table.is_empty() {
        return table;
    }
    (0..table_len)
        .filter_map(|i| {
            query_gid(ctx, port, i).map(|g| gid::GidEntry {
                index: i,
                gid: g,
                kind: GidKind::Unknown,
            })
        })
        .collect()
}

pub(crate) fn query_gid(ctx: &Context, port: u8, index: u32) -> Option<[u8; 16]> {
    // SAFETY: ibv_gid is plain data (a 16-byte union); all-zero is valid.
    let mut g: ibv_gid = unsafe { std::mem::zeroed() };
    // SAFETY: ctx is open; g is a valid out-pointer; index is non-negative and small.
    let rc = unsafe { (ctx.verbs.query_gid)(ctx.ctx, port, index as i32, &mut g) };
    // SAFETY: the union is 16 bytes of plain data; every bit pattern is a valid [u8; 16].
    let raw = unsafe { g.raw };
    (rc == 0).then_some(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rnr_counters_from_a_fake_hw_counters_dir() {
        let dir = std::env::temp_dir().join(format!("verbsnet-hwc-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("rcvd_rnr_err"), "3\n").unwrap();
        fs::write(dir.join("send_rnr_err"), "5\n").unwrap();
        let c = read_rnr_counters(&dir);
        assert_eq!(c.rcvd_rnr_err, Some(3));
        assert_eq!(c.send_rnr_err, Some(5));
        assert_eq!(c.retry_rnr_exceeded_err, None);
        fs::remove_dir_all(&dir).unwrap();
    }
}
