"""ddplaunch.checkpoint (python/ddplaunch/checkpoint/) against the contract in
docs/checkpoints.md: the commit protocol in a memory root made as launch makes it (a private
directory on /dev/shm with rank-<R>/ directories), keep, the budget and its fallback to disk,
the durable layout without launch, replicated states, the resume agreement across processes
through a real TCPStore, and DCP with two gloo processes.

Usage: python_checkpoint_test.py (the checkout's python/ is put on the path)"""
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import unittest
from datetime import timedelta

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_DIR = os.path.join(ROOT, "python")
sys.path.insert(0, PYTHON_DIR)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ddplaunch import checkpoint as ckpt  # noqa: E402

ENV_KEYS = ("DDPL_CHECKPOINT_MEMORY", "DDPL_CHECKPOINT_MEMORY_BUDGET",
            "DDPL_CHECKPOINT_MEMORY_KEEP", "DDPL_CHECKPOINT_DIR", "RANK", "WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT", "DDPL_ROUND", "DDPL_ROUND_EPOCH", "TORCHELASTIC_RUN_ID")


def memory_root(ranks):
    """A memory root as the workers' first writes leave it: 0700 on /dev/shm, rank-<R>/ for
    each rank."""
    root = tempfile.mkdtemp(prefix="ddpl-ckpt-test-", dir="/dev/shm")
    os.chmod(root, 0o700)
    for r in ranks:
        os.mkdir(os.path.join(root, f"rank-{r}"), 0o700)
    return root


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def run_children(code, envs, timeout=120):
    """Runs `code` in one child per env (ddplaunch importable); returns their stdouts, failing
    on a non-zero exit."""
    procs = []
    for env in envs:
        full = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
        full.update(env, PYTHONPATH=PYTHON_DIR)
        procs.append(subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=full,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=timeout) for p in procs]
    for p, (out, err) in zip(procs, results):
        if p.returncode != 0:
            raise AssertionError(f"child exited {p.returncode}:\n{out}\n{err}")
    return [out for out, _ in results]


class Base(unittest.TestCase):
    def setUp(self):
        self.saved_env = {k: os.environ.pop(k) for k in ENV_KEYS if k in os.environ}
        self.addCleanup(self.restore_env)
        self.durable = tempfile.mkdtemp(prefix="ddpl-ckpt-durable-")
        self.addCleanup(shutil.rmtree, self.durable, True)

    def restore_env(self):
        for k in ENV_KEYS:
            os.environ.pop(k, None)
        os.environ.update(self.saved_env)

    def use_memory(self, ranks=(0,), budget=None, keep=None):
        self.root = memory_root(ranks)
        self.addCleanup(shutil.rmtree, self.root, True)
        os.environ["DDPL_CHECKPOINT_MEMORY"] = self.root
        if budget is not None:
            os.environ["DDPL_CHECKPOINT_MEMORY_BUDGET"] = str(budget)
        if keep is not None:
            os.environ["DDPL_CHECKPOINT_MEMORY_KEEP"] = str(keep)
        return self.root

    def commit_bytes(self, step, data=b"x" * 100, rank=0, **kw):
        os.environ["RANK"] = str(rank)
        path = ckpt.begin(step, dir=kw.get("dir", self.durable))
        write(os.path.join(path, "data.bin"), data)
        kw.setdefault("dir", self.durable)
        return ckpt.commit(step, **kw)

    def steps_in(self, path):
        return sorted(int(n[5:]) for n in os.listdir(path) if n.startswith("step-"))


class Fence(Base):
    """docs/network-faults.md: a write from a round older than the newest that committed to a
    directory is refused; the same file and rules as launch's (common/checkpoint_files.h)."""

    def as_round(self, rnd, epoch=1000, run="job"):
        os.environ.update(DDPL_ROUND=str(rnd), DDPL_ROUND_EPOCH=str(epoch),
                          TORCHELASTIC_RUN_ID=run)

    def test_stale_round_is_refused_on_disk_and_nothing_of_it_lands(self):
        self.as_round(5)
        self.commit_bytes(6, b"new")
        self.as_round(4)
        with self.assertRaises(ckpt.StaleRoundError) as cm:
            self.commit_bytes(7, b"old")
        self.assertIn("round 4 (epoch 1000) of run 'job'", str(cm.exception))
        self.assertIn("round 5 (epoch 1000) of run 'job' has committed to", str(cm.exception))
        self.assertEqual(self.steps_in(self.durable), [6])
        self.assertFalse([n for n in os.listdir(self.durable) if n.startswith(".partial")])
        with open(os.path.join(self.durable, ".ddpl-fence")) as f:
            self.assertEqual(json.load(f), {"run_id": "job", "epoch": 1000, "round": 5})
        # A restarted rendezvous numbers from 0 under a newer epoch; an older epoch is refused.
        self.as_round(0, epoch=2000)
        self.commit_bytes(8, b"after a server restart")
        self.as_round(9, epoch=1000)
        self.assertRaises(ckpt.StaleRoundError, self.commit_bytes, 9, b"old epoch")
        # Another job into the same directory, and a process without launch, write on.
        self.as_round(0, epoch=500, run="job2")
        self.commit_bytes(10, b"job2")
        for k in ("DDPL_ROUND", "DDPL_ROUND_EPOCH"):
            del os.environ[k]
        self.commit_bytes(11, b"plain python")
        self.assertEqual(self.steps_in(self.durable), [10, 11])  # keep=2

    def test_stale_round_is_refused_in_memory_and_the_record_names_its_writer(self):
        root = self.use_memory()
        self.as_round(3)
        cp = self.commit_bytes(6, b"new")
        with open(os.path.join(cp.path, ".ddpl-commit.json")) as f:
            rec = json.load(f)
        self.assertEqual((rec["run_id"], rec["epoch"], rec["round"]), ("job", 1000, 3))
        self.as_round(2)
        self.assertRaises(ckpt.StaleRoundError, self.commit_bytes, 7, b"old")
        mem = os.path.join(root, "rank-0")
        self.assertEqual(self.steps_in(mem), [6])
        self.assertFalse([n for n in os.listdir(mem) if n.startswith("partial-")])

    def test_fence_file_through_a_symlink_is_refused(self):
        os.symlink(os.path.join(self.durable, "elsewhere"), os.path.join(self.durable, ".ddpl-fence"))
        self.as_round(1)
        self.assertRaises(OSError, self.commit_bytes, 1, b"x")
        self.assertFalse(os.path.exists(os.path.join(self.durable, "elsewhere")))


class CommitProtocol(Base):
    def test_commit_writes_the_record_and_renames(self):
        root = self.use_memory(keep=5)
        path = ckpt.begin(3, dir=self.durable)
        self.assertEqual(path, os.path.join(root, "rank-0", f"partial-3-{os.getpid()}"))
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o700)
        os.mkdir(os.path.join(path, "sub"))
        write(os.path.join(path, "sub", "a.bin"), b"abc")
        write(os.path.join(path, "b.bin"), b"")
        found = ckpt.commit(3, dir=self.durable)
        step_dir = os.path.join(root, "rank-0", "step-3")
        self.assertEqual(found, ckpt.Checkpoint(3, step_dir, "memory", 0))
        self.assertFalse(os.path.exists(path))
        with open(os.path.join(step_dir, ".ddpl-commit.json")) as f:
            record = json.load(f)
        self.assertEqual(os.stat(os.path.join(step_dir, ".ddpl-commit.json")).st_mode & 0o777,
                         0o600)
        self.assertEqual(set(record), {"version", "step", "rank", "world_size", "files", "bytes",
                                       "durable_path", "persist", "replicated", "keep", "time"})
        self.assertEqual(record["version"], 1)
        self.assertEqual((record["step"], record["rank"], record["world_size"]), (3, 0, 1))
        self.assertEqual(record["files"], [{"path": "b.bin", "size": 0},
                                           {"path": "sub/a.bin", "size": 3}])
        self.assertEqual(record["bytes"], 3)
        self.assertEqual(record["durable_path"], os.path.join(self.durable, "step-3"))
        self.assertEqual((record["persist"], record["replicated"], record["keep"]),
                         (True, False, 2))
        self.assertEqual(ckpt.latest(dir=self.durable), found)
        # No disk write happened: persisting is launch's job.
        self.assertEqual(os.listdir(self.durable), [])

    def test_symlink_is_refused(self):
        self.use_memory()
        path = ckpt.begin(1)
        os.symlink("/etc/passwd", os.path.join(path, "link"))
        with self.assertRaisesRegex(ValueError, "link.*not a regular file"):
            ckpt.commit(1)

    def test_commit_without_begin_says_so(self):
        self.use_memory()
        with self.assertRaisesRegex(ValueError, r"call begin\(4\) first"):
            ckpt.commit(4)

    def test_killed_before_commit_is_never_offered(self):
        for memory in (True, False):
            with self.subTest(memory=memory):
                if memory:
                    self.use_memory(keep=5)
                else:
                    os.environ.pop("DDPL_CHECKPOINT_MEMORY", None)
                self.commit_bytes(2)
                env = {"RANK": "0", "WORLD_SIZE": "1"}
                if memory:
                    env["DDPL_CHECKPOINT_MEMORY"] = self.root
                code = f"""
                    import os, signal
                    from ddplaunch import checkpoint as ckpt
                    path = ckpt.begin(5, dir={self.durable!r})
                    with open(os.path.join(path, "data.bin"), "wb") as f:
                        f.write(b"y" * 100)
                    print(path, flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                """
                full = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
                full.update(env, PYTHONPATH=PYTHON_DIR)
                p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full,
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(p.returncode, -signal.SIGKILL, p.stderr)
                partial = p.stdout.strip()
                self.assertTrue(os.path.isfile(os.path.join(partial, "data.bin")), partial)
                found = ckpt.latest(dir=self.durable)
                self.assertEqual(found.step, 2)
                self.assertNotIn("partial", found.path)

    def test_torn_and_mismatched_steps_are_not_offered(self):
        root = self.use_memory(keep=10)
        for step in (1, 2, 3, 4):
            self.commit_bytes(step)
        mem = os.path.join(root, "rank-0")
        self.assertEqual(ckpt.latest().step, 4)
        with open(os.path.join(mem, "step-4", "data.bin"), "r+b") as f:
            f.truncate(50)  # torn: the size no longer matches the record
        self.assertEqual(ckpt.latest().step, 3)
        os.unlink(os.path.join(mem, "step-3", "data.bin"))  # a listed file is gone
        self.assertEqual(ckpt.latest().step, 2)
        # A record whose step or rank does not match the directory names is ignored.
        shutil.copytree(os.path.join(mem, "step-2"), os.path.join(mem, "step-9"))
        self.assertEqual(ckpt.latest().step, 2)
        record_path = os.path.join(mem, "step-9", ".ddpl-commit.json")
        with open(record_path) as f:
            record = json.load(f)
        for bad in ({"step": 9, "rank": 1}, {"step": 9, "world_size": 2}, {"step": 9, "version": 2}):
            with self.subTest(bad=bad):
                with open(record_path, "w") as f:
                    json.dump(dict(record, **bad), f)
                self.assertEqual(ckpt.latest().step, 2)
        with open(record_path, "w") as f:
            json.dump(dict(record, step=9), f)
        self.assertEqual(ckpt.latest().step, 9)  # the same record, matching: offered
        with open(record_path, "w") as f:
            f.write("{not json")
        self.assertEqual(ckpt.latest().step, 2)

    def test_keep_trims_committed_steps_of_the_rank(self):
        root = self.use_memory(ranks=(0, 1), keep=2)
        for step in range(1, 6):
            self.commit_bytes(step)
        self.commit_bytes(1, rank=1)
        self.assertEqual(self.steps_in(os.path.join(root, "rank-0")), [4, 5])
        self.assertEqual(self.steps_in(os.path.join(root, "rank-1")), [1])
        # Committing a step again (a resumed run) replaces the earlier attempt's.
        self.commit_bytes(5, data=b"z" * 7)
        self.assertEqual(os.path.getsize(os.path.join(root, "rank-0", "step-5", "data.bin")), 7)
        self.assertEqual(sorted(os.listdir(os.path.join(root, "rank-0"))), ["step-4", "step-5"])
        # A run resumed from an earlier step never loses the step it just committed.
        os.environ["DDPL_CHECKPOINT_MEMORY_KEEP"] = "1"
        self.commit_bytes(3)
        self.assertIn(3, self.steps_in(os.path.join(root, "rank-0")))


class LazyRoot(Base):
    """Issue 44: launch names the root but makes nothing (a job that never checkpoints costs it
    nothing); the first write makes the root and the rank's directory, 0700, and a reader
    makes neither."""

    def fresh_root(self):
        root = os.path.join("/dev/shm", f"ddpl-ckpt-test-lazy-{os.getpid()}-{id(self)}")
        self.addCleanup(shutil.rmtree, root, True)
        os.environ.update(DDPL_CHECKPOINT_MEMORY=root, RANK="0", WORLD_SIZE="1")
        return root

    def test_readers_make_nothing_and_the_first_write_makes_the_root(self):
        root = self.fresh_root()
        self.assertIsNone(ckpt.latest(dir=self.durable))
        self.assertFalse(os.path.lexists(root))
        cp = self.commit_bytes(1)
        self.assertEqual(cp.source, "memory")
        self.assertEqual(cp.path, os.path.join(root, "rank-0", "step-1"))
        for d in (root, os.path.join(root, "rank-0")):
            self.assertEqual(os.stat(d).st_mode & 0o777, 0o700, d)
        self.assertEqual(ckpt.latest(dir=self.durable).source, "memory")

    def test_a_replicated_save_of_another_rank_is_in_memory_from_the_first(self):
        root = self.fresh_root()
        os.environ.update(RANK="1", WORLD_SIZE="2")
        cp = ckpt.save({"w": torch.ones(2)}, 2, dir=self.durable, replicated=True)
        self.assertEqual(cp.source, "memory")
        self.assertTrue(os.path.isdir(os.path.join(root, "rank-1", "step-2")))

    def test_a_root_others_can_enter_is_refused_not_written_into(self):
        root = self.fresh_root()
        os.mkdir(root, 0o700)
        os.chmod(root, 0o755)
        with self.assertRaises(PermissionError) as cm:
            ckpt.begin(1, dir=self.durable)
        self.assertIn(f"refusing to keep checkpoints in {root}", str(cm.exception))
        self.assertIn("mode 0755", str(cm.exception))
        self.assertEqual(os.listdir(root), [])


class SaveAsync(Base):
    def test_blocks_only_for_the_copy_and_commits_what_was_passed(self):
        import torch

        self.use_memory()
        os.environ.update(RANK="0", WORLD_SIZE="1")
        state = {"w": torch.zeros(1000), "meta": {"epoch": 3}}
        pending = ckpt.save_async(state, 4, dir=self.durable, replicated=True)
        state["w"].add_(1)  # the next training step changes the tensors in place
        state["meta"]["epoch"] = 4
        found = pending.result(timeout=60)
        self.assertEqual((found.step, found.source), (4, "memory"))
        loaded = ckpt.load(found)
        self.assertTrue(torch.equal(loaded["w"], torch.zeros(1000)))
        self.assertEqual(loaded["meta"]["epoch"], 3)
        # latest() waits for a save in flight of its own process
        ckpt.save_async(state, 8, dir=self.durable, replicated=True)
        self.assertEqual(ckpt.latest(dir=self.durable).step, 8)
        self.assertIsNone(ckpt.wait())

    def test_a_process_killed_before_the_commit_leaves_the_step_before(self):
        self.use_memory(keep=5)
        self.commit_bytes(2)
        code = f"""
            import os, signal, torch
            from ddplaunch import checkpoint as ckpt
            def stop_before_commit(*a, **kw):  # the write is done, the rename not yet
                os.kill(os.getpid(), signal.SIGKILL)
            ckpt.commit = stop_before_commit
            ckpt.save_async({{"w": torch.ones(100000)}}, 6, dir={self.durable!r})
            ckpt.wait(timeout=60)
        """
        full = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
        full.update({"RANK": "0", "WORLD_SIZE": "1", "DDPL_CHECKPOINT_MEMORY": self.root},
                    PYTHONPATH=PYTHON_DIR)
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, -signal.SIGKILL, p.stderr)
        self.assertTrue(any(n.startswith("partial-6-") for n in os.listdir(self.root + "/rank-0")))
        os.environ.update(RANK="0", WORLD_SIZE="1")
        self.assertEqual(ckpt.latest(dir=self.durable).step, 2)


class Budget(Base):
    def test_commit_over_budget_goes_to_disk_with_a_warning(self):
        root = self.use_memory(budget=1000, keep=1)
        self.assertEqual(self.commit_bytes(1, data=b"a" * 600).source, "memory")
        stderr = io.StringIO()
        with self.assertWarns(RuntimeWarning) as caught, contextlib.redirect_stderr(stderr):
            found = self.commit_bytes(2, data=b"b" * 600)
        message = str(caught.warning)
        for part in ("step 2", "600 bytes", "budget is 1000 bytes", "already hold",
                     "--checkpoint-memory", "--checkpoint-memory-keep"):
            self.assertIn(part, message)
        self.assertIn("step 2", stderr.getvalue())
        durable = os.path.join(self.durable, "step-2")
        self.assertEqual(found, ckpt.Checkpoint(2, durable, "disk", 0))
        with open(os.path.join(durable, "data.bin"), "rb") as f:
            self.assertEqual(f.read(), b"b" * 600)
        self.assertTrue(os.path.isfile(os.path.join(durable, ".ddpl-step-2.rank-0.json")))
        self.assertEqual(os.listdir(os.path.join(root, "rank-0")), ["step-1"])
        self.assertEqual(ckpt.latest(dir=self.durable), found)

    def test_save_stops_writing_memory_at_the_budget(self):
        budget = 200_000
        root = self.use_memory(budget=budget, keep=1)
        state = {"w": torch.arange(1_000_000, dtype=torch.float32)}  # 4 MB
        peak = []
        original = ckpt._BudgetFile.write

        def spy(self_, data):
            try:
                return original(self_, data)
            finally:
                if self_.limit is not None:  # the memory write, not the disk one after it
                    peak.append(os.fstat(self_.fd).st_size)

        ckpt._BudgetFile.write = spy
        self.addCleanup(setattr, ckpt._BudgetFile, "write", original)
        with self.assertWarns(RuntimeWarning), contextlib.redirect_stderr(io.StringIO()):
            found = ckpt.save(state, 7, dir=self.durable)
        self.assertTrue(peak)
        self.assertLessEqual(max(peak), budget)  # the memory file never passed the budget
        self.assertEqual(found.source, "disk")
        self.assertEqual(os.listdir(os.path.join(root, "rank-0")), [])
        self.assertTrue(torch.equal(ckpt.load(found)["w"], state["w"]))
        # Under the budget it stays in memory.
        os.environ["DDPL_CHECKPOINT_MEMORY_BUDGET"] = str(10_000_000)
        found = ckpt.save(state, 8, dir=self.durable)
        self.assertEqual(found.source, "memory")
        self.assertTrue(torch.equal(ckpt.load(found)["w"], state["w"]))


class WithoutLaunch(Base):
    def test_durable_layout_and_retention(self):
        path = ckpt.begin(1, dir=self.durable)
        self.assertEqual(os.path.dirname(path), self.durable)
        self.assertTrue(os.path.basename(path).startswith(".partial-step-1-rank-0-"))
        for step in range(1, 5):
            found = ckpt.save({"step": step}, step, dir=self.durable, keep=2)
            self.assertEqual(found, ckpt.Checkpoint(step, os.path.join(self.durable, f"step-{step}"),
                                                    "disk", 0))
        self.assertEqual(sorted(os.listdir(self.durable)), ["step-3", "step-4"])
        self.assertEqual(sorted(os.listdir(os.path.join(self.durable, "step-4"))),
                         [".ddpl-step-4.rank-0.json", "state.pt"])
        self.assertEqual(os.stat(os.path.join(self.durable, "step-4", "state.pt")).st_mode & 0o777,
                         0o600)
        found = ckpt.latest(dir=self.durable)
        self.assertEqual((found.step, found.source), (4, "disk"))
        self.assertEqual(ckpt.load(found), {"step": 4})
        # A step without its marker (the crash before the marker) is not on disk.
        os.unlink(os.path.join(self.durable, "step-4", ".ddpl-step-4.rank-0.json"))
        self.assertEqual(ckpt.latest(dir=self.durable).step, 3)

    def test_flat_layout_and_the_directory_variable(self):
        os.environ["DDPL_CHECKPOINT_DIR"] = self.durable
        for step in range(1, 4):
            ckpt.save({"step": step}, step, keep=1, flat=True, filename=f"ckpt-step{step}.pt")
        self.assertEqual(sorted(os.listdir(self.durable)),
                         [".ddpl-step-3.rank-0.json", "ckpt-step3.pt"])
        found = ckpt.latest()
        self.assertEqual(found, ckpt.Checkpoint(3, self.durable, "disk", 0))
        self.assertEqual(ckpt.load(found, filename="ckpt-step3.pt"), {"step": 3})

    def test_no_directory_is_a_clear_error(self):
        with self.assertRaisesRegex(ValueError, "pass dir=.*--checkpoint-dir"):
            ckpt.begin(1)

    def test_replicated_only_rank_0_writes(self):
        os.environ["WORLD_SIZE"] = "2"
        os.environ["RANK"] = "1"
        found = ckpt.save({"w": 1}, 5, dir=self.durable, replicated=True)
        self.assertEqual(found.path, os.path.join(self.durable, "step-5"))
        self.assertEqual(os.listdir(self.durable), [])
        self.commit_bytes(5, rank=1, replicated=True)  # begin/commit: same rule
        self.assertEqual(os.listdir(self.durable), [])
        os.environ["RANK"] = "0"
        ckpt.save({"w": 1}, 5, dir=self.durable, replicated=True)
        self.assertEqual(sorted(os.listdir(os.path.join(self.durable, "step-5"))),
                         [".ddpl-step-5.rank-0.json", "state.pt"])
        # Rank 1 reads it through rank 0's marker (WORLD_SIZE 1: no agreement needed here).
        os.environ.update(RANK="1", WORLD_SIZE="1")
        self.assertEqual(ckpt.latest(dir=self.durable),
                         ckpt.Checkpoint(5, os.path.join(self.durable, "step-5"), "disk", 1))
        # A non-replicated step of rank 0 is not rank 1's.
        os.environ["RANK"] = "0"
        ckpt.save({"w": 2}, 6, dir=self.durable)
        os.environ["RANK"] = "1"
        self.assertEqual(ckpt.latest(dir=self.durable).step, 5)

    def test_replicated_in_memory_every_rank_keeps_a_copy(self):
        root = self.use_memory(ranks=(0, 1))
        os.environ["WORLD_SIZE"] = "2"
        for rank in (0, 1):
            os.environ["RANK"] = str(rank)
            found = ckpt.save({"w": 3}, 2, dir=self.durable, replicated=True)
            self.assertEqual(found.source, "memory")
            with open(os.path.join(root, f"rank-{rank}", "step-2", ".ddpl-commit.json")) as f:
                self.assertTrue(json.load(f)["replicated"])


class Agreement(Base):
    CODE = """
        import json, os
        from ddplaunch import checkpoint as ckpt
        answers = []
        for _ in range(2):  # a second call must not read the first call's offers
            found = ckpt.latest(dir=os.environ.get("TEST_DIR"), timeout=60)
            answers.append(None if found is None else [found.step, found.source])
        print(json.dumps(answers))
    """

    def agree(self, offers):
        """offers: one list of memory steps per rank; returns each rank's two answers."""
        root = self.use_memory(ranks=range(len(offers)), keep=100)
        os.environ["WORLD_SIZE"] = str(len(offers))
        for rank, steps in enumerate(offers):
            for step in steps:
                self.commit_bytes(step, rank=rank)
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60))
        envs = [{"RANK": str(r), "WORLD_SIZE": str(len(offers)), "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(store.port), "DDPL_CHECKPOINT_MEMORY": root}
                for r in range(len(offers))]
        return [json.loads(out) for out in run_children(self.CODE, envs)]

    def test_newest_common_step(self):
        answers = self.agree([[2, 4, 6], [2, 4], [4, 6, 8]])
        self.assertEqual(answers, [[[4, "memory"]] * 2] * 3)

    def test_no_common_step(self):
        self.assertEqual(self.agree([[1, 3], [2], [1, 2]]), [[None, None]] * 3)


class DCP(Base):
    CODE = """
        import json, os, sys
        from datetime import timedelta
        import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
        from ddplaunch import checkpoint as ckpt
        rank = int(os.environ["RANK"])
        store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(seconds=60))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
        d = os.environ["TEST_DIR"]
        def state(seed):
            g = torch.Generator().manual_seed(seed)
            return {"shared": torch.randn(64, generator=g),
                    f"own{rank}": torch.randn(32, generator=torch.Generator().manual_seed(seed + rank + 1))}
        dcp.save(state(1), storage_writer=ckpt.StorageWriter(3, dir=d))
        found = ckpt.latest(dir=d, timeout=60)
        target = {k: torch.zeros_like(v) for k, v in state(2).items()}
        dcp.load(target, storage_reader=ckpt.StorageReader(found))
        same = all(torch.equal(target[k], v) for k, v in state(1).items())
        print(json.dumps([found.step, found.source, found.path, same]))
        dist.destroy_process_group()
    """

    def run_dcp(self, memory):
        env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "TEST_DIR": self.durable}
        if memory:
            env["DDPL_CHECKPOINT_MEMORY"] = self.use_memory(ranks=(0, 1))
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60))
        env["MASTER_PORT"] = str(store.port)
        outs = run_children(self.CODE, [dict(env, RANK=str(r)) for r in (0, 1)], timeout=180)
        return [json.loads(o.strip().splitlines()[-1]) for o in outs]

    def test_memory(self):
        results = self.run_dcp(memory=True)
        for rank, (step, source, path, same) in enumerate(results):
            self.assertEqual((step, source, same), (3, "memory", True))
            self.assertEqual(path, os.path.join(self.root, f"rank-{rank}", "step-3"))
        self.assertIn(".metadata", os.listdir(os.path.join(self.root, "rank-0", "step-3")))
        self.assertNotIn(".metadata", os.listdir(os.path.join(self.root, "rank-1", "step-3")))
        self.assertEqual(os.listdir(self.durable), [])

    def test_disk(self):
        import torch.distributed.checkpoint as dcp

        results = self.run_dcp(memory=False)
        step_dir = os.path.join(self.durable, "step-3")
        self.assertEqual(results, [[3, "disk", step_dir, True]] * 2)
        names = set(os.listdir(step_dir))
        self.assertTrue({".metadata", ".ddpl-step-3.rank-0.json",
                         ".ddpl-step-3.rank-1.json"} <= names, names)
        self.assertEqual(sorted(os.listdir(self.durable)), ["step-3"])  # no partial left
        # A plain FileSystemReader reads the durable step (the shared tensor, no process group).
        target = {"shared": torch.zeros(64)}
        dcp.load(target, storage_reader=dcp.FileSystemReader(step_dir), no_dist=True)
        self.assertTrue(torch.equal(target["shared"],
                                    torch.randn(64, generator=torch.Generator().manual_seed(1))))


if __name__ == "__main__":
    # Exit 77 when a test was skipped (SKIP_RETURN_CODE): never counted as passed.
    sys.path.insert(0, os.path.join(ROOT, "tests", "common"))
    import python_test_main  # noqa: E402
    python_test_main.main(verbosity=1)
