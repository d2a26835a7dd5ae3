#!/usr/bin/env python3
"""Writes the hand-made seed inputs of tests/fuzz/regressions/<target>/ (seed-*.bin).

Each input exercises one hostile pattern through a fuzz harness; `cargo test --test
fuzz_regressions` replays them all, and `tests/fuzz/run.sh` starts its corpora from them.
Re-run after changing an input format: python3 tests/fuzz/make-seeds.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "regressions")

# FUSE opcodes used below.
LOOKUP, FORGET, GETATTR, SETATTR, READLINK, SYMLINK, MKNOD, MKDIR = 1, 2, 3, 4, 5, 6, 8, 9
RENAME, LINK, OPEN, READ, WRITE, RELEASE = 12, 13, 14, 15, 16, 18
SETXATTR, GETXATTR, LISTXATTR, INIT, OPENDIR, READDIR = 21, 22, 23, 26, 27, 28
CREATE, DESTROY, BATCH_FORGET, READDIRPLUS, RENAME2, COPY_FILE_RANGE = 35, 38, 42, 44, 45, 47
U32MAX = 0xFFFFFFFF


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name + ".bin"), "wb") as f:
        f.write(data)


# ---- fuse_server: [init flags u64] then [cap u16][len u16][request]... ------------------------
unique = [100]


def req(op, body=b"", nodeid=1, length=None, extlen=0):
    unique[0] += 1
    n = 40 + len(body) if length is None else length
    return struct.pack("<IIQQIIIHH", n & U32MAX, op, unique[0], nodeid, 0, 0, 1, extlen, 0) + body


def msg(r, cap=4096):
    return struct.pack("<HH", cap & 0xFFFF, len(r) & 0xFFFF) + r


def fuse(name, *msgs, flags=0xFFFFFFFFFFFFFFFF):
    write("fuse_server", name, struct.pack("<Q", flags) + b"".join(msgs))


read_in = lambda fh, off, size: struct.pack("<QQIIQII", fh, off, size, 0, 0, 0, 0)
write_in = lambda fh, off, size: struct.pack("<QQIIQII", fh, off, size, 0, 0, 0, 0)

fuse("header-lengths",
     msg(req(LOOKUP, b"f\0", length=U32MAX)),
     msg(req(LOOKUP, b"f\0", length=0)),
     msg(req(LOOKUP, b"f\0", length=39)),
     msg(req(LOOKUP, b"f\0", length=41)),
     msg(req(LOOKUP, b"f\0", length=40 + 4096)),
     msg(req(LOOKUP, b"f\0")[:20]))
fuse("extension-lengths",
     msg(req(LOOKUP, b"f\0", extlen=0xFFFF)),
     msg(req(MKDIR, struct.pack("<II", 0o755, 0) + b"d\0" + b"\0" * 6 + struct.pack("<II", 8, 1), extlen=2)),
     msg(req(CREATE, struct.pack("<IIII", 0o102, 0o644, 0, 0) + b"c\0", extlen=1)))
fuse("huge-sizes",
     msg(req(READ, read_in(8, 0, U32MAX), nodeid=2), cap=64),
     msg(req(READ, read_in(8, 0xFFFFFFFFFFFFFFFF, U32MAX), nodeid=2)),
     msg(req(WRITE, write_in(8, 0, U32MAX) + b"short", nodeid=2)),
     msg(req(WRITE, write_in(8, 0xFFFFFFFFFFFFFFF0, 5) + b"short", nodeid=2)),
     msg(req(SETXATTR, struct.pack("<IIII", U32MAX, 0, 0, 0) + b"user.a\0xy", nodeid=2)),
     msg(req(SETXATTR, struct.pack("<II", U32MAX, 0) + b"user.a\0xy", nodeid=2)),
     msg(req(GETXATTR, struct.pack("<II", U32MAX, 0) + b"user.a\0", nodeid=2)),
     msg(req(GETXATTR, struct.pack("<II", U32MAX, 0) + b"user.a\0", nodeid=2), cap=17),
     msg(req(LISTXATTR, struct.pack("<II", U32MAX, 0), nodeid=2), cap=20),
     msg(req(READDIRPLUS, read_in(0, 0, U32MAX)), cap=100),
     msg(req(READDIR, read_in(0, 0xFFFFFFFFFFFFFFFF, U32MAX)), cap=4096),
     msg(req(COPY_FILE_RANGE, struct.pack("<QQQQQQQ", 7, 0, 2, 8, 0, 0xFFFFFFFFFFFFFFFF, 0), nodeid=2)),
     msg(req(READLINK, nodeid=2), cap=17))
fuse("forgets",
     msg(req(BATCH_FORGET, struct.pack("<II", U32MAX, 0) + struct.pack("<QQ", 2, 1))),
     msg(req(BATCH_FORGET, struct.pack("<II", 0x10000000, 0) + struct.pack("<QQ", 0xFFFFFFFFFFFFFFFF, U32MAX))),
     msg(req(BATCH_FORGET, struct.pack("<II", 1, 0) + b"\x02\0\0")),
     msg(req(FORGET, struct.pack("<Q", 0xFFFFFFFFFFFFFFFF), nodeid=12345)),
     msg(req(FORGET, b"", nodeid=0)))
fuse("names",
     msg(req(LOOKUP, b"no-nul")),
     msg(req(LOOKUP, b"a/b\0")),
     msg(req(LOOKUP, b"..\0")),
     msg(req(LOOKUP, b"a\0b\0")),
     msg(req(LOOKUP, b"\0")),
     msg(req(SYMLINK, b"l\0/etc/passwd")),
     msg(req(RENAME, struct.pack("<Q", 1) + b"a\0")),
     msg(req(RENAME2, struct.pack("<QII", 1, 0xFFFFFFFF, 0) + b"a\0b\0")),
     msg(req(LINK, struct.pack("<Q", 2) + b"x" * 300)),
     msg(req(MKNOD, struct.pack("<IIII", 0o20644, 0x0103, 0, 0) + b"null\0")))
fuse("destroy-then-more",
     msg(req(DESTROY)),
     msg(req(LOOKUP, b"f\0")),
     msg(req(GETATTR, bytes(16), nodeid=2)),
     msg(req(INIT, struct.pack("<IIII", 7, 41, 0, 0) + bytes(48))),
     msg(req(LOOKUP, b"f\0")),
     msg(req(DESTROY)),
     msg(req(DESTROY)))
fuse("tiny-reply-buffers",
     msg(req(LOOKUP, b"f\0"), cap=0),
     msg(req(LOOKUP, b"f\0"), cap=1),
     msg(req(LOOKUP, b"f\0"), cap=15),
     msg(req(LOOKUP, b"f\0"), cap=16),
     msg(req(LOOKUP, b"missing\0"), cap=16),
     msg(req(READDIRPLUS, read_in(0, 0, 4096)), cap=17),
     msg(req(READ, read_in(8, 0, 4096), nodeid=2), cap=16))
# Every opcode (and a few beyond the last) with an empty body, then with a body of 0xff.
fuse("every-opcode-empty", *[msg(req(op)) for op in range(0, 16)], flags=0)
fuse("every-opcode-empty-2", *[msg(req(op)) for op in range(16, 32)])
fuse("every-opcode-empty-3", *[msg(req(op)) for op in list(range(32, 54)) + [4096, U32MAX]][:16])
fuse("every-opcode-ff", *[msg(req(op, b"\xff" * 64)) for op in range(0, 16)])
fuse("every-opcode-ff-2", *[msg(req(op, b"\xff" * 64)) for op in range(16, 32)])
fuse("every-opcode-ff-3", *[msg(req(op, b"\xff" * 64)) for op in range(32, 54)][:16])
fuse("init-variants", msg(req(INIT, struct.pack("<IIII", 8, 0, 0, 0))), msg(req(INIT, b"")),
     msg(req(INIT, struct.pack("<IIII", 7, 0xFFFFFFFF, U32MAX, U32MAX) + b"\xff" * 48)),
     flags=0x0123456789ABCDEF)

# ---- queue_path: [avail idx u16][mode u8][guest memory image from address 0] -----------------
# 16-entry queue: descriptors at 0, available ring at 256 (ring at 260), used ring at 296.
NEXT, WRITE_F, INDIRECT = 1, 2, 4
REQ, REPLY, TABLE = 0x1000, 0x2000, 0x3000


def image(descs, heads, extra=(), size=0x4000):
    mem = bytearray(size)
    for i, (addr, ln, fl, nx) in enumerate(descs):
        struct.pack_into("<QIHH", mem, 16 * i, addr, ln & U32MAX, fl, nx)
    for i, h in enumerate(heads):
        struct.pack_into("<H", mem, 260 + 2 * i, h)
    for addr, data in extra:
        mem[addr:addr + len(data)] = data
    return bytes(mem)


def queue(name, descs, heads, extra=(), avail=None, mode=0, size=0x4000):
    a = len(heads) if avail is None else avail
    lookup = req(LOOKUP, b"f\0")
    mem = image(descs, heads, [(REQ, lookup)] + list(extra), size)
    write("queue_path", name, struct.pack("<HB", a, mode) + mem)


L = 42  # LOOKUP "f"
queue("valid-lookup", [(REQ, L, NEXT, 1), (REPLY, 256, WRITE_F, 0)], [0])
queue("self-loop", [(REQ, L, NEXT, 0)], [0])
queue("two-cycle", [(REQ, L, NEXT, 1), (REPLY, 256, WRITE_F | NEXT, 0)], [0])
queue("writable-self-loop", [(REQ, L, NEXT, 1), (REPLY, 256, WRITE_F | NEXT, 1)], [0])
queue("next-outside-table", [(REQ, L, NEXT, 100), (REPLY, 256, WRITE_F, 0)], [0])
queue("head-outside-table", [(REQ, L, NEXT, 1), (REPLY, 256, WRITE_F, 0)], [200, 0xFFFF, 0])
queue("writable-first", [(REPLY, 256, WRITE_F | NEXT, 1), (REQ, L, 0, 0)], [0])
queue("huge-lengths", [(REQ, U32MAX, NEXT, 1), (REPLY, U32MAX, WRITE_F, 0),
                       (0xFFFFFFFFFFFFFFF0, 64, NEXT, 3), (REPLY, 256, WRITE_F, 0)], [0, 2])
# Guest memory is two 32 KiB regions: a request and a reply buffer that cross 0x8000.
queue("across-regions", [(0x7FE8, L, NEXT, 1), (0x7C00, 256, WRITE_F, 0),
                         (REQ, L, NEXT, 3), (0x7F80, 256, WRITE_F, 0)], [0, 2],
      extra=[(0x7FE8, req(LOOKUP, b"f\0"))], size=0x8100)
# Indirect tables: looping on themselves, nested, odd and huge lengths, outside memory.
ind = struct.pack("<QIHH", REQ, L, NEXT, 1) + struct.pack("<QIHH", REPLY, 256, WRITE_F | NEXT, 0)
queue("indirect-loop", [(TABLE, 32, INDIRECT, 0)], [0], extra=[(TABLE, ind)])
nested = struct.pack("<QIHH", TABLE, 32, INDIRECT, 0)
queue("indirect-nested", [(TABLE + 0x100, 16, INDIRECT, 0)], [0], extra=[(TABLE + 0x100, nested), (TABLE, ind)])
queue("indirect-lengths", [(TABLE, 0, INDIRECT, 0), (TABLE, 17, INDIRECT, 0), (TABLE, U32MAX & ~15, INDIRECT, 0),
                           (0xFFFFFFFFFFFF0000, 32, INDIRECT, 0), (TABLE, 32, INDIRECT | NEXT, 0)],
      [0, 1, 2, 3, 4], extra=[(TABLE, ind)])
queue("indirect-next-outside", [(TABLE, 32, INDIRECT, 0)], [0],
      extra=[(TABLE, struct.pack("<QIHH", REQ, L, NEXT, 9) + struct.pack("<QIHH", REPLY, 256, WRITE_F, 0))])
queue("avail-wrapped", [(REQ, L, NEXT, 1), (REPLY, 256, WRITE_F, 0)], [0] * 16, avail=0xFFFF, mode=3)
queue("event-idx-masked", [(0xFFFF00000000_1000, L, NEXT, 1), (0xABCD_0000_2000, 256, WRITE_F, 0)], [0], mode=3)

# ---- passthrough_ops: [opcode byte % 27][fields]... --------------------------------------------
(Lookup, Forget, BatchForget, Getattr, Create, Mkdir, Mknod, Symlink, Link, Unlink, Rmdir, Rename,
 Open, Opendir, Readdir, Read, Write, Setattr, Readlink, Release, Fsync, Lseek, Fallocate,
 CopyFileRange, Access, Statfs, Destroy) = range(27)
# Names: 0 a, 1 b, 2 c, 3 ".", 4 "..", 5 "a/b", 6 "", 7 sentinel, 8 root, 9 outside.
# Symlink targets: 0 a, 1 ../sentinel, 2 .., 3 /, 4 ../outside, 5 /proc/self/root/etc/hostname.
# Nodes: index into the nodes seen so far (0 = root); 250 = 0, 251 = u64::MAX, 252 = 12345.
B = bytes
u16 = lambda v: list(struct.pack("<H", v))


def ops(name, *seq):
    write("passthrough_ops", name, B([b for op in seq for b in op]))


ops("dotdot-chains", [Lookup, 0, 4], [Lookup, 1, 4], [Lookup, 2, 4], [Lookup, 3, 7], [Lookup, 3, 9],
    [Lookup, 0, 3], [Opendir, 1], [Readdir, 0, 0, *u16(4096), 1], [Create, 3, 7, *u16(0o644), 1])
ops("symlink-to-root", [Symlink, 0, 0, 3], [Lookup, 1, 7], [Lookup, 1, 9], [Open, 1, 1], [Open, 1, 2],
    [Write, 0, *u16(0), *u16(16)], [Setattr, 1, 0, 1, *u16(0o777), 1, *u16(0), 1], [Opendir, 1],
    [Readdir, 1, 0, *u16(8192), 1], [Link, 1, 0, 1], [Readlink, 1])
ops("symlink-relative-out", [Symlink, 0, 0, 1], [Symlink, 0, 1, 4], [Symlink, 0, 2, 5], [Open, 1, 2],
    [Open, 2, 0], [Open, 3, 0], [Read, 0, *u16(0), *u16(4096)], [Lookup, 2, 8], [Mkdir, 2, 1, *u16(0o755)],
    [Create, 2, 0, *u16(0o644), 0], [Rename, 0, 0, 2, 2, 0], [Setattr, 1, 0, 1, *u16(0), 0])
ops("rename-out-and-exchange", [Mkdir, 0, 0, *u16(0o755)], [Mkdir, 1, 1, *u16(0o755)], [Rename, 1, 1, 0, 4, 0],
    [Rename, 1, 4, 0, 7, 0], [Rename, 0, 0, 0, 4, 2], [Rename, 2, 4, 0, 8, 1], [Rename, 0, 0, 1, 0, 4],
    [Rmdir, 1, 4], [Unlink, 1, 4], [Rmdir, 0, 3])
ops("unknown-nodes-and-huge-counts", [Forget, 251, 255], [Forget, 252, 255], [Forget, 250, 1],
    [BatchForget, 251, 255], [BatchForget, 0, 255], [Getattr, 0, 0], [Lookup, 251, 0], [Lookup, 252, 0],
    [Open, 251, 0], [Read, 251, *u16(0), *u16(65535)], [Release, 252], [Destroy], [Lookup, 0, 0],
    [Getattr, 0, 0], [Destroy], [Destroy])
ops("special-files", [Mknod, 0, 0, 1], [Open, 1, 1], [Open, 1, 0], [Mknod, 0, 1, 0], [Link, 2, 0, 2],
    [Create, 0, 3, *u16(0xFFFF), 4], [Fallocate, 0, *u16(0xFFFF), *u16(0xFFFF)],
    [CopyFileRange, 0, 1, *u16(0xFFFF)], [Lseek, 0, *u16(0xFFFF), 255], [Fsync, 255], [Access, 0, 255],
    [Statfs, 251])
# ---- migration_state: [options u8] then the file system's section of a state -----------------
# Options: bit 0 guest-error, bit 1 file-handles, bit 2 --max-nodes=16. The share holds a chain
# of 64 directories `d` (a file `f` at its bottom and in the root) and a symlink `out` to outside.
LOC_LOST, LOC_PATH, LOC_HANDLE, LOC_CHILD = 0, 1, 2, 3
S_IFDIR, S_IFREG, S_IFLNK = 0o040000, 0o100000, 0o120000
by = lambda b: struct.pack("<I", len(b)) + b


def node(nid, kind, loc, refs=1):
    return struct.pack("<QQIB", nid, refs, kind, loc[0]) + loc[1] + b"\0"


lost = lambda e: (LOC_LOST, struct.pack("<i", e))
path = lambda names: (LOC_PATH, struct.pack("<I", len(names)) + b"".join(by(n) for n in names))
child = lambda parent, name: (LOC_CHILD, struct.pack("<Q", parent) + by(name))


def state(name, nxt, nodes, handles=b"", nhandles=0, ranges=None, opts=1, locks=None):
    body = struct.pack("<QQI", nxt, nxt, len(nodes)) + b"".join(nodes)
    body += struct.pack("<I", nhandles) + handles
    if locks is not None and ranges is None:
        ranges = []
    if ranges is not None:
        body += struct.pack("<I", len(ranges)) + b"".join(struct.pack("<QQ", a, b) for a, b in ranges)
    if locks is not None:
        sec = struct.pack("<I", len(locks)) + b"".join(locks)
        body += bytes([1]) + struct.pack("<Q", len(sec)) + sec
    write("migration_state", name, bytes([opts]) + body)


# The locks section (bit 3 of the options agrees on locks first): per owner and node, its
# node, owner, handle, pid, whether its description may write, then a flock's type or a record
# lock's ranges (start, end, type).
F_RDLCK, F_WRLCK = 0, 1


def lock_flock(nid, owner, typ=F_WRLCK, fh=0):
    return struct.pack("<QQQIBBi", nid, owner, fh, 1, 1, 1, typ)


def lock_ranges(nid, owner, segs, count=None, fh=0):
    n = len(segs) if count is None else count
    return struct.pack("<QQQIBBI", nid, owner, fh, 1, 1, 0, n) + b"".join(
        struct.pack("<QQi", a, b, t) for a, b, t in segs)


# A chain a name a level, past the share's 64 levels (the rest lost), and its twin by paths.
deep = 200
state("deep-chain-by-name", deep + 2,
      [node(1 + i, S_IFDIR, child(i, b"d")) for i in range(1, deep + 1)])
state("deep-chain-by-name-abort", deep + 2,
      [node(1 + i, S_IFDIR, child(i, b"d")) for i in range(1, deep + 1)], opts=0)
state("deep-chain-by-path", 70,
      [node(1 + i, S_IFDIR, path([b"d"] * i)) for i in range(1, 65)]
      + [node(67, S_IFREG, path([b"d"] * 64 + [b"f"]))])
# A chain whose nodes come in an order that breaks the last-directory shortcut, then files.
order = list(range(1, 65, 2)) + list(range(2, 65, 2))
state("deep-chain-out-of-order", 200,
      [node(1 + i, S_IFDIR, child(i, b"d")) for i in range(1, 65)]
      + [node(100 + i, S_IFREG, child(1 + i, b"f")) for i in order])
# Names in parents that are not plain, come first, are files, or are themselves.
state("children-bad", 50,
      [node(2, S_IFDIR, child(1, b"..")), node(3, S_IFDIR, child(9, b"d")),
       node(4, S_IFREG, child(1, b"f")), node(5, S_IFREG, child(4, b"f")),
       node(6, S_IFDIR, child(6, b"d")), node(7, S_IFLNK, child(1, b"out")),
       node(8, S_IFREG, child(7, b"file"))])
# Many ranges of stale ids, under a limit of 16 and not; ranges that overlap or meet nodes.
many = [(10 + 3 * i, 11 + 3 * i) for i in range(12000)]
state("many-ranges", 40000, [node(2, S_IFDIR, path([b"d"]))], ranges=many)
state("many-ranges-max16", 40000, [node(2, S_IFDIR, path([b"d"]))], ranges=many, opts=5)
state("ranges-bad", 100, [node(2, S_IFDIR, path([b"d"]))],
      ranges=[(2, 5), (1, 3), (50, 40), (60, 60), (90, 200), (20, 30), (25, 35)])
# Many lost nodes (each a range), with a limit of 16.
state("many-lost-max16", 20000, [node(2 + 2 * i, S_IFREG, lost(2)) for i in range(5000)], opts=5)

# Locks on the root's `f`: taken; more owners than lock descriptors; ranges not sorted, past
# the end of a file, of an unknown type, or more than the state holds; a lock on an unknown
# node, and on a lost one (guest-error).
f_node = [node(2, S_IFREG, path([b"f"]))]
state("locks-taken", 10, f_node, opts=9,
      locks=[lock_flock(2, 7), lock_ranges(2, 8, [(0, 9, F_WRLCK), (20, 29, F_RDLCK)])])
state("locks-many-owners", 10, f_node, opts=9,
      locks=[lock_ranges(2, 100 + i, [(i, i, F_RDLCK)]) for i in range(2000)])
state("locks-bad-ranges", 10, f_node, opts=9,
      locks=[lock_ranges(2, 8, [(20, 29, F_RDLCK), (0, 9, F_WRLCK)])])
state("locks-past-eof", 10, f_node, opts=9,
      locks=[lock_ranges(2, 8, [(0, 1 << 63, F_WRLCK)])])
state("locks-bad-type", 10, f_node, opts=9, locks=[lock_flock(2, 7, typ=5)])
state("locks-absurd-count", 10, f_node, opts=9,
      locks=[lock_ranges(2, 8, [(0, 9, F_WRLCK)], count=0xFFFFFFF0)])
state("locks-unknown-node", 10, f_node, opts=9, locks=[lock_flock(9, 7)])
state("locks-lost-node", 10, f_node + [node(3, S_IFREG, lost(2))], opts=9,
      locks=[lock_flock(3, 7)])
state("locks-not-agreed", 10, f_node, opts=1, locks=[lock_flock(2, 7)])
state("locks-twice", 10, f_node, opts=9, locks=[lock_flock(2, 7), lock_flock(2, 7)])

print("seeds written to", OUT)
