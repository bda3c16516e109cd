"""Hang detection: from the moment a rank hangs to a complete report with every rank's stacks,
`launch` against the pinned torchrun on the same 4-rank Gloo job, in one run.

The job (this file with --worker) trains in lockstep: a little compute and one all-reduce of a
256x256 "gradient" per step, reporting each step to launch with ddplaunch.step() (a no-op
under torchrun). After --hang-after steps, rank 2 finishes its compute and then blocks forever
on a lock before its next all-reduce (a deadlock in its own code), having written time.time()
to a file first: that is the hang's start. The other ranks wait for it inside the all-reduce.
The process group keeps torch's default timeout (30 min for Gloo), as users run it.

Measured for launch (--hang-timeout T, or the automatic limit with --auto):
  detect  hang start -> launch's first "is hung" log line (the log's own timestamp)
  stacks  that line -> the last of the 4 stacks.txt files written (mtime); the report names them
  report  hang start -> the last "rank N stack (...)" line: the console report is complete
  exit    hang start -> launch's exit (124 once out of restarts)
Checked each run: exit code 124, the culprit line and the root cause name rank 2, 4 stacks
files, rank 2's shows the Python frame where it blocks (deadlock_before_allreduce), the others
show all_reduce, and no process of the run is left (every process of a run carries a tag in
its environment; /proc is scanned for it after each run).

torchrun has no hang detection: its ranks wait in the collective until Gloo's timeout. The run
is capped (--cap seconds): torchrun gets SIGTERM at the cap (its own clean-up), then anything
of the run still alive 30 s later is SIGKILLed. Reported as "more than CAP s, no stacks".

Also the heartbeat's cost per call, with the exact commands of docs/benchmarks.md (the C++
build/bench/heartbeat_bench when it was built, and the Python one-liner through timeit), and
ddplaunch.step() on a memfd as launch gives it.

  .venv/bin/python bench/hang_detect.py --build build --rounds 5 --hang-timeout 5 --cap 180
"""
import argparse
import glob
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HANG_RANK = 2
TAG_VAR = "DDPL_HANG_BENCH_TAG"
BLOCK_FUNCTION = "deadlock_before_allreduce"
# The checkout's ddplaunch, ahead of any installed one: the bench measures the code beside it.
PYTHON_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")


# ---------------------------------------------------------------------------------------------
# The job (one rank), run by launch or torchrun as `hang_detect.py --worker`.

def deadlock_before_allreduce(mark_path):
    """Rank HANG_RANK's bug: takes a lock it already holds, before its next all-reduce."""
    with open(mark_path + ".tmp", "w") as f:
        f.write(repr(time.time()))
    os.rename(mark_path + ".tmp", mark_path)
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()  # never returns


def worker():
    import torch
    import torch.distributed as dist

    sys.path.insert(0, PYTHON_DIR)
    import ddplaunch

    dist.init_process_group("gloo")  # torch's default timeout (30 min), as users run it
    rank = dist.get_rank()
    hang_after = int(os.environ["HANG_AFTER"])
    mark = os.environ["HANG_MARK"]
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    torch.manual_seed(rank)
    w = torch.randn(256, 256)
    x = torch.randn(64, 256)
    step = 0
    while True:
        step += 1
        y = torch.tanh(x @ w)
        grad = (x.t() @ y).flatten()
        if first_attempt and rank == HANG_RANK and step == hang_after + 1:
            deadlock_before_allreduce(mark)
        dist.all_reduce(grad)
        w -= 1e-4 * grad.view(256, 256) / dist.get_world_size()
        time.sleep(0.02)
        ddplaunch.step(step)


# ---------------------------------------------------------------------------------------------
# The driver.

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def tagged(tag, var=TAG_VAR):
    """Pids of live processes whose environment carries the run's tag (`var`=`tag`)."""
    needle = f"{var}={tag}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    with open(f"/proc/{entry}/stat") as s:
                        state = s.read().rsplit(")", 1)[1].split()[0]
                    if state != "Z":
                        out.append(int(entry))
        except (OSError, IndexError):
            pass
    return out


def kill_tagged(tag):
    pids = tagged(tag)
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def log_time(line):
    """Unix time of a launch log line: '[2026-12-01 07:13:06.981] [host launch] ...'."""
    m = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.(\d{3})\]", line)
    if not m:
        return None
    return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1e3


class Run:
    """One job under one tool, its stderr read line by line as it comes."""

    def __init__(self, cmd, env, workdir):
        self.lines = []  # (arrival time, line)
        self.out = open(os.path.join(workdir, "stdout.log"), "wb")
        self.t_start = time.time()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.out, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in self.proc.stderr:
            self.lines.append((time.time(), raw.decode(errors="replace").rstrip("\n")))

    def wait(self, until):
        while time.time() < until:
            try:
                return self.proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass
        return None

    def wait_past_hang(self, mark, limit):
        """Waits for the job's exit, at most `limit` s from its hang (read from `mark`; from
        120 s after the start while it has not hung: start-up varies with the machine's load).
        Returns (exit code or None, the hang's start or None, when the wait ended)."""
        t_hang = None
        while True:
            t_hang = t_hang or read_mark(mark)
            deadline = (t_hang or self.t_start + 120) + limit
            rc = self.wait(min(deadline, time.time() + 0.5))
            if rc is not None or time.time() >= deadline:
                break
        t_end = time.time()
        return rc, t_hang or read_mark(mark), t_end

    def kill(self, tag):
        """Whatever of the run is still alive: the tool, then every process with its tag."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        kill_tagged(tag)

    def finish(self):
        self.reader.join(timeout=5)
        self.out.close()
        text = "\n".join(l for _, l in self.lines)
        with open(os.path.join(os.path.dirname(self.out.name), "stderr.log"), "w") as f:
            f.write(text + "\n")
        return text


def read_mark(path):
    try:
        return float(open(path).read())
    except (OSError, ValueError):
        return None


def launch_round(args, env, tag, workdir):
    mark = os.path.join(workdir, "hang_start")
    logdir = os.path.join(workdir, "logs")
    env = dict(env, HANG_MARK=mark)
    cmd = [os.path.join(args.build, "bin", "launch"), f"--nproc-per-node={args.nproc}",
           f"--log-dir={logdir}"]
    if not args.auto:
        cmd.append(f"--hang-timeout={args.hang_timeout:g}")
    cmd += [os.path.abspath(__file__), "--worker"]
    limit = (600 + 60) if args.auto else args.cap
    r = Run(cmd, env, workdir)
    res = {"tool": "launch", "problems": []}
    try:
        rc, t_hang, t_exit = r.wait_past_hang(mark, limit)
        if rc is None:
            res["problems"].append(f"no exit within {limit} s of the hang: SIGTERM")
            r.proc.send_signal(signal.SIGTERM)
            r.wait(time.time() + 40)
        text = r.finish()
        left = kill_tagged(tag)
        if left:
            res["problems"].append(f"{len(left)} process(es) of the run outlived launch: {left}")
    finally:
        r.kill(tag)
    res["rc"] = rc
    if t_hang is None:
        res["problems"].append("rank 2 never reached its hang")
        return res
    hung = [(log_time(l), l) for _, l in r.lines if " is hung: " in l]
    stack_lines = [log_time(l) for _, l in r.lines if re.search(r"\] rank \d+ stack \(", l)]
    if rc != 124:
        res["problems"].append(f"exit code {rc}, not 124")
    if not hung:
        res["problems"].append("no 'is hung' line")
        return res
    t_detect = min(t for t, _ in hung)
    arrived = min(a for a, l in r.lines if " is hung: " in l)
    if abs(arrived - t_detect) > 0.5:  # the log's clock against ours, read as it came
        res["problems"].append(f"log time and arrival differ by {arrived - t_detect:.2f} s")
    res["detect"] = t_detect - t_hang
    res["hung_ranks"] = sorted(int(re.search(r"\] rank (\d+) ", l).group(1)) for _, l in hung)
    files = sorted(glob.glob(os.path.join(logdir, "*", "attempt_0", "*", "stacks.txt")))
    res["stack_files"] = len(files)
    if files:
        res["stacks"] = max(os.stat(f).st_mtime for f in files) - t_detect
    if stack_lines:
        res["report"] = max(stack_lines) - t_hang
    res["exit"] = t_exit - t_hang
    if len(files) != args.nproc:
        res["problems"].append(f"{len(files)} stacks files, not {args.nproc}")
    culprit = re.search(r"likely culprit: rank\(s\) ([\d, ]+)", text)
    res["culprit"] = culprit.group(1).strip() if culprit else None
    if res["culprit"] != str(HANG_RANK):
        res["problems"].append(f"culprit named: {res['culprit']}")
    root = text.split("Root Cause", 1)[-1]
    if not re.search(rf"rank\s*:\s*{HANG_RANK} \(local_rank: {HANG_RANK}\)", root):
        res["problems"].append("the root cause is not rank 2")
    for f in files:
        lr = int(os.path.basename(os.path.dirname(f)))
        body = open(f).read()
        if lr == HANG_RANK:
            m = re.search(rf"{BLOCK_FUNCTION} \(([^)]*)\)", body)
            res["frame"] = f"{BLOCK_FUNCTION} ({os.path.basename(m.group(1))})" if m else None
            if not m:
                res["problems"].append(f"rank 2's stacks lack {BLOCK_FUNCTION}: {body[:300]!r}")
        elif "all_reduce" not in body:
            res["problems"].append(f"rank {lr}'s stacks lack all_reduce: {body[:300]!r}")
    return res


def torchrun_round(args, env, tag, workdir):
    mark = os.path.join(workdir, "hang_start")
    env = dict(env, HANG_MARK=mark)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, f"--nproc-per-node={args.nproc}", f"--master-port={free_port()}",
           os.path.abspath(__file__), "--worker"]
    r = Run(cmd, env, workdir)
    res = {"tool": "torchrun", "problems": []}
    try:
        rc, t_hang, t_end = r.wait_past_hang(mark, args.cap)
        if rc is None:  # the cap: torchrun's own clean-up first
            r.proc.send_signal(signal.SIGTERM)
            rc_term = r.wait(time.time() + 30)
            res["after_sigterm"] = "exited" if rc_term is not None else "still running after 30 s"
            left = tagged(tag)
            res["left_after_own_cleanup"] = len(left)
            killed = kill_tagged(tag)
            if killed:
                res["problems"].append(f"SIGKILLed {len(killed)} process(es) left after SIGTERM")
        text = r.finish()
    finally:
        r.kill(tag)
    res["rc"] = rc
    res["capped"] = rc is None
    if t_hang is None:
        res["problems"].append("rank 2 never reached its hang")
        return res
    res["waited"] = t_end - t_hang
    stacks = glob.glob(os.path.join(workdir, "**", "stacks*"), recursive=True)
    res["stack_files"] = len(stacks)
    res["mentions_rank2"] = bool(re.search(r"rank\s*:?\s*2\b", text))
    return res


def fmt_launch(i, r, limit):
    if "detect" not in r:
        return f"  round {i}: launch FAILED: {'; '.join(r['problems'])}"
    s = (f"  round {i}: launch  detect {r['detect']:6.2f} s  stacks {r.get('stacks', float('nan')):5.2f} s"
         f" ({r['stack_files']} files)  report {r.get('report', float('nan')):6.2f} s"
         f"  exit {r['rc']} at {r['exit']:6.2f} s; hung: ranks {','.join(map(str, r['hung_ranks']))},"
         f" culprit rank {r['culprit']}, rank 2 in {r.get('frame')}")
    if r["problems"]:
        s += "\n    PROBLEMS: " + "; ".join(r["problems"])
    return s


def spread(v):
    return f"median {statistics.median(v):6.2f} s   min {min(v):6.2f} s   max {max(v):6.2f} s"


def heartbeat_cost(build):
    print("heartbeat cost per call (docs/benchmarks.md's commands):", flush=True)
    hb = os.path.join(build, "bench", "heartbeat_bench")
    if os.access(hb, os.X_OK):
        out = subprocess.run([hb], capture_output=True, text=True).stdout.strip()
        print(f"  {hb}: {out}")
    else:
        print(f"  {hb}: not built (configure with -DDDPL_BUILD_BENCH=ON)")
    out = subprocess.run(
        [sys.executable, "-m", "timeit", "-s",
         'import os; hb = os.memfd_create("hb"); os.ftruncate(hb, 64); step = 12345',
         'hb >= 0 and os.pwrite(hb, step.to_bytes(8, "little"), 0)'],
        capture_output=True, text=True).stdout.strip()
    print(f"  python -m timeit (the one-liner): {out}", flush=True)
    out = subprocess.run(
        [sys.executable, "-m", "timeit", "-s",
         f'import os, sys; sys.path.insert(0, {PYTHON_DIR!r}); hb = os.memfd_create("hb"); '
         'os.ftruncate(hb, 64); os.environ["DDPL_HEARTBEAT_FD"] = str(hb); import ddplaunch; '
         'assert ddplaunch.enabled()',
         'ddplaunch.step()'],
        capture_output=True, text=True).stdout.strip()
    print(f"  python -m timeit (ddplaunch.step()): {out}", flush=True)


def main():
    if "--worker" in sys.argv[1:]:
        return worker()
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=5, help="launch runs")
    ap.add_argument("--torchrun-rounds", type=int, default=1)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--hang-timeout", type=float, default=5)
    ap.add_argument("--auto", action="store_true",
                    help="launch without --hang-timeout: the automatic limit (600 s floor)")
    ap.add_argument("--hang-after", type=int, default=20, help="steps before rank 2 hangs")
    ap.add_argument("--cap", type=float, default=180, help="seconds torchrun may wait")
    ap.add_argument("--no-heartbeat", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep each run's directory")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that clean-up runs

    base = dict(os.environ, OMP_NUM_THREADS="1", PYTHON_EXEC=sys.executable,
                HANG_AFTER=str(args.hang_after))
    mode = "automatic limit" if args.auto else f"--hang-timeout {args.hang_timeout:g}"
    limit = None if args.auto else args.hang_timeout
    print(f"hang detection: {args.nproc} Gloo ranks, rank {HANG_RANK} deadlocks after "
          f"{args.hang_after} steps; launch {mode}, {args.rounds} runs; torchrun "
          f"{args.torchrun_rounds} run(s) capped at {args.cap:g} s", flush=True)
    results = {"launch": [], "torchrun": []}
    tags = []
    workdir = None
    try:
        for i in range(max(args.rounds, args.torchrun_rounds)):
            for tool in ("launch", "torchrun"):
                if (tool == "launch" and i >= args.rounds) or \
                   (tool == "torchrun" and i >= args.torchrun_rounds):
                    continue
                tag = uuid.uuid4().hex
                tags.append(tag)
                workdir = tempfile.mkdtemp(prefix=f"hangbench-{tool}-")
                env = dict(base, **{TAG_VAR: tag})
                if tool == "launch":
                    r = launch_round(args, env, tag, workdir)
                    print(fmt_launch(i + 1, r, limit), flush=True)
                else:
                    r = torchrun_round(args, env, tag, workdir)
                    if r.get("capped"):
                        print(f"  round {i + 1}: torchrun no report after {r['waited']:.1f} s "
                              f"(capped), {r['stack_files']} stacks files, rank 2 named: "
                              f"{r['mentions_rank2']}; at SIGTERM: {r['after_sigterm']}, "
                              f"{r['left_after_own_cleanup']} process(es) left after its "
                              f"clean-up", flush=True)
                    else:
                        print(f"  round {i + 1}: torchrun exited {r['rc']} "
                              f"{r.get('waited', float('nan')):.1f} s after the hang "
                              f"(problems: {r['problems']})", flush=True)
                results[tool].append(r)
                if args.keep:
                    print(f"    kept {workdir}")
                else:
                    subprocess.run(["rm", "-rf", workdir])
                workdir = None
    finally:
        left = [p for t in tags for p in kill_tagged(t)]
        if workdir and not args.keep:  # interrupted in the middle of a run
            subprocess.run(["rm", "-rf", workdir])
    ok = [r for r in results["launch"] if "detect" in r]
    print(f"summary ({len(ok)} of {len(results['launch'])} launch runs measured):")
    if ok:
        target = f"target <= {limit + 2:g} s" if limit else "target: the automatic limit + 2 s"
        print(f"  launch detect  {spread([r['detect'] for r in ok])}   ({target})")
        st = [r["stacks"] for r in ok if "stacks" in r]
        if st:
            print(f"  launch stacks  {spread(st)}   (4 ranks; target < 5 s)")
        rp = [r["report"] for r in ok if "report" in r]
        if rp:
            print(f"  launch report  {spread(rp)}   (hang -> every rank's stack printed)")
        print(f"  launch exit    {spread([r['exit'] for r in ok])}   (hang -> exit 124)")
        bad = sum(1 for r in results["launch"] if r["problems"])
        print(f"  launch runs with a problem: {bad}")
    for r in results["torchrun"]:
        if r.get("capped") and ok and rp:
            print(f"  torchrun       more than {args.cap:g} s, no stacks "
                  f"(> {args.cap / statistics.median(rp):.0f}x launch's report time)")
    print(f"  processes of the runs left at the end: {len(left)}")
    if not args.no_heartbeat:
        heartbeat_cost(args.build)


if __name__ == "__main__":
    sys.exit(main())
