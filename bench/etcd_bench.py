"""The etcd rendezvous backend against rdzv-server (issue 14), same scenarios, in one run.

1. Rendezvous of N agents: N `launch` agents (one no-op worker each) join one job; the time
   from the first agent's start to the last worker's start (each worker writes a timestamp).
   Agents are processes, so this includes N launch start-ups on this 2-core machine, the same
   for both backends.
2. Recovery after a node's SIGKILL: bench/recovery_bench.py's scenario (3 agents, --nnodes=2:3,
   Gloo workers training; one whole node is SIGKILLed; time until both survivors' new workers
   start in a 2-node world), with each backend.

torchrun's etcd backends cannot take part: they speak etcd's v2 API (etcd 3.4 serves it only
with --enable-v2) through the python-etcd client, which the pinned environment does not have.

  .venv/bin/python bench/etcd_bench.py --build build --agents 16 64 256 --rounds 3
"""
import argparse
import glob
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import recovery_bench  # noqa: E402  (the recovery scenario and its helpers)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_etcd(d):
    client, peer = free_port(), free_port()
    proc = subprocess.Popen(
        ["etcd", "--name", "b", "--data-dir", os.path.join(d, "etcd"),
         "--listen-client-urls", f"http://127.0.0.1:{client}",
         "--advertise-client-urls", f"http://127.0.0.1:{client}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"b=http://127.0.0.1:{peer}", "--log-level", "warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        if subprocess.run(["etcdctl", f"--endpoints=127.0.0.1:{client}", "endpoint", "health"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
            return proc, f"127.0.0.1:{client}"
        time.sleep(0.1)
    proc.kill()
    sys.exit("etcd did not start")


def start_server(build):
    port = free_port()
    proc = subprocess.Popen([os.path.join(build, "bin", "rdzv-server"), "--port", str(port),
                             "--log-level", "warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    time.sleep(0.5)
    return proc, f"127.0.0.1:{port}"


def join_n(build, backend, endpoint, n, job, timeout):
    d = tempfile.mkdtemp(prefix="etcd-bench-")
    env = dict(os.environ, MARK=d, OMP_NUM_THREADS="1")
    cmd = [os.path.join(build, "bin", "launch"), f"--nnodes={n}", "--nproc-per-node=1",
           f"--rdzv-backend={backend}", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={job}",
           "--log-level=warn", "--monitor=off", "--preflight=off", "--no-python", "/bin/sh", "-c",
           'date +%s.%N > "$MARK/$RANK"']
    t0 = time.time()
    agents = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True) for _ in range(n)]
    # One deadline for all: past it, the ones still running are stopped at once (waiting a
    # second for each would add N seconds to a job that did not form).
    while time.time() < t0 + timeout and any(a.poll() is None for a in agents):
        time.sleep(0.05)
    ok = all(a.poll() == 0 for a in agents)
    for a in agents:
        if a.poll() is None:
            recovery_bench.kill_tree(a.pid)
            a.wait()
    marks = [float(open(p).read()) for p in glob.glob(os.path.join(d, "*"))]
    shutil.rmtree(d, ignore_errors=True)
    if not ok or len(marks) != n:
        return None
    return max(marks) - t0


def recovery(build, backend, endpoint, timeout, conf=()):
    """recovery_bench's scenario with `launch` on the given backend and endpoint."""
    d = tempfile.mkdtemp(prefix=f"recovery-{backend}-")
    mark, ckpt = os.path.join(d, "marks"), os.path.join(d, "ckpt")
    os.makedirs(mark)
    os.makedirs(ckpt)
    env = dict(os.environ, MARK_DIR=mark, CKPT_DIR=ckpt, TOTAL_STEPS="100000",
               STEP_SECONDS="0.05", PYTHON_EXEC=sys.executable, OMP_NUM_THREADS="1")
    cmd = [os.path.join(build, "bin", "launch"), "--nnodes=2:3", "--nproc-per-node=1",
           f"--rdzv-backend={backend}", f"--rdzv-endpoint={endpoint}",
           f"--rdzv-id=recovery-{time.time_ns()}", "--log-level=warn", *conf,
           recovery_bench.wrapper(d)]
    agents = []
    for _ in range(3):
        agents.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True))
        time.sleep(0.2)
    try:
        deadline = time.time() + timeout
        step_file = os.path.join(ckpt, "step")
        while time.time() < deadline:
            step = open(step_file).read() if os.path.exists(step_file) else "0"
            if int(step or 0) >= 20:
                break
            time.sleep(0.1)
        else:
            return None
        t_kill = time.time()
        recovery_bench.kill_tree(agents[2].pid)
        while time.time() < deadline:
            new = [s for s in recovery_bench.spawned(mark) if s[0] > t_kill and s[1] == 2]
            if len({r for _, _, r in new}) >= 2:
                return max(t for t, _, _ in new) - t_kill
            time.sleep(0.02)
        return None
    finally:
        for a in agents:
            recovery_bench.kill_tree(a.pid)
            a.wait()
        shutil.rmtree(d, ignore_errors=True)


def main():
    # Killed (timeout, Ctrl-C), it still stops etcd, the server and every agent it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--agents", type=int, nargs="*", default=[16, 64, 256])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--lease-ttl", type=int, nargs="*", default=[10, 3],
                    help="etcd lease TTLs for the recovery runs (10: the default)")
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="etcd-bench-root-")
    etcd, etcd_ep = start_etcd(d)
    server, server_ep = start_server(args.build)
    backends = {"rdzv-server": ("c10d", server_ep), "etcd": ("etcd", etcd_ep)}
    try:
        print("rendezvous of N agents (first agent's start to the last worker's start), "
              f"{args.rounds} interleaved rounds, median (min-max):")
        for n in args.agents:
            res = {k: [] for k in backends}
            for r in range(args.rounds):
                for name, (backend, ep) in backends.items():
                    t = join_n(args.build, backend, ep, n, f"join-{n}-{r}-{name}", args.timeout)
                    if t is not None:
                        res[name].append(t)
            line = f"  N={n:5d}"
            for name, v in res.items():
                line += (f"  {name} {statistics.median(v):6.2f} s ({min(v):.2f}-{max(v):.2f})"
                         if v else f"  {name} FAILED")
            print(line, flush=True)
        print(f"recovery after SIGKILL of one node of 3, {args.rounds} interleaved rounds:")
        variants = {"rdzv-server": ("c10d", server_ep, ())}
        for ttl in args.lease_ttl:
            variants[f"etcd ttl {ttl}s"] = ("etcd", etcd_ep, (f"--rdzv-conf=lease_ttl={ttl}",))
        res = {k: [] for k in variants}
        for _ in range(args.rounds):
            for name, (backend, ep, conf) in variants.items():
                t = recovery(args.build, backend, ep, args.timeout, conf)
                if t is not None:
                    res[name].append(t)
        for name, v in res.items():
            print(f"  {name:12s} " + (f"median {statistics.median(v):.3f} s "
                                      f"({min(v):.3f}-{max(v):.3f}, {len(v)} runs)" if v else "FAILED"),
                  flush=True)
    finally:
        for p in (etcd, server):
            recovery_bench.kill_tree(p.pid)
            p.wait()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
