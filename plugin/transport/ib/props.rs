//! The properties NCCL's topology search trusts (`getProperties`), derived from what discovery
//! learnt about each usable port exactly as NCCL IB derives its own (`ncclIbInitDevices` and
//! `ncclIbGetPhysProperties`, `src/transport/net_ib/init.cc`, NCCL 2.30.7). Pure code over
//! [`PortFacts`] and a sysfs root, so every rule is tested with fixtures.
//!
//! Why they matter: NCCL treats nets with equal (`guid`, `port`) as one physical port and
//! shares its bandwidth between them (`src/graph/search.cc`); it keys a net of its XML
//! topology (and `NCCL_TOPO_FILE`) by `name` and places it under the PCI device of `pciPath`
//! (`src/graph/xml.cc`, `ncclTopoFillNet`); and it weighs paths by `speed`.
//!
//! | property | rule (NCCL IB) |
//! |---|---|
//! | `name` | the verbs device name (`mlx5_0`), without the port: `devName` |
//! | `pciPath` | realpath of `/sys/class/infiniband/<dev>/device` with the PCI function merged to `.0` and, as `NCCL_IB_MERGE_VFS=1` (its default), the device number to `00`: virtual functions join their physical card (`ncclIbGetPciPath`) |
//! | `guid` | `sys_image_guid` as `ibv_query_device` stores it (network byte order, read as a host integer: NCCL does not swap it) |
//! | `port` | the verbs port + `realPort`, the number of devices before this one, in PCI order, on the same card (`ncclIbGetRealPort`): the two functions of a dual-port card (each port 1 in verbs, one `sys_image_guid`) report ports 1 and 2 |
//! | `speed` | [`super::convert::port_speed_mbps`]: `ibv_query_port_speed`, else `active_speed_ex`/`active_speed` × `active_width` |
//! | order | devices sorted by the PCI address of their full path, devices without one last (`ncclIbCompareDevs`, `NCCL_IB_DEVICE_PCI_ORDER=1`, its default) |
//!
//! Deviation: a device whose `device` link is not a PCI device (rxe, siw) reports no
//! `pciPath` (NCCL IB reports the realpath of whatever the link names, mangled as a PCI
//! address, or none when there is no link, as for rxe).

use std::fs;
use std::path::Path;

use crate::transport::DeviceProps;

/// What discovery learnt about one usable port, before NCCL's rules across the device list
/// apply.
#[derive(Clone, Debug, PartialEq)]
pub struct PortFacts {
    /// The verbs device name, e.g. `mlx5_0` or `rxe0`.
    pub dev: String,
    /// The verbs port number (1-based).
    pub port: u8,
    /// `ibv_device_attr::sys_image_guid` as the struct holds it (big-endian bytes).
    pub sys_image_guid: u64,
    /// Speed in Mbps ([`super::convert::port_speed_mbps`]).
    pub speed_mbps: i32,
    /// [`pci_path`]: the realpath of the device's PCI function in sysfs, unmerged.
    pub full_pci_path: Option<String>,
    /// `ibv_device_attr::max_qp`.
    pub max_qp: i32,
}

/// Realpath of `<sysfs_ib>/<dev>/device` (`sysfs_ib` is `/sys/class/infiniband` outside
/// tests) when that is a PCI device (its `subsystem` is the `pci` bus), else `None`: rxe and
/// other software devices have no PCI parent.
pub fn pci_path(sysfs_ib: &Path, dev: &str) -> Option<String> {
    let device = fs::canonicalize(sysfs_ib.join(dev).join("device")).ok()?;
    let subsystem = fs::canonicalize(device.join("subsystem")).ok()?;
    (subsystem.file_name()? == "pci").then(|| device.to_string_lossy().into_owned())
}

/// True when `s` is a PCI address `dddd:bb:dd.f` (hex digits).
fn is_bdf(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b':',
            10 => *c == b'.',
            _ => c.is_ascii_hexdigit(),
        })
}

/// NCCL IB's `pciPath` of a full PCI path (`ncclIbGetPciPath`): the function digit becomes `0`
/// (the ports of a multi-function card are one PCI device to NCCL's topology) and, with
/// `NCCL_IB_MERGE_VFS` at its default 1, the two device digits become `00` (a virtual
/// function joins its card): `…/0000:03:00.1` and `…/0000:03:01.2` both give
/// `…/0000:03:00.0`. A path whose last component is not a PCI address is returned as is.
pub fn merged_pci_path(full: &str) -> String {
    let last = full.rsplit('/').next().unwrap_or(full);
    if !is_bdf(last) {
        return full.to_owned();
    }
    let mut b = full.as_bytes().to_vec();
    let n = b.len();
    b[n - 1] = b'0';
    b[n - 3] = b'0';
    b[n - 4] = b'0';
    String::from_utf8(b).expect("ASCII digits replaced ASCII digits")
}

/// The PCI address of a path's last component as one integer (NCCL's `pciPathToInt64`: its
/// hex digits, `:` and `.` skipped): `…/0000:03:00.1` → `0x3001`.
fn pci_sort_key(full: &str) -> i64 {
    let last = full.trim_end_matches('/').rsplit('/').next().unwrap_or("");
    let hex: String = last
        .chars()
        .filter(|c| *c != ':' && *c != '.')
        .take_while(char::is_ascii_hexdigit)
        .take(16)
        .collect();
    i64::from_str_radix(&hex, 16).unwrap_or(0)
}

/// NCCL IB's "same card" test between two merged paths (`ncclIbMatchVfPath`, merge-VFs
/// variant): equal except for the last 4 characters (`00.0`), i.e. the same bus under the
/// same bridges.
fn same_card(this: &str, before: &str) -> bool {
    let n = this.len().saturating_sub(4);
    before.len() >= n && this.as_bytes()[..n] == before.as_bytes()[..n]
}

/// The properties NCCL IB would report for `ports` (each one usable port, in discovery
/// order), in NCCL IB's device order: `(index into ports, properties)`.
pub fn nccl_properties(ports: &[PortFacts]) -> Vec<(usize, DeviceProps)> {
    let mut order: Vec<usize> = (0..ports.len()).collect();
    // Stable: the ports of one PCI function keep their discovery (port) order; NCCL's qsort
    // leaves equal keys in no defined order.
    order.sort_by_key(|&i| match &ports[i].full_pci_path {
        Some(p) => (false, pci_sort_key(p)),
        None => (true, 0),
    });
    let merged: Vec<Option<String>> = order
        .iter()
        .map(|&i| ports[i].full_pci_path.as_deref().map(merged_pci_path))
        .collect();
    order
        .iter()
        .enumerate()
        .map(|(d, &i)| {
            let f = &ports[i];
            let real_port = merged[d].as_deref().map_or(0, |this| {
                merged[..d]
                    .iter()
                    .flatten()
                    .filter(|before| same_card(this, before))
                    .count()
            });
            let props = DeviceProps {
                name: f.dev.clone(),
                pci_path: merged[d].clone(),
                guid: f.sys_image_guid,
                speed_mbps: f.speed_mbps,
                port: i32::from(f.port) + real_port as i32,
                latency_us: 0.0,
                max_comms: f.max_qp.max(1),
            };
            (i, props)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::ib::convert;
    use std::os::unix::fs::symlink;
    use std::path::PathBuf;

    /// A sysfs tree in a temporary directory: `class/infiniband/<dev>` links to
    /// `devices/<pci path>/infiniband/<dev>`, whose `device` links back to the PCI function
    /// (whose `subsystem` links to `bus/pci`), as the kernel lays them out; software devices
    /// (`rxe`) live under `devices/virtual` with no `device` link.
    struct Sysfs {
        root: PathBuf,
    }

    impl Sysfs {
        fn new(name: &str) -> Sysfs {
            let root =
                std::env::temp_dir().join(format!("verbsnet-sysfs-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&root);
            fs::create_dir_all(root.join("class/infiniband")).unwrap();
            fs::create_dir_all(root.join("bus/pci")).unwrap();
            fs::create_dir_all(root.join("bus/virtio")).unwrap();
            Sysfs { root }
        }

        fn class_ib(&self) -> PathBuf {
            self.root.join("class/infiniband")
        }

        /// A verbs device on PCI function `pci` (`pci0000:00/0000:00:01.0/0000:03:00.1`).
        fn pci_dev(&self, dev: &str, pci: &str) {
            self.dev_under(dev, pci, "pci");
        }

        fn dev_under(&self, dev: &str, parent: &str, bus: &str) {
            let func = self.root.join("devices").join(parent);
            let ibdev = func.join("infiniband").join(dev);
            fs::create_dir_all(&ibdev).unwrap();
            if !func.join("subsystem").exists() {
                let depth = parent.split('/').count() + 1;
                let up = "../".repeat(depth);
                symlink(format!("{up}bus/{bus}"), func.join("subsystem")).unwrap();
            }
            symlink("../..", ibdev.join("device")).unwrap();
            symlink(
                format!("../../devices/{parent}/infiniband/{dev}"),
                self.class_ib().join(dev),
            )
            .unwrap();
        }

        /// A software device: no `device` link.
        fn virtual_dev(&self, dev: &str) {
            let d = self.root.join("devices/virtual/infiniband").join(dev);
            fs::create_dir_all(&d).unwrap();
            symlink(
                format!("../../devices/virtual/infiniband/{dev}"),
                self.class_ib().join(dev),
            )
            .unwrap();
        }

        fn path(&self, parent: &str) -> String {
            fs::canonicalize(self.root.join("devices").join(parent))
                .unwrap()
                .to_string_lossy()
                .into_owned()
        }

        /// The facts discovery would gather: the PCI path from this tree, the rest from the
        /// port's attributes (speed code, width).
        fn facts(&self, dev: &str, port: u8, guid: u64, speed: u32, width: u8) -> PortFacts {
            PortFacts {
                dev: dev.into(),
                port,
                sys_image_guid: guid,
                speed_mbps: convert::port_speed_mbps(None, speed, width),
                full_pci_path: pci_path(&self.class_ib(), dev),
                max_qp: 1 << 17,
            }
        }
    }

    impl Drop for Sysfs {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    const CARD: &str = "pci0000:00/0000:00:01.0";
    /// `sys_image_guid` of `0c42:a103:0012:3456` as `ibv_device_attr` holds it (the bytes in
    /// network order, read as a host integer).
    const GUID_A: u64 = u64::from_ne_bytes([0x0c, 0x42, 0xa1, 0x03, 0x00, 0x12, 0x34, 0x56]);
    const GUID_B: u64 = u64::from_ne_bytes([0x0c, 0x42, 0xa1, 0x03, 0x00, 0x99, 0x88, 0x77]);

    /// The check: a dual-port card is two PCI functions, each one verbs device with
    /// port 1 and the card's `sys_image_guid`; NCCL IB reports them as ports 1 and 2 of one
    /// guid, on the card's function 0, under their own names.
    #[test]
    fn a_dual_port_cards_functions_are_distinct_guid_port_pairs() {
        let s = Sysfs::new("dual");
        s.pci_dev("mlx5_0", &format!("{CARD}/0000:03:00.0"));
        s.pci_dev("mlx5_1", &format!("{CARD}/0000:03:00.1"));
        let facts = [
            s.facts("mlx5_0", 1, GUID_A, 128, 2), // NDR 4x
            s.facts("mlx5_1", 1, GUID_A, 128, 2),
        ];
        let got = nccl_properties(&facts);
        let func0 = s.path(&format!("{CARD}/0000:03:00.0"));
        assert_eq!(got.len(), 2);
        for (k, (i, p)) in got.iter().enumerate() {
            assert_eq!(*i, k);
            assert_eq!(p.name, format!("mlx5_{k}"));
            assert_eq!(p.guid, GUID_A);
            assert_eq!(p.port, k as i32 + 1);
            assert_eq!(p.pci_path.as_deref(), Some(func0.as_str()));
            assert!(p.pci_path.as_deref().unwrap().ends_with("/0000:03:00.0"));
            assert_eq!(p.speed_mbps, 400_000);
            assert_eq!(p.max_comms, 1 << 17);
        }
        let pairs: std::collections::HashSet<(u64, i32)> =
            got.iter().map(|(_, p)| (p.guid, p.port)).collect();
        assert_eq!(pairs.len(), 2, "one (guid, port) per function: {got:?}");
    }

    /// Two dual-port cards listed out of PCI order, a virtual function, and a software device:
    /// NCCL's order (PCI address, software last), one port numbering per card, VFs merged into
    /// their card, the XDR card's speed.
    #[test]
    fn cards_are_ordered_by_pci_address_and_numbered_per_card() {
        let s = Sysfs::new("two");
        s.pci_dev("mlx5_2", "pci0000:80/0000:80:01.0/0000:81:00.0");
        s.pci_dev("mlx5_3", "pci0000:80/0000:80:01.0/0000:81:00.1");
        s.pci_dev("mlx5_1", &format!("{CARD}/0000:03:00.1"));
        s.pci_dev("mlx5_0", &format!("{CARD}/0000:03:00.0"));
        s.pci_dev("mlx5_4", &format!("{CARD}/0000:03:01.2")); // a VF of card A
        s.virtual_dev("rxe0");
        let facts = [
            s.facts("rxe0", 1, 0x1122, 1, 1),
            s.facts("mlx5_2", 1, GUID_B, 0x100, 2), // XDR 4x, active_speed_ex
            s.facts("mlx5_3", 1, GUID_B, 0x100, 2),
            s.facts("mlx5_1", 1, GUID_A, 64, 2),
            s.facts("mlx5_0", 1, GUID_A, 64, 2),
            s.facts("mlx5_4", 1, GUID_A, 64, 2),
        ];
        assert_eq!(facts[0].full_pci_path, None, "rxe has no PCI device");
        let got: Vec<(String, i32, u64, i32, Option<String>)> = nccl_properties(&facts)
            .into_iter()
            .map(|(_, p)| (p.name, p.port, p.guid, p.speed_mbps, p.pci_path))
            .collect();
        let a = Some(s.path(&format!("{CARD}/0000:03:00.0")));
        let b = Some(s.path("pci0000:80/0000:80:01.0/0000:81:00.0"));
        assert_eq!(
            got,
            vec![
                ("mlx5_0".into(), 1, GUID_A, 200_000, a.clone()),
                ("mlx5_1".into(), 2, GUID_A, 200_000, a.clone()),
                ("mlx5_4".into(), 3, GUID_A, 200_000, a),
                ("mlx5_2".into(), 1, GUID_B, 800_000, b.clone()),
                ("mlx5_3".into(), 2, GUID_B, 800_000, b),
                ("rxe0".into(), 1, 0x1122, 2_500, None),
            ]
        );
    }

    /// One PCI function with two verbs ports (ConnectX-3 style): NCCL IB counts the first
    /// port as a device before the second on the same card, so port 2 reports 3; the pair
    /// stays distinct.
    #[test]
    fn two_ports_of_one_function_stay_distinct() {
        let s = Sysfs::new("onefn");
        s.pci_dev("mlx4_0", &format!("{CARD}/0000:03:00.0"));
        let facts = [
            s.facts("mlx4_0", 1, GUID_A, 4, 2),
            s.facts("mlx4_0", 2, GUID_A, 4, 2),
        ];
        let got: Vec<(String, i32)> = nccl_properties(&facts)
            .into_iter()
            .map(|(_, p)| (p.name, p.port))
            .collect();
        assert_eq!(got, vec![("mlx4_0".into(), 1), ("mlx4_0".into(), 3)]);
    }

    #[test]
    fn pci_paths_merge_functions_and_vfs_as_nccl_does() {
        let p = "/sys/devices/pci0000:00/0000:00:01.0/0000:03:00.1";
        assert_eq!(
            merged_pci_path(p),
            "/sys/devices/pci0000:00/0000:00:01.0/0000:03:00.0"
        );
        assert_eq!(
            merged_pci_path("/sys/devices/pci0000:00/0000:00:01.0/0000:03:01.7"),
            "/sys/devices/pci0000:00/0000:00:01.0/0000:03:00.0"
        );
        assert_eq!(
            merged_pci_path("/sys/devices/virtual/x"),
            "/sys/devices/virtual/x"
        );
        assert_eq!(pci_sort_key(p), 0x3001);
        assert_eq!(pci_sort_key("/a/0000:81:00.0/"), 0x81000);
        assert!(same_card("/x/0000:03:00.0", "/x/0000:03:00.0"));
        assert!(!same_card("/x/0000:03:00.0", "/x/0000:04:00.0"));
        assert!(!same_card("/y/0000:03:00.0", "/x/0000:03:00.0"));
        assert!(!same_card("/x/0000:03:00.0", "/x/00"));
    }

    #[test]
    fn a_device_link_to_a_non_pci_parent_has_no_pci_path() {
        let s = Sysfs::new("virtio");
        s.dev_under("rxe1", "pci0000:00/0000:00:02.0/virtio1", "virtio");
        assert_eq!(pci_path(&s.class_ib(), "rxe1"), None);
        assert_eq!(pci_path(&s.class_ib(), "absent"), None);
    }
}
