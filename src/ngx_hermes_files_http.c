
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: PUT and GET <kernels location>/SESSION/files/PATH, the
 * HTTP route of a file transfer (ngx_hermes_files.c): a PUT's body left
 * where nginx read it, a GET's pieces streamed to the client, the next
 * read once the client took the last.
 */


#include "ngx_hermes.h"


static ngx_int_t ngx_http_hermes_files_http_error(ngx_http_request_t *r,
    ngx_http_hermes_files_error_t *err);
static void ngx_http_hermes_files_http_body(ngx_http_request_t *r);
static void ngx_http_hermes_files_http_done(ngx_http_hermes_files_t *f);
static void ngx_http_hermes_files_http_send(ngx_http_request_t *r,
    ngx_http_hermes_files_t *f);
static void ngx_http_hermes_files_http_writer(ngx_http_request_t *r);


ngx_int_t
ngx_http_hermes_files_handler(ngx_http_request_t *r,
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner, ngx_str_t *session,
    ngx_str_t *path)
{
    ngx_int_t                       rc;
    ngx_http_hermes_files_t        *f;
    ngx_http_hermes_loc_conf_t     *hlcf;
    ngx_http_hermes_files_error_t  *err;

    if (r->method != NGX_HTTP_GET && r->method != NGX_HTTP_PUT
        && r->method != NGX_HTTP_HEAD)
    {
        if (ngx_http_hermes_response_add_header(r, "Allow", "GET, PUT")
            != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_hermes_response_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                                   "method_not_allowed",
                                                   "use GET or PUT for a "
                                                   "file");
    }

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    f = ngx_http_hermes_files_create(r, zone, owner, session, path,
                                     r->method != NGX_HTTP_PUT,
                                     hlcf->max_file, &err);
    if (f == NULL) {
        return ngx_http_hermes_files_http_error(r, err);
    }

    f->handler = ngx_http_hermes_files_http_done;

    if (ngx_http_hermes_response_ctx(r) == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* the writer finds it there between pieces */
    ngx_http_hermes_response_ctx(r)->files = f;

    if (f->get) {
        if (ngx_http_discard_request_body(r) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (ngx_http_hermes_files_start(f) != NGX_OK) {
            return ngx_http_hermes_files_http_error(r, f->error);
        }

        r->main->count++;
        return NGX_DONE;
    }

    if (r->headers_in.content_length_n > (off_t) hlcf->max_file) {
        return ngx_http_hermes_files_http_error(r,
                                            &ngx_http_hermes_files_too_large);
    }

    rc = ngx_http_read_client_request_body(r,
                                           ngx_http_hermes_files_http_body);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


/* a transfer's failure as our JSON error; NULL: the worker's own */

static ngx_int_t
ngx_http_hermes_files_http_error(ngx_http_request_t *r,
    ngx_http_hermes_files_error_t *err)
{
    if (err == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (err->status == NGX_HTTP_TOO_MANY_REQUESTS
        && ngx_http_hermes_response_add_header(r, "Retry-After", "1")
           != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_hermes_response_send_error(r, err->status, err->code,
                                               err->message);
}


/*
 * The PUT's body is in: it stays where nginx put it (its buffer, its
 * temp file past client_body_buffer_size), read a piece at a time by the
 * task, so that a PUT costs the worker a piece, not the file.
 */

static void
ngx_http_hermes_files_http_body(ngx_http_request_t *r)
{
    ngx_http_hermes_files_t  *f;

    f = ngx_http_hermes_response_ctx(r)->files;

    ngx_http_hermes_files_set_body(f,
                              r->request_body ? r->request_body->bufs : NULL);

    if (ngx_http_hermes_files_start(f) != NGX_OK) {
        ngx_http_finalize_request(r,
                                ngx_http_hermes_files_http_error(r, f->error));
        return;
    }

    /* the body reader's count is ours until the task is done */
}


static void
ngx_http_hermes_files_http_done(ngx_http_hermes_files_t *f)
{
    ngx_int_t            rc;
    ngx_http_request_t  *r;

    r = f->r;

    if (r->header_sent) {
        /* a later piece: the answer is under way, a failure ends it */

        if (f->error || r->connection->error) {
            ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                          "hermes: \"%V\" of a kernel changed or could not "
                          "be read while it was sent (exit %d): the "
                          "connection is closed", &f->path, f->status);
            ngx_http_finalize_request(r, NGX_ERROR);
            return;
        }

        ngx_http_hermes_files_http_send(r, f);
        return;
    }

    if (f->error) {
        rc = ngx_http_hermes_files_http_error(r, f->error);
        goto done;
    }

    if (!f->get) {
        rc = ngx_http_hermes_response_send_buf(r, NGX_HTTP_NO_CONTENT,
                                               "application/json", NULL);
        goto done;
    }

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = f->size;
    ngx_str_set(&r->headers_out.content_type, "application/octet-stream");
    r->headers_out.content_type_len = r->headers_out.content_type.len;

    if (f->size == 0 || r->method == NGX_HTTP_HEAD) {
        r->header_only = 1;
    }

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        goto done;
    }

    ngx_http_hermes_files_http_send(r, f);
    return;

done:

    ngx_http_finalize_request(r, rc);
}


/*
 * A GET's piece to the client; the next is read once it is sent, so that
 * a slow client costs the worker one piece, whatever the file's size.
 */

static void
ngx_http_hermes_files_http_send(ngx_http_request_t *r,
    ngx_http_hermes_files_t *f)
{
    ngx_int_t     rc;
    ngx_buf_t    *b;
    ngx_chain_t   out;

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        ngx_http_finalize_request(r, NGX_ERROR);
        return;
    }

    b->pos = f->out;
    b->last = f->out + f->out_len;
    b->memory = 1;
    b->flush = 1;

    if (f->offset == f->size) {
        b->last_buf = 1;
        b->last_in_chain = 1;
    }

    out.buf = b;
    out.next = NULL;

    rc = ngx_http_output_filter(r, &out);

    if (rc == NGX_ERROR || f->offset == f->size) {
        ngx_http_finalize_request(r, rc);
        return;
    }

    r->write_event_handler = ngx_http_hermes_files_http_writer;
    ngx_http_hermes_files_http_writer(r);
}


/* the piece sent: the next one read (the count of the task is still ours) */

static void
ngx_http_hermes_files_http_writer(ngx_http_request_t *r)
{
    ngx_http_hermes_files_t  *f;

    if (ngx_http_hermes_response_flush(r) != NGX_OK) {
        return;
    }

    r->write_event_handler = ngx_http_request_empty_handler;

    f = ngx_http_hermes_response_ctx(r)->files;

    if (ngx_http_hermes_files_start(f) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_ERROR);
    }
}
