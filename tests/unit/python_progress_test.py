"""ddplaunch.step() and friends (python/ddplaunch/progress.py) against the layout launch reads
(common/heartbeat.h): the exact bytes they leave in a heartbeat file made as launch makes it,
and nothing at all (no exception, no write) without launch or with a descriptor that is not
launch's. Each case runs in a fresh interpreter, as a worker does, because the module reads
DDPL_HEARTBEAT_FD once per process.

Usage: python_progress_test.py (the checkout's python/ is put on the children's path)"""
import fcntl
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_DIR = os.path.join(ROOT, "python")
HEARTBEAT_BYTES = 64  # common/heartbeat.h: kHeartbeatBytes


def launch_heartbeat():
    """A memfd as launch's agent makes one: 64 bytes, its size sealed."""
    fd = os.memfd_create("ddpl-heartbeat", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, HEARTBEAT_BYTES)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd


def field(fd, offset):
    return int.from_bytes(os.pread(fd, 8, offset), "little")


def worker(code, fd_value=None, pass_fds=()):
    """Runs `code` in a child with ddplaunch importable and DDPL_HEARTBEAT_FD=fd_value (unset
    when None); returns its stdout, failing the test on its exit status."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DDPL_HEARTBEAT_FD", "DDPL_FLIGHT_RECORDER_SOCKET")}
    env["PYTHONPATH"] = PYTHON_DIR
    if fd_value is not None:
        env["DDPL_HEARTBEAT_FD"] = str(fd_value)
    prelude = "import os, sys, time\nimport ddplaunch\n"
    r = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], env=env,
                       pass_fds=pass_fds, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"worker failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


class UnderLaunch(unittest.TestCase):
    def setUp(self):
        self.fd = launch_heartbeat()
        self.addCleanup(os.close, self.fd)

    def run_worker(self, code):
        return worker(code, self.fd, pass_fds=(self.fd,))

    def test_step_writes_the_count_little_endian_at_offset_0_and_nothing_else(self):
        out = self.run_worker("""
            fd = int(os.environ["DDPL_HEARTBEAT_FD"])
            assert ddplaunch.enabled()
            for expected in (1, 2, 3):
                assert ddplaunch.step() == expected
                # The file itself, not the mapping: what launch's own mapping of it sees.
                assert os.pread(fd, 8, 0) == expected.to_bytes(8, "little"), os.pread(fd, 8, 0)
            assert ddplaunch.step(0x0102030405060708) == 0x0102030405060708
            print("ok")
        """)
        self.assertEqual(out.strip(), "ok")
        self.assertEqual(os.pread(self.fd, 8, 0), bytes.fromhex("0807060504030201"))
        self.assertEqual(os.pread(self.fd, 16, 8), bytes(16))
        self.assertEqual(field(self.fd, 24), 0x0102030405060709)  # the exit: finished stepping
        self.assertEqual(os.pread(self.fd, HEARTBEAT_BYTES - 32, 32), bytes(HEARTBEAT_BYTES - 32))

    def test_step_continues_from_an_explicit_count_and_may_go_back(self):
        self.run_worker("""
            assert ddplaunch.step(100) == 100
            assert ddplaunch.step() == 101
            assert ddplaunch.current() == 101
            assert ddplaunch.step(7) == 7  # resumed from an earlier checkpoint
            assert ddplaunch.step() == 8
        """)
        self.assertEqual(field(self.fd, 0), 8)

    def test_integer_likes_are_steps_and_bad_counts_raise(self):
        self.run_worker("""
            class Index:  # numpy integers and one-element integer tensors are such
                def __index__(self):
                    return 41
            assert ddplaunch.step(Index()) == 41
            for bad, error in ((-1, ValueError), (1 << 64, ValueError), (1.5, TypeError),
                               ("3", TypeError)):
                try:
                    ddplaunch.step(bad)
                except error:
                    pass
                else:
                    raise AssertionError(f"step({bad!r}) did not raise {error.__name__}")
            assert ddplaunch.current() == 41
        """)
        self.assertEqual(field(self.fd, 0), 41)
        self.assertEqual(field(self.fd, 8), 0)

    def test_waits_add_up_in_microseconds_at_offset_8(self):
        out = self.run_worker("""
            ddplaunch.step()
            ddplaunch.add_wait(0.0015)
            ddplaunch.add_wait(0.0025)
            with ddplaunch.waiting():
                time.sleep(0.05)
            print(ddplaunch.current())
        """)
        self.assertEqual(out.strip(), "1")
        self.assertEqual(field(self.fd, 0), 1)
        waited = field(self.fd, 8)
        self.assertGreaterEqual(waited, 4000 + 50000)
        self.assertLess(waited, 4000 + 50000 + 5_000_000)  # a loaded machine, but not seconds
        self.assertEqual(field(self.fd, 16), 0)
        self.assertEqual(os.pread(self.fd, HEARTBEAT_BYTES - 32, 32), bytes(HEARTBEAT_BYTES - 32))

    def test_done_marks_the_last_step_at_offset_24_and_a_later_step_cancels_it(self):
        # The step count it finished at, plus one: launch takes the mark while it matches.
        out = self.run_worker("""
            fd = int(os.environ["DDPL_HEARTBEAT_FD"])
            mark = lambda: int.from_bytes(os.pread(fd, 8, 24), "little")
            ddplaunch.step(41)
            assert mark() == 0, mark()
            ddplaunch.done()
            print(mark(), int.from_bytes(os.pread(fd, 8, 0), "little"))
            ddplaunch.step()  # stepping again: 42 no longer matches the mark
            print(mark(), int.from_bytes(os.pread(fd, 8, 0), "little"))
            os._exit(0)  # no exit handlers: the mark stays as it is
        """)
        self.assertEqual(out.split("\n")[:2], ["42 41", "42 42"])
        self.assertEqual(field(self.fd, 24), 42)

    def test_the_interpreters_exit_marks_the_last_step_before_earlier_exit_handlers(self):
        # Handlers registered before the first call (torch registers its own at import) run
        # after ddplaunch's: by then launch knows the rank is tearing down. A forked child that
        # exits on its own does not mark its parent, which may still be stepping.
        out = self.run_worker("""
            import atexit
            fd = int(os.environ["DDPL_HEARTBEAT_FD"])
            mark = lambda: int.from_bytes(os.pread(fd, 8, 24), "little")
            parent = os.getpid()
            atexit.register(lambda: os.getpid() == parent and print("mark at teardown", mark()))
            ddplaunch.step()
            ddplaunch.step()
            pid = os.fork()
            if pid == 0:
                sys.exit(0)  # exit handlers run in the child
            os.waitpid(pid, 0)
            print("mark after the child's exit", mark(), flush=True)
        """)
        self.assertEqual(out.split("\n")[:2],
                         ["mark after the child's exit 0", "mark at teardown 3"])
        self.assertEqual(field(self.fd, 24), 3)

    def test_checkpoint_reads_add_up_in_microseconds_at_offset_16(self):
        # ddplaunch.checkpoint.latest() and load() report their time here (a restart's phases).
        self.run_worker("""
            from ddplaunch import progress
            progress._add_restore_ns(1_500_000)
            progress._add_restore_ns(1_000_000)
        """)
        self.assertEqual(field(self.fd, 16), 2500)
        self.assertEqual(field(self.fd, 0), 0)

    def test_the_checkpoint_resumed_from_goes_at_offsets_32_and_40(self):
        # ddplaunch.checkpoint.latest() names it: its step plus one, and 1 memory 2 peer 3 disk
        # (launch's incident table, launcher/warm/restart_phases.h).
        self.run_worker("""
            from ddplaunch import progress
            progress._set_restored(0, "disk")
        """)
        self.assertEqual((field(self.fd, 32), field(self.fd, 40)), (1, 3))
        self.run_worker("""
            from ddplaunch import progress
            progress._set_restored(30, "memory")
            progress._set_restored(29, "peer")
        """)
        self.assertEqual((field(self.fd, 32), field(self.fd, 40)), (30, 2))
        self.assertEqual(field(self.fd, 0), 0)

    def test_the_variable_is_read_once(self):
        self.run_worker("""
            ddplaunch.step()
            os.environ["DDPL_HEARTBEAT_FD"] = "-1"
            ddplaunch.step()
        """)
        self.assertEqual(field(self.fd, 0), 2)

    def test_import_loads_neither_torch_nor_the_progress_module(self):
        # `launch` from the wheel's entry point imports ddplaunch on every start.
        out = self.run_worker("""
            print("ddplaunch.progress" in sys.modules, "torch" in sys.modules)
            ddplaunch.step()
            print("ddplaunch.progress" in sys.modules, "torch" in sys.modules)
            from ddplaunch import step, waiting, add_wait, current, done, enabled
            print(step is ddplaunch.step, sorted(set(ddplaunch.__all__) - set(dir(ddplaunch))))
        """)
        self.assertEqual(out.split("\n")[:3], ["False False", "True False", "True []"])


class WithoutLaunch(unittest.TestCase):
    NOOP = """
        assert not ddplaunch.enabled()
        assert [ddplaunch.step() for _ in range(3)] == [1, 2, 3]
        assert ddplaunch.step(10) == 10 and ddplaunch.current() == 10
        ddplaunch.add_wait(0.5)
        with ddplaunch.waiting():
            pass
        print("ok")
    """

    def test_no_variable_is_a_no_op(self):
        self.assertEqual(worker(self.NOOP).strip(), "ok")

    def test_not_launchs_descriptor_is_a_no_op_and_left_untouched(self):
        named = tempfile.NamedTemporaryFile()  # a file anyone can open by name
        named.write(bytes(HEARTBEAT_BYTES))
        named.flush()
        r, w = os.pipe()
        self.addCleanup(os.close, r)
        self.addCleanup(os.close, w)
        small = os.memfd_create("too-small")  # cannot hold every field
        os.ftruncate(small, 8)
        self.addCleanup(os.close, small)
        # A number that names no open descriptor: the variable inherited by a subprocess.
        closed = os.open(os.devnull, os.O_RDONLY)
        os.close(closed)
        cases = [("", ()), ("x", ()), ("-1", ()), ("3.0", ()), (str(closed), ()),
                 (str(named.fileno()), (named.fileno(),)), (str(w), (w,)),
                 (str(small), (small,))]
        for value, fds in cases:
            with self.subTest(DDPL_HEARTBEAT_FD=value):
                self.assertEqual(worker(self.NOOP, value, pass_fds=fds).strip(), "ok")
        self.assertEqual(os.pread(named.fileno(), 100, 0), bytes(HEARTBEAT_BYTES))
        self.assertEqual(os.pread(small, 100, 0), bytes(8))

    def test_the_variable_is_read_once(self):
        fd = launch_heartbeat()
        self.addCleanup(os.close, fd)
        worker(f"""
            ddplaunch.step()
            os.environ["DDPL_HEARTBEAT_FD"] = "{fd}"
            ddplaunch.step()
            assert not ddplaunch.enabled()
        """, None, pass_fds=(fd,))
        self.assertEqual(field(fd, 0), 0)

    def test_after_the_first_call_nothing_is_looked_up(self):
        # Neither the environment nor the descriptor again, under launch or not.
        fd = launch_heartbeat()
        self.addCleanup(os.close, fd)
        code = """
            ddplaunch.step()
            class Trap(dict):
                def __getitem__(self, key):
                    raise AssertionError(f"looked up {key} again")
                get = __getitem__
            def trap(*args):
                raise AssertionError("a system call again")
            os.environ = Trap()
            os.fstat = os.pread = os.pwrite = trap
            for _ in range(3):
                ddplaunch.step()
            ddplaunch.add_wait(0.001)
            with ddplaunch.waiting():
                pass
            print(ddplaunch.current(), ddplaunch.enabled())
        """
        self.assertEqual(worker(code).strip(), "4 False")
        self.assertEqual(worker(code, fd, pass_fds=(fd,)).strip(), "4 True")
        self.assertEqual(field(fd, 0), 4)

    def test_a_no_op_call_is_cheap(self):
        # About 0.1 µs here; a loose bound, for a loaded machine: it catches a call that grew
        # real work, as a loop or an import would be.
        out = worker("""
            ddplaunch.step()
            n = 200_000
            t = time.perf_counter()
            for _ in range(n):
                ddplaunch.step()
            print((time.perf_counter() - t) / n * 1e9)
        """)
        self.assertLess(float(out), 3000, "ns per no-op step()")

class FlightRecorderAnswer(unittest.TestCase):
    """The first call serves torch's flight recorder where launch names a socket
    (DDPL_FLIGHT_RECORDER_SOCKET, python/ddplaunch/_flight_recorder.py): one JSON object per
    connection, from a thread, while the main thread does something else."""

    def start(self, sock, code="ddplaunch.step()"):
        env = {k: v for k, v in os.environ.items() if k != "DDPL_HEARTBEAT_FD"}
        env["PYTHONPATH"] = PYTHON_DIR
        env["DDPL_FLIGHT_RECORDER_SOCKET"] = sock
        p = subprocess.Popen(
            [sys.executable, "-c", "import sys, time\nimport ddplaunch\n" + code +
             "\nprint('ready', flush=True)\ntime.sleep(60)"],
            env=env, stdout=subprocess.PIPE, text=True)
        self.addCleanup(p.wait)
        self.addCleanup(p.kill)
        self.assertEqual(p.stdout.readline().strip(), "ready")
        return p

    def ask(self, sock):
        import json
        import socket

        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(sock)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return json.loads(data)
                data += chunk

    def test_answers_each_connection_and_says_why_there_is_no_record(self):
        d = tempfile.mkdtemp()
        sock = os.path.join(d, "fr.sock")
        p = self.start(sock)
        for _ in range(2):
            self.assertEqual(self.ask(sock), {"pid": p.pid, "fr": None, "nccl": None,
                                              "error": "torch.distributed is not loaded"})

    def test_an_inheriting_child_leaves_the_ranks_socket_alone(self):
        d = tempfile.mkdtemp()
        sock = os.path.join(d, "fr.sock")
        rank = self.start(sock)
        self.start(sock)  # the same variable, as a helper process of the rank inherits it
        self.assertEqual(self.ask(sock)["pid"], rank.pid)

    def test_nothing_without_the_variable_or_before_the_first_call(self):
        d = tempfile.mkdtemp()
        sock = os.path.join(d, "fr.sock")
        self.start(sock, code="")  # imported only
        self.assertEqual(os.listdir(d), [])
        out = worker("""
            ddplaunch.step()
            import threading
            print(sorted(t.name for t in threading.enumerate()))
        """)
        self.assertEqual(out.strip(), "['MainThread']")


if __name__ == "__main__":
    # Exit 77 when a test was skipped (SKIP_RETURN_CODE): never counted as passed.
    sys.path.insert(0, os.path.join(ROOT, "tests", "common"))
    import python_test_main  # noqa: E402
    python_test_main.main()
