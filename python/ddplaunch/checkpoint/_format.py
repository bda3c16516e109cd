"""Format 1's names, encodings and decisions (docs/checkpoints.md), pure: no file is touched
here. The C++ side of the same is common/checkpoint_format.h, rule for rule: the golden vectors
under tests/golden/checkpoint hold both to the same bytes."""
import json

VERSION = 1
RECORD = ".ddpl-commit.json"  # a committed step's record, in its directory
ORIGIN = ".ddpl-origin"  # in a step launch copied from another node's replica
FENCE = ".ddpl-fence"
FENCE_MAX = 4096
MAX_FILES = 4096  # a record that lists more is refused as hostile or broken
MAX_RECORD_BYTES = 4 << 20
_INT64_MAX = (1 << 63) - 1


class RecordError(ValueError):
    """A commit record (or marker) that is not one: the message names the field."""


# ---------------------------------------------------------------------------- names

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


def _count(s):
    """A non-negative decimal without sign, leading zeros or overflow, else None: "step-007" is
    not a step directory, so two names never mean the same step."""
    if not s or len(s) > 18 or (len(s) > 1 and s[0] == "0") or not all("0" <= c <= "9" for c in s):
        return None
    return int(s)


def parse_step_dir_name(name):
    return _count(name[5:]) if name.startswith("step-") else None


def parse_rank_dir_name(name):
    return _count(name[5:]) if name.startswith("rank-") else None


def parse_partial_dir_name(name):
    """(step, pid) of "partial-<step>-<pid>", or None."""
    if not name.startswith("partial-"):
        return None
    step, dash, pid = name[8:].partition("-")
    step, pid = _count(step), _count(pid) if dash else None
    if step is None or pid is None or pid > 2**31 - 1:
        return None
    return step, pid


def parse_marker_name(name):
    """(step, rank) of ".ddpl-step-<step>.rank-<rank>.json", or None."""
    head, mid, tail = ".ddpl-step-", ".rank-", ".json"
    if not name.startswith(head) or len(name) < len(head) + len(tail) or not name.endswith(tail):
        return None
    body = name[len(head):len(name) - len(tail)]
    at = body.find(mid)
    if at < 0:
        return None
    step, rank = _count(body[:at]), _count(body[at + len(mid):])
    return None if step is None or rank is None else (step, rank)


def safe_relative_path(path):
    """A relative path that stays inside its directory: no "..", no leading "/", no empty part."""
    if not isinstance(path, str) or not path or path[0] == "/" or len(path.encode()) > 4096:
        return False
    return all(part not in ("", ".", "..") and "\0" not in part for part in path.split("/"))


# ---------------------------------------------------------------------------- JSON

def _dump(obj):
    """The one encoding both sides write: keys sorted, no whitespace, UTF-8 as is (nlohmann's
    dump() of the same object, byte for byte)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def _refuse_constant(name):
    raise ValueError(f"{name} is not JSON")


def _finite(text):
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is out of range")
    return value


def _parse(data):
    """JSON as nlohmann parses it: UTF-8 (a BOM skipped), no NaN or Infinity, no number out of
    a double's range; None where it is not JSON."""
    try:
        if isinstance(data, (bytes, bytearray)):
            data = bytes(data).decode("utf-8-sig")
        return json.loads(data, parse_constant=_refuse_constant, parse_float=_finite)
    except (ValueError, RecursionError):
        return None


def _shown(v):
    """A wrong value as a message shows it: a scalar as written (cut), a list or object by its
    kind only."""
    if isinstance(v, (dict, list)):
        return "a JSON " + ("object" if isinstance(v, dict) else "array")
    text = json.dumps(v, ensure_ascii=False)
    return text[:200] + "..." if len(text) > 200 else text


def _field(j, name):
    if name not in j:
        raise RecordError(f"commit record: no '{name}'")
    return j[name]


def _is_int(v):
    return type(v) is int and v <= _INT64_MAX  # nlohmann reads a larger one as negative


def _non_negative(j, name):
    v = _field(j, name)
    if not _is_int(v) or v < 0:
        raise RecordError(f"commit record: '{name}' is not a non-negative integer: {_shown(v)}")
    return v


def _flag(j, name):
    v = _field(j, name)
    if type(v) is not bool:
        raise RecordError(f"commit record: '{name}' is not true/false")
    return v


def encode_record(record):
    """The record's bytes: the fields docs/checkpoints.md lists (the writer's run, epoch and
    round only when it has an epoch), in the one encoding."""
    keys = ("version", "step", "rank", "world_size", "files", "bytes", "durable_path", "persist",
            "replicated", "keep", "time")
    out = {k: record[k] for k in keys}
    out["files"] = [{"path": f["path"], "size": f["size"]} for f in record["files"]]
    if record.get("epoch", 0) > 0:
        out.update(run_id=record["run_id"], epoch=record["epoch"], round=record["round"])
    return _dump(out)


def decode_record(data):
    """The record in `data` as a dict with every field checked, as common/checkpoint_format.h's
    decodeRecord checks it; raises RecordError naming the field otherwise."""
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"commit record: {len(data)} bytes (limit {MAX_RECORD_BYTES})")
    j = _parse(data)
    if not isinstance(j, dict):
        raise RecordError("commit record: not a JSON object")
    r = {"version": _non_negative(j, "version")}
    if r["version"] != VERSION:
        raise RecordError(f"commit record: format version {r['version']}, this build reads "
                          f"{VERSION}")
    for name in ("step", "rank", "world_size"):
        r[name] = _non_negative(j, name)
    if r["world_size"] < 1 or r["rank"] >= r["world_size"]:
        raise RecordError(f"commit record: rank {r['rank']} of world size {r['world_size']}")
    files = _field(j, "files")
    if not isinstance(files, list):
        raise RecordError("commit record: 'files' is not a list")
    if len(files) > MAX_FILES:
        raise RecordError(f"commit record: {len(files)} files (limit {MAX_FILES})")
    total, seen, r["files"] = 0, set(), []
    for f in files:
        if not isinstance(f, dict):
            raise RecordError("commit record: a file entry is not an object")
        p = _field(f, "path")
        if not isinstance(p, str) or not safe_relative_path(p):
            raise RecordError(f"commit record: unsafe file path {_shown(p)}")
        size = _non_negative(f, "size")
        if p in seen:
            raise RecordError(f"commit record: file '{p}' listed twice")
        seen.add(p)
        if p == RECORD:
            raise RecordError("commit record: lists itself")
        if size > _INT64_MAX - total:
            raise RecordError("commit record: file sizes add up past 2^63 bytes")
        total += size
        r["files"].append({"path": p, "size": size})
    r["bytes"] = _non_negative(j, "bytes")
    if r["bytes"] != total:
        raise RecordError(f"commit record: 'bytes' is {r['bytes']} but the files add up to "
                          f"{total}")
    d = _field(j, "durable_path")
    if not isinstance(d, str):
        raise RecordError("commit record: 'durable_path' is not a string")
    if d and d[0] != "/":
        raise RecordError(f"commit record: 'durable_path' is not absolute: {d}")
    r["durable_path"] = d
    r["persist"] = _flag(j, "persist")
    r["replicated"] = _flag(j, "replicated")
    r["keep"] = _non_negative(j, "keep")
    t = _field(j, "time")
    if type(t) not in (int, float):
        raise RecordError("commit record: 'time' is not a number")
    r["time"] = float(t)
    if "epoch" in j:
        r["epoch"] = _non_negative(j, "epoch")
        r["round"] = _non_negative(j, "round")
        run = _field(j, "run_id")
        if not isinstance(run, str):
            raise RecordError("commit record: 'run_id' is not a string")
        r["run_id"] = run
    return r


# ---------------------------------------------------------------------------- the fence

def describe_fence(t):
    return f"round {t[2]} (epoch {t[1]}) of run {t[0]!r}"


def encode_fence(t):
    return _dump({"run_id": t[0], "epoch": t[1], "round": t[2]}) + b"\n"


def decode_fence(data):
    """(run id, epoch, round), or None when `data` is not a fence (no refusal on it)."""
    if len(data) > FENCE_MAX:
        return None
    j = _parse(data)
    if (not isinstance(j, dict) or not isinstance(j.get("run_id"), str)
            or not _is_int(j.get("epoch")) or not _is_int(j.get("round"))
            or j["epoch"] < 0 or j["round"] < 0):
        return None
    return (j["run_id"], j["epoch"], j["round"])


def fence_refuses(newest, mine):
    """Whether a write by `mine` is refused where `newest` last committed: both known (an epoch
    above 0), the same run, and an older (epoch, round)."""
    if newest is None or mine is None or newest[1] <= 0 or mine[1] <= 0 or newest[0] != mine[0]:
        return False
    return (mine[1], mine[2]) < (newest[1], newest[2])


# ---------------------------------------------------------------------------- decisions

def agree_on_step(offers):
    """The newest step every rank offered, or None. `offers[r]` is rank r's steps."""
    if not offers:
        return None
    common = set(offers[0])
    for theirs in offers[1:]:
        common &= set(theirs)
    return max(common) if common else None


def steps_to_retire(persisted, keep):
    """Durable retention: of the steps persisted for one rank, those to remove so that the
    newest `keep` stay (keep <= 0: none). Oldest first."""
    steps = sorted(set(persisted))
    if keep <= 0 or len(steps) <= keep:
        return []
    return steps[:len(steps) - keep]


def write_allowance(budget, committed_bytes):
    """Memory a write may use: the budget minus what the committed steps present hold."""
    return max(0, budget - committed_bytes)
