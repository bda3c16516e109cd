"""The training program of the network-fault scenarios (one worker per node, under launch).

Gloo; every step all-reduces ones and checks the sum is WORLD_SIZE (a rank in another world
fails loudly), then sleeps STEP_SECONDS. Rank 0 saves {"step", "round", "node"} every CKPT_EVERY
steps with ddplaunch.checkpoint into CKPT_DIR (shared by all namespaces); every rank resumes
from the newest step they all can read (ddplaunch.checkpoint.latest). One JSON line per event
in $NETFAULT_EVENTS/events-<node>-<pid>.jsonl, flushed and fsynced (a SIGKILLed worker's last
steps are kept): t, node, rank, world, round, epoch, run, restart, master, event, step, msg
(train_common.py, which bench/chaos_train.py shares).

Environment: NETFAULT_EVENTS, NETFAULT_NODE, CKPT_DIR, TOTAL_STEPS (40), STEP_SECONDS (0.2),
CKPT_EVERY (5), PG_TIMEOUT (10 s), and optionally NETFAULT_GATE: a file the harness may write
a step number N into: while it holds N, no rank goes past step N (every rank reads it before
each step, and the harness only writes an N a few steps ahead of the job, so all ranks stop at
the same step). The harness holds the job so that it cannot end before what the scenario waits
for has happened, then removes the file. SLOW_AT_STEP + SLOW_SECONDS: right after that step
(not when resuming from it), every rank works that long without a collective (an evaluation, a
long data load), logging a "work" event every second.
"""
import os
import time

from train_common import emit, exit_on_signals, join_gloo, run, who  # this script's folder


def _held_at(gate):
    """The step the harness holds the job at (a huge number when it holds nothing)."""
    try:
        with open(gate) as f:
            return int(f.read().strip() or "-1")
    except (OSError, ValueError):
        return 1 << 62


def main():
    import torch
    import torch.distributed as dist
    from ddplaunch import checkpoint as ckpt

    total = int(os.environ.get("TOTAL_STEPS", "40"))
    pause = float(os.environ.get("STEP_SECONDS", "0.2"))
    every = int(os.environ.get("CKPT_EVERY", "5"))
    pg_timeout = float(os.environ.get("PG_TIMEOUT", "10"))
    ckpt_dir = os.environ["CKPT_DIR"]
    gate = os.environ.get("NETFAULT_GATE")
    slow_at = int(os.environ.get("SLOW_AT_STEP", "-1"))
    slow_for = float(os.environ.get("SLOW_SECONDS", "0"))
    exit_on_signals()
    rank, world = join_gloo(pg_timeout)
    emit("start")
    found = ckpt.latest(dir=ckpt_dir, timeout=max(30.0, 3 * pg_timeout))
    step = 0
    if found is not None:
        step = int(ckpt.load(found, weights_only=False)["step"])
    who["step"] = step
    emit("resumed", step=step, msg=found.path if found else None)
    while step < total:
        while gate and step >= _held_at(gate):
            time.sleep(0.05)
        t = torch.ones(1)
        dist.all_reduce(t)
        if t.item() != world:
            emit("error", step=step, msg=f"all_reduce gave {t.item()} in a world of {world}")
            return 3
        step += 1
        who["step"] = step
        emit("step", step=step)
        if rank == 0 and step % every == 0:
            try:
                ckpt.save({"step": step, "round": os.environ.get("DDPL_ROUND"),
                           "node": os.environ.get("NETFAULT_NODE")}, step, dir=ckpt_dir,
                          replicated=True)
                emit("ckpt_saved", step=step)
            except ckpt.StaleRoundError as e:
                emit("ckpt_refused", step=step, msg=str(e))
                return 4
        if step == slow_at:
            end = time.time() + slow_for
            while time.time() < end:
                emit("work", step=step)
                time.sleep(min(1.0, max(0.0, end - time.time())))
        time.sleep(pause)
    dist.barrier()
    emit("exit", step=step, msg="done")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    run(main, finalize_on_error=True)
