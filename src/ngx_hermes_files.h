
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: files into and out of a kernel, and resumed streams.
 */


#ifndef _NGX_HERMES_FILES_H_INCLUDED_
#define _NGX_HERMES_FILES_H_INCLUDED_


#include "ngx_hermes.h"


/* a shipped cell's stream again, from an offset */

ngx_int_t ngx_http_hermes_resume_handler(ngx_http_request_t *r,
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner, ngx_str_t *session,
    uint32_t cell, off_t offset);


/* files into and out of a kernel's directory */

ngx_int_t ngx_http_hermes_files_handler(ngx_http_request_t *r,
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner, ngx_str_t *session,
    ngx_str_t *path);


#endif /* _NGX_HERMES_FILES_H_INCLUDED_ */
