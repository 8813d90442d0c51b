//! Registered memory: a [`Region`] with its memory registration (keys, and the registration
//! kept alive as long as the region is used through it).
//!
//! One type for both kinds a comm uses: NCCL's buffers (`regMr`, [`Mr::register`]; the API
//! layer wraps them in the handle NCCL holds) and the plugin's own protocol buffers
//! ([`Mr::alloc`], [`Mr::alloc_parts`]: staging, rings, bounce buffers, the pool's slabs).

use std::sync::Arc;

use super::{message, Class, Error, Op};
use crate::engine::Keys;
use crate::mem::Region;
use crate::transport::{Device, MemoryRegion, MrKeys, TransportError};

/// A registered region: its bytes, its keys, and the registration (shared by the parts of one
/// `Mr::alloc_parts`; deregistered when the last part goes). A region NCCL registers through
/// a comm on a virtual device is registered on each of its devices ([`Mr::register_all`]):
/// `keys` are device 0's, [`Mr::lkeys`]/[`Mr::rkeys`] all of them.
pub struct Mr {
    pub(crate) region: Region,
    pub(crate) keys: MrKeys,
    lkeys: Keys,
    rkeys: Keys,
    _mr: Arc<dyn MemoryRegion>,
    /// The registrations on devices 1.. of a virtual device.
    _more: Vec<Arc<dyn MemoryRegion>>,
}

impl AsRef<Mr> for Mr {
    fn as_ref(&self) -> &Mr {
        self
    }
}

impl Mr {
    /// Registers `region` (memory the caller owns: NCCL's buffer from `regMr`) on `dev`.
    ///
    /// # Errors
    /// [`Op::RegMr`]: the registration failed (with the `RLIMIT_MEMLOCK` fix for `ENOMEM`).
    pub fn register(dev: &dyn Device, region: Region) -> Result<Mr, Error> {
        let mr = Mr::reg_one(dev, &region, None)?;
        Ok(Mr::from_registration(region, mr))
    }

    /// Registers `region` on every device of `devs` (a comm's: one, or the physical devices
    /// of a virtual one, in its order), so that a WR on any of the comm's QPs finds it by the
    /// key of the device that QP runs on ([`Keys::at`]).
    ///
    /// # Errors
    /// As [`Mr::register`], naming the device that failed; the registrations made before it
    /// are released.
    pub fn register_all(devs: &[Arc<dyn Device>], region: Region) -> Result<Mr, Error> {
        let named = devs.len() > 1;
        let mut regs = Vec::with_capacity(devs.len());
        for (j, d) in devs.iter().enumerate() {
            regs.push(Mr::reg_one(&**d, &region, named.then_some(j))?);
        }
        let keys: Vec<MrKeys> = regs.iter().map(|r| r.keys()).collect();
        let lk: Vec<u32> = keys.iter().map(|k| k.lkey).collect();
        let rk: Vec<u32> = keys.iter().map(|k| k.rkey).collect();
        let mut mr = Mr::from_registration(region, regs.remove(0));
        let too_many = || {
            Error::new(
                Op::RegMr,
                Class::Internal,
                format!("a comm on {} devices (at most 8)", devs.len()),
            )
        };
        mr.lkeys = Keys::new(&lk).ok_or_else(too_many)?;
        mr.rkeys = Keys::new(&rk).ok_or_else(too_many)?;
        mr._more = regs;
        Ok(mr)
    }

    fn reg_one(
        dev: &dyn Device,
        region: &Region,
        index: Option<usize>,
    ) -> Result<Arc<dyn MemoryRegion>, Error> {
        dev.reg_mr(region.clone()).map_err(|e| {
            let on = index.map_or(String::new(), |j| {
                format!(
                    " on device {j} ({}) of the virtual device",
                    dev.props().name
                )
            });
            let msg = format!(
                "registering {} bytes at {:#x}{on} failed",
                region.len(),
                region.addr()
            );
            Error::new(Op::RegMr, Class::System, msg)
                .fix(enomem_hint(&e, region.len()))
                .because(e)
        })
    }

    fn from_registration(region: Region, mr: Arc<dyn MemoryRegion>) -> Mr {
        let keys = mr.keys();
        Mr {
            keys,
            lkeys: Keys::one(keys.lkey),
            rkeys: Keys::one(keys.rkey),
            region,
            _mr: mr,
            _more: Vec::new(),
        }
    }

    /// Allocates `len` zeroed bytes and registers them on `dev` (a protocol buffer).
    ///
    /// # Errors
    /// [`Op::Buffers`]: the allocation or the registration failed.
    pub(crate) fn alloc(dev: &dyn Device, len: usize) -> Result<Mr, Error> {
        let region = Region::try_alloc(len).map_err(|e| {
            Error::new(
                Op::Buffers,
                Class::System,
                format!("a {len}-byte protocol buffer"),
            )
            .because_source(message(e))
            .fix(" (lower VERBSNET_RQ_DEPTH or VERBSNET_EAGER_BUF_SIZE)")
        })?;
        let mr = dev.reg_mr(region.clone()).map_err(|e| {
            Error::new(
                Op::Buffers,
                Class::System,
                format!("registering a {len}-byte protocol buffer failed"),
            )
            .fix(enomem_hint(&e, len))
            .because(e)
        })?;
        Ok(Mr::from_registration(region, mr))
    }

    /// One registration cut into consecutive parts of `sizes` bytes (each part starts on a
    /// 64-byte boundary): a comm's small buffers then pin whole pages once, not once each.
    ///
    /// # Errors
    /// As [`Mr::alloc`].
    pub(crate) fn alloc_parts<const N: usize>(
        dev: &dyn Device,
        sizes: [usize; N],
    ) -> Result<[Mr; N], Error> {
        let offsets: Vec<usize> = sizes
            .iter()
            .scan(0usize, |at, &n| {
                let o = *at;
                *at = (o + n).next_multiple_of(64);
                Some(o)
            })
            .collect();
        let total = offsets.last().map_or(0, |&o| o) + sizes.last().copied().unwrap_or(0);
        let whole = Mr::alloc(dev, total)?;
        let part = |i: usize| -> Result<Mr, Error> {
            Ok(Mr {
                region: whole
                    .region
                    .slice(offsets[i], sizes[i])
                    .map_err(|e| Error::wrap(Op::Buffers, Class::Internal, e))?,
                keys: whole.keys,
                lkeys: whole.lkeys,
                rkeys: whole.rkeys,
                _mr: whole._mr.clone(),
                _more: Vec::new(),
            })
        };
        let parts: Vec<Mr> = (0..N).map(part).collect::<Result<_, _>>()?;
        parts
            .try_into()
            .map_err(|_| Error::new(Op::Buffers, Class::Internal, "buffer parts"))
    }

    /// The registered bytes.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// The registration's keys.
    pub fn keys(&self) -> MrKeys {
        self.keys
    }

    /// The lkeys, one per device it is registered on.
    pub fn lkeys(&self) -> Keys {
        self.lkeys
    }

    /// The rkeys, one per device it is registered on.
    pub fn rkeys(&self) -> Keys {
        self.rkeys
    }

    /// (addr, lkey): where a local WR finds the buffer.
    pub(crate) fn at(&self) -> (u64, u32) {
        (self.region.addr(), self.keys.lkey)
    }

    /// (addr, rkey): what the peer needs to write the buffer.
    pub(crate) fn remote(&self) -> (u64, u32) {
        (self.region.addr(), self.keys.rkey)
    }

    /// `[addr, addr + len)` as a sub-region, or an `InvalidArgument` error of `op` naming both
    /// ranges (a buffer NCCL passes must lie inside the registration it passes with it).
    pub(crate) fn sub(&self, op: Op, addr: u64, len: u64) -> Result<Region, Error> {
        self.check_within(op, addr, len)?;
        self.region
            .slice((addr - self.region.addr()) as usize, len as usize)
            .map_err(|e| Error::wrap(op, Class::InvalidArgument, e))
    }

    /// Checks that `addr`+`len` lies inside this registration (what [`Mr::sub`] checks, for a
    /// caller that needs no region: `isend` hands the engine the address and the keys).
    ///
    /// # Errors
    /// `InvalidArgument` naming the buffer and the registration.
    #[inline]
    pub(crate) fn check_within(&self, op: Op, addr: u64, len: u64) -> Result<(), Error> {
        if !self.region.contains(addr, len) {
            return Err(Error::new(
                op,
                Class::InvalidArgument,
                format!(
                    "buffer {addr:#x}+{len} is not inside its memory registration {:#x}+{} \
                     (regMr the whole buffer first)",
                    self.region.addr(),
                    self.region.len()
                ),
            ));
        }
        Ok(())
    }
}

/// The `RLIMIT_MEMLOCK` hint for a registration that failed with `ENOMEM`, else nothing.
fn enomem_hint(e: &TransportError, len: usize) -> String {
    match e {
        TransportError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOMEM) => {
            crate::limits::enomem_hint(len)
        }
        _ => String::new(),
    }
}
