
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: what the JSON writers share (ngx_hermes_json.c,
 * ngx_hermes_status.c): yajl's generator, a string of ours into it, and
 * its text taken into a buffer.
 */


#ifndef _NGX_HERMES_JSON_GEN_H_INCLUDED_
#define _NGX_HERMES_JSON_GEN_H_INCLUDED_


#include "ngx_hermes.h"

#include <yajl/yajl_gen.h>


#define ngx_http_hermes_gen_key(g, k)                                         \
    yajl_gen_string(g, (const unsigned char *) k, sizeof(k) - 1)

#define ngx_http_hermes_gen_str(g, s)                                         \
    yajl_gen_string(g, (const unsigned char *) (s)->data, (s)->len)

ngx_buf_t *ngx_http_hermes_json_take(ngx_pool_t *pool, yajl_gen g,
    ngx_uint_t newline);


#endif /* _NGX_HERMES_JSON_GEN_H_INCLUDED_ */
