//! The verbs objects a device and its queue pairs share: the open device context, the
//! protection domain, and what a QP needs to know about its port. Both `device` (discovery, MRs)
//! and `qp` use them; neither imports the other's internals for them, so the two stay one-way
//! (`device` creates `qp`s, `qp` knows nothing of `device`).
//!
//! Ownership encodes the verbs teardown order: a memory region and a queue pair hold an
//! `Arc<ProtectionDomain>`, which holds an `Arc<Context>`; so MRs and QPs go before the PD, and
//! the PD before the device context, whatever order the caller drops things in.

use std::sync::Arc;

use rdma_sys::{ibv_context, ibv_pd, ibv_port_attr, verbs_context};
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

/// `struct ibv_port_attr` as rdma-core 49+ lays it out: the struct rdma-sys binds (generated
/// from the build host's rdma-core, 44 on Debian 12) followed by `active_speed_ex`, the only
/// field newer libraries append (NCCL's own copy of the struct, `src/include/ibvcore.h`, has
/// the same layout). Filled by [`query_port`].
#[repr(C)]
pub(crate) struct PortAttr {
    /// Everything up to `port_cap_flags2`.
    pub(crate) attr: ibv_port_attr,
    /// The active speed when it does not fit the 8-bit `active_speed` (`IBV_SPEED_XDR` =
    /// 0x100 and newer); 0 when the library or the kernel does not report it.
    pub(crate) active_speed_ex: u32,
}

/// `ibv_query_port` as NCCL IB calls it (`wrap_ibv_query_port`, `src/misc/ibvwrap.cc`, NCCL
/// 2.30.7): through the library's extended `query_port` op with the size of [`PortAttr`], so
/// that a library that knows `active_speed_ex` fills it; the op zeroes the whole struct first
/// and a library that does not know the field leaves it 0 (rdma-core `__lib_query_port`:
/// `memset(port_attr, 0, port_attr_len)`, then the provider fills its own prefix). Where the
/// context has no extended ops (a pre-2017 provider), the exported `ibv_query_port`, which
/// fills the legacy prefix only. `Err` is the verbs return code.
pub(crate) fn query_port(ctx: &Context, port: u8) -> Result<PortAttr, i32> {
    // SAFETY: PortAttr is plain data; all-zero is a valid value.
    let mut pa: PortAttr = unsafe { std::mem::zeroed() };
    let rc = match extended_query_port(ctx.ctx) {
        // SAFETY: the op belongs to this open context; pa is a writable buffer of exactly the
        // size passed, which the library zeroes and fills up to what it knows.
        Some(op) => unsafe {
            op(
                ctx.ctx,
                port,
                (&mut pa as *mut PortAttr).cast::<ibv_port_attr>(),
                std::mem::size_of::<PortAttr>(),
            )
        },
        // SAFETY: ctx is open; the exported symbol fills at most the legacy prefix of the
        // full-size, zeroed struct.
        None => unsafe { (ctx.verbs.query_port)(ctx.ctx, port, &mut pa.attr) },
    };
    if rc == 0 {
        Ok(pa)
    } else {
        Err(rc)
    }
}

/// The library's extended `query_port(context, port, attr, attr_len)` op of an open context,
/// found as verbs.h's `verbs_get_ctx_op(context, query_port)` finds it: the context is
/// extended when `abi_compat` is `UINTPTR_MAX`, and then sits at the end of a `verbs_context`
/// whose `sz` (right before it) says how far back the library's struct reaches; the op is
/// there when that covers it and it is set. `verbs_context` grows towards lower addresses, so
/// a field's distance from the end is the same in every rdma-core version.
fn extended_query_port(
    ctx: *mut ibv_context,
) -> Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> i32> {
    // SAFETY: ctx is an open context (the caller's); abi_compat is one of its fields.
    if unsafe { (*ctx).abi_compat } as usize != usize::MAX {
        return None;
    }
    let end = std::mem::offset_of!(verbs_context, context);
    // SAFETY: an extended context is the last field of the library's verbs_context, so the
    // bytes `end` before it up to it belong to one verbs_context allocation as far back as
    // `sz` (immediately before `context`, present in every version) says; `sz` is read first
    // and the op only when `sz` covers it.
    unsafe {
        let vctx = ctx.cast::<u8>().sub(end).cast::<verbs_context>();
        let reach =
            std::mem::size_of::<verbs_context>() - std::mem::offset_of!(verbs_context, query_port);
        if std::ptr::addr_of!((*vctx).sz).read() < reach {
            return None;
        }
        std::ptr::addr_of!((*vctx).query_port).read()
    }
}

/// `ibv_query_port_speed` where the library has it (rdma-core 62+) and the provider answers:
/// the port's effective bandwidth in units of 100 Mb/s (NCCL IB's first choice,
/// `net_ib/init.cc`).
pub(crate) fn query_port_speed(ctx: &Context, port: u8) -> Option<u64> {
    let f = ctx.verbs.query_port_speed?;
    let mut speed = 0u64;
    // SAFETY: ctx is open; speed is a valid out-pointer for the call.
    let rc = unsafe { f(ctx.ctx, u32::from(port), &mut speed) };
    (rc == 0).then_some(speed)
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
    /// Device limit on QPs (`ibv_device_attr::max_qp`).
    pub(crate) max_qp: u32,
    /// Device limit on CQs.
    pub(crate) max_cq: u32,
}

impl PortInfo {
    /// `rxe0:1`.
    pub(crate) fn label(&self) -> String {
        format!("{}:{}", self.dev, self.port)
    }
}
