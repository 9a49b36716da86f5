
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: environments: the image a kernel runs in (a rootfs bound
 * as /, the python in it), named in nginx.conf and picked per request.
 */


#ifndef _NGX_HERMES_ENVIRONMENT_H_INCLUDED_
#define _NGX_HERMES_ENVIRONMENT_H_INCLUDED_


#include "ngx_hermes.h"


#define NGX_HTTP_HERMES_ENV_NAME_MAX    64


struct ngx_http_hermes_environment_s {
    ngx_str_t                     name;
    ngx_str_t                     rootfs;       /* "": the host's own / */
    ngx_str_t                     usr;          /* its /usr and /etc */
    ngx_str_t                     etc;
    ngx_str_t                     python;       /* in it: "python3" */
    ngx_str_t                     venv;         /* the python's tree, of
                                                   the host: bound ro */
    ngx_array_t                  *ro;           /* ngx_str_t, NUL-ended */
    ngx_array_t                  *rw;
    ngx_array_t                  *env;          /* "NAME=VALUE" */
    uint32_t                      id;           /* the registry's: crc32 */
    ngx_uint_t                    warm;         /* its pool, per host */
};


char *ngx_http_hermes_environment(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_hermes_environments(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_hermes_environment_check(ngx_conf_t *cf,
    ngx_http_hermes_loc_conf_t *hlcf);
ngx_int_t ngx_http_hermes_environment_pick(ngx_http_hermes_loc_conf_t *hlcf,
    ngx_str_t *name, ngx_http_hermes_environment_t **env);


#endif /* _NGX_HERMES_ENVIRONMENT_H_INCLUDED_ */
