"""launch's agent store against torch's own TCPStore server, through torch's own client.

Two measurements, each side by side with the reference in one invocation, interleaved round
by round, medians; every ratio is the reference's time / ours (above 1: ours is faster).

1. Process-group bootstrap on the store, N ranks (default 8, 64, 256, 1024). Each rank is a
   thread with its own torch.distributed.TCPStore client (its calls release the GIL). Per rank,
   what c10d's bootstrap does on the store: connect; the store-based barrier of
   torch.distributed.distributed_c10d._store_based_barrier (add 1, add 0, the rank that sees N
   sets the last-worker key, everyone waits on it); rank 0 sets a 128-byte unique id, every
   other rank gets it; a final barrier. Three figures per round:
     total     from releasing all threads (connect included, overlapping the exchange as in a
               real start) until the last rank is past the final barrier;
     connect   from the same release until the last rank's client is connected;
     exchange  the same exchange again on the connected clients, from a second release until
               the last rank is done (the store's answer time without connection set-up).
   The rank threads are spread over --client-procs processes (default 4; rank r in process
   r mod P): 1024 threads under one GIL made the harness the bottleneck, and noisy. Every round
   uses fresh key names (a round prefix), and ends with the connections closed. The sides:
     torch     TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True) in a separate process;
     ours      the store launch's agent serves: the MASTER_ADDR/MASTER_PORT launch gives its
               worker (with TORCHELASTIC_USE_AGENT_STORE=True).
   To get the second, the script re-runs itself as the single worker of
   `launch --nproc-per-node=1` (--child); that worker measures both sides and prints the table.

2. Start to every rank past init_process_group("gloo"), 4 ranks on CPU: a tiny worker
   (--pg-worker) writes time.time() when it starts, once torch is imported and right after
   init_process_group returns (then a barrier, destroy_process_group, exit); the figure is from
   just before Popen to the latest rank past init_process_group, with the phases beside it
   (first rank running, torch imported, exit) and the time from the last rank done importing
   torch to every rank past the call (the rendezvous itself). launch against the pinned
   torchrun, both --standalone, and both plain (static rendezvous on a free --master-port given
   to both). Runs from the top-level process, outside launch. On this 2-core VM importing
   torch in 4 ranks is most of it, and depends on the machine's other load: torchrun starts
   each worker in a session of its own (start_new_session), launch keeps them in the caller's,
   and with the kernel's sched_autogroup on, the 4 ranks under launch then share one
   autogroup's CPU share against other sessions' work, where torchrun's get one each
   ("torch imported" shows it).

    .venv/bin/python bench/agent_store_bench.py --build build
    .venv/bin/python bench/agent_store_bench.py --build build --ranks 8 64 256 1024 2048 4096

Name lookups: torch's client asks DNS about ::ffff:127.0.0.1 at every connect, and this VM's
resolver drops part of a burst (5 s each); so, as root, the run goes into a private mount
namespace whose /etc/hosts resolves it (the comment above NS_ENV; --no-hosts-fix: not).
--ours torch puts a second torch server in our place: an A/A check of the harness.

The table at the end has the lines to paste into docs/benchmarks.md. Exit status non-zero when
any side failed (it says which and why); every blocking call has a timeout.
"""
import argparse
import json
import os
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta

T_LOADED = time.time()  # --pg-worker: when this worker's interpreter reached the script

HERE = os.path.abspath(__file__)
RESULT_TAG = "AGENT_STORE_BENCH_RESULT "
UNIQUE_ID = b"\x5a" * 128

# The reference server: torch's TCPStore master (libuv) in its own process. Prints its port,
# then lives until its stdin closes (the bench process exiting closes it too).
REF_SERVER = r"""
import os, resource, sys
from datetime import timedelta
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True, wait_for_workers=False,
                  timeout=timedelta(seconds=float(sys.argv[1])))
sys.stdout.write("%d\n" % s.port); sys.stdout.flush()
sys.stdin.read()
"""


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def fd_limit_of(pid):
    try:
        with open(f"/proc/{pid}/limits") as f:
            for line in f:
                if line.startswith("Max open files"):
                    return int(line.split()[3])
    except (OSError, ValueError, IndexError):
        pass
    return None


def med_ms(v):
    return statistics.median(v) * 1e3 if v else float("nan")


def ms_or_failed(v, digits=2):
    return f"{med_ms(v):.{digits}f} ms" if v else "FAILED"


def spread(v):
    return f"{min(v) * 1e3:.2f}-{max(v) * 1e3:.2f}" if v else "none"


def fmt_ratio(ref, ours):
    if not ref or not ours:
        return "n/a"
    return f"{statistics.median(ref) / statistics.median(ours):.2f}x"


def stop_process(p, grace=10.0, term=True):
    """Ends a process this script started (by its PID), politely first."""
    if p.poll() is not None:
        return
    try:
        if term:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                pass
        p.kill()
        p.wait(timeout=grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass


# ---------------------------------------------------------------------------------------------
# Part 1: the store bootstrap (runs in the --child, the single worker of launch)
# ---------------------------------------------------------------------------------------------

class RefServer:
    """torch's TCPStore master in a child process of its own."""

    def __init__(self, timeout_s):
        self.proc = subprocess.Popen([sys.executable, "-c", REF_SERVER, str(timeout_s)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        ready, _, _ = select.select([self.proc.stdout], [], [], 120)
        line = self.proc.stdout.readline() if ready else b""
        if not line.strip():
            self.close()
            raise RuntimeError("torch's TCPStore server process did not report its port in 120 s")
        self.port = int(line)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                stop_process(self.proc, grace=5)


class LineReader:
    """Lines from a pipe, with a timeout on each."""

    def __init__(self, f):
        self.fd = f.fileno()
        self.buf = b""

    def readline(self, timeout_s, what):
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise TimeoutError(f"no answer in {timeout_s:.0f} s ({what})")
            data = os.read(self.fd, 65536)
            if not data:
                raise EOFError(f"pipe closed ({what})")
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()


def client_proc_main():
    """A client process (--client-proc): holds some of the ranks, one thread each.

    Commands on stdin, one JSON line each, answers on stdout. Per round: "round" (start the
    threads, waiting) -> "ready"; "go" (release them: connect, exchange a) -> "a" with the
    latest connect and exchange-a end of its ranks once all of them are through exchange a;
    "go2" (exchange b on the same connections) -> "b"; "close" -> "closed". Times are
    time.perf_counter() (CLOCK_MONOTONIC: one clock for every process of the machine).
    """
    raise_nofile()
    import torch.distributed as dist
    out = sys.stdout
    inp = LineReader(sys.stdin)

    def say(**kw):
        out.write(json.dumps(kw) + "\n")
        out.flush()

    say(op="hello")
    stores = []
    while True:
        try:
            cmd = json.loads(inp.readline(24 * 3600, "next command"))
        except (EOFError, TimeoutError):
            return 0
        if cmd["op"] == "close":
            del stores[:]
            say(op="closed")
            continue
        if cmd["op"] == "exit":
            return 0
        # op == "round"
        host, port, n, ranks = cmd["host"], cmd["port"], cmd["n"], cmd["ranks"]
        prefix, timeout_s = cmd["prefix"], cmd["timeout"]
        td = timedelta(seconds=timeout_s)
        k = len(ranks)
        # A rank makes 7 store calls an exchange, each bounded by the store timeout.
        limit = 10 * timeout_s + 60
        go = threading.Barrier(k + 1, timeout=limit)
        done_a = threading.Barrier(k + 1, timeout=limit)
        go_b = threading.Barrier(k + 1, timeout=limit)
        connected, end_a, end_b = [0.0] * k, [0.0] * k, [0.0] * k
        errors = []
        mine = [None] * k

        def barrier(st, key):  # the store calls of c10d's _store_based_barrier
            st.add(key, 1)
            if st.add(key, 0) == n:
                st.set(key + ":last_worker", "1")
            try:
                st.wait([key + ":last_worker"], td)
            except Exception as e:  # noqa: BLE001 - say how far the barrier got
                try:
                    got = f"count {st.add(key, 0)} of {n}, last_worker set: " \
                          f"{st.check([key + ':last_worker'])}"
                except Exception as e2:  # noqa: BLE001
                    got = f"and the store did not answer: {e2}"
                raise RuntimeError(f"{e} ({got})") from None

        def exchange(st, rank, p):
            barrier(st, p + "init")
            if rank == 0:
                st.set(p + "unique_id", UNIQUE_ID)
            elif st.get(p + "unique_id") != UNIQUE_ID:
                raise RuntimeError("wrong unique id")
            barrier(st, p + "done")

        def rank_main(i, rank):
            clk = time.perf_counter
            try:
                go.wait()
                st = dist.TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=td)
                mine[i] = st
                connected[i] = clk()
                exchange(st, rank, prefix + "a/")
                end_a[i] = clk()
                done_a.wait()
                go_b.wait()
                exchange(st, rank, prefix + "b/")
                end_b[i] = clk()
            except threading.BrokenBarrierError:
                pass  # another rank failed and says why
            except BaseException as e:  # noqa: BLE001 - sent to the bench process
                errors.append(f"rank {rank}: {type(e).__name__}: {e}")
                for b in (go, done_a, go_b):
                    b.abort()

        threads = []
        try:
            for i, r in enumerate(ranks):
                t = threading.Thread(target=rank_main, args=(i, r), daemon=True)
                t.start()
                threads.append(t)
        except RuntimeError as e:
            say(op="error", msg=f"could not start thread {len(threads)} of {k}: {e}")
            os._exit(1)
        say(op="ready")
        broken = None
        try:
            inp.readline(limit, "go")
            go.wait()
            done_a.wait()
            say(op="a", connected=max(connected), end=max(end_a))
            inp.readline(limit, "go2")
            go_b.wait()
        except (threading.BrokenBarrierError, TimeoutError, EOFError) as e:
            broken = f"{type(e).__name__}: {e}"
            for b in (go, done_a, go_b):
                b.abort()
        deadline = time.monotonic() + limit
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = sum(t.is_alive() for t in threads)
        if alive:
            say(op="error", msg=f"{alive} of its {k} ranks still blocked {limit:.0f} s after "
                f"the start (store timeout {timeout_s:g} s)")
            os._exit(1)  # threads blocked in C++: cannot be joined
        if errors or broken:
            first = errors[0] if errors else f"its coordinator: {broken}"
            say(op="error", msg=f"{len(errors)} of its {k} ranks failed; first: {first}")
            os._exit(1)
        stores = mine
        say(op="b", end=max(end_b))


class ClientPool:
    """P client processes (--client-proc) holding N rank threads between them."""

    def __init__(self, nprocs, timeout_s, logdir):
        """Their stderr (torch's C++ warnings: thousands of lines when a side fails) goes to
        files in logdir; tail() shows the end of them."""
        self.timeout_s = timeout_s
        self.procs = []
        self.logs = []
        for _ in range(nprocs):
            log = tempfile.NamedTemporaryFile(dir=logdir, prefix="client.", suffix=".err",
                                              delete=False)
            self.logs.append(log.name)
            p = subprocess.Popen([sys.executable, "-u", HERE, "--client-proc"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
            log.close()
            self.procs.append((p, LineReader(p.stdout)))
        for p, r in self.procs:
            self.expect(p, r, "hello", 120)

    def send(self, p, **kw):
        p.stdin.write((json.dumps(kw) + "\n").encode())
        p.stdin.flush()

    def expect(self, p, r, op, timeout_s):
        msg = json.loads(r.readline(timeout_s, f"client process {p.pid}: {op}"))
        if msg["op"] == "error":
            raise RuntimeError(f"client process {p.pid}: {msg['msg']}")
        if msg["op"] != op:
            raise RuntimeError(f"client process {p.pid}: {msg['op']} where {op} was due")
        return msg

    def round(self, host, port, n, prefix):
        """One bootstrap of n ranks. Returns (total, connect, exchange) seconds; raises."""
        use = self.procs[:max(1, min(len(self.procs), n))]
        t = self.timeout_s
        for i, (p, _) in enumerate(use):
            self.send(p, op="round", host=host, port=port, n=n, ranks=list(range(i, n, len(use))),
                      prefix=prefix, timeout=t)
        for p, r in use:
            self.expect(p, r, "ready", 120 + n / 50)
        t0 = time.perf_counter()
        for p, _ in use:
            self.send(p, op="go")
        limit = 10 * t + 120  # the client processes' own limits, and some
        a = [self.expect(p, r, "a", limit) for p, r in use]
        t1 = time.perf_counter()
        for p, _ in use:
            self.send(p, op="go2")
        b = [self.expect(p, r, "b", limit) for p, r in use]
        for p, r in use:  # close the connections, outside the timing
            self.send(p, op="close")
            self.expect(p, r, "closed", t)
        time.sleep(0.1 + n * 2e-4)  # let the server take the closes before the next round
        return (max(x["end"] for x in a) - t0, max(x["connected"] for x in a) - t0,
                max(x["end"] for x in b) - t1)

    def tail(self, nbytes=1500):
        out = []
        for path in self.logs:
            try:
                with open(path, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    size = f.tell()
                    f.seek(max(0, size - nbytes))
                    text = f.read().decode(errors="replace")
            except OSError:
                continue
            if text.strip():
                lines = [ln[:300] for ln in text.splitlines()[1:] if ln.strip()][-6:]
                out.append(f"    stderr of a client process ({size} bytes), its end:\n"
                           + "\n".join("      " + ln for ln in lines))
        return "\n".join(out)

    def kill(self):
        for p, _ in self.procs:
            stop_process(p, grace=5)

    def close(self):
        for p, _ in self.procs:
            try:
                self.send(p, op="exit")
                p.stdin.close()
            except OSError:
                pass
        for p, _ in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                stop_process(p, grace=5)


def child_main(a):
    nofile = raise_nofile()
    use_agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE")
    ours_desc = a.ours
    if a.ours == "agent":
        if use_agent != "True":
            print(f"FAILED: ours: TORCHELASTIC_USE_AGENT_STORE={use_agent!r} in launch's worker, "
                  "not 'True': this launch does not host an agent store (an older build?)",
                  flush=True)
            return 2
        ours_host = os.environ["MASTER_ADDR"]
        ours_port = int(os.environ["MASTER_PORT"])
        ours_desc = f"launch's agent store at {ours_host}:{ours_port}"
    import torch
    parent = "launch's agent" if a.ours == "agent" else "the parent"
    print(f"store bootstrap: torch {torch.__version__}, open-file limit {nofile} here, "
          f"{parent} (pid {os.getppid()}) {fd_limit_of(os.getppid())}", flush=True)

    servers = []
    pool = None
    logdir = tempfile.mkdtemp(prefix="agent_store_bench_clients.")
    results = {"ranks": {}, "failed": [], "rounds": a.rounds, "client_procs": a.client_procs}
    try:
        pool = ClientPool(a.client_procs, a.store_timeout, logdir)
        print(f"  clients: {a.client_procs} processes (pids "
              f"{', '.join(str(p.pid) for p, _ in pool.procs)}), rank r a thread in process "
              f"r mod {a.client_procs}", flush=True)
        ref = RefServer(a.store_timeout)
        servers.append(ref)
        print(f"  torch: TCPStore master (libuv) in pid {ref.proc.pid}, port {ref.port}, "
              f"open-file limit {fd_limit_of(ref.proc.pid)}", flush=True)
        if a.ours == "torch":  # A/A check of the harness: a second torch server as "ours"
            second = RefServer(a.store_timeout)
            servers.append(second)
            ours_host, ours_port = "127.0.0.1", second.port
            ours_desc = f"A SECOND torch server (pid {second.proc.pid}, --ours torch: A/A check)"
        print(f"  ours:  {ours_desc}", flush=True)
        sides = {"torch": ("127.0.0.1", ref.port), "ours": (ours_host, ours_port)}
        dead = set()  # sides that failed at a smaller N: not tried at larger ones
        for n in a.ranks:
            times = {s: {"total": [], "connect": [], "exchange": []} for s in sides}
            failed_here = {}
            for r in range(-a.warmup, a.rounds):
                order = ["torch", "ours"] if r % 2 == 0 else ["ours", "torch"]
                for side in order:
                    if side in dead or side in failed_here:
                        continue
                    host, port = sides[side]
                    try:
                        tot, con, exc = pool.round(host, port, n, f"bench/n{n}/r{r}/{side}/")
                    except Exception as e:  # noqa: BLE001
                        failed_here[side] = str(e)
                        print(f"  FAILED: {side} at {n} ranks, round {r}: {e}", flush=True)
                        pool.kill()  # its processes may be mid-round: start afresh
                        print(pool.tail(), flush=True)
                        pool = ClientPool(a.client_procs, a.store_timeout, logdir)
                        continue
                    if r >= 0:
                        times[side]["total"].append(tot)
                        times[side]["connect"].append(con)
                        times[side]["exchange"].append(exc)
            results["ranks"][str(n)] = times
            skipped = [x for x in sides if x in dead and x not in failed_here]
            print(f"  {n} ranks, {a.rounds} rounds, median (min-max) ms:"
                  + (f" ({', '.join(skipped)} not run: failed at a smaller N)" if skipped else ""),
                  flush=True)
            for side in ("torch", "ours"):
                print("    " + f"{side:5s} " + "   ".join(
                    f"{k} {med_ms(v):8.2f} ({spread(v)})" for k, v in times[side].items()),
                      flush=True)
            print("    torch/ours " + "   ".join(
                f"{k} {fmt_ratio(times['torch'][k], times['ours'][k])}"
                for k in ("total", "connect", "exchange")), flush=True)
            for side, why in failed_here.items():
                dead.add(side)
                results["failed"].append(f"{side} at {n} ranks: {why}")
    except Exception as e:  # noqa: BLE001
        results["failed"].append(f"store bootstrap: {type(e).__name__}: {e}")
        print(f"  FAILED: {e}", flush=True)
    finally:
        if pool:
            pool.close()
        for s in servers:
            s.close()
        shutil.rmtree(logdir, ignore_errors=True)
    results["ours_desc"] = ours_desc
    print(RESULT_TAG + json.dumps(results), flush=True)
    sys.stdout.flush()
    # Ranks blocked in C++ (a failed side) cannot be joined; do not wait for them at exit.
    os._exit(1 if results["failed"] else 0)


def run_child_under_launch(a, launch, tmp):
    """Runs the store measurement as launch's single worker; relays its lines; returns results."""
    args = [sys.executable, "-u", HERE, "--child", "--ranks", *map(str, a.ranks),
            "--rounds", str(a.rounds), "--warmup", str(a.warmup),
            "--store-timeout", str(a.store_timeout), "--ours", a.ours,
            "--client-procs", str(a.client_procs)]
    if a.ours == "torch":  # A/A check: no launch needed
        cmd = args
    else:
        cmd = [launch, "--nproc-per-node=1", "--max-restarts=0", "--monitor=off", "--no-prefix",
               "--log-level=warn", "--no-python", *args]
    env = clean_env()
    print("$ " + " ".join(cmd), flush=True)
    out_path = os.path.join(tmp, "child.out")
    with open(out_path, "wb") as out:
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        pos = 0
        deadline = time.monotonic() + a.child_timeout
        results = None

        def relay(final=False):
            nonlocal pos, results
            with open(out_path, "rb") as f:
                f.seek(pos)
                data = f.read()
            if not final:  # only whole lines while it runs
                data = data[:data.rfind(b"\n") + 1]
            pos += len(data)
            for line in data.decode(errors="replace").splitlines():
                if line.startswith(RESULT_TAG):
                    results = json.loads(line[len(RESULT_TAG):])
                else:
                    print(line, flush=True)

        while p.poll() is None:
            if time.monotonic() > deadline:
                stop_process(p, grace=15)
                relay(final=True)
                sys.exit(f"FAILED: the store measurement under launch ran past "
                         f"--child-timeout={a.child_timeout} s; stopped it")
            time.sleep(0.2)
            relay()
        relay(final=True)
    if results is None:
        sys.exit(f"FAILED: the store measurement exited {p.returncode} without results")
    results["returncode"] = p.returncode
    return results


# ---------------------------------------------------------------------------------------------
# Part 2: start to every rank past init_process_group (runs in the top-level process)
# ---------------------------------------------------------------------------------------------

PHASES = {"start": "first rank running", "imported": "torch imported",
          "init": "past init_process_group", "exit": "exit",
          "in_init": "(not from Popen) the last rank's import to every rank past init"}


def pg_worker():
    from datetime import timedelta as td
    import torch.distributed as dist
    t_imported = time.time()
    dist.init_process_group("gloo", timeout=td(seconds=60))
    t = time.time()
    path = os.path.join(os.environ["AGENT_STORE_BENCH_DIR"], f"rank{os.environ['RANK']}")
    with open(path, "w") as f:
        f.write(json.dumps({"loaded": T_LOADED, "imported": t_imported, "init": t,
                            "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE")}))
    # Without it, a rank that is through connectFullMesh could close its pairs while a peer is
    # still connecting: "Connection closed by peer" at the peer (seen under either launcher).
    dist.barrier()
    dist.destroy_process_group()


def clean_env():
    """The environment for a launcher: none of an outer job's variables."""
    drop = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
            "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME")
    env = {k: v for k, v in os.environ.items()
           if k not in drop and not k.startswith(("TORCHELASTIC_", "PET_", "DDPL_"))}
    env["OMP_NUM_THREADS"] = "1"
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pg_run(cmd, nproc, tmp, timeout_s):
    """Runs one job. Returns ({phase: seconds from Popen}, agent-store flag). Phases: start
    (the first rank's interpreter reached the script), imported (the last rank has torch
    imported), init (the last rank is past init_process_group), exit (the command exited);
    in_init is not from Popen: from the last rank done importing torch to every rank past
    init_process_group (the rendezvous on the store; earlier ranks wait in it for that one)."""
    d = tempfile.mkdtemp(dir=tmp)
    env = clean_env()
    env["AGENT_STORE_BENCH_DIR"] = d
    t0 = time.time()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_process(p, grace=15)
        raise RuntimeError(f"ran past {timeout_s} s: {' '.join(cmd)}") from None
    t_exit = time.time()
    if p.returncode != 0:
        text = err.decode(errors="replace")
        why = [line.strip() for line in text.splitlines() if "Error" in line][-1:]
        e = RuntimeError(f"exit {p.returncode}: {' '.join(cmd)}" + (f": {why[0]}" if why else ""))
        e.detail = text[-3000:]
        raise e
    stamps = []
    for r in range(nproc):
        try:
            with open(os.path.join(d, f"rank{r}")) as f:
                stamps.append(json.load(f))
        except (OSError, ValueError):
            raise RuntimeError(f"rank {r} wrote no timestamp: {' '.join(cmd)}") from None
    shutil.rmtree(d, ignore_errors=True)
    phases = {"start": min(x["loaded"] for x in stamps) - t0,
              "imported": max(x["imported"] for x in stamps) - t0,
              "init": max(x["init"] for x in stamps) - t0,
              "exit": t_exit - t0,
              "in_init": max(x["init"] for x in stamps) - max(x["imported"] for x in stamps)}
    return phases, ",".join(sorted({str(x["agent_store"]) for x in stamps}))


def pg_bench(a, launch, tmp):
    """Returns ({variant: {launcher: {phase: [seconds]}}}, [failures]); phases as pg_run's."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    n = str(a.pg_nproc)
    worker = [sys.executable, "-u", HERE, "--pg-worker"]
    out = {}
    failed = []
    for variant in a.pg_variants:
        print(f"init_process_group, {n} ranks (gloo), {variant}:", flush=True)
        times = {k: {ph: [] for ph in PHASES} for k in ("launch", "torchrun")}
        flags = {}
        bad = {"launch": 0, "torchrun": 0}
        for r in range(-1, a.pg_rounds):  # round -1: warm caches, untimed
            if variant == "standalone":
                rd = {"launch": ["--standalone"], "torchrun": ["--standalone"]}
            else:  # static rendezvous, one free port given to both
                port = free_port()
                rd = {k: ["--master-addr=127.0.0.1", f"--master-port={port}"]
                      for k in ("launch", "torchrun")}
            cmds = {
                "launch": [launch, *rd["launch"], f"--nproc-per-node={n}", "--monitor=off",
                           "--log-level=warn", "--no-python", *worker],
                "torchrun": [torchrun, *rd["torchrun"], f"--nproc-per-node={n}",
                             "--no-python", *worker],
            }
            if r == -1:
                for k, c in cmds.items():
                    print(f"  $ {' '.join(c)}", flush=True)
            order = ["launch", "torchrun"] if r % 2 == 0 else ["torchrun", "launch"]
            for k in order:
                try:
                    phases, flag = pg_run(cmds[k], a.pg_nproc, tmp, a.pg_timeout)
                except RuntimeError as e:  # said, counted, and the rounds go on
                    bad[k] += 1
                    failed.append(f"init_process_group ({variant}, {k}, round {r}): {e}")
                    print(f"  FAILED: {k}, round {r}: {e}\n{getattr(e, 'detail', '')}",
                          flush=True)
                    continue
                flags[k] = flag
                if r >= 0:
                    for ph, v in phases.items():
                        times[k][ph].append(v)
        for k in ("launch", "torchrun"):
            if not times[k]["init"]:
                print(f"  {k:8s} no successful run", flush=True)
                continue
            print(f"  {k:8s} from Popen, median (min-max) ms: " + "   ".join(
                f"{PHASES[ph]} {med_ms(v):.1f} ({spread(v)})" for ph, v in times[k].items())
                + f"   TORCHELASTIC_USE_AGENT_STORE={flags[k]}"
                + (f"   {bad[k]} failed run(s)" if bad[k] else ""), flush=True)
        print("  torchrun / launch: " + "   ".join(
            f"{PHASES[ph]} {fmt_ratio(times['torchrun'][ph], times['launch'][ph])}"
            for ph in PHASES), flush=True)
        out[variant] = times
    return out, failed


# ---------------------------------------------------------------------------------------------
# Name lookups. torch's TCPStore client connects over IPv6 first (SocketOptions::prefer_ipv6), so
# 127.0.0.1 becomes ::ffff:127.0.0.1, and it formats both ends of every new socket with
# getnameinfo() (socket.cpp, formatSockAddr: SocketImpl's constructor, the "connected" log line)
# before it sends a byte. /etc/hosts knows 127.0.0.1, not ::ffff:127.0.0.1, so each connect asks
# DNS for 1.0.0.127.in-addr.arpa. This VM's resolver drops part of a burst of such queries, and
# a dropped one costs the resolver's 5 s timeout (2 tries: up to 10 s): at 32 and more
# simultaneous clients, "connect" was 5-10 s on either server, the same for both, and nothing
# else was measured. Both sides pay it alike (it is in torch's client), so by default the whole
# run goes into a private mount namespace (unshare -m, root only) where /etc/hosts is a copy
# with "::ffff:127.0.0.1 localhost" added; the machine's /etc/hosts is not touched.
# --no-hosts-fix measures with the machine's resolver as it is.
# ---------------------------------------------------------------------------------------------

NS_ENV = "AGENT_STORE_BENCH_PRIVATE_HOSTS"


def hosts_fix_needed():
    try:
        with open("/etc/hosts") as f:
            for line in f:
                if line.split("#")[0].split()[:1] == ["::ffff:127.0.0.1"]:
                    return False
    except OSError:
        pass
    return True


def run_with_private_hosts(a):
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or not unshare:
        print("note: cannot give this run a private /etc/hosts (needs root and unshare); "
              "torch's client may wait for DNS at each connect (see --no-hosts-fix)", flush=True)
        return None
    tmp = tempfile.mkdtemp(prefix="agent_store_bench_hosts.")
    try:
        hosts = os.path.join(tmp, "hosts")
        with open("/etc/hosts") as f:
            text = f.read()
        with open(hosts, "w") as f:
            f.write(text.rstrip("\n") + "\n::ffff:127.0.0.1 localhost  # agent_store_bench\n")
        cmd = [unshare, "--mount", "--propagation", "private", "sh", "-c",
               'mount --bind "$0" /etc/hosts && exec "$@"', hosts,
               sys.executable, HERE, *sys.argv[1:]]
        print("name lookups: this run sees a private /etc/hosts with '::ffff:127.0.0.1 localhost' "
              "(unshare -m; see --no-hosts-fix)", flush=True)
        budget = (a.child_timeout + 300 + len(a.pg_variants or []) * (a.pg_rounds + 1) * 2
                  * (a.pg_timeout + 30))
        p = subprocess.Popen(cmd, env=dict(os.environ, **{NS_ENV: "1"}))
        try:
            return p.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            stop_process(p, grace=30)
            print(f"FAILED: the run ran past {budget:.0f} s; stopped it", flush=True)
            return 1
        except KeyboardInterrupt:
            stop_process(p, grace=30)
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256, 1024])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds per side and N")
    ap.add_argument("--store-timeout", type=float, default=60.0,
                    help="TCPStore timeout (s), and the thread barriers'")
    ap.add_argument("--child-timeout", type=float, default=3600.0,
                    help="limit (s) on the whole store measurement under launch")
    ap.add_argument("--pg-rounds", type=int, default=5)
    ap.add_argument("--pg-nproc", type=int, default=4)
    ap.add_argument("--pg-variants", nargs="*", default=["standalone", "plain"],
                    choices=["standalone", "plain"], help="none: skip part 2")
    ap.add_argument("--pg-timeout", type=float, default=180.0, help="limit (s) on one job")
    ap.add_argument("--skip-store", action="store_true", help="skip part 1")
    ap.add_argument("--ours", choices=["agent", "torch"], default="agent",
                    help="torch: a second torch server stands in for ours, without launch "
                         "(an A/A check of the harness: ratios should be near 1)")
    ap.add_argument("--no-hosts-fix", dest="hosts_fix", action="store_false",
                    help="do not run in a private mount namespace whose /etc/hosts resolves "
                         "::ffff:127.0.0.1 (see the comment above NS_ENV)")
    ap.add_argument("--client-procs", type=int, default=4,
                    help="processes the rank threads are spread over (rank r in process r mod "
                         "P; fewer when N < P): one process's GIL for 1024 threads made the "
                         "harness, not the store, the bottleneck")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--client-proc", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pg-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.pg_worker:
        return pg_worker()
    if a.client_proc:
        return client_proc_main()
    if a.child:
        return child_main(a)

    launch = os.path.abspath(os.path.join(a.build, "bin", "launch"))
    if not os.access(launch, os.X_OK):
        sys.exit(f"no {launch}")
    if a.hosts_fix and not os.environ.get(NS_ENV) and hosts_fix_needed():
        rc = run_with_private_hosts(a)
        if rc is not None:
            return rc
    command = " ".join([os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd())
                        else sys.executable, os.path.relpath(HERE), *sys.argv[1:]])
    tmp = tempfile.mkdtemp(prefix="agent_store_bench.")
    failed = []
    try:
        store = None
        if not a.skip_store:
            store = run_child_under_launch(a, launch, tmp)
            failed += store["failed"]
            if store["returncode"] != 0 and not store["failed"]:
                failed.append(f"store measurement exited {store['returncode']}")
        pg, pg_failed = pg_bench(a, launch, tmp) if a.pg_variants else ({}, [])
        failed += pg_failed
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    print(f"== summary: {command}")
    print("name lookups: " + ("a private /etc/hosts with ::ffff:127.0.0.1 (unshare -m)"
                              if os.environ.get(NS_ENV) else "the machine's own"))
    if store:
        print(f"store bootstrap through torch's TCPStore client, N rank threads over "
              f"{store['client_procs']} processes, {store['rounds']} interleaved rounds, medians; "
              f"ours = {store['ours_desc']}")
        print(f"  {'ranks':>5s} | {'torch total':>11s} {'ours total':>10s} {'ratio':>6s} | "
              f"{'torch conn':>11s} {'ours conn':>10s} {'ratio':>6s} | "
              f"{'torch exch':>11s} {'ours exch':>10s} {'ratio':>6s}")
        for n, t in store["ranks"].items():
            tr, o = t["torch"], t["ours"]
            cells = []
            for k in ("total", "connect", "exchange"):
                cell = lambda v, w: f"{med_ms(v):{w - 2}.2f}ms" if v else f"{'failed':>{w}s}"
                cells.append(f"{cell(tr[k], 11)} {cell(o[k], 10)} {fmt_ratio(tr[k], o[k]):>6s}")
            print(f"  {int(n):5d} | " + " | ".join(cells))
    if pg:
        print(f"init_process_group('gloo'), {a.pg_nproc} ranks, from Popen to the last rank past "
              f"it, {a.pg_rounds} interleaved rounds, medians (first rank running; to exit)")
        for variant, t in pg.items():
            lr, tr = t["launch"], t["torchrun"]
            print(f"  {variant:10s} torchrun {med_ms(tr['init']):7.1f} ms  launch "
                  f"{med_ms(lr['init']):7.1f} ms  ratio {fmt_ratio(tr['init'], lr['init'])}   "
                  f"(first rank running: {med_ms(tr['start']):.1f} / {med_ms(lr['start']):.1f} ms; "
                  f"to exit: {med_ms(tr['exit']):.1f} / {med_ms(lr['exit']):.1f} ms, "
                  f"{fmt_ratio(tr['exit'], lr['exit'])}; last import to all past init: "
                  f"{med_ms(tr['in_init']):.1f} / {med_ms(lr['in_init']):.1f} ms, "
                  f"{fmt_ratio(tr['in_init'], lr['in_init'])})")
    print("lines for docs/benchmarks.md:")
    if store:
        for n, t in store["ranks"].items():
            tr, o = t["torch"]["total"], t["ours"]["total"]
            c = (t["torch"]["connect"], t["ours"]["connect"])
            e = (t["torch"]["exchange"], t["ours"]["exchange"])
            print(f"  agent store bootstrap, {n} ranks: torch server {ms_or_failed(tr)}, ours "
                  f"{ms_or_failed(o)}, {fmt_ratio(tr, o)} (connect {fmt_ratio(*c)}, exchange "
                  f"{fmt_ratio(*e)})")
    for variant, t in (pg or {}).items():
        lr, tr = t["launch"]["init"], t["torchrun"]["init"]
        ti, li = t["torchrun"]["in_init"], t["launch"]["in_init"]
        print(f"  start to all {a.pg_nproc} ranks past init_process_group (gloo, {variant}): "
              f"torchrun {ms_or_failed(tr, 1)}, launch {ms_or_failed(lr, 1)}, "
              f"{fmt_ratio(tr, lr)}; from the last rank's import to all past it: torchrun "
              f"{ms_or_failed(ti, 1)}, launch {ms_or_failed(li, 1)}, {fmt_ratio(ti, li)}")
    for f in failed:
        print(f"FAILED: {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
