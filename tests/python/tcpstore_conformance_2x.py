"""The job's store as PyTorch's own store tests use it, from every rank, then a Gloo group.

Run with two or more ranks under launch or torchrun (both host the job's store in the agent:
TORCHELASTIC_USE_AGENT_STORE=True). Every rank connects to MASTER_ADDR:MASTER_PORT as a plain
TCPStore client and runs ten checks modelled on test/distributed/test_store.py (set/get,
compare_set, add, wait with its timeout, num_keys/delete_key, check, many clients at once,
append/multi_get/multi_set, and the calls new since torch 2.9: list_keys and barrier); a check
whose call the running torch lacks is skipped with the reason. Then the ranks form a Gloo
process group through the same store and train a few steps of DDP.

Prints per rank "CHECK <name> PASS|FAIL|SKIP ..." lines, then
"STORE CHECKS rank=R passed=P/T skipped=S torch=V" and "TRAINED rank=R ...";
exits 1 if a check failed.
"""
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = timedelta(seconds=60)


def client(timeout=TIMEOUT):
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         is_master=False, wait_for_workers=False, timeout=timeout)


class Job:
    def __init__(self):
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        # A run's own keys: torchrun's store outlives nothing, launch's neither, but two runs
        # of this script against one long-lived store must not read each other's.
        self.run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
        self.store = client()

    def key(self, name):
        return f"conformance/{self.run}/{name}"

    def sync(self, tag):
        """Every rank got here (set and wait only, so that it needs no call under test)."""
        self.store.set(self.key(f"sync/{tag}/{self.rank}"), b"1")
        self.store.wait([self.key(f"sync/{tag}/{r}") for r in range(self.world)])


def expect(what, got, want):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def raises(what, fn, exc=Exception):
    try:
        fn()
    except exc as e:  # noqa: BLE001 - the check is that it raised at all
        return e
    raise AssertionError(f"{what}: did not raise")


# ---- the checks: each takes the job, raises AssertionError on a difference ---------------

def check_set_get(job):
    s, k = job.store, job.key(f"sg/{job.rank}")
    s.set(k, b"value")
    expect("get", s.get(k), b"value")
    s.set(k, "overwritten")
    expect("get after overwrite", s.get(k), b"overwritten")
    blob = bytes(range(256)) * 64
    s.set(k + "/bin", blob)
    expect("binary value", s.get(k + "/bin"), blob)
    s.set(k + "/empty", b"")
    expect("empty value", s.get(k + "/empty"), b"")


def check_compare_set(job):
    s, k = job.store, job.key(f"cs/{job.rank}")
    # test_store.py's test_compare_set: a missing key with an expected value answers it and
    # stays missing; with an empty one it is created.
    expect("missing, expected set", s.compare_set(k, "0", "2"), b"0")
    expect("still missing", s.check([k]), False)
    expect("missing, expected empty", s.compare_set(k, "", "first"), b"first")
    expect("mismatch", s.compare_set(k, "nope", "second"), b"first")
    expect("match", s.compare_set(k, "first", "second"), b"second")
    expect("value", s.get(k), b"second")


def check_add(job):
    s, k = job.store, job.key(f"add/{job.rank}")
    expect("add new", s.add(k, 5), 5)
    expect("add again", s.add(k, -2), 3)
    expect("add 0", s.add(k, 0), 3)
    expect("reads as text", s.get(k), b"3")
    # Every rank adds to one counter: it ends at the sum.
    shared = job.key("add/shared")
    for _ in range(10):
        s.add(shared, 1)
    job.sync("add")
    expect("shared counter", s.add(shared, 0), 10 * job.world)


def check_wait(job):
    s = job.store
    # Released by another rank's set: every rank waits for the next rank's key.
    nxt = (job.rank + 1) % job.world
    s.set(job.key(f"wait/{job.rank}"), b"here")
    s.wait([job.key(f"wait/{nxt}")], timedelta(seconds=30))
    expect("value after wait", s.get(job.key(f"wait/{nxt}")), b"here")
    # A wait and a get on keys that never come fail after their timeout, and the client
    # goes on serving afterwards.
    short = client(timedelta(seconds=1))
    t0 = time.monotonic()
    raises("wait on a missing key", lambda: short.wait([job.key("wait/never")],
                                                       timedelta(milliseconds=300)))
    took = time.monotonic() - t0
    if not 0.25 <= took < 5:
        raise AssertionError(f"wait(300ms) on a missing key took {took:.2f}s")
    raises("get on a missing key", lambda: short.get(job.key("wait/never2")))
    short.set(job.key(f"wait/after/{job.rank}"), b"ok")
    expect("usable after timeouts", short.get(job.key(f"wait/after/{job.rank}")), b"ok")


def check_num_keys_delete_key(job):
    s = job.store
    # num_keys counts the whole store, which every rank writes: rank 0 counts while the others
    # wait for its word, writing nothing meanwhile.
    job.sync("nk-start")
    done = job.key("nk/done")
    if job.rank != 0:
        s.wait([done], timedelta(seconds=30))
        expect("rank 0 counted", s.get(done), b"ok")
        return
    try:
        before = s.num_keys()
        for i in range(3):
            s.set(job.key(f"nk/{i}"), b"x")
        expect("three more keys", s.num_keys() - before, 3)
        expect("delete present", s.delete_key(job.key("nk/1")), True)
        expect("delete absent", s.delete_key(job.key("nk/1")), False)
        expect("one fewer", s.num_keys() - before, 2)
        expect("deleted key missing", s.check([job.key("nk/1")]), False)
        s.set(done, b"ok")
    except Exception:
        s.set(done, b"rank 0 failed")
        raise


def check_check(job):
    s, k = job.store, job.key(f"check/{job.rank}")
    s.set(k, b"1")
    expect("present", s.check([k]), True)
    expect("missing", s.check([k + "/absent"]), False)
    expect("mixed", s.check([k, k + "/absent"]), False)
    s.set(k + "/two", b"2")
    expect("both", s.check([k, k + "/two"]), True)


def check_many_clients(job):
    # test_store.py's multi-worker tests: clients of their own, on threads of every rank,
    # add to one counter and wait for one key at once.
    n, adds = 8, 20
    counter, gate = job.key("mc/counter"), job.key("mc/gate")
    clients = [client() for _ in range(n)]
    errors = []

    def worker(c):
        try:
            for _ in range(adds):
                c.add(counter, 1)
            c.wait([gate])
            expect("gate", c.get(gate), b"open")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    if job.rank == 0:
        total = n * adds * job.world
        deadline = time.monotonic() + 60
        while job.store.add(counter, 0) < total and time.monotonic() < deadline:
            time.sleep(0.01)
        job.store.set(gate, b"open")
    for t in threads:
        t.join(60)
    if errors or any(t.is_alive() for t in threads):
        raise AssertionError(f"clients: {errors or 'still waiting after 60s'}")
    expect("counter", job.store.add(counter, 0), n * adds * job.world)


def check_extended(job):
    s, k = job.store, job.key(f"ext/{job.rank}")
    s.append(k + "/ap", b"po")
    s.append(k + "/ap", b"tato")
    expect("append", s.get(k + "/ap"), b"potato")
    s.multi_set([k + "/m1", k + "/m2"], [b"one", b"two"])
    expect("multi_get", s.multi_get([k + "/m2", k + "/m1"]), [b"two", b"one"])
    expect("extended api", s.has_extended_api(), True)


def check_list_keys(job):
    mine = dist.PrefixStore(job.key(f"lk/{job.rank}"), job.store)
    expect("empty", mine.list_keys(), [])
    names = ["a", "b/c", "d"]
    for n in names:
        mine.set(n, n)
    expect("keys", sorted(mine.list_keys()), names)
    mine.delete_key("b/c")
    expect("after delete", sorted(mine.list_keys()), ["a", "d"])
    everything = job.store.list_keys()
    full = job.key(f"lk/{job.rank}") + "/a"
    if full not in everything:
        raise AssertionError(f"{full!r} not in the whole store's {len(everything)} keys")


def check_barrier(job):
    s = job.store
    # Every rank at once: no rank leaves before the last arrives.
    for i in range(3):
        k = job.key(f"barrier/{i}")
        s.barrier(k, job.world, timedelta(seconds=30))
        if int(s.get(k)) < job.world:
            raise AssertionError(f"left barrier {i} with {s.get(k)!r} of {job.world} arrived")
    # One more rank than there are: it times out (the client cancels), and the client goes on.
    lonely = job.key(f"barrier/lonely/{job.rank}")
    raises("barrier short of ranks",
           lambda: s.barrier(lonely, 2, timedelta(milliseconds=300)))
    expect("counted", s.get(lonely), b"1")
    s.set(job.key(f"barrier/after/{job.rank}"), b"ok")
    expect("usable after", s.get(job.key(f"barrier/after/{job.rank}")), b"ok")


CHECKS = [
    ("set/get", check_set_get, None),
    ("compare_set", check_compare_set, None),
    ("add", check_add, None),
    ("wait", check_wait, None),
    ("num_keys/delete_key", check_num_keys_delete_key, None),
    ("check", check_check, None),
    ("many clients", check_many_clients, None),
    ("append/multi_get/multi_set", check_extended, None),
    ("list_keys", check_list_keys, "list_keys"),
    ("barrier", check_barrier, "barrier"),
]


def train(job):
    dist.init_process_group("gloo", timeout=TIMEOUT)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    for _ in range(5):
        x = torch.randn(16, 8, generator=g)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    w = model.module.weight.detach().clone()
    gathered = [torch.zeros_like(w) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, w)
    same = all(torch.equal(w, o) for o in gathered)
    dist.destroy_process_group()
    return same, float(loss.detach())


def main():
    job = Job()
    passed = failed = skipped = 0
    for name, fn, needs in CHECKS:
        if needs and not hasattr(dist.Store, needs):
            print(f"CHECK {name} SKIP rank={job.rank}: torch {torch.__version__} has no "
                  f"Store.{needs}", flush=True)
            skipped += 1
            job.sync(f"after {name}")
            continue
        try:
            fn(job)
            print(f"CHECK {name} PASS rank={job.rank}", flush=True)
            passed += 1
        except Exception as e:  # noqa: BLE001 - every check runs and reports
            print(f"CHECK {name} FAIL rank={job.rank}: {type(e).__name__}: {e}", flush=True)
            failed += 1
            # The connection may be gone (an unknown query ends it): go on with a new one.
            job.store = client()
        job.sync(f"after {name}")
    ran = passed + failed
    print(f"STORE CHECKS rank={job.rank} passed={passed}/{ran} skipped={skipped} "
          f"torch={torch.__version__}", flush=True)
    same, loss = train(job)
    print(f"TRAINED rank={job.rank} replicas_equal={same} loss={loss:.4f}", flush=True)
    return 0 if failed == 0 and same else 1


if __name__ == "__main__":
    # Leaves without the interpreter's finalization, after flushing, as tests/python/ddp_gloo.py
    # does and for its reason: a Gloo worker thread may still free the last collective's tensors
    # and abort a rank that has finished ("terminate called without an active exception", seen
    # once here with torch 2.15; pytorch/pytorch#190489).
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
