
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: each kernel in its own sandbox.
 *
 * The start step of a spawn (hermes_kernel.sh start, its arguments made
 * here) runs the runner under bubblewrap: new user, pid, mount, ipc and
 * uts namespaces (and net with net=off), a read-only view of the system,
 * a private /tmp, and of the kernels root only the kernel's own
 * directory.  The runner's pid namespace dies with its init,
 * and its init with the bwrap process whose pid the registry keeps: a
 * kill ends everything the kernel ever started.
 *
 * A spawn as root (the worker, or an ssh login) never runs a kernel as
 * root: the directory is handed to user= and the start drops to it.  As
 * root, limits are cgroups (v1 or v2, per kernel, under "hermes/"); as
 * anyone else, rlimits are what is left.
 */


#include "ngx_hermes.h"


#define NGX_HTTP_HERMES_SANDBOX_USER  "hermes-kernel"

static ngx_conf_enum_t  ngx_http_hermes_sandbox_modes[] = {
    { ngx_string("off"), NGX_HTTP_HERMES_SANDBOX_OFF },
    { ngx_string("bwrap"), NGX_HTTP_HERMES_SANDBOX_BWRAP },
    { ngx_null_string, 0 }
};


static char *ngx_http_hermes_sandbox_path(ngx_conf_t *cf, ngx_str_t *path);



/* hermes_sandbox off | bwrap [user=] [net=] [memory=] [pids=] [cpu=] ... */

char *
ngx_http_hermes_sandbox_conf(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_hermes_sandbox_t  **sbp = (ngx_http_hermes_sandbox_t **)
                                       ((char *) conf + cmd->offset);

    off_t                       size;
    ngx_str_t                  *value, v, *ro;
    ngx_int_t                   n;
    ngx_uint_t                  i;
    ngx_conf_enum_t            *e;
    ngx_http_hermes_sandbox_t  *sb;

    if (*sbp != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    sb = ngx_http_hermes_sandbox_default(cf);
    if (sb == NULL) {
        return NGX_CONF_ERROR;
    }

    sb->implicit = 0;

    value = cf->args->elts;

    for (e = ngx_http_hermes_sandbox_modes; e->name.len; e++) {
        if (e->name.len == value[1].len
            && ngx_strcmp(e->name.data, value[1].data) == 0)
        {
            break;
        }
    }

    if (e->name.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid hermes_sandbox \"%V\": \"off\" or "
                           "\"bwrap\" expected", &value[1]);
        return NGX_CONF_ERROR;
    }

    sb->mode = e->value;

    if (sb->mode == NGX_HTTP_HERMES_SANDBOX_OFF && cf->args->nelts > 2) {
        return "takes no options with \"off\"";
    }

    for (i = 2; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "user=", 5) == 0) {
            v.data = value[i].data + 5;
            v.len = value[i].len - 5;

            if (v.len == 0 || v.len > 32
                || ngx_strlchr(v.data, v.data + v.len, '\'')
                || ngx_strcmp(v.data, "root") == 0)
            {
                goto invalid;
            }

            sb->user = v;
            continue;
        }

        if (ngx_strcmp(value[i].data, "net=on") == 0) {
            sb->net = 1;
            continue;
        }

        if (ngx_strcmp(value[i].data, "net=off") == 0) {
            sb->net = 0;
            continue;
        }

        if (ngx_strncmp(value[i].data, "memory=", 7) == 0
            || ngx_strncmp(value[i].data, "tmp=", 4) == 0)
        {
            n = (value[i].data[0] == 'm') ? 7 : 4;
            v.data = value[i].data + n;
            v.len = value[i].len - n;

            size = ngx_parse_offset(&v);
            if (size == NGX_ERROR || size < 16 * 1024 * 1024) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid hermes_sandbox \"%V\": a size "
                                   "of at least 16m expected", &value[i]);
                return NGX_CONF_ERROR;
            }

            if (n == 7) {
                sb->memory = size;

            } else {
                sb->tmp = size;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "pids=", 5) == 0) {
            n = ngx_atoi(value[i].data + 5, value[i].len - 5);
            if (n == NGX_ERROR || n < 8) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid hermes_sandbox \"%V\": a number "
                                   "of at least 8 expected", &value[i]);
                return NGX_CONF_ERROR;
            }

            sb->pids = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "cpu=", 4) == 0) {
            n = ngx_atoi(value[i].data + 4, value[i].len - 4);
            if (n == NGX_ERROR || n < 1 || n > 100000) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid hermes_sandbox \"%V\": a percent "
                                   "of one CPU, 1 or more, expected",
                                   &value[i]);
                return NGX_CONF_ERROR;
            }

            sb->cpu = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "ro=", 3) == 0) {
            v.data = value[i].data + 3;
            v.len = value[i].len - 3;

            if (ngx_http_hermes_sandbox_path(cf, &v) != NGX_CONF_OK) {
                goto invalid;
            }

            if (sb->ro == NULL) {
                sb->ro = ngx_array_create(cf->pool, 4, sizeof(ngx_str_t));
                if (sb->ro == NULL) {
                    return NGX_CONF_ERROR;
                }
            }

            /* each is three arguments of the start command */

            if (sb->ro->nelts == NGX_HTTP_HERMES_SANDBOX_RO_MAX) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid hermes_sandbox \"%V\": at most "
                                   "%d \"ro=\" paths",
                                   &value[i], NGX_HTTP_HERMES_SANDBOX_RO_MAX);
                return NGX_CONF_ERROR;
            }

            ro = ngx_array_push(sb->ro);
            if (ro == NULL) {
                return NGX_CONF_ERROR;
            }

            *ro = v;
            continue;
        }

        goto invalid;
    }

    if (sb->mode == NGX_HTTP_HERMES_SANDBOX_BWRAP
        && ngx_http_hermes_sandbox_check(cf, sb) != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    *sbp = sb;

    return NGX_CONF_OK;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid hermes_sandbox parameter \"%V\"", &value[i]);
    return NGX_CONF_ERROR;
}


/*
 * absolute, no quotes, backslashes or control characters: an argument of
 * the start command, which error.log and the docs show unquoted
 */

static char *
ngx_http_hermes_sandbox_path(ngx_conf_t *cf, ngx_str_t *path)
{
    u_char  *p;

    if (path->len == 0 || path->data[0] != '/') {
        return NGX_CONF_ERROR;
    }

    for (p = path->data; p < path->data + path->len; p++) {
        if (*p < 0x20 || *p == 0x7f || *p == '\'' || *p == '\\') {
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


/* the default: bwrap net=on memory=1g pids=256, where bwrap is */

ngx_http_hermes_sandbox_t *
ngx_http_hermes_sandbox_default(ngx_conf_t *cf)
{
    ngx_http_hermes_sandbox_t  *sb;

    sb = ngx_pcalloc(cf->pool, sizeof(ngx_http_hermes_sandbox_t));
    if (sb == NULL) {
        return NULL;
    }

    sb->mode = NGX_HTTP_HERMES_SANDBOX_BWRAP;
    sb->implicit = 1;
    sb->net = 1;
    sb->memory = 1024 * 1024 * 1024;
    sb->pids = 256;
    sb->tmp = 64 * 1024 * 1024;

    return sb;
}


/*
 * What this host can enforce, told at nginx -t: the nginx host is the
 * kernel host of the local backend, and often looks like the others.
 */

ngx_int_t
ngx_http_hermes_sandbox_check(ngx_conf_t *cf, ngx_http_hermes_sandbox_t *sb)
{
    if (access("/usr/bin/bwrap", X_OK) != 0
        && access("/bin/bwrap", X_OK) != 0)
    {
        if (!sb->implicit) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "hermes_sandbox bwrap: bwrap (Debian package "
                               "\"bubblewrap\") is not installed on this "
                               "host");
        }

        return NGX_ERROR;
    }

    if (access("/sys/fs/cgroup/cgroup.controllers", F_OK) != 0
        && access("/sys/fs/cgroup/memory", W_OK) != 0)
    {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "hermes_sandbox: no cgroup v1 or v2 hierarchy "
                           "this host can write: memory= is enforced as "
                           "RLIMIT_AS, pids= and cpu= not at all");
    }

    return NGX_OK;
}


/*
 * hermes_kernel.sh start's arguments from USER on (see the script): who
 * the kernel runs as, its limits, its sandbox, the python and the rootfs
 * of its environment (env NULL: the host's python3) and bwrap's options,
 * each value one argument, never shell text, in "n" slots of "args",
 * NULL last; "buf" holds the numbers.  Returns how many were set, 0 if
 * the slots are too few.
 */

ngx_uint_t
ngx_http_hermes_sandbox_args(ngx_http_hermes_sandbox_t *sb,
    ngx_http_hermes_environment_t *env, u_char *dir, ngx_uint_t root,
    char **args, ngx_uint_t n, u_char *buf, size_t size)
{
    u_char      *p, *last, *tmp;
    ngx_str_t   *ro, *eb;
    ngx_uint_t   i, j, k, nro, neb;

    static char  *head[] = {
        "--die-with-parent", "--new-session",
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64",
        "--symlink", "usr/bin", "/bin",
        "--symlink", "usr/sbin", "/sbin",
        "--ro-bind", "/etc", "/etc",
        "--proc", "/proc", "--dev", "/dev",
        "--size", NULL, "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
        "--size", NULL, "--tmpfs", "/tmp",
        "--symlink", "../tmp", "/var/tmp"
    };

    static char  *tail[] = {
        "--bind", NULL, NULL, "--chdir", NULL, "--remount-ro", "/",
        "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
        "--setenv", "HOME", "/tmp"
    };

    nro = sb->ro ? sb->ro->nelts : 0;
    neb = env ? (env->ro ? env->ro->nelts : 0) + (env->rw ? env->rw->nelts : 0)
              : 0;

    /* all of them, and the NULL that ends them */

    if (n < 14 + sizeof(head) / sizeof(char *) + 3 * (nro + neb)
            + sizeof(tail) / sizeof(char *))
    {
        return 0;
    }

    p = buf;
    last = buf + size;
    k = 0;

    /* USER OR_USER: as root only; hermes-kernel, else nobody, by default */

    if (!root) {
        args[k++] = "";
        args[k++] = "";

    } else if (sb->user.len) {
        args[k++] = (char *) sb->user.data;
        args[k++] = "";

    } else {
        args[k++] = NGX_HTTP_HERMES_SANDBOX_USER;
        args[k++] = "nobody";
    }

    /* MEMORY PIDS CPU: no limits without a sandbox */

    if (sb->mode == NGX_HTTP_HERMES_SANDBOX_OFF) {
        args[k++] = "0";
        args[k++] = "0";
        args[k++] = "0";

    } else {
        args[k++] = (char *) p;
        p = ngx_slprintf(p, last, "%O%Z", sb->memory);
        args[k++] = (char *) p;
        p = ngx_slprintf(p, last, "%ui%Z", sb->pids);
        args[k++] = (char *) p;
        p = ngx_slprintf(p, last, "%ui%Z", sb->cpu * 1000);
    }

    /* SANDBOX PYTHON ROOTFS: the script checks the rootfs is there */

    if (sb->mode == NGX_HTTP_HERMES_SANDBOX_OFF) {
        args[k++] = "off";

    } else {
        /* the default sandboxes where bwrap is, and says so where not */
        args[k++] = sb->implicit ? "auto" : "bwrap";
    }

    args[k++] = env ? (char *) env->python.data : "python3";
    args[k++] = (env && env->rootfs.len) ? (char *) env->rootfs.data : "";

    if (sb->mode == NGX_HTTP_HERMES_SANDBOX_OFF) {
        args[k] = NULL;
        return k;
    }

    tmp = p;
    p = ngx_slprintf(p, last, "%O%Z", sb->tmp);

    if (p == last) {
        return 0;
    }

    /*
     * bwrap: everything unshared, the system read-only, its own /tmp,
     * /proc of its own pid namespace, and of the kernels root its own
     * directory alone
     */

    args[k++] = "--unshare-all";

    if (sb->net) {
        args[k++] = "--share-net";
    }

    /*
     * An environment's tree is the system: its /usr and /etc instead of
     * the host's, on bwrap's own root, where the kernel's directory can
     * still be bound at its path (a tree bound as / is read-only: no
     * mount point could be made in it)
     */

    for (i = 0; i < sizeof(head) / sizeof(char *); i++) {
        if (head[i] == NULL) {
            args[k++] = (char *) tmp;

        } else if (env && env->rootfs.len && i > 0 && head[i - 1]
                   && ngx_strcmp(head[i - 1], "--ro-bind") == 0)
        {
            args[k++] = (char *) (head[i][1] == 'u' ? env->usr.data
                                                     : env->etc.data);

        } else {
            args[k++] = head[i];
        }
    }

    ro = sb->ro ? sb->ro->elts : NULL;

    for (i = 0; i < nro; i++) {
        args[k++] = "--ro-bind-try";
        args[k++] = (char *) ro[i].data;
        args[k++] = (char *) ro[i].data;
    }

    /* the environment's own binds: they must be there */

    if (env && env->venv.len) {
        args[k++] = "--ro-bind";
        args[k++] = (char *) env->venv.data;
        args[k++] = (char *) env->venv.data;
    }

    for (j = 0; env && j < 2; j++) {
        eb = NULL;

        if (j == 0 && env->ro) {
            eb = env->ro->elts;
            nro = env->ro->nelts;

        } else if (j == 1 && env->rw) {
            eb = env->rw->elts;
            nro = env->rw->nelts;
        }

        for (i = 0; eb && i < nro; i++) {
            args[k++] = (j == 0) ? "--ro-bind" : "--bind";
            args[k++] = (char *) eb[i].data;
            args[k++] = (char *) eb[i].data;
        }
    }

    /*
     * bwrap's own / and /dev are tmpfs without a size, which RLIMIT_AS
     * does not count: read-only once everything is mounted.  What stays
     * writable is sized: /tmp (and /var/tmp, a link to it), /dev/shm.
     * HOME is /tmp: what libraries keep there (matplotlib's and
     * fontconfig's caches) has a writable place.
     */

    for (i = 0; i < sizeof(tail) / sizeof(char *); i++) {
        args[k++] = tail[i] ? tail[i] : (char *) dir;
    }

    args[k] = NULL;

    return k;
}
