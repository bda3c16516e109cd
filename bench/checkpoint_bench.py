"""How long a checkpoint blocks training: the memory tier (ddplaunch.checkpoint.save into a
memory root on /dev/shm) against torch.save to a local disk file with fsync and against DCP
(torch.distributed.checkpoint.save, FileSystemWriter) to local disk, side by side, per state
size (a dict of float32 tensors). Then the checkpoint interval each method allows at <= 5%
overhead and the steps a failure costs.

    checkpoint_bench.py [--sizes-mb 100,1000] [--repeats 5] [--step-ms 200]
                        [--disk-dir DIR] [--launch PATH]

Without --launch the memory tier runs under a simulated memory root (what launch creates:
a 0700 directory on /dev/shm with rank-0/), where nothing persists in the background; with
--launch PATH the measured saves run in a worker under `PATH --checkpoint-memory=...`, so
launch's background copy to --disk-dir runs while they are measured.

Everything the bench creates (on /dev/shm and in --disk-dir) is removed at the end, on error
and on Ctrl-C. The last lines, one per size:
    size_mb=100 memory_ms=.. torch_save_ms=.. dcp_ms=.. ratio_torch_save=..x ratio_dcp=..x
"""
import argparse
import warnings
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

OVERHEAD = 0.05  # the share of training time a user gives to checkpoints
# DCP says, once per call, that it runs in one process and that TypedStorage is deprecated.
warnings.filterwarnings("ignore", category=UserWarning, module="torch")


def make_state(size_mb):
    import torch

    numel = size_mb * 1_000_000 // 4
    chunk = 16 * 1024 * 1024  # 64 MB tensors, like a model's larger layers
    state, i = {}, 0
    while numel > 0:
        n = min(chunk, numel)
        state[f"layer{i}.weight"] = torch.rand(n)
        numel -= n
        i += 1
    return state


def timed(fn):
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def bench_memory(state, repeats, durable):
    """ckpt.save and ckpt.save_async as a training loop calls them, in the memory root the
    environment names. save_async's blocked time is its call (the copy of the state); its
    write and commit run on a thread, timed from the call to the commit (async_commit) and
    waited for before the next call, as the training steps between two checkpoints would."""
    from ddplaunch import checkpoint as ckpt

    out = {"memory_sync": [], "memory_async": [], "async_commit": []}
    for step in range(1, 2 * repeats + 1):
        found = None
        if step <= repeats:
            def save():
                nonlocal found
                found = ckpt.save(state, step, dir=durable, replicated=True)

            out["memory_sync"].append(timed(save))
        else:
            t0 = time.perf_counter()
            pending = ckpt.save_async(state, step, dir=durable, replicated=True)
            out["memory_async"].append((time.perf_counter() - t0) * 1000)
            found = pending.result()
            out["async_commit"].append((time.perf_counter() - t0) * 1000)
        if found is None or found.source != "memory":
            raise SystemExit(f"step {step} did not stay in memory ({found}): the budget is "
                             "too small for this size")
    return out


def bench_torch_save(state, repeats, disk):
    import torch

    times = []
    for i in range(repeats):
        path = os.path.join(disk, f"torch-save-{i}.pt")

        def save():
            with open(path, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())

        times.append(timed(save))
        os.unlink(path)
    return times


def bench_dcp(state, repeats, disk):
    import torch.distributed.checkpoint as dcp

    times = []
    for i in range(repeats):
        path = os.path.join(disk, f"dcp-{i}")
        times.append(timed(lambda: dcp.save(
            state, storage_writer=dcp.FileSystemWriter(path), no_dist=True)))
        shutil.rmtree(path)
    return times


def memory_simulated(state, repeats, tmp):
    root = tempfile.mkdtemp(prefix="ddpl-ckpt-bench-", dir="/dev/shm")
    try:
        os.chmod(root, 0o700)
        os.mkdir(os.path.join(root, "rank-0"), 0o700)
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        os.environ.update(DDPL_CHECKPOINT_MEMORY=root, DDPL_CHECKPOINT_MEMORY_KEEP="1",
                          DDPL_CHECKPOINT_MEMORY_BUDGET=str(3 * nbytes),
                          RANK="0", WORLD_SIZE="1")
        return bench_memory(state, repeats, os.path.join(tmp, "durable"))
    finally:
        for k in ("DDPL_CHECKPOINT_MEMORY", "DDPL_CHECKPOINT_MEMORY_KEEP",
                  "DDPL_CHECKPOINT_MEMORY_BUDGET"):
            os.environ.pop(k, None)
        shutil.rmtree(root, ignore_errors=True)


def memory_under_launch(launch, size_mb, repeats, tmp):
    result = os.path.join(tmp, "launch-result.json")
    cmd = [launch, "--standalone", "--nproc-per-node=1",
           f"--checkpoint-memory={3 * size_mb}M", "--checkpoint-memory-keep=1",
           f"--checkpoint-dir={os.path.join(tmp, 'durable')}", "--no-python",
           sys.executable, os.path.abspath(__file__), "--worker", str(size_mb),
           "--repeats", str(repeats), "--result", result]
    subprocess.run(cmd, check=True)
    with open(result) as f:
        return json.load(f)


def worker(args):
    if not os.environ.get("DDPL_CHECKPOINT_MEMORY"):
        raise SystemExit("the worker runs under launch with --checkpoint-memory: "
                         "DDPL_CHECKPOINT_MEMORY is not set")
    times = bench_memory(make_state(args.worker), args.repeats, os.environ["DDPL_CHECKPOINT_DIR"])
    with open(args.result, "w") as f:
        json.dump(times, f)


def summary(times):
    return statistics.median(times), min(times), max(times)


def fmt(times):
    med, lo, hi = summary(times)
    return f"{med:9.1f} ms (min {lo:.1f}, max {hi:.1f})"


def interval_for(blocked_ms, step_ms):
    return max(1, math.ceil(blocked_ms / (OVERHEAD * step_ms)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes-mb", default="100,1000")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--step-ms", type=float, default=200.0,
                   help="a training step's time (200 ms: a small model's step on this machine)")
    p.add_argument("--disk-dir", help="a directory on the local disk (default: a new one under "
                                      "the build directory, else /var/tmp)")
    p.add_argument("--launch", help="run the memory tier's saves in a worker under this launch")
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    sizes = [int(s) for s in args.sizes_mb.split(",") if s]

    base = args.disk_dir or (os.path.join(ROOT, "build") if os.path.isdir(os.path.join(ROOT, "build"))
                             else "/var/tmp")
    os.makedirs(base, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="ddpl-ckpt-bench-", dir=base)
    # SIGTERM cleans up like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        run(args, sizes, tmp)
    except KeyboardInterrupt:
        print("interrupted; removing what the bench created", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args, sizes, tmp):
    where = (f"in a worker under {args.launch} (launch copies each step to disk in the "
             "background while the next ones are measured)" if args.launch else
             "under a simulated memory root on /dev/shm (as launch makes it; nothing is "
             "persisted in the background)")
    print(f"memory_async: ddplaunch.checkpoint.save_async(state, step, replicated=True): "
          f"the copy of the state blocks, the write to memory and the commit run on a thread; "
          f"{where}; keep 1")
    print("memory_sync:  ddplaunch.checkpoint.save(...): torch.save into launch's memory and "
          "the commit, all blocking")
    print(f"torch_save: torch.save to a new file in {tmp}, then flush and fsync "
          "(what a careful user does)")
    print(f"dcp:        torch.distributed.checkpoint.save, FileSystemWriter (fsync), one "
          f"process, to {tmp}")
    print(f"repeats: {args.repeats}; blocked time = wall time of the call (median, min, max)\n")
    results, commits = {}, {}
    for size in sizes:
        state = make_state(size)
        disk = os.path.join(tmp, "disk")
        os.makedirs(disk, exist_ok=True)
        memory = (memory_under_launch(args.launch, size, args.repeats, tmp) if args.launch
                  else memory_simulated(state, args.repeats, tmp))
        shutil.rmtree(os.path.join(tmp, "durable"), ignore_errors=True)
        results[size] = {"memory_async": memory["memory_async"],
                         "memory_sync": memory["memory_sync"],
                         "torch_save": bench_torch_save(state, args.repeats, disk),
                         "dcp": bench_dcp(state, args.repeats, disk)}
        commits[size] = memory["async_commit"]
        del state
        print(f"{size} MB")
        for name, times in results[size].items():
            print(f"  {name:12s} {fmt(times)}")
        print(f"  (save_async, from the call to the commit: {fmt(commits[size])})")

    print(f"\nsteps lost per failure, at a step time of {args.step_ms:g} ms: the interval is the "
          f"fewest steps between checkpoints that keeps checkpoint time <= {OVERHEAD:.0%} of "
          f"training (interval >= blocked / ({OVERHEAD:g} x step)); a failure loses on average "
          "half an interval of steps, to be run again (the restart itself not counted)")
    for size, res in results.items():
        cols = []
        for name in ("memory_async", "memory_sync", "torch_save", "dcp"):
            k = interval_for(summary(res[name])[0], args.step_ms)
            cols.append(f"{name}: every {k} steps, loses {k / 2:g}")
        print(f"  {size} MB  " + " | ".join(cols))
    print()
    for size, res in results.items():
        m, ms, t, d = (summary(res[n])[0]
                       for n in ("memory_async", "memory_sync", "torch_save", "dcp"))
        print(f"size_mb={size} memory_ms={m:.1f} memory_sync_ms={ms:.1f} torch_save_ms={t:.1f} "
              f"dcp_ms={d:.1f} ratio_torch_save={t / m:.1f}x ratio_dcp={d / m:.1f}x")


if __name__ == "__main__":
    sys.exit(main())
