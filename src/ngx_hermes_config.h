
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: configuration: the module's main, zone and location confs,
 * backends' confs, warm pools.
 */


#ifndef _NGX_HERMES_CONFIG_H_INCLUDED_
#define _NGX_HERMES_CONFIG_H_INCLUDED_


#include "ngx_hermes.h"


typedef struct ngx_http_hermes_backend_ops_s  ngx_http_hermes_backend_ops_t;
typedef struct ngx_http_hermes_transport_s  ngx_http_hermes_transport_t;
typedef struct ngx_http_hermes_rpc_s  ngx_http_hermes_rpc_t;
typedef struct ngx_http_hermes_environment_s  ngx_http_hermes_environment_t;

typedef struct {
    ngx_http_hermes_backend_ops_t *ops;
    ngx_uint_t                    nhosts;
    ngx_str_t                     root;
    ngx_uint_t                    warm;         /* idle kernels kept per host */
    /* identifies the backend in registry keys: a hash of its arguments */
    u_char                        tag[NGX_HTTP_HERMES_BACKEND_TAG_LEN];
    void                         *data;         /* the backend's own conf */
} ngx_http_hermes_backend_conf_t;


/* a backend connection for one thread pool task */

typedef struct {
    ngx_http_hermes_backend_conf_t *bcf;
    ngx_uint_t                    host;
    void                         *data;         /* the backend's (ssh: the
                                                   host's link) */
    u_char                        err[256];
    unsigned                      unavailable:1;
} ngx_http_hermes_conn_t;


typedef struct ngx_http_hermes_sh_s  ngx_http_hermes_sh_t;
typedef struct ngx_http_hermes_counters_s  ngx_http_hermes_counters_t;

typedef struct {
    ngx_http_hermes_sh_t         *sh;           /* the registry's own */
    ngx_http_hermes_counters_t   *counters;     /* in sh */
    ngx_slab_pool_t              *shpool;
    ngx_shm_zone_t               *shm_zone;
    ngx_uint_t                    max_kernels;
    ngx_uint_t                    max_kernels_per_owner;
    ngx_msec_t                    idle_timeout;
    ngx_msec_t                    sweep;
    ngx_uint_t                    mcp_sessions; /* hermes_mcp's clients' */
    time_t                        mcp_session_timeout;
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
    ngx_array_t                   environments; /* environment_t * */
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
    NGX_HTTP_HERMES_HANDLER_STATUS,
    NGX_HTTP_HERMES_HANDLER_MCP
} ngx_http_hermes_handler_e;


typedef struct {
    ngx_uint_t                    handler;
    ngx_str_t                     zone_name;
    ngx_shm_zone_t               *shm_zone;

    ngx_http_hermes_backend_conf_t *backend;
    ngx_http_complex_value_t     *owner;
    ngx_http_complex_value_t     *session;
    ngx_http_hermes_sandbox_t    *sandbox;
    ngx_array_t                  *environments; /* environment_t *; NULL:
                                                   the host's python */

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
    ngx_str_t                     tools_schema; /* hermes_tools_schema: a
                                                   JSON list, NUL-ended */
    ngx_str_t                     tools_schema_file;
    ngx_uint_t                    max_tool_calls;
    /* hermes_mcp (ngx_hermes_mcp_server.c) */
    ngx_array_t                  *mcp_hosts;    /* ngx_str_t; NULL: local */
    ngx_array_t                  *mcp_origins;
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
    ngx_http_hermes_environment_t *env;         /* in it; NULL: none */
    uint32_t                      env_id;
    ngx_msec_t                   *retry;        /* per host, after a failure */
} ngx_http_hermes_warm_t;


#endif /* _NGX_HERMES_CONFIG_H_INCLUDED_ */
