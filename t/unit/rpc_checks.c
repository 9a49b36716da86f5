
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * The checks every rpc/req_N passes before anything else (docs/protocol.md,
 * "Tool calls"): a well-formed JSON object; the kernel's token, compared
 * in constant time; seq a JSON integer (not "1", 1.5, 1e0, true) equal to the file's
 * own number; never seen before in the cell.  Each failure has its reason,
 * counted in rpc_rejected_total{reason}.
 *
 * Links the real src/ngx_hermes_rpc.c (the rest of it is dropped by the
 * linker: --gc-sections) with yajl and libsodium.
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_hermes.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>


#define TOKEN  "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e"


static ngx_int_t
check(const char *text, uint64_t name_seq, uint64_t *seen, ngx_uint_t nseen,
    ngx_http_hermes_rpc_req_t *req)
{
    return ngx_http_hermes_rpc_check((u_char *) text, strlen(text), name_seq,
                                     (u_char *) TOKEN, sizeof(TOKEN) - 1,
                                     seen, nseen, req);
}


static ngx_uint_t
reason(const char *text, uint64_t name_seq)
{
    ngx_int_t                  rc;
    ngx_http_hermes_rpc_req_t  req;

    rc = check(text, name_seq, NULL, 0, &req);

    if (rc == NGX_OK) {
        return NGX_HTTP_HERMES_RPC_NREJECT;
    }

    assert_int_equal(rc, NGX_DECLINED);

    return req.reject;
}


static void
test_good_request(void **state)
{
    ngx_http_hermes_rpc_req_t  req;

    assert_int_equal(check("{\"tool\":\"web_search\",\"args\":{\"q\":[1,{\"a\":"
                           "\"}\"}]},\"seq\":12,\"token\":\"" TOKEN "\"}",
                           12, NULL, 0, &req), NGX_OK);

    assert_int_equal(req.seq, 12);
    assert_int_equal(req.tool_type, NGX_HTTP_HERMES_RPC_STRING);
    assert_int_equal(req.tool.len, 10);
    assert_memory_equal(req.tool.data, "web_search", 10);
    assert_int_equal(req.args_type, NGX_HTTP_HERMES_RPC_OBJECT);
    assert_int_equal(req.args.len, sizeof("{\"q\":[1,{\"a\":\"}\"}]}") - 1);
    assert_memory_equal(req.args.data, "{\"q\":[1,{\"a\":\"}\"}]}",
                        req.args.len);

    /* key order and unknown keys do not matter */
    assert_int_equal(reason("{\"token\":\"" TOKEN "\",\"x\":[{}],\"seq\":1,"
                            "\"tool\":\"t\"}", 1),
                     NGX_HTTP_HERMES_RPC_NREJECT);
}


static void
test_malformed(void **state)
{
    static const char  *bad[] = {
        "",
        "{",
        "[]",
        "[{\"tool\":\"t\",\"seq\":1,\"token\":\"" TOKEN "\"}]",
        "\"str\"",
        "1",
        "null",
        "{\"tool\":\"t\",\"seq\":1,\"token\":\"" TOKEN "\"} {}",
        "{\"tool\":\"t\",\"seq\":1,\"seq\":1,\"token\":\"" TOKEN "\"}",
        "{\"tool\":\"t\",\"seq\":1,\"token\":\"" TOKEN "\",\"token\":\"x\"}",
        "{\"tool\":\"\xff\",\"seq\":1,\"token\":\"" TOKEN "\"}",
        "{'tool':'t'}",
        NULL
    };

    ngx_uint_t  i;

    for (i = 0; bad[i]; i++) {
        assert_int_equal(reason(bad[i], 1), NGX_HTTP_HERMES_RPC_MALFORMED);
    }

    /* a NUL inside: yajl would stop there, we do not */
    {
        ngx_http_hermes_rpc_req_t  req;
        char text[] = "{\"tool\":\"t\",\"seq\":1,\"token\":\"" TOKEN "\"}\0x";

        assert_int_equal(ngx_http_hermes_rpc_check((u_char *) text,
                                                   sizeof(text) - 1, 1,
                                                   (u_char *) TOKEN,
                                                   sizeof(TOKEN) - 1,
                                                   NULL, 0, &req),
                         NGX_DECLINED);
        assert_int_equal(req.reject, NGX_HTTP_HERMES_RPC_MALFORMED);
    }

    /* too deep to be a tool call */
    {
        char        text[4096], *p;
        ngx_uint_t  n;

        p = text + sprintf(text, "{\"tool\":\"t\",\"seq\":1,\"token\":\""
                           TOKEN "\",\"args\":");
        for (n = 0; n < 100; n++) { *p++ = '['; }
        for (n = 0; n < 100; n++) { *p++ = ']'; }
        *p++ = '}';
        *p = '\0';

        assert_int_equal(reason(text, 1), NGX_HTTP_HERMES_RPC_MALFORMED);
    }
}


static void
test_token(void **state)
{
    assert_int_equal(reason("{\"tool\":\"t\",\"seq\":1}", 1),
                     NGX_HTTP_HERMES_RPC_BAD_TOKEN);
    assert_int_equal(reason("{\"tool\":\"t\",\"seq\":1,\"token\":null}", 1),
                     NGX_HTTP_HERMES_RPC_BAD_TOKEN);
    assert_int_equal(reason("{\"tool\":\"t\",\"seq\":1,\"token\":[\"" TOKEN
                            "\"]}", 1),
                     NGX_HTTP_HERMES_RPC_BAD_TOKEN);
    assert_int_equal(reason("{\"tool\":\"t\",\"seq\":1,\"token\":\""
                            "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e"
                            "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5f\"}", 1),
                     NGX_HTTP_HERMES_RPC_BAD_TOKEN);
    /* a prefix, the token and more */
    assert_int_equal(reason("{\"tool\":\"t\",\"seq\":1,\"token\":\"5e5e\"}", 1),
                     NGX_HTTP_HERMES_RPC_BAD_TOKEN);
    assert_int_equal(reason("{\"tool\":\"t\",\"seq\":1,\"token\":\"" TOKEN
                            "00\"}", 1),
                     NGX_HTTP_HERMES_RPC_BAD_TOKEN);
    /* the token checked before seq: a forger learns nothing of seqs */
    assert_int_equal(reason("{\"seq\":\"x\",\"token\":\"00\"}", 1),
                     NGX_HTTP_HERMES_RPC_BAD_TOKEN);
}


static void
test_seq(void **state)
{
    static const char  *bad[] = {
        "\"1\"", "1.5", "1.0", "1e0", "true", "false", "null", "-1", "0",
        "[1]", "{\"n\":1}", "10000000000000000", NULL
    };

    char        text[256];
    ngx_uint_t  i;

    for (i = 0; bad[i]; i++) {
        sprintf(text, "{\"tool\":\"t\",\"seq\":%s,\"token\":\"" TOKEN "\"}",
                bad[i]);
        assert_int_equal(reason(text, 1), NGX_HTTP_HERMES_RPC_BAD_SEQ);
    }

    /* absent, or not the file's number */
    assert_int_equal(reason("{\"tool\":\"t\",\"token\":\"" TOKEN "\"}", 1),
                     NGX_HTTP_HERMES_RPC_BAD_SEQ);
    assert_int_equal(reason("{\"tool\":\"t\",\"seq\":2,\"token\":\"" TOKEN
                            "\"}", 1),
                     NGX_HTTP_HERMES_RPC_BAD_SEQ);
    assert_int_equal(reason("{\"tool\":\"t\",\"seq\":1,\"token\":\"" TOKEN
                            "\"}", 0),
                     NGX_HTTP_HERMES_RPC_BAD_SEQ);
}


static void
test_replay(void **state)
{
    uint64_t                   seen[] = { 3, 1, 7 };
    ngx_http_hermes_rpc_req_t  req;

    assert_int_equal(check("{\"tool\":\"t\",\"seq\":7,\"token\":\"" TOKEN
                           "\"}", 7, seen, 3, &req), NGX_DECLINED);
    assert_int_equal(req.reject, NGX_HTTP_HERMES_RPC_REPLAY);

    assert_int_equal(check("{\"tool\":\"t\",\"seq\":2,\"token\":\"" TOKEN
                           "\"}", 2, seen, 3, &req), NGX_OK);

    /* a wrong token is a token rejection, not a replay */
    assert_int_equal(check("{\"tool\":\"t\",\"seq\":7,\"token\":\"ab\"}", 7,
                           seen, 3, &req), NGX_DECLINED);
    assert_int_equal(req.reject, NGX_HTTP_HERMES_RPC_BAD_TOKEN);
}


static void
test_names(void **state)
{
#define NAME(s)  ngx_http_hermes_rpc_name_seq((u_char *) s, sizeof(s) - 1)

    assert_int_equal(NAME("req_000001"), 1);
    assert_int_equal(NAME("req_123456"), 123456);
    assert_int_equal(NAME("req_1234567"), 1234567);
    assert_int_equal(NAME("req_000000"), 0);
    assert_int_equal(NAME("req_00001"), 0);
    assert_int_equal(NAME("req_0000001"), 0);
    assert_int_equal(NAME("req_000001.tmp"), 0);
    assert_int_equal(NAME("res_000001"), 0);
    assert_int_equal(NAME("req_00000x"), 0);
    assert_int_equal(NAME("req_-00001"), 0);

#undef NAME
}


int
main(void)
{
    const struct CMUnitTest  tests[] = {
        cmocka_unit_test(test_good_request),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_token),
        cmocka_unit_test(test_seq),
        cmocka_unit_test(test_replay),
        cmocka_unit_test(test_names),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
