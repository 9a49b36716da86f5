
/*
 * ngx_hermes: one cell's run on its kernel.
 *
 * A cell takes its turn on the kernel (spawning it when there is none),
 * ships cells/cell_req_N.json, wakes the runner through its FIFO, then
 * streams cells/cell_out_N and answers with cells/cell_res_N.json.  An
 * inotify watch on cells/ says when to look and a pidfd says when the
 * kernel died; the files stay the truth.
 *
 * The cell lives in its own pool: a client that goes away detaches the
 * request, and the cell still runs to its end, so the kernel stays usable.
 */


#include "ngx_hermes.h"

#include <poll.h>
#include <sys/inotify.h>
#include <sys/syscall.h>


#define NGX_HTTP_HERMES_OUT_CHUNK      (128 * 1024)
#define NGX_HTTP_HERMES_WAIT_MAX       50

/* the windows of a cell's event lines kept for its output: escaping makes
 * at most 6 bytes of a text byte, the head is 40% and the tail 60% */
#define NGX_HTTP_HERMES_KEEP_HEAD(max)  (3 * (max) + 4096)
#define NGX_HTTP_HERMES_KEEP_TAIL(max)  (4 * (max) + 4096)
#define NGX_HTTP_HERMES_INOTIFY_MASK                                          \
    (IN_MODIFY|IN_MOVED_TO|IN_DELETE_SELF|IN_ONLYDIR)


typedef struct {
    ngx_pool_t                     *pool;
    ngx_log_t                      *log;
    ngx_http_request_t             *r;          /* NULL: the client is gone */
    ngx_http_cleanup_t             *cln;
    ngx_http_hermes_ctx_t          *ctx;        /* the request's */

    ngx_http_hermes_loc_conf_t     *hlcf;
    ngx_http_hermes_zone_t         *zone;
    ngx_http_hermes_request_t       req;
    ngx_http_hermes_kernel_ref_t    ref;
    ngx_http_hermes_result_t        res;

    ngx_event_t                     wait;       /* polling for our turn */
    ngx_event_t                     resume;     /* the client left: go on */
    ngx_msec_t                      wait_delay;
    ngx_event_t                     timer;      /* the cell's timeout */
    ngx_msec_t                      timeout;
    ngx_msec_t                      started;
    ngx_msec_t                      turn;       /* its turn came */
    ngx_msec_t                      spawn_at;
    ngx_uint_t                      spawn_tries;

    int                             wd;
    ngx_fd_t                        dir_fd;     /* verified at the start */
    ngx_fd_t                        cells_fd;
    ngx_fd_t                        out_fd;
    off_t                           out_off;
    off_t                           out_limit;  /* of cell_out, read */
    size_t                          out_sent;   /* ssh: bytes forwarded */

    /* ssh: the head and the tail of the event lines, for a lost result */
    u_char                         *keep;
    size_t                          keep_head;
    size_t                          keep_tail;
    size_t                          keep_total;
    ngx_connection_t               *pidfd;

    ngx_connection_t               *relay;      /* ssh: the relay's output */
    ngx_buf_t                      *rbuf;

    ngx_chain_t                    *free;
    ngx_chain_t                    *busy;

    ngx_queue_t                     queue;      /* the worker's live cells */

    unsigned                        header_sent:1;
    unsigned                        spawning:1;
    unsigned                        shipped:1;
    unsigned                        res_ready:1;
    unsigned                        draining:1; /* result in, output not */
    unsigned                        paused:1;   /* the client is slow */
    unsigned                        mid_line:1; /* sent no "\n" last */
    unsigned                        interrupting:1; /* timed out: grace */
} ngx_http_hermes_cell_t;


static ngx_int_t ngx_http_hermes_cell_acquired(ngx_http_hermes_cell_t *cell,
    ngx_int_t rc);
static void ngx_http_hermes_cell_wait_handler(ngx_event_t *ev);
static void ngx_http_hermes_cell_spawned(void *data, ngx_int_t rc,
    ngx_http_hermes_spawned_t *k, const char *err);
static ngx_int_t ngx_http_hermes_cell_spawn(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_spawn_error(ngx_http_hermes_cell_t *cell,
    ngx_int_t rc);
static void ngx_http_hermes_cell_run(ngx_http_hermes_cell_t *cell);
static ngx_int_t ngx_http_hermes_cell_started(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_respawn(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_ship_failed(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_run_relay(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_relay_handler(ngx_event_t *ev);
static void ngx_http_hermes_cell_relay_end(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_forward(ngx_http_hermes_cell_t *cell,
    u_char *p, size_t n);
static void ngx_http_hermes_cell_result(ngx_http_hermes_cell_t *cell,
    u_char *data, size_t n);
static void ngx_http_hermes_cell_pump(ngx_http_hermes_cell_t *cell);
static ngx_int_t ngx_http_hermes_cell_read_out(ngx_http_hermes_cell_t *cell,
    ngx_uint_t all);
static void ngx_http_hermes_cell_finish(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_fail(ngx_http_hermes_cell_t *cell,
    ngx_uint_t status, char *message);
static void ngx_http_hermes_cell_salvage(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_salvage_windows(ngx_http_hermes_cell_t *cell,
    u_char *data, size_t hsize, size_t tlen, ngx_uint_t gap);
static void ngx_http_hermes_cell_keep(ngx_http_hermes_cell_t *cell, u_char *p,
    size_t n);
static void ngx_http_hermes_cell_events(u_char *p, u_char *last,
    ngx_buf_t *out, ngx_buf_t *err);
static void ngx_http_hermes_cell_answer(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_timeout_handler(ngx_event_t *ev);
static void ngx_http_hermes_cell_died_handler(ngx_event_t *ev);
static ngx_int_t ngx_http_hermes_cell_interrupt(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_kill(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_victim(ngx_http_hermes_cell_t *cell,
    ngx_http_hermes_victim_t *v);
static void ngx_http_hermes_cell_error(ngx_http_hermes_cell_t *cell,
    ngx_uint_t status, char *code, char *message);
static ngx_int_t ngx_http_hermes_cell_send_header(
    ngx_http_hermes_cell_t *cell);
static ngx_int_t ngx_http_hermes_cell_send(ngx_http_hermes_cell_t *cell,
    ngx_buf_t *b);
static ngx_int_t ngx_http_hermes_cell_send_chain(
    ngx_http_hermes_cell_t *cell, ngx_chain_t *out);
static void ngx_http_hermes_cell_write_handler(ngx_http_request_t *r);
static void ngx_http_hermes_cell_detach(void *data);
static void ngx_http_hermes_cell_end(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_inotify_handler(ngx_event_t *ev);
static void ngx_http_hermes_inotify_overflow(ngx_log_t *log);
static ngx_int_t ngx_http_hermes_cell_open_kernel(
    ngx_http_hermes_cell_t *cell);
static ngx_int_t ngx_http_hermes_cell_private_dir(ngx_file_info_t *fi,
    uint32_t uid);
static void ngx_http_hermes_cell_close_kernel(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_disk_full(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_drain(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_resume(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_resume_handler(ngx_event_t *ev);
static void ngx_http_hermes_cell_end_line(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_name(ngx_http_hermes_cell_t *cell,
    u_char *buf, const char *what);


/* per worker: one inotify fd for every cell this worker streams */

static ngx_connection_t  *ngx_http_hermes_inotify;
static ngx_queue_t        ngx_http_hermes_cells;


ngx_int_t
ngx_http_hermes_cell_init_process(ngx_cycle_t *cycle)
{
    int                fd;
    ngx_connection_t  *c;

    ngx_queue_init(&ngx_http_hermes_cells);

    /*
     * Workers have no children of their own, and nginx's SIGCHLD handler
     * would reap (and log) the shells the thread pool waits for.
     */

    if (signal(SIGCHLD, SIG_DFL) == SIG_ERR) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      "hermes: signal(SIGCHLD) failed");
        return NGX_ERROR;
    }

    fd = inotify_init1(IN_NONBLOCK|IN_CLOEXEC);
    if (fd == -1) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      "hermes: inotify_init1() failed");
        return NGX_ERROR;
    }

    c = ngx_get_connection(fd, cycle->log);
    if (c == NULL) {
        close(fd);
        return NGX_ERROR;
    }

    c->read->handler = ngx_http_hermes_inotify_handler;
    c->read->log = cycle->log;

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        ngx_close_connection(c);
        return NGX_ERROR;
    }

    ngx_http_hermes_inotify = c;

    return NGX_OK;
}


void
ngx_http_hermes_cell_exit_process(ngx_cycle_t *cycle)
{
    if (ngx_http_hermes_inotify) {
        ngx_close_connection(ngx_http_hermes_inotify);
        ngx_http_hermes_inotify = NULL;
    }
}


ngx_int_t
ngx_http_hermes_cell_start(ngx_http_request_t *r,
    ngx_http_hermes_request_t *req, ngx_str_t *owner)
{
    u_char                      *p;
    ngx_int_t                    rc;
    ngx_pool_t                  *pool;
    ngx_http_hermes_cell_t      *cell;
    ngx_http_hermes_victims_t    victims;
    ngx_http_hermes_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    pool = ngx_create_pool(4096, ngx_cycle->log);
    if (pool == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cell = ngx_pcalloc(pool, sizeof(ngx_http_hermes_cell_t));
    if (cell == NULL) {
        ngx_destroy_pool(pool);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cell->pool = pool;
    cell->log = ngx_cycle->log;
    cell->r = r;
    cell->hlcf = hlcf;
    cell->zone = hlcf->shm_zone->data;
    cell->req = *req;
    cell->wd = -1;
    cell->dir_fd = NGX_INVALID_FILE;
    cell->cells_fd = NGX_INVALID_FILE;
    cell->out_fd = NGX_INVALID_FILE;
    /* event lines escape what the runner caps at max_stream: up to 6x */
    cell->out_limit = 6 * (off_t) hlcf->max_stream + 65536;
    cell->started = ngx_current_msec;
    cell->timeout = req->timeout ? req->timeout : hlcf->cell_timeout;

    /* the request's strings die with it; the cell's must not */

    cell->req.code.data = ngx_pstrdup(pool, &req->code);
    cell->req.session.data = ngx_pstrdup(pool, &req->session);
    cell->req.tool_call_id.data = ngx_pstrdup(pool, &req->tool_call_id);

    cell->ref.key.len = owner->len + 1 + NGX_HTTP_HERMES_BACKEND_TAG_LEN + 1
                        + req->session.len;
    cell->ref.key.data = ngx_pnalloc(pool, cell->ref.key.len);

    if ((req->code.len && cell->req.code.data == NULL)
        || cell->req.session.data == NULL
        || (req->tool_call_id.len && cell->req.tool_call_id.data == NULL)
        || cell->ref.key.data == NULL)
    {
        ngx_destroy_pool(pool);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = ngx_cpymem(cell->ref.key.data, owner->data, owner->len);
    *p++ = '\0';
    p = ngx_cpymem(p, hlcf->backend->tag, NGX_HTTP_HERMES_BACKEND_TAG_LEN);
    *p++ = '\0';
    ngx_memcpy(p, req->session.data, req->session.len);

    cell->ref.owner.data = cell->ref.key.data;
    cell->ref.owner.len = owner->len;
    cell->ref.session = cell->req.session;

    cell->cln = ngx_http_cleanup_add(r, 0);
    if (cell->cln == NULL) {
        ngx_destroy_pool(pool);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cell->cln->handler = ngx_http_hermes_cell_detach;
    cell->cln->data = cell;

    cell->ctx = ngx_http_hermes_get_ctx(r);
    if (cell->ctx == NULL) {
        cell->cln->handler = NULL;
        ngx_destroy_pool(pool);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cell->ctx->session = req->session;
    cell->ctx->cell = cell;

    cell->wait.handler = ngx_http_hermes_cell_wait_handler;
    cell->wait.data = cell;
    cell->wait.log = cell->log;

    cell->resume.handler = ngx_http_hermes_cell_resume_handler;
    cell->resume.data = cell;
    cell->resume.log = cell->log;

    cell->timer.handler = ngx_http_hermes_cell_timeout_handler;
    cell->timer.data = cell;
    cell->timer.log = cell->log;

    ngx_queue_insert_tail(&ngx_http_hermes_cells, &cell->queue);

    /* the client may go away; the cell runs on regardless */
    r->read_event_handler = ngx_http_test_reading;

    victims.n = 0;

    rc = ngx_http_hermes_registry_acquire(cell->zone, &cell->ref,
                                          &hlcf->backend->root, hlcf->queue,
                                          &victims);

    ngx_http_hermes_kernel_kill_victims(hlcf->thread_pool, &victims,
                                        cell->log);

    return ngx_http_hermes_cell_acquired(cell, rc);
}


/* returns what the request's handler returns: NGX_DONE while we hold it */

static ngx_int_t
ngx_http_hermes_cell_acquired(ngx_http_hermes_cell_t *cell, ngx_int_t rc)
{
    if (rc == NGX_HTTP_HERMES_ACQ_RUN || rc == NGX_HTTP_HERMES_ACQ_SPAWN) {
        /* what it waited for its turn is not the cell's duration */
        cell->turn = ngx_current_msec;
        ngx_http_hermes_registry_observe(cell->zone,
                                         NGX_HTTP_HERMES_HIST_QUEUE,
                                         cell->turn - cell->started);

        if (cell->ctx) {
            cell->ctx->queue_ms = cell->turn - cell->started;
            cell->ctx->has_queue = 1;
        }
    }

    switch (rc) {

    case NGX_HTTP_HERMES_ACQ_QUEUE_FULL:
        ngx_http_hermes_cell_error(cell, NGX_HTTP_TOO_MANY_REQUESTS,
                                   "queue_full",
                                   "too many cells are waiting on this "
                                   "session's kernel");
        return NGX_DONE;

    case NGX_HTTP_HERMES_ACQ_OWNER_FULL:
        ngx_http_hermes_cell_error(cell, NGX_HTTP_TOO_MANY_REQUESTS,
                                   "owner_limit",
                                   "you have max_kernels_per_owner kernels "
                                   "and all of them are busy");
        return NGX_DONE;

    case NGX_HTTP_HERMES_ACQ_NOMEM:
        ngx_log_error(NGX_LOG_ERR, cell->log, 0,
                      "hermes: zone \"%V\" is full, no kernel for "
                      "session \"%V\"",
                      &cell->zone->shm_zone->shm.name, &cell->req.session);

        ngx_http_hermes_cell_error(cell, NGX_HTTP_SERVICE_UNAVAILABLE,
                                   "registry_full",
                                   "the kernel registry is out of memory");
        return NGX_DONE;

    case NGX_HTTP_HERMES_ACQ_WAIT:
        cell->wait_delay = 1;
        ngx_add_timer(&cell->wait, cell->wait_delay);
        return NGX_DONE;

    case NGX_HTTP_HERMES_ACQ_SPAWN:
        rc = ngx_http_hermes_cell_spawn(cell);

        if (rc != NGX_OK) {
            ngx_http_hermes_registry_release(cell->zone, &cell->ref,
                                             NGX_HTTP_HERMES_RELEASE_GONE, 0);
            ngx_http_hermes_cell_spawn_error(cell, rc);
        }

        return NGX_DONE;

    default: /* NGX_HTTP_HERMES_ACQ_RUN */
        ngx_http_hermes_cell_run(cell);
        return NGX_DONE;
    }
}


static void
ngx_http_hermes_cell_wait_handler(ngx_event_t *ev)
{
    ngx_http_hermes_cell_t *cell = ev->data;

    ngx_int_t                    rc;
    ngx_connection_t            *c;
    ngx_http_hermes_victims_t    victims;
    ngx_http_hermes_loc_conf_t  *hlcf;

    hlcf = cell->hlcf;
    c = cell->r ? cell->r->connection : NULL;

    rc = ngx_http_hermes_registry_poll(cell->zone, &cell->ref,
                                       &hlcf->backend->root);

    if (rc == NGX_HTTP_HERMES_ACQ_WAIT) {
        if (cell->wait_delay < NGX_HTTP_HERMES_WAIT_MAX) {
            cell->wait_delay *= 2;
        }

        ngx_add_timer(&cell->wait, cell->wait_delay);
        return;
    }

    if (rc == NGX_HTTP_HERMES_ACQ_GONE) {
        /* the kernel was shut down while we queued: start over */
        ngx_memzero(&cell->ref.gen, sizeof(cell->ref) - offsetof(
                        ngx_http_hermes_kernel_ref_t, gen));

        victims.n = 0;

        rc = ngx_http_hermes_registry_acquire(cell->zone, &cell->ref,
                                              &hlcf->backend->root,
                                              hlcf->queue, &victims);

        ngx_http_hermes_kernel_kill_victims(hlcf->thread_pool, &victims,
                                            cell->log);
    }

    (void) ngx_http_hermes_cell_acquired(cell, rc);

    if (c) {
        ngx_http_run_posted_requests(c);
    }
}


static ngx_int_t
ngx_http_hermes_cell_spawn(ngx_http_hermes_cell_t *cell)
{
    ngx_int_t  rc;

    cell->spawn_at = ngx_current_msec;

    ngx_http_hermes_registry_place(cell->zone, &cell->ref,
                                   cell->hlcf->backend);

    rc = ngx_http_hermes_kernel_spawn(cell->hlcf, cell->zone, &cell->ref,
                                      cell->pool,
                                      ngx_http_hermes_cell_spawned, cell,
                                      cell->log);
    if (rc != NGX_OK) {
        return rc;
    }

    /*
     * A pending timer keeps a worker that is shutting down alive until the
     * spawn task, which holds this cell, is done.
     */

    cell->spawning = 1;
    ngx_add_timer(&cell->timer, cell->timeout);

    return NGX_OK;
}


static void
ngx_http_hermes_cell_spawned(void *data, ngx_int_t rc,
    ngx_http_hermes_spawned_t *k, const char *err)
{
    ngx_http_hermes_cell_t *cell = data;

    ngx_connection_t  *c;

    c = cell->r ? cell->r->connection : NULL;

    cell->spawning = 0;

    if (cell->timer.timer_set) {
        ngx_del_timer(&cell->timer);
    }

    if (rc == NGX_DECLINED
        && cell->hlcf->backend->type == NGX_HTTP_HERMES_BACKEND_SSH
        && ++cell->spawn_tries < cell->hlcf->backend->hosts->nelts)
    {
        /* that host is down (and now skipped for a while): try another */

        ngx_log_error(NGX_LOG_WARN, cell->log, 0,
                      "hermes: %s; trying another host", err);
        ngx_http_hermes_registry_spawn_failed(cell->zone, &cell->ref);

        if (ngx_http_hermes_cell_spawn(cell) == NGX_OK) {
            goto done;
        }
    }

    if (rc != NGX_OK) {
        ngx_log_error(NGX_LOG_ERR, cell->log, 0,
                      "hermes: spawning a kernel for session \"%V\" failed: "
                      "%s", &cell->req.session, err);

        ngx_http_hermes_registry_release(cell->zone, &cell->ref,
                                         NGX_HTTP_HERMES_RELEASE_GONE, 0);

        if (rc == NGX_DECLINED) {
            ngx_http_hermes_cell_error(cell, NGX_HTTP_BAD_GATEWAY,
                                       "backend_unavailable",
                                       "the kernel host cannot be reached");
        } else {
            ngx_http_hermes_cell_error(cell, NGX_HTTP_BAD_GATEWAY,
                                       "spawn_failed",
                                       "could not start a kernel");
        }

        goto done;
    }

    if (ngx_http_hermes_registry_spawned(cell->zone, &cell->ref, k)
        != NGX_OK)
    {
        /* shut down while spawning */
        ngx_memcpy(cell->ref.dir, k->dir, k->dir_len + 1);
        cell->ref.dir_len = k->dir_len;
        cell->ref.pid = k->pid;
        cell->ref.start = k->start;
        cell->ref.ino = k->ino;
        cell->ref.uid = k->uid;
        ngx_http_hermes_cell_kill(cell);
        ngx_http_hermes_cell_error(cell, NGX_HTTP_BAD_GATEWAY, "spawn_failed",
                                   "the kernel was shut down while starting");
        goto done;
    }

    ngx_http_hermes_registry_observe(cell->zone, NGX_HTTP_HERMES_HIST_SPAWN,
                                     ngx_current_msec - cell->spawn_at);

    ngx_log_error(NGX_LOG_INFO, cell->log, 0,
                  "hermes: kernel %*s (pid %P) started for session \"%V\"",
                  (size_t) NGX_HTTP_HERMES_ID_LEN, cell->ref.kernel_id,
                  cell->ref.pid, &cell->req.session);

    ngx_http_hermes_cell_run(cell);

done:

    if (c) {
        ngx_http_run_posted_requests(c);
    }
}


static void
ngx_http_hermes_cell_run(ngx_http_hermes_cell_t *cell)
{
    u_char               name[64];
    ngx_buf_t           *b;
    ngx_int_t            rc;
    ngx_connection_t    *c;

    if (cell->hlcf->backend->type == NGX_HTTP_HERMES_BACKEND_SSH) {
        ngx_http_hermes_cell_run_relay(cell);
        return;
    }

    /* 1. the kernel: still its process and its directory */

    rc = ngx_http_hermes_cell_open_kernel(cell);

    if (rc == NGX_DECLINED && !cell->ref.spawn) {
        goto dead;
    }

    if (rc != NGX_OK) {
        goto ship_failed;
    }

    /* 2. watch cells/ (the directory verified) before anything appears */

    ngx_sprintf(name, "/proc/self/fd/%d%Z", cell->cells_fd);

    cell->wd = inotify_add_watch(ngx_http_hermes_inotify->fd,
                                 (char *) name, NGX_HTTP_HERMES_INOTIFY_MASK);

    if (cell->wd == -1) {
        ngx_log_error(NGX_LOG_ERR, cell->log, ngx_errno,
                      "hermes: inotify_add_watch(\"%s/cells\") failed",
                      cell->ref.dir);
        goto ship_failed;
    }

    /* 3. ship the cell, then wake the runner */

    b = ngx_http_hermes_json_cell_request(cell->pool, cell->ref.cell_id,
                                          &cell->req,
                                          cell->hlcf->max_output,
                                          cell->hlcf->max_stream);
    if (b == NULL) {
        goto ship_failed;
    }

    ngx_http_hermes_cell_name(cell, name, "cell_req");

    rc = ngx_http_hermes_local_write_at(cell->cells_fd, (char *) name,
                                        b->pos, b->last - b->pos,
                                        (ngx_uid_t) cell->ref.uid, cell->log);

    if (rc == NGX_DECLINED) {
        ngx_http_hermes_cell_disk_full(cell);
        return;
    }

    if (rc != NGX_OK) {
        goto ship_failed;
    }

    rc = ngx_http_hermes_local_wake(cell->dir_fd, cell->log);

    if (rc == NGX_DECLINED && !cell->ref.spawn) {
        goto dead;
    }

    if (rc != NGX_OK) {
        goto ship_failed;
    }

    cell->shipped = 1;

    /* 4. the pidfd reads ready when the kernel exits */

    c = cell->pidfd;
    c->data = cell;
    c->read->handler = ngx_http_hermes_cell_died_handler;
    c->read->log = cell->log;

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        goto ship_failed;
    }

    ngx_add_timer(&cell->timer, cell->timeout);

    if (cell->ctx) {
        ngx_memcpy(cell->ctx->kernel_id, cell->ref.kernel_id,
                   NGX_HTTP_HERMES_ID_LEN);
        cell->ctx->has_kernel = 1;
    }

    /* 5. the stream opens with the kernel line */

    if (ngx_http_hermes_cell_started(cell) != NGX_OK) {
        return;
    }

    ngx_http_hermes_cell_pump(cell);
    return;

dead:

    ngx_http_hermes_cell_respawn(cell);
    return;

ship_failed:

    ngx_http_hermes_cell_ship_failed(cell);
}


/*
 * Before a cell goes to a kernel, it must still be that kernel: the pid
 * alive and started when the kernel was (not a later process given the
 * pid), the directory the one made at spawn (a runner that exited removed
 * it, and a co-tenant may have made another by that name), ours and
 * owner-only.  NGX_DECLINED: it is not; NGX_ERROR: we cannot tell.
 */

static ngx_int_t
ngx_http_hermes_cell_open_kernel(ngx_http_hermes_cell_t *cell)
{
    int                fd;
    uint64_t           start;
    ngx_connection_t  *c;
    struct pollfd      pfd;
    ngx_file_info_t    fi;

    /* the pidfd first: then the start time says whose it is */

    fd = syscall(SYS_pidfd_open, cell->ref.pid, 0);
    if (fd == -1) {
        if (ngx_errno == ESRCH) {
            return NGX_DECLINED;
        }

        ngx_log_error(NGX_LOG_ERR, cell->log, ngx_errno,
                      "hermes: pidfd_open(%P) failed", cell->ref.pid);
        return NGX_ERROR;
    }

    c = ngx_get_connection(fd, cell->log);
    if (c == NULL) {
        close(fd);
        return NGX_ERROR;
    }

    cell->pidfd = c;

    if (ngx_http_hermes_local_proc_start(cell->ref.pid, &start) != NGX_OK
        || start != cell->ref.start)
    {
        ngx_log_error(NGX_LOG_WARN, cell->log, 0,
                      "hermes: pid %P is no longer kernel %*s",
                      cell->ref.pid, (size_t) NGX_HTTP_HERMES_ID_LEN,
                      cell->ref.kernel_id);
        return NGX_DECLINED;
    }

    pfd.fd = fd;
    pfd.events = POLLIN;
    pfd.revents = 0;

    if (poll(&pfd, 1, 0) != 0) {
        /* it has exited, and is not reaped yet */
        return NGX_DECLINED;
    }

    cell->dir_fd = open((char *) cell->ref.dir,
                        O_RDONLY|O_DIRECTORY|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC);

    if (cell->dir_fd == NGX_INVALID_FILE) {
        ngx_log_error(NGX_LOG_WARN, cell->log, ngx_errno,
                      "hermes: kernel %*s: open(\"%s\") failed",
                      (size_t) NGX_HTTP_HERMES_ID_LEN, cell->ref.kernel_id,
                      cell->ref.dir);
        return NGX_DECLINED;
    }

    if (ngx_fd_info(cell->dir_fd, &fi) == NGX_FILE_ERROR
        || (uint64_t) fi.st_ino != cell->ref.ino
        || ngx_http_hermes_cell_private_dir(&fi, cell->ref.uid) != NGX_OK)
    {
        ngx_log_error(NGX_LOG_WARN, cell->log, 0,
                      "hermes: \"%s\" is not the directory kernel %*s was "
                      "started in, or not owner-only any more",
                      cell->ref.dir, (size_t) NGX_HTTP_HERMES_ID_LEN,
                      cell->ref.kernel_id);
        return NGX_DECLINED;
    }

    cell->cells_fd = openat(cell->dir_fd, "cells",
                         O_RDONLY|O_DIRECTORY|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC);

    if (cell->cells_fd == NGX_INVALID_FILE
        || ngx_fd_info(cell->cells_fd, &fi) == NGX_FILE_ERROR
        || ngx_http_hermes_cell_private_dir(&fi, cell->ref.uid) != NGX_OK)
    {
        ngx_log_error(NGX_LOG_WARN, cell->log, 0,
                      "hermes: \"%s/cells\" is not an owner-only directory",
                      cell->ref.dir);
        return NGX_DECLINED;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_hermes_cell_private_dir(ngx_file_info_t *fi, uint32_t uid)
{
    if (!ngx_is_dir(fi) || fi->st_uid != uid
        || (fi->st_mode & 07777) != 0700)
    {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/* what a cell held of its kernel's host: fds, watch, pidfd */

static void
ngx_http_hermes_cell_close_kernel(ngx_http_hermes_cell_t *cell)
{
    if (cell->wd != -1) {
        (void) inotify_rm_watch(ngx_http_hermes_inotify->fd, cell->wd);
        cell->wd = -1;
    }

    if (cell->out_fd != NGX_INVALID_FILE) {
        close(cell->out_fd);
        cell->out_fd = NGX_INVALID_FILE;
    }

    if (cell->cells_fd != NGX_INVALID_FILE) {
        close(cell->cells_fd);
        cell->cells_fd = NGX_INVALID_FILE;
    }

    if (cell->dir_fd != NGX_INVALID_FILE) {
        close(cell->dir_fd);
        cell->dir_fd = NGX_INVALID_FILE;
    }

    if (cell->pidfd) {
        ngx_close_connection(cell->pidfd);
        cell->pidfd = NULL;
    }
}


/*
 * The cell request could not be written: the kernel host's disk is full.
 * The kernel is fine and keeps its state; the caller may try again.
 */

static void
ngx_http_hermes_cell_disk_full(ngx_http_hermes_cell_t *cell)
{
    ngx_log_error(NGX_LOG_ERR, cell->log, 0,
                  "hermes: the disk of kernel %*s is full, cell %uD of "
                  "session \"%V\" not run",
                  (size_t) NGX_HTTP_HERMES_ID_LEN, cell->ref.kernel_id,
                  cell->ref.cell_id, &cell->req.session);

    ngx_http_hermes_registry_release(cell->zone, &cell->ref,
                                     NGX_HTTP_HERMES_RELEASE_DONE,
                                     cell->ref.execution_count);

    ngx_http_hermes_cell_error(cell, NGX_HTTP_SERVICE_UNAVAILABLE,
                               "disk_full",
                               "the kernel host's disk is full; the kernel "
                               "and its state are kept");
}


/* the kernel line: the cell is on its kernel, the stream starts */

static ngx_int_t
ngx_http_hermes_cell_started(ngx_http_hermes_cell_t *cell)
{
    ngx_buf_t  *b;

    if (cell->ctx) {
        ngx_memcpy(cell->ctx->kernel_id, cell->ref.kernel_id,
                   NGX_HTTP_HERMES_ID_LEN);
        cell->ctx->has_kernel = 1;
    }

    if (cell->req.json_answer) {
        return NGX_OK;
    }

    if (ngx_http_hermes_cell_send_header(cell) != NGX_OK || cell->r == NULL) {
        return NGX_OK;
    }

    b = ngx_create_temp_buf(cell->r->pool, 512);
    if (b == NULL) {
        ngx_http_hermes_cell_fail(cell, NGX_HTTP_HERMES_CELL_ERROR,
                                  "out of memory");
        return NGX_ERROR;
    }

    b->last = ngx_sprintf(b->last,
                  "{\"type\":\"kernel\",\"session\":\"%V\","
                  "\"kernel_id\":\"%*s\",\"reused\":%s,"
                  "\"execution_count\":%uD,\"state_lost\":%s,"
                  "\"state_reset\":%s}\n",
                  &cell->req.session,
                  (size_t) NGX_HTTP_HERMES_ID_LEN, cell->ref.kernel_id,
                  cell->ref.reused ? "true" : "false",
                  cell->ref.execution_count + 1,
                  cell->ref.state_lost ? "true" : "false",
                  cell->req.reset ? "true" : "false");
    b->flush = 1;

    (void) ngx_http_hermes_cell_send(cell, b);

    return NGX_OK;
}


/* the kernel died between cells: a fresh one, state_lost */

static void
ngx_http_hermes_cell_respawn(ngx_http_hermes_cell_t *cell)
{
    ngx_int_t  rc;

    ngx_log_error(NGX_LOG_WARN, cell->log, 0,
                  "hermes: kernel %*s of session \"%V\" is gone, "
                  "starting a new one",
                  (size_t) NGX_HTTP_HERMES_ID_LEN, cell->ref.kernel_id,
                  &cell->req.session);

    ngx_http_hermes_cell_kill(cell);
    ngx_http_hermes_cell_close_kernel(cell);

    rc = ngx_http_hermes_registry_renew(cell->zone, &cell->ref,
                                        &cell->hlcf->backend->root);
    if (rc == NGX_OK) {
        rc = ngx_http_hermes_cell_spawn(cell);
    }

    if (rc != NGX_OK) {
        ngx_http_hermes_registry_release(cell->zone, &cell->ref,
                                         NGX_HTTP_HERMES_RELEASE_GONE, 0);
        ngx_http_hermes_cell_spawn_error(cell, rc);
    }
}


/* NGX_BUSY: the thread pool's queue is full, a moment later it may not be */

static void
ngx_http_hermes_cell_spawn_error(ngx_http_hermes_cell_t *cell, ngx_int_t rc)
{
    if (rc == NGX_BUSY) {
        ngx_log_error(NGX_LOG_WARN, cell->log, 0,
                      "hermes: the thread pool is full, no kernel for "
                      "session \"%V\" now", &cell->req.session);

        ngx_http_hermes_cell_error(cell, NGX_HTTP_SERVICE_UNAVAILABLE, "busy",
                                   "the gateway is busy starting kernels; "
                                   "retry shortly");
        return;
    }

    ngx_http_hermes_cell_error(cell, NGX_HTTP_BAD_GATEWAY, "spawn_failed",
                               "could not start a kernel");
}


/* the cell could not be handed over: the kernel is killed and evicted */

static void
ngx_http_hermes_cell_ship_failed(ngx_http_hermes_cell_t *cell)
{
    ngx_log_error(NGX_LOG_ERR, cell->log, 0,
                  "hermes: shipping cell %uD to kernel %*s failed",
                  cell->ref.cell_id, (size_t) NGX_HTTP_HERMES_ID_LEN,
                  cell->ref.kernel_id);

    ngx_http_hermes_cell_kill(cell);
    ngx_http_hermes_registry_release(cell->zone, &cell->ref,
                                     NGX_HTTP_HERMES_RELEASE_LOST, 0);

    if (!cell->header_sent) {
        ngx_http_hermes_cell_error(cell, NGX_HTTP_BAD_GATEWAY, "ship_failed",
                                   "could not ship the cell to its kernel");
        return;
    }

    cell->res.status = NGX_HTTP_HERMES_CELL_ERROR;
    ngx_str_set(&cell->res.error, "could not ship the cell to its kernel");
    ngx_http_hermes_cell_answer(cell);
}


/*
 * The ssh backend: the host's link ships the cell and writes what the
 * kernel-host agent sends into a socketpair read here: "\x1f\n" when the
 * cell is shipped, cell_out's event lines, then "\x1e" and the result.
 */

static void
ngx_http_hermes_cell_run_relay(ngx_http_hermes_cell_t *cell)
{
    int                     sv[2];
    ngx_int_t               rc;
    ngx_buf_t              *b;
    ngx_connection_t       *c;
    ngx_http_hermes_conn_t  conn;

    if (cell->relay) {
        /* the kernel was found dead and replaced: a new relay */
        ngx_close_connection(cell->relay);
        cell->relay = NULL;
    }

    cell->shipped = 0;
    cell->res_ready = 0;

    b = ngx_http_hermes_json_cell_request(cell->pool, cell->ref.cell_id,
                                          &cell->req,
                                          cell->hlcf->max_output,
                                          cell->hlcf->max_stream);
    if (b == NULL) {
        goto failed;
    }

    cell->rbuf = ngx_create_temp_buf(cell->pool, NGX_HTTP_HERMES_OUT_CHUNK);
    if (cell->rbuf == NULL) {
        goto failed;
    }

    if (socketpair(AF_UNIX, SOCK_STREAM|SOCK_CLOEXEC, 0, sv) == -1) {
        ngx_log_error(NGX_LOG_ERR, cell->log, ngx_errno,
                      "hermes: socketpair() failed");
        goto failed;
    }

    if (ngx_nonblocking(sv[0]) == -1) {
        close(sv[0]);
        close(sv[1]);
        goto failed;
    }

    c = ngx_get_connection(sv[0], cell->log);
    if (c == NULL) {
        close(sv[0]);
        close(sv[1]);
        goto failed;
    }

    c->data = cell;
    c->read->handler = ngx_http_hermes_cell_relay_handler;
    c->read->log = cell->log;
    cell->relay = c;

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        close(sv[1]);
        goto failed;
    }

    ngx_http_hermes_conn_take(&conn, cell->hlcf->backend, cell->ref.host);

    rc = ngx_http_hermes_ssh_relay(&conn, &cell->ref, cell->out_limit,
                                   6 * (off_t) cell->hlcf->max_output + 65536,
                                   cell->timeout, b->pos, b->last - b->pos,
                                   sv[1], cell->log);
    if (rc != NGX_OK) {
        ngx_http_hermes_conn_give(&conn);
        close(sv[1]);

        if (rc == NGX_BUSY) {
            /* nothing was shipped: the kernel is fine, as it was */
            ngx_log_error(NGX_LOG_WARN, cell->log, 0,
                          "hermes: the thread pool is full, cell %uD of "
                          "session \"%V\" not run", cell->ref.cell_id,
                          &cell->req.session);

            ngx_http_hermes_registry_release(cell->zone, &cell->ref,
                                             NGX_HTTP_HERMES_RELEASE_DONE,
                                             cell->ref.execution_count);
            ngx_http_hermes_cell_error(cell, NGX_HTTP_SERVICE_UNAVAILABLE,
                                       "busy", "the gateway is busy; retry "
                                       "shortly");
            return;
        }

        goto failed;
    }

    ngx_add_timer(&cell->timer, cell->timeout);

    return;

failed:

    ngx_http_hermes_cell_ship_failed(cell);
}


static void
ngx_http_hermes_cell_relay_handler(ngx_event_t *ev)
{
    ngx_connection_t        *rc = ev->data;
    ngx_http_hermes_cell_t  *cell = rc->data;

    u_char            *p, *nl, *m;
    size_t             size, limit;
    ssize_t            n;
    ngx_buf_t         *b, *nb;
    ngx_connection_t  *c;

    c = cell->r ? cell->r->connection : NULL;
    b = cell->rbuf;

    /* a line of cell_out (the relay bounds it by out_limit), or a result */
    limit = ngx_max(6 * cell->hlcf->max_output + 65536,
                    (size_t) cell->out_limit)
            + 2 * NGX_HTTP_HERMES_OUT_CHUNK;

    for ( ;; ) {

        if (cell->busy && cell->shipped && !cell->res_ready) {
            /* the client is slow: the relay waits, the write handler
             * reads on */
            cell->paused = 1;
            goto done;
        }

        if (b->last == b->end) {
            /* a result or a line bigger than the buffer: grow it */

            size = 2 * (b->end - b->start);

            if (size > limit) {
                ngx_http_hermes_cell_fail(cell, NGX_HTTP_HERMES_CELL_ERROR,
                                          "the kernel wrote an unreadable "
                                          "result");
                goto done;
            }

            nb = ngx_create_temp_buf(cell->pool, size);
            if (nb == NULL) {
                ngx_http_hermes_cell_fail(cell, NGX_HTTP_HERMES_CELL_ERROR,
                                          "out of memory");
                goto done;
            }

            nb->last = ngx_cpymem(nb->pos, b->pos, b->last - b->pos);
            cell->rbuf = nb;
            b = nb;
        }

        n = recv(rc->fd, b->last, b->end - b->last, 0);

        if (n == -1) {
            if (ngx_socket_errno == NGX_EAGAIN) {
                break;
            }

            if (ngx_socket_errno == NGX_EINTR) {
                continue;
            }

            n = 0;
        }

        if (n == 0) {
            ngx_http_hermes_cell_relay_end(cell);
            goto done;
        }

        b->last += n;

        /* "\x1f\n": shipped, the stream starts */

        if (!cell->shipped && b->last - b->pos >= 2 && b->pos[0] == '\x1f') {
            b->pos += 2;
            cell->shipped = 1;

            if (ngx_http_hermes_cell_started(cell) != NGX_OK) {
                goto done;
            }
        }

        if (!cell->shipped || cell->res_ready) {
            continue;
        }

        /* forward whole event lines, up to the result's marker */

        m = ngx_strlchr(b->pos, b->last, '\x1e');

        if (m) {
            nl = m;
            cell->res_ready = 1;

        } else {
            for (nl = b->last; nl > b->pos && nl[-1] != '\n'; nl--) {
                /* void */
            }
        }

        if (nl > b->pos) {
            ngx_http_hermes_cell_keep(cell, b->pos, nl - b->pos);

            if (cell->r && !cell->req.json_answer) {
                ngx_http_hermes_cell_forward(cell, b->pos, nl - b->pos);
            }

            b->pos = nl;
        }

        /* keep the buffer's head free for what follows, the result too */

        if (b->pos > b->start) {
            p = b->pos;
            b->pos = b->start;
            b->last = ngx_movemem(b->start, p, b->last - p);
        }
    }

    if (ngx_handle_read_event(ev, 0) != NGX_OK) {
        ngx_http_hermes_cell_fail(cell, NGX_HTTP_HERMES_CELL_ERROR,
                                  "the relay failed");
    }

done:

    if (c) {
        ngx_http_run_posted_requests(c);
    }
}


/*
 * The relay closed: a result, its word on a cell it did not ship (a dead
 * kernel, a full disk, another failure), or a broken connection.
 */

static void
ngx_http_hermes_cell_relay_end(ngx_http_hermes_cell_t *cell)
{
    u_char     *p;
    size_t      n;
    ngx_buf_t  *b;

    static u_char  dead[] = "\x1e{\"relay\":\"dead\"}";
    static u_char  full[] = "\x1e{\"relay\":\"full\"}";

    b = cell->rbuf;
    n = b->last - b->pos;

    if (!cell->res_ready) {
        if (!cell->shipped) {
            if (n == sizeof(dead) - 1
                && ngx_strncmp(b->pos, dead, n) == 0
                && !cell->ref.spawn)
            {
                ngx_http_hermes_cell_respawn(cell);
                return;
            }

            if (n == sizeof(full) - 1 && ngx_strncmp(b->pos, full, n) == 0) {
                ngx_http_hermes_cell_disk_full(cell);
                return;
            }

            if (n) {
                ngx_log_error(NGX_LOG_ERR, cell->log, 0,
                              "hermes: the relay of cell %uD said: \"%*s\"",
                              cell->ref.cell_id, ngx_min(n - 1, 256),
                              b->pos + 1);
            }

            ngx_http_hermes_cell_ship_failed(cell);
            return;
        }

        ngx_http_hermes_cell_fail(cell, NGX_HTTP_HERMES_CELL_ERROR,
                                  "the connection to the kernel host broke "
                                  "during the cell");
        return;
    }

    /* b->pos is at the marker */

    p = b->pos + 1;
    n = b->last - p;

    if (ngx_strlcasestrn(p, p + ngx_min(n, 20), (u_char *) "\"relay\"", 6)) {

        /* the relay's own word: the host stayed unreachable */

        if (ngx_http_hermes_json_parse_result(cell->pool, p, n, &cell->res)
            == NGX_OK
            && cell->res.error.len)
        {
            ngx_http_hermes_cell_fail(cell, NGX_HTTP_HERMES_CELL_ERROR,
                                      (char *) cell->res.error.data);
            return;
        }

        ngx_log_error(NGX_LOG_WARN, cell->log, 0,
                      "hermes: kernel %*s of session \"%V\" died during "
                      "cell %uD", (size_t) NGX_HTTP_HERMES_ID_LEN,
                      cell->ref.kernel_id, &cell->req.session,
                      cell->ref.cell_id);

        ngx_http_hermes_cell_fail(cell, NGX_HTTP_HERMES_CELL_ERROR,
                                  "the kernel died while running the cell; "
                                  "its state is lost");
        return;
    }

    ngx_http_hermes_cell_result(cell, p, n);
}


/* copy event lines into the request's buffers and send them */

static void
ngx_http_hermes_cell_forward(ngx_http_hermes_cell_t *cell, u_char *p,
    size_t n)
{
    size_t        k;
    ngx_buf_t    *b;
    ngx_chain_t  *cl, *out, **ll;

    if (cell->out_sent + n > (size_t) cell->out_limit) {
        /* the module's own bound on a cell's stream */
        cell->res.stream_truncated = 1;
        return;
    }

    cell->out_sent += n;

    out = NULL;
    ll = &out;

    while (n) {
        cl = ngx_chain_get_free_buf(cell->r->pool, &cell->free);
        if (cl == NULL) {
            return;
        }

        b = cl->buf;

        if (b->start == NULL) {
            b->start = ngx_palloc(cell->r->pool, NGX_HTTP_HERMES_OUT_CHUNK);
            if (b->start == NULL) {
                return;
            }

            b->end = b->start + NGX_HTTP_HERMES_OUT_CHUNK;
            b->tag = (ngx_buf_tag_t) &ngx_http_hermes_module;
            b->temporary = 1;
        }

        k = ngx_min(n, (size_t) (b->end - b->start));

        b->pos = b->start;
        b->last = ngx_cpymem(b->start, p, k);
        b->flush = 0;

        p += k;
        n -= k;

        *ll = cl;
        ll = &cl->next;
    }

    *ll = NULL;

    if (out == NULL) {
        return;
    }

    for (cl = out; cl->next; cl = cl->next) { /* void */ }
    cl->buf->flush = 1;

    (void) ngx_http_hermes_cell_send_chain(cell, out);
}



static void
ngx_http_hermes_inotify_handler(ngx_event_t *ev)
{
    ssize_t                  n;
    u_char                  *p, res[32];
    ngx_queue_t             *q;
    ngx_connection_t        *c;
    ngx_http_hermes_cell_t  *cell;
    struct inotify_event    *e;
    u_char                   buf[4096]
                    __attribute__ ((aligned(__alignof__(struct inotify_event))));

    c = ev->data;

    for ( ;; ) {
        n = read(c->fd, buf, sizeof(buf));

        if (n == -1) {
            if (ngx_errno == NGX_EAGAIN) {
                break;
            }

            if (ngx_errno == NGX_EINTR) {
                continue;
            }

            ngx_log_error(NGX_LOG_ALERT, ev->log, ngx_errno,
                          "hermes: inotify read() failed");
            break;
        }

        for (p = buf; p < buf + n; p += sizeof(struct inotify_event) + e->len) {
            e = (struct inotify_event *) p;

            if (e->mask & IN_Q_OVERFLOW) {
                /* events were lost (a cell can make many): look at all */
                ngx_http_hermes_inotify_overflow(ev->log);
                continue;
            }

            for (q = ngx_queue_head(&ngx_http_hermes_cells);
                 q != ngx_queue_sentinel(&ngx_http_hermes_cells);
                 q = ngx_queue_next(q))
            {
                cell = ngx_queue_data(q, ngx_http_hermes_cell_t, queue);

                if (cell->wd != e->wd || !cell->shipped) {
                    continue;
                }

                if (e->mask & IN_MOVED_TO) {
                    ngx_sprintf(res, "cell_res_%06uD.json%Z",
                                cell->ref.cell_id);

                    if (e->len && ngx_strcmp(e->name, res) == 0) {
                        cell->res_ready = 1;
                    }
                }

                ngx_http_hermes_cell_pump(cell);
                break;
            }
        }
    }

    if (ngx_handle_read_event(ev, 0) != NGX_OK) {
        ngx_log_error(NGX_LOG_ALERT, ev->log, 0,
                      "hermes: inotify event failed");
    }
}


static void
ngx_http_hermes_inotify_overflow(ngx_log_t *log)
{
    ngx_queue_t             *q, *next;
    ngx_http_hermes_cell_t  *cell;

    ngx_log_error(NGX_LOG_WARN, log, 0,
                  "hermes: inotify queue overflow, checking every cell");

    for (q = ngx_queue_head(&ngx_http_hermes_cells);
         q != ngx_queue_sentinel(&ngx_http_hermes_cells);
         q = next)
    {
        /* a pump may end its own cell, no other */
        next = ngx_queue_next(q);
        cell = ngx_queue_data(q, ngx_http_hermes_cell_t, queue);

        if (cell->shipped && cell->wd != -1 && !cell->draining) {
            cell->res_ready = 1;
            ngx_http_hermes_cell_pump(cell);
        }
    }
}


static void
ngx_http_hermes_cell_pump(ngx_http_hermes_cell_t *cell)
{
    ngx_int_t          rc;
    ngx_connection_t  *c;

    c = cell->r ? cell->r->connection : NULL;

    if (cell->r && !cell->req.json_answer) {
        rc = ngx_http_hermes_cell_read_out(cell, 0);

        if (rc == NGX_ERROR) {
            ngx_http_hermes_cell_fail(cell, NGX_HTTP_HERMES_CELL_ERROR,
                                      "reading the cell's output failed");
            goto done;
        }
    }

    if (cell->res_ready) {
        ngx_http_hermes_cell_finish(cell);
    }

done:

    if (c) {
        ngx_http_run_posted_requests(c);
    }
}


/*
 * Forward the complete event lines the runner appended to cell_out_N;
 * a partial line is read again next time.  "all" drains to the end.
 * Reads stop while the client has not taken what was sent (NGX_AGAIN:
 * the write handler comes back), and for good at out_limit, whatever
 * the cell made of its file (a 300 MB sparse one, say).
 */

static ngx_int_t
ngx_http_hermes_cell_read_out(ngx_http_hermes_cell_t *cell, ngx_uint_t all)
{
    u_char               name[64], *nl;
    size_t               size;
    ssize_t              n;
    ngx_buf_t           *b;
    ngx_chain_t         *cl, *out, **ll;
    ngx_http_request_t  *r;

    r = cell->r;

    if (cell->out_fd == NGX_INVALID_FILE) {
        ngx_http_hermes_cell_name(cell, name, "cell_out");

        cell->out_fd = ngx_http_hermes_local_open_at(cell->cells_fd,
                                                     (char *) name, NULL);

        if (cell->out_fd == NGX_INVALID_FILE) {
            if (ngx_errno == NGX_ENOENT) {
                return NGX_OK;
            }

            ngx_log_error(NGX_LOG_ERR, cell->log, ngx_errno,
                          "hermes: kernel %*s: \"%s\" is not a regular file "
                          "the module can read", (size_t) NGX_HTTP_HERMES_ID_LEN,
                          cell->ref.kernel_id, name);
            return NGX_ERROR;
        }
    }

    out = NULL;
    ll = &out;

    while (cell->busy == NULL && cell->out_off < cell->out_limit) {

        /* what nginx sends must live as long as the request, not the cell */

        cl = ngx_chain_get_free_buf(r->pool, &cell->free);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        b = cl->buf;

        if (b->start == NULL) {
            b->start = ngx_palloc(r->pool, NGX_HTTP_HERMES_OUT_CHUNK);
            if (b->start == NULL) {
                return NGX_ERROR;
            }

            b->end = b->start + NGX_HTTP_HERMES_OUT_CHUNK;
            b->tag = (ngx_buf_tag_t) &ngx_http_hermes_module;
            b->temporary = 1;
        }

        b->pos = b->start;
        b->last = b->start;
        b->flush = 0;

        size = ngx_min((off_t) (b->end - b->start),
                       cell->out_limit - cell->out_off);

        n = pread(cell->out_fd, b->start, size, cell->out_off);

        if (n == -1) {
            return NGX_ERROR;
        }

        nl = (n > 0) ? ngx_strlchr(b->start, b->start + n, '\n') : NULL;

        if (nl) {
            /* up to the last newline */
            for (nl = b->start + n - 1; *nl != '\n'; nl--) { /* void */ }
            nl++;

        } else if (n == (ssize_t) size || (all && n > 0)) {
            /* a line longer than a chunk, or the unterminated tail */
            nl = b->start + n;

        } else {
            /* nothing complete yet: give the buffer back */
            cl->next = cell->free;
            cell->free = cl;
            break;
        }

        b->last = nl;
        cell->out_off += nl - b->start;
        cell->mid_line = (nl[-1] != '\n');

        *ll = cl;
        ll = &cl->next;
        *ll = NULL;

        /* one chunk at a time: the client sets the pace */

        b->flush = 1;

        if (ngx_http_hermes_cell_send_chain(cell, out) == NGX_ERROR) {
            return NGX_OK;
        }

        out = NULL;
        ll = &out;

        if (n < (ssize_t) size && nl == b->start + n && !all) {
            break;
        }
    }

    if (cell->out_off >= cell->out_limit) {
        ngx_http_hermes_cell_end_line(cell);

        if (!cell->res.stream_truncated) {
            ngx_log_error(NGX_LOG_WARN, cell->log, 0,
                          "hermes: cell %uD of kernel %*s wrote more than "
                          "%O bytes of output events, the rest is not read",
                          cell->ref.cell_id, (size_t) NGX_HTTP_HERMES_ID_LEN,
                          cell->ref.kernel_id, cell->out_limit);
        }

        cell->res.stream_truncated = 1;
        return NGX_OK;
    }

    return cell->busy ? NGX_AGAIN : NGX_OK;
}


/* the result is there: read it (bounded), end the turn, then answer */

static void
ngx_http_hermes_cell_finish(ngx_http_hermes_cell_t *cell)
{
    u_char    name[64], *data;
    off_t     size;
    ssize_t   n;
    ngx_fd_t  fd;

    if (cell->draining) {
        ngx_http_hermes_cell_drain(cell);
        return;
    }

    ngx_http_hermes_cell_name(cell, name, "cell_res");

    fd = ngx_http_hermes_local_open_at(cell->cells_fd, (char *) name, &size);

    if (fd == NGX_INVALID_FILE) {
        if (ngx_errno == NGX_ENOENT) {
            cell->res_ready = 0;
            return;
        }

        goto unreadable;
    }

    if (size > (off_t) (6 * cell->hlcf->max_output + 65536)) {
        close(fd);
        goto unreadable;
    }

    data = ngx_pnalloc(cell->pool, size + 1);
    if (data == NULL) {
        close(fd);
        goto unreadable;
    }

    n = pread(fd, data, size, 0);
    close(fd);

    if (n != size) {
        goto unreadable;
    }

    ngx_http_hermes_cell_result(cell, data, n);
    return;

unreadable:

    ngx_log_error(NGX_LOG_ERR, cell->log, ngx_errno,
                  "hermes: kernel %*s: unreadable result \"%s\" (not a "
                  "regular file, or too big)",
                  (size_t) NGX_HTTP_HERMES_ID_LEN, cell->ref.kernel_id, name);

    ngx_http_hermes_cell_fail(cell, NGX_HTTP_HERMES_CELL_ERROR,
                              "the kernel wrote an unreadable result");
}


/* the runner's result, whichever way it came: end the turn, answer */

static void
ngx_http_hermes_cell_result(ngx_http_hermes_cell_t *cell, u_char *data,
    size_t n)
{
    ngx_uint_t  truncated;

    truncated = cell->res.stream_truncated;

    if (ngx_http_hermes_json_parse_result(cell->pool, data, n, &cell->res)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, cell->log, 0,
                      "hermes: unreadable result of cell %uD of kernel %*s",
                      cell->ref.cell_id, (size_t) NGX_HTTP_HERMES_ID_LEN,
                      cell->ref.kernel_id);

        ngx_http_hermes_cell_fail(cell, NGX_HTTP_HERMES_CELL_ERROR,
                                  "the kernel wrote an unreadable result");
        return;
    }

    if (truncated) {
        cell->res.stream_truncated = 1;
    }

    if (cell->interrupting
        && cell->res.status == NGX_HTTP_HERMES_CELL_INTERRUPTED)
    {
        /* our timeout's interrupt: the kernel lives on, with its state */
        cell->res.status = NGX_HTTP_HERMES_CELL_TIMEOUT;
        cell->res.error.data = ngx_pnalloc(cell->pool, 128);

        if (cell->res.error.data) {
            cell->res.error.len = ngx_sprintf(cell->res.error.data,
                                      "the cell did not finish within %M s "
                                      "and was interrupted; the kernel and "
                                      "its state are kept",
                                      cell->timeout / 1000)
                                  - cell->res.error.data;
        }
    }

    if (cell->res.ended) {
        /* SystemExit: the runner exits by itself; remove its directory */
        ngx_http_hermes_cell_kill(cell);
        ngx_http_hermes_registry_release(cell->zone, &cell->ref,
                                         NGX_HTTP_HERMES_RELEASE_GONE, 0);

    } else {
        ngx_http_hermes_registry_release(cell->zone, &cell->ref,
                                         NGX_HTTP_HERMES_RELEASE_DONE,
                                         cell->res.execution_count);
    }

    /*
     * The kernel is free for the next cell; what is left of the output
     * goes to the client at its own pace, then the result line.
     */

    if (cell->timer.timer_set) {
        ngx_del_timer(&cell->timer);
    }

    if (cell->pidfd) {
        ngx_close_connection(cell->pidfd);
        cell->pidfd = NULL;
    }

    if (cell->wd != -1) {
        (void) inotify_rm_watch(ngx_http_hermes_inotify->fd, cell->wd);
        cell->wd = -1;
    }

    cell->draining = 1;

    ngx_http_hermes_cell_drain(cell);
}


static void
ngx_http_hermes_cell_drain(ngx_http_hermes_cell_t *cell)
{
    ngx_int_t  rc;

    if (cell->r && !cell->req.json_answer && cell->relay == NULL) {
        rc = ngx_http_hermes_cell_read_out(cell, 1);

        if (rc == NGX_AGAIN) {
            return;
        }

        if (rc == NGX_ERROR) {
            cell->res.stream_truncated = 1;
        }

        ngx_http_hermes_cell_end_line(cell);
    }

    ngx_http_hermes_cell_answer(cell);
}


/* the result line starts a line of its own, whatever the cell's output */

static void
ngx_http_hermes_cell_end_line(ngx_http_hermes_cell_t *cell)
{
    ngx_buf_t  *b;

    if (!cell->mid_line || cell->r == NULL) {
        return;
    }

    b = ngx_calloc_buf(cell->r->pool);
    if (b == NULL) {
        return;
    }

    b->pos = (u_char *) "\n";
    b->last = b->pos + 1;
    b->memory = 1;
    b->flush = 1;

    cell->mid_line = 0;

    (void) ngx_http_hermes_cell_send(cell, b);
}


/* the kernel is lost mid-cell: kill it, answer with "message" */

static void
ngx_http_hermes_cell_fail(ngx_http_hermes_cell_t *cell, ngx_uint_t status,
    char *message)
{
    ngx_http_hermes_cell_kill(cell);
    ngx_http_hermes_registry_release(cell->zone, &cell->ref,
                                     NGX_HTTP_HERMES_RELEASE_LOST, 0);

    ngx_memzero(&cell->res, sizeof(ngx_http_hermes_result_t));
    cell->res.status = status;
    cell->res.error.data = (u_char *) message;
    cell->res.error.len = ngx_strlen(message);
    /* the cell counted: its number is the kernel line's */
    cell->res.execution_count = cell->ref.execution_count
                                + (cell->shipped ? 1 : 0);

    ngx_http_hermes_cell_salvage(cell);
    cell->res.ended = 1;                /* the kernel is gone */

    ngx_http_hermes_cell_answer(cell);
}


/* ssh: keep the head and the tail of the event lines the relay brings */

static void
ngx_http_hermes_cell_keep(ngx_http_hermes_cell_t *cell, u_char *p, size_t n)
{
    size_t   hsize, tsize, k, drop;
    u_char  *tail;

    hsize = NGX_HTTP_HERMES_KEEP_HEAD(cell->hlcf->max_output);
    tsize = NGX_HTTP_HERMES_KEEP_TAIL(cell->hlcf->max_output);

    if (cell->keep == NULL) {
        cell->keep = ngx_pnalloc(cell->pool, hsize + tsize);
        if (cell->keep == NULL) {
            return;
        }
    }

    cell->keep_total += n;

    if (cell->keep_head < hsize) {
        k = ngx_min(n, hsize - cell->keep_head);
        ngx_memcpy(cell->keep + cell->keep_head, p, k);
        cell->keep_head += k;
        p += k;
        n -= k;
    }

    if (n == 0) {
        return;
    }

    tail = cell->keep + hsize;

    if (n >= tsize) {
        ngx_memcpy(tail, p + n - tsize, tsize);
        cell->keep_tail = tsize;
        return;
    }

    if (cell->keep_tail + n > tsize) {
        drop = cell->keep_tail + n - tsize;
        ngx_memmove(tail, tail + drop, cell->keep_tail - drop);
        cell->keep_tail -= drop;
    }

    ngx_memcpy(tail + cell->keep_tail, p, n);
    cell->keep_tail += n;
}


/*
 * The kernel is gone without a result, but what the cell printed is in
 * cell_out: its head and tail (bounded windows of the file) make the
 * output the runner would have given, 40% head and 60% tail of
 * max_output.  Local kernels; over ssh the relay's copy is gone.
 */

static void
ngx_http_hermes_cell_salvage(ngx_http_hermes_cell_t *cell)
{
    off_t       size, toff;
    u_char      name[64], *data;
    size_t      max, hsize, tlen;
    ngx_fd_t    fd;
    ngx_uint_t  gap;

    if (!cell->shipped) {
        return;
    }

    max = cell->hlcf->max_output;

    if (cell->relay) {
        /* ssh: what the relay brought, kept as it went by */

        if (cell->keep == NULL) {
            return;
        }

        data = cell->keep;
        hsize = cell->keep_head;
        tlen = cell->keep_tail;
        gap = (cell->keep_total > cell->keep_head + cell->keep_tail);

        if (tlen) {
            data = ngx_pnalloc(cell->pool, hsize + tlen);
            if (data == NULL) {
                return;
            }

            ngx_memcpy(data, cell->keep, hsize);
            ngx_memcpy(data + hsize, cell->keep + NGX_HTTP_HERMES_KEEP_HEAD(max),
                       tlen);
        }

        ngx_http_hermes_cell_salvage_windows(cell, data, hsize, tlen, gap);
        return;
    }

    if (cell->cells_fd == NGX_INVALID_FILE) {
        return;
    }

    ngx_http_hermes_cell_name(cell, name, "cell_out");

    fd = ngx_http_hermes_local_open_at(cell->cells_fd, (char *) name, &size);
    if (fd == NGX_INVALID_FILE) {
        return;
    }

    /* escaping makes at most 6 bytes of a text byte: windows to match */

    hsize = (size_t) ngx_min(size, (off_t) NGX_HTTP_HERMES_KEEP_HEAD(max));
    toff = ngx_max((off_t) hsize,
                   size - (off_t) NGX_HTTP_HERMES_KEEP_TAIL(max));
    tlen = (size_t) (size - toff);
    gap = (toff > (off_t) hsize);

    data = ngx_pnalloc(cell->pool, hsize + tlen);

    if (data == NULL
        || pread(fd, data, hsize, 0) != (ssize_t) hsize
        || pread(fd, data + hsize, tlen, toff) != (ssize_t) tlen)
    {
        close(fd);
        return;
    }

    close(fd);

    ngx_http_hermes_cell_salvage_windows(cell, data, hsize, tlen, gap);
}


/* the output from windows of event lines: head, then tail (gap: apart) */

static void
ngx_http_hermes_cell_salvage_windows(ngx_http_hermes_cell_t *cell,
    u_char *data, size_t hsize, size_t tlen, ngx_uint_t gap)
{
    u_char     *p, *q, *last, *o;
    size_t      max, h, t, len, cap;
    ngx_buf_t   out, err;

    max = cell->hlcf->max_output;

    cap = hsize + tlen;             /* a text is never longer than its JSON */
    o = ngx_pnalloc(cell->pool, 2 * cap);
    if (o == NULL) {
        return;
    }

    out.start = o;
    out.pos = out.start;
    out.last = out.start;
    out.end = out.start + cap;
    err.start = out.end;
    err.pos = err.start;
    err.last = err.start;
    err.end = err.start + cap;

    /* whole lines: the head window's, then the tail window's, which
     * starts mid-line */

    last = data + hsize + tlen;

    if (!gap) {
        ngx_http_hermes_cell_events(data, last, &out, &err);

    } else {
        ngx_http_hermes_cell_events(data, data + hsize, &out, &err);

        p = ngx_strlchr(data + hsize, last, '\n');
        if (p) {
            ngx_http_hermes_cell_events(p + 1, last, &out, &err);
        }
    }

    /* stdout, the stderr mark, stderr: as the runner puts them */

    len = (out.last - out.pos)
          + (err.last > err.pos ? sizeof("\n--- stderr ---\n") - 1
                                  + (err.last - err.pos) : 0);

    o = ngx_pnalloc(cell->pool, len + max + 128);
    if (o == NULL) {
        return;
    }

    p = ngx_cpymem(o, out.pos, out.last - out.pos);

    if (err.last > err.pos) {
        p = ngx_cpymem(p, "\n--- stderr ---\n",
                       sizeof("\n--- stderr ---\n") - 1);
        p = ngx_cpymem(p, err.pos, err.last - err.pos);
    }

    cell->res.stdout_bytes_total = out.last - out.pos;
    cell->res.output.data = o;
    cell->res.output.len = len;

    if (!gap && len <= max) {
        return;
    }

    /* 40% head, 60% tail, cut between characters, never inside one */

    h = ngx_min(max * 2 / 5, len);
    while (h && h < len && (o[h] & 0xc0) == 0x80) {
        h--;
    }

    t = (len > max - max * 2 / 5) ? len - (max - max * 2 / 5) : 0;
    t = ngx_max(t, h);
    while (t < len && (o[t] & 0xc0) == 0x80) {
        t++;
    }

    q = o + len;                    /* the room after it, for the answer */

    p = ngx_cpymem(q, o, h);

    if (gap) {
        p = ngx_cpymem(p, "\n... [output truncated] ...\n",
                       sizeof("\n... [output truncated] ...\n") - 1);

    } else {
        p = ngx_sprintf(p, "\n... [output truncated: %uz bytes omitted] ...\n",
                        t - h);
    }

    p = ngx_cpymem(p, o + t, len - t);

    cell->res.output.data = q;
    cell->res.output.len = p - q;
    cell->res.stdout_truncated = 1;
}


static void
ngx_http_hermes_cell_events(u_char *p, u_char *last, ngx_buf_t *out,
    ngx_buf_t *err)
{
    u_char  *nl;

    while ((nl = ngx_strlchr(p, last, '\n')) != NULL) {
        ngx_http_hermes_json_event_text(p, nl - p, out, err);
        p = nl + 1;
    }
}


static void
ngx_http_hermes_cell_answer(ngx_http_hermes_cell_t *cell)
{
    ngx_int_t            rc;
    ngx_buf_t           *b;
    ngx_http_request_t  *r;

    cell->res.duration = ngx_current_msec - cell->turn;
    cell->res.queue = cell->turn - cell->started;

    ngx_http_hermes_count(cell->zone, cells_total[cell->res.status]);
    ngx_http_hermes_registry_observe(cell->zone, NGX_HTTP_HERMES_HIST_CELL,
                                     cell->res.duration);

    if (cell->ctx) {
        cell->ctx->cell_status = cell->res.status;
        cell->ctx->cell_ms = cell->res.duration;
        cell->ctx->state_lost = cell->ref.state_lost;
    }

    r = cell->r;

    if (r == NULL) {
        ngx_http_hermes_cell_end(cell);
        return;
    }

    b = ngx_http_hermes_json_result(r->pool, &cell->res, &cell->ref,
                                    &cell->req, !cell->req.json_answer,
                                    cell->req.json_answer
                                    && cell->req.tool_call);
    if (b == NULL) {
        ngx_http_finalize_request(r, NGX_ERROR);
        ngx_http_hermes_cell_end(cell);
        return;
    }

    if (cell->req.json_answer) {
        r->headers_out.content_length_n = b->last - b->pos;
    }

    if (ngx_http_hermes_cell_send_header(cell) != NGX_OK) {
        ngx_http_hermes_cell_end(cell);
        return;
    }

    b->last_buf = 1;
    b->last_in_chain = 1;

    rc = ngx_http_hermes_cell_send(cell, b);

    /* the request may have gone with an error; if not, it ends here */

    if (cell->r) {
        ngx_http_finalize_request(cell->r, rc);
    }

    ngx_http_hermes_cell_end(cell);
}


static void
ngx_http_hermes_cell_timeout_handler(ngx_event_t *ev)
{
    ngx_http_hermes_cell_t *cell = ev->data;

    u_char            *msg;
    ngx_connection_t  *c;

    if (cell->spawning) {
        /* the spawn is bounded by its own command timeouts: wait for it */
        ngx_add_timer(&cell->timer, 1000);
        return;
    }

    if (cell->paused && cell->r) {
        /*
         * An ssh relay waits for a slow client: the cell may be over on
         * its host.  The client's send_timeout bounds this; then the
         * relay is read on without it.
         */
        ngx_add_timer(&cell->timer, 1000);
        return;
    }

    c = cell->r ? cell->r->connection : NULL;

    /* first a KeyboardInterrupt: the kernel and its state may live on */

    if (!cell->interrupting && cell->hlcf->cell_grace
        && ngx_http_hermes_cell_interrupt(cell) == NGX_OK)
    {
        ngx_log_error(NGX_LOG_WARN, cell->log, 0,
                      "hermes: cell %uD of session \"%V\" timed out after "
                      "%M ms, interrupting it (kernel %*s)", cell->ref.cell_id,
                      &cell->req.session, cell->timeout,
                      (size_t) NGX_HTTP_HERMES_ID_LEN, cell->ref.kernel_id);

        cell->interrupting = 1;
        ngx_add_timer(&cell->timer, cell->hlcf->cell_grace);
        return;
    }

    ngx_log_error(NGX_LOG_WARN, cell->log, 0,
                  "hermes: cell %uD of session \"%V\" timed out after %M ms%s, "
                  "killing kernel %*s", cell->ref.cell_id, &cell->req.session,
                  cell->timeout,
                  cell->interrupting ? " and did not stop when interrupted"
                                     : "",
                  (size_t) NGX_HTTP_HERMES_ID_LEN, cell->ref.kernel_id);

    ngx_http_hermes_count(cell->zone, killed_timeout_total);

    msg = ngx_pnalloc(cell->pool, 192);
    if (msg) {
        ngx_sprintf(msg, "the cell did not finish within %M s%s; its kernel "
                    "was killed and its state is lost%Z",
                    cell->timeout / 1000,
                    cell->interrupting ? " and did not stop when interrupted"
                                       : "");
    }

    ngx_http_hermes_cell_fail(cell, NGX_HTTP_HERMES_CELL_TIMEOUT,
                              msg ? (char *) msg : "timeout");

    if (c) {
        ngx_http_run_posted_requests(c);
    }
}


/*
 * "N\n" into the kernel's intr FIFO: the runner raises KeyboardInterrupt
 * in cell N if it still runs.  The runner may be in a sandbox of its own,
 * where no signal of ours reaches it.
 */

static ngx_int_t
ngx_http_hermes_cell_interrupt(ngx_http_hermes_cell_t *cell)
{
    ngx_http_hermes_victim_t  v;

    if (!cell->shipped) {
        return NGX_DECLINED;
    }

    if (cell->dir_fd != NGX_INVALID_FILE) {
        return ngx_http_hermes_local_interrupt(cell->dir_fd,
                                               cell->ref.cell_id, cell->log);
    }

    /* ssh: a command on the kernel's host, in the thread pool */

    ngx_http_hermes_cell_victim(cell, &v);

    return (ngx_http_hermes_kernel_interrupt(cell->hlcf->thread_pool, &v,
                                             cell->ref.cell_id, cell->log)
            == NGX_OK) ? NGX_OK : NGX_DECLINED;
}


static void
ngx_http_hermes_cell_died_handler(ngx_event_t *ev)
{
    ngx_connection_t        *pc = ev->data;
    ngx_http_hermes_cell_t  *cell = pc->data;

    u_char             name[64];
    ngx_connection_t  *c;
    ngx_file_info_t    fi;

    c = cell->r ? cell->r->connection : NULL;

    /* SystemExit writes its result, then exits: prefer the result */

    ngx_http_hermes_cell_name(cell, name, "cell_res");

    if (fstatat(cell->cells_fd, (char *) name, &fi, AT_SYMLINK_NOFOLLOW)
        == 0)
    {
        cell->res_ready = 1;
        ngx_http_hermes_cell_pump(cell);
        return;
    }

    /* no result: the kernel died mid-cell */

    ngx_log_error(NGX_LOG_WARN, cell->log, 0,
                  "hermes: kernel %*s of session \"%V\" died during cell %uD",
                  (size_t) NGX_HTTP_HERMES_ID_LEN, cell->ref.kernel_id,
                  &cell->req.session, cell->ref.cell_id);

    ngx_http_hermes_cell_fail(cell, NGX_HTTP_HERMES_CELL_ERROR,
                              "the kernel died while running the cell; "
                              "its state is lost");

    if (c) {
        ngx_http_run_posted_requests(c);
    }
}


/* the cell's kernel as kills and interrupts take it: where and which */

static void
ngx_http_hermes_cell_victim(ngx_http_hermes_cell_t *cell,
    ngx_http_hermes_victim_t *v)
{
    ngx_memcpy(v->dir, cell->ref.dir, cell->ref.dir_len);
    v->dir[cell->ref.dir_len] = '\0';
    v->dir_len = cell->ref.dir_len;
    v->pid = cell->ref.pid;
    v->start = cell->ref.start;
    v->ino = cell->ref.ino;
    v->host = cell->ref.host;
    ngx_memcpy(v->tag, cell->hlcf->backend->tag,
               NGX_HTTP_HERMES_BACKEND_TAG_LEN);
}


static void
ngx_http_hermes_cell_kill(ngx_http_hermes_cell_t *cell)
{
    ngx_http_hermes_victim_t  v;

    ngx_http_hermes_cell_victim(cell, &v);

    if (ngx_http_hermes_kernel_kill(cell->hlcf->thread_pool,
                                    cell->hlcf->backend, &v, cell->log)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, cell->log, 0,
                      "hermes: could not kill kernel %*s",
                      (size_t) NGX_HTTP_HERMES_ID_LEN, cell->ref.kernel_id);
    }
}


/* an error before the stream started: status and a JSON error body */

static void
ngx_http_hermes_cell_error(ngx_http_hermes_cell_t *cell, ngx_uint_t status,
    char *code, char *message)
{
    ngx_http_request_t  *r;

    r = cell->r;

    if (r && !cell->header_sent) {
        cell->header_sent = 1;
        ngx_http_finalize_request(r,
                          ngx_http_hermes_send_error(r, status, code, message));
    }

    ngx_http_hermes_cell_end(cell);
}


static ngx_int_t
ngx_http_hermes_cell_send_header(ngx_http_hermes_cell_t *cell)
{
    ngx_int_t            rc;
    ngx_http_request_t  *r;

    r = cell->r;

    if (r == NULL || cell->header_sent) {
        return NGX_OK;
    }

    cell->header_sent = 1;

    r->headers_out.status = NGX_HTTP_OK;

    if (cell->req.json_answer) {
        ngx_str_set(&r->headers_out.content_type, "application/json");

    } else {
        ngx_str_set(&r->headers_out.content_type, "application/x-ndjson");
        r->headers_out.content_length_n = -1;
    }

    r->headers_out.content_type_len = r->headers_out.content_type.len;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK) {
        ngx_http_finalize_request(r, rc);
        return NGX_ERROR;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_hermes_cell_send(ngx_http_hermes_cell_t *cell, ngx_buf_t *b)
{
    ngx_chain_t  *cl;

    if (cell->r == NULL) {
        return NGX_OK;
    }

    cl = ngx_alloc_chain_link(cell->r->pool);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf = b;
    cl->next = NULL;

    return ngx_http_hermes_cell_send_chain(cell, cl);
}


/* out: links and buffers from the request's pool */

static ngx_int_t
ngx_http_hermes_cell_send_chain(ngx_http_hermes_cell_t *cell,
    ngx_chain_t *out)
{
    ngx_int_t                  rc;
    ngx_event_t               *wev;
    ngx_http_request_t        *r;
    ngx_http_core_loc_conf_t  *clcf;

    r = cell->r;

    if (r == NULL) {
        return NGX_OK;
    }

    rc = ngx_http_output_filter(r, out);

    ngx_chain_update_chains(r->pool, &cell->free, &cell->busy, &out,
                            (ngx_buf_tag_t) &ngx_http_hermes_module);

    if (rc == NGX_ERROR) {
        /* the client is gone; the cell goes on without it */
        ngx_http_finalize_request(r, NGX_ERROR);
        return NGX_ERROR;
    }

    if (rc == NGX_AGAIN) {
        /* the client's socket is full: wait until it can take more */

        r->write_event_handler = ngx_http_hermes_cell_write_handler;

        wev = r->connection->write;
        clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

        if (!wev->delayed && !wev->timer_set) {
            ngx_add_timer(wev, clcf->send_timeout);
        }

        if (ngx_handle_write_event(wev, clcf->send_lowat) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_ERROR);
            return NGX_ERROR;
        }
    }

    return rc;
}


static void
ngx_http_hermes_cell_write_handler(ngx_http_request_t *r)
{
    ngx_event_t               *wev;
    ngx_chain_t               *out;
    ngx_connection_t          *c;
    ngx_http_hermes_ctx_t     *ctx;
    ngx_http_hermes_cell_t    *cell;
    ngx_http_core_loc_conf_t  *clcf;

    c = r->connection;
    wev = c->write;

    if (wev->timedout) {
        c->timedout = 1;
        ngx_http_finalize_request(r, NGX_HTTP_REQUEST_TIME_OUT);
        return;
    }

    if (ngx_http_output_filter(r, NULL) == NGX_ERROR) {
        ngx_http_finalize_request(r, NGX_ERROR);
        return;
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_hermes_module);
    cell = ctx ? ctx->cell : NULL;

    if (cell) {
        out = NULL;
        ngx_chain_update_chains(r->pool, &cell->free, &cell->busy, &out,
                                (ngx_buf_tag_t) &ngx_http_hermes_module);
    }

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (c->buffered) {
        if (!wev->delayed) {
            ngx_add_timer(wev, clcf->send_timeout);
        }

        if (ngx_handle_write_event(wev, clcf->send_lowat) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_ERROR);
        }

        return;
    }

    if (wev->timer_set) {
        ngx_del_timer(wev);
    }

    /* the client took it all: read on */

    if (cell && cell->busy == NULL) {
        ngx_http_hermes_cell_resume(cell);
    }
}


/* the client's buffers drained: go on where backpressure stopped us */

static void
ngx_http_hermes_cell_resume(ngx_http_hermes_cell_t *cell)
{
    if (cell->relay) {
        if (cell->paused) {
            cell->paused = 0;
            ngx_http_hermes_cell_relay_handler(cell->relay->read);
        }

        return;
    }

    if (cell->draining) {
        ngx_http_hermes_cell_drain(cell);
        return;
    }

    if (cell->shipped) {
        ngx_http_hermes_cell_pump(cell);
    }
}


static void
ngx_http_hermes_cell_detach(void *data)
{
    ngx_http_hermes_cell_t *cell = data;

    /* the buffers and the context were the request's */

    cell->r = NULL;
    cell->cln = NULL;
    cell->ctx = NULL;
    cell->free = NULL;
    cell->busy = NULL;

    /*
     * A cell that waited for this client to take its output goes on
     * without it: nothing else would wake it (the kernel is released,
     * or an ssh relay waits for us to read).  Posted: the request is
     * being freed right now.
     */

    if (cell->draining || cell->paused) {
        ngx_post_event(&cell->resume, &ngx_posted_events);
    }
}


static void
ngx_http_hermes_cell_resume_handler(ngx_event_t *ev)
{
    ngx_http_hermes_cell_resume(ev->data);
}


/* the cell is done with its kernel turn: let go of everything */

static void
ngx_http_hermes_cell_end(ngx_http_hermes_cell_t *cell)
{
    if (cell->wait.timer_set) {
        ngx_del_timer(&cell->wait);
    }

    if (cell->resume.posted) {
        ngx_delete_posted_event(&cell->resume);
    }

    if (cell->timer.timer_set) {
        ngx_del_timer(&cell->timer);
    }

    ngx_http_hermes_cell_close_kernel(cell);

    if (cell->ctx) {
        cell->ctx->cell = NULL;
    }

    if (cell->relay) {
        /* the relay task sees the socket closed and stops */
        ngx_close_connection(cell->relay);
    }

    ngx_queue_remove(&cell->queue);

    /* the request, if still here, was finalized by whoever ended us */

    if (cell->cln) {
        cell->cln->handler = NULL;
    }

    ngx_destroy_pool(cell->pool);
}


/* a file of this cell in cells/: "cell_req", "cell_out", "cell_res" */

static void
ngx_http_hermes_cell_name(ngx_http_hermes_cell_t *cell, u_char *buf,
    const char *what)
{
    ngx_sprintf(buf, "%s_%06uD%s%Z", what, cell->ref.cell_id,
                what[5] == 'o' ? "" : ".json");
}
