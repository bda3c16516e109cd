#!/usr/bin/env python3
"""What a CTest run of this project did not run, and whether that may pass (scripts/test.sh).

    test_report.py --build BUILD --junit JUNIT.xml [--pass main|asan|tsan] [--left-out F,...]
                   [--report FILE]

Two checks, after `ctest --output-junit JUNIT.xml` in BUILD:
- Every test that did not run is listed with its reason: skipped (GTEST_SKIP, exit code 77 under
  SKIP_RETURN_CODE, a Python test file's skipped test: tests/common/python_test_main.py),
  disabled, or not run (no executable). One that tests/allowed_skips.txt does not allow for this
  pass fails the run.
- Every test program and script test of tests/suites.txt is registered in BUILD, unless it needs
  a part that this pass leaves out on purpose (--left-out: the sanitizers' trees are configured
  without LibTorch and with only the programs they run). A suite missing because a part was not
  found (build/ddpl_features.txt, written by CMake, says which and why) fails the run, naming
  what to do; so does a registered one that tests/suites.txt does not know (keep it complete), and
  a Python test registered without SKIP_RETURN_CODE 77 (its skips would count as passes).

Exit 0 when both hold, 1 otherwise. Python 3 standard library only; a second or less.
"""
import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What each optional part's absence takes, and how to get it back, where CMake gave no reason.
HOW_TO_GET = {
    "torch": "LibTorch (make setup installs torch into .venv; then `make clean test`: the first "
             "configure takes CMAKE_PREFIX_PATH from .venv)",
    "mpi": "OpenMPI (make setup installs libopenmpi-dev and openmpi-bin; then `make clean test`)",
    "grpc": "gRPC (a tree configured with -DDDPL_WITH_GRPC=ON, the default)",
    "metrics": "prometheus-cpp (make setup installs prometheus-cpp-dev; then `make clean test`)",
    "full": "the whole suite (a tree configured without -DDDPL_SANITIZED_SUBSET=ON)",
}


def read_table(path):
    """Lines of a whitespace-separated table, comments (#) and blank lines left out."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if line:
                rows.append((n, line.split()))
    return rows


def read_suites(path):
    """{suite: set of parts it needs} from tests/suites.txt ("name part part ...")."""
    suites = {}
    for n, fields in read_table(path):
        unknown = set(fields[1:]) - set(HOW_TO_GET)
        if unknown:
            sys.exit(f"{path}:{n}: unknown part(s) {sorted(unknown)}; known: {sorted(HOW_TO_GET)}")
        suites[fields[0]] = set(fields[1:])
    return suites


def read_allowed(path, this_pass):
    """[(pattern, why)] that may not run in this pass, from tests/allowed_skips.txt
    ("PASS PATTERN WHY...", PASS one of any|main|asan|tsan)."""
    allowed = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            fields = line.split(None, 2)
            if len(fields) < 3 or fields[0] not in ("any", "main", "asan", "tsan"):
                sys.exit(f"{path}:{n}: want 'any|main|asan|tsan TEST-PATTERN WHY', got: "
                         f"{line.strip()}")
            if fields[0] in ("any", this_pass):
                allowed.append((fields[1], fields[2].strip()))
    return allowed


def read_features(build):
    """{part: (on, why)} from BUILD/ddpl_features.txt ("part ON|OFF why...")."""
    features = {}
    path = os.path.join(build, "ddpl_features.txt")
    if not os.path.exists(path):
        return features
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split(" ", 2)
            if len(fields) >= 2:
                features[fields[0]] = (fields[1] == "ON", fields[2] if len(fields) > 2 else "")
    return features


def registered(build):
    """{suite: [test names]} and the Python tests without SKIP_RETURN_CODE 77, from
    `ctest --show-only=json-v1`. A GoogleTest case's suite is its program's name; a script
    test's is its own name; <program>_NOT_BUILT (gtest_discover_tests without the program)
    stands for the program."""
    out = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        sys.exit(f"ctest --show-only in {build} failed: {out.stderr.strip()}")
    suites, no_skip_code = {}, []
    for t in json.loads(out.stdout).get("tests", []):
        name, command = t["name"], t.get("command") or []
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        if any(a.startswith("--gtest_filter=") for a in command[1:]):
            suite = os.path.basename(command[0])
        elif name.endswith("_NOT_BUILT"):
            suite = name[: -len("_NOT_BUILT")]
        else:
            suite = name
        suites.setdefault(suite, []).append(name)
        if any(a.endswith(".py") for a in command[1:]) and props.get("SKIP_RETURN_CODE") != 77:
            no_skip_code.append(name)
    return suites, no_skip_code


def skip_reason(case):
    """Why a test case of CTest's JUnit file did not run, from its output."""
    status = case.get("status")
    out = (case.findtext("system-out") or "").replace("\r", "")
    if status == "disabled":
        return "disabled"
    skipped = case.find("skipped")
    ctest_says = skipped.get("message", "") if skipped is not None else ""
    if ctest_says == "Unable to find executable":
        return "not run: " + out.strip().splitlines()[-1] if out.strip() else "not run: no executable"
    # GoogleTest: "file:line: Skipped" then the message, up to "[  SKIPPED ]".
    m = re.search(r"^\S+: Skipped\n(.*?)^\[  SKIPPED \]", out, re.M | re.S)
    if m:
        return " ".join(m.group(1).split()) or "GTEST_SKIP() without a message"
    # Scripts: "SKIP: why" lines (tests/common/python_test_main.py, the shell and netfault tests).
    lines = [l.strip() for l in out.splitlines() if l.strip()]
    marked = [l for l in lines if l.startswith("SKIP:") or re.search(r"\bskipped:", l)]
    if marked:
        return "; ".join(marked)
    last = lines[-1] if lines else "no output"
    return f"{ctest_says or status}: {last}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--junit", required=True)
    ap.add_argument("--pass", dest="this_pass", default="main", choices=["main", "asan", "tsan"])
    ap.add_argument("--left-out", default="", help="parts this pass leaves out on purpose")
    ap.add_argument("--allowed", default=os.path.join(ROOT, "tests", "allowed_skips.txt"))
    ap.add_argument("--suites", default=os.path.join(ROOT, "tests", "suites.txt"))
    ap.add_argument("--filtered-ok", action="store_true",
                    help="registered tests that ctest was told to leave out (-E) may be absent")
    ap.add_argument("--report", help="also write the report to this file")
    args = ap.parse_args()
    left_out = {p for p in args.left_out.split(",") if p}
    lines, bad, skips_not_ok = [], False, 0

    # What did not run.
    allowed = read_allowed(args.allowed, args.this_pass)
    try:
        cases = list(ET.parse(args.junit).getroot().iter("testcase"))
    except (OSError, ET.ParseError) as e:
        cases = []
        lines.append(f"cannot read CTest's JUnit file {args.junit}: {e}")
        bad = True
    not_run = [c for c in cases if c.get("status") in ("notrun", "disabled")]
    ran = len(cases) - len(not_run)
    title = {"main": "the suite", "asan": "the ASan suite", "tsan": "the TSan suite"}[args.this_pass]
    if not_run:
        lines.append(f"{len(not_run)} test(s) of {title} did not run ({ran} ran):")
    for c in sorted(not_run, key=lambda c: c.get("name")):
        name, why = c.get("name"), skip_reason(c)
        ok = next((w for p, w in allowed if fnmatch.fnmatchcase(name, p)), None)
        if ok:
            lines.append(f"  allowed  {name}: {why}\n           (tests/allowed_skips.txt: {ok})")
        else:
            bad = True
            skips_not_ok += 1
            lines.append(f"  NOT OK   {name}: {why}")

    # What is not registered.
    first_suite_line = len(lines)
    expected = read_suites(args.suites)
    features = read_features(args.build)
    if not features:
        lines.append(f"  {args.build}/ddpl_features.txt is missing (a tree configured before it "
                     "existed): the parts a missing suite needs cannot be named; configure again")
    suites, no_skip_code = registered(args.build)
    not_built = sorted(s for s, names in suites.items() if any(n.endswith("_NOT_BUILT")
                                                               for n in names))
    if not_built:
        bad = True
        lines.append(f"  NOT OK   {len(not_built)} program(s) registered but not built (make build): "
                     + ", ".join(not_built))
    by_cause = {}  # the parts found missing -> the suites they leave out
    for suite, needs in sorted(expected.items()):
        if suite in suites or needs & left_out:
            continue  # registered, or left out on purpose by this pass
        missing = tuple(p for p in sorted(needs) if not features.get(p, (True, ""))[0])
        by_cause.setdefault(missing, []).append(suite)
    for missing, names in sorted(by_cause.items()):
        bad = True
        if missing:
            why = "; ".join(f"{p} is off ({features[p][1] or 'no reason given'})" for p in missing)
            get = "; ".join(HOW_TO_GET[p] for p in missing)
            lines.append(f"  NOT OK   {len(names)} suite(s) not registered: {why}. To get them: "
                         f"{get}.\n           {', '.join(names)}")
        else:
            lines.append(f"  NOT OK   {len(names)} suite(s) not registered, though every part they "
                         "need is here (tests/*.cmake lost them, or tests/suites.txt names what "
                         f"is gone): {', '.join(names)}")
    for suite in sorted(set(suites) - set(expected)):
        bad = True
        lines.append(f"  NOT OK   {suite} is registered but not in tests/suites.txt: add it there, "
                     "with the parts it needs")
    # Registered, yet not in the JUnit file: left out by ctest's filter (-E, -R, -L).
    in_junit = {c.get("name") for c in cases}
    absent = sorted(n for names in suites.values() for n in names if n not in in_junit)
    if absent:
        if args.filtered_ok:
            lines.append(f"  {len(absent)} registered test(s) left out of this pass on purpose "
                         "(ctest's -E or -R)")
        else:
            bad = True
            shown = ", ".join(n.split("  #")[0] for n in absent[:5]) + (
                f" and {len(absent) - 5} more" if len(absent) > 5 else "")
            lines.append(f"  NOT OK   {len(absent)} registered test(s) were not run at all: {shown}")
    for name in no_skip_code:
        bad = True
        lines.append(f"  NOT OK   {name} runs Python without SKIP_RETURN_CODE 77: its skipped tests "
                     "would count as passed (tests/common/python_test_main.py)")

    if len(lines) > first_suite_line:
        lines.insert(first_suite_line, "the registered suites:")
    head = f"== {title}: " + ("every registered suite ran, nothing skipped" if not lines else
                              "what did not run")
    problems = sum(1 for l in lines if l.startswith("  NOT OK")) - skips_not_ok
    verdict = (f"== FAILED ({title}): {skips_not_ok} test(s) did not run that "
               f"tests/allowed_skips.txt does not allow, {problems} problem(s) with the "
               "registered suites" if bad else
               f"== ok ({title}): {ran} test(s) ran" + (f"; {len(not_run)} allowed not to"
                                                       if not_run else ""))
    text = "\n".join([head] + lines + [verdict]) + "\n"
    sys.stdout.write(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
