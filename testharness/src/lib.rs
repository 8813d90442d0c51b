//! verbsnet-perf: loads an NCCL net plugin (verbsnet by default) exactly as NCCL does and runs
//! nccl-tests-style collectives across processes through it.
//!
//! - [`plugin`]: dlopen/dlsym as NCCL does, the `ncclNet_v6_t` … `ncclNet_v12_t` tables copied
//!   after `init`, the logger `init` gets, and a safe wrapper (the only `unsafe` code of the
//!   harness).
//! - [`baseline`]: `--baseline tcp`, a plain TCP ring streaming the same bytes.
//! - [`bootstrap`]: launcher variables and the TCP rendezvous served by rank 0.
//! - [`coll`]: ring schedules for the collectives and the NCCL-style proxy that runs them.
//! - [`doctor`]: `verbsnet-perf doctor`, the preflight checks (one verdict line per check).
//! - [`data`]: element types, operators, deterministic data and expected results.
//! - [`deviations`]: what a plugin did against the contract that NCCL does not depend on.
//! - [`mesh`]: alltoall over a full mesh of connections, shared by several senders with their
//!   own tags (NCCL_NET_SHARED_COMMS) when the plugin's `maxRecvs` allows.
//! - [`p2p`]: the proxy of the point-to-point modes (`stream`, `latency`: perftest-shaped, 2
//!   ranks).
//! - [`perf`]: one rank's benchmark loop; [`launcher`]: `--ranks N` local mode.
//! - [`vdevice`]: `--vdevice`, NIC fusion through the plugin's `makeVDevice` as NCCL's topology
//!   code asks for it.
//! - [`report`] and [`stats`]: the table, JSON and plugin counters; [`cputime`]: CPU time and
//!   run-queue wait of a measurement.
#![warn(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_code)]

pub mod baseline;
pub mod bootstrap;
pub mod calltimes;
pub mod cli;
pub mod coll;
pub mod cputime;
pub mod data;
pub mod deviations;
pub mod doctor;
pub mod fdpass;
pub mod launcher;
pub mod mesh;
pub mod p2p;
pub mod perf;
pub mod plugin;
pub mod report;
pub mod stats;
pub mod vdevice;
