
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: per request: answers, errors and the writer step.
 */


#ifndef _NGX_HERMES_RESPONSE_H_INCLUDED_
#define _NGX_HERMES_RESPONSE_H_INCLUDED_


#include "ngx_hermes.h"


/* per request: what the error filter and the log variables need */

typedef struct ngx_http_hermes_response_s  ngx_http_hermes_response_t;


/*
 * A cell's answer in another protocol than ours (hermes_mcp: JSON-RPC,
 * with events over SSE), set in the request's context before the cell
 * starts.  "output" is given the cell's event lines as they come (in
 * pieces, not always whole lines) and writes what it makes of them with
 * ngx_http_hermes_response_write(); "result" and "error" return the last
 * message (NULL: no memory).  An error comes before the stream started.
 */

typedef struct {
    ngx_str_t                     content_type; /* of the stream */
    const char                   *error_type;   /* of an error's answer */
    ngx_str_t                     heartbeat;
    ngx_int_t                   (*output)(ngx_http_hermes_response_t *rs,
                                          u_char *p, size_t n);
    ngx_buf_t                  *(*result)(ngx_http_request_t *r, void *data,
                                          ngx_http_hermes_result_t *res,
                                          ngx_http_hermes_kernel_ref_t *ref,
                                          ngx_http_hermes_request_t *req);
    ngx_buf_t                  *(*error)(ngx_http_request_t *r, void *data,
                                         ngx_uint_t status, ngx_str_t *code,
                                         ngx_str_t *message);
} ngx_http_hermes_answer_t;

typedef struct {
    ngx_buf_t                    *error_body;
    ngx_http_event_handler_pt     read_body;    /* nginx's, while reading */
    ngx_str_t                     session;
    ngx_str_t                     owner;        /* "": hermes_owner unset */
    ngx_str_t                     error_code;   /* of a JSON error sent */
    u_char                        kernel_id[NGX_HTTP_HERMES_ID_LEN];
    ngx_int_t                     cell_status;  /* -1: none */
    ngx_msec_t                    cell_ms;
    ngx_msec_t                    queue_ms;
    ngx_http_hermes_response_t   *response;     /* a cell's, while it runs */
    void                         *files;        /* a file on its way */
    ngx_str_t                     tool_call_id;
    ngx_uint_t                    envelope;     /* errors as tool messages
                                                   (a JSON answer wanted) */
    ngx_http_hermes_answer_t     *answer;       /* NULL: ours */
    void                         *answer_data;
    unsigned                      error_sent:1;
    unsigned                      has_kernel:1;
    unsigned                      has_queue:1;  /* the cell got its turn */
    unsigned                      state_lost:1;
    unsigned                      lost_reason:4;
} ngx_http_hermes_ctx_t;


/*
 * Everything written to a client (ngx_hermes_response.c): a cell's NDJSON
 * stream or JSON answer, JSON errors, and nginx's own errors on our
 * locations as JSON.  A cell's response outlives its request: r is NULL
 * once the client is gone, and the cell hears it through "gone".
 */

struct ngx_http_hermes_response_s {
    ngx_http_request_t           *r;
    ngx_http_cleanup_t           *cln;
    ngx_http_hermes_ctx_t        *ctx;          /* the request's */
    ngx_chain_t                  *free;
    ngx_chain_t                  *busy;
    void                        (*drained)(void *data);
    void                        (*gone)(void *data);
    void                         *data;
    ngx_http_hermes_answer_t     *answer;       /* the context's */
    void                         *answer_data;
    ngx_chain_t                  *out;          /* written, not sent */
    ngx_chain_t                 **last_out;
    unsigned                      json:1;       /* one JSON answer */
    unsigned                      tool_message:1;
    unsigned                      header_sent:1;
    unsigned                      mid_line:1;   /* sent no "\n" last */
};


ngx_int_t ngx_http_hermes_response_attach(ngx_http_hermes_response_t *rs,
    ngx_http_request_t *r);
void ngx_http_hermes_response_release(ngx_http_hermes_response_t *rs);
ngx_int_t ngx_http_hermes_response_header(ngx_http_hermes_response_t *rs);
ngx_int_t ngx_http_hermes_response_kernel(ngx_http_hermes_response_t *rs,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_request_t *req);
ngx_int_t ngx_http_hermes_response_output(ngx_http_hermes_response_t *rs,
    u_char *p, size_t n);
ngx_int_t ngx_http_hermes_response_write(ngx_http_hermes_response_t *rs,
    u_char *p, size_t n);
ngx_int_t ngx_http_hermes_response_push(ngx_http_hermes_response_t *rs);
void ngx_http_hermes_response_end_line(ngx_http_hermes_response_t *rs);
void ngx_http_hermes_response_heartbeat(ngx_http_hermes_response_t *rs);
void ngx_http_hermes_response_result(ngx_http_hermes_response_t *rs,
    ngx_http_hermes_result_t *res, ngx_http_hermes_kernel_ref_t *ref,
    ngx_http_hermes_request_t *req);
void ngx_http_hermes_response_error(ngx_http_hermes_response_t *rs,
    ngx_uint_t status, char *code, char *message);
ngx_int_t ngx_http_hermes_response_send_error(ngx_http_request_t *r,
    ngx_uint_t status, char *code, char *message);
ngx_int_t ngx_http_hermes_response_send_buf(ngx_http_request_t *r,
    ngx_uint_t status, const char *type, ngx_buf_t *b);
ngx_int_t ngx_http_hermes_response_flush(ngx_http_request_t *r);
ngx_int_t ngx_http_hermes_response_add_header(ngx_http_request_t *r,
    char *key, char *value);
ngx_http_hermes_ctx_t *ngx_http_hermes_response_ctx(ngx_http_request_t *r);
ngx_int_t ngx_http_hermes_response_filter_init(ngx_conf_t *cf);


#endif /* _NGX_HERMES_RESPONSE_H_INCLUDED_ */
