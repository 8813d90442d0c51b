//! Builds the C parts of the harness:
//! - `csrc/nccl_logger.c`, linked in: the function with NCCL's C-variadic `ncclDebugLogger_t`
//!   signature that `init` gets (stable Rust cannot define one);
//! - `fixtures/fixture_net.c`, two shared libraries for the tests (`tests/fixture.rs`): a
//!   plugin that behaves like other NCCL net plugins where the contract allows
//!   (`libnccl-net-fixture.so`, ncclNetPlugin_v8 and _v6), the same with only the v6 table
//!   (`libnccl-net-fixture6.so`) and with a v11 table too, whose `init` leaves the context
//!   NULL and which has a `makeVDevice` (`libnccl-net-fixture11.so`). Their paths reach the tests as `FIXTURE_NET_SO`,
//!   `FIXTURE_NET_V6_SO` and `FIXTURE_NET_V11_SO`.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=csrc/nccl_logger.c");
    println!("cargo:rerun-if-changed=fixtures/fixture_net.c");
    println!("cargo:rerun-if-changed=../nccl-headers/verbsnet_net.h");
    cc::Build::new()
        .file("csrc/nccl_logger.c")
        .warnings(true)
        .extra_warnings(true)
        .compile("vnperf_nccl_logger");

    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let compiler = cc::Build::new().get_compiler();
    for (env, file, defines) in [
        ("FIXTURE_NET_SO", "libnccl-net-fixture.so", &[][..]),
        (
            "FIXTURE_NET_V6_SO",
            "libnccl-net-fixture6.so",
            &["-DFIXTURE_V6_ONLY"][..],
        ),
        (
            "FIXTURE_NET_V11_SO",
            "libnccl-net-fixture11.so",
            &["-DFIXTURE_V11"][..],
        ),
    ] {
        let so = out.join(file);
        let status = Command::new(compiler.path())
            .args([
                "-shared", "-fPIC", "-O2", "-g", "-Wall", "-Wextra", "-Werror",
            ])
            .args(defines)
            .args(["-I", "../nccl-headers", "fixtures/fixture_net.c", "-o"])
            .arg(&so)
            .arg("-lpthread")
            .status()
            .unwrap_or_else(|e| panic!("run {}: {e}", compiler.path().display()));
        assert!(status.success(), "building {file} failed");
        println!("cargo:rustc-env={env}={}", so.display());
    }
}
