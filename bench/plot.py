#!/usr/bin/python3
# SPDX-License-Identifier: BSD-2-Clause
"""Plot bench/results.json: the latency distributions of each backend.

    /usr/bin/python3 bench/plot.py bench/results.json docs/benchmarks-latency.png

One panel each for the trivial cell (warm kernel), the new session (spawn +
first cell) and the first output byte after the print: the empirical CDF of
every sample, on a log time axis.  Needs Debian's python3-matplotlib (run with
/usr/bin/python3: it is not in pyenv's python).
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES = [
    # results.json name, label, colour
    ("hermes-local", "hermes local", "tab:blue"),
    ("hermes-local-tmpfs", "hermes local (tmpfs root)", "tab:cyan"),
    ("hermes-local-warm", "hermes local, warm pool", "tab:purple"),
    ("hermes-ssh", "hermes ssh, dedicated user", "tab:green"),
    ("hermes-ssh-rc", "hermes ssh, rc sleeps 1 s", "tab:olive"),
    ("hermes-ssh-warm", "hermes ssh, warm pool", "tab:brown"),
    ("jupyter-nodelay", "jupyter-server (TCP_NODELAY)", "tab:red"),
    ("jupyter-stock", "jupyter-server (stock)", "tab:orange"),
]

PANELS = [
    ("trivial", "trivial cell round trip (warm kernel)"),
    ("spawn", "new session: spawn + first cell"),
    ("first_byte_print", "first stdout byte after the print"),
]


def main():
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        res = json.load(f)
    systems = res.get("systems", {})
    fig, axes = plt.subplots(1, len(PANELS), figsize=(15, 4.8))
    for ax, (key, title) in zip(axes, PANELS):
        drawn = 0
        lines = [(name, key, label, colour, "-") for name, label, colour in SERIES]
        if key == "first_byte_print":
            # ipykernel sends a plain print's stdout on a 0.2 s flush
            # interval: its flush=True figure too, dashed
            lines.append(("jupyter-nodelay", "first_byte_flush",
                          "jupyter-server, print(flush=True)", "tab:red", "--"))
        for name, k, label, colour, style in lines:
            test = systems.get(name, {}).get(k, {})
            samples = test.get("samples_ms")
            if not samples:
                continue
            v = sorted(x for x in samples if x is not None and x > 0)
            if not v:
                continue
            y = [(i + 1) / len(v) for i in range(len(v))]
            ax.step(v, y, where="post", color=colour, linestyle=style,
                    label=f"{label} (n={len(v)}, p50 {test.get('p50_ms', 0):.3g} ms)")
            drawn += 1
        ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("ms (log scale)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if drawn:
            ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("fraction of samples at or below")
    m = res.get("machine", {})
    fig.suptitle(f"ngx_hermes vs jupyter-server, {res.get('date', '')}, "
                 f"{m.get('nproc', '?')} CPUs, tree {m.get('commit', '?')}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
