"""Launch overhead: `launch` vs the pinned torchrun vs the floor, interleaved in one run.

Each round runs the three commands in turn (order rotated per round) and times each whole
command from fork to exit. Reports medians and ratios. Usage:
  .venv/bin/python bench/launch_overhead.py --build build --rounds 30
"""
import argparse
import os
import statistics
import subprocess
import sys
import time


def timed(cmd, env):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr.decode()}")
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--program", default="/bin/true")
    ap.add_argument("--no-cgroup-too", action="store_true",
                    help="also time launch --cgroup=off (what the run's cgroup costs)")
    ap.add_argument("--no-tier-too", action="store_true",
                    help="also time launch --checkpoint-memory=0 (what the checkpoint memory "
                         "tier costs a job that never checkpoints)")
    args = ap.parse_args()

    venv_bin = os.path.dirname(sys.executable)
    torchrun = os.path.join(venv_bin, "torchrun")
    n = str(args.nproc)
    cmds = {
        "floor": [os.path.join(args.build, "bin", "spawn_floor"), n, args.program],
        "launch": [os.path.join(args.build, "bin", "launch"), "--standalone",
                   f"--nproc-per-node={n}", "--log-level=warn", args.program],
        "torchrun": [torchrun, "--standalone", f"--nproc-per-node={n}", "--no-python",
                     args.program],
    }
    if args.no_cgroup_too:
        cmds["launch-nocg"] = cmds["launch"][:1] + ["--cgroup=off"] + cmds["launch"][1:]
    if args.no_tier_too:
        cmds["launch-notier"] = (cmds["launch"][:1] + ["--checkpoint-memory=0"]
                                 + cmds["launch"][1:])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for name, cmd in cmds.items():  # warm caches once, untimed
        timed(cmd, env)
    times = {k: [] for k in cmds}
    names = list(cmds)
    for i in range(args.rounds):
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            times[name].append(timed(cmds[name], env))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"launch overhead, {args.nproc} workers of {args.program}, {args.rounds} interleaved rounds")
    for k in names:
        v = times[k]
        print(f"  {k:13s} median {med[k]*1e3:8.2f} ms   min {min(v)*1e3:8.2f} ms   max {max(v)*1e3:8.2f} ms")
    print(f"  torchrun / launch = {med['torchrun']/med['launch']:.1f}x  (target >= 50x)")
    print(f"  launch / floor    = {med['launch']/med['floor']:.2f}x  (target <= 2x)")
    if "launch-nocg" in med:
        print(f"  the run's cgroup costs {(med['launch'] - med['launch-nocg'])*1e3:.2f} ms "
              f"(launch against launch --cgroup=off)")
    if "launch-notier" in med:
        print(f"  the checkpoint tier costs {(med['launch'] - med['launch-notier'])*1e3:.2f} ms "
              f"(launch against launch --checkpoint-memory=0)")


if __name__ == "__main__":
    main()
