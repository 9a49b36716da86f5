#!/usr/bin/python3
# SPDX-License-Identifier: BSD-2-Clause
"""The runner alone, driven as the local module drives it: N cells, each
its request inline in the wake FIFO (kept open), its result waited for
by polling the name (this process on the other CPU), with an inotify
watch on cells/ as the module's (so renames into it cost what they cost
under the gateway).  Prints the p50 and p90 of a cell's round trip and
the runner's CPU and minor page faults a cell (from /proc), after 200 cells
to warm up.  To compare two runners, give each its directory.

    /usr/bin/python3 bench/runner_alone.py [--dir DIR] [--n N] [--code CODE]

DIR holds the kernel_runner.py and hermes_tools.py to run (default:
src/remote of this tree).
"""

import argparse
import ctypes
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REMOTE = os.path.join(HERE, "..", "src", "remote")
sys.path.insert(0, REMOTE)

import test_remote  # noqa: E402  (its Kernel: a kernel dir and a runner)

IN_MOVED_TO, IN_DELETE_SELF, IN_ONLYDIR = 0x80, 0x400, 0x01000000
WARM = 200


def cpu(pid):
    """(user, system) clock ticks and minor page faults of pid."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12]), int(fields[7])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=REMOTE)
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--code", default="x = 1")
    a = ap.parse_args()
    test_remote.HERE = a.dir
    k = test_remote.Kernel()
    libc = ctypes.CDLL(None, use_errno=True)
    ifd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if ifd < 0 or libc.inotify_add_watch(
            ifd, k.cells.encode(), IN_MOVED_TO | IN_DELETE_SELF | IN_ONLYDIR) < 0:
        sys.exit("inotify: %s" % os.strerror(ctypes.get_errno()))
    wake = os.open(k.path("wake"), os.O_WRONLY | os.O_CLOEXEC)
    lat = []
    try:
        for i in range(a.n + WARM):
            if i == WARM:
                c0 = cpu(k.pid)
            k.n += 1
            req = json.dumps({"id": k.n, "code": a.code}).encode() + b"\n"
            path = k.res_path(k.n)
            t0 = time.perf_counter()
            os.write(wake, req)
            while not os.path.exists(path):
                pass
            lat.append(time.perf_counter() - t0)
            try:
                while os.read(ifd, 65536):
                    pass
            except BlockingIOError:
                pass
        c1 = cpu(k.pid)
    finally:
        os.close(wake)
        k.close()
    tick = os.sysconf("SC_CLK_TCK")
    lat = sorted(lat[WARM:])
    print("%d cells %r: p50 %.1f us, p90 %.1f us; runner CPU a cell: user %.1f us,"
          " system %.1f us, %.1f page faults"
          % (a.n, a.code, lat[a.n // 2] * 1e6, lat[a.n * 9 // 10] * 1e6,
             (c1[0] - c0[0]) / tick / a.n * 1e6,
             (c1[1] - c0[1]) / tick / a.n * 1e6, (c1[2] - c0[2]) / a.n))


if __name__ == "__main__":
    main()
