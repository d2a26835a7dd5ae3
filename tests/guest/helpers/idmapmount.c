/* idmapmount SOURCE TARGET FSID COUNT: makes an idmapped bind mount of SOURCE on TARGET.
 *
 * Through TARGET, the file system's ids FSID .. FSID+COUNT-1 show as 0 .. COUNT-1 (any other
 * id as the overflow id 65534), and a caller with fsuid/fsgid U < COUNT creates files owned by
 * FSID + U in the file system. The idmapping is that of a new user namespace whose uid_map and
 * gid_map are both "FSID 0 COUNT" (namespace ids FSID.. are the caller's ids 0..): the kernel
 * maps a file system id down through the namespace's map to show it, and a caller's id up
 * through it to create.
 *
 * Steps: fork a child that unshares its user namespace; the parent writes the child's maps and
 * opens /proc/CHILD/ns/user; open_tree(OPEN_TREE_CLONE) detaches a copy of SOURCE's mount,
 * mount_setattr(MOUNT_ATTR_IDMAP) gives it the namespace's idmapping, move_mount attaches it
 * at TARGET. Each failing step is reported with its name and errno, exit status 1: a file
 * system that does not allow idmapped mounts (for FUSE: the server did not agree to
 * FUSE_ALLOW_IDMAP) fails mount_setattr with EINVAL. Raw system call numbers (x86_64), so that
 * the helper builds against any libc headers. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#define IDM_OPEN_TREE_CLONE 1
#define IDM_MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#define IDM_MOUNT_ATTR_IDMAP 0x00100000ULL
#ifndef AT_EMPTY_PATH
#define AT_EMPTY_PATH 0x1000
#endif

struct idm_mount_attr {
    uint64_t attr_set;
    uint64_t attr_clr;
    uint64_t propagation;
    uint64_t userns_fd;
};

static void die(const char *step) {
    fprintf(stderr, "idmapmount: %s: %s (errno %d)\n", step, strerror(errno), errno);
    exit(1);
}

static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) die(path);
    if (write(fd, text, strlen(text)) != (ssize_t)strlen(text)) die(path);
    close(fd);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: idmapmount SOURCE TARGET FSID COUNT\n");
        return 2;
    }
    const char *source = argv[1], *target = argv[2];
    unsigned long fsid = strtoul(argv[3], NULL, 10), count = strtoul(argv[4], NULL, 10);

    int ready[2], done[2];
    if (pipe2(ready, O_CLOEXEC) || pipe2(done, O_CLOEXEC)) die("pipe");
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        char c = 0;
        close(ready[0]);
        close(done[1]);
        if (unshare(CLONE_NEWUSER)) c = 1;
        if (write(ready[1], &c, 1) != 1) _exit(1);
        /* Keep the namespace alive until the parent holds a descriptor of it. */
        (void)!read(done[0], &c, 1);
        _exit(0);
    }
    close(ready[1]);
    close(done[0]);
    char c = 1;
    if (read(ready[0], &c, 1) != 1 || c != 0) {
        errno = c ? EPERM : EIO;
        die("unshare(CLONE_NEWUSER) in the child");
    }

    char path[64], map[96];
    snprintf(map, sizeof map, "%lu 0 %lu\n", fsid, count);
    snprintf(path, sizeof path, "/proc/%d/uid_map", (int)child);
    write_file(path, map);
    snprintf(path, sizeof path, "/proc/%d/gid_map", (int)child);
    write_file(path, map);
    snprintf(path, sizeof path, "/proc/%d/ns/user", (int)child);
    int nsfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0) die("open /proc/CHILD/ns/user");
    close(done[1]);
    waitpid(child, NULL, 0);

    int tree = (int)syscall(SYS_open_tree, AT_FDCWD, source, IDM_OPEN_TREE_CLONE | O_CLOEXEC);
    if (tree < 0) die("open_tree(OPEN_TREE_CLONE)");
    struct idm_mount_attr attr = {
        .attr_set = IDM_MOUNT_ATTR_IDMAP,
        .userns_fd = (uint64_t)nsfd,
    };
    if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof attr))
        die("mount_setattr(MOUNT_ATTR_IDMAP)");
    if (syscall(SYS_move_mount, tree, "", AT_FDCWD, target, IDM_MOVE_MOUNT_F_EMPTY_PATH))
        die("move_mount");
    close(tree);
    close(nsfd);
    return 0;
}
