//! The passthrough file system as a migration destination, fed a forged state.
//!
//! The share holds a chain of 64 directories `d`, a file `f` at its bottom and in the root, a
//! symlink `out` to outside the share; a sentinel sits next to the share. Each input is loaded
//! into a fresh file system, then a few requests run on the ids it may have restored. Nothing
//! may panic or abort (a deep chain of parents, millions of ranges), and nothing outside the
//! share may change.
//!
//! Input: one byte of options (bit 0: `--migration-on-error=guest-error`, else `abort`; bit 1:
//! `--migration-mode=file-handles`; bit 2: `--max-nodes=16`, else a million; bit 3: the session
//! agreed on POSIX and flock locks first, as a destination's INIT flags do, so that a locks
//! section is taken), then the file system's section of a state (`next node id`, `next handle`,
//! nodes, handles, ranges of stale ids, the guest's locks), without the container: a checksum
//! would stop every mutation at the door. The locks a state carries are real locks on the
//! share's files, dropped with the file system.
use std::path::PathBuf;
use std::sync::OnceLock;

use virtiofs_fuse::abi::{init, ROOT_ID};
use virtiofs_fuse::filesystem::{Context, FileSystem};
use virtiofs_fuse::migration::Decoder;
use virtiofsd::migration::{Mode, OnError};
use virtiofsd::passthrough::config::{CacheMode, Config};
use virtiofsd::passthrough::PassthroughFs;

const SENTINEL: &[u8] = b"sentinel: must never change\n";
/// Directories of the chain in the share.
pub const CHAIN: usize = 64;

struct Dirs {
    base: PathBuf,
    root: PathBuf,
}

fn dirs() -> &'static Dirs {
    static DIRS: OnceLock<Dirs> = OnceLock::new();
    DIRS.get_or_init(|| {
        let base = std::env::temp_dir().join(format!("virtiofsd-fuzz-mig-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("outside")).unwrap();
        std::fs::write(base.join("outside/file"), SENTINEL).unwrap();
        std::fs::write(base.join("sentinel"), SENTINEL).unwrap();
        let root = base.join("root");
        let mut p = root.clone();
        for _ in 0..CHAIN {
            p.push("d");
        }
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("f"), b"f").unwrap();
        std::fs::write(root.join("f"), b"f").unwrap();
        std::os::unix::fs::symlink("../outside", root.join("out")).unwrap();
        extern "C" fn cleanup() {
            if let Some(d) = DIRS.get() {
                let _ = std::fs::remove_dir_all(&d.base);
            }
        }
        // SAFETY: registers a plain `extern "C"` function to run at exit.
        unsafe { libc::atexit(cleanup) };
        Dirs { base, root }
    })
}

fn check_outside(d: &Dirs) {
    let read = |p: &str| std::fs::read(d.base.join(p)).ok();
    assert_eq!(
        read("sentinel").as_deref(),
        Some(SENTINEL),
        "the sentinel changed"
    );
    assert_eq!(
        read("outside/file").as_deref(),
        Some(SENTINEL),
        "outside changed"
    );
}

/// Runs one input; panics on a broken invariant.
pub fn run(data: &[u8]) {
    let Some((&opts, state)) = data.split_first() else {
        return;
    };
    let d = dirs();
    {
        let mut cfg = Config::new(&d.root, CacheMode::Auto);
        if opts & 1 != 0 {
            cfg.migration.on_error = OnError::GuestError;
        }
        if opts & 2 != 0 {
            cfg.migration.mode = Mode::FileHandles;
        }
        cfg.max_nodes = if opts & 4 != 0 { 16 } else { 1 << 20 };
        let fs = PassthroughFs::new(cfg).expect("open the shared directory");
        if opts & 8 != 0 {
            let _ = fs.init(init::POSIX_LOCKS | init::FLOCK_LOCKS);
        }
        let loaded = fs.load_state(&mut Decoder::new(state));
        if loaded.is_ok() {
            let ctx = Context::default();
            for id in (ROOT_ID..ROOT_ID + 80).chain([u64::MAX, 1 << 40]) {
                if fs.getattr(&ctx, id, None).is_ok() {
                    let _ = fs.lookup(&ctx, id, c"f");
                    let _ = fs.lookup(&ctx, id, c"..");
                    if let Ok(o) = fs.opendir(&ctx, id, 0) {
                        if let Some(h) = o.handle {
                            let _ = fs.releasedir(&ctx, id, 0, h);
                        }
                    }
                }
                fs.forget(&ctx, id, 1);
            }
        }
    }
    check_outside(d);
}
