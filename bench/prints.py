#!/usr/bin/python3
# SPDX-License-Identifier: BSD-2-Clause
"""A print loop's cost in the runner, side by side: gateways (make run's,
or several started from different trees) each run the same cell, 10,000
prints of 100 bytes, streamed as make bench's "1 MB, 10k prints" is,
in rounds that alternate between them.  Per gateway: the p50 of the
runner's main-thread CPU for the loop (time.thread_time() inside the
cell: what each print costs the cell itself) and of the wall time a
client waits for the whole answer.

    /usr/bin/python3 bench/prints.py [--rounds R] [--per N] URL [URL ...]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

LOOP = """import time as _t
_th = _t.thread_time()
for i in range(10000):
    print('x' * 99)
_T = _t.thread_time() - _th"""


def p50(v):
    v = sorted(v)
    return v[len(v) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per", type=int, default=5)
    ap.add_argument("urls", nargs="+")
    a = ap.parse_args()
    sessions = [bench.HermesSession(u, "prints") for u in a.urls]
    cpu = [[] for _ in sessions]
    wall = [[] for _ in sessions]
    for s in sessions:          # the kernel, and the loop's code paged in
        s.stream(LOOP)
    for _ in range(a.rounds):
        for i, s in enumerate(sessions):
            for _ in range(a.per):
                t0 = time.perf_counter()
                o = s.stream(LOOP)
                wall[i].append(time.perf_counter() - t0)
                if o["stdout_bytes"] != 1000000:
                    sys.exit(f"{a.urls[i]}: {o['stdout_bytes']} bytes, not 1000000")
                cpu[i].append(float(s.run("_T")["output"]))
    for i, u in enumerate(a.urls):
        print(f"{u}: main thread p50 {p50(cpu[i]) * 1e3:.2f} ms, "
              f"wall p50 {p50(wall[i]) * 1e3:.2f} ms "
              f"({len(cpu[i])} cells)")


if __name__ == "__main__":
    main()
