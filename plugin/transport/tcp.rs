//! The tcp transport: verbs semantics over a TCP stream, for hosts without RDMA.
use std::sync::Arc;

/// Opens the tcp device.
pub fn open_devices(_cfg: &crate::config::Config) -> Vec<Arc<dyn super::Device>> {
    Vec::new()
}
