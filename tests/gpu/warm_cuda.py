"""A worker forked from launch's warm template uses CUDA and NCCL (docs/warm-restarts.md): the
template imported torch without initialising CUDA, so the fork may. Rank 0 fails once after its
first all-reduce; the restarted group, forked again, must do the same and finish. Prints
`warm cuda ok rank R attempt A device NAME`."""
import os
import sys

import torch
import torch.distributed as dist

rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
assert not torch.cuda.is_initialized(), "CUDA initialised before the program touched it"
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
x = torch.full((1 << 20,), float(rank + 1), device="cuda")
dist.all_reduce(x)
world = dist.get_world_size()
assert x[0].item() == world * (world + 1) / 2, x[0].item()
torch.cuda.synchronize()
print(f"warm cuda ok rank {rank} attempt {attempt} device {torch.cuda.get_device_name()}",
      flush=True)
dist.destroy_process_group()
if attempt == 0 and rank == 0:
    sys.exit(1)  # one restart, through the template again
