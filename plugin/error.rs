//! The error shape every layer uses: [`Failure`] over the layer's own enum of what failed
//! (`comm::Op`, `conn::Stage`, `net::Op`, `api::Op`, `limits::Check`), with its [`Class`]
//! (the one thing `ffi` maps to `ncclResult_t`, in `ffi::boundary::code`), typed sources and a fix.

use std::fmt;
use std::sync::Arc;

/// What kind of failure an error is: the class [`crate::ffi`] maps to one `ncclResult_t`
/// (ext-net README `plugins/net/README.md`, error codes), in one place (`ffi::boundary::code`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Bad argument from the caller (→ `ncclInvalidArgument`).
    InvalidArgument,
    /// Misuse such as a send larger than the receive, or a bad setting (→ `ncclInvalidUsage`).
    Usage,
    /// The peer or path failed (→ `ncclRemoteError`).
    Remote,
    /// A local system or transport failure (→ `ncclSystemError`).
    System,
    /// A bug, or NCCL misusing the plugin (→ `ncclInternalError`).
    Internal,
}

/// The cause of a [`Failure`], shared so errors stay `Clone` (a comm's sticky error is
/// returned again by every later call).
pub type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// A plain message as a [`Source`] (a cause that is only text, e.g. a peer's refusal).
pub fn message(text: impl Into<String>) -> Source {
    Source::from(Box::<dyn std::error::Error + Send + Sync>::from(
        text.into(),
    ))
}

/// An error of one layer: the operation `O` that failed (the layer's own enum: `comm::Op`,
/// `conn::Stage`, `api::Op`, `net::Op`, `limits::Check`), its [`Class`], what this layer knows (`msg`), the lower error
/// that caused it (`source`, kept typed, not flattened into the text), and the fix when
/// there is one.
///
/// `Display` is this layer's text: `msg`, or, when `msg` is empty (a wrapper that adds
/// nothing, e.g. an engine error on `isend`), the source's text. [`report`](Failure::report)
/// is the whole line a user sees: the text, each source after `": "`, then the fix.
///
/// Boxed: a `Result<T, Failure<O>>` is then `T` and one pointer wide, so the data path's
/// calls, which succeed, return their results in registers rather than through a 72-byte
/// slot at every layer (the box is allocated only when something fails).
#[derive(Clone)]
pub struct Failure<O>(Box<Parts<O>>);

/// What a [`Failure`] holds.
#[derive(Clone)]
struct Parts<O> {
    op: O,
    class: Class,
    msg: String,
    source: Option<Source>,
    fix: Option<String>,
}

impl<O: Copy + fmt::Debug> Failure<O> {
    /// A failure of `op` described by `msg`.
    pub fn new(op: O, class: Class, msg: impl Into<String>) -> Failure<O> {
        Failure(Box::new(Parts {
            op,
            class,
            msg: msg.into(),
            source: None,
            fix: None,
        }))
    }

    /// A failure of `op` that adds nothing to its cause's text (`Display` is the cause's).
    pub fn wrap(
        op: O,
        class: Class,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Failure<O> {
        Failure(Box::new(Parts {
            op,
            class,
            msg: String::new(),
            source: None,
            fix: None,
        }))
        .because(source)
    }

    /// The same failure, caused by `source`.
    pub fn because(self, source: impl std::error::Error + Send + Sync + 'static) -> Failure<O> {
        self.because_source(Arc::new(source))
    }

    /// The same failure, caused by `source` (already shared, or a plain message made into an
    /// error with `Source::from(Box::<dyn Error + Send + Sync>::from(text))`).
    pub fn because_source(mut self, source: Source) -> Failure<O> {
        self.0.source = Some(source);
        self
    }

    /// The same failure with a fix appended to its report (text starting with its own
    /// separator, e.g. `"; pinning … failed: raise …"`).
    pub fn fix(mut self, fix: impl Into<String>) -> Failure<O> {
        let fix = fix.into();
        self.0.fix = (!fix.is_empty()).then_some(fix);
        self
    }

    /// The operation that failed.
    pub fn op(&self) -> O {
        self.0.op
    }

    /// The class (→ `ncclResult_t`).
    pub fn class(&self) -> Class {
        self.0.class
    }

    /// The same failure seen from a layer above: `op` there, the same class, this one as the
    /// (transparent) cause; the fix moves up with it, so it still ends the report.
    pub fn lift<P: Copy + fmt::Debug>(mut self, op: P) -> Failure<P>
    where
        O: Send + Sync + 'static,
        Failure<O>: std::error::Error,
    {
        let class = self.0.class;
        let fix = self.0.fix.take();
        let mut up = Failure::wrap(op, class, self);
        up.0.fix = fix;
        up
    }

    /// The whole line: this text, each source after `": "`, then the fix (the wording the
    /// WARN lines and tests read).
    pub fn report(&self) -> String
    where
        O: 'static,
    {
        use std::fmt::Write as _;
        let mut out = self.to_string();
        let mut next = std::error::Error::source(self);
        while let Some(s) = next {
            let _ = write!(out, ": {s}");
            next = s.source();
        }
        if let Some(f) = &self.0.fix {
            out.push_str(f);
        }
        out
    }
}

impl<O: fmt::Debug> fmt::Debug for Failure<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failure")
            .field("op", &self.0.op)
            .field("class", &self.0.class)
            .field("msg", &self.0.msg)
            .field("source", &self.0.source.as_ref().map(|s| s.to_string()))
            .field("fix", &self.0.fix)
            .finish()
    }
}

impl<O> fmt::Display for Failure<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.0.msg, &self.0.source) {
            (m, Some(s)) if m.is_empty() => fmt::Display::fmt(s, f),
            (m, _) => f.write_str(m),
        }
    }
}

impl<O: fmt::Debug> std::error::Error for Failure<O> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let s: &(dyn std::error::Error + 'static) = &**self.0.source.as_ref()?;
        if self.0.msg.is_empty() {
            // Transparent: the cause's text is this one's, so its source comes next.
            s.source()
        } else {
            Some(s)
        }
    }
}

/// Two failures are equal when they say the same (tests compare results).
impl<O: PartialEq> PartialEq for Failure<O> {
    fn eq(&self, other: &Self) -> bool {
        self.0.op == other.0.op
            && self.0.class == other.0.class
            && self.0.msg == other.0.msg
            && self.0.fix == other.0.fix
            && self.0.source.as_ref().map(|s| s.to_string())
                == other.0.source.as_ref().map(|s| s.to_string())
    }
}
