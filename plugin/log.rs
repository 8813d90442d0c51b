//! `tracing` events bridged to NCCL's logger (or to stderr outside NCCL).
//!
//! The plugin emits with the ordinary `tracing` macros; [`init`] installs one global
//! subscriber (a cdylib's statics are private to the `.so`, so the plugin is its own
//! "executable" here) whose layer forwards each enabled event:
//!
//! - **with an NCCL logger**: as `NET/verbsnet : <message> <field=value...>` through
//!   the [`NcclSink`] `init` was given (the ABI layer's wrapper of the `logFunction` NCCL passed,
//!   which calls it with the format `"%s"`). `ERROR`/`WARN` become [`NcclLevel::Warn`] with
//!   [`NcclSubsys::All`] (`NCCL_LOG_WARN`, `NCCL_ALL`); `INFO` becomes `Info` and
//!   `DEBUG`/`TRACE` `Trace`, with `InitNet` (`NCCL_INIT | NCCL_NET`) for events whose
//!   target is [`INIT_TARGET`] (or below it, `verbsnet::init::...`) and `Net` otherwise. This
//!   module knows no ABI types: the sink maps these to NCCL's values.
//!   NCCL prints a line only if its level is at most `NCCL_DEBUG` and its flags meet
//!   `NCCL_DEBUG_SUBSYS` (default `INIT,BOOTSTRAP,ENV`), so setup lines must use
//!   `info!(target: verbsnet::log::INIT_TARGET, ...)` to be seen by default.
//! - **without one** (outside NCCL, e.g. the test harness): as `verbsnet <LEVEL> <message>
//!   <field=value...>` on stderr.
//!
//! Fields of the spans the event is inside follow the event's own fields, outermost first,
//! except a span's `label` field: it names what the event is about (a comm's span carries
//! `label = "send comm <local> -> <peer> (<dev>)"`, see `comm/mod.rs`) and is written
//! first, as `<label>: <message> ...`, so the label leads the line NCCL prints. A [`Label`]
//! entered on the thread does the same for the data path's calls, where a span costs too much
//! (see [`Label`]); its text comes before the spans' labels.
//! The level ([`DebugLevel`], from `VERBSNET_DEBUG`) is applied per callsite
//! (`register_callsite` answers always/never and `max_level_hint` is exact), so a disabled
//! `trace!` costs one comparison against a global maximum.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{span, Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
use tracing_subscriber::registry::{LookupSpan, Registry};

pub use crate::config::DebugLevel;

/// The NCCL log level of a line (`ncclDebugLogLevel`: the sink maps it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclLevel {
    /// `NCCL_LOG_WARN`: always printed when `NCCL_DEBUG` is `WARN` or more.
    Warn,
    /// `NCCL_LOG_INFO`.
    Info,
    /// `NCCL_LOG_TRACE`.
    Trace,
}

/// The NCCL subsystems a line is tagged with (`ncclDebugLogSubSys`: the sink maps them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclSubsys {
    /// `NCCL_ALL` (warnings: shown whatever `NCCL_DEBUG_SUBSYS` says).
    All,
    /// `NCCL_NET`.
    Net,
    /// `NCCL_INIT | NCCL_NET` (setup lines, shown by NCCL's default `NCCL_DEBUG_SUBSYS`).
    InitNet,
}

/// Where lines for NCCL go: implemented by the ABI layer over the `logFunction` NCCL passes
/// to `init` (`crate::ffi::logger`), so this module needs no ABI types.
pub trait NcclSink: Send + Sync {
    /// Logs one line; `text` is the whole line (`NET/verbsnet : ...`), never a format.
    fn log(&self, level: NcclLevel, subsys: NcclSubsys, file: &CStr, line: u32, text: &CStr);
}

/// NCCL's logger as the plugin keeps it: `None` outside NCCL (lines go to stderr).
pub type Logger = Option<Arc<dyn NcclSink>>;

/// The target that marks setup events (`NCCL_INIT | NCCL_NET`):
/// `info!(target: INIT_TARGET, ...)`. Targets below it (`verbsnet::init::ib`) count too.
pub const INIT_TARGET: &str = "verbsnet::init";

/// What every line sent to NCCL starts with (NCCL's own transports print `NET/IB : `).
pub const NCCL_PREFIX: &str = "NET/verbsnet : ";

/// The text of each live [`Label`], by its id (written when a comm is made, renamed or dropped;
/// read only when a line is formatted).
static LABELS: OnceLock<RwLock<HashMap<u64, Arc<str>>>> = OnceLock::new();

/// The id of the next [`Label`] (0 means none).
static NEXT_LABEL: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The [`Label`] entered on this thread (0: none).
    static CURRENT_LABEL: Cell<u64> = const { Cell::new(0) };
}

fn labels() -> &'static RwLock<HashMap<u64, Arc<str>>> {
    LABELS.get_or_init(Default::default)
}

/// What a line is about (a comm's `send comm <local> -> <peer> (<dev>)`), written first on
/// every line logged on a thread while the label is [`Label::enter`]ed, as a span's `label`
/// field is (module docs), before the labels of the spans the event is inside.
///
/// The comms' data-path calls (`isend`, `irecv`, `test`) use this instead of entering a
/// `tracing` span: entering and leaving a span cost about 175 instructions and two atomic
/// reference-count updates of the registry per call (callgrind on soft-RoCE,
/// docs/performance.md, "Instructions per call"), where NCCL IB's whole `test` is about
/// 130; entering a label is a store to a thread-local. The text is looked up only when a
/// line is formatted, and only by this module's layer: a host's own `tracing` subscriber
/// (the plugin linked as an rlib into a program that installed one) does not see it.
#[derive(Debug)]
pub struct Label {
    id: u64,
}

impl Label {
    /// A label with `text`; it leads the lines logged while it is entered.
    pub fn new(text: &str) -> Label {
        let label = Label {
            id: NEXT_LABEL.fetch_add(1, Ordering::Relaxed),
        };
        label.set(text);
        label
    }

    /// Replaces the text (from the next line on).
    pub fn set(&self, text: &str) {
        labels()
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(self.id, Arc::from(text));
    }

    /// Makes this the thread's label until the guard drops (the label entered before comes
    /// back then, so calls nest).
    #[inline]
    pub fn enter(&self) -> LabelGuard {
        let prev = CURRENT_LABEL.with(|c| c.replace(self.id));
        LabelGuard {
            prev,
            _thread: PhantomData,
        }
    }
}

impl Drop for Label {
    fn drop(&mut self) {
        labels()
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

/// While alive, its [`Label`] leads this thread's lines ([`Label::enter`]). Not `Send`: it
/// restores the thread's previous label on the thread that entered.
#[must_use = "the label is left when the guard drops"]
#[derive(Debug)]
pub struct LabelGuard {
    prev: u64,
    _thread: PhantomData<*const ()>,
}

impl Drop for LabelGuard {
    #[inline]
    fn drop(&mut self) {
        CURRENT_LABEL.with(|c| c.set(self.prev));
    }
}

/// The text of the label entered on this thread, if any.
fn current_label() -> Option<Arc<str>> {
    let id = CURRENT_LABEL.with(Cell::get);
    if id == 0 {
        return None;
    }
    labels()
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&id)
        .cloned()
}

/// Installs the plugin's logging, once per process.
///
/// The first call installs the global subscriber with `level`; NCCL may call `init` again
/// (each communicator, or after a reload of the net plugin table): a later call only
/// replaces the logger (`None` sends events to stderr again), and its `level` is ignored
/// because the configuration is parsed once. If the process already has a global `tracing`
/// subscriber (the plugin linked as an rlib into a Rust program), that one keeps the events.
pub fn init(logger: Logger, level: DebugLevel) {
    let mut first = false;
    let state = STATE.get_or_init(|| {
        first = true;
        State {
            logger: RwLock::new(logger.clone()),
            level,
        }
    });
    if !first {
        *state.logger.write().unwrap_or_else(PoisonError::into_inner) = logger;
        return;
    }
    let layer = NcclLayer {
        max: level_filter(level),
        sink: Sink::Global,
    };
    // Fails only if the host already installed one; then its subscriber gets our events.
    let _ = tracing::subscriber::set_global_default(Registry::default().with(layer));
}

/// The level the first [`init`] installed, or `None` before it.
pub fn level() -> Option<DebugLevel> {
    STATE.get().map(|s| s.level)
}

/// Process-wide logging state, set by the first [`init`].
struct State {
    /// NCCL's logger; replaced by later `init` calls.
    logger: RwLock<Logger>,
    /// The level of the first `init`.
    level: DebugLevel,
}

static STATE: OnceLock<State> = OnceLock::new();

/// `file!()` paths as C strings, leaked once per source file (a bounded set).
static FILES: OnceLock<Mutex<HashMap<&'static str, &'static CStr>>> = OnceLock::new();

/// The `tracing` level filter for a `VERBSNET_DEBUG` level (`warn` includes `ERROR`).
fn level_filter(level: DebugLevel) -> LevelFilter {
    match level {
        DebugLevel::None => LevelFilter::OFF,
        DebugLevel::Warn => LevelFilter::WARN,
        DebugLevel::Info => LevelFilter::INFO,
        DebugLevel::Debug => LevelFilter::DEBUG,
        DebugLevel::Trace => LevelFilter::TRACE,
    }
}

/// Whether `target` marks a setup event ([`INIT_TARGET`] or below it).
fn is_init_target(target: &str) -> bool {
    target
        .strip_prefix(INIT_TARGET)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
}

/// NCCL's level and subsystems for an event.
fn nccl_level_flags(level: Level, target: &str) -> (NcclLevel, NcclSubsys) {
    let subsys = if is_init_target(target) {
        NcclSubsys::InitNet
    } else {
        NcclSubsys::Net
    };
    match level {
        Level::ERROR | Level::WARN => (NcclLevel::Warn, NcclSubsys::All),
        Level::INFO => (NcclLevel::Info, subsys),
        _ => (NcclLevel::Trace, subsys),
    }
}

/// The text sent to NCCL: `NET/verbsnet : <message> <fields>`.
fn nccl_text(body: &str) -> String {
    format!("{NCCL_PREFIX}{body}")
}

/// The stderr line used without a logger: `verbsnet <LEVEL> <message> <fields>`.
fn stderr_text(level: Level, body: &str) -> String {
    format!("verbsnet {level} {body}")
}

/// A C string of `text`; interior NULs (which C would read as the end) become `\0`.
fn c_string(text: String) -> CString {
    CString::new(text).unwrap_or_else(|e| {
        let text = String::from_utf8_lossy(&e.into_vec()).replace('\0', "\\0");
        // No NUL is left after the replace.
        CString::new(text).unwrap_or_default()
    })
}

/// The C string of a `file!()` path, cached.
fn c_file(file: Option<&'static str>) -> &'static CStr {
    let Some(file) = file else {
        return c"";
    };
    let files = FILES.get_or_init(Default::default);
    let mut files = files.lock().unwrap_or_else(PoisonError::into_inner);
    files
        .entry(file)
        .or_insert_with(|| Box::leak(c_string(file.to_string()).into_boxed_c_str()))
}

/// The layer: filters by level and hands each event's text to its sink.
struct NcclLayer {
    /// The most verbose level forwarded.
    max: LevelFilter,
    /// Where lines go.
    sink: Sink,
}

/// Where [`NcclLayer`] sends lines.
enum Sink {
    /// The process-wide NCCL logger in [`STATE`], or stderr while there is none.
    Global,
    /// Tests: keep each line.
    #[cfg(test)]
    Capture(std::sync::Arc<Mutex<Vec<tests::Line>>>),
    /// [`text_layer`]: hand each line to a callback.
    Callback(Box<LineFn>),
}

/// What [`text_layer`] calls with each line.
type LineFn = dyn Fn(Level, &str) + Send + Sync;

/// A layer that formats each event exactly as the bridge does (the text after
/// [`NCCL_PREFIX`]: span labels, message, fields) and hands it with its level to `f`, for
/// events at most as verbose as `level`. For tests and tools that check what NCCL users see:
/// `tracing_subscriber::registry().with(text_layer(DebugLevel::Warn, ...))`.
pub fn text_layer<S>(
    level: DebugLevel,
    f: impl Fn(Level, &str) + Send + Sync + 'static,
) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    NcclLayer {
        max: level_filter(level),
        sink: Sink::Callback(Box::new(f)),
    }
}

impl Sink {
    fn emit(&self, meta: &'static Metadata<'static>, body: &str) {
        let level = *meta.level();
        match self {
            Sink::Global => {
                let nccl = STATE.get().and_then(|s| {
                    s.logger
                        .read()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clone()
                });
                if let Some(nccl) = nccl {
                    let (nccl_level, flags) = nccl_level_flags(level, meta.target());
                    let text = c_string(nccl_text(body));
                    let line = meta.line().unwrap_or(0);
                    nccl.log(nccl_level, flags, c_file(meta.file()), line, &text);
                } else {
                    // Nowhere to report a failed stderr write.
                    let _ = writeln!(std::io::stderr().lock(), "{}", stderr_text(level, body));
                }
            }
            Sink::Callback(f) => f(level, body),
            #[cfg(test)]
            Sink::Capture(lines) => {
                let (nccl_level, flags) = nccl_level_flags(level, meta.target());
                lines.lock().unwrap().push(tests::Line {
                    nccl_level,
                    flags,
                    file: c_file(meta.file()),
                    line: meta.line().unwrap_or(0),
                    nccl: c_string(nccl_text(body)),
                    stderr: stderr_text(level, body),
                });
            }
        }
    }
}

/// A span's formatted fields and its `label` (if any), kept in its extensions.
struct SpanFields {
    rest: String,
    label: Option<String>,
}

/// The span field written before the message (see the module docs).
const LABEL_FIELD: &str = "label";

impl<S> Layer<S> for NcclLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if *meta.level() <= self.max {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _ctx: Context<'_, S>) -> bool {
        *meta.level() <= self.max
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.max)
    }

    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let mut fields = Fields {
            take_label: true,
            ..Fields::default()
        };
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields {
                rest: fields.rest,
                label: fields.label,
            });
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut extensions = span.extensions_mut();
        if let Some(sf) = extensions.get_mut::<SpanFields>() {
            let mut fields = Fields {
                message: String::new(),
                rest: std::mem::take(&mut sf.rest),
                label: sf.label.take(),
                take_label: true,
            };
            values.record(&mut fields);
            sf.rest = fields.rest;
            sf.label = fields.label;
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        self.sink.emit(event.metadata(), &event_text(event, &ctx));
    }
}

/// The text of `event` as the bridge sends it (without [`NCCL_PREFIX`]): the `label`s of the
/// spans it is inside (outermost first, each followed by `: `), its message, its fields, then
/// the other fields of those spans.
fn event_text<S>(event: &Event<'_>, ctx: &Context<'_, S>) -> String
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut labels = String::new();
        if let Some(l) = current_label() {
            labels.push_str(&l);
            labels.push_str(": ");
        }
        let mut span_text = String::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(sf) = span.extensions().get::<SpanFields>() {
                    if let Some(l) = &sf.label {
                        labels.push_str(l);
                        labels.push_str(": ");
                    }
                    push_field_text(&mut span_text, &sf.rest);
                }
            }
        }
        let mut body = labels;
        body.push_str(&fields.message);
        push_field_text(&mut body, &fields.rest);
        push_field_text(&mut body, &span_text);
        body
    }
}

/// Appends `text` to `body`, separated by a space.
fn push_field_text(body: &mut String, text: &str) {
    if text.is_empty() {
        return;
    }
    if !body.is_empty() {
        body.push(' ');
    }
    body.push_str(text);
}

/// Collects an event's `message` and its other fields as `name=value name=value`; for a
/// span (`take_label`), its `label` field apart.
#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
    label: Option<String>,
    take_label: bool,
}

impl Fields {
    fn push(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        if field.name() == "message" {
            let _ = self.message.write_fmt(value);
            return;
        }
        if self.take_label && field.name() == LABEL_FIELD {
            self.label = Some(value.to_string());
            return;
        }
        if !self.rest.is_empty() {
            self.rest.push(' ');
        }
        let _ = write!(self.rest, "{}={}", field.name(), value);
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        // Quote only what would not read back as one token.
        let plain = field.name() == "message" || (self.take_label && field.name() == LABEL_FIELD);
        if !plain && (value.is_empty() || value.contains(char::is_whitespace)) {
            self.push(field, format_args!("{value:?}"));
        } else {
            self.push(field, format_args!("{value}"));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let mut text = value.to_string();
        let mut source = value.source();
        while let Some(s) = source {
            let _ = write!(text, ": {s}");
            source = s.source();
        }
        self.push(field, format_args!("{text}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.push(field, format_args!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tracing::{debug, error, info, info_span, trace, warn};

    /// One captured line: what the NCCL logger would get, and the stderr form.
    #[derive(Debug)]
    pub(super) struct Line {
        pub nccl_level: NcclLevel,
        pub flags: NcclSubsys,
        pub file: &'static CStr,
        pub line: u32,
        pub nccl: CString,
        pub stderr: String,
    }

    use NcclLevel::{Info, Trace, Warn};
    use NcclSubsys::{All, InitNet, Net};

    /// Runs `f` with a capturing layer at `level`, returning the lines.
    fn capture(level: DebugLevel, f: impl FnOnce()) -> Vec<Line> {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let layer = NcclLayer {
            max: level_filter(level),
            sink: Sink::Capture(lines.clone()),
        };
        tracing::subscriber::with_default(Registry::default().with(layer), f);
        let lines = std::mem::take(&mut *lines.lock().unwrap());
        lines
    }

    fn text(l: &Line) -> &str {
        l.nccl.to_str().unwrap()
    }

    #[test]
    fn levels_and_flags_map_to_nccl() {
        let cases = [
            (Level::ERROR, "nccl_net_verbsnet::conn", Warn, All),
            (Level::WARN, INIT_TARGET, Warn, All),
            (Level::INFO, INIT_TARGET, Info, InitNet),
            (Level::INFO, "verbsnet::init::ib", Info, InitNet),
            (Level::INFO, "nccl_net_verbsnet::conn", Info, Net),
            (Level::INFO, "verbsnet::initial", Info, Net),
            (Level::DEBUG, INIT_TARGET, Trace, InitNet),
            (Level::DEBUG, "nccl_net_verbsnet::engine", Trace, Net),
            (Level::TRACE, "nccl_net_verbsnet::engine", Trace, Net),
        ];
        for (level, target, nccl_level, flags) in cases {
            assert_eq!(
                nccl_level_flags(level, target),
                (nccl_level, flags),
                "{level} {target}"
            );
        }
    }

    #[test]
    fn event_is_formatted_with_prefix_and_fields() {
        let lines = capture(DebugLevel::Trace, || {
            let dev = "mlx5_0";
            info!(target: INIT_TARGET, dev, port = 1, "using device");
            warn!(qp_num = 0x1a2u32, status = ?Some(5), "completion error");
            debug!(peer = "host a", empty = "", "odd strings");
        });
        assert_eq!(lines.len(), 3);
        assert_eq!(
            text(&lines[0]),
            "NET/verbsnet : using device dev=mlx5_0 port=1"
        );
        assert_eq!((lines[0].nccl_level, lines[0].flags), (Info, InitNet));
        assert_eq!(
            lines[0].stderr,
            "verbsnet INFO using device dev=mlx5_0 port=1"
        );
        assert_eq!(lines[0].file.to_str().unwrap(), file!());
        assert!(lines[0].line > 0);
        assert_eq!(
            text(&lines[1]),
            "NET/verbsnet : completion error qp_num=418 status=Some(5)"
        );
        assert_eq!((lines[1].nccl_level, lines[1].flags), (Warn, All));
        assert_eq!(
            lines[1].stderr,
            "verbsnet WARN completion error qp_num=418 status=Some(5)"
        );
        assert_eq!(
            text(&lines[2]),
            r#"NET/verbsnet : odd strings peer="host a" empty="""#
        );
        assert_eq!((lines[2].nccl_level, lines[2].flags), (Trace, Net));
    }

    #[test]
    fn span_fields_follow_event_fields() {
        let lines = capture(DebugLevel::Info, || {
            let outer = info_span!("comm", comm = 7);
            let _o = outer.enter();
            let inner = info_span!("conn", qp_num = tracing::field::Empty);
            inner.record("qp_num", 99);
            let _i = inner.enter();
            info!(bytes = 4096, "posted");
        });
        assert_eq!(
            text(&lines[0]),
            "NET/verbsnet : posted bytes=4096 comm=7 qp_num=99"
        );
    }

    #[test]
    fn a_span_label_leads_the_line_at_every_level_that_is_on() {
        let lines = capture(DebugLevel::Warn, || {
            let comm =
                tracing::error_span!("comm", label = "send comm 1.2.3.4:5 -> 6.7.8.9:10 (lo)");
            let _c = comm.enter();
            let inner = info_span!("conn", qp_num = 3);
            let _i = inner.enter();
            warn!(slot = 2, "send 4 has made no progress");
            info!("dropped at WARN");
        });
        assert_eq!(lines.len(), 1);
        assert_eq!(
            text(&lines[0]),
            "NET/verbsnet : send comm 1.2.3.4:5 -> 6.7.8.9:10 (lo): send 4 has made no progress \
             slot=2"
        );
        let lines = capture(DebugLevel::Info, || {
            let outer = info_span!("a", label = "outer");
            let _o = outer.enter();
            let inner = info_span!("b", label = "inner", n = 1);
            let _i = inner.enter();
            info!("x");
        });
        assert_eq!(text(&lines[0]), "NET/verbsnet : outer: inner: x n=1");
    }

    #[test]
    fn an_entered_label_leads_the_line_before_span_labels_and_nests() {
        let comm = Label::new("recv comm 1.2.3.4:5 <- 6.7.8.9:10 (lo)");
        let lines = capture(DebugLevel::Warn, || {
            warn!("before");
            {
                let _c = comm.enter();
                let inner = tracing::error_span!("conn", label = "qp 3", n = 1);
                let _i = inner.enter();
                warn!(slot = 2, "stalled");
                let other = Label::new("send comm x -> y (lo)");
                {
                    let _o = other.enter();
                    warn!("inner call");
                }
                warn!("back");
                comm.set("recv comm renamed");
                warn!("renamed");
            }
            warn!("after");
        });
        let got: Vec<&str> = lines.iter().map(text).collect();
        assert_eq!(
            got,
            [
                "NET/verbsnet : before",
                "NET/verbsnet : recv comm 1.2.3.4:5 <- 6.7.8.9:10 (lo): qp 3: stalled slot=2 n=1",
                "NET/verbsnet : send comm x -> y (lo): qp 3: inner call n=1",
                "NET/verbsnet : recv comm 1.2.3.4:5 <- 6.7.8.9:10 (lo): qp 3: back n=1",
                "NET/verbsnet : recv comm renamed: qp 3: renamed n=1",
                "NET/verbsnet : after",
            ]
        );
        let id = comm.id;
        drop(comm);
        assert!(!labels().read().unwrap().contains_key(&id));
    }

    #[test]
    fn level_filter_drops_verbose_events() {
        let emit_all = || {
            error!("e");
            warn!("w");
            info!("i");
            debug!("d");
            trace!("t");
        };
        let names =
            |lines: Vec<Line>| -> Vec<String> { lines.iter().map(|l| l.stderr.clone()).collect() };
        assert!(capture(DebugLevel::None, emit_all).is_empty());
        assert_eq!(
            names(capture(DebugLevel::Warn, emit_all)),
            ["verbsnet ERROR e", "verbsnet WARN w"]
        );
        assert_eq!(capture(DebugLevel::Info, emit_all).len(), 3);
        assert_eq!(capture(DebugLevel::Debug, emit_all).len(), 4);
        assert_eq!(
            names(capture(DebugLevel::Trace, emit_all)),
            [
                "verbsnet ERROR e",
                "verbsnet WARN w",
                "verbsnet INFO i",
                "verbsnet DEBUG d",
                "verbsnet TRACE t"
            ]
        );
    }

    #[test]
    fn interior_nul_is_replaced_not_a_panic() {
        let lines = capture(DebugLevel::Warn, || {
            let peer = "bad\0name";
            warn!(peer, "peer {} closed", "x\0y");
        });
        assert_eq!(
            text(&lines[0]),
            r"NET/verbsnet : peer x\0y closed peer=bad\0name"
        );
        assert_eq!(c_string("a\0b\0".into()).as_bytes(), br"a\0b\0");
    }

    #[test]
    fn percent_signs_stay_text() {
        // The format is always "%s"; the message may contain printf directives verbatim.
        let lines = capture(DebugLevel::Warn, || warn!("100%s done %n"));
        assert_eq!(text(&lines[0]), "NET/verbsnet : 100%s done %n");
    }

    #[test]
    fn errors_show_their_source_chain() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("ibv_post_send failed")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(std::io::Error::from_raw_os_error(libc::ENOMEM));
        let lines = capture(DebugLevel::Warn, || {
            error!(error = &e as &(dyn std::error::Error + 'static), "isend")
        });
        let t = text(&lines[0]);
        assert!(
            t.starts_with("NET/verbsnet : isend error=ibv_post_send failed: "),
            "{t}"
        );
        assert!(t.contains("(os error 12)"), "{t}");
    }

    #[test]
    fn init_is_idempotent_and_keeps_first_level() {
        init(None, DebugLevel::Warn);
        init(None, DebugLevel::Trace);
        assert_eq!(level(), Some(DebugLevel::Warn));
        let logger = STATE.get().unwrap().logger.read().unwrap();
        assert!(logger.is_none());
    }

    #[test]
    fn file_names_are_cached() {
        let a = c_file(Some("plugin/log.rs"));
        let b = c_file(Some("plugin/log.rs"));
        assert!(std::ptr::eq(a, b));
        assert_eq!(a.to_str().unwrap(), "plugin/log.rs");
        assert_eq!(c_file(None).to_bytes(), b"");
    }
}
