"""Deterministic DDP training (gloo) that checkpoints with ddplaunch.checkpoint, for the kill
tests: a run killed and resumed must end with the same parameters, bit for bit, as a run that
was never killed (compare the --out files with tests/python/ckpt_equal.py).

Fixed seed, a tiny model, batches derived from (step, rank), so a resumed run sees the same
data. Step s's checkpoint holds the state after step s; a resumed run starts at s + 1.

    torchrun --nproc-per-node=2 --max-restarts=1 ckpt_train.py --steps 20 --ckpt-every 5 \\
        --dir CKPT --out final.pt [--kill-at 12:1:step] [--dcp | --async]

--kill-at STEP:RANK:WHERE: on the first attempt only (TORCHELASTIC_RESTART_COUNT 0), rank RANK
(-1: every rank) SIGKILLs itself at STEP: WHERE=step after backward, before optimizer.step; WHERE=checkpoint
half way through writing that step's checkpoint (half the bytes of the file under begin()).

Prints exactly one line on rank 0 and on every rank that resumed: `resumed from step S
(memory|disk)` or `fresh start`.
"""
import argparse
import io
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import ddplaunch  # noqa: E402
from ddplaunch import checkpoint as ckpt  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--dir", help="durable checkpoint directory")
    p.add_argument("--out", help="rank 0 writes the final parameters here")
    p.add_argument("--kill-at", help="STEP:RANK:WHERE, WHERE in step|checkpoint")
    p.add_argument("--dcp", action="store_true", help="torch.distributed.checkpoint")
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="seconds to sleep in each step (a slower job to kill mid-run)")
    p.add_argument("--async", dest="async_", action="store_true",
                   help="ckpt.save_async (the write and commit on a thread)")
    args = p.parse_args()
    args.kill = None
    if args.kill_at:
        step, rank, where = args.kill_at.split(":")
        if where not in ("step", "checkpoint"):
            p.error(f"--kill-at WHERE must be step or checkpoint, not {where!r}")
        args.kill = (int(step), int(rank), where)
    return args


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 16, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def die():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def state_of(model, opt, dcp):
    if dcp:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        m, o = get_state_dict(model, opt)
        return {"model": m, "optim": o}
    return {"model": model.module.state_dict(), "optim": opt.state_dict()}


def restore(model, opt, found, dcp):
    if dcp:
        import torch.distributed.checkpoint as dcp_
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = state_of(model, opt, True)  # the structure to read into
        dcp_.load(state, storage_reader=ckpt.StorageReader(found))
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    else:
        state = ckpt.load(found)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])


def save(model, opt, step, args, rank, first_attempt):
    if args.kill and args.kill[0] == step and args.kill[1] in (rank, -1) \
            and args.kill[2] == "checkpoint" and first_attempt:
        buf = io.BytesIO()
        torch.save(state_of(model, opt, False), buf)
        path = ckpt.begin(step, dir=args.dir)
        with open(os.path.join(path, "state.pt"), "wb") as f:
            f.write(buf.getbuffer()[:len(buf.getbuffer()) // 2])
            f.flush()
        die()
    if args.dcp:
        import torch.distributed.checkpoint as dcp_

        dcp_.save(state_of(model, opt, True),
                  storage_writer=ckpt.StorageWriter(step, dir=args.dir))
    elif args.async_:
        ckpt.save_async(state_of(model, opt, False), step, dir=args.dir, replicated=True)
    else:
        ckpt.save(state_of(model, opt, False), step, dir=args.dir, replicated=True)


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    first_attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                              nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    start = 1
    found = ckpt.latest(dir=args.dir)
    if found:
        restore(model, opt, found, args.dcp)
        start = found.step + 1
        print(f"resumed from step {found.step} ({found.source})", flush=True)
    elif rank == 0:
        print("fresh start", flush=True)

    for step in range(start, args.steps + 1):
        x, y = batch(step, rank)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.kill and (args.kill[0], args.kill[2]) == (step, "step") \
                and args.kill[1] in (rank, -1) and first_attempt:
            die()
        opt.step()
        ddplaunch.step(step)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if args.ckpt_every > 0 and step % args.ckpt_every == 0:
            save(model, opt, step, args, rank, first_attempt)

    if rank == 0 and args.out:
        torch.save(model.module.state_dict(), args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
