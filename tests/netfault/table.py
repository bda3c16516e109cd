#!/usr/bin/env python3
"""The figures table of docs/network-faults.md: runs every scenario of scenarios.py RUNS times
(one at a time, as root) and prints one markdown row per scenario, each figure as its median and
its range over the runs.

    sudo .venv/bin/python tests/netfault/table.py --build build --runs 3

--from DIR reads the results (SCENARIO-N.json) of earlier runs instead of running them.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from scenarios import SCENARIOS  # noqa: E402

COLUMNS = [("detection_s", "detection (s)"), ("reformation_s", "re-formation (s)"),
           ("steps_lost", "steps lost"), ("restarts", "restarts used")]
# Per scenario, what else it measured that says whether it held.
_REJOINED = [("rejoin_after_heal_s", "back in a round after the heal (s)")]
_FENCED_FIRST = [("n3_stopped_s", "cut node's workers last seen (s)"),
                 ("new_round_formed_s", "round without it started (s)")]
_TRAINED_THROUGH = [("steps_during_isolation", "steps during the isolation")]
EXTRA = {"server_isolated": _TRAINED_THROUGH,
         "latency_loss": [("mean_step_s", "mean step (s)")],
         "partition_then_crash": _FENCED_FIRST,
         "server_partition": _REJOINED,
         "stale_write": _REJOINED,
         "oneway_partition": _REJOINED,
         "etcd_leader_isolated": [("new_leader_s", "new etcd leader after (s)")] + _TRAINED_THROUGH,
         "etcd_partition": _REJOINED,
         "etcd_partition_then_crash": _FENCED_FIRST}


def spread(values, unit=""):
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    med = statistics.median(values)
    fmt = (lambda v: f"{v:g}") if all(float(v).is_integer() for v in values) else \
        (lambda v: f"{v:.1f}")
    if min(values) == max(values):
        return fmt(med) + unit
    return f"{fmt(med)}{unit} ({fmt(min(values))}–{fmt(max(values))})"


def run_all(args, out):
    for i in range(1, args.runs + 1):
        for name in args.scenarios:
            path = os.path.join(out, f"{name}-{i}.json")
            print(f"run {i}/{args.runs}: {name}", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, os.path.join(HERE, "scenarios.py"), "--build",
                            args.build, "--source", args.source, "--python", args.python,
                            "--json", path, name], stdout=subprocess.DEVNULL, check=False,
                           timeout=600)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--source", default=os.path.dirname(os.path.dirname(HERE)))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--from", dest="source_dir", help="read SCENARIO-N.json here; run nothing")
    ap.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    args = ap.parse_args()
    out = args.source_dir
    if not out:
        out = tempfile.mkdtemp(prefix="netfault-table-")
        run_all(args, out)
    print("| scenario | runs | passed | " + " | ".join(c[1] for c in COLUMNS) +
          " | invariant violations | also |")
    print("|---|---|---|" + "---|" * len(COLUMNS) + "---|---|")
    for name in args.scenarios:
        results = []
        for path in sorted(glob.glob(os.path.join(out, f"{name}-*.json"))):
            with open(path) as f:
                results.append(json.load(f))
        if not results:
            continue
        cells = [spread([r["figures"].get(key) for r in results]) for key, _ in COLUMNS]
        passed = sum(1 for r in results if r.get("passed"))
        violations = sum(len(r.get("violations", [])) for r in results)
        also = "; ".join(f"{label} {spread([r['figures'].get(key) for r in results])}"
                         for key, label in EXTRA.get(name, []))
        print(f"| {name} | {len(results)} | {passed}/{len(results)} | " + " | ".join(cells) +
              f" | {violations} | {also} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
