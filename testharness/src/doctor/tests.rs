//! Unit tests of the doctor's checks.

use super::*;

fn cfg(vars: &[(&str, &str)]) -> Config {
    let m: BTreeMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|k| m.get(k).cloned()).unwrap()
}

#[test]
fn pinned_bytes_follow_the_plugin_buffers() {
    let (s, r) = pinned_bytes(&Config::default());
    // One region: header 256 x 32, records 256 x 8, CTS ring 64 x 256, credit word:
    // 26,632 bytes, 7 pages.
    assert_eq!(s, 7 * 4096);
    // Own: 2 bounce buffers of 8192 + 32, record ring 32 x 8 x 8, control 64 x 256: 34,880
    // bytes, 9 pages; grown from the pool at full depth: 126 x 8224 bytes (253 pages).
    assert_eq!(r, 9 * 4096 + (126 * 8224u64).div_ceil(4096) * 4096);
    let (_, r2) = pinned_bytes(&cfg(&[("VERBSNET_RQ_DEPTH", "1024")]));
    assert_eq!(r2, 9 * 4096 + (1022 * 8224u64).div_ceil(4096) * 4096);
}

#[test]
fn memlock_verdicts() {
    let c = Config::default();
    let lowm = Memlock {
        soft: Some(64 << 10),
        hard: Some(64 << 10),
        cap_ipc_lock: false,
    };
    let low = Some(lowm);
    let k = memlock_check(&c, 8, NCCL_DEFAULT_BUFFSIZE, low, true);
    assert_eq!(k.verdict, Verdict::Fail);
    assert!(k.fix.contains("ulimit -l unlimited"), "{}", k.fix);
    assert!(k.observed.contains("ENOMEM"), "{}", k.observed);
    let k = memlock_check(&c, 8, NCCL_DEFAULT_BUFFSIZE, low, false);
    assert_eq!(k.verdict, Verdict::Warn);
    let cap = Some(Memlock {
        cap_ipc_lock: true,
        ..lowm
    });
    assert_eq!(
        memlock_check(&c, 8, NCCL_DEFAULT_BUFFSIZE, cap, true).verdict,
        Verdict::Ok
    );
    let unl = Some(Memlock {
        soft: None,
        hard: None,
        cap_ipc_lock: false,
    });
    assert_eq!(
        memlock_check(&c, 8, NCCL_DEFAULT_BUFFSIZE, unl, true).verdict,
        Verdict::Ok
    );
    // exactly enough is enough
    let (s, r) = pinned_bytes(&c);
    let need = 2 * (s + r + 2 * 4096);
    let just = Some(Memlock {
        soft: Some(need),
        hard: None,
        cap_ipc_lock: false,
    });
    assert_eq!(memlock_check(&c, 2, 4096, just, true).verdict, Verdict::Ok);
    let short = Some(Memlock {
        soft: Some(need - 1),
        hard: None,
        cap_ipc_lock: false,
    });
    assert_eq!(
        memlock_check(&c, 2, 4096, short, true).verdict,
        Verdict::Fail
    );
}

#[test]
fn abi_picks_the_first_in_nccl_order() {
    let k = abi_check(&["ncclNetPlugin_v8".into(), "ncclNetPlugin_v7".into()]);
    assert_eq!(k.verdict, Verdict::Ok);
    assert!(
        k.observed.contains("NCCL takes ncclNetPlugin_v8"),
        "{}",
        k.observed
    );
    let k = abi_check(&["ncclNetPlugin_v7".into(), "ncclNetPlugin_v10".into()]);
    assert!(
        k.observed.contains("NCCL takes ncclNetPlugin_v10"),
        "{}",
        k.observed
    );
    assert_eq!(abi_check(&[]).verdict, Verdict::Fail);
}

#[test]
fn nccl_net_and_env() {
    assert_eq!(nccl_net_check(None).verdict, Verdict::Warn);
    assert_eq!(nccl_net_check(Some("VerbsNet")).verdict, Verdict::Ok);
    assert_eq!(nccl_net_check(Some("IB")).verdict, Verdict::Fail);
    let env: BTreeMap<&str, &str> = [
        ("NCCL_SOCKET_IFNAME", "eth0"),
        ("NCCL_IB_HCA", "mlx5_0"),
        ("VERBSNET_IB_HCA", "mlx5_0"),
        ("NCCL_IB_SL", "3"),
        ("NCCL_IB_PKEY", "1"),
    ]
    .into_iter()
    .collect();
    let checks = nccl_env_checks(|k| env.get(k).map(|v| v.to_string()));
    // NCCL_SOCKET_IFNAME is read by verbsnet (when VERBSNET_SOCKET_IFNAME is unset): no line.
    assert_eq!(checks.len(), 3);
    assert!(checks.iter().all(|c| c.name != "env NCCL_SOCKET_IFNAME"));
    let by = |n: &str| {
        checks
            .iter()
            .find(|c| c.name == format!("env {n}"))
            .unwrap()
    };
    assert_eq!(by("NCCL_IB_HCA").verdict, Verdict::Ok);
    assert_eq!(by("NCCL_IB_SL").verdict, Verdict::Warn);
    assert!(by("NCCL_IB_SL").fix.contains("VERBSNET_IB_SL"));
    assert_eq!(by("NCCL_IB_PKEY").verdict, Verdict::Warn);
    assert!(by("NCCL_IB_PKEY").observed.contains("no equivalent"));
}

#[test]
fn typos_get_the_registry_suggestion() {
    let env = [
        ("VERBSNET_RQDEPTH".to_string(), "512".to_string()),
        ("PATH".into(), "/bin".into()),
    ];
    let c = unknown_var_checks(env.into_iter());
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].verdict, Verdict::Warn);
    assert_eq!(c[0].fix, "rename it to VERBSNET_RQ_DEPTH");
}

#[test]
fn limits_against_a_small_device() {
    use nccl_net_verbsnet::transport::ib::survey::DeviceLimits;
    let rxe = DeviceLimits {
        max_qp_wr: 16384,
        max_cqe: 32767,
        max_sge: 32,
        max_qp: 1 << 16,
        max_mr: 1 << 16,
        max_mr_size: u64::MAX,
    };
    assert!(limit_checks("rxe0", &rxe, &Config::default())
        .iter()
        .all(|c| c.verdict == Verdict::Ok));
    let big = cfg(&[("VERBSNET_RQ_DEPTH", "32768")]);
    let c = limit_checks("rxe0", &rxe, &big);
    let rq = c.iter().find(|c| c.name == "depth.rq rxe0").unwrap();
    assert_eq!(rq.verdict, Verdict::Fail);
    assert!(rq.fix.contains("VERBSNET_RQ_DEPTH <= 16384"), "{}", rq.fix);
    let cq = c.iter().find(|c| c.name == "depth.cq rxe0").unwrap();
    assert_eq!(cq.verdict, Verdict::Fail);
    let tiny = DeviceLimits {
        max_sge: 1,
        max_qp_wr: 256,
        ..rxe
    };
    let c = limit_checks("x", &tiny, &Config::default());
    assert_eq!(
        c.iter().find(|c| c.name == "sge x").unwrap().verdict,
        Verdict::Fail
    );
    assert_eq!(
        c.iter().find(|c| c.name == "depth.sq x").unwrap().verdict,
        Verdict::Fail
    );
}

#[test]
fn counters_that_move_are_named_with_a_rate() {
    let m = |v: &[(&str, u64)]| {
        v.iter()
            .map(|(k, n)| (k.to_string(), *n))
            .collect::<BTreeMap<_, _>>()
    };
    let before = vec![(
        "rxe0:1".to_string(),
        m(&[("rcvd_rnr_err", 5), ("out_of_seq_request", 0)]),
    )];
    let same = counter_verdicts(&before, &before, 2.0);
    assert_eq!(same[0].verdict, Verdict::Ok);
    assert!(
        same[0].observed.contains("since boot: rcvd_rnr_err=5"),
        "{}",
        same[0].observed
    );
    let after = vec![(
        "rxe0:1".to_string(),
        m(&[("rcvd_rnr_err", 25), ("out_of_seq_request", 0)]),
    )];
    let moved = counter_verdicts(&before, &after, 2.0);
    assert_eq!(moved[0].verdict, Verdict::Warn);
    assert!(
        moved[0].observed.contains("rcvd_rnr_err +20 (10.0/s"),
        "{}",
        moved[0].observed
    );
    assert!(moved[0].fix.contains("VERBSNET_RQ_DEPTH"));
}

#[test]
fn mtu_mismatch_is_named() {
    assert_eq!(mtu_check("ib", Some(4096), Some(4096)).verdict, Verdict::Ok);
    let k = mtu_check("ib", Some(4096), Some(1024));
    assert_eq!(k.verdict, Verdict::Warn);
    assert!(k.observed.contains("path MTU 1024"));
    assert_eq!(mtu_check("tcp", None, None).verdict, Verdict::Ok);
}

#[test]
fn exit_codes() {
    assert_eq!(Verdict::Ok.exit_code(), 0);
    assert_eq!(Verdict::Warn.exit_code(), 1);
    assert_eq!(Verdict::Fail.exit_code(), 2);
    assert!(Verdict::Fail > Verdict::Warn && Verdict::Warn > Verdict::Ok);
}
