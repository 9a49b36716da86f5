
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: warm pools, kernels spawned ahead for new sessions: their
 * configuration, each worker's refill and upkeep, their spawns.  What they
 * are in the zone (reserved, spawned, taken, swept) is the registry's
 * (ngx_http_hermes_registry_warm_*).
 */


#include "ngx_hermes.h"

#include <sodium.h>


/* a warm kernel being spawned: its own memory, freed when it is done */

typedef struct {
    ngx_pool_t                    *pool;
    ngx_http_hermes_zone_t        *zone;
    ngx_http_hermes_warm_t        *warm;
    ngx_uint_t                     host;
    ngx_msec_t                     spawn_at;
    ngx_event_t                    timer;
    ngx_http_hermes_kernel_ref_t   ref;
    u_char                         key[NGX_HTTP_HERMES_WARM_KEY_LEN];
} ngx_http_hermes_warm_spawn_t;

/* local warm kernels checked alive per upkeep: a full pool of one backend */
#define NGX_HTTP_HERMES_WARM_CHECK    NGX_HTTP_HERMES_WARM_MAX

/* a pool whose spawn failed waits this long before the next */
#define NGX_HTTP_HERMES_WARM_RETRY    30000

/* a warm spawn keeps a worker that shuts down at most this long */
#define NGX_HTTP_HERMES_WARM_WAIT     60000


static char *ngx_http_hermes_warm_pool_conf(ngx_conf_t *cf,
    ngx_http_hermes_loc_conf_t *hlcf, ngx_http_hermes_environment_t *env,
    ngx_uint_t want);
static void ngx_http_hermes_warm_handler(ngx_event_t *ev);
static ngx_int_t ngx_http_hermes_warm_spawn(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_warm_t *w, ngx_uint_t host, ngx_log_t *log);
static void ngx_http_hermes_warm_spawned(void *data, ngx_int_t rc,
    ngx_http_hermes_spawned_t *k, const char *err);
static void ngx_http_hermes_warm_wait(ngx_event_t *ev);


/* a worker's refill of the zone's warm pools: at once, then after takes
 * and sweeps */

ngx_int_t
ngx_http_hermes_warm_init_process(ngx_http_hermes_zone_t *zone,
    ngx_cycle_t *cycle)
{
    ngx_event_t  *ev;

    if (zone->warm == NULL) {
        return NGX_OK;
    }

    ev = ngx_pcalloc(cycle->pool, sizeof(ngx_event_t));
    if (ev == NULL) {
        return NGX_ERROR;
    }

    ev->handler = ngx_http_hermes_warm_handler;
    ev->data = zone;
    ev->log = cycle->log;
    ev->cancelable = 1;

    zone->warm_event = ev;

    ngx_add_timer(ev, 1);

    return NGX_OK;
}


/*
 * Warm pools, one per backend of a zone that has warm=, and one per
 * environment with warm= of the locations that allow it: what a location
 * spawns with, hashed.  Every location of the zone that uses the backend
 * must spawn alike: a new session of any of them takes the pool's kernels.
 */

char *
ngx_http_hermes_warm_conf(ngx_conf_t *cf,
    ngx_http_hermes_loc_conf_t *hlcf)
{
    ngx_uint_t                       i;
    ngx_http_hermes_environment_t  **env;

    if (ngx_http_hermes_warm_pool_conf(cf, hlcf, NULL, hlcf->backend->warm)
        != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    env = hlcf->environments ? hlcf->environments->elts : NULL;

    for (i = 0; env && i < hlcf->environments->nelts; i++) {
        if (env[i]->warm
            && ngx_http_hermes_warm_pool_conf(cf, hlcf, env[i], env[i]->warm)
               != NGX_CONF_OK)
        {
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_hermes_warm_pool_conf(ngx_conf_t *cf,
    ngx_http_hermes_loc_conf_t *hlcf, ngx_http_hermes_environment_t *env,
    ngx_uint_t want)
{
    u_char                          *p;
    uint32_t                         env_id;
    ngx_str_t                       *ro;
    ngx_uint_t                       i, k, hosts;
    ngx_array_t                     *lists[3];
    ngx_http_hermes_warm_t          *w, *found;
    ngx_http_hermes_zone_t          *zone;
    ngx_http_hermes_sandbox_t       *sb;
    ngx_http_hermes_remote_file_t   *rf;
    ngx_http_hermes_backend_conf_t  *bcf;
    crypto_generichash_state         st;
    u_char                           buf[256];
    u_char                           hash[NGX_HTTP_HERMES_WARM_HASH_LEN / 2];
    static ngx_str_t                 none = ngx_null_string;

    zone = hlcf->shm_zone->data;
    bcf = hlcf->backend;
    sb = hlcf->sandbox;
    env_id = env ? env->id : 0;

    /* the backend, the sandbox, the runner's idle clock, the runner */

    crypto_generichash_init(&st, NULL, 0, sizeof(hash));
    crypto_generichash_update(&st, bcf->tag, NGX_HTTP_HERMES_BACKEND_TAG_LEN);

    p = ngx_snprintf(buf, sizeof(buf), "|%ui|%V|%O|%O|%ui|%ui|%ui|%M|",
                     sb->mode, &sb->user, sb->memory, sb->tmp, sb->pids,
                     sb->cpu, (ngx_uint_t) sb->net, zone->idle_timeout);
    crypto_generichash_update(&st, buf, p - buf);

    /* and the environment: its tree, python, binds and settings */

    if (env) {
        p = ngx_snprintf(buf, sizeof(buf), "|env|%V|%V|%V|", &env->name,
                         &env->rootfs, &env->python);
        crypto_generichash_update(&st, buf, p - buf);
    }

    lists[0] = sb->ro;
    lists[1] = env ? env->ro : NULL;
    lists[2] = env ? env->rw : NULL;

    for (k = 0; k < 3; k++) {
        if (lists[k] == NULL) {
            continue;
        }

        ro = lists[k]->elts;

        for (i = 0; i < lists[k]->nelts; i++) {
            crypto_generichash_update(&st, ro[i].data, ro[i].len);
            crypto_generichash_update(&st, (u_char *) "", 1);
        }
    }

    if (env && env->env) {
        ro = env->env->elts;

        for (i = 0; i < env->env->nelts; i++) {
            crypto_generichash_update(&st, ro[i].data, ro[i].len);
            crypto_generichash_update(&st, (u_char *) "", 1);
        }
    }

    for (rf = ngx_http_hermes_remote_files; rf->len; rf++) {
        crypto_generichash_update(&st, rf->data, rf->len);
    }

    crypto_generichash_final(&st, hash, sizeof(hash));

    ngx_hex_dump(buf, hash, sizeof(hash));

    if (zone->warm == NULL) {
        zone->warm = ngx_array_create(cf->pool, 2,
                                      sizeof(ngx_http_hermes_warm_t));
        if (zone->warm == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    w = zone->warm->elts;
    found = NULL;

    for (i = 0; i < zone->warm->nelts; i++) {
        if (ngx_memcmp(w[i].tag, bcf->tag, NGX_HTTP_HERMES_BACKEND_TAG_LEN)
            != 0
            || w[i].env_id != env_id)
        {
            continue;
        }

        if (ngx_memcmp(w[i].hash, buf, NGX_HTTP_HERMES_WARM_HASH_LEN) == 0) {
            found = &w[i];
            continue;
        }

        if (w[i].n || want) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "warm=: the locations of hermes_zone \"%V\" "
                               "that use this backend%s%V spawn kernels "
                               "differently (hermes_sandbox); a warm pool "
                               "serves locations that spawn alike",
                               &zone->shm_zone->shm.name,
                               env ? " and environment " : "",
                               env ? &env->name : &none);
            return NGX_CONF_ERROR;
        }
    }

    if (found) {
        if (want > found->n) {
            found->n = want;
            found->hlcf = hlcf;
        }

        return NGX_CONF_OK;
    }

    w = ngx_array_push(zone->warm);
    if (w == NULL) {
        return NGX_CONF_ERROR;
    }

    hosts = bcf->nhosts;

    w->retry = ngx_pcalloc(cf->pool, hosts * sizeof(ngx_msec_t));
    if (w->retry == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_memcpy(w->tag, bcf->tag, NGX_HTTP_HERMES_BACKEND_TAG_LEN);
    ngx_memcpy(w->hash, buf, NGX_HTTP_HERMES_WARM_HASH_LEN);
    w->n = want;
    w->hlcf = hlcf;
    w->env = env;
    w->env_id = env_id;

    return NGX_CONF_OK;
}


static void
ngx_http_hermes_warm_handler(ngx_event_t *ev)
{
    ngx_http_hermes_warm_upkeep(ev->data, ev->log);
}


/*
 * A zone's warm pools: upkeep, then refill.  Run by the sweep, after a
 * take, and once when the worker starts.  Slots are reserved in the zone
 * first, so workers that refill together make N, not N per worker; the
 * spawns run in the thread pool.
 */

void
ngx_http_hermes_warm_upkeep(ngx_http_hermes_zone_t *zone, ngx_log_t *log)
{
    ngx_uint_t                       i, h, n, hosts, more;
    ngx_http_hermes_warm_t          *w;
    ngx_http_hermes_victims_t        victims;
    ngx_http_hermes_backend_conf_t  *bcf;
    ngx_http_hermes_victim_t         check[NGX_HTTP_HERMES_WARM_CHECK];

    if (ngx_exiting || ngx_quit || ngx_terminate) {
        /* a worker that shuts down leaves the pools to the new ones */
        return;
    }

    victims.n = 0;

    do {
        n = NGX_HTTP_HERMES_WARM_CHECK;
        more = ngx_http_hermes_registry_warm_sweep(zone, &victims, check, &n);

        for (i = 0; i < n; i++) {
            bcf = ngx_http_hermes_kernel_backend(&check[i]);

            /* where it cannot be told at once, a take finds out */

            if (bcf == NULL || bcf->ops->alive == NULL
                || bcf->ops->alive(&check[i]))
            {
                continue;
            }

            ngx_log_error(NGX_LOG_WARN, log, 0,
                          "hermes: warm kernel \"%s\" (pid %P) is gone, "
                          "replacing it", check[i].dir, check[i].pid);

            if (victims.n == NGX_HTTP_HERMES_VICTIMS) {
                ngx_http_hermes_kernel_kill_victims(zone->thread_pool,
                                                    &victims, log);
            }

            ngx_http_hermes_registry_warm_drop(zone, &check[i], &victims);
        }

        ngx_http_hermes_kernel_kill_victims(zone->thread_pool, &victims, log);
    } while (more);

    if (zone->warm == NULL) {
        return;
    }

    w = zone->warm->elts;

    for (i = 0; i < zone->warm->nelts; i++) {
        if (w[i].n == 0) {
            continue;
        }

        hosts = w[i].hlcf->backend->nhosts;

        for (h = 0; h < hosts; h++) {
            if ((ngx_msec_int_t) (w[i].retry[h] - ngx_current_msec) > 0) {
                continue;
            }

            while (ngx_http_hermes_warm_spawn(zone, &w[i], h, log) == NGX_OK)
            {
                /* void */
            }
        }
    }
}


/*
 * NGX_OK: a slot reserved and its spawn posted.  NGX_DECLINED: none now:
 * the pool or the registry is full, or the thread pool is.
 */

static ngx_int_t
ngx_http_hermes_warm_spawn(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_warm_t *w, ngx_uint_t host, ngx_log_t *log)
{
    ngx_int_t                      rc;
    ngx_pool_t                    *pool;
    ngx_http_hermes_warm_spawn_t  *ws;

    pool = ngx_create_pool(4096, log);
    if (pool == NULL) {
        return NGX_ERROR;
    }

    ws = ngx_pcalloc(pool, sizeof(ngx_http_hermes_warm_spawn_t));
    if (ws == NULL) {
        ngx_destroy_pool(pool);
        return NGX_ERROR;
    }

    ws->pool = pool;
    ws->zone = zone;
    ws->warm = w;
    ws->host = host;
    ws->ref.key.data = ws->key;

    if (ngx_http_hermes_registry_warm_reserve(zone, w, host, &ws->ref)
        != NGX_OK)
    {
        ngx_destroy_pool(pool);
        return NGX_DECLINED;
    }

    ws->spawn_at = ngx_current_msec;

    rc = ngx_http_hermes_kernel_spawn(w->hlcf, w->env, zone, &ws->ref, pool,
                                      ngx_http_hermes_warm_spawned, ws, log);
    if (rc != NGX_OK) {
        /* the thread pool is full: the next sweep tries again */
        ngx_http_hermes_registry_warm_failed(zone, &ws->ref, 0);
        ngx_destroy_pool(pool);
        return NGX_DECLINED;
    }

    /* a worker that shuts down waits for the spawn, as for a cell's */

    ws->timer.handler = ngx_http_hermes_warm_wait;
    ws->timer.data = ws;
    ws->timer.log = log;

    ngx_add_timer(&ws->timer, NGX_HTTP_HERMES_WARM_WAIT);

    return NGX_OK;
}


static void
ngx_http_hermes_warm_spawned(void *data, ngx_int_t rc,
    ngx_http_hermes_spawned_t *k, const char *err)
{
    ngx_http_hermes_warm_spawn_t *ws = data;

    ngx_http_hermes_victim_t   v;
    ngx_http_hermes_zone_t    *zone;

    zone = ws->zone;

    if (ws->timer.timer_set) {
        ngx_del_timer(&ws->timer);
    }

    if (rc != NGX_OK) {
        ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                      "hermes: spawning a warm kernel failed: %s; the pool "
                      "tries again in %ui s", err,
                      (ngx_uint_t) NGX_HTTP_HERMES_WARM_RETRY / 1000);

        ngx_http_hermes_registry_warm_failed(zone, &ws->ref, 1);
        ws->warm->retry[ws->host] = ngx_current_msec
                                    + NGX_HTTP_HERMES_WARM_RETRY;
        goto done;
    }

    if (ngx_http_hermes_registry_warm_spawned(zone, &ws->ref, k) != NGX_OK) {
        /* its slot went meanwhile (over the cap, a reclaim): it goes */

        ngx_memzero(&v, sizeof(ngx_http_hermes_victim_t));
        ngx_memcpy(v.dir, k->dir, k->dir_len + 1);
        v.dir_len = k->dir_len;
        v.pid = k->pid;
        v.start = k->start;
        v.ino = k->ino;
        v.host = ws->host;
        ngx_memcpy(v.tag, ws->warm->tag, NGX_HTTP_HERMES_BACKEND_TAG_LEN);

        (void) ngx_http_hermes_kernel_kill(zone->thread_pool,
                                           ws->warm->hlcf->backend, &v,
                                           ngx_cycle->log);
        goto done;
    }

    ngx_http_hermes_registry_observe(zone, NGX_HTTP_HERMES_HIST_SPAWN,
                                     ngx_current_msec - ws->spawn_at);
    ngx_http_hermes_registry_env_spawned(zone, ws->warm->env_id,
                                         ngx_current_msec - ws->spawn_at);

    ngx_log_error(NGX_LOG_INFO, ngx_cycle->log, 0,
                  "hermes: warm kernel %*s (pid %P) started",
                  (size_t) NGX_HTTP_HERMES_ID_LEN, k->kernel_id, k->pid);

done:

    ngx_destroy_pool(ws->pool);
}


static void
ngx_http_hermes_warm_wait(ngx_event_t *ev)
{
    ngx_http_hermes_warm_spawn_t *ws = ev->data;

    ngx_log_error(NGX_LOG_WARN, ev->log, 0,
                  "hermes: a warm kernel in \"%s\" is still starting",
                  ws->ref.dir);
}
