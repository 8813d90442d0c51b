//! The hot path allocates nothing (issue 22): once a connection is warm, `isend`, `irecv` and
//! `test`, called through the `ncclNetPlugin_v12` table as NCCL calls them, make no heap
//! allocation on either side. A `malloc`/`free` pair is 150–250 instructions in glibc, and the
//! calls of a small message are 700–2,800 each (docs/performance.md, "Instructions per call"),
//! so one allocation per call is a tenth of the plugin's work per message.
//!
//! Counted by this binary's global allocator, per thread, around each plugin call only (the
//! test's own bookkeeping is outside the counted spans). Both ends of a connection run on this
//! thread, each call on its own comm.
//!
//! The callers: a polite one (one message in flight, tested at once) and the least polite
//! legal one (every receive of a window posted first, then every send spun on until it
//! starts, then the requests tested in reverse order), at 8 B, 64 B and 4 KiB (eager and small
//! sends) and 256 KiB (rendezvous: an RDMA WRITE into the receive buffer); the second caller also
//! over 12 QPs per connection with data split over them (`VERBSNET_IB_QPS_PER_CONNECTION`,
//! `VERBSNET_IB_SPLIT_DATA_ON_QPS`: one call then posts a receive list per data QP).
//!
//! Both transports are held to it (`VERBSNET_TEST_TRANSPORT`: tcp on the host, ib in the
//! soft-RoCE VM suite): the tcp stand-in keeps its per-WR vectors for reuse as the engine
//! does, so an allocation found here is the plugin's, whichever transport runs.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::c_int;
use std::time::Duration;

use common::table::{self as t, Mem, Ptr, OK};

/// The system allocator, counting the allocations each thread makes while its counter is on.
struct Counting;

thread_local! {
    /// Allocations (alloc, alloc_zeroed, realloc) made by this thread while `ON`.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    static ON: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    // `try_with`: never panics in a thread's teardown, when the key is gone.
    let _ = ON.try_with(|on| {
        if on.get() {
            let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

// SAFETY: every method forwards to `System` with the same arguments; the counting touches only
// const-initialized thread-locals (no allocation, no lazy initialization).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by `f` on this thread, and its result.
fn counted<T>(f: impl FnOnce() -> T) -> (u64, T) {
    let before = ALLOCS.with(Cell::get);
    ON.with(|on| on.set(true));
    let r = f();
    ON.with(|on| on.set(false));
    (ALLOCS.with(Cell::get) - before, r)
}

/// Allocations counted on each side so far.
#[derive(Default, Debug, Clone, Copy)]
struct Tally {
    send: u64,
    recv: u64,
    calls: u64,
}

/// One connection, both ends on this thread, with a registered buffer per end.
struct Pair {
    ctx: Ptr,
    send: Ptr,
    recv: Ptr,
    smem: Mem,
    rmem: Mem,
    smh: Ptr,
    rmh: Ptr,
}

const WINDOW: usize = 8;
const SLOT: usize = 256 << 10;

impl Pair {
    /// A connection on a context of its own, with the knobs in `env` set while it is made
    /// (each test holds the suite's lock, and `init` reads the knobs when no other context
    /// is open).
    fn new(env: &[(&str, &str)]) -> Pair {
        t::set_env(&[]);
        for (k, v) in env {
            std::env::set_var(k, v);
        }
        let ctx = t::init(0x22).unwrap_or_else(|rc| panic!("init returned {rc:?}"));
        for (k, _) in env {
            std::env::remove_var(k);
        }
        let (send, recv) = t::connect_pair(ctx, Duration::from_secs(60)).unwrap();
        let smem = Mem::new(WINDOW * SLOT, 0x5a);
        let rmem = Mem::new(WINDOW * SLOT, 0);
        let smh = t::reg_mr(send, &smem).unwrap();
        let rmh = t::reg_mr(recv, &rmem).unwrap();
        Pair {
            ctx,
            send,
            recv,
            smem,
            rmem,
            smh,
            rmh,
        }
    }

    /// `irecv` of one buffer (slot `k`, tag `tag`), through the table with arrays on the
    /// stack, as NCCL's proxy passes them; counted on the receive side.
    fn irecv(&self, k: usize, tag: i32, tally: &mut Tally) -> Option<Ptr> {
        let buf = [(self.rmem.addr(k * SLOT), SLOT, tag, self.rmh)];
        let (n, r) = counted(|| t::irecv(self.recv, &buf));
        tally.recv += n;
        tally.calls += 1;
        r.unwrap_or_else(|rc| panic!("irecv returned {rc:?}"))
    }

    /// `isend` of `size` bytes from slot `k`; counted on the send side.
    fn isend(&self, k: usize, size: usize, tag: i32, tally: &mut Tally) -> Option<Ptr> {
        let (n, r) = counted(|| t::isend(self.send, self.smem.addr(k * SLOT), size, tag, self.smh));
        tally.send += n;
        tally.calls += 1;
        r.unwrap_or_else(|rc| panic!("isend returned {rc:?}"))
    }

    /// `test` of a request, with `done` and one size on the stack: the size once done.
    fn test(&self, req: Ptr, recv: bool, tally: &mut Tally) -> Option<c_int> {
        let mut done: c_int = 0;
        let mut size: c_int = -1;
        let (n, rc) = counted(|| {
            // SAFETY: a request of a live comm, not reported done yet; room for one size.
            unsafe { t::table().test.unwrap()(req.0, &mut done, &mut size) }
        });
        assert_eq!(rc, OK, "test");
        if recv {
            tally.recv += n;
        } else {
            tally.send += n;
        }
        tally.calls += 1;
        (done != 0).then_some(size)
    }

    /// Sends until `isend` starts it (spinning as NCCL's proxy does on a NULL request).
    fn spin_send(&self, k: usize, size: usize, tag: i32, tally: &mut Tally) -> Ptr {
        for _ in 0..10_000_000 {
            if let Some(r) = self.isend(k, size, tag, tally) {
                return r;
            }
        }
        panic!("isend of {size} bytes never started");
    }

    /// Tests `req` until done; the size it reported.
    fn wait(&self, req: Ptr, recv: bool, tally: &mut Tally) -> c_int {
        for _ in 0..50_000_000 {
            if let Some(s) = self.test(req, recv, tally) {
                return s;
            }
        }
        panic!("a request never completed");
    }

    /// One message in flight, tested at once.
    fn polite(&self, size: usize, rounds: usize, tally: &mut Tally) {
        for i in 0..rounds {
            let k = i % WINDOW;
            let rr = loop {
                if let Some(r) = self.irecv(k, 7, tally) {
                    break r;
                }
            };
            let sr = self.spin_send(k, size, 7, tally);
            assert_eq!(self.wait(sr, false, tally), size as c_int);
            assert_eq!(self.wait(rr, true, tally), size as c_int);
        }
    }

    /// Every receive of a window, then every send spun on, then the tests, newest first.
    fn rude(&self, size: usize, rounds: usize, tally: &mut Tally) {
        for _ in 0..rounds {
            let mut rr = [Ptr::null(); WINDOW];
            for (k, r) in rr.iter_mut().enumerate() {
                *r = loop {
                    if let Some(r) = self.irecv(k, k as i32, tally) {
                        break r;
                    }
                };
            }
            let mut sr = [Ptr::null(); WINDOW];
            for (k, s) in sr.iter_mut().enumerate() {
                *s = self.spin_send(k, size, k as i32, tally);
            }
            for k in (0..WINDOW).rev() {
                assert_eq!(self.wait(sr[k], false, tally), size as c_int);
                assert_eq!(self.wait(rr[k], true, tally), size as c_int);
            }
        }
    }

    fn close(self) {
        assert_eq!(t::dereg_mr(self.send, self.smh), OK);
        assert_eq!(t::dereg_mr(self.recv, self.rmh), OK);
        assert_eq!(t::close_send(self.send), OK);
        assert_eq!(t::close_recv(self.recv), OK);
        assert_eq!(t::finalize(self.ctx), OK);
    }
}

/// Warms a pair with `pattern` (buffers reach their working capacity), then counts what the
/// same pattern allocates; checks that the counted rounds delivered (every receive slot is
/// cleared before them and holds the sender's bytes after).
fn check(name: &str, env: &[(&str, &str)], pattern: fn(&Pair, usize, usize, &mut Tally)) {
    let _serial = common::serial();
    let pair = Pair::new(env);
    for (k, size) in [8, 64, 4096, 256 << 10].into_iter().enumerate() {
        pattern(&pair, size, 40, &mut Tally::default());
        let byte = 0x31 + k as u8;
        pair.smem.fill(0, WINDOW * SLOT, byte);
        pair.rmem.fill(0, WINDOW * SLOT, 0);
        let mut tally = Tally::default();
        pattern(&pair, size, 200, &mut tally);
        println!("{name} {size} B: {tally:?} (allocations on each side, plugin calls)");
        assert!(tally.calls > 200, "{tally:?}");
        for slot in 0..WINDOW {
            assert!(
                pair.rmem.read(slot * SLOT, size).iter().all(|&b| b == byte),
                "{name} {size} B: receive slot {slot} does not hold the counted rounds' bytes"
            );
        }
        assert_eq!(
            (tally.send, tally.recv),
            (0, 0),
            "{name} {size} B: allocations by the sending and the receiving side's calls"
        );
    }
    pair.close();
}

#[test]
fn a_warm_connection_allocates_nothing_for_a_caller_that_tests_at_once() {
    check("polite", &[], Pair::polite);
}

#[test]
fn a_warm_connection_allocates_nothing_for_a_caller_that_posts_everything_first() {
    check("rude", &[], Pair::rude);
}

#[test]
fn a_warm_connection_of_twelve_split_qps_allocates_nothing_either() {
    check(
        "rude, 12 QPs split",
        &[
            ("VERBSNET_IB_QPS_PER_CONNECTION", "12"),
            ("VERBSNET_IB_SPLIT_DATA_ON_QPS", "1"),
        ],
        Pair::rude,
    );
}
