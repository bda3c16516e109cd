"""A process with a stale node's environment (its old DDPL_ROUND, RANK=0, WORLD_SIZE=1) that
tries to save a checkpoint into CKPT_DIR, as a worker of a partitioned node that outlived its
round would. Prints one JSON line: {"refused", "error_type", "error", "newest_step",
"newest_round", "newest_node"} (the newest checkpoint in CKPT_DIR after the attempt), and logs
ckpt_saved or ckpt_refused in the events as train.py does (train_common.py). Environment:
CKPT_DIR, STALE_STEP."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_common  # noqa: E402  (also puts the checkout's ddplaunch on the python path)


def main():
    from ddplaunch import checkpoint as ckpt

    d = os.environ["CKPT_DIR"]
    step = int(os.environ["STALE_STEP"])
    out = {"refused": False, "error_type": None, "error": None}
    try:
        ckpt.save({"step": step, "round": os.environ.get("DDPL_ROUND"), "node": "stale-writer"},
                  step, dir=d, replicated=True)
        train_common.emit("ckpt_saved", step=step, msg="stale writer", outside_launch=True)
    except Exception as e:  # StaleRoundError with fencing; anything else is reported as is
        out.update(refused=True, error_type=type(e).__name__, error=str(e))
        train_common.emit("ckpt_refused", step=step, msg=f"{type(e).__name__}: {e}",
                          outside_launch=True)
        out["is_stale_round_error"] = isinstance(e, getattr(ckpt, "StaleRoundError", ()))
    found = ckpt.latest(dir=d)
    if found is not None:
        state = ckpt.load(found, weights_only=False)
        out.update(newest_step=found.step, newest_round=state.get("round"),
                   newest_node=state.get("node"))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
