//! Loopback tests of the tcp transport: real sockets on 127.0.0.1, both ends driven by one
//! thread with a bounded number of polls (a livelock fails the test).

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use super::qp::TcpQp;
use super::wire::{self, ConnInfo, Frame, FrameError, NakCode, HEADER_LEN, MAX_MSG_LEN};
use super::{open_devices, TcpDevice};
use crate::config::Config;
use crate::mem::Region;
use crate::transport::{
    Device, MemoryRegion, QpConfig, QueuePair, RecvWr, SendOpcode, SendWr, Sge, TransportError, Wc,
    WcOpcode, WcStatus,
};

/// Polls of both ends before a test declares livelock.
const MAX_POLLS: usize = 10_000;

fn qp_cfg() -> QpConfig {
    QpConfig {
        max_recv_wr: 1024,
        max_send_wr: 1024,
        min_rnr_timer: 1, // 10 us: RNR tests stay fast
        rnr_retry: 7,
        timeout: 14,
        retry_cnt: 7,
        traffic_class: 0,
        service_level: 0,
    }
}

/// A connected pair of non-blocking loopback streams.
fn stream_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let a = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (b, _) = listener.accept().expect("accept");
    a.set_nonblocking(true).expect("nonblocking");
    b.set_nonblocking(true).expect("nonblocking");
    (a, b)
}

/// A registered buffer.
struct Buf {
    region: Region,
    mr: Arc<dyn MemoryRegion>,
}

impl Buf {
    fn new(dev: &dyn Device, len: usize) -> Buf {
        let region = Region::alloc(len);
        let mr = dev.reg_mr(region.clone()).expect("reg_mr");
        Buf { region, mr }
    }

    fn filled(dev: &dyn Device, len: usize, seed: u8) -> Buf {
        let b = Buf::new(dev, len);
        let bytes: Vec<u8> = (0..len).map(|i| pattern(i, seed)).collect();
        b.region.write(0, &bytes).expect("fill");
        b
    }

    fn bytes(&self) -> Vec<u8> {
        let mut v = vec![0; self.region.len()];
        self.region.read(0, &mut v).expect("read");
        v
    }

    fn addr(&self, off: usize) -> u64 {
        self.region.addr() + off as u64
    }

    fn sge(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.addr(off),
            length: len,
            lkey: self.mr.keys().lkey,
        }
    }

    fn rkey(&self) -> u32 {
        self.mr.keys().rkey
    }
}

fn pattern(i: usize, seed: u8) -> u8 {
    ((i * 7 + 13 + usize::from(seed) * 31) % 251) as u8
}

fn send_wr(wr_id: u64, sges: &[Sge], opcode: SendOpcode, signaled: bool) -> SendWr {
    let mut sgl = [Sge::default(); 2];
    sgl[..sges.len()].copy_from_slice(sges);
    SendWr {
        wr_id,
        sgl,
        num_sge: sges.len() as u8,
        opcode,
        signaled,
    }
}

fn send(wr_id: u64, sges: &[Sge]) -> SendWr {
    send_wr(wr_id, sges, SendOpcode::Send, true)
}

fn recv(wr_id: u64, sge: Sge) -> RecvWr {
    RecvWr { wr_id, sge }
}

fn ok(wr_id: u64, opcode: WcOpcode, byte_len: u32, imm: Option<u32>) -> Wc {
    Wc {
        wr_id,
        status: WcStatus::Success,
        opcode,
        byte_len,
        imm,
    }
}

fn err(wr_id: u64, status: WcStatus, opcode: WcOpcode) -> Wc {
    Wc {
        wr_id,
        status,
        opcode,
        byte_len: 0,
        imm: None,
    }
}

/// Two QPs and the completions each has produced so far.
struct Pair {
    a: Box<dyn QueuePair>,
    b: Box<dyn QueuePair>,
    wa: Vec<Wc>,
    wb: Vec<Wc>,
}

impl Pair {
    /// QPs created but not established (receives may be posted first).
    fn create(da: &dyn Device, db: &dyn Device, ca: &QpConfig, cb: &QpConfig) -> Pair {
        Pair {
            a: da.create_qp(ca).expect("create_qp a"),
            b: db.create_qp(cb).expect("create_qp b"),
            wa: Vec::new(),
            wb: Vec::new(),
        }
    }

    fn connect(mut self) -> Pair {
        let (sa, sb) = stream_pair();
        let ia = self.a.local_info();
        let ib = self.b.local_info();
        self.a.establish(&ib, sa).expect("establish a");
        self.b.establish(&ia, sb).expect("establish b");
        self
    }

    fn new(da: &dyn Device, db: &dyn Device) -> Pair {
        Pair::create(da, db, &qp_cfg(), &qp_cfg()).connect()
    }

    fn poll(&mut self) {
        let na = self.a.poll_cq(&mut self.wa, 16).expect("poll a");
        let nb = self.b.poll_cq(&mut self.wb, 16).expect("poll b");
        assert!(na <= 16 && nb <= 16);
    }

    /// Polls both ends until `done`, failing after [`MAX_POLLS`].
    fn drive(&mut self, what: &str, done: impl Fn(&Pair) -> bool) {
        for _ in 0..MAX_POLLS {
            self.poll();
            if done(self) {
                return;
            }
        }
        panic!(
            "livelock waiting for {what}: a={:?} b={:?} counters a={:?} b={:?}",
            self.wa,
            self.wb,
            self.a.counters(),
            self.b.counters()
        );
    }

    /// Polls until each side has at least the given number of completions.
    fn drive_to(&mut self, na: usize, nb: usize) {
        self.drive(&format!("{na}/{nb} completions"), |p| {
            p.wa.len() >= na && p.wb.len() >= nb
        });
    }

    /// A few more polls (to show that nothing else arrives).
    fn settle(&mut self) {
        for _ in 0..50 {
            self.poll();
        }
    }
}

/// Runs `f` with both ends on one device, then with each end on its own device.
fn on_one_and_two_devices(f: impl Fn(&dyn Device, &dyn Device)) {
    let d = TcpDevice::new(0);
    f(&d, &d);
    let d0 = TcpDevice::new(0);
    let d1 = TcpDevice::new(1);
    f(&d0, &d1);
}

// ------------------------------------------------------------------------------------------
// Wire format.

#[test]
fn frames_round_trip() {
    let frames = [
        Frame::Send { psn: 0, len: 0 },
        Frame::Send {
            psn: u32::MAX,
            len: MAX_MSG_LEN,
        },
        Frame::Write {
            psn: 7,
            len: 100,
            remote_addr: 0x1234_5678_9abc_def0,
            rkey: 0xdead_beef,
        },
        Frame::WriteImm {
            psn: 8,
            len: 0,
            remote_addr: 1,
            rkey: 2,
            imm: 0xfeed_f00d,
        },
        Frame::Ack { psn: 9 },
        Frame::RnrNak { psn: 10, timer: 31 },
        Frame::Nak {
            psn: 11,
            code: NakCode::Access,
        },
        Frame::Nak {
            psn: 12,
            code: NakCode::InvalidRequest,
        },
        Frame::Nak {
            psn: 13,
            code: NakCode::Operation,
        },
    ];
    for f in frames {
        assert_eq!(Frame::decode(&f.encode()), Ok(f));
    }
    let h = Frame::WriteImm {
        psn: 0x0102_0304,
        len: 0x0506_0708,
        remote_addr: 0x1112_1314_1516_1718,
        rkey: 0x090a_0b0c,
        imm: 0x191a_1b1c,
    }
    .encode();
    assert_eq!(
        h,
        [
            0x56, 0x4e, 1, 3, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x11, 0x12, 0x13, 0x14, 0x15,
            0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0, 0, 0, 0
        ]
    );
}

#[test]
fn malformed_headers_are_refused() {
    let good = Frame::Write {
        psn: 1,
        len: 4,
        remote_addr: 8,
        rkey: 9,
    }
    .encode();
    let with = |i: usize, v: u8| {
        let mut h = good;
        h[i] = v;
        h
    };
    assert_eq!(Frame::decode(&with(0, 0)), Err(FrameError::Magic(0x004e)));
    assert_eq!(Frame::decode(&with(2, 2)), Err(FrameError::Version(2)));
    assert_eq!(Frame::decode(&with(3, 0x7f)), Err(FrameError::Opcode(0x7f)));
    assert_eq!(
        Frame::decode(&with(31, 1)),
        Err(FrameError::NonZero("reserved"))
    );
    assert_eq!(Frame::decode(&with(27, 1)), Err(FrameError::NonZero("imm")));
    assert_eq!(
        Frame::decode(&with(28, 1)),
        Err(FrameError::NonZero("syndrome"))
    );
    let mut long = good;
    long[8..12].copy_from_slice(&(MAX_MSG_LEN + 1).to_be_bytes());
    assert_eq!(
        Frame::decode(&long),
        Err(FrameError::Length(MAX_MSG_LEN + 1))
    );
    let mut ack = Frame::Ack { psn: 1 }.encode();
    ack[11] = 1;
    assert_eq!(Frame::decode(&ack), Err(FrameError::NonZero("length")));
    let mut nak = Frame::Nak {
        psn: 1,
        code: NakCode::Access,
    }
    .encode();
    nak[28] = 9;
    assert_eq!(Frame::decode(&nak), Err(FrameError::Syndrome(9)));
    let mut rnr = Frame::RnrNak { psn: 1, timer: 0 }.encode();
    rnr[28] = 32;
    assert_eq!(Frame::decode(&rnr), Err(FrameError::Syndrome(32)));
    let mut send = Frame::Send { psn: 1, len: 1 }.encode();
    send[15] = 1;
    assert_eq!(Frame::decode(&send), Err(FrameError::NonZero("rkey")));
}

#[test]
fn rnr_timer_follows_the_ib_table() {
    let us = |c| wire::rnr_timer(c).as_nanos() as f64 / 1000.0;
    let table = [
        655_360.0, 10.0, 20.0, 30.0, 40.0, 60.0, 80.0, 120.0, 160.0, 240.0, 320.0, 480.0, 640.0,
        960.0, 1_280.0, 1_920.0, 2_560.0, 3_840.0, 5_120.0, 7_680.0, 10_240.0, 15_360.0, 20_480.0,
        30_720.0, 40_960.0, 61_440.0, 81_920.0, 122_880.0, 163_840.0, 245_760.0, 327_680.0,
        491_520.0,
    ];
    for (code, want) in table.iter().enumerate() {
        assert_eq!(us(code as u8), *want, "code {code}");
    }
    assert_eq!(wire::rnr_timer(0), Duration::from_micros(655_360));
    assert_eq!(wire::rnr_timer(12), Duration::from_micros(640));
}

#[test]
fn conn_info_round_trips_and_is_checked() {
    let info = ConnInfo {
        qp_num: 0x00ab_cdef,
        initial_psn: 0xffff_fff0,
    };
    let b = info.encode();
    assert_eq!(
        b,
        [b'V', b'N', b'T', b'Q', 1, 0xab, 0xcd, 0xef, 0xff, 0xff, 0xff, 0xf0]
    );
    assert_eq!(ConnInfo::decode(&b), Ok(info));
    assert!(ConnInfo::decode(&b[..11]).is_err());
    let mut m = b.clone();
    m[0] = b'X';
    assert!(ConnInfo::decode(&m).is_err());
    let mut v = b.clone();
    v[4] = 9;
    assert!(ConnInfo::decode(&v).is_err());
    let mut z = b;
    z[5..8].copy_from_slice(&[0, 0, 0]);
    assert!(ConnInfo::decode(&z).is_err());
}

// ------------------------------------------------------------------------------------------
// Device.

#[test]
fn device_properties() {
    let devs = open_devices(&Config::default());
    assert_eq!(devs.len(), 1);
    let p = devs[0].props();
    assert_eq!(p.name, "tcp0");
    assert_eq!(p.pci_path, None);
    assert_eq!(p.guid, 0x7463_7000_0000_0001);
    assert_eq!(p.speed_mbps, 10_000);
    assert_eq!(p.port, 1);
    assert_eq!(p.latency_us, 0.0);
    assert_eq!(p.max_comms, 65_536);
    assert_eq!(devs[0].props(), p, "stable");
    assert_eq!(TcpDevice::new(1).props().name, "tcp1");
    assert_eq!(TcpDevice::new(1).props().guid, 0x7463_7000_0000_0002);
}

#[test]
fn keys_are_unique_nonzero_and_dropping_deregisters() {
    let dev = TcpDevice::new(0);
    let bufs: Vec<Buf> = (0..100).map(|_| Buf::new(&dev, 64)).collect();
    let mut keys: Vec<u32> = bufs.iter().map(|b| b.mr.keys().lkey).collect();
    for b in &bufs {
        assert_eq!(b.mr.keys().lkey, b.mr.keys().rkey);
        assert_ne!(b.mr.keys().lkey, 0);
    }
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), 100);
    assert_eq!(dev.registry.len(), 100);
    let key = bufs[10].rkey();
    let addr = bufs[10].addr(0);
    assert!(dev.registry.resolve(key, addr, 64).is_some());
    assert!(dev.registry.resolve(key, addr, 65).is_none());
    assert!(dev.registry.resolve(key, addr + 1, 64).is_none());
    assert!(dev.registry.resolve(key, addr - 1, 1).is_none());
    assert!(dev.registry.resolve(key, u64::MAX, 2).is_none());
    drop(bufs);
    assert_eq!(dev.registry.len(), 0);
    assert!(dev.registry.resolve(key, addr, 64).is_none());
}

#[test]
fn create_qp_checks_attributes() {
    let dev = TcpDevice::new(0);
    for cfg in [
        QpConfig {
            rnr_retry: 8,
            ..qp_cfg()
        },
        QpConfig {
            min_rnr_timer: 32,
            ..qp_cfg()
        },
        QpConfig {
            max_send_wr: (1 << 20) + 1,
            ..qp_cfg()
        },
    ] {
        assert!(matches!(
            dev.create_qp(&cfg),
            Err(TransportError::Resource(_))
        ));
    }
    let qp = dev.create_qp(&qp_cfg()).expect("create");
    let info = ConnInfo::decode(&qp.local_info()).expect("own info parses");
    assert_ne!(info.qp_num, 0);
    assert!(info.qp_num < 1 << 24);
}

#[test]
fn establish_checks_remote_info() {
    let dev = TcpDevice::new(0);
    let mut qp = dev.create_qp(&qp_cfg()).expect("create");
    let (s, _keep) = stream_pair();
    let e = qp.establish(&[1, 2, 3], s).expect_err("short info");
    assert!(matches!(e, TransportError::Protocol(_)), "{e}");
    let peer = dev.create_qp(&qp_cfg()).expect("create");
    let (s, _keep2) = stream_pair();
    qp.establish(&peer.local_info(), s).expect("good info");
    let (s, _keep3) = stream_pair();
    assert!(qp.establish(&peer.local_info(), s).is_err(), "twice");
}

#[test]
fn queue_limits_are_enforced() {
    let dev = TcpDevice::new(0);
    let cfg = QpConfig {
        max_recv_wr: 2,
        max_send_wr: 2,
        ..qp_cfg()
    };
    let buf = Buf::new(&dev, 64);
    let mut p = Pair::create(&dev, &dev, &cfg, &cfg);
    let e =
        p.a.post_send(&[send(1, &[buf.sge(0, 8)])])
            .expect_err("send before establish");
    assert!(matches!(e, TransportError::Unavailable(_)), "{e}");
    let three: Vec<RecvWr> = (0..3).map(|i| recv(i, buf.sge(0, 8))).collect();
    match p.a.post_recv(&three) {
        Err(TransportError::Resource(m)) => assert!(m.contains("max_recv_wr 2"), "{m}"),
        other => panic!("expected Resource, got {other:?}"),
    }
    p.a.post_recv(&three[..2]).expect("two fit");
    assert!(matches!(
        p.a.post_recv(&three[..1]),
        Err(TransportError::Resource(_))
    ));
    assert_eq!(p.a.counters().post_recv_calls, 1);
    assert_eq!(p.a.counters().recv_wrs_posted, 2);
    let mut p = p.connect();
    let wrs: Vec<SendWr> = (0..3).map(|i| send(i, &[buf.sge(0, 8)])).collect();
    match p.b.post_send(&wrs) {
        Err(TransportError::Resource(m)) => assert!(m.contains("max_send_wr 2"), "{m}"),
        other => panic!("expected Resource, got {other:?}"),
    }
    let mut three_sge = send(9, &[buf.sge(0, 8)]);
    three_sge.num_sge = 3;
    assert!(matches!(
        p.b.post_send(&[three_sge]),
        Err(TransportError::Resource(_))
    ));
    p.b.post_send(&wrs[..2]).expect("two fit");
    assert!(p.b.post_send(&wrs[2..]).is_err());
    // Completion frees the slots.
    p.drive_to(2, 2);
    p.b.post_send(&wrs[2..]).expect("room again");
}

// ------------------------------------------------------------------------------------------
// Data path.

#[test]
fn send_lands_in_posted_recv() {
    on_one_and_two_devices(|da, db| {
        let src = Buf::filled(da, 100, 1);
        let dst = Buf::new(db, 128);
        let mut p = Pair::create(da, db, &qp_cfg(), &qp_cfg());
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
        assert_eq!(p.b.counters().rnr_naks_sent, 0);
    });
}

#[test]
fn send_gathers_two_sges() {
    on_one_and_two_devices(|da, db| {
        let s1 = Buf::filled(da, 64, 2);
        let s2 = Buf::filled(da, 64, 3);
        let dst = Buf::new(db, 64);
        let mut p = Pair::new(da, db);
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

#[test]
fn rdma_write_and_write_with_imm_land_in_place() {
    on_one_and_two_devices(|da, db| {
        let src = Buf::filled(da, 4096, 4);
        let dst = Buf::new(db, 8192);
        let bounce = Buf::new(db, 16);
        let mut p = Pair::new(da, db);
        p.b.post_recv(&[recv(0x77, bounce.sge(0, 16))])
            .expect("post_recv");
        p.a.post_send(&[
            send_wr(
                1,
                &[src.sge(0, 1000)],
                SendOpcode::RdmaWrite {
                    remote_addr: dst.addr(100),
                    rkey: dst.rkey(),
                },
                false, // unsignaled: no completion
            ),
            send_wr(
                2,
                &[src.sge(1000, 3000)],
                SendOpcode::RdmaWriteWithImm {
                    remote_addr: dst.addr(5000),
                    rkey: dst.rkey(),
                    imm: 0xcafe_babe,
                },
                true,
            ),
            send_wr(
                3,
                &[src.sge(0, 10)],
                SendOpcode::RdmaWrite {
                    remote_addr: dst.addr(8182),
                    rkey: dst.rkey(),
                },
                true,
            ),
        ])
        .expect("post_send");
        p.drive_to(2, 1);
        p.settle();
        assert_eq!(
            p.wa,
            [
                ok(2, WcOpcode::RdmaWrite, 0, None),
                ok(3, WcOpcode::RdmaWrite, 0, None)
            ]
        );
        assert_eq!(
            p.wb,
            [ok(0x77, WcOpcode::RecvRdmaWithImm, 3000, Some(0xcafe_babe))]
        );
        let got = dst.bytes();
        let s = src.bytes();
        assert!(got[..100].iter().all(|&x| x == 0));
        assert_eq!(&got[100..1100], &s[..1000]);
        assert!(got[1100..5000].iter().all(|&x| x == 0));
        assert_eq!(&got[5000..8000], &s[1000..4000]);
        assert!(got[8000..8182].iter().all(|&x| x == 0));
        assert_eq!(&got[8182..], &s[..10]);
        assert!(
            bounce.bytes().iter().all(|&x| x == 0),
            "imm needs no buffer"
        );
    });
}

#[test]
fn zero_byte_messages() {
    let dev = TcpDevice::new(0);
    let dst = Buf::new(&dev, 16);
    let mut p = Pair::new(&dev, &dev);
    p.b.post_recv(&[recv(1, dst.sge(0, 16)), recv(2, dst.sge(0, 16))])
        .expect("post_recv");
    p.a.post_send(&[
        send(10, &[]),
        // Zero-length writes check neither rkey nor address.
        send_wr(
            11,
            &[],
            SendOpcode::RdmaWrite {
                remote_addr: 0,
                rkey: 0x1234,
            },
            true,
        ),
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

#[test]
fn unsignaled_sends_complete_silently() {
    let dev = TcpDevice::new(0);
    let src = Buf::filled(&dev, 64, 5);
    let dst = Buf::new(&dev, 256);
    let mut p = Pair::new(&dev, &dev);
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
    assert_eq!(p.wb.len(), 4);
}

#[test]
fn rdma_write_outside_registered_memory_is_remote_access() {
    on_one_and_two_devices(|da, db| {
        let src = Buf::filled(da, 64, 6);
        let dst = Buf::filled(db, 64, 7);
        let before = dst.bytes();
        let bad_rkey = dst.rkey().wrapping_add(1000);
        for (name, remote_addr, rkey) in [
            ("bad rkey", dst.addr(0), bad_rkey),
            ("out of bounds", dst.addr(32), dst.rkey()),
            ("before the region", dst.addr(0) - 1, dst.rkey()),
        ] {
            let mut p = Pair::new(da, db);
            let bounce = Buf::new(db, 64);
            p.b.post_recv(&[recv(0xb1, bounce.sge(0, 64))])
                .expect("post_recv");
            p.a.post_send(&[
                send_wr(
                    1,
                    &[src.sge(0, 64)],
                    SendOpcode::RdmaWrite { remote_addr, rkey },
                    false, // errors complete even unsignaled
                ),
                send(2, &[src.sge(0, 8)]),
            ])
            .expect("post_send");
            p.drive_to(2, 1);
            p.settle();
            assert_eq!(
                p.wa,
                [
                    err(1, WcStatus::RemoteAccess, WcOpcode::RdmaWrite),
                    err(2, WcStatus::WrFlush, WcOpcode::Send)
                ],
                "{name}"
            );
            // The responder refused and entered the error state too.
            assert_eq!(
                p.wb,
                [err(0xb1, WcStatus::WrFlush, WcOpcode::Recv)],
                "{name}"
            );
            assert_eq!(dst.bytes(), before, "{name}: target untouched");
            assert!(bounce.bytes().iter().all(|&x| x == 0), "{name}");
            // Later WRs flush on both sides.
            p.a.post_send(&[send(3, &[src.sge(0, 8)])])
                .expect("post on error");
            p.b.post_recv(&[recv(0xb2, bounce.sge(0, 8))])
                .expect("post on error");
            p.drive_to(3, 2);
            assert_eq!(p.wa[2], err(3, WcStatus::WrFlush, WcOpcode::Send));
            assert_eq!(p.wb[1], err(0xb2, WcStatus::WrFlush, WcOpcode::Recv));
        }
    });
}

#[test]
fn write_with_imm_outside_registered_memory() {
    let dev = TcpDevice::new(0);
    let src = Buf::filled(&dev, 64, 6);
    let dst = Buf::new(&dev, 32);
    let mut p = Pair::new(&dev, &dev);
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
    assert_eq!(p.wa, [err(9, WcStatus::RemoteAccess, WcOpcode::RdmaWrite)]);
    assert_eq!(
        p.wb,
        [
            err(1, WcStatus::LocalProtection, WcOpcode::Recv),
            err(2, WcStatus::WrFlush, WcOpcode::Recv)
        ]
    );
    assert!(dst.bytes().iter().all(|&x| x == 0));
}

#[test]
fn dropped_registration_is_refused() {
    let dev = TcpDevice::new(0);
    let src = Buf::filled(&dev, 64, 8);
    let dst = Buf::new(&dev, 64);
    let (addr, rkey) = (dst.addr(0), dst.rkey());
    let region = dst.region.clone();
    drop(dst.mr);
    let mut p = Pair::new(&dev, &dev);
    p.a.post_send(&[send_wr(
        1,
        &[src.sge(0, 64)],
        SendOpcode::RdmaWrite {
            remote_addr: addr,
            rkey,
        },
        true,
    )])
    .expect("post_send");
    p.drive_to(1, 0);
    assert_eq!(p.wa, [err(1, WcStatus::RemoteAccess, WcOpcode::RdmaWrite)]);
    let mut v = vec![0; 64];
    region.read(0, &mut v).expect("read");
    assert!(v.iter().all(|&x| x == 0));
}

#[test]
fn unregistered_sge_is_local_protection() {
    let dev = TcpDevice::new(0);
    let src = Buf::filled(&dev, 64, 9);
    let dst = Buf::new(&dev, 256);
    let mut p = Pair::new(&dev, &dev);
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
    assert_eq!(
        p.wa,
        [
            ok(10, WcOpcode::Send, 0, None),
            err(11, WcStatus::LocalProtection, WcOpcode::Send),
            err(12, WcStatus::WrFlush, WcOpcode::Send)
        ]
    );
    assert_eq!(p.wb, [ok(1, WcOpcode::Recv, 16, None)]);

    let mut p = Pair::new(&dev, &dev);
    p.a.post_send(&[send(20, &[past_end])]).expect("post_send");
    p.drive_to(1, 0);
    assert_eq!(p.wa, [err(20, WcStatus::LocalProtection, WcOpcode::Send)]);
}

#[test]
fn send_longer_than_recv_buffer() {
    let dev = TcpDevice::new(0);
    let src = Buf::filled(&dev, 64, 10);
    let dst = Buf::new(&dev, 64);
    let mut p = Pair::new(&dev, &dev);
    p.b.post_recv(&[recv(1, dst.sge(0, 16)), recv(2, dst.sge(16, 48))])
        .expect("post_recv");
    p.a.post_send(&[send(5, &[src.sge(0, 32)]), send(6, &[src.sge(0, 4)])])
        .expect("post_send");
    p.drive_to(2, 2);
    p.settle();
    assert_eq!(
        p.wa,
        [
            err(5, WcStatus::RemoteInvalidRequest, WcOpcode::Send),
            err(6, WcStatus::WrFlush, WcOpcode::Send)
        ]
    );
    assert_eq!(
        p.wb,
        [
            err(1, WcStatus::LocalLength, WcOpcode::Recv),
            err(2, WcStatus::WrFlush, WcOpcode::Recv)
        ]
    );
    assert!(dst.bytes().iter().all(|&x| x == 0), "nothing written");
}

#[test]
fn recv_with_unregistered_buffer_is_remote_operation() {
    let dev = TcpDevice::new(0);
    let src = Buf::filled(&dev, 64, 10);
    let dst = Buf::new(&dev, 64);
    let mut p = Pair::new(&dev, &dev);
    let bad = Sge {
        lkey: dst.mr.keys().lkey ^ 0x8000_0000,
        ..dst.sge(0, 64)
    };
    p.b.post_recv(&[recv(1, bad)]).expect("post_recv");
    p.a.post_send(&[send(5, &[src.sge(0, 32)])])
        .expect("post_send");
    p.drive_to(1, 1);
    assert_eq!(p.wa, [err(5, WcStatus::RemoteOperation, WcOpcode::Send)]);
    assert_eq!(p.wb, [err(1, WcStatus::LocalProtection, WcOpcode::Recv)]);
    assert!(dst.bytes().iter().all(|&x| x == 0));
}

// ------------------------------------------------------------------------------------------
// RNR.

#[test]
fn rnr_then_recv_posted_later_completes() {
    on_one_and_two_devices(|da, db| {
        let src = Buf::filled(da, 256, 11);
        let dst = Buf::new(db, 256);
        let mut p = Pair::new(da, db);
        p.a.post_send(&[
            send(1, &[src.sge(0, 100)]),
            // Behind the RNR'd SEND: must wait for it (RC ordering).
            send_wr(
                2,
                &[src.sge(100, 50)],
                SendOpcode::RdmaWrite {
                    remote_addr: dst.addr(200),
                    rkey: dst.rkey(),
                },
                true,
            ),
        ])
        .expect("post_send");
        p.drive("two RNR NAKs", |p| p.b.counters().rnr_naks_sent >= 2);
        assert!(p.wa.is_empty() && p.wb.is_empty());
        assert!(dst.bytes().iter().all(|&x| x == 0), "the write waits too");
        p.b.post_recv(&[recv(9, dst.sge(0, 128))])
            .expect("post_recv");
        p.drive_to(2, 1);
        p.settle();
        assert_eq!(
            p.wa,
            [
                ok(1, WcOpcode::Send, 0, None),
                ok(2, WcOpcode::RdmaWrite, 0, None)
            ]
        );
        assert_eq!(p.wb, [ok(9, WcOpcode::Recv, 100, None)]);
        let got = dst.bytes();
        assert_eq!(&got[..100], &src.bytes()[..100]);
        assert_eq!(&got[200..250], &src.bytes()[100..150]);
        let (ca, cb) = (p.a.counters(), p.b.counters());
        assert!(ca.rnr_naks_received >= 1);
        assert_eq!(ca.rnr_naks_received, cb.rnr_naks_sent);
        assert_eq!(ca.rnr_naks_sent, 0);
        assert_eq!(cb.rnr_naks_received, 0);
    });
}

#[test]
fn rnr_retry_exceeded_then_flush() {
    for rnr_retry in 0..=2u8 {
        let dev = TcpDevice::new(0);
        let src = Buf::filled(&dev, 64, 12);
        let dst = Buf::new(&dev, 64);
        let ca = QpConfig {
            rnr_retry,
            ..qp_cfg()
        };
        let mut p = Pair::create(&dev, &dev, &ca, &qp_cfg()).connect();
        p.a.post_send(&[
            send(1, &[src.sge(0, 8)]),
            send_wr(
                2,
                &[src.sge(0, 8)],
                SendOpcode::RdmaWrite {
                    remote_addr: dst.addr(0),
                    rkey: dst.rkey(),
                },
                false,
            ),
            send(3, &[src.sge(0, 8)]),
        ])
        .expect("post_send");
        p.drive_to(3, 0);
        p.settle();
        assert_eq!(
            p.wa,
            [
                err(1, WcStatus::RnrRetryExceeded, WcOpcode::Send),
                err(2, WcStatus::WrFlush, WcOpcode::RdmaWrite),
                err(3, WcStatus::WrFlush, WcOpcode::Send)
            ],
            "rnr_retry {rnr_retry}"
        );
        assert!(p.wb.is_empty());
        let want = u64::from(rnr_retry) + 1;
        assert_eq!(p.a.counters().rnr_naks_received, want);
        assert_eq!(p.b.counters().rnr_naks_sent, want);
        assert!(dst.bytes().iter().all(|&x| x == 0), "the write never ran");
        p.a.post_send(&[send(4, &[src.sge(0, 8)])])
            .expect("post on error");
        p.drive_to(4, 0);
        assert_eq!(p.wa[3], err(4, WcStatus::WrFlush, WcOpcode::Send));
        assert!(!p.a.peer_closed());
    }
}

#[test]
fn large_send_survives_rnr_and_is_resent_from_memory() {
    let dev = TcpDevice::new(0);
    let len = 1 << 20;
    let src = Buf::filled(&dev, len, 13);
    let dst = Buf::new(&dev, len);
    let mut p = Pair::new(&dev, &dev);
    p.a.post_send(&[send(1, &[src.sge(0, len as u32)])])
        .expect("post_send");
    p.drive("two RNR NAKs", |p| p.b.counters().rnr_naks_sent >= 2);
    p.b.post_recv(&[recv(2, dst.sge(0, len as u32))])
        .expect("post_recv");
    p.drive_to(1, 1);
    assert_eq!(p.wa, [ok(1, WcOpcode::Send, 0, None)]);
    assert_eq!(p.wb, [ok(2, WcOpcode::Recv, len as u32, None)]);
    assert!(dst.bytes() == src.bytes());
}

// ------------------------------------------------------------------------------------------
// Volume and ordering.

#[test]
fn sixteen_mib_write_completes_with_the_right_bytes() {
    let dev = TcpDevice::new(0);
    let len = 16 << 20;
    let src = Buf::filled(&dev, len, 14);
    let dst = Buf::new(&dev, len);
    let mut p = Pair::new(&dev, &dev);
    p.a.post_send(&[send_wr(
        1,
        &[src.sge(0, len as u32)],
        SendOpcode::RdmaWrite {
            remote_addr: dst.addr(0),
            rkey: dst.rkey(),
        },
        true,
    )])
    .expect("post_send");
    p.drive_to(1, 0);
    assert_eq!(p.wa, [ok(1, WcOpcode::RdmaWrite, 0, None)]);
    assert!(dst.bytes() == src.bytes(), "16 MiB differ");
}

#[test]
fn simultaneous_large_transfers_both_ways() {
    let dev = TcpDevice::new(0);
    let len = 8 << 20;
    let sa = Buf::filled(&dev, len, 15);
    let sb = Buf::filled(&dev, len, 16);
    let da = Buf::new(&dev, len);
    let db = Buf::new(&dev, len);
    let mut p = Pair::new(&dev, &dev);
    p.a.post_recv(&[recv(0xa, da.sge(0, len as u32))])
        .expect("post_recv");
    p.a.post_send(&[send_wr(
        1,
        &[sa.sge(0, len as u32)],
        SendOpcode::RdmaWriteWithImm {
            remote_addr: db.addr(0),
            rkey: db.rkey(),
            imm: 1,
        },
        true,
    )])
    .expect("post_send");
    p.b.post_recv(&[recv(0xb, db.sge(0, 16))])
        .expect("post_recv");
    p.b.post_send(&[send(2, &[sb.sge(0, len as u32)])])
        .expect("post_send");
    p.drive_to(2, 2);
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
    assert!(da.bytes() == sb.bytes());
    assert!(db.bytes() == sa.bytes());
}

#[test]
fn a_thousand_small_sends_arrive_in_order() {
    let dev = TcpDevice::new(0);
    let n = 1000usize;
    let src = Buf::new(&dev, n * 64);
    let dst = Buf::new(&dev, n * 64);
    for i in 0..n {
        let mut m = [0u8; 64];
        m[..8].copy_from_slice(&(i as u64).to_le_bytes());
        m[8..].iter_mut().for_each(|x| *x = i as u8);
        src.region.write(i * 64, &m).expect("fill");
    }
    let len = |i: usize| 8 + (i % 57) as u32;
    let mut p = Pair::new(&dev, &dev);
    let recvs: Vec<RecvWr> = (0..n)
        .map(|i| recv(i as u64, dst.sge(i * 64, 64)))
        .collect();
    p.b.post_recv(&recvs).expect("post_recv");
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

#[test]
fn psn_wraps_around() {
    let dev = TcpDevice::new(0);
    let src = Buf::filled(&dev, 64, 17);
    let dst = Buf::new(&dev, 64 * 10);
    let a: Box<dyn QueuePair> = Box::new(TcpQp::new(
        0x11,
        u32::MAX - 3,
        qp_cfg(),
        Arc::clone(&dev.registry),
    ));
    let b: Box<dyn QueuePair> = Box::new(TcpQp::new(
        0x22,
        u32::MAX,
        qp_cfg(),
        Arc::clone(&dev.registry),
    ));
    let mut p = Pair {
        a,
        b,
        wa: Vec::new(),
        wb: Vec::new(),
    }
    .connect();
    let recvs: Vec<RecvWr> = (0..10)
        .map(|i| recv(i, dst.sge(64 * i as usize, 64)))
        .collect();
    p.b.post_recv(&recvs[..5]).expect("post_recv");
    let sends: Vec<SendWr> = (0..10)
        .map(|i| send(100 + i, &[src.sge(i as usize, 20)]))
        .collect();
    p.a.post_send(&sends).expect("post_send");
    p.drive("RNR after 5", |p| {
        p.wb.len() == 5 && p.b.counters().rnr_naks_sent >= 1
    });
    p.b.post_recv(&recvs[5..]).expect("post_recv");
    p.drive_to(10, 10);
    let want_a: Vec<Wc> = (0..10)
        .map(|i| ok(100 + i, WcOpcode::Send, 0, None))
        .collect();
    let want_b: Vec<Wc> = (0..10).map(|i| ok(i, WcOpcode::Recv, 20, None)).collect();
    assert_eq!(p.wa, want_a);
    assert_eq!(p.wb, want_b);
    for i in 0..10usize {
        assert_eq!(&dst.bytes()[64 * i..64 * i + 20], &src.bytes()[i..i + 20]);
    }
    // The other direction wraps too (b starts at u32::MAX).
    p.a.post_recv(&[recv(7, dst.sge(0, 64)), recv(8, dst.sge(0, 64))])
        .expect("post_recv");
    p.b.post_send(&[send(1, &[src.sge(0, 4)]), send(2, &[src.sge(0, 4)])])
        .expect("post_send");
    p.drive_to(12, 12);
    assert_eq!(
        p.wb[10..],
        [
            ok(1, WcOpcode::Send, 0, None),
            ok(2, WcOpcode::Send, 0, None)
        ]
    );
}

#[test]
fn reg_mr_from_another_thread_while_polling() {
    let dev = Arc::new(TcpDevice::new(0));
    let src = Buf::filled(&*dev, 4096, 18);
    let dst = Buf::new(&*dev, 4096 * 64);
    let mut p = Pair::new(&*dev, &*dev);
    let d2 = Arc::clone(&dev);
    let t = std::thread::spawn(move || {
        for _ in 0..2000 {
            let r = Region::alloc(64);
            let mr = d2.reg_mr(r).expect("reg_mr");
            assert_ne!(mr.keys().lkey, 0);
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
    t.join().expect("registering thread");
    assert_eq!(dev.registry.len(), 2, "only src and dst remain");
    for i in 0..64 {
        assert_eq!(&dst.bytes()[i * 4096..(i + 1) * 4096], &src.bytes()[..]);
    }
}

// ------------------------------------------------------------------------------------------
// Peer death and hostile peers.

#[test]
fn peer_drop_fails_outstanding_sends_with_retry_exceeded() {
    let dev = TcpDevice::new(0);
    let src = Buf::filled(&dev, 1 << 20, 19);
    let dst = Buf::new(&dev, 64);
    let mut p = Pair::new(&dev, &dev);
    p.a.post_recv(&[recv(0xa1, dst.sge(0, 64)), recv(0xa2, dst.sge(0, 64))])
        .expect("post_recv");
    // B never posts a receive: the SEND keeps being RNR'd until B goes away.
    p.a.post_send(&[
        send(1, &[src.sge(0, 64)]),
        send_wr(2, &[src.sge(0, 1 << 20)], SendOpcode::Send, false),
    ])
    .expect("post_send");
    p.drive("an RNR NAK", |p| p.a.counters().rnr_naks_received >= 1);
    let Pair { mut a, b, .. } = p;
    drop(b);
    let mut wa = Vec::new();
    for _ in 0..MAX_POLLS {
        a.poll_cq(&mut wa, 16).expect("poll");
        if wa.len() >= 4 {
            break;
        }
    }
    assert!(a.peer_closed());
    assert_eq!(
        wa,
        [
            err(0xa1, WcStatus::WrFlush, WcOpcode::Recv),
            err(0xa2, WcStatus::WrFlush, WcOpcode::Recv),
            err(1, WcStatus::RetryExceeded, WcOpcode::Send),
            err(2, WcStatus::RetryExceeded, WcOpcode::Send)
        ]
    );
    // Nothing more, no spinning errors; later WRs flush.
    a.post_send(&[send(3, &[src.sge(0, 8)])])
        .expect("post on error");
    assert_eq!(a.poll_cq(&mut wa, 16).expect("poll"), 1);
    assert_eq!(wa[4], err(3, WcStatus::WrFlush, WcOpcode::Send));
    assert_eq!(a.poll_cq(&mut wa, 16).expect("poll"), 0);
}

/// A QP whose peer is a raw socket the test writes into.
struct Raw {
    qp: Box<dyn QueuePair>,
    peer: TcpStream,
    wc: Vec<Wc>,
    dev: TcpDevice,
    buf: Buf,
    src: Buf,
}

/// PSN the raw peer announces for its messages.
const RAW_PSN: u32 = 0x1000;

impl Raw {
    fn new() -> Raw {
        let dev = TcpDevice::new(0);
        let mut qp = dev.create_qp(&qp_cfg()).expect("create");
        let buf = Buf::new(&dev, 256);
        let src = Buf::filled(&dev, 64, 20);
        qp.post_recv(&[recv(0xe1, buf.sge(0, 128)), recv(0xe2, buf.sge(128, 128))])
            .expect("post_recv");
        let (s, peer) = stream_pair();
        let info = ConnInfo {
            qp_num: 0x42,
            initial_psn: RAW_PSN,
        }
        .encode();
        qp.establish(&info, s).expect("establish");
        qp.post_send(&[send(0x51, &[src.sge(0, 16)])])
            .expect("post_send");
        Raw {
            qp,
            peer,
            wc: Vec::new(),
            dev,
            buf,
            src,
        }
    }

    fn inject(&mut self, bytes: &[u8]) {
        let mut off = 0;
        while off < bytes.len() {
            match self.peer.write(&bytes[off..]) {
                Ok(n) => off += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.qp.poll_cq(&mut self.wc, 16).expect("poll");
                }
                Err(e) => panic!("raw write: {e}"),
            }
        }
    }

    fn poll_until(&mut self, n: usize) {
        for _ in 0..MAX_POLLS {
            self.qp.poll_cq(&mut self.wc, 16).expect("poll");
            if self.wc.len() >= n {
                return;
            }
        }
        panic!("livelock: {:?}", self.wc);
    }

    /// Reads exactly `n` bytes the QP wrote, polling the QP whenever the socket is empty.
    fn read_exact(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        let mut off = 0;
        let mut idle = 0;
        while off < n {
            match self.peer.read(&mut v[off..]) {
                Ok(0) => panic!("EOF after {off} of {n} bytes"),
                Ok(k) => {
                    off += k;
                    idle = 0;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    idle += 1;
                    assert!(idle < MAX_POLLS, "livelock: {off} of {n} bytes");
                    self.qp.poll_cq(&mut self.wc, 16).expect("poll");
                }
                Err(e) => panic!("raw read: {e}"),
            }
        }
        v
    }

    fn read_header(&mut self) -> Frame {
        let v = self.read_exact(HEADER_LEN);
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&v);
        Frame::decode(&h).expect("the QP sends valid frames")
    }

    fn initial_psn(&self) -> u32 {
        ConnInfo::decode(&self.qp.local_info())
            .expect("own info")
            .initial_psn
    }

    /// Every frame the QP wrote to the raw peer so far (payloads skipped).
    fn frames_sent(&mut self) -> Vec<Frame> {
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match self.peer.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => bytes.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => panic!("raw read: {e}"),
            }
        }
        let mut frames = Vec::new();
        let mut off = 0;
        while off + HEADER_LEN <= bytes.len() {
            let mut h = [0u8; HEADER_LEN];
            h.copy_from_slice(&bytes[off..off + HEADER_LEN]);
            let f = Frame::decode(&h).expect("the QP sends valid frames");
            off += HEADER_LEN;
            if let Frame::Send { len, .. }
            | Frame::Write { len, .. }
            | Frame::WriteImm { len, .. } = f
            {
                off += len as usize;
            }
            frames.push(f);
        }
        frames
    }

    /// The QP failed because of a malformed frame.
    fn assert_protocol_failure(&mut self, case: &str) {
        self.poll_until(3);
        for _ in 0..50 {
            self.qp.poll_cq(&mut self.wc, 16).expect("poll");
        }
        assert_eq!(
            self.wc,
            [
                err(0xe1, WcStatus::RemoteInvalidRequest, WcOpcode::Recv),
                err(0xe2, WcStatus::WrFlush, WcOpcode::Recv),
                err(0x51, WcStatus::RemoteInvalidRequest, WcOpcode::Send)
            ],
            "{case}"
        );
        assert!(
            self.buf.bytes().iter().all(|&x| x == 0),
            "{case}: nothing written"
        );
        let frames = self.frames_sent();
        assert_eq!(
            frames.last(),
            Some(&Frame::Nak {
                psn: RAW_PSN,
                code: NakCode::InvalidRequest
            }),
            "{case}: {frames:?}"
        );
        assert!(!self.qp.peer_closed(), "{case}");
        // More garbage is dropped without effect.
        self.inject(&[0xff; 1000]);
        assert_eq!(self.qp.poll_cq(&mut self.wc, 16).expect("poll"), 0);
    }
}

fn header(f: Frame) -> [u8; HEADER_LEN] {
    f.encode()
}

#[test]
fn hostile_peer_garbage_is_a_protocol_error() {
    // Deterministic pseudo-random bytes (xorshift): no valid magic at offset 0.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let random: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let mut huge = header(Frame::Send {
        psn: RAW_PSN,
        len: 0,
    });
    huge[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
    let mut bad_op = header(Frame::Send {
        psn: RAW_PSN,
        len: 0,
    });
    bad_op[3] = 0x7f;
    let mut reserved = header(Frame::Send {
        psn: RAW_PSN,
        len: 0,
    });
    reserved[30] = 1;
    let mut version = header(Frame::Send {
        psn: RAW_PSN,
        len: 0,
    });
    version[2] = 0;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("random bytes", random),
        ("oversized length", huge.to_vec()),
        ("bad opcode", bad_op.to_vec()),
        ("reserved bits", reserved.to_vec()),
        ("wrong version", version.to_vec()),
        (
            "wrong psn",
            header(Frame::Send {
                psn: RAW_PSN + 5,
                len: 0,
            })
            .to_vec(),
        ),
        (
            "ack never sent",
            header(Frame::Ack { psn: 0x7777 }).to_vec(),
        ),
        (
            "rnr nak never sent",
            header(Frame::RnrNak {
                psn: 0x7777,
                timer: 1,
            })
            .to_vec(),
        ),
    ];
    for (case, bytes) in cases {
        let mut raw = Raw::new();
        raw.inject(&bytes);
        raw.assert_protocol_failure(case);
        drop(raw.dev);
    }
}

#[test]
fn hostile_peer_writes_outside_registered_memory() {
    let mut raw = Raw::new();
    let rkey = raw.buf.rkey();
    let addr = raw.buf.addr(200);
    // 1 KiB at offset 200 of a 256-byte region: refused, nothing written.
    let mut bytes = header(Frame::Write {
        psn: RAW_PSN,
        len: 1024,
        remote_addr: addr,
        rkey,
    })
    .to_vec();
    bytes.extend_from_slice(&[0xee; 1024]);
    raw.inject(&bytes);
    raw.poll_until(3);
    assert_eq!(
        raw.wc,
        [
            err(0xe1, WcStatus::WrFlush, WcOpcode::Recv),
            err(0xe2, WcStatus::WrFlush, WcOpcode::Recv),
            err(0x51, WcStatus::WrFlush, WcOpcode::Send)
        ]
    );
    assert!(raw.buf.bytes().iter().all(|&x| x == 0));
    let frames = raw.frames_sent();
    assert_eq!(
        frames.last(),
        Some(&Frame::Nak {
            psn: RAW_PSN,
            code: NakCode::Access
        }),
        "{frames:?}"
    );
    let _ = &raw.src;
}

#[test]
fn hostile_peer_valid_frames_work_then_truncation_is_peer_death() {
    let mut raw = Raw::new();
    // A well-formed SEND into the first receive, and an ACK of our SEND.
    let our_psn = {
        let frames = {
            raw.poll_until(0);
            for _ in 0..10 {
                raw.qp.poll_cq(&mut raw.wc, 16).expect("poll");
            }
            raw.frames_sent()
        };
        match frames.first() {
            Some(Frame::Send { psn, len: 16 }) => *psn,
            other => panic!("expected our SEND, got {other:?}"),
        }
    };
    let mut bytes = header(Frame::Send {
        psn: RAW_PSN,
        len: 5,
    })
    .to_vec();
    bytes.extend_from_slice(b"hello");
    bytes.extend_from_slice(&header(Frame::Ack { psn: our_psn }));
    raw.inject(&bytes);
    raw.poll_until(2);
    assert_eq!(
        raw.wc,
        [
            ok(0xe1, WcOpcode::Recv, 5, None),
            ok(0x51, WcOpcode::Send, 0, None)
        ]
    );
    assert_eq!(&raw.buf.bytes()[..5], b"hello");
    for _ in 0..10 {
        raw.qp.poll_cq(&mut raw.wc, 16).expect("poll");
    }
    assert_eq!(
        raw.frames_sent(),
        [Frame::Ack { psn: RAW_PSN }],
        "the QP acknowledged the SEND"
    );
    // Half a header, then the peer goes away.
    raw.qp
        .post_send(&[send(0x52, &[raw.src.sge(0, 8)])])
        .expect("post_send");
    raw.inject(
        &header(Frame::Send {
            psn: RAW_PSN + 1,
            len: 100,
        })[..20],
    );
    raw.peer
        .shutdown(std::net::Shutdown::Both)
        .expect("shutdown");
    raw.poll_until(4);
    assert!(raw.qp.peer_closed());
    assert_eq!(
        raw.wc[2..],
        [
            err(0xe2, WcStatus::WrFlush, WcOpcode::Recv),
            err(0x52, WcStatus::RetryExceeded, WcOpcode::Send)
        ]
    );
}

/// Bytes no loopback socket pair buffers: a payload this large is still being written by the
/// QP while the raw peer reads nothing.
const UNBUFFERABLE: usize = 32 << 20;

#[test]
fn nak_during_own_payload_completes_only_after_the_frame_is_out() {
    let mut raw = Raw::new();
    let psn0 = raw.initial_psn();
    let big = Buf::filled(&raw.dev, UNBUFFERABLE, 21);
    raw.qp
        .post_send(&[send(0x60, &[big.sge(0, UNBUFFERABLE as u32)])])
        .expect("post_send");
    assert_eq!(raw.read_header(), Frame::Send { psn: psn0, len: 16 });
    assert_eq!(raw.read_exact(16), raw.src.bytes()[..16]);
    assert_eq!(
        raw.read_header(),
        Frame::Send {
            psn: psn0 + 1,
            len: UNBUFFERABLE as u32
        }
    );
    raw.inject(&header(Frame::Nak {
        psn: psn0 + 1,
        code: NakCode::Access,
    }));
    for _ in 0..200 {
        raw.qp.poll_cq(&mut raw.wc, 16).expect("poll");
    }
    // The NAK acknowledged 0x51; 0x60's memory is still being sent, so it cannot complete.
    assert_eq!(raw.wc, [ok(0x51, WcOpcode::Send, 0, None)]);
    let payload = raw.read_exact(UNBUFFERABLE);
    assert!(payload == big.bytes(), "the frame is completed from memory");
    raw.poll_until(4);
    assert_eq!(
        raw.wc,
        [
            ok(0x51, WcOpcode::Send, 0, None),
            err(0x60, WcStatus::RemoteAccess, WcOpcode::Send),
            err(0xe1, WcStatus::WrFlush, WcOpcode::Recv),
            err(0xe2, WcStatus::WrFlush, WcOpcode::Recv)
        ]
    );
    for _ in 0..50 {
        raw.qp.poll_cq(&mut raw.wc, 16).expect("poll");
    }
    assert_eq!(raw.frames_sent(), [], "nothing after the failed frame");
}

#[test]
fn rnr_nak_during_own_payload_finishes_the_frame_then_resends_it() {
    let mut raw = Raw::new();
    let psn0 = raw.initial_psn();
    let big = Buf::filled(&raw.dev, UNBUFFERABLE, 22);
    raw.qp
        .post_send(&[send(0x60, &[big.sge(0, UNBUFFERABLE as u32)])])
        .expect("post_send");
    assert_eq!(raw.read_header(), Frame::Send { psn: psn0, len: 16 });
    raw.read_exact(16);
    let big_header = Frame::Send {
        psn: psn0 + 1,
        len: UNBUFFERABLE as u32,
    };
    assert_eq!(raw.read_header(), big_header);
    raw.inject(&header(Frame::RnrNak {
        psn: psn0 + 1,
        timer: 1,
    }));
    // The interrupted frame is finished first (framing), then the message comes again.
    assert!(raw.read_exact(UNBUFFERABLE) == big.bytes());
    assert_eq!(raw.read_header(), big_header);
    assert!(
        raw.read_exact(UNBUFFERABLE) == big.bytes(),
        "resent from memory"
    );
    assert_eq!(raw.wc, [ok(0x51, WcOpcode::Send, 0, None)]);
    raw.inject(&header(Frame::Ack { psn: psn0 + 1 }));
    raw.poll_until(2);
    assert_eq!(
        raw.wc,
        [
            ok(0x51, WcOpcode::Send, 0, None),
            ok(0x60, WcOpcode::Send, 0, None)
        ]
    );
    assert_eq!(raw.qp.counters().rnr_naks_received, 1);
}

#[test]
fn error_drops_data_frames_not_yet_begun() {
    let mut raw = Raw::new();
    let psn0 = raw.initial_psn();
    let src = Buf::filled(&raw.dev, 16 << 10, 23);
    let n = 1000u64;
    let wrs: Vec<SendWr> = (0..n)
        .map(|i| send(0x1000 + i, &[src.sge(0, 16 << 10)]))
        .collect();
    raw.qp.post_send(&wrs).expect("post_send");
    // 16 MiB of small frames: more than the sockets hold, so some stay staged.
    for _ in 0..100 {
        raw.qp.poll_cq(&mut raw.wc, 16).expect("poll");
    }
    raw.inject(&[0xff; HEADER_LEN]);
    // Read everything the QP still writes.
    let mut bytes = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    let mut idle = 0;
    while idle < 100 {
        match raw.peer.read(&mut chunk) {
            Ok(0) => break,
            Ok(k) => {
                bytes.extend_from_slice(&chunk[..k]);
                idle = 0;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => idle += 1,
            Err(e) => panic!("raw read: {e}"),
        }
        raw.qp.poll_cq(&mut raw.wc, 64).expect("poll");
    }
    let mut frames = Vec::new();
    let mut off = 0;
    while off < bytes.len() {
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&bytes[off..off + HEADER_LEN]);
        let f = Frame::decode(&h).expect("still framed");
        off += HEADER_LEN;
        if let Frame::Send { len, .. } = f {
            off += len as usize;
        }
        frames.push(f);
    }
    assert_eq!(off, bytes.len(), "no partial frame");
    let sent = frames.len() - 1;
    assert!(
        sent < n as usize,
        "the frames not begun were dropped: {sent}"
    );
    for (i, f) in frames[..sent].iter().enumerate() {
        let len = if i == 0 { 16 } else { 16 << 10 };
        assert_eq!(
            *f,
            Frame::Send {
                psn: psn0.wrapping_add(i as u32),
                len
            }
        );
    }
    assert_eq!(
        frames[sent],
        Frame::Nak {
            psn: RAW_PSN,
            code: NakCode::InvalidRequest
        }
    );
    assert_eq!(raw.wc.len(), 3 + n as usize);
    assert_eq!(
        raw.wc[..3],
        [
            err(0xe1, WcStatus::RemoteInvalidRequest, WcOpcode::Recv),
            err(0xe2, WcStatus::WrFlush, WcOpcode::Recv),
            err(0x51, WcStatus::RemoteInvalidRequest, WcOpcode::Send)
        ]
    );
    for (i, wc) in raw.wc[3..].iter().enumerate() {
        assert_eq!(
            *wc,
            err(0x1000 + i as u64, WcStatus::WrFlush, WcOpcode::Send)
        );
    }
}

#[test]
fn destination_deregistered_mid_write_stops_writing() {
    let dev = TcpDevice::new(0);
    let src = Buf::filled(&dev, UNBUFFERABLE, 24);
    let Buf { region: dst, mr } = Buf::new(&dev, UNBUFFERABLE);
    let rkey = mr.keys().rkey;
    let mut p = Pair::new(&dev, &dev);
    p.a.post_send(&[send_wr(
        1,
        &[src.sge(0, UNBUFFERABLE as u32)],
        SendOpcode::RdmaWrite {
            remote_addr: dst.addr(),
            rkey,
        },
        true,
    )])
    .expect("post_send");
    let landed = |dst: &Region| {
        let mut b = [0u8; 1];
        dst.read(0, &mut b).expect("read");
        b[0] != 0
    };
    p.drive("the first bytes", |_| landed(&dst));
    drop(mr);
    let snapshot = {
        let mut v = vec![0; UNBUFFERABLE];
        dst.read(0, &mut v).expect("read");
        v
    };
    assert!(snapshot[UNBUFFERABLE - 1] == 0, "still in flight");
    p.drive_to(1, 0);
    p.settle();
    assert_eq!(p.wa, [err(1, WcStatus::RemoteAccess, WcOpcode::RdmaWrite)]);
    let mut after = vec![0; UNBUFFERABLE];
    dst.read(0, &mut after).expect("read");
    assert!(after == snapshot, "nothing written after deregistration");
}

#[test]
fn source_deregistered_mid_send_fails_locally_and_closes() {
    let dev = TcpDevice::new(0);
    let Buf { region: src, mr } = Buf::filled(&dev, UNBUFFERABLE, 25);
    let lkey = mr.keys().lkey;
    let dst = Buf::new(&dev, UNBUFFERABLE);
    let mut p = Pair::new(&dev, &dev);
    p.b.post_recv(&[recv(0xb, dst.sge(0, UNBUFFERABLE as u32))])
        .expect("post_recv");
    p.a.post_send(&[send(
        1,
        &[Sge {
            addr: src.addr(),
            length: UNBUFFERABLE as u32,
            lkey,
        }],
    )])
    .expect("post_send");
    // One round moves at most a few socket buffers' worth (autotuning has barely started).
    p.poll();
    assert!(p.wa.is_empty() && p.wb.is_empty(), "still in flight");
    drop(mr);
    p.drive_to(1, 1);
    assert_eq!(p.wa, [err(1, WcStatus::LocalProtection, WcOpcode::Send)]);
    assert_eq!(p.wb, [err(0xb, WcStatus::WrFlush, WcOpcode::Recv)]);
    assert!(p.b.peer_closed());
    assert!(!p.a.peer_closed());
}

#[test]
fn hostile_peer_fuzz_never_panics_and_completes_every_wr_once() {
    let mut x: u64 = 0x1234_5678_9abc_def1;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..300 {
        let mut raw = Raw::new();
        let psn0 = raw.initial_psn();
        let region_addr = raw.buf.addr(0);
        let mut bytes = Vec::new();
        for _ in 0..rnd() % 6 + 1 {
            let psn = if rnd() % 4 == 0 {
                rnd() as u32
            } else {
                RAW_PSN + (rnd() % 3) as u32
            };
            let len = (rnd() % 300) as u32;
            let rkey = if rnd() % 2 == 0 {
                raw.buf.rkey()
            } else {
                rnd() as u32
            };
            let remote_addr = region_addr.wrapping_add(rnd() % 400).wrapping_sub(50);
            let ours = psn0.wrapping_add((rnd() % 3) as u32).wrapping_sub(1);
            let f = match rnd() % 6 {
                0 => Frame::Send { psn, len },
                1 => Frame::Write {
                    psn,
                    len,
                    remote_addr,
                    rkey,
                },
                2 => Frame::WriteImm {
                    psn,
                    len,
                    remote_addr,
                    rkey,
                    imm: rnd() as u32,
                },
                3 => Frame::Ack { psn: ours },
                4 => Frame::RnrNak {
                    psn: ours,
                    timer: (rnd() % 32) as u8,
                },
                _ => Frame::Nak {
                    psn: ours,
                    code: NakCode::Access,
                },
            };
            let mut h = f.encode();
            if rnd() % 5 == 0 {
                h[(rnd() % 32) as usize] ^= 1 << (rnd() % 8);
            }
            bytes.extend_from_slice(&h);
            if matches!(
                f,
                Frame::Send { .. } | Frame::Write { .. } | Frame::WriteImm { .. }
            ) {
                bytes.extend((0..len).map(|_| rnd() as u8));
            }
        }
        if rnd() % 4 == 0 {
            bytes.truncate(rnd() as usize % (bytes.len() + 1));
        }
        raw.inject(&bytes);
        for _ in 0..20 {
            raw.qp.poll_cq(&mut raw.wc, 16).expect("poll");
        }
        raw.peer
            .shutdown(std::net::Shutdown::Both)
            .expect("shutdown");
        raw.poll_until(3);
        for _ in 0..20 {
            raw.qp.poll_cq(&mut raw.wc, 16).expect("poll");
        }
        let mut ids: Vec<u64> = raw.wc.iter().map(|w| w.wr_id).collect();
        ids.sort_unstable();
        assert_eq!(ids, [0x51, 0xe1, 0xe2], "round {round}: {:?}", raw.wc);
        assert!(raw.qp.peer_closed(), "round {round}");
    }
}
