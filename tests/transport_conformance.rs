//! The transport conformance suite (`plugin/transport/conformance.rs`): the same verbs-behaviour
//! tests against each transport, through the `Device`/`QueuePair`/`MemoryRegion` traits only.
//!
//! - `tcp::*` runs on every host.
//! - `ib::*` runs against `VERBSNET_TEST_IB_HCA` (default `rxe0`): in CI inside the soft-RoCE
//!   VM (`testharness/softroce/vm-suite.sh`, step `conformance`, one test at a time because
//!   the RNR counts come from device-wide counters). On a host without that verbs device each
//!   test prints a `SKIP` line and passes.
//!
//! Against one transport only: `cargo test --release --test transport_conformance -- ib::`
//! (or `tcp::`). A new transport adds a constructor next to `conformance::tcp` and a module
//! here.

mod tcp {
    nccl_net_verbsnet::transport_conformance!(|_| Some(
        nccl_net_verbsnet::transport::conformance::tcp()
    ));
}

mod ib {
    nccl_net_verbsnet::transport_conformance!(nccl_net_verbsnet::transport::conformance::ib);
}
