//! One conformance suite of verbs behaviour, written against [`Device`], [`QueuePair`] and
//! [`MemoryRegion`] only, run against every transport.
//!
//! Each test is a `pub fn(&Transport)`: it connects two QPs through a loopback TCP stream (the
//! handshake's out-of-band stream), posts work requests and asserts the exact completions and
//! the exact bytes in memory that the RC semantics of `plugin/transport/mod.rs` promise. Where
//! a transport legitimately differs (a quirk of rxe, counters verbs do not keep per QP), the
//! test says so with an explicit per-transport expectation and a comment naming the quirk.
//!
//! [`transport_conformance!`](crate::transport_conformance) turns the suite into `#[test]`
//! functions for one transport; `tests/transport_conformance.rs` instantiates it for `tcp`
//! (runs on every host) and `ib` (runs where a verbs device exists, e.g. `rxe0` in the
//! soft-RoCE VM; elsewhere each test prints a `SKIP` line and passes). A new transport adds a
//! constructor like [`tcp`] and one more `mod` in that file.
//!
//! The fixture ([`Pair`], [`Buf`], the WR builders) is also what the tcp transport's own tests
//! (wire format, hostile peers, registry rules) use.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::mem::Region;
use crate::transport::{
    self, Device, DeviceRnrCounters, Kind, MemoryRegion, QpConfig, QpCounters, QueuePair, RecvWr,
    SendOpcode, SendWr, Sge, TransportError, Wc, WcOpcode, WcStatus,
};

/// Where the RNR NAK counts a test checks come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RnrCounting {
    /// The transport counts per QP ([`QpCounters`]' `rnr_naks_*`): tcp.
    PerQp,
    /// Only the device counts (verbs keep no per-QP RNR counters: `Device::rnr_counters`, rxe's
    /// sysfs `hw_counters`). Device-wide, so such a suite must run one test at a time.
    DeviceWide,
}

/// A transport under test: its devices and how to wait on it.
pub struct Transport {
    /// Which transport (per-transport expectations match on it).
    pub kind: Kind,
    /// The device pairs a two-QP test runs over, in turn: both ends on one device, and (where
    /// the transport has two) one end on each.
    pub device_pairs: Vec<(Arc<dyn Device>, Arc<dyn Device>)>,
    /// How long a fixture waits for an awaited state before it declares a hang (polling,
    /// sleeping briefly when a poll found nothing). Every transport moves data by itself, as
    /// a NIC does (tcp: its progress thread), so waiting is by the clock, not by polls.
    pub deadline: Duration,
    /// How long [`Pair::settle`] keeps polling to show that nothing more arrives.
    pub settle: Duration,
    /// Where RNR counts come from.
    pub rnr: RnrCounting,
    /// The device is soft-RoCE (`rdma_rxe`): the expectations its quirks change apply.
    pub rxe: bool,
}

impl Transport {
    /// The first device pair (both ends on one device).
    pub fn one_device(&self) -> (Arc<dyn Device>, Arc<dyn Device>) {
        self.device_pairs[0].clone()
    }

    /// Runs `f` over each device pair.
    pub fn each_device_pair(&self, mut f: impl FnMut(&Arc<dyn Device>, &Arc<dyn Device>)) {
        for (a, b) in &self.device_pairs {
            f(a, b);
        }
    }
}

/// The tcp transport: `tcp0` alone, then `tcp0` and `tcp1`; a hang after 30 s.
pub fn tcp() -> Transport {
    let d: Arc<dyn Device> = Arc::new(transport::tcp::TcpDevice::new(0));
    let d0: Arc<dyn Device> = Arc::new(transport::tcp::TcpDevice::new(0));
    let d1: Arc<dyn Device> = Arc::new(transport::tcp::TcpDevice::new(1));
    Transport {
        kind: Kind::Tcp,
        device_pairs: vec![(d.clone(), d), (d0, d1)],
        deadline: Duration::from_secs(30),
        settle: Duration::from_millis(50),
        rnr: RnrCounting::PerQp,
        rxe: false,
    }
}

/// Polls before a tcp white-box test that drives one QP against a raw socket declares
/// livelock (its peer is not a QP: only its own polls move it).
pub const MAX_POLLS: usize = 10_000;

/// The ib transport on `VERBSNET_TEST_IB_HCA` (default `rxe0`), or `None` after a
/// `SKIP <test>: ...` line when this host has no such verbs device (or no libibverbs).
/// Both ends use the one port (rxe loops the packets back).
pub fn ib(test: &str) -> Option<Transport> {
    let hca = std::env::var("VERBSNET_TEST_IB_HCA").unwrap_or_else(|_| "rxe0".to_owned());
    let cfg = Config {
        ib_hca: Some(format!("={hca}")),
        ..Config::default()
    };
    let dev = match transport::ib::open_devices(&cfg) {
        Ok(mut devs) if !devs.is_empty() => devs.remove(0),
        Ok(_) => {
            println!("SKIP {test}: no verbs device {hca} on this host");
            return None;
        }
        Err(TransportError::Unavailable(m)) => {
            println!("SKIP {test}: {m}");
            return None;
        }
        Err(e) => panic!("open_devices: {e}"),
    };
    let rxe = dev.props().name.starts_with("rxe");
    Some(Transport {
        kind: Kind::Ib,
        device_pairs: vec![(dev.clone(), dev)],
        deadline: Duration::from_secs(30),
        settle: Duration::from_millis(50),
        rnr: RnrCounting::DeviceWide,
        rxe,
    })
}

/// The QP settings of the suite: 1024-deep queues, RNR timer 0.01 ms (rxe rounds it up to one
/// jiffy), RNR retries forever, ACK timeout 4.096 us * 2^12 (16.8 ms) and 3 transport retries
/// (not 7: rxe retries for ever when `retry_cnt` is 7, so a dead peer would never fail a WR),
/// set-up socket keepalive 20 s (the plugin's default).
pub fn qp_cfg() -> QpConfig {
    QpConfig {
        max_recv_wr: 1024,
        max_send_wr: 1024,
        min_rnr_timer: 1,
        rnr_retry: 7,
        timeout: 12,
        retry_cnt: 3,
        traffic_class: 0,
        service_level: 0,
        oob_keepalive: Some(Duration::from_secs(20)),
        max_inline_data: 256,
    }
}

/// A connected pair of non-blocking loopback streams.
pub fn stream_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let a = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (b, _) = listener.accept().expect("accept");
    a.set_nonblocking(true).expect("nonblocking");
    b.set_nonblocking(true).expect("nonblocking");
    (a, b)
}

/// A registered buffer.
pub struct Buf {
    /// The memory (read and written only by copies: a peer may write it).
    pub region: Region,
    /// Its registration; dropping it deregisters.
    pub mr: Arc<dyn MemoryRegion>,
}

impl Buf {
    /// `len` zeroed bytes registered on `dev`.
    pub fn new(dev: &dyn Device, len: usize) -> Buf {
        let region = Region::alloc(len);
        let mr = dev.reg_mr(region.clone()).expect("reg_mr");
        Buf { region, mr }
    }

    /// `len` bytes of [`pattern`]`(i, seed)` registered on `dev`.
    pub fn filled(dev: &dyn Device, len: usize, seed: u8) -> Buf {
        let b = Buf::new(dev, len);
        let data: Vec<u8> = (0..len).map(|i| pattern(i, seed)).collect();
        b.region.write(0, &data).expect("fill");
        b
    }

    /// A copy of every byte.
    pub fn bytes(&self) -> Vec<u8> {
        let mut v = vec![0; self.region.len()];
        self.region.read(0, &mut v).expect("read");
        v
    }

    /// Address of byte `off`.
    pub fn addr(&self, off: usize) -> u64 {
        self.region.addr() + off as u64
    }

    /// An SGE over `[off, off + len)`.
    pub fn sge(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.addr(off),
            length: len,
            lkey: self.mr.keys().lkey,
        }
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.mr.keys().rkey
    }
}

/// The fill byte at offset `i` for `seed` (period 251, so no power-of-two alignment hides a
/// misplaced copy).
pub fn pattern(i: usize, seed: u8) -> u8 {
    ((i * 7 + 13 + usize::from(seed) * 31) % 251) as u8
}

/// A send WR with up to two SGEs.
pub fn send_wr(wr_id: u64, sges: &[Sge], opcode: SendOpcode, signaled: bool) -> SendWr {
    let mut sgl = [Sge::default(); 2];
    sgl[..sges.len()].copy_from_slice(sges);
    SendWr {
        wr_id,
        sgl,
        num_sge: sges.len() as u8,
        opcode,
        signaled,
        inline: false,
    }
}

/// A signaled SEND.
pub fn send(wr_id: u64, sges: &[Sge]) -> SendWr {
    send_wr(wr_id, sges, SendOpcode::Send, true)
}

/// A signaled RDMA WRITE of `sges` to `remote_addr`.
pub fn write(wr_id: u64, sges: &[Sge], remote_addr: u64, rkey: u32, signaled: bool) -> SendWr {
    send_wr(
        wr_id,
        sges,
        SendOpcode::RdmaWrite { remote_addr, rkey },
        signaled,
    )
}

/// A receive WR.
pub fn recv(wr_id: u64, sge: Sge) -> RecvWr {
    RecvWr { wr_id, sge }
}

/// A successful completion.
pub fn ok(wr_id: u64, opcode: WcOpcode, byte_len: u32, imm: Option<u32>) -> Wc {
    Wc {
        wr_id,
        status: WcStatus::Success,
        opcode,
        byte_len,
        imm,
    }
}

/// An error completion.
pub fn err(wr_id: u64, status: WcStatus, opcode: WcOpcode) -> Wc {
    Wc {
        wr_id,
        status,
        opcode,
        byte_len: 0,
        imm: None,
    }
}

/// RNR NAKs seen since a [`Pair`] was created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RnrSeen {
    /// NAKs received by requesters (both QPs, or the whole device).
    pub received: u64,
    /// NAKs sent by responders.
    pub sent: u64,
    /// Per-QP counters `(a, b)` where the transport keeps them ([`RnrCounting::PerQp`]).
    pub per_qp: Option<(QpCounters, QpCounters)>,
}

/// Two QPs and the completions each has produced so far.
pub struct Pair<'t> {
    /// The transport.
    pub t: &'t Transport,
    /// QP "a" (usually the requester).
    pub a: Box<dyn QueuePair>,
    /// QP "b".
    pub b: Box<dyn QueuePair>,
    /// Completions of `a`, in order.
    pub wa: Vec<Wc>,
    /// Completions of `b`, in order.
    pub wb: Vec<Wc>,
    devs: Vec<Arc<dyn Device>>,
    rnr0: Vec<DeviceRnrCounters>,
}

impl<'t> Pair<'t> {
    /// QPs created on `da` and `db` but not established (receives may be posted first).
    pub fn create(
        t: &'t Transport,
        da: &Arc<dyn Device>,
        db: &Arc<dyn Device>,
        ca: &QpConfig,
        cb: &QpConfig,
    ) -> Pair<'t> {
        let a = da.create_qp(ca).expect("create_qp a");
        let b = db.create_qp(cb).expect("create_qp b");
        let mut devs = vec![da.clone()];
        if !Arc::ptr_eq(da, db) {
            devs.push(db.clone());
        }
        Pair::from_qps(t, a, b, devs)
    }

    /// Wraps two QPs the caller made (`devs`: their devices, for device-wide counters).
    pub fn from_qps(
        t: &'t Transport,
        a: Box<dyn QueuePair>,
        b: Box<dyn QueuePair>,
        devs: Vec<Arc<dyn Device>>,
    ) -> Pair<'t> {
        let rnr0 = devs.iter().map(|d| d.rnr_counters()).collect();
        Pair {
            t,
            a,
            b,
            wa: Vec::new(),
            wb: Vec::new(),
            devs,
            rnr0,
        }
    }

    /// Exchanges `local_info`, establishes both QPs over a fresh loopback stream pair and
    /// completes the handshake (the QPs now progress on their own).
    pub fn connect(mut self) -> Pair<'t> {
        let (sa, sb) = stream_pair();
        let ia = self.a.local_info();
        let ib = self.b.local_info();
        assert!(
            ia.len() <= 256 && ib.len() <= 256,
            "local_info over 256 bytes"
        );
        self.a.establish(&ib, sa).expect("establish a");
        self.b.establish(&ia, sb).expect("establish b");
        self.a.handshake_complete();
        self.b.handshake_complete();
        self
    }

    /// Connects the two QPs as data QPs ([`QueuePair::listen_data`] on `a`, the side that
    /// listens, as a connection's sender; [`QueuePair::establish_data`] on `b` first, as the
    /// receiver does before its reply, then on `a`) and completes the handshake.
    pub fn connect_data(mut self) -> Pair<'t> {
        self.a
            .listen_data(std::net::Ipv4Addr::LOCALHOST.into())
            .expect("listen_data a");
        let ia = self.a.local_info();
        let ib = self.b.local_info();
        assert!(
            ia.len() <= 256 && ib.len() <= 256,
            "local_info over 256 bytes"
        );
        self.b.establish_data(&ia).expect("establish_data b");
        self.a.establish_data(&ib).expect("establish_data a");
        self.a.handshake_complete();
        self.b.handshake_complete();
        self
    }

    /// A connected pair with [`qp_cfg`] on both ends.
    pub fn new(t: &'t Transport, da: &Arc<dyn Device>, db: &Arc<dyn Device>) -> Pair<'t> {
        Pair::create(t, da, db, &qp_cfg(), &qp_cfg()).connect()
    }

    /// One poll of each end (at most 16 completions each).
    pub fn poll(&mut self) {
        let na = self.a.poll_cq(&mut self.wa, 16).expect("poll a");
        let nb = self.b.poll_cq(&mut self.wb, 16).expect("poll b");
        assert!(na <= 16 && nb <= 16, "poll_cq returned more than max");
    }

    /// Polls both ends until `done`; panics with both completion lists after the transport's
    /// deadline.
    pub fn drive(&mut self, what: &str, done: impl Fn(&Pair) -> bool) {
        let t0 = Instant::now();
        let mut polls = 0usize;
        loop {
            let before = self.wa.len() + self.wb.len();
            self.poll();
            if done(self) {
                return;
            }
            polls += 1;
            if self.wa.len() + self.wb.len() == before {
                std::thread::sleep(Duration::from_micros(50));
            }
            if t0.elapsed() > self.t.deadline {
                panic!(
                    "no progress waiting for {what} ({polls} polls, {:?}): a={:?} b={:?} \
                     counters a={:?} b={:?} rnr={:?}",
                    t0.elapsed(),
                    self.wa,
                    self.wb,
                    self.a.counters(),
                    self.b.counters(),
                    self.rnr()
                );
            }
        }
    }

    /// Polls until each side has at least the given number of completions.
    pub fn drive_to(&mut self, na: usize, nb: usize) {
        self.drive(&format!("{na}/{nb} completions"), |p| {
            p.wa.len() >= na && p.wb.len() >= nb
        });
    }

    /// Keeps polling for a while (to show that nothing else arrives).
    pub fn settle(&mut self) {
        let t0 = Instant::now();
        while t0.elapsed() < self.t.settle {
            self.poll();
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// RNR NAKs since the pair was created.
    pub fn rnr(&self) -> RnrSeen {
        match self.t.rnr {
            RnrCounting::PerQp => {
                let (ca, cb) = (self.a.counters(), self.b.counters());
                RnrSeen {
                    received: ca.rnr_naks_received + cb.rnr_naks_received,
                    sent: ca.rnr_naks_sent + cb.rnr_naks_sent,
                    per_qp: Some((ca, cb)),
                }
            }
            RnrCounting::DeviceWide => {
                let (mut received, mut sent) = (0, 0);
                for (d, c0) in self.devs.iter().zip(&self.rnr0) {
                    let c = d.rnr_counters();
                    let delta = |now: Option<u64>, then: Option<u64>, what: &str| match (now, then)
                    {
                        (Some(n), Some(t)) => n - t,
                        _ => panic!(
                            "{}: the device has no {what} counter ({c:?}), so the suite cannot \
                             check RNR behaviour",
                            d.props().name
                        ),
                    };
                    received += delta(c.rcvd_rnr_err, c0.rcvd_rnr_err, "rcvd_rnr_err");
                    sent += delta(c.send_rnr_err, c0.send_rnr_err, "send_rnr_err");
                }
                RnrSeen {
                    received,
                    sent,
                    per_qp: None,
                }
            }
        }
    }
}

/// The completions of `wcs` whose `wr_id` is in `ids` (one queue's WRs), in order.
fn only(wcs: &[Wc], ids: &[u64]) -> Vec<Wc> {
    wcs.iter()
        .filter(|w| ids.contains(&w.wr_id))
        .copied()
        .collect()
}

/// What of a completion a transport defines. tcp: every field. Verbs: in an error
/// completion only `wr_id` and `status` (with `qp_num` and `vendor_err`) are valid
/// (ibv_poll_cq(3)); `opcode`, `byte_len` and the immediate are not (rxe reports e.g.
/// `IBV_WC_SEND` for a failed RDMA WRITE and for a flushed receive), so they are not compared.
fn defined(t: &Transport, w: &Wc) -> Wc {
    match (t.kind, w.status) {
        (Kind::Ib, s) if s != WcStatus::Success => Wc {
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm: None,
            ..*w
        },
        _ => *w,
    }
}

/// Asserts that `got` are exactly the completions `want`, comparing what the transport
/// defines ([`defined`]).
#[track_caller]
fn check(t: &Transport, got: &[Wc], want: &[Wc], what: &str) {
    let g: Vec<Wc> = got.iter().map(|w| defined(t, w)).collect();
    let w: Vec<Wc> = want.iter().map(|w| defined(t, w)).collect();
    assert_eq!(g, w, "{what}: got {got:?}");
}

/// Posts `wr` on `p.a` in the error state and returns its completion (the caller checks that
/// it is `WrFlush`). tcp must accept the WR; a verbs provider may instead refuse the post with
/// an error (some do), which returns `None`, never a silent drop.
fn post_send_on_error(p: &mut Pair, wr: SendWr) -> Option<Wc> {
    match p.a.post_send(&[wr]) {
        Ok(()) => {
            let n = p.wa.len();
            p.drive_to(n + 1, 0);
            Some(p.wa[n])
        }
        Err(e) => {
            assert_eq!(
                p.t.kind,
                Kind::Ib,
                "tcp accepts WRs in the error state: {e}"
            );
            None
        }
    }
}

/// The status of an SGE whose lkey names no registered region (a local SGE, or a receive WR's
/// SGE at the responder): `LocalProtection` (IBV_WC_LOC_PROT_ERR); rxe (6.1) reports
/// `LocalQpOperation` (IBV_WC_LOC_QP_OP_ERR) for an unknown lkey (but `LocalProtection` for
/// a range outside a known region).
fn unknown_lkey(t: &Transport) -> WcStatus {
    if t.rxe {
        WcStatus::LocalQpOperation
    } else {
        WcStatus::LocalProtection
    }
}

// ------------------------------------------------------------------------------------------
// The suite. Each test is listed in `suite!` at the bottom.

/// A SEND lands in the receive WR posted before `establish`, at its offset, nothing around it
/// written; `byte_len` is the message length; no RNR, no peer close; the receive counters
/// count one call and one WR.
pub fn send_lands_in_posted_recv(t: &Transport) {
    t.each_device_pair(|da, db| {
        let src = Buf::filled(&**da, 100, 1);
        let dst = Buf::new(&**db, 128);
        let mut p = Pair::create(t, da, db, &qp_cfg(), &qp_cfg());
        // Posted before establish: honoured.
        p.b.post_recv(&[recv(0xb0, dst.sge(8, 120))])
            .expect("post_recv");
        let mut p = p.connect();
        p.a.post_send(&[send(0xa0, &[src.sge(0, 100)])])
            .expect("post_send");
        p.drive_to(1, 1);
        p.settle();
        assert_eq!(p.wa, [ok(0xa0, WcOpcode::Send, 0, None)]);
        assert_eq!(p.wb, [ok(0xb0, WcOpcode::Recv, 100, None)]);
        let got = dst.bytes();
        assert_eq!(&got[8..108], &src.bytes()[..]);
        assert!(got[..8].iter().chain(&got[108..]).all(|&x| x == 0));
        assert!(!p.a.peer_closed() && !p.b.peer_closed());
        assert_eq!(p.b.counters().post_recv_calls, 1);
        assert_eq!(p.b.counters().recv_wrs_posted, 1);
        assert_eq!(p.rnr().sent, 0);
    });
}

/// A SEND gathers two SGEs (header + payload, as the engine's eager path posts) into one
/// message.
pub fn send_gathers_two_sges(t: &Transport) {
    t.each_device_pair(|da, db| {
        let s1 = Buf::filled(&**da, 64, 2);
        let s2 = Buf::filled(&**da, 64, 3);
        let dst = Buf::new(&**db, 64);
        let mut p = Pair::new(t, da, db);
        p.b.post_recv(&[recv(1, dst.sge(0, 64))])
            .expect("post_recv");
        p.a.post_send(&[send(2, &[s1.sge(3, 10), s2.sge(20, 25)])])
            .expect("post_send");
        p.drive_to(1, 1);
        assert_eq!(p.wa, [ok(2, WcOpcode::Send, 0, None)]);
        assert_eq!(p.wb, [ok(1, WcOpcode::Recv, 35, None)]);
        let mut want = s1.bytes()[3..13].to_vec();
        want.extend_from_slice(&s2.bytes()[20..45]);
        assert_eq!(&dst.bytes()[..35], &want[..]);
        assert!(dst.bytes()[35..].iter().all(|&x| x == 0));
    });
}

/// RDMA WRITE (unsignaled: no completion) and WRITE_WITH_IMM land at their remote addresses
/// (up to the last byte of the region); the immediate comes back in host order in a receive
/// completion with `byte_len` = write length, and needs no receive buffer: the receive WR's
/// own buffer stays untouched, and a zero-length receive WR (as NCCL posts them) absorbs one.
pub fn rdma_write_and_write_with_imm_land_in_place(t: &Transport) {
    t.each_device_pair(|da, db| {
        let src = Buf::filled(&**da, 4096, 4);
        let dst = Buf::new(&**db, 8192);
        let bounce = Buf::new(&**db, 16);
        let mut p = Pair::new(t, da, db);
        p.b.post_recv(&[recv(0x77, bounce.sge(0, 16)), recv(0x78, Sge::default())])
            .expect("post_recv");
        let imm = |wr_id, sge, off, imm| {
            send_wr(
                wr_id,
                &[sge],
                SendOpcode::RdmaWriteWithImm {
                    remote_addr: dst.addr(off),
                    rkey: dst.rkey(),
                    imm,
                },
                true,
            )
        };
        p.a.post_send(&[
            write(1, &[src.sge(0, 1000)], dst.addr(100), dst.rkey(), false),
            imm(2, src.sge(1000, 3000), 5000, 0xcafe_babe),
            write(3, &[src.sge(0, 10)], dst.addr(8182), dst.rkey(), true),
            imm(4, src.sge(2000, 900), 4000, 0xdead_beef),
        ])
        .expect("post_send");
        p.drive_to(3, 2);
        p.settle();
        assert_eq!(
            p.wa,
            [
                ok(2, WcOpcode::RdmaWrite, 0, None),
                ok(3, WcOpcode::RdmaWrite, 0, None),
                ok(4, WcOpcode::RdmaWrite, 0, None)
            ]
        );
        assert_eq!(
            p.wb,
            [
                ok(0x77, WcOpcode::RecvRdmaWithImm, 3000, Some(0xcafe_babe)),
                ok(0x78, WcOpcode::RecvRdmaWithImm, 900, Some(0xdead_beef))
            ]
        );
        let got = dst.bytes();
        let s = src.bytes();
        assert!(got[..100].iter().all(|&x| x == 0));
        assert_eq!(&got[100..1100], &s[..1000]);
        assert!(got[1100..4000].iter().all(|&x| x == 0));
        assert_eq!(&got[4000..4900], &s[2000..2900]);
        assert!(got[4900..5000].iter().all(|&x| x == 0));
        assert_eq!(&got[5000..8000], &s[1000..4000]);
        assert!(got[8000..8182].iter().all(|&x| x == 0));
        assert_eq!(&got[8182..], &s[..10]);
        assert!(
            bounce.bytes().iter().all(|&x| x == 0),
            "imm needs no buffer"
        );
    });
}

/// A signaled RDMA READ of `len` bytes at the peer's `remote_addr` into `dst`.
pub fn read(wr_id: u64, dst: Sge, remote_addr: u64, rkey: u32) -> SendWr {
    send_wr(
        wr_id,
        &[dst],
        SendOpcode::RdmaRead { remote_addr, rkey },
        true,
    )
}

/// RDMA READs bring the peer's bytes into the local SGE, see a WRITE posted before them on
/// the same QP, and complete with the bytes read (a zero-length one too), while the peer's
/// owner never polls (the NIC, or tcp's progress, answers); the peer gets no completion.
pub fn rdma_read_brings_the_peers_bytes_and_sees_earlier_writes(t: &Transport) {
    t.each_device_pair(|da, db| {
        let src = Buf::filled(&**da, 1000, 8);
        let dst = Buf::new(&**da, 8192);
        let remote = Buf::filled(&**db, 8192, 9);
        let before = remote.bytes();
        let p = Pair::new(t, da, db);
        let Pair { mut a, mut b, .. } = p;
        a.post_send(&[
            write(
                1,
                &[src.sge(0, 1000)],
                remote.addr(100),
                remote.rkey(),
                false,
            ),
            read(2, dst.sge(0, 2000), remote.addr(0), remote.rkey()),
            read(3, dst.sge(4000, 0), remote.addr(0), remote.rkey()),
            read(4, dst.sge(6000, 100), remote.addr(8092), remote.rkey()),
        ])
        .expect("post_send");
        let mut wa = Vec::new();
        wait_one(t, &mut *a, &mut wa, "three READs", |_, wa| wa.len() >= 3);
        assert_eq!(
            wa,
            [
                ok(2, WcOpcode::RdmaRead, 2000, None),
                ok(3, WcOpcode::RdmaRead, 0, None),
                ok(4, WcOpcode::RdmaRead, 100, None)
            ]
        );
        let got = dst.bytes();
        let s = src.bytes();
        assert_eq!(&got[..100], &before[..100]);
        assert_eq!(&got[100..1100], &s[..], "the READ sees the WRITE before it");
        assert_eq!(&got[1100..2000], &before[1100..2000]);
        assert!(got[2000..6000].iter().all(|&x| x == 0));
        assert_eq!(&got[6000..6100], &before[8092..]);
        assert!(got[6100..].iter().all(|&x| x == 0));
        let mut wb = Vec::new();
        b.poll_cq(&mut wb, 16).expect("poll b");
        assert!(
            wb.is_empty(),
            "a READ completes nothing at the peer: {wb:?}"
        );
    });
}

/// An RDMA READ with a bad rkey or past the region's end completes `RemoteAccess`, writes
/// nothing locally, and the WRs behind it flush.
pub fn rdma_read_outside_registered_memory_is_remote_access(t: &Transport) {
    let (da, db) = t.one_device();
    let remote = Buf::filled(&*db, 64, 10);
    let src = Buf::filled(&*da, 8, 11);
    for (name, remote_addr, rkey) in [
        ("bad rkey", remote.addr(0), remote.rkey().wrapping_add(1000)),
        ("out of bounds", remote.addr(32), remote.rkey()),
    ] {
        let dst = Buf::new(&*da, 64);
        let mut p = Pair::new(t, &da, &db);
        p.a.post_send(&[
            read(1, dst.sge(0, 64), remote_addr, rkey),
            send(2, &[src.sge(0, 8)]),
        ])
        .expect("post_send");
        p.drive_to(2, 0);
        p.settle();
        check(
            t,
            &p.wa,
            &[
                err(1, WcStatus::RemoteAccess, WcOpcode::RdmaRead),
                err(2, WcStatus::WrFlush, WcOpcode::Send),
            ],
            name,
        );
        assert!(dst.bytes().iter().all(|&x| x == 0), "{name}: nothing read");
    }
}

/// An inline RDMA READ, or one with two SGEs, fails the whole post (nothing of it runs); a
/// legal READ after it works.
pub fn rdma_read_breaking_its_rules_is_refused(t: &Transport) {
    let (da, db) = t.one_device();
    let remote = Buf::filled(&*db, 64, 12);
    let dst = Buf::new(&*da, 64);
    let mut p = Pair::new(t, &da, &db);
    let mut inline = read(1, dst.sge(0, 8), remote.addr(0), remote.rkey());
    inline.inline = true;
    let two = send_wr(
        2,
        &[dst.sge(0, 8), dst.sge(8, 8)],
        SendOpcode::RdmaRead {
            remote_addr: remote.addr(0),
            rkey: remote.rkey(),
        },
        true,
    );
    for (wr, why) in [(inline, "cannot be inline"), (two, "at most one SGE")] {
        match p.a.post_send(&[write(9, &[], 0, 0, true), wr]) {
            Err(TransportError::Resource(m)) => assert!(m.contains(why), "{m}"),
            other => panic!("an illegal READ was posted: {other:?}"),
        }
    }
    p.settle();
    assert!(
        p.wa.is_empty() && p.wb.is_empty(),
        "a={:?} b={:?}",
        p.wa,
        p.wb
    );
    p.a.post_send(&[read(3, dst.sge(0, 64), remote.addr(0), remote.rkey())])
        .expect("post_send");
    p.drive_to(1, 0);
    assert_eq!(p.wa, [ok(3, WcOpcode::RdmaRead, 64, None)]);
    assert_eq!(dst.bytes(), remote.bytes());
}

/// Zero-byte SEND, WRITE and WRITE_WITH_IMM succeed; zero-length writes check neither rkey
/// nor address (IB spec C9-88), and nothing is written.
pub fn zero_byte_messages(t: &Transport) {
    let (da, db) = t.one_device();
    let dst = Buf::new(&*db, 16);
    let mut p = Pair::new(t, &da, &db);
    p.b.post_recv(&[recv(1, dst.sge(0, 16)), recv(2, dst.sge(0, 16))])
        .expect("post_recv");
    p.a.post_send(&[
        send(10, &[]),
        write(11, &[], 0, 0x1234, true),
        send_wr(
            12,
            &[Sge {
                addr: 0,
                length: 0,
                lkey: 0,
            }],
            SendOpcode::RdmaWriteWithImm {
                remote_addr: 0,
                rkey: 0,
                imm: 5,
            },
            true,
        ),
    ])
    .expect("post_send");
    p.drive_to(3, 2);
    p.settle();
    assert_eq!(
        p.wa,
        [
            ok(10, WcOpcode::Send, 0, None),
            ok(11, WcOpcode::RdmaWrite, 0, None),
            ok(12, WcOpcode::RdmaWrite, 0, None)
        ]
    );
    assert_eq!(
        p.wb,
        [
            ok(1, WcOpcode::Recv, 0, None),
            ok(2, WcOpcode::RecvRdmaWithImm, 0, Some(5))
        ]
    );
    assert!(dst.bytes().iter().all(|&x| x == 0));
}

/// Unsignaled SENDs complete without a completion; the signaled one behind them completes.
pub fn unsignaled_sends_complete_silently(t: &Transport) {
    let (da, db) = t.one_device();
    let src = Buf::filled(&*da, 64, 5);
    let dst = Buf::new(&*db, 256);
    let mut p = Pair::new(t, &da, &db);
    let recvs: Vec<RecvWr> = (0..4)
        .map(|i| recv(i, dst.sge(64 * i as usize, 64)))
        .collect();
    p.b.post_recv(&recvs).expect("post_recv");
    let wrs: Vec<SendWr> = (0..4)
        .map(|i| send_wr(100 + i, &[src.sge(0, 64)], SendOpcode::Send, i == 3))
        .collect();
    p.a.post_send(&wrs).expect("post_send");
    p.drive_to(1, 4);
    p.settle();
    assert_eq!(p.wa, [ok(103, WcOpcode::Send, 0, None)]);
    let want: Vec<Wc> = (0..4).map(|i| ok(i, WcOpcode::Recv, 64, None)).collect();
    assert_eq!(p.wb, want);
    assert_eq!(&dst.bytes()[192..], &src.bytes()[..]);
}

/// An RDMA WRITE with a bad rkey, past the region's end or before its start completes
/// `RemoteAccess` (a remote error) even unsignaled, writes nothing, and puts both QPs in the
/// error state: the WRs behind it and later ones flush on both sides.
pub fn rdma_write_outside_registered_memory_is_remote_access(t: &Transport) {
    t.each_device_pair(|da, db| {
        let src = Buf::filled(&**da, 64, 6);
        let dst = Buf::filled(&**db, 64, 7);
        let before = dst.bytes();
        let bad_rkey = dst.rkey().wrapping_add(1000);
        for (name, remote_addr, rkey) in [
            ("bad rkey", dst.addr(0), bad_rkey),
            ("out of bounds", dst.addr(32), dst.rkey()),
            ("before the region", dst.addr(0) - 1, dst.rkey()),
        ] {
            let mut p = Pair::new(t, da, db);
            let bounce = Buf::new(&**db, 64);
            p.b.post_recv(&[recv(0xb1, bounce.sge(0, 64))])
                .expect("post_recv");
            p.a.post_send(&[
                // errors complete even unsignaled
                write(1, &[src.sge(0, 64)], remote_addr, rkey, false),
                send(2, &[src.sge(0, 8)]),
            ])
            .expect("post_send");
            p.drive_to(2, 1);
            p.settle();
            check(
                t,
                &p.wa,
                &[
                    err(1, WcStatus::RemoteAccess, WcOpcode::RdmaWrite),
                    err(2, WcStatus::WrFlush, WcOpcode::Send),
                ],
                name,
            );
            assert!(p.wa[0].status.is_remote());
            // The responder refused and entered the error state too.
            check(
                t,
                &p.wb,
                &[err(0xb1, WcStatus::WrFlush, WcOpcode::Recv)],
                name,
            );
            assert_eq!(dst.bytes(), before, "{name}: target untouched");
            assert!(bounce.bytes().iter().all(|&x| x == 0), "{name}");
            // Later WRs flush on both sides.
            if let Some(wc) = post_send_on_error(&mut p, send(3, &[src.sge(0, 8)])) {
                check(t, &[wc], &[err(3, WcStatus::WrFlush, WcOpcode::Send)], name);
            }
            p.b.post_recv(&[recv(0xb2, bounce.sge(0, 8))])
                .expect("post on error");
            let n = p.wb.len();
            if t.rxe {
                // rxe (6.1) flushes the receive WRs outstanding when the QP enters the error
                // state, but a receive WR posted afterwards is accepted and never completes
                // (later kernels flush it).
                p.settle();
                assert_eq!(p.wb.len(), n, "{name}: {:?}", p.wb);
            } else {
                p.drive_to(0, n + 1);
                check(
                    t,
                    &p.wb[n..],
                    &[err(0xb2, WcStatus::WrFlush, WcOpcode::Recv)],
                    name,
                );
            }
        }
    });
}

/// A WRITE_WITH_IMM past the region's end completes `RemoteAccess`; the responder consumes
/// its receive WR with an error, flushes the next and writes nothing.
pub fn write_with_imm_outside_registered_memory(t: &Transport) {
    let (da, db) = t.one_device();
    let src = Buf::filled(&*da, 64, 6);
    let dst = Buf::new(&*db, 32);
    let mut p = Pair::new(t, &da, &db);
    p.b.post_recv(&[recv(1, dst.sge(0, 32)), recv(2, dst.sge(0, 32))])
        .expect("post_recv");
    p.a.post_send(&[send_wr(
        9,
        &[src.sge(0, 64)],
        SendOpcode::RdmaWriteWithImm {
            remote_addr: dst.addr(0),
            rkey: dst.rkey(),
            imm: 1,
        },
        true,
    )])
    .expect("post_send");
    p.drive_to(1, 2);
    p.settle();
    check(
        t,
        &p.wa,
        &[err(9, WcStatus::RemoteAccess, WcOpcode::RdmaWrite)],
        "requester",
    );
    // rxe (6.1): the consumed receive WR completes with the status the responder NAKed
    // with, IBV_WC_REM_ACCESS_ERR, instead of a local one.
    let responder = if t.rxe {
        WcStatus::RemoteAccess
    } else {
        WcStatus::LocalProtection
    };
    check(
        t,
        &p.wb,
        &[
            err(1, responder, WcOpcode::Recv),
            err(2, WcStatus::WrFlush, WcOpcode::Recv),
        ],
        "responder",
    );
    assert!(dst.bytes().iter().all(|&x| x == 0));
}

/// A WRITE to a region whose registration was dropped completes `RemoteAccess` and writes
/// nothing (the memory itself is still allocated).
pub fn dropped_registration_is_refused(t: &Transport) {
    let (da, db) = t.one_device();
    let src = Buf::filled(&*da, 64, 8);
    let dst = Buf::new(&*db, 64);
    let (addr, rkey) = (dst.addr(0), dst.rkey());
    let region = dst.region.clone();
    drop(dst.mr);
    let mut p = Pair::new(t, &da, &db);
    p.a.post_send(&[write(1, &[src.sge(0, 64)], addr, rkey, true)])
        .expect("post_send");
    p.drive_to(1, 0);
    p.settle();
    check(
        t,
        &p.wa,
        &[err(1, WcStatus::RemoteAccess, WcOpcode::RdmaWrite)],
        "requester",
    );
    let mut v = vec![0; 64];
    region.read(0, &mut v).expect("read");
    assert!(v.iter().all(|&x| x == 0));
}

/// A local SGE with a wrong lkey, or past its region's end, completes `LocalProtection`; the
/// WR before it was delivered, the one after flushes; the peer sees only the good message.
pub fn unregistered_sge_is_local_protection(t: &Transport) {
    let (da, db) = t.one_device();
    let src = Buf::filled(&*da, 64, 9);
    let dst = Buf::new(&*db, 256);
    let mut p = Pair::new(t, &da, &db);
    p.b.post_recv(&[recv(1, dst.sge(0, 64)), recv(2, dst.sge(64, 64))])
        .expect("post_recv");
    let bad_lkey = Sge {
        lkey: src.mr.keys().lkey.wrapping_add(77),
        ..src.sge(0, 8)
    };
    let past_end = src.sge(60, 8);
    p.a.post_send(&[
        send(10, &[src.sge(0, 16)]),
        send(11, &[src.sge(0, 8), bad_lkey]),
        send(12, &[src.sge(0, 8)]),
    ])
    .expect("post_send");
    p.drive_to(3, 1);
    p.settle();
    check(
        t,
        &p.wa,
        &[
            ok(10, WcOpcode::Send, 0, None),
            err(11, unknown_lkey(t), WcOpcode::Send),
            err(12, WcStatus::WrFlush, WcOpcode::Send),
        ],
        "bad lkey",
    );
    assert_eq!(p.wb, [ok(1, WcOpcode::Recv, 16, None)]);
    assert_eq!(&dst.bytes()[..16], &src.bytes()[..16]);

    let mut p = Pair::new(t, &da, &db);
    p.a.post_send(&[send(20, &[past_end])]).expect("post_send");
    p.drive_to(1, 0);
    p.settle();
    check(
        t,
        &p.wa,
        &[err(20, WcStatus::LocalProtection, WcOpcode::Send)],
        "past the end",
    );
}

/// A SEND longer than the receive buffer: the responder's receive WR completes
/// `LocalLength`, the requester's `RemoteInvalidRequest`, both QPs flush the rest, and
/// nothing is written.
pub fn send_longer_than_recv_buffer(t: &Transport) {
    let (da, db) = t.one_device();
    let src = Buf::filled(&*da, 64, 10);
    let dst = Buf::new(&*db, 64);
    let mut p = Pair::new(t, &da, &db);
    p.b.post_recv(&[recv(1, dst.sge(0, 16)), recv(2, dst.sge(16, 48))])
        .expect("post_recv");
    p.a.post_send(&[send(5, &[src.sge(0, 32)]), send(6, &[src.sge(0, 4)])])
        .expect("post_send");
    p.drive_to(2, 2);
    p.settle();
    // rxe (6.1): the responder's copy of a too-long SEND fails like a malformed receive WQE
    // (rxe_resp.c), so it NAKs "remote operational error", not "invalid request".
    let requester = if t.rxe {
        WcStatus::RemoteOperation
    } else {
        WcStatus::RemoteInvalidRequest
    };
    check(
        t,
        &p.wa,
        &[
            err(5, requester, WcOpcode::Send),
            err(6, WcStatus::WrFlush, WcOpcode::Send),
        ],
        "requester",
    );
    // rxe (6.1): the responder's receive WR completes IBV_WC_LOC_QP_OP_ERR, not
    // IBV_WC_LOC_LEN_ERR (same malformed-WQE path as above).
    let responder = if t.rxe {
        WcStatus::LocalQpOperation
    } else {
        WcStatus::LocalLength
    };
    check(
        t,
        &p.wb,
        &[
            err(1, responder, WcOpcode::Recv),
            err(2, WcStatus::WrFlush, WcOpcode::Recv),
        ],
        "responder",
    );
    assert!(dst.bytes().iter().all(|&x| x == 0), "nothing written");
}

/// A receive WR whose SGE is not registered: the responder completes it `LocalProtection`,
/// the requester's SEND `RemoteOperation`, nothing is written.
pub fn recv_with_unregistered_buffer_is_remote_operation(t: &Transport) {
    let (da, db) = t.one_device();
    let src = Buf::filled(&*da, 64, 10);
    let dst = Buf::new(&*db, 64);
    let mut p = Pair::new(t, &da, &db);
    let bad = Sge {
        lkey: dst.mr.keys().lkey ^ 0x8000_0000,
        ..dst.sge(0, 64)
    };
    p.b.post_recv(&[recv(1, bad)]).expect("post_recv");
    p.a.post_send(&[send(5, &[src.sge(0, 32)])])
        .expect("post_send");
    p.drive_to(1, 1);
    p.settle();
    check(
        t,
        &p.wa,
        &[err(5, WcStatus::RemoteOperation, WcOpcode::Send)],
        "requester",
    );
    check(
        t,
        &p.wb,
        &[err(1, unknown_lkey(t), WcOpcode::Recv)],
        "responder",
    );
    assert!(dst.bytes().iter().all(|&x| x == 0));
}

/// A SEND with no receive WR posted is RNR NAKed and retried; the RDMA WRITE and the RDMA READ
/// behind it wait (RC ordering: the responder carries out nothing after the refused SEND until
/// it comes again); once a receive WR is posted all complete, in order, with the right bytes,
/// and the READ sees what the SEND and the WRITE before it wrote. Every NAK the responder sent,
/// the requester received.
pub fn rnr_then_recv_posted_later_completes(t: &Transport) {
    t.each_device_pair(|da, db| {
        let src = Buf::filled(&**da, 256, 11);
        let dst = Buf::new(&**db, 256);
        let back = Buf::new(&**da, 256);
        let mut p = Pair::new(t, da, db);
        p.a.post_send(&[
            send(1, &[src.sge(0, 100)]),
            // Behind the RNR'd SEND: must wait for it (RC ordering).
            write(2, &[src.sge(100, 50)], dst.addr(200), dst.rkey(), true),
            read(3, back.sge(0, 256), dst.addr(0), dst.rkey()),
        ])
        .expect("post_send");
        p.drive("two RNR NAKs", |p| p.rnr().sent >= 2);
        assert!(p.wa.is_empty() && p.wb.is_empty());
        assert!(dst.bytes().iter().all(|&x| x == 0), "the write waits too");
        assert!(back.bytes().iter().all(|&x| x == 0), "the read waits too");
        p.b.post_recv(&[recv(9, dst.sge(0, 128))])
            .expect("post_recv");
        p.drive_to(3, 1);
        p.settle();
        assert_eq!(
            p.wa,
            [
                ok(1, WcOpcode::Send, 0, None),
                ok(2, WcOpcode::RdmaWrite, 0, None),
                ok(3, WcOpcode::RdmaRead, 256, None)
            ]
        );
        assert_eq!(p.wb, [ok(9, WcOpcode::Recv, 100, None)]);
        let got = dst.bytes();
        assert_eq!(&got[..100], &src.bytes()[..100]);
        assert_eq!(&got[200..250], &src.bytes()[100..150]);
        assert_eq!(
            back.bytes(),
            got,
            "the READ sees the SEND and the WRITE before it"
        );
        let rnr = p.rnr();
        assert!(rnr.received >= 2, "{rnr:?}");
        assert_eq!(rnr.received, rnr.sent, "{rnr:?}");
        if let Some((ca, cb)) = rnr.per_qp {
            // Only a sent: every NAK went b -> a.
            assert_eq!(ca.rnr_naks_sent, 0);
            assert_eq!(cb.rnr_naks_received, 0);
        }
    });
}

/// With `rnr_retry` = 0, 1, 2 and no receive WR ever posted, the SEND completes
/// `RnrRetryExceeded` after exactly `rnr_retry + 1` NAKs, the WRs behind it (an unsignaled
/// WRITE that never ran, a SEND) and later ones flush; the peer sees nothing and is not closed.
pub fn rnr_retry_exceeded_then_flush(t: &Transport) {
    let (da, db) = t.one_device();
    for rnr_retry in 0..=2u8 {
        let src = Buf::filled(&*da, 64, 12);
        let dst = Buf::new(&*db, 64);
        let ca = QpConfig {
            rnr_retry,
            ..qp_cfg()
        };
        let mut p = Pair::create(t, &da, &db, &ca, &qp_cfg()).connect();
        p.a.post_send(&[
            send(1, &[src.sge(0, 8)]),
            write(2, &[src.sge(0, 8)], dst.addr(0), dst.rkey(), false),
            send(3, &[src.sge(0, 8)]),
        ])
        .expect("post_send");
        p.drive_to(3, 0);
        p.settle();
        check(
            t,
            &p.wa,
            &[
                err(1, WcStatus::RnrRetryExceeded, WcOpcode::Send),
                err(2, WcStatus::WrFlush, WcOpcode::RdmaWrite),
                err(3, WcStatus::WrFlush, WcOpcode::Send),
            ],
            &format!("rnr_retry {rnr_retry}"),
        );
        assert!(p.wa[0].status.is_remote());
        assert!(p.wb.is_empty());
        let want = u64::from(rnr_retry) + 1;
        let rnr = p.rnr();
        assert_eq!((rnr.received, rnr.sent), (want, want), "{rnr:?}");
        if let Some((ca, cb)) = rnr.per_qp {
            assert_eq!((ca.rnr_naks_received, cb.rnr_naks_sent), (want, want));
        }
        assert!(dst.bytes().iter().all(|&x| x == 0), "the write never ran");
        if let Some(wc) = post_send_on_error(&mut p, send(4, &[src.sge(0, 8)])) {
            check(
                t,
                &[wc],
                &[err(4, WcStatus::WrFlush, WcOpcode::Send)],
                "later WR",
            );
        }
        assert!(!p.a.peer_closed());
    }
}

/// A 1 MiB SEND RNR NAKed twice is resent from its memory and lands whole.
pub fn large_send_survives_rnr_and_is_resent_from_memory(t: &Transport) {
    let (da, db) = t.one_device();
    let len = 1 << 20;
    let src = Buf::filled(&*da, len, 13);
    let dst = Buf::new(&*db, len);
    let mut p = Pair::new(t, &da, &db);
    p.a.post_send(&[send(1, &[src.sge(0, len as u32)])])
        .expect("post_send");
    p.drive("two RNR NAKs", |p| p.rnr().sent >= 2);
    p.b.post_recv(&[recv(2, dst.sge(0, len as u32))])
        .expect("post_recv");
    p.drive_to(1, 1);
    assert_eq!(p.wa, [ok(1, WcOpcode::Send, 0, None)]);
    assert_eq!(p.wb, [ok(2, WcOpcode::Recv, len as u32, None)]);
    assert!(dst.bytes() == src.bytes(), "1 MiB differ");
}

/// Inline WRs ([`SendWr::inline`]: `IBV_SEND_INLINE`) are copied at the post: a SEND into a
/// posted receive, an unsignaled and a signaled RDMA WRITE, and a WRITE_WITH_IMM, each of
/// `min(200, max_inline_data)` bytes, posted in one list, whose source is overwritten as soon
/// as `post_send` returns, deliver the bytes of the post (`byte_len` the length); only the
/// signaled WRs complete at the sender. Twice: with the receives posted, and with none
/// posted until the peer sent an RNR NAK, so that every message is sent again after the
/// overwrite (go-back-N), from the copy. A QP that granted no inline data skips.
pub fn inline_send_is_copied_at_post(t: &Transport) {
    t.each_device_pair(|da, db| {
        for rnr in [false, true] {
            let mut p = Pair::new(t, da, db);
            let granted = p.a.max_inline_data();
            if granted == 0 {
                println!(
                    "SKIP inline_send_is_copied_at_post: {} granted no inline data",
                    da.props().name
                );
                return;
            }
            let len = granted.min(200);
            let n = len as usize;
            let src = Buf::filled(&**da, 4 * n, 40);
            let posted = src.bytes();
            let bounce = Buf::new(&**db, n);
            let dst = Buf::new(&**db, 3 * n);
            let recvs = [recv(0xb1, bounce.sge(0, len)), recv(0xb2, Sge::default())];
            if !rnr {
                p.b.post_recv(&recvs).expect("post_recv");
            }
            let inline = |mut wr: SendWr| {
                wr.inline = true;
                wr
            };
            p.a.post_send(&[
                inline(send(1, &[src.sge(0, len)])),
                inline(write(2, &[src.sge(n, len)], dst.addr(0), dst.rkey(), false)),
                inline(write(
                    3,
                    &[src.sge(2 * n, len)],
                    dst.addr(n),
                    dst.rkey(),
                    true,
                )),
                inline(send_wr(
                    4,
                    &[src.sge(3 * n, len)],
                    SendOpcode::RdmaWriteWithImm {
                        remote_addr: dst.addr(2 * n),
                        rkey: dst.rkey(),
                        imm: 0x1a1a_1e1e,
                    },
                    true,
                )),
            ])
            .expect("post_send");
            // Reused at once, as the caller of an inline post may.
            src.region.write(0, &vec![0x5a; 4 * n]).expect("overwrite");
            if rnr {
                p.drive("an RNR NAK", |p| p.rnr().sent >= 1);
                assert!(p.wa.is_empty() && p.wb.is_empty());
                p.b.post_recv(&recvs).expect("post_recv");
            }
            p.drive_to(3, 2);
            p.settle();
            let what = if rnr {
                "after an RNR NAK"
            } else {
                "receives posted"
            };
            assert_eq!(
                p.wa,
                [
                    ok(1, WcOpcode::Send, 0, None),
                    ok(3, WcOpcode::RdmaWrite, 0, None),
                    ok(4, WcOpcode::RdmaWrite, 0, None)
                ],
                "{what}"
            );
            assert_eq!(
                p.wb,
                [
                    ok(0xb1, WcOpcode::Recv, len, None),
                    ok(0xb2, WcOpcode::RecvRdmaWithImm, len, Some(0x1a1a_1e1e))
                ],
                "{what}"
            );
            assert!(bounce.bytes() == posted[..n], "{what}: the SEND's bytes");
            assert!(
                dst.bytes() == posted[n..],
                "{what}: the WRITEs' bytes (unsignaled, signaled, with immediate)"
            );
        }
    });
}

/// An inline WR of `max_inline_data() + 1` bytes fails `post_send` (`Resource`, naming the
/// size and the limit) with the whole list: the valid SEND ahead of it is not posted either,
/// and nothing arrives. The QP still works: a normal SEND of the same bytes, and (where any
/// was granted) an inline SEND of exactly `max_inline_data()` bytes, go through.
pub fn inline_send_longer_than_granted_is_refused(t: &Transport) {
    let (da, db) = t.one_device();
    let mut p = Pair::new(t, &da, &db);
    let granted = p.a.max_inline_data();
    let n = granted as usize + 1;
    let src = Buf::filled(&*da, n, 41);
    let dst = Buf::new(&*db, 2 * n);
    p.b.post_recv(&[recv(0xb1, dst.sge(0, n as u32))])
        .expect("post_recv");
    let mut long = write(2, &[src.sge(0, n as u32)], dst.addr(0), dst.rkey(), true);
    long.inline = true;
    match p.a.post_send(&[send(1, &[src.sge(0, 8)]), long]) {
        Err(TransportError::Resource(m)) => assert!(
            m.contains(&format!("{n} bytes")) && m.contains(&format!("max_inline_data {granted}")),
            "the error names the size and the limit: {m}"
        ),
        other => panic!("an inline WR over max_inline_data {granted} was not refused: {other:?}"),
    }
    p.settle();
    assert!(
        p.wa.is_empty() && p.wb.is_empty(),
        "nothing of a refused post: a={:?} b={:?}",
        p.wa,
        p.wb
    );
    assert!(dst.bytes().iter().all(|&x| x == 0), "nothing written");
    p.a.post_send(&[send(3, &[src.sge(0, n as u32)])])
        .expect("post_send after the refusal");
    p.drive_to(1, 1);
    assert_eq!(p.wa, [ok(3, WcOpcode::Send, 0, None)]);
    assert_eq!(p.wb, [ok(0xb1, WcOpcode::Recv, n as u32, None)]);
    assert!(dst.bytes()[..n] == src.bytes()[..]);
    if granted > 0 {
        p.b.post_recv(&[recv(0xb2, dst.sge(n, granted))])
            .expect("post_recv");
        let mut exact = send(4, &[src.sge(0, granted)]);
        exact.inline = true;
        p.a.post_send(&[exact])
            .expect("an inline WR of max_inline_data bytes");
        p.drive_to(2, 2);
        p.settle();
        assert_eq!(p.wa[1..], [ok(4, WcOpcode::Send, 0, None)]);
        assert_eq!(p.wb[1..], [ok(0xb2, WcOpcode::Recv, granted, None)]);
        assert!(dst.bytes()[n..2 * n - 1] == src.bytes()[..n - 1]);
    }
}

/// A 16 MiB RDMA WRITE completes with every byte in place.
pub fn sixteen_mib_write_completes_with_the_right_bytes(t: &Transport) {
    let (da, db) = t.one_device();
    let len = 16 << 20;
    let src = Buf::filled(&*da, len, 14);
    let dst = Buf::new(&*db, len);
    let mut p = Pair::new(t, &da, &db);
    p.a.post_send(&[write(
        1,
        &[src.sge(0, len as u32)],
        dst.addr(0),
        dst.rkey(),
        true,
    )])
    .expect("post_send");
    p.drive_to(1, 0);
    assert_eq!(p.wa, [ok(1, WcOpcode::RdmaWrite, 0, None)]);
    assert!(dst.bytes() == src.bytes(), "16 MiB differ");
}

/// Data QPs (QPs 1 and up of a connection, `VERBSNET_IB_QPS_PER_CONNECTION`): connected with
/// `listen_data`/`establish_data` and no set-up stream of their own, each carries plain RDMA
/// WRITEs into the peer's registered memory with no receive WR posted or consumed at the peer
/// (its CQ stays empty), independently of the connection's other QPs (two data QPs between
/// the same devices, written at once, each deliver their own bytes and completions).
pub fn data_qps_carry_plain_writes_without_receive_wrs(t: &Transport) {
    let (da, db) = t.one_device();
    let src = Buf::filled(&*da, 1 << 20, 23);
    let dst = Buf::new(&*db, 2 << 20);
    let mut cfg_b = qp_cfg();
    cfg_b.max_recv_wr = 0;
    let mut p1 = Pair::create(t, &da, &db, &qp_cfg(), &cfg_b).connect_data();
    let mut p2 = Pair::create(t, &da, &db, &qp_cfg(), &cfg_b).connect_data();
    let half = 1 << 19;
    p1.a.post_send(&[
        write(1, &[src.sge(0, half)], dst.addr(0), dst.rkey(), false),
        write(
            2,
            &[src.sge(half as usize, half)],
            dst.addr(half as usize),
            dst.rkey(),
            true,
        ),
    ])
    .expect("post_send on data QP 1");
    p2.a.post_send(&[
        write(
            3,
            &[src.sge(0, 1 << 20)],
            dst.addr(1 << 20),
            dst.rkey(),
            true,
        ),
        write(4, &[src.sge(0, 0)], dst.addr(0), dst.rkey(), true),
    ])
    .expect("post_send on data QP 2");
    p1.drive_to(1, 0);
    p2.drive_to(2, 0);
    p1.settle();
    p2.settle();
    assert_eq!(p1.wa, [ok(2, WcOpcode::RdmaWrite, 0, None)]);
    assert_eq!(
        p2.wa,
        [
            ok(3, WcOpcode::RdmaWrite, 0, None),
            ok(4, WcOpcode::RdmaWrite, 0, None)
        ]
    );
    assert!(
        p1.wb.is_empty() && p2.wb.is_empty(),
        "no receive completion"
    );
    assert_eq!(p1.b.counters().recv_wrs_posted, 0);
    assert_eq!(p2.b.counters().recv_wrs_posted, 0);
    let got = dst.bytes();
    let s = src.bytes();
    assert!(got[..1 << 20] == s[..], "data QP 1's bytes");
    assert!(got[1 << 20..] == s[..], "data QP 2's bytes");
}

/// Data QPs (connected with `listen_data`/`establish_data`, no set-up stream) carry WRITE WITH
/// IMMs into zero-length receive WRs, as several QPs per connection use them: the payload lands
/// in place, each consumes one receive WR in order, and the receiver's completions give the
/// immediate and `byte_len` (0 for a zero-length one, as the engine sends on a QP past the end
/// of a split payload).
pub fn data_qps_carry_write_with_imm_into_zero_length_wrs(t: &Transport) {
    let (da, db) = t.one_device();
    let src = Buf::filled(&*da, 64 << 10, 29);
    let dst = Buf::new(&*db, 64 << 10);
    let mut p = Pair::create(t, &da, &db, &qp_cfg(), &qp_cfg()).connect_data();
    p.b.post_recv(&[recv(0x21, src.sge(0, 0)), recv(0x22, src.sge(0, 0))])
        .expect("post_recv on the data QP");
    let imm_write = |wr_id: u64, len: usize, imm: u32| {
        send_wr(
            wr_id,
            &[src.sge(0, len as u32)][..usize::from(len > 0)],
            SendOpcode::RdmaWriteWithImm {
                remote_addr: dst.addr(0),
                rkey: dst.rkey(),
                imm,
            },
            true,
        )
    };
    p.a.post_send(&[
        imm_write(1, 64 << 10, 0x0abc_0001),
        imm_write(2, 0, 0x0abc_0002),
    ])
    .expect("post_send on the data QP");
    p.drive_to(2, 2);
    p.settle();
    assert_eq!(
        p.wa,
        [
            ok(1, WcOpcode::RdmaWrite, 0, None),
            ok(2, WcOpcode::RdmaWrite, 0, None)
        ]
    );
    assert_eq!(
        p.wb,
        [
            ok(0x21, WcOpcode::RecvRdmaWithImm, 64 << 10, Some(0x0abc_0001)),
            ok(0x22, WcOpcode::RecvRdmaWithImm, 0, Some(0x0abc_0002))
        ]
    );
    assert!(dst.bytes() == src.bytes(), "the data QP's bytes");
}

/// 8 MiB each way at once (a WRITE_WITH_IMM one way, a SEND the other) both land whole.
pub fn simultaneous_large_transfers_both_ways(t: &Transport) {
    let (da, db) = t.one_device();
    let len = 8 << 20;
    let sa = Buf::filled(&*da, len, 15);
    let sb = Buf::filled(&*db, len, 16);
    let ra = Buf::new(&*da, len);
    let rb = Buf::new(&*db, len);
    let mut p = Pair::new(t, &da, &db);
    p.a.post_recv(&[recv(0xa, ra.sge(0, len as u32))])
        .expect("post_recv");
    p.a.post_send(&[send_wr(
        1,
        &[sa.sge(0, len as u32)],
        SendOpcode::RdmaWriteWithImm {
            remote_addr: rb.addr(0),
            rkey: rb.rkey(),
            imm: 1,
        },
        true,
    )])
    .expect("post_send");
    p.b.post_recv(&[recv(0xb, rb.sge(0, 16))])
        .expect("post_recv");
    p.b.post_send(&[send(2, &[sb.sge(0, len as u32)])])
        .expect("post_send");
    p.drive_to(2, 2);
    // A send and a receive completion on each QP: their relative order is not defined.
    let mut wa = p.wa.clone();
    let mut wb = p.wb.clone();
    wa.sort_by_key(|w| w.wr_id);
    wb.sort_by_key(|w| w.wr_id);
    assert_eq!(
        wa,
        [
            ok(1, WcOpcode::RdmaWrite, 0, None),
            ok(0xa, WcOpcode::Recv, len as u32, None)
        ]
    );
    assert_eq!(
        wb,
        [
            ok(2, WcOpcode::Send, 0, None),
            ok(0xb, WcOpcode::RecvRdmaWithImm, len as u32, Some(1))
        ]
    );
    assert!(ra.bytes() == sb.bytes());
    assert!(rb.bytes() == sa.bytes());
}

/// 1,000 SENDs of 8..64 bytes (one in ten signaled) into 1,000 receive WRs posted in one
/// call: every message lands in its own receive WR, in posting order, with its length.
pub fn a_thousand_small_sends_arrive_in_order(t: &Transport) {
    let (da, db) = t.one_device();
    let n = 1000usize;
    let src = Buf::new(&*da, n * 64);
    let dst = Buf::new(&*db, n * 64);
    for i in 0..n {
        let mut m = [0u8; 64];
        m[..8].copy_from_slice(&(i as u64).to_le_bytes());
        m[8..].iter_mut().for_each(|x| *x = i as u8);
        src.region.write(i * 64, &m).expect("fill");
    }
    let len = |i: usize| 8 + (i % 57) as u32;
    let mut p = Pair::new(t, &da, &db);
    let c0 = p.b.counters();
    let recvs: Vec<RecvWr> = (0..n)
        .map(|i| recv(i as u64, dst.sge(i * 64, 64)))
        .collect();
    p.b.post_recv(&recvs).expect("post_recv");
    let c1 = p.b.counters();
    assert_eq!(c1.post_recv_calls - c0.post_recv_calls, 1, "one call");
    assert_eq!(c1.recv_wrs_posted - c0.recv_wrs_posted, n as u64);
    let sends: Vec<SendWr> = (0..n)
        .map(|i| {
            send_wr(
                1_000_000 + i as u64,
                &[src.sge(i * 64, len(i))],
                SendOpcode::Send,
                i % 10 == 9,
            )
        })
        .collect();
    p.a.post_send(&sends).expect("post_send");
    p.drive_to(n / 10, n);
    p.settle();
    let want_a: Vec<Wc> = (0..n)
        .filter(|i| i % 10 == 9)
        .map(|i| ok(1_000_000 + i as u64, WcOpcode::Send, 0, None))
        .collect();
    assert_eq!(p.wa, want_a);
    let want_b: Vec<Wc> = (0..n)
        .map(|i| ok(i as u64, WcOpcode::Recv, len(i), None))
        .collect();
    assert_eq!(p.wb, want_b);
    let got = dst.bytes();
    let s = src.bytes();
    for i in 0..n {
        let l = len(i) as usize;
        assert_eq!(
            &got[i * 64..i * 64 + l],
            &s[i * 64..i * 64 + l],
            "message {i}"
        );
        assert!(got[i * 64 + l..(i + 1) * 64].iter().all(|&x| x == 0));
    }
}

/// 2,000 registrations made and dropped on another thread while a QP of the same device
/// moves 64 messages: every message lands, every key is nonzero.
pub fn reg_mr_from_another_thread_while_polling(t: &Transport) {
    let (da, db) = t.one_device();
    let src = Buf::filled(&*da, 4096, 18);
    let dst = Buf::new(&*db, 4096 * 64);
    let mut p = Pair::new(t, &da, &db);
    let d2 = da.clone();
    let registering = std::thread::spawn(move || {
        for _ in 0..2000 {
            let mr = d2.reg_mr(Region::alloc(64)).expect("reg_mr");
            assert_ne!(mr.keys().lkey, 0);
            assert_ne!(mr.keys().rkey, 0);
            drop(mr);
        }
    });
    for round in 0..64u64 {
        p.b.post_recv(&[recv(round, dst.sge(round as usize * 4096, 4096))])
            .expect("post_recv");
        p.a.post_send(&[send(round, &[src.sge(0, 4096)])])
            .expect("post_send");
        let k = round as usize + 1;
        p.drive_to(k, k);
    }
    registering.join().expect("registering thread");
    let got = dst.bytes();
    for i in 0..64 {
        assert_eq!(&got[i * 4096..(i + 1) * 4096], &src.bytes()[..], "{i}");
        assert_eq!(p.wb[i], ok(i as u64, WcOpcode::Recv, 4096, None));
    }
}

/// The peer QP goes away (its process exits: QP destroyed, out-of-band stream closed) while
/// a SEND waits on RNR: `peer_closed` turns true, the outstanding sends and posted receives
/// all complete with errors, each queue in order; later WRs flush, nothing else arrives.
pub fn peer_drop_fails_outstanding_work(t: &Transport) {
    let (da, db) = t.one_device();
    let src = Buf::filled(&*da, 1 << 20, 19);
    let dst = Buf::new(&*da, 64);
    let mut p = Pair::new(t, &da, &db);
    assert!(!p.a.peer_closed() && !p.b.peer_closed());
    p.a.post_recv(&[recv(0xa1, dst.sge(0, 64)), recv(0xa2, dst.sge(0, 64))])
        .expect("post_recv");
    // B never posts a receive: the SEND keeps being RNR'd until B goes away.
    p.a.post_send(&[
        send(1, &[src.sge(0, 64)]),
        send_wr(2, &[src.sge(0, 1 << 20)], SendOpcode::Send, false),
    ])
    .expect("post_send");
    p.drive("an RNR NAK", |p| p.rnr().received >= 1);
    let Pair { mut a, b, .. } = p;
    drop(b);
    let mut wa = Vec::new();
    wait_one(
        t,
        &mut *a,
        &mut wa,
        "4 completions after the peer dropped",
        |a, wa| wa.len() >= 4 && a.peer_closed(),
    );
    check(
        t,
        &only(&wa, &[0xa1, 0xa2]),
        &[
            err(0xa1, WcStatus::WrFlush, WcOpcode::Recv),
            err(0xa2, WcStatus::WrFlush, WcOpcode::Recv),
        ],
        "receive queue",
    );
    let sends = match t.kind {
        // tcp: the lost connection fails every outstanding send WR with RetryExceeded (the
        // transport cannot tell which of them reached the peer).
        Kind::Tcp => [
            err(1, WcStatus::RetryExceeded, WcOpcode::Send),
            err(2, WcStatus::RetryExceeded, WcOpcode::Send),
        ],
        // verbs: the first WR exhausts its transport retries (no ACK from the destroyed QP),
        // every WR behind it is flushed.
        Kind::Ib => [
            err(1, WcStatus::RetryExceeded, WcOpcode::Send),
            err(2, WcStatus::WrFlush, WcOpcode::Send),
        ],
    };
    check(t, &only(&wa, &[1, 2]), &sends, "send queue");
    assert_eq!(wa.len(), 4, "{wa:?}");
    if t.kind == Kind::Tcp {
        // tcp fails the receive queue first, then the send queue, in one poll.
        assert_eq!(wa[..2], only(&wa, &[0xa1, 0xa2]), "{wa:?}");
    }
    // Nothing more, no spinning errors; later WRs flush (or, verbs, are refused).
    match a.post_send(&[send(3, &[src.sge(0, 8)])]) {
        Ok(()) => {
            wait_one(t, &mut *a, &mut wa, "the flush of a later WR", |_, wa| {
                wa.len() >= 5
            });
            check(
                t,
                &wa[4..],
                &[err(3, WcStatus::WrFlush, WcOpcode::Send)],
                "later WR",
            );
        }
        Err(e) => assert_eq!(t.kind, Kind::Ib, "tcp accepts WRs in the error state: {e}"),
    }
    let n = wa.len();
    for _ in 0..20 {
        a.poll_cq(&mut wa, 16).expect("poll");
    }
    assert_eq!(wa.len(), n, "nothing after the flush: {wa:?}");
}

/// The responder's owner never polls (NCCL may post receives and not call that comm again for a
/// long time): the requester's SEND and WRITE_WITH_IMM still complete, and a SEND first
/// refused for want of a receive WR completes once the responder posts one (still without
/// polling), as a NIC acknowledges, places data and answers RNR without the CPU. At the
/// responder's first poll all its receive completions are there, in order, the data in place.
pub fn sends_complete_while_the_responders_owner_never_polls(t: &Transport) {
    t.each_device_pair(|da, db| {
        let src = Buf::filled(&**da, 4096, 30);
        let dst = Buf::new(&**db, 8192);
        let bounce = Buf::new(&**db, 256);
        let mut p = Pair::create(t, da, db, &qp_cfg(), &qp_cfg());
        // Posted during the handshake (as the plugin's acceptor does); then b's owner never
        // calls b again until its first poll below.
        p.b.post_recv(&[recv(0xb1, bounce.sge(0, 128)), recv(0xb2, Sge::default())])
            .expect("post_recv");
        let Pair { mut a, mut b, .. } = p.connect();
        a.post_send(&[
            send(1, &[src.sge(0, 100)]),
            send_wr(
                2,
                &[src.sge(1000, 3000)],
                SendOpcode::RdmaWriteWithImm {
                    remote_addr: dst.addr(5000),
                    rkey: dst.rkey(),
                    imm: 0x1234_5678,
                },
                true,
            ),
        ])
        .expect("post_send");
        let mut wa = Vec::new();
        wait_one(t, &mut *a, &mut wa, "both sends", |_, wa| wa.len() >= 2);
        assert_eq!(
            wa,
            [
                ok(1, WcOpcode::Send, 0, None),
                ok(2, WcOpcode::RdmaWrite, 0, None)
            ]
        );
        // No receive WR left: the next SEND is refused (RNR) until b posts one, unpolled.
        let rnr0 = match t.rnr {
            RnrCounting::PerQp => b.counters().rnr_naks_sent,
            RnrCounting::DeviceWide => db.rnr_counters().send_rnr_err.unwrap_or(0),
        };
        a.post_send(&[send(3, &[src.sge(200, 50)])])
            .expect("post_send");
        let rnr_sent = |b: &dyn QueuePair| match t.rnr {
            RnrCounting::PerQp => b.counters().rnr_naks_sent,
            RnrCounting::DeviceWide => db.rnr_counters().send_rnr_err.unwrap_or(0),
        };
        let t0 = Instant::now();
        while rnr_sent(&*b) == rnr0 {
            a.poll_cq(&mut wa, 16).expect("poll a");
            assert!(
                wa.len() == 2,
                "a SEND completed without a receive WR: {wa:?}"
            );
            assert!(t0.elapsed() < t.deadline, "no RNR NAK for the third SEND");
            std::thread::sleep(Duration::from_micros(50));
        }
        b.post_recv(&[recv(0xb3, bounce.sge(128, 128))])
            .expect("post_recv");
        wait_one(t, &mut *a, &mut wa, "the SEND after RNR", |_, wa| {
            wa.len() >= 3
        });
        assert_eq!(wa[2], ok(3, WcOpcode::Send, 0, None));
        // b's first poll: everything, in order.
        let mut wb = Vec::new();
        let n = b.poll_cq(&mut wb, 16).expect("poll b");
        assert_eq!(n, 3, "{wb:?}");
        assert_eq!(
            wb,
            [
                ok(0xb1, WcOpcode::Recv, 100, None),
                ok(0xb2, WcOpcode::RecvRdmaWithImm, 3000, Some(0x1234_5678)),
                ok(0xb3, WcOpcode::Recv, 50, None)
            ]
        );
        let s = src.bytes();
        assert_eq!(&bounce.bytes()[..100], &s[..100]);
        assert_eq!(&bounce.bytes()[128..178], &s[200..250]);
        assert_eq!(&dst.bytes()[5000..8000], &s[1000..4000]);
        assert!(!a.peer_closed() && !b.peer_closed());
    });
}

/// The responder's owner never polls and then its QP goes (dropped without goodbye, as at a
/// `kill -9`): the requester, the only one polling, learns of it: a later send fails (no
/// peer acknowledges it), `peer_closed` turns true and the close is not orderly.
pub fn the_requester_learns_of_the_responders_death_while_only_it_polls(t: &Transport) {
    let (da, db) = t.one_device();
    let src = Buf::filled(&*da, 64, 31);
    let dst = Buf::new(&*db, 64);
    let mut p = Pair::create(t, &da, &db, &qp_cfg(), &qp_cfg());
    // Posted during the handshake; b's owner never calls b again.
    p.b.post_recv(&[recv(0xb1, dst.sge(0, 64))])
        .expect("post_recv");
    let Pair { mut a, b, .. } = p.connect();
    a.post_send(&[send(1, &[src.sge(0, 64)])])
        .expect("post_send");
    let mut wa = Vec::new();
    wait_one(t, &mut *a, &mut wa, "the first send", |_, wa| {
        !wa.is_empty()
    });
    assert_eq!(wa, [ok(1, WcOpcode::Send, 0, None)]);
    assert_eq!(dst.bytes(), src.bytes());
    drop(b);
    a.post_send(&[send(2, &[src.sge(0, 8)])])
        .expect("post_send");
    wait_one(t, &mut *a, &mut wa, "the send after the death", |_, wa| {
        wa.len() >= 2
    });
    // tcp: the lost connection; ib: the transport retries ran out (no ACK from a destroyed
    // QP). `peer_closed` was not asked yet, so ib did not flush the QP itself.
    check(
        t,
        &wa[1..],
        &[err(2, WcStatus::RetryExceeded, WcOpcode::Send)],
        "send after the death",
    );
    wait_one(t, &mut *a, &mut wa, "peer_closed", |a, _| a.peer_closed());
    assert!(!a.peer_closed_orderly(), "a death is not an orderly close");
}

/// The peer closes while this QP has work outstanding (two receives posted, a SEND in RNR
/// retry because the peer never posted a receive): with `goodbye` before the drop the close
/// is orderly (`peer_closed` and `peer_closed_orderly`), without it a death (`peer_closed`
/// only). Either way every outstanding WR completes, with an error (none hangs), and later
/// WRs flush.
pub fn goodbye_makes_a_close_orderly_and_a_drop_without_it_is_a_death(t: &Transport) {
    let (da, db) = t.one_device();
    for goodbye in [true, false] {
        let src = Buf::filled(&*da, 64, 32);
        let dst = Buf::new(&*da, 128);
        let mut p = Pair::new(t, &da, &db);
        p.a.post_recv(&[recv(0xa1, dst.sge(0, 64)), recv(0xa2, dst.sge(64, 64))])
            .expect("post_recv");
        p.a.post_send(&[send(1, &[src.sge(0, 64)])])
            .expect("post_send");
        p.drive("an RNR NAK", |p| p.rnr().received >= 1);
        assert!(!p.a.peer_closed_orderly() && !p.b.peer_closed_orderly());
        let Pair { mut a, mut b, .. } = p;
        if goodbye {
            b.goodbye();
            b.goodbye(); // idempotent
        }
        drop(b);
        let mut wa = Vec::new();
        wait_one(t, &mut *a, &mut wa, "peer_closed", |a, _| a.peer_closed());
        assert_eq!(a.peer_closed_orderly(), goodbye, "goodbye {goodbye}");
        wait_one(t, &mut *a, &mut wa, "every outstanding WR", |_, wa| {
            wa.len() >= 3
        });
        let what = format!("goodbye {goodbye}");
        check(
            t,
            &only(&wa, &[0xa1, 0xa2]),
            &[
                err(0xa1, WcStatus::WrFlush, WcOpcode::Recv),
                err(0xa2, WcStatus::WrFlush, WcOpcode::Recv),
            ],
            &what,
        );
        let sent = only(&wa, &[1]);
        assert_eq!(sent.len(), 1, "{what}: {wa:?}");
        match t.kind {
            // tcp: the close fails outstanding sends as a lost connection does.
            Kind::Tcp => assert_eq!(sent[0].status, WcStatus::RetryExceeded, "{what}"),
            // ib: `peer_closed` moved the QP to the error state (flush), unless the
            // transport retries ran out first.
            Kind::Ib => assert!(
                matches!(sent[0].status, WcStatus::WrFlush | WcStatus::RetryExceeded),
                "{what}: {sent:?}"
            ),
        }
        assert_eq!(wa.len(), 3, "{what}: {wa:?}");
        // Later WRs flush (or, verbs, are refused); nothing else arrives.
        match a.post_send(&[send(2, &[src.sge(0, 8)])]) {
            Ok(()) => {
                wait_one(t, &mut *a, &mut wa, "the later WR", |_, wa| wa.len() >= 4);
                check(
                    t,
                    &wa[3..],
                    &[err(2, WcStatus::WrFlush, WcOpcode::Send)],
                    &what,
                );
            }
            Err(e) => assert_eq!(t.kind, Kind::Ib, "tcp accepts WRs in the error state: {e}"),
        }
        let n = wa.len();
        for _ in 0..20 {
            a.poll_cq(&mut wa, 16).expect("poll");
        }
        assert_eq!(wa.len(), n, "{what}: nothing after the flush: {wa:?}");
        assert!(a.peer_closed() && a.peer_closed_orderly() == goodbye);
    }
}

/// Polls one QP until `done`, at most for the transport's deadline.
fn wait_one(
    t: &Transport,
    qp: &mut dyn QueuePair,
    out: &mut Vec<Wc>,
    what: &str,
    done: impl Fn(&dyn QueuePair, &[Wc]) -> bool,
) {
    let t0 = Instant::now();
    loop {
        let before = out.len();
        qp.poll_cq(out, 16).expect("poll");
        if done(qp, out) {
            return;
        }
        if out.len() == before {
            std::thread::sleep(Duration::from_micros(50));
        }
        assert!(
            t0.elapsed() <= t.deadline,
            "no progress waiting for {what}: {out:?}"
        );
    }
}

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        /// Every test of the suite, by name, in the order `transport_conformance!` lists them.
        pub const TESTS: &[(&str, fn(&Transport))] = &[$((stringify!($name), $name)),*];
    };
}

suite!(
    send_lands_in_posted_recv,
    send_gathers_two_sges,
    rdma_write_and_write_with_imm_land_in_place,
    rdma_read_brings_the_peers_bytes_and_sees_earlier_writes,
    rdma_read_outside_registered_memory_is_remote_access,
    rdma_read_breaking_its_rules_is_refused,
    zero_byte_messages,
    unsignaled_sends_complete_silently,
    rdma_write_outside_registered_memory_is_remote_access,
    write_with_imm_outside_registered_memory,
    dropped_registration_is_refused,
    unregistered_sge_is_local_protection,
    send_longer_than_recv_buffer,
    recv_with_unregistered_buffer_is_remote_operation,
    rnr_then_recv_posted_later_completes,
    rnr_retry_exceeded_then_flush,
    large_send_survives_rnr_and_is_resent_from_memory,
    inline_send_is_copied_at_post,
    inline_send_longer_than_granted_is_refused,
    sixteen_mib_write_completes_with_the_right_bytes,
    simultaneous_large_transfers_both_ways,
    a_thousand_small_sends_arrive_in_order,
    reg_mr_from_another_thread_while_polling,
    peer_drop_fails_outstanding_work,
    sends_complete_while_the_responders_owner_never_polls,
    the_requester_learns_of_the_responders_death_while_only_it_polls,
    goodbye_makes_a_close_orderly_and_a_drop_without_it_is_a_death,
    data_qps_carry_plain_writes_without_receive_wrs,
    data_qps_carry_write_with_imm_into_zero_length_wrs,
);

/// Instantiates the conformance suite as `#[test]` functions in the current module, one per
/// entry of [`TESTS`], plus a test that the list is complete. `$fixture` is a function
/// `fn(&str) -> Option<Transport>` given the test's name; `None` skips that test (it should
/// print a `SKIP <test>: <why>` line first, as [`ib`] does).
///
/// ```ignore
/// mod tcp {
///     nccl_net_verbsnet::transport_conformance!(|_| Some(
///         nccl_net_verbsnet::transport::conformance::tcp()
///     ));
/// }
/// ```
#[macro_export]
macro_rules! transport_conformance {
    ($fixture:expr) => {
        $crate::transport_conformance!(@tests $fixture;
            send_lands_in_posted_recv,
            send_gathers_two_sges,
            rdma_write_and_write_with_imm_land_in_place,
            rdma_read_brings_the_peers_bytes_and_sees_earlier_writes,
            rdma_read_outside_registered_memory_is_remote_access,
            rdma_read_breaking_its_rules_is_refused,
            zero_byte_messages,
            unsignaled_sends_complete_silently,
            rdma_write_outside_registered_memory_is_remote_access,
            write_with_imm_outside_registered_memory,
            dropped_registration_is_refused,
            unregistered_sge_is_local_protection,
            send_longer_than_recv_buffer,
            recv_with_unregistered_buffer_is_remote_operation,
            rnr_then_recv_posted_later_completes,
            rnr_retry_exceeded_then_flush,
            large_send_survives_rnr_and_is_resent_from_memory,
            inline_send_is_copied_at_post,
            inline_send_longer_than_granted_is_refused,
            sixteen_mib_write_completes_with_the_right_bytes,
            simultaneous_large_transfers_both_ways,
            a_thousand_small_sends_arrive_in_order,
            reg_mr_from_another_thread_while_polling,
            peer_drop_fails_outstanding_work,
            sends_complete_while_the_responders_owner_never_polls,
            the_requester_learns_of_the_responders_death_while_only_it_polls,
            goodbye_makes_a_close_orderly_and_a_drop_without_it_is_a_death,
            data_qps_carry_plain_writes_without_receive_wrs,
            data_qps_carry_write_with_imm_into_zero_length_wrs,
        );
    };
    (@tests $fixture:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let fixture: fn(&str) -> Option<$crate::transport::conformance::Transport> =
                    $fixture;
                if let Some(t) = fixture(stringify!($name)) {
                    $crate::transport::conformance::$name(&t);
                }
            }
        )*

        #[test]
        fn every_conformance_test_is_instantiated() {
            let listed: Vec<&str> = $crate::transport::conformance::TESTS
                .iter()
                .map(|(name, _)| *name)
                .collect();
            assert_eq!(listed, [$(stringify!($name)),*]);
        }
    };
}
