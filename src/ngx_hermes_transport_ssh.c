
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: a cell's stream on a kernel of an ssh host.  The carrier
 * (ngx_hermes_backend_ssh.c: the host's link to its kernel-host agent)
 * ships the cell and writes what the agent sends into a socketpair read
 * here: "\x1f\n" when the cell is shipped,
 * cell_out's event lines, then "\x1e" and the result (or the host side's
 * own word on a cell it could not ship or follow).  The head and the tail
 * of the event lines are kept as they go by, for a cell whose kernel is
 * lost: the files are on the other host.
 *
 * A cell that may call tools has a second socketpair: the carrier writes
 * each RPC_REQ frame's payload the agent sends into it, answers go back
 * the same way to become RPC_ANSWER frames; both as records, a u32 BE
 * length and the payload.  The requests are checked here
 * (ngx_hermes_rpc.c), never trusted to the host.
 */


#include "ngx_hermes.h"
#include "ngx_hermes_ssh.h"


#define NGX_HTTP_HERMES_RELAY_CHUNK    (128 * 1024)

/* an answer's bytes in one RPC_ANSWER frame: well under a frame's 1 MiB */
#define NGX_HTTP_HERMES_RPC_CHUNK      (512 * 1024)


typedef struct {
    ngx_http_hermes_stream_t       *st;
    ngx_connection_t               *relay;      /* the carrier's output */
    ngx_buf_t                      *rbuf;
    size_t                          out_sent;

    /* the head and the tail of the event lines, for a lost result */
    u_char                         *keep;
    size_t                          keep_head;
    size_t                          keep_tail;
    size_t                          keep_total;

    /* tool calls: requests in, answers out */
    ngx_connection_t               *rpc;
    ngx_buf_t                      *rpc_in;
    u_char                         *rpc_out;
    size_t                          rpc_out_pos;
    size_t                          rpc_out_len;
    size_t                          rpc_out_size;

    size_t                          scanned;    /* rbuf looked at, from pos */

    unsigned                        res_ready:1;
    unsigned                        paused:1;   /* the client is slow */
    unsigned                        rpc_early:1; /* before "shipped" */
} ngx_http_hermes_ssh_stream_t;


static ngx_int_t ngx_http_hermes_ssh_stream_run(ngx_http_hermes_stream_t *st);
static void ngx_http_hermes_ssh_stream_resume(ngx_http_hermes_stream_t *st);
static ngx_int_t ngx_http_hermes_ssh_stream_interrupt(
    ngx_http_hermes_stream_t *st);
static void ngx_http_hermes_ssh_stream_salvage(ngx_http_hermes_stream_t *st,
    ngx_http_hermes_windows_t *w);
static void ngx_http_hermes_ssh_stream_close(ngx_http_hermes_stream_t *st);
static void ngx_http_hermes_ssh_stream_relay_handler(ngx_event_t *ev);
static void ngx_http_hermes_ssh_stream_relay_end(
    ngx_http_hermes_ssh_stream_t *ss);
static ngx_int_t ngx_http_hermes_ssh_stream_forward(
    ngx_http_hermes_ssh_stream_t *ss, u_char *p, size_t n);
static void ngx_http_hermes_ssh_stream_keep(ngx_http_hermes_ssh_stream_t *ss,
    u_char *p, size_t n);
static ngx_connection_t *ngx_http_hermes_ssh_stream_pair(
    ngx_http_hermes_ssh_stream_t *ss, ngx_socket_t *fd);
static ngx_int_t ngx_http_hermes_ssh_stream_rpc_open(
    ngx_http_hermes_ssh_stream_t *ss, ngx_socket_t *fd);
static void ngx_http_hermes_ssh_stream_rpc_read(ngx_event_t *ev);
static void ngx_http_hermes_ssh_stream_rpc_write(ngx_event_t *ev);
static ngx_int_t ngx_http_hermes_ssh_stream_answer(void *data, u_char *name,
    size_t len, u_char *buf, size_t n);
static void ngx_http_hermes_ssh_stream_rpc_close(
    ngx_http_hermes_ssh_stream_t *ss);


ngx_http_hermes_transport_t  ngx_http_hermes_transport_ssh = {
    ngx_http_hermes_ssh_stream_run,
    ngx_http_hermes_ssh_stream_resume,
    ngx_http_hermes_ssh_stream_interrupt,
    ngx_http_hermes_ssh_stream_salvage,
    ngx_http_hermes_ssh_stream_close,
    1                                       /* tools */
};


static ngx_int_t
ngx_http_hermes_ssh_stream_run(ngx_http_hermes_stream_t *st)
{
    ngx_int_t                      rc;
    ngx_socket_t                   fd, rfd;
    ngx_connection_t              *c;
    ngx_http_hermes_conn_t         conn;
    ngx_http_hermes_ssh_stream_t  *ss;

    ss = ngx_pcalloc(st->pool, sizeof(ngx_http_hermes_ssh_stream_t));
    if (ss == NULL) {
        return NGX_ERROR;
    }

    ss->st = st;
    ss->out_sent = st->request ? 0 : (size_t) st->offset;
    st->ctx = ss;

    ss->rbuf = ngx_create_temp_buf(st->pool, NGX_HTTP_HERMES_RELAY_CHUNK);
    if (ss->rbuf == NULL) {
        goto failed;
    }

    c = ngx_http_hermes_ssh_stream_pair(ss, &fd);
    if (c == NULL) {
        goto failed;
    }

    c->read->handler = ngx_http_hermes_ssh_stream_relay_handler;
    ss->relay = c;

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        close(fd);
        goto failed;
    }

    rfd = (ngx_socket_t) -1;

    if (st->rpc && ngx_http_hermes_ssh_stream_rpc_open(ss, &rfd) != NGX_OK) {
        close(fd);
        goto failed;
    }

    ngx_http_hermes_backend_take(&conn, st->hlcf->backend, st->ref->host);

    rc = ngx_http_hermes_ssh_relay(&conn, st->ref,
                                   st->out_limit, (off_t) st->res_limit,
                                   st->timeout,
                                   st->request ? st->request->pos : NULL,
                                   st->request ? (size_t) (st->request->last
                                                 - st->request->pos) : 0,
                                   st->request ? -1 : st->offset,
                                   fd, rfd, st->log);
    if (rc != NGX_OK) {
        ngx_http_hermes_backend_give(&conn);
        close(fd);

        if (rfd != (ngx_socket_t) -1) {
            close(rfd);
        }

        if (rc == NGX_BUSY) {
            /* nothing was shipped: the kernel is fine, as it was */
            st->failed(st, NGX_HTTP_HERMES_STREAM_BUSY, NULL);
            return NGX_OK;
        }

        goto failed;
    }

    return NGX_OK;

failed:

    st->failed(st, NGX_HTTP_HERMES_STREAM_SHIP_FAILED, NULL);

    return NGX_OK;
}


static void
ngx_http_hermes_ssh_stream_relay_handler(ngx_event_t *ev)
{
    ngx_connection_t              *rc = ev->data;
    ngx_http_hermes_ssh_stream_t  *ss = rc->data;

    u_char                    *p, *nl, *m;
    size_t                     size, limit;
    ssize_t                    n;
    ngx_buf_t                 *b, *nb;
    ngx_connection_t          *c;
    ngx_http_hermes_stream_t  *st;

    st = ss->st;
    b = ss->rbuf;
    c = st->client;

    /* a line of cell_out (the relay bounds it by out_limit), or a result */
    limit = ngx_max(st->res_limit, (size_t) st->out_limit)
            + 2 * NGX_HTTP_HERMES_RELAY_CHUNK;

    for ( ;; ) {

        if (ss->paused) {
            /* the client is slow: the relay waits, resume reads on */
            st->waits_client = 1;
            goto done;
        }

        if (b->last == b->end) {
            /* a result or a line bigger than the buffer: grow it */

            size = 2 * (b->end - b->start);

            if (size > limit) {
                st->failed(st, NGX_HTTP_HERMES_STREAM_LOST,
                           "the kernel wrote an unreadable result");
                goto done;
            }

            nb = ngx_create_temp_buf(st->pool, size);
            if (nb == NULL) {
                st->failed(st, NGX_HTTP_HERMES_STREAM_LOST, "out of memory");
                goto done;
            }

            nb->last = ngx_cpymem(nb->pos, b->pos, b->last - b->pos);
            ss->rbuf = nb;
            b = nb;
        }

        n = recv(rc->fd, b->last, b->end - b->last, 0);

        if (n == -1) {
            if (ngx_socket_errno == NGX_EAGAIN) {
                break;
            }

            if (ngx_socket_errno == NGX_EINTR) {
                continue;
            }

            n = 0;
        }

        if (n == 0) {
            ngx_http_hermes_ssh_stream_relay_end(ss);
            goto done;
        }

        b->last += n;

        /* "\x1f\n": shipped, the stream starts */

        if (!st->is_shipped && b->last - b->pos >= 2 && b->pos[0] == '\x1f') {
            b->pos += 2;
            st->is_shipped = 1;

            if (st->shipped(st) != NGX_OK) {
                goto done;
            }

            /* tool calls that came first: the stream has begun now */

            if (ss->rpc_early && ss->rpc) {
                ss->rpc_early = 0;
                ngx_http_hermes_ssh_stream_rpc_read(ss->rpc->read);
            }
        }

        if (!st->is_shipped || ss->res_ready) {
            continue;
        }

        /*
         * forward whole event lines, up to the result's marker; what was
         * looked at already is not again (a 1 MB line comes in many reads)
         */

        m = ngx_strlchr(b->pos + ss->scanned, b->last, '\x1e');

        if (m) {
            nl = m;
            ss->res_ready = 1;

        } else {
            for (nl = b->last; nl > b->pos + ss->scanned && nl[-1] != '\n';
                 nl--)
            {
                /* void */
            }

            if (nl == b->pos + ss->scanned) {
                /* no newline in what came since (nor before: all sent) */
                nl = b->pos;
            }
        }

        ss->scanned = b->last - nl;

        if (nl > b->pos) {
            ngx_http_hermes_ssh_stream_keep(ss, b->pos, nl - b->pos);

            if (ngx_http_hermes_ssh_stream_forward(ss, b->pos, nl - b->pos)
                == NGX_ERROR)
            {
                st->failed(st, NGX_HTTP_HERMES_STREAM_LOST, "out of memory");
                goto done;
            }

            b->pos = nl;
        }

        /* keep the buffer's head free for what follows, the result too */

        if (b->pos > b->start) {
            p = b->pos;
            b->pos = b->start;
            b->last = ngx_movemem(b->start, p, b->last - p);
        }
    }

    st->waits_client = 0;

    if (ngx_handle_read_event(ev, 0) != NGX_OK) {
        st->failed(st, NGX_HTTP_HERMES_STREAM_LOST, "the relay failed");
    }

done:

    if (c) {
        ngx_http_run_posted_requests(c);
    }
}


/*
 * The relay closed: a result, its word on a cell it did not ship (a dead
 * kernel, a full disk, another failure), or a broken connection.
 */

static void
ngx_http_hermes_ssh_stream_relay_end(ngx_http_hermes_ssh_stream_t *ss)
{
    u_char                    *p;
    size_t                     n;
    ngx_buf_t                 *b;
    ngx_http_hermes_stream_t  *st;
    ngx_http_hermes_result_t   word;

    static u_char  dead[] = "\x1e{\"relay\":\"dead\"}";
    static u_char  full[] = "\x1e{\"relay\":\"full\"}";

    st = ss->st;
    b = ss->rbuf;
    n = b->last - b->pos;

    if (!ss->res_ready) {
        if (!st->is_shipped) {
            if (n == sizeof(dead) - 1
                && ngx_strncmp(b->pos, dead, n) == 0
                && !st->ref->spawn)
            {
                st->failed(st, NGX_HTTP_HERMES_STREAM_DEAD, NULL);
                return;
            }

            if (n == sizeof(full) - 1 && ngx_strncmp(b->pos, full, n) == 0) {
                st->failed(st, NGX_HTTP_HERMES_STREAM_FULL, NULL);
                return;
            }

            if (n) {
                ngx_log_error(NGX_LOG_ERR, st->log, 0,
                              "hermes: the relay of cell %uD said: \"%*s\"",
                              st->ref->cell_id, ngx_min(n - 1, 256),
                              b->pos + 1);
            }

            st->failed(st, NGX_HTTP_HERMES_STREAM_SHIP_FAILED, NULL);
            return;
        }

        st->failed(st, NGX_HTTP_HERMES_STREAM_LOST,
                   "the connection to the kernel host broke during the cell");
        return;
    }

    /* b->pos is at the marker */

    p = b->pos + 1;
    n = b->last - p;

    if (ngx_strlcasestrn(p, p + ngx_min(n, 20), (u_char *) "\"relay\"", 6)) {

        /* the relay's own word: the host stayed unreachable */

        ngx_memzero(&word, sizeof(ngx_http_hermes_result_t));

        if (ngx_http_hermes_json_parse_result(st->pool, p, n, &word) == NGX_OK
            && word.error.len)
        {
            st->failed(st, NGX_HTTP_HERMES_STREAM_LOST,
                       (char *) word.error.data);
            return;
        }

        ngx_log_error(NGX_LOG_WARN, st->log, 0,
                      "hermes: kernel %*s died during cell %uD",
                      (size_t) NGX_HTTP_HERMES_ID_LEN, st->ref->kernel_id,
                      st->ref->cell_id);

        st->failed(st, NGX_HTTP_HERMES_STREAM_LOST,
                   "the kernel died while running the cell; its state is lost");
        return;
    }

    /* every event line came before the result */

    if (st->result(st, p, n) == NGX_OK) {
        st->done(st);
    }
}


/* event lines to the cell, within the module's own bound on its stream */

static ngx_int_t
ngx_http_hermes_ssh_stream_forward(ngx_http_hermes_ssh_stream_t *ss, u_char *p,
    size_t n)
{
    ngx_int_t                  rc;
    ngx_http_hermes_stream_t  *st;

    st = ss->st;

    if (st->quiet) {
        return NGX_OK;
    }

    if (ss->out_sent + n > (size_t) st->out_limit) {
        st->truncated = 1;
        return NGX_OK;
    }

    ss->out_sent += n;

    rc = st->output(st, p, n);

    if (rc == NGX_AGAIN && !ss->res_ready) {
        ss->paused = 1;
        return NGX_OK;
    }

    return rc == NGX_ERROR ? NGX_ERROR : NGX_OK;
}


/* the client took what was sent, or left: read the relay on */

static void
ngx_http_hermes_ssh_stream_resume(ngx_http_hermes_stream_t *st)
{
    ngx_http_hermes_ssh_stream_t *ss = st->ctx;

    if (ss == NULL || !ss->paused) {
        return;
    }

    ss->paused = 0;
    ngx_http_hermes_ssh_stream_relay_handler(ss->relay->read);
}


/*
 * An INTERRUPT frame to the agent of the kernel's host (the backend's).
 * NGX_DECLINED: not told: the cell is not shipped, or the kernel is not
 * there (any more).
 */

static ngx_int_t
ngx_http_hermes_ssh_stream_interrupt(ngx_http_hermes_stream_t *st)
{
    ngx_http_hermes_victim_t  v;

    if (!st->is_shipped) {
        return NGX_DECLINED;
    }

    ngx_http_hermes_kernel_victim(&v, st->ref, st->hlcf->backend);

    return (ngx_http_hermes_kernel_interrupt(&v, st->ref->cell_id, st->log)
            == NGX_OK) ? NGX_OK : NGX_DECLINED;
}


/* keep the head and the tail of the event lines the relay brings */

static void
ngx_http_hermes_ssh_stream_keep(ngx_http_hermes_ssh_stream_t *ss, u_char *p,
    size_t n)
{
    size_t   hsize, tsize, k, drop;
    u_char  *tail;

    hsize = NGX_HTTP_HERMES_KEEP_HEAD(ss->st->hlcf->max_output);
    tsize = NGX_HTTP_HERMES_KEEP_TAIL(ss->st->hlcf->max_output);

    if (ss->keep == NULL) {
        ss->keep = ngx_pnalloc(ss->st->pool, hsize + tsize);
        if (ss->keep == NULL) {
            return;
        }
    }

    ss->keep_total += n;

    if (ss->keep_head < hsize) {
        k = ngx_min(n, hsize - ss->keep_head);
        ngx_memcpy(ss->keep + ss->keep_head, p, k);
        ss->keep_head += k;
        p += k;
        n -= k;
    }

    if (n == 0) {
        return;
    }

    tail = ss->keep + hsize;

    if (n >= tsize) {
        ngx_memcpy(tail, p + n - tsize, tsize);
        ss->keep_tail = tsize;
        return;
    }

    if (ss->keep_tail + n > tsize) {
        drop = ss->keep_tail + n - tsize;
        ngx_memmove(tail, tail + drop, ss->keep_tail - drop);
        ss->keep_tail -= drop;
    }

    ngx_memcpy(tail + ss->keep_tail, p, n);
    ss->keep_tail += n;
}


/* what the relay brought, kept as it went by */

static void
ngx_http_hermes_ssh_stream_salvage(ngx_http_hermes_stream_t *st,
    ngx_http_hermes_windows_t *w)
{
    ngx_http_hermes_ssh_stream_t *ss = st->ctx;

    if (ss == NULL || !st->is_shipped || ss->keep == NULL) {
        return;
    }

    w->data = ngx_pnalloc(st->pool, ss->keep_head + ss->keep_tail);
    if (w->data == NULL) {
        return;
    }

    ngx_memcpy(w->data, ss->keep, ss->keep_head);
    ngx_memcpy(w->data + ss->keep_head,
               ss->keep + NGX_HTTP_HERMES_KEEP_HEAD(st->hlcf->max_output),
               ss->keep_tail);

    w->head = ss->keep_head;
    w->tail = ss->keep_tail;
    w->gap = (ss->keep_total > ss->keep_head + ss->keep_tail);
}


static void
ngx_http_hermes_ssh_stream_close(ngx_http_hermes_stream_t *st)
{
    ngx_http_hermes_ssh_stream_t *ss = st->ctx;

    if (ss == NULL) {
        return;
    }

    if (ss->relay) {
        /* the carrier sees the socket closed and stops */
        ngx_close_connection(ss->relay);
        ss->relay = NULL;
    }

    ngx_http_hermes_ssh_stream_rpc_close(ss);

    st->ctx = NULL;
}


/* the cell's tool calls: a socketpair to the carrier, the far end its */

static ngx_int_t
ngx_http_hermes_ssh_stream_rpc_open(ngx_http_hermes_ssh_stream_t *ss,
    ngx_socket_t *fd)
{
    ngx_socket_t               far;
    ngx_connection_t          *c;
    ngx_http_hermes_stream_t  *st;

    st = ss->st;

    ss->rpc_in = ngx_create_temp_buf(st->pool, 4096);
    if (ss->rpc_in == NULL) {
        return NGX_ERROR;
    }

    c = ngx_http_hermes_ssh_stream_pair(ss, &far);
    if (c == NULL) {
        return NGX_ERROR;
    }

    c->read->handler = ngx_http_hermes_ssh_stream_rpc_read;
    c->write->handler = ngx_http_hermes_ssh_stream_rpc_write;
    ss->rpc = c;

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        close(far);
        ngx_http_hermes_ssh_stream_rpc_close(ss);
        return NGX_ERROR;
    }

    ngx_http_hermes_rpc_carry(st->rpc, ngx_http_hermes_ssh_stream_answer, ss);

    *fd = far;

    return NGX_OK;
}


/*
 * A socketpair to the carrier's I/O thread: our end nonblocking, an event
 * loop connection whose data is "ss"; the thread's end in "fd".
 */

static ngx_connection_t *
ngx_http_hermes_ssh_stream_pair(ngx_http_hermes_ssh_stream_t *ss,
    ngx_socket_t *fd)
{
    int                sv[2];
    ngx_log_t         *log;
    ngx_connection_t  *c;

    log = ss->st->log;

    if (socketpair(AF_UNIX, SOCK_STREAM|SOCK_CLOEXEC, 0, sv) == -1) {
        ngx_log_error(NGX_LOG_ERR, log, ngx_errno,
                      "hermes: socketpair() failed");
        return NULL;
    }

    if (ngx_nonblocking(sv[0]) == -1) {
        close(sv[0]);
        close(sv[1]);
        return NULL;
    }

    c = ngx_get_connection(sv[0], log);
    if (c == NULL) {
        close(sv[0]);
        close(sv[1]);
        return NULL;
    }

    c->data = ss;
    c->read->log = log;
    c->write->log = log;

    *fd = sv[1];

    return c;
}


/* RPC_REQ payloads from the carrier: {"name":"req_N"} and the request */

static void
ngx_http_hermes_ssh_stream_rpc_read(ngx_event_t *ev)
{
    ngx_connection_t              *c = ev->data;
    ngx_http_hermes_ssh_stream_t  *ss = c->data;

    u_char                    *p;
    size_t                     len, size;
    ssize_t                    n;
    ngx_buf_t                 *b, *nb;
    int64_t                    flag;
    ngx_str_t                  json, data, name;
    ngx_http_hermes_stream_t  *st;

    st = ss->st;

    if (!st->is_shipped) {
        /*
         * the agent's RPC_REQ may overtake its SHIPPED here (two
         * sockets): a call's events wait for the stream's first line
         */
        ss->rpc_early = 1;
        return;
    }

    for ( ;; ) {
        b = ss->rpc_in;

        n = recv(c->fd, b->last, b->end - b->last, 0);

        if (n == -1) {
            if (ngx_socket_errno == NGX_EAGAIN) {
                break;
            }

            if (ngx_socket_errno == NGX_EINTR) {
                continue;
            }

            n = 0;
        }

        if (n == 0) {
            /* the carrier ended the stream: the relay says how */
            ngx_http_hermes_ssh_stream_rpc_close(ss);
            return;
        }

        b->last += n;

        /* every whole record */

        for ( ;; ) {
            if (b->last - b->pos < 4) {
                break;
            }

            len = ngx_http_hermes_frames_u32(b->pos);

            if (len > NGX_HTTP_HERMES_FRAME_MAX) {
                ngx_log_error(NGX_LOG_ERR, st->log, 0,
                              "hermes: a tool call record of %uz bytes "
                              "from the carrier", len);
                ngx_http_hermes_ssh_stream_rpc_close(ss);
                return;
            }

            if ((size_t) (b->last - b->pos) < 4 + len) {
                break;
            }

            p = b->pos + 4;
            b->pos += 4 + len;

            name.len = 0;

            if (ngx_http_hermes_frames_split(p, len, &json, &data) != NGX_OK
                || ngx_http_hermes_frames_json_str(&json, "name", &name)
                   != NGX_OK)
            {
                ngx_log_error(NGX_LOG_ERR, st->log, 0,
                              "hermes: a bad RPC_REQ frame from the agent");
                continue;
            }

            /* one the agent could not read (a FIFO, a link): counted */

            if (ngx_http_hermes_frames_json_int(&json, "unreadable", &flag)
                == NGX_OK && flag)
            {
                data.data = NULL;
                data.len = 0;
            }

            if (ngx_http_hermes_rpc_request(st->rpc, name.data, name.len,
                                            data.data, data.len)
                == NGX_DONE)
            {
                ngx_http_hermes_ssh_stream_rpc_close(ss);
                return;
            }

            if (ss->rpc == NULL) {
                return;         /* an answer could not be passed on */
            }
        }

        /* room for the rest: a record may be up to a frame */

        if (b->pos == b->last) {
            b->pos = b->start;
            b->last = b->start;

        } else if (b->pos > b->start) {
            p = b->pos;
            b->pos = b->start;
            b->last = ngx_movemem(b->start, p, b->last - p);
        }

        if (b->last == b->end) {
            size = ngx_min(2 * (size_t) (b->end - b->start),
                           4 + NGX_HTTP_HERMES_FRAME_MAX);

            nb = ngx_create_temp_buf(st->pool, size);
            if (nb == NULL) {
                ngx_http_hermes_ssh_stream_rpc_close(ss);
                return;
            }

            nb->last = ngx_cpymem(nb->pos, b->pos, b->last - b->pos);
            ss->rpc_in = nb;
        }
    }

    if (ngx_handle_read_event(ev, 0) != NGX_OK) {
        ngx_http_hermes_ssh_stream_rpc_close(ss);
    }
}


/*
 * An answer for the agent to write as NAME in the kernel dir (res_N in
 * rpc/, or tool_results/...): records of at most a chunk each, the file
 * written whole and renamed once "more" is false.
 */

static ngx_int_t
ngx_http_hermes_ssh_stream_answer(void *data, u_char *name, size_t len,
    u_char *buf, size_t n)
{
    ngx_http_hermes_ssh_stream_t *ss = data;

    u_char  *p, *b;
    size_t   off, k, size, need;
    u_char   json[128];

    if (ss->rpc == NULL || len > 64) {
        return NGX_ERROR;
    }

    off = 0;

    do {
        k = ngx_min(n - off, NGX_HTTP_HERMES_RPC_CHUNK);

        p = ngx_sprintf(json, "{\"name\":\"%*s\",\"offset\":%uz,"
                        "\"more\":%s}", len, name, off,
                        off + k < n ? "true" : "false");

        need = 4 + 4 + (p - json) + k;

        if (ss->rpc_out_size - ss->rpc_out_len < need) {
            size = ngx_max(2 * ss->rpc_out_size,
                           ss->rpc_out_len - ss->rpc_out_pos + need);

            b = ngx_alloc(size, ss->st->log);
            if (b == NULL) {
                return NGX_ERROR;
            }

            if (ss->rpc_out) {
                ngx_memcpy(b, ss->rpc_out + ss->rpc_out_pos,
                           ss->rpc_out_len - ss->rpc_out_pos);
                ngx_free(ss->rpc_out);
            }

            ss->rpc_out = b;
            ss->rpc_out_size = size;
            ss->rpc_out_len -= ss->rpc_out_pos;
            ss->rpc_out_pos = 0;
        }

        b = ss->rpc_out + ss->rpc_out_len;
        b = ngx_http_hermes_frames_put_u32(b, (uint32_t) (need - 4));
        b = ngx_http_hermes_frames_put_u32(b, (uint32_t) (p - json));
        b = ngx_cpymem(b, json, p - json);
        b = ngx_cpymem(b, buf + off, k);
        ss->rpc_out_len = b - ss->rpc_out;

        off += k;

    } while (off < n);

    ngx_http_hermes_ssh_stream_rpc_write(ss->rpc->write);

    return NGX_OK;
}


static void
ngx_http_hermes_ssh_stream_rpc_write(ngx_event_t *ev)
{
    ngx_connection_t              *c = ev->data;
    ngx_http_hermes_ssh_stream_t  *ss = c->data;

    ssize_t  n;

    while (ss->rpc_out_pos < ss->rpc_out_len) {
        n = send(c->fd, ss->rpc_out + ss->rpc_out_pos,
                 ss->rpc_out_len - ss->rpc_out_pos, MSG_NOSIGNAL);

        if (n == -1) {
            if (ngx_socket_errno == NGX_EAGAIN) {
                break;
            }

            if (ngx_socket_errno == NGX_EINTR) {
                continue;
            }

            /* the carrier ended the stream */
            ngx_http_hermes_ssh_stream_rpc_close(ss);
            return;
        }

        ss->rpc_out_pos += n;
    }

    if (ss->rpc_out_pos == ss->rpc_out_len) {
        ss->rpc_out_pos = 0;
        ss->rpc_out_len = 0;
    }

    if (ngx_handle_write_event(ev, 0) != NGX_OK) {
        ngx_http_hermes_ssh_stream_rpc_close(ss);
    }
}


static void
ngx_http_hermes_ssh_stream_rpc_close(ngx_http_hermes_ssh_stream_t *ss)
{
    if (ss->rpc) {
        ngx_close_connection(ss->rpc);
        ss->rpc = NULL;
    }

    ngx_free(ss->rpc_out);
    ss->rpc_out = NULL;
    ss->rpc_out_size = 0;
    ss->rpc_out_pos = 0;
    ss->rpc_out_len = 0;
}
