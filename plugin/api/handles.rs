//! The objects NCCL holds a pointer to between calls, and the calls made on them: the typed
//! comms ([`SendComm`], [`RecvComm`], as a [`NetComm`]), memory registrations ([`MrHandle`])
//! and requests ([`ReqHandle`]).
//!
//! A comm of [`crate::comm`] hands out request ids; the handle NCCL holds for a request is
//! one of its API comm's [`ReqHandle`]s (one per request slot, made with the comm), and each
//! holds the comm by reference count, so `test(request)` reaches the comm from the handle alone:
//! ffi → [`test`] → the comm's `test` → the engine, and back, with no pointer cast but the
//! C boundary's one from `void*` to `&ReqHandle`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::{Context, Error, Op, MAX_P2P_BYTES};
use crate::comm::{self, Class, Mr};
use crate::engine::{ReqId, Sizes};
use crate::mem::Region;

/// A send comm (from [`super::connect`]): `isend`, and `test` of its requests.
pub struct SendComm {
    comm: Arc<comm::SendComm>,
    /// One handle per request slot (what `isend` hands NCCL); each holds the comm too.
    reqs: Box<[ReqHandle]>,
    _ctx: Arc<Context>,
}

/// A receive comm (from [`super::ListenComm::accept`]): `irecv`, `iflush`, and `test` of its
/// requests.
pub struct RecvComm {
    comm: Arc<comm::RecvComm>,
    /// One handle per request slot (what `irecv` hands NCCL); each holds the comm too.
    reqs: Box<[ReqHandle]>,
    _ctx: Arc<Context>,
}

/// A memory registration, what NCCL holds as `mhandle` (made by `regMr`, freed by `deregMr`,
/// or by the close of the comm it was made through): the comm layer's registered region.
pub struct MrHandle {
    mr: Mr,
}

/// Start addresses of the `MrHandle`s alive now (unit tests check that close frees them).
#[cfg(test)]
pub(crate) static LIVE_MR_ADDRS: Mutex<Vec<u64>> = Mutex::new(Vec::new());

#[cfg(test)]
impl Drop for MrHandle {
    fn drop(&mut self) {
        let mut v = super::lock(&LIVE_MR_ADDRS);
        if let Some(i) = v.iter().position(|&a| a == self.mr.region().addr()) {
            v.swap_remove(i);
        }
    }
}

impl MrHandle {
    fn new(mr: Mr) -> MrHandle {
        #[cfg(test)]
        super::lock(&LIVE_MR_ADDRS).push(mr.region().addr());
        MrHandle { mr }
    }
}

impl AsRef<Mr> for MrHandle {
    fn as_ref(&self) -> &Mr {
        &self.mr
    }
}

/// The comm a request belongs to. Every handle of a comm holds it (a reference count, not a
/// pointer), so the comm lives as long as its handles: both go when NCCL closes the comm.
enum Owner {
    Send(Arc<comm::SendComm>),
    Recv(Arc<comm::RecvComm>),
}

/// A request, what NCCL holds as `*request` between `isend`/`irecv` and the `test` that
/// reports it done. It lives in its API comm's handle array (one per request slot, made with
/// the comm; NCCL never frees it) and is valid until the comm is closed. It names its comm and
/// the request's id: the slot is fixed, the generation is the one the slot's latest request
/// had (written when the request started; a stale handle tests as an unknown request).
pub struct ReqHandle {
    owner: Owner,
    slot: u32,
    gen: AtomicU32,
}

impl ReqHandle {
    /// The handles of a comm with `n` request slots, each holding the comm.
    fn array(n: usize, owner: impl Fn() -> Owner) -> Box<[ReqHandle]> {
        (0..n as u32)
            .map(|slot| ReqHandle {
                owner: owner(),
                slot,
                gen: AtomicU32::new(0),
            })
            .collect()
    }

    /// The request id this handle stands for now.
    pub fn id(&self) -> ReqId {
        ReqId {
            slot: self.slot,
            gen: self.gen.load(Ordering::Acquire),
        }
    }
}

impl SendComm {
    /// The API comm over `comm` (tagged with its communicator already: it is shared from now
    /// on), with its request handles.
    pub(super) fn new(comm: comm::SendComm, ctx: Arc<Context>) -> SendComm {
        let comm = Arc::new(comm);
        SendComm {
            reqs: ReqHandle::array(comm::SendComm::MAX_REQUESTS, || Owner::Send(comm.clone())),
            comm,
            _ctx: ctx,
        }
    }
}

impl RecvComm {
    /// The API comm over `comm` (tagged with its communicator already), with its request
    /// handles.
    pub(super) fn new(comm: comm::RecvComm, ctx: Arc<Context>) -> RecvComm {
        let comm = Arc::new(comm);
        RecvComm {
            reqs: ReqHandle::array(comm::RecvComm::MAX_REQUESTS, || Owner::Recv(comm.clone())),
            comm,
            _ctx: ctx,
        }
    }
}

/// The handle of a request the comm just started (`id`), in `reqs`; an `Internal` error of
/// `op` if the id is outside the comm's slots (the engine broke its bound).
fn handle(reqs: &[ReqHandle], id: ReqId, op: Op) -> Result<&ReqHandle, Error> {
    let h = reqs.get(id.slot as usize).ok_or_else(|| {
        Error::new(
            op,
            Class::Internal,
            format!("request slot {} out of range", id.slot),
        )
    })?;
    h.gen.store(id.gen, Ordering::Release);
    Ok(h)
}

/// The memory registrations alive now, process-wide: the address of each handle `regMr` gave
/// out (the C boundary owns the handles; this only remembers them) → the address of the comm
/// it was registered through. `deregMr` takes a handle only if it is here, so a handle freed
/// twice, or after its comm was closed, is a clear error and never a double free; and
/// `closeSend`/`closeRecv` free what a caller leaves registered. NCCL deregisters before it
/// closes (`src/transport/net.cc`); other callers need not.
static LIVE_MRS: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());

/// Remembers the registration handle at `handle`, made through the comm at `comm`.
pub fn mr_given(handle: usize, comm: usize) {
    super::lock(&LIVE_MRS).insert(handle, comm);
}

/// Forgets the registration handle at `handle` (`deregMr`): false when it is not alive (freed
/// already, or its comm was closed).
pub fn mr_taken(handle: usize) -> bool {
    super::lock(&LIVE_MRS).remove(&handle).is_some()
}

/// Forgets and returns the registration handles made through the comm at `comm`, once it is
/// closed: the caller frees them.
pub fn mrs_left_by(comm: usize) -> Vec<usize> {
    let mut m = super::lock(&LIVE_MRS);
    let left: Vec<usize> = m
        .iter()
        .filter(|&(_, &c)| c == comm)
        .map(|(&h, _)| h)
        .collect();
    for h in &left {
        m.remove(h);
    }
    left
}

/// What NCCL holds as `sendComm` or `recvComm` (`regMr`/`deregMr` take either).
pub enum NetComm {
    /// From `connect`.
    Send(SendComm),
    /// From `accept`.
    Recv(RecvComm),
}

impl NetComm {
    fn devices(&self) -> &[Arc<dyn crate::transport::Device>] {
        match self {
            NetComm::Send(s) => s.comm.devices(),
            NetComm::Recv(r) => r.comm.devices(),
        }
    }

    /// The send comm, or an error if NCCL passed a receive comm.
    pub fn as_send(&self, op: Op) -> Result<&SendComm, Error> {
        match self {
            NetComm::Send(s) => Ok(s),
            NetComm::Recv(_) => Err(Error::new(
                op,
                Class::Internal,
                "a receive comm passed as sendComm",
            )),
        }
    }

    /// The receive comm, or an error if NCCL passed a send comm.
    pub fn as_recv(&self, op: Op) -> Result<&RecvComm, Error> {
        match self {
            NetComm::Recv(r) => Ok(r),
            NetComm::Send(_) => Err(Error::new(
                op,
                Class::Internal,
                "a send comm passed as recvComm",
            )),
        }
    }

    /// `regMr` of host memory `[region)` on this comm's device (each device of a virtual one).
    pub fn reg_mr(&self, region: Region) -> Result<MrHandle, Error> {
        Mr::register_all(self.devices(), region)
            .map(MrHandle::new)
            .map_err(|e| e.lift(Op::RegMr))
    }

    /// `closeSend`/`closeRecv`: tells the peer (an orderly close), logs the counters and
    /// releases the request handles, the QP and the buffers (after it nothing writes into any
    /// buffer; the registrations left behind are freed next, see [`mrs_left_by`]).
    pub fn close(self) {
        match &self {
            NetComm::Send(s) => {
                s.comm.goodbye();
                s.comm.report_close();
            }
            NetComm::Recv(r) => {
                r.comm.goodbye();
                r.comm.report_close();
            }
        }
        // The comm's last references: its own and its request handles'.
        drop(self);
    }
}

/// A request as NCCL sees it: the handle of a started request (its address is what NCCL
/// holds), or `None` ("retry later"; for `iflush`, "complete").
pub type Request<'a> = Option<&'a ReqHandle>;

impl SendComm {
    /// `isend` of `size` bytes at `data` (inside `mh`) with `tag`: `Ok(None)` = retry later.
    /// Sizes above [`MAX_P2P_BYTES`] are refused (NCCL never sends more than `maxP2pBytes`).
    pub fn isend(
        &self,
        data: u64,
        size: u64,
        tag: i32,
        mh: &MrHandle,
    ) -> Result<Request<'_>, Error> {
        if size > MAX_P2P_BYTES {
            return Err(Error::new(
                Op::Isend,
                Class::InvalidArgument,
                format!(
                    "isend of {size} bytes: more than maxP2pBytes ({MAX_P2P_BYTES}) this plugin \
                 advertises"
                ),
            ));
        }
        let id = self
            .comm
            .isend(data, size, tag, &mh.mr)
            .map_err(|e| e.lift(Op::Isend))?;
        id.map(|id| handle(&self.reqs, id, Op::Isend)).transpose()
    }
}

impl RecvComm {
    /// `irecv` of up to [`crate::engine::wire::MAX_RECVS`] `(addr, capacity, tag, mhandle)` buffers as one request:
    /// `Ok(None)` = retry later. A capacity above [`MAX_P2P_BYTES`] is used as
    /// `MAX_P2P_BYTES` (no larger message can arrive).
    ///
    /// `optional` is NCCL's `NCCL_NET_OPTIONAL_RECV_COMPLETION` hint (v9+, `*request == 0x1` on
    /// input, LL/LL128): the plugin *may* complete such a receive early. verbsnet completes
    /// it normally (the data lands before the completion either way) and returns a real
    /// request, which NCCL then tests as any other (nccl_net.h, ext-net README).
    pub fn irecv(
        &self,
        bufs: &mut [(u64, u64, i32, &MrHandle)],
        optional: bool,
    ) -> Result<Request<'_>, Error> {
        let _ = optional;
        for b in bufs.iter_mut() {
            b.1 = b.1.min(MAX_P2P_BYTES);
        }
        let id = self.comm.irecv(bufs).map_err(|e| e.lift(Op::Irecv))?;
        id.map(|id| handle(&self.reqs, id, Op::Irecv)).transpose()
    }

    /// `iflush` of received buffers: nothing to do for host memory; `Ok(None)` means
    /// "complete" (ext-net README).
    pub fn iflush(&self) -> Result<Request<'_>, Error> {
        let id = self.comm.iflush().map_err(|e| e.lift(Op::Iflush))?;
        id.map(|id| handle(&self.reqs, id, Op::Iflush)).transpose()
    }
}

/// `test(request)` on the comm the request belongs to (the handle holds it): `Ok(Some(sizes))`
/// when done (one size for a send, n for a grouped receive).
pub fn test(req: &ReqHandle) -> Result<Option<Sizes>, Error> {
    let id = req.id();
    match &req.owner {
        Owner::Send(c) => c.test(id),
        Owner::Recv(c) => c.test(id),
    }
    .map_err(|e| e.lift(Op::Test))
}
