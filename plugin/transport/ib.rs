//! The ib transport: RC queue pairs over libibverbs, resolved at run time.
use std::sync::Arc;

/// Opens every active verbs port.
pub fn open_devices(
    _cfg: &crate::config::Config,
) -> Result<Vec<Arc<dyn super::Device>>, super::TransportError> {
    Ok(Vec::new())
}
