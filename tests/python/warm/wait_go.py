"""Waits (at most 60 s) for the file $GO, then exits 1 on the first attempt and 0 after a
restart: a job whose first group fails when the test says so."""
import os
import sys
import time

deadline = time.monotonic() + 60
while not os.path.exists(os.environ["GO"]) and time.monotonic() < deadline:
    time.sleep(0.02)
print(f"rank {os.environ['RANK']} attempt {os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
sys.exit(1 if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" else 0)
