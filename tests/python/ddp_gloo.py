"""A plain PyTorch DDP script, as users write it for torchrun: env:// init, gloo, DDP.

Run under `launch` by tests/integration/launcher_python_test.cc. It checks its own result:
after training every rank must hold identical parameters, and an all_reduce of the ranks
must equal the expected sum.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gloo_exit import exit_without_finalizing  # this script's folder


# Every variable torchrun gives a worker; a launcher that runs this script unchanged gives them all.
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "ROLE_RANK", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
                      "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RUN_ID")


def main():
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    assert not missing, f"not set, though torchrun sets them: {missing}"
    dist.init_process_group("gloo")  # env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == int(os.environ["WORLD_SIZE"]), "WORLD_SIZE mismatch"
    assert rank == int(os.environ["RANK"]), "RANK mismatch"

    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    expected = world * (world - 1) / 2
    assert t.item() == expected, f"all_reduce gave {t.item()}, expected {expected}"

    torch.manual_seed(rank)  # different initial weights: DDP must broadcast rank 0's
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(5):
        x = torch.randn(4, 8, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    for r, other in enumerate(gathered):
        assert torch.equal(other, flat), f"rank {r} parameters differ from rank {rank}'s"
    print(f"DDP OK rank={rank} world={world} local_rank={os.environ['LOCAL_RANK']} "
          f"group_rank={os.environ['GROUP_RANK']} checksum={flat.sum().item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    exit_without_finalizing(main() or 0)
