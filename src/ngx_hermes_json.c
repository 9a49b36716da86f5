
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: JSON in and out, with yajl.
 *
 * Inputs (request bodies, the runner's result files) are read with yajl's
 * callback parser into a small table of wanted fields: strings keep their
 * length, so an embedded "\u0000" survives, and nothing else is kept.
 * A field is found by comparing each key of its path whole, so neither
 * "a\u0000x" nor a literal "a.b" key stands for "a" or for "a" then "b".
 *
 * yajl 2 takes overlong and surrogate UTF-8, code points over U+10FFFF
 * and lone surrogate escapes ("\ud800" comes out as "?", "\ud800\u0041"
 * as some other character), and the last of duplicate keys wins.  A
 * request body is checked for all of these first, so the gateway and the
 * kernel can never read one body two ways.
 */


#include "ngx_hermes.h"
#include "ngx_hermes_json_gen.h"

#include <yajl/yajl_parse.h>
#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>


#define NGX_HTTP_HERMES_JSON_STRING  1
#define NGX_HTTP_HERMES_JSON_NUMBER  2
#define NGX_HTTP_HERMES_JSON_BOOL    3
#define NGX_HTTP_HERMES_JSON_NULL    4
#define NGX_HTTP_HERMES_JSON_MAP     5
#define NGX_HTTP_HERMES_JSON_ARRAY   6

#define NGX_HTTP_HERMES_JSON_DEPTH   3      /* paths kept: "a" to "a.b.c" */


typedef struct {
    const char                   *path;
    ngx_uint_t                    type;
    ngx_str_t                     value;    /* strings and raw numbers */
    ngx_uint_t                    boolean;
} ngx_http_hermes_json_field_t;


/* a key as read, and the object it is in: duplicates sort next to each other */

typedef struct {
    ngx_uint_t                    object;
    ngx_str_t                     name;
} ngx_http_hermes_json_key_t;


typedef struct {
    ngx_pool_t                   *pool;
    ngx_http_hermes_json_field_t *fields;
    u_char                       *start;    /* the text parsed */
    u_char                       *end;
    ngx_uint_t                    depth;    /* containers open */
    ngx_uint_t                    ignore;   /* depth inside an ignored one */
    ngx_uint_t                    array[NGX_HTTP_HERMES_JSON_DEPTH + 1];
    ngx_str_t                     key[NGX_HTTP_HERMES_JSON_DEPTH + 1];

    /* strict: every key of every object, and the objects open */
    ngx_array_t                  *keys;     /* ngx_http_hermes_json_key_t */
    ngx_array_t                  *open;     /* ngx_uint_t, 0: an array */
    ngx_uint_t                    objects;

    unsigned                      root_map:1;
    unsigned                      nomem:1;
} ngx_http_hermes_json_ctx_t;


ngx_str_t  ngx_http_hermes_cell_status_names[] = {
    ngx_string("success"),
    ngx_string("error"),
    ngx_string("timeout"),
    ngx_string("interrupted"),
    ngx_null_string
};


/* does the dotted path name the keys open now, each compared whole? */

static ngx_uint_t
ngx_http_hermes_json_path_is(ngx_http_hermes_json_ctx_t *ctx,
    const char *path)
{
    size_t       len;
    const char  *p, *dot;
    ngx_uint_t   i;

    p = path;

    for (i = 1; i <= ctx->depth; i++) {
        dot = ngx_strchr(p, '.');
        len = dot ? (size_t) (dot - p) : ngx_strlen(p);

        if (ctx->key[i].len != len
            || ngx_memcmp(ctx->key[i].data, p, len) != 0)
        {
            return 0;
        }

        if ((dot == NULL) != (i == ctx->depth)) {
            return 0;
        }

        p = dot + 1;
    }

    return 1;
}


static ngx_http_hermes_json_field_t *
ngx_http_hermes_json_field(ngx_http_hermes_json_ctx_t *ctx)
{
    ngx_http_hermes_json_field_t  *f;

    if (ctx->ignore || ctx->depth == 0
        || ctx->depth > NGX_HTTP_HERMES_JSON_DEPTH
        || ctx->array[ctx->depth])
    {
        return NULL;
    }

    for (f = ctx->fields; f->path; f++) {
        if (ngx_http_hermes_json_path_is(ctx, f->path)) {
            return f;
        }
    }

    return NULL;
}


static int
ngx_http_hermes_json_set(ngx_http_hermes_json_ctx_t *ctx, ngx_uint_t type,
    const u_char *data, size_t len, ngx_uint_t boolean)
{
    ngx_http_hermes_json_field_t  *f;

    f = ngx_http_hermes_json_field(ctx);
    if (f == NULL) {
        return 1;
    }

    f->type = type;
    f->boolean = boolean;
    f->value.len = len;
    f->value.data = NULL;

    if (data) {
        f->value.data = ngx_pnalloc(ctx->pool, len + 1);
        if (f->value.data == NULL) {
            ctx->nomem = 1;
            return 0;
        }

        ngx_memcpy(f->value.data, data, len);
        f->value.data[len] = '\0';
    }

    return 1;
}


static int
ngx_http_hermes_json_null(void *data)
{
    return ngx_http_hermes_json_set(data, NGX_HTTP_HERMES_JSON_NULL,
                                    NULL, 0, 0);
}


static int
ngx_http_hermes_json_boolean(void *data, int value)
{
    return ngx_http_hermes_json_set(data, NGX_HTTP_HERMES_JSON_BOOL,
                                    NULL, 0, value ? 1 : 0);
}


static int
ngx_http_hermes_json_number(void *data, const char *value, size_t len)
{
    return ngx_http_hermes_json_set(data, NGX_HTTP_HERMES_JSON_NUMBER,
                                    (const u_char *) value, len, 0);
}


static int
ngx_http_hermes_json_string(void *data, const unsigned char *value,
    size_t len)
{
    return ngx_http_hermes_json_set(data, NGX_HTTP_HERMES_JSON_STRING,
                                    value, len, 0);
}


static int
ngx_http_hermes_json_open(ngx_http_hermes_json_ctx_t *ctx, ngx_uint_t type)
{
    ngx_uint_t  *object;

    if (ctx->depth == 0 && !ctx->root_map) {
        if (type != NGX_HTTP_HERMES_JSON_MAP) {
            return 0;
        }

        ctx->root_map = 1;
    }

    if (ctx->open) {
        object = ngx_array_push(ctx->open);
        if (object == NULL) {
            ctx->nomem = 1;
            return 0;
        }

        *object = (type == NGX_HTTP_HERMES_JSON_MAP) ? ++ctx->objects : 0;
    }

    /* a container at a wanted path records its type, then is skipped */

    if (!ngx_http_hermes_json_set(ctx, type, NULL, 0, 0)) {
        return 0;
    }

    if (ctx->ignore || ctx->depth >= NGX_HTTP_HERMES_JSON_DEPTH) {
        ctx->ignore++;
        return 1;
    }

    ctx->depth++;
    ctx->array[ctx->depth] = (type == NGX_HTTP_HERMES_JSON_ARRAY);
    ngx_str_null(&ctx->key[ctx->depth]);

    return 1;
}


static int
ngx_http_hermes_json_close(void *data)
{
    ngx_http_hermes_json_ctx_t  *ctx = data;

    if (ctx->open) {
        ctx->open->nelts--;
    }

    if (ctx->ignore) {
        ctx->ignore--;

    } else {
        ctx->depth--;
    }

    return 1;
}


static int
ngx_http_hermes_json_start_map(void *data)
{
    return ngx_http_hermes_json_open(data, NGX_HTTP_HERMES_JSON_MAP);
}


static int
ngx_http_hermes_json_start_array(void *data)
{
    return ngx_http_hermes_json_open(data, NGX_HTTP_HERMES_JSON_ARRAY);
}


static int
ngx_http_hermes_json_map_key(void *data, const unsigned char *key,
    size_t len)
{
    u_char                      *name;
    ngx_uint_t                  *object;
    ngx_http_hermes_json_key_t  *k;
    ngx_http_hermes_json_ctx_t  *ctx = data;

    if (ctx->ignore && ctx->keys == NULL) {
        return 1;
    }

    /* an escaped key is decoded into a buffer yajl reuses: keep a copy */

    name = (u_char *) key;

    if (name < ctx->start || name + len > ctx->end) {
        name = ngx_pnalloc(ctx->pool, len);
        if (name == NULL) {
            ctx->nomem = 1;
            return 0;
        }

        ngx_memcpy(name, key, len);
    }

    if (ctx->keys) {
        k = ngx_array_push(ctx->keys);
        if (k == NULL) {
            ctx->nomem = 1;
            return 0;
        }

        object = ctx->open->elts;

        k->object = object[ctx->open->nelts - 1];
        k->name.data = name;
        k->name.len = len;
    }

    if (!ctx->ignore) {
        ctx->key[ctx->depth].data = name;
        ctx->key[ctx->depth].len = len;
    }

    return 1;
}


static yajl_callbacks  ngx_http_hermes_json_callbacks = {
    ngx_http_hermes_json_null,
    ngx_http_hermes_json_boolean,
    NULL,
    NULL,
    ngx_http_hermes_json_number,
    ngx_http_hermes_json_string,
    ngx_http_hermes_json_start_map,
    ngx_http_hermes_json_map_key,
    ngx_http_hermes_json_close,
    ngx_http_hermes_json_start_array,
    ngx_http_hermes_json_close
};


/* the length of the valid UTF-8 sequence at p (RFC 3629), or 0 */

static size_t
ngx_http_hermes_json_utf8(u_char *p, u_char *last)
{
    size_t  n, i;
    u_char  c, lo, hi;

    c = *p;
    lo = 0x80;
    hi = 0xbf;

    if (c < 0x80) {
        return 1;
    }

    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;

    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        lo = (c == 0xe0) ? 0xa0 : 0x80;         /* no overlongs */
        hi = (c == 0xed) ? 0x9f : 0xbf;         /* no surrogates */

    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        lo = (c == 0xf0) ? 0x90 : 0x80;         /* no overlongs */
        hi = (c == 0xf4) ? 0x8f : 0xbf;         /* nothing over U+10FFFF */

    } else {
        return 0;
    }

    if ((size_t) (last - p) < n || p[1] < lo || p[1] > hi) {
        return 0;
    }

    for (i = 2; i < n; i++) {
        if (p[i] < 0x80 || p[i] > 0xbf) {
            return 0;
        }
    }

    return n;
}


static ngx_int_t
ngx_http_hermes_json_hex4(u_char *p, u_char *last)
{
    u_char      c;
    ngx_int_t   n;
    ngx_uint_t  i;

    if (last - p < 4) {
        return NGX_ERROR;
    }

    n = 0;

    for (i = 0; i < 4; i++) {
        c = p[i];

        if (c >= '0' && c <= '9') {
            n = n * 16 + c - '0';
            continue;
        }

        c |= 0x20;

        if (c >= 'a' && c <= 'f') {
            n = n * 16 + c - 'a' + 10;
            continue;
        }

        return NGX_ERROR;
    }

    return n;
}


/*
 * The whole text is UTF-8 and every surrogate escape is half of a pair.
 * What else is wrong with it is yajl's to find.
 */

static ngx_uint_t
ngx_http_hermes_json_text_valid(u_char *p, size_t len)
{
    size_t      n;
    u_char     *last;
    ngx_int_t   u;
    ngx_uint_t  in_string;

    last = p + len;
    in_string = 0;

    while (p < last) {

        if (*p >= 0x80) {
            n = ngx_http_hermes_json_utf8(p, last);
            if (n == 0) {
                return 0;
            }

            p += n;
            continue;
        }

        if (!in_string) {
            in_string = (*p == '"');
            p++;
            continue;
        }

        if (*p == '"') {
            in_string = 0;
            p++;
            continue;
        }

        if (*p != '\\' || last - p < 2 || p[1] >= 0x80) {
            p++;
            continue;
        }

        if (p[1] != 'u') {
            p += 2;
            continue;
        }

        p += 2;

        u = ngx_http_hermes_json_hex4(p, last);
        if (u == NGX_ERROR) {
            continue;
        }

        p += 4;

        if (u >= 0xdc00 && u <= 0xdfff) {
            return 0;
        }

        if (u >= 0xd800 && u <= 0xdbff) {
            if (last - p < 2 || p[0] != '\\' || p[1] != 'u') {
                return 0;
            }

            u = ngx_http_hermes_json_hex4(p + 2, last);

            if (u < 0xdc00 || u > 0xdfff) {
                return 0;
            }

            p += 6;
        }
    }

    return 1;
}


static int ngx_libc_cdecl
ngx_http_hermes_json_key_cmp(const void *one, const void *two)
{
    const ngx_http_hermes_json_key_t  *a = one, *b = two;

    if (a->object != b->object) {
        return (a->object < b->object) ? -1 : 1;
    }

    if (a->name.len != b->name.len) {
        return (a->name.len < b->name.len) ? -1 : 1;
    }

    return ngx_memcmp(a->name.data, b->name.data, a->name.len);
}


static ngx_uint_t
ngx_http_hermes_json_keys_unique(ngx_array_t *keys)
{
    ngx_uint_t                   i;
    ngx_http_hermes_json_key_t  *k;

    k = keys->elts;

    ngx_qsort(k, keys->nelts, sizeof(ngx_http_hermes_json_key_t),
              ngx_http_hermes_json_key_cmp);

    for (i = 1; i < keys->nelts; i++) {
        if (ngx_http_hermes_json_key_cmp(&k[i - 1], &k[i]) == 0) {
            return 0;
        }
    }

    return 1;
}


/*
 * NGX_OK, NGX_DECLINED: not JSON or not an object (*reason says why),
 * NGX_ERROR: no memory.  Strict, for what clients send: the text is
 * valid UTF-8 with no lone surrogate escape, no object repeats a key.
 */

static ngx_int_t
ngx_http_hermes_json_parse(ngx_pool_t *pool, u_char *data, size_t len,
    ngx_http_hermes_json_field_t *fields, ngx_uint_t strict,
    const char **reason)
{
    yajl_handle                  h;
    yajl_status                  st;
    ngx_http_hermes_json_ctx_t   ctx;

    *reason = "not a JSON object";

    if (strict && !ngx_http_hermes_json_text_valid(data, len)) {
        *reason = "not valid UTF-8, or has a lone surrogate escape";
        return NGX_DECLINED;
    }

    ngx_memzero(&ctx, sizeof(ngx_http_hermes_json_ctx_t));
    ctx.pool = pool;
    ctx.fields = fields;
    ctx.start = data;
    ctx.end = data + len;

    if (strict) {
        ctx.keys = ngx_array_create(pool, 16,
                                    sizeof(ngx_http_hermes_json_key_t));
        ctx.open = ngx_array_create(pool, 4, sizeof(ngx_uint_t));

        if (ctx.keys == NULL || ctx.open == NULL) {
            return NGX_ERROR;
        }
    }

    h = yajl_alloc(&ngx_http_hermes_json_callbacks, NULL, &ctx);
    if (h == NULL) {
        return NGX_ERROR;
    }

    st = yajl_parse(h, data, len);
    if (st == yajl_status_ok) {
        st = yajl_complete_parse(h);
    }

    yajl_free(h);

    if (ctx.nomem) {
        return NGX_ERROR;
    }

    if (st != yajl_status_ok || !ctx.root_map) {
        return NGX_DECLINED;
    }

    if (strict && !ngx_http_hermes_json_keys_unique(ctx.keys)) {
        *reason = "JSON with a key twice in one object";
        return NGX_DECLINED;
    }

    return NGX_OK;
}


static ngx_http_hermes_json_field_t *
ngx_http_hermes_json_get(ngx_http_hermes_json_field_t *fields,
    const char *path)
{
    ngx_http_hermes_json_field_t  *f;

    for (f = fields; f->path; f++) {
        if (f->type && ngx_strcmp(f->path, path) == 0) {
            return f;
        }
    }

    return NULL;
}


/* the field "prefix" + f->path of fields, copied into f */

static ngx_int_t
ngx_http_hermes_json_prefixed(ngx_http_hermes_json_field_t *fields,
    const char *prefix, ngx_http_hermes_json_field_t *f)
{
    char                           path[64];
    ngx_http_hermes_json_field_t  *from;

    if (ngx_strlen(prefix) + ngx_strlen(f->path) >= sizeof(path)) {
        return NGX_ERROR;
    }

    *ngx_sprintf((u_char *) path, "%s%s", prefix, f->path) = '\0';

    from = ngx_http_hermes_json_get(fields, path);

    if (from) {
        f->type = from->type;
        f->value = from->value;
        f->boolean = from->boolean;
    }

    return NGX_OK;
}


/*
 * 1-128 of [A-Za-z0-9._:-], and not "." or "..": a URL of the kernels
 * location (DELETE, interrupt, files, resume) must be able to name it,
 * and nginx normalises those two away.
 */

ngx_int_t
ngx_http_hermes_json_session_valid(ngx_str_t *s)
{
    u_char      c;
    ngx_uint_t  i;

    if (s->len == 0 || s->len > NGX_HTTP_HERMES_SESSION_MAX) {
        return 0;
    }

    if ((s->len == 1 && s->data[0] == '.')
        || (s->len == 2 && s->data[0] == '.' && s->data[1] == '.'))
    {
        return 0;
    }

    for (i = 0; i < s->len; i++) {
        c = s->data[i];

        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
            || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == ':'
            || c == '-')
        {
            continue;
        }

        return 0;
    }

    return 1;
}


#define ngx_http_hermes_json_fail(st, c, m)                                   \
    *http_status = st;                                                        \
    ngx_str_set(err_code, c);                                                 \
    ngx_str_set(err_msg, m);                                                  \
    return NGX_DECLINED


#define ngx_http_hermes_json_fail_reason(what)                                \
    *http_status = NGX_HTTP_BAD_REQUEST;                                      \
    ngx_str_set(err_code, "invalid_json");                                    \
    err_msg->len = sizeof(what) - 1 + ngx_strlen(reason);                     \
    err_msg->data = ngx_pnalloc(pool, err_msg->len + 1);                      \
    if (err_msg->data == NULL) {                                              \
        return NGX_ERROR;                                                     \
    }                                                                         \
    ngx_sprintf(err_msg->data, "%s%s%Z", what, reason);                       \
    return NGX_DECLINED


/*
 * A cell request's body, in any of its envelopes.  NGX_DECLINED: not one
 * that runs, *http_status, *err_code and *err_msg say why; NGX_ERROR: no
 * memory.
 */

ngx_int_t
ngx_http_hermes_json_parse_request(ngx_pool_t *pool, u_char *body,
    size_t len, ngx_http_hermes_request_t *req, size_t max_code,
    ngx_str_t *err_code, ngx_str_t *err_msg, ngx_uint_t *http_status)
{
    double                         timeout;
    ngx_int_t                      rc;
    const char                    *reason, *prefix;
    ngx_http_hermes_json_field_t  *f, *args;

    /*
     * A plain request, an OpenAI tool call (its arguments a JSON string
     * or an object) or an Anthropic tool_use block: the fields of the
     * three are read in one pass; each envelope's arguments are then
     * looked up under its own prefix.
     */

    ngx_http_hermes_json_field_t   call[] = {
        { "session", 0, ngx_null_string, 0 },
        { "code", 0, ngx_null_string, 0 },
        { "timeout", 0, ngx_null_string, 0 },
        { "reset", 0, ngx_null_string, 0 },
        { "ephemeral", 0, ngx_null_string, 0 },
        { "environment", 0, ngx_null_string, 0 },
        { "id", 0, ngx_null_string, 0 },
        { "type", 0, ngx_null_string, 0 },
        { "name", 0, ngx_null_string, 0 },
        { "input", 0, ngx_null_string, 0 },
        { "input.session", 0, ngx_null_string, 0 },
        { "input.code", 0, ngx_null_string, 0 },
        { "input.timeout", 0, ngx_null_string, 0 },
        { "input.reset", 0, ngx_null_string, 0 },
        { "input.ephemeral", 0, ngx_null_string, 0 },
        { "input.environment", 0, ngx_null_string, 0 },
        { "function", 0, ngx_null_string, 0 },
        { "function.name", 0, ngx_null_string, 0 },
        { "function.arguments", 0, ngx_null_string, 0 },
        { "function.arguments.session", 0, ngx_null_string, 0 },
        { "function.arguments.code", 0, ngx_null_string, 0 },
        { "function.arguments.timeout", 0, ngx_null_string, 0 },
        { "function.arguments.reset", 0, ngx_null_string, 0 },
        { "function.arguments.ephemeral", 0, ngx_null_string, 0 },
        { "function.arguments.environment", 0, ngx_null_string, 0 },
        { NULL, 0, ngx_null_string, 0 }
    };

    ngx_http_hermes_json_field_t   unwrapped[] = {
        { "session", 0, ngx_null_string, 0 },
        { "code", 0, ngx_null_string, 0 },
        { "timeout", 0, ngx_null_string, 0 },
        { "reset", 0, ngx_null_string, 0 },
        { "ephemeral", 0, ngx_null_string, 0 },
        { "environment", 0, ngx_null_string, 0 },
        { NULL, 0, ngx_null_string, 0 }
    };

    ngx_memzero(req, sizeof(ngx_http_hermes_request_t));

    rc = ngx_http_hermes_json_parse(pool, body, len, call, 1, &reason);
    if (rc == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (rc == NGX_DECLINED) {
        ngx_http_hermes_json_fail_reason("the request body is ");
    }

    args = call;
    prefix = "";

    f = ngx_http_hermes_json_get(call, "type");

    if (f && f->type == NGX_HTTP_HERMES_JSON_STRING
        && f->value.len == sizeof("tool_use") - 1
        && ngx_strncmp(f->value.data, "tool_use", f->value.len) == 0)
    {
        /* an Anthropic tool_use block: the arguments are "input" */

        req->envelope = NGX_HTTP_HERMES_ENVELOPE_ANTHROPIC;

        f = ngx_http_hermes_json_get(call, "id");
        if (f && f->type == NGX_HTTP_HERMES_JSON_STRING) {
            req->tool_call_id = f->value;
        }

        f = ngx_http_hermes_json_get(call, "name");
        if (f == NULL || f->type != NGX_HTTP_HERMES_JSON_STRING
            || f->value.len != sizeof("execute_code") - 1
            || ngx_strncmp(f->value.data, "execute_code", f->value.len) != 0)
        {
            ngx_http_hermes_json_fail(NGX_HTTP_BAD_REQUEST, "invalid_request",
                                      "\"name\" must be \"execute_code\"");
        }

        f = ngx_http_hermes_json_get(call, "input");
        if (f == NULL || f->type != NGX_HTTP_HERMES_JSON_MAP) {
            ngx_http_hermes_json_fail(NGX_HTTP_BAD_REQUEST, "invalid_request",
                                      "\"input\" must be an object");
        }

        prefix = "input.";

    } else if (ngx_http_hermes_json_get(call, "function")) {
        /* an OpenAI tool call: the arguments, a JSON string or an object */

        req->envelope = NGX_HTTP_HERMES_ENVELOPE_OPENAI;

        f = ngx_http_hermes_json_get(call, "id");
        if (f && f->type == NGX_HTTP_HERMES_JSON_STRING) {
            req->tool_call_id = f->value;
        }

        f = ngx_http_hermes_json_get(call, "function");
        if (f->type != NGX_HTTP_HERMES_JSON_MAP) {
            ngx_http_hermes_json_fail(NGX_HTTP_BAD_REQUEST, "invalid_request",
                                      "\"function\" must be an object");
        }

        f = ngx_http_hermes_json_get(call, "function.name");
        if (f && (f->type != NGX_HTTP_HERMES_JSON_STRING
                  || f->value.len != sizeof("execute_code") - 1
                  || ngx_strncmp(f->value.data, "execute_code",
                                 f->value.len) != 0))
        {
            ngx_http_hermes_json_fail(NGX_HTTP_BAD_REQUEST, "invalid_request",
                                  "\"function.name\" must be \"execute_code\"");
        }

        f = ngx_http_hermes_json_get(call, "function.arguments");

        if (f && f->type == NGX_HTTP_HERMES_JSON_MAP) {
            prefix = "function.arguments.";

        } else if (f == NULL || f->type != NGX_HTTP_HERMES_JSON_STRING) {
            ngx_http_hermes_json_fail(NGX_HTTP_BAD_REQUEST, "invalid_request",
                  "\"function.arguments\" must be a JSON string or an object");

        } else {
            rc = ngx_http_hermes_json_parse(pool, f->value.data, f->value.len,
                                            unwrapped, 1, &reason);
            if (rc == NGX_ERROR) {
                return NGX_ERROR;
            }

            if (rc == NGX_DECLINED) {
                ngx_http_hermes_json_fail_reason(
                                             "\"function.arguments\" is ");
            }

            args = unwrapped;
        }
    }

    if (prefix[0]) {
        /* the envelope's argument fields, under their plain names */

        for (f = unwrapped; f->path; f++) {
            if (ngx_http_hermes_json_prefixed(call, prefix, f) != NGX_OK) {
                return NGX_ERROR;
            }
        }

        args = unwrapped;
    }

    f = ngx_http_hermes_json_get(args, "session");
    if (f == NULL) {
        /* hermes_session may name it; else it is required (the caller) */
        goto code;
    }
    f = ngx_http_hermes_json_get(args, "session");
    if (f == NULL) {
        ngx_http_hermes_json_fail(NGX_HTTP_BAD_REQUEST, "invalid_request",
                                  "\"session\" is required");
    }

    if (f->type != NGX_HTTP_HERMES_JSON_STRING
        || !ngx_http_hermes_json_session_valid(&f->value))
    {
        ngx_http_hermes_json_fail(NGX_HTTP_BAD_REQUEST, "invalid_session",
                    "\"session\" must be 1-128 characters of [A-Za-z0-9._:-]");
    }

    req->session = f->value;

code:

    f = ngx_http_hermes_json_get(args, "code");
    if (f == NULL) {
        ngx_http_hermes_json_fail(NGX_HTTP_BAD_REQUEST, "invalid_request",
                                  "\"code\" is required");
    }

    if (f->type != NGX_HTTP_HERMES_JSON_STRING) {
        ngx_http_hermes_json_fail(NGX_HTTP_BAD_REQUEST, "invalid_request",
                                  "\"code\" must be a string");
    }

    if (f->value.len > max_code) {
        ngx_http_hermes_json_fail(NGX_HTTP_REQUEST_ENTITY_TOO_LARGE,
                                  "code_too_large",
                                  "\"code\" is longer than hermes_max_code");
    }

    req->code = f->value;

    f = ngx_http_hermes_json_get(args, "timeout");
    if (f && f->type != NGX_HTTP_HERMES_JSON_NULL) {
        if (f->type != NGX_HTTP_HERMES_JSON_NUMBER) {
            ngx_http_hermes_json_fail(NGX_HTTP_BAD_REQUEST, "invalid_request",
                                      "\"timeout\" must be a number");
        }

        timeout = strtod((char *) f->value.data, NULL);

        if (!(timeout >= 1 && timeout <= 365 * 86400)) {
            ngx_http_hermes_json_fail(NGX_HTTP_BAD_REQUEST, "invalid_request",
                                      "\"timeout\" must be at least 1 second");
        }

        req->timeout = (ngx_msec_t) (timeout * 1000);
    }

    f = ngx_http_hermes_json_get(args, "reset");
    if (f && f->type != NGX_HTTP_HERMES_JSON_NULL) {
        if (f->type != NGX_HTTP_HERMES_JSON_BOOL) {
            ngx_http_hermes_json_fail(NGX_HTTP_BAD_REQUEST, "invalid_request",
                                      "\"reset\" must be true or false");
        }

        req->reset = f->boolean;
    }

    f = ngx_http_hermes_json_get(args, "ephemeral");
    if (f && f->type != NGX_HTTP_HERMES_JSON_NULL) {
        if (f->type != NGX_HTTP_HERMES_JSON_BOOL) {
            ngx_http_hermes_json_fail(NGX_HTTP_BAD_REQUEST, "invalid_request",
                                      "\"ephemeral\" must be true or false");
        }

        req->ephemeral = f->boolean;
    }

    /* which the location allows is the handler's to say */

    f = ngx_http_hermes_json_get(args, "environment");
    if (f && f->type != NGX_HTTP_HERMES_JSON_NULL) {
        if (f->type != NGX_HTTP_HERMES_JSON_STRING || f->value.len == 0
            || f->value.len > NGX_HTTP_HERMES_ENV_NAME_MAX)
        {
            ngx_http_hermes_json_fail(NGX_HTTP_BAD_REQUEST,
                                      "invalid_environment",
                                      "\"environment\" must be the name of "
                                      "one this location allows");
        }

        req->environment = f->value;
    }

    return NGX_OK;
}


/*
 * The result's "displays" (a list of MIME bundles, see the runner) is
 * passed on as JSON: a second pass over the result re-generates it with
 * yajl, so what reaches the client is JSON yajl parsed and wrote, an
 * array of objects nested at most NGX_HTTP_HERMES_JSON_RAW_DEPTH deep.
 * It is bounded by the result's own bound (res_limit).
 */

#define NGX_HTTP_HERMES_JSON_RAW_DEPTH  32


typedef struct {
    yajl_gen                      gen;
    ngx_uint_t                    depth;    /* containers open */
    ngx_uint_t                    in;       /* the array's depth, 0: outside */
    unsigned                      next:1;   /* the next value is the array */
    unsigned                      done:1;
    unsigned                      bad:1;
} ngx_http_hermes_json_raw_t;


/* a value: is it in the array, and may it be there? */

static ngx_uint_t
ngx_http_hermes_json_raw_value(ngx_http_hermes_json_raw_t *raw,
    ngx_uint_t open, ngx_uint_t map)
{
    if (raw->in == 0) {
        if (!raw->next || !open || map) {
            raw->next = 0;
            return 0;
        }

        /* "displays": [ */

        raw->next = 0;

        if (raw->done) {
            raw->bad = 1;                   /* twice */
            return 0;
        }

        raw->in = raw->depth + 1;
        return 1;
    }

    /* each element of the array is an object (a bundle) */

    if (raw->depth == raw->in && !map) {
        raw->bad = 1;
        return 0;
    }

    if (open && raw->depth - raw->in >= NGX_HTTP_HERMES_JSON_RAW_DEPTH) {
        raw->bad = 1;
        return 0;
    }

    return 1;
}


static int
ngx_http_hermes_json_raw_null(void *data)
{
    ngx_http_hermes_json_raw_t *raw = data;

    if (ngx_http_hermes_json_raw_value(raw, 0, 0)) {
        yajl_gen_null(raw->gen);
    }

    return !raw->bad;
}


static int
ngx_http_hermes_json_raw_boolean(void *data, int value)
{
    ngx_http_hermes_json_raw_t *raw = data;

    if (ngx_http_hermes_json_raw_value(raw, 0, 0)) {
        yajl_gen_bool(raw->gen, value);
    }

    return !raw->bad;
}


static int
ngx_http_hermes_json_raw_number(void *data, const char *value, size_t len)
{
    ngx_http_hermes_json_raw_t *raw = data;

    if (ngx_http_hermes_json_raw_value(raw, 0, 0)) {
        yajl_gen_number(raw->gen, value, len);
    }

    return !raw->bad;
}


static int
ngx_http_hermes_json_raw_string(void *data, const unsigned char *value,
    size_t len)
{
    ngx_http_hermes_json_raw_t *raw = data;

    if (ngx_http_hermes_json_raw_value(raw, 0, 0)) {
        yajl_gen_string(raw->gen, value, len);
    }

    return !raw->bad;
}


static int
ngx_http_hermes_json_raw_start_map(void *data)
{
    ngx_http_hermes_json_raw_t *raw = data;

    if (ngx_http_hermes_json_raw_value(raw, 1, 1)) {
        yajl_gen_map_open(raw->gen);
    }

    raw->depth++;

    return !raw->bad;
}


static int
ngx_http_hermes_json_raw_start_array(void *data)
{
    ngx_http_hermes_json_raw_t *raw = data;

    if (ngx_http_hermes_json_raw_value(raw, 1, 0)) {
        yajl_gen_array_open(raw->gen);
    }

    raw->depth++;

    return !raw->bad;
}


static int
ngx_http_hermes_json_raw_map_key(void *data, const unsigned char *key,
    size_t len)
{
    ngx_http_hermes_json_raw_t *raw = data;

    if (raw->in) {
        yajl_gen_string(raw->gen, key, len);

    } else if (raw->depth == 1) {
        raw->next = (len == sizeof("displays") - 1
                     && ngx_strncmp(key, "displays", len) == 0);
    }

    return 1;
}


static int
ngx_http_hermes_json_raw_end_map(void *data)
{
    ngx_http_hermes_json_raw_t *raw = data;

    raw->depth--;

    if (raw->in) {
        yajl_gen_map_close(raw->gen);
    }

    return 1;
}


static int
ngx_http_hermes_json_raw_end_array(void *data)
{
    ngx_http_hermes_json_raw_t *raw = data;

    raw->depth--;

    if (raw->in) {
        yajl_gen_array_close(raw->gen);

        if (raw->depth + 1 == raw->in) {
            raw->in = 0;
            raw->done = 1;
        }
    }

    return 1;
}


static yajl_callbacks  ngx_http_hermes_json_raw_callbacks = {
    ngx_http_hermes_json_raw_null,
    ngx_http_hermes_json_raw_boolean,
    NULL,
    NULL,
    ngx_http_hermes_json_raw_number,
    ngx_http_hermes_json_raw_string,
    ngx_http_hermes_json_raw_start_map,
    ngx_http_hermes_json_raw_map_key,
    ngx_http_hermes_json_raw_end_map,
    ngx_http_hermes_json_raw_start_array,
    ngx_http_hermes_json_raw_end_array
};


/* NGX_OK: *out is the array (empty if it is not one), NGX_ERROR: no memory */

static ngx_int_t
ngx_http_hermes_json_displays(ngx_pool_t *pool, u_char *data, size_t len,
    ngx_str_t *out)
{
    size_t                       n;
    yajl_handle                  h;
    yajl_status                  st;
    const unsigned char         *p;
    ngx_http_hermes_json_raw_t   raw;

    ngx_memzero(&raw, sizeof(ngx_http_hermes_json_raw_t));
    ngx_str_null(out);

    raw.gen = yajl_gen_alloc(NULL);
    if (raw.gen == NULL) {
        return NGX_ERROR;
    }

    h = yajl_alloc(&ngx_http_hermes_json_raw_callbacks, NULL, &raw);
    if (h == NULL) {
        yajl_gen_free(raw.gen);
        return NGX_ERROR;
    }

    st = yajl_parse(h, data, len);
    if (st == yajl_status_ok) {
        st = yajl_complete_parse(h);
    }

    yajl_free(h);

    if (st == yajl_status_ok && !raw.bad && raw.done
        && yajl_gen_get_buf(raw.gen, &p, &n) == yajl_gen_status_ok)
    {
        out->data = ngx_pnalloc(pool, n);
        if (out->data == NULL) {
            yajl_gen_free(raw.gen);
            return NGX_ERROR;
        }

        out->len = ngx_cpymem(out->data, p, n) - out->data;
    }

    yajl_gen_free(raw.gen);

    return NGX_OK;
}


/*
 * A runner's result.  NGX_DECLINED: not one (not a JSON object, or no
 * status of ours); NGX_ERROR: no memory.
 */

ngx_int_t
ngx_http_hermes_json_parse_result(ngx_pool_t *pool, u_char *data, size_t len,
    ngx_http_hermes_result_t *res)
{
    u_char                        *dot;
    ngx_int_t                      rc, n;
    ngx_uint_t                     i;
    const char                    *reason;
    ngx_http_hermes_json_field_t  *f;

    ngx_http_hermes_json_field_t   fields[] = {
        { "status", 0, ngx_null_string, 0 },
        { "output", 0, ngx_null_string, 0 },
        { "error", 0, ngx_null_string, 0 },
        { "execution_count", 0, ngx_null_string, 0 },
        { "stdout_bytes_total", 0, ngx_null_string, 0 },
        { "stdout_truncated", 0, ngx_null_string, 0 },
        { "stream_truncated", 0, ngx_null_string, 0 },
        { "state_reset", 0, ngx_null_string, 0 },
        { "ended", 0, ngx_null_string, 0 },
        { "displays", 0, ngx_null_string, 0 },
        { "duration_seconds", 0, ngx_null_string, 0 },
        { NULL, 0, ngx_null_string, 0 }
    };

    rc = ngx_http_hermes_json_parse(pool, data, len, fields, 0, &reason);
    if (rc != NGX_OK) {
        return rc;
    }

    f = ngx_http_hermes_json_get(fields, "status");
    if (f == NULL || f->type != NGX_HTTP_HERMES_JSON_STRING) {
        return NGX_DECLINED;
    }

    for (i = 0; ngx_http_hermes_cell_status_names[i].len; i++) {
        if (f->value.len == ngx_http_hermes_cell_status_names[i].len
            && ngx_strncmp(f->value.data,
                           ngx_http_hermes_cell_status_names[i].data,
                           f->value.len) == 0)
        {
            break;
        }
    }

    if (ngx_http_hermes_cell_status_names[i].len == 0) {
        return NGX_DECLINED;
    }

    res->status = i;

    f = ngx_http_hermes_json_get(fields, "output");
    if (f && f->type == NGX_HTTP_HERMES_JSON_STRING) {
        res->output = f->value;
    }

    f = ngx_http_hermes_json_get(fields, "error");
    if (f && f->type == NGX_HTTP_HERMES_JSON_STRING) {
        res->error = f->value;
    }

    f = ngx_http_hermes_json_get(fields, "execution_count");
    if (f && f->type == NGX_HTTP_HERMES_JSON_NUMBER) {
        n = ngx_atoi(f->value.data, f->value.len);
        res->execution_count = (n == NGX_ERROR) ? 0 : (ngx_uint_t) n;
    }

    f = ngx_http_hermes_json_get(fields, "stdout_bytes_total");
    if (f && f->type == NGX_HTTP_HERMES_JSON_NUMBER) {
        n = ngx_atoi(f->value.data, f->value.len);
        res->stdout_bytes_total = (n == NGX_ERROR) ? 0 : (ngx_uint_t) n;
    }

    f = ngx_http_hermes_json_get(fields, "stdout_truncated");
    res->stdout_truncated = (f && f->boolean);

    f = ngx_http_hermes_json_get(fields, "stream_truncated");
    res->stream_truncated = (f && f->boolean);

    f = ngx_http_hermes_json_get(fields, "state_reset");
    res->state_reset = (f && f->boolean);

    f = ngx_http_hermes_json_get(fields, "ended");
    res->ended = (f && f->boolean);

    /* the runner's own (a cell's answer has the module's instead) */

    f = ngx_http_hermes_json_get(fields, "duration_seconds");
    if (f && f->type == NGX_HTTP_HERMES_JSON_NUMBER) {
        /* in ms: its digits past the third decimal go (1e-05 is 0) */
        dot = ngx_strlchr(f->value.data, f->value.data + f->value.len, '.');
        n = ngx_atofp(f->value.data,
                      dot ? ngx_min(f->value.len,
                                    (size_t) (dot - f->value.data) + 4)
                          : f->value.len,
                      3);
        res->duration = (n == NGX_ERROR) ? 0 : (ngx_msec_t) n;
    }

    f = ngx_http_hermes_json_get(fields, "displays");
    if (f && f->type == NGX_HTTP_HERMES_JSON_ARRAY) {
        return ngx_http_hermes_json_displays(pool, data, len, &res->displays);
    }

    return NGX_OK;
}


/* generation */




ngx_buf_t *
ngx_http_hermes_json_take(ngx_pool_t *pool, yajl_gen g, ngx_uint_t newline)
{
    size_t                len;
    ngx_buf_t            *b;
    const unsigned char  *p;

    if (yajl_gen_get_buf(g, &p, &len) != yajl_gen_status_ok) {
        return NULL;
    }

    b = ngx_create_temp_buf(pool, len + 1);
    if (b == NULL) {
        return NULL;
    }

    b->last = ngx_cpymem(b->last, p, len);

    if (newline) {
        *b->last++ = '\n';
    }

    return b;
}


static void
ngx_http_hermes_json_gen_result(yajl_gen g, ngx_http_hermes_result_t *res,
    ngx_http_hermes_kernel_ref_t *ref, ngx_uint_t as_event)
{
    u_char  num[32], *p;

    yajl_gen_map_open(g);

    if (as_event) {
        ngx_http_hermes_gen_key(g, "type");
        ngx_http_hermes_gen_key(g, "result");
    }

    ngx_http_hermes_gen_key(g, "status");
    ngx_http_hermes_gen_str(g, &ngx_http_hermes_cell_status_names[res->status]);

    ngx_http_hermes_gen_key(g, "output");
    ngx_http_hermes_gen_str(g, &res->output);

    ngx_http_hermes_gen_key(g, "error");
    if (res->status != NGX_HTTP_HERMES_CELL_SUCCESS && res->error.len) {
        ngx_http_hermes_gen_str(g, &res->error);

    } else {
        yajl_gen_null(g);
    }

    ngx_http_hermes_gen_key(g, "tool_calls_made");
    yajl_gen_integer(g, res->tool_calls_made);

    ngx_http_hermes_gen_key(g, "duration_seconds");
    p = ngx_sprintf(num, "%M.%03M", res->duration / 1000,
                    res->duration % 1000);
    yajl_gen_number(g, (const char *) num, p - num);

    ngx_http_hermes_gen_key(g, "queue_seconds");
    p = ngx_sprintf(num, "%M.%03M", res->queue / 1000, res->queue % 1000);
    yajl_gen_number(g, (const char *) num, p - num);

    ngx_http_hermes_gen_key(g, "execution_count");
    yajl_gen_integer(g, res->execution_count);

    ngx_http_hermes_gen_key(g, "stdout_truncated");
    yajl_gen_bool(g, res->stdout_truncated);

    ngx_http_hermes_gen_key(g, "stdout_bytes_total");
    yajl_gen_integer(g, res->stdout_bytes_total);

    ngx_http_hermes_gen_key(g, "stream_truncated");
    yajl_gen_bool(g, res->stream_truncated);

    ngx_http_hermes_gen_key(g, "displays");
    if (res->displays.len) {
        /* JSON yajl wrote (see ngx_http_hermes_json_displays), as it is */
        yajl_gen_number(g, (const char *) res->displays.data,
                        res->displays.len);

    } else {
        yajl_gen_array_open(g);
        yajl_gen_array_close(g);
    }

    ngx_http_hermes_gen_key(g, "kernel");
    yajl_gen_map_open(g);
    ngx_http_hermes_gen_key(g, "kernel_id");
    yajl_gen_string(g, ref->kernel_id, NGX_HTTP_HERMES_ID_LEN);
    ngx_http_hermes_gen_key(g, "reused");
    yajl_gen_bool(g, ref->reused);
    ngx_http_hermes_gen_key(g, "state_lost");
    yajl_gen_bool(g, ref->state_lost);

    if (ref->state_lost && ref->lost_reason) {
        ngx_http_hermes_gen_key(g, "lost_reason");
        ngx_http_hermes_gen_str(g,
                                &ngx_http_hermes_lost_names[ref->lost_reason]);
    }

    ngx_http_hermes_gen_key(g, "state_reset");
    yajl_gen_bool(g, res->state_reset);
    ngx_http_hermes_gen_key(g, "ended");
    yajl_gen_bool(g, res->ended);
    yajl_gen_map_close(g);

    yajl_gen_map_close(g);
}


ngx_buf_t *
ngx_http_hermes_json_result(ngx_pool_t *pool, ngx_http_hermes_result_t *res,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_request_t *req,
    ngx_uint_t as_event, ngx_uint_t as_tool_message)
{
    size_t                len;
    yajl_gen              g;
    ngx_buf_t            *b;
    const unsigned char  *p;

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        return NULL;
    }

    ngx_http_hermes_json_gen_result(g, res, ref, as_event);

    if (!as_tool_message) {
        b = ngx_http_hermes_json_take(pool, g, as_event);
        yajl_gen_free(g);
        return b;
    }

    /* the tool message carries the result object as a JSON string */

    yajl_gen_get_buf(g, &p, &len);

    b = ngx_http_hermes_json_tool_message(pool, req->envelope,
                                          &req->tool_call_id, (u_char *) p,
                                          len, res->status
                                               != NGX_HTTP_HERMES_CELL_SUCCESS);
    yajl_gen_free(g);

    return b;
}


/*
 * The answer an agent's envelope expects, "content" the result or the
 * error as a JSON string: an OpenAI "tool" message, or an Anthropic
 * tool_result block.
 */

ngx_buf_t *
ngx_http_hermes_json_tool_message(ngx_pool_t *pool, ngx_uint_t envelope,
    ngx_str_t *id, u_char *content, size_t len, ngx_uint_t is_error)
{
    yajl_gen    t;
    ngx_buf_t  *b;

    t = yajl_gen_alloc(NULL);
    if (t == NULL) {
        return NULL;
    }

    yajl_gen_map_open(t);

    if (envelope == NGX_HTTP_HERMES_ENVELOPE_ANTHROPIC) {
        ngx_http_hermes_gen_key(t, "type");
        ngx_http_hermes_gen_key(t, "tool_result");
        ngx_http_hermes_gen_key(t, "tool_use_id");
        ngx_http_hermes_gen_str(t, id);
        ngx_http_hermes_gen_key(t, "content");
        yajl_gen_string(t, content, len);
        ngx_http_hermes_gen_key(t, "is_error");
        yajl_gen_bool(t, is_error);

    } else {
        ngx_http_hermes_gen_key(t, "role");
        ngx_http_hermes_gen_key(t, "tool");
        ngx_http_hermes_gen_key(t, "tool_call_id");
        ngx_http_hermes_gen_str(t, id);
        ngx_http_hermes_gen_key(t, "content");
        yajl_gen_string(t, content, len);
    }

    yajl_gen_map_close(t);

    b = ngx_http_hermes_json_take(pool, t, 0);

    yajl_gen_free(t);

    return b;
}


ngx_buf_t *
ngx_http_hermes_json_error(ngx_pool_t *pool, ngx_str_t *code,
    ngx_str_t *message)
{
    yajl_gen    g;
    ngx_buf_t  *b;

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        return NULL;
    }

    yajl_gen_map_open(g);
    ngx_http_hermes_gen_key(g, "error");
    yajl_gen_map_open(g);
    ngx_http_hermes_gen_key(g, "code");
    ngx_http_hermes_gen_str(g, code);
    ngx_http_hermes_gen_key(g, "message");
    ngx_http_hermes_gen_str(g, message);
    yajl_gen_map_close(g);
    yajl_gen_map_close(g);

    b = ngx_http_hermes_json_take(pool, g, 1);

    yajl_gen_free(g);

    return b;
}


ngx_buf_t *
ngx_http_hermes_json_cell_request(ngx_pool_t *pool, uint32_t id,
    ngx_http_hermes_request_t *req, size_t max_output, size_t max_stream,
    ngx_array_t *tools, ngx_uint_t tools_any, ngx_uint_t schemas)
{
    yajl_gen     g;
    ngx_buf_t   *b;
    ngx_str_t   *name;
    ngx_uint_t   i;

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        return NULL;
    }

    yajl_gen_map_open(g);
    ngx_http_hermes_gen_key(g, "id");
    yajl_gen_integer(g, id);
    ngx_http_hermes_gen_key(g, "code");
    ngx_http_hermes_gen_str(g, &req->code);
    ngx_http_hermes_gen_key(g, "reset");
    yajl_gen_bool(g, req->reset);
    ngx_http_hermes_gen_key(g, "max_output");
    yajl_gen_integer(g, max_output);
    ngx_http_hermes_gen_key(g, "max_stream");
    yajl_gen_integer(g, max_stream);

    /*
     * the tools its code may call: hermes_tools.py offers these only;
     * null: the module alone knows (an MCP server's list)
     */

    ngx_http_hermes_gen_key(g, "tools");

    if (tools_any) {
        yajl_gen_null(g);

    } else {
        yajl_gen_array_open(g);

        if (tools) {
            name = tools->elts;

            for (i = 0; i < tools->nelts; i++) {
                ngx_http_hermes_gen_str(g, &name[i]);
            }
        }

        yajl_gen_array_close(g);
    }

    /* whether the gateway has schemas to ask for: else no round trip */

    ngx_http_hermes_gen_key(g, "schemas");
    yajl_gen_bool(g, schemas);

    yajl_gen_map_close(g);

    b = ngx_http_hermes_json_take(pool, g, 0);

    yajl_gen_free(g);

    return b;
}




static ngx_str_t  ngx_http_hermes_state_names[] = {
    ngx_string("spawning"),
    ngx_string("idle"),
    ngx_string("running"),
    ngx_string("lost")
};


static void
ngx_http_hermes_json_gen_ms(yajl_gen g, uint64_t ms)
{
    u_char  num[32], *p;

    /* seconds since the epoch, with milliseconds */
    p = ngx_sprintf(num, "%uL.%03uL", ms / 1000, ms % 1000);
    yajl_gen_number(g, (const char *) num, p - num);
}


static void
ngx_http_hermes_json_gen_kernel(yajl_gen g, ngx_http_hermes_listing_t *l)
{
    yajl_gen_map_open(g);
    ngx_http_hermes_gen_key(g, "session");
    ngx_http_hermes_gen_str(g, &l->session);
    ngx_http_hermes_gen_key(g, "kernel_id");
    yajl_gen_string(g, l->kernel_id, NGX_HTTP_HERMES_ID_LEN);
    ngx_http_hermes_gen_key(g, "backend");
    ngx_http_hermes_gen_str(g, &l->backend_name);
    ngx_http_hermes_gen_key(g, "host");
    ngx_http_hermes_gen_str(g, &l->host_name);

    if (l->env_name.len) {
        ngx_http_hermes_gen_key(g, "environment");
        ngx_http_hermes_gen_str(g, &l->env_name);
    }
    ngx_http_hermes_gen_key(g, "state");
    ngx_http_hermes_gen_str(g, &ngx_http_hermes_state_names[l->state]);
    ngx_http_hermes_gen_key(g, "execution_count");
    yajl_gen_integer(g, l->execution_count);
    ngx_http_hermes_gen_key(g, "created");
    ngx_http_hermes_json_gen_ms(g, l->created);
    ngx_http_hermes_gen_key(g, "last_used");
    ngx_http_hermes_json_gen_ms(g, l->last_used);
    ngx_http_hermes_gen_key(g, "running_for_ms");
    yajl_gen_integer(g, l->running_for);
    yajl_gen_map_close(g);
}


ngx_buf_t *
ngx_http_hermes_json_listing(ngx_pool_t *pool, ngx_array_t *list)
{
    yajl_gen                    g;
    ngx_buf_t                  *b;
    ngx_uint_t                  i;
    ngx_http_hermes_listing_t  *l;

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        return NULL;
    }

    l = list->elts;

    yajl_gen_map_open(g);
    ngx_http_hermes_gen_key(g, "kernels");
    yajl_gen_array_open(g);

    for (i = 0; i < list->nelts; i++) {
        ngx_http_hermes_json_gen_kernel(g, &l[i]);
    }

    yajl_gen_array_close(g);
    yajl_gen_map_close(g);

    b = ngx_http_hermes_json_take(pool, g, 1);

    yajl_gen_free(g);

    return b;
}


ngx_buf_t *
ngx_http_hermes_json_kernel(ngx_pool_t *pool, ngx_http_hermes_listing_t *l)
{
    yajl_gen    g;
    ngx_buf_t  *b;

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        return NULL;
    }

    ngx_http_hermes_json_gen_kernel(g, l);

    b = ngx_http_hermes_json_take(pool, g, 1);

    yajl_gen_free(g);

    return b;
}


/*
 * One event line of a cell's output file, {"type":"stdout"|"stderr",
 * "text":"..."}: its text appended to out or err (each bounded by its
 * end).  Other lines are skipped.
 */

void
ngx_http_hermes_json_event_text(u_char *line, size_t len, ngx_buf_t *out,
    ngx_buf_t *err)
{
    size_t       n;
    u_char       buf[65536];
    ngx_buf_t   *b;
    yajl_val     v, type, text;
    const char  *tpath[] = { "type", NULL };
    const char  *xpath[] = { "text", NULL };

    if (len == 0 || len >= sizeof(buf)) {
        return;
    }

    ngx_memcpy(buf, line, len);
    buf[len] = '\0';

    v = yajl_tree_parse((char *) buf, NULL, 0);
    if (v == NULL) {
        return;
    }

    type = yajl_tree_get(v, tpath, yajl_t_string);
    text = yajl_tree_get(v, xpath, yajl_t_string);

    if (type && text && type->u.string && text->u.string) {
        b = (ngx_strcmp(type->u.string, "stderr") == 0) ? err
            : (ngx_strcmp(type->u.string, "stdout") == 0) ? out : NULL;

        if (b) {
            n = ngx_min(ngx_strlen(text->u.string),
                        (size_t) (b->end - b->last));
            b->last = ngx_cpymem(b->last, text->u.string, n);
        }
    }

    yajl_tree_free(v);
}
