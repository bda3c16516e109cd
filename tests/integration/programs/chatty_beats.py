"""Beats and talks: LINES numbered lines of its own, one per step of STEP_SECONDS, and on
rank 0 a progress bar redrawn with carriage returns between them (as tqdm does)."""
import os
import sys
import time

# The checkout's ddplaunch, ahead of any installed one: this tests the code beside it.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../python"))
import ddplaunch  # noqa: E402

rank = int(os.environ.get("RANK", "0"))
lines = int(os.environ.get("LINES", "20"))
pause = float(os.environ.get("STEP_SECONDS", "0.1"))
for step in range(1, lines + 1):
    time.sleep(pause)
    ddplaunch.step(step)
    print(f"line {step} of rank {rank}", flush=True)
    if rank == 0:
        sys.stderr.write(f"\rbar {step}/{lines}")
        sys.stderr.flush()
if rank == 0:
    sys.stderr.write("\n")
