//! `--ranks N`: run N ranks of this program on 127.0.0.1.
//!
//! Each child gets the same arguments minus `--ranks`, plus `--rank r --nranks N --master
//! 127.0.0.1:<free port>`. Rank 0's stdout and stderr pass straight through (it prints the
//! table); the other ranks' output is kept and shown only if that rank fails. When a rank fails,
//! the others get a grace period to exit on their own, then are killed.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cli::Args;

/// After one rank fails, how long the others may take to notice before they are killed.
const GRACE: Duration = Duration::from_secs(10);

/// Exit code when ranks had to be killed (timeout).
const EXIT_TIMEOUT: i32 = 124;

/// The arguments for the children: everything but `--ranks N` / `--ranks=N`.
pub fn child_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut skip_next = false;
    for a in args {
        if skip_next {
            skip_next = false;
            continue;
        }
        if a == "--ranks" {
            skip_next = true;
            continue;
        }
        if a.to_str().is_some_and(|s| s.starts_with("--ranks=")) {
            continue;
        }
        out.push(a);
    }
    out
}

struct Rank {
    child: Child,
    status: Option<ExitStatus>,
    killed: bool,
    output: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
}

/// Keeps everything `from` produces in `into`; with `echo`, also copies it to our stderr.
fn collect(
    mut from: impl Read + Send + 'static,
    into: Arc<Mutex<Vec<u8>>>,
    echo: bool,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        if echo {
            let mut r = BufReader::new(from);
            let mut line = Vec::new();
            while r.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
                let _ = io::stderr().write_all(&line);
                line.clear();
            }
        } else {
            let mut buf = [0u8; 8192];
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut o) = into.lock() {
                    o.extend_from_slice(&buf[..n]);
                }
            }
        }
    })
}

fn describe(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => "unknown status".into(),
    }
}

/// Spawns `n` ranks, waits for them, reports failures; returns the exit code.
pub fn run_local(args: &Args, n: usize) -> i32 {
    match launch(args, n) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("verbsnet-perf: launching {n} local ranks failed: {e}");
            2
        }
    }
}

fn launch(args: &Args, n: usize) -> io::Result<i32> {
    let exe = std::env::current_exe()?;
    // The rendezvous listener is bound here and inherited by rank 0 (no window in which
    // another process, e.g. a plugin listening on an ephemeral port, can take the port).
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let master = format!("127.0.0.1:{port}");
    let base = child_args(std::env::args_os().skip(1));
    let mut ranks: Vec<Rank> = Vec::with_capacity(n);
    for r in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(&base)
            .arg("--rank")
            .arg(r.to_string())
            .arg("--nranks")
            .arg(n.to_string())
            .arg("--master")
            .arg(&master)
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(t) = args.transport {
            cmd.env("VERBSNET_TRANSPORT", t.env_value());
        }
        // Local ranks talk over loopback unless told otherwise.
        if std::env::var_os("VERBSNET_SOCKET_ADDR").is_none()
            && std::env::var_os("VERBSNET_SOCKET_IFNAME").is_none()
        {
            cmd.env("VERBSNET_SOCKET_ADDR", "127.0.0.1");
        }
        cmd.stdout(if r == 0 {
            Stdio::inherit()
        } else {
            Stdio::piped()
        });
        if r == 0 {
            use std::os::fd::AsRawFd;
            cmd.env(
                crate::bootstrap::LISTEN_FD_ENV,
                listener.as_raw_fd().to_string(),
            );
            crate::fdpass::set_cloexec(&listener, false)?;
        }
        let spawned = cmd.spawn();
        if r == 0 {
            crate::fdpass::set_cloexec(&listener, true)?;
        }
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                for rk in &mut ranks {
                    let _ = rk.child.kill();
                    let _ = rk.child.wait();
                }
                return Err(io::Error::new(e.kind(), format!("spawn rank {r}: {e}")));
            }
        };
        let output = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        if let Some(err) = child.stderr.take() {
            readers.push(collect(err, output.clone(), r == 0));
        }
        if let Some(out) = child.stdout.take() {
            readers.push(collect(out, output.clone(), false));
        }
        ranks.push(Rank {
            child,
            status: None,
            killed: false,
            output,
            readers,
        });
    }

    let start = Instant::now();
    let timeout = (args.timeout > 0).then(|| Duration::from_secs(args.timeout));
    let mut first_failure: Option<(usize, Instant)> = None;
    let mut timed_out = false;
    loop {
        for (r, rk) in ranks.iter_mut().enumerate() {
            if rk.status.is_none() {
                if let Some(st) = rk.child.try_wait()? {
                    if !st.success() && first_failure.is_none() {
                        first_failure = Some((r, Instant::now()));
                    }
                    rk.status = Some(st);
                }
            }
        }
        if ranks.iter().all(|rk| rk.status.is_some()) {
            break;
        }
        let grace_over = first_failure.is_some_and(|(_, t)| t.elapsed() > GRACE);
        let too_long = timeout.is_some_and(|t| start.elapsed() > t);
        if grace_over || too_long {
            timed_out |= too_long;
            for rk in ranks.iter_mut().filter(|rk| rk.status.is_none()) {
                let _ = rk.child.kill();
                rk.killed = true;
                rk.status = rk.child.wait().ok();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for rk in &mut ranks {
        for h in rk.readers.drain(..) {
            let _ = h.join();
        }
    }

    if timed_out {
        eprintln!(
            "verbsnet-perf: timed out after {} s (-T); killed the ranks still running",
            args.timeout
        );
    }
    let mut code = 0;
    for (r, rk) in ranks.iter().enumerate() {
        let Some(st) = rk.status else { continue };
        if st.success() {
            continue;
        }
        let why = if rk.killed {
            match first_failure {
                Some((f, _)) if !timed_out => format!("killed {GRACE:?} after rank {f} failed"),
                _ => "killed".into(),
            }
        } else {
            describe(&st)
        };
        eprintln!("verbsnet-perf: rank {r} failed ({why})");
        if r != 0 {
            let out = rk.output.lock().map(|o| o.clone()).unwrap_or_default();
            if out.is_empty() {
                eprintln!("  (rank {r} wrote nothing to stderr)");
            } else {
                eprintln!("----- rank {r} stderr -----");
                let _ = io::stderr().write_all(&out);
                if !out.ends_with(b"\n") {
                    eprintln!();
                }
                eprintln!("----- end of rank {r} stderr -----");
            }
        }
        if code == 0 || r == 0 {
            code = st.code().unwrap_or(2);
            if rk.killed {
                code = if timed_out { EXIT_TIMEOUT } else { 2 };
            }
        }
    }
    if code == 0 && ranks.iter().any(|rk| rk.status.is_none()) {
        code = 2;
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn children_lose_only_the_ranks_flag() {
        assert_eq!(
            child_args(os(&["all_reduce", "--ranks", "4", "-b", "8", "--json"])),
            os(&["all_reduce", "-b", "8", "--json"])
        );
        assert_eq!(
            child_args(os(&["--ranks=3", "sendrecv", "-n", "2"])),
            os(&["sendrecv", "-n", "2"])
        );
        // --rank (singular) style values are left alone.
        assert_eq!(child_args(os(&["x", "-T", "5"])), os(&["x", "-T", "5"]));
    }
}
