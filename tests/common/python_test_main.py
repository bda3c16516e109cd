"""How a Python test file that CTest runs ends, so that a skipped test is never counted as passed.

unittest exits 0 when a test was skipped; CTest would then say "Passed" for the whole file. Each
such file ends with ``python_test_main.main()`` instead of ``unittest.main()``: exit 1 when a test
failed or none ran, else 77 when one was skipped (its CMake registration sets SKIP_RETURN_CODE 77,
so CTest says "Skipped"), else 0. Every skip is named on a line of its own,

    SKIP: <test id>: <reason>

which scripts/test_report.py lists at the end of `make test`.
"""
import sys
import unittest

SKIP = 77


def main(argv=None, verbosity=2):
    program = unittest.main(argv=argv, verbosity=verbosity, exit=False)
    result = program.result
    sys.stderr.flush()
    if not result.wasSuccessful():
        sys.exit(1)
    if result.testsRun == 0:
        print("no test ran", flush=True)
        sys.exit(1)
    if result.skipped:
        for test, reason in result.skipped:
            print(f"SKIP: {test.id()}: {reason}", flush=True)
        sys.exit(SKIP)
    sys.exit(0)
