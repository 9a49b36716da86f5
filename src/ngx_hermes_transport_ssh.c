
/*
 * ngx_hermes: a cell's stream on a kernel of an ssh host.  The carrier
 * (ngx_hermes_backend_ssh.c: the host's link to its kernel-host agent)
 * ships the cell and writes what the agent sends into a socketpair read
 * here: "\x1f\n" when the cell is shipped,
 * cell_out's event lines, then "\x1e" and the result (or the host side's
 * own word on a cell it could not ship or follow).  The head and the tail
 * of the event lines are kept as they go by, for a cell whose kernel is
 * lost: the files are on the other host.
 */


#include "ngx_hermes.h"


#define NGX_HTTP_HERMES_RELAY_CHUNK    (128 * 1024)


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

    unsigned                        res_ready:1;
    unsigned                        paused:1;   /* the client is slow */
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


ngx_http_hermes_transport_t  ngx_http_hermes_transport_ssh = {
    ngx_http_hermes_ssh_stream_run,
    ngx_http_hermes_ssh_stream_resume,
    ngx_http_hermes_ssh_stream_interrupt,
    ngx_http_hermes_ssh_stream_salvage,
    ngx_http_hermes_ssh_stream_close,
    0                                       /* tools: not carried yet */
};


static ngx_int_t
ngx_http_hermes_ssh_stream_run(ngx_http_hermes_stream_t *st)
{
    int                            sv[2];
    ngx_int_t                      rc;
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

    if (socketpair(AF_UNIX, SOCK_STREAM|SOCK_CLOEXEC, 0, sv) == -1) {
        ngx_log_error(NGX_LOG_ERR, st->log, ngx_errno,
                      "hermes: socketpair() failed");
        goto failed;
    }

    if (ngx_nonblocking(sv[0]) == -1) {
        close(sv[0]);
        close(sv[1]);
        goto failed;
    }

    c = ngx_get_connection(sv[0], st->log);
    if (c == NULL) {
        close(sv[0]);
        close(sv[1]);
        goto failed;
    }

    c->data = ss;
    c->read->handler = ngx_http_hermes_ssh_stream_relay_handler;
    c->read->log = st->log;
    ss->relay = c;

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        close(sv[1]);
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
                                   sv[1], st->log);
    if (rc != NGX_OK) {
        ngx_http_hermes_backend_give(&conn);
        close(sv[1]);

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
        }

        if (!st->is_shipped || ss->res_ready) {
            continue;
        }

        /* forward whole event lines, up to the result's marker */

        m = ngx_strlchr(b->pos, b->last, '\x1e');

        if (m) {
            nl = m;
            ss->res_ready = 1;

        } else {
            for (nl = b->last; nl > b->pos && nl[-1] != '\n'; nl--) {
                /* void */
            }
        }

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


/* a command on the kernel's host, in the thread pool */

static ngx_int_t
ngx_http_hermes_ssh_stream_interrupt(ngx_http_hermes_stream_t *st)
{
    ngx_http_hermes_victim_t  v;

    if (!st->is_shipped) {
        return NGX_DECLINED;
    }

    ngx_http_hermes_kernel_victim(&v, st->ref, st->hlcf->backend);

    return (ngx_http_hermes_kernel_interrupt(st->hlcf->thread_pool, &v,
                                             st->ref->cell_id, st->log)
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

    st->ctx = NULL;
}
