"""What both parts of agent_store_bench.py share: the script's own path (it re-runs itself as
launch's worker, as a client process and as a process-group worker), the figures' formatting,
stopping processes it started, lines from a pipe with a timeout, and a launcher's environment."""
import os
import resource
import select
import signal
import statistics
import subprocess
import time

# The script every part re-runs (with --child, --client-proc or --pg-worker).
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent_store_bench.py")
RESULT_TAG = "AGENT_STORE_BENCH_RESULT "


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def fd_limit_of(pid):
    try:
        with open(f"/proc/{pid}/limits") as f:
            for line in f:
                if line.startswith("Max open files"):
                    return int(line.split()[3])
    except (OSError, ValueError, IndexError):
        pass
    return None


def med_ms(v):
    return statistics.median(v) * 1e3 if v else float("nan")


def ms_or_failed(v, digits=2):
    return f"{med_ms(v):.{digits}f} ms" if v else "FAILED"


def spread(v):
    return f"{min(v) * 1e3:.2f}-{max(v) * 1e3:.2f}" if v else "none"


def fmt_ratio(ref, ours):
    if not ref or not ours:
        return "n/a"
    return f"{statistics.median(ref) / statistics.median(ours):.2f}x"


def stop_process(p, grace=10.0, term=True):
    """Ends a process this script started (by its PID), politely first."""
    if p.poll() is not None:
        return
    try:
        if term:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                pass
        p.kill()
        p.wait(timeout=grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass


class LineReader:
    """Lines from a pipe, with a timeout on each."""

    def __init__(self, f):
        self.fd = f.fileno()
        self.buf = b""

    def readline(self, timeout_s, what):
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise TimeoutError(f"no answer in {timeout_s:.0f} s ({what})")
            data = os.read(self.fd, 65536)
            if not data:
                raise EOFError(f"pipe closed ({what})")
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()


def clean_env():
    """The environment for a launcher: none of an outer job's variables."""
    drop = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
            "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME")
    env = {k: v for k, v in os.environ.items()
           if k not in drop and not k.startswith(("TORCHELASTIC_", "PET_", "DDPL_"))}
    env["OMP_NUM_THREADS"] = "1"
    return env
