"""A Gloo job that hangs without reporting steps (issue 33): rank HANG_RANK stops at step
HANG_STEP, asleep in its own code, and the other ranks wait for it inside the all-reduce. After
"ready" it prints nothing and it never writes the heartbeat, so launch can only judge these ranks
by their CPU time and output (--hang-timeout). Idle Python ranks are not silent to the kernel:
the interpreter and Gloo's threads still wake now and then, which /proc counts in 10 ms ticks.

WAKE_SEC/WAKE_MS: every rank also runs a thread that works WAKE_MS milliseconds every WAKE_SEC
seconds, as library threads do (a watchdog, a metrics reporter): the CPU time of an idle rank
then grows in every few seconds, not only now and then.

BUSY_RANK (instead of hanging): that rank computes for BUSY_SEC at step HANG_STEP while the
others wait for it in the all-reduce, then every rank finishes: a long step, not a hang.
Hangs only in the first attempt (TORCHELASTIC_RESTART_COUNT=0). STEPS steps in all.
"""
import os
import threading
import time

import torch
import torch.distributed as dist

from gloo_exit import exit_without_finalizing  # this script's folder


def stuck_in_data_loading():
    while True:
        time.sleep(3600)


def long_computation(seconds):
    end = time.monotonic() + seconds
    x = torch.rand(128, 128)
    while time.monotonic() < end:
        x = torch.tanh(x @ x)


def library_thread(every, work):
    while True:
        time.sleep(every)
        end = time.thread_time() + work
        while time.thread_time() < end:
            pass


def main():
    wake = float(os.environ.get("WAKE_SEC", "0"))
    if wake > 0:
        work = float(os.environ.get("WAKE_MS", "10")) / 1000
        threading.Thread(target=library_thread, args=(wake, work), daemon=True).start()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    hang_rank = int(os.environ.get("HANG_RANK", "-1"))
    busy_rank = int(os.environ.get("BUSY_RANK", "-1"))
    hang_step = int(os.environ.get("HANG_STEP", "20"))
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    print(f"rank {rank} ready", flush=True)
    for step in range(1, int(os.environ.get("STEPS", "40")) + 1):
        if first_attempt and step == hang_step:
            if rank == hang_rank:
                stuck_in_data_loading()
            if rank == busy_rank:
                long_computation(float(os.environ.get("BUSY_SEC", "10")))
        t = torch.ones(1)
        dist.all_reduce(t)
        time.sleep(0.01)
    print(f"rank {rank} finished", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    exit_without_finalizing(main() or 0)
