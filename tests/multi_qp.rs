//! Several QPs per connection (`VERBSNET_IB_QPS_PER_CONNECTION`, issue 23) at plugin level:
//! real connect/accept state machines and comms over a real transport, as `scenarios.rs`.
//!
//! QP 0 of a connection carries what a one-QP connection carries; QPs 1 and up only RDMA
//! WRITE WITH IMMs of payload, each consuming a zero-length receive WR the receiver keeps
//! there (split over all QPs with `VERBSNET_IB_SPLIT_DATA_ON_QPS`, else round robin). On tcp each QP is its own TCP stream, so writes on different QPs really overtake
//! each other. The sender's count and split decide; the receiver adopts them.
//!
//! Transport from `VERBSNET_TEST_TRANSPORT` (`tcp`, the default; `ib` on rxe0 in the VM).

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::sync::{Arc, Mutex};

use nccl_net_verbsnet::config::Config;
use nccl_net_verbsnet::conn::{Handle, Listen, HANDLE_SIZE, HELLO_VERSION};
use nccl_net_verbsnet::engine::sim::pattern;
use nccl_net_verbsnet::testkit::{connect, connect_devs, open_devices, wait_with, Buf, Link};

mod common;
use common::{base_cfg, counter, device, serial};

/// Upper bound on polls of one wait (a hang fails the test).
const POLLS: u64 = 50_000_000;

fn qps_cfg(qps: u8, split: bool) -> Config {
    Config {
        ib_qps_per_connection: qps,
        ib_split_data_on_qps: split,
        ..base_cfg()
    }
}

/// Message sizes: empty, eager (up to the 8 KiB eager limit), just above it (direct), and
/// large ones that split into many 128-byte-aligned pieces, one not a multiple of anything.
const SIZES: [usize; 8] = [0, 1, 100, 8192, 8193, 65_536, 1 << 20, (3 << 20) + 13];

/// Posts every receive, then every send (all outstanding at once, so that pieces on several
/// QPs of several messages are in flight together), then tests everything to completion and
/// checks each message's size and bytes. Runs `rounds` times over the same link.
fn exchange(l: &Link, rounds: usize, what: &str) {
    let total: usize = SIZES.iter().sum();
    // Registered through each comm's devices, as `regMr` does (several: a virtual device).
    let sb = Buf::on(l.send.devices(), total).unwrap();
    let rb = Buf::on(l.recv.devices(), total).unwrap();
    for round in 0..rounds {
        let mut off = 0;
        let mut offs = Vec::new();
        for (i, &size) in SIZES.iter().enumerate() {
            let data = pattern((round * 16 + i) as u64, size);
            sb.fill(off, &data);
            rb.fill(off, &vec![0xee; size]);
            offs.push(off);
            off += size;
        }
        let recvs: Vec<_> = SIZES
            .iter()
            .zip(&offs)
            .map(|(&size, &o)| {
                l.recv
                    .irecv(&[(rb.addr(o), size as u64, i32::from(size as u16), &rb.mr)])
                    .unwrap()
                    .expect("irecv slot")
            })
            .collect();
        let mut sends = Vec::new();
        for (&size, &o) in SIZES.iter().zip(&offs) {
            let mut id = None;
            for _ in 0..POLLS {
                id = l
                    .send
                    .isend(sb.addr(o), size as u64, i32::from(size as u16), &sb.mr)
                    .unwrap();
                if id.is_some() {
                    break;
                }
                l.recv.progress().unwrap();
            }
            sends.push(id.expect("isend started"));
        }
        for (k, (id, (&size, &o))) in recvs.iter().zip(SIZES.iter().zip(&offs)).enumerate() {
            let got = wait_with(&l.recv, *id, POLLS, || l.send.progress().unwrap()).unwrap();
            assert_eq!(got, vec![size as u64], "{what} round {round} message {k}");
            assert!(
                rb.get(o, size) == sb.get(o, size),
                "{what} round {round} message {k} ({size} bytes): data differ"
            );
        }
        for id in sends {
            wait_with(&l.send, id, POLLS, || l.recv.progress().unwrap()).unwrap();
        }
    }
    assert_eq!(l.send.in_flight(), 0, "{what}");
    assert_eq!(l.recv.in_flight(), 0, "{what}");
}

/// 1, 2, 4 and 8 QPs, split on and off: every message arrives whole and in place, both comms
/// count the sender's QPs, and the receiver (left at its default of 1) adopted them.
#[test]
fn every_qp_count_and_split_carries_data_intact() {
    let _g = serial();
    let Some((dev, kind)) = device("every_qp_count") else {
        return;
    };
    for qps in [1u8, 2, 4, 8] {
        for split in [false, true] {
            let what = format!("{qps} QPs split {split}");
            let l = connect(&dev, kind, &qps_cfg(qps, split), &base_cfg(), 5_000_000)
                .unwrap_or_else(|e| panic!("{what}: connect: {}", e.report()));
            assert_eq!(counter(&l.send, "qps"), u64::from(qps), "{what}");
            assert_eq!(counter(&l.recv, "qps"), u64::from(qps), "{what}");
            exchange(&l, 3, &what);
            assert_eq!(counter(&l.send, "ops"), 3 * SIZES.len() as u64, "{what}");
            assert_eq!(counter(&l.recv, "ops"), 3 * SIZES.len() as u64, "{what}");
            assert_eq!(
                counter(&l.recv, "bytes"),
                3 * SIZES.iter().sum::<usize>() as u64,
                "{what}"
            );
            // The data QPs really carried pieces (none with one QP), at most one per data QP
            // per message.
            let pieces = counter(&l.send, "data_qp_writes");
            let most = 3 * SIZES.len() as u64 * (u64::from(qps) - 1);
            assert!(
                (qps == 1 && pieces == 0) || (qps > 1 && pieces > 0 && pieces <= most),
                "{what}: {pieces} pieces on data QPs (at most {most})"
            );
            l.send.close();
            l.recv.close();
        }
    }
}

/// A receiver set to another count and split adopts the sender's (NCCL IB would take the
/// larger count; verbsnet lets the sender decide) and says so at INFO.
#[test]
fn the_receiver_adopts_the_senders_qps_and_says_so() {
    let _g = serial();
    let Some((dev, kind)) = device("receiver_adopts") else {
        return;
    };
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sub = {
        use tracing_subscriber::layer::SubscriberExt as _;
        let lines = lines.clone();
        tracing_subscriber::registry().with(nccl_net_verbsnet::log::text_layer(
            nccl_net_verbsnet::log::DebugLevel::Info,
            move |_, text| lines.lock().unwrap().push(text.to_string()),
        ))
    };
    let _guard = tracing::subscriber::set_default(sub);
    // See `common::capture`: a stale "never" from another thread (tokio-rs/tracing#3611).
    tracing::callsite::rebuild_interest_cache();
    let l = connect(&dev, kind, &qps_cfg(2, false), &qps_cfg(8, true), 5_000_000)
        .unwrap_or_else(|e| panic!("connect: {}", e.report()));
    assert_eq!(counter(&l.send, "qps"), 2);
    assert_eq!(counter(&l.recv, "qps"), 2);
    exchange(&l, 1, "adopted 2 QPs");
    let lines = lines.lock().unwrap().clone();
    assert!(
        lines.iter().any(|t| t.contains(
            "asks for 2 QPs per connection, split off; this rank's setting is 8, split on: \
             the sender's values apply"
        )),
        "{lines:#?}"
    );
    let connected: Vec<_> = lines
        .iter()
        .filter(|t| t.contains(": connected;"))
        .collect();
    assert_eq!(connected.len(), 2, "{lines:#?}");
    assert!(
        connected.iter().all(|t| t.contains(", 2 QPs (split off)")),
        "{connected:#?}"
    );
    l.send.close();
    l.recv.close();
}

/// A hello naming 0 or 129 QPs (or a split flag of 2) is refused by the listener with the
/// reason, which keeps listening: a good connect still succeeds.
#[test]
fn a_hello_with_a_bad_qp_count_is_refused_and_the_listener_lives_on() {
    let _g = serial();
    let Some((dev, kind)) = device("bad_qp_count") else {
        return;
    };
    let (warns, _guard) = common::capture();
    let mut handle = [0u8; HANDLE_SIZE];
    let name = dev.props().name;
    let cfg = base_cfg();
    let mut listen = Listen::new(
        vec![dev.clone()],
        name.clone(),
        kind,
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        &cfg,
        &mut handle,
    )
    .expect("listen");
    let h = Handle::read(&handle).expect("handle");
    // A version-5 hello up to its split flag: magic, version, kind (tcp 2, ib 1), role 1
    // (connector), nonce, QP count, split flag; the rest never gets read.
    let hello = |qps: u16, split: u8| {
        let mut b = Vec::new();
        b.extend_from_slice(b"VNHE");
        b.extend_from_slice(&HELLO_VERSION.to_le_bytes());
        b.push(if common::is_ib() { 1 } else { 2 });
        b.push(1);
        b.extend_from_slice(&h.nonce.to_le_bytes());
        b.extend_from_slice(&qps.to_le_bytes());
        b.push(split);
        b.extend_from_slice(&[0; 100]);
        let mut m = (b.len() as u32).to_le_bytes().to_vec();
        m.extend_from_slice(&b);
        m
    };
    for (n, (qps, split)) in [(0u16, 0u8), (129, 0), (2, 2)].into_iter().enumerate() {
        let mut s = TcpStream::connect(h.addr).expect("tcp connect");
        s.write_all(&hello(qps, split)).expect("write hello");
        for _ in 0..1_000_000 {
            assert!(listen.accept().expect("accept").is_none());
            if listen.refused() > n as u64 {
                break;
            }
            std::thread::yield_now();
        }
        assert_eq!(listen.refused(), n as u64 + 1, "{qps} QPs split {split}");
    }
    let w = warns.lock().unwrap().clone();
    assert!(
        w.iter().any(|t| t.contains(
            "malformed handshake message: a hello naming 0 QPs per connection \
             (VERBSNET_IB_QPS_PER_CONNECTION must be in 1..=128)"
        )),
        "{w:#?}"
    );
    // The listener lives on: a real connect through it works.
    let connects = nccl_net_verbsnet::conn::Connects::new();
    let send_cfg = qps_cfg(4, true);
    let (mut send, mut recv) = (None, None);
    for _ in 0..5_000_000 {
        if send.is_none() {
            send = connects
                .step(&mut handle, std::slice::from_ref(&dev), &name, &send_cfg)
                .expect("connect step");
        }
        if recv.is_none() {
            recv = listen.accept().expect("accept");
        }
        if send.is_some() && recv.is_some() {
            break;
        }
        std::thread::yield_now();
    }
    let l = Link {
        send: send.expect("connected"),
        recv: recv.expect("accepted"),
        dev: dev.clone(),
    };
    assert_eq!(counter(&l.recv, "qps"), 4);
    exchange(&l, 1, "after refusals");
    l.send.close();
    l.recv.close();
}

/// Virtual devices (`makeVDevice`, NIC fusion, issue 23): a connection between them has
/// `VERBSNET_IB_QPS_PER_CONNECTION` QPs per device of the side with more (NCCL IB's `nqps`),
/// QP `q` on device `q % devices` of each side, and every buffer registered on each device.
/// On tcp (`VERBSNET_TCP_DEVICES=2`) each device has its own keys, so a WR on a QP of device 1
/// with a key of device 0 fails: data arriving intact over all QPs shows each QP used its own
/// device's lkey and rkey. Symmetric, asymmetric (one side physical) and reordered pairs, with
/// split on and off. In the VM it needs two rxe devices (`SOFTROCE_NDEVS=2`), else it skips.
#[test]
fn virtual_devices_spread_qps_over_their_devices_and_carry_data_intact() {
    let _g = serial();
    // Two rxe devices in one VM reach each other only through GID 0 (IPv6 link-local over
    // their veth pair: `guest-setup.sh`), so the VM suite sets VERBSNET_IB_GID_INDEX=0.
    let gid = std::env::var("VERBSNET_IB_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok());
    let cfg = Config {
        tcp_devices: 2,
        ib_gid_index: gid,
        ..base_cfg()
    };
    let (devs, kind) = open_devices(&cfg).unwrap_or_else(|e| panic!("{}", e.report()));
    if devs.len() < 2 {
        println!(
            "SKIP virtual_devices: {} device(s) here, 2 needed",
            devs.len()
        );
        return;
    }
    let both = &devs[..2];
    let one = &devs[..1];
    let rev = [devs[1].clone(), devs[0].clone()];
    let cases: [(&str, &[_], &[_], u8, bool); 6] = [
        ("2 devs to 2, 1 QP per device", both, both, 1, false),
        ("2 devs to 2, 2 QPs per device, split", both, both, 2, true),
        (
            "2 devs to 2, 2 QPs per device, round robin",
            both,
            both,
            2,
            false,
        ),
        ("1 dev to 2", one, both, 1, false),
        ("2 devs to 1, split", both, one, 2, true),
        ("reordered 2 devs to 2, split", &rev, both, 1, true),
    ];
    for (what, sd, rd, per, split) in cases {
        let send_cfg = Config {
            ib_gid_index: gid,
            ..qps_cfg(per, split)
        };
        let l = connect_devs((sd, rd), kind, &send_cfg, &cfg, 5_000_000)
            .unwrap_or_else(|e| panic!("{what}: connect: {}", e.report()));
        let want = u64::from(per) * 2;
        assert_eq!(counter(&l.send, "qps"), want, "{what}");
        assert_eq!(counter(&l.recv, "qps"), want, "{what}");
        assert_eq!(l.send.devices().len(), sd.len(), "{what}");
        assert_eq!(l.recv.devices().len(), rd.len(), "{what}");
        exchange(&l, 2, what);
        assert!(counter(&l.send, "data_qp_writes") > 0, "{what}");
        // A buffer registered on fewer devices than the comm runs on is refused, not
        // written with a key its device does not know.
        if sd.len() == 2 {
            let b = Buf::new(&sd[0], 64).unwrap();
            let e = l.send.isend(b.addr(0), 8, 1, &b.mr).unwrap_err();
            assert!(
                e.to_string()
                    .contains("registered on 1 device(s) passed to a comm on 2"),
                "{what}: {e}"
            );
        }
        l.send.close();
        l.recv.close();
    }
}
