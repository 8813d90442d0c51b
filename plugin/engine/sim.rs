#![allow(missing_docs)]
//! A simulated pair of endpoints for engine tests: an in-memory RC link with verbs semantics
//! (RQ consumption, RNR with a manual clock, rkey/bounds checks), fault knobs, and a bounded
//! drive loop that fails on livelock.

use std::collections::VecDeque;

use super::*;
use crate::transport::{RecvWr, SendOpcode, SendWr, Wc, WcOpcode, WcStatus};

/// Flat fake memory: regions at fixed addresses, each with an rkey; the user region has one
/// key per device of its side (a virtual device: `PairCfg::devs`), and QP `q` runs on device
/// `q % devices`, so a WR on it must name that device's key (lkey of a local SGE, rkey of a
/// remote write), as on a NIC where another device's key means nothing.
#[derive(Default)]
pub struct Mem {
    segs: Vec<(u64, Vec<u8>, u32)>,
    /// The user region (`S_USER` or `R_USER`): its address and its key on each device.
    user: Option<(u64, Vec<u32>)>,
}

impl Mem {
    fn add(&mut self, addr: u64, len: usize, rkey: u32) -> u64 {
        self.segs.push((addr, vec![0; len], rkey));
        addr
    }
    fn find(&self, addr: u64, len: usize) -> Option<(usize, usize)> {
        self.segs
            .iter()
            .position(|(a, v, _)| addr >= *a && addr + len as u64 <= *a + v.len() as u64)
            .map(|i| (i, (addr - self.segs[i].0) as usize))
    }
    pub fn write(&mut self, addr: u64, b: &[u8]) -> bool {
        match self.find(addr, b.len()) {
            Some((i, o)) => {
                self.segs[i].1[o..o + b.len()].copy_from_slice(b);
                true
            }
            None => false,
        }
    }
    /// The key of the user region on the device QP `qp` runs on, if `addr` lies in it.
    fn user_key(&self, addr: u64, qp: u8) -> Option<u32> {
        let (base, keys) = self.user.as_ref()?;
        let inside = addr >= *base && addr < base + USER_LEN as u64;
        inside.then(|| keys[usize::from(qp) % keys.len()])
    }
    /// A remote write arriving on QP `qp`: lands only with the key of the region on the
    /// device that QP runs on.
    fn write_remote(&mut self, qp: u8, addr: u64, rkey: u32, b: &[u8]) -> bool {
        let want = |seg: &(u64, Vec<u8>, u32)| self.user_key(addr, qp).unwrap_or(seg.2);
        match self.find(addr, b.len()) {
            Some((i, o)) if want(&self.segs[i]) == rkey => {
                self.segs[i].1[o..o + b.len()].copy_from_slice(b);
                true
            }
            _ => false,
        }
    }
    /// A remote read arriving on QP `qp`: its bytes, only with the key of the region on the
    /// device that QP runs on (as [`Mem::write_remote`]); a zero-length one checks nothing.
    fn read_remote(&self, qp: u8, addr: u64, rkey: u32, len: usize) -> Option<Vec<u8>> {
        if len == 0 {
            return Some(Vec::new());
        }
        let (i, o) = self.find(addr, len)?;
        let key = self.user_key(addr, qp).unwrap_or(self.segs[i].2);
        (key == rkey).then(|| self.segs[i].1[o..o + len].to_vec())
    }
    pub fn get(&self, addr: u64, len: usize) -> Vec<u8> {
        let (i, o) = self.find(addr, len).expect("sim read in bounds");
        self.segs[i].1[o..o + len].to_vec()
    }
}

impl MemRead for Mem {
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        match self.find(addr, out.len()) {
            Some((i, o)) => {
                out.copy_from_slice(&self.segs[i].1[o..o + out.len()]);
                true
            }
            None => false,
        }
    }
}

/// One side's QP state in the simulation.
#[derive(Default)]
struct Qp {
    sq: VecDeque<SendWr>,
    /// The payloads of the inline WRs in `sq`, in order, copied when they were posted.
    inline: VecDeque<Vec<u8>>,
    rq: VecDeque<RecvWr>,
    cq: VecDeque<(u64, Wc)>, // (visible at time, wc)
    rnr_retry_at: Option<u64>,
    rnr_tries: u32,
    error: bool,
}

impl Qp {
    /// Takes the head WR off the send queue (with its inline copy).
    fn pop_front(&mut self) -> Option<SendWr> {
        let wr = self.sq.pop_front()?;
        if wr.inline {
            self.inline.pop_front();
        }
        Some(wr)
    }
}

/// One side's fake memory and QP as the executor's sink: what the comm does with a transport
/// QP and registered memory, done in memory (a failed stage or copy is a bug: it panics).
struct SimSink<'a> {
    mem: &'a mut Mem,
    qp: &'a mut Qp,
    /// The side's data QPs (QP `q` at `q - 1`): the sender's carry WRITE WITH IMMs, the
    /// receiver's hold zero-length receive WRs.
    data: &'a mut [Qp],
    /// The receiver's: receive posts (held back by the `withhold_recvs` knob), eager copies
    /// and the shared pool. `None` on the sender, which does none of these.
    recv: Option<RecvSink<'a>>,
}

struct RecvSink<'a> {
    withhold: bool,
    withheld: &'a mut Vec<RecvWr>,
    pool: &'a mut Vec<(u64, u32)>,
    recv_bufs: &'a std::collections::HashMap<(u32, usize), u64>,
}

impl<'a> SimSink<'a> {
    fn recv(&mut self, what: &str) -> &mut RecvSink<'a> {
        match &mut self.recv {
            Some(r) => r,
            None => panic!("sender action {what}"),
        }
    }
}

impl ActionSink for SimSink<'_> {
    type Error = std::convert::Infallible;

    fn stage(&mut self, addr: u64, bytes: &[u8]) -> Result<(), Self::Error> {
        assert!(self.mem.write(addr, bytes), "stage {addr:#x}");
        Ok(())
    }

    fn post_send(&mut self, qp: usize, wrs: &[SendWr]) -> Result<(), Self::Error> {
        let q = match qp {
            0 => &mut *self.qp,
            _ => match self.data.get_mut(qp - 1) {
                Some(q) => q,
                None => panic!("send WRs for QP {qp} of a {}-QP pair", self.data.len() + 1),
            },
        };
        if qp > 0 {
            for wr in wrs {
                assert!(
                    matches!(wr.opcode, SendOpcode::RdmaWriteWithImm { .. }),
                    "data QP {qp} got a WR that is not an RDMA WRITE WITH IMM: {wr:?}"
                );
            }
        }
        for wr in wrs {
            if wr.inline {
                let mut copy = Vec::new();
                for s in wr.sges() {
                    copy.extend(self.mem.get(s.addr, s.length as usize));
                }
                q.inline.push_back(copy);
            }
        }
        q.sq.extend(wrs.iter().copied());
        Ok(())
    }

    /// QP 0's posts are held back by `withhold_recvs`; a data QP's go straight to its RQ.
    fn post_recv(&mut self, qp: usize, wrs: &[RecvWr]) -> Result<(), Self::Error> {
        let r = self.recv("post_recv");
        if qp > 0 {
            for wr in wrs {
                assert_eq!(
                    wr.sge.length, 0,
                    "data QP {qp} got a receive WR with a buffer"
                );
            }
            match self.data.get_mut(qp - 1) {
                Some(q) => q.rq.extend(wrs.iter().cloned()),
                None => panic!(
                    "receive WRs for QP {qp} of a {}-QP pair",
                    self.data.len() + 1
                ),
            }
        } else if r.withhold {
            r.withheld.extend_from_slice(wrs);
        } else {
            self.qp.rq.extend(wrs.iter().cloned());
        }
        Ok(())
    }

    fn copy(&mut self, src: u64, req: ReqId, buf: usize, len: u64) -> Result<(), Self::Error> {
        let dst = self.recv("copy").recv_bufs[&(req.slot, buf)];
        let data = self.mem.get(src, len as usize);
        assert!(self.mem.write(dst, &data));
        Ok(())
    }

    fn return_bounce(&mut self, bufs: &[(u64, u32)]) -> Result<(), Self::Error> {
        self.recv("return_bounce").pool.extend_from_slice(bufs);
        Ok(())
    }
}

/// The shared pool as the receive engine's [`BounceSource`]: the last `k` free buffers.
struct PoolTake<'a>(&'a mut Vec<(u64, u32)>);

impl BounceSource for PoolTake<'_> {
    fn take(&mut self, k: u32) -> Vec<(u64, u32)> {
        let n = self.0.len().min(k as usize);
        self.0.split_off(self.0.len() - n)
    }
}

/// Sender address map.
pub const S_HDR: u64 = 0x1000_0000;
pub const S_REC: u64 = 0x1100_0000;
pub const S_CTS: u64 = 0x1200_0000;
pub const S_CREDIT: u64 = 0x1300_0000;
pub const S_USER: u64 = 0x1400_0000;
pub const S_LANDING: u64 = 0x1380_0000;
/// Receiver address map.
pub const R_BOUNCE: u64 = 0x2000_0000;
pub const R_REC: u64 = 0x2100_0000;
pub const R_CTRL: u64 = 0x2200_0000;
pub const R_USER: u64 = 0x2400_0000;
/// The receiver's shared bounce pool.
pub const R_POOL: u64 = 0x2800_0000;
const USER_LEN: usize = 1 << 20;
const RKEY_CTS: u32 = 11;
const RKEY_CREDIT: u32 = 12;
const RKEY_REC: u32 = 21;
pub const RKEY_USER: u32 = 22;

/// The sender's user region's key on device `j` (0 on device 0).
pub fn lkey_user(j: u8) -> u32 {
    0x30 * u32::from(j)
}

/// The receiver's user region's key on device `j` ([`RKEY_USER`] on device 0).
pub fn rkey_user(j: u8) -> u32 {
    RKEY_USER + 0x100 * u32::from(j)
}

/// Fault and timing knobs.
pub struct Knobs {
    /// Receive posts are held back (the receiver "stops posting").
    pub withhold_recvs: bool,
    /// RNR timer in ns.
    pub rnr_timer_ns: u64,
    /// RNR retries (7 = forever).
    pub rnr_retry: u32,
    /// Completions become visible this many ns after they happen (reorders them relative to
    /// memory writes such as CTS entries).
    pub wc_delay_ns: u64,
    /// WRs the link moves from the sender per step (more than 1: arrivals come in bursts,
    /// faster than the receiver re-posts).
    pub wrs_per_step: u32,
    /// The receiving process makes no call: the link (the "NIC") still consumes its receive
    /// WRs, writes its memory and queues its completions, but the receive engine is not fed
    /// and does nothing (a caller spinning on the send comm only).
    pub recv_idle: bool,
    /// The sending process makes no call (after the `isend`s it made): the link still moves
    /// the WRs posted and queues their completions, but the send engine is not fed and does
    /// not read its CTS ring (a caller testing only the receive comm).
    pub send_idle: bool,
    /// Lags the sender's data QPs behind QP 0: data QP `q` moves one WR only every
    /// `1 + data_qp_lag * q` steps (each at its own rate), so its writes land after later
    /// WRs of QP 0 and of lower data QPs.
    pub data_qp_lag: u64,
    /// The next WR of this data QP fails (`IBV_WC_RETRY_EXC_ERR`) and the QP goes to the
    /// error state, flushing the rest.
    pub data_qp_error: Option<u8>,
    /// The sender's caller gives the engine no fine clock ([`SendEngine::set_clock`]): its
    /// time stands still wherever the engine asks for it.
    pub no_clock: bool,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            withhold_recvs: false,
            rnr_timer_ns: 640_000,
            rnr_retry: 7,
            wc_delay_ns: 0,
            wrs_per_step: 1,
            recv_idle: false,
            send_idle: false,
            data_qp_lag: 0,
            no_clock: false,
            data_qp_error: None,
        }
    }
}

/// Pair configuration.
pub struct PairCfg {
    pub rq_depth: u32,
    /// Initial (and idle) depth; `None`: fixed depth `rq_depth`.
    pub rq_min: Option<u32>,
    /// Idle time before the depth shrinks by a batch, ns.
    pub shrink_after_ns: u64,
    /// Bounce buffers in the shared pool the receiver grows from.
    pub pool_bufs: u32,
    pub rq_batch: u32,
    pub rq_low_water: u32,
    pub eager_buf_size: u64,
    pub eager_limit: u64,
    /// Largest direct send posted inline (`VERBSNET_INLINE_SIZE`; 0: none). The simulated QP
    /// copies an inline WR's payload when it is posted, as `IBV_SEND_INLINE` does.
    pub inline_max: u64,
    pub credits: bool,
    /// Overrides the initial credits announced to the sender ("shrink credits").
    pub initial_credits: Option<u64>,
    pub first_seq: u64,
    /// Generation of every send request slot's first use (tests start near the 24-bit wrap).
    pub first_gen: u32,
    /// QPs of the connection (`VERBSNET_IB_QPS_PER_CONNECTION`): QP 0 and `qps - 1` data QPs
    /// on each side; the sender's WRITE WITH IMMs on data QP `q` reach the receiver's memory
    /// independently of QP 0 and consume receive WRs of the receiver's data QP `q`.
    pub qps: u8,
    /// Split direct sends over all QPs (`VERBSNET_IB_SPLIT_DATA_ON_QPS`).
    pub split: bool,
    /// The sender pulls clear-to-send entries once it holds enough (`VERBSNET_CTS_PULL`).
    pub cts_pull: bool,
    /// Devices of (sender, receiver): `1..=MAX_DEVS` each (a virtual device, `makeVDevice`).
    /// QP `q` runs on device `q % devices` of its side; the user buffers have one key per
    /// device, and a WR with another device's key fails (lkey: a panic; rkey: an access error).
    pub devs: (u8, u8),
}

impl Default for PairCfg {
    fn default() -> Self {
        PairCfg {
            rq_depth: 16,
            rq_min: None,
            shrink_after_ns: 1_000_000_000,
            pool_bufs: 256,
            rq_batch: 4,
            rq_low_water: 12,
            eager_buf_size: 256,
            eager_limit: 256,
            inline_max: 64,
            credits: true,
            initial_credits: None,
            first_seq: 0,
            first_gen: 0,
            qps: 1,
            split: false,
            cts_pull: true,
            devs: (1, 1),
        }
    }
}

/// A write into the receiver's user buffers, or any WRITE_WITH_IMM (records too), as it
/// landed (in landing order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Landed {
    /// The sender's QP it went on.
    pub qp: u8,
    /// The send slot of its `wr_id`.
    pub slot: u32,
    /// Receiver address.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// The immediate of a WRITE_WITH_IMM (a direct write, a piece or a record); `None` for a
    /// plain WRITE (a CTS or credit write).
    pub imm: Option<u32>,
}

impl Landed {
    /// Into the receiver's user buffers (not a record).
    pub fn user(&self) -> bool {
        self.addr >= R_USER && self.addr < R_USER + USER_LEN as u64
    }
}

/// The simulated pair.
pub struct Pair {
    pub snd: SendEngine,
    pub rcv: RecvEngine,
    pub smem: Mem,
    pub rmem: Mem,
    sqp: Qp,
    /// The sender's data QPs: QP `q` at `q - 1`.
    sdata: Vec<Qp>,
    rqp: Qp,
    /// The receiver's data QPs (their RQs of zero-length WRs): QP `q` at `q - 1`.
    rdata: Vec<Qp>,
    /// Writes into the receiver's user buffers, in landing order.
    pub writes: Vec<Landed>,
    /// WRs each sender QP moved (index = QP).
    pub qp_wrs: Vec<u64>,
    /// What receives must hold when they complete (per request, per buffer), checked by
    /// `wait_recv` at the moment `test` reports them complete.
    expected: std::collections::HashMap<ReqId, Vec<Vec<u8>>>,
    /// Receives whose contents were checked at completion.
    pub checked: u64,
    withheld: Vec<RecvWr>,
    pub knobs: Knobs,
    /// Free buffers of the shared pool (addr, lkey).
    pub pool: Vec<(u64, u32)>,
    pub now: u64,
    /// RNR NAKs seen by the sender.
    pub rnr_naks: u64,
    /// Receive user-buffer regions, per request slot and buffer.
    recv_bufs: std::collections::HashMap<(u32, usize), u64>,
    pub steps: u64,
    /// The sender's user region's keys, one per device (what `isend` passes).
    pub lkeys: Keys,
    /// The receiver's user region's keys, one per device (what `irecv` passes).
    pub rkeys: Keys,
    /// The one action executor, as the comms have theirs.
    exec: Executor,
}

impl Pair {
    pub fn new(c: PairCfg, knobs: Knobs) -> Pair {
        let mut smem = Mem::default();
        let mut rmem = Mem::default();
        // The same layout the comms register (engine::wire).
        let (sdevs, rdevs) = (c.devs.0.max(1), c.devs.1.max(1));
        let [hdr, rec, cts, credit, landing] = super::wire::send_comm_buffers(rdevs);
        smem.add(S_HDR, hdr, 0);
        smem.add(S_REC, rec, 0);
        smem.add(S_CTS, cts, RKEY_CTS);
        smem.add(S_CREDIT, credit, RKEY_CREDIT);
        smem.add(S_LANDING, landing, 0);
        smem.add(S_USER, USER_LEN, 0);
        smem.user = Some((S_USER, (0..sdevs).map(lkey_user).collect()));
        let stride = super::wire::bounce_stride(c.eager_buf_size) as usize;
        let [_, rec_ring, ctrl] =
            super::wire::recv_comm_buffers(c.rq_depth, c.eager_buf_size as u32, rdevs)
                .map(|n| n as usize);
        let rq_min = c.rq_min.unwrap_or(c.rq_depth);
        rmem.add(R_BOUNCE, rq_min as usize * stride, 0);
        rmem.add(R_POOL, (c.pool_bufs as usize).max(1) * stride, 0);
        let pool: Vec<(u64, u32)> = (0..u64::from(c.pool_bufs))
            .rev()
            .map(|i| (R_POOL + i * stride as u64, 5))
            .collect();
        rmem.add(R_REC, rec_ring, RKEY_REC);
        rmem.add(R_CTRL, ctrl, 0);
        rmem.add(R_USER, USER_LEN, RKEY_USER);
        rmem.user = Some((R_USER, (0..rdevs).map(rkey_user).collect()));
        let qps = c.qps.max(1);
        let rcv = RecvEngine::new(RecvParams {
            qps,
            split: c.split,
            rq_depth: c.rq_depth,
            rq_min,
            shrink_after_ns: c.shrink_after_ns,
            rq_batch: c.rq_batch,
            rq_low_water: c.rq_low_water,
            eager_buf_size: c.eager_buf_size,
            bounce: (R_BOUNCE, 1),
            rec_ring: R_REC,
            ctrl_stage: (R_CTRL, 2),
            peer_cts_ring: (S_CTS, RKEY_CTS),
            peer_credit_word: (S_CREDIT, RKEY_CREDIT),
            inline_max: c.inline_max.min(super::wire::CTS_COMPACT_LEN as u64),
            credits: c.credits,
            first_seq: c.first_seq,
            rkeys: rdevs,
        });
        let snd = SendEngine::new(SendParams {
            qps,
            split: c.split,
            eager_limit: c.eager_limit.min(c.eager_buf_size),
            inline_max: c.inline_max,
            credits: c.credits,
            initial_credits: c.initial_credits.unwrap_or(rcv.granted()),
            hdr_stage: (S_HDR, 3),
            rec_stage: (S_REC, 4),
            peer_rec_ring: (R_REC, RKEY_REC),
            cts_ring: S_CTS,
            credit_word: S_CREDIT,
            landing: (S_LANDING, 6),
            cts_pull: c.cts_pull,
            first_seq: c.first_seq,
            first_gen: c.first_gen,
            rkeys: rdevs,
        });
        let mut p = Pair {
            snd,
            rcv,
            smem,
            rmem,
            sqp: Qp::default(),
            sdata: (1..qps).map(|_| Qp::default()).collect(),
            rqp: Qp::default(),
            rdata: (1..qps).map(|_| Qp::default()).collect(),
            writes: Vec::new(),
            qp_wrs: vec![0; usize::from(qps)],
            expected: Default::default(),
            checked: 0,
            withheld: Vec::new(),
            knobs,
            pool,
            now: 0,
            rnr_naks: 0,
            recv_bufs: Default::default(),
            steps: 0,
            lkeys: Keys::new(&(0..sdevs).map(lkey_user).collect::<Vec<_>>()).expect("1..=8"),
            rkeys: Keys::new(&(0..rdevs).map(rkey_user).collect::<Vec<_>>()).expect("1..=8"),
            exec: Executor::default(),
        };
        p.apply_actions();
        p
    }

    /// Carries out both engines' actions with the one executor ([`Executor`]), the sender's
    /// first.
    fn apply_actions(&mut self) {
        let Ok(()) = self.exec.execute(
            &mut self.snd,
            &mut SimSink {
                mem: &mut self.smem,
                qp: &mut self.sqp,
                data: &mut self.sdata,
                recv: None,
            },
        );
        self.execute_recv();
        // As the receive comm does: after the mirror stores, the wake word decides whether
        // the entries just published are pushed, in the same call.
        if self.rcv.has_published() && self.rcv.after_execute(&self.rmem) {
            self.execute_recv();
        }
    }

    /// Carries out the receive engine's actions.
    fn execute_recv(&mut self) {
        let Ok(()) = self.exec.execute(
            &mut self.rcv,
            &mut SimSink {
                mem: &mut self.rmem,
                qp: &mut self.rqp,
                data: &mut self.rdata,
                recv: Some(RecvSink {
                    withhold: self.knobs.withhold_recvs,
                    withheld: &mut self.withheld,
                    pool: &mut self.pool,
                    recv_bufs: &self.recv_bufs,
                }),
            },
        );
    }

    /// Lets withheld receive WRs through.
    pub fn release_recvs(&mut self) {
        self.knobs.withhold_recvs = false;
        let w = std::mem::take(&mut self.withheld);
        self.rqp.rq.extend(w);
    }

    /// Executes the head WR of `from`'s SQ (QP `qp` of its side) against `to`, logging what
    /// lands in user buffers into `log`. Returns true if something happened.
    #[allow(clippy::too_many_arguments)]
    fn exec(
        now: u64,
        knobs: &Knobs,
        (from, qp): (&mut Qp, u8),
        fmem: &mut Mem,
        to: &mut Qp,
        tmem: &mut Mem,
        rnr: &mut u64,
        log: &mut Vec<Landed>,
    ) -> bool {
        let Some(wr) = from.sq.front().copied() else {
            return false;
        };
        let complete = |q: &mut Qp, wc: Wc| q.cq.push_back((now + knobs.wc_delay_ns, wc));
        if from.error {
            from.pop_front();
            complete(
                from,
                Wc {
                    wr_id: wr.wr_id,
                    status: WcStatus::WrFlush,
                    opcode: WcOpcode::Send,
                    byte_len: 0,
                    imm: None,
                },
            );
            return true;
        }
        if let Some(t) = from.rnr_retry_at {
            if now < t {
                return false;
            }
        }
        let read = matches!(wr.opcode, SendOpcode::RdmaRead { .. });
        let mut data = Vec::new();
        // A READ's SGE is its destination: nothing to gather.
        for s in wr.sges().iter().filter(|_| !wr.inline && !read) {
            if let Some(k) = fmem.user_key(s.addr, qp) {
                assert_eq!(
                    s.lkey, k,
                    "QP {qp}'s WR {wr:?} names lkey {} for the user buffer, whose key on that \
                     QP's device is {k}",
                    s.lkey
                );
            }
            data.extend(fmem.get(s.addr, s.length as usize));
        }
        if wr.inline {
            data.clone_from(from.inline.front().expect("an inline WR's copy"));
        }
        let consumes = !matches!(
            wr.opcode,
            SendOpcode::RdmaWrite { .. } | SendOpcode::RdmaRead { .. }
        );
        assert!(
            !(consumes && qp > 0 && to.rq.is_empty()),
            "a data QP ran out of receive WRs: QP {qp}'s WRITE WITH IMM {wr:?} found none (the \
             receiver's coverage of its data QPs is short)"
        );
        if consumes && to.rq.is_empty() {
            *rnr += 1;
            from.rnr_tries += 1;
            if knobs.rnr_retry != 7 && from.rnr_tries > knobs.rnr_retry {
                from.pop_front();
                from.error = true;
                from.rnr_retry_at = None;
                complete(
                    from,
                    Wc {
                        wr_id: wr.wr_id,
                        status: WcStatus::RnrRetryExceeded,
                        opcode: WcOpcode::Send,
                        byte_len: 0,
                        imm: None,
                    },
                );
            } else {
                from.rnr_retry_at = Some(now + knobs.rnr_timer_ns);
            }
            return true;
        }
        from.rnr_retry_at = None;
        from.rnr_tries = 0;
        if let SendOpcode::RdmaWrite { remote_addr, rkey }
        | SendOpcode::RdmaWriteWithImm {
            remote_addr, rkey, ..
        } = wr.opcode
        {
            let imm = match wr.opcode {
                SendOpcode::RdmaWriteWithImm { imm, .. } => Some(imm),
                _ => None,
            };
            if rkey == RKEY_USER || imm.is_some() {
                let slot = match wr_parse(wr.wr_id) {
                    Some((WrKind::Piece, _, i)) => piece_parse(i).0,
                    Some((_, _, i)) => i,
                    None => u32::MAX,
                };
                log.push(Landed {
                    qp,
                    slot,
                    addr: remote_addr,
                    len: data.len() as u64,
                    imm,
                });
            }
        }
        let ok = match wr.opcode {
            SendOpcode::RdmaWrite { remote_addr, rkey } => {
                tmem.write_remote(qp, remote_addr, rkey, &data)
            }
            SendOpcode::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => {
                let ok = tmem.write_remote(qp, remote_addr, rkey, &data);
                if ok {
                    let rwr = to.rq.pop_front().expect("checked");
                    complete(
                        to,
                        Wc {
                            wr_id: rwr.wr_id,
                            status: WcStatus::Success,
                            opcode: WcOpcode::RecvRdmaWithImm,
                            byte_len: data.len() as u32,
                            imm: Some(imm),
                        },
                    );
                }
                ok
            }
            SendOpcode::Send => {
                let rwr = to.rq.pop_front().expect("checked");
                assert!(
                    rwr.sge.length > 0,
                    "a SEND consumed a zero-length receive WR (the sender must never SEND below \
                     the receiver's z_end)"
                );
                assert!(
                    data.len() <= rwr.sge.length as usize,
                    "SEND larger than the bounce buffer"
                );
                assert!(tmem.write(rwr.sge.addr, &data));
                complete(
                    to,
                    Wc {
                        wr_id: rwr.wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::Recv,
                        byte_len: data.len() as u32,
                        imm: None,
                    },
                );
                true
            }
            SendOpcode::RdmaRead { remote_addr, rkey } => {
                match tmem.read_remote(qp, remote_addr, rkey, wr.byte_len() as usize) {
                    Some(b) => {
                        if let Some(s) = wr.sges().first().filter(|_| !b.is_empty()) {
                            assert!(fmem.write(s.addr, &b), "READ destination {s:?}");
                        }
                        data = b;
                        true
                    }
                    None => false,
                }
            }
        };
        let opcode = if read {
            WcOpcode::RdmaRead
        } else {
            WcOpcode::RdmaWrite
        };
        from.pop_front();
        if !ok {
            from.error = true;
            complete(
                from,
                Wc {
                    wr_id: wr.wr_id,
                    status: WcStatus::RemoteAccess,
                    opcode,
                    byte_len: 0,
                    imm: None,
                },
            );
        } else if wr.signaled {
            complete(
                from,
                Wc {
                    wr_id: wr.wr_id,
                    status: WcStatus::Success,
                    opcode: if read { opcode } else { WcOpcode::Send },
                    byte_len: if read { data.len() as u32 } else { 0 },
                    imm: None,
                },
            );
        }
        true
    }

    /// Carries the head WR of the sender's QP 0 and takes every completion it made, without
    /// the engines (for WRs no engine posts yet, such as an RDMA READ).
    #[cfg(test)]
    fn step_qps_only(&mut self, out: &mut Vec<Wc>) {
        self.exec_qp0();
        out.extend(self.sqp.cq.drain(..).map(|(_, wc)| wc));
    }

    /// Carries the head WR of the sender's QP 0 to the receiver; true if it moved.
    fn exec_qp0(&mut self) -> bool {
        Self::exec(
            self.now,
            &self.knobs,
            (&mut self.sqp, 0),
            &mut self.smem,
            &mut self.rqp,
            &mut self.rmem,
            &mut self.rnr_naks,
            &mut self.writes,
        )
    }

    /// One step: apply actions, move one WR each way, deliver visible completions, read the
    /// sender's CTS ring and credit word. Returns true if anything happened.
    pub fn step(&mut self) -> bool {
        self.steps += 1;
        self.apply_actions();
        let mut busy = false;
        for _ in 0..self.knobs.wrs_per_step.max(1) {
            let moved = self.exec_qp0();
            self.qp_wrs[0] += u64::from(moved);
            busy |= moved;
        }
        for q in 1..=self.sdata.len() {
            if !self
                .steps
                .is_multiple_of(1 + self.knobs.data_qp_lag * q as u64)
            {
                continue;
            }
            let dq = &mut self.sdata[q - 1];
            if self.knobs.data_qp_error == Some(q as u8) && !dq.error {
                if let Some(wr) = dq.sq.pop_front() {
                    dq.error = true;
                    dq.cq.push_back((
                        self.now,
                        Wc {
                            wr_id: wr.wr_id,
                            status: WcStatus::RetryExceeded,
                            opcode: WcOpcode::RdmaWrite,
                            byte_len: 0,
                            imm: None,
                        },
                    ));
                    busy = true;
                }
                continue;
            }
            let moved = Self::exec(
                self.now,
                &self.knobs,
                (dq, q as u8),
                &mut self.smem,
                &mut self.rdata[q - 1],
                &mut self.rmem,
                &mut 0,
                &mut self.writes,
            );
            self.qp_wrs[q] += u64::from(moved);
            busy |= moved;
        }
        busy |= Self::exec(
            self.now,
            &self.knobs,
            (&mut self.rqp, 0),
            &mut self.rmem,
            &mut self.sqp,
            &mut self.smem,
            &mut 0,
            &mut Vec::new(),
        );
        for q in 0..=self.sdata.len() {
            let cq = match q {
                0 => &mut self.sqp.cq,
                _ => &mut self.sdata[q - 1].cq,
            };
            while !self.knobs.send_idle && cq.front().is_some_and(|(t, _)| *t <= self.now) {
                let (_, wc) = cq.pop_front().expect("front");
                self.snd.handle_wc(self.now, &wc);
                busy = true;
            }
        }
        for q in 0..=self.rdata.len() {
            let cq = match q {
                0 => &mut self.rqp.cq,
                _ => &mut self.rdata[q - 1].cq,
            };
            while !self.knobs.recv_idle && cq.front().is_some_and(|(t, _)| *t <= self.now) {
                let (_, wc) = cq.pop_front().expect("front");
                self.rcv.handle_wc(self.now, &wc, &self.rmem);
                busy = true;
            }
        }
        if !self.knobs.send_idle {
            busy |= self.snd.poll_peer_writes(self.now, &self.smem);
        }
        assert!(
            !matches!(self.snd.failure(), Some(ReqError::Protocol(_))),
            "CTS ring: {:?}",
            self.snd.failure()
        );
        if !self.knobs.recv_idle {
            busy |= self.rcv.poll_small(self.now, &self.rmem);
            self.rcv.after_poll(self.now, &mut PoolTake(&mut self.pool));
        }
        self.apply_actions();
        // Receives the engine now holds complete, with this step's copies done (as the comm
        // executes the actions of a poll before `test` can see them).
        let done: Vec<ReqId> = (self.expected.keys())
            .copied()
            .filter(|&id| self.rcv.complete(id))
            .collect();
        for id in done {
            self.check_expected(id, None);
        }
        // Advance the clock: 1 us per step, or jump to the next timer when idle.
        self.now += 1_000;
        if !busy {
            let next = [
                self.sqp.rnr_retry_at,
                self.rqp.rnr_retry_at,
                self.sqp.cq.front().map(|c| c.0),
                self.rqp.cq.front().map(|c| c.0),
            ]
            .into_iter()
            .flatten()
            .min();
            if let Some(t) = next {
                self.now = self.now.max(t);
            }
        }
        // The fine clock for the sender's next `isend`, as the comm gives it.
        self.give_clock();
        busy
    }

    /// Gives the send engine the clock when it wants it ([`SendEngine::wants_clock`]), as
    /// the comm does before each `isend` (the simulated clock is fine).
    pub fn give_clock(&mut self) {
        if !self.knobs.no_clock {
            let now = self.now;
            self.snd.clock_if_wanted(|| now);
        }
    }

    /// Steps until `done` holds, failing after `max` steps (livelock guard).
    pub fn drive_until(&mut self, max: u64, mut done: impl FnMut(&mut Pair) -> bool) {
        for _ in 0..max {
            if done(self) {
                return;
            }
            self.step();
        }
        panic!(
            "livelock: condition not reached in {max} steps (now = {} ns)",
            self.now
        );
    }

    /// Writes `data` at user send offset `off` and isends it, retrying (with steps) on "retry
    /// later". Returns the request.
    pub fn isend(&mut self, off: u64, data: &[u8], tag: i32) -> Result<ReqId, ReqError> {
        assert!(self.smem.write(S_USER + off, data));
        for _ in 0..100_000 {
            self.give_clock();
            if let Some(id) =
                self.snd
                    .isend(self.now, S_USER + off, self.lkeys, data.len() as u64, tag)?
            {
                self.apply_actions();
                return Ok(id);
            }
            self.step();
        }
        panic!("isend never started: {}", self.snd.debug_state());
    }

    /// Posts a receive of buffers `(offset, cap, tag)` in the user receive region.
    pub fn irecv(&mut self, bufs: &[(u64, u64, i32)]) -> Result<ReqId, ReqError> {
        let rb: Vec<RecvBuf> = bufs
            .iter()
            .map(|&(o, cap, tag)| RecvBuf {
                addr: R_USER + o,
                cap,
                rkeys: self.rkeys,
                tag,
            })
            .collect();
        for _ in 0..100_000 {
            if let Some(id) = self.rcv.irecv(self.now, &rb)? {
                for (i, &(o, _, _)) in bufs.iter().enumerate() {
                    self.recv_bufs.insert((id.slot, i), R_USER + o);
                }
                self.apply_actions();
                return Ok(id);
            }
            self.step();
        }
        panic!("irecv never started");
    }

    /// Drives until `test` reports the request done (or failed).
    fn wait<T>(
        &mut self,
        mut test: impl FnMut(&mut Pair) -> Result<Option<T>, ReqError>,
    ) -> Result<T, ReqError> {
        let mut out = None;
        self.drive_until(1_000_000, |p| {
            out = test(p).transpose();
            out.is_some()
        });
        out.expect("drive_until returned, so the request finished")
    }

    /// Drives until send `id` finishes.
    pub fn wait_send(&mut self, id: ReqId) -> Result<u64, ReqError> {
        self.wait(|p| p.snd.test(id))
    }

    /// Drives until receive `id` finishes. When its contents were given ([`Pair::expect`]),
    /// checks them at the moment `test` reports it complete (before any further step).
    pub fn wait_recv(&mut self, id: ReqId) -> Result<Vec<u64>, ReqError> {
        let r = self
            .wait(|p| p.rcv.test(id))
            .map(|s: super::Sizes| s.to_vec());
        if let Ok(sizes) = &r {
            self.check_expected(id, Some(sizes));
        }
        r
    }

    /// Receive `id` must hold `data[i]` in buffer `i` (and no more) when it completes: checked
    /// in the very step the receive engine sees its last arrival (and by `wait_recv`), so a
    /// receive reported complete before all its data landed fails the test.
    pub fn expect(&mut self, id: ReqId, data: Vec<Vec<u8>>) {
        self.expected.insert(id, data);
    }

    /// Checks the expected contents of receive `id` (sizes from `test`, when known) and
    /// forgets them.
    fn check_expected(&mut self, id: ReqId, sizes: Option<&[u64]>) {
        let Some(want) = self.expected.remove(&id) else {
            return;
        };
        self.checked += 1;
        for (i, w) in want.iter().enumerate() {
            if let Some(sizes) = sizes {
                assert_eq!(sizes[i], w.len() as u64, "receive {id:?} buffer {i}: size");
            }
            let at = self.recv_bufs[&(id.slot, i)];
            assert!(
                self.rmem.get(at, w.len()) == *w,
                "receive {id:?} buffer {i} ({} bytes) reported complete before all its data \
                 landed",
                w.len()
            );
        }
    }

    /// One round of the engine benchmarks (`benches/engine.rs`, `examples/engine_rounds.rs`):
    /// a one-buffer irecv, an isend of `data`, and both driven to completion.
    pub fn round(&mut self, data: &[u8]) {
        let r = self.irecv(&[(0, 65536, 0)]).expect("irecv");
        let s = self.isend(0, data, 0).expect("isend");
        self.wait_recv(r).expect("recv");
        self.wait_send(s).expect("send");
    }

    /// A window of the engine benchmarks: `w` one-buffer receives and `w` sends of `data`
    /// (each on its own 16 KiB slot of the 1 MiB user regions: `data` and `w` at most 16 KiB
    /// and 64), sends first when `sends_first` (their eager copies wait
    /// unexpected until their receive is posted), then all driven to completion.
    pub fn window_round(&mut self, data: &[u8], w: usize, sends_first: bool) {
        const SLOT: u64 = 16384;
        let slot = |k: usize| k as u64 * SLOT;
        let (mut rs, mut ss) = (Vec::with_capacity(w), Vec::with_capacity(w));
        if sends_first {
            for k in 0..w {
                ss.push(self.isend(slot(k), data, 0).expect("isend"));
            }
        }
        for k in 0..w {
            rs.push(self.irecv(&[(slot(k), SLOT, 0)]).expect("irecv"));
        }
        if !sends_first {
            for k in 0..w {
                ss.push(self.isend(slot(k), data, 0).expect("isend"));
            }
        }
        for r in rs {
            self.wait_recv(r).expect("recv");
        }
        for s in ss {
            self.wait_send(s).expect("send");
        }
    }

    /// The receive user region bytes at `off`.
    pub fn received(&self, off: u64, len: usize) -> Vec<u8> {
        self.rmem.get(R_USER + off, len)
    }
}
/// The pair the engine benchmarks run their rounds on: RQ depth 64 in batches of 16, 8 KiB
/// bounce buffers (so everything up to 8 KiB goes eagerly).
pub fn bench_cfg(credits: bool) -> PairCfg {
    PairCfg {
        rq_depth: 64,
        rq_batch: 16,
        rq_low_water: 48,
        eager_buf_size: 8192,
        eager_limit: 8192,
        credits,
        ..PairCfg::default()
    }
}

/// A small seeded generator (splitmix64) for randomized engine tests: same seed, same run.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Deterministic test bytes for message `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8)
        .collect()
}

#[cfg(test)]
mod tests;
