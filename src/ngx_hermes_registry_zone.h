
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: the registry's own layout in shared memory, private to
 * ngx_hermes_registry.c (and its unit tests), as limit_req keeps its node
 * type inside its .c; ngx_hermes_mcp_sessions.c keeps its own tree in it.
 */


#ifndef _NGX_HERMES_REGISTRY_ZONE_H_INCLUDED_
#define _NGX_HERMES_REGISTRY_ZONE_H_INCLUDED_


#include "ngx_hermes.h"


struct ngx_http_hermes_sh_s {
    /* made anew with the zone: tells its kernels from earlier ones' */
    u_char                        instance[NGX_HTTP_HERMES_TAG_HEX];
    ngx_atomic_t                  recovered;    /* leftovers looked for */

    ngx_rbtree_t                  rbtree;
    ngx_rbtree_node_t             sentinel;
    ngx_queue_t                   lru;          /* with a kernel: most
                                                   recent at head */
    ngx_queue_t                   lost;         /* without: tombstones,
                                                   spawns to come */
    ngx_uint_t                    kernels;      /* entries with a kernel */

    ngx_http_hermes_counters_t    counters;

    ngx_http_hermes_hist_t        hist[NGX_HTTP_HERMES_NHIST];

    /* slots are added under the lock, then counted atomically */
    ngx_atomic_uint_t             nanswers;
    ngx_http_hermes_answers_t     answers[NGX_HTTP_HERMES_ANSWERS];
    ngx_uint_t                    nhosts;
    ngx_http_hermes_host_count_t  hosts[NGX_HTTP_HERMES_HOSTS];

    /*
     * MCP sessions of kernels that ended, for the next call to their
     * server (in any worker) to end with DELETE; the oldest give way
     */
    ngx_uint_t                    mcp_ended_next;
    ngx_http_hermes_mcp_session_t mcp_ended[NGX_HTTP_HERMES_MCP_ENDED];
    ngx_http_hermes_env_count_t   envs[NGX_HTTP_HERMES_ENVS];
    /* hermes_mcp's clients' sessions (ngx_hermes_mcp_sessions.c) */
    ngx_rbtree_t                  mcp_rbtree;
    ngx_rbtree_node_t             mcp_sentinel;
    ngx_queue_t                   mcp_lru;      /* most recent at head */
    ngx_uint_t                    mcp_sessions;
};


/*
 * One kernel.  The node's key is a crc32 of the owner and one of the
 * registry key "owner \0 backend-tag \0 session" (see
 * ngx_hermes_registry.c); the key and the kernel's directory follow the
 * struct in data[].
 */
typedef struct {
    ngx_rbtree_node_t             node;
    ngx_queue_t                   queue;

    u_char                        kernel_id[NGX_HTTP_HERMES_ID_LEN];
    u_char                        token[NGX_HTTP_HERMES_TOKEN_LEN];

    ngx_pid_t                     pid;          /* kernel process group */
    ngx_pid_t                     holder;       /* worker running a cell */

    /* what tells this kernel from a stranger reusing its pid or its path */
    uint64_t                      start;        /* pid's start, clock ticks */
    uint64_t                      ino;          /* the directory's inode */
    uint32_t                      uid;          /* the kernel's user */

    uint64_t                      created;      /* ms since the epoch */
    uint64_t                      last_used;
    uint64_t                      turn_at;      /* when "serving" moved */

    uint32_t                      execution_count;
    uint32_t                      cell_seq;     /* last cell id shipped */

    /* arrival order: a request takes ticket_next++, runs at its turn */
    uint32_t                      ticket_next;
    uint32_t                      ticket_serving;

    uint32_t                      gen;          /* tells a reused key */
    uint32_t                      env;          /* its environment's id */

    /*
     * The kernel's own MCP session with its tools server: the server (a
     * crc32 of the hermes_tools_pass URI; 0: none yet), Mcp-Session-Id
     * (may be empty) and the protocol version the server chose.  Never
     * another kernel's, so never another owner's.
     */
    uint32_t                      mcp_peer;
    u_char                        mcp_session[NGX_HTTP_HERMES_MCP_SESSION_MAX];
    u_char                        mcp_version[NGX_HTTP_HERMES_MCP_VERSION_MAX];
    uint8_t                       mcp_session_len;
    uint8_t                       mcp_version_len;

    uint8_t                       state;
    uint8_t                       host;         /* index in the backend */
    uint8_t                       lost_reason;  /* a tombstone's */
    unsigned                      claimed:1;    /* serving ticket runs */
    unsigned                      had_kernel:1; /* a lost one: state_lost */

    uint16_t                      key_len;
    uint16_t                      owner_len;
    uint16_t                      dir_len;

    u_char                        data[1];      /* key, dir */
} ngx_http_hermes_node_t;


#endif /* _NGX_HERMES_REGISTRY_ZONE_H_INCLUDED_ */
