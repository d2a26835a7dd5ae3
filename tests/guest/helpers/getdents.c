/* getdents: lists a directory with the raw getdents64 system call (no libc readdir caching).
 *
 *   getdents [-b BUFSIZE] DIR        prints counts per d_type, the number of duplicate names,
 *                                    and the total, one "key value" per line
 *   getdents [-b BUFSIZE] -l DIR     prints "TYPE NAME" per entry (TYPE as in the counts)
 *
 * Exits 0 when the listing was read to the end without error. Used by the guest tests to check
 * that a large directory is listed completely, with no duplicates and the right d_type for each
 * kind of file.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

struct linux_dirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

static const char *type_name(unsigned t) {
    switch (t) {
    case DT_REG: return "reg";
    case DT_DIR: return "dir";
    case DT_LNK: return "lnk";
    case DT_FIFO: return "fifo";
    case DT_SOCK: return "sock";
    case DT_CHR: return "chr";
    case DT_BLK: return "blk";
    case DT_UNKNOWN: return "unknown";
    default: return "other";
    }
}

static int cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    size_t bufsize = 32768;
    int list = 0, opt;
    while ((opt = getopt(argc, argv, "b:l")) != -1) {
        if (opt == 'b') bufsize = strtoul(optarg, NULL, 0);
        else if (opt == 'l') list = 1;
        else { fprintf(stderr, "usage: getdents [-b BUFSIZE] [-l] DIR\n"); return 2; }
    }
    if (optind != argc - 1) { fprintf(stderr, "usage: getdents [-b BUFSIZE] [-l] DIR\n"); return 2; }

    int fd = open(argv[optind], O_RDONLY | O_DIRECTORY);
    if (fd < 0) { perror("open"); return 1; }
    char *buf = malloc(bufsize);
    size_t cap = 1024, n = 0;
    char **names = malloc(cap * sizeof *names);
    unsigned long counts[256] = {0};
    unsigned long calls = 0, zero_ino = 0;
    for (;;) {
        long got = syscall(SYS_getdents64, fd, buf, bufsize);
        if (got < 0) { perror("getdents64"); return 1; }
        if (got == 0) break;
        calls++;
        for (long off = 0; off < got;) {
            struct linux_dirent64 *d = (struct linux_dirent64 *)(buf + off);
            if (d->d_reclen == 0) { fprintf(stderr, "zero d_reclen\n"); return 1; }
            off += d->d_reclen;
            if (d->d_ino == 0) zero_ino++;
            if (!strcmp(d->d_name, ".") || !strcmp(d->d_name, "..")) {
                counts[d->d_type]++;
                continue; /* counted by type, but kept out of the name list */
            }
            if (list) printf("%s %s\n", type_name(d->d_type), d->d_name);
            if (n == cap) { cap *= 2; names = realloc(names, cap * sizeof *names); }
            names[n++] = strdup(d->d_name);
            counts[d->d_type]++;
        }
    }
    if (list) return 0;
    qsort(names, n, sizeof *names, cmp);
    unsigned long dups = 0;
    for (size_t i = 1; i < n; i++)
        if (!strcmp(names[i], names[i - 1])) {
            if (dups < 5) fprintf(stderr, "duplicate: %s\n", names[i]);
            dups++;
        }
    static const unsigned char types[] = {DT_REG, DT_DIR, DT_LNK, DT_FIFO, DT_SOCK, DT_CHR, DT_BLK, DT_UNKNOWN};
    for (size_t i = 0; i < sizeof types; i++) printf("%s %lu\n", type_name(types[i]), counts[types[i]]);
    unsigned long other = 0;
    for (int t = 0; t < 256; t++) {
        int known = 0;
        for (size_t i = 0; i < sizeof types; i++) known |= types[i] == t;
        if (!known) other += counts[t];
    }
    printf("other %lu\nnames %zu\ndups %lu\nzero_ino %lu\ncalls %lu\n", other, n, dups, zero_ino, calls);
    return 0;
}
