//! The device-wide memory registry: key → registered [`Region`].
//!
//! One key serves as both lkey and rkey. Keys are handed out sequentially from a random start,
//! skipping 0 and keys in use, so a key freed by deregistration is not reused until the 32-bit
//! space wraps: a stale rkey is refused rather than silently landing in a newer region.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::ffi::mem::Region;
use crate::transport::{MemoryRegion, MrKeys, Result, TransportError};

/// Regions registered on one device; shared by the device, its QPs and its MR handles.
pub(super) struct Registry {
    inner: RwLock<Inner>,
}

struct Inner {
    next_key: u32,
    regions: HashMap<u32, Region>,
}

impl Registry {
    /// An empty registry whose first key is derived from `seed`.
    pub(super) fn new(seed: u32) -> Registry {
        Registry {
            inner: RwLock::new(Inner {
                next_key: seed.max(1),
                regions: HashMap::new(),
            }),
        }
    }

    /// Registers `region` and returns its key.
    pub(super) fn insert(&self, region: Region) -> Result<u32> {
        let mut inner = self.write();
        if inner.regions.len() >= MAX_REGIONS {
            return Err(TransportError::Resource(format!(
                "tcp reg_mr: {MAX_REGIONS} regions are registered on this device (its limit)"
            )));
        }
        let mut key = inner.next_key;
        while key == 0 || inner.regions.contains_key(&key) {
            key = key.wrapping_add(1);
        }
        inner.next_key = key.wrapping_add(1);
        inner.regions.insert(key, region);
        Ok(key)
    }

    /// Deregisters `key` (no-op when absent).
    pub(super) fn remove(&self, key: u32) {
        self.write().regions.remove(&key);
    }

    /// The registered memory `[addr, addr + len)` under `key`, as a region of exactly `len`
    /// bytes; `None` when the key is unknown or the range is not inside its region.
    pub(super) fn resolve(&self, key: u32, addr: u64, len: u32) -> Option<Region> {
        let inner = self.read();
        let region = inner.regions.get(&key)?;
        if !region.contains(addr, u64::from(len)) {
            return None;
        }
        let offset = usize::try_from(addr - region.addr()).ok()?;
        region.slice(offset, usize::try_from(len).ok()?).ok()
    }

    /// Runs `f` while `key` stays registered: deregistration waits until `f` returns, so
    /// memory is only touched while registered. `None` (and `f` not run) when `key` is not
    /// registered. `f` must not call into the registry.
    pub(super) fn while_registered<R>(&self, key: u32, f: impl FnOnce() -> R) -> Option<R> {
        let inner = self.read();
        if !inner.regions.contains_key(&key) {
            return None;
        }
        Some(f())
    }

    /// Registered regions (tests).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.read().regions.len()
    }

    // A panic while the lock is held cannot leave the map half-updated (each operation is one
    // HashMap call), so a poisoned lock is still consistent and is used as is.
    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// A registration handle: deregisters its region when dropped.
pub(super) struct TcpMr {
    key: u32,
    registry: Arc<Registry>,
}

impl TcpMr {
    /// Registers `region` in `registry`.
    pub(super) fn register(registry: &Arc<Registry>, region: Region) -> Result<TcpMr> {
        let key = registry.insert(region)?;
        Ok(TcpMr {
            key,
            registry: Arc::clone(registry),
        })
    }
}

impl MemoryRegion for TcpMr {
    fn keys(&self) -> MrKeys {
        MrKeys {
            lkey: self.key,
            rkey: self.key,
        }
    }
}

impl Drop for TcpMr {
    fn drop(&mut self) {
        self.registry.remove(self.key);
    }
}

/// Most regions registered on one device at a time (a verbs device's `max_mr` analogue).
const MAX_REGIONS: usize = 1 << 20;
