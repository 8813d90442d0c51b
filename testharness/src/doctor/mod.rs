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
//!
//! Layout: [`report`] (verdicts, checks, the report), `plugin_load` (plugin resolution, ABI,
//! `NCCL_NET`, init), `environment` (knob typos, `NCCL_*` variables), `device` (transport,
//! ports, GIDs, depth limits), `memlock` (pinned bytes against `RLIMIT_MEMLOCK`), `counters`
//! (hardware error counters), `peer` (the `--listen`/`--peer` test and its JSON side channel).

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
use nccl_net_verbsnet::engine::wire::{CTS_ENTRY_LEN, EAGER_HDR_LEN, REC_REGION_LEN};
use nccl_net_verbsnet::engine::{CTRL_STAGE_SLOTS, CTS_RING_ENTRIES, MAX_SEND_REQUESTS};
use nccl_net_verbsnet::transport::ib::survey::{self, DeviceSurvey, PortSurvey};
use nccl_net_verbsnet::transport::MAX_SEND_SGE;
use serde_json::{json, Value};

use crate::cli::parse_size;
use crate::plugin::{self, Handle, Net};

mod counters;
mod device;
mod environment;
mod memlock;
mod peer;
mod plugin_load;
pub mod report;
#[cfg(test)]
mod tests;

pub use self::counters::*;
pub use self::device::*;
pub use self::environment::*;
pub use self::memlock::*;
pub use self::peer::*;
pub use self::plugin_load::*;
pub use self::report::*;

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

/// What the local checks learnt about the device the peer test uses.
#[derive(Clone, Debug, Default)]
pub struct Local {
    /// `ib` or `tcp`.
    pub transport: String,
    /// The plugin's first device's name (`getProperties`), e.g. `rxe0` or `tcp0`.
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
            // The plugin names a verbs device as NCCL IB does (`rxe0`, no port): its first
            // usable port is the one the plugin listed first on that device.
            if d.name == local.device && local.mtu.is_none() {
                if let Some(p) = d.ports.iter().find(|p| p.usable.is_ok()) {
                    local.mtu = p.active_mtu;
                }
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
