"""An elastic training loop over Gloo, as users write it for torchrun: env:// init, checkpoint
in a shared directory, resume after the group re-forms with a different world size.

Every step all-reduces ones and checks the sum equals WORLD_SIZE, so a rank that is not in the
same world as the others fails loudly. Environment: CKPT_DIR (shared), TOTAL_STEPS, STEP_SECONDS.
"""
import os
import time

import torch
import torch.distributed as dist

from gloo_exit import exit_without_finalizing  # this script's folder


def main():
    ckpt_dir = os.environ["CKPT_DIR"]
    total = int(os.environ.get("TOTAL_STEPS", "20"))
    pause = float(os.environ.get("STEP_SECONDS", "0.1"))
    path = os.path.join(ckpt_dir, "step")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    step = int(open(path).read()) if os.path.exists(path) else 0
    print(f"start rank={rank} world={world} step={step} "
          f"restart={os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
    while step < total:
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == world, f"all_reduce gave {t.item()} in a world of {world}"
        step += 1
        if rank == 0:
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                f.write(str(step))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)  # never a half-written checkpoint
        time.sleep(pause)
    dist.barrier()
    print(f"done rank={rank} world={world} step={step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    exit_without_finalizing(main() or 0)
