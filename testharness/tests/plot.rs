//! `testharness/plot.py`: a PNG from two real `verbsnet-perf --json` runs (credits on and off,
//! tcp transport), checked to be a valid PNG of the figure's size and of non-trivial content.
//!
//! Needs a python3 with matplotlib (`bash testharness/plot-setup.sh`). Without one the test
//! prints SKIP and passes, unless `VERBSNET_REQUIRE_PLOT=1` (set by testharness/run-tests.sh,
//! so CI always runs it).

use std::path::{Path, PathBuf};
use std::process::Command;

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_verbsnet-perf"))
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("plot.py")
}

fn have_matplotlib() -> bool {
    ["python3", "/usr/bin/python3"].iter().any(|py| {
        Command::new(py)
            .args(["-c", "import matplotlib"])
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// One small run through the plugin over tcp; returns its `--json` line.
fn run(credits: &str) -> String {
    let mut c = Command::new(exe());
    for (k, _) in std::env::vars() {
        if k.starts_with("VERBSNET_") || k.starts_with("NCCL_") {
            c.env_remove(k);
        }
    }
    let o = c
        .args([
            "all_reduce",
            "--ranks",
            "2",
            "-b",
            "8",
            "-e",
            "256K",
            "-f",
            "8",
            "-n",
            "3",
        ])
        .args(["-w", "1", "--transport", "tcp", "--json", "-T", "300"])
        .env("VERBSNET_CREDITS", credits)
        .env("VERBSNET_SOCKET_ADDR", "127.0.0.1")
        .output()
        .expect("run verbsnet-perf");
    assert!(
        o.status.success(),
        "verbsnet-perf failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn two_json_runs_make_one_png() {
    if !have_matplotlib() {
        assert_ne!(
            std::env::var("VERBSNET_REQUIRE_PLOT").as_deref(),
            Ok("1"),
            "no python3 with matplotlib: run `bash testharness/plot-setup.sh`"
        );
        println!("SKIP: no python3 with matplotlib (bash testharness/plot-setup.sh installs it)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("verbsnet-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let on = dir.join("credits-on.json");
    let off = dir.join("credits-off.json");
    std::fs::write(&on, run("1")).unwrap();
    std::fs::write(&off, run("0")).unwrap();
    let png = dir.join("plot.png");
    let o = Command::new("python3")
        .arg(script())
        .arg("-o")
        .arg(&png)
        .arg(&on)
        .arg(&off)
        .output()
        .expect("run plot.py");
    assert!(
        o.status.success(),
        "plot.py failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("2 run(s), 6 sizes"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let bytes = std::fs::read(&png).unwrap();
    // PNG signature, then the IHDR chunk: width and height (big-endian) of the 12 x 4.8 inch
    // figure at 110 dpi.
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&bytes[12..16], b"IHDR");
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert_eq!((w, h), (1320, 528), "unexpected figure size");
    assert_eq!(
        &bytes[bytes.len() - 8..bytes.len() - 4],
        b"IEND",
        "truncated PNG"
    );
    // Two panels with axes, four lines each, legend and title: far more than a blank canvas.
    assert!(bytes.len() > 40_000, "only {} bytes", bytes.len());

    // A file that is not a result is refused with its name.
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "not json\n").unwrap();
    let o = Command::new("python3")
        .arg(script())
        .arg("-o")
        .arg(dir.join("x.png"))
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("bad.json holds no verbsnet-perf --json result"));
    std::fs::remove_dir_all(&dir).unwrap();
}
