//! Raw memory regions: the one place where plugin code touches memory by address.
//!
//! NCCL hands the plugin raw pointers (`regMr(data, size)`, `isend(data, size)`); the tcp
//! transport writes incoming RDMA data into them and the receive path copies eager payloads out
//! of bounce buffers into them. This module sits below the transports, the comms and the C
//! boundary, and everything above it goes through [`Region`]'s bounds-checked methods, so a
//! hostile frame or a wrong size can at worst be refused, never touch memory outside a
//! registered range.
//!
//! # Why no slices
//!
//! A NIC, the tcp responder of another QP, or the peer (RDMA WRITE) may write a region's bytes
//! at any time, and a `Region` is `Clone + Sync`. A `&[u8]` or `&mut [u8]` over such memory
//! would promise Rust that nobody else writes it (or, for `&mut`, reads it) while the reference
//! lives: undefined behaviour the first time a peer writes. So no method hands out a reference
//! to region memory. Every access is a copy ([`Region::read`], [`Region::write`],
//! [`Region::copy_from`], [`Region::append_to`]), an 8-byte word ([`Region::load_u64`],
//! [`Region::store_u64`]), or a system call that moves bytes between a socket and the raw
//! range ([`Region::recv_into`], [`Region::send_from`], [`sendmsg`]): the kernel writes the
//! memory as a NIC's DMA would.
//!
//! # Why atomic copies
//!
//! Every method takes `&self`, so two Rust threads holding clones of one region (the comm's
//! thread and the tcp transport's, or NCCL's progress and service threads) may write the same
//! bytes, or one write what the other reads, through safe code: that is a data race, undefined
//! behaviour in Rust's memory model even where the hardware would not mind, unless every such
//! access is atomic. So every copy into or out of a region is a byte-wise atomic memcpy (the
//! C++ proposal P1478's `atomic_load_per_byte_memcpy`/`atomic_store_per_byte_memcpy`, as the
//! `atomic-memcpy` crate implements it): relaxed atomic loads and stores, a machine word at a
//! time where the address is word-aligned and a byte at a time at the edges, with an acquire
//! fence after a read and a release fence before a write; the 8-byte words are acquire loads
//! and release stores. On x86-64 and aarch64 relaxed word accesses are the plain loads and
//! stores `memcpy` makes (what the compiler gives up is vectorising them), and the fences cost
//! nothing on x86-64, so the data path pays no measurable price (docs/performance.md). Bytes
//! another party writes concurrently may still arrive torn, as they may from a NIC; the
//! protocol above tolerates that (it checks sequence words after the copy). One gap is left
//! as the `atomic-memcpy` crate leaves it: two racing copies that reach the same bytes at
//! different word alignments make atomic accesses of different sizes, which the C++ model
//! does not define; both compile to plain loads and stores, and only bytes the protocol already
//! treats as torn are affected.
//!
//! The alternative, `unsafe` writes with a "no other thread writes this range" contract,
//! would push `unsafe` into the tcp transport (`#![forbid(unsafe_code)]`), whose responder
//! writes incoming RDMA data from whichever thread drives the QP.

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A byte range `[addr, addr + len)` that stays readable and writable while any clone of the
/// `Region` is in use: either memory NCCL registered (valid from `regMr` to `deregMr`: ext-net
/// README) or a buffer the plugin allocated and owns (kept alive by the `Region` itself).
///
/// Cloning shares the range (no copy); every clone may be used from any thread. Accesses have
/// RDMA's rules, not Rust's: concurrent writers are allowed and the last one wins.
#[derive(Clone)]
pub struct Region {
    addr: u64,
    len: usize,
    _owned: Option<Arc<OwnedBuf>>,
}

/// A heap allocation a region owns, freed with the last clone. It keeps the address as an
/// integer, as `Region` does (its pointer was exposed when it was turned into one), so it is
/// `Send + Sync` like any integer, with no `unsafe impl`.
struct OwnedBuf {
    addr: usize,
    layout: std::alloc::Layout,
}

impl Drop for OwnedBuf {
    fn drop(&mut self) {
        // SAFETY: addr is the address alloc_zeroed returned for exactly this layout (its
        // provenance exposed by the cast in `try_alloc`), freed once: the last Arc clone drops
        // it, and no region of it is used after that.
        unsafe { std::alloc::dealloc(self.addr as *mut u8, self.layout) }
    }
}

/// An access outside a region's bounds (or, for the 8-byte word accesses, a misaligned one).
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
            "access of {} bytes at offset {} is outside a region of {} bytes (or misaligned)",
            self.len, self.offset, self.region_len
        )
    }
}

impl std::error::Error for OutOfBounds {}

impl From<OutOfBounds> for io::Error {
    fn from(e: OutOfBounds) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, e)
    }
}

/// One piece of a gathered socket write ([`sendmsg`]).
#[derive(Clone, Copy, Debug)]
pub enum IoPiece<'a> {
    /// Plain bytes the caller owns (headers, staged frames).
    Bytes(&'a [u8]),
    /// `len` bytes of `region` from `off`.
    Region {
        /// The region the bytes are in.
        region: &'a Region,
        /// Offset into the region.
        off: usize,
        /// Bytes to send.
        len: usize,
    },
}

impl IoPiece<'_> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            IoPiece::Bytes(b) => b.len(),
            IoPiece::Region { len, .. } => *len,
        }
    }

    /// True for an empty piece.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Most pieces one [`sendmsg`] call takes (Linux's `UIO_MAXIOV` is 1024); pieces beyond it
/// are left for the next call, which a short write implies anyway.
pub const MAX_IOV: usize = 64;

/// Writes the pieces, in order, with one `sendmsg(2)` (`MSG_NOSIGNAL`: a closed peer is an
/// `EPIPE` error, never a `SIGPIPE` in the host process). Returns the bytes the kernel took,
/// which may be fewer than the pieces hold (a short write, as `write(2)`); at most
/// [`MAX_IOV`] non-empty pieces go into one call.
///
/// # Errors
/// The call's error (`WouldBlock` when a non-blocking socket's buffer is full,
/// `Interrupted`), or `InvalidInput` when a region piece lies outside its region (nothing is
/// written then).
pub fn sendmsg(fd: BorrowedFd<'_>, pieces: &[IoPiece<'_>]) -> io::Result<usize> {
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MAX_IOV];
    let mut n = 0;
    for p in pieces.iter().filter(|p| !p.is_empty()) {
        if n == MAX_IOV {
            break;
        }
        let base = match *p {
            IoPiece::Bytes(b) => b.as_ptr(),
            IoPiece::Region { region, off, len } => region.ptr(off, len)?.cast_const(),
        };
        iov[n] = libc::iovec {
            iov_base: base as *mut libc::c_void,
            iov_len: p.len(),
        };
        n += 1;
    }
    if n == 0 {
        return Ok(0);
    }
    // SAFETY: a zeroed msghdr is valid (no name, no control data); it points at `iov`, whose
    // first `n` entries each describe readable memory: a live slice (`Bytes`) or a range
    // bounds-checked inside a region, valid by Region's contract. The kernel only reads them.
    let r = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = n as _;
        libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as usize)
}

/// Byte-wise atomic copies between region memory (raw pointers, shared with other threads,
/// a NIC or the kernel) and memory the caller owns (slices). See the module docs for why.
/// Nothing here dereferences a pointer for a zero length: a region may start at address 0
/// (`regMr(NULL, 0)`).
mod atomic {
    use std::sync::atomic::{fence, AtomicU8, AtomicUsize, Ordering};

    const W: usize = std::mem::size_of::<usize>();

    /// Bytes a region-to-region copy moves through the stack at a time when the two sides are
    /// not word-aligned alike, or overlap.
    const CHUNK: usize = 512;

    /// # Safety
    /// `p` is valid for reads and writes of one byte, and accessed only atomically by others.
    unsafe fn load_u8(p: *const u8) -> u8 {
        // SAFETY: the caller's contract; an `AtomicU8` has the layout of a `u8`.
        unsafe { AtomicU8::from_ptr(p.cast_mut()) }.load(Ordering::Relaxed)
    }

    /// # Safety
    /// As [`load_u8`].
    unsafe fn store_u8(p: *mut u8, v: u8) {
        // SAFETY: the caller's contract.
        unsafe { AtomicU8::from_ptr(p) }.store(v, Ordering::Relaxed)
    }

    /// # Safety
    /// `p` is word-aligned, valid for reads and writes of a word, and accessed only atomically
    /// by others.
    unsafe fn load_word(p: *const u8) -> usize {
        // SAFETY: the caller's contract (alignment included).
        unsafe { AtomicUsize::from_ptr(p.cast_mut().cast()) }.load(Ordering::Relaxed)
    }

    /// # Safety
    /// As [`load_word`].
    unsafe fn store_word(p: *mut u8, v: usize) {
        // SAFETY: the caller's contract.
        unsafe { AtomicUsize::from_ptr(p.cast()) }.store(v, Ordering::Relaxed)
    }

    /// Bytes before `p` reaches word alignment, at most `len`.
    fn head(p: *const u8, len: usize) -> usize {
        ((p as usize).wrapping_neg() & (W - 1)).min(len)
    }

    /// Words of `n` bytes moved four at a time, then one at a time: the copy loops below are
    /// this function with a word access each (loads and stores the compiler may neither merge
    /// nor vectorise, so unrolling is what keeps the loop overhead down).
    #[inline(always)]
    fn words(n: usize, mut each: impl FnMut(usize)) {
        let mut at = 0;
        while at + 4 * W <= n {
            each(at);
            each(at + W);
            each(at + 2 * W);
            each(at + 3 * W);
            at += 4 * W;
        }
        while at + W <= n {
            each(at);
            at += W;
        }
    }

    /// Fills `dst` from `src` with relaxed atomic loads, then an acquire fence.
    ///
    /// # Safety
    /// For a non-empty `dst`: `src..src + dst.len()` is valid for reads and writes (region
    /// memory, by `Region`'s contract) and not accessed non-atomically by another thread
    /// during the call; `dst` is not inside it.
    #[inline]
    pub(super) unsafe fn load(src: *const u8, dst: &mut [u8]) {
        // SAFETY: the caller's contract; a live `&mut [u8]` is valid for writes of its length.
        unsafe { load_raw(src, dst.as_mut_ptr(), dst.len()) }
    }

    /// [`load`] into `len` bytes at `d`, which may be uninitialised.
    ///
    /// # Safety
    /// As [`load`], with `d..d + len` valid for writes, owned by the caller and outside the
    /// source range.
    #[inline]
    pub(super) unsafe fn load_raw(src: *const u8, d: *mut u8, len: usize) {
        let h = head(src, len);
        let body = (len - h) & !(W - 1);
        let byte = |i: usize| {
            // SAFETY: `i < len`: inside the source range (the contract) and inside `dst`.
            unsafe { d.add(i).write(load_u8(src.add(i))) }
        };
        (0..h).for_each(byte);
        (h + body..len).for_each(byte);
        words(body, |at| {
            // SAFETY: `src + h + at` is word-aligned (past the head) and a whole word of the
            // source range; `d + h + at` is a whole word of `dst`, written unaligned.
            unsafe {
                let v = load_word(src.add(h + at));
                d.add(h + at).cast::<usize>().write_unaligned(v);
            }
        });
        fence(Ordering::Acquire);
    }

    /// A release fence, then writes `src` to `dst` with relaxed atomic stores.
    ///
    /// # Safety
    /// For a non-empty `src`: `dst..dst + src.len()` is valid for reads and writes and not
    /// accessed non-atomically by another thread during the call; `src` is not inside it.
    #[inline]
    pub(super) unsafe fn store(dst: *mut u8, src: &[u8]) {
        fence(Ordering::Release);
        let len = src.len();
        let s = src.as_ptr();
        let h = head(dst, len);
        let body = (len - h) & !(W - 1);
        let byte = |i: usize| {
            // SAFETY: `i < len`: inside the destination range and inside `src`.
            unsafe { store_u8(dst.add(i), s.add(i).read()) }
        };
        (0..h).for_each(byte);
        (h + body..len).for_each(byte);
        words(body, |at| {
            // SAFETY: `dst + h + at` is word-aligned and a whole word of the destination
            // range; `s + h + at` a whole word of `src`, read unaligned.
            unsafe {
                let v = s.add(h + at).cast::<usize>().read_unaligned();
                store_word(dst.add(h + at), v);
            }
        });
    }

    /// `memmove` of `len` bytes from `src` to `dst` (the ranges may overlap) with atomic
    /// loads and stores: word to word when both are word-aligned alike and apart, else through
    /// the stack in chunks taken in the direction that never overwrites bytes not yet read.
    ///
    /// # Safety
    /// For `len > 0`: both ranges valid for reads and writes and not accessed non-atomically by
    /// another thread during the call.
    pub(super) unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
        if len == 0 {
            return;
        }
        let (s, d) = (src as usize, dst as usize);
        let apart = s + len <= d || d + len <= s;
        if apart && s % W == d % W {
            fence(Ordering::Release);
            let h = head(src, len);
            let body = (len - h) & !(W - 1);
            let byte = |i: usize| {
                // SAFETY: inside both ranges, per the contract.
                unsafe { store_u8(dst.add(i), load_u8(src.add(i))) }
            };
            (0..h).for_each(byte);
            (h + body..len).for_each(byte);
            words(body, |at| {
                // SAFETY: both `src + h + at` and `dst + h + at` are word-aligned (equal
                // offsets modulo W, past the head) and a whole word of each is inside its range.
                unsafe { store_word(dst.add(h + at), load_word(src.add(h + at))) };
            });
            fence(Ordering::Acquire);
            return;
        }
        let mut buf = [0u8; CHUNK];
        let n = len.div_ceil(CHUNK);
        for k in 0..n {
            // Forwards when the destination starts first, backwards otherwise: every chunk
            // is read whole before it is written, and no write reaches a chunk still unread.
            let k = if d <= s { k } else { n - 1 - k };
            let off = k * CHUNK;
            let b = &mut buf[..CHUNK.min(len - off)];
            // SAFETY: `off..off + b.len()` is inside both ranges; `buf` is our own.
            unsafe {
                load(src.add(off), b);
                store(dst.add(off), b);
            }
        }
    }
}

impl Region {
    /// Wraps memory the caller owns.
    ///
    /// # Safety
    /// `[addr, addr + len)` must be valid for reads and writes for as long as any clone of the
    /// returned region is used (for NCCL buffers: until `deregMr`, which drops every clone).
    pub unsafe fn from_raw(addr: u64, len: usize) -> Region {
        debug_assert!(
            addr.checked_add(len as u64).is_some(),
            "a region may not wrap the address space"
        );
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
            _owned: Some(Arc::new(OwnedBuf {
                addr: ptr as usize,
                layout,
            })),
        })
    }

    /// Virtual address of the first byte.
    #[inline]
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when `[addr, addr + len)` lies inside this region.
    #[inline]
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && addr.checked_add(len).is_some_and(|end| {
                self.addr
                    .checked_add(self.len as u64)
                    .is_some_and(|e| end <= e)
            })
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

    /// The address of byte `offset`, after checking that `[offset, offset + len)` is inside.
    /// Only ever turned into raw-pointer accesses, never into a reference.
    #[inline]
    fn ptr(&self, offset: usize, len: usize) -> Result<*mut u8, OutOfBounds> {
        self.check(offset, len)?;
        Ok((self.addr as usize + offset) as *mut u8)
    }

    /// Copies `src` to `offset`.
    ///
    /// # Errors
    /// [`OutOfBounds`] (nothing written) when the range is not inside the region.
    #[inline]
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), OutOfBounds> {
        let dst = self.ptr(offset, src.len())?;
        // SAFETY: `dst..dst + src.len()` is inside the region (checked), valid for reads and
        // writes by the constructor's contract and reached by every Rust thread only through
        // these atomic copies; `src` is a live slice the caller owns, not region memory a
        // `&[u8]` could alias (no method hands one out).
        unsafe { atomic::store(dst, src) };
        Ok(())
    }

    /// Copies `dst.len()` bytes from `offset` into `dst`.
    ///
    /// # Errors
    /// [`OutOfBounds`] (`dst` untouched) when the range is not inside the region.
    #[inline]
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        let src = self.ptr(offset, dst.len())?;
        // SAFETY: the source range is inside the region (checked), valid by the constructor's
        // contract and reached only through atomic copies; `dst` is a distinct live buffer the
        // caller owns exclusively.
        unsafe { atomic::load(src.cast_const(), dst) };
        Ok(())
    }

    /// Appends `len` bytes from `offset` to `dst`.
    ///
    /// # Errors
    /// [`OutOfBounds`] (`dst` untouched) when the range is not inside the region.
    pub fn append_to(
        &self,
        offset: usize,
        len: usize,
        dst: &mut Vec<u8>,
    ) -> Result<(), OutOfBounds> {
        let src = self.ptr(offset, len)?;
        dst.reserve(len);
        let at = dst.len();
        // SAFETY: the source range is inside the region (checked), valid by contract and
        // reached only through atomic copies; `reserve` made room for `len` bytes after `at`,
        // the Vec's own memory (not the region's), which the load fills entirely before
        // `set_len` exposes them.
        unsafe {
            atomic::load_raw(src.cast_const(), dst.as_mut_ptr().add(at), len);
            dst.set_len(at + len);
        }
        Ok(())
    }

    /// Reads a little-endian u64 at `offset` with one atomic acquire load (a NIC or another
    /// thread may write it at any time). The address must be 8-byte aligned.
    ///
    /// # Errors
    /// [`OutOfBounds`] when the 8 bytes are not inside the region or not aligned.
    #[inline]
    pub fn load_u64(&self, offset: usize) -> Result<u64, OutOfBounds> {
        let p = self.aligned_u64(offset)?;
        // SAFETY: in bounds and aligned (checked); valid for reads and writes per the
        // contract, and reached only through atomic accesses.
        let v = unsafe { AtomicU64::from_ptr(p) }.load(Ordering::Acquire);
        Ok(u64::from_le(v))
    }

    /// Stores `v` little-endian at `offset` with one atomic release store. The address must be
    /// 8-byte aligned.
    ///
    /// # Errors
    /// [`OutOfBounds`] (nothing written) when the 8 bytes are not inside the region or not
    /// aligned.
    #[inline]
    pub fn store_u64(&self, offset: usize, v: u64) -> Result<(), OutOfBounds> {
        let p = self.aligned_u64(offset)?;
        // SAFETY: as in `load_u64`.
        unsafe { AtomicU64::from_ptr(p) }.store(v.to_le(), Ordering::Release);
        Ok(())
    }

    #[inline]
    fn aligned_u64(&self, offset: usize) -> Result<*mut u64, OutOfBounds> {
        let p = self.ptr(offset, 8)?.cast::<u64>();
        if p.align_offset(8) != 0 {
            return Err(OutOfBounds {
                offset: offset as u64,
                len: 8,
                region_len: self.len as u64,
            });
        }
        Ok(p)
    }

    /// Copies `len` bytes from `src` at `src_off` to this region at `dst_off` (the ranges may
    /// overlap, also within one region).
    ///
    /// # Errors
    /// [`OutOfBounds`] (nothing copied) when either range is outside its region.
    pub fn copy_from(
        &self,
        dst_off: usize,
        src: &Region,
        src_off: usize,
        len: usize,
    ) -> Result<(), OutOfBounds> {
        let s = src.ptr(src_off, len)?;
        let d = self.ptr(dst_off, len)?;
        // SAFETY: both ranges are inside their regions (checked), valid by contract and
        // reached only through atomic copies; overlapping ranges are fine (a memmove).
        unsafe { atomic::copy(s.cast_const(), d, len) };
        Ok(())
    }

    /// Receives at most `len` bytes from the socket `fd` straight into `[offset, offset +
    /// len)` with one `recv(2)`; returns how many arrived (0: the peer closed the stream, or
    /// `len` was 0).
    ///
    /// # Errors
    /// The call's error (`WouldBlock` on a drained non-blocking socket, `Interrupted`), or
    /// `InvalidInput` when the range is outside the region (nothing read).
    pub fn recv_into(&self, offset: usize, len: usize, fd: BorrowedFd<'_>) -> io::Result<usize> {
        let p = self.ptr(offset, len)?;
        if len == 0 {
            return Ok(0);
        }
        // SAFETY: `p..p + len` is inside the region (checked), valid for writes by contract; the
        // kernel writes at most `len` bytes there and no reference to the range exists.
        let r = unsafe { libc::recv(fd.as_raw_fd(), p.cast(), len, 0) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r as usize)
    }

    /// Sends at most `len` bytes from `[offset, offset + len)` on the socket `fd` with one
    /// `send(2)` (`MSG_NOSIGNAL`); returns how many the kernel took.
    ///
    /// # Errors
    /// As [`Region::recv_into`] (`WouldBlock` when the socket buffer is full).
    pub fn send_from(&self, offset: usize, len: usize, fd: BorrowedFd<'_>) -> io::Result<usize> {
        self.check(offset, len)?;
        sendmsg(
            fd,
            &[IoPiece::Region {
                region: self,
                off: offset,
                len,
            }],
        )
    }

    /// The sub-range `[offset, offset + len)` as a region sharing this one's lifetime.
    ///
    /// # Errors
    /// [`OutOfBounds`] when the range is not inside the region.
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
mod tests;
