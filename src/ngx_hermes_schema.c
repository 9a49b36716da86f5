
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: hermes_schema, the execute_code tool for agent authors.
 */


#include "ngx_hermes.h"
#include "ngx_hermes_rpc_call.h"


static u_char *ngx_http_hermes_schema_tool(u_char *p, u_char *last,
    ngx_str_t *name, ngx_str_t *all, ngx_uint_t n);
static void ngx_http_hermes_schema_function(yajl_gen g, u_char *desc,
    size_t len, const char *params);
static void ngx_http_hermes_schema_property(yajl_gen g, const char *name,
    const char *type, const char *desc);


/*
 * hermes_schema: the execute_code tool for agent authors, in OpenAI's and
 * Anthropic's function formats, its description naming the tools its code
 * may call (this location's hermes_tools).  ?format=openai|anthropic gives
 * one of them alone.
 */

ngx_int_t
ngx_http_hermes_schema_handler(ngx_http_request_t *r)
{
    u_char                      *p, *last, *desc, *t;
    size_t                       len, n;
    ngx_int_t                    rc;
    ngx_buf_t                   *b;
    ngx_str_t                    fmt, *name, *listed;
    yajl_gen                     g;
    ngx_uint_t                   i, which;
    ngx_chain_t                  out;
    ngx_http_hermes_loc_conf_t  *hlcf;
    ngx_http_hermes_mcp_peer_t  *peer;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    which = 3;                  /* 1: openai, 2: anthropic, 3: both */

    if (ngx_http_arg(r, (u_char *) "format", 6, &fmt) == NGX_OK) {
        if (fmt.len == 6 && ngx_strncmp(fmt.data, "openai", 6) == 0) {
            which = 1;

        } else if (fmt.len == 9 && ngx_strncmp(fmt.data, "anthropic", 9) == 0) {
            which = 2;

        } else {
            return ngx_http_hermes_response_send_error(r,
                                              NGX_HTTP_BAD_REQUEST,
                                              "bad_format",
                                              "format is openai or "
                                              "anthropic");
        }
    }

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    /* the description: what the tool does, and the tools its code has */

    len = 1024;

    if (hlcf->tools) {
        name = hlcf->tools->elts;

        for (i = 0; i < hlcf->tools->nelts; i++) {
            len += 3 * name[i].len + 48;
        }
    }

    /* auto: the MCP server's tools as this worker last listed them */

    peer = NULL;

    if (hlcf->tools_auto && hlcf->tools_pass.len) {
        peer = ngx_http_hermes_mcp_peer(&hlcf->tools_pass);

        if (peer && peer->listed) {
            len += 3 * peer->tools_len + 48 * (peer->tools_len / 2 + 1);
        }
    }

    desc = ngx_pnalloc(r->pool, len);
    if (desc == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    last = desc + len;

    p = ngx_slprintf(desc, last,
            "Run Python code in a persistent kernel; variables and imports "
            "stay for the next call with the same session.  Returns the "
            "output (stdout, then stderr and the traceback), the status "
            "and the error.");

    if (peer && !peer->listed) {
        p = ngx_slprintf(p, last,
                "  The code can call the tools of the gateway's MCP server "
                "(module hermes_tools, imported already: "
                "hermes_tools.NAME(...) calls the tool NAME), each with "
                "keyword arguments, returning the tool's answer as Python "
                "data and raising hermes_tools.ToolError when it fails.");

    } else if (peer) {
        p = ngx_slprintf(p, last,
                "  The code can call these tools (module hermes_tools, "
                "imported already), each with keyword arguments, returning "
                "the tool's answer as Python data and raising "
                "hermes_tools.ToolError when it fails: ");

        /* the listed names, as the explicit ones are */

        n = 0;

        for (t = peer->tools; t < peer->tools + peer->tools_len; n++) {
            t += ngx_strlen(t) + 1;
        }

        listed = ngx_palloc(r->pool, (n + 1) * sizeof(ngx_str_t));
        if (listed == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        for (t = peer->tools, i = 0; i < n; i++) {
            listed[i].data = t;
            listed[i].len = ngx_strlen(t);
            t += listed[i].len + 1;
        }

        for (i = 0; i < n; i++) {
            p = ngx_slprintf(p, last, "%s", i ? ", " : "");
            p = ngx_http_hermes_schema_tool(p, last, &listed[i], listed, n);
        }

        p = ngx_slprintf(p, last, ".  At most %ui tool calls per run.",
                         hlcf->max_tool_calls);

    } else if (hlcf->tools == NULL || hlcf->tools->nelts == 0) {
        /* the names are the execute location's; where they go is not */
        p = ngx_slprintf(p, last, "  No tools can be called from the code.");

    } else {
        p = ngx_slprintf(p, last,
                "  The code can call these tools (module hermes_tools, "
                "imported already), each with keyword arguments, returning "
                "the tool's answer as Python data and raising "
                "hermes_tools.ToolError when it fails: ");

        name = hlcf->tools->elts;

        for (i = 0; i < hlcf->tools->nelts; i++) {
            p = ngx_slprintf(p, last, "%s", i ? ", " : "");
            p = ngx_http_hermes_schema_tool(p, last, &name[i], name,
                                            hlcf->tools->nelts);
        }

        p = ngx_slprintf(p, last, ".  At most %ui tool calls per run.",
                         hlcf->max_tool_calls);
    }

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (which == 3) {
        yajl_gen_map_open(g);
    }

    if (which & 1) {
        if (which == 3) {
            yajl_gen_string(g, (u_char *) "openai", 6);
        }

        yajl_gen_map_open(g);
        yajl_gen_string(g, (u_char *) "type", 4);
        yajl_gen_string(g, (u_char *) "function", 8);
        yajl_gen_string(g, (u_char *) "function", 8);
        ngx_http_hermes_schema_function(g, desc, p - desc, "parameters");
        yajl_gen_map_close(g);
    }

    if (which & 2) {
        if (which == 3) {
            yajl_gen_string(g, (u_char *) "anthropic", 9);
        }

        ngx_http_hermes_schema_function(g, desc, p - desc,
                                            "input_schema");
    }

    if (which == 3) {
        yajl_gen_map_close(g);
    }

    if (yajl_gen_get_buf(g, (const unsigned char **) &p, &len)
        != yajl_gen_status_ok)
    {
        yajl_gen_free(g);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b = ngx_create_temp_buf(r->pool, len + 1);
    if (b == NULL) {
        yajl_gen_free(g);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = ngx_cpymem(b->last, p, len);
    *b->last++ = '\n';
    b->last_buf = (r == r->main);
    b->last_in_chain = 1;

    yajl_gen_free(g);

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = b->last - b->pos;
    ngx_str_set(&r->headers_out.content_type, "application/json");
    r->headers_out.content_type_len = r->headers_out.content_type.len;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


static void
ngx_http_hermes_schema_function(yajl_gen g, u_char *desc, size_t len,
    const char *params)
{
    yajl_gen_map_open(g);
    yajl_gen_string(g, (u_char *) "name", 4);
    yajl_gen_string(g, (u_char *) "execute_code", 12);
    yajl_gen_string(g, (u_char *) "description", 11);
    yajl_gen_string(g, desc, len);
    yajl_gen_string(g, (u_char *) params, ngx_strlen(params));

    yajl_gen_map_open(g);
    yajl_gen_string(g, (u_char *) "type", 4);
    yajl_gen_string(g, (u_char *) "object", 6);
    yajl_gen_string(g, (u_char *) "properties", 10);
    yajl_gen_map_open(g);

    ngx_http_hermes_schema_property(g, "code", "string",
        "The Python code to run.  The value of a last expression is "
        "printed.");
    ngx_http_hermes_schema_property(g, "session", "string",
        "The kernel to run it in: 1-128 of A-Z a-z 0-9 . _ : -.  The same "
        "session keeps its variables; none: a fresh kernel for this run "
        "only.");
    ngx_http_hermes_schema_property(g, "timeout", "integer",
        "Seconds the code may run (default and cap: the gateway's).");
    ngx_http_hermes_schema_property(g, "reset", "boolean",
        "Start the session's kernel afresh first.");

    yajl_gen_map_close(g);
    yajl_gen_string(g, (u_char *) "required", 8);
    yajl_gen_array_open(g);
    yajl_gen_string(g, (u_char *) "code", 4);
    yajl_gen_array_close(g);
    yajl_gen_map_close(g);

    yajl_gen_map_close(g);
}


static void
ngx_http_hermes_schema_property(yajl_gen g, const char *name,
    const char *type, const char *desc)
{
    yajl_gen_string(g, (u_char *) name, ngx_strlen(name));
    yajl_gen_map_open(g);
    yajl_gen_string(g, (u_char *) "type", 4);
    yajl_gen_string(g, (u_char *) type, ngx_strlen(type));
    yajl_gen_string(g, (u_char *) "description", 11);
    yajl_gen_string(g, (u_char *) desc, ngx_strlen(desc));
    yajl_gen_map_close(g);
}


/*
 * A tool as code calls it: hermes_tools.IDENT(...), IDENT its name as a
 * Python identifier; a name whose identifier another tool's shares is
 * reached through call() only, as hermes_tools.py has it.
 */

static u_char *
ngx_http_hermes_schema_tool(u_char *p, u_char *last, ngx_str_t *name,
    ngx_str_t *all, ngx_uint_t n)
{
    size_t      len, olen;
    ngx_uint_t  i;
    u_char      ident[NGX_HTTP_HERMES_TOOL_IDENT];
    u_char      other[NGX_HTTP_HERMES_TOOL_IDENT];

    len = ngx_http_hermes_tool_ident(ident, name);

    for (i = 0; i < n; i++) {
        if (all[i].len == name->len
            && ngx_strncmp(all[i].data, name->data, name->len) == 0)
        {
            continue;
        }

        olen = ngx_http_hermes_tool_ident(other, &all[i]);

        if (olen == len && ngx_strncmp(other, ident, len) == 0) {
            return ngx_slprintf(p, last, "hermes_tools.call(\"%V\", {...})",
                                name);
        }
    }

    return ngx_slprintf(p, last, "hermes_tools.%*s(...)", len, ident);
}
