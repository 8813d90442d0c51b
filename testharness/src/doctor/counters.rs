//! Hardware error counters, read twice.

#[allow(unused_imports)]
use super::*;

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

pub(super) fn counter_checks(sysfs: &Path, interval: Duration) -> Vec<Check> {
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
