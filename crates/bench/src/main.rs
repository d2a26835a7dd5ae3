//! `virtiofsd-bench`: compares the throughput and CPU cost of this virtio-fs daemon with the
//! reference `virtiofsd` on the same workloads, driving both through the in-process test
//! frontend ([`virtiofsd_frontend`]), which plays QEMU and the guest kernel.
//!
//! For each round and each daemon in turn (ours, reference, ours, reference, ...) the daemon is
//! spawned on a fresh socket, the frontend connects (one request queue) and sends FUSE_INIT,
//! every selected workload runs (see `workloads.rs`) while the daemon's CPU time is read from
//! `/proc/PID/stat` before and after, then the frontend disconnects and the daemon must exit.
//! The report gives, per workload, the median over rounds of ops/s and of daemon CPU seconds,
//! and the ratios ours/reference.
//!
//! ```text
//! virtiofsd-bench --ours target/release/virtiofsd \
//!     --reference /opt/ref-virtiofsd/bin/virtiofsd \
//!     --tree /var/tmp/virtiofsd-bench-tree --rounds 3 --markdown
//! ```
//!
//! Both daemons run as the same user with the same `--cache` and, unless
//! `--reference-defaults`, both with `--sandbox=none --seccomp=none`.
//! `tests/bench/run.sh` builds and installs everything and runs the full comparison.

mod daemon;
mod hold;
mod latency;
mod report;
mod tree;
mod workloads;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use virtiofsd_frontend::{FrontendConfig, FsFrontend};

use daemon::{DaemonSpec, Running, Strace};
use report::{Machine, Results};
use virtiofs_fuse::abi;
use workloads::{fuse, Session, Settings, Workload};

/// Benchmark this virtio-fs daemon against the reference virtiofsd.
#[derive(Debug, Parser)]
#[command(name = "virtiofsd-bench", version, about)]
struct Args {
    /// Our daemon's executable
    #[arg(long, value_name = "PATH", default_value = "target/release/virtiofsd")]
    ours: PathBuf,

    /// The reference virtiofsd's executable (without it only ours is measured)
    #[arg(long, value_name = "PATH")]
    reference: Option<PathBuf>,

    /// Directory tree to serve; generated if missing or empty (30,000 small files in 1,000
    /// directories and a 256 MiB file)
    #[arg(long, value_name = "DIR")]
    tree: PathBuf,

    /// Rounds; each runs every workload on each daemon
    #[arg(long, value_name = "N", default_value_t = 3)]
    rounds: usize,

    /// Cache policy passed to both daemons: auto, always, never or metadata
    #[arg(long, value_name = "MODE", default_value = "auto")]
    cache: String,

    /// Comma-separated workloads, or "all": walk-readdirplus, walk-readdir-lookup, getattr,
    /// open-read-close, seq-read-1m, create-unlink, read-twice
    #[arg(long, value_name = "LIST", default_value = "all")]
    workloads: String,

    /// Print the result as a markdown table
    #[arg(long)]
    markdown: bool,

    /// READs in flight in seq-read-1m
    #[arg(long, value_name = "N", default_value_t = 1)]
    seq_depth: usize,

    /// Passes over the 256 MiB file in seq-read-1m
    #[arg(long, value_name = "N", default_value_t = 8)]
    seq_passes: u64,

    /// Forget what a walk looked up whenever it holds this many references (at directory
    /// boundaries) instead of at the end, for daemons that keep a descriptor per node under a
    /// low RLIMIT_NOFILE. 0: hold everything until the end, as a guest without memory pressure
    #[arg(long, value_name = "N", default_value_t = 0)]
    max_held: usize,

    /// Files created and unlinked by create-unlink
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    create_files: usize,

    /// Descriptors per virtqueue
    #[arg(long, value_name = "N", default_value_t = 1024)]
    queue_size: u16,

    /// Seconds to wait for any single reply before declaring the daemon hung
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    reply_timeout: u64,

    /// Run both daemons with their default sandbox and seccomp policy instead of
    /// --sandbox=none --seccomp=none
    #[arg(long)]
    reference_defaults: bool,

    /// Extra flag for our daemon (repeatable), e.g. --ours-arg=--thread-pool-size=2
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    ours_arg: Vec<OsString>,

    /// Extra flag for the reference (repeatable)
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    reference_arg: Vec<OsString>,

    /// RLIMIT_NOFILE the daemons inherit (the reference raises its own to this; a walk holds
    /// one reference per node, 31,000 in all). 0 leaves the limit as it is
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    nofile: u64,

    /// Attach `strace -c -f` to the daemon during each workload and write the syscall summaries
    /// here (timings are then meaningless)
    #[arg(long, value_name = "DIR")]
    strace_dir: Option<PathBuf>,

    /// Instead of the workloads: round-trip latency, N requests of each kind one at a time
    /// (p50, p99, daemon CPU per request) beside the floor, the same system calls made
    /// directly by one thread
    #[arg(long, value_name = "N")]
    latency: Option<usize>,

    /// Instead of the workloads: memory per node. The guest walks a tree of N files with
    /// READDIRPLUS holding every node, then forgets them all (anonymous memory idle, holding
    /// and after FORGET, bytes per node, descriptors, walk time). Use with --cache always
    #[arg(long, value_name = "N")]
    hold: Option<usize>,

    /// Instead of the workloads: a trickle, one GETATTR of the root every USEC microseconds
    /// (a sleep between a reply and the next request; 0: none) for --trickle-secs; the daemon's
    /// CPU time over it, per request and as a share of one core, and the guest's kicks per
    /// request (what polling costs a guest that sends little, and what it saves a busy one)
    #[arg(long, value_name = "USEC")]
    trickle: Option<u64>,

    /// How long --trickle sends, in seconds
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    trickle_secs: u64,

    /// The tree of --hold (generated if missing or empty; default: the --tree path with
    /// ".hold-N" appended)
    #[arg(long, value_name = "DIR")]
    hold_tree: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("virtiofsd-bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Raises this process's RLIMIT_NOFILE (inherited by the daemons) to `n`, capped by
/// `fs.nr_open`; without the privilege to raise the hard limit, raises the soft limit to the
/// hard one. Returns the limit in force.
fn raise_nofile(n: u64) -> Result<u64, String> {
    let nr_open = fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(n);
    let n = n.min(nr_open);
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `cur` is a valid, writable rlimit for the duration of the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut cur) } != 0 {
        return Err(format!(
            "getrlimit(RLIMIT_NOFILE): {}",
            std::io::Error::last_os_error()
        ));
    }
    for lim in [
        libc::rlimit {
            rlim_cur: n,
            rlim_max: n.max(cur.rlim_max),
        },
        libc::rlimit {
            rlim_cur: n.min(cur.rlim_max),
            rlim_max: cur.rlim_max,
        },
    ] {
        // SAFETY: `lim` is a valid rlimit for the duration of the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } == 0 {
            return Ok(lim.rlim_cur);
        }
    }
    Err(format!(
        "--nofile {n}: setrlimit(RLIMIT_NOFILE): {} (pass --nofile 0 to leave the limit alone)",
        std::io::Error::last_os_error()
    ))
}

fn run(args: &Args) -> Result<(), String> {
    let selected = Workload::parse_list(&args.workloads)?;
    if args.rounds == 0 {
        return Err("--rounds: must be at least 1".into());
    }
    if !matches!(
        args.cache.as_str(),
        "auto" | "always" | "never" | "metadata"
    ) {
        return Err(format!(
            "--cache: invalid mode '{}'; expected auto, always, never or metadata",
            args.cache
        ));
    }
    if args.seq_depth == 0 {
        return Err("--seq-depth: must be at least 1".into());
    }
    // Both daemons unconfined unless --reference-defaults, so that they do the same work;
    // an --ours-arg=--sandbox=... given later wins.
    let mut ours_extra: Vec<OsString> = Vec::new();
    if !args.reference_defaults {
        ours_extra.push("--sandbox=none".into());
        ours_extra.push("--seccomp=none".into());
    }
    ours_extra.extend(args.ours_arg.iter().cloned());
    let mut specs = vec![DaemonSpec {
        label: "ours",
        path: absolute(&args.ours)?,
        extra_args: ours_extra,
    }];
    if let Some(r) = &args.reference {
        let mut extra: Vec<OsString> = Vec::new();
        if !args.reference_defaults {
            extra.push("--sandbox=none".into());
            extra.push("--seccomp=none".into());
        }
        extra.extend(args.reference_arg.iter().cloned());
        specs.push(DaemonSpec {
            label: "reference",
            path: absolute(r)?,
            extra_args: extra,
        });
    }
    for s in &specs {
        if !s.path.is_file() {
            return Err(format!(
                "--{}: {} is not a file",
                if s.label == "ours" {
                    "ours"
                } else {
                    "reference"
                },
                s.path.display()
            ));
        }
    }
    let nofile = if args.nofile > 0 {
        Some(raise_nofile(args.nofile)?)
    } else {
        None
    };
    if let Some(d) = &args.strace_dir {
        fs::create_dir_all(d).map_err(|e| format!("--strace-dir {}: {e}", d.display()))?;
    }

    if let Some(n) = args.hold {
        return run_hold(args, &specs, n.max(1));
    }
    if let Some(us) = args.trickle {
        return run_trickle(args, &specs, Duration::from_micros(us));
    }

    // The tree, and warm host caches.
    eprintln!("tree: {}", args.tree.display());
    if tree::ensure(&args.tree)? {
        eprintln!("  generated");
    }
    let tree_dir = absolute(&args.tree)?;
    let stale = tree::remove_scratch(&tree_dir)?;
    if stale > 0 {
        eprintln!("  removed {stale} scratch directories of an interrupted run");
    }
    let stats = tree::warm(&tree_dir)?;
    eprintln!(
        "  warmed: {} entries ({} directories, {} files, {} MiB read)",
        stats.entries,
        stats.dirs,
        stats.files,
        stats.bytes >> 20
    );

    // The small files, the big file and the marker.
    let expected_files = tree::SMALL_FILES as u64 + 2;
    if stats.files != expected_files {
        return Err(format!(
            "--tree {}: holds {} files, a benchmark tree has {expected_files}; was it modified?",
            tree_dir.display(),
            stats.files
        ));
    }
    let settings = Settings {
        seq_depth: args.seq_depth.max(1),
        create_files: args.create_files,
        seq_passes: args.seq_passes.max(1),
        max_held: args.max_held,
        tree: stats,
    };
    let run_dir = std::env::temp_dir().join(format!("virtiofsd-bench.{}", std::process::id()));
    fs::create_dir_all(&run_dir).map_err(|e| format!("create {}: {e}", run_dir.display()))?;

    let machine = Machine::probe();
    eprintln!("machine: {}", machine.summary());
    if let Some(n) = args.latency {
        let out = run_latency(args, &specs, &tree_dir, &run_dir, n.max(10));
        let _ = fs::remove_dir_all(&run_dir);
        let table = out?;
        println!("# Round-trip latency, one request in flight");
        println!();
        println!("Machine: {}", machine.summary());
        println!();
        for s in &specs {
            println!("- {}: `{}`", s.label, s.command_line(&args.cache));
        }
        println!();
        print!("{table}");
        return Ok(());
    }
    let mut results = Results::new(&selected, &specs);
    let outcome = (|| {
        for round in 1..=args.rounds {
            for spec in &specs {
                run_daemon(
                    args,
                    spec,
                    round,
                    &tree_dir,
                    &run_dir,
                    &selected,
                    &settings,
                    &mut results,
                )?;
            }
        }
        Ok::<(), String>(())
    })();
    match outcome {
        Ok(()) => {
            let _ = fs::remove_dir_all(&run_dir);
        }
        Err(e) => {
            return Err(format!(
                "{e}\n(daemon logs are kept in {})",
                run_dir.display()
            ))
        }
    }

    let header = report::Header {
        machine,
        specs: specs.iter().map(|s| s.command_line(&args.cache)).collect(),
        tree: tree_dir.display().to_string(),
        stats,
        rounds: args.rounds,
        cache: args.cache.clone(),
        queue_size: args.queue_size,
        seq_depth: settings.seq_depth,
        create_files: settings.create_files,
        seq_passes: settings.seq_passes,
        max_held: settings.max_held,
        nofile,
        straced: args.strace_dir.is_some(),
    };
    if args.markdown {
        print!("{}", results.markdown(&header));
    } else {
        print!("{}", results.text(&header));
    }
    Ok(())
}

/// The `--latency` comparison: every round, each daemon in turn, then the floor; the table.
fn run_latency(
    args: &Args,
    specs: &[DaemonSpec],
    tree_dir: &Path,
    run_dir: &Path,
    n: usize,
) -> Result<String, String> {
    let kinds = latency::KINDS.len();
    // Per column (each daemon, then the floor), per kind: every round's samples.
    let mut cols: Vec<Vec<latency::Sample>> =
        vec![vec![Default::default(); kinds]; specs.len() + 1];
    let merge = |col: &mut Vec<latency::Sample>, got: Vec<latency::Sample>| {
        for (acc, s) in col.iter_mut().zip(got) {
            acc.times.extend(s.times);
            acc.cpu += s.cpu;
        }
    };
    for round in 1..=args.rounds {
        for (i, spec) in specs.iter().enumerate() {
            let got = one_session(args, spec, round, tree_dir, run_dir, |s, d| {
                latency::measure(s, d, n)
            })?;
            eprintln!("round {round}/{} {}: done", args.rounds, spec.label);
            merge(&mut cols[i], got);
        }
        let got = latency::floor(tree_dir, n)?;
        merge(&mut cols[specs.len()], got);
    }
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mut names: Vec<&str> = specs.iter().map(|s| s.label).collect();
    names.push("floor");
    let mut t = String::from("| request |");
    for name in &names {
        t.push_str(&format!(" {name} p50 µs | {name} p99 µs |"));
    }
    for name in &names {
        t.push_str(&format!(" {name} CPU µs/req |"));
    }
    if specs.len() > 1 {
        t.push_str(" p50 ours/ref |");
    }
    t.push_str("\n|---|");
    for _ in 0..names.len() * 3 + usize::from(specs.len() > 1) {
        t.push_str("---:|");
    }
    t.push('\n');
    for (k, kind) in latency::KINDS.iter().enumerate() {
        t.push_str(&format!("| {kind} |"));
        let mut p50s = Vec::new();
        for col in cols.iter_mut() {
            let s = &mut col[k];
            let p50 = latency::quantile(&mut s.times, 0.5);
            let p99 = latency::quantile(&mut s.times, 0.99);
            p50s.push(p50);
            t.push_str(&format!(" {:.1} | {:.1} |", us(p50), us(p99)));
        }
        for col in cols.iter() {
            let s = &col[k];
            let per = s.cpu.as_secs_f64() * 1e6 / s.times.len().max(1) as f64;
            t.push_str(&format!(" {per:.1} |"));
        }
        if specs.len() > 1 {
            let r = p50s[0].as_secs_f64() / p50s[1].as_secs_f64().max(1e-9);
            t.push_str(&format!(" {r:.2} |"));
        }
        t.push('\n');
    }
    t.push_str(&format!(
        "\n{} requests of each kind per round, {} rounds, --cache={}; the floor is the same \
         system calls made by one thread of the benchmark.\n",
        n, args.rounds, args.cache
    ));
    Ok(t)
}

/// One daemon's turn in one round of `--latency` or `--hold`: spawn it on `tree`, connect,
/// INIT, run `f`, disconnect, and wait for it to exit.
fn one_session<T>(
    args: &Args,
    spec: &DaemonSpec,
    round: usize,
    tree: &Path,
    run_dir: &Path,
    f: impl FnOnce(&mut Session, &Running) -> Result<T, String>,
) -> Result<T, String> {
    let socket = run_dir.join(format!("{}-{round}.sock", spec.label));
    let log = run_dir.join(format!("{}-{round}.log", spec.label));
    let mut d = Running::spawn(spec, &socket, tree, &args.cache, &log)?;
    d.wait_for_socket(&socket, Duration::from_secs(10))?;
    let config = FrontendConfig {
        queue_size: args.queue_size,
        timeout: Duration::from_secs(args.reply_timeout.max(1)),
        connect_timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let fe = FsFrontend::connect_with(&socket, 1, &config)
        .map_err(|e| format!("{}: vhost-user setup failed: {e}", spec.label))?;
    let mut session = Session::new(fe).map_err(|e| format!("{}: {e}", spec.label))?;
    let got = f(&mut session, &d).map_err(|e| {
        let alive = d.check_alive().err().unwrap_or_default();
        format!("{} round {round}: {e}\n{alive}", spec.label)
    })?;
    session.fe.disconnect();
    drop(session);
    d.wait_exit(Duration::from_secs(30))?;
    Ok(got)
}

/// The `--trickle` measure: every round, each daemon in turn serves one GETATTR every `gap`
/// for `--trickle-secs`; its CPU time over that, per request and as a share of a core.
fn run_trickle(args: &Args, specs: &[DaemonSpec], gap: Duration) -> Result<(), String> {
    let run_dir = std::env::temp_dir().join(format!("virtiofsd-bench.{}", std::process::id()));
    fs::create_dir_all(&run_dir).map_err(|e| format!("create {}: {e}", run_dir.display()))?;
    // Nothing of the tree is read: an empty directory is served.
    let share = run_dir.join("trickle-share");
    fs::create_dir_all(&share).map_err(|e| format!("create {}: {e}", share.display()))?;
    let length = Duration::from_secs(args.trickle_secs.max(1));
    println!(
        "| daemon | round | requests | seconds | daemon CPU ms | CPU µs/request | share of a \
         core | kicks/request |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for round in 1..=args.rounds {
        for spec in specs {
            let (n, wall, cpu, kicks) =
                one_session(args, spec, round, &share, &run_dir, |s, d| {
                    let before = d.cpu_time()?;
                    let kicks_before = s.c.queue().stats().kicks;
                    let start = std::time::Instant::now();
                    let mut n = 0u32;
                    while start.elapsed() < length {
                        if !gap.is_zero() {
                            std::thread::sleep(gap);
                        }
                        fuse(s.c.try_getattr(abi::ROOT_ID, None), || "GETATTR".into())?;
                        n += 1;
                    }
                    let cpu = d.cpu_time()?.since(before).total();
                    let kicks = s.c.queue().stats().kicks - kicks_before;
                    Ok((n, start.elapsed(), cpu, kicks))
                })?;
            println!(
                "| {} | {round} | {n} | {:.2} | {:.1} | {:.1} | {:.1}% | {:.2} |",
                spec.label,
                wall.as_secs_f64(),
                cpu.as_secs_f64() * 1e3,
                cpu.as_secs_f64() * 1e6 / f64::from(n.max(1)),
                cpu.as_secs_f64() * 100.0 / wall.as_secs_f64(),
                kicks as f64 / f64::from(n.max(1))
            );
        }
    }
    let _ = fs::remove_dir_all(&run_dir);
    Ok(())
}

/// The `--hold` comparison: every round, each daemon walks the hold tree holding every node.
fn run_hold(args: &Args, specs: &[DaemonSpec], n: usize) -> Result<(), String> {
    let dir = match &args.hold_tree {
        Some(d) => absolute(d)?,
        None => {
            let mut p = absolute(&args.tree)?.into_os_string();
            p.push(format!(".hold-{n}"));
            PathBuf::from(p)
        }
    };
    eprintln!("hold tree: {}", dir.display());
    if hold::ensure(&dir, n)? {
        eprintln!("  generated");
    }
    // Entries below the root: the files, their directories and the marker.
    let expected = (n + n.div_ceil(hold::PER_DIR) + 1) as u64;
    // Warm the host's dentry and inode caches alike for every daemon.
    let mut seen = 1u64;
    for d in fs::read_dir(&dir).map_err(|e| e.to_string())?.flatten() {
        if d.path().is_dir() {
            seen += 1 + fs::read_dir(d.path()).map_err(|e| e.to_string())?.count() as u64;
            for f in fs::read_dir(d.path()).map_err(|e| e.to_string())?.flatten() {
                let _ = f.metadata();
            }
        }
    }
    if seen != expected {
        return Err(format!(
            "--hold-tree {}: {seen} entries, expected {expected}",
            dir.display()
        ));
    }
    let run_dir = std::env::temp_dir().join(format!("virtiofsd-bench.{}", std::process::id()));
    fs::create_dir_all(&run_dir).map_err(|e| format!("create {}: {e}", run_dir.display()))?;
    let machine = Machine::probe();
    eprintln!("machine: {}", machine.summary());
    let mut rows: Vec<(String, hold::Held)> = Vec::new();
    for round in 1..=args.rounds {
        for spec in specs {
            let got = one_session(args, spec, round, &dir, &run_dir, |s, d| {
                hold::measure(s, d, expected)
            })?;
            eprintln!(
                "round {round}/{} {}: {:.0} B/node",
                args.rounds,
                spec.label,
                got.bytes_per_node()
            );
            rows.push((spec.label.to_string(), got));
        }
    }
    let _ = fs::remove_dir_all(&run_dir);
    println!("# Memory per node: {n} files held");
    println!();
    println!("Machine: {}", machine.summary());
    println!();
    for s in specs {
        println!("- {}: `{}`", s.label, s.command_line(&args.cache));
    }
    println!();
    println!(
        "| daemon | nodes | RssAnon idle KiB | holding MiB | B/node | after FORGET KiB | \
         above idle | fds idle | fds holding | slab growth MiB | walk s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mib = |k: u64| k as f64 / 1024.0;
    for (label, h) in &rows {
        println!(
            "| {label} | {} | {} | {:.1} | {:.0} | {} | {:+.0}% | {} | {} | {:.1} | {:.2} |",
            h.nodes,
            h.idle_kib,
            mib(h.holding_kib),
            h.bytes_per_node(),
            h.after_forget_kib,
            (h.after_forget_kib as f64 - h.idle_kib as f64) * 100.0 / h.idle_kib.max(1) as f64,
            h.fds_idle,
            h.fds_holding,
            h.slab_kib as f64 / 1024.0,
            h.walk.as_secs_f64()
        );
    }
    Ok(())
}

fn absolute(p: &Path) -> Result<PathBuf, String> {
    std::path::absolute(p).map_err(|e| format!("{}: {e}", p.display()))
}

/// One daemon's turn in one round: spawn, connect, INIT, workloads, disconnect, exit.
#[allow(clippy::too_many_arguments)]
fn run_daemon(
    args: &Args,
    spec: &DaemonSpec,
    round: usize,
    tree_dir: &Path,
    run_dir: &Path,
    selected: &[Workload],
    settings: &Settings,
    results: &mut Results,
) -> Result<(), String> {
    let socket = run_dir.join(format!("{}-{round}.sock", spec.label));
    let log = run_dir.join(format!("{}-{round}.log", spec.label));
    let mut d = Running::spawn(spec, &socket, tree_dir, &args.cache, &log)?;
    d.wait_for_socket(&socket, Duration::from_secs(10))?;
    eprintln!(
        "round {round}/{} {}: pid {}",
        args.rounds,
        spec.label,
        d.pid()
    );

    // Room for `seq_depth` 1 MiB replies in flight, plus the small requests.
    let arena =
        (settings.seq_depth * ((workloads::SEQ_READ as usize) + 4096) + (1 << 20)).max(4 << 20);
    let config = FrontendConfig {
        queue_size: args.queue_size,
        client_arena_size: arena,
        hiprio_arena_size: 256 << 10,
        mem_size: arena + (16 << 20),
        timeout: Duration::from_secs(args.reply_timeout.max(1)),
        connect_timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let fe = FsFrontend::connect_with(&socket, 1, &config).map_err(|e| {
        let hint = if args.queue_size > 256 {
            " (try --queue-size 256)"
        } else {
            ""
        };
        format!(
            "{}: vhost-user setup failed: {e}{hint}\n{}",
            spec.label,
            d.log_tail()
        )
    })?;
    let mut session = Session::new(fe).map_err(|e| {
        let alive = d.check_alive().err().unwrap_or_default();
        format!("{}: {e}\n{alive}", spec.label)
    })?;

    for &w in selected {
        let fds_before = d.fd_count();
        let strace = match &args.strace_dir {
            Some(dir) => {
                let out = dir.join(format!("{}-round{round}-{}.txt", spec.label, w.name()));
                Some(Strace::attach(&d, &out)?)
            }
            None => None,
        };
        let m = workloads::run(w, &mut session, &d, settings).map_err(|e| {
            let alive = d.check_alive().err().unwrap_or_default();
            let hint = if e.contains("errno 24") && args.max_held == 0 {
                "\n(the daemon ran out of descriptors: it may keep one per node; \
                 see --nofile and --max-held)"
            } else {
                ""
            };
            format!(
                "{} round {round}, {}: {e}{hint}\n{alive}",
                spec.label,
                w.name()
            )
        })?;
        if let Some(s) = strace {
            let out = s.finish()?;
            eprintln!("  strace summary: {}", out.display());
        }
        let fds_after = d.fd_count();
        eprintln!(
            "round {round}/{} {:<9} {:<19} {:>7} ops {:>7.3} s {:>8.0} ops/s  daemon CPU {:>5.2} s \
             (user {:>5.2}, sys {:>5.2})  bench CPU {:>5.2} s",
            args.rounds,
            spec.label,
            w.name(),
            m.ops,
            m.wall.as_secs_f64(),
            m.ops_per_sec(),
            m.daemon_cpu.total().as_secs_f64(),
            m.daemon_cpu.user.as_secs_f64(),
            m.daemon_cpu.system.as_secs_f64(),
            m.bench_cpu.total().as_secs_f64(),
        );
        if let (Some(b), Some(a)) = (fds_before, fds_after) {
            if a > b + 16 {
                eprintln!(
                    "  warning: {} holds {} more descriptors after {} than before \
                     (references not released?)",
                    spec.label,
                    a - b,
                    w.name()
                );
            }
        }
        results.add(spec.label, w, m);
    }

    session.fe.disconnect();
    drop(session);
    let status = d.wait_exit(Duration::from_secs(10))?;
    if !status.success() {
        eprintln!(
            "  warning: {} exited with {status} after the frontend disconnected",
            spec.label
        );
    }
    Ok(())
}
