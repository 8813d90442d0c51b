//! Registered FIFO memory ([`Fifo`]) and the in-flight requests that borrow its slots
//! ([`Request`]): the slot accounting that keeps Rust away from memory lent to the plugin.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr;

use super::wrapper::Net;
use super::{Error, Result};

/// Alignment of FIFO allocations (a page, as a pinned host buffer would have).
const FIFO_ALIGN: usize = 4096;

/// One heap allocation with a fixed address, aligned to a page.
pub(crate) struct Memory {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

impl Memory {
    pub(crate) fn new(len: usize) -> Result<Memory> {
        let layout = std::alloc::Layout::from_size_align(len, FIFO_ALIGN)
            .map_err(|e| Error::Usage(format!("FIFO of {len} bytes: {e}")))?;
        // SAFETY: `len > 0` (checked by reg_mr), so the layout is non-zero-sized.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Ok(Memory { ptr, len })
    }

    /// A placeholder that owns nothing.
    fn empty() -> Memory {
        Memory {
            ptr: ptr::null_mut(),
            len: 0,
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        let layout = std::alloc::Layout::from_size_align(self.len, FIFO_ALIGN)
            .expect("the layout was valid at allocation");
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

/// A registered FIFO: `slots` buffers of `slot_size` bytes in one registration.
pub struct Fifo<'n> {
    pub(crate) mem: Memory,
    pub(crate) slot_size: usize,
    pub(crate) busy: Vec<bool>,
    pub(crate) mhandle: *mut c_void,
    pub(crate) comm: *mut c_void,
    /// One profiler handle per slot: NCCL passes `isend`/`irecv` (v10+) a pointer to its
    /// per-step profiler state, never NULL (`src/transport/net.cc`); the plugin only hands it
    /// back to the profiler callback.
    phandles: Box<[u64]>,
    pub(crate) _net: PhantomData<&'n Net>,
}

impl<'n> Fifo<'n> {
    /// A FIFO of `slots` × `slot_size` bytes in `mem`, registered as `mhandle` on `comm`.
    pub(crate) fn new(
        mem: Memory,
        slots: usize,
        slot_size: usize,
        mhandle: *mut c_void,
        comm: *mut c_void,
    ) -> Fifo<'n> {
        Fifo {
            mem,
            slot_size,
            busy: vec![false; slots],
            mhandle,
            comm,
            phandles: vec![0; slots].into_boxed_slice(),
            _net: PhantomData,
        }
    }

    /// The profiler handle of `slot` (in bounds: checked by [`Fifo::lend`] first).
    pub(crate) fn phandle(&mut self, slot: usize) -> *mut c_void {
        self.phandles
            .get_mut(slot)
            .map_or(ptr::null_mut(), |p| ptr::from_mut(p).cast())
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.busy.len()
    }

    /// Bytes per slot.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Whether `slot` is lent to the plugin.
    pub fn is_busy(&self, slot: usize) -> bool {
        self.busy.get(slot).copied().unwrap_or(false)
    }

    /// The bytes of a free slot; `None` while it is lent to the plugin (or out of range).
    pub fn slot(&self, slot: usize) -> Option<&[u8]> {
        if slot >= self.slots() || self.busy[slot] {
            return None;
        }
        // SAFETY: the range lies inside the allocation; the slot is not lent to the plugin, and
        // `&self` excludes Rust writers.
        Some(unsafe {
            std::slice::from_raw_parts(self.mem.ptr.add(slot * self.slot_size), self.slot_size)
        })
    }

    /// The bytes of a free slot, writable; `None` while lent to the plugin.
    pub fn slot_mut(&mut self, slot: usize) -> Option<&mut [u8]> {
        if slot >= self.slots() || self.busy[slot] {
            return None;
        }
        // SAFETY: the range lies inside the allocation; the slot is not lent to the plugin, and
        // `&mut self` excludes every other Rust access to it.
        Some(unsafe {
            std::slice::from_raw_parts_mut(self.mem.ptr.add(slot * self.slot_size), self.slot_size)
        })
    }

    /// Checks that `slot` can be lent for `len` bytes to `comm`, returns its address.
    pub(crate) fn lend(&self, comm: *mut c_void, slot: usize, len: usize) -> Result<*mut c_void> {
        if comm != self.comm {
            return Err(Error::Usage("FIFO registered on another comm".into()));
        }
        if slot >= self.slots() || len > self.slot_size {
            return Err(Error::Usage(format!(
                "slot {slot} with {len} bytes (FIFO of {} × {})",
                self.slots(),
                self.slot_size
            )));
        }
        if self.busy[slot] {
            return Err(Error::Usage(format!("slot {slot} is already in flight")));
        }
        // SAFETY: in bounds of the allocation (checked above).
        Ok(unsafe { self.mem.ptr.add(slot * self.slot_size) }.cast())
    }

    pub(crate) fn track(&mut self, slot: usize, req: *mut c_void) -> Option<Request<'n>> {
        if req.is_null() {
            return None;
        }
        self.busy[slot] = true;
        Some(Request {
            ptr: req,
            slot,
            more: Vec::new(),
            fifo: self.mem.ptr,
            done: false,
            _net: PhantomData,
        })
    }
}

impl Drop for Fifo<'_> {
    fn drop(&mut self) {
        if self.busy.iter().any(|b| *b) {
            // The plugin may still write into this memory: leak it instead of freeing it.
            eprintln!("verbsnet-perf: leaking a FIFO dropped with requests in flight");
            std::mem::forget(std::mem::replace(&mut self.mem, Memory::empty()));
        }
    }
}

/// An in-flight `isend`/`irecv`.
pub struct Request<'n> {
    pub(crate) ptr: *mut c_void,
    pub(crate) slot: usize,
    /// The other slots of a grouped receive (buffers 1..n).
    pub(crate) more: Vec<usize>,
    pub(crate) fifo: *mut u8,
    pub(crate) done: bool,
    pub(crate) _net: PhantomData<&'n Net>,
}

impl Request<'_> {
    /// The FIFO slot the request uses (its first buffer's, for a grouped receive).
    pub fn slot(&self) -> usize {
        self.slot
    }
}
