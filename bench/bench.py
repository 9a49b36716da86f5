#!/usr/bin/python3
"""ngx_hermes benchmark: hermes (local backend) side by side with jupyter-server.

Run by bench/run.sh, which starts the servers; stdlib only, plus Debian's
python3-websocket for the jupyter kernel websocket. Every loop is bounded in
count, every socket in time; only 127.0.0.1 is contacted.

    /usr/bin/python3 bench/bench.py --hermes URL --jupyter URL
        [--jupyter-stock URL] [--jupyter-par N] [--out results.json]

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

N_TRIVIAL = 300
N_TRIVIAL_WARM = 30
N_TRIVIAL_STOCK = 60          # stock jupyter: ~44 ms a cell, keep it short
N_STREAM_RT = 100             # hermes trivial cell, NDJSON answer
N_SPAWN = 10
N_FIRST_BYTE = 30
N_BIG = 10
PAR_SESSIONS = 64
PAR_CELLS = 30
PAR_WARM = 3
PAR_ROUNDS = 3
N_PAR_SINGLE = 200
N_TOOL = 300                  # tool calls, timed inside one cell

TRIVIAL = "x = 1"
FIRST_BYTE_PLAIN = "import time\nprint(time.time())\ntime.sleep(0.2)"
FIRST_BYTE_FLUSH = "import time\nprint(time.time(), flush=True)\ntime.sleep(0.2)"
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


def summary(samples):
    return {
        "n": len(samples),
        "p50_ms": ms(pct(samples, 50)),
        "p90_ms": ms(pct(samples, 90)),
        "p99_ms": ms(pct(samples, 99)),
        "min_ms": ms(min(samples)) if samples else None,
        "max_ms": ms(max(samples)) if samples else None,
    }


class BenchError(Exception):
    pass


# --- CPU accounting (diagnostics: who burnt the CPU during a phase) ---------

TCK = os.sysconf("SC_CLK_TCK")
NGINX_MASTER = None   # set from --hermes-pid


def cpu_total():
    """(busy, all) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)


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
    def __init__(self, url, name="hermes-local"):
        self.url, self.name = url, name
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

def t_trivial(sysm, n, warm):
    s = sysm.open("rt")
    try:
        for _ in range(warm):
            sysm.cell(s, TRIVIAL)
        lat = []
        t_all = time.perf_counter()
        for _ in range(n):
            t0 = time.perf_counter()
            sysm.cell(s, TRIVIAL)
            lat.append(time.perf_counter() - t0)
        wall = time.perf_counter() - t_all
    finally:
        sysm.end(s)
    r = summary(lat)
    r["cells_per_s"] = round(n / wall, 1)
    return r


def t_trivial_cpu(sysm, n, warm):
    """t_trivial plus where the CPU went (hermes: nginx workers' CPU)."""
    m0, n0, c0 = cpu_total(), cpu_of_children(NGINX_MASTER), os.times()
    r = t_trivial(sysm, n, warm)
    m1, n1, c1 = cpu_total(), cpu_of_children(NGINX_MASTER), os.times()
    r["machine_busy"] = round((m1[0] - m0[0]) / max(m1[1] - m0[1], 1), 3)
    r["client_cpu_ms_per_cell"] = round(1000 * (c1.user + c1.system - c0.user - c0.system)
                                        / (n + warm), 3)
    if NGINX_MASTER and isinstance(sysm, HermesSystem):
        r["nginx_cpu_ms_per_cell"] = round(1000 * (n1 - n0) / (n + warm), 3)
    return r


def t_trivial_stream(sysm, n, warm):
    s = sysm.open("rts")
    try:
        for _ in range(warm):
            sysm.stream(s, TRIVIAL)
        lat = []
        for _ in range(n):
            t0 = time.perf_counter()
            o = sysm.stream(s, TRIVIAL)
            lat.append(time.perf_counter() - t0)
            if o["status"] != "success":
                raise BenchError(f"stream cell: {o}")
    finally:
        sysm.end(s)
    return summary(lat)


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


def t_spawn(sysm, n):
    lat, reused, create = [], 0, []
    for i in range(n):
        t0 = time.perf_counter()
        s = sysm.open(f"spawn{i}")
        try:
            res = sysm.cell(s, TRIVIAL)
            lat.append(time.perf_counter() - t0)
            if hasattr(s, "create_s"):
                create.append(s.create_s)
            if isinstance(sysm, HermesSystem) and res.get("kernel", {}).get("reused"):
                reused += 1
        finally:
            sysm.end(s)
    r = summary(lat)
    if isinstance(sysm, HermesSystem):
        r["reused_kernels"] = reused   # must be 0: every one a new kernel
    if create:
        # jupyter: POST /api/kernels alone, before the websocket and the cell
        r["create_p50_ms"] = ms(pct(create, 50))
    return r


def t_first_byte(sysm, n, code):
    s = sysm.open("fb")
    lat, missing = [], 0
    try:
        sysm.cell(s, "import time")
        for _ in range(n):
            first = []

            def on_stdout(text):
                if not first:
                    t_recv = time.time()
                    first.append((t_recv, text))
            sysm.stream(s, code, on_stdout)
            if not first:
                missing += 1
                continue
            t_recv, text = first[0]
            lat.append(t_recv - float(text.split()[0]))
    finally:
        sysm.end(s)
    r = summary(lat)
    r["missing"] = missing
    return r


def t_big(sysm, n, code, expect):
    s = sysm.open("big")
    lat, complete, got = [], 0, []
    try:
        sysm.stream(s, code)          # warm-up, also pages in the string ops
        for _ in range(n):
            t0 = time.perf_counter()
            o = sysm.stream(s, code)
            lat.append(time.perf_counter() - t0)
            got.append(o["stdout_bytes"])
            if o["stdout_bytes"] == expect and not o.get("cut_reported"):
                complete += 1
    finally:
        sysm.end(s)
    r = summary(lat)
    r.update({"expected_bytes": expect, "complete": complete,
              "received_bytes_min": min(got), "received_bytes_max": max(got)})
    return r


def t_burst(sysm, code, written):
    s = sysm.open("burst")
    try:
        sysm.cell(s, "x = 1")
        t0 = time.perf_counter()
        o = sysm.stream(s, code)
        dt = time.perf_counter() - t0
        # the kernel must still be usable afterwards
        after = sysm.stream(s, "print('after')")
    finally:
        sysm.end(s)
    r = {"written_bytes": written, "received_bytes": o["stdout_bytes"],
         "lost_bytes": written - o["stdout_bytes"],
         "cut_reported": o["cut_reported"], "ms": ms(dt),
         "kernel_ok_after": after["stdout_bytes"] == len("after\n")}
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


def t_parallel(sysm, sessions, cells, warm, single_cells_per_s):
    errors, lat = [], []
    lock = threading.Lock()
    ready = threading.Barrier(sessions + 1, timeout=180)
    done = threading.Barrier(sessions + 1, timeout=180)
    answered = [0]

    def worker(i):
        s = None
        mine = []
        try:
            s = sysm.open(f"par{i}")
            for _ in range(warm):
                sysm.cell(s, TRIVIAL)
        except Exception as e:   # noqa: BLE001
            with lock:
                errors.append(f"warm {i}: {e}")
        try:
            ready.wait()
        except threading.BrokenBarrierError:
            return
        try:
            if s is not None:
                for _ in range(cells):
                    t0 = time.perf_counter()
                    try:
                        sysm.cell(s, TRIVIAL)
                        mine.append(time.perf_counter() - t0)
                    except Exception as e:   # noqa: BLE001
                        with lock:
                            errors.append(f"cell {i}: {e}")
                        break
        finally:
            with lock:
                lat.extend(mine)
                answered[0] += len(mine)
            try:
                done.wait()
            except threading.BrokenBarrierError:
                pass
            if s is not None:
                try:
                    sysm.end(s)
                except Exception:
                    pass

    threads = [threading.Thread(target=worker, args=(i,), daemon=True)
               for i in range(sessions)]
    t_warm = time.perf_counter()
    for t in threads:
        t.start()
    ready.wait()
    warm_s = time.perf_counter() - t_warm
    m0, n0, c0 = cpu_total(), cpu_of_children(NGINX_MASTER), os.times()
    t0 = time.perf_counter()
    done.wait()
    wall = time.perf_counter() - t0
    m1, n1, c1 = cpu_total(), cpu_of_children(NGINX_MASTER), os.times()
    for t in threads:
        t.join(timeout=60)
    total = sessions * cells
    agg = answered[0] / wall if wall > 0 else 0.0
    r = summary(lat)
    r.update({"sessions": sessions, "cells_each": cells, "requests": total,
              "answered": answered[0],
              "answered_of": f"{answered[0]}/{total}", "errors": errors[:10],
              "error_count": len(errors), "wall_s": round(wall, 3),
              "warmup_s": round(warm_s, 3),
              "aggregate_cells_per_s": round(agg, 1),
              "single_cells_per_s": single_cells_per_s,
              "ratio": round(agg / single_cells_per_s, 2) if single_cells_per_s else None,
              # diagnostics for the timed phase
              "machine_busy": round((m1[0] - m0[0]) / max(m1[1] - m0[1], 1), 3),
              "client_cpu_ms_per_cell": round(1000 * (c1.user + c1.system - c0.user - c0.system)
                                              / max(answered[0], 1), 3)})
    if NGINX_MASTER and isinstance(sysm, HermesSystem):
        r["nginx_cpu_ms_per_cell"] = round(1000 * (n1 - n0) / max(answered[0], 1), 3)
    return r


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

    def deb(p):
        try:
            return subprocess.run(["dpkg-query", "-W", "-f=${Version}", p],
                                  capture_output=True, text=True, timeout=10).stdout
        except Exception:
            return ""
    return {"nproc": os.cpu_count(), "cpu_model": model,
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
            "busy_before_start": None,
            "kernel": platform.release(), "python": platform.python_version(),
            "nginx": deb("nginx"), "jupyter_server": deb("python3-jupyter-server"),
            "ipykernel": deb("python3-ipykernel")}


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def guarded(results, key, fn, *a):
    t0 = time.perf_counter()
    try:
        results[key] = fn(*a)
    except Exception as e:   # noqa: BLE001
        results[key] = {"error": f"{type(e).__name__}: {e}"}
    log(f"  {key}: {time.perf_counter() - t0:.1f}s")


def run_system(sysm, par_sessions, single_rt=None):
    r = {}
    log(f"{sysm.name}: trivial round trip")
    guarded(r, "trivial", t_trivial_cpu, sysm, N_TRIVIAL, N_TRIVIAL_WARM)
    if isinstance(sysm, HermesSystem):
        guarded(r, "trivial_ndjson", t_trivial_stream, sysm, N_STREAM_RT, 10)
        if sysm.name == "hermes-local":
            log(f"{sysm.name}: tool call round trip")
            guarded(r, "tool_call", t_tool_call, sysm, N_TOOL)
    log(f"{sysm.name}: spawn")
    guarded(r, "spawn", t_spawn, sysm, N_SPAWN)
    log(f"{sysm.name}: first output byte")
    guarded(r, "first_byte_print", t_first_byte, sysm, N_FIRST_BYTE, FIRST_BYTE_PLAIN)
    guarded(r, "first_byte_flush", t_first_byte, sysm, N_FIRST_BYTE, FIRST_BYTE_FLUSH)
    log(f"{sysm.name}: big output")
    for k, (code, expect) in BIG.items():
        guarded(r, k, t_big, sysm, N_BIG, code, expect)
    for k, (code, written) in BURST.items():
        guarded(r, "burst_" + k, t_burst, sysm, code, written)
    if par_sessions:
        log(f"{sysm.name}: {par_sessions} sessions in parallel, {PAR_ROUNDS} rounds")
        guarded(r, "parallel", t_parallel_rounds, sysm, par_sessions)
    return r


def t_parallel_rounds(sysm, sessions):
    """PAR_ROUNDS rounds, each: one session's cells/s measured right before
    (N_PAR_SINGLE cells), then the parallel run. The round with the median
    ratio is the result; all rounds are kept."""
    rounds = []
    for _ in range(PAR_ROUNDS):
        single = t_trivial_cpu(sysm, N_PAR_SINGLE, 10)
        p = t_parallel(sysm, sessions, PAR_CELLS, PAR_WARM, single["cells_per_s"])
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
    best["error_count_all_rounds"] = sum(p["error_count"] for p in rounds)
    best["ratios"] = [p.get("ratio") for p in rounds]
    best["errors"] = [e for p in rounds for e in p["errors"]][:20]
    return best


def fmt(v, unit=""):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.2f}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return f"{v}{unit}"


COLUMNS = [("hermes-local", "hermes disk"), ("hermes-local-tmpfs", "hermes tmpfs"),
           ("jupyter-nodelay", "jupyter+nodelay"), ("jupyter-stock", "jupyter stock")]


def table(res):
    cols = [(k, label) for k, label in COLUMNS if k in res["systems"]]
    data = [res["systems"][k] for k, _ in cols]
    rows = []

    def g(d, *path):
        for p in path:
            if not isinstance(d, dict):
                return None
            if "error" in d and p not in d:
                return "ERR"
            d = d.get(p)
        return d

    def row(label, key, target=""):
        rows.append((label,) + tuple(fmt(g(d, *key)) for d in data) + (target,))

    row("trivial cell p50 ms", ("trivial", "p50_ms"), "<= 2 ms (jupyter ~6)")
    row("trivial cell p90 ms", ("trivial", "p90_ms"))
    row("trivial cell p99 ms", ("trivial", "p99_ms"))
    row("trivial cells/s, 1 session", ("trivial", "cells_per_s"))
    row("trivial, NDJSON answer p50 ms", ("trivial_ndjson", "p50_ms"))
    row("trivial, NDJSON answer p99 ms", ("trivial_ndjson", "p99_ms"))
    row("tool call round trip p50 ms", ("tool_call", "p50_ms"))
    row("tool call round trip p99 ms", ("tool_call", "p99_ms"))
    row("kernel spawn + 1st cell p50 ms", ("spawn", "p50_ms"), "<= 100 ms ssh (jup ~450)")
    row("kernel spawn max ms", ("spawn", "max_ms"))
    row("jupyter POST /api/kernels p50 ms", ("spawn", "create_p50_ms"))
    row("first stdout byte p50 ms (print)", ("first_byte_print", "p50_ms"), "<= 10 ms")
    row("first stdout byte p90 ms (print)", ("first_byte_print", "p90_ms"))
    row("first stdout byte p50 ms (flush=True)", ("first_byte_flush", "p50_ms"), "<= 10 ms")
    for k in BIG:
        row(f"{k} p50 ms", (k, "p50_ms"), "<= 50 ms, whole")
        row(f"{k} complete (of {N_BIG})", (k, "complete"))
    for k in BURST:
        row(f"burst {k}: written", ("burst_" + k, "written_bytes"))
        row(f"burst {k}: received", ("burst_" + k, "received_bytes"),
            "whole or cut at 5 MiB, reported")
        row(f"burst {k}: cut reported", ("burst_" + k, "cut_reported"))
        row(f"burst {k}: ms", ("burst_" + k, "ms"))
    if any("parallel" in d for d in data):
        row("parallel: sessions", ("parallel", "sessions"))
        row("parallel: answered / sent, all rounds", ("parallel", "answered_all_rounds"), "all")
        row("parallel: errors, all rounds", ("parallel", "error_count_all_rounds"), "0")
        row("parallel: ratio of each round", ("parallel", "ratios"))
        row("median round: 1-session cells/s", ("parallel", "single_cells_per_s"))
        row("median round: aggregate cells/s", ("parallel", "aggregate_cells_per_s"))
        row("median round: ratio to 1 session", ("parallel", "ratio"), ">= 1.5x")
        row("parallel: cell p50 ms", ("parallel", "p50_ms"))
        row("parallel: cell p99 ms", ("parallel", "p99_ms"))
        row("parallel: machine CPU busy", ("parallel", "machine_busy"))
        row("parallel: nginx CPU ms/cell", ("parallel", "nginx_cpu_ms_per_cell"))
        row("1 session: nginx CPU ms/cell", ("parallel", "single_nginx_cpu_ms_per_cell"))
        row("parallel: client CPU ms/cell", ("parallel", "client_cpu_ms_per_cell"))

    head = ("measure",) + tuple(label for _, label in cols) + ("SPEC target",)
    n = len(head)
    w = [max(len(str(r[i])) for r in rows + [head]) for i in range(n)]
    lines = ["  ".join(str(c).ljust(w[i]) for i, c in enumerate(head)).rstrip(),
             "  ".join("-" * w[i] for i in range(n))]
    for r in rows:
        lines.append("  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)).rstrip())
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hermes", required=True)
    ap.add_argument("--hermes-tmpfs", help="a location whose kernels root is on tmpfs")
    ap.add_argument("--jupyter")
    ap.add_argument("--jupyter-stock")
    ap.add_argument("--jupyter-par", type=int, default=0)
    ap.add_argument("--hermes-log")
    ap.add_argument("--hermes-pid", type=int, help="nginx master pid (CPU diagnostics)")
    ap.add_argument("--out")
    a = ap.parse_args()
    token = os.environ.get("JUPYTER_TOKEN", "")
    global NGINX_MASTER
    NGINX_MASTER = a.hermes_pid
    busy0 = busy_fraction(1.0)

    t_start = time.perf_counter()
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "machine": machine(),
           "params": {"trivial_n": N_TRIVIAL, "trivial_stock_n": N_TRIVIAL_STOCK,
                      "spawn_n": N_SPAWN, "first_byte_n": N_FIRST_BYTE,
                      "big_n": N_BIG, "par_sessions": PAR_SESSIONS,
                      "par_cells": PAR_CELLS, "par_rounds": PAR_ROUNDS,
                      "max_stream": MAX_STREAM,
                      "trivial_code": TRIVIAL},
           "systems": {}}
    res["machine"]["busy_before_start"] = busy0

    res["systems"]["hermes-local"] = run_system(HermesSystem(a.hermes), PAR_SESSIONS)
    if a.hermes_tmpfs:
        res["systems"]["hermes-local-tmpfs"] = run_system(
            HermesSystem(a.hermes_tmpfs, "hermes-local-tmpfs"), PAR_SESSIONS)
    if a.jupyter:
        if websocket is None:
            res["systems"]["jupyter-nodelay"] = {"error": "python3-websocket missing"}
        else:
            res["systems"]["jupyter-nodelay"] = run_system(
                JupyterSystem(a.jupyter, token, "jupyter-nodelay"), a.jupyter_par)
    if a.jupyter_stock and websocket is not None:
        js = JupyterSystem(a.jupyter_stock, token, "jupyter-stock")
        log("jupyter-stock: trivial round trip")
        r = {}
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
    m = res["machine"]
    print(f"machine: {m['nproc']} x {m['cpu_model']}, linux {m['kernel']}, "
          f"nginx {m['nginx']}, jupyter-server {m['jupyter_server']}, "
          f"ipykernel {m['ipykernel']}")
    print(f"CPU busy in the second before the run: {100 * busy0:.0f}%; load average "
          f"at start {m['loadavg_at_start']}, at end {m['loadavg_at_end']}"
          + ("  (WARNING: machine busy, figures unreliable)" if busy0 > 0.15 else ""))
    print(table(res))
    errs = [f"{s}.{k}: {v['error']}" for s, d in res["systems"].items()
            for k, v in d.items() if isinstance(v, dict) and "error" in v]
    for name in ("hermes-local", "hermes-local-tmpfs"):
        par = res["systems"].get(name, {}).get("parallel", {})
        if par.get("error_count_all_rounds"):
            errs += [f"{name}.parallel: {e}" for e in par["errors"]]
    if errs:
        print("errors:")
        for e in errs:
            print("  " + e)
    hl = res.get("hermes_log_warnings")
    if hl:
        print(f"hermes error.log lines at [warn] or worse: {hl['count']}")
        for line in hl["first"][:5]:
            print("  " + line[:200])
    print(f"total {res['total_s']} s")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
            f.write("\n")
        print(f"wrote {a.out}")
    return 1 if any(s.startswith("hermes-local") for s in errs) else 0


if __name__ == "__main__":
    sys.exit(main())
