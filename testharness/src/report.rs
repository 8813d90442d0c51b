//! Results: the nccl-tests-shaped table, its footer, and the `--json` object.
//!
//! algbw = size / time with GB = 1e9 bytes; busbw = algbw × [`Collective::busbw_factor`].
//! The time of a measurement is the average per iteration over the timed iterations, taken as
//! the maximum over ranks; #wrong is summed over ranks.

use serde_json::{json, Value};

use crate::cli::Collective;
use crate::cputime::CpuUse;
use crate::data::{DataType, RedOp};

/// One measurement (out-of-place or in-place) of one size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measure {
    /// Microseconds per iteration (max over ranks).
    pub time_us: f64,
    /// Wrong elements over all ranks and check iterations; `None` without checking.
    pub wrong: Option<u64>,
    /// CPU time and run-queue wait per timed iteration, summed over ranks; `None` where the
    /// kernel does not report them.
    pub cpu: Option<CpuUse>,
}

/// One line of the table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    /// Bytes (for all-gather and reduce-scatter: the total over ranks).
    pub size: u64,
    /// Elements (size / element size).
    pub count: u64,
    /// Element type.
    pub dtype: DataType,
    /// Operator, for reducing collectives.
    pub redop: Option<RedOp>,
    /// Root rank (-1: none).
    pub root: i32,
    /// Out-of-place measurement.
    pub out_of_place: Measure,
    /// In-place measurement.
    pub in_place: Measure,
}

/// GB/s for `size` bytes in `time_us` microseconds (0 when the time is 0).
pub fn algbw(size: u64, time_us: f64) -> f64 {
    if time_us > 0.0 {
        size as f64 / 1e3 / time_us
    } else {
        0.0
    }
}

/// (algbw, busbw) of one measurement.
pub fn bandwidths(coll: Collective, nranks: usize, size: u64, m: &Measure) -> (f64, f64) {
    let alg = algbw(size, m.time_us);
    (alg, alg * coll.busbw_factor(nranks))
}

/// The column headings (three `#` lines).
pub fn table_header() -> String {
    let mut s = String::new();
    let spans = format!("#{:51}  {:^31}  {:^31}", "", "out-of-place", "in-place");
    s.push_str(spans.trim_end());
    s.push('\n');
    s.push_str(&format!(
        "#{:>11} {:>13} {:>9} {:>7} {:>7}  {:>8} {:>7} {:>7} {:>6}  {:>8} {:>7} {:>7} {:>6}\n",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    ));
    s.push_str(&format!(
        "#{:>11} {:>13} {:>9} {:>7} {:>7}  {:>8} {:>7} {:>7} {:>6}  {:>8} {:>7} {:>7} {:>6}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    ));
    s
}

fn fmt_time(us: f64) -> String {
    if us >= 1e5 {
        format!("{us:.0}")
    } else {
        format!("{us:.2}")
    }
}

fn fmt_measure(coll: Collective, nranks: usize, size: u64, m: &Measure) -> String {
    let (alg, bus) = bandwidths(coll, nranks, size, m);
    let wrong = m
        .wrong
        .map(|w| w.to_string())
        .unwrap_or_else(|| "N/A".into());
    format!(
        "{:>8} {:>7.2} {:>7.2} {:>6}",
        fmt_time(m.time_us),
        alg,
        bus,
        wrong
    )
}

/// One table line.
pub fn format_row(coll: Collective, nranks: usize, row: &Row) -> String {
    format!(
        "{:>12} {:>13} {:>9} {:>7} {:>7}  {}  {}",
        row.size,
        row.count,
        row.dtype.name(),
        row.redop.map(|o| o.name()).unwrap_or("none"),
        row.root,
        fmt_measure(coll, nranks, row.size, &row.out_of_place),
        fmt_measure(coll, nranks, row.size, &row.in_place),
    )
}

/// Sum of #wrong over all rows and both placements.
pub fn total_wrong(rows: &[Row]) -> u64 {
    rows.iter()
        .flat_map(|r| [r.out_of_place.wrong, r.in_place.wrong])
        .map(|w| w.unwrap_or(0))
        .sum()
}

/// Mean busbw over all rows, out-of-place and in-place alike.
pub fn avg_busbw(coll: Collective, nranks: usize, rows: &[Row]) -> f64 {
    if rows.is_empty() {
        return 0.0;
    }
    let sum: f64 = rows
        .iter()
        .flat_map(|r| [r.out_of_place, r.in_place].map(|m| bandwidths(coll, nranks, r.size, &m).1))
        .sum();
    sum / (2 * rows.len()) as f64
}

/// The footer lines.
pub fn footer(coll: Collective, nranks: usize, rows: &[Row]) -> String {
    let wrong = total_wrong(rows);
    format!(
        "# Out of bounds values : {} {}\n# Avg bus bandwidth    : {:.6} \n#\n# Collective test concluded: {}",
        wrong,
        if wrong == 0 { "OK" } else { "FAILED" },
        avg_busbw(coll, nranks, rows),
        coll.name()
    )
}

fn measure_json(coll: Collective, nranks: usize, size: u64, m: &Measure) -> Value {
    let (alg, bus) = bandwidths(coll, nranks, size, m);
    json!({
        "time_us": m.time_us,
        "algbw": alg,
        "busbw": bus,
        "wrong": m.wrong,
        "cpu_us": m.cpu.map(|c| c.cpu_us),
        "runq_us": m.cpu.map(|c| c.runq_us),
    })
}

/// The rows as JSON values.
pub fn rows_json(coll: Collective, nranks: usize, rows: &[Row]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| {
                json!({
                    "size": r.size,
                    "count": r.count,
                    "type": r.dtype.name(),
                    "redop": r.redop.map(|o| o.name()).unwrap_or("none"),
                    "root": r.root,
                    "out_of_place": measure_json(coll, nranks, r.size, &r.out_of_place),
                    "in_place": measure_json(coll, nranks, r.size, &r.in_place),
                })
            })
            .collect(),
    )
}

/// One size of a `--baseline` run, next to the plugin's row of the same size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BaselineRow {
    /// Bytes (as the plugin row's size).
    pub size: u64,
    /// Microseconds per iteration (max over ranks).
    pub time_us: f64,
    /// Bytes of the last iteration that differed from what was sent, over all ranks.
    pub wrong: u64,
    /// CPU time and run-queue wait per timed iteration, summed over threads and ranks.
    pub cpu: Option<CpuUse>,
}

/// ours / baseline busbw, `None` when the baseline moved nothing measurable.
pub fn ratio(ours: f64, base: f64) -> Option<f64> {
    (base > 0.0 && ours.is_finite()).then(|| ours / base)
}

/// The headings of the baseline table (three `#` lines).
pub fn baseline_header() -> String {
    let mut s = String::new();
    s.push_str(
        format!(
            "#{:12} {:^25}  {:^16}  {:^16}  {:^37}",
            "",
            "plain TCP baseline",
            "ours out-of-place",
            "ours in-place",
            "per iteration, all ranks (us)"
        )
        .trim_end(),
    );
    s.push('\n');
    s.push_str(&format!(
        "#{:>11} {:>9} {:>7} {:>7}  {:>8} {:>7}  {:>8} {:>7}  {:>9} {:>9} {:>9} {:>9}\n",
        "size",
        "time",
        "algbw",
        "busbw",
        "busbw",
        "ratio",
        "busbw",
        "ratio",
        "base cpu",
        "base runq",
        "oop cpu",
        "oop runq"
    ));
    s.push_str(&format!(
        "#{:>11} {:>9} {:>7} {:>7}  {:>8} {:>7}  {:>8} {:>7}  {:>9} {:>9} {:>9} {:>9}",
        "(B)", "(us)", "(GB/s)", "(GB/s)", "(GB/s)", "", "(GB/s)", "", "", "", "", ""
    ));
    s
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "N/A".into(), |r| format!("{r:.2}"))
}

fn fmt_cpu(c: Option<CpuUse>) -> [String; 2] {
    match c {
        Some(c) => [fmt_time(c.cpu_us), fmt_time(c.runq_us)],
        None => ["N/A".into(), "N/A".into()],
    }
}

fn baseline_measure(base: &BaselineRow) -> Measure {
    Measure {
        time_us: base.time_us,
        wrong: None,
        cpu: base.cpu,
    }
}

/// One line of the baseline table: the baseline's time and bandwidths, the plugin's busbw and
/// the ratio ours/baseline (out-of-place and in-place), then CPU time and run-queue wait per
/// iteration summed over ranks, of the baseline and of our out-of-place run.
pub fn format_baseline_row(
    coll: Collective,
    nranks: usize,
    row: &Row,
    base: &BaselineRow,
) -> String {
    let (alg, bus) = bandwidths(coll, nranks, base.size, &baseline_measure(base));
    let (_, oop) = bandwidths(coll, nranks, row.size, &row.out_of_place);
    let (_, ip) = bandwidths(coll, nranks, row.size, &row.in_place);
    let [bc, bq] = fmt_cpu(base.cpu);
    let [oc, oq] = fmt_cpu(row.out_of_place.cpu);
    format!(
        "{:>12} {:>9} {:>7.2} {:>7.2}  {:>8.2} {:>7}  {:>8.2} {:>7}  {:>9} {:>9} {:>9} {:>9}",
        base.size,
        fmt_time(base.time_us),
        alg,
        bus,
        oop,
        fmt_ratio(ratio(oop, bus)),
        ip,
        fmt_ratio(ratio(ip, bus)),
        bc,
        bq,
        oc,
        oq,
    )
}

/// The baseline measurement of a row as JSON (added to the row as `"baseline"`).
pub fn baseline_json(coll: Collective, nranks: usize, row: &Row, base: &BaselineRow) -> Value {
    let (alg, bus) = bandwidths(coll, nranks, base.size, &baseline_measure(base));
    let (_, oop) = bandwidths(coll, nranks, row.size, &row.out_of_place);
    let (_, ip) = bandwidths(coll, nranks, row.size, &row.in_place);
    json!({
        "time_us": base.time_us,
        "algbw": alg,
        "busbw": bus,
        "wrong": base.wrong,
        "cpu_us": base.cpu.map(|c| c.cpu_us),
        "runq_us": base.cpu.map(|c| c.runq_us),
        "ratio_out_of_place": ratio(oop, bus),
        "ratio_in_place": ratio(ip, bus),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(size: u64, t: f64, wrong: Option<u64>) -> Row {
        Row {
            size,
            count: size / 4,
            dtype: DataType::Float,
            redop: Some(RedOp::Sum),
            root: -1,
            out_of_place: Measure {
                time_us: t,
                wrong,
                cpu: None,
            },
            in_place: Measure {
                time_us: t * 2.0,
                wrong,
                cpu: None,
            },
        }
    }

    #[test]
    fn bandwidth_uses_1e9_bytes() {
        // 1 GB in 1 s.
        assert!((algbw(1_000_000_000, 1e6) - 1.0).abs() < 1e-12);
        assert_eq!(algbw(0, 5.0), 0.0);
        assert_eq!(algbw(100, 0.0), 0.0);
        let m = Measure {
            time_us: 1000.0,
            wrong: Some(0),
            cpu: None,
        };
        let (a, b) = bandwidths(Collective::AllReduce, 4, 4_000_000, &m);
        assert!((a - 4.0).abs() < 1e-12);
        assert!((b - 6.0).abs() < 1e-12);
    }

    #[test]
    fn rows_line_up_under_the_header() {
        let head = table_header();
        let line = format_row(Collective::AllReduce, 2, &row(1048576, 1234.5, Some(0)));
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            cols,
            vec![
                "1048576", "262144", "float", "sum", "-1", "1234.50", "0.85", "0.85", "0",
                "2469.00", "0.42", "0.42", "0"
            ]
        );
        // Same width as the heading lines, columns right-aligned at the same places.
        let names = head.lines().nth(1).unwrap();
        assert_eq!(names.len(), line.len());
        for word in [
            "size", "count", "type", "redop", "root", "time", "algbw", "#wrong",
        ] {
            let end = names.find(word).unwrap() + word.len();
            let at = line.as_bytes()[end - 1];
            assert_ne!(at, b' ', "{word} not right-aligned over its values");
            assert!(end == line.len() || line.as_bytes()[end] == b' ');
        }
        let r = Row {
            redop: None,
            ..row(8, 10.0, None)
        };
        let line = format_row(Collective::Sendrecv, 2, &r);
        assert!(line.contains(" none "), "{line}");
        assert!(line.trim_end().ends_with("N/A"), "{line}");
    }

    #[test]
    fn footer_reports_wrong_and_average() {
        let rows = [
            row(1_000_000, 1000.0, Some(0)),
            row(2_000_000, 1000.0, Some(0)),
        ];
        // busbw (n=2, factor 1): 1, 0.5, 2, 1 → mean 1.125.
        assert!((avg_busbw(Collective::AllReduce, 2, &rows) - 1.125).abs() < 1e-12);
        let f = footer(Collective::AllReduce, 2, &rows);
        assert!(f.starts_with("# Out of bounds values : 0 OK"), "{f}");
        assert!(f.contains("# Avg bus bandwidth    : 1.125000"), "{f}");
        let bad = [row(8, 1.0, Some(3))];
        assert_eq!(total_wrong(&bad), 6);
        assert!(footer(Collective::AllReduce, 2, &bad).contains(": 6 FAILED"));
    }

    #[test]
    fn baseline_rows_line_up_and_give_ratios() {
        let r = row(1_000_000, 1000.0, Some(0)); // ours: 1 GB/s out-of-place, 0.5 in place
        let r = Row {
            out_of_place: Measure {
                cpu: Some(CpuUse {
                    cpu_us: 1500.0,
                    runq_us: 20.5,
                }),
                ..r.out_of_place
            },
            ..r
        };
        let b = BaselineRow {
            size: 1_000_000,
            time_us: 500.0,
            wrong: 0,
            cpu: Some(CpuUse {
                cpu_us: 700.0,
                runq_us: 0.0,
            }),
        };
        let line = format_baseline_row(Collective::Sendrecv, 2, &r, &b);
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            cols,
            vec![
                "1000000", "500.00", "2.00", "2.00", "1.00", "0.50", "0.50", "0.25", "700.00",
                "0.00", "1500.00", "20.50"
            ]
        );
        let head = baseline_header();
        assert_eq!(head.lines().count(), 3);
        let names = head.lines().nth(1).unwrap();
        assert_eq!(names.len(), line.len(), "{names}\n{line}");
        let v = baseline_json(Collective::Sendrecv, 2, &r, &b);
        assert!((v["busbw"].as_f64().unwrap() - 2.0).abs() < 1e-12);
        assert!((v["ratio_out_of_place"].as_f64().unwrap() - 0.5).abs() < 1e-12);
        assert!((v["cpu_us"].as_f64().unwrap() - 700.0).abs() < 1e-12);
        let zero = BaselineRow {
            size: 0,
            time_us: 1.0,
            wrong: 0,
            cpu: None,
        };
        let line = format_baseline_row(Collective::Sendrecv, 2, &row(0, 1.0, None), &zero);
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols[7..], ["N/A"; 5], "{line}");
        assert!(
            baseline_json(Collective::Sendrecv, 2, &row(0, 1.0, None), &zero)["ratio_in_place"]
                .is_null()
        );
    }

    #[test]
    fn json_rows_carry_everything() {
        let v = rows_json(Collective::AllGather, 4, &[row(4_000_000, 1000.0, Some(0))]);
        let r = &v[0];
        assert_eq!(r["size"], 4_000_000);
        assert_eq!(r["type"], "float");
        assert_eq!(r["out_of_place"]["wrong"], 0);
        assert!((r["out_of_place"]["busbw"].as_f64().unwrap() - 3.0).abs() < 1e-12);
        let v = rows_json(Collective::AllGather, 4, &[row(8, 1.0, None)]);
        assert!(v[0]["in_place"]["wrong"].is_null());
    }
}
