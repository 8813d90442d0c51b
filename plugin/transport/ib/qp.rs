//! RC queue pairs over verbs: creation (RESET→INIT), connection (RTR→RTS), posting and polling.

use std::cell::Cell;
use std::io::{self, Read, Write};
use std::net::{Ipv6Addr, TcpStream};
use std::ptr;
use std::sync::Arc;

use rdma_sys::{
    ibv_access_flags, ibv_cq, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_init_attr,
    ibv_qp_state, ibv_qp_type, ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc,
    ibv_wc_flags, ibv_wr_opcode,
};
use tracing::{debug, info, warn};

use super::conninfo::ConnInfo;
use super::context::{PortInfo, ProtectionDomain, LINK_LAYER_ETHERNET};
use super::convert;
use crate::transport::{
    set_keepalive, QpConfig, QpCounters, QueuePair, RecvWr, SendOpcode, SendWr, Sge,
    TransportError, Wc, WcOpcode, WcStatus, MAX_SEND_SGE, PEER_SILENT,
};

/// Completions fetched per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

/// An RC queue pair with its own CQ (shared by both queues).
pub struct IbQueuePair {
    pd: Arc<ProtectionDomain>,
    port: Arc<PortInfo>,
    cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    qpn: u32,
    psn: u32,
    cfg: QpConfig,
    established: bool,
    oob: Option<TcpStream>,
    peer_gone: Cell<bool>,
    /// The set-up socket's keepalive expired: the peer host or its link went silent.
    peer_silent: Cell<bool>,
    /// The peer's goodbye marker arrived on the set-up stream.
    peer_orderly: Cell<bool>,
    /// Bytes of [`GOODBYE`] matched so far at the end of what the set-up stream carried.
    goodbye_matched: Cell<usize>,
    /// The QP was moved to the error state because the peer went (so every WR completes).
    flushed: Cell<bool>,
    /// Our own goodbye was written.
    said_goodbye: bool,
    /// The inline size `ibv_create_qp` granted (`cap.max_inline_data` as it wrote it back):
    /// [`QueuePair::max_inline_data`].
    max_inline_data: u32,
    counters: QpCounters,
    warned_error: bool,
    // scratch space reused by every post of several send WRs, every receive post and poll
    // (no allocation on the data path; a post of one send WR builds it on the stack)
    send_wrs: Vec<ibv_send_wr>,
    send_sges: Vec<ibv_sge>,
    recv_wrs: Vec<ibv_recv_wr>,
    recv_sges: Vec<ibv_sge>,
    wcs: Vec<ibv_wc>,
}

// SAFETY: the QP is driven by one thread at a time (QueuePair is Send, not Sync); the verbs
// objects it owns may be used from any thread, and the scratch vectors' raw pointers only point
// into the QP's own vectors during a post.
unsafe impl Send for IbQueuePair {}

impl IbQueuePair {
    /// Creates the CQ and the RC QP and moves the QP to INIT.
    pub(crate) fn create(
        pd: Arc<ProtectionDomain>,
        port: Arc<PortInfo>,
        cfg: &QpConfig,
    ) -> Result<IbQueuePair, TransportError> {
        let label = port.label();
        let mut cfg = cfg.clone();
        for (what, v) in [
            ("max_send_wr", &mut cfg.max_send_wr),
            ("max_recv_wr", &mut cfg.max_recv_wr),
        ] {
            if *v > port.max_qp_wr {
                warn!(dev = %label, asked = *v, limit = port.max_qp_wr, "{what} clamped to the device's max_qp_wr");
                *v = port.max_qp_wr;
            }
            *v = (*v).max(1);
        }
        if port.max_sge < MAX_SEND_SGE as u32 {
            return Err(TransportError::Resource(format!(
                "{label} allows {} SGEs per WR; verbsnet needs {MAX_SEND_SGE}",
                port.max_sge
            )));
        }
        let want_cqe = u64::from(cfg.max_send_wr) + u64::from(cfg.max_recv_wr);
        let cqe = if want_cqe > u64::from(port.max_cqe) {
            warn!(
                dev = %label,
                asked = want_cqe,
                limit = port.max_cqe,
                "CQ depth clamped to the device's max_cqe; keep send+receive WRs in flight \
                 below it or the CQ overruns"
            );
            port.max_cqe
        } else {
            want_cqe as u32
        };
        let verbs = pd.ctx.verbs;
        let mut me = IbQueuePair {
            pd,
            port,
            cq: ptr::null_mut(),
            qp: ptr::null_mut(),
            qpn: 0,
            psn: random_psn(),
            cfg,
            established: false,
            oob: None,
            peer_gone: Cell::new(false),
            peer_silent: Cell::new(false),
            peer_orderly: Cell::new(false),
            goodbye_matched: Cell::new(0),
            flushed: Cell::new(false),
            said_goodbye: false,
            max_inline_data: 0,
            counters: QpCounters::default(),
            warned_error: false,
            send_wrs: Vec::new(),
            send_sges: Vec::new(),
            recv_wrs: Vec::new(),
            recv_sges: Vec::new(),
            // SAFETY: ibv_wc is plain data; all-zero is a valid value.
            wcs: (0..POLL_BATCH)
                .map(|_| unsafe { std::mem::zeroed() })
                .collect(),
        };
        // SAFETY: the context is open; no completion channel, vector 0.
        me.cq = unsafe {
            (verbs.create_cq)(
                me.pd.ctx.ctx,
                cqe as i32,
                ptr::null_mut(),
                ptr::null_mut(),
                0,
            )
        };
        if me.cq.is_null() {
            return Err(io_err(format!("ibv_create_cq({cqe}) on {label}")));
        }
        let init_attr = |max_inline_data: u32| {
            // SAFETY: ibv_qp_init_attr is plain data; all-zero is valid (null srq/context).
            let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
            init.send_cq = me.cq;
            init.recv_cq = me.cq;
            init.cap.max_send_wr = me.cfg.max_send_wr;
            init.cap.max_recv_wr = me.cfg.max_recv_wr;
            init.cap.max_send_sge = MAX_SEND_SGE as u32;
            init.cap.max_recv_sge = 1;
            init.cap.max_inline_data = max_inline_data;
            init.qp_type = ibv_qp_type::IBV_QPT_RC;
            init.sq_sig_all = 0;
            init
        };
        let mut init = init_attr(me.cfg.max_inline_data);
        // SAFETY: the PD is alive and init is fully initialised with our CQ.
        me.qp = unsafe { (verbs.create_qp)(me.pd.pd, &mut init) };
        if me.qp.is_null() && me.cfg.max_inline_data > 0 {
            // A device that takes fewer inline bytes refuses the whole QP: ask again for none.
            // What it writes back then is what it takes anyway (rxe: 32 bytes; some: 0), and
            // max_inline_data() says that.
            let refused = io::Error::last_os_error();
            init = init_attr(0);
            // SAFETY: as above.
            me.qp = unsafe { (verbs.create_qp)(me.pd.pd, &mut init) };
            if !me.qp.is_null() {
                info!(
                    dev = %label,
                    asked = me.cfg.max_inline_data,
                    "the device refused {} bytes of inline data per send WR ({refused}): QP \
                     created asking none; it takes {} bytes inline (VERBSNET_INLINE_SIZE \
                     above that is not used)",
                    me.cfg.max_inline_data,
                    init.cap.max_inline_data
                );
            }
        }
        if me.qp.is_null() {
            return Err(io_err(format!(
                "ibv_create_qp(send {}, recv {}) on {label}",
                me.cfg.max_send_wr, me.cfg.max_recv_wr
            )));
        }
        // What the provider wrote back is what the WQE holds, at least what was asked (rxe
        // writes back 32 when asked for 0): capped at the ask, so that 0 means no inline sends
        // (after a refusal, the ask was larger: what the device takes caps it).
        me.max_inline_data = init.cap.max_inline_data.min(me.cfg.max_inline_data);
        // SAFETY: qp is a valid QP just created.
        me.qpn = unsafe { (*me.qp).qp_num };

        // SAFETY: ibv_qp_attr is plain data; all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = me.port.port;
        attr.qp_access_flags = (ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ)
            .0;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        me.modify(&mut attr, mask, "INIT")?;
        debug!(dev = %label, qp_num = me.qpn, psn = me.psn, cqe, send_wr = me.cfg.max_send_wr, recv_wr = me.cfg.max_recv_wr, max_inline_data = me.max_inline_data, "QP created (INIT)");
        Ok(me)
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn info(&self) -> ConnInfo {
        ConnInfo {
            link_layer: self.port.link_layer,
            mtu: self.port.active_mtu as u8,
            port: self.port.port,
            qpn: self.qpn,
            psn: self.psn,
            lid: self.port.lid,
            gid: self.port.gid,
        }
    }

    fn modify(
        &mut self,
        attr: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
        state: &str,
    ) -> Result<(), TransportError> {
        // SAFETY: qp is a valid QP; attr is initialised for every field `mask` names.
        let rc = unsafe { (self.pd.ctx.verbs.modify_qp)(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            // ibv_modify_qp returns the errno value (and may or may not set errno)
            return Err(TransportError::Io {
                op: format!(
                    "ibv_modify_qp(QP {} -> {state}) on {}",
                    self.qpn,
                    self.port.label()
                ),
                source: io::Error::from_raw_os_error(rc.abs()),
            });
        }
        Ok(())
    }

    fn note_error(&mut self, wr_id: u64, vendor_err: u32, status: WcStatus) {
        if self.warned_error || status == WcStatus::WrFlush {
            debug!(qp_num = self.qpn, wr_id, %status, "error completion");
            return;
        }
        self.warned_error = true;
        // An access or retry error after the peer's process died is a consequence of the
        // death (its MRs and QP went with it): name the death first.
        let after = if status != WcStatus::Success && self.peer_closed() {
            ", after the peer closed its set-up connection (its process exited or died, or \
             its host stopped answering): that is the cause"
        } else {
            ""
        };
        warn!(
            dev = %self.port.label(),
            qp_num = self.qpn,
            wr_id,
            vendor_err,
            %status,
            hint = status.hint(),
            "first error completion on this QP{after}"
        );
    }
}

impl IbQueuePair {
    /// Reads what the set-up stream holds (non-blocking). After the handshake it carries only
    /// the peer's [`GOODBYE`] (stray bytes are dropped, so an EOF behind them is still seen).
    /// True when the peer is gone: EOF, an error (a keepalive that expired: the host went
    /// silent), or its goodbye.
    fn read_oob(&self) -> bool {
        let Some(s) = &self.oob else {
            return false;
        };
        let mut buf = [0u8; 64];
        loop {
            match (&*s).read(&mut buf) {
                Ok(0) => return true,
                Ok(n) => {
                    let mut matched = self.goodbye_matched.get();
                    for &b in &buf[..n] {
                        if matched < GOODBYE.len() && b == GOODBYE[matched] {
                            matched += 1;
                        } else if matched < GOODBYE.len() {
                            matched = usize::from(b == GOODBYE[0]);
                        }
                    }
                    self.goodbye_matched.set(matched);
                    if matched == GOODBYE.len() {
                        self.peer_orderly.set(true);
                        debug!(qp_num = self.qpn, "the peer said goodbye (orderly close)");
                        return true;
                    }
                    debug!(qp_num = self.qpn, n, "bytes on the set-up stream");
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    // TCP keepalive expired: the peer host, not just its process, is gone
                    self.peer_silent.set(true);
                    warn!(
                        qp_num = self.qpn,
                        "the peer host stopped answering on the set-up connection (no TCP \
                         keepalive reply within VERBSNET_SOCKET_KEEPALIVE): it lost power or \
                         its link is down; outstanding requests fail"
                    );
                    return true;
                }
                Err(e) => {
                    debug!(qp_num = self.qpn, "oob stream error: {e}");
                    return true;
                }
            }
        }
    }

    /// The peer is gone: move the QP to the error state, so that every outstanding WR
    /// completes (flushed) instead of waiting for a peer that will never answer (a posted
    /// receive would never complete otherwise). Once.
    fn flush_on_peer_gone(&self) {
        if self.flushed.replace(true) || !self.established {
            return;
        }
        // SAFETY: ibv_qp_attr is plain data; all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        // SAFETY: qp is a valid QP (destroyed only in Drop); attr sets the one field the mask
        // names; verbs calls on a QP are thread-safe, and this QP is driven by one thread.
        let rc = unsafe {
            (self.pd.ctx.verbs.modify_qp)(
                self.qp,
                &mut attr,
                ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
            )
        };
        if rc != 0 {
            warn!(
                qp_num = self.qpn,
                rc, "ibv_modify_qp(-> ERR) after the peer went failed"
            );
        } else {
            debug!(
                qp_num = self.qpn,
                "the peer went: QP moved to the error state (WRs flush)"
            );
        }
    }
}

impl IbQueuePair {
    /// Moves the QP to RTR and RTS towards the peer `remote` describes; returns the peer's
    /// info and the path MTU (IB enum).
    fn connect_rts(&mut self, remote: &[u8]) -> Result<(ConnInfo, u32), TransportError> {
        if self.established {
            return Err(TransportError::Protocol(format!(
                "QP {} is already connected",
                self.qpn
            )));
        }
        let peer = ConnInfo::decode(remote)?;
        if peer.link_layer != self.port.link_layer {
            return Err(TransportError::Protocol(format!(
                "link layer mismatch: local {} is {}, the peer's port is {}; select ports of \
                 one kind with VERBSNET_IB_HCA",
                self.port.label(),
                link_layer_name(self.port.link_layer),
                link_layer_name(peer.link_layer)
            )));
        }
        let mtu = convert::path_mtu(self.port.active_mtu, u32::from(peer.mtu));

        // SAFETY: ibv_qp_attr is plain data; all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = mtu;
        attr.dest_qp_num = peer.qpn;
        attr.rq_psn = peer.psn;
        attr.max_dest_rd_atomic = 1;
        attr.min_rnr_timer = self.cfg.min_rnr_timer.min(31);
        attr.ah_attr.port_num = self.port.port;
        attr.ah_attr.sl = self.cfg.service_level.min(15);
        attr.ah_attr.dlid = peer.lid;
        if self.port.link_layer == LINK_LAYER_ETHERNET {
            // RoCE: every packet carries a GRH (it becomes the IP header)
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid.raw = peer.gid;
            attr.ah_attr.grh.sgid_index = self.port.gid_index;
            attr.ah_attr.grh.hop_limit = 255;
            attr.ah_attr.grh.traffic_class = self.cfg.traffic_class;
            attr.ah_attr.grh.flow_label = 0;
        }
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_AV
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut attr, mask, "RTR")?;

        // SAFETY: as above.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
        attr.sq_psn = self.psn;
        attr.timeout = self.cfg.timeout.min(31);
        attr.retry_cnt = self.cfg.retry_cnt.min(7);
        attr.rnr_retry = self.cfg.rnr_retry.min(7);
        attr.max_rd_atomic = 1;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut attr, mask, "RTS")?;
        Ok((peer, mtu))
    }

    /// The INFO line of a connected QP (`data`: a data QP, QP 1 and up of its connection).
    fn log_connected(&self, peer: &ConnInfo, mtu: u32, data: bool) {
        let (local_mtu, peer_mtu) = (
            convert::mtu_bytes(self.port.active_mtu).unwrap_or(0),
            convert::mtu_bytes(u32::from(peer.mtu)).unwrap_or(0),
        );
        let mtu_note = if local_mtu == peer_mtu {
            String::new()
        } else {
            format!(
                "; path MTU is the smaller of this port's {local_mtu} and the peer's {peer_mtu}"
            )
        };
        info!(
            dev = %self.port.label(),
            qp_num = self.qpn,
            remote_qp_num = peer.qpn,
            remote_gid = %Ipv6Addr::from(peer.gid),
            mtu = convert::mtu_bytes(mtu).unwrap_or(0),
            data_qp = data,
            "QP connected (RTS){mtu_note}"
        );
    }

    /// One `ibv_poll_cq` of up to `want` (at most [`POLL_BATCH`]) completions into `wcs`:
    /// how many it wrote, or the provider's negative error.
    #[inline]
    fn poll_batch(&mut self, want: usize) -> i32 {
        // SAFETY: cq is valid; wcs has POLL_BATCH >= want writable entries.
        unsafe {
            rdma_sys::ibv_poll_cq(self.cq, want.min(POLL_BATCH) as i32, self.wcs.as_mut_ptr())
        }
    }

    /// [`QueuePair::poll_cq`] once its first batch returned `first` (not 0): converts the
    /// completions into `out` and polls on while whole batches come, up to `max`.
    #[inline(never)]
    fn take_wcs(
        &mut self,
        out: &mut Vec<Wc>,
        max: usize,
        first: i32,
    ) -> Result<usize, TransportError> {
        let mut got = 0;
        let mut n = first;
        loop {
            let want = (max - got).min(POLL_BATCH);
            if n < 0 {
                return Err(TransportError::Io {
                    op: format!("ibv_poll_cq on QP {}", self.qpn),
                    source: io::Error::from_raw_os_error(n.unsigned_abs() as i32),
                });
            }
            let k = n as usize;
            for i in 0..k {
                let wc = &self.wcs[i];
                let status = convert::wc_status(wc.status);
                let opcode = convert::wc_opcode(wc.opcode);
                let with_imm = wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
                let is_recv = wc.opcode & rdma_sys::ibv_wc_opcode::IBV_WC_RECV != 0;
                // SAFETY: both union members are u32, so any bit pattern is valid; with
                // IBV_WC_WITH_IMM set it holds the immediate in network byte order.
                let imm_be = unsafe { wc.imm_data_invalidated_rkey_union.imm_data };
                let c = Wc {
                    wr_id: wc.wr_id,
                    status,
                    opcode,
                    // a receive's bytes, or what an RDMA READ brought (ibv_poll_cq(3))
                    byte_len: if is_recv || opcode == WcOpcode::RdmaRead {
                        wc.byte_len
                    } else {
                        0
                    },
                    // rxe also flags the requester's completion of a WRITE_WITH_IMM (imm 0); the
                    // immediate belongs to the receive completion only
                    imm: (with_imm && is_recv).then(|| u32::from_be(imm_be)),
                };
                let vendor_err = wc.vendor_err;
                out.push(c);
                if status != WcStatus::Success {
                    self.note_error(c.wr_id, vendor_err, status);
                }
            }
            got += k;
            if k < want || got >= max {
                break;
            }
            n = self.poll_batch(max - got);
        }
        Ok(got)
    }
}

impl QueuePair for IbQueuePair {
    fn local_info(&self) -> Vec<u8> {
        self.info().encode()
    }

    fn establish(&mut self, remote: &[u8], oob: TcpStream) -> Result<(), TransportError> {
        let (peer, mtu) = self.connect_rts(remote)?;
        if let Err(e) = oob.set_nonblocking(true) {
            debug!("oob set_nonblocking: {e}");
        }
        if let Some(bound) = self.cfg.oob_keepalive {
            if let Err(e) = set_keepalive(&oob, bound) {
                warn!(qp_num = self.qpn, "TCP keepalive on the set-up socket: {e}");
            }
        }
        self.oob = Some(oob);
        self.established = true;
        self.log_connected(&peer, mtu, false);
        Ok(())
    }

    /// A data QP: RTR/RTS as `establish`, no set-up stream (QP 0 of the connection watches
    /// the peer and says goodbye).
    fn establish_data(&mut self, remote: &[u8]) -> Result<(), TransportError> {
        let (peer, mtu) = self.connect_rts(remote)?;
        self.established = true;
        self.log_connected(&peer, mtu, true);
        Ok(())
    }

    fn post_send(&mut self, wrs: &[SendWr]) -> Result<(), TransportError> {
        // Every WR is checked first: a refused WR refuses the whole list before anything is
        // posted (the provider would take the WRs before it and fail at it).
        for wr in wrs {
            self.check_send(wr)?;
        }
        match wrs {
            [] => Ok(()),
            // The common post (a small send, a CTS, a READ): its WR and SGEs on the stack.
            [wr] => {
                let mut sges = [sge(&Sge::default()); MAX_SEND_SGE];
                let mut n = 0;
                for (d, s) in sges.iter_mut().zip(carried(wr)) {
                    *d = sge(s);
                    n += 1;
                }
                let mut w = send_wr(wr, sges.as_mut_ptr(), n);
                let mut bad: *mut ibv_send_wr = ptr::null_mut();
                // SAFETY: qp is valid; the WR and its SGE list live on this frame for the
                // whole call (the provider copies WRs into its send queue).
                let rc = unsafe { rdma_sys::ibv_post_send(self.qp, &mut w, &mut bad) };
                self.post_result(rc, 0, 1)
            }
            _ => {
                // Each WR's SGEs that carry bytes (`carried`) gathered, its `ibv_send_wr`
                // built; then the chain. The SGE vector is reserved for the most SGEs the
                // list can carry first, so it does not move while the WRs point into it (and,
                // warm, allocates nothing: both vectors keep their capacity between posts).
                self.send_sges.clear();
                self.send_wrs.clear();
                self.send_sges
                    .reserve(wrs.iter().map(|wr| usize::from(wr.num_sge)).sum());
                let sge_base = self.send_sges.as_mut_ptr();
                for wr in wrs {
                    let start = self.send_sges.len();
                    self.send_sges.extend(carried(wr).map(sge));
                    let n = self.send_sges.len() - start;
                    // start + n <= send_sges.len(), within the capacity reserved above: the
                    // pointer stays inside the vector, which does not move while the list is
                    // built
                    self.send_wrs
                        .push(send_wr(wr, sge_base.wrapping_add(start), n));
                }
                let base = self.send_wrs.as_mut_ptr();
                for i in 1..self.send_wrs.len() {
                    // SAFETY: i - 1 and i are in bounds; base points at the vector's live
                    // elements.
                    unsafe { (*base.add(i - 1)).next = base.add(i) };
                }
                let mut bad: *mut ibv_send_wr = ptr::null_mut();
                // SAFETY: qp is valid; the chain and its SGE lists live in our vectors, which
                // are not touched until the call returns (the provider copies WRs into its
                // send queue).
                let rc = unsafe { rdma_sys::ibv_post_send(self.qp, base, &mut bad) };
                let posted = if rc == 0 {
                    0
                } else {
                    index_in(base, bad, wrs.len())
                };
                self.post_result(rc, posted, wrs.len())
            }
        }
    }

    fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<(), TransportError> {
        if wrs.is_empty() {
            return Ok(());
        }
        self.recv_sges.clear();
        self.recv_sges.extend(wrs.iter().map(|w| sge(&w.sge)));
        self.recv_wrs.clear();
        let sge_base = self.recv_sges.as_mut_ptr();
        for (i, wr) in wrs.iter().enumerate() {
            let with_sge = wr.sge.length > 0;
            self.recv_wrs.push(ibv_recv_wr {
                wr_id: wr.wr_id,
                next: ptr::null_mut(),
                // i < recv_sges.len(): the pointer stays inside the vector
                sg_list: if with_sge {
                    sge_base.wrapping_add(i)
                } else {
                    ptr::null_mut()
                },
                num_sge: i32::from(with_sge),
            });
        }
        let base = self.recv_wrs.as_mut_ptr();
        for i in 1..self.recv_wrs.len() {
            // SAFETY: i - 1 and i are in bounds.
            unsafe { (*base.add(i - 1)).next = base.add(i) };
        }
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: qp is valid; the chain and SGEs live in our vectors for the whole call.
        let rc = unsafe { rdma_sys::ibv_post_recv(self.qp, base, &mut bad) };
        self.counters.post_recv_calls += 1;
        let posted = if rc == 0 {
            wrs.len()
        } else {
            index_in(base, bad, wrs.len())
        };
        self.counters.recv_wrs_posted += posted as u64;
        if rc == 0 {
            return Ok(());
        }
        Err(post_error(
            "ibv_post_recv",
            rc,
            posted,
            wrs.len(),
            self.cfg.max_recv_wr,
            self.qpn,
        ))
    }

    /// Most polls find the CQ empty (every pending `test` polls): that answer is one
    /// provider call in a small frame; converting what a poll found is
    /// `take_wcs`, out of line.
    fn poll_cq(&mut self, out: &mut Vec<Wc>, max: usize) -> Result<usize, TransportError> {
        if max == 0 {
            return Ok(0);
        }
        let n = self.poll_batch(max);
        if n == 0 {
            return Ok(0);
        }
        self.take_wcs(out, max, n)
    }

    /// Writes [`GOODBYE`] on the set-up stream without blocking (8 bytes into an idle socket:
    /// in practice always whole). WRs already posted are left to the QP's destruction.
    fn goodbye(&mut self) {
        if self.said_goodbye {
            return;
        }
        let Some(s) = &self.oob else {
            return;
        };
        self.said_goodbye = true;
        let mut off = 0;
        while off < GOODBYE.len() {
            match (&*s).write(&GOODBYE[off..]) {
                Ok(0) => break,
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    debug!(qp_num = self.qpn, "goodbye on the set-up stream: {e}");
                    break;
                }
            }
        }
        debug!(
            qp_num = self.qpn,
            bytes = off,
            "goodbye sent on the set-up stream"
        );
    }

    fn peer_closed(&self) -> bool {
        if !self.peer_gone.get() && self.read_oob() {
            self.peer_gone.set(true);
            self.flush_on_peer_gone();
        }
        self.peer_gone.get()
    }

    fn peer_closed_orderly(&self) -> bool {
        self.peer_closed() && self.peer_orderly.get()
    }

    fn peer_gone_reason(&self) -> Option<&'static str> {
        self.peer_silent.get().then_some(PEER_SILENT)
    }

    fn counters(&self) -> QpCounters {
        self.counters
    }

    fn max_inline_data(&self) -> u32 {
        self.max_inline_data
    }
}

/// The goodbye marker a QP writes on the set-up stream before its owner drops it
/// ([`QueuePair::goodbye`]); the peer's [`QueuePair::peer_closed`] reads it. Nothing else
/// travels on that stream after the handshake, so an older peer (which drops what it reads
/// there) takes it for stray bytes and then sees the close as before.
pub const GOODBYE: [u8; 8] = *b"VNET-BYE";

impl Drop for IbQueuePair {
    fn drop(&mut self) {
        let verbs = self.pd.ctx.verbs;
        if !self.qp.is_null() {
            // SAFETY: qp came from ibv_create_qp and is destroyed once, before its CQ.
            let rc = unsafe { (verbs.destroy_qp)(self.qp) };
            if rc != 0 {
                warn!(qp_num = self.qpn, rc, "ibv_destroy_qp failed");
            }
        }
        if !self.cq.is_null() {
            // SAFETY: cq came from ibv_create_cq; the only QP using it is gone.
            let rc = unsafe { (verbs.destroy_cq)(self.cq) };
            if rc != 0 {
                warn!(qp_num = self.qpn, rc, "ibv_destroy_cq failed");
            }
        }
    }
}

fn link_layer_name(ll: u8) -> &'static str {
    if ll == LINK_LAYER_ETHERNET {
        "Ethernet (RoCE)"
    } else {
        "InfiniBand"
    }
}

impl IbQueuePair {
    /// What makes `wr` unpostable on this QP: an inline WR longer than `max_inline_data`, or
    /// an illegal READ ([`SendWr::bad_read`]).
    fn check_send(&self, wr: &SendWr) -> Result<(), TransportError> {
        if wr.inline && wr.byte_len() > u64::from(self.max_inline_data) {
            return Err(TransportError::Resource(format!(
                "ibv_post_send on QP {}: inline send WR {:#x} of {} bytes exceeds the QP's \
                 max_inline_data {}",
                self.qpn,
                wr.wr_id,
                wr.byte_len(),
                self.max_inline_data
            )));
        }
        if let Some(why) = wr.bad_read() {
            return Err(TransportError::Resource(format!(
                "ibv_post_send on QP {}: send WR {:#x}: {why}",
                self.qpn, wr.wr_id
            )));
        }
        Ok(())
    }

    /// The result of an `ibv_post_send` of `total` WRs that returned `rc`, `posted` of them
    /// taken before the failure.
    fn post_result(&self, rc: i32, posted: usize, total: usize) -> Result<(), TransportError> {
        if rc == 0 {
            return Ok(());
        }
        Err(post_error(
            "ibv_post_send",
            rc,
            posted,
            total,
            self.cfg.max_send_wr,
            self.qpn,
        ))
    }
}

/// The `ibv_send_wr` of `wr`, its `n` carried SGEs at `sges` (not followed: the pointer is
/// only stored; NULL when `n` is 0), unchained.
fn send_wr(wr: &SendWr, sges: *mut ibv_sge, n: usize) -> ibv_send_wr {
    // SAFETY: ibv_send_wr is plain data (unions of integers/pointers); all-zero is valid.
    let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
    w.wr_id = wr.wr_id;
    w.num_sge = n as i32;
    w.sg_list = if n == 0 { ptr::null_mut() } else { sges };
    if wr.signaled {
        w.send_flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    if wr.inline {
        // the provider copies the bytes into the WQE during the post
        w.send_flags |= ibv_send_flags::IBV_SEND_INLINE.0;
    }
    match wr.opcode {
        SendOpcode::Send => w.opcode = ibv_wr_opcode::IBV_WR_SEND,
        SendOpcode::RdmaWrite { remote_addr, rkey } => {
            w.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            w.wr.rdma.remote_addr = remote_addr;
            w.wr.rdma.rkey = rkey;
        }
        SendOpcode::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        } => {
            w.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
            w.wr.rdma.remote_addr = remote_addr;
            w.wr.rdma.rkey = rkey;
            // verbs carry the immediate in network byte order
            w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        }
        SendOpcode::RdmaRead { remote_addr, rkey } => {
            w.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
            w.wr.rdma.remote_addr = remote_addr;
            w.wr.rdma.rkey = rkey;
        }
    }
    w
}

/// The verbs SGE of `s`.
fn sge(s: &Sge) -> ibv_sge {
    ibv_sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey,
    }
}

/// The SGEs of `wr` that carry bytes (zero-length ones are not posted: they carry nothing and
/// need no key).
fn carried(wr: &SendWr) -> impl Iterator<Item = &Sge> {
    wr.sges().iter().filter(|s| s.length > 0)
}

/// Position of `bad` in the chain starting at `base` (= WRs posted before the failure).
fn index_in<T>(base: *mut T, bad: *mut T, len: usize) -> usize {
    if bad.is_null() {
        return 0;
    }
    let off = (bad as usize).wrapping_sub(base as usize) / std::mem::size_of::<T>();
    off.min(len)
}

fn post_error(
    op: &str,
    rc: i32,
    posted: usize,
    total: usize,
    depth: u32,
    qpn: u32,
) -> TransportError {
    let source = io::Error::from_raw_os_error(rc.abs());
    if rc.abs() == libc::ENOMEM {
        return TransportError::Resource(format!(
            "{op} on QP {qpn}: queue full (depth {depth}); {posted} of {total} WRs were posted"
        ));
    }
    TransportError::Io {
        op: format!("{op} on QP {qpn} ({posted} of {total} WRs posted)"),
        source,
    }
}

fn io_err(op: String) -> TransportError {
    TransportError::Io {
        op,
        source: io::Error::last_os_error(),
    }
}

/// A random 24-bit initial PSN.
fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: b is a valid 4-byte buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let v = if n == 4 {
        u32::from_le_bytes(b)
    } else {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        t ^ std::process::id().rotate_left(16)
    };
    v & 0xff_ffff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_is_24_bits() {
        for _ in 0..100 {
            assert!(random_psn() <= 0xff_ffff);
        }
    }
}
