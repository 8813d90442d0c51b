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

use crate::conn::Connecting;

/// Leaks a connect state so its address can ride in NCCL's handle between `connect` calls.
pub(crate) fn park_connecting(c: Box<Connecting>) -> usize {
    Box::into_raw(c) as usize
}

/// Takes back a state leaked by [`park_connecting`]. The caller (conn.rs) only passes
/// addresses it found in its registry of parked states, removing them there first, so each
/// address is reclaimed at most once.
pub(crate) fn unpark_connecting(ptr: usize) -> Box<Connecting> {
    // SAFETY: ptr came from Box::into_raw in park_connecting and was registered; the registry
    // hands each address out once (see conn::Connecting::resume_or_start).
    unsafe { Box::from_raw(ptr as *mut Connecting) }
}

#[cfg(test)]
mod tests;
