
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: the MCP client.  A tool call to an MCP server (hermes_tools_pass
 * ... protocol=mcp) goes over the streamable HTTP transport through the
 * same subrequests as a hermes one: initialize and notifications/initialized
 * once per kernel (its session kept in the zone), tools/list for
 * "hermes_tools auto", then tools/call; its answer, JSON or SSE, becomes
 * the call's answer.  An SSE stream the server ends before the answer is
 * resumed with GET and Last-Event-ID after its retry: (2025-11-25's
 * polling); a call given up (timed out, its cell over) is cancelled with
 * notifications/cancelled.
 */


#include "ngx_hermes.h"
#include "ngx_hermes_rpc_call.h"


static yajl_val ngx_http_hermes_mcp_parse(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call);
static yajl_val ngx_http_hermes_mcp_json(ngx_pool_t *pool, u_char *data,
    size_t len);
static void ngx_http_hermes_mcp_gen(yajl_gen g, yajl_val v);
static ngx_int_t ngx_http_hermes_mcp_note(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_mcp_session_t *ms, ngx_buf_t *body);
static yajl_val ngx_http_hermes_mcp_event(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, u_char *p, u_char *last);
static void ngx_http_hermes_mcp_scan(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call);
static ngx_int_t ngx_http_hermes_mcp_called(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, ngx_int_t rc, ngx_uint_t status);
static void ngx_http_hermes_mcp_resume(ngx_event_t *ev);
static void ngx_http_hermes_mcp_cancel(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, const char *reason);
static void ngx_http_hermes_mcp_stop(ngx_http_hermes_rpc_call_t *call);
static void ngx_http_hermes_mcp_message(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, yajl_val v);
static void ngx_http_hermes_mcp_answer_request(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, const char *method, yajl_val id);
static ngx_uint_t ngx_http_hermes_mcp_names_session(
    ngx_http_hermes_rpc_call_t *call);
static ngx_uint_t ngx_http_hermes_mcp_version_ours(const char *version);
static void ngx_http_hermes_mcp_call_error(ngx_http_hermes_rpc_call_t *call,
    const char *fmt, ...);


static ngx_http_hermes_mcp_peer_t  ngx_http_hermes_mcp_peers[
                                       NGX_HTTP_HERMES_MCP_PEERS];
static ngx_uint_t                  ngx_http_hermes_mcp_npeers;


ngx_http_hermes_mcp_peer_t *
ngx_http_hermes_mcp_peer(ngx_str_t *uri)
{
    ngx_uint_t                   i;
    ngx_http_hermes_mcp_peer_t  *peer;

    for (i = 0; i < ngx_http_hermes_mcp_npeers; i++) {
        peer = &ngx_http_hermes_mcp_peers[i];

        if (peer->uri.len == uri->len
            && ngx_strncmp(peer->uri.data, uri->data, uri->len) == 0)
        {
            return peer;
        }
    }

    if (ngx_http_hermes_mcp_npeers == NGX_HTTP_HERMES_MCP_PEERS) {
        return NULL;
    }

    /* the URI is the configuration's: it lives as long as this worker */

    peer = &ngx_http_hermes_mcp_peers[ngx_http_hermes_mcp_npeers++];
    peer->uri = *uri;

    return peer;
}


/* NGX_DECLINED: not one of the tools the server listed (tools/list) */

ngx_int_t
ngx_http_hermes_mcp_peer_has(ngx_http_hermes_mcp_peer_t *peer,
    ngx_str_t *name, ngx_pool_t *pool)
{
    u_char      *p, *last, *found;
    size_t       len, ilen;
    ngx_str_t    listed;
    ngx_uint_t   shared;
    u_char      ident[NGX_HTTP_HERMES_TOOL_IDENT];

    p = peer->tools;
    last = p + peer->tools_len;
    found = NULL;
    shared = 0;

    while (p && p < last) {
        len = ngx_strlen(p);

        if (len == name->len && ngx_strncmp(p, name->data, len) == 0) {
            return NGX_OK;
        }

        /*
         * the code may call "get-sum" as get_sum: one such name, not two,
         * and only a name of the grammar (it goes into headers and lines)
         */

        listed.data = p;
        listed.len = len;

        if (ngx_http_hermes_tool_name_valid(p, len)) {
            ilen = ngx_http_hermes_tool_ident(ident, &listed);

            if (ilen == name->len
                && ngx_strncmp(ident, name->data, ilen) == 0)
            {
                shared = (found != NULL);
                found = p;
            }
        }

        p += len + 1;
    }

    if (found == NULL || shared) {
        return NGX_DECLINED;
    }

    /* the server's own name for it, the listing's copy may be replaced */

    len = ngx_strlen(found);

    name->data = ngx_pnalloc(pool, len);
    if (name->data == NULL) {
        return NGX_DECLINED;
    }

    ngx_memcpy(name->data, found, len);
    name->len = len;

    return NGX_OK;
}


/*
 * The step after a subrequest: initialize, notifications/initialized,
 * tools/list (auto), tools/call.  NGX_AGAIN: the next one is on its way;
 * NGX_DONE: call->err says why the call failed; else rc, for the outcome.
 */

ngx_int_t
ngx_http_hermes_mcp_next(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, ngx_int_t rc)
{
    u_char                         *p;
    size_t                          len, n, old;
    yajl_val                        root, v, tools, name;
    ngx_uint_t                      i, status;
    ngx_http_hermes_mcp_peer_t     *peer;
    ngx_http_hermes_mcp_session_t   fresh;

    static const char  *presult[] = { "result", NULL };
    static const char  *pversion[] = { "result", "protocolVersion", NULL };
    static const char  *ptools[] = { "result", "tools", NULL };
    static const char  *pname[] = { "name", NULL };
    static const char  *pcursor[] = { "result", "nextCursor", NULL };
    static const char  *perror[] = { "error", "message", NULL };

    peer = call->peer;
    status = ngx_http_hermes_rpc_status(call, rc);

    if (call->used_session && !call->retried
        && call->step != NGX_HTTP_HERMES_MCP_RESUME
        && (status == NGX_HTTP_NOT_FOUND
            || (status == NGX_HTTP_BAD_REQUEST
                && ngx_http_hermes_mcp_names_session(call))))
    {
        /*
         * the server forgot the session (404, as the transport says, or
         * a 400 naming it, as some servers answer): a new one, once
         */
        call->retried = 1;
        call->used_session = 0;
        call->cursor.len = 0;
        call->pages = 0;

        /* another call of the kernel's may have made a new one already */

        fresh.peer = call->ms.peer;

        if (call->step != NGX_HTTP_HERMES_MCP_NOTIFY
            && ngx_http_hermes_registry_mcp_session(rpc->zone, rpc->ref,
                                                    &fresh)
               == NGX_OK
            && (fresh.session_len != call->ms.session_len
                || ngx_memcmp(fresh.session, call->ms.session,
                              fresh.session_len)
                   != 0))
        {
            call->ms = fresh;
            goto next;
        }

        call->ms.session_len = 0;
        call->ms.version_len = 0;
        call->step = NGX_HTTP_HERMES_MCP_INIT;

        if (!rpc->mcp_initializing) {
            rpc->mcp_initializing = 1;
            call->initializer = 1;
        }

        goto next;
    }

    if (call->step == NGX_HTTP_HERMES_MCP_CALL
        || call->step == NGX_HTTP_HERMES_MCP_RESUME)
    {
        return ngx_http_hermes_mcp_called(rpc, call, rc, status);
    }

    if (call->too_big || status < 200 || status > 299) {
        return rc;
    }

    switch (call->step) {

    case NGX_HTTP_HERMES_MCP_INIT:
        root = ngx_http_hermes_mcp_parse(rpc, call);
        if (root == NULL) {
            ngx_http_hermes_mcp_call_error(call, "the MCP server's answer to "
                                           "initialize is not JSON-RPC");
            return NGX_DONE;
        }

        v = yajl_tree_get(root, perror, yajl_t_string);

        if (v || yajl_tree_get(root, presult, yajl_t_object) == NULL) {
            ngx_http_hermes_mcp_call_error(call, "the MCP server refused "
                                           "initialize: %s",
                                           v ? v->u.string : "");
            yajl_tree_free(root);
            return NGX_DONE;
        }

        v = yajl_tree_get(root, pversion, yajl_t_string);

        if (v && !ngx_http_hermes_mcp_version_ours(v->u.string)) {
            ngx_http_hermes_mcp_call_error(call, "the MCP server chose "
                                           "protocol version \"%s\", not "
                                           "one this gateway speaks ("
                                           NGX_HTTP_HERMES_MCP_VERSION ", "
                                           NGX_HTTP_HERMES_MCP_VERSION_OLD
                                           ")", v->u.string);
            yajl_tree_free(root);
            return NGX_DONE;
        }

        if (v && (len = ngx_strlen(v->u.string)) > 0
            && len <= sizeof(call->ms.version))
        {
            ngx_memcpy(call->ms.version, v->u.string, len);
            call->ms.version_len = len;

        } else {
            ngx_memcpy(call->ms.version, NGX_HTTP_HERMES_MCP_VERSION,
                       sizeof(NGX_HTTP_HERMES_MCP_VERSION) - 1);
            call->ms.version_len = sizeof(NGX_HTTP_HERMES_MCP_VERSION) - 1;
        }

        yajl_tree_free(root);

        if (call->session.len > sizeof(call->ms.session)) {
            ngx_http_hermes_mcp_call_error(call, "the MCP server's session "
                                           "id is over %uz bytes",
                                           sizeof(call->ms.session));
            return NGX_DONE;
        }

        ngx_memcpy(call->ms.session, call->session.data, call->session.len);
        call->ms.session_len = call->session.len;

        call->step = NGX_HTTP_HERMES_MCP_NOTIFY;
        break;

    case NGX_HTTP_HERMES_MCP_NOTIFY:

        /* initialized: the kernel's, for its next calls (any worker's) */

        ngx_http_hermes_registry_set_mcp_session(rpc->zone, rpc->ref,
                                                 &call->ms);

        if (call->initializer) {
            /* the calls that waited for the session go on with it */
            call->initializer = 0;
            rpc->mcp_initializing = 0;
            ngx_http_hermes_rpc_next(rpc);
        }

        call->step = (call->list_only
                      || (rpc->hlcf->tools_auto && !peer->listed))
                     ? NGX_HTTP_HERMES_MCP_LIST : NGX_HTTP_HERMES_MCP_CALL;
        break;

    default: /* NGX_HTTP_HERMES_MCP_LIST */
        root = ngx_http_hermes_mcp_parse(rpc, call);
        tools = root ? yajl_tree_get(root, ptools, yajl_t_array) : NULL;

        if (tools == NULL) {
            ngx_http_hermes_mcp_call_error(call, "the MCP server's answer to "
                                           "tools/list has no tools");
            if (root) {
                yajl_tree_free(root);
            }

            return NGX_DONE;
        }

        /*
         * the pages' names gather in the call's own list, the worker's is
         * replaced once the last came (another call may be listing too)
         */

        old = call->pages ? call->list_len : 0;
        len = old;

        for (i = 0; i < tools->u.array.len; i++) {
            name = yajl_tree_get(tools->u.array.values[i], pname,
                                 yajl_t_string);
            if (name) {
                len += ngx_strlen(name->u.string) + 1;
            }
        }

        p = ngx_alloc(len + 1, rpc->log);
        if (p == NULL) {
            yajl_tree_free(root);
            return NGX_ERROR;
        }

        if (old) {
            ngx_memcpy(p, call->list, old);
        }

        if (call->list) {
            ngx_free(call->list);
        }

        call->list = p;
        call->list_len = len;
        p += old;

        for (i = 0; i < tools->u.array.len; i++) {
            name = yajl_tree_get(tools->u.array.values[i], pname,
                                 yajl_t_string);
            if (name) {
                n = ngx_strlen(name->u.string);
                p = ngx_cpymem(p, name->u.string, n);
                *p++ = '\0';
            }
        }

        /* and the tools' schemas, for the cells' stubs */

        if (ngx_http_hermes_schema_gather(call, tools, rpc->log) != NGX_OK) {
            yajl_tree_free(root);
            return NGX_ERROR;
        }

        v = yajl_tree_get(root, pcursor, yajl_t_string);
        len = v ? ngx_strlen(v->u.string) : 0;

        if (len && ++call->pages < NGX_HTTP_HERMES_MCP_PAGES) {
            /* another page: its cursor, opaque, goes back as it came */

            call->cursor.data = ngx_pnalloc(rpc->r->pool, len);
            if (call->cursor.data == NULL) {
                yajl_tree_free(root);
                return NGX_ERROR;
            }

            ngx_memcpy(call->cursor.data, v->u.string, len);
            call->cursor.len = len;

            yajl_tree_free(root);
            goto next;
        }

        yajl_tree_free(root);

        call->cursor.len = 0;

        if (peer->tools) {
            ngx_free(peer->tools);
        }

        peer->tools = call->list;
        peer->tools_len = call->list_len;
        peer->listed = 1;

        call->list = NULL;
        call->list_len = 0;

        ngx_http_hermes_schema_keep(peer, call, rpc->log);

        if (call->list_only) {
            /* a cell's "tools/list": the schemas are its answer */
            return rc;
        }

        if (ngx_http_hermes_mcp_peer_has(peer, &call->tool, rpc->pool)
            != NGX_OK)
        {
            ngx_http_hermes_mcp_call_error(call, "not one of the MCP "
                                           "server's tools (tools/list)");
            return NGX_DONE;
        }

        call->step = NGX_HTTP_HERMES_MCP_CALL;
        break;
    }

next:

    if (ngx_http_hermes_rpc_subrequest(rpc, call) != NGX_OK) {
        ngx_http_hermes_mcp_call_error(call, "the gateway could not make the "
                                       "tool call");
        return NGX_DONE;
    }

    return NGX_AGAIN;
}


/*
 * tools/call's subrequest (its POST, or a GET resuming its stream) ended.
 * A stream that ended without the answer is resumed (2025-11-25: a server
 * may close it to poll) after its retry:, with the last event id seen, as
 * long as each resume brings new events (NGX_HTTP_HERMES_MCP_RESUMES
 * without one, at most); the cell's end bounds it all.  A call the gateway
 * gives up on while the server may still run it is cancelled.
 */

static ngx_int_t
ngx_http_hermes_mcp_called(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, ngx_int_t rc, ngx_uint_t status)
{
    yajl_val     root;
    ngx_msec_t   wait;
    ngx_uint_t   ok;

    ok = (status >= 200 && status <= 299);

    if (rc == NGX_HTTP_GATEWAY_TIME_OUT
        || (rc == NGX_ERROR && call->status))
    {
        /*
         * nginx's own: proxy_read_timeout before the header, or the
         * stream broke after it (its timeout too); the tool may still run
         */
        ngx_http_hermes_mcp_cancel(rpc, call, "the gateway stopped waiting "
                                   "for the answer (a timeout, or the "
                                   "stream broke)");
        return rc;
    }

    if (call->step == NGX_HTTP_HERMES_MCP_RESUME && !ok) {
        ngx_http_hermes_mcp_cancel(rpc, call, "the gateway could not resume "
                                   "the call's stream");
        ngx_http_hermes_mcp_call_error(call, "the MCP server ended the "
                                       "call's stream before the answer, "
                                       "and refused to resume it (HTTP %ui)",
                                       status);
        return NGX_DONE;
    }

    if (!ok || !call->sse || call->too_big) {
        return rc;
    }

    /* the events the stream handler has not looked at yet */

    ngx_http_hermes_mcp_scan(rpc, call);

    if (call->answered) {
        return rc;
    }

    if (!call->whole) {
        /* nginx ended it: proxy_read_timeout, or the connection broke */
        ngx_http_hermes_mcp_cancel(rpc, call, "the gateway stopped waiting "
                                   "for the answer (a timeout, or the "
                                   "stream broke)");
        ngx_http_hermes_mcp_call_error(call, "the MCP server's stream broke "
                                       "or timed out (proxy_read_timeout) "
                                       "before the answer");
        return NGX_DONE;
    }

    root = ngx_http_hermes_mcp_parse(rpc, call);

    if (root) {
        yajl_tree_free(root);
        return rc;
    }

    if (call->events == call->events_seen) {
        call->resumes++;

    } else {
        call->resumes = 0;
        call->events_seen = call->events;
    }

    if (call->last_id_len == 0
        || call->resumes >= NGX_HTTP_HERMES_MCP_RESUMES)
    {
        ngx_http_hermes_mcp_cancel(rpc, call, "the call's stream ended "
                                   "before the answer, and could not be "
                                   "resumed");
        ngx_http_hermes_mcp_call_error(call, "the MCP server ended the "
                                       "call's stream before the answer%s",
                                       call->last_id_len
                                       ? " (resumed without a new event "
                                         "too often)"
                                       : ", with no event id to resume it "
                                         "by");
        return NGX_DONE;
    }

    /* the server's retry: as it says; ours doubles while nothing comes */

    wait = call->retry ? call->retry
                       : ngx_min((ngx_msec_t) NGX_HTTP_HERMES_MCP_RETRY
                                 << call->resumes,
                                 (ngx_msec_t) NGX_HTTP_HERMES_MCP_RETRY_MAX);

    call->step = NGX_HTTP_HERMES_MCP_RESUME;
    call->answered = 0;

    call->resume.handler = ngx_http_hermes_mcp_resume;
    call->resume.data = call;
    call->resume.log = rpc->log;

    ngx_add_timer(&call->resume, wait);

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, rpc->log, 0,
                   "hermes: tool call %uL: the MCP stream ended before its "
                   "answer, resumed from \"%*s\"", call->seq,
                   call->last_id_len, call->last_id);

    return NGX_AGAIN;
}


/* the retry: time passed: GET the call's stream from its last event */

static void
ngx_http_hermes_mcp_resume(ngx_event_t *ev)
{
    ngx_http_hermes_rpc_call_t *call = ev->data;

    ngx_connection_t       *c;
    ngx_http_hermes_rpc_t  *rpc;

    rpc = call->rpc;

    if (rpc == NULL || rpc->r == NULL) {
        return;                         /* the call is over */
    }

    c = rpc->r->connection;

    if (ngx_http_hermes_rpc_subrequest(rpc, call) != NGX_OK) {
        ngx_http_hermes_mcp_call_error(call, "the gateway could not resume "
                                       "the MCP server's stream");
        ngx_http_hermes_rpc_finish(rpc, call, NGX_DONE);
    }

    ngx_http_run_posted_requests(c);
}


/*
 * The cell is over while its call runs: the server is told to stop
 * (notifications/cancelled) and the call's stream, if it comes as it
 * goes, ends now rather than at the proxy's timeout.  A call that waits
 * to resume waits no more.
 */

void
ngx_http_hermes_mcp_forget(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call)
{
    if (call->resume.timer_set) {
        ngx_del_timer(&call->resume);
    }

    if (call->waiting
        || (call->step != NGX_HTTP_HERMES_MCP_CALL
            && call->step != NGX_HTTP_HERMES_MCP_RESUME))
    {
        return;                         /* nothing asked of the tool yet */
    }

    ngx_http_hermes_mcp_cancel(rpc, call, "the cell that made the call "
                               "ended before the answer");
    ngx_http_hermes_mcp_stop(call);
}


/* notifications/cancelled for the call's request, in its session */

static void
ngx_http_hermes_mcp_cancel(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, const char *reason)
{
    ngx_buf_t  *b;

    if (rpc->r == NULL) {
        return;                 /* no request left to carry it */
    }

    b = ngx_create_temp_buf(rpc->r->pool,
                            sizeof("{\"jsonrpc\":\"2.0\",\"method\":"
                                   "\"notifications/cancelled\",\"params\":"
                                   "{\"requestId\":,\"reason\":\"\"}}") - 1
                            + NGX_INT64_LEN + ngx_strlen(reason));
    if (b == NULL) {
        return;
    }

    /* the reasons are ours: nothing to escape */

    b->last = ngx_sprintf(b->last, "{\"jsonrpc\":\"2.0\",\"method\":"
                          "\"notifications/cancelled\",\"params\":"
                          "{\"requestId\":%uL,\"reason\":\"%s\"}}",
                          call->seq, reason);
    b->last_buf = 1;

    if (ngx_http_hermes_mcp_note(rpc, &call->ms, b) != NGX_OK) {
        ngx_log_error(NGX_LOG_WARN, rpc->log, 0,
                      "hermes: could not cancel tool call %uL with the MCP "
                      "server", call->seq);
        return;
    }

    ngx_log_error(NGX_LOG_INFO, rpc->log, 0,
                  "hermes: kernel %*s: tool call %uL cancelled with the MCP "
                  "server: %s", (size_t) NGX_HTTP_HERMES_ID_LEN,
                  rpc->ref->kernel_id, call->seq, reason);
}


/*
 * The call's stream ends here, as if the server had ended it: its answer
 * came (a resumed GET stream stays open after it), or nobody waits for it
 * any more.  Only a stream that is passed on as it comes (proxy_buffering
 * off) and whose header came: its upstream is told the body is whole and
 * woken, so nginx closes the connection and ends the subrequest as usual.
 */

static void
ngx_http_hermes_mcp_stop(ngx_http_hermes_rpc_call_t *call)
{
    ngx_http_upstream_t  *u;

    if (call->sr == NULL) {
        return;
    }

    u = call->sr->upstream;

    if (u == NULL || u->buffering || !u->header_sent
        || u->peer.connection == NULL)
    {
        return;
    }

    u->length = 0;
    u->keepalive = 0;

    ngx_post_event(u->peer.connection->read, &ngx_posted_events);
}


/*
 * tools/call answered 2xx: its result to the code.  structuredContent as
 * data, else the text content as a str (texts joined by "\n"), else the
 * content list as it came; isError and JSON-RPC errors raise ToolError.
 */

ngx_int_t
ngx_http_hermes_mcp_answer(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call)
{
    u_char      *p, *text;
    size_t       len, n;
    yajl_gen     g;
    yajl_val     root, result, v, content, item, t;
    ngx_int_t    rc;
    ngx_uint_t   i, texts;

    static const char  *presult[] = { "result", NULL };
    static const char  *perror[] = { "error", "message", NULL };
    static const char  *pcode[] = { "error", "code", NULL };
    static const char  *pstruct[] = { "structuredContent", NULL };
    static const char  *pcontent[] = { "content", NULL };
    static const char  *piserror[] = { "isError", NULL };
    static const char  *ptype[] = { "type", NULL };
    static const char  *ptext[] = { "text", NULL };

    root = ngx_http_hermes_mcp_parse(rpc, call);

    if (root == NULL) {
        ngx_http_hermes_rpc_answer_error(rpc, call->seq,
                     (u_char *) "tool \"%V\": the MCP server's answer is not "
                     "JSON-RPC", &call->tool);
        return 0;
    }

    result = yajl_tree_get(root, presult, yajl_t_object);

    if (result == NULL) {
        v = yajl_tree_get(root, perror, yajl_t_string);
        t = yajl_tree_get(root, pcode, yajl_t_number);

        ngx_http_hermes_rpc_answer_error(rpc, call->seq,
                     (u_char *) "tool \"%V\" failed (MCP error %s): %s",
                     &call->tool, t ? t->u.number.r : "?",
                     v ? v->u.string : "no message");
        yajl_tree_free(root);
        return 0;
    }

    /* the text of the text items, for a str or an error's message */

    content = yajl_tree_get(result, pcontent, yajl_t_array);
    len = 0;
    texts = 1;

    for (i = 0; content && i < content->u.array.len; i++) {
        item = content->u.array.values[i];
        v = yajl_tree_get(item, ptype, yajl_t_string);
        t = yajl_tree_get(item, ptext, yajl_t_string);

        if (v == NULL || t == NULL || ngx_strcmp(v->u.string, "text")) {
            texts = 0;
            continue;
        }

        len += ngx_strlen(t->u.string) + 1;
    }

    text = ngx_pnalloc(rpc->pool, len + 1);
    if (text == NULL) {
        yajl_tree_free(root);
        return 0;
    }

    p = text;

    for (i = 0; content && i < content->u.array.len; i++) {
        item = content->u.array.values[i];
        v = yajl_tree_get(item, ptype, yajl_t_string);
        t = yajl_tree_get(item, ptext, yajl_t_string);

        if (v && t && ngx_strcmp(v->u.string, "text") == 0) {
            if (p > text) {
                *p++ = '\n';
            }

            n = ngx_strlen(t->u.string);
            p = ngx_cpymem(p, t->u.string, n);
        }
    }

    if (YAJL_IS_TRUE(yajl_tree_get(result, piserror, yajl_t_true))) {
        ngx_http_hermes_rpc_answer_error(rpc, call->seq,
                     (u_char *) "tool \"%V\" failed: %*s", &call->tool,
                     ngx_min((size_t) (p - text),
                             (size_t) NGX_HTTP_HERMES_RPC_ERROR_MAX),
                     text);
        yajl_tree_free(root);
        return 0;
    }

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        yajl_tree_free(root);
        return 0;
    }

    v = yajl_tree_get(result, pstruct, yajl_t_any);

    if (v) {
        ngx_http_hermes_mcp_gen(g, v);

    } else if (content && texts) {
        yajl_gen_string(g, text, p - text);

    } else if (content) {
        ngx_http_hermes_mcp_gen(g, content);

    } else {
        yajl_gen_null(g);
    }

    yajl_tree_free(root);

    if (yajl_gen_get_buf(g, (const unsigned char **) &p, &len)
        != yajl_gen_status_ok)
    {
        yajl_gen_free(g);
        return 0;
    }

    rc = ngx_http_hermes_rpc_answer_ok(rpc, call->seq, p, len);

    yajl_gen_free(g);

    if (rc != NGX_OK) {
        ngx_http_hermes_rpc_answer_error(rpc, call->seq,
                     (u_char *) "tool \"%V\": its answer could not be "
                     "passed on", &call->tool);
        return 0;
    }

    return 1;
}


/* the JSON-RPC response in a subrequest's answer: a JSON body, or the
 * last response (an "id" and a result or an error) of an SSE stream */

static yajl_val
ngx_http_hermes_mcp_parse(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call)
{
    u_char    *p, *last, *nl, *data, *d;
    yajl_val   v, found;

    static const char  *pid[] = { "id", NULL };
    static const char  *presult[] = { "result", NULL };
    static const char  *perror[] = { "error", NULL };

    if (call->body == NULL || call->len == 0) {
        return NULL;
    }

    if (!call->sse) {
        return ngx_http_hermes_mcp_json(rpc->pool, call->body, call->len);
    }

    /* events: "data:" lines joined by "\n", a blank line ends one */

    data = ngx_pnalloc(rpc->pool, call->len + 1);
    if (data == NULL) {
        return NULL;
    }

    d = data;
    found = NULL;
    p = call->body;
    last = p + call->len;

    while (p <= last) {
        nl = ngx_strlchr(p, last, '\n');
        if (nl == NULL) {
            nl = last;
        }

        if (nl > p && nl[-1] == '\r') {
            nl--;
        }

        if (nl - p >= 5 && ngx_strncmp(p, "data:", 5) == 0) {
            p += 5;

            if (p < nl && *p == ' ') {
                p++;
            }

            if (d > data) {
                *d++ = '\n';
            }

            d = ngx_cpymem(d, p, nl - p);

        } else if (nl == p && d > data) {
            v = ngx_http_hermes_mcp_json(rpc->pool, data, d - data);

            if (v && yajl_tree_get(v, pid, yajl_t_any)
                && (yajl_tree_get(v, presult, yajl_t_any)
                    || yajl_tree_get(v, perror, yajl_t_any)))
            {
                if (found) {
                    yajl_tree_free(found);
                }

                found = v;

            } else if (v) {
                yajl_tree_free(v);
            }

            d = data;
        }

        p = (nl < last && *nl == '\r') ? nl + 2 : nl + 1;

        if (nl == last && d > data) {
            /* the last event, without its blank line */
            p = last;
            nl = last;
            v = ngx_http_hermes_mcp_json(rpc->pool, data, d - data);

            if (v && yajl_tree_get(v, pid, yajl_t_any)
                && (yajl_tree_get(v, presult, yajl_t_any)
                    || yajl_tree_get(v, perror, yajl_t_any)))
            {
                if (found) {
                    yajl_tree_free(found);
                }

                found = v;

            } else if (v) {
                yajl_tree_free(v);
            }

            break;
        }
    }

    return found;
}


/* a JSON text as a yajl tree, its nesting bounded first (yajl's tree
 * code recurses) */

static yajl_val
ngx_http_hermes_mcp_json(ngx_pool_t *pool, u_char *data, size_t len)
{
    u_char      *copy, *p, *last;
    yajl_val     v;
    ngx_uint_t   depth, str, esc;

    depth = 0;
    str = 0;
    esc = 0;

    for (p = data, last = data + len; p < last; p++) {
        if (str) {
            if (esc) {
                esc = 0;

            } else if (*p == '\\') {
                esc = 1;

            } else if (*p == '"') {
                str = 0;
            }

            continue;
        }

        if (*p == '"') {
            str = 1;

        } else if (*p == '[' || *p == '{') {
            if (++depth > NGX_HTTP_HERMES_RPC_DEPTH) {
                return NULL;
            }

        } else if ((*p == ']' || *p == '}') && depth) {
            depth--;

        } else if (*p == '\0') {
            return NULL;
        }
    }

    copy = ngx_pnalloc(pool, len + 1);
    if (copy == NULL) {
        return NULL;
    }

    *ngx_cpymem(copy, data, len) = '\0';

    v = yajl_tree_parse((const char *) copy, NULL, 0);

    ngx_pfree(pool, copy);

    return v;
}


static void
ngx_http_hermes_mcp_gen(yajl_gen g, yajl_val v)
{
    size_t  i;

    switch (v->type) {

    case yajl_t_string:
        yajl_gen_string(g, (u_char *) v->u.string, ngx_strlen(v->u.string));
        break;

    case yajl_t_number:
        yajl_gen_number(g, v->u.number.r, ngx_strlen(v->u.number.r));
        break;

    case yajl_t_object:
        yajl_gen_map_open(g);

        for (i = 0; i < v->u.object.len; i++) {
            yajl_gen_string(g, (u_char *) v->u.object.keys[i],
                            ngx_strlen(v->u.object.keys[i]));
            ngx_http_hermes_mcp_gen(g, v->u.object.values[i]);
        }

        yajl_gen_map_close(g);
        break;

    case yajl_t_array:
        yajl_gen_array_open(g);

        for (i = 0; i < v->u.array.len; i++) {
            ngx_http_hermes_mcp_gen(g, v->u.array.values[i]);
        }

        yajl_gen_array_close(g);
        break;

    case yajl_t_true:
        yajl_gen_bool(g, 1);
        break;

    case yajl_t_false:
        yajl_gen_bool(g, 0);
        break;

    default:
        yajl_gen_null(g);
        break;
    }
}


static void
ngx_http_hermes_mcp_call_error(ngx_http_hermes_rpc_call_t *call,
    const char *fmt, ...)
{
    u_char   *p;
    va_list   args;

    va_start(args, fmt);
    p = ngx_vslprintf(call->err_buf, call->err_buf + sizeof(call->err_buf),
                      fmt, args);
    va_end(args);

    call->err.data = call->err_buf;
    call->err.len = ngx_http_hermes_rpc_utf8_cut(call->err_buf,
                                                 p - call->err_buf, 1);
}


/* the body of an MCP step's subrequest */

ngx_buf_t *
ngx_http_hermes_mcp_body(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call)
{
    u_char              *p;
    size_t               len;
    ngx_buf_t           *b;
    ngx_http_request_t  *r;

    static u_char  init[] =
        "{\"jsonrpc\":\"2.0\",\"id\":\"hermes-init\",\"method\":\"initialize\","
        "\"params\":{\"protocolVersion\":\"" NGX_HTTP_HERMES_MCP_VERSION "\","
        "\"capabilities\":{},\"clientInfo\":{\"name\":\"ngx_hermes\","
        "\"version\":\"";
    static u_char  notify[] =
        "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}";
    static u_char  list[] =
        "{\"jsonrpc\":\"2.0\",\"id\":\"hermes-list\",\"method\":\"tools/list\"}";

    r = rpc->r;

    switch (call->step) {

    case NGX_HTTP_HERMES_MCP_INIT:
        /* clientInfo names this build's version */

        b = ngx_create_temp_buf(r->pool, sizeof(init) - 1
                                         + ngx_http_hermes_version.len + 4);
        if (b == NULL) {
            return NULL;
        }

        p = ngx_cpymem(b->last, init, sizeof(init) - 1);
        p = ngx_cpymem(p, ngx_http_hermes_version.data,
                       ngx_http_hermes_version.len);
        b->last = ngx_cpymem(p, "\"}}}", 4);
        b->last_buf = 1;

        return b;

    case NGX_HTTP_HERMES_MCP_NOTIFY:
        p = notify;
        len = sizeof(notify) - 1;
        goto fixed;

    case NGX_HTTP_HERMES_MCP_LIST:
        if (call->cursor.len == 0) {
            p = list;
            len = sizeof(list) - 1;
            goto fixed;
        }

        len = sizeof("{\"jsonrpc\":\"2.0\",\"id\":\"hermes-list\","
                     "\"method\":\"tools/list\",\"params\":"
                     "{\"cursor\":\"\"}}") - 1
              + call->cursor.len
              + ngx_escape_json(NULL, call->cursor.data, call->cursor.len);

        b = ngx_create_temp_buf(r->pool, len);
        if (b == NULL) {
            return NULL;
        }

        p = ngx_cpymem(b->last, "{\"jsonrpc\":\"2.0\",\"id\":\"hermes-list\","
                       "\"method\":\"tools/list\",\"params\":"
                       "{\"cursor\":\"",
                       sizeof("{\"jsonrpc\":\"2.0\",\"id\":\"hermes-list\","
                              "\"method\":\"tools/list\",\"params\":"
                              "{\"cursor\":\"") - 1);
        p = (u_char *) ngx_escape_json(p, call->cursor.data, call->cursor.len);
        p = ngx_cpymem(p, "\"}}", 3);

        b->last = p;
        b->last_buf = 1;

        return b;

    case NGX_HTTP_HERMES_MCP_CALL:
        len = sizeof("{\"jsonrpc\":\"2.0\",\"id\":,\"method\":\"tools/call\","
                     "\"params\":{\"name\":\"\",\"arguments\":,"
                     "\"_meta\":{\"progressToken\":}}}") - 1
              + 2 * NGX_INT64_LEN + call->tool.len
              + ngx_escape_json(NULL, call->tool.data, call->tool.len)
              + call->args.len;

        b = ngx_create_temp_buf(r->pool, len);
        if (b == NULL) {
            return NULL;
        }

        p = ngx_sprintf(b->last, "{\"jsonrpc\":\"2.0\",\"id\":%uL,"
                        "\"method\":\"tools/call\",\"params\":{\"name\":\"",
                        call->seq);
        p = (u_char *) ngx_escape_json(p, call->tool.data, call->tool.len);
        p = ngx_cpymem(p, "\",\"arguments\":", sizeof("\",\"arguments\":") - 1);
        p = ngx_cpymem(p, call->args.data, call->args.len);

        /* the call's own token: its progress reaches the cell's stream */
        p = ngx_sprintf(p, ",\"_meta\":{\"progressToken\":%uL}}}", call->seq);

        b->last = p;
        b->last_buf = 1;

        return b;

    default:
        return NULL;
    }

fixed:

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NULL;
    }

    b->pos = p;
    b->last = p + len;
    b->memory = 1;
    b->last_buf = 1;

    return b;
}


/*
 * The MCP sessions of kernels that ended (whichever worker saw them end)
 * with this server, ended with DELETE as the transport asks, as notes
 * (below).  A server that cannot end sessions answers 405, and forgets
 * them on its own.
 */

void
ngx_http_hermes_mcp_end_sessions(ngx_http_hermes_rpc_t *rpc, uint32_t peer)
{
    ngx_uint_t                     i, n;
    ngx_http_hermes_mcp_session_t  ms[NGX_HTTP_HERMES_MCP_END_BATCH];

    if (rpc->r == NULL) {
        return;
    }

    n = ngx_http_hermes_registry_mcp_ended(rpc->zone, peer, ms,
                                           NGX_HTTP_HERMES_MCP_END_BATCH);

    for (i = 0; i < n; i++) {
        if (ngx_http_hermes_mcp_note(rpc, &ms[i], NULL) != NGX_OK) {
            return;
        }

        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, rpc->log, 0,
                       "hermes: ending MCP session \"%*s\" of a kernel "
                       "that ended", ms[i].session_len, ms[i].session);
    }
}


/*
 * A note to the server in a session: a DELETE ending it (body NULL), or
 * a POST of a JSON-RPC message (an answer to the server's request).  A
 * background subrequest of the cell's request whose answer is dropped (no
 * rpc, no cap); nothing of the cell's request goes with it: no body of
 * its, no X-Hermes-*.
 */

static ngx_int_t
ngx_http_hermes_mcp_note(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_mcp_session_t *ms, ngx_buf_t *body)
{
    ngx_http_hermes_rpc_call_t  *call;

    if (rpc->r == NULL) {
        return NGX_ERROR;
    }

    call = ngx_pcalloc(rpc->r->pool, sizeof(ngx_http_hermes_rpc_call_t));
    if (call == NULL) {
        return NGX_ERROR;
    }

    call->step = NGX_HTTP_HERMES_MCP_END;
    call->ms = *ms;

    return ngx_http_hermes_rpc_post(rpc, call, body) ? NGX_OK : NGX_ERROR;
}


/*
 * A tools/call answered as an SSE stream, as it comes (the location must
 * pass it on unbuffered: proxy_buffering off): each whole event is looked
 * at once.  The server's requests are answered at once, as a client that
 * offers none of their features: ping, empty roots, an elicitation
 * declined, sampling refused, others "Method not found"; the server would
 * otherwise wait for them and the call hang.  Progress (the call's
 * progressToken) goes to the cell's stream as a tool_progress event.
 */

void
ngx_http_hermes_mcp_stream(ngx_event_t *ev)
{
    ngx_http_hermes_rpc_call_t *call = ev->data;

    ngx_http_hermes_rpc_t  *rpc;

    rpc = call->rpc;

    if (rpc == NULL || call->body == NULL) {
        return;                         /* the call is over */
    }

    ngx_http_hermes_mcp_scan(rpc, call);

    if (rpc->r) {
        /* out of a request's own handler: the answers' subrequests run */
        ngx_http_run_posted_requests(rpc->r->connection);
    }
}


/* the whole events of the stream not looked at yet */

static void
ngx_http_hermes_mcp_scan(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call)
{
    u_char    *p, *last, *end, *next, *crlf;
    yajl_val   v;

    if (call->body == NULL) {
        return;
    }

    p = call->body + call->scanned;
    last = call->body + call->len;

    for ( ;; ) {
        /* an event ends with a blank line */

        end = ngx_strlcasestrn(p, last, (u_char *) "\n\n", 2 - 1);
        next = end ? end + 2 : NULL;

        crlf = ngx_strlcasestrn(p, end ? end + 2 : last,
                                (u_char *) "\r\n\r\n", 4 - 1);

        if (crlf && (end == NULL || crlf < end)) {
            end = crlf;
            next = crlf + 4;
        }

        if (end == NULL) {
            break;
        }

        v = ngx_http_hermes_mcp_event(rpc, call, p, end);

        if (v) {
            ngx_http_hermes_mcp_message(rpc, call, v);
            yajl_tree_free(v);
        }

        p = next;
    }

    call->scanned = p - call->body;
}


/*
 * an event's "data:" lines, joined by "\n", as JSON; NULL: none, or not.
 * Its "id:" is the call's last event id (to resume by), its "retry:" the
 * wait before a resume.
 */

static yajl_val
ngx_http_hermes_mcp_event(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, u_char *p, u_char *last)
{
    u_char      *nl, *data, *d, *v, *e;
    ngx_int_t    n;

    data = ngx_pnalloc(rpc->pool, last - p + 1);
    if (data == NULL) {
        return NULL;
    }

    d = data;

    while (p < last) {
        nl = ngx_strlchr(p, last, '\n');
        if (nl == NULL) {
            nl = last;
        }

        if (nl - p >= 5 && ngx_strncmp(p, "data:", 5) == 0) {
            p += 5;

            if (p < nl && *p == ' ') {
                p++;
            }

            if (d > data) {
                *d++ = '\n';
            }

            d = ngx_cpymem(d, p, (nl > p && nl[-1] == '\r') ? nl - 1 - p
                                                            : nl - p);

        } else if (nl - p >= 3 && ngx_strncmp(p, "id:", 3) == 0) {
            v = p + 3;
            e = (nl > v && nl[-1] == '\r') ? nl - 1 : nl;

            if (v < e && *v == ' ') {
                v++;
            }

            /* one too long, or with a NUL, leaves nothing to resume by */

            if ((size_t) (e - v) <= sizeof(call->last_id)
                && ngx_strlchr(v, e, '\0') == NULL)
            {
                ngx_memcpy(call->last_id, v, e - v);
                call->last_id_len = e - v;

            } else {
                call->last_id_len = 0;
            }

            call->events++;

        } else if (nl - p >= 6 && ngx_strncmp(p, "retry:", 6) == 0) {
            v = p + 6;
            e = (nl > v && nl[-1] == '\r') ? nl - 1 : nl;

            if (v < e && *v == ' ') {
                v++;
            }

            n = ngx_atoi(v, e - v);

            if (n != NGX_ERROR) {
                call->retry = ngx_min((ngx_msec_t) n,
                                      (ngx_msec_t)
                                      NGX_HTTP_HERMES_MCP_RETRY_MAX);
            }
        }

        p = nl + 1;
    }

    if (d == data) {
        return NULL;
    }

    return ngx_http_hermes_mcp_json(rpc->pool, data, d - data);
}


/* a message of the server's within a call's stream: a request, progress */

static void
ngx_http_hermes_mcp_message(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, yajl_val v)
{
    const char  *method;
    yajl_val     m, id, total, message, progress, token;

    static const char  *pmethod[] = { "method", NULL };
    static const char  *pid[] = { "id", NULL };
    static const char  *pprogress[] = { "params", "progress", NULL };
    static const char  *ptoken[] = { "params", "progressToken", NULL };
    static const char  *ptotal[] = { "params", "total", NULL };
    static const char  *pmessage[] = { "params", "message", NULL };

    m = yajl_tree_get(v, pmethod, yajl_t_string);
    id = yajl_tree_get(v, pid, yajl_t_any);

    if (m == NULL) {
        /*
         * the call's own answer, taken at the stream's end, which is now:
         * a resumed stream may stay open after it
         */

        if (id && YAJL_IS_INTEGER(id)
            && id->u.number.i == (long long) call->seq)
        {
            call->answered = 1;
            ngx_http_hermes_mcp_stop(call);
        }

        return;
    }

    method = m->u.string;

    if (id) {
        ngx_http_hermes_mcp_answer_request(rpc, call, method, id);
        return;
    }

    if (ngx_strcmp(method, "notifications/progress") != 0) {
        return;
    }

    /* this call's own progress: the token it sent */

    token = yajl_tree_get(v, ptoken, yajl_t_number);

    if (token == NULL || !YAJL_IS_INTEGER(token)
        || token->u.number.i != (long long) call->seq)
    {
        return;
    }

    progress = yajl_tree_get(v, pprogress, yajl_t_number);
    total = yajl_tree_get(v, ptotal, yajl_t_number);
    message = yajl_tree_get(v, pmessage, yajl_t_string);

    if (progress == NULL) {
        return;
    }

    ngx_http_hermes_rpc_progress(rpc, call, progress->u.number.r,
                                 total ? total->u.number.r : NULL,
                                 message ? message->u.string : NULL);
}


/* the client's answer to a request of the server's, as a note */

static void
ngx_http_hermes_mcp_answer_request(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, const char *method, yajl_val id)
{
    size_t          len;
    ngx_buf_t      *b;
    yajl_gen        g;
    const u_char   *buf;
    const char     *tail;

    if (ngx_strcmp(method, "ping") == 0) {
        tail = ",\"result\":{}}";

    } else if (ngx_strcmp(method, "roots/list") == 0) {
        tail = ",\"result\":{\"roots\":[]}}";

    } else if (ngx_strcmp(method, "elicitation/create") == 0) {
        tail = ",\"result\":{\"action\":\"decline\"}}";

    } else if (ngx_strcmp(method, "sampling/createMessage") == 0) {
        tail = ",\"error\":{\"code\":-1,\"message\":\"the gateway does "
               "not sample\"}}";

    } else {
        tail = ",\"error\":{\"code\":-32601,\"message\":\"Method not "
               "found\"}}";
    }

    /* the id as it came, a string or a number */

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        return;
    }

    ngx_http_hermes_mcp_gen(g, id);

    if (yajl_gen_get_buf(g, &buf, &len) != yajl_gen_status_ok) {
        yajl_gen_free(g);
        return;
    }

    b = ngx_create_temp_buf(rpc->r ? rpc->r->pool : rpc->pool,
                            sizeof("{\"jsonrpc\":\"2.0\",\"id\":") - 1 + len
                            + ngx_strlen(tail));
    if (b == NULL) {
        yajl_gen_free(g);
        return;
    }

    b->last = ngx_cpymem(b->last, "{\"jsonrpc\":\"2.0\",\"id\":",
                         sizeof("{\"jsonrpc\":\"2.0\",\"id\":") - 1);
    b->last = ngx_cpymem(b->last, buf, len);
    b->last = ngx_cpymem(b->last, tail, ngx_strlen(tail));
    b->last_buf = 1;

    yajl_gen_free(g);

    if (ngx_http_hermes_mcp_note(rpc, &call->ms, b) != NGX_OK) {
        ngx_log_error(NGX_LOG_WARN, rpc->log, 0,
                      "hermes: could not answer the MCP server's \"%s\"",
                      method);
    }
}


/* a 400's body that says it is about the session (not the request) */

static ngx_uint_t
ngx_http_hermes_mcp_names_session(ngx_http_hermes_rpc_call_t *call)
{
    u_char  *p, *last;

    if (call->body == NULL || call->too_big) {
        return 0;
    }

    last = call->body + call->len;

    for (p = call->body; p + sizeof("session") - 1 <= last; p++) {
        if (ngx_strncasecmp(p, (u_char *) "session", sizeof("session") - 1)
            == 0)
        {
            return 1;
        }
    }

    return 0;
}


/* the protocol versions this client speaks */

static ngx_uint_t
ngx_http_hermes_mcp_version_ours(const char *version)
{
    return ngx_strcmp(version, NGX_HTTP_HERMES_MCP_VERSION) == 0
           || ngx_strcmp(version, NGX_HTTP_HERMES_MCP_VERSION_OLD) == 0;
}
