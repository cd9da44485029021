#!/usr/bin/env python3
"""Compare `drove sim paper --json` with a real `drove bench paper` run of the same
set-up, at the points the real run did not measure CPU-bound (above 90 % busy, the
machine was measured, not drove).

    python3 bench/sim_compare.py REAL_DIR/results.csv SIM.json

Prints, per point, the real and simulated per-client MB/s and their ratio, and how
many of the points agree within 15 %.
"""
import csv
import json
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    real = {}
    with open(sys.argv[1]) as f:
        for r in csv.DictReader(f):
            if not r["system"].startswith("drove"):
                continue
            key = (r["system"], r["op"], int(r["x"]), int(r["delay_ms"]))
            real[key] = (float(r["mean_per_client_mbps"]), r["cpu_bound"] == "true")
    with open(sys.argv[2]) as f:
        sim = json.load(f)
    rows = []
    for p in sim["points"]:
        key = (p["system"], p["op"], p["x"], p["delay_ms"])
        if key not in real:
            continue
        mbps, cpu_bound = real[key]
        rows.append((key, mbps, p["mean_mbps"], cpu_bound))
    print(f"{'system':<16} {'op':<12} {'X':>3} {'delay':>5} {'real MB/s':>10} {'sim MB/s':>10} {'sim/real':>8}  real CPU-bound")
    agree = compared = 0
    for (system, op, x, delay), r, s, cpu in sorted(rows):
        ratio = s / r if r > 0 else float("nan")
        mark = ""
        if not cpu:
            compared += 1
            if abs(ratio - 1) <= 0.15:
                agree += 1
            else:
                mark = " <- off by more than 15 %"
        print(f"{system:<16} {op:<12} {x:>3} {delay:>5} {r:>10.2f} {s:>10.2f} {ratio:>8.2f}  {'yes' if cpu else 'no'}{mark}")
    print(f"\n{agree} of {compared} points not CPU-bound in the real run agree within 15 %")


if __name__ == "__main__":
    main()
