//! What only the ib transport has, against a real verbs device: device properties and the
//! GUID from sysfs, the `VERBSNET_IB_HCA` filter, the GID choice (automatic and forced) and its
//! log lines, CQ depths clamped to the device's limits, inline data the device refuses.
//!
//! Run inside the soft-RoCE VM (`testharness/softroce/vm-suite.sh`), where `rxe0` exists. On a
//! host without a verbs device (or without libibverbs) every test prints a `SKIP` line and
//! passes, so a plain `cargo test` stays green.
//!
//! The verbs behaviour every transport shares (data landing, error completions, RNR, volume,
//! a dropped peer) is tested once by the conformance suite (`tests/transport_conformance.rs`,
//! `ib::*` against this same device); `forced_gid_index_is_used` uses its fixture.
//!
//! `VERBSNET_TEST_IB_HCA` picks the device (default `rxe0`).

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock};

use tracing_subscriber::layer::SubscriberExt;

use nccl_net_verbsnet::config::Config;
use nccl_net_verbsnet::transport::conformance::{self, ok, recv, send, Buf, Pair};
use nccl_net_verbsnet::transport::ib::open_devices;
use nccl_net_verbsnet::transport::{Device, QpConfig, TransportError, WcOpcode};

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

#[test]
fn device_properties() {
    let Some(dev) = device("device_properties") else {
        return;
    };
    let p = dev.props();
    println!("props: {p:?}");
    // NCCL IB's name: the verbs device, without the port (net_ib/init.cc); one port on one
    // device of its card: port 1
    assert_eq!(p.name, hca());
    assert_eq!(p.port, 1);
    assert!(p.speed_mbps > 0);
    assert!(p.max_comms > 0);
    // guid = the NIC chip's sys_image_guid as ibv_device_attr holds it (big-endian bytes read
    // as a host integer, unswapped), as NCCL's IB transport reports (net_ib/init.cc)
    let sysfs = format!("/sys/class/infiniband/{}/sys_image_guid", hca());
    if let Ok(text) = std::fs::read_to_string(&sysfs) {
        let human = u64::from_str_radix(&text.trim().replace(':', ""), 16).expect("a GUID");
        let want = u64::from_ne_bytes(human.to_be_bytes());
        assert_eq!(p.guid, want, "guid vs {sysfs} ({})", text.trim());
    }
    if hca().starts_with("rxe") {
        assert_eq!(p.pci_path, None, "rxe is not a PCI device");
        // the INFO line lists the port (verbs name `dev:port`) with what NCCL IB reports for it
        let listed = format!(
            "[0]{}:1 (port 1, NCCL port 1, guid {:#018x}, {} Mbps, pciPath none)",
            hca(),
            p.guid,
            p.speed_mbps
        );
        assert!(
            logged(&["verbs ports in use, in NCCL IB's order", &listed]),
            "no INFO line listing {listed}"
        );
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
        .all(|d| d.props().name != hca()));
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
        ..conformance::qp_cfg()
    };
    let qp = dev.create_qp(&cfg).expect("create_qp with a clamped CQ");
    drop(qp);
    if hca().starts_with("rxe") {
        assert!(logged(&["WARN", "CQ depth clamped", "limit=32767"]));
    }
}

#[test]
fn inline_data_the_device_refuses_falls_back_to_what_it_takes() {
    let Some(dev) = device("inline_data_the_device_refuses_falls_back_to_what_it_takes") else {
        return;
    };
    // 1 MiB inline per WR: more than any device takes: the QP is created again asking for
    // none, an INFO line says so, and what the device takes then (rxe: 32 bytes) is the limit
    let cfg = QpConfig {
        max_inline_data: 1 << 20,
        ..conformance::qp_cfg()
    };
    let qp = dev
        .create_qp(&cfg)
        .expect("create_qp without the inline data refused");
    let fallback = qp.max_inline_data();
    assert!(fallback < 1 << 20, "{fallback}");
    assert!(logged(&[
        "INFO",
        "refused 1048576 bytes of inline data per send WR",
        &format!("it takes {fallback} bytes inline")
    ]));
    drop(qp);
    // what the device granted of the suite's 256 bytes is what ibv_create_qp wrote back
    // asking none means no inline sends, whatever the WQE could hold (rxe writes back 32)
    let none = QpConfig {
        max_inline_data: 0,
        ..conformance::qp_cfg()
    };
    let qp = dev.create_qp(&none).expect("create_qp");
    assert_eq!(qp.max_inline_data(), 0);
    drop(qp);
    let qp = dev.create_qp(&conformance::qp_cfg()).expect("create_qp");
    println!("granted max_inline_data {}", qp.max_inline_data());
    if hca().starts_with("rxe") {
        assert!(qp.max_inline_data() >= 256, "{}", qp.max_inline_data());
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
    let t = conformance::Transport {
        device_pairs: vec![(dev.clone(), dev.clone())],
        ..conformance::ib("forced_gid_index_is_used").expect("the device opened above")
    };
    let src = Buf::new(&*dev, 4096);
    let dst = Buf::new(&*dev, 4096);
    src.region.write(0, b"gid0").unwrap();
    let mut p = Pair::new(&t, &dev, &dev);
    p.b.post_recv(&[recv(1, dst.sge(0, 64))]).unwrap();
    p.a.post_send(&[send(2, &[src.sge(0, 4)])]).unwrap();
    p.drive_to(1, 1);
    assert_eq!(p.wa, [ok(2, WcOpcode::Send, 0, None)]);
    assert_eq!(p.wb, [ok(1, WcOpcode::Recv, 4, None)]);
    let mut got = [0u8; 4];
    dst.region.read(0, &mut got).unwrap();
    assert_eq!(&got, b"gid0");
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
