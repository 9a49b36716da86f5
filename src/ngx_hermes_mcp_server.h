
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: the gateway as an MCP server (hermes_mcp): its clients'
 * sessions, kept in the zone so that any worker serves any request of
 * one, across reloads.
 */


#ifndef _NGX_HERMES_MCP_SERVER_H_INCLUDED_
#define _NGX_HERMES_MCP_SERVER_H_INCLUDED_


#include "ngx_hermes.h"


/* Mcp-Session-Id: hex of 16 random bytes */
#define NGX_HTTP_HERMES_MCP_ID_LEN     32


/* the protocol versions served, newest first */
typedef enum {
    NGX_HTTP_HERMES_MCP_2025_11_25 = 0,
    NGX_HTTP_HERMES_MCP_2025_06_18,
    NGX_HTTP_HERMES_MCP_2025_03_26,
    NGX_HTTP_HERMES_MCP_NVERSION
} ngx_http_hermes_mcp_version_e;


/* logging/setLevel's levels, RFC 5424's order; NONE: never set */
typedef enum {
    NGX_HTTP_HERMES_MCP_LOG_NONE = 0,
    NGX_HTTP_HERMES_MCP_LOG_DEBUG,
    NGX_HTTP_HERMES_MCP_LOG_INFO,
    NGX_HTTP_HERMES_MCP_LOG_NOTICE,
    NGX_HTTP_HERMES_MCP_LOG_WARNING,
    NGX_HTTP_HERMES_MCP_LOG_ERROR,
    NGX_HTTP_HERMES_MCP_LOG_CRITICAL,
    NGX_HTTP_HERMES_MCP_LOG_ALERT,
    NGX_HTTP_HERMES_MCP_LOG_EMERGENCY,
    NGX_HTTP_HERMES_MCP_NLOG
} ngx_http_hermes_mcp_log_e;


/* counted by method and by tool (hermes_mcp_requests_total) */
typedef enum {
    NGX_HTTP_HERMES_MCP_M_INITIALIZE = 0,
    NGX_HTTP_HERMES_MCP_M_PING,
    NGX_HTTP_HERMES_MCP_M_TOOLS_LIST,
    NGX_HTTP_HERMES_MCP_M_TOOLS_CALL,
    NGX_HTTP_HERMES_MCP_M_SET_LEVEL,
    NGX_HTTP_HERMES_MCP_M_NOTIFICATION,
    NGX_HTTP_HERMES_MCP_M_DELETE,
    NGX_HTTP_HERMES_MCP_M_OTHER,
    NGX_HTTP_HERMES_MCP_NMETHOD
} ngx_http_hermes_mcp_method_e;


typedef enum {
    NGX_HTTP_HERMES_MCP_T_EXECUTE_CODE = 0,
    NGX_HTTP_HERMES_MCP_T_INTERRUPT,
    NGX_HTTP_HERMES_MCP_T_LIST_KERNELS,
    NGX_HTTP_HERMES_MCP_T_RESET_SESSION,
    NGX_HTTP_HERMES_MCP_T_UPLOAD_FILE,
    NGX_HTTP_HERMES_MCP_T_DOWNLOAD_FILE,
    NGX_HTTP_HERMES_MCP_NTOOL
} ngx_http_hermes_mcp_tool_e;


typedef struct {
    u_char                        id[NGX_HTTP_HERMES_MCP_ID_LEN];
    ngx_uint_t                    version;
    ngx_uint_t                    level;
} ngx_http_hermes_mcp_client_t;


/* one request of a client: what its handlers share */
typedef struct {
    ngx_http_request_t           *r;
    ngx_str_t                     owner;
    ngx_str_t                     id;           /* as JSON; "null": none */
    ngx_http_hermes_mcp_client_t  mc;
    void                         *params;       /* a yajl_val; NULL: none,
                                                   or freed (the request
                                                   answered later) */
} ngx_http_hermes_mcp_req_t;


/* a tool: its arguments a yajl_val (NULL: none); what the handler returns */
typedef ngx_int_t (*ngx_http_hermes_mcp_tool_pt)(
    ngx_http_hermes_mcp_req_t *mr, void *args);


extern ngx_str_t  ngx_http_hermes_mcp_method_names[];
extern ngx_str_t  ngx_http_hermes_mcp_tool_names[];


ngx_int_t ngx_http_hermes_mcp_sessions_open(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_http_hermes_mcp_client_t *mc);
ngx_int_t ngx_http_hermes_mcp_sessions_find(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_http_hermes_mcp_client_t *mc);
ngx_int_t ngx_http_hermes_mcp_sessions_set_level(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_http_hermes_mcp_client_t *mc);
ngx_int_t ngx_http_hermes_mcp_sessions_close(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_http_hermes_mcp_client_t *mc);
void ngx_http_hermes_mcp_sessions_call(ngx_http_hermes_zone_t *zone,
    u_char *id, uint32_t call, ngx_str_t *session);
ngx_int_t ngx_http_hermes_mcp_sessions_cancel(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_http_hermes_mcp_client_t *mc, uint32_t call,
    ngx_str_t *session);

/* the tools' answers (ngx_hermes_mcp_server.c) */
ngx_int_t ngx_http_hermes_mcp_kernel_session(ngx_http_hermes_mcp_req_t *mr,
    void *args, ngx_str_t *session, ngx_int_t *rc);
ngx_int_t ngx_http_hermes_mcp_text(ngx_http_hermes_mcp_req_t *mr,
    ngx_str_t *text, ngx_str_t *structured, ngx_uint_t is_error);
ngx_int_t ngx_http_hermes_mcp_tool_error(ngx_http_hermes_mcp_req_t *mr,
    char *code, char *message);

/* upload_file and download_file (ngx_hermes_mcp_files.c) */
ngx_int_t ngx_http_hermes_mcp_upload_file(ngx_http_hermes_mcp_req_t *mr,
    void *args);
ngx_int_t ngx_http_hermes_mcp_download_file(ngx_http_hermes_mcp_req_t *mr,
    void *args);


#endif /* _NGX_HERMES_MCP_SERVER_H_INCLUDED_ */
