//! The ABI versions the harness drives, their exported tables, and the device properties
//! copied out of each version's struct.

use nccl_net_verbsnet::ffi::abi::{
    ncclNet_v10_t, ncclNet_v11_t, ncclNet_v12_t, ncclNet_v7_t, ncclNet_v8_t, ncclNet_v9_t,
};

/// A device's properties, copied out of the plugin's struct.
#[derive(Clone, Debug)]
pub struct Properties {
    /// Device name (unique per device).
    pub name: String,
    /// sysfs PCI path, if the plugin gives one.
    pub pci_path: Option<String>,
    /// Port GUID.
    pub guid: u64,
    /// `NCCL_PTR_*` bits.
    pub ptr_support: i32,
    /// Link speed in Mbps.
    pub speed: i32,
    /// Port number.
    pub port: i32,
    /// Latency in microseconds.
    pub latency: f32,
    /// Maximum comms.
    pub max_comms: i32,
    /// Maximum grouped receives.
    pub max_recvs: i32,
    /// `maxP2pBytes` (v9+).
    pub max_p2p_bytes: Option<u64>,
    /// `(railId, planeId)` (v12).
    pub rail_plane: Option<(i16, i16)>,
    /// The ABI version the properties came from.
    pub version: u32,
}

/// The fields every version's properties struct has.
macro_rules! props_common {
    ($p:expr) => {
        Properties {
            // SAFETY: the plugin's strings are NUL-terminated and live for the plugin lifetime.
            name: unsafe { crate::plugin::load::opt_cstr($p.name) }.unwrap_or_default(),
            // SAFETY: as above.
            pci_path: unsafe { crate::plugin::load::opt_cstr($p.pciPath) },
            guid: $p.guid,
            ptr_support: $p.ptrSupport,
            speed: $p.speed,
            port: $p.port,
            latency: $p.latency,
            max_comms: $p.maxComms,
            max_recvs: $p.maxRecvs,
            max_p2p_bytes: None,
            rail_plane: None,
            version: 0,
        }
    };
}

/// The ABI versions the harness drives, newest first: NCCL's probe order
/// (`src/plugin/net.cc`: v12, v11, v10, v9, v8, v7, then v6, which verbsnet-perf cannot drive).
pub const VERSIONS: [u32; 6] = [12, 11, 10, 9, 8, 7];

/// The oldest version NCCL still probes; the harness reports it but does not drive it.
pub(crate) const V6_SYMBOL: &str = "ncclNetPlugin_v6";

/// The exported table symbol of ABI version `v`.
pub fn symbol(v: u32) -> String {
    format!("ncclNetPlugin_v{v}")
}

/// A loaded table of one version.
#[derive(Clone, Copy)]
///
/// The references are `'static` in type only: they point into the library, which [`Net`]
/// keeps loaded, and are reached only through `&Net`.
pub(crate) enum Table {
    V7(&'static ncclNet_v7_t),
    V8(&'static ncclNet_v8_t),
    V9(&'static ncclNet_v9_t),
    V10(&'static ncclNet_v10_t),
    V11(&'static ncclNet_v11_t),
    V12(&'static ncclNet_v12_t),
}

/// Evaluates `$e` with `$t` bound to the table, for slots of the same type in every version.
macro_rules! each {
    ($self:expr, $t:ident => $e:expr) => {
        match $self.table() {
            Table::V7($t) => $e,
            Table::V8($t) => $e,
            Table::V9($t) => $e,
            Table::V10($t) => $e,
            Table::V11($t) => $e,
            Table::V12($t) => $e,
        }
    };
}

pub(crate) use {each, props_common};
