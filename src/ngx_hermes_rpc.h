
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: tool calls: a cell's RPC channel.
 */


#ifndef _NGX_HERMES_RPC_H_INCLUDED_
#define _NGX_HERMES_RPC_H_INCLUDED_


#include "ngx_hermes.h"


#define NGX_HTTP_HERMES_RPC_STRING    1
#define NGX_HTTP_HERMES_RPC_NUMBER    2
#define NGX_HTTP_HERMES_RPC_OBJECT    3
#define NGX_HTTP_HERMES_RPC_OTHER     4

/* a request as the checks read it; strings point into it or its bufs */

typedef struct {
    ngx_str_t                     tool;
    ngx_str_t                     args;         /* the raw object */
    ngx_str_t                     token;
    ngx_str_t                     seq_text;
    uint64_t                      seq;
    ngx_uint_t                    tool_type;    /* 0: absent */
    ngx_uint_t                    args_type;
    ngx_uint_t                    token_type;
    ngx_uint_t                    seq_type;
    ngx_uint_t                    reject;       /* rpc_reject_e, NREJECT */
    u_char                        tool_buf[129];
    u_char                        token_buf[128];
    u_char                        seq_buf[16];
} ngx_http_hermes_rpc_req_t;

/* an answer, or an archived one, to a file NAME of a remote rpc/ */
typedef ngx_int_t (*ngx_http_hermes_rpc_write_pt)(void *data, u_char *name,
    size_t len, u_char *buf, size_t n);

/* a stream event line ("...\n") for the cell's client */
typedef void (*ngx_http_hermes_rpc_event_pt)(void *data, u_char *line,
    size_t len);

ngx_int_t ngx_http_hermes_rpc_check(u_char *data, size_t len,
    uint64_t name_seq, u_char *token, size_t token_len, uint64_t *seen,
    ngx_uint_t nseen, ngx_http_hermes_rpc_req_t *req);
uint64_t ngx_http_hermes_rpc_name_seq(u_char *name, size_t len);
ngx_uint_t ngx_http_hermes_tool_name_valid(u_char *name, size_t len);

/* a tool's name as a Python identifier, at most: "tool_", 128, "_" */
#define NGX_HTTP_HERMES_TOOL_IDENT  (128 + 8)

size_t ngx_http_hermes_tool_ident(u_char *dst, ngx_str_t *name);
ngx_http_hermes_rpc_t *ngx_http_hermes_rpc_create(ngx_pool_t *pool,
    ngx_http_request_t *r, ngx_http_hermes_loc_conf_t *hlcf,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_rpc_event_pt event,
    void *data, ngx_log_t *log);
ngx_int_t ngx_http_hermes_rpc_open(ngx_http_hermes_rpc_t *rpc,
    ngx_fd_t dir_fd, ngx_fd_t rpc_fd, int wd);
int ngx_http_hermes_rpc_wd(ngx_http_hermes_rpc_t *rpc);
void ngx_http_hermes_rpc_notify(ngx_http_hermes_rpc_t *rpc, u_char *name,
    size_t len);
ngx_uint_t ngx_http_hermes_rpc_scan(ngx_http_hermes_rpc_t *rpc,
    ngx_uint_t sweep);
ngx_uint_t ngx_http_hermes_rpc_calls(ngx_http_hermes_rpc_t *rpc);
void ngx_http_hermes_rpc_carry(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_write_pt write, void *data);
ngx_int_t ngx_http_hermes_rpc_request(ngx_http_hermes_rpc_t *rpc,
    u_char *name, size_t len, u_char *data, size_t n);
void ngx_http_hermes_rpc_detach(ngx_http_hermes_rpc_t *rpc);
void ngx_http_hermes_rpc_end(ngx_http_hermes_rpc_t *rpc);
ngx_int_t ngx_http_hermes_rpc_filter_init(ngx_conf_t *cf);
ngx_int_t ngx_http_hermes_schema_handler(ngx_http_request_t *r);
char *ngx_http_hermes_tools_schema(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_hermes_tools_schema_check(ngx_conf_t *cf,
    ngx_http_hermes_loc_conf_t *hlcf);
void ngx_http_hermes_tools_schema_merge(ngx_http_hermes_loc_conf_t *conf,
    ngx_http_hermes_loc_conf_t *prev);


#endif /* _NGX_HERMES_RPC_H_INCLUDED_ */
