#!/usr/bin/python3
# SPDX-License-Identifier: BSD-2-Clause
"""`make bench-wrk`: throughput with a C client (Debian's wrk), which
takes far less CPU than the Python threads of `make bench`'s parallel
test, against a gateway of its own.

Starts, in a temporary prefix, an nginx with the built module: 2 workers,
one zone with max_kernels=256 and max_kernels_per_owner=256, the local
backend, hermes_queue 1024, /v1/execute and, for the floor, nginx's own
`return 200` at /floor.  Starts the kernels of 256 sessions (one cell
each, 8 at a time), then runs wrk with bench/wrk-sessions.lua (a trivial
cell, `1 + 1`, JSON answer, of the next of SESSIONS sessions; anything
but 200 is an error):

    floor         wrk -t1 -c1  -d10s  /floor
    1 session     wrk -t1 -c1  -d10s  (SESSIONS=1)
    64 sessions   wrk -t1 -c1  -d10s  (SESSIONS=64: one cell at a time,
                                       64 kernels taking turns)
    64 sessions   wrk -t2 -c8  -d10s  (SESSIONS=64)
    64 sessions   wrk -t2 -c64 -d10s  (SESSIONS=64)
    256 sessions  wrk -t2 -c64 -d10s --timeout 30s  (SESSIONS=256)

prints a table (cells/s, ratio to one session, non-200 and socket
errors, p50, p99), writes bench/wrk.json, and ends every kernel (DELETE)
and the nginx.  Exit 1 when a run had errors.

    bench/wrk.py [--duration SECONDS] [--module PATH] [--tmpfs] [--hold]

--hold starts the gateway and its kernels, prints its URL, runs nothing
and ends it all on SIGTERM or ^C: two of them (two modules) are for
runs side by side, alternating, of any wrk command (docs/benchmarks.md).

--tmpfs puts the kernels' root on tmpfs (a directory under /dev/shm), as
docs/operations.md advises: a disk filesystem under this churn (every
cell makes and removes files) spends the CPU finding free inodes.
`make bench-wrk WRK_TMPFS=1` passes it.
"""

import argparse
import concurrent.futures
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LUA = os.path.join(TOP, "bench", "wrk-sessions.lua")
SESSIONS = 256

CONF = """load_module {module};
{user}
worker_processes 2;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/tmp;
    hermes_zone kernels:16m max_kernels={n} max_kernels_per_owner={n}
                idle_timeout=30m;
    hermes_backend local root={kroot};
    server {{
        listen 127.0.0.1:{port};
        location = /v1/execute {{ hermes_execute; hermes_queue 1024; }}
        location /v1/kernels {{ hermes_kernels; }}
        location = /floor {{ return 200 "{{}}"; }}
    }}
}}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body and json.dumps(body),
                  headers={"Content-Type": "application/json",
                           "Accept": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def wrk(port, path, sessions, threads, conns, duration, timeout=None):
    cmd = ["wrk", "-t%d" % threads, "-c%d" % conns, "-d%ds" % duration]
    if timeout:
        cmd += ["--timeout", timeout]
    cmd += ["-s", LUA, "http://127.0.0.1:%d%s" % (port, path)]
    out = subprocess.run(cmd, env=dict(os.environ, SESSIONS=str(sessions)),
                         capture_output=True, text=True, timeout=duration + 120,
                         check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    m = re.search(r"requests (\d+), non-200 (\d+), socket errors (\d+), "
                  r"p50 ([\d.]+) ms, p99 ([\d.]+) ms", out)
    return {"command": "SESSIONS=%d %s" % (sessions, " ".join(cmd[:-3] + [
                "-s", "bench/wrk-sessions.lua", "URL"])),
            "sessions": sessions, "connections": conns,
            "per_s": round(rps, 1), "requests": int(m.group(1)),
            "non_200": int(m.group(2)), "socket_errors": int(m.group(3)),
            "p50_ms": float(m.group(4)), "p99_ms": float(m.group(5))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--module", default=os.path.join(TOP, "build",
                                                    "ngx_http_hermes_module.so"))
    ap.add_argument("--out", default=os.path.join(TOP, "bench", "wrk.json"))
    ap.add_argument("--tmpfs", action="store_true",
                    help="the kernels' root under /dev/shm")
    ap.add_argument("--hold", action="store_true",
                    help="print the URL and wait for SIGTERM or ^C")
    a = ap.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("bench/wrk.py: no wrk (apt-get install wrk)")

    prefix = tempfile.mkdtemp(prefix="hermes-wrk.", dir="/tmp")
    os.chmod(prefix, 0o711)     # a root worker's kernels run as another user
    for d in ("logs", "tmp", "kernels"):
        os.mkdir(os.path.join(prefix, d))
    kroot = (tempfile.mkdtemp(prefix="hermes-wrk.", dir="/dev/shm") if a.tmpfs
             else os.path.join(prefix, "kernels"))
    os.chmod(kroot, 0o711)
    port = free_port()
    conf = os.path.join(prefix, "nginx.conf")
    with open(conf, "w") as f:
        f.write(CONF.format(module=a.module, prefix=prefix, kroot=kroot,
                            port=port, n=SESSIONS,
                            user="user root;" if os.geteuid() == 0 else ""))
    ngx = subprocess.Popen(["/usr/sbin/nginx", "-p", prefix, "-c", conf,
                            "-e", os.path.join(prefix, "logs", "error.log"),
                            "-g", "daemon off;"], start_new_session=True)
    runs, failed = [], False
    try:
        for _ in range(100):
            try:
                request(port, "GET", "/floor", timeout=1)
                break
            except OSError:
                time.sleep(0.1)

        # every session's kernel first: wrk measures cells, not spawns
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            started = list(ex.map(lambda i: request(port, "POST", "/v1/execute", {
                "session": "wrk-%d" % i, "code": "1 + 1"})[0], range(SESSIONS)))
        bad = sum(s != 200 for s in started)
        print("bench/wrk.py: %d kernels started in %.1f s%s" % (
            SESSIONS, time.time() - t0, ", %d failed" % bad if bad else ""),
            file=sys.stderr)
        if a.hold:
            print("http://127.0.0.1:%d/v1/execute" % port, flush=True)
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            try:
                signal.pause()
            except KeyboardInterrupt:
                pass
            return

        for what, path, sessions, threads, conns, timeout in (
                ("floor: nginx return 200", "/floor", 1, 1, 1, None),
                ("1 session", "/v1/execute", 1, 1, 1, None),
                ("64 sessions, 1 connection", "/v1/execute", 64, 1, 1, None),
                ("64 sessions, 8 connections", "/v1/execute", 64, 2, 8, None),
                ("64 sessions, 64 connections", "/v1/execute", 64, 2, 64, None),
                ("256 sessions, 64 connections", "/v1/execute", 256, 2, 64, "30s")):
            time.sleep(2)
            r = wrk(port, path, sessions, threads, conns, a.duration, timeout)
            r["what"] = what
            runs.append(r)
            print("bench/wrk.py: %s: %.0f/s" % (what, r["per_s"]), file=sys.stderr)
    finally:
        for i in range(SESSIONS):
            try:
                request(port, "DELETE", "/v1/kernels/wrk-%d" % i, timeout=10)
            except OSError:
                pass
        ngx.send_signal(signal.SIGQUIT)
        try:
            ngx.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(ngx.pid, signal.SIGKILL)
        shutil.rmtree(prefix, ignore_errors=True)
        shutil.rmtree(kroot, ignore_errors=True)

    one = next(r["per_s"] for r in runs if r["what"] == "1 session")
    print("| run | cells/s | x 1 session | non-200 | socket errors | p50 | p99 |")
    print("|---|---|---|---|---|---|---|")
    for r in runs:
        ratio = ("-" if r["what"].startswith("floor")
                 else "%.2fx" % (r["per_s"] / one))
        failed |= bool(r["non_200"] or r["socket_errors"])
        print("| %s | %.0f | %s | %d | %d | %.2f ms | %.2f ms |" % (
            r["what"], r["per_s"], ratio, r["non_200"], r["socket_errors"],
            r["p50_ms"], r["p99_ms"]))
    with open(a.out, "w") as f:
        json.dump({"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "duration_s": a.duration,
                   "kernels_root": "tmpfs" if a.tmpfs else "disk",
                   "runs": runs}, f, indent=1)
        f.write("\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
