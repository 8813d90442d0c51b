//! `--stats`: the plugin's counters.
//!
//! With `VERBSNET_STATS_FILE` set, the plugin appends one JSON object per comm when the comm is
//! closed: numbers keyed by counter name, plus `"side": "send" | "recv"`. Each rank points the
//! variable at its own file, reads back what was appended during the run, and sums every numeric
//! field; anything else (unknown non-numeric fields) is ignored.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

/// The one counter that is a minimum, not a total: the lowest receive-queue level seen.
const MIN_COUNTER: &str = "rq_min_level";

/// One rank's counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankStats {
    /// Rank.
    pub rank: usize,
    /// Objects read.
    pub records: usize,
    /// Objects with side "send" / "recv".
    pub send_records: usize,
    /// See `send_records`.
    pub recv_records: usize,
    /// Lines that were not JSON objects.
    pub bad_lines: usize,
    /// Sum of each numeric field over all records.
    pub totals: BTreeMap<String, f64>,
    /// Records per communicator (`"comm_id"`, written by the plugin for ncclNet v11/v12).
    pub comm_ids: BTreeMap<String, usize>,
    /// The file read.
    pub file: String,
}

impl RankStats {
    /// Parses the text appended by the plugin (a stream of JSON objects, normally one a line).
    pub fn parse(rank: usize, file: &str, text: &str) -> RankStats {
        let mut s = RankStats {
            rank,
            file: file.to_string(),
            ..RankStats::default()
        };
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let stream = serde_json::Deserializer::from_str(line).into_iter::<Value>();
            for item in stream {
                match item {
                    Ok(Value::Object(obj)) => s.add(&obj),
                    _ => {
                        s.bad_lines += 1;
                        break;
                    }
                }
            }
        }
        s
    }

    fn add(&mut self, obj: &Map<String, Value>) {
        self.records += 1;
        let side = obj.get("side").and_then(Value::as_str);
        if let Some(id) = obj.get("comm_id").and_then(Value::as_str) {
            *self.comm_ids.entry(id.to_string()).or_insert(0) += 1;
        }
        match side {
            Some("send") => self.send_records += 1,
            Some("recv") => self.recv_records += 1,
            _ => {}
        }
        for (k, v) in obj {
            let Some(x) = v.as_f64() else { continue };
            if k == MIN_COUNTER {
                // A low-water mark: the minimum over receive comms (meaningless on send comms).
                if side == Some("recv") {
                    let e = self.totals.entry(k.clone()).or_insert(x);
                    *e = e.min(x);
                }
                continue;
            }
            *self.totals.entry(k.clone()).or_insert(0.0) += x;
        }
    }

    /// As sent over the bootstrap and printed by `--json`.
    pub fn to_json(&self) -> Value {
        json!({
            "rank": self.rank,
            "file": self.file,
            "records": self.records,
            "send_records": self.send_records,
            "recv_records": self.recv_records,
            "bad_lines": self.bad_lines,
            "totals": self.totals,
            "comm_ids": self.comm_ids,
        })
    }

    /// Inverse of [`RankStats::to_json`].
    pub fn from_json(v: &Value) -> Option<RankStats> {
        let n = |k: &str| v.get(k).and_then(Value::as_u64).map(|x| x as usize);
        Some(RankStats {
            rank: n("rank")?,
            records: n("records")?,
            send_records: n("send_records")?,
            recv_records: n("recv_records")?,
            bad_lines: n("bad_lines")?,
            file: v.get("file")?.as_str()?.to_string(),
            totals: v
                .get("totals")?
                .as_object()?
                .iter()
                .filter_map(|(k, x)| Some((k.clone(), x.as_f64()?)))
                .collect(),
            // absent in output of older harness builds
            comm_ids: v
                .get("comm_ids")
                .and_then(Value::as_object)
                .map(|o| {
                    o.iter()
                        .filter_map(|(k, x)| Some((k.clone(), x.as_u64()? as usize)))
                        .collect()
                })
                .unwrap_or_default(),
        })
    }
}

fn fmt_num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x:.3}")
    }
}

/// A table with one line per counter and one column per rank (all lines start with `#`).
pub fn format_table(ranks: &[RankStats]) -> String {
    let mut out = String::from(
        "#\n# Plugin counters (VERBSNET_STATS_FILE, summed per rank over its comms; rq_min_level: the minimum over receive comms)\n",
    );
    for r in ranks.iter().filter(|r| r.records == 0) {
        out.push_str(&format!(
            "# rank {}: no records in {} (the plugin wrote none)\n",
            r.rank, r.file
        ));
    }
    for r in ranks.iter().filter(|r| r.bad_lines > 0) {
        out.push_str(&format!(
            "# rank {}: {} line(s) of {} were not JSON objects\n",
            r.rank, r.bad_lines, r.file
        ));
    }
    for r in ranks.iter().filter(|r| !r.comm_ids.is_empty()) {
        let ids: Vec<String> = r
            .comm_ids
            .iter()
            .map(|(id, n)| format!("commId {id} ({n} comms)"))
            .collect();
        out.push_str(&format!("# rank {}: {}\n", r.rank, ids.join(", ")));
    }
    let with: Vec<&RankStats> = ranks.iter().filter(|r| r.records > 0).collect();
    if with.is_empty() {
        return out;
    }
    let mut names: Vec<&String> = with.iter().flat_map(|r| r.totals.keys()).collect();
    names.sort();
    names.dedup();
    let name_w = names.iter().map(|n| n.len()).max().unwrap_or(0).max(7);
    let cells: Vec<Vec<String>> = names
        .iter()
        .map(|n| {
            with.iter()
                .map(|r| {
                    r.totals
                        .get(*n)
                        .map(|x| fmt_num(*x))
                        .unwrap_or_else(|| "-".into())
                })
                .collect()
        })
        .collect();
    let col_w = cells
        .iter()
        .flatten()
        .map(String::len)
        .max()
        .unwrap_or(0)
        .max(8);
    out.push_str(&format!("# {:<name_w$}", "counter"));
    for r in &with {
        out.push_str(&format!(" {:>col_w$}", format!("rank {}", r.rank)));
    }
    out.push('\n');
    out.push_str(&format!("# {:<name_w$}", "(comms)"));
    for r in &with {
        out.push_str(&format!(
            " {:>col_w$}",
            format!("{}s+{}r", r.send_records, r.recv_records)
        ));
    }
    out.push('\n');
    for (n, row) in names.iter().zip(&cells) {
        out.push_str(&format!("# {:<name_w$}", n));
        for c in row {
            out.push_str(&format!(" {c:>col_w$}"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_group_by_communicator() {
        let text = r#"{"side":"send","comm_id":"0xa","bytes_sent":1}
{"side":"recv","comm_id":"0xa","bytes_recv":1}
{"side":"send","comm_id":"0xb","bytes_sent":2}
{"side":"send","bytes_sent":4}"#;
        let s = RankStats::parse(0, "f", text);
        assert_eq!(s.comm_ids.get("0xa"), Some(&2));
        assert_eq!(s.comm_ids.get("0xb"), Some(&1));
        assert_eq!(s.totals["bytes_sent"], 7.0);
        assert!(!s.totals.contains_key("comm_id"));
        assert_eq!(RankStats::from_json(&s.to_json()), Some(s.clone()));
        assert!(format_table(&[s]).contains("# rank 0: commId 0xa (2 comms), commId 0xb (1 comms)"));
    }

    #[test]
    fn sums_numeric_fields_and_tolerates_the_rest() {
        let text = r#"{"side":"send","bytes_sent":100,"isend":3,"label":"x","nested":{"a":1}}
{"side":"recv","bytes_recv":100,"irecv":4,"new_counter":1.5}

{"side":"send","bytes_sent":50,"isend":1}
not json
"#;
        let s = RankStats::parse(1, "/tmp/f", text);
        assert_eq!(s.records, 3);
        assert_eq!(s.send_records, 2);
        assert_eq!(s.recv_records, 1);
        assert_eq!(s.bad_lines, 1);
        assert_eq!(s.totals["bytes_sent"], 150.0);
        assert_eq!(s.totals["isend"], 4.0);
        assert_eq!(s.totals["new_counter"], 1.5);
        assert!(!s.totals.contains_key("label"));
        assert!(!s.totals.contains_key("side"));
        assert_eq!(RankStats::from_json(&s.to_json()), Some(s));
    }

    #[test]
    fn rq_min_level_is_the_minimum_over_receive_comms() {
        let text = r#"{"side":"recv","rq_min_level":7}
{"side":"send","rq_min_level":0}
{"side":"recv","rq_min_level":3}
"#;
        let s = RankStats::parse(0, "/tmp/f", text);
        assert_eq!(s.totals["rq_min_level"], 3.0);
    }

    #[test]
    fn objects_on_one_line_are_all_read() {
        let s = RankStats::parse(0, "f", r#"{"side":"send","a":1} {"side":"recv","a":2}"#);
        assert_eq!(s.records, 2);
        assert_eq!(s.totals["a"], 3.0);
    }

    #[test]
    fn table_has_a_column_per_rank_and_says_when_empty() {
        let a = RankStats::parse(0, "f0", "{\"side\":\"send\",\"isend\":7}\n");
        let b = RankStats::parse(1, "f1", "{\"side\":\"recv\",\"irecv\":7,\"lat\":0.25}\n");
        let c = RankStats::parse(2, "f2", "");
        let t = format_table(&[a, b, c]);
        assert!(t.contains("rank 2: no records in f2"), "{t}");
        let header = t.lines().find(|l| l.starts_with("# counter")).unwrap();
        assert!(
            header.contains("rank 0") && header.contains("rank 1"),
            "{t}"
        );
        assert!(!header.contains("rank 2"), "{t}");
        let isend = t.lines().find(|l| l.starts_with("# isend")).unwrap();
        assert_eq!(
            isend.split_whitespace().collect::<Vec<_>>(),
            ["#", "isend", "7", "-"]
        );
        assert!(t.contains("0.250"));
        assert!(t.lines().all(|l| l.starts_with('#')));
    }
}
