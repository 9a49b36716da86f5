
/*
 * ngx_hermes: the module's parts, one header each, as ngx_http.h is over
 * ngx_http_request.h and ngx_http_upstream.h.
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


#include "ngx_hermes_config.h"
#include "ngx_hermes_registry.h"
#include "ngx_hermes_backend.h"
#include "ngx_hermes_frames.h"
#include "ngx_hermes_kernel.h"
#include "ngx_hermes_sandbox.h"
#include "ngx_hermes_json.h"
#include "ngx_hermes_stream.h"
#include "ngx_hermes_rpc.h"
#include "ngx_hermes_response.h"
#include "ngx_hermes_files.h"
#include "ngx_hermes_handler.h"

extern ngx_module_t  ngx_http_hermes_module;


#endif /* _NGX_HERMES_H_INCLUDED_ */
