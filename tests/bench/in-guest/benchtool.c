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
 *   benchtool readtree DIR
 *       Reads every regular file below DIR (open, read to the end, close; directories walked
 *       with readdir and d_type, nothing stat'ed). Prints "files=N bytes=N".
 *
 *   benchtool lstattree DIR
 *       lstat()s every entry below DIR (files and directories, walked with readdir) and DIR
 *       itself, as `ls -l`, `tar` or `make` would. Prints "entries=N files=N".
 *
 *   benchtool mkproj DIR SOURCES SEED
 *       Creates DIR (must not exist) holding a C project shaped like a real one, for the build
 *       steps: SOURCES .c files spread over 8 source directories (src/mK/cNNNN.c, each
 *       directory with its own mod.h), SOURCES*3/10 (at least 8) headers hNNN.h spread over 6
 *       include directories (inc/i0 .. inc/i5, searched in that order with -I, most headers in
 *       the later ones), every header including up to three others, every source including
 *       its mod.h and 6-10 headers, so that most `#include "x.h"` fail in the source's (or
 *       header's) own directory and in the earlier -I directories before they are found. No
 *       system header is used (compiled with -nostdinc). A Makefile builds each source into
 *       an object next to it with `tcc -MD` (dependency files included by the Makefile) and
 *       has a `clean` target. Files get the fixed old mtime, so any object built later is
 *       newer. Prints "sources=N headers=N bytes=N digest=HEX" (the digest covers every path
 *       and byte written).
 *
 *   benchtool mark DIR
 *       fsync()s the directory DIR: an FSYNCDIR request on virtio-fs, which no step sends, so
 *       that the daemon's debug log can be cut into steps.
 *
 *   benchtool time CMD [ARGS...]
 *       Runs CMD and prints "#ELAPSED SECONDS" (CLOCK_MONOTONIC, microseconds) on stderr when
 *       it has exited; exits with CMD's status.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <inttypes.h>
#include <stdarg.h>
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

/* --- readtree, lstattree ------------------------------------------------------------------ */

static long walk_files, walk_entries;
static unsigned long long walk_bytes;

/* walk DIR (a path of at most 4095 bytes): read every regular file, or lstat every entry */
static void walk(char *path, size_t len, int read_files)
{
    DIR *d = opendir(path);
    struct dirent *e;
    static char buf[65536];
    if (!d)
        die("opendir", path);
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (len + 1 + n >= 4096) {
            errno = ENAMETOOLONG;
            die("walk", path);
        }
        path[len] = '/';
        memcpy(path + len + 1, e->d_name, n + 1);
        unsigned char type = e->d_type;
        if (!read_files || type == DT_UNKNOWN) {
            struct stat st;
            if (lstat(path, &st) != 0)
                die("lstat", path);
            walk_entries++;
            type = S_ISDIR(st.st_mode) ? DT_DIR : S_ISREG(st.st_mode) ? DT_REG : DT_UNKNOWN;
        }
        if (type == DT_DIR) {
            walk(path, len + 1 + n, read_files);
        } else if (type == DT_REG) {
            walk_files++;
            if (read_files) {
                int fd = open(path, O_RDONLY);
                ssize_t got;
                if (fd < 0)
                    die("open", path);
                while ((got = read(fd, buf, sizeof buf)) > 0)
                    walk_bytes += (unsigned long long)got;
                if (got < 0)
                    die("read", path);
                close(fd);
            }
        }
        path[len] = '\0';
    }
    closedir(d);
}

static int walktree(const char *dir, int read_files)
{
    char path[4096];
    if (strlen(dir) >= sizeof path) {
        errno = ENAMETOOLONG;
        die("walk", dir);
    }
    strcpy(path, dir);
    if (!read_files) {
        struct stat st;
        if (lstat(path, &st) != 0)
            die("lstat", path);
        walk_entries++;
    }
    walk(path, strlen(path), read_files);
    if (read_files)
        printf("files=%ld bytes=%llu\n", walk_files, walk_bytes);
    else
        printf("entries=%ld files=%ld\n", walk_entries, walk_files);
    return 0;
}

/* --- mkproj ---------------------------------------------------------------------------------- */

#define PROJ_SRCDIRS 8
#define PROJ_INCDIRS 6

static unsigned long long proj_bytes;

/* write a generated file (contents in buf), with the fixed mtime, into the digest */
static void put_file(const char *root, const char *rel, const char *buf, size_t size)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, rel);
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
    hash(rel, strlen(rel) + 1);
    hash(&size, sizeof size);
    hash(buf, size);
    proj_bytes += size;
}

/* appends to a growing text buffer */
struct text {
    char *p;
    size_t len, cap;
};

static void add(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(struct text *t, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            fprintf(stderr, "benchtool: vsnprintf failed\n");
            exit(1);
        }
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        t->cap = t->cap * 2 + (size_t)n + 1;
        t->p = realloc(t->p, t->cap);
        if (!t->p) {
            fprintf(stderr, "benchtool: out of memory\n");
            exit(1);
        }
    }
}

/* n distinct numbers below limit (n <= limit), in increasing order */
static int pick(long *out, int n, long limit)
{
    int k = 0;
    while (k < n) {
        long v = (long)(rng() % (uint64_t)limit), i;
        for (i = 0; i < k && out[i] != v; i++)
            ;
        if (i == k)
            out[k++] = v;
    }
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
            long t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return n;
}

static int mkproj(const char *root, long sources, uint64_t seed)
{
    char rel[256], path[4096];
    long headers = sources * 3 / 10 < 8 ? 8 : sources * 3 / 10;
    struct text t = {0};
    long picked[16];
    /* which include directory each header lives in: weights 1,1,2,3,5,8 of 20 */
    static const int weight[PROJ_INCDIRS] = {1, 1, 2, 3, 5, 8};
    int *incdir;

    if (sources < 1 || sources > 99999) {
        fprintf(stderr, "benchtool: mkproj: SOURCES must be 1..99999\n");
        return 2;
    }
    incdir = calloc((size_t)headers, sizeof *incdir);
    if (!incdir) {
        fprintf(stderr, "benchtool: out of memory\n");
        return 1;
    }
    rng_state = seed ? seed * 0x9E3779B97F4A7C15ULL : 1;
    make_dir(root);
    snprintf(path, sizeof path, "%s/inc", root);
    make_dir(path);
    snprintf(path, sizeof path, "%s/src", root);
    make_dir(path);
    for (int i = 0; i < PROJ_INCDIRS; i++) {
        snprintf(path, sizeof path, "%s/inc/i%d", root, i);
        make_dir(path);
    }
    for (int m = 0; m < PROJ_SRCDIRS; m++) {
        snprintf(path, sizeof path, "%s/src/m%d", root, m);
        make_dir(path);
    }

    for (long h = 0; h < headers; h++) {
        int w = (int)(rng() % 20), d = 0;
        while (w >= weight[d]) w -= weight[d++];
        incdir[h] = d;
    }
    for (long h = 0; h < headers; h++) {
        uint64_t mul = 3 + rng() % 97, add_c = rng() % 1000;
        int nincl = h == 0 ? 0 : (int)(rng() % 4);
        if (nincl > h)
            nincl = (int)h;
        t.len = 0;
        add(&t, "/* h%03ld.h: generated by benchtool mkproj */\n#ifndef BENCH_H%03ld_H\n#define BENCH_H%03ld_H\n\n", h, h, h);
        pick(picked, nincl, h);
        for (int k = 0; k < nincl; k++)
            add(&t, "#include \"h%03ld.h\"\n", picked[k]);
        add(&t, "\ntypedef struct h%03ld_s {\n    int id;\n    int vals[%d];\n    long total;\n} h%03ld_t;\n\n",
            h, 2 + (int)(rng() % 14), h);
        add(&t, "#define H%03ld_SCALE(x) ((x) * %d + %d)\n", h, (int)mul, (int)add_c);
        add(&t, "enum { H%03ld_A = %d, H%03ld_B = %d };\n\n", h, (int)(rng() % 100), h, (int)(rng() % 100));
        add(&t, "static inline int h%03ld_mix(int x)\n{\n    return (x ^ %d) * H%03ld_A + H%03ld_B;\n}\n\n",
            h, (int)(rng() % 4096), h, h);
        add(&t, "int h%03ld_sum(const h%03ld_t *p, int n);\n\n#endif\n", h, h);
        snprintf(rel, sizeof rel, "inc/i%d/h%03ld.h", incdir[h], h);
        put_file(root, rel, t.p, t.len);
    }
    for (int m = 0; m < PROJ_SRCDIRS; m++) {
        t.len = 0;
        add(&t, "/* mod.h of src/m%d: generated by benchtool mkproj */\n#ifndef BENCH_M%d_MOD_H\n"
                "#define BENCH_M%d_MOD_H\n#define MOD_ID %d\nint m%d_entry(int x);\n#endif\n",
            m, m, m, m, m);
        snprintf(rel, sizeof rel, "src/m%d/mod.h", m);
        put_file(root, rel, t.p, t.len);
    }
    for (long c = 0; c < sources; c++) {
        int nincl = 6 + (int)(rng() % 5);
        pick(picked, nincl, headers);
        t.len = 0;
        add(&t, "/* c%04ld.c: generated by benchtool mkproj */\n#include \"mod.h\"\n", c);
        for (int k = 0; k < nincl; k++)
            add(&t, "#include \"h%03ld.h\"\n", picked[k]);
        add(&t, "\nstatic int c%04ld_table[%d];\n\n", c, 16 + (int)(rng() % 48));
        for (int k = 0; k < nincl; k++) {
            long h = picked[k];
            add(&t, "int h%03ld_sum_%04ld(const h%03ld_t *p, int n)\n{\n    long s = p->total;\n"
                    "    int i;\n    for (i = 0; i < n && i < (int)(sizeof p->vals / sizeof p->vals[0]); i++)\n"
                    "        s += H%03ld_SCALE(p->vals[i]) ^ h%03ld_mix(i + MOD_ID);\n"
                    "    c%04ld_table[i %% %d] += (int)s;\n    return (int)(s %% %d);\n}\n\n",
                h, c, h, h, h, c, 16, 1000 + (int)(rng() % 9000));
        }
        add(&t, "int c%04ld_main(int x)\n{\n    int r = x;\n", c);
        for (int k = 0; k < nincl; k++)
            add(&t, "    {\n        h%03ld_t v;\n        v.id = r;\n        v.total = H%03ld_A;\n"
                    "        v.vals[0] = r + %d;\n        r += h%03ld_sum_%04ld(&v, 1);\n    }\n",
                picked[k], picked[k], (int)(rng() % 100), picked[k], c);
        add(&t, "    return r;\n}\n");
        snprintf(rel, sizeof rel, "src/m%ld/c%04ld.c", c % PROJ_SRCDIRS, c);
        put_file(root, rel, t.p, t.len);
    }
    t.len = 0;
    add(&t, "# generated by benchtool mkproj\nCC = /usr/bin/tcc\nCFLAGS = -nostdinc");
    for (int i = 0; i < PROJ_INCDIRS; i++)
        add(&t, " -Iinc/i%d", i);
    add(&t, "\n\nOBJS =");
    for (long c = 0; c < sources; c++)
        add(&t, " \\\n\tsrc/m%ld/c%04ld.o", c % PROJ_SRCDIRS, c);
    add(&t, "\n\nall: $(OBJS)\n\n%%.o: %%.c\n\t$(CC) $(CFLAGS) -MD -MF $*.d -c $< -o $@\n\n"
            "clean:\n\trm -f $(OBJS) $(OBJS:.o=.d)\n\n.PHONY: all clean\n\n-include $(OBJS:.o=.d)\n");
    put_file(root, "Makefile", t.p, t.len);

    for (int m = 0; m < PROJ_SRCDIRS; m++) {
        snprintf(path, sizeof path, "%s/src/m%d", root, m);
        set_fixed_mtime(path);
    }
    for (int i = 0; i < PROJ_INCDIRS; i++) {
        snprintf(path, sizeof path, "%s/inc/i%d", root, i);
        set_fixed_mtime(path);
    }
    snprintf(path, sizeof path, "%s/src", root);
    set_fixed_mtime(path);
    snprintf(path, sizeof path, "%s/inc", root);
    set_fixed_mtime(path);
    set_fixed_mtime(root);
    printf("sources=%ld headers=%ld bytes=%llu digest=%016" PRIx64 "\n", sources, headers, proj_bytes,
           digest);
    free(t.p);
    free(incdir);
    return 0;
}

static int mark(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        die("open", dir);
    if (fsync(fd) != 0)
        die("fsync", dir);
    close(fd);
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
    if (argc == 3 && strcmp(argv[1], "readtree") == 0)
        return walktree(argv[2], 1);
    if (argc == 3 && strcmp(argv[1], "lstattree") == 0)
        return walktree(argv[2], 0);
    if (argc == 5 && strcmp(argv[1], "mkproj") == 0)
        return mkproj(argv[2], atol(argv[3]), strtoull(argv[4], NULL, 0));
    if (argc == 3 && strcmp(argv[1], "mark") == 0)
        return mark(argv[2]);
    if (argc >= 3 && strcmp(argv[1], "time") == 0)
        return timeit(argv + 2);
    fprintf(stderr, "usage: benchtool mktree DIR FILES DIRS SEED | churn DIR COUNT | statsync PATH COUNT |\n"
                    "       readtree DIR | lstattree DIR | mkproj DIR SOURCES SEED | mark DIR | time CMD...\n");
    return 2;
}
