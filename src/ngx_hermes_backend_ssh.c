
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: the ssh backend, kernels on remote hosts over libssh.
 *
 * Each worker keeps one link per host of a backend: one ssh connection,
 * one channel on it running the kernel-host agent (hermes_agent.py, sent
 * from the module's own copy on the channel's stdin: the kernel directory
 * is the cell's to rewrite), and one I/O thread of its own that alone
 * calls libssh for it.  Spawn steps, kills and interrupts are EXEC frames
 * on that channel; a cell is a CELL stream whose output the I/O thread
 * writes into the cell's socketpair (read by ngx_hermes_transport_ssh.c):
 * "\x1f\n" once it is shipped, cell_out's bytes, then "\x1e" and the
 * result or the agent's word.  The login shell and its rc files run once
 * per connection.
 *
 * Other threads hand the I/O thread work through a queue under a mutex and
 * an eventfd in its poll set; an EXEC's thread-pool task waits on a
 * condition variable for its EXIT.  The event loop never waits.
 *
 * A connection that breaks is made again, backing off from 100 ms to 2 s
 * (jittered), and a new agent resumes every shipped cell from the output
 * offset reached (the files are the truth); a cell whose host stays away
 * past its deadline hears so.
 */


#include "ngx_hermes.h"
#include "ngx_hermes_ssh.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <libssh/libssh.h>


/* resuming after a break: back-off from 100 ms doubling to 2 s */
#define NGX_HTTP_HERMES_SSH_BACKOFF     100
#define NGX_HTTP_HERMES_SSH_BACKOFF_MAX 2000

/* give up this long before the cell's timer, so the cell hears why */
#define NGX_HTTP_HERMES_SSH_MARGIN      500

/* the agent says HELLO within this, after its channel opened */
#define NGX_HTTP_HERMES_SSH_START       10000

/* cell_out a stream may have in flight beyond what its cell took */
#define NGX_HTTP_HERMES_SSH_WINDOW      (128 * 1024)

/* what the login shell may print before the agent's magic line */
#define NGX_HTTP_HERMES_SSH_JUNK        65536

/* tool call requests a cell has not taken yet, at most */
#define NGX_HTTP_HERMES_SSH_RPC_BACKLOG (16 * 1024 * 1024)

/*
 * bytes of a file one EXEC moves (hermes_files.py's pieces): its stdin and
 * its output each within one frame of the agent's, with room to spare
 */
#define NGX_HTTP_HERMES_SSH_EXEC_PIECE  (512 * 1024)

/* an EXEC's EXIT is waited for this long beyond its own timeout */
#define NGX_HTTP_HERMES_SSH_EXEC_SLACK  2000

/*
 * a connection quiet this long while streams wait on it is pinged; no
 * answer within connect_timeout: it is taken for broken (a host gone
 * without a word, which TCP would see only after many minutes)
 */
#define NGX_HTTP_HERMES_SSH_QUIET       5000

/* a host that failed is skipped for new kernels this long */
#define NGX_HTTP_HERMES_SSH_RETRY       30000

/*
 * python3 -c: reads a length line and that many bytes of stdin, the
 * agent's text, and runs it; the frames follow on the same stdin, once
 * the agent said HELLO.  No single quotes: it is quoted for the remote
 * shell.
 */
#define NGX_HTTP_HERMES_SSH_LOADER                                            \
    "import sys;i=sys.stdin.buffer;"                                          \
    "exec(compile(i.read(int(i.readline())),\"hermes_agent.py\",\"exec\"))"


typedef struct ngx_http_hermes_ssh_host_s  ngx_http_hermes_ssh_host_t;
typedef struct ngx_http_hermes_ssh_link_s  ngx_http_hermes_ssh_link_t;


/* hermes_backend ssh's own configuration, its bcf->data */

typedef struct {
    ngx_array_t                  *hosts;        /* of host pointers */
    ngx_str_t                     user;         /* NUL-terminated */
    ngx_str_t                     identity;
    ngx_str_t                     known_hosts;
    ngx_msec_t                    connect_timeout;
} ngx_http_hermes_ssh_conf_t;

/* its parameters that are a string each: user=, identity=, known_hosts= */

typedef struct {
    ngx_str_t                     name;
    size_t                        offset;
} ngx_http_hermes_ssh_string_t;

static ngx_http_hermes_ssh_string_t  ngx_http_hermes_ssh_strings[] = {
    { ngx_string("user="), offsetof(ngx_http_hermes_ssh_conf_t, user) },
    { ngx_string("identity="),
      offsetof(ngx_http_hermes_ssh_conf_t, identity) },
    { ngx_string("known_hosts="),
      offsetof(ngx_http_hermes_ssh_conf_t, known_hosts) },
    { ngx_null_string, 0 }
};

#define ngx_http_hermes_ssh_conf(bcf)                                         \
    ((ngx_http_hermes_ssh_conf_t *) (bcf)->data)


struct ngx_http_hermes_ssh_host_s {
    ngx_str_t                    name;          /* "host" or "host:port" */
    u_char                      *host;          /* NUL-terminated */
    ngx_uint_t                   port;
    ngx_http_hermes_ssh_link_t  *link;          /* this worker's */
    ngx_msec_t                   failed_at;
    unsigned                     failed:1;
};


/* an EXEC's waiter, on its thread-pool thread's stack */

typedef struct {
    ngx_http_hermes_conn_t      *conn;
    ngx_http_hermes_cmd_t       *cmd;
    ngx_int_t                    rc;
    ngx_uint_t                   done;
} ngx_http_hermes_ssh_exec_t;


typedef struct {
    ngx_queue_t                  queue;
    uint32_t                     id;
    ngx_msec_t                   deadline;      /* monotonic */

    /* the first frame, its stream id set when sent */
    u_char                      *frame;
    size_t                       frame_len;

    ngx_http_hermes_ssh_exec_t  *exec;          /* NULL: a cell */

    /* a cell */
    ngx_socket_t                 fd;            /* the I/O thread's end */
    ngx_http_hermes_frame_cell_t cell;
    u_char                       dir[NGX_HTTP_HERMES_DIR_MAX];
    off_t                        taken;         /* cell_out into fd */
    off_t                        recvd;         /* cell_out from the agent */
    off_t                        acked;
    ngx_uint_t                   hdr;           /* of "\x1f\n", to write */
    u_char                      *out;           /* cell_out, to write */
    size_t                       out_pos;
    size_t                       out_len;
    size_t                       out_size;
    u_char                      *res;           /* "\x1e" and the result */
    size_t                       res_pos;
    size_t                       res_len;

    /* tool calls: RPC_REQ payloads to the cell, its answers back */
    ngx_socket_t                 rfd;           /* -1: none */
    u_char                      *rq;
    size_t                       rq_pos;
    size_t                       rq_len;
    size_t                       rq_size;
    u_char                      *ra;
    size_t                       ra_len;
    size_t                       ra_size;

    unsigned                     note:1;        /* a frame, no answer */
    unsigned                     sent:1;        /* to the running agent */
    unsigned                     shipped:1;
    unsigned                     ended:1;       /* the agent is done */
} ngx_http_hermes_ssh_stream_t;


struct ngx_http_hermes_ssh_link_s {
    pthread_t                        thread;
    pthread_mutex_t                  mutex;
    pthread_cond_t                   cond;      /* an EXEC is done */
    int                              wake;      /* eventfd */
    ngx_queue_t                      posted;    /* streams, under mutex */
    ngx_uint_t                       quit;      /* under mutex */
    ngx_atomic_t                     down;      /* the host cannot be
                                                   reached now */

    /* the I/O thread's own */
    ngx_http_hermes_backend_conf_t  *bcf;
    ngx_http_hermes_ssh_conf_t      *scf;       /* bcf->data */
    ngx_http_hermes_ssh_host_t      *h;
    ngx_log_t                       *log;
    ssh_session                      session;
    ssh_channel                      channel;
    ngx_uint_t                       magic;     /* the agent's line came */
    ngx_uint_t                       ready;     /* HELLO came */
    ngx_msec_t                       started;   /* the channel opened */
    ngx_msec_t                       retry;     /* connect again then */
    ngx_msec_t                       delay;
    ngx_msec_t                       answered;  /* the host last answered */
    ngx_msec_t                       heard;     /* bytes came last */
    ngx_msec_t                       pinged;    /* a PING unanswered */
    ngx_queue_t                      streams;
    ngx_uint_t                       nstreams;
    uint32_t                         next;
    char                            *broken;    /* why, to act on */
    size_t                           junk;

    u_char                          *in;        /* from the agent */
    size_t                           in_len;
    size_t                           in_size;
    u_char                          *out;       /* to the agent */
    size_t                           out_pos;
    size_t                           out_len;
    size_t                           out_size;

    struct pollfd                   *pfd;
    ngx_http_hermes_ssh_stream_t   **pfs;
    ngx_uint_t                       npfd;

    u_char                           err[256];
};


static void *ngx_http_hermes_ssh_create_conf(ngx_conf_t *cf);
static ngx_int_t ngx_http_hermes_ssh_parse(ngx_conf_t *cf, void *conf,
    ngx_str_t *param);
static char *ngx_http_hermes_ssh_init_conf(ngx_conf_t *cf,
    ngx_http_hermes_backend_conf_t *bcf);
static ngx_int_t ngx_http_hermes_ssh_init_process(ngx_cycle_t *cycle);
static ngx_http_hermes_ssh_host_t *ngx_http_hermes_ssh_host_create(
    ngx_pool_t *pool, ngx_str_t *name, u_char *host, ngx_uint_t port);
static char *ngx_http_hermes_ssh_check_files(ngx_str_t *identity,
    ngx_str_t *known_hosts);
static void ngx_http_hermes_ssh_take(ngx_http_hermes_conn_t *conn);
static void ngx_http_hermes_ssh_give(ngx_http_hermes_conn_t *conn);
static ngx_int_t ngx_http_hermes_ssh_exec(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_cmd_t *cmd);
static ngx_int_t ngx_http_hermes_ssh_request(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_ssh_stream_t *s, ngx_http_hermes_cmd_t *cmd);
static ngx_int_t ngx_http_hermes_ssh_ready(ngx_http_hermes_conn_t *conn,
    u_char *dir, ngx_pid_t pid, ngx_pid_t expect, uint64_t *start);
static ngx_int_t ngx_http_hermes_ssh_interrupt(
    ngx_http_hermes_backend_conf_t *bcf, ngx_http_hermes_victim_t *v,
    uint32_t cell, ngx_log_t *log);
static ngx_uint_t ngx_http_hermes_ssh_root(
    ngx_http_hermes_backend_conf_t *bcf);
static ngx_uint_t ngx_http_hermes_ssh_pick_host(
    ngx_http_hermes_backend_conf_t *bcf, ngx_uint_t *count);
static ngx_str_t *ngx_http_hermes_ssh_host_name(
    ngx_http_hermes_backend_conf_t *bcf, ngx_uint_t host);
static void ngx_http_hermes_ssh_exit_process(
    ngx_http_hermes_backend_conf_t *bcf);
static ngx_http_hermes_ssh_link_t *ngx_http_hermes_ssh_link_get(
    ngx_http_hermes_backend_conf_t *bcf, ngx_http_hermes_ssh_host_t *h);
static void ngx_http_hermes_ssh_post(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_ssh_stream_t *s);
static void *ngx_http_hermes_ssh_thread(void *data);
static ngx_int_t ngx_http_hermes_ssh_posted(ngx_http_hermes_ssh_link_t *l);
static ngx_msec_t ngx_http_hermes_ssh_start_streams(
    ngx_http_hermes_ssh_link_t *l);
static ngx_msec_t ngx_http_hermes_ssh_deadlines(ngx_http_hermes_ssh_link_t *l,
    ngx_msec_t now);
static ngx_uint_t ngx_http_hermes_ssh_poll(ngx_http_hermes_ssh_link_t *l,
    ngx_msec_t next);
static void ngx_http_hermes_ssh_io(ngx_http_hermes_ssh_link_t *l,
    ngx_uint_t nfd);
static void ngx_http_hermes_ssh_quit(ngx_http_hermes_ssh_link_t *l);
static ngx_int_t ngx_http_hermes_ssh_connect(ngx_http_hermes_ssh_link_t *l,
    ngx_msec_t timeout);
static void ngx_http_hermes_ssh_start(ngx_http_hermes_ssh_link_t *l,
    ngx_uint_t urgent);
static void ngx_http_hermes_ssh_break(ngx_http_hermes_ssh_link_t *l,
    ngx_msec_t now);
static void ngx_http_hermes_ssh_read(ngx_http_hermes_ssh_link_t *l);
static ngx_http_hermes_ssh_stream_t *ngx_http_hermes_ssh_find(
    ngx_http_hermes_ssh_link_t *l, uint32_t id);
static void ngx_http_hermes_ssh_frame(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_frame_t *f);
static void ngx_http_hermes_ssh_send(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_ssh_stream_t *s);
static ngx_uint_t ngx_http_hermes_ssh_noted(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_ssh_stream_t *s);
static ngx_int_t ngx_http_hermes_ssh_room(u_char **buf, size_t *size,
    size_t *pos, size_t *len, size_t need, size_t least, ngx_log_t *log);
static ngx_int_t ngx_http_hermes_ssh_append(ngx_http_hermes_ssh_link_t *l,
    u_char *p, size_t n);
static void ngx_http_hermes_ssh_flush(ngx_http_hermes_ssh_link_t *l);
static ngx_int_t ngx_http_hermes_ssh_cell_write(
    ngx_http_hermes_ssh_link_t *l, ngx_http_hermes_ssh_stream_t *s);
static void ngx_http_hermes_ssh_rpc_request(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_ssh_stream_t *s, ngx_http_hermes_frame_t *f);
static void ngx_http_hermes_ssh_rpc_io(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_ssh_stream_t *s);
static void ngx_http_hermes_ssh_rpc_close(ngx_http_hermes_ssh_stream_t *s);
static void ngx_http_hermes_ssh_give_up(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_ssh_stream_t *s, ngx_msec_t now);
static void ngx_http_hermes_ssh_exec_done(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_ssh_stream_t *s, ngx_int_t rc);
static void ngx_http_hermes_ssh_end(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_ssh_stream_t *s, ngx_uint_t cancel);
static ngx_msec_t ngx_http_hermes_ssh_now(void);


ngx_http_hermes_backend_ops_t  ngx_http_hermes_backend_ssh_ops = {
    ngx_string("ssh"),
    &ngx_http_hermes_transport_ssh,
    NGX_HTTP_HERMES_SSH_EXEC_PIECE,
    ngx_http_hermes_ssh_create_conf,
    ngx_http_hermes_ssh_parse,
    ngx_http_hermes_ssh_init_conf,
    ngx_http_hermes_ssh_init_process,
    ngx_http_hermes_ssh_take,
    ngx_http_hermes_ssh_give,
    ngx_http_hermes_ssh_exec,
    ngx_http_hermes_ssh_ready,
    ngx_http_hermes_ssh_root,
    ngx_http_hermes_ssh_pick_host,
    ngx_http_hermes_ssh_host_name,
    ngx_http_hermes_ssh_interrupt,
    NULL,                                   /* alive: a take finds out */
    ngx_http_hermes_ssh_exit_process
};


/* libssh's own set-up, once a process */

static ngx_int_t
ngx_http_hermes_ssh_init_process(ngx_cycle_t *cycle)
{
    if (ssh_init() != SSH_OK) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, 0,
                      "hermes: ssh_init() failed");
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* hermes_backend ssh's own parameters */

static void *
ngx_http_hermes_ssh_create_conf(ngx_conf_t *cf)
{
    ngx_http_hermes_ssh_conf_t  *scf;

    scf = ngx_pcalloc(cf->pool, sizeof(ngx_http_hermes_ssh_conf_t));
    if (scf == NULL) {
        return NULL;
    }

    scf->hosts = ngx_array_create(cf->pool, 2,
                                  sizeof(ngx_http_hermes_ssh_host_t *));
    if (scf->hosts == NULL) {
        return NULL;
    }

    scf->connect_timeout = 10000;

    return scf;
}


/*
 * host=HOST[:PORT] (one or more) user=NAME identity=FILE known_hosts=FILE
 * [connect_timeout=TIME].  NGX_DECLINED: not one of its parameters.
 */

static ngx_int_t
ngx_http_hermes_ssh_parse(ngx_conf_t *cf, void *conf, ngx_str_t *param)
{
    ngx_http_hermes_ssh_conf_t *scf = conf;

    u_char                        *p, *host;
    ngx_int_t                      port;
    ngx_str_t                      name, v, *s;
    ngx_http_hermes_ssh_host_t   **h;
    ngx_http_hermes_ssh_string_t  *sp;

    if (ngx_strncmp(param->data, "host=", 5) == 0) {
        name.data = param->data + 5;
        name.len = param->len - 5;

        p = ngx_strlchr(name.data, name.data + name.len, ':');
        port = 22;

        if (p) {
            port = ngx_atoi(p + 1, name.data + name.len - p - 1);
            if (port < 1 || port > 65535) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid hermes_backend host \"%V\": "
                                   "bad port", &name);
                return NGX_ERROR;
            }
        }

        v.data = name.data;
        v.len = (p ? p : name.data + name.len) - name.data;

        if (v.len == 0 || scf->hosts->nelts == NGX_HTTP_HERMES_HOSTS) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid hermes_backend host \"%V\"", &name);
            return NGX_ERROR;
        }

        host = ngx_pnalloc(cf->pool, v.len + 1);
        if (host == NULL) {
            return NGX_ERROR;
        }

        ngx_memcpy(host, v.data, v.len);
        host[v.len] = '\0';

        h = ngx_array_push(scf->hosts);
        if (h == NULL) {
            return NGX_ERROR;
        }

        *h = ngx_http_hermes_ssh_host_create(cf->pool, &v, host, port);
        if (*h == NULL) {
            return NGX_ERROR;
        }

        return NGX_OK;
    }

    for (sp = ngx_http_hermes_ssh_strings; sp->name.len; sp++) {
        if (param->len >= sp->name.len
            && ngx_strncmp(param->data, sp->name.data, sp->name.len) == 0)
        {
            s = (ngx_str_t *) ((char *) scf + sp->offset);
            s->data = param->data + sp->name.len;
            s->len = param->len - sp->name.len;
            return NGX_OK;
        }
    }

    if (ngx_strncmp(param->data, "connect_timeout=", 16) == 0) {
        v.data = param->data + 16;
        v.len = param->len - 16;

        scf->connect_timeout = ngx_parse_time(&v, 0);

        if (scf->connect_timeout == (ngx_msec_t) NGX_ERROR
            || scf->connect_timeout < 1000)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid hermes_backend connect_timeout "
                               "\"%V\": a time of at least 1s expected", &v);
            return NGX_ERROR;
        }

        return NGX_OK;
    }

    return NGX_DECLINED;
}


/* what it needs, the key files readable now (a typo fails nginx -t), the tag */

static char *
ngx_http_hermes_ssh_init_conf(ngx_conf_t *cf,
    ngx_http_hermes_backend_conf_t *bcf)
{
    char                        *why;
    u_char                      *p;
    ngx_str_t                    v;
    ngx_uint_t                   i;
    ngx_file_info_t              fi;
    ngx_http_hermes_ssh_conf_t  *scf;

    scf = bcf->data;

    if (scf->hosts->nelts == 0 || scf->user.len == 0
        || scf->identity.len == 0 || scf->known_hosts.len == 0)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "hermes_backend ssh needs host=, user=, "
                           "identity= and known_hosts=");
        return NGX_CONF_ERROR;
    }

    if (ngx_file_info(scf->identity.data, &fi) == NGX_FILE_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           "hermes_backend identity \"%V\"", &scf->identity);
        return NGX_CONF_ERROR;
    }

    if (ngx_file_info(scf->known_hosts.data, &fi) == NGX_FILE_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           "hermes_backend known_hosts \"%V\"",
                           &scf->known_hosts);
        return NGX_CONF_ERROR;
    }

    why = ngx_http_hermes_ssh_check_files(&scf->identity, &scf->known_hosts);
    if (why) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "hermes_backend identity \"%V\", known_hosts "
                           "\"%V\": %s", &scf->identity, &scf->known_hosts,
                           why);
        return NGX_CONF_ERROR;
    }

    bcf->nhosts = scf->hosts->nelts;

    /* the tag: every argument that makes this a different place */

    p = ngx_pnalloc(cf->pool, 1024);
    if (p == NULL) {
        return NGX_CONF_ERROR;
    }

    v.data = p;
    p = ngx_slprintf(p, v.data + 1024, "ssh %V@%V", &scf->user, &bcf->root);

    for (i = 0; i < scf->hosts->nelts; i++) {
        p = ngx_slprintf(p, v.data + 1024, " %V",
                         ngx_http_hermes_ssh_host_name(bcf, i));
    }

    v.len = p - v.data;

    ngx_http_hermes_backend_tag(bcf, &v);

    return NGX_CONF_OK;
}


static ngx_http_hermes_ssh_host_t *
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

    hosts = ngx_http_hermes_ssh_conf(bcf)->hosts->elts;

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

    hosts = ngx_http_hermes_ssh_conf(bcf)->hosts->elts;
    best = NGX_CONF_UNSET_UINT;

    for (i = 0; i < ngx_http_hermes_ssh_conf(bcf)->hosts->nelts; i++) {

        /* the link's thread found the host away */

        if (hosts[i]->link && hosts[i]->link->down && !hosts[i]->failed) {
            hosts[i]->failed = 1;
            hosts[i]->failed_at = ngx_current_msec;
        }

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

        for (i = 1; i < ngx_http_hermes_ssh_conf(bcf)->hosts->nelts; i++) {
            if (hosts[i]->failed_at < hosts[best]->failed_at) {
                best = i;
            }
        }
    }

    return best;
}


/* event loop: the host's link for a task, made on first use */

static void
ngx_http_hermes_ssh_take(ngx_http_hermes_conn_t *conn)
{
    ngx_http_hermes_ssh_host_t  **hosts;

    hosts = ngx_http_hermes_ssh_conf(conn->bcf)->hosts->elts;

    conn->data = ngx_http_hermes_ssh_link_get(conn->bcf, hosts[conn->host]);
}


/* event loop: the task is done; what it learnt of the host */

static void
ngx_http_hermes_ssh_give(ngx_http_hermes_conn_t *conn)
{
    ngx_http_hermes_ssh_link_t   *l;
    ngx_http_hermes_ssh_host_t  **hosts, *h;

    hosts = ngx_http_hermes_ssh_conf(conn->bcf)->hosts->elts;
    h = hosts[conn->host];
    l = conn->data;

    if (conn->unavailable) {
        h->failed = 1;
        h->failed_at = ngx_current_msec;

    } else {
        /* it answered, or a chore's failure is not to be held against it */
        h->failed = 0;

        if (l) {
            l->down = 0;
        }
    }

    conn->data = NULL;
}


static ngx_http_hermes_ssh_link_t *
ngx_http_hermes_ssh_link_get(ngx_http_hermes_backend_conf_t *bcf,
    ngx_http_hermes_ssh_host_t *h)
{
    int                          err;
    sigset_t                     set, old;
    ngx_http_hermes_ssh_link_t  *l;

    if (h->link) {
        return h->link;
    }

    l = ngx_calloc(sizeof(ngx_http_hermes_ssh_link_t), ngx_cycle->log);
    if (l == NULL) {
        return NULL;
    }

    l->bcf = bcf;
    l->scf = bcf->data;
    l->h = h;
    l->log = ngx_cycle->log;
    l->next = 1;
    ngx_queue_init(&l->posted);
    ngx_queue_init(&l->streams);

    l->wake = eventfd(0, EFD_CLOEXEC|EFD_NONBLOCK);
    if (l->wake == -1) {
        ngx_log_error(NGX_LOG_ALERT, ngx_cycle->log, ngx_errno,
                      "hermes: eventfd() failed");
        ngx_free(l);
        return NULL;
    }

    if (pthread_mutex_init(&l->mutex, NULL) != 0) {
        goto failed;
    }

    if (pthread_cond_init(&l->cond, NULL) != 0) {
        pthread_mutex_destroy(&l->mutex);
        goto failed;
    }

    /* no signal is the I/O thread's: the worker's handlers get them */

    sigfillset(&set);
    (void) pthread_sigmask(SIG_SETMASK, &set, &old);

    err = pthread_create(&l->thread, NULL, ngx_http_hermes_ssh_thread, l);

    (void) pthread_sigmask(SIG_SETMASK, &old, NULL);

    if (err != 0) {
        ngx_log_error(NGX_LOG_ALERT, ngx_cycle->log, err,
                      "hermes: pthread_create() failed");
        pthread_cond_destroy(&l->cond);
        pthread_mutex_destroy(&l->mutex);
        goto failed;
    }

    h->link = l;

    return l;

failed:

    (void) close(l->wake);
    ngx_free(l);

    return NULL;
}


static void
ngx_http_hermes_ssh_post(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_ssh_stream_t *s)
{
    uint64_t  one;

    if (s) {
        pthread_mutex_lock(&l->mutex);
        ngx_queue_insert_tail(&l->posted, &s->queue);
        pthread_mutex_unlock(&l->mutex);
    }

    one = 1;

    if (write(l->wake, &one, sizeof(one)) == -1) {
        /* EAGAIN: the counter is full, the thread is woken anyway */
    }
}


static void
ngx_http_hermes_ssh_exit_process(ngx_http_hermes_backend_conf_t *bcf)
{
    ngx_uint_t                    i;
    ngx_http_hermes_ssh_link_t   *l;
    ngx_http_hermes_ssh_host_t  **hosts;

    hosts = ngx_http_hermes_ssh_conf(bcf)->hosts->elts;

    for (i = 0; i < ngx_http_hermes_ssh_conf(bcf)->hosts->nelts; i++) {
        l = hosts[i]->link;
        if (l == NULL) {
            continue;
        }

        pthread_mutex_lock(&l->mutex);
        l->quit = 1;
        pthread_mutex_unlock(&l->mutex);

        ngx_http_hermes_ssh_post(l, NULL);

        (void) pthread_join(l->thread, NULL);

        pthread_cond_destroy(&l->cond);
        pthread_mutex_destroy(&l->mutex);
        (void) close(l->wake);

        hosts[i]->link = NULL;
        ngx_free(l);
    }
}


/*
 * Thread pool: one command on the host, its payload on stdin, its stdout
 * and stderr captured, as an EXEC on the link's agent.  NGX_DECLINED when
 * the host could not be reached (nothing ran).
 */

static ngx_int_t
ngx_http_hermes_ssh_exec(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_cmd_t *cmd)
{
    u_char                        *p;
    size_t                         len, size;
    ngx_uint_t                     i, native;
    ngx_http_hermes_ssh_stream_t  *s;
#if (NGX_DEBUG)
    u_char                         text[NGX_MAX_ERROR_STR];
#endif

    static u_char                  merge[] = "exec 2>&1\n";

    cmd->status = -1;
    cmd->out_len = 0;
    cmd->err = 0;

    if (conn->data == NULL) {
        return ngx_http_hermes_ssh_request(conn, NULL, cmd);
    }

    /*
     * The kernel script's "dir" and "ship" the agent does itself: a new
     * session's directory and files then wait on no process.  Else
     * stderr goes where stdout goes: a step's message.
     */

    native = ngx_http_hermes_cmd_is_step(cmd);

    len = native ? 0 : sizeof(merge) - 1 + ngx_strlen(cmd->cmd);
    size = NGX_HTTP_HERMES_FRAME_EXEC_MAX + 6 * len + cmd->in_len;

    for (i = 0; cmd->args && cmd->args[i]; i++) {
        size += 6 * ngx_strlen(cmd->args[i]) + 3;
    }

    s = ngx_calloc(sizeof(ngx_http_hermes_ssh_stream_t) + len + size,
                   ngx_cycle->log);
    if (s == NULL) {
        ngx_snprintf(conn->err, sizeof(conn->err), "out of memory%Z");
        return NGX_ERROR;
    }

    p = (u_char *) (s + 1);

    if (!native) {
        ngx_memcpy(ngx_cpymem(p, merge, sizeof(merge) - 1), cmd->cmd,
                   len - (sizeof(merge) - 1));
    }

    s->frame = p + len;
    s->frame_len = ngx_cpymem(ngx_http_hermes_frames_exec(s->frame, 0,
                                                          native ? NULL : p,
                                                          len,
                                                          cmd->args,
                                                          cmd->timeout,
                                                          cmd->out_size,
                                                          cmd->in_len),
                              cmd->in, cmd->in_len)
                   - s->frame;

    if (s->frame_len - NGX_HTTP_HERMES_FRAME_HEADER
        > NGX_HTTP_HERMES_FRAME_MAX)
    {
        ngx_free(s);
        ngx_snprintf(conn->err, sizeof(conn->err), "command too long%Z");
        return NGX_ERROR;
    }

#if (NGX_DEBUG)

    /* what runs on the host; payloads, the token too, go on stdin */

    if (ngx_cycle->log->log_level & NGX_LOG_DEBUG_HTTP) {
        *ngx_http_hermes_cmd_text(text, text + sizeof(text) - 1, cmd) = '\0';

        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                       "hermes: ssh exec on %V: %s",
                       &((ngx_http_hermes_ssh_link_t *) conn->data)->h->name,
                       text);
    }

#endif

    return ngx_http_hermes_ssh_request(conn, s, cmd);
}


/*
 * Thread pool: a stream whose first frame is an EXEC or a READY, to the
 * link's I/O thread, which answers it by its deadline with the agent's x
 * (or the link's failure) in "cmd".  "s" is the I/O thread's from here on.
 * NGX_DECLINED: no link, or it failed before the agent took the frame:
 * the host cannot be reached, nothing ran.
 */

static ngx_int_t
ngx_http_hermes_ssh_request(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_ssh_stream_t *s, ngx_http_hermes_cmd_t *cmd)
{
    ngx_uint_t                   quit;
    ngx_http_hermes_ssh_link_t  *l;
    ngx_http_hermes_ssh_exec_t   x;

    cmd->status = -1;
    cmd->out_len = 0;
    cmd->err = 0;

    l = conn->data;

    /* s is NULL where there is no link: the callers' way to this error */

    if (l == NULL || s == NULL) {
        ngx_free(s);
        ngx_snprintf(conn->err, sizeof(conn->err), "no ssh link%Z");
        conn->unavailable = 1;
        return NGX_DECLINED;
    }

    s->fd = -1;
    s->rfd = (ngx_socket_t) -1;
    /* cppcheck-suppress autoVariables ; x is ours until x.done, below */
    s->exec = &x;
    s->deadline = ngx_http_hermes_ssh_now() + cmd->timeout
                  + ngx_http_hermes_ssh_conf(conn->bcf)->connect_timeout
                  + NGX_HTTP_HERMES_SSH_EXEC_SLACK;

    x.conn = conn;
    x.cmd = cmd;
    x.rc = NGX_ERROR;
    x.done = 0;

    /* once the I/O thread was told to quit, it takes nothing more */

    pthread_mutex_lock(&l->mutex);

    quit = l->quit;

    if (!quit) {
        ngx_queue_insert_tail(&l->posted, &s->queue);
    }

    pthread_mutex_unlock(&l->mutex);

    if (quit) {
        ngx_free(s);
        ngx_snprintf(conn->err, sizeof(conn->err), "the worker exits%Z");
        return NGX_ERROR;
    }

    ngx_http_hermes_ssh_post(l, NULL);

    /* the I/O thread answers every EXEC by its deadline */

    pthread_mutex_lock(&l->mutex);

    while (!x.done) {
        pthread_cond_wait(&l->cond, &l->mutex);
    }

    pthread_mutex_unlock(&l->mutex);

    return x.rc;
}


/*
 * Thread pool: the runner says "ready" with its pid, and /proc tells the
 * pid's start time, in one READY of the agent: woken by inotify and the
 * pid's pidfd on the host, not a shell polling every 10 ms.  NGX_DECLINED:
 * the host cannot be reached.
 */

static ngx_int_t
ngx_http_hermes_ssh_ready(ngx_http_hermes_conn_t *conn, u_char *dir,
    ngx_pid_t pid, ngx_pid_t expect, uint64_t *start)
{
    u_char                        *p;
    size_t                         len;
    u_char                         out[1024];
    ngx_int_t                      rc;
    ngx_http_hermes_cmd_t          c;
    ngx_http_hermes_ssh_stream_t  *s;

    ngx_memzero(&c, sizeof(ngx_http_hermes_cmd_t));

    c.out = out;
    c.out_size = sizeof(out) - 1;
    c.timeout = 10000;              /* the runner's start: 10 s at most */

    s = NULL;

    if (conn->data) {
        len = ngx_strlen(dir);

        s = ngx_calloc(sizeof(ngx_http_hermes_ssh_stream_t)
                       + NGX_HTTP_HERMES_FRAME_EXEC_MAX + 6 * len,
                       ngx_cycle->log);
        if (s == NULL) {
            ngx_snprintf(conn->err, sizeof(conn->err), "out of memory%Z");
            return NGX_ERROR;
        }

        s->frame = (u_char *) (s + 1);
        s->frame_len = ngx_http_hermes_frames_ready(s->frame, 0, dir, len,
                                                    pid, c.timeout)
                       - s->frame;
    }

    rc = ngx_http_hermes_ssh_request(conn, s, &c);

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


/*
 * Event loop: cell "cell" of a kernel on an ssh host interrupted by an
 * INTERRUPT frame to the host's agent: no command, no thread-pool slot;
 * the agent writes "N\n" into the kernel's intr FIFO (never through a
 * link, never waiting) if the directory is still the kernel's inode.
 * NGX_DECLINED: its host is not one of the backend's any more.
 */

static ngx_int_t
ngx_http_hermes_ssh_interrupt(ngx_http_hermes_backend_conf_t *bcf,
    ngx_http_hermes_victim_t *v, uint32_t cell, ngx_log_t *log)
{
    ngx_http_hermes_ssh_link_t    *l;
    ngx_http_hermes_ssh_host_t   **hosts;
    ngx_http_hermes_ssh_stream_t  *s;

    if (v->host >= ngx_http_hermes_ssh_conf(bcf)->hosts->nelts) {
        return NGX_DECLINED;
    }

    hosts = ngx_http_hermes_ssh_conf(bcf)->hosts->elts;

    l = ngx_http_hermes_ssh_link_get(bcf, hosts[v->host]);
    if (l == NULL) {
        return NGX_ERROR;
    }

    s = ngx_calloc(sizeof(ngx_http_hermes_ssh_stream_t)
                   + NGX_HTTP_HERMES_FRAME_EXEC_MAX + 6 * v->dir_len, log);
    if (s == NULL) {
        return NGX_ERROR;
    }

    s->fd = -1;
    s->rfd = (ngx_socket_t) -1;
    s->note = 1;

    s->frame = (u_char *) (s + 1);
    s->frame_len = ngx_http_hermes_frames_interrupt(s->frame, 0, v->dir,
                                                    v->dir_len, v->ino, cell)
                   - s->frame;

    ngx_http_hermes_ssh_post(l, s);

    return NGX_OK;
}


/* kernels never run as root: a root login drops to the sandbox's user */

static ngx_uint_t
ngx_http_hermes_ssh_root(ngx_http_hermes_backend_conf_t *bcf)
{
    ngx_http_hermes_ssh_conf_t  *scf;

    scf = bcf->data;

    return scf->user.len == 4 && ngx_strncmp(scf->user.data, "root", 4) == 0;
}


/*
 * Event loop: relay cell "id" of the kernel "ref" into fd, for at most
 * "timeout" ms (the cell's): no more than "out_limit" bytes of cell_out
 * and a result of "res_limit" bytes at most.  "offset" -1 ships the
 * request first; another offset streams a shipped cell again from there.
 * The link's I/O thread owns
 * the fd and a copy of the request from here on, and closes the fd once
 * the cell is relayed, or ended.
 */

ngx_int_t
ngx_http_hermes_ssh_relay(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_kernel_ref_t *ref, off_t out_limit, off_t res_limit,
    ngx_msec_t timeout, u_char *req, size_t req_len, off_t offset,
    ngx_socket_t fd, ngx_socket_t rpc_fd, ngx_log_t *log)
{
    u_char                        *p;
    ngx_http_hermes_ssh_link_t    *l;
    ngx_http_hermes_ssh_stream_t  *s;

    l = conn->data;

    if (l == NULL || ref->dir_len >= NGX_HTTP_HERMES_DIR_MAX) {
        return NGX_ERROR;
    }

    if (NGX_HTTP_HERMES_FRAME_CELL_MAX + req_len
        > NGX_HTTP_HERMES_FRAME_MAX + NGX_HTTP_HERMES_FRAME_HEADER)
    {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "hermes: cell %uD is too big for a frame (%uz bytes)",
                      ref->cell_id, req_len);
        return NGX_ERROR;
    }

    s = ngx_calloc(sizeof(ngx_http_hermes_ssh_stream_t)
                   + NGX_HTTP_HERMES_FRAME_CELL_MAX + req_len, log);
    if (s == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(s->dir, ref->dir, ref->dir_len);
    s->dir[ref->dir_len] = '\0';

    s->cell.dir = s->dir;
    s->cell.cell = ref->cell_id;
    s->cell.pid = ref->pid;
    s->cell.start = ref->start;
    s->cell.ino = ref->ino;
    s->cell.uid = ref->uid;
    s->cell.offset = -1;
    s->cell.out_limit = out_limit;
    s->cell.res_limit = res_limit;
    s->cell.window = NGX_HTTP_HERMES_SSH_WINDOW;
    s->cell.req_len = req_len;

    s->frame = (u_char *) (s + 1);
    p = ngx_http_hermes_frames_cell(s->frame, 0, &s->cell);
    s->frame_len = ngx_cpymem(p, req, req_len) - s->frame;

    s->fd = fd;
    s->rfd = rpc_fd;

    if (offset >= 0) {
        /* a shipped cell's stream again, from "offset": as on a resume */
        s->shipped = 1;
        s->hdr = 2;
        s->recvd = offset;
        s->taken = offset;
        s->acked = offset;
    }

    /* before the cell's timer fires, which is set just after this */
    s->deadline = ngx_http_hermes_ssh_now() + timeout
                  - ngx_min(timeout, NGX_HTTP_HERMES_SSH_MARGIN);

    ngx_http_hermes_ssh_post(l, s);

    return NGX_OK;
}


/*
 * The I/O thread of a link: the only one that calls libssh for it.  It
 * sleeps in poll() over the eventfd, the connection's socket and the
 * cells' socketpairs, and moves frames between them.
 */

static void *
ngx_http_hermes_ssh_thread(void *data)
{
    ngx_http_hermes_ssh_link_t *l = data;

    ngx_uint_t  nfd;
    ngx_msec_t  now, next;

    while (ngx_http_hermes_ssh_posted(l) == NGX_OK) {

        now = ngx_http_hermes_ssh_start_streams(l);
        next = ngx_http_hermes_ssh_deadlines(l, now);

        if (l->broken) {
            ngx_http_hermes_ssh_break(l, now);
            continue;
        }

        nfd = ngx_http_hermes_ssh_poll(l, next);

        if (nfd) {
            ngx_http_hermes_ssh_io(l, nfd);
        }
    }

    ngx_http_hermes_ssh_quit(l);

    return NULL;
}


/* what other threads posted, taken; NGX_DONE: the worker exits */

static ngx_int_t
ngx_http_hermes_ssh_posted(ngx_http_hermes_ssh_link_t *l)
{
    ngx_uint_t                     quit;
    ngx_queue_t                   *q;
    ngx_http_hermes_ssh_stream_t  *s;

    pthread_mutex_lock(&l->mutex);

    quit = l->quit;

    while (!ngx_queue_empty(&l->posted)) {
        q = ngx_queue_head(&l->posted);
        ngx_queue_remove(q);

        s = ngx_queue_data(q, ngx_http_hermes_ssh_stream_t, queue);

        if (s->note && ngx_http_hermes_ssh_noted(l, s)) {
            ngx_free(s);
            continue;
        }

        s->id = l->next++;

        if (l->next == 0) {
            l->next = 1;
        }

        ngx_queue_insert_tail(&l->streams, q);
        l->nstreams++;
    }

    pthread_mutex_unlock(&l->mutex);

    return quit ? NGX_DONE : NGX_OK;
}


/*
 * New streams go out at once; without an agent, one is started (at once
 * for those that asked, after the back-off for those to resume).  The
 * time after it all.
 */

static ngx_msec_t
ngx_http_hermes_ssh_start_streams(ngx_http_hermes_ssh_link_t *l)
{
    ngx_uint_t                     urgent;
    ngx_msec_t                     now;
    ngx_queue_t                   *q, *nq;
    ngx_http_hermes_ssh_stream_t  *s;

    urgent = 0;

    for (q = ngx_queue_head(&l->streams);
         q != ngx_queue_sentinel(&l->streams);
         q = nq)
    {
        nq = ngx_queue_next(q);
        s = ngx_queue_data(q, ngx_http_hermes_ssh_stream_t, queue);

        if (s->sent || s->ended) {
            continue;
        }

        if (l->ready) {
            /* a shipped one: a resume (a client's, or after a break) */
            ngx_http_hermes_ssh_send(l, s);

        } else if (s->exec || !s->shipped) {
            /* shipped ones wait for the link's own retry */
            urgent = 1;
        }
    }

    now = ngx_http_hermes_ssh_now();

    if (l->session == NULL && !ngx_queue_empty(&l->streams)
        && (urgent || (ngx_msec_int_t) (now - l->retry) >= 0))
    {
        ngx_http_hermes_ssh_start(l, urgent);
        now = ngx_http_hermes_ssh_now();
    }

    if (l->session && !l->ready
        && now - l->started >= NGX_HTTP_HERMES_SSH_START)
    {
        l->broken = "the agent did not start in time";
    }

    if (l->ready && l->pinged
        && now - l->pinged >= l->scf->connect_timeout)
    {
        l->broken = "no answer to a ping";
    }

    return now;
}


/*
 * Deadlines: commands past theirs fail, cells whose host stays away past
 * theirs hear so, a quiet connection is pinged; the poll sleeps until the
 * nearest (the ms returned).
 */

static ngx_msec_t
ngx_http_hermes_ssh_deadlines(ngx_http_hermes_ssh_link_t *l, ngx_msec_t now)
{
    u_char                        *p;
    ngx_msec_t                     next, left;
    ngx_queue_t                   *q, *nq;
    ngx_http_hermes_ssh_stream_t  *s;
    u_char                         ping[NGX_HTTP_HERMES_FRAME_HEADER];

    next = NGX_TIMER_INFINITE;

    if (l->session == NULL && !ngx_queue_empty(&l->streams)) {
        next = ((ngx_msec_int_t) (l->retry - now) > 0) ? l->retry - now
                                                       : 0;
    }

    if (l->session && !l->ready) {
        left = (now - l->started < NGX_HTTP_HERMES_SSH_START)
               ? l->started + NGX_HTTP_HERMES_SSH_START - now : 0;
        next = ngx_min(next, left);
    }

    if (l->ready && !ngx_queue_empty(&l->streams) && !l->broken) {
        if (l->pinged == 0
            && now - l->heard >= NGX_HTTP_HERMES_SSH_QUIET)
        {
            p = ngx_http_hermes_frames_header(ping, 0, 'P', 0);
            (void) ngx_http_hermes_ssh_append(l, ping, p - ping);
            l->pinged = now;
        }

        left = l->pinged
               ? l->pinged + l->scf->connect_timeout - now
               : l->heard + NGX_HTTP_HERMES_SSH_QUIET - now;
        next = ngx_min(next, left);
    }

    for (q = ngx_queue_head(&l->streams);
         q != ngx_queue_sentinel(&l->streams);
         q = nq)
    {
        nq = ngx_queue_next(q);
        s = ngx_queue_data(q, ngx_http_hermes_ssh_stream_t, queue);

        if (s->exec) {
            if ((ngx_msec_int_t) (now - s->deadline) >= 0) {
                s->exec->cmd->err = NGX_ETIMEDOUT;
                ngx_snprintf(s->exec->conn->err,
                             sizeof(s->exec->conn->err),
                             "ssh command timed out%Z");
                ngx_http_hermes_ssh_exec_done(l, s, NGX_ERROR);
                continue;
            }

            next = ngx_min(next, s->deadline - now);
            continue;
        }

        if (s->sent || !s->shipped || s->ended) {
            /* the cell's own timer ends it */
            continue;
        }

        if ((ngx_msec_int_t) (now - s->deadline) >= 0) {
            ngx_http_hermes_ssh_give_up(l, s, now);
            continue;
        }

        next = ngx_min(next, s->deadline - now);
    }

    return next;
}


/*
 * The poll set (the eventfd, the connection, the cells and their tool
 * calls), slept on until something comes or "next" ms pass; the number of
 * its entries, 0 when there was no memory for it.
 */

static ngx_uint_t
ngx_http_hermes_ssh_poll(ngx_http_hermes_ssh_link_t *l, ngx_msec_t next)
{
    int                            timeout, events;
    uint64_t                       v;
    ngx_uint_t                     nfd, size;
    ngx_queue_t                   *q;
    struct pollfd                 *pfd;
    ngx_http_hermes_ssh_stream_t  *s, **pfs;

    size = 2 + 2 * l->nstreams;

    if (l->npfd < size) {
        size = ngx_max(size, 2 * l->npfd);

        pfd = ngx_alloc(size * sizeof(struct pollfd), l->log);
        pfs = ngx_alloc(size * sizeof(ngx_http_hermes_ssh_stream_t *),
                        l->log);

        if (pfd == NULL || pfs == NULL) {
            ngx_free(pfd);
            ngx_free(pfs);
            (void) poll(NULL, 0, 100);
            return 0;
        }

        ngx_free(l->pfd);
        ngx_free(l->pfs);
        l->pfd = pfd;
        l->pfs = pfs;
        l->npfd = size;
    }

    pfd = l->pfd;
    pfs = l->pfs;

    pfd[0].fd = l->wake;
    pfd[0].events = POLLIN;
    pfd[0].revents = 0;

    pfd[1].fd = -1;
    pfd[1].events = 0;
    pfd[1].revents = 0;

    if (l->session) {
        pfd[1].fd = ssh_get_fd(l->session);
        pfd[1].events = POLLIN;

        if ((ssh_get_poll_flags(l->session) & SSH_WRITE_PENDING)
            || l->out_pos < l->out_len)
        {
            pfd[1].events |= POLLOUT;
        }

        /*
         * what libssh holds already is not on the socket; stdout last:
         * polling stderr may read packets of stdout into libssh's
         * buffer, and the reverse costs a complaint's delay only
         */

        if (ssh_channel_poll(l->channel, 1) != 0
            || ssh_channel_poll(l->channel, 0) != 0)
        {
            next = 0;
        }
    }

    nfd = 2;

    for (q = ngx_queue_head(&l->streams);
         q != ngx_queue_sentinel(&l->streams);
         q = ngx_queue_next(q))
    {
        s = ngx_queue_data(q, ngx_http_hermes_ssh_stream_t, queue);

        if (s->exec || s->note) {
            /* no fd; a note is freed once sent, HELLO may send it below */
            continue;
        }

        events = (s->hdr || s->out_pos < s->out_len || s->res)
                 ? POLLOUT : POLLIN;

        pfs[nfd] = s;
        pfd[nfd].fd = s->fd;
        pfd[nfd].events = events;
        pfd[nfd].revents = 0;
        nfd++;

        if (s->rfd != (ngx_socket_t) -1) {
            pfs[nfd] = NULL;
            pfd[nfd].fd = s->rfd;
            pfd[nfd].events = POLLIN
                              | (s->rq_pos < s->rq_len ? POLLOUT : 0);
            pfd[nfd].revents = 0;
            nfd++;
        }
    }

    timeout = (next == NGX_TIMER_INFINITE) ? -1 : (int) next;

    if (poll(pfd, nfd, timeout) == -1 && ngx_errno != NGX_EINTR) {
        ngx_log_error(NGX_LOG_ALERT, l->log, ngx_errno,
                      "hermes: poll() failed");
        (void) poll(NULL, 0, 100);
    }

    if (pfd[0].revents && read(l->wake, &v, sizeof(v)) == -1) {
        /* EAGAIN: another read took it */
    }

    return nfd;
}


/* what came: from the agent, for each cell, then what goes out */

static void
ngx_http_hermes_ssh_io(ngx_http_hermes_ssh_link_t *l, ngx_uint_t nfd)
{
    ngx_uint_t                     i;
    struct pollfd                 *pfd;
    ngx_http_hermes_ssh_stream_t  *s, **pfs;

    pfd = l->pfd;
    pfs = l->pfs;

    if (l->session) {
        ngx_http_hermes_ssh_read(l);
    }

    /* each cell: what came for it, or its end going away */

    for (i = 2; i < nfd; i++) {
        s = pfs[i];

        if (s == NULL) {
            continue;       /* the rpc of the stream before */
        }

        if (s->rfd != (ngx_socket_t) -1 && i + 1 < nfd
            && pfs[i + 1] == NULL && pfd[i + 1].revents)
        {
            ngx_http_hermes_ssh_rpc_io(l, s);
        }

        if (pfd[i].revents
            || s->hdr || s->out_pos < s->out_len || s->res)
        {
            (void) ngx_http_hermes_ssh_cell_write(l, s);
        }
    }

    if (l->session && !l->broken) {
        ngx_http_hermes_ssh_flush(l);
    }

    if (l->broken) {
        ngx_http_hermes_ssh_break(l, ngx_http_hermes_ssh_now());
    }
}


/* the worker exits: every stream ends here, and the connection */

static void
ngx_http_hermes_ssh_quit(ngx_http_hermes_ssh_link_t *l)
{
    ngx_queue_t                   *q;
    ngx_http_hermes_ssh_stream_t  *s;

    while (!ngx_queue_empty(&l->streams)) {
        q = ngx_queue_head(&l->streams);
        s = ngx_queue_data(q, ngx_http_hermes_ssh_stream_t, queue);

        if (s->exec) {
            ngx_snprintf(s->exec->conn->err, sizeof(s->exec->conn->err),
                         "the worker exits%Z");
            ngx_http_hermes_ssh_exec_done(l, s, NGX_ERROR);

        } else {
            ngx_http_hermes_ssh_end(l, s, 0);
        }
    }

    if (l->session) {
        /* EOF on its stdin: the agent exits */
        (void) ssh_channel_send_eof(l->channel);
        ssh_channel_free(l->channel);
        ssh_disconnect(l->session);
        ssh_free(l->session);
    }

    ngx_free(l->in);
    ngx_free(l->out);
    ngx_free(l->pfd);
    ngx_free(l->pfs);
}


/*
 * Connect and start the agent; when the host cannot be reached, the
 * streams not yet shipped hear it at once (urgent: they asked for it),
 * those to resume wait, backing off.
 */

static void
ngx_http_hermes_ssh_start(ngx_http_hermes_ssh_link_t *l, ngx_uint_t urgent)
{
    int                            n;
    size_t                         len;
    u_char                        *p;
    ngx_msec_t                     now, timeout, left;
    ngx_queue_t                   *q, *nq;
    ngx_http_hermes_ssh_stream_t  *s;
    ngx_http_hermes_remote_file_t *rf;
    u_char                         head[NGX_INT64_LEN + 2];

    now = ngx_http_hermes_ssh_now();
    timeout = l->scf->connect_timeout;

    if (!urgent) {
        /* no longer than the first cell waiting to resume may wait */

        for (q = ngx_queue_head(&l->streams);
             q != ngx_queue_sentinel(&l->streams);
             q = ngx_queue_next(q))
        {
            s = ngx_queue_data(q, ngx_http_hermes_ssh_stream_t, queue);

            if (s->exec == NULL && s->shipped && !s->ended) {
                left = (ngx_msec_int_t) (s->deadline - now) > 100
                       ? s->deadline - now : 100;
                timeout = ngx_min(timeout, left);
            }
        }
    }

    for (rf = ngx_http_hermes_remote_files; rf->len; rf++) {
        if (ngx_strcmp(rf->name.data, "hermes_agent.py") == 0) {
            break;
        }
    }

    if (rf->len == 0) {
        ngx_snprintf(l->err, sizeof(l->err),
                     "hermes_agent.py is not built in%Z");
        goto failed;
    }

    if (ngx_http_hermes_ssh_connect(l, timeout) != NGX_OK) {
        goto failed;
    }

    l->channel = ssh_channel_new(l->session);

    if (l->channel == NULL
        || ssh_channel_open_session(l->channel) != SSH_OK
        || ssh_channel_request_exec(l->channel,
                                    "exec python3 -I -c '"
                                    NGX_HTTP_HERMES_SSH_LOADER "'")
           != SSH_OK)
    {
        ngx_snprintf(l->err, sizeof(l->err), "ssh channel: %s%Z",
                     ssh_get_error(l->session));
        goto close;
    }

    /* the agent's text: the frames wait for its HELLO */

    p = ngx_sprintf(head, "%uz\n", rf->len);

    if (ssh_channel_write(l->channel, head, p - head) != p - head) {
        goto write_failed;
    }

    for (len = 0; len < rf->len; len += n) {
        n = ssh_channel_write(l->channel, (u_char *) rf->data + len,
                              rf->len - len);
        if (n <= 0) {
            goto write_failed;
        }
    }

    ssh_set_blocking(l->session, 0);

    l->started = ngx_http_hermes_ssh_now();
    l->ready = 0;
    l->magic = 0;
    l->junk = 0;
    l->in_len = 0;
    l->out_pos = 0;
    l->out_len = 0;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, l->log, 0,
                   "hermes: ssh link to %V: connected in %M ms",
                   &l->h->name, l->started - now);

    return;

write_failed:

    ngx_snprintf(l->err, sizeof(l->err), "ssh channel write: %s%Z",
                 ssh_get_error(l->session));

close:

    if (l->channel) {
        ssh_channel_free(l->channel);
        l->channel = NULL;
    }

    ssh_disconnect(l->session);
    ssh_free(l->session);
    l->session = NULL;

failed:

    l->down = 1;
    now = ngx_http_hermes_ssh_now();

    for (q = ngx_queue_head(&l->streams);
         q != ngx_queue_sentinel(&l->streams);
         q = nq)
    {
        nq = ngx_queue_next(q);
        s = ngx_queue_data(q, ngx_http_hermes_ssh_stream_t, queue);

        if (s->exec) {
            ngx_cpystrn(s->exec->conn->err, l->err,
                        sizeof(s->exec->conn->err));
            s->exec->conn->unavailable = 1;
            ngx_http_hermes_ssh_exec_done(l, s, NGX_DECLINED);
            continue;
        }

        if (!s->shipped) {
            /* EOF, and nothing said: the cell was not shipped */
            ngx_http_hermes_ssh_end(l, s, 0);
        }
    }

    if (l->delay == 0 && !ngx_queue_empty(&l->streams)) {
        ngx_log_error(NGX_LOG_WARN, l->log, 0,
                      "hermes: the kernel host %V cannot be reached: %s; "
                      "retrying", &l->h->name, l->err);
    }

    l->delay = l->delay ? ngx_min(l->delay * 2,
                                  NGX_HTTP_HERMES_SSH_BACKOFF_MAX)
                        : NGX_HTTP_HERMES_SSH_BACKOFF;
    l->retry = now + l->delay / 2
               + (ngx_msec_t) ngx_random() % (l->delay / 2 + 1);
}


/*
 * The connection or the agent went: EXECs on their way fail (they may
 * have run) with the host taken for away, so a spawn tries another host
 * and a kill is retried; cells not shipped hear so, shipped ones resume
 * on the next agent, after a back-off.
 */

static void
ngx_http_hermes_ssh_break(ngx_http_hermes_ssh_link_t *l, ngx_msec_t now)
{
    ngx_uint_t                     ready;
    ngx_queue_t                   *q, *nq;
    ngx_http_hermes_ssh_stream_t  *s;

    ready = l->ready;

    if (ready) {
        ngx_log_error(NGX_LOG_WARN, l->log, 0,
                      "hermes: the connection to the kernel host %V broke: "
                      "%s; reconnecting", &l->h->name, l->broken);

    } else {
        ngx_log_error(NGX_LOG_ERR, l->log, 0,
                      "hermes: the agent on the kernel host %V did not "
                      "start: %s", &l->h->name, l->broken);
    }

    ngx_snprintf(l->err, sizeof(l->err), "ssh channel failed: %s%Z",
                 l->broken);

    if (l->session) {
        ssh_channel_free(l->channel);
        l->channel = NULL;
        ssh_disconnect(l->session);
        ssh_free(l->session);
        l->session = NULL;
    }

    l->ready = 0;
    l->broken = NULL;
    l->in_len = 0;
    l->out_pos = 0;
    l->out_len = 0;

    if (ready) {
        /* the host answered until now */
        l->answered = now;
    }

    for (q = ngx_queue_head(&l->streams);
         q != ngx_queue_sentinel(&l->streams);
         q = nq)
    {
        nq = ngx_queue_next(q);
        s = ngx_queue_data(q, ngx_http_hermes_ssh_stream_t, queue);

        if (s->exec) {
            if (s->sent || !ready) {
                ngx_cpystrn(s->exec->conn->err, l->err,
                            sizeof(s->exec->conn->err));
                s->exec->conn->unavailable = 1;
                ngx_http_hermes_ssh_exec_done(l, s, ready ? NGX_ERROR
                                                          : NGX_DECLINED);
            }

            continue;
        }

        if (s->ended) {
            /* its result is here, to be written */
            continue;
        }

        if (!s->shipped && (s->sent || !ready)) {
            ngx_http_hermes_ssh_end(l, s, 0);
            continue;
        }

        s->sent = 0;
    }

    l->delay = l->delay ? ngx_min(l->delay * 2,
                                  NGX_HTTP_HERMES_SSH_BACKOFF_MAX)
                        : NGX_HTTP_HERMES_SSH_BACKOFF;
    l->retry = now + l->delay / 2
               + (ngx_msec_t) ngx_random() % (l->delay / 2 + 1);
}


/* what the agent wrote: its magic line, then frames */

static void
ngx_http_hermes_ssh_read(ngx_http_hermes_ssh_link_t *l)
{
    int                       n;
    u_char                   *p, *last, *b;
    size_t                    skip, size;
    ngx_int_t                 rc;
    ngx_http_hermes_frame_t   f;
    u_char                    err[512];

    while (!l->broken) {

        if (l->in_size - l->in_len < 16384) {
            size = l->in_size ? 2 * l->in_size : 65536;

            if (size > NGX_HTTP_HERMES_FRAME_MAX
                       + NGX_HTTP_HERMES_FRAME_HEADER + 65536)
            {
                size = NGX_HTTP_HERMES_FRAME_MAX
                       + NGX_HTTP_HERMES_FRAME_HEADER + 65536;
            }

            if (size <= l->in_size) {
                l->broken = "a frame too long";
                break;
            }

            b = ngx_alloc(size, l->log);
            if (b == NULL) {
                l->broken = "out of memory";
                break;
            }

            if (l->in) {
                ngx_memcpy(b, l->in, l->in_len);
                ngx_free(l->in);
            }

            l->in = b;
            l->in_size = size;
        }

        n = ssh_channel_read_nonblocking(l->channel, l->in + l->in_len,
                                         l->in_size - l->in_len, 0);

        if (n == SSH_EOF) {
            l->broken = "the agent exited";
            break;
        }

        if (n < 0) {
            l->broken = (char *) ssh_get_error(l->session);
            break;
        }

        if (n == 0) {
            break;
        }

        l->in_len += n;
        l->heard = ngx_http_hermes_ssh_now();
        l->pinged = 0;

        p = l->in;
        last = l->in + l->in_len;

        if (!l->magic) {
            /* what the login shell said before the agent ran */

            rc = ngx_http_hermes_frames_magic(p, last - p, &skip);

            l->junk += skip;
            p += skip;

            if (l->junk > NGX_HTTP_HERMES_SSH_JUNK) {
                l->broken = "no magic line from the agent";
                break;
            }

            l->magic = (rc == NGX_OK);
        }

        while (l->magic && !l->broken) {
            rc = ngx_http_hermes_frames_parse(p, last - p, &f);

            if (rc == NGX_ERROR) {
                l->broken = "a frame too long";
                break;
            }

            if (rc == NGX_AGAIN) {
                break;
            }

            ngx_log_debug3(NGX_LOG_DEBUG_HTTP, l->log, 0,
                           "hermes: ssh frame '%c' of stream %uD, %uD bytes",
                           f.type, f.stream, f.len);

            ngx_http_hermes_ssh_frame(l, &f);
            p += NGX_HTTP_HERMES_FRAME_HEADER + f.len;
        }

        l->in_len = last - p;
        ngx_memmove(l->in, p, l->in_len);
    }

    /* the agent's own complaints */

    while (l->channel
           && (n = ssh_channel_read_nonblocking(l->channel, err, sizeof(err),
                                                1))
              > 0)
    {
        ngx_log_error(NGX_LOG_ERR, l->log, 0,
                      "hermes: the agent on %V says: \"%*s\"",
                      &l->h->name, (size_t) n, err);
    }
}


static ngx_http_hermes_ssh_stream_t *
ngx_http_hermes_ssh_find(ngx_http_hermes_ssh_link_t *l, uint32_t id)
{
    ngx_queue_t                   *q;
    ngx_http_hermes_ssh_stream_t  *s;

    for (q = ngx_queue_head(&l->streams);
         q != ngx_queue_sentinel(&l->streams);
         q = ngx_queue_next(q))
    {
        s = ngx_queue_data(q, ngx_http_hermes_ssh_stream_t, queue);

        if (s->id == id) {
            return s;
        }
    }

    return NULL;
}


/* a frame from the agent */

static void
ngx_http_hermes_ssh_frame(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_frame_t *f)
{
    off_t                          off;
    size_t                         n, skip, size;
    u_char                        *p, *b;
    int64_t                        status;
    ngx_str_t                      json, bytes;
    ngx_queue_t                   *q, *nq;
    ngx_http_hermes_cmd_t         *cmd;
    ngx_http_hermes_ssh_stream_t  *s;

    if (f->stream == 0) {
        if (f->type != 'H' || l->ready) {
            return;
        }

        /* HELLO: the agent runs; what waited for it goes out */

        l->ready = 1;
        l->down = 0;
        l->delay = 0;
        l->answered = 0;
        l->pinged = 0;

        ngx_log_error(NGX_LOG_INFO, l->log, 0,
                      "hermes: the agent on the kernel host %V runs: %*s",
                      &l->h->name, (size_t) ngx_min(f->len, 200), f->payload);

        for (q = ngx_queue_head(&l->streams);
             q != ngx_queue_sentinel(&l->streams);
             q = nq)
        {
            nq = ngx_queue_next(q);
            s = ngx_queue_data(q, ngx_http_hermes_ssh_stream_t, queue);

            if (!s->sent && !s->ended) {
                ngx_http_hermes_ssh_send(l, s);
            }
        }

        return;
    }

    s = ngx_http_hermes_ssh_find(l, f->stream);

    if (s == NULL || !s->sent || s->ended) {
        /* cancelled, or done */
        return;
    }

    if (s->exec) {
        if (f->type != 'x') {
            return;
        }

        cmd = s->exec->cmd;

        if (ngx_http_hermes_frames_split(f->payload, f->len, &json, &bytes)
            != NGX_OK
            || ngx_http_hermes_frames_json_int(&json, "status", &status)
               != NGX_OK)
        {
            l->broken = "a bad EXIT frame";
            return;
        }

        n = ngx_min(bytes.len, cmd->out_size);
        ngx_memcpy(cmd->out, bytes.data, n);
        cmd->out_len = n;

        if (status < 0) {
            /* the agent could not run it, or it ran out of time */

            if (ngx_strlcasestrn(json.data, json.data + json.len,
                                 (u_char *) "timeout", 7 - 1)
                != NULL)
            {
                cmd->err = NGX_ETIMEDOUT;
                ngx_snprintf(s->exec->conn->err, sizeof(s->exec->conn->err),
                             "ssh command timed out%Z");

            } else {
                ngx_snprintf(s->exec->conn->err, sizeof(s->exec->conn->err),
                             "the agent: %*s%Z",
                             ngx_min(json.len, 200), json.data);
            }

            ngx_http_hermes_ssh_exec_done(l, s, NGX_ERROR);
            return;
        }

        cmd->status = (int) status;
        ngx_http_hermes_ssh_exec_done(l, s, NGX_OK);
        return;
    }

    switch (f->type) {

    case 'S':
        if (!s->shipped) {
            s->shipped = 1;
            s->hdr = 2;
        }

        return;

    case 'O':
        if (f->len < 8) {
            l->broken = "a bad OUT frame";
            return;
        }

        off = (off_t) ngx_http_hermes_frames_u64(f->payload);
        n = f->len - 8;

        if (off > s->recvd || off < 0) {
            l->broken = "output past what was sent";
            return;
        }

        /* what a resumed agent sends again is dropped */

        skip = (size_t) ngx_min((off_t) n, s->recvd - off);
        p = f->payload + 8 + skip;
        n -= skip;

        if (n == 0) {
            return;
        }

        if (s->out_len - s->out_pos + n > 4 * NGX_HTTP_HERMES_SSH_WINDOW) {
            l->broken = "output past the window";
            return;
        }

        if (s->out_size - s->out_len < n) {
            size = ngx_max(s->out_len - s->out_pos + n,
                           (size_t) NGX_HTTP_HERMES_SSH_WINDOW);

            if (size > s->out_size) {
                b = ngx_alloc(size, l->log);
                if (b == NULL) {
                    l->broken = "out of memory";
                    return;
                }

            } else {
                b = s->out;
            }

            if (s->out) {
                ngx_memmove(b, s->out + s->out_pos, s->out_len - s->out_pos);
            }

            if (b != s->out) {
                ngx_free(s->out);
                s->out = b;
                s->out_size = size;
            }

            s->out_len -= s->out_pos;
            s->out_pos = 0;
        }

        ngx_memcpy(s->out + s->out_len, p, n);
        s->out_len += n;
        s->recvd += n;

        return;

    case 'r':
        ngx_http_hermes_ssh_rpc_request(l, s, f);
        return;

    case 'R':
        s->res = ngx_alloc(1 + f->len, l->log);
        if (s->res == NULL) {
            l->broken = "out of memory";
            return;
        }

        s->res[0] = '\x1e';
        ngx_memcpy(s->res + 1, f->payload, f->len);
        s->res_len = 1 + f->len;
        s->res_pos = 0;
        s->ended = 1;

        return;

    default:
        /* another protocol version's */
        return;
    }
}


/*
 * a stream's first frame to the agent now running: anew, or a resume; a
 * note is done once it is out (the caller's walk of the streams steps
 * past "s" before)
 */

static void
ngx_http_hermes_ssh_send(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_ssh_stream_t *s)
{
    u_char  *p;
    u_char   buf[NGX_HTTP_HERMES_FRAME_CELL_MAX];

    s->sent = 1;

    if (s->exec || !s->shipped) {
        (void) ngx_http_hermes_frames_header(s->frame, s->id, s->frame[8],
                                             s->frame_len
                                             - NGX_HTTP_HERMES_FRAME_HEADER);
        (void) ngx_http_hermes_ssh_append(l, s->frame, s->frame_len);
        s->acked = 0;

        if (s->note) {
            ngx_http_hermes_ssh_end(l, s, 0);
        }

        return;
    }

    s->cell.offset = s->recvd;
    s->cell.req_len = 0;

    p = ngx_http_hermes_frames_cell(buf, s->id, &s->cell);
    (void) ngx_http_hermes_ssh_append(l, buf, p - buf);

    s->acked = s->recvd;

    ngx_log_error(NGX_LOG_INFO, l->log, 0,
                  "hermes: cell %uD in \"%s\" resumes at offset %O",
                  s->cell.cell, s->dir, s->recvd);
}


/*
 * A note the same as one still waiting for the agent (the same interrupt
 * of the same cell, asked for again while the host is away) is that one.
 */

static ngx_uint_t
ngx_http_hermes_ssh_noted(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_ssh_stream_t *s)
{
    ngx_queue_t                   *q;
    ngx_http_hermes_ssh_stream_t  *n;

    for (q = ngx_queue_head(&l->streams);
         q != ngx_queue_sentinel(&l->streams);
         q = ngx_queue_next(q))
    {
        n = ngx_queue_data(q, ngx_http_hermes_ssh_stream_t, queue);

        if (n->note && !n->sent && n->frame_len == s->frame_len
            && ngx_memcmp(n->frame + NGX_HTTP_HERMES_FRAME_HEADER,
                          s->frame + NGX_HTTP_HERMES_FRAME_HEADER,
                          s->frame_len - NGX_HTTP_HERMES_FRAME_HEADER)
               == 0)
        {
            return 1;
        }
    }

    return 0;
}


static ngx_int_t
ngx_http_hermes_ssh_append(ngx_http_hermes_ssh_link_t *l, u_char *p,
    size_t n)
{
    if (ngx_http_hermes_ssh_room(&l->out, &l->out_size, &l->out_pos,
                                 &l->out_len, n, 65536, l->log)
        != NGX_OK)
    {
        l->broken = "out of memory";
        return NGX_ERROR;
    }

    ngx_memcpy(l->out + l->out_len, p, n);
    l->out_len += n;

    return NGX_OK;
}


/*
 * Room for "need" more bytes in a heap buffer read from "pos" and written
 * to "len": what is unread moves to its start, and it grows to twice its
 * size, or what it must hold, or "least", whichever is more.
 */

static ngx_int_t
ngx_http_hermes_ssh_room(u_char **buf, size_t *size, size_t *pos,
    size_t *len, size_t need, size_t least, ngx_log_t *log)
{
    u_char  *b;
    size_t   n;

    if (*size - *len >= need) {
        return NGX_OK;
    }

    n = ngx_max(2 * *size, *len - *pos + need);
    n = ngx_max(n, least);

    b = ngx_alloc(n, log);
    if (b == NULL) {
        return NGX_ERROR;
    }

    if (*buf) {
        ngx_memcpy(b, *buf + *pos, *len - *pos);
        ngx_free(*buf);
    }

    *buf = b;
    *size = n;
    *len -= *pos;
    *pos = 0;

    return NGX_OK;
}


/* frames to the channel, as far as the peer's window lets them */

static void
ngx_http_hermes_ssh_flush(ngx_http_hermes_ssh_link_t *l)
{
    int  n;

    while (l->out_pos < l->out_len) {
        n = ssh_channel_write(l->channel, l->out + l->out_pos,
                              l->out_len - l->out_pos);

        if (n == SSH_ERROR) {
            l->broken = (char *) ssh_get_error(l->session);
            return;
        }

        if (n == 0) {
            break;
        }

        l->out_pos += n;
    }

    if (l->out_pos == l->out_len) {
        l->out_pos = 0;
        l->out_len = 0;
    }
}


/*
 * Into the cell's socketpair, as far as it takes: "\x1f\n", cell_out,
 * then "\x1e" and the result.  The agent hears (ACK) of cell_out the
 * cell took, so a slow client holds back its own stream only.
 */

static ngx_int_t
ngx_http_hermes_ssh_cell_write(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_ssh_stream_t *s)
{
    u_char    *p, c;
    size_t     n;
    ssize_t    k;
    ngx_err_t  err;
    u_char     ack[NGX_HTTP_HERMES_FRAME_HEADER + 8];

    for ( ;; ) {

        if (s->hdr) {
            p = (u_char *) "\x1f\n" + 2 - s->hdr;
            n = s->hdr;

        } else if (s->out_pos < s->out_len) {
            p = s->out + s->out_pos;
            n = s->out_len - s->out_pos;

        } else if (s->res) {
            p = s->res + s->res_pos;
            n = s->res_len - s->res_pos;

        } else {
            break;
        }

        k = send(s->fd, p, n, MSG_DONTWAIT|MSG_NOSIGNAL);

        if (k == -1) {
            err = ngx_socket_errno;

            if (err == NGX_EINTR) {
                continue;
            }

            if (err == NGX_EAGAIN) {
                break;
            }

            /* the cell went away */
            ngx_http_hermes_ssh_end(l, s, 1);
            return NGX_DONE;
        }

        if (s->hdr) {
            s->hdr -= k;

        } else if (s->out_pos < s->out_len) {
            s->out_pos += k;
            s->taken += k;

            if (s->out_pos == s->out_len) {
                s->out_pos = 0;
                s->out_len = 0;
            }

        } else {
            s->res_pos += k;

            if (s->res_pos == s->res_len) {
                /* all said: EOF for the cell */
                ngx_http_hermes_ssh_end(l, s, 0);
                return NGX_DONE;
            }
        }
    }

    if (s->sent && !s->ended && l->ready
        && s->taken - s->acked >= NGX_HTTP_HERMES_SSH_WINDOW / 2)
    {
        p = ngx_http_hermes_frames_header(ack, s->id, 'A', 8);
        (void) ngx_http_hermes_frames_put_u64(p, (uint64_t) s->taken);
        (void) ngx_http_hermes_ssh_append(l, ack, sizeof(ack));
        s->acked = s->taken;

        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, l->log, 0,
                       "hermes: ssh ACK of stream %uD at %O", s->id, s->taken);
    }

    if (s->hdr == 0 && s->out_pos == s->out_len && s->res == NULL) {
        /* nothing to write: is the cell still there? */

        k = recv(s->fd, &c, 1, MSG_PEEK|MSG_DONTWAIT);

        if (k == 0 || (k == -1 && ngx_socket_errno != NGX_EAGAIN
                       && ngx_socket_errno != NGX_EINTR))
        {
            ngx_http_hermes_ssh_end(l, s, 1);
            return NGX_DONE;
        }
    }

    return NGX_OK;
}


/*
 * A tool call request the agent read from rpc/: to the cell, as a record
 * (u32 length, the frame's payload) for ngx_hermes_rpc.c to check.  The
 * agent stops reading rpc/ while its own output waits; a cell that does
 * not take its requests has them dropped past the backlog, as a code
 * that floods rpc/ deserves.
 */

static void
ngx_http_hermes_ssh_rpc_request(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_ssh_stream_t *s, ngx_http_hermes_frame_t *f)
{
    u_char  *b;
    size_t   need;

    if (s->rfd == (ngx_socket_t) -1) {
        return;                 /* the cell takes no tool calls */
    }

    need = 4 + f->len;

    if (s->rq_len - s->rq_pos + need > NGX_HTTP_HERMES_SSH_RPC_BACKLOG) {
        ngx_log_error(NGX_LOG_WARN, l->log, 0,
                      "hermes: cell %uD in \"%s\": tool call requests "
                      "past the backlog are dropped", s->cell.cell, s->dir);
        return;
    }

    if (ngx_http_hermes_ssh_room(&s->rq, &s->rq_size, &s->rq_pos, &s->rq_len,
                                 need, 0, l->log)
        != NGX_OK)
    {
        return;
    }

    b = ngx_http_hermes_frames_put_u32(s->rq + s->rq_len, (uint32_t) f->len);
    ngx_memcpy(b, f->payload, f->len);
    s->rq_len += need;

    ngx_http_hermes_ssh_rpc_io(l, s);
}


/* requests to the cell as far as it takes them; its answers to the agent */

static void
ngx_http_hermes_ssh_rpc_io(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_ssh_stream_t *s)
{
    u_char     *p, *b;
    size_t      len, size;
    ssize_t     k;
    ngx_err_t   err;
    u_char      hdr[NGX_HTTP_HERMES_FRAME_HEADER];

    while (s->rq_pos < s->rq_len) {
        k = send(s->rfd, s->rq + s->rq_pos, s->rq_len - s->rq_pos,
                 MSG_DONTWAIT|MSG_NOSIGNAL);

        if (k == -1) {
            err = ngx_socket_errno;

            if (err == NGX_EINTR) {
                continue;
            }

            if (err == NGX_EAGAIN) {
                break;
            }

            ngx_http_hermes_ssh_rpc_close(s);
            return;
        }

        s->rq_pos += k;
    }

    if (s->rq_pos == s->rq_len) {
        s->rq_pos = 0;
        s->rq_len = 0;
    }

    for ( ;; ) {
        if (s->ra_size - s->ra_len < 65536) {
            size = ngx_max(2 * s->ra_size, 65536 + s->ra_len);

            if (size > 2 * (4 + NGX_HTTP_HERMES_FRAME_MAX)) {
                /* a record over a frame: the cell's end is broken */
                ngx_log_error(NGX_LOG_ERR, l->log, 0,
                              "hermes: a tool call answer over a frame");
                ngx_http_hermes_ssh_rpc_close(s);
                return;
            }

            b = ngx_alloc(size, l->log);
            if (b == NULL) {
                return;
            }

            if (s->ra) {
                ngx_memcpy(b, s->ra, s->ra_len);
                ngx_free(s->ra);
            }

            s->ra = b;
            s->ra_size = size;
        }

        k = recv(s->rfd, s->ra + s->ra_len, s->ra_size - s->ra_len,
                 MSG_DONTWAIT);

        if (k == -1) {
            err = ngx_socket_errno;

            if (err == NGX_EINTR) {
                continue;
            }

            if (err == NGX_EAGAIN) {
                return;
            }

            k = 0;
        }

        if (k == 0) {
            /* the cell closed its end: its tool calls are over */
            ngx_http_hermes_ssh_rpc_close(s);
            return;
        }

        s->ra_len += k;

        /* each whole record: one RPC_ANSWER frame of the stream */

        p = s->ra;

        while (s->ra_len - (p - s->ra) >= 4) {
            len = ngx_http_hermes_frames_u32(p);

            if (len > NGX_HTTP_HERMES_FRAME_MAX) {
                ngx_log_error(NGX_LOG_ERR, l->log, 0,
                              "hermes: a tool call answer over a frame");
                ngx_http_hermes_ssh_rpc_close(s);
                return;
            }

            if (s->ra_len - (p - s->ra) < 4 + len) {
                break;
            }

            if (s->sent && l->ready && !l->broken) {
                b = ngx_http_hermes_frames_header(hdr, s->id, 'a', len);
                (void) ngx_http_hermes_ssh_append(l, hdr, b - hdr);
                (void) ngx_http_hermes_ssh_append(l, p + 4, len);

            } else {
                /* the code's call waits on its own timeout */
                ngx_log_error(NGX_LOG_WARN, l->log, 0,
                              "hermes: cell %uD in \"%s\": a tool call "
                              "answer is lost: the connection broke",
                              s->cell.cell, s->dir);
            }

            p += 4 + len;
        }

        s->ra_len -= p - s->ra;
        ngx_memmove(s->ra, p, s->ra_len);
    }
}


static void
ngx_http_hermes_ssh_rpc_close(ngx_http_hermes_ssh_stream_t *s)
{
    if (s->rfd != (ngx_socket_t) -1) {
        (void) close(s->rfd);
        s->rfd = (ngx_socket_t) -1;
    }

    ngx_free(s->rq);
    ngx_free(s->ra);
    s->rq = NULL;
    s->ra = NULL;
    s->rq_pos = s->rq_len = s->rq_size = 0;
    s->ra_len = s->ra_size = 0;
}


/*
 * The host stayed unreachable until the cell's deadline: the cell hears
 * it as a word of the host side ({"relay":"unreachable"}), with an error
 * for its answer.  Its kernel is killed (the kill is retried while the
 * host is down) and the session's state is lost.
 */

static void
ngx_http_hermes_ssh_give_up(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_ssh_stream_t *s, ngx_msec_t now)
{
    u_char      *p;
    size_t       len;
    ngx_msec_t   down;
    u_char       buf[NGX_HTTP_HERMES_HOST_MAX * 6 + 512];

    static u_char  start[] = "\x1e{\"relay\":\"unreachable\","
                             "\"status\":\"error\",\"error\":"
                             "\"the kernel host ";

    l->down = 1;

    down = l->answered ? now - l->answered : 0;

    ngx_log_error(NGX_LOG_WARN, l->log, 0,
                  "hermes: the kernel host %s:%ui could not be reached for "
                  "%M ms during cell %uD, giving up at its deadline",
                  l->h->host, l->h->port, down, s->cell.cell);

    p = ngx_cpymem(buf, start, sizeof(start) - 1);

    len = ngx_min(ngx_strlen(l->h->host), NGX_HTTP_HERMES_HOST_MAX);
    p = (u_char *) ngx_escape_json(p, l->h->host, len);

    p = ngx_slprintf(p, buf + sizeof(buf),
                     ":%ui could not be reached for %M.%M s during the cell; "
                     "the kernel there is killed once the host answers "
                     "again, and the session's state is lost\"}",
                     l->h->port, down / 1000, down % 1000 / 100);

    s->ended = 1;

    s->res = ngx_alloc(p - buf, l->log);
    if (s->res == NULL) {
        ngx_http_hermes_ssh_end(l, s, 0);
        return;
    }

    s->res_len = ngx_cpymem(s->res, buf, p - buf) - s->res;
    s->res_pos = 0;
}


/*
 * An EXEC answered, or failed: its waiter goes on.  rc NGX_DECLINED: it
 * never reached the agent (nothing ran); NGX_ERROR: it failed otherwise.
 */

static void
ngx_http_hermes_ssh_exec_done(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_ssh_stream_t *s, ngx_int_t rc)
{
    u_char  *p;
    u_char   cancel[NGX_HTTP_HERMES_FRAME_HEADER];

    if (rc != NGX_OK && s->sent && l->ready) {
        p = ngx_http_hermes_frames_header(cancel, s->id, 'Q', 0);
        (void) ngx_http_hermes_ssh_append(l, cancel, p - cancel);
    }

    ngx_queue_remove(&s->queue);
    l->nstreams--;

    pthread_mutex_lock(&l->mutex);
    s->exec->rc = rc;
    s->exec->done = 1;
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->mutex);

    ngx_free(s);
}


/* a cell's stream ends: its socketpair closed (EOF for the cell) */

static void
ngx_http_hermes_ssh_end(ngx_http_hermes_ssh_link_t *l,
    ngx_http_hermes_ssh_stream_t *s, ngx_uint_t cancel)
{
    u_char  *p;
    u_char   frame[NGX_HTTP_HERMES_FRAME_HEADER];

    if (cancel && s->sent && !s->ended && l->ready) {
        p = ngx_http_hermes_frames_header(frame, s->id, 'Q', 0);
        (void) ngx_http_hermes_ssh_append(l, frame, p - frame);
    }

    if (s->fd != -1) {
        (void) close(s->fd);
    }

    ngx_http_hermes_ssh_rpc_close(s);

    ngx_queue_remove(&s->queue);
    l->nstreams--;

    ngx_free(s->out);
    ngx_free(s->res);
    ngx_free(s);
}


static ngx_msec_t
ngx_http_hermes_ssh_now(void)
{
    struct timespec  ts;

    (void) clock_gettime(CLOCK_MONOTONIC, &ts);

    return (ngx_msec_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}


/*
 * The I/O thread: connect and authenticate, within "timeout" ms.  Public
 * key from identity= only, the host key checked against known_hosts= only
 * (no user or system config, no agent), an unknown or changed key refused.
 */

static ngx_int_t
ngx_http_hermes_ssh_connect(ngx_http_hermes_ssh_link_t *l, ngx_msec_t timeout)
{
    int                              rc, no, yes;
    long                             sec, usec;
    ssh_key                          key;
    ssh_session                      s;
    ngx_http_hermes_ssh_host_t      *h;
    ngx_http_hermes_ssh_conf_t      *scf;
    enum ssh_known_hosts_e           known;

    scf = l->scf;
    h = l->h;

    s = ssh_new();
    if (s == NULL) {
        ngx_snprintf(l->err, sizeof(l->err), "ssh_new() failed%Z");
        return NGX_ERROR;
    }

    no = 0;
    yes = 1;
    sec = (long) (timeout / 1000);
    usec = (long) (timeout % 1000) * 1000;

    if (ssh_options_set(s, SSH_OPTIONS_PROCESS_CONFIG, &no) != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_HOST, h->host) != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_PORT, &h->port) != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_USER, scf->user.data) != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_KNOWNHOSTS, scf->known_hosts.data)
           != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_GLOBAL_KNOWNHOSTS,
                           scf->known_hosts.data)
           != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_TIMEOUT, &sec) != SSH_OK
        || ssh_options_set(s, SSH_OPTIONS_TIMEOUT_USEC, &usec) != SSH_OK
        /* frames are small and wanted at once: no Nagle on our side */
        || ssh_options_set(s, SSH_OPTIONS_NODELAY, &yes) != SSH_OK)
    {
        ngx_snprintf(l->err, sizeof(l->err),
                     "ssh options for %V:%ui: %s%Z", &h->name, h->port,
                     ssh_get_error(s));
        ssh_free(s);
        return NGX_ERROR;
    }

    if (ssh_connect(s) != SSH_OK) {
        ngx_snprintf(l->err, sizeof(l->err),
                     "ssh connect to %V:%ui: %s%Z", &h->name, h->port,
                     ssh_get_error(s));
        ssh_free(s);
        return NGX_ERROR;
    }

    known = ssh_session_is_known_server(s);

    if (known != SSH_KNOWN_HOSTS_OK) {
        ngx_snprintf(l->err, sizeof(l->err),
                     "ssh host key of %V:%ui is %s in \"%V\": refused%Z",
                     &h->name, h->port,
                     known == SSH_KNOWN_HOSTS_CHANGED ? "changed"
                     : known == SSH_KNOWN_HOSTS_OTHER ? "of another type"
                     : known == SSH_KNOWN_HOSTS_ERROR ? "unreadable"
                     : "unknown",
                     &scf->known_hosts);
        ssh_disconnect(s);
        ssh_free(s);
        return NGX_ERROR;
    }

    if (ssh_pki_import_privkey_file((char *) scf->identity.data, NULL, NULL,
                                    NULL, &key)
        != SSH_OK)
    {
        ngx_snprintf(l->err, sizeof(l->err),
                     "ssh identity \"%V\" unreadable%Z", &scf->identity);
        ssh_disconnect(s);
        ssh_free(s);
        return NGX_ERROR;
    }

    rc = ssh_userauth_publickey(s, NULL, key);
    ssh_key_free(key);

    if (rc != SSH_AUTH_SUCCESS) {
        ngx_snprintf(l->err, sizeof(l->err),
                     "ssh public key auth as %V at %V:%ui refused%Z",
                     &scf->user, &h->name, h->port);
        ssh_disconnect(s);
        ssh_free(s);
        return NGX_ERROR;
    }

    if (timeout != scf->connect_timeout) {
        /* a kept session's later calls get the configured bound */

        sec = (long) (scf->connect_timeout / 1000);
        usec = (long) (scf->connect_timeout % 1000) * 1000;

        if (ssh_options_set(s, SSH_OPTIONS_TIMEOUT, &sec) != SSH_OK
            || ssh_options_set(s, SSH_OPTIONS_TIMEOUT_USEC, &usec) != SSH_OK)
        {
            ngx_snprintf(l->err, sizeof(l->err),
                         "ssh options for %V:%ui: %s%Z", &h->name, h->port,
                         ssh_get_error(s));
            ssh_disconnect(s);
            ssh_free(s);
            return NGX_ERROR;
        }
    }

    l->session = s;

    return NGX_OK;
}


/*
 * nginx -t: identity= must be a private key libssh can read without a
 * passphrase, known_hosts= lines of "hosts keytype key" (it may be empty:
 * then every host is unknown, and refused).  NULL, or why not.
 */

static char *
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
