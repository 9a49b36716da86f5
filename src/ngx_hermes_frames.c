
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: the frames of the kernel-host agent protocol (docs/internals.md,
 * "Frames"): a 9-byte header (u32 length, u32 stream, u8 type), then the
 * payload.  Pure functions: encode into a caller's buffer, decode from one.
 */


#include "ngx_hermes.h"


uint32_t
ngx_http_hermes_frames_u32(u_char *p)
{
    return ((uint32_t) p[0] << 24) | ((uint32_t) p[1] << 16)
           | ((uint32_t) p[2] << 8) | p[3];
}


u_char *
ngx_http_hermes_frames_put_u32(u_char *p, uint32_t v)
{
    *p++ = (u_char) (v >> 24);
    *p++ = (u_char) (v >> 16);
    *p++ = (u_char) (v >> 8);
    *p++ = (u_char) v;

    return p;
}


u_char *
ngx_http_hermes_frames_put_u64(u_char *p, uint64_t v)
{
    p = ngx_http_hermes_frames_put_u32(p, (uint32_t) (v >> 32));
    return ngx_http_hermes_frames_put_u32(p, (uint32_t) v);
}


uint64_t
ngx_http_hermes_frames_u64(u_char *p)
{
    return ((uint64_t) ngx_http_hermes_frames_u32(p) << 32)
           | ngx_http_hermes_frames_u32(p + 4);
}


/* the header of a frame of "len" payload bytes; p + 9 */

u_char *
ngx_http_hermes_frames_header(u_char *p, uint32_t stream, u_char type,
    size_t len)
{
    p = ngx_http_hermes_frames_put_u32(p, (uint32_t) len);
    p = ngx_http_hermes_frames_put_u32(p, stream);
    *p++ = type;

    return p;
}


/*
 * The frame at the head of "n" bytes: NGX_OK (f filled, the frame is
 * NGX_HTTP_HERMES_FRAME_HEADER + f->len bytes), NGX_AGAIN while it is not
 * all there, NGX_ERROR for a length over the protocol's bound.
 */

ngx_int_t
ngx_http_hermes_frames_parse(u_char *p, size_t n, ngx_http_hermes_frame_t *f)
{
    uint32_t  len;

    if (n < NGX_HTTP_HERMES_FRAME_HEADER) {
        return NGX_AGAIN;
    }

    len = ngx_http_hermes_frames_u32(p);

    if (len > NGX_HTTP_HERMES_FRAME_MAX) {
        return NGX_ERROR;
    }

    if (n - NGX_HTTP_HERMES_FRAME_HEADER < len) {
        return NGX_AGAIN;
    }

    f->len = len;
    f->stream = ngx_http_hermes_frames_u32(p + 4);
    f->type = p[8];
    f->payload = p + NGX_HTTP_HERMES_FRAME_HEADER;

    return NGX_OK;
}


/* a "J+B" payload: u32 json length, the JSON, the bytes */

ngx_int_t
ngx_http_hermes_frames_split(u_char *p, size_t len, ngx_str_t *json,
    ngx_str_t *bytes)
{
    uint32_t  jl;

    if (len < 4) {
        return NGX_ERROR;
    }

    jl = ngx_http_hermes_frames_u32(p);

    if (jl > len - 4) {
        return NGX_ERROR;
    }

    json->data = p + 4;
    json->len = jl;
    bytes->data = p + 4 + jl;
    bytes->len = len - 4 - jl;

    return NGX_OK;
}


/*
 * Where the value of a top-level "key" of a JSON object the agent wrote
 * starts (flat objects of numbers and strings), or NULL.  Strings are
 * skipped whole, so a key's name inside a string value is not taken for
 * the key.
 */

static u_char *
ngx_http_hermes_frames_json_value(ngx_str_t *json, char *key)
{
    u_char  *p, *last, *s;
    size_t   klen;

    p = json->data;
    last = p + json->len;
    klen = ngx_strlen(key);

    while (p < last) {

        if (*p != '"') {
            p++;
            continue;
        }

        /* a string: a key when a colon follows it */

        s = ++p;

        while (p < last && *p != '"') {
            if (*p == '\\') {
                p++;
            }

            p++;
        }

        if (p >= last) {
            return NULL;
        }

        if ((size_t) (p - s) != klen || ngx_strncmp(s, key, klen) != 0) {
            p++;
            continue;
        }

        for (p++; p < last && (*p == ' ' || *p == '\t'); p++) { /* void */ }

        if (p == last || *p != ':') {
            continue;
        }

        for (p++; p < last && (*p == ' ' || *p == '\t'); p++) { /* void */ }

        return p;
    }

    return NULL;
}


/* its integer value: NGX_OK, or NGX_DECLINED (not there, not an integer) */

ngx_int_t
ngx_http_hermes_frames_json_int(ngx_str_t *json, char *key, int64_t *value)
{
    u_char   *p, *last;
    int64_t   v, sign;

    p = ngx_http_hermes_frames_json_value(json, key);
    last = json->data + json->len;

    if (p == NULL) {
        return NGX_DECLINED;
    }

    sign = 1;

    if (p < last && *p == '-') {
        sign = -1;
        p++;
    }

    if (p == last || *p < '0' || *p > '9') {
        return NGX_DECLINED;
    }

    for (v = 0; p < last && *p >= '0' && *p <= '9'; p++) {
        if (v > (INT64_MAX - 9) / 10) {
            return NGX_DECLINED;
        }

        v = v * 10 + (*p - '0');
    }

    *value = sign * v;
    return NGX_OK;
}


/*
 * Its value, a string without escapes (a name): NGX_OK, or NGX_DECLINED
 * (not there, not such a string).
 */

ngx_int_t
ngx_http_hermes_frames_json_str(ngx_str_t *json, char *key, ngx_str_t *value)
{
    u_char  *p, *s, *last;

    p = ngx_http_hermes_frames_json_value(json, key);
    last = json->data + json->len;

    if (p == NULL || p == last || *p != '"') {
        return NGX_DECLINED;
    }

    for (s = ++p; p < last && *p != '"'; p++) {
        if (*p == '\\' || *p < 0x20) {
            return NGX_DECLINED;
        }
    }

    if (p == last) {
        return NGX_DECLINED;
    }

    value->data = s;
    value->len = p - s;

    return NGX_OK;
}


/*
 * Where the agent's frames start: just after the magic line, which may
 * follow what the login shell printed.  NGX_OK with *skip the bytes to
 * drop, NGX_AGAIN with *skip the bytes that can be dropped while looking
 * on (the tail may be the magic's beginning).
 */

ngx_int_t
ngx_http_hermes_frames_magic(u_char *p, size_t n, size_t *skip)
{
    size_t   i, m;

    static u_char  magic[] = NGX_HTTP_HERMES_FRAME_MAGIC;

    m = sizeof(magic) - 1;

    for (i = 0; i < n; i++) {
        if (p[i] != '\0') {
            continue;
        }

        if (n - i < m) {
            if (ngx_memcmp(p + i, magic, n - i) == 0) {
                *skip = i;
                return NGX_AGAIN;
            }

            continue;
        }

        if (ngx_memcmp(p + i, magic, m) == 0) {
            *skip = i + m;
            return NGX_OK;
        }
    }

    *skip = n;

    return NGX_AGAIN;
}


/*
 * The header of a frame whose payload is J+B: the JSON was written from
 * buf + NGX_HTTP_HERMES_FRAME_HEADER + 4 up to "last", and "bytes" more
 * follow it.  "last".
 */

static u_char *
ngx_http_hermes_frames_jb(u_char *buf, uint32_t stream, u_char type,
    u_char *last, size_t bytes)
{
    size_t  len;

    len = last - (buf + NGX_HTTP_HERMES_FRAME_HEADER + 4);

    (void) ngx_http_hermes_frames_header(buf, stream, type, 4 + len + bytes);
    (void) ngx_http_hermes_frames_put_u32(buf + NGX_HTTP_HERMES_FRAME_HEADER,
                                          (uint32_t) len);

    return last;
}


/*
 * A CELL frame's header and JSON: the caller sends the request's bytes
 * after it (offset -1 only).  "buf" holds NGX_HTTP_HERMES_FRAME_CELL_MAX;
 * the end of what was written.
 */

u_char *
ngx_http_hermes_frames_cell(u_char *buf, uint32_t stream,
    ngx_http_hermes_frame_cell_t *c)
{
    u_char  *p;

    p = buf + NGX_HTTP_HERMES_FRAME_HEADER + 4;

    p = ngx_cpymem(p, "{\"dir\":\"", sizeof("{\"dir\":\"") - 1);
    p = (u_char *) ngx_escape_json(p, c->dir, ngx_strlen(c->dir));
    p = ngx_sprintf(p, "\",\"cell\":%uD,\"pid\":%P,\"start\":%uL,\"ino\":%uL,"
                    "\"uid\":%uD,\"offset\":%O,\"out_limit\":%O,"
                    "\"res_limit\":%O,\"window\":%uz}",
                    c->cell, c->pid, c->start, c->ino, c->uid, c->offset,
                    c->out_limit, c->res_limit, c->window);

    return ngx_http_hermes_frames_jb(buf, stream, 'C', p, c->req_len);
}


/*
 * An EXEC frame's header and JSON, the stdin bytes to follow: "cmd" runs
 * as `sh -c CMD hermes ARGS...` ("args": NULL or NULL-ended).  "cmd" NULL:
 * a KERNEL frame, the kernel script's step ARGS done by the agent itself.
 * "buf" holds NGX_HTTP_HERMES_FRAME_EXEC_MAX + 6 times the length of the
 * command and of each argument plus 3.
 */

u_char *
ngx_http_hermes_frames_exec(u_char *buf, uint32_t stream, u_char *cmd,
    size_t cmd_len, char *const *args, ngx_msec_t timeout, size_t out_max,
    size_t in_len)
{
    u_char      *p;
    ngx_uint_t   i;

    p = buf + NGX_HTTP_HERMES_FRAME_HEADER + 4;

    if (cmd) {
        p = ngx_cpymem(p, "{\"cmd\":\"", sizeof("{\"cmd\":\"") - 1);
        p = (u_char *) ngx_escape_json(p, cmd, cmd_len);
        p = ngx_cpymem(p, "\",\"args\":[", sizeof("\",\"args\":[") - 1);

    } else {
        p = ngx_cpymem(p, "{\"args\":[", sizeof("{\"args\":[") - 1);
    }

    for (i = 0; args && args[i]; i++) {
        if (i) {
            *p++ = ',';
        }

        *p++ = '"';
        p = (u_char *) ngx_escape_json(p, (u_char *) args[i],
                                       ngx_strlen(args[i]));
        *p++ = '"';
    }

    p = ngx_sprintf(p, "],\"timeout\":%M,\"out_max\":%uz}", timeout, out_max);

    return ngx_http_hermes_frames_jb(buf, stream, cmd ? 'X' : 'K', p, in_len);
}


/*
 * A READY frame: wait for "dir"/ready and answer as an EXEC would; "buf"
 * holds NGX_HTTP_HERMES_FRAME_EXEC_MAX + 6 times the directory's length.
 */

u_char *
ngx_http_hermes_frames_ready(u_char *buf, uint32_t stream, u_char *dir,
    size_t dir_len, ngx_pid_t pid, ngx_msec_t timeout)
{
    u_char  *p;

    p = buf + NGX_HTTP_HERMES_FRAME_HEADER + 4;

    p = ngx_cpymem(p, "{\"dir\":\"", sizeof("{\"dir\":\"") - 1);
    p = (u_char *) ngx_escape_json(p, dir, dir_len);
    p = ngx_sprintf(p, "\",\"pid\":%P,\"timeout\":%M}", pid, timeout);

    return ngx_http_hermes_frames_jb(buf, stream, 'W', p, 0);
}


/*
 * An INTERRUPT frame: "cell\n" into "dir"/intr if the directory is still
 * inode "ino"; nothing answers it.  "buf" holds
 * NGX_HTTP_HERMES_FRAME_EXEC_MAX + 6 times the directory's length.
 */

u_char *
ngx_http_hermes_frames_interrupt(u_char *buf, uint32_t stream, u_char *dir,
    size_t dir_len, uint64_t ino, uint32_t cell)
{
    u_char  *p;

    p = buf + NGX_HTTP_HERMES_FRAME_HEADER + 4;

    p = ngx_cpymem(p, "{\"dir\":\"", sizeof("{\"dir\":\"") - 1);
    p = (u_char *) ngx_escape_json(p, dir, dir_len);
    p = ngx_sprintf(p, "\",\"ino\":%uL,\"cell\":%uD}", ino, cell);

    return ngx_http_hermes_frames_jb(buf, stream, 'I', p, 0);
}
