
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: the frames of the kernel-host agent protocol.
 */


#ifndef _NGX_HERMES_FRAMES_H_INCLUDED_
#define _NGX_HERMES_FRAMES_H_INCLUDED_


#include "ngx_hermes.h"


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


#endif /* _NGX_HERMES_FRAMES_H_INCLUDED_ */
