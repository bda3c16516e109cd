"""The values the public calls return and raise."""
import dataclasses
import sys


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A committed step: read its files from `path`; `source` is "memory", "peer" (launch
    copied it from another node's replica) or "disk"."""
    step: int
    path: str
    source: str
    rank: int


class StaleRoundError(RuntimeError):
    """A write from a group older than the newest that committed to the directory: this
    process's node lost the rendezvous and the job re-formed without it (the fence)."""


def api():
    """The package ddplaunch.checkpoint. One public call reaches another through it, as when the
    package was one module: a program (or a test) that replaces ckpt.commit replaces it for
    save() too."""
    return sys.modules[__package__]
