
/*
 * ngx_hermes: shared types of the module's parts.
 */


#ifndef _NGX_HERMES_H_INCLUDED_
#define _NGX_HERMES_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#if !(NGX_THREADS)
#error "ngx_hermes needs nginx built --with-threads: use Debian conf_flags"
#endif

#include <ngx_thread_pool.h>


#define NGX_HTTP_HERMES_ID_LEN          32      /* hex of 16 random bytes */
#define NGX_HTTP_HERMES_TOKEN_LEN       32      /* raw random bytes */
#define NGX_HTTP_HERMES_SESSION_MAX     128
#define NGX_HTTP_HERMES_OWNER_MAX       128
#define NGX_HTTP_HERMES_BACKEND_TAG_LEN 16      /* hex of an 8-byte hash */
#define NGX_HTTP_HERMES_DIR_MAX         256
/* a kernel's dir is ROOT "/hermes_rkernel_" ID */
#define NGX_HTTP_HERMES_KDIR_PREFIX     (sizeof("/hermes_rkernel_") - 1)
/* hermes_kernel.sh kill's arguments: the root, the id and three numbers */
#define NGX_HTTP_HERMES_KILL_ARGS_LEN                                         \
    (NGX_HTTP_HERMES_DIR_MAX + 3 * NGX_INT64_LEN + 8)
#define NGX_HTTP_HERMES_HOST_MAX        64
/* an MCP server's Mcp-Session-Id and protocol version, kept per kernel */
#define NGX_HTTP_HERMES_MCP_SESSION_MAX 128
#define NGX_HTTP_HERMES_MCP_VERSION_MAX 16
#define NGX_HTTP_HERMES_TAG_HEX         16      /* hex of 8 bytes */


/* embedded kernel host files, generated from the .py files in src/remote */

typedef struct {
    ngx_str_t                     name;
    const u_char                 *data;
    size_t                        len;
    ngx_uint_t                    ship;         /* into each kernel's dir */
} ngx_http_hermes_remote_file_t;

extern ngx_http_hermes_remote_file_t  ngx_http_hermes_remote_files[];

/* src/remote/hermes_kernel.sh: a kernel's dir, kill and crash recovery */
extern const char  ngx_http_hermes_script_kernel[];

/*
 * The status page, generated from src/status/hermes_status.html, and the
 * Content-Security-Policy that lets only its own inline script and style
 * (by their hashes) run and fetch only its own origin.
 */

extern ngx_str_t  ngx_http_hermes_status_page;
extern ngx_str_t  ngx_http_hermes_status_csp;


/* configuration */

typedef struct ngx_http_hermes_ssh_host_s  ngx_http_hermes_ssh_host_t;
typedef struct ngx_http_hermes_backend_ops_s  ngx_http_hermes_backend_ops_t;
typedef struct ngx_http_hermes_transport_s  ngx_http_hermes_transport_t;
typedef struct ngx_http_hermes_rpc_s  ngx_http_hermes_rpc_t;

typedef struct {
    ngx_http_hermes_backend_ops_t *ops;
    ngx_uint_t                    nhosts;
    ngx_str_t                     root;
    ngx_uint_t                    warm;         /* idle kernels kept per host */
    /* identifies the backend in registry keys: a hash of its arguments */
    u_char                        tag[NGX_HTTP_HERMES_BACKEND_TAG_LEN];

    /* ssh */
    ngx_array_t                  *hosts;        /* ngx_http_hermes_ssh_host_t * */
    ngx_str_t                     user;         /* NUL-terminated */
    ngx_str_t                     identity;
    ngx_str_t                     known_hosts;
    ngx_msec_t                    connect_timeout;
} ngx_http_hermes_backend_conf_t;


typedef struct ngx_http_hermes_ssh_link_s  ngx_http_hermes_ssh_link_t;

/* a backend connection for one thread pool task (ssh: the host's link) */

typedef struct {
    ngx_http_hermes_backend_conf_t *bcf;
    ngx_uint_t                    host;
    ngx_http_hermes_ssh_link_t   *link;
    u_char                        err[256];
    unsigned                      unavailable:1;
} ngx_http_hermes_conn_t;

/* a host that failed is skipped for new kernels this long */
#define NGX_HTTP_HERMES_SSH_RETRY     30000


typedef struct ngx_http_hermes_sh_s  ngx_http_hermes_sh_t;

typedef struct {
    ngx_http_hermes_sh_t         *sh;
    ngx_slab_pool_t              *shpool;
    ngx_shm_zone_t               *shm_zone;
    ngx_uint_t                    max_kernels;
    ngx_uint_t                    max_kernels_per_owner;
    ngx_msec_t                    idle_timeout;
    ngx_msec_t                    sweep;
    ngx_thread_pool_t            *thread_pool;  /* kills evicted kernels */
    ngx_event_t                  *sweep_event;  /* this worker's */
    /* this gateway's zone (nginx.conf's path and the zone's name) */
    u_char                        gateway[NGX_HTTP_HERMES_TAG_HEX];
    ngx_array_t                  *warm;         /* ngx_http_hermes_warm_t */
    ngx_event_t                  *warm_event;   /* this worker's refill */
} ngx_http_hermes_zone_t;


/* a location of ours, for the errors nginx answers before a lookup */

typedef struct {
    ngx_http_core_srv_conf_t     *cscf;
    ngx_http_core_loc_conf_t     *clcf;
} ngx_http_hermes_location_t;


typedef struct {
    ngx_array_t                   zones;        /* ngx_shm_zone_t * */
    ngx_array_t                   backends;     /* backend_conf_t * */
    ngx_array_t                   locations;    /* ngx_http_hermes_location_t */
} ngx_http_hermes_main_conf_t;


/* the kernel's sandbox on its host */

typedef enum {
    NGX_HTTP_HERMES_SANDBOX_OFF = 0,
    NGX_HTTP_HERMES_SANDBOX_BWRAP
} ngx_http_hermes_sandbox_e;


typedef struct {
    ngx_uint_t                    mode;
    ngx_str_t                     user;         /* when the spawn is root's */
    off_t                         memory;
    off_t                         tmp;
    ngx_uint_t                    pids;
    ngx_uint_t                    cpu;          /* percent of one CPU */
    ngx_array_t                  *ro;           /* ngx_str_t */
    unsigned                      net:1;
    unsigned                      implicit:1;   /* the default, not set */
} ngx_http_hermes_sandbox_t;


typedef enum {
    NGX_HTTP_HERMES_HANDLER_NONE = 0,
    NGX_HTTP_HERMES_HANDLER_EXECUTE,
    NGX_HTTP_HERMES_HANDLER_KERNELS,
    NGX_HTTP_HERMES_HANDLER_STATUS
} ngx_http_hermes_handler_e;


typedef struct {
    ngx_uint_t                    handler;
    ngx_str_t                     zone_name;
    ngx_shm_zone_t               *shm_zone;

    ngx_http_hermes_backend_conf_t *backend;
    ngx_http_complex_value_t     *owner;
    ngx_http_complex_value_t     *session;
    ngx_http_hermes_sandbox_t    *sandbox;

    ngx_msec_t                    cell_timeout;
    ngx_msec_t                    cell_grace;   /* interrupt, then kill */
    ngx_msec_t                    heartbeat;    /* 0: none */
    size_t                        max_output;
    size_t                        max_stream;
    size_t                        max_code;
    size_t                        max_file;
    ngx_uint_t                    queue;

    ngx_str_t                     thread_pool_name;
    ngx_thread_pool_t            *thread_pool;

    /* tool calls from cells (ngx_hermes_rpc.c) */
    ngx_array_t                  *tools;        /* ngx_str_t; NULL: none */
    ngx_str_t                     tools_pass;   /* a location's URI */
    ngx_uint_t                    tools_protocol;
    ngx_uint_t                    tools_auto;   /* the MCP server's list */
    ngx_uint_t                    max_tool_calls;
} ngx_http_hermes_loc_conf_t;


typedef enum {
    NGX_HTTP_HERMES_TOOLS_HERMES = 0,
    NGX_HTTP_HERMES_TOOLS_MCP
} ngx_http_hermes_tools_protocol_e;


/*
 * A warm pool: kernels spawned ahead for new sessions, alike to what a
 * location would spawn (the hash says what they were spawned with).  One
 * per backend of a zone; the locations that use it spawn alike.
 */

#define NGX_HTTP_HERMES_WARM_HASH_LEN   16      /* hex of an 8-byte hash */
#define NGX_HTTP_HERMES_WARM_MAX        64      /* warm=, per host */

/* a warm kernel's registry key: "\0 backend-tag \0 hash slot" */
#define NGX_HTTP_HERMES_WARM_KEY_LEN                                          \
    (2 + NGX_HTTP_HERMES_BACKEND_TAG_LEN + NGX_HTTP_HERMES_WARM_HASH_LEN      \
     + NGX_HTTP_HERMES_ID_LEN)

typedef struct {
    u_char                        tag[NGX_HTTP_HERMES_BACKEND_TAG_LEN];
    u_char                        hash[NGX_HTTP_HERMES_WARM_HASH_LEN];
    ngx_uint_t                    n;            /* per host; 0: no pool */
    ngx_http_hermes_loc_conf_t   *hlcf;         /* spawns them */
    ngx_msec_t                   *retry;        /* per host, after a failure */
} ngx_http_hermes_warm_t;


/* the registry */

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


/* failed spawns by backend and host */

#define NGX_HTTP_HERMES_HOSTS     64

typedef struct {
    ngx_atomic_uint_t             spawn_failures;
    u_char                        tag[NGX_HTTP_HERMES_BACKEND_TAG_LEN];
    ngx_uint_t                    host;
} ngx_http_hermes_host_count_t;


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

    /* counters, changed under the zone's lock or atomically */
    ngx_atomic_uint_t             spawned_total;
    ngx_atomic_uint_t             spawn_failures_total;
    ngx_atomic_uint_t             evicted_idle_total;
    ngx_atomic_uint_t             evicted_cap_total;
    ngx_atomic_uint_t             evicted_deleted_total;
    ngx_atomic_uint_t             killed_timeout_total;
    ngx_atomic_uint_t             tool_calls_total;
    ngx_atomic_uint_t             cells_total[NGX_HTTP_HERMES_CELL_NSTATUS];
    ngx_atomic_uint_t             rpc_rejected_total[NGX_HTTP_HERMES_RPC_NREJECT];

    ngx_http_hermes_hist_t        hist[NGX_HTTP_HERMES_NHIST];

    /* slots are added under the lock, then counted atomically */
    ngx_atomic_uint_t             nanswers;
    ngx_http_hermes_answers_t     answers[NGX_HTTP_HERMES_ANSWERS];
    ngx_uint_t                    nhosts;
    ngx_http_hermes_host_count_t  hosts[NGX_HTTP_HERMES_HOSTS];
};


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
    NGX_HTTP_HERMES_ACQ_GONE            /* entry vanished while queued */
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
ngx_int_t ngx_http_hermes_registry_shutdown(ngx_http_hermes_zone_t *zone,
    ngx_str_t *owner, ngx_str_t *session, ngx_uint_t force,
    ngx_http_hermes_victims_t *victims);
ngx_int_t ngx_http_hermes_registry_stats(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_stats_t *st, ngx_array_t *owners, ngx_array_t *cells);
ngx_uint_t ngx_http_hermes_registry_drain(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_victims_t *victims);
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
    (void) ngx_atomic_fetch_add(&(zone)->sh->counter, 1)

#define ngx_http_hermes_now_ms()                                              \
    ((uint64_t) (ngx_timeofday())->sec * 1000 + (ngx_timeofday())->msec)


/* the local backend: commands, files and liveness on the nginx host */

typedef struct {
    const char                   *cmd;          /* shell text, fixed */
    char                 *const  *args;         /* its $1..., NULL-ended */
    const u_char                 *in;           /* payload on stdin */
    size_t                        in_len;
    u_char                       *out;          /* captured stdout */
    size_t                        out_size;
    size_t                        out_len;
    ngx_msec_t                    timeout;
    int                           status;       /* exit code, -1: failed */
    ngx_err_t                     err;
} ngx_http_hermes_cmd_t;


/* arguments of a command at most */
#define NGX_HTTP_HERMES_CMD_ARGS      8

ngx_int_t ngx_http_hermes_local_exec(ngx_http_hermes_cmd_t *cmd);
ngx_int_t ngx_http_hermes_local_write_at(ngx_fd_t dir, const char *name,
    u_char *data, size_t len, ngx_uid_t uid, ngx_log_t *log);
ngx_fd_t ngx_http_hermes_local_open_at(ngx_fd_t dir, const char *name,
    off_t *size);
ngx_int_t ngx_http_hermes_local_wake(ngx_fd_t dir, ngx_log_t *log);
ngx_int_t ngx_http_hermes_local_interrupt(ngx_fd_t dir, uint32_t cell,
    ngx_log_t *log);
ngx_int_t ngx_http_hermes_local_wait_ready(u_char *dir, ngx_pid_t pid,
    ngx_pid_t expect, ngx_msec_t timeout);
ngx_int_t ngx_http_hermes_ready_pid(u_char *buf, ngx_pid_t pid);
ngx_int_t ngx_http_hermes_proc_start(u_char *stat, size_t len,
    uint64_t *start);
ngx_int_t ngx_http_hermes_local_proc_start(ngx_pid_t pid, uint64_t *start);


/* the ssh backend: sessions per worker and host, commands, cell relays */

ngx_int_t ngx_http_hermes_ssh_init(void);
ngx_http_hermes_ssh_host_t *ngx_http_hermes_ssh_host_create(ngx_pool_t *pool,
    ngx_str_t *name, u_char *host, ngx_uint_t port);
ngx_int_t ngx_http_hermes_ssh_relay(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_kernel_ref_t *ref, off_t out_limit, off_t res_limit,
    ngx_msec_t timeout, u_char *req, size_t req_len, off_t offset,
    ngx_socket_t fd, ngx_socket_t rpc_fd, ngx_log_t *log);
char *ngx_http_hermes_ssh_check_files(ngx_str_t *identity,
    ngx_str_t *known_hosts);


/*
 * A backend: where kernels run, as the rest of the module sees it
 * (ngx_hermes_backend_local.c, ngx_hermes_backend_ssh.c).  Commands run in
 * thread pool tasks on a connection taken for the task; a cell's stream
 * goes through the backend's transport.
 */

struct ngx_http_hermes_backend_ops_s {
    ngx_str_t                     name;         /* "local", "ssh" */
    ngx_http_hermes_transport_t  *transport;
    /* bytes one command may take on stdin or give on stdout */
    size_t                        exec_max;

    /* thread pool tasks */
    void                        (*take)(ngx_http_hermes_conn_t *conn);
    void                        (*give)(ngx_http_hermes_conn_t *conn);
    ngx_int_t                   (*exec)(ngx_http_hermes_conn_t *conn,
                                        ngx_http_hermes_cmd_t *cmd);
    /* a new runner said it is ready, with its pid: its start time */
    ngx_int_t                   (*ready)(ngx_http_hermes_conn_t *conn,
                                         u_char *dir, ngx_pid_t pid,
                                         ngx_pid_t expect, uint64_t *start);

    /* the event loop */
    ngx_uint_t                  (*root)(ngx_http_hermes_backend_conf_t *bcf);
    ngx_uint_t                  (*pick_host)(
                                    ngx_http_hermes_backend_conf_t *bcf,
                                    ngx_uint_t *kernels);
    ngx_str_t                  *(*host_name)(
                                    ngx_http_hermes_backend_conf_t *bcf,
                                    ngx_uint_t host);
    /* "N\n" into the kernel's intr FIFO, never waiting */
    ngx_int_t                   (*interrupt)(
                                    ngx_http_hermes_backend_conf_t *bcf,
                                    ngx_http_hermes_victim_t *v,
                                    uint32_t cell, ngx_log_t *log);
    /* is a kernel still itself, told at once; NULL: it cannot be */
    ngx_uint_t                  (*alive)(ngx_http_hermes_victim_t *v);
    void                        (*exit_process)(
                                    ngx_http_hermes_backend_conf_t *bcf);
};


extern ngx_http_hermes_backend_ops_t  ngx_http_hermes_backend_local_ops;
extern ngx_http_hermes_backend_ops_t  ngx_http_hermes_backend_ssh_ops;

void ngx_http_hermes_backend_take(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_backend_conf_t *bcf, ngx_uint_t host);
void ngx_http_hermes_backend_give(ngx_http_hermes_conn_t *conn);
ngx_int_t ngx_http_hermes_backend_exec(ngx_http_hermes_conn_t *conn,
    ngx_http_hermes_cmd_t *cmd);
u_char *ngx_http_hermes_cmd_text(u_char *p, u_char *last,
    ngx_http_hermes_cmd_t *cmd);
void ngx_http_hermes_backend_place(ngx_http_hermes_zone_t *zone,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_backend_conf_t *bcf);
ngx_str_t *ngx_http_hermes_backend_host_name(
    ngx_http_hermes_backend_conf_t *bcf, ngx_uint_t host);
ngx_http_hermes_backend_conf_t *ngx_http_hermes_backend_by_tag(
    ngx_http_hermes_main_conf_t *hmcf, u_char *tag);


/* the frames of the kernel-host agent protocol (ngx_hermes_frames.c) */

#define NGX_HTTP_HERMES_FRAME_HEADER    9
#define NGX_HTTP_HERMES_FRAME_MAX       (1048576 + 64)
#define NGX_HTTP_HERMES_FRAME_MAGIC     "\0HERMES-AGENT-1\n"
#define NGX_HTTP_HERMES_FRAME_CELL_MAX                                        \
    (NGX_HTTP_HERMES_FRAME_HEADER + 4 + 6 * NGX_HTTP_HERMES_DIR_MAX + 256)
#define NGX_HTTP_HERMES_FRAME_EXEC_MAX  (NGX_HTTP_HERMES_FRAME_HEADER + 128)

typedef struct {
    uint32_t                      len;
    uint32_t                      stream;
    u_char                        type;
    u_char                       *payload;
} ngx_http_hermes_frame_t;

typedef struct {
    u_char                       *dir;          /* NUL-terminated */
    uint32_t                      cell;
    ngx_pid_t                     pid;
    uint64_t                      start;
    uint64_t                      ino;
    uint32_t                      uid;
    off_t                         offset;       /* -1: ship the request */
    off_t                         out_limit;
    off_t                         res_limit;
    size_t                        window;
    size_t                        req_len;      /* the bytes that follow */
} ngx_http_hermes_frame_cell_t;

u_char *ngx_http_hermes_frames_header(u_char *p, uint32_t stream,
    u_char type, size_t len);
uint32_t ngx_http_hermes_frames_u32(u_char *p);
u_char *ngx_http_hermes_frames_put_u32(u_char *p, uint32_t v);
u_char *ngx_http_hermes_frames_put_u64(u_char *p, uint64_t v);
uint64_t ngx_http_hermes_frames_u64(u_char *p);
ngx_int_t ngx_http_hermes_frames_parse(u_char *p, size_t n,
    ngx_http_hermes_frame_t *f);
ngx_int_t ngx_http_hermes_frames_split(u_char *p, size_t len,
    ngx_str_t *json, ngx_str_t *bytes);
ngx_int_t ngx_http_hermes_frames_json_str(ngx_str_t *json, char *key,
    ngx_str_t *value);
ngx_int_t ngx_http_hermes_frames_json_int(ngx_str_t *json, char *key,
    int64_t *value);
ngx_int_t ngx_http_hermes_frames_magic(u_char *p, size_t n, size_t *skip);
u_char *ngx_http_hermes_frames_cell(u_char *buf, uint32_t stream,
    ngx_http_hermes_frame_cell_t *c);
u_char *ngx_http_hermes_frames_exec(u_char *buf, uint32_t stream,
    u_char *cmd, size_t cmd_len, char *const *args, ngx_msec_t timeout,
    size_t out_max, size_t in_len);
u_char *ngx_http_hermes_frames_ready(u_char *buf, uint32_t stream,
    u_char *dir, size_t dir_len, ngx_pid_t pid, ngx_msec_t timeout);
u_char *ngx_http_hermes_frames_interrupt(u_char *buf, uint32_t stream,
    u_char *dir, size_t dir_len, uint64_t ino, uint32_t cell);


/* kernel lifecycle: spawn and kill, in the thread pool */

typedef struct ngx_http_hermes_spawn_s  ngx_http_hermes_spawn_t;

typedef void (*ngx_http_hermes_spawn_done_pt)(void *data, ngx_int_t rc,
    ngx_http_hermes_spawned_t *k, const char *err);

ngx_int_t ngx_http_hermes_kernel_spawn(ngx_http_hermes_loc_conf_t *hlcf,
    ngx_http_hermes_zone_t *zone, ngx_http_hermes_kernel_ref_t *ref,
    ngx_pool_t *pool, ngx_http_hermes_spawn_done_pt done, void *data,
    ngx_log_t *log);
void ngx_http_hermes_kernel_victim(ngx_http_hermes_victim_t *v,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_backend_conf_t *bcf);
ngx_int_t ngx_http_hermes_kernel_kill(ngx_thread_pool_t *tp,
    ngx_http_hermes_backend_conf_t *bcf, ngx_http_hermes_victim_t *v,
    ngx_log_t *log);
ngx_int_t ngx_http_hermes_kernel_interrupt(ngx_http_hermes_victim_t *v,
    uint32_t cell, ngx_log_t *log);
void ngx_http_hermes_kernel_kill_victims(ngx_thread_pool_t *tp,
    ngx_http_hermes_victims_t *victims, ngx_log_t *log);
ngx_int_t ngx_http_hermes_kernel_init_process(ngx_cycle_t *cycle,
    ngx_http_hermes_main_conf_t *hmcf);
void ngx_http_hermes_kernel_exit_process(ngx_cycle_t *cycle);
void ngx_http_hermes_kernel_exit_master(ngx_cycle_t *cycle);
char *ngx_http_hermes_kernel_warm_conf(ngx_conf_t *cf,
    ngx_http_hermes_loc_conf_t *hlcf);
u_char *ngx_http_hermes_log_escape(u_char *dst, u_char *last, u_char *src,
    size_t len, ngx_uint_t quoted);


/* sandboxes: bwrap, a user that is not root, cgroups or rlimits */

char *ngx_http_hermes_sandbox_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_http_hermes_sandbox_t *ngx_http_hermes_sandbox_default(ngx_conf_t *cf);
ngx_int_t ngx_http_hermes_sandbox_check(ngx_conf_t *cf,
    ngx_http_hermes_sandbox_t *sb);
u_char *ngx_http_hermes_sandbox_user(u_char *p, u_char *last,
    ngx_http_hermes_sandbox_t *sb);
u_char *ngx_http_hermes_sandbox_start(u_char *p, u_char *last,
    ngx_http_hermes_sandbox_t *sb, u_char *dir, u_char *kid, ngx_uint_t root);


/* JSON: requests in, results and errors out (yajl) */

/* an agent's envelope around the request: answered in the same kind */

typedef enum {
    NGX_HTTP_HERMES_ENVELOPE_NONE = 0,
    NGX_HTTP_HERMES_ENVELOPE_OPENAI,    /* a tool call: a "tool" message */
    NGX_HTTP_HERMES_ENVELOPE_ANTHROPIC  /* tool_use: a tool_result block */
} ngx_http_hermes_envelope_e;


typedef struct {
    ngx_str_t                     session;
    ngx_str_t                     code;
    ngx_msec_t                    timeout;      /* 0: the location's cap */
    ngx_str_t                     tool_call_id; /* the envelope's id */
    ngx_uint_t                    envelope;
    unsigned                      reset:1;
    unsigned                      ephemeral:1;  /* a one-shot kernel */
    unsigned                      json_answer:1; /* Accept: application/json */
} ngx_http_hermes_request_t;


typedef struct {
    ngx_uint_t                    status;       /* ngx_http_hermes_cell_status_e */
    ngx_str_t                     output;
    ngx_str_t                     error;
    ngx_str_t                     displays;     /* raw JSON array, or empty */
    ngx_uint_t                    execution_count;
    ngx_uint_t                    stdout_bytes_total;
    ngx_uint_t                    tool_calls_made;
    ngx_msec_t                    duration;     /* from the cell's turn */
    ngx_msec_t                    queue;        /* waiting for the turn */
    unsigned                      stdout_truncated:1;
    unsigned                      stream_truncated:1;
    unsigned                      state_reset:1;
    unsigned                      ended:1;
} ngx_http_hermes_result_t;


ngx_int_t ngx_http_hermes_json_session_valid(ngx_str_t *s);
ngx_int_t ngx_http_hermes_json_parse_request(ngx_pool_t *pool, u_char *body,
    size_t len, ngx_http_hermes_request_t *req, size_t max_code,
    ngx_str_t *err_code, ngx_str_t *err_msg, ngx_uint_t *http_status);
ngx_int_t ngx_http_hermes_json_parse_result(ngx_pool_t *pool, u_char *data,
    size_t len, ngx_http_hermes_result_t *res);
ngx_buf_t *ngx_http_hermes_json_result(ngx_pool_t *pool,
    ngx_http_hermes_result_t *res, ngx_http_hermes_kernel_ref_t *ref,
    ngx_http_hermes_request_t *req, ngx_uint_t as_event,
    ngx_uint_t as_tool_message);
void ngx_http_hermes_json_event_text(u_char *line, size_t len,
    ngx_buf_t *out, ngx_buf_t *err);
ngx_buf_t *ngx_http_hermes_json_error(ngx_pool_t *pool, ngx_str_t *code,
    ngx_str_t *message);
ngx_buf_t *ngx_http_hermes_json_tool_message(ngx_pool_t *pool,
    ngx_uint_t envelope, ngx_str_t *id, u_char *content, size_t len,
    ngx_uint_t is_error);
ngx_buf_t *ngx_http_hermes_json_listing(ngx_pool_t *pool, ngx_array_t *list);
ngx_buf_t *ngx_http_hermes_json_kernel(ngx_pool_t *pool,
    ngx_http_hermes_listing_t *l);
ngx_buf_t *ngx_http_hermes_json_stats(ngx_pool_t *pool,
    ngx_http_hermes_stats_t *st, ngx_uint_t max_kernels, ngx_array_t *owners,
    ngx_array_t *cells);
ngx_buf_t *ngx_http_hermes_prometheus_stats(ngx_pool_t *pool,
    ngx_http_hermes_stats_t *st, ngx_uint_t max_kernels, ngx_str_t *zone);
ngx_buf_t *ngx_http_hermes_json_cell_request(ngx_pool_t *pool, uint32_t id,
    ngx_http_hermes_request_t *req, size_t max_output, size_t max_stream,
    ngx_array_t *tools, ngx_uint_t tools_any);

extern ngx_str_t  ngx_http_hermes_cell_status_names[];


/* a cell's run: its turn on a kernel; outlives its request */

ngx_int_t ngx_http_hermes_cell_start(ngx_http_request_t *r,
    ngx_http_hermes_request_t *req, ngx_str_t *owner);


/*
 * A cell's stream on its kernel, as the cell and a backend's transport
 * share it: the cell fills in what to run and its callbacks, the transport
 * ships the request and calls back, in this order: shipped, output (event
 * lines, any number of times), result, done (the output after the result
 * went out too); or failed, at any point.
 */

typedef enum {
    NGX_HTTP_HERMES_STREAM_DEAD = 0,    /* not shipped: the kernel is gone */
    NGX_HTTP_HERMES_STREAM_FULL,        /* not shipped: its disk is full */
    NGX_HTTP_HERMES_STREAM_BUSY,        /* not shipped: no thread now */
    NGX_HTTP_HERMES_STREAM_SHIP_FAILED, /* not shipped, for another reason */
    NGX_HTTP_HERMES_STREAM_LOST         /* shipped, then lost mid-cell */
} ngx_http_hermes_stream_fail_e;


typedef struct ngx_http_hermes_stream_s  ngx_http_hermes_stream_t;

typedef ngx_int_t (*ngx_http_hermes_stream_pt)(ngx_http_hermes_stream_t *st);
typedef ngx_int_t (*ngx_http_hermes_stream_output_pt)(
    ngx_http_hermes_stream_t *st, u_char *p, size_t n);
typedef ngx_int_t (*ngx_http_hermes_stream_result_pt)(
    ngx_http_hermes_stream_t *st, u_char *p, size_t n);
typedef void (*ngx_http_hermes_stream_failed_pt)(
    ngx_http_hermes_stream_t *st, ngx_uint_t why, char *message);


/*
 * The head and the tail of a lost cell's event lines: escaping makes at
 * most 6 bytes of a text byte, the output keeps 40% head and 60% tail.
 */

#define NGX_HTTP_HERMES_KEEP_HEAD(max)  (3 * (max) + 4096)
#define NGX_HTTP_HERMES_KEEP_TAIL(max)  (4 * (max) + 4096)

typedef struct {
    u_char                       *data;         /* head, then tail */
    size_t                        head;
    size_t                        tail;
    unsigned                      gap:1;        /* bytes between them */
} ngx_http_hermes_windows_t;


struct ngx_http_hermes_transport_s {
    ngx_int_t                   (*run)(ngx_http_hermes_stream_t *st);
    /* the client took what was sent, or left: read on */
    void                        (*resume)(ngx_http_hermes_stream_t *st);
    ngx_int_t                   (*interrupt)(ngx_http_hermes_stream_t *st);
    void                        (*salvage)(ngx_http_hermes_stream_t *st,
                                           ngx_http_hermes_windows_t *w);
    void                        (*close)(ngx_http_hermes_stream_t *st);
    ngx_uint_t                    tools;        /* carries tool calls */
};


struct ngx_http_hermes_stream_s {
    /* the cell's */
    ngx_pool_t                   *pool;
    ngx_log_t                    *log;
    ngx_http_hermes_loc_conf_t   *hlcf;
    ngx_http_hermes_kernel_ref_t *ref;
    ngx_buf_t                    *request;      /* cell_req_N.json; NULL:
                                                   a shipped cell's stream
                                                   again, from offset */
    off_t                         offset;
    off_t                         out_limit;    /* of cell_out, read */
    size_t                        res_limit;
    ngx_msec_t                    timeout;
    ngx_connection_t             *client;       /* NULL: gone */
    ngx_http_hermes_rpc_t        *rpc;          /* its tool calls */
    void                         *data;

    ngx_http_hermes_stream_pt         shipped;
    ngx_http_hermes_stream_output_pt  output;   /* NGX_AGAIN: wait resume */
    ngx_http_hermes_stream_result_pt  result;
    ngx_http_hermes_stream_pt         done;
    ngx_http_hermes_stream_failed_pt  failed;

    /* the transport's */
    void                         *ctx;
    unsigned                      quiet:1;      /* no client for output */
    unsigned                      is_shipped:1;
    unsigned                      waits_client:1; /* the result is behind
                                                     output not yet taken */
    unsigned                      truncated:1;  /* out_limit was reached */
};


ngx_int_t ngx_http_hermes_transport_local_init_process(ngx_cycle_t *cycle);
void ngx_http_hermes_transport_local_exit_process(ngx_cycle_t *cycle);

extern ngx_http_hermes_transport_t  ngx_http_hermes_transport_local;
extern ngx_http_hermes_transport_t  ngx_http_hermes_transport_ssh;


/* tool calls: a cell's RPC channel (ngx_hermes_rpc.c) */

#define NGX_HTTP_HERMES_RPC_STRING    1
#define NGX_HTTP_HERMES_RPC_NUMBER    2
#define NGX_HTTP_HERMES_RPC_OBJECT    3
#define NGX_HTTP_HERMES_RPC_OTHER     4

/* a request as the checks read it; strings point into it or its bufs */

typedef struct {
    ngx_str_t                     tool;
    ngx_str_t                     args;         /* the raw object */
    ngx_str_t                     token;
    ngx_str_t                     seq_text;
    uint64_t                      seq;
    ngx_uint_t                    tool_type;    /* 0: absent */
    ngx_uint_t                    args_type;
    ngx_uint_t                    token_type;
    ngx_uint_t                    seq_type;
    ngx_uint_t                    reject;       /* rpc_reject_e, NREJECT */
    u_char                        tool_buf[129];
    u_char                        token_buf[128];
    u_char                        seq_buf[16];
} ngx_http_hermes_rpc_req_t;

/* a stream event line ("...\n") for the cell's client */
/* an answer, or an archived one, to a file NAME of a remote rpc/ */
typedef ngx_int_t (*ngx_http_hermes_rpc_write_pt)(void *data, u_char *name,
    size_t len, u_char *buf, size_t n);
typedef void (*ngx_http_hermes_rpc_event_pt)(void *data, u_char *line,
    size_t len);

ngx_int_t ngx_http_hermes_rpc_check(u_char *data, size_t len,
    uint64_t name_seq, u_char *token, size_t token_len, uint64_t *seen,
    ngx_uint_t nseen, ngx_http_hermes_rpc_req_t *req);
uint64_t ngx_http_hermes_rpc_name_seq(u_char *name, size_t len);
ngx_uint_t ngx_http_hermes_tool_name_valid(u_char *name, size_t len);
ngx_http_hermes_rpc_t *ngx_http_hermes_rpc_create(ngx_pool_t *pool,
    ngx_http_request_t *r, ngx_http_hermes_loc_conf_t *hlcf,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_rpc_event_pt event,
    void *data, ngx_log_t *log);
ngx_int_t ngx_http_hermes_rpc_open(ngx_http_hermes_rpc_t *rpc,
    ngx_fd_t dir_fd, int ifd);
int ngx_http_hermes_rpc_wd(ngx_http_hermes_rpc_t *rpc);
void ngx_http_hermes_rpc_notify(ngx_http_hermes_rpc_t *rpc, u_char *name,
    size_t len);
void ngx_http_hermes_rpc_scan(ngx_http_hermes_rpc_t *rpc, ngx_uint_t sweep);
ngx_uint_t ngx_http_hermes_rpc_calls(ngx_http_hermes_rpc_t *rpc);
void ngx_http_hermes_rpc_carry(ngx_http_hermes_rpc_t *rpc,
    ngx_http_hermes_rpc_write_pt write, void *data);
ngx_int_t ngx_http_hermes_rpc_request(ngx_http_hermes_rpc_t *rpc,
    u_char *name, size_t len, u_char *data, size_t n);
void ngx_http_hermes_rpc_detach(ngx_http_hermes_rpc_t *rpc);
void ngx_http_hermes_rpc_end(ngx_http_hermes_rpc_t *rpc);
ngx_int_t ngx_http_hermes_rpc_filter_init(ngx_conf_t *cf);
ngx_int_t ngx_http_hermes_rpc_schema_handler(ngx_http_request_t *r);


/* per request: what the error filter and the log variables need */

typedef struct ngx_http_hermes_response_s  ngx_http_hermes_response_t;

typedef struct {
    ngx_buf_t                    *error_body;
    ngx_http_event_handler_pt     read_body;    /* nginx's, while reading */
    ngx_str_t                     session;
    ngx_str_t                     owner;        /* "": hermes_owner unset */
    ngx_str_t                     error_code;   /* of a JSON error sent */
    u_char                        kernel_id[NGX_HTTP_HERMES_ID_LEN];
    ngx_int_t                     cell_status;  /* -1: none */
    ngx_msec_t                    cell_ms;
    ngx_msec_t                    queue_ms;
    ngx_http_hermes_response_t   *response;     /* a cell's, while it runs */
    void                         *files;        /* a file on its way */
    ngx_str_t                     tool_call_id;
    ngx_uint_t                    envelope;     /* errors as tool messages
                                                   (a JSON answer wanted) */
    unsigned                      error_sent:1;
    unsigned                      has_kernel:1;
    unsigned                      has_queue:1;  /* the cell got its turn */
    unsigned                      state_lost:1;
    unsigned                      lost_reason:4;
} ngx_http_hermes_ctx_t;


/*
 * Everything written to a client (ngx_hermes_response.c): a cell's NDJSON
 * stream or JSON answer, JSON errors, and nginx's own errors on our
 * locations as JSON.  A cell's response outlives its request: r is NULL
 * once the client is gone, and the cell hears it through "gone".
 */

struct ngx_http_hermes_response_s {
    ngx_http_request_t           *r;
    ngx_http_cleanup_t           *cln;
    ngx_http_hermes_ctx_t        *ctx;          /* the request's */
    ngx_chain_t                  *free;
    ngx_chain_t                  *busy;
    void                        (*drained)(void *data);
    void                        (*gone)(void *data);
    void                         *data;
    unsigned                      json:1;       /* one JSON answer */
    unsigned                      tool_message:1;
    unsigned                      header_sent:1;
    unsigned                      mid_line:1;   /* sent no "\n" last */
};


ngx_int_t ngx_http_hermes_response_attach(ngx_http_hermes_response_t *rs,
    ngx_http_request_t *r);
void ngx_http_hermes_response_release(ngx_http_hermes_response_t *rs);
ngx_int_t ngx_http_hermes_response_header(ngx_http_hermes_response_t *rs);
ngx_int_t ngx_http_hermes_response_kernel(ngx_http_hermes_response_t *rs,
    ngx_http_hermes_kernel_ref_t *ref, ngx_http_hermes_request_t *req);
ngx_int_t ngx_http_hermes_response_output(ngx_http_hermes_response_t *rs,
    u_char *p, size_t n);
void ngx_http_hermes_response_end_line(ngx_http_hermes_response_t *rs);
void ngx_http_hermes_response_heartbeat(ngx_http_hermes_response_t *rs);
void ngx_http_hermes_response_result(ngx_http_hermes_response_t *rs,
    ngx_http_hermes_result_t *res, ngx_http_hermes_kernel_ref_t *ref,
    ngx_http_hermes_request_t *req);
void ngx_http_hermes_response_error(ngx_http_hermes_response_t *rs,
    ngx_uint_t status, char *code, char *message);
ngx_int_t ngx_http_hermes_response_send_error(ngx_http_request_t *r,
    ngx_uint_t status, char *code, char *message);
ngx_int_t ngx_http_hermes_response_send_buf(ngx_http_request_t *r,
    ngx_uint_t status, const char *type, ngx_buf_t *b);
ngx_int_t ngx_http_hermes_response_flush(ngx_http_request_t *r);
ngx_int_t ngx_http_hermes_response_add_header(ngx_http_request_t *r,
    char *key, char *value);
ngx_http_hermes_ctx_t *ngx_http_hermes_response_ctx(ngx_http_request_t *r);
ngx_int_t ngx_http_hermes_response_filter_init(ngx_conf_t *cf);


/* a shipped cell's stream again, from an offset */

ngx_int_t ngx_http_hermes_resume_handler(ngx_http_request_t *r,
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner, ngx_str_t *session,
    uint32_t cell, off_t offset);


/* files into and out of a kernel's directory */

ngx_int_t ngx_http_hermes_files_handler(ngx_http_request_t *r,
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner, ngx_str_t *session,
    ngx_str_t *path);


/* HTTP handlers */

ngx_int_t ngx_http_hermes_execute_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_hermes_kernels_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_hermes_status_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_hermes_add_variables(ngx_conf_t *cf);


extern ngx_module_t  ngx_http_hermes_module;


#endif /* _NGX_HERMES_H_INCLUDED_ */
