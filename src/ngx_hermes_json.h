
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: JSON: requests in, results and errors out (yajl).
 */


#ifndef _NGX_HERMES_JSON_H_INCLUDED_
#define _NGX_HERMES_JSON_H_INCLUDED_


#include "ngx_hermes.h"


/* an agent's envelope around the request: answered in the same kind */

typedef enum {
    NGX_HTTP_HERMES_ENVELOPE_NONE = 0,
    NGX_HTTP_HERMES_ENVELOPE_OPENAI,    /* a tool call: a "tool" message */
    NGX_HTTP_HERMES_ENVELOPE_ANTHROPIC  /* tool_use: a tool_result block */
} ngx_http_hermes_envelope_e;


typedef struct {
    ngx_str_t                     session;
    ngx_str_t                     code;
    ngx_msec_t                    timeout;      /* 0: the location's cap */
    ngx_str_t                     tool_call_id; /* the envelope's id */
    ngx_str_t                     environment;  /* as named; "": default */
    ngx_http_hermes_environment_t *env;         /* NULL: the host's */
    ngx_uint_t                    envelope;
    unsigned                      reset:1;
    unsigned                      ephemeral:1;  /* a one-shot kernel */
    unsigned                      json_answer:1; /* Accept: application/json */
} ngx_http_hermes_request_t;


typedef struct {
    ngx_uint_t                    status;       /* ngx_http_hermes_cell_status_e */
    ngx_str_t                     output;
    ngx_str_t                     error;
    ngx_str_t                     displays;     /* raw JSON array, or empty */
    ngx_uint_t                    execution_count;
    ngx_uint_t                    stdout_bytes_total;
    ngx_uint_t                    tool_calls_made;
    ngx_msec_t                    duration;     /* from the cell's turn */
    ngx_msec_t                    queue;        /* waiting for the turn */
    unsigned                      stdout_truncated:1;
    unsigned                      stream_truncated:1;
    unsigned                      state_reset:1;
    unsigned                      ended:1;
} ngx_http_hermes_result_t;


ngx_int_t ngx_http_hermes_json_session_valid(ngx_str_t *s);
ngx_int_t ngx_http_hermes_json_parse_request(ngx_pool_t *pool, u_char *body,
    size_t len, ngx_http_hermes_request_t *req, size_t max_code,
    ngx_str_t *err_code, ngx_str_t *err_msg, ngx_uint_t *http_status);
ngx_int_t ngx_http_hermes_json_parse_result(ngx_pool_t *pool, u_char *data,
    size_t len, ngx_http_hermes_result_t *res);
ngx_buf_t *ngx_http_hermes_json_result(ngx_pool_t *pool,
    ngx_http_hermes_result_t *res, ngx_http_hermes_kernel_ref_t *ref,
    ngx_http_hermes_request_t *req, ngx_uint_t as_event,
    ngx_uint_t as_tool_message);
void ngx_http_hermes_json_event_text(u_char *line, size_t len,
    ngx_buf_t *out, ngx_buf_t *err);
ngx_buf_t *ngx_http_hermes_json_error(ngx_pool_t *pool, ngx_str_t *code,
    ngx_str_t *message);
ngx_buf_t *ngx_http_hermes_json_tool_message(ngx_pool_t *pool,
    ngx_uint_t envelope, ngx_str_t *id, u_char *content, size_t len,
    ngx_uint_t is_error);
ngx_buf_t *ngx_http_hermes_json_listing(ngx_pool_t *pool, ngx_array_t *list);
ngx_buf_t *ngx_http_hermes_json_kernel(ngx_pool_t *pool,
    ngx_http_hermes_listing_t *l);
ngx_buf_t *ngx_http_hermes_json_cell_request(ngx_pool_t *pool, uint32_t id,
    ngx_http_hermes_request_t *req, size_t max_output, size_t max_stream,
    ngx_array_t *tools, ngx_uint_t tools_any, ngx_uint_t schemas);

extern ngx_str_t  ngx_http_hermes_cell_status_names[];


#endif /* _NGX_HERMES_JSON_H_INCLUDED_ */
