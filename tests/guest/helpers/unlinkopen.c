/* unlinkopen PATH: creates PATH, writes to it, unlinks it while it is open, and checks that the
 * open descriptor still reads and writes the data, that fstat reports 0 links, and that the path
 * is gone. Prints what went wrong and exits 1 on any failure, exits 0 silently on success. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, __VA_ARGS__); fprintf(stderr, " (errno: %s)\n", strerror(errno)); return 1; } } while (0)

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: unlinkopen PATH\n"); return 2; }
    const char *p = argv[1];
    const char msg[] = "written before unlink\n";
    const char more[] = "written after unlink\n";
    char buf[256];
    struct stat st;

    int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0, "open %s", p);
    CHECK(write(fd, msg, sizeof msg - 1) == (ssize_t)(sizeof msg - 1), "write");
    int fd2 = open(p, O_RDONLY); /* a second descriptor, opened before the unlink */
    CHECK(fd2 >= 0, "second open");
    CHECK(unlink(p) == 0, "unlink");
    errno = 0;
    CHECK(stat(p, &st) != 0 && errno == ENOENT, "stat after unlink should fail with ENOENT");
    CHECK(fstat(fd, &st) == 0, "fstat");
    CHECK(st.st_nlink == 0, "fstat after unlink: st_nlink=%lu, expected 0", (unsigned long)st.st_nlink);
    CHECK(st.st_size == (off_t)(sizeof msg - 1), "fstat size %ld", (long)st.st_size);
    ssize_t n = pread(fd, buf, sizeof buf, 0);
    CHECK(n == (ssize_t)(sizeof msg - 1) && !memcmp(buf, msg, n), "pread after unlink returned %zd bytes", n);
    CHECK(pwrite(fd, more, sizeof more - 1, sizeof msg - 1) == (ssize_t)(sizeof more - 1), "pwrite after unlink");
    CHECK(fsync(fd) == 0, "fsync after unlink");
    n = pread(fd2, buf, sizeof buf, 0);
    CHECK(n == (ssize_t)(sizeof msg + sizeof more - 2), "pread on second fd returned %zd bytes", n);
    CHECK(!memcmp(buf, msg, sizeof msg - 1) && !memcmp(buf + sizeof msg - 1, more, sizeof more - 1),
          "second fd content mismatch");
    CHECK(ftruncate(fd, 4) == 0, "ftruncate after unlink");
    CHECK(fstat(fd2, &st) == 0 && st.st_size == 4, "size after ftruncate: %ld", (long)st.st_size);
    /* a new file may take the old name while the old one is still open */
    int fd3 = open(p, O_RDWR | O_CREAT | O_EXCL, 0644);
    CHECK(fd3 >= 0, "recreate %s", p);
    CHECK(fstat(fd3, &st) == 0 && st.st_size == 0, "recreated file is not empty");
    CHECK(close(fd) == 0 && close(fd2) == 0 && close(fd3) == 0, "close");
    CHECK(unlink(p) == 0, "unlink recreated");
    return 0;
}
