//! Daemon processes under test: spawning one on a fresh socket, reading the CPU time and open
//! descriptors of its whole process tree from `/proc`, waiting for it to exit after the frontend
//! disconnected, and killing it (by pid) if anything goes wrong.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How to start one of the compared daemons.
#[derive(Debug, Clone)]
pub struct DaemonSpec {
    /// Short label: `ours` or `reference`.
    pub label: &'static str,
    /// The executable.
    pub path: PathBuf,
    /// Flags added after `--socket-path`, `--shared-dir` and `--cache`.
    pub extra_args: Vec<OsString>,
}

impl DaemonSpec {
    /// The command line, for the report.
    pub fn command_line(&self, cache: &str) -> String {
        let mut s = format!(
            "{} --socket-path SOCK --shared-dir TREE --cache {cache}",
            self.path.display()
        );
        for a in &self.extra_args {
            s.push(' ');
            s.push_str(&a.to_string_lossy());
        }
        s
    }
}

/// A spawned daemon. Dropping it without [`Running::wait_exit`] kills it and its children.
pub struct Running {
    label: &'static str,
    child: Child,
    pid: u32,
    log: PathBuf,
    reaped: bool,
}

impl Running {
    /// Starts `spec` serving `tree` on `socket`, with stdout and stderr going to `log`.
    pub fn spawn(
        spec: &DaemonSpec,
        socket: &Path,
        tree: &Path,
        cache: &str,
        log: &Path,
    ) -> Result<Self, String> {
        let out = fs::File::create(log).map_err(|e| format!("create {}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("dup {}: {e}", log.display()))?;
        let child = Command::new(&spec.path)
            .arg("--socket-path")
            .arg(socket)
            .arg("--shared-dir")
            .arg(tree)
            .arg("--cache")
            .arg(cache)
            .args(&spec.extra_args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("{}: cannot start {}: {e}", spec.label, spec.path.display()))?;
        let pid = child.id();
        Ok(Running {
            label: spec.label,
            child,
            pid,
            log: log.to_path_buf(),
            reaped: false,
        })
    }

    /// Process id of the daemon (the process that was spawned).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The daemon's process and every descendant (the reference's namespace sandbox serves
    /// from a forked child).
    pub fn pids(&self) -> Vec<u32> {
        process_tree(self.pid)
    }

    /// The last lines of the daemon's log, indented, for error messages.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let start = lines.len().saturating_sub(15);
        if lines.is_empty() {
            return format!("  (log {} is empty)", self.log.display());
        }
        let mut s = format!("  last lines of {}:", self.log.display());
        for l in &lines[start..] {
            s.push_str("\n    ");
            s.push_str(l);
        }
        s
    }

    /// Fails with the exit status and log if the daemon is no longer running.
    pub fn check_alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => {
                self.reaped = true;
                Err(format!(
                    "{} daemon exited unexpectedly ({status})\n{}",
                    self.label,
                    self.log_tail()
                ))
            }
            Err(e) => Err(format!("{}: waitpid: {e}", self.label)),
        }
    }

    /// Waits until `socket` exists (the daemon listens), failing early if the daemon dies.
    pub fn wait_for_socket(&mut self, socket: &Path, patience: Duration) -> Result<(), String> {
        let deadline = Instant::now() + patience;
        loop {
            self.check_alive()?;
            if socket.exists() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} daemon did not create {} within {patience:?}\n{}",
                    self.label,
                    socket.display(),
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// CPU time (all threads) of the daemon's process tree.
    pub fn cpu_time(&self) -> Result<CpuTime, String> {
        let mut total = CpuTime::default();
        for pid in self.pids() {
            match process_cpu(&format!("/proc/{pid}/stat")) {
                Ok(t) => total = total.add(t),
                // A process of the tree may exit between listing and reading; only the main
                // one must be readable.
                Err(e) if pid == self.pid => {
                    return Err(format!("{} daemon (pid {pid}): {e}", self.label))
                }
                Err(_) => {}
            }
        }
        Ok(total)
    }

    /// Open descriptors of the daemon's process tree (`None` if `/proc` does not tell).
    pub fn fd_count(&self) -> Option<usize> {
        let mut n = 0;
        for pid in self.pids() {
            n += fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
        }
        Some(n)
    }

    /// Waits up to `patience` for the daemon to exit (after the frontend disconnected).
    pub fn wait_exit(mut self, patience: Duration) -> Result<ExitStatus, String> {
        let deadline = Instant::now() + patience;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    self.reaped = true;
                    return Ok(status);
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(None) => {
                    return Err(format!(
                        "{} daemon did not exit within {patience:?} after the frontend \
                         disconnected (killing it)\n{}",
                        self.label,
                        self.log_tail()
                    ))
                }
                Err(e) => return Err(format!("{}: waitpid: {e}", self.label)),
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        let pids = self.pids();
        signal_all(&pids, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                self.reaped = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if !self.reaped {
            signal_all(&pids, libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

fn signal_all(pids: &[u32], sig: libc::c_int) {
    for &pid in pids.iter().rev() {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            continue;
        };
        // SAFETY: kill() has no memory-safety preconditions; the pids are the daemon we
        // spawned and its descendants.
        unsafe { libc::kill(pid, sig) };
    }
}

/// `pid` and all its descendants, parents first (from `/proc/PID/task/TID/children`).
pub fn process_tree(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        i += 1;
        let Ok(tasks) = fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let Ok(children) = fs::read_to_string(t.path().join("children")) else {
                continue;
            };
            for c in children.split_whitespace() {
                if let Ok(c) = c.parse::<u32>() {
                    if !out.contains(&c) {
                        out.push(c);
                    }
                }
            }
        }
    }
    out
}

/// Clock ticks per second of `/proc/*/stat` times.
fn clock_ticks() -> u64 {
    // SAFETY: sysconf() has no memory-safety preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// User and system CPU time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTime {
    pub user: Duration,
    pub system: Duration,
}

impl CpuTime {
    /// User + system.
    pub fn total(self) -> Duration {
        self.user + self.system
    }

    pub fn add(self, o: CpuTime) -> CpuTime {
        CpuTime {
            user: self.user + o.user,
            system: self.system + o.system,
        }
    }

    /// `self - earlier`, clamped at zero (a thread that exited in between takes its time along).
    pub fn since(self, earlier: CpuTime) -> CpuTime {
        CpuTime {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
        }
    }
}

/// `utime` and `stime` of a `/proc/.../stat` file (for a process: summed over all its threads).
pub fn process_cpu(stat_path: &str) -> Result<CpuTime, String> {
    let text = fs::read_to_string(stat_path).map_err(|e| format!("read {stat_path}: {e}"))?;
    // The command name (field 2) may contain spaces and parentheses: fields restart after the
    // last ')'. utime and stime are fields 14 and 15, i.e. 12th and 13th after the name.
    let rest = text
        .rfind(')')
        .map(|i| &text[i + 1..])
        .ok_or_else(|| format!("{stat_path}: unexpected format"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> Result<u64, String> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| format!("{stat_path}: field {} missing", i + 3))
    };
    let hz = clock_ticks();
    let time = |ticks: u64| Duration::from_nanos(ticks * 1_000_000_000 / hz);
    Ok(CpuTime {
        user: time(field(11)?),
        system: time(field(12)?),
    })
}

/// An `strace -c -f` attached to a daemon's process tree for one workload.
pub struct Strace {
    child: Child,
    output: PathBuf,
}

impl Strace {
    /// Attaches `strace -c -f` to every process of the daemon's tree, writing the summary to
    /// `output`, and waits until all their threads are traced.
    pub fn attach(daemon: &Running, output: &Path) -> Result<Self, String> {
        let pids = daemon.pids();
        let mut cmd = Command::new("strace");
        cmd.args(["-c", "-f", "-qq", "-o"]).arg(output);
        for p in &pids {
            cmd.arg("-p").arg(p.to_string());
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start strace (apt-get install strace): {e}"))?;
        let s = Strace {
            child,
            output: output.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pids.iter().all(|&p| all_threads_traced(p)) {
            if Instant::now() >= deadline {
                return Err("strace did not attach within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(100));
        Ok(s)
    }

    /// Detaches (SIGINT makes strace print its summary) and returns the summary file's path.
    pub fn finish(mut self) -> Result<PathBuf, String> {
        let pid = libc::pid_t::try_from(self.child.id())
            .map_err(|_| "strace pid out of range".to_string())?;
        // SAFETY: kill() has no memory-safety preconditions; `pid` is the strace we spawned.
        unsafe { libc::kill(pid, libc::SIGINT) };
        self.child
            .wait()
            .map_err(|e| format!("wait for strace: {e}"))?;
        Ok(self.output.clone())
    }
}

fn all_threads_traced(pid: u32) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|t| {
        fs::read_to_string(t.path().join("status"))
            .map(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("TracerPid:"))
                    .is_some_and(|v| v.trim() != "0")
            })
            .unwrap_or(true)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_time_is_readable() {
        let t = process_cpu("/proc/self/stat").unwrap();
        assert!(t.total() < Duration::from_secs(3600));
        assert_eq!(t.since(t.add(t)), CpuTime::default());
        assert_eq!(process_tree(std::process::id())[0], std::process::id());
    }
}
