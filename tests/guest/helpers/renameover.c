/* renameover DIR: the steps of xfstests generic/035, written anew. In DIR it makes file1 and
 * file2 and opens file2, renames file1 over file2, and checks that fstat of the open file2
 * succeeds with 0 links; then the same with directories dir1 and dir2 (dir2 opened with
 * O_DIRECTORY), after which a listing of the open dir2 gives no entry but . and .. (or fails
 * with ENOENT, as it does on a local file system). Prints what went wrong and exits 1 on any
 * failure, exits 0 silently on success. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, __VA_ARGS__); fprintf(stderr, " (errno: %s)\n", strerror(errno)); return 1; } } while (0)

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: renameover DIR\n"); return 2; }
    int d = open(argv[1], O_RDONLY | O_DIRECTORY);
    CHECK(d >= 0, "open %s", argv[1]);
    struct stat st;

    /* Files. */
    int f1 = openat(d, "file1", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(f1 >= 0, "create file1");
    CHECK(write(f1, "one", 3) == 3, "write file1");
    CHECK(close(f1) == 0, "close file1");
    int f2 = openat(d, "file2", O_RDWR | O_CREAT | O_TRUNC, 0644);
    CHECK(f2 >= 0, "create file2");
    CHECK(write(f2, "two!", 4) == 4, "write file2");
    CHECK(renameat(d, "file1", d, "file2") == 0, "rename file1 over file2");
    CHECK(fstat(f2, &st) == 0, "fstat of the open file2 after the rename");
    CHECK(st.st_nlink == 0, "open file2: st_nlink=%lu, expected 0", (unsigned long)st.st_nlink);
    CHECK(st.st_size == 4, "open file2: size %ld, expected 4", (long)st.st_size);
    CHECK(fstatat(d, "file2", &st, 0) == 0 && st.st_size == 3, "file2 is file1 now");
    CHECK(close(f2) == 0, "close file2");

    /* Directories. */
    CHECK(mkdirat(d, "dir1", 0755) == 0, "mkdir dir1");
    CHECK(mkdirat(d, "dir2", 0755) == 0, "mkdir dir2");
    int d2 = openat(d, "dir2", O_RDONLY | O_DIRECTORY);
    CHECK(d2 >= 0, "open dir2");
    CHECK(renameat(d, "dir1", d, "dir2") == 0, "rename dir1 over dir2");
    CHECK(fstat(d2, &st) == 0, "fstat of the open dir2 after the rename");
    CHECK(S_ISDIR(st.st_mode), "open dir2: mode %o", (unsigned)st.st_mode);
    CHECK(st.st_nlink == 0, "open dir2: st_nlink=%lu, expected 0", (unsigned long)st.st_nlink);
    char buf[4096];
    long n = syscall(SYS_getdents64, d2, buf, sizeof buf);
    CHECK(n >= 0 || errno == ENOENT, "listing the open dir2");
    for (long off = 0; n > 0 && off < n;) {
        unsigned short reclen = *(unsigned short *)(buf + off + 16);
        const char *name = buf + off + 19;
        CHECK(!strcmp(name, ".") || !strcmp(name, ".."), "the open dir2 lists %s", name);
        off += reclen;
    }
    CHECK(close(d2) == 0, "close dir2");
    CHECK(fstatat(d, "dir2", &st, 0) == 0 && S_ISDIR(st.st_mode), "dir2 is dir1 now");
    CHECK(unlinkat(d, "file2", 0) == 0 && unlinkat(d, "dir2", AT_REMOVEDIR) == 0, "clean up");
    return 0;
}
