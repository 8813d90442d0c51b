//! NIC fusion (`makeVDevice`, ncclNet v9+, issue 23) through the exported `ncclNetPlugin_v12`
//! table, in a process of its own (virtual devices are process-wide), as NCCL 2.28+ uses it:
//!
//! - NCCL's topology code (`src/graph/topo.cc`, `ncclTopoProcessNet`) calls `makeVDevice` for
//!   a group of devices, then `devices` (one more) and `getProperties` of the new index, and
//!   listens and connects on it;
//! - after the last communicator's `finalize`, NCCL unloads an external plugin, and after the
//!   next load counts its physical devices anew and makes its virtual devices again
//!   (`src/plugin/net.cc`, `ncclNetPluginUnload` resets `netVirtDevs`): `devices` must count
//!   the physical devices only then, and the same group gets the same index;
//! - with `NCCL_NET_PLUGIN_REF_COUNT` NCCL keeps the plugin, its device count and the indices
//!   it got: a virtual device stays counted and usable by a communicator made after every
//!   earlier one was finalized.
//!
//! Transport from `VERBSNET_TEST_TRANSPORT` (`tcp` with `VERBSNET_TCP_DEVICES=2`; `ib` in the
//! soft-RoCE VM with two rxe devices, `SOFTROCE_NDEVS=2`, where it needs GID index 0).

use std::ffi::{c_int, CStr};
use std::time::{Duration, Instant};

use nccl_net_verbsnet::ffi::abi::{ncclNetProperties_v12_t, ncclNetVDeviceProps_v12_t};

mod common;
use common::table::{self as t, Mem, Ptr, OK};

fn devices() -> c_int {
    let mut n: c_int = 0;
    // SAFETY: a valid out-pointer.
    let rc = unsafe { t::table().devices.unwrap()(&mut n) };
    assert_eq!(rc, OK);
    n
}

fn make(devs: &[c_int]) -> c_int {
    let mut v = ncclNetVDeviceProps_v12_t {
        ndevs: devs.len() as c_int,
        ..Default::default()
    };
    v.devs[..devs.len()].copy_from_slice(devs);
    let mut d: c_int = -1;
    // SAFETY: valid pointers.
    let rc = unsafe { t::table().makeVDevice.unwrap()(&mut d, &mut v) };
    assert_eq!(rc, OK, "makeVDevice {devs:?}");
    d
}

/// (name, speed, vProps devices) of device `d`.
fn props(d: c_int) -> (String, i32, Vec<c_int>) {
    let mut p = ncclNetProperties_v12_t::default();
    // SAFETY: a valid out-pointer.
    let rc = unsafe { t::table().getProperties.unwrap()(d, &mut p) };
    assert_eq!(rc, OK, "getProperties {d}");
    // SAFETY: the plugin hands out names valid for the process.
    let name = unsafe { CStr::from_ptr(p.name) }
        .to_string_lossy()
        .into_owned();
    let n = p.vProps.ndevs as usize;
    (name, p.speed, p.vProps.devs[..n].to_vec())
}

/// One message of `len` bytes each way round on device `d`: bytes checked.
fn carry(ctx: Ptr, d: c_int, len: usize) {
    let (send, recv) = t::connect_pair_on(ctx, d, Duration::from_secs(20)).expect("connect");
    let (sm, rm) = (Mem::new(len, 0), Mem::new(len, 0xee));
    let data = t::pattern(d as u64, 3, 1, len);
    sm.write(0, &data);
    let (smh, rmh) = (t::reg_mr(send, &sm).unwrap(), t::reg_mr(recv, &rm).unwrap());
    let start = Instant::now();
    let rreq = loop {
        if let Some(r) = t::irecv(recv, &[(rm.addr(0), len, 3, rmh)]).unwrap() {
            break r;
        }
    };
    let sreq = loop {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "isend never started"
        );
        if let Some(r) = t::isend(send, sm.addr(0), len, 3, smh).unwrap() {
            break r;
        }
    };
    let (mut sdone, mut rdone) = (false, false);
    while !(sdone && rdone) {
        assert!(start.elapsed() < Duration::from_secs(20), "no completion");
        if !sdone {
            sdone = t::test(sreq, 1).unwrap().is_some();
        }
        if !rdone {
            if let Some(sizes) = t::test(rreq, 1).unwrap() {
                assert_eq!(sizes, vec![len as c_int]);
                rdone = true;
            }
        }
    }
    assert!(rm.read(0, len) == data, "device {d}: data differ");
    assert_eq!(t::dereg_mr(send, smh), OK);
    assert_eq!(t::dereg_mr(recv, rmh), OK);
    assert_eq!(t::close_send(send), OK);
    assert_eq!(t::close_recv(recv), OK);
}

#[test]
fn virtual_devices_are_made_used_and_made_again_after_a_reload() {
    t::set_env(&[
        ("VERBSNET_TCP_DEVICES", "2"),
        ("VERBSNET_IB_QPS_PER_CONNECTION", "2"),
        ("VERBSNET_IB_SPLIT_DATA_ON_QPS", "1"),
    ]);
    let ctx = t::init(1).expect("init");
    let phys = devices();
    if phys < 2 {
        println!("SKIP virtual devices: {phys} device(s) here, 2 needed");
        assert_eq!(t::finalize(ctx), OK);
        return;
    }
    let (n0, s0, _) = props(0);
    let (n1, s1, _) = props(1);
    // A physical device is its own virtual NIC.
    assert_eq!(props(0).2, vec![0]);

    let a = make(&[0, 1]);
    assert_eq!(
        (a, devices()),
        (phys, phys + 1),
        "appended after the physical devices"
    );
    assert_eq!(props(a), (format!("{n0}+{n1}"), s0 + s1, vec![0, 1]));
    let b = make(&[1, 0]);
    assert_eq!((b, devices()), (phys + 1, phys + 2));
    assert_eq!(props(b).0, format!("{n1}+{n0}"));
    carry(ctx, a, (1 << 20) + 13);
    carry(ctx, b, 4096);

    // The last context goes: NCCL unloads the plugin, loads it again and counts physical
    // devices only; the same groups get the same indices.
    assert_eq!(t::finalize(ctx), OK);
    let ctx = t::init(2).expect("init after the reload");
    assert_eq!(
        devices(),
        phys,
        "only physical devices after the state was released"
    );
    assert_eq!(make(&[0, 1]), a);
    assert_eq!(devices(), phys + 1);
    carry(ctx, a, 100_000);
    // Another group at the next index replaces what was made there before the reload.
    let c = make(&[1]);
    assert_eq!((c, props(c).2), (phys + 1, vec![1]));

    // NCCL_NET_PLUGIN_REF_COUNT: NCCL keeps the plugin loaded and the indices it got (and its
    // count of devices), so a communicator made after every earlier one was finalized finds
    // them counted and usable.
    assert_eq!(t::finalize(ctx), OK);
    std::env::set_var("NCCL_NET_PLUGIN_REF_COUNT", "1");
    let ctx = t::init(3).expect("init");
    assert_eq!(devices(), phys, "made again after the reload above");
    assert_eq!(make(&[0, 1]), a);
    assert_eq!(t::finalize(ctx), OK);
    let ctx = t::init(4).expect("init");
    assert_eq!(
        devices(),
        phys + 1,
        "the plugin stayed loaded: still counted"
    );
    assert_eq!(props(a).0, format!("{n0}+{n1}"));
    carry(ctx, a, 8192 + 1);
    assert_eq!(t::finalize(ctx), OK);
}
