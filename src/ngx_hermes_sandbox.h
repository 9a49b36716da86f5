
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: sandboxes: bwrap, a user that is not root, cgroups or rlimits.
 */


#ifndef _NGX_HERMES_SANDBOX_H_INCLUDED_
#define _NGX_HERMES_SANDBOX_H_INCLUDED_


#include "ngx_hermes.h"


char *ngx_http_hermes_sandbox_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_http_hermes_sandbox_t *ngx_http_hermes_sandbox_default(ngx_conf_t *cf);
ngx_int_t ngx_http_hermes_sandbox_check(ngx_conf_t *cf,
    ngx_http_hermes_sandbox_t *sb);
ngx_uint_t ngx_http_hermes_sandbox_args(ngx_http_hermes_sandbox_t *sb,
    ngx_http_hermes_environment_t *env, u_char *dir, ngx_uint_t root,
    char **args, ngx_uint_t n, u_char *buf, size_t size);


#endif /* _NGX_HERMES_SANDBOX_H_INCLUDED_ */
