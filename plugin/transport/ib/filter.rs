//! The device filter `VERBSNET_IB_HCA` (`[^][=]name[:port],...`).
//!
//! Grammar: an optional `^` (the list *excludes* instead of selects), then an optional `=` (names
//! must match *exactly*), then comma-separated entries `name` or `name:port`. Whitespace around
//! entries is ignored, empty entries are skipped. An entry without `:port` covers every port.
//!
//! Name matching without `=` is by prefix, but only up to a number boundary: `pattern` matches
//! device `dev` when `dev == pattern`, or when `dev` starts with `pattern` and the two characters
//! meeting at the cut are not both ASCII digits. So the pattern never ends in the middle of a
//! number:
//!
//! | pattern  | matches                      | does not match |
//! |----------|------------------------------|----------------|
//! | `rxe`    | `rxe0`, `rxe1`, `rxe10`      | `mlx5_0`       |
//! | `rxe1`   | `rxe1`                       | `rxe10`, `rxe0`|
//! | `mlx5`   | `mlx5_0`, `mlx5_10`          | `mlx50`        |
//! | `mlx5_1` | `mlx5_1`                     | `mlx5_10`      |
//!
//! (NCCL's `NCCL_IB_HCA` matches plain prefixes, so there `mlx5_1` also selects `mlx5_10..19`;
//! we deliberately do not.)

use std::fmt;

/// A parsed `VERBSNET_IB_HCA` value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HcaFilter {
    /// `^`: the entries name devices to skip.
    pub exclude: bool,
    /// `=`: names match exactly instead of by prefix.
    pub exact: bool,
    /// The entries, in the order given.
    pub entries: Vec<HcaEntry>,
}

/// One `name[:port]` entry of an [`HcaFilter`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaEntry {
    /// Device name or prefix, e.g. `mlx5_0` or `rxe`.
    pub name: String,
    /// Port number; `None` = every port.
    pub port: Option<u8>,
}

/// A malformed filter string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaFilterError(pub String);

impl fmt::Display for HcaFilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HcaFilterError {}

impl HcaFilter {
    /// Parses `[^][=]name[:port],...`.
    ///
    /// # Errors
    /// A port that is not an integer in 1..=255, an entry with an empty name, or more than one
    /// `:` in an entry.
    pub fn parse(spec: &str) -> Result<HcaFilter, HcaFilterError> {
        let mut rest = spec.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let mut entries = Vec::new();
        for raw in rest.split(',') {
            let item = raw.trim();
            if item.is_empty() {
                continue;
            }
            let mut parts = item.split(':');
            let name = parts.next().unwrap_or_default().trim();
            let port = parts.next().map(str::trim);
            if parts.next().is_some() {
                return Err(HcaFilterError(format!(
                    "entry {item:?}: expected name or name:port"
                )));
            }
            if name.is_empty() {
                return Err(HcaFilterError(format!("entry {item:?} has no device name")));
            }
            let port = match port {
                None => None,
                Some(p) => match p.parse::<u8>() {
                    Ok(n) if n >= 1 => Some(n),
                    _ => {
                        return Err(HcaFilterError(format!(
                            "entry {item:?}: port {p:?} is not an integer in 1..=255"
                        )))
                    }
                },
            };
            entries.push(HcaEntry {
                name: name.to_owned(),
                port,
            });
        }
        Ok(HcaFilter {
            exclude,
            exact,
            entries,
        })
    }

    /// False when no port of device `dev` can be selected (the device need not be opened).
    pub fn may_select(&self, dev: &str) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let names = |e: &HcaEntry| {
            if self.exact {
                e.name == dev
            } else {
                name_prefix_matches(&e.name, dev)
            }
        };
        if self.exclude {
            // excluded as a whole only by an entry without a port
            !self.entries.iter().any(|e| e.port.is_none() && names(e))
        } else {
            self.entries.iter().any(names)
        }
    }

    /// True when port `port` of device `dev` is selected. An empty list selects everything
    /// (also with `^`: nothing is excluded).
    pub fn selects(&self, dev: &str, port: u8) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let hit = self.entries.iter().any(|e| {
            (e.port.is_none() || e.port == Some(port))
                && if self.exact {
                    e.name == dev
                } else {
                    name_prefix_matches(&e.name, dev)
                }
        });
        hit != self.exclude
    }
}

/// Prefix match that never cuts a number in two (see the module doc).
pub fn name_prefix_matches(pattern: &str, dev: &str) -> bool {
    let Some(rest) = dev.strip_prefix(pattern) else {
        return false;
    };
    let last = pattern.chars().next_back();
    let next = rest.chars().next();
    match (last, next) {
        (_, None) => true,
        (Some(a), Some(b)) => !(a.is_ascii_digit() && b.is_ascii_digit()),
        (None, Some(_)) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(spec: &str, dev: &str, port: u8) -> bool {
        HcaFilter::parse(spec).unwrap().selects(dev, port)
    }

    #[test]
    fn parses_flags_entries_and_ports() {
        let f = HcaFilter::parse(" ^=rxe0:1, mlx5_1 ,,").unwrap();
        assert!(f.exclude && f.exact);
        assert_eq!(
            f.entries,
            vec![
                HcaEntry {
                    name: "rxe0".into(),
                    port: Some(1)
                },
                HcaEntry {
                    name: "mlx5_1".into(),
                    port: None
                }
            ]
        );
        assert_eq!(HcaFilter::parse("").unwrap(), HcaFilter::default());
        assert!(HcaFilter::parse("rxe0:0").is_err());
        assert!(HcaFilter::parse("rxe0:x").is_err());
        assert!(HcaFilter::parse("rxe0:1:2").is_err());
        assert!(HcaFilter::parse(":1").is_err());
    }

    #[test]
    fn prefix_stops_at_number_boundary() {
        for (dev, want) in [("rxe0", false), ("rxe1", true), ("rxe10", false)] {
            assert_eq!(sel("rxe1", dev, 1), want, "rxe1 vs {dev}");
        }
        for dev in ["rxe0", "rxe1", "rxe10"] {
            assert!(sel("rxe", dev, 1), "rxe vs {dev}");
        }
        assert!(sel("rxe10", "rxe10", 1));
        assert!(!sel("rxe10", "rxe1", 1));
        assert!(sel("mlx5", "mlx5_10", 1));
        assert!(!sel("mlx5", "mlx50", 1));
        assert!(!sel("mlx5_1", "mlx5_10", 1));
        assert!(sel("mlx5_1", "mlx5_1", 1));
    }

    #[test]
    fn exact_and_exclude() {
        assert!(!sel("=rxe", "rxe0", 1));
        assert!(sel("=rxe0", "rxe0", 1));
        assert!(!sel("=rxe1", "rxe10", 1));
        // ^: everything except the listed ones
        assert!(!sel("^rxe1", "rxe1", 1));
        assert!(sel("^rxe1", "rxe10", 1));
        assert!(sel("^rxe1", "rxe0", 1));
        assert!(!sel("^rxe", "rxe10", 1));
        assert!(sel("^=rxe", "rxe0", 1));
        // empty list: nothing filtered
        assert!(sel("", "rxe0", 1));
        assert!(sel("^", "rxe0", 1));
    }

    #[test]
    fn whole_devices() {
        let f = HcaFilter::parse("rxe1:1").unwrap();
        assert!(f.may_select("rxe1") && !f.may_select("rxe10"));
        let f = HcaFilter::parse("^rxe1:1").unwrap();
        assert!(f.may_select("rxe1"), "port 2 could still be selected");
        let f = HcaFilter::parse("^rxe1").unwrap();
        assert!(!f.may_select("rxe1") && f.may_select("rxe10"));
        assert!(HcaFilter::default().may_select("anything"));
    }

    #[test]
    fn ports() {
        assert!(sel("rxe0:1", "rxe0", 1));
        assert!(!sel("rxe0:2", "rxe0", 1));
        assert!(sel("rxe0:2,rxe0:1", "rxe0", 1));
        assert!(sel("^rxe0:2", "rxe0", 1));
        assert!(!sel("^rxe0:1", "rxe0", 1));
    }
}
