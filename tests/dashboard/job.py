"""The dashboard test's job: steps of STEP_SECONDS reported with ddplaunch.step() for SECONDS
(every rank as long, so that a slow rank is judged while they all run), each rank printing a
line per step; rank SLOW_RANK takes SLOW_FACTOR times as long (a straggler);
on the first attempt, rank HANG_RANK stops stepping at step HANG_AT (hung: launch finds it with
--hang-timeout and restarts the group)."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../python"))
import ddplaunch  # noqa: E402

rank = int(os.environ.get("RANK", "0"))
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
duration = float(os.environ.get("SECONDS", "10"))
pause = float(os.environ.get("STEP_SECONDS", "0.04"))
if os.environ.get("SLOW_RANK") == str(rank):
    pause *= float(os.environ.get("SLOW_FACTOR", "3"))
hang_at = int(os.environ.get("HANG_AT", "-1")) if os.environ.get("HANG_RANK") == str(rank) else -1
start = time.monotonic()
step = 0
while time.monotonic() - start < duration:
    step += 1
    if attempt == 0 and step == hang_at:
        print(f"rank {rank} stops stepping at step {step}", flush=True)
        while True:
            time.sleep(1)
    time.sleep(pause)
    ddplaunch.step()
    print(f"rank {rank} attempt {attempt} step {step} <b>not html</b>", flush=True)
print(f"rank {rank} done", flush=True)
