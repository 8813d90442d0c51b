//! `verbsnet-perf` driving a plugin that is not verbsnet: `fixtures/fixture_net.c`, a real
//! TCP plugin built by `testharness/build.rs` that behaves the way other NCCL net plugins do
//! where the contract allows (it logs through the logger without a NULL check, rewrites its
//! table in `init`, reports `maxRecvs = 1`, answers "retry later" often, completes requests out
//! of order and late). Every collective must load, run and check its data through it, as it
//! would under NCCL, so the harness stays faithful to NCCL and not to verbsnet.

use std::process::{Command, Output};

use serde_json::Value;

mod common;
use common::{run_json, show};

/// `libnccl-net-fixture.so` (ncclNetPlugin_v8 and _v6).
const FIXTURE: &str = env!("FIXTURE_NET_SO");

/// `libnccl-net-fixture6.so` (ncclNetPlugin_v6 only).
const FIXTURE_V6: &str = env!("FIXTURE_NET_V6_SO");

/// `libnccl-net-fixture11.so` (ncclNetPlugin_v11, _v8 and _v6; its v11 `init` leaves the
/// context NULL, as NCCL's own socket transport does).
const FIXTURE_V11: &str = env!("FIXTURE_NET_V11_SO");

/// A `verbsnet-perf` command loading `so`, with no other NCCL or verbsnet variable set.
fn perf(so: &str, args: &[&str]) -> Command {
    let mut c = common::perf(args);
    c.env("NCCL_NET_PLUGIN", so);
    c
}

/// [`assert_runs`], and no contract deviation.
fn assert_clean(o: &Output, v: &Value, symbol: &str) {
    assert_runs(o, v, symbol);
    assert_eq!(v["deviations"], serde_json::json!([]), "{}", show(o));
}

/// Exit 0, every #wrong 0, the fixture's table, its init line counted on every rank.
fn assert_runs(o: &Output, v: &Value, symbol: &str) {
    assert!(o.status.success(), "{}", show(o));
    assert_eq!(v["ok"], true, "{}", show(o));
    assert_eq!(v["out_of_bounds"], 0, "{}", show(o));
    let rows = v["rows"].as_array().expect("rows");
    assert!(!rows.is_empty());
    for r in rows {
        for placement in ["out_of_place", "in_place"] {
            assert_eq!(r[placement]["wrong"], 0, "row {r}\n{}", show(o));
        }
    }
    assert_eq!(v["plugin"]["name"], "fixture");
    assert_eq!(v["plugin"]["symbol"], symbol);
    let logs = v["plugin_log"].as_array().expect("plugin_log");
    assert_eq!(logs.len(), v["nranks"].as_u64().unwrap() as usize);
    for l in logs {
        // The fixture's init line went through the logger on every rank.
        assert!(l["info"].as_u64().unwrap() >= 1, "{l}");
    }
}

fn sizes<'a>(coll: &'a str, ranks: &'a str) -> Vec<&'a str> {
    vec![
        coll, "--ranks", ranks, "-b", "8", "-e", "1M", "-f", "8", "-n", "2", "-w", "1", "--chunk",
        "64K",
    ]
}

/// Every collective through the fixture with NCCL_NET unset (NCCL takes whichever plugin
/// loaded), data checked, with both proxies.
#[test]
fn every_collective_runs_through_the_fixture_plugin() {
    for coll in [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "sendrecv",
        "alltoall",
    ] {
        for (ranks, proxy) in [("2", "eager"), ("3", "eager"), ("4", "lazy")] {
            let mut args = sizes(coll, ranks);
            args.extend(["--proxy", proxy]);
            let (o, v) = run_json(&mut perf(FIXTURE, &args));
            assert_clean(&o, &v, "ncclNetPlugin_v8");
            assert_eq!(v["proxy"], proxy);
            println!(
                "fixture {coll} --ranks {ranks} --proxy {proxy}: {} rows, #wrong 0",
                v["rows"].as_array().unwrap().len()
            );
        }
    }
}

/// NCCL_NET names the fixture: fine; names another: refused with NCCL's reason.
#[test]
fn nccl_net_is_matched_against_the_table_name_as_nccl_does() {
    let mut c = perf(FIXTURE, &sizes("sendrecv", "2"));
    let (o, v) = run_json(c.env("NCCL_NET", "FIXTURE"));
    assert_clean(&o, &v, "ncclNetPlugin_v8");
    let o = perf(FIXTURE, &sizes("sendrecv", "2"))
        .env("NCCL_NET", "verbsnet")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("name is \"fixture\", expected \"verbsnet\"")
            && err.contains("NCCL would skip"),
        "{err}"
    );
}

/// A list in NCCL_NET_PLUGIN: the first usable library wins, as in NCCL.
#[test]
fn the_first_usable_library_of_a_list_is_used() {
    let list = format!("no-such-plugin,{FIXTURE}");
    let (o, v) = run_json(&mut perf(&list, &sizes("all_reduce", "2")));
    assert_clean(&o, &v, "ncclNetPlugin_v8");
    let o = perf("none", &sizes("all_reduce", "2")).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("NCCL_NET_PLUGIN=none"));
}

/// The exported table is incomplete until init (its slots are stubs that fail): the harness
/// works only because it copies the table after init, as NCCL does.
#[test]
fn the_table_is_used_as_init_left_it() {
    use testharness::plugin::{Error, Net};
    let net = Net::load(FIXTURE, None, None).unwrap();
    assert_eq!(net.name(), "fixture");
    // Before init there is no table to call.
    assert!(matches!(net.devices(), Err(Error::Usage(_))));
    net.init().unwrap();
    assert_eq!(net.devices().unwrap(), 1);
    let p = net.properties(0).unwrap();
    assert_eq!((p.name.as_str(), p.max_recvs), ("fixture0", 1));
}

/// A plugin that exports only ncclNetPlugin_v6 is driven (NCCL still loads v6), and the v6 table
/// of a plugin that has newer ones is driven with `--net-version 6`.
#[test]
fn v6_tables_are_driven() {
    for coll in ["all_reduce", "sendrecv", "alltoall"] {
        let (o, v) = run_json(&mut perf(FIXTURE_V6, &sizes(coll, "3")));
        assert_clean(&o, &v, "ncclNetPlugin_v6");
        let mut args = sizes(coll, "2");
        args.extend(["--net-version", "6"]);
        let (o, v) = run_json(&mut perf(FIXTURE, &args));
        assert_clean(&o, &v, "ncclNetPlugin_v6");
    }
}

/// A plugin whose `test` never writes the sizes still runs (NCCL does not need them for host
/// buffers), with #wrong 0 and the deviation reported, not a failure.
#[test]
fn unwritten_sizes_are_reported_as_a_deviation() {
    for coll in ["all_reduce", "alltoall"] {
        let mut c = perf(FIXTURE, &sizes(coll, "2"));
        let (o, v) = run_json(c.env("FIXTURE_NET_NO_SIZES", "1"));
        assert_runs(&o, &v, "ncclNetPlugin_v8");
        let d = &v["deviations"][0];
        assert_eq!(d["kind"], "test left the received size unwritten", "{v}");
        assert!(d["count"].as_u64().unwrap() > 0);
        assert_eq!(d["ranks"], serde_json::json!([0, 1]));
    }
    // The text form says so.
    let o = perf(FIXTURE, &sizes("sendrecv", "2"))
        .env("FIXTURE_NET_NO_SIZES", "1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .contains("# Contract deviation (NCCL does not depend on it; reported, not failed): test left the received size unwritten"),
        "{}",
        show(&o)
    );
}

/// `--shared-comms K` as NCCL maps it: the fixture's maxRecvs 1 means no shared connection (K
/// connections per peer, receives of one buffer); with maxRecvs 2 one shared connection and
/// receives grouped by two. Both proxies, data checked.
#[test]
fn shared_comms_follow_the_plugins_max_recvs() {
    for (max_recvs, k, conns, group) in [
        ("1", 2, 2, 1),
        ("1", 4, 4, 1),
        ("2", 4, 1, 2),
        ("2", 3, 1, 2),
    ] {
        for proxy in ["eager", "lazy"] {
            let ks = k.to_string();
            let mut args = sizes("alltoall", "3");
            args.extend(["--shared-comms", &ks, "--skew-us", "200", "--proxy", proxy]);
            let mut c = perf(FIXTURE, &args);
            let (o, v) = run_json(c.env("FIXTURE_NET_MAX_RECVS", max_recvs));
            assert_clean(&o, &v, "ncclNetPlugin_v8");
            let sc = &v["shared_comms"];
            assert_eq!(sc["senders"], k, "{sc}");
            assert_eq!(sc["max_recvs"], max_recvs.parse::<u64>().unwrap(), "{sc}");
            assert_eq!(sc["connections_per_peer"], conns, "{sc}");
            assert_eq!(sc["receive_group"], group, "{sc}");
            println!(
                "fixture alltoall --shared-comms {k} --proxy {proxy}, maxRecvs {max_recvs}: \
                 {conns} connection(s) per peer, receives of up to {group}, #wrong 0"
            );
        }
    }
}

/// The wrapper refuses a grouped receive above the device's maxRecvs (NCCL never posts one),
/// before the plugin sees it.
#[test]
fn a_grouped_receive_above_max_recvs_is_refused() {
    use testharness::plugin::{Error, Net};
    let net = Net::load(FIXTURE, None, None).unwrap();
    net.init().unwrap();
    let (mut handle, mut listen) = net.listen(0).unwrap();
    let (mut send, mut recv) = (None, None);
    for _ in 0..100_000 {
        if send.is_none() {
            send = net.connect(0, &mut handle).unwrap();
        }
        if recv.is_none() {
            recv = net.accept(&mut listen).unwrap();
        }
        if send.is_some() && recv.is_some() {
            break;
        }
    }
    let (send, mut recv) = (send.expect("connected"), recv.expect("accepted"));
    assert_eq!(recv.max_recvs(), 1);
    let mut fifo = net.reg_mr(&recv, 2, 64).unwrap();
    match net.irecv_group(&mut recv, &mut fifo, &[0, 1], &[64, 64], &[0, 1]) {
        Err(Error::Usage(m)) => assert!(m.contains("maxRecvs 1"), "{m}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a grouped irecv of 2 reached a plugin with maxRecvs 1"),
    }
    net.dereg_mr(&recv, fifo).unwrap();
    net.close_listen(listen).unwrap();
    net.close_send(send).unwrap();
    net.close_recv(recv).unwrap();
}

/// [`perf`] with the plugin's INFO lines of INIT and NET on stderr.
fn perf_info(so: &str, args: &[&str]) -> Command {
    let mut c = perf(so, args);
    c.env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "INIT,NET");
    c
}

/// A v11 `init` that leaves its context NULL is driven, as NCCL drives its own socket transport
/// (`src/transport/net_socket.cc` never sets it; `src/plugin/net.cc` only passes it back to
/// `listen`, `connect` and `finalize`), and that NULL context is finalized once.
#[test]
fn a_null_context_from_init_is_passed_back_as_nccl_does() {
    for coll in ["all_reduce", "sendrecv", "alltoall"] {
        let (o, v) = run_json(&mut perf_info(FIXTURE_V11, &sizes(coll, "2")));
        assert_clean(&o, &v, "ncclNetPlugin_v11");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("finalize((nil)): 0 context(s) left"),
            "{}",
            show(&o)
        );
        assert!(!err.contains("without a matching init"), "{}", show(&o));
    }
}

/// A plugin whose `devices` reports none is not driven, with NCCL's reason and no claim of a
/// contract violation (NCCL disables it: `src/plugin/net.cc`), and its context is finalized
/// as NCCL finalizes it.
#[test]
fn a_plugin_without_devices_is_not_used_as_in_nccl() {
    let o = perf_info(FIXTURE_V11, &sizes("sendrecv", "2"))
        .env("FIXTURE_NET_NDEV", "0")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("devices reports 0 devices") && err.contains("NCCL disables a plugin"),
        "{}",
        show(&o)
    );
    assert!(!err.contains("contract violation"), "{}", show(&o));
    assert!(
        err.contains("finalize((nil)): 0 context(s) left"),
        "{}",
        show(&o)
    );
}

/// `--vdevice 0,1` through a plugin that is not verbsnet: the fixture's v11 `makeVDevice`
/// (FIXTURE_NET_NDEV=2 physical devices) is called as NCCL's topology code calls it
/// (`src/graph/topo.cc`: `ncclTopoMakeVnic`), its new device 2 is counted by `devices`,
/// described by `getProperties` (`vProps` 0,1) and used for every listen/connect (the fixture
/// logs each with its device and refuses one `devices` does not count), with #wrong 0 and no
/// deviation, in the ring, the mesh and the point-to-point proxy.
#[test]
fn vdevice_fuses_two_devices_with_make_vdevice() {
    for coll in ["all_reduce", "alltoall", "stream"] {
        let mut args = sizes(coll, "2");
        args.extend(["--vdevice", "0,1"]);
        let mut c = perf_info(FIXTURE_V11, &args);
        let (o, v) = run_json(c.env("FIXTURE_NET_NDEV", "2"));
        assert!(o.status.success(), "{}", show(&o));
        assert_eq!(v["ok"], true, "{}", show(&o));
        assert_eq!(v["out_of_bounds"], 0, "{}", show(&o));
        assert_eq!(v["plugin"]["symbol"], "ncclNetPlugin_v11");
        assert_eq!(v["deviations"], serde_json::json!([]), "{}", show(&o));
        let d = &v["device"];
        assert_eq!(
            (&d["index"], &d["count"], &d["name"]),
            (
                &serde_json::json!(2),
                &serde_json::json!(3),
                &serde_json::json!("fixture0+fixture1")
            ),
            "{d}"
        );
        let vd = &d["vdevice"];
        assert_eq!(vd["index"], 2, "{vd}");
        assert_eq!(vd["vprops"], serde_json::json!([0, 1]), "{vd}");
        assert_eq!(vd["physical"], serde_json::json!(["fixture0", "fixture1"]));
        assert_eq!(
            (&vd["devices_before"], &vd["devices_after"]),
            (&2.into(), &3.into())
        );
        assert_eq!(
            vd["line"],
            "#  Using virtual device [2] fixture0+fixture1 (vProps 0,1) made by makeVDevice"
        );
        for r in v["ranks"].as_array().unwrap() {
            assert_eq!(r["device"], "fixture0+fixture1", "{r}");
        }
        // Rank 0's plugin lines: makeVDevice made device 2, and listen/connect got it.
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("Made virtual device [2] name=fixture0+fixture1 ndevs=2"),
            "{}",
            show(&o)
        );
        assert!(err.contains("listen on dev 2 (fixture0+fixture1, over fixture0)"));
        assert!(err.contains("on dev 2 (fixture0+fixture1) connected"));
        assert!(!err.contains("on dev 0"), "{}", show(&o));
    }
    // The table's header names it too.
    let mut args = sizes("sendrecv", "2");
    args.extend(["--vdevice", "1,0"]);
    let o = perf(FIXTURE_V11, &args)
        .env("FIXTURE_NET_NDEV", "3")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(
            "#  Using virtual device [3] fixture1+fixture0 (vProps 1,0) made by makeVDevice"
        ) && out.contains("dev 3 of 4: \"fixture1+fixture0\""),
        "{}",
        show(&o)
    );
}

/// What NCCL could not fuse is refused before any connection, with the rule and the fix:
/// a table without `makeVDevice` (v8), a device the plugin does not have, more devices than a
/// v11 table fuses, and a `makeVDevice` that fails (its `ncclResult_t` named).
#[test]
fn vdevice_is_refused_where_nccl_could_not_fuse() {
    let cases: [(&str, &[&str], &str, &str); 5] = [
        (FIXTURE, &[], "0,1", "fixture ncclNetPlugin_v8 has no makeVDevice: NIC fusion needs v9+; drop --vdevice"),
        (FIXTURE_V11, &["--net-version", "8"], "0,1", "fixture ncclNetPlugin_v8 has no makeVDevice: NIC fusion needs v9+; drop --vdevice"),
        (FIXTURE_V11, &[], "0,2", "--vdevice 0,2: device 2 is not a physical device of fixture ncclNetPlugin_v11, which reports 2"),
        (FIXTURE_V11, &[], "0,1,2,3,4", "fuses at most 4 devices per virtual device"),
        (FIXTURE_V11, &["MERGE"], "0,1", "makeVDevice of devices 0,1 failed: ncclNetPlugin_v11.makeVDevice returned ncclInvalidUsage (5)"),
    ];
    for (so, extra, list, want) in cases {
        let mut args = sizes("all_reduce", "2");
        args.extend(["--vdevice", list]);
        let mut c = perf(so, &args);
        c.env("FIXTURE_NET_NDEV", if list.len() > 3 { "8" } else { "2" });
        if extra == ["MERGE"] {
            c.env("FIXTURE_NET_MERGE_NICS", "0");
        } else {
            c.args(extra);
        }
        let o = c.output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{want}\n{}", show(&o));
        // Refused before any rank ran a collective.
        assert!(!String::from_utf8_lossy(&o.stdout).contains("Out of bounds"));
    }
}

/// `--vdevice` lists NCCL never asks for are refused at parse time, naming the rule: one
/// device (NCCL does not fuse a group of 1) and a device listed twice.
#[test]
fn vdevice_lists_of_one_or_with_duplicates_are_refused() {
    for (list, rule) in [
        ("0", "a virtual device fuses 2 to 8 physical devices"),
        ("0,0", "device 0 is listed twice"),
    ] {
        let mut args = sizes("all_reduce", "2");
        args.extend(["--vdevice", list]);
        let o = perf(FIXTURE_V11, &args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(rule) && err.contains("--vdevice"),
            "{}",
            show(&o)
        );
    }
}
