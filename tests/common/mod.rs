//! Shared harness of the in-process integration tests: runs `daemon::serve` in a thread on a
//! fresh shared directory, connects the test frontend (which plays QEMU and the guest kernel),
//! and offers small helpers to inspect the host side.
//!
//! Layout of one test's files:
//! - `base/share/`   the shared directory (empty at start);
//! - `base/outside/` a sibling directory with a sentinel file `secret`, which no request may
//!   ever reach;
//! - `sock/vfs.sock` the vhost-user socket, in a directory of its own.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use virtiofsd::daemon::{self, DaemonConfig, DaemonError, SocketSpec};
use virtiofsd::fuse::abi::{self, InitOut, ROOT_ID};
use virtiofsd::idmap::{IdMap, Translation};
use virtiofsd::passthrough::xattrmap::XattrMap;
use virtiofsd::passthrough::{CacheMode, Config, InodeFileHandles, Negotiate};
use virtiofsd_frontend::{FrontendConfig, FsFrontend, FuseClient};

/// Content of `outside/secret`.
pub const SECRET: &[u8] = b"host secret, never to be served\n";

/// Sets the umask of the test process to 0 (once), as the real daemon does at start, so that
/// the modes the tests ask for are exactly the modes the host gets.
pub fn clear_umask() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: umask has no memory-safety preconditions.
        unsafe { libc::umask(0) };
    });
}

/// How to start a daemon for one test.
#[derive(Debug, Clone)]
pub struct Options {
    pub cache: CacheMode,
    pub xattr: bool,
    pub readonly: bool,
    pub readdirplus: bool,
    pub writeback: bool,
    pub thread_pool_size: usize,
    pub tag: Option<String>,
    /// Request queues the frontend sets up.
    pub queues: usize,
    /// Send FUSE_INIT (Linux 6.x style) on request queue 0 before handing over.
    pub init: bool,
    /// The INIT flags sent (default: the frontend's Linux 6.x flags, which offer
    /// `NO_OPEN_SUPPORT` and `NO_OPENDIR_SUPPORT`).
    pub init_flags: u64,
    pub frontend: FrontendConfig,
    /// uid/gid translation (`--translate-uid`, `--translate-gid`); empty by default.
    pub translate: Translation,
    /// `--xattrmap` rules (parsed when the daemon starts).
    pub xattrmap: Option<String>,
    pub posix_acl: Negotiate,
    pub security_label: Negotiate,
    pub killpriv_v2: bool,
    /// Bytes all directory listings may hold (`Config::listing_memory`).
    pub listing_memory: usize,
    /// `--max-nodes` (`None`: the default).
    pub max_nodes: Option<usize>,
    /// `--poll-window` (zero: no polling, the daemon's default).
    pub poll_window: std::time::Duration,
    /// Serve a fresh, small ext4 file system (loop-mounted on the shared directory) instead of
    /// a directory of the temporary file system: one block group, so a freed inode number is
    /// the next one given (needs root).
    pub ext4_share: bool,
    pub inode_file_handles: InodeFileHandles,
    /// Serve this existing directory instead of a fresh `base/share` (a migration destination
    /// serving its source's directory).
    pub share_at: Option<PathBuf>,
    /// `--migration-*`.
    pub migration: virtiofsd::migration::Options,
    /// Host locks for the guest's `fcntl` locks (`--posix-lock`) and `flock` locks (`--flock`).
    pub posix_lock: bool,
    pub flock: bool,
    /// `Config::max_lock_fds` (`None`: the default).
    pub max_lock_fds: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cache: CacheMode::Auto,
            xattr: false,
            readonly: false,
            readdirplus: true,
            writeback: false,
            thread_pool_size: 0,
            tag: None,
            queues: 1,
            init: true,
            init_flags: virtiofsd_frontend::fuse_client::DEFAULT_INIT_FLAGS,
            frontend: FrontendConfig {
                mem_size: 32 << 20,
                timeout: Duration::from_secs(10),
                ..Default::default()
            },
            translate: Translation::default(),
            xattrmap: None,
            posix_acl: Negotiate::Never,
            security_label: Negotiate::Never,
            killpriv_v2: false,
            listing_memory: virtiofsd::passthrough::config::DEFAULT_LISTING_MEMORY,
            max_nodes: None,
            poll_window: std::time::Duration::ZERO,
            ext4_share: false,
            inode_file_handles: InodeFileHandles::default(),
            share_at: None,
            migration: virtiofsd::migration::Options::default(),
            posix_lock: true,
            flock: true,
            max_lock_fds: None,
        }
    }
}

impl Options {
    pub fn xattr(mut self) -> Self {
        self.xattr = true;
        self
    }

    pub fn readonly(mut self) -> Self {
        self.readonly = true;
        self
    }

    pub fn cache(mut self, cache: CacheMode) -> Self {
        self.cache = cache;
        self
    }

    pub fn pool(mut self, n: usize) -> Self {
        self.thread_pool_size = n;
        self
    }

    pub fn queues(mut self, n: usize) -> Self {
        self.queues = n;
        self
    }

    pub fn no_init(mut self) -> Self {
        self.init = false;
        self
    }

    /// INIT without `NO_OPEN_SUPPORT` / `NO_OPENDIR_SUPPORT` (a guest that always opens).
    pub fn without_no_open(mut self) -> Self {
        self.init_flags &= !(virtiofsd::fuse::abi::init::NO_OPEN_SUPPORT
            | virtiofsd::fuse::abi::init::NO_OPENDIR_SUPPORT);
        self
    }

    pub fn writeback(mut self) -> Self {
        self.writeback = true;
        self
    }

    pub fn no_readdirplus(mut self) -> Self {
        self.readdirplus = false;
        self
    }

    pub fn tag(mut self, tag: &str) -> Self {
        self.tag = Some(tag.to_string());
        self
    }

    /// Adjusts the frontend configuration.
    pub fn frontend(mut self, f: impl FnOnce(&mut FrontendConfig)) -> Self {
        f(&mut self.frontend);
        self
    }

    /// Translates uids with these `--translate-uid` rules (panics on a refused rule).
    pub fn translate_uid(mut self, rules: &[&str]) -> Self {
        self.translate.uid =
            IdMap::parse("--translate-uid", rules).unwrap_or_else(|e| panic!("{e}"));
        self
    }

    /// Translates gids with these `--translate-gid` rules (panics on a refused rule).
    pub fn translate_gid(mut self, rules: &[&str]) -> Self {
        self.translate.gid =
            IdMap::parse("--translate-gid", rules).unwrap_or_else(|e| panic!("{e}"));
        self
    }

    /// `--xattrmap=RULES` (implies `--xattr`).
    pub fn xattrmap(mut self, rules: &str) -> Self {
        self.xattrmap = Some(rules.to_string());
        self.xattr = true;
        self
    }

    /// `--posix-acl=MODE` (implies `--xattr`).
    pub fn posix_acl(mut self, mode: Negotiate) -> Self {
        self.posix_acl = mode;
        self.xattr = true;
        self
    }

    /// `--security-label=MODE` (implies `--xattr`).
    pub fn security_label(mut self, mode: Negotiate) -> Self {
        self.security_label = mode;
        self.xattr = true;
        self
    }

    /// `--killpriv-v2`.
    pub fn inode_file_handles(mut self, mode: InodeFileHandles) -> Self {
        self.inode_file_handles = mode;
        self
    }

    pub fn ext4_share(mut self) -> Self {
        self.ext4_share = true;
        self
    }

    /// The same options without `ext4_share` (a migration destination serves its source's
    /// file system, mounted already).
    pub fn ext4_share_off(mut self) -> Self {
        self.ext4_share = false;
        self
    }

    pub fn killpriv_v2(mut self) -> Self {
        self.killpriv_v2 = true;
        self
    }

    /// `--max-nodes`.
    pub fn poll_window(mut self, w: std::time::Duration) -> Self {
        self.poll_window = w;
        self
    }

    pub fn max_nodes(mut self, n: usize) -> Self {
        self.max_nodes = Some(n);
        self
    }

    /// Bytes all directory listings may hold together.
    pub fn listing_memory(mut self, bytes: usize) -> Self {
        self.listing_memory = bytes;
        self
    }

    /// Serves `dir` (which exists) instead of a fresh directory.
    pub fn share_at(mut self, dir: &Path) -> Self {
        self.share_at = Some(dir.to_owned());
        self
    }

    /// `--migration-*`.
    pub fn migration(mut self, m: virtiofsd::migration::Options) -> Self {
        self.migration = m;
        self
    }

    /// How long the frontend waits for each reply.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.frontend.timeout = t;
        self
    }
}

/// A daemon serving a fresh directory to a connected frontend.
pub struct Daemon {
    /// The shared directory (`base/share`).
    pub share: PathBuf,
    /// A sibling of the shared directory holding `secret`.
    pub outside: PathBuf,
    pub socket: PathBuf,
    pub fe: FsFrontend,
    /// Client on request queue 0.
    pub c: FuseClient,
    /// The INIT reply, when the harness sent INIT.
    pub init: Option<InitOut>,
    thread: Option<JoinHandle<Result<(), DaemonError>>>,
    /// The share is a loop-mounted file system, unmounted on drop.
    mounted: bool,
    _sock_dir: TempDir,
    _base: TempDir,
}

impl Daemon {
    /// A daemon with default options, INIT done.
    pub fn start() -> Daemon {
        Daemon::with(Options::default())
    }

    pub fn with(opts: Options) -> Daemon {
        clear_umask();
        let base = tempfile::tempdir().expect("tempdir");
        let outside = base.path().join("outside");
        let share = match &opts.share_at {
            Some(dir) => dir.clone(),
            None => {
                let share = base.path().join("share");
                fs::create_dir(&share).unwrap();
                fs::set_permissions(&share, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                    .unwrap();
                share
            }
        };
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("secret"), SECRET).unwrap();
        if opts.ext4_share {
            mount_small_ext4(&base.path().join("ext4.img"), &share);
        }
        let sock_dir = tempfile::tempdir().expect("tempdir");
        let socket = sock_dir.path().join("vfs.sock");

        let mut fs_cfg = Config::new(&share, opts.cache);
        fs_cfg.xattr = opts.xattr;
        fs_cfg.readonly = opts.readonly;
        fs_cfg.readdirplus = opts.readdirplus;
        fs_cfg.writeback = opts.writeback;
        fs_cfg.xattrmap = opts
            .xattrmap
            .as_deref()
            .map(|r| XattrMap::parse(r).unwrap_or_else(|e| panic!("--xattrmap: {e}")));
        fs_cfg.posix_acl = opts.posix_acl;
        fs_cfg.security_label = opts.security_label;
        fs_cfg.killpriv_v2 = opts.killpriv_v2;
        fs_cfg.listing_memory = opts.listing_memory;
        if let Some(n) = opts.max_nodes {
            fs_cfg.max_nodes = n;
        }
        fs_cfg.inode_file_handles = opts.inode_file_handles;
        fs_cfg.migration = opts.migration;
        fs_cfg.posix_lock = opts.posix_lock;
        fs_cfg.flock = opts.flock;
        if let Some(n) = opts.max_lock_fds {
            fs_cfg.max_lock_fds = n;
        }
        let cfg = DaemonConfig {
            fs: fs_cfg,
            socket: SocketSpec::Path(socket.clone()),
            tag: opts.tag.clone(),
            thread_pool_size: opts.thread_pool_size,
            poll_window: opts.poll_window,
            translate: opts.translate.clone(),
            uid_map: Vec::new(),
            gid_map: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name("virtiofsd-serve".into())
            .spawn(move || daemon::serve(cfg))
            .expect("spawn serve thread");

        let mut fe = FsFrontend::connect_with(&socket, opts.queues, &opts.frontend)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", socket.display()));
        let mut c = fe.client(0).expect("client on request queue 0");
        let init = if opts.init {
            use virtiofsd_frontend::fuse_client::{DEFAULT_MAX_READAHEAD, INIT_MINOR};
            Some(
                c.init_with(INIT_MINOR, opts.init_flags, DEFAULT_MAX_READAHEAD, true)
                    .expect("FUSE_INIT"),
            )
        } else {
            None
        };
        Daemon {
            share,
            outside,
            socket,
            fe,
            c,
            init,
            thread: Some(thread),
            mounted: opts.ext4_share,
            _sock_dir: sock_dir,
            _base: base,
        }
    }

    /// A client on request queue `n` (n ≥ 1; queue 0 is `self.c`) that knows the INIT reply.
    pub fn client(&mut self, n: usize) -> FuseClient {
        let mut c = self.fe.client(n).expect("client");
        if let Some(i) = self.init {
            c.set_init_out(i);
        }
        c
    }

    /// `share/rel` on the host.
    pub fn host(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.share.join(rel)
    }

    /// Looks `name` up in the root directory and returns its node id (panics on error).
    pub fn node(&mut self, name: &str) -> u64 {
        self.c
            .lookup(ROOT_ID, name)
            .unwrap_or_else(|e| panic!("lookup {name}: errno {e}"))
            .nodeid
    }

    /// Creates the host file `share/rel` with `data` and returns its node id.
    pub fn file(&mut self, rel: &str, data: &[u8]) -> u64 {
        fs::write(self.host(rel), data).unwrap();
        self.node(rel)
    }

    /// Opens `nodeid` with `flags` and returns the handle (panics on error).
    pub fn open(&mut self, nodeid: u64, flags: i32) -> u64 {
        self.c
            .open(nodeid, flags as u32)
            .unwrap_or_else(|e| panic!("open node {nodeid}: errno {e}"))
            .fh
    }

    /// What the host directory tree (share and outside) looks like now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::of(self.share.parent().expect("base"))
    }

    /// Disconnects the frontend and checks that `serve` returned `Ok` (bounded wait) and
    /// removed the socket.
    pub fn finish(mut self) {
        self.fe.disconnect();
        let t = self.thread.take().expect("serve thread");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !t.is_finished() {
            assert!(
                Instant::now() < deadline,
                "serve() did not return after the frontend disconnected"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("serve() failed: {e}"),
            Err(_) => panic!("serve() panicked"),
        }
        assert!(
            !self.socket.exists(),
            "socket {} left behind",
            self.socket.display()
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.mounted {
            let p = CString::new(self.share.as_os_str().as_bytes()).unwrap();
            // SAFETY: `p` is a NUL-terminated path; a lazy unmount detaches it even if busy.
            unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Makes a 16 MiB ext4 file system in `image` (one block group, a journal, 512 inodes) and
/// mounts it on `at`, mode 0755.
pub fn mount_small_ext4(image: &Path, at: &Path) {
    let run = |cmd: &mut std::process::Command| {
        let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let f = fs::File::create(image).unwrap();
    f.set_len(16 << 20).unwrap();
    drop(f);
    let mkfs = ["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("mkfs.ext4");
    run(std::process::Command::new(mkfs)
        .args([
            "-q",
            "-F",
            "-b",
            "4096",
            "-N",
            "512",
            "-E",
            "lazy_itable_init=0",
        ])
        .arg(image));
    run(std::process::Command::new("mount")
        .args(["-o", "loop"])
        .arg(image)
        .arg(at));
    fs::set_permissions(at, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

/// Metadata of one host path, enough to notice any change but atime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub size: u64,
    pub rdev: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
    /// File contents (regular files) or link target (symlinks).
    pub data: Vec<u8>,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Every path under a directory with its [`NodeState`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot(pub BTreeMap<PathBuf, NodeState>);

impl Snapshot {
    pub fn of(root: &Path) -> Snapshot {
        let mut map = BTreeMap::new();
        walk(root, root, &mut map);
        Snapshot(map)
    }

    /// Panics with the paths that differ.
    pub fn assert_same(&self, later: &Snapshot, what: &str) {
        if self == later {
            return;
        }
        let mut diffs = Vec::new();
        for (p, s) in &self.0 {
            match later.0.get(p) {
                None => diffs.push(format!("removed: {}", p.display())),
                Some(l) if l != s => {
                    diffs.push(format!("changed: {}: {s:?} -> {l:?}", p.display()))
                }
                _ => {}
            }
        }
        for p in later.0.keys() {
            if !self.0.contains_key(p) {
                diffs.push(format!("added: {}", p.display()));
            }
        }
        panic!("host changed by {what}:\n{}", diffs.join("\n"));
    }
}

fn walk(root: &Path, p: &Path, map: &mut BTreeMap<PathBuf, NodeState>) {
    let md = fs::symlink_metadata(p).unwrap();
    let ft = md.file_type();
    let data = if ft.is_file() {
        fs::read(p).unwrap()
    } else if ft.is_symlink() {
        fs::read_link(p).unwrap().as_os_str().as_bytes().to_vec()
    } else {
        Vec::new()
    };
    let xattrs = if ft.is_file() || ft.is_dir() {
        list_xattrs(p)
    } else {
        Vec::new()
    };
    let rel = p.strip_prefix(root).unwrap().to_path_buf();
    map.insert(
        rel,
        NodeState {
            mode: md.mode(),
            uid: md.uid(),
            gid: md.gid(),
            nlink: md.nlink(),
            size: md.size(),
            rdev: md.rdev(),
            mtime: (md.mtime(), md.mtime_nsec()),
            ctime: (md.ctime(), md.ctime_nsec()),
            data,
            xattrs,
        },
    );
    if ft.is_dir() {
        for e in fs::read_dir(p).unwrap() {
            walk(root, &e.unwrap().path(), map);
        }
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// The `user.*` (and any other readable) extended attributes of `p`, without following a
/// symlink.
pub fn list_xattrs(p: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let c = cpath(p);
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: `c` is NUL-terminated and `buf` is writable for its length.
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return Vec::new();
    }
    buf.truncate(n as usize);
    let mut out = Vec::new();
    for name in buf.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        if let Some(v) = host_getxattr(p, name) {
            out.push((name.to_vec(), v));
        }
    }
    out.sort();
    out
}

/// The value of the extended attribute `name` of `p` (not following symlinks).
pub fn host_getxattr(p: &Path, name: &[u8]) -> Option<Vec<u8>> {
    let c = cpath(p);
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: both strings are NUL-terminated and `buf` is writable for its length.
    let r = unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return None;
    }
    buf.truncate(r as usize);
    Some(buf)
}

/// Sets an extended attribute on the host path `p` (following symlinks).
pub fn host_setxattr(p: &Path, name: &[u8], value: &[u8]) {
    let c = cpath(p);
    let n = CString::new(name).unwrap();
    // SAFETY: both strings are NUL-terminated and `value` is readable for its length.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "setxattr {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

/// `makedev` as the kernel encodes it for FUSE (`new_encode_dev`).
pub fn fuse_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

/// A `fuse_setattr_in` with `valid` and nothing else set.
pub fn setattr_in(valid: u32) -> abi::SetattrIn {
    abi::SetattrIn {
        valid,
        ..Default::default()
    }
}

/// A deterministic byte pattern.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

/// Waits (bounded) for the child to exit; returns its status and stderr.
pub fn wait_exit(mut child: std::process::Child) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("virtiofsd did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut err).unwrap();
    }
    (status, err)
}

/// A shared directory and a socket path for one run of the daemon binary.
pub struct RunDirs {
    _tmp: TempDir,
    pub share: PathBuf,
    pub socket: PathBuf,
}

/// A fresh, empty shared directory (`share/`) and a socket path next to it; clears the umask.
pub fn run_dirs() -> RunDirs {
    clear_umask();
    let tmp = tempfile::tempdir().unwrap();
    let share = tmp.path().join("share");
    fs::create_dir(&share).unwrap();
    let socket = tmp.path().join("vfs.sock");
    RunDirs {
        _tmp: tmp,
        share,
        socket,
    }
}

/// The process serving for the started `parent`: its only child.
pub fn serving_child(parent: &std::process::Child) -> u32 {
    let pid = parent.id();
    let path = format!("/proc/{pid}/task/{pid}/children");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let children = fs::read_to_string(&path).unwrap_or_default();
        let pids: Vec<u32> = children
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        match pids.as_slice() {
            [one] => return *one,
            [] => assert!(
                std::time::Instant::now() < deadline,
                "no serving child of {pid}"
            ),
            more => panic!("{pid} has several children: {more:?}"),
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Makes a chain of `depth` directories `d` in `dir`, one `mkdirat` in the one above at a time
/// (its path is far past `PATH_MAX`).
pub fn make_chain(dir: &Path, depth: usize) {
    let mut cur: std::os::fd::OwnedFd = fs::File::open(dir).unwrap().into();
    for _ in 0..depth {
        // SAFETY: `cur` is an open directory; the name is a NUL-terminated literal.
        let r = unsafe { libc::mkdirat(cur.as_raw_fd(), c"d".as_ptr(), 0o755) };
        assert_eq!(r, 0, "mkdirat: {}", std::io::Error::last_os_error());
        cur = open_dir_at(&cur, c"d").expect("the directory just made");
    }
}

fn open_dir_at(dir: &std::os::fd::OwnedFd, name: &std::ffi::CStr) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `dir` is open; the name is NUL-terminated.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) };
    // SAFETY: a descriptor just opened, ours alone.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Removes a chain of directories `d` in `dir` (as [`make_chain`] makes) and the files and
/// empty directories at its bottom, without recursion: `fs::remove_dir_all` (and so a `TempDir`'s
/// drop) makes one nested call per level.
pub fn remove_chain(dir: &Path) {
    let mut cur: std::os::fd::OwnedFd = fs::File::open(dir).unwrap().into();
    let mut depth = 0;
    while let Some(next) = open_dir_at(&cur, c"d") {
        cur = next;
        depth += 1;
    }
    for e in fs::read_dir(format!("/proc/self/fd/{}", cur.as_raw_fd())).unwrap() {
        let name = CString::new(e.unwrap().file_name().as_bytes()).unwrap();
        // SAFETY: `cur` is open; the name is NUL-terminated.
        if unsafe { libc::unlinkat(cur.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) } != 0 {
            // SAFETY: as above.
            unsafe { libc::unlinkat(cur.as_raw_fd(), name.as_ptr(), 0) };
        }
    }
    for _ in 0..depth {
        cur = open_dir_at(&cur, c"..").expect("..");
        // SAFETY: as above.
        let r = unsafe { libc::unlinkat(cur.as_raw_fd(), c"d".as_ptr(), libc::AT_REMOVEDIR) };
        assert_eq!(r, 0, "rmdir: {}", std::io::Error::last_os_error());
    }
}
