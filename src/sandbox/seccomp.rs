//! The seccomp filter (`--seccomp`).
//!
//! Once the daemon is set up (socket listening, shared directory open, threads started), it
//! installs a filter on every one of its threads: the system calls in [`ALLOWED`] run, any other
//! is refused as `--seccomp` says: `kill` kills the whole process (`SECCOMP_RET_KILL_PROCESS`),
//! `log` lets it run and has the kernel log it (`SECCOMP_RET_LOG`), `trap` sends `SIGSYS`, whose
//! handler writes the number of the refused call to stderr and then kills the process; `none`
//! installs no filter. The filter is built with `seccompiler` (rust-vmm) and installed with
//! `SECCOMP_FILTER_FLAG_TSYNC`, so threads that already run get it too, and every thread
//! started later inherits it.
//!
//! Most calls run with any argument. A few run only with the arguments the daemon passes
//! ([`RESTRICTED`], checked in the filter; any other use is refused as `--seccomp` says):
//! `clone` only with the flags of a new thread ([`THREAD_CLONE_FLAGS`]), never a new process
//! or namespace; `unshare` only with `CLONE_FS`; `socket` only for `AF_UNIX` (syslog);
//! `tgkill` only towards the daemon's own threads (thread group id == its pid, known when the
//! filter is built). `clone3` passes its flags in memory the filter cannot read: it fails with
//! `ENOSYS` ([`ANSWERED_ENOSYS`]), and the C library falls back to `clone`.
//!
//! The list was gathered by tracing the daemon (`strace -f`) through the integration tests
//! that run the binary and the guest test suites, and completed with the calls of code paths
//! that the traces do not reach (errors, `--syslog`, signals).

use std::collections::BTreeMap;
use std::fmt;
use std::io;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// What happens to a system call that is not on the list (`--seccomp`; the names are the
/// flag's values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
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

/// System calls allowed together, with the code that makes them.
#[derive(Debug)]
pub struct Group {
    /// Which code makes these calls.
    pub made_by: &'static str,
    pub syscalls: &'static [libc::c_long],
}

/// The system calls the daemon makes once it serves with any argument, by the code that makes
/// them. Calls made only during start-up, before the filter is installed (bind, listen,
/// setrlimit, execve...), are not on it; those allowed only with some arguments are in
/// [`RESTRICTED`], `clone3` in [`ANSWERED_ENOSYS`].
pub const ALLOWED: &[Group] = &[
    // FUSE requests on files and directories: src/passthrough (sys.rs, node/inode.rs, handle.rs,
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
    // The guest's locks held on host files: flock(2) (record and OFD locks are fcntl, above).
    Group {
        made_by: "the guest's locks (src/passthrough/locks.rs)",
        syscalls: &[libc::SYS_flock],
    },
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
            libc::SYS_prctl,
            libc::SYS_nanosleep,
            libc::SYS_clock_nanosleep,
            libc::SYS_clock_gettime,
            libc::SYS_exit,
            libc::SYS_exit_group,
        ],
    },
    // Logging: stderr (env_logger) or syslog (--syslog, src/logging.rs), over the connection
    // to /dev/log made at start (never made again: no connect(2) once set up).
    Group {
        made_by: "logging (src/logging.rs: stderr, syslog)",
        syscalls: &[libc::SYS_sendto],
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

/// The flags glibc's `pthread_create` (and so Rust's `std::thread::spawn`) passes to `clone`
/// for a new thread (glibc `sysdeps/nptl/createthread.c`, checked with `strace` on glibc 2.36):
/// the thread shares memory, file system information, descriptors, signal handlers and System
/// V semaphore undo lists with its process, and gets its own TLS and thread id words. No
/// namespace flag, no exit signal (a thread is no child process).
pub const THREAD_CLONE_FLAGS: u64 = (libc::CLONE_VM
    | libc::CLONE_FS
    | libc::CLONE_FILES
    | libc::CLONE_SIGHAND
    | libc::CLONE_THREAD
    | libc::CLONE_SYSVSEM
    | libc::CLONE_SETTLS
    | libc::CLONE_PARENT_SETTID
    | libc::CLONE_CHILD_CLEARTID) as u64;

/// Which value an argument of a [`Restricted`] call must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    /// This number, compared on the argument's 64 bits.
    Qword(u64),
    /// This number, compared on the argument's low 32 bits (an `int` argument).
    Dword(u32),
    /// The daemon's own pid (`getpid()` of the process that builds and installs the filter),
    /// as an `int` argument.
    OwnPid,
}

/// A system call allowed only when one of its arguments has one value.
#[derive(Debug)]
pub struct Restricted {
    /// Which code makes this call.
    pub made_by: &'static str,
    pub syscall: libc::c_long,
    /// The argument checked (0 is the first).
    pub arg: u8,
    pub value: Value,
}

/// System calls allowed only with the argument the daemon passes; any other use is refused as
/// `--seccomp` says.
pub const RESTRICTED: &[Restricted] = &[
    // std::thread::spawn → pthread_create → clone (once clone3 failed with ENOSYS): worker and
    // pool threads. A new process (fork), or anything that enters a namespace, is refused.
    Restricted {
        made_by: "threads (Rust std, glibc pthread_create)",
        syscall: libc::SYS_clone,
        arg: 0,
        value: Value::Qword(THREAD_CLONE_FLAGS),
    },
    // unshare(CLONE_FS): a serving thread takes its own working directory and umask for the
    // xattr calls (src/passthrough/threadfs.rs); no namespace can be entered.
    Restricted {
        made_by: "per-thread working directory (src/passthrough/threadfs.rs)",
        syscall: libc::SYS_unshare,
        arg: 0,
        value: Value::Qword(libc::CLONE_FS as u64),
    },
    // raise(3) (the SIGSYS handler of --seccomp=trap, abort) and pthread_kill: signals to the
    // daemon's own threads, never to another process.
    Restricted {
        made_by: "signals to its own threads (glibc raise, pthread_kill)",
        syscall: libc::SYS_tgkill,
        arg: 0,
        value: Value::OwnPid,
    },
];

/// System calls that fail with `ENOSYS` under the filter, whatever `--seccomp` says (but
/// `none`): `clone3` takes its flags in a structure in memory, which a seccomp filter cannot
/// read, so the flags cannot be checked; glibc then creates threads with `clone`, whose flags
/// [`RESTRICTED`] checks.
pub const ANSWERED_ENOSYS: &[libc::c_long] = &[libc::SYS_clone3];

/// Every system call number allowed with any argument ([`ALLOWED`]), each once.
pub fn allowed_syscalls() -> std::collections::BTreeSet<libc::c_long> {
    ALLOWED
        .iter()
        .flat_map(|g| g.syscalls.iter().copied())
        .collect()
}

/// Why the filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no seccomp filter for this architecture ({0}); use --seccomp=none")]
    UnsupportedArch(&'static str),
    #[error("cannot build the filter")]
    Build(#[source] seccompiler::BackendError),
    #[error("cannot build the filter: system call {0} is both allowed and restricted")]
    AllowedAndRestricted(libc::c_long),
    #[error("cannot install the SIGSYS handler")]
    SigsysHandler(#[source] io::Error),
    #[error("cannot install the filter")]
    Install(#[source] seccompiler::Error),
}

/// The BPF program of the filter for `action`, or `None` for [`Action::None`], for the calling
/// process (its pid is the one [`Value::OwnPid`] allows).
pub fn program(action: Action) -> Result<Option<BpfProgram>, Error> {
    program_for(action, nix::unistd::getpid().as_raw())
}

/// `AUDIT_ARCH_*` of the target (`linux/audit.h`), for the architectures `seccompiler` builds
/// filters for.
fn audit_arch() -> Option<u32> {
    const LE_64BIT: u32 = 0x8000_0000 | 0x4000_0000;
    match std::env::consts::ARCH {
        "x86_64" => Some(62 | LE_64BIT),
        "aarch64" => Some(183 | LE_64BIT),
        "riscv64" => Some(243 | LE_64BIT),
        _ => None,
    }
}

/// The BPF program of the filter for `action` (`None` for [`Action::None`]) in the process
/// whose pid is `own_pid`.
pub fn program_for(action: Action, own_pid: libc::pid_t) -> Result<Option<BpfProgram>, Error> {
    let mismatch = match action {
        Action::None => return Ok(None),
        Action::Kill => SeccompAction::KillProcess,
        Action::Log => SeccompAction::Log,
        Action::Trap => SeccompAction::Trap,
    };
    let unsupported = || Error::UnsupportedArch(std::env::consts::ARCH);
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|_| unsupported())?;
    let audit_arch = audit_arch().ok_or_else(unsupported)?;
    // c_long is i64 here but i32 on 32-bit targets.
    #[allow(clippy::useless_conversion)]
    let mut rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> = allowed_syscalls()
        .into_iter()
        .map(|nr| (i64::from(nr), Vec::new()))
        .collect();
    for r in RESTRICTED {
        let (len, value) = match r.value {
            Value::Qword(v) => (SeccompCmpArgLen::Qword, v),
            Value::Dword(v) => (SeccompCmpArgLen::Dword, u64::from(v)),
            Value::OwnPid => (SeccompCmpArgLen::Dword, u64::from(own_pid as u32)),
        };
        let rule = SeccompCondition::new(r.arg, len, SeccompCmpOp::Eq, value)
            .and_then(|c| SeccompRule::new(vec![c]))
            .map_err(Error::Build)?;
        #[allow(clippy::useless_conversion)]
        let previous = rules.insert(i64::from(r.syscall), vec![rule]);
        if previous.is_some() {
            return Err(Error::AllowedAndRestricted(r.syscall));
        }
    }
    let filter =
        SeccompFilter::new(rules, mismatch, SeccompAction::Allow, arch).map_err(Error::Build)?;
    let main: BpfProgram = filter.try_into().map_err(Error::Build)?;
    Ok(Some(with_enosys_prefix(audit_arch, main)))
}

/// `prog` preceded by instructions that answer the calls of [`ANSWERED_ENOSYS`] with `ENOSYS`
/// (`seccompiler` has one match action per filter, so it cannot express this rule itself).
/// Only calls of the native architecture `audit_arch` are answered; any other goes on to
/// `prog`, which starts with its own architecture check. BPF jumps are relative and only go
/// forward, so `prog`'s own jumps are unchanged.
fn with_enosys_prefix(audit_arch: u32, prog: BpfProgram) -> BpfProgram {
    let stmt = |code: u32, k: u32| seccompiler::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| seccompiler::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let load = |offset: u32| stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, offset);
    // struct seccomp_data: int nr at offset 0, __u32 arch at offset 4.
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    let n = ANSWERED_ENOSYS.len() as u8;
    let mut out = Vec::with_capacity(prog.len() + 4 + ANSWERED_ENOSYS.len());
    // 0: A = arch; 1: not native → skip to `prog`.
    out.push(load(ARCH));
    out.push(jeq(audit_arch, 0, n + 2));
    // 2: A = nr; then one comparison per call: equal → the return ENOSYS after them.
    out.push(load(NR));
    for (i, &nr) in ANSWERED_ENOSYS.iter().enumerate() {
        let left = n - 1 - i as u8;
        out.push(jeq(nr as u32, left, if left == 0 { 1 } else { 0 }));
    }
    out.push(stmt(libc::BPF_RET | libc::BPF_K, enosys));
    out.extend(prog);
    out
}

/// Installs the filter for `action` on every thread of the process (nothing for
/// [`Action::None`]); for [`Action::Trap`], installs the `SIGSYS` handler first. Sets
/// `PR_SET_NO_NEW_PRIVS`, as an unprivileged filter requires.
pub fn install(action: Action) -> Result<(), Error> {
    let Some(prog) = program(action)? else {
        return Ok(());
    };
    if action == Action::Trap {
        install_sigsys_handler().map_err(Error::SigsysHandler)?;
    }
    seccompiler::apply_filter_all_threads(&prog).map_err(Error::Install)
}

/// Installs `sigsys_handler` for `SIGSYS`. The handler resets itself on entry
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

    /// Reads exactly `len` bytes into `buf` from `fd` with read(2) only (async-signal-safe).
    ///
    /// # Safety
    ///
    /// `buf` must be valid for writes of `len` bytes.
    unsafe fn read_full(fd: libc::c_int, buf: *mut u8, len: usize) -> bool {
        let mut done = 0;
        while done < len {
            // SAFETY: the caller guarantees `buf` has room for `len` bytes; `done < len`.
            let n = unsafe { libc::read(fd, buf.add(done).cast(), len - done) };
            if n <= 0 {
                return false;
            }
            done += n as usize;
        }
        true
    }

    /// Forks a child that redirects its stderr to a pipe, calls `before` (async-signal-safe
    /// only), installs the filter of `action` built for the child's pid (the parent builds it
    /// once it knows the pid and sends it through a pipe, so that the child does not allocate)
    /// and runs `body`, whose value is its exit status. Returns how the child ended and what
    /// it wrote to stderr.
    fn in_child(action: Action, before: fn(), body: fn() -> i32) -> (Ended, String) {
        use std::os::fd::{FromRawFd, OwnedFd};
        const ROOM: usize = 4096; // BPF_MAXINSNS
        let mut err = [0; 2];
        let mut progp = [0; 2];
        // SAFETY: pipe writes two descriptors into each local array.
        assert_eq!(unsafe { libc::pipe(err.as_mut_ptr()) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { libc::pipe(progp.as_mut_ptr()) }, 0);
        let empty = seccompiler::sock_filter {
            code: 0,
            jt: 0,
            jf: 0,
            k: 0,
        };
        let mut room = vec![empty; ROOM];
        // SAFETY: the child only makes async-signal-safe calls (dup2, close, read, sigaction,
        // prctl, seccomp, raw system calls, _exit) before it installs the filter; its room for
        // the program was allocated before fork.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: async-signal-safe calls on descriptors this child owns.
            unsafe {
                libc::dup2(err[1], libc::STDERR_FILENO);
                libc::close(err[0]);
                libc::close(err[1]);
                libc::close(progp[1]);
            }
            before();
            let mut len = 0u32;
            // SAFETY: `len` has room for its 4 bytes; `room` for ROOM instructions of 8 bytes,
            // and `len` is checked against ROOM before the second read.
            let got = unsafe {
                read_full(progp[0], (&mut len as *mut u32).cast(), 4)
                    && (len as usize) <= ROOM
                    && read_full(
                        progp[0],
                        room.as_mut_ptr().cast(),
                        len as usize * std::mem::size_of::<seccompiler::sock_filter>(),
                    )
            };
            let status = if !got {
                97
            } else {
                match seccompiler::apply_filter(&room[..len as usize]) {
                    Ok(()) => body(),
                    Err(_) => 99,
                }
            };
            // SAFETY: _exit ends the child without running the parent's destructors.
            unsafe { libc::_exit(status) };
        }
        // SAFETY: the parent closes the ends it does not use, and owns the others from here
        // (closed on every path, so that a panic here cannot leave the child blocked).
        let (err_r, prog_w) = unsafe {
            libc::close(err[1]);
            libc::close(progp[0]);
            (OwnedFd::from_raw_fd(err[0]), OwnedFd::from_raw_fd(progp[1]))
        };
        {
            let prog = program_for(action, pid).unwrap().expect("a program");
            let mut w = std::fs::File::from(prog_w);
            let bytes_of = |p: &[seccompiler::sock_filter]| {
                // SAFETY: sock_filter is repr(C) of u16, u8, u8, u32: 8 bytes, no padding;
                // the slice is read only while `p` is borrowed.
                unsafe {
                    std::slice::from_raw_parts(p.as_ptr().cast::<u8>(), std::mem::size_of_val(p))
                }
            };
            std::io::Write::write_all(&mut w, &(prog.len() as u32).to_ne_bytes()).unwrap();
            std::io::Write::write_all(&mut w, bytes_of(&prog)).unwrap();
        }
        let mut status = 0;
        // SAFETY: waits for our own child, writing the local `status`.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut std::fs::File::from(err_r), &mut out).unwrap();
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
            // A signal 0 to its own thread: allowed (thread group id == its pid).
            let me = libc::syscall(libc::SYS_getpid);
            if libc::syscall(libc::SYS_tgkill, me, libc::syscall(libc::SYS_gettid), 0) != 0 {
                return 8;
            }
        }
        0
    }

    /// The thread id of the test process that forked the child, read before the filter.
    static PARENT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

    fn note_parent() {
        // SAFETY: getppid has no preconditions; storing an atomic is async-signal-safe.
        PARENT.store(
            unsafe { libc::getppid() },
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Exit status of a body whose call the filter should have refused but let run.
    const RAN: i32 = 10;

    /// Starts a thread (std::thread::spawn, as the daemon's workers) and joins it.
    fn spawn_a_thread() -> i32 {
        match std::thread::spawn(|| 7).join() {
            Ok(7) => 0,
            _ => 11,
        }
    }

    /// clone3(NULL, 0): EINVAL where it runs (the size is too small), ENOSYS under the filter.
    fn clone3_call() -> i32 {
        // SAFETY: clone3 with a null structure and size 0 creates nothing: it fails.
        let rc = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) };
        match (rc, io::Error::last_os_error().raw_os_error()) {
            (-1, Some(libc::ENOSYS)) => 0,
            _ => RAN,
        }
    }

    /// clone(flags) as fork would make it, no stack given: the new process, if any, exits at
    /// once.
    fn raw_clone(flags: libc::c_long) -> i32 {
        // SAFETY: without CLONE_VM the child runs on a copy of this stack; it only calls _exit.
        let rc = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
        if rc == 0 {
            // SAFETY: ends the new process at once.
            unsafe { libc::_exit(0) };
        }
        RAN
    }

    fn clone_a_process() -> i32 {
        raw_clone(libc::SIGCHLD as libc::c_long)
    }

    fn clone_into_a_new_user_namespace() -> i32 {
        raw_clone((libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_long)
    }

    fn clone_thread_flags_and_a_new_mount_namespace() -> i32 {
        // The kernel refuses CLONE_NEWNS with CLONE_FS (EINVAL): nothing is created if the
        // filter lets it through.
        raw_clone((THREAD_CLONE_FLAGS | libc::CLONE_NEWNS as u64) as libc::c_long)
    }

    fn socket_of(family: libc::c_int) -> i32 {
        // SAFETY: socket creates a descriptor or fails; a created one is closed.
        unsafe {
            let s = libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if s >= 0 {
                libc::close(s);
            }
        }
        RAN
    }

    fn inet_socket() -> i32 {
        socket_of(libc::AF_INET)
    }

    fn unix_socket() -> i32 {
        socket_of(libc::AF_UNIX)
    }

    fn inet6_socket() -> i32 {
        socket_of(libc::AF_INET6)
    }

    fn netlink_socket() -> i32 {
        socket_of(libc::AF_NETLINK)
    }

    /// tgkill of signal 0 (no signal sent, only checked) to the parent test process.
    fn tgkill_the_parent() -> i32 {
        let parent = PARENT.load(std::sync::atomic::Ordering::Relaxed) as libc::c_long;
        // SAFETY: signal 0 only checks that the target exists and may be signalled.
        unsafe { libc::syscall(libc::SYS_tgkill, parent, parent, 0) };
        RAN
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
        let (ended, _) = in_child(Action::Kill, nothing, off_list_call);
        assert_eq!(ended, Ended::Signalled(libc::SIGSYS));
    }

    #[test]
    fn log_lets_an_off_list_call_run() {
        let (ended, _) = in_child(Action::Log, nothing, off_list_call);
        assert_eq!(ended, Ended::Exited(0));
    }

    #[test]
    fn trap_logs_the_refused_call_and_dies_of_sigsys() {
        let (ended, err) = in_child(Action::Trap, sigsys_handler_in_child, off_list_call);
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
            let (ended, err) = in_child(action, sigsys_handler_in_child, allowed_calls);
            assert_eq!(ended, Ended::Exited(0), "{action}: {err}");
        }
    }

    #[test]
    fn threads_start_under_each_filter() {
        for action in [Action::Kill, Action::Log, Action::Trap] {
            let (ended, err) = in_child(action, sigsys_handler_in_child, spawn_a_thread);
            assert_eq!(ended, Ended::Exited(0), "{action}: {err}");
        }
    }

    #[test]
    fn clone3_fails_with_enosys_under_each_filter() {
        for action in [Action::Kill, Action::Log, Action::Trap] {
            let (ended, err) = in_child(action, sigsys_handler_in_child, clone3_call);
            assert_eq!(ended, Ended::Exited(0), "{action}: {err}");
        }
        assert!(!allowed_syscalls().contains(&libc::SYS_clone3));
    }

    #[test]
    fn clone_of_a_process_or_a_namespace_is_refused() {
        for body in [
            clone_a_process as fn() -> i32,
            clone_into_a_new_user_namespace,
            clone_thread_flags_and_a_new_mount_namespace,
        ] {
            let (ended, _) = in_child(Action::Kill, nothing, body);
            assert_eq!(ended, Ended::Signalled(libc::SIGSYS));
        }
        // The refused call is clone itself.
        let (ended, err) = in_child(
            Action::Trap,
            sigsys_handler_in_child,
            clone_into_a_new_user_namespace,
        );
        assert_eq!(ended, Ended::Signalled(libc::SIGSYS));
        assert!(
            err.contains(&format!("refused system call {} ", libc::SYS_clone)),
            "{err}"
        );
    }

    #[test]
    fn no_socket_is_made_once_serving() {
        // Syslog's connection is made before the filter and never made again.
        for body in [
            inet_socket as fn() -> i32,
            inet6_socket,
            netlink_socket,
            unix_socket,
        ] {
            let (ended, _) = in_child(Action::Kill, nothing, body);
            assert_eq!(ended, Ended::Signalled(libc::SIGSYS));
        }
        let (ended, err) = in_child(Action::Trap, sigsys_handler_in_child, inet_socket);
        assert_eq!(ended, Ended::Signalled(libc::SIGSYS));
        assert!(
            err.contains(&format!("refused system call {} ", libc::SYS_socket)),
            "{err}"
        );
        // log lets it run.
        let (ended, _) = in_child(Action::Log, nothing, inet_socket);
        assert_eq!(ended, Ended::Exited(RAN));
    }

    #[test]
    fn tgkill_to_another_process_is_refused() {
        let (ended, _) = in_child(Action::Kill, note_parent, tgkill_the_parent);
        assert_eq!(ended, Ended::Signalled(libc::SIGSYS));
        let (ended, _) = in_child(Action::Log, note_parent, tgkill_the_parent);
        assert_eq!(ended, Ended::Exited(RAN));
    }

    #[test]
    fn restricted_calls_are_not_allowed_unconditionally() {
        let allowed = allowed_syscalls();
        for r in RESTRICTED {
            assert!(!allowed.contains(&r.syscall), "{r:?}");
        }
        for nr in ANSWERED_ENOSYS {
            assert!(!allowed.contains(nr), "{nr}");
            assert!(RESTRICTED.iter().all(|r| r.syscall != *nr), "{nr}");
        }
        assert_eq!(THREAD_CLONE_FLAGS, 0x3d_0f00);
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
            assert_eq!(
                <Action as clap::ValueEnum>::from_str(a.as_str(), false),
                Ok(a)
            );
            assert_eq!(a.to_string(), a.as_str());
        }
        assert_eq!(Action::default(), Action::Kill);
        assert!(<Action as clap::ValueEnum>::from_str("maybe", false).is_err());
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
