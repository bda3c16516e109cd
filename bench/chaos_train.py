"""The training job of bench/chaos_soak.py: a small Gloo DDP model, one worker per node, that
logs every step itself in the network-fault harness's event format (tests/netfault/train_common.py,
shared with its train.py: one fsynced JSON line per event, so a SIGKILLed worker's last steps are
kept).

Each step: forward, backward and an optimizer step of a 2-layer MLP under DDP (its gradients
all-reduced by Gloo), then STEP_SECONDS of sleep that stands in for an accelerator's compute (3
ranks share 2 cores here). Every CKPT_EVERY steps every rank saves {model, optim, step} with
ddplaunch.checkpoint (under launch: the memory tier, persisted to CKPT_DIR every PERSIST_EVERY
steps), and logs `ckpt_saved`. On start it resumes from ckpt.latest (memory, a peer's replica,
or disk: logged as `resumed` with `source`).

A checkpoint that cannot be written (the directory is full) is logged (`ckpt_failed`) and
training goes on: losing one checkpoint costs recompute on the next fault, not the job.

Environment: NETFAULT_EVENTS, NETFAULT_NODE, CKPT_DIR, CKPT_EVERY (1), PERSIST_EVERY (10),
STEP_SECONDS (0.15), PG_TIMEOUT (8 s), CKPT_MODE (ddplaunch; torch: rank 0 torch.saves latest.pt
every CKPT_EVERY steps and every rank torch.loads it, as a torchrun job does), CHAOS_STOP (a
file: once it holds N, every rank stops after step N, all at the same step, and exits 0).
"""
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "tests", "netfault"))
sys.path.insert(0, os.path.join(_HERE, "..", "python"))
import train_common  # noqa: E402  (the harness's own event writer)

_who = train_common.who
_group = [None]


def emit(event, **extra):
    if _group[0] is not None:
        extra["group"] = _group[0]
    train_common.emit(event, **extra)


def _torch_save(state, ckpt_dir):
    """What a torchrun user does: rank 0 writes latest.pt (whole, then renamed into place)."""
    import torch

    tmp = os.path.join(ckpt_dir, f"latest.pt.tmp{os.getpid()}")
    try:
        torch.save(state, tmp)
        os.replace(tmp, os.path.join(ckpt_dir, "latest.pt"))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _stop_at(path):
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def main():
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import ddplaunch
    from ddplaunch import checkpoint as ckpt

    every = int(os.environ.get("CKPT_EVERY", "1"))
    persist_every = int(os.environ.get("PERSIST_EVERY", "10"))
    pause = float(os.environ.get("STEP_SECONDS", "0.15"))
    pg_timeout = float(os.environ.get("PG_TIMEOUT", "8"))
    ckpt_dir = os.environ["CKPT_DIR"]
    torch_save = os.environ.get("CKPT_MODE") == "torch"
    stop_file = os.environ.get("CHAOS_STOP")
    train_common.exit_on_signals(emit)
    torch.set_num_threads(1)

    train_common.join_gloo(pg_timeout)
    # One token per group of workers, from rank 0: what the soak tells attempts apart by (launch
    # numbers rounds, torchrun's restart counts differ from node to node).
    token = [f"{os.environ.get('NETFAULT_NODE', '')}-{os.getpid()}-{time.time():.3f}"]
    dist.broadcast_object_list(token, src=0)
    _group[0] = token[0]
    emit("start")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step, source = 0, "none"
    if torch_save:
        path = os.path.join(ckpt_dir, "latest.pt")
        state = torch.load(path, weights_only=False) if os.path.exists(path) else None
        source = "disk" if state else "none"
    else:
        found = ckpt.latest(dir=ckpt_dir, timeout=max(30.0, 3 * pg_timeout))
        state = ckpt.load(found, weights_only=False) if found is not None else None
        source = found.source if found else "none"
    if state is not None:
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        step = int(state["step"])
    _who["step"] = step
    emit("resumed", step=step, source=source)
    while True:
        stop = _stop_at(stop_file) if stop_file else None
        if stop is not None and step >= stop:
            break
        x = torch.randn(16, 64)
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        time.sleep(pause)
        step += 1
        ddplaunch.step()  # launch's hang detection and summary (nothing without launch)
        _who["step"] = step
        emit("step", step=step)
        if every > 0 and step % every == 0 and torch_save:
            if dist.get_rank() == 0:
                try:
                    _torch_save({"model": model.module.state_dict(), "optim": opt.state_dict(),
                                 "step": step}, ckpt_dir)
                    emit("ckpt_saved", step=step)
                except OSError as e:
                    emit("ckpt_failed", step=step, msg=f"{type(e).__name__}: {e}"[:500])
        elif every > 0 and step % every == 0:
            try:
                ckpt.save({"model": model.module.state_dict(), "optim": opt.state_dict(),
                           "step": step}, step, dir=ckpt_dir, replicated=True,
                          persist=persist_every > 0 and step % persist_every == 0)
                emit("ckpt_saved", step=step)
            except ckpt.StaleRoundError as e:
                emit("ckpt_refused", step=step, msg=str(e)[:500])
                return 4
            except OSError as e:  # ENOSPC and the like: this checkpoint is lost, training is not
                emit("ckpt_failed", step=step, msg=f"{type(e).__name__}: {e}"[:500])
    ddplaunch.done()
    dist.barrier()
    emit("exit", step=step, msg="done")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    train_common.run(main, emit)
