#!/usr/bin/env bash
# The suite's flake rate at a given parallelism: runs CTest RUNS times at TEST_JOBS and tabulates
# the failures per test, so that scripts/test.sh's TEST_JOBS is chosen by measurement.
#   TEST_JOBS=4 bash scripts/flake_rate.sh build 5              # the whole suite, 5 times
#   TEST_JOBS=2 bash scripts/flake_rate.sh build 10 -L fault    # extra arguments go to ctest
# Each run's JUnit file and log stay in BUILD/Testing/flake-j<JOBS>-<time>/; the table (also in
# table.txt there) has each test that failed at least once: failures/runs, how it failed (its
# CTest status: Failed, Timeout), its slowest run against its timeout, and the runs' wall times.
# Needs a quiet machine: other work's load is what a flake rate measures otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:?usage: flake_rate.sh BUILD_DIR RUNS [ctest args...]}"
RUNS="${2:?usage: flake_rate.sh BUILD_DIR RUNS [ctest args...]}"
shift 2
JOBS="${TEST_JOBS:-4}"
OUT="$(realpath -m "$BUILD_DIR")/Testing/flake-j$JOBS-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"
echo "flake_rate: $RUNS run(s) at -j $JOBS on $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" \
  "before the first; logs in $OUT"
for i in $(seq 1 "$RUNS"); do
  start=$(date +%s)
  rc=0
  ctest --test-dir "$BUILD_DIR" -j "$JOBS" --timeout 600 --test-output-truncation middle \
    --output-junit "$OUT/run-$i.xml" "$@" >"$OUT/run-$i.log" 2>&1 || rc=$?
  echo "run $i: ctest exit $rc, $(( $(date +%s) - start )) s," \
    "$(grep -c 'Test *#.*\*\*\*\(Failed\|Timeout\|Exception\)' "$OUT/run-$i.log" || true) failed," \
    "load $(cut -d' ' -f1-3 /proc/loadavg)"
done
python3 - "$OUT" "$RUNS" "$JOBS" <<'EOF' | tee "$OUT/table.txt"
import glob, os, re, sys
import xml.etree.ElementTree as ET
out, runs, jobs = sys.argv[1], int(sys.argv[2]), sys.argv[3]
fails, kinds, slowest, seen = {}, {}, {}, set()
for path in sorted(glob.glob(os.path.join(out, "run-*.xml"))):
    for c in ET.parse(path).getroot().iter("testcase"):
        name = c.get("name")
        seen.add(name)
        slowest[name] = max(slowest.get(name, 0.0), float(c.get("time") or 0))
        if c.get("status") == "fail":
            fails[name] = fails.get(name, 0) + 1
            f = c.find("failure")
            msg = (f.get("message") if f is not None else "") or "Failed"
            kinds.setdefault(name, set()).add(msg)
# The timeouts from the logs ("***Timeout"), which the JUnit file reports as failures.
for path in glob.glob(os.path.join(out, "run-*.log")):
    for m in re.finditer(r"Test +#\d+: (\S+) \.+\*\*\*Timeout", open(path, errors="replace").read()):
        kinds.setdefault(m.group(1), set()).add("Timeout")
done = len(glob.glob(os.path.join(out, "run-*.xml")))
print(f"\n{done} run(s) of {len(seen)} test(s) at -j {jobs}: "
      f"{len(fails)} test(s) failed at least once, {sum(fails.values())} failure(s) in all")
if fails:
    print(f"{'test':60} {'failed':>8}  {'slowest':>8}  how")
    for name, n in sorted(fails.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{name:60} {n:>3}/{done:<4}  {slowest[name]:7.1f}s  {', '.join(sorted(kinds[name]))}")
EOF
