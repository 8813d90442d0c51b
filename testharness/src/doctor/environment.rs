//! The environment: `VERBSNET_*` typos and the `NCCL_*` variables that matter.

#[allow(unused_imports)]
use super::*;

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

/// `NCCL_*` variables that configure NCCL's own IB transport, which verbsnet does not read,
/// with the knob that replaces each (`None`: no equivalent). `NCCL_SOCKET_IFNAME` and
/// `NCCL_SOCKET_FAMILY` are not here: verbsnet reads them when its own knobs are unset
/// (docs/configuration.md, "The set-up interface").
pub const NCCL_REPLACED: &[(&str, Option<&str>, &str)] = &[
    ("NCCL_IB_HCA", Some("VERBSNET_IB_HCA"), "same syntax, except that prefixes never cut a number (mlx5_1 is not mlx5_10)"),
    ("NCCL_IB_GID_INDEX", Some("VERBSNET_IB_GID_INDEX"), "default: the automatic RoCE v2 IPv4 choice"),
    ("NCCL_IB_TIMEOUT", Some("VERBSNET_IB_TIMEOUT"), "same encoding"),
    ("NCCL_IB_RETRY_CNT", Some("VERBSNET_IB_RETRY_CNT"), "same meaning"),
    ("NCCL_IB_ROCE_VERSION_NUM", Some("VERBSNET_IB_GID_INDEX"), "verbsnet picks RoCE v2 itself; force a GID index instead"),
    ("NCCL_IB_ADDR_FAMILY", Some("VERBSNET_IB_GID_INDEX"), "IPv4-mapped GIDs are preferred; force an IPv6 GID by index"),
    ("NCCL_IB_SL", Some("VERBSNET_IB_SL"), "same meaning; unset: the communicator's trafficClass, else 0"),
    ("NCCL_IB_TC", Some("VERBSNET_IB_TC"), "same meaning; unset: the communicator's trafficClass, else 0"),
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
            .fix(format!("export {k}=... (docs/configuration.md)")),
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
