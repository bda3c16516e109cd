#!/usr/bin/env python3
"""Does an open dashboard cost the job steps? (issue 32: 200 open pages, the step rate unchanged
within noise.)

A 1-rank job of CPU-bound steps (pure Python, one core) runs --seconds under `launch
--dashboard`, with no page open, then with --pages clients each fetching /api/job once a second
as the page does (a process of their own at nice 19: on a 2-core machine the pages' own CPU
must not be what slows the rank; browsers run elsewhere). Rounds alternate; each pair's steps
with pages / without is one ratio; the spread of the ratios is the noise.

    .venv/bin/python bench/dashboard_pages.py --build build --rounds 3 --pages 200
"""
import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, os.path.join(%r, "python"))
    import ddplaunch
    end = time.monotonic() + float(os.environ["BENCH_SECONDS"])
    steps = 0
    while time.monotonic() < end:
        sum(i * i for i in range(20000))
        steps += 1
        ddplaunch.step()
    print("steps", steps, flush=True)
""") % os.path.dirname(HERE)

POLLER = textwrap.dedent("""
    import sys, threading, time, urllib.request
    url, pages, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    done = {"ok": 0, "err": 0}
    lock = threading.Lock()
    def page(i):
        time.sleep(i / pages)  # spread over the second, as pages opened at random times are
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    r.read()
                k = "ok"
            except Exception:
                k = "err"
            with lock:
                done[k] += 1
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
    ts = [threading.Thread(target=page, args=(i,), daemon=True) for i in range(pages)]
    for t in ts: t.start()
    for t in ts: t.join()
    print("requests", done["ok"], "failed", done["err"], flush=True)
""")


def one_round(args, pages, job_file):
    env = dict(os.environ, PYTHON_EXEC=sys.executable, BENCH_SECONDS=str(args.seconds),
               OMP_NUM_THREADS="1")
    log = tempfile.NamedTemporaryFile(prefix="ddpl-dash-bench-", delete=False)
    proc = subprocess.Popen([os.path.join(args.build, "bin", "launch"), "--dashboard",
                             "--nproc-per-node=1", "--monitor=off", job_file],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    poller = None
    try:
        url = None
        deadline = time.time() + 30
        while url is None and time.time() < deadline:
            m = re.search(r"dashboard of the job on (http://\S+/) ", open(log.name).read())
            url = m.group(1) if m else None
            time.sleep(0.05)
        if url is None:
            raise RuntimeError("launch printed no dashboard address:\n" + open(log.name).read())
        if pages:
            poller = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", POLLER,
                                       url + "api/job", str(pages), str(args.seconds - 1)],
                                      stdout=subprocess.PIPE, text=True)
        proc.wait(args.seconds + 60)
        out = open(log.name).read()
        steps = int(re.search(r"steps (\d+)", out).group(1))
        served = poller.communicate(timeout=60)[0].strip() if poller else ""
        return steps, served
    finally:
        for p in (proc, poller):
            if p and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL) if p is proc else p.kill()
        os.unlink(log.name)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pages", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=15)
    args = ap.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(JOB)
        job_file = f.name
    ratios = []
    try:
        for r in range(args.rounds):
            base, _ = one_round(args, 0, job_file)
            loaded, served = one_round(args, args.pages, job_file)
            ratios.append(loaded / base)
            print(f"round {r + 1}: no page {base} steps, {args.pages} pages {loaded} steps "
                  f"({served}): {loaded / base:.3f}", flush=True)
    finally:
        os.unlink(job_file)
    print(f"steps with {args.pages} pages / without: median {statistics.median(ratios):.3f}, "
          f"range {min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} rounds")


if __name__ == "__main__":
    main()
