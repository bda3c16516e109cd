"""PyTorch's Python DDP on the same small ResNet as bench/ddp_bench.cc (run under torchrun)."""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.shortcut(x) if self.shortcut is not None else x))


class SmallResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.layer1 = nn.Sequential(BasicBlock(16, 16, 1), BasicBlock(16, 16, 1))
        self.layer2 = nn.Sequential(BasicBlock(16, 32, 2), BasicBlock(32, 32, 1))
        self.layer3 = nn.Sequential(BasicBlock(32, 64, 2), BasicBlock(64, 64, 1))
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        out = F.relu(self.bn(self.stem(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


def main():
    steps, warmup, batch = 30, 5, 32
    for a in sys.argv[1:]:
        if a.startswith("--steps="):
            steps = int(a[8:])
        elif a.startswith("--batch="):
            batch = int(a[8:])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(SmallResNet())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(batch, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    for step in range(warmup + steps):
        if step == warmup:
            dist.barrier()
            start = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 0:
        print(f"samples_per_sec={steps * batch * world / seconds:.1f} (python ddp, {world} ranks, batch {batch}/rank, {steps} steps)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
