
/*
 * ngx_hermes: the kernel registry in the hermes_zone shared memory.
 *
 * An rbtree keyed by a crc32 of "owner \0 backend \0 session" (collisions
 * resolved by comparing the keys) and an LRU queue, as in
 * ngx_http_limit_req_module.c.  Every worker sees the same entries; the
 * zone is reused across reloads.
 *
 * Cells on one kernel run one at a time in arrival order: a request takes
 * ticket_next++ and runs when ticket_serving reaches its ticket.
 */


#include "ngx_hermes.h"

#include <sodium.h>


static ngx_http_hermes_node_t *ngx_http_hermes_registry_lookup(
    ngx_http_hermes_zone_t *zone, ngx_str_t *key, uint32_t hash);
static void ngx_http_hermes_registry_rbtree_insert(ngx_rbtree_node_t *temp,
    ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel);
static ngx_int_t ngx_http_hermes_registry_turn(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn, ngx_http_hermes_kernel_ref_t *ref,
    ngx_str_t *root);
static void ngx_http_hermes_registry_new_kernel(ngx_http_hermes_node_t *kn,
    ngx_str_t *root);
static void ngx_http_hermes_registry_snapshot(ngx_http_hermes_node_t *kn,
    ngx_http_hermes_kernel_ref_t *ref);
static void ngx_http_hermes_registry_delete(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn);


#define ngx_http_hermes_node_key(kn)   ((kn)->data)
#define ngx_http_hermes_node_dir(kn)   ((kn)->data + (kn)->key_len)

#define ngx_http_hermes_pending(kn)                                           \
    ((uint32_t) ((kn)->ticket_next - (kn)->ticket_serving))


ngx_int_t
ngx_http_hermes_registry_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_hermes_zone_t  *ozone = data;

    size_t                   len;
    ngx_http_hermes_zone_t  *zone;

    zone = shm_zone->data;

    if (ozone) {
        zone->sh = ozone->sh;
        zone->shpool = ozone->shpool;
        return NGX_OK;
    }

    zone->shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    if (shm_zone->shm.exists) {
        zone->sh = zone->shpool->data;
        return NGX_OK;
    }

    zone->sh = ngx_slab_alloc(zone->shpool, sizeof(ngx_http_hermes_sh_t));
    if (zone->sh == NULL) {
        return NGX_ERROR;
    }

    ngx_memzero(zone->sh, sizeof(ngx_http_hermes_sh_t));

    zone->shpool->data = zone->sh;

    ngx_rbtree_init(&zone->sh->rbtree, &zone->sh->sentinel,
                    ngx_http_hermes_registry_rbtree_insert);

    ngx_queue_init(&zone->sh->lru);

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


static ngx_http_hermes_node_t *
ngx_http_hermes_registry_lookup(ngx_http_hermes_zone_t *zone, ngx_str_t *key,
    uint32_t hash)
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


ngx_int_t
ngx_http_hermes_registry_acquire(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_str_t *root, ngx_uint_t queue)
{
    size_t                   n, dir_len;
    uint32_t                 hash;
    ngx_int_t                rc;
    ngx_http_hermes_node_t  *kn;

    hash = ngx_crc32_short(ref->key.data, ref->key.len);

    ngx_shmtx_lock(&zone->shpool->mutex);

    kn = ngx_http_hermes_registry_lookup(zone, &ref->key, hash);

    if (kn) {
        if (ngx_http_hermes_pending(kn) > queue) {
            ngx_shmtx_unlock(&zone->shpool->mutex);
            return NGX_HTTP_HERMES_ACQ_QUEUE_FULL;
        }

        ref->ticket = kn->ticket_next++;
        ref->gen = kn->gen;

        rc = ngx_http_hermes_registry_turn(zone, kn, ref, root);

        ngx_shmtx_unlock(&zone->shpool->mutex);
        return rc;
    }

    dir_len = root->len + sizeof("/hermes_rkernel_") - 1
              + NGX_HTTP_HERMES_ID_LEN;

    n = offsetof(ngx_http_hermes_node_t, data) + ref->key.len + dir_len;

    kn = ngx_slab_alloc_locked(zone->shpool, n);
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
    kn->created = (uint64_t) ngx_time() * 1000;
    kn->last_used = kn->created;
    kn->state = NGX_HTTP_HERMES_STATE_LOST;

    ngx_memcpy(kn->data, ref->key.data, ref->key.len);

    ngx_rbtree_insert(&zone->sh->rbtree, &kn->node);
    ngx_queue_insert_head(&zone->sh->lru, &kn->queue);

    ref->ticket = kn->ticket_next++;
    ref->gen = kn->gen;

    rc = ngx_http_hermes_registry_turn(zone, kn, ref, root);

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
    kn->last_used = ngx_http_hermes_now_ms();

    ngx_queue_remove(&kn->queue);
    ngx_queue_insert_head(&zone->sh->lru, &kn->queue);

    if (kn->state == NGX_HTTP_HERMES_STATE_LOST) {
        /* no kernel (new entry, or the last one died): spawn one */

        ref->state_lost = kn->had_kernel;
        ref->reused = 0;
        ref->spawn = 1;

        ngx_http_hermes_registry_new_kernel(kn, root);
        kn->state = NGX_HTTP_HERMES_STATE_SPAWNING;

        ngx_http_hermes_registry_snapshot(kn, ref);

        return NGX_HTTP_HERMES_ACQ_SPAWN;
    }

    kn->state = NGX_HTTP_HERMES_STATE_RUNNING;
    kn->cell_seq++;

    ref->reused = 1;
    ref->spawn = 0;

    ngx_http_hermes_registry_snapshot(kn, ref);

    return NGX_HTTP_HERMES_ACQ_RUN;
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
    kn->cell_seq = 0;
    kn->execution_count = 0;
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
    ref->cell_id = kn->cell_seq;
    ref->execution_count = kn->execution_count;
}


ngx_int_t
ngx_http_hermes_registry_poll(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_str_t *root)
{
    uint32_t                 hash;
    ngx_int_t                rc;
    ngx_http_hermes_node_t  *kn;

    hash = ngx_crc32_short(ref->key.data, ref->key.len);

    ngx_shmtx_lock(&zone->shpool->mutex);

    kn = ngx_http_hermes_registry_lookup(zone, &ref->key, hash);

    if (kn == NULL || kn->gen != ref->gen
        || (int32_t) (ref->ticket - kn->ticket_serving) < 0)
    {
        rc = NGX_HTTP_HERMES_ACQ_GONE;

    } else {
        rc = ngx_http_hermes_registry_turn(zone, kn, ref, root);
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return rc;
}


static ngx_http_hermes_node_t *
ngx_http_hermes_registry_mine(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref)
{
    uint32_t                 hash;
    ngx_http_hermes_node_t  *kn;

    hash = ngx_crc32_short(ref->key.data, ref->key.len);

    kn = ngx_http_hermes_registry_lookup(zone, &ref->key, hash);

    if (kn == NULL || kn->gen != ref->gen
        || kn->ticket_serving != ref->ticket || !kn->claimed
        || ngx_memcmp(kn->kernel_id, ref->kernel_id, NGX_HTTP_HERMES_ID_LEN)
           != 0)
    {
        return NULL;
    }

    return kn;
}


/* the kernel died between cells: the turn's holder spawns a new one */

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

    zone->sh->kernels--;

    ngx_http_hermes_registry_new_kernel(kn, root);
    kn->state = NGX_HTTP_HERMES_STATE_SPAWNING;

    ngx_http_hermes_registry_snapshot(kn, ref);

    ref->state_lost = 1;
    ref->reused = 0;
    ref->spawn = 1;

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return NGX_OK;
}


ngx_int_t
ngx_http_hermes_registry_spawned(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref)
{
    ngx_http_hermes_node_t  *kn;

    ngx_shmtx_lock(&zone->shpool->mutex);

    kn = ngx_http_hermes_registry_mine(zone, ref);

    if (kn == NULL) {
        ngx_shmtx_unlock(&zone->shpool->mutex);
        return NGX_DECLINED;
    }

    kn->pid = ref->pid;
    kn->had_kernel = 1;
    kn->state = NGX_HTTP_HERMES_STATE_RUNNING;
    kn->cell_seq = 1;
    ref->cell_id = 1;
    ref->execution_count = 0;

    zone->sh->kernels++;
    zone->sh->spawned_total++;

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

    kn->ticket_serving++;
    kn->claimed = 0;
    kn->holder = 0;
    kn->last_used = ngx_http_hermes_now_ms();

    if (how == NGX_HTTP_HERMES_RELEASE_DONE) {
        kn->state = NGX_HTTP_HERMES_STATE_IDLE;
        kn->execution_count = (uint32_t) execution_count;

        ngx_shmtx_unlock(&zone->shpool->mutex);
        return;
    }

    if (kn->state != NGX_HTTP_HERMES_STATE_SPAWNING) {
        zone->sh->kernels--;
    }

    if (how == NGX_HTTP_HERMES_RELEASE_GONE
        && kn->state == NGX_HTTP_HERMES_STATE_SPAWNING)
    {
        zone->sh->spawn_failures_total++;
    }

    if (how == NGX_HTTP_HERMES_RELEASE_GONE
        && ngx_http_hermes_pending(kn) == 0)
    {
        ngx_http_hermes_registry_delete(zone, kn);

        ngx_shmtx_unlock(&zone->shpool->mutex);
        return;
    }

    /* a tombstone: the next turn spawns afresh, reporting state_lost */

    kn->state = NGX_HTTP_HERMES_STATE_LOST;
    kn->had_kernel = (how == NGX_HTTP_HERMES_RELEASE_LOST);
    kn->pid = 0;

    ngx_shmtx_unlock(&zone->shpool->mutex);
}


static void
ngx_http_hermes_registry_delete(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_node_t *kn)
{
    ngx_queue_remove(&kn->queue);
    ngx_rbtree_delete(&zone->sh->rbtree, &kn->node);
    ngx_slab_free_locked(zone->shpool, kn);
}

