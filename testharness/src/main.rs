//! `verbsnet-perf <collective> [flags]`: see `--help`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use testharness::cli::Args;
use testharness::{launcher, perf};

fn main() -> ExitCode {
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
                2
            }
        },
    };
    ExitCode::from(u8::try_from(code).unwrap_or(2))
}
