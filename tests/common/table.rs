//! The plugin as NCCL 2.30+ drives it: through the function pointers of the exported
//! `ncclNetPlugin_v12` table, in-process (the shims, the API and the comms below them all run).
//! Used by the contract explorer (`tests/explorer.rs`) and the liveness tests
//! (`tests/liveness.rs`).
//!
//! `VERBSNET_*` knobs are read from the environment by `init`; [`set_env`] sets the suite's
//! transport (`VERBSNET_TEST_TRANSPORT`: `tcp` here, `ib` in the soft-RoCE VM) once per
//! process, before the first `init`.
//!
//! Every call counts in [`calls`]. Pointers the plugin returned are carried as [`Ptr`]:
//! NCCL moves them between its threads (one thread at a time per comm, ext-net README), and so
//! do these tests.

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

use nccl_net_verbsnet::api::NetComm;
use nccl_net_verbsnet::engine::wire::MAX_RECVS;
use nccl_net_verbsnet::ffi::abi::{
    ncclNetCommConfig_v10_t, ncclNet_v12_t, ncclResult_t, NCCL_PTR_HOST,
};
use nccl_net_verbsnet::ffi::v12::ncclNetPlugin_v12;

/// A result code of the table.
pub type Rc = ncclResult_t;
/// Success.
pub const OK: Rc = ncclResult_t::ncclSuccess;

/// The table under test.
pub fn table() -> &'static ncclNet_v12_t {
    ncclNetPlugin_v12.get()
}

static CALLS: AtomicU64 = AtomicU64::new(0);

/// Plugin calls made through this module so far (process-wide).
pub fn calls() -> u64 {
    CALLS.load(Ordering::Relaxed)
}

fn count() {
    CALLS.fetch_add(1, Ordering::Relaxed);
}

/// A pointer the plugin returned (context, comm, memory handle, request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ptr(pub *mut c_void);

// SAFETY: the plugin's objects may be used from any thread as long as one thread at a time
// uses a comm (ext-net README, "one progress thread per comm"); the tests keep to that.
unsafe impl Send for Ptr {}
// SAFETY: as above; a shared `Ptr` is only copied, never dereferenced by the tests.
unsafe impl Sync for Ptr {}

impl Ptr {
    /// NULL.
    pub fn null() -> Ptr {
        Ptr(ptr::null_mut())
    }

    /// Whether NULL.
    pub fn is_null(self) -> bool {
        self.0.is_null()
    }
}

/// Sets the suite's transport and the knobs in `extra` (each only when the environment does not
/// set it already), once per process: `init` reads them.
pub fn set_env(extra: &[(&str, &str)]) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let transport = if super::is_ib() { "ib" } else { "tcp" };
        let mut all = vec![
            ("VERBSNET_TRANSPORT", transport),
            // The listener (and on tcp the data sockets) on loopback; rxe0 carries ib traffic.
            ("VERBSNET_SOCKET_ADDR", "127.0.0.1"),
        ];
        all.extend_from_slice(extra);
        for (k, v) in all {
            if std::env::var_os(k).is_none() {
                std::env::set_var(k, v);
            }
        }
    });
}

/// `init(ctx, commId, {trafficClass = -1})`: a context of its own.
pub fn init(comm_id: u64) -> Result<Ptr, Rc> {
    count();
    let mut ctx: *mut c_void = ptr::null_mut();
    let mut cfg = ncclNetCommConfig_v10_t { trafficClass: -1 };
    // SAFETY: valid out-pointers; no logger (lines go to stderr) and no profiler.
    let rc = unsafe { table().init.unwrap()(&mut ctx, comm_id, &mut cfg, None, None) };
    if rc != OK {
        return Err(rc);
    }
    Ok(Ptr(ctx))
}

/// `finalize(ctx)`.
pub fn finalize(ctx: Ptr) -> Rc {
    count();
    // SAFETY: ctx came from init and is finalized once.
    unsafe { table().finalize.unwrap()(ctx.0) }
}

/// `listen`, then `connect` and `accept` polled alternately (as NCCL's GDR probe does from one
/// thread) until both return a comm, then `closeListen`: `(sendComm, recvComm)`.
pub fn connect_pair(ctx: Ptr, limit: Duration) -> Result<(Ptr, Ptr), String> {
    connect_pair_on(ctx, 0, limit)
}

/// [`connect_pair`] on device `dev` (a virtual device's index included).
pub fn connect_pair_on(ctx: Ptr, dev: c_int, limit: Duration) -> Result<(Ptr, Ptr), String> {
    let t = table();
    let mut handle = [0u8; 128];
    let mut listen: *mut c_void = ptr::null_mut();
    count();
    // SAFETY: a 128-byte handle and valid out-pointers.
    let rc = unsafe { t.listen.unwrap()(ctx.0, dev, handle.as_mut_ptr().cast(), &mut listen) };
    if rc != OK || listen.is_null() {
        return Err(format!("listen: {rc:?}"));
    }
    let (mut send, mut recv): (*mut c_void, *mut c_void) = (ptr::null_mut(), ptr::null_mut());
    let start = Instant::now();
    while send.is_null() || recv.is_null() {
        if start.elapsed() > limit {
            return Err(format!("connect/accept did not finish in {limit:?}"));
        }
        if send.is_null() {
            count();
            let h = handle.as_mut_ptr().cast();
            // SAFETY: the same handle on every call (NCCL's rule); valid out-pointers.
            let rc = unsafe { t.connect.unwrap()(ctx.0, dev, h, &mut send, ptr::null_mut()) };
            if rc != OK {
                return Err(format!("connect: {rc:?}"));
            }
        }
        if recv.is_null() {
            count();
            // SAFETY: listen came from listen; valid out-pointer.
            let rc = unsafe { t.accept.unwrap()(listen, &mut recv, ptr::null_mut()) };
            if rc != OK {
                return Err(format!("accept: {rc:?}"));
            }
        }
    }
    count();
    // SAFETY: listen came from listen and is closed once.
    let rc = unsafe { t.closeListen.unwrap()(listen) };
    if rc != OK {
        return Err(format!("closeListen: {rc:?}"));
    }
    Ok((Ptr(send), Ptr(recv)))
}

/// `regMr(comm, addr, len, NCCL_PTR_HOST)`.
pub fn reg_mr(comm: Ptr, mem: &Mem) -> Result<Ptr, Rc> {
    count();
    let mut mh: *mut c_void = ptr::null_mut();
    // SAFETY: comm is live; mem stays allocated until after deregMr (Mem's owner's rule).
    let rc = unsafe {
        table().regMr.unwrap()(
            comm.0,
            mem.p.cast(),
            mem.len,
            NCCL_PTR_HOST as c_int,
            &mut mh,
        )
    };
    if rc != OK {
        return Err(rc);
    }
    Ok(Ptr(mh))
}

/// `deregMr(comm, mhandle)`.
pub fn dereg_mr(comm: Ptr, mh: Ptr) -> Rc {
    count();
    // SAFETY: mh came from regMr and is deregistered once; comm is only passed along.
    unsafe { table().deregMr.unwrap()(comm.0, mh.0) }
}

/// `isend`: `Ok(None)` = "retry later" (a NULL request).
pub fn isend(send: Ptr, addr: u64, size: usize, tag: i32, mh: Ptr) -> Result<Option<Ptr>, Rc> {
    count();
    let mut req: *mut c_void = ptr::null_mut();
    let data = addr as *mut c_void;
    // SAFETY: send is a live send comm, [addr, addr+size) lies inside mh's registration.
    let rc =
        unsafe { table().isend.unwrap()(send.0, data, size, tag, mh.0, ptr::null_mut(), &mut req) };
    if rc != OK {
        return Err(rc);
    }
    Ok((!req.is_null()).then_some(Ptr(req)))
}

/// `irecv` of `(addr, capacity, tag, mhandle)` buffers (at most `MAX_RECVS`, as NCCL passes):
/// `Ok(None)` = "retry later". The arrays are on the stack, as NCCL's proxy keeps them: the
/// call allocates nothing of its own (`tests/hot_path.rs` counts the plugin's allocations
/// around it).
pub fn irecv(recv: Ptr, bufs: &[(u64, usize, i32, Ptr)]) -> Result<Option<Ptr>, Rc> {
    count();
    assert!(bufs.len() <= MAX_RECVS, "irecv of {} buffers", bufs.len());
    let mut data = [ptr::null_mut::<c_void>(); MAX_RECVS];
    let mut sizes = [0usize; MAX_RECVS];
    let mut tags: [c_int; MAX_RECVS] = [0; MAX_RECVS];
    let mut mhs = [ptr::null_mut::<c_void>(); MAX_RECVS];
    let mut phs = [ptr::null_mut::<c_void>(); MAX_RECVS];
    for (i, b) in bufs.iter().enumerate() {
        (data[i], sizes[i], tags[i], mhs[i]) = (b.0 as *mut c_void, b.1, b.2, b.3 .0);
    }
    let mut req: *mut c_void = ptr::null_mut();
    // SAFETY: recv is a live receive comm; n arrays of n entries; every buffer lies inside its
    // registration.
    let rc = unsafe {
        table().irecv.unwrap()(
            recv.0,
            bufs.len() as c_int,
            data.as_mut_ptr(),
            sizes.as_mut_ptr(),
            tags.as_mut_ptr(),
            mhs.as_mut_ptr(),
            phs.as_mut_ptr(),
            &mut req,
        )
    };
    if rc != OK {
        return Err(rc);
    }
    Ok((!req.is_null()).then_some(Ptr(req)))
}

/// `test(request, done, sizes)` with room for `n` sizes: `Ok(Some(sizes))` once done.
pub fn test(req: Ptr, n: usize) -> Result<Option<Vec<c_int>>, Rc> {
    count();
    let mut done: c_int = 0;
    let mut sizes = vec![-1 as c_int; n.max(1)];
    // SAFETY: req came from isend/irecv on a live comm and has not been reported done.
    let rc = unsafe { table().test.unwrap()(req.0, &mut done, sizes.as_mut_ptr()) };
    if rc != OK {
        return Err(rc);
    }
    Ok((done != 0).then(|| {
        sizes.truncate(n);
        sizes
    }))
}

/// `closeSend(sendComm)`.
pub fn close_send(send: Ptr) -> Rc {
    count();
    // SAFETY: send came from connect and is closed once.
    unsafe { table().closeSend.unwrap()(send.0) }
}

/// `closeRecv(recvComm)`.
pub fn close_recv(recv: Ptr) -> Rc {
    count();
    // SAFETY: recv came from accept and is closed once.
    unsafe { table().closeRecv.unwrap()(recv.0) }
}

/// Ends the comm behind `comm` (from `connect` or `accept`) as the death of its process would:
/// no `closeSend`/`closeRecv`, its descriptors and QP gone ([`nccl_net_verbsnet::testkit::crash`]).
/// The pointer must not be used again.
pub fn crash(comm: Ptr) {
    count();
    // SAFETY: the shims box every comm they return as `Box<NetComm>` (plugin/ffi/shim.rs,
    // connect_body and accept) and this comm is not used again.
    let b = unsafe { Box::from_raw(comm.0.cast::<NetComm>()) };
    nccl_net_verbsnet::testkit::crash(b);
}

/// Open file descriptors of this process.
pub fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Memory the plugin may read and write (a registered buffer): never behind a Rust reference,
/// copied in and out through raw pointers while no request uses the range.
pub struct Mem {
    p: *mut u8,
    len: usize,
}

// SAFETY: plain heap memory; the tests touch a range only while no request uses it.
unsafe impl Send for Mem {}

const MEM_ALIGN: usize = 4096;

impl Mem {
    /// `len` bytes (page-aligned), every byte `fill`.
    pub fn new(len: usize, fill: u8) -> Mem {
        let layout = std::alloc::Layout::from_size_align(len.max(1), MEM_ALIGN).unwrap();
        // SAFETY: a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        assert!(!p.is_null(), "out of memory");
        // SAFETY: p points to len.max(1) allocated bytes.
        unsafe { ptr::write_bytes(p, fill, len.max(1)) };
        Mem { p, len }
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.len
    }

    /// Address of byte `off`.
    pub fn addr(&self, off: usize) -> u64 {
        self.p as u64 + off as u64
    }

    /// Copies `data` to `off`.
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: in bounds (checked); no request uses the range (the caller's rule).
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.p.add(off), data.len()) };
    }

    /// Sets `len` bytes at `off` to `byte`.
    pub fn fill(&self, off: usize, len: usize, byte: u8) {
        assert!(off + len <= self.len);
        // SAFETY: in bounds (checked); no request uses the range.
        unsafe { ptr::write_bytes(self.p.add(off), byte, len) };
    }

    /// Copies `len` bytes at `off` out.
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.len);
        let mut v = vec![0u8; len];
        // SAFETY: in bounds (checked); the request that wrote the range completed.
        unsafe { ptr::copy_nonoverlapping(self.p.add(off), v.as_mut_ptr(), len) };
        v
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len.max(1), MEM_ALIGN).unwrap();
        // SAFETY: allocated in new with this layout.
        unsafe { std::alloc::dealloc(self.p, layout) };
    }
}

/// The bytes of message `k` with tag `tag` on connection `key`, `len` long: distinct for every
/// message, so data in the wrong buffer is told apart from the right one.
pub fn pattern(key: u64, tag: i32, k: u64, len: usize) -> Vec<u8> {
    let mut x = key
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add((tag as u32 as u64) << 32 | (k & 0xffff_ffff))
        .wrapping_add(1);
    (0..len)
        .map(|i| {
            if i % 8 == 0 {
                // splitmix64 step
                x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = x;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                x = z ^ (z >> 31);
            }
            (x >> ((i % 8) * 8)) as u8
        })
        .collect()
}
