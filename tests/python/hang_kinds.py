"""Six ways a rank hangs a Gloo job (issue 48), for launch's hang report: each kind is one test
of tests/integration/hang_report_test.cc and 20 runs of bench/hang_report_bench.py.

    launch --nproc-per-node=3 --hang-timeout=2 hang_kinds.py --kind KIND

Every rank steps in lockstep: at step s one all-reduce, the default group's collective #s, then
ddplaunch.step(). At step HANG_STEP (default 4) rank HANG_RANK (default 2; with `lock` also the
rank before it) hangs instead of entering all-reduce #HANG_STEP, where the others wait:
  sigstop   stops itself (SIGSTOP)
  sleep     sleeps for good (time.sleep)
  skip      skips all-reduce #N and waits in a barrier instead: mismatched collectives, its
            collective #N is a barrier, the others' an all-reduce
  loader    waits for a batch that its DataLoader's worker process never makes
  lock      ranks HANG_RANK-1 and HANG_RANK each hold a file lock (in HANG_DIR) and wait for
            the other's
  deadpeer  waits in the job store's get() for a key that a helper process was to set; the
            helper was SIGKILLed first, and the group cannot notice (it is no rank)
Just before it hangs, each culprit prints "HANG <kind> rank R at <unix time> before collective
#N": where the hang starts, for the bench. Only the first attempt hangs
(TORCHELASTIC_RESTART_COUNT=0); a later one runs STEPS steps (default 8) and finishes.
"""
import argparse
import datetime
import fcntl
import os
import signal
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import ddplaunch  # noqa: E402  the checkout's, ahead of any installed one
from gloo_exit import exit_without_finalizing  # noqa: E402  this script's folder

KINDS = ("sigstop", "sleep", "skip", "loader", "lock", "deadpeer")


def announce(kind, rank, n):
    print(f"HANG {kind} rank {rank} at {time.time():.3f} before collective #{n}", flush=True)


def sleep_forever():
    while True:
        time.sleep(3600)


def deadlock(mine, theirs):
    """Holds the lock file `mine`, waits until the other rank holds `theirs`, then takes it."""
    held = os.open(mine, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)
    open(mine + ".held", "w").close()
    while not os.path.exists(theirs + ".held"):
        time.sleep(0.005)
    wanted = os.open(theirs, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(wanted, fcntl.LOCK_EX)  # never returns: the other rank waits for ours


def wait_for_peer(key):
    """A helper process was to compute something and publish it under `key` in the job's store;
    it dies (SIGKILL) before it does. Nothing tells the group: the helper is no rank."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=datetime.timedelta(hours=1))
    helper = os.fork()
    if helper == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return store.get(key)  # never returns


class Numbers(torch.utils.data.Dataset):
    """Batch i is the number i; in the culprit's loader, the batch of the hang step never
    comes (its worker process sleeps)."""

    def __init__(self, length, stuck_index):
        self.length, self.stuck_index = length, stuck_index

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        if i == self.stuck_index:
            sleep_forever()
        return torch.tensor([float(i)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=KINDS, required=True)
    kind = ap.parse_args().kind
    dist.init_process_group("gloo")  # torch's default timeout (30 min), as users run it
    rank, world = dist.get_rank(), dist.get_world_size()
    hang_step = int(os.environ.get("HANG_STEP", "4"))
    hang_rank = int(os.environ.get("HANG_RANK", "2"))
    steps = int(os.environ.get("STEPS", "8"))
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    culprits = {hang_rank - 1, hang_rank} if kind == "lock" else {hang_rank}
    culprit = first_attempt and rank in culprits
    assert hang_step < steps and max(culprits) < world and min(culprits) >= 0, (kind, world)
    hang_dir = os.environ.get("HANG_DIR") or os.path.join(
        tempfile.gettempdir(), "hang_kinds_" + os.environ.get("MASTER_PORT", "0"))
    os.makedirs(hang_dir, exist_ok=True)
    batches = None
    if kind == "loader":
        stuck = hang_step - 1 if culprit else -1
        batches = iter(torch.utils.data.DataLoader(Numbers(steps, stuck), batch_size=None,
                                                   num_workers=1))
    print(f"rank {rank} ready", flush=True)
    for step in range(1, steps + 1):
        t = torch.ones(4)
        if batches is not None:
            if culprit and step == hang_step:
                announce(kind, rank, step)
            t = t * next(batches)
        elif culprit and step == hang_step:
            announce(kind, rank, step)
            if kind == "sigstop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif kind == "sleep":
                time.sleep(24 * 3600)
            elif kind == "skip":
                dist.barrier()
                continue  # all-reduce #N skipped
            elif kind == "lock":
                ours = os.path.join(hang_dir, f"lock{rank}")
                theirs = os.path.join(hang_dir, f"lock{2 * hang_rank - 1 - rank}")
                deadlock(ours, theirs)
            elif kind == "deadpeer":
                wait_for_peer(f"hang_kinds/helper_result/{step}")
        dist.all_reduce(t)
        ddplaunch.step()
        time.sleep(0.01)
    print(f"rank {rank} finished", flush=True)
    ddplaunch.done()
    dist.destroy_process_group()


if __name__ == "__main__":
    exit_without_finalizing(main() or 0)
