"""Part 2 of agent_store_bench.py: start to every rank past init_process_group("gloo"), launch
against torchrun, both --standalone and both plain (the module docstring of
agent_store_bench.py says what is measured). Runs in the top-level process, outside launch;
pg_worker is the tiny worker (--pg-worker) each rank runs."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from agent_store_common import HERE, clean_env, fmt_ratio, med_ms, spread, stop_process

PHASES = {"start": "first rank running", "imported": "torch imported",
          "init": "past init_process_group", "exit": "exit",
          "in_init": "(not from Popen) the last rank's import to every rank past init"}


def pg_worker(t_loaded):
    """`t_loaded`: when this worker's interpreter reached the script."""
    from datetime import timedelta as td
    import torch.distributed as dist
    t_imported = time.time()
    dist.init_process_group("gloo", timeout=td(seconds=60))
    t = time.time()
    path = os.path.join(os.environ["AGENT_STORE_BENCH_DIR"], f"rank{os.environ['RANK']}")
    with open(path, "w") as f:
        f.write(json.dumps({"loaded": t_loaded, "imported": t_imported, "init": t,
                            "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE")}))
    # Without it, a rank that is through connectFullMesh could close its pairs while a peer is
    # still connecting: "Connection closed by peer" at the peer (seen under either launcher).
    dist.barrier()
    dist.destroy_process_group()


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
