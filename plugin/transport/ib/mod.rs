//! The ib transport: RC queue pairs over libibverbs, resolved at run time.
//!
//! - [`open_devices`] loads `libibverbs.so.1` (never linked: the plugin must load where
//!   rdma-core is absent), opens every device and returns one [`crate::transport::Device`] per
//!   ACTIVE port (InfiniBand or RoCE) that `VERBSNET_IB_HCA` ([`HcaFilter`]) selects.
//! - RoCE ports use a RoCE v2 GID with an IPv4-mapped address unless `VERBSNET_IB_GID_INDEX`
//!   says otherwise ([`gid`]); InfiniBand ports use GID 0 and the LID.
//! - Each port's device has one protection domain per verbs device; memory regions are
//!   registered with local write, remote write and remote read access.
//! - A queue pair is an RC QP with its own CQ; `conninfo::ConnInfo` is what `local_info` sends to
//!   the peer. The out-of-band TCP stream handed to `establish` is kept to notice a peer that
//!   exits.
//!
//! - Verbs keep no per-QP RNR counters, so [`crate::transport::QpCounters`]'s `rnr_naks_*` stay
//!   0 here; the device-wide ones come from sysfs `hw_counters` (`Device::rnr_counters`).
//! - `post_send`/`post_recv` chain all WRs into one verbs call. On a failure (e.g. a full queue:
//!   `TransportError::Resource`) the WRs before the failing one *were* posted; the message says
//!   how many.
//!
//! - `getProperties` reports each port as NCCL IB would ([`props`]: name, `pciPath`, guid,
//!   port, speed and the device order, each rule from `src/transport/net_ib/init.cc`).
//!
//! Modules: `dl` (the run-time symbol table), [`filter`], [`gid`], [`convert`] (pure code
//! mappings), [`props`] (NCCL IB's properties from the facts discovery gathered), `context` (the device context, protection domain and port facts that devices and
//! QPs share), `device` (MRs, QP creation, discovery), [`qp`], [`survey`] (every device and port
//! with the plugin's verdict on it, for `verbsnet-perf doctor`). Imports run one way:
//! `device` → `qp` → `context` (and `device` → `context`), never back.

mod conninfo;
mod context;
mod device;
mod dl;

pub mod convert;
pub mod filter;
pub mod gid;
pub mod props;
pub mod qp;
pub mod survey;

pub use device::{open_devices, IbDevice, IbMemoryRegion};
pub use filter::HcaFilter;
pub use qp::IbQueuePair;
