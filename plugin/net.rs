//! Plugin-wide state made by `init`: configuration, the chosen transport, its devices, and the
//! address the out-of-band listeners use.

use std::ffi::CString;
use std::net::IpAddr;
use std::sync::Arc;

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

/// The device `dev` of `net`, or an error naming how many there are.
pub fn dev_entry(net: &Net, dev: i32) -> Result<&DevEntry, Error> {
    usize::try_from(dev)
        .ok()
        .and_then(|d| net.devs.get(d))
        .ok_or_else(|| {
            Error::new(
                Op::Device,
                Class::InvalidArgument,
                format!(
                    "device {dev} does not exist (this plugin has {})",
                    net.devs.len()
                ),
            )
        })
}
