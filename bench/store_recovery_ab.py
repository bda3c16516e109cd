"""The store and recovery benchmarks of two builds side by side, interleaved in one run (the
order alternated per round), so that a change (a restructure, say) is judged against the code
before it under the same machine load:
  - store: rdzv_store_bench (embedded server, the store socket) at 1, 16 and 64 clients, ops/s;
  - recovery: recovery_bench.py's scenario (one node of 3 SIGKILLed, seconds until both
    survivors run again), launch only.
  .venv/bin/python bench/store_recovery_ab.py --a OLD/build --b build --runs 5
A is the code before, B after; B/A above 1 is faster store, below 1 faster recovery.
"""
import argparse
import os
import re
import statistics
import subprocess

from recovery_bench import scenario  # this script's folder is on sys.path when it runs


def store_ops(build, clients, rounds):
    out = subprocess.run([os.path.join(build, "bin", "rdzv_store_bench"), "--clients", str(clients),
                          "--rounds", str(rounds)], capture_output=True, text=True, timeout=300,
                         check=True).stdout
    return float(re.search(r"ops_per_s=(\d+)", out).group(1))


def spread(xs):
    return f"{min(xs):.3g}-{max(xs):.3g} (median {statistics.median(xs):.3g}, {len(xs)} runs)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="build directory of the code before")
    ap.add_argument("--b", default="build", help="build directory of the code after")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--store-rounds", type=int, default=200)
    ap.add_argument("--recovery-runs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args()
    builds = {"A": args.a, "B": args.b}
    for clients in (1, 16, 64):
        res = {"A": [], "B": []}
        for i in range(args.runs):
            for k in (("A", "B") if i % 2 == 0 else ("B", "A")):
                res[k].append(store_ops(builds[k], clients, args.store_rounds))
        ratios = [b / a for a, b in zip(res["A"], res["B"])]
        print(f"store {clients:2d} clients ops/s: A {spread(res['A'])}; B {spread(res['B'])}; "
              f"B/A per pair {spread(ratios)}", flush=True)
    rec = {"A": [], "B": []}
    for i in range(args.recovery_runs):
        for k in (("A", "B") if i % 2 == 0 else ("B", "A")):
            t, why = scenario("launch", builds[k], args.timeout)
            if t is None:
                print(f"recovery {k} FAILED: {why}", flush=True)
            else:
                rec[k].append(t)
    if rec["A"] and rec["B"]:
        print(f"recovery seconds: A {spread(rec['A'])}; B {spread(rec['B'])}; "
              f"B/A of medians {statistics.median(rec['B']) / statistics.median(rec['A']):.2f}")


if __name__ == "__main__":
    main()
