
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: one cell's turn on its kernel, a state machine: acquire the
 * turn (queueing behind other cells of the session), spawn the kernel when
 * there is none, run the cell through the backend's transport, then take
 * its result, end the turn and answer.  The transport calls back (shipped,
 * output, result, done, failed); what is written to the client is
 * ngx_hermes_response.c's.
 *
 * The cell lives in its own pool: a client that goes away detaches the
 * request, and the cell still runs to its end, so the kernel stays usable.
 */


#include "ngx_hermes.h"


#define NGX_HTTP_HERMES_WAIT_MAX       50


typedef struct {
    ngx_pool_t                     *pool;
    ngx_log_t                      *log;

    ngx_http_hermes_loc_conf_t     *hlcf;
    ngx_http_hermes_zone_t         *zone;
    ngx_http_hermes_request_t       req;
    ngx_http_hermes_kernel_ref_t    ref;
    ngx_http_hermes_result_t        res;

    ngx_http_hermes_response_t      response;
    ngx_http_hermes_stream_t        stream;
    ngx_http_hermes_transport_t    *transport;
    ngx_uint_t                      tool_calls; /* of its ended rpcs */

    ngx_event_t                     wait;       /* polling for our turn */
    ngx_event_t                     resume;     /* the client left: go on */
    ngx_msec_t                      wait_delay;
    ngx_event_t                     timer;      /* the cell's timeout */
    ngx_event_t                     heartbeat;  /* a silent stretch */
    ngx_msec_t                      timeout;
    ngx_msec_t                      started;
    ngx_msec_t                      turn;       /* its turn came */
    ngx_msec_t                      spawn_at;
    ngx_uint_t                      spawn_tries;

    unsigned                        spawning:1;
    unsigned                        running:1;  /* the transport has it */
    unsigned                        draining:1; /* result in, output not */
    unsigned                        interrupting:1; /* timed out: grace */
    unsigned                        env_reset:1; /* its kernel of another
                                                    environment ended */
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
static ngx_int_t ngx_http_hermes_cell_shipped(ngx_http_hermes_stream_t *st);
static ngx_int_t ngx_http_hermes_cell_output(ngx_http_hermes_stream_t *st,
    u_char *p, size_t n);
static ngx_int_t ngx_http_hermes_cell_result(ngx_http_hermes_stream_t *st,
    u_char *data, size_t n);
static ngx_int_t ngx_http_hermes_cell_done(ngx_http_hermes_stream_t *st);
static void ngx_http_hermes_cell_failed(ngx_http_hermes_stream_t *st,
    ngx_uint_t why, char *message);
static void ngx_http_hermes_cell_respawn(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_disk_full(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_busy(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_ship_failed(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_fail(ngx_http_hermes_cell_t *cell,
    ngx_uint_t status, char *message);
static void ngx_http_hermes_cell_salvage(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_salvage_windows(ngx_http_hermes_cell_t *cell,
    u_char *data, size_t hsize, size_t tlen, ngx_uint_t gap);
static void ngx_http_hermes_cell_events(u_char *p, u_char *last,
    ngx_buf_t *out, ngx_buf_t *err);
static void ngx_http_hermes_cell_answer(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_timeout_handler(ngx_event_t *ev);
static void ngx_http_hermes_cell_kill(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_error(ngx_http_hermes_cell_t *cell,
    ngx_uint_t status, char *code, char *message);
static void ngx_http_hermes_cell_drained(void *data);
static void ngx_http_hermes_cell_gone(void *data);
static void ngx_http_hermes_cell_resume_handler(ngx_event_t *ev);
static void ngx_http_hermes_cell_heartbeat_handler(ngx_event_t *ev);
static void ngx_http_hermes_cell_stop(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_end(ngx_http_hermes_cell_t *cell);
static void ngx_http_hermes_cell_tool_event(void *data, u_char *line,
    size_t len);
static void ngx_http_hermes_cell_tools_end(ngx_http_hermes_cell_t *cell);
static u_char *ngx_http_hermes_cell_log_handler(ngx_log_t *log, u_char *buf,
    size_t len);


ngx_int_t
ngx_http_hermes_cell_start(ngx_http_request_t *r,
    ngx_http_hermes_request_t *req, ngx_str_t *owner)
{
    u_char                      *p;
    ngx_int_t                    rc;
    ngx_pool_t                  *pool;
    ngx_http_hermes_cell_t      *cell;
    ngx_http_hermes_stream_t    *st;
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

    /* every line about the cell says whose, which session, which kernel */

    cell->log = ngx_palloc(pool, sizeof(ngx_log_t));
    if (cell->log == NULL) {
        ngx_destroy_pool(pool);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    *cell->log = *ngx_cycle->log;
    cell->log->handler = ngx_http_hermes_cell_log_handler;
    cell->log->data = cell;
    cell->log->action = NULL;

    cell->hlcf = hlcf;
    cell->zone = hlcf->shm_zone->data;
    cell->req = *req;
    cell->transport = hlcf->backend->ops->transport;
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
    cell->ref.env = req->env ? req->env->id : 0;

    cell->response.json = req->json_answer;
    cell->response.tool_message = req->json_answer
                      && req->envelope != NGX_HTTP_HERMES_ENVELOPE_NONE;
    cell->response.drained = ngx_http_hermes_cell_drained;
    cell->response.gone = ngx_http_hermes_cell_gone;
    cell->response.data = cell;

    if (ngx_http_hermes_response_attach(&cell->response, r) != NGX_OK) {
        ngx_http_hermes_response_release(&cell->response);
        ngx_destroy_pool(pool);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cell->response.ctx->session = req->session;

    /* what the transport is given, and calls back */

    st = &cell->stream;
    st->pool = pool;
    st->log = cell->log;
    st->hlcf = hlcf;
    st->ref = &cell->ref;
    /* event lines escape what the runner caps at max_stream: up to 6x */
    st->out_limit = NGX_HTTP_HERMES_ESCAPED_MAX((off_t) hlcf->max_stream);
    st->res_limit = NGX_HTTP_HERMES_ESCAPED_MAX(hlcf->max_output);
    st->timeout = cell->timeout;
    st->client = r->connection;
    st->quiet = req->json_answer;
    st->data = cell;
    st->shipped = ngx_http_hermes_cell_shipped;
    st->output = ngx_http_hermes_cell_output;
    st->result = ngx_http_hermes_cell_result;
    st->done = ngx_http_hermes_cell_done;
    st->failed = ngx_http_hermes_cell_failed;

    cell->wait.handler = ngx_http_hermes_cell_wait_handler;
    cell->wait.data = cell;
    cell->wait.log = cell->log;

    cell->resume.handler = ngx_http_hermes_cell_resume_handler;
    cell->resume.data = cell;
    cell->resume.log = cell->log;

    cell->timer.handler = ngx_http_hermes_cell_timeout_handler;
    cell->timer.data = cell;
    cell->timer.log = cell->log;

    cell->heartbeat.handler = ngx_http_hermes_cell_heartbeat_handler;
    cell->heartbeat.data = cell;
    cell->heartbeat.log = cell->log;

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
    ngx_http_hermes_victims_t  victims;

    if (rc == NGX_HTTP_HERMES_ACQ_RUN || rc == NGX_HTTP_HERMES_ACQ_SPAWN) {
        /* what it waited for its turn is not the cell's duration */
        cell->turn = ngx_current_msec;
        ngx_http_hermes_registry_observe(cell->zone,
                                         NGX_HTTP_HERMES_HIST_QUEUE,
                                         cell->turn - cell->started);

        if (cell->response.ctx) {
            cell->response.ctx->queue_ms = cell->turn - cell->started;
            cell->response.ctx->has_queue = 1;
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

    case NGX_HTTP_HERMES_ACQ_ENV_MISMATCH:
        if (cell->req.reset && !cell->env_reset) {
            /* a reset into another environment: a new kernel, in it */
            cell->env_reset = 1;
            victims.n = 0;

            rc = ngx_http_hermes_registry_end(cell->zone, &cell->ref,
                                              &victims);

            ngx_http_hermes_kernel_kill_victims(cell->hlcf->thread_pool,
                                                &victims, cell->log);

            if (rc != NGX_BUSY) {
                victims.n = 0;

                rc = ngx_http_hermes_registry_acquire(cell->zone, &cell->ref,
                                                 &cell->hlcf->backend->root,
                                                 cell->hlcf->queue, &victims);

                ngx_http_hermes_kernel_kill_victims(cell->hlcf->thread_pool,
                                                    &victims, cell->log);

                return ngx_http_hermes_cell_acquired(cell, rc);
            }
        }

        ngx_http_hermes_cell_error(cell, NGX_HTTP_CONFLICT,
                                   "environment_mismatch",
                                   cell->req.reset
                                   ? "this session's kernel runs in another "
                                     "environment and a cell runs or waits "
                                     "on it"
                                   : "this session's kernel runs in another "
                                     "environment; \"reset\": true starts it "
                                     "anew in this one");
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
    c = cell->stream.client;

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

    ngx_http_hermes_backend_place(cell->zone, &cell->ref,
                                   cell->hlcf->backend);

    rc = ngx_http_hermes_kernel_spawn(cell->hlcf, cell->req.env, cell->zone,
                                      &cell->ref,
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

    u_char            *m;
    ngx_connection_t  *c;

    c = cell->stream.client;

    cell->spawning = 0;

    if (cell->timer.timer_set) {
        ngx_del_timer(&cell->timer);
    }

    if (rc == NGX_DECLINED
        && ++cell->spawn_tries < cell->hlcf->backend->nhosts)
    {
        /* that host is down (and now skipped for a while): try another */

        ngx_log_error(NGX_LOG_WARN, cell->log, 0,
                      "hermes: %s; trying another host", err);
        ngx_http_hermes_registry_spawn_failed(cell->zone, &cell->ref);

        if (ngx_http_hermes_cell_spawn(cell) == NGX_OK) {
            goto done;
        }
    }

    if (rc == NGX_ABORT && cell->ref.host < 64
        && ++cell->spawn_tries < cell->hlcf->backend->nhosts)
    {
        /* that host lacks the environment: another may have it */

        ngx_log_error(NGX_LOG_WARN, cell->log, 0,
                      "hermes: %s; trying another host", err);
        cell->ref.avoid |= (uint64_t) 1 << cell->ref.host;

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

        } else if (rc == NGX_ABORT && cell->req.env) {
            /* the host lacks the environment: the client is told which */
            m = ngx_pnalloc(cell->pool, 512);
            if (m) {
                *ngx_slprintf(m, m + 511, "could not start a kernel in "
                              "environment \"%V\": no rootfs %V on this "
                              "host", &cell->req.env->name,
                              &cell->req.env->rootfs) = '\0';
            }

            ngx_http_hermes_cell_error(cell, NGX_HTTP_BAD_GATEWAY,
                                       "spawn_failed",
                                       m ? (char *) m
                                         : "could not start a kernel");

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
    ngx_http_hermes_registry_env_spawned(cell->zone, cell->ref.env,
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
    ngx_uint_t                 tools, schemas;
    ngx_http_hermes_stream_t  *st;

    st = &cell->stream;

    /*
     * A transport that carries no tool calls (ssh, for now) enables none:
     * the code's calls fail at once, instead of waiting for an answer that
     * cannot come.
     */

    tools = cell->transport->tools;

    /* schemas to ask for: a hermes_tools_schema file's, an MCP server's */
    schemas = tools && (cell->hlcf->tools_schema.len
                        || cell->hlcf->tools_protocol
                           == NGX_HTTP_HERMES_TOOLS_MCP);

    st->request = ngx_http_hermes_json_cell_request(cell->pool,
                                                    cell->ref.cell_id,
                                                    &cell->req,
                                                    cell->hlcf->max_output,
                                                    cell->hlcf->max_stream,
                                                    tools ? cell->hlcf->tools
                                                          : NULL,
                                                    tools
                                                    && cell->hlcf->tools_auto,
                                                    schemas);
    if (st->request == NULL) {
        ngx_http_hermes_cell_ship_failed(cell);
        return;
    }

    st->is_shipped = 0;
    st->waits_client = 0;

    /* its tool calls, on their own (ngx_hermes_rpc.c); the transport
     * watches rpc/ where it can */

    if (st->rpc == NULL) {
        st->rpc = ngx_http_hermes_rpc_create(cell->pool, cell->response.r,
                                             cell->hlcf, &cell->ref,
                                             ngx_http_hermes_cell_tool_event,
                                             cell, cell->log);
        if (st->rpc == NULL) {
            ngx_http_hermes_cell_ship_failed(cell);
            return;
        }
    }

    /* the turn is bounded from here, whatever the host does */
    ngx_add_timer(&cell->timer, cell->timeout);

    cell->running = 1;

    if (cell->transport->run(st) != NGX_OK) {
        ngx_http_hermes_cell_ship_failed(cell);
    }
}


/* the cell is on its kernel: the stream opens with the kernel line */

static ngx_int_t
ngx_http_hermes_cell_shipped(ngx_http_hermes_stream_t *st)
{
    ngx_http_hermes_cell_t *cell = st->data;

    if (ngx_http_hermes_response_kernel(&cell->response, &cell->ref,
                                        &cell->req)
        != NGX_OK)
    {
        ngx_http_hermes_cell_fail(cell, NGX_HTTP_HERMES_CELL_ERROR,
                                  "out of memory");
        return NGX_ERROR;
    }

    if (cell->hlcf->heartbeat && !cell->response.json) {
        ngx_add_timer(&cell->heartbeat, cell->hlcf->heartbeat);
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_hermes_cell_output(ngx_http_hermes_stream_t *st, u_char *p,
    size_t n)
{
    ngx_http_hermes_cell_t *cell = st->data;

    if (cell->heartbeat.timer_set) {
        /* silence is counted from the last output */
        ngx_add_timer(&cell->heartbeat, cell->hlcf->heartbeat);
    }

    return ngx_http_hermes_response_output(&cell->response, p, n);
}


/* the transport cannot go on: why, and what it means for the kernel */

static void
ngx_http_hermes_cell_failed(ngx_http_hermes_stream_t *st, ngx_uint_t why,
    char *message)
{
    ngx_http_hermes_cell_t *cell = st->data;

    switch (why) {

    case NGX_HTTP_HERMES_STREAM_DEAD:
        ngx_http_hermes_cell_respawn(cell);
        return;

    case NGX_HTTP_HERMES_STREAM_FULL:
        ngx_http_hermes_cell_disk_full(cell);
        return;

    case NGX_HTTP_HERMES_STREAM_BUSY:
        ngx_http_hermes_cell_busy(cell);
        return;

    case NGX_HTTP_HERMES_STREAM_SHIP_FAILED:
        ngx_http_hermes_cell_ship_failed(cell);
        return;

    default: /* NGX_HTTP_HERMES_STREAM_LOST */
        ngx_http_hermes_cell_fail(cell, NGX_HTTP_HERMES_CELL_ERROR, message);
    }
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
    ngx_http_hermes_cell_stop(cell);

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


/* nothing was shipped: the kernel is fine, as it was */

static void
ngx_http_hermes_cell_busy(ngx_http_hermes_cell_t *cell)
{
    ngx_log_error(NGX_LOG_WARN, cell->log, 0,
                  "hermes: the thread pool is full, cell %uD of "
                  "session \"%V\" not run", cell->ref.cell_id,
                  &cell->req.session);

    ngx_http_hermes_registry_release(cell->zone, &cell->ref,
                                     NGX_HTTP_HERMES_RELEASE_DONE,
                                     cell->ref.execution_count);

    ngx_http_hermes_cell_error(cell, NGX_HTTP_SERVICE_UNAVAILABLE, "busy",
                               "the gateway is busy; retry shortly");
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

    if (!cell->response.header_sent) {
        ngx_http_hermes_cell_error(cell, NGX_HTTP_BAD_GATEWAY, "ship_failed",
                                   "could not ship the cell to its kernel");
        return;
    }

    cell->res.status = NGX_HTTP_HERMES_CELL_ERROR;
    ngx_str_set(&cell->res.error, "could not ship the cell to its kernel");
    ngx_http_hermes_cell_answer(cell);
}


/*
 * The runner's result, whichever way it came: end the turn.  The kernel
 * is free for the next cell; what is left of the output goes to the
 * client at its own pace ("done" comes then), then the result line.
 */

static ngx_int_t
ngx_http_hermes_cell_result(ngx_http_hermes_stream_t *st, u_char *data,
    size_t n)
{
    ngx_http_hermes_cell_t *cell = st->data;

    /* the kernel is the next cell's from here: so is its rpc/ */
    ngx_http_hermes_cell_tools_end(cell);

    if (ngx_http_hermes_json_parse_result(cell->pool, data, n, &cell->res)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, cell->log, 0,
                      "hermes: unreadable result of cell %uD of kernel %*s",
                      cell->ref.cell_id, (size_t) NGX_HTTP_HERMES_ID_LEN,
                      cell->ref.kernel_id);

        ngx_http_hermes_cell_fail(cell, NGX_HTTP_HERMES_CELL_ERROR,
                                  "the kernel wrote an unreadable result");
        return NGX_ERROR;
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

    if (cell->req.ephemeral) {
        /* a one-shot kernel: discarded after its cell */
        cell->res.ended = 1;
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

    if (cell->timer.timer_set) {
        ngx_del_timer(&cell->timer);
    }

    cell->draining = 1;

    return NGX_OK;
}


/* every byte of output the client will get went out: the result line */

static ngx_int_t
ngx_http_hermes_cell_done(ngx_http_hermes_stream_t *st)
{
    ngx_http_hermes_cell_t *cell = st->data;

    if (st->truncated) {
        cell->res.stream_truncated = 1;
    }

    ngx_http_hermes_cell_answer(cell);

    return NGX_OK;
}


/* the kernel is lost mid-cell: kill it, answer with "message" */

static void
ngx_http_hermes_cell_fail(ngx_http_hermes_cell_t *cell, ngx_uint_t status,
    char *message)
{
    cell->ref.end_reason = (status == NGX_HTTP_HERMES_CELL_TIMEOUT)
                           ? NGX_HTTP_HERMES_LOST_TIMEOUT
                           : NGX_HTTP_HERMES_LOST_DIED;

    ngx_http_hermes_cell_tools_end(cell);
    ngx_http_hermes_cell_kill(cell);
    ngx_http_hermes_registry_release(cell->zone, &cell->ref,
                                     NGX_HTTP_HERMES_RELEASE_LOST, 0);

    ngx_memzero(&cell->res, sizeof(ngx_http_hermes_result_t));
    cell->res.status = status;
    cell->res.error.data = (u_char *) message;
    cell->res.error.len = ngx_strlen(message);
    cell->res.stream_truncated = cell->stream.truncated;
    /* the cell counted: its number is the kernel line's */
    cell->res.execution_count = cell->ref.execution_count
                                + (cell->stream.is_shipped ? 1 : 0);

    ngx_http_hermes_cell_salvage(cell);
    cell->res.ended = 1;                /* the kernel is gone */

    ngx_http_hermes_cell_answer(cell);
}


/*
 * The kernel is gone without a result, but what the cell printed was
 * kept (in cell_out, or as it went by): its head and tail make the
 * output the runner would have given, 40% head and 60% tail of
 * max_output.
 */

static void
ngx_http_hermes_cell_salvage(ngx_http_hermes_cell_t *cell)
{
    ngx_http_hermes_windows_t  w;

    if (!cell->running) {
        return;
    }

    ngx_memzero(&w, sizeof(ngx_http_hermes_windows_t));
    w.head = NGX_HTTP_HERMES_KEEP_HEAD(cell->hlcf->max_output);
    w.tail = NGX_HTTP_HERMES_KEEP_TAIL(cell->hlcf->max_output);

    cell->transport->salvage(&cell->stream, &w);

    if (w.data) {
        ngx_http_hermes_cell_salvage_windows(cell, w.data, w.head, w.tail,
                                             w.gap);
    }
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
    ngx_http_hermes_cell_tools_end(cell);

    cell->res.duration = ngx_current_msec - cell->turn;
    cell->res.queue = cell->turn - cell->started;
    cell->res.tool_calls_made = cell->tool_calls;

    ngx_http_hermes_count(cell->zone, cells_total[cell->res.status]);
    ngx_http_hermes_registry_observe(cell->zone, NGX_HTTP_HERMES_HIST_CELL,
                                     cell->res.duration);

    ngx_http_hermes_response_end_line(&cell->response);
    ngx_http_hermes_response_result(&cell->response, &cell->res, &cell->ref,
                                    &cell->req);

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

    if (cell->stream.waits_client && cell->response.r) {
        /*
         * The result may be behind output a slow client has not taken:
         * the cell may be over on its host.  The client's send_timeout
         * bounds this; then the output is read on without it.
         */
        ngx_add_timer(&cell->timer, 1000);
        return;
    }

    c = cell->stream.client;

    /* first a KeyboardInterrupt: the kernel and its state may live on */

    if (!cell->interrupting && cell->hlcf->cell_grace
        && cell->transport->interrupt(&cell->stream) == NGX_OK)
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


static void
ngx_http_hermes_cell_kill(ngx_http_hermes_cell_t *cell)
{
    ngx_http_hermes_victim_t  v;

    ngx_http_hermes_kernel_victim(&v, &cell->ref, cell->hlcf->backend);

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
    ngx_http_hermes_response_error(&cell->response, status, code, message);
    ngx_http_hermes_cell_end(cell);
}


/* the client's buffers drained: go on where backpressure stopped us */

static void
ngx_http_hermes_cell_drained(void *data)
{
    ngx_http_hermes_cell_t *cell = data;

    if (cell->running) {
        cell->transport->resume(&cell->stream);
    }
}


/*
 * The client left: the cell goes on without it.  A cell that waited for
 * this client to take its output must go on now, nothing else would wake
 * it; posted, as the request is being freed right now.
 */

static void
ngx_http_hermes_cell_gone(void *data)
{
    ngx_http_hermes_cell_t *cell = data;

    cell->stream.client = NULL;
    cell->stream.quiet = 1;

    /* tool calls ran on its behalf: no more (see ngx_hermes_rpc.c) */

    if (cell->stream.rpc) {
        ngx_http_hermes_rpc_detach(cell->stream.rpc);
    }

    if (cell->running) {
        ngx_post_event(&cell->resume, &ngx_posted_events);
    }
}


static void
ngx_http_hermes_cell_resume_handler(ngx_event_t *ev)
{
    ngx_http_hermes_cell_drained(ev->data);
}


static void
ngx_http_hermes_cell_heartbeat_handler(ngx_event_t *ev)
{
    ngx_http_hermes_cell_t *cell = ev->data;

    if (cell->response.r == NULL) {
        return;
    }

    ngx_http_hermes_response_heartbeat(&cell->response);
    ngx_add_timer(&cell->heartbeat, cell->hlcf->heartbeat);
}


/* the transport lets go of what it held of the kernel's host */

static void
ngx_http_hermes_cell_stop(ngx_http_hermes_cell_t *cell)
{
    if (cell->running) {
        cell->transport->close(&cell->stream);
        cell->running = 0;
    }
}


/* the cell is done with its kernel turn: let go of everything */

static void
ngx_http_hermes_cell_end(ngx_http_hermes_cell_t *cell)
{
    ngx_http_hermes_cell_tools_end(cell);

    if (cell->wait.timer_set) {
        ngx_del_timer(&cell->wait);
    }

    if (cell->resume.posted) {
        ngx_delete_posted_event(&cell->resume);
    }

    if (cell->timer.timer_set) {
        ngx_del_timer(&cell->timer);
    }

    if (cell->heartbeat.timer_set) {
        ngx_del_timer(&cell->heartbeat);
    }

    ngx_http_hermes_cell_stop(cell);
    ngx_http_hermes_response_release(&cell->response);

    ngx_destroy_pool(cell->pool);
}


/* a tool call's event line, between whole lines of the cell's output */

static void
ngx_http_hermes_cell_tool_event(void *data, u_char *line, size_t len)
{
    ngx_http_hermes_cell_t *cell = data;

    if (cell->response.mid_line) {
        return;
    }

    (void) ngx_http_hermes_response_output(&cell->response, line, len);
}


/* the cell's authority to call tools ends with its turn on the kernel */

static void
ngx_http_hermes_cell_tools_end(ngx_http_hermes_cell_t *cell)
{
    ngx_http_hermes_rpc_t  *rpc;

    rpc = cell->stream.rpc;

    if (rpc == NULL) {
        return;
    }

    cell->stream.rpc = NULL;

    ngx_http_hermes_rpc_end(rpc);
    cell->tool_calls += ngx_http_hermes_rpc_calls(rpc);
}


/* ", owner: ..., session: ..., kernel: ..." after each line about a cell */

static u_char *
ngx_http_hermes_cell_log_handler(ngx_log_t *log, u_char *buf, size_t len)
{
    ngx_http_hermes_cell_t *cell = log->data;

    u_char     *p, *last;
    ngx_str_t   owner;

    p = buf;
    last = buf + len;

    owner = cell->ref.owner;

    if (owner.len && owner.data[0] == '\001') {
        /* hermes_owner unset: everyone is one owner */
        owner.data++;
        owner.len--;
    }

    if (owner.len && last - p > (ssize_t) sizeof(", owner: \"\"")) {
        /* the operator's variable: any byte but a control one */
        p = ngx_cpymem(p, ", owner: \"", sizeof(", owner: \"") - 1);
        p = ngx_http_hermes_log_escape(p, last - 1, owner.data, owner.len, 1);
        *p++ = '"';
    }

    if (cell->req.session.len) {
        p = ngx_slprintf(p, last, ", session: \"%V\"", &cell->req.session);
    }

    if (cell->ref.kernel_id[0]) {
        p = ngx_slprintf(p, last, ", kernel: %*s",
                         (size_t) NGX_HTTP_HERMES_ID_LEN, cell->ref.kernel_id);
    }

    return p;
}
