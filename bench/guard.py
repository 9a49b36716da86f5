#!/usr/bin/python3
# SPDX-License-Identifier: BSD-2-Clause
"""The regression guard of make bench: the figures of this run against
the last recorded ones (bench/baseline.json), not a timed test.

Each figure is a ratio taken within one run (hermes against
jupyter-server, or against the floor, nginx's return 200), so that a
baseline recorded on one machine still means something on another one.
A figure is worse when its ratio is over the recorded one by more than
its noise band: the larger of this run's own spread ((p90 - p50) / p50
of the hermes side, at least MIN_BAND) and the recorded band.

Recording a run of the module the baseline was recorded from adds it to
the record: the recorded ratio is the median of the runs', its band the
widest of theirs and of the runs' spread ((max - min) / median), the
noise between runs on this machine that one run's samples do not show.
A run of another module starts a new record.

    bench/guard.py RESULTS BASELINE            compare; exit 1 if worse
    bench/guard.py --record RESULTS BASELINE   record RESULTS' figures
"""

import json
import sys

MIN_BAND = 0.15

# name: (hermes system, its key, the reference system, its key)
FIGURES = {
    "local trivial cell / jupyter":
        ("hermes-local", "trivial", "jupyter-nodelay", "trivial"),
    "local trivial cell / floor":
        ("hermes-local", "trivial", "floor", "trivial"),
    "ssh trivial cell / jupyter":
        ("hermes-ssh", "trivial", "jupyter-nodelay", "trivial"),
    "local tool call / floor":
        ("hermes-local", "tool_call", "floor", "trivial"),
    "local new session, warm pool / jupyter":
        ("hermes-local-warm", "spawn", "jupyter-nodelay", "spawn"),
    "local new session, environment's warm pool / jupyter":
        ("hermes-local-env-warm", "spawn", "jupyter-nodelay", "spawn"),
    "local 1 MB one print / jupyter":
        ("hermes-local", "1mb_one_line", "jupyter-nodelay", "1mb_one_line"),
    "local 1 MB 10k prints / jupyter":
        ("hermes-local", "1mb_10k_lines", "jupyter-nodelay", "1mb_10k_lines"),
}


def _p(sy, name, key, field):
    v = sy.get(name, {}).get(key, {})
    v = v.get(field) if isinstance(v, dict) else None
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def figures(res):
    """{figure: {"ratio", "band"}} of a run's results, those it has."""
    sy, out = res.get("systems", {}), {}
    for fig, (name, key, ref, rkey) in FIGURES.items():
        v, r = _p(sy, name, key, "p50_ms"), _p(sy, ref, rkey, "p50_ms")
        v90 = _p(sy, name, key, "p90_ms")
        if v is None or not r:
            continue
        band = max(MIN_BAND, (v90 - v) / v if v90 is not None and v > 0 else 0)
        out[fig] = {"ratio": round(v / r, 4), "band": round(band, 3)}
    return out


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def module_of(res):
    return (res.get("hermes") or {}).get("commit")


def add_run(res, path):
    """The record of path with this run's figures: added to its runs when
    the same module was measured, else in their place."""
    now, module = figures(res), module_of(res)
    try:
        with open(path) as f:
            old = json.load(f)
    except (FileNotFoundError, ValueError):
        old = {}
    same = module is not None and old.get("module") == module
    rec = {"module": module, "dates": (old.get("dates", []) if same else []) + [res.get("date")],
           "figures": {}}
    for fig, n in now.items():
        o = old.get("figures", {}).get(fig, {}) if same else {}
        runs = o.get("runs", []) + [n["ratio"]]
        bands = o.get("bands", []) + [n["band"]]
        mid = median(runs)
        spread = (max(runs) - min(runs)) / mid if mid > 0 else 0
        rec["figures"][fig] = {"ratio": round(mid, 4),
                               "band": round(max([spread] + bands), 3),
                               "runs": runs, "bands": bands}
    with open(path, "w") as f:
        json.dump(rec, f, indent=1, sort_keys=True)
        f.write("\n")
    return len(rec["dates"])


def main(argv):
    record = argv[:1] == ["--record"]
    if record:
        argv = argv[1:]
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-2:], file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        res = json.load(f)
    now = figures(res)
    if record:
        runs = add_run(res, argv[1])
        print(f"bench: {len(now)} figures recorded in {argv[1]}, "
              f"{runs} run(s) of module {module_of(res)}")
        return 0
    try:
        with open(argv[1]) as f:
            base = json.load(f).get("figures", {})
    except FileNotFoundError:
        print(f"bench: no {argv[1]} to compare with (BENCH_RECORD=1 make bench records one)")
        return 0
    worse = 0
    print("Against the recorded figures (ratios within a run; worse: over the "
          "recorded one by more than the noise band, this run's or the record's):")
    for fig in FIGURES:
        if fig not in now or fig not in base:
            continue
        n, b = now[fig], base[fig]["ratio"]
        band = max(n["band"], base[fig].get("band", 0))
        bad = n["ratio"] > b * (1 + band)
        worse += bad
        print(f"  {fig}: {n['ratio']:.4f} (recorded {b:.4f}, band {100 * band:.0f}%)"
              f"  {'WORSE' if bad else 'ok'}")
    if worse:
        print(f"bench: {worse} figure(s) worse than recorded", file=sys.stderr)
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
