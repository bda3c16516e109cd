"""The etcd rendezvous backend against rdzv-server (issue 14), same scenarios, in one run.

1. Rendezvous of N agents: N `launch` agents (one no-op worker each) join one job; the time
   from the first agent's start to the last worker's start (each worker writes a timestamp).
   Agents are processes, so this includes N launch start-ups on this 2-core machine, the same
   for both backends.
2. Recovery after a node's SIGKILL: bench/recovery_bench.py's scenario (3 agents, --nnodes=2:3,
   Gloo workers training; one whole node is SIGKILLed; time until both survivors' new workers
   start in a 2-node world), with each backend.

3. For each etcd join, what it cost etcd (its own /metrics, before and after): gRPC calls by
   method, watch events sent, bytes sent, per agent. These should not grow with N.

torchrun's etcd backend (`--rdzv-backend=etcd`, etcd's v2 API through the python-etcd client)
runs against the same etcd, which the benchmark starts with --enable-v2 (v3 is unaffected), when
--python-etcd names a folder holding python-etcd (it is not in the pinned environment:
`pip install --target DIR python-etcd`), for N up to --torchrun-max (each torchrun agent is a
Python process that imports torch: some 300 MB apiece).

  .venv/bin/python -m pip install --target /tmp/pyetcd python-etcd
  .venv/bin/python bench/etcd_bench.py --build build --agents 16 64 256 --rounds 3 \
      --python-etcd /tmp/pyetcd
"""
import argparse
import collections
import glob
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import recovery_bench  # noqa: E402  (the recovery scenario and its helpers)


def start_etcd(d):
    client, peer = recovery_bench.free_port(), recovery_bench.free_port()
    proc = subprocess.Popen(
        ["etcd", "--name", "b", "--data-dir", os.path.join(d, "etcd"),
         "--listen-client-urls", f"http://127.0.0.1:{client}",
         "--advertise-client-urls", f"http://127.0.0.1:{client}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"b=http://127.0.0.1:{peer}", "--log-level", "warn",
         "--enable-v2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        if subprocess.run(["etcdctl", f"--endpoints=127.0.0.1:{client}", "endpoint", "health"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
            return proc, f"127.0.0.1:{client}"
        time.sleep(0.1)
    proc.kill()
    sys.exit("etcd did not start")


def etcd_counters(endpoint):
    """etcd's own counters: gRPC calls started by method, watch events, bytes sent."""
    out = {}
    text = urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("grpc_server_started_total{"):
            method = line.split('grpc_method="')[1].split('"')[0]
            out[method] = out.get(method, 0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith(("etcd_debugging_mvcc_events_total ",
                              "etcd_debugging_lease_renewed_total ",
                              "etcd_network_client_grpc_sent_bytes_total ")):
            name, value = line.split(" ")
            out[name] = float(value)
    return out


def start_server(build):
    port = recovery_bench.free_port()
    proc = subprocess.Popen([os.path.join(build, "bin", "rdzv-server"), "--port", str(port),
                             "--log-level", "warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    time.sleep(0.5)
    return proc, f"127.0.0.1:{port}"


def join_n(build, backend, endpoint, n, job, timeout, costs=None, python_etcd=None, conf=()):
    d = tempfile.mkdtemp(prefix="etcd-bench-")
    before = etcd_counters(endpoint) if costs is not None else None
    env = dict(os.environ, MARK=d, OMP_NUM_THREADS="1")
    worker = ["/bin/sh", "-c", 'date +%s.%N > "$MARK/$RANK"']
    if backend == "torchrun-etcd":
        env["PYTHONPATH"] = python_etcd
        cmd = [os.path.join(os.path.dirname(sys.executable), "torchrun"), f"--nnodes={n}",
               "--nproc-per-node=1", "--rdzv-backend=etcd", f"--rdzv-endpoint={endpoint}",
               f"--rdzv-id={job}", "--no-python", *worker]
    else:
        cmd = [os.path.join(build, "bin", "launch"), f"--nnodes={n}", "--nproc-per-node=1",
               f"--rdzv-backend={backend}", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={job}",
               "--log-level=warn", "--monitor=off", "--preflight=off", *conf, "--no-python", *worker]
    t0 = time.time()
    errors = open(os.path.join(d, "stderr"), "wb")  # kept: a failed join says why
    agents = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=errors,
                               start_new_session=True) for _ in range(n)]
    # One deadline for all: past it, the ones still running are stopped at once (waiting a
    # second for each would add N seconds to a job that did not form).
    while time.time() < t0 + timeout and any(a.poll() is None for a in agents):
        time.sleep(0.05)
    ok = all(a.poll() == 0 for a in agents)
    recovery_bench.kill_trees([a.pid for a in agents if a.poll() is None])
    for a in agents:
        a.wait()
    errors.close()
    marks = []
    for p in glob.glob(os.path.join(d, "*")):
        try:
            if "stderr" not in p:
                marks.append(float(open(p).read()))
        except ValueError:
            pass  # a worker stopped between creating its mark and writing it
    if not ok or len(marks) != n:
        # The agents' errors and warnings, most frequent first, without their timestamps.
        lines = open(os.path.join(d, "stderr"), errors="replace").read().splitlines()
        # Lease ids and numbers masked, so that one message for many agents counts as one.
        seen = collections.Counter(
            re.sub(r"\b[0-9a-f]{12,16}\b|\d+(\.\d+)?", "#", line.split("] ", 2)[-1])[:100]
            for line in lines if "[error]" in line or "[warning]" in line)
        for text, count in seen.most_common(5):
            print(f"    {backend} N={n}: {count} x {text}", flush=True)
    shutil.rmtree(d, ignore_errors=True)
    if costs is not None:
        after = etcd_counters(endpoint)
        for k, v in after.items():
            costs.setdefault(k, []).append((v - before.get(k, 0)) / n)
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
    ap.add_argument("--python-etcd", help="a folder holding python-etcd: adds torchrun's etcd backend")
    ap.add_argument("--torchrun-max", type=int, default=16,
                    help="the largest N torchrun's etcd backend is run at")
    ap.add_argument("--etcd-conf", help="--rdzv-conf for our etcd backend's joins (lease_ttl=30,...)")
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
            joins = dict(backends)
            if args.python_etcd and n <= args.torchrun_max:
                joins["torchrun etcd-v2"] = ("torchrun-etcd", etcd_ep)
            res = {k: [] for k in joins}
            costs = {}
            for r in range(args.rounds):
                for name, (backend, ep) in joins.items():
                    t = join_n(args.build, backend, ep, n, f"join-{n}-{r}-{name}", args.timeout,
                               costs if backend == "etcd" else None, args.python_etcd,
                               (f"--rdzv-conf={args.etcd_conf}",)
                               if backend == "etcd" and args.etcd_conf else ())
                    if t is not None:
                        res[name].append(t)
            line = f"  N={n:5d}"
            for name, v in res.items():
                line += (f"  {name} {statistics.median(v):6.2f} s ({min(v):.2f}-{max(v):.2f})"
                         if v else f"  {name} FAILED")
            print(line, flush=True)
            names = {"Range": "Range", "Txn": "Txn", "Put": "Put", "Watch": "Watch streams",
                     "LeaseGrant": "LeaseGrant", "LeaseKeepAlive": "keep-alive streams",
                     "etcd_debugging_lease_renewed_total": "keep-alives",
                     "etcd_debugging_mvcc_events_total":
                     "watch events", "etcd_network_client_grpc_sent_bytes_total": "bytes sent"}
            print("           etcd's work per agent, whole job (median of the runs): " + ", ".join(
                f"{label} {statistics.median(costs[k]):.1f}" for k, label in names.items()
                if k in costs), flush=True)
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
