"""A Gloo job that hangs as real ones do: rank HANG_RANK stops before the all-reduce of step
HANG_STEP (stuck in its own code), and the other ranks wait for it inside the collective.

Reports steps to launch (ddplaunch.step), and its last one (ddplaunch.done). Hangs only in the
first attempt (TORCHELASTIC_RESTART_COUNT=0), so a restarted group runs to the end. STEPS steps
in all.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

# The checkout's ddplaunch, ahead of any installed one: this tests the code beside it.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../python"))
import ddplaunch  # noqa: E402
from gloo_exit import exit_without_finalizing  # noqa: E402  this script's folder


def stuck_in_data_loading():
    while True:
        time.sleep(3600)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    hang_rank = int(os.environ.get("HANG_RANK", "2"))
    hang_step = int(os.environ.get("HANG_STEP", "3"))
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    for step in range(1, int(os.environ.get("STEPS", "6")) + 1):
        if first_attempt and rank == hang_rank and step == hang_step:
            stuck_in_data_loading()
        t = torch.ones(1)
        dist.all_reduce(t)
        time.sleep(0.05)
        ddplaunch.step(step)
    # What follows is teardown, which can take seconds on a loaded machine: not a hang.
    ddplaunch.done()
    print(f"rank {rank} finished", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    exit_without_finalizing(main() or 0)
