
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: what the rest of the module asks of a backend, through its
 * operations table (ngx_http_hermes_backend_ops_t), and where a new kernel
 * goes: host placement takes the kernels per host from the registry and
 * decides here, so the registry knows no backend.
 */


#include "ngx_hermes.h"

#include <sodium.h>


/* every backend there is: hermes_backend names one of them */

ngx_http_hermes_backend_ops_t  *ngx_http_hermes_backends[] = {
    &ngx_http_hermes_backend_local_ops,
    &ngx_http_hermes_backend_ssh_ops,
    NULL
};


ngx_http_hermes_backend_ops_t *
ngx_http_hermes_backend_ops(ngx_str_t *name)
{
    ngx_http_hermes_backend_ops_t  **o;

    for (o = ngx_http_hermes_backends; *o; o++) {
        if ((*o)->name.len == name->len
            && ngx_strncmp((*o)->name.data, name->data, name->len) == 0)
        {
            return *o;
        }
    }

    return NULL;
}


/* a worker, or the master before its last kills: each backend set up */

ngx_int_t
ngx_http_hermes_backend_init_process(ngx_cycle_t *cycle)
{
    ngx_http_hermes_backend_ops_t  **o;

    for (o = ngx_http_hermes_backends; *o; o++) {
        if ((*o)->init_process && (*o)->init_process(cycle) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/* event loop: a connection for a thread pool task */

void
ngx_http_hermes_backend_take(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_backend_conf_t *bcf, ngx_uint_t host)
{
    ngx_memzero(conn, sizeof(ngx_http_hermes_conn_t));

    conn->bcf = bcf;
    conn->host = host < bcf->nhosts ? host : 0;

    bcf->ops->take(conn);
}


/* event loop: the task is done with it */

void
ngx_http_hermes_backend_give(ngx_http_hermes_conn_t *conn)
{
    if (conn->bcf) {
        conn->bcf->ops->give(conn);
    }
}


/*
 * Thread pool: a command on the kernel's host.  NGX_DECLINED: the host
 * cannot be reached (nothing ran on it).
 */

ngx_int_t
ngx_http_hermes_backend_exec(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_cmd_t *cmd)
{
    return conn->bcf->ops->exec(conn, cmd);
}


/*
 * A command as logs show it, escaped: a script with arguments as
 * "sh -c SCRIPT hermes ARG..." (its text is in src/remote/; an empty
 * argument shown as ''), or the text.
 */

u_char *
ngx_http_hermes_cmd_text(u_char *p, u_char *last, ngx_http_hermes_cmd_t *cmd)
{
    ngx_uint_t  i;

    if (cmd->args == NULL) {
        return ngx_http_hermes_log_escape(p, last, (u_char *) cmd->cmd,
                                          ngx_strlen(cmd->cmd), 0);
    }

    p = ngx_slprintf(p, last, "sh -c SCRIPT hermes");

    for (i = 0; cmd->args[i]; i++) {
        if (cmd->args[i][0] == '\0') {
            p = ngx_slprintf(p, last, " ''");
            continue;
        }

        p = ngx_slprintf(p, last, " ");
        p = ngx_http_hermes_log_escape(p, last, (u_char *) cmd->args[i],
                                       ngx_strlen(cmd->args[i]), 0);
    }

    return p;
}


/*
 * Event loop: the host of a new kernel, by the backend's choice among
 * counts of the kernels (spawning ones included) each host has now.
 */

void
ngx_http_hermes_backend_place(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_backend_conf_t *bcf)
{
    ngx_uint_t  i, n;
    ngx_uint_t  counts[NGX_HTTP_HERMES_HOSTS];

    ref->host = 0;

    if (bcf->nhosts < 2) {
        return;
    }

    n = ngx_min(bcf->nhosts, NGX_HTTP_HERMES_HOSTS);

    ngx_http_hermes_registry_host_counts(zone, bcf->tag, counts, n);

    /* hosts this request found without its environment: the last resort */

    for (i = 0; i < n && i < 64; i++) {
        if (ref->avoid & ((uint64_t) 1 << i)) {
            counts[i] = NGX_MAX_INT32_VALUE;
        }
    }

    ref->host = bcf->ops->pick_host(bcf, counts);

    ngx_http_hermes_registry_set_host(zone, ref);
}


ngx_str_t *
ngx_http_hermes_backend_host_name(ngx_http_hermes_backend_conf_t *bcf,
    ngx_uint_t host)
{
    return bcf->ops->host_name(bcf, host < bcf->nhosts ? host : 0);
}


/* the backend of a registry entry, by the tag in its key; NULL: no more */

ngx_http_hermes_backend_conf_t *
ngx_http_hermes_backend_by_tag(ngx_http_hermes_main_conf_t *hmcf, u_char *tag)
{
    ngx_uint_t                        i;
    ngx_http_hermes_backend_conf_t  **bcfs;

    bcfs = hmcf->backends.elts;

    for (i = 0; i < hmcf->backends.nelts; i++) {
        if (ngx_memcmp(bcfs[i]->tag, tag, NGX_HTTP_HERMES_BACKEND_TAG_LEN)
            == 0)
        {
            return bcfs[i];
        }
    }

    return NULL;
}


/* a backend's identity in registry keys: a hash of what makes its place */

void
ngx_http_hermes_backend_tag(ngx_http_hermes_backend_conf_t *bcf,
    ngx_str_t *spec)
{
    u_char  hash[NGX_HTTP_HERMES_BACKEND_TAG_LEN / 2];

    crypto_generichash(hash, sizeof(hash), spec->data, spec->len, NULL, 0);
    ngx_hex_dump(bcf->tag, hash, sizeof(hash));
}


ngx_http_hermes_backend_conf_t *
ngx_http_hermes_backend_create(ngx_conf_t *cf,
    ngx_http_hermes_backend_ops_t *ops, ngx_str_t *root)
{
    u_char                           *p;
    ngx_str_t                         spec;
    ngx_http_hermes_main_conf_t      *hmcf;
    ngx_http_hermes_backend_conf_t   *bcf, **b;

    while (root->len > 1 && root->data[root->len - 1] == '/') {
        root->len--;
    }

    if (root->len == 0 || root->data[0] != '/') {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "hermes_backend root \"%V\" must be an absolute "
                           "path", root);
        return NULL;
    }

    /* root goes into single-quoted shell words and fixed-size buffers */

    for (p = root->data; p < root->data + root->len; p++) {
        if (*p == '\'' || *p < 0x20 || *p == 0x7f) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "hermes_backend root \"%V\" has a quote or a "
                               "control character", root);
            return NULL;
        }
    }

    if (root->len > NGX_HTTP_HERMES_DIR_MAX - 128) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "hermes_backend root \"%V\" is too long", root);
        return NULL;
    }

    bcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_hermes_backend_conf_t));
    if (bcf == NULL) {
        return NULL;
    }

    bcf->ops = ops;
    bcf->nhosts = 1;

    /* NUL-terminated: an argument of the host's scripts */

    bcf->root.len = root->len;
    bcf->root.data = ngx_pnalloc(cf->pool, root->len + 1);
    if (bcf->root.data == NULL) {
        return NULL;
    }

    *ngx_cpymem(bcf->root.data, root->data, root->len) = '\0';

    spec.data = ngx_pnalloc(cf->pool, root->len + sizeof("local "));
    if (spec.data == NULL) {
        return NULL;
    }

    spec.len = ngx_sprintf(spec.data, "local %V", root) - spec.data;

    ngx_http_hermes_backend_tag(bcf, &spec);

    hmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_hermes_module);

    b = ngx_array_push(&hmcf->backends);
    if (b == NULL) {
        return NULL;
    }

    *b = bcf;

    return bcf;
}
