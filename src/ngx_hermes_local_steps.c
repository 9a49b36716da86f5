
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: the kernel script's "dir" and "ship" steps done in-process
 * on the nginx host (the local backend), as src/remote/hermes_kernel.sh
 * does them, with its argv, output and exit statuses, without the dozen
 * processes it runs for the two.  Over ssh the agent does the same
 * (hermes_agent.py, KernelStep).  Thread pool only: they touch the disk.
 */


#include "ngx_hermes.h"


#define NGX_HTTP_HERMES_STEP_DIRS                                             \
    (O_RDONLY|O_DIRECTORY|O_NOFOLLOW|O_CLOEXEC)


typedef struct {
    u_char                        *p;
    u_char                        *last;
    int                            status;
} ngx_http_hermes_step_out_t;


static ngx_int_t ngx_http_hermes_step_dir(ngx_http_hermes_step_out_t *o,
    char *const *a, ngx_uint_t n);
static ngx_int_t ngx_http_hermes_step_ship(ngx_http_hermes_step_out_t *o,
    char *const *a, ngx_uint_t n, const u_char *in, size_t in_len);
static ngx_int_t ngx_http_hermes_step_fail(ngx_http_hermes_step_out_t *o,
    int status, const char *fmt, ...);
static ngx_uint_t ngx_http_hermes_step_is_id(const char *s);
static const char *ngx_http_hermes_step_type(struct stat *st);


static const char  ngx_http_hermes_step_usage[] =
    "usage: dir|ship|start|kill|recover ARG...";


/*
 * NGX_DECLINED: not a step done here (the script runs it); else
 * cmd->status and cmd->out as the script's would be.
 */

ngx_int_t
ngx_http_hermes_local_steps(ngx_http_hermes_cmd_t *cmd)
{
    ngx_uint_t                   n;
    ngx_http_hermes_step_out_t   o;

    if (!ngx_http_hermes_cmd_is_step(cmd)) {
        return NGX_DECLINED;
    }

    for (n = 1; cmd->args[n]; n++) { /* void */ }

    o.p = cmd->out;
    o.last = cmd->out + cmd->out_size;
    o.status = 0;
    cmd->err = 0;

    if (ngx_strcmp(cmd->args[0], "dir") == 0) {
        (void) ngx_http_hermes_step_dir(&o, &cmd->args[1], n - 1);

    } else {
        (void) ngx_http_hermes_step_ship(&o, &cmd->args[1], n - 1, cmd->in,
                                         cmd->in_len);
    }

    cmd->status = o.status;
    cmd->out_len = o.p - cmd->out;

    return NGX_OK;
}


/*
 * ROOT ID GATEWAY INSTANCE: a directory of our own, never one found there
 * (EEXIST, exit 4), and its line in this uid's journal; prints "made",
 * "TYPE:UID:MODE:INODE" of it, cells/ and rpc/, then the uid.
 */

static ngx_int_t
ngx_http_hermes_step_dir(ngx_http_hermes_step_out_t *o, char *const *a,
    ngx_uint_t n)
{
    int           fd, dfd, jfd;
    char          path[NGX_MAX_PATH], jpath[NGX_MAX_PATH];
    u_char        line[128], oct[8], *p;
    mode_t        mode;
    ssize_t       w;
    ngx_uid_t     uid;
    ngx_uint_t    i;
    struct stat   st[3];

    static const char  *subs[] = { "cells", "rpc" };

    if (n != 4) {
        return ngx_http_hermes_step_fail(o, 2, ngx_http_hermes_step_usage);
    }

    if (!ngx_http_hermes_step_is_id(a[1])) {
        return ngx_http_hermes_step_fail(o, 2, "bad kernel id");
    }

    if (a[2][0] == '\0' && a[3][0] == '\0') {
        return ngx_http_hermes_step_fail(o, 2, "bad gateway id");
    }

    for (i = 2; i < 4; i++) {
        for (p = (u_char *) a[i]; *p; p++) {
            if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) {
                return ngx_http_hermes_step_fail(o, 2, "bad gateway id");
            }
        }
    }

    if (ngx_strlen(a[0]) > NGX_MAX_PATH - sizeof("/hermes_journal_") - 64) {
        return ngx_http_hermes_step_fail(o, 1, "the root's path is too long");
    }

    uid = geteuid();

    /* the root, followed if a link (as "ROOT/") */

    ngx_snprintf((u_char *) path, sizeof(path) - 1, "%s/%Z", a[0]);

    if (stat(path, &st[0]) == -1) {
        return ngx_http_hermes_step_fail(o, 1, "stat: %s: %s", path,
                                         strerror(errno));
    }

    /* writable by group or others, and not sticky */

    if ((st[0].st_mode & 022) && !(st[0].st_mode & S_ISVTX)) {
        return ngx_http_hermes_step_fail(o, 3, "the kernels root %s is "
                                         "writable by others without the "
                                         "sticky bit", a[0]);
    }

    ngx_snprintf((u_char *) jpath, sizeof(jpath) - 1,
                 "%s/hermes_journal_%uD%Z", a[0], (uint32_t) uid);

    /* 0700 whatever the worker's umask, as the script's mkdir -m 700 */

    if (mkdir(jpath, 0700) == 0) {
        (void) chmod(jpath, 0700);
    }

    if (lstat(jpath, &st[0]) == -1
        || !S_ISDIR(st[0].st_mode) || st[0].st_uid != uid
        || (st[0].st_mode & 07777) != 0700)
    {
        return ngx_http_hermes_step_fail(o, 6, "the journal %s is not a "
                                         "directory of uid %uD with mode "
                                         "0700", jpath, (uint32_t) uid);
    }

    ngx_snprintf((u_char *) path, sizeof(path) - 1,
                 "%s/hermes_rkernel_%s%Z", a[0], a[1]);

    if (mkdir(path, 0700) == -1) {
        if (errno == EEXIST) {
            return ngx_http_hermes_step_fail(o, 4, "EEXIST");
        }

        return ngx_http_hermes_step_fail(o, 5, "mkdir: cannot create "
                                         "directory '%s': %s", path,
                                         strerror(errno));
    }

    o->p = ngx_slprintf(o->p, o->last, "made\n");

    dfd = open(path, NGX_HTTP_HERMES_STEP_DIRS);
    if (dfd == -1) {
        return ngx_http_hermes_step_fail(o, 1, "%s: %s", path,
                                         strerror(errno));
    }

    (void) fchmod(dfd, 0700);

    for (i = 0; i < 2; i++) {
        if (mkdirat(dfd, subs[i], 0700) == -1
            || fchmodat(dfd, subs[i], 0700, 0) == -1)
        {
            (void) ngx_http_hermes_step_fail(o, 1, "mkdir: cannot create "
                                             "directory '%s/%s': %s", path,
                                             subs[i], strerror(errno));
            goto failed;
        }
    }

    if (fstat(dfd, &st[0]) == -1
        || fstatat(dfd, "cells", &st[1], AT_SYMLINK_NOFOLLOW) == -1
        || fstatat(dfd, "rpc", &st[2], AT_SYMLINK_NOFOLLOW) == -1)
    {
        (void) ngx_http_hermes_step_fail(o, 1, "stat: %s: %s", path,
                                         strerror(errno));
        goto failed;
    }

    (void) close(dfd);

    /* the journal's line: "GATEWAY INSTANCE INODE" */

    jfd = open(jpath, NGX_HTTP_HERMES_STEP_DIRS);
    fd = (jfd == -1) ? -1 : openat(jfd, a[1],
                                   O_WRONLY|O_CREAT|O_TRUNC|O_NOFOLLOW
                                   |O_CLOEXEC, 0600);
    if (jfd != -1) {
        (void) close(jfd);
    }

    p = ngx_slprintf(line, line + sizeof(line), "%s %s %uL\n", a[2], a[3],
                     (uint64_t) st[0].st_ino);

    w = (fd == -1) ? -1 : write(fd, line, p - line);

    if (w != p - line) {
        (void) ngx_http_hermes_step_fail(o, 1, "%s/%s: %s", jpath, a[1],
                                         w == -1 ? strerror(errno)
                                                 : "short write");
        if (fd != -1) {
            (void) close(fd);
        }

        return NGX_ERROR;
    }

    (void) close(fd);

    for (i = 0; i < 3; i++) {

        /* the mode in octal, as stat's %a: nginx's formats have no %o */

        mode = st[i].st_mode & 07777;
        p = oct + sizeof(oct);

        do {
            *--p = (u_char) ('0' + (mode & 7));
            mode >>= 3;
        } while (mode);

        o->p = ngx_slprintf(o->p, o->last, "%s:%uD:%*s:%uL\n",
                            ngx_http_hermes_step_type(&st[i]),
                            (uint32_t) st[i].st_uid,
                            (size_t) (oct + sizeof(oct) - p), p,
                            (uint64_t) st[i].st_ino);
    }

    o->p = ngx_slprintf(o->p, o->last, "%uD\n", (uint32_t) uid);

    return NGX_OK;

failed:

    (void) close(dfd);
    return NGX_ERROR;
}


/*
 * ROOT ID NAME LEN...: the files' bytes one after another on stdin, each
 * NAME exactly LEN bytes of them (fewer where stdin ends first), each made
 * new 0600 in the dir "dir" made: a path there already, a planted link
 * too, fails the step.
 */

static ngx_int_t
ngx_http_hermes_step_ship(ngx_http_hermes_step_out_t *o, char *const *a,
    ngx_uint_t n, const u_char *in, size_t in_len)
{
    int          fd, dfd;
    off_t        len;
    char         path[NGX_MAX_PATH];
    size_t       part;
    ssize_t      w;
    ngx_uint_t   i;
    const char  *name;

    if (n < 4 || n % 2) {
        return ngx_http_hermes_step_fail(o, 2, ngx_http_hermes_step_usage);
    }

    if (!ngx_http_hermes_step_is_id(a[1])) {
        return ngx_http_hermes_step_fail(o, 2, "bad kernel id");
    }

    /* all checked before anything is written */

    for (i = 2; i < n; i += 2) {
        name = a[i];

        if (name[0] == '\0' || ngx_strcmp(name, ".") == 0
            || ngx_strcmp(name, "..") == 0 || ngx_strchr(name, '/'))
        {
            return ngx_http_hermes_step_fail(o, 2, "bad file name");
        }

        if (a[i + 1][0] == '\0'
            || ngx_atoof((u_char *) a[i + 1], ngx_strlen(a[i + 1]))
               == NGX_ERROR)
        {
            return ngx_http_hermes_step_fail(o, 2, "bad number");
        }
    }

    if (ngx_strlen(a[0]) > NGX_MAX_PATH - sizeof("/hermes_rkernel_") - 64) {
        return ngx_http_hermes_step_fail(o, 1, "the root's path is too long");
    }

    ngx_snprintf((u_char *) path, sizeof(path) - 1,
                 "%s/hermes_rkernel_%s%Z", a[0], a[1]);

    dfd = open(path, NGX_HTTP_HERMES_STEP_DIRS);
    if (dfd == -1) {
        return ngx_http_hermes_step_fail(o, 1, "no kernel directory");
    }

    for (i = 2; i < n; i += 2) {
        len = ngx_atoof((u_char *) a[i + 1], ngx_strlen(a[i + 1]));
        part = ngx_min((size_t) len, in_len);

        fd = openat(dfd, a[i], O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC,
                    0600);
        if (fd == -1) {
            (void) ngx_http_hermes_step_fail(o, 1, "%s/%s: %s", path, a[i],
                                             strerror(errno));
            goto failed;
        }

        while (part) {
            w = write(fd, in, part);
            if (w <= 0) {
                (void) ngx_http_hermes_step_fail(o, 1, "%s/%s: %s", path,
                                                 a[i], w == -1
                                                 ? strerror(errno)
                                                 : "short write");
                (void) close(fd);
                goto failed;
            }

            in += w;
            in_len -= w;
            part -= w;
        }

        (void) close(fd);
    }

    (void) close(dfd);
    return NGX_OK;

failed:

    (void) close(dfd);
    return NGX_ERROR;
}


static ngx_int_t
ngx_http_hermes_step_fail(ngx_http_hermes_step_out_t *o, int status,
    const char *fmt, ...)
{
    va_list  args;

    va_start(args, fmt);
    o->p = ngx_vslprintf(o->p, o->last, fmt, args);
    va_end(args);

    o->p = ngx_slprintf(o->p, o->last, "\n");
    o->status = status;

    return NGX_ERROR;
}


/* exactly 32 lowercase hex */

static ngx_uint_t
ngx_http_hermes_step_is_id(const char *s)
{
    ngx_uint_t  i;

    for (i = 0; s[i]; i++) {
        if (i == NGX_HTTP_HERMES_ID_LEN
            || !((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
        {
            return 0;
        }
    }

    return i == NGX_HTTP_HERMES_ID_LEN;
}


/* stat(1)'s %F words for the types the spawn's check tells apart */

static const char *
ngx_http_hermes_step_type(struct stat *st)
{
    if (S_ISDIR(st->st_mode)) {
        return "directory";
    }

    if (S_ISLNK(st->st_mode)) {
        return "symbolic link";
    }

    return S_ISREG(st->st_mode) ? "regular file" : "other";
}
