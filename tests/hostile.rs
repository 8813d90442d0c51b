//! Hostile and silent peers at plugin level (issue 12): connection set-up with a deadline, a
//! listener no client can break, and comms whose errors stick.
//!
//! Runs on the transport of `VERBSNET_TEST_TRANSPORT` (`tcp`, the default, on the host; `ib` in
//! the soft-RoCE VM); the attackers are raw TCP clients against the listen port, which both
//! transports use for their set-up handshake. Every test takes one process-wide lock (file
//! descriptor counts and captured WARN lines are process-wide).
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nccl_net_verbsnet::api;
use nccl_net_verbsnet::comm::{Class, Comm, Error, RecvComm, Role, SendComm};
use nccl_net_verbsnet::config::Config;
use nccl_net_verbsnet::conn::{
    Connects, Handle, Listen, HANDLE_SIZE, HELLO_VERSION, MAX_PENDING_HANDSHAKES,
};
use nccl_net_verbsnet::testkit::Buf;
use nccl_net_verbsnet::transport::{Device, Kind};

mod common;
use common::{base_cfg, capture, device, serial};

/// Open file descriptors of this process.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Keeps the message of every WARN event.
/// A handle naming `addr` as a verbsnet listener of `kind`.
fn handle_for(addr: SocketAddr, kind: Kind) -> [u8; HANDLE_SIZE] {
    let mut b = [0u8; HANDLE_SIZE];
    Handle {
        nonce: 0x5eed,
        kind,
        addr,
        devs: 1,
    }
    .write(&mut b);
    b
}

/// Steps a connect until it completes or fails; returns the error and the time it took.
fn connect_until_error(
    dev: &Arc<dyn Device>,
    handle: &mut [u8; HANDLE_SIZE],
    cfg: &Config,
    limit: Duration,
) -> (nccl_net_verbsnet::conn::Error, Duration) {
    let t = Instant::now();
    let name = dev.props().name;
    let connects = Connects::new();
    while t.elapsed() < limit {
        match connects.step(handle, std::slice::from_ref(dev), &name, cfg) {
            Ok(Some(_)) => panic!("connected to a listener that never answers"),
            Ok(None) => {}
            Err(e) => return (e, t.elapsed()),
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("connect neither finished nor failed in {limit:?}");
}

#[test]
fn connect_to_a_silent_listener_fails_within_the_timeout_naming_address_and_stage() {
    let _g = serial();
    let Some((dev, kind)) = device("silent listener") else {
        return;
    };
    let (warns, _cap) = capture();
    // The kernel completes the TCP connect (backlog), nobody ever reads or answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let timeout = Duration::from_millis(1500);
    let cfg = Config {
        connect_timeout: Some(timeout),
        hang_timeout: Some(Duration::from_millis(300)),
        ..base_cfg()
    };
    let mut h = handle_for(addr, kind);
    let (e, took) = connect_until_error(&dev, &mut h, &cfg, Duration::from_secs(20));
    println!("silent listener: {e} after {took:?}");
    assert_eq!(e.class(), Class::Remote, "{e:?}");
    let m = &e.to_string();
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(1),
        "{took:?}"
    );
    assert!(m.contains(&addr.to_string()), "{m}");
    assert!(m.contains("stage reached: QP exchange"), "{m}");
    assert!(m.contains("VERBSNET_CONNECT_TIMEOUT=1.5 s"), "{m}");
    // The hang watchdog reported the stalled connect once before the deadline.
    let w: Vec<String> = warns
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("has made no progress"))
        .cloned()
        .collect();
    assert_eq!(w.len(), 1, "{w:#?}");
    assert!(w[0].contains(&format!("connect to {addr}")) && w[0].contains("QP exchange"));
    assert_eq!(u64::from_le_bytes(h[120..].try_into().unwrap()), 0);
}

/// Steps `connect` on `ctx` with `handle` a few times, as NCCL does before it gets a comm, so
/// the connect to a listener that never answers holds its socket, QP and buffers.
fn start_connect(ctx: &Arc<api::Context>, handle: &mut [u8; HANDLE_SIZE]) {
    for _ in 0..20 {
        let r = api::connect(ctx.clone(), 0, handle, api::TRAFFIC_CLASS_UNDEF);
        assert!(
            r.expect("connect step").is_none(),
            "a silent listener answered"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(ctx.connects_waiting(), 1);
}

/// NCCL aborting mid-connect never calls `connect` again with that handle: the connect's
/// socket, QP and buffers are freed by its context's `finalize`, and, once past its deadline,
/// by the context's next `connect`; a later call with the abandoned handle gets the deadline
/// error, as the connect would have.
#[test]
fn a_connect_nccl_abandons_is_freed_at_finalize_and_after_its_deadline() {
    let _g = serial();
    let Some((_, kind)) = device("abandoned connect") else {
        return;
    };
    // The API contexts read the process's environment (at the first init).
    let transport = if common::is_ib() { "ib" } else { "tcp" };
    std::env::set_var("VERBSNET_TRANSPORT", transport);
    std::env::set_var("VERBSNET_SOCKET_ADDR", "127.0.0.1");
    std::env::set_var("VERBSNET_CONNECT_TIMEOUT", "0.5");
    let init = |id| {
        api::init(api::InitArgs {
            logger: None,
            comm_id: Some(id),
            traffic_class: api::TRAFFIC_CLASS_UNDEF,
        })
        .expect("init")
    };
    // The kernel completes the TCP connects (backlog); nobody reads or answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    // Another communicator keeps the plugin's shared state (devices) open throughout.
    let other = init(0xa0);
    let ctx = init(0xa1);
    // A listen comm of the communicator outlives its finalize (it holds the context).
    let mut lh = [0u8; HANDLE_SIZE];
    let listen = api::listen(ctx.clone(), 0, &mut lh).expect("listen");
    let base = fds();
    let mut h = handle_for(addr, kind);
    start_connect(&ctx, &mut h);
    let held = fds();
    assert!(
        held > base,
        "the connect holds no descriptor: {held} vs {base}"
    );
    api::finalize(ctx);
    assert_eq!(
        fds(),
        base,
        "finalize left the abandoned connect's descriptors open"
    );
    drop(listen);
    let base = fds();

    let ctx = init(0xa2);
    let mut abandoned = handle_for(addr, kind);
    start_connect(&ctx, &mut abandoned);
    assert!(fds() > base);
    std::thread::sleep(Duration::from_millis(700));
    // The context's next connect (a foreign handle: it starts nothing) frees it.
    let mut foreign = [0xabu8; HANDLE_SIZE];
    let Err(e) = api::connect(ctx.clone(), 0, &mut foreign, api::TRAFFIC_CLASS_UNDEF) else {
        panic!("a foreign handle connected");
    };
    assert_eq!(e.class(), Class::InvalidArgument, "{e:?}");
    assert_eq!(ctx.connects_waiting(), 0);
    assert_eq!(
        fds(),
        base,
        "the expired connect's descriptors are still open"
    );
    let Err(e) = api::connect(ctx.clone(), 0, &mut abandoned, api::TRAFFIC_CLASS_UNDEF) else {
        panic!("the abandoned connect went on past its deadline");
    };
    assert_eq!(e.class(), Class::Remote, "{e:?}");
    let m = e.report();
    assert!(m.contains(&format!("connect to {addr} timed out")), "{m}");
    assert!(m.contains("VERBSNET_CONNECT_TIMEOUT=0.5 s"), "{m}");
    api::finalize(ctx);
    api::finalize(other);
    for v in [
        "VERBSNET_TRANSPORT",
        "VERBSNET_SOCKET_ADDR",
        "VERBSNET_CONNECT_TIMEOUT",
    ] {
        std::env::remove_var(v);
    }
}

#[test]
fn connect_to_an_address_that_drops_syns_fails_in_the_tcp_connect_stage() {
    let _g = serial();
    let Some((dev, kind)) = device("dropping address") else {
        return;
    };
    // A listener with a full accept queue drops further SYNs (Linux, tcp_abort_on_overflow=0):
    // on loopback that is an address that swallows packets.
    let l = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    l.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())
        .unwrap();
    l.listen(0).unwrap();
    let addr = l.local_addr().unwrap().as_socket().unwrap();
    // Connect until one stays unanswered for 200 ms: its SYN was dropped (the queue is full).
    let mut fillers = Vec::new();
    let mut dropping = false;
    while !dropping && fillers.len() < 16 {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_nonblocking(true).unwrap();
        let _ = s.connect(&addr.into());
        std::thread::sleep(Duration::from_millis(200));
        dropping = s.peer_addr().is_err();
        fillers.push(s);
    }
    assert!(
        dropping,
        "{} connects to a listener with backlog 0 all completed: no SYN was dropped, so this \
         test cannot build its dropping address",
        fillers.len()
    );
    let timeout = Duration::from_millis(1000);
    let cfg = Config {
        connect_timeout: Some(timeout),
        ..base_cfg()
    };
    let mut h = handle_for(addr, kind);
    let (e, took) = connect_until_error(&dev, &mut h, &cfg, Duration::from_secs(20));
    println!("dropping address: {e} after {took:?}");
    let m = e.to_string();
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(1),
        "{took:?}"
    );
    assert!(m.contains(&addr.to_string()), "{m}");
    assert!(m.contains("stage reached: TCP connect"), "{m}");
    assert!(m.contains("VERBSNET_CONNECT_TIMEOUT"), "{m}");
}

#[test]
fn accept_without_a_peer_fails_after_the_timeout_and_the_watchdog_reports_it() {
    let _g = serial();
    let Some((dev, kind)) = device("accept timeout") else {
        return;
    };
    let (warns, _cap) = capture();
    let cfg = Config {
        connect_timeout: Some(Duration::from_millis(800)),
        hang_timeout: Some(Duration::from_millis(200)),
        ..base_cfg()
    };
    let mut h = [0u8; HANDLE_SIZE];
    let mut l = Listen::new(
        vec![dev.clone()],
        dev.props().name,
        kind,
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        &cfg,
        &mut h,
    )
    .unwrap();
    let t = Instant::now();
    let e = loop {
        match l.accept() {
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Ok(Some(_)) => panic!("nobody connected"),
            Err(e) => break e,
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "accept never timed out"
        );
    };
    let took = t.elapsed();
    println!("accept: {e} after {took:?}");
    assert!(took >= Duration::from_millis(800) && took < Duration::from_millis(1800));
    let m = e.to_string();
    assert!(m.contains(&l.addr().to_string()) && m.contains("VERBSNET_CONNECT_TIMEOUT=0.8 s"));
    assert!(m.contains("stage reached: TCP connect"), "{m}");
    let w = warns.lock().unwrap().clone();
    assert_eq!(
        w.iter()
            .filter(|l| l.contains("has made no progress"))
            .count(),
        1,
        "{w:#?}"
    );
}

/// A hello in the handshake layout of `plugin/conn/hello.rs` (versions 6 and 7: one QP, split off,
/// one device each side)
/// with the given nonce, version and QP info (a liar's or an old plugin's).
fn crafted_hello(nonce: u64, version: u16, kind: Kind, qp_info: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"VNHE");
    b.extend_from_slice(&version.to_le_bytes());
    b.push(match kind {
        Kind::Ib => 1,
        Kind::Tcp => 2,
    });
    b.push(1); // role: sender
    b.extend_from_slice(&nonce.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes()); // one QP (version 5)
    b.push(0); // split off
    b.extend_from_slice(&[1, 1]); // devices: sender, receiver (version 6)
    b.extend_from_slice(&(qp_info.len() as u16).to_le_bytes());
    b.extend_from_slice(qp_info);
    for _ in 0..10 {
        b.extend_from_slice(&0u64.to_le_bytes());
    }
    b.extend_from_slice(&[0, 0]); // traffic class, SL
    let mut m = (b.len() as u32).to_le_bytes().to_vec();
    m.extend_from_slice(&b);
    m
}

fn nonce_of(h: &[u8; HANDLE_SIZE]) -> u64 {
    Handle::read(h).unwrap().nonce
}

/// Raw clients against `addr`: idle connections (kept), junk, lying hellos, a wrong version,
/// the right nonce with unusable QP info, and resets. Returns the idle connections, which the
/// caller closes.
fn attack(addr: SocketAddr, nonce: u64, kind: Kind, idle: usize) -> Vec<TcpStream> {
    let mut kept = Vec::new();
    for i in 0..idle {
        match TcpStream::connect(addr) {
            Ok(s) => kept.push(s),
            Err(e) => panic!("idle connection {i}: {e}"),
        }
    }
    let send = |bytes: &[u8]| {
        if let Ok(mut s) = TcpStream::connect(addr) {
            let _ = s.write_all(bytes);
            Some(s)
        } else {
            None
        }
    };
    let mut later = Vec::new();
    for i in 0..50u64 {
        // Junk, a length field over the limit, a wrong nonce, a wrong version, and the right
        // nonce with QP info no transport accepts; each client then stays silent.
        let junk: Vec<u8> = (0..64).map(|k| (k * 31 + i * 7) as u8).collect();
        later.extend(send(&junk));
        later.extend(send(&u32::MAX.to_le_bytes()));
        later.extend(send(&crafted_hello(
            nonce ^ (i + 1),
            HELLO_VERSION,
            kind,
            &[0; 12],
        )));
        later.extend(send(&crafted_hello(
            nonce,
            HELLO_VERSION + 7,
            kind,
            &[0; 12],
        )));
        later.extend(send(&crafted_hello(
            nonce,
            HELLO_VERSION,
            kind,
            b"not a QP info at all",
        )));
        // A reset: SO_LINGER 0 then close.
        if let Ok(s) = TcpStream::connect(addr) {
            let s = socket2::Socket::from(s);
            let _ = s.set_linger(Some(Duration::ZERO));
            drop(s);
        }
    }
    // Clients that close half-way through a hello.
    for _ in 0..20 {
        drop(send(
            &crafted_hello(nonce, HELLO_VERSION, kind, &[0; 12])[..20],
        ));
    }
    kept.extend(later);
    kept
}

#[test]
fn a_listener_under_attack_serves_the_real_peer_and_returns_its_descriptors() {
    let _g = serial();
    let Some((dev, kind)) = device("hostile listener") else {
        return;
    };
    let (warns, _cap) = capture();
    let cfg = base_cfg();
    let name = dev.props().name;
    let mut h = [0u8; HANDLE_SIZE];
    let mut l = Listen::new(
        vec![dev.clone()],
        name.clone(),
        kind,
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        &cfg,
        &mut h,
    )
    .unwrap();
    l.set_hello_deadline(Duration::from_millis(500));
    let baseline = fds();
    let test_start = Instant::now();
    let (addr, nonce) = (l.addr(), nonce_of(&h));
    const IDLE: usize = 1000;
    let attacker = std::thread::spawn(move || attack(addr, nonce, kind, IDLE));

    // The real peer connects while the attack is under way.
    let mut max_pending = 0;
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(50) {
        assert!(l.accept().unwrap().is_none());
        max_pending = max_pending.max(l.pending());
    }
    let mut ch = h;
    let connects = Connects::new();
    let started = Instant::now();
    let (mut send, mut recv): (Option<SendComm>, Option<RecvComm>) = (None, None);
    let mut connect_took = None;
    while send.is_none() || recv.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the real peer never got in"
        );
        if send.is_none() {
            send = connects
                .step(&mut ch, std::slice::from_ref(&dev), &name, &cfg)
                .unwrap();
        }
        if recv.is_none() {
            // accept never fails because of the attackers.
            recv = l.accept().unwrap();
            max_pending = max_pending.max(l.pending());
        }
        if send.is_some() && recv.is_some() && connect_took.is_none() {
            connect_took = Some(started.elapsed());
        }
    }
    let connect_took = connect_took.unwrap();
    let (send, recv) = (send.unwrap(), recv.unwrap());
    // The connection carries data.
    let sb = Buf::new(&dev, 64).unwrap();
    let rb = Buf::new(&dev, 64).unwrap();
    sb.fill(0, b"through the storm");
    let r = recv.irecv(&[(rb.addr(0), 64, 3, &rb.mr)]).unwrap().unwrap();
    let s = loop {
        if let Some(s) = send.isend(sb.addr(0), 17, 3, &sb.mr).unwrap() {
            break s;
        }
        recv.progress().unwrap();
    };
    let (mut sdone, mut rdone) = (false, false);
    for _ in 0..10_000_000u64 {
        sdone = sdone || send.test(s).unwrap().is_some();
        rdone = rdone || recv.test(r).unwrap().is_some();
        if sdone && rdone {
            break;
        }
    }
    assert!(sdone && rdone);
    assert_eq!(rb.get(0, 17), b"through the storm");

    // The attackers' connects need accept calls (the kernel backlog is finite).
    while !attacker.is_finished() {
        assert!(l.accept().unwrap().is_none());
        max_pending = max_pending.max(l.pending());
    }
    let kept = attacker.join().unwrap();
    // Keep accepting while the attackers hang on: stalled handshakes pass their deadline.
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(1000) {
        assert!(l.accept().unwrap().is_none());
        max_pending = max_pending.max(l.pending());
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(kept);
    let t = Instant::now();
    while l.pending() > 0 && t.elapsed() < Duration::from_secs(5) {
        assert!(l.accept().unwrap().is_none());
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(l.pending(), 0);
    drop((send, recv, sb, rb));
    let after = fds();
    let lines = warns.lock().unwrap().clone();
    let refusal_lines: Vec<&String> = lines.iter().filter(|l| l.contains("refused")).collect();
    println!(
        "real connect under attack took {connect_took:?}; pending handshakes peaked at \
         {max_pending}; {} connections refused; fds {baseline} before, {after} after; {} WARN \
         lines:",
        l.refused(),
        lines.len()
    );
    for line in &lines {
        println!("  {line}");
    }
    assert_eq!(after, baseline, "descriptors leaked");
    assert!(max_pending <= MAX_PENDING_HANDSHAKES, "{max_pending}");
    assert!(l.refused() >= IDLE as u64, "{}", l.refused());
    // Per 10 s window one line at once and one summary, plus one summary on close; nothing
    // else (about 1,300 refusals).
    let windows = test_start.elapsed().as_secs() / 10 + 1;
    assert!(refusal_lines.len() as u64 <= 2 * windows, "{lines:#?}");
    assert_eq!(lines.len(), refusal_lines.len(), "{lines:#?}");
    drop(l);
    let lines = warns.lock().unwrap().clone();
    assert!(
        lines.last().unwrap().contains("more connection(s)"),
        "{lines:#?}"
    );
    for why in [
        "past the handshake deadline",
        "malformed handshake",
        "wrong nonce",
    ] {
        assert!(lines.iter().any(|l| l.contains(why)), "{why}: {lines:#?}");
    }
}

/// One refused client of each kind, read back: the listener closes them all.
#[test]
fn refused_clients_see_their_connection_closed() {
    let _g = serial();
    let Some((dev, kind)) = device("refused clients") else {
        return;
    };
    let (_warns, _cap) = capture();
    let cfg = base_cfg();
    let mut h = [0u8; HANDLE_SIZE];
    let mut l = Listen::new(
        vec![dev.clone()],
        dev.props().name,
        kind,
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        &cfg,
        &mut h,
    )
    .unwrap();
    l.set_hello_deadline(Duration::from_millis(300));
    let nonce = nonce_of(&h);
    let hellos = [
        b"GET / HTTP/1.0\r\n\r\n".to_vec(),
        crafted_hello(nonce ^ 1, HELLO_VERSION, kind, &[0; 12]),
        crafted_hello(nonce, HELLO_VERSION + 1, kind, &[0; 12]),
        crafted_hello(nonce, HELLO_VERSION, kind, b"bogus"),
        Vec::new(), // silent: dropped at the deadline
    ];
    let mut clients: Vec<TcpStream> = hellos
        .iter()
        .map(|b| {
            let mut s = TcpStream::connect(l.addr()).unwrap();
            s.write_all(b).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
            s
        })
        .collect();
    let t = Instant::now();
    let mut closed = vec![false; clients.len()];
    while !closed.iter().all(|&c| c) {
        assert!(t.elapsed() < Duration::from_secs(5), "{closed:?}");
        assert!(l.accept().unwrap().is_none());
        for (c, s) in closed.iter_mut().zip(clients.iter_mut()) {
            let mut b = [0u8; 512];
            if !*c {
                match s.read(&mut b) {
                    Ok(0) => *c = true,
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => *c = true,
                    _ => {}
                }
            }
        }
    }
    assert_eq!(l.pending(), 0);
    assert_eq!(l.refused(), hellos.len() as u64);
}

type Outcome = Option<Result<Vec<u64>, Error>>;

/// Tests `req` on `c` once: `Some` once it is no longer in progress.
fn poll_req<R: Role>(c: &Comm<R>, req: Result<nccl_net_verbsnet::engine::ReqId, Error>) -> Outcome {
    match req {
        Err(e) => Some(Err(e)),
        Ok(id) => match c.test(id) {
            Ok(None) => None,
            other => Some(other.map(|v| v.unwrap().to_vec())),
        },
    }
}

fn too_large_send(size: usize, cap: u64) {
    let Some((dev, kind)) = device("sticky errors") else {
        return;
    };
    let l = nccl_net_verbsnet::testkit::connect(&dev, kind, &base_cfg(), &base_cfg(), 5_000_000)
        .unwrap();
    let sb = Buf::new(&dev, size.max(64)).unwrap();
    let rb = Buf::new(&dev, size.max(64)).unwrap();
    let r = l
        .recv
        .irecv(&[(rb.addr(0), cap, 7, &rb.mr)])
        .unwrap()
        .unwrap();
    // The sender may learn the receive's size (its CTS) before the isend: then the isend
    // itself fails.
    let s = loop {
        match l.send.isend(sb.addr(0), size as u64, 7, &sb.mr) {
            Ok(Some(h)) => break Ok(h),
            Ok(None) => {}
            Err(e) => break Err(e),
        }
        let _ = l.recv.progress();
    };
    let (mut so, mut ro): (Outcome, Outcome) = (None, None);
    for _ in 0..2_000_000u64 {
        if so.is_none() {
            so = poll_req(&l.send, s.clone());
        } else {
            let _ = l.send.progress();
        }
        if ro.is_none() {
            ro = poll_req(&l.recv, Ok(r));
        } else {
            let _ = l.recv.progress();
        }
        if so.is_some() && ro.is_some() {
            break;
        }
    }
    println!("send of {size} into {cap}: send side {so:?}, recv side {ro:?}");
    // The sender: its request fails, and so does every later call.
    let Some(Err(se)) = so else {
        panic!("sender: {so:?}")
    };
    // docs/protocol.md: ncclInvalidUsage on both ends.
    assert_eq!(se.class(), Class::Usage, "{se:?}");
    let later = l.send.isend(sb.addr(0), 8, 9, &sb.mr);
    assert_eq!(later, Err(se.clone()));
    if let Ok(s) = s {
        assert_eq!(l.send.test(s).unwrap_err(), se);
    }
    assert_eq!(l.send.progress(), Err(se.clone()));
    assert_eq!(l.send.sticky_error(), Some(se));
    // The receiver sees the misuse too, and every later call on it returns that error.
    let Some(Err(re)) = ro else {
        panic!("receiver: {ro:?}")
    };
    assert_eq!(re.class(), Class::Usage, "{re:?}");
    assert_eq!(l.recv.sticky_error(), Some(re.clone()));
    assert_eq!(l.recv.test(r).unwrap_err(), re);
    assert_eq!(
        l.recv.irecv(&[(rb.addr(0), 64, 8, &rb.mr)]),
        Err(re.clone())
    );
    assert_eq!(l.recv.progress(), Err(re));
}

#[test]
fn a_too_large_rendezvous_send_fails_both_comms_for_every_later_call() {
    let _g = serial();
    too_large_send(32 << 10, 16 << 10);
}

#[test]
fn a_too_large_eager_send_fails_both_comms_for_every_later_call() {
    let _g = serial();
    too_large_send(128, 64);
}

#[test]
fn completions_in_the_cq_are_delivered_before_the_peer_close_is_reported() {
    let _g = serial();
    let Some((dev, kind)) = device("close after data") else {
        return;
    };
    let (_warns, _cap) = capture();
    // More messages than one CQ poll (64) hands out, all in flight when the sender closes.
    const RECVS: usize = 20;
    const GROUP: usize = 4;
    const N: usize = RECVS * GROUP;
    let cfg = Config {
        // Fixed depth: every send is in flight (in the CQ) before the close.
        rq_min_depth: Config::default().rq_depth,
        peer_check_interval: Duration::from_millis(1),
        ..base_cfg()
    };
    let nccl_net_verbsnet::testkit::Link { send, recv, .. } =
        nccl_net_verbsnet::testkit::connect(&dev, kind, &cfg, &cfg, 5_000_000).unwrap();
    let sb = Buf::new(&dev, 64 * N).unwrap();
    let rb = Buf::new(&dev, 64 * N).unwrap();
    let reqs: Vec<_> = (0..RECVS)
        .map(|i| {
            let bufs: Vec<_> = (0..GROUP)
                .map(|k| (rb.addr(64 * (i * GROUP + k)), 64, 0, &rb.mr))
                .collect();
            recv.irecv(&bufs).unwrap().unwrap()
        })
        .collect();
    let mut sent = 0;
    for _ in 0..1_000_000 {
        if sent == N {
            break;
        }
        sb.fill(64 * sent, &[sent as u8; 64]);
        if send
            .isend(sb.addr(64 * sent), 64, 0, &sb.mr)
            .unwrap()
            .is_some()
        {
            sent += 1;
        }
        // Let the receiver grant credits and CTS, but not look at data: no test on it yet.
        if sent % 16 == 0 {
            recv.progress().unwrap();
        }
    }
    assert_eq!(sent, N);
    for _ in 0..10_000 {
        let _ = send.progress();
    }
    send.close();
    std::thread::sleep(Duration::from_millis(50));
    for (i, &r) in reqs.iter().enumerate() {
        let mut got = None;
        for _ in 0..1_000_000 {
            match recv.test(r) {
                Ok(None) => {}
                other => {
                    got = Some(other);
                    break;
                }
            }
        }
        assert_eq!(
            got,
            Some(Ok(Some(nccl_net_verbsnet::engine::Sizes::of(&[64; GROUP])))),
            "receive {i} of {RECVS}: its data was sent before the close"
        );
    }
    for k in 0..N {
        assert_eq!(rb.get(64 * k, 64), vec![k as u8; 64], "message {k}");
    }
    // Then the close is reported, on every later call.
    let mut e = None;
    for _ in 0..1_000_000 {
        match recv.irecv(&[(rb.addr(0), 64, 0, &rb.mr)]) {
            Ok(Some(h)) => {
                let id = h;
                loop {
                    match recv.test(id) {
                        Ok(None) => {}
                        Ok(Some(v)) => panic!("a receive completed after the close: {v:?}"),
                        Err(x) => {
                            e = Some(x);
                            break;
                        }
                    }
                }
                break;
            }
            Ok(None) => {}
            Err(x) => {
                e = Some(x);
                break;
            }
        }
    }
    let e = e.expect("the close is reported");
    assert!(e.class() == Class::Remote, "{e:?}");
    assert_eq!(recv.sticky_error(), Some(e));
}

#[test]
fn a_too_large_send_that_arrives_before_its_receive_fails_both_comms_for_every_later_call() {
    let _g = serial();
    let Some((dev, kind)) = device("sticky errors") else {
        return;
    };
    let l = nccl_net_verbsnet::testkit::connect(&dev, kind, &base_cfg(), &base_cfg(), 5_000_000)
        .unwrap();
    let sb = Buf::new(&dev, 256).unwrap();
    let rb = Buf::new(&dev, 256).unwrap();
    // Eager: the 128 bytes land in a bounce buffer before any receive is posted.
    let s = l.send.isend(sb.addr(0), 128, 7, &sb.mr).unwrap().unwrap();
    for _ in 0..10_000 {
        l.recv.progress().unwrap();
        l.send.progress().unwrap();
    }
    let r = l
        .recv
        .irecv(&[(rb.addr(0), 64, 7, &rb.mr)])
        .unwrap()
        .unwrap();
    let (mut so, mut ro) = (None, None);
    for _ in 0..1_000_000 {
        if so.is_none() {
            so = poll_req(&l.send, Ok(s));
        }
        if ro.is_none() {
            ro = poll_req(&l.recv, Ok(r));
        }
        if so.is_some() && ro.is_some() {
            break;
        }
    }
    let usage = |o: &Outcome| matches!(o, Some(Err(e)) if e.class() == Class::Usage);
    let Some(Err(se)) = so.clone().filter(|_| usage(&so)) else {
        panic!("sender: {so:?}")
    };
    let Some(Err(re)) = ro.clone().filter(|_| usage(&ro)) else {
        panic!("receiver: {ro:?}")
    };
    // The next send is refused at once instead of never completing; so is every later call.
    assert_eq!(l.send.isend(sb.addr(0), 8, 8, &sb.mr), Err(se.clone()));
    assert_eq!(l.send.test(s), Err(se));
    assert_eq!(
        l.recv.irecv(&[(rb.addr(0), 64, 8, &rb.mr)]),
        Err(re.clone())
    );
    assert_eq!(l.recv.test(r), Err(re));
}
