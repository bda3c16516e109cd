"""Reference values from the pinned PyTorch for worker_unit_test: what torch.amp.GradScaler and
torch.utils.data.DistributedSampler do, so the C++ versions are checked against the real thing."""
import json
import sys

import torch
from torch.utils.data import DistributedSampler


def scaler_sequence(pattern, device="cpu"):
    # One parameter; gradient is inf where pattern has 'i', else 1.0. Records (stepped, scale).
    # On CUDA the loss is computed in fp16, as worker_rank's `scaler` scenario does.
    p = torch.nn.Parameter(torch.zeros(3, device=device))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler = torch.amp.GradScaler(device, init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5,
                                  growth_interval=2)
    half = torch.float16 if device == "cuda" else torch.float32
    out = []
    for c in pattern:
        opt.zero_grad()
        factor = torch.full((3,), float("inf") if c == "i" else 1.0, device=device, dtype=half)
        loss = (p.to(half) * factor).sum().float()
        scaler.scale(loss).backward()
        before = p.detach().clone()
        scaler.step(opt)
        scaler.update()
        out.append({"stepped": not torch.equal(before, p.detach()), "scale": scaler.get_scale(),
                    "param": p.detach()[0].item()})
    return out


def sampler_indices(n, world, seed, epoch, drop_last):
    out = []
    for rank in range(world):
        s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed,
                               drop_last=drop_last)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "scaler":
        print(json.dumps(scaler_sequence(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "cpu")))
    else:
        n, world, seed, epoch, drop = (int(x) for x in sys.argv[2:7])
        print(json.dumps(sampler_indices(n, world, seed, epoch, bool(drop))))
