//! What the registry is made of: a [`Knob`] (one `VERBSNET_*` variable), its [`Kind`] (type and
//! accepted range), its documentation [`Group`], and the `knobs!` macro that turns the one list
//! in `knobs.rs` into the [`Config`] struct, [`KNOBS`] and the parser.

use std::fmt::Write as _;

use super::{Config, KNOBS};

/// One `VERBSNET_*` knob: the single registry entry the parser (ranges, error texts),
/// [`Config::describe`] (names and values), [`Config::default`] (its defaults are the entries'
/// default expressions; a test parses the `default` texts back to them) and
/// docs/configuration.md (its tables are generated from these entries: [`doc_table`]) all read.
#[derive(Clone, Copy, Debug)]
pub struct Knob {
    /// The environment variable, e.g. `VERBSNET_RQ_DEPTH`.
    pub var: &'static str,
    /// The short name used by [`Config::describe`] (the [`Config`] field), e.g. `rq_depth`.
    pub key: &'static str,
    /// The default, as text: a value the parser accepts (and which gives [`Config::default`]),
    /// or for a default derived from other knobs the rule, e.g. `min(16, rq_depth)`.
    pub default: &'static str,
    /// Type and range; [`Knob::accepted`] renders it for errors and the documentation.
    pub kind: Kind,
    /// The documentation section the knob is listed in.
    pub group: Group,
    /// What the knob does and why that default (Markdown; the documentation's table cell).
    pub doc: &'static str,
    /// NCCL IB's equivalent (Markdown), or `none`.
    pub nccl_ib: &'static str,
    /// Renders this knob's value in `config` for [`Config::describe`].
    pub(super) show: fn(&Config) -> String,
}

/// A knob's type and accepted range: declared once, read by the parser and rendered into
/// error messages and the documentation by [`Kind::accepted`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One of these keywords (case-insensitive).
    Choice(&'static [&'static str]),
    /// `1`/`0`, `true`/`false`, `on`/`off`, `yes`/`no`.
    Bool,
    /// A decimal integer in `lo..=hi`.
    Int {
        /// Smallest value.
        lo: u32,
        /// Largest value.
        hi: u32,
    },
    /// A decimal integer from `lo` up to a bound set by other knobs (`hi` names it).
    IntBelow {
        /// Smallest value.
        lo: u32,
        /// The bound, as an expression of other knobs.
        hi: &'static str,
    },
    /// An integer in `lo..=hi`, or `-1` for automatic.
    IntOrAuto {
        /// Smallest value.
        lo: u32,
        /// Largest value.
        hi: u32,
    },
    /// A byte count in `0..=hi`.
    Bytes {
        /// Largest value.
        hi: u32,
    },
    /// A byte count from 0 up to the value of the knob `hi`.
    BytesBelow {
        /// The knob bounding it.
        hi: &'static str,
    },
    /// Seconds, fractions allowed; `zero` says what 0 means (`None`: 0 is refused).
    Seconds {
        /// The meaning of 0, e.g. `off`.
        zero: Option<&'static str>,
    },
    /// Free-form text, checked by the parser; the description of what is accepted.
    Text(&'static str),
}

impl Kind {
    /// What a knob of this kind accepts, exactly as its errors say it (for knobs bounded by
    /// another, the error appends the bound in effect: `(here 1..=4)`), e.g.
    /// `an integer in 1..=32768`.
    #[must_use]
    pub fn accepted(&self) -> String {
        match *self {
            Kind::Choice(words) => format!("one of {}", words.join(", ")),
            Kind::Bool => "a boolean: 1, 0, true, false, on, off, yes, no".to_string(),
            Kind::Int { lo, hi } => format!("an integer in {lo}..={hi}"),
            Kind::IntBelow { lo, hi } => format!("an integer in {lo}..={hi}"),
            Kind::IntOrAuto { lo, hi } => format!("an integer in {lo}..={hi}, or -1 for auto"),
            Kind::Bytes { hi } => format!("an integer number of bytes in 0..={hi}"),
            Kind::BytesBelow { hi } => format!("an integer number of bytes in 0..={hi}"),
            Kind::Seconds { zero: Some(z) } => {
                format!("a number of seconds >= 0 (fractions allowed, 0 = {z})")
            }
            Kind::Seconds { zero: None } => "a number of seconds > 0 (fractions allowed)".into(),
            Kind::Text(t) => t.to_string(),
        }
    }

    /// The integer range of an integer kind: fixed, or `lo..=u32::MAX` for one bounded by
    /// another knob (the parser lowers `hi` to the bound in effect).
    pub(super) fn range(&self) -> Option<(u32, u32)> {
        match *self {
            Kind::Int { lo, hi } | Kind::IntOrAuto { lo, hi } => Some((lo, hi)),
            Kind::Bytes { hi } => Some((0, hi)),
            Kind::IntBelow { lo, .. } => Some((lo, u32::MAX)),
            Kind::BytesBelow { .. } => Some((0, u32::MAX)),
            _ => None,
        }
    }
}

/// The section of docs/configuration.md a knob is listed in, in the page's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// "Transport selection".
    Transport,
    /// "Receive queue".
    ReceiveQueue,
    /// "Eager and rendezvous".
    Eager,
    /// "Flow control and IB transport timers".
    FlowControl,
    /// "Devices and addresses".
    Devices,
    /// "Diagnostics".
    Diagnostics,
    /// "Connection set-up and peer liveness".
    Setup,
}

impl Group {
    /// Every group, in the page's order.
    pub const ALL: [Group; 7] = [
        Group::Transport,
        Group::ReceiveQueue,
        Group::Eager,
        Group::FlowControl,
        Group::Devices,
        Group::Diagnostics,
        Group::Setup,
    ];

    /// The marker naming the group's generated table in docs/configuration.md.
    #[must_use]
    pub fn marker(self) -> &'static str {
        match self {
            Group::Transport => "transport",
            Group::ReceiveQueue => "receive-queue",
            Group::Eager => "eager",
            Group::FlowControl => "flow-control",
            Group::Devices => "devices",
            Group::Diagnostics => "diagnostics",
            Group::Setup => "setup",
        }
    }
}

impl Knob {
    /// What the knob accepts, exactly as its errors say it ([`Kind::accepted`]).
    #[must_use]
    pub fn accepted(&self) -> String {
        self.kind.accepted()
    }
}

/// The Markdown table of one documentation section, generated from [`KNOBS`]: what
/// docs/configuration.md holds between `<!-- knobs:MARKER -->` and `<!-- /knobs -->` (a unit
/// test fails when the page differs; `VERBSNET_BLESS=1 cargo test --lib config` rewrites it).
#[must_use]
pub fn doc_table(group: Group) -> String {
    let cell = |s: &str| s.replace('|', "\\|");
    let mut t = String::from(
        "| variable | default | accepted | what it does and why that default | NCCL IB equivalent |\n\
         |---|---|---|---|---|\n",
    );
    for k in KNOBS.iter().filter(|k| k.group == group) {
        let _ = writeln!(
            t,
            "| `{}` | `{}` | {} | {} | {} |",
            k.var,
            k.default,
            cell(&k.accepted()),
            cell(k.doc),
            cell(k.nccl_ib)
        );
    }
    t
}

/// Declares every knob from one list (`knobs.rs`): each entry is the knob's [`Config`] field
/// (doc comment, name, type), its variable, documentation group, [`Kind`], default (the value,
/// an expression that may name earlier fields and the environment, and its text for the
/// documentation), parser, how [`Config::describe`] shows it, its documentation and NCCL IB's
/// equivalent. The fields that are not `VERBSNET_*` knobs (`extra`) come first in the list,
/// last in the struct.
///
/// It generates the [`Config`] struct, [`KNOBS`] (entries in list order) and
/// `Config::from_lookup`, which parses the entries in list order: a parser or a default may
/// use the fields above it (`rq_batch`'s bound is `rq_depth`), and an entry's parser returns
/// `Ok(None)` when the variable is unset or blank, so its default applies.
macro_rules! knobs {
    (
        env: $env:ident;
        extra {
            $(
                $(#[$xattr:meta])*
                $xfield:ident: $xty:ty = $xvalue:expr,
            )*
        }
        $(
            $(#[$attr:meta])*
            $field:ident: $ty:ty {
                var: $var:literal,
                group: $group:ident,
                kind: $kind:expr,
                default: $default:expr, $default_text:literal,
                parse: |$v:ident| $parse:expr,
                show: |$s:ident| $show:expr,
                doc: $doc:expr,
                nccl_ib: $nccl_ib:expr $(,)?
            }
        )*
    ) => {
        /// The plugin's effective configuration: one field per `VERBSNET_*` knob (in
        /// [`KNOBS`] order), then what else `init` reads.
        #[derive(Clone, Debug, PartialEq)]
        pub struct Config {
            $( $(#[$attr])* pub $field: $ty, )*
            $( $(#[$xattr])* pub $xfield: $xty, )*
        }

        /// Every knob, in parse (and `describe`) order: a knob bounded by another comes after it.
        pub const KNOBS: &[$crate::config::Knob] = &[
            $(
                $crate::config::Knob {
                    var: $var,
                    key: stringify!($field),
                    default: $default_text,
                    kind: $kind,
                    group: $crate::config::Group::$group,
                    doc: $doc,
                    nccl_ib: $nccl_ib,
                    show: |c: &Config| -> String {
                        let $s = &c.$field;
                        $show
                    },
                },
            )*
        ];

        impl Config {
            /// Parses variables from `get` (tests pass a map). `get` is also asked for
            /// `NCCL_DEBUG` (the default of [`Config::debug`]) and `NCCL_SOCKET_IFNAME` /
            /// `NCCL_SOCKET_FAMILY`.
            ///
            /// # Errors
            /// The first variable, in [`KNOBS`] order, whose value has the wrong type, is out
            /// of range or breaks a cross-field rule (`rq_batch <= rq_depth`,
            /// `rq_low_water <= rq_depth - rq_batch + 1`, `eager_limit <= eager_buf_size`).
            pub fn from_lookup(
                get: impl Fn(&str) -> Option<String>,
            ) -> Result<Config, $crate::config::ConfigError> {
                let $env = $crate::config::parse::Lookup(&get);
                $(
                    let $field: $ty = {
                        let $v = $crate::config::parse::Val::new($var, $kind, $env.value($var));
                        match $parse {
                            Some(value) => value,
                            None => $default,
                        }
                    };
                )*
                $( let $xfield: $xty = $xvalue; )*
                Ok(Config { $($field,)* $($xfield,)* })
            }
        }
    };
}

pub(super) use knobs;
