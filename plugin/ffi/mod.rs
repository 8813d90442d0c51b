//! The C boundary: the exported tables `ncclNetPlugin_v7` … `ncclNetPlugin_v12`, one small
//! adapter per ABI version over shim bodies written once ([`shim`]).
//!
//! Every entry point catches panics (a panic never crosses into NCCL: it is logged as WARN
//! and returned as `ncclInternalError`), writes out-parameters only on success, and maps
//! errors to `ncclResult_t` in one place (`shim::code`). The shims call the
//! version-independent API ([`crate::api`]).
//!
//! Adding a version N: a section in `nccl-headers/verbsnet_net.h`, its layout asserts in
//! [`abi`], an adapter `vN.rs` (its table and, if its properties struct is new, a
//! `shim::FromProps` impl), and `ncclNetPlugin_vN` in `exports.map`.

pub mod abi;
pub mod logger;

pub mod shim;
pub mod v10;
pub mod v11;
pub mod v12;
pub mod v7;
pub mod v8;
pub mod v9;

#[cfg(test)]
mod tests;
