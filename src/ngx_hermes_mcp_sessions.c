
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: hermes_mcp's client sessions in the zone.  Each is bound to
 * the owner that made it: another owner's id is as good as none.  The
 * least recently used give way at the cap, and any idle past the
 * timeout goes when the next session is made.  Each remembers its last
 * execute_code call in flight, for notifications/cancelled, which may
 * come to any worker.
 */


#include "ngx_hermes.h"
#include "ngx_hermes_registry_zone.h"

#include <sodium.h>


typedef struct {
    ngx_rbtree_node_t             node;         /* key: crc32 of the id */
    ngx_queue_t                   queue;
    u_char                        id[NGX_HTTP_HERMES_MCP_ID_LEN];
    time_t                        last_used;
    uint8_t                       version;
    uint8_t                       level;
    uint16_t                      owner_len;
    /* the call in flight: a crc32 of its request id, its kernel session */
    uint32_t                      call;
    uint8_t                       call_session_len;
    u_char                        call_session[NGX_HTTP_HERMES_SESSION_MAX];
    u_char                        owner[1];
} ngx_http_hermes_mcp_node_t;


static void ngx_http_hermes_mcp_sessions_ready(ngx_http_hermes_sh_t *sh);
static void ngx_http_hermes_mcp_sessions_insert(ngx_rbtree_node_t *temp,
    ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel);
static ngx_http_hermes_mcp_node_t *ngx_http_hermes_mcp_sessions_lookup(
    ngx_http_hermes_sh_t *sh, u_char *id);
static ngx_http_hermes_mcp_node_t *ngx_http_hermes_mcp_sessions_owned(
    ngx_http_hermes_sh_t *sh, ngx_str_t *owner, u_char *id);
static void ngx_http_hermes_mcp_sessions_expire(ngx_http_hermes_zone_t *zone,
    ngx_uint_t max, time_t timeout);
static void ngx_http_hermes_mcp_sessions_free(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_mcp_node_t *mn);


/*
 * Called locked: the tree is made at its first use, in the zone the
 * registry made zeroed (the registry need not know of it).
 */

static void
ngx_http_hermes_mcp_sessions_ready(ngx_http_hermes_sh_t *sh)
{
    if (sh->mcp_rbtree.root == NULL) {
        ngx_rbtree_init(&sh->mcp_rbtree, &sh->mcp_sentinel,
                        ngx_http_hermes_mcp_sessions_insert);
        ngx_queue_init(&sh->mcp_lru);
        sh->mcp_sessions = 0;
    }
}


/* a new session of the owner's: mc->id is made here */

ngx_int_t
ngx_http_hermes_mcp_sessions_open(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_http_hermes_mcp_client_t *mc)
{
    u_char                       raw[NGX_HTTP_HERMES_MCP_ID_LEN / 2];
    size_t                       size;
    ngx_http_hermes_mcp_node_t  *mn;

    randombytes_buf(raw, sizeof(raw));
    ngx_hex_dump(mc->id, raw, sizeof(raw));

    size = offsetof(ngx_http_hermes_mcp_node_t, owner) + owner->len;

    ngx_shmtx_lock(&zone->shpool->mutex);
    ngx_http_hermes_mcp_sessions_ready(zone->sh);

    /* room for the new one within the zone's mcp_sessions */
    ngx_http_hermes_mcp_sessions_expire(zone, zone->mcp_sessions - 1,
                                        zone->mcp_session_timeout);

    mn = ngx_slab_alloc_locked(zone->shpool, size);

    if (mn == NULL && !ngx_queue_empty(&zone->sh->mcp_lru)) {
        /* the oldest gives way to the new one */
        ngx_http_hermes_mcp_sessions_free(zone,
                      ngx_queue_data(ngx_queue_last(&zone->sh->mcp_lru),
                                     ngx_http_hermes_mcp_node_t, queue));

        mn = ngx_slab_alloc_locked(zone->shpool, size);
    }

    if (mn == NULL) {
        ngx_shmtx_unlock(&zone->shpool->mutex);
        return NGX_ERROR;
    }

    mn->node.key = ngx_crc32_short(mc->id, NGX_HTTP_HERMES_MCP_ID_LEN);
    ngx_memcpy(mn->id, mc->id, NGX_HTTP_HERMES_MCP_ID_LEN);
    mn->last_used = ngx_time();
    mn->version = (uint8_t) mc->version;
    mn->level = (uint8_t) mc->level;
    mn->owner_len = (uint16_t) owner->len;
    mn->call = 0;
    mn->call_session_len = 0;
    ngx_memcpy(mn->owner, owner->data, owner->len);

    ngx_rbtree_insert(&zone->sh->mcp_rbtree, &mn->node);
    ngx_queue_insert_head(&zone->sh->mcp_lru, &mn->queue);
    zone->sh->mcp_sessions++;

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return NGX_OK;
}


/*
 * The owner's session of mc->id, its version and level into mc, and it
 * counts as used now.  NGX_DECLINED: none, another owner's, or expired.
 */

ngx_int_t
ngx_http_hermes_mcp_sessions_find(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_http_hermes_mcp_client_t *mc)
{
    time_t                       now;
    ngx_http_hermes_mcp_node_t  *mn;

    now = ngx_time();

    ngx_shmtx_lock(&zone->shpool->mutex);
    ngx_http_hermes_mcp_sessions_ready(zone->sh);

    mn = ngx_http_hermes_mcp_sessions_owned(zone->sh, owner, mc->id);

    if (mn == NULL) {
        ngx_shmtx_unlock(&zone->shpool->mutex);
        return NGX_DECLINED;
    }

    if (now - mn->last_used > zone->mcp_session_timeout) {
        ngx_http_hermes_mcp_sessions_free(zone, mn);
        ngx_shmtx_unlock(&zone->shpool->mutex);
        return NGX_DECLINED;
    }

    mn->last_used = now;
    ngx_queue_remove(&mn->queue);
    ngx_queue_insert_head(&zone->sh->mcp_lru, &mn->queue);

    mc->version = mn->version;
    mc->level = mn->level;

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return NGX_OK;
}


ngx_int_t
ngx_http_hermes_mcp_sessions_set_level(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_http_hermes_mcp_client_t *mc)
{
    ngx_http_hermes_mcp_node_t  *mn;

    ngx_shmtx_lock(&zone->shpool->mutex);
    ngx_http_hermes_mcp_sessions_ready(zone->sh);

    mn = ngx_http_hermes_mcp_sessions_owned(zone->sh, owner, mc->id);

    if (mn == NULL) {
        ngx_shmtx_unlock(&zone->shpool->mutex);
        return NGX_DECLINED;
    }

    mn->level = (uint8_t) mc->level;

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return NGX_OK;
}


ngx_int_t
ngx_http_hermes_mcp_sessions_close(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_http_hermes_mcp_client_t *mc)
{
    ngx_http_hermes_mcp_node_t  *mn;

    ngx_shmtx_lock(&zone->shpool->mutex);
    ngx_http_hermes_mcp_sessions_ready(zone->sh);

    mn = ngx_http_hermes_mcp_sessions_owned(zone->sh, owner, mc->id);

    if (mn == NULL) {
        ngx_shmtx_unlock(&zone->shpool->mutex);
        return NGX_DECLINED;
    }

    ngx_http_hermes_mcp_sessions_free(zone, mn);

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return NGX_OK;
}


/*
 * The session's call "call" (a crc32 of its request id; 0: none) runs
 * in kernel session "session"; it ends with session NULL.
 */

void
ngx_http_hermes_mcp_sessions_call(ngx_http_hermes_zone_t *zone,
    u_char *id, uint32_t call, ngx_str_t *session)
{
    ngx_http_hermes_mcp_node_t  *mn;

    ngx_shmtx_lock(&zone->shpool->mutex);
    ngx_http_hermes_mcp_sessions_ready(zone->sh);

    mn = ngx_http_hermes_mcp_sessions_lookup(zone->sh, id);

    if (mn && session) {
        mn->call = call;
        mn->call_session_len = (uint8_t) session->len;
        ngx_memcpy(mn->call_session, session->data, session->len);

    } else if (mn && mn->call == call) {
        mn->call = 0;
        mn->call_session_len = 0;
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);
}


/* the kernel session of the owner's call "call" in flight, if it is */

ngx_int_t
ngx_http_hermes_mcp_sessions_cancel(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_http_hermes_mcp_client_t *mc, uint32_t call,
    ngx_str_t *session)
{
    ngx_int_t                    rc;
    ngx_http_hermes_mcp_node_t  *mn;

    rc = NGX_DECLINED;

    ngx_shmtx_lock(&zone->shpool->mutex);
    ngx_http_hermes_mcp_sessions_ready(zone->sh);

    mn = ngx_http_hermes_mcp_sessions_owned(zone->sh, owner, mc->id);

    if (mn && call && mn->call == call && mn->call_session_len) {
        session->len = mn->call_session_len;
        ngx_memcpy(session->data, mn->call_session, session->len);
        mn->call = 0;
        mn->call_session_len = 0;
        rc = NGX_OK;
    }

    ngx_shmtx_unlock(&zone->shpool->mutex);

    return rc;
}


/* under the lock: the idle ones, then the oldest over "max" */

static void
ngx_http_hermes_mcp_sessions_expire(ngx_http_hermes_zone_t *zone,
    ngx_uint_t max, time_t timeout)
{
    time_t                       now;
    ngx_queue_t                 *q;
    ngx_http_hermes_mcp_node_t  *mn;

    now = ngx_time();

    while (!ngx_queue_empty(&zone->sh->mcp_lru)) {
        q = ngx_queue_last(&zone->sh->mcp_lru);
        mn = ngx_queue_data(q, ngx_http_hermes_mcp_node_t, queue);

        if (zone->sh->mcp_sessions <= max && now - mn->last_used <= timeout)
        {
            break;
        }

        ngx_http_hermes_mcp_sessions_free(zone, mn);
    }
}


static void
ngx_http_hermes_mcp_sessions_free(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_mcp_node_t *mn)
{
    ngx_queue_remove(&mn->queue);
    ngx_rbtree_delete(&zone->sh->mcp_rbtree, &mn->node);
    zone->sh->mcp_sessions--;
    ngx_slab_free_locked(zone->shpool, mn);
}


static ngx_http_hermes_mcp_node_t *
ngx_http_hermes_mcp_sessions_lookup(ngx_http_hermes_sh_t *sh, u_char *id)
{
    ngx_int_t                    rc;
    ngx_rbtree_key_t             key;
    ngx_rbtree_node_t           *node, *sentinel;
    ngx_http_hermes_mcp_node_t  *mn;

    key = ngx_crc32_short(id, NGX_HTTP_HERMES_MCP_ID_LEN);

    node = sh->mcp_rbtree.root;
    sentinel = sh->mcp_rbtree.sentinel;

    while (node != sentinel) {

        if (key < node->key) {
            node = node->left;
            continue;
        }

        if (key > node->key) {
            node = node->right;
            continue;
        }

        mn = (ngx_http_hermes_mcp_node_t *) node;

        rc = ngx_memcmp(id, mn->id, NGX_HTTP_HERMES_MCP_ID_LEN);

        if (rc == 0) {
            return mn;
        }

        node = (rc < 0) ? node->left : node->right;
    }

    return NULL;
}


/* the session of this id if it is the owner's */

static ngx_http_hermes_mcp_node_t *
ngx_http_hermes_mcp_sessions_owned(ngx_http_hermes_sh_t *sh,
    ngx_str_t *owner, u_char *id)
{
    ngx_http_hermes_mcp_node_t  *mn;

    mn = ngx_http_hermes_mcp_sessions_lookup(sh, id);

    if (mn == NULL
        || mn->owner_len != owner->len
        || ngx_memcmp(mn->owner, owner->data, owner->len) != 0)
    {
        return NULL;
    }

    return mn;
}


static void
ngx_http_hermes_mcp_sessions_insert(ngx_rbtree_node_t *temp,
    ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel)
{
    ngx_rbtree_node_t           **p;
    ngx_http_hermes_mcp_node_t   *mn, *mnt;

    for ( ;; ) {

        if (node->key < temp->key) {
            p = &temp->left;

        } else if (node->key > temp->key) {
            p = &temp->right;

        } else {
            mn = (ngx_http_hermes_mcp_node_t *) node;
            mnt = (ngx_http_hermes_mcp_node_t *) temp;

            p = (ngx_memcmp(mn->id, mnt->id, NGX_HTTP_HERMES_MCP_ID_LEN) < 0)
                ? &temp->left : &temp->right;
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
