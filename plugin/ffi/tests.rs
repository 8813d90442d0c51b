//! The C boundary exercised as NCCL does: through the exported table's function pointers,
//! in-process, over the tcp transport on loopback.
// NCCL really stores 0x1 (NCCL_NET_OPTIONAL_RECV_COMPLETION) in *request; spell it as NCCL does.
#![allow(clippy::manual_dangling_ptr)]

use std::ffi::{c_int, c_void, CStr};
use std::ptr;

use super::abi::{
    ncclNetProperties_v7_t, ncclNetProperties_v8_t, ncclNet_v8_t, ncclResult_t, NCCL_PTR_HOST,
};
use super::plugin::{ncclNetPlugin_v7, ncclNetPlugin_v8};

fn table() -> &'static ncclNet_v8_t {
    &ncclNetPlugin_v8.0
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
fn table_is_named_and_optional_slots_are_null() {
    let t = table();
    // SAFETY: name points to a static C string.
    assert_eq!(
        unsafe { CStr::from_ptr(t.name) }.to_str().unwrap(),
        "verbsnet"
    );
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
    let t7 = &ncclNetPlugin_v7.0;
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
