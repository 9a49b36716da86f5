#!/usr/bin/python3
# SPDX-License-Identifier: BSD-2-Clause
"""Where a trivial cell's CPU goes, on a running gateway (make run): the
client, the nginx workers and the kernel (its runner and sandbox), each
in ms of CPU a cell, over many cells; with --strace, the kernel's system
calls a cell (files made, renamed, removed, inotify, wake-ups).  For an
ssh location (a host on this machine, as `make bench`'s), --ssh-user
names the user the module logs in as: that user's other processes (the
kernel-host agent, sshd's session process) and the sshd processes above
them (the connection's privileged monitor) are a part of their own.

CPU time is each task's own (/proc/PID/task/TID/schedstat: ns on a CPU),
read before and after the cells: it needs no performance counters (a VM
often has none: perf stat says "not supported") and counts every thread.

    /usr/bin/python3 bench/budget.py [--url URL] [--n N] [--strace] [--code CODE]
        [--pid-file run/nginx.pid] [--ssh-user USER]
"""

import argparse
import glob
import http.client
import json
import os
import pwd
import re
import subprocess
import time
import urllib.parse

TRIVIAL = "1 + 1"


def cpu_ns(pid):
    """ns on a CPU of every thread of pid (0 if it is gone)."""
    total = 0
    for f in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(f) as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def pids_where(pred):
    out = []
    for d in glob.glob("/proc/[0-9]*"):
        pid = int(d.rsplit("/", 1)[1])
        try:
            if pred(pid):
                out.append(pid)
        except OSError:
            pass
    return out


def ppid(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("PPid:"):
                return int(line.split()[1])
    return 0


def owner(pid):
    return os.stat(f"/proc/{pid}").st_uid


def cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8088/v1/execute")
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--strace", action="store_true")
    ap.add_argument("--code", default=TRIVIAL,
                    help="the cell (make bench's trivial cell is 'x = 1')")
    ap.add_argument("--pid-file", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "run", "nginx.pid"),
                    help="the gateway's nginx.pid (make run's by default)")
    ap.add_argument("--ssh-user",
                    help="an ssh location's login user: its agent and sshd's part")
    a = ap.parse_args()

    u = urllib.parse.urlsplit(a.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    session = f"budget-{os.getpid()}"

    def cell():
        conn.request("POST", u.path, body=json.dumps({"session": session, "code": a.code}),
                     headers={"Content-Type": "application/json",
                              "Accept": "application/json"})
        r = conn.getresponse()
        res = json.loads(r.read())
        if r.status != 200 or res.get("status") != "success":
            raise SystemExit(f"cell failed: {r.status} {res}")
        return res

    kid = cell()["kernel"]["kernel_id"]
    for _ in range(50):
        cell()

    with open(a.pid_file) as f:
        master = int(f.read())
    workers = pids_where(lambda p: ppid(p) == master)
    kernel = pids_where(lambda p: f"hermes_rkernel_{kid}" in os.readlink(f"/proc/{p}/cwd"))
    # the runner itself, not the shell or bwrap that name it in their argv
    runner = [p for p in kernel if "python" in cmdline(p).split(" ", 1)[0]
              and "kernel_start.py" in cmdline(p)]
    host = []
    if a.ssh_user:
        uid = pwd.getpwnam(a.ssh_user).pw_uid
        host = pids_where(lambda p: owner(p) == uid and p not in kernel)
        for p in list(host):             # the sessions' privileged monitors
            q = ppid(p)
            if q > 1 and q not in host and cmdline(q).startswith("sshd"):
                host.append(q)

    tracer = None
    if a.strace and runner:
        out = f"/tmp/hermes-budget-strace-{os.getpid()}.txt"
        tracer = subprocess.Popen(["strace", "-f", "-c", "-o", out, "-p", str(runner[0])],
                                  stderr=subprocess.PIPE)
        time.sleep(0.5)

    me0 = cpu_ns(os.getpid())
    w0 = sum(cpu_ns(p) for p in workers)
    k0 = sum(cpu_ns(p) for p in kernel)
    agent = [p for p in host if "hermes_agent" in cmdline(p)]
    a0 = sum(cpu_ns(p) for p in agent)
    h0 = sum(cpu_ns(p) for p in host)
    t0 = time.perf_counter()
    for _ in range(a.n):
        cell()
    wall = time.perf_counter() - t0
    me = cpu_ns(os.getpid()) - me0
    w = sum(cpu_ns(p) for p in workers) - w0
    k = sum(cpu_ns(p) for p in kernel) - k0
    h = sum(cpu_ns(p) for p in host) - h0
    ag = sum(cpu_ns(p) for p in agent) - a0

    per = lambda ns: ns / a.n / 1e6   # noqa: E731
    print(f"{a.n} trivial cells ({a.code!r}), one session, keep-alive, "
          f"Accept: application/json; {1000 * wall / a.n:.3f} ms a cell wall")
    print(f"  client (this process)       {per(me):.3f} ms CPU a cell")
    print(f"  nginx workers ({len(workers)})           {per(w):.3f} ms CPU a cell")
    print(f"  kernel ({len(kernel)} processes)      {per(k):.3f} ms CPU a cell")
    if a.ssh_user:
        print(f"  agent and sshd ({len(host)} processes) {per(h):.3f} ms CPU a cell")
        print(f"    the agent ({len(agent)})             {per(ag):.3f} ms CPU a cell")
        print(f"    sshd and the rest            {per(h - ag):.3f} ms CPU a cell")
    print(f"  sum                         {per(me + w + k + h):.3f} ms CPU a cell")

    if tracer:
        tracer.terminate()
        err = tracer.communicate()[1]
        if not os.path.exists(out):
            raise SystemExit(f"strace wrote nothing: {err.decode(errors='replace')[-300:]}")
        with open(out) as f:
            rows = []
            for line in f:
                m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
                if m:
                    rows.append((int(m.group(1)), m.group(2)))
        os.unlink(out)
        print(f"  the runner's system calls a cell (strace -f -c over {a.n} cells):")
        for calls, name in sorted(rows, reverse=True)[:14]:
            print(f"    {name:<20} {calls / a.n:.2f}")

    conn.request("POST", u.path, body=json.dumps({"session": session, "code": "raise SystemExit"}),
                 headers={"Content-Type": "application/json", "Accept": "application/json"})
    conn.getresponse().read()


if __name__ == "__main__":
    main()
