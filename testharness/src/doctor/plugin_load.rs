//! The plugin as NCCL resolves it: load, exported tables, `NCCL_NET`, `init`.

#[allow(unused_imports)]
use super::*;

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

/// Resolves the plugin exactly as NCCL does (no fallback directory) and probes its tables;
/// pushes `plugin.load` and `plugin.abi`. Found only next to this binary (the harness's own
/// fallback, which NCCL does not have) is a `warn`; NCCL resolving to another copy than the one
/// built next to this binary is a `warn` too. Returns what to pass to `Net::load` when a
/// library with `ncclNetPlugin_v8` was found.
pub(super) fn check_plugin_load(
    value: &str,
    exe_dir: Option<&Path>,
    report: &mut Report,
) -> Option<String> {
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
pub(super) fn init_plugin(
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
