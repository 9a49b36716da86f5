
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: a worker's verified handles on its local kernels.  Before a
 * cell goes to a kernel it must still be that kernel: the pid alive and
 * the process started when the kernel was, the directory the one made at
 * spawn, ours and owner-only.  Proving it anew each cell (pidfd_open, the
 * start time from /proc, opening the dir and cells/ by path) was a third
 * of a worker's system calls a trivial cell; so the pidfd, the two
 * directory fds and the wake FIFO, once verified, are kept for the next
 * cell of the kernel, at most NGX_HTTP_HERMES_LOCAL_HANDLES a worker (the
 * least recently used let go first).  Each cell then checks what can
 * change: the process still alive (a poll of its pidfd: a pid reused is
 * another process, not this pidfd's), the dir still the one at its path,
 * it and cells/ still owner-only, and cells/ still the one we hold (a
 * cell may have made a new one).
 *
 * The watch on cells/ is kept with them: adding and removing it each cell
 * (a path walk, a mark made and freed by a kernel worker) cost more than
 * changing its mask.  It asks for the result's rename (and the
 * directory's end); the writes to cell_out only while a cell of ours
 * streams.  When an event comes that no cell of ours waits on, another
 * worker runs the kernel's cells now: the watches on cells/ and rpc/ then
 * ask only for the directory's end, until a cell of ours runs there again
 * (each of those events woke this worker, on another CPU, to be dropped).
 * inotify gives one watch a directory and inotify fd, so handles of one
 * kernel (a kept one and one of a cell alone, when every kept handle was
 * in use) share it.
 *
 * The pidfd goes into the event loop once, at its handle's first cell, and
 * stays there with the handle (a connection of the worker's each): the
 * cells waiting on their kernel are told from it when it exits.  A dup of
 * it a cell, added and removed, was four system calls of each cell.
 */


#include "ngx_hermes.h"
#include "ngx_hermes_local_handles.h"

#include <poll.h>
#include <sys/inotify.h>
#include <sys/syscall.h>


#define NGX_HTTP_HERMES_LOCAL_HANDLES  64

#define NGX_HTTP_HERMES_LOCAL_WATCH                                           \
    (IN_MOVED_TO|IN_DELETE_SELF|IN_ONLYDIR)

#define NGX_HTTP_HERMES_LOCAL_RPC_WATCH                                       \
    (IN_MOVED_TO|IN_CLOSE_WRITE|IN_ONLYDIR)

/* while no cell of ours runs there: the end of the directory only */
#define NGX_HTTP_HERMES_LOCAL_QUIET  (IN_DELETE_SELF|IN_ONLYDIR)


typedef struct {
    ngx_http_hermes_local_handle_t  handle;     /* first: the cast back */
    ngx_queue_t                     queue;      /* most recently used first */
    int                             wd;         /* cells/ watched, or -1 */
    int                             ifd;        /* by this inotify fd */
    ngx_uint_t                      streaming;  /* users asking for writes */
    ngx_fd_t                        rpc_fd;     /* rpc/, once a cell asks */
    uint64_t                        rpc_ino;
    int                             rpc_wd;
    u_char                          kernel_id[NGX_HTTP_HERMES_ID_LEN];
    ngx_pid_t                       pid;
    uint64_t                        start;
    uint64_t                        ino;
    uint64_t                        cells_ino;
    ngx_uint_t                      users;
    ngx_connection_t               *exit_c;     /* the pidfd, in epoll */
    ngx_queue_t                     waiters;
    unsigned                        exited:1;   /* the pidfd said so */
    unsigned                        cached:1;
    unsigned                        modify:1;   /* the watch asks for writes */
    unsigned                        quiet:1;    /* cells/'s asks for no event */
    unsigned                        rpc_quiet:1;
} ngx_http_hermes_local_entry_t;


static ngx_int_t ngx_http_hermes_local_handle_open(
    ngx_http_hermes_local_entry_t *e, ngx_http_hermes_kernel_ref_t *ref,
    ngx_log_t *log);
static ngx_int_t ngx_http_hermes_local_handle_check(
    ngx_http_hermes_local_entry_t *e, ngx_http_hermes_kernel_ref_t *ref);
static ngx_int_t ngx_http_hermes_local_private_dir(ngx_file_info_t *fi,
    uint32_t uid);
static void ngx_http_hermes_local_handles_reap(void);
static void ngx_http_hermes_local_handle_drop(
    ngx_http_hermes_local_entry_t *e);
static void ngx_http_hermes_local_handle_free(
    ngx_http_hermes_local_entry_t *e);
static int ngx_http_hermes_local_handle_mask(int ifd, ngx_fd_t fd,
    uint32_t mask);
static void ngx_http_hermes_local_handles_rpc_loud(int wd);
static void ngx_http_hermes_local_handle_exit_handler(ngx_event_t *ev);


/* every handle: those kept (cached, LRU order), and those of a cell alone */
static ngx_queue_t  ngx_http_hermes_local_handles;
static ngx_uint_t   ngx_http_hermes_local_handles_n;    /* kept */


void
ngx_http_hermes_local_handles_init(void)
{
    ngx_queue_init(&ngx_http_hermes_local_handles);
    ngx_http_hermes_local_handles_n = 0;
}


/*
 * NGX_OK: *handle is the kernel's, verified; NGX_DECLINED: it is not that
 * kernel (any more); NGX_ERROR: we cannot tell.
 */

ngx_int_t
ngx_http_hermes_local_handle_get(ngx_http_hermes_kernel_ref_t *ref,
    ngx_http_hermes_local_handle_t **handle, ngx_log_t *log)
{
    ngx_int_t                       rc;
    ngx_queue_t                    *q;
    ngx_http_hermes_local_entry_t  *e, *old;

    for (q = ngx_queue_head(&ngx_http_hermes_local_handles);
         q != ngx_queue_sentinel(&ngx_http_hermes_local_handles);
         q = ngx_queue_next(q))
    {
        e = ngx_queue_data(q, ngx_http_hermes_local_entry_t, queue);

        if (!e->cached
            || e->pid != ref->pid || e->start != ref->start || e->ino != ref->ino
            || ngx_memcmp(e->kernel_id, ref->kernel_id,
                          NGX_HTTP_HERMES_ID_LEN) != 0)
        {
            continue;
        }

        rc = ngx_http_hermes_local_handle_check(e, ref);

        if (rc != NGX_OK) {
            ngx_log_error(NGX_LOG_WARN, log, 0,
                          "hermes: kernel %*s has exited, or \"%s\" is no "
                          "longer its owner-only directory",
                          (size_t) NGX_HTTP_HERMES_ID_LEN, ref->kernel_id,
                          ref->dir);
            ngx_http_hermes_local_handle_drop(e);
            return rc;
        }

        ngx_queue_remove(&e->queue);
        ngx_queue_insert_head(&ngx_http_hermes_local_handles, &e->queue);

        e->users++;
        *handle = &e->handle;

        return NGX_OK;
    }

    e = ngx_calloc(sizeof(ngx_http_hermes_local_entry_t), log);
    if (e == NULL) {
        return NGX_ERROR;
    }

    e->handle.pidfd = NGX_INVALID_FILE;
    e->handle.dir_fd = NGX_INVALID_FILE;
    e->handle.cells_fd = NGX_INVALID_FILE;
    e->handle.wake_fd = NGX_INVALID_FILE;
    e->rpc_fd = NGX_INVALID_FILE;
    e->wd = -1;
    e->rpc_wd = -1;
    e->users = 1;
    ngx_queue_init(&e->waiters);

    rc = ngx_http_hermes_local_handle_open(e, ref, log);

    if (rc != NGX_OK) {
        ngx_http_hermes_local_handle_free(e);
        return rc;
    }

    ngx_memcpy(e->kernel_id, ref->kernel_id, NGX_HTTP_HERMES_ID_LEN);
    e->pid = ref->pid;
    e->start = ref->start;
    e->ino = ref->ino;

    /* room: kernels that exited go first, then the least recently used */

    if (ngx_http_hermes_local_handles_n >= NGX_HTTP_HERMES_LOCAL_HANDLES) {
        ngx_http_hermes_local_handles_reap();
    }

    for (q = ngx_queue_last(&ngx_http_hermes_local_handles);
         ngx_http_hermes_local_handles_n >= NGX_HTTP_HERMES_LOCAL_HANDLES
         && q != ngx_queue_sentinel(&ngx_http_hermes_local_handles);
         /* void */)
    {
        old = ngx_queue_data(q, ngx_http_hermes_local_entry_t, queue);
        q = ngx_queue_prev(q);

        if (old->cached && old->users == 0) {
            ngx_http_hermes_local_handle_free(old);
        }
    }

    ngx_queue_insert_head(&ngx_http_hermes_local_handles, &e->queue);

    if (ngx_http_hermes_local_handles_n < NGX_HTTP_HERMES_LOCAL_HANDLES) {
        /* else every handle is in use: this one is the cell's alone */
        ngx_http_hermes_local_handles_n++;
        e->cached = 1;
    }

    *handle = &e->handle;

    return NGX_OK;
}


/* the cell is done with it; drop: the kernel is not what it was */

void
ngx_http_hermes_local_handle_put(ngx_http_hermes_local_handle_t *handle,
    ngx_uint_t drop)
{
    ngx_http_hermes_local_entry_t  *e;

    e = (ngx_http_hermes_local_entry_t *) handle;

    e->users--;

    if (drop || (e->users == 0 && !e->cached)) {
        ngx_http_hermes_local_handle_drop(e);
    }
}


/* no longer kept for later cells; freed once no cell has it */

static void
ngx_http_hermes_local_handle_drop(ngx_http_hermes_local_entry_t *e)
{
    if (e->cached) {
        ngx_http_hermes_local_handles_n--;
        e->cached = 0;
    }

    if (e->users == 0) {
        ngx_http_hermes_local_handle_free(e);
    }
}


void
ngx_http_hermes_local_handles_exit(void)
{
    ngx_queue_t                    *q, *next;
    ngx_http_hermes_local_entry_t  *e;

    for (q = ngx_queue_head(&ngx_http_hermes_local_handles);
         q != ngx_queue_sentinel(&ngx_http_hermes_local_handles);
         q = next)
    {
        next = ngx_queue_next(q);
        e = ngx_queue_data(q, ngx_http_hermes_local_entry_t, queue);
        ngx_http_hermes_local_handle_drop(e);
    }
}


/*
 * The cell's "w" told when the kernel exits, once.  The pidfd is added to
 * the event loop at the first wait and left there.  It is edge-triggered:
 * a waiter that comes after the exit was told is told by a posted event
 * (though the check before its cell finds the exit first).
 */

ngx_int_t
ngx_http_hermes_local_handle_wait(ngx_http_hermes_local_handle_t *handle,
    ngx_http_hermes_local_waiter_t *w, ngx_log_t *log)
{
    ngx_connection_t               *c;
    ngx_http_hermes_local_entry_t  *e;

    e = (ngx_http_hermes_local_entry_t *) handle;
    c = e->exit_c;

    if (c == NULL) {
        c = ngx_get_connection(handle->pidfd, ngx_cycle->log);
        if (c == NULL) {
            return NGX_ERROR;
        }

        c->data = e;
        c->read->handler = ngx_http_hermes_local_handle_exit_handler;
        c->read->log = ngx_cycle->log;

        if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
            ngx_log_error(NGX_LOG_ERR, log, 0,
                          "hermes: a kernel's pidfd could not be watched");
            ngx_free_connection(c);
            c->fd = (ngx_socket_t) -1;
            return NGX_ERROR;
        }

        e->exit_c = c;
    }

    ngx_queue_insert_tail(&e->waiters, &w->queue);

    if (e->exited) {
        ngx_post_event(c->read, &ngx_posted_events);
    }

    return NGX_OK;
}


void
ngx_http_hermes_local_handle_unwait(ngx_http_hermes_local_waiter_t *w)
{
    if (w->queue.prev) {
        ngx_queue_remove(&w->queue);
        w->queue.prev = NULL;
    }
}


static void
ngx_http_hermes_local_handle_exit_handler(ngx_event_t *ev)
{
    ngx_queue_t                     *q;
    ngx_connection_t                *c;
    ngx_http_hermes_local_entry_t   *e;
    ngx_http_hermes_local_waiter_t  *w;

    c = ev->data;
    e = c->data;

    e->exited = 1;

    if (ngx_queue_empty(&e->waiters)) {
        return;
    }

    /* a waiter's end may put the handle: ours keeps it till the last */

    e->users++;

    while (!ngx_queue_empty(&e->waiters)) {
        q = ngx_queue_head(&e->waiters);
        w = ngx_queue_data(q, ngx_http_hermes_local_waiter_t, queue);

        ngx_http_hermes_local_handle_unwait(w);
        w->handler(w->data);
    }

    ngx_http_hermes_local_handle_put(&e->handle, 0);
}


/*
 * cells/ watched for this cell: the result's rename, and with output the
 * writes to cell_out.  -> the watch descriptor, -1 on failure (errno).
 */

int
ngx_http_hermes_local_handle_watch(ngx_http_hermes_local_handle_t *handle,
    int ifd, ngx_uint_t output)
{
    int                             wd;
    uint32_t                        mask;
    ngx_queue_t                    *q;
    ngx_http_hermes_local_entry_t  *e, *o;

    e = (ngx_http_hermes_local_entry_t *) handle;

    if (e->wd != -1 && !e->quiet && (!output || e->modify)) {
        e->streaming += output;
        return e->wd;
    }

    mask = NGX_HTTP_HERMES_LOCAL_WATCH|IN_MASK_ADD | (output ? IN_MODIFY : 0);

    wd = ngx_http_hermes_local_handle_mask(ifd, handle->cells_fd, mask);
    if (wd == -1) {
        return -1;
    }

    e->wd = wd;
    e->ifd = ifd;
    e->streaming += output;
    e->modify |= output;

    /* a handle sharing the watch shares its mask */

    for (q = ngx_queue_head(&ngx_http_hermes_local_handles);
         q != ngx_queue_sentinel(&ngx_http_hermes_local_handles);
         q = ngx_queue_next(q))
    {
        o = ngx_queue_data(q, ngx_http_hermes_local_entry_t, queue);

        if (o->wd == wd) {
            o->modify |= output;
            o->quiet = 0;
        }
    }

    return wd;
}


/* the cell is done with cells/: a watch for writes goes back to less */

void
ngx_http_hermes_local_handle_unwatch(ngx_http_hermes_local_handle_t *handle,
    ngx_uint_t output)
{
    ngx_uint_t                      streaming;
    ngx_queue_t                    *q;
    ngx_http_hermes_local_entry_t  *e, *o;

    e = (ngx_http_hermes_local_entry_t *) handle;

    if (!output || e->streaming == 0) {
        return;
    }

    if (--e->streaming != 0 || e->wd == -1) {
        return;
    }

    streaming = 0;

    for (q = ngx_queue_head(&ngx_http_hermes_local_handles);
         q != ngx_queue_sentinel(&ngx_http_hermes_local_handles);
         q = ngx_queue_next(q))
    {
        o = ngx_queue_data(q, ngx_http_hermes_local_entry_t, queue);

        if (o->wd == e->wd) {
            streaming += o->streaming;
        }
    }

    if (streaming) {
        return;
    }

    /* without IN_MASK_ADD: the mask is replaced */

    if (ngx_http_hermes_local_handle_mask(e->ifd, handle->cells_fd,
                                          NGX_HTTP_HERMES_LOCAL_WATCH)
        != e->wd)
    {
        return;
    }

    for (q = ngx_queue_head(&ngx_http_hermes_local_handles);
         q != ngx_queue_sentinel(&ngx_http_hermes_local_handles);
         q = ngx_queue_next(q))
    {
        o = ngx_queue_data(q, ngx_http_hermes_local_entry_t, queue);

        if (o->wd == e->wd) {
            o->modify = 0;
        }
    }
}


/*
 * An event of watch wd that no cell of ours waits on: the kernel's cells
 * run in another worker now.  Its watch (cells/ or rpc/) asks for the
 * directory's end only, until a cell of ours is there again.
 */

void
ngx_http_hermes_local_handles_quiet(int wd)
{
    ngx_fd_t                        fd;
    ngx_uint_t                      rpc;
    ngx_queue_t                    *q;
    ngx_http_hermes_local_entry_t  *e, *first;

    first = NULL;
    rpc = 0;

    for (q = ngx_queue_head(&ngx_http_hermes_local_handles);
         q != ngx_queue_sentinel(&ngx_http_hermes_local_handles);
         q = ngx_queue_next(q))
    {
        e = ngx_queue_data(q, ngx_http_hermes_local_entry_t, queue);

        if (e->wd != wd && e->rpc_wd != wd) {
            continue;
        }

        if (e->users) {
            return;
        }

        if (first == NULL) {
            first = e;
            rpc = (e->rpc_wd == wd);
        }
    }

    if (first == NULL || (rpc ? first->rpc_quiet : first->quiet)) {
        return;
    }

    fd = rpc ? first->rpc_fd : first->handle.cells_fd;

    if (ngx_http_hermes_local_handle_mask(first->ifd, fd,
                                          NGX_HTTP_HERMES_LOCAL_QUIET)
        != wd)
    {
        return;
    }

    for (q = ngx_queue_head(&ngx_http_hermes_local_handles);
         q != ngx_queue_sentinel(&ngx_http_hermes_local_handles);
         q = ngx_queue_next(q))
    {
        e = ngx_queue_data(q, ngx_http_hermes_local_entry_t, queue);

        if (rpc && e->rpc_wd == wd) {
            e->rpc_quiet = 1;

        } else if (!rpc && e->wd == wd) {
            e->quiet = 1;
            e->modify = 0;
        }
    }
}


/* rpc/'s watch wd asks for the tool calls again */

static void
ngx_http_hermes_local_handles_rpc_loud(int wd)
{
    ngx_queue_t                    *q;
    ngx_http_hermes_local_entry_t  *e;

    for (q = ngx_queue_head(&ngx_http_hermes_local_handles);
         q != ngx_queue_sentinel(&ngx_http_hermes_local_handles);
         q = ngx_queue_next(q))
    {
        e = ngx_queue_data(q, ngx_http_hermes_local_entry_t, queue);

        if (e->rpc_wd == wd) {
            e->rpc_quiet = 0;
        }
    }
}


/* a watch on a directory we hold, by its fd: -> its wd, or -1 */

static int
ngx_http_hermes_local_handle_mask(int ifd, ngx_fd_t fd, uint32_t mask)
{
    u_char  name[64];

    ngx_sprintf(name, "/proc/self/fd/%d%Z", fd);

    return inotify_add_watch(ifd, (char *) name, mask);
}


/*
 * The kernel's rpc/, for a cell with tools: opened and watched (a request's
 * rename or close) the first time, checked each time after (still the
 * one we hold, owner-only).  -> its fd and *wd, NGX_INVALID_FILE if not.
 */

ngx_fd_t
ngx_http_hermes_local_handle_rpc(ngx_http_hermes_local_handle_t *handle,
    ngx_http_hermes_kernel_ref_t *ref, int ifd, int *wd, ngx_log_t *log)
{
    int                             wd_now;
    ngx_file_info_t                 fi;
    ngx_http_hermes_local_entry_t  *e;

    e = (ngx_http_hermes_local_entry_t *) handle;

    if (e->rpc_fd != NGX_INVALID_FILE && e->rpc_wd != -1) {
        if (fstatat(handle->dir_fd, "rpc", &fi, AT_SYMLINK_NOFOLLOW) == -1
            || (uint64_t) fi.st_ino != e->rpc_ino
            || ngx_http_hermes_local_private_dir(&fi, ref->uid) != NGX_OK)
        {
            goto bad;
        }

        if (e->rpc_quiet) {
            wd_now = ngx_http_hermes_local_handle_mask(e->ifd, e->rpc_fd,
                                             NGX_HTTP_HERMES_LOCAL_RPC_WATCH);
            if (wd_now != e->rpc_wd) {
                ngx_log_error(NGX_LOG_ERR, log, ngx_errno,
                              "hermes: inotify_add_watch(\"%s/rpc\") failed",
                              ref->dir);
                return NGX_INVALID_FILE;
            }

            ngx_http_hermes_local_handles_rpc_loud(e->rpc_wd);
        }

        *wd = e->rpc_wd;
        return e->rpc_fd;
    }

    if (e->rpc_fd == NGX_INVALID_FILE) {
        e->rpc_fd = openat(handle->dir_fd, "rpc",
                           O_RDONLY|O_DIRECTORY|O_NOFOLLOW|O_NONBLOCK
                           |O_CLOEXEC);

        if (e->rpc_fd == NGX_INVALID_FILE
            || ngx_fd_info(e->rpc_fd, &fi) == NGX_FILE_ERROR
            || ngx_http_hermes_local_private_dir(&fi, ref->uid) != NGX_OK)
        {
            goto bad;
        }

        e->rpc_ino = fi.st_ino;
    }

    e->rpc_wd = ngx_http_hermes_local_handle_mask(ifd, e->rpc_fd,
                                              NGX_HTTP_HERMES_LOCAL_RPC_WATCH);
    if (e->rpc_wd == -1) {
        ngx_log_error(NGX_LOG_ERR, log, ngx_errno,
                      "hermes: inotify_add_watch(\"%s/rpc\") failed",
                      ref->dir);
        return NGX_INVALID_FILE;
    }

    /* the same watch as another handle's of the kernel: its mask is ours */

    ngx_http_hermes_local_handles_rpc_loud(e->rpc_wd);

    e->ifd = ifd;
    *wd = e->rpc_wd;

    return e->rpc_fd;

bad:

    ngx_log_error(NGX_LOG_WARN, log, ngx_errno,
                  "hermes: \"%s/rpc\" is not an owner-only directory",
                  ref->dir);

    /* a new rpc/ is not ours to watch: the next cell opens it afresh */

    ngx_http_hermes_local_handle_drop(e);

    return NGX_INVALID_FILE;
}


/*
 * The kernel removed a watch (IN_IGNORED: its directory is gone): the
 * handles on it are let go.
 */

void
ngx_http_hermes_local_handles_ignored(int wd)
{
    ngx_queue_t                    *q, *next;
    ngx_http_hermes_local_entry_t  *e;

    for (q = ngx_queue_head(&ngx_http_hermes_local_handles);
         q != ngx_queue_sentinel(&ngx_http_hermes_local_handles);
         q = next)
    {
        next = ngx_queue_next(q);
        e = ngx_queue_data(q, ngx_http_hermes_local_entry_t, queue);

        if (e->wd != wd && e->rpc_wd != wd) {
            continue;
        }

        if (e->wd == wd) {
            e->wd = -1;

        } else {
            e->rpc_wd = -1;
        }

        ngx_http_hermes_local_handle_drop(e);
    }
}


/* the pidfd first: then the start time says whose it is */

static ngx_int_t
ngx_http_hermes_local_handle_open(ngx_http_hermes_local_entry_t *e,
    ngx_http_hermes_kernel_ref_t *ref, ngx_log_t *log)
{
    uint64_t          start;
    struct pollfd     pfd;
    ngx_file_info_t   fi;

    e->handle.pidfd = syscall(SYS_pidfd_open, ref->pid, 0);

    if (e->handle.pidfd == NGX_INVALID_FILE) {
        if (ngx_errno == ESRCH) {
            return NGX_DECLINED;
        }

        ngx_log_error(NGX_LOG_ERR, log, ngx_errno,
                      "hermes: pidfd_open(%P) failed", ref->pid);
        return NGX_ERROR;
    }

    if (ngx_http_hermes_local_proc_start(ref->pid, &start) != NGX_OK
        || start != ref->start)
    {
        ngx_log_error(NGX_LOG_WARN, log, 0,
                      "hermes: pid %P is no longer kernel %*s",
                      ref->pid, (size_t) NGX_HTTP_HERMES_ID_LEN,
                      ref->kernel_id);
        return NGX_DECLINED;
    }

    pfd.fd = e->handle.pidfd;
    pfd.events = POLLIN;
    pfd.revents = 0;

    if (poll(&pfd, 1, 0) != 0) {
        /* it has exited, and is not reaped yet */
        return NGX_DECLINED;
    }

    e->handle.dir_fd = open((char *) ref->dir,
                            O_RDONLY|O_DIRECTORY|O_NOFOLLOW|O_NONBLOCK
                            |O_CLOEXEC);

    if (e->handle.dir_fd == NGX_INVALID_FILE) {
        ngx_log_error(NGX_LOG_WARN, log, ngx_errno,
                      "hermes: kernel %*s: open(\"%s\") failed",
                      (size_t) NGX_HTTP_HERMES_ID_LEN, ref->kernel_id,
                      ref->dir);
        return NGX_DECLINED;
    }

    if (ngx_fd_info(e->handle.dir_fd, &fi) == NGX_FILE_ERROR
        || (uint64_t) fi.st_ino != ref->ino
        || ngx_http_hermes_local_private_dir(&fi, ref->uid) != NGX_OK)
    {
        ngx_log_error(NGX_LOG_WARN, log, 0,
                      "hermes: \"%s\" is not the directory kernel %*s was "
                      "started in, or not owner-only any more",
                      ref->dir, (size_t) NGX_HTTP_HERMES_ID_LEN,
                      ref->kernel_id);
        return NGX_DECLINED;
    }

    e->handle.cells_fd = openat(e->handle.dir_fd, "cells",
                                O_RDONLY|O_DIRECTORY|O_NOFOLLOW|O_NONBLOCK
                                |O_CLOEXEC);

    if (e->handle.cells_fd == NGX_INVALID_FILE
        || ngx_fd_info(e->handle.cells_fd, &fi) == NGX_FILE_ERROR
        || ngx_http_hermes_local_private_dir(&fi, ref->uid) != NGX_OK)
    {
        ngx_log_error(NGX_LOG_WARN, log, 0,
                      "hermes: \"%s/cells\" is not an owner-only directory",
                      ref->dir);
        return NGX_DECLINED;
    }

    e->cells_ino = fi.st_ino;

    /*
     * The wake FIFO, kept open for the kernel's cells: opening it each
     * cell was two system calls, and a FIFO or file a cell puts at its
     * name later gets none of them.  The runner holds it open (ENXIO:
     * no runner does).
     */

    e->handle.wake_fd = openat(e->handle.dir_fd, "wake",
                               O_WRONLY|O_NONBLOCK|O_NOFOLLOW|O_CLOEXEC);

    if (e->handle.wake_fd == NGX_INVALID_FILE
        || ngx_fd_info(e->handle.wake_fd, &fi) == NGX_FILE_ERROR
        || !S_ISFIFO(fi.st_mode) || fi.st_uid != ref->uid)
    {
        ngx_log_error(NGX_LOG_WARN, log, ngx_errno,
                      "hermes: \"%s/wake\" is not the kernel's FIFO",
                      ref->dir);
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/*
 * A kept handle, before each cell: the process alive, the dir still at
 * its path, it and cells/ owner-only, cells/ the one we hold.
 * NGX_DECLINED: not so.
 */

static ngx_int_t
ngx_http_hermes_local_handle_check(ngx_http_hermes_local_entry_t *e,
    ngx_http_hermes_kernel_ref_t *ref)
{
    struct pollfd    pfd;
    ngx_file_info_t  fi;

    pfd.fd = e->handle.pidfd;
    pfd.events = POLLIN;
    pfd.revents = 0;

    if (poll(&pfd, 1, 0) != 0) {
        return NGX_DECLINED;
    }

    /* the path still names the dir held: the registry means it by path */

    if (ngx_link_info(ref->dir, &fi) == NGX_FILE_ERROR
        || (uint64_t) fi.st_ino != e->ino
        || ngx_http_hermes_local_private_dir(&fi, ref->uid) != NGX_OK
        || fstatat(e->handle.dir_fd, "cells", &fi, AT_SYMLINK_NOFOLLOW) == -1
        || (uint64_t) fi.st_ino != e->cells_ino
        || ngx_http_hermes_local_private_dir(&fi, ref->uid) != NGX_OK)
    {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/* a directory of uid's, owner-only (0700); NGX_DECLINED: it is not */

static ngx_int_t
ngx_http_hermes_local_private_dir(ngx_file_info_t *fi, uint32_t uid)
{
    if (!ngx_is_dir(fi) || fi->st_uid != uid
        || (fi->st_mode & 07777) != 0700)
    {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/* the handles of kernels that exited, not in use: one poll for all */

static void
ngx_http_hermes_local_handles_reap(void)
{
    ngx_uint_t                      i, n;
    ngx_queue_t                    *q, *next;
    struct pollfd                   pfd[NGX_HTTP_HERMES_LOCAL_HANDLES];
    ngx_http_hermes_local_entry_t  *e;

    n = 0;

    for (q = ngx_queue_head(&ngx_http_hermes_local_handles);
         q != ngx_queue_sentinel(&ngx_http_hermes_local_handles)
         && n < NGX_HTTP_HERMES_LOCAL_HANDLES;
         q = ngx_queue_next(q))
    {
        e = ngx_queue_data(q, ngx_http_hermes_local_entry_t, queue);
        pfd[n].fd = e->handle.pidfd;
        pfd[n].events = POLLIN;
        pfd[n].revents = 0;
        n++;
    }

    if (n == 0 || poll(pfd, n, 0) <= 0) {
        return;
    }

    i = 0;

    for (q = ngx_queue_head(&ngx_http_hermes_local_handles);
         q != ngx_queue_sentinel(&ngx_http_hermes_local_handles) && i < n;
         q = next, i++)
    {
        next = ngx_queue_next(q);
        e = ngx_queue_data(q, ngx_http_hermes_local_entry_t, queue);

        if (pfd[i].revents && e->cached && e->users == 0) {
            ngx_http_hermes_local_handle_free(e);
        }
    }
}


static void
ngx_http_hermes_local_handle_free(ngx_http_hermes_local_entry_t *e)
{
    int                             wd;
    ngx_uint_t                      i;
    ngx_queue_t                    *q;
    ngx_http_hermes_local_entry_t  *o;

    if (e->cached) {
        ngx_http_hermes_local_handles_n--;
    }

    if (e->queue.next) {
        ngx_queue_remove(&e->queue);
    }

    /* a watch stays while another handle has it */

    for (i = 0; i < 2; i++) {
        wd = i ? e->rpc_wd : e->wd;

        if (wd == -1) {
            continue;
        }

        for (q = ngx_queue_head(&ngx_http_hermes_local_handles);
             q != ngx_queue_sentinel(&ngx_http_hermes_local_handles);
             q = ngx_queue_next(q))
        {
            o = ngx_queue_data(q, ngx_http_hermes_local_entry_t, queue);

            if (o->wd == wd || o->rpc_wd == wd) {
                break;
            }
        }

        if (q == ngx_queue_sentinel(&ngx_http_hermes_local_handles)) {
            (void) inotify_rm_watch(e->ifd, wd);
        }
    }

    if (e->rpc_fd != NGX_INVALID_FILE) {
        close(e->rpc_fd);
    }

    if (e->handle.cells_fd != NGX_INVALID_FILE) {
        close(e->handle.cells_fd);
    }

    if (e->handle.dir_fd != NGX_INVALID_FILE) {
        close(e->handle.dir_fd);
    }

    if (e->exit_c) {
        ngx_close_connection(e->exit_c);     /* the pidfd */

    } else if (e->handle.pidfd != NGX_INVALID_FILE) {
        close(e->handle.pidfd);
    }

    if (e->handle.wake_fd != NGX_INVALID_FILE) {
        close(e->handle.wake_fd);
    }

    ngx_free(e);
}
