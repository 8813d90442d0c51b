//! Plugin-wide state made by `init`: configuration, the chosen transport, its devices, and the
//! address the out-of-band listeners use.

use std::ffi::CString;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, RwLock};

use tracing::{info, warn};

use crate::comm::Error;
use crate::config::{Config, TransportChoice};
use crate::transport::{self, Device, DeviceProps, Kind};

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

static NET: RwLock<Option<Arc<Net>>> = RwLock::new(None);

/// The initialized plugin, or an error telling the caller to call init first.
pub fn get() -> Result<Arc<Net>, Error> {
    NET.read()
        .ok()
        .and_then(|g| g.clone())
        .ok_or_else(|| Error::Internal("the plugin is used before init succeeded".into()))
}

/// `init`: parses the configuration once, picks the transport and opens its devices.
/// A second call keeps the first configuration (NCCL may call init more than once).
pub fn init(logger: crate::ffi::abi::ncclDebugLogger_t) -> Result<(), Error> {
    if let Ok(Some(_)) = NET.read().map(|g| g.clone()) {
        crate::log::init(
            logger,
            crate::log::level().unwrap_or(crate::config::DebugLevel::Warn),
        );
        return Ok(());
    }
    let cfg = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            // The shim's guard logs the error as one WARN once the logger is set up.
            crate::log::init(logger, crate::config::DebugLevel::Warn);
            return Err(Error::Usage(e.to_string()));
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

    let (kind, devs) = open(&cfg)?;
    // Resource limits: what one comm will pin, against the cap and RLIMIT_MEMLOCK.
    crate::limits::check(&cfg, kind)?;
    let listen_ip = listen_ip(&cfg)?;
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
        "using transport {}: {}; out-of-band address {listen_ip}",
        kind.as_str(),
        names.join(" ")
    );
    let net = Arc::new(Net {
        cfg,
        kind,
        devs: entries,
        listen_ip,
    });
    if let Ok(mut g) = NET.write() {
        *g = Some(net);
    }
    Ok(())
}

fn open(cfg: &Config) -> Result<(Kind, Vec<Arc<dyn Device>>), Error> {
    let tcp = || (Kind::Tcp, transport::tcp::open_devices(cfg));
    match cfg.transport {
        TransportChoice::Tcp => Ok(tcp()),
        TransportChoice::Ib => {
            match transport::ib::open_devices(cfg) {
                Ok(d) if !d.is_empty() => Ok((Kind::Ib, d)),
                Ok(_) => Err(Error::System(format!(
                "VERBSNET_TRANSPORT=ib but no active verbs port matches{}: check `ibv_devinfo`, \
                 VERBSNET_IB_HCA, or use VERBSNET_TRANSPORT=tcp",
                cfg.ib_hca.as_deref().map(|h| format!(" VERBSNET_IB_HCA={h}")).unwrap_or_default()
            ))),
                Err(e) => Err(Error::System(format!(
                    "VERBSNET_TRANSPORT=ib but verbs are unusable: {e}"
                ))),
            }
        }
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

/// The out-of-band listen address: `VERBSNET_SOCKET_ADDR`, else the first address of
/// `VERBSNET_SOCKET_IFNAME`, else the first IPv4 address of an up, non-loopback interface,
/// else 127.0.0.1.
fn listen_ip(cfg: &Config) -> Result<IpAddr, Error> {
    if let Some(a) = cfg.socket_addr {
        return Ok(a);
    }
    let addrs: Vec<(String, IpAddr, bool)> = nix::ifaddrs::getifaddrs()
        .map(|it| {
            it.filter_map(|ifa| {
                let up = ifa.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP);
                let sa = ifa.address?;
                let ip = if let Some(v4) = sa.as_sockaddr_in() {
                    IpAddr::V4(v4.ip())
                } else {
                    IpAddr::V6(sa.as_sockaddr_in6()?.ip())
                };
                Some((ifa.interface_name, ip, up))
            })
            .collect()
        })
        .unwrap_or_default();
    if let Some(name) = &cfg.socket_ifname {
        return addrs
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, ip, _)| *ip)
            .ok_or_else(|| {
                Error::Usage(format!(
                    "VERBSNET_SOCKET_IFNAME={name}: no such interface with an IP address"
                ))
            });
    }
    Ok(addrs
        .iter()
        .find(|(_, ip, up)| *up && ip.is_ipv4() && !ip.is_loopback())
        .map(|(_, ip, _)| *ip)
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}
