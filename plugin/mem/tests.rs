//! Unit tests of `Region` (`super`): bounds, the atomic copies, words, socket I/O.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;

use super::*;

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (b, _) = l.accept().expect("accept");
    (a, b)
}

/// `regMr(NULL, 0)` makes a region at address 0: zero-length accesses succeed without a
/// copy through the null pointer, anything longer is out of bounds.
#[test]
fn an_empty_region_at_address_zero_is_never_dereferenced() {
    // SAFETY: zero bytes at address 0; nothing is ever read or written through it.
    let r = unsafe { Region::from_raw(0, 0) };
    let other = Region::alloc(8);
    assert_eq!(r.write(0, &[]), Ok(()));
    assert_eq!(r.read(0, &mut []), Ok(()));
    let mut v = vec![7u8];
    assert_eq!(r.append_to(0, 0, &mut v), Ok(()));
    assert_eq!(v, [7]);
    assert_eq!(r.copy_from(0, &other, 0, 0), Ok(()));
    assert_eq!(other.copy_from(0, &r, 0, 0), Ok(()));
    assert!(r.write(0, &[1]).is_err());
    assert!(!r.contains(0, 1));
    assert!(
        !r.contains(u64::MAX, 2),
        "a range that wraps is never inside"
    );
}

#[test]
fn bounds_are_enforced() {
    let r = Region::alloc(16);
    assert!(r.write(8, &[1; 8]).is_ok());
    assert_eq!(
        r.write(9, &[1; 8]),
        Err(OutOfBounds {
            offset: 9,
            len: 8,
            region_len: 16
        })
    );
    assert!(r.write(usize::MAX, &[1]).is_err());
    let mut b = [0u8; 8];
    r.read(8, &mut b).unwrap();
    assert_eq!(b, [1; 8]);
    let mut big = [9u8; 17];
    assert!(r.read(0, &mut big).is_err());
    assert_eq!(big, [9; 17], "a refused read leaves the buffer alone");
    assert_eq!(r.load_u64(8).unwrap(), 0x0101_0101_0101_0101);
    assert!(r.load_u64(9).is_err(), "misaligned");
    assert!(r.load_u64(16).is_err(), "out of bounds");
    assert!(r.contains(r.addr() + 8, 8));
    assert!(!r.contains(r.addr() + 9, 8));
    assert!(!r.contains(r.addr() - 1, 1));
}

#[test]
fn word_store_round_trips_little_endian() {
    let r = Region::alloc(16);
    r.store_u64(8, 0x0102_0304_0506_0708).unwrap();
    let mut b = [0u8; 8];
    r.read(8, &mut b).unwrap();
    assert_eq!(b, [8, 7, 6, 5, 4, 3, 2, 1]);
    assert_eq!(r.load_u64(8).unwrap(), 0x0102_0304_0506_0708);
    assert!(r.store_u64(4, 1).is_err());
    assert!(r.store_u64(16, 1).is_err());
}

#[test]
fn slices_share_memory() {
    let r = Region::alloc(32);
    let s = r.slice(16, 16).unwrap();
    s.write(0, &[7; 4]).unwrap();
    let mut b = [0u8; 4];
    r.read(16, &mut b).unwrap();
    assert_eq!(b, [7; 4]);
    assert!(r.slice(17, 16).is_err());
}

#[test]
fn copy_from_handles_overlap_and_bounds() {
    let a = Region::alloc(16);
    a.write(0, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    a.copy_from(2, &a, 0, 6).unwrap(); // overlapping, forwards
    let mut b = [0u8; 8];
    a.read(0, &mut b).unwrap();
    assert_eq!(b, [1, 2, 1, 2, 3, 4, 5, 6]);
    let c = Region::alloc(8);
    c.copy_from(0, &a, 8, 8).unwrap();
    assert!(c.copy_from(1, &a, 0, 8).is_err(), "destination too short");
    assert!(c.copy_from(0, &a, 9, 8).is_err(), "source too short");
}

/// The atomic copies against `Vec` semantics, for every length up to a few words and every
/// alignment of source and destination (heads, whole words, tails; alike or not), and
/// overlapping moves both ways within one region.
#[test]
fn atomic_copies_move_exactly_the_bytes_asked_at_every_alignment() {
    let pattern: Vec<u8> = (0..96u8)
        .map(|i| i.wrapping_mul(37).wrapping_add(1))
        .collect();
    for len in 0..40usize {
        for so in 0..8usize {
            for d_o in 0..8usize {
                let src = Region::alloc(96);
                src.write(0, &pattern).unwrap();
                let mut got = vec![0xee; len];
                src.read(so, &mut got).unwrap();
                assert_eq!(got, pattern[so..so + len], "read len {len} at {so}");

                let dst = Region::alloc(96);
                dst.write(d_o, &pattern[so..so + len]).unwrap();
                let mut back = vec![0u8; 96];
                dst.read(0, &mut back).unwrap();
                let mut want = vec![0u8; 96];
                want[d_o..d_o + len].copy_from_slice(&pattern[so..so + len]);
                assert_eq!(back, want, "write len {len} at {d_o}");

                let dst = Region::alloc(96);
                dst.copy_from(d_o, &src, so, len).unwrap();
                dst.read(0, &mut back).unwrap();
                assert_eq!(back, want, "copy_from len {len}, {so} -> {d_o}");

                // Overlapping, within one region: a memmove.
                let one = Region::alloc(96);
                one.write(0, &pattern).unwrap();
                one.copy_from(d_o + 4, &one, so, len).unwrap();
                let mut want = pattern.clone();
                want.copy_within(so..so + len, d_o + 4);
                one.read(0, &mut back).unwrap();
                assert_eq!(back, want, "memmove len {len}, {so} -> {}", d_o + 4);
            }
        }
    }
    // Longer than the bounce chunk, misaligned and overlapping both ways.
    let big: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    for (from, to) in [(3usize, 700usize), (700, 3), (1, 2), (2, 1)] {
        let r = Region::alloc(6000);
        r.write(0, &big).unwrap();
        r.copy_from(to, &r, from, 4000).unwrap();
        let mut want = big.clone();
        want.resize(6000, 0);
        want.copy_within(from..from + 4000, to);
        let mut got = vec![0u8; 6000];
        r.read(0, &mut got).unwrap();
        assert_eq!(got, want, "memmove of 4000 bytes, {from} -> {to}");
    }
}

/// Two threads on one region through safe clones: an aligned 8-byte write is one word, so
/// a reader of the same word sees either value whole, never half of each.
#[test]
fn an_aligned_word_written_by_another_thread_is_never_seen_torn() {
    use std::sync::atomic::AtomicBool;
    let r = Region::alloc(64);
    let w = r.clone();
    let (a, b) = ([0x11u8; 8], [0x22u8; 8]);
    let (started, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (s0, s1) = (started.clone(), stop.clone());
    let writer = std::thread::spawn(move || {
        w.write(8, &a).unwrap();
        s0.store(true, Ordering::Release);
        while !s1.load(Ordering::Relaxed) {
            w.write(8, &b).unwrap();
            w.write(8, &a).unwrap();
        }
    });
    while !started.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    let whole = [u64::from_le_bytes(a), u64::from_le_bytes(b)];
    for _ in 0..100_000 {
        let mut got = [0u8; 8];
        r.read(8, &mut got).unwrap();
        assert!(got == a || got == b, "torn read {got:x?}");
        let v = r.load_u64(8).unwrap();
        assert!(whole.contains(&v), "torn word {v:#x}");
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
}

#[test]
fn append_to_extends_a_vec() {
    let r = Region::alloc(8);
    r.write(0, b"abcdefgh").unwrap();
    let mut v = b"xy".to_vec();
    r.append_to(2, 3, &mut v).unwrap();
    assert_eq!(v, b"xycde");
    assert!(r.append_to(6, 3, &mut v).is_err());
    assert_eq!(v, b"xycde", "a refused append leaves the vec alone");
}

#[test]
fn recv_into_reads_partially_and_reports_would_block() {
    let (mut a, b) = pair();
    b.set_nonblocking(true).unwrap();
    let r = Region::alloc(64);
    // Nothing sent yet: EAGAIN surfaces as WouldBlock, nothing written.
    let e = r.recv_into(0, 64, b.as_fd()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    a.write_all(b"hello").unwrap();
    // A partial read: asked for 64, 5 are there.
    let mut got = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while got < 5 && std::time::Instant::now() < deadline {
        match r.recv_into(10 + got, 64 - 10 - got, b.as_fd()) {
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => panic!("recv_into: {e}"),
        }
    }
    assert_eq!(got, 5);
    let mut v = [0u8; 5];
    r.read(10, &mut v).unwrap();
    assert_eq!(&v, b"hello");
    // Out of bounds: refused before the call.
    let e = r.recv_into(60, 8, b.as_fd()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    // The peer closes: 0.
    drop(a);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match r.recv_into(0, 8, b.as_fd()) {
            Ok(n) => break assert_eq!(n, 0),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                assert!(std::time::Instant::now() < deadline, "no EOF");
                std::thread::yield_now()
            }
            Err(e) => panic!("recv_into: {e}"),
        }
    }
}

#[test]
fn send_from_and_sendmsg_gather_in_order() {
    let (a, mut b) = pair();
    let r = Region::alloc(16);
    r.write(0, b"0123456789abcdef").unwrap();
    assert_eq!(r.send_from(4, 4, a.as_fd()).unwrap(), 4);
    let e = r.send_from(14, 4, a.as_fd()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    let pieces = [
        IoPiece::Bytes(b"<"),
        IoPiece::Region {
            region: &r,
            off: 10,
            len: 6,
        },
        IoPiece::Bytes(b""),
        IoPiece::Region {
            region: &r,
            off: 0,
            len: 0,
        },
        IoPiece::Bytes(b">"),
    ];
    assert_eq!(sendmsg(a.as_fd(), &pieces).unwrap(), 8);
    let bad = [
        IoPiece::Bytes(b"x"),
        IoPiece::Region {
            region: &r,
            off: 12,
            len: 5,
        },
    ];
    let e = sendmsg(a.as_fd(), &bad).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    drop(a);
    let mut got = Vec::new();
    b.read_to_end(&mut got).unwrap();
    assert_eq!(
        got, b"4567<abcdef>",
        "nothing of the refused gather went out"
    );
}

#[test]
fn sendmsg_reports_would_block_on_a_full_socket() {
    let (a, _b) = pair();
    a.set_nonblocking(true).unwrap();
    let r = Region::alloc(1 << 20);
    let mut total = 0usize;
    let e = loop {
        match r.send_from(0, r.len(), a.as_fd()) {
            Ok(n) => {
                total += n;
                assert!(total < 1 << 30, "the socket never filled");
            }
            Err(e) => break e,
        }
    };
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    assert!(total > 0);
}
