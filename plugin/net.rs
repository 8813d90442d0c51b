//! Plugin-wide state made by `init`: configuration, the chosen transport, its devices, and the
//! address the out-of-band listeners use.

use std::ffi::CString;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tracing::{info, warn};

use crate::config::{Config, TransportChoice};
use crate::error::{Class, Failure};
use crate::transport::{self, Device, DeviceProps, Kind};

/// What `init` was doing when it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Parsing the `VERBSNET_*` configuration.
    Config,
    /// Opening the transport's devices.
    Devices,
    /// Checking what one comm pins against the cap and `RLIMIT_MEMLOCK`.
    Limits,
    /// Choosing the out-of-band listen address.
    ListenAddr,
    /// Looking up a device by index (`dev` of `getProperties`, `listen`, `connect`).
    Device,
    /// `makeVDevice`: making a virtual device over physical ones.
    MakeVDevice,
}

/// An error of opening the plugin (or of a device lookup).
pub type Error = Failure<Op>;

/// One device with the C strings `getProperties` hands out (valid for the plugin's lifetime).
pub struct DevEntry {
    /// The device.
    pub dev: Arc<dyn Device>,
    /// Its properties.
    pub props: DeviceProps,
    /// `props.name` as a C string.
    pub name_c: CString,
    /// `props.pci_path` as a C string.
    pub pci_c: Option<CString>,
}

/// The initialized plugin.
pub struct Net {
    /// Effective configuration.
    pub cfg: Config,
    /// Chosen transport.
    pub kind: Kind,
    /// Devices of that transport.
    pub devs: Vec<DevEntry>,
    /// Address for out-of-band listeners.
    pub listen_ip: IpAddr,
}

/// Opens the plugin: parses the configuration, picks the transport and opens its devices.
/// [`crate::api`] calls it when the first context is made and keeps the result, shared and
/// reference-counted, until the last context is finalized.
pub fn open_net(logger: crate::log::Logger) -> Result<Net, Error> {
    let cfg = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            // The shim's guard logs the error as one WARN once the logger is set up.
            crate::log::init(logger, crate::config::DebugLevel::Warn);
            return Err(Error::wrap(Op::Config, Class::Usage, e));
        }
    };
    crate::log::init(logger, cfg.debug);
    let unknown = crate::config::unknown_vars(std::env::vars());
    for v in unknown {
        match crate::config::suggest(&v) {
            Some(s) => warn!("ignoring unknown variable {v} (did you mean {s}?)"),
            None => warn!("ignoring unknown variable {v}"),
        }
    }
    info!(target: "verbsnet::init", "verbsnet {} configuration: {}", env!("CARGO_PKG_VERSION"), cfg.describe());
    let set = Config::set_by(|k| std::env::var(k).ok());
    info!(
        target: "verbsnet::init",
        "configuration from the environment: {}; every other knob has its default",
        if set.is_empty() { "none".to_string() } else { set.join(" ") }
    );

    let (kind, devs) = open(&cfg)?;
    // Resource limits: what one comm will pin, against the cap and RLIMIT_MEMLOCK.
    crate::limits::check(&cfg, kind).map_err(|e| e.lift(Op::Limits))?;
    let (listen_ip, listen_why) = listen_ip(&cfg)?;
    let mut entries = Vec::new();
    for dev in devs {
        let props = dev.props();
        let name_c = CString::new(props.name.replace('\0', "?")).unwrap_or_default();
        let pci_c = props
            .pci_path
            .as_ref()
            .and_then(|p| CString::new(p.as_str()).ok());
        entries.push(DevEntry {
            dev,
            props,
            name_c,
            pci_c,
        });
    }
    let names: Vec<String> = entries
        .iter()
        .enumerate()
        .map(|(i, d)| format!("[{i}]{} ({} Mbps)", d.props.name, d.props.speed_mbps))
        .collect();
    info!(
        target: "verbsnet::init",
        "using transport {}: {}; out-of-band address {listen_why}",
        kind.as_str(),
        names.join(" ")
    );
    Ok(Net {
        cfg,
        kind,
        devs: entries,
        listen_ip,
    })
}

fn open(cfg: &Config) -> Result<(Kind, Vec<Arc<dyn Device>>), Error> {
    let tcp = || (Kind::Tcp, transport::tcp::open_devices(cfg));
    match cfg.transport {
        TransportChoice::Tcp => Ok(tcp()),
        TransportChoice::Ib => match transport::ib::open_devices(cfg) {
            Ok(d) if !d.is_empty() => Ok((Kind::Ib, d)),
            Ok(_) => Err(Error::new(
                Op::Devices,
                Class::System,
                format!(
                "VERBSNET_TRANSPORT=ib but no active verbs port matches{}: check `ibv_devinfo`, \
                 VERBSNET_IB_HCA, or use VERBSNET_TRANSPORT=tcp",
                cfg.ib_hca.as_deref().map(|h| format!(" VERBSNET_IB_HCA={h}")).unwrap_or_default()
            ),
            )),
            Err(e) => Err(Error::new(
                Op::Devices,
                Class::System,
                "VERBSNET_TRANSPORT=ib but verbs are unusable",
            )
            .because(e)),
        },
        TransportChoice::Auto => match transport::ib::open_devices(cfg) {
            Ok(d) if !d.is_empty() => {
                info!(target: "verbsnet::init", "transport auto: found {} active verbs port(s), using ib", d.len());
                Ok((Kind::Ib, d))
            }
            Ok(_) => {
                info!(target: "verbsnet::init", "transport auto: no active verbs port, using tcp");
                Ok(tcp())
            }
            Err(e) => {
                info!(target: "verbsnet::init", "transport auto: verbs unavailable ({e}), using tcp");
                Ok(tcp())
            }
        },
    }
}

/// The out-of-band listen address: `VERBSNET_SOCKET_ADDR`, else the interface choice of
/// [`crate::ifselect`] (`VERBSNET_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME`, `NCCL_SOCKET_FAMILY`,
/// NCCL's default order), with the reason for the log.
fn listen_ip(cfg: &Config) -> Result<(IpAddr, String), Error> {
    if let Some(a) = cfg.socket_addr {
        return Ok((a, format!("{a} (VERBSNET_SOCKET_ADDR)")));
    }
    let req = crate::ifselect::Request::new(
        cfg.socket_ifname.as_deref(),
        cfg.nccl_socket_ifname.as_deref(),
        cfg.nccl_socket_family.as_deref(),
    );
    let c = crate::ifselect::choose(&crate::ifselect::system_interfaces(), &req)
        .map_err(|m| Error::new(Op::ListenAddr, Class::Usage, m))?;
    Ok((c.addr, c.to_string()))
}

/// Most virtual devices a process may make (NCCL IB's `MAX_IB_VDEVS`,
/// `src/transport/net_ib/common.h`).
pub const MAX_VDEVS: usize = 128;

/// The virtual devices made in this process (`makeVDevice`), each the physical device indices
/// it joins, in its order, and how many of them the current plugin state has made or re-made
/// (`visible`): device `devs.len() + i` is entry `i`.
///
/// NCCL 2.28+ unloads an external plugin once its last communicator is finalized and, after
/// loading it again, counts its physical devices anew and makes its virtual devices again
/// (`src/plugin/net.cc`, `ncclNetPluginUnload` resets `netVirtDevs`; `src/graph/topo.cc`,
/// `ncclTopoProcessNet`). verbsnet stays mapped across that (`-z nodelete`), so when the last
/// context goes ([`forget_vdevices`]) `devices` counts the physical devices only again, and
/// each `makeVDevice` that follows gets the next index, reusing the entry made before when it
/// names the same devices. With `NCCL_NET_PLUGIN_REF_COUNT` NCCL never unloads the plugin and
/// keeps using the indices it got: those still resolve (entries are only replaced when a new
/// `makeVDevice` names other devices at that index), as NCCL IB's merged devices, which live
/// as long as the process (`ncclIbMergedDevs`, `net_ib/init.cc`).
struct VDevs {
    made: Vec<Vec<usize>>,
    visible: usize,
}

static VDEVS: Mutex<VDevs> = Mutex::new(VDevs {
    made: Vec::new(),
    visible: 0,
});

fn vdevs() -> std::sync::MutexGuard<'static, VDevs> {
    VDEVS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The plugin state was released (the last context finalized): `devices` counts the physical
/// devices only until `makeVDevice` is called again (NCCL makes them again after it reloads
/// the plugin; an index it kept still resolves: see `VDevs`).
pub fn forget_vdevices() {
    vdevs().visible = 0;
}

/// Devices NCCL may name: the physical ones, then the virtual ones made so far.
pub fn dev_count(net: &Net) -> usize {
    net.devs.len() + vdevs().visible
}

/// `makeVDevice(d, {ndevs, devs})`: a virtual device over the physical devices `devs` (in
/// that order; QP `q` of its connections runs on `devs[q % ndevs]`), appended after every
/// device made so far; returns its index. As NCCL IB (`ncclIbMakeVDeviceInternal`,
/// `src/transport/net_ib/init.cc`): one device is allowed (NCCL's topology code never asks
/// for it, `ncclTopoMakeVnic`), several only with `VERBSNET_IB_MERGE_NICS` on.
///
/// # Errors
/// [`Op::MakeVDevice`], `Usage` (`ncclInvalidUsage`, as NCCL IB for every refusal): no
/// device, more than [`wire::MAX_DEVS`], an index that is not a physical device (a virtual one
/// included), one named twice, `VERBSNET_IB_MERGE_NICS=0` with more than one, or
/// [`MAX_VDEVS`] made already.
///
/// [`wire::MAX_DEVS`]: crate::engine::wire::MAX_DEVS
pub fn make_vdevice(net: &Net, devs: &[i32]) -> Result<i32, Error> {
    // NCCL IB refuses with ncclInvalidUsage whatever the reason (`ncclIbMakeVDeviceInternal`).
    let bad = |m: String| Error::new(Op::MakeVDevice, Class::Usage, m);
    let max = crate::engine::wire::MAX_DEVS;
    if devs.is_empty() || devs.len() > max {
        return Err(bad(format!(
            "a virtual device of {} devices (1..={max})",
            devs.len()
        )));
    }
    if devs.len() > 1 && !net.cfg.ib_merge_nics {
        return Err(bad(
            "not merging NICs: VERBSNET_IB_MERGE_NICS=0 (or NCCL_IB_MERGE_NICS=0)".into(),
        ));
    }
    let nphys = net.devs.len();
    let mut idx = Vec::with_capacity(devs.len());
    for &d in devs {
        let i = usize::try_from(d)
            .ok()
            .filter(|&i| i < nphys)
            .ok_or_else(|| {
                bad(format!(
                    "device {d} is not a physical device (0..{nphys}; a virtual device cannot be \
                 merged again)"
                ))
            })?;
        if idx.contains(&i) {
            return Err(bad(format!("device {d} is named twice")));
        }
        idx.push(i);
    }
    // One link layer, as NCCL IB ("Attempted to merge incompatible devices"): a QP on an
    // InfiniBand port cannot reach a RoCE one.
    let first = &net.devs[idx[0]];
    if let Some(&j) = idx
        .iter()
        .find(|&&j| net.devs[j].dev.link_layer() != first.dev.link_layer())
    {
        return Err(bad(format!(
            "cannot merge devices of different link layers: [{}]{} ({}) and [{j}]{} ({}); \
             select NICs of one link layer with VERBSNET_IB_HCA",
            idx[0],
            first.props.name,
            first.dev.link_layer(),
            net.devs[j].props.name,
            net.devs[j].dev.link_layer()
        )));
    }
    let mut v = vdevs();
    let at = v.visible;
    if at >= MAX_VDEVS {
        return Err(bad(format!(
            "{MAX_VDEVS} virtual devices were made already (the most)"
        )));
    }
    // The same device list at the same index as before the plugin state was last released
    // (NCCL making its virtual devices again after a reload) reuses the entry.
    if v.made.get(at) != Some(&idx) {
        v.made.truncate(at);
        v.made.push(idx);
    }
    v.visible = at + 1;
    let d = nphys + at;
    drop(v);
    let e = device(net, d as i32)?;
    info!(
        target: "verbsnet::init",
        "made virtual device [{d}] {} ({} Mbps) over devices {devs:?}",
        e.props.name,
        e.props.speed_mbps
    );
    Ok(d as i32)
}

/// A device as NCCL names it: one physical device, or a virtual one over several.
pub struct Target {
    /// Its physical devices (one for a physical device), device 0 first.
    pub devs: Vec<Arc<dyn Device>>,
    /// Their indices (`vProps.devs`).
    pub indices: Vec<i32>,
    /// Its properties: a physical device's own; a virtual device's from its first device,
    /// with the names joined by `+` and the speeds summed, as NCCL IB reports a merged device
    /// (`ncclIbGetProperties`, `net_ib/init.cc`).
    pub props: DeviceProps,
    /// `props.name` as a C string.
    pub name_c: CString,
    /// `props.pci_path` as a C string.
    pub pci_c: Option<CString>,
}

/// The device `dev` of `net` (physical or virtual), or an error naming how many there are.
pub fn device(net: &Net, dev: i32) -> Result<Target, Error> {
    let nphys = net.devs.len();
    let missing = || {
        Error::new(
            Op::Device,
            Class::InvalidArgument,
            format!(
                "device {dev} does not exist (this plugin has {})",
                dev_count(net)
            ),
        )
    };
    let i = usize::try_from(dev).map_err(|_| missing())?;
    if let Some(e) = net.devs.get(i) {
        return Ok(Target {
            devs: vec![e.dev.clone()],
            indices: vec![dev],
            props: e.props.clone(),
            name_c: e.name_c.clone(),
            pci_c: e.pci_c.clone(),
        });
    }
    // The guard goes before `missing`, which takes the lock again.
    let found = vdevs().made.get(i - nphys).cloned();
    let v = found.ok_or_else(missing)?;
    let mut ents = Vec::with_capacity(v.len());
    for &p in &v {
        ents.push(net.devs.get(p).ok_or_else(|| {
            Error::new(
                Op::Device,
                Class::InvalidArgument,
                format!(
                    "virtual device {dev} joins physical device {p}, which this plugin no longer \
                     has ({nphys} after a re-init with other settings)"
                ),
            )
        })?);
    }
    let mut props = ents[0].props.clone();
    props.name = ents
        .iter()
        .map(|e| e.props.name.as_str())
        .collect::<Vec<_>>()
        .join("+");
    props.speed_mbps = ents
        .iter()
        .map(|e| e.props.speed_mbps)
        .fold(0i32, i32::saturating_add);
    Ok(Target {
        devs: ents.iter().map(|e| e.dev.clone()).collect(),
        indices: v.iter().map(|&p| p as i32).collect(),
        name_c: CString::new(props.name.replace('\0', "?")).unwrap_or_default(),
        pci_c: ents[0].pci_c.clone(),
        props,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::Region;
    use crate::transport::{MemoryRegion, QpConfig, QueuePair};

    /// A tcp device that reports another link layer.
    struct Link(Arc<dyn Device>, &'static str);

    impl Device for Link {
        fn props(&self) -> DeviceProps {
            self.0.props()
        }
        fn reg_mr(&self, region: Region) -> transport::Result<Arc<dyn MemoryRegion>> {
            self.0.reg_mr(region)
        }
        fn create_qp(&self, cfg: &QpConfig) -> transport::Result<Box<dyn QueuePair>> {
            self.0.create_qp(cfg)
        }
        fn link_layer(&self) -> &'static str {
            self.1
        }
    }

    fn net(links: &[&'static str], merge: bool) -> Net {
        let cfg = Config {
            tcp_devices: links.len() as u8,
            ib_merge_nics: merge,
            ..Config::default()
        };
        let devs = transport::tcp::open_devices(&cfg)
            .into_iter()
            .zip(links)
            .map(|(d, &l)| {
                let dev: Arc<dyn Device> = Arc::new(Link(d, l));
                let props = dev.props();
                DevEntry {
                    name_c: CString::new(props.name.clone()).unwrap(),
                    pci_c: None,
                    dev,
                    props,
                }
            })
            .collect();
        Net {
            cfg,
            kind: Kind::Tcp,
            devs,
            listen_ip: std::net::Ipv4Addr::LOCALHOST.into(),
        }
    }

    /// What NCCL IB refuses (`ncclIbMakeVDeviceInternal`, `net_ib/init.cc`) is refused with
    /// `ncclInvalidUsage`'s class and a reason naming the devices or the knob, and nothing is
    /// made (only refusals here: a made device is process-wide).
    #[test]
    fn make_vdevice_refuses_mixed_link_layers_merging_off_and_bad_lists() {
        let mixed = net(&["InfiniBand", "InfiniBand", "Ethernet"], true);
        let before = dev_count(&mixed);
        let refused = |n: &Net, devs: &[i32]| {
            let e = make_vdevice(n, devs).expect_err("refused");
            assert_eq!((e.op(), e.class()), (Op::MakeVDevice, Class::Usage));
            e.to_string()
        };
        let m = refused(&mixed, &[0, 2]);
        assert!(
            m.contains("different link layers: [0]tcp0 (InfiniBand) and [2]tcp2 (Ethernet)")
                && m.contains("VERBSNET_IB_HCA"),
            "{m}"
        );
        assert!(refused(&mixed, &[1, 1]).contains("device 1 is named twice"));
        assert!(refused(&mixed, &[0, 3]).contains("device 3 is not a physical device (0..3"));
        assert!(refused(&mixed, &[-1]).contains("device -1 is not a physical device"));
        assert!(refused(&mixed, &[]).contains("a virtual device of 0 devices (1..=8)"));
        assert!(refused(&mixed, &[0; 9]).contains("of 9 devices"));
        let off = net(&["Ethernet", "Ethernet"], false);
        assert!(refused(&off, &[0, 1]).contains("VERBSNET_IB_MERGE_NICS=0"));
        assert_eq!(dev_count(&mixed), before, "nothing made");
        // A device index past every device names how many there are.
        let e = device(&off, 7).err().expect("no device 7");
        assert!(e.to_string().contains("device 7 does not exist"), "{e}");
    }
}
