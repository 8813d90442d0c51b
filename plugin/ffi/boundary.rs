//! The boundary every table slot crosses, written once.
//!
//! - `entry!` makes a slot: an `unsafe extern "C" fn` returning `ncclResult_t` whose
//!   body runs inside `guard` (a panic never crosses into NCCL: Rust aborts the process when
//!   one unwinds out of `extern "C"`; it is logged as one WARN and returned as
//!   `ncclInternalError`), under the slot's NCCL name (the WARN's prefix) and its [`Op`]
//!   (`OP` in the body, named by the argument checks' errors).
//! - The argument macros are the only casts between NCCL's pointers and the plugin's objects:
//!   `arg!` (an object NCCL passes back: NULL is an `ncclInvalidArgument` naming the
//!   argument), `out!` (an out-parameter), `array!` (an array),
//!   `optional!` (an input struct that may be NULL) and `handle!` (the
//!   128-byte connect handle). Only the types NCCL holds a pointer
//!   to (`Opaque`) are cast, and each says which slot makes it and which releases it.
//! - `code` maps an error's [`Class`] to `ncclResult_t`, the one mapping.
//!
//! So a slot's body reads: check the arguments → call [`crate::api`] → write the
//! out-parameters (only on success: an error leaves them as NCCL passed them).

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use tracing::warn;

use super::abi::{
    ncclNet_v10_t, ncclNet_v11_t, ncclNet_v12_t, ncclNet_v7_t, ncclNet_v8_t, ncclNet_v9_t,
    ncclResult_t,
};
use crate::api::{Class, Context, Error, ListenComm, MrHandle, NetComm, Op, ReqHandle};

/// An exported function table (`ncclNet_vN_t`), shareable as a `static`. Only this crate makes
/// one; the exported statics (`ncclNetPlugin_v7` … `ncclNetPlugin_v12`) are the instances.
/// [`Table::get`] (or `*`) gives the table as NCCL reads it, e.g. for a test calling its
/// function pointers in-process: `ffi::v12::ncclNetPlugin_v12.get().init`.
#[repr(transparent)]
pub struct Table<T: NetTable>(T);

impl<T: NetTable> Table<T> {
    /// The table `t` (the adapters' statics).
    pub(crate) const fn new(t: T) -> Table<T> {
        Table(t)
    }

    /// The table as NCCL reads it.
    pub fn get(&self) -> &T {
        &self.0
    }
}

impl<T: NetTable> std::ops::Deref for Table<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

mod sealed {
    pub trait Sealed {}
}

/// The `ncclNet_vN_t` table types (v7 … v12): what a [`Table`] may hold.
pub trait NetTable: sealed::Sealed {}

macro_rules! net_tables {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl NetTable for $t {}
    )*};
}
net_tables!(
    ncclNet_v7_t,
    ncclNet_v8_t,
    ncclNet_v9_t,
    ncclNet_v10_t,
    ncclNet_v11_t,
    ncclNet_v12_t
);

// SAFETY: an `ncclNet_vN_t` is a `name` pointer and `Option<unsafe extern "C" fn>` slots, with
// no interior mutability, so a shared `&Table` only ever reads them. Tables are made only in
// this crate (`Table::new` is crate-private, the field private), each pointing `name` at the
// 'static C string `shim::NAME`; the function pointers are plain code addresses.
unsafe impl<T: NetTable> Sync for Table<T> {}

/// An object NCCL holds as `void*` between calls, and how it was handed out: the argument
/// macros cast only to these types.
pub(crate) trait Opaque {}

/// `sendComm`/`recvComm`: boxed by `connect`/`accept`, released by `closeSend`/`closeRecv`.
impl Opaque for NetComm {}
/// `listenComm`: boxed by `listen`, released by `closeListen`.
impl Opaque for ListenComm {}
/// `mhandle`: boxed by `regMr`, released by `deregMr`.
impl Opaque for MrHandle {}
/// `request`: one of its API comm's request handles (handed out by `isend`/`irecv`/`iflush`,
/// never freed by NCCL), valid while the comm is open.
impl Opaque for ReqHandle {}
/// `ctx` (v11+): one `Arc` reference made by `init`, released by `finalize`.
impl Opaque for Context {}

/// Hands `v` to NCCL as `void*`; `arg!``(p as Box<T>)` takes it back.
pub(crate) fn into_raw<T: Opaque>(v: T) -> *mut c_void {
    Box::into_raw(Box::new(v)).cast()
}

/// Hands a context reference to NCCL as `void*` (`init`, v11+).
pub(crate) fn arc_into_raw(c: Arc<Context>) -> *mut c_void {
    Arc::into_raw(c).cast_mut().cast()
}

/// `&T` from NCCL's `p` (NULL: `None`).
///
/// # Safety
/// `p` is NULL or a pointer to a live `T` this plugin handed out ([`Opaque`]'s docs), not used
/// mutably elsewhere during `'a`.
pub(crate) unsafe fn opaque_ref<'a, T: Opaque>(p: *mut c_void) -> Option<&'a T> {
    // SAFETY: per the contract.
    unsafe { p.cast::<T>().as_ref() }
}

/// `&mut T` from NCCL's `p` (NULL: `None`).
///
/// # Safety
/// As [`opaque_ref`], and no other reference to the object lives during `'a` (NCCL uses a listen
/// comm from one thread).
pub(crate) unsafe fn opaque_mut<'a, T: Opaque>(p: *mut c_void) -> Option<&'a mut T> {
    // SAFETY: per the contract.
    unsafe { p.cast::<T>().as_mut() }
}

/// Takes back the box [`into_raw`] made (NULL: `None`).
///
/// # Safety
/// `p` is NULL or came from [`into_raw`]`::<T>` and is released once, now.
pub(crate) unsafe fn from_raw<T: Opaque>(p: *mut c_void) -> Option<Box<T>> {
    // SAFETY: per the contract, p is a live Box<T> NCCL gives back once.
    (!p.is_null()).then(|| unsafe { Box::from_raw(p.cast::<T>()) })
}

/// A new reference on the context NCCL passes as `ctx` (NULL: `None`).
///
/// # Safety
/// `p` is NULL or came from [`arc_into_raw`], and `finalize` has not consumed it.
pub(crate) unsafe fn arc_clone(p: *mut c_void) -> Option<Arc<Context>> {
    let p = p.cast_const().cast::<Context>();
    // SAFETY: p came from Arc::into_raw and its reference is still held (NCCL finalizes a
    // context once, after its last listen/connect), so the count is at least 1.
    (!p.is_null()).then(|| unsafe {
        Arc::increment_strong_count(p);
        Arc::from_raw(p)
    })
}

/// Takes back the reference [`arc_into_raw`] made (NULL: `None`).
///
/// # Safety
/// `p` is NULL or came from [`arc_into_raw`] and is released once, now.
pub(crate) unsafe fn arc_from_raw(p: *mut c_void) -> Option<Arc<Context>> {
    // SAFETY: per the contract.
    (!p.is_null()).then(|| unsafe { Arc::from_raw(p.cast_const().cast::<Context>()) })
}

/// Runs a slot's body `f` under the slot's NCCL name: success → `ncclSuccess`; an error → its
/// report as one WARN and [`code`]; a panic → one WARN and `ncclInternalError`.
#[inline(always)]
pub(crate) fn guard(slot: &str, f: impl FnOnce() -> Result<(), Error>) -> ncclResult_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => ncclResult_t::ncclSuccess,
        Ok(Err(e)) => {
            // The whole chain: this call's text, each cause, the fix.
            warn!("{slot}: {}", e.report());
            code(&e)
        }
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            // Logging itself may have panicked; don't let a second panic escape.
            let _ =
                catch_unwind(|| warn!("{slot}: internal error (panic: {msg}); please report this"));
            ncclResult_t::ncclInternalError
        }
    }
}

/// The one mapping of [`Error`] to `ncclResult_t` (ext-net README: network/hardware failures
/// → system error, NCCL misusing the plugin → internal error, user misconfiguration →
/// invalid usage, the peer failing → remote error).
pub(crate) fn code(e: &Error) -> ncclResult_t {
    match e.class() {
        Class::InvalidArgument => ncclResult_t::ncclInvalidArgument,
        Class::Usage => ncclResult_t::ncclInvalidUsage,
        Class::Remote => ncclResult_t::ncclRemoteError,
        Class::System => ncclResult_t::ncclSystemError,
        Class::Internal => ncclResult_t::ncclInternalError,
    }
}

/// `what` (an argument) is NULL: the caller's bad argument.
pub(crate) fn null_arg(op: Op, what: &str) -> Error {
    Error::new(op, Class::InvalidArgument, format!("{what} is NULL"))
}

/// Defines a table slot (one per slot body; generics: none, one type parameter with a bound,
/// or one `const` parameter):
///
/// ```text
/// entry! {
///     /// docs
///     fn isend<S: WireSize>(send_comm: *mut c_void, …, request: *mut *mut c_void)
///         as "isend", Op::Isend
///     {
///         let comm: &NetComm = arg!(send_comm, "sendComm");   // check
///         let r = comm.as_send(OP)?.isend(…)?;                  // call the API
///         *out!(request, "request") = …;                        // write out-parameters
///     }
/// }
/// ```
///
/// becomes `pub(crate) unsafe extern "C" fn isend<S: WireSize>(…) -> ncclResult_t` running the
/// body in [`guard`] with the slot name `"isend"`, `OP` = `Op::Isend` in scope for the argument
/// macros, and `Ok(())` after the body's statements (`?` returns an error).
///
/// The generated function's `# Safety` (NCCL's contract, ext-net README): every pointer
/// argument is NULL or valid for its slot (objects ones this plugin handed out, arrays of the
/// given length, out-parameters writable), for the duration of the call.
macro_rules! entry {
    (
        $(#[$attr:meta])*
        fn $name:ident <const $c:ident: $cty:ty> ($($arg:ident: $ty:ty),* $(,)?)
            as $slot:literal, $op:path
        { $($body:tt)* }
    ) => {
        $(#[$attr])*
        pub(crate) unsafe extern "C" fn $name<const $c: $cty>($($arg: $ty),*)
            -> $crate::ffi::abi::ncclResult_t
        {
            $crate::ffi::boundary::entry!(@body $slot, $op, $($body)*)
        }
    };
    (
        $(#[$attr:meta])*
        fn $name:ident <$g:ident: $bound:path> ($($arg:ident: $ty:ty),* $(,)?)
            as $slot:literal, $op:path
        { $($body:tt)* }
    ) => {
        $(#[$attr])*
        pub(crate) unsafe extern "C" fn $name<$g: $bound>($($arg: $ty),*)
            -> $crate::ffi::abi::ncclResult_t
        {
            $crate::ffi::boundary::entry!(@body $slot, $op, $($body)*)
        }
    };
    (
        $(#[$attr:meta])*
        fn $name:ident ($($arg:ident: $ty:ty),* $(,)?) as $slot:literal, $op:path
        { $($body:tt)* }
    ) => {
        $(#[$attr])*
        pub(crate) unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::ffi::abi::ncclResult_t {
            $crate::ffi::boundary::entry!(@body $slot, $op, $($body)*)
        }
    };
    (@body $slot:literal, $op:path, $($body:tt)*) => {{
        /// The slot's operation, named by its argument checks' errors.
        #[allow(dead_code)] // a slot without pointer arguments names none
        const OP: $crate::api::Op = $op;
        $crate::ffi::boundary::guard($slot, || {
            $($body)*
            Ok(())
        })
    }};
}

/// An object argument NCCL passes back, as the type it was handed out as (inside an
/// `entry!` body; NULL returns an `ncclInvalidArgument` naming `what`):
/// `arg!(p, "what")` → `&T`, `arg!(mut p, "what")` → `&mut T`, `arg!(take p, "what")` →
/// `Box<T>` (released), `arg!(ctx p)` → a new `Arc<Context>` reference, `arg!(finalize p)` →
/// the `Arc<Context>` reference `init` made (released).
macro_rules! arg {
    (mut $p:expr, $what:literal) => {
        // SAFETY: as for `arg!(p)`; NCCL uses a listen comm from one thread at a time.
        unsafe { $crate::ffi::boundary::opaque_mut($p) }
            .ok_or_else(|| $crate::ffi::boundary::null_arg(OP, $what))?
    };
    (take $p:expr, $what:literal) => {
        // SAFETY: the slot's contract: $p is NULL or a box this plugin handed out, given back
        // once (a close or dereg slot).
        unsafe { $crate::ffi::boundary::from_raw($p) }
            .ok_or_else(|| $crate::ffi::boundary::null_arg(OP, $what))?
    };
    (ctx $p:expr) => {
        // SAFETY: the slot's contract: $p is NULL or a context `init` made and `finalize` has
        // not consumed.
        unsafe { $crate::ffi::boundary::arc_clone($p) }
            .ok_or_else(|| $crate::ffi::boundary::null_arg(OP, "ctx"))?
    };
    (finalize $p:expr) => {
        // SAFETY: the slot's contract: $p is NULL or a context `init` made, finalized once.
        unsafe { $crate::ffi::boundary::arc_from_raw($p) }
            .ok_or_else(|| $crate::ffi::boundary::null_arg(OP, "ctx"))?
    };
    ($p:expr, $what:literal) => {
        // SAFETY: the slot's contract ([`entry!`]): $p is NULL or the object of its type this
        // plugin handed out for this argument ([`Opaque`]), still live.
        unsafe { $crate::ffi::boundary::opaque_ref($p) }
            .ok_or_else(|| $crate::ffi::boundary::null_arg(OP, $what))?
    };
}

/// An out-parameter (inside an `entry!` body): `&mut T` over NCCL's `*mut T`; NULL
/// returns an `ncclInvalidArgument` naming `what`. Write it last, on success.
macro_rules! out {
    ($p:expr, $what:literal) => {
        // SAFETY: the slot's contract: $p is NULL or writable for one T, and nothing else
        // reads or writes it during the call.
        unsafe { $p.as_mut() }.ok_or_else(|| $crate::ffi::boundary::null_arg(OP, $what))?
    };
}

/// An array of `n` entries (inside an `entry!` body): `&[T]` over NCCL's input
/// array `*mut T`, `&mut [T]` (`array!(mut …)`) over an output array; NULL returns an
/// `ncclInvalidArgument` naming `what`.
macro_rules! array {
    (mut $p:expr, $n:expr, $what:literal) => {{
        let p = $p;
        if p.is_null() {
            return Err($crate::ffi::boundary::null_arg(OP, $what));
        }
        // SAFETY: the slot's contract: a non-NULL output array has room for `n` entries, which
        // nothing else reads or writes during the call.
        unsafe { std::slice::from_raw_parts_mut(p, $n) }
    }};
    ($p:expr, $n:expr, $what:literal) => {{
        let p = $p;
        if p.is_null() {
            return Err($crate::ffi::boundary::null_arg(OP, $what));
        }
        // SAFETY: the slot's contract: a non-NULL array argument holds `n` initialized entries
        // NCCL does not change during the call.
        unsafe { std::slice::from_raw_parts(p.cast_const(), $n) }
    }};
}

/// An optional input struct (inside an `entry!` body): `Option<&T>` over NCCL's
/// `*mut T` (NULL: `None`), e.g. v10's connect config.
macro_rules! optional {
    ($p:expr) => {
        // SAFETY: the slot's contract: $p is NULL or a valid T NCCL does not change during the
        // call; it is read, never kept.
        unsafe { $p.as_ref() }
    };
}

/// The connect handle (inside an `entry!` body): `&mut [u8; HANDLE_SIZE]` over the
/// `void*` NCCL passes to `listen` (to fill) and `connect` (to read, and to keep the connect's
/// state in); NULL returns an `ncclInvalidArgument`.
macro_rules! handle {
    ($p:expr) => {
        // SAFETY: NCCL's handle buffer holds NCCL_NET_HANDLE_MAXSIZE bytes (ffi::abi asserts it
        // is HANDLE_SIZE) and is NCCL's own memory, not shared during the call.
        unsafe { $p.cast::<[u8; $crate::conn::HANDLE_SIZE]>().as_mut() }
            .ok_or_else(|| $crate::ffi::boundary::null_arg(OP, "handle"))?
    };
}

pub(crate) use {arg, array, entry, handle, optional, out};
