//! What the plugin-level integration tests (`scenarios.rs`, `hostile.rs`) share: the transport
//! a suite runs on (`VERBSNET_TEST_TRANSPORT`: `tcp`, the default, on the host; `ib` on rxe0 in
//! the soft-RoCE VM), the device or a `SKIP` line, one process-wide lock, and WARN lines as
//! NCCL users see them.
//!
//! Each test binary compiles its own copy (`mod common;`), and not every binary uses every
//! helper.
#![allow(dead_code)]

use std::sync::{Arc, Mutex, MutexGuard};

use nccl_net_verbsnet::config::{Config, TransportChoice};
use nccl_net_verbsnet::testkit::open_device;
use nccl_net_verbsnet::transport::{Device, Kind};

static SERIAL: Mutex<()> = Mutex::new(());

/// One test at a time: the device RNR counters are device-wide, fds and timings are measured
/// per process, and the latency bounds should not measure the other tests.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// True when the suite runs on ib (`VERBSNET_TEST_TRANSPORT=ib`).
pub fn is_ib() -> bool {
    std::env::var("VERBSNET_TEST_TRANSPORT").as_deref() == Ok("ib")
}

/// Defaults, with the transport the suite runs on.
pub fn base_cfg() -> Config {
    Config {
        transport: if is_ib() {
            TransportChoice::Ib
        } else {
            TransportChoice::Tcp
        },
        ..Config::default()
    }
}

/// The suite's device, or `None` after a `SKIP <test>: <why>` line (no verbs device here).
pub fn device(test: &str) -> Option<(Arc<dyn Device>, Kind)> {
    match open_device(&base_cfg()) {
        Ok(d) => Some(d),
        Err(e) => {
            println!("SKIP {test}: {e}");
            None
        }
    }
}

/// A subscriber keeping every WARN line as the NCCL logger bridge prints it (the comm's span
/// label first, then the message and fields: `verbsnet::log::text_layer`).
pub fn warn_capture(warns: &Arc<Mutex<Vec<String>>>) -> impl tracing::Subscriber {
    use tracing_subscriber::layer::SubscriberExt as _;
    let warns = warns.clone();
    tracing_subscriber::registry().with(nccl_net_verbsnet::log::text_layer(
        nccl_net_verbsnet::log::DebugLevel::Warn,
        move |level, text| {
            if level == tracing::Level::WARN {
                warns.lock().unwrap().push(text.to_string());
            }
        },
    ))
}

/// Captures this thread's WARN lines (as [`warn_capture`]) until the guard drops.
pub fn capture() -> (Arc<Mutex<Vec<String>>>, tracing::subscriber::DefaultGuard) {
    let warns = Arc::new(Mutex::new(Vec::new()));
    let guard = tracing::subscriber::set_default(warn_capture(&warns));
    // A callsite another thread (with no subscriber) hit first may have cached "never" while
    // this was the only dispatch (tokio-rs/tracing#3611): re-evaluate under this default.
    tracing::callsite::rebuild_interest_cache();
    (warns, guard)
}

/// Counter `name` of a comm (`Comm::counters`), panicking when it has none.
pub fn counter<R: nccl_net_verbsnet::comm::Role>(
    c: &nccl_net_verbsnet::comm::Comm<R>,
    name: &str,
) -> u64 {
    c.counters()
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no counter {name}"))
}

/// The plugin driven through its exported `ncclNetPlugin_v12` table (explorer, liveness).
pub mod table;
