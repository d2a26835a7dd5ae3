//! The seccomp filter (`--seccomp`).
//!
//! Once the daemon is set up (socket listening, shared directory open, threads started), it
//! installs a filter on every one of its threads: the system calls in [`ALLOWED`] run, any other
//! is refused as `--seccomp` says: `kill` kills the whole process (`SECCOMP_RET_KILL_PROCESS`),
//! `log` lets it run and has the kernel log it (`SECCOMP_RET_LOG`), `trap` sends `SIGSYS`, whose
//! handler writes the number of the refused call to stderr and then kills the process; `none`
//! installs no filter. The filter is built with `seccompiler` (rust-vmm) and installed with
//! `SECCOMP_FILTER_FLAG_TSYNC`, so threads that already run get it too, and every thread
//! started later inherits it. Arguments are not filtered.
//!
//! The list was gathered by tracing the daemon (`strace -f`) through the integration tests
//! that run the binary and the guest test suites, and completed with the calls of code paths
//! that the traces do not reach (errors, `--syslog`, signals).

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::str::FromStr;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// What happens to a system call that is not on the list (`--seccomp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Action {
    /// Kill the process (`SECCOMP_RET_KILL_PROCESS`).
    #[default]
    Kill,
    /// Let the call run and have the kernel log it (`SECCOMP_RET_LOG`).
    Log,
    /// Send `SIGSYS`: the daemon logs the refused call and kills itself.
    Trap,
    /// Install no filter.
    None,
}

impl Action {
    /// The name of the action, as `--seccomp` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Kill => "kill",
            Action::Log => "log",
            Action::Trap => "trap",
            Action::None => "none",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Action {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "kill" => Ok(Action::Kill),
            "log" => Ok(Action::Log),
            "trap" => Ok(Action::Trap),
            "none" => Ok(Action::None),
            _ => Err(format!(
                "invalid value '{s}': expected one of kill, log, trap, none"
            )),
        }
    }
}

/// System calls allowed together, with the code that makes them.
#[derive(Debug)]
pub struct Group {
    /// Which code makes these calls.
    pub made_by: &'static str,
    pub syscalls: &'static [libc::c_long],
}

/// The system calls the daemon makes once it serves, by the code that makes them. Calls made
/// only during start-up, before the filter is installed (bind, listen, unshare other than
/// `unshare(CLONE_FS)` (allowed on its own in [`program`]), setrlimit,
/// execve...), are not on it.
pub const ALLOWED: &[Group] = &[
    // FUSE requests on files and directories: src/passthrough (sys.rs, inode.rs, handle.rs,
    // dir.rs), through src/idmap. Descriptors are opened relative to the shared directory,
    // inodes referenced by file handle (name_to_handle_at, open_by_handle_at), and /proc/self/fd
    // paths re-opened.
    Group {
        made_by: "file requests (src/passthrough)",
        syscalls: &[
            libc::SYS_openat,
            libc::SYS_close,
            libc::SYS_dup,
            libc::SYS_dup3,
            libc::SYS_fcntl,
            libc::SYS_read,
            libc::SYS_pread64,
            libc::SYS_preadv,
            libc::SYS_preadv2,
            libc::SYS_readv,
            libc::SYS_write,
            libc::SYS_pwrite64,
            libc::SYS_pwritev,
            libc::SYS_pwritev2,
            libc::SYS_writev,
            libc::SYS_lseek,
            libc::SYS_copy_file_range,
            libc::SYS_fallocate,
            libc::SYS_ftruncate,
            libc::SYS_fsync,
            libc::SYS_fdatasync,
            libc::SYS_syncfs,
            libc::SYS_newfstatat,
            libc::SYS_fstat,
            libc::SYS_statx,
            libc::SYS_statfs,
            libc::SYS_fstatfs,
            libc::SYS_getdents64,
            libc::SYS_readlinkat,
            libc::SYS_mkdirat,
            libc::SYS_mknodat,
            libc::SYS_symlinkat,
            libc::SYS_linkat,
            libc::SYS_unlinkat,
            libc::SYS_renameat2,
            libc::SYS_fchownat,
            libc::SYS_fchown,
            libc::SYS_fchmodat,
            libc::SYS_fchmod,
            libc::SYS_utimensat,
            libc::SYS_umask,
            libc::SYS_fchdir,
            libc::SYS_name_to_handle_at,
            libc::SYS_open_by_handle_at,
        ],
    },
    // Extended attributes (--xattr): src/passthrough, on /proc/self/fd paths or descriptors.
    Group {
        made_by: "extended attributes (src/passthrough, --xattr)",
        syscalls: &[
            libc::SYS_getxattr,
            libc::SYS_setxattr,
            libc::SYS_listxattr,
            libc::SYS_removexattr,
            libc::SYS_lgetxattr,
            libc::SYS_lsetxattr,
            libc::SYS_llistxattr,
            libc::SYS_lremovexattr,
            libc::SYS_fgetxattr,
            libc::SYS_fsetxattr,
            libc::SYS_flistxattr,
            libc::SYS_fremovexattr,
        ],
    },
    // Acting as the guest caller: per-thread fsuid/fsgid and supplementary group
    // (src/passthrough/credentials.rs), capabilities kept or dropped around requests.
    Group {
        made_by: "caller credentials (src/passthrough/credentials.rs)",
        syscalls: &[
            libc::SYS_setfsuid,
            libc::SYS_setfsgid,
            libc::SYS_setgroups,
            libc::SYS_setresuid,
            libc::SYS_setresgid,
            libc::SYS_getuid,
            libc::SYS_geteuid,
            libc::SYS_getgid,
            libc::SYS_getegid,
            libc::SYS_capget,
            libc::SYS_capset,
        ],
    },
    // The vhost-user session: accepting the frontend, its messages and the descriptors they
    // carry, mapping guest memory, the per-queue event loops (vhost, vhost-user-backend,
    // vm-memory, vmm-sys-util, src/vhost_user).
    Group {
        made_by: "vhost-user session (vhost-user-backend, vm-memory, src/vhost_user)",
        syscalls: &[
            libc::SYS_accept4,
            libc::SYS_recvmsg,
            libc::SYS_sendmsg,
            libc::SYS_shutdown,
            libc::SYS_epoll_create1,
            libc::SYS_epoll_ctl,
            libc::SYS_epoll_pwait,
            libc::SYS_eventfd2,
            libc::SYS_ppoll,
            libc::SYS_mmap,
            libc::SYS_munmap,
        ],
    },
    // Threads, memory and signals of the Rust runtime and the C library: worker and pool
    // threads starting and parking, allocation, the stop-signal thread (sigwait), SIGSYS of
    // --seccomp=trap, thread names (prctl), random hash seeds.
    Group {
        made_by: "threads, memory and signals (Rust std, glibc)",
        syscalls: &[
            libc::SYS_brk,
            libc::SYS_mprotect,
            libc::SYS_mremap,
            libc::SYS_madvise,
            libc::SYS_futex,
            libc::SYS_clone,
            libc::SYS_clone3,
            libc::SYS_set_robust_list,
            libc::SYS_rseq,
            libc::SYS_sigaltstack,
            libc::SYS_rt_sigaction,
            libc::SYS_rt_sigprocmask,
            libc::SYS_rt_sigreturn,
            libc::SYS_rt_sigtimedwait,
            libc::SYS_sched_getaffinity,
            libc::SYS_sched_yield,
            libc::SYS_getrandom,
            libc::SYS_gettid,
            libc::SYS_getpid,
            libc::SYS_tgkill,
            libc::SYS_prctl,
            libc::SYS_nanosleep,
            libc::SYS_clock_nanosleep,
            libc::SYS_clock_gettime,
            libc::SYS_exit,
            libc::SYS_exit_group,
        ],
    },
    // Logging: stderr (env_logger) or syslog(3) (--syslog, src/logging.rs), which reconnects
    // to /dev/log when syslogd restarts and reads the time zone for its timestamps.
    Group {
        made_by: "logging (src/logging.rs: stderr, syslog)",
        syscalls: &[libc::SYS_socket, libc::SYS_connect, libc::SYS_sendto],
    },
    // Resource limits (src/daemon.rs) and a sandbox parent waiting for its child.
    Group {
        made_by: "limits and process exit (src/daemon.rs)",
        syscalls: &[libc::SYS_prlimit64, libc::SYS_wait4],
    },
    // Calls that only x86_64 has (other architectures have the *at, p* or prlimit64 forms
    // above only): removing the socket file on SIGTERM (std::fs::remove_file), poll(2) and
    // epoll_wait(2) of the event loops, getrlimit(2).
    #[cfg(target_arch = "x86_64")]
    Group {
        made_by: "x86_64-only forms (std, vmm-sys-util)",
        syscalls: &[
            libc::SYS_unlink,
            libc::SYS_poll,
            libc::SYS_epoll_wait,
            libc::SYS_getrlimit,
        ],
    },
];

/// Every allowed system call number, each once.
pub fn allowed_syscalls() -> std::collections::BTreeSet<libc::c_long> {
    ALLOWED
        .iter()
        .flat_map(|g| g.syscalls.iter().copied())
        .collect()
}

/// Why the filter could not be built or installed.
#[derive(Debug)]
pub struct Error(String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// The BPF program of the filter for `action`, or `None` for [`Action::None`].
pub fn program(action: Action) -> Result<Option<BpfProgram>, Error> {
    let mismatch = match action {
        Action::None => return Ok(None),
        Action::Kill => SeccompAction::KillProcess,
        Action::Log => SeccompAction::Log,
        Action::Trap => SeccompAction::Trap,
    };
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|_| {
        Error(format!(
            "no seccomp filter for this architecture ({}); use --seccomp=none",
            std::env::consts::ARCH
        ))
    })?;
    // c_long is i64 here but i32 on 32-bit targets.
    #[allow(clippy::useless_conversion)]
    let mut rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> = allowed_syscalls()
        .into_iter()
        .map(|nr| (i64::from(nr), Vec::new()))
        .collect();
    // unshare(CLONE_FS) and nothing else: a serving thread takes its own working directory and
    // umask for the xattr calls (src/passthrough/threadfs.rs); no namespace can be entered.
    let clone_fs_only = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::Eq,
        libc::CLONE_FS as u64,
    )
    .and_then(|c| SeccompRule::new(vec![c]))
    .map_err(|e| Error(format!("cannot build the filter: {e}")))?;
    #[allow(clippy::useless_conversion)]
    rules.insert(i64::from(libc::SYS_unshare), vec![clone_fs_only]);
    let filter = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, arch)
        .map_err(|e| Error(format!("cannot build the filter: {e}")))?;
    let prog: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| Error(format!("cannot build the filter: {e}")))?;
    Ok(Some(prog))
}

/// Installs the filter for `action` on every thread of the process (nothing for
/// [`Action::None`]); for [`Action::Trap`], installs the `SIGSYS` handler first. Sets
/// `PR_SET_NO_NEW_PRIVS`, as an unprivileged filter requires.
pub fn install(action: Action) -> Result<(), Error> {
    let Some(prog) = program(action)? else {
        return Ok(());
    };
    if action == Action::Trap {
        install_sigsys_handler()
            .map_err(|e| Error(format!("cannot install the SIGSYS handler: {e}")))?;
    }
    seccompiler::apply_filter_all_threads(&prog)
        .map_err(|e| Error(format!("cannot install the filter: {e}")))
}

/// Installs [`sigsys_handler`] for `SIGSYS`. The handler resets itself on entry
/// (`SA_RESETHAND`) and does not block `SIGSYS` (`SA_NODEFER`), so the signal it raises, or a
/// refused call inside it, kills the process.
pub fn install_sigsys_handler() -> io::Result<()> {
    // SAFETY: `sa` is a zeroed sigaction filled in before use; the handler has the
    // SA_SIGINFO signature and only makes async-signal-safe calls; sigaction reads `sa` only.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = sigsys_handler as *const () as libc::sighandler_t;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESETHAND | libc::SA_NODEFER;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The head of a `siginfo_t` for `SIGSYS` (the kernel's `_sigsys` member), which the `libc`
/// crate does not expose.
#[repr(C)]
struct SigsysInfo {
    signo: libc::c_int,
    errno: libc::c_int,
    code: libc::c_int,
    call_addr: *mut libc::c_void,
    syscall: libc::c_int,
    arch: libc::c_uint,
}

/// The message the `SIGSYS` handler writes for refused call `nr`: "virtiofsd: seccomp: refused
/// system call NR (--seccomp=trap); killing the process\n". Formats into `buf` without
/// allocating and returns the length.
fn refused_message(nr: libc::c_int, buf: &mut [u8; 128]) -> usize {
    let mut len = 0;
    let mut put = |bytes: &[u8]| {
        for &b in bytes {
            if len < buf.len() {
                buf[len] = b;
                len += 1;
            }
        }
    };
    put(b"virtiofsd: seccomp: refused system call ");
    let mut digits = [0u8; 12];
    let mut n = i64::from(nr);
    let neg = n < 0;
    n = n.abs();
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if neg {
        put(b"-");
    }
    put(&digits[i..]);
    put(b" (--seccomp=trap); killing the process\n");
    len
}

/// `SIGSYS` handler of `--seccomp=trap`: writes the refused call's number to stderr, then dies
/// of `SIGSYS`. Async-signal-safe: no allocation, no lock, only write(2) and raise(3).
extern "C" fn sigsys_handler(
    _sig: libc::c_int,
    info: *mut libc::siginfo_t,
    _ctx: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo for SIGSYS, whose layout starts as SigsysInfo.
    let nr = unsafe { (*(info as *const SigsysInfo)).syscall };
    let mut buf = [0u8; 128];
    let len = refused_message(nr, &mut buf);
    // SAFETY: write reads `len` initialised bytes of `buf`; raise and _exit have no
    // memory-safety preconditions. The handler was reset to the default on entry, so the raised
    // SIGSYS kills the process; _exit only runs if it somehow did not.
    unsafe {
        libc::write(libc::STDERR_FILENO, buf.as_ptr().cast(), len);
        libc::raise(libc::SIGSYS);
        libc::_exit(128 + libc::SIGSYS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call the daemon never makes, harmless when it does run: getcpu(NULL, NULL, NULL).
    const OFF_LIST: libc::c_long = libc::SYS_getcpu;

    #[derive(Debug, PartialEq, Eq)]
    enum Ended {
        Exited(i32),
        Signalled(i32),
    }

    /// Forks a child that redirects its stderr to a pipe, calls `before` (async-signal-safe
    /// only), installs `prog` on itself and runs `body`, whose value is its exit status. Returns
    /// how the child ended and what it wrote to stderr.
    fn in_child(prog: &BpfProgram, before: fn(), body: fn() -> i32) -> (Ended, String) {
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors into the local array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only makes async-signal-safe calls (dup2, close, sigaction, prctl,
        // seccomp, raw system calls, _exit) before it exits; the program was built before fork.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: async-signal-safe calls on descriptors this child owns.
            unsafe {
                libc::dup2(fds[1], libc::STDERR_FILENO);
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
            before();
            let status = match seccompiler::apply_filter(prog) {
                Ok(()) => body(),
                Err(_) => 99,
            };
            // SAFETY: _exit ends the child without running the parent's destructors.
            unsafe { libc::_exit(status) };
        }
        // SAFETY: the parent closes its copy of the write end it owns.
        unsafe { libc::close(fds[1]) };
        let mut status = 0;
        // SAFETY: waits for our own child, writing the local `status`.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        let mut out = Vec::new();
        // SAFETY: the read end is ours; File takes ownership and closes it.
        let mut f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) };
        std::io::Read::read_to_end(&mut f, &mut out).unwrap();
        let ended = if libc::WIFSIGNALED(status) {
            Ended::Signalled(libc::WTERMSIG(status))
        } else {
            Ended::Exited(libc::WEXITSTATUS(status))
        };
        (ended, String::from_utf8_lossy(&out).into_owned())
    }

    fn nothing() {}

    fn sigsys_handler_in_child() {
        if install_sigsys_handler().is_err() {
            // SAFETY: ends the child.
            unsafe { libc::_exit(98) };
        }
    }

    /// Makes the off-list call; exits 0 when it ran and succeeded.
    fn off_list_call() -> i32 {
        // SAFETY: getcpu accepts NULL for both of its out pointers.
        let rc = unsafe {
            libc::syscall(
                OFF_LIST,
                std::ptr::null_mut::<u32>(),
                std::ptr::null_mut::<u32>(),
                std::ptr::null_mut::<libc::c_void>(),
            )
        };
        if rc == 0 {
            0
        } else {
            3
        }
    }

    /// Makes allowed calls the daemon relies on; exits 0 when each worked.
    fn allowed_calls() -> i32 {
        // SAFETY: raw getpid/gettid and openat of a static NUL-terminated path, whose
        // descriptor is closed again; fstat writes a local stat buffer.
        unsafe {
            if libc::syscall(libc::SYS_getpid) <= 0 || libc::syscall(libc::SYS_gettid) <= 0 {
                return 4;
            }
            let fd = libc::openat(
                libc::AT_FDCWD,
                c"/".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            );
            if fd < 0 {
                return 5;
            }
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) != 0 || st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                return 6;
            }
            if libc::close(fd) != 0 {
                return 7;
            }
        }
        0
    }

    fn prog(action: Action) -> BpfProgram {
        program(action).unwrap().expect("a program")
    }

    #[test]
    fn the_off_list_call_of_these_tests_is_off_the_list() {
        assert!(!allowed_syscalls().contains(&OFF_LIST));
        // Nor anything the daemon must never do.
        for nr in [
            libc::SYS_ptrace,
            libc::SYS_execve,
            libc::SYS_mount,
            libc::SYS_reboot,
            libc::SYS_kexec_load,
            libc::SYS_init_module,
            libc::SYS_bpf,
            libc::SYS_process_vm_writev,
        ] {
            assert!(!allowed_syscalls().contains(&nr), "{nr} is allowed");
        }
    }

    #[test]
    fn no_call_is_listed_twice() {
        let all: Vec<_> = ALLOWED.iter().flat_map(|g| g.syscalls).collect();
        assert_eq!(all.len(), allowed_syscalls().len());
    }

    #[test]
    fn kill_kills_the_process_on_an_off_list_call() {
        let (ended, _) = in_child(&prog(Action::Kill), nothing, off_list_call);
        assert_eq!(ended, Ended::Signalled(libc::SIGSYS));
    }

    #[test]
    fn log_lets_an_off_list_call_run() {
        let (ended, _) = in_child(&prog(Action::Log), nothing, off_list_call);
        assert_eq!(ended, Ended::Exited(0));
    }

    #[test]
    fn trap_logs_the_refused_call_and_dies_of_sigsys() {
        let (ended, err) = in_child(&prog(Action::Trap), sigsys_handler_in_child, off_list_call);
        assert_eq!(ended, Ended::Signalled(libc::SIGSYS));
        assert_eq!(
            err,
            format!(
                "virtiofsd: seccomp: refused system call {OFF_LIST} (--seccomp=trap); killing \
                 the process\n"
            )
        );
    }

    #[test]
    fn allowed_calls_still_work_under_each_filter() {
        for action in [Action::Kill, Action::Log, Action::Trap] {
            let (ended, err) = in_child(&prog(action), sigsys_handler_in_child, allowed_calls);
            assert_eq!(ended, Ended::Exited(0), "{action}: {err}");
        }
    }

    #[test]
    fn none_builds_no_filter() {
        assert!(program(Action::None).unwrap().is_none());
        // Installing nothing succeeds and adds no filter to this test process.
        let filters = || {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let line = status.lines().find(|l| l.starts_with("Seccomp_filters:"));
            line.map(str::to_string)
        };
        let before = filters();
        install(Action::None).unwrap();
        assert_eq!(filters(), before);
    }

    #[test]
    fn actions_parse_and_print() {
        for a in [Action::Kill, Action::Log, Action::Trap, Action::None] {
            assert_eq!(a.as_str().parse::<Action>(), Ok(a));
        }
        assert_eq!(Action::default(), Action::Kill);
        let e = "maybe".parse::<Action>().unwrap_err();
        assert!(
            e.contains("'maybe'") && e.contains("kill, log, trap, none"),
            "{e}"
        );
    }

    #[test]
    fn refused_message_formats_the_number() {
        let mut buf = [0u8; 128];
        let n = refused_message(101, &mut buf);
        assert_eq!(
            &buf[..n],
            b"virtiofsd: seccomp: refused system call 101 (--seccomp=trap); killing the process\n"
        );
        let n = refused_message(0, &mut buf);
        assert!(std::str::from_utf8(&buf[..n]).unwrap().contains(" call 0 "));
        let n = refused_message(-1, &mut buf);
        assert!(std::str::from_utf8(&buf[..n])
            .unwrap()
            .contains(" call -1 "));
    }
}
