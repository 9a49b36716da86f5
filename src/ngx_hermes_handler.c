
/*
 * ngx_hermes: HTTP handlers.  The execute endpoint reads and checks the
 * request, then hands it to a cell (ngx_hermes_cell.c).  A filter turns
 * the errors nginx itself answers on our locations (413 of
 * client_max_body_size, 408, 500, ...) into our JSON error body.
 */


#include "ngx_hermes.h"


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;


static ngx_int_t ngx_http_hermes_owner(ngx_http_request_t *r,
    ngx_str_t *owner, ngx_int_t *rc);
static void ngx_http_hermes_execute_body(ngx_http_request_t *r);
static ngx_int_t ngx_http_hermes_send_buf(ngx_http_request_t *r,
    ngx_uint_t status, const char *type, ngx_buf_t *b);
static void ngx_http_hermes_name_backends(ngx_http_request_t *r,
    ngx_array_t *list);
static ngx_int_t ngx_http_hermes_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static u_char *ngx_http_hermes_read_body(ngx_http_request_t *r,
    size_t *len);
static ngx_int_t ngx_http_hermes_header_has(ngx_table_elt_t *h,
    const char *value);
static ngx_int_t ngx_http_hermes_add_header(ngx_http_request_t *r,
    char *key, char *value);


ngx_int_t
ngx_http_hermes_execute_handler(ngx_http_request_t *r)
{
    ngx_int_t          rc;
    ngx_table_elt_t   *ct;

    if (r->method != NGX_HTTP_POST) {
        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        if (ngx_http_hermes_add_header(r, "Allow", "POST") != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_hermes_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                          "method_not_allowed",
                                          "use POST with a JSON body");
    }

    ct = r->headers_in.content_type;

    if (ct == NULL || !ngx_http_hermes_header_has(ct, "application/json")) {
        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        return ngx_http_hermes_send_error(r,
                                    NGX_HTTP_UNSUPPORTED_MEDIA_TYPE,
                                    "unsupported_media_type",
                                    "the body must be application/json");
    }

    r->request_body_in_single_buf = 1;

    rc = ngx_http_read_client_request_body(r, ngx_http_hermes_execute_body);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


static void
ngx_http_hermes_execute_body(ngx_http_request_t *r)
{
    u_char                      *body;
    size_t                       len;
    ngx_int_t                    rc;
    ngx_str_t                    owner, code, message;
    ngx_uint_t                   status;
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

    if (rc == NGX_DECLINED) {
        ngx_http_finalize_request(r,
                        ngx_http_hermes_send_error(r, status,
                                                   (char *) code.data,
                                                   (char *) message.data));
        return;
    }

    if (req.timeout > hlcf->cell_timeout) {
        ngx_http_finalize_request(r,
                ngx_http_hermes_send_error(r, NGX_HTTP_BAD_REQUEST,
                                           "invalid_request",
                                           "\"timeout\" is over this "
                                           "location's hermes_cell_timeout"));
        return;
    }

    req.json_answer = (r->headers_in.accept
                       && ngx_http_hermes_header_has(r->headers_in.accept,
                                                     "application/json")
                       && !ngx_http_hermes_header_has(r->headers_in.accept,
                                                      "application/x-ndjson"));

    rc = ngx_http_hermes_cell_start(r, &req, &owner);

    if (rc != NGX_DONE) {
        ngx_http_finalize_request(r, rc);
    }
}


/*
 * Who the caller is.  NGX_DECLINED: there is none, the answer is under
 * way and *rc is what the handler returns for it.
 */

static ngx_int_t
ngx_http_hermes_owner(ngx_http_request_t *r, ngx_str_t *owner, ngx_int_t *rc)
{
    ngx_http_hermes_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    if (hlcf->owner == NULL) {
        ngx_str_set(owner, "anonymous");
        return NGX_OK;
    }

    if (ngx_http_complex_value(r, hlcf->owner, owner) != NGX_OK) {
        *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        return NGX_DECLINED;
    }

    if (owner->len == 0) {
        *rc = ngx_http_hermes_send_error(r, NGX_HTTP_UNAUTHORIZED,
                                         "unauthorized",
                                         "no owner for this request");
        return NGX_DECLINED;
    }

    if (owner->len > NGX_HTTP_HERMES_OWNER_MAX) {
        *rc = ngx_http_hermes_send_error(r, NGX_HTTP_BAD_REQUEST,
                                         "invalid_owner",
                                         "the owner is over 128 bytes");
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/* the body in one piece, NUL-terminated, from memory or its temp file */

static u_char *
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


static ngx_int_t
ngx_http_hermes_header_has(ngx_table_elt_t *h, const char *value)
{
    return ngx_strlcasestrn(h->value.data, h->value.data + h->value.len,
                            (u_char *) value, ngx_strlen(value) - 1)
           != NULL;
}


static ngx_int_t
ngx_http_hermes_add_header(ngx_http_request_t *r, char *key, char *value)
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
ngx_http_hermes_send_error(ngx_http_request_t *r, ngx_uint_t status,
    char *code, char *message)
{
    ngx_str_t    c, m;
    ngx_buf_t   *b;

    c.data = (u_char *) code;
    c.len = ngx_strlen(code);
    m.data = (u_char *) message;
    m.len = ngx_strlen(message);

    b = ngx_http_hermes_json_error(r->pool, &c, &m);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (status == NGX_HTTP_TOO_MANY_REQUESTS
        || status == NGX_HTTP_SERVICE_UNAVAILABLE)
    {
        if (ngx_http_hermes_add_header(r, "Retry-After", "1") != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    return ngx_http_hermes_send_buf(r, status, "application/json", b);
}


static ngx_int_t
ngx_http_hermes_send_buf(ngx_http_request_t *r, ngx_uint_t status,
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


/* errors nginx answers on a hermes location get the JSON error body too */

static ngx_int_t
ngx_http_hermes_error_header_filter(ngx_http_request_t *r)
{
    u_char                      *p;
    ngx_str_t                    code, message;
    ngx_http_hermes_ctx_t       *ctx;
    ngx_http_hermes_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    if (hlcf->handler == NGX_HTTP_HERMES_HANDLER_NONE
        || r != r->main
        || r->headers_out.status < NGX_HTTP_BAD_REQUEST
        || (r->headers_out.content_type.len >= sizeof("application/json") - 1
            && ngx_strncmp(r->headers_out.content_type.data,
                           "application/json",
                           sizeof("application/json") - 1) == 0))
    {
        return ngx_http_next_header_filter(r);
    }

    switch (r->headers_out.status) {

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

    ctx = ngx_http_hermes_get_ctx(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    ctx->error_body = ngx_http_hermes_json_error(r->pool, &code, &message);
    if (ctx->error_body == NULL) {
        return NGX_ERROR;
    }

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
ngx_http_hermes_error_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
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
ngx_http_hermes_filter_init(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_hermes_error_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_hermes_error_body_filter;

    return NGX_OK;
}


ngx_http_hermes_ctx_t *
ngx_http_hermes_get_ctx(ngx_http_request_t *r)
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


/* "local"/"localhost", or "ssh" and the host, from the entry's backend tag */

static void
ngx_http_hermes_name_backends(ngx_http_request_t *r, ngx_array_t *list)
{
    ngx_uint_t                        i, j;
    ngx_http_hermes_listing_t        *l;
    ngx_http_hermes_ssh_host_t      **hosts;
    ngx_http_hermes_main_conf_t      *hmcf;
    ngx_http_hermes_backend_conf_t  **bcfs, *bcf;

    hmcf = ngx_http_get_module_main_conf(r, ngx_http_hermes_module);
    bcfs = hmcf->backends.elts;
    l = list->elts;

    for (i = 0; i < list->nelts; i++) {
        ngx_str_set(&l[i].backend_name, "local");
        ngx_str_set(&l[i].host_name, "localhost");

        for (j = 0; j < hmcf->backends.nelts; j++) {
            bcf = bcfs[j];

            if (bcf->type != NGX_HTTP_HERMES_BACKEND_SSH
                || ngx_memcmp(bcf->tag, l[i].tag,
                              NGX_HTTP_HERMES_BACKEND_TAG_LEN) != 0)
            {
                continue;
            }

            hosts = bcf->hosts->elts;
            ngx_str_set(&l[i].backend_name, "ssh");
            l[i].host_name = *ngx_http_hermes_ssh_host_name(
                          hosts[l[i].host < bcf->hosts->nelts ? l[i].host : 0]);
            break;
        }
    }
}


/* GET <loc>: the caller's kernels; DELETE <loc>/SESSION: shut one down */

ngx_int_t
ngx_http_hermes_kernels_handler(ngx_http_request_t *r)
{
    ngx_int_t                    rc;
    ngx_str_t                    owner, session, value;
    ngx_buf_t                   *b;
    ngx_uint_t                   force;
    ngx_array_t                  list;
    ngx_http_hermes_zone_t      *zone;
    ngx_http_hermes_victims_t    victims;
    ngx_http_core_loc_conf_t    *clcf;
    ngx_http_hermes_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);
    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);
    zone = hlcf->shm_zone->data;

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD|NGX_HTTP_DELETE))) {
        if (ngx_http_hermes_add_header(r, "Allow", "GET, DELETE") != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_hermes_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                          "method_not_allowed",
                                          "use GET or DELETE");
    }

    if (ngx_http_hermes_owner(r, &owner, &rc) != NGX_OK) {
        return rc;
    }

    if (r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD)) {
        if (ngx_array_init(&list, r->pool, 8,
                           sizeof(ngx_http_hermes_listing_t))
            != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (ngx_http_hermes_registry_list(zone, &owner, &list) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        ngx_http_hermes_name_backends(r, &list);

        b = ngx_http_hermes_json_listing(r->pool, &list);
        if (b == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_hermes_send_buf(r, NGX_HTTP_OK, "application/json", b);
    }

    /* DELETE: the session is what follows the location's prefix */

    ngx_str_null(&session);

    if (r->uri.len > clcf->name.len
        && ngx_strncmp(r->uri.data, clcf->name.data, clcf->name.len) == 0)
    {
        session.data = r->uri.data + clcf->name.len;
        session.len = r->uri.len - clcf->name.len;

        if (session.len && session.data[0] == '/') {
            session.data++;
            session.len--;
        }
    }

    if (session.len == 0) {
        return ngx_http_hermes_send_error(r, NGX_HTTP_BAD_REQUEST,
                                          "invalid_session",
                                          "DELETE <location>/SESSION");
    }

    force = (ngx_http_arg(r, (u_char *) "force", 5, &value) == NGX_OK
             && value.len == 1 && value.data[0] == '1');

    victims.n = 0;

    rc = ngx_http_hermes_registry_shutdown(zone, &owner, &session, force,
                                           &victims);

    ngx_http_hermes_kernel_kill_victims(hlcf->thread_pool, &victims,
                                        r->connection->log);

    switch (rc) {

    case NGX_OK:
        return ngx_http_hermes_send_buf(r, NGX_HTTP_NO_CONTENT,
                                        "application/json", NULL);

    case NGX_BUSY:
        return ngx_http_hermes_send_error(r, NGX_HTTP_CONFLICT, "cell_running",
                                          "a cell is running on this kernel; "
                                          "?force=1 kills it anyway");

    default:
        return ngx_http_hermes_send_error(r, NGX_HTTP_NOT_FOUND, "not_found",
                                          "no kernel of yours for this "
                                          "session");
    }
}


ngx_int_t
ngx_http_hermes_status_handler(ngx_http_request_t *r)
{
    ngx_int_t                    rc;
    ngx_str_t                    value;
    ngx_buf_t                   *b;
    ngx_http_hermes_zone_t      *zone;
    ngx_http_hermes_stats_t      st;
    ngx_http_hermes_loc_conf_t  *hlcf;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);
    zone = hlcf->shm_zone->data;

    ngx_http_hermes_registry_stats(zone, &st);

    if (ngx_http_arg(r, (u_char *) "format", 6, &value) == NGX_OK
        && value.len == 10 && ngx_strncmp(value.data, "prometheus", 10) == 0)
    {
        b = ngx_http_hermes_prometheus_stats(r->pool, &st, zone->max_kernels,
                                             &hlcf->shm_zone->shm.name);
        if (b == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_hermes_send_buf(r, NGX_HTTP_OK,
                                        "text/plain; version=0.0.4", b);
    }

    b = ngx_http_hermes_json_stats(r->pool, &st, zone->max_kernels);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_hermes_send_buf(r, NGX_HTTP_OK, "application/json", b);
}


/* $hermes_session, $hermes_kernel_id, $hermes_cell_status, $hermes_cell_ms */

static ngx_http_variable_t  ngx_http_hermes_vars[] = {

    { ngx_string("hermes_session"), NULL, ngx_http_hermes_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("hermes_kernel_id"), NULL, ngx_http_hermes_variable, 1,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("hermes_cell_status"), NULL, ngx_http_hermes_variable, 2,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("hermes_cell_ms"), NULL, ngx_http_hermes_variable, 3,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

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


static ngx_int_t
ngx_http_hermes_variable(ngx_http_request_t *r, ngx_http_variable_value_t *v,
    uintptr_t data)
{
    u_char                 *p;
    ngx_http_hermes_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_hermes_module);

    v->not_found = 1;

    if (ctx == NULL) {
        return NGX_OK;
    }

    switch (data) {

    case 0:
        if (ctx->session.len == 0) {
            return NGX_OK;
        }

        v->data = ctx->session.data;
        v->len = ctx->session.len;
        break;

    case 1:
        if (!ctx->has_kernel) {
            return NGX_OK;
        }

        v->data = ctx->kernel_id;
        v->len = NGX_HTTP_HERMES_ID_LEN;
        break;

    case 2:
        if (ctx->cell_status < 0) {
            return NGX_OK;
        }

        v->data = ngx_http_hermes_cell_status_names[ctx->cell_status].data;
        v->len = ngx_http_hermes_cell_status_names[ctx->cell_status].len;
        break;

    default:
        if (ctx->cell_status < 0) {
            return NGX_OK;
        }

        p = ngx_pnalloc(r->pool, NGX_INT_T_LEN);
        if (p == NULL) {
            return NGX_ERROR;
        }

        v->data = p;
        v->len = ngx_sprintf(p, "%M", ctx->cell_ms) - p;
        break;
    }

    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    return NGX_OK;
}
