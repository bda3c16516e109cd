"""What the workers' events (train.py) and the agents' logs say about a run: violations of the
invariants and the figures of a fault. Pure functions over lists of event dicts, so that they
can be tested on synthetic events (invariants_test.py).

An event: {"t", "node", "rank", "world", "round", "epoch", "restart", "master", "event",
"step", "msg"?}. Rounds are identified by (epoch, round) from DDPL_ROUND(_EPOCH); where launch
gives no DDPL_ROUND (round -1), by the group's MASTER_ADDR:PORT, ordered by first appearance.

Invariants (docs/network-faults.md):
  overlap      two rounds train at once: a step of an older round after the first step of a
               newer one
  alive        a worker of an older round still ran (logged anything) after the workers of a
               newer round had formed their group (their first "start"): the stale node did
               not stop its workers before the new round's could overlap them
  world        ranks of one round report different world sizes, or one rank of a round runs on
               two nodes
  stale_ckpt   a checkpoint saved by an older round after a newer round had saved one
  mixed        an all_reduce gave a sum other than the world size (ranks of different worlds)
"""
import datetime
import glob
import json
import os
import re

STEP_EVENTS = ("step",)


def load_events(directory):
    """Every event line under directory/events-*.jsonl, sorted by time (torn lines skipped)."""
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "events-*.jsonl"))):
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if isinstance(e, dict) and "t" in e and "event" in e:
                    out.append(e)
    out.sort(key=lambda e: e["t"])
    return out


def round_key(e):
    """A sortable identity of the event's group: (0, epoch, round) with DDPL_ROUND, else
    (1, first-seen order) assigned by assign_rounds."""
    r = e.get("round", -1)
    if isinstance(r, int) and r >= 0:
        return (0, e.get("epoch", -1), r)
    return e.get("_fallback")


def assign_rounds(events):
    """Adds "_fallback" to events without DDPL_ROUND (their group's MASTER_ADDR:PORT, numbered by
    first appearance) and returns the sorted list of distinct round keys."""
    order = {}
    for e in sorted(events, key=lambda e: e["t"]):
        r = e.get("round", -1)
        if not (isinstance(r, int) and r >= 0):
            m = e.get("master") or f"?{e.get('node')}:{e.get('pid')}"
            if m not in order:
                order[m] = len(order)
            e["_fallback"] = (1, order[m], m)
    return sorted({round_key(e) for e in events})


def label(key):
    if key is None:
        return "?"
    if key[0] == 0:
        return f"round {key[2]}"
    return f"group {key[2]}"


def rounds(events):
    """{key: {"first", "last" (step times), "steps", "nodes", "worlds", "ranks", "max_step",
    "resumed" (lowest resumed step), "events"}} in round order."""
    keys = assign_rounds(events)
    info = {k: {"first": None, "last": None, "steps": 0, "nodes": set(), "worlds": set(),
                "ranks": {}, "max_step": 0, "resumed": None, "first_event": None,
                "last_event": None} for k in keys}
    for e in events:
        r = info[round_key(e)]
        r["nodes"].add(e.get("node"))
        r["first_event"] = e["t"] if r["first_event"] is None else min(r["first_event"], e["t"])
        r["last_event"] = e["t"] if r["last_event"] is None else max(r["last_event"], e["t"])
        if e.get("event") in ("start", "step", "resumed", "exit") and e.get("world", -1) > 0:
            r["worlds"].add(e["world"])
        if e.get("rank", -1) >= 0 and e.get("event") in ("start", "step"):
            r["ranks"].setdefault(e["rank"], set()).add(e.get("node"))
        if e.get("event") == "step":
            r["steps"] += 1
            r["first"] = e["t"] if r["first"] is None else min(r["first"], e["t"])
            r["last"] = e["t"] if r["last"] is None else max(r["last"], e["t"])
            r["max_step"] = max(r["max_step"], e.get("step") or 0)
        if e.get("event") == "resumed" and e.get("step") is not None:
            r["resumed"] = e["step"] if r["resumed"] is None else min(r["resumed"], e["step"])
    return info


def violations(events):
    """[(kind, message)] of every invariant the events break."""
    info = rounds(events)
    keys = list(info)
    out = []
    # overlap: an older round's step after a newer round's first step
    for i, old in enumerate(keys):
        for new in keys[i + 1:]:
            a, b = info[old], info[new]
            if a["last"] is None or b["first"] is None or a["last"] <= b["first"]:
                continue
            late = [e for e in events if round_key(e) == old and e.get("event") == "step"
                    and e["t"] > b["first"]]
            nodes = sorted({e.get("node") for e in late})
            out.append(("overlap",
                        f"{label(old)} made {len(late)} step(s) on {', '.join(nodes)} up to "
                        f"{a['last'] - b['first']:.2f}s after {label(new)}'s first step"))
    # alive: an older round's worker still running once a newer round's group formed
    starts = {}
    for e in events:
        if e.get("event") == "start":
            k = round_key(e)
            starts[k] = min(starts.get(k, e["t"]), e["t"])
    for i, old in enumerate(keys):
        later = [(starts[k], k) for k in keys[i + 1:] if k in starts]
        if not later:
            continue
        t_new, new = min(later)
        late = [e for e in events if round_key(e) == old and e["t"] > t_new
                and not e.get("outside_launch")]
        if late:
            last = max(late, key=lambda e: e["t"])
            nodes = sorted({e.get("node") for e in late})
            out.append(("alive", f"{label(old)}'s workers on {', '.join(nodes)} still ran "
                                 f"{last['t'] - t_new:.2f}s after {label(new)}'s group formed "
                                 f"(last: {last.get('event')} at step {last.get('step')})"))
    # world: one world size per round, one node per rank
    for k in keys:
        r = info[k]
        if len(r["worlds"]) > 1:
            out.append(("world", f"{label(k)}: ranks report world sizes {sorted(r['worlds'])}"))
        for rank, nodes in sorted(r["ranks"].items()):
            if len(nodes) > 1:
                out.append(("world", f"{label(k)}: rank {rank} ran on {', '.join(sorted(nodes))}"))
    # stale_ckpt: a save from an older round after a newer round saved
    newest = None
    for e in events:
        if e.get("event") != "ckpt_saved":
            continue
        k = round_key(e)
        if newest is not None and k < newest:
            out.append(("stale_ckpt", f"{label(k)} (node {e.get('node')}) saved step "
                                      f"{e.get('step')} after {label(newest)} had saved one"))
        if newest is None or k > newest:
            newest = k
    # mixed: a collective summed over a different world
    for e in events:
        if e.get("event") == "error" and "all_reduce gave" in (e.get("msg") or ""):
            out.append(("mixed", f"{label(round_key(e))} node {e.get('node')}: {e['msg']}"))
    return out


def affected_round(info, t_fault):
    """The newest round that had stepped by t_fault (the one training when the fault came)."""
    found = None
    for k, r in info.items():
        if r["first"] is not None and r["first"] <= t_fault:
            found = k
    return found


def finished(events, total_steps):
    """(True, why) when every rank of the final round reached total_steps."""
    info = rounds(events)
    if not info:
        return False, "no events at all"
    final = list(info)[-1]
    r = info[final]
    worlds = r["worlds"]
    if len(worlds) != 1:
        return False, f"final {label(final)} has world sizes {sorted(worlds)}"
    world = next(iter(worlds))
    done = {e.get("rank") for e in events if round_key(e) == final
            and e.get("event") in ("step", "exit") and (e.get("step") or 0) >= total_steps}
    missing = sorted(set(range(world)) - done)
    if missing:
        return False, (f"final {label(final)} (world {world}): rank(s) {missing} did not reach "
                       f"step {total_steps} (highest step {r['max_step']})")
    return True, f"final {label(final)} (world {world}) reached step {total_steps} on every rank"


def steps_between(events, t0, t1):
    """Distinct (round, step) pairs stepped in [t0, t1]."""
    return len({(round_key(e), e.get("step")) for e in events
                if e.get("event") == "step" and t0 <= e["t"] <= t1})


def figures(events, t_fault, total_steps=None, affected_nodes=None):
    """The figures of one fault injected at t_fault (seconds since the epoch):
    detection_s      fault -> the last event (step, exit, error) of the affected round's
                     workers (on affected_nodes if given): when they stopped; None when the
                     round trained on to the end (no newer round, no affected_nodes)
    last_step_s      fault -> the affected round's last step (any node)
    reformation_s    fault -> the first step of a newer round
    steps_lost       the highest step done before that first step minus the step the newer
                     round resumed from
    restarts         the highest TORCHELASTIC_RESTART_COUNT seen; rounds: distinct rounds
    finished         every rank of the final round reached total_steps
    None where it does not apply (no newer round: no re-formation)."""
    info = rounds(events)
    keys = list(info)
    f = {"rounds": len(keys), "round_labels": [label(k) for k in keys],
         "restarts": max([e.get("restart", -1) for e in events] or [-1]),
         "affected_round": None, "detection_s": None, "last_step_s": None,
         "reformation_s": None, "steps_lost": None, "next_round": None}
    aff = affected_round(info, t_fault)
    if aff is not None:
        f["affected_round"] = label(aff)
        mine = [e for e in events if round_key(e) == aff
                and e.get("event") in ("step", "exit", "error")
                and (affected_nodes is None or e.get("node") in affected_nodes)]
        newer = [k for k in keys[keys.index(aff) + 1:] if info[k]["first"] is not None]
        if mine and (newer or affected_nodes is not None):  # else the round never stopped
            f["detection_s"] = round(max(e["t"] for e in mine) - t_fault, 2)
        f["last_step_s"] = round(info[aff]["last"] - t_fault, 2)
        if newer:
            nxt = newer[0]
            n = info[nxt]
            f["next_round"] = label(nxt)
            f["reformation_s"] = round(n["first"] - t_fault, 2)
            before = [e.get("step") or 0 for e in events
                      if e.get("event") == "step" and e["t"] < n["first"]]
            resumed = n["resumed"]
            if resumed is None:
                firsts = [e.get("step") for e in events
                          if round_key(e) == nxt and e.get("event") == "step"]
                resumed = min(firsts) - 1
            f["steps_lost"] = max(before or [0]) - resumed
    if total_steps is not None:
        f["finished"], f["finished_why"] = finished(events, total_steps)
    return f


# ---------------------------------------------------------------------- agents' logs
_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\]")


def log_lines(text, pattern):
    """[(t or None, line)] of the lines matching the regex `pattern` (launch's and
    rdzv-server's lines start with [YYYY-mm-dd HH:MM:SS.mmm], local time)."""
    rx = re.compile(pattern)
    out = []
    for line in text.splitlines():
        if rx.search(line):
            m = _LOG_TIME.match(line)
            t = None
            if m:
                t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
            out.append((t, line))
    return out


def summary(info):
    """One line per round: its span, nodes and steps."""
    lines = []
    t0 = min((r["first_event"] for r in info.values() if r["first_event"]), default=0)
    for k, r in info.items():
        span = (f"steps {r['first'] - t0:.1f}..{r['last'] - t0:.1f}s" if r["first"] is not None
                else "no steps")
        lines.append(f"  {label(k)}: world {sorted(r['worlds'])}, nodes "
                     f"{','.join(sorted(n for n in r['nodes'] if n))}, {span}, "
                     f"{r['steps']} step events, resumed from {r['resumed']}, "
                     f"highest step {r['max_step']}")
    return "\n".join(lines)
