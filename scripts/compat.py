#!/usr/bin/env python3
"""The checks of `make compat` (scripts/compat.sh, docs/compat.md) for one torch version, and
the table they make.

    compat.py check --torch V --python VENV/bin/python --launch build/bin/launch --out V.json
                    [--cxx-build build-torch-V --cxx-status ok|'failed: why'|'skipped: why']
                    [--gtest build/tests] [--install-error 'why']
    compat.py render --results DIR --doc docs/compat.md --command 'make compat ...'

`check` runs each check of the matrix against that torch (its Python for the workers, its
torchrun for the environment comparison, its LibTorch for the C++ worker program built in
--cxx-build) under launch, and writes one JSON object: the version, the date, and per check
whether it passed, with what it saw (the numbers, or the first lines that went wrong).
`render` turns every such file into the table of docs/compat.md, between its markers.

Every job runs with a time limit; a check that runs out of it fails saying so.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "python")
JOB_TIMEOUT = 300  # seconds, one launch or torchrun job on a loaded 2-core machine
BEGIN = "<!-- compat table: scripts/compat.py render writes from here -->"
END = "<!-- compat table end -->"


class Failed(Exception):
    """A check that did not pass: the message says what was seen."""


def run(argv, env=None, timeout=JOB_TIMEOUT, cwd=None):
    try:
        p = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, errors="replace", timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        return 124, out or "", (err or "") + f"\n(timed out after {timeout}s)"


def tail(text, lines=6):
    """The last lines of a job's output, for a failure's reason (one line each, short)."""
    kept = [l.strip()[:200] for l in text.strip().splitlines() if l.strip()]
    return " | ".join(kept[-lines:])


def python_error(text):
    """The last Python exception in a job's output and where it was raised, or ""."""
    errors = re.findall(r"^\s*(?:\[\w+\]:)*\s*((?:\w+\.)*\w*(?:Error|Exception)\b: .*)$", text,
                        re.M)
    if not errors:
        return ""
    frames = re.findall(r'File "([^"]+)", line (\d+)', text)
    where = ""
    if frames:
        path, line = frames[-1]
        where = f" (at {os.path.relpath(os.path.realpath(path), ROOT)}:{line})"
    return errors[-1].strip()[:300] + where


def expect(cond, what, out="", err=""):
    if not cond:
        both = out + "\n" + err
        error = python_error(both)
        if error:
            raise Failed(f"{what}: {error}")
        raise Failed(f"{what}; output: {tail(both)}" if both.strip() else what)


class Matrix:
    def __init__(self, args):
        self.torch = args.torch
        self.python = args.python
        self.launch = args.launch
        self.tmp = tempfile.mkdtemp(prefix=f"ddpl-compat-{args.torch}-")
        self.env = dict(os.environ)
        self.env.update({"PYTHON_EXEC": self.python, "OMP_NUM_THREADS": "1",
                         "PYTHONDONTWRITEBYTECODE": "1"})
        # Each job its own temporary directory (launch keeps hang stacks there): removed after.
        self.env["TMPDIR"] = self.tmp

    def launch_job(self, flags, script, args=(), extra_env=None, timeout=JOB_TIMEOUT):
        env = dict(self.env)
        env.update(extra_env or {})
        return run([self.launch] + flags + [os.path.join(SCRIPTS, script)] + list(args), env,
                   timeout)

    # --- the agent store ----------------------------------------------------------------------

    def store_conformance(self):
        """Every store call of this torch's client, errors and timeouts included, against the
        agent store and against this torch's own libuv server in the same process."""
        rc, out, err = self.launch_job(["--nproc-per-node=1"], "tcpstore_conformance.py")
        m = re.search(r"CONFORMANCE OK (\d+) checks(, [^\n]*)?", out)
        diffs = [l for l in err.splitlines() if l.startswith("DIFFERENT")]
        expect(rc == 0 and m, f"exit {rc}, {len(diffs)} different: {' | '.join(diffs[:4])}",
               out, err)
        return (f"{m.group(1)} calls, same results and error types as torch's own server"
                + (m.group(2) or ""))

    def store_checks_2_ranks(self):
        """PyTorch's own store tests (test_store.py's), from 2 ranks, then a Gloo group."""
        rc, out, err = self.launch_job(["--nproc-per-node=2"], "tcpstore_conformance_2x.py")
        sums = re.findall(r"STORE CHECKS rank=\d+ passed=(\d+)/(\d+) skipped=(\d+)", out)
        fails = [l for l in out.splitlines() if " FAIL " in l]
        skips = sorted({re.sub(r" rank=\d+", "", l.split(": ", 1)[-1])
                        for l in out.splitlines() if "CHECK " in l and " SKIP " in l})
        expect(rc == 0 and len(sums) == 2 and not fails and out.count("TRAINED rank=") == 2,
               f"exit {rc}; {' | '.join(fails[:3]) or 'no summary from both ranks'}", out, err)
        p, t, s = sums[0]
        note = f"{p}/{t} on each rank"
        if int(s):
            note += f", {s} skipped ({'; '.join(skips)})"
        return note + ", then DDP over Gloo"

    def restarts(self, ranks, kills):
        """A Gloo job SIGKILLed after its group formed, `kills` times: each restart forms its
        group through the same agent store and sees no key of the attempt before."""
        rc, out, err = self.launch_job(
            [f"--nproc-per-node={ranks}", f"--max-restarts={kills}", "--monitor-interval=0.1"],
            "agent_store_restarts.py", extra_env={"KILLS": str(kills)})
        total = sum(range(1, ranks + 1)) * ranks ** 3
        stale = [l for l in out.splitlines() if "STALE" in l]
        expect(not stale, f"a stale key: {stale[:1]}", out, err)
        expect(rc == 0, f"exit {rc}", out, err)
        done = out.count(f"ATTEMPT OK attempt={kills} ")
        expect(done == ranks, f"{done}/{ranks} ranks finished attempt {kills}", out, err)
        expect(out.count(f"sum={total}") == ranks, f"not every rank summed {total}", out, err)
        expect(f"torch TCPStore: attempt {kills} open" in err,
               f"launch did not open attempt {kills} in its store", out, err)
        return f"{kills} SIGKILL(s), {kills} restart(s), no stale key, all-reduce sum {total}"

    # --- errors and warm starts ---------------------------------------------------------------

    def record_error(self, flags=()):
        rc, out, err = self.launch_job(["--nproc-per-node=2"] + list(flags), "record_error.py")
        expect(rc == 1, f"exit {rc}, not 1", out, err)
        pos = err.find("Root Cause")
        expect(pos >= 0, "no root cause in launch's report", out, err)
        root = err[pos:]
        for want in ("rank      : 1 (local_rank: 1)",
                     "ValueError: learning rate must be positive, got -0.5", "traceback :",
                     "record_error.py"):
            expect(want in root, f"the root cause lacks '{want}'", root)
        return err

    def record(self):
        """@record writes TORCHELASTIC_ERROR_FILE; launch's report names rank 1, the exception
        and its traceback."""
        self.record_error()
        return "rank 1's ValueError and traceback from the error file in the root cause"

    def prewarm(self):
        """--prewarm=torch: workers forked from a template that imported this torch, for the
        @record script and a Gloo DDP job."""
        err = self.record_error(["--prewarm=torch"])
        cold = re.search(r"--prewarm: every worker starts cold: [^\n]*", err)
        expect(cold is None, cold.group(0) if cold else "", err)
        expect("2 of 2 worker(s) forked from the template" in err,
               "the workers were not forked from the template", "", err)
        rc, out, err = self.launch_job(["--nproc-per-node=2", "--prewarm=torch"], "ddp_gloo.py")
        expect(rc == 0 and out.count("DDP OK") == 2, f"ddp_gloo.py: exit {rc}", out, err)
        expect("2 of 2 worker(s) forked from the template" in err,
               "ddp_gloo.py's workers were not forked from the template", out, err)
        imported = re.search(r"torch imported in ([0-9.]+ ?m?s)", err)
        return ("@record and DDP workers forked from the template"
                + (f" (torch imported in {imported.group(1)})" if imported else ""))

    # --- checkpoints --------------------------------------------------------------------------

    def checkpoint(self, dcp):
        """ddplaunch.checkpoint (python/ddplaunch/checkpoint.py): 2-rank DDP killed mid-step
        resumes from launch's memory and ends with the weights of a run that never failed;
        with dcp, through its StorageWriter/StorageReader for torch.distributed.checkpoint."""
        tag = "dcp" if dcp else "plain"
        d = os.path.join(self.tmp, tag)
        extra = ["--dcp"] if dcp else []

        def job(name, more):
            return self.launch_job(
                ["--nproc-per-node=2", "--max-restarts=1"], "ckpt_train.py",
                ["--steps", "12", "--ckpt-every", "4", "--dir", os.path.join(d, name),
                 "--out", os.path.join(d, name + ".pt")] + extra + more)

        rc, out, err = job("ref", [])
        expect(rc == 0, f"the reference run: exit {rc}", out, err)
        rc, out, err = job("kill", ["--kill-at", "10:1:step"])
        expect(rc == 0, f"the killed run: exit {rc}", out, err)
        resumed = re.findall(r"resumed from step (\d+) \((memory|disk)\)", out)
        expect(len(resumed) == 2 and all(r == ("8", "memory") for r in resumed),
               f"resumed {resumed}, want step 8 from memory on both ranks", out, err)
        rc, out2, err2 = run([self.python, os.path.join(SCRIPTS, "ckpt_equal.py"),
                              os.path.join(d, "ref.pt"), os.path.join(d, "kill.pt")], self.env,
                             120)
        expect(rc == 0, "weights differ from the run that was never killed", out2, err2)
        return ("killed at step 10, both ranks resumed from step 8 in memory, "
                "final weights bit-equal to an unkilled run")

    # --- the workers' environment -------------------------------------------------------------

    def torchrun_environment(self):
        """The variables torchrun of this version gives each worker (added, changed or removed
        against the parent's environment), compared with launch's, for the same flags."""
        torchrun = os.path.join(os.path.dirname(self.python), "torchrun")
        rc, out, err = run([self.python, "-c",
                            "from torch.distributed.run import get_args_parser\n"
                            "print(' '.join(s for a in get_args_parser()._actions "
                            "for s in a.option_strings))"], self.env, 120)
        expect(rc == 0, "torchrun's options could not be read", out, err)
        virtual = "--virtual-local-rank" in out.split()
        parent = {k: v for k, v in os.environ.items()
                  if k not in ("HIP_VISIBLE_DEVICES", "OMP_NUM_THREADS", "PYTHON_EXEC",
                               "TORCHELASTIC_SIGNALS_TO_HANDLE", "CUDA_VISIBLE_DEVICES")}
        parent["PYTHONDONTWRITEBYTECODE"] = "1"
        parent["TMPDIR"] = self.tmp
        if virtual:
            parent["CUDA_VISIBLE_DEVICES"] = "3,5"
        d = os.path.join(self.tmp, "env")
        os.makedirs(d)
        flags = ["--nproc-per-node=2"] + (["--virtual-local-rank"] if virtual else [])

        def job(launcher, tag):
            return run([launcher] + flags + ["--no-python", "/bin/sh", "-c",
                                             f"env > {d}/{tag}.${{local_rank}}.env"],
                       parent, 180)

        for launcher, tag in ((torchrun, "torchrun"), (self.launch, "launch")):
            rc, out, err = job(launcher, tag)
            expect(rc == 0, f"{tag}: exit {rc}", out, err)

        def changes(path):
            env = {}
            with open(path) as f:
                for line in f:
                    k, sep, v = line.rstrip("\n").partition("=")
                    if sep:
                        env[k] = v
            out = {k: "=" + v for k, v in env.items() if parent.get(k) != v}
            out.update({k: "<unset>" for k in parent if k not in env})
            # Python's locale coercion in torchrun's process, the shell's last command,
            # launch's own variables.
            for k in [k for k in out if k in ("LC_CTYPE", "_") or k.startswith("DDPL_")]:
                del out[k]
            for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                      "TORCHELASTIC_ERROR_FILE"):
                if k in out:
                    out[k] = "<per run>"
            return out

        # Every variable torchrun of this version sets must come the same from launch; launch
        # may set more (it gives what the newest torchrun gives): those are listed.
        differences, extras = [], set()
        names = set()
        for lr in (0, 1):
            theirs = changes(f"{d}/torchrun.{lr}.env")
            ours = changes(f"{d}/launch.{lr}.env")
            names |= set(theirs)
            for k in sorted(theirs):
                if theirs[k] != ours.get(k):
                    differences.append(f"local rank {lr}: {k}: torchrun {theirs[k]}, launch "
                                       f"{ours.get(k, '(as the parent)')}")
            extras |= {f"{k}{v}" for k, v in ours.items() if k not in theirs}
        expect(not differences, "; ".join(differences[:6]))
        note = (f"all {len(names)} variables torchrun sets, the same on both ranks"
                + (" (with --virtual-local-rank)" if virtual else ""))
        if extras:
            note += f"; launch also sets {', '.join(sorted(extras))}"
        return note

    # --- the C++ worker library against this LibTorch ------------------------------------------

    def cxx_worker_rank(self, build):
        """worker_rank (the worker library's DDP against a single-process reference) built
        against this LibTorch, on 2 CPU ranks under launch."""
        program = os.path.join(build, "tests", "worker_rank")
        rc, out, err = run([self.launch, "--nproc-per-node=2", "--no-python", program,
                            "equivalence"], self.env)
        diffs = re.findall(r"max \|ddp - reference\| = (\S+)", out)
        expect(rc == 0 and len(diffs) == 2, f"exit {rc}", out, err)
        standard = ""
        with open(os.path.join(build, "compile_commands.json")) as f:
            for entry in json.load(f):
                if entry["file"].endswith("worker_rank_main.cc"):
                    m = re.search(r"-std=(\S+)", entry.get("command", ""))
                    standard = m.group(1).replace("c++", "C++") if m else ""
        return (f"built{' as ' + standard if standard else ''}; DDP equals the reference on 2 "
                f"ranks (max difference {max(diffs, key=float)})")

    # --- the test cases that skip without a newer torch -----------------------------------------

    def gtest(self, binary, case):
        rc, out, err = run([binary, f"--gtest_filter={case}"], self.env, 600)
        expect("[  SKIPPED ]" not in out, "skipped: " + tail(out, 4), out, err)
        expect(rc == 0 and "[  PASSED  ] 1 test" in out, f"exit {rc}", out, err)
        cmp = re.search(r"comparing with torch (\S+)'s torchrun", out)
        return "passed" + (f" (against torch {cmp.group(1)}'s torchrun)" if cmp else "")


def do_check(args):
    m = Matrix(args)
    result = {"torch": args.torch, "python": args.python,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "pinned": args.pinned, "checks": []}

    def record(name, fn, *a):
        if args.only and not any(o in name for o in args.only.split(",")):
            return
        start = time.monotonic()
        try:
            ok, detail = True, fn(*a)
        except Failed as e:
            ok, detail = False, str(e)
        except Exception as e:  # noqa: BLE001 - a broken check is a failed one, named
            ok, detail = False, f"{type(e).__name__}: {e}"
        took = time.monotonic() - start
        result["checks"].append({"name": name, "ok": ok, "detail": detail,
                                 "seconds": round(took, 1)})
        print(f"compat: torch {args.torch}: {name}: {'PASS' if ok else 'FAIL'} ({took:.0f}s): "
              f"{detail}", flush=True)

    def not_run(name, why):
        if args.only and not any(o in name for o in args.only.split(",")):
            return
        result["checks"].append({"name": name, "ok": None, "detail": why, "seconds": 0})
        print(f"compat: torch {args.torch}: {name}: NOT RUN: {why}", flush=True)

    if args.install_error:
        not_run("install", args.install_error)
    else:
        rc, out, err = run([args.python, "-c", "import torch; print(torch.__version__, "
                            "'yes' if torch.compiled_with_cxx11_abi() else 'no')"], m.env, 120)
        if rc == 0:
            build, abi = out.split()
            result["torch_build"] = f"{build}, C++11 ABI: {abi}"
        else:
            result["torch_build"] = f"import failed: {tail(err, 2)}"
        record("agent store conformance", m.store_conformance)
        record("store checks, 2 ranks", m.store_checks_2_ranks)
        record("2-rank Gloo, SIGKILL + restart", m.restarts, 2, 2)
        record("4-rank Gloo, SIGKILL + restart", m.restarts, 4, 1)
        record("--prewarm=torch", m.prewarm)
        record("memory checkpoint", m.checkpoint, False)
        record("DCP writer/reader", m.checkpoint, True)
        record("@record error file", m.record)
        record("worker environment vs torchrun", m.torchrun_environment)
        status = args.cxx_status or "skipped: not asked for"
        if status == "ok":
            record("C++ worker_rank (LibTorch)", m.cxx_worker_rank, args.cxx_build)
        elif status.startswith("failed"):
            result["checks"].append({"name": "C++ worker_rank (LibTorch)", "ok": False,
                                     "detail": status, "seconds": 0})
        else:
            not_run("C++ worker_rank (LibTorch)", status.split(": ", 1)[-1])
        if args.gtest:
            launcher_tests = os.path.join(args.gtest, "launcher_python_test")
            for case in ("LaunchTorchrunFlags.EveryOptionOfTheInstalledTorchrunsIsKnown",
                         "LaunchTorchrunFlags.SameWorkerEnvironmentAndFilteredLogsAsTheNewestTorchrun"):
                record(f"gtest {case}", m.gtest, launcher_tests, case)
            record("gtest AgentStore.TwoRanksPassEveryStoreCheckOfTorch215", m.gtest,
                   os.path.join(args.gtest, "agent_store_test"),
                   "AgentStore.TwoRanksPassEveryStoreCheckOfTorch215")
    shutil.rmtree(m.tmp, ignore_errors=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    failed = [c["name"] for c in result["checks"] if c["ok"] is False]
    return 1 if failed else 0


def version_key(v):
    return tuple(int(p) if p.isdigit() else 0 for p in v.split("."))


def cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def do_render(args):
    rows = []
    for name in os.listdir(args.results):
        if name.startswith("torch-") and name.endswith(".json"):
            with open(os.path.join(args.results, name)) as f:
                rows.append(json.load(f))
    rows.sort(key=lambda r: version_key(r["torch"]))
    lines = [BEGIN, "",
             f"Made by `{args.command}` (scripts/compat.sh), on a 2-core x86_64 machine, "
             f"Python {sys.version.split()[0]}, CPU only.", "",
             "| torch | date | checks passed | did not pass, and why |", "|---|---|---|---|"]
    for r in rows:
        checks = r["checks"]
        good = [c["name"] for c in checks if c["ok"]]
        bad = [f"**{c['name']}**: {c['detail']}" for c in checks if c["ok"] is False]
        bad += [f"**{c['name']}** not run: {c['detail']}" for c in checks if c["ok"] is None]
        ran = [c for c in checks if c["ok"] is not None]
        label = r["torch"] + (" (pinned)" if r.get("pinned") else "")
        passed = (f"all {len(ran)}" if len(good) == len(ran)
                  else f"{len(good)} of {len(ran)}: all but those at right")
        lines.append(f"| {label} | {r['date']} | {passed} | {cell('; '.join(bad)) or 'nothing'} |")
    lines += ["", "What each check saw:", ""]
    for r in rows:
        lines.append(f"- torch {r['torch']} ({r.get('torch_build', 'not installed')}):")
        for c in r["checks"]:
            mark = {True: "passed", False: "FAILED", None: "not run"}[c["ok"]]
            lines.append(f"  - {c['name']}: {mark} in {c['seconds']:.0f}s: {cell(c['detail'])}")
    lines += ["", END]
    with open(args.doc) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{args.doc} has no '{BEGIN}' ... '{END}' markers to write between")
    head, rest = text.split(BEGIN, 1)
    tail_ = rest.split(END, 1)[1]
    with open(args.doc, "w") as f:
        f.write(head + "\n".join(lines) + tail_)
    print(f"compat: {len(rows)} version(s) written to {args.doc}")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--torch", required=True)
    c.add_argument("--python", required=True)
    c.add_argument("--launch", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--pinned", action="store_true")
    c.add_argument("--cxx-build")
    c.add_argument("--cxx-status")
    c.add_argument("--gtest", help="the test binaries' directory: run the cases that need a "
                                   "newer torch than the pinned one")
    c.add_argument("--install-error")
    c.add_argument("--only", help="run only the checks whose names contain one of these "
                                  "comma-separated words (to rerun one)")
    r = sub.add_parser("render")
    r.add_argument("--results", required=True)
    r.add_argument("--doc", required=True)
    r.add_argument("--command", required=True)
    args = p.parse_args()
    return do_check(args) if args.cmd == "check" else do_render(args)


if __name__ == "__main__":
    sys.exit(main())
