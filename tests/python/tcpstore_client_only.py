"""Every rank a plain client of the job's store (is_master=False), before and without any
process group, as torchft's Manager and user tools do: works under launch as under torchrun,
whose agent hosts the store. Prints "CLIENT OK rank=R peers=..." per rank."""
import os
import sys
from datetime import timedelta

import torch.distributed as dist


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          world_size=world, is_master=False, timeout=timedelta(seconds=60))
    store.set(f"addr/{rank}", f"rank{rank}")
    store.wait([f"addr/{r}" for r in range(world)])
    peers = [store.get(f"addr/{r}").decode() for r in range(world)]
    n = store.add("done", 1)
    if n == world:
        store.set("all_done", "1")
    store.wait(["all_done"])
    print(f"CLIENT OK rank={rank} peers={','.join(peers)} "
          f"agent_store={os.environ.get('TORCHELASTIC_USE_AGENT_STORE')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
