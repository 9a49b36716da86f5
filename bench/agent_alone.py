#!/usr/bin/python3
# SPDX-License-Identifier: BSD-2-Clause
"""The kernel-host agent alone, driven as the ssh backend drives it but
without sshd: test_agent.py's Agent (the loader, the agent's text, then
frames on its stdin) and one kept kernel of test_remote.py's, N trivial
cells a round, each CELL sent once the last one's R came.  Prints each
agent's wall time and its own CPU a cell (from /proc/PID/stat), rounds
alternating between the agents given, after 50 cells to warm up.

    /usr/bin/python3 bench/agent_alone.py [--n N] [--rounds R] \\
        NAME=AGENT.py NAME=AGENT.py...

AGENT.py: an agent's text (git show REV:src/remote/hermes_agent.py >
FILE for another tree's).
"""

import argparse
import os
import statistics
import sys
import time

REMOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                      "src", "remote")
sys.path.insert(0, REMOTE)

import test_agent  # noqa: E402
from test_remote import Kernel  # noqa: E402

TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")


def one_round(path, n, code):
    test_agent.AGENT = path
    k = Kernel()
    a = test_agent.Agent()
    try:
        for i in range(1, 51):
            a.cell(i, k, i, code=code)
            a.end(i)
        cpu0 = test_agent._proc(a.pid)[0]
        t0 = time.perf_counter()
        for i in range(51, 51 + n):
            a.cell(i, k, i, code=code)
            a.end(i)
        wall = (time.perf_counter() - t0) / n * 1000
        cpu = (test_agent._proc(a.pid)[0] - cpu0) * TICK_MS / n
    finally:
        a.close()
        k.close()
    return wall, cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--code", default="1 + 1")
    ap.add_argument("agents", nargs="+", metavar="NAME=AGENT.py")
    a = ap.parse_args()
    agents = [x.split("=", 1) for x in a.agents]
    got = {name: [] for name, _ in agents}
    for r in range(a.rounds):
        order = agents if r % 2 == 0 else agents[::-1]
        for name, path in order:
            got[name].append(one_round(os.path.abspath(path), a.n, a.code))
            w, c = got[name][-1]
            print("round %d  %-8s wall %.3f ms  agent CPU %.3f ms a cell"
                  % (r + 1, name, w, c), flush=True)
    for name, v in got.items():
        print("median   %-8s wall %.3f ms  agent CPU %.3f ms a cell"
              % (name, statistics.median(x[0] for x in v),
                 statistics.median(x[1] for x in v)))


if __name__ == "__main__":
    main()
