//! verbsnet: an NCCL network plugin (`ncclNet_v7` … `ncclNet_v12`) over RDMA verbs.
//!
//! Layers (top to bottom):
//! - [`ffi`]: the exported `ncclNetPlugin_v7` … `ncclNetPlugin_v12` tables (one adapter per
//!   version), shim bodies written once, panic containment, error → `ncclResult_t`.
//! - [`api`]: the version-independent plugin API: per-communicator contexts, the shared,
//!   reference-counted plugin state, typed listen/send/receive comms, the objects NCCL holds
//!   pointers to (registrations, requests), one error type.
//! - [`comm`] / [`conn`] / [`net`] / [`limits`]: send/receive comms: drive the engine, carry
//!   out its actions on a transport QP, hand out request ids; run the non-blocking connection
//!   handshake; [`comm::pool`]: the shared bounce pool receive queues grow from; the devices
//!   from `init`; what a comm may pin.
//! - [`engine`]: the pure protocol engine (no I/O, no clock): request slots, posting-order
//!   matching, eager and rendezvous paths, RQ batching, credits.
//! - [`transport`]: one verbs-shaped interface; `ib` (libibverbs) and `tcp` (userspace).
//! - [`mem`]: raw memory below all of the above: bounds-checked copies, volatile words and
//!   socket I/O on registered ranges, never a Rust reference to memory a NIC or peer writes.
//! - [`config`]: `VERBSNET_*` variables, parsed once; [`log`]: `tracing` events bridged to
//!   NCCL's logger through a sink the ffi layer provides; [`error`]: the error shape of every
//!   layer; [`ifselect`]: the set-up interface rules.
//!
//! `tests/layers.rs` checks from the imports that no module imports a layer above its own.
#![warn(missing_docs)]

pub mod config;
pub mod engine;
pub mod error;
pub mod ffi;
pub mod ifselect;
pub mod log;
pub mod mem;
pub mod transport;

pub mod api;
pub mod comm;
pub mod conn;
pub mod limits;
pub mod net;
#[doc(hidden)]
pub mod testkit;
