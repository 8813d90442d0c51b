//! The contract explorer (issue 19): a model-based, seeded, randomized caller of the plugin's
//! `ncclNetPlugin_v12` table that makes only the calls NCCL's ext-net contract allows, in any
//! order NCCL could make them, and checks every answer against a reference model.
//!
//! What it draws ([`model`]): 1–4 connections (both ends in this process) spread over 1–4
//! threads; `irecv` of 1–8 buffers with any tags (repeated ones too) and capacities; `isend`
//! of any size up to its buffer (0 bytes included) retried after "retry later"; `test` of any
//! outstanding request at any time, or of none for a long while; steps that call only the send
//! comms, or only the receive comms, for a long while; `regMr`/`deregMr`; up to 32 outstanding
//! receives per comm (256 sends); close after completion, or with requests in flight (an
//! abort); reconnects; and, in the death profile, a peer that dies or closes at any point.
//!
//! What it checks ([`sut`], whose docs define the model, the liveness obligations L0–L3 and
//! their bound, and the death rule): every byte and size of every message; that no call
//! returns an error; liveness; and after a peer's death or close, that the survivor's calls
//! fail with `ncclRemoteError` within the bound. Every sequence ends by draining, closing and
//! finalizing, and the descriptors it opened must all be closed again.
//!
//! Why proptest with `proptest-state-machine`: it generates each step from the reference
//! state (so only legal calls are drawn), and on a failure shrinks the sequence (deleting and
//! simplifying steps while the preconditions hold) and reports the smallest one still failing;
//! both are well kept, and `proptest` is the project's chosen property-testing library. The
//! transitions are intents, not calls ([`model`] docs), so any shorter sequence stays legal.
//!
//! Knobs: `VERBSNET_EXPLORER_SEED` (the fixed seed; CI uses the default),
//! `VERBSNET_EXPLORER_CASES` (sequences), `VERBSNET_EXPLORER_STEPS` (most steps per sequence),
//! `VERBSNET_EXPLORER_BOUND_MS` / `_BOUND_CALLS` (liveness bound), `VERBSNET_EXPLORER_DEATH_MS`
//! (death bound), `VERBSNET_EXPLORER_DRAIN_MS` (a drain without progress),
//! `VERBSNET_EXPLORER_CHECK` (which liveness obligations to enforce, e.g. `L1`; all by
//! default), `VERBSNET_EXPLORER_SHRINK_S` (longest shrinking), `VERBSNET_EXPLORER_VERBOSE`
//! (print every panic, also while shrinking). Transport from `VERBSNET_TEST_TRANSPORT` (`tcp` here, `ib` in the VM). The
//! plugin's knobs are its defaults except `VERBSNET_PEER_CHECK_INTERVAL=0.05` and
//! `VERBSNET_DEBUG=none` (the death profile would print a WARN per death); set them in the
//! environment to override.
//!
//! Each run prints `explorer[<profile>]: N sequences, M calls ...`; a failure prints the seed,
//! the shrunk sequence of steps and the calls of the failing connection.

mod common;
#[path = "explorer/model.rs"]
mod model;
#[path = "explorer/sut.rs"]
mod sut;

use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::test_runner::{Config, FileFailurePersistence, RngSeed, TestError, TestRunner};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};

use common::table;
use model::{Contract, Profile, RefState, Step, PROFILE};
use sut::{Bounds, Sut};

static SEQUENCES: AtomicU64 = AtomicU64::new(0);

struct Explorer;

fn profile() -> Profile {
    *PROFILE.lock().unwrap_or_else(|e| e.into_inner())
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name}={v}: not a number"))
        }
        Err(_) => default,
    }
}

/// The bounds of this transport (module docs of [`sut`]); rxe under QEMU is slow.
fn bounds() -> Bounds {
    let ib = common::is_ib();
    let ms = |name: &str, tcp: u64, ib_ms: u64| {
        Duration::from_millis(env_u64(name, if ib { ib_ms } else { tcp }))
    };
    Bounds {
        wall: ms("VERBSNET_EXPLORER_BOUND_MS", 2_000, 20_000),
        calls: env_u64("VERBSNET_EXPLORER_BOUND_CALLS", 10_000),
        drain: ms("VERBSNET_EXPLORER_DRAIN_MS", 20_000, 120_000),
        death: ms("VERBSNET_EXPLORER_DEATH_MS", 750, 5_000),
        enforce: match std::env::var("VERBSNET_EXPLORER_CHECK") {
            Ok(v) => {
                let mut e = [false; 4];
                for l in v.split(',').map(str::trim) {
                    match l {
                        "L0" => e[0] = true,
                        "L1" => e[1] = true,
                        "L2" => e[2] = true,
                        "L3" => e[3] = true,
                        _ => panic!("VERBSNET_EXPLORER_CHECK={v}: a list of L0, L1, L2, L3"),
                    }
                }
                e
            }
            Err(_) => [true; 4],
        },
    }
}

impl StateMachineTest for Explorer {
    type SystemUnderTest = Sut;
    type Reference = Contract;

    fn init_test(state: &RefState) -> Sut {
        SEQUENCES.fetch_add(1, Ordering::Relaxed);
        Sut::new(state, profile(), bounds())
    }

    fn apply(mut sut: Sut, _state: &RefState, step: Step) -> Sut {
        sut.apply(&step);
        sut
    }

    fn teardown(sut: Sut, _state: RefState) {
        sut.teardown();
    }
}

/// Runs the explorer with `profile`: `cases` sequences (unless `VERBSNET_EXPLORER_CASES_<NAME>`
/// (e.g. `..._DEATH`) or else `VERBSNET_EXPLORER_CASES` says otherwise) of up to 40 steps from
/// the fixed seed; on a failure, shrinks it and fails with the minimal sequence.
fn explore(name: &str, p: Profile, cases: u32) {
    explore_with(name, p, cases, ("1", "0"));
}

/// [`explore`] with `(qps, split)` as `VERBSNET_IB_QPS_PER_CONNECTION` and
/// `VERBSNET_IB_SPLIT_DATA_ON_QPS` for every connection of every sequence.
fn explore_with(name: &str, p: Profile, cases: u32, (qps, split): (&str, &str)) {
    let _g = common::serial();
    table::set_env(&[
        ("VERBSNET_PEER_CHECK_INTERVAL", "0.05"),
        ("VERBSNET_DEBUG", "none"),
    ]);
    // Each test its own (the tests of this binary run one at a time, under `serial`, and
    // `init` below reads the configuration afresh).
    std::env::set_var("VERBSNET_IB_QPS_PER_CONNECTION", qps);
    std::env::set_var("VERBSNET_IB_SPLIT_DATA_ON_QPS", split);
    *PROFILE.lock().unwrap_or_else(|e| e.into_inner()) = p;
    // One init/finalize first, so descriptors opened once per process (a verbs device's
    // first open) are not counted against the first sequence.
    let ctx = table::init(1).unwrap_or_else(|rc| panic!("init returned {rc:?}"));
    assert_eq!(table::finalize(ctx), table::OK);

    let seed = env_u64("VERBSNET_EXPLORER_SEED", 0x5eed_0019);
    let cases = env_u64("VERBSNET_EXPLORER_CASES", u64::from(cases));
    let cases = env_u64(
        &format!("VERBSNET_EXPLORER_CASES_{}", name.to_uppercase()),
        cases,
    ) as u32;
    let steps = env_u64("VERBSNET_EXPLORER_STEPS", 40).max(1) as usize;
    let config = Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        max_shrink_iters: 2048,
        max_shrink_time: env_u64("VERBSNET_EXPLORER_SHRINK_S", 600) as u32 * 1000,
        fork: false,
        timeout: 0,
        verbose: 0,
        ..Config::default()
    };
    let strategy = Contract::sequential_strategy(1..=steps);
    let mut runner = TestRunner::new(config.clone());
    let (seq0, calls0, start) = (
        SEQUENCES.load(Ordering::Relaxed),
        table::calls(),
        Instant::now(),
    );
    // Every failing run while shrinking panics; keep those messages out of the output (the
    // minimal one is printed below).
    let hook = std::panic::take_hook();
    if std::env::var_os("VERBSNET_EXPLORER_VERBOSE").is_none() {
        std::panic::set_hook(Box::new(|_| {}));
    }
    let result = runner.run(&strategy, |(state, steps, seen)| {
        Explorer::test_sequential(config.clone(), state, steps, seen);
        Ok(())
    });
    std::panic::set_hook(hook);
    let transport = if common::is_ib() { "ib" } else { "tcp" };
    // Straight to stderr, not through `eprintln!`: the test harness captures the macros'
    // output of passing tests, and CI's log should show how much was explored.
    let _ = writeln!(
        std::io::stderr(),
        "explorer[{name}]: {} sequences, {} calls in {:.1?} (seed {seed:#x}, {cases} cases, \
         transport {transport}, {qps} QP(s) per connection, split {split})",
        SEQUENCES.load(Ordering::Relaxed) - seq0,
        table::calls() - calls0,
        start.elapsed(),
    );
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, (state, steps, _))) => {
            let mut s = format!(
                "explorer[{name}] found a failing sequence (seed {seed:#x}; rerun with \
                 VERBSNET_EXPLORER_SEED={seed:#x}); shrunk to {} step(s) on {} connection(s), \
                 {} thread(s):\n",
                steps.len(),
                state.setup.conns,
                state.setup.threads
            );
            for (i, st) in steps.iter().enumerate() {
                s.push_str(&format!("  {:>2}. {st:?}\n", i + 1));
            }
            s.push_str(&format!("failure: {why}"));
            println!("{s}");
            panic!("{s}");
        }
        Err(e) => panic!("explorer[{name}]: {e}"),
    }
}

/// Sequences with one-sided spins, idling, closes and aborts, but no liveness obligation
/// enforced: every byte, size and result code, and everything completes once both ends are
/// called.
#[test]
fn explorer_data_sizes_and_results() {
    explore(
        "safety",
        Profile {
            liveness: false,
            death: false,
        },
        3000,
    );
}

/// The same sequences with the liveness obligations L0–L3 enforced in the one-sided spins.
/// On tcp, L2 and L3 (a send or receive completing with only its own end called) also need
/// the transport to make progress without the peer's calls (its "NIC" thread).
#[test]
fn explorer_liveness() {
    explore(
        "liveness",
        Profile {
            liveness: true,
            death: false,
        },
        500,
    );
}

/// Peers that die or close at random points: the survivor's calls fail with
/// `ncclRemoteError` within the bound.
#[test]
fn explorer_peer_death() {
    explore(
        "death",
        Profile {
            liveness: false,
            death: true,
        },
        60,
    );
}

/// The liveness sequences on connections of 3 QPs, round robin: a direct send goes whole on QP
/// `g % 3` (`g`: its receive buffer's global index), so most take a data QP, whose write may
/// reach the receiver after later sends' on QP 0; every WR is posted at `isend`, so a receive
/// whose sends started completes with only the receive comm called (L3; protocol.md, "Several
/// QPs per connection").
#[test]
fn explorer_liveness_three_qps_round_robin() {
    explore_with(
        "liveness_qps3",
        Profile {
            liveness: true,
            death: false,
        },
        300,
        ("3", "0"),
    );
}

/// The safety sequences on connections of 4 QPs with every direct send split over all of
/// them in 128-byte-aligned pieces (a zero-length WRITE WITH IMM on the QPs past its end).
#[test]
fn explorer_data_sizes_and_results_four_qps_split() {
    explore_with(
        "safety_qps4_split",
        Profile {
            liveness: false,
            death: false,
        },
        600,
        ("4", "1"),
    );
}
