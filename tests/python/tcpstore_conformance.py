"""The agent store against torch's own TCPStore server, through torch's own client.

Run as one worker under launch (tests/integration/agent_store_test.cc): MASTER_ADDR and
MASTER_PORT are the agent's store. The same operations run against it and against a
torch.distributed.TCPStore server (libuv) started here; every result, and every error's type,
must be the same. Prints "CONFORMANCE OK <n> checks" at the end (", <k> skipped: ..." after it
naming the calls an older torch's client lacks, as 2.6's queues), or exits 1 naming the first
difference.
"""
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = timedelta(seconds=30)


def client(host, port, timeout=TIMEOUT):
    return dist.TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=timeout)


def outcome(fn):
    """What an operation gave: its result, or its error's type (messages differ by design)."""
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return ("error", type(e).__name__)


def scenarios(mk):
    """Each yields (name, result) pairs; `mk(timeout)` makes a new client of one server."""
    s = mk(TIMEOUT)
    out = []

    def rec(name, fn, needs=()):
        # A call this torch's client lacks (2.6's has no queues) is no call of its to compare.
        lacking = [n for n in needs if not hasattr(dist.TCPStore, n)]
        out.append((name, ("skipped", lacking) if lacking else outcome(fn)))

    rec("set/get", lambda: (s.set("k", b"v1"), s.get("k"))[1])
    rec("set binary", lambda: (s.set("bin", bytes(range(256)) * 4), s.get("bin"))[1])
    rec("set empty", lambda: (s.set("empty", b""), s.get("empty"))[1])
    rec("set 1 MiB", lambda: len((s.set("big", b"x" * (1 << 20)), s.get("big"))[1]))
    rec("overwrite", lambda: (s.set("k", b"v2"), s.get("k"))[1])
    rec("add new", lambda: s.add("ctr", 5))
    rec("add again", lambda: s.add("ctr", -2))
    rec("add reads as text", lambda: s.get("ctr"))
    rec("compare_set missing, expected empty", lambda: s.compare_set("cs", "", "first"))
    rec("compare_set missing, expected set", lambda: s.compare_set("cs2", "x", "y"))
    rec("cs2 still missing", lambda: s.check(["cs2"]))
    rec("compare_set mismatch", lambda: s.compare_set("cs", "nope", "second"))
    rec("compare_set match", lambda: s.compare_set("cs", "first", "second"))
    rec("check present", lambda: s.check(["k", "ctr"]))
    rec("check mixed", lambda: s.check(["k", "absent"]))
    rec("multi_set/multi_get", lambda: (s.multi_set(["m1", "m2"], [b"a", b"b"]),
                                        s.multi_get(["m2", "m1"]))[1])
    rec("append new", lambda: (s.append("ap", b"ab"), s.get("ap"))[1])
    rec("append more", lambda: (s.append("ap", b"cd"), s.get("ap"))[1])
    rec("delete present", lambda: s.delete_key("m1"))
    rec("delete absent", lambda: s.delete_key("m1"))
    before = s.num_keys()
    rec("num_keys counts sets", lambda: (s.set("nk1", b"1"), s.set("nk2", b"2"),
                                         s.num_keys() - before)[2])
    queues = ("queue_push", "queue_pop", "queue_len")
    rec("queue push/len", lambda: (s.queue_push("q", b"one"), s.queue_push("q", b"two"),
                                   s.queue_len("q"))[2], queues)
    rec("queue pop", lambda: s.queue_pop("q", block=False), queues)
    rec("queue pop 2", lambda: s.queue_pop("q"), queues)
    rec("queue pop empty", lambda: s.queue_pop("q", block=False), queues)
    rec("queue len empty", lambda: s.queue_len("q"), queues)
    rec("queue len missing", lambda: s.queue_len("nosuchqueue"), queues)

    # Timeouts: a wait and a get on a missing key fail after the client's timeout, and the
    # connection goes on serving afterwards.
    short = mk(timedelta(seconds=1))
    rec("wait times out", lambda: short.wait(["never"]))
    rec("get times out", lambda: short.get("never2"))
    rec("wait with explicit timeout", lambda: short.wait(["never3"], timedelta(milliseconds=300)))
    rec("client usable after timeouts", lambda: (short.set("after", b"ok"), short.get("after"))[1])
    rec("blocking queue pop times out", lambda: short.queue_pop("emptyq"), queues)

    # A wait released by another client's set.
    waiter = mk(TIMEOUT)
    got = {}

    def wait_then_get():
        waiter.wait(["late"])
        got["v"] = waiter.get("late")

    t = threading.Thread(target=wait_then_get)
    t.start()
    time.sleep(0.2)
    s.set("late", b"arrived")
    t.join(10)
    rec("wait released by a set", lambda: got.get("v"))

    # Many waiters on one key, each its own connection, all released by one set.
    n = 32
    clients = [mk(TIMEOUT) for _ in range(n)]
    released = []
    lock = threading.Lock()

    def many(c):
        c.wait(["gate"])
        with lock:
            released.append(1)

    threads = [threading.Thread(target=many, args=(c,)) for c in clients]
    for th in threads:
        th.start()
    time.sleep(0.3)
    s.set("gate", b"open")
    for th in threads:
        th.join(10)
    rec("many waiters released", lambda: len(released))

    # compare_set races: every client tries to take the same empty key; exactly one wins.
    wins = []

    def race(c, i):
        v = c.compare_set("race", "", f"client{i}")
        if v == f"client{i}".encode():
            with lock:
                wins.append(i)

    threads = [threading.Thread(target=race, args=(c, i)) for i, c in enumerate(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(10)
    rec("compare_set race winners", lambda: len(wins))

    # add races: the counter ends at the sum.
    threads = [threading.Thread(target=lambda c=c: [c.add("sum", 1) for _ in range(20)])
               for c in clients]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    rec("add race total", lambda: s.add("sum", 0))

    # A blocking queue pop released by a push from another client.
    popped = {}
    if all(hasattr(dist.TCPStore, n) for n in queues):
        popper = mk(TIMEOUT)
        t = threading.Thread(target=lambda: popped.setdefault("v", popper.queue_pop("wq")))
        t.start()
        time.sleep(0.2)
        s.queue_push("wq", b"job")
        t.join(10)
    rec("blocking pop released by a push", lambda: popped.get("v"), queues)
    return out


def main():
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        print("not under launch's agent store: TORCHELASTIC_USE_AGENT_STORE="
              f"{os.environ.get('TORCHELASTIC_USE_AGENT_STORE')}", file=sys.stderr)
        return 1
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    reference = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True,
                              wait_for_workers=False, timeout=TIMEOUT)
    ours = scenarios(lambda t: client(host, port, t))
    theirs = scenarios(lambda t: client("127.0.0.1", reference.port, t))
    bad = 0
    for (name, a), (_, b) in zip(ours, theirs):
        if a != b:
            bad += 1
            print(f"DIFFERENT {name}: agent store {a!r}, torch's server {b!r}", file=sys.stderr)
    if bad or len(ours) != len(theirs):
        return 1
    skipped = [name for name, (kind, _) in ours if kind == "skipped"]
    lacking = sorted({n for _, (kind, what) in ours if kind == "skipped" for n in what})
    print(f"CONFORMANCE OK {len(ours) - len(skipped)} checks"
          + (f", {len(skipped)} skipped: torch {torch.__version__} has no "
             + ", ".join("TCPStore." + n for n in lacking) if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
