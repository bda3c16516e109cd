"""Format 1's names and encodings (docs/checkpoints.md), pure: no file is touched here. The
C++ side of the same is common/checkpoint_format.h."""
import json
import re

VERSION = 1
RECORD = ".ddpl-commit.json"  # a committed step's record, in its directory
ORIGIN = ".ddpl-origin"  # in a step launch copied from another node's replica
FENCE = ".ddpl-fence"
FENCE_MAX = 4096

STEP_DIR = re.compile(r"step-(\d+)\Z")
MARKER = re.compile(r"\.ddpl-step-(\d+)\.rank-(\d+)\.json\Z")


def rank_dir_name(rank):
    return f"rank-{rank}"


def step_dir_name(step):
    return f"step-{step}"


def partial_dir_name(step, pid):
    return f"partial-{step}-{pid}"


def marker_name(step, rank):
    return f".ddpl-step-{step}.rank-{rank}.json"


def disk_partial_name(step, rank, pid):
    """Where the module writes step `step` of `rank` without launch, in the durable dir."""
    return f".partial-step-{step}-rank-{rank}-{pid}"


def encode_record(record):
    return json.dumps(record, indent=1).encode()


def describe_fence(t):
    return f"round {t[2]} (epoch {t[1]}) of run {t[0]!r}"


def encode_fence(t):
    return (json.dumps({"run_id": t[0], "epoch": t[1], "round": t[2]}) + "\n").encode()


def decode_fence(data):
    """(run id, epoch, round), or None when `data` is not a fence (no refusal on it)."""
    try:
        j = json.loads(data) if 0 < len(data) <= FENCE_MAX else None
    except ValueError:
        return None
    if (not isinstance(j, dict) or not isinstance(j.get("run_id"), str)
            or type(j.get("epoch")) is not int or type(j.get("round")) is not int
            or j["epoch"] < 0 or j["round"] < 0):
        return None
    return (j["run_id"], j["epoch"], j["round"])


def fence_refuses(newest, mine):
    """Whether a write by `mine` is refused where `newest` last committed: the same run, an
    older (epoch, round)."""
    return (newest is not None and newest[0] == mine[0]
            and (mine[1], mine[2]) < (newest[1], newest[2]))
