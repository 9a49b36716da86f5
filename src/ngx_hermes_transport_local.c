
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: a cell's stream on a kernel of this host.  The worker is
 * its own kernel-host agent here: it ships cells/cell_req_N.json, wakes
 * the runner through its FIFO, then reads cells/cell_out_N and
 * cells/cell_res_N.json itself.  One inotify fd per worker says when to
 * look, a pidfd says when the kernel died; the files stay the truth.
 * Every open is relative to directories verified at the cell's start,
 * non-blocking, no-follow, regular files only, and reads are bounded.
 */


#include "ngx_hermes.h"
#include "ngx_hermes_local_handles.h"

#include <sys/inotify.h>


#define NGX_HTTP_HERMES_LOCAL_CHUNK    (128 * 1024)

typedef struct {
    ngx_http_hermes_stream_t       *st;
    int                             wd;
    ngx_http_hermes_local_handle_t *handle;     /* verified, borrowed */
    ngx_fd_t                        dir_fd;     /* the handle's */
    ngx_fd_t                        cells_fd;
    ngx_fd_t                        out_fd;
    off_t                           out_off;
    u_char                         *buf;        /* a chunk of cell_out */
    ngx_http_hermes_local_waiter_t  exit;       /* on the handle's pidfd */
    ngx_queue_t                     queue;      /* the worker's streams */
    unsigned                        queued:1;
    unsigned                        req_file:1; /* not inline: too large */
    unsigned                        res_ready:1;
    unsigned                        draining:1; /* result in, output not */
    unsigned                        paused:1;   /* the client is slow */
} ngx_http_hermes_local_stream_t;


static ngx_int_t ngx_http_hermes_local_stream_run(ngx_http_hermes_stream_t *st);
static void ngx_http_hermes_local_stream_resume(ngx_http_hermes_stream_t *st);
static ngx_int_t ngx_http_hermes_local_stream_interrupt(
    ngx_http_hermes_stream_t *st);
static void ngx_http_hermes_local_stream_salvage(ngx_http_hermes_stream_t *st,
    ngx_http_hermes_windows_t *w);
static void ngx_http_hermes_local_stream_close(ngx_http_hermes_stream_t *st);
static ngx_int_t ngx_http_hermes_local_stream_ship(
    ngx_http_hermes_local_stream_t *ls, ngx_uint_t wake);
static ngx_int_t ngx_http_hermes_local_stream_open_kernel(
    ngx_http_hermes_local_stream_t *ls);
static void ngx_http_hermes_local_stream_unwatch(
    ngx_http_hermes_local_stream_t *ls);
static void ngx_http_hermes_local_stream_inotify_handler(ngx_event_t *ev);
static void ngx_http_hermes_local_stream_inotify_overflow(ngx_log_t *log);
static void ngx_http_hermes_local_stream_pump(
    ngx_http_hermes_local_stream_t *ls);
static ngx_int_t ngx_http_hermes_local_stream_read_out(
    ngx_http_hermes_local_stream_t *ls, ngx_uint_t all);
static void ngx_http_hermes_local_stream_finish(
    ngx_http_hermes_local_stream_t *ls);
static ngx_int_t ngx_http_hermes_local_stream_events(
    ngx_http_hermes_local_stream_t *ls, u_char *p, size_t n);
static void ngx_http_hermes_local_stream_drain(
    ngx_http_hermes_local_stream_t *ls);
static void ngx_http_hermes_local_stream_died(void *data);
static void ngx_http_hermes_local_stream_name(
    ngx_http_hermes_local_stream_t *ls, u_char *buf, const char *what);


ngx_http_hermes_transport_t  ngx_http_hermes_transport_local = {
    ngx_http_hermes_local_stream_run,
    ngx_http_hermes_local_stream_resume,
    ngx_http_hermes_local_stream_interrupt,
    ngx_http_hermes_local_stream_salvage,
    ngx_http_hermes_local_stream_close,
    1                                       /* tools: rpc/, watched here */
};


/* per worker: one inotify fd for every cell this worker streams */

static ngx_connection_t  *ngx_http_hermes_inotify;
static ngx_queue_t        ngx_http_hermes_local_streams;


ngx_int_t
ngx_http_hermes_transport_local_init_process(ngx_cycle_t *cycle)
{
    int                fd;
    ngx_connection_t  *c;

    ngx_queue_init(&ngx_http_hermes_local_streams);
    ngx_http_hermes_local_handles_init();

    fd = inotify_init1(IN_NONBLOCK|IN_CLOEXEC);
    if (fd == -1) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      "hermes: inotify_init1() failed");
        return NGX_ERROR;
    }

    c = ngx_get_connection(fd, cycle->log);
    if (c == NULL) {
        close(fd);
        return NGX_ERROR;
    }

    c->read->handler = ngx_http_hermes_local_stream_inotify_handler;
    c->read->log = cycle->log;

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        ngx_close_connection(c);
        return NGX_ERROR;
    }

    ngx_http_hermes_inotify = c;

    return NGX_OK;
}


void
ngx_http_hermes_transport_local_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_hermes_local_handles_exit();

    if (ngx_http_hermes_inotify) {
        ngx_close_connection(ngx_http_hermes_inotify);
        ngx_http_hermes_inotify = NULL;
    }
}


/*
 * 1. the kernel: still its process and its directory; 2. watch cells/
 * before anything appears there; 3. ship the cell and wake the runner;
 * 4. told by the handle's pidfd when the kernel exits.
 */

static ngx_int_t
ngx_http_hermes_local_stream_run(ngx_http_hermes_stream_t *st)
{
    int                             wd;
    ngx_fd_t                        fd;
    ngx_int_t                       rc;
    ngx_http_hermes_local_stream_t *ls;

    ls = ngx_pcalloc(st->pool, sizeof(ngx_http_hermes_local_stream_t));
    if (ls == NULL) {
        return NGX_ERROR;
    }

    ls->st = st;
    ls->wd = -1;
    ls->dir_fd = NGX_INVALID_FILE;
    ls->cells_fd = NGX_INVALID_FILE;
    ls->out_fd = NGX_INVALID_FILE;
    st->ctx = ls;

    rc = ngx_http_hermes_local_stream_open_kernel(ls);

    if (rc == NGX_DECLINED && !st->ref->spawn) {
        st->failed(st, NGX_HTTP_HERMES_STREAM_DEAD, NULL);
        return NGX_OK;
    }

    if (rc != NGX_OK) {
        goto ship_failed;
    }

    if (st->request != NULL) {
        rc = ngx_http_hermes_local_stream_ship(ls, 0);
        if (rc != NGX_OK) {
            goto not_shipped;
        }
    }

    /*
     * cells/ watched before the runner is woken (the handle keeps the
     * watch from cell to cell; a new one sees no rename of a request)
     */

    ls->wd = ngx_http_hermes_local_handle_watch(ls->handle,
                                                ngx_http_hermes_inotify->fd,
                                                !st->quiet);
    if (ls->wd == -1) {
        ngx_log_error(NGX_LOG_ERR, st->log, ngx_errno,
                      "hermes: inotify_add_watch(\"%s/cells\") failed",
                      st->ref->dir);
        goto ship_failed;
    }

    ngx_queue_insert_tail(&ngx_http_hermes_local_streams, &ls->queue);
    ls->queued = 1;

    /* rpc/ too: the cell's tool calls (ngx_hermes_rpc.c) */

    if (st->rpc) {
        fd = ngx_http_hermes_local_handle_rpc(ls->handle, st->ref,
                                              ngx_http_hermes_inotify->fd,
                                              &wd, st->log);
        if (fd == NGX_INVALID_FILE
            || ngx_http_hermes_rpc_open(st->rpc, ls->dir_fd, fd, wd) != NGX_OK)
        {
            goto ship_failed;
        }
    }

    if (st->request == NULL) {
        /* a shipped cell's stream again, from its offset: it may be over */
        ls->out_off = st->offset;
        ls->res_ready = 1;
        goto shipped;
    }

    rc = ngx_http_hermes_local_stream_ship(ls, 1);
    if (rc != NGX_OK) {
        goto not_shipped;
    }

shipped:

    st->is_shipped = 1;

    ls->exit.handler = ngx_http_hermes_local_stream_died;
    ls->exit.data = ls;

    if (ngx_http_hermes_local_handle_wait(ls->handle, &ls->exit, st->log)
        != NGX_OK)
    {
        goto ship_failed;
    }

    if (st->shipped(st) != NGX_OK) {
        return NGX_OK;
    }

    ngx_http_hermes_local_stream_pump(ls);

    return NGX_OK;

not_shipped:

    if (rc == NGX_DECLINED && !st->ref->spawn) {
        st->failed(st, NGX_HTTP_HERMES_STREAM_DEAD, NULL);
        return NGX_OK;
    }

    if (rc == NGX_BUSY) {
        st->failed(st, NGX_HTTP_HERMES_STREAM_FULL, NULL);
        return NGX_OK;
    }

ship_failed:

    st->failed(st, NGX_HTTP_HERMES_STREAM_SHIP_FAILED, NULL);

    return NGX_OK;
}


/*
 * The request to the runner, in two steps around the watch on cells/:
 * first (wake 0) a request too large to go inline is written as
 * cells/cell_req_N.json; then (wake 1) a small one goes inline in "wake",
 * or the file's wake-up byte.  NGX_DECLINED: the kernel is gone; NGX_BUSY:
 * its disk is full; NGX_ERROR: not shipped.
 */

static ngx_int_t
ngx_http_hermes_local_stream_ship(ngx_http_hermes_local_stream_t *ls,
    ngx_uint_t wake)
{
    u_char                     name[64];
    size_t                     len;
    ngx_int_t                  rc;
    ngx_http_hermes_stream_t  *st;

    st = ls->st;
    len = st->request->last - st->request->pos;

    if (wake && !ls->req_file) {
        rc = ngx_http_hermes_local_ship_inline(ls->handle->wake_fd,
                                               st->request->pos, len, st->log);
        if (rc != NGX_AGAIN) {
            return rc;
        }

        /* the FIFO full: the file after all */

    } else if (wake) {
        return ngx_http_hermes_local_wake(ls->handle->wake_fd, st->log);

    } else if (len + 1 <= PIPE_BUF) {
        return NGX_OK;
    }

    ls->req_file = 1;

    ngx_http_hermes_local_stream_name(ls, name, "cell_req");

    rc = ngx_http_hermes_local_write_at(ls->cells_fd, (char *) name,
                                        st->request->pos, len,
                                        (ngx_uid_t) st->ref->uid, st->log);

    if (rc == NGX_DECLINED) {
        return NGX_BUSY;
    }

    if (rc != NGX_OK || !wake) {
        return rc;
    }

    return ngx_http_hermes_local_wake(ls->handle->wake_fd, st->log);
}


/*
 * The kernel's verified handles (ngx_hermes_local_handles.c).
 * NGX_DECLINED: it is not that kernel any more; NGX_ERROR: we cannot tell.
 */

static ngx_int_t
ngx_http_hermes_local_stream_open_kernel(ngx_http_hermes_local_stream_t *ls)
{
    ngx_int_t  rc;

    rc = ngx_http_hermes_local_handle_get(ls->st->ref, &ls->handle,
                                          ls->st->log);
    if (rc != NGX_OK) {
        return rc;
    }

    ls->dir_fd = ls->handle->dir_fd;
    ls->cells_fd = ls->handle->cells_fd;

    return NGX_OK;
}


/* the result is in: no more events of this kernel concern the cell */

static void
ngx_http_hermes_local_stream_unwatch(ngx_http_hermes_local_stream_t *ls)
{
    if (ls->wd != -1) {
        /* the watch is the handle's: kept for the kernel's next cell */
        ngx_http_hermes_local_handle_unwatch(ls->handle, !ls->st->quiet);
        ls->wd = -1;
    }

    ngx_http_hermes_local_handle_unwait(&ls->exit);
}


/* what a cell held of its kernel's host: fds, watch, its wait on the pidfd */

static void
ngx_http_hermes_local_stream_close(ngx_http_hermes_stream_t *st)
{
    ngx_http_hermes_local_stream_t *ls = st->ctx;

    if (ls == NULL) {
        return;
    }

    ngx_http_hermes_local_stream_unwatch(ls);

    if (ls->out_fd != NGX_INVALID_FILE) {
        close(ls->out_fd);
        ls->out_fd = NGX_INVALID_FILE;
    }

    if (ls->handle) {
        ngx_http_hermes_local_handle_put(ls->handle, 0);
        ls->handle = NULL;
        ls->cells_fd = NGX_INVALID_FILE;
        ls->dir_fd = NGX_INVALID_FILE;
    }

    if (ls->queued) {
        ngx_queue_remove(&ls->queue);
        ls->queued = 0;
    }

    st->ctx = NULL;
}


static void
ngx_http_hermes_local_stream_inotify_handler(ngx_event_t *ev)
{
    ssize_t                          n;
    u_char                          *p, res[32];
    ngx_uint_t                       ours;
    ngx_queue_t                     *q, *next;
    ngx_connection_t                *c, *client;
    struct inotify_event            *e;
    ngx_http_hermes_local_stream_t  *ls;
    u_char                           buf[4096]
                    __attribute__ ((aligned(__alignof__(struct inotify_event))));

    c = ev->data;

    for ( ;; ) {
        n = read(c->fd, buf, sizeof(buf));

        if (n == -1) {
            if (ngx_errno == NGX_EAGAIN) {
                break;
            }

            if (ngx_errno == NGX_EINTR) {
                continue;
            }

            ngx_log_error(NGX_LOG_ALERT, ev->log, ngx_errno,
                          "hermes: inotify read() failed");
            break;
        }

        for (p = buf; p < buf + n; p += sizeof(struct inotify_event) + e->len) {
            e = (struct inotify_event *) p;

            if (e->mask & IN_Q_OVERFLOW) {
                /* events were lost (a cell can make many): look at all */
                ngx_http_hermes_local_stream_inotify_overflow(ev->log);
                continue;
            }

            if (e->mask & IN_IGNORED) {
                /* a kernel dir's cells/ is gone: so are its handles */
                ngx_http_hermes_local_handles_ignored(e->wd);
            }

            /* every stream of that directory: a cell, and its readers */

            ours = 0;

            for (q = ngx_queue_head(&ngx_http_hermes_local_streams);
                 q != ngx_queue_sentinel(&ngx_http_hermes_local_streams);
                 q = next)
            {
                /* a pump may end its own stream, no other */
                next = ngx_queue_next(q);
                ls = ngx_queue_data(q, ngx_http_hermes_local_stream_t, queue);

                if (ls->st->rpc && ngx_http_hermes_rpc_wd(ls->st->rpc) == e->wd)
                {
                    ours = 1;
                    client = ls->st->client;

                    ngx_http_hermes_rpc_notify(ls->st->rpc, (u_char *) e->name,
                                               e->len);

                    if (client) {
                        ngx_http_run_posted_requests(client);
                    }

                    break;
                }

                if (ls->wd != e->wd) {
                    continue;
                }

                ours = 1;

                if (!ls->st->is_shipped) {
                    continue;
                }

                if (e->mask & IN_MOVED_TO) {
                    ngx_sprintf(res, "cell_res_%06uD.json%Z",
                                ls->st->ref->cell_id);

                    if (e->len && ngx_strcmp(e->name, res) == 0) {
                        ls->res_ready = 1;
                    }
                }

                client = ls->st->client;

                ngx_http_hermes_local_stream_pump(ls);

                if (client) {
                    ngx_http_run_posted_requests(client);
                }
            }

            if (!ours && !(e->mask & IN_IGNORED)) {
                /* another worker runs the kernel's cells now */
                ngx_http_hermes_local_handles_quiet(e->wd);
            }
        }
    }

    if (ngx_handle_read_event(ev, 0) != NGX_OK) {
        ngx_log_error(NGX_LOG_ALERT, ev->log, 0,
                      "hermes: inotify event failed");
    }
}


static void
ngx_http_hermes_local_stream_inotify_overflow(ngx_log_t *log)
{
    ngx_queue_t                     *q, *next;
    ngx_http_hermes_local_stream_t  *ls;

    ngx_log_error(NGX_LOG_WARN, log, 0,
                  "hermes: inotify queue overflow, checking every cell");

    for (q = ngx_queue_head(&ngx_http_hermes_local_streams);
         q != ngx_queue_sentinel(&ngx_http_hermes_local_streams);
         q = next)
    {
        /* a pump may end its own cell, no other */
        next = ngx_queue_next(q);
        ls = ngx_queue_data(q, ngx_http_hermes_local_stream_t, queue);

        if (ls->st->rpc) {
            ngx_http_hermes_rpc_scan(ls->st->rpc, 0);
        }

        if (ls->st->is_shipped && ls->wd != -1 && !ls->draining) {
            ls->res_ready = 1;
            ngx_http_hermes_local_stream_pump(ls);
        }
    }
}


static void
ngx_http_hermes_local_stream_pump(ngx_http_hermes_local_stream_t *ls)
{
    ngx_http_hermes_stream_t  *st;

    st = ls->st;

    if (!st->quiet
        && ngx_http_hermes_local_stream_read_out(ls, 0) == NGX_ERROR)
    {
        st->failed(st, NGX_HTTP_HERMES_STREAM_LOST,
                   "reading the cell's output failed");
        return;
    }

    if (ls->res_ready) {
        ngx_http_hermes_local_stream_finish(ls);
    }
}


/*
 * Hand over the complete event lines the runner appended to cell_out_N;
 * a partial line is read again next time.  "all" drains to the end.
 * Reads stop while the client has not taken what was sent (NGX_AGAIN:
 * resume comes back), and for good at out_limit, whatever the cell made
 * of its file (a 300 MB sparse one, say).
 */

static ngx_int_t
ngx_http_hermes_local_stream_read_out(ngx_http_hermes_local_stream_t *ls,
    ngx_uint_t all)
{
    u_char                    name[64], *nl;
    size_t                    size;
    ssize_t                   n;
    ngx_int_t                 rc;
    ngx_http_hermes_stream_t *st;

    st = ls->st;

    if (ls->out_fd == NGX_INVALID_FILE) {
        ngx_http_hermes_local_stream_name(ls, name, "cell_out");

        ls->out_fd = ngx_http_hermes_local_open_at(ls->cells_fd,
                                                   (char *) name, NULL);

        if (ls->out_fd == NGX_INVALID_FILE) {
            if (ngx_errno == NGX_ENOENT) {
                return NGX_OK;
            }

            ngx_log_error(NGX_LOG_ERR, st->log, ngx_errno,
                          "hermes: kernel %*s: \"%s\" is not a regular file "
                          "the module can read", (size_t) NGX_HTTP_HERMES_ID_LEN,
                          st->ref->kernel_id, name);
            return NGX_ERROR;
        }
    }

    if (ls->buf == NULL) {
        ls->buf = ngx_pnalloc(st->pool, NGX_HTTP_HERMES_LOCAL_CHUNK);
        if (ls->buf == NULL) {
            return NGX_ERROR;
        }
    }

    while (!ls->paused && ls->out_off < st->out_limit) {

        size = ngx_min((off_t) NGX_HTTP_HERMES_LOCAL_CHUNK,
                       st->out_limit - ls->out_off);

        n = pread(ls->out_fd, ls->buf, size, ls->out_off);

        if (n == -1) {
            return NGX_ERROR;
        }

        /* up to the last newline: glibc's memrchr, not a byte loop (a
         * 1 MB output's event lines, 64 KiB each, cost 1 ms a cell) */

        nl = (n > 0) ? memrchr(ls->buf, '\n', n) : NULL;

        if (nl) {
            nl++;

        } else if (n == (ssize_t) size || (all && n > 0)) {
            /* a line longer than a chunk, or the unterminated tail */
            nl = ls->buf + n;

        } else {
            /* nothing complete yet */
            break;
        }

        ls->out_off += nl - ls->buf;

        /* one chunk at a time: the client sets the pace */

        rc = st->output(st, ls->buf, nl - ls->buf);

        if (rc == NGX_ERROR) {
            return NGX_ERROR;
        }

        if (rc == NGX_AGAIN) {
            ls->paused = 1;
        }

        if (n < (ssize_t) size && nl == ls->buf + n && !all) {
            break;
        }
    }

    if (ls->out_off >= st->out_limit) {
        if (!st->truncated) {
            ngx_log_error(NGX_LOG_WARN, st->log, 0,
                          "hermes: cell %uD of kernel %*s wrote more than "
                          "%O bytes of output events, the rest is not read",
                          st->ref->cell_id, (size_t) NGX_HTTP_HERMES_ID_LEN,
                          st->ref->kernel_id, st->out_limit);
        }

        st->truncated = 1;
        return NGX_OK;
    }

    return ls->paused ? NGX_AGAIN : NGX_OK;
}


/*
 * The result is there: read it (bounded), hand it over, then the rest.
 * The result is the file's last line; event lines may come before it.
 */

static void
ngx_http_hermes_local_stream_finish(ngx_http_hermes_local_stream_t *ls)
{
    u_char                    name[64], *data, *res;
    off_t                     size;
    ssize_t                   n;
    ngx_int_t                 rc;
    ngx_fd_t                  fd;
    ngx_http_hermes_stream_t *st;

    st = ls->st;

    if (ls->draining) {
        ngx_http_hermes_local_stream_drain(ls);
        return;
    }

    ngx_http_hermes_local_stream_name(ls, name, "cell_res");

    fd = ngx_http_hermes_local_open_at(ls->cells_fd, (char *) name, &size);

    if (fd == NGX_INVALID_FILE) {
        if (ngx_errno == NGX_ENOENT) {
            ls->res_ready = 0;
            return;
        }

        goto unreadable;
    }

    if (size > (off_t) st->res_limit) {
        close(fd);
        goto unreadable;
    }

    data = ngx_pnalloc(st->pool, size + 1);
    if (data == NULL) {
        close(fd);
        goto unreadable;
    }

    n = pread(fd, data, size, 0);
    close(fd);

    if (n != size) {
        goto unreadable;
    }

    res = (n > 0) ? memrchr(data, '\n', n) : NULL;
    res = (res == NULL) ? data : res + 1;

    /* the kernel is free for the next cell: its events are not ours */

    ngx_http_hermes_local_stream_unwatch(ls);
    ls->draining = 1;

    if (st->result(st, res, data + n - res) != NGX_OK) {
        return;
    }

    rc = ngx_http_hermes_local_stream_events(ls, data, res - data);

    if (rc == NGX_AGAIN) {
        ls->paused = 1;
        return;
    }

    if (rc == NGX_ERROR) {
        st->truncated = 1;
    }

    ngx_http_hermes_local_stream_drain(ls);
    return;

unreadable:

    ngx_log_error(NGX_LOG_ERR, st->log, ngx_errno,
                  "hermes: kernel %*s: unreadable result \"%s\" (not a "
                  "regular file, or too big)",
                  (size_t) NGX_HTTP_HERMES_ID_LEN, st->ref->kernel_id, name);

    st->failed(st, NGX_HTTP_HERMES_STREAM_LOST,
               "the kernel wrote an unreadable result");
}


/*
 * The event lines before a result: a cell's whole stream when its code
 * was over before it made cell_out_N (the runner's _Sink.ending), from
 * out_off on (a resumed stream's offset), as cell_out_N's would be.  The
 * runner makes no cell_out_N then; one the cell made is read instead.
 */

static ngx_int_t
ngx_http_hermes_local_stream_events(ngx_http_hermes_local_stream_t *ls,
    u_char *p, size_t n)
{
    ngx_http_hermes_stream_t  *st;

    st = ls->st;

    if (st->quiet || ls->out_fd != NGX_INVALID_FILE) {
        return NGX_OK;
    }

    if ((off_t) n > st->out_limit) {
        n = (size_t) st->out_limit;
        st->truncated = 1;
    }

    if (ls->out_off >= (off_t) n) {
        return NGX_OK;
    }

    p += ls->out_off;
    n -= (size_t) ls->out_off;
    ls->out_off += n;

    return st->output(st, p, n);
}


/* what is left of the output goes to the client at its own pace */

static void
ngx_http_hermes_local_stream_drain(ngx_http_hermes_local_stream_t *ls)
{
    ngx_int_t                  rc;
    ngx_http_hermes_stream_t  *st;

    st = ls->st;

    if (!st->quiet) {
        rc = ngx_http_hermes_local_stream_read_out(ls, 1);

        if (rc == NGX_AGAIN) {
            return;
        }

        if (rc == NGX_ERROR) {
            st->truncated = 1;
        }
    }

    st->done(st);
}


static void
ngx_http_hermes_local_stream_resume(ngx_http_hermes_stream_t *st)
{
    ngx_http_hermes_local_stream_t *ls = st->ctx;

    if (ls == NULL) {
        return;
    }

    ls->paused = 0;

    if (ls->draining) {
        ngx_http_hermes_local_stream_drain(ls);
        return;
    }

    if (st->is_shipped) {
        ngx_http_hermes_local_stream_pump(ls);
    }
}


static void
ngx_http_hermes_local_stream_died(void *data)
{
    ngx_http_hermes_local_stream_t  *ls = data;

    u_char                     name[64];
    ngx_file_info_t            fi;
    ngx_connection_t          *c;
    ngx_http_hermes_stream_t  *st;

    st = ls->st;
    c = st->client;

    /* SystemExit writes its result, then exits: prefer the result */

    ngx_http_hermes_local_stream_name(ls, name, "cell_res");

    if (fstatat(ls->cells_fd, (char *) name, &fi, AT_SYMLINK_NOFOLLOW) == 0) {
        ls->res_ready = 1;
        ngx_http_hermes_local_stream_pump(ls);
        goto done;
    }

    /* no result: the kernel died mid-cell */

    ngx_log_error(NGX_LOG_WARN, st->log, 0,
                  "hermes: kernel %*s died during cell %uD",
                  (size_t) NGX_HTTP_HERMES_ID_LEN, st->ref->kernel_id,
                  st->ref->cell_id);

    st->failed(st, NGX_HTTP_HERMES_STREAM_LOST,
               "the kernel died while running the cell; its state is lost");

done:

    if (c) {
        ngx_http_run_posted_requests(c);
    }
}


/*
 * "N\n" into the kernel's intr FIFO: the runner raises KeyboardInterrupt
 * in cell N if it still runs.  The runner may be in a sandbox of its own,
 * where no signal of ours reaches it.  NGX_DECLINED: not told: the cell is
 * not shipped, or the kernel is not there (any more).
 */

static ngx_int_t
ngx_http_hermes_local_stream_interrupt(ngx_http_hermes_stream_t *st)
{
    ngx_http_hermes_local_stream_t *ls = st->ctx;

    if (ls == NULL || !st->is_shipped || ls->dir_fd == NGX_INVALID_FILE) {
        return NGX_DECLINED;
    }

    return ngx_http_hermes_local_interrupt(ls->dir_fd, st->ref->cell_id,
                                           st->log);
}


/*
 * The kernel is gone without a result, but what the cell printed is in
 * cell_out: its head and tail, bounded windows of the file.
 */

static void
ngx_http_hermes_local_stream_salvage(ngx_http_hermes_stream_t *st,
    ngx_http_hermes_windows_t *w)
{
    off_t                            size, toff;
    u_char                           name[64];
    ngx_fd_t                         fd;
    ngx_http_hermes_local_stream_t  *ls = st->ctx;

    if (ls == NULL || !st->is_shipped || ls->cells_fd == NGX_INVALID_FILE) {
        return;
    }

    ngx_http_hermes_local_stream_name(ls, name, "cell_out");

    fd = ngx_http_hermes_local_open_at(ls->cells_fd, (char *) name, &size);
    if (fd == NGX_INVALID_FILE) {
        return;
    }

    w->head = (size_t) ngx_min(size, (off_t) w->head);
    toff = ngx_max((off_t) w->head, size - (off_t) w->tail);
    w->tail = (size_t) (size - toff);
    w->gap = (toff > (off_t) w->head);

    w->data = ngx_pnalloc(st->pool, w->head + w->tail);

    if (w->data == NULL
        || pread(fd, w->data, w->head, 0) != (ssize_t) w->head
        || pread(fd, w->data + w->head, w->tail, toff) != (ssize_t) w->tail)
    {
        w->data = NULL;
    }

    close(fd);
}


/* a file of this cell in cells/: "cell_req", "cell_out", "cell_res" */

static void
ngx_http_hermes_local_stream_name(ngx_http_hermes_local_stream_t *ls,
    u_char *buf, const char *what)
{
    ngx_sprintf(buf, "%s_%06uD%s%Z", what, ls->st->ref->cell_id,
                what[5] == 'o' ? "" : ".json");
}
