
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: the status location, hermes_status: the zone's figures as
 * JSON, as Prometheus text, or as the status page that reads the JSON.
 */


#include "ngx_hermes.h"
#include "ngx_hermes_json_gen.h"


/* the status location's ?format= */

typedef enum {
    NGX_HTTP_HERMES_STATUS_JSON = 0,
    NGX_HTTP_HERMES_STATUS_PROMETHEUS,
    NGX_HTTP_HERMES_STATUS_HTML
} ngx_http_hermes_status_format_e;


static void ngx_http_hermes_name_envs(ngx_http_request_t *r,
    ngx_http_hermes_stats_t *st);
static void ngx_http_hermes_name_hosts(ngx_http_request_t *r,
    ngx_http_hermes_stats_t *st);
static ngx_int_t ngx_http_hermes_status_page_send(ngx_http_request_t *r);
static ngx_buf_t *ngx_http_hermes_json_stats(ngx_pool_t *pool,
    ngx_http_hermes_stats_t *st, ngx_uint_t max_kernels, ngx_array_t *owners,
    ngx_array_t *cells);
static ngx_buf_t *ngx_http_hermes_prometheus_stats(ngx_pool_t *pool,
    ngx_http_hermes_stats_t *st, ngx_uint_t max_kernels, ngx_str_t *zone);
static void ngx_http_hermes_json_gen_owner(yajl_gen g, ngx_str_t *owner);


ngx_int_t
ngx_http_hermes_status_handler(ngx_http_request_t *r)
{
    ngx_int_t                    rc, refresh;
    ngx_str_t                    value;
    ngx_buf_t                   *b;
    ngx_uint_t                   format;
    ngx_array_t                  owners, cells;
    ngx_http_hermes_zone_t      *zone;
    ngx_http_hermes_stats_t      st;
    ngx_http_hermes_loc_conf_t  *hlcf;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    format = NGX_HTTP_HERMES_STATUS_JSON;

    if (ngx_http_arg(r, (u_char *) "format", 6, &value) == NGX_OK) {

        if (value.len == 10 && ngx_strncmp(value.data, "prometheus", 10) == 0)
        {
            format = NGX_HTTP_HERMES_STATUS_PROMETHEUS;

        } else if (value.len == 4 && ngx_strncmp(value.data, "html", 4) == 0)
        {
            format = NGX_HTTP_HERMES_STATUS_HTML;

        } else if (value.len != 4 || ngx_strncmp(value.data, "json", 4) != 0)
        {
            return ngx_http_hermes_response_send_error(r, NGX_HTTP_BAD_REQUEST,
                                                       "invalid_format",
                                                       "format must be "
                                                       "\"json\", "
                                                       "\"prometheus\" or "
                                                       "\"html\"");
        }
    }

    if (format == NGX_HTTP_HERMES_STATUS_HTML) {

        /* the page reads it from its own URL: refused here, not there */

        if (ngx_http_arg(r, (u_char *) "refresh", 7, &value) == NGX_OK) {
            refresh = ngx_atoi(value.data, value.len);

            if (refresh < 1 || refresh > 60) {
                return ngx_http_hermes_response_send_error(r,
                                                   NGX_HTTP_BAD_REQUEST,
                                                   "invalid_refresh",
                                                   "refresh must be seconds "
                                                   "from 1 to 60");
            }
        }

        return ngx_http_hermes_status_page_send(r);
    }

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hermes_module);
    zone = hlcf->shm_zone->data;

    if (ngx_array_init(&owners, r->pool, 8,
                       sizeof(ngx_http_hermes_owner_stats_t))
        != NGX_OK
        || ngx_array_init(&cells, r->pool, 8,
                          sizeof(ngx_http_hermes_listing_t))
           != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_hermes_registry_stats(zone, &st, &owners,
                                       format == NGX_HTTP_HERMES_STATUS_JSON
                                       ? &cells : NULL)
        != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_http_hermes_name_hosts(r, &st);
    ngx_http_hermes_name_envs(r, &st);

    if (format == NGX_HTTP_HERMES_STATUS_PROMETHEUS) {
        b = ngx_http_hermes_prometheus_stats(r->pool, &st, zone->max_kernels,
                                             &hlcf->shm_zone->shm.name);
        if (b == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_hermes_response_send_buf(r, NGX_HTTP_OK,
                                                 "text/plain; version=0.0.4",
                                                 b);
    }

    ngx_http_hermes_name_backends(r, &cells);

    b = ngx_http_hermes_json_stats(r->pool, &st, zone->max_kernels, &owners,
                                   &cells);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_hermes_response_send_buf(r, NGX_HTTP_OK, "application/json",
                                             b);
}


/*
 * The status page: a constant that renders the JSON form it fetches, so
 * nothing of the registry is ever written into HTML here.
 */

static ngx_int_t
ngx_http_hermes_status_page_send(ngx_http_request_t *r)
{
    ngx_buf_t  *b;

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->pos = ngx_http_hermes_status_page.data;
    b->last = b->pos + ngx_http_hermes_status_page.len;
    b->memory = 1;

    if (ngx_http_hermes_response_add_header(r, "Cache-Control", "no-store")
        != NGX_OK
        || ngx_http_hermes_response_add_header(r, "Content-Security-Policy",
                                  (char *) ngx_http_hermes_status_csp.data)
           != NGX_OK
        || ngx_http_hermes_response_add_header(r, "X-Content-Type-Options",
                                               "nosniff")
           != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_hermes_response_send_buf(r, NGX_HTTP_OK,
                                             "text/html; charset=utf-8", b);
}


/*
 * The hosts of the figures by name: "localhost" for local backends, the
 * configured host of ssh ones, "unknown" for a backend no longer in the
 * configuration, "other" for failures past the zone's table.  Hosts of one
 * name (local backends with other roots, one ssh host of two backends)
 * are summed; every configured host is listed, with zeros if need be.
 */

static void
ngx_http_hermes_name_hosts(ngx_http_request_t *r, ngx_http_hermes_stats_t *st)
{
    ngx_str_t                         name, *hn;
    ngx_uint_t                        i, j, k;
    ngx_http_hermes_host_stats_t     *h;
    ngx_http_hermes_main_conf_t      *hmcf;
    ngx_http_hermes_backend_conf_t  **bcfs, *bcf;

    hmcf = ngx_http_get_module_main_conf(r, ngx_http_hermes_module);
    bcfs = hmcf->backends.elts;

    for (i = 0; i < st->nhosts; i++) {
        h = &st->hosts[i];

        if (h->host == NGX_HTTP_HERMES_HOSTS) {
            ngx_str_set(&h->name, "other");
            continue;
        }

        ngx_str_set(&h->name, "unknown");

        bcf = ngx_http_hermes_backend_by_tag(hmcf, h->tag);

        if (bcf && h->host < bcf->nhosts) {
            h->name = *ngx_http_hermes_backend_host_name(bcf, h->host);
        }
    }

    /* the configured hosts that have no figures yet */

    for (i = 0; i < hmcf->backends.nelts; i++) {
        bcf = bcfs[i];

        for (j = 0; j < bcf->nhosts && st->nhosts <= NGX_HTTP_HERMES_HOSTS;
             j++)
        {
            name = *ngx_http_hermes_backend_host_name(bcf, j);

            for (k = 0; k < st->nhosts; k++) {
                hn = &st->hosts[k].name;

                if (hn->len == name.len
                    && ngx_strncmp(hn->data, name.data, name.len) == 0)
                {
                    break;
                }
            }

            if (k == st->nhosts) {
                h = &st->hosts[st->nhosts++];
                ngx_memzero(h, sizeof(ngx_http_hermes_host_stats_t));
                h->name = name;
            }
        }
    }

    /* one entry a name */

    for (i = 0; i < st->nhosts; i++) {
        for (j = i + 1; j < st->nhosts; /* void */) {
            if (st->hosts[j].name.len != st->hosts[i].name.len
                || ngx_strncmp(st->hosts[j].name.data, st->hosts[i].name.data,
                               st->hosts[i].name.len) != 0)
            {
                j++;
                continue;
            }

            st->hosts[i].kernels += st->hosts[j].kernels;
            st->hosts[i].spawn_failures += st->hosts[j].spawn_failures;
            st->hosts[j] = st->hosts[--st->nhosts];
        }
    }
}


/* the environments' names, from their ids (nginx.conf's, this cycle's) */

static void
ngx_http_hermes_name_envs(ngx_http_request_t *r, ngx_http_hermes_stats_t *st)
{
    ngx_uint_t                       i, k;
    ngx_http_hermes_main_conf_t     *hmcf;
    ngx_http_hermes_environment_t  **env;

    hmcf = ngx_http_get_module_main_conf(r, ngx_http_hermes_module);
    env = hmcf->environments.elts;

    for (i = 0; i < st->nenvs; i++) {
        ngx_str_set(&st->envs[i].name, "unknown");

        for (k = 0; k < hmcf->environments.nelts; k++) {
            if (env[k]->id == st->envs[i].id) {
                st->envs[i].name = env[k]->name;
                break;
            }
        }
    }
}


/*
 * $hermes_session, $hermes_kernel_id, $hermes_cell_status, $hermes_cell_ms,
 * $hermes_owner, $hermes_queue_ms, $hermes_lost_reason
 */


/* evictions_total{reason}: the order of ngx_http_hermes_stats_evictions() */

static ngx_str_t  ngx_http_hermes_eviction_names[] = {
    ngx_string("idle"),
    ngx_string("cap"),
    ngx_string("timeout"),
    ngx_string("deleted")
};

#define NGX_HTTP_HERMES_NEVICTIONS  4


typedef struct {
    ngx_str_t                     name;
    ngx_str_t                     help;
} ngx_http_hermes_hist_name_t;


static ngx_http_hermes_hist_name_t  ngx_http_hermes_hist_names[] = {
    { ngx_string("cell_duration_seconds"),
      ngx_string("Cells from their turn on the kernel (a new kernel's start "
                 "included) to their result.") },
    { ngx_string("queue_wait_seconds"),
      ngx_string("Time requests waited for their turn on a busy kernel.") },
    { ngx_string("spawn_duration_seconds"),
      ngx_string("Kernel starts that succeeded.") }
};


static void
ngx_http_hermes_stats_evictions(ngx_http_hermes_stats_t *st, ngx_uint_t *v)
{
    v[0] = st->evicted_idle_total;
    v[1] = st->evicted_cap_total;
    v[2] = st->killed_timeout_total;
    v[3] = st->evicted_deleted_total;
}


/* a bucket's upper bound in seconds, as Prometheus writes it: "0.025" */

static u_char *
ngx_http_hermes_stats_le(u_char *p, ngx_uint_t bucket)
{
    u_char      *last;
    ngx_msec_t   ms;

    if (bucket == NGX_HTTP_HERMES_BUCKETS - 1) {
        return ngx_cpymem(p, "+Inf", 4);
    }

    ms = ngx_http_hermes_buckets[bucket];

    if (ms % 1000 == 0) {
        return ngx_sprintf(p, "%M", ms / 1000);
    }

    last = ngx_sprintf(p, "%M.%03M", ms / 1000, ms % 1000);

    while (last[-1] == '0') {
        last--;
    }

    return last;
}


/* "200", or "other" for the answers past the table */

static u_char *
ngx_http_hermes_stats_code(u_char *p, ngx_http_hermes_answers_t *a)
{
    if (a->status == 0) {
        return ngx_cpymem(p, "other", 5);
    }

    return ngx_sprintf(p, "%ui", (ngx_uint_t) a->status);
}


static void
ngx_http_hermes_gen_number(yajl_gen g, ngx_uint_t v)
{
    yajl_gen_integer(g, (long long) v);
}


static void
ngx_http_hermes_gen_seconds(yajl_gen g, ngx_uint_t ms)
{
    u_char  num[NGX_INT_T_LEN + 8], *p;

    p = ngx_sprintf(num, "%ui.%03ui", ms / 1000, ms % 1000);
    yajl_gen_number(g, (const char *) num, p - num);
}


/* an owner as operators know it: the unset one is "\001anonymous" inside */

static void
ngx_http_hermes_json_gen_owner(yajl_gen g, ngx_str_t *owner)
{
    ngx_str_t  o;

    o = *owner;

    if (o.len && o.data[0] == '\001') {
        o.data++;
        o.len--;
    }

    ngx_http_hermes_gen_str(g, &o);
}


/*
 * The figures; the owners' and the running cells' (names of owners and
 * sessions: the status location is an operator's) follow when given.
 */

static ngx_buf_t *
ngx_http_hermes_json_stats(ngx_pool_t *pool, ngx_http_hermes_stats_t *st,
    ngx_uint_t max_kernels, ngx_array_t *owners, ngx_array_t *cells)
{
    u_char                          num[16], *p;
    yajl_gen                        g;
    ngx_buf_t                      *b;
    ngx_uint_t                      i, j, n, count;
    ngx_uint_t                      ev[NGX_HTTP_HERMES_NEVICTIONS];
    ngx_http_hermes_answers_t      *a;
    ngx_http_hermes_listing_t      *l;
    ngx_http_hermes_owner_stats_t  *o;

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        return NULL;
    }

#define ngx_http_hermes_gen_counter(name, v)                                  \
    ngx_http_hermes_gen_key(g, name);                                         \
    ngx_http_hermes_gen_number(g, v)

    yajl_gen_map_open(g);

    /* what answers: as Prometheus' hermes_build_info */
    ngx_http_hermes_gen_key(g, "module");
    yajl_gen_string(g, (u_char *) NGX_HTTP_HERMES_NAME,
                    sizeof(NGX_HTTP_HERMES_NAME) - 1);
    ngx_http_hermes_gen_key(g, "version");
    ngx_http_hermes_gen_str(g, &ngx_http_hermes_version);
    ngx_http_hermes_gen_key(g, "commit");
    ngx_http_hermes_gen_str(g, &ngx_http_hermes_commit);

    ngx_http_hermes_gen_counter("kernels", st->kernels);
    ngx_http_hermes_gen_counter("running", st->running);
    ngx_http_hermes_gen_counter("warm_kernels", st->warm);
    ngx_http_hermes_gen_counter("max_kernels", max_kernels);
    ngx_http_hermes_gen_counter("queue_depth", st->queued);

    ngx_http_hermes_gen_key(g, "host_kernels");
    yajl_gen_map_open(g);
    for (i = 0; i < st->nhosts; i++) {
        ngx_http_hermes_gen_str(g, &st->hosts[i].name);
        ngx_http_hermes_gen_number(g, st->hosts[i].kernels);
    }
    yajl_gen_map_close(g);

    if (owners) {
        o = owners->elts;

        ngx_http_hermes_gen_counter("owners", st->owners);

        ngx_http_hermes_gen_key(g, "owner_kernels");
        yajl_gen_map_open(g);
        for (i = 0; i < owners->nelts; i++) {
            ngx_http_hermes_json_gen_owner(g, &o[i].owner);
            ngx_http_hermes_gen_number(g, o[i].kernels);
        }
        yajl_gen_map_close(g);

        ngx_http_hermes_gen_key(g, "owner_running");
        yajl_gen_map_open(g);
        for (i = 0; i < owners->nelts; i++) {
            ngx_http_hermes_json_gen_owner(g, &o[i].owner);
            ngx_http_hermes_gen_number(g, o[i].running);
        }
        yajl_gen_map_close(g);
    }

    if (cells) {
        l = cells->elts;

        ngx_http_hermes_gen_key(g, "running_cells");
        yajl_gen_array_open(g);
        for (i = 0; i < cells->nelts; i++) {
            yajl_gen_map_open(g);
            ngx_http_hermes_gen_key(g, "owner");
            ngx_http_hermes_json_gen_owner(g, &l[i].owner);
            ngx_http_hermes_gen_key(g, "session");
            ngx_http_hermes_gen_str(g, &l[i].session);
            ngx_http_hermes_gen_key(g, "kernel_id");
            yajl_gen_string(g, l[i].kernel_id, NGX_HTTP_HERMES_ID_LEN);
            ngx_http_hermes_gen_key(g, "backend");
            ngx_http_hermes_gen_str(g, &l[i].backend_name);
            ngx_http_hermes_gen_key(g, "host");
            ngx_http_hermes_gen_str(g, &l[i].host_name);
            ngx_http_hermes_gen_counter("execution_count",
                                        l[i].execution_count);
            ngx_http_hermes_gen_counter("running_for_ms", l[i].running_for);
            ngx_http_hermes_gen_counter("queued", l[i].queued);
            yajl_gen_map_close(g);
        }
        yajl_gen_array_close(g);
    }

    ngx_http_hermes_gen_counter("zone_used_bytes", st->zone_bytes_used);
    ngx_http_hermes_gen_counter("zone_size_bytes", st->zone_bytes_total);
    ngx_http_hermes_gen_counter("spawned_total", st->spawned_total);

    ngx_http_hermes_gen_key(g, "spawn_failures_total");
    yajl_gen_map_open(g);
    for (i = 0; i < st->nhosts; i++) {
        ngx_http_hermes_gen_str(g, &st->hosts[i].name);
        ngx_http_hermes_gen_number(g, st->hosts[i].spawn_failures);
    }
    yajl_gen_map_close(g);

    ngx_http_hermes_stats_evictions(st, ev);

    ngx_http_hermes_gen_key(g, "evictions_total");
    yajl_gen_map_open(g);
    for (i = 0; i < NGX_HTTP_HERMES_NEVICTIONS; i++) {
        ngx_http_hermes_gen_str(g, &ngx_http_hermes_eviction_names[i]);
        ngx_http_hermes_gen_number(g, ev[i]);
    }
    yajl_gen_map_close(g);

    ngx_http_hermes_gen_key(g, "cells_total");
    yajl_gen_map_open(g);
    for (i = 0; i < NGX_HTTP_HERMES_CELL_NSTATUS; i++) {
        ngx_http_hermes_gen_str(g, &ngx_http_hermes_cell_status_names[i]);
        ngx_http_hermes_gen_number(g, st->cells_total[i]);
    }
    yajl_gen_map_close(g);

    ngx_http_hermes_gen_counter("tool_calls_total", st->tool_calls_total);

    ngx_http_hermes_gen_key(g, "rpc_rejected_total");
    yajl_gen_map_open(g);
    for (i = 0; i < NGX_HTTP_HERMES_RPC_NREJECT; i++) {
        ngx_http_hermes_gen_str(g, &ngx_http_hermes_rpc_reject_names[i]);
        ngx_http_hermes_gen_number(g, st->rpc_rejected_total[i]);
    }
    yajl_gen_map_close(g);

    ngx_http_hermes_gen_counter("mcp_sessions", st->mcp_sessions);

    /* by environment: kernels now, spawns and their time so far */

    ngx_http_hermes_gen_key(g, "environments");
    yajl_gen_map_open(g);
    for (i = 0; i < st->nenvs; i++) {
        ngx_http_hermes_gen_str(g, &st->envs[i].name);
        yajl_gen_map_open(g);
        ngx_http_hermes_gen_counter("kernels", st->envs[i].kernels);
        ngx_http_hermes_gen_counter("spawns_total", st->envs[i].spawns);
        ngx_http_hermes_gen_key(g, "spawn_seconds_sum");
        p = ngx_slprintf(num, num + sizeof(num), "%ui.%03ui",
                         st->envs[i].spawn_ms / 1000,
                         st->envs[i].spawn_ms % 1000);
        yajl_gen_number(g, (const char *) num, p - num);
        yajl_gen_map_close(g);
    }
    yajl_gen_map_close(g);

    ngx_http_hermes_gen_key(g, "mcp_requests_total");
    yajl_gen_map_open(g);
    for (i = 0; i < NGX_HTTP_HERMES_MCP_NMETHOD; i++) {
        ngx_http_hermes_gen_str(g, &ngx_http_hermes_mcp_method_names[i]);
        ngx_http_hermes_gen_number(g, st->mcp_requests_total[i]);
    }
    yajl_gen_map_close(g);

    ngx_http_hermes_gen_key(g, "mcp_tool_calls_total");
    yajl_gen_map_open(g);
    for (i = 0; i < NGX_HTTP_HERMES_MCP_NTOOL; i++) {
        ngx_http_hermes_gen_str(g, &ngx_http_hermes_mcp_tool_names[i]);
        ngx_http_hermes_gen_number(g, st->mcp_tool_calls_total[i]);
    }
    yajl_gen_map_close(g);

    /* by code, then error code ("" for none): answers come sorted */

    ngx_http_hermes_gen_key(g, "responses_total");
    yajl_gen_map_open(g);
    for (i = 0; i < st->nanswers; i = j) {
        p = ngx_http_hermes_stats_code(num, &st->answers[i]);
        yajl_gen_string(g, num, p - num);

        yajl_gen_map_open(g);
        for (j = i; j < st->nanswers; j++) {
            a = &st->answers[j];

            if (a->status != st->answers[i].status) {
                break;
            }

            yajl_gen_string(g, a->error, a->error_len);
            ngx_http_hermes_gen_number(g, a->count);
        }
        yajl_gen_map_close(g);
    }
    yajl_gen_map_close(g);

    /* histograms: cumulative buckets as in Prometheus */

    for (i = 0; i < NGX_HTTP_HERMES_NHIST; i++) {
        ngx_http_hermes_gen_str(g, &ngx_http_hermes_hist_names[i].name);
        yajl_gen_map_open(g);

        ngx_http_hermes_gen_key(g, "buckets");
        yajl_gen_map_open(g);

        count = 0;

        for (n = 0; n < NGX_HTTP_HERMES_BUCKETS; n++) {
            count += st->hist[i][n];
            p = ngx_http_hermes_stats_le(num, n);
            yajl_gen_string(g, num, p - num);
            ngx_http_hermes_gen_number(g, count);
        }

        yajl_gen_map_close(g);

        ngx_http_hermes_gen_key(g, "sum");
        ngx_http_hermes_gen_seconds(g, st->hist_sum_ms[i]);
        ngx_http_hermes_gen_counter("count", count);

        yajl_gen_map_close(g);
    }

    yajl_gen_map_close(g);

#undef ngx_http_hermes_gen_counter

    b = ngx_http_hermes_json_take(pool, g, 1);

    yajl_gen_free(g);

    return b;
}


/* a label value: backslash, double quote and newline escaped */

static ngx_int_t
ngx_http_hermes_prom_label(ngx_pool_t *pool, ngx_str_t *dst, ngx_str_t *src)
{
    u_char  *p, *s;

    p = ngx_pnalloc(pool, 2 * src->len + 1);
    if (p == NULL) {
        return NGX_ERROR;
    }

    dst->data = p;

    for (s = src->data; s < src->data + src->len; s++) {
        if (*s == '\\' || *s == '"') {
            *p++ = '\\';
            *p++ = *s;

        } else if (*s == '\n') {
            *p++ = '\\';
            *p++ = 'n';

        } else {
            *p++ = *s;
        }
    }

    dst->len = p - dst->data;

    return NGX_OK;
}


static ngx_buf_t *
ngx_http_hermes_prometheus_stats(ngx_pool_t *pool,
    ngx_http_hermes_stats_t *st, ngx_uint_t max_kernels, ngx_str_t *zone)
{
    u_char                       *p, *q;
    size_t                        size;
    ngx_str_t                     z, *names;
    ngx_buf_t                    *b;
    ngx_uint_t                    i, j, count;
    ngx_uint_t                    ev[NGX_HTTP_HERMES_NEVICTIONS];
    ngx_http_hermes_answers_t    *a;
    ngx_http_hermes_hist_name_t  *h;

    if (ngx_http_hermes_prom_label(pool, &z, zone) != NGX_OK) {
        return NULL;
    }

    names = ngx_palloc(pool, (st->nhosts + 1) * sizeof(ngx_str_t));
    if (names == NULL) {
        return NULL;
    }

    /* HELP and TYPE lines, then a sample line at most this long each */

    size = 8192 + ngx_http_hermes_version.len + ngx_http_hermes_commit.len;

    for (i = 0; i < st->nhosts; i++) {
        if (ngx_http_hermes_prom_label(pool, &names[i], &st->hosts[i].name)
            != NGX_OK)
        {
            return NULL;
        }

        size += 2 * (128 + z.len + names[i].len);
    }

    size += (st->nanswers + NGX_HTTP_HERMES_NHIST
                            * (NGX_HTTP_HERMES_BUCKETS + 2)
             + NGX_HTTP_HERMES_CELL_NSTATUS + NGX_HTTP_HERMES_RPC_NREJECT
             + NGX_HTTP_HERMES_NEVICTIONS + NGX_HTTP_HERMES_MCP_NMETHOD
             + NGX_HTTP_HERMES_MCP_NTOOL + 3 * NGX_HTTP_HERMES_ENVS + 16)
            * (128 + NGX_HTTP_HERMES_ERROR_MAX + z.len);

    b = ngx_create_temp_buf(pool, size);
    if (b == NULL) {
        return NULL;
    }

    p = b->last;

#define ngx_http_hermes_prom_family(name, type, help)                         \
    p = ngx_sprintf(p, "# HELP hermes_" name " " help "\n"                    \
                       "# TYPE hermes_" name " " type "\n")

#define ngx_http_hermes_prom(name, type, help, v)                             \
    ngx_http_hermes_prom_family(name, type, help);                            \
    p = ngx_sprintf(p, "hermes_" name "{zone=\"%V\"} %ui\n", &z,            \
                    (ngx_uint_t) (v))

    /*
     * the gateway's, not the zone's: no zone label; its values need no
     * escaping (src/version.sh lets no backslash, quote or newline in)
     */

    ngx_http_hermes_prom_family("build_info", "gauge",
                                "The module's version and the commit it "
                                "was built from; always 1.");
    p = ngx_sprintf(p, "hermes_build_info{version=\"%V\",commit=\"%V\"} "
                    "1\n", &ngx_http_hermes_version, &ngx_http_hermes_commit);

    ngx_http_hermes_prom("kernels", "gauge",
                         "Kernels in the registry (starting, idle or "
                         "running).", st->kernels);
    ngx_http_hermes_prom("running", "gauge", "Kernels running a cell.",
                         st->running);
    ngx_http_hermes_prom("warm_kernels", "gauge",
                         "Warm kernels ready for new sessions (counted in "
                         "kernels too).", st->warm);
    ngx_http_hermes_prom("max_kernels", "gauge", "The registry's cap.",
                         max_kernels);
    ngx_http_hermes_prom("queue_depth", "gauge",
                         "Cells waiting now for their turn on a busy "
                         "kernel.", st->queued);
    ngx_http_hermes_prom("owners", "gauge",
                         "Owners with kernels in the registry.", st->owners);

    if (st->nhosts) {
        ngx_http_hermes_prom_family("host_kernels", "gauge",
                                    "Kernels in the registry by kernel "
                                    "host.");
        for (i = 0; i < st->nhosts; i++) {
            p = ngx_sprintf(p, "hermes_host_kernels{zone=\"%V\",host=\"%V\"} "
                            "%ui\n", &z, &names[i], st->hosts[i].kernels);
        }
    }

    ngx_http_hermes_prom("zone_used_bytes", "gauge",
                         "Shared memory of the zone in use.",
                         st->zone_bytes_used);
    ngx_http_hermes_prom("zone_size_bytes", "gauge",
                         "Shared memory size of the zone.",
                         st->zone_bytes_total);
    ngx_http_hermes_prom("spawned_total", "counter", "Kernels started.",
                         st->spawned_total);

    if (st->nhosts) {
        ngx_http_hermes_prom_family("spawn_failures_total", "counter",
                                    "Kernel starts that failed, by kernel "
                                    "host.");
        for (i = 0; i < st->nhosts; i++) {
            p = ngx_sprintf(p, "hermes_spawn_failures_total{zone=\"%V\","
                            "host=\"%V\"} %ui\n", &z, &names[i],
                            st->hosts[i].spawn_failures);
        }
    }

    ngx_http_hermes_stats_evictions(st, ev);

    ngx_http_hermes_prom_family("evictions_total", "counter",
                                "Kernels killed and removed from the "
                                "registry, by reason.");
    for (i = 0; i < NGX_HTTP_HERMES_NEVICTIONS; i++) {
        p = ngx_sprintf(p, "hermes_evictions_total{zone=\"%V\",reason=\"%V\"} "
                        "%ui\n", &z, &ngx_http_hermes_eviction_names[i],
                        ev[i]);
    }

    ngx_http_hermes_prom_family("cells_total", "counter",
                                "Cells by final status.");
    for (i = 0; i < NGX_HTTP_HERMES_CELL_NSTATUS; i++) {
        p = ngx_sprintf(p, "hermes_cells_total{zone=\"%V\",status=\"%V\"} "
                        "%ui\n", &z, &ngx_http_hermes_cell_status_names[i],
                        st->cells_total[i]);
    }

    ngx_http_hermes_prom("tool_calls_total", "counter",
                         "Tool calls dispatched.", st->tool_calls_total);

    ngx_http_hermes_prom_family("rpc_rejected_total", "counter",
                                "RPC requests removed unanswered, by "
                                "reason.");
    for (i = 0; i < NGX_HTTP_HERMES_RPC_NREJECT; i++) {
        p = ngx_sprintf(p, "hermes_rpc_rejected_total{zone=\"%V\","
                        "reason=\"%V\"} %ui\n", &z,
                        &ngx_http_hermes_rpc_reject_names[i],
                        st->rpc_rejected_total[i]);
    }

    ngx_http_hermes_prom("mcp_sessions", "gauge",
                         "hermes_mcp client sessions open.",
                         st->mcp_sessions);

    if (st->nenvs) {
        ngx_http_hermes_prom_family("environment_kernels", "gauge",
                                    "Kernels by environment.");
        for (i = 0; i < st->nenvs; i++) {
            p = ngx_sprintf(p, "hermes_environment_kernels{zone=\"%V\","
                            "environment=\"%V\"} %ui\n", &z,
                            &st->envs[i].name, st->envs[i].kernels);
        }

        ngx_http_hermes_prom_family("environment_spawns_total", "counter",
                                    "Kernels spawned by environment.");
        for (i = 0; i < st->nenvs; i++) {
            p = ngx_sprintf(p, "hermes_environment_spawns_total{zone=\"%V\","
                            "environment=\"%V\"} %ui\n", &z,
                            &st->envs[i].name, st->envs[i].spawns);
        }

        ngx_http_hermes_prom_family("environment_spawn_seconds_sum",
                                    "counter",
                                    "Time spent spawning, by environment.");
        for (i = 0; i < st->nenvs; i++) {
            p = ngx_sprintf(p, "hermes_environment_spawn_seconds_sum{"
                            "zone=\"%V\",environment=\"%V\"} %ui.%03ui\n",
                            &z, &st->envs[i].name,
                            st->envs[i].spawn_ms / 1000,
                            st->envs[i].spawn_ms % 1000);
        }
    }

    ngx_http_hermes_prom_family("mcp_requests_total", "counter",
                                "hermes_mcp requests by JSON-RPC method.");
    for (i = 0; i < NGX_HTTP_HERMES_MCP_NMETHOD; i++) {
        p = ngx_sprintf(p, "hermes_mcp_requests_total{zone=\"%V\","
                        "method=\"%V\"} %ui\n", &z,
                        &ngx_http_hermes_mcp_method_names[i],
                        st->mcp_requests_total[i]);
    }

    ngx_http_hermes_prom_family("mcp_tool_calls_total", "counter",
                                "hermes_mcp tools/call requests by tool.");
    for (i = 0; i < NGX_HTTP_HERMES_MCP_NTOOL; i++) {
        p = ngx_sprintf(p, "hermes_mcp_tool_calls_total{zone=\"%V\","
                        "tool=\"%V\"} %ui\n", &z,
                        &ngx_http_hermes_mcp_tool_names[i],
                        st->mcp_tool_calls_total[i]);
    }

    if (st->nanswers) {
        ngx_http_hermes_prom_family("responses_total", "counter",
                                    "Answers of hermes locations by HTTP "
                                    "status and error code.");
        for (i = 0; i < st->nanswers; i++) {
            a = &st->answers[i];
            p = ngx_sprintf(p, "hermes_responses_total{zone=\"%V\",code=\"",
                            &z);
            p = ngx_http_hermes_stats_code(p, a);
            p = ngx_sprintf(p, "\",error=\"%*s\"} %uA\n",
                            (size_t) a->error_len, a->error, a->count);
        }
    }

    for (i = 0; i < NGX_HTTP_HERMES_NHIST; i++) {
        h = &ngx_http_hermes_hist_names[i];

        p = ngx_sprintf(p, "# HELP hermes_%V %V\n"
                           "# TYPE hermes_%V histogram\n",
                        &h->name, &h->help, &h->name);

        count = 0;

        for (j = 0; j < NGX_HTTP_HERMES_BUCKETS; j++) {
            count += st->hist[i][j];

            p = ngx_sprintf(p, "hermes_%V_bucket{zone=\"%V\",le=\"",
                            &h->name, &z);
            q = ngx_http_hermes_stats_le(p, j);
            p = ngx_sprintf(q, "\"} %ui\n", count);
        }

        p = ngx_sprintf(p, "hermes_%V_sum{zone=\"%V\"} %ui.%03ui\n"
                           "hermes_%V_count{zone=\"%V\"} %ui\n",
                        &h->name, &z, st->hist_sum_ms[i] / 1000,
                        st->hist_sum_ms[i] % 1000, &h->name, &z, count);
    }

#undef ngx_http_hermes_prom
#undef ngx_http_hermes_prom_family

    b->last = p;

    return b;
}
