//! The one call into NCCL's printf-variadic logger (`ncclDebugLogger_t`).
//!
//! [`crate::log`] decides level, flags and text; this module only makes the C call, always
//! with the constant format `"%s"` and the message as the single vararg, so text from users
//! or peers is never interpreted as a format.

use std::ffi::CStr;
use std::os::raw::{c_int, c_ulong};
use std::sync::Arc;

use super::abi::{ncclDebugLogLevel, ncclDebugLogSubSys, ncclDebugLogger_t};
use crate::log::{Logger, NcclLevel, NcclSink, NcclSubsys};

/// NCCL's `logFunction` as the plugin's [`NcclSink`]: maps [`crate::log`]'s levels and
/// subsystems to `ncclDebugLogLevel` / `ncclDebugLogSubSys` and makes the C call.
struct NcclLogger(ncclDebugLogger_t);

/// The [`Logger`] for the `logFunction` NCCL passed to `init` (`None` for NULL).
pub fn sink(logger: ncclDebugLogger_t) -> Logger {
    logger.map(|f| Arc::new(NcclLogger(Some(f))) as Arc<dyn NcclSink>)
}

/// NCCL's level and flags for a line.
pub(crate) fn abi_level_flags(
    level: NcclLevel,
    subsys: NcclSubsys,
) -> (ncclDebugLogLevel::Type, c_ulong) {
    let net = ncclDebugLogSubSys::NCCL_NET as c_ulong;
    let flags = match subsys {
        // NCCL_ALL is the C int ~0; widening sign-extends it to all 64 bits.
        NcclSubsys::All => ncclDebugLogSubSys::NCCL_ALL as c_ulong,
        NcclSubsys::Net => net,
        NcclSubsys::InitNet => ncclDebugLogSubSys::NCCL_INIT as c_ulong | net,
    };
    let level = match level {
        NcclLevel::Warn => ncclDebugLogLevel::NCCL_LOG_WARN,
        NcclLevel::Info => ncclDebugLogLevel::NCCL_LOG_INFO,
        NcclLevel::Trace => ncclDebugLogLevel::NCCL_LOG_TRACE,
    };
    (level, flags)
}

impl NcclSink for NcclLogger {
    fn log(&self, level: NcclLevel, subsys: NcclSubsys, file: &CStr, line: u32, text: &CStr) {
        let (level, flags) = abi_level_flags(level, subsys);
        call(
            self.0,
            level,
            flags,
            file,
            c_int::try_from(line).unwrap_or(0),
            text,
        );
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// NCCL's values (`nccl_common.h`): WARN 2, INFO 3, TRACE 5; NCCL_INIT 0x1, NCCL_NET 0x10,
    /// NCCL_ALL ~0.
    #[test]
    fn levels_and_subsystems_have_nccls_values() {
        use NcclLevel::{Info, Trace, Warn};
        use NcclSubsys::{All, InitNet, Net};
        assert_eq!(abi_level_flags(Warn, All), (2, c_ulong::MAX));
        assert_eq!(abi_level_flags(Info, InitNet), (3, 0x11));
        assert_eq!(abi_level_flags(Info, Net), (3, 0x10));
        assert_eq!(abi_level_flags(Trace, Net), (5, 0x10));
        assert!(sink(None).is_none());
    }
}
