#!/usr/bin/python3
# SPDX-License-Identifier: BSD-2-Clause
"""New sessions, side by side: two gateways (two trees' `make run`, say),
a new session at each in turn, so whatever the machine does meanwhile
falls on both alike.

    /usr/bin/python3 bench/new_sessions.py [--n 30] [--rounds 3] \\
        NAME=http://127.0.0.1:PORT/v1/execute NAME=...

Each sample is a new session's first cell (bench.py's "new session":
the request to its result, the kernel spawned for it), the session
ended, untimed, before the next; the gateways' order alternates. Prints
p50, p90 and max per gateway and round, and over all rounds.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def sample(sysm, tag):
    s = sysm.open(tag)
    t0 = time.perf_counter()
    try:
        res = sysm.cell(s, bench.TRIVIAL)
        took = time.perf_counter() - t0
        if res.get("kernel", {}).get("reused"):
            raise bench.BenchError(f"{sysm.name}: a kernel reused, not new")
    except BaseException:
        s.close()
        raise
    sysm.end(s)
    return took


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30, help="new sessions a round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gap", type=float, default=0.2,
                    help="seconds between samples (an ended kernel's cleanup)")
    ap.add_argument("gateways", nargs="+", metavar="NAME=URL")
    a = ap.parse_args()
    systems = []
    for g in a.gateways:
        name, sep, url = g.partition("=")
        if not sep or not url:
            ap.error(f"not NAME=URL: {g}")
        systems.append(bench.HermesSystem(url, name=name))
    width = max(len(s.name) for s in systems)
    every = {s.name: [] for s in systems}
    for rnd in range(1, a.rounds + 1):
        got = {s.name: [] for s in systems}
        for i in range(a.n):
            order = systems if i % 2 == 0 else systems[::-1]
            for sysm in order:
                time.sleep(a.gap)
                got[sysm.name].append(sample(sysm, f"ns{rnd}-{i}"))
        for sysm in systems:
            every[sysm.name] += got[sysm.name]
            print(f"round {rnd}  {sysm.name:<{width}}  {line(got[sysm.name])}")
    for sysm in systems:
        print(f"all      {sysm.name:<{width}}  {line(every[sysm.name])}")


def line(samples):
    r = bench.summary(samples)
    return (f"p50 {r['p50_ms']:7.1f} ms  p90 {r['p90_ms']:7.1f} ms  "
            f"max {r['max_ms']:7.1f} ms  (n {r['n']})")


if __name__ == "__main__":
    main()
