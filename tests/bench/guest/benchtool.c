/*
 * benchtool: the guest benchmark's small helper, built static by tests/bench/guest.sh and run
 * both on the host and in the guest.
 *
 *   benchtool mktree DIR FILES DIRS SEED
 *       Creates DIR (must not exist) holding FILES regular files of 0-4096 bytes spread evenly
 *       over DIRS leaf directories (DIR/dNNN/sN, ten leaves per parent). The contents are
 *       pseudo-random lowercase text from a fixed generator, so the same arguments give the same
 *       tree on any machine; every 10th file carries the line NEEDLE (for grep -r). Files get
 *       mode 0644, directories 0755, and all of them the same fixed mtime. Prints one line:
 *       "files=N dirs=N bytes=N needles=N digest=HEX" (the digest covers every path, size and
 *       byte written, so two trees with the same digest are identical).
 *
 *   benchtool churn DIR COUNT
 *       Creates DIR, creates COUNT empty files in it (open O_CREAT|O_EXCL + close), unlinks
 *       them all, removes DIR.
 *
 *   benchtool statsync PATH COUNT
 *       statx(PATH) COUNT times with AT_STATX_FORCE_SYNC: each call asks the file system
 *       (a GETATTR round trip on virtio-fs), whatever the guest has cached.
 *
 *   benchtool time CMD [ARGS...]
 *       Runs CMD and prints "#ELAPSED SECONDS" (CLOCK_MONOTONIC, microseconds) on stderr when
 *       it has exited; exits with CMD's status.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NEEDLE "virtiofsd-guest-bench-needle"
#define FIXED_MTIME 1700000000

static void die(const char *what, const char *path)
{
    fprintf(stderr, "benchtool: %s %s: %s\n", what, path, strerror(errno));
    exit(1);
}

static uint64_t rng_state;

static uint64_t rng(void) /* xorshift64* */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

static uint64_t digest = 0xcbf29ce484222325ULL; /* FNV-1a 64 */

static void hash(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        digest ^= b[i];
        digest *= 0x100000001b3ULL;
    }
}

static void set_fixed_mtime(const char *path)
{
    struct timespec ts[2] = {{FIXED_MTIME, 0}, {FIXED_MTIME, 0}};
    if (utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW) != 0)
        die("utimensat", path);
}

static void make_dir(const char *path)
{
    if (mkdir(path, 0755) != 0)
        die("mkdir", path);
    if (chmod(path, 0755) != 0) /* whatever the umask */
        die("chmod", path);
}

static int mktree(const char *root, long files, long dirs, uint64_t seed)
{
    char path[4096], buf[4097];
    long parents = (dirs + 9) / 10, made = 0, needles = 0;
    unsigned long long bytes = 0;

    if (files < 0 || dirs < 1 || dirs > 100000) {
        fprintf(stderr, "benchtool: mktree: FILES must be >= 0 and DIRS 1..100000\n");
        return 2;
    }
    rng_state = seed ? seed : 1;
    make_dir(root);
    for (long d = 0; d < dirs; d++) {
        long p = d / 10, s = d % 10;
        /* files of this leaf: an even share, the remainder to the first leaves */
        long n = files / dirs + (d < files % dirs ? 1 : 0);
        if (s == 0) {
            snprintf(path, sizeof path, "%s/d%03ld", root, p);
            make_dir(path);
        }
        snprintf(path, sizeof path, "%s/d%03ld/s%ld", root, p, s);
        make_dir(path);
        for (long f = 0; f < n; f++, made++) {
            size_t size = rng() % 4097, i = 0, col = 0;
            while (i < size) {
                uint64_t r = rng();
                /* words of 1-8 letters, lines of about 60 characters */
                size_t w = 1 + r % 8;
                for (size_t k = 0; k < w && i < size; k++, col++) {
                    r = r * 6364136223846793005ULL + 1442695040888963407ULL;
                    buf[i++] = (char)('a' + (r >> 33) % 26);
                }
                if (i < size) {
                    char sep = col >= 60 ? '\n' : ' ';
                    col = sep == '\n' ? 0 : col + 1;
                    buf[i++] = sep;
                }
            }
            if (made % 10 == 0 && size >= sizeof NEEDLE + 1) {
                /* one line holding the needle, in the middle of the file */
                size_t at = (size - sizeof NEEDLE - 1) / 2;
                buf[at] = '\n';
                memcpy(buf + at + 1, NEEDLE, sizeof NEEDLE - 1);
                buf[at + sizeof NEEDLE] = '\n';
                needles++;
            }
            snprintf(path, sizeof path, "%s/d%03ld/s%ld/f%04ld", root, p, s, f);
            int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
            if (fd < 0)
                die("create", path);
            if (fchmod(fd, 0644) != 0)
                die("fchmod", path);
            if (size && write(fd, buf, size) != (ssize_t)size)
                die("write", path);
            if (close(fd) != 0)
                die("close", path);
            set_fixed_mtime(path);
            hash(path + strlen(root), strlen(path + strlen(root)) + 1);
            hash(&size, sizeof size);
            hash(buf, size);
            bytes += size;
        }
        snprintf(path, sizeof path, "%s/d%03ld/s%ld", root, p, s);
        set_fixed_mtime(path);
        if (s == 9 || d == dirs - 1) {
            snprintf(path, sizeof path, "%s/d%03ld", root, p);
            set_fixed_mtime(path);
        }
    }
    set_fixed_mtime(root);
    printf("files=%ld dirs=%ld bytes=%llu needles=%ld digest=%016" PRIx64 "\n", made,
           dirs + parents, bytes, needles, digest);
    return 0;
}

static int churn(const char *dir, long count)
{
    char path[4096];
    if (mkdir(dir, 0755) != 0)
        die("mkdir", dir);
    for (long i = 0; i < count; i++) {
        snprintf(path, sizeof path, "%s/c%05ld", dir, i);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd < 0)
            die("create", path);
        if (close(fd) != 0)
            die("close", path);
    }
    for (long i = 0; i < count; i++) {
        snprintf(path, sizeof path, "%s/c%05ld", dir, i);
        if (unlink(path) != 0)
            die("unlink", path);
    }
    if (rmdir(dir) != 0)
        die("rmdir", dir);
    return 0;
}

static int statsync(const char *path, long count)
{
    struct statx sx;
    for (long i = 0; i < count; i++)
        if (statx(AT_FDCWD, path, AT_STATX_FORCE_SYNC, STATX_BASIC_STATS, &sx) != 0)
            die("statx", path);
    return 0;
}

static int timeit(char **argv)
{
    struct timespec a, b;
    int status;
    clock_gettime(CLOCK_MONOTONIC, &a);
    pid_t pid = fork();
    if (pid < 0)
        die("fork", argv[0]);
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "benchtool: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            die("waitpid", argv[0]);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double secs = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    fprintf(stderr, "#ELAPSED %.6f\n", secs);
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return 128 + WTERMSIG(status);
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "mktree") == 0)
        return mktree(argv[2], atol(argv[3]), atol(argv[4]), strtoull(argv[5], NULL, 0));
    if (argc == 4 && strcmp(argv[1], "churn") == 0)
        return churn(argv[2], atol(argv[3]));
    if (argc == 4 && strcmp(argv[1], "statsync") == 0)
        return statsync(argv[2], atol(argv[3]));
    if (argc >= 3 && strcmp(argv[1], "time") == 0)
        return timeit(argv + 2);
    fprintf(stderr, "usage: benchtool mktree DIR FILES DIRS SEED | churn DIR COUNT | statsync PATH COUNT | time CMD...\n");
    return 2;
}
