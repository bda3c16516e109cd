"""The chaos soak's analysis (bench/chaos_soak.py): from the workers' step events and the faults
injected, the groups of workers (attempts), the steps kept (the final state's lineage), ETTR,
each incident's phases, and the soak's invariants. Pure: no process, no clock; unit-tested by
tests/netfault/chaos_analysis_test.py on made-up events."""
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "netfault"))
import invariants as inv  # noqa: E402

NODE_DOWN_S = 20  # node_kill restarts, node_cut heals, ckpt_full frees after this long
# An agent's fence, c10d (rdzv-server's heartbeats) or etcd (its lease's keep-alives).
FENCE_LINE = r"fencing: no (heartbeat|etcd keep-alive) answered"
# An agent's lines about etcd after its leader was killed: a watch or keep-alive stream that
# broke and moved on, a call that waited, a round ended over it.
ETCD_LINE = r"etcd|lease"


def attempt_key(e):
    """The group of workers an event belongs to: the token its rank 0 gave it (chaos_train.py),
    or for a worker that failed before it had one, the worker itself."""
    return e.get("group") or f"no group: {e.get('node')} pid {e.get('pid')}"


def attempts(events):
    """{key: {"first_event", "start", "resumed", "resumed_t", "sources", "steps": {step: t}}}
    in attempt order; a step's time is the last rank's (the step is done when every rank is)."""
    inv.assign_rounds(events)
    out = {}
    for e in events:
        k = attempt_key(e)
        a = out.setdefault(k, {"first_event": e["t"], "start": None, "resumed": None,
                               "resumed_t": None, "sources": set(), "steps": {}, "last_event": 0,
                               "nodes": set()})
        a["first_event"] = min(a["first_event"], e["t"])
        a["last_event"] = max(a["last_event"], e["t"])
        a["nodes"].add(e.get("node"))
        ev = e.get("event")
        if ev == "start" and a["start"] is None:
            a["start"] = e["t"]
        elif ev == "resumed" and e.get("step") is not None:
            a["resumed"] = e["step"] if a["resumed"] is None else min(a["resumed"], e["step"])
            a["resumed_t"] = max(a["resumed_t"] or 0, e["t"])
            a["sources"].add(e.get("source", "?"))
        elif ev == "step" and e.get("step") is not None:
            s = e["step"]
            a["steps"][s] = max(a["steps"].get(s, 0), e["t"])
    return dict(sorted(out.items(), key=lambda kv: kv[1]["first_event"]))


def kept_steps(atts):
    """[(step, attempt key, begin, end)] of the steps that were kept: the lineage of the final
    state, followed back from the last attempt that stepped: its steps after the step it resumed
    from, then that step's producer (the newest earlier attempt that did that step) from the step
    it resumed from, and so on. Every other step was lost (recomputed, or never used: an attempt
    can resume from a state newer than its predecessor's, made by an earlier one)."""
    keys = [k for k in atts if atts[k]["steps"]]
    if not keys:
        return []
    out = []
    k, upto = keys[-1], None
    while k is not None:
        a = atts[k]
        base = a["resumed"] or 0
        for s in sorted(a["steps"]):
            if s <= base or (upto is not None and s > upto):
                continue
            begin = a["steps"].get(s - 1, a["resumed_t"] if s == base + 1 else None)
            out.append((s, k, begin, a["steps"][s]))
        if base <= 0:
            break
        earlier = [j for j in keys[:keys.index(k)] if base in atts[j]["steps"]]
        k, upto = (earlier[-1], base) if earlier else (None, None)
    return sorted(out)


def soak_violations(events, atts, kept):
    """The soak's invariants beyond the harness's: [(kind, message)]."""
    out = []
    seen = {}
    for s, k, _, _ in kept:
        if s in seen:
            out.append(("step_twice", f"step {s} kept from two attempts: {seen[s]} and {k}"))
        seen[s] = k
    if seen:
        missing = sorted(set(range(1, max(seen) + 1)) - set(seen))
        if missing:
            out.append(("step_missing", f"{len(missing)} step(s) never kept, first {missing[:5]}"))
    keys = list(atts)
    for i, old in enumerate(keys):  # one attempt trains at a time
        for new in keys[i + 1:]:
            a, b = atts[old], atts[new]
            if a["steps"] and b["steps"] and max(a["steps"].values()) > min(b["steps"].values()):
                out.append(("overlap", f"attempt {old} stepped "
                                       f"{max(a['steps'].values()) - min(b['steps'].values()):.2f}s"
                                       f" after attempt {new} had begun"))
    commits = {}
    for e in events:  # no step committed twice by one rank of one attempt
        if e.get("event") == "ckpt_saved":
            c = (attempt_key(e), e.get("rank"), e.get("step"))
            if c in commits:
                out.append(("commit_twice", f"rank {e.get('rank')} committed step "
                                            f"{e.get('step')} twice in one attempt"))
            commits[c] = True
    return out


def incident_figures(atts, fault, t_next, events):
    """One incident's phases, in seconds from the fault (None where a phase did not happen):
    detect   the first worker of the affected attempt told to stop or failing (a SIGTERM'd
             exit, an error), or the first event of a newer attempt where none was
    stop     the affected attempt's last event (its workers are gone)
    reform   the next attempt's group formed (its first `start`)
    restore  the next attempt's ranks resumed (source: memory, peer, disk; step)
    recompute  the affected attempt's highest step minus the step the next resumed from
    back     a step past the highest done before the fault (the job is where it was)
    stall    the longest time without a step from the fault to `back`.
    A fault the job did not stop for (a straggler, an etcd leader killed while its clients moved
    on to another member) has no detect, stop, re-form or restore: it is back once the group
    it hit steps past where it was, with 0 steps recomputed."""
    t = fault["t"]
    f = {"kind": fault["kind"], "t": round(t, 2), "victim": fault.get("victim"),
         "detect_s": None, "stop_s": None, "reform_s": None, "restore_s": None,
         "restore_source": None, "restore_step": None, "recompute_steps": None,
         "back_s": None, "stall_s": None, "attempts_after": 0, "recovered": False,
         "rollback_steps": None}
    keys = list(atts)
    aff = None
    for k in keys:
        st = atts[k]["steps"]
        if st and min(st.values()) <= t:
            aff = k
    before = [s for a in atts.values() for s, ts in a["steps"].items() if ts <= t]
    pre_max = max(before) if before else 0
    newer = [k for k in keys if atts[k]["first_event"] > t and atts[k]["first_event"] < t_next]
    f["attempts_after"] = sum(1 for k in newer if atts[k]["start"] is not None)
    if aff is not None and newer:
        a = atts[aff]
        stops = [e["t"] for e in events if attempt_key(e) == aff and e["t"] >= t and (
            e.get("event") == "error" or (e.get("event") == "exit" and
                                          "signal" in (e.get("msg") or "")))]
        first_new = min(atts[k]["first_event"] for k in newer)
        if a["last_event"] >= t:  # else it had ended already (a node re-joining, say)
            f["detect_s"] = round((min(stops) if stops else first_new) - t, 2)
            f["stop_s"] = round(a["last_event"] - t, 2)
        formed = [k for k in newer if atts[k]["start"] is not None]
        nxt = atts[formed[0] if formed else newer[0]]
        if nxt["start"] is not None:
            f["reform_s"] = round(nxt["start"] - t, 2)
        if nxt["resumed_t"] is not None:
            f["restore_s"] = round(nxt["resumed_t"] - t, 2)
            f["restore_source"] = ",".join(sorted(nxt["sources"]))
            f["restore_step"] = nxt["resumed"]
            f["recompute_steps"] = max(max(a["steps"] or {0: 0}), pre_max) - nxt["resumed"]
    # Every group formed in the window may go back: the most any went back from the highest
    # step done before it formed (a node re-joining after a cut, say).
    rollbacks = []
    for k in newer:
        n = atts[k]
        if n["start"] is None or n["resumed"] is None:
            continue
        done = [s for j, o in atts.items() for s, ts in o["steps"].items() if ts < n["start"]]
        rollbacks.append(max(done or [0]) - n["resumed"])
    f["rollback_steps"] = max(rollbacks) if rollbacks else None
    # Back where it was: a step past the highest any rank had done when the fault came, or
    # (when the affected attempt went on stepping while it failed) past the attempt's highest,
    # in a newer attempt.
    later = sorted((ts, s, k) for k, a in atts.items() for s, ts in a["steps"].items() if ts > t)
    if aff is not None and newer:
        top = max(pre_max, max(atts[aff]["steps"] or {0: 0}))
        back = next((ts for ts, s, k in later if s > top and k in newer), None)
    else:
        # Past the step in flight too: a stopped rank's peers may still finish the step whose
        # collective it had joined.
        back = next((ts for ts, s, _ in later if s > pre_max + 1), None)
    if back is not None:
        if aff is not None and not newer:  # the same group went on: nothing was recomputed
            f["recompute_steps"] = 0
        f["back_s"] = round(back - t, 2)
        f["recovered"] = back < t_next
        times = [t] + [ts for ts, _, _ in later if ts <= back]
        f["stall_s"] = round(max(b - a for a, b in zip(times, times[1:])), 2)
    return f


def cut_node_figures(events, fault, t_next):
    """A node cut from every other host must stop its workers on its own (the fence, 2W/3 after
    its last answered heartbeat) before the others can re-form without it (W): when its agent
    fenced (its log's first `fencing:` line after the cut) and its workers' last event."""
    t, node = fault["t"], fault.get("victim")
    out = {"fence_s": None, "cut_workers_last_s": None, "cut_workers_gone_s": None}
    try:
        with open(fault.get("agent_log") or "", errors="replace") as fh:
            text = fh.read()
    except OSError:
        text = ""

    def first_after_cut(pattern):  # seconds from the cut to the log's first such line, or None
        times = [lt for lt, _ in inv.log_lines(text, pattern) if lt is not None and lt >= t - 1]
        return round(min(times) - t, 2) if times else None

    out["fence_s"] = first_after_cut(FENCE_LINE)
    # The workers gone (the agent's line once the last one exited), whichever path stopped them:
    # the fence's, or a hang found first.
    out["cut_workers_gone_s"] = first_after_cut(r"every worker of attempt \d+ has exited")
    heal = t + NODE_DOWN_S
    mine = [e["t"] for e in events if e.get("node") == node and t <= e["t"] <= min(heal, t_next)]
    if mine:
        out["cut_workers_last_s"] = round(max(mine) - t, 2)
    return out


def etcd_leader_figures(fault, t_next):
    """etcd_leader_kill: when etcd named a new leader and was whole again (the soak's own
    watch of the members), and the agents' first etcd line after the kill (None: none noticed
    before the next fault)."""
    out = {k: fault.get(k) for k in ("new_leader", "new_leader_after_s", "new_leader_s",
                                     "etcd_whole_s")}
    t = fault["t"]
    seen = []
    for path in fault.get("agent_logs") or []:
        try:
            with open(path, errors="replace") as fh:
                text = fh.read()
        except OSError:
            continue
        # Log times have milliseconds: a line of the kill's own millisecond counts.
        seen += [lt for lt, _ in inv.log_lines(text, ETCD_LINE)
                 if lt is not None and t - 0.001 <= lt < t_next]
    out["etcd_noticed_s"] = round(min(seen) - t, 2) if seen else None
    return out


def analyze(events, faults, t_end):
    """Everything the report says, from the workers' events and the faults' times."""
    atts = attempts(events)
    kept = kept_steps(atts)
    all_steps = sum(len(a["steps"]) for a in atts.values())
    durations = [end - begin for _, _, begin, end in kept if begin is not None]
    firsts = [a["resumed_t"] for a in atts.values() if a["resumed_t"] is not None]
    t_begin = min(firsts) if firsts else None
    last_step = max((end for _, _, _, end in kept), default=None)
    # To the soak's end at least: a job that stops recovering loses the time it stood still.
    t_stop = max(last_step or 0, t_end or 0)
    wall = (t_stop - t_begin) if (t_begin is not None and last_step is not None) else 0
    r = {"attempts": len(atts), "steps_done": all_steps, "steps_kept": len(kept),
         "steps_recomputed": all_steps - len(kept), "wall_s": round(wall, 1),
         "kept_s": round(sum(durations), 1),
         "ettr": round(sum(durations) / wall, 4) if wall > 0 else 0.0,
         "median_step_s": round(statistics.median(durations), 3) if durations else None}
    r["violations"] = [list(v) for v in inv.violations(events)] + \
        [list(v) for v in soak_violations(events, atts, kept)]
    incidents = []
    for i, f in enumerate(faults):
        t_next = faults[i + 1]["t"] if i + 1 < len(faults) else (t_end or float("inf"))
        fig = incident_figures(atts, f, t_next, events)
        # Seconds lost in the incident's window: its length minus the kept steps' time in it.
        in_win = sum(min(end, t_next) - max(begin, f["t"]) for _, _, begin, end in kept
                     if begin is not None and end > f["t"] and begin < t_next)
        fig["window_s"] = round(min(t_next, t_stop) - f["t"], 1)
        fig["lost_s"] = round(max(0.0, fig["window_s"] - in_win), 1)
        fig["waited_s"] = f.get("waited_s", 0)
        if f["kind"] == "node_cut":
            fig.update(cut_node_figures(events, f, t_next))
        elif f["kind"] == "etcd_leader_kill":
            fig.update(etcd_leader_figures(f, t_next))
        incidents.append(fig)
    r["incidents"] = incidents
    return r


def table(result):
    cols = [("kind", "kind"), ("victim", "victim"), ("detect_s", "detect"), ("stop_s", "stop"),
            ("reform_s", "re-form"), ("restore_s", "restore"), ("restore_source", "from"),
            ("recompute_steps", "recomputed"), ("rollback_steps", "max rollback"),
            ("back_s", "back"), ("stall_s", "stall"),
            ("fence_s", "fence"), ("cut_workers_gone_s", "gone"), ("lost_s", "lost"),
            ("recovered", "ok")]
    # etcd's own figures, where a run killed its leader
    if any(f["kind"] == "etcd_leader_kill" for f in result["incidents"]):
        cols[-2:-2] = [("new_leader_s", "new leader"), ("etcd_whole_s", "etcd whole"),
                       ("etcd_noticed_s", "noticed")]
    lines = ["| t (s) | " + " | ".join(c[1] for c in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    t0 = result.get("t0", 0)
    for f in result["incidents"]:
        cells = [f"{f['t'] - t0:.0f}"] + ["-" if f.get(k) is None else str(f.get(k))
                                          for k, _ in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
