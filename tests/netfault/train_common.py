"""What the training workers of the network-fault scenarios (train.py) and of the chaos soak
(bench/chaos_train.py) share: their events, their exit on SIGTERM or SIGINT, the Gloo group they
join and how their main() ends. stale_writer.py logs its events here too.

Events: one JSON line per event in $NETFAULT_EVENTS/events-<node>-<pid>.jsonl, flushed and
fsynced (a SIGKILLed worker's last steps are kept): t, node, pid, rank, world, round, epoch, run,
restart, master, event, step, msg and the caller's own fields. invariants.py and
bench/chaos_analysis.py read them.

Importing this puts the checkout's python/ ($NETFAULT_PYTHONPATH when set) first on sys.path, so
that the workers test the ddplaunch beside them.
"""
import json
import os
import signal
import sys
import time
from datetime import timedelta

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("NETFAULT_PYTHONPATH") or os.path.join(_HERE, "..", "..", "python"))

_events = None
# rank and world once in the group, the last step: what every event, and the exit, says.
who = {}


def emit(event, step=None, msg=None, **extra):
    global _events
    if _events is None:
        d = os.environ.get("NETFAULT_EVENTS") or "."
        os.makedirs(d, exist_ok=True)
        name = f"events-{os.environ.get('NETFAULT_NODE') or os.uname().nodename}-{os.getpid()}.jsonl"
        _events = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    rec = {"t": time.time(), "node": os.environ.get("NETFAULT_NODE", ""), "pid": os.getpid(),
           "rank": who.get("rank", int(os.environ.get("RANK", "-1"))),
           "world": who.get("world", int(os.environ.get("WORLD_SIZE", "-1"))),
           "round": int(os.environ.get("DDPL_ROUND", "-1") or -1),
           "epoch": int(os.environ.get("DDPL_ROUND_EPOCH", "-1") or -1),
           "run": os.environ.get("TORCHELASTIC_RUN_ID", ""),
           "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "-1") or -1),
           "master": f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}",
           "event": event, "step": step}
    if msg is not None:
        rec["msg"] = msg
    rec.update(extra)
    os.write(_events, (json.dumps(rec) + "\n").encode())
    os.fsync(_events)


def exit_on_signals(emit=emit):
    """On SIGTERM or SIGINT: an `exit` event that names the signal, then exit 128 + its number at
    once (the launcher's stop must not wait on a collective)."""

    def on_signal(signo, frame):
        emit("exit", step=who.get("step"), msg=f"signal {signal.Signals(signo).name}")
        os._exit(128 + signo)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)


def join_gloo(pg_timeout):
    """The default group (env://, Gloo, collectives time out after pg_timeout s); returns
    (rank, world), which the events carry from now on."""
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=pg_timeout))
    who.update(rank=dist.get_rank(), world=dist.get_world_size())
    return who["rank"], who["world"]


def run(main, emit=emit, finalize_on_error=False):
    """Runs main() and exits with its code, not through the interpreter's finalization (torch's
    Gloo exit race, tests/python/gloo_exit.py). An exception (a collective that timed out, a peer
    gone) is logged as an `error` event, then exit 1: at once too, as a finalization can hang on
    a broken Gloo group (torchrun's agent would see no failure, and wait 30 s on its SIGTERM),
    unless finalize_on_error (train.py's exit as it has always been)."""
    try:
        code = main()
    except SystemExit:
        raise
    except BaseException as e:
        emit("error", step=who.get("step"), msg=f"{type(e).__name__}: {e}"[:2000])
        if finalize_on_error:
            sys.exit(1)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
