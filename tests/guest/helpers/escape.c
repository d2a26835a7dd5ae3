/* escape: raw system calls for the escape suite (busybox has no way to issue them).
 *
 *   escape rename FROM TO         rename(2); prints "ok" or the errno name
 *   escape exchange A B           renameat2(RENAME_EXCHANGE); prints "ok" or the errno name
 *   escape dotdot DIR N           from an O_PATH descriptor of DIR, openat("..") N times;
 *                                 prints "dev:ino" of the last one reached
 *   escape opath DIR NAME REST    O_PATH|O_NOFOLLOW openat of NAME in DIR, then openat of
 *                                 REST below that descriptor (O_RDONLY), then a read through
 *                                 /proc/self/fd/N/REST; prints what each step gave (errno names,
 *                                 or "read:<bytes>" with what was read)
 *   escape handles FILE MAX       name_to_handle_at(FILE); then open_by_handle_at with the
 *                                 node id of the handle replaced by 0..MAX and a few huge ones;
 *                                 for each that opens, prints "opened <id> <link>: <bytes>" with
 *                                 /proc/self/fd's link and the first bytes read (regular
 *                                 files only; opened O_NONBLOCK); ends with
 *                                 "tried N opened M" (or "handles: <errno>" if unsupported)
 *
 * Exit status 0 unless the arguments are wrong; the caller judges what was printed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *ename(int e) {
    switch (e) {
    case EXDEV: return "EXDEV";
    case ENOENT: return "ENOENT";
    case ENOTDIR: return "ENOTDIR";
    case ELOOP: return "ELOOP";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case EINVAL: return "EINVAL";
    case ESTALE: return "ESTALE";
    case EBADF: return "EBADF";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    case ENXIO: return "ENXIO";
    case EISDIR: return "EISDIR";
    case EBUSY: return "EBUSY";
    case ENOTEMPTY: return "ENOTEMPTY";
    default: return strerror(e);
    }
}

static void show_read(int fd) {
    char buf[65];
    ssize_t n = read(fd, buf, 64);
    if (n < 0) {
        printf("read:%s", ename(errno));
        return;
    }
    buf[n] = 0;
    for (ssize_t i = 0; i < n; i++)
        if (buf[i] == '\n' || buf[i] == 0) buf[i] = ' ';
    printf("read:%s", buf);
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "rename")) {
        puts(rename(argv[2], argv[3]) ? ename(errno) : "ok");
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "exchange")) {
        long r = syscall(SYS_renameat2, AT_FDCWD, argv[2], AT_FDCWD, argv[3], 2 /* EXCHANGE */);
        puts(r ? ename(errno) : "ok");
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "dotdot")) {
        int fd = open(argv[2], O_PATH | O_DIRECTORY);
        if (fd < 0) { printf("open: %s\n", ename(errno)); return 0; }
        for (int i = 0; i < atoi(argv[3]); i++) {
            int up = openat(fd, "..", O_PATH | O_DIRECTORY);
            if (up < 0) { printf("openat ..: %s\n", ename(errno)); return 0; }
            close(fd);
            fd = up;
        }
        struct stat st;
        if (fstat(fd, &st)) { printf("fstat: %s\n", ename(errno)); return 0; }
        printf("%lu:%lu\n", (unsigned long)st.st_dev, (unsigned long)st.st_ino);
        return 0;
    }
    if (argc >= 5 && !strcmp(argv[1], "opath")) {
        int dir = open(argv[2], O_PATH | O_DIRECTORY);
        if (dir < 0) { printf("open: %s\n", ename(errno)); return 0; }
        int p = openat(dir, argv[3], O_PATH | O_NOFOLLOW);
        if (p < 0) { printf("opath: %s\n", ename(errno)); return 0; }
        printf("opath: ok; ");
        int f = openat(p, argv[4], O_RDONLY);
        if (f < 0) printf("below: %s; ", ename(errno));
        else { printf("below: "); show_read(f); printf("; "); close(f); }
        /* The same through /proc/self/fd/N: the guest kernel follows the link there. */
        char path[4096];
        snprintf(path, sizeof path, "/proc/self/fd/%d/%s", p, argv[4]);
        f = open(path, O_RDONLY);
        if (f < 0) printf("proc: %s\n", ename(errno));
        else { printf("proc: "); show_read(f); printf("\n"); close(f); }
        /* And the O_PATH descriptor itself reopened for reading. */
        snprintf(path, sizeof path, "/proc/self/fd/%d", p);
        f = open(path, O_RDONLY);
        if (f < 0) printf("reopen: %s\n", ename(errno));
        else { printf("reopen: "); show_read(f); printf("\n"); close(f); }
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "handles")) {
        struct {
            struct file_handle fh;
            unsigned char bytes[128];
        } h;
        int mount_id;
        h.fh.handle_bytes = sizeof h.bytes;
        if (name_to_handle_at(AT_FDCWD, argv[2], &h.fh, &mount_id, 0)) {
            printf("handles: %s\n", ename(errno));
            return 0;
        }
        int mfd = open(argv[2], O_RDONLY);
        if (mfd < 0) { printf("open: %s\n", ename(errno)); return 0; }
        long max = atol(argv[3]);
        uint64_t huge[] = {UINT64_MAX, UINT64_MAX - 1, 1ULL << 63, 0xffffffffULL, 12345678901ULL};
        long tried = 0, opened = 0;
        for (long i = 0; i <= max + 5; i++) {
            uint64_t id = i <= max ? (uint64_t)i : huge[i - max - 1];
            /* FUSE handles begin with the node id as two 32-bit halves (high first). */
            if (h.fh.handle_bytes >= 8) {
                uint32_t hi = id >> 32, lo = (uint32_t)id;
                memcpy(h.fh.f_handle, &hi, 4);
                memcpy(h.fh.f_handle + 4, &lo, 4);
            }
            tried++;
            /* O_NONBLOCK: a handle may name a FIFO, whose open would wait for a writer. */
            int fd = open_by_handle_at(mfd, &h.fh, O_RDONLY | O_NONBLOCK);
            if (fd < 0) fd = open_by_handle_at(mfd, &h.fh, O_PATH);
            if (fd < 0) continue;
            opened++;
            char p[64], link[4096];
            snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
            ssize_t n = readlink(p, link, sizeof link - 1);
            link[n < 0 ? 0 : n] = 0;
            printf("opened %llu %s: ", (unsigned long long)id, link);
            struct stat st;
            if (!fstat(fd, &st) && S_ISREG(st.st_mode)) show_read(fd);
            printf("\n");
            close(fd);
        }
        printf("tried %ld opened %ld\n", tried, opened);
        return 0;
    }
    fprintf(stderr, "usage: escape rename|exchange|dotdot|opath|handles ...\n");
    return 2;
}
