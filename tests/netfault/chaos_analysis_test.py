"""The chaos soak's figures (bench/chaos_analysis.py, for bench/chaos_soak.py: ETTR, kept and
recomputed steps, an incident's phases, the soak's own invariants) on synthetic worker events.
Python standard library only."""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import chaos_analysis as cs  # noqa: E402


def ev(t, event, group, rank=0, step=None, node="n1", **kw):
    e = {"t": t, "event": event, "group": group, "rank": rank, "step": step, "node": node,
         "world": 2, "round": 1 if group == "a" else 2, "epoch": 1, "restart": 0, "pid": 1}
    e.update(kw)
    return e


def two_attempts():
    """Attempt a: steps 1..10 at t=1..10 on two ranks; a fault at 10.5; rank 1 fails at 11;
    attempt b forms at 12, resumes from step 8 at 13 and steps 9..15 at t=14..20."""
    out = []
    for r, node in ((0, "n1"), (1, "n2")):
        out += [ev(0.0, "start", "a", r, node=node), ev(0.0, "resumed", "a", r, 0, node,
                                                        source="none")]
        out += [ev(float(s), "step", "a", r, s, node) for s in range(1, 11)]
        out += [ev(12.0, "start", "b", r, node=node),
                ev(13.0, "resumed", "b", r, 8, node, source="memory")]
        out += [ev(float(s + 5), "step", "b", r, s, node) for s in range(9, 16)]
    out.append(ev(11.0, "error", "a", 1, 10, "n2", msg="RuntimeError: peer gone"))
    return sorted(out, key=lambda e: e["t"])


class ChaosAnalysisTest(unittest.TestCase):
    def test_steps_recomputed_after_a_restore_are_not_kept(self):
        atts = cs.attempts(two_attempts())
        kept = cs.kept_steps(atts)
        self.assertEqual([s for s, _, _, _ in kept], list(range(1, 16)))
        self.assertEqual([k for _, k, _, _ in kept], ["a"] * 8 + ["b"] * 7)

    def test_ettr_is_kept_step_time_over_wall_time(self):
        r = cs.analyze(two_attempts(), [{"kind": "worker_kill", "t": 10.5}], None)
        self.assertEqual((r["steps_kept"], r["steps_recomputed"]), (15, 2))
        self.assertEqual(r["wall_s"], 20.0)
        self.assertAlmostEqual(r["ettr"], 15 / 20)
        self.assertEqual(r["violations"], [])

    def test_a_job_that_stands_still_until_the_soak_ends_loses_that_time(self):
        r = cs.analyze(two_attempts(), [{"kind": "worker_kill", "t": 10.5}], 40.0)
        self.assertAlmostEqual(r["ettr"], 15 / 40)

    def test_incident_phases(self):
        r = cs.analyze(two_attempts(), [{"kind": "worker_kill", "t": 10.5, "victim": "n2"}], None)
        f = r["incidents"][0]
        self.assertEqual((f["detect_s"], f["stop_s"], f["reform_s"], f["restore_s"]),
                         (0.5, 0.5, 1.5, 2.5))
        self.assertEqual((f["restore_source"], f["restore_step"], f["recompute_steps"]),
                         ("memory", 8, 2))
        self.assertEqual(f["back_s"], 5.5)  # step 11, in attempt b, at t=16
        self.assertTrue(f["recovered"])

    def test_an_incident_never_recovered(self):
        events = [e for e in two_attempts() if e["group"] == "a" or e["event"] == "start"]
        f = cs.analyze(events, [{"kind": "worker_hang", "t": 10.5}], 30.0)["incidents"][0]
        self.assertFalse(f["recovered"])
        self.assertIsNone(f["back_s"])

    def test_a_step_in_flight_is_not_recovery(self):
        # A stopped rank's peer finishes the step whose collective it had joined: not back yet.
        events = [e for e in two_attempts() if e["group"] == "a"]
        events.append(ev(10.6, "step", "a", 0, 11))
        f = cs.analyze(events, [{"kind": "worker_hang", "t": 10.5}], 30.0)["incidents"][0]
        self.assertFalse(f["recovered"])

    def test_two_attempts_stepping_at_once_and_a_step_committed_twice_are_violations(self):
        events = two_attempts()
        events.append(ev(14.5, "step", "a", 0, 11))  # a stepped after b began
        events += [ev(3.1, "ckpt_saved", "a", 0, 3), ev(3.2, "ckpt_saved", "a", 0, 3)]
        kinds = {k for k, _ in cs.analyze(events, [], None)["violations"]}
        self.assertIn("overlap", kinds)
        self.assertIn("commit_twice", kinds)

    def test_a_resume_from_an_earlier_attempts_newer_state_keeps_that_attempts_steps(self):
        # a: 1..10; b resumes from 5 (a node re-joined with an old copy) and does 6, 7; c resumes
        # from 10, a's state: a's steps are the lineage, b's two were lost.
        events = [e for e in two_attempts() if e["group"] == "a"]
        events += [ev(12.0, "start", "b"), ev(12.5, "resumed", "b", 0, 5, source="memory"),
                   ev(13.0, "step", "b", 0, 6), ev(14.0, "step", "b", 0, 7),
                   ev(15.0, "start", "c"), ev(15.5, "resumed", "c", 0, 10, source="disk"),
                   ev(16.0, "step", "c", 0, 11), ev(17.0, "step", "c", 0, 12)]
        r = cs.analyze(events, [{"kind": "node_cut", "t": 10.5}], None)
        kept = cs.kept_steps(cs.attempts(events))
        self.assertEqual([(s, k) for s, k, _, _ in kept],
                         [(s, "a") for s in range(1, 11)] + [(11, "c"), (12, "c")])
        self.assertEqual(r["violations"], [])
        self.assertEqual(r["steps_recomputed"], 2)
        self.assertEqual(r["incidents"][0]["rollback_steps"], 5)

    def test_a_step_never_kept_is_a_violation(self):
        events = [e for e in two_attempts() if not (e["event"] == "step" and e["step"] == 5)]
        kinds = {k for k, _ in cs.analyze(events, [], None)["violations"]}
        self.assertIn("step_missing", kinds)

    @staticmethod
    def _cut_figures(lines):
        """cut_node_figures of a node cut now whose agent logged `lines` ((seconds after the
        cut, text) each)."""
        import tempfile
        import time
        t = time.time()
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            for dt, text in lines:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t + dt)) + ".000"
                f.write(f"[{stamp}] [vm launch] {text}\n")
        try:
            return cs.cut_node_figures([], {"t": float(int(t)), "victim": "n3",
                                            "agent_log": f.name}, t + 60)
        finally:
            os.unlink(f.name)

    def test_a_cut_node_fences_from_its_agents_log(self):
        got = self._cut_figures([
            (6, "[warning] round 2 ended: fencing: no heartbeat answered by 10.0.0.100:29400 "
                "for 6.0s"),
            (7, "[info] every worker of attempt 3 has exited")])
        self.assertAlmostEqual(got["fence_s"], 6.0, delta=1.0)
        self.assertAlmostEqual(got["cut_workers_gone_s"], 7.0, delta=1.0)

    def test_a_cut_node_fences_on_its_etcd_lease_too(self):
        # The etcd backend's fence is its lease's keep-alives going unanswered.
        got = self._cut_figures([
            (6, "[warning] round 2 ended: fencing: no etcd keep-alive answered for 6.0s (limit "
                "6.0s, 2/3 of the lease TTL of 9s): the workers of round 2 stop within 1.5s")])
        self.assertAlmostEqual(got["fence_s"], 6.0, delta=1.0)
        self.assertIsNone(got["cut_workers_gone_s"])  # no line: not known, not 0

    def test_an_etcd_leader_kill_the_job_steps_through_costs_no_step(self):
        # Attempt a steps on through the kill (its etcd client moved to another member): no
        # detect, stop or re-form; back two steps later, 0 steps recomputed, recovered; etcd's
        # own figures from the soak's watch and the agents' first etcd line after the kill.
        import tempfile
        import time
        base = float(int(time.time()))
        events = [dict(e, t=e["t"] + base) for e in two_attempts() if e["group"] == "a"]
        events += [ev(base + s, "step", "a", r, s, node) for s in range(11, 21)
                   for r, node in ((0, "n1"), (1, "n2"))]
        events = [e for e in events if e["event"] != "error"]

        def stamp(dt):
            return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(base + dt)) + ".000"
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            f.write(f"[{stamp(1)}] [vm launch] [info] rendezvous in etcd at 10.0.0.101:2379\n"
                    f"[{stamp(12)}] [vm launch] [info] etcd watch on '/ddplaunch/chaos/' broke "
                    f"(UNAVAILABLE): resuming from revision 40 on the next endpoint\n")
        fault = {"kind": "etcd_leader_kill", "t": base + 10.5, "victim": "e2",
                 "new_leader": "e3", "new_leader_s": 1.3, "etcd_whole_s": 3.4,
                 "agent_logs": [f.name, "/nonexistent/agent.log"]}
        try:
            r = cs.analyze(events, [fault], base + 30)
        finally:
            os.unlink(f.name)
        f = r["incidents"][0]
        self.assertEqual((f["detect_s"], f["stop_s"], f["reform_s"], f["restore_s"]),
                         (None, None, None, None))
        self.assertEqual((f["recompute_steps"], f["attempts_after"]), (0, 0))
        self.assertEqual(f["back_s"], 1.5)  # step 12, the first past the one in flight
        self.assertTrue(f["recovered"])
        self.assertEqual((f["new_leader"], f["new_leader_s"], f["etcd_whole_s"]), ("e3", 1.3, 3.4))
        self.assertAlmostEqual(f["etcd_noticed_s"], 1.5, delta=0.01)
        self.assertEqual(r["violations"], [])
        self.assertIn("new leader", cs.table(r))

    def test_an_etcd_leader_kill_that_ends_the_round_has_the_usual_phases(self):
        f = cs.analyze(two_attempts(), [{"kind": "etcd_leader_kill", "t": 10.5,
                                         "victim": "e1"}], None)["incidents"][0]
        self.assertEqual((f["detect_s"], f["reform_s"], f["recompute_steps"]), (0.5, 1.5, 2))
        self.assertIsNone(f["etcd_noticed_s"])  # no agent log given
        self.assertTrue(f["recovered"])

    def test_the_etcd_columns_only_where_a_run_killed_etcds_leader(self):
        r = cs.analyze(two_attempts(), [{"kind": "worker_kill", "t": 10.5}], None)
        self.assertNotIn("new leader", cs.table(r))


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(HERE, "..", "common"))
    import python_test_main  # noqa: E402
    python_test_main.main()
