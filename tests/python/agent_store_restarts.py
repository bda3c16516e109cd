"""A Gloo job whose worker is SIGKILLed after the process group formed, attempt after attempt.

Under launch --max-restarts=KILLS (tests/integration/agent_store_test.cc). Every attempt, every
rank first checks, through a plain client of the agent store, that no key of an earlier attempt
is visible (a marker each attempt sets), then forms the group through the agent store
(init_process_group, env://), all-reduces, and, while attempts remain, one rank kills itself with
SIGKILL after the group formed: Gloo's addresses of the dead attempt are in the store then. The
last attempt finishes and every rank prints "ATTEMPT OK attempt=N rank=R sum=S".
"""
import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    kills = int(os.environ.get("KILLS", "20"))
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, wait_for_workers=False, timeout=timedelta(seconds=60))
    if store.check(["marker"]):
        print(f"STALE attempt={attempt} rank={rank}: attempt {store.get('marker').decode()}'s "
              "marker is visible", flush=True)
        return 3
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    if rank == 0:
        store.set("marker", str(attempt))
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    if attempt < kills and rank == attempt % world:
        os.kill(os.getpid(), signal.SIGKILL)
    for _ in range(3):
        dist.all_reduce(t)
    print(f"ATTEMPT OK attempt={attempt} rank={rank} sum={t.item():.0f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Not through the interpreter's finalization: torch's Gloo exit race (see ddp_gloo.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
