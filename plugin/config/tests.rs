//! The registry, the parser and the generated documentation, checked against each other.

use super::*;
use std::collections::HashMap;
use std::time::Duration;

fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|k| map.get(k).cloned())
}

fn ok(vars: &[(&str, &str)]) -> Config {
    parse(vars).unwrap_or_else(|e| panic!("{vars:?} rejected: {e}"))
}

fn err(vars: &[(&str, &str)]) -> String {
    match parse(vars) {
        Ok(c) => panic!("{vars:?} accepted: {c:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn no_variables_gives_the_documented_defaults() {
    let c = ok(&[]);
    assert_eq!(c, Config::default());
    assert_eq!(c.transport, TransportChoice::Auto);
    assert_eq!((c.rq_depth, c.rq_batch, c.rq_low_water), (128, 16, 112));
    assert_eq!((c.eager_buf_size, c.eager_limit), (8192, 8192));
    assert!(c.credits);
    assert_eq!((c.rnr_timer, c.rnr_retry), (12, 7));
    assert_eq!((c.ib_timeout, c.ib_retry_cnt), (20, 6));
    assert_eq!(c.hang_timeout, Some(Duration::from_secs(60)));
    assert_eq!(c.socket_keepalive, Some(Duration::from_secs(20)));
    assert_eq!(c.stats_interval, None);
    assert_eq!(c.debug, DebugLevel::Warn);
}

#[test]
fn empty_and_blank_values_are_unset() {
    let all_blank: Vec<(&str, &str)> = KNOBS.iter().map(|k| (k.var, "")).collect();
    assert_eq!(ok(&all_blank), Config::default());
    assert_eq!(ok(&[("VERBSNET_RQ_DEPTH", "  ")]).rq_depth, 128);
    assert_eq!(ok(&[("VERBSNET_IB_HCA", " ")]).ib_hca, None);
}

#[test]
fn transport_is_case_insensitive() {
    assert_eq!(
        ok(&[("VERBSNET_TRANSPORT", "auto")]).transport,
        TransportChoice::Auto
    );
    assert_eq!(
        ok(&[("VERBSNET_TRANSPORT", "IB")]).transport,
        TransportChoice::Ib
    );
    assert_eq!(
        ok(&[("VERBSNET_TRANSPORT", " Tcp ")]).transport,
        TransportChoice::Tcp
    );
    assert_eq!(
        err(&[("VERBSNET_TRANSPORT", "rdma")]),
        r#"VERBSNET_TRANSPORT="rdma" is not valid: expected one of auto, ib, tcp"#
    );
}

#[test]
fn rq_depth_bounds() {
    assert_eq!(ok(&[("VERBSNET_RQ_DEPTH", "1")]).rq_depth, 1);
    assert_eq!(ok(&[("VERBSNET_RQ_DEPTH", "1024")]).rq_depth, 1024);
    assert_eq!(ok(&[("VERBSNET_RQ_DEPTH", "32768")]).rq_depth, 32768);
    let msg = "is not valid: expected an integer in 1..=32768";
    assert_eq!(
        err(&[("VERBSNET_RQ_DEPTH", "abc")]),
        format!(r#"VERBSNET_RQ_DEPTH="abc" {msg}"#)
    );
    assert_eq!(
        err(&[("VERBSNET_RQ_DEPTH", "0")]),
        format!(r#"VERBSNET_RQ_DEPTH="0" {msg}"#)
    );
    assert_eq!(
        err(&[("VERBSNET_RQ_DEPTH", "32769")]),
        format!(r#"VERBSNET_RQ_DEPTH="32769" {msg}"#)
    );
    assert_eq!(
        err(&[("VERBSNET_RQ_DEPTH", "-1")]),
        format!(r#"VERBSNET_RQ_DEPTH="-1" {msg}"#)
    );
    assert_eq!(
        err(&[("VERBSNET_RQ_DEPTH", "99999999999999999999999")]),
        format!(r#"VERBSNET_RQ_DEPTH="99999999999999999999999" {msg}"#)
    );
}

#[test]
fn rq_defaults_adapt_to_depth() {
    let c = ok(&[("VERBSNET_RQ_DEPTH", "4")]);
    assert_eq!((c.rq_depth, c.rq_batch, c.rq_low_water), (4, 4, 1));
    let c = ok(&[("VERBSNET_RQ_DEPTH", "1")]);
    assert_eq!((c.rq_depth, c.rq_batch, c.rq_low_water), (1, 1, 1));
    let c = ok(&[("VERBSNET_RQ_DEPTH", "20")]);
    assert_eq!((c.rq_depth, c.rq_batch, c.rq_low_water), (20, 16, 4));
    let c = ok(&[("VERBSNET_RQ_DEPTH", "1024")]);
    assert_eq!((c.rq_depth, c.rq_batch, c.rq_low_water), (1024, 16, 1008));
    let c = ok(&[("VERBSNET_RQ_BATCH", "32")]);
    assert_eq!((c.rq_depth, c.rq_batch, c.rq_low_water), (128, 32, 96));
}

#[test]
fn rq_batch_and_low_water_explicit() {
    let c = ok(&[
        ("VERBSNET_RQ_DEPTH", "64"),
        ("VERBSNET_RQ_BATCH", "8"),
        ("VERBSNET_RQ_LOW_WATER", "57"),
    ]);
    assert_eq!((c.rq_depth, c.rq_batch, c.rq_low_water), (64, 8, 57));
    let c = ok(&[("VERBSNET_RQ_BATCH", "128"), ("VERBSNET_RQ_LOW_WATER", "1")]);
    assert_eq!((c.rq_batch, c.rq_low_water), (128, 1));
}

#[test]
fn rq_cross_field_errors_name_the_bounding_variable() {
    assert_eq!(
        err(&[("VERBSNET_RQ_DEPTH", "4"), ("VERBSNET_RQ_BATCH", "16")]),
        r#"VERBSNET_RQ_BATCH="16" is not valid: expected an integer in 1..=VERBSNET_RQ_DEPTH (here 1..=4)"#
    );
    assert_eq!(
        err(&[("VERBSNET_RQ_BATCH", "0")]),
        r#"VERBSNET_RQ_BATCH="0" is not valid: expected an integer in 1..=VERBSNET_RQ_DEPTH (here 1..=128)"#
    );
    assert_eq!(
        err(&[("VERBSNET_RQ_BATCH", "x")]),
        r#"VERBSNET_RQ_BATCH="x" is not valid: expected an integer in 1..=VERBSNET_RQ_DEPTH (here 1..=128)"#
    );
    assert_eq!(
        err(&[
            ("VERBSNET_RQ_BATCH", "64"),
            ("VERBSNET_RQ_LOW_WATER", "100")
        ]),
        r#"VERBSNET_RQ_LOW_WATER="100" is not valid: expected an integer in 1..=VERBSNET_RQ_DEPTH-VERBSNET_RQ_BATCH+1 (here 1..=65)"#
    );
    assert_eq!(
        err(&[("VERBSNET_RQ_LOW_WATER", "0")]),
        r#"VERBSNET_RQ_LOW_WATER="0" is not valid: expected an integer in 1..=VERBSNET_RQ_DEPTH-VERBSNET_RQ_BATCH+1 (here 1..=113)"#
    );
    assert_eq!(ok(&[("VERBSNET_RQ_LOW_WATER", "113")]).rq_low_water, 113);
}

#[test]
fn eager_sizes() {
    let c = ok(&[("VERBSNET_EAGER_BUF_SIZE", "4096")]);
    assert_eq!((c.eager_buf_size, c.eager_limit), (4096, 4096));
    let c = ok(&[("VERBSNET_EAGER_BUF_SIZE", "1048576")]);
    assert_eq!((c.eager_buf_size, c.eager_limit), (1 << 20, 1 << 20));
    let c = ok(&[("VERBSNET_EAGER_BUF_SIZE", "0")]);
    assert_eq!((c.eager_buf_size, c.eager_limit), (0, 0));
    let c = ok(&[("VERBSNET_EAGER_LIMIT", "1024")]);
    assert_eq!((c.eager_buf_size, c.eager_limit), (8192, 1024));
    let c = ok(&[("VERBSNET_EAGER_LIMIT", "0")]);
    assert_eq!(c.eager_limit, 0);
    assert_eq!(
        err(&[("VERBSNET_EAGER_BUF_SIZE", "1048577")]),
        r#"VERBSNET_EAGER_BUF_SIZE="1048577" is not valid: expected an integer number of bytes in 0..=1048576"#
    );
    assert_eq!(
        err(&[("VERBSNET_EAGER_BUF_SIZE", "8k")]),
        r#"VERBSNET_EAGER_BUF_SIZE="8k" is not valid: expected an integer number of bytes in 0..=1048576"#
    );
}

#[test]
fn eager_limit_above_buffer_names_both_variables() {
    assert_eq!(
        err(&[("VERBSNET_EAGER_LIMIT", "16384")]),
        r#"VERBSNET_EAGER_LIMIT="16384" is not valid: expected an integer number of bytes in 0..=VERBSNET_EAGER_BUF_SIZE (here 0..=8192)"#
    );
    assert_eq!(
        err(&[
            ("VERBSNET_EAGER_BUF_SIZE", "4096"),
            ("VERBSNET_EAGER_LIMIT", "8192")
        ]),
        r#"VERBSNET_EAGER_LIMIT="8192" is not valid: expected an integer number of bytes in 0..=VERBSNET_EAGER_BUF_SIZE (here 0..=4096)"#
    );
}

#[test]
fn credits_booleans() {
    for v in ["1", "true", "TRUE", "on", "On", "yes", " yes "] {
        assert!(ok(&[("VERBSNET_CREDITS", v)]).credits, "{v}");
    }
    for v in ["0", "false", "off", "OFF", "no", "No"] {
        assert!(!ok(&[("VERBSNET_CREDITS", v)]).credits, "{v}");
    }
    assert_eq!(
        err(&[("VERBSNET_CREDITS", "2")]),
        r#"VERBSNET_CREDITS="2" is not valid: expected a boolean: 1, 0, true, false, on, off, yes, no"#
    );
}

#[test]
fn ib_timers_and_retries() {
    let c = ok(&[
        ("VERBSNET_RNR_TIMER", "0"),
        ("VERBSNET_RNR_RETRY", "0"),
        ("VERBSNET_IB_TIMEOUT", "1"),
        ("VERBSNET_IB_RETRY_CNT", "0"),
    ]);
    assert_eq!(
        (c.rnr_timer, c.rnr_retry, c.ib_timeout, c.ib_retry_cnt),
        (0, 0, 1, 0)
    );
    let c = ok(&[
        ("VERBSNET_RNR_TIMER", "31"),
        ("VERBSNET_RNR_RETRY", "7"),
        ("VERBSNET_IB_TIMEOUT", "31"),
        ("VERBSNET_IB_RETRY_CNT", "7"),
    ]);
    assert_eq!(
        (c.rnr_timer, c.rnr_retry, c.ib_timeout, c.ib_retry_cnt),
        (31, 7, 31, 7)
    );
    assert_eq!(
        err(&[("VERBSNET_RNR_TIMER", "32")]),
        r#"VERBSNET_RNR_TIMER="32" is not valid: expected an integer in 0..=31"#
    );
    assert_eq!(
        err(&[("VERBSNET_RNR_RETRY", "8")]),
        r#"VERBSNET_RNR_RETRY="8" is not valid: expected an integer in 0..=7"#
    );
    assert_eq!(
        err(&[("VERBSNET_IB_TIMEOUT", "0")]),
        r#"VERBSNET_IB_TIMEOUT="0" is not valid: expected an integer in 1..=31"#
    );
    assert_eq!(
        err(&[("VERBSNET_IB_TIMEOUT", "256")]),
        r#"VERBSNET_IB_TIMEOUT="256" is not valid: expected an integer in 1..=31"#
    );
    assert_eq!(
        err(&[("VERBSNET_IB_RETRY_CNT", "seven")]),
        r#"VERBSNET_IB_RETRY_CNT="seven" is not valid: expected an integer in 0..=7"#
    );
}

#[test]
fn ib_device_selection() {
    let c = ok(&[
        ("VERBSNET_IB_HCA", " ^=mlx5_0:1,mlx5_1 "),
        ("VERBSNET_IB_GID_INDEX", "3"),
    ]);
    assert_eq!(c.ib_hca.as_deref(), Some("^=mlx5_0:1,mlx5_1"));
    assert_eq!(c.ib_gid_index, Some(3));
    assert_eq!(ok(&[("VERBSNET_IB_GID_INDEX", "0")]).ib_gid_index, Some(0));
    assert_eq!(
        ok(&[("VERBSNET_IB_GID_INDEX", "255")]).ib_gid_index,
        Some(255)
    );
    assert_eq!(ok(&[("VERBSNET_IB_GID_INDEX", "-1")]).ib_gid_index, None);
    assert_eq!(
        err(&[("VERBSNET_IB_GID_INDEX", "256")]),
        r#"VERBSNET_IB_GID_INDEX="256" is not valid: expected an integer in 0..=255, or -1 for auto"#
    );
    assert_eq!(
        err(&[("VERBSNET_IB_GID_INDEX", "-2")]),
        r#"VERBSNET_IB_GID_INDEX="-2" is not valid: expected an integer in 0..=255, or -1 for auto"#
    );
}

#[test]
fn socket_address_and_interface() {
    let c = ok(&[
        ("VERBSNET_SOCKET_ADDR", "10.0.0.1"),
        ("VERBSNET_SOCKET_IFNAME", "eth0"),
    ]);
    assert_eq!(c.socket_addr, Some("10.0.0.1".parse().unwrap()));
    assert_eq!(c.socket_ifname.as_deref(), Some("eth0"));
    assert_eq!(
        err(&[("VERBSNET_SOCKET_IFNAME", "^=")]),
        r#"VERBSNET_SOCKET_IFNAME="^=" is not valid: expected an interface list as NCCL_SOCKET_IFNAME: [^][=]name[,name...] (prefixes)"#
    );
    let c = ok(&[
        ("NCCL_SOCKET_IFNAME", "^docker"),
        ("NCCL_SOCKET_FAMILY", "AF_INET6"),
    ]);
    assert_eq!(c.socket_ifname, None);
    assert_eq!(c.nccl_socket_ifname.as_deref(), Some("^docker"));
    assert_eq!(c.nccl_socket_family.as_deref(), Some("AF_INET6"));
    let c = ok(&[("VERBSNET_SOCKET_ADDR", " fd00::1 ")]);
    assert_eq!(c.socket_addr, Some("fd00::1".parse().unwrap()));
    assert_eq!(
        err(&[("VERBSNET_SOCKET_ADDR", "10.0.0.1:5000")]),
        r#"VERBSNET_SOCKET_ADDR="10.0.0.1:5000" is not valid: expected an IPv4 or IPv6 address, e.g. 10.0.0.1 or fd00::1"#
    );
    assert_eq!(
        err(&[("VERBSNET_SOCKET_ADDR", "host.example")]),
        r#"VERBSNET_SOCKET_ADDR="host.example" is not valid: expected an IPv4 or IPv6 address, e.g. 10.0.0.1 or fd00::1"#
    );
}

#[test]
fn durations() {
    let c = ok(&[
        ("VERBSNET_HANG_TIMEOUT", "2.5"),
        ("VERBSNET_STATS_INTERVAL", "10"),
    ]);
    assert_eq!(c.hang_timeout, Some(Duration::from_millis(2500)));
    assert_eq!(c.stats_interval, Some(Duration::from_secs(10)));
    let c = ok(&[
        ("VERBSNET_HANG_TIMEOUT", "0"),
        ("VERBSNET_STATS_INTERVAL", "0.0"),
    ]);
    assert_eq!((c.hang_timeout, c.stats_interval), (None, None));
    let msg = "is not valid: expected a number of seconds >= 0 (fractions allowed, 0 = off)";
    for bad in ["-1", "abc", "inf", "NaN", "1e30", "10s"] {
        assert_eq!(
            err(&[("VERBSNET_HANG_TIMEOUT", bad)]),
            format!("VERBSNET_HANG_TIMEOUT={bad:?} {msg}")
        );
    }
    assert_eq!(
        err(&[("VERBSNET_STATS_INTERVAL", "-0.5")]),
        format!(r#"VERBSNET_STATS_INTERVAL="-0.5" {msg}"#)
    );
}

#[test]
fn connect_timeout_and_peer_check_interval() {
    let c = ok(&[
        ("VERBSNET_CONNECT_TIMEOUT", "2.5"),
        ("VERBSNET_PEER_CHECK_INTERVAL", "0.25"),
    ]);
    assert_eq!(c.connect_timeout, Some(Duration::from_millis(2500)));
    assert_eq!(c.peer_check_interval, Duration::from_millis(250));
    let c = ok(&[("VERBSNET_CONNECT_TIMEOUT", "0")]);
    assert_eq!(c.connect_timeout, None);
    assert_eq!(
        err(&[("VERBSNET_PEER_CHECK_INTERVAL", "0")]),
        r#"VERBSNET_PEER_CHECK_INTERVAL="0" is not valid: expected a number of seconds > 0 (fractions allowed)"#
    );
    assert_eq!(
        err(&[("VERBSNET_CONNECT_TIMEOUT", "-1")]),
        r#"VERBSNET_CONNECT_TIMEOUT="-1" is not valid: expected a number of seconds >= 0 (fractions allowed, 0 = no deadline)"#
    );
}

#[test]
fn debug_level() {
    let cases = [
        ("none", DebugLevel::None),
        ("WARN", DebugLevel::Warn),
        ("info", DebugLevel::Info),
        ("Debug", DebugLevel::Debug),
        ("trace", DebugLevel::Trace),
    ];
    for (v, level) in cases {
        assert_eq!(ok(&[("VERBSNET_DEBUG", v)]).debug, level, "{v}");
    }
    assert!(DebugLevel::None < DebugLevel::Warn && DebugLevel::Debug < DebugLevel::Trace);
    assert_eq!(
        err(&[("VERBSNET_DEBUG", "verbose")]),
        r#"VERBSNET_DEBUG="verbose" is not valid: expected one of none, warn, info, debug, trace"#
    );
}

#[test]
fn debug_default_follows_nccl_debug() {
    assert_eq!(ok(&[("NCCL_DEBUG", "INFO")]).debug, DebugLevel::Info);
    assert_eq!(ok(&[("NCCL_DEBUG", "trace")]).debug, DebugLevel::Info);
    assert_eq!(ok(&[("NCCL_DEBUG", "WARN")]).debug, DebugLevel::Warn);
    assert_eq!(ok(&[("NCCL_DEBUG", "VERSION")]).debug, DebugLevel::Warn);
    let c = ok(&[("NCCL_DEBUG", "INFO"), ("VERBSNET_DEBUG", "none")]);
    assert_eq!(c.debug, DebugLevel::None);
    let c = ok(&[("NCCL_DEBUG", "WARN"), ("VERBSNET_DEBUG", "trace")]);
    assert_eq!(c.debug, DebugLevel::Trace);
}

#[test]
fn describe_lists_every_knob_in_order() {
    assert_eq!(
        Config::default().describe(),
        "transport=auto rq_depth=128 rq_batch=16 rq_low_water=112 rq_min_depth=2 \
         rq_shrink_after=2s rq_pool_size=268435456 eager_buf_size=8192 \
         eager_limit=8192 inline_size=auto cts_pull=on credits=on rnr_timer=12 rnr_retry=7 ib_timeout=20 ib_retry_cnt=6 \
         ib_tc=auto ib_sl=auto ib_qps_per_connection=1 ib_split_data_on_qps=off ib_merge_nics=on tcp_devices=1 ib_hca=all ib_gid_index=auto socket_addr=auto socket_ifname=auto socket_keepalive=20s \
         hang_timeout=60s \
         stats_interval=off stats_file=off debug=warn connect_timeout=120s \
         peer_check_interval=1s"
    );
    let c = ok(&[
        ("VERBSNET_TRANSPORT", "tcp"),
        ("VERBSNET_RQ_DEPTH", "4"),
        ("VERBSNET_CREDITS", "off"),
        ("VERBSNET_IB_HCA", "mlx5_0:1"),
        ("VERBSNET_IB_GID_INDEX", "3"),
        ("VERBSNET_SOCKET_ADDR", "10.0.0.1"),
        ("VERBSNET_SOCKET_IFNAME", "eth0"),
        ("VERBSNET_HANG_TIMEOUT", "0"),
        ("VERBSNET_STATS_INTERVAL", "0.5"),
        ("VERBSNET_DEBUG", "trace"),
    ]);
    assert_eq!(
        c.describe(),
        "transport=tcp rq_depth=4 rq_batch=4 rq_low_water=1 rq_min_depth=2 \
         rq_shrink_after=2s rq_pool_size=268435456 eager_buf_size=8192 \
         eager_limit=8192 inline_size=auto cts_pull=on credits=off rnr_timer=12 rnr_retry=7 ib_timeout=20 ib_retry_cnt=6 \
         ib_tc=auto ib_sl=auto ib_qps_per_connection=1 ib_split_data_on_qps=off ib_merge_nics=on tcp_devices=1 ib_hca=mlx5_0:1 ib_gid_index=3 socket_addr=10.0.0.1 socket_ifname=eth0 \
         socket_keepalive=20s hang_timeout=off stats_interval=0.5s stats_file=off debug=trace \
         connect_timeout=120s peer_check_interval=1s"
    );
}

#[test]
fn traffic_class_and_service_level_are_bounded() {
    let c = ok(&[("VERBSNET_IB_TC", "106"), ("VERBSNET_IB_SL", "15")]);
    assert_eq!((c.ib_tc, c.ib_sl), (Some(106), Some(15)));
    // set means present: 0 is set (it beats the communicator's trafficClass); -1, empty and
    // absent are unset, as for NCCL_IB_TC / NCCL_IB_SL
    let c = ok(&[("VERBSNET_IB_TC", "0"), ("VERBSNET_IB_SL", "0")]);
    assert_eq!((c.ib_tc, c.ib_sl), (Some(0), Some(0)));
    let c = ok(&[("VERBSNET_IB_TC", "-1"), ("VERBSNET_IB_SL", " ")]);
    assert_eq!((c.ib_tc, c.ib_sl), (None, None));
    assert_eq!(
        (Config::default().ib_tc, Config::default().ib_sl),
        (None, None)
    );
    assert_eq!(Config::default().comm_traffic_class, None);
    assert_eq!(
        err(&[("VERBSNET_IB_TC", "256")]),
        r#"VERBSNET_IB_TC="256" is not valid: expected an integer in 0..=255, or -1 for auto"#
    );
    assert_eq!(
        err(&[("VERBSNET_IB_SL", "16")]),
        r#"VERBSNET_IB_SL="16" is not valid: expected an integer in 0..=15, or -1 for auto"#
    );
}

/// `VERBSNET_IB_QPS_PER_CONNECTION` / `VERBSNET_IB_SPLIT_DATA_ON_QPS`: ranges, and NCCL's
/// variables honoured only while ours are unset (`NCCL_IB_QPS_PER_CONNECTION`,
/// `NCCL_IB_SPLIT_DATA_ON_QPS`, `src/transport/net_ib/connect.cc`, `common.cc`).
#[test]
fn qps_per_connection_and_split_fall_back_to_nccl_and_are_bounded() {
    let d = Config::default();
    assert_eq!(
        (d.ib_qps_per_connection, d.ib_split_data_on_qps),
        (1, false)
    );
    let c = ok(&[
        ("VERBSNET_IB_QPS_PER_CONNECTION", "128"),
        ("VERBSNET_IB_SPLIT_DATA_ON_QPS", "1"),
    ]);
    assert_eq!(
        (c.ib_qps_per_connection, c.ib_split_data_on_qps),
        (128, true)
    );
    let c = ok(&[
        ("NCCL_IB_QPS_PER_CONNECTION", "4"),
        ("NCCL_IB_SPLIT_DATA_ON_QPS", "1"),
    ]);
    assert_eq!((c.ib_qps_per_connection, c.ib_split_data_on_qps), (4, true));
    // ours wins, and a bad NCCL value is not even read then
    let c = ok(&[
        ("NCCL_IB_QPS_PER_CONNECTION", "999"),
        ("VERBSNET_IB_QPS_PER_CONNECTION", "2"),
        ("NCCL_IB_SPLIT_DATA_ON_QPS", "1"),
        ("VERBSNET_IB_SPLIT_DATA_ON_QPS", "off"),
    ]);
    assert_eq!(
        (c.ib_qps_per_connection, c.ib_split_data_on_qps),
        (2, false)
    );
    assert_eq!(
        err(&[("VERBSNET_IB_QPS_PER_CONNECTION", "0")]),
        r#"VERBSNET_IB_QPS_PER_CONNECTION="0" is not valid: expected an integer in 1..=128"#
    );
    assert_eq!(
        err(&[("VERBSNET_IB_QPS_PER_CONNECTION", "129")]),
        r#"VERBSNET_IB_QPS_PER_CONNECTION="129" is not valid: expected an integer in 1..=128"#
    );
    assert_eq!(
        err(&[("NCCL_IB_QPS_PER_CONNECTION", "200")]),
        r#"NCCL_IB_QPS_PER_CONNECTION="200" is not valid: expected an integer in 1..=128"#
    );
    assert!(err(&[("VERBSNET_IB_SPLIT_DATA_ON_QPS", "2")])
        .starts_with(r#"VERBSNET_IB_SPLIT_DATA_ON_QPS="2" is not valid"#));
    assert!(err(&[("NCCL_IB_SPLIT_DATA_ON_QPS", "maybe")])
        .starts_with(r#"NCCL_IB_SPLIT_DATA_ON_QPS="maybe" is not valid"#));
}

/// `VERBSNET_IB_MERGE_NICS` falls back to `NCCL_IB_MERGE_NICS` (default on, `net_ib/init.cc`);
/// `VERBSNET_TCP_DEVICES` is 1..=8.
#[test]
fn merge_nics_falls_back_to_nccl_and_tcp_devices_are_bounded() {
    let d = Config::default();
    assert_eq!((d.ib_merge_nics, d.tcp_devices), (true, 1));
    assert!(!ok(&[("NCCL_IB_MERGE_NICS", "0")]).ib_merge_nics);
    assert!(ok(&[("NCCL_IB_MERGE_NICS", "0"), ("VERBSNET_IB_MERGE_NICS", "1")]).ib_merge_nics);
    assert!(!ok(&[("VERBSNET_IB_MERGE_NICS", "off")]).ib_merge_nics);
    assert_eq!(ok(&[("VERBSNET_TCP_DEVICES", "8")]).tcp_devices, 8);
    assert_eq!(
        err(&[("VERBSNET_TCP_DEVICES", "9")]),
        r#"VERBSNET_TCP_DEVICES="9" is not valid: expected an integer in 1..=8"#
    );
}

#[test]
fn the_sources_of_the_configuration_are_named() {
    let m: std::collections::HashMap<&str, &str> = [
        ("VERBSNET_RQ_DEPTH", "256"),
        ("VERBSNET_CREDITS", " "),
        ("VERBSNET_DEBUG", "info"),
    ]
    .into_iter()
    .collect();
    let by = Config::set_by(|k| m.get(k).map(|v| v.to_string()));
    assert_eq!(
        by,
        vec!["VERBSNET_RQ_DEPTH", "VERBSNET_DEBUG"],
        "blank means default"
    );
    assert!(Config::set_by(|_| None).is_empty());
}

#[test]
fn registry_is_complete_and_unique() {
    assert_eq!(KNOBS.len(), 33);
    for (i, k) in KNOBS.iter().enumerate() {
        assert!(k.var.starts_with("VERBSNET_"), "{}", k.var);
        assert_eq!(k.var, format!("VERBSNET_{}", k.key.to_ascii_uppercase()));
        assert!(KNOBS[i + 1..].iter().all(|o| o.var != k.var), "{}", k.var);
        assert!(!k.accepted().is_empty() && !k.doc.is_empty() && !k.default.is_empty());
        assert!(!k.nccl_ib.is_empty(), "{}", k.var);
    }
    // Every field of Config appears in describe().
    let d = Config::default().describe();
    assert_eq!(d.split(' ').count(), KNOBS.len());
}

#[test]
fn every_knob_rejects_garbage_with_its_registry_text() {
    // Free-form knobs accept any non-empty text.
    let free = [
        "VERBSNET_IB_HCA",
        "VERBSNET_SOCKET_IFNAME",
        "VERBSNET_STATS_FILE",
    ];
    for k in KNOBS.iter().filter(|k| !free.contains(&k.var)) {
        let e = parse(&[(k.var, "bogus?")]).expect_err(k.var);
        assert_eq!(e.var, k.var);
        assert_eq!(e.value, "bogus?");
        assert!(e.expected.starts_with(&k.accepted()), "{e}");
    }
    for var in free {
        assert!(parse(&[(var, "bogus?")]).is_ok(), "{var}");
    }
}

#[test]
fn unknown_vars_flags_typos_only() {
    let env = [
        ("VERBSNET_RQDEPTH", "512"),
        ("VERBSNET_RQ_DEPTH", "512"),
        ("PATH", "/bin"),
        ("NCCL_DEBUG", "INFO"),
        ("VERBSNET_TRANSPORTS", "tcp"),
        ("VERBSNET_RQDEPTH", "1"),
        ("verbsnet_rq_depth", "1"),
        ("VERBSNET_TEST_TRANSPORT", "ib"),
        ("VERBSNET_EXPLORER_SEED", "7"),
        ("VERBSNET_REQUIRE_PLOT", "1"),
        ("VERBSNET_REQUIRE_PLOTS", "1"),
        ("VERBSNET_TEST", "1"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    assert_eq!(
        unknown_vars(env.into_iter()),
        vec![
            "VERBSNET_REQUIRE_PLOTS",
            "VERBSNET_RQDEPTH",
            "VERBSNET_TEST",
            "VERBSNET_TRANSPORTS"
        ],
        "the test tools' own variables are not reported; a near miss of a whole name is"
    );
    let known = KNOBS.iter().map(|k| (k.var.to_string(), String::new()));
    assert!(unknown_vars(known).is_empty());
}

#[test]
fn suggest_finds_the_intended_knob() {
    assert_eq!(suggest("VERBSNET_RQDEPTH"), Some("VERBSNET_RQ_DEPTH"));
    assert_eq!(suggest("VERBSNET_TRANSPORTS"), Some("VERBSNET_TRANSPORT"));
    assert_eq!(suggest("verbsnet_ib_timout"), Some("VERBSNET_IB_TIMEOUT"));
    assert_eq!(suggest("VERBSNET_FOO"), None);
}

/// The registry's `default` text and [`Config::default`] say the same: every literal
/// default parses to exactly the default configuration; the derived ones are the listed
/// rules (a literal default that does not parse would land here and fail).
#[test]
fn registry_defaults_are_the_default_config() {
    let derived = [
        ("VERBSNET_RQ_BATCH", "min(16, rq_depth)"),
        ("VERBSNET_RQ_LOW_WATER", "max(1, rq_depth - rq_batch)"),
        ("VERBSNET_RQ_MIN_DEPTH", "min(2, rq_depth)"),
        ("VERBSNET_EAGER_LIMIT", "eager_buf_size"),
        ("VERBSNET_IB_HCA", "all active ports"),
        ("VERBSNET_STATS_FILE", "unset"),
        (
            "VERBSNET_DEBUG",
            "warn (info when NCCL_DEBUG is INFO or TRACE)",
        ),
        ("VERBSNET_SOCKET_ADDR", "auto"),
        ("VERBSNET_SOCKET_IFNAME", "auto"),
        // Spelt -1 in the environment, as NCCL_IB_GID_INDEX, NCCL_IB_TC and NCCL_IB_SL.
        ("VERBSNET_IB_GID_INDEX", "auto"),
        ("VERBSNET_IB_TC", "auto"),
        ("VERBSNET_INLINE_SIZE", "auto"),
        ("VERBSNET_IB_SL", "auto"),
    ];
    let d = Config::default();
    for k in KNOBS {
        if let Some((_, rule)) = derived.iter().find(|(v, _)| *v == k.var) {
            assert_eq!(k.default, *rule, "{}", k.var);
            continue;
        }
        let c = parse(&[(k.var, k.default)]).unwrap_or_else(|e| panic!("{}: {e}", k.var));
        assert_eq!(c, d, "{}={} is not Config::default()", k.var, k.default);
    }
    // The derived rules, evaluated at the default and at a small depth.
    assert_eq!((d.rq_batch, d.rq_low_water, d.rq_min_depth), (16, 112, 2));
    assert_eq!(d.eager_limit, d.eager_buf_size);
    let c = ok(&[("VERBSNET_RQ_DEPTH", "4")]);
    assert_eq!((c.rq_batch, c.rq_low_water, c.rq_min_depth), (4, 1, 2));
    let c = ok(&[("VERBSNET_RQ_DEPTH", "1")]);
    assert_eq!((c.rq_batch, c.rq_low_water, c.rq_min_depth), (1, 1, 1));
    let c = ok(&[("VERBSNET_RQ_DEPTH", "64"), ("VERBSNET_RQ_BATCH", "8")]);
    assert_eq!(c.rq_low_water, 56);
    assert_eq!(ok(&[("VERBSNET_EAGER_BUF_SIZE", "1024")]).eager_limit, 1024);
    assert_eq!(ok(&[("NCCL_DEBUG", "INFO")]).debug, DebugLevel::Info);
}

/// The parser takes its ranges from the registry: each fixed range's ends are accepted and
/// one past them refused; every keyword of a choice parses.
#[test]
fn registry_ranges_are_what_the_parser_enforces() {
    let mut checked = 0;
    for k in KNOBS {
        let fixed = match k.kind {
            Kind::Int { lo, hi } | Kind::IntOrAuto { lo, hi } => Some((lo, hi)),
            Kind::Bytes { hi } => Some((0, hi)),
            _ => None,
        };
        if let Some((lo, hi)) = fixed {
            for v in [lo, hi].map(|n| n.to_string()) {
                parse(&[(k.var, &v)]).unwrap_or_else(|e| panic!("{}={v}: {e}", k.var));
            }
            let above = (u64::from(hi) + 1).to_string();
            assert_eq!(parse(&[(k.var, &above)]).unwrap_err().var, k.var);
            if lo > 0 {
                let below = (lo - 1).to_string();
                assert_eq!(parse(&[(k.var, &below)]).unwrap_err().var, k.var);
            }
            checked += 1;
        }
        if let Kind::Choice(words) = k.kind {
            for w in words {
                let c = parse(&[(k.var, w)]).unwrap_or_else(|e| panic!("{}={w}: {e}", k.var));
                // Each keyword means the value shown by that keyword.
                assert_eq!((k.show)(&c), *w, "{}", k.var);
                let upper = w.to_ascii_uppercase();
                assert!(parse(&[(k.var, &upper)]).is_ok(), "{}={upper}", k.var);
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 15, "integer and choice knobs checked");
    assert_eq!(
        parse(&[("VERBSNET_IB_GID_INDEX", "-1")])
            .unwrap()
            .ib_gid_index,
        None
    );
}

/// docs/configuration.md's knob tables are generated from the registry: the page holds,
/// between `<!-- knobs:MARKER -->` and `<!-- /knobs -->`, exactly [`doc_table`]'s output,
/// and its example INFO line is `describe()` of the defaults. `VERBSNET_BLESS=1` rewrites
/// the page instead of failing (then review the diff).
#[test]
fn documentation_tables_are_generated_from_the_registry() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
    let doc = std::fs::read_to_string(path).expect("docs/configuration.md");
    let mut out = String::new();
    let mut rest = doc.as_str();
    let mut listed = 0;
    for g in Group::ALL {
        let open = format!("<!-- knobs:{} -->\n", g.marker());
        let start = rest
            .find(&open)
            .unwrap_or_else(|| panic!("docs/configuration.md lacks {open:?} (in order)"));
        let body = start + open.len();
        let end = body
            + rest[body..]
                .find("<!-- /knobs -->")
                .expect("an end marker after each table");
        out.push_str(&rest[..body]);
        out.push_str(&doc_table(g));
        rest = &rest[end..];
        listed += KNOBS.iter().filter(|k| k.group == g).count();
    }
    out.push_str(rest);
    assert_eq!(listed, KNOBS.len(), "every knob is in one group");
    let describe = Config::default().describe();
    assert!(
        doc.contains(&format!("NET/verbsnet : configuration {describe}\n")),
        "docs/configuration.md's example INFO line differs from the defaults: {describe}"
    );
    if out != doc {
        if std::env::var_os("VERBSNET_BLESS").is_some() {
            std::fs::write(path, &out).expect("rewrite docs/configuration.md");
        } else {
            panic!(
                "docs/configuration.md's knob tables differ from the entries of plugin/config/knobs.rs; \
                 rerun with VERBSNET_BLESS=1 to regenerate them and review the diff"
            );
        }
    }
}
