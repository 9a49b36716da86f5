
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: tool calls from a cell's code, over its kernel's file RPC.
 *
 * hermes_tools.py writes rpc/req_N ({"tool","args","seq","token"}).  Each
 * request is read once (non-blocking, no-follow, bounded), removed, then
 * checked in this order: a well-formed JSON object, the kernel's token
 * (constant time), seq a positive integer that is the file's own number,
 * and not seen before in this cell.  A request failing any of these is
 * never dispatched and never answered, only counted by reason: whoever
 * wrote it does not hold the token, or is replaying.  Then the allow-list
 * and the cell's budget, whose failures are answered (the code's own
 * mistakes), then the call: a background subrequest to hermes_tools_pass,
 * its answer captured in memory by the filters here, written to
 * rpc/res_N (0600, tmp + rename) for hermes_tools.py to take.
 *
 * The calls run as subrequests of the cell's request: a call made after
 * its client left, or one in flight when it leaves, is answered with a
 * ToolError saying so (the cell goes on).  A cell's authority ends with
 * the cell: calls still in flight then are forgotten, never answered.
 */


#include "ngx_hermes.h"
#include "ngx_hermes_rpc_call.h"

#include <sodium.h>
#include <sys/inotify.h>
#include <yajl/yajl_gen.h>
#include <yajl/yajl_parse.h>
#include <yajl/yajl_tree.h>


#define NGX_HTTP_HERMES_RPC_TOOL_MAX   128
#define NGX_HTTP_HERMES_RPC_SCAN_MAX   1024   /* names a scan looks at */
#define NGX_HTTP_HERMES_RPC_SWEEPS     16     /* scans a sweep takes at most */
#define NGX_HTTP_HERMES_RPC_SEEN_MORE  64     /* seqs kept past the budget */

/*
 * a cell's calls running at once; the rest wait their turn: each holds
 * its answer in memory (up to max(hermes_max_stream, hermes_max_output))
 */
#define NGX_HTTP_HERMES_RPC_RUNNING    4

/* rejections a kernel logs a minute (per worker); the rest are counted */
#define NGX_HTTP_HERMES_RPC_LOG_BURST  5
#define NGX_HTTP_HERMES_RPC_LOG_WINDOW 60000
#define NGX_HTTP_HERMES_RPC_LOG_SLOTS  64

#define NGX_HTTP_HERMES_RPC_KEY_TOOL   0x01
#define NGX_HTTP_HERMES_RPC_KEY_ARGS   0x02
#define NGX_HTTP_HERMES_RPC_KEY_SEQ    0x04
#define NGX_HTTP_HERMES_RPC_KEY_TOKEN  0x08


/* a kernel's rejection lines in this minute: a flood costs a few lines */

typedef struct {
    u_char                          kernel_id[NGX_HTTP_HERMES_ID_LEN];
    ngx_msec_t                      since;
    ngx_uint_t                      logged;
    ngx_uint_t                      more;       /* not logged, to summarise */
} ngx_http_hermes_rpc_log_t;


/* the parser's state: the top-level keys we know, raw */

typedef struct {
    yajl_handle                     h;
    u_char                         *start;
    ngx_uint_t                      depth;
    ngx_uint_t                      key;        /* at depth 1: which */
    ngx_uint_t                      keys;       /* seen, a bit each */
    ngx_http_hermes_rpc_req_t      *req;
    unsigned                        root_map:1;
    unsigned                        in_args:1;
} ngx_http_hermes_rpc_parse_t;


static int ngx_http_hermes_rpc_p_null(void *ctx);
static int ngx_http_hermes_rpc_p_bool(void *ctx, int b);
static int ngx_http_hermes_rpc_p_number(void *ctx, const char *s, size_t len);
static int ngx_http_hermes_rpc_p_string(void *ctx, const unsigned char *s,
    size_t len);
static int ngx_http_hermes_rpc_p_start(void *ctx);
static int ngx_http_hermes_rpc_p_key(void *ctx, const unsigned char *s,
    size_t len);
static int ngx_http_hermes_rpc_p_end(void *ctx);
static int ngx_http_hermes_rpc_p_scalar(ngx_http_hermes_rpc_parse_t *p,
    ngx_uint_t type, const u_char *s, size_t len);
static ngx_int_t ngx_http_hermes_rpc_seq_value(u_char *s, size_t len,
    uint64_t *seq);
static void ngx_http_hermes_rpc_close(ngx_http_hermes_rpc_t *rpc);
static ngx_int_t ngx_http_hermes_rpc_file(ngx_http_hermes_rpc_t *rpc,
    u_char *name);
static ngx_uint_t ngx_http_hermes_rpc_log_slot(ngx_http_hermes_rpc_t *rpc,
    ngx_uint_t take);
static void ngx_http_hermes_rpc_take(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_req_t *req);
static ngx_int_t ngx_http_hermes_rpc_start(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call);
static void ngx_http_hermes_rpc_call_free(void *data);
static ngx_int_t ngx_http_hermes_rpc_dispatch(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_req_t *req);
static ngx_buf_t *ngx_http_hermes_rpc_body(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call);
static void ngx_http_hermes_rpc_outcome(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, ngx_int_t rc);
static void ngx_http_hermes_rpc_message(u_char *body, size_t len,
    ngx_str_t *msg);
static ngx_int_t ngx_http_hermes_rpc_archive(ngx_http_hermes_rpc_t *rpc,
    uint64_t seq, u_char *body, size_t len);
static ngx_int_t ngx_http_hermes_rpc_write(ngx_http_hermes_rpc_t *rpc,
    uint64_t seq, u_char *data, size_t len);
static void ngx_http_hermes_rpc_emit(ngx_http_hermes_rpc_t *rpc,
    const char *type, ngx_str_t *tool, uint64_t seq, ngx_int_t ok,
    ngx_msec_t ms);
static ngx_http_hermes_rpc_call_t *ngx_http_hermes_rpc_call(
    ngx_http_request_t *r);
static ngx_int_t ngx_http_hermes_rpc_header_filter(ngx_http_request_t *r);
static ngx_int_t ngx_http_hermes_rpc_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);


static yajl_callbacks  ngx_http_hermes_rpc_callbacks = {
    ngx_http_hermes_rpc_p_null,
    ngx_http_hermes_rpc_p_bool,
    NULL,
    NULL,
    ngx_http_hermes_rpc_p_number,
    ngx_http_hermes_rpc_p_string,
    ngx_http_hermes_rpc_p_start,
    ngx_http_hermes_rpc_p_key,
    ngx_http_hermes_rpc_p_end,
    ngx_http_hermes_rpc_p_start,
    ngx_http_hermes_rpc_p_end
};


ngx_str_t  ngx_http_hermes_rpc_reject_names[] = {
    ngx_string("malformed"),
    ngx_string("token"),
    ngx_string("seq"),
    ngx_string("replay"),
    ngx_null_string
};


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;


/*
 * The checks, pure: NGX_OK, or NGX_DECLINED with req->reject the reason
 * (ngx_http_hermes_rpc_reject_e), or NGX_ERROR (no memory).  token is the
 * kernel's token as its hex text; seen holds the seqs of this cell.
 */

ngx_int_t
ngx_http_hermes_rpc_check(u_char *data, size_t len, uint64_t name_seq,
    u_char *token, size_t token_len, uint64_t *seen, ngx_uint_t nseen,
    ngx_http_hermes_rpc_req_t *req)
{
    ngx_uint_t                   i;
    yajl_status                  st;
    ngx_http_hermes_rpc_parse_t  p;

    ngx_memzero(req, sizeof(ngx_http_hermes_rpc_req_t));

    /* 1. a JSON object, with each of our keys at most once */

    req->reject = NGX_HTTP_HERMES_RPC_MALFORMED;

    if (ngx_strlchr(data, data + len, '\0') != NULL) {
        return NGX_DECLINED;
    }

    ngx_memzero(&p, sizeof(ngx_http_hermes_rpc_parse_t));
    p.start = data;
    p.req = req;

    p.h = yajl_alloc(&ngx_http_hermes_rpc_callbacks, NULL, &p);
    if (p.h == NULL) {
        return NGX_ERROR;
    }

    st = yajl_parse(p.h, data, len);
    if (st == yajl_status_ok) {
        st = yajl_complete_parse(p.h);
    }

    yajl_free(p.h);

    if (st != yajl_status_ok || !p.root_map) {
        return NGX_DECLINED;
    }

    /* 2. the token: its length is no secret, its bytes are */

    req->reject = NGX_HTTP_HERMES_RPC_BAD_TOKEN;

    if (req->token_type != NGX_HTTP_HERMES_RPC_STRING
        || req->token.len != token_len
        || sodium_memcmp(req->token.data, token, token_len) != 0)
    {
        return NGX_DECLINED;
    }

    /* 3. seq: a JSON integer (not "1", 1.5, 1e0 or true), the file's */

    req->reject = NGX_HTTP_HERMES_RPC_BAD_SEQ;

    if (req->seq_type != NGX_HTTP_HERMES_RPC_NUMBER
        || ngx_http_hermes_rpc_seq_value(req->seq_text.data,
                                         req->seq_text.len, &req->seq)
           != NGX_OK
        || req->seq != name_seq)
    {
        return NGX_DECLINED;
    }

    /* 4. once in a cell */

    req->reject = NGX_HTTP_HERMES_RPC_REPLAY;

    for (i = 0; i < nseen; i++) {
        if (seen[i] == req->seq) {
            return NGX_DECLINED;
        }
    }

    req->reject = NGX_HTTP_HERMES_RPC_NREJECT;

    return NGX_OK;
}


/*
 * Digits only, no leading zero, at least 1: what hermes_tools.py writes.
 * NGX_DECLINED: it is not.
 */

static ngx_int_t
ngx_http_hermes_rpc_seq_value(u_char *s, size_t len, uint64_t *seq)
{
    size_t    i;
    uint64_t  v;

    if (len == 0 || len > 15 || s[0] < '1' || s[0] > '9') {
        return NGX_DECLINED;
    }

    v = 0;

    for (i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return NGX_DECLINED;
        }

        v = v * 10 + (s[i] - '0');
    }

    *seq = v;

    return NGX_OK;
}


/* the number a file name "req_NNNNNN" carries, or 0 for any other name */

uint64_t
ngx_http_hermes_rpc_name_seq(u_char *name, size_t len)
{
    uint64_t  seq;

    if (len < sizeof("req_000000") - 1 || ngx_strncmp(name, "req_", 4) != 0) {
        return 0;
    }

    name += 4;
    len -= 4;

    /* %06d: six digits at least, leading zeros only to pad */

    if (len > 6) {
        if (name[0] == '0') {
            return 0;
        }

        return ngx_http_hermes_rpc_seq_value(name, len, &seq) == NGX_OK
               ? seq : 0;
    }

    while (len > 1 && name[0] == '0') {
        name++;
        len--;
    }

    return ngx_http_hermes_rpc_seq_value(name, len, &seq) == NGX_OK ? seq : 0;
}


static int
ngx_http_hermes_rpc_p_scalar(ngx_http_hermes_rpc_parse_t *p, ngx_uint_t type,
    const u_char *s, size_t len)
{
    u_char                     *copy;
    ngx_http_hermes_rpc_req_t  *req;

    if (p->depth == 0) {
        return 0;               /* not an object */
    }

    if (p->depth > 1) {
        return 1;
    }

    req = p->req;

    switch (p->key) {

    case NGX_HTTP_HERMES_RPC_KEY_TOOL:
        req->tool_type = type;

        if (type == NGX_HTTP_HERMES_RPC_STRING) {
            if (len > NGX_HTTP_HERMES_RPC_TOOL_MAX) {
                len = NGX_HTTP_HERMES_RPC_TOOL_MAX + 1;     /* too long */
            }

            ngx_memcpy(req->tool_buf, s, ngx_min(len, sizeof(req->tool_buf)));
            req->tool.data = req->tool_buf;
            req->tool.len = len;
        }

        break;

    case NGX_HTTP_HERMES_RPC_KEY_ARGS:
        req->args_type = type;
        break;

    case NGX_HTTP_HERMES_RPC_KEY_SEQ:
        req->seq_type = type;

        if (type == NGX_HTTP_HERMES_RPC_NUMBER) {
            if (len > sizeof(req->seq_buf)) {
                len = sizeof(req->seq_buf);     /* too long to be ours */
            }

            ngx_memcpy(req->seq_buf, s, len);
            req->seq_text.data = req->seq_buf;
            req->seq_text.len = len;
        }

        break;

    case NGX_HTTP_HERMES_RPC_KEY_TOKEN:
        req->token_type = type;

        if (type == NGX_HTTP_HERMES_RPC_STRING) {
            copy = req->token_buf;
            len = ngx_min(len, sizeof(req->token_buf));
            ngx_memcpy(copy, s, len);
            req->token.data = copy;
            req->token.len = len;
        }

        break;
    }

    return 1;
}


static int
ngx_http_hermes_rpc_p_null(void *ctx)
{
    return ngx_http_hermes_rpc_p_scalar(ctx, NGX_HTTP_HERMES_RPC_OTHER,
                                        NULL, 0);
}


static int
ngx_http_hermes_rpc_p_bool(void *ctx, int b)
{
    return ngx_http_hermes_rpc_p_scalar(ctx, NGX_HTTP_HERMES_RPC_OTHER,
                                        NULL, 0);
}


static int
ngx_http_hermes_rpc_p_number(void *ctx, const char *s, size_t len)
{
    return ngx_http_hermes_rpc_p_scalar(ctx, NGX_HTTP_HERMES_RPC_NUMBER,
                                        (const u_char *) s, len);
}


static int
ngx_http_hermes_rpc_p_string(void *ctx, const unsigned char *s, size_t len)
{
    return ngx_http_hermes_rpc_p_scalar(ctx, NGX_HTTP_HERMES_RPC_STRING,
                                        s, len);
}


static int
ngx_http_hermes_rpc_p_start(void *ctx)
{
    ngx_http_hermes_rpc_parse_t *p = ctx;

    size_t  off;

    if (p->depth == 0) {
        /* the top: an object, not an array */
        off = yajl_get_bytes_consumed(p->h);

        if (off == 0 || p->start[off - 1] != '{') {
            return 0;
        }

        p->root_map = 1;

    } else if (p->depth == 1) {
        off = yajl_get_bytes_consumed(p->h);

        if (p->key == NGX_HTTP_HERMES_RPC_KEY_TOOL) {
            p->req->tool_type = NGX_HTTP_HERMES_RPC_OTHER;

        } else if (p->key == NGX_HTTP_HERMES_RPC_KEY_SEQ) {
            p->req->seq_type = NGX_HTTP_HERMES_RPC_OTHER;

        } else if (p->key == NGX_HTTP_HERMES_RPC_KEY_TOKEN) {
            p->req->token_type = NGX_HTTP_HERMES_RPC_OTHER;

        } else if (p->key == NGX_HTTP_HERMES_RPC_KEY_ARGS) {
            if (off && p->start[off - 1] == '{') {
                p->req->args_type = NGX_HTTP_HERMES_RPC_OBJECT;
                p->req->args.data = p->start + off - 1;
                p->in_args = 1;

            } else {
                p->req->args_type = NGX_HTTP_HERMES_RPC_OTHER;
            }
        }
    }

    if (++p->depth > NGX_HTTP_HERMES_RPC_DEPTH) {
        return 0;
    }

    return 1;
}


static int
ngx_http_hermes_rpc_p_end(void *ctx)
{
    ngx_http_hermes_rpc_parse_t *p = ctx;

    size_t  off;

    p->depth--;

    if (p->depth == 1 && p->in_args) {
        off = yajl_get_bytes_consumed(p->h);
        p->req->args.len = p->start + off - p->req->args.data;
        p->in_args = 0;
    }

    return 1;
}


static int
ngx_http_hermes_rpc_p_key(void *ctx, const unsigned char *s, size_t len)
{
    ngx_http_hermes_rpc_parse_t *p = ctx;

    ngx_uint_t  key;

    if (p->depth != 1) {
        return 1;
    }

    key = 0;

    if (len == 4 && ngx_strncmp(s, "tool", 4) == 0) {
        key = NGX_HTTP_HERMES_RPC_KEY_TOOL;

    } else if (len == 4 && ngx_strncmp(s, "args", 4) == 0) {
        key = NGX_HTTP_HERMES_RPC_KEY_ARGS;

    } else if (len == 3 && ngx_strncmp(s, "seq", 3) == 0) {
        key = NGX_HTTP_HERMES_RPC_KEY_SEQ;

    } else if (len == 5 && ngx_strncmp(s, "token", 5) == 0) {
        key = NGX_HTTP_HERMES_RPC_KEY_TOKEN;
    }

    if (key & p->keys) {
        /* a key twice: which one would count is a matter of taste */
        return 0;
    }

    p->keys |= key;
    p->key = key;

    return 1;
}


/* the cell's RPC: its request, its kernel, its callbacks */

ngx_http_hermes_rpc_t *
ngx_http_hermes_rpc_create(ngx_pool_t *pool, ngx_http_request_t *r,
    ngx_http_hermes_loc_conf_t *hlcf, ngx_http_hermes_kernel_ref_t *ref,
    ngx_http_hermes_rpc_event_pt event, void *data, ngx_log_t *log)
{
    u_char                  hex[2 * NGX_HTTP_HERMES_TOKEN_LEN + 1];
    ngx_http_hermes_rpc_t  *rpc;

    rpc = ngx_pcalloc(pool, sizeof(ngx_http_hermes_rpc_t));
    if (rpc == NULL) {
        return NULL;
    }

    rpc->pool = pool;
    rpc->log = log;
    rpc->r = r;
    rpc->hlcf = hlcf;
    rpc->zone = hlcf->shm_zone->data;
    rpc->ref = ref;
    rpc->dir_fd = NGX_INVALID_FILE;
    rpc->rpc_fd = NGX_INVALID_FILE;
    rpc->wd = -1;
    rpc->event = event;
    rpc->data = data;

    ngx_queue_init(&rpc->inflight);

    rpc->seen_max = hlcf->max_tool_calls + NGX_HTTP_HERMES_RPC_SEEN_MORE;
    rpc->seen = ngx_palloc(pool, rpc->seen_max * sizeof(uint64_t));
    if (rpc->seen == NULL) {
        return NULL;
    }

    /* the token as hermes_tools.py writes it, for sodium_memcmp */

    sodium_bin2hex((char *) hex, sizeof(hex), ref->token,
                   NGX_HTTP_HERMES_TOKEN_LEN);
    ngx_memcpy(rpc->token, hex, sizeof(rpc->token));
    sodium_memzero(hex, sizeof(hex));

    return rpc;
}


/*
 * The kernel's rpc/ and its watch, verified and kept by the transport (it
 * closes neither: ngx_hermes_local_handles.c), through its verified
 * directory fd; then swept of what an earlier cell left.  Again for a
 * kernel started anew: the old one's is let go.
 */

ngx_int_t
ngx_http_hermes_rpc_open(ngx_http_hermes_rpc_t *rpc, ngx_fd_t dir_fd,
    ngx_fd_t rpc_fd, int wd)
{
    u_char      name[2 * NGX_HTTP_HERMES_TOKEN_LEN + 1];
    ngx_uint_t  i;

    ngx_http_hermes_rpc_close(rpc);

    /* the token of this kernel: a respawn made a new one */

    sodium_bin2hex((char *) name, sizeof(name), rpc->ref->token,
                   NGX_HTTP_HERMES_TOKEN_LEN);
    ngx_memcpy(rpc->token, name, sizeof(rpc->token));
    sodium_memzero(name, sizeof(name));

    rpc->dir_fd = dir_fd;
    rpc->rpc_fd = rpc_fd;
    rpc->wd = wd;

    /*
     * the watch was there first: a request written after the sweep is
     * seen.  Every leftover goes, however many an earlier cell left; past
     * NGX_HTTP_HERMES_RPC_SWEEPS scans the kernel gets no cell (it is
     * ended as one that could not be shipped to), lest the event loop
     * stall on it.
     */

    for (i = 0;
         ngx_http_hermes_rpc_scan(rpc, 1) == NGX_HTTP_HERMES_RPC_SCAN_MAX;
         i++)
    {
        if (i + 1 == NGX_HTTP_HERMES_RPC_SWEEPS) {
            ngx_log_error(NGX_LOG_WARN, rpc->log, 0,
                          "hermes: kernel %*s: more than %d requests left "
                          "in rpc/ by earlier cells (those removed), the "
                          "cell is not run",
                          (size_t) NGX_HTTP_HERMES_ID_LEN,
                          rpc->ref->kernel_id,
                          NGX_HTTP_HERMES_RPC_SWEEPS
                          * NGX_HTTP_HERMES_RPC_SCAN_MAX);
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/*
 * The kernel is on another host: its agent sweeps rpc/ before the cell,
 * watches it, and brings each request whole; "write" takes each answer
 * (res_N, or tool_results/NAME for one archived) there.
 */

void
ngx_http_hermes_rpc_carry(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_write_pt write, void *data)
{
    u_char  hex[2 * NGX_HTTP_HERMES_TOKEN_LEN + 1];

    ngx_http_hermes_rpc_close(rpc);

    sodium_bin2hex((char *) hex, sizeof(hex), rpc->ref->token,
                   NGX_HTTP_HERMES_TOKEN_LEN);
    ngx_memcpy(rpc->token, hex, sizeof(rpc->token));
    sodium_memzero(hex, sizeof(hex));

    rpc->write = write;
    rpc->write_data = data;
    rpc->remote = 1;
}


/* the fd and the watch are the transport's: let go of, not closed */

static void
ngx_http_hermes_rpc_close(ngx_http_hermes_rpc_t *rpc)
{
    rpc->wd = -1;
    rpc->rpc_fd = NGX_INVALID_FILE;

    rpc->dir_fd = NGX_INVALID_FILE;
    rpc->remote = 0;
    rpc->write = NULL;
}


int
ngx_http_hermes_rpc_wd(ngx_http_hermes_rpc_t *rpc)
{
    return rpc->wd;
}


ngx_uint_t
ngx_http_hermes_rpc_calls(ngx_http_hermes_rpc_t *rpc)
{
    return rpc->calls;
}


/* the watch said a name arrived in rpc/ */

void
ngx_http_hermes_rpc_notify(ngx_http_hermes_rpc_t *rpc, u_char *name,
    size_t len)
{
    size_t  n;

    if (rpc->rpc_fd == NGX_INVALID_FILE || len == 0) {
        return;
    }

    n = ngx_strnlen(name, len);

    if (ngx_http_hermes_rpc_name_seq(name, n) == 0) {
        return;                 /* a .tmp, our answers, anything else */
    }

    (void) ngx_http_hermes_rpc_file(rpc, name);
}


/*
 * every request there now: at the start (sweep), or events were lost.
 * -> the names it took, at most NGX_HTTP_HERMES_RPC_SCAN_MAX (more may
 * be there then)
 */

ngx_uint_t
ngx_http_hermes_rpc_scan(ngx_http_hermes_rpc_t *rpc, ngx_uint_t sweep)
{
    u_char            *p;
    size_t             len;
    ssize_t            got;
    ngx_uint_t         n, taken;
    struct dirent64   *de;
    u_char             names[NGX_HTTP_HERMES_RPC_SCAN_MAX][32];
    u_char             buf[4096]
                       __attribute__ ((aligned(__alignof__(struct dirent64))));

    if (rpc->rpc_fd == NGX_INVALID_FILE) {
        return 0;
    }

    /*
     * the kept fd read from its start (the event loop alone uses it):
     * names first, then the files, no reading across our own unlinks
     */

    if (lseek(rpc->rpc_fd, 0, SEEK_SET) == -1) {
        return 0;
    }

    n = 0;

    while (n < NGX_HTTP_HERMES_RPC_SCAN_MAX
           && (got = getdents64(rpc->rpc_fd, buf, sizeof(buf))) > 0)
    {
        for (p = buf;
             p < buf + got && n < NGX_HTTP_HERMES_RPC_SCAN_MAX;
             p += de->d_reclen)
        {
            de = (struct dirent64 *) p;
            len = ngx_strlen(de->d_name);

            if (len >= sizeof(names[0])) {
                continue;
            }

            /* requests; with sweep, answers too; a .tmp is nobody's yet */

            if (ngx_http_hermes_rpc_name_seq((u_char *) de->d_name, len) == 0
                && !(sweep && ngx_strncmp(de->d_name, "res_", 4) == 0
                     && ngx_strlchr((u_char *) de->d_name,
                                    (u_char *) de->d_name + len, '.')
                        == NULL))
            {
                continue;
            }

            ngx_memcpy(names[n], de->d_name, len + 1);
            n++;
        }
    }

    taken = n;

    while (n--) {
        if (sweep) {
            /* an earlier cell's: no authority in this one */
            (void) unlinkat(rpc->rpc_fd, (char *) names[n], 0);
            continue;
        }

        if (ngx_http_hermes_rpc_file(rpc, names[n]) == NGX_DONE) {
            break;
        }
    }

    return taken;
}


/* read a request once and remove it, whatever it is, then check it */

static ngx_int_t
ngx_http_hermes_rpc_file(ngx_http_hermes_rpc_t *rpc, u_char *name)
{
    off_t        size;
    u_char      *data;
    ssize_t      n;
    ngx_fd_t     fd;
    ngx_int_t    rc;
    ngx_pool_t  *pool;

    fd = ngx_http_hermes_local_open_at(rpc->rpc_fd, (char *) name, &size);

    if (fd == NGX_INVALID_FILE) {
        if (ngx_errno == NGX_ENOENT) {
            return NGX_OK;       /* taken already, or withdrawn */
        }

        /* a FIFO, a symlink, a directory: nothing to read, only to count */
        (void) unlinkat(rpc->rpc_fd, (char *) name, 0);
        return ngx_http_hermes_rpc_request(rpc, name, ngx_strlen(name),
                                           NULL, 0);
    }

    (void) unlinkat(rpc->rpc_fd, (char *) name, 0);

    if (size > (off_t) rpc->hlcf->max_code) {
        close(fd);
        return ngx_http_hermes_rpc_request(rpc, name, ngx_strlen(name),
                                           NULL, 0);
    }

    pool = ngx_create_pool(4096, rpc->log);
    if (pool == NULL) {
        close(fd);
        return NGX_ERROR;
    }

    data = ngx_pnalloc(pool, (size_t) size + 1);
    if (data == NULL) {
        close(fd);
        ngx_destroy_pool(pool);
        return NGX_ERROR;
    }

    n = pread(fd, data, (size_t) size + 1, 0);
    close(fd);

    /* grown while we read: not a request written whole */

    rc = ngx_http_hermes_rpc_request(rpc, name, ngx_strlen(name),
                                     (n == -1 || n > size) ? NULL : data,
                                     (n == -1 || n > size) ? 0 : (size_t) n);

    ngx_destroy_pool(pool);

    return rc;
}


/*
 * A request read whole (data NULL: it could not be, as it stood), from
 * rpc/ here or by the kernel host's agent: the same checks either way,
 * here, whatever the host side did before.  NGX_DONE: the channel was
 * closed meanwhile.
 */

ngx_int_t
ngx_http_hermes_rpc_request(ngx_http_hermes_rpc_t *rpc, u_char *name,
    size_t len, u_char *data, size_t n)
{
    u_char                     *p;
    ngx_int_t                   rc;
    ngx_http_hermes_rpc_req_t   req;
    u_char                      text[32 * 4];

    if (rpc->rpc_fd == NGX_INVALID_FILE && !rpc->remote) {
        return NGX_DONE;        /* the cell's authority ended */
    }

    if (data == NULL) {
        req.reject = NGX_HTTP_HERMES_RPC_MALFORMED;
        goto reject;
    }

    rc = ngx_http_hermes_rpc_check(data, n,
                                   ngx_http_hermes_rpc_name_seq(name, len),
                                   rpc->token, sizeof(rpc->token),
                                   rpc->seen, rpc->nseen, &req);

    if (rc == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (rc == NGX_OK) {
        ngx_http_hermes_rpc_take(rpc, &req);

        return (rpc->rpc_fd == NGX_INVALID_FILE && !rpc->remote)
               ? NGX_DONE : NGX_OK;
    }

reject:

    ngx_http_hermes_count(rpc->zone, rpc_rejected_total[req.reject]);

    if (ngx_http_hermes_rpc_log_slot(rpc, 1)) {
        /* the name is the cell's: escaped */
        p = ngx_http_hermes_log_escape(text, text + sizeof(text), name,
                                       ngx_min(len, 32), 1);

        ngx_log_error(NGX_LOG_WARN, rpc->log, 0,
                      "hermes: kernel %*s: tool call request \"%*s\" "
                      "rejected (%V): removed, not answered",
                      (size_t) NGX_HTTP_HERMES_ID_LEN, rpc->ref->kernel_id,
                      p - text, text,
                      &ngx_http_hermes_rpc_reject_names[req.reject]);
    }

    return NGX_OK;
}


/*
 * The kernel's log budget for rejections (per worker, in slots by id: a
 * collision only shares a budget).  "take": one line wanted; 1 when it
 * may be logged.  The lines held back are summed up in one line when the
 * window rolls over or the cell ends.
 */

static ngx_uint_t
ngx_http_hermes_rpc_log_slot(ngx_http_hermes_rpc_t *rpc, ngx_uint_t take)
{
    ngx_http_hermes_rpc_log_t  *l;

    static ngx_http_hermes_rpc_log_t  slots[NGX_HTTP_HERMES_RPC_LOG_SLOTS];

    l = &slots[ngx_crc32_short(rpc->ref->kernel_id, NGX_HTTP_HERMES_ID_LEN)
               % NGX_HTTP_HERMES_RPC_LOG_SLOTS];

    if (ngx_memcmp(l->kernel_id, rpc->ref->kernel_id, NGX_HTTP_HERMES_ID_LEN)
        != 0)
    {
        if (!take) {
            return 0;
        }

        /* taken over: the last kernel's summary first */

    } else if (take
               && ngx_current_msec - l->since < NGX_HTTP_HERMES_RPC_LOG_WINDOW)
    {
        if (l->logged < NGX_HTTP_HERMES_RPC_LOG_BURST) {
            l->logged++;
            return 1;
        }

        l->more++;
        return 0;
    }

    if (l->more) {
        ngx_log_error(NGX_LOG_WARN, rpc->log, 0,
                      "hermes: kernel %*s: %ui more tool call request(s) "
                      "rejected, not logged (rpc_rejected_total counts "
                      "them all)", (size_t) NGX_HTTP_HERMES_ID_LEN,
                      l->kernel_id, l->more);
        l->more = 0;
    }

    if (!take) {
        return 0;
    }

    /* a new window */

    ngx_memcpy(l->kernel_id, rpc->ref->kernel_id, NGX_HTTP_HERMES_ID_LEN);
    l->since = ngx_current_msec;
    l->logged = 1;

    return 1;
}


/*
 * A tool name: 1-128 of A-Z a-z 0-9 _ - . (MCP's names; nothing that could
 * end a header or a log line).  hermes_tools and every call are held to it.
 */

ngx_uint_t
ngx_http_hermes_tool_name_valid(u_char *name, size_t len)
{
    u_char  c, *last;

    if (len == 0 || len > NGX_HTTP_HERMES_RPC_TOOL_MAX) {
        return 0;
    }

    for (last = name + len; name < last; name++) {
        c = *name;

        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
              || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.'))
        {
            return 0;
        }
    }

    return 1;
}


/* an authenticated request: the allow-list, the budget, the call */

static void
ngx_http_hermes_rpc_take(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_req_t *req)
{
    ngx_str_t                   *name;
    ngx_uint_t                   i, allowed;
    ngx_http_hermes_mcp_peer_t  *peer;

    if (rpc->nseen == rpc->seen_max) {
        ngx_http_hermes_rpc_answer_error(rpc, req->seq,
                     (u_char *) "the cell's budget of %ui tool calls is spent "
                     "(hermes_max_tool_calls)", rpc->hlcf->max_tool_calls);
        return;
    }

    rpc->seen[rpc->nseen++] = req->seq;

    /* "tools/list" (no tool's name): the schemas of hermes_tools' stubs */

    if (req->tool_type == NGX_HTTP_HERMES_RPC_STRING
        && req->tool.len == sizeof("tools/list") - 1
        && ngx_strncmp(req->tool.data, "tools/list", req->tool.len) == 0)
    {
        peer = rpc->hlcf->tools_auto
               ? ngx_http_hermes_mcp_peer(&rpc->hlcf->tools_pass) : NULL;

        if (peer == NULL || peer->schemas
            || rpc->hlcf->tools_protocol != NGX_HTTP_HERMES_TOOLS_MCP)
        {
            ngx_http_hermes_schema_list(rpc, req->seq);

        } else if (rpc->r == NULL
                   || ngx_http_hermes_rpc_dispatch(rpc, req) != NGX_OK)
        {
            ngx_http_hermes_rpc_answer_error(rpc, req->seq,
                         (u_char *) "the MCP server's tools could not be "
                         "listed");
        }

        return;
    }

    /* before any use (a header, a log line, MCP's first steps): the name */

    if (req->tool_type != NGX_HTTP_HERMES_RPC_STRING
        || !ngx_http_hermes_tool_name_valid(req->tool.data, req->tool.len))
    {
        ngx_http_hermes_rpc_answer_error(rpc, req->seq,
                     (u_char *) "a tool call needs \"tool\": a name of "
                     "1-%d of A-Z a-z 0-9 _ - .", NGX_HTTP_HERMES_RPC_TOOL_MAX);
        return;
    }

    if (req->args_type != 0 && req->args_type != NGX_HTTP_HERMES_RPC_OBJECT) {
        ngx_http_hermes_rpc_answer_error(rpc, req->seq,
                     (u_char *) "\"args\" of tool \"%V\" must be an object",
                     &req->tool);
        return;
    }

    allowed = 0;

    if (rpc->hlcf->tools_auto) {
        /* the MCP server's tools/list says, now (cached) or before the call */
        peer = ngx_http_hermes_mcp_peer(&rpc->hlcf->tools_pass);
        allowed = (peer == NULL || !peer->listed
                   || ngx_http_hermes_mcp_peer_has(peer, &req->tool,
                                                   rpc->pool)
                      == NGX_OK);

    } else if (rpc->hlcf->tools) {
        name = rpc->hlcf->tools->elts;

        for (i = 0; i < rpc->hlcf->tools->nelts; i++) {
            if (name[i].len == req->tool.len
                && ngx_strncmp(name[i].data, req->tool.data, req->tool.len)
                   == 0)
            {
                allowed = 1;
                break;
            }
        }
    }

    if (!allowed) {
        ngx_http_hermes_rpc_answer_error(rpc, req->seq,
                     rpc->hlcf->tools_auto
                     ? (u_char *) "tool \"%V\": not one of the MCP server's "
                                  "tools (tools/list)"
                     : (u_char *) "tool \"%V\" is not enabled here",
                     &req->tool);
        return;
    }

    if (rpc->calls >= rpc->hlcf->max_tool_calls) {
        ngx_http_hermes_rpc_answer_error(rpc, req->seq,
                     (u_char *) "the cell's budget of %ui tool calls is spent "
                     "(hermes_max_tool_calls)", rpc->hlcf->max_tool_calls);
        return;
    }

    if (rpc->r == NULL) {
        ngx_http_hermes_rpc_answer_error(rpc, req->seq,
                     (u_char *) "the client that started this cell has "
                     "disconnected; tool calls run on its behalf, so there "
                     "are no more in this cell");
        return;
    }

    if (ngx_http_hermes_rpc_dispatch(rpc, req) != NGX_OK) {
        ngx_http_hermes_rpc_answer_error(rpc, req->seq,
                     (u_char *) "the gateway could not make the tool call");
    }
}


/* the call: background subrequests, so the cell's stream goes on */

static ngx_int_t
ngx_http_hermes_rpc_dispatch(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_req_t *req)
{
    ngx_str_t                    args;
    ngx_pool_cleanup_t          *cln;
    ngx_http_request_t          *r;
    ngx_http_hermes_rpc_call_t  *call;

    r = rpc->r;

    if (rpc->hlcf->tools_pass.len == 0) {
        return NGX_ERROR;
    }

    call = ngx_pcalloc(r->pool, sizeof(ngx_http_hermes_rpc_call_t));
    if (call == NULL) {
        return NGX_ERROR;
    }

    if (req->args_type == NGX_HTTP_HERMES_RPC_OBJECT) {
        args = req->args;

    } else {
        ngx_str_set(&args, "{}");
    }

    /* the request's buffer goes when this returns; the call stays */

    call->tool.data = ngx_pstrdup(r->pool, &req->tool);
    call->args.data = ngx_pstrdup(r->pool, &args);

    if (call->tool.data == NULL || call->args.data == NULL) {
        return NGX_ERROR;
    }

    call->tool.len = req->tool.len;
    call->args.len = args.len;
    call->list_only = (req->tool.len == sizeof("tools/list") - 1
                       && ngx_strncmp(req->tool.data, "tools/list",
                                      req->tool.len)
                          == 0);
    call->rpc = rpc;
    call->seq = req->seq;
    call->start = ngx_current_msec;
    call->cap = ngx_max(rpc->hlcf->max_stream, rpc->hlcf->max_output);

    /* the answer's buffer is the heap's: freed once passed on */

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_hermes_rpc_call_free;
    cln->data = call;

    if (rpc->running >= NGX_HTTP_HERMES_RPC_RUNNING) {
        call->waiting = 1;

    } else if (ngx_http_hermes_rpc_start(rpc, call) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_queue_insert_tail(&rpc->inflight, &call->queue);

    if (!call->list_only) {
        rpc->calls++;
        ngx_http_hermes_count(rpc->zone, tool_calls_total);

        ngx_http_hermes_rpc_emit(rpc, "tool_call", &call->tool, call->seq,
                                 -1, 0);
    }

    /* it may be over by the time this returns (a refused connection) */

    if (rpc->r) {
        ngx_http_run_posted_requests(r->connection);
    }

    return NGX_OK;
}


/* a call's first subrequest: the POST, or its MCP session's next step */

static ngx_int_t
ngx_http_hermes_rpc_start(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call)
{
    call->waiting = 0;

    if (rpc->hlcf->tools_protocol == NGX_HTTP_HERMES_TOOLS_MCP) {
        call->peer = ngx_http_hermes_mcp_peer(&rpc->hlcf->tools_pass);
        if (call->peer == NULL) {
            return NGX_ERROR;
        }

        /* the kernel's own session with this server, or a new one */

        call->ms.peer = ngx_crc32_short(rpc->hlcf->tools_pass.data,
                                        rpc->hlcf->tools_pass.len);
        if (call->ms.peer == 0) {
            call->ms.peer = 1;
        }

        /* sessions of kernels that ended, ended with this server too */

        ngx_http_hermes_mcp_end_sessions(rpc, call->ms.peer);

        if (ngx_http_hermes_registry_mcp_session(rpc->zone, rpc->ref,
                                                 &call->ms)
            != NGX_OK)
        {
            if (rpc->mcp_initializing) {
                /* one initialize at a time: this call waits for its end */
                call->waiting = 1;
                return NGX_OK;
            }

            rpc->mcp_initializing = 1;
            call->initializer = 1;
            call->step = NGX_HTTP_HERMES_MCP_INIT;

        } else if (call->list_only
                   || (rpc->hlcf->tools_auto && !call->peer->listed))
        {
            call->step = NGX_HTTP_HERMES_MCP_LIST;

        } else {
            call->step = NGX_HTTP_HERMES_MCP_CALL;
        }
    }

    if (ngx_http_hermes_rpc_subrequest(rpc, call) != NGX_OK) {
        if (call->initializer) {
            /* the next waiting call makes the session instead */
            call->initializer = 0;
            rpc->mcp_initializing = 0;
        }

        return NGX_ERROR;
    }

    rpc->running++;

    return NGX_OK;
}


/* a call ended: the first that waits starts */

void
ngx_http_hermes_rpc_next(ngx_http_hermes_rpc_t *rpc)
{
    ngx_queue_t                 *q;
    ngx_http_hermes_rpc_call_t  *call;

    q = ngx_queue_head(&rpc->inflight);

    while (q != ngx_queue_sentinel(&rpc->inflight)
           && rpc->running < NGX_HTTP_HERMES_RPC_RUNNING && rpc->r)
    {
        call = ngx_queue_data(q, ngx_http_hermes_rpc_call_t, queue);
        q = ngx_queue_next(q);

        if (!call->waiting) {
            continue;
        }

        if (ngx_http_hermes_rpc_start(rpc, call) != NGX_OK) {
            ngx_queue_remove(&call->queue);
            call->rpc = NULL;
            ngx_http_hermes_rpc_answer_error(rpc, call->seq,
                         (u_char *) "the gateway could not make the tool call");
        }
    }
}


static void
ngx_http_hermes_rpc_call_free(void *data)
{
    ngx_http_hermes_rpc_call_t *call = data;

    if (call->stream.posted) {
        ngx_delete_posted_event(&call->stream);
    }

    if (call->resume.timer_set) {
        ngx_del_timer(&call->resume);
    }

    if (call->list) {
        ngx_free(call->list);
        call->list = NULL;
    }

    if (call->schemas) {
        ngx_free(call->schemas);
        call->schemas = NULL;
        call->schemas_len = 0;
    }

    if (call->body) {
        ngx_free(call->body);
        call->body = NULL;
    }

    call->size = 0;
    call->len = 0;
}


/* one subrequest of a call: the hermes POST, or an MCP step */

ngx_int_t
ngx_http_hermes_rpc_subrequest(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call)
{
    ngx_buf_t           *b;
    ngx_str_t            owner;
    ngx_http_request_t  *sr;

    if (rpc->r == NULL) {
        return NGX_ERROR;
    }

    /* the owner of no hermes_owner is "\001anonymous": no header has that */

    owner = rpc->ref->owner;

    if (owner.len && owner.data[0] == '\001') {
        owner.data++;
        owner.len--;
    }

    /* a resumed stream is a GET, without a body */

    if (call->step == NGX_HTTP_HERMES_MCP_RESUME) {
        b = NULL;

    } else {
        b = ngx_http_hermes_rpc_body(rpc, call);
        if (b == NULL) {
            return NGX_ERROR;
        }
    }

    sr = ngx_http_hermes_rpc_post(rpc, call, b);
    if (sr == NULL) {
        return NGX_ERROR;
    }

    call->status = 0;
    call->len = 0;
    call->too_big = 0;
    call->whole = 0;
    call->sse = 0;
    call->session.len = 0;
    call->scanned = 0;

    if (ngx_http_hermes_rpc_header(sr, "X-Hermes-Owner", owner.data,
                                   owner.len)
        != NGX_OK
        || ngx_http_hermes_rpc_header(sr, "X-Hermes-Session",
                                      rpc->ref->session.data,
                                      rpc->ref->session.len)
           != NGX_OK
        || ngx_http_hermes_rpc_header(sr, "X-Hermes-Kernel-Id",
                                      rpc->ref->kernel_id,
                                      NGX_HTTP_HERMES_ID_LEN)
           != NGX_OK
        || ngx_http_hermes_rpc_header(sr, "X-Hermes-Tool", call->tool.data,
                                      call->tool.len)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * A background subrequest of the cell's request to hermes_tools_pass, for
 * "call": a POST of "body" (JSON), or a DELETE without one (body NULL),
 * with our headers only, never the client's: its content headers and, in
 * an MCP session (any step after initialize), the kernel's session and
 * protocol version.  The caller adds its own; NULL: it could not be made.
 */

ngx_http_request_t *
ngx_http_hermes_rpc_post(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, ngx_buf_t *body)
{
    u_char                      *p;
    ngx_str_t                    accept;
    ngx_chain_t                 *cl;
    ngx_http_request_t          *r, *sr;
    ngx_http_request_body_t     *rb;
    ngx_http_post_subrequest_t  *ps;

    r = rpc->r;

    if (r == NULL) {
        return NULL;
    }

    ps = ngx_palloc(r->pool, sizeof(ngx_http_post_subrequest_t));
    rb = ngx_pcalloc(r->pool, sizeof(ngx_http_request_body_t));

    if (ps == NULL || rb == NULL) {
        return NULL;
    }

    ps->handler = ngx_http_hermes_rpc_done;
    ps->data = call;

    if (ngx_http_subrequest(r, &rpc->hlcf->tools_pass, NULL, &sr, ps,
                            NGX_HTTP_SUBREQUEST_BACKGROUND)
        != NGX_OK)
    {
        return NULL;
    }

    call->sr = sr;

    ngx_memzero(&sr->headers_in, sizeof(ngx_http_headers_in_t));
    sr->headers_in.keep_alive_n = -1;

    /* an empty body, not the cell request's that the subrequest inherits */

    sr->request_body = rb;
    sr->request_body_in_single_buf = 1;

    if (ngx_list_init(&sr->headers_in.headers, r->pool, 10,
                      sizeof(ngx_table_elt_t))
        != NGX_OK)
    {
        return NULL;
    }

    if (call->step && call->step != NGX_HTTP_HERMES_MCP_INIT) {

        /* the kernel's session: the call's copy lives with sr */

        if (call->ms.session_len) {
            call->used_session = 1;

            if (ngx_http_hermes_rpc_header(sr, "Mcp-Session-Id",
                                           call->ms.session,
                                           call->ms.session_len)
                != NGX_OK)
            {
                return NULL;
            }
        }

        if (call->ms.version_len
            && ngx_http_hermes_rpc_header(sr, "MCP-Protocol-Version",
                                          call->ms.version,
                                          call->ms.version_len)
               != NGX_OK)
        {
            return NULL;
        }
    }

    if (body == NULL && call->step == NGX_HTTP_HERMES_MCP_RESUME) {
        /* tools/call's stream again, from its last event (2025-11-25) */

        sr->method = NGX_HTTP_GET;
        ngx_str_set(&sr->method_name, "GET");
        sr->headers_in.content_length_n = 0;

        if (ngx_http_hermes_rpc_header(sr, "Accept",
                                       (u_char *) "text/event-stream",
                                       sizeof("text/event-stream") - 1)
            != NGX_OK
            || ngx_http_hermes_rpc_header(sr, "Last-Event-ID", call->last_id,
                                          call->last_id_len)
               != NGX_OK)
        {
            return NULL;
        }

        return sr;
    }

    if (body == NULL) {
        sr->method = NGX_HTTP_DELETE;
        ngx_str_set(&sr->method_name, "DELETE");
        sr->headers_in.content_length_n = 0;
        return sr;
    }

    sr->method = NGX_HTTP_POST;
    ngx_str_set(&sr->method_name, "POST");
    sr->headers_in.content_length_n = body->last - body->pos;

    p = ngx_pnalloc(r->pool, NGX_OFF_T_LEN);
    cl = ngx_alloc_chain_link(r->pool);

    if (p == NULL || cl == NULL) {
        return NULL;
    }

    if (call->step) {
        ngx_str_set(&accept, "application/json, text/event-stream");

    } else {
        ngx_str_set(&accept, "application/json");
    }

    if (ngx_http_hermes_rpc_header(sr, "Content-Type",
                                   (u_char *) "application/json",
                                   sizeof("application/json") - 1)
        != NGX_OK
        || ngx_http_hermes_rpc_header(sr, "Content-Length", p,
                                      ngx_sprintf(p, "%O",
                                          sr->headers_in.content_length_n)
                                      - p)
           != NGX_OK
        || ngx_http_hermes_rpc_header(sr, "Accept", accept.data, accept.len)
           != NGX_OK)
    {
        return NULL;
    }

    cl->buf = body;
    cl->next = NULL;
    rb->bufs = cl;
    rb->buf = body;

    return sr;
}


/* the body of a call's subrequest: the hermes protocol's, or an MCP step's */

static ngx_buf_t *
ngx_http_hermes_rpc_body(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call)
{
    u_char     *p;
    size_t      len;
    ngx_buf_t  *b;

    if (call->step) {
        return ngx_http_hermes_mcp_body(rpc, call);
    }

    /* the hermes protocol: {"tool","args","session","kernel_id"} */

    len = sizeof("{\"tool\":,\"args\":,\"session\":,\"kernel_id\":\"\"}") - 1
          + ngx_escape_json(NULL, call->tool.data, call->tool.len)
          + call->tool.len + 2 + call->args.len
          + ngx_escape_json(NULL, rpc->ref->session.data,
                            rpc->ref->session.len)
          + rpc->ref->session.len + 2 + NGX_HTTP_HERMES_ID_LEN;

    b = ngx_create_temp_buf(rpc->r->pool, len);
    if (b == NULL) {
        return NULL;
    }

    p = ngx_cpymem(b->last, "{\"tool\":\"", sizeof("{\"tool\":\"") - 1);
    p = (u_char *) ngx_escape_json(p, call->tool.data, call->tool.len);
    p = ngx_cpymem(p, "\",\"args\":", sizeof("\",\"args\":") - 1);
    p = ngx_cpymem(p, call->args.data, call->args.len);
    p = ngx_cpymem(p, ",\"session\":\"", sizeof(",\"session\":\"") - 1);
    p = (u_char *) ngx_escape_json(p, rpc->ref->session.data,
                                   rpc->ref->session.len);
    p = ngx_cpymem(p, "\",\"kernel_id\":\"", sizeof("\",\"kernel_id\":\"") - 1);
    p = ngx_cpymem(p, rpc->ref->kernel_id, NGX_HTTP_HERMES_ID_LEN);
    p = ngx_cpymem(p, "\"}", 2);

    b->last = p;
    b->last_buf = 1;

    return b;
}


ngx_int_t
ngx_http_hermes_rpc_header(ngx_http_request_t *sr, char *key, u_char *value,
    size_t len)
{
    size_t            klen;
    ngx_table_elt_t  *h;

    h = ngx_list_push(&sr->headers_in.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    klen = ngx_strlen(key);

    h->key.data = (u_char *) key;
    h->key.len = klen;
    h->value.data = value;
    h->value.len = len;

    h->lowcase_key = ngx_pnalloc(sr->pool, klen);
    if (h->lowcase_key == NULL) {
        return NGX_ERROR;
    }

    h->hash = ngx_hash_strlow(h->lowcase_key, (u_char *) key, klen);

    if (klen == sizeof("Content-Type") - 1
        && ngx_strcmp(key, "Content-Type") == 0)
    {
        sr->headers_in.content_type = h;

    } else if (klen == sizeof("Content-Length") - 1
               && ngx_strcmp(key, "Content-Length") == 0)
    {
        sr->headers_in.content_length = h;
    }

    return NGX_OK;
}


/* a subrequest is over: the next MCP step, or the answer in res_N */

ngx_int_t
ngx_http_hermes_rpc_done(ngx_http_request_t *sr, void *data, ngx_int_t rc)
{
    ngx_http_hermes_rpc_call_t *call = data;

    ngx_http_hermes_rpc_t  *rpc;

    if (sr != call->sr || rc == NGX_AGAIN) {
        return NGX_OK;
    }

    call->sr = NULL;
    rpc = call->rpc;

    if (rpc == NULL) {
        return NGX_OK;
    }

    if (call->step) {
        rc = ngx_http_hermes_mcp_next(rpc, call, rc);

        if (rc == NGX_AGAIN) {
            return NGX_OK;
        }

        if (call->initializer) {
            /* it failed to make the session: the next waiting call tries */
            call->initializer = 0;
            rpc->mcp_initializing = 0;
        }
    }

    ngx_http_hermes_rpc_finish(rpc, call, rc);

    /*
     * Whatever the endpoint did, it is the code's ToolError, never the
     * client's error: an NGX_ERROR here would end the cell's request.
     */

    return NGX_OK;
}


/* a call is over (rc as rpc_done gives it): its answer, the next call */

void
ngx_http_hermes_rpc_finish(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, ngx_int_t rc)
{
    ngx_queue_remove(&call->queue);
    call->rpc = NULL;
    rpc->running--;

    ngx_http_hermes_rpc_outcome(rpc, call, rc);
    ngx_http_hermes_rpc_call_free(call);

    ngx_http_hermes_rpc_next(rpc);
}


/* the endpoint's status, as nginx or the endpoint gave it */

ngx_uint_t
ngx_http_hermes_rpc_status(ngx_http_hermes_rpc_call_t *call, ngx_int_t rc)
{
    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        /* nginx's own answer: the upstream failed or timed out */
        return rc;
    }

    if (rc == NGX_ERROR || call->status == 0) {
        return NGX_HTTP_BAD_GATEWAY;
    }

    return call->status;
}


static void
ngx_http_hermes_rpc_outcome(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, ngx_int_t rc)
{
    ngx_int_t   ok;
    ngx_str_t   msg;
    ngx_uint_t  status;

    ok = 0;

    if (rc == NGX_DONE) {
        /* an MCP step said why */
        ngx_http_hermes_rpc_answer_error(rpc, call->seq,
                     (u_char *) "tool \"%V\": %V", &call->tool, &call->err);
        goto done;
    }

    status = ngx_http_hermes_rpc_status(call, rc);

    if (call->too_big) {
        ngx_http_hermes_rpc_answer_error(rpc, call->seq,
                     (u_char *) "tool \"%V\": its answer is larger than "
                     "%uz bytes", &call->tool, call->cap);

    } else if (status < 200 || status > 299) {
        ngx_http_hermes_rpc_message(call->body, call->len, &msg);

        if (msg.len) {
            ngx_http_hermes_rpc_answer_error(rpc, call->seq,
                     (u_char *) "tool \"%V\" failed (HTTP %ui): %V",
                     &call->tool, status, &msg);

        } else if (status == NGX_HTTP_GATEWAY_TIME_OUT) {
            ngx_http_hermes_rpc_answer_error(rpc, call->seq,
                     (u_char *) "tool \"%V\": the tool endpoint did not "
                     "answer in time (HTTP 504)", &call->tool);

        } else if (status == NGX_HTTP_BAD_GATEWAY
                   || status == NGX_HTTP_SERVICE_UNAVAILABLE)
        {
            ngx_http_hermes_rpc_answer_error(rpc, call->seq,
                     (u_char *) "tool \"%V\": the tool endpoint is "
                     "unavailable (HTTP %ui)", &call->tool, status);

        } else {
            ngx_http_hermes_rpc_answer_error(rpc, call->seq,
                     (u_char *) "tool \"%V\": the tool endpoint answered "
                     "HTTP %ui", &call->tool, status);
        }

    } else if (call->list_only) {
        ngx_http_hermes_schema_list(rpc, call->seq);
        return;

    } else if (call->step) {
        ok = ngx_http_hermes_mcp_answer(rpc, call);

    } else {
        rc = ngx_http_hermes_rpc_answer_ok(rpc, call->seq, call->body,
                                           call->len);

        if (rc == NGX_DECLINED) {
            ngx_http_hermes_rpc_answer_error(rpc, call->seq,
                     (u_char *) "tool \"%V\": the tool endpoint's answer is "
                     "not JSON", &call->tool);

        } else if (rc != NGX_OK) {
            /* tool_results/ not ours, no memory: the code must not wait */
            ngx_http_hermes_rpc_answer_error(rpc, call->seq,
                     (u_char *) "tool \"%V\": its answer could not be "
                     "passed on (see the gateway's error log)", &call->tool);

        } else {
            ok = 1;
        }
    }

done:

    if (call->list_only) {
        return;
    }

    ngx_http_hermes_rpc_emit(rpc, "tool_done", &call->tool, call->seq, ok,
                             ngx_current_msec - call->start);
}


/* an error answer's message: "error" (a string, or its "message"), or
 * "message"; bounded, whole characters */

typedef struct {
    ngx_uint_t                      depth;
    ngx_uint_t                      key;        /* 1: error, 2: message */
    ngx_uint_t                      in_error;
    ngx_str_t                      *msg;
    u_char                         *buf;
} ngx_http_hermes_rpc_msg_t;


static int
ngx_http_hermes_rpc_m_string(void *ctx, const unsigned char *s, size_t len)
{
    ngx_http_hermes_rpc_msg_t *m = ctx;

    if (m->msg->len
        || !((m->depth == 1 && m->key)
             || (m->depth == 2 && m->in_error && m->key == 2)))
    {
        return 1;
    }

    len = ngx_min(len, NGX_HTTP_HERMES_RPC_ERROR_MAX);
    len = ngx_http_hermes_rpc_utf8_cut((u_char *) s, len, 1);

    ngx_memcpy(m->buf, s, len);
    m->msg->data = m->buf;
    m->msg->len = len;

    return 1;
}


static int
ngx_http_hermes_rpc_m_key(void *ctx, const unsigned char *s, size_t len)
{
    ngx_http_hermes_rpc_msg_t *m = ctx;

    m->key = 0;

    if (len == 5 && ngx_strncmp(s, "error", 5) == 0) {
        m->key = 1;

    } else if (len == 7 && ngx_strncmp(s, "message", 7) == 0) {
        m->key = 2;
    }

    return 1;
}


static int
ngx_http_hermes_rpc_m_start(void *ctx)
{
    ngx_http_hermes_rpc_msg_t *m = ctx;

    m->in_error = (m->depth == 1 && m->key == 1);
    m->depth++;
    m->key = 0;

    return m->depth <= NGX_HTTP_HERMES_RPC_DEPTH;
}


static int
ngx_http_hermes_rpc_m_end(void *ctx)
{
    ngx_http_hermes_rpc_msg_t *m = ctx;

    m->depth--;

    if (m->depth <= 1) {
        m->in_error = 0;
    }

    m->key = 0;

    return 1;
}


static yajl_callbacks  ngx_http_hermes_rpc_msg_callbacks = {
    NULL, NULL, NULL, NULL, NULL,
    ngx_http_hermes_rpc_m_string,
    ngx_http_hermes_rpc_m_start,
    ngx_http_hermes_rpc_m_key,
    ngx_http_hermes_rpc_m_end,
    ngx_http_hermes_rpc_m_start,
    ngx_http_hermes_rpc_m_end
};


static void
ngx_http_hermes_rpc_message(u_char *body, size_t len, ngx_str_t *msg)
{
    yajl_handle                h;
    ngx_http_hermes_rpc_msg_t  m;
    static u_char              buf[NGX_HTTP_HERMES_RPC_ERROR_MAX];

    msg->len = 0;

    if (body == NULL || len == 0) {
        return;
    }

    ngx_memzero(&m, sizeof(ngx_http_hermes_rpc_msg_t));
    m.msg = msg;
    m.buf = buf;

    h = yajl_alloc(&ngx_http_hermes_rpc_msg_callbacks, NULL, &m);
    if (h == NULL) {
        return;
    }

    (void) yajl_parse(h, body, len);
    yajl_free(h);
}


/* bytes up to a character boundary: back, the start of the last whole one */

size_t
ngx_http_hermes_rpc_utf8_cut(u_char *p, size_t len, ngx_uint_t back)
{
    size_t  i, need;

    if (!back) {
        /* a tail: skip continuation bytes at its start */
        for (i = 0; i < len && (p[i] & 0xc0) == 0x80; i++) { /* void */ }
        return i;
    }

    /* the last lead byte, and whether its character is whole */

    for (i = len; i > 0 && (p[i - 1] & 0xc0) == 0x80; i--) { /* void */ }

    if (i == 0) {
        return 0;
    }

    need = (p[i - 1] >= 0xf0) ? 4 : (p[i - 1] >= 0xe0) ? 3
           : (p[i - 1] >= 0xc0) ? 2 : 1;

    return (len - (i - 1) >= need) ? len : i - 1;
}


/*
 * A tool's answer, JSON, for the code (archived when over
 * hermes_max_output).  NGX_DECLINED: it is not JSON; NGX_ERROR: it could
 * not be passed on (logged, or no memory).
 */

ngx_int_t
ngx_http_hermes_rpc_answer_ok(ngx_http_hermes_rpc_t *rpc, uint64_t seq,
    u_char *body, size_t len)
{
    u_char       *p, *data;
    ngx_int_t     rc;
    yajl_handle   h;
    yajl_status   st;

    if (body == NULL || len == 0) {
        return NGX_DECLINED;
    }

    h = yajl_alloc(NULL, NULL, NULL);
    if (h == NULL) {
        return NGX_ERROR;
    }

    st = yajl_parse(h, body, len);
    if (st == yajl_status_ok) {
        st = yajl_complete_parse(h);
    }

    yajl_free(h);

    if (st != yajl_status_ok) {
        return NGX_DECLINED;
    }

    if (len > rpc->hlcf->max_output) {
        return ngx_http_hermes_rpc_archive(rpc, seq, body, len);
    }

    data = ngx_pnalloc(rpc->pool, len + 64 + NGX_INT64_LEN);
    if (data == NULL) {
        return NGX_ERROR;
    }

    p = ngx_sprintf(data, "{\"seq\":%uL,\"ok\":true,\"error\":null,"
                    "\"result\":", seq);
    p = ngx_cpymem(p, body, len);
    *p++ = '}';

    rc = ngx_http_hermes_rpc_write(rpc, seq, data, p - data);

    ngx_pfree(rpc->pool, data);

    return rc;
}


/*
 * An answer over hermes_max_output: the whole of it in the kernel dir,
 * tool_results/ (0700) and a file of it (0600); the code gets its path,
 * its size, and its head and tail (40% and 60% of hermes_max_output).
 */

static ngx_int_t
ngx_http_hermes_rpc_archive(ngx_http_hermes_rpc_t *rpc, uint64_t seq,
    u_char *body, size_t len)
{
    u_char                *p, *end;
    size_t                 h, t, n;
    ngx_fd_t               fd;
    ngx_int_t              rc;
    yajl_gen               g;
    ngx_uint_t             made;
    ngx_file_info_t        fi;
    u_char                 name[64], path[96];

    ngx_sprintf(name, "cell_%06uD_%06uL.json%Z", rpc->ref->cell_id, seq);
    end = ngx_sprintf(path, "tool_results/%s", name);

    if (rpc->remote) {
        /* the agent makes tool_results/ as it would be made here */
        if (rpc->write(rpc->write_data, path, end - path, body, len)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        goto answer;
    }

    made = 1;

    if (mkdirat(rpc->dir_fd, "tool_results", 0700) == -1) {
        if (ngx_errno != EEXIST) {
            ngx_log_error(NGX_LOG_ERR, rpc->log, ngx_errno,
                          "hermes: mkdir(\"%s/tool_results\") failed",
                          rpc->ref->dir);
            return NGX_ERROR;
        }

        made = 0;
    }

    /* the code may have made it, or a link in its place: not followed */

    fd = openat(rpc->dir_fd, "tool_results",
                O_RDONLY|O_DIRECTORY|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC);
    if (fd == NGX_INVALID_FILE) {
        ngx_log_error(NGX_LOG_ERR, rpc->log, ngx_errno,
                      "hermes: \"%s/tool_results\" is not a directory",
                      rpc->ref->dir);
        return NGX_ERROR;
    }

    /* owner-only, the kernel's; one a root worker just made is given to it */

    if (ngx_fd_info(fd, &fi) == NGX_FILE_ERROR
        || !ngx_is_dir(&fi)
        || (fi.st_mode & 07777) != 0700
        || (fi.st_uid != rpc->ref->uid
            && !(made && fi.st_uid == geteuid()
                 && fchown(fd, rpc->ref->uid, (ngx_gid_t) -1) == 0)))
    {
        ngx_log_error(NGX_LOG_ERR, rpc->log, 0,
                      "hermes: \"%s/tool_results\" is not an owner-only "
                      "directory of the kernel's user", rpc->ref->dir);
        close(fd);
        return NGX_ERROR;
    }

    rc = ngx_http_hermes_local_write_at(fd, (char *) name, body, len,
                                        (ngx_uid_t) rpc->ref->uid, rpc->log);
    close(fd);

    if (rc != NGX_OK) {
        return NGX_ERROR;
    }

answer:

    h = ngx_http_hermes_rpc_utf8_cut(body, rpc->hlcf->max_output * 2 / 5, 1);
    t = rpc->hlcf->max_output - rpc->hlcf->max_output * 2 / 5;
    t = len - t;
    t += ngx_http_hermes_rpc_utf8_cut(body + t, len - t, 0);

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        return NGX_ERROR;
    }

    yajl_gen_map_open(g);
    yajl_gen_string(g, (u_char *) "seq", 3);
    yajl_gen_integer(g, (long long) seq);
    yajl_gen_string(g, (u_char *) "ok", 2);
    yajl_gen_bool(g, 1);
    yajl_gen_string(g, (u_char *) "error", 5);
    yajl_gen_null(g);
    yajl_gen_string(g, (u_char *) "result", 6);
    yajl_gen_null(g);
    yajl_gen_string(g, (u_char *) "archived", 8);
    yajl_gen_map_open(g);
    yajl_gen_string(g, (u_char *) "path", 4);
    yajl_gen_string(g, path, end - path);
    yajl_gen_string(g, (u_char *) "bytes", 5);
    yajl_gen_integer(g, (long long) len);
    yajl_gen_string(g, (u_char *) "head", 4);
    yajl_gen_string(g, body, h);
    yajl_gen_string(g, (u_char *) "tail", 4);
    yajl_gen_string(g, body + t, len - t);
    yajl_gen_map_close(g);
    yajl_gen_map_close(g);

    if (yajl_gen_get_buf(g, (const unsigned char **) &p, &n)
        != yajl_gen_status_ok)
    {
        yajl_gen_free(g);
        return NGX_ERROR;
    }

    rc = ngx_http_hermes_rpc_write(rpc, seq, p, n);

    yajl_gen_free(g);

    return rc;
}


void
ngx_http_hermes_rpc_answer_error(ngx_http_hermes_rpc_t *rpc, uint64_t seq,
    u_char *fmt, ...)
{
    u_char         *p, *last;
    size_t          n;
    va_list         args;
    yajl_gen        g;
    u_char          msg[NGX_HTTP_HERMES_RPC_ERROR_MAX + 512];
    u_char          text[NGX_HTTP_HERMES_RPC_ERROR_MAX + 512];

    va_start(args, fmt);
    last = ngx_vslprintf(msg, msg + sizeof(msg), (char *) fmt, args);
    va_end(args);

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        return;
    }

    yajl_gen_map_open(g);
    yajl_gen_string(g, (u_char *) "seq", 3);
    yajl_gen_integer(g, (long long) seq);
    yajl_gen_string(g, (u_char *) "ok", 2);
    yajl_gen_bool(g, 0);
    yajl_gen_string(g, (u_char *) "result", 6);
    yajl_gen_null(g);
    yajl_gen_string(g, (u_char *) "error", 5);
    yajl_gen_string(g, msg, ngx_http_hermes_rpc_utf8_cut(msg, last - msg, 1));
    yajl_gen_map_close(g);

    if (yajl_gen_get_buf(g, (const unsigned char **) &p, &n)
        == yajl_gen_status_ok)
    {
        (void) ngx_http_hermes_rpc_write(rpc, seq, p, n);
    }

    yajl_gen_free(g);

    /* the message may quote what a tool or its server said */

    p = ngx_http_hermes_log_escape(text, text + sizeof(text), msg,
                                   last - msg, 0);

    ngx_log_error(NGX_LOG_INFO, rpc->log, 0,
                  "hermes: kernel %*s: tool call %uL: %*s",
                  (size_t) NGX_HTTP_HERMES_ID_LEN, rpc->ref->kernel_id, seq,
                  p - text, text);
}


/*
 * res_N: tmp + rename on the verified rpc/ fd; hermes_tools.py watches.
 * A full disk is NGX_ERROR here: answer_ok's NGX_DECLINED says "not JSON".
 */

static ngx_int_t
ngx_http_hermes_rpc_write(ngx_http_hermes_rpc_t *rpc, uint64_t seq,
    u_char *data, size_t len)
{
    u_char  *p, name[32];

    p = ngx_sprintf(name, "res_%06uL%Z", seq);

    if (rpc->remote) {
        return rpc->write(rpc->write_data, name, p - 1 - name, data, len);
    }

    if (rpc->rpc_fd == NGX_INVALID_FILE) {
        return NGX_ERROR;
    }

    return (ngx_http_hermes_local_write_at(rpc->rpc_fd, (char *) name, data,
                                           len, (ngx_uid_t) rpc->ref->uid,
                                           rpc->log)
            == NGX_OK) ? NGX_OK : NGX_ERROR;
}


/* a stream event: {"type":"tool_call"|"tool_done","seq","tool"[,"ok","ms"]} */

static void
ngx_http_hermes_rpc_emit(ngx_http_hermes_rpc_t *rpc, const char *type,
    ngx_str_t *tool, uint64_t seq, ngx_int_t ok, ngx_msec_t ms)
{
    u_char  *p, line[NGX_HTTP_HERMES_RPC_TOOL_MAX * 6 + 128];

    if (rpc->event == NULL) {
        return;
    }

    p = ngx_sprintf(line, "{\"type\":\"%s\",\"seq\":%uL,\"tool\":\"", type,
                    seq);
    p = (u_char *) ngx_escape_json(p, tool->data, tool->len);
    *p++ = '"';

    if (ok >= 0) {
        p = ngx_sprintf(p, ",\"ok\":%s,\"ms\":%M", ok ? "true" : "false", ms);
    }

    p = ngx_cpymem(p, "}\n", 2);

    rpc->event(rpc->data, line, p - line);
}


/*
 * A call's progress, as its MCP server tells it: a tool_progress event in
 * the cell's stream ("progress" and "total" JSON numbers as the server
 * wrote them).
 */

void
ngx_http_hermes_rpc_progress(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_call_t *call, char *progress, char *total,
    char *message)
{
    u_char  *p, *last;
    u_char   line[NGX_HTTP_HERMES_RPC_TOOL_MAX * 6 + 512
                  + 6 * NGX_HTTP_HERMES_RPC_PROGRESS_TEXT];
    size_t   len;

    if (rpc->event == NULL || ngx_strlen(progress) > 64) {
        return;
    }

    if (total && ngx_strlen(total) > 64) {
        total = NULL;           /* a number that long is not passed on, cut */
    }

    last = line + sizeof(line);

    p = ngx_sprintf(line, "{\"type\":\"tool_progress\",\"seq\":%uL,"
                    "\"tool\":\"", call->seq);
    p = (u_char *) ngx_escape_json(p, call->tool.data, call->tool.len);
    p = ngx_slprintf(p, last, "\",\"progress\":%s", progress);

    if (total) {
        p = ngx_slprintf(p, last, ",\"total\":%s", total);
    }

    if (message) {
        len = ngx_http_hermes_rpc_utf8_cut((u_char *) message,
                              ngx_min(ngx_strlen(message),
                                      NGX_HTTP_HERMES_RPC_PROGRESS_TEXT), 1);
        p = ngx_cpymem(p, ",\"message\":\"", sizeof(",\"message\":\"") - 1);
        p = (u_char *) ngx_escape_json(p, (u_char *) message, len);
        *p++ = '"';
    }

    p = ngx_cpymem(p, "}\n", 2);

    rpc->event(rpc->data, line, p - line);
}


/* the client left: calls in flight are answered, none is made any more */

void
ngx_http_hermes_rpc_detach(ngx_http_hermes_rpc_t *rpc)
{
    ngx_queue_t                 *q;
    ngx_http_hermes_rpc_call_t  *call;

    rpc->r = NULL;
    rpc->event = NULL;

    /* the calls are in the request's pool, about to go with it */

    while (!ngx_queue_empty(&rpc->inflight)) {
        q = ngx_queue_head(&rpc->inflight);
        call = ngx_queue_data(q, ngx_http_hermes_rpc_call_t, queue);

        ngx_queue_remove(q);
        call->rpc = NULL;

        ngx_http_hermes_rpc_answer_error(rpc, call->seq,
                     (u_char *) "tool \"%V\": the client that started this "
                     "cell disconnected while the tool ran; its answer is "
                     "lost", &call->tool);
    }
}


/* the cell is over: its authority too */

void
ngx_http_hermes_rpc_end(ngx_http_hermes_rpc_t *rpc)
{
    ngx_queue_t                 *q;
    ngx_http_hermes_rpc_call_t  *call;

    while (!ngx_queue_empty(&rpc->inflight)) {
        q = ngx_queue_head(&rpc->inflight);
        call = ngx_queue_data(q, ngx_http_hermes_rpc_call_t, queue);

        ngx_queue_remove(q);

        if (call->step) {
            /* the MCP server is told (notifications/cancelled) */
            ngx_http_hermes_mcp_forget(rpc, call);
        }

        call->rpc = NULL;
    }

    rpc->event = NULL;

    /* what the cell's rejections held back: said now */
    (void) ngx_http_hermes_rpc_log_slot(rpc, 0);

    ngx_http_hermes_rpc_close(rpc);
}


/* the filters: our subrequests' answers go to memory, nowhere else */

static ngx_http_hermes_rpc_call_t *
ngx_http_hermes_rpc_call(ngx_http_request_t *r)
{
    if (r == r->main || r->post_subrequest == NULL
        || r->post_subrequest->handler != ngx_http_hermes_rpc_done)
    {
        return NULL;
    }

    return r->post_subrequest->data;
}


static ngx_int_t
ngx_http_hermes_rpc_header_filter(ngx_http_request_t *r)
{
    ngx_uint_t                   i;
    ngx_list_part_t             *part;
    ngx_table_elt_t             *h;
    ngx_http_hermes_rpc_call_t  *call;

    call = ngx_http_hermes_rpc_call(r);

    if (call == NULL) {
        return ngx_http_next_header_filter(r);
    }

    call->status = r->headers_out.status;

    if (r->headers_out.content_length_n > (off_t) call->cap) {
        call->too_big = 1;
    }

    if (call->step) {
        /* MCP: an SSE answer, and the session the server gives */

        if (r->headers_out.content_type.len >= sizeof("text/event-stream") - 1
            && ngx_strncasecmp(r->headers_out.content_type.data,
                               (u_char *) "text/event-stream",
                               sizeof("text/event-stream") - 1) == 0)
        {
            call->sse = 1;
        }

        part = &r->headers_out.headers.part;
        h = part->elts;

        for (i = 0; /* void */ ; i++) {

            if (i >= part->nelts) {
                if (part->next == NULL) {
                    break;
                }

                part = part->next;
                h = part->elts;
                i = 0;
            }

            if (h[i].hash == 0
                || h[i].key.len != sizeof("Mcp-Session-Id") - 1
                || ngx_strncasecmp(h[i].key.data, (u_char *) "Mcp-Session-Id",
                                   sizeof("Mcp-Session-Id") - 1) != 0)
            {
                continue;
            }

            call->session.data = ngx_pnalloc(r->pool, h[i].value.len);
            if (call->session.data == NULL) {
                return NGX_ERROR;
            }

            ngx_memcpy(call->session.data, h[i].value.data, h[i].value.len);
            call->session.len = h[i].value.len;
        }
    }

    r->filter_need_in_memory = 1;
    r->header_sent = 1;

    return NGX_OK;
}


static ngx_int_t
ngx_http_hermes_rpc_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    off_t                        size;
    u_char                      *p;
    ssize_t                      n;
    ngx_buf_t                   *b;
    ngx_chain_t                 *cl;
    ngx_http_hermes_rpc_call_t  *call;

    call = ngx_http_hermes_rpc_call(r);

    if (call == NULL) {
        return ngx_http_next_body_filter(r, in);
    }

    for (cl = in; cl; cl = cl->next) {
        b = cl->buf;
        size = ngx_buf_size(b);

        if (size && !call->too_big) {

            if (call->len + size > call->cap) {
                call->too_big = 1;

            } else {
                if (call->len + size > call->size) {
                    /* double, up to the cap */
                    call->size = ngx_min(call->cap,
                                         ngx_max(2 * call->size,
                                                 call->len + (size_t) size
                                                 + 4096));

                    p = ngx_alloc(call->size, r->connection->log);
                    if (p == NULL) {
                        return NGX_ERROR;
                    }

                    if (call->len) {
                        ngx_memcpy(p, call->body, call->len);
                    }

                    if (call->body) {
                        ngx_free(call->body);
                    }

                    call->body = p;
                }

                if (ngx_buf_in_memory(b)) {
                    ngx_memcpy(call->body + call->len, b->pos, size);

                } else {
                    /* the proxy's temp file: nginx's own, not the cell's */
                    n = ngx_read_file(b->file, call->body + call->len,
                                      size, b->file_pos);
                    if (n != size) {
                        return NGX_ERROR;
                    }
                }

                call->len += size;
            }
        }

        /* a subrequest's end; a broken or timed out stream only flushes */

        if (b->last_buf || b->last_in_chain) {
            call->whole = 1;
        }

        b->pos = b->last;
        b->file_pos = b->file_last;
    }

    if (call->sse && call->rpc
        && (call->step == NGX_HTTP_HERMES_MCP_CALL
            || call->step == NGX_HTTP_HERMES_MCP_RESUME)
        && !call->too_big && !call->stream.posted)
    {
        /*
         * the server's messages within the answer, as they come: looked at
         * from the event loop, not in here (an answer is a subrequest, a
         * progress line the client's output)
         */
        call->stream.handler = ngx_http_hermes_mcp_stream;
        call->stream.data = call;
        call->stream.log = r->connection->log;
        ngx_post_event(&call->stream, &ngx_posted_events);
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_hermes_rpc_filter_init(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_hermes_rpc_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_hermes_rpc_body_filter;

    return NGX_OK;
}


/*
 * hermes_tools.py's _identifier(): "-" and "." as "_", "tool_" before a
 * leading digit, "_" after a Python keyword.  "dst" holds
 * NGX_HTTP_HERMES_TOOL_IDENT bytes (a tool's name is 128 at most).
 */

size_t
ngx_http_hermes_tool_ident(u_char *dst, ngx_str_t *name)
{
    u_char      *p;
    size_t       i, len;
    ngx_uint_t   k;

    static ngx_str_t  keywords[] = {
        ngx_string("False"), ngx_string("None"), ngx_string("True"),
        ngx_string("and"), ngx_string("as"), ngx_string("assert"),
        ngx_string("async"), ngx_string("await"), ngx_string("break"),
        ngx_string("class"), ngx_string("continue"), ngx_string("def"),
        ngx_string("del"), ngx_string("elif"), ngx_string("else"),
        ngx_string("except"), ngx_string("finally"), ngx_string("for"),
        ngx_string("from"), ngx_string("global"), ngx_string("if"),
        ngx_string("import"), ngx_string("in"), ngx_string("is"),
        ngx_string("lambda"), ngx_string("nonlocal"), ngx_string("not"),
        ngx_string("or"), ngx_string("pass"), ngx_string("raise"),
        ngx_string("return"), ngx_string("try"), ngx_string("while"),
        ngx_string("with"), ngx_string("yield"), ngx_null_string
    };

    len = ngx_min(name->len, NGX_HTTP_HERMES_TOOL_IDENT - 8);

    p = dst;

    if (len && name->data[0] >= '0' && name->data[0] <= '9') {
        p = ngx_cpymem(p, "tool_", sizeof("tool_") - 1);
    }

    for (i = 0; i < len; i++) {
        *p++ = (name->data[i] == '-' || name->data[i] == '.')
               ? '_' : name->data[i];
    }

    for (k = 0; keywords[k].len; k++) {
        if ((size_t) (p - dst) == keywords[k].len
            && ngx_strncmp(dst, keywords[k].data, keywords[k].len) == 0)
        {
            *p++ = '_';
            break;
        }
    }

    return p - dst;
}
