# SPDX-License-Identifier: BSD-2-Clause
"""A minimal MCP server (streamable HTTP transport) for the tests:
python3 hermes_mcp_server.py PORT HITLOG

POST /mcp takes JSON-RPC 2.0: initialize (answers an Mcp-Session-Id),
notifications/initialized (202), tools/list, tools/call.  Requests after
initialize need a session it gave (else 404, as for an expired one) and
the MCP-Protocol-Version header; DELETE ends one (404 if unknown).  By
path: /mcp-paged lists its tools two a page (nextCursor), /mcp-400
answers a forgotten session 400 naming it, /mcp-old chooses a protocol
version nobody speaks.  POST
/forget (the test's, not nginx's) drops every session.  Each hit is logged to HITLOG as a JSON line.

Tools: add {a,b} and get-sum {a,b} (structuredContent {"sum"} and a
text), greet {name}
(text), two (two texts), oops (isError), stream (answered as an SSE
stream, a progress notification first), ask (an SSE answer sent as it
goes: progress for the call's progressToken, then requests of the
server's, roots/list, elicitation/create, sampling/createMessage, ping and
an unknown one, each waited for, then a text of what the client answered
each), remember {x} and recall (state
kept per session, as a memory or browser server keeps it), slow {quiet}
(an SSE answer that never comes: a progress event, unless quiet, then
": ping" comments every 0.2 s until the client cancels it or 10 s pass;
after a cancel, pings until the gateway closes the stream, logged as
slow-end with how long that took), anything else: JSON-RPC error.
notifications/cancelled is logged with its requestId and reason.
"""

import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, LOG = int(sys.argv[1]), sys.argv[2]
SESSIONS = {}           # id -> the session's state (remember/recall)
ANSWERS = {}            # a request of ours -> the client's answer
WAITING = {}            # a request of ours -> threading.Event
CANCELLED = {}          # (session, a client's request id) -> threading.Event
TOOLS = ["add", "greet", "two", "oops", "stream", "remember", "recall", "ask",
         "get-sum", "slow", "x" * 300]


# input schemas of some (the others: {"type": "object"}), for the stubs
SCHEMAS = {
    "get-sum": {"description": "Add two integers.",
                "inputSchema": {"type": "object",
                                "properties": {"a": {"type": "integer"},
                                               "b": {"type": "integer"}},
                                "required": ["a", "b"]}},
    "greet": {"description": "Greet someone.",
              "inputSchema": {"type": "object",
                              "properties": {"name": {"type": "string",
                                                      "default": "world"}}}},
}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, code, body=None, ctype="application/json", headers=()):
        data = b"" if body is None else (
            body if isinstance(body, bytes) else json.dumps(body).encode())
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        if body is not None:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_DELETE(self):
        # the client ends its session, as the streamable HTTP transport says
        sid = self.headers.get("Mcp-Session-Id")
        with open(LOG, "a") as f:
            f.write(json.dumps({
                "method": "DELETE", "session": sid, "known": sid in SESSIONS,
                "version": self.headers.get("MCP-Protocol-Version"),
                "length": self.headers.get("Content-Length"),
                "owner": self.headers.get("X-Hermes-Owner")}) + "\n")
        if SESSIONS.pop(sid, None) is None:
            return self.send(404, {"error": "no such session"})
        return self.send(200)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n)
        if self.path == "/forget":
            SESSIONS.clear()
            return self.send(200, {"forgot": True})
        try:
            msg = json.loads(raw)
        except ValueError:
            return self.send(400, {"error": "not json"})
        if isinstance(msg, dict) and "method" not in msg and "id" in msg:
            # the client's answer to a request of ours, in a call's stream
            ANSWERS[msg["id"]] = msg.get("result", msg.get("error"))
            with open(LOG, "a") as f:
                f.write(json.dumps({"method": "answer", "id": msg["id"],
                                    "answer": ANSWERS[msg["id"]],
                                    "session": self.headers.get("Mcp-Session-Id"),
                                    "owner": self.headers.get("X-Hermes-Owner")})
                        + "\n")
            ev = WAITING.pop(msg["id"], None)
            if ev:
                ev.set()
            return self.send(202)
        method = msg.get("method")
        params = msg.get("params") or {}
        sid = self.headers.get("Mcp-Session-Id")
        mode = self.path.split("?")[0]
        with open(LOG, "a") as f:
            f.write(json.dumps({
                "path": mode, "cursor": params.get("cursor"),
                "client": params.get("clientInfo"),
                "method": method, "name": params.get("name"),
                "arguments": params.get("arguments"), "id": msg.get("id"),
                "session": sid, "known": sid in SESSIONS,
                "version": self.headers.get("MCP-Protocol-Version"),
                "accept": self.headers.get("Accept"),
                "request_id": params.get("requestId"),
                "reason": params.get("reason"),
                "owner": self.headers.get("X-Hermes-Owner")}) + "\n")
        rid = msg.get("id")
        if method == "initialize":
            sid = uuid.uuid4().hex
            SESSIONS[sid] = {}
            return self.send(200, {"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": ("1999-01-01" if mode == "/mcp-old"
                                    else "2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "test-mcp", "version": "1"}}},
                headers=[("Mcp-Session-Id", sid)])
        if sid not in SESSIONS:
            if mode == "/mcp-400":
                # as some servers answer a session they forgot
                return self.send(400, {"jsonrpc": "2.0", "id": None, "error": {
                    "code": -32000,
                    "message": "Bad Request: No valid session ID provided"}})
            return self.send(404 if sid else 400, {"error": "no such session"})
        if self.headers.get("MCP-Protocol-Version") != "2025-06-18":
            return self.send(400, {"error": "MCP-Protocol-Version"})
        if method == "notifications/cancelled":
            CANCELLED.setdefault((sid, params.get("requestId")),
                                 threading.Event()).set()
            return self.send(202)
        if method == "notifications/initialized":
            return self.send(202)
        if method == "tools/list":
            tools = [dict({"name": t, "inputSchema": {"type": "object"}},
                          **SCHEMAS.get(t, {})) for t in TOOLS]
            result = {"tools": tools}
            if mode == "/mcp-paged":
                # two a page, an opaque cursor to the next
                at = int(params.get("cursor", "p0")[1:])
                result = {"tools": tools[at:at + 2]}
                if at + 2 < len(tools):
                    result["nextCursor"] = "p%d" % (at + 2)
            return self.send(200, {"jsonrpc": "2.0", "id": rid,
                                   "result": result})
        if method != "tools/call":
            return self.send(200, {"jsonrpc": "2.0", "id": rid, "error": {
                "code": -32601, "message": "Method not found"}})
        name, args = params.get("name"), params.get("arguments") or {}
        if name in ("add", "get-sum"):
            s = args.get("a", 0) + args.get("b", 0)
            res = {"content": [{"type": "text", "text": str(s)}],
                   "structuredContent": {"sum": s}}
        elif name == "greet":
            res = {"content": [{"type": "text", "text": "hello, %s" % args.get("name")}]}
        elif name == "two":
            res = {"content": [{"type": "text", "text": "one"},
                               {"type": "text", "text": "two"}]}
        elif name == "remember":
            SESSIONS[sid]["x"] = args.get("x")
            res = {"content": [{"type": "text", "text": "ok"}]}
        elif name == "recall":
            res = {"content": [{"type": "text",
                                "text": str(SESSIONS[sid].get("x"))}]}
        elif name == "ask":
            return self.ask(rid, params)
        elif name == "slow":
            return self.slow(sid, rid, args)
        elif name == "oops":
            res = {"content": [{"type": "text", "text": "it broke"}], "isError": True}
        elif name == "stream":
            note = {"jsonrpc": "2.0", "method": "notifications/progress",
                    "params": {"progress": 1}}
            resp = {"jsonrpc": "2.0", "id": rid, "result": {
                "content": [{"type": "text", "text": "streamed: %s" % args.get("x")}]}}
            body = ("event: message\ndata: %s\n\nevent: message\ndata: %s\n\n"
                    % (json.dumps(note), json.dumps(resp))).encode()
            return self.send(200, body, "text/event-stream")
        else:
            return self.send(200, {"jsonrpc": "2.0", "id": rid, "error": {
                "code": -32602, "message": "Unknown tool: %s" % name}})
        return self.send(200, {"jsonrpc": "2.0", "id": rid, "result": res})


    def ask(self, rid, params):
        """An SSE answer as it comes: progress, then requests of the
        server's, each waited for (5 s at most), then the result: what
        the client answered to each."""
        token = (params.get("_meta") or {}).get("progressToken")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()          # no length: it ends with the connection

        def event(obj):
            self.wfile.write(("event: message\ndata: %s\n\n"
                              % json.dumps(obj)).encode())
            self.wfile.flush()

        event({"jsonrpc": "2.0", "method": "notifications/progress",
               "params": {"progressToken": token, "progress": 1,
                          "total": 2, "message": "half way"}})
        got = {}
        for i, m in enumerate(("roots/list", "elicitation/create",
                               "sampling/createMessage", "ping", "x/other")):
            qid = "q%d" % i if i % 2 else 1000 + i     # strings and numbers
            ev = WAITING[qid] = threading.Event()
            event({"jsonrpc": "2.0", "id": qid, "method": m, "params": {}})
            got[m] = ANSWERS.get(qid) if ev.wait(5) else "no answer"
        event({"jsonrpc": "2.0", "id": rid, "result": {"content": [
            {"type": "text", "text": json.dumps(got, sort_keys=True)}]}})
        self.close_connection = True


    def slow(self, sid, rid, args):
        """An answer that never comes, until the client cancels the call:
        then pings until the stream is closed (the gateway ends it)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.close_connection = True
        ev = CANCELLED.setdefault((sid, rid), threading.Event())
        end = {"method": "slow-end", "id": rid, "cancelled": False,
               "closed_after": None}
        try:
            if not args.get("quiet"):
                self.wfile.write(b'event: message\ndata: {"jsonrpc":"2.0",'
                                 b'"method":"notifications/progress",'
                                 b'"params":{"progress":0}}\n\n')
                self.wfile.flush()
            if ev.wait(10):
                end["cancelled"] = True
                t0 = time.monotonic()
                try:
                    for _ in range(50):
                        self.wfile.write(b": ping\n\n")
                        self.wfile.flush()
                        time.sleep(0.2)
                except OSError:
                    end["closed_after"] = time.monotonic() - t0
        except OSError:
            pass
        with open(LOG, "a") as f:
            f.write(json.dumps(end) + "\n")


ThreadingHTTPServer.daemon_threads = True
srv = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
print("ready", flush=True)
srv.serve_forever()
