"""Launch overhead of two builds side by side: `launch --standalone` of build A and of build B
and the spawn floor, interleaved in one run (the order rotated per round), so that a change's
cost is measured against the code before it under the same machine load. Usage:
  .venv/bin/python bench/launch_overhead_ab.py --a OLD_BUILD --b build --rounds 40
"""
import argparse
import os
import statistics

from launch_overhead import timed  # this script's folder is on sys.path when it runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="build directory of the code before")
    ap.add_argument("--b", default="build", help="build directory of the code after")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--program", default="/bin/true")
    args = ap.parse_args()
    n = str(args.nproc)

    def launch(build):
        return [os.path.join(build, "bin", "launch"), "--standalone", f"--nproc-per-node={n}",
                "--log-level=warn", args.program]

    cmds = {"floor": [os.path.join(args.b, "bin", "spawn_floor"), n, args.program],
            "A": launch(args.a), "B": launch(args.b)}
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for cmd in cmds.values():
        timed(cmd, env)
    times = {k: [] for k in cmds}
    names = list(cmds)
    for i in range(args.rounds):
        for name in names[i % 3:] + names[:i % 3]:
            times[name].append(timed(cmds[name], env))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.rounds} interleaved rounds, {args.nproc} x {args.program}; A={args.a} B={args.b}")
    for k in names:
        print(f"  {k:5s} median {med[k]*1e3:7.2f} ms  (x{med[k]/med['floor']:.2f} floor)")
    print(f"  B / A = {med['B']/med['A']:.2f}")


if __name__ == "__main__":
    main()
