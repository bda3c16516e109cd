"""Reports its steps to launch with ddplaunch.step() (a no-op without launch).

STEPS steps of STEP_SECONDS each; rank SLOW_RANK (if set) takes SLOW_FACTOR times as long;
MEMORY_MB extra megabytes held by rank MEMORY_RANK.
"""
import os
import sys
import time

# The checkout's ddplaunch, ahead of any installed one: this tests the code beside it.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../python"))
import ddplaunch  # noqa: E402

rank = int(os.environ.get("RANK", "0"))
steps = int(os.environ.get("STEPS", "5"))
pause = float(os.environ.get("STEP_SECONDS", "0.05"))
if os.environ.get("SLOW_RANK") == str(rank):
    pause *= float(os.environ.get("SLOW_FACTOR", "3"))
hold = b"x" * (int(os.environ.get("MEMORY_MB", "0")) << 20) if os.environ.get("MEMORY_RANK") == str(rank) else b""
for step in range(1, steps + 1):
    time.sleep(pause)
    ddplaunch.step()
print(f"rank {rank} did {steps} steps, heartbeat fd {os.environ.get('DDPL_HEARTBEAT_FD', -1)}", flush=True)
