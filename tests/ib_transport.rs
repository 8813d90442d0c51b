//! The ib transport against a real verbs device.
//!
//! Run inside the soft-RoCE VM (`testharness/softroce/vm-tests.sh`), where `rxe0` exists. On a
//! host without a verbs device (or without libibverbs) every test prints a `SKIP` line and
//! passes, so a plain `cargo test` stays green.
//!
//! Each test connects two QPs of the same port to each other (rxe loops the packets back), with
//! a loopback TCP connection standing in for the handshake's out-of-band stream. Sizes stay
//! small: rxe under QEMU TCG moves tens of MB/s.
//!
//! `VERBSNET_TEST_IB_HCA` picks the device (default `rxe0`).

use std::fmt::Write as _;
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing_subscriber::layer::SubscriberExt;

use nccl_net_verbsnet::config::Config;
use nccl_net_verbsnet::mem::Region;
use nccl_net_verbsnet::transport::ib::open_devices;
use nccl_net_verbsnet::transport::{
    Device, MemoryRegion, QpConfig, QueuePair, RecvWr, SendOpcode, SendWr, Sge, TransportError, Wc,
    WcOpcode, WcStatus,
};

const WAIT: Duration = Duration::from_secs(30);

fn hca() -> String {
    std::env::var("VERBSNET_TEST_IB_HCA").unwrap_or_else(|_| "rxe0".to_owned())
}

/// Every tracing event of the process as `LEVEL message field=value...`, also echoed to stdout
/// (visible with `--nocapture`).
static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct CaptureLayer;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CaptureLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    let _ = write!(self.0, " {v:?}");
                } else {
                    let _ = write!(self.0, " {}={v:?}", f.name());
                }
            }
        }
        let mut line = Fields(event.metadata().level().to_string());
        event.record(&mut line);
        println!("[log]{}", &line.0[line.0.find(' ').unwrap_or(0)..]);
        LOG.lock().unwrap().push(line.0);
    }
}

fn capture_logs() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(CaptureLayer),
        );
    });
}

fn logged(needle: &[&str]) -> bool {
    LOG.lock()
        .unwrap()
        .iter()
        .any(|l| needle.iter().all(|n| l.contains(n)))
}

/// The test device, or `None` (after a SKIP line) when this host has none.
fn device(test: &str) -> Option<Arc<dyn Device>> {
    capture_logs();
    let cfg = Config {
        ib_hca: Some(format!("={}", hca())),
        ..Config::default()
    };
    match open_devices(&cfg) {
        Ok(mut devs) if !devs.is_empty() => Some(devs.remove(0)),
        Ok(_) => {
            println!("SKIP {test}: no verbs device {} on this host", hca());
            None
        }
        Err(TransportError::Unavailable(m)) => {
            println!("SKIP {test}: {m}");
            None
        }
        Err(e) => panic!("open_devices: {e}"),
    }
}

fn qp_config() -> QpConfig {
    QpConfig {
        max_recv_wr: 128,
        max_send_wr: 128,
        min_rnr_timer: 12,
        rnr_retry: 7,
        timeout: 14,
        retry_cnt: 7,
        traffic_class: 0,
        service_level: 0,
    }
}

/// Two connected QPs on `dev` (plus anything posted on them before `establish`).
struct Pair {
    a: Box<dyn QueuePair>,
    b: Box<dyn QueuePair>,
}

fn oob_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let c = TcpStream::connect(l.local_addr().unwrap()).expect("connect loopback");
    let (s, _) = l.accept().expect("accept loopback");
    c.set_nonblocking(true).unwrap();
    s.set_nonblocking(true).unwrap();
    (c, s)
}

fn create_pair(dev: &Arc<dyn Device>, cfg: &QpConfig) -> Pair {
    Pair {
        a: dev.create_qp(cfg).expect("create_qp a"),
        b: dev.create_qp(cfg).expect("create_qp b"),
    }
}

fn connect(p: &mut Pair) {
    let (ia, ib) = (p.a.local_info(), p.b.local_info());
    assert!(ia.len() <= 256);
    let (sa, sb) = oob_pair();
    p.a.establish(&ib, sa).expect("establish a");
    p.b.establish(&ia, sb).expect("establish b");
}

fn connected_pair(dev: &Arc<dyn Device>, cfg: &QpConfig) -> Pair {
    let mut p = create_pair(dev, cfg);
    connect(&mut p);
    p
}

/// Polls until `n` completions arrived (panics after `WAIT`).
fn wait(qp: &mut Box<dyn QueuePair>, n: usize) -> Vec<Wc> {
    let mut out = Vec::new();
    let t0 = Instant::now();
    while out.len() < n {
        let want = n - out.len();
        qp.poll_cq(&mut out, want).expect("poll_cq");
        assert!(
            t0.elapsed() < WAIT,
            "only {} of {n} completions after {WAIT:?}: {out:?}",
            out.len()
        );
        if out.len() < n {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    out
}

/// A registered, owned buffer.
struct Buf {
    region: Region,
    mr: Arc<dyn MemoryRegion>,
}

impl Buf {
    fn new(dev: &Arc<dyn Device>, len: usize) -> Buf {
        let region = Region::alloc(len);
        let mr = dev.reg_mr(region.clone()).expect("reg_mr");
        Buf { region, mr }
    }
    fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.region.addr() + off as u64,
            length: len as u32,
            lkey: self.mr.keys().lkey,
        }
    }
    fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.region.read(off, &mut v).unwrap();
        v
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
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

#[test]
fn device_properties() {
    let Some(dev) = device("device_properties") else {
        return;
    };
    let p = dev.props();
    println!("props: {p:?}");
    assert_eq!(p.name, format!("{}:1", hca()));
    assert_eq!(p.port, 1);
    assert!(p.speed_mbps > 0);
    assert!(p.max_comms > 0);
    // guid = the NIC chip's sys_image_guid, as NCCL's IB transport reports (net_ib/init.cc)
    let sysfs = format!("/sys/class/infiniband/{}/sys_image_guid", hca());
    if let Ok(text) = std::fs::read_to_string(&sysfs) {
        let want = u64::from_str_radix(&text.trim().replace(':', ""), 16).expect("a GUID");
        assert_eq!(p.guid, want, "guid vs {sysfs} ({})", text.trim());
    }
    if hca().starts_with("rxe") {
        assert_eq!(p.pci_path, None, "rxe is not a PCI device");
        // rxe: GID 0 is link-local, GID 1 the IPv4-mapped RoCE v2 one; the choice is logged
        assert!(
            logged(&["GID chosen", "gid_index=1", "::ffff:", "RoCE v2"]),
            "no log line for the GID choice"
        );
    }
    // the filter really filters: a name that only shares a numeric prefix selects nothing
    let cfg = Config {
        ib_hca: Some(format!("{}0", hca())),
        ..Config::default()
    };
    assert!(
        open_devices(&cfg).unwrap().is_empty(),
        "{}0 must not select {}",
        hca(),
        hca()
    );
    let cfg = Config {
        ib_hca: Some(format!("^{}", hca())),
        ..Config::default()
    };
    assert!(open_devices(&cfg)
        .unwrap()
        .iter()
        .all(|d| !d.props().name.starts_with(&format!("{}:", hca()))));
}

#[test]
fn send_lands_in_posted_recv() {
    let Some(dev) = device("send_lands_in_posted_recv") else {
        return;
    };
    let src = Buf::new(&dev, 4096);
    let dst = Buf::new(&dev, 4096);
    let data = pattern(1000, 7);
    src.region.write(0, &data).unwrap();

    let mut p = create_pair(&dev, &qp_config());
    // receives posted before establish are honoured
    p.b.post_recv(&[RecvWr {
        wr_id: 77,
        sge: dst.sge(0, 4096),
    }])
    .unwrap();
    connect(&mut p);
    // header + payload in two SGEs, as the engine's eager path does
    let wr = send_wr(
        5,
        &[src.sge(0, 16), src.sge(16, 984)],
        SendOpcode::Send,
        true,
    );
    p.a.post_send(&[wr]).unwrap();

    let sc = wait(&mut p.a, 1);
    assert_eq!(sc[0].wr_id, 5);
    assert_eq!(sc[0].status, WcStatus::Success);
    assert_eq!(sc[0].opcode, WcOpcode::Send);
    let rc = wait(&mut p.b, 1);
    assert_eq!(rc[0].wr_id, 77);
    assert_eq!(rc[0].status, WcStatus::Success);
    assert_eq!(rc[0].opcode, WcOpcode::Recv);
    assert_eq!(rc[0].byte_len, 1000);
    assert_eq!(rc[0].imm, None);
    assert_eq!(dst.bytes(0, 1000), data);
    assert_eq!(dst.bytes(1000, 8), vec![0; 8], "nothing beyond the message");
}

#[test]
fn write_with_imm_delivers_data_and_imm() {
    let Some(dev) = device("write_with_imm_delivers_data_and_imm") else {
        return;
    };
    let src = Buf::new(&dev, 8192);
    let dst = Buf::new(&dev, 8192);
    let first = pattern(3000, 1);
    let second = pattern(2000, 2);
    src.region.write(0, &first).unwrap();
    src.region.write(4096, &second).unwrap();

    let mut p = connected_pair(&dev, &qp_config());
    // a zero-length receive absorbs the immediate (as NCCL posts them)
    p.b.post_recv(&[RecvWr {
        wr_id: 9,
        sge: Sge::default(),
    }])
    .unwrap();
    let keys = dst.mr.keys();
    let base = dst.region.addr();
    let wrs = [
        // unsignaled plain write, then the signaled write-with-imm: one post, one chain
        send_wr(
            1,
            &[src.sge(0, 3000)],
            SendOpcode::RdmaWrite {
                remote_addr: base + 100,
                rkey: keys.rkey,
            },
            false,
        ),
        send_wr(
            2,
            &[src.sge(4096, 2000)],
            SendOpcode::RdmaWriteWithImm {
                remote_addr: base + 5000,
                rkey: keys.rkey,
                imm: 0xdead_beef,
            },
            true,
        ),
    ];
    p.a.post_send(&wrs).unwrap();
    let sc = wait(&mut p.a, 1);
    assert_eq!(
        (sc[0].wr_id, sc[0].status, sc[0].opcode),
        (2, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    let rc = wait(&mut p.b, 1);
    assert_eq!(rc[0].wr_id, 9);
    assert_eq!(rc[0].status, WcStatus::Success);
    assert_eq!(rc[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(rc[0].imm, Some(0xdead_beef), "immediate back in host order");
    assert_eq!(rc[0].byte_len, 2000);
    assert_eq!(dst.bytes(100, 3000), first);
    assert_eq!(dst.bytes(5000, 2000), second);
    assert_eq!(dst.bytes(0, 100), vec![0; 100]);
}

#[test]
fn write_out_of_bounds_is_remote_access() {
    let Some(dev) = device("write_out_of_bounds_is_remote_access") else {
        return;
    };
    let src = Buf::new(&dev, 4096);
    src.region.write(0, &pattern(512, 3)).unwrap();
    let dst = Buf::new(&dev, 1024);
    let mut p = connected_pair(&dev, &qp_config());
    let wr = send_wr(
        11,
        &[src.sge(0, 512)],
        SendOpcode::RdmaWrite {
            // 512 bytes starting 256 bytes before the end of a 1024-byte region
            remote_addr: dst.region.addr() + 768,
            rkey: dst.mr.keys().rkey,
        },
        true,
    );
    p.a.post_send(&[wr]).unwrap();
    let sc = wait(&mut p.a, 1);
    assert_eq!(sc[0].wr_id, 11);
    assert_eq!(sc[0].status, WcStatus::RemoteAccess);
    assert!(sc[0].status.is_remote());
    assert_eq!(dst.bytes(0, 1024), vec![0; 1024], "nothing may be written");
    // the QP is in the error state now: later WRs flush
    let wr = send_wr(12, &[src.sge(0, 8)], SendOpcode::Send, true);
    match p.a.post_send(&[wr]) {
        Ok(()) => {
            let sc = wait(&mut p.a, 1);
            assert_eq!((sc[0].wr_id, sc[0].status), (12, WcStatus::WrFlush));
        }
        Err(e) => println!("post_send on an errored QP refused: {e}"),
    }
}

#[test]
fn rnr_retry_exceeded_moves_the_counters() {
    let Some(dev) = device("rnr_retry_exceeded_moves_the_counters") else {
        return;
    };
    let before = dev.rnr_counters();
    println!("rnr counters before: {before:?}");
    let cfg = QpConfig {
        min_rnr_timer: 1, // 0.01 ms
        rnr_retry: 1,
        ..qp_config()
    };
    let src = Buf::new(&dev, 4096);
    let mut p = connected_pair(&dev, &cfg);
    // no receive posted at b
    let wr = send_wr(21, &[src.sge(0, 64)], SendOpcode::Send, true);
    p.a.post_send(&[wr]).unwrap();
    let sc = wait(&mut p.a, 1);
    assert_eq!(sc[0].wr_id, 21);
    assert_eq!(sc[0].status, WcStatus::RnrRetryExceeded);
    let after = dev.rnr_counters();
    println!("rnr counters after:  {after:?}");
    let moved = |b: Option<u64>, a: Option<u64>| match (b, a) {
        (Some(b), Some(a)) => a > b,
        _ => panic!("the device has no RNR counters: {before:?} / {after:?}"),
    };
    assert!(
        moved(before.rcvd_rnr_err, after.rcvd_rnr_err),
        "rcvd_rnr_err"
    );
    assert!(
        moved(before.send_rnr_err, after.send_rnr_err),
        "send_rnr_err"
    );
}

#[test]
fn batched_post_recv_of_64() {
    let Some(dev) = device("batched_post_recv_of_64") else {
        return;
    };
    const N: usize = 64;
    const SLOT: usize = 64;
    let src = Buf::new(&dev, N * SLOT);
    let dst = Buf::new(&dev, N * SLOT);
    for i in 0..N {
        src.region.write(i * SLOT, &pattern(SLOT, i as u8)).unwrap();
    }
    let mut p = connected_pair(&dev, &qp_config());
    let c0 = p.b.counters();
    let recvs: Vec<RecvWr> = (0..N)
        .map(|i| RecvWr {
            wr_id: 1000 + i as u64,
            sge: dst.sge(i * SLOT, SLOT),
        })
        .collect();
    p.b.post_recv(&recvs).unwrap();
    let c1 = p.b.counters();
    assert_eq!(
        c1.post_recv_calls - c0.post_recv_calls,
        1,
        "one post_recv call"
    );
    assert_eq!(c1.recv_wrs_posted - c0.recv_wrs_posted, N as u64);

    // 64 SENDs in one chain, only the last signaled
    let sends: Vec<SendWr> = (0..N)
        .map(|i| {
            send_wr(
                i as u64,
                &[src.sge(i * SLOT, SLOT)],
                SendOpcode::Send,
                i == N - 1,
            )
        })
        .collect();
    p.a.post_send(&sends).unwrap();
    let sc = wait(&mut p.a, 1);
    assert_eq!(
        (sc[0].wr_id, sc[0].status),
        ((N - 1) as u64, WcStatus::Success)
    );
    let rc = wait(&mut p.b, N);
    for (i, c) in rc.iter().enumerate() {
        assert_eq!(
            c.wr_id,
            1000 + i as u64,
            "receives complete in posting order"
        );
        assert_eq!(
            (c.status, c.opcode, c.byte_len),
            (WcStatus::Success, WcOpcode::Recv, SLOT as u32)
        );
    }
    assert_eq!(dst.bytes(0, N * SLOT), src.bytes(0, N * SLOT));
}

#[test]
fn peer_closed_follows_the_oob_stream() {
    let Some(dev) = device("peer_closed_follows_the_oob_stream") else {
        return;
    };
    let p = connected_pair(&dev, &qp_config());
    assert!(!p.a.peer_closed());
    assert!(!p.b.peer_closed());
    drop(p.b); // closes its end of the oob stream
    let t0 = Instant::now();
    while !p.a.peer_closed() {
        assert!(t0.elapsed() < WAIT, "peer close not noticed");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn queue_depths_are_clamped_to_device_limits() {
    let Some(dev) = device("queue_depths_are_clamped_to_device_limits") else {
        return;
    };
    // 2 x 20000 WRs need a 40000-entry CQ; rxe allows 32767 CQEs
    let cfg = QpConfig {
        max_recv_wr: 20_000,
        max_send_wr: 20_000,
        ..qp_config()
    };
    let qp = dev.create_qp(&cfg).expect("create_qp with a clamped CQ");
    drop(qp);
    if hca().starts_with("rxe") {
        assert!(logged(&["WARN", "CQ depth clamped", "limit=32767"]));
    }
}

#[test]
fn forced_gid_index_is_used() {
    let Some(_) = device("forced_gid_index_is_used") else {
        return;
    };
    let cfg = Config {
        ib_hca: Some(format!("={}", hca())),
        ib_gid_index: Some(0),
        ..Config::default()
    };
    let dev = open_devices(&cfg).unwrap().remove(0);
    assert!(logged(&[
        "GID chosen: forced by VERBSNET_IB_GID_INDEX",
        "gid_index=0"
    ]));
    if hca().starts_with("rxe") {
        // GID 0 of rxe is the IPv6 link-local one: allowed when forced, with a warning
        assert!(logged(&["WARN", "link-local"]));
    }
    // loopback on one device works with either GID
    let src = Buf::new(&dev, 4096);
    let dst = Buf::new(&dev, 4096);
    src.region.write(0, b"gid0").unwrap();
    let mut p = connected_pair(&dev, &qp_config());
    p.b.post_recv(&[RecvWr {
        wr_id: 1,
        sge: dst.sge(0, 64),
    }])
    .unwrap();
    p.a.post_send(&[send_wr(2, &[src.sge(0, 4)], SendOpcode::Send, true)])
        .unwrap();
    assert_eq!(wait(&mut p.a, 1)[0].status, WcStatus::Success);
    let rc = wait(&mut p.b, 1);
    assert_eq!((rc[0].status, rc[0].byte_len), (WcStatus::Success, 4));
    assert_eq!(dst.bytes(0, 4), b"gid0");
}

#[test]
fn malformed_hca_filter_is_an_error() {
    // no device needed: the filter is checked before libibverbs is touched
    let cfg = Config {
        ib_hca: Some("rxe0:0".to_owned()),
        ..Config::default()
    };
    match open_devices(&cfg) {
        Err(TransportError::Unavailable(m)) => assert!(m.contains("VERBSNET_IB_HCA"), "{m}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(d) => panic!("accepted a malformed filter ({} devices)", d.len()),
    }
}
