
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: kernel lifecycle, spawn and kill.
 *
 * Both run in the thread pool: they wait on commands.  Spawn follows the
 * kernel host protocol step by step, each step fail-closed: a failure
 * removes the directory and starts nothing, and a failed directory step
 * ships nothing.
 */


#include "ngx_hermes.h"

#include <sodium.h>


#define NGX_HTTP_HERMES_CMD_TIMEOUT   10000
#define NGX_HTTP_HERMES_EXIT_TIME     10000     /* killing all at exit */

/* the runner outlives the registry's idle clock a little, then exits */
#define NGX_HTTP_HERMES_RUNNER_GRACE  30

#define NGX_HTTP_HERMES_KILL_RETRIES  5

/* kernel directories that may already exist before we give up */
#define NGX_HTTP_HERMES_MKDIR_TRIES   4

/* a spawn's error: its step, and the step's output, escaped */
#define NGX_HTTP_HERMES_SPAWN_ERR     512


struct ngx_http_hermes_spawn_s {
    ngx_http_hermes_conn_t         conn;
    ngx_http_hermes_spawned_t      k;
    ngx_str_t                      root_dir;
    ngx_http_hermes_sandbox_t     *sandbox;
    ngx_http_hermes_environment_t *environment; /* NULL: none */
    ngx_uint_t                     root;        /* we spawn as root */
    /* whose kernel it is, in the host's journal: after a crash too */
    u_char                         gateway[NGX_HTTP_HERMES_TAG_HEX + 1];
    u_char                         instance[NGX_HTTP_HERMES_TAG_HEX + 1];
    u_char                        *env;         /* kernel.env */
    size_t                         env_len;
    ngx_int_t                      rc;
    u_char                         err[NGX_HTTP_HERMES_SPAWN_ERR];
    size_t                         out_len;
    ngx_int_t                      status;      /* the last step's exit */
    ngx_http_hermes_spawn_done_pt  done;
    void                          *data;
    unsigned                       made:1;
};


typedef struct {
    ngx_thread_task_t              task;
    ngx_http_hermes_conn_t         conn;
    ngx_http_hermes_victim_t       v;
    ngx_log_t                     *log;
    ngx_thread_pool_t             *tp;
    ngx_event_t                    retry;
    ngx_queue_t                    queue;       /* waiting for the pool */
    ngx_uint_t                     tries;
    unsigned                       failed:1;
} ngx_http_hermes_kill_t;


/* leftovers of an earlier run of this gateway, on one host of a backend */

typedef struct {
    ngx_thread_task_t              task;
    ngx_http_hermes_conn_t         conn;
    ngx_str_t                      root;
    char                          *args[5];
    u_char                         gateway[NGX_HTTP_HERMES_TAG_HEX + 1];
    u_char                         instance[NGX_HTTP_HERMES_TAG_HEX + 1];
    u_char                         out[4096];
    size_t                         out_len;
    unsigned                       failed:1;
} ngx_http_hermes_recover_t;


/* per worker: the backends of its cycle, to kill what the sweep evicts */
static ngx_http_hermes_main_conf_t  *ngx_http_hermes_main_conf;

/* per worker: kills the thread pool had no room for; the sweep reposts */
static ngx_queue_t                   ngx_http_hermes_kills_waiting;


static void ngx_http_hermes_spawn_thread(void *data, ngx_log_t *log);
static void ngx_http_hermes_spawn_event(ngx_event_t *ev);
static ngx_int_t ngx_http_hermes_spawn_ship(ngx_http_hermes_spawn_t *s,
    u_char *kid, ngx_log_t *log);
static ngx_int_t ngx_http_hermes_spawn_check_dirs(ngx_http_hermes_spawn_t *s,
    u_char *out, size_t len);
static void ngx_http_hermes_kernel_new_id(ngx_http_hermes_spawn_t *s);
static ngx_int_t ngx_http_hermes_spawn_run(ngx_http_hermes_spawn_t *s,
    u_char *cmd, char **args, const u_char *in, size_t in_len, u_char *out,
    size_t out_size, const char *step);
static void ngx_http_hermes_spawn_error(ngx_http_hermes_spawn_t *s, u_char *p,
    u_char *text, size_t len);
static u_char *ngx_http_hermes_conn_error(u_char *buf, u_char *last,
    ngx_http_hermes_conn_t *conn);
static void ngx_http_hermes_kill_post(ngx_http_hermes_kill_t *k);
static void ngx_http_hermes_kill_repost(void);
static ngx_int_t ngx_http_hermes_kill_args(ngx_http_hermes_victim_t *v,
    char **args, u_char *buf);
static void ngx_http_hermes_kill_thread(void *data, ngx_log_t *log);
static void ngx_http_hermes_kill_event(ngx_event_t *ev);
static void ngx_http_hermes_kill_retry(ngx_event_t *ev);
static void ngx_http_hermes_sweep_handler(ngx_event_t *ev);
static void ngx_http_hermes_kernel_recover(ngx_http_hermes_zone_t *zone,
    ngx_log_t *log);
static void ngx_http_hermes_recover_thread(void *data, ngx_log_t *log);
static void ngx_http_hermes_recover_event(ngx_event_t *ev);


ngx_int_t
ngx_http_hermes_kernel_spawn(ngx_http_hermes_loc_conf_t *hlcf,
    ngx_http_hermes_environment_t *env, ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_pool_t *pool,
    ngx_http_hermes_spawn_done_pt done, void *data, ngx_log_t *log)
{
    u_char                   *p, *last, *eq;
    size_t                    size;
    ngx_str_t                *set;
    ngx_uint_t                i, idle;
    ngx_thread_task_t        *task;
    ngx_http_hermes_spawn_t  *s;
    u_char                    token[NGX_HTTP_HERMES_TOKEN_LEN * 2 + 1];

    task = ngx_thread_task_alloc(pool, sizeof(ngx_http_hermes_spawn_t));
    if (task == NULL) {
        return NGX_ERROR;
    }

    s = task->ctx;

    ngx_http_hermes_backend_take(&s->conn, hlcf->backend, ref->host);

    ngx_memcpy(s->k.kernel_id, ref->kernel_id, NGX_HTTP_HERMES_ID_LEN);
    ngx_memcpy(s->k.dir, ref->dir, ref->dir_len + 1);
    s->k.dir_len = ref->dir_len;
    s->root_dir = hlcf->backend->root;
    s->sandbox = hlcf->sandbox;
    s->environment = env;
    s->root = hlcf->backend->ops->root(hlcf->backend);
    *ngx_cpymem(s->gateway, zone->gateway, NGX_HTTP_HERMES_TAG_HEX) = '\0';
    *ngx_cpymem(s->instance, ngx_http_hermes_registry_instance(zone), NGX_HTTP_HERMES_TAG_HEX)
        = '\0';
    s->done = done;
    s->data = data;

    idle = zone->idle_timeout / 1000;
    if (idle) {
        idle += NGX_HTTP_HERMES_RUNNER_GRACE;
    }

    /* the token goes in kernel.env, shipped on stdin, sourced, removed */

    sodium_bin2hex((char *) token, sizeof(token), ref->token,
                   NGX_HTTP_HERMES_TOKEN_LEN);

    /* the environment's settings too: the runner sets them (HERMES_ENV_) */

    size = 256;
    set = (env && env->env) ? env->env->elts : NULL;

    for (i = 0; set && i < env->env->nelts; i++) {
        size += sizeof("HERMES_ENV_''\n") + set[i].len;
    }

    s->env = ngx_pnalloc(pool, size);
    if (s->env == NULL) {
        return NGX_ERROR;
    }

    last = s->env + size;

    p = ngx_slprintf(s->env, last,
                     "HERMES_RPC_TOKEN='%s'\n"
                     "HERMES_KERNEL_ID='%*s'\n"
                     "HERMES_IDLE_TIMEOUT='%ui'\n",
                     token, (size_t) NGX_HTTP_HERMES_ID_LEN, ref->kernel_id,
                     idle);

    for (i = 0; set && i < env->env->nelts; i++) {
        /* NAME=VALUE as HERMES_ENV_NAME='VALUE' */
        eq = ngx_strlchr(set[i].data, set[i].data + set[i].len, '=');

        p = ngx_slprintf(p, last, "HERMES_ENV_%*s='%*s'\n",
                         (size_t) (eq - set[i].data), set[i].data,
                         (size_t) (set[i].data + set[i].len - eq - 1),
                         eq + 1);
    }

    s->env_len = p - s->env;

    sodium_memzero(token, sizeof(token));

    task->handler = ngx_http_hermes_spawn_thread;
    task->event.handler = ngx_http_hermes_spawn_event;
    task->event.data = s;

    if (ngx_thread_task_post(hlcf->thread_pool, task) != NGX_OK) {
        /* the pool's queue is full: nothing started, try again later */
        return NGX_BUSY;
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, log, 0,
                   "hermes: spawning kernel in \"%s\"", s->k.dir);

    return NGX_OK;
}


static void
ngx_http_hermes_spawn_thread(void *data, ngx_log_t *log)
{
    ngx_http_hermes_spawn_t *s = data;

    u_char                         *d, *p, *q, *elast;
    ngx_int_t                       pid, uid, rc;
    ngx_pid_t                       expect;
    ngx_uint_t                      tries, lacks;
    char                           *args[7];
    ngx_http_hermes_victim_t        v;
    u_char                          kid[NGX_HTTP_HERMES_ID_LEN + 1];
    u_char                          numbers[NGX_HTTP_HERMES_KILL_ARGS_LEN];
    u_char                          out[512];
    char                           *sargs[NGX_HTTP_HERMES_CMD_ARGS + 1];

    d = s->k.dir;
    kid[NGX_HTTP_HERMES_ID_LEN] = '\0';
    s->rc = NGX_ERROR;
    lacks = 0;
    elast = s->err + sizeof(s->err) - 1;

    /*
     * 1. A directory of our own, never one found there, and its entry in
     * this gateway's journal (hermes_kernel.sh "dir"); on EEXIST a new id.
     */

    args[0] = "dir";
    args[1] = (char *) s->root_dir.data;
    args[2] = (char *) kid;
    args[3] = (char *) s->gateway;
    args[4] = (char *) s->instance;
    args[5] = NULL;

    for (tries = 0; /* void */; tries++) {

        ngx_memcpy(kid, s->k.kernel_id, NGX_HTTP_HERMES_ID_LEN);

        rc = ngx_http_hermes_spawn_run(s,
                                       (u_char *) ngx_http_hermes_script_kernel,
                                       args, NULL, 0, out, sizeof(out),
                                       "directory setup");

        /* only a directory this step made is ours to remove */
        s->made = (ngx_strncmp(out, "made\n", 5) == 0);

        if (rc == NGX_OK) {
            break;
        }

        if (s->rc == NGX_DECLINED || ngx_strcmp(out, "EEXIST\n") != 0) {
            goto failed;
        }

        if (tries == NGX_HTTP_HERMES_MKDIR_TRIES) {
            *ngx_slprintf(s->err, elast,
                          "directory setup: %ui kernel directories in a row "
                          "existed already: another user is making them",
                          tries + 1) = '\0';
            goto failed;
        }

        ngx_log_error(NGX_LOG_WARN, log, 0,
                      "hermes: kernel directory \"%s\" exists, made by "
                      "someone else; picking another id", d);

        ngx_http_hermes_kernel_new_id(s);
    }

    if (ngx_http_hermes_spawn_check_dirs(s, out + 5, s->out_len - 5)
        != NGX_OK)
    {
        goto failed;
    }

    /* 2. the runner, the tools client, the marker and kernel.env */

    if (ngx_http_hermes_spawn_ship(s, kid, log) != NGX_OK) {
        goto failed;
    }

    /*
     * 3. start (hermes_kernel.sh "start"): kernel.env goes to the runner
     * as an open file, unlinked at once, so the token is in no process's
     * environment or argv; the runner leads its own process group, in its
     * sandbox, never as root.  Printed: the pid, the kernel's uid.
     */

    sargs[0] = "start";
    sargs[1] = (char *) s->root_dir.data;
    sargs[2] = (char *) kid;

    if (ngx_http_hermes_sandbox_args(s->sandbox, s->environment, d, s->root,
                                     &sargs[3],
                                     NGX_HTTP_HERMES_CMD_ARGS + 1 - 3,
                                     numbers, sizeof(numbers))
        == 0)
    {
        *ngx_slprintf(s->err, elast, "start: too many arguments") = '\0';
        goto failed;
    }

    if (ngx_http_hermes_spawn_run(s, (u_char *) ngx_http_hermes_script_kernel,
                                  sargs, NULL, 0, out, sizeof(out), "start")
        != NGX_OK)
    {
        /* exit 3: the host lacks the environment's rootfs */
        lacks = (s->status == 3);
        goto failed;
    }

    for (p = out; *p >= '0' && *p <= '9'; p++) { /* void */ }

    pid = ngx_atoi(out, p - out);
    if (pid == NGX_ERROR || pid <= 1 || *p != '\n') {
        p = ngx_slprintf(s->err, elast, "start: no pid: ");
        ngx_http_hermes_spawn_error(s, p, out, s->out_len);
        goto failed;
    }

    s->k.pid = (ngx_pid_t) pid;

    for (q = ++p; *q >= '0' && *q <= '9'; q++) { /* void */ }

    uid = ngx_atoi(p, q - p);
    if (uid == NGX_ERROR || (s->root && uid == 0)) {
        p = ngx_slprintf(s->err, elast, "start: no uid: ");
        ngx_http_hermes_spawn_error(s, p, out, s->out_len);
        goto failed;
    }

    s->k.uid = (uint32_t) uid;

    /* in a pid namespace, the runner's own pid is another one */
    expect = (s->sandbox->mode == NGX_HTTP_HERMES_SANDBOX_OFF) ? s->k.pid : 0;

    /*
     * 4. alive: the runner says "ready" with its pid; the pid's start time
     * tells it from a later process given the same pid
     */

    rc = s->conn.bcf->ops->ready(&s->conn, d, s->k.pid, expect, &s->k.start);

    if (rc != NGX_OK) {
        if (s->rc != NGX_DECLINED) {
            *ngx_slprintf(s->err, elast,
                          "the kernel did not start (see \"%s/runner.log\")",
                          d) = '\0';
        }

        goto failed;
    }

    s->rc = NGX_OK;
    return;

failed:

    if (s->conn.unavailable) {
        /* nothing can be cleaned up on a host we cannot reach */
        s->rc = NGX_DECLINED;
        return;
    }

    if (!s->made) {
        /* the path is someone else's, or was never made */
        s->rc = lacks ? NGX_ABORT : NGX_ERROR;
        return;
    }

    /* its group (no start time: not ready), cgroups, dir, journal entry */

    v.dir_len = ngx_cpymem(v.dir, d, s->k.dir_len) - v.dir;
    v.pid = s->k.pid;
    v.start = 0;
    v.ino = s->k.ino;

    if (ngx_http_hermes_kill_args(&v, args, numbers) == NGX_OK) {
        (void) ngx_http_hermes_spawn_run(s,
                                         (u_char *) ngx_http_hermes_script_kernel,
                                         args, NULL, 0, out, sizeof(out), NULL);
    }

    s->rc = lacks ? NGX_ABORT : NGX_ERROR;
}


/*
 * Every file the kernel dir needs, in one step (hermes_kernel.sh "ship"):
 * their names and lengths as arguments, their bytes one after another on
 * stdin, each file made new 0600 in the directory step 1 made ours:
 * nobody else sees a file half written, and a failure removes them all
 * with it.
 */

static ngx_int_t
ngx_http_hermes_spawn_ship(ngx_http_hermes_spawn_t *s, u_char *kid,
    ngx_log_t *log)
{
    u_char                         *p, *last, *in, *q;
    size_t                          len;
    ngx_int_t                       rc;
    ngx_uint_t                      i, n;
    ngx_http_hermes_remote_file_t  *rf, *lists[2];
    u_char                          out[512];
    char                           *args[NGX_HTTP_HERMES_CMD_ARGS + 1];
    u_char                          lens[NGX_HTTP_HERMES_CMD_ARGS / 2
                                         * (NGX_SIZE_T_LEN + 1)];
    ngx_http_hermes_remote_file_t   own[2];

    /* this spawn's own: kernel.env, the token in it */

    ngx_memzero(own, sizeof(own));

    ngx_str_set(&own[0].name, "kernel.env");
    own[0].data = s->env;
    own[0].len = s->env_len;
    own[0].ship = 1;

    lists[0] = ngx_http_hermes_remote_files;
    lists[1] = own;

    args[0] = "ship";
    args[1] = (char *) s->root_dir.data;
    args[2] = (char *) kid;
    n = 3;

    p = lens;
    last = lens + sizeof(lens);
    len = 0;

    for (i = 0; i < 2; i++) {
        for (rf = lists[i]; rf->len; rf++) {
            if (!rf->ship) {
                /* the agent: carried, never left in a kernel dir */
                continue;
            }

            if (n + 2 > NGX_HTTP_HERMES_CMD_ARGS) {
                *ngx_slprintf(s->err, s->err + sizeof(s->err) - 1,
                              "ship: too many files") = '\0';
                return NGX_ERROR;
            }

            /* names are literals: NUL-terminated */
            args[n++] = (char *) rf->name.data;
            args[n++] = (char *) p;
            p = ngx_slprintf(p, last, "%uz%Z", rf->len);
            len += rf->len;
        }
    }

    args[n] = NULL;

    in = ngx_alloc(len, log);
    if (in == NULL) {
        *ngx_slprintf(s->err, s->err + sizeof(s->err) - 1,
                      "ship: no memory") = '\0';
        return NGX_ERROR;
    }

    q = in;

    for (i = 0; i < 2; i++) {
        for (rf = lists[i]; rf->len; rf++) {
            if (rf->ship) {
                q = ngx_cpymem(q, rf->data, rf->len);
            }
        }
    }

    rc = ngx_http_hermes_spawn_run(s, (u_char *) ngx_http_hermes_script_kernel,
                                   args, in, len, out, sizeof(out), "ship");
    ngx_free(in);

    return rc;
}


/*
 * "directory:UID:700:INO" for the kernel dir, cells/ and rpc/, then the
 * uid we run as: real directories (stat does not follow a symlink), ours,
 * owner-only.  Anything else fails, whatever made it so.
 */

static ngx_int_t
ngx_http_hermes_spawn_check_dirs(ngx_http_hermes_spawn_t *s, u_char *out,
    size_t len)
{
    off_t        ino;
    u_char      *p, *nl, *last, *elast, *uid, *f[4];
    size_t       uid_len;
    ngx_uint_t   i, n;

    last = out + len;
    elast = s->err + sizeof(s->err) - 1;

    for (p = out, i = 0; i < 3; i++, p = nl + 1) {
        nl = ngx_strlchr(p, last, '\n');
        if (nl == NULL) {
            goto bad;
        }
    }

    uid = p;

    nl = ngx_strlchr(p, last, '\n');
    if (nl == NULL || nl == uid) {
        goto bad;
    }

    uid_len = nl - uid;

    for (p = out, i = 0; i < 3; i++, p = nl + 1) {
        nl = ngx_strlchr(p, last, '\n');

        /* field n runs from f[n] to the ':' before f[n + 1] */

        f[0] = p;

        for (n = 1; n < 4; n++) {
            p = ngx_strlchr(p, nl, ':');
            if (p == NULL) {
                goto bad;
            }

            f[n] = ++p;
        }

        if (ngx_strlchr(p, nl, ':') != NULL || p == nl) {
            goto bad;
        }

        if (f[1] - f[0] != sizeof("directory:") - 1
            || ngx_strncmp(f[0], "directory:", f[1] - f[0]) != 0
            || (size_t) (f[2] - f[1] - 1) != uid_len
            || ngx_strncmp(f[1], uid, uid_len) != 0
            || f[3] - f[2] != sizeof("700:") - 1
            || ngx_strncmp(f[2], "700:", f[3] - f[2]) != 0)
        {
            p = ngx_slprintf(s->err, elast, "directory setup: not an "
                             "owner-only directory of uid ");
            p = ngx_http_hermes_log_escape(p, elast, uid, uid_len, 0);
            p = ngx_slprintf(p, elast, ": ");
            ngx_http_hermes_spawn_error(s, p, f[0], f[3] - 1 - f[0]);
            return NGX_ERROR;
        }

        if (i == 0) {
            ino = ngx_atoof(f[3], nl - f[3]);
            if (ino == NGX_ERROR) {
                goto bad;
            }

            s->k.ino = (uint64_t) ino;
        }
    }

    return NGX_OK;

bad:

    p = ngx_slprintf(s->err, elast, "directory setup: unexpected output ");
    ngx_http_hermes_spawn_error(s, p, out, len);

    return NGX_ERROR;
}


/* a fresh id, and the directory named by it */

static void
ngx_http_hermes_kernel_new_id(ngx_http_hermes_spawn_t *s)
{
    u_char  id[NGX_HTTP_HERMES_ID_LEN / 2];

    randombytes_buf(id, sizeof(id));
    ngx_hex_dump(s->k.kernel_id, id, sizeof(id));

    ngx_memcpy(s->k.dir + s->k.dir_len - NGX_HTTP_HERMES_ID_LEN,
               s->k.kernel_id, NGX_HTTP_HERMES_ID_LEN);
}


static ngx_int_t
ngx_http_hermes_spawn_run(ngx_http_hermes_spawn_t *s, u_char *cmd,
    char **args, const u_char *in, size_t in_len, u_char *out, size_t out_size,
    const char *step)
{
    u_char                 *p, *last;
    ngx_int_t               rc;
    ngx_http_hermes_cmd_t   c;
#if (NGX_DEBUG)
    u_char                  text[NGX_MAX_ERROR_STR];
#endif

    ngx_memzero(&c, sizeof(ngx_http_hermes_cmd_t));

    c.cmd = (char *) cmd;
    c.args = args;
    c.in = in;
    c.in_len = in_len;
    c.out = out;
    c.out_size = out_size - 1;
    c.timeout = NGX_HTTP_HERMES_CMD_TIMEOUT;

#if (NGX_DEBUG)

    /* no secret in a command: payloads, the token too, go on stdin */

    if (ngx_cycle->log->log_level & NGX_LOG_DEBUG_HTTP) {
        *ngx_http_hermes_cmd_text(text, text + sizeof(text) - 1, &c) = '\0';

        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                       "hermes: spawn step \"%s\": %s",
                       step ? step : "cleanup", text);
    }

#endif

    rc = ngx_http_hermes_backend_exec(&s->conn, &c);

    out[c.out_len] = '\0';
    s->out_len = c.out_len;

    if (step == NULL) {
        return rc;
    }

    p = s->err;
    last = s->err + sizeof(s->err) - 1;

    if (rc == NGX_DECLINED) {
        /* the backend is unreachable: no step ran */
        s->rc = NGX_DECLINED;
        *ngx_http_hermes_conn_error(p, last, &s->conn) = '\0';
        return NGX_ERROR;
    }

    if (rc != NGX_OK) {
        p = ngx_slprintf(p, last, "%s: ", step);

        if (s->conn.err[0]) {
            p = ngx_http_hermes_conn_error(p, last, &s->conn);

        } else {
            p = ngx_slprintf(p, last, "%s",
                             c.err ? strerror(c.err) : "failed");
        }

        *p = '\0';
        return NGX_ERROR;
    }

    s->status = c.status;

    if (c.status != 0) {
        p = ngx_slprintf(p, last, "%s: exit code %d: ", step, c.status);
        ngx_http_hermes_spawn_error(s, p, out, c.out_len);
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * s->err from p on: the text quoted and escaped, as much as fits; always
 * NUL-terminated (ngx_snprintf's %Z is lost when the text is cut).
 */

static void
ngx_http_hermes_spawn_error(ngx_http_hermes_spawn_t *s, u_char *p,
    u_char *text, size_t len)
{
    u_char  *last;

    last = s->err + sizeof(s->err) - 1;

    if (last - p >= 2) {
        *p++ = '"';
        p = ngx_http_hermes_log_escape(p, last - 1, text, len, 1);
        *p++ = '"';
    }

    *p = '\0';
}


/* the backend's error, escaped: libssh's text may hold the server's */

static u_char *
ngx_http_hermes_conn_error(u_char *buf, u_char *last,
    ngx_http_hermes_conn_t *conn)
{
    return ngx_http_hermes_log_escape(buf, last, conn->err,
                                      ngx_strnlen(conn->err,
                                                  sizeof(conn->err)), 0);
}


/*
 * Text from elsewhere (the kernel host's output, an ssh server's words)
 * into a log line: printable ASCII as it is, any other byte and the
 * backslash as \xNN, so that one event stays one line and no line can be
 * forged; in quoted text the quote too, so that the text cannot end it.
 * What does not fit before last is cut, and "..." says so.  The caller
 * terminates.
 */

u_char *
ngx_http_hermes_log_escape(u_char *dst, u_char *last, u_char *src,
    size_t len, ngx_uint_t quoted)
{
    u_char          c, *end;
    static u_char   hex[] = "0123456789abcdef";

    if (last - dst < 3) {
        return dst;
    }

    /* the room for "..." */
    end = last - 3;

    for ( /* void */ ; len; len--, src++) {
        c = *src;

        if (c >= 0x20 && c < 0x7f && c != '\\' && (c != '"' || !quoted)) {
            if (dst == end) {
                break;
            }

            *dst++ = c;
            continue;
        }

        if (end - dst < 4) {
            break;
        }

        *dst++ = '\\';
        *dst++ = 'x';
        *dst++ = hex[c >> 4];
        *dst++ = hex[c & 0xf];
    }

    if (len) {
        dst = ngx_cpymem(dst, "...", 3);
    }

    return dst;
}


static void
ngx_http_hermes_spawn_event(ngx_event_t *ev)
{
    ngx_http_hermes_spawn_t *s = ev->data;

    ngx_http_hermes_backend_give(&s->conn);

    s->done(s->data, s->rc, &s->k, (char *) s->err);
}


/*
 * Kill a kernel's process group and remove its directory.  Not bound to a
 * request: the task is freed when it completes.
 */

/* a kernel as kills and interrupts take it: where and which */

void
ngx_http_hermes_kernel_victim(ngx_http_hermes_victim_t *v,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_backend_conf_t *bcf)
{
    ngx_memcpy(v->dir, ref->dir, ref->dir_len);
    v->dir[ref->dir_len] = '\0';
    v->dir_len = ref->dir_len;
    v->pid = ref->pid;
    v->start = ref->start;
    v->ino = ref->ino;
    v->host = ref->host;
    ngx_memcpy(v->tag, bcf->tag, NGX_HTTP_HERMES_BACKEND_TAG_LEN);
}


ngx_int_t
ngx_http_hermes_kernel_kill(ngx_thread_pool_t *tp,
    ngx_http_hermes_backend_conf_t *bcf, ngx_http_hermes_victim_t *v,
    ngx_log_t *log)
{
    ngx_http_hermes_kill_t  *k;

    if (v->dir_len == 0 || v->dir_len >= NGX_HTTP_HERMES_DIR_MAX) {
        return NGX_ERROR;
    }

    k = ngx_calloc(sizeof(ngx_http_hermes_kill_t), log);
    if (k == NULL) {
        return NGX_ERROR;
    }

    k->v = *v;
    k->v.dir[k->v.dir_len] = '\0';
    k->log = ngx_cycle->log;     /* the task may outlive a request */
    k->tp = tp;

    ngx_http_hermes_backend_take(&k->conn, bcf, v->host);

    k->task.ctx = k;
    k->task.handler = ngx_http_hermes_kill_thread;
    k->task.event.handler = ngx_http_hermes_kill_event;
    k->task.event.data = k;

    ngx_http_hermes_kill_post(k);

    return NGX_OK;
}


/*
 * A kill the pool cannot take now waits in the worker for the next sweep:
 * a kernel out of the registry must still go.
 */

static void
ngx_http_hermes_kill_post(ngx_http_hermes_kill_t *k)
{
    if (ngx_thread_task_post(k->tp, &k->task) == NGX_OK) {
        return;
    }

    ngx_http_hermes_backend_give(&k->conn);

    ngx_log_error(NGX_LOG_WARN, k->log, 0,
                  "hermes: the thread pool is full, killing kernel %P in "
                  "\"%s\" waits for the next sweep", k->v.pid, k->v.dir);

    ngx_queue_insert_tail(&ngx_http_hermes_kills_waiting, &k->queue);
}


static void
ngx_http_hermes_kill_repost(void)
{
    ngx_queue_t             *q, waiting;
    ngx_http_hermes_kill_t  *k;

    if (ngx_queue_empty(&ngx_http_hermes_kills_waiting)) {
        return;
    }

    /* those the pool refuses again go back to the list */

    waiting = ngx_http_hermes_kills_waiting;
    waiting.next->prev = &waiting;
    waiting.prev->next = &waiting;
    ngx_queue_init(&ngx_http_hermes_kills_waiting);

    while (!ngx_queue_empty(&waiting)) {
        q = ngx_queue_head(&waiting);
        ngx_queue_remove(q);

        k = ngx_queue_data(q, ngx_http_hermes_kill_t, queue);

        ngx_http_hermes_backend_take(&k->conn, k->conn.bcf, k->v.host);
        ngx_http_hermes_kill_post(k);
    }
}


/*
 * The kill, hermes_kernel.sh "kill ROOT ID PID START INODE" for a victim:
 * the process group if the pid is still the kernel's (its start time),
 * the sandbox's own leftovers, the directory if it is still the one made
 * at spawn (its inode), and its journal entry.  "buf" holds
 * NGX_HTTP_HERMES_KILL_ARGS_LEN bytes, "args" 7 pointers into it.
 */

static ngx_int_t
ngx_http_hermes_kill_args(ngx_http_hermes_victim_t *v, char **args,
    u_char *buf)
{
    u_char  *p;
    size_t   root_len;

    if (v->dir_len <= NGX_HTTP_HERMES_KDIR_PREFIX + NGX_HTTP_HERMES_ID_LEN) {
        return NGX_ERROR;
    }

    root_len = v->dir_len - NGX_HTTP_HERMES_KDIR_PREFIX
               - NGX_HTTP_HERMES_ID_LEN;

    args[0] = "kill";

    args[1] = (char *) buf;
    p = ngx_cpymem(buf, v->dir, root_len);
    *p++ = '\0';

    args[2] = (char *) p;
    p = ngx_cpymem(p, v->dir + v->dir_len - NGX_HTTP_HERMES_ID_LEN,
                   NGX_HTTP_HERMES_ID_LEN);
    *p++ = '\0';

    args[3] = (char *) p;
    p = ngx_sprintf(p, "%P%Z", v->pid > 1 ? v->pid : 0);

    args[4] = (char *) p;
    p = ngx_sprintf(p, "%uL%Z", v->start);

    args[5] = (char *) p;
    (void) ngx_sprintf(p, "%uL%Z", v->ino);

    args[6] = NULL;

    return NGX_OK;
}


/*
 * The whole process group, then the directory; but only when they are
 * still this kernel's.  A pid that now names a process started at another
 * time is a stranger's (the kernel's pid was reused): no signal.  A pid
 * that names no process at all may still be our group's id, and then
 * only ours: the kernel reuses no pid its group members still hold.  A
 * directory with another inode was made by someone else after ours went.
 */

static void
ngx_http_hermes_kill_thread(void *data, ngx_log_t *log)
{
    ngx_http_hermes_kill_t *k = data;

    char                   *args[7];
    u_char                  out[256];
    u_char                  buf[NGX_HTTP_HERMES_KILL_ARGS_LEN];
    ngx_http_hermes_cmd_t   c;

    if (ngx_http_hermes_kill_args(&k->v, args, buf) != NGX_OK) {
        k->failed = 1;
        return;
    }

    ngx_memzero(&c, sizeof(ngx_http_hermes_cmd_t));
    c.cmd = ngx_http_hermes_script_kernel;
    c.args = args;
    c.out = out;
    c.out_size = sizeof(out);
    c.timeout = NGX_HTTP_HERMES_CMD_TIMEOUT;

    if (ngx_http_hermes_backend_exec(&k->conn, &c) != NGX_OK
        || c.status != 0)
    {
        k->failed = 1;
    }
}


static void
ngx_http_hermes_kill_event(ngx_event_t *ev)
{
    ngx_http_hermes_kill_t *k = ev->data;

    u_char  err[NGX_HTTP_HERMES_SPAWN_ERR];

    if (k->conn.err[0]) {
        *ngx_http_hermes_conn_error(err, err + sizeof(err) - 1, &k->conn)
            = '\0';

    } else {
        ngx_cpystrn(err, (u_char *) "command failed", sizeof(err));
    }

    if (k->failed && k->conn.unavailable
        && k->tries < NGX_HTTP_HERMES_KILL_RETRIES)
    {
        /* the host is down: try again later, the kernel must go */

        ngx_log_error(NGX_LOG_WARN, k->log, 0,
                      "hermes: killing kernel %P in \"%s\" failed: %s; "
                      "retrying", k->v.pid, k->v.dir, err);

        ngx_http_hermes_backend_give(&k->conn);

        k->tries++;
        k->failed = 0;
        k->retry.handler = ngx_http_hermes_kill_retry;
        k->retry.data = k;
        k->retry.log = k->log;
        k->retry.cancelable = 1;

        ngx_add_timer(&k->retry, 2000 * k->tries);
        return;
    }

    if (k->failed) {
        ngx_log_error(NGX_LOG_WARN, k->log, 0,
                      "hermes: killing kernel %P in \"%s\" failed: %s",
                      k->v.pid, k->v.dir, err);

    } else {
        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, k->log, 0,
                       "hermes: killed kernel %P, removed \"%s\"",
                       k->v.pid, k->v.dir);
    }

    ngx_http_hermes_backend_give(&k->conn);

    ngx_free(k);
}


/* the backend that made a kernel, by its tag in the registry key */

ngx_http_hermes_backend_conf_t *
ngx_http_hermes_kernel_backend(ngx_http_hermes_victim_t *v)
{
    return ngx_http_hermes_backend_by_tag(ngx_http_hermes_main_conf, v->tag);
}


/*
 * A KeyboardInterrupt for cell "cell" of a kernel: "N\n" into its intr
 * FIFO, by the backend (at once on this host; a frame to the agent of an
 * ssh host), never a command.  NGX_DECLINED: the kernel is not there (any
 * more).
 */

ngx_int_t
ngx_http_hermes_kernel_interrupt(ngx_http_hermes_victim_t *v, uint32_t cell,
    ngx_log_t *log)
{
    ngx_http_hermes_backend_conf_t  *bcf;

    bcf = ngx_http_hermes_kernel_backend(v);
    if (bcf == NULL) {
        return NGX_DECLINED;
    }

    return bcf->ops->interrupt(bcf, v, cell, log);
}


void
ngx_http_hermes_kernel_kill_victims(ngx_thread_pool_t *tp,
    ngx_http_hermes_victims_t *victims, ngx_log_t *log)
{
    u_char                          *p, *who, *why;
    ngx_uint_t                       i;
    ngx_http_hermes_victim_t        *v;
    ngx_http_hermes_backend_conf_t  *bcf;
    u_char                           owner[NGX_HTTP_HERMES_OWNER_MAX * 4 + 8];

    for (i = 0; i < victims->n; i++) {
        v = &victims->v[i];

        /* whose (the unset owner is "\001anonymous": "\x01" escaped) */

        p = ngx_http_hermes_log_escape(owner, owner + sizeof(owner) - 1,
                                       v->owner, v->owner_len, 1);
        *p = '\0';

        who = (v->owner_len && v->owner[0] == '\001') ? owner + 4 : owner;
        why = v->reason ? ngx_http_hermes_lost_names[v->reason].data
                        : (u_char *) "evicted";

        ngx_log_error(NGX_LOG_INFO, log, 0,
                      "hermes: evicting kernel \"%s\" (pid %P): %s, "
                      "owner: \"%s\", session: \"%*s\"",
                      v->dir, v->pid, why, who, v->session_len, v->session);

        bcf = ngx_http_hermes_kernel_backend(v);

        if (bcf == NULL) {
            ngx_log_error(NGX_LOG_WARN, log, 0,
                          "hermes: kernel \"%s\" belongs to a backend no "
                          "longer configured; it exits on its own idle "
                          "timeout", v->dir);
            continue;
        }

        if (ngx_http_hermes_kernel_kill(tp, bcf, v, log) != NGX_OK)
        {
            ngx_log_error(NGX_LOG_ERR, log, 0,
                          "hermes: could not kill kernel \"%s\"", v->dir);
        }
    }

    victims->n = 0;
}


/*
 * Every worker sweeps every zone: reclaims turns of dead workers, reaps
 * idle kernels, keeps the cap.  Cancelable: a worker that shuts down does
 * not wait for it.
 */

ngx_int_t
ngx_http_hermes_kernel_init_process(ngx_cycle_t *cycle,
    ngx_http_hermes_main_conf_t *hmcf)
{
    ngx_uint_t               i;
    ngx_event_t             *ev;
    ngx_shm_zone_t         **z;
    ngx_http_hermes_zone_t  *zone;

    ngx_http_hermes_main_conf = hmcf;
    ngx_queue_init(&ngx_http_hermes_kills_waiting);

    /*
     * Workers have no children of their own, and nginx's SIGCHLD handler
     * would reap (and log) the shells the thread pool waits for.
     */

    if (signal(SIGCHLD, SIG_DFL) == SIG_ERR) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      "hermes: signal(SIGCHLD) failed");
        return NGX_ERROR;
    }

    z = hmcf->zones.elts;

    for (i = 0; i < hmcf->zones.nelts; i++) {
        zone = z[i]->data;

        ev = ngx_pcalloc(cycle->pool, sizeof(ngx_event_t));
        if (ev == NULL) {
            return NGX_ERROR;
        }

        ev->handler = ngx_http_hermes_sweep_handler;
        ev->data = zone;
        ev->log = cycle->log;
        ev->cancelable = 1;

        zone->sweep_event = ev;

        /* spread the workers' sweeps over the interval */
        ngx_add_timer(ev, zone->sweep / 2 + ngx_random() % zone->sweep);

        /* a new zone: the first worker looks for an earlier run's kernels */

        if (ngx_http_hermes_registry_recovering(zone)) {
            ngx_http_hermes_kernel_recover(zone, cycle->log);
        }

        if (ngx_http_hermes_warm_init_process(zone, cycle) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/*
 * A zone made anew (nginx started, after a crash maybe, or the zone's
 * size changed) knows no kernel: those of an earlier run of this gateway
 * are leftovers, on every host of every backend.  They are told by the
 * journal spawn keeps beside the kernel dirs (hermes_kernel.sh): this
 * gateway's id and another zone instance.  Nothing a kernel or another
 * user can write is trusted: not a kernel dir, its name or its files.
 */

static void
ngx_http_hermes_kernel_recover(ngx_http_hermes_zone_t *zone, ngx_log_t *log)
{
    ngx_uint_t                        i, j, h;
    ngx_http_hermes_recover_t        *rec;
    ngx_http_hermes_backend_conf_t  **bcfs;

    bcfs = ngx_http_hermes_main_conf->backends.elts;

    for (i = 0; i < ngx_http_hermes_main_conf->backends.nelts; i++) {

        /* one backend in many locations is one place */

        for (j = 0; j < i; j++) {
            if (ngx_memcmp(bcfs[j]->tag, bcfs[i]->tag,
                           NGX_HTTP_HERMES_BACKEND_TAG_LEN) == 0)
            {
                break;
            }
        }

        if (j < i) {
            continue;
        }

        for (h = 0; h < bcfs[i]->nhosts; h++) {
            rec = ngx_calloc(sizeof(ngx_http_hermes_recover_t), log);
            if (rec == NULL) {
                return;
            }

            rec->root = bcfs[i]->root;

            *ngx_cpymem(rec->gateway, zone->gateway, NGX_HTTP_HERMES_TAG_HEX)
                = '\0';
            *ngx_cpymem(rec->instance, ngx_http_hermes_registry_instance(zone),
                        NGX_HTTP_HERMES_TAG_HEX) = '\0';

            rec->args[0] = "recover";
            rec->args[1] = (char *) rec->root.data;
            rec->args[2] = (char *) rec->gateway;
            rec->args[3] = (char *) rec->instance;
            rec->args[4] = NULL;

            ngx_http_hermes_backend_take(&rec->conn, bcfs[i], h);

            rec->task.ctx = rec;
            rec->task.handler = ngx_http_hermes_recover_thread;
            rec->task.event.handler = ngx_http_hermes_recover_event;
            rec->task.event.data = rec;
            rec->task.event.log = log;

            if (ngx_thread_task_post(zone->thread_pool, &rec->task) != NGX_OK) {
                ngx_http_hermes_backend_give(&rec->conn);
                ngx_free(rec);
                return;
            }
        }
    }
}


static void
ngx_http_hermes_recover_thread(void *data, ngx_log_t *log)
{
    ngx_http_hermes_recover_t *rec = data;

    ngx_http_hermes_cmd_t  c;

    ngx_memzero(&c, sizeof(ngx_http_hermes_cmd_t));
    c.cmd = ngx_http_hermes_script_kernel;
    c.args = rec->args;
    c.out = rec->out;
    c.out_size = sizeof(rec->out) - 1;
    c.timeout = 3 * NGX_HTTP_HERMES_CMD_TIMEOUT;

    if (ngx_http_hermes_backend_exec(&rec->conn, &c) != NGX_OK
        || c.status != 0)
    {
        rec->failed = 1;
    }

    rec->out_len = c.out_len;
}


static void
ngx_http_hermes_recover_event(ngx_event_t *ev)
{
    ngx_http_hermes_recover_t *rec = ev->data;

    u_char      *p, *last, *e;
    ngx_str_t   *host;
    ngx_uint_t   n;
    u_char       text[1024];

    host = ngx_http_hermes_backend_host_name(rec->conn.bcf, rec->conn.host);

    /* what the host printed is escaped: it is not ours to trust */

    n = 0;
    last = rec->out + rec->out_len;

    for (p = rec->out; p < last; p++) {
        if (*p == '\n') {
            n++;
            *p = ' ';
        }
    }

    e = ngx_http_hermes_log_escape(text, text + sizeof(text), rec->out,
                                   rec->out_len, 0);

    if (rec->failed) {
        ngx_log_error(NGX_LOG_ERR, ev->log, 0,
                      "hermes: could not look for leftover kernels in "
                      "\"%V\" on %V: %*s", &rec->root, host, e - text, text);

    } else if (n) {
        ngx_log_error(NGX_LOG_NOTICE, ev->log, 0,
                      "hermes: removed %ui kernel(s) left by an earlier run of "
                      "this gateway in \"%V\" on %V: %*s", n, &rec->root, host,
                      e - text, text);
    }

    /* a chore at start: a host down now is no reason to avoid it later */
    rec->conn.unavailable = 0;

    ngx_http_hermes_backend_give(&rec->conn);
    ngx_free(rec);
}


static void
ngx_http_hermes_sweep_handler(ngx_event_t *ev)
{
    ngx_http_hermes_zone_t *zone = ev->data;

    ngx_uint_t                 full, more;
    ngx_http_hermes_victims_t  victims;

    ngx_http_hermes_kill_repost();

    /* the dead-worker walk once; then batches until nothing is left */

    victims.n = 0;
    full = 1;

    do {
        ngx_http_hermes_registry_sweep(zone, &victims, full);
        full = 0;
        more = (victims.n == NGX_HTTP_HERMES_VICTIMS);
        ngx_http_hermes_kernel_kill_victims(zone->thread_pool, &victims,
                                            ev->log);
    } while (more);

    ngx_http_hermes_warm_upkeep(zone, ev->log);

    if (!ngx_exiting) {
        ngx_add_timer(ev, zone->sweep);
    }
}


void
ngx_http_hermes_kernel_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                        i;
    ngx_http_hermes_backend_conf_t  **bcfs;

    if (ngx_http_hermes_main_conf == NULL) {
        return;
    }

    bcfs = ngx_http_hermes_main_conf->backends.elts;

    for (i = 0; i < ngx_http_hermes_main_conf->backends.nelts; i++) {
        if (bcfs[i]->ops->exit_process) {
            bcfs[i]->ops->exit_process(bcfs[i]);
        }
    }
}


/*
 * The master, when nginx stops or quits (not on a reload: the registry
 * lives on then): no worker is left to run a cell, so every kernel of
 * every zone is killed and its directory removed, here and now, bounded
 * by NGX_HTTP_HERMES_EXIT_TIME in all.
 */

void
ngx_http_hermes_kernel_exit_master(ngx_cycle_t *cycle)
{
    char                            *args[7];
    u_char                           out[256];
    u_char                           buf[NGX_HTTP_HERMES_KILL_ARGS_LEN];
    ngx_uint_t                       i, j, killed, failed, left, level;
    ngx_msec_t                       deadline, now;
    ngx_shm_zone_t                 **z;
    ngx_http_hermes_cmd_t            c;
    ngx_http_hermes_conn_t           conn;
    ngx_http_hermes_zone_t          *zone;
    ngx_http_hermes_victims_t        victims;
    ngx_http_hermes_main_conf_t     *hmcf;
    ngx_http_hermes_backend_conf_t  *bcf;

    hmcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_hermes_module);

    if (hmcf == NULL || hmcf->zones.nelts == 0) {
        return;
    }

    ngx_http_hermes_main_conf = hmcf;

    /* the shells below are ours to wait for, not the master's to reap */

    if (signal(SIGCHLD, SIG_DFL) == SIG_ERR) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      "hermes: cannot kill the kernels at exit");
        return;
    }

    killed = 0;
    failed = 0;
    left = 0;

    ngx_time_update();
    deadline = ngx_current_msec + NGX_HTTP_HERMES_EXIT_TIME;

    z = hmcf->zones.elts;

    for (i = 0; i < hmcf->zones.nelts; i++) {
        zone = z[i]->data;

        if (zone == NULL || zone->sh == NULL) {
            continue;
        }

        for ( ;; ) {
            victims.n = 0;

            if (ngx_http_hermes_registry_drain(zone, &victims) == 0) {
                break;
            }

            for (j = 0; j < victims.n; j++) {
                bcf = ngx_http_hermes_kernel_backend(&victims.v[j]);

                ngx_time_update();
                now = ngx_current_msec;

                if (bcf == NULL || now >= deadline) {
                    left++;
                    continue;
                }

                if (ngx_http_hermes_kill_args(&victims.v[j], args, buf)
                    != NGX_OK)
                {
                    failed++;
                    continue;
                }

                ngx_memzero(&c, sizeof(ngx_http_hermes_cmd_t));
                c.cmd = ngx_http_hermes_script_kernel;
                c.args = args;
                c.out = out;
                c.out_size = sizeof(out);
                c.timeout = ngx_min(NGX_HTTP_HERMES_CMD_TIMEOUT,
                                    deadline - now);

                ngx_http_hermes_backend_take(&conn, bcf, victims.v[j].host);

                if (ngx_http_hermes_backend_exec(&conn, &c) == NGX_OK
                    && c.status == 0)
                {
                    killed++;

                } else {
                    failed++;
                }

                ngx_http_hermes_backend_give(&conn);
            }
        }
    }

    if (killed + failed + left) {
        level = (failed + left) ? NGX_LOG_WARN : NGX_LOG_NOTICE;

        ngx_log_error(level, cycle->log, 0,
                      "hermes: nginx stops: %ui kernel(s) shut down, "
                      "%ui could not be killed, %ui left for lack of time",
                      killed, failed, left);
    }

    ngx_http_hermes_kernel_exit_process(cycle);
}


static void
ngx_http_hermes_kill_retry(ngx_event_t *ev)
{
    ngx_http_hermes_kill_t *k = ev->data;

    ngx_http_hermes_backend_take(&k->conn, k->conn.bcf, k->conn.host);
    ngx_http_hermes_kill_post(k);
}
