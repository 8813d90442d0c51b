//! The value parsers the knob entries call (`parse: |v| v.int(None)?`): each reads one
//! variable's raw text against its [`Kind`] and fails with the registry's error text.
//!
//! Every parser returns `Ok(None)` for an unset or blank variable (its default then applies),
//! ignores surrounding whitespace and matches keywords case-insensitively.

use std::fmt::Write as _;
use std::time::Duration;

use super::{ConfigError, Kind};

/// The getter `Config::from_lookup` was given, with "empty = unset" applied.
pub(super) struct Lookup<'a, F: Fn(&str) -> Option<String>>(pub(super) &'a F);

impl<F: Fn(&str) -> Option<String>> Lookup<'_, F> {
    /// The raw value of `var`, or `None` when unset or blank.
    pub(super) fn value(&self, var: &str) -> Option<String> {
        (self.0)(var).filter(|v| !v.trim().is_empty())
    }
}

/// One knob's raw value (`None`: unset or blank), with the variable and kind its errors name.
pub(super) struct Val {
    var: &'static str,
    kind: Kind,
    raw: Option<String>,
}

impl Val {
    pub(super) fn new(var: &'static str, kind: Kind, raw: Option<String>) -> Val {
        Val { var, kind, raw }
    }

    /// The error for this value, with the kind's accepted text.
    fn invalid(&self) -> ConfigError {
        ConfigError {
            var: self.var.to_string(),
            value: self.raw.clone().unwrap_or_default(),
            expected: self.kind.accepted(),
        }
    }

    /// An integer in the kind's range; `bound` is the upper bound in effect for a knob
    /// bounded by another (the error's `expected` then adds it: `(here 1..=4)`). `T` is the
    /// field's type, which holds the kind's whole range.
    pub(super) fn int<T: TryFrom<u32>>(
        &self,
        bound: Option<u32>,
    ) -> Result<Option<T>, ConfigError> {
        let Some(v) = &self.raw else {
            return Ok(None);
        };
        let (lo, hi) = self.kind.range().unwrap_or((0, u32::MAX));
        let hi = bound.map_or(hi, |b| b.min(hi));
        let n = v.trim().parse::<u64>().ok();
        match n.and_then(|n| u32::try_from(n).ok()) {
            Some(n) if (lo..=hi).contains(&n) => {
                T::try_from(n).map(Some).map_err(|_| self.invalid())
            }
            _ => {
                let mut e = self.invalid();
                if e.expected.contains("VERBSNET_") {
                    let _ = write!(e.expected, " (here {lo}..={hi})");
                }
                Err(e)
            }
        }
    }

    /// An integer in the kind's range, or `-1` (NCCL's spelling of "auto") as `Some(None)`.
    pub(super) fn int_or_auto(&self) -> Result<Option<Option<u32>>, ConfigError> {
        match &self.raw {
            Some(v) if v.trim() == "-1" => Ok(Some(None)),
            _ => Ok(self.int(None)?.map(Some)),
        }
    }

    /// A boolean: `1`/`0`, `true`/`false`, `on`/`off`, `yes`/`no`.
    pub(super) fn bool(&self) -> Result<Option<bool>, ConfigError> {
        let Some(v) = &self.raw else {
            return Ok(None);
        };
        match v.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "on" | "yes" => Ok(Some(true)),
            "0" | "false" | "off" | "no" => Ok(Some(false)),
            _ => Err(self.invalid()),
        }
    }

    /// One of the kind's keywords, as the value at the same position in `values`.
    pub(super) fn keyword<T: Copy>(&self, values: &[T]) -> Result<Option<T>, ConfigError> {
        let Some(v) = &self.raw else {
            return Ok(None);
        };
        let Kind::Choice(words) = self.kind else {
            return Err(self.invalid());
        };
        let v = v.trim().to_ascii_lowercase();
        let i = words.iter().position(|w| *w == v);
        i.and_then(|i| values.get(i).copied())
            .map(Some)
            .ok_or_else(|| self.invalid())
    }

    /// Seconds (fractions allowed): `Some(None)` for 0 when the kind gives 0 a meaning (off).
    pub(super) fn seconds(&self) -> Result<Option<Option<Duration>>, ConfigError> {
        let Some(v) = &self.raw else {
            return Ok(None);
        };
        let secs = v.trim().parse::<f64>().ok().filter(|s| *s >= 0.0);
        let Some(d) = secs.and_then(|s| Duration::try_from_secs_f64(s).ok()) else {
            return Err(self.invalid());
        };
        match self.kind {
            Kind::Seconds { zero: None } if d.is_zero() => Err(self.invalid()),
            _ => Ok(Some((!d.is_zero()).then_some(d))),
        }
    }

    /// Seconds > 0 (a kind that refuses 0).
    pub(super) fn positive_seconds(&self) -> Result<Option<Duration>, ConfigError> {
        self.seconds()?
            .map(|d| d.ok_or_else(|| self.invalid()))
            .transpose()
    }

    /// The trimmed text, if `ok` accepts it.
    pub(super) fn text_if(&self, ok: impl Fn(&str) -> bool) -> Result<Option<String>, ConfigError> {
        match &self.raw {
            None => Ok(None),
            Some(v) if ok(v.trim()) => Ok(Some(v.trim().to_string())),
            Some(_) => Err(self.invalid()),
        }
    }

    /// The trimmed text, parsed as `T`.
    pub(super) fn parsed<T: std::str::FromStr>(&self) -> Result<Option<T>, ConfigError> {
        self.raw
            .as_ref()
            .map(|v| v.trim().parse::<T>().map_err(|_| self.invalid()))
            .transpose()
    }
}

/// How `describe` shows an optional text: `none` when unset, quoted when it has whitespace.
pub(super) fn show_opt_str(v: Option<&str>, none: &str) -> String {
    match v {
        None => none.to_string(),
        Some(s) if s.contains(char::is_whitespace) => format!("{s:?}"),
        Some(s) => s.to_string(),
    }
}

/// How `describe` shows seconds that may be off.
pub(super) fn show_duration(d: Option<Duration>) -> String {
    d.map_or("off".to_string(), |d| format!("{}s", d.as_secs_f64()))
}
