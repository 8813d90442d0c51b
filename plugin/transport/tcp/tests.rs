//! Tests of what only the tcp transport has: its frame and connection-info wire format, its
//! device properties, key registry and attribute checks, PSN wrap-around, peers that speak
//! raw (hostile or truncated) bytes on the socket, and memory deregistered mid-frame. Real
//! sockets on 127.0.0.1, both ends driven by one thread with a bounded number of polls (a
//! livelock fails the test).
//!
//! The verbs behaviour every transport shares (SEND/WRITE/WRITE_WITH_IMM landing, error
//! completions and flushes, RNR, volume and ordering, a dropped peer) is tested once, against
//! every transport, by the conformance suite (`plugin/transport/conformance.rs`, run by
//! `tests/transport_conformance.rs`); this file uses its fixture.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use super::nic::TcpQueuePair;
use super::qp::TcpQp;
use super::wire::{self, ConnInfo, Frame, FrameError, NakCode, HEADER_LEN, MAX_MSG_LEN};
use super::{open_devices, TcpDevice};
use crate::config::Config;
use crate::mem::Region;
use crate::transport::conformance::{
    self, err, ok, qp_cfg, recv, send, send_wr, stream_pair, Buf, Pair, MAX_POLLS,
};
use crate::transport::{
    Device, QpConfig, QueuePair, RecvWr, SendOpcode, SendWr, Sge, TransportError, Wc, WcOpcode,
    WcStatus,
};

/// A tcp device, as itself (for its registry) and as a `dyn Device` (for the fixture).
fn tcp_device(index: u32) -> (Arc<TcpDevice>, Arc<dyn Device>) {
    let dev = Arc::new(TcpDevice::new(index));
    let d: Arc<dyn Device> = dev.clone();
    (dev, d)
}

/// A tcp device whose QPs move only inside their owners' calls: for tests that stage a race
/// by hand (memory deregistered mid-frame) and must not have the progress thread finish the
/// transfer meanwhile.
fn tcp_device_without_nic(index: u32) -> (Arc<TcpDevice>, Arc<dyn Device>) {
    let dev = Arc::new(TcpDevice::without_nic(index));
    let d: Arc<dyn Device> = dev.clone();
    (dev, d)
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
        Frame::ReadReq {
            psn: 14,
            len: 640,
            remote_addr: 0x7000,
            rkey: 5,
        },
        Frame::ReadResp { psn: 15, len: 640 },
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
        Frame::Bye,
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
            0x56, 0x4e, 4, 3, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x11, 0x12, 0x13, 0x14, 0x15,
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
    // A version-1 peer's frame (before BYE existed), a version-2 one (before the unsignaled
    // flag), a version-3 one (before RDMA READ), and an unknown later version.
    assert_eq!(Frame::decode(&with(2, 1)), Err(FrameError::Version(1)));
    assert_eq!(Frame::decode(&with(2, 2)), Err(FrameError::Version(2)));
    assert_eq!(Frame::decode(&with(2, 3)), Err(FrameError::Version(3)));
    assert_eq!(Frame::decode(&with(2, 5)), Err(FrameError::Version(5)));
    // Byte 29 of a data frame: bit 0 flags an unsignaled WR; any other bit is refused, and
    // a control frame carries no flag.
    assert_eq!(
        Frame::decode(&with(29, 1)),
        Ok(Frame::decode(&good).unwrap())
    );
    assert!(wire::unsignaled(&with(29, 1)) && !wire::unsignaled(&good));
    assert_eq!(
        Frame::decode(&with(29, 2)),
        Err(FrameError::NonZero("reserved"))
    );
    let mut flagged_ack = Frame::Ack { psn: 1 }.encode();
    flagged_ack[29] = 1;
    assert_eq!(
        Frame::decode(&flagged_ack),
        Err(FrameError::NonZero("reserved"))
    );
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
    // BYE: opcode 0x13, every field zero.
    let bye = Frame::Bye.encode();
    assert_eq!(bye[3], 0x13);
    assert!(bye[4..].iter().all(|&b| b == 0));
    for (i, field) in [
        (7, "psn"),
        (11, "length"),
        (28, "syndrome"),
        (20, "remote_addr"),
    ] {
        let mut b = bye;
        b[i] = 1;
        assert_eq!(
            Frame::decode(&b),
            Err(FrameError::NonZero(field)),
            "byte {i}"
        );
    }
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
        [b'V', b'N', b'T', b'Q', 4, 0xab, 0xcd, 0xef, 0xff, 0xff, 0xff, 0xf0]
    );
    assert_eq!(ConnInfo::decode(&b), Ok(info));
    assert!(ConnInfo::decode(&b[..11]).is_err());
    let mut m = b.clone();
    m[0] = b'X';
    assert!(ConnInfo::decode(&m).is_err());
    // A version-1 peer (no BYE frame) is refused here, before any frame flows.
    let mut v = b.clone();
    v[4] = 1;
    match ConnInfo::decode(&v) {
        Err(m) => assert!(m.contains("wire version 1") && m.contains("mixed"), "{m}"),
        Ok(i) => panic!("a version-1 peer was accepted: {i:?}"),
    }
    // Nor a version-3 one (no RDMA READ).
    v[4] = 3;
    match ConnInfo::decode(&v) {
        Err(m) => assert!(m.contains("wire version 3"), "{m}"),
        Ok(i) => panic!("a version-3 peer was accepted: {i:?}"),
    }
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
    let t = conformance::tcp();
    let (_, dev) = tcp_device(0);
    let cfg = QpConfig {
        max_recv_wr: 2,
        max_send_wr: 2,
        ..qp_cfg()
    };
    let buf = Buf::new(&*dev, 64);
    let mut p = Pair::create(&t, &dev, &dev, &cfg, &cfg);
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
// Sequence numbers and registrations.

#[test]
fn psn_wraps_around() {
    let t = conformance::tcp();
    let (dev, d) = tcp_device(0);
    let src = Buf::filled(&*dev, 64, 17);
    let dst = Buf::new(&*dev, 64 * 10);
    let a: Box<dyn QueuePair> = Box::new(TcpQueuePair::new(
        TcpQp::new(0x11, u32::MAX - 3, qp_cfg(), Arc::clone(&dev.registry)),
        dev.nic.clone(),
    ));
    let b: Box<dyn QueuePair> = Box::new(TcpQueuePair::new(
        TcpQp::new(0x22, u32::MAX, qp_cfg(), Arc::clone(&dev.registry)),
        dev.nic.clone(),
    ));
    let mut p = Pair::from_qps(&t, a, b, vec![d]).connect();
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

/// Registrations dropped on another thread while a QP of the device polls leave the registry
/// (the conformance suite's `reg_mr_from_another_thread_while_polling` checks the data path).
#[test]
fn registrations_dropped_on_another_thread_leave_the_registry() {
    let t = conformance::tcp();
    let (dev, d) = tcp_device(0);
    let src = Buf::filled(&*dev, 4096, 18);
    let dst = Buf::new(&*dev, 4096 * 16);
    let mut p = Pair::new(&t, &d, &d);
    let d2 = Arc::clone(&dev);
    let registering = std::thread::spawn(move || {
        for _ in 0..2000 {
            let mr = d2.reg_mr(Region::alloc(64)).expect("reg_mr");
            drop(mr);
        }
    });
    for round in 0..16u64 {
        p.b.post_recv(&[recv(round, dst.sge(round as usize * 4096, 4096))])
            .expect("post_recv");
        p.a.post_send(&[send(round, &[src.sge(0, 4096)])])
            .expect("post_send");
        let k = round as usize + 1;
        p.drive_to(k, k);
    }
    registering.join().expect("registering thread");
    assert_eq!(dev.registry.len(), 2, "only src and dst remain");
    drop((src, dst));
    assert_eq!(dev.registry.len(), 0);
}

// ------------------------------------------------------------------------------------------
// Hostile peers and memory deregistered mid-frame.

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
            "read response never asked for",
            header(Frame::ReadResp {
                psn: 0x7777,
                len: 0,
            })
            .to_vec(),
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
    // The RNR NAK acknowledged 0x51 (the owner or the progress thread took it in; the
    // completion waits for the owner's poll), and only it.
    raw.poll_until(1);
    for _ in 0..50 {
        raw.qp.poll_cq(&mut raw.wc, 16).expect("poll");
    }
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
    let t = conformance::tcp();
    let (_, dev) = tcp_device_without_nic(0);
    let src = Buf::filled(&*dev, UNBUFFERABLE, 24);
    let Buf { region: dst, mr } = Buf::new(&*dev, UNBUFFERABLE);
    let rkey = mr.keys().rkey;
    let mut p = Pair::new(&t, &dev, &dev);
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
        let mut first = [0u8];
        dst.read(0, &mut first).expect("read");
        first[0] != 0
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
    let t = conformance::tcp();
    let (_, dev) = tcp_device_without_nic(0);
    let Buf { region: src, mr } = Buf::filled(&*dev, UNBUFFERABLE, 25);
    let lkey = mr.keys().lkey;
    let dst = Buf::new(&*dev, UNBUFFERABLE);
    let mut p = Pair::new(&t, &dev, &dev);
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

// ------------------------------------------------------------------------------------------
// The progress thread ("NIC") and goodbye.

/// Waits (at most 10 s, a hang guard) until `cond`.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Two handles on `dev` (with its progress thread), connected; as themselves for white-box
/// access.
fn handle_pair(dev: &TcpDevice) -> (TcpQueuePair, TcpQueuePair) {
    let mk = |n| {
        TcpQueuePair::new(
            TcpQp::new(n, n * 1000, qp_cfg(), Arc::clone(&dev.registry)),
            dev.nic.clone(),
        )
    };
    let (mut a, mut b) = (mk(0x31), mk(0x32));
    let (sa, sb) = stream_pair();
    let (ia, ib) = (a.local_info(), b.local_info());
    a.establish(&ib, sa).expect("establish a");
    b.establish(&ia, sb).expect("establish b");
    a.handshake_complete();
    b.handshake_complete();
    (a, b)
}

/// `establish` leaves the stream to the caller until `handshake_complete` (the plugin's
/// acceptor reads the connector's "ready" message from its dup after `establish`): the thread
/// does not run for the QP, so those bytes are the caller's. `handshake_complete`, or else the
/// first data-path call, hands the QP over.
#[test]
fn the_thread_leaves_the_stream_to_the_callers_handshake_until_it_completes() {
    let dev = TcpDevice::new(10);
    let nic = dev.nic.clone().expect("a NIC");
    let mut qp = TcpQueuePair::new(
        TcpQp::new(0x41, 1, qp_cfg(), Arc::clone(&dev.registry)),
        dev.nic.clone(),
    );
    let peer_qp = dev.create_qp(&qp_cfg()).expect("create");
    let (s, mut peer) = stream_pair();
    let mut mine = s.try_clone().expect("dup");
    qp.establish(&peer_qp.local_info(), s).expect("establish");
    peer.write_all(b"RDY!").expect("peer write");
    // (`mine` shares the QP's file status: it stays non-blocking.)
    let mut got = [0u8; 4];
    let mut off = 0;
    wait_for("the handshake bytes", || {
        match mine.read(&mut got[off..]) {
            Ok(n) => off += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("read: {e}"),
        }
        off == got.len()
    });
    assert_eq!(&got, b"RDY!");
    assert!(!nic.running(), "no thread before the handshake completes");
    qp.handshake_complete();
    assert!(
        nic.running(),
        "handshake_complete hands the QP to the thread"
    );
    drop(qp);
    assert!(!nic.running());
    // Without handshake_complete: the owner's first data-path call.
    let mut qp = TcpQueuePair::new(
        TcpQp::new(0x42, 1, qp_cfg(), Arc::clone(&dev.registry)),
        dev.nic.clone(),
    );
    let (s, _peer) = stream_pair();
    qp.establish(&peer_qp.local_info(), s).expect("establish");
    assert!(!nic.running());
    qp.poll_cq(&mut Vec::new(), 1).expect("poll");
    assert!(nic.running(), "the first poll hands the QP to the thread");
}

/// Goodbye: the BYE frame goes behind the frames already staged (a large payload being
/// written is finished first: the stream stays framed), nothing follows it (not even the ACK
/// of a message that arrives later), and later posts are refused. The drop then closes.
#[test]
fn goodbye_follows_the_frames_already_staged_and_nothing_follows_it() {
    let mut raw = Raw::new();
    let psn0 = raw.initial_psn();
    let big = Buf::filled(&raw.dev, UNBUFFERABLE, 41);
    raw.qp
        .post_send(&[send(0x60, &[big.sge(0, UNBUFFERABLE as u32)])])
        .expect("post_send");
    raw.qp.goodbye();
    assert!(matches!(
        raw.qp.post_send(&[send(0x61, &[raw.src.sge(0, 8)])]),
        Err(TransportError::Unavailable(_))
    ));
    assert!(matches!(
        raw.qp.post_recv(&[recv(0xe3, raw.buf.sge(0, 8))]),
        Err(TransportError::Unavailable(_))
    ));
    assert_eq!(raw.read_header(), Frame::Send { psn: psn0, len: 16 });
    assert_eq!(raw.read_exact(16), raw.src.bytes()[..16]);
    assert_eq!(
        raw.read_header(),
        Frame::Send {
            psn: psn0 + 1,
            len: UNBUFFERABLE as u32
        }
    );
    assert!(
        raw.read_exact(UNBUFFERABLE) == big.bytes(),
        "the payload is finished"
    );
    assert_eq!(raw.read_header(), Frame::Bye);
    // A message from the peer is still carried out, but nothing is sent after the BYE.
    let mut bytes = header(Frame::Send {
        psn: RAW_PSN,
        len: 5,
    })
    .to_vec();
    bytes.extend_from_slice(b"hello");
    raw.inject(&bytes);
    raw.poll_until(1);
    assert_eq!(raw.wc, [ok(0xe1, WcOpcode::Recv, 5, None)]);
    for _ in 0..50 {
        raw.qp.poll_cq(&mut raw.wc, 16).expect("poll");
    }
    assert_eq!(raw.frames_sent(), [], "a frame after the BYE");
    let Raw { qp, mut peer, .. } = raw;
    drop(qp);
    peer.set_nonblocking(false).expect("blocking");
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut b = [0u8; 1];
    assert_eq!(
        peer.read(&mut b).expect("EOF"),
        0,
        "the drop closed the stream"
    );
}

/// The BYE frame a peer sends after its data: the data lands, then the close is orderly and
/// the outstanding WRs fail as at a lost connection.
#[test]
fn a_peers_bye_after_its_data_is_an_orderly_close() {
    let mut raw = Raw::new();
    let mut bytes = header(Frame::Send {
        psn: RAW_PSN,
        len: 3,
    })
    .to_vec();
    bytes.extend_from_slice(b"abc");
    bytes.extend_from_slice(&header(Frame::Bye));
    raw.inject(&bytes);
    raw.poll_until(3);
    assert_eq!(
        raw.wc,
        [
            ok(0xe1, WcOpcode::Recv, 3, None),
            err(0xe2, WcStatus::WrFlush, WcOpcode::Recv),
            err(0x51, WcStatus::RetryExceeded, WcOpcode::Send)
        ]
    );
    assert_eq!(&raw.buf.bytes()[..3], b"abc");
    assert!(raw.qp.peer_closed() && raw.qp.peer_closed_orderly());
}

/// A QP dropped with WRs in flight (a 64 KiB SEND in RNR retry: its peer has no receive
/// posted, and a posted receive): the peer sees the close at once (not orderly) and its own
/// outstanding SEND completes; the dropped QP's state and socket are freed (the thread lets go
/// of both), and the device's last QP stops the thread.
#[test]
fn a_qp_dropped_with_work_in_flight_is_freed_and_the_last_one_stops_the_thread() {
    let dev = TcpDevice::new(7);
    let nic = dev.nic.clone().expect("a NIC");
    assert!(!nic.running(), "no thread before the first QP");
    let src = Buf::filled(&dev, 64 << 10, 42);
    let (mut a, mut b) = handle_pair(&dev);
    assert!(nic.running());
    a.post_send(&[send(1, &[src.sge(0, 64 << 10)])])
        .expect("post_send");
    b.post_send(&[send(2, &[src.sge(0, 8)])])
        .expect("post_send");
    let mut wb = Vec::new();
    wait_for("both SENDs refused for want of a receive", || {
        b.poll_cq(&mut wb, 16).expect("poll");
        a.poll_cq(&mut Vec::new(), 16).expect("poll");
        a.counters().rnr_naks_received > 0 && b.counters().rnr_naks_received > 0
    });
    let state = a.shared();
    let socket = a.with_core(|c| c.interest().map(|i| Arc::downgrade(&i.stream)));
    let socket = socket.expect("a socket");
    drop(a);
    wait_for("b to see the close and fail its SEND", || {
        b.poll_cq(&mut wb, 16).expect("poll");
        b.peer_closed() && !wb.is_empty()
    });
    assert_eq!(wb, [err(2, WcStatus::RetryExceeded, WcOpcode::Send)]);
    assert!(!b.peer_closed_orderly(), "a drop is a death");
    wait_for("the dropped QP's state and socket to be freed", || {
        state.strong_count() == 0 && socket.strong_count() == 0
    });
    assert!(nic.running(), "b still lives");
    drop(b);
    assert!(
        !nic.running(),
        "the last QP's drop stops (and joins) the thread"
    );
}

/// With every QP idle (no owner polls, no traffic) the thread waits in `poll(2)` without a
/// timeout: it does not wake at all, where a ticker would wake every millisecond.
#[test]
fn an_idle_thread_does_not_wake() {
    let dev = TcpDevice::new(8);
    let nic = dev.nic.clone().expect("a NIC");
    let (a, b) = handle_pair(&dev);
    wait_for("both QPs to be idle and watched", || {
        a.watched() && b.watched()
    });
    let w0 = nic.wakeups().expect("running");
    std::thread::sleep(Duration::from_millis(100));
    let w1 = nic.wakeups().expect("running");
    // At most one wake already on its way (the second registration's) when the QPs were
    // first found idle.
    assert!(w1 - w0 <= 1, "{} wakeups in 100 ms while idle", w1 - w0);
}

/// The thread never services a QP inside its owner's batch (its ACKs wait for the batch's
/// send): b's owner opens a batch and stays; a's SEND is not carried out however many rounds
/// the thread makes; once b's owner ends the batch (and polls no more) the thread does it.
#[test]
fn the_thread_never_services_a_qp_inside_its_owners_batch() {
    let dev = TcpDevice::new(9);
    let nic = dev.nic.clone().expect("a NIC");
    let src = Buf::filled(&dev, 64, 43);
    let dst = Buf::new(&dev, 64);
    let (mut a, mut b) = handle_pair(&dev);
    b.post_recv(&[recv(0xb1, dst.sge(0, 64))])
        .expect("post_recv");
    b.begin_batch();
    a.post_send(&[send(1, &[src.sge(0, 64)])])
        .expect("post_send");
    let mut wa = Vec::new();
    let w0 = nic.wakeups().expect("running");
    // Rounds are at least IDLE_AFTER apart while a QP is in a batch: 20 of them cover b
    // being long idle.
    wait_for("20 rounds of the thread", || {
        a.poll_cq(&mut wa, 16).expect("poll");
        nic.wakeups().expect("running") >= w0 + 20
    });
    assert!(wa.is_empty(), "b was serviced inside its batch: {wa:?}");
    assert!(dst.bytes().iter().all(|&x| x == 0));
    b.end_batch();
    wait_for("the SEND to complete", || {
        a.poll_cq(&mut wa, 16).expect("poll");
        !wa.is_empty()
    });
    assert_eq!(wa, [ok(1, WcOpcode::Send, 0, None)]);
    let mut wb = Vec::new();
    b.poll_cq(&mut wb, 16).expect("poll");
    assert_eq!(wb, [ok(0xb1, WcOpcode::Recv, 64, None)]);
    assert_eq!(dst.bytes(), src.bytes());
}

/// An RNR timer that ran out on a QP that may no longer resend (it said goodbye) is no reason
/// to wake: the idle QP's thread does not spin on it. (The raw peer keeps the connection open
/// and answers nothing, so only the timer could wake the thread.)
#[test]
fn a_spent_rnr_timer_after_goodbye_does_not_make_the_thread_spin() {
    let dev = TcpDevice::new(11);
    let nic = dev.nic.clone().expect("a NIC");
    let src = Buf::filled(&dev, 64, 44);
    let mut qp = TcpQueuePair::new(
        TcpQp::new(0x51, 500, qp_cfg(), Arc::clone(&dev.registry)),
        dev.nic.clone(),
    );
    let (s, mut peer) = stream_pair();
    let info = ConnInfo {
        qp_num: 0x52,
        initial_psn: RAW_PSN,
    }
    .encode();
    qp.establish(&info, s).expect("establish");
    qp.handshake_complete();
    qp.post_send(&[send(1, &[src.sge(0, 16)])])
        .expect("post_send");
    peer.set_nonblocking(false).expect("blocking");
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut h = [0u8; HEADER_LEN];
    let mut read_frame = |peer: &mut TcpStream| {
        peer.read_exact(&mut h).expect("a header");
        let f = Frame::decode(&h).expect("valid");
        if let Frame::Send { len, .. } = f {
            let mut payload = vec![0u8; len as usize];
            peer.read_exact(&mut payload).expect("the payload");
        }
        f
    };
    assert_eq!(read_frame(&mut peer), Frame::Send { psn: 500, len: 16 });
    // RNR NAK with the shortest timer (10 µs), then goodbye before the QP resends.
    peer.write_all(&header(Frame::RnrNak { psn: 500, timer: 1 }))
        .expect("inject");
    let mut wc = Vec::new();
    while qp.counters().rnr_naks_received == 0 {
        qp.poll_cq(&mut wc, 16).expect("poll");
    }
    qp.goodbye();
    assert_eq!(read_frame(&mut peer), Frame::Bye);
    // The owner stops calling: once the thread has taken the QP (it waits on its socket),
    // count its wakeups.
    wait_for("the QP to be idle and watched", || qp.watched());
    let w0 = nic.wakeups().expect("running");
    std::thread::sleep(Duration::from_millis(100));
    let w1 = nic.wakeups().expect("running");
    assert!(w1 - w0 <= 1, "{} wakeups in 100 ms for an idle QP", w1 - w0);
}

/// A READ longer than the tcp transport carries (`READ_MAX`, 1 MiB) completes `LocalLength`
/// without being sent, and the QP fails as at any local error; one of exactly 1 MiB works.
#[test]
fn a_read_over_the_tcp_limit_completes_local_length() {
    let t = conformance::tcp();
    let (da, db) = t.one_device();
    let n = 1 << 20;
    let remote = Buf::filled(&*db, n + 1, 15);
    let dst = Buf::new(&*da, n + 1);
    let mut p = Pair::new(&t, &da, &db);
    p.a.post_send(&[conformance::read(
        1,
        dst.sge(0, n as u32),
        remote.addr(0),
        remote.rkey(),
    )])
    .expect("post_send");
    p.drive_to(1, 0);
    assert_eq!(p.wa[0].status, WcStatus::Success, "{:?}", p.wa);
    assert_eq!(p.wa[0].byte_len, n as u32);
    assert_eq!(&dst.bytes()[..n], &remote.bytes()[..n]);
    let mut p = Pair::new(&t, &da, &db);
    p.a.post_send(&[conformance::read(
        2,
        dst.sge(0, n as u32 + 1),
        remote.addr(0),
        remote.rkey(),
    )])
    .expect("post_send");
    p.drive_to(1, 0);
    assert_eq!(
        (p.wa[0].wr_id, p.wa[0].status),
        (2, WcStatus::LocalLength),
        "{:?}",
        p.wa
    );
}
