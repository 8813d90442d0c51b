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
    /// The same sums over the send comms' records only (`"side": "send"`).
    pub send_totals: BTreeMap<String, f64>,
    /// The same sums over the receive comms' records only (`"side": "recv"`).
    pub recv_totals: BTreeMap<String, f64>,
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
            let per_side = match side {
                Some("send") => Some(&mut self.send_totals),
                Some("recv") => Some(&mut self.recv_totals),
                _ => None,
            };
            if let Some(t) = per_side {
                *t.entry(k.clone()).or_insert(0.0) += x;
            }
        }
    }

    /// A counter summed over the send comms (0 when absent).
    pub fn send(&self, name: &str) -> f64 {
        self.send_totals.get(name).copied().unwrap_or(0.0)
    }

    /// A counter summed over the receive comms (0 when absent).
    pub fn recv(&self, name: &str) -> f64 {
        self.recv_totals.get(name).copied().unwrap_or(0.0)
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
            "send_totals": self.send_totals,
            "recv_totals": self.recv_totals,
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
            send_totals: side_totals(v, "send_totals"),
            recv_totals: side_totals(v, "recv_totals"),
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

/// Send-side WRs posted (data, CTS and credit writes), when the plugin counts them itself.
pub const SQ_WRS_POSTED: &str = "sq_wrs_posted";
/// Send-side post calls (`ibv_post_send`), when the plugin counts them itself.
pub const SQ_POST_CALLS: &str = "sq_post_calls";
/// Completions polled (work completions handed out by `ibv_poll_cq`), when the plugin counts
/// them itself.
pub const WCS_POLLED: &str = "wcs_polled";

/// The plugin's work on one rank (or per message, see [`Work::per`]), from its counters.
///
/// - `send_wrs`: WRs posted on send queues: each message's data WR (an eager SEND or a
///   rendezvous WRITE_WITH_IMM, counted by the send comm as `eager` + `rendezvous`) plus the
///   receive comm's RDMA WRITEs of clear-to-send entries (`cts`) and credit words
///   (`credit_msgs`); the plugin's own [`SQ_WRS_POSTED`] instead when it reports one.
/// - `recv_wrs`: receive WRs posted (`rq_wrs_posted`, zero-length ones included).
/// - `post_calls`: `rq_post_calls` plus the send-side post calls ([`SQ_POST_CALLS`]); where
///   the plugin does not report those, one per send-side WR (an upper bound: a comm posts the
///   WRs one plugin call produces in one call).
/// - `completions`: completions polled ([`WCS_POLLED`]); where not reported, derived as one
///   per send-side WR (verbsnet signals every one) plus one per arrived message (each
///   consumes a receive WR).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Work {
    /// Send-side WRs posted.
    pub send_wrs: f64,
    /// Receive WRs posted.
    pub recv_wrs: f64,
    /// Post calls, send and receive side.
    pub post_calls: f64,
    /// Completions polled.
    pub completions: f64,
    /// Whether the plugin reported its send-side WRs ([`SQ_WRS_POSTED`]).
    pub send_wrs_reported: bool,
    /// Whether the plugin reported its send-side post calls ([`SQ_POST_CALLS`]).
    pub post_calls_reported: bool,
    /// Whether the plugin reported its completions ([`WCS_POLLED`]).
    pub completions_reported: bool,
}

impl Work {
    /// The totals of one rank's comms.
    pub fn of(r: &RankStats) -> Work {
        let has = |k: &str| r.totals.contains_key(k);
        let total = |k: &str| r.totals.get(k).copied().unwrap_or(0.0);
        let send_wrs_reported = has(SQ_WRS_POSTED);
        let send_wrs = if send_wrs_reported {
            total(SQ_WRS_POSTED)
        } else {
            r.send("eager") + r.send("rendezvous") + r.recv("cts") + r.recv("credit_msgs")
        };
        let post_calls_reported = has(SQ_POST_CALLS);
        let send_posts = if post_calls_reported {
            total(SQ_POST_CALLS)
        } else {
            send_wrs
        };
        let completions_reported = has(WCS_POLLED);
        let completions = if completions_reported {
            total(WCS_POLLED)
        } else {
            send_wrs + r.recv("eager") + r.recv("rendezvous")
        };
        Work {
            send_wrs,
            recv_wrs: r.recv("rq_wrs_posted"),
            post_calls: send_posts + r.recv("rq_post_calls"),
            completions,
            send_wrs_reported,
            post_calls_reported,
            completions_reported,
        }
    }

    /// WRs posted, send and receive side.
    pub fn wrs(&self) -> f64 {
        self.send_wrs + self.recv_wrs
    }

    /// Divided by `messages` (0 stays 0).
    pub fn per(self, messages: u64) -> Work {
        let d = if messages == 0 {
            0.0
        } else {
            1.0 / messages as f64
        };
        Work {
            send_wrs: self.send_wrs * d,
            recv_wrs: self.recv_wrs * d,
            post_calls: self.post_calls * d,
            completions: self.completions * d,
            ..self
        }
    }

    /// Both sides together (reported only where both reported).
    pub fn plus(self, o: Work) -> Work {
        Work {
            send_wrs: self.send_wrs + o.send_wrs,
            recv_wrs: self.recv_wrs + o.recv_wrs,
            post_calls: self.post_calls + o.post_calls,
            completions: self.completions + o.completions,
            send_wrs_reported: self.send_wrs_reported && o.send_wrs_reported,
            post_calls_reported: self.post_calls_reported && o.post_calls_reported,
            completions_reported: self.completions_reported && o.completions_reported,
        }
    }

    /// As `--json` prints it.
    pub fn to_json(&self) -> Value {
        json!({
            "wrs_posted": self.wrs(),
            "send_wrs": self.send_wrs,
            "recv_wrs": self.recv_wrs,
            "post_calls": self.post_calls,
            "completions": self.completions,
            "send_wrs_reported": self.send_wrs_reported,
            "post_calls_reported": self.post_calls_reported,
            "completions_reported": self.completions_reported,
        })
    }
}

/// The per-message table of `--stats` in the point-to-point modes: one column per rank with
/// records, then both together; `messages` is the number of messages the run moved (each
/// counted once, whichever rank sent it). Lines start with `#`.
pub fn format_work(ranks: &[RankStats], messages: u64) -> String {
    let with: Vec<&RankStats> = ranks.iter().filter(|r| r.records > 0).collect();
    if with.is_empty() {
        return String::new();
    }
    let per: Vec<Work> = with.iter().map(|r| Work::of(r).per(messages)).collect();
    let both = per.iter().copied().fold(
        Work {
            send_wrs_reported: true,
            post_calls_reported: true,
            completions_reported: true,
            ..Work::default()
        },
        Work::plus,
    );
    let mut out = format!(
        "#\n# Work per message (the counters above / {messages} messages moved in the run, \
         warm-up and checks included; docs/performance.md, \"How to measure\")\n"
    );
    out.push_str(&format!("# {:<20}", "per message"));
    for r in &with {
        out.push_str(&format!(" {:>9}", format!("rank {}", r.rank)));
    }
    out.push_str(&format!(" {:>9}\n", "both"));
    let note = |reported: bool, what: &str| {
        if reported {
            String::new()
        } else {
            format!("  ({what})")
        }
    };
    let mut line = |name: &str, f: fn(&Work) -> f64, why: String| {
        out.push_str(&format!("# {name:<20}"));
        for w in &per {
            out.push_str(&format!(" {:>9.3}", f(w)));
        }
        out.push_str(&format!(" {:>9.3}{why}\n", f(&both)));
    };
    line(
        "WRs posted",
        Work::wrs,
        "  (send-side WRs + receive WRs)".into(),
    );
    line(
        "  send-side WRs",
        |w| w.send_wrs,
        note(
            both.send_wrs_reported,
            "eager + rendezvous of send comms, cts + credit_msgs of receive comms",
        ),
    );
    line("  receive WRs", |w| w.recv_wrs, "  (rq_wrs_posted)".into());
    line(
        "post calls",
        |w| w.post_calls,
        note(
            both.post_calls_reported,
            "at most: the plugin reports no sq_post_calls, counted one per send-side WR, \
             + rq_post_calls",
        ),
    );
    line(
        "completions polled",
        |w| w.completions,
        note(
            both.completions_reported,
            "derived: the plugin reports no wcs_polled; one per send-side WR + one per arrival",
        ),
    );
    out
}

/// A `{name: number}` object of [`RankStats::to_json`] (empty when absent).
fn side_totals(v: &Value, key: &str) -> BTreeMap<String, f64> {
    v.get(key)
        .and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .filter_map(|(k, x)| Some((k.clone(), x.as_f64()?)))
                .collect()
        })
        .unwrap_or_default()
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
