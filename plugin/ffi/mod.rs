//! The C boundary: the exported tables `ncclNetPlugin_v7` … `ncclNetPlugin_v12`, one small
//! adapter per ABI version over slot bodies written once ([`shim`]).
//!
//! Every slot is made by one macro ([`boundary`]'s `entry!`): it catches panics (a panic never
//! crosses into NCCL: it is logged as WARN and returned as `ncclInternalError`), names the slot
//! in its WARN, and maps errors to `ncclResult_t` in one place (`boundary::code`); the
//! boundary's argument macros are the only casts between NCCL's pointers and the plugin's
//! objects. A body checks its arguments, calls the version-independent API ([`crate::api`]),
//! and writes its out-parameters only on success.
//!
//! Tests reach a table in-process through its static: `ffi::v12::ncclNetPlugin_v12.get()` is
//! the `&'static ncclNet_v12_t` NCCL reads ([`boundary::Table::get`]).
//!
//! Adding a version N: a section in `nccl-headers/verbsnet_net.h`, its layout asserts in
//! [`abi`], an adapter `vN.rs` (its table and, if its properties struct is new, a
//! `shim::FromProps` impl), its table type in `boundary`'s `NetTable` list, and
//! `ncclNetPlugin_vN` in `exports.map`.

pub mod abi;
pub mod boundary;
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
