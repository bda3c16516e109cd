# Keeps this rank's GPU busy with matmuls for --seconds, for the live-view check of
# tests/gpu/run_gpu_checks.sh (launch reads the GPU's utilisation from NVML meanwhile).
import argparse
import os
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=8.0)
args = parser.parse_args()
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
a = torch.randn(4096, 4096, device=device)
end = time.monotonic() + args.seconds
n = 0
while time.monotonic() < end:
    for _ in range(20):
        a = torch.tanh(a @ a)
    torch.cuda.synchronize(device)
    n += 20
print(f"busy_gpu: {n} matmuls on {torch.cuda.get_device_name(device)}", flush=True)
