
/*
 * ngx_hermes: the ssh backend, kernels on remote hosts over libssh.
 *
 * Every libssh call runs in the thread pool, bounded by a timeout; the
 * event loop only hands connected sessions to tasks and takes them back
 * (one session is used by one thread at a time).  Each worker keeps the
 * sessions it opened, per host, and reuses them as OpenSSH's
 * ControlPersist would.
 *
 * A cell is relayed by hermes_relay.py on the kernel host over one channel:
 * it ships the cell, then streams cell_out as it grows and the result, and
 * the relay thread copies that into a socketpair the event loop reads.
 */


#include "ngx_hermes.h"

#include <libssh/libssh.h>


#define NGX_HTTP_HERMES_SSH_IDLE        16      /* sessions kept per host */
#define NGX_HTTP_HERMES_SSH_READ_MS     1000
#define NGX_HTTP_HERMES_SSH_RESUMES     6       /* 1.5 s of back-off */


struct ngx_http_hermes_ssh_host_s {
    ngx_str_t                    name;          /* "host" or "host:port" */
    u_char                      *host;          /* NUL-terminated */
    ngx_uint_t                   port;
    ssh_session                  idle[NGX_HTTP_HERMES_SSH_IDLE];
    ngx_uint_t                   nidle;
    ngx_msec_t                   failed_at;
    unsigned                     failed:1;
};


typedef struct {
    ngx_thread_task_t            task;
    ngx_http_hermes_conn_t       conn;
    ngx_socket_t                 fd;            /* the thread's end */
    u_char                       cmd[NGX_HTTP_HERMES_DIR_MAX * 2 + 64];
    u_char                      *req;
    size_t                       req_len;
    u_char                       resume[NGX_HTTP_HERMES_DIR_MAX * 2 + 64];
} ngx_http_hermes_relay_t;


static ngx_int_t ngx_http_hermes_ssh_connect(ngx_http_hermes_conn_t *conn);
static ngx_int_t ngx_http_hermes_ssh_run(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_cmd_t *cmd);
static void ngx_http_hermes_ssh_relay_thread(void *data, ngx_log_t *log);
static void ngx_http_hermes_ssh_relay_done(ngx_event_t *ev);


ngx_int_t
ngx_http_hermes_ssh_init(void)
{
    return (ssh_init() == SSH_OK) ? NGX_OK : NGX_ERROR;
}


ngx_http_hermes_ssh_host_t *
ngx_http_hermes_ssh_host_create(ngx_pool_t *pool, ngx_str_t *name,
    u_char *host, ngx_uint_t port)
{
    ngx_http_hermes_ssh_host_t  *h;

    h = ngx_pcalloc(pool, sizeof(ngx_http_hermes_ssh_host_t));
    if (h == NULL) {
        return NULL;
    }

    h->name = *name;
    h->host = host;
    h->port = port;

    return h;
}


ngx_str_t *
ngx_http_hermes_ssh_host_name(ngx_http_hermes_ssh_host_t *h)
{
    return &h->name;
}


/*
 * Event loop: the host for a new kernel, the one with the fewest kernels
 * ("count" from the registry) among those that have not failed lately.
 */

ngx_uint_t
ngx_http_hermes_ssh_pick_host(ngx_http_hermes_backend_conf_t *bcf,
    ngx_uint_t *count)
{
    ngx_uint_t                    i, best;
    ngx_http_hermes_ssh_host_t  **hosts;

    hosts = bcf->hosts->elts;
    best = NGX_CONF_UNSET_UINT;

    for (i = 0; i < bcf->hosts->nelts; i++) {
        if (hosts[i]->failed
            && ngx_current_msec - hosts[i]->failed_at
               < NGX_HTTP_HERMES_SSH_RETRY)
        {
            continue;
        }

        if (best == NGX_CONF_UNSET_UINT || count[i] < count[best]) {
            best = i;
        }
    }

    /* all failed lately: try the one that failed longest ago */

    if (best == NGX_CONF_UNSET_UINT) {
        best = 0;

        for (i = 1; i < bcf->hosts->nelts; i++) {
            if (hosts[i]->failed_at < hosts[best]->failed_at) {
                best = i;
            }
        }
    }

    return best;
}


/* event loop: a connected session for a task, if this worker has one */

void
ngx_http_hermes_conn_take(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_backend_conf_t *bcf, ngx_uint_t host)
{
    ngx_http_hermes_ssh_host_t  **hosts, *h;

    ngx_memzero(conn, sizeof(ngx_http_hermes_conn_t));

    conn->bcf = bcf;
    conn->host = host;

    if (bcf->type != NGX_HTTP_HERMES_BACKEND_SSH) {
        return;
    }

    hosts = bcf->hosts->elts;
    h = hosts[host < bcf->hosts->nelts ? host : 0];

    if (h->nidle) {
        conn->session = h->idle[--h->nidle];
    }
}


/* event loop: the task is done; keep its session for the next one */

void
ngx_http_hermes_conn_give(ngx_http_hermes_conn_t *conn)
{
    ssh_session                   s;
    ngx_http_hermes_ssh_host_t  **hosts, *h;

    if (conn->bcf == NULL || conn->bcf->type != NGX_HTTP_HERMES_BACKEND_SSH) {
        return;
    }

    hosts = conn->bcf->hosts->elts;
    h = hosts[conn->host < conn->bcf->hosts->nelts ? conn->host : 0];

    if (conn->unavailable) {
        h->failed = 1;
        h->failed_at = ngx_current_msec;

    } else {
        h->failed = 0;
    }

    s = conn->session;
    conn->session = NULL;

    if (s == NULL) {
        return;
    }

    if (ssh_is_connected(s) && h->nidle < NGX_HTTP_HERMES_SSH_IDLE) {
        h->idle[h->nidle++] = s;
        return;
    }

    ssh_free(s);
}


void
ngx_http_hermes_ssh_exit_process(ngx_http_hermes_backend_conf_t *bcf)
{
    ngx_uint_t                    i;
    ngx_http_hermes_ssh_host_t  **hosts;

    hosts = bcf->hosts->elts;

    for (i = 0; i < bcf->hosts->nelts; i++) {
        while (hosts[i]->nidle) {
            ssh_free(hosts[i]->idle[--hosts[i]->nidle]);
        }
    }
}


/*
 * Thread pool: connect and authenticate.  Public key from identity= only,
 * the host key checked against known_hosts= only (no user or system
 * config, no agent), an unknown or changed key refused.
 */

static ngx_int_t
ngx_http_hermes_ssh_connect(ngx_http_hermes_conn_t *conn)
{
    int                              rc, no;
    long                             timeout;
    ssh_key                          key;
    ssh_session                      s;
    ngx_http_hermes_ssh_host_t     **hosts, *h;
    ngx_http_hermes_backend_conf_t  *bcf;
    enum ssh_known_hosts_e           known;

    if (conn->session && ssh_is_connected(conn->session)) {
        return NGX_OK;
    }

    if (conn->session) {
        ssh_free(conn->session);
        conn->session = NULL;
    }

    bcf = conn->bcf;
    hosts = bcf->hosts->elts;
    h = hosts[conn->host];

    s = ssh_new();
    if (s == NULL) {
        ngx_snprintf(conn->err, sizeof(conn->err), "ssh_new() failed%Z");
        return NGX_ERROR;
    }

    no = 0;
    timeout = (long) ngx_max(bcf->connect_timeout / 1000, 1);

    if (ssh_options_set(s, SSH_OPTIONS_PROCESS_CONFIG, &no) != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_HOST, h->host) != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_PORT, &h->port) != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_USER, bcf->user.data) != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_KNOWNHOSTS, bcf->known_hosts.data)
           != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_GLOBAL_KNOWNHOSTS,
                           bcf->known_hosts.data)
           != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_TIMEOUT, &timeout) != SSH_OK)
    {
        ngx_snprintf(conn->err, sizeof(conn->err),
                     "ssh options for %V:%ui: %s%Z", &h->name, h->port,
                     ssh_get_error(s));
        ssh_free(s);
        return NGX_ERROR;
    }

    if (ssh_connect(s) != SSH_OK) {
        ngx_snprintf(conn->err, sizeof(conn->err),
                     "ssh connect to %V:%ui: %s%Z", &h->name, h->port,
                     ssh_get_error(s));
        ssh_free(s);
        return NGX_ERROR;
    }

    known = ssh_session_is_known_server(s);

    if (known != SSH_KNOWN_HOSTS_OK) {
        ngx_snprintf(conn->err, sizeof(conn->err),
                     "ssh host key of %V:%ui is %s in \"%V\": refused%Z",
                     &h->name, h->port,
                     known == SSH_KNOWN_HOSTS_CHANGED ? "changed"
                     : known == SSH_KNOWN_HOSTS_OTHER ? "of another type"
                     : known == SSH_KNOWN_HOSTS_ERROR ? "unreadable"
                     : "unknown",
                     &bcf->known_hosts);
        ssh_disconnect(s);
        ssh_free(s);
        return NGX_ERROR;
    }

    if (ssh_pki_import_privkey_file((char *) bcf->identity.data, NULL, NULL,
                                    NULL, &key)
        != SSH_OK)
    {
        ngx_snprintf(conn->err, sizeof(conn->err),
                     "ssh identity \"%V\" unreadable%Z", &bcf->identity);
        ssh_disconnect(s);
        ssh_free(s);
        return NGX_ERROR;
    }

    rc = ssh_userauth_publickey(s, NULL, key);
    ssh_key_free(key);

    if (rc != SSH_AUTH_SUCCESS) {
        ngx_snprintf(conn->err, sizeof(conn->err),
                     "ssh public key auth as %V at %V:%ui refused%Z",
                     &bcf->user, &h->name, h->port);
        ssh_disconnect(s);
        ssh_free(s);
        return NGX_ERROR;
    }

    conn->session = s;

    return NGX_OK;
}


/*
 * Thread pool: one command, its payload on the channel's stdin, stdout and
 * stderr captured.  A session that breaks is replaced once, but only when
 * the command was not started.
 */

ngx_int_t
ngx_http_hermes_ssh_exec(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_cmd_t *cmd)
{
    ngx_int_t   rc;
    ngx_uint_t  fresh;

    cmd->status = -1;
    cmd->out_len = 0;
    cmd->err = 0;

    fresh = (conn->session == NULL || !ssh_is_connected(conn->session));

    if (ngx_http_hermes_ssh_connect(conn) != NGX_OK) {
        conn->unavailable = 1;
        return NGX_DECLINED;
    }

    rc = ngx_http_hermes_ssh_run(conn, cmd);

    if (rc == NGX_AGAIN && !fresh) {
        /* a kept session the server closed meanwhile */

        ssh_free(conn->session);
        conn->session = NULL;

        if (ngx_http_hermes_ssh_connect(conn) != NGX_OK) {
            conn->unavailable = 1;
            return NGX_DECLINED;
        }

        rc = ngx_http_hermes_ssh_run(conn, cmd);
    }

    if (rc == NGX_AGAIN) {
        conn->unavailable = 1;
        return NGX_DECLINED;
    }

    return rc;
}


/* NGX_AGAIN: the channel could not be opened, nothing ran */

static ngx_int_t
ngx_http_hermes_ssh_run(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_cmd_t *cmd)
{
    int          n, err;
    size_t       sent;
    ngx_msec_t   waited;
    ssh_channel  ch;
    u_char       discard[512];

    ch = ssh_channel_new(conn->session);
    if (ch == NULL) {
        ngx_snprintf(conn->err, sizeof(conn->err), "ssh channel: %s%Z",
                     ssh_get_error(conn->session));
        return NGX_AGAIN;
    }

    if (ssh_channel_open_session(ch) != SSH_OK) {
        ngx_snprintf(conn->err, sizeof(conn->err), "ssh channel: %s%Z",
                     ssh_get_error(conn->session));
        ssh_channel_free(ch);
        return NGX_AGAIN;
    }

    if (ssh_channel_request_exec(ch, cmd->cmd) != SSH_OK) {
        ngx_snprintf(conn->err, sizeof(conn->err), "ssh exec: %s%Z",
                     ssh_get_error(conn->session));
        ssh_channel_free(ch);
        return NGX_AGAIN;
    }

    for (sent = 0; sent < cmd->in_len; sent += n) {
        n = ssh_channel_write(ch, cmd->in + sent, cmd->in_len - sent);
        if (n <= 0) {
            goto failed;
        }
    }

    if (ssh_channel_send_eof(ch) != SSH_OK) {
        goto failed;
    }

    for (waited = 0; ; ) {
        if (cmd->out_len < cmd->out_size) {
            n = ssh_channel_read_timeout(ch, cmd->out + cmd->out_len,
                                         cmd->out_size - cmd->out_len, 0,
                                         NGX_HTTP_HERMES_SSH_READ_MS);
        } else {
            n = ssh_channel_read_timeout(ch, discard, sizeof(discard), 0,
                                         NGX_HTTP_HERMES_SSH_READ_MS);
        }

        if (n == SSH_ERROR) {
            goto failed;
        }

        if (n > 0) {
            if (cmd->out_len < cmd->out_size) {
                cmd->out_len += n;
            }

            continue;
        }

        /* stderr goes where stdout went: the step's message */

        while (cmd->out_len < cmd->out_size
               && (n = ssh_channel_read_nonblocking(ch,
                                          cmd->out + cmd->out_len,
                                          cmd->out_size - cmd->out_len, 1))
                  > 0)
        {
            cmd->out_len += n;
        }

        if (ssh_channel_is_eof(ch)) {
            break;
        }

        waited += NGX_HTTP_HERMES_SSH_READ_MS;

        if (waited >= cmd->timeout) {
            cmd->err = NGX_ETIMEDOUT;
            ngx_snprintf(conn->err, sizeof(conn->err), "ssh command timed "
                         "out%Z");
            ssh_channel_close(ch);
            ssh_channel_free(ch);
            return NGX_ERROR;
        }
    }

    cmd->status = ssh_channel_get_exit_status(ch);

    ssh_channel_close(ch);
    ssh_channel_free(ch);

    return NGX_OK;

failed:

    err = ssh_get_error_code(conn->session);
    ngx_snprintf(conn->err, sizeof(conn->err), "ssh channel failed (%d): %s%Z",
                 err, ssh_get_error(conn->session));
    ssh_channel_free(ch);

    return NGX_ERROR;
}


/*
 * Event loop: relay cell "id" of the kernel in "dir" (process group "pid")
 * into fd, in a task of its own.  The task owns the session, the fd and a
 * copy of the request; it is freed when it completes, whether or not the
 * cell is still there.
 */

ngx_int_t
ngx_http_hermes_ssh_relay(ngx_thread_pool_t *tp, ngx_http_hermes_conn_t *conn,
    u_char *dir, uint32_t id, ngx_pid_t pid, u_char *req, size_t req_len,
    ngx_socket_t fd, ngx_log_t *log)
{
    ngx_http_hermes_relay_t  *rl;

    rl = ngx_calloc(sizeof(ngx_http_hermes_relay_t) + req_len, log);
    if (rl == NULL) {
        return NGX_ERROR;
    }

    rl->conn = *conn;
    rl->fd = fd;
    rl->req = (u_char *) rl + sizeof(ngx_http_hermes_relay_t);
    rl->req_len = req_len;
    ngx_memcpy(rl->req, req, req_len);

    /* -1: ship the request first; a resume gives the offset reached */

    *ngx_slprintf(rl->cmd, rl->cmd + sizeof(rl->cmd) - 1,
                  "exec python3 '%s/hermes_relay.py' %uD %P -1", dir, id, pid)
        = '\0';

    *ngx_slprintf(rl->resume, rl->resume + sizeof(rl->resume) - 1,
                  "exec python3 '%s/hermes_relay.py' %uD %P", dir, id, pid)
        = '\0';

    rl->task.ctx = rl;
    rl->task.handler = ngx_http_hermes_ssh_relay_thread;
    rl->task.event.handler = ngx_http_hermes_ssh_relay_done;
    rl->task.event.data = rl;
    rl->task.event.log = log;

    if (ngx_thread_task_post(tp, &rl->task) != NGX_OK) {
        /* the pool's queue is full: the kernel is fine, the caller retries */
        ngx_free(rl);
        return NGX_BUSY;
    }

    conn->session = NULL;

    return NGX_OK;
}


static ngx_int_t
ngx_http_hermes_relay_write(ngx_socket_t fd, u_char *p, size_t n)
{
    ssize_t  k;

    while (n) {
        k = send(fd, p, n, MSG_NOSIGNAL);

        if (k == -1) {
            if (ngx_errno == NGX_EINTR) {
                continue;
            }

            return NGX_ERROR;
        }

        p += k;
        n -= k;
    }

    return NGX_OK;
}


/*
 * Thread pool.  The relay writes "\x1f\n" once the cell is shipped, then
 * cell_out's bytes, then "\x1e" and the result.  A channel that breaks
 * mid-stream is reopened and the relay resumed from the cell_out offset
 * reached: the files are the truth.
 */

static void
ngx_http_hermes_ssh_relay_thread(void *data, ngx_log_t *log)
{
    ngx_http_hermes_relay_t *rl = data;

    int          n, tries;
    u_char      *cmd, *p, *last, *m, *resume, buf[16384];
    off_t        offset;
    size_t       len;
    ngx_uint_t   phase, header, ended;
    ssh_channel  ch;

    /* phase 0: before "\x1f\n"; 1: cell_out's bytes; 2: the result */

    phase = 0;
    header = 0;
    ended = 0;
    offset = 0;
    cmd = rl->cmd;

    resume = rl->resume + ngx_strlen(rl->resume);

    for (tries = 0; tries < NGX_HTTP_HERMES_SSH_RESUMES && !ended; tries++) {

        if (tries) {
            if (phase != 1) {
                /* not shipped yet, or the result was under way: no resume */
                break;
            }

            /* the host may be restarting its sshd: back off a little */
            ngx_msleep(100 * tries);

            ngx_sprintf(resume, " %O%Z", offset);
            cmd = rl->resume;

            if (rl->conn.session) {
                ssh_free(rl->conn.session);
                rl->conn.session = NULL;
            }
        }

        if (ngx_http_hermes_ssh_connect(&rl->conn) != NGX_OK) {
            rl->conn.unavailable = (tries == 0);
            continue;
        }

        ch = ssh_channel_new(rl->conn.session);
        if (ch == NULL) {
            continue;
        }

        if (ssh_channel_open_session(ch) != SSH_OK
            || ssh_channel_request_exec(ch, (char *) cmd) != SSH_OK)
        {
            ssh_channel_free(ch);
            continue;
        }

        if (tries == 0) {
            for (len = 0; len < rl->req_len; len += n) {
                n = ssh_channel_write(ch, rl->req + len, rl->req_len - len);
                if (n <= 0) {
                    break;
                }
            }
        }

        ssh_channel_send_eof(ch);

        for ( ;; ) {
            n = ssh_channel_read_timeout(ch, buf, sizeof(buf), 0,
                                         NGX_HTTP_HERMES_SSH_READ_MS);

            if (n == SSH_ERROR) {
                break;
            }

            if (n == 0) {
                if (ssh_channel_is_eof(ch)) {
                    /* mid-stream, the relay was cut off: resume */
                    ended = (phase != 1);
                    break;
                }

                /* quiet: is the cell still there to read what comes? */

                if (recv(rl->fd, buf, 1, MSG_PEEK|MSG_DONTWAIT) == 0) {
                    ended = 1;
                    break;
                }

                continue;
            }

            p = buf;
            last = buf + n;

            while (phase == 0 && p < last) {
                if (++header == 2) {
                    phase = 1;
                }

                p++;
            }

            if (phase == 1 && p < last) {
                m = ngx_strlchr(p, last, '\x1e');
                offset += (m ? m : last) - p;

                if (m) {
                    phase = 2;
                }
            }

            if (ngx_http_hermes_relay_write(rl->fd, buf, n) != NGX_OK) {
                /* the cell went away: stop relaying */
                ended = 1;
                break;
            }
        }

        ssh_channel_close(ch);
        ssh_channel_free(ch);
    }

    (void) log;
}


static void
ngx_http_hermes_ssh_relay_done(ngx_event_t *ev)
{
    ngx_http_hermes_relay_t *rl = ev->data;

    /* EOF for the cell's end of the socketpair */
    (void) close(rl->fd);

    ngx_http_hermes_conn_give(&rl->conn);

    ngx_free(rl);
}
