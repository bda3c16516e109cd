"""What a worker sees of its own start, as JSON, so that a worker forked from launch's warm
template can be compared with one started cold (tests/integration/warm_worker_test.cc).
Writes $PROBE_DIR/<mode>.<rank>.json, then exits with $PROBE_EXIT_<rank> (default 0)."""
import ctypes
import json
import os
import random
import signal
import stat
import sys


def heartbeat_ok():
    try:
        st = os.fstat(int(os.environ["DDPL_HEARTBEAT_FD"]))
        return stat.S_ISREG(st.st_mode) and st.st_nlink == 0
    except (KeyError, ValueError, OSError):
        return False


def pdeathsig():
    sig = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
    return sig.value


def handler(s):
    h = signal.getsignal(s)
    return h if isinstance(h, int) else getattr(h, "__name__", repr(h))


rank = os.environ["RANK"]
cgroup = open("/proc/self/cgroup").read().strip().split("::", 1)[-1]
seen = {
    "argv": sys.argv,
    "orig_argv_tail": sys.orig_argv[1:],
    "cmdline": [a for a in open("/proc/self/cmdline").read().split("\0") if a],
    "file": __file__,
    "name": __name__,
    "spec": repr(__spec__),
    "package": __package__,
    "main_globals": sorted(k for k in globals() if k.startswith("__")),
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "env": {k: v for k, v in os.environ.items()
            if k not in ("DDPL_HEARTBEAT_FD", "MASTER_PORT", "TORCHELASTIC_ERROR_FILE",
                         "DDPL_CHECKPOINT_MEMORY", "DDPL_LAUNCH_ID", "DDPL_LAUNCH_MARKER",
                         "DDPL_ROUND_EPOCH", "DDPL_FLIGHT_RECORDER_SOCKET")},  # each launch's own
    "signals": {n: handler(getattr(signal, n))
                for n in ("SIGINT", "SIGTERM", "SIGPIPE", "SIGCHLD", "SIGUSR1", "SIGHUP")},
    "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "stdout": [sys.stdout.write_through, sys.stdout.line_buffering, sys.stdout.encoding],
    "own_group": os.getpgid(0) == os.getpid(),
    "parent_is_launch": open(f"/proc/{os.getppid()}/comm").read().strip() == "launch",
    "pdeathsig": pdeathsig(),
    "heartbeat": heartbeat_ok(),
    "threads": len(os.listdir("/proc/self/task")),
    # The attempt's leaf of the run's cgroup where launch makes one (its name holds launch's
    # pid: only the leaf and the run's prefix are compared), else launch's own.
    "cgroup": cgroup.rsplit("/", 1)[-1] if "/ddpl-" in cgroup else cgroup,
    "cgroup_run": "/ddpl-" in cgroup,
    "random": random.random(),  # differs between ranks: compared apart
}
with open(os.path.join(os.environ["PROBE_DIR"], f"{os.environ['PROBE_MODE']}.{rank}.json"), "w") as f:
    json.dump(seen, f, indent=1, sort_keys=True)
print(f"probe rank {rank} done", flush=True)
sys.exit(int(os.environ.get(f"PROBE_EXIT_{rank}", "0")))
