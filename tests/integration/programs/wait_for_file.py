"""Says it is ready ($OUT_DIR/ready.$RANK), then waits in wait_here() until $OUT_DIR/go exists."""
import os
import time


def wait_here(path):
    while not os.path.exists(path):
        time.sleep(0.05)


out = os.environ["OUT_DIR"]
with open(os.path.join(out, "ready." + os.environ["RANK"]), "w") as f:
    f.write("ready")
wait_here(os.path.join(out, "go"))
