
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
 * the relay thread copies that into a socketpair the event loop reads.  A
 * connection that breaks is made again, with back-off, until the cell's
 * deadline, and the relay resumed where it was cut.  The relay's text goes
 * on the channel's stdin each time, from the module's own copy: the kernel
 * directory is the cell's to rewrite.
 */


#include "ngx_hermes.h"

#include <poll.h>
#include <libssh/libssh.h>


#define NGX_HTTP_HERMES_SSH_IDLE        16      /* sessions kept per host */
#define NGX_HTTP_HERMES_SSH_READ_MS     1000

/* resuming a broken relay: back-off from 100 ms doubling to 2 s */
#define NGX_HTTP_HERMES_SSH_BACKOFF     100
#define NGX_HTTP_HERMES_SSH_BACKOFF_MAX 2000

/* give up this long before the cell's timer, so the cell hears why */
#define NGX_HTTP_HERMES_SSH_MARGIN      500

/* a relay that exits without its result on a working connection */
#define NGX_HTTP_HERMES_SSH_CUTS        3

/*
 * python3 -c: reads a length line and that many bytes of stdin, the
 * relay's text, and runs it; the relay reads the cell request from the
 * same stdin.  No single quotes: it is quoted for the remote shell.
 */
#define NGX_HTTP_HERMES_SSH_LOADER                                            \
    "import sys;i=sys.stdin.buffer;"                                          \
    "exec(compile(i.read(int(i.readline())),\"hermes_relay.py\",\"exec\"))"


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
    u_char                       cmd[NGX_HTTP_HERMES_DIR_MAX + 512];
    u_char                       resume[NGX_HTTP_HERMES_DIR_MAX + 512];
    u_char                      *in;            /* length, relay, request */
    size_t                       in_len;
    size_t                       relay_len;     /* length and relay only */
    uint32_t                     id;
    ngx_msec_t                   deadline;      /* monotonic: give up then */

    /* what was forwarded, over whichever channel */
    off_t                        offset;        /* cell_out's bytes */
    size_t                       res_sent;      /* "\x1e" and the result's */
    ngx_uint_t                   header;        /* "\x1f\n" bytes seen */
    unsigned                     shipped:1;
} ngx_http_hermes_relay_t;


static void ngx_http_hermes_ssh_take(ngx_http_hermes_conn_t *conn);
static void ngx_http_hermes_ssh_give(ngx_http_hermes_conn_t *conn);
static ngx_int_t ngx_http_hermes_ssh_exec(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_cmd_t *cmd);
static ngx_int_t ngx_http_hermes_ssh_ready(ngx_http_hermes_conn_t *conn,
    u_char *dir, ngx_pid_t pid, ngx_pid_t expect, uint64_t *start);
static ngx_uint_t ngx_http_hermes_ssh_root(
    ngx_http_hermes_backend_conf_t *bcf);
static ngx_uint_t ngx_http_hermes_ssh_pick_host(
    ngx_http_hermes_backend_conf_t *bcf, ngx_uint_t *count);
static ngx_str_t *ngx_http_hermes_ssh_host_name(
    ngx_http_hermes_backend_conf_t *bcf, ngx_uint_t host);
static void ngx_http_hermes_ssh_exit_process(
    ngx_http_hermes_backend_conf_t *bcf);
static ngx_int_t ngx_http_hermes_ssh_connect(ngx_http_hermes_conn_t *conn,
    ngx_msec_t timeout);
static ngx_int_t ngx_http_hermes_ssh_run(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_cmd_t *cmd);
static void ngx_http_hermes_ssh_relay_thread(void *data, ngx_log_t *log);
static ngx_int_t ngx_http_hermes_ssh_relay_channel(
    ngx_http_hermes_relay_t *rl, u_char *cmd, ngx_uint_t first);
static ngx_int_t ngx_http_hermes_ssh_relay_wait(ngx_socket_t fd,
    ngx_msec_t ms);
static void ngx_http_hermes_ssh_relay_give_up(ngx_http_hermes_relay_t *rl,
    ngx_msec_t down, ngx_log_t *log);
static ngx_msec_t ngx_http_hermes_ssh_now(void);
static void ngx_http_hermes_ssh_relay_done(ngx_event_t *ev);


ngx_http_hermes_backend_ops_t  ngx_http_hermes_backend_ssh_ops = {
    ngx_string("ssh"),
    &ngx_http_hermes_transport_ssh,
    ngx_http_hermes_ssh_take,
    ngx_http_hermes_ssh_give,
    ngx_http_hermes_ssh_exec,
    ngx_http_hermes_ssh_ready,
    ngx_http_hermes_ssh_root,
    ngx_http_hermes_ssh_pick_host,
    ngx_http_hermes_ssh_host_name,
    NULL,                                   /* interrupt: a command */
    ngx_http_hermes_ssh_exit_process
};


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


static ngx_str_t *
ngx_http_hermes_ssh_host_name(ngx_http_hermes_backend_conf_t *bcf,
    ngx_uint_t host)
{
    ngx_http_hermes_ssh_host_t  **hosts;

    hosts = bcf->hosts->elts;

    return &hosts[host]->name;
}


/*
 * Event loop: the host for a new kernel, the one with the fewest kernels
 * ("count" from the registry) among those that have not failed lately.
 */

static ngx_uint_t
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

static void
ngx_http_hermes_ssh_take(ngx_http_hermes_conn_t *conn)
{
    ngx_http_hermes_ssh_host_t  **hosts, *h;

    hosts = conn->bcf->hosts->elts;
    h = hosts[conn->host];

    if (h->nidle) {
        conn->session = h->idle[--h->nidle];
    }
}


/* event loop: the task is done; keep its session for the next one */

static void
ngx_http_hermes_ssh_give(ngx_http_hermes_conn_t *conn)
{
    ssh_session                   s;
    ngx_http_hermes_ssh_host_t  **hosts, *h;

    hosts = conn->bcf->hosts->elts;
    h = hosts[conn->host];

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


static void
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
 * Thread pool: connect and authenticate, within "timeout" ms.  Public key
 * from identity= only, the host key checked against known_hosts= only (no
 * user or system config, no agent), an unknown or changed key refused.
 */

static ngx_int_t
ngx_http_hermes_ssh_connect(ngx_http_hermes_conn_t *conn, ngx_msec_t timeout)
{
    int                              rc, no;
    long                             sec, usec;
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
    sec = (long) (timeout / 1000);
    usec = (long) (timeout % 1000) * 1000;

    if (ssh_options_set(s, SSH_OPTIONS_PROCESS_CONFIG, &no) != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_HOST, h->host) != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_PORT, &h->port) != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_USER, bcf->user.data) != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_KNOWNHOSTS, bcf->known_hosts.data)
           != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_GLOBAL_KNOWNHOSTS,
                           bcf->known_hosts.data)
           != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_TIMEOUT, &sec) != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_TIMEOUT_USEC, &usec) != SSH_OK)
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

    if (timeout != bcf->connect_timeout) {
        /* a kept session's later calls get the configured bound */

        sec = (long) (bcf->connect_timeout / 1000);
        usec = (long) (bcf->connect_timeout % 1000) * 1000;

        if (ssh_options_set(s, SSH_OPTIONS_TIMEOUT, &sec) != SSH_OK
            || ssh_options_set(s, SSH_OPTIONS_TIMEOUT_USEC, &usec) != SSH_OK)
        {
            ngx_snprintf(conn->err, sizeof(conn->err),
                         "ssh options for %V:%ui: %s%Z", &h->name, h->port,
                         ssh_get_error(s));
            ssh_disconnect(s);
            ssh_free(s);
            return NGX_ERROR;
        }
    }

    conn->session = s;

    return NGX_OK;
}


/*
 * Thread pool: one command, its payload on the channel's stdin, stdout and
 * stderr captured.  A session that breaks is replaced once, but only when
 * the command was not started.
 */

static ngx_int_t
ngx_http_hermes_ssh_exec(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_cmd_t *cmd)
{
    ngx_int_t   rc;
    ngx_uint_t  fresh;

    cmd->status = -1;
    cmd->out_len = 0;
    cmd->err = 0;

    fresh = (conn->session == NULL || !ssh_is_connected(conn->session));

    if (ngx_http_hermes_ssh_connect(conn, conn->bcf->connect_timeout)
        != NGX_OK)
    {
        conn->unavailable = 1;
        return NGX_DECLINED;
    }

    rc = ngx_http_hermes_ssh_run(conn, cmd);

    if (rc == NGX_AGAIN && !fresh) {
        /* a kept session the server closed meanwhile */

        ssh_free(conn->session);
        conn->session = NULL;

        if (ngx_http_hermes_ssh_connect(conn, conn->bcf->connect_timeout)
        != NGX_OK)
    {
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

/*
 * Thread pool: the runner says "ready" with its pid, and /proc tells the
 * pid's start time, in one command: the host may be far.
 */

static ngx_int_t
ngx_http_hermes_ssh_ready(ngx_http_hermes_conn_t *conn, u_char *dir,
    ngx_pid_t pid, ngx_pid_t expect, uint64_t *start)
{
    u_char                 *p;
    u_char                  out[1024];
    u_char                  cmd[2 * NGX_HTTP_HERMES_DIR_MAX + 512];
    ngx_int_t               rc;
    ngx_http_hermes_cmd_t   c;

    *ngx_slprintf(cmd, cmd + sizeof(cmd) - 1,
                  "i=0; while [ $i -lt 1000 ] && [ ! -s '%s/ready' ]"
                  " && kill -0 %P 2>/dev/null;"
                  " do sleep 0.01; i=$((i+1)); done;"
                  " cat '%s/ready' && kill -0 %P"
                  " && echo && cat /proc/%P/stat",
                  dir, pid, dir, pid, pid) = '\0';

    ngx_memzero(&c, sizeof(ngx_http_hermes_cmd_t));

    c.cmd = (char *) cmd;
    c.out = out;
    c.out_size = sizeof(out) - 1;
    c.timeout = 10000;              /* the loop above: 10 s at most */

    rc = ngx_http_hermes_ssh_exec(conn, &c);

    if (rc != NGX_OK) {
        return rc;
    }

    out[c.out_len] = '\0';

    if (c.status != 0 || ngx_http_hermes_ready_pid(out, expect) != NGX_OK) {
        return NGX_ERROR;
    }

    /* "ready" has no newline of its own: the stat line follows */
    p = (u_char *) ngx_strchr(out, '\n');
    p = p ? p + 1 : out;

    return ngx_http_hermes_proc_start(p, ngx_strlen(p), start);
}


/* kernels never run as root: a root login drops to the sandbox's user */

static ngx_uint_t
ngx_http_hermes_ssh_root(ngx_http_hermes_backend_conf_t *bcf)
{
    return bcf->user.len == 4 && ngx_strncmp(bcf->user.data, "root", 4) == 0;
}


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
 * Event loop: relay cell "id" of the kernel "ref" into fd, in a task of its
 * own, for at most "timeout" ms (the cell's).  The relay reads no more than
 * "out_limit" bytes of cell_out and a result of "res_limit" bytes at most.
 * The task owns the session, the fd and a copy of the request; it is freed
 * when it completes, whether or not the cell is still there.
 */

ngx_int_t
ngx_http_hermes_ssh_relay(ngx_thread_pool_t *tp, ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_kernel_ref_t *ref, off_t out_limit, off_t res_limit,
    ngx_msec_t timeout, u_char *req, size_t req_len, ngx_socket_t fd,
    ngx_log_t *log)
{
    u_char                         *p;
    ngx_http_hermes_relay_t        *rl;
    ngx_http_hermes_remote_file_t  *rf;

    for (rf = ngx_http_hermes_remote_files; rf->len; rf++) {
        if (ngx_strcmp(rf->name.data, "hermes_relay.py") == 0) {
            break;
        }
    }

    if (rf->len == 0) {
        ngx_log_error(NGX_LOG_ALERT, log, 0,
                      "hermes: hermes_relay.py is not built in");
        return NGX_ERROR;
    }

    rl = ngx_calloc(sizeof(ngx_http_hermes_relay_t) + NGX_INT64_LEN + 1
                    + rf->len + req_len, log);
    if (rl == NULL) {
        return NGX_ERROR;
    }

    rl->conn = *conn;
    rl->fd = fd;
    rl->id = ref->cell_id;

    rl->in = (u_char *) rl + sizeof(ngx_http_hermes_relay_t);
    p = ngx_sprintf(rl->in, "%uz\n", rf->len);
    p = ngx_cpymem(p, rf->data, rf->len);
    rl->relay_len = p - rl->in;
    p = ngx_cpymem(p, req, req_len);
    rl->in_len = p - rl->in;

    /* before the cell's timer fires, which is set just after this */
    rl->deadline = ngx_http_hermes_ssh_now() + timeout
                   - ngx_min(timeout, NGX_HTTP_HERMES_SSH_MARGIN);

    /*
     * DIR N PID START INO OUT_LIMIT RES_LIMIT, then -1: ship the request
     * first; a resume gives the offset reached
     */

    p = ngx_slprintf(rl->resume, rl->resume + sizeof(rl->resume) - 1,
                     "exec python3 -I -c '" NGX_HTTP_HERMES_SSH_LOADER "'"
                     " '%s' %uD %P %uL %uL %O %O",
                     ref->dir, ref->cell_id, ref->pid, ref->start, ref->ino,
                     out_limit, res_limit);
    *p = '\0';

    *ngx_slprintf(rl->cmd, rl->cmd + sizeof(rl->cmd) - 1, "%s -1", rl->resume)
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
 * cell_out's bytes, then "\x1e" and the result.  A connection that breaks
 * after the cell was shipped is made again, backing off from 100 ms to 2 s
 * (jittered), until the cell's deadline; the relay is resumed from the
 * cell_out offset forwarded (the files are the truth) and what the new
 * channel repeats of the result is dropped.  Each try is bounded by what
 * is left of the cell, and the cell closing its end stops them at once.
 */

static void
ngx_http_hermes_ssh_relay_thread(void *data, ngx_log_t *log)
{
    ngx_http_hermes_relay_t *rl = data;

    off_t        before;
    u_char      *cmd, *resume;
    ngx_int_t    rc;
    ngx_msec_t   now, left, timeout, delay, wait, broke;
    ngx_uint_t   cuts, reached;

    cmd = rl->cmd;
    resume = rl->resume + ngx_strlen(rl->resume);
    timeout = rl->conn.bcf->connect_timeout;
    delay = 0;
    broke = 0;
    cuts = 0;

    for ( ;; ) {

        if (cmd == rl->resume) {
            now = ngx_http_hermes_ssh_now();

            if (now >= rl->deadline) {
                ngx_http_hermes_ssh_relay_give_up(rl, now - broke, log);
                break;
            }

            timeout = ngx_min(rl->conn.bcf->connect_timeout,
                              rl->deadline - now);
        }

        before = rl->offset + (off_t) (rl->res_sent + rl->header);
        reached = 0;

        if (ngx_http_hermes_ssh_connect(&rl->conn, timeout) != NGX_OK) {
            rc = NGX_AGAIN;

        } else {
            reached = 1;
            rc = ngx_http_hermes_ssh_relay_channel(rl, cmd, cmd == rl->cmd);
        }

        if (rc == NGX_OK || rc == NGX_DONE) {
            /* the relay ended, or the cell did */
            break;
        }

        if (!rl->shipped) {
            /* no resume: the cell says it could not be shipped */
            rl->conn.unavailable = !reached;
            break;
        }

        now = ngx_http_hermes_ssh_now();

        if (reached) {
            /* the host answered until now */
            broke = now;
        }

        if (rl->offset + (off_t) (rl->res_sent + rl->header) != before) {
            /* it streamed: a new outage, if any, starts here */
            delay = 0;
            cuts = 0;

        } else if (rc == NGX_DECLINED
                   && ++cuts >= NGX_HTTP_HERMES_SSH_CUTS)
        {
            /* it exits at once each time: not an outage */
            break;
        }

        if (delay == 0) {
            ngx_log_error(NGX_LOG_WARN, log, 0,
                          "hermes: the relay of cell %uD was cut at offset "
                          "%O: %s; resuming", rl->id, rl->offset,
                          rc == NGX_DECLINED ? "it exited"
                                             : "the connection broke");
        }

        if (rc == NGX_AGAIN && rl->conn.session) {
            ssh_free(rl->conn.session);
            rl->conn.session = NULL;
        }

        delay = delay ? ngx_min(delay * 2, NGX_HTTP_HERMES_SSH_BACKOFF_MAX)
                      : NGX_HTTP_HERMES_SSH_BACKOFF;

        left = (now < rl->deadline) ? rl->deadline - now : 0;
        wait = delay / 2 + (ngx_msec_t) ngx_random() % (delay / 2 + 1);
        wait = ngx_min(wait, left);

        if (ngx_http_hermes_ssh_relay_wait(rl->fd, wait) != NGX_OK) {
            /* the cell ended meanwhile */
            break;
        }

        ngx_sprintf(resume, " %O%Z", rl->offset);
        cmd = rl->resume;
    }
}


/*
 * One channel of the relay: NGX_OK when the relay ended (the result sent,
 * or the cell not shipped), NGX_DONE when the cell went away, NGX_AGAIN
 * when the channel or its connection broke, NGX_DECLINED when the relay
 * exited mid-stream on a working connection.
 */

static ngx_int_t
ngx_http_hermes_ssh_relay_channel(ngx_http_hermes_relay_t *rl, u_char *cmd,
    ngx_uint_t first)
{
    int          n;
    u_char      *p, *q, *m, *last, buf[16384];
    size_t       len, seen, size;
    ngx_int_t    rc;
    ngx_uint_t   phase;
    ssh_channel  ch;

    ch = ssh_channel_new(rl->conn.session);
    if (ch == NULL) {
        return NGX_AGAIN;
    }

    if (ssh_channel_open_session(ch) != SSH_OK
        || ssh_channel_request_exec(ch, (char *) cmd) != SSH_OK)
    {
        ssh_channel_free(ch);
        return NGX_AGAIN;
    }

    /* the relay's text each time; the request only when it is shipped */

    size = first ? rl->in_len : rl->relay_len;

    for (len = 0; len < size; len += n) {
        n = ssh_channel_write(ch, rl->in + len, size - len);
        if (n <= 0) {
            break;
        }
    }

    ssh_channel_send_eof(ch);

    /* phase 0: before "\x1f\n"; 1: cell_out's bytes; 2: "\x1e", the result */

    phase = first ? 0 : 1;
    seen = 0;

    for ( ;; ) {
        n = ssh_channel_read_timeout(ch, buf, sizeof(buf), 0,
                                     NGX_HTTP_HERMES_SSH_READ_MS);

        if (n == SSH_ERROR) {
            rc = NGX_AGAIN;
            break;
        }

        if (n == 0) {
            if (ssh_channel_is_eof(ch)) {
                rc = (phase == 1) ? NGX_DECLINED : NGX_OK;
                break;
            }

            /* quiet: is the cell still there to read what comes? */

            if (recv(rl->fd, buf, 1, MSG_PEEK|MSG_DONTWAIT) == 0) {
                rc = NGX_DONE;
                break;
            }

            continue;
        }

        p = buf;
        q = buf;            /* forwarded from q on */
        last = buf + n;

        while (p < last) {

            if (phase == 0) {
                if (*p == '\x1e') {
                    /* the relay's word before shipping: a dead kernel */
                    phase = 2;
                    continue;
                }

                if (++rl->header == 2) {
                    rl->shipped = 1;
                    phase = 1;
                }

                p++;
                continue;
            }

            if (phase == 1) {
                m = ngx_strlchr(p, last, '\x1e');
                len = (m ? m : last) - p;

                rl->offset += len;
                p += len;

                if (m) {
                    phase = 2;
                }

                continue;
            }

            /* what an earlier channel forwarded of the result is dropped */

            if (seen < rl->res_sent) {
                len = ngx_min((size_t) (last - p), rl->res_sent - seen);

                if (ngx_http_hermes_relay_write(rl->fd, q, p - q) != NGX_OK) {
                    rc = NGX_DONE;
                    goto done;
                }

                p += len;
                q = p;
                seen += len;
                continue;
            }

            len = last - p;
            seen += len;
            rl->res_sent += len;
            p = last;
        }

        if (ngx_http_hermes_relay_write(rl->fd, q, last - q) != NGX_OK) {
            /* the cell went away: stop relaying */
            rc = NGX_DONE;
            break;
        }
    }

done:

    ssh_channel_close(ch);
    ssh_channel_free(ch);

    return rc;
}


/* wait "ms" between tries: NGX_DONE if the cell closed its end meanwhile */

static ngx_int_t
ngx_http_hermes_ssh_relay_wait(ngx_socket_t fd, ngx_msec_t ms)
{
    u_char         c;
    ssize_t        n;
    struct pollfd  pfd;

    pfd.fd = fd;
    pfd.events = POLLIN;
    pfd.revents = 0;

    if (poll(&pfd, 1, (int) ms) <= 0) {
        /* the time is up (or a signal cut it short) */
        return NGX_OK;
    }

    n = recv(fd, &c, 1, MSG_PEEK|MSG_DONTWAIT);

    if (n == 0 || (n == -1 && ngx_socket_errno != NGX_EAGAIN
                   && ngx_socket_errno != NGX_EINTR))
    {
        return NGX_DONE;
    }

    return NGX_OK;
}


/*
 * The host stayed unreachable until the cell's deadline: the cell hears it
 * as the relay's word, with an error for its answer.  Its kernel is killed
 * (the kill is retried while the host is down) and the session's state is
 * lost.
 */

static void
ngx_http_hermes_ssh_relay_give_up(ngx_http_hermes_relay_t *rl,
    ngx_msec_t down, ngx_log_t *log)
{
    u_char                       *p;
    u_char                        buf[NGX_HTTP_HERMES_HOST_MAX * 6 + 512];
    size_t                        len;
    ngx_http_hermes_ssh_host_t  **hosts, *h;

    static u_char                 start[] = "\x1e{\"relay\":\"unreachable\","
                                            "\"status\":\"error\",\"error\":"
                                            "\"the kernel host ";

    rl->conn.unavailable = 1;

    hosts = rl->conn.bcf->hosts->elts;
    h = hosts[rl->conn.host];

    ngx_log_error(NGX_LOG_WARN, log, 0,
                  "hermes: the kernel host %s:%ui could not be reached for "
                  "%M ms during cell %uD, giving up at its deadline",
                  h->host, h->port, down, rl->id);

    if (rl->res_sent) {
        /* the result's marker went out: nothing more can be said */
        return;
    }

    p = ngx_cpymem(buf, start, sizeof(start) - 1);

    len = ngx_min(ngx_strlen(h->host), NGX_HTTP_HERMES_HOST_MAX);
    p = (u_char *) ngx_escape_json(p, h->host, len);

    p = ngx_slprintf(p, buf + sizeof(buf),
                     ":%ui could not be reached for %M.%M s during the cell; "
                     "the kernel there is killed once the host answers "
                     "again, and the session's state is lost\"}",
                     h->port, down / 1000, down % 1000 / 100);

    (void) ngx_http_hermes_relay_write(rl->fd, buf, p - buf);
}


static ngx_msec_t
ngx_http_hermes_ssh_now(void)
{
    struct timespec  ts;

    (void) clock_gettime(CLOCK_MONOTONIC, &ts);

    return (ngx_msec_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}


static void
ngx_http_hermes_ssh_relay_done(ngx_event_t *ev)
{
    ngx_http_hermes_relay_t *rl = ev->data;

    /* EOF for the cell's end of the socketpair */
    (void) close(rl->fd);

    ngx_http_hermes_ssh_give(&rl->conn);

    ngx_free(rl);
}


/*
 * nginx -t: identity= must be a private key libssh can read without a
 * passphrase, known_hosts= lines of "hosts keytype key" (it may be empty:
 * then every host is unknown, and refused).  NULL, or why not.
 */

char *
ngx_http_hermes_ssh_check_files(ngx_str_t *identity, ngx_str_t *known_hosts)
{
    char        line[16384], *p, *tok, *save;
    FILE       *f;
    ssh_key     key;
    ngx_uint_t  fields;

    key = NULL;

    if (ssh_pki_import_privkey_file((char *) identity->data, NULL, NULL,
                                    NULL, &key)
        != SSH_OK)
    {
        return "identity= is not a private key libssh can read (a "
               "passphrase is not supported)";
    }

    ssh_key_free(key);

    f = fopen((char *) known_hosts->data, "r");
    if (f == NULL) {
        return "known_hosts= cannot be read";
    }

    while (fgets(line, sizeof(line), f)) {
        for (p = line; *p == ' ' || *p == '\t'; p++) { /* void */ }

        if (*p == '#' || *p == '\n' || *p == '\0') {
            continue;
        }

        fields = 0;

        for (tok = strtok_r(p, " \t\r\n", &save); tok;
             tok = strtok_r(NULL, " \t\r\n", &save))
        {
            fields++;
        }

        if (fields < 3) {
            fclose(f);
            return "known_hosts= has a line that is not \"host keytype key\"";
        }
    }

    fclose(f);

    return NULL;
}
