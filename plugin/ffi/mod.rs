//! The C boundary: the exported `ncclNetPlugin_v8` table and its shims.
//!
//! Every entry point catches panics (a panic never crosses into NCCL: it is logged as WARN
//! and returned as `ncclInternalError`), writes out-parameters only on success, and maps
//! errors to `ncclResult_t`.

pub mod abi;
pub mod logger;
pub mod mem;

pub(crate) mod plugin;

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
