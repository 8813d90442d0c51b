//! Which interface address the out-of-band (set-up) listeners use, chosen as NCCL chooses its
//! socket interface.
//!
//! Rules (NCCL `src/misc/socket.cc` `ncclFindInterfaces`, `src/os/linux.cc`
//! `ncclOsFindInterfaces`, `src/misc/utils.cc` `parseStringList`/`matchIfList`):
//! - An interface list is `[^][=]name[,name...]`: each name is a prefix (`eth` matches `eth0`,
//!   `eth1`), `=` makes every name exact, `^` excludes the names instead of selecting them
//!   (`^=docker0` excludes exactly docker0). A `:port` suffix of an entry is accepted and ignored.
//!   A value of one character or less counts as unset (NCCL's `strlen(env) > 1`).
//! - Only addresses of running interfaces (`IFF_UP` and `IFF_RUNNING`) count, IPv4 or IPv6,
//!   never `::1`; `NCCL_SOCKET_FAMILY=AF_INET|AF_INET6` keeps one family. The first address
//!   in `getifaddrs` order wins (IPv4 addresses come before IPv6 ones there).
//! - With a list given (`VERBSNET_SOCKET_IFNAME`, else `NCCL_SOCKET_IFNAME`): the first match,
//!   or an error naming the list and the interfaces that exist.
//! - Without one, the first non-empty group of: `ib*`; anything but `docker*`, `lo*`,
//!   `virbr*`, `veth*`; `docker*`; `lo*`; `virbr*`; `veth*`. NCCL's groups are the same except
//!   that it has no `veth` rule (a veth end is usually a container's link, never the fabric);
//!   with nothing at all, 127.0.0.1.
//!
//! One difference from NCCL: IPv6 link-local addresses (`fe80::/10`) are skipped, because
//! the listen address travels in the connection handle without a scope id, and a link-local
//! address without one cannot be connected to.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

/// One address of one interface, as `getifaddrs` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfAddr {
    /// Interface name, e.g. `eth0`.
    pub name: String,
    /// The address.
    pub addr: IpAddr,
    /// `IFF_UP` and `IFF_RUNNING` are both set.
    pub running: bool,
}

/// `NCCL_SOCKET_FAMILY`: which address family may be chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Either (the first address found).
    Any,
    /// `AF_INET`.
    V4,
    /// `AF_INET6`.
    V6,
}

impl Family {
    /// Parses `NCCL_SOCKET_FAMILY` (`AF_INET`, `AF_INET6`; NCCL compares exactly). `None` for
    /// any other value, which NCCL ignores.
    pub fn parse(v: &str) -> Option<Family> {
        match v.trim() {
            "AF_INET" => Some(Family::V4),
            "AF_INET6" => Some(Family::V6),
            _ => None,
        }
    }

    fn admits(self, a: &IpAddr) -> bool {
        match self {
            Family::Any => true,
            Family::V4 => a.is_ipv4(),
            Family::V6 => a.is_ipv6(),
        }
    }
}

/// A parsed interface list (`[^][=]name[:port][,...]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfList {
    /// `^`: the names are excluded.
    pub exclude: bool,
    /// `=`: the names match exactly, not as prefixes.
    pub exact: bool,
    /// The names (empty entries dropped).
    pub names: Vec<String>,
}

impl IfList {
    /// Parses a list.
    ///
    /// # Errors
    /// A list with no name in it (e.g. `^`, `=`, `,`), with the reason.
    pub fn parse(s: &str) -> Result<IfList, String> {
        let mut rest = s.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let names: Vec<String> = rest
            .split(',')
            .filter_map(|e| e.split(':').next())
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect();
        if names.is_empty() {
            return Err(format!("{s:?} names no interface"));
        }
        Ok(IfList {
            exclude,
            exact,
            names,
        })
    }

    /// Whether interface `name` is selected by this list.
    pub fn selects(&self, name: &str) -> bool {
        let hit = self.names.iter().any(|n| {
            if self.exact {
                name == n
            } else {
                name.starts_with(n.as_str())
            }
        });
        hit != self.exclude
    }
}

/// The chosen address and why it was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The address the listeners bind to.
    pub addr: IpAddr,
    /// Its interface (`None` for the 127.0.0.1 fallback).
    pub ifname: Option<String>,
    /// Why, e.g. `NCCL_SOCKET_IFNAME==eth0` or `default order: ib*, others, docker*, ...`.
    pub reason: String,
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ifname {
            Some(n) => write!(f, "{} ({n}, {})", self.addr, self.reason),
            None => write!(f, "{} ({})", self.addr, self.reason),
        }
    }
}

/// What the user asked for.
#[derive(Clone, Debug, Default)]
pub struct Request<'a> {
    /// `(variable, value)` of the interface list in force: `VERBSNET_SOCKET_IFNAME` when set,
    /// else `NCCL_SOCKET_IFNAME` when longer than one character.
    pub list: Option<(&'static str, &'a str)>,
    /// `NCCL_SOCKET_FAMILY` as set (`None`: unset).
    pub family: Option<&'a str>,
}

impl<'a> Request<'a> {
    /// The request from the two candidate list values (VERBSNET's first) and the family.
    pub fn new(
        verbsnet_ifname: Option<&'a str>,
        nccl_ifname: Option<&'a str>,
        family: Option<&'a str>,
    ) -> Request<'a> {
        let list = match (verbsnet_ifname, nccl_ifname) {
            (Some(v), _) => Some(("VERBSNET_SOCKET_IFNAME", v)),
            (None, Some(n)) if n.trim().len() > 1 => Some(("NCCL_SOCKET_IFNAME", n)),
            _ => None,
        };
        Request { list, family }
    }
}

/// The groups tried, in order, when no list is given.
const DEFAULT_GROUPS: [&str; 6] = [
    "ib",
    "^docker,lo,virbr,veth",
    "docker",
    "lo",
    "virbr",
    "veth",
];

/// Chooses the listen address from `ifs` (in `getifaddrs` order).
///
/// # Errors
/// A list that is malformed or selects no usable address: the message names the variable, its
/// value, the family and the usable interfaces there are. An unknown `NCCL_SOCKET_FAMILY` is
/// not an error (NCCL ignores it); it shows in [`Choice::reason`].
pub fn choose(ifs: &[IfAddr], req: &Request<'_>) -> Result<Choice, String> {
    let (family, family_note) = match req.family {
        None => (Family::Any, String::new()),
        Some(v) => match Family::parse(v) {
            Some(f) => (f, format!(", NCCL_SOCKET_FAMILY={}", v.trim())),
            None => (
                Family::Any,
                format!(", NCCL_SOCKET_FAMILY={v:?} ignored: not AF_INET or AF_INET6"),
            ),
        },
    };
    let usable: Vec<&IfAddr> = ifs
        .iter()
        .filter(|i| i.running && family.admits(&i.addr) && !unusable(&i.addr))
        .collect();
    let first = |l: &IfList| usable.iter().find(|i| l.selects(&i.name)).copied();
    if let Some((var, value)) = req.list {
        let list = IfList::parse(value).map_err(|e| format!("{var}={e}"))?;
        return match first(&list) {
            Some(i) => Ok(Choice {
                addr: i.addr,
                ifname: Some(i.name.clone()),
                reason: format!("{var}={}{family_note}", value.trim()),
            }),
            None => Err(format!(
                "{var}={} selects no running interface with a usable {} address \
                 (there are: {}); fix the list or unset it",
                value.trim(),
                match family {
                    Family::Any => "IPv4 or IPv6",
                    Family::V4 => "IPv4",
                    Family::V6 => "IPv6",
                },
                describe(&usable)
            )),
        };
    }
    for g in DEFAULT_GROUPS {
        let list = IfList::parse(g).expect("the default groups parse");
        if let Some(i) = first(&list) {
            return Ok(Choice {
                addr: i.addr,
                ifname: Some(i.name.clone()),
                reason: format!(
                    "default order: ib*, others, docker*, lo*, virbr*, veth*{family_note}"
                ),
            });
        }
    }
    Ok(Choice {
        addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
        ifname: None,
        reason: format!("no running interface with a usable address{family_note}"),
    })
}

/// `::1` and IPv6 link-local (no scope id travels in the handle), and unspecified addresses.
fn unusable(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(v4) => v4.is_unspecified(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.is_unspecified() || (v6.segments()[0] & 0xffc0) == 0xfe80
        }
    }
}

fn describe(usable: &[&IfAddr]) -> String {
    if usable.is_empty() {
        return "none".into();
    }
    usable
        .iter()
        .map(|i| format!("{} {}", i.name, i.addr))
        .collect::<Vec<_>>()
        .join(", ")
}

/// This host's interface addresses, in `getifaddrs` order (empty if the call fails).
pub fn system_interfaces() -> Vec<IfAddr> {
    use nix::net::if_::InterfaceFlags as F;
    let Ok(it) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    it.filter_map(|ifa| {
        let sa = ifa.address?;
        let addr = if let Some(v4) = sa.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else {
            IpAddr::V6(sa.as_sockaddr_in6()?.ip())
        };
        Some(IfAddr {
            name: ifa.interface_name,
            addr,
            running: ifa.flags.contains(F::IFF_UP | F::IFF_RUNNING),
        })
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifs(list: &[(&str, &str, bool)]) -> Vec<IfAddr> {
        list.iter()
            .map(|(n, a, r)| IfAddr {
                name: n.to_string(),
                addr: a.parse().unwrap(),
                running: *r,
            })
            .collect()
    }

    /// A Docker host: lo, a decoy docker0 and virbr0 listed BEFORE eth0, a veth, and IPv6.
    fn docker_host() -> Vec<IfAddr> {
        ifs(&[
            ("lo", "127.0.0.1", true),
            ("docker0", "172.17.0.1", true),
            ("virbr0", "192.168.122.1", true),
            ("veth12ab", "169.254.3.3", true),
            ("eth0", "192.0.2.1", true),
            ("eth1", "198.51.100.1", true),
            ("lo", "::1", true),
            ("eth0", "fd00::1", true),
            ("eth0", "fe80::1", true),
        ])
    }

    fn pick(list: &[IfAddr], v: Option<&str>, n: Option<&str>, f: Option<&str>) -> String {
        match choose(list, &Request::new(v, n, f)) {
            Ok(c) => format!("{} {}", c.ifname.unwrap_or_default(), c.addr),
            Err(e) => format!("error: {e}"),
        }
    }

    #[test]
    fn default_skips_docker_lo_virbr_veth() {
        assert_eq!(pick(&docker_host(), None, None, None), "eth0 192.0.2.1");
    }

    #[test]
    fn default_prefers_ib_interfaces() {
        let mut l = docker_host();
        l.push(IfAddr {
            name: "ib0".into(),
            addr: "10.1.0.1".parse().unwrap(),
            running: true,
        });
        assert_eq!(pick(&l, None, None, None), "ib0 10.1.0.1");
    }

    #[test]
    fn default_falls_back_in_nccl_order() {
        let l = ifs(&[
            ("lo", "127.0.0.1", true),
            ("virbr0", "192.168.122.1", true),
            ("docker0", "172.17.0.1", true),
        ]);
        assert_eq!(pick(&l, None, None, None), "docker0 172.17.0.1");
        assert_eq!(pick(&l[..2], None, None, None), "lo 127.0.0.1");
        assert_eq!(pick(&l[1..2], None, None, None), "virbr0 192.168.122.1");
        let none = choose(&[], &Request::default()).unwrap();
        assert_eq!(
            (none.addr, none.ifname),
            ("127.0.0.1".parse().unwrap(), None)
        );
    }

    #[test]
    fn down_interfaces_are_skipped() {
        let l = ifs(&[("eth0", "192.0.2.1", false), ("eth1", "192.0.2.9", true)]);
        assert_eq!(pick(&l, None, None, None), "eth1 192.0.2.9");
        assert!(pick(&l, None, Some("=eth0"), None).starts_with("error: NCCL_SOCKET_IFNAME==eth0"));
    }

    #[test]
    fn nccl_socket_ifname_prefix_exact_exclude_lists() {
        let l = docker_host();
        assert_eq!(pick(&l, None, Some("eth"), None), "eth0 192.0.2.1");
        assert_eq!(pick(&l, None, Some("eth1"), None), "eth1 198.51.100.1");
        assert_eq!(pick(&l, None, Some("=eth1"), None), "eth1 198.51.100.1");
        assert_eq!(pick(&l, None, Some("docker"), None), "docker0 172.17.0.1");
        // exclusion does not apply the default skips: lo is first and not excluded
        assert_eq!(pick(&l, None, Some("^docker"), None), "lo 127.0.0.1");
        assert_eq!(
            pick(&l, None, Some("^docker,lo,virbr,veth,eth0"), None),
            "eth1 198.51.100.1"
        );
        assert_eq!(
            pick(&l, None, Some("^=lo,docker0,virbr0,veth12ab"), None),
            "eth0 192.0.2.1"
        );
        assert_eq!(
            pick(&l, None, Some("virbr1,eth1:1"), None),
            "eth1 198.51.100.1"
        );
        // exact: "eth" is no interface
        assert!(pick(&l, None, Some("=eth"), None).contains("selects no running interface"));
    }

    #[test]
    fn verbsnet_socket_ifname_takes_precedence() {
        let l = docker_host();
        assert_eq!(
            pick(&l, Some("eth1"), Some("eth0"), None),
            "eth1 198.51.100.1"
        );
        let c = choose(&l, &Request::new(Some("eth1"), Some("eth0"), None)).unwrap();
        assert_eq!(c.reason, "VERBSNET_SOCKET_IFNAME=eth1");
    }

    #[test]
    fn one_character_nccl_value_counts_as_unset() {
        assert_eq!(
            pick(&docker_host(), None, Some("e"), None),
            "eth0 192.0.2.1"
        );
        assert_eq!(
            pick(&docker_host(), None, Some("^"), None),
            "eth0 192.0.2.1"
        );
    }

    #[test]
    fn family_keeps_one_family_and_skips_link_local() {
        let l = docker_host();
        assert_eq!(pick(&l, None, None, Some("AF_INET6")), "eth0 fd00::1");
        assert_eq!(
            pick(&l, None, Some("=eth0"), Some("AF_INET6")),
            "eth0 fd00::1"
        );
        assert_eq!(pick(&l, None, None, Some("AF_INET")), "eth0 192.0.2.1");
        let c = choose(&l, &Request::new(None, None, Some("inet6"))).unwrap();
        assert_eq!(c.addr, "192.0.2.1".parse::<IpAddr>().unwrap());
        assert!(c.reason.contains("ignored"), "{}", c.reason);
        // only a link-local IPv6 address on eth1: nothing usable there
        let ll = ifs(&[("lo", "::1", true), ("eth1", "fe80::2", true)]);
        assert!(pick(&ll, None, Some("eth1"), Some("AF_INET6"))
            .contains("no running interface with a usable IPv6 address (there are: none)"));
    }

    #[test]
    fn ipv6_only_host_uses_its_global_address() {
        let l = ifs(&[
            ("lo", "::1", true),
            ("docker0", "fd42::1", true),
            ("eth0", "2001:db8::5", true),
            ("eth0", "fe80::5", true),
        ]);
        assert_eq!(pick(&l, None, None, None), "eth0 2001:db8::5");
    }

    #[test]
    fn malformed_lists_are_errors() {
        let l = docker_host();
        assert_eq!(
            pick(&l, Some("^="), None, None),
            "error: VERBSNET_SOCKET_IFNAME=\"^=\" names no interface"
        );
        assert!(pick(&l, None, Some(",,"), None).contains("names no interface"));
        assert_eq!(
            IfList::parse(" ^=a, b:0 ,").unwrap(),
            IfList {
                exclude: true,
                exact: true,
                names: vec!["a".into(), "b".into()]
            }
        );
    }

    #[test]
    fn error_lists_what_exists() {
        let e = pick(&docker_host(), None, Some("ens"), Some("AF_INET"));
        assert!(
            e.contains("NCCL_SOCKET_IFNAME=ens selects no running interface with a usable IPv4"),
            "{e}"
        );
        assert!(
            e.contains("eth0 192.0.2.1") && e.contains("docker0 172.17.0.1"),
            "{e}"
        );
    }

    #[test]
    fn system_list_has_loopback() {
        // every Linux host and network namespace has lo with 127.0.0.1 (maybe down in a fresh
        // namespace, so only its presence is checked)
        assert!(system_interfaces()
            .iter()
            .any(|i| i.name == "lo" && i.addr == IpAddr::V4(Ipv4Addr::LOCALHOST)));
    }
}
