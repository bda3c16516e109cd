"""Checkpoint format 1 byte for byte (docs/checkpoints.md): ddplaunch.checkpoint against the
golden vectors in tests/golden/checkpoint, which the C++ side (tests/unit/checkpoint_golden_test.cc)
is held to as well, and each side reading what the other wrote, fences included, through
checkpoint_tool (common/checkpoint_files.h as a command line).

Usage: python_checkpoint_golden_test.py CHECKPOINT_TOOL (the checkout's python/ is put on the
path; torch is not needed)"""
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_DIR = os.path.join(ROOT, "python")
GOLDEN = os.path.join(ROOT, "tests", "golden")
CASES = os.path.join(GOLDEN, "checkpoint")
sys.path.insert(0, PYTHON_DIR)
sys.path.insert(0, os.path.join(ROOT, "tests", "common"))

from ddplaunch import _env  # noqa: E402
from ddplaunch import checkpoint as ckpt  # noqa: E402
from ddplaunch.checkpoint import _disk, _files, _format, _memory  # noqa: E402

TOOL = None  # set from argv in __main__
ENV_KEYS = tuple(json.load(open(os.path.join(GOLDEN, "environment.json")))["variables"])


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


SPEC = load(os.path.join(CASES, "cases.json"))


def content(v):
    """A file's bytes from the spec: text, or {"hex": "..."}."""
    return v.encode() if isinstance(v, str) else bytes.fromhex(v["hex"])


def is_record_name(name):
    return name == _format.RECORD or _format.parse_marker_name(name) is not None


def pinned(data, run_root):
    """What varies between runs, pinned as cases.json says: the record's time, and the run's own
    directory in durable_path."""
    data = re.sub(rb'"time":[-+0-9.eE]+', b'"time":' + json.dumps(SPEC["time"]).encode(), data)
    return data.replace(b'"durable_path":"' + run_root.encode(),
                        b'"durable_path":"' + SPEC["root"].encode())


def tree(top, run_root):
    """{relative path: bytes} of every file (records pinned) and every directory ("rel/")."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames:
            out[os.path.relpath(os.path.join(dirpath, name), top) + "/"] = b""
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                data = f.read()
            out[os.path.relpath(path, top)] = pinned(data, run_root) if is_record_name(name) else data
    return out


def expected_record(c, root):
    """The record the spec's commit must leave, every field."""
    files = sorted(({"path": p, "size": len(content(v))} for p, v in c["files"].items()),
                   key=lambda f: f["path"].encode())
    r = {"version": 1, "step": c["step"], "rank": c["rank"], "world_size": c["world_size"],
         "files": files, "bytes": sum(f["size"] for f in files),
         "durable_path": root + "/durable" + ("" if c["flat"] else f"/step-{c['step']}"),
         "persist": c["persist"], "replicated": c["replicated"], "keep": c["keep"],
         "time": SPEC["time"]}
    if c["writer"]:
        r["run_id"], r["epoch"], r["round"] = c["writer"]
    return r


def tool(*args, check=True):
    p = subprocess.run([TOOL, *map(str, args)], capture_output=True, text=True, timeout=60)
    if check and p.returncode != 0:
        raise AssertionError(f"checkpoint_tool {' '.join(map(str, args))}: exit {p.returncode}: "
                             f"{p.stderr}")
    return p


def tool_json(*args):
    return json.loads(tool(*args).stdout)


class Base(unittest.TestCase):
    def setUp(self):
        saved = {k: os.environ.pop(k) for k in ENV_KEYS if k in os.environ}
        self.addCleanup(self.restore_env, saved)
        self.tmp = tempfile.mkdtemp(prefix="ddpl-golden-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def restore_env(self, saved):
        for k in ENV_KEYS:
            os.environ.pop(k, None)
        os.environ.update(saved)

    def as_writer(self, c, memory_root=None, memory_keep=1):
        """The environment launch gives the commit's rank."""
        for k in ENV_KEYS:
            os.environ.pop(k, None)
        os.environ.update({_env.RANK: str(c["rank"]), _env.WORLD_SIZE: str(c["world_size"]),
                           _env.CHECKPOINT_KEEP: str(memory_keep)})
        if memory_root:
            os.environ[_env.CHECKPOINT_MEMORY] = memory_root
        if c.get("writer"):
            run, epoch, rnd = c["writer"]
            os.environ.update({_env.RUN_ID: run, _env.ROUND_EPOCH: str(epoch),
                               _env.ROUND: str(rnd)})

    def commit(self, c, durable, memory_root=None, memory_keep=1):
        """begin, the spec's files, commit: one step as a program writes it."""
        self.as_writer(c, memory_root, memory_keep)
        path = ckpt.begin(c["step"], dir=durable)
        for rel, v in c["files"].items():
            os.makedirs(os.path.dirname(os.path.join(path, rel)), exist_ok=True)
            with open(os.path.join(path, rel), "wb") as f:
                f.write(content(v))
        return ckpt.commit(c["step"], dir=durable, replicated=c["replicated"],
                           persist=c["persist"], keep=c["keep"], flat=c["flat"])


class Names(Base):
    def test_environment_variables_are_the_specs_and_spelled_only_in_env(self):
        variables = load(os.path.join(GOLDEN, "environment.json"))["variables"]
        constants = {k: v for k, v in vars(_env).items() if k.isupper()}
        self.assertEqual(sorted(constants.values()), sorted(variables))
        for name, sides in variables.items():
            self.assertEqual(getattr(_env, sides["python"]), name)
        # No module of the package spells one itself: a literal there would drift apart.
        package = os.path.join(PYTHON_DIR, "ddplaunch")
        for dirpath, _, filenames in os.walk(package):
            for fn in filenames:
                path = os.path.join(dirpath, fn)
                if not fn.endswith(".py") or path == _env.__file__:
                    continue
                with open(path, encoding="utf-8") as f:
                    module = ast.parse(f.read(), path)
                for node in ast.walk(module):
                    if isinstance(node, ast.Constant) and node.value in variables:
                        self.fail(f"{path}:{node.lineno}: {node.value!r} is spelled here; use "
                                  "ddplaunch._env")

    def test_file_names_limits_and_name_parsing_are_the_specs(self):
        n = load(os.path.join(CASES, "names.json"))
        self.assertEqual(n["version"], _format.VERSION)
        self.assertEqual(n["files"], {"record": _format.RECORD, "fence": _format.FENCE,
                                      "origin": _format.ORIGIN})
        self.assertEqual(n["limits"], {"max_files": _format.MAX_FILES,
                                       "max_record_bytes": _format.MAX_RECORD_BYTES,
                                       "max_fence_bytes": _format.FENCE_MAX})
        for arg, name in n["make"]["rank_dir"]:
            self.assertEqual(_format.rank_dir_name(arg), name)
        for arg, name in n["make"]["step_dir"]:
            self.assertEqual(_format.step_dir_name(arg), name)
        for (step, pid), name in n["make"]["partial_dir"]:
            self.assertEqual(_format.partial_dir_name(step, pid), name)
        for (step, rank), name in n["make"]["marker"]:
            self.assertEqual(_format.marker_name(step, rank), name)
        listed = lambda v: list(v) if v is not None else None  # noqa: E731
        for kind, parse in (("step_dir", _format.parse_step_dir_name),
                            ("rank_dir", _format.parse_rank_dir_name),
                            ("partial_dir", lambda s: listed(_format.parse_partial_dir_name(s))),
                            ("marker", lambda s: listed(_format.parse_marker_name(s)))):
            for name, want in n["parse"][kind].items():
                self.assertEqual(parse(name), want, f"{kind} {name!r}")
        for path, want in n["safe_relative_path"].items():
            self.assertEqual(_format.safe_relative_path(path), want, repr(path))


class Rules(Base):
    def test_agreement_retirement_allowance_and_the_fence(self):
        rules = load(os.path.join(CASES, "rules.json"))
        for v in rules["agreement"]:
            self.assertEqual(_format.agree_on_step(v["offers"]), v["agreed"], v)
        for v in rules["retirement"]:
            self.assertEqual(_format.steps_to_retire(v["persisted"], v["keep"]), v["retired"], v)
        for v in rules["allowance"]:
            self.assertEqual(_format.write_allowance(v["budget"], v["committed"]), v["allowance"])
        for v in rules["fence"]["encode"]:
            self.assertEqual(_format.encode_fence(tuple(v["token"])), v["text"].encode(), v)
        for v in rules["fence"]["decode"]:
            got = _format.decode_fence(v["text"].encode())
            self.assertEqual(list(got) if got else None, v["token"], v)
        for v in rules["fence"]["refuses"]:
            self.assertEqual(_format.fence_refuses(tuple(v["newest"]), tuple(v["mine"])),
                             v["refused"], v)


class Records(Base):
    def test_every_golden_record_reads_as_its_commit_field_by_field(self):
        checked = 0
        for name, c in SPEC["cases"].items():
            commits = {(m["step"], m["rank"]): m for m in c["commits"]}
            for dirpath, _, filenames in os.walk(os.path.join(CASES, name)):
                for fn in filenames:
                    if not is_record_name(fn):
                        continue
                    path = os.path.join(dirpath, fn)
                    with open(path, "rb") as f:
                        got = _format.decode_record(f.read())
                    want = expected_record(commits[got["step"], got["rank"]], SPEC["root"])
                    self.assertEqual(got, want, path)
                    checked += 1
        self.assertEqual(checked, 11)  # every record of the trees that cases.json describes

    def test_broken_records_are_refused_with_their_reason(self):
        expected = load(os.path.join(CASES, "records", "invalid.json"))
        found = sorted(os.listdir(os.path.join(CASES, "records", "invalid")))
        self.assertEqual(found, sorted(expected))
        for name in found:
            with open(os.path.join(CASES, "records", "invalid", name), "rb") as f:
                data = f.read()
            with self.assertRaises(_format.RecordError, msg=name) as cm:
                _format.decode_record(data)
            self.assertIn(expected[name], str(cm.exception), name)

    def test_older_and_odd_records_still_read_and_reencode_to_the_one_encoding(self):
        valid = os.path.join(CASES, "records", "valid")
        for name in os.listdir(valid):
            with open(os.path.join(valid, name), "rb") as f:
                _format.decode_record(f.read())
        with open(os.path.join(valid, "python-indent-1.json"), "rb") as f:
            old = _format.decode_record(f.read())
        with open(os.path.join(CASES, "sharded/memory/rank-0/step-40", _format.RECORD), "rb") as f:
            self.assertEqual(_format.encode_record(old), f.read())
        with open(os.path.join(valid, "epoch-0.json"), "rb") as f:
            anonymous = _format.decode_record(f.read())
        self.assertNotIn(b"run_id", _format.encode_record(anonymous))


class Reading(Base):
    def offers(self, top, reads):
        for rank, want in reads.get("memory", {}).items():
            mem = os.path.join(top, "memory", f"rank-{rank}")
            got = sorted((s for s, _ in _memory.memory_steps(mem, int(rank), reads["world_size"])),
                         reverse=True)
            self.assertEqual(got, want, f"{top} memory, rank {rank}")
        for rank, want in reads.get("durable", {}).items():
            got = sorted(_disk.disk_steps(os.path.join(top, "durable"), int(rank)), reverse=True)
            self.assertEqual(got, want, f"{top} durable, rank {rank}")

    def test_readers_offer_what_the_spec_says(self):
        for name, c in SPEC["cases"].items():
            self.offers(os.path.join(CASES, name), c["reads"])
        self.offers(os.path.join(CASES, "hostile"), SPEC["hostile"])

    def test_latest_resumes_from_the_golden_trees(self):
        # The public call over the golden memory root and durable directory (one rank).
        root = os.path.join(self.tmp, "memory")
        shutil.copytree(os.path.join(CASES, "memory_only", "memory"), root)
        os.environ.update({_env.CHECKPOINT_MEMORY: root, _env.RANK: "0", _env.WORLD_SIZE: "1"})
        found = ckpt.latest()
        self.assertEqual((found.step, found.source), (0, "memory"))
        del os.environ[_env.CHECKPOINT_MEMORY]
        os.environ[_env.RANK] = "1"
        found = ckpt.latest(dir=os.path.join(CASES, "replicated_flat", "durable"))
        self.assertEqual((found.step, found.source), (9, "disk"))


class Writing(Base):
    def compare(self, got_top, run_root, golden_top):
        got, want = tree(got_top, run_root), tree(golden_top, SPEC["root"])
        self.assertEqual(sorted(got), sorted(want), golden_top)
        for rel, data in got.items():
            self.assertEqual(data, want[rel], os.path.join(golden_top, rel))

    def test_writing_the_cases_in_memory_gives_the_golden_bytes(self):
        for name, c in SPEC["cases"].items():
            with self.subTest(case=name):
                root = os.path.join(self.tmp, name + "-memory")
                os.mkdir(root)
                for commit in c["commits"]:
                    self.commit(commit, os.path.join(root, "durable"), os.path.join(root, "memory"),
                                c["memory_keep"])
                self.compare(os.path.join(root, "memory"), root,
                             os.path.join(CASES, name, "memory"))
                self.assertFalse(os.path.exists(os.path.join(root, "durable")))  # launch's job

    def test_writing_the_cases_without_launch_gives_the_golden_durable_bytes(self):
        for name, c in SPEC["cases"].items():
            if not c.get("durable", True):
                continue
            with self.subTest(case=name):
                root = os.path.join(self.tmp, name + "-disk")
                os.mkdir(root)
                for commit in c["commits"]:
                    self.commit(commit, os.path.join(root, "durable"))
                self.compare(os.path.join(root, "durable"), root,
                             os.path.join(CASES, name, "durable"))
                # The directories the writer made are private, as launch's persister makes them.
                for dirpath, _, _ in os.walk(os.path.join(root, "durable")):
                    self.assertEqual(os.stat(dirpath).st_mode & 0o777, 0o700, dirpath)

    def test_the_time_is_the_writers_clock(self):
        c = SPEC["cases"]["memory_only"]["commits"][0]
        root = os.path.join(self.tmp, "clock")
        os.mkdir(root)
        with mock.patch("time.time", return_value=1733300000.25):
            found = self.commit(c, os.path.join(root, "durable"), os.path.join(root, "memory"))
        with open(os.path.join(found.path, _format.RECORD), "rb") as f:
            written = f.read()
        with open(os.path.join(CASES, "memory_only/memory/rank-0/step-0", _format.RECORD),
                  "rb") as f:
            self.assertEqual(pinned(written, root), f.read())
        self.assertIn(b'"time":1733300000.25,', written)


class Cross(Base):
    """Each side reads what the other wrote: C++ is common/checkpoint_files.h through
    checkpoint_tool, as launch and the C++ worker library use it."""

    def files(self, tree_spec):
        src = os.path.join(self.tmp, "src-" + str(len(os.listdir(self.tmp))))
        for rel, data in tree_spec.items():
            os.makedirs(os.path.dirname(os.path.join(src, rel)), exist_ok=True)
            with open(os.path.join(src, rel), "wb") as f:
                f.write(data)
        return src

    def test_cxx_commits_python_reads_and_resumes(self):
        root = os.path.join(self.tmp, "memory")
        durable = os.path.join(self.tmp, "durable")
        src = self.files({"state.pt": b"from C++\n", "sub/x.bin": b"\x00\xff"})
        for step in (3, 4):
            tool("commit", root, 1, 2, step, src, f"durable={durable}/step-{step}", "keep=0",
                 "memory_keep=2", "run=r", "epoch=7", "round=2")
        listed = tool_json("committed", f"{root}/rank-1", 1)
        mem = os.path.join(root, "rank-1")
        mine = {s: _files.read_committed(p, s, 1) for s, p in _memory.memory_steps(mem, 1, 2)}
        self.assertEqual(sorted(mine), [3, 4])
        for entry in listed:
            self.assertEqual(mine[entry["step"]], entry["record"])
        os.environ.update({_env.CHECKPOINT_MEMORY: root, _env.RANK: "1", _env.WORLD_SIZE: "2",
                           _env.LOCAL_RANK: "1", _env.LOCAL_WORLD_SIZE: "2"})
        # The agreement of one rank alone: latest()'s offers, as the Python module makes them.
        from ddplaunch.checkpoint import _agree
        with mock.patch.object(_agree, "_offers", lambda steps, *a: [steps]):
            found = ckpt.latest(dir=durable)
        self.assertEqual((found.step, found.source, found.path),
                         (4, "memory", f"{root}/rank-1/step-4"))

    def test_python_commits_cxx_reads_and_persists_python_resumes_from_disk(self):
        root, durable = os.path.join(self.tmp, "memory"), os.path.join(self.tmp, "durable")
        c = {"rank": 0, "world_size": 1, "step": 12, "keep": 1, "persist": True,
             "replicated": False, "flat": False, "writer": ["r", 7, 3],
             "files": {"state.pt": "from Python\n", "a/b.bin": {"hex": "00ff"}}}
        found = self.commit(c, durable, root)
        self.assertEqual(found.source, "memory")
        listed = tool_json("committed", f"{root}/rank-0", 0)
        self.assertEqual([e["step"] for e in listed], [12])
        self.assertEqual(listed[0]["record"], _files.read_committed(found.path, 12, 0))
        # launch's persister copies it (a C++ fence, a C++ marker); Python resumes from disk.
        self.assertEqual(tool_json("persist", found.path, 12, 0)["bytes"], 14)
        del os.environ[_env.CHECKPOINT_MEMORY]
        back = ckpt.latest(dir=durable)
        self.assertEqual((back.step, back.source, back.path), (12, "disk", f"{durable}/step-12"))
        with open(os.path.join(back.path, "state.pt"), "rb") as f:
            self.assertEqual(f.read(), b"from Python\n")
        # The fence launch wrote into the durable directory is the one Python writes.
        with open(os.path.join(durable, _format.FENCE), "rb") as f:
            self.assertEqual(f.read(), _format.encode_fence(("r", 7, 3)))

    def test_python_writes_without_launch_cxx_reads_the_durable_layout(self):
        durable = os.path.join(self.tmp, "durable")
        for step in (1, 2):
            self.commit({"rank": 0, "world_size": 2, "step": step, "keep": 0, "persist": True,
                         "replicated": True, "flat": True, "writer": None,
                         "files": {f"ckpt-{step}.pt": "x" * step}}, durable)
        for rank in (0, 1):  # replicated: rank 0's copy serves every rank
            listed = tool_json("durable", durable, rank)
            self.assertEqual([e["step"] for e in listed], [2, 1])
            self.assertEqual(listed[0]["record"]["files"], [{"path": "ckpt-2.pt", "size": 2}])

    def test_fences_refuse_across_the_two_sides(self):
        durable = os.path.join(self.tmp, "durable")
        spec = {"rank": 0, "world_size": 1, "keep": 0, "persist": True, "replicated": False,
                "flat": False, "files": {"s": "1"}}
        self.commit(dict(spec, step=1, writer=["job", 100, 5]), durable)
        p = tool("fence", durable, "job", 100, 4, check=False)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn("round 4 (epoch 100) of run 'job'", p.stderr)
        self.assertIn("round 5 (epoch 100) of run 'job' has committed", p.stderr)
        tool("fence", durable, "job", 100, 6)
        with self.assertRaises(ckpt.StaleRoundError):
            self.commit(dict(spec, step=2, writer=["job", 100, 5]), durable)
        self.assertEqual(sorted(_disk.disk_steps(durable, 0)), [1])
        # Another run's fence says nothing of this one.
        self.commit(dict(spec, step=3, writer=["job2", 1, 0]), durable)

    def test_retention_across_the_two_sides(self):
        durable = os.path.join(self.tmp, "durable")
        flat = {"rank": 0, "world_size": 1, "keep": 0, "persist": True, "replicated": False,
                "flat": True, "writer": None}
        # Steps 1-3 by Python (a name steps 1 and 3 share: the kept step's file stays), then
        # C++ keeps the newest 2.
        self.commit(dict(flat, step=1, files={"shared.pt": "one", "one.pt": "1"}), durable)
        self.commit(dict(flat, step=2, files={"two.pt": "2"}), durable)
        self.commit(dict(flat, step=3, files={"shared.pt": "333"}), durable)
        self.assertEqual(tool_json("retire", durable, 0, 2)["retired"], 1)
        self.assertEqual(sorted(_disk.disk_steps(durable, 0)), [2, 3])
        self.assertEqual(sorted(n for n in os.listdir(durable) if not n.startswith(".ddpl-f")),
                         [".ddpl-step-2.rank-0.json", ".ddpl-step-3.rank-0.json", "shared.pt",
                          "two.pt"])
        # And the other way: C++ persists two steps of its own, Python keeps the newest 1.
        root = os.path.join(self.tmp, "memory")
        for step in (4, 5):
            src = self.files({f"s{step}.pt": b"cxx"})
            out = tool_json("commit", root, 0, 1, step, src, f"durable={durable}", "keep=0")
            tool("persist", out["dir"], step, 0)
        self.assertEqual(_disk.retention(durable, 0, 1), 3)
        self.assertEqual([e["step"] for e in tool_json("durable", durable, 0)], [5])
        self.assertEqual(sorted(n for n in os.listdir(durable) if not n.startswith(".ddpl-f")),
                         [".ddpl-step-5.rank-0.json", "s5.pt"])


if __name__ == "__main__":
    if len(sys.argv) < 2 or not os.access(sys.argv[1], os.X_OK):
        sys.exit("usage: python_checkpoint_golden_test.py CHECKPOINT_TOOL (build it: "
                 "checkpoint_tool)")
    TOOL = sys.argv.pop(1)
    import python_test_main  # noqa: E402

    python_test_main.main()
