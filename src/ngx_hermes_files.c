
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: files into and out of a kernel's working directory, its
 * kernel dir: PUT and GET <kernels location>/SESSION/files/PATH.  The path
 * is checked here, then again on the kernel's host by hermes_files.py,
 * which a thread pool task runs there through the backend, the module's
 * own copy on stdin (with the bytes of a PUT), what a GET reads on stdout.
 * Both are bounded by hermes_max_file.
 */


#include "ngx_hermes.h"

#include <sodium.h>


#define NGX_HTTP_HERMES_FILES_PATH_MAX  1024

#define NGX_HTTP_HERMES_FILES_LOADER                                          \
    "import sys;i=sys.stdin.buffer;"                                          \
    "exec(compile(i.read(int(i.readline())),\"hermes_files.py\",\"exec\"))"


/* hermes_files.py's first line: the file's size, inode and mtime */
#define NGX_HTTP_HERMES_FILES_HEAD      (3 * NGX_INT64_LEN + 3)

/*
 * a piece at most, either way: the worker holds one a transfer (a GET's
 * next is read once the client took the last; a PUT's from nginx's temp
 * file of the body as the last is written)
 */
#define NGX_HTTP_HERMES_FILES_PIECE     (4 * 1024 * 1024)

/* an owner's transfers at once in a worker (429 past them) */
#define NGX_HTTP_HERMES_FILES_OWNER     4

/* owners with transfers under way a worker keeps count of */
#define NGX_HTTP_HERMES_FILES_OWNERS    64


/* an owner's transfers under way in this worker */

typedef struct {
    size_t                         len;         /* 0: a free slot */
    ngx_uint_t                     n;
    u_char                         owner[NGX_HTTP_HERMES_OWNER_MAX];
} ngx_http_hermes_files_owner_t;


typedef struct {
    ngx_thread_task_t              task;
    ngx_http_hermes_conn_t         conn;
    ngx_http_request_t            *r;
    u_char                        *in;          /* length, script */
    size_t                         in_len;
    size_t                         script_len;  /* of in: length and script */
    ngx_chain_t                   *body;        /* a PUT's: nginx's buffers
                                                   and temp file, read a
                                                   piece at a time */
    size_t                         body_len;
    u_char                        *out;         /* a GET's piece */
    size_t                         out_size;
    size_t                         out_len;
    size_t                         piece;       /* bytes one command moves */
    size_t                         max_file;
    off_t                          size;        /* a GET's file, -1: unknown */
    off_t                          offset;      /* of the next piece */
    ngx_http_hermes_backend_conf_t *bcf;
    ngx_uint_t                     host;
    ngx_http_hermes_files_owner_t *owner;       /* its count, taken */
    size_t                         head_len;
    u_char                         head[NGX_HTTP_HERMES_FILES_HEAD];
    ngx_int_t                      rc;          /* the last command's:
                                                   NGX_DECLINED: the host
                                                   cannot be reached */
    int                            status;
    ngx_str_t                      path;
    u_char                         dir[NGX_HTTP_HERMES_DIR_MAX];
    u_char                         spath[NGX_HTTP_HERMES_FILES_PATH_MAX + 1];
    u_char                         uid[NGX_INT64_LEN + 1];
    u_char                         max[NGX_INT64_LEN + 1];
    u_char                         nonce[17];
    unsigned                       get:1;
    unsigned                       changed:1;   /* between a GET's pieces */
} ngx_http_hermes_files_t;


static ngx_int_t ngx_http_hermes_files_path(ngx_str_t *path);
static void ngx_http_hermes_files_body(ngx_http_request_t *r);
static ngx_int_t ngx_http_hermes_files_post(ngx_http_request_t *r,
    ngx_http_hermes_files_t *f);
static void ngx_http_hermes_files_thread(void *data, ngx_log_t *log);
static void ngx_http_hermes_files_args(ngx_http_hermes_files_t *f, char *verb,
    char **args);
static void ngx_http_hermes_files_get(ngx_http_hermes_files_t *f,
    ngx_http_hermes_cmd_t *c);
static void ngx_http_hermes_files_send(ngx_http_request_t *r,
    ngx_http_hermes_files_t *f);
static void ngx_http_hermes_files_writer(ngx_http_request_t *r);
static ngx_http_hermes_files_owner_t *ngx_http_hermes_files_owner(
    ngx_str_t *owner);


static ngx_http_hermes_files_owner_t
    ngx_http_hermes_files_owners[NGX_HTTP_HERMES_FILES_OWNERS];
static void ngx_http_hermes_files_put(ngx_http_hermes_files_t *f,
    ngx_http_hermes_cmd_t *c);
static void ngx_http_hermes_files_done(ngx_event_t *ev);
static void ngx_http_hermes_files_free(void *data);


/* the kernel's own files, not the caller's to replace or read */

static ngx_str_t  ngx_http_hermes_files_reserved[] = {
    ngx_string("cells"),
    ngx_string("rpc"),
    ngx_string("wake"),
    ngx_string("intr"),
    ngx_string("ready"),
    ngx_string("kernel.env"),
    ngx_string("runner.log"),
    ngx_string("kernel_runner.py"),
    ngx_string("hermes_tools.py"),
    ngx_null_string
};


ngx_int_t
ngx_http_hermes_files_handler(ngx_http_request_t *r,
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner, ngx_str_t *session,
    ngx_str_t *path)
{
    u_char                          *p;
    ngx_int_t                        rc;
    ngx_pool_cleanup_t              *cln;
    ngx_http_hermes_files_t         *f;
    u_char                           nonce[8];
    ngx_http_hermes_victim_t         v;
    ngx_http_hermes_loc_conf_t      *hlcf;
    ngx_http_hermes_kernel_ref_t     ref;
    ngx_http_hermes_main_conf_t     *hmcf;
    ngx_http_hermes_remote_file_t   *rf;
    ngx_http_hermes_backend_conf_t  *bcf;

    if (r->method != NGX_HTTP_GET && r->method != NGX_HTTP_PUT
        && r->method != NGX_HTTP_HEAD)
    {
        if (ngx_http_hermes_response_add_header(r, "Allow", "GET, PUT")
            != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_hermes_response_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                                   "method_not_allowed",
                                                   "use GET or PUT for a "
                                                   "file");
    }

    if (ngx_http_hermes_files_path(path) != NGX_OK) {
        return ngx_http_hermes_response_send_error(r, NGX_HTTP_BAD_REQUEST,
                                                   "invalid_path",
                                                   "a file path is relative, "
                                                   "without \"..\", empty "
                                                   "parts, quotes, "
                                                   "backslashes or control "
                                                   "bytes, and not one of "
                                                   "the kernel's own files");
    }

    if (ngx_http_hermes_registry_kernel(zone, owner, session, &v, &ref)
        != NGX_OK)
    {
        return ngx_http_hermes_response_send_error(r, NGX_HTTP_NOT_FOUND,
                                                   "not_found",
                                                   "no kernel of yours for "
                                                   "this session");
    }

    hmcf = ngx_http_get_module_main_conf(r, ngx_http_hermes_module);
    bcf = ngx_http_hermes_backend_by_tag(hmcf, v.tag);

    if (bcf == NULL) {
        return ngx_http_hermes_response_send_error(r, NGX_HTTP_NOT_FOUND,
                                                   "not_found",
                                                   "the kernel's backend is "
                                                   "no longer configured");
    }

    for (rf = ngx_http_hermes_remote_files; rf->len; rf++) {
        if (rf->name.len == sizeof("hermes_files.py") - 1
            && ngx_strncmp(rf->name.data, "hermes_files.py", rf->name.len)
               == 0)
        {
            break;
        }
    }

    if (rf->len == 0) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "hermes: hermes_files.py is not built in");
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    f = ngx_pcalloc(r->pool, sizeof(ngx_http_hermes_files_t));
    if (f == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    f->r = r;
    f->path = *path;
    f->get = (r->method != NGX_HTTP_PUT);

    /* what the thread holds outside the request's pool is freed with it */

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln->handler = ngx_http_hermes_files_free;
    cln->data = f;

    /* each transfer holds memory of the worker's: a few an owner at once */

    f->owner = ngx_http_hermes_files_owner(owner);

    if (f->owner == NULL) {
        if (ngx_http_hermes_response_add_header(r, "Retry-After", "1")
            != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_hermes_response_send_error(r,
                                           NGX_HTTP_TOO_MANY_REQUESTS,
                                           "too_many_transfers",
                                           "too many of your file transfers "
                                           "are under way; retry when one "
                                           "is done");
    }

    /* hermes_files.py's arguments: values, never shell text */

    if (v.dir_len >= sizeof(f->dir) || path->len >= sizeof(f->spath)) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    *ngx_cpymem(f->dir, v.dir, v.dir_len) = '\0';
    *ngx_cpymem(f->spath, path->data, path->len) = '\0';
    ngx_sprintf(f->uid, "%i%Z",
                bcf->ops->root(bcf) ? (ngx_int_t) ref.uid : (ngx_int_t) -1);
    ngx_sprintf(f->max, "%uz%Z", hlcf->max_file);

    randombytes_buf(nonce, sizeof(nonce));
    *ngx_hex_dump(f->nonce, nonce, sizeof(nonce)) = '\0';

    f->max_file = hlcf->max_file;
    /* both ways a piece at a time: a transfer costs the worker a piece */
    f->piece = ngx_min(ngx_min(bcf->ops->exec_max, hlcf->max_file + 1),
                       NGX_HTTP_HERMES_FILES_PIECE);
    f->bcf = bcf;
    f->host = v.host;
    f->size = -1;

    /* stdin: the script's length, the script, then a PUT's bytes */

    f->in = ngx_alloc(NGX_INT64_LEN + 1 + rf->len, r->connection->log);
    if (f->in == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = ngx_sprintf(f->in, "%uz\n", rf->len);
    p = ngx_cpymem(p, rf->data, rf->len);
    f->in_len = p - f->in;
    f->script_len = f->in_len;

    ngx_http_hermes_backend_take(&f->conn, bcf, v.host);

    if (f->get) {
        /* a piece, and room for the line before it */
        f->out_size = f->piece + NGX_HTTP_HERMES_FILES_HEAD + 1;

        f->out = ngx_alloc(f->out_size, r->connection->log);
        if (f->out == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (ngx_http_discard_request_body(r) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (ngx_http_hermes_response_ctx(r) == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        /* the writer finds it there between pieces */
        ngx_http_hermes_response_ctx(r)->files = f;

        rc = ngx_http_hermes_files_post(r, f);
        if (rc != NGX_OK) {
            return rc;
        }

        r->main->count++;
        return NGX_DONE;
    }

    if (r->headers_in.content_length_n > (off_t) hlcf->max_file) {
        return ngx_http_hermes_response_send_error(r,
                                           NGX_HTTP_REQUEST_ENTITY_TOO_LARGE,
                                           "file_too_large",
                                           "the file is over hermes_max_file");
    }

    if (ngx_http_hermes_response_ctx(r) == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_http_hermes_response_ctx(r)->files = f;

    rc = ngx_http_read_client_request_body(r, ngx_http_hermes_files_body);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


/*
 * Relative, no "..", "." or empty part, printable ASCII without quotes
 * or backslashes (it goes into a single-quoted shell word), and not one
 * of the kernel's own files at the top.  NGX_DECLINED: it is not.
 */

static ngx_int_t
ngx_http_hermes_files_path(ngx_str_t *path)
{
    u_char      *p, *last, *part;
    size_t       len;
    ngx_str_t   *rs;

    if (path->len == 0 || path->len > NGX_HTTP_HERMES_FILES_PATH_MAX) {
        return NGX_DECLINED;
    }

    last = path->data + path->len;
    part = path->data;

    for (p = path->data; p <= last; p++) {

        if (p < last && *p != '/') {
            if (*p < 0x20 || *p >= 0x7f || *p == '\'' || *p == '\\') {
                return NGX_DECLINED;
            }

            continue;
        }

        len = p - part;

        if (len == 0 || (len == 1 && part[0] == '.')
            || (len == 2 && part[0] == '.' && part[1] == '.'))
        {
            return NGX_DECLINED;
        }

        if (part == path->data) {
            for (rs = ngx_http_hermes_files_reserved; rs->len; rs++) {
                if (rs->len == len && ngx_strncmp(rs->data, part, len) == 0) {
                    return NGX_DECLINED;
                }
            }
        }

        part = p + 1;
    }

    return NGX_OK;
}


/* the PUT's body is in: in memory, in one piece, for the task's stdin */

static void
ngx_http_hermes_files_body(ngx_http_request_t *r)
{
    ngx_int_t                 rc;
    ngx_buf_t                *b;
    ngx_chain_t              *cl;
    ngx_http_hermes_files_t  *f;

    f = ngx_http_hermes_response_ctx(r)->files;

    /*
     * the body stays where nginx put it (its buffer, its temp file past
     * client_body_buffer_size): the task reads it a piece at a time, so
     * a PUT costs the worker a piece, not the file
     */

    f->body = r->request_body ? r->request_body->bufs : NULL;
    f->body_len = 0;

    for (cl = f->body; cl; cl = cl->next) {
        b = cl->buf;
        f->body_len += b->in_file ? (size_t) (b->file_last - b->file_pos)
                                  : (size_t) (b->last - b->pos);
    }

    rc = ngx_http_hermes_files_post(r, f);

    if (rc != NGX_OK) {
        ngx_http_finalize_request(r, rc);
        return;
    }

    /* the body reader's count is ours until the task is done */
}


static ngx_int_t
ngx_http_hermes_files_post(ngx_http_request_t *r, ngx_http_hermes_files_t *f)
{
    ngx_http_hermes_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    f->task.ctx = f;
    f->task.handler = ngx_http_hermes_files_thread;
    f->task.event.handler = ngx_http_hermes_files_done;
    f->task.event.data = f;
    f->task.event.log = r->connection->log;

    if (ngx_thread_task_post(hlcf->thread_pool, &f->task) != NGX_OK) {
        ngx_http_hermes_backend_give(&f->conn);
        return ngx_http_hermes_response_send_error(r,
                                                   NGX_HTTP_SERVICE_UNAVAILABLE,
                                                   "busy", "the gateway is "
                                                   "busy; retry shortly");
    }

    return NGX_OK;
}


/*
 * Thread pool: the file moved in pieces of at most f->piece bytes, one
 * hermes_files.py command each (4 MiB locally; over ssh the agent's
 * frames bound a command's input and output).
 */

static void
ngx_http_hermes_files_thread(void *data, ngx_log_t *log)
{
    ngx_http_hermes_files_t *f = data;

    ngx_http_hermes_cmd_t  c;

    static char  loader[] = "exec python3 -I -c '"
                            NGX_HTTP_HERMES_FILES_LOADER "' \"$@\"";

    ngx_memzero(&c, sizeof(ngx_http_hermes_cmd_t));

    c.cmd = loader;
    c.timeout = 60000;

    if (f->get) {
        ngx_http_hermes_files_get(f, &c);

    } else {
        ngx_http_hermes_files_put(f, &c);
    }
}


/* hermes_files.py's first arguments: VERB DIR PATH UID MAX */

static void
ngx_http_hermes_files_args(ngx_http_hermes_files_t *f, char *verb,
    char **args)
{
    args[0] = verb;
    args[1] = (char *) f->dir;
    args[2] = (char *) f->spath;
    args[3] = (char *) f->uid;
    args[4] = (char *) f->max;
}


/*
 * The next piece of a GET into f->out, after its line "SIZE:INODE:MTIME",
 * which must stay the first piece's, and exactly as long as the file
 * says; else the file changed while read (f->changed).
 */

static void
ngx_http_hermes_files_get(ngx_http_hermes_files_t *f, ngx_http_hermes_cmd_t *c)
{
    u_char   *p, *nl, *colon;
    size_t    want;
    char     *args[8];
    u_char    offset[NGX_INT64_LEN + 1], count[NGX_INT64_LEN + 1];

    ngx_http_hermes_files_args(f, "get", args);
    args[5] = (char *) offset;
    args[6] = (char *) count;
    args[7] = NULL;

    ngx_sprintf(offset, "%O%Z", f->offset);
    ngx_sprintf(count, "%uz%Z", f->piece);

    c->args = args;
    c->in = f->in;
    c->in_len = f->in_len;
    c->out = f->out;
    c->out_size = f->out_size;

    f->out_len = 0;

    f->rc = ngx_http_hermes_backend_exec(&f->conn, c);
    f->status = c->status;

    if (f->rc != NGX_OK || c->status != 0) {
        return;
    }

    p = c->out;
    nl = ngx_strlchr(p, p + ngx_min(c->out_len, sizeof(f->head)), '\n');

    if (nl == NULL) {
        f->status = 5;
        return;
    }

    if (f->size == -1) {
        colon = ngx_strlchr(p, nl, ':');
        f->head_len = nl + 1 - p;
        ngx_memcpy(f->head, p, f->head_len);
        f->size = colon ? ngx_atoof(p, colon - p) : NGX_ERROR;

        if (f->size < 0 || (size_t) f->size > f->max_file) {
            f->status = (f->size < 0) ? 5 : 3;
            return;
        }

    } else if ((size_t) (nl + 1 - p) != f->head_len
               || ngx_memcmp(p, f->head, f->head_len) != 0)
    {
        f->changed = 1;
        return;
    }

    want = ngx_min(f->piece, (size_t) (f->size - f->offset));

    if (c->out_len - f->head_len != want) {
        f->changed = 1;
        return;
    }

    ngx_memmove(p, p + f->head_len, want);
    f->out_len = want;
}


/*
 * Thread pool: n bytes of a PUT's body from "offset" on, out of nginx's
 * buffers and temp file (its own, not a kernel's: read as it is).
 */

static ngx_int_t
ngx_http_hermes_files_body_read(ngx_http_hermes_files_t *f, u_char *dst,
    size_t offset, size_t n)
{
    size_t        len, take;
    ssize_t       got;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    for (cl = f->body; cl && n; cl = cl->next) {
        b = cl->buf;
        len = b->in_file ? (size_t) (b->file_last - b->file_pos)
                         : (size_t) (b->last - b->pos);

        if (offset >= len) {
            offset -= len;
            continue;
        }

        take = ngx_min(len - offset, n);

        if (b->in_file) {
            got = ngx_read_file(b->file, dst, take,
                                b->file_pos + (off_t) offset);
            if (got != (ssize_t) take) {
                return NGX_ERROR;
            }

        } else {
            ngx_memcpy(dst, b->pos + offset, take);
        }

        dst += take;
        n -= take;
        offset = 0;
    }

    return n ? NGX_ERROR : NGX_OK;
}


/*
 * Piece after piece of the body, after the script on each command's
 * stdin; a failure half way removes the temporary file.
 */

static void
ngx_http_hermes_files_put(ngx_http_hermes_files_t *f, ngx_http_hermes_cmd_t *c)
{
    u_char   *in;
    size_t    total, done, n;
    char     *args[9];
    u_char    err[64], offset[NGX_INT64_LEN + 1], all[NGX_INT64_LEN + 1];

    total = f->body_len;

    if (total > f->max_file) {
        /* a chunked body, known only now: nothing is sent */
        f->rc = NGX_OK;
        f->status = 3;
        return;
    }

    ngx_http_hermes_files_args(f, "put", args);
    args[5] = (char *) offset;
    args[6] = (char *) all;
    args[7] = (char *) f->nonce;
    args[8] = NULL;

    ngx_sprintf(all, "%uz%Z", total);

    c->args = args;
    c->out = err;
    c->out_size = sizeof(err);

    in = ngx_alloc(f->script_len + ngx_min(f->piece, total), ngx_cycle->log);
    if (in == NULL) {
        f->rc = NGX_ERROR;
        return;
    }

    ngx_memcpy(in, f->in, f->script_len);

    done = 0;

    do {
        n = ngx_min(f->piece, total - done);
        ngx_sprintf(offset, "%uz%Z", done);

        if (ngx_http_hermes_files_body_read(f, in + f->script_len, done, n)
            != NGX_OK)
        {
            f->rc = NGX_ERROR;
            break;
        }

        c->in = in;
        c->in_len = f->script_len + n;

        f->rc = ngx_http_hermes_backend_exec(&f->conn, c);
        f->status = c->status;

        if (f->rc != NGX_OK || c->status != 0) {
            break;
        }

        done += n;

    } while (done < total);

    ngx_free(in);

    if (done == total && f->rc == NGX_OK && f->status == 0) {
        return;
    }

    if (f->rc != NGX_DECLINED) {
        /* what the pieces so far left: removed, whatever this says */
        args[0] = "abort";
        args[5] = (char *) f->nonce;
        args[6] = NULL;

        c->in = f->in;
        c->in_len = f->script_len;

        (void) ngx_http_hermes_backend_exec(&f->conn, c);
    }
}


static void
ngx_http_hermes_files_done(ngx_event_t *ev)
{
    ngx_http_hermes_files_t *f = ev->data;

    ngx_int_t            rc;
    ngx_http_request_t  *r;

    r = f->r;

    ngx_http_hermes_backend_give(&f->conn);

    if (f->get && f->offset) {
        /* a later piece: the answer is under way, a failure ends it */

        if (f->rc != NGX_OK || f->status != 0 || f->changed
            || r->connection->error)
        {
            ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                          "hermes: \"%V\" of a kernel changed or could not "
                          "be read while it was sent (exit %d): the "
                          "connection is closed", &f->path, f->status);
            ngx_http_finalize_request(r, NGX_ERROR);
            return;
        }

        ngx_http_hermes_files_send(r, f);
        return;
    }

    if (f->rc == NGX_DECLINED) {
        rc = ngx_http_hermes_response_send_error(r, NGX_HTTP_BAD_GATEWAY,
                                                 "backend_unavailable",
                                                 "the kernel host cannot be "
                                                 "reached");
        goto done;
    }

    switch (f->rc == NGX_OK ? f->status : -1) {

    case 0:
        break;

    case 2:
        rc = ngx_http_hermes_response_send_error(r, NGX_HTTP_NOT_FOUND,
                                                 "not_found",
                                                 "no such file in the "
                                                 "kernel's directory");
        goto done;

    case 3:
        rc = ngx_http_hermes_response_send_error(r,
                                          NGX_HTTP_REQUEST_ENTITY_TOO_LARGE,
                                          "file_too_large",
                                          "the file is over hermes_max_file");
        goto done;

    case 4:
        rc = ngx_http_hermes_response_send_error(r, NGX_HTTP_BAD_REQUEST,
                                                 "invalid_path",
                                                 "the path leads through a "
                                                 "symlink or to what is not "
                                                 "a regular file");
        goto done;

    default:
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "hermes: %s \"%V\" of a kernel failed (exit %d)",
                      f->get ? "reading" : "writing", &f->path, f->status);

        rc = ngx_http_hermes_response_send_error(r, NGX_HTTP_BAD_GATEWAY,
                                                 "file_failed",
                                                 "the kernel's host could "
                                                 "not move the file");
        goto done;
    }

    if (!f->get) {
        rc = ngx_http_hermes_response_send_buf(r, NGX_HTTP_NO_CONTENT,
                                               "application/json", NULL);
        goto done;
    }

    if (f->changed) {
        rc = ngx_http_hermes_response_send_error(r, NGX_HTTP_CONFLICT,
                                                 "file_changed",
                                                 "the file changed while it "
                                                 "was read; try again");
        goto done;
    }

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = f->size;
    ngx_str_set(&r->headers_out.content_type, "application/octet-stream");
    r->headers_out.content_type_len = r->headers_out.content_type.len;

    if (f->size == 0 || r->method == NGX_HTTP_HEAD) {
        r->header_only = 1;
    }

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        goto done;
    }

    ngx_http_hermes_files_send(r, f);
    return;

done:

    ngx_http_finalize_request(r, rc);
}


/*
 * A GET's piece to the client; the next is read once it is sent, so that
 * a slow client costs the worker one piece, whatever the file's size.
 */

static void
ngx_http_hermes_files_send(ngx_http_request_t *r, ngx_http_hermes_files_t *f)
{
    ngx_int_t     rc;
    ngx_buf_t    *b;
    ngx_chain_t   out;

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        ngx_http_finalize_request(r, NGX_ERROR);
        return;
    }

    f->offset += f->out_len;

    b->pos = f->out;
    b->last = f->out + f->out_len;
    b->memory = 1;
    b->flush = 1;

    if (f->offset == f->size) {
        b->last_buf = 1;
        b->last_in_chain = 1;
    }

    out.buf = b;
    out.next = NULL;

    rc = ngx_http_output_filter(r, &out);

    if (rc == NGX_ERROR || f->offset == f->size) {
        ngx_http_finalize_request(r, rc);
        return;
    }

    r->write_event_handler = ngx_http_hermes_files_writer;
    ngx_http_hermes_files_writer(r);
}


/* the piece sent: the next one read (the count of the task is still ours) */

static void
ngx_http_hermes_files_writer(ngx_http_request_t *r)
{
    ngx_http_hermes_files_t     *f;
    ngx_http_hermes_loc_conf_t  *hlcf;

    if (ngx_http_hermes_response_flush(r) != NGX_OK) {
        return;
    }

    r->write_event_handler = ngx_http_request_empty_handler;

    f = ngx_http_hermes_response_ctx(r)->files;
    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    ngx_http_hermes_backend_take(&f->conn, f->bcf, f->host);

    if (ngx_thread_task_post(hlcf->thread_pool, &f->task) != NGX_OK) {
        ngx_http_hermes_backend_give(&f->conn);
        ngx_http_finalize_request(r, NGX_ERROR);
    }
}


static void
ngx_http_hermes_files_free(void *data)
{
    ngx_http_hermes_files_t *f = data;

    if (f->in) {
        ngx_free(f->in);
        f->in = NULL;
    }

    if (f->out) {
        ngx_free(f->out);
        f->out = NULL;
    }

    if (f->owner) {
        if (--f->owner->n == 0) {
            f->owner->len = 0;
        }

        f->owner = NULL;
    }
}


/* the owner's count, one more taken; NULL: it has its share under way */

static ngx_http_hermes_files_owner_t *
ngx_http_hermes_files_owner(ngx_str_t *owner)
{
    ngx_uint_t                      i;
    ngx_http_hermes_files_owner_t  *o, *free;

    free = NULL;

    for (i = 0; i < NGX_HTTP_HERMES_FILES_OWNERS; i++) {
        o = &ngx_http_hermes_files_owners[i];

        if (o->len == 0) {
            if (free == NULL) {
                free = o;
            }

            continue;
        }

        if (o->len == owner->len
            && ngx_memcmp(o->owner, owner->data, owner->len) == 0)
        {
            if (o->n == NGX_HTTP_HERMES_FILES_OWNER) {
                return NULL;
            }

            o->n++;
            return o;
        }
    }

    if (free == NULL || owner->len == 0
        || owner->len > NGX_HTTP_HERMES_OWNER_MAX)
    {
        return NULL;
    }

    ngx_memcpy(free->owner, owner->data, owner->len);
    free->len = owner->len;
    free->n = 1;

    return free;
}
