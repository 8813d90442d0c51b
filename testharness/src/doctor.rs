//! `verbsnet-perf doctor`: a preflight that finds the causes of stalls, retry-exceeded errors
//! and start-up failures before a job runs.
//!
//! It loads the plugin the way NCCL does ([`crate::plugin`]: the `NCCL_NET_PLUGIN` rules,
//! `dlopen(RTLD_NOW|RTLD_LOCAL)`), and prints one line per check: `ok`, `warn` or `fail`, the
//! observed value, the expectation and the fix. The checks reuse the plugin crate's own code
//! (the `VERBSNET_*` registry of `config`, the ib transport's device survey and GID choice,
//! the QP settings of `conn::qp_config`, the engine's buffer constants), so the doctor and the
//! plugin cannot disagree. With `--listen` on one host and `--peer HOST:PORT` on the other it
//! also connects through the plugin and measures a ping-pong and a short bandwidth probe.
//!
//! Exit status: 0 (all ok), 1 (warnings), 2 (failures). `--json` prints one JSON object.
//! The verdicts and the symptoms each prevents: `docs/troubleshooting.md`.

use std::collections::BTreeMap;
use std::env;
use std::fmt;
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use nccl_net_verbsnet::config::{self, Config, TransportChoice};
use nccl_net_verbsnet::engine::wire::{CTS_ENTRY_LEN, EAGER_HDR_LEN, MAX_RECVS, REC_SLOTS};
use nccl_net_verbsnet::engine::{CTRL_STAGE_SLOTS, CTS_RING_ENTRIES, MAX_SEND_REQUESTS};
use nccl_net_verbsnet::transport::ib::survey::{self, DeviceSurvey, PortSurvey};
use nccl_net_verbsnet::transport::MAX_SEND_SGE;
use serde_json::{json, Value};

use crate::cli::parse_size;
use crate::plugin::{self, Handle, Net};

/// The plugin tables NCCL looks for, in the order it tries them (NCCL `src/plugin/net.cc`:
/// `getNcclNet[]` runs from v12 down to v6 and takes the first the library exports).
pub const NCCL_NET_SYMBOLS: &[&str] = &[
    "ncclNetPlugin_v12",
    "ncclNetPlugin_v11",
    "ncclNetPlugin_v10",
    "ncclNetPlugin_v9",
    "ncclNetPlugin_v8",
    "ncclNetPlugin_v7",
    "ncclNetPlugin_v6",
];

/// NCCL's default `NCCL_BUFFSIZE` (4 MiB): the SIMPLE-protocol buffer of each connection, which
/// NCCL registers through the plugin's `regMr` (so it is pinned too on ib).
pub const NCCL_DEFAULT_BUFFSIZE: u64 = 4 << 20;

/// `CAP_IPC_LOCK`'s bit in `/proc/self/status` `CapEff` (linux/capability.h).
const CAP_IPC_LOCK_BIT: u32 = 14;

/// Page size the plugin rounds its registered buffers up to (`mem::Region::alloc`).
const PAGE: u64 = 4096;

/// The verdict of one check. Ordered: `Ok < Warn < Fail`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// As expected.
    Ok,
    /// The job may run, but slower, or may fall back or stall under load.
    Warn,
    /// The job will fail or hang.
    Fail,
}

impl Verdict {
    /// `ok`, `warn` or `fail`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        }
    }

    /// The process exit status for a run whose worst verdict is `self`: 0, 1 or 2.
    pub fn exit_code(self) -> i32 {
        self as i32
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// What was checked, e.g. `memlock` or `port rxe0:1`.
    pub name: String,
    /// The verdict.
    pub verdict: Verdict,
    /// What was found.
    pub observed: String,
    /// What a healthy setup has.
    pub expected: String,
    /// The knob, command or limit to change (empty when there is nothing to do).
    pub fix: String,
}

impl Check {
    fn new(name: impl Into<String>, verdict: Verdict, observed: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            verdict,
            observed: observed.into(),
            expected: String::new(),
            fix: String::new(),
        }
    }

    fn expect(mut self, e: impl Into<String>) -> Check {
        self.expected = e.into();
        self
    }

    fn fix(mut self, f: impl Into<String>) -> Check {
        self.fix = f.into();
        self
    }

    /// The text line: `warn nccl.net  unset | expected: ... | fix: ...`.
    pub fn line(&self) -> String {
        let mut s = format!("{:<4} {:<20} {}", self.verdict, self.name, self.observed);
        if !self.expected.is_empty() {
            s.push_str(" | expected: ");
            s.push_str(&self.expected);
        }
        if !self.fix.is_empty() {
            s.push_str(" | fix: ");
            s.push_str(&self.fix);
        }
        s
    }

    /// The JSON object of the check.
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "verdict": self.verdict.as_str(),
            "observed": self.observed,
            "expected": self.expected,
            "fix": self.fix,
        })
    }
}

/// `verbsnet-perf doctor [flags]`.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "verbsnet-perf doctor",
    bin_name = "verbsnet-perf doctor",
    args_override_self = true,
    about = "Checks this host before a job: plugin loading, transport, devices, ports and GIDs, \
             memlock, queue depths against device limits, hardware error counters, environment \
             variables; with --listen/--peer a real connection through the plugin.",
    after_help = "\
Exit status: 0 all checks ok, 1 warnings, 2 failures.

Two hosts:  hostA$ verbsnet-perf doctor --listen 0.0.0.0:29650
            hostB$ verbsnet-perf doctor --peer hostA:29650"
)]
pub struct Args {
    /// Print one JSON object (checks and the overall verdict) instead of the lines.
    #[arg(long)]
    pub json: bool,

    /// Connections this host will open, for the pinned-memory estimate (each one send comm
    /// and one receive comm, plus NCCL's own registered buffers).
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub comms: u64,

    /// Seconds between the two reads of the hardware counters.
    #[arg(long, value_name = "SECONDS", default_value_t = 3.0)]
    pub interval: f64,

    /// Connect to a `doctor --listen` at HOST:PORT through the plugin: path MTU both sides,
    /// ping-pong latency and a short bandwidth probe.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "listen")]
    pub peer: Option<String>,

    /// Wait for one `doctor --peer` on this address (default 0.0.0.0:29650; port 0 picks a
    /// free one, printed on stderr).
    #[arg(long, value_name = "ADDR:PORT", num_args = 0..=1, default_missing_value = "0.0.0.0:29650")]
    pub listen: Option<String>,

    /// Plugin device index for the peer test.
    #[arg(long, default_value_t = 0)]
    pub dev: i32,

    /// Ping-pong round trips (8 bytes each way) of the peer test.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub pings: u32,

    /// Bytes the bandwidth probe sends (in 512 KiB messages, 8 in flight).
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_size)]
    pub bw_bytes: u64,

    /// Seconds the peer test may take (the listener waits this long for its peer).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub timeout: u64,

    /// Test hook: where sysfs is (the hardware counters are read under it).
    #[arg(long, hide = true, default_value = "/sys")]
    pub sysfs: PathBuf,
}

/// Entry point of `verbsnet-perf doctor ARGS...` (`argv[0]` is `doctor`). Returns the exit
/// status.
pub fn main(argv: impl IntoIterator<Item = String>) -> i32 {
    let args = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    if !(args.interval >= 0.0 && args.interval < 3600.0) {
        eprintln!("verbsnet-perf doctor: --interval must be in 0..3600 seconds");
        return 2;
    }
    let env: BTreeMap<String, String> = env::vars().collect();
    let mut report = Report::default();
    let net = local_checks(&args, &env, &mut report);
    if args.peer.is_some() || args.listen.is_some() {
        match &net {
            Some((net, me)) => peer_checks(&args, net, me, &mut report),
            None => report.push(
                Check::new(
                    "peer",
                    Verdict::Fail,
                    "not run: the plugin did not load or init",
                )
                .fix("fix the failures above first"),
            ),
        }
    }
    report.print(args.json);
    report.verdict().exit_code()
}

/// The checks made so far.
#[derive(Debug, Default)]
pub struct Report {
    /// In order.
    pub checks: Vec<Check>,
}

impl Report {
    fn push(&mut self, c: Check) {
        self.checks.push(c);
    }

    /// The worst verdict (`Ok` for none).
    pub fn verdict(&self) -> Verdict {
        self.checks
            .iter()
            .map(|c| c.verdict)
            .max()
            .unwrap_or(Verdict::Ok)
    }

    fn print(&self, json: bool) {
        let v = self.verdict();
        let count = |x| self.checks.iter().filter(|c| c.verdict == x).count();
        let mut out = std::io::stdout().lock();
        if json {
            let obj = json!({
                "verdict": v.as_str(),
                "exit": v.exit_code(),
                "ok": count(Verdict::Ok),
                "warn": count(Verdict::Warn),
                "fail": count(Verdict::Fail),
                "checks": self.checks.iter().map(Check::to_json).collect::<Vec<_>>(),
            });
            let _ = writeln!(out, "{obj}");
        } else {
            for c in &self.checks {
                let _ = writeln!(out, "{}", c.line());
            }
            let _ = writeln!(
                out,
                "doctor: {} ok, {} warn, {} fail: {}",
                count(Verdict::Ok),
                count(Verdict::Warn),
                count(Verdict::Fail),
                match v {
                    Verdict::Ok => "ready",
                    Verdict::Warn => "the job should run; read the warnings",
                    Verdict::Fail => "the job will fail or hang; fix the failures",
                }
            );
        }
    }
}

/// What the local checks learnt about the device the peer test uses.
#[derive(Clone, Debug, Default)]
pub struct Local {
    /// `ib` or `tcp`.
    pub transport: String,
    /// The plugin's device name, e.g. `rxe0:1` or `tcp0`.
    pub device: String,
    /// Active MTU of that port in bytes (ib).
    pub mtu: Option<u32>,
}

/// Runs every check that needs no peer; returns the loaded, initialised plugin (for the peer
/// test) when it loaded.
fn local_checks(
    args: &Args,
    env: &BTreeMap<String, String>,
    report: &mut Report,
) -> Option<(Net, Local)> {
    let get = |k: &str| env.get(k).cloned().filter(|v| !v.is_empty());
    let exe_dir = env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));

    // --- the plugin: resolves, which table, NCCL_NET
    let value = get("NCCL_NET_PLUGIN").unwrap_or_else(|| plugin::DEFAULT_PLUGIN_VALUE.into());
    let loaded = check_plugin_load(&value, exe_dir.as_deref(), report);
    report.push(nccl_net_check(get("NCCL_NET").as_deref()));

    // --- configuration and environment
    let cfg = match Config::from_lookup(|k| get(k)) {
        Ok(c) => {
            report.push(
                Check::new("config", Verdict::Ok, c.describe())
                    .expect("every VERBSNET_* value valid"),
            );
            Some(c)
        }
        Err(e) => {
            let accepted = config::knob(&e.var)
                .map_or_else(|| "a valid value".to_string(), config::Knob::accepted);
            report.push(
                Check::new("config", Verdict::Fail, e.to_string())
                    .expect(format!("{} {accepted}", e.var))
                    .fix(format!(
                        "set {} to {accepted}, or unset it (plugin init fails with this value; \
                         docs/configuration.md)",
                        e.var
                    )),
            );
            None
        }
    };
    for c in unknown_var_checks(env.iter().map(|(k, v)| (k.clone(), v.clone()))) {
        report.push(c);
    }
    for c in nccl_env_checks(|k| get(k)) {
        report.push(c);
    }

    // --- init through the table, as NCCL would
    let net = loaded.and_then(|path| init_plugin(&path, &value, get("NCCL_NET"), report));

    // --- transport, devices, ports, GIDs
    let cfg_for_devices = cfg.clone().unwrap_or_default();
    let surveyed = survey::survey(&cfg_for_devices);
    let mut local = Local::default();
    if let Some((_, devs)) = &net {
        local.device = devs.first().cloned().unwrap_or_default();
        local.transport = if local.device.starts_with("tcp") {
            "tcp".into()
        } else {
            "ib".into()
        };
    }
    let plugin_devs: Vec<String> = net.as_ref().map(|(_, d)| d.clone()).unwrap_or_default();
    report.push(transport_check(
        cfg.as_ref().map(|c| c.transport),
        &surveyed,
        &plugin_devs,
    ));
    if let Ok(devs) = &surveyed {
        for d in devs {
            for c in device_checks(d, cfg.as_ref(), &cfg_for_devices) {
                report.push(c);
            }
            if let Some(p) = d.ports.iter().find(|p| p.label == local.device) {
                local.mtu = p.active_mtu;
            }
        }
    }
    if local.transport == "tcp" {
        report.push(
            Check::new(
                "limits",
                Verdict::Ok,
                "tcp transport: no device queue limits (userspace queues)",
            )
            .expect("depths within the device's max_qp_wr/max_cqe/max_sge (ib only)"),
        );
    }

    // --- pinned memory (when init failed, e.g. on this very limit, by the transport the
    // configuration would pick: ib where a verbs port is usable)
    let usable_port = surveyed.as_ref().is_ok_and(|d| {
        d.iter()
            .flat_map(|d| d.ports.iter())
            .any(|p| p.usable.is_ok())
    });
    let uses_ib = if net.is_some() {
        local.transport == "ib"
    } else {
        match cfg_for_devices.transport {
            TransportChoice::Ib => true,
            TransportChoice::Tcp => false,
            TransportChoice::Auto => usable_port,
        }
    };
    let memlock = read_memlock();
    report.push(memlock_check(
        &cfg_for_devices,
        args.comms,
        nccl_buffsize(get("NCCL_BUFFSIZE").as_deref()),
        memlock,
        uses_ib,
    ));

    // --- hardware counters, read twice
    for c in counter_checks(&args.sysfs, Duration::from_secs_f64(args.interval)) {
        report.push(c);
    }
    net.map(|(n, _)| (n, local))
}

/// Resolves the plugin exactly as NCCL does (no fallback directory) and probes its tables;
/// pushes `plugin.load` and `plugin.abi`. Found only next to this binary (the harness's own
/// fallback, which NCCL does not have) is a `warn`; NCCL resolving to another copy than the one
/// built next to this binary is a `warn` too. Returns what to pass to `Net::load` when a
/// library with `ncclNetPlugin_v8` was found.
fn check_plugin_load(value: &str, exe_dir: Option<&Path>, report: &mut Report) -> Option<String> {
    let shown = if env::var_os("NCCL_NET_PLUGIN").is_some() {
        format!("NCCL_NET_PLUGIN={value}")
    } else {
        format!("NCCL_NET_PLUGIN unset (NCCL loads \"{value}\")")
    };
    let expect = format!(
        "dlopen finds {} (LD_LIBRARY_PATH, the loader's cache, or a path), as NCCL resolves it",
        plugin::plugin_candidates(value).join(" or ")
    );
    let ours = exe_dir
        .map(|d| d.join("libnccl-net-verbsnet.so"))
        .filter(|p| p.exists());
    let canon = |p: &Path| fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let found = match plugin::probe(value, None, NCCL_NET_SYMBOLS) {
        Ok(p) => {
            let at = if p.path == Path::new(&p.candidate) {
                format!("{shown}: {}", p.path.display())
            } else {
                format!(
                    "{shown}: {} (dlopen(\"{}\"))",
                    p.path.display(),
                    p.candidate
                )
            };
            let c = match &ours {
                Some(o) if canon(o) != canon(&p.path) => Check::new(
                    "plugin.load",
                    Verdict::Warn,
                    format!(
                        "{at}: NCCL resolves to that file, not to the build next to this \
                         verbsnet-perf ({})",
                        o.display()
                    ),
                )
                .expect(expect)
                .fix(format!(
                    "make sure the file NCCL loads is the one you built: NCCL_NET_PLUGIN={}",
                    o.display()
                )),
                _ => Check::new("plugin.load", Verdict::Ok, at).expect(expect),
            };
            report.push(c);
            p
        }
        Err(e) => {
            let tried = match &e {
                plugin::Error::NotFound { tried, .. } => tried
                    .iter()
                    .map(|(what, why)| format!("{what}: {why}"))
                    .collect::<Vec<_>>()
                    .join("; "),
                other => other.to_string(),
            };
            let fallback = plugin::probe(value, exe_dir, NCCL_NET_SYMBOLS)
                .ok()
                .filter(|p| p.path.is_absolute());
            match fallback {
                Some(p) => {
                    let dir = p
                        .path
                        .parent()
                        .unwrap_or(Path::new("."))
                        .display()
                        .to_string();
                    report.push(
                        Check::new(
                            "plugin.load",
                            Verdict::Warn,
                            format!(
                                "{shown}: NCCL would not find it ({tried}); only verbsnet-perf \
                                 finds {} next to itself",
                                p.path.display()
                            ),
                        )
                        .expect(expect)
                        .fix(format!(
                            "export LD_LIBRARY_PATH={dir}:$LD_LIBRARY_PATH, or \
                             NCCL_NET_PLUGIN={}",
                            p.path.display()
                        )),
                    );
                    plugin::Probe {
                        candidate: p.path.display().to_string(),
                        ..p
                    }
                }
                None => {
                    report.push(
                        Check::new(
                            "plugin.load",
                            Verdict::Fail,
                            format!("{shown}: not found ({tried})"),
                        )
                        .expect(expect)
                        .fix(
                            "cargo build --release, then export \
                             LD_LIBRARY_PATH=$PWD/target/release:$LD_LIBRARY_PATH, or set \
                             NCCL_NET_PLUGIN to the .so's absolute path",
                        ),
                    );
                    return None;
                }
            }
        }
    };
    report.push(abi_check(&found.found));
    let drivable = |s: &String| plugin::VERSIONS.iter().any(|&v| *s == plugin::symbol(v));
    found.found.iter().any(drivable).then_some(found.candidate)
}

/// Which table NCCL would take from the exported `found` symbols (NCCL tries v12 … v6 and takes
/// the first present).
pub fn abi_check(found: &[String]) -> Check {
    let exported = if found.is_empty() {
        "none".to_string()
    } else {
        found.join(", ")
    };
    let expect = "one of ncclNetPlugin_v12 … _v6 (NCCL tries them in that order)";
    match NCCL_NET_SYMBOLS
        .iter()
        .find(|s| found.iter().any(|f| f == *s))
    {
        None => Check::new(
            "plugin.abi",
            Verdict::Fail,
            format!("exports {exported}: NCCL finds no net plugin table"),
        )
        .expect(expect)
        .fix("NCCL_NET_PLUGIN names another library; point it at libnccl-net-verbsnet.so"),
        Some(first) => Check::new(
            "plugin.abi",
            Verdict::Ok,
            format!(
                "exports {exported}: NCCL takes {first} (an NCCL too old for it takes the next \
                 one it knows)"
            ),
        )
        .expect(expect),
    }
}

/// `NCCL_NET`: unset lets NCCL fall back silently to its internal IB or Socket transport when
/// the plugin fails; set to another name, NCCL does not use verbsnet.
pub fn nccl_net_check(nccl_net: Option<&str>) -> Check {
    let expect = "NCCL_NET=verbsnet (a plugin failure then stops the job instead of falling back)";
    match nccl_net {
        None => Check::new("nccl.net", Verdict::Warn, "NCCL_NET unset")
            .expect(expect)
            .fix("export NCCL_NET=verbsnet"),
        Some(v) if plugin::name_matches(v, plugin::DEFAULT_NET_NAME) => {
            Check::new("nccl.net", Verdict::Ok, format!("NCCL_NET={v}")).expect(expect)
        }
        Some(v) => Check::new(
            "nccl.net",
            Verdict::Fail,
            format!("NCCL_NET={v}: NCCL will not use verbsnet (or fails if no net is named {v})"),
        )
        .expect(expect)
        .fix("export NCCL_NET=verbsnet, or unset NCCL_NET_PLUGIN if verbsnet is not wanted"),
    }
}

/// Loads the v8 table and calls `init`, `devices` and `getProperties`; pushes `plugin.init`
/// and `plugin.devices`. Returns the plugin and its device names.
fn init_plugin(
    value: &str,
    shown_value: &str,
    nccl_net: Option<String>,
    report: &mut Report,
) -> Option<(Net, Vec<String>)> {
    let net = match Net::load(value, nccl_net.as_deref(), None) {
        Ok(n) => n,
        Err(e) => {
            report.push(
                Check::new("plugin.init", Verdict::Fail, e.to_string())
                    .expect(format!(
                        "an ncclNetPlugin_v7 … v12 table{}",
                        nccl_net
                            .as_deref()
                            .map(|w| format!(" named {w} (NCCL_NET)"))
                            .unwrap_or_default()
                    ))
                    .fix(format!("check NCCL_NET_PLUGIN={shown_value} and NCCL_NET")),
            );
            return None;
        }
    };
    if let Err(e) = net.init() {
        let why = plugin::logger::last_warning().map_or_else(
            || "the plugin logged no WARN".to_string(),
            |w| format!("the plugin's WARN: {w}"),
        );
        report.push(
            Check::new("plugin.init", Verdict::Fail, format!("{e}; {why}"))
                .expect("init returns ncclSuccess")
                .fix("fix the config/transport failure reported here; NCCL cannot use the plugin"),
        );
        return None;
    }
    let names: Vec<String> = match net.devices() {
        Ok(n) => (0..n)
            .map(|d| {
                net.properties(d)
                    .map(|p| format!("{} ({} Mbps)", p.name, p.speed))
                    .unwrap_or_else(|e| format!("device {d}: {e}"))
            })
            .collect(),
        Err(e) => {
            report.push(Check::new("plugin.init", Verdict::Fail, e.to_string()));
            return None;
        }
    };
    report.push(
        Check::new(
            "plugin.init",
            Verdict::Ok,
            format!("init ok, table name \"{}\"", net.name()),
        )
        .expect("init returns ncclSuccess"),
    );
    if names.is_empty() {
        report.push(
            Check::new("plugin.devices", Verdict::Fail, "0 devices")
                .expect("at least one device")
                .fix("VERBSNET_TRANSPORT=tcp, or make a verbs port usable (see the port lines)"),
        );
        return None;
    }
    report.push(
        Check::new("plugin.devices", Verdict::Ok, names.join(", ")).expect("at least one device"),
    );
    let devs = names
        .iter()
        .map(|n| n.split(' ').next().unwrap_or_default().to_string())
        .collect();
    Some((net, devs))
}

/// Unknown `VERBSNET_*` names (typos), each a `warn` with the config registry's suggestion.
pub fn unknown_var_checks(env: impl Iterator<Item = (String, String)>) -> Vec<Check> {
    config::unknown_vars(env)
        .into_iter()
        .map(|v| {
            let c = Check::new(
                format!("env {v}"),
                Verdict::Warn,
                format!("{v} is not a verbsnet knob: it is ignored"),
            )
            .expect("only the VERBSNET_* names of docs/configuration.md");
            match config::suggest(&v) {
                Some(s) => c.fix(format!("rename it to {s}")),
                None => c.fix("unset it (docs/configuration.md lists every knob)"),
            }
        })
        .collect()
}

/// `NCCL_*` variables that configure NCCL's own IB or socket transports, which verbsnet does
/// not read, with the knob that replaces each (`None`: no equivalent).
pub const NCCL_REPLACED: &[(&str, Option<&str>, &str)] = &[
    ("NCCL_SOCKET_IFNAME", Some("VERBSNET_SOCKET_IFNAME"), "NCCL's bootstrap still uses it; verbsnet's out-of-band listener does not"),
    ("NCCL_IB_HCA", Some("VERBSNET_IB_HCA"), "same syntax, except that prefixes never cut a number (mlx5_1 is not mlx5_10)"),
    ("NCCL_IB_GID_INDEX", Some("VERBSNET_IB_GID_INDEX"), "default: the automatic RoCE v2 IPv4 choice"),
    ("NCCL_IB_TIMEOUT", Some("VERBSNET_IB_TIMEOUT"), "same encoding"),
    ("NCCL_IB_RETRY_CNT", Some("VERBSNET_IB_RETRY_CNT"), "same meaning"),
    ("NCCL_IB_ROCE_VERSION_NUM", Some("VERBSNET_IB_GID_INDEX"), "verbsnet picks RoCE v2 itself; force a GID index instead"),
    ("NCCL_IB_ADDR_FAMILY", Some("VERBSNET_IB_GID_INDEX"), "IPv4-mapped GIDs are preferred; force an IPv6 GID by index"),
    ("NCCL_IB_SL", None, "verbsnet uses service level 0"),
    ("NCCL_IB_TC", None, "verbsnet uses traffic class 0"),
    ("NCCL_IB_QPS_PER_CONNECTION", None, "verbsnet uses one QP per connection"),
    ("NCCL_IB_SPLIT_DATA_ON_QPS", None, "one QP per connection"),
    ("NCCL_IB_USE_INLINE", None, "verbsnet posts no inline data"),
    ("NCCL_IB_PKEY", None, "verbsnet uses P_Key index 0"),
    ("NCCL_IB_ADAPTIVE_ROUTING", None, "not configurable"),
    ("NCCL_IB_PCI_RELAXED_ORDERING", None, "not configurable"),
    ("NCCL_IB_DISABLE", None, "it disables NCCL's internal IB transport, not verbsnet; VERBSNET_TRANSPORT=tcp makes verbsnet avoid verbs"),
];

/// The `NCCL_*` variables that matter to a verbsnet job: one line for each one that is set.
pub fn nccl_env_checks(get: impl Fn(&str) -> Option<String>) -> Vec<Check> {
    let mut out = Vec::new();
    for (var, knob, note) in NCCL_REPLACED {
        let Some(v) = get(var) else { continue };
        let name = format!("env {var}");
        let c = match knob {
            Some(k) if get(k).is_some() => Check::new(
                name,
                Verdict::Ok,
                format!(
                    "{var}={v} (verbsnet reads {k}={} instead)",
                    get(k).unwrap_or_default()
                ),
            )
            .expect(format!("{k} set for verbsnet")),
            Some(k) => Check::new(
                name,
                Verdict::Warn,
                format!("{var}={v}: verbsnet does not read it ({note})"),
            )
            .expect(format!("{k} for verbsnet"))
            .fix(if *var == "NCCL_SOCKET_IFNAME" {
                format!("export {k}=<one interface name of {v}> (an exact name: no prefixes or ^)")
            } else {
                format!("export {k}=... (docs/configuration.md)")
            }),
            None => Check::new(
                name,
                Verdict::Warn,
                format!("{var}={v}: verbsnet does not read it and has no equivalent ({note})"),
            )
            .expect("no NCCL_IB_* setting relied on under verbsnet")
            .fix(format!(
                "unset {var}, or accept that it has no effect on verbsnet"
            )),
        };
        out.push(c);
    }
    out
}

/// Transport choice and why, from the configuration, the ib survey and the devices the
/// plugin reported.
pub fn transport_check(
    choice: Option<TransportChoice>,
    surveyed: &Result<Vec<DeviceSurvey>, nccl_net_verbsnet::transport::TransportError>,
    plugin_devs: &[String],
) -> Check {
    let usable: Vec<&PortSurvey> = surveyed
        .as_ref()
        .map(|d| {
            d.iter()
                .flat_map(|d| d.ports.iter())
                .filter(|p| p.usable.is_ok())
                .collect()
        })
        .unwrap_or_default();
    let nports: usize = surveyed
        .as_ref()
        .map(|d| d.iter().map(|d| d.ports.len()).sum())
        .unwrap_or(0);
    let verbs = match surveyed {
        Err(e) => format!("verbs unavailable ({e})"),
        Ok(_) if nports == 0 => "no verbs devices".to_string(),
        Ok(_) => format!(
            "{} of {nports} verbs port(s) usable{}",
            usable.len(),
            if usable.is_empty() {
                String::new()
            } else {
                format!(
                    " ({})",
                    usable
                        .iter()
                        .map(|p| p.label.as_str())
                        .collect::<Vec<_>>()
                        .join(" ")
                )
            }
        ),
    };
    let picked = if plugin_devs.is_empty() {
        "the plugin did not initialise".to_string()
    } else if plugin_devs.iter().all(|d| d.starts_with("tcp")) {
        format!("tcp ({})", plugin_devs.join(" "))
    } else {
        format!("ib ({})", plugin_devs.join(" "))
    };
    let expect = "ib where an RDMA port is usable; tcp only by choice or on hosts without RDMA";
    match choice {
        None => Check::new(
            "transport",
            Verdict::Fail,
            format!("unknown: the configuration is invalid; {verbs}"),
        )
        .expect(expect)
        .fix("fix the config line"),
        Some(TransportChoice::Tcp) => Check::new(
            "transport",
            if usable.is_empty() {
                Verdict::Ok
            } else {
                Verdict::Warn
            },
            format!("VERBSNET_TRANSPORT=tcp: {picked}; {verbs}"),
        )
        .expect(expect)
        .fix(if usable.is_empty() {
            ""
        } else {
            "unset VERBSNET_TRANSPORT (auto) to use the usable RDMA port(s): tcp is far slower"
        }),
        Some(TransportChoice::Ib) if usable.is_empty() => Check::new(
            "transport",
            Verdict::Fail,
            format!("VERBSNET_TRANSPORT=ib but {verbs}: plugin init fails"),
        )
        .expect(expect)
        .fix("make a port usable (see the port lines), or VERBSNET_TRANSPORT=tcp"),
        Some(TransportChoice::Ib) => Check::new(
            "transport",
            Verdict::Ok,
            format!("VERBSNET_TRANSPORT=ib: {picked}; {verbs}"),
        )
        .expect(expect),
        Some(TransportChoice::Auto) if usable.is_empty() && nports > 0 => Check::new(
            "transport",
            Verdict::Warn,
            format!("auto: {picked}, because {verbs}: RDMA devices exist but none is usable"),
        )
        .expect(expect)
        .fix(
            "see the port lines for why each port is skipped; VERBSNET_TRANSPORT=tcp silences this",
        ),
        Some(TransportChoice::Auto) if usable.is_empty() => Check::new(
            "transport",
            Verdict::Ok,
            format!("auto: {picked}, because {verbs}"),
        )
        .expect(expect),
        Some(TransportChoice::Auto) => Check::new(
            "transport",
            Verdict::Ok,
            format!("auto: {picked}, because {verbs}"),
        )
        .expect(expect),
    }
}

/// One line per port (state, link layer, MTU, speed, usable or why not), one per port for its
/// GID choice, and the configured depths/SGEs against the device's limits.
pub fn device_checks(d: &DeviceSurvey, cfg: Option<&Config>, cfg_used: &Config) -> Vec<Check> {
    let mut out = Vec::new();
    if let Some(e) = &d.error {
        out.push(
            Check::new(format!("device {}", d.name), Verdict::Warn, e.clone())
                .expect("the device opens")
                .fix("check the driver (dmesg, `ibv_devinfo`) and permissions on /dev/infiniband"),
        );
        return out;
    }
    for p in &d.ports {
        let mtu = p.active_mtu.map_or("?".into(), |m| m.to_string());
        let speed = p.speed_mbps.map_or("unknown speed".into(), |s| {
            format!("{} Gbps", f64::from(s) / 1000.0)
        });
        let facts = format!(
            "{}, {}, active MTU {mtu} (max {}), {speed}",
            p.state,
            p.link_layer,
            p.max_mtu.map_or("?".into(), |m| m.to_string())
        );
        let forced = cfg_used.ib_gid_index.is_some();
        let (verdict, observed, fix) = match &p.usable {
            Ok(()) => (Verdict::Ok, format!("{facts}: used"), String::new()),
            Err(why) if why.contains("VERBSNET_IB_HCA") => {
                (Verdict::Ok, format!("{facts}: {why}"), String::new())
            }
            Err(why) if p.state == "ACTIVE" && (forced || why.contains("GID")) => (
                Verdict::Fail,
                format!("{facts}: skipped: {why}"),
                if forced {
                    "unset VERBSNET_IB_GID_INDEX (automatic choice), or set it to the index the \
                     gid line names"
                        .to_string()
                } else {
                    "give the port's netdev an IPv4 address (ip addr add ...), or set \
                     VERBSNET_IB_GID_INDEX"
                        .to_string()
                },
            ),
            Err(why) => (
                Verdict::Warn,
                format!("{facts}: skipped: {why}"),
                "bring the port up (ibv_devinfo; the netdev for RoCE), or exclude it with \
                 VERBSNET_IB_HCA=^<dev>:<port>"
                    .to_string(),
            ),
        };
        out.push(
            Check::new(format!("port {}", p.label), verdict, observed)
                .expect("ACTIVE, with a routable GID")
                .fix(fix),
        );
        out.push(gid_check(p, forced));
    }
    if let (Some(l), Some(cfg)) = (&d.limits, cfg) {
        out.extend(limit_checks(&d.name, l, cfg));
    }
    out
}

fn gid_check(p: &PortSurvey, forced: bool) -> Check {
    let name = format!("gid {}", p.label);
    let skipped: Vec<String> = p
        .gids
        .iter()
        .filter(|(e, _)| {
            p.gid
                .as_ref()
                .map_or(true, |g| u32::from(g.index) != e.index)
        })
        .filter_map(|(e, why)| {
            why.as_ref()
                .map(|w| format!("[{}] {} {w}", e.index, e.addr()))
        })
        .collect();
    let others = if skipped.is_empty() {
        String::new()
    } else {
        format!("; others: {}", skipped.join("; "))
    };
    let expect = "a RoCE v2 GID with an IPv4 (or global IPv6) address; GID 0 on InfiniBand";
    match &p.gid {
        Ok(g) => {
            let kind = match g.kind {
                nccl_net_verbsnet::transport::ib::gid::GidKind::RoceV2 => "RoCE v2",
                nccl_net_verbsnet::transport::ib::gid::GidKind::RoceV1 => "RoCE v1",
                nccl_net_verbsnet::transport::ib::gid::GidKind::Unknown
                    if p.link_layer == "InfiniBand" =>
                {
                    "IB"
                }
                nccl_net_verbsnet::transport::ib::gid::GidKind::Unknown => "type unknown",
            };
            let c = Check::new(
                name,
                if g.caveat.is_some() {
                    Verdict::Warn
                } else {
                    Verdict::Ok
                },
                format!("index {} {} {kind} ({}){others}", g.index, g.addr, g.why),
            )
            .expect(expect);
            match &g.caveat {
                Some(cv) => c.fix(format!(
                    "{cv}: unset VERBSNET_IB_GID_INDEX unless the fabric routes it"
                )),
                None => c,
            }
        }
        Err(why) => Check::new(
            name,
            if p.state == "ACTIVE" {
                Verdict::Fail
            } else {
                Verdict::Warn
            },
            format!("none: {why}{others}"),
        )
        .expect(expect)
        .fix(if forced {
            "unset VERBSNET_IB_GID_INDEX or pick an index listed here"
        } else {
            "give the netdev an IP address, or set VERBSNET_IB_GID_INDEX"
        }),
    }
}

/// The QP and CQ depths and SGEs that `conn::qp_config` asks for under `cfg`, against the
/// device's limits (the ib transport clamps depths to the limits with a WARN, which leaves the
/// engine posting more WRs than the queue holds).
pub fn limit_checks(
    dev: &str,
    l: &nccl_net_verbsnet::transport::ib::survey::DeviceLimits,
    cfg: &Config,
) -> Vec<Check> {
    let q = nccl_net_verbsnet::conn::qp_config(cfg);
    let cqe = u64::from(q.max_send_wr) + u64::from(q.max_recv_wr);
    let mut out = Vec::new();
    let rq = Check::new(
        format!("depth.rq {dev}"),
        if q.max_recv_wr <= l.max_qp_wr {
            Verdict::Ok
        } else {
            Verdict::Fail
        },
        format!("VERBSNET_RQ_DEPTH={} receive WRs per QP", q.max_recv_wr),
    )
    .expect(format!("<= max_qp_wr {}", l.max_qp_wr));
    out.push(if q.max_recv_wr > l.max_qp_wr {
        rq.fix(format!(
            "set VERBSNET_RQ_DEPTH <= {} (the RQ would be clamped below the depth verbsnet posts: \
             post_recv fails)",
            l.max_qp_wr
        ))
    } else {
        rq
    });
    let sq = Check::new(
        format!("depth.sq {dev}"),
        if q.max_send_wr <= l.max_qp_wr { Verdict::Ok } else { Verdict::Fail },
        format!(
            "{} send WRs per QP (2 x {MAX_SEND_REQUESTS} request slots + {CTRL_STAGE_SLOTS} control)",
            q.max_send_wr
        ),
    )
    .expect(format!("<= max_qp_wr {}", l.max_qp_wr));
    out.push(if q.max_send_wr > l.max_qp_wr {
        sq.fix("this device's send queue is too small for verbsnet; use another device (VERBSNET_IB_HCA)")
    } else {
        sq
    });
    let cq = Check::new(
        format!("depth.cq {dev}"),
        if cqe <= u64::from(l.max_cqe) {
            Verdict::Ok
        } else {
            Verdict::Fail
        },
        format!("{cqe} CQ entries per QP (send + receive WRs)"),
    )
    .expect(format!("<= max_cqe {}", l.max_cqe));
    out.push(if cqe > u64::from(l.max_cqe) {
        cq.fix(format!(
            "set VERBSNET_RQ_DEPTH <= {} (a clamped CQ can overrun: the QP then fails)",
            u64::from(l.max_cqe).saturating_sub(u64::from(q.max_send_wr))
        ))
    } else {
        cq
    });
    let sge = Check::new(
        format!("sge {dev}"),
        if MAX_SEND_SGE as u32 <= l.max_sge {
            Verdict::Ok
        } else {
            Verdict::Fail
        },
        format!("{MAX_SEND_SGE} SGEs per send WR, 1 per receive WR; inline data: none"),
    )
    .expect(format!("<= max_sge {}", l.max_sge));
    out.push(if MAX_SEND_SGE as u32 > l.max_sge {
        sge.fix(
            "this device cannot carry verbsnet's eager SEND (header + payload); use another device",
        )
    } else {
        sge
    });
    out
}

/// Bytes the plugin pins for one send comm and one receive comm under `cfg`: its protocol
/// buffers (plugin/comm.rs `SendBuffers::alloc`, `RecvBuffers::alloc`), each rounded up to
/// whole pages as `Region::alloc` allocates them.
pub fn pinned_bytes(cfg: &Config) -> (u64, u64) {
    let pages = |b: usize| (b as u64).div_ceil(PAGE) * PAGE;
    let a64 = |b: usize| b.next_multiple_of(64);
    // Each comm registers its own buffers as one region (comm.rs `Owned::alloc_parts`).
    let send = pages(
        a64(MAX_SEND_REQUESTS * EAGER_HDR_LEN)
            + a64(MAX_SEND_REQUESTS * 8)
            + a64(CTS_RING_ENTRIES * CTS_ENTRY_LEN)
            + 8,
    );
    let stride = EAGER_HDR_LEN + cfg.eager_buf_size as usize;
    let min = cfg.rq_min_depth.clamp(1, cfg.rq_depth) as usize;
    // The receive comm's own buffers and rings, plus what it may grow by from the pool at
    // full depth (memlock must cover a busy comm too).
    let recv = pages(
        a64(min * stride) + a64(REC_SLOTS * MAX_RECVS * 8) + CTRL_STAGE_SLOTS * CTS_ENTRY_LEN,
    ) + pages((cfg.rq_depth as usize - min) * stride);
    (send, recv)
}

/// `NCCL_BUFFSIZE` as NCCL reads it (bytes), else its default.
pub fn nccl_buffsize(v: Option<&str>) -> u64 {
    v.and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(NCCL_DEFAULT_BUFFSIZE)
}

/// RLIMIT_MEMLOCK and CAP_IPC_LOCK of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memlock {
    /// Soft limit in bytes; `None` = unlimited.
    pub soft: Option<u64>,
    /// Hard limit in bytes; `None` = unlimited.
    pub hard: Option<u64>,
    /// `CAP_IPC_LOCK` in the effective set: the limit does not apply.
    pub cap_ipc_lock: bool,
}

/// Reads the limit (`getrlimit`) and the capability (`/proc/self/status`).
pub fn read_memlock() -> Option<Memlock> {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    let (soft, hard) = getrlimit(Resource::RLIMIT_MEMLOCK).ok()?;
    let lim = |v: u64| (v != RLIM_INFINITY).then_some(v);
    let cap = fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        })
        .is_some_and(|bits| bits & (1 << CAP_IPC_LOCK_BIT) != 0);
    Some(Memlock {
        soft: lim(soft),
        hard: lim(hard),
        cap_ipc_lock: cap,
    })
}

fn mib(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / f64::from(1 << 20))
    } else {
        format!("{} KiB", b.div_ceil(1024))
    }
}

/// The memlock verdict: the pinned bytes `comms` connections need (each a send and a receive
/// comm of the plugin plus NCCL's `buffsize` buffer for each) against the limit. Over the
/// limit is `fail` on ib (`ibv_reg_mr` fails with ENOMEM at connect time) and `warn` on tcp
/// (which pins nothing, but the same job over RDMA would fail).
pub fn memlock_check(
    cfg: &Config,
    comms: u64,
    buffsize: u64,
    m: Option<Memlock>,
    uses_ib: bool,
) -> Check {
    let (send, recv) = pinned_bytes(cfg);
    let per = send + recv + 2 * buffsize;
    let need = per.saturating_mul(comms.max(1));
    let detail = format!(
        "{comms} connection(s) x ({} send comm + {} recv comm [rq_depth {} x (eager_buf_size {} \
         + {EAGER_HDR_LEN})] + 2 x {} NCCL buffer) = {}",
        mib(send),
        mib(recv),
        cfg.rq_depth,
        cfg.eager_buf_size,
        mib(buffsize),
        mib(need)
    );
    let expect = format!("RLIMIT_MEMLOCK >= {} or CAP_IPC_LOCK", mib(need));
    let fix = "raise the limit: `ulimit -l unlimited` (shell, as root or within the hard limit), \
               LimitMEMLOCK=infinity (systemd unit), `* - memlock unlimited` in \
               /etc/security/limits.conf, `docker run --ulimit memlock=-1`; or lower \
               VERBSNET_RQ_DEPTH / VERBSNET_EAGER_BUF_SIZE";
    let Some(m) = m else {
        return Check::new(
            "memlock",
            Verdict::Warn,
            format!("getrlimit failed; need {detail}"),
        )
        .expect(expect);
    };
    let show = |v: Option<u64>| v.map_or("unlimited".into(), mib);
    let limit = format!(
        "RLIMIT_MEMLOCK {} (hard {}), CAP_IPC_LOCK {}",
        show(m.soft),
        show(m.hard),
        if m.cap_ipc_lock { "yes" } else { "no" }
    );
    if m.cap_ipc_lock || m.soft.is_none_or(|s| s >= need) {
        let why = if m.cap_ipc_lock {
            ": CAP_IPC_LOCK lifts the limit"
        } else {
            ""
        };
        return Check::new(
            "memlock",
            Verdict::Ok,
            format!("{limit}{why}; need {detail}"),
        )
        .expect(expect);
    }
    if uses_ib {
        Check::new(
            "memlock",
            Verdict::Fail,
            format!("{limit}; need {detail}: ibv_reg_mr will fail with ENOMEM (Cannot allocate memory) at connect"),
        )
        .expect(expect)
        .fix(fix)
    } else {
        Check::new(
            "memlock",
            Verdict::Warn,
            format!("{limit}; need {detail}: tcp pins nothing, but the same job over RDMA would fail at connect"),
        )
        .expect(expect)
        .fix(fix)
    }
}

/// Hardware counters that signal trouble, with what a rising value means. The names are those
/// of `hw_counters` (rxe, mlx5, and others) and of the InfiniBand port counters.
pub const TROUBLE_COUNTERS: &[(&str, &str)] = &[
    (
        "rcvd_rnr_err",
        "RNR NAKs received: a peer had no receive WR posted",
    ),
    (
        "send_rnr_err",
        "RNR NAKs sent: this host had no receive WR posted",
    ),
    ("rnr_nak_retry_err", "RNR retries exhausted"),
    ("retry_rnr_exceeded_err", "RNR retries exhausted"),
    ("retry_exceeded_err", "transport retries exhausted"),
    (
        "local_ack_timeout_err",
        "ACK timeouts: packets lost or the peer unreachable",
    ),
    ("completer_retry_err", "transport retries"),
    (
        "req_transport_retries_exceeded",
        "transport retries exhausted",
    ),
    (
        "out_of_sequence",
        "out-of-sequence packets: drops on the path",
    ),
    (
        "out_of_seq_request",
        "out-of-sequence requests: drops on the path",
    ),
    ("packet_seq_err", "packet sequence errors"),
    ("rcvd_seq_err", "sequence error NAKs received"),
    ("implied_nak_seq_err", "implied NAK sequence errors"),
    ("duplicate_request", "duplicate requests: peers retransmit"),
    ("roce_adp_retrans", "adaptive retransmissions"),
    ("roce_slow_restart", "slow restarts after loss"),
    ("link_downed", "link went down"),
    ("link_error_recovery", "link error recoveries"),
    ("symbol_error", "symbol errors: cable or transceiver"),
    ("port_rcv_errors", "receive errors"),
    ("port_xmit_discards", "transmit discards: congestion"),
];

/// One port's counters: (label, counter name → value).
pub type PortCounters = (String, BTreeMap<String, u64>);

/// Reads the trouble counters of every port under `<sysfs>/class/infiniband`.
pub fn read_counters(sysfs: &Path) -> Vec<PortCounters> {
    let root = sysfs.join("class/infiniband");
    let mut out = Vec::new();
    let mut devs: Vec<PathBuf> = fs::read_dir(&root)
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    devs.sort();
    for dev in devs {
        let name = dev
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let mut ports: Vec<PathBuf> = fs::read_dir(dev.join("ports"))
            .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        ports.sort();
        for port in ports {
            let mut vals = BTreeMap::new();
            for sub in ["hw_counters", "counters"] {
                for (c, _) in TROUBLE_COUNTERS {
                    if let Some(v) = fs::read_to_string(port.join(sub).join(c))
                        .ok()
                        .and_then(|s| s.trim().parse::<u64>().ok())
                    {
                        vals.insert((*c).to_string(), v);
                    }
                }
            }
            let p = port.file_name().unwrap_or_default().to_string_lossy();
            out.push((format!("{name}:{p}"), vals));
        }
    }
    out
}

/// The verdict on two reads of the counters `secs` apart: a trouble counter that moved is
/// `warn` with its rate; totals since boot are mentioned.
pub fn counter_verdicts(before: &[PortCounters], after: &[PortCounters], secs: f64) -> Vec<Check> {
    let mut out = Vec::new();
    for (label, now) in after {
        let then = before.iter().find(|(l, _)| l == label).map(|(_, v)| v);
        let name = format!("counters {label}");
        let expect = format!("no error counter moving over {secs:.1} s");
        if now.is_empty() {
            out.push(
                Check::new(
                    name,
                    Verdict::Ok,
                    "the device exposes no hw_counters/counters files",
                )
                .expect(expect),
            );
            continue;
        }
        let mut moving = Vec::new();
        for (c, v) in now {
            let d = then
                .and_then(|t| t.get(c))
                .map_or(0, |b| v.saturating_sub(*b));
            if d > 0 {
                let meaning = TROUBLE_COUNTERS
                    .iter()
                    .find(|(n, _)| n == c)
                    .map_or("", |x| x.1);
                let rate = if secs > 0.0 {
                    d as f64 / secs
                } else {
                    d as f64
                };
                moving.push(format!("{c} +{d} ({rate:.1}/s: {meaning})"));
            }
        }
        let totals: Vec<String> = now
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(c, v)| format!("{c}={v}"))
            .collect();
        let since = if totals.is_empty() {
            "all zero since boot".to_string()
        } else {
            format!("since boot: {}", totals.join(" "))
        };
        if moving.is_empty() {
            out.push(
                Check::new(
                    name,
                    Verdict::Ok,
                    format!("none moved in {secs:.1} s ({since})"),
                )
                .expect(expect),
            );
        } else {
            out.push(
                Check::new(
                    name,
                    Verdict::Warn,
                    format!("{} ({since})", moving.join(", ")),
                )
                .expect(expect)
                .fix(
                    "traffic on this port is already failing or retrying: RNR counters mean \
                         receivers run out of posted WRs (VERBSNET_RQ_DEPTH, VERBSNET_CREDITS=1); \
                         retries, ACK timeouts and out-of-sequence mean loss on the path (PFC/ECN, \
                         cabling, MTU); docs/troubleshooting.md",
                ),
            );
        }
    }
    out
}

fn counter_checks(sysfs: &Path, interval: Duration) -> Vec<Check> {
    let before = read_counters(sysfs);
    if before.is_empty() {
        return vec![Check::new(
            "counters",
            Verdict::Ok,
            "no verbs device: no hardware counters",
        )
        .expect("no error counter moving")];
    }
    let t0 = Instant::now();
    std::thread::sleep(interval);
    let after = read_counters(sysfs);
    counter_verdicts(&before, &after, t0.elapsed().as_secs_f64())
}

// ------------------------------------------------------------------------------- peer test

/// One length-prefixed JSON message on the doctor's own TCP side channel.
fn send_msg(s: &mut TcpStream, v: &Value) -> std::io::Result<()> {
    let b = v.to_string().into_bytes();
    s.write_all(&(b.len() as u32).to_le_bytes())?;
    s.write_all(&b)
}

fn recv_msg(s: &mut TcpStream) -> std::io::Result<Value> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > 1 << 20 {
        return Err(std::io::Error::other("oversized doctor message"));
    }
    let mut b = vec![0u8; len];
    s.read_exact(&mut b)?;
    serde_json::from_slice(&b).map_err(std::io::Error::other)
}

type PeerResult<T> = std::result::Result<T, String>;

fn peer_checks(args: &Args, net: &Net, me: &Local, report: &mut Report) {
    match peer_test(args, net, me) {
        Ok(checks) => report.checks.extend(checks),
        Err(e) => report.push(
            Check::new("peer.connect", Verdict::Fail, e)
                .expect("a connection through the plugin, both ways")
                .fix(
                    "check that the other side runs `doctor --listen`, that HOST:PORT and the \
                     plugin's out-of-band address (VERBSNET_SOCKET_ADDR/IFNAME) are reachable, \
                     and both sides' port and gid lines",
                ),
        ),
    }
}

fn peer_test(args: &Args, net: &Net, me: &Local) -> PeerResult<Vec<Check>> {
    let deadline = Instant::now() + Duration::from_secs(args.timeout.max(1));
    let initiator = args.peer.is_some();
    let mut sock = if let Some(peer) = &args.peer {
        let addrs: Vec<_> = peer
            .to_socket_addrs()
            .map_err(|e| format!("--peer {peer}: {e}"))?
            .collect();
        let mut last = String::from("no address");
        let mut got = None;
        while got.is_none() && Instant::now() < deadline {
            for a in &addrs {
                match TcpStream::connect_timeout(a, Duration::from_secs(2)) {
                    Ok(s) => {
                        got = Some(s);
                        break;
                    }
                    Err(e) => last = format!("connect {a}: {e}"),
                }
            }
            if got.is_none() {
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        got.ok_or_else(|| format!("cannot reach the doctor at {peer}: {last}"))?
    } else {
        let addr = args.listen.clone().unwrap_or_default();
        let l = TcpListener::bind(&addr).map_err(|e| format!("--listen {addr}: {e}"))?;
        let at = l.local_addr().map_err(|e| e.to_string())?;
        eprintln!(
            "verbsnet doctor: listening on {at} (run `verbsnet-perf doctor --peer <this host>:{}` \
             on the other host)",
            at.port()
        );
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(format!(
                            "no peer connected to {at} within {} s",
                            args.timeout
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(format!("accept on {at}: {e}")),
            }
        }
    };
    sock.set_nonblocking(false).map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_secs(args.timeout.max(1))))
        .map_err(|e| e.to_string())?;
    let io = |e: std::io::Error| format!("doctor side channel: {e}");

    // Hello: what each side is, and the initiator's test parameters.
    let (listen_handle, mut listen) = net
        .listen(args.dev)
        .map_err(|e| format!("plugin listen(dev {}): {e}", args.dev))?;
    let hello = json!({
        "transport": me.transport, "device": me.device, "mtu": me.mtu,
        "host": hostname(), "pings": args.pings, "bw_bytes": args.bw_bytes,
        "handle": listen_handle.0.to_vec(),
    });
    send_msg(&mut sock, &hello).map_err(io)?;
    let theirs = recv_msg(&mut sock).map_err(io)?;
    let (pings, bw_bytes) = if initiator {
        (args.pings, args.bw_bytes)
    } else {
        (
            theirs["pings"].as_u64().unwrap_or(1000) as u32,
            theirs["bw_bytes"].as_u64().unwrap_or(64 << 20),
        )
    };
    let their_transport = theirs["transport"].as_str().unwrap_or("?").to_string();
    let their_dev = theirs["device"].as_str().unwrap_or("?").to_string();
    let their_host = theirs["host"].as_str().unwrap_or("?").to_string();
    let their_mtu = theirs["mtu"].as_u64().map(|m| m as u32);
    let mut out = Vec::new();
    if their_transport != me.transport {
        out.push(
            Check::new(
                "peer.transport",
                Verdict::Fail,
                format!("here {} ({}), peer {their_host} {their_transport} ({their_dev})", me.transport, me.device),
            )
            .expect("the same transport on both sides")
            .fix("set the same VERBSNET_TRANSPORT on both hosts (and make a verbs port usable on both for ib)"),
        );
        return Ok(out);
    }
    out.push(
        Check::new(
            "peer.transport",
            Verdict::Ok,
            format!(
                "here {} ({}), peer {their_host} {their_transport} ({their_dev})",
                me.transport, me.device
            ),
        )
        .expect("the same transport on both sides"),
    );
    out.push(mtu_check(&me.transport, me.mtu, their_mtu));
    let mut their_handle = theirs["handle"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|b| b.as_u64().unwrap_or(0) as u8)
                .collect::<Vec<u8>>()
        })
        .and_then(|b| Handle::from_bytes(&b))
        .ok_or("the peer's hello has no valid handle")?;

    // Connect and accept, both non-blocking, until both are done.
    let t0 = Instant::now();
    let (mut send, mut recv) = (None, None);
    while send.is_none() || recv.is_none() {
        if Instant::now() > deadline {
            return Err(format!(
                "connect/accept through the plugin did not finish in {} s (send comm {}, recv \
                 comm {})",
                args.timeout,
                if send.is_some() { "up" } else { "pending" },
                if recv.is_some() { "up" } else { "pending" }
            ));
        }
        if send.is_none() {
            send = net
                .connect(args.dev, &mut their_handle)
                .map_err(|e| format!("plugin connect: {e}"))?;
        }
        if recv.is_none() {
            recv = net
                .accept(&mut listen)
                .map_err(|e| format!("plugin accept: {e}"))?;
        }
        std::thread::yield_now();
    }
    let (mut send, mut recv) = (send.unwrap(), recv.unwrap());
    out.push(
        Check::new(
            "peer.connect",
            Verdict::Ok,
            format!(
                "send and recv comms up in {:.1} ms",
                t0.elapsed().as_secs_f64() * 1e3
            ),
        )
        .expect("a connection through the plugin, both ways"),
    );

    const SLOTS: usize = 8;
    let chunk = bw_bytes.clamp(8, 512 << 10) as usize;
    let mut sfifo = net
        .reg_mr(&send, SLOTS, chunk)
        .map_err(|e| format!("regMr (send, {SLOTS} x {chunk} B): {e}"))?;
    let mut rfifo = net
        .reg_mr(&recv, SLOTS, chunk)
        .map_err(|e| format!("regMr (recv, {SLOTS} x {chunk} B): {e}"))?;
    let wait = |what: &str| -> PeerResult<()> {
        if Instant::now() > deadline {
            Err(format!(
                "the peer test stalled during {what} (timeout {} s)",
                args.timeout
            ))
        } else {
            Ok(())
        }
    };
    macro_rules! complete {
        ($fifo:expr, $req:expr, $what:expr) => {{
            let mut r = $req;
            loop {
                if let Some(n) = net
                    .test(&mut $fifo, &mut r)
                    .map_err(|e| format!("{}: {e}", $what))?
                {
                    break n;
                }
                wait($what)?;
            }
        }};
    }
    macro_rules! start_send {
        ($slot:expr, $len:expr, $what:expr) => {{
            loop {
                if let Some(r) = net
                    .isend(&mut send, &mut sfifo, $slot, $len, 0)
                    .map_err(|e| format!("{}: {e}", $what))?
                {
                    break r;
                }
                wait($what)?;
            }
        }};
    }
    macro_rules! start_recv {
        ($slot:expr, $len:expr, $what:expr) => {{
            loop {
                if let Some(r) = net
                    .irecv(&mut recv, &mut rfifo, $slot, $len, 0)
                    .map_err(|e| format!("{}: {e}", $what))?
                {
                    break r;
                }
                wait($what)?;
            }
        }};
    }

    // Ping-pong: 10 untimed, then `pings` timed round trips of 8 bytes.
    let warm = 10;
    let mut t_ping = Instant::now();
    for i in 0..warm + pings {
        if i == warm {
            t_ping = Instant::now();
        }
        if initiator {
            let r = start_recv!(0, 8, "ping-pong");
            let s = start_send!(0, 8, "ping-pong");
            complete!(sfifo, s, "ping-pong send");
            complete!(rfifo, r, "ping-pong receive");
        } else {
            let r = start_recv!(0, 8, "ping-pong");
            complete!(rfifo, r, "ping-pong receive");
            let s = start_send!(0, 8, "ping-pong");
            complete!(sfifo, s, "ping-pong send");
        }
    }
    let half_rtt_us = t_ping.elapsed().as_secs_f64() * 1e6 / f64::from(pings.max(1)) / 2.0;

    // Bandwidth: the initiator streams bw_bytes in `chunk` messages, SLOTS in flight; the
    // listener acknowledges with 8 bytes once it has everything.
    let n = bw_bytes.div_ceil(chunk as u64).max(1);
    let t_bw = Instant::now();
    let mut moved = 0u64;
    if initiator {
        let ack = start_recv!(0, 8, "bandwidth ack");
        let mut inflight: Vec<Option<crate::plugin::Request<'_>>> =
            (0..SLOTS).map(|_| None).collect();
        let mut posted = 0u64;
        let mut done = 0u64;
        while done < n {
            for (slot, cur) in inflight.iter_mut().enumerate() {
                if let Some(r) = cur {
                    if let Some(b) = net
                        .test(&mut sfifo, r)
                        .map_err(|e| format!("bandwidth send: {e}"))?
                    {
                        moved += b.unwrap_or(chunk) as u64;
                        done += 1;
                        *cur = None;
                    }
                }
                if cur.is_none() && posted < n {
                    if let Some(r) = net
                        .isend(&mut send, &mut sfifo, slot, chunk, 0)
                        .map_err(|e| format!("bandwidth send: {e}"))?
                    {
                        posted += 1;
                        *cur = Some(r);
                    }
                }
            }
            wait("the bandwidth probe")?;
        }
        complete!(rfifo, ack, "bandwidth ack");
        let _ = moved;
        moved = n * chunk as u64;
    } else {
        let mut inflight: Vec<Option<crate::plugin::Request<'_>>> =
            (0..SLOTS).map(|_| None).collect();
        let mut posted = 0u64;
        let mut done = 0u64;
        while done < n {
            for (slot, cur) in inflight.iter_mut().enumerate() {
                if let Some(r) = cur {
                    if let Some(b) = net
                        .test(&mut rfifo, r)
                        .map_err(|e| format!("bandwidth receive: {e}"))?
                    {
                        moved += b.unwrap_or(chunk) as u64;
                        done += 1;
                        *cur = None;
                    }
                }
                if cur.is_none() && posted < n {
                    if let Some(r) = net
                        .irecv(&mut recv, &mut rfifo, slot, chunk, 0)
                        .map_err(|e| format!("bandwidth receive: {e}"))?
                    {
                        posted += 1;
                        *cur = Some(r);
                    }
                }
            }
            wait("the bandwidth probe")?;
        }
        let s = start_send!(0, 8, "bandwidth ack");
        complete!(sfifo, s, "bandwidth ack");
    }
    let secs = t_bw.elapsed().as_secs_f64();
    let gbps = moved as f64 / secs / 1e9;
    if moved != n * chunk as u64 {
        out.push(
            Check::new(
                "peer.bandwidth",
                Verdict::Fail,
                format!("received {moved} of {} bytes", n * chunk as u64),
            )
            .expect("every byte sent arrives"),
        );
    }

    // The initiator's numbers go to the listener so both print the same lines.
    let mine = json!({ "half_rtt_us": half_rtt_us, "gbps": gbps, "moved": moved, "secs": secs });
    let (lat, bw, bytes, bsecs) = if initiator {
        let _ = recv_msg(&mut sock);
        send_msg(&mut sock, &mine).map_err(io)?;
        (half_rtt_us, gbps, moved, secs)
    } else {
        send_msg(&mut sock, &json!({"ready": true})).map_err(io)?;
        let r = recv_msg(&mut sock).map_err(io)?;
        (
            r["half_rtt_us"].as_f64().unwrap_or(half_rtt_us),
            r["gbps"].as_f64().unwrap_or(gbps),
            r["moved"].as_u64().unwrap_or(moved),
            r["secs"].as_f64().unwrap_or(secs),
        )
    };
    out.push(
        Check::new(
            "peer.latency",
            Verdict::Ok,
            format!(
                "{lat:.1} us one way (half of {pings} round trips of 8 B through isend/irecv/test)"
            ),
        )
        .expect("round trips complete (reference: perftest's ib_send_lat on the same ports)"),
    );
    out.push(
        Check::new(
            "peer.bandwidth",
            Verdict::Ok,
            format!(
                "{bw:.2} GB/s ({} in {:.1} ms, {chunk} B messages, {SLOTS} in flight)",
                mib(bytes),
                bsecs * 1e3
            ),
        )
        .expect("every byte arrives (reference: verbsnet-perf sendrecv and perftest's ib_send_bw)"),
    );
    let _ = net.dereg_mr(&send, sfifo);
    let _ = net.dereg_mr(&recv, rfifo);
    let _ = net.close_send(send);
    let _ = net.close_recv(recv);
    let _ = net.close_listen(listen);
    Ok(out)
}

/// Path MTU both sides use: the smaller active MTU (`convert::path_mtu`); a mismatch is named.
pub fn mtu_check(transport: &str, here: Option<u32>, peer: Option<u32>) -> Check {
    let expect = "equal active MTUs on both ports (4096 for RoCE on a 9000-byte netdev)";
    if transport != "ib" {
        return Check::new(
            "peer.mtu",
            Verdict::Ok,
            "tcp transport: no path MTU (a TCP stream)",
        )
        .expect(expect);
    }
    match (here, peer) {
        (Some(a), Some(b)) if a == b => {
            Check::new("peer.mtu", Verdict::Ok, format!("here {a}, peer {b}: path MTU {a}")).expect(expect)
        }
        (Some(a), Some(b)) => Check::new(
            "peer.mtu",
            Verdict::Warn,
            format!("here {a}, peer {b}: mismatch, both use path MTU {}", a.min(b)),
        )
        .expect(expect)
        .fix("give both netdevs the same MTU (ip link set <dev> mtu 9000 for RoCE 4096), and the switches in between"),
        (a, b) => Check::new(
            "peer.mtu",
            Verdict::Warn,
            format!("here {a:?}, peer {b:?}: an active MTU is unknown"),
        )
        .expect(expect),
    }
}

fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(vars: &[(&str, &str)]) -> Config {
        let m: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned()).unwrap()
    }

    #[test]
    fn pinned_bytes_follow_the_plugin_buffers() {
        let (s, r) = pinned_bytes(&Config::default());
        // One region: header 256 x 32, records 256 x 8, CTS ring 64 x 256, credit word:
        // 26,632 bytes, 7 pages.
        assert_eq!(s, 7 * 4096);
        // Own: 2 bounce buffers of 8192 + 32, record ring 32 x 8 x 8, control 64 x 256: 34,880
        // bytes, 9 pages; grown from the pool at full depth: 126 x 8224 bytes (253 pages).
        assert_eq!(r, 9 * 4096 + (126 * 8224u64).div_ceil(4096) * 4096);
        let (_, r2) = pinned_bytes(&cfg(&[("VERBSNET_RQ_DEPTH", "1024")]));
        assert_eq!(r2, 9 * 4096 + (1022 * 8224u64).div_ceil(4096) * 4096);
    }

    #[test]
    fn memlock_verdicts() {
        let c = Config::default();
        let lowm = Memlock {
            soft: Some(64 << 10),
            hard: Some(64 << 10),
            cap_ipc_lock: false,
        };
        let low = Some(lowm);
        let k = memlock_check(&c, 8, NCCL_DEFAULT_BUFFSIZE, low, true);
        assert_eq!(k.verdict, Verdict::Fail);
        assert!(k.fix.contains("ulimit -l unlimited"), "{}", k.fix);
        assert!(k.observed.contains("ENOMEM"), "{}", k.observed);
        let k = memlock_check(&c, 8, NCCL_DEFAULT_BUFFSIZE, low, false);
        assert_eq!(k.verdict, Verdict::Warn);
        let cap = Some(Memlock {
            cap_ipc_lock: true,
            ..lowm
        });
        assert_eq!(
            memlock_check(&c, 8, NCCL_DEFAULT_BUFFSIZE, cap, true).verdict,
            Verdict::Ok
        );
        let unl = Some(Memlock {
            soft: None,
            hard: None,
            cap_ipc_lock: false,
        });
        assert_eq!(
            memlock_check(&c, 8, NCCL_DEFAULT_BUFFSIZE, unl, true).verdict,
            Verdict::Ok
        );
        // exactly enough is enough
        let (s, r) = pinned_bytes(&c);
        let need = 2 * (s + r + 2 * 4096);
        let just = Some(Memlock {
            soft: Some(need),
            hard: None,
            cap_ipc_lock: false,
        });
        assert_eq!(memlock_check(&c, 2, 4096, just, true).verdict, Verdict::Ok);
        let short = Some(Memlock {
            soft: Some(need - 1),
            hard: None,
            cap_ipc_lock: false,
        });
        assert_eq!(
            memlock_check(&c, 2, 4096, short, true).verdict,
            Verdict::Fail
        );
    }

    #[test]
    fn abi_picks_the_first_in_nccl_order() {
        let k = abi_check(&["ncclNetPlugin_v8".into(), "ncclNetPlugin_v7".into()]);
        assert_eq!(k.verdict, Verdict::Ok);
        assert!(
            k.observed.contains("NCCL takes ncclNetPlugin_v8"),
            "{}",
            k.observed
        );
        let k = abi_check(&["ncclNetPlugin_v7".into(), "ncclNetPlugin_v10".into()]);
        assert!(
            k.observed.contains("NCCL takes ncclNetPlugin_v10"),
            "{}",
            k.observed
        );
        assert_eq!(abi_check(&[]).verdict, Verdict::Fail);
    }

    #[test]
    fn nccl_net_and_env() {
        assert_eq!(nccl_net_check(None).verdict, Verdict::Warn);
        assert_eq!(nccl_net_check(Some("VerbsNet")).verdict, Verdict::Ok);
        assert_eq!(nccl_net_check(Some("IB")).verdict, Verdict::Fail);
        let env: BTreeMap<&str, &str> = [
            ("NCCL_SOCKET_IFNAME", "eth0"),
            ("NCCL_IB_HCA", "mlx5_0"),
            ("VERBSNET_IB_HCA", "mlx5_0"),
            ("NCCL_IB_SL", "3"),
        ]
        .into_iter()
        .collect();
        let checks = nccl_env_checks(|k| env.get(k).map(|v| v.to_string()));
        assert_eq!(checks.len(), 3);
        let by = |n: &str| {
            checks
                .iter()
                .find(|c| c.name == format!("env {n}"))
                .unwrap()
        };
        assert_eq!(by("NCCL_SOCKET_IFNAME").verdict, Verdict::Warn);
        assert!(by("NCCL_SOCKET_IFNAME")
            .fix
            .contains("VERBSNET_SOCKET_IFNAME"));
        assert_eq!(by("NCCL_IB_HCA").verdict, Verdict::Ok);
        assert_eq!(by("NCCL_IB_SL").verdict, Verdict::Warn);
        assert!(by("NCCL_IB_SL").observed.contains("no equivalent"));
    }

    #[test]
    fn typos_get_the_registry_suggestion() {
        let env = [
            ("VERBSNET_RQDEPTH".to_string(), "512".to_string()),
            ("PATH".into(), "/bin".into()),
        ];
        let c = unknown_var_checks(env.into_iter());
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].verdict, Verdict::Warn);
        assert_eq!(c[0].fix, "rename it to VERBSNET_RQ_DEPTH");
    }

    #[test]
    fn limits_against_a_small_device() {
        use nccl_net_verbsnet::transport::ib::survey::DeviceLimits;
        let rxe = DeviceLimits {
            max_qp_wr: 16384,
            max_cqe: 32767,
            max_sge: 32,
            max_qp: 1 << 16,
            max_mr: 1 << 16,
            max_mr_size: u64::MAX,
        };
        assert!(limit_checks("rxe0", &rxe, &Config::default())
            .iter()
            .all(|c| c.verdict == Verdict::Ok));
        let big = cfg(&[("VERBSNET_RQ_DEPTH", "32768")]);
        let c = limit_checks("rxe0", &rxe, &big);
        let rq = c.iter().find(|c| c.name == "depth.rq rxe0").unwrap();
        assert_eq!(rq.verdict, Verdict::Fail);
        assert!(rq.fix.contains("VERBSNET_RQ_DEPTH <= 16384"), "{}", rq.fix);
        let cq = c.iter().find(|c| c.name == "depth.cq rxe0").unwrap();
        assert_eq!(cq.verdict, Verdict::Fail);
        let tiny = DeviceLimits {
            max_sge: 1,
            max_qp_wr: 256,
            ..rxe
        };
        let c = limit_checks("x", &tiny, &Config::default());
        assert_eq!(
            c.iter().find(|c| c.name == "sge x").unwrap().verdict,
            Verdict::Fail
        );
        assert_eq!(
            c.iter().find(|c| c.name == "depth.sq x").unwrap().verdict,
            Verdict::Fail
        );
    }

    #[test]
    fn counters_that_move_are_named_with_a_rate() {
        let m = |v: &[(&str, u64)]| {
            v.iter()
                .map(|(k, n)| (k.to_string(), *n))
                .collect::<BTreeMap<_, _>>()
        };
        let before = vec![(
            "rxe0:1".to_string(),
            m(&[("rcvd_rnr_err", 5), ("out_of_seq_request", 0)]),
        )];
        let same = counter_verdicts(&before, &before, 2.0);
        assert_eq!(same[0].verdict, Verdict::Ok);
        assert!(
            same[0].observed.contains("since boot: rcvd_rnr_err=5"),
            "{}",
            same[0].observed
        );
        let after = vec![(
            "rxe0:1".to_string(),
            m(&[("rcvd_rnr_err", 25), ("out_of_seq_request", 0)]),
        )];
        let moved = counter_verdicts(&before, &after, 2.0);
        assert_eq!(moved[0].verdict, Verdict::Warn);
        assert!(
            moved[0].observed.contains("rcvd_rnr_err +20 (10.0/s"),
            "{}",
            moved[0].observed
        );
        assert!(moved[0].fix.contains("VERBSNET_RQ_DEPTH"));
    }

    #[test]
    fn mtu_mismatch_is_named() {
        assert_eq!(mtu_check("ib", Some(4096), Some(4096)).verdict, Verdict::Ok);
        let k = mtu_check("ib", Some(4096), Some(1024));
        assert_eq!(k.verdict, Verdict::Warn);
        assert!(k.observed.contains("path MTU 1024"));
        assert_eq!(mtu_check("tcp", None, None).verdict, Verdict::Ok);
    }

    #[test]
    fn exit_codes() {
        assert_eq!(Verdict::Ok.exit_code(), 0);
        assert_eq!(Verdict::Warn.exit_code(), 1);
        assert_eq!(Verdict::Fail.exit_code(), 2);
        assert!(Verdict::Fail > Verdict::Warn && Verdict::Warn > Verdict::Ok);
    }
}
