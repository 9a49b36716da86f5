
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: files into and out of a kernel, and resumed streams.
 */


#ifndef _NGX_HERMES_FILES_H_INCLUDED_
#define _NGX_HERMES_FILES_H_INCLUDED_


#include "ngx_hermes.h"


#define NGX_HTTP_HERMES_FILES_PATH_MAX  1024

/* hermes_files.py's first line: the file's size, inode and mtime */
#define NGX_HTTP_HERMES_FILES_HEAD      (3 * NGX_INT64_LEN + 3)

/*
 * a piece at most, either way: the worker holds one a transfer (a GET's
 * next is read once its user took the last; a PUT's from its body as
 * the last is written)
 */
#define NGX_HTTP_HERMES_FILES_PIECE     (4 * 1024 * 1024)


/* a shipped cell's stream again, from an offset */

ngx_int_t ngx_http_hermes_resume_handler(ngx_http_request_t *r,
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner, ngx_str_t *session,
    uint32_t cell, off_t offset);


/* files into and out of a kernel's directory: the HTTP route */

ngx_int_t ngx_http_hermes_files_handler(ngx_http_request_t *r,
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner, ngx_str_t *session,
    ngx_str_t *path);


/*
 * The transfer itself (ngx_hermes_files.c), whoever asks for it: the
 * HTTP route, hermes_mcp's upload_file and download_file.  A failure is
 * named as the HTTP files API names it, for each to answer its own way.
 */

typedef struct {
    ngx_uint_t                     status;      /* HTTP's */
    char                          *code;
    char                          *message;
} ngx_http_hermes_files_error_t;

typedef struct ngx_http_hermes_files_s  ngx_http_hermes_files_t;

/*
 * Event loop: a command is done.  f->error: NULL, or why it failed; a
 * GET's piece is f->out, f->out_len long, ending at f->offset of
 * f->size.  The handler answers, or asks for the next piece
 * (ngx_http_hermes_files_start), or finalizes the request.
 */
typedef void (*ngx_http_hermes_files_handler_pt)(ngx_http_hermes_files_t *f);

/* an owner's transfers under way in this worker */
typedef struct {
    size_t                         len;         /* 0: a free slot */
    ngx_uint_t                     n;
    u_char                         owner[NGX_HTTP_HERMES_OWNER_MAX];
} ngx_http_hermes_files_owner_t;

struct ngx_http_hermes_files_s {
    ngx_thread_task_t              task;
    ngx_http_hermes_conn_t         conn;
    ngx_http_request_t            *r;
    ngx_http_hermes_files_handler_pt handler;
    void                          *data;        /* the handler's */
    ngx_http_hermes_files_error_t *error;
    u_char                        *in;          /* length, script */
    size_t                         in_len;
    size_t                         script_len;  /* of in: length and script */
    ngx_chain_t                   *body;        /* a PUT's: buffers in
                                                   memory or nginx's temp
                                                   file, read a piece at a
                                                   time */
    size_t                         body_len;
    u_char                        *out;         /* a GET's piece */
    size_t                         out_size;
    size_t                         out_len;
    size_t                         piece;       /* bytes one command moves */
    size_t                         max_file;
    off_t                          size;        /* a GET's file, -1: unknown */
    off_t                          offset;      /* of the next piece */
    ngx_http_hermes_backend_conf_t *bcf;
    ngx_uint_t                     host;
    ngx_http_hermes_files_owner_t *owner;       /* its count, taken */
    size_t                         head_len;
    u_char                         head[NGX_HTTP_HERMES_FILES_HEAD];
    ngx_int_t                      rc;          /* the last command's:
                                                   NGX_DECLINED: the host
                                                   cannot be reached */
    int                            status;
    ngx_str_t                      path;
    u_char                         dir[NGX_HTTP_HERMES_DIR_MAX];
    u_char                         spath[NGX_HTTP_HERMES_FILES_PATH_MAX + 1];
    u_char                         uid[NGX_INT64_LEN + 1];
    u_char                         max[NGX_INT64_LEN + 1];
    u_char                         nonce[17];
    unsigned                       get:1;
    unsigned                       changed:1;   /* between a GET's pieces */
};


extern ngx_http_hermes_files_error_t  ngx_http_hermes_files_too_large;

ngx_http_hermes_files_t *ngx_http_hermes_files_create(ngx_http_request_t *r,
    ngx_http_hermes_zone_t *zone, ngx_str_t *owner, ngx_str_t *session,
    ngx_str_t *path, ngx_uint_t get, size_t max_file,
    ngx_http_hermes_files_error_t **err);
void ngx_http_hermes_files_set_body(ngx_http_hermes_files_t *f,
    ngx_chain_t *body);
ngx_int_t ngx_http_hermes_files_start(ngx_http_hermes_files_t *f);


#endif /* _NGX_HERMES_FILES_H_INCLUDED_ */
