"""The environment variable names the ddplaunch package reads, spelled once on this side.

launch's side spells them in common/defaults.h (envvar::) and common/torchrun_env.h. Neither
side generates the other: tests/golden/names.json lists every name with the constant that holds
it on each side, and the golden tests of both languages check their constants against it
(tests/unit/python_checkpoint_format_test.py also checks that no other module of this package
writes such a name as a literal).
"""

# Set by launch for each worker when checkpoints in memory are on (docs/checkpoints.md).
CHECKPOINT_MEMORY = "DDPL_CHECKPOINT_MEMORY"  # the node's memory root
CHECKPOINT_BUDGET = "DDPL_CHECKPOINT_MEMORY_BUDGET"  # bytes per rank
CHECKPOINT_KEEP = "DDPL_CHECKPOINT_MEMORY_KEEP"  # committed steps kept per rank
CHECKPOINT_DIR = "DDPL_CHECKPOINT_DIR"  # launch's --checkpoint-dir
# The round a worker's group belongs to and the epoch that numbers rounds (the fence).
ROUND = "DDPL_ROUND"
ROUND_EPOCH = "DDPL_ROUND_EPOCH"
# The step heartbeat's descriptor (common/heartbeat.h; ddplaunch.progress).
HEARTBEAT_FD = "DDPL_HEARTBEAT_FD"

# torchrun's names, which launch sets too.
RUN_ID = "TORCHELASTIC_RUN_ID"
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
