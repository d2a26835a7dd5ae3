//! FUSE wire format: opcodes, flags and the `#[repr(C)]` structs the Linux kernel exchanges with a
//! FUSE server (as in `include/uapi/linux/fuse.h`, protocol 7.x).
//!
//! Every struct here is plain old data. The [`Pod`] trait marks them so that the server can read
//! them from and write them to raw bytes; the layout of each is proven at compile time by the
//! `wire!` macro that declares it (the size of the Linux header's struct, and no padding).
//! Nothing here knows about virtio.

/// Protocol major version spoken by this server.
pub const KERNEL_VERSION: u32 = 7;
/// Highest protocol minor version this server implements.
///
/// 7.41 is the first minor with `FUSE_ALLOW_IDMAP`. What 7.39 to 7.41 added needs nothing from
/// a server that does not use it: `FUSE_STATX` (7.39) gets `ENOSYS` and the kernel falls back to
/// GETATTR; `fuse_open_out::backing_id` and `fuse_init_out::max_stack_depth` (7.40) are read
/// only with `FOPEN_PASSTHROUGH` / `FUSE_PASSTHROUGH`, which this server never sets; resent
/// requests (`FUSE_HAS_RESEND`, 7.40) only follow a `FUSE_NOTIFY_RESEND` from the server.
pub const KERNEL_MINOR_VERSION: u32 = 41;
/// First minor version with `init::ALLOW_IDMAP`.
pub const ALLOW_IDMAP_MINOR_VERSION: u32 = 41;
/// Lowest minor version accepted from a client (Linux 5.4 speaks 7.31).
pub const MIN_KERNEL_MINOR_VERSION: u32 = 27;
/// Node id of the root directory.
pub const ROOT_ID: u64 = 1;

/// Declares the request opcodes once: the numbers (module [`opcode`]), the [`Opcode`] enum,
/// its conversion from a number and its name (the constant's, as `fuse.h` spells it without the
/// `FUSE_` prefix).
macro_rules! opcodes {
    ($($variant:ident = $name:ident = $num:literal,)*) => {
        /// Request opcodes, as numbers (`fuse_in_header::opcode`).
        pub mod opcode {
            $(pub const $name: u32 = $num;)*
        }

        /// A request's opcode: every one the protocol defines, served or not.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(u32)]
        pub enum Opcode {
            $($variant = $num,)*
        }

        impl TryFrom<u32> for Opcode {
            type Error = UnknownOpcode;

            fn try_from(n: u32) -> Result<Self, UnknownOpcode> {
                match n {
                    $($num => Ok(Opcode::$variant),)*
                    _ => Err(UnknownOpcode(n)),
                }
            }
        }

        impl Opcode {
            /// The name messages give the opcode: `"LOOKUP"`, `"COPY_FILE_RANGE"`.
            pub fn name(self) -> &'static str {
                match self {
                    $(Opcode::$variant => stringify!($name),)*
                }
            }
        }
    };
}

opcodes! {
    Lookup = LOOKUP = 1,
    Forget = FORGET = 2,
    Getattr = GETATTR = 3,
    Setattr = SETATTR = 4,
    Readlink = READLINK = 5,
    Symlink = SYMLINK = 6,
    Mknod = MKNOD = 8,
    Mkdir = MKDIR = 9,
    Unlink = UNLINK = 10,
    Rmdir = RMDIR = 11,
    Rename = RENAME = 12,
    Link = LINK = 13,
    Open = OPEN = 14,
    Read = READ = 15,
    Write = WRITE = 16,
    Statfs = STATFS = 17,
    Release = RELEASE = 18,
    Fsync = FSYNC = 20,
    Setxattr = SETXATTR = 21,
    Getxattr = GETXATTR = 22,
    Listxattr = LISTXATTR = 23,
    Removexattr = REMOVEXATTR = 24,
    Flush = FLUSH = 25,
    Init = INIT = 26,
    Opendir = OPENDIR = 27,
    Readdir = READDIR = 28,
    Releasedir = RELEASEDIR = 29,
    Fsyncdir = FSYNCDIR = 30,
    Getlk = GETLK = 31,
    Setlk = SETLK = 32,
    Setlkw = SETLKW = 33,
    Access = ACCESS = 34,
    Create = CREATE = 35,
    Interrupt = INTERRUPT = 36,
    Bmap = BMAP = 37,
    Destroy = DESTROY = 38,
    Ioctl = IOCTL = 39,
    Poll = POLL = 40,
    NotifyReply = NOTIFY_REPLY = 41,
    BatchForget = BATCH_FORGET = 42,
    Fallocate = FALLOCATE = 43,
    Readdirplus = READDIRPLUS = 44,
    Rename2 = RENAME2 = 45,
    Lseek = LSEEK = 46,
    CopyFileRange = COPY_FILE_RANGE = 47,
    SetupMapping = SETUPMAPPING = 48,
    RemoveMapping = REMOVEMAPPING = 49,
    Syncfs = SYNCFS = 50,
    Tmpfile = TMPFILE = 51,
    Statx = STATX = 52,
}

/// A number no opcode of the protocol has: the request gets `ENOSYS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown opcode {0}")]
pub struct UnknownOpcode(pub u32);

impl Opcode {
    /// Whether a request of this opcode carries the creator's uid/gid when
    /// `init::ALLOW_IDMAP` was agreed (RENAME2 only with `RENAME_WHITEOUT`, which the caller
    /// checks).
    pub fn carries_creator_ids(self) -> bool {
        matches!(
            self,
            Opcode::Mknod
                | Opcode::Mkdir
                | Opcode::Symlink
                | Opcode::Create
                | Opcode::Tmpfile
                | Opcode::Rename2
        )
    }
}

impl std::fmt::Display for Opcode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An opcode number as messages show it: the name of a known opcode (`LOOKUP`), the number of
/// any other.
#[derive(Debug, Clone, Copy)]
pub struct OpcodeName(pub u32);

impl std::fmt::Display for OpcodeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match Opcode::try_from(self.0) {
            Ok(op) => f.write_str(op.name()),
            Err(_) => write!(f, "{}", self.0),
        }
    }
}

/// `FUSE_INIT` flags (`flags` is the low 32 bits, `flags2` the high 32 bits).
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const POSIX_LOCKS: u64 = 1 << 1;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const FLOCK_LOCKS: u64 = 1 << 10;
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const NO_OPEN_SUPPORT: u64 = 1 << 17;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const HANDLE_KILLPRIV: u64 = 1 << 19;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const ABORT_ERROR: u64 = 1 << 21;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    pub const EXPLICIT_INVAL_DATA: u64 = 1 << 25;
    pub const MAP_ALIGNMENT: u64 = 1 << 26;
    pub const SUBMOUNTS: u64 = 1 << 27;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const SETXATTR_EXT: u64 = 1 << 29;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const SECURITY_CTX: u64 = 1 << 32;
    pub const HAS_INODE_DAX: u64 = 1 << 33;
    pub const CREATE_SUPP_GROUP: u64 = 1 << 34;
    pub const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
    /// Idmapped mounts of this file system (7.41). The kernel accepts it only with
    /// `default_permissions` (always set for virtiofs) and then sends the caller's uid/gid,
    /// mapped through the mount, only with requests that create an inode (MKNOD, MKDIR, SYMLINK,
    /// CREATE, TMPFILE, RENAME2 with `RENAME_WHITEOUT`); every other request carries
    /// [`INVALID_UIDGID`](super::INVALID_UIDGID).
    pub const ALLOW_IDMAP: u64 = 1 << 40;
}

/// `fuse_in_header::{uid, gid}` of a request that carries no caller identity (with
/// `init::ALLOW_IDMAP`). Never a real id: Linux reserves `(uid_t)-1`, and without
/// `ALLOW_IDMAP` the kernel refuses (`EOVERFLOW`) or munges an unmapped id rather than send it.
pub const INVALID_UIDGID: u32 = u32::MAX;

/// `fuse_open_out::open_flags`.
pub mod fopen {
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const KEEP_CACHE: u32 = 1 << 1;
    pub const NONSEEKABLE: u32 = 1 << 2;
    pub const CACHE_DIR: u32 = 1 << 3;
    pub const STREAM: u32 = 1 << 4;
    pub const NOFLUSH: u32 = 1 << 5;
}

/// `fuse_setattr_in::valid`.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const LOCKOWNER: u32 = 1 << 9;
    pub const CTIME: u32 = 1 << 10;
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_attr::flags`: the directory is a mount point on the host (with `FUSE_SUBMOUNTS`).
pub const ATTR_SUBMOUNT: u32 = 1 << 0;

/// `fuse_getattr_in::getattr_flags`: `fh` is valid.
pub const GETATTR_FH: u32 = 1 << 0;
/// `fuse_write_in::write_flags`: the kernel writes back its page cache (with
/// `WRITEBACK_CACHE`); such a WRITE carries no caller (uid = gid = pid = 0).
pub const WRITE_CACHE: u32 = 1 << 0;
/// `fuse_write_in::write_flags`: kill suid/sgid (with `HANDLE_KILLPRIV_V2`).
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// `fuse_open_in::open_flags` / `fuse_create_in::open_flags`: kill suid/sgid on truncate.
pub const OPEN_KILL_SUIDGID: u32 = 1 << 0;
/// `fuse_fsync_in::fsync_flags`: only sync data.
pub const FSYNC_FDATASYNC: u32 = 1 << 0;
/// `fuse_release_in::release_flags`: flush before release.
pub const RELEASE_FLUSH: u32 = 1 << 0;
/// `fuse_release_in::release_flags`: drop the file's `flock` lock (`lock_owner` names it).
pub const RELEASE_FLOCK_UNLOCK: u32 = 1 << 1;
/// `fuse_lk_in::lk_flags`: a `flock(2)` lock, not a `fcntl` record lock.
pub const LK_FLOCK: u32 = 1 << 0;
/// `fuse_setxattr_in::setxattr_flags`: clear SGID when system.posix_acl_access is set.
pub const SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;

/// Marks a type as plain old data: any byte pattern of its size is a valid value, it has no
/// padding the compiler may leave uninitialised, and it can be copied from and to bytes.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, contain only integer fields (or arrays of them), and have
/// no implicit padding.
pub unsafe trait Pod: Copy + Default + Sized {
    /// Reads a value from the start of `bytes`, or `None` when `bytes` is too short.
    fn from_prefix(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < std::mem::size_of::<Self>() {
            return None;
        }
        // SAFETY: `bytes` holds at least `size_of::<Self>()` readable bytes, the read is
        // unaligned-safe, and the `Pod` contract makes every bit pattern a valid `Self`.
        Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Self>()) })
    }

    /// Views the value as its raw bytes.
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: `self` is a valid reference to `size_of::<Self>()` bytes, and the `Pod`
        // contract guarantees there is no uninitialised padding among them.
        unsafe {
            std::slice::from_raw_parts(
                (self as *const Self).cast::<u8>(),
                std::mem::size_of::<Self>(),
            )
        }
    }
}

/// Declares a wire struct: `#[repr(C)]`, [`Pod`], and a compile-time proof of its layout. The
/// struct's size must equal both the size the Linux header gives (`size N`) and the sum of its
/// fields' sizes: with `#[repr(C)]`, the latter means no padding anywhere, so every field sits
/// at the offset the kernel's C struct gives it.
macro_rules! wire {
    (
        $(#[$doc:meta])*
        size $size:literal;
        $(#[$attr:meta])*
        pub struct $name:ident { $($(#[$fattr:meta])* pub $field:ident: $ty:ty),* $(,)? }
    ) => {
        $(#[$doc])*
        #[repr(C)]
        $(#[$attr])*
        pub struct $name { $($(#[$fattr])* pub $field: $ty),* }

        const _: () = {
            assert!(
                std::mem::size_of::<$name>() == $size,
                concat!(stringify!($name), ": not the size of the Linux header's struct"),
            );
            assert!(
                std::mem::size_of::<$name>() == 0 $(+ std::mem::size_of::<$ty>())*,
                concat!(stringify!($name), ": has padding"),
            );
        };

        // SAFETY: `#[repr(C)]`, made only of integers (or arrays of them), and proven above to
        // have no padding: every byte pattern is a valid value and every byte is initialised.
        unsafe impl Pod for $name {}
    };
}

wire! {
    /// `struct fuse_in_header`.
    size 40;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct InHeader {
        pub len: u32,
        pub opcode: u32,
        pub unique: u64,
        pub nodeid: u64,
        pub uid: u32,
        pub gid: u32,
        pub pid: u32,
        pub total_extlen: u16,
        pub padding: u16,
    }
}

wire! {
    /// `struct fuse_out_header`.
    size 16;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct OutHeader {
        pub len: u32,
        pub error: i32,
        pub unique: u64,
    }
}

wire! {
    /// `struct fuse_attr`.
    size 88;
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct Attr {
        pub ino: u64,
        pub size: u64,
        pub blocks: u64,
        pub atime: u64,
        pub mtime: u64,
        pub ctime: u64,
        pub atimensec: u32,
        pub mtimensec: u32,
        pub ctimensec: u32,
        pub mode: u32,
        pub nlink: u32,
        pub uid: u32,
        pub gid: u32,
        pub rdev: u32,
        pub blksize: u32,
        pub flags: u32,
    }
}

wire! {
    /// `struct fuse_entry_out`.
    size 128;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct EntryOut {
        pub nodeid: u64,
        pub generation: u64,
        pub entry_valid: u64,
        pub attr_valid: u64,
        pub entry_valid_nsec: u32,
        pub attr_valid_nsec: u32,
        pub attr: Attr,
    }
}

wire! {
    /// `struct fuse_forget_in`.
    size 8;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct ForgetIn {
        pub nlookup: u64,
    }
}

wire! {
    /// `struct fuse_forget_one`.
    size 16;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct ForgetOne {
        pub nodeid: u64,
        pub nlookup: u64,
    }
}

wire! {
    /// `struct fuse_batch_forget_in`.
    size 8;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct BatchForgetIn {
        pub count: u32,
        pub dummy: u32,
    }
}

wire! {
    /// `struct fuse_getattr_in`.
    size 16;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct GetattrIn {
        pub getattr_flags: u32,
        pub dummy: u32,
        pub fh: u64,
    }
}

wire! {
    /// `struct fuse_attr_out`.
    size 104;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct AttrOut {
        pub attr_valid: u64,
        pub attr_valid_nsec: u32,
        pub dummy: u32,
        pub attr: Attr,
    }
}

wire! {
    /// `struct fuse_mknod_in`.
    size 16;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct MknodIn {
        pub mode: u32,
        pub rdev: u32,
        pub umask: u32,
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_mkdir_in`.
    size 8;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct MkdirIn {
        pub mode: u32,
        pub umask: u32,
    }
}

wire! {
    /// `struct fuse_rename_in`.
    size 8;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct RenameIn {
        pub newdir: u64,
    }
}

wire! {
    /// `struct fuse_rename2_in`.
    size 16;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct Rename2In {
        pub newdir: u64,
        pub flags: u32,
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_link_in`.
    size 8;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct LinkIn {
        pub oldnodeid: u64,
    }
}

wire! {
    /// `struct fuse_setattr_in`.
    size 88;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct SetattrIn {
        pub valid: u32,
        pub padding: u32,
        pub fh: u64,
        pub size: u64,
        pub lock_owner: u64,
        pub atime: u64,
        pub mtime: u64,
        pub ctime: u64,
        pub atimensec: u32,
        pub mtimensec: u32,
        pub ctimensec: u32,
        pub mode: u32,
        pub unused4: u32,
        pub uid: u32,
        pub gid: u32,
        pub unused5: u32,
    }
}

wire! {
    /// `struct fuse_open_in`.
    size 8;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct OpenIn {
        pub flags: u32,
        pub open_flags: u32,
    }
}

wire! {
    /// `struct fuse_create_in`.
    size 16;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct CreateIn {
        pub flags: u32,
        pub mode: u32,
        pub umask: u32,
        pub open_flags: u32,
    }
}

wire! {
    /// `struct fuse_open_out`.
    size 16;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct OpenOut {
        pub fh: u64,
        pub open_flags: u32,
        pub backing_id: i32,
    }
}

wire! {
    /// `struct fuse_release_in`.
    size 24;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct ReleaseIn {
        pub fh: u64,
        pub flags: u32,
        pub release_flags: u32,
        pub lock_owner: u64,
    }
}

wire! {
    /// `struct fuse_flush_in`.
    size 24;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct FlushIn {
        pub fh: u64,
        pub unused: u32,
        pub padding: u32,
        pub lock_owner: u64,
    }
}

wire! {
    /// `struct fuse_file_lock`: `end` is inclusive, `type` is `F_RDLCK`, `F_WRLCK` or `F_UNLCK`.
    size 24;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct FileLock {
        pub start: u64,
        pub end: u64,
        pub typ: u32,
        pub pid: u32,
    }
}

wire! {
    /// `struct fuse_lk_in` (GETLK, SETLK, SETLKW).
    size 48;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct LkIn {
        pub fh: u64,
        pub owner: u64,
        pub lk: FileLock,
        pub lk_flags: u32,
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_lk_out` (GETLK).
    size 24;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct LkOut {
        pub lk: FileLock,
    }
}

wire! {
    /// `struct fuse_read_in`.
    size 40;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct ReadIn {
        pub fh: u64,
        pub offset: u64,
        pub size: u32,
        pub read_flags: u32,
        pub lock_owner: u64,
        pub flags: u32,
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_write_in`.
    size 40;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct WriteIn {
        pub fh: u64,
        pub offset: u64,
        pub size: u32,
        pub write_flags: u32,
        pub lock_owner: u64,
        pub flags: u32,
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_write_out`.
    size 8;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct WriteOut {
        pub size: u32,
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_kstatfs`.
    size 80;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct Kstatfs {
        pub blocks: u64,
        pub bfree: u64,
        pub bavail: u64,
        pub files: u64,
        pub ffree: u64,
        pub bsize: u32,
        pub namelen: u32,
        pub frsize: u32,
        pub padding: u32,
        pub spare: [u32; 6],
    }
}

wire! {
    /// `struct fuse_fsync_in`.
    size 16;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct FsyncIn {
        pub fh: u64,
        pub fsync_flags: u32,
        pub padding: u32,
    }
}

wire! {
    /// `fuse_setxattr_in` as sent without `SETXATTR_EXT`.
    size 8;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct SetxattrInCompat {
        pub size: u32,
        pub flags: u32,
    }
}

wire! {
    /// `fuse_setxattr_in` as sent when `SETXATTR_EXT` was negotiated.
    size 16;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct SetxattrIn {
        pub size: u32,
        pub flags: u32,
        pub setxattr_flags: u32,
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_getxattr_in`.
    size 8;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct GetxattrIn {
        pub size: u32,
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_getxattr_out`.
    size 8;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct GetxattrOut {
        pub size: u32,
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_access_in`.
    size 8;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct AccessIn {
        pub mask: u32,
        pub padding: u32,
    }
}

wire! {
    /// The first, always-present part of `fuse_init_in` (16 bytes, as sent before 7.36).
    size 16;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct InitInCompat {
        pub major: u32,
        pub minor: u32,
        pub max_readahead: u32,
        pub flags: u32,
    }
}

wire! {
    /// The extension of `fuse_init_in` sent from 7.36 on (after [`InitInCompat`]).
    size 48;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct InitInExt {
        pub flags2: u32,
        pub unused: [u32; 11],
    }
}

wire! {
    /// `struct fuse_init_out`.
    size 64;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct InitOut {
        pub major: u32,
        pub minor: u32,
        pub max_readahead: u32,
        pub flags: u32,
        pub max_background: u16,
        pub congestion_threshold: u16,
        pub max_write: u32,
        pub time_gran: u32,
        pub max_pages: u16,
        pub map_alignment: u16,
        pub flags2: u32,
        pub max_stack_depth: u32,
        pub unused: [u32; 6],
    }
}

wire! {
    /// `struct fuse_interrupt_in`.
    size 8;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct InterruptIn {
        pub unique: u64,
    }
}

wire! {
    /// Header of one `fuse_dirent`; the name follows, padded to 8 bytes.
    size 24;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct Dirent {
        pub ino: u64,
        pub off: u64,
        pub namelen: u32,
        pub typ: u32,
    }
}

wire! {
    /// Header of one request extension (after the arguments, `total_extlen * 8` bytes in all).
    size 8;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct ExtHeader {
        /// Size of the extension including this header, a multiple of 8.
        pub size: u32,
        pub typ: u32,
    }
}

/// Extension type: the caller's supplementary groups (`u32` count, then the groups).
pub const EXT_GROUPS: u32 = 32;

wire! {
    /// `struct fuse_fallocate_in`.
    size 32;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct FallocateIn {
        pub fh: u64,
        pub offset: u64,
        pub length: u64,
        pub mode: u32,
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_lseek_in`.
    size 24;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct LseekIn {
        pub fh: u64,
        pub offset: u64,
        pub whence: u32,
        pub padding: u32,
    }
}

wire! {
    /// `struct fuse_lseek_out`.
    size 8;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct LseekOut {
        pub offset: u64,
    }
}

wire! {
    /// `struct fuse_copy_file_range_in`.
    size 56;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct CopyFileRangeIn {
        pub fh_in: u64,
        pub off_in: u64,
        pub nodeid_out: u64,
        pub fh_out: u64,
        pub off_out: u64,
        pub len: u64,
        pub flags: u64,
    }
}

wire! {
    /// `struct fuse_syncfs_in`.
    size 8;
    #[derive(Debug, Default, Clone, Copy)]
    pub struct SyncfsIn {
        pub padding: u64,
    }
}

// SAFETY: an integer: every byte pattern is a valid value, no padding.
unsafe impl Pod for u32 {}

/// Size of a `fuse_dirent` record (header plus name) after padding to 8 bytes.
pub fn dirent_size(namelen: usize) -> usize {
    (std::mem::size_of::<Dirent>() + namelen + 7) & !7
}

/// Size of a `fuse_direntplus` record (entry, header and name) after padding to 8 bytes.
pub fn direntplus_size(namelen: usize) -> usize {
    std::mem::size_of::<EntryOut>() + dirent_size(namelen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_prefix_refuses_short_input() {
        assert!(InHeader::from_prefix(&[0u8; 39]).is_none());
        assert!(InHeader::from_prefix(&[0u8; 40]).is_some());
    }

    #[test]
    fn from_prefix_reads_little_endian_fields() {
        let mut bytes = [0u8; 40];
        bytes[0..4].copy_from_slice(&40u32.to_le_bytes());
        bytes[4..8].copy_from_slice(&opcode::GETATTR.to_le_bytes());
        bytes[8..16].copy_from_slice(&7u64.to_le_bytes());
        let h = InHeader::from_prefix(&bytes).unwrap();
        assert_eq!((h.len, h.opcode, h.unique), (40, opcode::GETATTR, 7));
        assert_eq!(h.as_bytes(), &bytes[..]);
    }

    #[test]
    fn every_opcode_number_converts_back_to_itself() {
        let known: Vec<u32> = (0..64).filter(|&n| Opcode::try_from(n).is_ok()).collect();
        // 1 to 52 but for 7 (the old GETDIR) and 19 (never used).
        let expected: Vec<u32> = (1..=52).filter(|&n| n != 7 && n != 19).collect();
        assert_eq!(known, expected);
        for n in known {
            assert_eq!(Opcode::try_from(n).unwrap() as u32, n);
        }
        assert_eq!(Opcode::try_from(53), Err(UnknownOpcode(53)));
    }

    #[test]
    fn opcodes_are_named_as_fuse_h_names_them() {
        assert_eq!(Opcode::try_from(opcode::LOOKUP).unwrap().name(), "LOOKUP");
        assert_eq!(Opcode::CopyFileRange.to_string(), "COPY_FILE_RANGE");
        assert_eq!(Opcode::Readdirplus.to_string(), "READDIRPLUS");
        assert_eq!(OpcodeName(opcode::STATX).to_string(), "STATX");
        assert_eq!(OpcodeName(1000).to_string(), "1000");
        assert_eq!(UnknownOpcode(1000).to_string(), "unknown opcode 1000");
    }

    #[test]
    fn dirent_sizes_are_padded_to_eight() {
        assert_eq!(dirent_size(1), 32);
        assert_eq!(dirent_size(8), 32);
        assert_eq!(dirent_size(9), 40);
        assert_eq!(direntplus_size(1), 160);
    }
}
