//! Finding and opening the plugin library as NCCL does (`NCCL_NET_PLUGIN` naming rules,
//! `dlopen(RTLD_NOW | RTLD_LOCAL)`), and what the loader can tell about it.

use std::ffi::{c_char, c_void, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use libloading::os::unix::{Library, Symbol};

use super::{Error, Result};

/// The file names NCCL passes to `dlopen` for an `NCCL_NET_PLUGIN` value, in order: the value
/// verbatim, then `libnccl-net-<value>.so` unless the value contains '/' or already has the
/// form `lib*.so`.
pub fn plugin_candidates(value: &str) -> Vec<String> {
    let mut names = vec![value.to_string()];
    let lib_form = value.starts_with("lib") && value.ends_with(".so");
    if !value.contains('/') && !lib_form {
        names.push(format!("libnccl-net-{value}.so"));
    }
    names
}

/// Where the harness looks, in order: the NCCL candidates through the dynamic loader's search
/// path, then each candidate without '/' inside `exe_dir` (so `cargo run` finds the plugin next
/// to the binary in `target/<profile>/`).
pub fn search_order(value: &str, exe_dir: Option<&Path>) -> Vec<String> {
    let names = plugin_candidates(value);
    let mut order = names.clone();
    if let Some(dir) = exe_dir {
        for name in names.iter().filter(|n| !n.contains('/')) {
            order.push(dir.join(name).to_string_lossy().into_owned());
        }
    }
    order
}

/// Whether the table name satisfies `NCCL_NET` (case-insensitive, as NCCL's strcasecmp).
pub fn name_matches(found: &str, wanted: &str) -> bool {
    found.eq_ignore_ascii_case(wanted)
}

/// What [`probe`] found for an `NCCL_NET_PLUGIN` value.
#[derive(Clone, Debug)]
pub struct Probe {
    /// The candidate that loaded (as passed to `dlopen`).
    pub candidate: String,
    /// The file the loader mapped.
    pub path: PathBuf,
    /// Those of the asked symbols that the library exports, in the order asked.
    pub found: Vec<String>,
    /// Failed candidates before it, with the loader's message.
    pub tried: Vec<(String, String)>,
}

/// Loads the plugin as [`Net::load`](super::Net::load) does (same candidates, same flags) and reports which of
/// `symbols` it exports, without calling anything in it (for `verbsnet-perf doctor`, which
/// probes `ncclNetPlugin_v12` … `_v6` in NCCL's order).
///
/// # Errors
/// [`Error::NotFound`] when no candidate loads.
pub fn probe(value: &str, exe_dir: Option<&Path>, symbols: &[&str]) -> Result<Probe> {
    let Opened {
        candidate,
        lib,
        tried,
    } = open_first(value, exe_dir)?;
    let mut found = Vec::new();
    let mut path = None;
    for sym in symbols {
        // SAFETY: only the symbol's address is taken; nothing is read or called.
        let s: std::result::Result<Symbol<*const c_void>, _> = unsafe { lib.get(sym.as_bytes()) };
        if let Ok(s) = s {
            path = path.or_else(|| loaded_path(*s));
            found.push((*sym).to_string());
        }
    }
    Ok(Probe {
        path: path.unwrap_or_else(|| PathBuf::from(&candidate)),
        candidate,
        found,
        tried,
    })
}

/// The first candidate that loaded ([`open_first`]).
pub(crate) struct Opened {
    /// The candidate as passed to `dlopen`.
    pub(crate) candidate: String,
    pub(crate) lib: Library,
    /// Candidates that failed before it, with the loader's message.
    pub(crate) tried: Vec<(String, String)>,
}

/// `dlopen`s the candidates of `value` in NCCL's order ([`search_order`], `RTLD_NOW |
/// RTLD_LOCAL`) and returns the first that loads, its library, and the failures before it.
///
/// # Errors
/// [`Error::NotFound`] listing every candidate tried, when none loads.
pub(crate) fn open_first(value: &str, exe_dir: Option<&Path>) -> Result<Opened> {
    let mut tried = Vec::new();
    for candidate in search_order(value, exe_dir) {
        // SAFETY: loading a library runs its initialisers. The plugin is a Rust cdylib whose
        // only initialisers are the standard library's; this is exactly what NCCL does.
        let opened = unsafe {
            Library::open(
                Some(OsStr::new(&candidate)),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            )
        };
        match opened {
            Ok(lib) => {
                return Ok(Opened {
                    candidate,
                    lib,
                    tried,
                })
            }
            Err(e) => tried.push((candidate, e.to_string())),
        }
    }
    Err(Error::NotFound {
        value: value.to_string(),
        tried,
    })
}

/// Bytes of heap the process's allocator has handed out and not got back (glibc
/// `mallinfo2().uordblks`): the measure of the leak checks across plugin load cycles.
pub fn heap_in_use_bytes() -> usize {
    // SAFETY: mallinfo2 only reads the allocator's statistics and returns them by value.
    unsafe { libc::mallinfo2() }.uordblks
}

/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
pub(crate) unsafe fn opt_cstr(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        // SAFETY: guaranteed by the caller.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

/// The path of the object that contains `addr`, as the dynamic loader names it.
pub(crate) fn loaded_path(addr: *const c_void) -> Option<PathBuf> {
    // SAFETY: an all-zero Dl_info is a valid value (NULL pointers, zero integers).
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `addr` is an address inside a loaded object; `info` is a valid out-pointer.
    let found = unsafe { libc::dladdr(addr, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr returned a NUL-terminated path owned by the loader.
    let bytes = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    Some(PathBuf::from(OsStr::from_bytes(bytes)))
}
