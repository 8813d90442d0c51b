//! The shared bounce pool: registered bounce buffers that the receive comms of one device draw
//! from when their receive queue grows, and give back when it shrinks.
//!
//! Each receive comm owns `VERBSNET_RQ_MIN_DEPTH` bounce buffers of its own (an idle connection
//! pins only those and its rings); every buffer above that comes from the pool of its device
//! (and buffer size), which registers memory in slabs of [`SLAB_BUFS`] buffers as it is needed,
//! up to `VERBSNET_RQ_POOL_SIZE` bytes, and keeps what it registered for reuse. So the memory a
//! process pins for receive queues is bounded by `connections × min footprint + pool size`,
//! whatever the traffic. The decisions (when to grow or shrink) are the engine's
//! ([`crate::engine::RecvEngine`]); this module only hands out and takes back buffers.

use std::sync::{Arc, Mutex, RwLock, Weak};

use super::mr::Mr;
use super::Error;
use crate::transport::Device;

/// Bounce buffers registered at once when the pool grows (one `reg_mr` per slab).
pub const SLAB_BUFS: usize = 16;

/// The pool of one device and one buffer size.
pub struct BouncePool {
    dev: Arc<dyn Device>,
    stride: usize,
    cap_bytes: u64,
    /// Registered slabs; only ever appended to, read on every eager arrival in a pool buffer.
    slabs: RwLock<Vec<Arc<Mr>>>,
    /// Free buffers (addr, lkey).
    free: Mutex<Vec<(u64, u32)>>,
}

/// Pools by (device, buffer size), so comms of one device with one config share one.
static POOLS: Mutex<Vec<Weak<BouncePool>>> = Mutex::new(Vec::new());

impl BouncePool {
    /// The pool of `dev` for buffers of `stride` bytes, created on first use with a cap of
    /// `cap_bytes` (the first comm's `VERBSNET_RQ_POOL_SIZE`; the config is process-wide).
    pub fn for_device(dev: &Arc<dyn Device>, stride: usize, cap_bytes: u64) -> Arc<BouncePool> {
        let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
        pools.retain(|w| w.strong_count() > 0);
        for w in pools.iter() {
            if let Some(p) = w.upgrade() {
                if Arc::ptr_eq(&p.dev, dev) && p.stride == stride {
                    return p;
                }
            }
        }
        let p = Arc::new(BouncePool {
            dev: dev.clone(),
            stride,
            cap_bytes,
            slabs: RwLock::new(Vec::new()),
            free: Mutex::new(Vec::new()),
        });
        pools.push(Arc::downgrade(&p));
        p
    }

    /// Up to `k` free buffers (fewer when the pool is at its cap, or registration fails: the
    /// failure is returned only when nothing could be given).
    ///
    /// # Errors
    /// Registering a new slab failed and no buffer was free.
    pub fn take(&self, k: usize) -> Result<Vec<(u64, u32)>, Error> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while free.len() < k {
            let registered = self.slabs.read().unwrap_or_else(|e| e.into_inner()).len();
            let next = ((registered + 1) * SLAB_BUFS * self.stride) as u64;
            if next > self.cap_bytes {
                break;
            }
            match Mr::alloc(&*self.dev, SLAB_BUFS * self.stride) {
                Ok(slab) => {
                    let (base, lkey) = slab.at();
                    free.extend(
                        (0..SLAB_BUFS as u64)
                            .rev()
                            .map(|i| (base + i * self.stride as u64, lkey)),
                    );
                    self.slabs
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Arc::new(slab));
                }
                Err(e) if free.is_empty() => return Err(e),
                Err(_) => break,
            }
        }
        let n = free.len().min(k);
        let at = free.len() - n;
        Ok(free.split_off(at))
    }

    /// Gives buffers back.
    pub fn give(&self, bufs: &[(u64, u32)]) {
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(bufs);
    }

    /// The slab holding `[addr, addr + len)`.
    pub(crate) fn slab(&self, addr: u64, len: u64) -> Option<Arc<Mr>> {
        self.slabs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|s| s.region.contains(addr, len))
            .cloned()
    }

    /// Bytes registered by the pool so far.
    pub fn registered_bytes(&self) -> u64 {
        (self.slabs.read().unwrap_or_else(|e| e.into_inner()).len() * SLAB_BUFS * self.stride)
            as u64
    }
}
