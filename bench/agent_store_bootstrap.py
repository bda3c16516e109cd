"""Part 1 of agent_store_bench.py: the process-group bootstrap on the store, N rank threads
over client processes, torch's TCPStore server against launch's agent store (the module
docstring of agent_store_bench.py says what is measured). Runs in the --child, the single
worker of launch; run_child_under_launch starts it there and relays its lines."""
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta

from agent_store_common import (HERE, RESULT_TAG, LineReader, clean_env, fd_limit_of, fmt_ratio,
                                med_ms, raise_nofile, spread, stop_process)

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
