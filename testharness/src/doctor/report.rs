//! Verdicts, checks and the report the doctor prints.

#[allow(unused_imports)]
use super::*;

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
    pub(super) fn new(
        name: impl Into<String>,
        verdict: Verdict,
        observed: impl Into<String>,
    ) -> Check {
        Check {
            name: name.into(),
            verdict,
            observed: observed.into(),
            expected: String::new(),
            fix: String::new(),
        }
    }

    pub(super) fn expect(mut self, e: impl Into<String>) -> Check {
        self.expected = e.into();
        self
    }

    pub(super) fn fix(mut self, f: impl Into<String>) -> Check {
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

/// The checks made so far.
#[derive(Debug, Default)]
pub struct Report {
    /// In order.
    pub checks: Vec<Check>,
}

impl Report {
    pub(super) fn push(&mut self, c: Check) {
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

    pub(super) fn print(&self, json: bool) {
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
