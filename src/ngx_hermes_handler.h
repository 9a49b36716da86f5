
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: HTTP handlers and variables.
 */


#ifndef _NGX_HERMES_HANDLER_H_INCLUDED_
#define _NGX_HERMES_HANDLER_H_INCLUDED_


#include "ngx_hermes.h"


ngx_int_t ngx_http_hermes_execute_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_hermes_kernels_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_hermes_status_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_hermes_mcp_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_hermes_add_variables(ngx_conf_t *cf);

/* the request's parts every handler reads alike */
ngx_int_t ngx_http_hermes_owner(ngx_http_request_t *r, ngx_str_t *owner,
    ngx_int_t *rc);
u_char *ngx_http_hermes_read_body(ngx_http_request_t *r, size_t *len);
ngx_uint_t ngx_http_hermes_content_is_json(ngx_http_request_t *r);
void ngx_http_hermes_name_backends(ngx_http_request_t *r, ngx_array_t *list);


#endif /* _NGX_HERMES_HANDLER_H_INCLUDED_ */
