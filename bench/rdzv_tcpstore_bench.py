"""The NCCL-bootstrap store pattern against the pinned torch's TCPStore (libuv server).

Mirrors bench/rdzv_store_bench.cc: every client, every round, sets its key, adds to a
shared counter, gets its right neighbour's key and waits for its left neighbour's. The
master store lives in this process, clients are threads (TCPStore calls release the GIL),
each with its own connection.

    .venv/bin/python bench/rdzv_tcpstore_bench.py --clients 64 --rounds 200
"""
import argparse
import threading
import time
from datetime import timedelta

import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--value-bytes", type=int, default=128)
    p.add_argument("--add-only", action="store_true",
                   help="every operation an add: the round-trip floor (bench/grpc_floor_bench.cc)")
    a = p.parse_args()
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True,
                           timeout=timedelta(seconds=60), wait_for_workers=False)
    stores = [dist.TCPStore("127.0.0.1", master.port, is_master=False,
                            timeout=timedelta(seconds=60)) for _ in range(a.clients)]
    value = b"\xab" * a.value_bytes
    lat = [[] for _ in range(a.clients)]
    barrier = threading.Barrier(a.clients + 1)
    n = a.clients

    def client(c):
        s, out = stores[c], lat[c]
        clk = time.perf_counter
        barrier.wait()
        if a.add_only:
            for _ in range(a.rounds):
                t = clk(); s.add("bench/n", 1); out.append(clk() - t)
            return
        for r in range(a.rounds):
            base = f"bench/r{r}/"
            t = clk(); s.set(base + str(c), value); out.append(clk() - t)
            t = clk(); s.add(base + "n", 1); out.append(clk() - t)
            t = clk(); s.get(base + str((c + 1) % n)); out.append(clk() - t)
            t = clk(); s.wait([base + str((c + n - 1) % n)]); out.append(clk() - t)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    secs = time.perf_counter() - t0
    allv = sorted(x for l in lat for x in l)
    pct = lambda q: allv[min(len(allv) - 1, int(q * len(allv)))] * 1e6
    print(f"impl=tcpstore clients={n} rounds={a.rounds} ops={len(allv)} secs={secs:.3f} "
          f"ops_per_s={len(allv) / secs:.0f} p50_us={pct(0.5):.0f} p99_us={pct(0.99):.0f}",
          flush=True)


if __name__ == "__main__":
    main()
