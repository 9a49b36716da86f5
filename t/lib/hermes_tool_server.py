# SPDX-License-Identifier: BSD-2-Clause
"""A tool endpoint for the tests: python3 hermes_tool_server.py PORT HITLOG

Every request is logged to HITLOG (one JSON line: path, tool, owner,
headers that matter) before it is answered.  POST / answers hermes
protocol calls {"tool","args","session","kernel_id"} by tool name:

    echo      200 {"tool","args","owner","session","kernel_id","ctype"}
    fail      500 {"error": "boom"}
    slow      sleeps args.s seconds (default 3), then 200 {"slept": s}
    notjson   200 text
    big       200 {"data": "x" * args.n}
    anything  404 {"error": {"message": "no such tool"}}
"""

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, LOG = int(sys.argv[1]), sys.argv[2]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def answer(self, code, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n)
        try:
            req = json.loads(raw)
        except ValueError:
            req = {}
        tool = req.get("tool") if isinstance(req, dict) else None
        args = req.get("args") if isinstance(req, dict) else None
        with open(LOG, "a") as f:
            f.write(json.dumps({"path": self.path, "tool": tool, "args": args,
                                "owner": self.headers.get("X-Hermes-Owner"),
                                "ctype": self.headers.get("Content-Type"),
                                "cookie": self.headers.get("Cookie")}) + "\n")
        if tool == "echo":
            self.answer(200, {"tool": tool, "args": args,
                              "owner": self.headers.get("X-Hermes-Owner"),
                              "session": req.get("session"),
                              "kernel_id": req.get("kernel_id"),
                              "ctype": self.headers.get("Content-Type")})
        elif tool == "fail":
            self.answer(500, {"error": "boom"})
        elif tool == "slow":
            s = (args or {}).get("s", 3)
            time.sleep(s)
            self.answer(200, {"slept": s})
        elif tool == "notjson":
            self.answer(200, b"hello, not json", "text/plain")
        elif tool == "big":
            self.answer(200, {"data": "x" * int((args or {}).get("n", 100000))})
        else:
            self.answer(404, {"error": {"message": "no such tool"}})


ThreadingHTTPServer.daemon_threads = True
srv = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
print("ready", flush=True)
srv.serve_forever()
