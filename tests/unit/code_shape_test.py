"""The size limits the house keeps (issue 46), read from the tree itself.

- No product source file (common/, proto/, rendezvous/, web/, launcher/, worker/, examples/,
  tools/, bench/; tests excluded) over 800 lines: past that, a file holds several jobs.
- No function over 150 lines other than a flag table; none over 100 in the agent's room
  (launcher/agent/), whose loop grew back twice by accretion.
A flag table is a function whose body is one list of flags (launch's `flags`, rdzv-server's
`serverFlags`, the example's `flags`): they grow with torchrun's flags, one entry at a time, and
splitting them would only scatter one table. They are named in FLAG_TABLES below; a new one is
added there on purpose.

C++ function extents come from Universal Ctags (`--fields=+ne`: start and end line of every function
and method, lambdas at namespace scope included); without ctags the function check is skipped
(exit 77), the file check still runs. Python functions are measured with the ast module (same
150-line limit).

Usage: code_shape_test.py (CTest runs it; standard library + ctags only)."""
import ast
import os
import shutil
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRODUCT = ("common", "proto", "rendezvous", "web", "launcher", "worker", "examples", "tools",
           "bench", "python", "scripts")
SOURCES = (".h", ".hpp", ".cc", ".cpp", ".c", ".proto", ".py", ".sh")
CXX = (".h", ".hpp", ".cc", ".cpp", ".c")
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 150
MAX_AGENT_FUNCTION_LINES = 100
AGENT_ROOM = "launcher/agent/"
FLAG_TABLES = {
    ("launcher/cli/flags.cc", "flags"),
    ("rendezvous/server/server_flags.cc", "serverFlags"),
    ("examples/ddp_resnet/options.cc", "flags"),
}


def product_files():
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "--", *PRODUCT], check=True,
                         capture_output=True, text=True).stdout.split()
    return [p for p in out if p.endswith(SOURCES) and "/tests/" not in p and
            os.path.isfile(os.path.join(ROOT, p))]


def functions(paths):
    """(path, name, start, end) of every C++ function and method in `paths`, by ctags."""
    cmd = ["ctags", "--languages=C++", "--language-force=C++", "--c++-kinds=f",
           "--fields=+ne", "-o", "-", *paths]
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        cols = line.split("\t")
        fields = dict(c.split(":", 1) for c in cols[3:] if ":" in c)
        if "line" in fields and "end" in fields:
            found.append((cols[1], cols[0], int(fields["line"]), int(fields["end"])))
    return found


def function_limit(path, name):
    if (path, name) in FLAG_TABLES:
        return None
    return MAX_AGENT_FUNCTION_LINES if path.startswith(AGENT_ROOM) else MAX_FUNCTION_LINES


def too_long(funcs):
    bad = []
    for path, name, start, end in funcs:
        limit = function_limit(path, name)
        if limit is not None and end - start + 1 > limit:
            bad.append(f"{path}:{start} {name}: {end - start + 1} lines (limit {limit})")
    return bad


class CodeShape(unittest.TestCase):
    def test_no_product_file_is_over_800_lines(self):
        bad = []
        for p in product_files():
            with open(os.path.join(ROOT, p), "rb") as f:
                n = f.read().count(b"\n")
            if n > MAX_FILE_LINES:
                bad.append(f"{p}: {n} lines")
        self.assertEqual(bad, [], f"split these by concern (limit {MAX_FILE_LINES} lines)")

    def test_the_function_check_sees_a_long_function(self):
        # The check itself: a 151-line function is caught, a flag table is not, and ctags
        # reports end lines on this machine (without them every function would look short).
        if not shutil.which("ctags"):
            self.skipTest("ctags not installed (Debian: universal-ctags)")
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            body = "".join(f"  x += {i};\n" for i in range(149))
            src = os.path.join(d, "long.cc")
            with open(src, "w") as f:
                f.write("int longOne() {\n  int x = 0;\n" + body + "}\n")
            funcs = functions([src])
        self.assertEqual(len(funcs), 1, funcs)
        _, name, start, end = funcs[0]
        self.assertEqual((name, end - start + 1), ("longOne", 152))
        self.assertEqual(len(too_long([("launcher/x.cc", name, start, end)])), 1)
        self.assertEqual(too_long([("launcher/cli/flags.cc", "flags", start, end)]), [])
        self.assertEqual(len(too_long([("launcher/agent/x.cc", name, 1, 101)])), 1)

    def test_no_python_function_is_over_150_lines(self):
        bad = []
        for p in product_files():
            if not p.endswith(".py"):
                continue
            with open(os.path.join(ROOT, p), encoding="utf-8") as f:
                tree = ast.parse(f.read(), p)
            for n in ast.walk(tree):
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = n.end_lineno - n.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        bad.append(f"{p}:{n.lineno} {n.name}: {lines} lines")
        self.assertEqual(bad, [], "split these into named steps")

    def test_no_function_is_over_its_limit(self):
        if not shutil.which("ctags"):
            self.skipTest("ctags not installed (Debian: universal-ctags)")
        funcs = functions([p for p in product_files() if p.endswith(CXX)])
        self.assertGreater(len(funcs), 500, "ctags found too few functions to be trusted")
        tables = {(p, n) for p, n, _, _ in funcs}
        self.assertEqual(FLAG_TABLES - tables, set(), "a flag table named here is gone")
        self.assertEqual(too_long(funcs), [], "split these into named steps")


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    if not result.wasSuccessful():
        sys.exit(1)
    sys.exit(77 if result.skipped else 0)
