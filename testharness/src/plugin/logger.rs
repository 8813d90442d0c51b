//! The logger `init` gets, as NCCL passes one: lines the plugin logs are filtered by
//! `NCCL_DEBUG`/`NCCL_DEBUG_SUBSYS`, prefixed and printed the way NCCL prints them, and kept
//! (counts, WARN texts) for the harness's own reports.
//!
//! NCCL always passes its `ncclDebugLog` to `init` (`src/plugin/net.cc`: `ncclNetPluginInit`),
//! and plugins call it without checking for NULL. Its type, `ncclDebugLogger_t`, is a
//! C-variadic function, which stable Rust cannot define: `csrc/nccl_logger.c` is that function
//! (built by `testharness/build.rs` with the `cc` crate). It formats the message with
//! `vsnprintf` and calls `sink` with the finished text; everything else happens here.
//!
//! What NCCL does with a line (`src/debug.cc`: `ncclDebugLogV`), and so does this logger:
//! - `NCCL_DEBUG` = `VERSION` | `WARN` | `INFO` | `ABORT` | `TRACE` (case-insensitive): a line
//!   prints when its level is at most that and its flags meet `NCCL_DEBUG_SUBSYS` (names
//!   separated by commas, case-insensitive, a leading `^` inverts; default `INIT,BOOTSTRAP,ENV`;
//!   an unknown name leaves the default, as NCCL's parser rejects the value).
//! - Prefix: `host:pid:tid ` (host cut at the first `.`, `%` and `/` made `-`), then
//!   `[dev] file:line NCCL WARN msg` (WARN, after an empty line and a `[%F %T] ` timestamp),
//!   `[dev] NCCL INFO msg`, `NCCL CALL msg` (TRACE with flags `NCCL_CALL`), or
//!   `[dev] ms func:line NCCL TRACE msg`; VERSION lines have no prefix. `dev` is the CUDA
//!   device, always 0 here (no GPU).
//! - `NCCL_DEBUG_FILE` (`%h` host, `%p` pid, `%%`): lines go to that file instead.
//!
//! Where verbsnet-perf differs, on purpose:
//! - NCCL prints to stdout; the harness prints to stderr (stdout carries the table or JSON).
//! - With `NCCL_DEBUG` unset NCCL prints nothing. The harness prints WARN lines (they name the
//!   cause of a failed run), and also INFO/TRACE lines when `VERBSNET_DEBUG` is set: verbsnet
//!   then filters its own lines by that knob, as it did when it logged to stderr itself.
//! - `NCCL_DEBUG_TIMESTAMP_LEVELS`/`_FORMAT` are not read: WARN lines get NCCL's default
//!   timestamp, others none.

use std::ffi::{c_char, c_int, c_ulong, c_void, CStr};
use std::fs;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Instant;

use nccl_net_verbsnet::ffi::abi::{
    ncclDebugLogLevel, ncclDebugLogger_t, ncclProfilerCallback_t, ncclResult_t,
};

extern "C" {
    /// `csrc/nccl_logger.c`: the logger handed to `init`.
    fn vnperf_nccl_log(
        level: ncclDebugLogLevel::Type,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    );
    /// `csrc/nccl_logger.c`: where `vnperf_nccl_log` delivers the formatted text.
    fn vnperf_log_set_sink(sink: Option<SinkFn>);
}

/// The sink's C signature: level, flags, file (or function), line, text, text length.
type SinkFn = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, usize);

/// NCCL's log levels (`ncclDebugLogLevel`), ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// `NCCL_LOG_NONE` (0).
    None,
    /// `NCCL_LOG_VERSION` (1).
    Version,
    /// `NCCL_LOG_WARN` (2).
    Warn,
    /// `NCCL_LOG_INFO` (3).
    Info,
    /// `NCCL_LOG_ABORT` (4).
    Abort,
    /// `NCCL_LOG_TRACE` (5).
    Trace,
}

impl Level {
    /// From the ABI value; values above TRACE count as TRACE.
    pub fn from_abi(v: i64) -> Level {
        match v {
            i64::MIN..=0 => Level::None,
            1 => Level::Version,
            2 => Level::Warn,
            3 => Level::Info,
            4 => Level::Abort,
            _ => Level::Trace,
        }
    }

    /// An `NCCL_DEBUG` value (case-insensitive), `None` if NCCL does not know it.
    pub fn parse(s: &str) -> Option<Level> {
        [
            ("NONE", Level::None),
            ("VERSION", Level::Version),
            ("WARN", Level::Warn),
            ("INFO", Level::Info),
            ("ABORT", Level::Abort),
            ("TRACE", Level::Trace),
        ]
        .into_iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(s.trim()))
        .map(|(_, l)| l)
    }
}

/// `NCCL_DEBUG_SUBSYS` names and bits (`ncclDebugLogSubSys`, `src/debug.cc`).
pub const SUBSYSTEMS: &[(&str, u64)] = &[
    ("INIT", 0x1),
    ("COLL", 0x2),
    ("P2P", 0x4),
    ("SHM", 0x8),
    ("NET", 0x10),
    ("GRAPH", 0x20),
    ("TUNING", 0x40),
    ("ENV", 0x80),
    ("ALLOC", 0x100),
    ("CALL", 0x200),
    ("PROXY", 0x400),
    ("NVLS", 0x800),
    ("BOOTSTRAP", 0x1000),
    ("REG", 0x2000),
    ("PROFILE", 0x4000),
    ("RAS", 0x8000),
    ("DESTROY", 0x10000),
    ("ALLOC_HOST", 0x20000),
    ("ALL", u64::MAX),
];

/// NCCL's default `NCCL_DEBUG_SUBSYS`: `INIT,BOOTSTRAP,ENV`.
pub const DEFAULT_SUBSYS: u64 = 0x1 | 0x1000 | 0x80;

/// `NCCL_CALL`: a TRACE line with exactly these flags is an API-call line.
const NCCL_CALL: u64 = 0x200;

/// Parses `NCCL_DEBUG_SUBSYS` as NCCL does; `None` for a value NCCL rejects (an unknown name).
pub fn parse_subsys(s: &str) -> Option<u64> {
    let (invert, list) = match s.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let mut mask = if invert { u64::MAX } else { 0 };
    for token in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (_, bits) = SUBSYSTEMS
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(token))?;
        if invert {
            mask &= !bits;
        } else {
            mask |= bits;
        }
    }
    Some(mask)
}

/// Which lines print.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter {
    /// `NCCL_DEBUG`, `None` when unset (or unknown).
    pub level: Option<Level>,
    /// `NCCL_DEBUG_SUBSYS`.
    pub mask: u64,
    /// With `NCCL_DEBUG` unset: whether INFO/TRACE lines print too (`VERBSNET_DEBUG` set).
    pub plugin_verbose: bool,
}

impl Filter {
    /// From the environment (`get`); the second value lists notes about values NCCL would
    /// reject (they fall back to the default, as in NCCL).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> (Filter, Vec<String>) {
        let mut notes = Vec::new();
        let level = get("NCCL_DEBUG").and_then(|v| {
            let l = Level::parse(&v);
            if l.is_none() {
                notes.push(format!(
                    "NCCL_DEBUG={v:?} is not one of VERSION, WARN, INFO, ABORT, TRACE: ignored"
                ));
            }
            l
        });
        let mask = match get("NCCL_DEBUG_SUBSYS") {
            None => DEFAULT_SUBSYS,
            Some(v) => parse_subsys(&v).unwrap_or_else(|| {
                notes.push(format!(
                    "NCCL_DEBUG_SUBSYS={v:?} names an unknown subsystem: using the default \
                     INIT,BOOTSTRAP,ENV"
                ));
                DEFAULT_SUBSYS
            }),
        };
        let plugin_verbose = get("VERBSNET_DEBUG").is_some_and(|v| !v.is_empty());
        (
            Filter {
                level,
                mask,
                plugin_verbose,
            },
            notes,
        )
    }

    /// Whether a line of `level` with `flags` prints.
    pub fn shows(&self, level: Level, flags: u64) -> bool {
        match self.level {
            Some(max) => level <= max && flags & self.mask != 0,
            None => level <= Level::Warn || self.plugin_verbose,
        }
    }
}

/// One line as the plugin logged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// Its level.
    pub level: Level,
    /// Its subsystem bits.
    pub flags: u64,
    /// NCCL's `filefunc`: the file for WARN, the function for TRACE.
    pub file: Option<String>,
    /// Source line.
    pub line: i32,
    /// The formatted message.
    pub msg: String,
}

/// What precedes a line: who logs it and when.
#[derive(Clone, Debug)]
pub struct Prefix {
    /// Host name as NCCL prints it ([`log_hostname`]).
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Thread id (`gettid`).
    pub tid: i64,
    /// WARN's timestamp, e.g. `[2025-01-02 03:04:05] `.
    pub stamp: String,
    /// Milliseconds since the logger started (TRACE lines).
    pub ms: f64,
}

/// The line NCCL's `ncclDebugLogV` prints for `l` (`src/debug.cc`), newline included.
pub fn format_line(l: &Line, p: &Prefix) -> String {
    let file = l.file.as_deref().unwrap_or("<unknown>");
    let who = format!("{}:{}:{} ", p.host, p.pid, p.tid);
    match l.level {
        Level::Version => format!("{}\n", l.msg),
        Level::Warn => format!(
            "\n{}{who}[0] {file}:{} NCCL WARN {}\n",
            p.stamp, l.line, l.msg
        ),
        Level::Info => format!("{who}[0] NCCL INFO {}\n", l.msg),
        Level::Trace if l.flags == NCCL_CALL => format!("{who}NCCL CALL {}\n", l.msg),
        Level::Trace => format!(
            "{who}[0] {:.6} {file}:{} NCCL TRACE {}\n",
            p.ms, l.line, l.msg
        ),
        Level::None | Level::Abort => format!("{who}{}\n", l.msg),
    }
}

/// The host name as NCCL prints it: up to the first `.`, with `%` and `/` made `-`.
pub fn log_hostname(raw: &str) -> String {
    raw.trim()
        .split('.')
        .next()
        .unwrap_or_default()
        .replace(['%', '/'], "-")
}

/// `NCCL_DEBUG_FILE` with `%h` (host), `%p` (pid) and `%%` expanded; other `%x` stay as they are.
pub fn expand_debug_file(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// How many lines of each level the plugin logged (printed or not), and its WARN texts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// WARN lines.
    pub warn: u64,
    /// INFO lines.
    pub info: u64,
    /// TRACE lines.
    pub trace: u64,
    /// Lines of other levels (VERSION, ABORT, NONE).
    pub other: u64,
    /// The first [`KEPT_WARNINGS`] WARN messages, in order.
    pub warnings: Vec<String>,
}

/// How many WARN messages are kept.
pub const KEPT_WARNINGS: usize = 64;

/// The process-wide logger state, made on first use.
struct State {
    filter: Filter,
    host: String,
    pid: u32,
    epoch: Instant,
    out: Mutex<Box<dyn Write + Send>>,
    counts: [AtomicU64; 4],
    warnings: Mutex<Vec<String>>,
}

static STATE: OnceLock<State> = OnceLock::new();

fn state() -> &'static State {
    STATE.get_or_init(|| {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let (filter, notes) = Filter::from_env(get);
        let host = log_hostname(
            &fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "?".into()),
        );
        let pid = std::process::id();
        let file = get("NCCL_DEBUG_FILE")
            .filter(|_| filter.level.is_some_and(|l| l > Level::Version))
            .and_then(|p| fs::File::create(expand_debug_file(&p, &host, pid)).ok());
        let out: Box<dyn Write + Send> = match file {
            Some(f) => Box::new(f),
            None => Box::new(std::io::stderr()),
        };
        for n in notes {
            eprintln!("verbsnet-perf: {n}");
        }
        State {
            filter,
            host,
            pid,
            epoch: Instant::now(),
            out: Mutex::new(out),
            counts: Default::default(),
            warnings: Mutex::new(Vec::new()),
        }
    })
}

impl State {
    fn take(&self, l: Line) {
        let i = match l.level {
            Level::Warn => 0,
            Level::Info => 1,
            Level::Trace => 2,
            _ => 3,
        };
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        if l.level == Level::Warn {
            let mut w = self.warnings.lock().unwrap_or_else(PoisonError::into_inner);
            if w.len() < KEPT_WARNINGS {
                w.push(l.msg.clone());
            }
        }
        if !self.filter.shows(l.level, l.flags) {
            return;
        }
        let p = Prefix {
            host: self.host.clone(),
            pid: self.pid,
            tid: thread_id(),
            stamp: if l.level == Level::Warn {
                wall_clock()
            } else {
                String::new()
            },
            ms: self.epoch.elapsed().as_secs_f64() * 1e3,
        };
        let text = format_line(&l, &p);
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    }
}

/// The calling thread's id, as NCCL prints it.
fn thread_id() -> i64 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) }
}

/// NCCL's default WARN timestamp, `[%F %T] ` in local time.
fn wall_clock() -> String {
    // SAFETY: `time` with a NULL argument only returns the time.
    let now = unsafe { libc::time(std::ptr::null_mut()) };
    // SAFETY: an all-zero `tm` is a valid value (integers and a NULL zone pointer).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call; localtime_r is thread-safe.
    if unsafe { libc::localtime_r(&now, &mut tm) }.is_null() {
        return String::new();
    }
    let mut buf = [0u8; 64];
    // SAFETY: `buf` has `buf.len()` writable bytes; the format is NUL-terminated; `tm` is valid.
    let n = unsafe {
        libc::strftime(
            buf.as_mut_ptr().cast(),
            buf.len(),
            c"[%F %T] ".as_ptr(),
            &tm,
        )
    };
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Where `csrc/nccl_logger.c` delivers each formatted line.
///
/// # Safety
/// Called by the C logger only: `file` is NULL or NUL-terminated, `msg` points to `len` bytes.
unsafe extern "C" fn sink(
    level: c_int,
    flags: c_ulong,
    file: *const c_char,
    line: c_int,
    msg: *const c_char,
    len: usize,
) {
    let take = || {
        let text = if msg.is_null() {
            String::new()
        } else {
            // SAFETY: the C logger passes `len` formatted bytes at `msg`, alive for this call.
            let bytes = unsafe { std::slice::from_raw_parts(msg.cast::<u8>(), len) };
            String::from_utf8_lossy(bytes).into_owned()
        };
        let file = (!file.is_null()).then(|| {
            // SAFETY: a non-NULL `file` is the plugin's NUL-terminated string.
            unsafe { CStr::from_ptr(file) }
                .to_string_lossy()
                .into_owned()
        });
        state().take(Line {
            level: Level::from_abi(i64::from(level)),
            // c_ulong is u64 on the LP64 targets the harness builds for.
            #[allow(clippy::useless_conversion)]
            flags: u64::from(flags),
            file,
            line,
            msg: text,
        });
    };
    // A panic must not unwind into the plugin's C frames.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(take));
}

/// The logger to pass to `init`: `csrc/nccl_logger.c`'s function, its sink registered.
pub fn nccl_logger() -> ncclDebugLogger_t {
    let _ = state();
    // SAFETY: registers a function that lives for the whole program.
    unsafe { vnperf_log_set_sink(Some(sink)) };
    Some(vnperf_nccl_log)
}

/// NCCL's profiler callback when no profiler plugin is loaded: does nothing, succeeds
/// (`src/plugin/profiler.cc`: `ncclProfilerCallback`).
unsafe extern "C" fn no_profiler(
    _handle: *mut *mut c_void,
    _ty: c_int,
    _phandle: *mut c_void,
    _plugin_id: i64,
    _data: *mut c_void,
) -> ncclResult_t {
    ncclResult_t::ncclSuccess
}

/// The profiler callback to pass to `init` (v10+): NCCL always passes one.
pub fn profiler_callback() -> ncclProfilerCallback_t {
    Some(no_profiler)
}

/// What the plugin has logged so far in this process.
pub fn seen() -> Seen {
    let Some(s) = STATE.get() else {
        return Seen::default();
    };
    let c = |i: usize| s.counts[i].load(Ordering::Relaxed);
    Seen {
        warn: c(0),
        info: c(1),
        trace: c(2),
        other: c(3),
        warnings: s
            .warnings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone(),
    }
}

/// The last WARN message the plugin logged (of the kept ones), for error reports.
pub fn last_warning() -> Option<String> {
    seen().warnings.pop()
}

/// [`last_warning`] if the filter kept it off the output (e.g. `NCCL_DEBUG=NONE`), so an error
/// report should carry it.
pub fn unshown_last_warning() -> Option<String> {
    let shown = STATE
        .get()
        .is_some_and(|s| s.filter.shows(Level::Warn, u64::MAX));
    if shown {
        None
    } else {
        last_warning()
    }
}

impl Seen {
    /// As JSON: `{"warn", "info", "trace", "other", "warnings": [...]}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "warn": self.warn,
            "info": self.info,
            "trace": self.trace,
            "other": self.other,
            "warnings": self.warnings,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k: &str| m.get(k).cloned()
    }

    #[test]
    fn nccl_debug_filters_by_level_and_subsystem() {
        let (f, notes) = Filter::from_env(env(&[("NCCL_DEBUG", "info")]));
        assert!(notes.is_empty());
        assert_eq!(f.level, Some(Level::Info));
        assert_eq!(f.mask, DEFAULT_SUBSYS);
        // NET alone is not in the default INIT,BOOTSTRAP,ENV; INIT|NET is.
        assert!(!f.shows(Level::Info, 0x10));
        assert!(f.shows(Level::Info, 0x11));
        assert!(f.shows(Level::Warn, u64::MAX));
        assert!(!f.shows(Level::Trace, u64::MAX));
        let (f, _) = Filter::from_env(env(&[("NCCL_DEBUG", "WARN")]));
        assert!(!f.shows(Level::Info, u64::MAX));
        assert!(f.shows(Level::Warn, u64::MAX));
        let (f, _) = Filter::from_env(env(&[
            ("NCCL_DEBUG", "TRACE"),
            ("NCCL_DEBUG_SUBSYS", "^init"),
        ]));
        assert!(f.shows(Level::Trace, 0x10));
        assert!(!f.shows(Level::Info, 0x1));
    }

    #[test]
    fn unset_nccl_debug_shows_warnings_and_what_verbsnet_debug_asks_for() {
        let (f, _) = Filter::from_env(env(&[]));
        assert_eq!(f.level, None);
        assert!(f.shows(Level::Warn, 0x10));
        assert!(!f.shows(Level::Info, u64::MAX));
        let (f, _) = Filter::from_env(env(&[("VERBSNET_DEBUG", "info")]));
        assert!(f.shows(Level::Info, 0x10));
        assert!(f.shows(Level::Trace, 0x10));
    }

    #[test]
    fn bad_values_fall_back_with_a_note() {
        let (f, notes) = Filter::from_env(env(&[
            ("NCCL_DEBUG", "LOUD"),
            ("NCCL_DEBUG_SUBSYS", "INIT,NETT"),
        ]));
        assert_eq!((f.level, f.mask), (None, DEFAULT_SUBSYS));
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert_eq!(parse_subsys("net, Init"), Some(0x11));
        assert_eq!(parse_subsys("ALL"), Some(u64::MAX));
        assert_eq!(parse_subsys("^ALL"), Some(0));
        assert_eq!(parse_subsys(""), Some(0));
    }

    #[test]
    fn lines_are_formatted_as_nccl_prints_them() {
        let p = Prefix {
            host: log_hostname("node-7.cluster.example\n"),
            pid: 41021,
            tid: 41088,
            stamp: "[2025-01-02 03:04:05] ".into(),
            ms: 1.5,
        };
        let l = |level, flags, msg: &str| Line {
            level,
            flags,
            file: Some("p2p.c".into()),
            line: 42,
            msg: msg.into(),
        };
        assert_eq!(
            format_line(&l(Level::Warn, u64::MAX, "NET/x : boom"), &p),
            "\n[2025-01-02 03:04:05] node-7:41021:41088 [0] p2p.c:42 NCCL WARN NET/x : boom\n"
        );
        let info = Line {
            file: None,
            ..l(Level::Info, 0x11, "NET/x : hello")
        };
        let mut no_stamp = p.clone();
        no_stamp.stamp.clear();
        assert_eq!(
            format_line(&info, &no_stamp),
            "node-7:41021:41088 [0] NCCL INFO NET/x : hello\n"
        );
        assert_eq!(
            format_line(&l(Level::Trace, 0x10, "t"), &no_stamp),
            "node-7:41021:41088 [0] 1.500000 p2p.c:42 NCCL TRACE t\n"
        );
        assert_eq!(
            format_line(&l(Level::Trace, NCCL_CALL, "c"), &no_stamp),
            "node-7:41021:41088 NCCL CALL c\n"
        );
        assert_eq!(format_line(&l(Level::Version, 0, "v"), &no_stamp), "v\n");
        assert_eq!(log_hostname("a%b/c.d"), "a-b-c");
        assert_eq!(
            expand_debug_file("/tmp/nccl.%h.%p.%%.%x", "h", 7),
            "/tmp/nccl.h.7.%.%x"
        );
    }

    /// The C logger formats with the plugin's format and arguments, and the Rust side keeps
    /// the WARN text and counts the lines.
    #[test]
    fn the_c_logger_formats_varargs_and_feeds_the_counts() {
        let log = nccl_logger().expect("a logger");
        let before = seen();
        let long = "x".repeat(3000);
        let long_c = std::ffi::CString::new(long.clone()).unwrap();
        // SAFETY: printf-style calls whose arguments match their formats.
        unsafe {
            log(
                ncclDebugLogLevel::NCCL_LOG_WARN,
                u64::MAX as c_ulong,
                c"unit.c".as_ptr(),
                7,
                c"unit test warn %d %s".as_ptr(),
                42 as c_int,
                c"forty-two".as_ptr(),
            );
            log(
                ncclDebugLogLevel::NCCL_LOG_TRACE,
                0x10,
                c"f".as_ptr(),
                1,
                c"%s".as_ptr(),
                long_c.as_ptr(),
            );
        }
        let after = seen();
        assert!(after.warn > before.warn);
        assert!(after.trace > before.trace);
        assert!(
            after
                .warnings
                .iter()
                .any(|w| w == "unit test warn 42 forty-two"),
            "{:?}",
            after.warnings
        );
    }
}
