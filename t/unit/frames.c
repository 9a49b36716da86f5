
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * The frames of the kernel-host agent protocol (src/ngx_hermes_frames.c,
 * docs/protocol.md): encoded as the agent decodes them, decoded as the
 * agent encodes them, and every bad length refused.
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_hermes.h"
#include "ngx_unit_shim.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>


static void
test_header_roundtrip(void **state)
{
    u_char                   *p, buf[64];
    ngx_http_hermes_frame_t   f;

    p = ngx_http_hermes_frames_header(buf, 0x01020304, 'O', 5);
    assert_ptr_equal(p, buf + NGX_HTTP_HERMES_FRAME_HEADER);

    /* big-endian, as struct ">IIB" */
    assert_memory_equal(buf, "\x00\x00\x00\x05\x01\x02\x03\x04O", 9);

    ngx_memcpy(p, "hello", 5);

    assert_int_equal(ngx_http_hermes_frames_parse(buf, 14, &f), NGX_OK);
    assert_int_equal(f.len, 5);
    assert_int_equal(f.stream, 0x01020304);
    assert_int_equal(f.type, 'O');
    assert_memory_equal(f.payload, "hello", 5);

    /* one byte short, of the header or of the payload: wait for more */
    assert_int_equal(ngx_http_hermes_frames_parse(buf, 13, &f), NGX_AGAIN);
    assert_int_equal(ngx_http_hermes_frames_parse(buf, 8, &f), NGX_AGAIN);
    assert_int_equal(ngx_http_hermes_frames_parse(buf, 0, &f), NGX_AGAIN);
}


static void
test_length_bound(void **state)
{
    u_char                   buf[16];
    ngx_http_hermes_frame_t  f;

    /* the largest frame is awaited, one byte more is refused at once */

    (void) ngx_http_hermes_frames_header(buf, 1, 'R',
                                         NGX_HTTP_HERMES_FRAME_MAX);
    assert_int_equal(ngx_http_hermes_frames_parse(buf, 9, &f), NGX_AGAIN);

    (void) ngx_http_hermes_frames_header(buf, 1, 'R',
                                         NGX_HTTP_HERMES_FRAME_MAX + 1);
    assert_int_equal(ngx_http_hermes_frames_parse(buf, 9, &f), NGX_ERROR);

    (void) ngx_http_hermes_frames_header(buf, 1, 'R', 0xffffffff);
    assert_int_equal(ngx_http_hermes_frames_parse(buf, 9, &f), NGX_ERROR);

    /* an empty frame is whole with its header */
    (void) ngx_http_hermes_frames_header(buf, 7, 'S', 0);
    assert_int_equal(ngx_http_hermes_frames_parse(buf, 9, &f), NGX_OK);
    assert_int_equal(f.len, 0);
    assert_int_equal(f.stream, 7);
}


static void
test_u64(void **state)
{
    u_char  buf[8];

    (void) ngx_http_hermes_frames_put_u64(buf, 0x0102030405060708ULL);
    assert_memory_equal(buf, "\x01\x02\x03\x04\x05\x06\x07\x08", 8);
    assert_true(ngx_http_hermes_frames_u64(buf) == 0x0102030405060708ULL);

    (void) ngx_http_hermes_frames_put_u64(buf, 300ULL * 1024 * 1024 * 1024);
    assert_true(ngx_http_hermes_frames_u64(buf)
                == 300ULL * 1024 * 1024 * 1024);
}


static void
test_split(void **state)
{
    ngx_str_t  json, bytes;

    assert_int_equal(ngx_http_hermes_frames_split(
                         (u_char *) "\0\0\0\x02{}out", 9, &json, &bytes),
                     NGX_OK);
    assert_int_equal(json.len, 2);
    assert_memory_equal(json.data, "{}", 2);
    assert_int_equal(bytes.len, 3);
    assert_memory_equal(bytes.data, "out", 3);

    /* no bytes after the JSON */
    assert_int_equal(ngx_http_hermes_frames_split(
                         (u_char *) "\0\0\0\x02{}", 6, &json, &bytes),
                     NGX_OK);
    assert_int_equal(bytes.len, 0);

    /* a JSON length past the payload, or no room for it */
    assert_int_equal(ngx_http_hermes_frames_split(
                         (u_char *) "\0\0\0\x03{}", 6, &json, &bytes),
                     NGX_ERROR);
    assert_int_equal(ngx_http_hermes_frames_split(
                         (u_char *) "\xff\xff\xff\xff{}", 6, &json, &bytes),
                     NGX_ERROR);
    assert_int_equal(ngx_http_hermes_frames_split((u_char *) "\0\0\0", 3,
                                                  &json, &bytes),
                     NGX_ERROR);
}


static ngx_int_t
json_int(char *text, char *key, int64_t *v)
{
    ngx_str_t  json;

    json.data = (u_char *) text;
    json.len = ngx_strlen(text);

    return ngx_http_hermes_frames_json_int(&json, key, v);
}


static void
test_json_int(void **state)
{
    int64_t  v;

    assert_int_equal(json_int("{\"status\":0}", "status", &v), NGX_OK);
    assert_int_equal(v, 0);

    assert_int_equal(json_int("{\"status\": -1, \"error\": \"timeout\"}",
                              "status", &v), NGX_OK);
    assert_int_equal(v, -1);

    assert_int_equal(json_int("{\"v\":1,\"pid\":4242,\"uid\":0}", "pid", &v),
                     NGX_OK);
    assert_int_equal(v, 4242);

    /* the key's name inside a string value, escaped quotes and all */
    assert_int_equal(json_int("{\"error\":\"\\\"status\\\":5\",\"status\":2}",
                              "status", &v), NGX_OK);
    assert_int_equal(v, 2);

    assert_int_equal(json_int("{\"error\":\"status\"}", "status", &v),
                     NGX_DECLINED);
    assert_int_equal(json_int("{\"status\":\"0\"}", "status", &v),
                     NGX_DECLINED);
    assert_int_equal(json_int("{\"stat\":1}", "status", &v), NGX_DECLINED);
    assert_int_equal(json_int("{\"status\":", "status", &v), NGX_DECLINED);
    assert_int_equal(json_int("{\"status", "status", &v), NGX_DECLINED);
    assert_int_equal(json_int("{\"status\":99999999999999999999}", "status",
                              &v), NGX_DECLINED);
}


static void
test_magic(void **state)
{
    size_t   skip;
    u_char   buf[128];
    size_t   n;

    static u_char  magic[] = NGX_HTTP_HERMES_FRAME_MAGIC;

    assert_int_equal(sizeof(magic) - 1, 16);

    /* the rc's junk, a NUL of its own, then the magic and a frame */

    n = ngx_cpymem(buf, "junk\n\0junk\n", 11) - buf;
    n = ngx_cpymem(buf + n, magic, 16) - buf;
    n = ngx_cpymem(buf + n, "FRAME", 5) - buf;

    assert_int_equal(ngx_http_hermes_frames_magic(buf, n, &skip), NGX_OK);
    assert_int_equal(skip, 11 + 16);

    /* the magic cut short: what comes before it goes, it stays */

    assert_int_equal(ngx_http_hermes_frames_magic(buf, 11 + 7, &skip),
                     NGX_AGAIN);
    assert_int_equal(skip, 11);

    /* no NUL at all: all of it is junk */

    assert_int_equal(ngx_http_hermes_frames_magic((u_char *) "motd\n", 5,
                                                  &skip),
                     NGX_AGAIN);
    assert_int_equal(skip, 5);
}


static void
test_cell(void **state)
{
    u_char                        *p;
    int64_t                        v;
    ngx_str_t                      json, bytes;
    ngx_http_hermes_frame_t        f;
    ngx_http_hermes_frame_cell_t   c;
    u_char                         buf[NGX_HTTP_HERMES_FRAME_CELL_MAX + 8];

    ngx_memzero(&c, sizeof(c));
    c.dir = (u_char *) "/k/hermes_rkernel_\"q\\";
    c.cell = 3;
    c.pid = 4321;
    c.start = 123456789012ULL;
    c.ino = 77;
    c.uid = 4000000000U;       /* past INT32_MAX: unsigned */
    c.offset = -1;
    c.out_limit = 65536;
    c.res_limit = 365536;
    c.window = 131072;
    c.req_len = 4;

    p = ngx_http_hermes_frames_cell(buf, 9, &c);
    p = ngx_cpymem(p, "{}\n!", 4);

    assert_int_equal(ngx_http_hermes_frames_parse(buf, p - buf, &f), NGX_OK);
    assert_int_equal(f.stream, 9);
    assert_int_equal(f.type, 'C');
    assert_int_equal(NGX_HTTP_HERMES_FRAME_HEADER + f.len, p - buf);

    assert_int_equal(ngx_http_hermes_frames_split(f.payload, f.len, &json,
                                                  &bytes),
                     NGX_OK);
    assert_int_equal(bytes.len, 4);
    assert_memory_equal(bytes.data, "{}\n!", 4);

    /* the directory as a JSON string, every number as it was */

    assert_non_null(ngx_strlcasestrn(json.data, json.data + json.len,
                                     (u_char *) "\"dir\":\"/k/hermes_rkernel_"
                                     "\\\"q\\\\\"", 31 - 1));

    assert_int_equal(ngx_http_hermes_frames_json_int(&json, "offset", &v),
                     NGX_OK);
    assert_int_equal(v, -1);
    assert_int_equal(ngx_http_hermes_frames_json_int(&json, "start", &v),
                     NGX_OK);
    assert_true(v == 123456789012LL);
    assert_int_equal(ngx_http_hermes_frames_json_int(&json, "window", &v),
                     NGX_OK);
    assert_int_equal(v, 131072);
    assert_int_equal(ngx_http_hermes_frames_json_int(&json, "uid", &v),
                     NGX_OK);
    assert_true(v == 4000000000LL);

    /* a resume: no request after it */

    c.offset = 4096;
    c.req_len = 0;
    p = ngx_http_hermes_frames_cell(buf, 10, &c);

    assert_int_equal(ngx_http_hermes_frames_parse(buf, p - buf, &f), NGX_OK);
    assert_int_equal(ngx_http_hermes_frames_split(f.payload, f.len, &json,
                                                  &bytes),
                     NGX_OK);
    assert_int_equal(bytes.len, 0);
    assert_int_equal(ngx_http_hermes_frames_json_int(&json, "offset", &v),
                     NGX_OK);
    assert_int_equal(v, 4096);
}


static void
test_exec(void **state)
{
    u_char                   *p;
    int64_t                   v;
    ngx_str_t                 json, bytes;
    ngx_http_hermes_frame_t   f;
    u_char                    buf[NGX_HTTP_HERMES_FRAME_EXEC_MAX + 6 * 64];

    static u_char  cmd[] = "exec 2>&1\nprintf '%s' \"$x\"";
    static char   *args[] = { "kill", "a\"b\n", NULL };

    p = ngx_http_hermes_frames_exec(buf, 5, cmd, sizeof(cmd) - 1, args, 10000,
                                    255, 3);
    p = ngx_cpymem(p, "in\n", 3);

    assert_int_equal(ngx_http_hermes_frames_parse(buf, p - buf, &f), NGX_OK);
    assert_int_equal(f.type, 'X');
    assert_int_equal(f.stream, 5);
    assert_int_equal(ngx_http_hermes_frames_split(f.payload, f.len, &json,
                                                  &bytes),
                     NGX_OK);
    assert_int_equal(bytes.len, 3);

    /* the newline and the quotes escaped: one JSON string */

    assert_non_null(ngx_strlcasestrn(json.data, json.data + json.len,
                                     (u_char *) "\"cmd\":\"exec 2>&1\\n"
                                     "printf '%s' \\\"$x\\\"\"", 37 - 1));

    /* the arguments: each one JSON string, the quote and newline escaped */

    assert_non_null(ngx_strlcasestrn(json.data, json.data + json.len,
                                     (u_char *) "\"args\":[\"kill\","
                                     "\"a\\\"b\\n\"]", 24 - 1));

    assert_int_equal(ngx_http_hermes_frames_json_int(&json, "timeout", &v),
                     NGX_OK);
    assert_int_equal(v, 10000);
    assert_int_equal(ngx_http_hermes_frames_json_int(&json, "out_max", &v),
                     NGX_OK);
    assert_int_equal(v, 255);
}


/* a KERNEL frame: no command, the script's argv, the stdin bytes after */

static void
test_kernel(void **state)
{
    u_char                   *p;
    ngx_str_t                 json, bytes, v;
    ngx_http_hermes_frame_t   f;
    u_char                    buf[NGX_HTTP_HERMES_FRAME_EXEC_MAX + 6 * 64];

    static char   *args[] = { "ship", "/r", "kernel.env", "3", NULL };

    p = ngx_http_hermes_frames_exec(buf, 7, NULL, 0, args, 10000, 255, 3);
    p = ngx_cpymem(p, "T=1", 3);

    assert_int_equal(ngx_http_hermes_frames_parse(buf, p - buf, &f), NGX_OK);
    assert_int_equal(f.type, 'K');
    assert_int_equal(f.stream, 7);
    assert_int_equal(ngx_http_hermes_frames_split(f.payload, f.len, &json,
                                                  &bytes),
                     NGX_OK);
    assert_int_equal(bytes.len, 3);
    assert_memory_equal(bytes.data, "T=1", 3);

    assert_int_equal(ngx_http_hermes_frames_json_str(&json, "cmd", &v),
                     NGX_DECLINED);
    assert_non_null(ngx_strlcasestrn(json.data, json.data + json.len,
                                     (u_char *) "{\"args\":[\"ship\",\"/r\","
                                     "\"kernel.env\",\"3\"]", 35 - 1));
}


/* a READY frame: the directory JSON-escaped, the pid, the timeout */

static void
test_ready(void **state)
{
    u_char                   *p;
    int64_t                   v;
    ngx_str_t                 json, bytes;
    ngx_http_hermes_frame_t   f;
    u_char                    buf[NGX_HTTP_HERMES_FRAME_EXEC_MAX + 6 * 32];

    static u_char  path[] = "/k/\"odd\"\n\\dir";

    p = ngx_http_hermes_frames_ready(buf, 9, path, sizeof(path) - 1, 4242,
                                     10000);

    assert_int_equal(ngx_http_hermes_frames_parse(buf, p - buf, &f), NGX_OK);
    assert_int_equal(f.type, 'W');
    assert_int_equal(f.stream, 9);
    assert_int_equal(ngx_http_hermes_frames_split(f.payload, f.len, &json,
                                                  &bytes),
                     NGX_OK);
    assert_int_equal(bytes.len, 0);

    /* quotes, the newline and the backslash escaped: one JSON string */

    assert_non_null(ngx_strlcasestrn(json.data, json.data + json.len,
                                     (u_char *) "\"dir\":\"/k/\\\"odd\\\""
                                     "\\n\\\\dir\",", 25 - 1));

    assert_int_equal(ngx_http_hermes_frames_json_int(&json, "pid", &v),
                     NGX_OK);
    assert_int_equal(v, 4242);
    assert_int_equal(ngx_http_hermes_frames_json_int(&json, "timeout", &v),
                     NGX_OK);
    assert_int_equal(v, 10000);
}


static int
setup(void **state)
{
    return (ngx_unit_init() == NGX_OK) ? 0 : -1;
}


int
main(void)
{
    static const struct CMUnitTest  tests[] = {
        cmocka_unit_test(test_header_roundtrip),
        cmocka_unit_test(test_length_bound),
        cmocka_unit_test(test_u64),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_json_int),
        cmocka_unit_test(test_magic),
        cmocka_unit_test(test_cell),
        cmocka_unit_test(test_exec),
        cmocka_unit_test(test_kernel),
        cmocka_unit_test(test_ready),
    };

    return cmocka_run_group_tests_name("frames", tests, setup, NULL);
}
