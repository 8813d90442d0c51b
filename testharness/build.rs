//! Builds the C half of verbsnet-perf's logger (`csrc/nccl_logger.c`): the function with NCCL's
//! C-variadic `ncclDebugLogger_t` signature that `init` gets (stable Rust cannot define one).

fn main() {
    println!("cargo:rerun-if-changed=csrc/nccl_logger.c");
    cc::Build::new()
        .file("csrc/nccl_logger.c")
        .warnings(true)
        .extra_warnings(true)
        .compile("vnperf_nccl_logger");
}
