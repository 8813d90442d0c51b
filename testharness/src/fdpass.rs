//! Handing the bootstrap's listening socket from the launcher to rank 0 (`verbsnet-perf
//! --ranks N`): the launcher binds it and lets exactly rank 0 inherit it, so no other process
//! (a plugin listening on an ephemeral port, another test's launcher) can take the port between
//! its choice and rank 0's listen. The only `unsafe` of the harness outside the plugin loader:
//! two libc calls on descriptors and taking ownership of the inherited one.
#![allow(unsafe_code)]

use std::io;
use std::net::TcpListener;

/// Sets or clears `FD_CLOEXEC` on the rendezvous listener, so that exactly rank 0 inherits it.
pub fn set_cloexec(l: &TcpListener, on: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let flags = if on { libc::FD_CLOEXEC } else { 0 };
    // SAFETY: fcntl(F_SETFD) on a descriptor this process owns (the listener lives for the
    // whole call); it changes only that descriptor's close-on-exec flag.
    if unsafe { libc::fcntl(l.as_raw_fd(), libc::F_SETFD, flags) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The listener the launcher passed, if the variable `env` names a listening socket bound to
/// `port`; taken at most once per process.
pub fn inherited_listener(env: &str, port: u16) -> Option<TcpListener> {
    use std::os::fd::{FromRawFd, IntoRawFd};
    use std::sync::atomic::{AtomicBool, Ordering};
    static TAKEN: AtomicBool = AtomicBool::new(false);
    let fd: i32 = std::env::var(env).ok()?.trim().parse().ok()?;
    if fd < 0 || TAKEN.load(Ordering::SeqCst) {
        return None;
    }
    let mut kind: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `kind`, a live c_int; on a descriptor
    // that is not a socket (or not open) it fails and nothing is taken.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut kind as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 || kind == 0 {
        return None;
    }
    // SAFETY: `fd` is an open listening socket (checked above) that the launcher left open for
    // this process alone, and TAKEN makes this the only owner it ever gets here.
    let l = unsafe { TcpListener::from_raw_fd(fd) };
    let ours = l.local_addr().is_ok_and(|a| a.port() == port);
    if ours && !TAKEN.swap(true, Ordering::SeqCst) {
        Some(l)
    } else {
        // Not ours to close.
        let _ = l.into_raw_fd();
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn the_listener_is_taken_once_and_only_for_its_port() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let var = "VNPERF_TEST_LISTEN_FD";
        std::env::set_var(var, l.as_raw_fd().to_string());
        // Another port: not taken, and the descriptor stays open.
        assert!(inherited_listener(var, port.wrapping_add(1)).is_none());
        assert_eq!(l.local_addr().unwrap().port(), port);
        // A descriptor that is not a listening socket is never taken.
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        std::env::set_var(var, s.as_raw_fd().to_string());
        assert!(inherited_listener(var, port).is_none());
        // The right one, once: the duplicate keeps the original usable after the take.
        let dup = l.try_clone().unwrap();
        std::env::set_var(var, dup.as_raw_fd().to_string());
        let dup_fd = dup.as_raw_fd();
        std::mem::forget(dup); // ownership moves to inherited_listener
        let got = inherited_listener(var, port).expect("taken");
        assert_eq!(got.as_raw_fd(), dup_fd);
        assert!(inherited_listener(var, port).is_none(), "only once");
        set_cloexec(&got, false).unwrap();
        set_cloexec(&got, true).unwrap();
    }
}
