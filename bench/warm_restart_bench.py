"""Issue 30's figures, side by side in one run: torchrun, launch (cold) and launch --prewarm=torch
on the same Python Gloo DDP job (bench/warm_train.py).

  resume     2 and 4 ranks, one worker SIGKILLed at a chosen step: seconds from the kill to the
             first step the restarted job completed (every rank), and the steps redone. torchrun
             checkpoints to disk (torch.save + fsync, rank 0), launch to its memory tier.
  goodput    a job of --goodput-seconds with a random worker SIGKILLed every --kill-every seconds:
             useful steps as a fraction of the same job's without failures (torchrun with disk
             checkpoints every --disk-every steps, launch warm with memory checkpoints every step).
  first      time from the launcher's start until every rank has imported torch and entered main.

    warm_restart_bench.py --build build [--rounds 3] [--ranks 2 4] [--parts resume first goodput]
    warm_restart_bench.py --build build --ab OLD/build --parts resume [--rounds 5]

--ab judges a change against the code before it: launch --prewarm=torch of OLD/build (A) and of
--build (B) in the resume part, interleaved round by round; prints B/A (below 1: B resumes faster).

Prints one line per figure (medians and spreads over the rounds) and the ratios.
"""
import argparse
import glob
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(ROOT, ".venv", "bin", "python")
TRAIN = os.path.join(ROOT, "bench", "warm_train.py")
OLD_BUILD = None  # --ab: the build of the code before, for the kinds ending in "-A"


def read_events(d):
    out = {}
    for path in glob.glob(os.path.join(d, "rank*.log")):
        rank = int(os.path.basename(path)[4:-4])
        rows = []
        for line in open(path):
            t, what, *v = line.split()
            rows.append((float(t), what, int(v[0]) if v else None))
        out[rank] = rows
    return out


def command(kind, nproc, args, tmp, max_restarts=1):
    if kind == "torchrun":
        return [os.path.join(ROOT, ".venv", "bin", "torchrun"), "--standalone",
                f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
                "--monitor-interval=0.1", TRAIN] + args
    build = OLD_BUILD if kind.endswith("-A") else BUILD
    cmd = [os.path.join(build, "bin", "launch"), "--standalone", f"--nproc-per-node={nproc}",
           f"--max-restarts={max_restarts}", "--log-dir", os.path.join(tmp, "logs")]
    if kind.startswith("warm"):
        cmd.append("--prewarm=torch")
    return cmd + [TRAIN] + args


def run_job(kind, nproc, args, tmp, env_extra=None, max_restarts=1, killer=None, timeout=600):
    events = os.path.join(tmp, "events")
    shutil.rmtree(events, ignore_errors=True)
    os.makedirs(events)
    env = dict(os.environ, BENCH_EVENTS=events, PYTHON_EXEC=PY, OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    if kind == "torchrun":
        # torch 2.9.1's agent-hosted store keeps a failed attempt's keys, and a restarted Gloo
        # group can read the dead ranks' addresses from it ("connectFullMesh failed ...
        # Connection refused"): rank 0's own store per attempt, as torchrun users do.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env.update(env_extra or {})
    log = open(os.path.join(tmp, f"{kind}.out"), "w")
    t0 = time.time()
    p = subprocess.Popen(command(kind, nproc, args, tmp, max_restarts), env=env, stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if killer:
            killer(p, events)
        rc = p.wait(timeout=timeout)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        log.close()
    if rc != 0:
        sys.exit(f"{kind} job failed (exit {rc}); its output: {log.name}\n" +
                 open(log.name).read()[-3000:])
    return t0, read_events(events)


def resume_round(kind, nproc, tmp, kill_step=15):
    ckpt = "disk" if kind == "torchrun" else "memory"
    d = os.path.join(tmp, "ckpt")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    _, ev = run_job(kind, nproc, ["--steps", str(kill_step + 10), "--ckpt", ckpt, "--dir", d,
                                  "--ckpt-every", "5", "--kill-at", f"{kill_step}:{nproc - 1}"],
                    tmp)
    kill_t = min(t for rows in ev.values() for t, w, _ in rows if w == "kill")
    # Each rank's first step completed after its last resume; the job's is the slowest rank's.
    firsts, resumed = [], None
    for rows in ev.values():
        last_resume = max(i for i, r in enumerate(rows) if r[1] == "resume")
        resumed = rows[last_resume][2]
        firsts.append(next(t for t, w, _ in rows[last_resume:] if w == "step"))
    return max(firsts) - kill_t, kill_step - resumed


def first_round(kind, nproc, tmp):
    """Seconds from the launcher's start until every rank is in main (torch imported), and
    until every rank completed its first DDP step (DDP's constructor imports torch's compiler
    stack: a cold worker pays for it there, a warm one did in the template)."""
    t0, ev = run_job(kind, nproc, ["--steps", "1", "--ckpt", "disk", "--dir", tmp,
                                   "--ckpt-every", "0"], tmp)
    main = max(next(t for t, w, _ in rows if w == "main") for rows in ev.values()) - t0
    step = max(next(t for t, w, _ in rows if w == "step") for rows in ev.values()) - t0
    return main, step


def goodput_round(kind, nproc, tmp, seconds, kill_every, disk_every, failures, seed):
    ckpt = "disk" if kind == "torchrun" else "memory"
    every = disk_every if kind == "torchrun" else 1
    d = os.path.join(tmp, "ckpt")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    rng = random.Random(seed)
    kills = []

    def killer(p, events):
        # The job's clock starts at the launcher's start; a kill every kill_every seconds.
        start = time.time()
        n = 1
        while p.poll() is None and time.time() - start < seconds:
            if time.time() - start >= n * kill_every:
                n += 1
                ev = read_events(events)
                # The newest pid of each rank (a restarted rank writes a new `main` line).
                pids = [max((t, v) for t, w, v in rows if w == "main")[1] for rows in ev.values()
                        if any(w == "main" for _, w, _ in rows)]
                if pids:
                    victim = rng.choice(sorted(pids))
                    try:
                        os.kill(victim, signal.SIGKILL)
                        kills.append(time.time())
                    except ProcessLookupError:
                        pass
            time.sleep(0.05)

    deadline = time.time() + seconds
    _, ev = run_job(kind, nproc, ["--deadline", f"{deadline:.3f}", "--ckpt", ckpt, "--dir", d,
                                  "--ckpt-every", str(every)], tmp, max_restarts=100,
                    killer=killer if failures else None, timeout=seconds + 300)
    # Useful steps: the last step the job completed (steps redone after a restart count once).
    done = min(max((v for _, w, v in rows if w == "step"), default=-1) for rows in ev.values())
    return done + 1, len(kills)


def spread(v, fmt="{:.2f}"):
    return f"{fmt.format(statistics.median(v))} ({fmt.format(min(v))}-{fmt.format(max(v))})"


def resume_ab(a, tmp):
    for nproc in a.ranks:
        got = {"warm-A": [], "warm": []}
        for i in range(a.rounds):
            order = ["warm-A", "warm"] if i % 2 == 0 else ["warm", "warm-A"]
            for k in order:
                got[k].append(resume_round(k, nproc, tmp)[0])
        pairs = [b / old for b, old in zip(got["warm"], got["warm-A"])]
        print(f"resume_ab ranks={nproc} A_s={spread(got['warm-A'])} B_s={spread(got['warm'])} "
              f"B/A={spread(pairs)} (median (range) of {a.rounds} pairs)", flush=True)


def main():
    global BUILD, OLD_BUILD
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--parts", nargs="+", default=["resume", "first", "goodput"])
    ap.add_argument("--goodput-seconds", type=float, default=150)
    ap.add_argument("--kill-every", type=float, default=30)
    ap.add_argument("--disk-every", type=int, default=20)
    ap.add_argument("--goodput-ranks", type=int, default=4)
    ap.add_argument("--ab", metavar="OLD_BUILD",
                    help="the resume part only, launch warm of OLD_BUILD against --build")
    a = ap.parse_args()
    BUILD = os.path.abspath(a.build)
    if a.ab:
        OLD_BUILD = os.path.abspath(a.ab)
        tmp = tempfile.mkdtemp(prefix="ddpl-warm-bench-")
        try:
            resume_ab(a, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    kinds = ["torchrun", "cold", "warm"]
    tmp = tempfile.mkdtemp(prefix="ddpl-warm-bench-")
    try:
        if "resume" in a.parts:
            for nproc in a.ranks:
                got = {k: [] for k in kinds}
                for _ in range(a.rounds):
                    for k in kinds:  # interleaved: the machine's drift hits every kind alike
                        got[k].append(resume_round(k, nproc, tmp))
                secs = {k: [s for s, _ in v] for k, v in got.items()}
                redone = {k: sorted({r for _, r in v}) for k, v in got.items()}
                ratios = [t / w for t, w in zip(secs["torchrun"], secs["warm"])]
                print(f"resume ranks={nproc} " + " ".join(
                    f"{k}_s={spread(secs[k])} {k}_redone={redone[k]}" for k in kinds) +
                    f" torchrun/warm={spread(ratios)}x torchrun/cold="
                    f"{spread([t / c for t, c in zip(secs['torchrun'], secs['cold'])])}x",
                    flush=True)
        if "first" in a.parts:
            for nproc in a.ranks:
                got = {k: [] for k in kinds}
                for _ in range(a.rounds):
                    for k in kinds:
                        got[k].append(first_round(k, nproc, tmp))
                for i, what in ((0, "in_main"), (1, "first_step")):
                    v = {k: [r[i] for r in got[k]] for k in kinds}
                    print(f"first_start {what} ranks={nproc} " +
                          " ".join(f"{k}_s={spread(v[k])}" for k in kinds) +
                          f" torchrun/warm={spread([t / w for t, w in zip(v['torchrun'], v['warm'])])}x"
                          f" cold/warm={spread([c / w for c, w in zip(v['cold'], v['warm'])])}x",
                          flush=True)
        if "goodput" in a.parts:
            n = a.goodput_ranks
            res = {}
            for k in ("torchrun", "warm"):
                clean, _ = goodput_round(k, n, tmp, a.goodput_seconds, a.kill_every, a.disk_every,
                                         False, 0)
                faulty, kills = goodput_round(k, n, tmp, a.goodput_seconds, a.kill_every,
                                              a.disk_every, True, 1)
                res[k] = (clean, faulty, kills)
                print(f"goodput {k} ranks={n} seconds={a.goodput_seconds:.0f} steps_clean={clean} "
                      f"steps_with_failures={faulty} kills={kills} goodput={faulty / clean:.3f}",
                      flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
