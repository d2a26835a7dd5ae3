/* xattr: setxattr/getxattr/listxattr/removexattr from the command line (busybox has no
 * setfattr/getfattr).
 *
 *   xattr set PATH NAME VALUE [create|replace]   VALUE "hex:0102..." sets those bytes
 *   xattr get PATH NAME          prints the value (then a newline)
 *   xattr list PATH              prints one name per line
 *   xattr remove PATH NAME
 *   xattr lset/lget/llist/lremove ...   the same on a symlink itself (l*xattr)
 *
 * On failure prints "xattr: OP: <strerror>" to stderr and exits with 1, except that ENODATA
 * exits 3, ERANGE 4, EROFS 5, ENOTSUP 6, EEXIST 7 (so scripts can tell them apart).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

static int fail(const char *op) {
    int e = errno;
    fprintf(stderr, "xattr: %s: %s\n", op, strerror(e));
    switch (e) {
    case ENODATA: return 3;
    case ERANGE: return 4;
    case EROFS: return 5;
    case ENOTSUP: return 6;
    case EEXIST: return 7;
    default: return 1;
    }
}

/* The bytes of VALUE: "hex:..." decoded (into a static buffer), anything else as is. */
static const char *value_of(const char *v, size_t *len) {
    static char bin[4096];
    if (strncmp(v, "hex:", 4)) { *len = strlen(v); return v; }
    v += 4;
    size_t n = 0;
    while (v[0] && v[1] && n < sizeof bin) {
        unsigned b;
        if (sscanf(v, "%2x", &b) != 1) break;
        bin[n++] = (char)b;
        v += 2;
    }
    *len = n;
    return bin;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: xattr set|get|list|remove PATH [NAME [VALUE [create|replace]]]\n");
        return 2;
    }
    const char *op = argv[1], *path = argv[2];
    int l = op[0] == 'l' && strcmp(op, "list") != 0;
    if (l) op++;
    if (!strcmp(op, "set") && argc >= 5) {
        int flags = 0;
        if (argc >= 6) flags = !strcmp(argv[5], "create") ? XATTR_CREATE : XATTR_REPLACE;
        size_t len;
        const char *val = value_of(argv[4], &len);
        int r = l ? lsetxattr(path, argv[3], val, len, flags)
                  : setxattr(path, argv[3], val, len, flags);
        return r ? fail("setxattr") : 0;
    }
    if (!strcmp(op, "get") && argc == 4) {
        ssize_t n = l ? lgetxattr(path, argv[3], NULL, 0) : getxattr(path, argv[3], NULL, 0);
        if (n < 0) return fail("getxattr(size)");
        char *buf = malloc(n + 1);
        n = l ? lgetxattr(path, argv[3], buf, n) : getxattr(path, argv[3], buf, n);
        if (n < 0) return fail("getxattr");
        fwrite(buf, 1, n, stdout);
        putchar('\n');
        return 0;
    }
    if (!strcmp(op, "list") || !strcmp(op, "llist")) {
        ssize_t n = l ? llistxattr(path, NULL, 0) : listxattr(path, NULL, 0);
        if (n < 0) return fail("listxattr(size)");
        char *buf = malloc(n + 1);
        n = l ? llistxattr(path, buf, n) : listxattr(path, buf, n);
        if (n < 0) return fail("listxattr");
        for (ssize_t i = 0; i < n; i += strlen(buf + i) + 1) puts(buf + i);
        return 0;
    }
    if (!strcmp(op, "remove") && argc == 4) {
        int r = l ? lremovexattr(path, argv[3]) : removexattr(path, argv[3]);
        return r ? fail("removexattr") : 0;
    }
    fprintf(stderr, "xattr: bad arguments\n");
    return 2;
}
