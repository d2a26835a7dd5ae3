//! `virtiofsd`: parse the command line, set up logging, run the daemon.

use std::process::ExitCode;

use clap::Parser;
use virtiofsd::cli::{log_level, Args};
use virtiofsd::daemon::{self, DaemonConfig};

fn main() -> ExitCode {
    let args = Args::parse();
    let parsed = log_level(&args.log_level)
        .and_then(|level| DaemonConfig::try_from(args).map(|config| (level, config)));
    let (level, config) = match parsed {
        Ok(p) => p,
        Err(e) => {
            eprintln!("virtiofsd: {e}");
            return ExitCode::from(2);
        }
    };
    env_logger::Builder::new()
        .filter_level(level)
        .parse_env("RUST_LOG")
        .format_timestamp_millis()
        .init();
    match daemon::run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{e}");
            ExitCode::FAILURE
        }
    }
}
