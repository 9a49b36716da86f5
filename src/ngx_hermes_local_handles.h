
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: a worker's verified handles on its local kernels (pidfd,
 * kernel dir, cells/), kept from one cell to the next.
 */


#ifndef _NGX_HERMES_LOCAL_HANDLES_H_INCLUDED_
#define _NGX_HERMES_LOCAL_HANDLES_H_INCLUDED_


#include "ngx_hermes.h"


/* what a cell borrows: it closes none of these */

typedef struct {
    ngx_fd_t                      pidfd;      /* the runner's */
    ngx_fd_t                      dir_fd;     /* the kernel dir, its inode */
    ngx_fd_t                      cells_fd;
    ngx_fd_t                      wake_fd;    /* its wake FIFO, to write */
} ngx_http_hermes_local_handle_t;


/* a cell told when its kernel exits */

typedef void (*ngx_http_hermes_local_exit_pt)(void *data);

typedef struct {
    ngx_queue_t                    queue;     /* prev NULL: not waiting */
    ngx_http_hermes_local_exit_pt  handler;
    void                          *data;
} ngx_http_hermes_local_waiter_t;


void ngx_http_hermes_local_handles_init(void);
ngx_int_t ngx_http_hermes_local_handle_get(ngx_http_hermes_kernel_ref_t *ref,
    ngx_http_hermes_local_handle_t **handle, ngx_log_t *log);
void ngx_http_hermes_local_handle_put(ngx_http_hermes_local_handle_t *handle,
    ngx_uint_t drop);
void ngx_http_hermes_local_handles_exit(void);
ngx_int_t ngx_http_hermes_local_handle_wait(
    ngx_http_hermes_local_handle_t *handle,
    ngx_http_hermes_local_waiter_t *w, ngx_log_t *log);
void ngx_http_hermes_local_handle_unwait(ngx_http_hermes_local_waiter_t *w);
int ngx_http_hermes_local_handle_watch(ngx_http_hermes_local_handle_t *handle,
    int ifd, ngx_uint_t output);
void ngx_http_hermes_local_handle_unwatch(
    ngx_http_hermes_local_handle_t *handle, ngx_uint_t output);
ngx_fd_t ngx_http_hermes_local_handle_rpc(
    ngx_http_hermes_local_handle_t *handle, ngx_http_hermes_kernel_ref_t *ref,
    int ifd, int *wd, ngx_log_t *log);
void ngx_http_hermes_local_handles_ignored(int wd);
void ngx_http_hermes_local_handles_quiet(int wd);


#endif /* _NGX_HERMES_LOCAL_HANDLES_H_INCLUDED_ */
