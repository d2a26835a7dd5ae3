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
 *
 * KIND: flock-sh, flock-ex (flock(2); START and LEN ignored), posix-rd, posix-wr (F_SETLK),
 * ofd-rd, ofd-wr (F_OFD_SETLK). Files are opened read-write (read-only for the -rd and -sh
 * kinds when read-write is refused). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
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
            int fd = open_for(argv[i], argv[i + 1]);
            if (take(fd, argv[i], atol(argv[i + 2]), atol(argv[i + 3]), 0) < 0) {
                printf("hold %s %s: %s\n", argv[i], argv[i + 1], ename(errno));
                return 1;
            }
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
