//! Forking a helper process and reaping it: the supervising parent of `--sandbox` and the id-map
//! writer of `--uid-map`/`--gid-map` both fork the still single-threaded daemon.

use std::io;

use nix::errno::Errno;
use nix::sys::wait::{WaitPidFlag, WaitStatus};
use nix::unistd::{ForkResult, Pid};

/// Why the process could not fork.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    #[error("cannot count this process's threads")]
    CountThreads(#[source] io::Error),
    #[error("the process runs {0} threads; this must be done before any thread starts")]
    Threaded(usize),
    #[error("fork failed")]
    Fork(#[source] Errno),
}

/// Number of threads of this process (the entries of `/proc/self/task`).
pub fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Checks that the process runs one thread, as forking, entering a user namespace and dropping
/// capabilities for the whole process need.
pub fn check_single_threaded() -> Result<(), ForkError> {
    match thread_count().map_err(ForkError::CountThreads)? {
        1 => Ok(()),
        n => Err(ForkError::Threaded(n)),
    }
}

/// Forks the process, after checking it is single-threaded: the child is then a complete copy,
/// with no lock held by a thread that does not exist in it.
pub fn fork_single_threaded() -> Result<ForkResult, ForkError> {
    check_single_threaded()?;
    // SAFETY: the process runs one thread (checked just above, and nothing in between starts
    // one), so the child may run any code, not only async-signal-safe functions.
    unsafe { nix::unistd::fork() }.map_err(ForkError::Fork)
}

/// `waitpid(2)` for our child `pid`, again when interrupted by a signal. With `WNOHANG` in
/// `flags`, a child still running is [`WaitStatus::StillAlive`].
pub fn wait_for(pid: Pid, flags: Option<WaitPidFlag>) -> nix::Result<WaitStatus> {
    loop {
        match nix::sys::wait::waitpid(pid, flags) {
            Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

/// The exit status a parent that stands for its child exits with: the child's own, or 128 +
/// the signal that killed it (as a shell reports it); 1 for anything else.
pub fn exit_code(status: WaitStatus) -> i32 {
    match status {
        WaitStatus::Exited(_, code) => code,
        WaitStatus::Signaled(_, sig, _) => 128 + sig as i32,
        _ => 1,
    }
}

/// A wait status in words, for messages.
pub fn describe(status: WaitStatus) -> String {
    match status {
        WaitStatus::Exited(_, code) => format!("exit status {code}"),
        WaitStatus::Signaled(_, sig, _) => format!("killed by signal {}", sig as i32),
        other => format!("wait status {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal;

    #[test]
    fn exit_codes_stand_for_the_child() {
        let pid = Pid::from_raw(1);
        assert_eq!(exit_code(WaitStatus::Exited(pid, 3)), 3);
        assert_eq!(
            exit_code(WaitStatus::Signaled(pid, Signal::SIGKILL, false)),
            128 + 9
        );
        assert_eq!(exit_code(WaitStatus::StillAlive), 1);
        assert_eq!(
            describe(WaitStatus::Signaled(pid, Signal::SIGTERM, false)),
            "killed by signal 15"
        );
    }

    #[test]
    fn a_threaded_process_is_not_forked() {
        // The test harness runs tests on their own threads.
        assert!(matches!(
            fork_single_threaded(),
            Err(ForkError::Threaded(n)) if n > 1
        ));
    }
}
