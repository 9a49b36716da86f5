#!/usr/bin/python3
# SPDX-License-Identifier: BSD-2-Clause
"""ngx_hermes benchmark: hermes (local and ssh backends) side by side with
jupyter-server.

Run by bench/run.sh, which starts the servers (nginx, an sshd, jupyter);
stdlib only, plus Debian's python3-websocket for the jupyter kernel
websocket. Every loop is bounded in count and in time (a budget per test),
every socket in time; only 127.0.0.1 is contacted.

    /usr/bin/python3 bench/bench.py --hermes URL --jupyter URL
        [--hermes-ssh URL --hermes-ssh-rc URL | --ssh-why TEXT]
        [--hermes-warm URL --warm N | --warm-why TEXT]
        [--hermes-ssh-warm URL | --ssh-warm-why TEXT]
        [--hermes-env-warm URL | --env-warm-why TEXT]
        [--jupyter-stock URL] [--jupyter-par N] [--hermes-status URL]
        [--out results.json]

The jupyter token comes from the environment (JUPYTER_TOKEN).
"""

import argparse
import http.client
import json
import os
import platform
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid

try:
    import websocket  # python3-websocket
except ImportError:  # pragma: no cover
    websocket = None

SOCK_TIMEOUT = 60.0

# What each kind of system runs: counts, and a time budget (seconds) after
# which a sampled loop stops early (keeping at least "min_n" samples), so a
# slow backend bounds the run instead of stretching it.
PROFILES = {
    "local": {"trivial": 300, "trivial_warm": 30, "ndjson": 100, "spawn": 10,
              "first_byte": 30, "big": 10, "bursts": True,
              "par_sessions": 64, "par_rounds": 3, "par_cells": 30,
              "par_warm": 3, "par_single": 200,
              "budget": 20.0, "par_budget": 60.0},
    "ssh": {"trivial": 100, "trivial_warm": 5, "ndjson": 0, "spawn": 10,
            "first_byte": 15, "big": 5, "bursts": True,
            "par_sessions": 64, "par_rounds": 1, "par_cells": 10,
            "par_warm": 1, "par_single": 50,
            "budget": 8.0, "par_budget": 60.0},
    "jupyter": {"trivial": 300, "trivial_warm": 30, "ndjson": 0, "spawn": 10,
                "first_byte": 30, "big": 10, "bursts": True,
                "par_sessions": 0, "par_rounds": 1, "par_cells": 30,
                "par_warm": 3, "par_single": 200,
                "budget": 20.0, "par_budget": 120.0},
    # the warm pool: new sessions only, spaced so the pool can refill
    "warm": {"spawn": 10, "spawn_gap": 0.3, "budget": 15.0},
}
MIN_N = 3
MAX_ERRORS = 5
N_TRIVIAL_STOCK = 60          # stock jupyter: ~44 ms a cell, keep it short

N_TOOL = 300                  # tool calls, timed inside one cell
TRIVIAL = "x = 1"
# the printed value is time.time_ns() in the kernel; the client subtracts
# it from its own time.time_ns() when the first stdout byte arrives
FIRST_BYTE_PLAIN = "import time\nprint(time.time_ns())\ntime.sleep(0.2)"
FIRST_BYTE_FLUSH = "import time\nprint(time.time_ns(), flush=True)\ntime.sleep(0.2)"
BIG = {
    # name: (code, stdout bytes the cell writes)
    "1mb_one_line": ("print('x' * 1000000)", 1000001),
    "1mb_10k_lines": ("for i in range(10000):\n    print('x' * 99)", 1000000),
}
MAX_STREAM = 5 * 1024 * 1024
BURST = {
    "5mib_one_line": ("print('x' * (5 * 1024 * 1024))", MAX_STREAM + 1),
    "5.3mb_53k_lines": ("for i in range(53000):\n    print('x' * 99)", 5300000),
    "5mb_under_cap": ("print('x' * 5000000)", 5000001),
}

def pct(values, q):
    """Percentile q (0..100), linear interpolation between closest ranks."""
    if not values:
        return None
    v = sorted(values)
    if len(v) == 1:
        return v[0]
    k = (len(v) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def ms(seconds):
    return None if seconds is None else round(seconds * 1000.0, 3)


def summary(samples, keep=False):
    """Percentiles of samples (seconds) in ms; keep: the samples too (the
    plot draws them)."""
    r = {
        "n": len(samples),
        "p50_ms": ms(pct(samples, 50)),
        "p90_ms": ms(pct(samples, 90)),
        "p99_ms": ms(pct(samples, 99)),
        "min_ms": ms(min(samples)) if samples else None,
        "max_ms": ms(max(samples)) if samples else None,
    }
    if keep:
        r["samples_ms"] = [ms(v) for v in samples]
    return r


class Budget:
    """A sampled loop's bound: n samples, or fewer once `seconds` have
    passed (at least MIN_N, unless the hard limit of 3 budgets is hit)."""

    def __init__(self, n, seconds):
        self.n, self.seconds = n, seconds
        self.t0 = time.monotonic()
        self.cut = False
        self.errors = []
        self.warm_errors = []

    def failed(self, e, s=None, warm=False):
        """A sample (or with warm, a warm-up cell) that got an error instead
        of an answer: counted, and the loop goes on (a new cell on a hermes
        session spawns a new kernel if its kernel was lost) unless
        MAX_ERRORS were seen, both kinds together; its connection is
        closed (the next request opens another)."""
        msg = f"{type(e).__name__}: {e}"[:300]
        if warm:
            self.warm_errors.append(msg)
        else:
            self.errors.append(msg)
        if s is not None and hasattr(s, "conn"):
            s.conn.close()
        n = len(self.errors) + len(self.warm_errors)
        if n >= MAX_ERRORS or not isinstance(e, SAMPLE_ERRORS):
            raise BenchError(f"{n} errors, the last: {msg}")

    def more(self, done):
        done += len(self.errors)
        if done >= self.n:
            return False
        spent = time.monotonic() - self.t0
        if spent > self.seconds * 3 or (spent > self.seconds and done >= MIN_N):
            self.cut = True
            return False
        return True

    def warm(self, sysm, s, code, n=1):
        """n untimed cells before the samples (the first one spawns a
        hermes kernel): an error is counted and the cell tried again."""
        done = 0
        while done < n:
            try:
                sysm.cell(s, code)
                done += 1
            except Exception as e:   # noqa: BLE001
                self.failed(e, s, warm=True)
        self.t0 = time.monotonic()      # the samples' own budget

    def note(self, r):
        r["of_n"] = self.n
        if self.errors:
            r["errors"] = len(self.errors)
            r["first_errors"] = self.errors[:3]
        if self.warm_errors:
            # the untimed cells before the samples (a spawn among them)
            r["warmup_errors"] = len(self.warm_errors)
            r["first_warmup_errors"] = self.warm_errors[:3]
        if self.cut:
            r["budget_cut"] = f"stopped after {self.seconds:g} s budget"
        return r


class BenchError(Exception):
    pass


# what a sample may fail with and the test go on: an error answer, a
# timeout, a connection the server closed
SAMPLE_ERRORS = (BenchError, OSError, http.client.HTTPException, ValueError)


# --- CPU accounting (diagnostics: who burnt the CPU during a phase) ---------

TCK = os.sysconf("SC_CLK_TCK")
NGINX_MASTER = None   # set from --hermes-pid
# After sessions end, their sandboxes' teardown slows every process on
# the machine for seconds after its CPU is quiet again (see
# docs/benchmarks.md, "What each line measures"): the next column, and
# the next round after a 64-session run, wait this long after them.
REST = float(os.environ.get("BENCH_REST") or 10)
_rest_until = 0.0


def rest_from_now():
    """The next column (or round) rests REST seconds from now."""
    global _rest_until
    _rest_until = time.monotonic() + REST


def cpu_total():
    """(busy, all) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)


def rest(why):
    """Sleep out what is left of the rest after the last sessions ended."""
    left = _rest_until - time.monotonic()
    if left > 0:
        log(f"  {left:.1f}s of rest before {why}: the last sessions' teardown")
        time.sleep(left)


def settle(why, quiet=0.10, most=30.0):
    """Wait until the machine is quiet (CPU busy under `quiet` in two
    windows of 0.25 s in a row), at most `most` seconds: what one system
    left running (a warm pool refilling, kernels being killed) must not
    weigh on the next one's measures.  The seconds waited."""
    t0 = time.perf_counter()
    rest(why)
    calm = 0
    while calm < 2 and time.perf_counter() - t0 < most:
        b0, a0 = cpu_total()
        time.sleep(0.25)
        b1, a1 = cpu_total()
        calm = calm + 1 if (b1 - b0) <= quiet * max(a1 - a0, 1) else 0
    waited = time.perf_counter() - t0
    log(f"  quiet before {why} after {waited:.1f}s")
    return round(waited, 2)


def cpu_of_children(ppid):
    """CPU seconds of the live children of ppid (nginx workers)."""
    t = 0
    if not ppid:
        return 0.0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(st[1]) == ppid:
            t += int(st[11]) + int(st[12])
    return t / TCK


def busy_fraction(seconds=1.0):
    b0, a0 = cpu_total()
    time.sleep(seconds)
    b1, a1 = cpu_total()
    return round((b1 - b0) / max(a1 - a0, 1), 3)


# --- hermes ------------------------------------------------------------------

class HermesSession:
    """One session on one persistent HTTP/1.1 keep-alive connection."""

    def __init__(self, url, name):
        u = urllib.parse.urlsplit(url)
        self.host, self.port, self.path = u.hostname, u.port, u.path
        self.name = name
        self.conn = http.client.HTTPConnection(self.host, self.port,
                                               timeout=SOCK_TIMEOUT)

    def _post(self, code, accept):
        body = json.dumps({"session": self.name, "code": code}).encode()
        self.conn.request("POST", self.path, body=body, headers={
            "Content-Type": "application/json", "Accept": accept})
        return self.conn.getresponse()

    def run(self, code):
        """Accept: application/json; returns the result object."""
        r = self._post(code, "application/json")
        data = r.read()
        if r.status != 200:
            raise BenchError(f"hermes {r.status}: {data[:300]!r}")
        return json.loads(data)

    def stream(self, code, on_stdout=None):
        """NDJSON answer read incrementally. Returns a dict: result,
        stdout_bytes, stderr_bytes, truncated_event, kernel event."""
        r = self._post(code, "application/x-ndjson")
        if r.status != 200:
            raise BenchError(f"hermes {r.status}: {r.read()[:300]!r}")
        out = {"result": None, "stdout_bytes": 0, "stderr_bytes": 0,
               "truncated_event": None, "kernel": None, "events": 0}
        buf = bytearray()
        start = 0
        while True:
            data = r.read1(1 << 18)
            if not data:
                break
            buf += data
            while True:
                nl = buf.find(b"\n", start)
                if nl < 0:
                    break
                line = bytes(buf[start:nl])
                start = nl + 1
                if not line.strip():
                    continue
                ev = json.loads(line)
                out["events"] += 1
                t = ev.get("type")
                if t == "stdout":
                    if on_stdout is not None:
                        on_stdout(ev["text"])
                    out["stdout_bytes"] += len(ev["text"].encode())
                elif t == "stderr":
                    out["stderr_bytes"] += len(ev["text"].encode())
                elif t == "stream_truncated":
                    out["truncated_event"] = ev
                elif t == "kernel":
                    out["kernel"] = ev
                elif t == "result":
                    out["result"] = ev
            if start > (1 << 20):
                del buf[:start]
                start = 0
        if out["result"] is None:
            raise BenchError("hermes stream ended without a result line")
        return out

    def close(self):
        self.conn.close()


# --- jupyter -------------------------------------------------------------------

class JupyterSession:
    """One kernel (POST /api/kernels) and its websocket."""

    def __init__(self, base, token):
        self.base = base.rstrip("/")
        u = urllib.parse.urlsplit(self.base)
        self.host, self.port = u.hostname, u.port
        self.token = token
        self.kernel_id = None
        self.ws = None
        self.session = uuid.uuid4().hex

    def _rest(self, method, path, body=None):
        c = http.client.HTTPConnection(self.host, self.port, timeout=SOCK_TIMEOUT)
        try:
            hdr = {"Authorization": f"token {self.token}"}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                hdr["Content-Type"] = "application/json"
            c.request(method, path, body=data, headers=hdr)
            r = c.getresponse()
            payload = r.read()
            if r.status >= 300:
                raise BenchError(f"jupyter {method} {path}: {r.status} {payload[:200]!r}")
            return json.loads(payload) if payload else None
        finally:
            c.close()

    def start(self):
        t0 = time.perf_counter()
        k = self._rest("POST", "/api/kernels", {"name": "python3"})
        self.create_s = time.perf_counter() - t0
        self.kernel_id = k["id"]
        url = (f"ws://{self.host}:{self.port}/api/kernels/{self.kernel_id}"
               f"/channels?session_id={self.session}")
        self.ws = websocket.create_connection(
            url, timeout=SOCK_TIMEOUT,
            header=[f"Authorization: token {self.token}"])
        return self

    def execute(self, code, on_stdout=None):
        """execute_request, then wait for its execute_reply and its idle
        status. Returns status, stdout_bytes, rate-limit notice."""
        msg_id = uuid.uuid4().hex
        msg = {
            "header": {"msg_id": msg_id, "username": "bench",
                       "session": self.session, "msg_type": "execute_request",
                       "version": "5.3",
                       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "parent_header": {}, "metadata": {},
            "content": {"code": code, "silent": False, "store_history": True,
                        "user_expressions": {}, "allow_stdin": False,
                        "stop_on_error": True},
            "channel": "shell", "buffers": [],
        }
        self.ws.send(json.dumps(msg))
        out = {"status": None, "stdout_bytes": 0, "stderr_bytes": 0,
               "rate_limited": False}
        got_reply = got_idle = False
        deadline = time.monotonic() + SOCK_TIMEOUT
        while not (got_reply and got_idle):
            if time.monotonic() > deadline:
                raise BenchError("jupyter: no execute_reply/idle in time")
            m = json.loads(self.ws.recv())
            if m.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            t = m.get("msg_type") or m["header"]["msg_type"]
            if t == "execute_reply":
                got_reply = True
                out["status"] = m["content"].get("status")
            elif t == "status":
                if m["content"].get("execution_state") == "idle":
                    got_idle = True
            elif t == "stream":
                text = m["content"].get("text", "")
                if m["content"].get("name") == "stdout":
                    if on_stdout is not None:
                        on_stdout(text)
                    out["stdout_bytes"] += len(text.encode())
                else:
                    if "rate exceeded" in text:
                        out["rate_limited"] = True
                    else:
                        out["stderr_bytes"] += len(text.encode())
        return out

    def close(self):
        try:
            if self.ws is not None:
                self.ws.close()
        except Exception:
            pass
        if self.kernel_id is not None:
            try:
                self._rest("DELETE", f"/api/kernels/{self.kernel_id}")
            except Exception:
                pass
            self.kernel_id = None


# --- a uniform face for the tests ------------------------------------------------

class HermesSystem:
    def __init__(self, url, name="hermes-local", kind="local"):
        self.url, self.name, self.kind = url, name, kind
        self.run_id = uuid.uuid4().hex[:8]

    def open(self, tag):
        return HermesSession(self.url, f"bench-{self.run_id}-{tag}")

    def cell(self, s, code):
        """Non-streaming round trip to the final result."""
        res = s.run(code)
        if res.get("status") != "success":
            raise BenchError(f"hermes cell failed: {json.dumps(res)[:300]}")
        return res

    def stream(self, s, code, on_stdout=None):
        o = s.stream(code, on_stdout)
        res = o["result"]
        return {"status": res.get("status"), "stdout_bytes": o["stdout_bytes"],
                "cut_reported": bool(o["truncated_event"]) or bool(res.get("stream_truncated")),
                "truncated_event": o["truncated_event"] is not None,
                "result_stream_truncated": res.get("stream_truncated"),
                "result_stdout_bytes_total": res.get("stdout_bytes_total"),
                "kernel": o["kernel"]}

    def end(self, s):
        try:
            s.run("raise SystemExit")
        except Exception:
            pass
        s.close()


class JupyterSystem:
    kind = "jupyter"

    def __init__(self, base, token, name):
        self.base, self.token, self.name = base, token, name

    def open(self, tag):
        return JupyterSession(self.base, self.token).start()

    def cell(self, s, code):
        o = s.execute(code)
        if o["status"] != "ok":
            raise BenchError(f"jupyter cell failed: {o}")
        return o

    def stream(self, s, code, on_stdout=None):
        o = s.execute(code, on_stdout)
        return {"status": o["status"], "stdout_bytes": o["stdout_bytes"],
                "cut_reported": o["rate_limited"], "rate_limited": o["rate_limited"]}

    def end(self, s):
        s.close()

# --- the tests -----------------------------------------------------------------

def t_floor(url, n, budget=30.0):
    """The floor a cell cannot beat here: the same client's keep-alive POST
    round trip, with a trivial cell's body, to a plain nginx location that
    answers 200 at once (return 200)."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=SOCK_TIMEOUT)
    body = json.dumps({"session": "floor", "code": TRIVIAL}).encode()
    lat = []
    t_end = time.perf_counter() + budget
    try:
        for i in range(n + 30):
            t0 = time.perf_counter()
            conn.request("POST", u.path, body=body, headers={
                "Content-Type": "application/json", "Accept": "application/json"})
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                raise BenchError(f"floor {r.status}")
            if i >= 30:           # the first ones warm the connection up
                lat.append(time.perf_counter() - t0)
            if time.perf_counter() > t_end:
                break
    finally:
        conn.close()
    return summary(lat, keep=True)


def t_runner_floor(n, python="/usr/bin/python3"):
    """The second floor: the runner's own cost of the trivial cell, measured
    inside it (src/remote/kernel_runner.py --self-time N TRIVIAL: the
    request parsed, the cell compiled and run, its result made; no files,
    no wake-up, no other process), in the python kernels run in."""
    runner = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                          "src", "remote", "kernel_runner.py")
    out = subprocess.run([python, "-I", runner, "--self-time", str(n), TRIVIAL],
                         capture_output=True, text=True, timeout=120, check=True)
    r = json.loads(out.stdout)
    return {"n": r["n"], "p50_ms": r["p50_ms"], "p90_ms": r["p90_ms"]}


# The hand-over's floor: a byte there and back over two pipes between two
# python processes (each blocked in a read), the least a cell's trip from
# the nginx worker to the kernel's process and back can cost here.
PING = """
import os, sys
r, w = int(sys.argv[1]), int(sys.argv[2])
while os.read(r, 1):
    os.write(w, b"x")
"""


def t_pipe_floor(n, python="/usr/bin/python3"):
    """The third floor: a pipe round trip to another python process."""
    to_r, to_w = os.pipe()
    back_r, back_w = os.pipe()
    p = subprocess.Popen([python, "-I", "-c", PING, str(to_r), str(back_w)],
                         pass_fds=(to_r, back_w))
    os.close(to_r)
    os.close(back_w)
    lat = []
    try:
        for i in range(n + 200):
            t0 = time.perf_counter()
            os.write(to_w, b"x")
            if os.read(back_r, 1) != b"x":
                raise BenchError("pipe floor: the other process is gone")
            if i >= 200:          # the first ones warm both up
                lat.append(time.perf_counter() - t0)
    finally:
        os.close(to_w)
        os.close(back_r)
        p.wait(timeout=10)
    return summary(lat)


def t_trivial(sysm, n, warm, budget=60.0, s=None):
    own = s is None
    if own:
        s = sysm.open("rt")
    try:
        b = Budget(n, budget)
        b.warm(sysm, s, TRIVIAL, warm)
        lat = []
        t_all = time.perf_counter()
        while b.more(len(lat)):
            t0 = time.perf_counter()
            try:
                sysm.cell(s, TRIVIAL)
            except Exception as e:   # noqa: BLE001
                b.failed(e, s)
                continue
            lat.append(time.perf_counter() - t0)
        wall = time.perf_counter() - t_all
    finally:
        if own:
            sysm.end(s)
    r = b.note(summary(lat, keep=True))
    r["cells_per_s"] = round(len(lat) / wall, 1)
    return r


def t_trivial_cpu(sysm, n, warm, budget=60.0, s=None):
    """t_trivial plus where the CPU went (hermes: nginx workers' CPU)."""
    m0, n0, c0 = cpu_total(), cpu_of_children(NGINX_MASTER), os.times()
    r = t_trivial(sysm, n, warm, budget, s)
    m1, n1, c1 = cpu_total(), cpu_of_children(NGINX_MASTER), os.times()
    cells = r["n"] + warm + r.get("errors", 0)
    r["machine_busy"] = round((m1[0] - m0[0]) / max(m1[1] - m0[1], 1), 3)
    r["client_cpu_ms_per_cell"] = round(1000 * (c1.user + c1.system - c0.user - c0.system)
                                        / cells, 3)
    if NGINX_MASTER and isinstance(sysm, HermesSystem):
        r["nginx_cpu_ms_per_cell"] = round(1000 * (n1 - n0) / cells, 3)
    return r


def t_trivial_stream(sysm, n, warm, budget, s):
    b = Budget(n, budget)
    b.warm(sysm, s, TRIVIAL, warm)
    lat = []
    while b.more(len(lat)):
        t0 = time.perf_counter()
        try:
            o = sysm.stream(s, TRIVIAL)
            if o["status"] != "success":
                raise BenchError(f"stream cell: {o}")
        except Exception as e:   # noqa: BLE001
            b.failed(e, s)
            continue
        lat.append(time.perf_counter() - t0)
    return b.note(summary(lat))


def t_tool_call(sysm, n):
    """A tool call's round trip as the code sees it: hermes_tools.echo()
    timed in the kernel (req file, the module's checks, a subrequest
    through a proxy hop to a JSON endpoint, res file, inotify wake-up)."""
    s = sysm.open("tool")
    code = ("import json, time\nts = []\nfor i in range(%d):\n"
            "    t0 = time.perf_counter()\n    hermes_tools.echo(i=i)\n"
            "    ts.append(time.perf_counter() - t0)\n"
            "print(json.dumps(ts[10:]))" % (n + 10))
    try:
        res = sysm.cell(s, code)
    finally:
        sysm.end(s)
    if res.get("tool_calls_made") != n + 10:
        raise BenchError(f"tool calls made: {res.get('tool_calls_made')}")
    return summary(json.loads(res["output"]))


def t_spawn(sysm, n, budget, gap=0.0):
    """A new session's first cell, from the request (jupyter: POST
    /api/kernels, then the websocket) to its result; the session ended
    (untimed) before the next. gap: an untimed pause before each."""
    lat, reused, create, warm_hits = [], 0, [], 0
    b = Budget(n, budget)
    i = 0
    while b.more(len(lat)):
        if gap:
            time.sleep(gap)
        t0 = time.perf_counter()
        s = None
        ok = False
        i += 1
        try:
            s = sysm.open(f"spawn{i}")
            res = sysm.cell(s, TRIVIAL)
            lat.append(time.perf_counter() - t0)
            if hasattr(s, "create_s"):
                create.append(s.create_s)
            if isinstance(sysm, HermesSystem):
                k = res.get("kernel", {})
                reused += bool(k.get("reused"))
                warm_hits += bool(k.get("warm"))
            ok = True
        except Exception as e:   # noqa: BLE001
            ok = False
            b.failed(e)
        finally:
            if s is not None:
                # a session whose spawn failed has no kernel to end (a
                # cell to end it would spawn one)
                if ok:
                    sysm.end(s)
                else:
                    s.close()
    r = b.note(summary(lat, keep=True))
    if isinstance(sysm, HermesSystem):
        r["reused_kernels"] = reused   # must be 0: every one a new kernel
        r["kernel_says_warm"] = warm_hits
    if create:
        # jupyter: POST /api/kernels alone, before the websocket and the cell
        r["create_p50_ms"] = ms(pct(create, 50))
    return r


def t_first_byte(sysm, n, code, budget, s):
    lat, missing = [], 0
    b = Budget(n, budget)
    b.warm(sysm, s, "import time")
    tries = 0
    while b.more(tries - len(b.errors)):
        tries += 1
        first = []

        def on_stdout(text):
            if not first:
                first.append((time.time_ns(), text))
        try:
            sysm.stream(s, code, on_stdout)
        except Exception as e:   # noqa: BLE001
            b.failed(e, s)
            continue
        if not first:
            missing += 1
            continue
        t_recv, text = first[0]
        lat.append((t_recv - int(text.split()[0])) / 1e9)
    r = b.note(summary(lat, keep=True))
    r["missing"] = missing
    return r


def t_big(sysm, n, code, expect, budget, s):
    lat, complete, got = [], 0, []
    b = Budget(n, budget)
    b.warm(sysm, s, code)         # also pages in the string ops
    while b.more(len(lat)):
        t0 = time.perf_counter()
        try:
            o = sysm.stream(s, code)
        except Exception as e:   # noqa: BLE001
            b.failed(e, s)
            continue
        lat.append(time.perf_counter() - t0)
        got.append(o["stdout_bytes"])
        if o["stdout_bytes"] == expect and not o.get("cut_reported"):
            complete += 1
    r = b.note(summary(lat))
    r.update({"expected_bytes": expect, "complete": complete,
              "received_bytes_min": min(got, default=None),
              "received_bytes_max": max(got, default=None)})
    return r


def t_burst(sysm, code, written, s):
    b = Budget(1, 0)
    b.warm(sysm, s, "x = 1")
    t0 = time.perf_counter()
    o = sysm.stream(s, code)
    dt = time.perf_counter() - t0
    # the kernel must still be usable afterwards
    after = sysm.stream(s, "print('after')")
    r = {"written_bytes": written, "received_bytes": o["stdout_bytes"],
         "lost_bytes": written - o["stdout_bytes"],
         "cut_reported": o["cut_reported"], "ms": ms(dt),
         "kernel_ok_after": after["stdout_bytes"] == len("after\n")}
    b.note(r)
    if isinstance(sysm, HermesSystem):
        expect = min(written, MAX_STREAM)
        r["expected_received"] = expect
        r["exact"] = (o["stdout_bytes"] == expect
                      and (written <= MAX_STREAM) != bool(o["cut_reported"]))
        r["truncated_event"] = o["truncated_event"]
        r["result_stream_truncated"] = o["result_stream_truncated"]
        r["result_stdout_bytes_total"] = o["result_stdout_bytes_total"]
    else:
        r["rate_limit_notice"] = o["rate_limited"]
    return r


def t_parallel(sysm, sessions, cells, warm, single_cells_per_s, budget):
    """sessions threads, each its own session and connection: warm-up cells
    (the spawn), then all released together for `cells` trivial cells each.
    Bounded: the warm-up and the timed phase each get `budget` seconds;
    cells not sent by then count as unanswered."""
    errors, lat = [], []
    lock = threading.Lock()
    cond = threading.Condition(lock)
    go = threading.Event()
    state = {"warmed": 0, "finished": 0, "answered": 0}
    deadline = [None]

    def worker(i):
        s = None
        s_ok = False
        mine = []
        try:
            s = sysm.open(f"par{i}")
            for _ in range(warm):
                sysm.cell(s, TRIVIAL)
        except Exception as e:   # noqa: BLE001
            with lock:
                errors.append(f"warm {i}: {e}")
            s_ok = False
        else:
            s_ok = True
        with cond:
            state["warmed"] += 1
            cond.notify_all()
        go.wait(budget * 2)
        try:
            if s_ok and go.is_set():
                for _ in range(cells):
                    if time.monotonic() > deadline[0]:
                        break
                    t0 = time.perf_counter()
                    try:
                        sysm.cell(s, TRIVIAL)
                        mine.append(time.perf_counter() - t0)
                    except Exception as e:   # noqa: BLE001
                        with lock:
                            errors.append(f"cell {i}: {e}")
                        break
        finally:
            with cond:
                lat.extend(mine)
                state["answered"] += len(mine)
                state["finished"] += 1
                state["t_last"] = time.perf_counter()
                cond.notify_all()
            if s is not None:
                try:
                    if s_ok:
                        sysm.end(s)
                    else:
                        s.close()   # no kernel to end: a cell would spawn one
                except Exception:
                    pass

    threads = [threading.Thread(target=worker, args=(i,), daemon=True)
               for i in range(sessions)]
    t_warm = time.perf_counter()
    for t in threads:
        t.start()
    with cond:
        cond.wait_for(lambda: state["warmed"] == sessions, timeout=budget)
        warmed = state["warmed"]
    warm_s = time.perf_counter() - t_warm
    m0, n0, c0 = cpu_total(), cpu_of_children(NGINX_MASTER), os.times()
    deadline[0] = time.monotonic() + budget
    t0 = time.perf_counter()
    go.set()
    with cond:
        cond.wait_for(lambda: state["finished"] == sessions, timeout=budget + 5)
        finished = state["finished"]
        answered = state["answered"]
        t_end = state.get("t_last", time.perf_counter()) if finished == sessions \
            else time.perf_counter()
    wall = t_end - t0
    m1, n1, c1 = cpu_total(), cpu_of_children(NGINX_MASTER), os.times()
    for t in threads:
        t.join(timeout=max(5.0, budget / 4))
    total = sessions * cells
    agg = answered / wall if wall > 0 else 0.0
    r = summary(lat)
    r.update({"sessions": sessions, "cells_each": cells, "requests": total,
              "answered": answered,
              "answered_of": f"{answered}/{total}", "errors": errors[:10],
              "error_count": len(errors), "wall_s": round(wall, 3),
              "warmup_s": round(warm_s, 3),
              "warmed_in_budget": f"{warmed}/{sessions}",
              "aggregate_cells_per_s": round(agg, 1),
              "single_cells_per_s": single_cells_per_s,
              "ratio": round(agg / single_cells_per_s, 2) if single_cells_per_s else None,
              # diagnostics for the timed phase
              "machine_busy": round((m1[0] - m0[0]) / max(m1[1] - m0[1], 1), 3),
              "client_cpu_ms_per_cell": round(1000 * (c1.user + c1.system - c0.user - c0.system)
                                              / max(answered, 1), 3)})
    if NGINX_MASTER and isinstance(sysm, HermesSystem):
        r["nginx_cpu_ms_per_cell"] = round(1000 * (n1 - n0) / max(answered, 1), 3)
    return r


def t_parallel_rounds(sysm, prof):
    """par_rounds rounds, each: one session's cells/s measured right before,
    then the parallel run. The round with the median ratio is the result;
    all rounds are kept."""
    rounds = []
    for _ in range(prof["par_rounds"]):
        rest("one session's cells/s")
        single = t_trivial_cpu(sysm, prof["par_single"], min(10, prof["trivial_warm"]),
                               prof["budget"])
        try:
            p = t_parallel(sysm, prof["par_sessions"], prof["par_cells"],
                           prof["par_warm"], single["cells_per_s"], prof["par_budget"])
        finally:
            rest_from_now()
        p["single_nginx_cpu_ms_per_cell"] = single.get("nginx_cpu_ms_per_cell")
        rounds.append(p)
    ok = [p for p in rounds if p.get("ratio") is not None]
    ok.sort(key=lambda p: p["ratio"])
    best = dict(ok[len(ok) // 2] if ok else rounds[-1])
    best["rounds"] = [{k: p.get(k) for k in
                       ("aggregate_cells_per_s", "single_cells_per_s", "ratio",
                        "answered", "error_count", "p50_ms", "p99_ms",
                        "machine_busy", "nginx_cpu_ms_per_cell",
                        "single_nginx_cpu_ms_per_cell", "client_cpu_ms_per_cell")}
                      for p in rounds]
    best["answered_all_rounds"] = f"{sum(p['answered'] for p in rounds)}/{sum(p['requests'] for p in rounds)}"
    best["all_answered"] = all(p["answered"] == p["requests"] for p in rounds)
    best["error_count_all_rounds"] = sum(p["error_count"] for p in rounds)
    best["ratios"] = [p.get("ratio") for p in rounds]
    best["errors"] = [e for p in rounds for e in p["errors"]][:20]
    return best


# --- driver ----------------------------------------------------------------------

def machine():
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass

    def out(argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except Exception:
            return ""

    def deb(p):
        return out(["dpkg-query", "-W", "-f=${Version}", p])
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commit = out(["git", "-C", top, "rev-parse", "--short", "HEAD"])
    if commit and out(["git", "-C", top, "status", "--porcelain", "--", "src",
                       "ngx_hermes_module.c", "config"]):
        commit += " (+ uncommitted changes in src/)"
    return {"nproc": os.cpu_count(), "cpu_model": model,
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
            "busy_before_start": None, "commit": commit,
            "kernel": platform.release(), "python": platform.python_version(),
            "nginx": deb("nginx"), "openssh": deb("openssh-server"),
            "libssh": deb("libssh-4"),
            "jupyter_server": deb("python3-jupyter-server"),
            "ipykernel": deb("python3-ipykernel")}


def gateway_build(url):
    """What the measured gateway runs, from its status location: module,
    version and commit (the tree's commit above may differ from the .so
    that nginx loaded)."""
    if not url:
        return {"error": "no status location"}
    u = urllib.parse.urlsplit(url)
    try:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        conn.request("GET", u.path + "?format=json")
        r = conn.getresponse()
        data = r.read()
        conn.close()
        if r.status != 200:
            return {"error": f"status {r.status}"}
        j = json.loads(data)
        return {k: j.get(k) for k in ("module", "version", "commit")}
    except (OSError, ValueError, http.client.HTTPException) as e:
        return {"error": f"{type(e).__name__}: {e}"}


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def guarded(results, key, fn, *a):
    t0 = time.perf_counter()
    try:
        results[key] = fn(*a)
    except Exception as e:   # noqa: BLE001
        results[key] = {"error": f"{type(e).__name__}: {e}"}
    log(f"  {key}: {time.perf_counter() - t0:.1f}s")


def run_system(sysm, par_sessions=None):
    prof = PROFILES[sysm.kind]
    bud = prof["budget"]
    r = {"profile": dict(prof), "settle_s": settle(sysm.name)}
    t_sys = time.perf_counter()
    log(f"{sysm.name}: trivial round trip")
    guarded(r, "trivial", t_trivial_cpu, sysm, prof["trivial"], prof["trivial_warm"], bud)
    log(f"{sysm.name}: new sessions")
    guarded(r, "spawn", t_spawn, sysm, prof["spawn"], bud)
    # one session for the streaming tests (a spawn costs seconds on a
    # slow host); the bursts last, they are the ones that may hurt it
    s = None
    try:
        s = sysm.open("main")
    except Exception as e:   # noqa: BLE001
        r["session"] = {"error": f"{type(e).__name__}: {e}"}
    if s is not None:
        try:
            if prof["ndjson"]:
                guarded(r, "trivial_ndjson", t_trivial_stream, sysm, prof["ndjson"], 10,
                        bud, s)
            if sysm.name in ("hermes-local", "hermes-ssh"):
                log(f"{sysm.name}: tool call round trip")
                guarded(r, "tool_call", t_tool_call, sysm, N_TOOL)
            log(f"{sysm.name}: first output byte")
            guarded(r, "first_byte_print", t_first_byte, sysm, prof["first_byte"],
                    FIRST_BYTE_PLAIN, bud, s)
            guarded(r, "first_byte_flush", t_first_byte, sysm, prof["first_byte"],
                    FIRST_BYTE_FLUSH, bud, s)
            log(f"{sysm.name}: big output")
            for k, (code, expect) in BIG.items():
                guarded(r, k, t_big, sysm, prof["big"], code, expect, bud, s)
            if prof["bursts"]:
                for k, (code, written) in BURST.items():
                    guarded(r, "burst_" + k, t_burst, sysm, code, written, s)
        finally:
            try:
                sysm.end(s)
            except Exception:
                pass
    if par_sessions is None:
        par_sessions = prof["par_sessions"]
    if par_sessions:
        p = dict(prof, par_sessions=par_sessions)
        log(f"{sysm.name}: {par_sessions} sessions in parallel, {p['par_rounds']} round(s)")
        guarded(r, "parallel", t_parallel_rounds, sysm, p)
    r["seconds"] = round(time.perf_counter() - t_sys, 1)
    rest_from_now()
    return r


def rc_runs(path):
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0
    except OSError:
        return None


def run_warm(sysm, warm):
    prof = PROFILES["warm"]
    r = {"warm": warm}
    time.sleep(1.0)               # the pool fills after the start
    r["settle_s"] = settle(sysm.name)
    log(f"{sysm.name}: new sessions from a pool of {warm}")
    guarded(r, "spawn", t_spawn, sysm, prof["spawn"], prof["budget"], prof["spawn_gap"])
    rest_from_now()
    return r


def fmt(v, unit=""):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.2f}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return f"{v}{unit}"


def floors(sy):
    """The floors added (ms): nginx's return 200, the runner's own cost of
    the cell, a pipe round trip; None where one is missing."""
    parts = [get(sy.get(name, {}), "trivial", "p50_ms")
             for name in ("floor", "runner-floor", "pipe-floor")]
    if not all(isinstance(v, (int, float)) for v in parts):
        return None
    return sum(parts)


COLUMNS = [("floor", "floor: nginx return 200"), ("runner-floor", "floor: runner's own"),
           ("pipe-floor", "floor: pipe round trip"),
           ("hermes-local", "local"), ("hermes-local-tmpfs", "local tmpfs"),
           ("hermes-local-warm", "local warm pool"),
           ("hermes-local-env-warm", "trixie env warm pool"),
           ("hermes-ssh", "ssh dedicated"), ("hermes-ssh-rc", "ssh slow rc"),
           ("hermes-ssh-warm", "ssh warm pool"),
           ("jupyter-nodelay", "jupyter+nodelay"), ("jupyter-stock", "jupyter stock")]


def get(d, *path):
    for p in path:
        if not isinstance(d, dict):
            return None
        if "error" in d and p not in d:
            return "ERR"
        d = d.get(p)
    return d


def render(head, rows):
    n = len(head)
    w = [max(len(str(r[i])) for r in rows + [head]) for i in range(n)]
    lines = ["  ".join(str(c).ljust(w[i]) for i, c in enumerate(head)).rstrip(),
             "  ".join("-" * w[i] for i in range(n))]
    for r in rows:
        lines.append("  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)).rstrip())
    return "\n".join(lines)


def error_count(system):
    """Failed samples of one system, all tests: a test's "errors" count,
    the parallel rounds' errors, 1 for a test that failed as a whole."""
    n = 0
    for v in system.values():
        if not isinstance(v, dict):
            continue
        if "error" in v:
            n += 1
        elif "error_count_all_rounds" in v:
            n += v["error_count_all_rounds"]
        else:
            n += v.get("errors") or 0
            n += v.get("warmup_errors") or 0
    return n


def table(res):
    cols = [(k, label) for k, label in COLUMNS if k in res["systems"]]
    data = [res["systems"][k] for k, _ in cols]
    rows = []

    def row(label, key):
        vals = tuple(fmt(get(d, *key)) for d in data)
        if all(v == "-" for v in vals):
            return
        rows.append((label,) + vals)

    row("trivial cell p50 ms", ("trivial", "p50_ms"))
    row("trivial cell p90 ms", ("trivial", "p90_ms"))
    row("trivial cell p99 ms", ("trivial", "p99_ms"))
    row("trivial cells (of n)", ("trivial", "n"))
    row("trivial cells/s, 1 session", ("trivial", "cells_per_s"))
    row("trivial, NDJSON answer p50 ms", ("trivial_ndjson", "p50_ms"))
    row("tool call round trip p50 ms", ("tool_call", "p50_ms"))
    row("new session (spawn + 1st cell) p50 ms", ("spawn", "p50_ms"))
    row("new session p90 ms", ("spawn", "p90_ms"))
    row("new session max ms", ("spawn", "max_ms"))
    row("new sessions (of n)", ("spawn", "n"))
    row("jupyter POST /api/kernels p50 ms", ("spawn", "create_p50_ms"))
    row("first stdout byte p50 ms (print)", ("first_byte_print", "p50_ms"))
    row("first stdout byte p90 ms (print)", ("first_byte_print", "p90_ms"))
    row("first stdout byte p50 ms (flush=True)", ("first_byte_flush", "p50_ms"))
    row("first stdout byte p90 ms (flush=True)", ("first_byte_flush", "p90_ms"))
    for k in BIG:
        row(f"{k} p50 ms", (k, "p50_ms"))
        row(f"{k} p90 ms", (k, "p90_ms"))
        row(f"{k} whole (runs)", (k, "complete"))
        row(f"{k} runs", (k, "n"))
    for k in BURST:
        row(f"burst {k}: written", ("burst_" + k, "written_bytes"))
        row(f"burst {k}: received", ("burst_" + k, "received_bytes"))
        row(f"burst {k}: cut reported", ("burst_" + k, "cut_reported"))
        row(f"burst {k}: ms", ("burst_" + k, "ms"))
    row("parallel: sessions", ("parallel", "sessions"))
    row("parallel: warmed up in budget", ("parallel", "warmed_in_budget"))
    row("parallel: warm-up (spawns) s", ("parallel", "warmup_s"))
    row("parallel: answered / sent, all rounds", ("parallel", "answered_all_rounds"))
    row("parallel: errors, all rounds", ("parallel", "error_count_all_rounds"))
    row("parallel: ratio of each round", ("parallel", "ratios"))
    row("median round: 1-session cells/s", ("parallel", "single_cells_per_s"))
    row("median round: aggregate cells/s", ("parallel", "aggregate_cells_per_s"))
    row("median round: ratio to 1 session", ("parallel", "ratio"))
    row("parallel: cell p50 ms", ("parallel", "p50_ms"))
    row("parallel: cell p99 ms", ("parallel", "p99_ms"))
    row("parallel: machine CPU busy", ("parallel", "machine_busy"))
    row("parallel: nginx CPU ms/cell", ("parallel", "nginx_cpu_ms_per_cell"))
    row("1 session: nginx CPU ms/cell", ("parallel", "single_nginx_cpu_ms_per_cell"))
    rows.append(("errors (samples that failed)",) + tuple(
        fmt(error_count(d)) for d in data))
    row("shell rc runs (slow-rc user)", ("rc_runs",))
    row("seconds this column took", ("seconds",))
    row("seconds waited for a quiet machine first", ("settle_s",))
    return render(("measure",) + tuple(label for _, label in cols), rows)


def targets(res):
    """The targets, relative to jupyter-server (TCP_NODELAY) of the same run
    or absolute: (target, measured, jupyter, ratio, verdict) rows, the
    verdict PASS, MISS or n/a."""
    sy = res["systems"]
    jup = sy.get("jupyter-nodelay", {})
    notes = res.get("notes", {})
    out = []

    def num(v):
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    def ratio_row(label, name, key, limit):
        if name not in sy:
            why = notes.get(name, "not run")
            out.append((label, why, "-", "-", "n/a"))
            return
        v, j = num(get(sy[name], *key)), num(get(jup, *key))
        if v is None or j is None or j == 0:
            out.append((label, fmt(get(sy[name], *key)), fmt(get(jup, *key)), "-",
                        "n/a" if v is None and j is not None else "MISS" if v is None else "n/a"))
            return
        r = v / j
        errs = get(sy[name], key[0], "errors")
        out.append((label, f"{fmt(v)} ms" + (f" ({errs} errors)" if errs else ""),
                    f"{fmt(j)} ms", f"{r:.3f}x",
                    "PASS" if r <= limit and not errs else "MISS"))

    ratio_row("local trivial cell p50 <= 0.05x", "hermes-local", ("trivial", "p50_ms"), 0.05)
    # against the floors (issue 21): nginx's return 200, the runner's own
    # cost and a pipe round trip between two processes, added
    fl = floors(sy)
    for name, lbl, limit in (("hermes-local", "local", 1.5), ("hermes-ssh", "ssh (dedicated)", 2.5)):
        label = f"{lbl} trivial cell p50 <= {limit}x the floors"
        v = num(get(sy.get(name, {}), "trivial", "p50_ms"))
        if v is None or fl is None:
            out.append((label, fmt(v), "-", "-", "n/a"))
            continue
        r = v / fl
        out.append((label, f"{fmt(v)} ms vs {fl:.3f} ms", "-", f"{r:.2f}x",
                    "PASS" if r <= limit else "MISS"))
    for name, who in (("hermes-ssh", "dedicated"), ("hermes-ssh-rc", "slow rc")):
        ratio_row(f"ssh ({who}) trivial cell p50 <= 0.3x", name, ("trivial", "p50_ms"), 0.3)
    for name, who in (("hermes-ssh", "dedicated"), ("hermes-ssh-rc", "slow rc")):
        ratio_row(f"ssh ({who}) new session p50 <= 0.15x", name, ("spawn", "p50_ms"), 0.15)
    ratio_row("local new session, warm pool, p50 <= 0.02x", "hermes-local-warm",
              ("spawn", "p50_ms"), 0.02)
    ratio_row("local new session, trixie environment's warm pool, p50 <= 0.02x",
              "hermes-local-env-warm", ("spawn", "p50_ms"), 0.02)
    ratio_row("ssh (dedicated) new session, warm pool, p50 <= 0.15x", "hermes-ssh-warm",
              ("spawn", "p50_ms"), 0.15)
    for k, what in (("1mb_one_line", "1 MB, one print"), ("1mb_10k_lines", "1 MB, 10k prints")):
        ratio_row(f"local {what}, p50 <= 0.1x", "hermes-local", (k, "p50_ms"), 0.1)
        for name, who in (("hermes-ssh", "dedicated"), ("hermes-ssh-rc", "slow rc")):
            ratio_row(f"ssh ({who}) {what}, p50 <= 0.3x", name, (k, "p50_ms"), 0.3)
    hermes = [(n, lbl) for n, lbl in (("hermes-local", "local"), ("hermes-ssh", "ssh dedicated"),
                                      ("hermes-ssh-rc", "ssh slow rc"))]
    for name, lbl in hermes:
        label = f"{lbl}: 1 MB streamed whole"
        if name not in sy:
            out.append((label, notes.get(name, "not run"), "-", "-", "n/a"))
            continue
        got = [(get(sy[name], k, "complete"), get(sy[name], k, "n")) for k in BIG]
        ok = all(num(c) is not None and c == n and n for c, n in got)
        out.append((label, ", ".join(f"{c}/{n}" for c, n in got), "-", "-",
                    "PASS" if ok else "MISS"))
    for name, lbl in hermes:
        label = f"{lbl}: first byte p50 <= 5 ms after the print"
        if name not in sy:
            out.append((label, notes.get(name, "not run"), "-", "-", "n/a"))
            continue
        v = num(get(sy[name], "first_byte_print", "p50_ms"))
        p90 = get(sy[name], "first_byte_print", "p90_ms")
        j = get(jup, "first_byte_print", "p50_ms")
        errs = get(sy[name], "first_byte_print", "errors") or 0
        missing = get(sy[name], "first_byte_print", "missing") or 0
        out.append((label, f"{fmt(v)} ms (p90 {fmt(p90)})"
                    + (f", {errs} errors" if errs else "")
                    + (f", {missing} without a byte" if missing else ""),
                    f"{fmt(j)} ms", "-",
                    "MISS" if v is None or v > 5 or errs or missing else "PASS"))
    for name, lbl in hermes:
        label = f"{lbl}: 5 MB whole or cut at max, reported"
        if name not in sy:
            out.append((label, notes.get(name, "not run"), "-", "-", "n/a"))
            continue
        b = [get(sy[name], "burst_" + k) for k in BURST]
        ok = all(isinstance(x, dict) and x.get("exact") and x.get("kernel_ok_after")
                 for x in b)
        desc = ", ".join(
            (f"{x.get('received_bytes')}" + (" cut" if x.get("cut_reported") else " whole"))
            if isinstance(x, dict) and "error" not in x else "ERR" for x in b)
        out.append((label, desc, "-", "-", "PASS" if ok else "MISS"))
    for name, lbl in hermes:
        label = f"{lbl}: 64 sessions, all answered"
        p = get(sy.get(name, {}), "parallel")
        if name not in sy or not isinstance(p, dict):
            out.append((label, notes.get(name, "not run"), "-", "-", "n/a"))
            continue
        ok = p.get("all_answered") and not p.get("error_count_all_rounds")
        out.append((label, f"{p.get('answered_all_rounds')}, {p.get('error_count_all_rounds')} errors",
                    "-", "-", "PASS" if ok else "MISS"))
        r = num(p.get("ratio"))
        out.append((f"{lbl}: 64 sessions, aggregate >= 1.5x one",
                    f"{fmt(p.get('aggregate_cells_per_s'))}/s vs {fmt(p.get('single_cells_per_s'))}/s",
                    "-", f"{fmt(r)}x", "PASS" if r is not None and r >= 1.5 else "MISS"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", metavar="RESULTS_JSON",
                    help="only print the tables of an earlier run")
    ap.add_argument("--hermes")
    ap.add_argument("--hermes-tmpfs", help="a location whose kernels root is on tmpfs")
    ap.add_argument("--hermes-ssh", help="the ssh backend, a user with no shell rc")
    ap.add_argument("--hermes-ssh-rc", help="the ssh backend, a user whose rc sleeps 1 s")
    ap.add_argument("--ssh-why", help="why there is no ssh backend in this run")
    ap.add_argument("--ssh-rc-runs", metavar="FILE",
                    help="a line in FILE each time the slow-rc user's rc runs")
    ap.add_argument("--hermes-warm", help="the local backend with warm=N")
    ap.add_argument("--warm", type=int, default=0)
    ap.add_argument("--warm-why", help="why there is no warm pool in this run")
    ap.add_argument("--hermes-ssh-warm",
                    help="the ssh backend with warm=N, the user with no shell rc")
    ap.add_argument("--ssh-warm-why", help="why there is no ssh warm pool in this run")
    ap.add_argument("--floor",
                    help="a plain nginx location answering 200: the HTTP floor")
    ap.add_argument("--hermes-env-warm",
                    help="the local backend, kernels in an environment with warm=N")
    ap.add_argument("--env-warm-why",
                    help="why there is no environment warm pool in this run")
    ap.add_argument("--jupyter")
    ap.add_argument("--jupyter-stock")
    ap.add_argument("--jupyter-par", type=int, default=0)
    ap.add_argument("--hermes-status",
                    help="the gateway's hermes_status location (its version)")
    ap.add_argument("--hermes-log")
    ap.add_argument("--hermes-pid", type=int, help="nginx master pid (CPU diagnostics)")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.report:
        with open(a.report) as f:
            res = json.load(f)
        res["targets"] = [dict(zip(("target", "measured", "jupyter", "ratio", "verdict"), t))
                          for t in targets(res)]
        report(res)
        return 0
    if not a.hermes:
        ap.error("--hermes is required")
    token = os.environ.get("JUPYTER_TOKEN", "")
    global NGINX_MASTER
    NGINX_MASTER = a.hermes_pid
    # the gateways' warm pools fill as they start: busy0 is the machine's,
    # what else runs on it, once they are full
    settle("the run")
    busy0 = busy_fraction(1.0)

    t_start = time.perf_counter()
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "machine": machine(),
           "hermes": gateway_build(a.hermes_status),
           "params": {"profiles": PROFILES, "min_n": MIN_N,
                      "trivial_stock_n": N_TRIVIAL_STOCK,
                      "max_stream": MAX_STREAM, "trivial_code": TRIVIAL,
                      "first_byte_code": FIRST_BYTE_PLAIN, "warm": a.warm},
           "command": " ".join(sys.argv), "notes": {}, "systems": {}}
    res["machine"]["busy_before_start"] = busy0
    notes = res["notes"]

    hold = float(os.environ.get("BENCH_HOLD") or 0)
    if hold > 0:
        # everything is up: time to probe the servers by hand
        log(f"holding {hold:g}s before the first column (BENCH_HOLD)")
        time.sleep(hold)
    if a.floor:
        log("floor: keep-alive round trip to nginx's return 200")
        res["systems"]["floor"] = {}
        guarded(res["systems"]["floor"], "trivial", t_floor, a.floor, 1000)
        log("floor: the runner's own cost of a trivial cell, inside it")
        res["systems"]["runner-floor"] = {}
        guarded(res["systems"]["runner-floor"], "trivial", t_runner_floor, 3000)
        log("floor: a pipe round trip between two python processes")
        res["systems"]["pipe-floor"] = {}
        guarded(res["systems"]["pipe-floor"], "trivial", t_pipe_floor, 5000)
    res["systems"]["hermes-local"] = run_system(HermesSystem(a.hermes))
    if a.hermes_tmpfs:
        res["systems"]["hermes-local-tmpfs"] = run_system(
            HermesSystem(a.hermes_tmpfs, "hermes-local-tmpfs"))
    if a.hermes_warm:
        res["systems"]["hermes-local-warm"] = run_warm(
            HermesSystem(a.hermes_warm, "hermes-local-warm"), a.warm)
    else:
        notes["hermes-local-warm"] = a.warm_why or "n/a: no warm pool location"
    if a.hermes_env_warm:
        res["systems"]["hermes-local-env-warm"] = run_warm(
            HermesSystem(a.hermes_env_warm, "hermes-local-env-warm"), a.warm)
    else:
        notes["hermes-local-env-warm"] = (a.env_warm_why
                                          or "n/a: no environment warm pool location")
    for url, name in ((a.hermes_ssh, "hermes-ssh"), (a.hermes_ssh_rc, "hermes-ssh-rc")):
        if url:
            rc0 = rc_runs(a.ssh_rc_runs)
            res["systems"][name] = run_system(HermesSystem(url, name, "ssh"))
            if name == "hermes-ssh-rc" and rc0 is not None:
                # how often the shell rc ran: once a connection (the
                # agent's login), not once a command
                res["systems"][name]["rc_runs"] = rc_runs(a.ssh_rc_runs) - rc0
        else:
            notes[name] = a.ssh_why or "n/a: no ssh location"
    if a.hermes_ssh_warm:
        res["systems"]["hermes-ssh-warm"] = run_warm(
            HermesSystem(a.hermes_ssh_warm, "hermes-ssh-warm", "ssh"), a.warm)
    else:
        notes["hermes-ssh-warm"] = (a.ssh_warm_why or a.ssh_why
                                    or "n/a: no ssh warm pool location")
    if a.jupyter:
        if websocket is None:
            res["systems"]["jupyter-nodelay"] = {"error": "python3-websocket missing"}
        else:
            res["systems"]["jupyter-nodelay"] = run_system(
                JupyterSystem(a.jupyter, token, "jupyter-nodelay"), a.jupyter_par)
    if a.jupyter_stock and websocket is not None:
        js = JupyterSystem(a.jupyter_stock, token, "jupyter-stock")
        r = {"settle_s": settle("jupyter-stock")}
        log("jupyter-stock: trivial round trip")
        guarded(r, "trivial", t_trivial, js, N_TRIVIAL_STOCK, 10)
        res["systems"]["jupyter-stock"] = r

    if a.hermes_log:
        # what the gateway logged at [warn] or worse during the run
        try:
            with open(a.hermes_log, errors="replace") as f:
                bad = [line.rstrip() for line in f
                       if any(f"[{lv}]" in line for lv in
                              ("warn", "error", "crit", "alert", "emerg"))]
            res["hermes_log_warnings"] = {"count": len(bad), "first": bad[:20]}
        except OSError:
            pass

    res["total_s"] = round(time.perf_counter() - t_start, 1)
    res["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    res["targets"] = [dict(zip(("target", "measured", "jupyter", "ratio", "verdict"), t))
                      for t in targets(res)]
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
            f.write("\n")
    errs = report(res)
    if a.out:
        print(f"wrote {a.out}")
    return 1 if any(s.startswith("hermes-local.") for s in errs) else 0


def report(res):
    """Print the run's tables from its results; the errors met."""
    busy0 = res["machine"]["busy_before_start"]
    notes = res.get("notes", {})
    m = res["machine"]
    print(f"machine: {m['nproc']} x {m['cpu_model']}, linux {m['kernel']}, "
          f"nginx {m['nginx']}, openssh {m['openssh']}, libssh {m['libssh']}, "
          f"jupyter-server {m['jupyter_server']}, ipykernel {m['ipykernel']}; "
          f"tree {m['commit']}")
    h = res.get("hermes") or {"error": "not recorded"}
    print(f"hermes: {h['module']} {h['version']}, commit {h['commit']}"
          if "error" not in h else f"hermes: version unknown ({h['error']})")
    print(f"CPU busy in the second before the run: {100 * busy0:.0f}%; load average "
          f"at start {m['loadavg_at_start']}, at end {m['loadavg_at_end']}"
          + ("  (WARNING: machine busy, figures unreliable)" if busy0 > 0.15 else ""))
    print(table(res))
    for k, v in notes.items():
        print(f"{k}: {v}")
    print()
    print("Against the targets (ratio: hermes / jupyter-server+nodelay, medians):")
    print(render(("target", "hermes", "jupyter", "ratio", "verdict"),
                 [tuple(t.values()) for t in res["targets"]]))
    floor = get(res["systems"].get("floor", {}), "trivial", "p50_ms")
    own = get(res["systems"].get("runner-floor", {}), "trivial", "p50_ms")
    pipe = get(res["systems"].get("pipe-floor", {}), "trivial", "p50_ms")
    if isinstance(floor, (int, float)) and floor > 0:
        both = floors(res["systems"]) or floor
        print()
        print(f"Against the floor (nginx return 200, keep-alive, p50 {floor:.3f} ms"
              + (f"; plus the runner's own cost of the cell, p50 {own:.4f} ms,"
                 f" and a pipe round trip, p50 {pipe:.3f} ms: {both:.3f} ms)"
                 if both > floor else ")"))
        rows = []
        for name, lbl in (("hermes-local", "local"), ("hermes-ssh", "ssh dedicated"),
                          ("jupyter-nodelay", "jupyter+nodelay")):
            v = get(res["systems"].get(name, {}), "trivial", "p50_ms")
            if isinstance(v, (int, float)):
                rows.append((f"{lbl} trivial cell p50", f"{v:.3f} ms", f"{v / floor:.2f}x",
                             f"{v / both:.2f}x"))
        print(render(("what", "p50", "x nginx floor", "x the floors"), rows))
    errs = [f"{s}.{k}: {v['error']}" for s, d in res["systems"].items()
            for k, v in d.items() if isinstance(v, dict) and "error" in v]
    par_errs = []
    for name in res["systems"]:
        par = res["systems"][name].get("parallel", {})
        if par.get("error_count_all_rounds"):
            par_errs += [f"{name}.parallel: {e}" for e in par["errors"]]
        for k, v in res["systems"][name].items():
            if not isinstance(v, dict):
                continue
            for what, many, first in (("", "errors", "first_errors"),
                                      ("warm-up ", "warmup_errors", "first_warmup_errors")):
                if isinstance(v.get(many), int) and v[many]:
                    errs.append(f"{name}.{k}: {v[many]} {what}errors, the first: "
                                f"{(v.get(first) or ['?'])[0]}")
            if v.get("budget_cut"):
                print(f"note: {name}.{k}: {v['n']} of {v['of_n']} samples, {v['budget_cut']}")
    errs += par_errs
    if errs:
        print(f"errors ({len(errs)}; all of them in the results):")
        for e in errs[:12]:
            print("  " + e[:300])
    hl = res.get("hermes_log_warnings")
    if hl:
        print(f"hermes error.log lines at [warn] or worse: {hl['count']}")
        for line in hl["first"][:5]:
            print("  " + line[:200])
    print(f"total {res['total_s']} s")
    return errs


if __name__ == "__main__":
    sys.exit(main())
