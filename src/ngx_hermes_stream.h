
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: a cell's run and its stream on a kernel, through a backend's
 * transport.
 */


#ifndef _NGX_HERMES_STREAM_H_INCLUDED_
#define _NGX_HERMES_STREAM_H_INCLUDED_


#include "ngx_hermes.h"


/* a cell's run: its turn on a kernel; outlives its request */

ngx_int_t ngx_http_hermes_cell_start(ngx_http_request_t *r,
    ngx_http_hermes_request_t *req, ngx_str_t *owner);


/*
 * ESCAPED_MAX: the most a cell's output file (of hermes_max_stream) or
 * its result (of hermes_max_output) holds as the module reads it: JSON
 * escapes a byte into six at most, and 64 KiB more for the rest of a line
 * or of the result.  kernel_runner.py writes its results within the same
 * bound, of the same name; docs/protocol.md says it once.
 */

#define NGX_HTTP_HERMES_ESCAPED_MAX(max)  (6 * (max) + 65536)


/*
 * A cell's stream on its kernel, as the cell and a backend's transport
 * share it: the cell fills in what to run and its callbacks, the transport
 * ships the request and calls back, in this order: shipped, output (event
 * lines, any number of times), result, done (the output after the result
 * went out too); or failed, at any point.
 */

typedef enum {
    NGX_HTTP_HERMES_STREAM_DEAD = 0,    /* not shipped: the kernel is gone */
    NGX_HTTP_HERMES_STREAM_FULL,        /* not shipped: its disk is full */
    NGX_HTTP_HERMES_STREAM_BUSY,        /* not shipped: no thread now */
    NGX_HTTP_HERMES_STREAM_SHIP_FAILED, /* not shipped, for another reason */
    NGX_HTTP_HERMES_STREAM_LOST         /* shipped, then lost mid-cell */
} ngx_http_hermes_stream_fail_e;


typedef struct ngx_http_hermes_stream_s  ngx_http_hermes_stream_t;

typedef ngx_int_t (*ngx_http_hermes_stream_pt)(ngx_http_hermes_stream_t *st);
typedef ngx_int_t (*ngx_http_hermes_stream_output_pt)(
    ngx_http_hermes_stream_t *st, u_char *p, size_t n);
typedef ngx_int_t (*ngx_http_hermes_stream_result_pt)(
    ngx_http_hermes_stream_t *st, u_char *p, size_t n);
typedef void (*ngx_http_hermes_stream_failed_pt)(
    ngx_http_hermes_stream_t *st, ngx_uint_t why, char *message);


/*
 * The head and the tail of a lost cell's event lines: escaping makes at
 * most 6 bytes of a text byte, the output keeps 40% head and 60% tail.
 */

#define NGX_HTTP_HERMES_KEEP_HEAD(max)  (3 * (max) + 4096)
#define NGX_HTTP_HERMES_KEEP_TAIL(max)  (4 * (max) + 4096)

typedef struct {
    u_char                       *data;         /* head, then tail */
    size_t                        head;
    size_t                        tail;
    unsigned                      gap:1;        /* bytes between them */
} ngx_http_hermes_windows_t;


struct ngx_http_hermes_transport_s {
    ngx_int_t                   (*run)(ngx_http_hermes_stream_t *st);
    /* the client took what was sent, or left: read on */
    void                        (*resume)(ngx_http_hermes_stream_t *st);
    /* NGX_DECLINED: not told: not shipped, or the kernel is not there */
    ngx_int_t                   (*interrupt)(ngx_http_hermes_stream_t *st);
    void                        (*salvage)(ngx_http_hermes_stream_t *st,
                                           ngx_http_hermes_windows_t *w);
    void                        (*close)(ngx_http_hermes_stream_t *st);
    ngx_uint_t                    tools;        /* carries tool calls */
};


struct ngx_http_hermes_stream_s {
    /* the cell's */
    ngx_pool_t                   *pool;
    ngx_log_t                    *log;
    ngx_http_hermes_loc_conf_t   *hlcf;
    ngx_http_hermes_kernel_ref_t *ref;
    ngx_buf_t                    *request;      /* cell_req_N.json; NULL:
                                                   a shipped cell's stream
                                                   again, from offset */
    off_t                         offset;
    off_t                         out_limit;    /* of cell_out, read */
    size_t                        res_limit;
    ngx_msec_t                    timeout;
    ngx_connection_t             *client;       /* NULL: gone */
    ngx_http_hermes_rpc_t        *rpc;          /* its tool calls */
    void                         *data;

    ngx_http_hermes_stream_pt         shipped;
    ngx_http_hermes_stream_output_pt  output;   /* NGX_AGAIN: wait resume */
    ngx_http_hermes_stream_result_pt  result;
    ngx_http_hermes_stream_pt         done;
    ngx_http_hermes_stream_failed_pt  failed;

    /* the transport's */
    void                         *ctx;
    unsigned                      quiet:1;      /* no client for output */
    unsigned                      is_shipped:1;
    unsigned                      waits_client:1; /* the result is behind
                                                     output not yet taken */
    unsigned                      truncated:1;  /* out_limit was reached */
};


ngx_int_t ngx_http_hermes_transport_local_init_process(ngx_cycle_t *cycle);
void ngx_http_hermes_transport_local_exit_process(ngx_cycle_t *cycle);

extern ngx_http_hermes_transport_t  ngx_http_hermes_transport_local;
extern ngx_http_hermes_transport_t  ngx_http_hermes_transport_ssh;


#endif /* _NGX_HERMES_STREAM_H_INCLUDED_ */
