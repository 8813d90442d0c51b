//! The C boundary exercised as NCCL does: through the exported table's function pointers,
//! in-process, over the tcp transport on loopback.
// NCCL really stores 0x1 (NCCL_NET_OPTIONAL_RECV_COMPLETION) in *request; spell it as NCCL does.
#![allow(clippy::manual_dangling_ptr)]

use std::ffi::{c_int, c_void, CStr};
use std::ptr;

use super::abi::{
    ncclNetCommConfig_v10_t, ncclNetProperties_v12_t, ncclNetProperties_v7_t,
    ncclNetProperties_v8_t, ncclNetProperties_v9_t, ncclNetVDeviceProps_v12_t,
    ncclNetVDeviceProps_v9_t, ncclNet_v8_t, ncclResult_t, NCCL_PTR_HOST,
};
use super::v10::ncclNetPlugin_v10;
use super::v11::ncclNetPlugin_v11;
use super::v12::ncclNetPlugin_v12;
use super::v7::ncclNetPlugin_v7;
use super::v8::ncclNetPlugin_v8;
use super::v9::ncclNetPlugin_v9;

fn table() -> &'static ncclNet_v8_t {
    ncclNetPlugin_v8.get()
}

struct Pair {
    send: *mut c_void,
    recv: *mut c_void,
}

/// init, listen, then connect/accept polled alternately until both return a comm.
fn setup() -> Pair {
    let t = table();
    std::env::set_var("VERBSNET_TRANSPORT", "tcp");
    std::env::set_var("VERBSNET_SOCKET_ADDR", "127.0.0.1");
    // SAFETY: calling the plugin's own entry points with valid arguments.
    unsafe {
        assert_eq!(t.init.unwrap()(None), ncclResult_t::ncclSuccess);
        let mut handle = [0u8; 128];
        let mut listen: *mut c_void = ptr::null_mut();
        assert_eq!(
            t.listen.unwrap()(0, handle.as_mut_ptr().cast(), &mut listen),
            ncclResult_t::ncclSuccess
        );
        assert!(!listen.is_null());
        let (mut send, mut recv): (*mut c_void, *mut c_void) = (ptr::null_mut(), ptr::null_mut());
        let mut polls = 0;
        while send.is_null() || recv.is_null() {
            if send.is_null() {
                let r =
                    t.connect.unwrap()(0, handle.as_mut_ptr().cast(), &mut send, ptr::null_mut());
                assert_eq!(r, ncclResult_t::ncclSuccess);
            }
            if recv.is_null() {
                let r = t.accept.unwrap()(listen, &mut recv, ptr::null_mut());
                assert_eq!(r, ncclResult_t::ncclSuccess);
            }
            polls += 1;
            assert!(polls < 1_000_000, "connect/accept never finished");
        }
        assert!(polls > 1, "the handshake needs several non-blocking calls");
        assert_eq!(t.closeListen.unwrap()(listen), ncclResult_t::ncclSuccess);
        Pair { send, recv }
    }
}

#[test]
fn close_frees_the_registrations_a_caller_left_behind() {
    let t = table();
    let p = setup();
    let bufs: Vec<Vec<u8>> = (0..5).map(|_| vec![0u8; 4096]).collect();
    let live = |b: &Vec<u8>| {
        crate::api::LIVE_MR_ADDRS
            .lock()
            .unwrap()
            .contains(&(b.as_ptr() as u64))
    };
    // SAFETY: valid comms from setup; the buffers outlive their registrations.
    unsafe {
        let mut mhs = Vec::new();
        for (k, b) in bufs.iter().enumerate() {
            let comm = if k < 3 { p.send } else { p.recv };
            let mut mh: *mut c_void = ptr::null_mut();
            assert_eq!(
                t.regMr.unwrap()(
                    comm,
                    b.as_ptr() as *mut c_void,
                    4096,
                    NCCL_PTR_HOST as c_int,
                    &mut mh
                ),
                ncclResult_t::ncclSuccess
            );
            mhs.push((comm, mh));
        }
        assert!(bufs.iter().all(live));
        // Deregistered ones go at once; the rest stay until their comm closes.
        assert_eq!(
            t.deregMr.unwrap()(mhs[1].0, mhs[1].1),
            ncclResult_t::ncclSuccess
        );
        assert_eq!(
            t.deregMr.unwrap()(mhs[4].0, mhs[4].1),
            ncclResult_t::ncclSuccess
        );
        assert!(!live(&bufs[1]) && !live(&bufs[4]));
        assert!(live(&bufs[0]) && live(&bufs[2]) && live(&bufs[3]));
        assert_eq!(t.closeSend.unwrap()(p.send), ncclResult_t::ncclSuccess);
        assert!(
            !live(&bufs[0]) && !live(&bufs[2]),
            "closeSend freed its registrations"
        );
        assert!(live(&bufs[3]), "the receive comm's registration is its own");
        assert_eq!(t.closeRecv.unwrap()(p.recv), ncclResult_t::ncclSuccess);
        assert!(!bufs.iter().any(live), "closeRecv freed the last one");
        // A handle deregistered twice, or after its comm's close freed it, is refused; it is
        // never freed twice.
        assert_eq!(
            t.deregMr.unwrap()(ptr::null_mut(), mhs[1].1),
            ncclResult_t::ncclInvalidArgument
        );
        assert_eq!(
            t.deregMr.unwrap()(ptr::null_mut(), mhs[0].1),
            ncclResult_t::ncclInvalidArgument
        );
    }
}

#[test]
fn table_is_named_and_optional_slots_are_null() {
    let t = table();
    // SAFETY: name points to a static C string.
    let name = unsafe { CStr::from_ptr(t.name) };
    assert_eq!(name.to_str().unwrap(), "verbsnet");
    assert!(t.regMrDmaBuf.is_none() && t.getDeviceMr.is_none() && t.irecvConsumed.is_none());
    assert!(
        t.init.is_some()
            && t.isend.is_some()
            && t.irecv.is_some()
            && t.test.is_some()
            && t.iflush.is_some()
    );
}

#[test]
fn full_flow_through_the_table() {
    let t = table();
    let p = setup();
    // SAFETY: every pointer below is valid for the call; buffers outlive their registration.
    unsafe {
        let mut ndev: c_int = 0;
        assert_eq!(t.devices.unwrap()(&mut ndev), ncclResult_t::ncclSuccess);
        assert_eq!(ndev, 1);
        let mut props: ncclNetProperties_v8_t = std::mem::zeroed();
        assert_eq!(
            t.getProperties.unwrap()(0, &mut props),
            ncclResult_t::ncclSuccess
        );
        assert_eq!(CStr::from_ptr(props.name).to_str().unwrap(), "tcp0");
        assert!(props.pciPath.is_null());
        assert_eq!(props.ptrSupport, NCCL_PTR_HOST as c_int);
        assert_eq!(props.maxRecvs, 8);
        assert!(props.maxComms >= 64);
        assert_eq!(
            t.getProperties.unwrap()(5, &mut props),
            ncclResult_t::ncclInvalidArgument
        );

        let mut sbuf = vec![0u8; 1 << 20];
        let mut rbuf = vec![0u8; 1 << 20];
        let (mut smh, mut rmh): (*mut c_void, *mut c_void) = (ptr::null_mut(), ptr::null_mut());
        assert_eq!(
            t.regMr.unwrap()(
                p.send,
                sbuf.as_mut_ptr().cast(),
                sbuf.len(),
                NCCL_PTR_HOST as c_int,
                &mut smh
            ),
            ncclResult_t::ncclSuccess
        );
        assert_eq!(
            t.regMr.unwrap()(
                p.recv,
                rbuf.as_mut_ptr().cast(),
                rbuf.len(),
                NCCL_PTR_HOST as c_int,
                &mut rmh
            ),
            ncclResult_t::ncclSuccess
        );
        // GPU memory is refused with a clear error: ptrSupport says host only.
        let mut bad: *mut c_void = ptr::null_mut();
        assert_eq!(
            t.regMr.unwrap()(p.send, sbuf.as_mut_ptr().cast(), 64, 2, &mut bad),
            ncclResult_t::ncclInternalError
        );
        assert!(bad.is_null());
        // A range that wraps the address space is refused before anything sees it.
        assert_eq!(
            t.regMr.unwrap()(
                p.send,
                usize::MAX as *mut c_void,
                0x2000,
                NCCL_PTR_HOST as c_int,
                &mut bad
            ),
            ncclResult_t::ncclInvalidArgument
        );
        assert!(bad.is_null());

        for (k, size) in [0usize, 5, 8192, 8193, 1 << 20].into_iter().enumerate() {
            for (i, b) in sbuf[..size].iter_mut().enumerate() {
                *b = (i * 7 + k) as u8;
            }
            // *request may arrive holding 0x1 (NCCL_NET_OPTIONAL_RECV_COMPLETION): always overwritten.
            let mut rreq: *mut c_void = 1 as *mut c_void;
            let mut data = [rbuf.as_mut_ptr().cast::<c_void>()];
            let mut sizes = [rbuf.len() as c_int];
            let mut tags = [42 as c_int];
            let mut mhs = [rmh];
            assert_eq!(
                t.irecv.unwrap()(
                    p.recv,
                    1,
                    data.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    tags.as_mut_ptr(),
                    mhs.as_mut_ptr(),
                    &mut rreq
                ),
                ncclResult_t::ncclSuccess
            );
            assert!(!rreq.is_null() && rreq as usize != 1);
            let mut sreq: *mut c_void = 1 as *mut c_void;
            let mut tries = 0;
            loop {
                let r = t.isend.unwrap()(
                    p.send,
                    sbuf.as_mut_ptr().cast(),
                    size as c_int,
                    42,
                    smh,
                    &mut sreq,
                );
                assert_eq!(r, ncclResult_t::ncclSuccess);
                if !sreq.is_null() {
                    break;
                }
                let mut d = 0;
                t.test.unwrap()(rreq, &mut d, ptr::null_mut());
                tries += 1;
                assert!(tries < 1_000_000);
            }
            let (mut sdone, mut rdone) = (0, 0);
            let mut got: [c_int; 1] = [-1];
            let mut polls = 0;
            while sdone == 0 || rdone == 0 {
                if sdone == 0 {
                    // The sizes pointer may be NULL.
                    assert_eq!(
                        t.test.unwrap()(sreq, &mut sdone, ptr::null_mut()),
                        ncclResult_t::ncclSuccess
                    );
                }
                if rdone == 0 {
                    assert_eq!(
                        t.test.unwrap()(rreq, &mut rdone, got.as_mut_ptr()),
                        ncclResult_t::ncclSuccess
                    );
                }
                polls += 1;
                assert!(polls < 10_000_000, "size {size} never completed");
            }
            assert_eq!(got[0] as usize, size);
            assert_eq!(&rbuf[..size], &sbuf[..size], "size {size}");
        }

        // A flush on host memory completes at once: NULL request.
        let mut freq: *mut c_void = 1 as *mut c_void;
        let mut data = [rbuf.as_mut_ptr().cast::<c_void>()];
        let mut sizes = [8 as c_int];
        let mut mhs = [rmh];
        assert_eq!(
            t.iflush.unwrap()(
                p.recv,
                1,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                mhs.as_mut_ptr(),
                &mut freq
            ),
            ncclResult_t::ncclSuccess
        );
        assert!(freq.is_null());

        // Bad arguments are errors, and the out-parameter is left alone.
        let mut req: *mut c_void = 7 as *mut c_void;
        assert_eq!(
            t.isend.unwrap()(p.send, sbuf.as_mut_ptr().cast(), -1, 0, smh, &mut req),
            ncclResult_t::ncclInvalidArgument
        );
        assert_eq!(req as usize, 7);
        assert_eq!(
            t.isend.unwrap()(
                p.send,
                sbuf.as_mut_ptr().cast(),
                8,
                0,
                ptr::null_mut(),
                &mut req
            ),
            ncclResult_t::ncclInvalidArgument
        );
        // A buffer outside its registration is refused before anything is posted.
        let mut other = vec![0u8; 64];
        assert_eq!(
            t.isend.unwrap()(p.send, other.as_mut_ptr().cast(), 64, 0, smh, &mut req),
            ncclResult_t::ncclInvalidArgument
        );
        let mut nine = [ptr::null_mut::<c_void>(); 9];
        let mut nsz = [8 as c_int; 9];
        let mut ntag = [0 as c_int; 9];
        let mut nmh = [rmh; 9];
        assert_eq!(
            t.irecv.unwrap()(
                p.recv,
                9,
                nine.as_mut_ptr(),
                nsz.as_mut_ptr(),
                ntag.as_mut_ptr(),
                nmh.as_mut_ptr(),
                &mut req
            ),
            ncclResult_t::ncclInvalidArgument
        );

        assert_eq!(t.deregMr.unwrap()(p.send, smh), ncclResult_t::ncclSuccess);
        assert_eq!(t.deregMr.unwrap()(p.recv, rmh), ncclResult_t::ncclSuccess);
        assert_eq!(t.closeSend.unwrap()(p.send), ncclResult_t::ncclSuccess);
        assert_eq!(t.closeRecv.unwrap()(p.recv), ncclResult_t::ncclSuccess);
        drop(other);
    }
}

#[test]
fn a_comm_of_the_wrong_end_is_refused_not_used() {
    // NCCL passing a receive comm to isend (or a send comm to irecv/iflush) misuses the plugin:
    // ncclInternalError (ext-net README `plugins/net/README.md`, error codes), one WARN, and
    // the out-parameter left alone; the comms stay usable.
    let t = table();
    let p = setup();
    let mut buf = vec![0u8; 4096];
    // SAFETY: every pointer is valid for its call; the buffer outlives its registrations.
    unsafe {
        let (mut smh, mut rmh): (*mut c_void, *mut c_void) = (ptr::null_mut(), ptr::null_mut());
        for (c, mh) in [(p.send, &mut smh), (p.recv, &mut rmh)] {
            let r = t.regMr.unwrap()(
                c,
                buf.as_mut_ptr().cast(),
                buf.len(),
                NCCL_PTR_HOST as c_int,
                mh,
            );
            assert_eq!(r, ncclResult_t::ncclSuccess);
        }
        let mut req: *mut c_void = 5 as *mut c_void;
        let r = t.isend.unwrap()(p.recv, buf.as_mut_ptr().cast(), 8, 0, rmh, &mut req);
        assert_eq!((r, req as usize), (ncclResult_t::ncclInternalError, 5));
        let mut data = [buf.as_mut_ptr().cast::<c_void>()];
        let mut sizes = [8 as c_int];
        let mut tags = [0 as c_int];
        let mut mhs = [smh];
        let r = t.irecv.unwrap()(
            p.send,
            1,
            data.as_mut_ptr(),
            sizes.as_mut_ptr(),
            tags.as_mut_ptr(),
            mhs.as_mut_ptr(),
            &mut req,
        );
        assert_eq!((r, req as usize), (ncclResult_t::ncclInternalError, 5));
        let r = t.iflush.unwrap()(
            p.send,
            1,
            data.as_mut_ptr(),
            sizes.as_mut_ptr(),
            mhs.as_mut_ptr(),
            &mut req,
        );
        assert_eq!((r, req as usize), (ncclResult_t::ncclInternalError, 5));
        // The right ends still work: a message goes through.
        mhs = [rmh];
        let r = t.irecv.unwrap()(
            p.recv,
            1,
            data.as_mut_ptr(),
            sizes.as_mut_ptr(),
            tags.as_mut_ptr(),
            mhs.as_mut_ptr(),
            &mut req,
        );
        assert_eq!(r, ncclResult_t::ncclSuccess);
        let rreq = req;
        assert!(!rreq.is_null());
        let mut sreq: *mut c_void = ptr::null_mut();
        while sreq.is_null() {
            let r = t.isend.unwrap()(p.send, buf.as_mut_ptr().cast(), 8, 0, smh, &mut sreq);
            assert_eq!(r, ncclResult_t::ncclSuccess);
        }
        let (mut sdone, mut rdone, mut size) = (0, 0, -1 as c_int);
        for _ in 0..1_000_000 {
            if sdone == 0 {
                let r = t.test.unwrap()(sreq, &mut sdone, ptr::null_mut());
                assert_eq!(r, ncclResult_t::ncclSuccess);
            }
            if rdone == 0 {
                let r = t.test.unwrap()(rreq, &mut rdone, &mut size);
                assert_eq!(r, ncclResult_t::ncclSuccess);
            }
            if sdone == 1 && rdone == 1 {
                break;
            }
        }
        assert_eq!((sdone, rdone, size), (1, 1, 8));
        assert_eq!(t.deregMr.unwrap()(p.send, smh), ncclResult_t::ncclSuccess);
        assert_eq!(t.deregMr.unwrap()(p.recv, rmh), ncclResult_t::ncclSuccess);
        assert_eq!(t.closeSend.unwrap()(p.send), ncclResult_t::ncclSuccess);
        assert_eq!(t.closeRecv.unwrap()(p.recv), ncclResult_t::ncclSuccess);
    }
}

#[test]
fn a_foreign_handle_is_refused_with_a_clear_error() {
    let t = table();
    let _ = setup();
    let mut handle = [0xabu8; 128];
    let mut send: *mut c_void = 3 as *mut c_void;
    // SAFETY: valid pointers; the handle is garbage on purpose.
    let r =
        unsafe { t.connect.unwrap()(0, handle.as_mut_ptr().cast(), &mut send, ptr::null_mut()) };
    assert_eq!(r, ncclResult_t::ncclInvalidArgument);
    assert_eq!(send as usize, 3, "out-parameter untouched on error");
}

#[test]
fn v7_table_shares_the_shims_and_converts_properties_and_int_sizes() {
    let t7 = ncclNetPlugin_v7.get();
    let p = setup();
    // SAFETY: valid pointers throughout; the buffer outlives its registration.
    unsafe {
        assert_eq!(CStr::from_ptr(t7.name).to_str().unwrap(), "verbsnet");
        let mut props: ncclNetProperties_v7_t = std::mem::zeroed();
        assert_eq!(
            t7.getProperties.unwrap()(0, &mut props),
            ncclResult_t::ncclSuccess
        );
        assert_eq!(CStr::from_ptr(props.name).to_str().unwrap(), "tcp0");
        assert_eq!(
            (props.ptrSupport, props.maxRecvs, props.speed),
            (NCCL_PTR_HOST as c_int, 8, 10000)
        );
        assert_eq!(
            t7.getProperties.unwrap()(0, ptr::null_mut()),
            ncclResult_t::ncclInvalidArgument
        );
        let mut buf = vec![0u8; 4096];
        let mut mh: *mut c_void = ptr::null_mut();
        assert_eq!(
            t7.regMr.unwrap()(
                p.send,
                buf.as_mut_ptr().cast(),
                4096,
                NCCL_PTR_HOST as c_int,
                &mut mh
            ),
            ncclResult_t::ncclSuccess
        );
        assert!(!mh.is_null());
        let mut bad: *mut c_void = ptr::null_mut();
        assert_eq!(
            t7.regMr.unwrap()(
                p.send,
                buf.as_mut_ptr().cast(),
                -1,
                NCCL_PTR_HOST as c_int,
                &mut bad
            ),
            ncclResult_t::ncclInvalidArgument
        );
        assert!(bad.is_null());
        assert_eq!(t7.deregMr.unwrap()(p.send, mh), ncclResult_t::ncclSuccess);
        assert_eq!(t7.closeSend.unwrap()(p.send), ncclResult_t::ncclSuccess);
        assert_eq!(t7.closeRecv.unwrap()(p.recv), ncclResult_t::ncclSuccess);
    }
}

#[test]
fn every_table_is_named_verbsnet_with_the_optional_slots_null() {
    let names = [
        ncclNetPlugin_v7.name,
        ncclNetPlugin_v8.name,
        ncclNetPlugin_v9.name,
        ncclNetPlugin_v10.name,
        ncclNetPlugin_v11.name,
        ncclNetPlugin_v12.name,
    ];
    for n in names {
        // SAFETY: each name points to the same static C string.
        assert_eq!(unsafe { CStr::from_ptr(n) }.to_str().unwrap(), "verbsnet");
    }
    // makeVDevice set from v9 on (NIC fusion, src/graph/topo.cc); setNetAttr NULL (optional).
    assert!(ncclNetPlugin_v9.makeVDevice.is_some() && ncclNetPlugin_v10.makeVDevice.is_some());
    let (t11, t12) = (ncclNetPlugin_v11.get(), ncclNetPlugin_v12.get());
    assert!(t11.makeVDevice.is_some() && t11.setNetAttr.is_none() && t11.finalize.is_some());
    assert!(t12.makeVDevice.is_some() && t12.setNetAttr.is_none() && t12.finalize.is_some());
}

/// `makeVDevice` refuses what NCCL IB refuses, and what a struct cannot hold, with
/// `ncclInvalidUsage` as NCCL IB (NULL pointers: `ncclInvalidArgument`), and nothing made
/// (the successful path, which makes a process-wide device, runs in its own process:
/// `testharness/tests/perf.rs`, `verbsnet-perf --vdevice`).
#[test]
fn make_vdevice_refuses_bad_device_lists_and_makes_nothing() {
    let _ = setup();
    let mut n0: c_int = 0;
    // SAFETY: valid out-pointer.
    let rc = unsafe { ncclNetPlugin_v9.devices.unwrap()(&mut n0) };
    assert_eq!(rc, ncclResult_t::ncclSuccess);
    let make9 = ncclNetPlugin_v9.makeVDevice.unwrap();
    let make12 = ncclNetPlugin_v12.get().makeVDevice.unwrap();
    let v9 = |n: i32, devs: &[i32]| {
        let mut v = ncclNetVDeviceProps_v9_t {
            ndevs: n,
            ..Default::default()
        };
        v.devs[..devs.len()].copy_from_slice(devs);
        v
    };
    let mut d: c_int = -7;
    for (mut v, want) in [
        (v9(0, &[]), ncclResult_t::ncclInvalidUsage),
        (v9(5, &[0, 0, 0, 0]), ncclResult_t::ncclInvalidUsage),
        (v9(-1, &[]), ncclResult_t::ncclInvalidUsage),
        (v9(1, &[n0]), ncclResult_t::ncclInvalidUsage),
        (v9(1, &[-1]), ncclResult_t::ncclInvalidUsage),
        (v9(2, &[0, 0]), ncclResult_t::ncclInvalidUsage),
    ] {
        // SAFETY: valid pointers.
        let rc = unsafe { make9(&mut d, &mut v) };
        assert_eq!(rc, want, "{:?}", (v.ndevs, v.devs));
        assert_eq!(d, -7, "nothing written on failure");
    }
    let mut w = ncclNetVDeviceProps_v12_t {
        ndevs: 9,
        ..Default::default()
    };
    // SAFETY: valid pointers.
    let rc = unsafe { make12(&mut d, &mut w) };
    assert_eq!(rc, ncclResult_t::ncclInvalidUsage);
    // SAFETY: NULL props and NULL d are refused before any use.
    unsafe {
        assert_eq!(
            make9(&mut d, std::ptr::null_mut()),
            ncclResult_t::ncclInvalidArgument
        );
        assert_eq!(
            make9(std::ptr::null_mut(), &mut v9(1, &[0])),
            ncclResult_t::ncclInvalidArgument
        );
    }
    let mut n1: c_int = 0;
    // SAFETY: valid out-pointer.
    let rc = unsafe { ncclNetPlugin_v9.devices.unwrap()(&mut n1) };
    assert_eq!(rc, ncclResult_t::ncclSuccess);
    assert_eq!(n1, n0, "no device made");
}

#[test]
fn v9_properties_carry_the_size_limits_and_a_single_device_vnic() {
    let _ = setup();
    let mut p: ncclNetProperties_v9_t = Default::default();
    // SAFETY: valid pointer to a v9 struct.
    let r = unsafe { ncclNetPlugin_v9.getProperties.unwrap()(0, &mut p) };
    assert_eq!(r, ncclResult_t::ncclSuccess);
    assert_eq!(p.maxP2pBytes, 1 << 30);
    assert!(p.maxP2pBytes as u64 <= super::abi::NCCL_MAX_NET_SIZE_BYTES);
    assert_eq!(p.maxCollBytes, 512 << 20);
    assert_eq!((p.vProps.ndevs, p.vProps.devs[0]), (1, 0));
    assert_eq!((p.forceFlush, p.maxRecvs), (0, 8));
}

type InitCtx = unsafe extern "C" fn(
    *mut *mut c_void,
    u64,
    *mut ncclNetCommConfig_v10_t,
    super::abi::ncclDebugLogger_t,
    super::abi::ncclProfilerCallback_t,
) -> ncclResult_t;

/// `init(ctx, commId, {trafficClass})` of a v11/v12 table.
fn init_ctx(init: InitCtx, comm_id: u64, tc: c_int) -> (ncclResult_t, *mut c_void) {
    let mut cfg = ncclNetCommConfig_v10_t { trafficClass: tc };
    let mut ctx: *mut c_void = ptr::null_mut();
    // SAFETY: valid pointers for the call.
    let r = unsafe { init(&mut ctx, comm_id, &mut cfg, None, None) };
    (r, ctx)
}

#[test]
fn v12_contexts_carry_a_message_with_optional_completion_and_finalize_in_turn() {
    std::env::set_var("VERBSNET_TRANSPORT", "tcp");
    std::env::set_var("VERBSNET_SOCKET_ADDR", "127.0.0.1");
    let t = ncclNetPlugin_v12.get();
    let (r, a) = init_ctx(t.init.unwrap(), 0xa, 106);
    assert_eq!(r, ncclResult_t::ncclSuccess);
    let (r, b) = init_ctx(t.init.unwrap(), 0xb, -1);
    assert_eq!(r, ncclResult_t::ncclSuccess);
    assert!(!a.is_null() && !b.is_null() && a != b);
    assert!(crate::api::contexts() >= 2);
    // A trafficClass outside a byte is the user's mistake, and said so.
    let (r, bad) = init_ctx(t.init.unwrap(), 0xc, 300);
    assert_eq!((r, bad), (ncclResult_t::ncclInvalidUsage, ptr::null_mut()));
    // SAFETY: every pointer below is valid for its call; buffers outlive their registration.
    unsafe {
        let mut p: ncclNetProperties_v12_t = Default::default();
        assert_eq!(
            t.getProperties.unwrap()(0, &mut p),
            ncclResult_t::ncclSuccess
        );
        assert_eq!((p.railId, p.planeId, p.maxMultiRequestSize), (-1, -1, 1));
        assert_eq!(
            (p.vProps.ndevs, p.vProps.devs[0], p.maxP2pBytes),
            (1, 0, 1 << 30)
        );

        // one connection in context a
        let mut handle = [0u8; 128];
        let mut listen: *mut c_void = ptr::null_mut();
        let r = t.listen.unwrap()(a, 0, handle.as_mut_ptr().cast(), &mut listen);
        assert_eq!(r, ncclResult_t::ncclSuccess);
        let (mut send, mut recv): (*mut c_void, *mut c_void) = (ptr::null_mut(), ptr::null_mut());
        for _ in 0..1_000_000 {
            if send.is_null() {
                let h = handle.as_mut_ptr().cast();
                let r = t.connect.unwrap()(a, 0, h, &mut send, ptr::null_mut());
                assert_eq!(r, ncclResult_t::ncclSuccess);
            }
            if recv.is_null() {
                let r = t.accept.unwrap()(listen, &mut recv, ptr::null_mut());
                assert_eq!(r, ncclResult_t::ncclSuccess);
            }
            if !send.is_null() && !recv.is_null() {
                break;
            }
        }
        assert!(!send.is_null() && !recv.is_null());
        assert_eq!(t.closeListen.unwrap()(listen), ncclResult_t::ncclSuccess);
        // Context b finalized while a's comms live: a keeps working.
        assert_eq!(t.finalize.unwrap()(b), ncclResult_t::ncclSuccess);

        let len = 100_000usize;
        let mut sbuf: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut rbuf = vec![0u8; len];
        let (mut smh, mut rmh): (*mut c_void, *mut c_void) = (ptr::null_mut(), ptr::null_mut());
        let r = t.regMr.unwrap()(send, sbuf.as_mut_ptr().cast(), len, 1, &mut smh);
        assert_eq!(r, ncclResult_t::ncclSuccess);
        let r = t.regMr.unwrap()(recv, rbuf.as_mut_ptr().cast(), len, 1, &mut rmh);
        assert_eq!(r, ncclResult_t::ncclSuccess);
        let mut datas = [rbuf.as_mut_ptr().cast::<c_void>()];
        let mut sizes = [len];
        let mut tags = [7];
        let mut mhs = [rmh];
        let mut phs = [ptr::null_mut()];
        // NCCL presets NCCL_NET_OPTIONAL_RECV_COMPLETION (0x1) for LL/LL128 receives.
        let mut rreq: *mut c_void = 0x1 as *mut c_void;
        while rreq.is_null() || rreq as usize == 0x1 {
            let r = t.irecv.unwrap()(
                recv,
                1,
                datas.as_mut_ptr(),
                sizes.as_mut_ptr(),
                tags.as_mut_ptr(),
                mhs.as_mut_ptr(),
                phs.as_mut_ptr(),
                &mut rreq,
            );
            assert_eq!(r, ncclResult_t::ncclSuccess);
            assert_ne!(rreq as usize, 0x1, "the preset value is always overwritten");
        }
        let mut sreq: *mut c_void = ptr::null_mut();
        let (mut sdone, mut rdone) = (0, 0);
        let (mut ssize, mut rsize) = ([0 as c_int], [0 as c_int]);
        while sreq.is_null() {
            let d = sbuf.as_mut_ptr().cast();
            let r = t.isend.unwrap()(send, d, len, 7, smh, ptr::null_mut(), &mut sreq);
            assert_eq!(r, ncclResult_t::ncclSuccess);
            if sreq.is_null() {
                // drive the receiver (it answers with the clear-to-send)
                let r = t.test.unwrap()(rreq, &mut rdone, rsize.as_mut_ptr());
                assert_eq!(r, ncclResult_t::ncclSuccess);
            }
        }
        for _ in 0..10_000_000 {
            if sdone == 0 {
                let r = t.test.unwrap()(sreq, &mut sdone, ssize.as_mut_ptr());
                assert_eq!(r, ncclResult_t::ncclSuccess);
            }
            if rdone == 0 {
                let r = t.test.unwrap()(rreq, &mut rdone, rsize.as_mut_ptr());
                assert_eq!(r, ncclResult_t::ncclSuccess);
            }
            if sdone == 1 && rdone == 1 {
                break;
            }
        }
        assert_eq!((sdone, rdone), (1, 1));
        assert_eq!((ssize[0], rsize[0]), (len as c_int, len as c_int));
        assert_eq!(rbuf, sbuf);
        // A send above maxP2pBytes is refused, naming the limit.
        let mut big: *mut c_void = ptr::null_mut();
        let d = sbuf.as_mut_ptr().cast();
        let r = t.isend.unwrap()(send, d, (1 << 30) + 1, 7, smh, ptr::null_mut(), &mut big);
        assert_eq!(r, ncclResult_t::ncclInvalidArgument);
        assert_eq!(t.deregMr.unwrap()(send, smh), ncclResult_t::ncclSuccess);
        assert_eq!(t.deregMr.unwrap()(recv, rmh), ncclResult_t::ncclSuccess);
        assert_eq!(t.closeSend.unwrap()(send), ncclResult_t::ncclSuccess);
        assert_eq!(t.closeRecv.unwrap()(recv), ncclResult_t::ncclSuccess);
        assert_eq!(t.finalize.unwrap()(a), ncclResult_t::ncclSuccess);
        assert_eq!(
            t.finalize.unwrap()(ptr::null_mut()),
            ncclResult_t::ncclInvalidArgument
        );
    }
}

/// One message of exactly maxP2pBytes (1 GiB), the largest NCCL may hand a v9+ plugin, through
/// the v9 table (`size_t` sizes) over tcp: it arrives whole and `test` reports its size.
#[test]
fn v9_moves_one_message_of_max_p2p_bytes() {
    let t = ncclNetPlugin_v9.get();
    let p = setup();
    let len: usize = 1 << 30;
    let mut sbuf: Vec<u8> = (0..len).map(|i| (i >> 12) as u8 ^ (i as u8)).collect();
    let mut rbuf = vec![0u8; len];
    // SAFETY: every pointer below is valid for its call; buffers outlive their registration.
    unsafe {
        let (mut smh, mut rmh): (*mut c_void, *mut c_void) = (ptr::null_mut(), ptr::null_mut());
        let r = t.regMr.unwrap()(p.send, sbuf.as_mut_ptr().cast(), len, 1, &mut smh);
        assert_eq!(r, ncclResult_t::ncclSuccess);
        let r = t.regMr.unwrap()(p.recv, rbuf.as_mut_ptr().cast(), len, 1, &mut rmh);
        assert_eq!(r, ncclResult_t::ncclSuccess);
        let mut datas = [rbuf.as_mut_ptr().cast::<c_void>()];
        let (mut sizes, mut tags, mut mhs) = ([len], [1], [rmh]);
        let mut rreq: *mut c_void = ptr::null_mut();
        while rreq.is_null() {
            let r = t.irecv.unwrap()(
                p.recv,
                1,
                datas.as_mut_ptr(),
                sizes.as_mut_ptr(),
                tags.as_mut_ptr(),
                mhs.as_mut_ptr(),
                &mut rreq,
            );
            assert_eq!(r, ncclResult_t::ncclSuccess);
        }
        let mut sreq: *mut c_void = ptr::null_mut();
        let (mut sdone, mut rdone) = (0, 0);
        let (mut ssize, mut rsize) = ([0 as c_int], [0 as c_int]);
        while sreq.is_null() {
            let r = t.isend.unwrap()(p.send, sbuf.as_mut_ptr().cast(), len, 1, smh, &mut sreq);
            assert_eq!(r, ncclResult_t::ncclSuccess);
            if sreq.is_null() {
                let r = t.test.unwrap()(rreq, &mut rdone, rsize.as_mut_ptr());
                assert_eq!(r, ncclResult_t::ncclSuccess);
            }
        }
        let start = std::time::Instant::now();
        while sdone == 0 || rdone == 0 {
            if sdone == 0 {
                let r = t.test.unwrap()(sreq, &mut sdone, ssize.as_mut_ptr());
                assert_eq!(r, ncclResult_t::ncclSuccess);
            }
            if rdone == 0 {
                let r = t.test.unwrap()(rreq, &mut rdone, rsize.as_mut_ptr());
                assert_eq!(r, ncclResult_t::ncclSuccess);
            }
            assert!(start.elapsed().as_secs() < 300, "1 GiB never completed");
        }
        assert_eq!((ssize[0], rsize[0]), (len as c_int, len as c_int));
        assert!(rbuf == sbuf, "the 1 GiB message arrived changed");
        assert_eq!(t.deregMr.unwrap()(p.send, smh), ncclResult_t::ncclSuccess);
        assert_eq!(t.deregMr.unwrap()(p.recv, rmh), ncclResult_t::ncclSuccess);
        assert_eq!(t.closeSend.unwrap()(p.send), ncclResult_t::ncclSuccess);
        assert_eq!(t.closeRecv.unwrap()(p.recv), ncclResult_t::ncclSuccess);
    }
}

#[test]
fn v10_connect_reads_its_config_which_may_be_null() {
    let t = ncclNetPlugin_v10.get();
    let _ = setup();
    let mut handle = [0xabu8; 128];
    let mut send: *mut c_void = ptr::null_mut();
    let mut cfg = ncclNetCommConfig_v10_t { trafficClass: 300 };
    // SAFETY: valid pointers; the handle is garbage on purpose (never reached: the config is
    // checked first).
    let r = unsafe {
        t.connect.unwrap()(
            0,
            &mut cfg,
            handle.as_mut_ptr().cast(),
            &mut send,
            ptr::null_mut(),
        )
    };
    assert_eq!(
        r,
        ncclResult_t::ncclInvalidUsage,
        "trafficClass 300 is not a byte"
    );
    // NULL config (NCCL's GDR probe): accepted; the garbage handle is what fails.
    // SAFETY: as above.
    let r = unsafe {
        t.connect.unwrap()(
            0,
            ptr::null_mut(),
            handle.as_mut_ptr().cast(),
            &mut send,
            ptr::null_mut(),
        )
    };
    assert_eq!(r, ncclResult_t::ncclInvalidArgument);
    assert!(send.is_null());
}

#[test]
fn a_panic_in_a_slot_body_is_contained_and_reported_as_an_internal_error() {
    let r = super::boundary::guard("test", || panic!("boom"));
    assert_eq!(r, ncclResult_t::ncclInternalError);
}

#[test]
fn null_arguments_are_refused_and_the_request_left_alone() {
    let t = table();
    let p = setup();
    let mut buf = vec![0u8; 64];
    // SAFETY: every pointer is valid for its call or NULL on purpose.
    unsafe {
        let mut mh: *mut c_void = ptr::null_mut();
        let r = t.regMr.unwrap()(p.recv, buf.as_mut_ptr().cast(), 64, 1, &mut mh);
        assert_eq!(r, ncclResult_t::ncclSuccess);
        let mut data = [buf.as_mut_ptr().cast::<c_void>()];
        let mut tags = [0 as c_int];
        let mut mhs = [mh];
        let mut req: *mut c_void = 9 as *mut c_void;
        let r = t.irecv.unwrap()(
            p.recv,
            1,
            data.as_mut_ptr(),
            ptr::null_mut(),
            tags.as_mut_ptr(),
            mhs.as_mut_ptr(),
            &mut req,
        );
        assert_eq!((r, req as usize), (ncclResult_t::ncclInvalidArgument, 9));
        let r = t.test.unwrap()(ptr::null_mut(), &mut 0, ptr::null_mut());
        assert_eq!(r, ncclResult_t::ncclInvalidArgument);
        assert_eq!(
            t.closeSend.unwrap()(ptr::null_mut()),
            ncclResult_t::ncclInvalidArgument
        );
        assert_eq!(t.deregMr.unwrap()(p.recv, mh), ncclResult_t::ncclSuccess);
        assert_eq!(t.closeSend.unwrap()(p.send), ncclResult_t::ncclSuccess);
        assert_eq!(t.closeRecv.unwrap()(p.recv), ncclResult_t::ncclSuccess);
    }
}
