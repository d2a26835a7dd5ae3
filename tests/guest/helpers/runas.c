/* runas UID GID CMD [ARGS...]: drops supplementary groups, sets gid then uid, and execs CMD. */
#define _GNU_SOURCE
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: runas UID GID CMD [ARGS...]\n"); return 2; }
    uid_t uid = (uid_t)strtoul(argv[1], NULL, 10);
    gid_t gid = (gid_t)strtoul(argv[2], NULL, 10);
    if (setgroups(0, NULL) || setgid(gid) || setuid(uid)) { perror("runas"); return 126; }
    execvp(argv[3], argv + 3);
    perror("runas: exec");
    return 127;
}
