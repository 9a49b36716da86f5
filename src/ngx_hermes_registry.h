
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: the registry: the kernels of a zone in shared memory, as the
 * rest of the module sees it (its own layout is in
 * ngx_hermes_registry_zone.h).
 */


#ifndef _NGX_HERMES_REGISTRY_H_INCLUDED_
#define _NGX_HERMES_REGISTRY_H_INCLUDED_


#include "ngx_hermes.h"


typedef enum {
    NGX_HTTP_HERMES_STATE_SPAWNING = 0,
    NGX_HTTP_HERMES_STATE_IDLE,
    NGX_HTTP_HERMES_STATE_RUNNING,
    NGX_HTTP_HERMES_STATE_LOST          /* tombstone: "state_lost" for next */
} ngx_http_hermes_state_e;


/* why a session's kernel was lost, told to its next call */

typedef enum {
    NGX_HTTP_HERMES_LOST_NONE = 0,
    NGX_HTTP_HERMES_LOST_IDLE,
    NGX_HTTP_HERMES_LOST_CAP,
    NGX_HTTP_HERMES_LOST_DELETED,
    NGX_HTTP_HERMES_LOST_DIED,
    NGX_HTTP_HERMES_LOST_TIMEOUT,
    NGX_HTTP_HERMES_LOST_MEMORY         /* the zone needed the room */
} ngx_http_hermes_lost_e;

extern ngx_str_t  ngx_http_hermes_lost_names[];


typedef enum {
    NGX_HTTP_HERMES_CELL_SUCCESS = 0,
    NGX_HTTP_HERMES_CELL_ERROR,
    NGX_HTTP_HERMES_CELL_TIMEOUT,
    NGX_HTTP_HERMES_CELL_INTERRUPTED,
    NGX_HTTP_HERMES_CELL_NSTATUS
} ngx_http_hermes_cell_status_e;


typedef enum {
    NGX_HTTP_HERMES_RPC_MALFORMED = 0,
    NGX_HTTP_HERMES_RPC_BAD_TOKEN,
    NGX_HTTP_HERMES_RPC_BAD_SEQ,
    NGX_HTTP_HERMES_RPC_REPLAY,
    NGX_HTTP_HERMES_RPC_NREJECT
} ngx_http_hermes_rpc_reject_e;

extern ngx_str_t  ngx_http_hermes_rpc_reject_names[];


/*
 * Histograms of durations, in ms: a count per bucket (not cumulative: one
 * atomic add a sample) and the sum.  The buckets' upper bounds are
 * ngx_http_hermes_buckets[] (ngx_hermes_registry.c), the last is +Inf.
 */

#define NGX_HTTP_HERMES_BUCKETS   14

typedef enum {
    NGX_HTTP_HERMES_HIST_CELL = 0,      /* a cell, from its turn on */
    NGX_HTTP_HERMES_HIST_QUEUE,         /* waiting for the turn */
    NGX_HTTP_HERMES_HIST_SPAWN,         /* a kernel's start */
    NGX_HTTP_HERMES_NHIST
} ngx_http_hermes_hist_e;

typedef struct {
    ngx_atomic_uint_t             buckets[NGX_HTTP_HERMES_BUCKETS];
    ngx_atomic_uint_t             sum_ms;
} ngx_http_hermes_hist_t;

extern ngx_msec_t  ngx_http_hermes_buckets[];


/* answers of hermes locations by HTTP status and error code */

#define NGX_HTTP_HERMES_ANSWERS   64
#define NGX_HTTP_HERMES_ERROR_MAX 32

typedef struct {
    ngx_atomic_uint_t             count;
    uint16_t                      status;
    uint8_t                       error_len;
    u_char                        error[NGX_HTTP_HERMES_ERROR_MAX];
} ngx_http_hermes_answers_t;


/* counters, changed under the zone's lock or atomically */

struct ngx_http_hermes_counters_s {
    ngx_atomic_uint_t             spawned_total;
    ngx_atomic_uint_t             spawn_failures_total;
    ngx_atomic_uint_t             evicted_idle_total;
    ngx_atomic_uint_t             evicted_cap_total;
    ngx_atomic_uint_t             evicted_deleted_total;
    ngx_atomic_uint_t             killed_timeout_total;
    ngx_atomic_uint_t             tool_calls_total;
    ngx_atomic_uint_t             cells_total[NGX_HTTP_HERMES_CELL_NSTATUS];
    ngx_atomic_uint_t             rpc_rejected_total[NGX_HTTP_HERMES_RPC_NREJECT];
    ngx_atomic_uint_t             mcp_requests_total[NGX_HTTP_HERMES_MCP_NMETHOD];
    ngx_atomic_uint_t             mcp_tool_calls_total[NGX_HTTP_HERMES_MCP_NTOOL];
};


/* kernels and spawns by environment (the first ones named) */

#define NGX_HTTP_HERMES_ENVS      32

typedef struct {
    uint32_t                      id;           /* 0: a free slot */
    ngx_atomic_uint_t             spawns;
    ngx_atomic_uint_t             spawn_ms;
} ngx_http_hermes_env_count_t;


typedef struct {
    uint32_t                      id;
    ngx_str_t                     name;         /* the handler's */
    ngx_uint_t                    kernels;
    ngx_uint_t                    spawns;
    ngx_uint_t                    spawn_ms;
} ngx_http_hermes_env_stats_t;


/* failed spawns by backend and host */

#define NGX_HTTP_HERMES_HOSTS     64

typedef struct {
    ngx_atomic_uint_t             spawn_failures;
    u_char                        tag[NGX_HTTP_HERMES_BACKEND_TAG_LEN];
    ngx_uint_t                    host;
} ngx_http_hermes_host_count_t;




/* a host's figures; the handler names it (hosts of one name are summed) */

typedef struct {
    u_char                        tag[NGX_HTTP_HERMES_BACKEND_TAG_LEN];
    ngx_uint_t                    host;
    ngx_str_t                     name;
    ngx_uint_t                    kernels;
    ngx_uint_t                    spawn_failures;
} ngx_http_hermes_host_stats_t;


typedef struct {
    ngx_uint_t                    kernels;
    ngx_uint_t                    running;
    ngx_uint_t                    warm;         /* ready in warm pools */
    ngx_uint_t                    queued;       /* cells waiting their turn */
    ngx_uint_t                    owners;       /* with kernels, if asked */
    ngx_uint_t                    spawned_total;
    ngx_uint_t                    spawn_failures_total;
    ngx_uint_t                    evicted_idle_total;
    ngx_uint_t                    evicted_cap_total;
    ngx_uint_t                    evicted_deleted_total;
    ngx_uint_t                    killed_timeout_total;
    ngx_uint_t                    tool_calls_total;
    ngx_uint_t                    cells_total[NGX_HTTP_HERMES_CELL_NSTATUS];
    ngx_uint_t                    rpc_rejected_total[NGX_HTTP_HERMES_RPC_NREJECT];
    ngx_uint_t                    mcp_requests_total[NGX_HTTP_HERMES_MCP_NMETHOD];
    ngx_uint_t                    mcp_tool_calls_total[NGX_HTTP_HERMES_MCP_NTOOL];
    ngx_uint_t                    mcp_sessions;
    ngx_uint_t                    nenvs;
    ngx_http_hermes_env_stats_t   envs[NGX_HTTP_HERMES_ENVS];
    ngx_uint_t                    hist[NGX_HTTP_HERMES_NHIST]
                                      [NGX_HTTP_HERMES_BUCKETS];
    ngx_uint_t                    hist_sum_ms[NGX_HTTP_HERMES_NHIST];
    ngx_uint_t                    nanswers;
    ngx_http_hermes_answers_t     answers[NGX_HTTP_HERMES_ANSWERS];
    ngx_uint_t                    nhosts;       /* one more: unattributed */
    ngx_http_hermes_host_stats_t  hosts[NGX_HTTP_HERMES_HOSTS + 1];
    size_t                        zone_bytes_used;
    size_t                        zone_bytes_total;
} ngx_http_hermes_stats_t;


/* an owner's kernels, for the status page (never in Prometheus labels) */

typedef struct {
    ngx_str_t                     owner;
    ngx_uint_t                    kernels;
    ngx_uint_t                    running;
} ngx_http_hermes_owner_stats_t;


/* a kernel for the listing endpoint, copied out of the zone */

typedef struct {
    ngx_str_t                     owner;        /* status page only */
    ngx_str_t                     session;
    u_char                        kernel_id[NGX_HTTP_HERMES_ID_LEN];
    ngx_uint_t                    state;
    ngx_uint_t                    execution_count;
    ngx_uint_t                    host;
    u_char                        tag[NGX_HTTP_HERMES_BACKEND_TAG_LEN];
    ngx_str_t                     backend_name;
    ngx_str_t                     host_name;
    uint32_t                      env;
    ngx_str_t                     env_name;     /* "": none */
    uint64_t                      created;
    uint64_t                      last_used;
    uint64_t                      running_for;
    ngx_uint_t                    queued;       /* status page only */
} ngx_http_hermes_listing_t;


/* kernels taken out of the registry, to kill once the lock is let go */

#define NGX_HTTP_HERMES_VICTIMS  8

typedef struct {
    u_char                        dir[NGX_HTTP_HERMES_DIR_MAX];
    size_t                        dir_len;
    ngx_pid_t                     pid;
    uint64_t                      start;        /* pid's start, clock ticks */
    uint64_t                      ino;          /* the directory's inode */
    ngx_uint_t                    host;
    u_char                        tag[NGX_HTTP_HERMES_BACKEND_TAG_LEN];
    /* for the log line: whose, and why (ngx_http_hermes_lost_e) */
    ngx_uint_t                    reason;
    size_t                        owner_len;
    size_t                        session_len;
    u_char                        owner[NGX_HTTP_HERMES_OWNER_MAX];
    u_char                        session[NGX_HTTP_HERMES_SESSION_MAX];
} ngx_http_hermes_victim_t;

typedef struct {
    ngx_uint_t                    n;
    ngx_http_hermes_victim_t      v[NGX_HTTP_HERMES_VICTIMS];
} ngx_http_hermes_victims_t;




/* what a request learns from, and keeps of, its kernel's entry */

typedef struct {
    ngx_str_t                     key;
    ngx_str_t                     owner;
    ngx_str_t                     session;

    u_char                        kernel_id[NGX_HTTP_HERMES_ID_LEN];
    u_char                        token[NGX_HTTP_HERMES_TOKEN_LEN];
    u_char                        dir[NGX_HTTP_HERMES_DIR_MAX];
    size_t                        dir_len;
    ngx_pid_t                     pid;
    uint64_t                      start;
    uint64_t                      ino;
    uint32_t                      uid;
    ngx_uint_t                    host;

    uint32_t                      gen;
    uint32_t                      ticket;
    uint32_t                      env;          /* an environment's id; 0:
                                                   none */
    uint64_t                      avoid;        /* hosts lacking it */
    uint32_t                      cell_id;
    uint32_t                      execution_count;

    ngx_uint_t                    lost_reason;  /* with state_lost */
    ngx_uint_t                    end_reason;   /* why this cell lost it */

    unsigned                      spawn:1;      /* this request spawns */
    unsigned                      reused:1;
    unsigned                      state_lost:1;
} ngx_http_hermes_kernel_ref_t;


/* what a spawn made: the id may differ from the one asked for (EEXIST) */

typedef struct {
    u_char                        kernel_id[NGX_HTTP_HERMES_ID_LEN];
    u_char                        dir[NGX_HTTP_HERMES_DIR_MAX];
    size_t                        dir_len;
    ngx_pid_t                     pid;
    uint64_t                      start;
    uint64_t                      ino;
    uint32_t                      uid;
} ngx_http_hermes_spawned_t;


typedef enum {
    NGX_HTTP_HERMES_RELEASE_DONE = 0,   /* cell finished, kernel idle */
    NGX_HTTP_HERMES_RELEASE_LOST,       /* kernel killed or died: state lost */
    NGX_HTTP_HERMES_RELEASE_GONE        /* ended by itself, or never started */
} ngx_http_hermes_release_e;


typedef enum {
    NGX_HTTP_HERMES_ACQ_RUN = 0,        /* our turn: run the cell */
    NGX_HTTP_HERMES_ACQ_SPAWN,          /* new entry: spawn, then run */
    NGX_HTTP_HERMES_ACQ_WAIT,           /* queued behind another cell */
    NGX_HTTP_HERMES_ACQ_QUEUE_FULL,
    NGX_HTTP_HERMES_ACQ_OWNER_FULL,     /* max_kernels_per_owner, all busy */
    NGX_HTTP_HERMES_ACQ_NOMEM,
    NGX_HTTP_HERMES_ACQ_GONE,           /* entry vanished while queued */
    NGX_HTTP_HERMES_ACQ_ENV_MISMATCH    /* its kernel is of another
                                           environment */
} ngx_http_hermes_acq_e;


ngx_int_t ngx_http_hermes_registry_init_zone(ngx_shm_zone_t *shm_zone,
    void *data);
ngx_int_t ngx_http_hermes_registry_acquire(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_str_t *root, ngx_uint_t queue,
    ngx_http_hermes_victims_t *victims);
void ngx_http_hermes_registry_sweep(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_victims_t *victims, ngx_uint_t full);
ngx_int_t ngx_http_hermes_registry_list(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_array_t *out);
ngx_int_t ngx_http_hermes_registry_running(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_str_t *session, ngx_http_hermes_victim_t *v,
    uint32_t *cell);
ngx_int_t ngx_http_hermes_registry_kernel(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_str_t *session, ngx_http_hermes_victim_t *v,
    ngx_http_hermes_kernel_ref_t *ref);

/* a running cell's kernel's MCP session with one server */

#define NGX_HTTP_HERMES_MCP_ENDED       32  /* ended ones kept to DELETE */

typedef struct {
    uint32_t                      peer;         /* crc32 of the server's URI */
    size_t                        session_len;
    size_t                        version_len;
    u_char                        session[NGX_HTTP_HERMES_MCP_SESSION_MAX];
    u_char                        version[NGX_HTTP_HERMES_MCP_VERSION_MAX];
} ngx_http_hermes_mcp_session_t;

ngx_int_t ngx_http_hermes_registry_mcp_session(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_mcp_session_t *ms);
void ngx_http_hermes_registry_set_mcp_session(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_mcp_session_t *ms);
ngx_uint_t ngx_http_hermes_registry_mcp_ended(ngx_http_hermes_zone_t *zone,
    uint32_t peer, ngx_http_hermes_mcp_session_t *ms, ngx_uint_t n);
u_char *ngx_http_hermes_registry_instance(ngx_http_hermes_zone_t *zone);
ngx_uint_t ngx_http_hermes_registry_recovering(ngx_http_hermes_zone_t *zone);
ngx_int_t ngx_http_hermes_registry_end(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_victims_t *victims);
ngx_int_t ngx_http_hermes_registry_shutdown(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_str_t *session, ngx_uint_t force,
    ngx_http_hermes_victims_t *victims);
ngx_int_t ngx_http_hermes_registry_stats(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_stats_t *st, ngx_array_t *owners, ngx_array_t *cells);
ngx_uint_t ngx_http_hermes_registry_drain(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_victims_t *victims);
void ngx_http_hermes_registry_env_spawned(ngx_http_hermes_zone_t *zone,
    uint32_t env, ngx_msec_t ms);
void ngx_http_hermes_registry_observe(ngx_http_hermes_zone_t *zone,
    ngx_uint_t hist, ngx_msec_t ms);
void ngx_http_hermes_registry_answered(ngx_http_hermes_zone_t *zone,
    ngx_uint_t status, ngx_str_t *error);
void ngx_http_hermes_registry_spawn_failed(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref);
void ngx_http_hermes_registry_host_counts(ngx_http_hermes_zone_t *zone,
    u_char *tag, ngx_uint_t *counts, ngx_uint_t n);
void ngx_http_hermes_registry_set_host(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref);
ngx_int_t ngx_http_hermes_registry_poll(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_str_t *root);
ngx_int_t ngx_http_hermes_registry_renew(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_str_t *root);
ngx_int_t ngx_http_hermes_registry_spawned(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_spawned_t *k);
void ngx_http_hermes_registry_release(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_uint_t how,
    ngx_uint_t execution_count);
ngx_int_t ngx_http_hermes_registry_warm_reserve(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_warm_t *w, ngx_uint_t host,
    ngx_http_hermes_kernel_ref_t *ref);
ngx_int_t ngx_http_hermes_registry_warm_spawned(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_spawned_t *k);
void ngx_http_hermes_registry_warm_failed(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_uint_t failed);
ngx_uint_t ngx_http_hermes_registry_warm_sweep(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_victims_t *victims, ngx_http_hermes_victim_t *check,
    ngx_uint_t *ncheck);
void ngx_http_hermes_registry_warm_drop(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_victim_t *v, ngx_http_hermes_victims_t *victims);

#define ngx_http_hermes_count(zone, counter)                                  \
    (void) ngx_atomic_fetch_add(&(zone)->counters->counter, 1)

#define ngx_http_hermes_now_ms()                                              \
    ((uint64_t) (ngx_timeofday())->sec * 1000 + (ngx_timeofday())->msec)


#endif /* _NGX_HERMES_REGISTRY_H_INCLUDED_ */
