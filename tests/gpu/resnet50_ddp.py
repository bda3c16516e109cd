"""PyTorch's own DDP on the ResNet-50 that `ddp_resnet --model resnet50 --width 64` trains
(bottleneck blocks, 7x7/2 stem and max-pool at 224x224), for the GPU throughput comparison of
tests/gpu/run_gpu_checks.sh: synthetic 224x224 images, bf16 autocast, channels-last, cuDNN
benchmark, SGD with momentum. Run under torchrun; rank 0 prints one JSON line with images/s over
the timed steps (after the warm-up ones), as ddp_resnet's summary counts its training steps."""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Bottleneck(nn.Module):
    def __init__(self, cin, mid, stride):
        super().__init__()
        cout = mid * 4
        self.conv1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.Conv2d(mid, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (self.short(x) if self.short is not None else x))


class ResNet50(nn.Module):
    def __init__(self, classes, width=64):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, stride=2, padding=1))
        layers, cin = [], width
        for i, blocks in enumerate([3, 4, 6, 3]):
            mid = width * (2 ** i)
            for b in range(blocks):
                layers.append(Bottleneck(cin, mid, 2 if (b == 0 and i > 0) else 1))
                cin = mid * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--classes", type=int, default=1000)
    a = ap.parse_args()
    dist.init_process_group("nccl")
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    torch.backends.cudnn.benchmark = True
    model = ResNet50(a.classes).cuda().to(memory_format=torch.channels_last)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator(device="cuda").manual_seed(1 + dist.get_rank())
    x = torch.randn(a.batch_size, 3, 224, 224, device="cuda", generator=g).to(
        memory_format=torch.channels_last)
    y = torch.randint(0, a.classes, (a.batch_size,), device="cuda", generator=g)
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    images = a.steps * a.batch_size * dist.get_world_size()
    if dist.get_rank() == 0:
        print(json.dumps({"images_per_second": images / seconds, "steps": a.steps,
                          "global_batch": a.batch_size * dist.get_world_size(),
                          "world_size": dist.get_world_size()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
