
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: HTTP handlers.  The execute endpoint reads and checks the
 * request, then hands it to a cell (ngx_hermes_cell.c); the kernels and
 * status endpoints answer from the registry.  What is written back is
 * ngx_hermes_response.c's.
 */


#include "ngx_hermes.h"

#include <sodium.h>


/*
 * The owner of every caller where hermes_owner is unset.  Owners with a
 * control character are refused, so no variable can name this one.
 */
#define NGX_HTTP_HERMES_OWNER_NONE  "\001anonymous"


/* one media type or media range of a Content-Type or Accept header */

typedef struct {
    ngx_str_t                    type;
    ngx_str_t                    subtype;
    ngx_str_t                    charset;
    ngx_uint_t                   q;         /* in thousandths */
} ngx_http_hermes_media_t;


/* what a request to the kernels location is for, by its path */

typedef enum {
    NGX_HTTP_HERMES_ROUTE_LIST = 0,     /* <loc>, <loc>/ */
    NGX_HTTP_HERMES_ROUTE_KERNEL,       /* <loc>/SESSION */
    NGX_HTTP_HERMES_ROUTE_INTERRUPT,    /* <loc>/SESSION/interrupt */
    NGX_HTTP_HERMES_ROUTE_CELL,         /* <loc>/SESSION/cells/ID */
    NGX_HTTP_HERMES_ROUTE_FILE          /* <loc>/SESSION/files/PATH */
} ngx_http_hermes_route_e;


static ngx_int_t ngx_http_hermes_session(ngx_http_request_t *r,
    ngx_http_hermes_request_t *req, ngx_int_t *rc);
static void ngx_http_hermes_execute_body(ngx_http_request_t *r);
static void ngx_http_hermes_read_body_handler(ngx_http_request_t *r);
static ngx_http_hermes_ctx_t *ngx_http_hermes_variable_ctx(
    ngx_http_request_t *r, ngx_http_variable_value_t *v);
static ngx_int_t ngx_http_hermes_variable_set(ngx_http_variable_value_t *v,
    u_char *data, size_t len);
static ngx_int_t ngx_http_hermes_variable_str(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_hermes_variable_kernel_id(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_hermes_variable_cell_status(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_hermes_variable_msec(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, ngx_msec_t ms);
static ngx_int_t ngx_http_hermes_variable_cell_ms(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_hermes_variable_queue_ms(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_hermes_variable_lost_reason(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static u_char *ngx_http_hermes_media_type(u_char *p, u_char *last,
    ngx_http_hermes_media_t *m);
static ngx_uint_t ngx_http_hermes_accepts_json(ngx_http_request_t *r);
static ngx_int_t ngx_http_hermes_kernels_path(ngx_http_request_t *r,
    ngx_str_t *session, ngx_http_hermes_route_e *route, ngx_str_t *rest,
    ngx_int_t *rc);
static ngx_int_t ngx_http_hermes_kernels_list(ngx_http_request_t *r,
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner);
static ngx_int_t ngx_http_hermes_kernel_delete(ngx_http_request_t *r,
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner, ngx_str_t *session);
static ngx_int_t ngx_http_hermes_kernel_cell(ngx_http_request_t *r,
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner, ngx_str_t *session,
    ngx_str_t *path);
static ngx_int_t ngx_http_hermes_kernel_interrupt_cell(ngx_http_request_t *r,
    ngx_str_t *owner, ngx_str_t *session);
static ngx_int_t ngx_http_hermes_kernel_get(ngx_http_request_t *r,
    ngx_str_t *owner, ngx_str_t *session);


ngx_int_t
ngx_http_hermes_execute_handler(ngx_http_request_t *r)
{
    ngx_int_t               rc;
    ngx_http_hermes_ctx_t  *ctx;

    if (r->method != NGX_HTTP_POST) {
        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        if (ngx_http_hermes_response_add_header(r, "Allow", "POST") != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_hermes_response_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                                   "method_not_allowed",
                                                   "use POST with a JSON body");
    }

    if (!ngx_http_hermes_content_is_json(r)) {
        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        return ngx_http_hermes_response_send_error(r,
                                    NGX_HTTP_UNSUPPORTED_MEDIA_TYPE,
                                    "unsupported_media_type",
                                    "the body must be application/json");
    }

    ctx = ngx_http_hermes_response_ctx(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    r->request_body_in_single_buf = 1;

    rc = ngx_http_read_client_request_body(r, ngx_http_hermes_execute_body);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    if (rc == NGX_AGAIN) {
        ctx->read_body = r->read_event_handler;
        r->read_event_handler = ngx_http_hermes_read_body_handler;
    }

    return NGX_DONE;
}


/*
 * While the body is read: at client_body_timeout nginx closes the
 * connection without a word; the client gets a JSON 408 instead.
 */

static void
ngx_http_hermes_read_body_handler(ngx_http_request_t *r)
{
    ngx_connection_t       *c;
    ngx_http_hermes_ctx_t  *ctx;

    c = r->connection;
    ctx = ngx_http_get_module_ctx(r, ngx_http_hermes_module);

    if (!c->read->timedout) {
        ctx->read_body(r);
        return;
    }

    ngx_log_error(NGX_LOG_INFO, c->log, NGX_ETIMEDOUT, "client timed out");

    c->read->timedout = 0;
    r->read_event_handler = ngx_http_block_reading;
    r->keepalive = 0;
    r->lingering_close = 0;

    ngx_http_finalize_request(r,
                  ngx_http_hermes_response_send_error(r,
                                                      NGX_HTTP_REQUEST_TIME_OUT,
                                                      "request_timeout",
                                                      "the body was not "
                                                      "received within "
                                                      "client_body_timeout"));
}


static void
ngx_http_hermes_execute_body(ngx_http_request_t *r)
{
    u_char                      *body;
    size_t                       len;
    ngx_int_t                    rc;
    ngx_str_t                    owner, code, message;
    ngx_uint_t                   status;
    ngx_http_hermes_ctx_t       *ctx;
    ngx_http_hermes_request_t    req;
    ngx_http_hermes_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    if (ngx_http_hermes_owner(r, &owner, &rc) != NGX_OK) {
        ngx_http_finalize_request(r, rc);
        return;
    }

    body = ngx_http_hermes_read_body(r, &len);
    if (body == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    rc = ngx_http_hermes_json_parse_request(r->pool, body, len, &req,
                                            hlcf->max_code, &code, &message,
                                            &status);
    if (rc == NGX_ERROR) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    req.json_answer = ngx_http_hermes_accepts_json(r);

    if (req.envelope != NGX_HTTP_HERMES_ENVELOPE_NONE && req.json_answer) {
        /* from here on, errors are answers the model reads */
        ctx = ngx_http_hermes_response_ctx(r);
        if (ctx == NULL) {
            ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
            return;
        }

        ctx->envelope = req.envelope;
        ctx->tool_call_id = req.tool_call_id;
    }

    if (rc == NGX_DECLINED) {
        ngx_http_finalize_request(r,
                        ngx_http_hermes_response_send_error(r, status,
                                                   (char *) code.data,
                                                   (char *) message.data));
        return;
    }

    if (ngx_http_hermes_session(r, &req, &rc) != NGX_OK) {
        ngx_http_finalize_request(r, rc);
        return;
    }

    if (req.timeout > hlcf->cell_timeout) {
        ngx_http_finalize_request(r,
                ngx_http_hermes_response_send_error(r, NGX_HTTP_BAD_REQUEST,
                                                    "invalid_request",
                                                    "\"timeout\" is over this "
                                                    "location's "
                                                    "hermes_cell_timeout"));
        return;
    }

    if (ngx_http_hermes_environment_pick(hlcf, &req.environment, &req.env)
        != NGX_OK)
    {
        ngx_http_finalize_request(r,
                ngx_http_hermes_response_send_error(r, NGX_HTTP_BAD_REQUEST,
                                                    "invalid_environment",
                                                    "this location does not "
                                                    "allow that environment "
                                                    "(hermes_environments)"));
        return;
    }

    req.json_answer = ngx_http_hermes_accepts_json(r);

    rc = ngx_http_hermes_cell_start(r, &req, &owner);

    if (rc != NGX_DONE) {
        ngx_http_finalize_request(r, rc);
    }
}


/*
 * Who the caller is.  NGX_DECLINED: none that may be taken: the request
 * ends with *rc, its answer under way or an error status.
 */

ngx_int_t
ngx_http_hermes_owner(ngx_http_request_t *r, ngx_str_t *owner, ngx_int_t *rc)
{
    u_char                      *p, *last;
    uint32_t                     u;
    ngx_http_hermes_ctx_t       *ctx;
    ngx_http_hermes_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    if (hlcf->owner == NULL) {
        ngx_str_set(owner, NGX_HTTP_HERMES_OWNER_NONE);
        return NGX_OK;
    }

    if (ngx_http_complex_value(r, hlcf->owner, owner) != NGX_OK) {
        *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        return NGX_DECLINED;
    }

    if (owner->len == 0) {
        *rc = ngx_http_hermes_response_send_error(r, NGX_HTTP_UNAUTHORIZED,
                                         "unauthorized",
                                         "no owner for this request");
        return NGX_DECLINED;
    }

    if (owner->len > NGX_HTTP_HERMES_OWNER_MAX) {
        *rc = ngx_http_hermes_response_send_error(r, NGX_HTTP_BAD_REQUEST,
                                         "invalid_owner",
                                         "the owner is over 128 bytes");
        return NGX_DECLINED;
    }

    /* it goes into JSON (status, headers of tool calls): strict UTF-8 */

    p = owner->data;
    last = p + owner->len;

    while (p < last) {
        if (*p >= 0x80) {
            u = ngx_utf8_decode(&p, last - p);

            if (u <= 0x10ffff && (u < 0xd800 || u > 0xdfff)) {
                continue;
            }

            *rc = ngx_http_hermes_response_send_error(r, NGX_HTTP_BAD_REQUEST,
                                             "invalid_owner",
                                             "the owner is not valid UTF-8");
            return NGX_DECLINED;
        }

        if (*p < 0x20 || *p == 0x7f) {
            *rc = ngx_http_hermes_response_send_error(r, NGX_HTTP_BAD_REQUEST,
                                             "invalid_owner",
                                             "the owner has a control "
                                             "character");
            return NGX_DECLINED;
        }

        p++;
    }

    /* $hermes_owner */

    ctx = ngx_http_hermes_response_ctx(r);
    if (ctx == NULL) {
        *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        return NGX_DECLINED;
    }

    ctx->owner = *owner;

    return NGX_OK;
}


/*
 * The session: the body's, or hermes_session's (a header, a URL capture)
 * so that a router can see it; when both name one, they must agree.  A
 * request that names none, or says "ephemeral", runs in a one-shot
 * kernel of a session made up for it.  NGX_DECLINED: none it may run in:
 * the request ends with *rc, its answer under way or an error status.
 */

static ngx_int_t
ngx_http_hermes_session(ngx_http_request_t *r,
    ngx_http_hermes_request_t *req, ngx_int_t *rc)
{
    u_char                       id[NGX_HTTP_HERMES_ID_LEN / 2];
    ngx_str_t                    s;
    ngx_http_hermes_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    ngx_str_null(&s);

    if (hlcf->session) {
        if (ngx_http_complex_value(r, hlcf->session, &s) != NGX_OK) {
            *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
            return NGX_DECLINED;
        }

        if (!ngx_http_hermes_json_session_valid(&s)) {
            *rc = ngx_http_hermes_response_send_error(r, NGX_HTTP_BAD_REQUEST,
                                                      "invalid_session",
                                                      "hermes_session must be "
                                                      "1-128 characters of "
                                                      "[A-Za-z0-9._:-]");
            return NGX_DECLINED;
        }

        if (req->session.len
            && (req->session.len != s.len
                || ngx_strncmp(req->session.data, s.data, s.len) != 0))
        {
            *rc = ngx_http_hermes_response_send_error(r, NGX_HTTP_BAD_REQUEST,
                                                      "session_mismatch",
                                                      "the body names another "
                                                      "session than "
                                                      "hermes_session");
            return NGX_DECLINED;
        }

        req->session = s;
    }

    if (req->ephemeral && req->session.len) {
        *rc = ngx_http_hermes_response_send_error(r, NGX_HTTP_BAD_REQUEST,
                                                  "invalid_request",
                                                  "an ephemeral cell has no "
                                                  "session");
        return NGX_DECLINED;
    }

    if (req->session.len) {
        return NGX_OK;
    }

    /* one-shot: a session no one can name twice */

    req->session.data = ngx_pnalloc(r->pool, sizeof("oneshot-") - 1
                                             + NGX_HTTP_HERMES_ID_LEN + 1);
    if (req->session.data == NULL) {
        *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        return NGX_DECLINED;
    }

    randombytes_buf(id, sizeof(id));

    req->session.len = ngx_sprintf(req->session.data, "oneshot-%*xs",
                                   sizeof(id), id)
                       - req->session.data;
    req->ephemeral = 1;

    return NGX_OK;
}


/* the body in one piece, NUL-terminated, from memory or its temp file */

u_char *
ngx_http_hermes_read_body(ngx_http_request_t *r, size_t *len)
{
    u_char       *p, *body;
    size_t        size;
    ssize_t       n;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    size = 0;

    if (r->request_body) {
        for (cl = r->request_body->bufs; cl; cl = cl->next) {
            size += ngx_buf_size(cl->buf);
        }
    }

    body = ngx_pnalloc(r->pool, size + 1);
    if (body == NULL) {
        return NULL;
    }

    p = body;

    for (cl = r->request_body ? r->request_body->bufs : NULL;
         cl;
         cl = cl->next)
    {
        b = cl->buf;

        if (b->in_file) {
            n = ngx_read_file(b->file, p, b->file_last - b->file_pos,
                              b->file_pos);
            if (n != b->file_last - b->file_pos) {
                return NULL;
            }

            p += n;
            continue;
        }

        p = ngx_cpymem(p, b->pos, b->last - b->pos);
    }

    *p = '\0';
    *len = p - body;

    return body;
}


/* RFC 9110 token characters */

static ngx_uint_t
ngx_http_hermes_tchar(u_char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
           || (c >= '0' && c <= '9')
           || (c != '\0' && ngx_strchr("!#$%&'*+-.^_`|~", c) != NULL);
}


static u_char *
ngx_http_hermes_token(u_char *p, u_char *last, ngx_str_t *token)
{
    token->data = p;

    while (p < last && ngx_http_hermes_tchar(*p)) {
        p++;
    }

    token->len = p - token->data;

    return p;
}


static u_char *
ngx_http_hermes_ows(u_char *p, u_char *last)
{
    while (p < last && (*p == ' ' || *p == '\t')) {
        p++;
    }

    return p;
}


/* "0", "0.5", "1.000": thousandths, or NGX_ERROR */

static ngx_int_t
ngx_http_hermes_qvalue(ngx_str_t *v)
{
    ngx_int_t   q, scale;
    ngx_uint_t  i;

    if (v->len == 0 || v->len > 5 || (v->data[0] != '0' && v->data[0] != '1')
        || (v->len > 1 && v->data[1] != '.'))
    {
        return NGX_ERROR;
    }

    q = (v->data[0] - '0') * 1000;

    for (i = 2, scale = 100; i < v->len; i++, scale /= 10) {
        if (v->data[i] < '0' || v->data[i] > '9') {
            return NGX_ERROR;
        }

        q += (v->data[i] - '0') * scale;
    }

    return (q > 1000) ? NGX_ERROR : q;
}


/*
 * One media type (or range) at p:
 *     type "/" subtype *( OWS ";" OWS [ name "=" ( token / quoted ) ] )
 * Returns where it ends (last, or a ","), NULL if it is malformed.
 */

static u_char *
ngx_http_hermes_media_type(u_char *p, u_char *last, ngx_http_hermes_media_t *m)
{
    u_char     *start;
    ngx_int_t   q;
    ngx_str_t   name, value;

    ngx_memzero(m, sizeof(ngx_http_hermes_media_t));
    m->q = 1000;

    p = ngx_http_hermes_token(ngx_http_hermes_ows(p, last), last, &m->type);

    if (m->type.len == 0 || p == last || *p++ != '/') {
        return NULL;
    }

    p = ngx_http_hermes_token(p, last, &m->subtype);

    if (m->subtype.len == 0) {
        return NULL;
    }

    for ( ;; ) {
        p = ngx_http_hermes_ows(p, last);

        if (p == last || *p == ',') {
            return p;
        }

        if (*p++ != ';') {
            return NULL;
        }

        p = ngx_http_hermes_ows(p, last);

        if (p == last || *p == ',' || *p == ';') {
            continue;
        }

        p = ngx_http_hermes_token(p, last, &name);

        if (name.len == 0 || p == last || *p++ != '=') {
            return NULL;
        }

        if (p < last && *p == '"') {
            start = ++p;

            while (p < last && *p != '"') {
                if (*p == '\\' && ++p == last) {
                    return NULL;
                }

                p++;
            }

            if (p == last) {
                return NULL;
            }

            value.data = start;
            value.len = p++ - start;

        } else {
            p = ngx_http_hermes_token(p, last, &value);

            if (value.len == 0) {
                return NULL;
            }
        }

        if (name.len == 1 && (name.data[0] | 0x20) == 'q') {
            q = ngx_http_hermes_qvalue(&value);
            if (q == NGX_ERROR) {
                return NULL;
            }

            m->q = q;

        } else if (name.len == 7
                   && ngx_strncasecmp(name.data, (u_char *) "charset", 7) == 0)
        {
            m->charset = value;
        }
    }
}


static ngx_uint_t
ngx_http_hermes_media_is(ngx_str_t *s, const char *name)
{
    size_t  len;

    len = ngx_strlen(name);

    return s->len == len
           && ngx_strncasecmp(s->data, (u_char *) name, len) == 0;
}


/*
 * Content-Type is application/json (any case, parameters allowed, a
 * charset only of utf-8), once.  A text/plain POST naming
 * application/json in a parameter is a cross-site form, not JSON.
 */

ngx_uint_t
ngx_http_hermes_content_is_json(ngx_http_request_t *r)
{
    u_char                   *p, *last;
    ngx_uint_t                i, n;
    ngx_list_part_t          *part;
    ngx_table_elt_t          *h, *ct;
    ngx_http_hermes_media_t   m;

    ct = NULL;
    n = 0;

    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].key.len == sizeof("Content-Type") - 1
            && ngx_strncasecmp(h[i].key.data, (u_char *) "Content-Type",
                               sizeof("Content-Type") - 1) == 0)
        {
            ct = &h[i];
            n++;
        }
    }

    if (n != 1) {
        return 0;
    }

    last = ct->value.data + ct->value.len;

    p = ngx_http_hermes_media_type(ct->value.data, last, &m);

    return p == last
           && ngx_http_hermes_media_is(&m.type, "application")
           && ngx_http_hermes_media_is(&m.subtype, "json")
           && (m.charset.len == 0
               || ngx_http_hermes_media_is(&m.charset, "utf-8"));
}


/*
 * The JSON answer if Accept prefers application/json to
 * application/x-ndjson: each gets the q of its most specific range
 * (RFC 9110 12.5.1); a tie streams.  A malformed Accept is ignored.
 */

static ngx_uint_t
ngx_http_hermes_accepts_json(ngx_http_request_t *r)
{
    u_char                   *p, *last;
    ngx_uint_t                i, k, rank;
    ngx_uint_t                best[2], q[2];
    ngx_list_part_t          *part;
    ngx_table_elt_t          *h;
    ngx_http_hermes_media_t   m;

    static const char        *subtypes[2] = { "json", "x-ndjson" };

    best[0] = 0;
    best[1] = 0;
    q[0] = 0;
    q[1] = 0;

    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].key.len != sizeof("Accept") - 1
            || ngx_strncasecmp(h[i].key.data, (u_char *) "Accept",
                               sizeof("Accept") - 1) != 0)
        {
            continue;
        }

        p = h[i].value.data;
        last = p + h[i].value.len;

        while (p < last) {
            p = ngx_http_hermes_ows(p, last);

            if (p < last && *p == ',') {
                p++;
                continue;
            }

            if (p == last) {
                break;
            }

            p = ngx_http_hermes_media_type(p, last, &m);
            if (p == NULL) {
                return 0;
            }

            for (k = 0; k < 2; k++) {
                if (ngx_http_hermes_media_is(&m.type, "*")) {
                    rank = ngx_http_hermes_media_is(&m.subtype, "*") ? 1 : 0;

                } else if (!ngx_http_hermes_media_is(&m.type, "application")) {
                    rank = 0;

                } else if (ngx_http_hermes_media_is(&m.subtype, "*")) {
                    rank = 2;

                } else {
                    rank = ngx_http_hermes_media_is(&m.subtype, subtypes[k])
                           ? 3 : 0;
                }

                if (rank > best[k]) {
                    best[k] = rank;
                    q[k] = m.q;
                }
            }
        }
    }

    return q[0] > 0 && q[0] > q[1];
}


/* "local"/"localhost", or "ssh" and the host, from the entry's backend tag */

void
ngx_http_hermes_name_backends(ngx_http_request_t *r, ngx_array_t *list)
{
    ngx_uint_t                       i, k;
    ngx_http_hermes_environment_t   *env;
    ngx_http_hermes_listing_t       *l;
    ngx_http_hermes_main_conf_t     *hmcf;
    ngx_http_hermes_backend_conf_t  *bcf;

    hmcf = ngx_http_get_module_main_conf(r, ngx_http_hermes_module);
    l = list->elts;

    for (i = 0; i < list->nelts; i++) {
        ngx_str_set(&l[i].backend_name, "local");
        ngx_str_set(&l[i].host_name, "localhost");
        ngx_str_null(&l[i].env_name);

        for (k = 0; l[i].env && k < hmcf->environments.nelts; k++) {
            env = ((ngx_http_hermes_environment_t **)
                   hmcf->environments.elts)[k];

            if (env->id == l[i].env) {
                l[i].env_name = env->name;
            }
        }

        bcf = ngx_http_hermes_backend_by_tag(hmcf, l[i].tag);

        if (bcf) {
            l[i].backend_name = bcf->ops->name;
            l[i].host_name = *ngx_http_hermes_backend_host_name(bcf,
                                                                l[i].host);
        }
    }
}


/*
 * The kernels location, by route: GET <loc> lists the caller's kernels;
 * GET <loc>/SESSION tells one, DELETE shuts it down; POST
 * <loc>/SESSION/interrupt interrupts its cell; <loc>/SESSION/cells/ID
 * streams a cell again and <loc>/SESSION/files/PATH moves a file.
 */

ngx_int_t
ngx_http_hermes_kernels_handler(ngx_http_request_t *r)
{
    ngx_int_t                    rc;
    ngx_str_t                    owner, session, rest;
    char                        *allow, *use;
    ngx_http_hermes_zone_t      *zone;
    ngx_http_hermes_route_e      route;
    ngx_http_hermes_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);
    zone = hlcf->shm_zone->data;

    if (ngx_http_hermes_kernels_path(r, &session, &route, &rest, &rc)
        != NGX_OK)
    {
        return rc;
    }

    switch (route) {

    case NGX_HTTP_HERMES_ROUTE_CELL:
        if (ngx_http_hermes_owner(r, &owner, &rc) != NGX_OK) {
            return rc;
        }

        return ngx_http_hermes_kernel_cell(r, zone, &owner, &session, &rest);

    case NGX_HTTP_HERMES_ROUTE_FILE:
        /* a PUT reads its body itself */

        if (ngx_http_hermes_owner(r, &owner, &rc) != NGX_OK) {
            return rc;
        }

        return ngx_http_hermes_files_handler(r, zone, &owner, &session,
                                             &rest);

    default:
        break;
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    if (route == NGX_HTTP_HERMES_ROUTE_INTERRUPT) {
        allow = (r->method & NGX_HTTP_POST) ? NULL : "POST";
        use = "use POST";

    } else {
        allow = (r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD|NGX_HTTP_DELETE))
                ? NULL : "GET, DELETE";
        use = "use GET or DELETE";
    }

    if (allow) {
        if (ngx_http_hermes_response_add_header(r, "Allow", (char *) allow)
            != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_hermes_response_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                                   "method_not_allowed", use);
    }

    if (ngx_http_hermes_owner(r, &owner, &rc) != NGX_OK) {
        return rc;
    }

    switch (route) {

    case NGX_HTTP_HERMES_ROUTE_INTERRUPT:
        return ngx_http_hermes_kernel_interrupt_cell(r, &owner, &session);

    case NGX_HTTP_HERMES_ROUTE_KERNEL:
        if (r->method & NGX_HTTP_DELETE) {
            return ngx_http_hermes_kernel_delete(r, zone, &owner, &session);
        }

        return ngx_http_hermes_kernel_get(r, &owner, &session);

    default: /* NGX_HTTP_HERMES_ROUTE_LIST */
        if (r->method & NGX_HTTP_DELETE) {
            return ngx_http_hermes_response_send_error(r, NGX_HTTP_BAD_REQUEST,
                                                   "invalid_session",
                                                   "DELETE <location>/SESSION");
        }

        return ngx_http_hermes_kernels_list(r, zone, &owner);
    }
}


/* GET <loc>: the caller's kernels */

static ngx_int_t
ngx_http_hermes_kernels_list(ngx_http_request_t *r,
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner)
{
    ngx_buf_t    *b;
    ngx_array_t   list;

    if (ngx_array_init(&list, r->pool, 8, sizeof(ngx_http_hermes_listing_t))
        != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_hermes_registry_list(zone, owner, &list) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_http_hermes_name_backends(r, &list);

    b = ngx_http_hermes_json_listing(r->pool, &list);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_hermes_response_send_buf(r, NGX_HTTP_OK,
                                             "application/json", b);
}


/* DELETE <loc>/SESSION[?force=1]: the caller's kernel shut down */

static ngx_int_t
ngx_http_hermes_kernel_delete(ngx_http_request_t *r,
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner, ngx_str_t *session)
{
    ngx_int_t                    rc;
    ngx_str_t                    value;
    ngx_uint_t                   force;
    ngx_http_hermes_victims_t    victims;
    ngx_http_hermes_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    force = (ngx_http_arg(r, (u_char *) "force", 5, &value) == NGX_OK
             && value.len == 1 && value.data[0] == '1');

    victims.n = 0;

    rc = ngx_http_hermes_registry_shutdown(zone, owner, session, force,
                                           &victims);

    ngx_http_hermes_kernel_kill_victims(hlcf->thread_pool, &victims,
                                        r->connection->log);

    switch (rc) {

    case NGX_OK:
        return ngx_http_hermes_response_send_buf(r, NGX_HTTP_NO_CONTENT,
                                                 "application/json", NULL);

    case NGX_BUSY:
        return ngx_http_hermes_response_send_error(r, NGX_HTTP_CONFLICT,
                                                   "cell_running",
                                                   "a cell is running on this "
                                                   "kernel; ?force=1 kills it "
                                                   "anyway");

    default:
        return ngx_http_hermes_response_send_error(r, NGX_HTTP_NOT_FOUND,
                                                   "not_found",
                                                   "no kernel of yours for "
                                                   "this session");
    }
}


/*
 * The route of a kernels request: <loc> or <loc>/ (LIST), <loc>/SESSION
 * (KERNEL), and below it /interrupt, /cells/ID and /files/PATH ("rest":
 * "cells/ID", or PATH).  Only a "/" right after the location's prefix
 * starts a session, so "/v1/kernelszz" is nothing.  A regex location has
 * no prefix: it only lists.  NGX_DECLINED: no such resource, or an
 * invalid session: the request ends with *rc, its answer under way.
 */

static ngx_int_t
ngx_http_hermes_kernels_path(ngx_http_request_t *r, ngx_str_t *session,
    ngx_http_hermes_route_e *route, ngx_str_t *rest, ngx_int_t *rc)
{
    u_char                    *p, *last;
    size_t                     len;
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    ngx_str_null(session);
    ngx_str_null(rest);
    *route = NGX_HTTP_HERMES_ROUTE_LIST;

#if (NGX_PCRE)
    if (clcf->regex) {
        return NGX_OK;
    }
#endif

    if (clcf->named) {
        return NGX_OK;
    }

    /* a prefix ending in "/" gives the "/" to the session */

    len = clcf->name.len;

    if (len && clcf->name.data[len - 1] == '/') {
        len--;
    }

    if (r->uri.len < len
        || ngx_strncmp(r->uri.data, clcf->name.data, len) != 0)
    {
        goto not_found;
    }

    p = r->uri.data + len;
    last = r->uri.data + r->uri.len;

    if (p == last) {
        return NGX_OK;
    }

    if (*p++ != '/') {
        goto not_found;
    }

    session->data = p;

    while (p < last && *p != '/') {
        p++;
    }

    session->len = p - session->data;

    if (session->len) {
        *route = NGX_HTTP_HERMES_ROUTE_KERNEL;
    }

    /* below a session: /interrupt, /cells/ID and /files/PATH */

    if (p != last) {
        if (session->len == 0) {
            goto not_found;
        }

        if ((size_t) (last - p) > sizeof("/files/") - 1
            && ngx_strncmp(p, "/files/", sizeof("/files/") - 1) == 0)
        {
            rest->data = p + sizeof("/files/") - 1;
            rest->len = last - rest->data;
            *route = NGX_HTTP_HERMES_ROUTE_FILE;

        } else if ((size_t) (last - p) > sizeof("/cells/") - 1
                   && ngx_strncmp(p, "/cells/", sizeof("/cells/") - 1) == 0)
        {
            rest->data = p + 1;
            rest->len = last - rest->data;
            *route = NGX_HTTP_HERMES_ROUTE_CELL;

        } else if ((size_t) (last - p) == sizeof("/interrupt") - 1
                   && ngx_strncmp(p, "/interrupt", sizeof("/interrupt") - 1)
                      == 0)
        {
            *route = NGX_HTTP_HERMES_ROUTE_INTERRUPT;

        } else {
            goto not_found;
        }
    }

    if (session->len && !ngx_http_hermes_json_session_valid(session)) {
        *rc = ngx_http_hermes_response_send_error(r, NGX_HTTP_BAD_REQUEST,
                    "invalid_session",
                    "the session must be 1-128 characters of [A-Za-z0-9._:-]");
        return NGX_DECLINED;
    }

    return NGX_OK;

not_found:

    *rc = ngx_http_hermes_response_send_error(r, NGX_HTTP_NOT_FOUND,
                                              "not_found", "no such resource");
    return NGX_DECLINED;
}


/* GET <loc>/SESSION/cells/ID?offset=N: the ID and the offset checked */

static ngx_int_t
ngx_http_hermes_kernel_cell(ngx_http_request_t *r, ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_str_t *session, ngx_str_t *path)
{
    off_t      offset;
    ngx_int_t  rc, id;
    ngx_str_t  value;

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    /* "cells/ID" */

    id = NGX_ERROR;

    if (path->len > sizeof("cells/") - 1
        && path->len <= sizeof("cells/") - 1 + 10)
    {
        id = ngx_atoi(path->data + sizeof("cells/") - 1,
                      path->len - (sizeof("cells/") - 1));
    }

    if (id == NGX_ERROR || id == 0 || id > 0xffffffff) {
        return ngx_http_hermes_response_send_error(r, NGX_HTTP_NOT_FOUND,
                                                   "not_found",
                                                   "a cell is named by its "
                                                   "id, a positive integer");
    }

    offset = 0;

    if (ngx_http_arg(r, (u_char *) "offset", 6, &value) == NGX_OK) {
        offset = value.len ? ngx_atoof(value.data, value.len) : NGX_ERROR;

        if (offset == NGX_ERROR) {
            return ngx_http_hermes_response_send_error(r,
                                                       NGX_HTTP_BAD_REQUEST,
                                                       "invalid_offset",
                                                       "offset is a number "
                                                       "of bytes, 0 or more");
        }
    }

    return ngx_http_hermes_resume_handler(r, zone, owner, session,
                                          (uint32_t) id, offset);
}


/*
 * POST <loc>/SESSION/interrupt: KeyboardInterrupt in the caller's running
 * cell of that session; the cell answers "interrupted" and the kernel
 * keeps its state.
 */

static ngx_int_t
ngx_http_hermes_kernel_interrupt_cell(ngx_http_request_t *r,
    ngx_str_t *owner, ngx_str_t *session)
{
    uint32_t                     cell;
    ngx_int_t                    rc;
    ngx_buf_t                   *b;
    ngx_http_hermes_zone_t      *zone;
    ngx_http_hermes_victim_t     v;
    ngx_http_hermes_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);
    zone = hlcf->shm_zone->data;

    rc = ngx_http_hermes_registry_running(zone, owner, session, &v, &cell);

    if (rc == NGX_DECLINED) {
        return ngx_http_hermes_response_send_error(r, NGX_HTTP_NOT_FOUND,
                                                   "not_found",
                                                   "no kernel of yours for "
                                                   "this session");
    }

    if (rc == NGX_OK) {
        rc = ngx_http_hermes_kernel_interrupt(&v, cell, r->connection->log);

        if (rc == NGX_ERROR) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    if (rc != NGX_OK) {
        return ngx_http_hermes_response_send_error(r, NGX_HTTP_CONFLICT,
                                                   "no_cell",
                                                   "no cell is running on this "
                                                   "session's kernel");
    }

    b = ngx_create_temp_buf(r->pool, 64);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = ngx_sprintf(b->last, "{\"interrupted\":true,\"cell\":%uD}\n",
                          cell);

    return ngx_http_hermes_response_send_buf(r, NGX_HTTP_ACCEPTED,
                                             "application/json", b);
}


/* GET <loc>/SESSION: that one kernel of the caller's */

static ngx_int_t
ngx_http_hermes_kernel_get(ngx_http_request_t *r, ngx_str_t *owner,
    ngx_str_t *session)
{
    ngx_buf_t                   *b;
    ngx_uint_t                   i;
    ngx_array_t                  list;
    ngx_http_hermes_listing_t   *l, *found;
    ngx_http_hermes_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    if (ngx_array_init(&list, r->pool, 8, sizeof(ngx_http_hermes_listing_t))
        != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_hermes_registry_list(hlcf->shm_zone->data, owner, &list)
        != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* the session's kernel on this location's backend, or on any */

    found = NULL;
    l = list.elts;

    for (i = 0; i < list.nelts; i++) {
        if (l[i].session.len != session->len
            || ngx_memcmp(l[i].session.data, session->data, session->len)
               != 0)
        {
            continue;
        }

        if (found == NULL
            || ngx_memcmp(l[i].tag, hlcf->backend->tag,
                          NGX_HTTP_HERMES_BACKEND_TAG_LEN) == 0)
        {
            found = &l[i];
        }
    }

    if (found == NULL) {
        return ngx_http_hermes_response_send_error(r, NGX_HTTP_NOT_FOUND,
                                                   "not_found",
                                                   "no kernel of yours for "
                                                   "this session");
    }

    *l = *found;
    list.nelts = 1;

    ngx_http_hermes_name_backends(r, &list);

    b = ngx_http_hermes_json_kernel(r->pool, l);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_hermes_response_send_buf(r, NGX_HTTP_OK, "application/json",
                                             b);
}


static ngx_http_variable_t  ngx_http_hermes_vars[] = {

    { ngx_string("hermes_session"), NULL, ngx_http_hermes_variable_str,
      offsetof(ngx_http_hermes_ctx_t, session), NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("hermes_kernel_id"), NULL,
      ngx_http_hermes_variable_kernel_id, 0, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("hermes_cell_status"), NULL,
      ngx_http_hermes_variable_cell_status, 0, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("hermes_cell_ms"), NULL, ngx_http_hermes_variable_cell_ms, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("hermes_owner"), NULL, ngx_http_hermes_variable_str,
      offsetof(ngx_http_hermes_ctx_t, owner), NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("hermes_queue_ms"), NULL, ngx_http_hermes_variable_queue_ms,
      0, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("hermes_lost_reason"), NULL,
      ngx_http_hermes_variable_lost_reason, 0, NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


ngx_int_t
ngx_http_hermes_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_http_hermes_vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


/* the request's ctx of ours, or NULL: the variable is not found */

static ngx_http_hermes_ctx_t *
ngx_http_hermes_variable_ctx(ngx_http_request_t *r,
    ngx_http_variable_value_t *v)
{
    v->not_found = 1;

    return ngx_http_get_module_ctx(r, ngx_http_hermes_module);
}


static ngx_int_t
ngx_http_hermes_variable_set(ngx_http_variable_value_t *v, u_char *data,
    size_t len)
{
    v->data = data;
    v->len = len;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    return NGX_OK;
}


/* $hermes_session, $hermes_owner: an ngx_str_t of the ctx, at "data" */

static ngx_int_t
ngx_http_hermes_variable_str(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_str_t              *s;
    ngx_http_hermes_ctx_t  *ctx;

    ctx = ngx_http_hermes_variable_ctx(r, v);

    if (ctx == NULL) {
        return NGX_OK;
    }

    s = (ngx_str_t *) ((char *) ctx + data);

    if (s->len == 0) {
        return NGX_OK;
    }

    return ngx_http_hermes_variable_set(v, s->data, s->len);
}


static ngx_int_t
ngx_http_hermes_variable_kernel_id(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_hermes_ctx_t  *ctx;

    ctx = ngx_http_hermes_variable_ctx(r, v);

    if (ctx == NULL || !ctx->has_kernel) {
        return NGX_OK;
    }

    return ngx_http_hermes_variable_set(v, ctx->kernel_id,
                                        NGX_HTTP_HERMES_ID_LEN);
}


static ngx_int_t
ngx_http_hermes_variable_cell_status(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_hermes_ctx_t  *ctx;

    ctx = ngx_http_hermes_variable_ctx(r, v);

    if (ctx == NULL || ctx->cell_status < 0) {
        return NGX_OK;
    }

    return ngx_http_hermes_variable_set(v,
                       ngx_http_hermes_cell_status_names[ctx->cell_status].data,
                       ngx_http_hermes_cell_status_names[ctx->cell_status].len);
}


static ngx_int_t
ngx_http_hermes_variable_msec(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, ngx_msec_t ms)
{
    u_char  *p;

    p = ngx_pnalloc(r->pool, NGX_INT_T_LEN);
    if (p == NULL) {
        return NGX_ERROR;
    }

    return ngx_http_hermes_variable_set(v, p, ngx_sprintf(p, "%M", ms) - p);
}


static ngx_int_t
ngx_http_hermes_variable_cell_ms(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_hermes_ctx_t  *ctx;

    ctx = ngx_http_hermes_variable_ctx(r, v);

    if (ctx == NULL || ctx->cell_status < 0) {
        return NGX_OK;
    }

    return ngx_http_hermes_variable_msec(r, v, ctx->cell_ms);
}


static ngx_int_t
ngx_http_hermes_variable_queue_ms(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_hermes_ctx_t  *ctx;

    ctx = ngx_http_hermes_variable_ctx(r, v);

    if (ctx == NULL || !ctx->has_queue) {
        return NGX_OK;
    }

    return ngx_http_hermes_variable_msec(r, v, ctx->queue_ms);
}


/* the kernel's state was lost before this cell; why comes later */

static ngx_int_t
ngx_http_hermes_variable_lost_reason(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_hermes_ctx_t  *ctx;

    ctx = ngx_http_hermes_variable_ctx(r, v);

    if (ctx == NULL || !ctx->state_lost) {
        return NGX_OK;
    }

    if (ctx->lost_reason == NGX_HTTP_HERMES_LOST_NONE) {
        return ngx_http_hermes_variable_set(v, (u_char *) "lost",
                                            sizeof("lost") - 1);
    }

    return ngx_http_hermes_variable_set(v,
                             ngx_http_hermes_lost_names[ctx->lost_reason].data,
                             ngx_http_hermes_lost_names[ctx->lost_reason].len);
}
