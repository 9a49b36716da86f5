
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: backends: where kernels run (local, ssh), their commands and
 * their ops.
 */


#ifndef _NGX_HERMES_BACKEND_H_INCLUDED_
#define _NGX_HERMES_BACKEND_H_INCLUDED_


#include "ngx_hermes.h"


/* the local backend: commands, files and liveness on the nginx host */

typedef struct {
    const char                   *cmd;          /* shell text, fixed */
    char                 *const  *args;         /* its $1..., NULL-ended */
    const u_char                 *in;           /* payload on stdin */
    size_t                        in_len;
    u_char                       *out;          /* captured stdout */
    size_t                        out_size;
    size_t                        out_len;
    ngx_msec_t                    timeout;
    int                           status;       /* exit code, -1: failed */
    ngx_err_t                     err;
} ngx_http_hermes_cmd_t;


/* arguments of a command at most: the start's, with every ro= path */
#define NGX_HTTP_HERMES_SANDBOX_RO_MAX  32
#define NGX_HTTP_HERMES_CMD_ARGS                                              \
    (64 + 3 * NGX_HTTP_HERMES_SANDBOX_RO_MAX)

/*
 * The kernel script's steps every backend does without the script and
 * its shell, with the same argv, output and statuses: "dir" and "ship"
 * (src/ngx_hermes_local_steps.c; over ssh the agent's KERNEL frame).
 */
#define ngx_http_hermes_cmd_is_step(c)                                        \
    ((c)->cmd == ngx_http_hermes_script_kernel                                \
     && (c)->args && (c)->args[0]                                             \
     && (ngx_strcmp((c)->args[0], "dir") == 0                                 \
         || ngx_strcmp((c)->args[0], "ship") == 0))

ngx_int_t ngx_http_hermes_local_exec(ngx_http_hermes_cmd_t *cmd);
ngx_int_t ngx_http_hermes_local_steps(ngx_http_hermes_cmd_t *cmd);
ngx_int_t ngx_http_hermes_local_write_at(ngx_fd_t dir, const char *name,
    u_char *data, size_t len, ngx_uid_t uid, ngx_log_t *log);
ngx_fd_t ngx_http_hermes_local_open_at(ngx_fd_t dir, const char *name,
    off_t *size);
ngx_int_t ngx_http_hermes_local_wake(ngx_fd_t wake, ngx_log_t *log);
ngx_int_t ngx_http_hermes_local_ship_inline(ngx_fd_t wake, u_char *data,
    size_t len, ngx_log_t *log);
ngx_int_t ngx_http_hermes_local_interrupt(ngx_fd_t dir, uint32_t cell,
    ngx_log_t *log);
ngx_int_t ngx_http_hermes_local_wait_ready(u_char *dir, ngx_pid_t pid,
    ngx_pid_t expect, ngx_msec_t timeout);
ngx_int_t ngx_http_hermes_ready_pid(u_char *buf, ngx_pid_t pid);
ngx_int_t ngx_http_hermes_proc_start(u_char *stat, size_t len,
    uint64_t *start);
ngx_int_t ngx_http_hermes_local_proc_start(ngx_pid_t pid, uint64_t *start);
ngx_int_t ngx_http_hermes_local_make_roots(ngx_cycle_t *cycle);


/*
 * A backend: where kernels run, as the rest of the module sees it
 * (ngx_hermes_backend_local.c, ngx_hermes_backend_ssh.c), a plug-in as
 * nginx's upstream balancers are: its conf is its own (bcf->data, made by
 * create_conf, filled by parse, checked by init_conf), as is a task's
 * connection (conn->data).  Commands run in thread pool tasks on a
 * connection taken for the task; a cell's stream goes through the
 * backend's transport.  ngx_http_hermes_backends[] lists them all.
 */

struct ngx_http_hermes_backend_ops_s {
    ngx_str_t                     name;         /* "local", "ssh" */
    ngx_http_hermes_transport_t  *transport;
    /* bytes one command may take on stdin or give on stdout */
    size_t                        exec_max;

    /* configuration: hermes_backend NAME [root=] [warm=] PARAM... */
    void                       *(*create_conf)(ngx_conf_t *cf);
    /* NGX_OK: taken; NGX_DECLINED: not one of its; NGX_ERROR: logged */
    ngx_int_t                   (*parse)(ngx_conf_t *cf, void *conf,
                                         ngx_str_t *param);
    /* the parameters are all in: checks, nhosts, the tag */
    char                       *(*init_conf)(ngx_conf_t *cf,
                                    ngx_http_hermes_backend_conf_t *bcf);
    /* each process that may use it, once, before any use */
    ngx_int_t                   (*init_process)(ngx_cycle_t *cycle);

    /*
     * Thread pool tasks.  exec, ready: NGX_DECLINED: the host cannot be
     * reached (nothing ran on it).
     */
    void                        (*take)(ngx_http_hermes_conn_t *conn);
    void                        (*give)(ngx_http_hermes_conn_t *conn);
    ngx_int_t                   (*exec)(ngx_http_hermes_conn_t *conn,
                                        ngx_http_hermes_cmd_t *cmd);
    /* a new runner said it is ready, with its pid: its start time */
    ngx_int_t                   (*ready)(ngx_http_hermes_conn_t *conn,
                                         u_char *dir, ngx_pid_t pid,
                                         ngx_pid_t expect, uint64_t *start);

    /* the event loop */
    ngx_uint_t                  (*root)(ngx_http_hermes_backend_conf_t *bcf);
    ngx_uint_t                  (*pick_host)(
                                    ngx_http_hermes_backend_conf_t *bcf,
                                    ngx_uint_t *kernels);
    ngx_str_t                  *(*host_name)(
                                    ngx_http_hermes_backend_conf_t *bcf,
                                    ngx_uint_t host);
    /*
     * "N\n" into the kernel's intr FIFO, never waiting.  NGX_DECLINED: the
     * kernel is not there (any more).
     */
    ngx_int_t                   (*interrupt)(
                                    ngx_http_hermes_backend_conf_t *bcf,
                                    ngx_http_hermes_victim_t *v,
                                    uint32_t cell, ngx_log_t *log);
    /* is a kernel still itself, told at once; NULL: it cannot be */
    ngx_uint_t                  (*alive)(ngx_http_hermes_victim_t *v);
    void                        (*exit_process)(
                                    ngx_http_hermes_backend_conf_t *bcf);
};


extern ngx_http_hermes_backend_ops_t  ngx_http_hermes_backend_local_ops;
extern ngx_http_hermes_backend_ops_t  ngx_http_hermes_backend_ssh_ops;
extern ngx_http_hermes_backend_ops_t *ngx_http_hermes_backends[];

ngx_http_hermes_backend_ops_t *ngx_http_hermes_backend_ops(ngx_str_t *name);
ngx_int_t ngx_http_hermes_backend_init_process(ngx_cycle_t *cycle);
ngx_http_hermes_backend_conf_t *ngx_http_hermes_backend_create(
    ngx_conf_t *cf, ngx_http_hermes_backend_ops_t *ops, ngx_str_t *root);
void ngx_http_hermes_backend_tag(ngx_http_hermes_backend_conf_t *bcf,
    ngx_str_t *spec);

void ngx_http_hermes_backend_take(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_backend_conf_t *bcf, ngx_uint_t host);
void ngx_http_hermes_backend_give(ngx_http_hermes_conn_t *conn);
ngx_int_t ngx_http_hermes_backend_exec(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_cmd_t *cmd);
u_char *ngx_http_hermes_cmd_text(u_char *p, u_char *last,
    ngx_http_hermes_cmd_t *cmd);
void ngx_http_hermes_backend_place(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_backend_conf_t *bcf);
ngx_str_t *ngx_http_hermes_backend_host_name(
    ngx_http_hermes_backend_conf_t *bcf, ngx_uint_t host);
ngx_http_hermes_backend_conf_t *ngx_http_hermes_backend_by_tag(
    ngx_http_hermes_main_conf_t *hmcf, u_char *tag);


#endif /* _NGX_HERMES_BACKEND_H_INCLUDED_ */
