
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * The kernel script's "dir" and "ship" done in-process for the local
 * backend (src/ngx_hermes_local_steps.c) against the script itself
 * (src/remote/hermes_kernel.sh, run as the module runs it): on twin
 * roots, the same exit status and words for the same argv, for a fresh
 * kernel and for what a co-tenant plants.  Everything in a temp dir.
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_hermes.h"
#include "ngx_unit_shim.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <spawn.h>
#include <sys/wait.h>
#include <cmocka.h>


/* the module's script symbol: what marks a command as the kernel script */
const char  ngx_http_hermes_script_kernel[] = "";

extern char **environ;

static char  *script;                   /* "exec 2>&1\n" + the script */
static char   tmp[] = "/tmp/hermes_unit_steps_XXXXXX";
static int    twin;


typedef struct {
    int       status;
    char      out[4096];
} step_t;


static void
run_script(char *const *args, const char *in, size_t in_len, step_t *r)
{
    int                          fd, st;
    pid_t                        pid;
    char                        *argv[16], inf[128], outf[128];
    ssize_t                      n;
    ngx_uint_t                   i;
    posix_spawn_file_actions_t   fa;

    ngx_snprintf((u_char *) inf, sizeof(inf), "%s/stdin%Z", tmp);
    ngx_snprintf((u_char *) outf, sizeof(outf), "%s/stdout%Z", tmp);

    fd = open(inf, O_WRONLY|O_CREAT|O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, in, in_len), (ssize_t) in_len);
    close(fd);

    argv[0] = "sh";
    argv[1] = "-c";
    argv[2] = script;
    argv[3] = "hermes";

    for (i = 0; args[i]; i++) {
        argv[4 + i] = args[i];
    }

    argv[4 + i] = NULL;

    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, inf, O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, outf,
                                     O_WRONLY|O_CREAT|O_TRUNC, 0600);
    assert_int_equal(posix_spawn(&pid, "/bin/sh", &fa, NULL, argv, environ),
                     0);
    posix_spawn_file_actions_destroy(&fa);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    r->status = WEXITSTATUS(st);

    fd = open(outf, O_RDONLY);
    assert_true(fd >= 0);
    n = read(fd, r->out, sizeof(r->out) - 1);
    close(fd);
    r->out[n > 0 ? n : 0] = '\0';
}


static void
run_native(char *const *args, const char *in, size_t in_len, step_t *r)
{
    ngx_http_hermes_cmd_t  c;

    ngx_memzero(&c, sizeof(c));
    c.cmd = ngx_http_hermes_script_kernel;
    c.args = args;
    c.in = (const u_char *) in;
    c.in_len = in_len;
    c.out = (u_char *) r->out;
    c.out_size = sizeof(r->out) - 1;

    assert_int_equal(ngx_http_hermes_local_steps(&c), NGX_OK);

    r->status = c.status;
    r->out[c.out_len] = '\0';
}


/* ROOT for the root, N for runs of 5 digits or more (inodes) */

static void
normalize(char *s, const char *root)
{
    char    buf[4096], *p, *q, *d;
    size_t  rl;

    rl = strlen(root);
    d = buf;

    for (p = s; *p && d < buf + sizeof(buf) - 8; /* void */) {
        if (strncmp(p, root, rl) == 0) {
            d = (char *) ngx_cpymem(d, "ROOT", 4);
            p += rl;
            continue;
        }

        for (q = p; *q >= '0' && *q <= '9'; q++) { /* void */ }

        if (q - p >= 5) {
            *d++ = 'N';
            p = q;
            continue;
        }

        *d++ = *p++;
    }

    *d = '\0';
    strcpy(s, buf);
}


/* two fresh roots, the script's and ours */

static void
twins(char *sh, char *native, mode_t mode)
{
    twin++;
    ngx_snprintf((u_char *) sh, 128, "%s/sh%d%Z", tmp, twin);
    ngx_snprintf((u_char *) native, 128, "%s/native%d%Z", tmp, twin);
    assert_int_equal(mkdir(sh, 0700), 0);
    assert_int_equal(mkdir(native, 0700), 0);
    assert_int_equal(chmod(sh, mode), 0);
    assert_int_equal(chmod(native, mode), 0);
}


/*
 * The step on both roots: the same status and words (compared only by
 * status when words is 0: an OS message worded otherwise); ours returned.
 */

static void
both(const char *verb, char *sh, char *native, char **rest, const char *in,
    size_t in_len, int words, step_t *r)
{
    char        *args[16];
    step_t       s;
    ngx_uint_t   i;

    args[0] = (char *) verb;

    for (i = 0; rest[i]; i++) {
        args[2 + i] = rest[i];
    }

    args[2 + i] = NULL;

    args[1] = sh;
    run_script(args, in, in_len, &s);
    normalize(s.out, sh);

    args[1] = native;
    run_native(args, in, in_len, r);
    normalize(r->out, native);

    assert_int_equal(r->status, s.status);

    if (words) {
        assert_string_equal(r->out, s.out);
    }
}


static void
test_fresh(void **state)
{
    int          fd;
    char         sh[128], na[128], path[256], want[256], buf[64];
    char        *roots[2];
    step_t       r;
    ssize_t      n;
    ngx_uint_t   i;
    struct stat  st;

    static char  *dir[] = { "abababababababababababababababab", "0123", "ab",
                            NULL };
    static char  *ship[] = { "abababababababababababababababab",
                             "kernel_start.py", "5", "kernel.env", "4",
                             "empty", "0", NULL };

    twins(sh, na, 0755);
    roots[0] = sh;
    roots[1] = na;

    /* 0700 directories whatever the worker's umask, as the script's */

    (void) umask(0277);
    both("dir", sh, na, dir, "", 0, 1, &r);
    (void) umask(022);
    assert_int_equal(r.status, 0);
    ngx_snprintf((u_char *) want, sizeof(want),
                 "made\ndirectory:%uD:700:N\ndirectory:%uD:700:N\n"
                 "directory:%uD:700:N\n%uD\n%Z",
                 (uint32_t) geteuid(), (uint32_t) geteuid(),
                 (uint32_t) geteuid(), (uint32_t) geteuid());
    assert_string_equal(r.out, want);

    both("ship", sh, na, ship, "pass\nT=1\n", 9, 1, &r);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, "");

    for (i = 0; i < 2; i++) {
        ngx_snprintf((u_char *) path, sizeof(path),
                     "%s/hermes_rkernel_%s/kernel.env%Z", roots[i], dir[0]);
        assert_int_equal(lstat(path, &st), 0);
        assert_int_equal(st.st_mode & 07777, 0600);
        fd = open(path, O_RDONLY);
        n = read(fd, buf, sizeof(buf));
        close(fd);
        assert_int_equal(n, 4);
        assert_memory_equal(buf, "T=1\n", 4);

        /* the journal's line names the dir's inode */

        ngx_snprintf((u_char *) path, sizeof(path),
                     "%s/hermes_rkernel_%s%Z", roots[i], dir[0]);
        assert_int_equal(lstat(path, &st), 0);
        ngx_snprintf((u_char *) want, sizeof(want), "0123 ab %uL\n%Z",
                     (uint64_t) st.st_ino);
        ngx_snprintf((u_char *) path, sizeof(path),
                     "%s/hermes_journal_%uD/%s%Z", roots[i],
                     (uint32_t) geteuid(), dir[0]);
        fd = open(path, O_RDONLY);
        assert_true(fd >= 0);
        n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        buf[n > 0 ? n : 0] = '\0';
        assert_string_equal(buf, want);
    }
}


static void
test_planted(void **state)
{
    int          fd;
    char         sh[128], na[128], path[256], canary[128];
    step_t       r;
    ngx_uint_t   how, i;
    struct stat  st;
    char        *roots[2];

    static char  *dir[] = { "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd", "0123", "ab",
                            NULL };
    static char  *ship[] = { "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd",
                             "kernel.env", "1", NULL };

    ngx_snprintf((u_char *) canary, sizeof(canary), "%s/canary%Z", tmp);
    assert_int_equal(mkdir(canary, 0700), 0);

    /* a dir, a link to the canary, a file: never taken, nothing shipped */

    for (how = 0; how < 3; how++) {
        twins(sh, na, 0755);
        roots[0] = sh;
        roots[1] = na;

        for (i = 0; i < 2; i++) {
            ngx_snprintf((u_char *) path, sizeof(path),
                         "%s/hermes_rkernel_%s%Z", roots[i], dir[0]);
            if (how == 0) {
                assert_int_equal(mkdir(path, 0777), 0);
            } else if (how == 1) {
                assert_int_equal(symlink(canary, path), 0);
            } else {
                fd = open(path, O_WRONLY|O_CREAT, 0600);
                close(fd);
            }
        }

        both("dir", sh, na, dir, "", 0, 1, &r);
        assert_int_equal(r.status, 4);
        assert_string_equal(r.out, "EEXIST\n");

        both("ship", sh, na, ship, "x", 1, 1, &r);
        assert_int_equal(r.status, how == 0 ? 0 : 1);
    }

    /* nothing through the link */

    ngx_snprintf((u_char *) path, sizeof(path), "%s/kernel.env%Z", canary);
    assert_int_equal(lstat(path, &st), -1);

    /* a link planted in our dir: the ship fails, the canary is intact */

    ngx_snprintf((u_char *) canary, sizeof(canary), "%s/canary.txt%Z", tmp);
    fd = open(canary, O_WRONLY|O_CREAT|O_EXCL, 0600);
    assert_int_equal(write(fd, "canary", 6), 6);
    close(fd);

    twins(sh, na, 0755);
    roots[0] = sh;
    roots[1] = na;
    both("dir", sh, na, dir, "", 0, 1, &r);
    assert_int_equal(r.status, 0);

    for (i = 0; i < 2; i++) {
        ngx_snprintf((u_char *) path, sizeof(path),
                     "%s/hermes_rkernel_%s/kernel.env%Z", roots[i], dir[0]);
        assert_int_equal(symlink(canary, path), 0);
    }

    both("ship", sh, na, ship, "x", 1, 0, &r);
    assert_int_equal(r.status, 1);
    assert_int_equal(lstat(canary, &st), 0);
    assert_int_equal(st.st_size, 6);
}


static void
test_roots_and_journals(void **state)
{
    char        sh[128], na[128], path[256], elsewhere[128];
    step_t      r;
    ngx_uint_t  how, i;
    char       *roots[2];

    static char  *dir[] = { "01010101010101010101010101010101", "0123", "ab",
                            NULL };

    /* writable by others: refused; sticky as well: fine */

    twins(sh, na, 0777);
    both("dir", sh, na, dir, "", 0, 1, &r);
    assert_int_equal(r.status, 3);

    twins(sh, na, 01777);
    both("dir", sh, na, dir, "", 0, 1, &r);
    assert_int_equal(r.status, 0);

    /* a journal that is a link, or not 0700 */

    ngx_snprintf((u_char *) elsewhere, sizeof(elsewhere), "%s/elsewhere%Z",
                 tmp);
    assert_int_equal(mkdir(elsewhere, 0700), 0);

    for (how = 0; how < 2; how++) {
        twins(sh, na, 0755);
        roots[0] = sh;
        roots[1] = na;

        for (i = 0; i < 2; i++) {
            ngx_snprintf((u_char *) path, sizeof(path),
                         "%s/hermes_journal_%uD%Z", roots[i],
                         (uint32_t) geteuid());
            if (how == 0) {
                assert_int_equal(symlink(elsewhere, path), 0);
            } else {
                assert_int_equal(mkdir(path, 0700), 0);
                assert_int_equal(chmod(path, 0755), 0);
            }
        }

        both("dir", sh, na, dir, "", 0, 1, &r);
        assert_int_equal(r.status, 6);
    }

    /* no root at all */

    ngx_snprintf((u_char *) path, sizeof(path), "%s/none%Z", tmp);
    both("dir", path, path, dir, "", 0, 0, &r);
    assert_int_equal(r.status, 1);
}


static void
test_bad_arguments(void **state)
{
    char        sh[128], na[128];
    step_t      r;
    ngx_uint_t  i;

    static char  *bad[][5] = {
        { "dir", "ABABABABABABABABABABABABABABABAB", "01", "ab", NULL },
        { "dir", "ababababababababababababababab", "01", "ab", NULL },
        { "dir", "abababababababababababababababab", "xyz", "ab", NULL },
        { "dir", "abababababababababababababababab", "", "", NULL },
        { "dir", "abababababababababababababababab", "01", NULL, NULL },
        { "ship", "abababababababababababababababab", "a/b", "1", NULL },
        { "ship", "abababababababababababababababab", "..", "1", NULL },
        { "ship", "abababababababababababababababab", "a", NULL, NULL },
        { "ship", "abababababababababababababababab", "a", "-1", NULL },
        { "ship", "abababababababababababababababab", "a", "1x", NULL },
        { "ship", "ab", "a", "1", NULL },
    };

    twins(sh, na, 0755);

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        both(bad[i][0], sh, na, &bad[i][1], "", 0, 1, &r);
        assert_int_equal(r.status, 2);
    }

    /* kill, recover, start: the script's */

    {
        char                   *args[] = { "kill", na, NULL };
        ngx_http_hermes_cmd_t   c;

        ngx_memzero(&c, sizeof(c));
        c.cmd = ngx_http_hermes_script_kernel;
        c.args = args;
        assert_int_equal(ngx_http_hermes_local_steps(&c), NGX_DECLINED);

        /* another command's "dir": not this script's, not ours */

        args[0] = "dir";
        c.cmd = "exit 0";
        assert_int_equal(ngx_http_hermes_local_steps(&c), NGX_DECLINED);
    }
}


static int
setup(void **state)
{
    int          fd;
    char         path[512];
    ssize_t      n;
    struct stat  st;

    if (ngx_unit_init() != NGX_OK || mkdtemp(tmp) == NULL) {
        return -1;
    }

    ngx_snprintf((u_char *) path, sizeof(path), "%s%Z", HERMES_SCRIPT);

    fd = open(path, O_RDONLY);
    if (fd == -1 || fstat(fd, &st) == -1) {
        return -1;
    }

    script = malloc(st.st_size + 16);
    memcpy(script, "exec 2>&1\n", 10);
    n = read(fd, script + 10, st.st_size);
    close(fd);

    if (n != st.st_size) {
        return -1;
    }

    script[10 + n] = '\0';

    return 0;
}


/* the umask back, whatever a test that changed it ended with */

static int
umask_back(void **state)
{
    (void) umask(022);
    return 0;
}


static int
teardown(void **state)
{
    char   cmd[256];

    ngx_snprintf((u_char *) cmd, sizeof(cmd), "rm -rf -- '%s'%Z", tmp);
    free(script);

    return system(cmd) == 0 ? 0 : -1;
}


int
main(void)
{
    static const struct CMUnitTest  tests[] = {
        cmocka_unit_test_teardown(test_fresh, umask_back),
        cmocka_unit_test(test_planted),
        cmocka_unit_test(test_roots_and_journals),
        cmocka_unit_test(test_bad_arguments),
    };

    return cmocka_run_group_tests_name("local_steps", tests, setup,
                                       teardown);
}
