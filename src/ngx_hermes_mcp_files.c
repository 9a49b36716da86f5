
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: hermes_mcp's upload_file and download_file, a file into or
 * out of a session's kernel as PUT and GET <kernels>/SESSION/files/PATH
 * move it (ngx_hermes_files.c: the same checks, script, bounds and
 * per-owner count), its bytes from the tool's arguments, or into one
 * answer.  Tools, not resources: MCP hosts give tools to the model,
 * resources only to the user or host that attaches them.
 */


#include "ngx_hermes.h"

#include <yajl/yajl_tree.h>


/*
 * The most one download_file answer holds (with hermes_max_file, the
 * lower): the whole file is in the worker's memory with its base64 or
 * JSON-escaped form, so it is bounded like one piece of an HTTP GET;
 * more is more than a model reads, and the HTTP route moves it.
 */
#define NGX_HTTP_HERMES_MCP_FILE_MAX  NGX_HTTP_HERMES_FILES_PIECE


/* a file tool's call while its transfer runs */
typedef struct {
    ngx_http_hermes_mcp_req_t       mr;         /* params freed: NULL */
    ngx_str_t                       session;
    u_char                         *file;       /* a download's bytes */
    size_t                          cap;
} ngx_http_hermes_mcp_file_t;


static ngx_http_hermes_mcp_file_t *ngx_http_hermes_mcp_file_call(
    ngx_http_hermes_mcp_req_t *mr, void *args, ngx_str_t *path,
    ngx_int_t *rc);
static ngx_int_t ngx_http_hermes_mcp_file_start(
    ngx_http_hermes_mcp_file_t *mf, ngx_http_hermes_files_t *f,
    ngx_http_hermes_files_handler_pt handler);
static void ngx_http_hermes_mcp_upload_done(ngx_http_hermes_files_t *f);
static void ngx_http_hermes_mcp_download_done(ngx_http_hermes_files_t *f);
static ngx_int_t ngx_http_hermes_mcp_file_error(
    ngx_http_hermes_mcp_file_t *mf, ngx_http_hermes_files_error_t *err);
static ngx_int_t ngx_http_hermes_mcp_file_answer(
    ngx_http_hermes_mcp_file_t *mf, ngx_http_hermes_files_t *f);
static ngx_uint_t ngx_http_hermes_mcp_utf8(u_char *p, size_t n);


ngx_int_t
ngx_http_hermes_mcp_upload_file(ngx_http_hermes_mcp_req_t *mr, void *args)
{
    ngx_int_t                       rc;
    ngx_str_t                       path, src, dst;
    ngx_buf_t                      *b;
    yajl_val                        v, e;
    ngx_chain_t                    *cl;
    ngx_http_request_t             *r;
    ngx_http_hermes_files_t        *f;
    ngx_http_hermes_loc_conf_t     *hlcf;
    ngx_http_hermes_mcp_file_t     *mf;
    ngx_http_hermes_files_error_t  *err;
    const char                     *pcontent[] = { "content", NULL };
    const char                     *pencoding[] = { "encoding", NULL };

    r = mr->r;
    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    mf = ngx_http_hermes_mcp_file_call(mr, args, &path, &rc);
    if (mf == NULL) {
        return rc;
    }

    v = yajl_tree_get(args, pcontent, yajl_t_any);

    if (v == NULL || !YAJL_IS_STRING(v)) {
        return ngx_http_hermes_mcp_tool_error(mr, "invalid_request",
                                              "\"content\" (a string) is "
                                              "required");
    }

    e = yajl_tree_get(args, pencoding, yajl_t_any);

    if (e && !(YAJL_IS_STRING(e)
               && (ngx_strcmp(e->u.string, "utf-8") == 0
                   || ngx_strcmp(e->u.string, "base64") == 0)))
    {
        return ngx_http_hermes_mcp_tool_error(mr, "invalid_request",
                                              "\"encoding\" must be "
                                              "\"utf-8\" or \"base64\"");
    }

    /*
     * the bytes, copied out of the message's tree (freed once this
     * returns): no more than the body, which client_max_body_size bounds
     */

    src.data = (u_char *) v->u.string;
    src.len = ngx_strlen(v->u.string);

    if (e && e->u.string[0] == 'b') {
        dst.data = ngx_pnalloc(r->pool,
                               ngx_base64_decoded_length(src.len) + 1);
        if (dst.data == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (ngx_decode_base64(&dst, &src) != NGX_OK) {
            return ngx_http_hermes_mcp_tool_error(mr, "invalid_request",
                                                  "\"content\" is not "
                                                  "base64");
        }

    } else {
        dst.data = ngx_pnalloc(r->pool, src.len + 1);
        if (dst.data == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        dst.len = ngx_cpymem(dst.data, src.data, src.len) - dst.data;
    }

    f = ngx_http_hermes_files_create(r, hlcf->shm_zone->data, &mr->owner,
                                     &mf->session, &path, 0, hlcf->max_file,
                                     &err);
    if (f == NULL) {
        return ngx_http_hermes_mcp_file_error(mf, err);
    }

    if (dst.len > hlcf->max_file) {
        return ngx_http_hermes_mcp_file_error(mf,
                                            &ngx_http_hermes_files_too_large);
    }

    /* one buffer in memory: the transfer reads it a piece at a time */

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->pos = dst.data;
    b->last = dst.data + dst.len;
    b->memory = 1;

    cl = ngx_alloc_chain_link(r->pool);
    if (cl == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cl->buf = b;
    cl->next = NULL;

    ngx_http_hermes_files_set_body(f, cl);

    return ngx_http_hermes_mcp_file_start(mf, f,
                                          ngx_http_hermes_mcp_upload_done);
}


ngx_int_t
ngx_http_hermes_mcp_download_file(ngx_http_hermes_mcp_req_t *mr, void *args)
{
    ngx_int_t                       rc;
    ngx_str_t                       path;
    ngx_http_request_t             *r;
    ngx_http_hermes_files_t        *f;
    ngx_http_hermes_loc_conf_t     *hlcf;
    ngx_http_hermes_mcp_file_t     *mf;
    ngx_http_hermes_files_error_t  *err;

    r = mr->r;
    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    mf = ngx_http_hermes_mcp_file_call(mr, args, &path, &rc);
    if (mf == NULL) {
        return rc;
    }

    mf->cap = ngx_min(hlcf->max_file, NGX_HTTP_HERMES_MCP_FILE_MAX);

    /* hermes_files.py refuses a file over the cap before reading it */

    f = ngx_http_hermes_files_create(r, hlcf->shm_zone->data, &mr->owner,
                                     &mf->session, &path, 1, mf->cap, &err);
    if (f == NULL) {
        return ngx_http_hermes_mcp_file_error(mf, err);
    }

    return ngx_http_hermes_mcp_file_start(mf, f,
                                          ngx_http_hermes_mcp_download_done);
}


/*
 * A file tool's call: its path (copied: the tree is freed before the
 * transfer ends) and kernel session.  NULL: invalid, the request ends
 * with *rc, its answer sent.
 */

static ngx_http_hermes_mcp_file_t *
ngx_http_hermes_mcp_file_call(ngx_http_hermes_mcp_req_t *mr, void *args,
    ngx_str_t *path, ngx_int_t *rc)
{
    yajl_val                     v;
    ngx_http_hermes_mcp_file_t  *mf;
    const char                  *ppath[] = { "path", NULL };

    v = args ? yajl_tree_get(args, ppath, yajl_t_any) : NULL;

    if (v == NULL || !YAJL_IS_STRING(v)) {
        *rc = ngx_http_hermes_mcp_tool_error(mr, "invalid_request",
                                             "\"path\" (a string) is "
                                             "required");
        return NULL;
    }

    mf = ngx_pcalloc(mr->r->pool, sizeof(ngx_http_hermes_mcp_file_t));
    if (mf == NULL) {
        *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        return NULL;
    }

    if (ngx_http_hermes_mcp_kernel_session(mr, args, &mf->session, rc)
        != NGX_OK)
    {
        return NULL;
    }

    path->len = ngx_strlen(v->u.string);
    path->data = ngx_pnalloc(mr->r->pool, path->len + 1);
    if (path->data == NULL) {
        *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        return NULL;
    }

    ngx_memcpy(path->data, v->u.string, path->len);

    mf->mr = *mr;
    mf->mr.params = NULL;

    return mf;
}


/*
 * The transfer's first command posted: the request waits for it
 * (NGX_DONE, the body reader's count), as the HTTP route's does.
 */

static ngx_int_t
ngx_http_hermes_mcp_file_start(ngx_http_hermes_mcp_file_t *mf,
    ngx_http_hermes_files_t *f, ngx_http_hermes_files_handler_pt handler)
{
    f->handler = handler;
    f->data = mf;

    if (ngx_http_hermes_files_start(f) != NGX_OK) {
        return ngx_http_hermes_mcp_file_error(mf, f->error);
    }

    return NGX_DONE;
}


static void
ngx_http_hermes_mcp_upload_done(ngx_http_hermes_files_t *f)
{
    ngx_http_hermes_mcp_file_t *mf = f->data;

    u_char     *p;
    size_t      esc;
    ngx_str_t   text, structured;

    if (f->error) {
        ngx_http_finalize_request(f->r,
                               ngx_http_hermes_mcp_file_error(mf, f->error));
        return;
    }

    /* a path may hold a '"': JSON-escaped in the structured content */

    esc = f->path.len + ngx_escape_json(NULL, f->path.data, f->path.len);

    p = ngx_pnalloc(f->r->pool, f->path.len + esc + 2 * NGX_SIZE_T_LEN + 64);
    if (p == NULL) {
        ngx_http_finalize_request(f->r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    text.data = p;
    text.len = ngx_sprintf(p, "wrote %uz bytes to %V", f->body_len, &f->path)
               - p;

    structured.data = p + text.len;
    p = ngx_cpymem(structured.data, "{\"path\":\"",
                   sizeof("{\"path\":\"") - 1);
    p = (u_char *) ngx_escape_json(p, f->path.data, f->path.len);
    p = ngx_sprintf(p, "\",\"size\":%uz}", f->body_len);
    structured.len = p - structured.data;

    ngx_http_finalize_request(f->r,
                    ngx_http_hermes_mcp_text(&mf->mr, &text, &structured, 0));
}


/* a piece of the file: kept, the next asked for, or the file answered */

static void
ngx_http_hermes_mcp_download_done(ngx_http_hermes_files_t *f)
{
    ngx_http_hermes_mcp_file_t *mf = f->data;

    ngx_int_t            rc;
    ngx_http_request_t  *r;

    r = f->r;

    if (f->error) {
        ngx_http_finalize_request(r,
                               ngx_http_hermes_mcp_file_error(mf, f->error));
        return;
    }

    /* f->size: at most the cap, as hermes_files.py and the task checked */

    if (mf->file == NULL) {
        mf->file = ngx_pnalloc(r->pool, (size_t) f->size + 1);
        if (mf->file == NULL) {
            ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
            return;
        }
    }

    ngx_memcpy(mf->file + (f->offset - f->out_len), f->out, f->out_len);

    if (f->offset < f->size) {
        if (ngx_http_hermes_files_start(f) != NGX_OK) {
            ngx_http_finalize_request(r,
                               ngx_http_hermes_mcp_file_error(mf, f->error));
        }

        return;
    }

    /* the piece's buffer is not needed for the answer */
    ngx_free(f->out);
    f->out = NULL;

    rc = ngx_http_hermes_mcp_file_answer(mf, f);

    ngx_http_finalize_request(r, rc);
}


/* a transfer's failure as a tool error, with the HTTP API's code */

static ngx_int_t
ngx_http_hermes_mcp_file_error(ngx_http_hermes_mcp_file_t *mf,
    ngx_http_hermes_files_error_t *err)
{
    u_char                      *p;
    ngx_http_hermes_loc_conf_t  *hlcf;

    if (err == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    hlcf = ngx_http_get_module_loc_conf(mf->mr.r, ngx_http_hermes_module);

    if (err == &ngx_http_hermes_files_too_large && mf->cap
        && mf->cap < hlcf->max_file)
    {
        /* the only case where the HTTP route would have moved it */

        p = ngx_pnalloc(mf->mr.r->pool, 256);
        if (p == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        ngx_sprintf(p, "the file is over %uz bytes, the most one "
                    "download_file answer holds; GET <kernels location>/"
                    "SESSION/files/PATH moves files up to hermes_max_file "
                    "(%uz bytes)%Z", mf->cap, hlcf->max_file);

        return ngx_http_hermes_mcp_tool_error(&mf->mr, err->code,
                                              (char *) p);
    }

    return ngx_http_hermes_mcp_tool_error(&mf->mr, err->code, err->message);
}


/*
 * The file as the tool's answer, written here, exactly sized: text if
 * it is UTF-8, an image if PNG or JPEG by its magic bytes, else an
 * embedded resource with a base64 blob; {path, size, encoding} as
 * structured content.
 */

static ngx_int_t
ngx_http_hermes_mcp_file_answer(ngx_http_hermes_mcp_file_t *mf,
    ngx_http_hermes_files_t *f)
{
    u_char              *data;
    size_t               size, len, esc, uri;
    ngx_str_t            src, dst;
    ngx_buf_t           *b;
    ngx_uint_t           text;
    const char          *mime, *encoding;
    ngx_http_request_t  *r;

    r = f->r;
    data = mf->file;
    size = (size_t) f->size;

    mime = NULL;
    text = ngx_http_hermes_mcp_utf8(data, size);

    if (text) {
        encoding = "utf-8";
        esc = size + ngx_escape_json(NULL, data, size);

    } else {
        encoding = "base64";
        esc = ngx_base64_encoded_length(size);

        if (size >= 8 && ngx_memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0) {
            mime = "image/png";

        } else if (size >= 3 && ngx_memcmp(data, "\xff\xd8\xff", 3) == 0) {
            mime = "image/jpeg";
        }
    }

    /* the resource's uri: its path, escaped as a URI's */
    uri = f->path.len
          + 2 * ngx_escape_uri(NULL, f->path.data, f->path.len,
                               NGX_ESCAPE_URI);

    len = sizeof("{\"jsonrpc\":\"2.0\",\"id\":,\"result\":{\"content\":["
                 "{\"type\":\"resource\",\"resource\":{\"uri\":"
                 "\"hermes:////files/\",\"mimeType\":"
                 "\"application/octet-stream\",\"blob\":\"\"}}],"
                 "\"structuredContent\":{\"path\":\"\",\"size\":,"
                 "\"encoding\":\"base64\"},\"isError\":false}}")
          + mf->mr.id.len + mf->session.len + uri + esc + f->path.len
          + ngx_escape_json(NULL, f->path.data, f->path.len)
          + NGX_OFF_T_LEN + 32;

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = ngx_sprintf(b->last, "{\"jsonrpc\":\"2.0\",\"id\":%V,"
                                   "\"result\":{\"content\":[",
                          &mf->mr.id);

    if (text) {
        b->last = ngx_cpymem(b->last, "{\"type\":\"text\",\"text\":\"",
                             sizeof("{\"type\":\"text\",\"text\":\"") - 1);
        b->last = (u_char *) ngx_escape_json(b->last, data, size);
        b->last = ngx_cpymem(b->last, "\"}", 2);

    } else {
        if (mime) {
            b->last = ngx_cpymem(b->last, "{\"type\":\"image\",\"data\":\"",
                                 sizeof("{\"type\":\"image\",\"data\":\"")
                                 - 1);

        } else {
            b->last = ngx_sprintf(b->last, "{\"type\":\"resource\","
                                           "\"resource\":{\"uri\":"
                                           "\"hermes:///%V/files/",
                                  &mf->session);
            b->last = (u_char *) ngx_escape_uri(b->last, f->path.data,
                                                f->path.len, NGX_ESCAPE_URI);
            b->last = ngx_cpymem(b->last, "\",\"mimeType\":"
                                 "\"application/octet-stream\",\"blob\":\"",
                                 sizeof("\",\"mimeType\":"
                                 "\"application/octet-stream\",\"blob\":\"")
                                 - 1);
        }

        src.data = data;
        src.len = size;
        dst.data = b->last;

        ngx_encode_base64(&dst, &src);

        b->last += dst.len;

        if (mime) {
            b->last = ngx_sprintf(b->last, "\",\"mimeType\":\"%s\"}", mime);

        } else {
            b->last = ngx_cpymem(b->last, "\"}}", 3);
        }
    }

    b->last = ngx_cpymem(b->last, "],\"structuredContent\":{\"path\":\"",
                         sizeof("],\"structuredContent\":{\"path\":\"") - 1);
    b->last = (u_char *) ngx_escape_json(b->last, f->path.data, f->path.len);
    b->last = ngx_sprintf(b->last, "\",\"size\":%O,\"encoding\":\"%s\"},"
                                   "\"isError\":false}}",
                          f->size, encoding);

    return ngx_http_hermes_response_send_buf(r, NGX_HTTP_OK,
                                             "application/json", b);
}


/* strict UTF-8: no overlong forms, surrogates, or past U+10FFFF */

static ngx_uint_t
ngx_http_hermes_mcp_utf8(u_char *p, size_t n)
{
    u_char      *last;
    uint32_t     u, min;
    ngx_uint_t   k;

    last = p + n;

    while (p < last) {
        u = *p++;

        if (u < 0x80) {
            continue;
        }

        if (u >= 0xc2 && u <= 0xdf) {
            k = 1;
            u &= 0x1f;
            min = 0x80;

        } else if (u >= 0xe0 && u <= 0xef) {
            k = 2;
            u &= 0x0f;
            min = 0x800;

        } else if (u >= 0xf0 && u <= 0xf4) {
            k = 3;
            u &= 0x07;
            min = 0x10000;

        } else {
            return 0;
        }

        if ((size_t) (last - p) < k) {
            return 0;
        }

        while (k--) {
            if ((*p & 0xc0) != 0x80) {
                return 0;
            }

            u = (u << 6) | (*p++ & 0x3f);
        }

        if (u < min || u > 0x10ffff || (u >= 0xd800 && u <= 0xdfff)) {
            return 0;
        }
    }

    return 1;
}
