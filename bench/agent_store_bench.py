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
namespace whose /etc/hosts resolves it (the comment above NS_ENV in agent_store_hosts.py;
--no-hosts-fix: not).
--ours torch puts a second torch server in our place: an A/A check of the harness.

The parts live beside this script: agent_store_bootstrap.py (1), agent_store_pg.py (2),
agent_store_hosts.py (name lookups), agent_store_common.py (what they share). The table at the
end has the lines to paste into docs/benchmarks.md. Exit status non-zero when any side failed
(it says which and why); every blocking call has a timeout.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

# The parts, each in a file of its own beside this one (they re-run this script: HERE).
from agent_store_bootstrap import child_main, client_proc_main, run_child_under_launch
from agent_store_common import HERE, fmt_ratio, med_ms, ms_or_failed
from agent_store_hosts import NS_ENV, hosts_fix_needed, run_with_private_hosts
from agent_store_pg import pg_bench, pg_worker

# --pg-worker: when this worker's interpreter reached the script, its modules imported (the same
# standard modules as before the parts had files of their own).
T_LOADED = time.time()

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
        return pg_worker(T_LOADED)
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
