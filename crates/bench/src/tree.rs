//! The benchmark tree: generated once (deterministically) into `--tree DIR`, checked by a
//! marker file on later runs, and read completely before measuring so that the host's page,
//! dentry and inode caches are warm for every daemon alike.
//!
//! Layout: `dTTT/dSS/fFF` for 50 top directories × 20 subdirectories × 30 files (30,000 files
//! of 0–4096 bytes in 1,000 leaf directories), plus [`BIG_FILE`] (256 MiB) at the root and the
//! marker [`MARKER`].

use std::fs;
use std::io::{Read, Write};
use std::path::Path;

/// Top-level directories.
pub const TOP_DIRS: usize = 50;
/// Subdirectories per top-level directory.
pub const SUB_DIRS: usize = 20;
/// Files per leaf directory.
pub const FILES_PER_DIR: usize = 30;
/// Number of small files.
pub const SMALL_FILES: usize = TOP_DIRS * SUB_DIRS * FILES_PER_DIR;
/// The file of the sequential-read workload, at the root of the tree.
pub const BIG_FILE: &str = "seq-256m.bin";
/// Size of [`BIG_FILE`].
pub const BIG_FILE_SIZE: u64 = 256 << 20;
/// Marker written last: a tree without it is incomplete.
pub const MARKER: &str = ".virtiofsd-bench-tree";
/// Prefix of the scratch directories of the create-unlink workload.
pub const SCRATCH_PREFIX: &str = "bench-scratch-";

const MARKER_TEXT: &str = "virtiofsd-bench tree v1: 50x20 dirs, 30 files each, 0-4096 bytes\n";

/// Size of small file number `index` (0-based over the whole tree): 0 to 4096 bytes, spread
/// evenly and deterministically.
pub fn small_file_size(index: usize) -> usize {
    (index * 2_654_435_761) % 4097
}

/// What a host-side walk of the tree found (to check what the daemons report).
#[derive(Debug, Clone, Copy, Default)]
pub struct TreeStats {
    /// Directory entries below the root, without `.` and `..`.
    pub entries: u64,
    /// Directories below the root.
    pub dirs: u64,
    /// Regular files.
    pub files: u64,
    /// Bytes read while warming.
    pub bytes: u64,
}

/// Makes sure `dir` holds a complete benchmark tree: generates it if `dir` is missing or empty,
/// accepts it if it has the marker, refuses anything else. Returns whether it generated.
pub fn ensure(dir: &Path) -> Result<bool, String> {
    let empty = match fs::read_dir(dir) {
        Ok(mut it) => it.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
            true
        }
        Err(e) => return Err(format!("--tree {}: {e}", dir.display())),
    };
    if !empty {
        return match fs::read_to_string(dir.join(MARKER)) {
            Ok(t) if t == MARKER_TEXT => Ok(false),
            _ => Err(format!(
                "--tree {}: not empty and not a complete virtiofsd-bench tree (no valid {MARKER}); \
                 give a missing or empty directory to generate one",
                dir.display()
            )),
        };
    }
    generate(dir)?;
    Ok(true)
}

fn io_err(p: &Path, e: std::io::Error) -> String {
    format!("{}: {e}", p.display())
}

fn generate(dir: &Path) -> Result<(), String> {
    let mut content = vec![0u8; 4096];
    let mut index = 0;
    for t in 0..TOP_DIRS {
        let top = dir.join(format!("d{t:03}"));
        fs::create_dir(&top).map_err(|e| io_err(&top, e))?;
        for s in 0..SUB_DIRS {
            let sub = top.join(format!("d{s:02}"));
            fs::create_dir(&sub).map_err(|e| io_err(&sub, e))?;
            for f in 0..FILES_PER_DIR {
                let len = small_file_size(index);
                for (j, b) in content[..len].iter_mut().enumerate() {
                    *b = b'a' + ((index + j) % 26) as u8;
                }
                let p = sub.join(format!("f{f:02}"));
                fs::write(&p, &content[..len]).map_err(|e| io_err(&p, e))?;
                index += 1;
            }
        }
    }
    let big = dir.join(BIG_FILE);
    let mut f = fs::File::create(&big).map_err(|e| io_err(&big, e))?;
    let mut chunk = vec![0u8; 1 << 20];
    for i in 0..(BIG_FILE_SIZE >> 20) {
        for (j, b) in chunk.iter_mut().enumerate() {
            *b = (i as usize + j / 4096) as u8;
        }
        f.write_all(&chunk).map_err(|e| io_err(&big, e))?;
    }
    f.sync_all().map_err(|e| io_err(&big, e))?;
    let marker = dir.join(MARKER);
    fs::write(&marker, MARKER_TEXT).map_err(|e| io_err(&marker, e))
}

/// Removes scratch directories a crashed earlier run of the create-unlink workload left behind.
pub fn remove_scratch(dir: &Path) -> Result<usize, String> {
    let mut n = 0;
    for e in fs::read_dir(dir).map_err(|e| io_err(dir, e))?.flatten() {
        if e.file_name().to_string_lossy().starts_with(SCRATCH_PREFIX) {
            fs::remove_dir_all(e.path()).map_err(|err| io_err(&e.path(), err))?;
            n += 1;
        }
    }
    Ok(n)
}

/// Reads every directory and file of the tree (warming the host caches) and counts them.
pub fn warm(dir: &Path) -> Result<TreeStats, String> {
    let mut stats = TreeStats::default();
    let mut buf = vec![0u8; 1 << 20];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).map_err(|e| io_err(&d, e))? {
            let e = e.map_err(|e| io_err(&d, e))?;
            stats.entries += 1;
            let ft = e.file_type().map_err(|err| io_err(&e.path(), err))?;
            if ft.is_dir() {
                stats.dirs += 1;
                stack.push(e.path());
            } else if ft.is_file() {
                stats.files += 1;
                let p = e.path();
                let mut f = fs::File::open(&p).map_err(|e| io_err(&p, e))?;
                loop {
                    let n = f.read(&mut buf).map_err(|e| io_err(&p, e))?;
                    if n == 0 {
                        break;
                    }
                    stats.bytes += n as u64;
                }
            }
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_cover_zero_to_a_page() {
        let sizes: Vec<usize> = (0..SMALL_FILES).map(small_file_size).collect();
        assert!(sizes.iter().all(|&s| s <= 4096));
        assert!(sizes.contains(&0));
        assert!(sizes.iter().any(|&s| s > 4000));
        assert_eq!(SMALL_FILES, 30_000);
    }
}
