
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: the kernel registry in the hermes_zone shared memory.
 *
 * An rbtree keyed by a crc32 of "owner \0 backend \0 session" (collisions
 * resolved by comparing the keys) and an LRU queue, as in
 * ngx_http_limit_req_module.c.  Every worker sees the same entries; the
 * zone is reused across reloads.
 *
 * The upper half of a node's key is a crc32 of the owner alone: an owner's
 * entries are one run of the tree, walked in O(log n + its entries) to
 * count its kernels (max_kernels_per_owner), list or shut them down.  With
 * 32-bit keys the key is the owner's crc32 only; lookups stay O(log n), by
 * comparing the keys.
 *
 * Cells on one kernel run one at a time in arrival order: a request takes
 * ticket_next++ and runs when ticket_serving reaches its ticket.
 */


#include "ngx_hermes.h"
#include "ngx_hermes_registry_zone.h"

#include <sodium.h>


ngx_str_t  ngx_http_hermes_lost_names[] = {
    ngx_string(""),
    ngx_string("idle"),
    ngx_string("cap"),
    ngx_string("deleted"),
    ngx_string("died"),
    ngx_string("timeout"),
    ngx_string("memory"),
    ngx_null_string
};


static ngx_rbtree_key_t ngx_http_hermes_registry_key(
    ngx_http_hermes_kernel_ref_t *ref, uint32_t *ohash);
static ngx_http_hermes_node_t *ngx_http_hermes_registry_lookup(
    ngx_http_hermes_zone_t *zone, ngx_str_t *key, ngx_rbtree_key_t hash);
static ngx_http_hermes_node_t *ngx_http_hermes_registry_owner_next(
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner, uint32_t ohash,
    ngx_http_hermes_node_t *kn);
static ngx_int_t ngx_http_hermes_registry_owner_room(
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner, uint32_t ohash,
    ngx_http_hermes_victims_t *victims);
static ngx_int_t ngx_libc_cdecl ngx_http_hermes_registry_recent_first(
    const void *one, const void *two);
static void ngx_http_hermes_registry_rbtree_insert(ngx_rbtree_node_t *temp,
    ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel);
static ngx_int_t ngx_http_hermes_registry_turn(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn, ngx_http_hermes_kernel_ref_t *ref,
    ngx_str_t *root);
static void ngx_http_hermes_registry_kernel_up(ngx_http_hermes_node_t *kn,
    ngx_http_hermes_spawned_t *k);
static void ngx_http_hermes_registry_new_kernel(ngx_http_hermes_node_t *kn,
    ngx_str_t *root);
static void ngx_http_hermes_registry_snapshot(ngx_http_hermes_node_t *kn,
    ngx_http_hermes_kernel_ref_t *ref);
static void ngx_http_hermes_registry_delete(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn);
static void ngx_http_hermes_registry_set_state(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn, ngx_uint_t state);
static void ngx_http_hermes_registry_touch(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn);
static void ngx_http_hermes_registry_end_turn(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn);
static void ngx_http_hermes_registry_mcp_end(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn);
static ngx_int_t ngx_http_hermes_registry_evict(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn, ngx_http_hermes_victims_t *victims);
static ngx_int_t ngx_http_hermes_registry_retire(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn, ngx_http_hermes_victims_t *victims,
    ngx_uint_t reason);
static ngx_int_t ngx_http_hermes_registry_victim(ngx_http_hermes_node_t *kn,
    ngx_http_hermes_victims_t *victims, ngx_pid_t pid);
static ngx_uint_t ngx_http_hermes_registry_evict_lru(
    ngx_http_hermes_zone_t *zone, ngx_http_hermes_victims_t *victims,
    ngx_uint_t tombstones);
static void ngx_http_hermes_registry_sweep_locked(
    ngx_http_hermes_zone_t *zone, ngx_http_hermes_victims_t *victims,
    ngx_uint_t full);
static ngx_int_t ngx_http_hermes_registry_reap(ngx_http_hermes_zone_t *zone,
    ngx_queue_t *queue, ngx_http_hermes_victims_t *victims, uint64_t now);
static void ngx_http_hermes_registry_reclaim(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn, ngx_http_hermes_victims_t *victims,
    uint64_t now);
static void ngx_http_hermes_registry_host_failed(ngx_http_hermes_zone_t *zone,
    u_char *tag, ngx_uint_t host);
static ngx_http_hermes_host_stats_t *ngx_http_hermes_registry_host(
    ngx_http_hermes_stats_t *st, u_char *tag, ngx_uint_t host);
static ngx_int_t ngx_http_hermes_registry_owners(ngx_http_hermes_zone_t *zone,
    ngx_array_t *owners);
static ngx_int_t ngx_http_hermes_registry_cells(ngx_http_hermes_zone_t *zone,
    ngx_array_t *cells);
static ngx_int_t ngx_libc_cdecl ngx_http_hermes_registry_owner_order(
    const void *one, const void *two);
static ngx_int_t ngx_libc_cdecl ngx_http_hermes_registry_oldest_first(
    const void *one, const void *two);
static ngx_int_t ngx_libc_cdecl ngx_http_hermes_registry_answer_order(
    const void *one, const void *two);
static ngx_int_t ngx_http_hermes_registry_warm_take(
    ngx_http_hermes_zone_t *zone, ngx_http_hermes_node_t *kn,
    ngx_http_hermes_kernel_ref_t *ref);
static ngx_uint_t ngx_http_hermes_registry_warm_evict(
    ngx_http_hermes_zone_t *zone, ngx_http_hermes_victims_t *victims);


#define ngx_http_hermes_node_dir(kn)   ((kn)->data + (kn)->key_len)

/* the key is "owner \0 backend-tag \0 session" */
#define ngx_http_hermes_node_tag(kn)   ((kn)->data + (kn)->owner_len + 1)
#define ngx_http_hermes_node_session(kn)                                      \
    (ngx_http_hermes_node_tag(kn) + NGX_HTTP_HERMES_BACKEND_TAG_LEN + 1)

#define ngx_http_hermes_pending(kn)                                           \
    ((uint32_t) ((kn)->ticket_next - (kn)->ticket_serving))

/* the histograms' buckets, ms: 5 ms .. 60 s, then +Inf */

ngx_msec_t  ngx_http_hermes_buckets[NGX_HTTP_HERMES_BUCKETS - 1] = {
    5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000
};


#if (NGX_PTR_SIZE == 8)
#define ngx_http_hermes_rbkey(ohash, hash)                                    \
    ((ngx_rbtree_key_t) (ohash) << 32 | (hash))
#define ngx_http_hermes_rbkey_owner(key)   ((uint32_t) ((key) >> 32))
#else
#define ngx_http_hermes_rbkey(ohash, hash)  ((ngx_rbtree_key_t) (ohash))
#define ngx_http_hermes_rbkey_owner(key)   ((uint32_t) (key))
#endif


ngx_int_t
ngx_http_hermes_registry_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_hermes_zone_t  *ozone = data;

    u_char                   id[NGX_HTTP_HERMES_TAG_HEX / 2];
    size_t                   len;
    ngx_http_hermes_zone_t  *zone;

    zone = shm_zone->data;

    if (ozone) {
        zone->sh = ozone->sh;
        zone->counters = &zone->sh->counters;
        zone->shpool = ozone->shpool;
        return NGX_OK;
    }

    zone->shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    if (shm_zone->shm.exists) {
        zone->sh = zone->shpool->data;
        zone->counters = &zone->sh->counters;
        return NGX_OK;
    }

    zone->sh = ngx_slab_alloc(zone->shpool, sizeof(ngx_http_hermes_sh_t));
    if (zone->sh == NULL) {
        return NGX_ERROR;
    }

    ngx_memzero(zone->sh, sizeof(ngx_http_hermes_sh_t));
    zone->counters = &zone->sh->counters;

    randombytes_buf(id, sizeof(id));
    ngx_hex_dump(zone->sh->instance, id, sizeof(id));

    zone->shpool->data = zone->sh;

    ngx_rbtree_init(&zone->sh->rbtree, &zone->sh->sentinel,
                    ngx_http_hermes_registry_rbtree_insert);

    ngx_queue_init(&zone->sh->lru);
    ngx_queue_init(&zone->sh->lost);

    len = sizeof(" in hermes_zone \"\"") + shm_zone->shm.name.len;

    zone->shpool->log_ctx = ngx_slab_alloc(zone->shpool, len);
    if (zone->shpool->log_ctx == NULL) {
        return NGX_ERROR;
    }

    ngx_sprintf(zone->shpool->log_ctx, " in hermes_zone \"%V\"%Z",
                &shm_zone->shm.name);

    zone->shpool->log_nomem = 0;

    return NGX_OK;
}


static void
ngx_http_hermes_registry_rbtree_insert(ngx_rbtree_node_t *temp,
    ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel)
{
    ngx_rbtree_node_t       **p;
    ngx_http_hermes_node_t   *kn, *knt;

    for ( ;; ) {

        if (node->key < temp->key) {
            p = &temp->left;

        } else if (node->key > temp->key) {
            p = &temp->right;

        } else { /* node->key == temp->key */

            kn = (ngx_http_hermes_node_t *) node;
            knt = (ngx_http_hermes_node_t *) temp;

            p = (ngx_memn2cmp(kn->data, knt->data, kn->key_len, knt->key_len)
                 < 0) ? &temp->left : &temp->right;
        }

        if (*p == sentinel) {
            break;
        }

        temp = *p;
    }

    *p = node;
    node->parent = temp;
    node->left = sentinel;
    node->right = sentinel;
    ngx_rbt_red(node);
}


static ngx_rbtree_key_t
ngx_http_hermes_registry_key(ngx_http_hermes_kernel_ref_t *ref,
    uint32_t *ohash)
{
    uint32_t  oh;

    oh = ngx_crc32_short(ref->owner.data, ref->owner.len);

    if (ohash) {
        *ohash = oh;
    }

    return ngx_http_hermes_rbkey(oh,
                                 ngx_crc32_short(ref->key.data, ref->key.len));
}


static ngx_http_hermes_node_t *
ngx_http_hermes_registry_lookup(ngx_http_hermes_zone_t *zone, ngx_str_t *key,
    ngx_rbtree_key_t hash)
{
    ngx_int_t                rc;
    ngx_rbtree_node_t       *node, *sentinel;
    ngx_http_hermes_node_t  *kn;

    node = zone->sh->rbtree.root;
    sentinel = zone->sh->rbtree.sentinel;

    while (node != sentinel) {

        if (hash < node->key) {
            node = node->left;
            continue;
        }

        if (hash > node->key) {
            node = node->right;
            continue;
        }

        /* hash == node->key */

        kn = (ngx_http_hermes_node_t *) node;

        rc = ngx_memn2cmp(key->data, kn->data, key->len, kn->key_len);

        if (rc == 0) {
            return kn;
        }

        node = (rc < 0) ? node->left : node->right;
    }

    return NULL;
}


/* the owner's entry after kn (NULL: its first), in its run of the tree */

static ngx_http_hermes_node_t *
ngx_http_hermes_registry_owner_next(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, uint32_t ohash, ngx_http_hermes_node_t *kn)
{
    ngx_rbtree_key_t         lo;
    ngx_rbtree_node_t       *node, *first, *sentinel;

    if (kn) {
        node = ngx_rbtree_next(&zone->sh->rbtree, &kn->node);

    } else {
        lo = ngx_http_hermes_rbkey(ohash, 0);

        node = zone->sh->rbtree.root;
        sentinel = zone->sh->rbtree.sentinel;
        first = NULL;

        while (node != sentinel) {
            if (node->key < lo) {
                node = node->right;

            } else {
                first = node;
                node = node->left;
            }
        }

        node = first;
    }

    for ( /* void */ ; node; node = ngx_rbtree_next(&zone->sh->rbtree, node))
    {
        if (ngx_http_hermes_rbkey_owner(node->key) != ohash) {
            return NULL;
        }

        /* owners of the same crc32 share a run */

        kn = (ngx_http_hermes_node_t *) node;

        if (kn->owner_len == owner->len
            && ngx_memcmp(kn->data, owner->data, owner->len) == 0)
        {
            return kn;
        }
    }

    return NULL;
}


/*
 * Called locked: the owner's entry after kn (NULL: its first) that is the
 * session's and not a tombstone, in any backend.
 */

static ngx_http_hermes_node_t *
ngx_http_hermes_registry_session_next(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, uint32_t ohash, ngx_str_t *session,
    ngx_http_hermes_node_t *kn)
{
    u_char  *p;

    for (kn = ngx_http_hermes_registry_owner_next(zone, owner, ohash, kn);
         kn;
         kn = ngx_http_hermes_registry_owner_next(zone, owner, ohash, kn))
    {
        p = ngx_http_hermes_node_session(kn);

        if (kn->state != NGX_HTTP_HERMES_STATE_LOST
            && (size_t) (kn->data + kn->key_len - p) == session->len
            && ngx_memcmp(p, session->data, session->len) == 0)
        {
            return kn;
        }
    }

    return NULL;
}


/*
 * A new kernel for an owner at max_kernels_per_owner: its own least
 * recently used idle kernel makes room, never another owner's.
 * NGX_DECLINED: no room: all of its kernels are busy (running, queued,
 * spawning), or victims is full.
 */

static ngx_int_t
ngx_http_hermes_registry_owner_room(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, uint32_t ohash, ngx_http_hermes_victims_t *victims)
{
    ngx_uint_t               kernels;
    ngx_http_hermes_node_t  *kn, *lru;

    for ( ;; ) {
        kernels = 0;
        lru = NULL;

        for (kn = ngx_http_hermes_registry_owner_next(zone, owner, ohash,
                                                      NULL);
             kn;
             kn = ngx_http_hermes_registry_owner_next(zone, owner, ohash, kn))
        {
            if (kn->state == NGX_HTTP_HERMES_STATE_LOST) {
                continue;
            }

            kernels++;

            if (!ngx_http_hermes_pending(kn)
                && (lru == NULL || kn->last_used < lru->last_used))
            {
                lru = kn;
            }
        }

        if (kernels < zone->max_kernels_per_owner) {
            return NGX_OK;
        }

        if (lru == NULL
            || ngx_http_hermes_registry_retire(zone, lru, victims,
                                               NGX_HTTP_HERMES_LOST_CAP)
               != NGX_OK)
        {
            return NGX_DECLINED;
        }

        zone->sh->counters.evicted_cap_total++;
    }
}


ngx_int_t
ngx_http_hermes_registry_acquire(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_str_t *root, ngx_uint_t queue,
    ngx_http_hermes_victims_t *victims)
{
    size_t                   n, dir_len;
    uint32_t                 ohash;
    ngx_int_t                rc;
    ngx_uint_t               tries;
    ngx_rbtree_key_t         hash;
    ngx_http_hermes_node_t  *kn;

    hash = ngx_http_hermes_registry_key(ref, &ohash);

    ngx_shmtx_lock(&zone->shpool->mutex);

    /* every execute reaps idle kernels and keeps the cap */
    ngx_http_hermes_registry_sweep_locked(zone, victims, 0);

    kn = ngx_http_hermes_registry_lookup(zone, &ref->key, hash);

    if (kn
        && !(kn->state == NGX_HTTP_HERMES_STATE_LOST
             && ngx_http_hermes_pending(kn) == 0)
        && kn->env != ref->env)
    {
        /* a kernel keeps the environment it was spawned in */
        ngx_shmtx_unlock(&zone->shpool->mutex);
        return NGX_HTTP_HERMES_ACQ_ENV_MISMATCH;
    }

    if ((kn == NULL
         || (kn->state == NGX_HTTP_HERMES_STATE_LOST
             && ngx_http_hermes_pending(kn) == 0))
        && ngx_http_hermes_registry_owner_room(zone, &ref->owner, ohash,
                                               victims)
           != NGX_OK)
    {
        /* this request would spawn one more of the owner's kernels */
        ngx_shmtx_unlock(&zone->shpool->mutex);
        return NGX_HTTP_HERMES_ACQ_OWNER_FULL;
    }

    if (kn == NULL) {
        dir_len = root->len + sizeof("/hermes_rkernel_") - 1
                  + NGX_HTTP_HERMES_ID_LEN;

        n = offsetof(ngx_http_hermes_node_t, data) + ref->key.len + dir_len;

        for (tries = 0; /* void */; tries++) {
            kn = ngx_slab_alloc_locked(zone->shpool, n);

            if (kn || tries == NGX_HTTP_HERMES_VICTIMS
                || !(ngx_http_hermes_registry_warm_evict(zone, victims)
                     || ngx_http_hermes_registry_evict_lru(zone, victims, 1)))
            {
                break;
            }
        }

        if (kn == NULL) {
            ngx_shmtx_unlock(&zone->shpool->mutex);
            return NGX_HTTP_HERMES_ACQ_NOMEM;
        }

        ngx_memzero(kn, offsetof(ngx_http_hermes_node_t, data));

        kn->node.key = hash;
        kn->key_len = (uint16_t) ref->key.len;
        kn->owner_len = (uint16_t) ref->owner.len;
        kn->dir_len = (uint16_t) dir_len;
        kn->gen = randombytes_random();
        kn->created = ngx_http_hermes_now_ms();
        kn->last_used = kn->created;
        kn->turn_at = kn->created;
        kn->state = NGX_HTTP_HERMES_STATE_LOST;

        ngx_memcpy(kn->data, ref->key.data, ref->key.len);

        ngx_rbtree_insert(&zone->sh->rbtree, &kn->node);
        ngx_queue_insert_head(&zone->sh->lost, &kn->queue);

    } else if (ngx_http_hermes_pending(kn) > queue) {
        ngx_shmtx_unlock(&zone->shpool->mutex);
        return NGX_HTTP_HERMES_ACQ_QUEUE_FULL;
    }

    if (kn->state == NGX_HTTP_HERMES_STATE_LOST
        && ngx_http_hermes_pending(kn) == 0)
    {
        /* its next kernel is spawned in this request's environment */
        kn->env = ref->env;
    }

    ref->ticket = kn->ticket_next++;
    ref->gen = kn->gen;

    rc = ngx_http_hermes_registry_turn(zone, kn, ref, root);

    if (rc == NGX_HTTP_HERMES_ACQ_SPAWN) {
        /* of the pool of the request's environment, if it has one */
        rc = ngx_http_hermes_registry_warm_take(zone, kn, ref);
    }

    /* a new kernel may take the registry over the cap: make room */
    ngx_http_hermes_registry_sweep_locked(zone, victims, 0);

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return rc;
}


/* called locked: the request holding ref->ticket checks for its turn */

static ngx_int_t
ngx_http_hermes_registry_turn(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn, ngx_http_hermes_kernel_ref_t *ref,
    ngx_str_t *root)
{
    if (kn->ticket_serving != ref->ticket) {
        return NGX_HTTP_HERMES_ACQ_WAIT;
    }

    kn->claimed = 1;
    kn->holder = ngx_pid;
    kn->turn_at = ngx_http_hermes_now_ms();
    kn->last_used = kn->turn_at;

    ngx_http_hermes_registry_touch(zone, kn);

    if (kn->state == NGX_HTTP_HERMES_STATE_LOST) {
        /* no kernel (new entry, or the last one died): spawn one */

        ref->state_lost = kn->had_kernel;
        ref->lost_reason = kn->had_kernel ? kn->lost_reason : 0;
        ref->reused = 0;
        ref->spawn = 1;

        ngx_http_hermes_registry_new_kernel(kn, root);
        ngx_http_hermes_registry_set_state(zone, kn,
                                           NGX_HTTP_HERMES_STATE_SPAWNING);

        ngx_http_hermes_registry_snapshot(kn, ref);

        return NGX_HTTP_HERMES_ACQ_SPAWN;
    }

    ngx_http_hermes_registry_set_state(zone, kn,
                                       NGX_HTTP_HERMES_STATE_RUNNING);
    kn->cell_seq++;

    ref->reused = 1;
    ref->spawn = 0;

    ngx_http_hermes_registry_snapshot(kn, ref);

    return NGX_HTTP_HERMES_ACQ_RUN;
}


/* "kernels" counts entries with a kernel: all but tombstones */

static void
ngx_http_hermes_registry_set_state(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn, ngx_uint_t state)
{
    ngx_uint_t  was, is;

    was = (kn->state != NGX_HTTP_HERMES_STATE_LOST);
    is = (state != NGX_HTTP_HERMES_STATE_LOST);

    kn->state = (uint8_t) state;

    if (was == is) {
        return;
    }

    if (was) {
        zone->sh->kernels--;
        ngx_http_hermes_registry_mcp_end(zone, kn);

    } else {
        zone->sh->kernels++;
    }

    ngx_http_hermes_registry_touch(zone, kn);
}


/*
 * Used now: to the head of its queue.  Entries without a kernel have a
 * queue of their own, so that making room for a kernel under the cap
 * never walks past tombstones, however many there are.
 */

static void
ngx_http_hermes_registry_touch(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn)
{
    ngx_queue_remove(&kn->queue);
    ngx_queue_insert_head(kn->state == NGX_HTTP_HERMES_STATE_LOST
                          ? &zone->sh->lost : &zone->sh->lru, &kn->queue);
}


static void
ngx_http_hermes_registry_new_kernel(ngx_http_hermes_node_t *kn,
    ngx_str_t *root)
{
    u_char  *p;
    u_char   id[NGX_HTTP_HERMES_ID_LEN / 2];

    randombytes_buf(id, sizeof(id));
    ngx_hex_dump(kn->kernel_id, id, sizeof(id));

    randombytes_buf(kn->token, NGX_HTTP_HERMES_TOKEN_LEN);

    /* the dir's length was fixed when the node was made, root may not */

    p = ngx_http_hermes_node_dir(kn);
    if (root->len + sizeof("/hermes_rkernel_") - 1 + NGX_HTTP_HERMES_ID_LEN
        == kn->dir_len)
    {
        p = ngx_cpymem(p, root->data, root->len);
        p = ngx_cpymem(p, "/hermes_rkernel_", sizeof("/hermes_rkernel_") - 1);

    } else {
        p += kn->dir_len - NGX_HTTP_HERMES_ID_LEN;
    }

    ngx_memcpy(p, kn->kernel_id, NGX_HTTP_HERMES_ID_LEN);

    kn->pid = 0;
    kn->start = 0;
    kn->ino = 0;
    kn->uid = 0;
    kn->cell_seq = 0;
    kn->execution_count = 0;
    kn->mcp_peer = 0;
}


static void
ngx_http_hermes_registry_snapshot(ngx_http_hermes_node_t *kn,
    ngx_http_hermes_kernel_ref_t *ref)
{
    ngx_memcpy(ref->kernel_id, kn->kernel_id, NGX_HTTP_HERMES_ID_LEN);
    ngx_memcpy(ref->token, kn->token, NGX_HTTP_HERMES_TOKEN_LEN);

    ref->dir_len = ngx_min(kn->dir_len, NGX_HTTP_HERMES_DIR_MAX - 1);
    ngx_memcpy(ref->dir, ngx_http_hermes_node_dir(kn), ref->dir_len);
    ref->dir[ref->dir_len] = '\0';

    ref->pid = kn->pid;
    ref->start = kn->start;
    ref->ino = kn->ino;
    ref->uid = kn->uid;
    ref->host = kn->host;
    ref->cell_id = kn->cell_seq;
    ref->execution_count = kn->execution_count;
}


ngx_int_t
ngx_http_hermes_registry_poll(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_str_t *root)
{
    ngx_int_t                rc;
    ngx_rbtree_key_t         hash;
    ngx_http_hermes_node_t  *kn;

    hash = ngx_http_hermes_registry_key(ref, NULL);

    ngx_shmtx_lock(&zone->shpool->mutex);

    kn = ngx_http_hermes_registry_lookup(zone, &ref->key, hash);

    if (kn == NULL || kn->gen != ref->gen
        || (int32_t) (ref->ticket - kn->ticket_serving) < 0)
    {
        rc = NGX_HTTP_HERMES_ACQ_GONE;

    } else {
        rc = ngx_http_hermes_registry_turn(zone, kn, ref, root);

        if (rc == NGX_HTTP_HERMES_ACQ_SPAWN) {
            rc = ngx_http_hermes_registry_warm_take(zone, kn, ref);
        }
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return rc;
}


static ngx_http_hermes_node_t *
ngx_http_hermes_registry_mine(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref)
{
    ngx_rbtree_key_t         hash;
    ngx_http_hermes_node_t  *kn;

    hash = ngx_http_hermes_registry_key(ref, NULL);

    kn = ngx_http_hermes_registry_lookup(zone, &ref->key, hash);

    if (kn == NULL || kn->gen != ref->gen
        || kn->ticket_serving != ref->ticket || !kn->claimed
        || kn->holder != ngx_pid
        || ngx_memcmp(kn->kernel_id, ref->kernel_id, NGX_HTTP_HERMES_ID_LEN)
           != 0)
    {
        return NULL;
    }

    return kn;
}


/*
 * The MCP session of the kernel whose cell this worker runs, with the
 * server "ms->peer": NGX_OK with it in "ms" (the id may be empty: the
 * server keeps none), NGX_DECLINED when it has none with that server.
 */

ngx_int_t
ngx_http_hermes_registry_mcp_session(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_mcp_session_t *ms)
{
    ngx_int_t                rc;
    ngx_http_hermes_node_t  *kn;

    rc = NGX_DECLINED;

    ngx_shmtx_lock(&zone->shpool->mutex);

    kn = ngx_http_hermes_registry_mine(zone, ref);

    if (kn && kn->mcp_peer && kn->mcp_peer == ms->peer) {
        ms->session_len = kn->mcp_session_len;
        ngx_memcpy(ms->session, kn->mcp_session, kn->mcp_session_len);
        ms->version_len = kn->mcp_version_len;
        ngx_memcpy(ms->version, kn->mcp_version, kn->mcp_version_len);
        rc = NGX_OK;
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return rc;
}


/* the session initialize made for the kernel of the cell this worker runs */

void
ngx_http_hermes_registry_set_mcp_session(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_mcp_session_t *ms)
{
    ngx_http_hermes_node_t  *kn;

    ngx_shmtx_lock(&zone->shpool->mutex);

    kn = ngx_http_hermes_registry_mine(zone, ref);

    if (kn) {
        if (kn->mcp_peer
            && (kn->mcp_session_len != ms->session_len
                || ngx_memcmp(kn->mcp_session, ms->session,
                              kn->mcp_session_len)
                   != 0))
        {
            /* one another call made meanwhile, or a dead one: ended */
            ngx_http_hermes_registry_mcp_end(zone, kn);
        }

        kn->mcp_peer = ms->peer;
        kn->mcp_session_len = (uint8_t) ngx_min(ms->session_len,
                                                NGX_HTTP_HERMES_MCP_SESSION_MAX);
        ngx_memcpy(kn->mcp_session, ms->session, kn->mcp_session_len);
        kn->mcp_version_len = (uint8_t) ngx_min(ms->version_len,
                                                NGX_HTTP_HERMES_MCP_VERSION_MAX);
        ngx_memcpy(kn->mcp_version, ms->version, kn->mcp_version_len);
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);
}


/*
 * The kernel died between cells: the turn's holder spawns a new one.
 * NGX_DECLINED: the turn is not this request's any more.
 */

ngx_int_t
ngx_http_hermes_registry_renew(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_str_t *root)
{
    ngx_http_hermes_node_t  *kn;

    ngx_shmtx_lock(&zone->shpool->mutex);

    kn = ngx_http_hermes_registry_mine(zone, ref);

    if (kn == NULL) {
        ngx_shmtx_unlock(&zone->shpool->mutex);
        return NGX_DECLINED;
    }

    /* the kernel that is gone: its MCP session goes with it */
    ngx_http_hermes_registry_mcp_end(zone, kn);

    ngx_http_hermes_registry_new_kernel(kn, root);
    ngx_http_hermes_registry_set_state(zone, kn,
                                       NGX_HTTP_HERMES_STATE_SPAWNING);

    ngx_http_hermes_registry_snapshot(kn, ref);

    /* a warm kernel taken dead (not reused) took no state with it */
    if (ref->reused) {
        ref->state_lost = 1;
    }

    ref->reused = 0;
    ref->spawn = 1;

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return NGX_OK;
}


/* under the lock: what a spawn learnt of its kernel, into its node */

static void
ngx_http_hermes_registry_kernel_up(ngx_http_hermes_node_t *kn,
    ngx_http_hermes_spawned_t *k)
{
    /* the spawn may have picked another id: the path it asked for existed */

    if (k->dir_len == kn->dir_len) {
        ngx_memcpy(kn->kernel_id, k->kernel_id, NGX_HTTP_HERMES_ID_LEN);
        ngx_memcpy(ngx_http_hermes_node_dir(kn), k->dir, k->dir_len);
    }

    kn->pid = k->pid;
    kn->start = k->start;
    kn->ino = k->ino;
    kn->uid = k->uid;
    kn->had_kernel = 1;
}


/*
 * The kernel the request spawned is up: its first cell runs.  NGX_DECLINED:
 * the turn is not this request's any more (shut down while spawning).
 */

ngx_int_t
ngx_http_hermes_registry_spawned(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_spawned_t *k)
{
    ngx_http_hermes_node_t  *kn;

    ngx_shmtx_lock(&zone->shpool->mutex);

    kn = ngx_http_hermes_registry_mine(zone, ref);

    if (kn == NULL) {
        ngx_shmtx_unlock(&zone->shpool->mutex);
        return NGX_DECLINED;
    }

    ngx_http_hermes_registry_kernel_up(kn, k);

    kn->host = (uint8_t) ref->host;
    kn->cell_seq = 1;
    ngx_http_hermes_registry_set_state(zone, kn,
                                       NGX_HTTP_HERMES_STATE_RUNNING);

    ngx_http_hermes_registry_snapshot(kn, ref);

    ref->cell_id = 1;
    ref->execution_count = 0;

    zone->sh->counters.spawned_total++;

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return NGX_OK;
}


/*
 * The request's turn ends: the cell finished (DONE), the kernel is gone and
 * its state with it (LOST: timeout, died, ship failed), or it ended by
 * itself or never started (GONE).
 */

void
ngx_http_hermes_registry_release(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_uint_t how,
    ngx_uint_t execution_count)
{
    ngx_http_hermes_node_t  *kn;

    ngx_shmtx_lock(&zone->shpool->mutex);

    kn = ngx_http_hermes_registry_mine(zone, ref);

    if (kn == NULL) {
        ngx_shmtx_unlock(&zone->shpool->mutex);
        return;
    }

    if (how == NGX_HTTP_HERMES_RELEASE_GONE
        && kn->state == NGX_HTTP_HERMES_STATE_SPAWNING)
    {
        ngx_http_hermes_registry_host_failed(zone,
                                             ngx_http_hermes_node_tag(kn),
                                             kn->host);
    }

    ngx_http_hermes_registry_end_turn(zone, kn);

    if (how == NGX_HTTP_HERMES_RELEASE_DONE) {
        ngx_http_hermes_registry_set_state(zone, kn,
                                           NGX_HTTP_HERMES_STATE_IDLE);
        kn->execution_count = (uint32_t) execution_count;

    } else if (how == NGX_HTTP_HERMES_RELEASE_GONE
               && ngx_http_hermes_pending(kn) == 0)
    {
        ngx_http_hermes_registry_delete(zone, kn);

    } else {
        /* a tombstone: the next turn spawns afresh, reporting state_lost */

        ngx_http_hermes_registry_set_state(zone, kn,
                                           NGX_HTTP_HERMES_STATE_LOST);
        kn->had_kernel = (how == NGX_HTTP_HERMES_RELEASE_LOST);
        kn->lost_reason = (uint8_t) (ref->end_reason ? ref->end_reason
                                             : NGX_HTTP_HERMES_LOST_DIED);
        kn->pid = 0;
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);
}


/* the idle clock restarts when a turn ends; the next ticket is served */

static void
ngx_http_hermes_registry_end_turn(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn)
{
    kn->ticket_serving++;
    kn->claimed = 0;
    kn->holder = 0;
    kn->last_used = ngx_http_hermes_now_ms();
    kn->turn_at = kn->last_used;

    ngx_http_hermes_registry_touch(zone, kn);
}


static void
ngx_http_hermes_registry_delete(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn)
{
    ngx_http_hermes_registry_set_state(zone, kn, NGX_HTTP_HERMES_STATE_LOST);

    ngx_queue_remove(&kn->queue);
    ngx_rbtree_delete(&zone->sh->rbtree, &kn->node);
    ngx_slab_free_locked(zone->shpool, kn);
}


/*
 * Remove an entry; its kernel, if any, goes on the list to kill.
 * NGX_DECLINED: victims is full, the entry stays.
 */

static ngx_int_t
ngx_http_hermes_registry_evict(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn, ngx_http_hermes_victims_t *victims)
{
    if (kn->state != NGX_HTTP_HERMES_STATE_LOST
        && ngx_http_hermes_registry_victim(kn, victims, kn->pid) != NGX_OK)
    {
        return NGX_DECLINED;
    }

    ngx_http_hermes_registry_delete(zone, kn);

    return NGX_OK;
}


/*
 * A kernel taken away from a session that did not ask (idle, cap) or that
 * its owner deleted: the entry stays as a tombstone, so that the session's
 * next call hears that its state is lost, and why.  Tombstones go with the
 * idle sweep (an idle_timeout after), or when the zone needs the room.
 * NGX_DECLINED: victims is full, the entry stays as it is.
 */

static ngx_int_t
ngx_http_hermes_registry_retire(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn, ngx_http_hermes_victims_t *victims,
    ngx_uint_t reason)
{
    if (kn->state == NGX_HTTP_HERMES_STATE_LOST || kn->owner_len == 0
        || (ngx_http_hermes_pending(kn)
            && reason != NGX_HTTP_HERMES_LOST_DELETED))
    {
        /* nothing to tell, no one to tell it, or a cell would meet it */
        return ngx_http_hermes_registry_evict(zone, kn, victims);
    }

    if (ngx_http_hermes_registry_victim(kn, victims, kn->pid) != NGX_OK) {
        return NGX_DECLINED;
    }

    if (ngx_http_hermes_pending(kn)) {
        /*
         * deleted under a running or queued cell (?force=1): a tombstone
         * of a new generation with no turns, so the cell and those queued
         * behind it find the entry no longer theirs (they start over, and
         * hear state_lost), as the session's next call does
         */
        kn->gen = randombytes_random();
        kn->ticket_serving = kn->ticket_next;
        kn->claimed = 0;
        kn->holder = 0;
    }

    victims->v[victims->n - 1].reason = reason;

    ngx_http_hermes_registry_set_state(zone, kn, NGX_HTTP_HERMES_STATE_LOST);
    kn->had_kernel = 1;
    kn->lost_reason = (uint8_t) reason;
    kn->pid = 0;
    kn->last_used = ngx_http_hermes_now_ms();

    ngx_http_hermes_registry_touch(zone, kn);

    return NGX_OK;
}


/*
 * What killing the kernel takes: its host, backend, directory, group.
 * NGX_DECLINED: victims is full.
 */

static ngx_int_t
ngx_http_hermes_registry_victim(ngx_http_hermes_node_t *kn,
    ngx_http_hermes_victims_t *victims, ngx_pid_t pid)
{
    ngx_http_hermes_victim_t  *v;

    if (victims->n == NGX_HTTP_HERMES_VICTIMS) {
        return NGX_DECLINED;
    }

    v = &victims->v[victims->n++];
    v->dir_len = ngx_min(kn->dir_len, NGX_HTTP_HERMES_DIR_MAX - 1);
    ngx_memcpy(v->dir, ngx_http_hermes_node_dir(kn), v->dir_len);
    v->dir[v->dir_len] = '\0';
    v->pid = pid;
    v->start = kn->start;
    v->ino = kn->ino;
    v->host = kn->host;
    ngx_memcpy(v->tag, ngx_http_hermes_node_tag(kn),
               NGX_HTTP_HERMES_BACKEND_TAG_LEN);

    v->reason = NGX_HTTP_HERMES_LOST_NONE;
    v->owner_len = ngx_min(kn->owner_len, NGX_HTTP_HERMES_OWNER_MAX);
    ngx_memcpy(v->owner, kn->data, v->owner_len);
    v->session_len = ngx_min((size_t) (kn->data + kn->key_len
                                       - ngx_http_hermes_node_session(kn)),
                             NGX_HTTP_HERMES_SESSION_MAX);
    ngx_memcpy(v->session, ngx_http_hermes_node_session(kn), v->session_len);

    return NGX_OK;
}


/*
 * The least recently used entry without a running or queued cell: a
 * kernel for the cap (retired, its session told), or with "tombstones"
 * (the zone has no room) a tombstone first, then a kernel, gone whole.
 */

static ngx_uint_t
ngx_http_hermes_registry_evict_lru(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_victims_t *victims, ngx_uint_t tombstones)
{
    ngx_uint_t               i;
    ngx_queue_t             *q, *queue[2];
    ngx_http_hermes_node_t  *kn;

    queue[0] = tombstones ? &zone->sh->lost : &zone->sh->lru;
    queue[1] = tombstones ? &zone->sh->lru : NULL;

    for (i = 0; i < 2 && queue[i]; i++) {

        for (q = ngx_queue_last(queue[i]);
             q != ngx_queue_sentinel(queue[i]);
             q = ngx_queue_prev(q))
        {
            kn = ngx_queue_data(q, ngx_http_hermes_node_t, queue);

            if (ngx_http_hermes_pending(kn)) {
                continue;
            }

            if (kn->state == NGX_HTTP_HERMES_STATE_LOST) {
                return ngx_http_hermes_registry_evict(zone, kn, victims)
                       == NGX_OK;
            }

            /* the cap leaves a tombstone; the zone's room, nothing */

            if ((tombstones ? ngx_http_hermes_registry_evict(zone, kn, victims)
                            : ngx_http_hermes_registry_retire(zone, kn,
                                                  victims,
                                                  NGX_HTTP_HERMES_LOST_CAP))
                != NGX_OK)
            {
                return 0;
            }

            if (tombstones) {
                victims->v[victims->n - 1].reason =
                                                NGX_HTTP_HERMES_LOST_MEMORY;
            }

            zone->sh->counters.evicted_cap_total++;

            return 1;
        }
    }

    return 0;
}


/*
 * Called locked.  "full" (the periodic sweep) first reclaims turns held by
 * workers that died; then idle entries are reaped (the LRU is ordered by
 * last use, so the walk stops at the first that is not idle long enough),
 * then the least recently used kernels beyond max_kernels are evicted.
 * Entries with a running or queued cell are never touched.
 */

static void
ngx_http_hermes_registry_sweep_locked(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_victims_t *victims, ngx_uint_t full)
{
    uint64_t                 now;
    ngx_uint_t               i;
    ngx_queue_t             *q, *next, *queue;
    ngx_http_hermes_node_t  *kn;

    now = ngx_http_hermes_now_ms();

    if (full) {
        for (i = 0; i < 2; i++) {
            queue = i ? &zone->sh->lost : &zone->sh->lru;

            for (q = ngx_queue_head(queue);
                 q != ngx_queue_sentinel(queue);
                 q = next)
            {
                /* a reclaim may make a kernel a tombstone: another queue */
                next = ngx_queue_next(q);
                kn = ngx_queue_data(q, ngx_http_hermes_node_t, queue);

                if (ngx_http_hermes_pending(kn)) {
                    ngx_http_hermes_registry_reclaim(zone, kn, victims, now);
                }
            }
        }
    }

    /* kernels first: one made a tombstone is not looked at twice */

    if (ngx_http_hermes_registry_reap(zone, &zone->sh->lru, victims, now)
        != NGX_OK
        || ngx_http_hermes_registry_reap(zone, &zone->sh->lost, victims, now)
           != NGX_OK)
    {
        return;
    }

    while (zone->sh->kernels > zone->max_kernels) {
        if (!ngx_http_hermes_registry_warm_evict(zone, victims)
            && !ngx_http_hermes_registry_evict_lru(zone, victims, 0))
        {
            break;
        }
    }
}


/*
 * Idle entries of a queue, from its tail: the queue is ordered by last
 * use, so the walk stops at the first not idle long enough.  A kernel
 * becomes a tombstone (another queue); a tombstone goes.  NGX_DECLINED:
 * victims is full, the rest waits.
 */

static ngx_int_t
ngx_http_hermes_registry_reap(ngx_http_hermes_zone_t *zone,
    ngx_queue_t *queue, ngx_http_hermes_victims_t *victims, uint64_t now)
{
    ngx_queue_t             *q, *prev;
    ngx_http_hermes_node_t  *kn;

    for (q = ngx_queue_last(queue);
         q != ngx_queue_sentinel(queue);
         q = prev)
    {
        prev = ngx_queue_prev(q);
        kn = ngx_queue_data(q, ngx_http_hermes_node_t, queue);

        if (ngx_http_hermes_pending(kn)) {
            continue;
        }

        /* workers' clocks differ by a tick: compare signed */
        if ((int64_t) (now - kn->last_used) < (int64_t) zone->idle_timeout) {
            break;
        }

        if (kn->state != NGX_HTTP_HERMES_STATE_LOST) {
            zone->sh->counters.evicted_idle_total++;
        }

        if (ngx_http_hermes_registry_retire(zone, kn, victims,
                                            NGX_HTTP_HERMES_LOST_IDLE)
            != NGX_OK)
        {
            return NGX_DECLINED;
        }
    }

    return NGX_OK;
}


/*
 * A turn whose worker died is never ended by it: a claimed one is ended
 * here (a spawn in progress leaves nothing worth keeping), and an unclaimed
 * one that nobody took within a second belonged to a dead waiter.
 */

static void
ngx_http_hermes_registry_reclaim(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn, ngx_http_hermes_victims_t *victims,
    uint64_t now)
{
    if (kn->claimed) {
        if (kn->holder == ngx_pid
            || kill(kn->holder, 0) == 0 || ngx_errno != ESRCH)
        {
            return;
        }

        ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                      "hermes: worker %P died holding kernel %*s, reclaimed",
                      kn->holder, (size_t) NGX_HTTP_HERMES_ID_LEN,
                      kn->kernel_id);

        if (kn->state == NGX_HTTP_HERMES_STATE_SPAWNING) {
            if (ngx_http_hermes_registry_victim(kn, victims, 0) != NGX_OK) {
                return;
            }

            ngx_http_hermes_registry_set_state(zone, kn,
                                               NGX_HTTP_HERMES_STATE_LOST);
            kn->had_kernel = 0;

        } else {
            /* the kernel finishes that cell on its own; the next waits */
            ngx_http_hermes_registry_set_state(zone, kn,
                                               NGX_HTTP_HERMES_STATE_IDLE);
        }

        ngx_http_hermes_registry_end_turn(zone, kn);
        return;
    }

    if ((int64_t) (now - kn->turn_at) > 1000) {
        kn->ticket_serving++;
        kn->turn_at = now;
    }
}


void
ngx_http_hermes_registry_sweep(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_victims_t *victims, ngx_uint_t full)
{
    ngx_shmtx_lock(&zone->shpool->mutex);
    ngx_http_hermes_registry_sweep_locked(zone, victims, full);
    ngx_shmtx_unlock(&zone->shpool->mutex);
}


/* the owner's kernels, copied out for listing, most recently used first */

ngx_int_t
ngx_http_hermes_registry_list(ngx_http_hermes_zone_t *zone, ngx_str_t *owner,
    ngx_array_t *out)
{
    u_char                      *p;
    uint32_t                     ohash;
    uint64_t                     now;
    ngx_uint_t                   first;
    ngx_http_hermes_node_t      *kn;
    ngx_http_hermes_listing_t   *l;

    now = ngx_http_hermes_now_ms();
    ohash = ngx_crc32_short(owner->data, owner->len);
    first = out->nelts;

    ngx_shmtx_lock(&zone->shpool->mutex);

    for (kn = ngx_http_hermes_registry_owner_next(zone, owner, ohash, NULL);
         kn;
         kn = ngx_http_hermes_registry_owner_next(zone, owner, ohash, kn))
    {
        if (kn->state == NGX_HTTP_HERMES_STATE_LOST) {
            continue;
        }

        l = ngx_array_push(out);
        if (l == NULL) {
            ngx_shmtx_unlock(&zone->shpool->mutex);
            return NGX_ERROR;
        }

        p = ngx_http_hermes_node_session(kn);

        l->session.len = kn->data + kn->key_len - p;
        l->session.data = ngx_pnalloc(out->pool, l->session.len);
        if (l->session.data == NULL) {
            ngx_shmtx_unlock(&zone->shpool->mutex);
            return NGX_ERROR;
        }

        ngx_memcpy(l->session.data, p, l->session.len);
        ngx_memcpy(l->kernel_id, kn->kernel_id, NGX_HTTP_HERMES_ID_LEN);

        l->state = kn->state;
        l->host = kn->host;
        ngx_memcpy(l->tag, ngx_http_hermes_node_tag(kn),
                   NGX_HTTP_HERMES_BACKEND_TAG_LEN);
        l->execution_count = kn->execution_count;
        l->env = kn->env;
        l->created = kn->created;
        l->last_used = kn->last_used;
        l->running_for = (kn->state == NGX_HTTP_HERMES_STATE_RUNNING)
                         ? now - kn->turn_at : 0;
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);

    ngx_sort((ngx_http_hermes_listing_t *) out->elts + first,
             out->nelts - first, sizeof(ngx_http_hermes_listing_t),
             ngx_http_hermes_registry_recent_first);

    return NGX_OK;
}


static ngx_int_t ngx_libc_cdecl
ngx_http_hermes_registry_recent_first(const void *one, const void *two)
{
    const ngx_http_hermes_listing_t  *a = one, *b = two;

    return (a->last_used < b->last_used) - (a->last_used > b->last_used);
}


/*
 * The caller's kernels of that session with a running cell: the first
 * one's kernel (as a victim: where it is) and the running cell's id.
 * NGX_OK; NGX_DONE: a kernel, no cell running; NGX_DECLINED: none.
 */

ngx_int_t
ngx_http_hermes_registry_running(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_str_t *session, ngx_http_hermes_victim_t *v,
    uint32_t *cell)
{
    uint32_t                    ohash;
    ngx_int_t                   rc;
    ngx_http_hermes_node_t     *kn;
    ngx_http_hermes_victims_t   one;

    rc = NGX_DECLINED;
    ohash = ngx_crc32_short(owner->data, owner->len);

    ngx_shmtx_lock(&zone->shpool->mutex);

    for (kn = ngx_http_hermes_registry_session_next(zone, owner, ohash,
                                                    session, NULL);
         kn;
         kn = ngx_http_hermes_registry_session_next(zone, owner, ohash,
                                                    session, kn))
    {
        if (kn->state != NGX_HTTP_HERMES_STATE_RUNNING || !kn->claimed
            || kn->pid == 0)
        {
            rc = NGX_DONE;
            continue;
        }

        one.n = 0;
        (void) ngx_http_hermes_registry_victim(kn, &one, kn->pid);

        *v = one.v[0];
        *cell = kn->cell_seq;
        rc = NGX_OK;
        break;
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return rc;
}


/*
 * The owner's kernel of the session, started and not lost, for its files
 * and its cells' streams: where it is (v: dir, host, backend tag) and, in
 * ref, what tells it from a stranger (pid, start, inode, user), its id and
 * its last cell.  NGX_DECLINED: none.
 */

ngx_int_t
ngx_http_hermes_registry_kernel(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_str_t *session, ngx_http_hermes_victim_t *v,
    ngx_http_hermes_kernel_ref_t *ref)
{
    uint32_t                    ohash;
    ngx_int_t                   rc;
    ngx_http_hermes_node_t     *kn;
    ngx_http_hermes_victims_t   one;

    rc = NGX_DECLINED;
    ohash = ngx_crc32_short(owner->data, owner->len);

    ngx_shmtx_lock(&zone->shpool->mutex);

    for (kn = ngx_http_hermes_registry_session_next(zone, owner, ohash,
                                                    session, NULL);
         kn;
         kn = ngx_http_hermes_registry_session_next(zone, owner, ohash,
                                                    session, kn))
    {
        if (kn->state == NGX_HTTP_HERMES_STATE_SPAWNING || kn->pid == 0) {
            continue;
        }

        one.n = 0;
        (void) ngx_http_hermes_registry_victim(kn, &one, kn->pid);

        *v = one.v[0];

        ngx_memcpy(ref->kernel_id, kn->kernel_id, NGX_HTTP_HERMES_ID_LEN);
        ngx_memcpy(ref->dir, v->dir, v->dir_len + 1);
        ref->dir_len = v->dir_len;
        ref->pid = kn->pid;
        ref->start = kn->start;
        ref->ino = kn->ino;
        ref->uid = kn->uid;
        ref->host = kn->host;
        ref->cell_id = kn->cell_seq;
        ref->execution_count = kn->execution_count;

        rc = NGX_OK;
        break;
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return rc;
}


/* a kernel ended: its MCP session, if any, waits to be ended (under lock) */

static void
ngx_http_hermes_registry_mcp_end(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn)
{
    ngx_http_hermes_mcp_session_t  *ms;

    if (kn->mcp_peer == 0 || kn->mcp_session_len == 0) {
        /* none, or a server that keeps no sessions: nothing to end */
        kn->mcp_peer = 0;
        return;
    }

    ms = &zone->sh->mcp_ended[zone->sh->mcp_ended_next++
                              % NGX_HTTP_HERMES_MCP_ENDED];

    ms->peer = kn->mcp_peer;
    ms->session_len = kn->mcp_session_len;
    ngx_memcpy(ms->session, kn->mcp_session, kn->mcp_session_len);
    ms->version_len = kn->mcp_version_len;
    ngx_memcpy(ms->version, kn->mcp_version, kn->mcp_version_len);

    kn->mcp_peer = 0;
}


/* up to n ended MCP sessions with server "peer", taken: theirs to end */

ngx_uint_t
ngx_http_hermes_registry_mcp_ended(ngx_http_hermes_zone_t *zone,
    uint32_t peer, ngx_http_hermes_mcp_session_t *ms, ngx_uint_t n)
{
    ngx_uint_t                      i, got;
    ngx_http_hermes_mcp_session_t  *e;

    got = 0;

    ngx_shmtx_lock(&zone->shpool->mutex);

    for (i = 0; i < NGX_HTTP_HERMES_MCP_ENDED && got < n; i++) {
        e = &zone->sh->mcp_ended[i];

        if (e->peer == peer && e->session_len) {
            ms[got++] = *e;
            e->peer = 0;
        }
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return got;
}


/* made anew with the zone: tells its kernels from an earlier zone's */

u_char *
ngx_http_hermes_registry_instance(ngx_http_hermes_zone_t *zone)
{
    return zone->sh->instance;
}


/* 1 for the first worker to ask since the zone was made: it recovers */

ngx_uint_t
ngx_http_hermes_registry_recovering(ngx_http_hermes_zone_t *zone)
{
    return ngx_atomic_cmp_set(&zone->sh->recovered, 0, 1);
}


/*
 * Shut down the owner's kernels of a session: NGX_OK, NGX_DECLINED (none),
 * NGX_BUSY (a cell runs or waits, and not forced).
 */

/*
 * The kernel of ref's entry ends, to be spawned anew (a reset into
 * another environment).  NGX_BUSY: a cell runs or waits on it;
 * NGX_DECLINED: no kernel.
 */

ngx_int_t
ngx_http_hermes_registry_end(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_victims_t *victims)
{
    uint32_t                 ohash;
    ngx_int_t                rc;
    ngx_rbtree_key_t         hash;
    ngx_http_hermes_node_t  *kn;

    hash = ngx_http_hermes_registry_key(ref, &ohash);

    ngx_shmtx_lock(&zone->shpool->mutex);

    kn = ngx_http_hermes_registry_lookup(zone, &ref->key, hash);

    if (kn == NULL || kn->state == NGX_HTTP_HERMES_STATE_LOST) {
        rc = NGX_DECLINED;

    } else if (ngx_http_hermes_pending(kn)) {
        rc = NGX_BUSY;

    } else {
        rc = ngx_http_hermes_registry_retire(zone, kn, victims,
                                             NGX_HTTP_HERMES_LOST_DELETED);
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return rc;
}


ngx_int_t
ngx_http_hermes_registry_shutdown(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_str_t *session, ngx_uint_t force,
    ngx_http_hermes_victims_t *victims)
{
    u_char                  *p;
    uint32_t                 ohash;
    ngx_int_t                rc;
    ngx_uint_t               pass;
    ngx_http_hermes_node_t  *kn, *next;

    rc = NGX_DECLINED;
    ohash = ngx_crc32_short(owner->data, owner->len);

    ngx_shmtx_lock(&zone->shpool->mutex);

    /* pass 0 looks for running cells, pass 1 removes */

    for (pass = force ? 1 : 0; pass < 2; pass++) {

        for (kn = ngx_http_hermes_registry_owner_next(zone, owner, ohash,
                                                      NULL);
             kn;
             kn = next)
        {
            /* deleting a node relinks the tree, the others stay in it */
            next = ngx_http_hermes_registry_owner_next(zone, owner, ohash, kn);

            p = ngx_http_hermes_node_session(kn);

            if (kn->state == NGX_HTTP_HERMES_STATE_LOST
                || (size_t) (kn->data + kn->key_len - p) != session->len
                || ngx_memcmp(p, session->data, session->len) != 0)
            {
                continue;
            }

            if (pass == 0) {
                if (ngx_http_hermes_pending(kn)) {
                    ngx_shmtx_unlock(&zone->shpool->mutex);
                    return NGX_BUSY;
                }

                continue;
            }

            if (ngx_http_hermes_registry_retire(zone, kn, victims,
                                                NGX_HTTP_HERMES_LOST_DELETED)
                == NGX_OK)
            {
                zone->sh->counters.evicted_deleted_total++;
                rc = NGX_OK;
            }
        }
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return rc;
}


/*
 * nginx is shutting down (no worker is left): take entries out, least
 * recently used first, as many as "victims" holds; their kernels are to
 * be killed.  The number taken out.
 */

ngx_uint_t
ngx_http_hermes_registry_drain(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_victims_t *victims)
{
    ngx_uint_t               n;
    ngx_queue_t             *q, *queue;
    ngx_http_hermes_node_t  *kn;

    n = 0;

    ngx_shmtx_lock(&zone->shpool->mutex);

    /* kernels, then tombstones */

    for (queue = &zone->sh->lru; queue; ) {

        if (ngx_queue_empty(queue)) {
            queue = (queue == &zone->sh->lru) ? &zone->sh->lost : NULL;
            continue;
        }

        q = ngx_queue_last(queue);
        kn = ngx_queue_data(q, ngx_http_hermes_node_t, queue);

        if (ngx_http_hermes_registry_evict(zone, kn, victims) != NGX_OK) {
            break;
        }

        n++;
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return n;
}


/*
 * The zone's figures; with owners, its kernels by owner, and with cells,
 * its running cells (the status page's, copied out of the zone).
 */

ngx_int_t
ngx_http_hermes_registry_stats(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_stats_t *st, ngx_array_t *owners, ngx_array_t *cells)
{
    ngx_int_t                       rc;
    ngx_uint_t                      i, j, n, attributed;
    ngx_queue_t                    *q;
    ngx_http_hermes_sh_t           *sh;
    ngx_http_hermes_node_t         *kn;
    ngx_http_hermes_host_stats_t   *h;
    ngx_http_hermes_owner_stats_t  *o;

    sh = zone->sh;

    st->running = 0;
    st->warm = 0;
    st->queued = 0;
    st->nhosts = 0;
    h = NULL;

    ngx_shmtx_lock(&zone->shpool->mutex);

    st->kernels = sh->kernels;

    for (st->nenvs = 0;
         st->nenvs < NGX_HTTP_HERMES_ENVS && sh->envs[st->nenvs].id;
         st->nenvs++)
    {
        st->envs[st->nenvs].id = sh->envs[st->nenvs].id;
        st->envs[st->nenvs].kernels = 0;
        st->envs[st->nenvs].spawns = sh->envs[st->nenvs].spawns;
        st->envs[st->nenvs].spawn_ms = sh->envs[st->nenvs].spawn_ms;
        ngx_str_null(&st->envs[st->nenvs].name);
    }

    /* entries without a kernel may have cells queued: a spawn to come */

    for (q = ngx_queue_head(&sh->lost);
         q != ngx_queue_sentinel(&sh->lost);
         q = ngx_queue_next(q))
    {
        kn = ngx_queue_data(q, ngx_http_hermes_node_t, queue);
        st->queued += ngx_http_hermes_pending(kn) - kn->claimed;
    }

    for (q = ngx_queue_head(&sh->lru);
         q != ngx_queue_sentinel(&sh->lru);
         q = ngx_queue_next(q))
    {
        kn = ngx_queue_data(q, ngx_http_hermes_node_t, queue);

        if (kn->state == NGX_HTTP_HERMES_STATE_RUNNING) {
            st->running++;

        } else if (kn->state == NGX_HTTP_HERMES_STATE_IDLE
                   && kn->owner_len == 0)
        {
            st->warm++;
        }

        /* the serving ticket waits too until its request claims it */
        st->queued += ngx_http_hermes_pending(kn) - kn->claimed;

        for (j = 0; kn->env && j < st->nenvs; j++) {
            if (st->envs[j].id == kn->env) {
                st->envs[j].kernels++;
                break;
            }
        }

        /* most kernels are on the host of the one before */

        if (h == NULL
            || h->host != kn->host
            || ngx_memcmp(h->tag, ngx_http_hermes_node_tag(kn),
                          NGX_HTTP_HERMES_BACKEND_TAG_LEN) != 0)
        {
            h = ngx_http_hermes_registry_host(st,
                                              ngx_http_hermes_node_tag(kn),
                                              kn->host);
        }

        if (h) {
            h->kernels++;
        }
    }

    st->spawned_total = sh->counters.spawned_total;
    st->spawn_failures_total = sh->counters.spawn_failures_total;
    st->evicted_idle_total = sh->counters.evicted_idle_total;
    st->evicted_cap_total = sh->counters.evicted_cap_total;
    st->evicted_deleted_total = sh->counters.evicted_deleted_total;
    st->killed_timeout_total = sh->counters.killed_timeout_total;
    st->tool_calls_total = sh->counters.tool_calls_total;

    for (i = 0; i < NGX_HTTP_HERMES_CELL_NSTATUS; i++) {
        st->cells_total[i] = sh->counters.cells_total[i];
    }

    for (i = 0; i < NGX_HTTP_HERMES_RPC_NREJECT; i++) {
        st->rpc_rejected_total[i] = sh->counters.rpc_rejected_total[i];
    }

    for (i = 0; i < NGX_HTTP_HERMES_MCP_NMETHOD; i++) {
        st->mcp_requests_total[i] = sh->counters.mcp_requests_total[i];
    }

    for (i = 0; i < NGX_HTTP_HERMES_MCP_NTOOL; i++) {
        st->mcp_tool_calls_total[i] = sh->counters.mcp_tool_calls_total[i];
    }

    st->mcp_sessions = sh->mcp_sessions;

    for (i = 0; i < NGX_HTTP_HERMES_NHIST; i++) {
        for (j = 0; j < NGX_HTTP_HERMES_BUCKETS; j++) {
            st->hist[i][j] = sh->hist[i].buckets[j];
        }

        st->hist_sum_ms[i] = sh->hist[i].sum_ms;
    }

    st->nanswers = sh->nanswers;
    ngx_memcpy(st->answers, sh->answers,
               st->nanswers * sizeof(ngx_http_hermes_answers_t));

    attributed = 0;

    for (i = 0; i < sh->nhosts; i++) {
        h = ngx_http_hermes_registry_host(st, sh->hosts[i].tag,
                                          sh->hosts[i].host);
        if (h) {
            h->spawn_failures = sh->hosts[i].spawn_failures;
            attributed += h->spawn_failures;
        }
    }

    st->zone_bytes_total = zone->shm_zone->shm.size;
    st->zone_bytes_used = zone->shm_zone->shm.size
                          - zone->shpool->pfree * ngx_pagesize;

    rc = NGX_OK;

    if (owners) {
        rc = ngx_http_hermes_registry_owners(zone, owners);
    }

    if (cells && rc == NGX_OK) {
        rc = ngx_http_hermes_registry_cells(zone, cells);
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);

    if (rc != NGX_OK) {
        return NGX_ERROR;
    }

    st->owners = 0;

    if (owners && owners->nelts) {

        /* owners of one crc32 can interleave in the tree: merge them */

        o = owners->elts;

        ngx_sort(o, owners->nelts, sizeof(ngx_http_hermes_owner_stats_t),
                 ngx_http_hermes_registry_owner_order);

        for (i = 0, j = 1; j < owners->nelts; j++) {
            if (o[j].owner.len == o[i].owner.len
                && ngx_memcmp(o[j].owner.data, o[i].owner.data,
                              o[i].owner.len) == 0)
            {
                o[i].kernels += o[j].kernels;
                o[i].running += o[j].running;
                continue;
            }

            o[++i] = o[j];
        }

        owners->nelts = i + 1;
        st->owners = owners->nelts;
    }

    if (cells) {
        ngx_sort(cells->elts, cells->nelts, sizeof(ngx_http_hermes_listing_t),
                 ngx_http_hermes_registry_oldest_first);
    }

    /* an answer's codes together: the JSON form groups by them */

    ngx_sort(st->answers, st->nanswers, sizeof(ngx_http_hermes_answers_t),
             ngx_http_hermes_registry_answer_order);

    /* failures of hosts past the table's end: one entry, no host */

    n = st->spawn_failures_total - attributed;

    if (n) {
        h = &st->hosts[st->nhosts++];
        ngx_memzero(h, sizeof(ngx_http_hermes_host_stats_t));
        h->host = NGX_HTTP_HERMES_HOSTS;
        h->spawn_failures = n;
    }

    return NGX_OK;
}


/*
 * Kernels by owner, under the lock: an owner's entries are one run of the
 * tree (its crc32 leads the key), so most owners take one element.
 */

static ngx_int_t
ngx_http_hermes_registry_owners(ngx_http_hermes_zone_t *zone,
    ngx_array_t *owners)
{
    ngx_rbtree_t                   *tree;
    ngx_rbtree_node_t              *node;
    ngx_http_hermes_node_t         *kn;
    ngx_http_hermes_owner_stats_t  *o;

    tree = &zone->sh->rbtree;

    if (tree->root == tree->sentinel) {
        return NGX_OK;
    }

    o = NULL;

    for (node = ngx_rbtree_min(tree->root, tree->sentinel);
         node;
         node = ngx_rbtree_next(tree, node))
    {
        kn = (ngx_http_hermes_node_t *) node;

        if (kn->state == NGX_HTTP_HERMES_STATE_LOST || kn->owner_len == 0) {
            /* tombstones, and warm kernels, which are no one's yet */
            continue;
        }

        if (o == NULL
            || o->owner.len != kn->owner_len
            || ngx_memcmp(o->owner.data, kn->data, kn->owner_len) != 0)
        {
            o = ngx_array_push(owners);
            if (o == NULL) {
                return NGX_ERROR;
            }

            o->owner.len = kn->owner_len;
            o->owner.data = ngx_pnalloc(owners->pool, kn->owner_len);
            if (o->owner.data == NULL) {
                return NGX_ERROR;
            }

            ngx_memcpy(o->owner.data, kn->data, kn->owner_len);
            o->kernels = 0;
            o->running = 0;
        }

        o->kernels++;

        if (kn->state == NGX_HTTP_HERMES_STATE_RUNNING) {
            o->running++;
        }
    }

    return NGX_OK;
}


/* the running cells, under the lock: whose, where, for how long */

static ngx_int_t
ngx_http_hermes_registry_cells(ngx_http_hermes_zone_t *zone,
    ngx_array_t *cells)
{
    u_char                     *p;
    uint64_t                    now;
    ngx_queue_t                *q;
    ngx_http_hermes_node_t     *kn;
    ngx_http_hermes_listing_t  *l;

    now = ngx_http_hermes_now_ms();

    for (q = ngx_queue_head(&zone->sh->lru);
         q != ngx_queue_sentinel(&zone->sh->lru);
         q = ngx_queue_next(q))
    {
        kn = ngx_queue_data(q, ngx_http_hermes_node_t, queue);

        if (kn->state != NGX_HTTP_HERMES_STATE_RUNNING) {
            continue;
        }

        l = ngx_array_push(cells);
        if (l == NULL) {
            return NGX_ERROR;
        }

        ngx_memzero(l, sizeof(ngx_http_hermes_listing_t));

        p = ngx_http_hermes_node_session(kn);

        l->owner.len = kn->owner_len;
        l->session.len = kn->data + kn->key_len - p;

        l->owner.data = ngx_pnalloc(cells->pool,
                                    l->owner.len + l->session.len);
        if (l->owner.data == NULL) {
            return NGX_ERROR;
        }

        l->session.data = ngx_cpymem(l->owner.data, kn->data, l->owner.len);
        ngx_memcpy(l->session.data, p, l->session.len);

        ngx_memcpy(l->kernel_id, kn->kernel_id, NGX_HTTP_HERMES_ID_LEN);
        ngx_memcpy(l->tag, ngx_http_hermes_node_tag(kn),
                   NGX_HTTP_HERMES_BACKEND_TAG_LEN);

        l->state = kn->state;
        l->host = kn->host;
        l->execution_count = kn->execution_count;
        l->env = kn->env;
        l->created = kn->created;
        l->last_used = kn->last_used;
        l->running_for = now - kn->turn_at;
        l->queued = ngx_http_hermes_pending(kn) - kn->claimed;
    }

    return NGX_OK;
}


static ngx_int_t ngx_libc_cdecl
ngx_http_hermes_registry_owner_order(const void *one, const void *two)
{
    const ngx_http_hermes_owner_stats_t  *a = one, *b = two;

    return ngx_memn2cmp(a->owner.data, b->owner.data, a->owner.len,
                        b->owner.len);
}


static ngx_int_t ngx_libc_cdecl
ngx_http_hermes_registry_oldest_first(const void *one, const void *two)
{
    const ngx_http_hermes_listing_t  *a = one, *b = two;

    return (a->running_for < b->running_for)
           - (a->running_for > b->running_for);
}


static ngx_int_t ngx_libc_cdecl
ngx_http_hermes_registry_answer_order(const void *one, const void *two)
{
    const ngx_http_hermes_answers_t  *a = one, *b = two;

    ngx_int_t  rc;

    if (a->status != b->status) {
        return (ngx_int_t) a->status - (ngx_int_t) b->status;
    }

    rc = ngx_memcmp(a->error, b->error, ngx_min(a->error_len, b->error_len));

    return rc ? rc : (ngx_int_t) a->error_len - (ngx_int_t) b->error_len;
}


/* a host's entry in the figures: found, or added while there is room */

static ngx_http_hermes_host_stats_t *
ngx_http_hermes_registry_host(ngx_http_hermes_stats_t *st, u_char *tag,
    ngx_uint_t host)
{
    ngx_uint_t                     i;
    ngx_http_hermes_host_stats_t  *h;

    for (i = 0; i < st->nhosts; i++) {
        h = &st->hosts[i];

        if (h->host == host
            && ngx_memcmp(h->tag, tag, NGX_HTTP_HERMES_BACKEND_TAG_LEN) == 0)
        {
            return h;
        }
    }

    if (st->nhosts == NGX_HTTP_HERMES_HOSTS) {
        return NULL;
    }

    h = &st->hosts[st->nhosts++];
    ngx_memcpy(h->tag, tag, NGX_HTTP_HERMES_BACKEND_TAG_LEN);
    h->host = host;
    ngx_str_null(&h->name);
    h->kernels = 0;
    h->spawn_failures = 0;

    return h;
}


/* a spawn in environment "env" took "ms" (slots are taken under the lock) */

void
ngx_http_hermes_registry_env_spawned(ngx_http_hermes_zone_t *zone,
    uint32_t env, ngx_msec_t ms)
{
    ngx_uint_t                    i;
    ngx_http_hermes_env_count_t  *e;

    if (env == 0) {
        return;
    }

    ngx_shmtx_lock(&zone->shpool->mutex);

    for (i = 0; i < NGX_HTTP_HERMES_ENVS; i++) {
        e = &zone->sh->envs[i];

        if (e->id == 0) {
            e->id = env;
        }

        if (e->id == env) {
            e->spawns++;
            e->spawn_ms += ms;
            break;
        }
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);
}


void
ngx_http_hermes_registry_observe(ngx_http_hermes_zone_t *zone,
    ngx_uint_t hist, ngx_msec_t ms)
{
    ngx_uint_t               i;
    ngx_http_hermes_hist_t  *h;

    h = &zone->sh->hist[hist];

    for (i = 0; i < NGX_HTTP_HERMES_BUCKETS - 1; i++) {
        if (ms <= ngx_http_hermes_buckets[i]) {
            break;
        }
    }

    (void) ngx_atomic_fetch_add(&h->buckets[i], 1);
    (void) ngx_atomic_fetch_add(&h->sum_ms, ms);
}


/*
 * An answer of a hermes location: the slot of its status and error code
 * is found without the lock; a new one is added under it.  The table holds
 * every code the module answers with; were it full, the last slot (status
 * 0, no code) takes the rest.
 */

void
ngx_http_hermes_registry_answered(ngx_http_hermes_zone_t *zone,
    ngx_uint_t status, ngx_str_t *error)
{
    size_t                      len;
    ngx_uint_t                  i, n;
    ngx_http_hermes_sh_t       *sh;
    ngx_http_hermes_answers_t  *a;

    sh = zone->sh;
    len = ngx_min(error->len, NGX_HTTP_HERMES_ERROR_MAX);

    for ( ;; ) {
        n = sh->nanswers;
        ngx_memory_barrier();

        for (i = 0; i < n; i++) {
            a = &sh->answers[i];

            if (a->status == status && a->error_len == len
                && ngx_memcmp(a->error, error->data, len) == 0)
            {
                (void) ngx_atomic_fetch_add(&a->count, 1);
                return;
            }
        }

        if (n == NGX_HTTP_HERMES_ANSWERS) {
            (void) ngx_atomic_fetch_add(&sh->answers[n - 1].count, 1);
            return;
        }

        ngx_shmtx_lock(&zone->shpool->mutex);

        if (sh->nanswers != n) {
            /* another worker added one meanwhile: look again */
            ngx_shmtx_unlock(&zone->shpool->mutex);
            continue;
        }

        if (n == NGX_HTTP_HERMES_ANSWERS - 1) {
            status = 0;
            len = 0;
        }

        a = &sh->answers[n];
        a->count = 1;
        a->status = (uint16_t) status;
        a->error_len = (uint8_t) len;
        ngx_memcpy(a->error, error->data, len);

        /* the slot is whole before other workers look at it */
        ngx_memory_barrier();

        sh->nanswers = n + 1;

        ngx_shmtx_unlock(&zone->shpool->mutex);
        return;
    }
}


/* an ssh host failed a spawn that goes on on another host */

void
ngx_http_hermes_registry_spawn_failed(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref)
{
    ngx_shmtx_lock(&zone->shpool->mutex);

    ngx_http_hermes_registry_host_failed(zone,
                                         ref->key.data + ref->owner.len + 1,
                                         ref->host);

    ngx_shmtx_unlock(&zone->shpool->mutex);
}


/* called locked */

static void
ngx_http_hermes_registry_host_failed(ngx_http_hermes_zone_t *zone,
    u_char *tag, ngx_uint_t host)
{
    ngx_uint_t                     i;
    ngx_http_hermes_sh_t          *sh;
    ngx_http_hermes_host_count_t  *h;

    sh = zone->sh;
    sh->counters.spawn_failures_total++;

    for (i = 0; i < sh->nhosts; i++) {
        h = &sh->hosts[i];

        if (h->host == host
            && ngx_memcmp(h->tag, tag, NGX_HTTP_HERMES_BACKEND_TAG_LEN) == 0)
        {
            h->spawn_failures++;
            return;
        }
    }

    if (sh->nhosts == NGX_HTTP_HERMES_HOSTS) {
        /* counted in the total alone */
        return;
    }

    h = &sh->hosts[sh->nhosts++];
    ngx_memcpy(h->tag, tag, NGX_HTTP_HERMES_BACKEND_TAG_LEN);
    h->host = host;
    h->spawn_failures = 1;
}


/* the kernels (spawning ones included) of each of a backend's n hosts */

void
ngx_http_hermes_registry_host_counts(ngx_http_hermes_zone_t *zone,
    u_char *tag, ngx_uint_t *counts, ngx_uint_t n)
{
    ngx_queue_t             *q;
    ngx_http_hermes_node_t  *kn;

    ngx_memzero(counts, n * sizeof(ngx_uint_t));

    ngx_shmtx_lock(&zone->shpool->mutex);

    for (q = ngx_queue_head(&zone->sh->lru);
         q != ngx_queue_sentinel(&zone->sh->lru);
         q = ngx_queue_next(q))
    {
        kn = ngx_queue_data(q, ngx_http_hermes_node_t, queue);

        if (kn->state != NGX_HTTP_HERMES_STATE_LOST
            && kn->host < n
            && ngx_memcmp(ngx_http_hermes_node_tag(kn), tag,
                          NGX_HTTP_HERMES_BACKEND_TAG_LEN) == 0)
        {
            counts[kn->host]++;
        }
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);
}


/* the host placement chose for the request's spawning kernel */

void
ngx_http_hermes_registry_set_host(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref)
{
    ngx_http_hermes_node_t  *kn;

    ngx_shmtx_lock(&zone->shpool->mutex);

    kn = ngx_http_hermes_registry_mine(zone, ref);
    if (kn) {
        kn->host = (uint8_t) ref->host;
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);
}


/*
 * Warm pools.  A warm kernel is an entry of no owner (no owner is ""), so
 * its owner's run of the tree holds the zone's warm kernels and nothing
 * else, and no owner's listing or limit sees them.  Its session is the
 * hash of what it was spawned with and a random slot: a kernel spawned
 * with another configuration matches no pool and is reaped.
 */

#define ngx_http_hermes_node_warm_hash(kn)                                    \
    ngx_http_hermes_node_session(kn)

static ngx_str_t  ngx_http_hermes_warm_owner = ngx_string("");


/*
 * The zone's pool of warm kernels like kn (or of its backend and
 * environment "env": hash NULL)
 */

static ngx_http_hermes_warm_t *
ngx_http_hermes_registry_warm_pool(ngx_http_hermes_zone_t *zone, u_char *tag,
    u_char *hash, uint32_t env)
{
    ngx_uint_t               i;
    ngx_http_hermes_warm_t  *w;

    if (zone->warm == NULL) {
        return NULL;
    }

    w = zone->warm->elts;

    for (i = 0; i < zone->warm->nelts; i++) {
        if (w[i].n
            && ngx_memcmp(w[i].tag, tag, NGX_HTTP_HERMES_BACKEND_TAG_LEN) == 0
            && (hash == NULL
                ? w[i].env_id == env
                : ngx_memcmp(w[i].hash, hash, NGX_HTTP_HERMES_WARM_HASH_LEN)
                  == 0))
        {
            return &w[i];
        }
    }

    return NULL;
}


static ngx_uint_t
ngx_http_hermes_registry_warm_of(ngx_http_hermes_node_t *kn,
    ngx_http_hermes_warm_t *w)
{
    return ngx_memcmp(ngx_http_hermes_node_tag(kn), w->tag,
                      NGX_HTTP_HERMES_BACKEND_TAG_LEN) == 0
           && ngx_memcmp(ngx_http_hermes_node_warm_hash(kn), w->hash,
                         NGX_HTTP_HERMES_WARM_HASH_LEN) == 0;
}


/*
 * A slot in a pool, made under the lock like the entry of a first request:
 * workers that refill at once never make more than w->n.  The entry is
 * SPAWNING, its turn held by this worker (a worker that dies spawning is
 * reclaimed by the sweep); ref->key.data has NGX_HTTP_HERMES_WARM_KEY_LEN
 * bytes.  NGX_DECLINED: the pool is full, or the registry is.
 */

ngx_int_t
ngx_http_hermes_registry_warm_reserve(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_warm_t *w, ngx_uint_t host,
    ngx_http_hermes_kernel_ref_t *ref)
{
    u_char                  *p;
    size_t                   n, dir_len;
    uint32_t                 ohash;
    ngx_str_t               *root;
    ngx_uint_t               count;
    ngx_rbtree_key_t         hash;
    ngx_http_hermes_node_t  *kn;
    u_char                   slot[NGX_HTTP_HERMES_ID_LEN / 2];

    root = &w->hlcf->backend->root;

    p = ref->key.data;
    *p++ = '\0';
    p = ngx_cpymem(p, w->tag, NGX_HTTP_HERMES_BACKEND_TAG_LEN);
    *p++ = '\0';
    p = ngx_cpymem(p, w->hash, NGX_HTTP_HERMES_WARM_HASH_LEN);
    randombytes_buf(slot, sizeof(slot));
    p = ngx_hex_dump(p, slot, sizeof(slot));

    ref->key.len = p - ref->key.data;
    ref->owner.data = ref->key.data;
    ref->owner.len = 0;
    ref->session.data = ref->key.data + 2 + NGX_HTTP_HERMES_BACKEND_TAG_LEN;
    ref->session.len = p - ref->session.data;

    hash = ngx_http_hermes_registry_key(ref, &ohash);

    dir_len = root->len + sizeof("/hermes_rkernel_") - 1
              + NGX_HTTP_HERMES_ID_LEN;
    n = offsetof(ngx_http_hermes_node_t, data) + ref->key.len + dir_len;

    ngx_shmtx_lock(&zone->shpool->mutex);

    count = 0;

    for (kn = ngx_http_hermes_registry_owner_next(zone, &ref->owner, ohash,
                                                  NULL);
         kn;
         kn = ngx_http_hermes_registry_owner_next(zone, &ref->owner, ohash,
                                                  kn))
    {
        if (kn->state != NGX_HTTP_HERMES_STATE_LOST && kn->host == host
            && ngx_http_hermes_registry_warm_of(kn, w))
        {
            count++;
        }
    }

    /* a pool never makes room for itself: it fills what is free */

    if (count >= w->n || zone->sh->kernels >= zone->max_kernels) {
        ngx_shmtx_unlock(&zone->shpool->mutex);
        return NGX_DECLINED;
    }

    kn = ngx_slab_alloc_locked(zone->shpool, n);
    if (kn == NULL) {
        ngx_shmtx_unlock(&zone->shpool->mutex);
        return NGX_DECLINED;
    }

    ngx_memzero(kn, offsetof(ngx_http_hermes_node_t, data));

    kn->node.key = hash;
    kn->key_len = (uint16_t) ref->key.len;
    kn->owner_len = 0;
    kn->dir_len = (uint16_t) dir_len;
    kn->gen = randombytes_random();
    kn->created = ngx_http_hermes_now_ms();
    kn->last_used = kn->created;
    kn->turn_at = kn->created;
    kn->state = NGX_HTTP_HERMES_STATE_LOST;
    kn->host = (uint8_t) host;
    kn->env = w->env_id;

    ngx_memcpy(kn->data, ref->key.data, ref->key.len);

    ngx_rbtree_insert(&zone->sh->rbtree, &kn->node);
    ngx_queue_insert_head(&zone->sh->lost, &kn->queue);

    /* the spawn's turn, as a first request's */

    kn->ticket_next = 1;
    kn->claimed = 1;
    kn->holder = ngx_pid;

    ngx_http_hermes_registry_new_kernel(kn, root);
    ngx_http_hermes_registry_set_state(zone, kn,
                                       NGX_HTTP_HERMES_STATE_SPAWNING);

    ngx_http_hermes_registry_snapshot(kn, ref);

    ref->gen = kn->gen;
    ref->ticket = 0;
    ref->spawn = 1;
    ref->reused = 0;
    ref->state_lost = 0;

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return NGX_OK;
}


/*
 * A warm kernel is up: idle, in the pool, until a new session takes it.
 * NGX_DECLINED: the turn is not this worker's any more (its slot went).
 */

ngx_int_t
ngx_http_hermes_registry_warm_spawned(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_spawned_t *k)
{
    ngx_http_hermes_node_t  *kn;

    ngx_shmtx_lock(&zone->shpool->mutex);

    kn = ngx_http_hermes_registry_mine(zone, ref);

    if (kn == NULL) {
        ngx_shmtx_unlock(&zone->shpool->mutex);
        return NGX_DECLINED;
    }

    ngx_http_hermes_registry_kernel_up(kn, k);

    kn->cell_seq = 0;
    kn->execution_count = 0;
    ngx_http_hermes_registry_set_state(zone, kn, NGX_HTTP_HERMES_STATE_IDLE);

    /* the pool's clock starts now, as the runner's idle clock did */
    ngx_http_hermes_registry_end_turn(zone, kn);

    zone->sh->counters.spawned_total++;

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return NGX_OK;
}


/* a slot whose spawn failed ("failed") or was never posted goes */

void
ngx_http_hermes_registry_warm_failed(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_uint_t failed)
{
    ngx_http_hermes_node_t  *kn;

    ngx_shmtx_lock(&zone->shpool->mutex);

    kn = ngx_http_hermes_registry_mine(zone, ref);

    if (kn) {
        if (failed) {
            ngx_http_hermes_registry_host_failed(zone,
                                                 ngx_http_hermes_node_tag(kn),
                                                 kn->host);
        }

        ngx_http_hermes_registry_delete(zone, kn);
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);
}


/*
 * Called locked, by acquire: a request that would spawn a kernel for its
 * entry kn takes a warm one of the pool of its backend instead, the oldest
 * (the nearest to retiring).  The entry gets the kernel, its owner and
 * session are bound now; the request runs its cell at once on it, as on a
 * kernel it had spawned, and the pool is refilled off this request.
 */

static ngx_int_t
ngx_http_hermes_registry_warm_take(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn, ngx_http_hermes_kernel_ref_t *ref)
{
    uint32_t                 ohash;
    ngx_http_hermes_warm_t  *w;
    ngx_http_hermes_node_t  *wk, *best;

    w = ngx_http_hermes_registry_warm_pool(zone, ngx_http_hermes_node_tag(kn),
                                           NULL, ref->env);
    if (w == NULL) {
        return NGX_HTTP_HERMES_ACQ_SPAWN;
    }

    ohash = ngx_crc32_short(ngx_http_hermes_warm_owner.data, 0);
    best = NULL;

    for (wk = ngx_http_hermes_registry_owner_next(zone,
                                    &ngx_http_hermes_warm_owner, ohash, NULL);
         wk;
         wk = ngx_http_hermes_registry_owner_next(zone,
                                    &ngx_http_hermes_warm_owner, ohash, wk))
    {
        if (wk->state == NGX_HTTP_HERMES_STATE_IDLE
            && ngx_http_hermes_pending(wk) == 0
            && wk->dir_len == kn->dir_len
            && ngx_http_hermes_registry_warm_of(wk, w)
            && (best == NULL || wk->last_used < best->last_used))
        {
            best = wk;
        }
    }

    if (best == NULL) {
        return NGX_HTTP_HERMES_ACQ_SPAWN;
    }

    ngx_memcpy(kn->kernel_id, best->kernel_id, NGX_HTTP_HERMES_ID_LEN);
    ngx_memcpy(kn->token, best->token, NGX_HTTP_HERMES_TOKEN_LEN);
    ngx_memcpy(ngx_http_hermes_node_dir(kn), ngx_http_hermes_node_dir(best),
               kn->dir_len);

    kn->pid = best->pid;
    kn->start = best->start;
    kn->ino = best->ino;
    kn->uid = best->uid;
    kn->host = best->host;
    kn->had_kernel = 1;
    kn->cell_seq = 1;
    kn->execution_count = 0;
    kn->mcp_peer = 0;
    ngx_http_hermes_registry_set_state(zone, kn,
                                       NGX_HTTP_HERMES_STATE_RUNNING);

    /* the kernel moved: its pool entry goes, nothing is killed */
    ngx_http_hermes_registry_delete(zone, best);

    ngx_http_hermes_registry_snapshot(kn, ref);

    ref->reused = 0;
    ref->spawn = 0;

    /* the pool refills after the request's work (ngx_hermes_kernel.c) */

    if (zone->warm_event) {
        ngx_post_event(zone->warm_event, &ngx_posted_events);
    }

    return NGX_HTTP_HERMES_ACQ_RUN;
}


/*
 * The pools' upkeep: entries of failed or reclaimed spawns go; kernels of
 * no pool of this configuration (a reload changed what they would be
 * spawned with) and kernels past half the idle timeout are reaped, long
 * before their runners would exit by themselves.  The rest of the local
 * ones are copied into check[] (*ncheck: its size, then its count), to be
 * checked alive off the lock.  Returns 1 when victims is full.
 */

ngx_uint_t
ngx_http_hermes_registry_warm_sweep(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_victims_t *victims, ngx_http_hermes_victim_t *check,
    ngx_uint_t *ncheck)
{
    uint32_t                    ohash;
    uint64_t                    now;
    ngx_uint_t                  n, max;
    ngx_http_hermes_warm_t     *w;
    ngx_http_hermes_node_t     *kn, *next;
    ngx_http_hermes_victims_t   one;

    now = ngx_http_hermes_now_ms();
    ohash = ngx_crc32_short(ngx_http_hermes_warm_owner.data, 0);
    max = *ncheck;
    n = 0;

    ngx_shmtx_lock(&zone->shpool->mutex);

    for (kn = ngx_http_hermes_registry_owner_next(zone,
                                    &ngx_http_hermes_warm_owner, ohash, NULL);
         kn;
         kn = next)
    {
        next = ngx_http_hermes_registry_owner_next(zone,
                                    &ngx_http_hermes_warm_owner, ohash, kn);

        if (ngx_http_hermes_pending(kn)) {
            continue;
        }

        if (kn->state == NGX_HTTP_HERMES_STATE_LOST) {
            ngx_http_hermes_registry_delete(zone, kn);
            continue;
        }

        w = ngx_http_hermes_registry_warm_pool(zone,
                                            ngx_http_hermes_node_tag(kn),
                                            ngx_http_hermes_node_warm_hash(kn),
                                            0);

        if (w == NULL
            || kn->host >= w->hlcf->backend->nhosts
            || (int64_t) (now - kn->last_used)
               >= (int64_t) (zone->idle_timeout / 2))
        {
            if (ngx_http_hermes_registry_evict(zone, kn, victims) != NGX_OK) {
                ngx_shmtx_unlock(&zone->shpool->mutex);
                *ncheck = n;
                return 1;
            }

            continue;
        }

        if (n < max) {
            one.n = 0;
            (void) ngx_http_hermes_registry_victim(kn, &one, kn->pid);
            check[n++] = one.v[0];
        }
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);

    *ncheck = n;

    return 0;
}


/* a warm kernel found dead: out of the pool, its remains to be removed */

void
ngx_http_hermes_registry_warm_drop(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_victim_t *v, ngx_http_hermes_victims_t *victims)
{
    uint32_t                 ohash;
    ngx_http_hermes_node_t  *kn;

    ohash = ngx_crc32_short(ngx_http_hermes_warm_owner.data, 0);

    ngx_shmtx_lock(&zone->shpool->mutex);

    for (kn = ngx_http_hermes_registry_owner_next(zone,
                                    &ngx_http_hermes_warm_owner, ohash, NULL);
         kn;
         kn = ngx_http_hermes_registry_owner_next(zone,
                                    &ngx_http_hermes_warm_owner, ohash, kn))
    {
        if (kn->state == NGX_HTTP_HERMES_STATE_IDLE
            && ngx_http_hermes_pending(kn) == 0
            && kn->pid == v->pid && kn->start == v->start
            && kn->dir_len == v->dir_len
            && ngx_memcmp(ngx_http_hermes_node_dir(kn), v->dir, v->dir_len)
               == 0)
        {
            (void) ngx_http_hermes_registry_evict(zone, kn, victims);
            break;
        }
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);
}


/*
 * Called locked, over the cap: warm kernels go first, the least recently
 * made one first; then a slot still spawning (its spawn, finding no slot,
 * kills what it made).  Not an eviction of anyone's kernel: not counted.
 */

static ngx_uint_t
ngx_http_hermes_registry_warm_evict(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_victims_t *victims)
{
    uint32_t                 ohash;
    ngx_http_hermes_node_t  *kn, *lru, *spawning;

    ohash = ngx_crc32_short(ngx_http_hermes_warm_owner.data, 0);
    lru = NULL;
    spawning = NULL;

    for (kn = ngx_http_hermes_registry_owner_next(zone,
                                    &ngx_http_hermes_warm_owner, ohash, NULL);
         kn;
         kn = ngx_http_hermes_registry_owner_next(zone,
                                    &ngx_http_hermes_warm_owner, ohash, kn))
    {
        if (kn->state == NGX_HTTP_HERMES_STATE_SPAWNING) {
            spawning = kn;

        } else if (kn->state == NGX_HTTP_HERMES_STATE_IDLE
                   && ngx_http_hermes_pending(kn) == 0
                   && (lru == NULL || kn->last_used < lru->last_used))
        {
            lru = kn;
        }
    }

    if (lru) {
        return ngx_http_hermes_registry_evict(zone, lru, victims) == NGX_OK;
    }

    if (spawning) {
        ngx_http_hermes_registry_delete(zone, spawning);
        return 1;
    }

    return 0;
}
