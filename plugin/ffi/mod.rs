//! The C boundary: the exported `ncclNetPlugin_v8` table and its shims.
//!
//! Every entry point catches panics (a panic never crosses into NCCL: it is logged as WARN
//! and returned as `ncclInternalError`), writes out-parameters only on success, and maps
//! errors to `ncclResult_t`.

pub mod abi;
pub mod logger;
pub mod mem;

mod plugin;
