
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: the local backend, kernels on the nginx host.
 *
 * Commands run under /bin/sh with their payload on stdin (never on the
 * command line).  They block, so they run only in the thread pool.  Cell
 * files and the wake-up byte are quick local writes done in the event loop,
 * none of which can block.
 */


#include "ngx_hermes.h"

#include <spawn.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <sys/wait.h>


#define NGX_HTTP_HERMES_LOCAL_READY_TIMEOUT  10000


/* a clean environment: nothing of the worker's reaches the kernel host */

static char *ngx_http_hermes_local_env[] = {
    "PATH=/usr/local/bin:/usr/bin:/bin",
    "LANG=C.UTF-8",
    NULL
};


static int  ngx_http_hermes_local_default_signals[] = {
    SIGPIPE, SIGCHLD, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2,
    SIGWINCH, SIGALRM, SIGIO, SIGSYS, 0
};


static void ngx_http_hermes_local_take(ngx_http_hermes_conn_t *conn);
static ngx_int_t ngx_http_hermes_local_conn_exec(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_cmd_t *cmd);
static ngx_int_t ngx_http_hermes_local_ready(ngx_http_hermes_conn_t *conn,
    u_char *dir, ngx_pid_t pid, ngx_pid_t expect, uint64_t *start);
static char *ngx_http_hermes_local_init_conf(ngx_conf_t *cf,
    ngx_http_hermes_backend_conf_t *bcf);
static ngx_uint_t ngx_http_hermes_local_root(
    ngx_http_hermes_backend_conf_t *bcf);
static ngx_uint_t ngx_http_hermes_local_pick_host(
    ngx_http_hermes_backend_conf_t *bcf, ngx_uint_t *kernels);
static ngx_str_t *ngx_http_hermes_local_host_name(
    ngx_http_hermes_backend_conf_t *bcf, ngx_uint_t host);
static ngx_int_t ngx_http_hermes_local_interrupt_kernel(
    ngx_http_hermes_backend_conf_t *bcf, ngx_http_hermes_victim_t *v,
    uint32_t cell, ngx_log_t *log);
static ngx_uint_t ngx_http_hermes_local_alive(ngx_http_hermes_victim_t *v);
static ngx_int_t ngx_http_hermes_local_root_make(ngx_cycle_t *cycle,
    ngx_str_t *root, ngx_core_conf_t *ccf);


ngx_http_hermes_backend_ops_t  ngx_http_hermes_backend_local_ops = {
    ngx_string("local"),
    &ngx_http_hermes_transport_local,
    NGX_MAX_SIZE_T_VALUE,                   /* a pipe: no bound */
    NULL,                                   /* create_conf: no params */
    NULL,                                   /* parse */
    ngx_http_hermes_local_init_conf,
    NULL,                                   /* init_process */
    ngx_http_hermes_local_take,
    ngx_http_hermes_local_take,             /* give: nothing was taken */
    ngx_http_hermes_local_conn_exec,
    ngx_http_hermes_local_ready,
    ngx_http_hermes_local_root,
    ngx_http_hermes_local_pick_host,
    ngx_http_hermes_local_host_name,
    ngx_http_hermes_local_interrupt_kernel,
    ngx_http_hermes_local_alive,
    NULL                                    /* exit_process */
};


/*
 * What the first spawn would find out, told by nginx -t instead: the
 * kernels root of a local backend is a directory that others cannot
 * write without the sticky bit (or not there yet: the start makes it),
 * and python3 is there to run kernels.
 */

static char *
ngx_http_hermes_local_init_conf(ngx_conf_t *cf,
    ngx_http_hermes_backend_conf_t *bcf)
{
    ngx_str_t        *root;
    ngx_file_info_t   fi;

    root = &bcf->root;

    if (ngx_file_info(root->data, &fi) == NGX_FILE_ERROR) {
        if (ngx_errno == NGX_ENOENT) {
            /* made at start, for the workers' user */
            goto python;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           "hermes_backend local root \"%V\"", root);
        return NGX_CONF_ERROR;
    }

    if (!ngx_is_dir(&fi)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "hermes_backend local root \"%V\" is not a "
                           "directory", root);
        return NGX_CONF_ERROR;
    }

    if ((fi.st_mode & (S_IWGRP|S_IWOTH)) && !(fi.st_mode & S_ISVTX)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "hermes_backend local root \"%V\" is writable by "
                           "others without the sticky bit (chmod o-w,g-w, "
                           "or 1777 as /tmp)", root);
        return NGX_CONF_ERROR;
    }

python:

    if (access("/usr/bin/python3", X_OK) != 0
        && access("/usr/local/bin/python3", X_OK) != 0
        && access("/bin/python3", X_OK) != 0)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "hermes_backend local: python3 is not installed "
                           "in /usr/local/bin, /usr/bin or /bin, where "
                           "kernels look for it");
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/* a mode in octal, four digits: nginx's formats have no %o */
#define NGX_HTTP_HERMES_MODE_DIGITS(m)                                       \
    (ngx_uint_t) (((m) >> 9) & 7), (ngx_uint_t) (((m) >> 6) & 7),            \
    (ngx_uint_t) (((m) >> 3) & 7), (ngx_uint_t) ((m) & 7)


/*
 * The kernels roots of local backends, made at start (and on a reload
 * that names a new one) by the master, as nginx makes its temp paths:
 * missing parents 0755, the root for the workers' user.  A root worker
 * hands each kernel to the sandbox's user, who passes through the root:
 * root's, 0711.  Any other worker makes the kernels' directories, and its
 * kernels run as it: the root is that user's, 0700.  A root that exists
 * is left as it is (nginx -t checked it); one the workers' user cannot
 * write is said in error.log.
 */

ngx_int_t
ngx_http_hermes_local_make_roots(ngx_cycle_t *cycle)
{
    ngx_int_t                        rc;
    ngx_uint_t                       i;
    ngx_core_conf_t                 *ccf;
    ngx_http_hermes_main_conf_t     *hmcf;
    ngx_http_hermes_backend_conf_t **b;

    if (ngx_test_config || cycle->conf_ctx[ngx_http_module.index] == NULL) {
        return NGX_OK;
    }

    hmcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_hermes_module);
    if (hmcf == NULL) {
        return NGX_OK;
    }

    ccf = (ngx_core_conf_t *) ngx_get_conf(cycle->conf_ctx, ngx_core_module);

    rc = NGX_OK;
    b = hmcf->backends.elts;

    for (i = 0; i < hmcf->backends.nelts; i++) {
        if (b[i]->ops == &ngx_http_hermes_backend_local_ops
            && ngx_http_hermes_local_root_make(cycle, &b[i]->root, ccf)
               != NGX_OK)
        {
            rc = NGX_ERROR;
        }
    }

    return rc;
}


static ngx_int_t
ngx_http_hermes_local_root_make(ngx_cycle_t *cycle, ngx_str_t *root,
    ngx_core_conf_t *ccf)
{
    u_char           *p, c;
    ngx_uid_t         user;
    ngx_gid_t         group;
    ngx_file_info_t   fi;
    ngx_uint_t        mode;
    u_char            path[NGX_HTTP_HERMES_DIR_MAX];

    /* NUL-terminated and shorter than a kernel's dir (backend_create) */

    if (ngx_file_info(root->data, &fi) != NGX_FILE_ERROR) {

        if (!ngx_is_dir(&fi) || geteuid() != 0
            || ccf->user == (ngx_uid_t) NGX_CONF_UNSET_UINT
            || ccf->user == 0)
        {
            return NGX_OK;
        }

        /* a worker that is not root makes kernel directories in it */

        if (!((fi.st_uid == ccf->user && (fi.st_mode & S_IWUSR)
               && (fi.st_mode & S_IXUSR))
              || (fi.st_gid == ccf->group && (fi.st_mode & S_IWGRP)
                  && (fi.st_mode & S_IXGRP))
              || ((fi.st_mode & S_IWOTH) && (fi.st_mode & S_IXOTH))))
        {
            ngx_log_error(NGX_LOG_WARN, cycle->log, 0,
                          "hermes_backend local root \"%V\" (uid %d, mode "
                          "%ui%ui%ui%ui) is not writable by the workers' "
                          "user \"%s\" (uid %d): no kernel can start in it "
                          "(a root that is not there is made for that user)",
                          root, (int) fi.st_uid,
                          NGX_HTTP_HERMES_MODE_DIGITS(fi.st_mode),
                          ccf->username, (int) ccf->user);
        }

        return NGX_OK;
    }

    if (ngx_errno != NGX_ENOENT) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, ngx_errno,
                      "hermes_backend local root \"%V\": "
                      ngx_file_info_n " failed", root);
        return NGX_ERROR;
    }

    /* the parents that are missing, then the root */

    *ngx_cpymem(path, root->data, root->len) = '\0';

    for (p = path + 1; /* void */; p++) {

        if (*p != '/' && *p != '\0') {
            continue;
        }

        c = *p;
        *p = '\0';

        if (ngx_create_dir(path, 0755) == NGX_FILE_ERROR
            && ngx_errno != NGX_EEXIST)
        {
            ngx_log_error(NGX_LOG_EMERG, cycle->log, ngx_errno,
                          "hermes_backend local root \"%V\" could not be "
                          "made: " ngx_create_dir_n " \"%s\" failed",
                          root, path);
            return NGX_ERROR;
        }

        if (c == '\0') {
            break;
        }

        *p = c;
    }

    if (geteuid() == 0 && ccf->user != (ngx_uid_t) NGX_CONF_UNSET_UINT
        && ccf->user != 0)
    {
        user = ccf->user;
        group = ccf->group;
        mode = 0700;

    } else {
        user = geteuid();
        group = getegid();
        mode = (geteuid() == 0) ? 0711 : 0700;
    }

    if (chown((char *) root->data, user, group) == -1
        || chmod((char *) root->data, mode) == -1)
    {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, ngx_errno,
                      "hermes_backend local root \"%V\": chown() or chmod() "
                      "failed", root);
        return NGX_ERROR;
    }

    ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                  "hermes_backend local root \"%V\" made: uid %d, mode "
                  "%ui%ui%ui%ui", root, (int) user,
                  NGX_HTTP_HERMES_MODE_DIGITS(mode));

    return NGX_OK;
}


static void
ngx_http_hermes_local_take(ngx_http_hermes_conn_t *conn)
{
    /* commands on this host need no connection */
}


static ngx_int_t
ngx_http_hermes_local_conn_exec(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_cmd_t *cmd)
{
    /* the kernel script's "dir" and "ship" are done here, in-process */

    if (ngx_http_hermes_local_steps(cmd) == NGX_OK) {
        return NGX_OK;
    }

    return ngx_http_hermes_local_exec(cmd);
}


static ngx_int_t
ngx_http_hermes_local_ready(ngx_http_hermes_conn_t *conn, u_char *dir,
    ngx_pid_t pid, ngx_pid_t expect, uint64_t *start)
{
    if (ngx_http_hermes_local_wait_ready(dir, pid, expect,
                                         NGX_HTTP_HERMES_LOCAL_READY_TIMEOUT)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    return ngx_http_hermes_local_proc_start(pid, start);
}


/* kernels never run as root: a root worker drops to the sandbox's user */

static ngx_uint_t
ngx_http_hermes_local_root(ngx_http_hermes_backend_conf_t *bcf)
{
    return geteuid() == 0;
}


static ngx_uint_t
ngx_http_hermes_local_pick_host(ngx_http_hermes_backend_conf_t *bcf,
    ngx_uint_t *kernels)
{
    return 0;
}


static ngx_str_t *
ngx_http_hermes_local_host_name(ngx_http_hermes_backend_conf_t *bcf,
    ngx_uint_t host)
{
    static ngx_str_t  localhost = ngx_string("localhost");

    return &localhost;
}


/*
 * Event loop: "N\n" into the intr FIFO of the kernel, if it is still it.
 * NGX_DECLINED: it is not there (any more), or its FIFO took nothing
 * (logged).
 */

static ngx_int_t
ngx_http_hermes_local_interrupt_kernel(ngx_http_hermes_backend_conf_t *bcf,
    ngx_http_hermes_victim_t *v, uint32_t cell, ngx_log_t *log)
{
    ngx_fd_t         fd;
    ngx_int_t        rc;
    ngx_file_info_t  fi;

    fd = open((char *) v->dir,
              O_RDONLY|O_DIRECTORY|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC);
    if (fd == NGX_INVALID_FILE) {
        return NGX_DECLINED;
    }

    rc = NGX_DECLINED;

    if (ngx_fd_info(fd, &fi) == 0 && (uint64_t) fi.st_ino == v->ino) {
        rc = ngx_http_hermes_local_interrupt(fd, cell, log);
    }

    close(fd);

    return rc;
}


/*
 * A local warm kernel is alive: its process (not a zombie, nor a later one
 * given its pid) and its directory.
 */

static ngx_uint_t
ngx_http_hermes_local_alive(ngx_http_hermes_victim_t *v)
{
    u_char           *p;
    ssize_t           n;
    ngx_fd_t          fd;
    uint64_t          start;
    ngx_file_info_t   fi;
    u_char            path[64], buf[1024];

    ngx_sprintf(path, "/proc/%P/stat%Z", v->pid);

    fd = open((char *) path, O_RDONLY|O_CLOEXEC);
    if (fd == -1) {
        return 0;
    }

    n = read(fd, buf, sizeof(buf));
    close(fd);

    if (n <= 0) {
        return 0;
    }

    /* the state follows the command name, which may hold a ')' */

    for (p = buf + n; p > buf && p[-1] != ')'; p--) { /* void */ }

    if (buf + n - p < 2 || p[1] == 'Z' || p[1] == 'X'
        || ngx_http_hermes_proc_start(buf, n, &start) != NGX_OK
        || start != v->start)
    {
        return 0;
    }

    if (ngx_link_info(v->dir, &fi) == NGX_FILE_ERROR
        || (uint64_t) fi.st_ino != v->ino)
    {
        return 0;
    }

    return 1;
}



ngx_int_t
ngx_http_hermes_local_exec(ngx_http_hermes_cmd_t *cmd)
{
    int                          in[2], out[2], status, n, i;
    char                        *argv[5 + NGX_HTTP_HERMES_CMD_ARGS];
    pid_t                        pid;
    size_t                       sent;
    ssize_t                      k;
    sigset_t                     mask;
    ngx_msec_t                   left;
    struct pollfd                pfd[2];
    struct timespec              ts, deadline;
    posix_spawnattr_t            attr;
    posix_spawn_file_actions_t   fa;

    cmd->status = -1;
    cmd->out_len = 0;
    cmd->err = 0;

    /* sh -c SCRIPT hermes ARG...: values are never shell text */

    argv[0] = "sh";
    argv[1] = "-c";
    argv[2] = (char *) cmd->cmd;
    argv[3] = "hermes";

    for (i = 0; cmd->args && cmd->args[i]; i++) {
        if (i == NGX_HTTP_HERMES_CMD_ARGS) {
            cmd->err = E2BIG;
            return NGX_ERROR;
        }

        argv[4 + i] = cmd->args[i];
    }

    argv[4 + i] = NULL;

    /*
     * SIGCHLD is SIG_DFL in workers (see ngx_hermes_kernel.c), yet a signal
     * blocked by its target thread is queued, not discarded, and then
     * interrupts the event loop: let this thread take it, and drop it.
     */

    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    (void) pthread_sigmask(SIG_UNBLOCK, &mask, NULL);

    if (pipe2(in, O_CLOEXEC) == -1) {
        cmd->err = ngx_errno;
        return NGX_ERROR;
    }

    if (pipe2(out, O_CLOEXEC) == -1) {
        cmd->err = ngx_errno;
        close(in[0]);
        close(in[1]);
        return NGX_ERROR;
    }

    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, out[1], 2);
    /* the worker's sockets and files must not leak into kernels */
    posix_spawn_file_actions_addclosefrom_np(&fa, 3);
    /*
     * from "/", not nginx's own directory: a worker that is not root may
     * not be let into it (a private checkout), and the commands, the
     * kernels they start and their tools would stumble on it
     */
    posix_spawn_file_actions_addchdir_np(&fa, "/");

    /*
     * Threads of the pool block every signal, and nginx ignores some:
     * a kernel starts with an empty mask and default dispositions.
     */

    posix_spawnattr_init(&attr);
    sigemptyset(&mask);
    posix_spawnattr_setsigmask(&attr, &mask);
    for (i = 0; ngx_http_hermes_local_default_signals[i]; i++) {
        sigaddset(&mask, ngx_http_hermes_local_default_signals[i]);
    }
    posix_spawnattr_setsigdefault(&attr, &mask);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK
                                    | POSIX_SPAWN_SETSIGDEF);

    n = posix_spawn(&pid, "/bin/sh", &fa, &attr, argv,
                    ngx_http_hermes_local_env);

    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);

    close(in[0]);
    close(out[1]);

    if (n != 0) {
        cmd->err = n;
        close(in[1]);
        close(out[0]);
        return NGX_ERROR;
    }

    (void) fcntl(in[1], F_SETFL, O_NONBLOCK);

    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += cmd->timeout / 1000;
    deadline.tv_nsec += (cmd->timeout % 1000) * 1000000;
    if (deadline.tv_nsec >= 1000000000) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000;
    }

    sent = 0;

    if (cmd->in_len == 0) {
        close(in[1]);
        in[1] = -1;
    }

    for ( ;; ) {
        pfd[0].fd = out[0];
        pfd[0].events = POLLIN;
        pfd[1].fd = in[1];
        pfd[1].events = POLLOUT;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        if (ts.tv_sec > deadline.tv_sec
            || (ts.tv_sec == deadline.tv_sec && ts.tv_nsec >= deadline.tv_nsec))
        {
            cmd->err = NGX_ETIMEDOUT;
            break;
        }

        left = (deadline.tv_sec - ts.tv_sec) * 1000
               + (deadline.tv_nsec - ts.tv_nsec) / 1000000 + 1;

        n = poll(pfd, in[1] == -1 ? 1 : 2, (int) left);

        if (n == -1) {
            if (ngx_errno == NGX_EINTR) {
                continue;
            }

            cmd->err = ngx_errno;
            break;
        }

        if (in[1] != -1 && (pfd[1].revents & (POLLOUT|POLLERR|POLLHUP))) {
            k = write(in[1], cmd->in + sent, cmd->in_len - sent);

            if (k > 0) {
                sent += k;
            }

            if ((k == -1 && ngx_errno != NGX_EAGAIN) || sent == cmd->in_len) {
                close(in[1]);
                in[1] = -1;
            }
        }

        if (pfd[0].revents & (POLLIN|POLLERR|POLLHUP)) {
            if (cmd->out_len < cmd->out_size) {
                k = read(out[0], cmd->out + cmd->out_len,
                         cmd->out_size - cmd->out_len);

            } else {
                u_char  discard[512];

                k = read(out[0], discard, sizeof(discard));
                if (k > 0) {
                    continue;
                }
            }

            if (k == 0) {
                break;
            }

            if (k > 0) {
                cmd->out_len += k;

            } else if (ngx_errno != NGX_EINTR && ngx_errno != NGX_EAGAIN) {
                cmd->err = ngx_errno;
                break;
            }
        }
    }

    if (in[1] != -1) {
        close(in[1]);
    }

    close(out[0]);

    if (cmd->err) {
        /* the shell is ours: a stuck command must not pin the thread */
        kill(pid, SIGKILL);
    }

    while (waitpid(pid, &status, 0) == -1) {
        if (ngx_errno != NGX_EINTR) {
            return NGX_ERROR;
        }
    }

    if (cmd->err) {
        return NGX_ERROR;
    }

    if (sent != cmd->in_len) {
        cmd->err = NGX_EPIPE;
        return NGX_ERROR;
    }

    cmd->status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);

    return NGX_OK;
}


/*
 * Files under a kernel dir are the cell's to replace: with a FIFO (an
 * open that blocks the worker for good), a symlink, a directory.  Every
 * open here is relative to a directory fd verified when the cell began,
 * non-blocking, no-follow; only regular files are read.
 */

/*
 * NAME.tmp, 0600, a new file, then renamed into place.  NGX_DECLINED: the
 * disk is full (logged).
 */

ngx_int_t
ngx_http_hermes_local_write_at(ngx_fd_t dir, const char *name, u_char *data,
    size_t len, ngx_uid_t uid, ngx_log_t *log)
{
    u_char     tmp[128];
    ssize_t    n;
    ngx_fd_t   fd;
    ngx_err_t  err;

    *ngx_slprintf(tmp, tmp + sizeof(tmp) - 1, "%s.tmp", name) = '\0';

    /* O_EXCL: a name already there (planted, or a symlink) is not ours */

    fd = openat(dir, (char *) tmp,
                O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC,
                0600);
    if (fd == -1) {
        ngx_log_error(NGX_LOG_ERR, log, ngx_errno,
                      "hermes: openat(\"%s\") failed", tmp);
        return NGX_ERROR;
    }

    /* a root worker writes for a kernel that runs as another user */

    if (uid != geteuid() && fchown(fd, uid, (ngx_gid_t) -1) == -1) {
        ngx_log_error(NGX_LOG_ERR, log, ngx_errno,
                      "hermes: fchown(\"%s\", %d) failed", tmp, (int) uid);
        close(fd);
        (void) unlinkat(dir, (char *) tmp, 0);
        return NGX_ERROR;
    }

    while (len) {
        n = write(fd, data, len);

        if (n == -1) {
            err = ngx_errno;

            if (err == NGX_EINTR) {
                continue;
            }

            close(fd);
            (void) unlinkat(dir, (char *) tmp, 0);

            ngx_log_error(NGX_LOG_ERR, log, err,
                          "hermes: write(\"%s\") failed", tmp);

            return (err == ENOSPC || err == EDQUOT) ? NGX_DECLINED
                                                    : NGX_ERROR;
        }

        data += n;
        len -= n;
    }

    close(fd);

    if (renameat(dir, (char *) tmp, dir, name) == -1) {
        ngx_log_error(NGX_LOG_ERR, log, ngx_errno,
                      "hermes: rename(\"%s\") failed", tmp);
        (void) unlinkat(dir, (char *) tmp, 0);
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * A regular file under dir, for reading, or NGX_INVALID_FILE: errno
 * NGX_ENOENT when it is not there (yet), NGX_EINVAL when it is something
 * else than a regular file.
 */

ngx_fd_t
ngx_http_hermes_local_open_at(ngx_fd_t dir, const char *name, off_t *size)
{
    ngx_fd_t         fd;
    ngx_file_info_t  fi;

    fd = openat(dir, name, O_RDONLY|O_NONBLOCK|O_NOFOLLOW|O_CLOEXEC);
    if (fd == -1) {
        if (ngx_errno == ELOOP || ngx_errno == ENXIO) {
            ngx_set_errno(NGX_EINVAL);
        }

        return NGX_INVALID_FILE;
    }

    if (ngx_fd_info(fd, &fi) == -1 || !ngx_is_file(&fi)) {
        close(fd);
        ngx_set_errno(NGX_EINVAL);
        return NGX_INVALID_FILE;
    }

    if (size) {
        *size = ngx_file_size(&fi);
    }

    return fd;
}


/*
 * Into one of the runner's FIFOs, never blocking: the runner holds each
 * open for reading, so ENXIO (or no FIFO) means the kernel is gone:
 * NGX_DECLINED.  A full FIFO already holds what we say: EAGAIN is fine.
 */

static ngx_int_t
ngx_http_hermes_local_fifo(ngx_fd_t dir, const char *name, u_char *data,
    size_t len, ngx_log_t *log)
{
    ngx_fd_t   fd;
    ngx_err_t  err;

    fd = openat(dir, name, O_WRONLY|O_NONBLOCK|O_NOFOLLOW|O_CLOEXEC);
    if (fd == -1) {
        err = ngx_errno;

        if (err == ENXIO || err == NGX_ENOENT) {
            return NGX_DECLINED;
        }

        ngx_log_error(NGX_LOG_ERR, log, err,
                      "hermes: openat(\"%s\") failed", name);
        return NGX_ERROR;
    }

    if (write(fd, data, len) == -1 && ngx_errno != NGX_EAGAIN) {
        ngx_log_error(NGX_LOG_ERR, log, ngx_errno,
                      "hermes: write(\"%s\") failed", name);
        close(fd);
        return NGX_ERROR;
    }

    close(fd);

    return NGX_OK;
}


/*
 * One byte into the kernel's "wake" (wake: its fd) says "look at cells/".
 * A full FIFO already says it.  NGX_DECLINED: the kernel is gone (no
 * reader: EPIPE).
 */

ngx_int_t
ngx_http_hermes_local_wake(ngx_fd_t wake, ngx_log_t *log)
{
    if (write(wake, "", 1) == -1 && ngx_errno != NGX_EAGAIN) {

        if (ngx_errno == NGX_EPIPE) {
            return NGX_DECLINED;
        }

        ngx_log_error(NGX_LOG_ERR, log, ngx_errno,
                      "hermes: write(\"wake\") failed");
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * A small request goes inline: its JSON and a newline in "wake" (its fd),
 * one write of at most PIPE_BUF bytes, which a FIFO takes whole or not at
 * all (EAGAIN).  The runner reads it there: no request file is made, renamed,
 * listed, read and removed.  NGX_DECLINED: the kernel is gone; NGX_AGAIN:
 * too large, or a line break in it, or the FIFO full: ship it as a file.
 */

ngx_int_t
ngx_http_hermes_local_ship_inline(ngx_fd_t wake, u_char *data, size_t len,
    ngx_log_t *log)
{
    ssize_t       n;
    ngx_err_t     err;
    struct iovec  iov[2];

    if (len + 1 > PIPE_BUF
        || ngx_strlchr(data, data + len, '\n') != NULL
        || ngx_strlchr(data, data + len, '\0') != NULL)
    {
        return NGX_AGAIN;
    }

    iov[0].iov_base = data;
    iov[0].iov_len = len;
    iov[1].iov_base = (void *) "\n";
    iov[1].iov_len = 1;

    n = writev(wake, iov, 2);
    err = ngx_errno;

    if (n == (ssize_t) len + 1) {
        return NGX_OK;
    }

    if (n == -1 && err == NGX_EAGAIN) {
        return NGX_AGAIN;
    }

    if (n == -1 && err == NGX_EPIPE) {
        return NGX_DECLINED;
    }

    ngx_log_error(NGX_LOG_ERR, log, err, "hermes: writev(\"wake\") failed");

    return NGX_ERROR;
}


/*
 * "N\n" into "intr": interrupt cell N.  NGX_DECLINED: it cannot be: the
 * kernel is gone, or the write failed (logged).
 */

ngx_int_t
ngx_http_hermes_local_interrupt(ngx_fd_t dir, uint32_t cell, ngx_log_t *log)
{
    u_char  buf[NGX_INT32_LEN + 1], *p;

    p = ngx_sprintf(buf, "%uD\n", cell);

    return (ngx_http_hermes_local_fifo(dir, "intr", buf, p - buf, log)
            == NGX_OK) ? NGX_OK : NGX_DECLINED;
}


/* a pool thread's clock: nginx's cached time is the event loop's */

static ngx_msec_t
ngx_http_hermes_local_now(void)
{
    struct timespec  ts;

    (void) clock_gettime(CLOCK_MONOTONIC, &ts);

    return (ngx_msec_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}


/*
 * Thread pool: wait for the runner's "ready" file naming pid, woken by
 * inotify when it is renamed into place and by the pid's pidfd when the
 * runner exits first; where either is missing, looked at every few ms.
 */

ngx_int_t
ngx_http_hermes_local_wait_ready(u_char *dir, ngx_pid_t pid, ngx_pid_t expect,
    ngx_msec_t timeout)
{
    int              ifd, pfd, n, wait;
    u_char           path[NGX_HTTP_HERMES_DIR_MAX + 16], buf[64];
    ngx_uint_t       exited;
    ssize_t          len;
    ngx_fd_t         fd;
    ngx_int_t        rc;
    ngx_msec_t       start, now;
    struct pollfd    pf[2];
    ngx_file_info_t  fi;
    u_char           events[1024];

    *ngx_slprintf(path, path + sizeof(path) - 1, "%s/ready", dir) = '\0';

    /* the watch before the first look: a rename between is seen */

    ifd = inotify_init1(IN_NONBLOCK|IN_CLOEXEC);

    if (ifd != -1
        && inotify_add_watch(ifd, (char *) dir,
                             IN_MOVED_TO|IN_CLOSE_WRITE|IN_ONLYDIR
                             |IN_DONT_FOLLOW)
           == -1)
    {
        close(ifd);
        ifd = -1;
    }

    pfd = (int) syscall(SYS_pidfd_open, pid, 0);

    rc = NGX_ERROR;
    start = ngx_http_hermes_local_now();

    exited = 0;

    for ( ;; ) {

        /* the runner's dir, where a FIFO must not pin a pool thread */
        fd = open((char *) path, O_RDONLY|O_CLOEXEC|O_NOFOLLOW|O_NONBLOCK);

        if (fd != -1) {
            len = (ngx_fd_info(fd, &fi) == 0 && ngx_is_file(&fi))
                  ? read(fd, buf, sizeof(buf) - 1) : -1;
            close(fd);

            if (len > 0) {
                buf[len] = '\0';
                rc = ngx_http_hermes_ready_pid(buf, expect);
                break;
            }
        }

        /* a zombie's pid answers kill(): its pidfd said it exited */

        if (exited || (kill(pid, 0) == -1 && ngx_errno == ESRCH)) {
            break;
        }

        now = ngx_http_hermes_local_now();

        if (now - start >= timeout) {
            break;
        }

        wait = (int) (timeout - (now - start));

        if (ifd == -1) {
            wait = ngx_min(wait, 8);

        } else if (pfd == -1) {
            wait = ngx_min(wait, 50);
        }

        n = 0;

        if (ifd != -1) {
            pf[n].fd = ifd;
            pf[n].events = POLLIN;
            n++;
        }

        if (pfd != -1) {
            pf[n].fd = pfd;
            pf[n].events = POLLIN;
            n++;
        }

        (void) poll(pf, n, wait);

        if (pfd != -1 && (pf[n - 1].revents & (POLLIN|POLLHUP|POLLERR))) {
            exited = 1;
        }

        if (ifd != -1) {
            while (read(ifd, events, sizeof(events)) > 0) { /* void */ }
        }
    }

    if (ifd != -1) {
        close(ifd);
    }

    if (pfd != -1) {
        close(pfd);
    }

    return rc;
}


/*
 * "ready" holds {"pid":N}: NGX_OK when N is the pid that was started, or
 * any pid when that is 0 (the runner sees its own in a pid namespace)
 */

ngx_int_t
ngx_http_hermes_ready_pid(u_char *buf, ngx_pid_t pid)
{
    u_char     *p, *q;
    ngx_int_t   got;

    p = (u_char *) ngx_strstr(buf, "\"pid\":");
    if (p == NULL) {
        return NGX_ERROR;
    }

    p += sizeof("\"pid\":") - 1;

    while (*p == ' ') {
        p++;
    }

    for (q = p; *q >= '0' && *q <= '9'; q++) { /* void */ }

    got = ngx_atoi(p, q - p);

    return (got == NGX_ERROR || (pid && got != pid)) ? NGX_ERROR : NGX_OK;
}


/*
 * The start time (field 22 of /proc/PID/stat, clock ticks after boot):
 * with the pid, it names one process for good.  The command name may hold
 * spaces and parentheses, so the fields are counted after the last ')'.
 */

ngx_int_t
ngx_http_hermes_proc_start(u_char *stat, size_t len, uint64_t *start)
{
    u_char      *p, *last, *q;
    ngx_uint_t   field;

    last = stat + len;

    for (p = last; p > stat && p[-1] != ')'; p--) { /* void */ }

    if (p == stat) {
        return NGX_ERROR;
    }

    /* p is past the ")": field 3, the state, comes first */

    for (field = 3; p < last; field++) {
        while (p < last && *p == ' ') {
            p++;
        }

        for (q = p; q < last && *q != ' ' && *q != '\n'; q++) { /* void */ }

        if (field == 22) {
            if (q == p) {
                return NGX_ERROR;
            }

            *start = (uint64_t) ngx_atoof(p, q - p);
            return (*start == (uint64_t) NGX_ERROR) ? NGX_ERROR : NGX_OK;
        }

        p = q;
    }

    return NGX_ERROR;
}


ngx_int_t
ngx_http_hermes_local_proc_start(ngx_pid_t pid, uint64_t *start)
{
    u_char    path[64], buf[1024];
    ssize_t   n;
    ngx_fd_t  fd;

    ngx_sprintf(path, "/proc/%P/stat%Z", pid);

    fd = open((char *) path, O_RDONLY|O_CLOEXEC);
    if (fd == -1) {
        return NGX_ERROR;
    }

    n = read(fd, buf, sizeof(buf));
    close(fd);

    if (n <= 0) {
        return NGX_ERROR;
    }

    return ngx_http_hermes_proc_start(buf, n, start);
}
