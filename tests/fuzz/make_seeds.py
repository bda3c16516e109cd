#!/usr/bin/env python3
"""Writes the seed corpora under tests/fuzz/corpus/ (run from anywhere; idempotent). Requests
are encoded by hand (protobuf wire format) so that no protobuf package is needed."""
import json
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

# ---- Issue 44: what a worker or a peer controls on launch's side, seeded with real output.
SEP = "---- epoch 1 ----\n"
TQDM = ("\r  0%|          | 0/100 [00:00<?, ?it/s]"
        "\r 50%|\u2588\u2588\u2588\u2588\u2588     | 50/100 [00:05<00:05,  9.98it/s]"
        "\r100%|\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588| 100/100 "
        "[00:10<00:00,  9.99it/s]\n").encode()
TRACEBACK = ('Traceback (most recent call last):\n'
             '  File "/src/train.py", line 41, in <module>\n'
             '    main(["--lr", "0.1", "--api-key", "sk-123"])\n'
             '  File "/src/train.py", line 12, in main\n'
             '    raise ValueError("bad batch size: --")\n'
             'ValueError: bad batch size: --\n').encode()
ANSI = b"\x1b[32mINFO\x1b[0m step 7 \x1b[1m----\x1b[0m --api-key=abc \x1b[K\x1b[2J\x1b[31"
BAD_UTF8 = b"\xff\xfe\xc3 caf\xe9 \xe2\x82 --password hunter2 \xf0\x9f\x98"
REPORT = ("=" * 60 + "\ntrain.py FAILED\n" + "-" * 60 + "\nFailures:\n  <NO_OTHER_FAILURES>\n" +
          "-" * 60 + "\nRoot Cause (first observed failure):\n[0]:\n  exitcode  : 3 (pid: 12)\n" +
          "=" * 60 + "\n").encode()

texts = {
    "separators": (SEP + "----\n" + "-" * 60 + "\n---- --- -- -\n").encode(),
    "tqdm": TQDM,
    "traceback": TRACEBACK,
    "ansi": ANSI,
    "invalid_utf8": BAD_UTF8,
    "failure_report": REPORT,
    "command_line": b"\x10launch\0--nproc-per-node=2\0----\0train.py\0--db-password\0x\0"
                    b"--data\0s3://u:pw@bucket/x\0---=y",
    "environment": b"\x30HF_TOKEN=hf_x\nPATH=/usr/bin\nDATABASE_URL=postgres://a:b@h:5/db\n"
                   b"TOKENIZERS_PARALLELISM=false\nMAX_TOKENS=4096\nLATIN1=caf\xe9\n----=----",
    "urls": b"\x40a://b/a://b/ x://u:p@h/ ://@: :// @ https://u:a:b@c@h:1/p?q#f",
}
for name, data in texts.items():
    write("fuzz_mask", name, data)


def output_records(opts, cols, template, records):
    """fuzz_output: options, width, prefix template, then [what][length][bytes] records."""
    out = bytes([opts, cols]) + template + b"\n"
    for what, data in records:
        for i in range(0, max(len(data), 1), 255):
            chunk = data[i:i + 255]
            out += bytes([what, len(chunk)]) + chunk
    return out


OUT, ERR, FILE, STATUS = range(4)
PREFIX = b"[${role_name}${local_rank}]:"
outputs = {
    "tqdm_live": output_records(3, 60, PREFIX, [
        (STATUS, b"ddpl | 1/1 ranks up 3s | step 7"), (ERR, TQDM[:60]), (ERR, TQDM[60:]),
        (OUT, b"---- epoch 1 ----\n"), (STATUS, b""), (ERR, b"\r 99%|\r\n")]),
    "separators": output_records(0, 0, PREFIX, [
        (OUT, SEP.encode() * 3), (ERR, b"----\n"), (OUT, b"-" * 300 + b"\n")]),
    "traceback": output_records(2, 40, b"$rank $$ ${rank}|", [(ERR, TRACEBACK), (FILE, TRACEBACK)]),
    "ansi_utf8": output_records(1, 5, PREFIX, [
        (OUT, ANSI + b"\n"), (ERR, BAD_UTF8 + b"\r" + BAD_UTF8 + b"\n"), (STATUS, BAD_UTF8)]),
    "partial_lines": output_records(7, 20, b"", [
        (OUT, b"half a li"), (OUT, b"ne\r\nCRLF\r\n\r\r\r"), (ERR, b"no newline at the end")]),
    "no_prefix_file": output_records(4, 0, b"${local_rank", [(FILE, b"x" * 600 + b"\n" + SEP.encode())]),
}
for name, data in outputs.items():
    write("fuzz_output", name, data)


def reading(rank, ms, step, waited=0, restore=0, event=0):
    """fuzz_heartbeat: [rank and event][ms][step][waited][restore], little-endian."""
    return struct.pack("<BHQQQ", (rank & 0x1F) | event, ms, step & (2**64 - 1),
                       waited & (2**64 - 1), restore & (2**64 - 1))


U64 = 2**64 - 1
EXIT, GPU, OUTPUT = 0x80, 0x40, 0x20
lockstep = b"".join(reading(r, 100, s, s * 40000 if r != 1 else s * 1000)
                    for s in range(1, 40) for r in range(4))
heartbeats = {
    "lockstep_straggler": bytes([3]) + lockstep,
    "huge_steps": bytes([1]) + b"".join([
        reading(0, 10, 1), reading(1, 10, 1), reading(0, 1, U64, U64), reading(1, 1, U64 - 1, 0),
        reading(0, 0, 2, U64), reading(1, 65535, U64, 1, U64), reading(0, 1, 1 << 63, 1 << 63)]),
    "exits_gpus_output": bytes([2]) + b"".join([
        reading(0, 500, 1, event=GPU), reading(1, 500, 2, event=OUTPUT),
        reading(2, 500, 3, restore=2500000), reading(0, 500, 4, event=EXIT),
        reading(1, 500, 0, event=EXIT | GPU), reading(2, 500, 5, event=EXIT)]),
    "hang_timeout": bytes([4 | (2 << 3)]) + b"".join(
        reading(0, 60000, 0, event=OUTPUT if i % 3 == 0 else 0) for i in range(12)),
}
for name, data in heartbeats.items():
    write("fuzz_heartbeat", name, data)


def row(g, node_rank=1, **extra):
    r = {"node": "n1", "node_rank": node_rank, "global_rank": g, "local_rank": g % 4, "pid": 100 + g,
         "state": "training", "exit_code": None, "step": 10, "steps_per_sec": 2.5,
         "step_ms": 400.0, "wait_ms": 12.5, "cpu_percent": 99.0, "rss_bytes": 1 << 30,
         "gpu_util_percent": 87.0, "gpu_memory_bytes": 1 << 33, "checkpoint_bytes": None,
         "last_line": "---- epoch 1 ----"}
    r.update(extra)
    return r


def rows(*r):
    return json.dumps(list(r)).encode()


dashboards = {
    "separators": rows(row(4), row(5, last_line="----")) + b"\0" + SEP.encode() + REPORT,
    "tqdm_ansi": rows(row(4, last_line=TQDM.decode()), row(6, state="hung", exit_code=3,
                                                          last_line=ANSI.decode("latin-1"))) +
                 b"\0" + TQDM + ANSI,
    "invalid_utf8": rows(row(4, last_line="\ufffd caf\ufffd")) + b"\0" + BAD_UTF8,
    "out_of_range": rows(row(-1), row(2**40, gpu_util_percent=900, step=-5, state="<script>"),
                         row(3, pid="x", last_line=7)) + b"\0" + TRACEBACK,
    "not_rows": b'{"global_rank": 1}\0' + b"[" * 200 + b"\0",
}
for name, data in dashboards.items():
    write("fuzz_dashboard", name, data)

MANIFEST = {
    "manifest_version": 1, "launch_version": "0.1.0", "run_id": "job7",
    "written_at": "2026-12-06T17:00:00Z", "command_line": ["launch", "----", "train.py"],
    "options": {"nnodes": "1:1", "node_rank": 0, "standalone": True, "program": "train.py",
                "program_args": ["--lr", "0.1"]},
    "host": "n1", "cpus": 2, "cwd": "/src", "nnodes": 1, "nproc_per_node": 2, "world_size": 2,
    "environment": {"HF_TOKEN": "<masked>", "LR": "0.1"},
    "gpus": {"driver": "550.54.15", "cuda_driver": "12.4",
             "devices": [{"index": 0, "name": "NVIDIA H100", "uuid": "GPU-1", "capability": "9.0",
                          "memory_bytes": 85899345920}]},
    "python": {"interpreter": "/usr/bin/python3", "torch": "2.9.1", "cuda": "12.8",
               "cudnn": "91000", "nccl": "2.27.3", "arch_list": "sm_90",
               "packages_sha256": "ab" * 32, "packages": 120},
    "git": {"commit": "66ff3c3", "dirty": False},
}
other = json.loads(json.dumps(MANIFEST))
other["gpus"]["driver"] = "535.104.05"
other["environment"]["LR"] = "0.2"
other["git"] = "not a repository"
manifests = {
    "two_runs": json.dumps(MANIFEST).encode() + b"\0" + json.dumps(other).encode(),
    "not_manifests": b"{\0[1, 2]",
    "command_line": b"launch\0--nproc-per-node=2\0----\0train.py\0--api-key=k\0caf\xe9",
    "environment": b"HF_TOKEN=x\nLATIN1=caf\xe9\n----=----\nDB_URL=mysql://u:p@h/d",
}
for name, data in manifests.items():
    write("fuzz_manifest", name, data)

RECORD = json.dumps({"version": 1, "step": 7, "rank": 0, "world_size": 1,
                     "files": [{"path": "model.pt", "size": 5}, {"path": "d/opt.pt", "size": 3}],
                     "bytes": 8, "durable_path": "", "persist": True, "replicated": False,
                     "keep": 2, "time": 1.7e9}).encode()
FILES = b"hello" + b"abc"
replicas = {
    # A peer's requests to the server (first byte even).
    "push": b"\0P" + b"USH %d\n" % len(RECORD) + RECORD + FILES,
    "list": b"\0L" + b"IST 0 1\n",
    "get": b"\0G" + b"ET 0 7\n",
    "push_short": b"\0P" + b"USH %d\n" % len(RECORD) + RECORD + b"he",
    "bad_requests": b"\0B" + b"OGUS\n",
    "push_huge": b"\0P" + b"USH 99999999999999999999\n",
    # A peer's answers to this node's requests (first byte odd; second: even LIST, odd GET).
    "list_answer": b"\1\0" + b"OK 1 2 7 -3 x 99999999999999999999\n",
    "list_refused": b"\1\0" + b"ERR no such rank\n",
    "get_answer": b"\1\1" + b"OK %d\n" % len(RECORD) + RECORD + FILES,
    "get_no_size": b"\1\1" + b"OK\n",
    "get_bad_size": b"\1\1" + b"OK x\n",
    "get_wrong_step": b"\1\1" + b"OK %d\n" % len(RECORD.replace(b'"step": 7', b'"step": 8')) +
                      RECORD.replace(b'"step": 7', b'"step": 8') + FILES,
}
for name, data in replicas.items():
    write("fuzz_replica", name, data)

errors2 = {
    "python_traceback_stderr": TRACEBACK,
    "separators": REPORT,
    "invalid_utf8": b'{"message": {"message": "caf\xe9 ----"}}',
    "ansi_tqdm": TQDM + ANSI,
}
for name, data in errors2.items():
    write("fuzz_error_file", name, data)
