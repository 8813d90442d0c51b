//! `libibverbs.so.1`, opened at run time.
//!
//! The plugin must load on hosts without rdma-core, so it never links libibverbs: the control-path
//! verbs that libibverbs exports are looked up here with `dlopen`/`dlsym` (through `libloading`)
//! and called through the resulting function pointers. The types come from `rdma-sys`, whose
//! structs and constants add no dynamic dependency. The data-path verbs (`ibv_post_send`,
//! `ibv_post_recv`, `ibv_poll_cq`) are inline functions in `verbs.h` that jump through the
//! context's ops table; rdma-sys implements them the same way, so they need no symbol either.

use std::os::raw::{c_char, c_int, c_void};
use std::sync::OnceLock;

use libloading::Library;
use rdma_sys::{
    ibv_comp_channel, ibv_context, ibv_cq, ibv_device, ibv_device_attr, ibv_gid, ibv_mr, ibv_pd,
    ibv_port_attr, ibv_qp, ibv_qp_attr, ibv_qp_init_attr,
};

use crate::transport::TransportError;

/// The soname we open (the runtime package, not the `-dev` one).
pub(crate) const LIBRARY: &str = "libibverbs.so.1";

/// Function pointers into `libibverbs.so.1`; valid for the life of the process (the library is
/// never closed: it lives in a `static`).
pub(crate) struct Verbs {
    _lib: Library,
    pub(crate) get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub(crate) free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub(crate) get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub(crate) open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub(crate) close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub(crate) query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    /// The exported (not the inline) `ibv_query_port`; it fills the `ibv_port_attr` prefix that
    /// the provider knows. Callers pass a zeroed, full-size struct.
    pub(crate) query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub(crate) query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub(crate) alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub(crate) dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub(crate) reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    pub(crate) dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub(crate) create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut ibv_comp_channel,
        c_int,
    ) -> *mut ibv_cq,
    pub(crate) destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub(crate) create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub(crate) modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub(crate) destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    /// `ibv_query_port_speed(context, port_num, *speed)` (rdma-core 62+, symbol version
    /// `IBVERBS_1.16`): the port's effective bandwidth in units of 100 Mb/s; `None` where the
    /// library predates it. Returns 0 or an errno value (`EOPNOTSUPP` from providers without
    /// it, e.g. rxe). NCCL IB reads it first (`src/misc/ibvsymbols.cc`, `net_ib/init.cc`).
    pub(crate) query_port_speed:
        Option<unsafe extern "C" fn(*mut ibv_context, u32, *mut u64) -> c_int>,
}

static VERBS: OnceLock<Result<Verbs, String>> = OnceLock::new();

/// The loaded library, opened on first use.
///
/// # Errors
/// [`TransportError::Unavailable`] naming the library and the packages that provide it, when it
/// cannot be opened or lacks a symbol.
pub(crate) fn verbs() -> Result<&'static Verbs, TransportError> {
    VERBS
        .get_or_init(|| load(LIBRARY))
        .as_ref()
        .map_err(|e| TransportError::Unavailable(e.clone()))
}

fn load(soname: &str) -> Result<Verbs, String> {
    // SAFETY: loading libibverbs runs its ELF constructors, which only initialise the library's
    // own state (no user-visible side effects beyond reading its config directory).
    let lib = unsafe { Library::new(soname) }.map_err(|e| {
        format!(
            "cannot load {soname} ({e}); install the RDMA user-space libraries: \
             libibverbs1 and ibverbs-providers on Debian/Ubuntu, rdma-core (libibverbs) on \
             RHEL/Fedora/SUSE"
        )
    })?;
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the symbol is the libibverbs function of that name, whose C prototype
            // (verbs.h, rdma-core >= 1.1 ABI) matches the field's function-pointer type; the
            // pointer stays valid because `lib` is stored next to it and never unloaded.
            let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{soname} has no {}: {e}", $name))?;
            *s
        }};
    }
    Ok(Verbs {
        get_device_list: sym!("ibv_get_device_list"),
        free_device_list: sym!("ibv_free_device_list"),
        get_device_name: sym!("ibv_get_device_name"),
        open_device: sym!("ibv_open_device"),
        close_device: sym!("ibv_close_device"),
        query_device: sym!("ibv_query_device"),
        query_port: sym!("ibv_query_port"),
        query_gid: sym!("ibv_query_gid"),
        alloc_pd: sym!("ibv_alloc_pd"),
        dealloc_pd: sym!("ibv_dealloc_pd"),
        reg_mr: sym!("ibv_reg_mr"),
        dereg_mr: sym!("ibv_dereg_mr"),
        create_cq: sym!("ibv_create_cq"),
        destroy_cq: sym!("ibv_destroy_cq"),
        create_qp: sym!("ibv_create_qp"),
        modify_qp: sym!("ibv_modify_qp"),
        destroy_qp: sym!("ibv_destroy_qp"),
        // SAFETY: as for sym!; the prototype is verbs.h's (rdma-core 62+). Optional: older
        // libraries do not export it.
        query_port_speed: unsafe { lib.get(b"ibv_query_port_speed\0") }
            .ok()
            .map(|s| *s),
        _lib: lib,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_names_the_packages() {
        let Err(e) = load("libibverbs-verbsnet-missing.so.1") else {
            panic!("loaded a library that does not exist");
        };
        assert!(e.contains("libibverbs-verbsnet-missing.so.1"), "{e}");
        assert!(e.contains("libibverbs1") && e.contains("rdma-core"), "{e}");
    }

    #[test]
    fn a_library_without_verbs_is_refused() {
        let Err(e) = load("libc.so.6") else {
            panic!("libc passed for libibverbs");
        };
        assert!(e.contains("has no ibv_get_device_list"), "{e}");
    }
}
