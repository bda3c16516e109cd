"""ddplaunch: a native, torchrun-compatible launcher for distributed PyTorch training.

Installing the wheel puts `launch` and `rdzv-server` on the environment's PATH. They are native
programs (this package holds them under ddplaunch/bin/); the entry points only exec them.

In a training script, `ddplaunch.step()` once per step reports progress to launch, and
`ddplaunch.done()` after the last one that the rest is teardown; they do nothing under torchrun
or without a launcher (ddplaunch.progress: step, current, done, add_wait, waiting, enabled).

Checkpoints: `from ddplaunch import checkpoint as ckpt` (ddplaunch.checkpoint: save, load,
latest, begin, commit, StorageWriter, StorageReader) writes them into launch's memory tier,
or straight to the durable directory without launch (docs/checkpoints.md).
"""
import os

__all__ = ["binary", "checkpoint", "step", "current", "done", "add_wait", "waiting", "enabled"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_PROGRESS = ("step", "current", "done", "add_wait", "waiting", "enabled")


def binary(name):
    """Absolute path of one of the package's programs: 'launch' or 'rdzv-server'."""
    return os.path.join(_HERE, "bin", name)


def __getattr__(name):
    # The progress calls load on first use: every `launch` started from the wheel's entry point
    # imports this package, and launch's start-up is counted in milliseconds.
    if name in _PROGRESS:
        from ddplaunch import progress

        value = getattr(progress, name)
        globals()[name] = value
        return value
    if name == "checkpoint":  # a submodule, loaded on first use for the same reason
        import importlib

        module = importlib.import_module("ddplaunch.checkpoint")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'ddplaunch' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_PROGRESS) | {"checkpoint"})
