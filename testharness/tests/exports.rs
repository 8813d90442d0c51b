//! The built plugin's dynamic symbol table and dependencies, as NCCL's loader sees them:
//! exactly the function tables `ncclNetPlugin_v7` … `ncclNetPlugin_v12` (via the version script) and no link-time dependency on libibverbs (it is loaded with dlopen, so hosts without rdma-core run tcp).
//! Needs binutils (`nm`, `readelf`) and the plugin built in the same profile.
use std::path::PathBuf;
use std::process::Command;

fn plugin() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_verbsnet-perf"));
    let so = exe.parent().expect("dir").join("libnccl_net_verbsnet.so");
    assert!(
        so.exists(),
        "{} is missing: run `cargo build` for the workspace first",
        so.display()
    );
    so
}

fn run(cmd: &str, args: &[&str]) -> String {
    let o = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        o.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn only_the_plugin_tables_are_exported() {
    let so = plugin();
    let out = run("nm", &["-D", "--defined-only", so.to_str().unwrap()]);
    let mut names: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        vec![
            "ncclNetPlugin_v10",
            "ncclNetPlugin_v11",
            "ncclNetPlugin_v12",
            "ncclNetPlugin_v7",
            "ncclNetPlugin_v8",
            "ncclNetPlugin_v9"
        ],
        "{out}"
    );
}

#[test]
fn no_libibverbs_needed_entry() {
    let so = plugin();
    let out = run("readelf", &["-d", so.to_str().unwrap()]);
    let needed: Vec<&str> = out.lines().filter(|l| l.contains("(NEEDED)")).collect();
    assert!(!needed.is_empty(), "{out}");
    assert!(
        needed
            .iter()
            .all(|l| !l.contains("libibverbs") && !l.contains("librdmacm")),
        "{needed:?}"
    );
}
