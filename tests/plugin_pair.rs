//! Plugin-level tests of a connected send/receive comm pair, through the same connect/accept
//! state machines and comms the ncclNet shims (v7 … v12) use. Transport from
//! `VERBSNET_TEST_TRANSPORT` (tcp by default; the soft-RoCE VM suite runs them with `ib` on rxe0).
use nccl_net_verbsnet::comm::Class;
use nccl_net_verbsnet::config::{Config, TransportChoice};
use nccl_net_verbsnet::engine::sim::pattern;
use nccl_net_verbsnet::testkit::{connect, open_device, wait, wait_with, Buf, Link};

const POLLS: u64 = 20_000_000;

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
