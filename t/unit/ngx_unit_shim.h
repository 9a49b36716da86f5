
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * The unit tests' stand-in for nginx's startup: see ngx_unit_shim.c.
 */


#ifndef _NGX_UNIT_SHIM_H_INCLUDED_
#define _NGX_UNIT_SHIM_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>


extern ngx_uint_t  ngx_unit_log_errors;

ngx_int_t ngx_unit_init(void);
ngx_int_t ngx_unit_shm_zone(ngx_shm_zone_t *shm_zone, char *name,
    size_t size);
void ngx_unit_shm_free(ngx_shm_zone_t *shm_zone);


#endif /* _NGX_UNIT_SHIM_H_INCLUDED_ */
