//! `virtiofsd`: parse the command line, set up logging, run the daemon.

use std::process::ExitCode;

use clap::Parser;
use virtiofsd::cli::{Args, Command, CAPABILITIES};
use virtiofsd::error::Chain;
use virtiofsd::{activation, daemon, logging};

fn main() -> ExitCode {
    let args = Args::parse();
    // The command line takes the activation error as its message (`UsageError::Activation`).
    let activated = || activation::listen_fds_from_env().map_err(|e| Chain(&e).to_string());
    let settings = match args.into_command(activated) {
        Ok(Command::PrintCapabilities) => {
            print!("{CAPABILITIES}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::Run(s)) => s,
        Err(e) => {
            eprintln!("virtiofsd: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    let level = settings.log.level;
    let to_syslog = settings.log.syslog && logging::syslog_listens();
    if to_syslog {
        if let Err(e) = logging::Syslog::init(level) {
            eprintln!("virtiofsd: --syslog: {e}");
            return ExitCode::FAILURE;
        }
    } else {
        logging::init_stderr(level);
        if settings.log.syslog {
            log::warn!("--syslog: no syslog daemon listens on /dev/log; logging to stderr");
        }
    }
    // Warnings about the command line: on stderr as a plain line, and to syslog too with
    // --syslog; both only when the log level (--log-level, refined by RUST_LOG) lets warnings
    // through: --log-level=off or RUST_LOG=error silences them like any other warning.
    if log::log_enabled!(target: "virtiofsd", log::Level::Warn) {
        for w in &settings.warnings {
            eprintln!("virtiofsd: {w}");
            if to_syslog {
                log::warn!("{w}");
            }
        }
    }
    match daemon::run(settings.daemon, &settings.process) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{}", Chain(&e));
            if to_syslog {
                // Whoever started the daemon at a terminal or in a script sees why it stopped.
                eprintln!("virtiofsd: {}", Chain(&e));
            }
            ExitCode::FAILURE
        }
    }
}
