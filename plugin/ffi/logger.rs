//! The one call into NCCL's printf-variadic logger (`ncclDebugLogger_t`).
//!
//! [`crate::log`] decides level, flags and text; this module only makes the C call, always
//! with the constant format `"%s"` and the message as the single vararg, so text from users
//! or peers is never interpreted as a format.

use std::ffi::CStr;
use std::os::raw::{c_int, c_ulong};

use super::abi::{ncclDebugLogLevel, ncclDebugLogger_t};

/// Calls `logger(level, flags, file, line, "%s", message)`; does nothing when `logger` is
/// `None`.
pub fn call(
    logger: ncclDebugLogger_t,
    level: ncclDebugLogLevel::Type,
    flags: c_ulong,
    file: &CStr,
    line: c_int,
    message: &CStr,
) {
    let Some(logger) = logger else {
        return;
    };
    // SAFETY: a Rust function pointer is never dangling (validity invariant), and the only
    // non-test source of this one is the `logFunction` NCCL passes to `init`, which NCCL keeps
    // alive for the plugin's lifetime. Its contract is printf's: we pass the constant,
    // NUL-terminated format "%s" and exactly one vararg, a `*const c_char` to a NUL-terminated
    // string; `file` is NUL-terminated too. All three outlive the call, and NCCL copies the
    // text (vsnprintf into its own buffer) before returning.
    unsafe {
        logger(
            level,
            flags,
            file.as_ptr(),
            line,
            c"%s".as_ptr(),
            message.as_ptr(),
        )
    }
}
