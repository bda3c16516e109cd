"""ddplaunch: a native, torchrun-compatible launcher for distributed PyTorch training.

Installing the wheel puts `launch` and `rdzv-server` on the environment's PATH. They are native
programs (this package holds them under ddplaunch/bin/); the entry points only exec them.
"""
import os

__all__ = ["binary"]

_HERE = os.path.dirname(os.path.abspath(__file__))


def binary(name):
    """Absolute path of one of the package's programs: 'launch' or 'rdzv-server'."""
    return os.path.join(_HERE, "bin", name)
