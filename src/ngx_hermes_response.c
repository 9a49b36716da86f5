
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: everything written to a client.  A cell's NDJSON stream
 * (the kernel line, event lines at the client's pace, the result line)
 * or its one JSON answer; JSON error bodies; and a filter that turns the
 * errors nginx itself answers on our locations (413 of
 * client_max_body_size, 408, 500, ...) into our JSON error body, and
 * counts every answer.
 */


#include "ngx_hermes.h"


#define NGX_HTTP_HERMES_OUT_CHUNK      (128 * 1024)


static ngx_int_t ngx_http_hermes_response_send(ngx_http_hermes_response_t *rs,
    ngx_buf_t *b);
static ngx_int_t ngx_http_hermes_response_send_chain(
    ngx_http_hermes_response_t *rs, ngx_chain_t *out);
static void ngx_http_hermes_response_write_handler(ngx_http_request_t *r);
static void ngx_http_hermes_response_detach(void *data);
static ngx_http_hermes_loc_conf_t *ngx_http_hermes_response_location(
    ngx_http_request_t *r);


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;


ngx_int_t
ngx_http_hermes_response_add_header(ngx_http_request_t *r, char *key,
    char *value)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    h->key.data = (u_char *) key;
    h->key.len = ngx_strlen(key);
    h->value.data = (u_char *) value;
    h->value.len = ngx_strlen(value);

    return NGX_OK;
}


ngx_int_t
ngx_http_hermes_response_send_error(ngx_http_request_t *r, ngx_uint_t status,
    char *code, char *message)
{
    ngx_str_t               c, m;
    ngx_buf_t              *b, *e;
    ngx_http_hermes_ctx_t  *ctx;

    c.data = (u_char *) code;
    c.len = ngx_strlen(code);
    m.data = (u_char *) message;
    m.len = ngx_strlen(message);

    b = ngx_http_hermes_json_error(r->pool, &c, &m);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* for responses_total: code strings are static or the request's */

    ctx = ngx_http_hermes_response_ctx(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->error_code = c;

    if (ctx->answer) {
        /* another protocol's message: the client reads it as one */

        e = ctx->answer->error(r, ctx->answer_data, status, &c, &m);
        if (e == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_hermes_response_send_buf(r, NGX_HTTP_OK,
                                        ctx->answer->error_type, e);
    }

    if (ctx->envelope != NGX_HTTP_HERMES_ENVELOPE_NONE) {
        /* an agent's tool call: the model reads the error and reacts */

        e = ngx_http_hermes_json_tool_message(r->pool, ctx->envelope,
                                              &ctx->tool_call_id, b->pos,
                                              b->last - b->pos - 1, 1);
        if (e == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_hermes_response_send_buf(r, NGX_HTTP_OK,
                                                 "application/json", e);
    }

    if (status == NGX_HTTP_TOO_MANY_REQUESTS
        || status == NGX_HTTP_SERVICE_UNAVAILABLE)
    {
        if (ngx_http_hermes_response_add_header(r, "Retry-After", "1")
            != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    return ngx_http_hermes_response_send_buf(r, status, "application/json",
                                             b);
}


ngx_int_t
ngx_http_hermes_response_send_buf(ngx_http_request_t *r, ngx_uint_t status,
    const char *type, ngx_buf_t *b)
{
    ngx_int_t    rc;
    ngx_chain_t  out;

    r->headers_out.status = status;
    r->headers_out.content_length_n = b ? b->last - b->pos : 0;
    r->headers_out.content_type.data = (u_char *) type;
    r->headers_out.content_type.len = ngx_strlen(type);
    r->headers_out.content_type_len = r->headers_out.content_type.len;

    if (b == NULL) {
        r->header_only = 1;
    }

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


/*
 * An error nginx answers before it looked up a location (a malformed
 * header, TRACE) has the server's configuration: does the URI name one
 * of our locations?  Each is tried on its own, the others not at all: a
 * URI that nginx would give to a longer prefix or a regex location of
 * another module, but that also falls under one of ours, is ours here.
 */

static ngx_http_hermes_loc_conf_t *
ngx_http_hermes_response_location(ngx_http_request_t *r)
{
    ngx_uint_t                    i;
    ngx_http_core_loc_conf_t     *clcf;
    ngx_http_core_srv_conf_t     *cscf;
    ngx_http_hermes_location_t   *loc;
    ngx_http_hermes_main_conf_t  *hmcf;

    cscf = ngx_http_get_module_srv_conf(r, ngx_http_core_module);

    if (r->uri.len == 0 || r->loc_conf != cscf->ctx->loc_conf) {
        return NULL;
    }

    hmcf = ngx_http_get_module_main_conf(r, ngx_http_hermes_module);
    loc = hmcf->locations.elts;

    for (i = 0; i < hmcf->locations.nelts; i++) {

        if (loc[i].cscf != cscf) {
            continue;
        }

        clcf = loc[i].clcf;

#if (NGX_PCRE)
        if (clcf->regex) {
            if (ngx_regex_exec(clcf->regex->regex, &r->uri, NULL, 0) >= 0) {
                return clcf->loc_conf[ngx_http_hermes_module.ctx_index];
            }

            continue;
        }
#endif

        /* "location = /a" is /a alone, "location /a" anything it starts */

        if (r->uri.len < clcf->name.len
            || (clcf->exact_match && r->uri.len != clcf->name.len))
        {
            continue;
        }

        if (ngx_filename_cmp(r->uri.data, clcf->name.data, clcf->name.len)
            == 0)
        {
            return clcf->loc_conf[ngx_http_hermes_module.ctx_index];
        }
    }

    return NULL;
}


/*
 * Every answer of a hermes location is counted by status and error code;
 * errors nginx answers there get the JSON error body too.
 */

static ngx_int_t
ngx_http_hermes_response_header_filter(ngx_http_request_t *r)
{
    u_char                      *p;
    ngx_str_t                    code, message;
    ngx_http_hermes_ctx_t       *ctx;
    ngx_http_hermes_loc_conf_t  *hlcf;

    if (r != r->main) {
        return ngx_http_next_header_filter(r);
    }

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    if (hlcf->handler == NGX_HTTP_HERMES_HANDLER_NONE) {
        hlcf = ngx_http_hermes_response_location(r);

        if (hlcf == NULL || hlcf->shm_zone == NULL) {
            return ngx_http_next_header_filter(r);
        }
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_hermes_module);

    if (r->headers_out.status < NGX_HTTP_BAD_REQUEST
        || (r->headers_out.content_type.len >= sizeof("application/json") - 1
            && ngx_strncmp(r->headers_out.content_type.data,
                           "application/json",
                           sizeof("application/json") - 1) == 0))
    {
        if (ctx && r->headers_out.status >= NGX_HTTP_BAD_REQUEST) {
            code = ctx->error_code;

        } else {
            ngx_str_null(&code);
        }

        ngx_http_hermes_registry_answered(hlcf->shm_zone->data,
                                          r->headers_out.status, &code);

        return ngx_http_next_header_filter(r);
    }

    switch (r->headers_out.status) {

    case NGX_HTTP_NOT_ALLOWED:
        ngx_str_set(&code, "method_not_allowed");
        ngx_str_set(&message, "this method is not allowed here");
        break;

    case NGX_HTTP_REQUEST_ENTITY_TOO_LARGE:
        ngx_str_set(&code, "body_too_large");
        ngx_str_set(&message, "the body is over client_max_body_size");
        break;

    case NGX_HTTP_REQUEST_TIME_OUT:
        ngx_str_set(&code, "request_timeout");
        ngx_str_set(&message, "the request was not received in time");
        break;

    case NGX_HTTP_BAD_REQUEST:
        ngx_str_set(&code, "bad_request");
        ngx_str_set(&message, "the HTTP request is malformed");
        break;

    case NGX_HTTP_UNAUTHORIZED:
        /* auth_basic, auth_request: WWW-Authenticate stays as it was */
        ngx_str_set(&code, "unauthorized");
        ngx_str_set(&message, "this location needs credentials: none were "
                              "sent, or they were refused");
        break;

    case NGX_HTTP_FORBIDDEN:
        ngx_str_set(&code, "forbidden");
        ngx_str_set(&message, "this location refuses this client (deny, "
                              "auth_request)");
        break;

    case NGX_HTTP_INTERNAL_SERVER_ERROR:
        ngx_str_set(&code, "internal_error");
        ngx_str_set(&message, "the server failed to answer this request: "
                              "see its error.log");
        break;

    default:
        p = ngx_pnalloc(r->pool, sizeof("http_") - 1 + NGX_INT_T_LEN);
        if (p == NULL) {
            return NGX_ERROR;
        }

        code.data = p;
        code.len = ngx_sprintf(p, "http_%ui", r->headers_out.status) - p;

        ngx_str_set(&message, "the server could not answer this request");
        break;
    }

    ctx = ngx_http_hermes_response_ctx(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    ctx->error_code = code;

    ctx->error_body = ngx_http_hermes_json_error(r->pool, &code, &message);
    if (ctx->error_body == NULL) {
        return NGX_ERROR;
    }

    ngx_http_hermes_registry_answered(hlcf->shm_zone->data,
                                      r->headers_out.status, &code);

    ngx_str_set(&r->headers_out.content_type, "application/json");
    r->headers_out.content_type_len = r->headers_out.content_type.len;
    r->headers_out.content_type_lowcase = NULL;
    r->headers_out.charset.len = 0;

    ngx_http_clear_content_length(r);
    r->headers_out.content_length_n = ctx->error_body->last
                                      - ctx->error_body->pos;

    return ngx_http_next_header_filter(r);
}


static ngx_int_t
ngx_http_hermes_response_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_chain_t             out, *cl;
    ngx_http_hermes_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_hermes_module);

    if (ctx == NULL || ctx->error_body == NULL) {
        return ngx_http_next_body_filter(r, in);
    }

    /* nginx's own page is dropped */

    for (cl = in; cl; cl = cl->next) {
        cl->buf->pos = cl->buf->last;
        cl->buf->file_pos = cl->buf->file_last;
    }

    if (ctx->error_sent) {
        return ngx_http_next_body_filter(r, NULL);
    }

    ctx->error_sent = 1;

    ctx->error_body->last_buf = 1;
    ctx->error_body->last_in_chain = 1;

    out.buf = ctx->error_body;
    out.next = NULL;

    return ngx_http_next_body_filter(r, &out);
}


ngx_int_t
ngx_http_hermes_response_filter_init(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_hermes_response_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_hermes_response_body_filter;

    return NGX_OK;
}


ngx_http_hermes_ctx_t *
ngx_http_hermes_response_ctx(ngx_http_request_t *r)
{
    ngx_http_hermes_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_hermes_module);

    if (ctx == NULL) {
        ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_hermes_ctx_t));
        if (ctx == NULL) {
            return NULL;
        }

        ctx->cell_status = -1;

        ngx_http_set_ctx(r, ctx, ngx_http_hermes_module);
    }

    return ctx;
}


/*
 * A cell takes the request over: the client may go away while the cell
 * runs on (the cleanup lets the response know), and the write handler
 * finds the response through the request's context.
 */

ngx_int_t
ngx_http_hermes_response_attach(ngx_http_hermes_response_t *rs,
    ngx_http_request_t *r)
{
    rs->cln = ngx_http_cleanup_add(r, 0);
    if (rs->cln == NULL) {
        return NGX_ERROR;
    }

    rs->ctx = ngx_http_hermes_response_ctx(r);
    if (rs->ctx == NULL) {
        return NGX_ERROR;
    }

    rs->cln->handler = ngx_http_hermes_response_detach;
    rs->cln->data = rs;
    rs->r = r;
    rs->ctx->response = rs;
    rs->answer = rs->ctx->answer;
    rs->answer_data = rs->ctx->answer_data;

    /* the client may go away; the cell runs on regardless */
    r->read_event_handler = ngx_http_test_reading;

    return NGX_OK;
}


/* the cell is over: the request, if still here, was finalized */

void
ngx_http_hermes_response_release(ngx_http_hermes_response_t *rs)
{
    if (rs->ctx) {
        rs->ctx->response = NULL;
    }

    if (rs->cln) {
        rs->cln->handler = NULL;
    }

    rs->r = NULL;
    rs->ctx = NULL;
    rs->cln = NULL;
}


static void
ngx_http_hermes_response_detach(void *data)
{
    ngx_http_hermes_response_t *rs = data;

    /* the buffers and the context were the request's */

    rs->r = NULL;
    rs->cln = NULL;
    rs->ctx = NULL;
    rs->free = NULL;
    rs->busy = NULL;
    rs->out = NULL;

    if (rs->gone) {
        rs->gone(rs->data);
    }
}


/* the kernel line: the cell is on its kernel, the stream starts */

ngx_int_t
ngx_http_hermes_response_kernel(ngx_http_hermes_response_t *rs,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_request_t *req)
{
    ngx_buf_t  *b;

    if (rs->ctx) {
        ngx_memcpy(rs->ctx->kernel_id, ref->kernel_id,
                   NGX_HTTP_HERMES_ID_LEN);
        rs->ctx->has_kernel = 1;
    }

    if (rs->json) {
        return NGX_OK;
    }

    if (ngx_http_hermes_response_header(rs) != NGX_OK || rs->r == NULL
        || rs->answer)
    {
        return NGX_OK;
    }

    b = ngx_create_temp_buf(rs->r->pool, 512);
    if (b == NULL) {
        return NGX_ERROR;
    }

    b->last = ngx_sprintf(b->last,
                  "{\"type\":\"kernel\",\"session\":\"%V\","
                  "\"kernel_id\":\"%*s\",\"cell\":%uD,\"reused\":%s,"
                  "\"execution_count\":%uD,\"state_lost\":%s,",
                  &req->session,
                  (size_t) NGX_HTTP_HERMES_ID_LEN, ref->kernel_id,
                  ref->cell_id,
                  ref->reused ? "true" : "false",
                  ref->execution_count + 1,
                  ref->state_lost ? "true" : "false");

    if (ref->state_lost && ref->lost_reason) {
        b->last = ngx_sprintf(b->last, "\"lost_reason\":\"%V\",",
                              &ngx_http_hermes_lost_names[ref->lost_reason]);
    }

    b->last = ngx_sprintf(b->last, "\"state_reset\":%s}\n",
                          req->reset ? "true" : "false");
    b->flush = 1;

    (void) ngx_http_hermes_response_send(rs, b);

    return NGX_OK;
}


/*
 * Event lines, copied into the request's buffers and sent (or given to
 * the answer's protocol, which writes what it makes of them).  NGX_AGAIN:
 * the client has not taken them yet; "drained" says when it has.
 */

ngx_int_t
ngx_http_hermes_response_output(ngx_http_hermes_response_t *rs, u_char *p,
    size_t n)
{
    if (rs->r == NULL || rs->json) {
        return NGX_OK;
    }

    if (rs->answer) {
        if (rs->answer->output(rs, p, n) != NGX_OK) {
            return NGX_ERROR;
        }

        return ngx_http_hermes_response_push(rs);
    }

    if (n) {
        rs->mid_line = (p[n - 1] != '\n');
    }

    if (ngx_http_hermes_response_write(rs, p, n) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_hermes_response_push(rs);
}


/* bytes copied into the request's reused buffers, sent at the next push */

ngx_int_t
ngx_http_hermes_response_write(ngx_http_hermes_response_t *rs, u_char *p,
    size_t n)
{
    size_t        k;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    if (rs->r == NULL) {
        return NGX_OK;
    }

    if (rs->out == NULL) {
        rs->last_out = &rs->out;
    }

    while (n) {
        cl = ngx_chain_get_free_buf(rs->r->pool, &rs->free);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        b = cl->buf;

        if (b->start == NULL) {
            b->start = ngx_palloc(rs->r->pool, NGX_HTTP_HERMES_OUT_CHUNK);
            if (b->start == NULL) {
                return NGX_ERROR;
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

        *rs->last_out = cl;
        rs->last_out = &cl->next;
        cl->next = NULL;
    }

    return NGX_OK;
}


/* what was written goes out; NGX_AGAIN: the client has not taken it yet */

ngx_int_t
ngx_http_hermes_response_push(ngx_http_hermes_response_t *rs)
{
    ngx_chain_t  *cl, *out;

    if (rs->r == NULL || rs->out == NULL) {
        return (rs->r && rs->busy) ? NGX_AGAIN : NGX_OK;
    }

    out = rs->out;
    rs->out = NULL;

    for (cl = out; cl->next; cl = cl->next) { /* void */ }
    cl->buf->flush = 1;

    if (ngx_http_hermes_response_send_chain(rs, out) == NGX_ERROR) {
        /* the client is gone: nobody waits for more */
        return NGX_OK;
    }

    return rs->busy ? NGX_AGAIN : NGX_OK;
}


/* the result line starts a line of its own, whatever the cell's output */

void
ngx_http_hermes_response_end_line(ngx_http_hermes_response_t *rs)
{
    ngx_buf_t  *b;

    if (!rs->mid_line || rs->r == NULL || rs->answer) {
        return;
    }

    b = ngx_calloc_buf(rs->r->pool);
    if (b == NULL) {
        return;
    }

    b->pos = (u_char *) "\n";
    b->last = b->pos + 1;
    b->memory = 1;
    b->flush = 1;

    rs->mid_line = 0;

    (void) ngx_http_hermes_response_send(rs, b);
}


/*
 * A line in a silent stretch of the stream, so that proxies with idle
 * timeouts keep it: never mid-line, never past what the client has not
 * taken yet.
 */

void
ngx_http_hermes_response_heartbeat(ngx_http_hermes_response_t *rs)
{
    ngx_buf_t  *b;

    if (rs->r == NULL || rs->json || !rs->header_sent || rs->mid_line
        || rs->busy)
    {
        return;
    }

    b = ngx_calloc_buf(rs->r->pool);
    if (b == NULL) {
        return;
    }

    if (rs->answer) {
        b->pos = rs->answer->heartbeat.data;
        b->last = b->pos + rs->answer->heartbeat.len;

    } else {
        b->pos = (u_char *) "{\"type\":\"heartbeat\"}\n";
        b->last = b->pos + sizeof("{\"type\":\"heartbeat\"}\n") - 1;
    }

    b->memory = 1;
    b->flush = 1;

    (void) ngx_http_hermes_response_send(rs, b);
}


/* the result: the stream's last line, or the one JSON answer */

void
ngx_http_hermes_response_result(ngx_http_hermes_response_t *rs,
    ngx_http_hermes_result_t *res, ngx_http_hermes_kernel_ref_t *ref,
    ngx_http_hermes_request_t *req)
{
    ngx_int_t            rc;
    ngx_buf_t           *b;
    ngx_http_request_t  *r;

    r = rs->r;

    if (rs->ctx) {
        rs->ctx->cell_status = res->status;
        rs->ctx->cell_ms = res->duration;
        rs->ctx->state_lost = ref->state_lost;
        rs->ctx->lost_reason = ref->state_lost ? ref->lost_reason : 0;
    }

    if (r == NULL) {
        return;
    }

    if (rs->answer) {
        b = rs->answer->result(r, rs->answer_data, res, ref, req);

    } else {
        b = ngx_http_hermes_json_result(r->pool, res, ref, req, !rs->json,
                                        rs->json && rs->tool_message);
    }

    if (b == NULL) {
        ngx_http_finalize_request(r, NGX_ERROR);
        return;
    }

    if (rs->json) {
        r->headers_out.content_length_n = b->last - b->pos;
    }

    if (ngx_http_hermes_response_header(rs) != NGX_OK) {
        return;
    }

    b->last_buf = 1;
    b->last_in_chain = 1;

    rc = ngx_http_hermes_response_send(rs, b);

    /* the request may have gone with an error; if not, it ends here */

    if (rs->r) {
        ngx_http_finalize_request(rs->r, rc);
    }
}


/* an error before the stream started: status and a JSON error body */

void
ngx_http_hermes_response_error(ngx_http_hermes_response_t *rs,
    ngx_uint_t status, char *code, char *message)
{
    ngx_http_request_t  *r;

    r = rs->r;

    if (r && !rs->header_sent) {
        rs->header_sent = 1;
        ngx_http_finalize_request(r,
              ngx_http_hermes_response_send_error(r, status, code, message));
    }
}


/* the status line and headers of a cell's answer, once */

ngx_int_t
ngx_http_hermes_response_header(ngx_http_hermes_response_t *rs)
{
    ngx_int_t            rc;
    ngx_http_request_t  *r;

    r = rs->r;

    if (r == NULL || rs->header_sent) {
        return NGX_OK;
    }

    rs->header_sent = 1;

    r->headers_out.status = NGX_HTTP_OK;

    if (rs->answer) {
        r->headers_out.content_type = rs->answer->content_type;
        r->headers_out.content_length_n = -1;

    } else if (rs->json) {
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
ngx_http_hermes_response_send(ngx_http_hermes_response_t *rs, ngx_buf_t *b)
{
    ngx_chain_t  *cl;

    if (rs->r == NULL) {
        return NGX_OK;
    }

    cl = ngx_alloc_chain_link(rs->r->pool);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf = b;
    cl->next = NULL;

    return ngx_http_hermes_response_send_chain(rs, cl);
}


/* out: links and buffers from the request's pool */

static ngx_int_t
ngx_http_hermes_response_send_chain(ngx_http_hermes_response_t *rs,
    ngx_chain_t *out)
{
    ngx_int_t                  rc;
    ngx_event_t               *wev;
    ngx_http_request_t        *r;
    ngx_http_core_loc_conf_t  *clcf;

    r = rs->r;

    if (r == NULL) {
        return NGX_OK;
    }

    rc = ngx_http_output_filter(r, out);

    ngx_chain_update_chains(r->pool, &rs->free, &rs->busy, &out,
                            (ngx_buf_tag_t) &ngx_http_hermes_module);

    if (rc == NGX_ERROR) {
        /* the client is gone; the cell goes on without it */
        ngx_http_finalize_request(r, NGX_ERROR);
        return NGX_ERROR;
    }

    if (rc == NGX_AGAIN) {
        /* the client's socket is full: wait until it can take more */

        r->write_event_handler = ngx_http_hermes_response_write_handler;

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


/*
 * A write event of an answer sent piece by piece: what waits goes out.
 * NGX_OK once the client took it all, NGX_AGAIN while it waits (the
 * send_timeout timer and the write event armed), NGX_ERROR when the
 * request was finalized (an error, the client timed out).
 */

ngx_int_t
ngx_http_hermes_response_flush(ngx_http_request_t *r)
{
    ngx_event_t               *wev;
    ngx_connection_t          *c;
    ngx_http_core_loc_conf_t  *clcf;

    c = r->connection;
    wev = c->write;

    if (wev->timedout) {
        c->timedout = 1;
        ngx_http_finalize_request(r, NGX_HTTP_REQUEST_TIME_OUT);
        return NGX_ERROR;
    }

    if (ngx_http_output_filter(r, NULL) == NGX_ERROR) {
        ngx_http_finalize_request(r, NGX_ERROR);
        return NGX_ERROR;
    }

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (c->buffered) {
        if (!wev->delayed) {
            ngx_add_timer(wev, clcf->send_timeout);
        }

        if (ngx_handle_write_event(wev, clcf->send_lowat) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_ERROR);
            return NGX_ERROR;
        }

        return NGX_AGAIN;
    }

    if (wev->timer_set) {
        ngx_del_timer(wev);
    }

    return NGX_OK;
}


static void
ngx_http_hermes_response_write_handler(ngx_http_request_t *r)
{
    ngx_int_t                    rc;
    ngx_chain_t                 *out;
    ngx_http_hermes_ctx_t       *ctx;
    ngx_http_hermes_response_t  *rs;

    rc = ngx_http_hermes_response_flush(r);

    if (rc == NGX_ERROR) {
        return;
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_hermes_module);
    rs = ctx ? ctx->response : NULL;

    if (rs) {
        out = NULL;
        ngx_chain_update_chains(r->pool, &rs->free, &rs->busy, &out,
                                (ngx_buf_tag_t) &ngx_http_hermes_module);
    }

    if (rc == NGX_AGAIN) {
        return;
    }

    /* the client took it all: read on */

    if (rs && rs->busy == NULL && rs->drained) {
        rs->drained(rs->data);
    }
}
