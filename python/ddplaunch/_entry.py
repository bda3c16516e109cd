"""Console entry points: replace this interpreter with the native program at once."""
import os
import sys

from ddplaunch import binary


def _exec(name):
    # Scripts run under this environment's interpreter, as torchrun runs them under its own
    # (launch reads DDPL_LAUNCH_PYTHON; PYTHON_EXEC still wins).
    os.environ.setdefault("DDPL_LAUNCH_PYTHON", sys.executable)
    path = binary(name)
    try:
        os.execv(path, [name] + sys.argv[1:])
    except OSError as e:
        sys.stderr.write(f"{name}: cannot run {path}: {e} (reinstall ddplaunch)\n")
        sys.exit(127)


def launch():
    _exec("launch")


def rdzv_server():
    _exec("rdzv-server")
