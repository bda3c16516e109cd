#!/usr/bin/env python3
"""Writes the seed corpora under tests/fuzz/corpus/ (run from anywhere; idempotent). Requests
are encoded by hand (protobuf wire format) so that no protobuf package is needed."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def varint(n):
    n &= (1 << 64) - 1
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def f_varint(num, v):
    return varint(num << 3) + varint(v)


def f_bytes(num, b):
    if isinstance(b, str):
        b = b.encode()
    return varint(num << 3 | 2) + varint(len(b)) + b


def store(id_, field, body):
    return f_varint(1, id_) + f_bytes(field, body)


def record(kind, body):
    return bytes([kind]) + struct.pack("<H", len(body)) + body


STORE, JOIN, HEARTBEAT, LEAVE, WATCH_BROKE, ADVANCE = range(6)


def join(run, node, lws, mn, mx, jt=600000, lc=30000):
    return (f_bytes(1, run) + f_bytes(2, node) + f_varint(3, lws) + f_bytes(4, "0.1") +
            f_bytes(5, "h") + f_varint(6, mn) + f_varint(7, mx) + f_varint(8, jt) + f_varint(9, lc))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


I64_MAX = (1 << 63) - 1
requests = {
    "store_ops": b"".join([
        record(STORE, store(1, 3, f_bytes(1, "k") + f_bytes(2, "v"))),
        record(STORE, store(2, 4, f_bytes(1, "k") + f_varint(2, 100))),
        record(STORE, store(3, 5, f_bytes(1, "n") + f_varint(2, 5))),
        record(STORE, store(4, 6, f_bytes(1, "k") + f_bytes(2, "v") + f_bytes(3, "w"))),
        record(STORE, store(5, 7, f_bytes(1, "k") + f_bytes(1, "n"))),
        record(STORE, store(6, 8, f_bytes(1, "a") + f_bytes(1, "b") + f_varint(2, 10))),
        record(STORE, store(7, 11, f_bytes(1, "k") + f_bytes(1, "a") + f_varint(2, 10))),
        record(STORE, store(8, 12, f_bytes(1, "a") + f_bytes(1, "b") + f_bytes(2, "1") + f_bytes(2, "2"))),
        record(STORE, store(9, 9, f_bytes(1, "k"))),
        record(STORE, store(10, 10, f_bytes(1, "r/"))),
        record(STORE, store(11, 2, b"")),
    ]),
    "add_overflow": b"".join([
        record(STORE, store(1, 5, f_bytes(1, "n") + f_varint(2, I64_MAX))),
        record(STORE, store(2, 5, f_bytes(1, "n") + f_varint(2, 1))),
        record(STORE, store(3, 5, f_bytes(1, "m") + f_varint(2, -(1 << 63)))),
        record(STORE, store(4, 5, f_bytes(1, "m") + f_varint(2, -1))),
    ]),
    "rounds": b"".join([
        record(JOIN, join("r", "a", 2, 2, 2)),
        record(JOIN, join("r", "b", 3, 2, 3)),
        record(ADVANCE, struct.pack("<H", 30000)),
        record(HEARTBEAT, f_bytes(1, "r") + f_bytes(2, "a")),
        record(JOIN, join("r", "c", 1, 2, 3)),
        record(WATCH_BROKE, f_bytes(1, "r") + f_bytes(2, "b") + f_varint(3, 0)),
        record(LEAVE, f_bytes(1, "r") + f_bytes(2, "a")),
        record(ADVANCE, struct.pack("<H", 65535)),
        record(ADVANCE, struct.pack("<H", 65535)),
    ]),
    "huge_numbers": b"".join([
        record(JOIN, join("r", "a", (1 << 31) - 1, 2, 2, I64_MAX, I64_MAX)),
        record(JOIN, join("r", "b", 1, 2, 2, I64_MAX, I64_MAX)),
        record(JOIN, join("s", "a", 1, 1, 1, -1, -1)),
        record(ADVANCE, struct.pack("<H", 65535)),
        record(STORE, store(1, 4, f_bytes(1, "k") + f_varint(2, I64_MAX))),
        record(STORE, store(2, 4, f_bytes(1, "k") + f_varint(2, -5))),
    ]),
}
for name, data in requests.items():
    write("fuzz_requests", name, data)


# fuzz_wire: what a store-socket client sends after the magic (frames: a 4-byte little-endian
# length, then a StoreRequest). The server's token is "tok" (fuzz_wire.cc).
def frame(body):
    return struct.pack("<I", len(body)) + body


def ping(id_, token):
    return f_varint(1, id_) + f_bytes(2, b"") + (f_bytes(14, token) if token else b"")


HELLO = frame(ping(0, "tok"))
wire = {
    "ops": HELLO + b"".join(frame(r) for r in [
        store(1, 3, f_bytes(1, "k") + f_bytes(2, "v")),
        store(2, 4, f_bytes(1, "k") + f_varint(2, 100)),
        store(3, 5, f_bytes(1, "n") + f_varint(2, 5)),
        store(4, 6, f_bytes(1, "k") + f_bytes(2, "v") + f_bytes(3, "w")),
        store(5, 7, f_bytes(1, "k") + f_bytes(1, "n")),
        store(6, 8, f_bytes(1, "k") + f_varint(2, 10)),
        store(7, 9, f_bytes(1, "k")),
        store(8, 10, f_bytes(1, "")),
        store(9, 11, f_bytes(1, "k") + f_bytes(1, "n") + f_varint(2, 10)),
        store(10, 12, f_bytes(1, "a") + f_bytes(1, "b") + f_bytes(2, "1") + f_bytes(2, "2")),
        store(11, 3, f_bytes(1, "q") + f_bytes(2, "quiet")) + f_varint(13, 1),
        store(12, 2, b""),
    ]),
    "parked": HELLO + b"".join(frame(store(i, 4, f_bytes(1, "never%d" % i) + f_varint(2, 500)))
                               for i in range(1, 8))
              + frame(store(8, 3, f_bytes(1, "never1") + f_bytes(2, "x"))),
    "big_answers": HELLO + frame(store(1, 3, f_bytes(1, "big") + f_bytes(2, b"b" * 1000)))
                   + b"".join(frame(store(i, 4, f_bytes(1, "big") + f_varint(2, 10)))
                              for i in range(2, 10)),
    "wrong_token": frame(ping(0, "guess")) + frame(store(1, 3, f_bytes(1, "k") + f_bytes(2, "v"))),
    "no_token": frame(ping(0, "")),
    "first_not_ping": frame(store(0, 4, f_bytes(1, "k")) + f_bytes(14, "tok")),
    "ping_not_id0": frame(ping(7, "tok")),
    "oversized_hello": struct.pack("<I", (64 << 10) + 1) + b"x" * 16,
    "huge_after_hello": HELLO + struct.pack("<I", 0xFFFFFFFF),
    "garbage_after_hello": HELLO + frame(b"\x0a\x05ab"),
    "value_too_big": HELLO + frame(store(1, 3, f_bytes(1, "k") + f_bytes(2, b"v" * 1100))),
    "partial": HELLO + struct.pack("<I", 100) + b"\x08",
}
for name, data in wire.items():
    write("fuzz_wire", name, data)

cli = {
    "elastic": ["--nnodes=1:3", "--nproc-per-node=2", "--rdzv-backend=c10d",
                "--rdzv-endpoint=head:29400", "--rdzv-id=job", "--max-restarts=3", "train.py", "--lr", "0.1"],
    "standalone": ["--standalone", "--nproc-per-node=gpu", "--redirects=3", "--tee=0:3", "x.py"],
    "static": ["--nnodes=2", "--node-rank=1", "--master-addr=10.0.0.1", "--master-port=29500",
               "--nproc_per_node", "4", "-m", "pkg.mod"],
    "rdzv_conf": ["--rdzv-conf=join_timeout=5,read_timeout=60,is_host=0,last_call_timeout=1",
                  "--nnodes=2", "--rdzv-endpoint=[::1]:1", "--signals-to-handle=SIGUSR1,15", "p.py"],
    "mpi": ["--launcher=mpi", "--hostfile", "hosts", "--mpi-args", "-x FOO 'a b'", "--no-python", "prog"],
    "env": ["PET_NPROC_PER_NODE=3", "PET_NNODES=1", "--log-dir=/tmp/x", "--run-path", "script.py"],
    "slurm": ["node[01-03,7],gpu-[1-2]"],
}
for name, args in cli.items():
    write("fuzz_cli", name, "\0".join(args).encode())

hostfiles = {
    "basic": "node1 slots=4\nnode2 slots=2 max_slots=4\n# a comment\n\nnode3   # trailing\n",
    "bad": "node1 slots=x\nnode1 slots=2\nnode2 max_slots=1 slots=3\nnode4 color=red\n",
    "shell": "-x FOO=1 --mca btl tcp 'quoted arg' \"double \\\"x\\\"\" back\\ slash",
}
for name, text in hostfiles.items():
    write("fuzz_hostfile", name, text.encode())

errors = {
    "torchrun": '{"message": {"message": "ValueError: bad batch size", "extraInfo": '
                '{"py_callstack": "Traceback (most recent call last):\\n  File x", "timestamp": "1700000000"}}}',
    "string_message": '{"message": "RuntimeError: boom", "timestamp": 17}',
    "not_json": "Segmentation fault (core dumped)\n",
    "nested": '{"message": {"message": {"message": 1}}, "extraInfo": [1, 2, {"a": null}]}',
    "unicode": '{"message": {"message": "\\u00e9\\ud83d\\ude00 \\u0000"}}',
}
for name, text in errors.items():
    write("fuzz_error_file", name, text.encode())
