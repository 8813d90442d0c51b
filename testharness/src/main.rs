//! `verbsnet-perf <collective> [flags]`: see `--help`; `verbsnet-perf doctor [flags]`: the
//! preflight, see `verbsnet-perf doctor --help`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use testharness::cli::Args;
use testharness::{launcher, perf};

fn main() -> ExitCode {
    // `verbsnet-perf doctor ...`: the preflight (testharness/src/doctor/).
    if std::env::args().nth(1).as_deref() == Some("doctor") {
        let code = testharness::doctor::main(std::env::args().skip(1));
        return ExitCode::from(u8::try_from(code).unwrap_or(2));
    }
    let args = Args::parse();
    if let Err(e) = args.validate() {
        eprintln!("verbsnet-perf: {e}");
        return ExitCode::from(2);
    }
    let code = match args.ranks {
        Some(n) => launcher::run_local(&args, n),
        None => match perf::run(&args) {
            Ok(code) => code,
            Err(e) => {
                let who = args.rank.map(|r| format!("rank {r}: ")).unwrap_or_default();
                eprintln!("verbsnet-perf: {who}error: {e}");
                if let Some(w) = testharness::plugin::logger::unshown_last_warning() {
                    eprintln!("verbsnet-perf: {who}the plugin's last WARN: {w}");
                }
                2
            }
        },
    };
    ExitCode::from(u8::try_from(code).unwrap_or(2))
}
