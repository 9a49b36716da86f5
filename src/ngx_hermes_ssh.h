
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: the ssh backend's own, shared by its two files only
 * (ngx_hermes_backend_ssh.c, ngx_hermes_transport_ssh.c).
 */


#ifndef _NGX_HERMES_SSH_H_INCLUDED_
#define _NGX_HERMES_SSH_H_INCLUDED_


#include "ngx_hermes.h"


/* the ssh backend's cell relay, for its transport */

ngx_int_t ngx_http_hermes_ssh_relay(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_kernel_ref_t *ref, off_t out_limit, off_t res_limit,
    ngx_msec_t timeout, u_char *req, size_t req_len, off_t offset,
    ngx_socket_t fd, ngx_socket_t rpc_fd, ngx_log_t *log);


#endif /* _NGX_HERMES_SSH_H_INCLUDED_ */
