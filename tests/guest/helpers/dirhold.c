/* dirhold: holds a directory open in the middle of a listing across a live migration.
 *
 *   dirhold DIR GOFILE    opens DIR, reads one small getdents64 buffer (some entries), prints
 *                         "first N", then waits until GOFILE exists, reads the rest of the
 *                         listing through the same descriptor and prints "total N" and
 *                         "duplicates N". Exits 0 when the rest was read without error.
 *
 * The guest suite starts it before the migration and creates GOFILE after it, so the READDIRs
 * after the first are served by the destination daemon from the offset the guest held.
 */
#define _GNU_SOURCE
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

#define MAX_NAMES 100000
static char *names[MAX_NAMES];
static int count;

static int read_some(int fd, size_t bufsize) {
    char buf[65536];
    long n = syscall(SYS_getdents64, fd, buf, bufsize);
    if (n < 0) {
        perror("getdents64");
        exit(1);
    }
    for (long off = 0; off < n;) {
        struct linux_dirent64 *d = (struct linux_dirent64 *)(buf + off);
        if (count < MAX_NAMES)
            names[count++] = strdup(d->d_name);
        off += d->d_reclen;
    }
    return (int)n;
}

static int cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: dirhold DIR GOFILE\n");
        return 2;
    }
    int fd = open(argv[1], O_RDONLY | O_DIRECTORY);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    read_some(fd, 1024);
    printf("first %d\n", count);
    fflush(stdout);
    while (access(argv[2], F_OK) != 0)
        usleep(100000);
    while (read_some(fd, 65536) > 0)
        ;
    qsort(names, count, sizeof(names[0]), cmp);
    int dups = 0;
    for (int i = 1; i < count; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            dups++;
    printf("total %d\nduplicates %d\n", count, dups);
    return 0;
}
