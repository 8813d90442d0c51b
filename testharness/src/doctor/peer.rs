//! `--listen`/`--peer`: a connection through the plugin between two hosts, and the JSON side
//! channel the two doctors talk over.

#[allow(unused_imports)]
use super::*;

/// One length-prefixed JSON message on the doctor's own TCP side channel.
pub(super) fn send_msg(s: &mut TcpStream, v: &Value) -> std::io::Result<()> {
    let b = v.to_string().into_bytes();
    s.write_all(&(b.len() as u32).to_le_bytes())?;
    s.write_all(&b)
}

pub(super) fn recv_msg(s: &mut TcpStream) -> std::io::Result<Value> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > 1 << 20 {
        return Err(std::io::Error::other("oversized doctor message"));
    }
    let mut b = vec![0u8; len];
    s.read_exact(&mut b)?;
    serde_json::from_slice(&b).map_err(std::io::Error::other)
}

pub(super) type PeerResult<T> = std::result::Result<T, String>;

pub(super) fn peer_checks(args: &Args, net: &Net, me: &Local, report: &mut Report) {
    match peer_test(args, net, me) {
        Ok(checks) => report.checks.extend(checks),
        Err(e) => report.push(
            Check::new("peer.connect", Verdict::Fail, e)
                .expect("a connection through the plugin, both ways")
                .fix(
                    "check that the other side runs `doctor --listen`, that HOST:PORT and the \
                     plugin's out-of-band address (VERBSNET_SOCKET_ADDR/IFNAME) are reachable, \
                     and both sides' port and gid lines",
                ),
        ),
    }
}

pub(super) fn peer_test(args: &Args, net: &Net, me: &Local) -> PeerResult<Vec<Check>> {
    let deadline = Instant::now() + Duration::from_secs(args.timeout.max(1));
    let initiator = args.peer.is_some();
    let mut sock = if let Some(peer) = &args.peer {
        let addrs: Vec<_> = peer
            .to_socket_addrs()
            .map_err(|e| format!("--peer {peer}: {e}"))?
            .collect();
        let mut last = String::from("no address");
        let mut got = None;
        while got.is_none() && Instant::now() < deadline {
            for a in &addrs {
                match TcpStream::connect_timeout(a, Duration::from_secs(2)) {
                    Ok(s) => {
                        got = Some(s);
                        break;
                    }
                    Err(e) => last = format!("connect {a}: {e}"),
                }
            }
            if got.is_none() {
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        got.ok_or_else(|| format!("cannot reach the doctor at {peer}: {last}"))?
    } else {
        let addr = args.listen.clone().unwrap_or_default();
        let l = TcpListener::bind(&addr).map_err(|e| format!("--listen {addr}: {e}"))?;
        let at = l.local_addr().map_err(|e| e.to_string())?;
        eprintln!(
            "verbsnet doctor: listening on {at} (run `verbsnet-perf doctor --peer <this host>:{}` \
             on the other host)",
            at.port()
        );
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(format!(
                            "no peer connected to {at} within {} s",
                            args.timeout
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(format!("accept on {at}: {e}")),
            }
        }
    };
    sock.set_nonblocking(false).map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_secs(args.timeout.max(1))))
        .map_err(|e| e.to_string())?;
    let io = |e: std::io::Error| format!("doctor side channel: {e}");

    // Hello: what each side is, and the initiator's test parameters.
    let (listen_handle, mut listen) = net
        .listen(args.dev)
        .map_err(|e| format!("plugin listen(dev {}): {e}", args.dev))?;
    let hello = json!({
        "transport": me.transport, "device": me.device, "mtu": me.mtu,
        "host": hostname(), "pings": args.pings, "bw_bytes": args.bw_bytes,
        "handle": listen_handle.0.to_vec(),
    });
    send_msg(&mut sock, &hello).map_err(io)?;
    let theirs = recv_msg(&mut sock).map_err(io)?;
    let (pings, bw_bytes) = if initiator {
        (args.pings, args.bw_bytes)
    } else {
        (
            theirs["pings"].as_u64().unwrap_or(1000) as u32,
            theirs["bw_bytes"].as_u64().unwrap_or(64 << 20),
        )
    };
    let their_transport = theirs["transport"].as_str().unwrap_or("?").to_string();
    let their_dev = theirs["device"].as_str().unwrap_or("?").to_string();
    let their_host = theirs["host"].as_str().unwrap_or("?").to_string();
    let their_mtu = theirs["mtu"].as_u64().map(|m| m as u32);
    let mut out = Vec::new();
    if their_transport != me.transport {
        out.push(
            Check::new(
                "peer.transport",
                Verdict::Fail,
                format!("here {} ({}), peer {their_host} {their_transport} ({their_dev})", me.transport, me.device),
            )
            .expect("the same transport on both sides")
            .fix("set the same VERBSNET_TRANSPORT on both hosts (and make a verbs port usable on both for ib)"),
        );
        return Ok(out);
    }
    out.push(
        Check::new(
            "peer.transport",
            Verdict::Ok,
            format!(
                "here {} ({}), peer {their_host} {their_transport} ({their_dev})",
                me.transport, me.device
            ),
        )
        .expect("the same transport on both sides"),
    );
    out.push(mtu_check(&me.transport, me.mtu, their_mtu));
    let mut their_handle = theirs["handle"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|b| b.as_u64().unwrap_or(0) as u8)
                .collect::<Vec<u8>>()
        })
        .and_then(|b| Handle::from_bytes(&b))
        .ok_or("the peer's hello has no valid handle")?;

    // Connect and accept, both non-blocking, until both are done.
    let t0 = Instant::now();
    let (mut send, mut recv) = (None, None);
    while send.is_none() || recv.is_none() {
        if Instant::now() > deadline {
            return Err(format!(
                "connect/accept through the plugin did not finish in {} s (send comm {}, recv \
                 comm {})",
                args.timeout,
                if send.is_some() { "up" } else { "pending" },
                if recv.is_some() { "up" } else { "pending" }
            ));
        }
        if send.is_none() {
            send = net
                .connect(args.dev, &mut their_handle)
                .map_err(|e| format!("plugin connect: {e}"))?;
        }
        if recv.is_none() {
            recv = net
                .accept(&mut listen)
                .map_err(|e| format!("plugin accept: {e}"))?;
        }
        std::thread::yield_now();
    }
    let (mut send, mut recv) = (send.unwrap(), recv.unwrap());
    out.push(
        Check::new(
            "peer.connect",
            Verdict::Ok,
            format!(
                "send and recv comms up in {:.1} ms",
                t0.elapsed().as_secs_f64() * 1e3
            ),
        )
        .expect("a connection through the plugin, both ways"),
    );

    const SLOTS: usize = 8;
    let chunk = bw_bytes.clamp(8, 512 << 10) as usize;
    let mut sfifo = net
        .reg_mr(&send, SLOTS, chunk)
        .map_err(|e| format!("regMr (send, {SLOTS} x {chunk} B): {e}"))?;
    let mut rfifo = net
        .reg_mr(&recv, SLOTS, chunk)
        .map_err(|e| format!("regMr (recv, {SLOTS} x {chunk} B): {e}"))?;
    let wait = |what: &str| -> PeerResult<()> {
        if Instant::now() > deadline {
            Err(format!(
                "the peer test stalled during {what} (timeout {} s)",
                args.timeout
            ))
        } else {
            Ok(())
        }
    };
    macro_rules! complete {
        ($fifo:expr, $req:expr, $what:expr) => {{
            let mut r = $req;
            loop {
                if let Some(n) = net
                    .test(&mut $fifo, &mut r)
                    .map_err(|e| format!("{}: {e}", $what))?
                {
                    break n;
                }
                wait($what)?;
            }
        }};
    }
    macro_rules! start_send {
        ($slot:expr, $len:expr, $what:expr) => {{
            loop {
                if let Some(r) = net
                    .isend(&mut send, &mut sfifo, $slot, $len, 0)
                    .map_err(|e| format!("{}: {e}", $what))?
                {
                    break r;
                }
                wait($what)?;
            }
        }};
    }
    macro_rules! start_recv {
        ($slot:expr, $len:expr, $what:expr) => {{
            loop {
                if let Some(r) = net
                    .irecv(&mut recv, &mut rfifo, $slot, $len, 0)
                    .map_err(|e| format!("{}: {e}", $what))?
                {
                    break r;
                }
                wait($what)?;
            }
        }};
    }

    // Ping-pong: 10 untimed, then `pings` timed round trips of 8 bytes.
    let warm = 10;
    let mut t_ping = Instant::now();
    for i in 0..warm + pings {
        if i == warm {
            t_ping = Instant::now();
        }
        if initiator {
            let r = start_recv!(0, 8, "ping-pong");
            let s = start_send!(0, 8, "ping-pong");
            complete!(sfifo, s, "ping-pong send");
            complete!(rfifo, r, "ping-pong receive");
        } else {
            let r = start_recv!(0, 8, "ping-pong");
            complete!(rfifo, r, "ping-pong receive");
            let s = start_send!(0, 8, "ping-pong");
            complete!(sfifo, s, "ping-pong send");
        }
    }
    let half_rtt_us = t_ping.elapsed().as_secs_f64() * 1e6 / f64::from(pings.max(1)) / 2.0;

    // Bandwidth: the initiator streams bw_bytes in `chunk` messages, SLOTS in flight; the
    // listener acknowledges with 8 bytes once it has everything.
    let n = bw_bytes.div_ceil(chunk as u64).max(1);
    let t_bw = Instant::now();
    let mut moved = 0u64;
    if initiator {
        let ack = start_recv!(0, 8, "bandwidth ack");
        let mut inflight: Vec<Option<crate::plugin::Request<'_>>> =
            (0..SLOTS).map(|_| None).collect();
        let mut posted = 0u64;
        let mut done = 0u64;
        while done < n {
            for (slot, cur) in inflight.iter_mut().enumerate() {
                if let Some(r) = cur {
                    if let Some(b) = net
                        .test(&mut sfifo, r)
                        .map_err(|e| format!("bandwidth send: {e}"))?
                    {
                        moved += b.unwrap_or(chunk) as u64;
                        done += 1;
                        *cur = None;
                    }
                }
                if cur.is_none() && posted < n {
                    if let Some(r) = net
                        .isend(&mut send, &mut sfifo, slot, chunk, 0)
                        .map_err(|e| format!("bandwidth send: {e}"))?
                    {
                        posted += 1;
                        *cur = Some(r);
                    }
                }
            }
            wait("the bandwidth probe")?;
        }
        complete!(rfifo, ack, "bandwidth ack");
        let _ = moved;
        moved = n * chunk as u64;
    } else {
        let mut inflight: Vec<Option<crate::plugin::Request<'_>>> =
            (0..SLOTS).map(|_| None).collect();
        let mut posted = 0u64;
        let mut done = 0u64;
        while done < n {
            for (slot, cur) in inflight.iter_mut().enumerate() {
                if let Some(r) = cur {
                    if let Some(b) = net
                        .test(&mut rfifo, r)
                        .map_err(|e| format!("bandwidth receive: {e}"))?
                    {
                        moved += b.unwrap_or(chunk) as u64;
                        done += 1;
                        *cur = None;
                    }
                }
                if cur.is_none() && posted < n {
                    if let Some(r) = net
                        .irecv(&mut recv, &mut rfifo, slot, chunk, 0)
                        .map_err(|e| format!("bandwidth receive: {e}"))?
                    {
                        posted += 1;
                        *cur = Some(r);
                    }
                }
            }
            wait("the bandwidth probe")?;
        }
        let s = start_send!(0, 8, "bandwidth ack");
        complete!(sfifo, s, "bandwidth ack");
    }
    let secs = t_bw.elapsed().as_secs_f64();
    let gbps = moved as f64 / secs / 1e9;
    if moved != n * chunk as u64 {
        out.push(
            Check::new(
                "peer.bandwidth",
                Verdict::Fail,
                format!("received {moved} of {} bytes", n * chunk as u64),
            )
            .expect("every byte sent arrives"),
        );
    }

    // The initiator's numbers go to the listener so both print the same lines.
    let mine = json!({ "half_rtt_us": half_rtt_us, "gbps": gbps, "moved": moved, "secs": secs });
    let (lat, bw, bytes, bsecs) = if initiator {
        let _ = recv_msg(&mut sock);
        send_msg(&mut sock, &mine).map_err(io)?;
        (half_rtt_us, gbps, moved, secs)
    } else {
        send_msg(&mut sock, &json!({"ready": true})).map_err(io)?;
        let r = recv_msg(&mut sock).map_err(io)?;
        (
            r["half_rtt_us"].as_f64().unwrap_or(half_rtt_us),
            r["gbps"].as_f64().unwrap_or(gbps),
            r["moved"].as_u64().unwrap_or(moved),
            r["secs"].as_f64().unwrap_or(secs),
        )
    };
    out.push(
        Check::new(
            "peer.latency",
            Verdict::Ok,
            format!(
                "{lat:.1} us one way (half of {pings} round trips of 8 B through isend/irecv/test)"
            ),
        )
        .expect("round trips complete (reference: perftest's ib_send_lat on the same ports)"),
    );
    out.push(
        Check::new(
            "peer.bandwidth",
            Verdict::Ok,
            format!(
                "{bw:.2} GB/s ({} in {:.1} ms, {chunk} B messages, {SLOTS} in flight)",
                mib(bytes),
                bsecs * 1e3
            ),
        )
        .expect("every byte arrives (reference: verbsnet-perf sendrecv and perftest's ib_send_bw)"),
    );
    let _ = net.dereg_mr(&send, sfifo);
    let _ = net.dereg_mr(&recv, rfifo);
    let _ = net.close_send(send);
    let _ = net.close_recv(recv);
    let _ = net.close_listen(listen);
    Ok(out)
}

/// Path MTU both sides use: the smaller active MTU (`convert::path_mtu`); a mismatch is named.
pub fn mtu_check(transport: &str, here: Option<u32>, peer: Option<u32>) -> Check {
    let expect = "equal active MTUs on both ports (4096 for RoCE on a 9000-byte netdev)";
    if transport != "ib" {
        return Check::new(
            "peer.mtu",
            Verdict::Ok,
            "tcp transport: no path MTU (a TCP stream)",
        )
        .expect(expect);
    }
    match (here, peer) {
        (Some(a), Some(b)) if a == b => {
            Check::new("peer.mtu", Verdict::Ok, format!("here {a}, peer {b}: path MTU {a}")).expect(expect)
        }
        (Some(a), Some(b)) => Check::new(
            "peer.mtu",
            Verdict::Warn,
            format!("here {a}, peer {b}: mismatch, both use path MTU {}", a.min(b)),
        )
        .expect(expect)
        .fix("give both netdevs the same MTU (ip link set <dev> mtu 9000 for RoCE 4096), and the switches in between"),
        (a, b) => Check::new(
            "peer.mtu",
            Verdict::Warn,
            format!("here {a:?}, peer {b:?}: an active MTU is unknown"),
        )
        .expect(expect),
    }
}

pub(super) fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}
