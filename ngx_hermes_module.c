
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: an nginx module that runs Python cells for AI agents on
 * persistent kernels.  This file wires the parts together: the module,
 * its directives and their configuration.
 */


#include "ngx_hermes.h"

#include <sodium.h>


static ngx_int_t ngx_http_hermes_init_module(ngx_cycle_t *cycle);
static ngx_int_t ngx_http_hermes_init_process(ngx_cycle_t *cycle);
static void ngx_http_hermes_exit_process(ngx_cycle_t *cycle);
static void ngx_http_hermes_exit_master(ngx_cycle_t *cycle);
static char *ngx_http_hermes_max_output_check(ngx_conf_t *cf, void *post,
    void *data);
static void *ngx_http_hermes_create_main_conf(ngx_conf_t *cf);
static char *ngx_http_hermes_cell_timeout(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static void *ngx_http_hermes_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_hermes_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static char *ngx_http_hermes_zone(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_hermes_backend(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_hermes_content(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_hermes_tools(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_hermes_tools_pass(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_hermes_schema(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_hermes_max_tool_calls(ngx_conf_t *cf, void *post,
    void *data);
static ngx_int_t ngx_http_hermes_postconfiguration(ngx_conf_t *cf);


static char  *ngx_http_hermes_handler_names[] = {
    "", "execute", "kernels", "status", "mcp"
};


/* checked as the directive is read: its own file and line in the error */

static ngx_conf_post_t  ngx_http_hermes_max_output_bounds = {
    ngx_http_hermes_max_output_check
};


static ngx_conf_num_bounds_t  ngx_http_hermes_queue_bounds = {
    ngx_conf_check_num_bounds, 0, 1024
};


static ngx_conf_num_bounds_t  ngx_http_hermes_tool_calls_bounds = {
    ngx_http_hermes_max_tool_calls, 0, 100000
};


static ngx_command_t  ngx_http_hermes_commands[] = {

    { ngx_string("hermes_zone"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_1MORE,
      ngx_http_hermes_zone,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("hermes_backend"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_hermes_backend,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("hermes_execute"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS|NGX_CONF_TAKE1,
      ngx_http_hermes_content,
      NGX_HTTP_LOC_CONF_OFFSET,
      NGX_HTTP_HERMES_HANDLER_EXECUTE,
      ngx_http_hermes_execute_handler },

    { ngx_string("hermes_kernels"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS|NGX_CONF_TAKE1,
      ngx_http_hermes_content,
      NGX_HTTP_LOC_CONF_OFFSET,
      NGX_HTTP_HERMES_HANDLER_KERNELS,
      ngx_http_hermes_kernels_handler },

    { ngx_string("hermes_status"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS|NGX_CONF_TAKE1,
      ngx_http_hermes_content,
      NGX_HTTP_LOC_CONF_OFFSET,
      NGX_HTTP_HERMES_HANDLER_STATUS,
      ngx_http_hermes_status_handler },

    { ngx_string("hermes_environment"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_1MORE,
      ngx_http_hermes_environment,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("hermes_environments"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_hermes_environments,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("hermes_mcp"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS|NGX_CONF_TAKE1,
      ngx_http_hermes_content,
      NGX_HTTP_LOC_CONF_OFFSET,
      NGX_HTTP_HERMES_HANDLER_MCP,
      ngx_http_hermes_mcp_handler },

    { ngx_string("hermes_mcp_hosts"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_conf_set_str_array_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hermes_loc_conf_t, mcp_hosts),
      NULL },

    { ngx_string("hermes_mcp_origins"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_conf_set_str_array_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hermes_loc_conf_t, mcp_origins),
      NULL },

    { ngx_string("hermes_owner"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_set_complex_value_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hermes_loc_conf_t, owner),
      NULL },

    { ngx_string("hermes_session"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_set_complex_value_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hermes_loc_conf_t, session),
      NULL },

    { ngx_string("hermes_cell_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE12,
      ngx_http_hermes_cell_timeout,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("hermes_max_output"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hermes_loc_conf_t, max_output),
      &ngx_http_hermes_max_output_bounds },

    { ngx_string("hermes_max_stream"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hermes_loc_conf_t, max_stream),
      NULL },

    { ngx_string("hermes_max_code"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hermes_loc_conf_t, max_code),
      NULL },

    { ngx_string("hermes_max_file"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hermes_loc_conf_t, max_file),
      NULL },

    { ngx_string("hermes_heartbeat"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hermes_loc_conf_t, heartbeat),
      NULL },

    { ngx_string("hermes_queue"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hermes_loc_conf_t, queue),
      &ngx_http_hermes_queue_bounds },

    { ngx_string("hermes_sandbox"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_hermes_sandbox_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hermes_loc_conf_t, sandbox),
      NULL },

    { ngx_string("hermes_tools"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_hermes_tools,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("hermes_tools_pass"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE12,
      ngx_http_hermes_tools_pass,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("hermes_tools_schema"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_hermes_tools_schema,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("hermes_schema"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_hermes_schema,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("hermes_max_tool_calls"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hermes_loc_conf_t, max_tool_calls),
      &ngx_http_hermes_tool_calls_bounds },

    { ngx_string("hermes_thread_pool"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hermes_loc_conf_t, thread_pool_name),
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_hermes_module_ctx = {
    ngx_http_hermes_add_variables,         /* preconfiguration */
    ngx_http_hermes_postconfiguration,     /* postconfiguration */

    ngx_http_hermes_create_main_conf,      /* create main configuration */
    NULL,                                  /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_hermes_create_loc_conf,       /* create location configuration */
    ngx_http_hermes_merge_loc_conf         /* merge location configuration */
};


ngx_module_t  ngx_http_hermes_module = {
    NGX_MODULE_V1,
    &ngx_http_hermes_module_ctx,           /* module context */
    ngx_http_hermes_commands,              /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    ngx_http_hermes_init_module,           /* init module */
    ngx_http_hermes_init_process,          /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_hermes_exit_process,          /* exit process */
    ngx_http_hermes_exit_master,           /* exit master */
    NGX_MODULE_V1_PADDING
};


static ngx_int_t
ngx_http_hermes_init_module(ngx_cycle_t *cycle)
{
    if (sodium_init() < 0) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "hermes: sodium_init() failed");
        return NGX_ERROR;
    }

    /*
     * nginx -V cannot name a dynamic module: say which one is loaded, as
     * nginx says its own version when it starts
     */

    ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                  "hermes: " NGX_HTTP_HERMES_NAME "/%V (commit %V)",
                  &ngx_http_hermes_version, &ngx_http_hermes_commit);

    if (ngx_http_hermes_local_make_roots(cycle) != NGX_OK
        && ngx_is_init_cycle(cycle->old_cycle))
    {
        /* the first start fails, as for nginx's own temp paths */
        return NGX_ERROR;
    }

    return NGX_OK;
}


static char *
ngx_http_hermes_max_output_check(ngx_conf_t *cf, void *post, void *data)
{
    size_t *sp = data;

    if (*sp < 100) {
        return "must be at least 100";
    }

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_hermes_init_process(ngx_cycle_t *cycle)
{
    ngx_http_hermes_main_conf_t  *hmcf;

    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    hmcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_hermes_module);

    if (hmcf == NULL || hmcf->zones.nelts == 0) {
        return NGX_OK;
    }

    if (ngx_http_hermes_backend_init_process(cycle) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_hermes_kernel_init_process(cycle, hmcf) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_hermes_transport_local_init_process(cycle);
}


static void
ngx_http_hermes_exit_master(ngx_cycle_t *cycle)
{
    /* the kills go through the backends */

    if (ngx_http_hermes_backend_init_process(cycle) != NGX_OK) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, 0,
                      "hermes: cannot kill the kernels at exit");
        return;
    }

    ngx_http_hermes_kernel_exit_master(cycle);
}


static void
ngx_http_hermes_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_hermes_transport_local_exit_process(cycle);
    ngx_http_hermes_kernel_exit_process(cycle);
}


static void *
ngx_http_hermes_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_hermes_main_conf_t  *hmcf;

    hmcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_hermes_main_conf_t));
    if (hmcf == NULL) {
        return NULL;
    }

    if (ngx_array_init(&hmcf->zones, cf->pool, 2, sizeof(ngx_shm_zone_t *))
        != NGX_OK
        || ngx_array_init(&hmcf->backends, cf->pool, 4,
                          sizeof(ngx_http_hermes_backend_conf_t *))
           != NGX_OK
        || ngx_array_init(&hmcf->locations, cf->pool, 4,
                          sizeof(ngx_http_hermes_location_t))
           != NGX_OK
        || ngx_array_init(&hmcf->environments, cf->pool, 4,
                          sizeof(ngx_http_hermes_environment_t *))
           != NGX_OK)
    {
        return NULL;
    }

    return hmcf;
}


/* hermes_cell_timeout TIME [grace=TIME] */

static char *
ngx_http_hermes_cell_timeout(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_hermes_loc_conf_t *hlcf = conf;

    ngx_str_t   *value, s;
    ngx_msec_t   t;

    if (hlcf->cell_timeout != NGX_CONF_UNSET_MSEC) {
        return "is duplicate";
    }

    value = cf->args->elts;

    t = ngx_parse_time(&value[1], 0);
    if (t == (ngx_msec_t) NGX_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid hermes_cell_timeout \"%V\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    if (t < 1000) {
        /* here, where the file and line are this directive's */
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"hermes_cell_timeout\" must be at least 1s");
        return NGX_CONF_ERROR;
    }

    hlcf->cell_timeout = t;

    if (cf->args->nelts == 2) {
        return NGX_CONF_OK;
    }

    if (ngx_strncmp(value[2].data, "grace=", 6) != 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid hermes_cell_timeout parameter \"%V\": "
                           "grace=TIME expected", &value[2]);
        return NGX_CONF_ERROR;
    }

    s.data = value[2].data + 6;
    s.len = value[2].len - 6;

    t = ngx_parse_time(&s, 0);
    if (t == (ngx_msec_t) NGX_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid hermes_cell_timeout grace \"%V\"", &s);
        return NGX_CONF_ERROR;
    }

    hlcf->cell_grace = t;

    return NGX_CONF_OK;
}


static void *
ngx_http_hermes_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_hermes_loc_conf_t  *conf;

    conf = ngx_pcalloc(cf->pool, sizeof(ngx_http_hermes_loc_conf_t));
    if (conf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     conf->handler = NGX_HTTP_HERMES_HANDLER_NONE;
     *     conf->zone_name = { 0, NULL };
     *     conf->shm_zone = NULL;
     *     conf->backend = NULL;
     *     conf->owner = NULL;
     *     conf->session = NULL;
     *     conf->thread_pool_name = { 0, NULL };
     *     conf->tools_schema = { 0, NULL };
     *     conf->thread_pool = NULL;
     */

    conf->cell_timeout = NGX_CONF_UNSET_MSEC;
    conf->cell_grace = NGX_CONF_UNSET_MSEC;
    conf->sandbox = NGX_CONF_UNSET_PTR;
    conf->max_output = NGX_CONF_UNSET_SIZE;
    conf->max_stream = NGX_CONF_UNSET_SIZE;
    conf->max_code = NGX_CONF_UNSET_SIZE;
    conf->max_file = NGX_CONF_UNSET_SIZE;
    conf->queue = NGX_CONF_UNSET_UINT;
    conf->heartbeat = NGX_CONF_UNSET_MSEC;
    conf->tools = NGX_CONF_UNSET_PTR;
    conf->tools_auto = NGX_CONF_UNSET_UINT;
    conf->tools_protocol = NGX_CONF_UNSET_UINT;
    conf->max_tool_calls = NGX_CONF_UNSET_UINT;
    conf->environments = NGX_CONF_UNSET_PTR;
    conf->mcp_hosts = NGX_CONF_UNSET_PTR;
    conf->mcp_origins = NGX_CONF_UNSET_PTR;

    return conf;
}


static char *
ngx_http_hermes_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_hermes_loc_conf_t *prev = parent;
    ngx_http_hermes_loc_conf_t *conf = child;

    ngx_str_t                     root;
    ngx_uint_t                    i;
    ngx_shm_zone_t              **zones;
    ngx_http_hermes_main_conf_t  *hmcf;

    ngx_conf_merge_msec_value(conf->cell_timeout, prev->cell_timeout, 300000);
    ngx_conf_merge_msec_value(conf->cell_grace, prev->cell_grace, 2000);
    ngx_conf_merge_size_value(conf->max_output, prev->max_output, 50000);
    ngx_conf_merge_size_value(conf->max_stream, prev->max_stream,
                              5 * 1024 * 1024);
    ngx_conf_merge_size_value(conf->max_code, prev->max_code, 1024 * 1024);
    ngx_conf_merge_size_value(conf->max_file, prev->max_file,
                              100 * 1024 * 1024);
    ngx_conf_merge_uint_value(conf->queue, prev->queue, 8);
    ngx_conf_merge_msec_value(conf->heartbeat, prev->heartbeat, 15000);
    ngx_conf_merge_str_value(conf->thread_pool_name, prev->thread_pool_name,
                             "default");
    ngx_http_hermes_tools_schema_merge(conf, prev);

    if (conf->tools == NGX_CONF_UNSET_PTR) {
        conf->tools = prev->tools;
        conf->tools_auto = prev->tools_auto;
    }

    if (conf->tools == NGX_CONF_UNSET_PTR) {
        conf->tools = NULL;
    }

    ngx_conf_merge_uint_value(conf->tools_auto, prev->tools_auto, 0);
    ngx_conf_merge_str_value(conf->tools_pass, prev->tools_pass, "");
    ngx_conf_merge_uint_value(conf->tools_protocol, prev->tools_protocol,
                              NGX_HTTP_HERMES_TOOLS_HERMES);
    ngx_conf_merge_uint_value(conf->max_tool_calls, prev->max_tool_calls, 50);
    ngx_conf_merge_ptr_value(conf->environments, prev->environments, NULL);
    ngx_conf_merge_ptr_value(conf->mcp_hosts, prev->mcp_hosts, NULL);
    ngx_conf_merge_ptr_value(conf->mcp_origins, prev->mcp_origins, NULL);

    if (conf->session == NULL) {
        conf->session = prev->session;
    }

    if (conf->owner == NULL) {
        conf->owner = prev->owner;
    }

    if (conf->backend == NULL) {
        conf->backend = prev->backend;
    }

    ngx_conf_merge_ptr_value(conf->sandbox, prev->sandbox, NULL);

    if (conf->sandbox == NULL) {
        conf->sandbox = ngx_http_hermes_sandbox_default(cf);
        if (conf->sandbox == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    if (conf->backend == NULL) {
        ngx_str_set(&root, "/tmp");

        conf->backend = ngx_http_hermes_backend_create(cf,
                                           &ngx_http_hermes_backend_local_ops,
                                           &root);
        if (conf->backend == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    if (conf->cell_timeout < 1000) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"hermes_cell_timeout\" must be at least 1s");
        return NGX_CONF_ERROR;
    }

    if (conf->max_output < 100) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"hermes_max_output\" must be at least 100");
        return NGX_CONF_ERROR;
    }

    if (conf->tools_auto
        && conf->tools_protocol != NGX_HTTP_HERMES_TOOLS_MCP
        && (conf->handler == NGX_HTTP_HERMES_HANDLER_EXECUTE
            || conf->handler == NGX_HTTP_HERMES_HANDLER_MCP))
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"hermes_tools auto\" needs "
                           "\"hermes_tools_pass URI protocol=mcp\"");
        return NGX_CONF_ERROR;
    }

    if (conf->handler == NGX_HTTP_HERMES_HANDLER_NONE) {
        return NGX_CONF_OK;
    }

    if ((conf->handler == NGX_HTTP_HERMES_HANDLER_EXECUTE
         || conf->handler == NGX_HTTP_HERMES_HANDLER_MCP)
        && conf->sandbox->implicit
        && conf->backend->ops == &ngx_http_hermes_backend_local_ops
        && ngx_http_hermes_sandbox_check(cf, conf->sandbox) != NGX_OK)
    {
        /* the default sandboxes where it can; say where it cannot */
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "kernels of this location run without a sandbox "
                           "(no hermes_sandbox set, and no bwrap)");
    }

    /* a content handler: find its zone and thread pool */

    hmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_hermes_module);
    zones = hmcf->zones.elts;

    if (conf->zone_name.len == 0) {
        if (hmcf->zones.nelts != 1) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               hmcf->zones.nelts
                               ? "\"hermes_%s\" needs zone=NAME: "
                                 "there are several hermes_zone"
                               : "\"hermes_%s\" needs a hermes_zone "
                                 "in the http block",
                               ngx_http_hermes_handler_names[conf->handler]);
            return NGX_CONF_ERROR;
        }

        conf->shm_zone = zones[0];

    } else {
        for (i = 0; i < hmcf->zones.nelts; i++) {
            if (zones[i]->shm.name.len == conf->zone_name.len
                && ngx_strncmp(zones[i]->shm.name.data, conf->zone_name.data,
                               conf->zone_name.len) == 0)
            {
                conf->shm_zone = zones[i];
                break;
            }
        }

        if (conf->shm_zone == NULL) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "unknown hermes_zone \"%V\"", &conf->zone_name);
            return NGX_CONF_ERROR;
        }
    }

    conf->thread_pool = ngx_thread_pool_add(cf, &conf->thread_pool_name);
    if (conf->thread_pool == NULL) {
        return NGX_CONF_ERROR;
    }

    if (conf->handler == NGX_HTTP_HERMES_HANDLER_EXECUTE
        || conf->handler == NGX_HTTP_HERMES_HANDLER_MCP)
    {
        if (ngx_http_hermes_environment_check(cf, conf) != NGX_CONF_OK) {
            return NGX_CONF_ERROR;
        }

        return ngx_http_hermes_warm_conf(cf, conf);
    }

    return NGX_CONF_OK;
}


/* the module's filters: the JSON errors, then the tool calls' captures */

static ngx_int_t
ngx_http_hermes_postconfiguration(ngx_conf_t *cf)
{
    if (ngx_http_hermes_response_filter_init(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_hermes_rpc_filter_init(cf);
}


/* hermes_tools NAME ...: the tools cells may call; "off": none */

static char *
ngx_http_hermes_tools(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_hermes_loc_conf_t *hlcf = conf;

    ngx_str_t  *value, *name;
    ngx_uint_t  i, k;

    if (hlcf->tools != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (cf->args->nelts == 2 && ngx_strcmp(value[1].data, "off") == 0) {
        hlcf->tools = NULL;
        hlcf->tools_auto = 0;
        return NGX_CONF_OK;
    }

    hlcf->tools_auto = 0;

    if (cf->args->nelts == 2 && ngx_strcmp(value[1].data, "auto") == 0) {
        /* the MCP server's tools/list: known at the first call */
        hlcf->tools = ngx_array_create(cf->pool, 1, sizeof(ngx_str_t));
        if (hlcf->tools == NULL) {
            return NGX_CONF_ERROR;
        }

        hlcf->tools_auto = 1;
        return NGX_CONF_OK;
    }

    hlcf->tools = ngx_array_create(cf->pool, cf->args->nelts - 1,
                                   sizeof(ngx_str_t));
    if (hlcf->tools == NULL) {
        return NGX_CONF_ERROR;
    }

    for (i = 1; i < cf->args->nelts; i++) {

        if (!ngx_http_hermes_tool_name_valid(value[i].data, value[i].len)) {
            goto invalid;
        }

        name = hlcf->tools->elts;

        for (k = 0; k < hlcf->tools->nelts; k++) {
            if (name[k].len == value[i].len
                && ngx_strncmp(name[k].data, value[i].data, value[i].len)
                   == 0)
            {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "\"hermes_tools\": \"%V\" is listed "
                                   "twice", &value[i]);
                return NGX_CONF_ERROR;
            }
        }

        name = ngx_array_push(hlcf->tools);
        if (name == NULL) {
            return NGX_CONF_ERROR;
        }

        *name = value[i];
    }

    return ngx_http_hermes_tools_schema_check(cf, hlcf);

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"hermes_tools\": invalid tool name \"%V\" "
                       "(1-128 of A-Z a-z 0-9 _ - .)", &value[i]);
    return NGX_CONF_ERROR;
}


/* nginx's own bounds check, with the directive's name in its message */

static char *
ngx_http_hermes_max_tool_calls(ngx_conf_t *cf, void *post, void *data)
{
    ngx_conf_num_bounds_t *bounds = post;
    ngx_int_t             *np = data;

    if (*np < bounds->low || *np > bounds->high) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"hermes_max_tool_calls\" must be between %i "
                           "and %i", bounds->low, bounds->high);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/* hermes_schema: the execute_code tool's schema (ngx_hermes_rpc.c) */

static char *
ngx_http_hermes_schema(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if (clcf->handler) {
        return "is duplicate, or the location has a handler already";
    }

    clcf->handler = ngx_http_hermes_schema_handler;

    return NGX_CONF_OK;
}


/* hermes_tools_pass URI [protocol=hermes|mcp] */

static char *
ngx_http_hermes_tools_pass(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_hermes_loc_conf_t *hlcf = conf;

    ngx_str_t  *value;

    if (hlcf->tools_pass.data) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 0 || value[1].data[0] != '/') {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"hermes_tools_pass\": \"%V\" is not a "
                           "location's URI (it starts with \"/\")",
                           &value[1]);
        return NGX_CONF_ERROR;
    }

    hlcf->tools_pass = value[1];
    hlcf->tools_protocol = NGX_HTTP_HERMES_TOOLS_HERMES;

    if (cf->args->nelts == 3) {
        if (ngx_strcmp(value[2].data, "protocol=hermes") == 0) {
            hlcf->tools_protocol = NGX_HTTP_HERMES_TOOLS_HERMES;

        } else if (ngx_strcmp(value[2].data, "protocol=mcp") == 0) {
            hlcf->tools_protocol = NGX_HTTP_HERMES_TOOLS_MCP;

        } else {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"hermes_tools_pass\": invalid parameter "
                               "\"%V\" (protocol=hermes or protocol=mcp)",
                               &value[2]);
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


/*
 * hermes_zone NAME:SIZE [max_kernels=N] [max_kernels_per_owner=N]
 *             [idle_timeout=TIME] [sweep=TIME]
 */

static char *
ngx_http_hermes_zone(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_hermes_main_conf_t *hmcf = conf;

    u_char                  *p;
    ssize_t                  size;
    uint32_t                 crc[2];
    ngx_int_t                n;
    ngx_str_t               *value, name, s;
    ngx_uint_t               i, per_owner;
    ngx_msec_t               sweep;
    ngx_shm_zone_t          *shm_zone, **z;
    ngx_http_hermes_zone_t  *zone;

    value = cf->args->elts;

    zone = ngx_pcalloc(cf->pool, sizeof(ngx_http_hermes_zone_t));
    if (zone == NULL) {
        return NGX_CONF_ERROR;
    }

    zone->max_kernels = 64;
    zone->idle_timeout = 30 * 60 * 1000;
    zone->mcp_sessions = 1024;
    zone->mcp_session_timeout = 24 * 60 * 60;
    sweep = NGX_CONF_UNSET_MSEC;
    per_owner = NGX_CONF_UNSET_UINT;

    p = (u_char *) ngx_strchr(value[1].data, ':');

    if (p == NULL || p == value[1].data) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid hermes_zone \"%V\": NAME:SIZE expected",
                           &value[1]);
        return NGX_CONF_ERROR;
    }

    name.data = value[1].data;
    name.len = p - value[1].data;

    s.data = p + 1;
    s.len = value[1].data + value[1].len - s.data;

    size = ngx_parse_size(&s);

    if (size == NGX_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid hermes_zone size \"%V\"", &s);
        return NGX_CONF_ERROR;
    }

    if (size < (ssize_t) (8 * ngx_pagesize)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "hermes_zone \"%V\" is too small: at least %uzk",
                           &name, 8 * ngx_pagesize / 1024);
        return NGX_CONF_ERROR;
    }

    for (i = 2; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "max_kernels=", 12) == 0) {
            n = ngx_atoi(value[i].data + 12, value[i].len - 12);

            if (n == NGX_ERROR || n < 1) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid hermes_zone max_kernels \"%V\": "
                                   "a number of at least 1 expected",
                                   &value[i]);
                return NGX_CONF_ERROR;
            }

            zone->max_kernels = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "max_kernels_per_owner=", 22) == 0) {
            n = ngx_atoi(value[i].data + 22, value[i].len - 22);

            if (n == NGX_ERROR || n < 1) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid hermes_zone max_kernels_per_owner "
                                   "\"%V\": a number of at least 1 expected",
                                   &value[i]);
                return NGX_CONF_ERROR;
            }

            per_owner = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "idle_timeout=", 13) == 0) {
            s.data = value[i].data + 13;
            s.len = value[i].len - 13;

            zone->idle_timeout = ngx_parse_time(&s, 0);

            if (zone->idle_timeout == (ngx_msec_t) NGX_ERROR
                || zone->idle_timeout < 1000)
            {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid hermes_zone idle_timeout \"%V\": "
                                   "a time of at least 1s expected",
                                   &value[i]);
                return NGX_CONF_ERROR;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "mcp_sessions=", 13) == 0) {
            n = ngx_atoi(value[i].data + 13, value[i].len - 13);

            if (n == NGX_ERROR || n < 1) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid hermes_zone mcp_sessions \"%V\": "
                                   "a number of at least 1 expected",
                                   &value[i]);
                return NGX_CONF_ERROR;
            }

            zone->mcp_sessions = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "mcp_session_timeout=", 20) == 0) {
            s.data = value[i].data + 20;
            s.len = value[i].len - 20;

            n = ngx_parse_time(&s, 1);

            if (n == NGX_ERROR || n < 1) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid hermes_zone mcp_session_timeout "
                                   "\"%V\": a time of at least 1s expected",
                                   &value[i]);
                return NGX_CONF_ERROR;
            }

            zone->mcp_session_timeout = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "sweep=", 6) == 0) {
            s.data = value[i].data + 6;
            s.len = value[i].len - 6;

            sweep = ngx_parse_time(&s, 0);

            if (sweep == (ngx_msec_t) NGX_ERROR || sweep < 100) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid hermes_zone sweep \"%V\": "
                                   "a time of at least 100ms expected",
                                   &value[i]);
                return NGX_CONF_ERROR;
            }

            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid hermes_zone parameter \"%V\"", &value[i]);
        return NGX_CONF_ERROR;
    }

    zone->sweep = (sweep != NGX_CONF_UNSET_MSEC)
                  ? sweep : ngx_min(zone->idle_timeout / 10, 10000);

    /* the same gateway after a crash, another one beside it: leftovers */

    crc[0] = ngx_crc32_long(cf->cycle->conf_file.data,
                            cf->cycle->conf_file.len);
    crc[1] = ngx_crc32_long(name.data, name.len);
    ngx_hex_dump(zone->gateway, (u_char *) crc, sizeof(crc));

    zone->max_kernels_per_owner = (per_owner != NGX_CONF_UNSET_UINT)
                                  ? per_owner
                                  : ngx_max(zone->max_kernels / 4, 1);

    shm_zone = ngx_shared_memory_add(cf, &name, size, &ngx_http_hermes_module);
    if (shm_zone == NULL) {
        return NGX_CONF_ERROR;
    }

    if (shm_zone->data) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "duplicate hermes_zone \"%V\"", &name);
        return NGX_CONF_ERROR;
    }

    zone->shm_zone = shm_zone;

    ngx_str_set(&s, "default");

    zone->thread_pool = ngx_thread_pool_add(cf, &s);
    if (zone->thread_pool == NULL) {
        return NGX_CONF_ERROR;
    }

    shm_zone->init = ngx_http_hermes_registry_init_zone;
    shm_zone->data = zone;

    z = ngx_array_push(&hmcf->zones);
    if (z == NULL) {
        return NGX_CONF_ERROR;
    }

    *z = shm_zone;

    return NGX_CONF_OK;
}


/*
 * hermes_backend NAME [root=PATH] [warm=N] [PARAM...]: root= and warm= are
 * every backend's, the rest its own (ngx_http_hermes_backends[]).
 */

static char *
ngx_http_hermes_backend(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_hermes_loc_conf_t *hlcf = conf;

    void                           *data;
    ngx_int_t                       warm, rc;
    ngx_str_t                      *value, root;
    ngx_uint_t                      i;
    ngx_http_hermes_backend_ops_t  *ops;

    if (hlcf->backend) {
        return "is duplicate";
    }

    value = cf->args->elts;

    ops = ngx_http_hermes_backend_ops(&value[1]);

    if (ops == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "unknown hermes_backend \"%V\": \"local\" or "
                           "\"ssh\" expected", &value[1]);
        return NGX_CONF_ERROR;
    }

    data = NULL;

    if (ops->create_conf) {
        data = ops->create_conf(cf);
        if (data == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    ngx_str_set(&root, "/tmp");
    warm = 0;

    for (i = 2; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "root=", 5) == 0) {
            root.data = value[i].data + 5;
            root.len = value[i].len - 5;
            continue;
        }

        /* not in the tag: the pool's size makes no other place */

        if (ngx_strncmp(value[i].data, "warm=", 5) == 0) {
            warm = ngx_atoi(value[i].data + 5, value[i].len - 5);

            if (warm == NGX_ERROR || warm > NGX_HTTP_HERMES_WARM_MAX) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid hermes_backend warm \"%V\": "
                                   "a number from 0 to %d expected",
                                   &value[i], NGX_HTTP_HERMES_WARM_MAX);
                return NGX_CONF_ERROR;
            }

            continue;
        }

        rc = ops->parse ? ops->parse(cf, data, &value[i]) : NGX_DECLINED;

        if (rc == NGX_ERROR) {
            return NGX_CONF_ERROR;
        }

        if (rc == NGX_DECLINED) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid hermes_backend parameter \"%V\"",
                               &value[i]);
            return NGX_CONF_ERROR;
        }
    }

    hlcf->backend = ngx_http_hermes_backend_create(cf, ops, &root);
    if (hlcf->backend == NULL) {
        return NGX_CONF_ERROR;
    }

    hlcf->backend->warm = warm;
    hlcf->backend->data = data;

    return ops->init_conf ? ops->init_conf(cf, hlcf->backend) : NGX_CONF_OK;
}


/* hermes_execute, hermes_kernels, hermes_status, hermes_mcp [zone=NAME] */

static char *
ngx_http_hermes_content(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_hermes_loc_conf_t *hlcf = conf;

    ngx_str_t                    *value;
    ngx_http_core_loc_conf_t     *clcf;
    ngx_http_hermes_location_t   *loc;
    ngx_http_hermes_main_conf_t  *hmcf;

    if (hlcf->handler != NGX_HTTP_HERMES_HANDLER_NONE) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (cf->args->nelts == 2) {
        if (ngx_strncmp(value[1].data, "zone=", 5) != 0
            || value[1].len == 5)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid parameter \"%V\": zone=NAME expected",
                               &value[1]);
            return NGX_CONF_ERROR;
        }

        hlcf->zone_name.data = value[1].data + 5;
        hlcf->zone_name.len = value[1].len - 5;
    }

    hlcf->handler = cmd->offset;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = (ngx_http_handler_pt) cmd->post;

    /* a URI never names a named location */

    if (clcf->named) {
        return NGX_CONF_OK;
    }

    hmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_hermes_module);

    loc = ngx_array_push(&hmcf->locations);
    if (loc == NULL) {
        return NGX_CONF_ERROR;
    }

    loc->cscf = ngx_http_conf_get_module_srv_conf(cf, ngx_http_core_module);
    loc->clcf = clcf;

    return NGX_CONF_OK;
}
