
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: a tool call as the RPC channel (ngx_hermes_rpc.c), the MCP
 * client (ngx_hermes_mcp.c) and hermes_schema (ngx_hermes_schema.c) share
 * it; private to those three.
 */


#ifndef _NGX_HERMES_RPC_CALL_H_INCLUDED_
#define _NGX_HERMES_RPC_CALL_H_INCLUDED_


#include "ngx_hermes.h"

#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>


#define NGX_HTTP_HERMES_RPC_DEPTH      64     /* nesting of a request */
#define NGX_HTTP_HERMES_RPC_ERROR_MAX  1024   /* of a message passed on */

#define NGX_HTTP_HERMES_MCP_PEERS      16     /* MCP servers a worker knows */

#define NGX_HTTP_HERMES_MCP_VERSION    "2025-06-18"     /* asked for */
#define NGX_HTTP_HERMES_MCP_VERSION_OLD "2025-03-26"    /* taken too */

/* a call's MCP steps; 0: the hermes protocol, one POST */
#define NGX_HTTP_HERMES_MCP_INIT       1
#define NGX_HTTP_HERMES_MCP_NOTIFY     2
#define NGX_HTTP_HERMES_MCP_LIST       3
#define NGX_HTTP_HERMES_MCP_CALL       4
#define NGX_HTTP_HERMES_MCP_END        5     /* DELETE, nobody waits */
#define NGX_HTTP_HERMES_MCP_RESUME     6     /* GET: tools/call's stream
                                                resumed (Last-Event-ID) */

/* an SSE event id kept to resume by, at most (a longer one: none) */
#define NGX_HTTP_HERMES_MCP_EVENT_ID   128

/* a stream resumed without a new event in between, at most */
#define NGX_HTTP_HERMES_MCP_RESUMES    5

/* the wait before a resume without the server's retry:, and at most */
#define NGX_HTTP_HERMES_MCP_RETRY      1000
#define NGX_HTTP_HERMES_MCP_RETRY_MAX  30000

/* bytes of a progress message passed on to the cell's stream, at most */
#define NGX_HTTP_HERMES_RPC_PROGRESS_TEXT  256

/* pages of tools/list a worker follows (nextCursor), at most */
#define NGX_HTTP_HERMES_MCP_PAGES      64

/* ended sessions a call ends on its way, at most */
#define NGX_HTTP_HERMES_MCP_END_BATCH  4


struct ngx_http_hermes_rpc_s {
    ngx_pool_t                     *pool;
    ngx_log_t                      *log;
    ngx_http_request_t             *r;          /* NULL: the client left */
    ngx_http_hermes_loc_conf_t     *hlcf;
    ngx_http_hermes_zone_t         *zone;
    ngx_http_hermes_kernel_ref_t   *ref;

    ngx_fd_t                        dir_fd;     /* the cell's, verified */
    ngx_fd_t                        rpc_fd;     /* verified, the transport's */
    int                             wd;         /* its watch, the same */

    /* a kernel on another host: requests come, answers go, by its carrier */
    ngx_http_hermes_rpc_write_pt    write;
    void                           *write_data;
    unsigned                        remote:1;

    u_char                          token[2 * NGX_HTTP_HERMES_TOKEN_LEN];

    uint64_t                       *seen;
    ngx_uint_t                      nseen;
    ngx_uint_t                      seen_max;

    ngx_uint_t                      calls;      /* dispatched */
    ngx_uint_t                      running;    /* of them, not waiting */
    unsigned                        mcp_initializing:1; /* one call makes
                                                   the kernel's session,
                                                   the others wait */
    ngx_queue_t                     inflight;   /* ngx_http_hermes_rpc_call_t */

    ngx_http_hermes_rpc_event_pt    event;
    void                           *data;
};


/*
 * An MCP server as this worker knows it (by its hermes_tools_pass URI):
 * its tools for "hermes_tools auto" (until the worker exits: a reload
 * refreshes them).  Sessions are each kernel's own, in the zone.
 */

typedef struct {
    ngx_str_t                       uri;
    u_char                         *tools;      /* names, NUL-separated */
    size_t                          tools_len;
    u_char                         *schemas;    /* the tools, a JSON list
                                                   (hermes_tools' stubs) */
    size_t                          schemas_len;
    unsigned                        listed:1;
} ngx_http_hermes_mcp_peer_t;


/* one call, in the request's pool: it lives as long as its subrequests */

typedef struct {
    ngx_queue_t                     queue;
    ngx_http_hermes_rpc_t          *rpc;        /* NULL: nobody waits */
    ngx_http_request_t             *sr;         /* the one running */
    uint64_t                        seq;
    ngx_str_t                       tool;
    ngx_str_t                       args;
    ngx_msec_t                      start;
    ngx_uint_t                      status;     /* of the endpoint */
    u_char                         *body;
    size_t                          len;
    size_t                          size;
    size_t                          cap;
    ngx_http_hermes_mcp_peer_t     *peer;       /* MCP */
    ngx_http_hermes_mcp_session_t   ms;         /* the kernel's session */
    ngx_uint_t                      step;
    ngx_str_t                       session;    /* Mcp-Session-Id got */
    ngx_str_t                       cursor;     /* tools/list's next page */
    u_char                         *list;       /* its names so far */
    size_t                          list_len;
    u_char                         *schemas;    /* its tools so far,
                                                   each ",{...}" */
    size_t                          schemas_len;
    size_t                          scanned;    /* of an SSE body: events
                                                   looked at */
    ngx_event_t                     stream;     /* to look at them, posted
                                                   out of the filter */
    ngx_uint_t                      pages;      /* of tools/list, so far */
    u_char                          last_id[NGX_HTTP_HERMES_MCP_EVENT_ID];
    size_t                          last_id_len; /* the stream's last event
                                                   id: 0, none to resume by */
    ngx_msec_t                      retry;      /* its retry:, 0: none */
    ngx_uint_t                      events;     /* with an id, so far */
    ngx_uint_t                      events_seen; /* at the last resume */
    ngx_uint_t                      resumes;    /* without a new event */
    ngx_event_t                     resume;     /* the wait before a GET */
    ngx_str_t                       err;        /* an MCP step's word */
    u_char                          err_buf[NGX_HTTP_HERMES_RPC_ERROR_MAX];
    unsigned                        too_big:1;
    unsigned                        waiting:1;  /* for a running one to end */
    unsigned                        sse:1;
    unsigned                        used_session:1;
    unsigned                        retried:1;
    unsigned                        initializer:1;
    unsigned                        list_only:1; /* a cell's "tools/list":
                                                   the schemas, no call */
    unsigned                        answered:1; /* seen in its stream */
    unsigned                        whole:1;    /* the answer's end came,
                                                   not a broken stream */
} ngx_http_hermes_rpc_call_t;


/* the channel's steps the MCP client takes too */

void ngx_http_hermes_rpc_answer_error(ngx_http_hermes_rpc_t *rpc,
    uint64_t seq, u_char *fmt, ...);
ngx_int_t ngx_http_hermes_rpc_subrequest(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call);
ngx_uint_t ngx_http_hermes_rpc_status(ngx_http_hermes_rpc_call_t *call,
    ngx_int_t rc);
ngx_int_t ngx_http_hermes_rpc_answer_ok(ngx_http_hermes_rpc_t *rpc,
    uint64_t seq, u_char *body, size_t len);
size_t ngx_http_hermes_rpc_utf8_cut(u_char *p, size_t len,
    ngx_uint_t back);
ngx_int_t ngx_http_hermes_rpc_header(ngx_http_request_t *sr, char *key,
    u_char *value, size_t len);
ngx_http_request_t *ngx_http_hermes_rpc_post(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, ngx_buf_t *body);
ngx_int_t ngx_http_hermes_rpc_done(ngx_http_request_t *sr, void *data,
    ngx_int_t rc);
void ngx_http_hermes_rpc_finish(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, ngx_int_t rc);
void ngx_http_hermes_rpc_next(ngx_http_hermes_rpc_t *rpc);
void ngx_http_hermes_rpc_progress(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, char *progress, char *total,
    char *message);

/* the MCP client: a call's steps over the streamable HTTP transport */

ngx_http_hermes_mcp_peer_t *ngx_http_hermes_mcp_peer(ngx_str_t *uri);
ngx_int_t ngx_http_hermes_mcp_peer_has(ngx_http_hermes_mcp_peer_t *peer,
    ngx_str_t *name, ngx_pool_t *pool);
ngx_buf_t *ngx_http_hermes_mcp_body(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call);
ngx_int_t ngx_http_hermes_mcp_next(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, ngx_int_t rc);
ngx_int_t ngx_http_hermes_mcp_answer(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call);
void ngx_http_hermes_mcp_end_sessions(ngx_http_hermes_rpc_t *rpc,
    uint32_t peer);
void ngx_http_hermes_mcp_stream(ngx_event_t *ev);
void ngx_http_hermes_schema_list(ngx_http_hermes_rpc_t *rpc, uint64_t seq);
ngx_int_t ngx_http_hermes_schema_gather(ngx_http_hermes_rpc_call_t *call,
    yajl_val tools, ngx_log_t *log);
void ngx_http_hermes_schema_keep(ngx_http_hermes_mcp_peer_t *peer,
    ngx_http_hermes_rpc_call_t *call, ngx_log_t *log);
void ngx_http_hermes_mcp_forget(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call);


#endif /* _NGX_HERMES_RPC_CALL_H_INCLUDED_ */
