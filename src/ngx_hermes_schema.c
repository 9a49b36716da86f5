
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: hermes_schema, the execute_code tool for agent authors.
 */


#include "ngx_hermes.h"
#include "ngx_hermes_rpc_call.h"


/* parameters of a tool hermes_schema writes, at most */
#define NGX_HTTP_HERMES_SCHEMA_PARAMS  64


static u_char *ngx_http_hermes_schema_tool(u_char *p, u_char *last,
    ngx_str_t *name, ngx_str_t *all, ngx_uint_t n);
static void ngx_http_hermes_schema_function(yajl_gen g, u_char *desc,
    size_t len, const char *params);
static void ngx_http_hermes_schema_property(yajl_gen g, const char *name,
    const char *type, const char *desc);
static u_char *ngx_http_hermes_schema_defs(u_char *p, u_char *last,
    ngx_str_t *names, ngx_uint_t n, u_char *list);
static u_char *ngx_http_hermes_schema_python(u_char *p, u_char *last,
    u_char *ident, size_t ilen, yajl_val tool);
static u_char *ngx_http_hermes_schema_param(u_char *name, u_char *buf,
    size_t *len);
static ngx_uint_t ngx_http_hermes_schema_word(u_char c);
static char *ngx_http_hermes_schema_pytype(const char *type);
static u_char *ngx_http_hermes_schema_pyvalue(u_char *p, u_char *last,
    yajl_val v, ngx_uint_t depth);
static u_char *ngx_http_hermes_schema_pystr(u_char *p, u_char *last,
    u_char *s, size_t len, ngx_uint_t literal);
static yajl_val ngx_http_hermes_schema_entry(yajl_val tool);
static u_char *ngx_http_hermes_schema_check_params(yajl_val params);
static void ngx_http_hermes_schema_gen_tool(yajl_gen g, yajl_val tool);
static void ngx_http_hermes_schema_gen_value(yajl_gen g, yajl_val v,
    ngx_uint_t depth);


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
            len += 400 * (peer->tools_len / 2 + 1);
        }

        if (peer && peer->schemas) {
            len += 6 * peer->schemas_len;
        }
    }

    /* the signatures: 4 bytes a byte of the JSON at most, and each def's */

    if (!hlcf->tools_auto && hlcf->tools) {
        len += 6 * hlcf->tools_schema.len + 400 * hlcf->tools->nelts;
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

        p = ngx_http_hermes_schema_defs(p, last, listed, n, peer->schemas);

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

        p = ngx_http_hermes_schema_defs(p, last, name, hlcf->tools->nelts,
                                        hlcf->tools_schema.data);
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


/*
 * hermes_tools_schema FILE: the tools' schemas for the stubs in cells and
 * for hermes_schema, a JSON list of OpenAI function definitions
 * ({"type":"function","function":{...}}) or of bare {"name",
 * "description","parameters"}; read and checked here, so nginx -t names
 * the file and what is wrong with it.  Kept as the normalized list's JSON
 * text, NUL-terminated (it is parsed again where it is used, rarely).
 */

char *
ngx_http_hermes_tools_schema(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_hermes_loc_conf_t *hlcf = conf;

    u_char           *buf, *p;
    size_t            len, i, j;
    ssize_t           n;
    ngx_fd_t          fd;
    ngx_str_t        *value, file, name;
    yajl_gen          g;
    yajl_val          root, tool, v, params, fn;
    ngx_file_info_t   fi;
    char              err[256];

    static const char  *ptype[] = { "type", NULL };
    static const char  *pfunction[] = { "function", NULL };
    static const char  *pname[] = { "name", NULL };
    static const char  *pdesc[] = { "description", NULL };
    static const char  *pparams[] = { "parameters", NULL };

    if (hlcf->tools_schema.data) {
        return "is duplicate";
    }

    value = cf->args->elts;
    file = value[1];

    if (ngx_conf_full_name(cf->cycle, &file, 1) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    fd = ngx_open_file(file.data, NGX_FILE_RDONLY, NGX_FILE_OPEN, 0);
    if (fd == NGX_INVALID_FILE) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           "\"hermes_tools_schema\": cannot open \"%V\"",
                           &file);
        return NGX_CONF_ERROR;
    }

    /* a schema file is small: 16m is far past any list of tools */

    if (ngx_fd_info(fd, &fi) == NGX_FILE_ERROR
        || !ngx_is_file(&fi) || ngx_file_size(&fi) > 16 * 1024 * 1024)
    {
        ngx_close_file(fd);
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"hermes_tools_schema\": \"%V\" is not a regular "
                           "file of at most 16m", &file);
        return NGX_CONF_ERROR;
    }

    len = (size_t) ngx_file_size(&fi);

    buf = ngx_pnalloc(cf->temp_pool, len + 1);
    if (buf == NULL) {
        ngx_close_file(fd);
        return NGX_CONF_ERROR;
    }

    for (i = 0; i < len; i += n) {
        n = ngx_read_fd(fd, buf + i, len - i);

        if (n <= 0) {
            ngx_close_file(fd);
            ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                               "\"hermes_tools_schema\": cannot read \"%V\"",
                               &file);
            return NGX_CONF_ERROR;
        }
    }

    ngx_close_file(fd);
    buf[len] = '\0';

    err[0] = '\0';
    root = yajl_tree_parse((const char *) buf, err, sizeof(err));

    if (root == NULL) {
        for (p = (u_char *) err; *p; p++) {
            if (*p == '\n') {
                *p = ' ';       /* yajl's message spans lines */
            }
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"hermes_tools_schema\": \"%V\" is not JSON: %s",
                           &file, err);
        return NGX_CONF_ERROR;
    }

#define ngx_http_hermes_schema_bad(fmt, ...)                                  \
    do {                                                                      \
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,                              \
                           "\"hermes_tools_schema\": \"%V\": " fmt,           \
                           &file, __VA_ARGS__);                               \
        goto failed;                                                          \
    } while (0)

    g = NULL;

    if (!YAJL_IS_ARRAY(root)) {
        ngx_http_hermes_schema_bad("%s", "not a JSON list of tools");
    }

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        goto failed;
    }

    yajl_gen_array_open(g);

    for (i = 0; i < root->u.array.len; i++) {
        tool = root->u.array.values[i];

        if (!YAJL_IS_OBJECT(tool)) {
            ngx_http_hermes_schema_bad("tool #%uz is not an object", i + 1);
        }

        /* OpenAI's {"type":"function","function":{...}}, or the bare one */

        v = yajl_tree_get(tool, ptype, yajl_t_any);
        fn = yajl_tree_get(tool, pfunction, yajl_t_any);

        if (v || fn) {
            if (!YAJL_IS_STRING(v) || ngx_strcmp(v->u.string, "function") != 0
                || !YAJL_IS_OBJECT(fn))
            {
                ngx_http_hermes_schema_bad("tool #%uz: \"type\" must be "
                                           "\"function\", with a "
                                           "\"function\" object", i + 1);
            }

            tool = fn;
        }

        v = yajl_tree_get(tool, pname, yajl_t_any);

        if (!YAJL_IS_STRING(v)) {
            ngx_http_hermes_schema_bad("tool #%uz has no \"name\"", i + 1);
        }

        name.data = (u_char *) v->u.string;
        name.len = ngx_strlen(v->u.string);

        if (!ngx_http_hermes_tool_name_valid(name.data, name.len)) {
            ngx_http_hermes_schema_bad("tool #%uz: invalid name \"%V\" (1-%d "
                                       "of A-Z a-z 0-9 _ - .)", i + 1, &name,
                                       128);
        }

        for (j = 0; j < i; j++) {
            fn = ngx_http_hermes_schema_entry(root->u.array.values[j]);
            v = fn ? yajl_tree_get(fn, pname, yajl_t_string) : NULL;

            if (v && ngx_strcmp(v->u.string, name.data) == 0) {
                ngx_http_hermes_schema_bad("tool \"%V\" is there twice",
                                           &name);
            }
        }

        v = yajl_tree_get(tool, pdesc, yajl_t_any);

        if (v && !YAJL_IS_STRING(v)) {
            ngx_http_hermes_schema_bad("the \"description\" of tool \"%V\" "
                                       "is not a string", &name);
        }

        params = yajl_tree_get(tool, pparams, yajl_t_any);

        if (params && !YAJL_IS_OBJECT(params)) {
            ngx_http_hermes_schema_bad("the \"parameters\" of tool \"%V\" "
                                       "are not an object", &name);
        }

        if (params) {
            p = ngx_http_hermes_schema_check_params(params);

            if (p) {
                ngx_http_hermes_schema_bad("the \"parameters\" of tool "
                                           "\"%V\": %s", &name, p);
            }
        }

        ngx_http_hermes_schema_gen_tool(g, tool);
    }

    yajl_gen_array_close(g);

#undef ngx_http_hermes_schema_bad

    if (yajl_gen_get_buf(g, (const unsigned char **) &p, &len)
        != yajl_gen_status_ok)
    {
        goto failed;
    }

    hlcf->tools_schema.data = ngx_pnalloc(cf->pool, len + 1);
    if (hlcf->tools_schema.data == NULL) {
        goto failed;
    }

    ngx_memcpy(hlcf->tools_schema.data, p, len);
    hlcf->tools_schema.data[len] = '\0';
    hlcf->tools_schema.len = len;
    hlcf->tools_schema_file = file;

    yajl_gen_free(g);
    yajl_tree_free(root);

    return ngx_http_hermes_tools_schema_check(cf, hlcf);

failed:

    if (g) {
        yajl_gen_free(g);
    }

    yajl_tree_free(root);

    return NGX_CONF_ERROR;
}


/* a list entry's function: the OpenAI form's "function", or itself */

static yajl_val
ngx_http_hermes_schema_entry(yajl_val tool)
{
    yajl_val  fn;

    static const char  *pfunction[] = { "function", NULL };

    if (!YAJL_IS_OBJECT(tool)) {
        return NULL;
    }

    fn = yajl_tree_get(tool, pfunction, yajl_t_object);

    return fn ? fn : tool;
}


/* what is wrong with a tool's "parameters" (an object), or NULL */

static u_char *
ngx_http_hermes_schema_check_params(yajl_val params)
{
    size_t    i;
    yajl_val  v;

    static const char  *ptype[] = { "type", NULL };
    static const char  *pprops[] = { "properties", NULL };
    static const char  *preq[] = { "required", NULL };

    v = yajl_tree_get(params, ptype, yajl_t_any);

    if (v && !(YAJL_IS_STRING(v) && ngx_strcmp(v->u.string, "object") == 0)) {
        return (u_char *) "\"type\" must be \"object\"";
    }

    v = yajl_tree_get(params, pprops, yajl_t_any);

    if (v && !YAJL_IS_OBJECT(v)) {
        return (u_char *) "\"properties\" is not an object";
    }

    v = yajl_tree_get(params, preq, yajl_t_any);

    if (v) {
        if (!YAJL_IS_ARRAY(v)) {
            return (u_char *) "\"required\" is not a list of names";
        }

        for (i = 0; i < v->u.array.len; i++) {
            if (!YAJL_IS_STRING(v->u.array.values[i])) {
                return (u_char *) "\"required\" is not a list of names";
            }
        }
    }

    return NULL;
}


/* one tool as the stubs take it: {"name","description","parameters"} */

static void
ngx_http_hermes_schema_gen_tool(yajl_gen g, yajl_val tool)
{
    yajl_val  v;

    static const char  *pname[] = { "name", NULL };
    static const char  *pdesc[] = { "description", NULL };
    static const char  *pparams[] = { "parameters", NULL };
    static const char  *pinput[] = { "inputSchema", NULL };

    yajl_gen_map_open(g);

    v = yajl_tree_get(tool, pname, yajl_t_string);
    yajl_gen_string(g, (u_char *) "name", 4);
    yajl_gen_string(g, (u_char *) v->u.string, ngx_strlen(v->u.string));

    v = yajl_tree_get(tool, pdesc, yajl_t_string);

    if (v) {
        yajl_gen_string(g, (u_char *) "description", 11);
        yajl_gen_string(g, (u_char *) v->u.string, ngx_strlen(v->u.string));
    }

    /* MCP's tools/list says inputSchema */

    v = yajl_tree_get(tool, pparams, yajl_t_object);

    if (v == NULL) {
        v = yajl_tree_get(tool, pinput, yajl_t_object);
    }

    if (v) {
        yajl_gen_string(g, (u_char *) "parameters", 10);
        ngx_http_hermes_schema_gen_value(g, v, 0);
    }

    yajl_gen_map_close(g);
}


static void
ngx_http_hermes_schema_gen_value(yajl_gen g, yajl_val v, ngx_uint_t depth)
{
    size_t  i;

    if (depth > NGX_HTTP_HERMES_RPC_DEPTH) {
        yajl_gen_null(g);
        return;
    }

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
            ngx_http_hermes_schema_gen_value(g, v->u.object.values[i],
                                             depth + 1);
        }

        yajl_gen_map_close(g);
        break;

    case yajl_t_array:
        yajl_gen_array_open(g);

        for (i = 0; i < v->u.array.len; i++) {
            ngx_http_hermes_schema_gen_value(g, v->u.array.values[i],
                                             depth + 1);
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
    }
}


/*
 * A schema file and a list of names set in one block must agree: a tool
 * the file has that the list has not is a mistake.  Inherited, the list
 * is the one that counts (the stubs take the enabled tools' schemas).
 * Called by whichever of the two directives comes second.
 */

char *
ngx_http_hermes_tools_schema_check(ngx_conf_t *cf,
    ngx_http_hermes_loc_conf_t *hlcf)
{
    size_t       i;
    ngx_str_t   *name;
    yajl_val     root, v;
    ngx_uint_t   k, found;

    static const char  *pname[] = { "name", NULL };

    if (hlcf->tools_schema.data == NULL || hlcf->tools == NGX_CONF_UNSET_PTR
        || hlcf->tools == NULL || hlcf->tools_auto)
    {
        return NGX_CONF_OK;
    }

    root = yajl_tree_parse((const char *) hlcf->tools_schema.data, NULL, 0);
    if (root == NULL) {
        return NGX_CONF_ERROR;
    }

    for (i = 0; i < root->u.array.len; i++) {
        v = yajl_tree_get(root->u.array.values[i], pname, yajl_t_string);
        name = hlcf->tools->elts;
        found = 0;

        for (k = 0; k < hlcf->tools->nelts; k++) {
            if (name[k].len == ngx_strlen(v->u.string)
                && ngx_strncmp(name[k].data, v->u.string, name[k].len) == 0)
            {
                found = 1;
                break;
            }
        }

        if (!found) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"hermes_tools_schema\": \"%V\": tool "
                               "\"%s\" is not one of \"hermes_tools\"",
                               &hlcf->tools_schema_file, v->u.string);
            yajl_tree_free(root);
            return NGX_CONF_ERROR;
        }
    }

    yajl_tree_free(root);

    return NGX_CONF_OK;
}


void
ngx_http_hermes_tools_schema_merge(ngx_http_hermes_loc_conf_t *conf,
    ngx_http_hermes_loc_conf_t *prev)
{
    if (conf->tools_schema.data == NULL) {
        conf->tools_schema = prev->tools_schema;
        conf->tools_schema_file = prev->tools_schema_file;
    }
}


/*
 * "tools/list" from a cell (no tool has that name): the schemas its stubs
 * take, as the list answer of a call.  hermes_tools_schema's; with
 * hermes_tools auto, the MCP server's as this worker listed them (the
 * caller lists them first when it has not).  Not a tool call: no budget,
 * no stream line.
 */

void
ngx_http_hermes_schema_list(ngx_http_hermes_rpc_t *rpc, uint64_t seq)
{
    ngx_int_t                    rc;
    ngx_str_t                    list;
    ngx_http_hermes_mcp_peer_t  *peer;

    ngx_str_set(&list, "[]");

    if (rpc->hlcf->tools_auto) {
        peer = ngx_http_hermes_mcp_peer(&rpc->hlcf->tools_pass);

        if (peer && peer->schemas) {
            list.data = peer->schemas;
            list.len = peer->schemas_len;
        }

    } else if (rpc->hlcf->tools_schema.data) {
        list = rpc->hlcf->tools_schema;
    }

    rc = ngx_http_hermes_rpc_answer_ok(rpc, seq, list.data, list.len);

    if (rc != NGX_OK) {
        ngx_http_hermes_rpc_answer_error(rpc, seq,
                     (u_char *) "the tools' schemas could not be passed on");
    }
}


/* a page of tools/list: its tools' schemas, each ",{...}", to the call's */

ngx_int_t
ngx_http_hermes_schema_gather(ngx_http_hermes_rpc_call_t *call,
    yajl_val tools, ngx_log_t *log)
{
    u_char               *p;
    size_t                i, n;
    yajl_gen              g;
    yajl_val              name;
    yajl_gen_status       st;
    const unsigned char  *buf;

    static const char  *pname[] = { "name", NULL };

    if (call->pages == 0 && call->schemas) {
        /* a first page again (a retry): what came before is not this list */
        ngx_free(call->schemas);
        call->schemas = NULL;
        call->schemas_len = 0;
    }

    for (i = 0; i < tools->u.array.len; i++) {
        name = yajl_tree_get(tools->u.array.values[i], pname, yajl_t_string);

        if (name == NULL
            || !ngx_http_hermes_tool_name_valid((u_char *) name->u.string,
                                                ngx_strlen(name->u.string)))
        {
            continue;
        }

        g = yajl_gen_alloc(NULL);
        if (g == NULL) {
            return NGX_ERROR;
        }

        ngx_http_hermes_schema_gen_tool(g, tools->u.array.values[i]);

        st = yajl_gen_get_buf(g, &buf, &n);

        p = (st == yajl_gen_status_ok)
            ? ngx_alloc(call->schemas_len + 1 + n, log) : NULL;

        if (p == NULL) {
            yajl_gen_free(g);
            return NGX_ERROR;
        }

        if (call->schemas) {
            ngx_memcpy(p, call->schemas, call->schemas_len);
            ngx_free(call->schemas);
        }

        call->schemas = p;
        p += call->schemas_len;
        *p++ = ',';
        ngx_memcpy(p, buf, n);
        call->schemas_len += 1 + n;

        yajl_gen_free(g);
    }

    return NGX_OK;
}


/* the last page came: the worker's list of schemas is the call's */

void
ngx_http_hermes_schema_keep(ngx_http_hermes_mcp_peer_t *peer,
    ngx_http_hermes_rpc_call_t *call, ngx_log_t *log)
{
    u_char  *p;

    /* NUL-terminated (not counted): hermes_schema parses it */

    p = ngx_alloc(call->schemas_len + 3, log);
    if (p == NULL) {
        return;
    }

    if (call->schemas_len) {
        /* ",{...},{...}": the first comma becomes the bracket */
        ngx_memcpy(p, call->schemas, call->schemas_len);
        p[0] = '[';
        p[call->schemas_len] = ']';

    } else {
        p[0] = '[';
        p[1] = ']';
    }

    if (peer->schemas) {
        ngx_free(peer->schemas);
    }

    peer->schemas = p;
    peer->schemas_len = call->schemas_len ? call->schemas_len + 1 : 2;
    p[peer->schemas_len] = '\0';

    if (call->schemas) {
        ngx_free(call->schemas);
        call->schemas = NULL;
        call->schemas_len = 0;
    }
}


/*
 * hermes_schema's Python: "def IDENT(SIGNATURE):" and the description as
 * its docstring, the signature the stub in the cell has (hermes_tools.py,
 * _signature: the required parameters first, positional-or-keyword, the
 * others keyword-only with their defaults, None without one; names that
 * are not identifiers mapped as there).  It parses as Python.
 */

static u_char *
ngx_http_hermes_schema_python(u_char *p, u_char *last, u_char *ident,
    size_t ilen, yajl_val tool)
{
    char        *type;
    u_char      *name, *desc;
    size_t       i, k, np, len;
    yajl_val     params, props, req, prop, v;
    ngx_uint_t   required, pass, star, first;
    u_char      *names[NGX_HTTP_HERMES_SCHEMA_PARAMS];
    u_char      *idents[NGX_HTTP_HERMES_SCHEMA_PARAMS];
    size_t       ilens[NGX_HTTP_HERMES_SCHEMA_PARAMS];
    u_char       buf[NGX_HTTP_HERMES_SCHEMA_PARAMS][NGX_HTTP_HERMES_TOOL_IDENT];

    static const char  *pparams[] = { "parameters", NULL };
    static const char  *pprops[] = { "properties", NULL };
    static const char  *preq[] = { "required", NULL };
    static const char  *pdesc[] = { "description", NULL };
    static const char  *pname[] = { "name", NULL };
    static const char  *ptype[] = { "type", NULL };
    static const char  *pdefault[] = { "default", NULL };

    params = yajl_tree_get(tool, pparams, yajl_t_object);
    props = params ? yajl_tree_get(params, pprops, yajl_t_object) : NULL;
    req = params ? yajl_tree_get(params, preq, yajl_t_array) : NULL;

    /* the parameters in the schema's order, then required ones not there */

    np = 0;

    for (i = 0; props && i < props->u.object.len; i++) {
        if (np < NGX_HTTP_HERMES_SCHEMA_PARAMS) {
            names[np++] = (u_char *) props->u.object.keys[i];
        }
    }

    for (i = 0; req && i < req->u.array.len; i++) {
        v = req->u.array.values[i];

        if (!YAJL_IS_STRING(v) || np == NGX_HTTP_HERMES_SCHEMA_PARAMS) {
            continue;
        }

        for (k = 0; k < np; k++) {
            if (ngx_strcmp(names[k], v->u.string) == 0) {
                break;
            }
        }

        if (k == np) {
            names[np++] = (u_char *) v->u.string;
        }
    }

    /* each one's identifier, NULL: the name's is taken (**{name: v}) */

    for (i = 0; i < np; i++) {
        idents[i] = ngx_http_hermes_schema_param(names[i], buf[i], &ilens[i]);

        for (k = 0; idents[i] && k < np; k++) {
            if (k < i && idents[k] && ilens[k] == ilens[i]
                && ngx_strncmp(idents[k], idents[i], ilens[i]) == 0)
            {
                idents[i] = NULL;

            } else if (idents[i] == buf[i] && ngx_strlen(names[k]) == ilens[i]
                       && ngx_strncmp(names[k], idents[i], ilens[i]) == 0)
            {
                /* mapped onto a name the schema has */
                idents[i] = NULL;
            }
        }
    }

    p = ngx_slprintf(p, last, "\ndef %*s(", ilen, ident);

    star = 0;
    first = 1;

    for (pass = 1; pass <= 2; pass++) {
        for (i = 0; i < np; i++) {
            if (idents[i] == NULL) {
                continue;
            }

            required = 0;

            for (k = 0; req && k < req->u.array.len; k++) {
                v = req->u.array.values[k];

                if (YAJL_IS_STRING(v) && ngx_strcmp(v->u.string, names[i]) == 0)
                {
                    required = 1;
                    break;
                }
            }

            if ((pass == 1) != required) {
                continue;
            }

            p = ngx_slprintf(p, last, "%s", first ? "" : ", ");
            first = 0;

            if (pass == 2 && !star) {
                p = ngx_slprintf(p, last, "*, ");
                star = 1;
            }

            p = ngx_slprintf(p, last, "%*s", ilens[i], idents[i]);

            prop = NULL;

            for (k = 0; props && k < props->u.object.len; k++) {
                if (ngx_strcmp(props->u.object.keys[k], names[i]) == 0) {
                    prop = props->u.object.values[k];
                    break;
                }
            }

            v = (prop && YAJL_IS_OBJECT(prop))
                ? yajl_tree_get(prop, ptype, yajl_t_string) : NULL;
            type = v ? ngx_http_hermes_schema_pytype(v->u.string) : NULL;

            if (type) {
                p = ngx_slprintf(p, last, ": %s", type);
            }

            if (pass == 2) {
                v = (prop && YAJL_IS_OBJECT(prop))
                    ? yajl_tree_get(prop, pdefault, yajl_t_any) : NULL;

                p = ngx_slprintf(p, last, type ? " = " : "=");
                p = ngx_http_hermes_schema_pyvalue(p, last, v, 0);
            }
        }
    }

    /* the description, a docstring: nothing in it ends it */

    v = yajl_tree_get(tool, pdesc, yajl_t_string);

    if (v && v->u.string[0]) {
        desc = (u_char *) v->u.string;
        p = ngx_slprintf(p, last, "):\n    \"\"\"");
        p = ngx_http_hermes_schema_pystr(p, last, desc, ngx_strlen(desc), 0);

    } else {
        v = yajl_tree_get(tool, pname, yajl_t_string);
        name = v ? (u_char *) v->u.string : ident;
        len = v ? ngx_strlen(name) : ilen;
        p = ngx_slprintf(p, last, "):\n    \"\"\"The tool ");
        p = ngx_http_hermes_schema_pystr(p, last, name, len, 0);
        p = ngx_slprintf(p, last, ".");
    }

    return ngx_slprintf(p, last, "\"\"\"\n");
}


/* a parameter's identifier: its name, or mapped (hermes_tools.py) */

static u_char *
ngx_http_hermes_schema_param(u_char *name, u_char *buf, size_t *len)
{
    u_char      *p;
    size_t       n, i;
    ngx_str_t    s;
    ngx_uint_t   ident;
    u_char       tmp[NGX_HTTP_HERMES_TOOL_IDENT];

    n = ngx_strlen(name);

    if (n > 120) {
        return NULL;
    }

    ident = (n > 0 && !(name[0] >= '0' && name[0] <= '9'));

    for (i = 0; i < n; i++) {
        if (!ngx_http_hermes_schema_word(name[i])) {
            ident = 0;
        }
    }

    s.data = name;
    s.len = n;

    if (ident && ngx_http_hermes_tool_ident(tmp, &s) == n) {
        /* an identifier, not a keyword: as it is */
        *len = n;
        return name;
    }

    p = buf;

    if (n && name[0] >= '0' && name[0] <= '9') {
        p = ngx_cpymem(p, "p_", 2);
    }

    for (i = 0; i < n; i++) {
        *p++ = ngx_http_hermes_schema_word(name[i]) ? name[i] : '_';
    }

    if (n == 0) {
        *p++ = '_';
    }

    s.data = buf;
    s.len = p - buf;

    /* no "-", ".", leading digit: only a keyword's "_" */
    *len = ngx_http_hermes_tool_ident(tmp, &s);
    ngx_memcpy(buf, tmp, *len);

    return buf;
}


static ngx_uint_t
ngx_http_hermes_schema_word(u_char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
           || (c >= '0' && c <= '9') || c == '_';
}


static char *
ngx_http_hermes_schema_pytype(const char *type)
{
    ngx_uint_t  i;

    static char  *types[] = {
        "string", "str", "integer", "int", "number", "float",
        "boolean", "bool", "array", "list", "object", "dict", NULL
    };

    for (i = 0; types[i]; i += 2) {
        if (ngx_strcmp(type, types[i]) == 0) {
            return types[i + 1];
        }
    }

    return NULL;
}


/* a JSON value as a Python literal */

static u_char *
ngx_http_hermes_schema_pyvalue(u_char *p, u_char *last, yajl_val v,
    ngx_uint_t depth)
{
    size_t  i;

    if (v == NULL) {
        return ngx_slprintf(p, last, "None");
    }

    if (depth > 8) {
        return ngx_slprintf(p, last, "...");
    }

    switch (v->type) {

    case yajl_t_string:
        p = ngx_slprintf(p, last, "'");
        p = ngx_http_hermes_schema_pystr(p, last, (u_char *) v->u.string,
                                         ngx_strlen(v->u.string), 1);
        return ngx_slprintf(p, last, "'");

    case yajl_t_number:
        return ngx_slprintf(p, last, "%s", v->u.number.r);

    case yajl_t_true:
        return ngx_slprintf(p, last, "True");

    case yajl_t_false:
        return ngx_slprintf(p, last, "False");

    case yajl_t_array:
        p = ngx_slprintf(p, last, "[");

        for (i = 0; i < v->u.array.len; i++) {
            p = ngx_slprintf(p, last, "%s", i ? ", " : "");
            p = ngx_http_hermes_schema_pyvalue(p, last, v->u.array.values[i],
                                               depth + 1);
        }

        return ngx_slprintf(p, last, "]");

    case yajl_t_object:
        p = ngx_slprintf(p, last, "{");

        for (i = 0; i < v->u.object.len; i++) {
            p = ngx_slprintf(p, last, "%s'", i ? ", " : "");
            p = ngx_http_hermes_schema_pystr(p, last,
                                         (u_char *) v->u.object.keys[i],
                                         ngx_strlen(v->u.object.keys[i]), 1);
            p = ngx_slprintf(p, last, "': ");
            p = ngx_http_hermes_schema_pyvalue(p, last,
                                               v->u.object.values[i],
                                               depth + 1);
        }

        return ngx_slprintf(p, last, "}");

    default:
        return ngx_slprintf(p, last, "None");
    }
}


/*
 * Text inside a Python string literal: backslashes and quotes escaped, a
 * control character as \xNN (in a docstring a newline stays one); UTF-8
 * passes as it is.  At most 4 bytes a byte.
 */

static u_char *
ngx_http_hermes_schema_pystr(u_char *p, u_char *last, u_char *s, size_t len,
    ngx_uint_t literal)
{
    u_char  c;
    size_t  i;

    for (i = 0; i < len && last - p > 4; i++) {
        c = s[i];

        if (c == '\\' || c == '"' || c == '\'') {
            *p++ = '\\';
            *p++ = c;

        } else if (c == '\n' && !literal) {
            *p++ = c;

        } else if (c < 0x20 || c == 0x7f) {
            p = ngx_sprintf(p, "\\x%02xd", (ngx_uint_t) c);

        } else {
            *p++ = c;
        }
    }

    return p;
}


/*
 * The tools as Python: a def a tool with the signature of its stub in the
 * cell (its schema's, or NAME(args, /, **kwargs) without one); a tool
 * reached by call() only has none.  "list": the schemas, NUL-terminated.
 */

static u_char *
ngx_http_hermes_schema_defs(u_char *p, u_char *last, ngx_str_t *names,
    ngx_uint_t n, u_char *list)
{
    size_t       len, olen, k;
    yajl_val     root, tool, v, params;
    ngx_uint_t   i, j, shared;
    u_char       ident[NGX_HTTP_HERMES_TOOL_IDENT];
    u_char       other[NGX_HTTP_HERMES_TOOL_IDENT];

    static const char  *pname[] = { "name", NULL };
    static const char  *pdesc[] = { "description", NULL };
    static const char  *pparams[] = { "parameters", NULL };
    static const char  *pprops[] = { "properties", NULL };

    if (n == 0) {
        return p;
    }

    root = list ? yajl_tree_parse((const char *) list, NULL, 0) : NULL;

    p = ngx_slprintf(p, last, "  Their signatures, as Python (functions of "
                     "hermes_tools; a required parameter may be passed by "
                     "position, the others by keyword):\n");

    for (i = 0; i < n; i++) {
        if (!ngx_http_hermes_tool_name_valid(names[i].data, names[i].len)) {
            continue;
        }

        len = ngx_http_hermes_tool_ident(ident, &names[i]);
        shared = 0;

        for (j = 0; j < n; j++) {
            olen = ngx_http_hermes_tool_ident(other, &names[j]);

            if (j != i && olen == len && ngx_strncmp(other, ident, len) == 0
                && !(names[j].len == names[i].len
                     && ngx_strncmp(names[j].data, names[i].data,
                                    names[i].len) == 0))
            {
                shared = 1;
            }
        }

        if (shared) {
            continue;
        }

        tool = NULL;

        for (k = 0; root && YAJL_IS_ARRAY(root) && k < root->u.array.len; k++)
        {
            v = yajl_tree_get(root->u.array.values[k], pname, yajl_t_string);

            if (v && ngx_strlen(v->u.string) == names[i].len
                && ngx_strncmp(v->u.string, names[i].data, names[i].len) == 0)
            {
                tool = root->u.array.values[k];
                break;
            }
        }

        /* a schema that names no parameters: any, as the stub takes */

        params = tool ? yajl_tree_get(tool, pparams, yajl_t_object) : NULL;

        if (params && yajl_tree_get(params, pprops, yajl_t_object)) {
            p = ngx_http_hermes_schema_python(p, last, ident, len, tool);
            continue;
        }

        p = ngx_slprintf(p, last, "\ndef %*s(args: dict = None, /, "
                         "**kwargs):\n    \"\"\"", len, ident);

        v = tool ? yajl_tree_get(tool, pdesc, yajl_t_string) : NULL;

        if (v && v->u.string[0]) {
            p = ngx_http_hermes_schema_pystr(p, last, (u_char *) v->u.string,
                                             ngx_strlen(v->u.string), 0);
        } else {
            p = ngx_slprintf(p, last, "The tool '%V'; its arguments as a "
                             "dict or as keywords.", &names[i]);
        }

        p = ngx_slprintf(p, last, "\"\"\"\n");
    }

    if (root) {
        yajl_tree_free(root);
    }

    return p;
}
