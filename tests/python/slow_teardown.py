"""Steps, reports its last step, then takes TEARDOWN_SECONDS to tear down, as a job does that
saves its final model or destroys its process groups on a loaded machine (issue 44).

STEPS steps of STEP_SECONDS each, reported with ddplaunch.step(); then the teardown, by
TEARDOWN: `done` calls ddplaunch.done() and sleeps; `atexit` sleeps in an exit handler registered
before the first step, which runs after ddplaunch's own (as torch's do); `none` sleeps without
telling launch, which launch cannot tell from a hang. No torch: the test is about launch.
"""
import atexit
import os
import sys
import time

# The checkout's ddplaunch, ahead of any installed one: this tests the code beside it.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../python"))
import ddplaunch  # noqa: E402

rank = int(os.environ.get("RANK", "0"))
how = os.environ.get("TEARDOWN", "done")
teardown = float(os.environ.get("TEARDOWN_SECONDS", "5"))


def tear_down():
    time.sleep(teardown)
    print(f"rank {rank} torn down after {teardown}s", flush=True)


if how == "atexit":
    atexit.register(tear_down)  # before ddplaunch's handler, so it runs after it
for step in range(1, int(os.environ.get("STEPS", "5")) + 1):
    time.sleep(float(os.environ.get("STEP_SECONDS", "0.05")))
    ddplaunch.step()
print(f"rank {rank} made its last step", flush=True)
if how == "done":
    ddplaunch.done()
    tear_down()
elif how == "none":
    tear_down()
elif how != "atexit":
    sys.exit(f"TEARDOWN={how}: expected done, atexit or none")
