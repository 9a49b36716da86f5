
/*
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
#define NGX_HTTP_HERMES_READY_TIMEOUT 10000
#define NGX_HTTP_HERMES_CMD_MAX       (4 * NGX_HTTP_HERMES_DIR_MAX + 256)

/* the runner outlives the registry's idle clock a little, then exits */
#define NGX_HTTP_HERMES_RUNNER_GRACE  30

#define NGX_HTTP_HERMES_KILL_RETRIES  5


struct ngx_http_hermes_spawn_s {
    ngx_http_hermes_conn_t         conn;
    u_char                         dir[NGX_HTTP_HERMES_DIR_MAX];
    u_char                         env[256];
    size_t                         env_len;
    ngx_pid_t                      pid;
    ngx_int_t                      rc;
    u_char                         err[256];
    ngx_http_hermes_spawn_done_pt  done;
    void                          *data;
};


typedef struct {
    ngx_thread_task_t              task;
    ngx_http_hermes_conn_t         conn;
    u_char                         dir[NGX_HTTP_HERMES_DIR_MAX];
    ngx_pid_t                      pid;
    ngx_log_t                     *log;
    ngx_thread_pool_t             *tp;
    ngx_event_t                    retry;
    ngx_uint_t                     tries;
    unsigned                       failed:1;
} ngx_http_hermes_kill_t;


/* per worker: the backends of its cycle, to kill what the sweep evicts */
static ngx_http_hermes_main_conf_t  *ngx_http_hermes_main_conf;


static void ngx_http_hermes_spawn_thread(void *data, ngx_log_t *log);
static void ngx_http_hermes_spawn_event(ngx_event_t *ev);
static ngx_int_t ngx_http_hermes_spawn_run(ngx_http_hermes_spawn_t *s,
    u_char *cmd, const u_char *in, size_t in_len, u_char *out,
    size_t out_size, const char *step);
static void ngx_http_hermes_kill_thread(void *data, ngx_log_t *log);
static void ngx_http_hermes_kill_event(ngx_event_t *ev);
static void ngx_http_hermes_kill_retry(ngx_event_t *ev);
static void ngx_http_hermes_sweep_handler(ngx_event_t *ev);


ngx_int_t
ngx_http_hermes_kernel_spawn(ngx_http_hermes_loc_conf_t *hlcf,
    ngx_http_hermes_zone_t *zone, ngx_http_hermes_kernel_ref_t *ref,
    ngx_pool_t *pool, ngx_http_hermes_spawn_done_pt done, void *data,
    ngx_log_t *log)
{
    u_char                   *p;
    ngx_uint_t                idle;
    ngx_thread_task_t        *task;
    ngx_http_hermes_spawn_t  *s;
    u_char                    token[NGX_HTTP_HERMES_TOKEN_LEN * 2 + 1];

    task = ngx_thread_task_alloc(pool, sizeof(ngx_http_hermes_spawn_t));
    if (task == NULL) {
        return NGX_ERROR;
    }

    s = task->ctx;

    ngx_http_hermes_conn_take(&s->conn, hlcf->backend, ref->host);

    ngx_memcpy(s->dir, ref->dir, ref->dir_len + 1);
    s->done = done;
    s->data = data;

    idle = zone->idle_timeout / 1000;
    if (idle) {
        idle += NGX_HTTP_HERMES_RUNNER_GRACE;
    }

    /* the token goes in kernel.env, shipped on stdin, sourced, removed */

    sodium_bin2hex((char *) token, sizeof(token), ref->token,
                   NGX_HTTP_HERMES_TOKEN_LEN);

    p = ngx_snprintf(s->env, sizeof(s->env),
                     "HERMES_RPC_TOKEN='%s'\n"
                     "HERMES_KERNEL_ID='%*s'\n"
                     "HERMES_IDLE_TIMEOUT='%ui'\n",
                     token, (size_t) NGX_HTTP_HERMES_ID_LEN, ref->kernel_id,
                     idle);
    s->env_len = p - s->env;

    sodium_memzero(token, sizeof(token));

    task->handler = ngx_http_hermes_spawn_thread;
    task->event.handler = ngx_http_hermes_spawn_event;
    task->event.data = s;

    if (ngx_thread_task_post(hlcf->thread_pool, task) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, log, 0,
                   "hermes: spawning kernel in \"%s\"", s->dir);

    return NGX_OK;
}


static void
ngx_http_hermes_spawn_thread(void *data, ngx_log_t *log)
{
    ngx_http_hermes_spawn_t *s = data;

    u_char                         *d, *p, *last;
    ngx_int_t                       pid, rc;
    ngx_http_hermes_remote_file_t  *rf;
    u_char                          cmd[NGX_HTTP_HERMES_CMD_MAX];
    u_char                          out[256];

    d = s->dir;
    s->rc = NGX_ERROR;
    s->pid = 0;
    last = cmd + sizeof(cmd) - 1;

    /* 1. owner-only directories, verified: anything but 0700 fails */

    *ngx_slprintf(cmd, last,
                  "umask 077 && mkdir -p '%s/cells' '%s/rpc'"
                  " && chmod 700 '%s' '%s/cells' '%s/rpc'"
                  " && stat -c %%a '%s' '%s/cells' '%s/rpc'",
                  d, d, d, d, d, d, d, d) = '\0';

    if (ngx_http_hermes_spawn_run(s, cmd, NULL, 0, out, sizeof(out),
                                  "directory setup")
        != NGX_OK)
    {
        goto failed;
    }

    if (ngx_strcmp(out, "700\n700\n700\n") != 0) {
        ngx_snprintf(s->err, sizeof(s->err),
                     "directory setup: modes are not 0700: \"%s\"%Z", out);
        goto failed;
    }

    /* 2. the runner and the tools client, each on stdin */

    for (rf = ngx_http_hermes_remote_files; rf->len; rf++) {
        *ngx_slprintf(cmd, last,
                      "umask 077 && cat > '%s/%V.tmp'"
                      " && chmod 600 '%s/%V.tmp'"
                      " && mv -f '%s/%V.tmp' '%s/%V'",
                      d, &rf->name, d, &rf->name, d, &rf->name, d, &rf->name)
            = '\0';

        if (ngx_http_hermes_spawn_run(s, cmd, rf->data, rf->len, out,
                                      sizeof(out), "ship runner")
            != NGX_OK)
        {
            goto failed;
        }
    }

    /* 3. kernel.env, holding the token */

    *ngx_slprintf(cmd, last,
                  "umask 077 && cat > '%s/kernel.env.tmp'"
                  " && chmod 600 '%s/kernel.env.tmp'"
                  " && mv -f '%s/kernel.env.tmp' '%s/kernel.env'",
                  d, d, d, d) = '\0';

    if (ngx_http_hermes_spawn_run(s, cmd, s->env, s->env_len, out,
                                  sizeof(out), "ship kernel.env")
        != NGX_OK)
    {
        goto failed;
    }

    /*
     * 4. start: the env is sourced in a subshell, so the token never
     * enters the outer shell; the runner leads its own process group
     */

    *ngx_slprintf(cmd, last,
                  "umask 077 && cd '%s' && { ( set -a; . ./kernel.env; set +a;"
                  " rm -f ./kernel.env; exec setsid python3 kernel_runner.py )"
                  " >runner.log 2>&1 </dev/null & } && echo $!",
                  d) = '\0';

    if (ngx_http_hermes_spawn_run(s, cmd, NULL, 0, out, sizeof(out),
                                  "start")
        != NGX_OK)
    {
        goto failed;
    }

    for (p = out; *p >= '0' && *p <= '9'; p++) { /* void */ }

    pid = ngx_atoi(out, p - out);
    if (pid == NGX_ERROR || pid <= 1) {
        ngx_snprintf(s->err, sizeof(s->err), "start: no pid: \"%s\"%Z", out);
        goto failed;
    }

    s->pid = (ngx_pid_t) pid;

    /* 5. alive: the runner says "ready" with its pid */

    if (s->conn.bcf->type == NGX_HTTP_HERMES_BACKEND_LOCAL) {
        rc = ngx_http_hermes_local_wait_ready(d, s->pid,
                                              NGX_HTTP_HERMES_READY_TIMEOUT);

    } else {
        *ngx_slprintf(cmd, last,
                      "i=0; while [ $i -lt 1000 ] && [ ! -s '%s/ready' ]"
                      " && kill -0 %P 2>/dev/null;"
                      " do sleep 0.01; i=$((i+1)); done;"
                      " cat '%s/ready' && kill -0 %P",
                      d, s->pid, d, s->pid) = '\0';

        rc = ngx_http_hermes_spawn_run(s, cmd, NULL, 0, out, sizeof(out),
                                       "ready");
        if (rc == NGX_OK) {
            rc = ngx_http_hermes_ready_pid(out, s->pid);
        }
    }

    if (rc != NGX_OK) {
        if (s->rc != NGX_DECLINED) {
            ngx_snprintf(s->err, sizeof(s->err),
                         "the kernel did not start (see \"%s/runner.log\")%Z",
                         d);
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

    if (s->pid) {
        *ngx_slprintf(cmd, last, "kill -9 -%P 2>/dev/null; rm -rf -- '%s'",
                      s->pid, d) = '\0';

    } else {
        *ngx_slprintf(cmd, last, "rm -rf -- '%s'", d) = '\0';
    }

    (void) ngx_http_hermes_spawn_run(s, cmd, NULL, 0, out, sizeof(out),
                                     NULL);

    s->rc = NGX_ERROR;
}


static ngx_int_t
ngx_http_hermes_spawn_run(ngx_http_hermes_spawn_t *s, u_char *cmd,
    const u_char *in, size_t in_len, u_char *out, size_t out_size,
    const char *step)
{
    ngx_int_t              rc;
    ngx_http_hermes_cmd_t  c;

    ngx_memzero(&c, sizeof(ngx_http_hermes_cmd_t));

    c.cmd = (char *) cmd;
    c.in = in;
    c.in_len = in_len;
    c.out = out;
    c.out_size = out_size - 1;
    c.timeout = NGX_HTTP_HERMES_CMD_TIMEOUT;

    rc = ngx_http_hermes_backend_exec(&s->conn, &c);

    out[c.out_len] = '\0';

    if (step == NULL) {
        return rc;
    }

    if (rc == NGX_DECLINED) {
        /* the backend is unreachable: no step ran */
        s->rc = NGX_DECLINED;
        ngx_snprintf(s->err, sizeof(s->err), "%s%Z", s->conn.err);
        return NGX_ERROR;
    }

    if (rc != NGX_OK) {
        ngx_snprintf(s->err, sizeof(s->err), "%s: %s%Z", step,
                     s->conn.err[0] ? (char *) s->conn.err
                     : c.err ? strerror(c.err) : "failed");
        return NGX_ERROR;
    }

    if (c.status != 0) {
        ngx_snprintf(s->err, sizeof(s->err), "%s: exit code %d: \"%s\"%Z",
                     step, c.status, out);
        return NGX_ERROR;
    }

    return NGX_OK;
}


static void
ngx_http_hermes_spawn_event(ngx_event_t *ev)
{
    ngx_http_hermes_spawn_t *s = ev->data;

    ngx_http_hermes_conn_give(&s->conn);

    s->done(s->data, s->rc, s->pid, (char *) s->err);
}


/* a command on the kernel's host: NGX_DECLINED when it is unreachable */

ngx_int_t
ngx_http_hermes_backend_exec(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_cmd_t *cmd)
{
    if (conn->bcf->type == NGX_HTTP_HERMES_BACKEND_SSH) {
        return ngx_http_hermes_ssh_exec(conn, cmd);
    }

    return ngx_http_hermes_local_exec(cmd);
}


/*
 * Kill a kernel's process group and remove its directory.  Not bound to a
 * request: the task is freed when it completes.
 */

ngx_int_t
ngx_http_hermes_kernel_kill(ngx_thread_pool_t *tp,
    ngx_http_hermes_backend_conf_t *bcf, ngx_uint_t host, u_char *dir,
    size_t dir_len, ngx_pid_t pid, ngx_log_t *log)
{
    ngx_http_hermes_kill_t  *k;

    if (dir_len == 0 || dir_len >= NGX_HTTP_HERMES_DIR_MAX) {
        return NGX_ERROR;
    }

    k = ngx_calloc(sizeof(ngx_http_hermes_kill_t), log);
    if (k == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(k->dir, dir, dir_len);
    k->pid = pid;
    k->log = ngx_cycle->log;     /* the task may outlive a request */
    k->tp = tp;

    ngx_http_hermes_conn_take(&k->conn, bcf, host);

    k->task.ctx = k;
    k->task.handler = ngx_http_hermes_kill_thread;
    k->task.event.handler = ngx_http_hermes_kill_event;
    k->task.event.data = k;

    if (ngx_thread_task_post(tp, &k->task) != NGX_OK) {
        ngx_http_hermes_conn_give(&k->conn);
        ngx_free(k);
        return NGX_ERROR;
    }

    return NGX_OK;
}


static void
ngx_http_hermes_kill_thread(void *data, ngx_log_t *log)
{
    ngx_http_hermes_kill_t *k = data;

    u_char                 out[256];
    u_char                 cmd[NGX_HTTP_HERMES_DIR_MAX + 64];
    ngx_http_hermes_cmd_t  c;

    /* the whole process group, then the directory */

    if (k->pid > 1) {
        *ngx_slprintf(cmd, cmd + sizeof(cmd) - 1,
                      "kill -9 -%P 2>/dev/null; rm -rf -- '%s'",
                      k->pid, k->dir) = '\0';

    } else {
        *ngx_slprintf(cmd, cmd + sizeof(cmd) - 1, "rm -rf -- '%s'", k->dir)
            = '\0';
    }

    ngx_memzero(&c, sizeof(ngx_http_hermes_cmd_t));
    c.cmd = (char *) cmd;
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

    if (k->failed && k->conn.unavailable
        && k->tries < NGX_HTTP_HERMES_KILL_RETRIES)
    {
        /* the host is down: try again later, the kernel must go */

        ngx_log_error(NGX_LOG_WARN, k->log, 0,
                      "hermes: killing kernel %P in \"%s\" failed: %s; "
                      "retrying", k->pid, k->dir, k->conn.err);

        ngx_http_hermes_conn_give(&k->conn);

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
                      k->pid, k->dir,
                      k->conn.err[0] ? (char *) k->conn.err : "command failed");

    } else {
        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, k->log, 0,
                       "hermes: killed kernel %P, removed \"%s\"",
                       k->pid, k->dir);
    }

    ngx_http_hermes_conn_give(&k->conn);

    ngx_free(k);
}


void
ngx_http_hermes_kernel_kill_victims(ngx_thread_pool_t *tp,
    ngx_http_hermes_victims_t *victims, ngx_log_t *log)
{
    ngx_uint_t                        i, j;
    ngx_http_hermes_victim_t         *v;
    ngx_http_hermes_backend_conf_t  **bcfs, *bcf;

    bcfs = ngx_http_hermes_main_conf->backends.elts;

    for (i = 0; i < victims->n; i++) {
        v = &victims->v[i];

        ngx_log_error(NGX_LOG_INFO, log, 0,
                      "hermes: evicting kernel \"%s\" (pid %P)",
                      v->dir, v->pid);

        /* the backend that made it, by its tag in the registry key */

        bcf = NULL;

        for (j = 0; j < ngx_http_hermes_main_conf->backends.nelts; j++) {
            if (ngx_memcmp(bcfs[j]->tag, v->tag,
                           NGX_HTTP_HERMES_BACKEND_TAG_LEN) == 0)
            {
                bcf = bcfs[j];
                break;
            }
        }

        if (bcf == NULL) {
            ngx_log_error(NGX_LOG_WARN, log, 0,
                          "hermes: kernel \"%s\" belongs to a backend no "
                          "longer configured; it exits on its own idle "
                          "timeout", v->dir);
            continue;
        }

        if (ngx_http_hermes_kernel_kill(tp, bcf, v->host, v->dir, v->dir_len,
                                        v->pid, log)
            != NGX_OK)
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

    if (ngx_http_hermes_ssh_init() != NGX_OK) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, 0,
                      "hermes: ssh_init() failed");
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
    }

    return NGX_OK;
}


static void
ngx_http_hermes_sweep_handler(ngx_event_t *ev)
{
    ngx_http_hermes_zone_t *zone = ev->data;

    ngx_uint_t                 full, more;
    ngx_http_hermes_victims_t  victims;

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
        if (bcfs[i]->type == NGX_HTTP_HERMES_BACKEND_SSH) {
            ngx_http_hermes_ssh_exit_process(bcfs[i]);
        }
    }
}


static void
ngx_http_hermes_kill_retry(ngx_event_t *ev)
{
    ngx_http_hermes_kill_t *k = ev->data;

    ngx_http_hermes_conn_take(&k->conn, k->conn.bcf, k->conn.host);

    if (ngx_thread_task_post(k->tp, &k->task) != NGX_OK) {
        ngx_http_hermes_conn_give(&k->conn);
        ngx_free(k);
    }
}
