"""Recovery after a node loss: `launch` against the pinned torchrun (c10d rendezvous), same
scenario, in one run.

Three agents (one Gloo worker each, --nnodes=2:3) train; once they are in step, one whole
"node" (its agent and every process below it) is SIGKILLed. Recovery time is from the kill
until both survivors have started their new workers in a 2-node world (each worker's wrapper
writes a timestamped marker before exec'ing Python). Both tools run with default rendezvous
settings; torchrun gets --max-restarts=3 because it only recovers through worker failures.

  .venv/bin/python bench/recovery_bench.py --build build --rounds 3
"""
import argparse
import glob
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from hang_detect import free_port  # this script's folder is on sys.path when it runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "python", "elastic_gloo.py")


def wrapper(dirpath):
    path = os.path.join(dirpath, "worker.sh")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n"
                "echo \"$(date +%s.%N) $WORLD_SIZE $RANK\" >> \"$MARK_DIR/spawned.$$\"\n"
                f"exec \"$PYTHON_EXEC\" {WORKER}\n")
    os.chmod(path, 0o755)
    return path


def kill_trees(pids):
    """A node crash: each agent and every process below it die at once. One look at /proc
    for all of them (one look per agent took minutes with 1,024 agents and their workers)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
                ppid = int(stat[stat.rindex(")") + 2:].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except (OSError, ValueError):
                pass
    todo = list(pids)
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_tree(pid):
    kill_trees([pid])


def spawned(mark_dir):
    out = []
    for p in glob.glob(os.path.join(mark_dir, "spawned.*")):
        for line in open(p):
            t, world, rank = line.split()
            out.append((float(t), int(world), int(rank)))
    return out


def scenario(tool, build, timeout):
    d = tempfile.mkdtemp(prefix=f"recovery-{tool}-")
    mark, ckpt = os.path.join(d, "marks"), os.path.join(d, "ckpt")
    os.makedirs(mark)
    os.makedirs(ckpt)
    port = free_port()
    # TMPDIR inside the scenario's folder: a node SIGKILLed with its watchdog cannot remove its
    # run directory, and the folder goes at the end with everything in it.
    env = dict(os.environ, MARK_DIR=mark, CKPT_DIR=ckpt, TOTAL_STEPS="100000", TMPDIR=d,
               STEP_SECONDS="0.05", PYTHON_EXEC=sys.executable, OMP_NUM_THREADS="1")
    common = ["--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
              f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=bench"]
    if tool == "launch":
        cmd = [os.path.join(build, "bin", "launch"), *common, "--log-level=warn", wrapper(d)]
    else:
        cmd = [os.path.join(os.path.dirname(sys.executable), "torchrun"), *common,
               "--max-restarts=3", "--no-python", wrapper(d)]
    agents = []
    for i in range(3):
        agents.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True))
        time.sleep(0.2)  # the first one hosts the rendezvous
    try:
        deadline = time.time() + timeout
        while time.time() < deadline:
            step = open(os.path.join(ckpt, "step")).read() if os.path.exists(os.path.join(ckpt, "step")) else "0"
            if int(step or 0) >= 20:
                break
            time.sleep(0.1)
        else:
            return None, "never got in step"
        victim = agents[2]  # not the host: the rendezvous must survive
        t_kill = time.time()
        kill_tree(victim.pid)
        while time.time() < deadline:
            new = [s for s in spawned(mark) if s[0] > t_kill and s[1] == 2]
            if len({r for _, _, r in new}) >= 2:
                return max(t for t, _, _ in new) - t_kill, ""
            time.sleep(0.02)
        return None, f"no recovery within {timeout}s"
    finally:
        for a in agents:
            kill_tree(a.pid)
            a.wait()
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args()
    res = {"launch": [], "torchrun": []}
    for _ in range(args.rounds):
        for tool in ("launch", "torchrun"):
            t, why = scenario(tool, args.build, args.timeout)
            print(f"  {tool:9s} recovery {t:.3f} s" if t is not None else f"  {tool:9s} FAILED: {why}",
                  flush=True)
            if t is not None:
                res[tool].append(t)
    med = {k: statistics.median(v) for k, v in res.items() if v}
    print(f"recovery after SIGKILL of one node of 3 ({args.rounds} interleaved rounds):")
    for k, v in med.items():
        print(f"  {k:9s} median {v:.3f} s")
    if len(med) == 2:
        print(f"  torchrun / launch = {med['torchrun'] / med['launch']:.1f}x  (target >= 10x; launch target < 1 s)")


if __name__ == "__main__":
    main()
