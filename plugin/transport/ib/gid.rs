//! RoCE GID choice from the port's GID table in sysfs.
//!
//! A RoCE port lists one GID per IP address of its netdev, in two flavours each (RoCE v1 and
//! v2). `/sys/class/infiniband/<dev>/ports/<port>/gids/<i>` holds the address as eight groups of
//! four hex digits, `gid_attrs/types/<i>` the flavour (`IB/RoCE v1` or `RoCE v2`). Unused entries
//! read as all zeros (and their type file fails with EINVAL).
//!
//! The automatic choice, best first:
//! 1. RoCE v2 with an IPv4-mapped address (`::ffff:a.b.c.d`): routable over IPv4 (what NCCL
//!    picks by default);
//! 2. RoCE v2 with a global IPv6 address;
//! 3. an IPv4-mapped, then a global IPv6 address whose type could not be read (containers
//!    sometimes hide `gid_attrs`).
//!
//! Never: all-zero entries, IPv6 link-local (`fe80::/10`) addresses (not routable, and on rxe
//! they tie traffic to one netdev), or entries known to be RoCE v1. The lowest index wins among
//! equals. `VERBSNET_IB_GID_INDEX` overrides the choice.

use std::fmt;
use std::fs;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

/// RoCE flavour of a GID entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidKind {
    /// `IB/RoCE v1`.
    RoceV1,
    /// `RoCE v2` (UDP/IP encapsulated, routable).
    RoceV2,
    /// The type file was missing or unreadable.
    Unknown,
}

/// One entry of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the table (the `sgid_index` of address vectors).
    pub index: u32,
    /// The GID in network byte order.
    pub gid: [u8; 16],
    /// Its flavour.
    pub kind: GidKind,
}

impl GidEntry {
    /// The address, e.g. `::ffff:192.0.2.1`.
    pub fn addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.gid)
    }

    /// The IPv4 address when the GID is IPv4-mapped.
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        ipv4_mapped(&self.gid)
    }
}

/// The GID's IPv4 address if it is `::ffff:a.b.c.d`.
pub fn ipv4_mapped(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    (gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff)
        .then(|| Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]))
}

/// True for `fe80::/10`.
pub fn is_link_local(gid: &[u8; 16]) -> bool {
    gid[0] == 0xfe && gid[1] & 0xc0 == 0x80
}

/// The chosen GID and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidChoice {
    /// The entry.
    pub entry: GidEntry,
    /// Why it was taken.
    pub reason: GidReason,
}

/// Why a GID was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidReason {
    /// RoCE v2, IPv4-mapped.
    RoceV2Ipv4,
    /// RoCE v2, global IPv6.
    RoceV2Ipv6,
    /// Type unreadable, IPv4-mapped.
    UnknownTypeIpv4,
    /// Type unreadable, global IPv6.
    UnknownTypeIpv6,
}

impl fmt::Display for GidReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GidReason::RoceV2Ipv4 => "first RoCE v2 GID with an IPv4-mapped address",
            GidReason::RoceV2Ipv6 => {
                "no RoCE v2 IPv4 GID; first RoCE v2 GID with a global IPv6 address"
            }
            GidReason::UnknownTypeIpv4 => {
                "GID types unreadable in sysfs; first IPv4-mapped GID (assumed RoCE v2)"
            }
            GidReason::UnknownTypeIpv6 => {
                "GID types unreadable in sysfs; first global IPv6 GID (assumed RoCE v2)"
            }
        })
    }
}

/// Why the automatic choice never takes `entry` (all zeros, IPv6 link-local, RoCE v1), or
/// `None` when it is a candidate.
pub fn skip_reason(entry: &GidEntry) -> Option<&'static str> {
    if entry.gid == [0; 16] {
        Some("empty (all zeros): no address behind it")
    } else if is_link_local(&entry.gid) {
        Some("IPv6 link-local (fe80::/10): not routable")
    } else if entry.kind == GidKind::RoceV1 {
        Some("RoCE v1: not routable over IP")
    } else {
        None
    }
}

/// Picks the GID to use on a RoCE port (see the module doc), or `None` when no entry qualifies.
pub fn choose_roce_gid(table: &[GidEntry]) -> Option<GidChoice> {
    let usable = |e: &&GidEntry| skip_reason(e).is_none();
    let rank = |e: &GidEntry| -> Option<GidReason> {
        match (e.kind, e.ipv4().is_some()) {
            (GidKind::RoceV2, true) => Some(GidReason::RoceV2Ipv4),
            (GidKind::RoceV2, false) => Some(GidReason::RoceV2Ipv6),
            (GidKind::Unknown, true) => Some(GidReason::UnknownTypeIpv4),
            (GidKind::Unknown, false) => Some(GidReason::UnknownTypeIpv6),
            (GidKind::RoceV1, _) => None,
        }
    };
    table
        .iter()
        .filter(usable)
        .filter_map(|e| rank(e).map(|r| (r, e)))
        .min_by_key(|(r, e)| (*r as u8, e.index))
        .map(|(reason, entry)| GidChoice {
            entry: *entry,
            reason,
        })
}

/// Reads entries `0..len` of the GID table under `port_dir`
/// (`/sys/class/infiniband/<dev>/ports/<port>`). Entries whose `gids/<i>` cannot be read or
/// parsed are left out.
pub fn read_gid_table(port_dir: &Path, len: u32) -> Vec<GidEntry> {
    (0..len)
        .filter_map(|index| {
            let text = fs::read_to_string(port_dir.join("gids").join(index.to_string())).ok()?;
            let gid = parse_gid(&text)?;
            Some(GidEntry {
                index,
                gid,
                kind: read_gid_kind(port_dir, index),
            })
        })
        .collect()
}

/// The flavour of entry `index` from `gid_attrs/types/<index>`.
pub fn read_gid_kind(port_dir: &Path, index: u32) -> GidKind {
    match fs::read_to_string(
        port_dir
            .join("gid_attrs")
            .join("types")
            .join(index.to_string()),
    ) {
        Ok(t) if t.trim().eq_ignore_ascii_case("RoCE v2") => GidKind::RoceV2,
        Ok(t) if t.to_ascii_lowercase().contains("v1") => GidKind::RoceV1,
        _ => GidKind::Unknown,
    }
}

/// Parses sysfs GID text, `fe80:0000:0000:0000:1234:56ff:fe78:9abc` (8 groups of 16 bits).
pub fn parse_gid(text: &str) -> Option<[u8; 16]> {
    let mut gid = [0u8; 16];
    let mut groups = text.trim().split(':');
    for pair in gid.chunks_exact_mut(2) {
        let g = groups.next()?;
        if g.is_empty() || g.len() > 4 {
            return None;
        }
        let v = u16::from_str_radix(g, 16).ok()?;
        pair.copy_from_slice(&v.to_be_bytes());
    }
    groups.next().is_none().then_some(gid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fake `ports/1` directory like rxe0's on a dummy netdev with 192.0.2.1.
    struct FakePort(PathBuf);

    impl FakePort {
        fn new(tag: &str, entries: &[(u32, &str, Option<&str>)]) -> FakePort {
            let dir = std::env::temp_dir().join(format!(
                "verbsnet-gid-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(dir.join("gids")).unwrap();
            fs::create_dir_all(dir.join("gid_attrs/types")).unwrap();
            for (i, gid, kind) in entries {
                fs::write(dir.join("gids").join(i.to_string()), format!("{gid}\n")).unwrap();
                if let Some(k) = kind {
                    fs::write(
                        dir.join("gid_attrs/types").join(i.to_string()),
                        format!("{k}\n"),
                    )
                    .unwrap();
                }
            }
            FakePort(dir)
        }
    }

    impl Drop for FakePort {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    const ZERO: &str = "0000:0000:0000:0000:0000:0000:0000:0000";
    const LL: &str = "fe80:0000:0000:0000:06af:f8ff:fe0e:01b2";
    const V4: &str = "0000:0000:0000:0000:0000:ffff:c000:0201";
    const V6: &str = "2001:0db8:0000:0000:0000:0000:0000:0001";

    #[test]
    fn parses_sysfs_text() {
        let g = parse_gid(V4).unwrap();
        assert_eq!(ipv4_mapped(&g), Some(Ipv4Addr::new(192, 0, 2, 1)));
        assert!(is_link_local(&parse_gid(LL).unwrap()));
        assert!(!is_link_local(&g));
        assert!(parse_gid("0000:0000").is_none());
        assert!(parse_gid(&format!("{V4}:0000")).is_none());
        assert!(parse_gid("zzzz:0000:0000:0000:0000:ffff:c000:0201").is_none());
    }

    #[test]
    fn rxe_table_picks_ipv4_roce_v2_not_link_local() {
        // rxe: index 0 link-local, index 1 IPv4-mapped, both RoCE v2; the rest unused.
        let port = FakePort::new(
            "rxe",
            &[
                (0, LL, Some("RoCE v2")),
                (1, V4, Some("RoCE v2")),
                (2, ZERO, None),
            ],
        );
        let table = read_gid_table(&port.0, 4);
        assert_eq!(table.len(), 3);
        assert_eq!(table[0].kind, GidKind::RoceV2);
        assert_eq!(table[2].kind, GidKind::Unknown);
        let c = choose_roce_gid(&table).unwrap();
        assert_eq!(c.entry.index, 1);
        assert_eq!(c.reason, GidReason::RoceV2Ipv4);
        assert_eq!(c.entry.addr().to_string(), "::ffff:192.0.2.1");
    }

    #[test]
    fn mlx_style_table_prefers_v2_ipv4_over_v1_and_ipv6() {
        let port = FakePort::new(
            "mlx",
            &[
                (0, LL, Some("IB/RoCE v1")),
                (1, LL, Some("RoCE v2")),
                (2, V6, Some("IB/RoCE v1")),
                (3, V6, Some("RoCE v2")),
                (4, V4, Some("IB/RoCE v1")),
                (5, V4, Some("RoCE v2")),
            ],
        );
        let c = choose_roce_gid(&read_gid_table(&port.0, 6)).unwrap();
        assert_eq!((c.entry.index, c.reason), (5, GidReason::RoceV2Ipv4));
        // without the IPv4 v2 entry: the global IPv6 v2 one
        let c = choose_roce_gid(&read_gid_table(&port.0, 5)).unwrap();
        assert_eq!((c.entry.index, c.reason), (3, GidReason::RoceV2Ipv6));
        // only link-local and v1: nothing
        assert!(choose_roce_gid(&read_gid_table(&port.0, 3)[..2]).is_none());
    }

    #[test]
    fn skip_reasons_name_why_an_entry_is_never_chosen() {
        let e = |gid: &str, kind| GidEntry {
            index: 0,
            gid: parse_gid(gid).unwrap(),
            kind,
        };
        assert!(skip_reason(&e(ZERO, GidKind::Unknown))
            .unwrap()
            .contains("empty"));
        assert!(skip_reason(&e(LL, GidKind::RoceV2))
            .unwrap()
            .contains("link-local"));
        assert!(skip_reason(&e(V4, GidKind::RoceV1))
            .unwrap()
            .contains("RoCE v1"));
        assert_eq!(skip_reason(&e(V4, GidKind::RoceV2)), None);
        assert_eq!(skip_reason(&e(V6, GidKind::Unknown)), None);
    }

    #[test]
    fn unreadable_types_fall_back_to_ipv4_mapped() {
        let port = FakePort::new("notypes", &[(0, LL, None), (1, V6, None), (2, V4, None)]);
        let c = choose_roce_gid(&read_gid_table(&port.0, 3)).unwrap();
        assert_eq!((c.entry.index, c.reason), (2, GidReason::UnknownTypeIpv4));
        assert!(choose_roce_gid(&[]).is_none());
    }
}
