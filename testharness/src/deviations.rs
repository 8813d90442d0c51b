//! Contract deviations: what a plugin did that the ext-net contract (NCCL's
//! `plugins/net/README.md`, `src/include/plugin/net/net_v*.h`) does not allow, but NCCL does not
//! depend on, so a job under NCCL would still run. The harness reports them instead of failing
//! the run; the data checks still decide whether the results are right.
//!
//! One rank is one process, so the record is process-wide: the proxy notes a deviation where it
//! sees one ([`note`]), and the rank reports the totals at the end ([`all`]).

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use serde_json::{json, Value};

/// `test` reported a finished receive without writing its size. NCCL presets the sizes to 0
/// and uses them only to decide on a GPU-direct flush and for its profiler
/// (`src/transport/net.cc`: `recvProxyProgress`); the README asks for the received bytes.
pub const SIZE_UNWRITTEN: &str = "test left the received size unwritten";

/// `test` reported a size other than the bytes sent (same use by NCCL as above).
pub const SIZE_WRONG: &str = "test reported a size other than the bytes sent";

/// `devices` did not count one more device after a successful `makeVDevice`. NCCL takes the
/// virtual devices to be the ones `devices` adds after the physical ones
/// (`src/graph/topo.cc`: `ncclTopoProcessNet`), so it would see another number of them.
pub const VDEV_COUNT: &str = "devices did not grow by one after makeVDevice";

/// `makeVDevice` wrote an index other than the last device's. NCCL only logs that index
/// (`src/graph/topo.cc`: `ncclTopoMakeVnic`) and uses the devices after the physical ones.
pub const VDEV_INDEX: &str = "makeVDevice returned an index other than the last device";

/// `getProperties` of the new virtual device does not list exactly the fused devices in
/// `vProps`. NCCL reads them to place the virtual NIC and hide its physical ones
/// (`src/graph/topo.cc`: `ncclTopoUpdateVNics`, `ncclTopoGetVNicParent`).
pub const VDEV_PROPS: &str = "getProperties of the virtual device lists other devices in vProps";

/// One kind of deviation on this rank.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// How often.
    pub count: u64,
    /// The first occurrence, described.
    pub first: String,
}

static SEEN: Mutex<BTreeMap<&'static str, Seen>> = Mutex::new(BTreeMap::new());

/// Records one occurrence of `kind` (one of the constants of this module).
pub fn note(kind: &'static str, detail: impl FnOnce() -> String) {
    let mut m = SEEN.lock().unwrap_or_else(PoisonError::into_inner);
    let e = m.entry(kind).or_default();
    if e.count == 0 {
        e.first = detail();
    }
    e.count += 1;
}

/// Everything recorded on this rank, as JSON: `[{"kind", "count", "first"}]`.
pub fn all() -> Value {
    let m = SEEN.lock().unwrap_or_else(PoisonError::into_inner);
    Value::Array(
        m.iter()
            .map(|(k, s)| json!({"kind": k, "count": s.count, "first": s.first}))
            .collect(),
    )
}

/// The ranks' records (`per_rank[r]` from [`all`]) merged per kind:
/// `[{"kind", "count", "ranks", "first"}]`, the first occurrence of the lowest rank.
pub fn merge(per_rank: &[Value]) -> Value {
    let mut out: BTreeMap<String, (u64, Vec<usize>, String)> = BTreeMap::new();
    for (r, list) in per_rank.iter().enumerate() {
        for d in list.as_array().into_iter().flatten() {
            let kind = d["kind"].as_str().unwrap_or("?").to_string();
            let e = out.entry(kind).or_insert_with(|| {
                (
                    0,
                    Vec::new(),
                    format!("rank {r}: {}", d["first"].as_str().unwrap_or("?")),
                )
            });
            e.0 += d["count"].as_u64().unwrap_or(0);
            e.1.push(r);
        }
    }
    Value::Array(
        out.into_iter()
            .map(|(k, (c, ranks, first))| json!({"kind": k, "count": c, "ranks": ranks, "first": first}))
            .collect(),
    )
}

/// The text lines for [`merge`]'s result, one per kind.
pub fn lines(merged: &Value) -> Vec<String> {
    merged
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            format!(
                "# Contract deviation (NCCL does not depend on it; reported, not failed): {}: {} \
                 time(s) on rank(s) {}; first: {}",
                d["kind"].as_str().unwrap_or("?"),
                d["count"],
                d["ranks"]
                    .as_array()
                    .map(|r| r.iter().map(Value::to_string).collect::<Vec<_>>().join(","))
                    .unwrap_or_default(),
                d["first"].as_str().unwrap_or("?"),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_merge_per_kind_over_ranks() {
        let r0 = json!([{"kind": SIZE_UNWRITTEN, "count": 3, "first": "receive 0"}]);
        let r1 = json!([
            {"kind": SIZE_UNWRITTEN, "count": 2, "first": "receive 5"},
            {"kind": SIZE_WRONG, "count": 1, "first": "receive 1: 4 bytes, sent 8"}
        ]);
        let m = merge(&[r0, json!([]), r1]);
        let a = m.as_array().unwrap();
        assert_eq!(a.len(), 2);
        let u = a.iter().find(|d| d["kind"] == SIZE_UNWRITTEN).unwrap();
        assert_eq!(
            (u["count"].as_u64(), &u["ranks"]),
            (Some(5), &json!([0, 2]))
        );
        assert_eq!(u["first"], "rank 0: receive 0");
        let l = lines(&m);
        assert_eq!(l.len(), 2);
        assert!(l
            .iter()
            .any(|x| x.contains("5 time(s) on rank(s) 0,2; first: rank 0: receive 0")));
        assert!(lines(&merge(&[json!([])])).is_empty());
    }
}
