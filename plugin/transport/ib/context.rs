//! The verbs objects a device and its queue pairs share: the open device context, the
//! protection domain, and what a QP needs to know about its port. Both `device` (discovery, MRs)
//! and `qp` use them; neither imports the other's internals for them, so the two stay one-way
//! (`device` creates `qp`s, `qp` knows nothing of `device`).
//!
//! Ownership encodes the verbs teardown order: a memory region and a queue pair hold an
//! `Arc<ProtectionDomain>`, which holds an `Arc<Context>`; so MRs and QPs go before the PD, and
//! the PD before the device context, whatever order the caller drops things in.

use std::sync::Arc;

use rdma_sys::{ibv_context, ibv_pd};
use tracing::warn;

use super::dl::Verbs;

/// `ibv_port_attr::link_layer` values (`IBV_LINK_LAYER_*` in verbs.h).
pub(crate) const LINK_LAYER_UNSPECIFIED: u8 = 0;
/// InfiniBand.
pub(crate) const LINK_LAYER_INFINIBAND: u8 = 1;
/// Ethernet (RoCE).
pub(crate) const LINK_LAYER_ETHERNET: u8 = 2;

/// An open device context (`ibv_open_device`); closed on drop.
pub(crate) struct Context {
    pub(crate) verbs: &'static Verbs,
    pub(crate) ctx: *mut ibv_context,
    pub(crate) name: String,
}

// SAFETY: libibverbs contexts may be used from any thread; all verbs on one context are
// thread-safe (verbs.h contract; every provider serialises internally where needed).
unsafe impl Send for Context {}
// SAFETY: as above; we only pass the pointer to verbs.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: ctx came from ibv_open_device and every object created on it (PD, CQs, QPs,
        // MRs) holds an Arc<Context> through the PD, so all of them are already destroyed.
        let rc = unsafe { (self.verbs.close_device)(self.ctx) };
        if rc != 0 {
            warn!(dev = %self.name, rc, "ibv_close_device failed");
        }
    }
}

/// A protection domain (`ibv_alloc_pd`); one per device, shared by its ports; freed on drop.
pub(crate) struct ProtectionDomain {
    pub(crate) ctx: Arc<Context>,
    pub(crate) pd: *mut ibv_pd,
}

// SAFETY: see Context; a PD is a plain handle for thread-safe verbs.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above.
unsafe impl Sync for ProtectionDomain {}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: pd came from ibv_alloc_pd; MRs and QPs on it hold an Arc to self, so none is
        // left.
        let rc = unsafe { (self.ctx.verbs.dealloc_pd)(self.pd) };
        if rc != 0 {
            warn!(dev = %self.ctx.name, rc, "ibv_dealloc_pd failed (an MR or QP still uses it?)");
        }
    }
}

/// What queue pairs need to know about their port.
#[derive(Debug)]
pub(crate) struct PortInfo {
    /// Device name, e.g. `rxe0`.
    pub(crate) dev: String,
    /// Port number (1-based).
    pub(crate) port: u8,
    /// `LINK_LAYER_INFINIBAND` or `LINK_LAYER_ETHERNET`.
    pub(crate) link_layer: u8,
    /// GID index used as `sgid_index`.
    pub(crate) gid_index: u8,
    /// That GID (network order).
    pub(crate) gid: [u8; 16],
    /// Port LID (IB only; 0 on RoCE).
    pub(crate) lid: u16,
    /// Active MTU as an `ibv_mtu` code.
    pub(crate) active_mtu: u32,
    /// Device limit on CQ entries.
    pub(crate) max_cqe: u32,
    /// Device limit on WRs per queue.
    pub(crate) max_qp_wr: u32,
    /// Device limit on SGEs per WR.
    pub(crate) max_sge: u32,
}

impl PortInfo {
    /// `rxe0:1`.
    pub(crate) fn label(&self) -> String {
        format!("{}:{}", self.dev, self.port)
    }
}
