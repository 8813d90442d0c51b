//! Plugin-level tests of a connected send/receive comm pair, through the same connect/accept
//! state machines and comms the ncclNet shims (v7 … v12) use. Transport from
//! `VERBSNET_TEST_TRANSPORT` (tcp by default; the soft-RoCE VM suite runs them with `ib` on rxe0).
use nccl_net_verbsnet::comm::Class;
use nccl_net_verbsnet::config::{Config, TransportChoice};
use nccl_net_verbsnet::engine::sim::pattern;
use nccl_net_verbsnet::testkit::{connect, open_device, wait, wait_with, Buf, Link};

const POLLS: u64 = 20_000_000;

/// The tests of this binary one at a time (see `info_lines`).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn cfg() -> Option<Config> {
    let transport = match std::env::var("VERBSNET_TEST_TRANSPORT").as_deref() {
        Ok("ib") => TransportChoice::Ib,
        _ => TransportChoice::Tcp,
    };
    Some(Config {
        transport,
        ..Config::default()
    })
}

fn link(send_cfg: &Config, recv_cfg: &Config) -> Option<Link> {
    if std::env::var("VERBSNET_DEBUG").is_ok() {
        nccl_net_verbsnet::log::init(
            None,
            nccl_net_verbsnet::config::Config::from_env().unwrap().debug,
        );
    }
    let (dev, kind) = match open_device(send_cfg) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIP: {e}");
            return None;
        }
    };
    Some(connect(&dev, kind, send_cfg, recv_cfg, 1_000_000).expect("connect"))
}

#[test]
fn eager_and_rendezvous_sizes_around_the_limits_deliver_exact_bytes() {
    let _one = one_at_a_time();
    let c = cfg().unwrap();
    let Some(l) = link(&c, &c) else { return };
    let sb = Buf::new(&l.dev, 1 << 20).unwrap();
    let rb = Buf::new(&l.dev, 1 << 20).unwrap();
    for (k, size) in [
        0usize,
        1,
        4095,
        4096,
        4097,
        8191,
        8192,
        8193,
        65536,
        1 << 20,
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(k as u64, size);
        sb.fill(0, &data);
        let r = l
            .recv
            .irecv(&[(rb.addr(0), 1 << 20, 3, &rb.mr)])
            .unwrap()
            .expect("irecv slot");
        let s = nccl_net_verbsnet::testkit::isend_retry(&l.send, &sb, 0, size, 3, POLLS, || {
            let _ = l.recv.test(r);
        })
        .unwrap();
        let got = wait_with(&l.recv, r, POLLS, || {
            let _ = l.send.progress();
        })
        .unwrap();
        assert_eq!(got, vec![size as u64], "size {size}");
        assert_eq!(wait(&l.send, s, POLLS).unwrap(), vec![size as u64]);
        assert_eq!(rb.get(0, size), data, "size {size}");
    }
    l.send.close();
    l.recv.close();
}

#[test]
fn send_larger_than_receive_fails_on_both_ends() {
    let _one = one_at_a_time();
    let c = cfg().unwrap();
    let Some(l) = link(&c, &c) else { return };
    let sb = Buf::new(&l.dev, 65536).unwrap();
    let rb = Buf::new(&l.dev, 65536).unwrap();
    let r = l
        .recv
        .irecv(&[(rb.addr(0), 100, 0, &rb.mr)])
        .unwrap()
        .unwrap();
    // Wait for the CTS so the sender knows the receive size.
    let mut send_err = None;
    for _ in 0..POLLS {
        let _ = l.recv.test(r);
        match l.send.isend(sb.addr(0), 50_000, 0, &sb.mr) {
            Ok(Some(_)) => panic!("oversized rendezvous send started"),
            Ok(None) => {}
            Err(e) => {
                send_err = Some(e);
                break;
            }
        }
    }
    assert!(
        matches!(send_err, Some(ref e) if e.class() == Class::Usage && e.to_string().contains("50000 bytes")),
        "{send_err:?}"
    );
    let recv_err = wait_with(&l.recv, r, POLLS, || {
        let _ = l.send.progress();
    })
    .unwrap_err();
    assert!(
        recv_err.class() == Class::Usage && recv_err.to_string().contains("100 bytes"),
        "{recv_err:?}"
    );
    assert_eq!(rb.get(0, 200), vec![0; 200], "nothing written");
}

/// Every INFO line the plugin logs on this thread while `f` runs, as NCCL users read them.
fn info_lines<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt as _;
    // `tracing` caches per callsite whether a subscriber wants it. While this scoped subscriber
    // is the only dispatch in the process, a callsite first hit by another thread (another
    // test, which has no subscriber) caches "never", and this thread's events there are lost
    // (tokio-rs/tracing#3611, #2874). So the tests of this binary run one at a time
    // (`one_at_a_time`) and the cache is rebuilt once this subscriber is this thread's default.
    let lines = Arc::new(Mutex::new(Vec::new()));
    let keep = lines.clone();
    let sub = tracing_subscriber::registry().with(nccl_net_verbsnet::log::text_layer(
        nccl_net_verbsnet::config::DebugLevel::Info,
        move |_, text| keep.lock().unwrap().push(text.to_string()),
    ));
    let r = tracing::subscriber::with_default(sub, || {
        tracing::callsite::rebuild_interest_cache();
        f()
    });
    let lines = lines.lock().unwrap().clone();
    (r, lines)
}

/// NCCL IB's receiver adopts the sender's traffic class and SL (`net_ib/connect.cc`): the
/// connecting side resolves them (its knobs beat its communicator's trafficClass, which is
/// the SL when VERBSNET_IB_SL is unset), the hello carries them, and the accepting side uses
/// them whatever its own settings say. Each end's INFO line says what its QP uses. The
/// negotiation is transport-independent (tcp carries no traffic class, ib sets it in the QP).
#[test]
fn the_receiver_adopts_the_senders_traffic_class_and_sl() {
    let _one = one_at_a_time();
    let base = cfg().unwrap();
    // (sender's config, receiver's config, what both ends use)
    let cases = [
        (
            Config {
                ib_tc: Some(40),
                ib_sl: Some(3),
                ..base.clone()
            },
            Config {
                ib_tc: Some(104),
                ib_sl: Some(7),
                comm_traffic_class: Some(26),
                ..base.clone()
            },
            (40u8, 3u8),
        ),
        (
            // the sender's communicator trafficClass 106: SL 106 & 15 = 10
            Config {
                comm_traffic_class: Some(106),
                ..base.clone()
            },
            base.clone(),
            (106, 10),
        ),
        (
            // the sender's set knob beats its communicator's trafficClass, which stays the SL
            Config {
                ib_tc: Some(0),
                comm_traffic_class: Some(106),
                ..base.clone()
            },
            Config {
                ib_sl: Some(15),
                ..base.clone()
            },
            (0, 10),
        ),
    ];
    for (send_cfg, recv_cfg, (tc, sl)) in cases {
        let (l, lines) = info_lines(|| link(&send_cfg, &recv_cfg));
        let Some(l) = l else { return };
        let want = format!("traffic class {tc} SL {sl}");
        let connected = |end: &str| {
            lines
                .iter()
                .find(|s| s.starts_with(end) && s.contains(": connected;"))
                .unwrap_or_else(|| panic!("no {end} connected line in {lines:#?}"))
        };
        let send = connected("send comm");
        let recv = connected("recv comm");
        assert!(send.contains(&want), "sender: {send}");
        assert!(
            recv.contains(&format!("{want} (the sender's)")),
            "receiver: {recv}"
        );
        // and the pair carries data
        let sb = Buf::new(&l.dev, 4096).unwrap();
        let rb = Buf::new(&l.dev, 4096).unwrap();
        let data = pattern(u64::from(tc), 4096);
        sb.fill(0, &data);
        let r = l
            .recv
            .irecv(&[(rb.addr(0), 4096, 1, &rb.mr)])
            .unwrap()
            .expect("irecv slot");
        let s = nccl_net_verbsnet::testkit::isend_retry(&l.send, &sb, 0, 4096, 1, POLLS, || {
            let _ = l.recv.test(r);
        })
        .unwrap();
        wait_with(&l.recv, r, POLLS, || {
            let _ = l.send.progress();
        })
        .unwrap();
        wait(&l.send, s, POLLS).unwrap();
        assert_eq!(rb.get(0, 4096), data);
        l.send.close();
        l.recv.close();
    }
}
