//! A read-only survey of every verbs device and port, for `verbsnet-perf doctor`.
//!
//! Where [`super::open_devices`] keeps only the ports the plugin will use, [`survey`] reports
//! all of them with the facts an operator checks by hand (`ibv_devinfo`, the GID table in
//! sysfs): port state, link layer, active MTU, speed, the device's queue limits, and the GID the
//! plugin would choose, or why it would skip the port. The decisions come from the same code as
//! `open_devices` (the `VERBSNET_IB_HCA` filter, `pick_gid`, [`super::gid::choose_roce_gid`]),
//! so the doctor cannot disagree with the plugin. Nothing is allocated on the devices (no PD, no
//! QP): the survey only opens each context, queries it and closes it.

use std::ffi::{c_char, CStr};
use std::io;
use std::path::{Path, PathBuf};

use rdma_sys::{ibv_device_attr, ibv_port_state};

use super::context::{
    query_port, query_port_speed, Context, PortAttr, LINK_LAYER_ETHERNET, LINK_LAYER_INFINIBAND,
    LINK_LAYER_UNSPECIFIED,
};
use super::convert;
use super::device::{gid_table, pick_gid, GidPick, SYSFS_IB};
use super::dl;
use super::filter::HcaFilter;
use super::gid::{self, GidEntry};
use crate::config::Config;
use crate::transport::TransportError;

/// One verbs device as seen by the survey.
#[derive(Clone, Debug)]
pub struct DeviceSurvey {
    /// Device name, e.g. `rxe0` or `mlx5_0`.
    pub name: String,
    /// Why the device could not be examined (`ibv_open_device` or `ibv_query_device` failed);
    /// `None` when it was.
    pub error: Option<String>,
    /// Its limits (absent when `error` is set).
    pub limits: Option<DeviceLimits>,
    /// Every physical port.
    pub ports: Vec<PortSurvey>,
}

/// The `ibv_query_device` limits that bound verbsnet's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Most WRs per send or receive queue.
    pub max_qp_wr: u32,
    /// Most entries per CQ.
    pub max_cqe: u32,
    /// Most SGEs per WR.
    pub max_sge: u32,
    /// Most QPs.
    pub max_qp: u32,
    /// Most MRs.
    pub max_mr: u32,
    /// Largest MR in bytes.
    pub max_mr_size: u64,
}

/// One port as seen by the survey.
#[derive(Clone, Debug)]
pub struct PortSurvey {
    /// Port number (1-based).
    pub port: u8,
    /// `<dev>:<port>`, as the plugin's log lines name the port (its `getProperties` name is
    /// the device's, `<dev>`, as NCCL IB's).
    pub label: String,
    /// `ibv_query_port` failed: why (then the other facts are zero).
    pub error: Option<String>,
    /// `ACTIVE`, `DOWN`, `INIT`, `ARMED`, ... (verbs' `ibv_port_state`).
    pub state: &'static str,
    /// `InfiniBand`, `Ethernet` (RoCE) or `unknown (<code>)`.
    pub link_layer: String,
    /// Active MTU in bytes (`None`: unknown code).
    pub active_mtu: Option<u32>,
    /// Largest MTU of the port in bytes.
    pub max_mtu: Option<u32>,
    /// Speed in Mbps as the plugin reports it (`ibv_query_port_speed`, else the speed code,
    /// `active_speed_ex` included, × width: [`convert::port_speed_mbps`]); `None` when neither
    /// the query answered nor both codes are known ones (the plugin then reports NCCL IB's
    /// fallback, the table's last entries).
    pub speed_mbps: Option<u32>,
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Entries of the GID table.
    pub gid_tbl_len: u32,
    /// The non-empty entries of the GID table (RoCE ports only), each with why it would not be
    /// chosen (`None` for the automatic choice when no index is forced; with a forced index the
    /// automatic choice is named as such).
    pub gids: Vec<(GidEntry, Option<String>)>,
    /// The GID the plugin would use, or why the port is skipped for want of one.
    pub gid: Result<SurveyGid, String>,
    /// `Ok` when the plugin would use this port; else the first reason it would not.
    pub usable: Result<(), String>,
    /// sysfs directory of the port, e.g. `/sys/class/infiniband/rxe0/ports/1`.
    pub sysfs: PathBuf,
}

/// The GID a port would use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SurveyGid {
    /// Its index (`sgid_index`).
    pub index: u8,
    /// The GID, e.g. `::ffff:192.0.2.1`.
    pub addr: std::net::Ipv6Addr,
    /// `RoceV2`, `RoceV1` or `Unknown` (from sysfs; InfiniBand ports: `Unknown`).
    pub kind: gid::GidKind,
    /// Why it was chosen.
    pub why: String,
    /// A warning about a forced choice that may not route.
    pub caveat: Option<String>,
}

/// Surveys every verbs device with the configuration `cfg` (its `VERBSNET_IB_HCA` and
/// `VERBSNET_IB_GID_INDEX`). No verbs devices is `Ok(vec![])`.
///
/// # Errors
/// [`TransportError::Unavailable`] when `libibverbs.so.1` cannot be loaded (the message names
/// the packages), or when `VERBSNET_IB_HCA` is malformed.
pub fn survey(cfg: &Config) -> Result<Vec<DeviceSurvey>, TransportError> {
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
        return Ok(vec![]);
    }
    let mut out = Vec::new();
    for i in 0..usize::try_from(num).unwrap_or(0) {
        // SAFETY: list holds `num` valid device pointers (libibverbs contract).
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            continue;
        }
        // SAFETY: dev is a valid ibv_device; the name is a NUL-terminated string inside it.
        let name = unsafe { cstr((verbs.get_device_name)(dev)) };
        // SAFETY: dev is valid until ibv_free_device_list; the context outlives that.
        let ctx = unsafe { (verbs.open_device)(dev) };
        if ctx.is_null() {
            out.push(DeviceSurvey {
                error: Some(format!(
                    "ibv_open_device failed: {}",
                    io::Error::last_os_error()
                )),
                name,
                limits: None,
                ports: vec![],
            });
            continue;
        }
        let ctx = Context { verbs, ctx, name };
        out.push(survey_device(&ctx, &filter, cfg.ib_gid_index));
        // `ctx` closes here.
    }
    // SAFETY: list came from ibv_get_device_list; the contexts are closed already.
    unsafe { (verbs.free_device_list)(list) };
    Ok(out)
}

/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn survey_device(ctx: &Context, filter: &HcaFilter, forced: Option<u32>) -> DeviceSurvey {
    let verbs = ctx.verbs;
    // SAFETY: ibv_device_attr is plain data; all-zero is a valid value.
    let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: ctx is an open context and attr a valid out-pointer.
    let rc = unsafe { (verbs.query_device)(ctx.ctx, &mut attr) };
    if rc != 0 {
        return DeviceSurvey {
            name: ctx.name.clone(),
            error: Some(format!("ibv_query_device failed (rc {rc})")),
            limits: None,
            ports: vec![],
        };
    }
    let nonneg = |v: i32| u32::try_from(v).unwrap_or(0);
    let limits = DeviceLimits {
        max_qp_wr: nonneg(attr.max_qp_wr),
        max_cqe: nonneg(attr.max_cqe),
        max_sge: nonneg(attr.max_sge),
        max_qp: nonneg(attr.max_qp),
        max_mr: nonneg(attr.max_mr),
        max_mr_size: attr.max_mr_size,
    };
    let dev_dir = Path::new(SYSFS_IB).join(&ctx.name);
    let ports = (1..=attr.phys_port_cnt)
        .map(|port| survey_port(ctx, filter, forced, &dev_dir, port))
        .collect();
    DeviceSurvey {
        name: ctx.name.clone(),
        error: None,
        limits: Some(limits),
        ports,
    }
}

fn state_name(state: u32) -> &'static str {
    match state {
        ibv_port_state::IBV_PORT_NOP => "NOP",
        ibv_port_state::IBV_PORT_DOWN => "DOWN",
        ibv_port_state::IBV_PORT_INIT => "INIT",
        ibv_port_state::IBV_PORT_ARMED => "ARMED",
        ibv_port_state::IBV_PORT_ACTIVE => "ACTIVE",
        ibv_port_state::IBV_PORT_ACTIVE_DEFER => "ACTIVE_DEFER",
        _ => "unknown",
    }
}

fn survey_port(
    ctx: &Context,
    filter: &HcaFilter,
    forced: Option<u32>,
    dev_dir: &Path,
    port: u8,
) -> PortSurvey {
    let label = format!("{}:{port}", ctx.name);
    let sysfs = dev_dir.join("ports").join(port.to_string());
    let (rc, pa) = match query_port(ctx, port) {
        Ok(pa) => (0, pa),
        // SAFETY: PortAttr is plain data; all-zero is a valid value (the facts read as zero).
        Err(rc) => (rc, unsafe { std::mem::zeroed::<PortAttr>() }),
    };
    let pattr = &pa.attr;
    let code = convert::speed_code(pattr.active_speed, pa.active_speed_ex);
    let queried = if rc == 0 {
        query_port_speed(ctx, port)
    } else {
        None
    };
    let known = queried.is_some()
        || (convert::speed_code_known(code) && convert::width_code_known(pattr.active_width));
    let mut s = PortSurvey {
        port,
        label,
        error: None,
        state: state_name(pattr.state),
        link_layer: match pattr.link_layer {
            LINK_LAYER_ETHERNET => "Ethernet".to_owned(),
            LINK_LAYER_INFINIBAND | LINK_LAYER_UNSPECIFIED => "InfiniBand".to_owned(),
            other => format!("unknown ({other})"),
        },
        active_mtu: convert::mtu_bytes(pattr.active_mtu),
        max_mtu: convert::mtu_bytes(pattr.max_mtu),
        speed_mbps: known
            .then(|| convert::port_speed_mbps(queried, code, pattr.active_width).unsigned_abs()),
        lid: pattr.lid,
        gid_tbl_len: u32::try_from(pattr.gid_tbl_len).unwrap_or(0),
        gids: vec![],
        gid: Err("not examined".to_owned()),
        usable: Ok(()),
        sysfs,
    };
    if rc != 0 {
        s.error = Some(format!("ibv_query_port failed (rc {rc})"));
        s.usable = Err(format!("ibv_query_port failed (rc {rc})"));
        return s;
    }
    let link_layer = match pattr.link_layer {
        LINK_LAYER_ETHERNET => LINK_LAYER_ETHERNET,
        LINK_LAYER_INFINIBAND | LINK_LAYER_UNSPECIFIED => LINK_LAYER_INFINIBAND,
        _ => 0,
    };
    if link_layer == LINK_LAYER_ETHERNET {
        let table = gid_table(ctx, port, &s.sysfs, s.gid_tbl_len);
        let chosen = gid::choose_roce_gid(&table);
        s.gids = table
            .iter()
            .filter(|e| e.gid != [0; 16])
            .map(|e| {
                let why = match (gid::skip_reason(e), chosen) {
                    (Some(r), _) => Some(r.to_owned()),
                    (None, Some(c)) if c.entry.index == e.index && forced.is_some() => {
                        Some(format!(
                            "the automatic choice ({}), used when VERBSNET_IB_GID_INDEX is unset",
                            c.reason
                        ))
                    }
                    (None, Some(c)) if c.entry.index == e.index => None,
                    (None, Some(c)) => Some(format!(
                        "usable, but index {} ranks first ({})",
                        c.entry.index, c.reason
                    )),
                    (None, None) => Some("not chosen".to_owned()),
                };
                (*e, why)
            })
            .collect();
    }
    s.gid = pick_gid(ctx, port, &s.sysfs, link_layer, pattr, forced).map(|p: GidPick| SurveyGid {
        index: p.index,
        addr: std::net::Ipv6Addr::from(p.gid),
        kind: if link_layer == LINK_LAYER_ETHERNET {
            gid::read_gid_kind(&s.sysfs, u32::from(p.index))
        } else {
            gid::GidKind::Unknown
        },
        why: p.why,
        caveat: p.caveat,
    });
    s.usable = if !filter.selects(&ctx.name, port) {
        Err("excluded by VERBSNET_IB_HCA".to_owned())
    } else if pattr.state != ibv_port_state::IBV_PORT_ACTIVE {
        Err(format!(
            "port state {} (not ACTIVE): check the cable/link, `ibv_devinfo`, the subnet \
             manager (InfiniBand) or the netdev's link (RoCE)",
            s.state
        ))
    } else if link_layer == 0 {
        Err(format!("link layer {}", s.link_layer))
    } else if let Err(why) = &s.gid {
        Err(why.clone())
    } else {
        Ok(())
    };
    s
}
