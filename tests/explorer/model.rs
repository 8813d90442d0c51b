//! The reference side of the explorer: which calls a caller may make, as a
//! [`ReferenceStateMachine`] whose transitions are the caller's *intents* (post a receive of
//! these buffers, send this many bytes with this tag, spin only on the send comms, crash a
//! peer, ...). Whether the plugin accepts an `isend`/`irecv` now or answers "retry later" is the
//! system's business, not the reference's: [`crate::sut`] turns each intent into legal calls
//! against what the plugin really answered. So every subsequence of a legal sequence that keeps
//! the preconditions is legal too, and shrinking can delete steps freely.
//!
//! The one legality rule the reference enforces is NCCL's size rule under its matching rule:
//! sends and receive buffers match in posting order per tag (the k-th send with tag `t` fills
//! the k-th buffer with tag `t`: NCCL's front-group rule, docs/protocol.md "Matching"), and a
//! send may not be larger than its buffer (ext-net README `plugins/net/README.md`, `irecv`).

use std::collections::BTreeMap;
use std::sync::Mutex;

use proptest::prelude::*;
use proptest_state_machine::ReferenceStateMachine;

/// Most connections of one sequence.
pub const MAX_CONNS: usize = 4;
/// Most threads of one sequence (connections are spread over them in the spin steps).
pub const MAX_THREADS: usize = 4;
/// Largest message the explorer sends (and largest receive buffer).
pub const MAX_SIZE: u32 = 256 << 10;
/// `maxRecvs`: buffers in one grouped receive.
pub const MAX_RECVS: usize = 8;

/// What a run explores and checks (one per test function).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Profile {
    /// Enforce the liveness obligations in the one-sided spin steps ([`crate::sut`] docs).
    pub liveness: bool,
    /// Draw peer deaths (`Crash`) and one-sided closes (`CloseOne`), and check the survivor.
    pub death: bool,
}

/// The profile the reference draws for; set by the test function before the runner starts
/// (the tests of the binary run one at a time).
pub static PROFILE: Mutex<Profile> = Mutex::new(Profile {
    liveness: false,
    death: false,
});

fn profile() -> Profile {
    *PROFILE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Which end of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The send comm (`connect`).
    Send,
    /// The receive comm (`accept`).
    Recv,
}

/// One step of a caller. Connections are numbered `0..conns`; a `pick` chooses among what is
/// outstanding at that moment (modulo its count).
#[derive(Clone, Debug)]
pub enum Step {
    /// Wants a grouped receive of these `(tag, capacity)` buffers: queued, then one `irecv` is
    /// tried for the oldest queued receive (if fewer than 32 are outstanding).
    Irecv { conn: usize, bufs: Vec<(i32, u32)> },
    /// Wants a send of `size` bytes with `tag`: queued, then one `isend` is tried for the
    /// oldest queued send with that tag (NCCL retries the same send until it starts).
    Isend { conn: usize, tag: i32, size: u32 },
    /// One `isend` retry for the oldest queued send of the `pick`-th tag with one.
    RetrySend { conn: usize, pick: usize },
    /// One `irecv` retry for the oldest queued receive.
    RetryRecv { conn: usize },
    /// One `test` of the `pick`-th outstanding request of `side`.
    Test {
        conn: usize,
        side: Side,
        pick: usize,
    },
    /// Calls only the send comms (retries and tests), at least `rounds` rounds; with
    /// liveness on, until every obligation of the send side is met or the bound passes.
    SendOnly { rounds: u32 },
    /// Calls only the receive comms (retries and tests), as `SendOnly`.
    RecvOnly { rounds: u32 },
    /// Calls both ends, `rounds` rounds (a polite caller).
    Pump { rounds: u32 },
    /// Calls nothing for `ms` milliseconds.
    Idle { ms: u32 },
    /// Registers a new region on `side` (later buffers go there).
    RegMr { conn: usize, side: Side },
    /// Deregisters the oldest region of `side` no request uses any more (not the newest).
    DeregMr { conn: usize, side: Side },
    /// Closes the connection: with `abort`, at once (requests in flight); otherwise after
    /// driving every queued send and receive to completion. `first` closes first.
    Close {
        conn: usize,
        first: Side,
        abort: bool,
    },
    /// The end `side` dies (no close); the other end's later calls must fail within the bound.
    Crash { conn: usize, side: Side, seed: u64 },
    /// The end `side` is closed (closeSend/closeRecv, maybe with requests in flight); the
    /// other end's later calls must fail within the bound.
    CloseOne { conn: usize, side: Side, seed: u64 },
    /// A closed connection is connected again.
    Reconnect { conn: usize },
}

/// The shape of one sequence.
#[derive(Clone, Debug)]
pub struct Setup {
    /// Connections (both ends in this process).
    pub conns: usize,
    /// Threads the spin steps spread the connections over (one thread per comm at a time).
    pub threads: usize,
}

/// What the reference knows of one connection: the intents since it was (re)connected.
#[derive(Clone, Debug, Default)]
pub struct ConnRef {
    /// Open (connected, not closed or crashed).
    pub open: bool,
    /// Per tag, the capacities of the receive buffers wanted, in posting order.
    pub bufs: BTreeMap<i32, Vec<u32>>,
    /// Per tag, the sizes of the sends wanted, in order.
    pub sends: BTreeMap<i32, Vec<u32>>,
}

impl ConnRef {
    /// The capacity of the buffer the next send with `tag` will fill, if wanted already.
    fn next_send_cap(&self, tag: i32) -> Option<u32> {
        let k = self.sends.get(&tag).map_or(0, Vec::len);
        self.bufs.get(&tag).and_then(|b| b.get(k)).copied()
    }

    /// The size of the send that the `extra`-th next buffer with `tag` will receive, if wanted
    /// already.
    fn send_size_for_next_buf(&self, tag: i32, extra: usize) -> Option<u32> {
        let k = self.bufs.get(&tag).map_or(0, Vec::len) + extra;
        self.sends.get(&tag).and_then(|s| s.get(k)).copied()
    }
}

/// The reference state: the setup and each connection's intents.
#[derive(Clone, Debug)]
pub struct RefState {
    /// The sequence's shape.
    pub setup: Setup,
    /// Per connection.
    pub conns: Vec<ConnRef>,
}

/// The reference machine.
pub struct Contract;

/// Tags: mostly a few small ones (so sends and buffers meet, repeatedly within a group), now
/// and then -1 or `i32::MAX`.
fn tag() -> impl Strategy<Value = i32> {
    prop_oneof![12 => 0..3i32, 1 => Just(-1), 1 => Just(i32::MAX)]
}

/// Message sizes around the interesting points: empty, tiny, the eager limit (8 KiB), a
/// rendezvous size, the largest.
fn size() -> impl Strategy<Value = u32> {
    prop_oneof![
        2 => Just(0u32),
        3 => 1..=64u32,
        3 => 8190..=8194u32,
        2 => 0..=(64u32 << 10),
        1 => Just(MAX_SIZE),
    ]
}

/// A size at most `cap`, near its ends or the eager limit.
fn size_upto(cap: u32) -> BoxedStrategy<u32> {
    prop_oneof![
        2 => Just(cap),
        1 => Just(0u32),
        1 => Just(cap.saturating_sub(1)),
        1 => Just(8192u32.min(cap)),
        1 => Just(8193u32.min(cap)),
        3 => 0..=cap,
    ]
    .boxed()
}

/// Receive buffer capacities (never 0: NCCL's receives are never empty).
fn cap() -> impl Strategy<Value = u32> {
    prop_oneof![
        3 => 1..=64u32,
        2 => Just(8192u32),
        2 => 8193..=9000u32,
        2 => Just(64u32 << 10),
        1 => Just(MAX_SIZE),
    ]
}

fn side() -> impl Strategy<Value = Side> {
    prop_oneof![Just(Side::Send), Just(Side::Recv)]
}

fn irecv(state: &RefState, conn: usize) -> BoxedStrategy<Step> {
    let c = state.conns[conn].clone();
    prop_oneof![6 => 1..=2usize, 2 => 3..=MAX_RECVS]
        .prop_flat_map(|n| proptest::collection::vec((tag(), cap()), n))
        .prop_map(move |mut bufs| {
            // A buffer at least as large as the send that will fill it, if wanted already.
            let mut seen: BTreeMap<i32, usize> = BTreeMap::new();
            for (t, cap) in bufs.iter_mut() {
                let extra = seen.entry(*t).or_default();
                if let Some(s) = c.send_size_for_next_buf(*t, *extra) {
                    *cap = (*cap).max(s).max(1);
                }
                *extra += 1;
            }
            Step::Irecv { conn, bufs }
        })
        .boxed()
}

fn isend(state: &RefState, conn: usize) -> BoxedStrategy<Step> {
    let c = state.conns[conn].clone();
    tag()
        .prop_flat_map(move |t| {
            let sizes = match c.next_send_cap(t) {
                Some(cap) => size_upto(cap),
                None => size().boxed(),
            };
            (Just(t), sizes)
        })
        .prop_map(move |(tag, size)| Step::Isend { conn, tag, size })
        .boxed()
}

impl ReferenceStateMachine for Contract {
    type State = RefState;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<RefState> {
        (1..=MAX_CONNS, 1..=MAX_THREADS)
            .prop_map(|(conns, threads)| RefState {
                setup: Setup { conns, threads },
                conns: vec![
                    ConnRef {
                        open: true,
                        ..ConnRef::default()
                    };
                    conns
                ],
            })
            .boxed()
    }

    fn transitions(state: &RefState) -> BoxedStrategy<Step> {
        let p = profile();
        let open: Vec<usize> = (0..state.conns.len())
            .filter(|&i| state.conns[i].open)
            .collect();
        let closed: Vec<usize> = (0..state.conns.len())
            .filter(|&i| !state.conns[i].open)
            .collect();
        let idle = (0..=5u32).prop_map(|ms| Step::Idle { ms }).boxed();
        if open.is_empty() {
            let reconnect = proptest::sample::select(closed)
                .prop_map(|conn| Step::Reconnect { conn })
                .boxed();
            return prop_oneof![4 => reconnect, 1 => idle].boxed();
        }
        let conn = proptest::sample::select(open);
        let st = state.clone();
        let irecvs = conn.clone().prop_flat_map(move |c| irecv(&st, c)).boxed();
        let st = state.clone();
        let isends = conn.clone().prop_flat_map(move |c| isend(&st, c)).boxed();
        let retry_send = (conn.clone(), any::<usize>())
            .prop_map(|(conn, pick)| Step::RetrySend { conn, pick })
            .boxed();
        let retry_recv = conn
            .clone()
            .prop_map(|conn| Step::RetryRecv { conn })
            .boxed();
        let test = (conn.clone(), side(), any::<usize>())
            .prop_map(|(conn, side, pick)| Step::Test { conn, side, pick })
            .boxed();
        let send_only = (1..=200u32)
            .prop_map(|rounds| Step::SendOnly { rounds })
            .boxed();
        let recv_only = (1..=200u32)
            .prop_map(|rounds| Step::RecvOnly { rounds })
            .boxed();
        let pump = (1..=50u32).prop_map(|rounds| Step::Pump { rounds }).boxed();
        let reg = (conn.clone(), side())
            .prop_map(|(conn, side)| Step::RegMr { conn, side })
            .boxed();
        let dereg = (conn.clone(), side())
            .prop_map(|(conn, side)| Step::DeregMr { conn, side })
            .boxed();
        let close = (conn.clone(), side(), any::<bool>())
            .prop_map(|(conn, first, abort)| Step::Close { conn, first, abort })
            .boxed();
        let reconnect = if closed.is_empty() {
            idle.clone()
        } else {
            proptest::sample::select(closed)
                .prop_map(|conn| Step::Reconnect { conn })
                .boxed()
        };
        let crash = (conn.clone(), side(), any::<u64>())
            .prop_map(|(conn, side, seed)| Step::Crash { conn, side, seed })
            .boxed();
        let close_one = (conn, side(), any::<u64>())
            .prop_map(|(conn, side, seed)| Step::CloseOne { conn, side, seed })
            .boxed();
        let mut options = vec![
            (10, irecvs),
            (10, isends),
            (6, retry_send),
            (3, retry_recv),
            (6, test),
            (3, send_only),
            (2, recv_only),
            (2, pump),
            (1, idle),
            (1, reg),
            (1, dereg),
            (1, close),
            (2, reconnect),
        ];
        if p.death {
            options.push((2, crash));
            options.push((2, close_one));
        }
        proptest::strategy::Union::new_weighted(options).boxed()
    }

    fn preconditions(state: &RefState, step: &Step) -> bool {
        let open = |c: usize| state.conns.get(c).is_some_and(|c| c.open);
        match step {
            Step::Irecv { conn, bufs } => {
                if !open(*conn) || bufs.is_empty() || bufs.len() > MAX_RECVS {
                    return false;
                }
                let c = &state.conns[*conn];
                let mut seen: BTreeMap<i32, usize> = BTreeMap::new();
                bufs.iter().all(|(t, cap)| {
                    let extra = seen.entry(*t).or_default();
                    let ok = c
                        .send_size_for_next_buf(*t, *extra)
                        .is_none_or(|s| s <= *cap);
                    *extra += 1;
                    ok && *cap >= 1
                })
            }
            Step::Isend { conn, tag, size } => {
                open(*conn)
                    && state.conns[*conn]
                        .next_send_cap(*tag)
                        .is_none_or(|cap| *size <= cap)
            }
            Step::RetrySend { conn, .. }
            | Step::RetryRecv { conn }
            | Step::Test { conn, .. }
            | Step::RegMr { conn, .. }
            | Step::DeregMr { conn, .. }
            | Step::Close { conn, .. } => open(*conn),
            Step::Crash { conn, .. } | Step::CloseOne { conn, .. } => {
                profile().death && open(*conn)
            }
            Step::Reconnect { conn } => *conn < state.conns.len() && !open(*conn),
            Step::SendOnly { .. }
            | Step::RecvOnly { .. }
            | Step::Pump { .. }
            | Step::Idle { .. } => true,
        }
    }

    fn apply(mut state: RefState, step: &Step) -> RefState {
        match step {
            Step::Irecv { conn, bufs } => {
                let c = &mut state.conns[*conn];
                for (t, cap) in bufs {
                    c.bufs.entry(*t).or_default().push(*cap);
                }
            }
            Step::Isend { conn, tag, size } => {
                state.conns[*conn]
                    .sends
                    .entry(*tag)
                    .or_default()
                    .push(*size);
            }
            Step::Close { conn, .. } | Step::Crash { conn, .. } | Step::CloseOne { conn, .. } => {
                state.conns[*conn] = ConnRef::default();
            }
            Step::Reconnect { conn } => {
                state.conns[*conn] = ConnRef {
                    open: true,
                    ..ConnRef::default()
                };
            }
            _ => {}
        }
        state
    }
}
