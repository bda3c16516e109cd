"""The dashboard test's job: a Gloo job in lockstep (an all_reduce per step), each rank working
STEP_SECONDS per step for SECONDS, reporting its steps with ddplaunch.step() and its waits in the
collective with ddplaunch.add_wait() (so that a slow rank is told from the ranks that wait for
it), printing a line per step; rank SLOW_RANK works SLOW_FACTOR times as long (a straggler); on
the first attempt, rank HANG_RANK stops at step HANG_AT (the others wait in the all_reduce:
launch finds the group hung with --hang-timeout and restarts it)."""
import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../python"))
import ddplaunch  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

rank = int(os.environ.get("RANK", "0"))
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
duration = float(os.environ.get("SECONDS", "10"))
pause = float(os.environ.get("STEP_SECONDS", "0.04"))
if os.environ.get("SLOW_RANK") == str(rank):
    pause *= float(os.environ.get("SLOW_FACTOR", "3"))
hang_at = int(os.environ.get("HANG_AT", "-1")) if os.environ.get("HANG_RANK") == str(rank) else -1
dist.init_process_group("gloo", timeout=timedelta(seconds=120))
x = torch.ones(1)
start = time.monotonic()
step = 0
go = torch.ones(1)
while go.item() > 0:
    step += 1
    if attempt == 0 and step == hang_at:
        print(f"rank {rank} stops stepping at step {step}", flush=True)
        while True:
            time.sleep(1)
    time.sleep(pause)  # the work of a step
    # Whether to go on is decided together (rank 0's clock), so every rank runs as many steps.
    go.fill_(1.0 if rank != 0 or time.monotonic() - start < duration else 0.0)
    t0 = time.monotonic()
    dist.all_reduce(x)
    dist.broadcast(go, 0)
    ddplaunch.add_wait(time.monotonic() - t0)
    ddplaunch.step()
    print(f"rank {rank} attempt {attempt} step {step} <b>not html</b>", flush=True)
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
# Not through the interpreter's finalization: torch's Gloo exit race (tests/python/ddp_gloo.py).
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
