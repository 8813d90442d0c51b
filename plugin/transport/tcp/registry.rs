//! The device-wide memory registry: key → registered [`Region`].
//!
//! One key serves as both lkey and rkey. Keys are random (a peer cannot guess the key of a
//! region from one it was given), never 0, never one in use, and never one of the last
//! [`RECENT_KEYS`] freed, so a stale rkey is refused rather than silently landing in a newer
//! region.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::mem::Region;
use crate::transport::{MemoryRegion, MrKeys, Result, TransportError};

/// Regions registered on one device; shared by the device, its QPs and its MR handles.
pub(super) struct Registry {
    inner: RwLock<Inner>,
}

struct Inner {
    /// State of the key generator (xorshift64*, seeded at random per device).
    rng: u64,
    regions: HashMap<u32, Region>,
    /// The most recently freed keys, oldest first (not handed out again while listed).
    recent: VecDeque<u32>,
    recent_set: HashSet<u32>,
}

impl Inner {
    fn next_random(&mut self) -> u32 {
        // xorshift64* (Vigna): fast and well spread; not for cryptography, which an rkey on a
        // loopback stand-in does not need, but no longer guessable from a neighbour's key.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }
}

impl Registry {
    /// An empty registry whose keys are drawn from a generator seeded with `seed`.
    pub(super) fn new(seed: u64) -> Registry {
        Registry {
            inner: RwLock::new(Inner {
                rng: seed | 1,
                regions: HashMap::new(),
                recent: VecDeque::new(),
                recent_set: HashSet::new(),
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
        let key = loop {
            let k = inner.next_random();
            if k != 0 && !inner.regions.contains_key(&k) && !inner.recent_set.contains(&k) {
                break k;
            }
        };
        inner.regions.insert(key, region);
        Ok(key)
    }

    /// Deregisters `key` (no-op when absent).
    pub(super) fn remove(&self, key: u32) {
        let mut inner = self.write();
        if inner.regions.remove(&key).is_some() {
            inner.recent.push_back(key);
            inner.recent_set.insert(key);
            if inner.recent.len() > RECENT_KEYS {
                if let Some(old) = inner.recent.pop_front() {
                    inner.recent_set.remove(&old);
                }
            }
        }
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

    /// Like [`Registry::while_registered`] for several keys at once (one lock): `f` runs only
    /// while every key in `keys` stays registered; `None` when one is not.
    pub(super) fn while_all_registered<R>(&self, keys: &[u32], f: impl FnOnce() -> R) -> Option<R> {
        let inner = self.read();
        if !keys.iter().all(|k| inner.regions.contains_key(k)) {
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

/// Freed keys kept out of reuse (a stale rkey then fails instead of landing in a new region).
pub(super) const RECENT_KEYS: usize = 65_536;

/// Most regions registered on one device at a time (a verbs device's `max_mr` analogue).
const MAX_REGIONS: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unpredictable_and_freed_keys_are_not_reused_soon() {
        let r = Registry::new(0x1234_5678_9abc_def1);
        let keys: Vec<u32> = (0..1000)
            .map(|_| r.insert(Region::alloc(8)).unwrap())
            .collect();
        assert!(keys.iter().all(|&k| k != 0));
        let unique: HashSet<u32> = keys.iter().copied().collect();
        assert_eq!(unique.len(), keys.len());
        // Sequential keys would give 999 neighbours one apart; random ones about none.
        let close = keys
            .windows(2)
            .filter(|w| w[1].wrapping_sub(w[0]) < 1 << 16)
            .count();
        assert!(
            close < 5,
            "{close} of 999 consecutive keys within 65536 of each other"
        );
        // Both halves of the key space are used.
        assert!(keys.iter().any(|&k| k >= 1 << 31) && keys.iter().any(|&k| k < 1 << 31));
        for &k in &keys {
            r.remove(k);
        }
        let again: HashSet<u32> = (0..1000)
            .map(|_| r.insert(Region::alloc(8)).unwrap())
            .collect();
        assert!(again.is_disjoint(&unique));
        assert!(r.resolve(keys[0], 0, 0).is_none());
    }
}
