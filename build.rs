//! Build script for the verbsnet plugin.
//!
//! 1. Runs bindgen over our own ABI header (`nccl-headers/verbsnet_net.h`, one section per
//!    ABI version v7 … v12) into `$OUT_DIR/nccl_net.rs`, included by `plugin/ffi/abi.rs`
//!    (which asserts every table's and properties struct's layout at compile time).
//! 2. Restricts the cdylib's dynamic symbol table to `ncclNetPlugin_v7` … `ncclNetPlugin_v12`
//!    with a linker version script (`plugin/ffi/exports.map`).
//! 3. Links the cdylib with `-z nodelete` (see the comment at the flag).
//! 4. Cargo cannot put a dash in a library file name, so the cdylib is produced as
//!    `libnccl_net_verbsnet.so`; NCCL looks for `libnccl-net-<NCCL_NET_PLUGIN>.so`
//!    (ext-net plugin loading rules). We create the symlink
//!    `target/<profile>/libnccl-net-verbsnet.so -> libnccl_net_verbsnet.so` next to it.
use std::env;
use std::path::PathBuf;

fn main() {
    let header = "nccl-headers/verbsnet_net.h";
    println!("cargo:rerun-if-changed={header}");
    println!("cargo:rerun-if-changed=plugin/ffi/exports.map");

    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let bindings = bindgen::Builder::default()
        .header(header)
        .allowlist_type("nccl.*")
        .allowlist_var("NCCL_.*")
        .rustified_enum("ncclResult_t")
        .constified_enum_module("ncclDebugLogLevel")
        .constified_enum_module("ncclDebugLogSubSys")
        .constified_enum_module("ncclNetDeviceType")
        .derive_default(true)
        .layout_tests(false)
        .generate()
        .expect("bindgen over nccl-headers/verbsnet_net.h (needs libclang-dev)");
    bindings
        .write_to_file(out.join("nccl_net.rs"))
        .expect("write bindings");

    let map = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("plugin/ffi/exports.map");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
    // 4. `-z nodelete`: NCCL 2.28+ dlcloses the plugin after its last communicator and dlopens it
    //    again for the next (NCCL_NET_PLUGIN_REF_COUNT=0). A Rust library cannot hand back its
    //    process-wide state (the global `tracing` subscriber, std's internals), so a real unload
    //    would leave that behind on every cycle (~34 KB of heap measured before this flag). Kept
    //    mapped, the library makes that state once per process; everything a communicator uses
    //    (verbs contexts, PDs, QPs, sockets) is released by its `finalize` (plugin/api.rs), and
    //    the 100-cycle test (testharness/tests/lifecycle.rs) checks heap, fds and threads.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");

    // OUT_DIR = target/<profile>/build/verbsnet-<hash>/out
    if let Some(profile_dir) = out.ancestors().nth(3) {
        let link = profile_dir.join("libnccl-net-verbsnet.so");
        if std::fs::symlink_metadata(&link).is_err() {
            let _ = std::os::unix::fs::symlink("libnccl_net_verbsnet.so", &link);
        }
    }
}
