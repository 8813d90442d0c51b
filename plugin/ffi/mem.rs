//! Raw memory regions: the one place where plugin code touches memory by address.
//!
//! NCCL hands the plugin raw pointers (`regMr(data, size)`, `isend(data, size)`); the tcp
//! transport writes incoming RDMA data into them and the receive path copies eager payloads out
//! of bounce buffers into them. Everything outside this module goes through [`Region`]'s
//! bounds-checked methods, so a hostile frame or a wrong size can at worst be refused, never
//! write outside a registered range.

use std::fmt;
use std::sync::Arc;

/// A byte range `[addr, addr + len)` that stays readable and writable while any clone of the
/// `Region` is in use: either memory NCCL registered (valid from `regMr` to `deregMr`: ext-net
/// README) or a buffer the plugin allocated and owns (kept alive by the `Region` itself).
#[derive(Clone)]
pub struct Region {
    addr: u64,
    len: usize,
    _owned: Option<Arc<OwnedBuf>>,
}

struct OwnedBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: OwnedBuf is a plain heap allocation with no thread affinity; concurrent access goes
// through Region's methods, which have the same (RDMA-style) aliasing rules as NIC DMA.
unsafe impl Send for OwnedBuf {}
// SAFETY: see above; shared references only expose the pointer value.
unsafe impl Sync for OwnedBuf {}

impl Drop for OwnedBuf {
    fn drop(&mut self) {
        // SAFETY: ptr was returned by alloc_zeroed with exactly this layout and is freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// An access outside a region's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfBounds {
    /// Offset asked for.
    pub offset: u64,
    /// Length asked for.
    pub len: u64,
    /// The region's length.
    pub region_len: u64,
}

impl fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "access of {} bytes at offset {} is outside a region of {} bytes",
            self.len, self.offset, self.region_len
        )
    }
}

impl std::error::Error for OutOfBounds {}

impl Region {
    /// Wraps memory the caller owns.
    ///
    /// # Safety
    /// `[addr, addr + len)` must be valid for reads and writes for as long as any clone of the
    /// returned region is used (for NCCL buffers: until `deregMr`, which drops every clone).
    pub unsafe fn from_raw(addr: u64, len: usize) -> Region {
        Region {
            addr,
            len,
            _owned: None,
        }
    }

    /// Allocates `len` zeroed bytes, 4096-aligned, owned by the region (bounce buffers, CTS
    /// rings, credit words). `len` 0 allocates one page. Aborts when memory is exhausted: use
    /// [`Region::try_alloc`] for sizes that come from the configuration.
    pub fn alloc(len: usize) -> Region {
        match Region::try_alloc(len) {
            Ok(r) => r,
            Err(_) => std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(len.max(1), 4096).expect("page layout"),
            ),
        }
    }

    /// Like [`Region::alloc`], but a failed allocation (or a size no layout can hold) is an
    /// error naming the size instead of an abort.
    pub fn try_alloc(len: usize) -> Result<Region, String> {
        let size = len
            .max(1)
            .checked_next_multiple_of(4096)
            .ok_or_else(|| format!("{len} bytes cannot be allocated"))?;
        let layout = std::alloc::Layout::from_size_align(size, 4096)
            .map_err(|e| format!("{len} bytes cannot be allocated: {e}"))?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(format!("allocating {size} bytes failed (out of memory)"));
        }
        Ok(Region {
            addr: ptr as u64,
            len,
            _owned: Some(Arc::new(OwnedBuf { ptr, layout })),
        })
    }

    /// Virtual address of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when `[addr, addr + len)` lies inside this region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr + self.len as u64)
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), OutOfBounds> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(OutOfBounds {
                offset: offset as u64,
                len: len as u64,
                region_len: self.len as u64,
            }),
        }
    }

    /// Runs `f` on the bytes `[offset, offset + len)` as a mutable slice.
    pub fn with_mut<R>(
        &self,
        offset: usize,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, OutOfBounds> {
        self.check(offset, len)?;
        if len == 0 {
            return Ok(f(&mut []));
        }
        // SAFETY: the range is inside the region (checked above), which is valid for writes by
        // the constructor's contract. Like a NIC's DMA, another party may write the same bytes;
        // the protocol (sequence words checked after the copy) tolerates that.
        let s = unsafe {
            std::slice::from_raw_parts_mut((self.addr as usize + offset) as *mut u8, len)
        };
        Ok(f(s))
    }

    /// Runs `f` on the bytes `[offset, offset + len)`.
    pub fn with<R>(
        &self,
        offset: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, OutOfBounds> {
        self.with_mut(offset, len, |s| f(s))
    }

    /// Copies `src` to `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), OutOfBounds> {
        self.with_mut(offset, src.len(), |d| d.copy_from_slice(src))
    }

    /// Copies `dst.len()` bytes from `offset` into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        let n = dst.len();
        self.with(offset, n, |s| dst.copy_from_slice(s))
    }

    /// Reads a little-endian u64 at `offset` with a volatile load (a NIC may write it at any
    /// time). `offset` must be 8-byte aligned relative to the region start.
    pub fn read_u64_volatile(&self, offset: usize) -> Result<u64, OutOfBounds> {
        self.check(offset, 8)?;
        let p = (self.addr as usize + offset) as *const u64;
        if p.align_offset(8) != 0 {
            return Err(OutOfBounds {
                offset: offset as u64,
                len: 8,
                region_len: self.len as u64,
            });
        }
        // SAFETY: in bounds and aligned (checked above); the memory is valid per the contract.
        Ok(u64::from_le(unsafe { std::ptr::read_volatile(p) }))
    }

    /// Copies `len` bytes from `src` at `src_off` to this region at `dst_off`.
    pub fn copy_from(
        &self,
        dst_off: usize,
        src: &Region,
        src_off: usize,
        len: usize,
    ) -> Result<(), OutOfBounds> {
        src.check(src_off, len)?;
        self.check(dst_off, len)?;
        src.with(src_off, len, |s| self.write(dst_off, s))?
    }

    /// The sub-range `[offset, offset + len)` as a region sharing this one's lifetime.
    pub fn slice(&self, offset: usize, len: usize) -> Result<Region, OutOfBounds> {
        self.check(offset, len)?;
        Ok(Region {
            addr: self.addr + offset as u64,
            len,
            _owned: self._owned.clone(),
        })
    }
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Region({:#x}+{})", self.addr, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_enforced() {
        let r = Region::alloc(16);
        assert!(r.write(8, &[1; 8]).is_ok());
        assert_eq!(
            r.write(9, &[1; 8]),
            Err(OutOfBounds {
                offset: 9,
                len: 8,
                region_len: 16
            })
        );
        assert!(r.write(usize::MAX, &[1]).is_err());
        let mut b = [0u8; 8];
        r.read(8, &mut b).unwrap();
        assert_eq!(b, [1; 8]);
        assert_eq!(r.read_u64_volatile(8).unwrap(), 0x0101_0101_0101_0101);
        assert!(r.contains(r.addr() + 8, 8));
        assert!(!r.contains(r.addr() + 9, 8));
        assert!(!r.contains(r.addr() - 1, 1));
    }

    #[test]
    fn slices_share_memory() {
        let r = Region::alloc(32);
        let s = r.slice(16, 16).unwrap();
        s.write(0, &[7; 4]).unwrap();
        let mut b = [0u8; 4];
        r.read(16, &mut b).unwrap();
        assert_eq!(b, [7; 4]);
        assert!(r.slice(17, 16).is_err());
    }
}
