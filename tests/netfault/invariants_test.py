"""invariants.py on synthetic events: each violation is found, a clean run has none, and the
figures come out as defined. Standard library only: python3 invariants_test.py."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import invariants as inv  # noqa: E402


def ev(t, node, rank, world, rnd, event, step=None, restart=0, **kw):
    e = {"t": float(t), "node": node, "rank": rank, "world": world, "round": rnd, "epoch": 7,
         "restart": restart, "master": f"10.0.0.1:{1000 + max(rnd, 0)}", "event": event,
         "step": step}
    e.update(kw)
    return e


def round_of(t0, rnd, nodes, first_step, last_step, dt=1.0, resumed=0, restart=0, world=None,
             saves=()):
    """Events of one round: start, resumed, steps first_step..last_step every dt seconds from
    t0 on each node (node i is rank i), a ckpt_saved by rank 0 at the steps in `saves`."""
    world = world or len(nodes)
    out = []
    for rank, node in enumerate(nodes):
        out.append(ev(t0, node, rank, world, rnd, "start", restart=restart))
        out.append(ev(t0 + 0.1, node, rank, world, rnd, "resumed", resumed, restart=restart))
        for i, s in enumerate(range(first_step, last_step + 1)):
            t = t0 + 1 + i * dt
            out.append(ev(t, node, rank, world, rnd, "step", s, restart=restart))
            if rank == 0 and s in saves:
                out.append(ev(t + 0.01, node, rank, world, rnd, "ckpt_saved", s,
                              restart=restart))
    return out


def clean_run():
    """Round 0 on n1..n3 steps 1..10 (t 1..10); fault at t=10.5; round 1 on n1,n2 resumes from
    step 10 at t=20 and finishes at step 20."""
    return sorted(round_of(0, 0, ["n1", "n2", "n3"], 1, 10, saves=(5, 10))
                  + round_of(20, 1, ["n1", "n2"], 11, 20, resumed=10, restart=1, saves=(15, 20)),
                  key=lambda e: e["t"])


class Violations(unittest.TestCase):
    def test_clean_run_has_none(self):
        self.assertEqual(inv.violations(clean_run()), [])

    def test_overlap_found(self):
        events = clean_run()
        # n3, partitioned, kept stepping in round 0 until t=23, after round 1's first step (21)
        events += [ev(10 + i, "n3", 2, 3, 0, "step", 10 + i) for i in range(1, 14)]
        v = inv.violations(events)
        self.assertIn("overlap", [k for k, _ in v], v)
        msg = dict(v)["overlap"]
        self.assertIn("round 0", msg)
        self.assertIn("n3", msg)

    def test_alive_after_new_round_found(self):
        events = clean_run()
        # n3's round-0 worker, stuck, is SIGTERMed only after round 1's group formed (t=20)
        events.append(ev(20.5, "n3", 2, 3, 0, "exit", 10, msg="signal SIGTERM"))
        v = inv.violations(events)
        self.assertEqual([k for k, _ in v], ["alive"], v)
        self.assertIn("n3", v[0][1])

    def test_stale_writer_outside_launch_is_not_alive(self):
        events = clean_run()
        events.append(ev(25, "n3", 0, 1, 0, "ckpt_refused", 99, outside_launch=True))
        self.assertEqual(inv.violations(events), [])

    def test_touching_rounds_do_not_overlap(self):
        events = clean_run()
        first_new = min(e["t"] for e in events if e["round"] == 1 and e["event"] == "step")
        events.append(ev(first_new, "n3", 2, 3, 0, "step", 11))  # the same instant: no overlap
        self.assertNotIn("overlap", [k for k, _ in inv.violations(events)])

    def test_world_mismatch_found(self):
        events = clean_run()
        events.append(ev(12, "n3", 2, 2, 1, "step", 12))  # a rank of round 1 in a world of 2...
        events.append(ev(12.5, "n3", 3, 3, 1, "step", 12))  # ...and one in a world of 3
        kinds = [k for k, _ in inv.violations(events)]
        self.assertIn("world", kinds)

    def test_rank_on_two_nodes_found(self):
        events = clean_run()
        events.append(ev(22, "n3", 0, 2, 1, "step", 12))  # rank 0 of round 1 is n1's
        v = inv.violations(events)
        self.assertIn(("world", "round 1: rank 0 ran on n1, n3"), v)

    def test_stale_checkpoint_found(self):
        events = clean_run()
        events.append(ev(25, "n3", 0, 1, 0, "ckpt_saved", 99, outside_launch=True))  # round 0

        v = inv.violations(events)
        self.assertIn("stale_ckpt", [k for k, _ in v], v)

    def test_stale_refused_is_not_a_violation(self):
        events = clean_run()
        events.append(ev(25, "n3", 0, 1, 0, "ckpt_refused", 99, msg="StaleRoundError",
                         outside_launch=True))
        self.assertEqual(inv.violations(events), [])

    def test_mixed_world_found(self):
        events = clean_run()
        events.append(ev(22, "n2", 1, 2, 1, "error", 12, msg="all_reduce gave 3.0 in a world of 2"))
        self.assertIn("mixed", [k for k, _ in inv.violations(events)])

    def test_fallback_rounds_by_master(self):
        """Without DDPL_ROUND the groups are told apart by MASTER_ADDR:PORT."""
        events = clean_run()
        for e in events:
            e["round"] = -1
        self.assertEqual(inv.violations(events), [])
        events += [ev(10 + i, "n3", 2, 3, -1, "step", 10 + i, master="10.0.0.1:1000")
                   for i in range(1, 14)]
        self.assertIn("overlap", [k for k, _ in inv.violations(events)])


class Figures(unittest.TestCase):
    def test_figures_of_a_clean_reformation(self):
        events = clean_run()
        f = inv.figures(events, t_fault=10.5, total_steps=20, affected_nodes=["n3"])
        self.assertEqual(f["affected_round"], "round 0")
        self.assertAlmostEqual(f["detection_s"], -0.5)  # n3's last step came before the fault
        self.assertAlmostEqual(f["reformation_s"], 10.5)  # round 1's first step at t=21
        self.assertEqual(f["steps_lost"], 0)  # highest step 10, resumed from 10
        self.assertEqual(f["restarts"], 1)
        self.assertEqual(f["rounds"], 2)
        self.assertTrue(f["finished"], f["finished_why"])

    def test_steps_lost(self):
        events = [e for e in clean_run() if not (e["round"] == 1 and e["event"] == "resumed")]
        events += [ev(20.1, n, r, 2, 1, "resumed", 7, restart=1) for r, n in enumerate(["n1", "n2"])]
        f = inv.figures(events, t_fault=10.5)
        self.assertEqual(f["steps_lost"], 3)

    def test_unfinished(self):
        events = [e for e in clean_run() if not (e["node"] == "n2" and e.get("step") == 20)]
        ok, why = inv.finished(events, 20)
        self.assertFalse(ok)
        self.assertIn("rank(s) [1]", why)

    def test_steps_between(self):
        self.assertEqual(inv.steps_between(clean_run(), 3.5, 6.5), 3)  # steps 3, 4, 5 of round 0
        self.assertEqual(inv.steps_between(clean_run(), 11, 19.9), 0)

    def test_load_events_skips_torn_lines(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "events-n1-1.jsonl"), "w") as f:
                f.write(json.dumps(ev(1, "n1", 0, 1, 0, "start")) + "\n")
                f.write('{"t": 2, "event": "st')  # SIGKILLed mid-write
            self.assertEqual(len(inv.load_events(d)), 1)

    def test_log_lines(self):
        text = ("[2026-12-04 21:16:12.950] [vm launch] [warn] fencing: no heartbeat answered\n"
                "[default0]:step 3\n")
        lines = inv.log_lines(text, "fencing")
        self.assertEqual(len(lines), 1)
        self.assertIsNotNone(lines[0][0])


if __name__ == "__main__":
    # Exit 77 when a test was skipped (SKIP_RETURN_CODE): never counted as passed.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
    import python_test_main  # noqa: E402
    python_test_main.main()
