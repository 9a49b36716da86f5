
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: kernel lifecycle: spawn, kill, interrupt, warm pools, crash
 * recovery.
 */


#ifndef _NGX_HERMES_KERNEL_H_INCLUDED_
#define _NGX_HERMES_KERNEL_H_INCLUDED_


#include "ngx_hermes.h"


/* kernel lifecycle: spawn and kill, in the thread pool */

typedef struct ngx_http_hermes_spawn_s  ngx_http_hermes_spawn_t;

/*
 * rc NGX_DECLINED: the host cannot be reached, NGX_ABORT: it lacks the
 * environment's rootfs (another host may be tried for either)
 */
typedef void (*ngx_http_hermes_spawn_done_pt)(void *data, ngx_int_t rc,
    ngx_http_hermes_spawned_t *k, const char *err);

ngx_int_t ngx_http_hermes_kernel_spawn(ngx_http_hermes_loc_conf_t *hlcf,
    ngx_http_hermes_environment_t *env, ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_pool_t *pool,
    ngx_http_hermes_spawn_done_pt done, void *data, ngx_log_t *log);
void ngx_http_hermes_kernel_victim(ngx_http_hermes_victim_t *v,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_backend_conf_t *bcf);
ngx_int_t ngx_http_hermes_kernel_kill(ngx_thread_pool_t *tp,
    ngx_http_hermes_backend_conf_t *bcf, ngx_http_hermes_victim_t *v,
    ngx_log_t *log);
ngx_http_hermes_backend_conf_t *ngx_http_hermes_kernel_backend(
    ngx_http_hermes_victim_t *v);
ngx_int_t ngx_http_hermes_kernel_interrupt(ngx_http_hermes_victim_t *v,
    uint32_t cell, ngx_log_t *log);
void ngx_http_hermes_kernel_kill_victims(ngx_thread_pool_t *tp,
    ngx_http_hermes_victims_t *victims, ngx_log_t *log);
ngx_int_t ngx_http_hermes_kernel_init_process(ngx_cycle_t *cycle,
    ngx_http_hermes_main_conf_t *hmcf);
void ngx_http_hermes_kernel_exit_process(ngx_cycle_t *cycle);
void ngx_http_hermes_kernel_exit_master(ngx_cycle_t *cycle);
u_char *ngx_http_hermes_log_escape(u_char *dst, u_char *last, u_char *src,
    size_t len, ngx_uint_t quoted);



/* warm pools (ngx_hermes_warm.c) */

char *ngx_http_hermes_warm_conf(ngx_conf_t *cf,
    ngx_http_hermes_loc_conf_t *hlcf);
ngx_int_t ngx_http_hermes_warm_init_process(ngx_http_hermes_zone_t *zone,
    ngx_cycle_t *cycle);
void ngx_http_hermes_warm_upkeep(ngx_http_hermes_zone_t *zone,
    ngx_log_t *log);


#endif /* _NGX_HERMES_KERNEL_H_INCLUDED_ */
