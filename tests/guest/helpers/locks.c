/* locks: takes, tests and holds file locks, for the lock tests (in the guest and on the host).
 *
 *   locks try KIND FILE START LEN     one attempt without waiting; prints "ok", or the error
 *                                     name (EAGAIN, EBADF, ...) and exits 1
 *   locks getlk FILE START LEN        F_GETLK for a write lock: "unlocked", or
 *                                     "TYPE START LEN PID" of the lock in the way
 *   locks ofdgetlk FILE START LEN     the same with F_OFD_GETLK
 *   locks wait KIND FILE START LEN    waits for the lock (F_SETLKW, F_OFD_SETLKW, flock); prints
 *                                     "got MS" (milliseconds waited) and exits
 *   locks hold READY UNTIL SPEC...    takes each SPEC (KIND FILE START LEN, without waiting;
 *                                     exits 1 naming the one refused), creates the file READY,
 *                                     then holds them until the file UNTIL exists ("-": until
 *                                     killed)
 *   locks semantics FILE fuse|local   the lock semantics of one process with several
 *                                     descriptors of FILE (OFD against POSIX, two open file
 *                                     descriptions, closing another descriptor, flock through
 *                                     a dup, flock conversions): one "ok NAME" or
 *                                     "not ok NAME: ..." line per check, exit 1 when one failed.
 *                                     "local": the pids F_GETLK and F_OFD_GETLK report on a
 *                                     local file system; "fuse": those a FUSE client reports
 *                                     (its reply carries no lock kind: F_OFD_GETLK always says
 *                                     -1, F_GETLK the pid the server gives, for an OFD lock too)
 *
 * KIND: flock-sh, flock-ex (flock(2); START and LEN ignored), posix-rd, posix-wr (F_SETLK),
 * ofd-rd, ofd-wr (F_OFD_SETLK). Files are opened read-write (read-only for the -rd and -sh
 * kinds when read-write is refused). In a SPEC of hold, KIND+close2 also opens FILE once more
 * and closes that second descriptor after taking the lock: a POSIX lock goes with it, an OFD
 * or flock lock stays. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *ename(int e) {
    switch (e) {
    case EAGAIN: return "EAGAIN";
    case EACCES: return "EACCES";
    case EBADF: return "EBADF";
    case EINTR: return "EINTR";
    case ENOLCK: return "ENOLCK";
    case EDEADLK: return "EDEADLK";
    case EINVAL: return "EINVAL";
    case ENOENT: return "ENOENT";
    default: return strerror(e);
    }
}

static int open_for(const char *kind, const char *file) {
    int fd = open(file, O_RDWR);
    if (fd < 0 && (strstr(kind, "-rd") || strstr(kind, "-sh")))
        fd = open(file, O_RDONLY);
    if (fd < 0) {
        printf("open %s: %s\n", file, ename(errno));
        exit(2);
    }
    return fd;
}

/* Takes (or waits for) the lock KIND on fd; 0 or -1 with errno. */
static int take(int fd, const char *kind, long start, long len, int wait) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_whence = SEEK_SET;
    fl.l_start = start;
    fl.l_len = len;
    if (!strcmp(kind, "flock-sh"))
        return flock(fd, LOCK_SH | (wait ? 0 : LOCK_NB));
    if (!strcmp(kind, "flock-ex"))
        return flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB));
    fl.l_type = strstr(kind, "-rd") ? F_RDLCK : F_WRLCK;
    if (!strncmp(kind, "posix-", 6))
        return fcntl(fd, wait ? F_SETLKW : F_SETLK, &fl);
    if (!strncmp(kind, "ofd-", 4))
        return fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl);
    fprintf(stderr, "unknown kind %s\n", kind);
    exit(2);
}

static long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

static int getlk(const char *file, long start, long len, int cmd) {
    int fd = open_for("posix-rd", file);
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = start;
    fl.l_len = len;
    if (fcntl(fd, cmd, &fl) < 0) {
        printf("%s\n", ename(errno));
        return 1;
    }
    if (fl.l_type == F_UNLCK)
        printf("unlocked\n");
    else
        printf("%s %ld %ld %d\n", fl.l_type == F_WRLCK ? "W" : "R", (long)fl.l_start,
               (long)fl.l_len, (int)fl.l_pid);
    return 0;
}


/* --- semantics: one process, several descriptors of one file ------------------------------ */

static int sem_failed, sem_fuse;
static const char *sem_file;

static void verdict(const char *name, const char *got, const char *want) {
    if (!strcmp(got, want)) {
        printf("ok %s\n", name);
    } else {
        printf("not ok %s: got '%s', want '%s'\n", name, got, want);
        sem_failed = 1;
    }
    fflush(stdout);
}

static int sopen(void) {
    int fd = open(sem_file, O_RDWR);
    if (fd < 0) {
        printf("not ok open %s: %s\n", sem_file, ename(errno));
        exit(1);
    }
    return fd;
}

/* A record lock request without waiting: "ok" or the error's name. */
static const char *rec(int fd, int cmd, short type, long start, long len) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = start;
    fl.l_len = len;
    return fcntl(fd, cmd, &fl) < 0 ? ename(errno) : "ok";
}

/* flock without waiting: "ok" or the error's name (EWOULDBLOCK is EAGAIN). */
static const char *flk(int fd, int op) {
    return flock(fd, op | LOCK_NB) < 0 ? ename(errno) : "ok";
}

/* F_GETLK or F_OFD_GETLK for a write lock: "unlocked" or "TYPE START LEN PID". */
static const char *test(int fd, int cmd, long start, long len) {
    static char out[64];
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = start;
    fl.l_len = len;
    if (fcntl(fd, cmd, &fl) < 0)
        return ename(errno);
    if (fl.l_type == F_UNLCK)
        return "unlocked";
    snprintf(out, sizeof out, "%s %ld %ld %d", fl.l_type == F_WRLCK ? "W" : "R", (long)fl.l_start,
             (long)fl.l_len, (int)fl.l_pid);
    return out;
}

static const char *lockline(const char *type, long start, long len, int pid) {
    static char out[64];
    snprintf(out, sizeof out, "%s %ld %ld %d", type, start, len, pid);
    return out;
}

static int semantics(void) {
    int me = getpid(), a, b, c, d;

    /* An OFD lock belongs to its open file description: it conflicts with the POSIX locks of
     * the process that holds it (another owner), both ways. */
    a = sopen(), b = sopen(), c = sopen();
    verdict("ofd-write-lock-taken", rec(a, F_OFD_SETLK, F_WRLCK, 0, 10), "ok");
    verdict("ofd-lock-refuses-a-posix-write-lock-of-the-same-process",
            rec(b, F_SETLK, F_WRLCK, 5, 1), "EAGAIN");
    verdict("ofd-lock-refuses-a-posix-read-lock-of-the-same-process",
            rec(b, F_SETLK, F_RDLCK, 0, 1), "EAGAIN");
    verdict("posix-lock-beside-the-ofd-lock-granted", rec(b, F_SETLK, F_WRLCK, 10, 5), "ok");
    verdict("f-getlk-reports-the-ofd-lock", test(b, F_GETLK, 0, 10),
            lockline("W", 0, 10, sem_fuse ? me : -1));
    verdict("f-ofd-getlk-reports-the-ofd-lock-with-pid-minus-1", test(c, F_OFD_GETLK, 0, 10),
            lockline("W", 0, 10, -1));
    close(a), close(b), close(c);

    a = sopen(), b = sopen();
    verdict("posix-write-lock-taken", rec(a, F_SETLK, F_WRLCK, 0, 10), "ok");
    verdict("posix-lock-refuses-an-ofd-write-lock-of-the-same-process",
            rec(b, F_OFD_SETLK, F_WRLCK, 0, 1), "EAGAIN");
    verdict("posix-lock-refuses-an-ofd-read-lock-of-the-same-process",
            rec(b, F_OFD_SETLK, F_RDLCK, 9, 1), "EAGAIN");
    verdict("ofd-lock-beside-the-posix-lock-granted", rec(b, F_OFD_SETLK, F_WRLCK, 10, 1), "ok");
    verdict("f-ofd-getlk-reports-the-posix-lock", test(b, F_OFD_GETLK, 0, 10),
            lockline("W", 0, 10, sem_fuse ? -1 : me));
    close(a), close(b);

    /* Two open file descriptions of one process: two OFD owners. */
    a = sopen(), b = sopen();
    verdict("ofd-write-lock-on-one-description", rec(a, F_OFD_SETLK, F_WRLCK, 0, 10), "ok");
    verdict("ofd-write-lock-of-a-second-description-refused",
            rec(b, F_OFD_SETLK, F_WRLCK, 5, 1), "EAGAIN");
    verdict("ofd-read-lock-of-a-second-description-refused",
            rec(b, F_OFD_SETLK, F_RDLCK, 0, 1), "EAGAIN");
    verdict("f-ofd-getlk-of-the-second-description", test(b, F_OFD_GETLK, 0, 10),
            lockline("W", 0, 10, -1));
    verdict("ofd-downgrade-to-read", rec(a, F_OFD_SETLK, F_RDLCK, 0, 10), "ok");
    verdict("ofd-read-locks-of-two-descriptions-coexist",
            rec(b, F_OFD_SETLK, F_RDLCK, 0, 10), "ok");
    verdict("ofd-write-lock-over-a-shared-read-lock-refused",
            rec(b, F_OFD_SETLK, F_WRLCK, 0, 1), "EAGAIN");
    verdict("f-ofd-getlk-reports-the-read-lock", test(b, F_OFD_GETLK, 5, 5),
            lockline("R", 0, 10, -1));
    verdict("ofd-unlock", rec(a, F_OFD_SETLK, F_UNLCK, 0, 0), "ok");
    verdict("ofd-upgrade-once-alone", rec(b, F_OFD_SETLK, F_WRLCK, 0, 10), "ok");
    close(a), close(b);

    /* Closing another descriptor of the file: POSIX locks go (any close by the process), OFD
     * locks stay until their description's last close. */
    a = sopen();
    verdict("ofd-lock-before-the-closes", rec(a, F_OFD_SETLK, F_WRLCK, 0, 10), "ok");
    close(sopen());
    d = dup(a);
    close(d);
    c = sopen();
    verdict("ofd-lock-stays-after-another-descriptor-and-a-dup-close",
            rec(c, F_OFD_SETLK, F_WRLCK, 0, 1), "EAGAIN");
    close(a);
    verdict("ofd-lock-goes-with-its-descriptions-last-close",
            rec(c, F_OFD_SETLK, F_WRLCK, 0, 1), "ok");
    close(c);
    a = sopen(), b = sopen(), c = sopen();
    verdict("posix-lock-before-the-close", rec(a, F_SETLK, F_WRLCK, 0, 10), "ok");
    verdict("posix-lock-seen-from-another-description", test(c, F_OFD_GETLK, 0, 10),
            lockline("W", 0, 10, sem_fuse ? -1 : me));
    close(b);
    verdict("posix-lock-goes-when-another-descriptor-closes", test(c, F_OFD_GETLK, 0, 10),
            "unlocked");
    close(a), close(c);

    /* flock through a dup is the same lock; a conversion drops the old lock first. */
    a = sopen(), b = sopen();
    verdict("flock-exclusive", flk(a, LOCK_EX), "ok");
    d = dup(a);
    verdict("flock-through-a-dup-is-the-same-lock", flk(d, LOCK_EX), "ok");
    verdict("flock-of-another-description-refused", flk(b, LOCK_SH), "EAGAIN");
    close(d);
    verdict("flock-stays-after-the-dup-closes", flk(b, LOCK_SH), "EAGAIN");
    d = dup(a);
    verdict("flock-unlock-through-a-dup", flk(d, LOCK_UN), "ok");
    verdict("flock-free-after-the-unlock-through-the-dup", flk(b, LOCK_EX), "ok");
    close(a), close(b), close(d);

    a = sopen(), b = sopen(), c = sopen();
    verdict("flock-shared-a", flk(a, LOCK_SH), "ok");
    verdict("flock-shared-b-beside-it", flk(b, LOCK_SH), "ok");
    verdict("flock-upgrade-refused-while-another-shares", flk(a, LOCK_EX), "EAGAIN");
    verdict("flock-refused-upgrade-left-no-lock", flk(b, LOCK_EX), "ok");
    verdict("flock-upgraded-lock-excludes", flk(c, LOCK_SH), "EAGAIN");
    verdict("flock-downgrade", flk(b, LOCK_SH), "ok");
    verdict("flock-shared-after-the-downgrade", flk(c, LOCK_SH), "ok");
    verdict("flock-exclusive-refused-beside-shared", flk(a, LOCK_EX), "EAGAIN");
    close(a), close(b), close(c);

    /* A POSIX lock of another process against an OFD lock, and the pid F_GETLK gives. */
    int ready[2], go[2];
    if (pipe(ready) < 0 || pipe(go) < 0) {
        printf("not ok pipe: %s\n", ename(errno));
        return 1;
    }
    pid_t child = fork();
    if (child == 0) {
        char x = 0;
        int fd = sopen();
        x = rec(fd, F_SETLK, F_WRLCK, 0, 10)[0];
        if (write(ready[1], &x, 1) != 1 || read(go[0], &x, 1) < 0)
            _exit(1);
        _exit(0);
    }
    char x = 0;
    if (child < 0 || read(ready[0], &x, 1) != 1 || x != 'o') {
        printf("not ok child-takes-a-posix-lock\n");
        return 1;
    }
    c = sopen();
    verdict("posix-lock-of-another-process-refuses-an-ofd-lock",
            rec(c, F_OFD_SETLK, F_WRLCK, 0, 1), "EAGAIN");
    verdict("f-getlk-names-the-other-process", test(c, F_GETLK, 0, 10),
            lockline("W", 0, 10, child));
    if (write(go[1], &x, 1) != 1)
        return 1;
    waitpid(child, NULL, 0);
    verdict("ofd-lock-once-the-other-process-exited", rec(c, F_OFD_SETLK, F_WRLCK, 0, 1), "ok");
    close(c);
    return sem_failed;
}

int main(int argc, char **argv) {
    if (argc >= 6 && !strcmp(argv[1], "try")) {
        int fd = open_for(argv[2], argv[3]);
        if (take(fd, argv[2], atol(argv[4]), atol(argv[5]), 0) < 0) {
            printf("%s\n", ename(errno == EWOULDBLOCK ? EAGAIN : errno));
            return 1;
        }
        printf("ok\n");
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "semantics")) {
        sem_file = argv[2];
        sem_fuse = !strcmp(argv[3], "fuse");
        return semantics();
    }
    if (argc >= 5 && !strcmp(argv[1], "getlk"))
        return getlk(argv[2], atol(argv[3]), atol(argv[4]), F_GETLK);
    if (argc >= 5 && !strcmp(argv[1], "ofdgetlk"))
        return getlk(argv[2], atol(argv[3]), atol(argv[4]), F_OFD_GETLK);
    if (argc >= 6 && !strcmp(argv[1], "wait")) {
        int fd = open_for(argv[2], argv[3]);
        long t0 = now_ms();
        if (take(fd, argv[2], atol(argv[4]), atol(argv[5]), 1) < 0) {
            printf("%s\n", ename(errno));
            return 1;
        }
        printf("got %ld\n", now_ms() - t0);
        fflush(stdout);
        return 0;
    }
    if (argc >= 8 && (argc - 4) % 4 == 0 && !strcmp(argv[1], "hold")) {
        const char *ready = argv[2], *until = argv[3];
        for (int i = 4; i < argc; i += 4) {
            char kind[32];
            snprintf(kind, sizeof kind, "%s", argv[i]);
            char *plus = strchr(kind, '+');
            int close2 = plus && !strcmp(plus, "+close2");
            if (plus)
                *plus = 0;
            int fd = open_for(kind, argv[i + 1]);
            if (take(fd, kind, atol(argv[i + 2]), atol(argv[i + 3]), 0) < 0) {
                printf("hold %s %s: %s\n", argv[i], argv[i + 1], ename(errno));
                return 1;
            }
            if (close2)
                close(open_for(kind, argv[i + 1]));
        }
        int r = open(ready, O_WRONLY | O_CREAT, 0644);
        if (r < 0) {
            printf("create %s: %s\n", ready, ename(errno));
            return 1;
        }
        close(r);
        for (;;) {
            if (strcmp(until, "-") && access(until, F_OK) == 0)
                return 0;
            usleep(20000);
        }
    }
    fprintf(stderr, "usage: see the top of locks.c\n");
    return 2;
}
