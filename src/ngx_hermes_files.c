
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: a file moved into or out of a kernel's working directory,
 * its kernel dir, for whoever asks (the HTTP files route, hermes_mcp's
 * file tools).  The path is checked here, then again on the kernel's
 * host by hermes_files.py, which a thread pool task runs there through
 * the backend, the module's own copy on stdin (with a PUT's bytes, from
 * its body chain: memory or nginx's temp file), a GET's piece on stdout
 * for the asker's handler.  Both are bounded by the asker's max_file.
 */


#include "ngx_hermes.h"

#include <sodium.h>


#define NGX_HTTP_HERMES_FILES_LOADER                                          \
    "import sys;i=sys.stdin.buffer;"                                          \
    "exec(compile(i.read(int(i.readline())),\"hermes_files.py\",\"exec\"))"


/* an owner's transfers at once in a worker (429 past them) */
#define NGX_HTTP_HERMES_FILES_OWNER     4

/* owners with transfers under way a worker keeps count of */
#define NGX_HTTP_HERMES_FILES_OWNERS    64


static ngx_int_t ngx_http_hermes_files_path(ngx_str_t *path);
static void ngx_http_hermes_files_thread(void *data, ngx_log_t *log);
static void ngx_http_hermes_files_args(ngx_http_hermes_files_t *f, char *verb,
    char **args);
static void ngx_http_hermes_files_get(ngx_http_hermes_files_t *f,
    ngx_http_hermes_cmd_t *c);
static void ngx_http_hermes_files_put(ngx_http_hermes_files_t *f,
    ngx_http_hermes_cmd_t *c);
static void ngx_http_hermes_files_done(ngx_event_t *ev);
static ngx_http_hermes_files_error_t *ngx_http_hermes_files_result(
    ngx_http_hermes_files_t *f);
static void ngx_http_hermes_files_free(void *data);
static ngx_http_hermes_files_owner_t *ngx_http_hermes_files_owner(
    ngx_str_t *owner);


static ngx_http_hermes_files_owner_t
    ngx_http_hermes_files_owners[NGX_HTTP_HERMES_FILES_OWNERS];


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
    ngx_string("kernel_runner.pyc"),
    ngx_string("kernel_start.py"),
    ngx_string("hermes_tools.py"),
    ngx_string(".hermes_result.tmp"),
    ngx_null_string
};


/* failures, named as the HTTP files API names them */

static ngx_http_hermes_files_error_t  ngx_http_hermes_files_invalid_path = {
    NGX_HTTP_BAD_REQUEST, "invalid_path",
    "a file path is relative, without \"..\", empty parts, quotes, "
    "backslashes or control bytes, and not one of the kernel's own files"
};

static ngx_http_hermes_files_error_t  ngx_http_hermes_files_no_kernel = {
    NGX_HTTP_NOT_FOUND, "not_found", "no kernel of yours for this session"
};

static ngx_http_hermes_files_error_t  ngx_http_hermes_files_no_backend = {
    NGX_HTTP_NOT_FOUND, "not_found",
    "the kernel's backend is no longer configured"
};

static ngx_http_hermes_files_error_t  ngx_http_hermes_files_too_many = {
    NGX_HTTP_TOO_MANY_REQUESTS, "too_many_transfers",
    "too many of your file transfers are under way; retry when one is done"
};

static ngx_http_hermes_files_error_t  ngx_http_hermes_files_busy = {
    NGX_HTTP_SERVICE_UNAVAILABLE, "busy",
    "the gateway is busy; retry shortly"
};

static ngx_http_hermes_files_error_t  ngx_http_hermes_files_unreachable = {
    NGX_HTTP_BAD_GATEWAY, "backend_unavailable",
    "the kernel host cannot be reached"
};

static ngx_http_hermes_files_error_t  ngx_http_hermes_files_no_file = {
    NGX_HTTP_NOT_FOUND, "not_found", "no such file in the kernel's directory"
};

ngx_http_hermes_files_error_t  ngx_http_hermes_files_too_large = {
    NGX_HTTP_REQUEST_ENTITY_TOO_LARGE, "file_too_large",
    "the file is over hermes_max_file"
};

static ngx_http_hermes_files_error_t  ngx_http_hermes_files_refused = {
    NGX_HTTP_BAD_REQUEST, "invalid_path",
    "the path leads through a symlink or to what is not a regular file"
};

static ngx_http_hermes_files_error_t  ngx_http_hermes_files_failed = {
    NGX_HTTP_BAD_GATEWAY, "file_failed",
    "the kernel's host could not move the file"
};

static ngx_http_hermes_files_error_t  ngx_http_hermes_files_changed = {
    NGX_HTTP_CONFLICT, "file_changed",
    "the file changed while it was read; try again"
};


/*
 * A transfer of path in the owner's kernel of session, its command not
 * yet posted.  NULL: none, *err says why (NULL: the worker's failure).
 * The owner's count is taken here and given back with the request's
 * pool, as is what the transfer holds outside it.
 */

ngx_http_hermes_files_t *
ngx_http_hermes_files_create(ngx_http_request_t *r,
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner, ngx_str_t *session,
    ngx_str_t *path, ngx_uint_t get, size_t max_file,
    ngx_http_hermes_files_error_t **err)
{
    u_char                          *p;
    ngx_pool_cleanup_t              *cln;
    ngx_http_hermes_files_t         *f;
    u_char                           nonce[8];
    ngx_http_hermes_victim_t         v;
    ngx_http_hermes_kernel_ref_t     ref;
    ngx_http_hermes_main_conf_t     *hmcf;
    ngx_http_hermes_remote_file_t   *rf;
    ngx_http_hermes_backend_conf_t  *bcf;

    *err = NULL;

    if (ngx_http_hermes_files_path(path) != NGX_OK) {
        *err = &ngx_http_hermes_files_invalid_path;
        return NULL;
    }

    if (ngx_http_hermes_registry_kernel(zone, owner, session, &v, &ref)
        != NGX_OK)
    {
        *err = &ngx_http_hermes_files_no_kernel;
        return NULL;
    }

    hmcf = ngx_http_get_module_main_conf(r, ngx_http_hermes_module);
    bcf = ngx_http_hermes_backend_by_tag(hmcf, v.tag);

    if (bcf == NULL) {
        *err = &ngx_http_hermes_files_no_backend;
        return NULL;
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
        return NULL;
    }

    f = ngx_pcalloc(r->pool, sizeof(ngx_http_hermes_files_t));
    if (f == NULL) {
        return NULL;
    }

    f->r = r;
    f->path = *path;
    f->get = get;

    /* what the thread holds outside the request's pool is freed with it */

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NULL;
    }

    cln->handler = ngx_http_hermes_files_free;
    cln->data = f;

    /* each transfer holds memory of the worker's: a few an owner at once */

    f->owner = ngx_http_hermes_files_owner(owner);

    if (f->owner == NULL) {
        *err = &ngx_http_hermes_files_too_many;
        return NULL;
    }

    /* hermes_files.py's arguments: values, never shell text */

    if (v.dir_len >= sizeof(f->dir) || path->len >= sizeof(f->spath)) {
        return NULL;
    }

    *ngx_cpymem(f->dir, v.dir, v.dir_len) = '\0';
    *ngx_cpymem(f->spath, path->data, path->len) = '\0';
    ngx_sprintf(f->uid, "%i%Z",
                bcf->ops->root(bcf) ? (ngx_int_t) ref.uid : (ngx_int_t) -1);
    ngx_sprintf(f->max, "%uz%Z", max_file);

    randombytes_buf(nonce, sizeof(nonce));
    *ngx_hex_dump(f->nonce, nonce, sizeof(nonce)) = '\0';

    f->max_file = max_file;
    /* both ways a piece at a time: a transfer costs the worker a piece */
    f->piece = ngx_min(ngx_min(bcf->ops->exec_max, max_file + 1),
                       NGX_HTTP_HERMES_FILES_PIECE);
    f->bcf = bcf;
    f->host = v.host;
    f->size = -1;

    /* stdin: the script's length, the script, then a PUT's bytes */

    f->in = ngx_alloc(NGX_INT64_LEN + 1 + rf->len, r->connection->log);
    if (f->in == NULL) {
        return NULL;
    }

    p = ngx_sprintf(f->in, "%uz\n", rf->len);
    p = ngx_cpymem(p, rf->data, rf->len);
    f->in_len = p - f->in;
    f->script_len = f->in_len;

    if (get) {
        /* a piece, and room for the line before it */
        f->out_size = f->piece + NGX_HTTP_HERMES_FILES_HEAD + 1;

        f->out = ngx_alloc(f->out_size, r->connection->log);
        if (f->out == NULL) {
            return NULL;
        }
    }

    return f;
}


/*
 * A PUT's bytes: a chain of buffers in memory or in a file (nginx's temp
 * file of a body), left where they are and read a piece at a time by the
 * task; they must live as long as the request.
 */

void
ngx_http_hermes_files_set_body(ngx_http_hermes_files_t *f, ngx_chain_t *body)
{
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    f->body = body;
    f->body_len = 0;

    for (cl = body; cl; cl = cl->next) {
        b = cl->buf;
        f->body_len += b->in_file ? (size_t) (b->file_last - b->file_pos)
                                  : (size_t) (b->last - b->pos);
    }
}


/*
 * The next command posted: a PUT's whole, or a GET's next piece.  The
 * request is blocked while it runs, so that nothing frees it under the
 * thread (a client gone meanwhile is found out once it is done).
 * NGX_DECLINED: not posted, f->error says why.
 */

ngx_int_t
ngx_http_hermes_files_start(ngx_http_hermes_files_t *f)
{
    ngx_http_request_t          *r;
    ngx_http_hermes_loc_conf_t  *hlcf;

    r = f->r;
    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);

    f->error = NULL;

    f->task.ctx = f;
    f->task.handler = ngx_http_hermes_files_thread;
    f->task.event.handler = ngx_http_hermes_files_done;
    f->task.event.data = f;
    f->task.event.log = r->connection->log;

    ngx_http_hermes_backend_take(&f->conn, f->bcf, f->host);

    if (ngx_thread_task_post(hlcf->thread_pool, &f->task) != NGX_OK) {
        ngx_http_hermes_backend_give(&f->conn);
        f->error = &ngx_http_hermes_files_busy;
        return NGX_DECLINED;
    }

    r->main->blocked++;

    return NGX_OK;
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

    ngx_connection_t    *c;
    ngx_http_request_t  *r;

    r = f->r;
    c = r->connection;

    ngx_http_hermes_backend_give(&f->conn);

    r->main->blocked--;

    f->error = ngx_http_hermes_files_result(f);

    if (f->error == NULL && f->get) {
        f->offset += f->out_len;
    }

    f->handler(f);

    /* a client gone while the task ran: its request ends now */
    ngx_http_run_posted_requests(c);
}


/* the last command's outcome: NULL, or its failure by name */

static ngx_http_hermes_files_error_t *
ngx_http_hermes_files_result(ngx_http_hermes_files_t *f)
{
    if (f->rc == NGX_DECLINED) {
        return &ngx_http_hermes_files_unreachable;
    }

    switch (f->rc == NGX_OK ? f->status : -1) {

    case 0:
        break;

    case 2:
        return &ngx_http_hermes_files_no_file;

    case 3:
        return &ngx_http_hermes_files_too_large;

    case 4:
        return &ngx_http_hermes_files_refused;

    default:
        if (f->offset == 0) {
            /* a later piece's failure is its user's to tell */
            ngx_log_error(NGX_LOG_ERR, f->r->connection->log, 0,
                          "hermes: %s \"%V\" of a kernel failed (exit %d)",
                          f->get ? "reading" : "writing", &f->path,
                          f->status);
        }

        return &ngx_http_hermes_files_failed;
    }

    if (f->get && f->changed) {
        return &ngx_http_hermes_files_changed;
    }

    return NULL;
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
