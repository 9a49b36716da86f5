
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: a cell's stream again, for a client that lost it:
 * GET <kernels location>/SESSION/cells/ID?offset=N.  The files are the
 * truth: the kernel's transport reads cells/cell_out_ID from byte N
 * (following it while the cell runs) and ends with the result, as the
 * cell's own request would have; nothing is shipped, run or released,
 * and the turn of the kernel is not taken.  Only the kernel's last cell
 * has its files (the runner removes earlier ones when a cell starts).
 */


#include "ngx_hermes.h"


#define NGX_HTTP_HERMES_GONE  410


typedef struct {
    ngx_pool_t                     *pool;       /* its own: it outlives
                                                   the request's end */
    ngx_http_hermes_response_t      response;
    ngx_http_hermes_stream_t        stream;
    ngx_http_hermes_kernel_ref_t    ref;
    ngx_http_hermes_request_t       req;
    ngx_http_hermes_result_t        res;
    ngx_http_hermes_transport_t    *transport;
    ngx_event_t                     timer;
    unsigned                        running:1;
    unsigned                        ending:1;   /* answering: keep it */
} ngx_http_hermes_resume_t;


static ngx_int_t ngx_http_hermes_resume_shipped(ngx_http_hermes_stream_t *st);
static ngx_int_t ngx_http_hermes_resume_output(ngx_http_hermes_stream_t *st,
    u_char *p, size_t n);
static ngx_int_t ngx_http_hermes_resume_result(ngx_http_hermes_stream_t *st,
    u_char *data, size_t n);
static ngx_int_t ngx_http_hermes_resume_done(ngx_http_hermes_stream_t *st);
static void ngx_http_hermes_resume_failed(ngx_http_hermes_stream_t *st,
    ngx_uint_t why, char *message);
static void ngx_http_hermes_resume_drained(void *data);
static void ngx_http_hermes_resume_gone(void *data);
static void ngx_http_hermes_resume_timeout(ngx_event_t *ev);
static void ngx_http_hermes_resume_stop(ngx_http_hermes_resume_t *rm);
static void ngx_http_hermes_resume_answer(ngx_http_hermes_resume_t *rm);
static void ngx_http_hermes_resume_end(ngx_http_hermes_resume_t *rm);


ngx_int_t
ngx_http_hermes_resume_handler(ngx_http_request_t *r,
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner, ngx_str_t *session,
    uint32_t cell, off_t offset)
{
    ngx_pool_t                       *pool;
    ngx_http_hermes_stream_t         *st;
    ngx_http_hermes_victim_t          v;
    ngx_http_hermes_resume_t         *rm;
    ngx_http_hermes_loc_conf_t       *hlcf, *lc;
    ngx_http_hermes_main_conf_t      *hmcf;
    ngx_http_hermes_backend_conf_t   *bcf;

    if (r->method != NGX_HTTP_GET) {
        if (ngx_http_hermes_response_add_header(r, "Allow", "GET") != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_hermes_response_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                                   "method_not_allowed",
                                                   "use GET for a cell's "
                                                   "stream");
    }

    /* the connection's log goes with it: the reader may outlive it */
    pool = ngx_create_pool(4096, ngx_cycle->log);
    if (pool == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    rm = ngx_pcalloc(pool, sizeof(ngx_http_hermes_resume_t));
    if (rm == NULL) {
        ngx_destroy_pool(pool);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    rm->pool = pool;

    if (ngx_http_hermes_registry_kernel(zone, owner, session, &v, &rm->ref)
        != NGX_OK)
    {
        ngx_destroy_pool(pool);
        return ngx_http_hermes_response_send_error(r, NGX_HTTP_NOT_FOUND,
                                                   "not_found",
                                                   "no kernel of yours for "
                                                   "this session");
    }

    if (cell == 0 || cell > rm->ref.cell_id) {
        ngx_destroy_pool(pool);
        return ngx_http_hermes_response_send_error(r, NGX_HTTP_NOT_FOUND,
                                                   "not_found",
                                                   "no such cell on this "
                                                   "session's kernel");
    }

    if (cell < rm->ref.cell_id) {
        ngx_destroy_pool(pool);
        return ngx_http_hermes_response_send_error(r, NGX_HTTP_HERMES_GONE,
                                                   "cell_gone",
                                                   "a later cell ran on the "
                                                   "kernel: only the last "
                                                   "cell's stream is kept");
    }

    hmcf = ngx_http_get_module_main_conf(r, ngx_http_hermes_module);
    bcf = ngx_http_hermes_backend_by_tag(hmcf, v.tag);

    if (bcf == NULL) {
        ngx_destroy_pool(pool);
        return ngx_http_hermes_response_send_error(r, NGX_HTTP_NOT_FOUND,
                                                   "not_found",
                                                   "the kernel's backend is "
                                                   "no longer configured");
    }

    /* the transport works with the kernel's backend, not this location's */

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    lc = ngx_palloc(pool, sizeof(ngx_http_hermes_loc_conf_t));
    if (lc == NULL) {
        ngx_destroy_pool(pool);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    *lc = *hlcf;
    lc->backend = bcf;

    rm->ref.cell_id = cell;
    rm->req.session = *session;
    rm->transport = bcf->ops->transport;

    rm->response.drained = ngx_http_hermes_resume_drained;
    rm->response.gone = ngx_http_hermes_resume_gone;
    rm->response.data = rm;

    if (ngx_http_hermes_response_attach(&rm->response, r) != NGX_OK) {
        ngx_http_hermes_response_release(&rm->response);
        ngx_destroy_pool(pool);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    st = &rm->stream;
    st->pool = pool;
    st->log = ngx_cycle->log;
    st->hlcf = lc;
    st->ref = &rm->ref;
    st->offset = offset;
    st->out_limit = NGX_HTTP_HERMES_ESCAPED_MAX((off_t) hlcf->max_stream);
    st->res_limit = NGX_HTTP_HERMES_ESCAPED_MAX(hlcf->max_output);
    st->timeout = hlcf->cell_timeout;
    st->client = r->connection;
    st->data = rm;
    st->shipped = ngx_http_hermes_resume_shipped;
    st->output = ngx_http_hermes_resume_output;
    st->result = ngx_http_hermes_resume_result;
    st->done = ngx_http_hermes_resume_done;
    st->failed = ngx_http_hermes_resume_failed;

    rm->timer.handler = ngx_http_hermes_resume_timeout;
    rm->timer.data = rm;
    rm->timer.log = ngx_cycle->log;

    /* a cell still running is followed no longer than a cell may run */
    ngx_add_timer(&rm->timer, hlcf->cell_timeout + hlcf->cell_grace + 5000);

    r->main->count++;
    rm->running = 1;

    if (rm->transport->run(st) != NGX_OK) {
        ngx_http_hermes_resume_failed(st, NGX_HTTP_HERMES_STREAM_DEAD, NULL);
    }

    return NGX_DONE;
}


static ngx_int_t
ngx_http_hermes_resume_shipped(ngx_http_hermes_stream_t *st)
{
    ngx_http_hermes_resume_t *rm = st->data;

    return ngx_http_hermes_response_header(&rm->response);
}


static ngx_int_t
ngx_http_hermes_resume_output(ngx_http_hermes_stream_t *st, u_char *p,
    size_t n)
{
    ngx_http_hermes_resume_t *rm = st->data;

    return ngx_http_hermes_response_output(&rm->response, p, n);
}


static ngx_int_t
ngx_http_hermes_resume_result(ngx_http_hermes_stream_t *st, u_char *data,
    size_t n)
{
    ngx_http_hermes_resume_t *rm = st->data;

    if (ngx_http_hermes_json_parse_result(st->pool, data, n, &rm->res)
        != NGX_OK)
    {
        ngx_http_hermes_resume_failed(st, NGX_HTTP_HERMES_STREAM_LOST,
                                      "the kernel wrote an unreadable result");
        return NGX_ERROR;
    }

    rm->ref.reused = 1;

    return NGX_OK;
}


static ngx_int_t
ngx_http_hermes_resume_done(ngx_http_hermes_stream_t *st)
{
    ngx_http_hermes_resume_t *rm = st->data;

    if (st->truncated) {
        rm->res.stream_truncated = 1;
    }

    ngx_http_hermes_resume_answer(rm);

    return NGX_OK;
}


static void
ngx_http_hermes_resume_failed(ngx_http_hermes_stream_t *st, ngx_uint_t why,
    char *message)
{
    ngx_http_hermes_resume_t *rm = st->data;

    ngx_http_hermes_resume_stop(rm);

    if (!rm->response.header_sent) {
        rm->ending = 1;
        ngx_http_hermes_response_error(&rm->response, NGX_HTTP_NOT_FOUND,
                                       "not_found",
                                       "the kernel of this session is gone");
        ngx_http_hermes_resume_end(rm);
        return;
    }

    rm->res.status = NGX_HTTP_HERMES_CELL_ERROR;
    rm->res.error.data = (u_char *) (message ? message
                                             : "the cell's stream failed");
    rm->res.error.len = ngx_strlen(rm->res.error.data);
    rm->res.ended = 1;

    ngx_http_hermes_resume_answer(rm);
}


/* the result line: the request ends with it, then the reader */

static void
ngx_http_hermes_resume_answer(ngx_http_hermes_resume_t *rm)
{
    rm->ending = 1;

    ngx_http_hermes_response_end_line(&rm->response);
    ngx_http_hermes_response_result(&rm->response, &rm->res, &rm->ref,
                                     &rm->req);

    ngx_http_hermes_resume_end(rm);
}


/* the client took what was sent: read on */

static void
ngx_http_hermes_resume_drained(void *data)
{
    ngx_http_hermes_resume_t *rm = data;

    if (rm->running) {
        rm->transport->resume(&rm->stream);
    }
}


/*
 * The client left, or the request was finalized: nobody to stream to.
 * The request is being freed now; a reader answering ends itself after.
 */

static void
ngx_http_hermes_resume_gone(void *data)
{
    ngx_http_hermes_resume_t *rm = data;

    if (rm->ending) {
        return;
    }

    ngx_http_hermes_resume_end(rm);
}


static void
ngx_http_hermes_resume_timeout(ngx_event_t *ev)
{
    ngx_http_hermes_resume_t *rm = ev->data;

    ngx_connection_t    *c;
    ngx_http_request_t  *r;

    c = rm->stream.client;
    r = rm->response.r;

    /* what was sent stands: the client may come back for the rest */

    rm->ending = 1;
    ngx_http_hermes_resume_stop(rm);
    ngx_http_hermes_response_release(&rm->response);

    if (r) {
        ngx_http_finalize_request(r, NGX_ERROR);
    }

    ngx_http_hermes_resume_end(rm);

    if (c) {
        ngx_http_run_posted_requests(c);
    }
}


static void
ngx_http_hermes_resume_stop(ngx_http_hermes_resume_t *rm)
{
    if (rm->running) {
        rm->running = 0;
        rm->transport->close(&rm->stream);
    }
}


static void
ngx_http_hermes_resume_end(ngx_http_hermes_resume_t *rm)
{
    if (rm->timer.timer_set) {
        ngx_del_timer(&rm->timer);
    }

    ngx_http_hermes_resume_stop(rm);
    ngx_http_hermes_response_release(&rm->response);

    ngx_destroy_pool(rm->pool);
}
