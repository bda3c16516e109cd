"""A worker that looks at launch's checkpoint tier from the outside (issue 44): whether the memory
root exists on /dev/shm, and whether launch (this worker's parent) holds an inotify descriptor
and a thread named ckpt-persister. Prints one JSON line per look ("probe {...}").

  tier_probe.py                 looks now and after --linger seconds (the ticks in between)
  tier_probe.py --save DIR      rank 0 then commits step 3 for DIR, looks again once launch
                                watches (20 s at most), commits step 4 and exits at once
"""
import argparse
import json
import os
import time

from ddplaunch import checkpoint as ckpt


def look(when):
    launch = os.getppid()
    inotify = 0
    for fd in os.listdir(f"/proc/{launch}/fd"):
        try:
            inotify += os.readlink(f"/proc/{launch}/fd/{fd}") == "anon_inode:inotify"
        except OSError:
            pass  # closed meanwhile
    threads = []
    for task in os.listdir(f"/proc/{launch}/task"):
        try:
            with open(f"/proc/{launch}/task/{task}/comm") as f:
                threads.append(f.read().strip())
        except OSError:
            pass
    root = os.environ.get("DDPL_CHECKPOINT_MEMORY", "")
    seen = {"when": when, "rank": int(os.environ["RANK"]), "root": root,
            "root_exists": bool(root) and os.path.lexists(root), "inotify": inotify,
            "persister": threads.count("ckpt-persister")}
    print("probe " + json.dumps(seen), flush=True)
    return seen


def commit(step, d):
    path = ckpt.begin(step, dir=d)
    with open(os.path.join(path, "w.bin"), "wb") as f:
        f.write(b"x" * 1000)
    ckpt.commit(step, dir=d)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--linger", type=float, default=1.0)
    ap.add_argument("--save")
    args = ap.parse_args()
    look("start")
    if not args.save:
        time.sleep(args.linger)
        look("end")
        return
    if int(os.environ["RANK"]) != 0:
        return
    commit(3, args.save)
    deadline = time.monotonic() + 20
    while True:
        seen = look("saved")
        if (seen["inotify"] and seen["persister"]) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    commit(4, args.save)  # just before the exit: launch's drain persists it


if __name__ == "__main__":
    main()
