# A torch.distributed script under `launch --launcher=mpi` (tests/integration/mpi_job_test.cc),
# reading the variables as docs/mpi.md says: per-job ones exported by launch, per-rank ones from
# OpenMPI, so the same script also runs under torchrun and launch.
import os
import sys

import torch
import torch.distributed as dist

rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", 0)))
local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)))
world_size = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world_size)  # env:// with MASTER_ADDR/PORT
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
expected = world_size * (world_size + 1) / 2
print(f"python rank {rank} local {local_rank} of {world_size}: sum {t.item():g}", flush=True)
dist.destroy_process_group()
# Not through the interpreter's finalization: torch's Gloo exit race (tests/python/ddp_gloo.py).
sys.stdout.flush()
sys.stderr.flush()
os._exit(0 if t.item() == expected else 1)
