"""The training job of bench/warm_restart_bench.py: a small Gloo DDP model whose steps take
--step-ms (a sleep stands in for the accelerator, so that 4 ranks fit 2 cores), checkpointed every
--ckpt-every steps, to disk with torch.save (--ckpt disk: what a torchrun user does) or to
launch's memory tier with ddplaunch.checkpoint (--ckpt memory). Every rank appends its events to
$BENCH_EVENTS/rank<R>.log as `<unix time> <event> <value>` lines: `main` (imports done, in main),
`resume <step>`, `step <step>` (completed), `kill <step>`.

--kill-at STEP:RANK: on the first attempt, RANK SIGKILLs itself after completing step STEP - 1.
--deadline UNIX: stop stepping then (the goodput job); else after --steps.
"""
import argparse
import os
import signal
import sys
import time

T_START = time.time()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import ddplaunch  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10**9)
    p.add_argument("--deadline", type=float, default=0)
    p.add_argument("--step-ms", type=float, default=50)
    p.add_argument("--ckpt-every", type=int, default=1)
    p.add_argument("--ckpt", choices=("disk", "memory"), required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--kill-at")
    p.add_argument("--width", type=int, default=256)
    a = p.parse_args()
    rank = int(os.environ["RANK"])
    events = open(os.path.join(os.environ["BENCH_EVENTS"], f"rank{rank}.log"), "a", buffering=1)

    def say(what, value=""):
        events.write(f"{time.time():.6f} {what} {value}\n")

    say("main", os.getpid())
    attempt0 = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(a.width, a.width), nn.ReLU(), nn.Linear(a.width, a.width)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if a.ckpt == "memory":
        from ddplaunch import checkpoint as ckpt
        found = ckpt.latest(dir=a.dir)
        if found:
            state = ckpt.load(found)
            model.module.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
            start = found.step + 1
    else:
        # The newest complete step every rank wrote: rank 0 writes, all read (one file system).
        path = os.path.join(a.dir, "latest.pt")
        if os.path.exists(path):
            state = torch.load(path)
            model.module.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
            start = state["step"] + 1
    say("resume", start)
    kill = tuple(int(x) for x in a.kill_at.split(":")) if a.kill_at else None
    step = start
    while step < a.steps and (a.deadline == 0 or time.time() < a.deadline):
        if kill and attempt0 and step == kill[0] and rank == kill[1]:
            say("kill", step)
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.time()
        x = torch.randn(32, a.width)
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        left = a.step_ms / 1000 - (time.time() - t0)
        if left > 0:
            time.sleep(left)
        if a.ckpt_every > 0 and step % a.ckpt_every == 0:
            state = {"model": model.module.state_dict(), "optim": opt.state_dict(), "step": step}
            if a.ckpt == "memory":
                ckpt.save(state, step, dir=a.dir, replicated=True)
            elif rank == 0:
                tmp = os.path.join(a.dir, f".latest.{os.getpid()}")
                with open(tmp, "wb") as f:
                    torch.save(state, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, os.path.join(a.dir, "latest.pt"))
        ddplaunch.step(step + 1)
        say("step", step)
        step += 1
    say("end", step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
