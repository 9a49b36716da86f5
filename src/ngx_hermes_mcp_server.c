
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: hermes_mcp, the gateway as an MCP server over streamable
 * HTTP: JSON-RPC in, JSON or SSE out.  Its tools run cells as
 * /v1/execute does (the same owner, limits, sandbox and registry); a
 * cell's answer is written as JSON-RPC (ngx_http_hermes_mcp_answer), its
 * output as notifications while it runs.
 */


#include "ngx_hermes.h"
#include "ngx_hermes_json_gen.h"

#include <yajl/yajl_tree.h>


/* an event line longer than this is not passed on (a display's data) */
#define NGX_HTTP_HERMES_MCP_LINE_MAX                                          \
    NGX_HTTP_HERMES_ESCAPED_MAX(65536)

#define NGX_HTTP_HERMES_MCP_PARSE_ERROR       -32700
#define NGX_HTTP_HERMES_MCP_INVALID_REQUEST   -32600
#define NGX_HTTP_HERMES_MCP_NO_METHOD         -32601
#define NGX_HTTP_HERMES_MCP_INVALID_PARAMS    -32602
#define NGX_HTTP_HERMES_MCP_INTERNAL_ERROR    -32603


/* an execute_code call while its cell runs: its answer's state */
typedef struct {
    ngx_str_t                       id;
    ngx_http_hermes_zone_t         *zone;       /* NULL: not a cell's */
    u_char                          session[NGX_HTTP_HERMES_MCP_ID_LEN];
    uint32_t                        crc;        /* of the id, for cancels */
    ngx_str_t                       token;      /* progressToken, as JSON */
    ngx_uint_t                      level;
    ngx_uint_t                      progress;
    yajl_gen                        gen;
    u_char                         *line;       /* a line across pieces */
    size_t                          len;
    size_t                          size;
    unsigned                        skip:1;     /* the rest of a long line */
} ngx_http_hermes_mcp_call_t;


static void ngx_http_hermes_mcp_body(ngx_http_request_t *r);
static ngx_int_t ngx_http_hermes_mcp_dispatch(ngx_http_hermes_mcp_req_t *mr,
    const char *method);
static ngx_int_t ngx_http_hermes_mcp_initialize(ngx_http_hermes_mcp_req_t *mr);
static ngx_int_t ngx_http_hermes_mcp_session(ngx_http_hermes_mcp_req_t *mr,
    ngx_int_t *rc);
static ngx_int_t ngx_http_hermes_mcp_set_level(ngx_http_hermes_mcp_req_t *mr);
static void ngx_http_hermes_mcp_cancelled(ngx_http_hermes_mcp_req_t *mr);
static uint32_t ngx_http_hermes_mcp_call_crc(ngx_str_t *id);
static ngx_int_t ngx_http_hermes_mcp_tools_call(ngx_http_hermes_mcp_req_t *mr);
static ngx_int_t ngx_http_hermes_mcp_execute(ngx_http_hermes_mcp_req_t *mr,
    void *data);
static ngx_int_t ngx_http_hermes_mcp_interrupt(ngx_http_hermes_mcp_req_t *mr,
    void *data);
static ngx_int_t ngx_http_hermes_mcp_list_kernels(
    ngx_http_hermes_mcp_req_t *mr, void *data);
static ngx_int_t ngx_http_hermes_mcp_reset(ngx_http_hermes_mcp_req_t *mr,
    void *data);
static ngx_int_t ngx_http_hermes_mcp_delete(ngx_http_request_t *r);
static ngx_uint_t ngx_http_hermes_mcp_allowed(ngx_http_request_t *r);
static ngx_uint_t ngx_http_hermes_mcp_local_host(u_char *p, size_t len);
static ngx_table_elt_t *ngx_http_hermes_mcp_header(ngx_http_request_t *r,
    const char *name);
static ngx_int_t ngx_http_hermes_mcp_version(ngx_str_t *v);
static ngx_int_t ngx_http_hermes_mcp_json_value(ngx_pool_t *pool, yajl_val v,
    ngx_str_t *out);
static ngx_int_t ngx_http_hermes_mcp_reply(ngx_http_hermes_mcp_req_t *mr,
    u_char *result, size_t len);
static ngx_int_t ngx_http_hermes_mcp_error(ngx_http_request_t *r,
    ngx_uint_t status, ngx_str_t *id, ngx_int_t code, char *message);
static ngx_buf_t *ngx_http_hermes_mcp_take(ngx_pool_t *pool, yajl_gen g,
    ngx_uint_t sse);
static ngx_int_t ngx_http_hermes_mcp_output(ngx_http_hermes_response_t *rs,
    u_char *p, size_t n);
static void ngx_http_hermes_mcp_event(ngx_http_hermes_response_t *rs,
    ngx_http_hermes_mcp_call_t *call);
static void ngx_http_hermes_mcp_text_start(yajl_gen g, ngx_str_t *id);
static void ngx_http_hermes_mcp_notification(yajl_gen g, const char *method);
static void ngx_http_hermes_mcp_write_event(ngx_http_hermes_response_t *rs,
    yajl_gen g);
static ngx_buf_t *ngx_http_hermes_mcp_result(ngx_http_request_t *r,
    void *data, ngx_http_hermes_result_t *res,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_request_t *req);
static ngx_buf_t *ngx_http_hermes_mcp_cell_error(ngx_http_request_t *r,
    void *data, ngx_uint_t status, ngx_str_t *code, ngx_str_t *message);
static void ngx_http_hermes_mcp_call_cleanup(void *data);


/* the metrics' labels */

ngx_str_t  ngx_http_hermes_mcp_method_names[] = {
    ngx_string("initialize"),
    ngx_string("ping"),
    ngx_string("tools/list"),
    ngx_string("tools/call"),
    ngx_string("logging/setLevel"),
    ngx_string("notification"),
    ngx_string("DELETE"),
    ngx_string("other")
};


ngx_str_t  ngx_http_hermes_mcp_tool_names[] = {
    ngx_string("execute_code"),
    ngx_string("interrupt"),
    ngx_string("list_kernels"),
    ngx_string("reset_session"),
    ngx_string("upload_file"),
    ngx_string("download_file")
};


/* the tools, in the order of their names */

static ngx_http_hermes_mcp_tool_pt  ngx_http_hermes_mcp_handlers[] = {
    ngx_http_hermes_mcp_execute,
    ngx_http_hermes_mcp_interrupt,
    ngx_http_hermes_mcp_list_kernels,
    ngx_http_hermes_mcp_reset,
    ngx_http_hermes_mcp_upload_file,
    ngx_http_hermes_mcp_download_file
};


static ngx_str_t  ngx_http_hermes_mcp_versions[] = {
    ngx_string("2025-11-25"),
    ngx_string("2025-06-18"),
    ngx_string("2025-03-26")
};


static ngx_str_t  ngx_http_hermes_mcp_levels[] = {
    ngx_null_string,
    ngx_string("debug"),
    ngx_string("info"),
    ngx_string("notice"),
    ngx_string("warning"),
    ngx_string("error"),
    ngx_string("critical"),
    ngx_string("alert"),
    ngx_string("emergency")
};


static ngx_http_hermes_answer_t  ngx_http_hermes_mcp_answer = {
    ngx_string("text/event-stream"),
    "application/json",
    ngx_string(": keep-alive\n\n"),
    ngx_http_hermes_mcp_output,
    ngx_http_hermes_mcp_result,
    ngx_http_hermes_mcp_cell_error
};


#define NGX_HTTP_HERMES_MCP_SCHEMA                                            \
    "\"$schema\":\"https://json-schema.org/draft/2020-12/schema\","

#define NGX_HTTP_HERMES_MCP_SESSION_ARG                                       \
    "\"session\":{\"type\":\"string\","                                       \
    "\"pattern\":\"^[A-Za-z0-9._:-]{1,128}$\","                               \
    "\"description\":\"A kernel session of yours (the same names as "         \
    "/v1/execute's); default: this MCP session's own kernel\"}"

static const char  ngx_http_hermes_mcp_tools[] =
    "{\"tools\":["

    "{\"name\":\"execute_code\",\"title\":\"Run Python\","
    "\"description\":\"Run Python code in a persistent, sandboxed kernel. "
    "Variables, imports and files persist between calls of one session. "
    "Returns what the code printed, its displays (images), and a result "
    "object; an exception or a timeout is an error naming it. The value "
    "of a last expression is printed, as in a notebook.\","
    "\"inputSchema\":{" NGX_HTTP_HERMES_MCP_SCHEMA
    "\"type\":\"object\",\"properties\":{"
    "\"code\":{\"type\":\"string\",\"description\":\"Python source to run\"},"
    NGX_HTTP_HERMES_MCP_SESSION_ARG ","
    "\"timeout\":{\"type\":\"number\",\"exclusiveMinimum\":0,"
    "\"description\":\"Seconds the code may run; at most the server's "
    "limit\"},"
    "\"reset\":{\"type\":\"boolean\",\"default\":false,"
    "\"description\":\"Start from a fresh kernel: all state is dropped\"},"
    "\"environment\":{\"type\":\"string\","
    "\"description\":\"The image the kernel runs in, of those the server "
    "allows; default: its first. A session keeps the one its kernel "
    "started in\"}"
    "},\"required\":[\"code\"],\"additionalProperties\":false}},"

    "{\"name\":\"interrupt\",\"title\":\"Interrupt running code\","
    "\"description\":\"Interrupt the code running in a session's kernel "
    "(KeyboardInterrupt); the kernel and its state are kept.\","
    "\"inputSchema\":{" NGX_HTTP_HERMES_MCP_SCHEMA
    "\"type\":\"object\",\"properties\":{"
    NGX_HTTP_HERMES_MCP_SESSION_ARG
    "},\"additionalProperties\":false}},"

    "{\"name\":\"list_kernels\",\"title\":\"List kernels\","
    "\"description\":\"The kernels you have: session, state, cells run, "
    "idle time.\","
    "\"inputSchema\":{" NGX_HTTP_HERMES_MCP_SCHEMA
    "\"type\":\"object\",\"properties\":{},\"additionalProperties\":false},"
    "\"annotations\":{\"readOnlyHint\":true}},"

    "{\"name\":\"reset_session\",\"title\":\"End a kernel\","
    "\"description\":\"End a session's kernel and drop its state (a running "
    "cell is killed). The next execute_code starts a fresh kernel.\","
    "\"inputSchema\":{" NGX_HTTP_HERMES_MCP_SCHEMA
    "\"type\":\"object\",\"properties\":{"
    NGX_HTTP_HERMES_MCP_SESSION_ARG
    "},\"additionalProperties\":false},"
    "\"annotations\":{\"destructiveHint\":true}},"

    "{\"name\":\"upload_file\",\"title\":\"Put a file in the kernel\","
    "\"description\":\"Write a file into a session's kernel directory "
    "(the code's working directory), replacing one there; directories on "
    "the way are made. Text as it is (utf-8), or any bytes as base64. The "
    "next execute_code opens it by the same relative path.\","
    "\"inputSchema\":{" NGX_HTTP_HERMES_MCP_SCHEMA
    "\"type\":\"object\",\"properties\":{"
    "\"path\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":1024,"
    "\"description\":\"Relative to the kernel directory, without .. or "
    "empty parts, e.g. data/input.csv\"},"
    "\"content\":{\"type\":\"string\","
    "\"description\":\"The file's content, as encoding says\"},"
    "\"encoding\":{\"type\":\"string\",\"enum\":[\"utf-8\",\"base64\"],"
    "\"default\":\"utf-8\",\"description\":\"utf-8: content is the text; "
    "base64: content is the bytes in base64\"},"
    NGX_HTTP_HERMES_MCP_SESSION_ARG
    "},\"required\":[\"path\",\"content\"],"
    "\"additionalProperties\":false}},"

    "{\"name\":\"download_file\",\"title\":\"Get a file from the kernel\","
    "\"description\":\"Read a file of a session's kernel directory (one "
    "the code wrote, say). Returns text when it is UTF-8, an image for PNG "
    "and JPEG, else the bytes as a base64 resource; and {path, size, "
    "encoding}. Files over a few MiB are refused (file_too_large).\","
    "\"inputSchema\":{" NGX_HTTP_HERMES_MCP_SCHEMA
    "\"type\":\"object\",\"properties\":{"
    "\"path\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":1024,"
    "\"description\":\"Relative to the kernel directory, e.g. "
    "out/plot.png\"},"
    NGX_HTTP_HERMES_MCP_SESSION_ARG
    "},\"required\":[\"path\"],\"additionalProperties\":false},"
    "\"annotations\":{\"readOnlyHint\":true}}"

    "]}";


ngx_int_t
ngx_http_hermes_mcp_handler(ngx_http_request_t *r)
{
    ngx_int_t               rc;
    ngx_http_hermes_ctx_t  *ctx;

    if (!ngx_http_hermes_mcp_allowed(r)) {
        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        return ngx_http_hermes_mcp_error(r, NGX_HTTP_FORBIDDEN, NULL,
                                         NGX_HTTP_HERMES_MCP_INVALID_REQUEST,
                                         "this Host or Origin is not "
                                         "allowed (hermes_mcp_hosts, "
                                         "hermes_mcp_origins)");
    }

    if (r->method == NGX_HTTP_DELETE) {
        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        return ngx_http_hermes_mcp_delete(r);
    }

    if (r->method != NGX_HTTP_POST) {
        /* no stream of our own to offer: the spec's answer is 405 */

        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        if (ngx_http_hermes_response_add_header(r, "Allow", "POST, DELETE")
            != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_hermes_mcp_error(r, NGX_HTTP_NOT_ALLOWED, NULL,
                                         NGX_HTTP_HERMES_MCP_INVALID_REQUEST,
                                         "use POST (JSON-RPC) or DELETE");
    }

    if (!ngx_http_hermes_content_is_json(r)) {
        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        return ngx_http_hermes_mcp_error(r, NGX_HTTP_UNSUPPORTED_MEDIA_TYPE,
                                         NULL,
                                         NGX_HTTP_HERMES_MCP_INVALID_REQUEST,
                                         "the body must be application/json");
    }

    ctx = ngx_http_hermes_response_ctx(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    r->request_body_in_single_buf = 1;

    rc = ngx_http_read_client_request_body(r, ngx_http_hermes_mcp_body);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


static void
ngx_http_hermes_mcp_body(ngx_http_request_t *r)
{
    u_char                     *body;
    size_t                      len;
    ngx_int_t                   rc;
    yajl_val                    root, v, method;
    ngx_http_hermes_mcp_req_t   mr;
    const char                 *pmethod[] = { "method", NULL };
    const char                 *pid[] = { "id", NULL };
    const char                 *pversion[] = { "jsonrpc", NULL };
    const char                 *pparams[] = { "params", NULL };

    ngx_memzero(&mr, sizeof(ngx_http_hermes_mcp_req_t));
    mr.r = r;
    ngx_str_set(&mr.id, "null");

    if (ngx_http_hermes_owner(r, &mr.owner, &rc) != NGX_OK) {
        ngx_http_finalize_request(r, rc);
        return;
    }

    body = ngx_http_hermes_read_body(r, &len);
    if (body == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    root = yajl_tree_parse((const char *) body, NULL, 0);

    if (root == NULL) {
        ngx_http_finalize_request(r,
                      ngx_http_hermes_mcp_error(r, NGX_HTTP_BAD_REQUEST, NULL,
                                        NGX_HTTP_HERMES_MCP_PARSE_ERROR,
                                        "the body is not JSON"));
        return;
    }

    if (!YAJL_IS_OBJECT(root)) {
        yajl_tree_free(root);
        ngx_http_finalize_request(r,
                      ngx_http_hermes_mcp_error(r, NGX_HTTP_BAD_REQUEST, NULL,
                                        NGX_HTTP_HERMES_MCP_INVALID_REQUEST,
                                        "one JSON-RPC message per POST: "
                                        "batches are not supported"));
        return;
    }

    method = yajl_tree_get(root, pmethod, yajl_t_any);
    v = yajl_tree_get(root, pid, yajl_t_any);

    if (v && (YAJL_IS_STRING(v) || YAJL_IS_INTEGER(v))) {
        if (ngx_http_hermes_mcp_json_value(r->pool, v, &mr.id) != NGX_OK) {
            yajl_tree_free(root);
            ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
            return;
        }

    } else if (v) {
        yajl_tree_free(root);
        ngx_http_finalize_request(r,
                      ngx_http_hermes_mcp_error(r, NGX_HTTP_BAD_REQUEST, NULL,
                                        NGX_HTTP_HERMES_MCP_INVALID_REQUEST,
                                        "\"id\" must be a string or an "
                                        "integer"));
        return;
    }

    v = yajl_tree_get(root, pversion, yajl_t_string);

    if (v == NULL || ngx_strcmp(v->u.string, "2.0") != 0
        || (method && !YAJL_IS_STRING(method)))
    {
        yajl_tree_free(root);
        ngx_http_finalize_request(r,
                      ngx_http_hermes_mcp_error(r, NGX_HTTP_BAD_REQUEST,
                                        &mr.id,
                                        NGX_HTTP_HERMES_MCP_INVALID_REQUEST,
                                        "not a JSON-RPC 2.0 message"));
        return;
    }

    mr.params = yajl_tree_get(root, pparams, yajl_t_object);

    if (method == NULL) {
        /* a client's answer: we send no requests, so nothing waits for it */
        yajl_tree_free(root);
        ngx_http_finalize_request(r,
                  ngx_http_hermes_response_send_buf(r, NGX_HTTP_ACCEPTED,
                                                    "application/json", NULL));
        return;
    }

    rc = ngx_http_hermes_mcp_dispatch(&mr, method->u.string);

    yajl_tree_free(root);

    if (rc != NGX_DONE) {
        ngx_http_finalize_request(r, rc);
    }
}


static ngx_int_t
ngx_http_hermes_mcp_dispatch(ngx_http_hermes_mcp_req_t *mr,
    const char *method)
{
    ngx_int_t                    rc;
    ngx_uint_t                   notification;
    ngx_http_request_t          *r;
    ngx_http_hermes_zone_t      *zone;
    ngx_http_hermes_loc_conf_t  *hlcf;

    r = mr->r;
    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);
    zone = hlcf->shm_zone->data;

    notification = (mr->id.len == 4
                    && ngx_strncmp(mr->id.data, "null", 4) == 0);

    if (!notification && ngx_strcmp(method, "initialize") == 0) {
        ngx_http_hermes_count(zone,
                       mcp_requests_total[NGX_HTTP_HERMES_MCP_M_INITIALIZE]);
        return ngx_http_hermes_mcp_initialize(mr);
    }

    if (ngx_http_hermes_mcp_session(mr, &rc) != NGX_OK) {
        return rc;
    }

    if (notification) {
        /* initialized, cancelled, progress: nothing to answer */

        if (ngx_strcmp(method, "notifications/cancelled") == 0) {
            ngx_http_hermes_mcp_cancelled(mr);
        }

        ngx_http_hermes_count(zone,
                     mcp_requests_total[NGX_HTTP_HERMES_MCP_M_NOTIFICATION]);

        return ngx_http_hermes_response_send_buf(r, NGX_HTTP_ACCEPTED,
                                                 "application/json", NULL);
    }

    if (ngx_strcmp(method, "ping") == 0) {
        ngx_http_hermes_count(zone,
                             mcp_requests_total[NGX_HTTP_HERMES_MCP_M_PING]);
        return ngx_http_hermes_mcp_reply(mr, (u_char *) "{}", 2);
    }

    if (ngx_strcmp(method, "tools/list") == 0) {
        ngx_http_hermes_count(zone,
                       mcp_requests_total[NGX_HTTP_HERMES_MCP_M_TOOLS_LIST]);
        return ngx_http_hermes_mcp_reply(mr,
                                   (u_char *) ngx_http_hermes_mcp_tools,
                                   sizeof(ngx_http_hermes_mcp_tools) - 1);
    }

    if (ngx_strcmp(method, "tools/call") == 0) {
        ngx_http_hermes_count(zone,
                       mcp_requests_total[NGX_HTTP_HERMES_MCP_M_TOOLS_CALL]);
        return ngx_http_hermes_mcp_tools_call(mr);
    }

    if (ngx_strcmp(method, "logging/setLevel") == 0) {
        ngx_http_hermes_count(zone,
                        mcp_requests_total[NGX_HTTP_HERMES_MCP_M_SET_LEVEL]);
        return ngx_http_hermes_mcp_set_level(mr);
    }

    ngx_http_hermes_count(zone, mcp_requests_total[NGX_HTTP_HERMES_MCP_M_OTHER]);

    return ngx_http_hermes_mcp_error(r, NGX_HTTP_OK, &mr->id,
                                     NGX_HTTP_HERMES_MCP_NO_METHOD,
                                     "method not found");
}


/*
 * A new session, bound to the owner: the client's version if we serve
 * it, else our newest (the client decides whether it can go on).
 */

static ngx_int_t
ngx_http_hermes_mcp_initialize(ngx_http_hermes_mcp_req_t *mr)
{
    u_char                      *p;
    ngx_int_t                    v;
    ngx_str_t                    s, *version;
    yajl_val                     pv;
    ngx_http_request_t          *r;
    ngx_http_hermes_loc_conf_t  *hlcf;
    const char                  *path[] = { "protocolVersion", NULL };

    r = mr->r;
    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    pv = mr->params ? yajl_tree_get(mr->params, path, yajl_t_string) : NULL;

    if (pv == NULL) {
        return ngx_http_hermes_mcp_error(r, NGX_HTTP_OK, &mr->id,
                                         NGX_HTTP_HERMES_MCP_INVALID_PARAMS,
                                         "initialize needs "
                                         "params.protocolVersion");
    }

    s.data = (u_char *) pv->u.string;
    s.len = ngx_strlen(pv->u.string);

    v = ngx_http_hermes_mcp_version(&s);

    mr->mc.version = (v == NGX_ERROR) ? NGX_HTTP_HERMES_MCP_2025_11_25
                                      : (ngx_uint_t) v;
    mr->mc.level = NGX_HTTP_HERMES_MCP_LOG_NONE;

    if (ngx_http_hermes_mcp_sessions_open(hlcf->shm_zone->data, &mr->owner,
                                          &mr->mc)
        != NGX_OK)
    {
        return ngx_http_hermes_mcp_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                         &mr->id,
                                         NGX_HTTP_HERMES_MCP_INTERNAL_ERROR,
                                         "no room for another session in "
                                         "the hermes_zone");
    }

    p = ngx_pnalloc(r->pool, NGX_HTTP_HERMES_MCP_ID_LEN + 1);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_memcpy(p, mr->mc.id, NGX_HTTP_HERMES_MCP_ID_LEN);
    p[NGX_HTTP_HERMES_MCP_ID_LEN] = '\0';

    if (ngx_http_hermes_response_add_header(r, "Mcp-Session-Id", (char *) p)
        != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    version = &ngx_http_hermes_mcp_versions[mr->mc.version];

    p = ngx_pnalloc(r->pool, 1024);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    s.data = p;
    s.len = ngx_snprintf(p, 1024,
               "{\"protocolVersion\":\"%V\","
               "\"capabilities\":{\"tools\":{\"listChanged\":false},"
               "\"logging\":{}},"
               "\"serverInfo\":{\"name\":\"ngx_hermes\","
               "\"title\":\"ngx_hermes code execution gateway\","
               "\"version\":\"%V\"},"
               "\"instructions\":\"execute_code runs Python in a persistent "
               "sandboxed kernel of this MCP session: variables, imports and "
               "files are kept between calls. Print what you want to see; "
               "an exception is an error naming it. upload_file and "
               "download_file move files into and out of its working "
               "directory.\"}",
               version, &ngx_http_hermes_version)
             - p;

    return ngx_http_hermes_mcp_reply(mr, s.data, s.len);
}


/*
 * Every message after initialize names its session (ours, the owner's)
 * and may name the protocol version.  NGX_DECLINED: it does not; the
 * request ends with *rc, its answer under way.
 */

static ngx_int_t
ngx_http_hermes_mcp_session(ngx_http_hermes_mcp_req_t *mr, ngx_int_t *rc)
{
    ngx_uint_t                   i;
    ngx_table_elt_t             *h;
    ngx_http_request_t          *r;
    ngx_http_hermes_loc_conf_t  *hlcf;

    r = mr->r;
    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    h = ngx_http_hermes_mcp_header(r, "MCP-Protocol-Version");

    if (h && ngx_http_hermes_mcp_version(&h->value) == NGX_ERROR) {
        *rc = ngx_http_hermes_mcp_error(r, NGX_HTTP_BAD_REQUEST, &mr->id,
                                         NGX_HTTP_HERMES_MCP_INVALID_REQUEST,
                                         "unsupported MCP-Protocol-Version: "
                                         "2025-11-25, 2025-06-18 and "
                                         "2025-03-26 are served");
        return NGX_DECLINED;
    }

    h = ngx_http_hermes_mcp_header(r, "Mcp-Session-Id");

    if (h == NULL) {
        *rc = ngx_http_hermes_mcp_error(r, NGX_HTTP_BAD_REQUEST, &mr->id,
                                         NGX_HTTP_HERMES_MCP_INVALID_REQUEST,
                                         "no Mcp-Session-Id: initialize "
                                         "first");
        return NGX_DECLINED;
    }

    if (h->value.len != NGX_HTTP_HERMES_MCP_ID_LEN) {
        goto unknown;
    }

    for (i = 0; i < NGX_HTTP_HERMES_MCP_ID_LEN; i++) {
        if (!((h->value.data[i] >= '0' && h->value.data[i] <= '9')
              || (h->value.data[i] >= 'a' && h->value.data[i] <= 'f')))
        {
            goto unknown;
        }
    }

    ngx_memcpy(mr->mc.id, h->value.data, NGX_HTTP_HERMES_MCP_ID_LEN);

    if (ngx_http_hermes_mcp_sessions_find(hlcf->shm_zone->data, &mr->owner,
                                          &mr->mc)
        == NGX_OK)
    {
        return NGX_OK;
    }

unknown:

    /* the spec's answer: the client starts a new session */

    *rc = ngx_http_hermes_mcp_error(r, NGX_HTTP_NOT_FOUND, &mr->id,
                                    NGX_HTTP_HERMES_MCP_INVALID_REQUEST,
                                    "no such session: initialize again");
    return NGX_DECLINED;
}


static ngx_int_t
ngx_http_hermes_mcp_set_level(ngx_http_hermes_mcp_req_t *mr)
{
    ngx_uint_t                   i;
    yajl_val                     v;
    ngx_http_hermes_loc_conf_t  *hlcf;
    const char                  *path[] = { "level", NULL };

    hlcf = ngx_http_get_module_loc_conf(mr->r, ngx_http_hermes_module);

    v = mr->params ? yajl_tree_get(mr->params, path, yajl_t_string) : NULL;

    for (i = 1; v && i < NGX_HTTP_HERMES_MCP_NLOG; i++) {
        if (ngx_strcmp(v->u.string, ngx_http_hermes_mcp_levels[i].data) == 0) {
            mr->mc.level = i;

            if (ngx_http_hermes_mcp_sessions_set_level(hlcf->shm_zone->data,
                                                       &mr->owner, &mr->mc)
                != NGX_OK)
            {
                break;
            }

            return ngx_http_hermes_mcp_reply(mr, (u_char *) "{}", 2);
        }
    }

    return ngx_http_hermes_mcp_error(mr->r, NGX_HTTP_OK, &mr->id,
                                     NGX_HTTP_HERMES_MCP_INVALID_PARAMS,
                                     "params.level must be one of debug, "
                                     "info, notice, warning, error, "
                                     "critical, alert, emergency");
}


/*
 * notifications/cancelled of an execute_code in flight: its cell is
 * interrupted, as the interrupt tool would (the kernel lives on).  The
 * session remembers its last call only: an earlier one is not found.
 */

static void
ngx_http_hermes_mcp_cancelled(ngx_http_hermes_mcp_req_t *mr)
{
    u_char                       name[NGX_HTTP_HERMES_SESSION_MAX];
    uint32_t                     cell;
    ngx_str_t                    id, session;
    yajl_val                     v;
    ngx_http_hermes_zone_t      *zone;
    ngx_http_hermes_victim_t     victim;
    ngx_http_hermes_loc_conf_t  *hlcf;
    const char                  *path[] = { "requestId", NULL };

    hlcf = ngx_http_get_module_loc_conf(mr->r, ngx_http_hermes_module);
    zone = hlcf->shm_zone->data;

    v = mr->params ? yajl_tree_get(mr->params, path, yajl_t_any) : NULL;

    if (v == NULL || !(YAJL_IS_STRING(v) || YAJL_IS_INTEGER(v))
        || ngx_http_hermes_mcp_json_value(mr->r->pool, v, &id) != NGX_OK)
    {
        return;
    }

    session.data = name;

    if (ngx_http_hermes_mcp_sessions_cancel(zone, &mr->owner, &mr->mc,
                                            ngx_http_hermes_mcp_call_crc(&id),
                                            &session)
        != NGX_OK)
    {
        return;
    }

    if (ngx_http_hermes_registry_running(zone, &mr->owner, &session, &victim,
                                         &cell)
        == NGX_OK)
    {
        (void) ngx_http_hermes_kernel_interrupt(&victim, cell,
                                                mr->r->connection->log);
    }
}


static uint32_t
ngx_http_hermes_mcp_call_crc(ngx_str_t *id)
{
    uint32_t  crc;

    crc = ngx_crc32_short(id->data, id->len);

    return crc ? crc : 1;
}


static ngx_int_t
ngx_http_hermes_mcp_tools_call(ngx_http_hermes_mcp_req_t *mr)
{
    yajl_val                 name, args;
    ngx_uint_t               i;
    ngx_http_hermes_zone_t  *zone;
    const char              *pname[] = { "name", NULL };
    const char              *pargs[] = { "arguments", NULL };

    zone = ((ngx_http_hermes_loc_conf_t *)
            ngx_http_get_module_loc_conf(mr->r, ngx_http_hermes_module))
           ->shm_zone->data;

    name = mr->params ? yajl_tree_get(mr->params, pname, yajl_t_string)
                      : NULL;
    args = mr->params ? yajl_tree_get(mr->params, pargs, yajl_t_any) : NULL;

    if (name == NULL || (args && !YAJL_IS_OBJECT(args))) {
        return ngx_http_hermes_mcp_error(mr->r, NGX_HTTP_OK, &mr->id,
                                         NGX_HTTP_HERMES_MCP_INVALID_PARAMS,
                                         "tools/call needs params.name and "
                                         "an object of params.arguments");
    }

    for (i = 0; i < NGX_HTTP_HERMES_MCP_NTOOL; i++) {
        if (ngx_strcmp(name->u.string, ngx_http_hermes_mcp_tool_names[i].data)
            == 0)
        {
            ngx_http_hermes_count(zone, mcp_tool_calls_total[i]);
            return ngx_http_hermes_mcp_handlers[i](mr, args);
        }
    }

    return ngx_http_hermes_mcp_error(mr->r, NGX_HTTP_OK, &mr->id,
                                     NGX_HTTP_HERMES_MCP_INVALID_PARAMS,
                                     "unknown tool: tools/list names them");
}


/* execute_code: a cell, as /v1/execute runs it, answered in JSON-RPC */

static ngx_int_t
ngx_http_hermes_mcp_execute(ngx_http_hermes_mcp_req_t *mr, void *data)
{
    yajl_val args = data;

    ngx_int_t                    rc;
    yajl_val                     v, token;
    ngx_http_request_t          *r;
    ngx_http_hermes_ctx_t       *ctx;
    ngx_pool_cleanup_t          *cln;
    ngx_http_hermes_request_t    req;
    ngx_http_hermes_loc_conf_t  *hlcf;
    ngx_http_hermes_mcp_call_t  *call;
    const char                  *pcode[] = { "code", NULL };
    const char                  *ptimeout[] = { "timeout", NULL };
    const char                  *preset[] = { "reset", NULL };
    const char                  *penv[] = { "environment", NULL };
    const char                  *ptoken[] = { "_meta", "progressToken",
                                              NULL };

    r = mr->r;
    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    ngx_memzero(&req, sizeof(ngx_http_hermes_request_t));

    v = args ? yajl_tree_get(args, pcode, yajl_t_any) : NULL;

    if (v == NULL || !YAJL_IS_STRING(v)) {
        return ngx_http_hermes_mcp_tool_error(mr, "invalid_request",
                                              "\"code\" (a string) is "
                                              "required");
    }

    req.code.data = (u_char *) v->u.string;
    req.code.len = ngx_strlen(v->u.string);

    if (req.code.len > hlcf->max_code) {
        return ngx_http_hermes_mcp_tool_error(mr, "code_too_large",
                                              "\"code\" is over this "
                                              "server's hermes_max_code");
    }

    if (ngx_http_hermes_mcp_kernel_session(mr, args, &req.session, &rc)
        != NGX_OK)
    {
        return rc;
    }

    v = args ? yajl_tree_get(args, ptimeout, yajl_t_any) : NULL;

    if (v) {
        if (!YAJL_IS_NUMBER(v) || YAJL_GET_DOUBLE(v) <= 0) {
            return ngx_http_hermes_mcp_tool_error(mr, "invalid_request",
                                                  "\"timeout\" must be a "
                                                  "number of seconds over 0");
        }

        if (YAJL_GET_DOUBLE(v) * 1000 > (double) hlcf->cell_timeout) {
            return ngx_http_hermes_mcp_tool_error(mr, "invalid_request",
                                                  "\"timeout\" is over this "
                                                  "server's "
                                                  "hermes_cell_timeout");
        }

        req.timeout = (ngx_msec_t) (YAJL_GET_DOUBLE(v) * 1000);

        if (req.timeout == 0) {
            req.timeout = 1;
        }
    }

    v = args ? yajl_tree_get(args, preset, yajl_t_any) : NULL;

    if (v) {
        if (!YAJL_IS_TRUE(v) && !YAJL_IS_FALSE(v)) {
            return ngx_http_hermes_mcp_tool_error(mr, "invalid_request",
                                                  "\"reset\" must be true "
                                                  "or false");
        }

        req.reset = YAJL_IS_TRUE(v);
    }

    v = args ? yajl_tree_get(args, penv, yajl_t_any) : NULL;

    if (v) {
        if (!YAJL_IS_STRING(v)) {
            return ngx_http_hermes_mcp_tool_error(mr, "invalid_environment",
                                                  "\"environment\" must be "
                                                  "a name");
        }

        req.environment.data = (u_char *) v->u.string;
        req.environment.len = ngx_strlen(v->u.string);
    }

    if (ngx_http_hermes_environment_pick(hlcf, &req.environment, &req.env)
        != NGX_OK)
    {
        return ngx_http_hermes_mcp_tool_error(mr, "invalid_environment",
                                              "this server does not allow "
                                              "that environment");
    }

    call = ngx_pcalloc(r->pool, sizeof(ngx_http_hermes_mcp_call_t));
    if (call == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    call->id = mr->id;
    call->level = mr->mc.level;

    /* a notifications/cancelled of this id, to any worker, interrupts */
    call->zone = hlcf->shm_zone->data;
    call->crc = ngx_http_hermes_mcp_call_crc(&mr->id);
    ngx_memcpy(call->session, mr->mc.id, NGX_HTTP_HERMES_MCP_ID_LEN);

    token = mr->params ? yajl_tree_get(mr->params, ptoken, yajl_t_any) : NULL;

    if (token && (YAJL_IS_STRING(token) || YAJL_IS_INTEGER(token))) {
        if (ngx_http_hermes_mcp_json_value(r->pool, token, &call->token)
            != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    if (call->token.len || call->level != NGX_HTTP_HERMES_MCP_LOG_NONE) {
        cln = ngx_pool_cleanup_add(r->pool, 0);
        if (cln == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        call->gen = yajl_gen_alloc(NULL);
        if (call->gen == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        cln->handler = ngx_http_hermes_mcp_call_cleanup;
        cln->data = call;
    }

    ctx = ngx_http_hermes_response_ctx(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->answer = &ngx_http_hermes_mcp_answer;
    ctx->answer_data = call;

    ngx_http_hermes_mcp_sessions_call(call->zone, call->session, call->crc,
                                      &req.session);

    return ngx_http_hermes_cell_start(r, &req, &mr->owner);
}


static ngx_int_t
ngx_http_hermes_mcp_interrupt(ngx_http_hermes_mcp_req_t *mr, void *data)
{
    yajl_val args = data;

    u_char                       buf[64];
    uint32_t                     cell;
    ngx_int_t                    rc;
    ngx_str_t                    session, text;
    ngx_http_hermes_zone_t      *zone;
    ngx_http_hermes_victim_t     v;
    ngx_http_hermes_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(mr->r, ngx_http_hermes_module);
    zone = hlcf->shm_zone->data;

    if (ngx_http_hermes_mcp_kernel_session(mr, args, &session, &rc)
        != NGX_OK)
    {
        return rc;
    }

    rc = ngx_http_hermes_registry_running(zone, &mr->owner, &session, &v,
                                          &cell);

    if (rc == NGX_DECLINED) {
        return ngx_http_hermes_mcp_tool_error(mr, "not_found",
                                              "no kernel of yours for this "
                                              "session");
    }

    if (rc == NGX_OK) {
        rc = ngx_http_hermes_kernel_interrupt(&v, cell, mr->r->connection->log);

        if (rc == NGX_ERROR) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    if (rc != NGX_OK) {
        return ngx_http_hermes_mcp_tool_error(mr, "no_cell",
                                              "no cell is running on this "
                                              "session's kernel");
    }

    text.data = buf;
    text.len = ngx_sprintf(buf, "interrupted cell %uD", cell) - buf;

    return ngx_http_hermes_mcp_text(mr, &text, NULL, 0);
}


static ngx_int_t
ngx_http_hermes_mcp_list_kernels(ngx_http_hermes_mcp_req_t *mr, void *data)
{
    ngx_str_t                    text;
    ngx_buf_t                   *b;
    ngx_array_t                  list;
    ngx_http_request_t          *r;
    ngx_http_hermes_loc_conf_t  *hlcf;

    r = mr->r;
    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    if (ngx_array_init(&list, r->pool, 8, sizeof(ngx_http_hermes_listing_t))
        != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_hermes_registry_list(hlcf->shm_zone->data, &mr->owner, &list)
        != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_http_hermes_name_backends(r, &list);

    b = ngx_http_hermes_json_listing(r->pool, &list);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* the same object, for the model to read and for the client's code */

    text.data = b->pos;
    text.len = b->last - b->pos - 1;    /* no "\n" */

    return ngx_http_hermes_mcp_text(mr, &text, &text, 0);
}


static ngx_int_t
ngx_http_hermes_mcp_reset(ngx_http_hermes_mcp_req_t *mr, void *data)
{
    yajl_val args = data;

    ngx_int_t                    rc;
    ngx_str_t                    session, text;
    ngx_http_hermes_victims_t    victims;
    ngx_http_hermes_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(mr->r, ngx_http_hermes_module);

    if (ngx_http_hermes_mcp_kernel_session(mr, args, &session, &rc)
        != NGX_OK)
    {
        return rc;
    }

    victims.n = 0;

    rc = ngx_http_hermes_registry_shutdown(hlcf->shm_zone->data, &mr->owner,
                                           &session, 1, &victims);

    ngx_http_hermes_kernel_kill_victims(hlcf->thread_pool, &victims,
                                        mr->r->connection->log);

    if (rc != NGX_OK) {
        return ngx_http_hermes_mcp_tool_error(mr, "not_found",
                                              "no kernel of yours for this "
                                              "session");
    }

    ngx_str_set(&text, "the kernel ended; the next execute_code starts a "
                       "fresh one");

    return ngx_http_hermes_mcp_text(mr, &text, NULL, 0);
}


/* DELETE: the session ends, and its own kernel with it */

static ngx_int_t
ngx_http_hermes_mcp_delete(ngx_http_request_t *r)
{
    u_char                       name[sizeof("mcp-") - 1
                                      + NGX_HTTP_HERMES_MCP_ID_LEN];
    ngx_int_t                    rc;
    ngx_str_t                    session;
    ngx_http_hermes_zone_t      *zone;
    ngx_http_hermes_victims_t    victims;
    ngx_http_hermes_mcp_req_t    mr;
    ngx_http_hermes_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);
    zone = hlcf->shm_zone->data;

    ngx_memzero(&mr, sizeof(ngx_http_hermes_mcp_req_t));
    mr.r = r;
    ngx_str_set(&mr.id, "null");

    if (ngx_http_hermes_owner(r, &mr.owner, &rc) != NGX_OK) {
        return rc;
    }

    ngx_http_hermes_count(zone, mcp_requests_total[NGX_HTTP_HERMES_MCP_M_DELETE]);

    if (ngx_http_hermes_mcp_session(&mr, &rc) != NGX_OK) {
        return rc;
    }

    (void) ngx_http_hermes_mcp_sessions_close(zone, &mr.owner, &mr.mc);

    session.data = name;
    session.len = ngx_sprintf(name, "mcp-%*s",
                              (size_t) NGX_HTTP_HERMES_MCP_ID_LEN, mr.mc.id)
                  - name;

    victims.n = 0;

    (void) ngx_http_hermes_registry_shutdown(zone, &mr.owner, &session, 1,
                                             &victims);

    ngx_http_hermes_kernel_kill_victims(hlcf->thread_pool, &victims,
                                        r->connection->log);

    return ngx_http_hermes_response_send_buf(r, NGX_HTTP_OK,
                                             "application/json", NULL);
}


/*
 * The kernel session a tool names, or the MCP session's own.
 * NGX_DECLINED: an invalid one; the request ends with *rc.
 */

ngx_int_t
ngx_http_hermes_mcp_kernel_session(ngx_http_hermes_mcp_req_t *mr,
    void *args, ngx_str_t *session, ngx_int_t *rc)
{
    u_char      *p;
    yajl_val     v;
    const char  *path[] = { "session", NULL };

    v = args ? yajl_tree_get(args, path, yajl_t_any) : NULL;

    if (v) {
        if (!YAJL_IS_STRING(v)) {
            goto invalid;
        }

        session->len = ngx_strlen(v->u.string);
        session->data = ngx_pnalloc(mr->r->pool, session->len);
        if (session->data == NULL) {
            *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
            return NGX_DECLINED;
        }

        ngx_memcpy(session->data, v->u.string, session->len);

        if (!ngx_http_hermes_json_session_valid(session)) {
            goto invalid;
        }

        return NGX_OK;
    }

    p = ngx_pnalloc(mr->r->pool, sizeof("mcp-") - 1
                                 + NGX_HTTP_HERMES_MCP_ID_LEN);
    if (p == NULL) {
        *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        return NGX_DECLINED;
    }

    session->data = p;
    session->len = ngx_sprintf(p, "mcp-%*s",
                               (size_t) NGX_HTTP_HERMES_MCP_ID_LEN,
                               mr->mc.id)
                   - p;

    return NGX_OK;

invalid:

    *rc = ngx_http_hermes_mcp_tool_error(mr, "invalid_session",
                                         "\"session\" must be 1-128 "
                                         "characters of [A-Za-z0-9._:-]");
    return NGX_DECLINED;
}


/*
 * DNS rebinding: a page elsewhere must not reach a gateway on this host
 * through a name of its own.  The Host (and the Origin, when a browser
 * sends one) must be of this host, or named by hermes_mcp_hosts or
 * hermes_mcp_origins ("*": any).
 */

static ngx_uint_t
ngx_http_hermes_mcp_allowed(ngx_http_request_t *r)
{
    u_char                      *p, *last, *host;
    ngx_str_t                   *s;
    ngx_uint_t                   i;
    ngx_table_elt_t             *origin;
    ngx_http_hermes_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    /* r->headers_in.server: the Host, without its port, in lowercase */

    if (hlcf->mcp_hosts == NULL) {
        if (r->headers_in.server.len
            && !ngx_http_hermes_mcp_local_host(r->headers_in.server.data,
                                               r->headers_in.server.len))
        {
            return 0;
        }

    } else {
        s = hlcf->mcp_hosts->elts;

        for (i = 0; i < hlcf->mcp_hosts->nelts; i++) {
            if ((s[i].len == 1 && s[i].data[0] == '*')
                || (s[i].len == r->headers_in.server.len
                    && ngx_strncasecmp(s[i].data, r->headers_in.server.data,
                                       s[i].len) == 0))
            {
                break;
            }
        }

        if (i == hlcf->mcp_hosts->nelts) {
            return 0;
        }
    }

    origin = ngx_http_hermes_mcp_header(r, "Origin");

    if (origin == NULL) {
        return 1;
    }

    if (hlcf->mcp_origins) {
        s = hlcf->mcp_origins->elts;

        for (i = 0; i < hlcf->mcp_origins->nelts; i++) {
            if ((s[i].len == 1 && s[i].data[0] == '*')
                || (s[i].len == origin->value.len
                    && ngx_strncasecmp(s[i].data, origin->value.data,
                                       s[i].len) == 0))
            {
                return 1;
            }
        }

        return 0;
    }

    /* scheme://host[:port] of this host */

    p = origin->value.data;
    last = p + origin->value.len;

    host = ngx_strlcasestrn(p, last, (u_char *) "://", 3 - 1);
    if (host == NULL) {
        return 0;
    }

    host += 3;

    if (host < last && *host == '[') {
        p = ngx_strlchr(host, last, ']');
        p = p ? p + 1 : last;

    } else {
        p = ngx_strlchr(host, last, ':');
        p = p ? p : last;
    }

    if (p < last && *p != ':') {
        return 0;
    }

    return ngx_http_hermes_mcp_local_host(host, p - host);
}


static ngx_uint_t
ngx_http_hermes_mcp_local_host(u_char *p, size_t len)
{
    return (len == sizeof("localhost") - 1
            && ngx_strncasecmp(p, (u_char *) "localhost", len) == 0)
           || (len == sizeof("127.0.0.1") - 1
               && ngx_strncmp(p, "127.0.0.1", len) == 0)
           || (len == sizeof("[::1]") - 1 && ngx_strncmp(p, "[::1]", len) == 0);
}


static ngx_table_elt_t *
ngx_http_hermes_mcp_header(ngx_http_request_t *r, const char *name)
{
    size_t            len;
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    len = ngx_strlen(name);
    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                return NULL;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].key.len == len
            && ngx_strncasecmp(h[i].key.data, (u_char *) name, len) == 0)
        {
            return &h[i];
        }
    }
}


static ngx_int_t
ngx_http_hermes_mcp_version(ngx_str_t *v)
{
    ngx_uint_t  i;

    for (i = 0; i < NGX_HTTP_HERMES_MCP_NVERSION; i++) {
        if (v->len == ngx_http_hermes_mcp_versions[i].len
            && ngx_strncmp(v->data, ngx_http_hermes_mcp_versions[i].data,
                           v->len) == 0)
        {
            return i;
        }
    }

    return NGX_ERROR;
}


/* a string or an integer of the message, as JSON text of our own */

static ngx_int_t
ngx_http_hermes_mcp_json_value(ngx_pool_t *pool, yajl_val v, ngx_str_t *out)
{
    size_t                len;
    yajl_gen              g;
    const unsigned char  *p;

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        return NGX_ERROR;
    }

    if (YAJL_IS_STRING(v)) {
        yajl_gen_string(g, (const unsigned char *) v->u.string,
                        ngx_strlen(v->u.string));

    } else {
        yajl_gen_integer(g, YAJL_GET_INTEGER(v));
    }

    yajl_gen_get_buf(g, &p, &len);

    out->data = ngx_pnalloc(pool, len);
    if (out->data == NULL) {
        yajl_gen_free(g);
        return NGX_ERROR;
    }

    ngx_memcpy(out->data, p, len);
    out->len = len;

    yajl_gen_free(g);

    return NGX_OK;
}


static ngx_int_t
ngx_http_hermes_mcp_reply(ngx_http_hermes_mcp_req_t *mr, u_char *result,
    size_t len)
{
    ngx_buf_t  *b;

    b = ngx_create_temp_buf(mr->r->pool,
                            sizeof("{\"jsonrpc\":\"2.0\",\"id\":,"
                                   "\"result\":}") + mr->id.len + len);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = ngx_sprintf(b->last, "{\"jsonrpc\":\"2.0\",\"id\":%V,"
                                   "\"result\":", &mr->id);
    b->last = ngx_cpymem(b->last, result, len);
    *b->last++ = '}';

    return ngx_http_hermes_response_send_buf(mr->r, NGX_HTTP_OK,
                                             "application/json", b);
}


/* a tool's result: its text, the same as structured content if JSON */

ngx_int_t
ngx_http_hermes_mcp_text(ngx_http_hermes_mcp_req_t *mr, ngx_str_t *text,
    ngx_str_t *structured, ngx_uint_t is_error)
{
    size_t                len;
    yajl_gen              g;
    ngx_int_t             rc;
    const unsigned char  *p;

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    yajl_gen_map_open(g);
    ngx_http_hermes_gen_key(g, "content");
    yajl_gen_array_open(g);
    yajl_gen_map_open(g);
    ngx_http_hermes_gen_key(g, "type");
    ngx_http_hermes_gen_key(g, "text");
    ngx_http_hermes_gen_key(g, "text");
    ngx_http_hermes_gen_str(g, text);
    yajl_gen_map_close(g);
    yajl_gen_array_close(g);

    if (structured) {
        ngx_http_hermes_gen_key(g, "structuredContent");
        yajl_gen_number(g, (const char *) structured->data, structured->len);
    }

    ngx_http_hermes_gen_key(g, "isError");
    yajl_gen_bool(g, is_error);
    yajl_gen_map_close(g);

    yajl_gen_get_buf(g, &p, &len);

    rc = ngx_http_hermes_mcp_reply(mr, (u_char *) p, len);

    yajl_gen_free(g);

    return rc;
}


/* a tool's failure the model reads and can act on, named by its code */

ngx_int_t
ngx_http_hermes_mcp_tool_error(ngx_http_hermes_mcp_req_t *mr, char *code,
    char *message)
{
    ngx_str_t                   c, m;
    ngx_buf_t                  *b;
    ngx_http_hermes_mcp_call_t  call;

    c.data = (u_char *) code;
    c.len = ngx_strlen(code);
    m.data = (u_char *) message;
    m.len = ngx_strlen(message);

    ngx_memzero(&call, sizeof(ngx_http_hermes_mcp_call_t));
    call.id = mr->id;

    b = ngx_http_hermes_mcp_cell_error(mr->r, &call, NGX_HTTP_OK, &c, &m);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_hermes_response_send_buf(mr->r, NGX_HTTP_OK,
                                             "application/json", b);
}


/* a JSON-RPC error; status: the HTTP one */

static ngx_int_t
ngx_http_hermes_mcp_error(ngx_http_request_t *r, ngx_uint_t status,
    ngx_str_t *id, ngx_int_t code, char *message)
{
    size_t                  len;
    ngx_buf_t              *b;
    ngx_http_hermes_ctx_t  *ctx;
    static ngx_str_t        null = ngx_string("null");

    ctx = ngx_http_hermes_response_ctx(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* responses_total: the codes of our other errors where they are alike */

    switch (status) {
    case NGX_HTTP_FORBIDDEN:
        ngx_str_set(&ctx->error_code, "forbidden");
        break;
    case NGX_HTTP_NOT_FOUND:
        ngx_str_set(&ctx->error_code, "not_found");
        break;
    case NGX_HTTP_NOT_ALLOWED:
        ngx_str_set(&ctx->error_code, "method_not_allowed");
        break;
    case NGX_HTTP_UNSUPPORTED_MEDIA_TYPE:
        ngx_str_set(&ctx->error_code, "unsupported_media_type");
        break;
    case NGX_HTTP_SERVICE_UNAVAILABLE:
        ngx_str_set(&ctx->error_code, "zone_full");
        break;
    default:
        ngx_str_set(&ctx->error_code, "invalid_request");
    }

    if (id == NULL) {
        id = &null;
    }

    len = ngx_strlen(message);

    b = ngx_create_temp_buf(r->pool,
                            128 + id->len + len
                            + ngx_escape_json(NULL, (u_char *) message, len));
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = ngx_sprintf(b->last, "{\"jsonrpc\":\"2.0\",\"id\":%V,"
                                   "\"error\":{\"code\":%i,\"message\":\"",
                          id, code);
    b->last = (u_char *) ngx_escape_json(b->last, (u_char *) message, len);
    b->last = ngx_cpymem(b->last, "\"}}", 3);

    return ngx_http_hermes_response_send_buf(r, status, "application/json",
                                             b);
}


/* what yajl wrote, as one JSON-RPC message: an SSE event, or the body */

static ngx_buf_t *
ngx_http_hermes_mcp_take(ngx_pool_t *pool, yajl_gen g, ngx_uint_t sse)
{
    size_t                len;
    ngx_buf_t            *b;
    const unsigned char  *p;

    yajl_gen_get_buf(g, &p, &len);

    b = ngx_create_temp_buf(pool, len + sizeof("data: \n\n"));
    if (b == NULL) {
        return NULL;
    }

    if (sse) {
        b->last = ngx_cpymem(b->last, "data: ", sizeof("data: ") - 1);
    }

    b->last = ngx_cpymem(b->last, p, len);

    if (sse) {
        *b->last++ = '\n';
        *b->last++ = '\n';
    }

    return b;
}


/*
 * A cell's event lines, in pieces: each whole stdout or stderr line
 * becomes notifications/progress (when the client sent a progressToken)
 * and notifications/message (when it set a logging level that lets
 * them through: stdout is "info", stderr "warning").  Lines wait here
 * until whole, up to the longest a text event can be.
 */

static ngx_int_t
ngx_http_hermes_mcp_output(ngx_http_hermes_response_t *rs, u_char *p,
    size_t n)
{
    u_char                      *nl, *line;
    size_t                       k, size;
    ngx_http_hermes_mcp_call_t  *call;

    call = rs->answer_data;

    if (call->gen == NULL) {
        /* nobody to tell */
        return NGX_OK;
    }

    while (n) {
        nl = ngx_strlchr(p, p + n, '\n');
        k = nl ? (size_t) (nl - p) : n;

        if (call->skip || call->len + k > NGX_HTTP_HERMES_MCP_LINE_MAX) {
            call->skip = (nl == NULL);
            call->len = 0;
            goto next;
        }

        if (call->len + k + 1 > call->size) {
            size = ngx_max(4096, 2 * (call->len + k + 1));
            size = ngx_min(size, NGX_HTTP_HERMES_MCP_LINE_MAX + 1);

            line = ngx_palloc(rs->r->pool, size);
            if (line == NULL) {
                return NGX_ERROR;
            }

            if (call->line) {
                ngx_memcpy(line, call->line, call->len);
                ngx_pfree(rs->r->pool, call->line);
            }

            call->line = line;
            call->size = size;
        }

        ngx_memcpy(call->line + call->len, p, k);
        call->len += k;

        if (nl) {
            call->line[call->len] = '\0';
            ngx_http_hermes_mcp_event(rs, call);
            call->len = 0;
        }

    next:

        k += nl ? 1 : 0;
        p += k;
        n -= k;
    }

    return NGX_OK;
}


static void
ngx_http_hermes_mcp_event(ngx_http_hermes_response_t *rs,
    ngx_http_hermes_mcp_call_t *call)
{
    yajl_val     v, type, text;
    ngx_uint_t   err, level;
    const char  *ptype[] = { "type", NULL };
    const char  *ptext[] = { "text", NULL };

    v = yajl_tree_parse((const char *) call->line, NULL, 0);
    if (v == NULL) {
        return;
    }

    type = yajl_tree_get(v, ptype, yajl_t_string);
    text = yajl_tree_get(v, ptext, yajl_t_string);

    if (type == NULL || text == NULL
        || (ngx_strcmp(type->u.string, "stdout") != 0
            && ngx_strcmp(type->u.string, "stderr") != 0))
    {
        yajl_tree_free(v);
        return;
    }

    err = (type->u.string[3] == 'e');
    level = err ? NGX_HTTP_HERMES_MCP_LOG_WARNING
                : NGX_HTTP_HERMES_MCP_LOG_INFO;

    if (call->token.len) {
        ngx_http_hermes_mcp_notification(call->gen, "notifications/progress");
        ngx_http_hermes_gen_key(call->gen, "progressToken");
        yajl_gen_number(call->gen, (const char *) call->token.data,
                        call->token.len);
        ngx_http_hermes_gen_key(call->gen, "progress");
        yajl_gen_integer(call->gen, ++call->progress);
        ngx_http_hermes_gen_key(call->gen, "message");
        yajl_gen_string(call->gen, (const unsigned char *) text->u.string,
                        ngx_strlen(text->u.string));
        ngx_http_hermes_mcp_write_event(rs, call->gen);
    }

    if (call->level != NGX_HTTP_HERMES_MCP_LOG_NONE && call->level <= level) {
        ngx_http_hermes_mcp_notification(call->gen, "notifications/message");
        ngx_http_hermes_gen_key(call->gen, "level");
        ngx_http_hermes_gen_str(call->gen, &ngx_http_hermes_mcp_levels[level]);
        ngx_http_hermes_gen_key(call->gen, "logger");
        yajl_gen_string(call->gen, (const unsigned char *) type->u.string,
                        ngx_strlen(type->u.string));
        ngx_http_hermes_gen_key(call->gen, "data");
        yajl_gen_string(call->gen, (const unsigned char *) text->u.string,
                        ngx_strlen(text->u.string));
        ngx_http_hermes_mcp_write_event(rs, call->gen);
    }

    yajl_tree_free(v);
}


/* a tool result's response, up to the value of its first content's text */

static void
ngx_http_hermes_mcp_text_start(yajl_gen g, ngx_str_t *id)
{
    yajl_gen_map_open(g);
    ngx_http_hermes_gen_key(g, "jsonrpc");
    ngx_http_hermes_gen_key(g, "2.0");
    ngx_http_hermes_gen_key(g, "id");
    yajl_gen_number(g, (const char *) id->data, id->len);
    ngx_http_hermes_gen_key(g, "result");
    yajl_gen_map_open(g);
    ngx_http_hermes_gen_key(g, "content");
    yajl_gen_array_open(g);
    yajl_gen_map_open(g);
    ngx_http_hermes_gen_key(g, "type");
    ngx_http_hermes_gen_key(g, "text");
    ngx_http_hermes_gen_key(g, "text");
}


/* a notification's start, up to its params' members, in a fresh message */

static void
ngx_http_hermes_mcp_notification(yajl_gen g, const char *method)
{
    yajl_gen_reset(g, NULL);
    yajl_gen_clear(g);

    yajl_gen_map_open(g);
    ngx_http_hermes_gen_key(g, "jsonrpc");
    ngx_http_hermes_gen_key(g, "2.0");
    ngx_http_hermes_gen_key(g, "method");
    yajl_gen_string(g, (const unsigned char *) method, ngx_strlen(method));
    ngx_http_hermes_gen_key(g, "params");
    yajl_gen_map_open(g);
}


/* the notification closed and written as an SSE event */

static void
ngx_http_hermes_mcp_write_event(ngx_http_hermes_response_t *rs, yajl_gen g)
{
    size_t                len;
    const unsigned char  *p;

    yajl_gen_map_close(g);
    yajl_gen_map_close(g);

    yajl_gen_get_buf(g, &p, &len);

    (void) ngx_http_hermes_response_write(rs, (u_char *) "data: ", 6);
    (void) ngx_http_hermes_response_write(rs, (u_char *) p, len);
    (void) ngx_http_hermes_response_write(rs, (u_char *) "\n\n", 2);
}


/*
 * The cell's result as the tool's: the output (and the error, named) as
 * text, each PNG or JPEG display as an image, the result object as
 * structured content, isError unless the cell succeeded.
 */

static ngx_buf_t *
ngx_http_hermes_mcp_result(ngx_http_request_t *r, void *data,
    ngx_http_hermes_result_t *res, ngx_http_hermes_kernel_ref_t *ref,
    ngx_http_hermes_request_t *req)
{
    ngx_http_hermes_mcp_call_t *call = data;

    u_char       *copy;
    yajl_gen      g;
    ngx_buf_t    *b, *obj;
    ngx_str_t    *status;
    ngx_uint_t    i, k, failed;
    yajl_val      displays, img;
    const char   *mimes[] = { "image/png", "image/jpeg" };
    const char   *pmime[] = { NULL, NULL };

    ngx_http_hermes_mcp_sessions_call(call->zone, call->session, call->crc,
                                      NULL);

    obj = ngx_http_hermes_json_result(r->pool, res, ref, req, 0, 0);
    if (obj == NULL) {
        return NULL;
    }

    displays = NULL;

    if (res->displays.len) {
        copy = ngx_pnalloc(r->pool, res->displays.len + 1);
        if (copy == NULL) {
            return NULL;
        }

        ngx_memcpy(copy, res->displays.data, res->displays.len);
        copy[res->displays.len] = '\0';

        displays = yajl_tree_parse((const char *) copy, NULL, 0);
    }

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        if (displays) {
            yajl_tree_free(displays);
        }

        return NULL;
    }

    failed = (res->status != NGX_HTTP_HERMES_CELL_SUCCESS);
    status = &ngx_http_hermes_cell_status_names[res->status];

    ngx_http_hermes_mcp_text_start(g, &call->id);

    if (failed) {
        /* the output, then what went wrong, by name */
        copy = ngx_pnalloc(r->pool, res->output.len + status->len
                                    + res->error.len + 8);
        if (copy == NULL) {
            goto failed;
        }

        yajl_gen_string(g, copy,
                        ngx_sprintf(copy, "%V%s[%V] %V", &res->output,
                                    res->output.len ? "\n" : "", status,
                                    &res->error)
                        - copy);

    } else {
        ngx_http_hermes_gen_str(g, &res->output);
    }

    yajl_gen_map_close(g);

    for (i = 0; displays && YAJL_IS_ARRAY(displays)
                && i < displays->u.array.len; i++)
    {
        for (k = 0; k < 2; k++) {
            pmime[0] = mimes[k];
            img = yajl_tree_get(displays->u.array.values[i], pmime,
                                yajl_t_string);
            if (img == NULL) {
                continue;
            }

            yajl_gen_map_open(g);
            ngx_http_hermes_gen_key(g, "type");
            ngx_http_hermes_gen_key(g, "image");
            ngx_http_hermes_gen_key(g, "data");
            yajl_gen_string(g, (const unsigned char *) img->u.string,
                            ngx_strlen(img->u.string));
            ngx_http_hermes_gen_key(g, "mimeType");
            yajl_gen_string(g, (const unsigned char *) mimes[k],
                            ngx_strlen(mimes[k]));
            yajl_gen_map_close(g);
        }
    }

    yajl_gen_array_close(g);

    ngx_http_hermes_gen_key(g, "structuredContent");
    yajl_gen_number(g, (const char *) obj->pos, obj->last - obj->pos);

    ngx_http_hermes_gen_key(g, "isError");
    yajl_gen_bool(g, failed);

    yajl_gen_map_close(g);
    yajl_gen_map_close(g);

    b = ngx_http_hermes_mcp_take(r->pool, g, 1);

    if (displays) {
        yajl_tree_free(displays);
    }

    yajl_gen_free(g);

    return b;

failed:

    if (displays) {
        yajl_tree_free(displays);
    }

    yajl_gen_free(g);

    return NULL;
}


/*
 * The call failed before its cell ran (busy, no kernel, a bad request):
 * a tool result with isError, the code and message as ours are named.
 */

static ngx_buf_t *
ngx_http_hermes_mcp_cell_error(ngx_http_request_t *r, void *data,
    ngx_uint_t status, ngx_str_t *code, ngx_str_t *message)
{
    ngx_http_hermes_mcp_call_t *call = data;

    u_char    *p;
    yajl_gen   g;
    ngx_buf_t *b, *err;

    if (call->zone) {
        ngx_http_hermes_mcp_sessions_call(call->zone, call->session,
                                          call->crc, NULL);
    }

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        return NULL;
    }

    p = ngx_pnalloc(r->pool, code->len + message->len + 2);
    if (p == NULL) {
        yajl_gen_free(g);
        return NULL;
    }

    /* the structured content: our error object, as /v1/execute sends it */
    err = ngx_http_hermes_json_error(r->pool, code, message);
    if (err == NULL) {
        yajl_gen_free(g);
        return NULL;
    }

    ngx_http_hermes_mcp_text_start(g, &call->id);
    yajl_gen_string(g, p, ngx_sprintf(p, "%V: %V", code, message) - p);
    yajl_gen_map_close(g);
    yajl_gen_array_close(g);
    ngx_http_hermes_gen_key(g, "structuredContent");
    yajl_gen_number(g, (const char *) err->pos, err->last - err->pos - 1);
    ngx_http_hermes_gen_key(g, "isError");
    yajl_gen_bool(g, 1);
    yajl_gen_map_close(g);
    yajl_gen_map_close(g);

    b = ngx_http_hermes_mcp_take(r->pool, g, 0);

    yajl_gen_free(g);

    return b;
}


static void
ngx_http_hermes_mcp_call_cleanup(void *data)
{
    ngx_http_hermes_mcp_call_t *call = data;

    yajl_gen_free(call->gen);
    call->gen = NULL;
}
