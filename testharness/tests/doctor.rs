//! End-to-end: `verbsnet-perf doctor` on this host (tcp transport) through the real plugin,
//! healthy and with provoked faults, each asserting the check's verdict, its fix text and the
//! exit status (0 ok, 1 warnings, 2 failures). The same faults on rxe run in the soft-RoCE VM
//! suite (`testharness/softroce/vm-suite.sh`, steps `doctor_*`).
//!
//! Build the plugin in the same profile first: `cargo build --release` at the root.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_verbsnet-perf"))
}

fn plugin() -> PathBuf {
    let so = exe().parent().unwrap().join("libnccl-net-verbsnet.so");
    assert!(
        so.exists(),
        "{} is missing: build the plugin first (cargo build [--release] at the root)",
        so.display()
    );
    so
}

/// A doctor command with a clean, healthy environment: every VERBSNET_*/NCCL_* variable of
/// the caller removed, the plugin by absolute path, NCCL_NET set, tcp on loopback, and a
/// small connection count so the memlock estimate fits an unprivileged 8 MiB limit too.
fn doctor(args: &[&str]) -> Command {
    let mut c = Command::new(exe());
    for (k, _) in std::env::vars() {
        if k.starts_with("VERBSNET_") || k.starts_with("NCCL_") {
            c.env_remove(k);
        }
    }
    c.arg("doctor")
        .args(["--interval", "0.1", "--comms", "1"])
        .args(args)
        .env("NCCL_NET_PLUGIN", plugin())
        .env("NCCL_NET", "verbsnet")
        .env("NCCL_BUFFSIZE", "1048576")
        .env("VERBSNET_TRANSPORT", "tcp")
        .env("VERBSNET_SOCKET_ADDR", "127.0.0.1");
    c
}

fn show(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs with `--json`; returns the output and the parsed object.
fn run_json(mut c: Command) -> (Output, Value) {
    let o = c.arg("--json").output().expect("run verbsnet-perf doctor");
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text
        .lines()
        .last()
        .unwrap_or_else(|| panic!("no output\n{}", show(&o)));
    let v: Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {line}\n{}", show(&o)));
    (o, v)
}

/// The check called `name`.
fn check<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name:?} in {v:#}"))
}

fn assert_check(v: &Value, name: &str, verdict: &str, fix_part: &str) {
    let c = check(v, name);
    assert_eq!(c["verdict"], verdict, "{name}: {c:#}");
    assert!(
        c["fix"].as_str().unwrap().contains(fix_part),
        "{name}: fix {:?} lacks {fix_part:?}",
        c["fix"]
    );
}

#[test]
fn healthy_host_exits_0_with_one_line_per_check() {
    let o = doctor(&[]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    for name in [
        "plugin.load",
        "plugin.abi",
        "nccl.net",
        "config",
        "plugin.init",
        "plugin.devices",
        "transport",
        "memlock",
        "counters",
    ] {
        assert!(
            out.lines()
                .any(|l| l.starts_with("ok   ") && l[5..].starts_with(name)),
            "no ok line for {name}:\n{out}"
        );
    }
    assert!(out.contains("NCCL takes ncclNetPlugin_v"), "{out}");
    assert!(out.contains("tcp0"), "{out}");
    assert!(
        out.lines().last().unwrap().contains("0 warn, 0 fail"),
        "{out}"
    );

    let (o, v) = run_json(doctor(&[]));
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(v["verdict"], "ok");
    assert_eq!(v["exit"], 0);
    assert_eq!(v["fail"], 0);
    for c in v["checks"].as_array().unwrap() {
        for k in ["name", "verdict", "observed", "expected", "fix"] {
            assert!(c[k].is_string(), "{k} missing in {c}");
        }
    }
    assert!(check(&v, "transport")["observed"]
        .as_str()
        .unwrap()
        .starts_with("VERBSNET_TRANSPORT=tcp: tcp (tcp0)"));
}

#[test]
fn nccl_net_unset_or_wrong() {
    let mut c = doctor(&[]);
    c.env_remove("NCCL_NET");
    let (o, v) = run_json(c);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert_check(&v, "nccl.net", "warn", "export NCCL_NET=verbsnet");

    let mut c = doctor(&[]);
    c.env("NCCL_NET", "IB");
    let (o, v) = run_json(c);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert_check(&v, "nccl.net", "fail", "export NCCL_NET=verbsnet");
}

#[test]
fn unresolvable_plugin_fails_with_the_candidates_and_the_fix() {
    let mut c = doctor(&[]);
    c.env("NCCL_NET_PLUGIN", "no-such-plugin-xyz");
    let (o, v) = run_json(c);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert_check(&v, "plugin.load", "fail", "LD_LIBRARY_PATH");
    let seen = check(&v, "plugin.load")["observed"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(seen.contains("libnccl-net-no-such-plugin-xyz.so"), "{seen}");
    assert!(!v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["name"] == "plugin.init"));

    let mut c = doctor(&[]);
    c.env("NCCL_NET_PLUGIN", "/nonexistent/libnccl-net-verbsnet.so");
    let (o, v) = run_json(c);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert_check(&v, "plugin.load", "fail", "absolute path");
}

#[test]
fn plugin_that_only_the_harness_finds_is_a_warning_naming_ld_library_path() {
    // NCCL_NET_PLUGIN unset: NCCL dlopens "verbsnet", then "libnccl-net-verbsnet.so" through
    // the loader's path, which does not include target/<profile>; verbsnet-perf's own
    // fallback (next to the binary) must not count as "NCCL finds it".
    let dir = exe().parent().unwrap().to_path_buf();
    let mut c = doctor(&[]);
    c.env_remove("NCCL_NET_PLUGIN")
        .env_remove("LD_LIBRARY_PATH");
    let (o, v) = run_json(c);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert_check(
        &v,
        "plugin.load",
        "warn",
        &format!("export LD_LIBRARY_PATH={}:$LD_LIBRARY_PATH", dir.display()),
    );
    assert_eq!(check(&v, "plugin.init")["verdict"], "ok");

    // With the directory on LD_LIBRARY_PATH, NCCL's own search finds it.
    let mut c = doctor(&[]);
    c.env_remove("NCCL_NET_PLUGIN").env("LD_LIBRARY_PATH", &dir);
    let (o, v) = run_json(c);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(check(&v, "plugin.load")["verdict"], "ok");

    // NCCL resolving to another copy than the build next to this binary is named.
    let other = std::env::temp_dir().join(format!("verbsnet-doctor-copy-{}", std::process::id()));
    std::fs::create_dir_all(&other).unwrap();
    let copy = other.join("libnccl-net-verbsnet.so");
    std::fs::copy(plugin(), &copy).unwrap();
    let mut c = doctor(&[]);
    c.env("NCCL_NET_PLUGIN", &copy);
    let (o, v) = run_json(c);
    std::fs::remove_dir_all(&other).unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert_check(
        &v,
        "plugin.load",
        "warn",
        &format!("NCCL_NET_PLUGIN={}", plugin().display()),
    );
}

#[test]
fn typo_in_a_knob_is_named_with_the_intended_one() {
    let mut c = doctor(&[]);
    c.env("VERBSNET_RQDEPTH", "512");
    let (o, v) = run_json(c);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert_check(
        &v,
        "env VERBSNET_RQDEPTH",
        "warn",
        "rename it to VERBSNET_RQ_DEPTH",
    );
}

#[test]
fn oversize_depth_fails_config_and_init() {
    let mut c = doctor(&[]);
    c.env("VERBSNET_RQ_DEPTH", "40000");
    let (o, v) = run_json(c);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert_check(
        &v,
        "config",
        "fail",
        "set VERBSNET_RQ_DEPTH to an integer in 1..=32768",
    );
    assert_eq!(check(&v, "plugin.init")["verdict"], "fail");
    // The plugin's WARN reached the doctor through the logger init was given.
    let init = check(&v, "plugin.init")["observed"].as_str().unwrap();
    assert!(
        init.contains("the plugin's WARN") && init.contains("VERBSNET_RQ_DEPTH"),
        "{init}"
    );
}

#[test]
fn wrong_gid_index_fails_config() {
    let mut c = doctor(&[]);
    c.env("VERBSNET_IB_GID_INDEX", "300");
    let (o, v) = run_json(c);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert_check(
        &v,
        "config",
        "fail",
        "set VERBSNET_IB_GID_INDEX to an integer in 0..=255, or -1 for auto",
    );
}

#[test]
fn nccl_ib_variables_name_their_replacement() {
    let mut c = doctor(&[]);
    c.env("NCCL_IB_SL", "3").env("NCCL_IB_PKEY", "1");
    let (o, v) = run_json(c);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert_check(&v, "env NCCL_IB_SL", "warn", "VERBSNET_IB_SL");
    assert_check(&v, "env NCCL_IB_PKEY", "warn", "unset NCCL_IB_PKEY");
}

/// CapEff of this process has CAP_IPC_LOCK (bit 14).
fn have_ipc_lock() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        })
        .is_some_and(|b| b & (1 << 14) != 0)
}

#[test]
fn low_memlock_without_cap_ipc_lock_is_named_with_the_limit_and_the_fix() {
    // A child with RLIMIT_MEMLOCK 64 KiB (prlimit) and, when we are root, without
    // CAP_IPC_LOCK (setpriv drops it from the bounding and inheritable sets before exec).
    let c = doctor(&["--comms", "4"]);
    let inner: Vec<String> = std::iter::once(c.get_program().to_string_lossy().into_owned())
        .chain(c.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect();
    let mut wrapped = Command::new("prlimit");
    wrapped.arg("--memlock=65536:65536");
    if have_ipc_lock() {
        wrapped.args([
            "setpriv",
            "--inh-caps=-ipc_lock",
            "--bounding-set=-ipc_lock",
        ]);
    }
    wrapped.args(&inner);
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => wrapped.env(k, v),
            None => wrapped.env_remove(k),
        };
    }
    let (o, v) = run_json(wrapped);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert_check(&v, "memlock", "warn", "ulimit -l unlimited");
    let seen = check(&v, "memlock")["observed"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(seen.contains("RLIMIT_MEMLOCK 64 KiB"), "{seen}");
    assert!(seen.contains("CAP_IPC_LOCK no"), "{seen}");
    assert!(seen.contains("4 connection(s)"), "{seen}");
    assert!(seen.contains("would fail at connect"), "{seen}");
}

#[test]
fn hardware_counters_are_read_from_sysfs() {
    let root = std::env::temp_dir().join(format!("verbsnet-doctor-sysfs-{}", std::process::id()));
    let hw = root.join("class/infiniband/fake0/ports/1/hw_counters");
    std::fs::create_dir_all(&hw).unwrap();
    std::fs::write(hw.join("rcvd_rnr_err"), "7\n").unwrap();
    std::fs::write(hw.join("out_of_seq_request"), "0\n").unwrap();
    let (o, v) = run_json({
        let mut c = doctor(&["--sysfs"]);
        c.arg(&root);
        c
    });
    std::fs::remove_dir_all(&root).unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let c = check(&v, "counters fake0:1");
    assert_eq!(c["verdict"], "ok");
    assert!(
        c["observed"]
            .as_str()
            .unwrap()
            .contains("since boot: rcvd_rnr_err=7"),
        "{c}"
    );
}

#[test]
fn peer_test_connects_through_the_plugin_and_measures() {
    let mut l = doctor(&[
        "--listen",
        "127.0.0.1:0",
        "--pings",
        "50",
        "--bw-bytes",
        "4M",
        "--timeout",
        "60",
    ]);
    let mut listener = l
        .arg("--json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(listener.stderr.take().unwrap());
    let t0 = Instant::now();
    let port = loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 || t0.elapsed() > Duration::from_secs(60) {
            let _ = listener.kill();
            panic!("the listener never said where it listens");
        }
        if let Some(rest) = line.split("listening on 127.0.0.1:").nth(1) {
            break rest.split(' ').next().unwrap().to_string();
        }
    };
    let (o, v) = run_json(doctor(&[
        "--peer",
        &format!("127.0.0.1:{port}"),
        "--pings",
        "50",
        "--bw-bytes",
        "4M",
    ]));
    let lo = listener.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(lo.status.code(), Some(0), "{}", show(&lo));
    for name in [
        "peer.transport",
        "peer.mtu",
        "peer.connect",
        "peer.latency",
        "peer.bandwidth",
    ] {
        assert_eq!(check(&v, name)["verdict"], "ok", "{name}: {v:#}");
    }
    let lat = check(&v, "peer.latency")["observed"].as_str().unwrap();
    let us: f64 = lat.split(' ').next().unwrap().parse().unwrap();
    assert!(us > 0.0, "{lat}");
    let bw = check(&v, "peer.bandwidth")["observed"].as_str().unwrap();
    assert!(bw.contains("4.0 MiB"), "{bw}");
    // The listener prints the same numbers.
    let lv: Value =
        serde_json::from_str(String::from_utf8_lossy(&lo.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(
        check(&lv, "peer.latency")["observed"],
        check(&v, "peer.latency")["observed"]
    );
}

#[test]
fn peer_that_never_answers_fails_with_a_fix() {
    // A port nobody listens on (bound, then closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (o, v) = run_json(doctor(&[
        "--peer",
        &format!("127.0.0.1:{port}"),
        "--timeout",
        "1",
    ]));
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert_check(&v, "peer.connect", "fail", "doctor --listen");
}
