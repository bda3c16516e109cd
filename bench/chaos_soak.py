"""Chaos soak (issue 48): faults of every kind at random on a 3-node Gloo DDP job, and one figure,
the effective training time ratio (ETTR): time spent on steps that were kept / wall time.

    sudo .venv/bin/python bench/chaos_soak.py --build build --minutes 20 [--interval 60]
         [--seed 1] [--backend c10d|etcd] [--faults worker_kill,node_cut,...] [--json out.json]
         [--reference torchrun] [--plan]

The hosts are the network-fault harness's (tests/netfault/netfault.py): n1..n3 and the
rendezvous server in network namespaces on a bridge (--backend etcd: a 3-member etcd cluster,
e1..e3, a host each, instead of the server). One `launch` per node (the c10d backend on
rdzv-server, heartbeat window 9 s, or the etcd backend on the etcd members, lease TTL 9 s, each
node's endpoint list starting with another member; the agent-hosted store, memory checkpoints
with peer replicas every step, persisted to disk every 10, `--prewarm=torch`) runs
bench/chaos_train.py, whose workers log every step themselves. Every --interval seconds a fault
drawn from a random.Random(seed) hits the job (the same seed, the same kinds and victims, in
the same order, on either backend: etcd_leader_kill is drawn where c10d draws rdzv_kill):

  worker_kill   a random node's worker SIGKILLed
  worker_hang   a random node's worker SIGSTOPped (the others' collective times out)
  node_kill     a whole node SIGKILLed (agent, template, workers; its memory root removed, as a
                lost machine's memory is) and started again 20 s later
  node_cut      a node cut from every other host (nftables, packets dropped) for 20 s
  rdzv_kill     the rendezvous host killed: rdzv-server SIGKILLed and started again 2 s later
                (this harness's rendezvous is hosted by rdzv-server, not by an agent; its state
                is in memory, so the job re-forms from round 0 of a new epoch); c10d only
  etcd_leader_kill  etcd's leader (the member every answering member names) SIGKILLed and
                started again 2 s later on its data directory, so that it re-joins as a
                follower; etcd only. The job may not notice more than a broken watch or
                keep-alive stream that its client resumes on another member: then the
                incident has no detect, stop or re-form, 0 steps recomputed, and counts as
                recovered once the same group steps past where it was. Its own figures: when
                the other members named a new leader (between new_leader_after_s and
                new_leader_s: the soak polls them with etcdctl), when the killed member
                answered again with the three agreeing on a leader (etcd_whole_s), and the
                agents' first etcd line after the kill (etcd_noticed_s)
  ckpt_full     the checkpoint directory (a tmpfs of its own) full for 20 s
  straggler     one worker throttled to a third of a core for 60 s (cgroup v1 cpu quota)

A fault waits while a node is still down or cut from an earlier one (so that the job always has
its minimum of 2 nodes), or an etcd member is still down (so that etcd keeps its quorum), and is
logged with the seconds it waited. --plan prints the draw and exits (no hosts, no root).

At the end every rank is told to stop at one step (CHAOS_STOP) and the figures are taken from
the workers' events (bench/chaos_analysis.py): ETTR, kept and recomputed steps, and per incident
its kind and phases (detect, stop, re-form, restore source, steps recomputed, back to the pre-fault
step), with the harness's invariants (tests/netfault/invariants.py) and the soak's own (one
attempt training at a time, no step kept twice, every kept step from 1 to the last).

--reference torchrun (with --backend c10d): the same draws on torchrun's own c10d rendezvous,
hosted by n1's agent, the workers' rank 0 torch.saving latest.pt every --disk-every steps and
every rank loading it (as a torchrun job does); only the kinds torchrun can survive are injected
(worker_kill, worker_hang, straggler, ckpt_full, node_kill of a node other than n1), the other
draws are skipped in place so that a seed gives launch's sequence. A torchrun job whose agent
dies ends the run there: the rest of the run counts as lost.

Figures and what they say: docs/benchmarks.md, "Chaos soak".

Exit 0 when the run completed (figures printed), 1 when the harness failed, 77 when it cannot
run here (not root, no namespaces, no nft). --check adds the test's assertions (ETTR floor, no
violation, every incident recovered): exit 1 when one fails.
"""
import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "netfault"))
import invariants as inv  # noqa: E402
from chaos_analysis import (NODE_DOWN_S, analyze, attempt_key, attempts,  # noqa: E402,F401
                            cut_node_figures, kept_steps, table)
from netfault import (Cluster, Interrupted, ScenarioFailure, Skip, _run, failure_of,  # noqa: E402
                      log, stop_code, tail, wait_until)

PORT = 29400
# The server's heartbeat window, or etcd's lease TTL (s): node-level incidents are detected
# within 2W/3 on either backend.
WINDOW = 9
KINDS = ("worker_kill", "worker_hang", "node_kill", "node_cut", "rdzv_kill", "ckpt_full",
         "straggler")
# The rendezvous host's fault of each backend. The etcd backend draws from KINDS with its own in
# rdzv_kill's place: the same seed draws the same sequence (kind by kind, victim by victim).
RDZV_FAULT = {"c10d": "rdzv_kill", "etcd": "etcd_leader_kill"}
ETCD_RESTART_S = 2  # etcd_leader_kill starts the killed member again this long after
ETCD_WATCH_S = 30  # how long the soak watches etcd name a new leader and the member re-join
TORCHRUN_KINDS = ("worker_kill", "worker_hang", "node_kill", "ckpt_full", "straggler")
THROTTLE_S = 60
CKPT_FS_BYTES = 64 << 20
CGROUP_CPU = "/sys/fs/cgroup/cpu"


def backend_kinds(backend):
    """Every kind the soak injects on `backend`, in KINDS's order."""
    return tuple(RDZV_FAULT[backend] if k == "rdzv_kill" else k for k in KINDS)


def draw(seed, kinds, minutes, interval, n_nodes):
    """The faults of a run: [(kind, victim index)], one every `interval` seconds for `minutes`,
    from random.Random(seed) alone: the same arguments, the same plan."""
    rng = random.Random(seed)
    n_faults = max(0, int((minutes * 60 - 1e-9) // interval))
    return [(rng.choice(kinds), rng.randrange(n_nodes)) for _ in range(n_faults)]


def plan_line(args, plan):
    return (f"soak: {args.minutes} min, a fault every {args.interval}s, seed {args.seed}: "
            f"{', '.join(k for k, _ in plan)}")


# ---------------------------------------------------------------------- the run
class JobDied(Exception):
    """The reference job's agent exited during the soak: the job is gone (torchrun has no way
    back from it); the rest of the run counts as lost."""


class Soak:
    def __init__(self, cl, args):
        self.cl, self.args = cl, args
        self.reference = args.reference
        self.backend = args.backend
        self.events_dir = os.path.join(cl.dir, "events")
        self.ckpt_dir = os.path.join(cl.dir, "ckpt")
        self.stop_file = os.path.join(cl.dir, "stop")
        os.makedirs(self.events_dir)
        os.makedirs(self.ckpt_dir)
        self.mounted = False
        self.server = None
        self.agents = {}  # node -> its current launch (or torchrun) process
        self.agent_pids = {}
        self.retired = []  # processes the soak itself killed
        self.down = set()  # nodes killed or cut, until the action that restores them
        self.etcd_down = set()  # etcd members killed, until they are started again
        self.etcd_procs = {}  # etcd member -> its current process
        self.watchers = []  # threads watching etcd after a leader kill
        self.watch_stop = threading.Event()  # set at the end: the watchers return
        self.pending = []  # (time, what, callable)
        self.cgroups = []
        self.faults = []
        self.planned = 0
        self.died = None
        self.t0 = time.time()
        self.env = {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1",
                    "NETFAULT_EVENTS": self.events_dir, "CKPT_DIR": self.ckpt_dir,
                    "CHAOS_STOP": self.stop_file, "STEP_SECONDS": args.step_seconds,
                    "PG_TIMEOUT": args.pg_timeout,
                    "CKPT_EVERY": args.disk_every if self.reference else 1,
                    "PERSIST_EVERY": 1 if self.reference else 10,
                    # torchrun: torch.save to the shared directory, as its users do (each
                    # agent counts its own restarts there, so a store-based agreement of the
                    # workers cannot rely on one attempt prefix)
                    "CKPT_MODE": "torch" if self.reference else "ddplaunch",
                    "PYTHONPATH": os.path.join(ROOT, "python"), "PYTHON_EXEC": args.python,
                    "PET_NNODES": None, "PET_RDZV_ENDPOINT": None, "DDPL_RDZV_TOKEN": None,
                    "TORCHELASTIC_RUN_ID": None}

    # -------------------------------------------------------------- processes
    def mount_ckpt_fs(self):
        """The durable checkpoint directory on a tmpfs of its own, so that ckpt_full fills it
        and nothing else."""
        r = _run(["mount", "-t", "tmpfs", "-o", f"size={CKPT_FS_BYTES},mode=0755", "tmpfs",
                  self.ckpt_dir], check=False)
        if r.returncode != 0:
            raise Skip(f"cannot mount a tmpfs for the checkpoint directory: {r.stderr.strip()}")
        self.mounted = True

    def start(self):
        self.mount_ckpt_fs()
        if self.backend == "etcd":
            self.cl.start_etcd()  # the rendezvous endpoint, as the server is for c10d
            self.etcd_procs = {p.ns: p for p in self.cl.procs if p.name.startswith("etcd-")}
        elif not self.reference:
            self.start_server()
        for n in self.cl.nodes:
            self.start_agent(n)
            time.sleep(0.3)

    def start_server(self):
        cl = self.cl
        argv = [os.path.join(self.args.build, "bin", "rdzv-server"), "--host", "0.0.0.0",
                "--port", str(PORT), "--heartbeat-window", str(WINDOW)]
        self.server = cl.spawn("srv", f"server-{len(cl.procs)}", argv)
        wait_until(lambda: self.server.poll() is not None or f":{PORT} " in subprocess.run(
            ["ip", "netns", "exec", cl.ns("srv"), "ss", "-Hltn"], capture_output=True,
            text=True, timeout=10).stdout, 20, "rdzv-server to listen")
        if self.server.poll() is not None:
            raise ScenarioFailure(f"rdzv-server exited: {tail(self.server.log)}")

    def agent_argv(self, n):
        cl, a = self.cl, self.args
        train = os.path.join(HERE, "chaos_train.py")
        if self.reference == "torchrun":
            # n1's agent hosts the TCPStore of torchrun's c10d rendezvous (the namespaces share
            # one host name, so torchrun is told which node hosts it).
            return [a.python, "-m", "torch.distributed.run", "--nnodes=2:3",
                    "--nproc-per-node=1", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint={cl.ip('n1')}:{PORT}", "--rdzv-id=chaos",
                    "--max-restarts=100", f"--local-addr={cl.ip(n)}",
                    "--rdzv-conf=join_timeout=60,last_call_timeout=2,is_host="
                    + ("1" if n == "n1" else "0"), "--monitor-interval=0.1", train]
        if self.backend == "etcd":
            # As tests/netfault/scenarios.py: each node starts with another member, so that
            # some node talks to the leader; the lease TTL is the server's window.
            endpoint = cl.etcd_endpoints(first=cl.etcd[cl.nodes.index(n) % len(cl.etcd)])
            conf = f",lease_ttl={WINDOW}"
        else:
            endpoint, conf = f"{cl.ip('srv')}:{PORT}", ""
        return [os.path.join(a.build, "bin", "launch"), "--nnodes=2:3", "--nproc-per-node=1",
                f"--rdzv-backend={self.backend}", f"--rdzv-endpoint={endpoint}",
                "--rdzv-id=chaos", "--max-restarts=100", f"--local-addr={cl.ip(n)}",
                "--rdzv-conf=join_timeout=60,last_call_timeout=2" + conf,
                "--checkpoint-memory=64M", "--checkpoint-memory-keep=2", "--prewarm=torch",
                "--shutdown-timeout=3",
                f"--hang-timeout={a.hang_timeout}",
                "--monitor=off", train]  # run by PYTHON_EXEC: what --prewarm forks

    def start_agent(self, n):
        count = sum(1 for p in self.cl.procs if p.name.startswith(f"agent-{n}"))
        p = self.cl.spawn(n, f"agent-{n}-{count}", self.agent_argv(n),
                          dict(self.env, NETFAULT_NODE=n))
        self.agents[n] = p
        self.down.discard(n)
        log(f"started the agent of {n} (pid {p.pid})")

    def events(self):
        return inv.load_events(self.events_dir)

    def worker_pid(self, node):
        """The newest live worker of `node` (from its own events), or None."""
        ev = [e for e in self.events() if e.get("node") == node and e.get("event") != "exit"]
        for e in reversed(ev):
            pid = e.get("pid")
            try:
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    return pid
            except (OSError, IndexError, TypeError):
                continue
        return None

    def whole(self):
        """Every node steps in the newest attempt: the job is back to its full size."""
        atts = attempts(self.events())
        stepped = [k for k, a in atts.items() if a["steps"]]
        if not stepped:
            return False
        k = stepped[-1]
        nodes = {e.get("node") for e in self.events()
                 if e.get("event") == "step" and attempt_key(e) == k}
        return nodes >= set(self.cl.nodes)

    def max_step(self, events=None):
        return max([e.get("step") or 0 for e in (events or self.events())
                    if e.get("event") == "step"] or [0])

    # -------------------------------------------------------------- faults
    def later(self, delay, what, fn):
        self.pending.append((time.time() + delay, what, fn))

    def run_pending(self, force=False):
        now = time.time()
        due = [p for p in self.pending if force or p[0] <= now]
        self.pending = [p for p in self.pending if p not in due]
        for _, what, fn in sorted(due, key=lambda p: p[0]):
            try:
                fn()
            except Exception as e:  # an undo that fails is reported, the soak goes on
                log(f"undoing {what} failed: {e}")

    def pending_nodes(self):
        return len(self.healthy()) < len(self.cl.nodes) or bool(self.etcd_down)

    def wait_whole(self, limit):
        try:
            wait_until(lambda: (self.run_pending() or self.check_agents() or True)
                       and self.whole(), limit, "every node back in the group", interval=0.5)
        except ScenarioFailure as e:
            log(f"{e}: going on")

    def healthy(self):
        return [n for n in self.cl.nodes if n not in self.down]

    def pick_node(self, idx):
        """The node the RNG drew, or the next one that is up."""
        nodes = self.cl.nodes
        for i in range(len(nodes)):
            n = nodes[(idx + i) % len(nodes)]
            if n not in self.down:
                return n
        return None

    def inject(self, kind, idx):
        """Injects one fault; returns its record (victim, what was done)."""
        cl = self.cl
        node = self.pick_node(idx)
        rec = {"kind": kind, "t": time.time(), "victim": node}
        if kind in ("worker_kill", "worker_hang", "straggler"):
            pid = self.worker_pid(node)
            if pid is None:
                rec["skipped"] = f"no live worker on {node}"
                return rec
            rec["pid"] = pid
            if kind == "worker_kill":
                os.kill(pid, signal.SIGKILL)
            elif kind == "worker_hang":
                os.kill(pid, signal.SIGSTOP)
            else:
                self.throttle(pid, rec)
        elif kind == "node_kill":
            if self.reference == "torchrun" and node == "n1":
                node = self.pick_node(1)  # n1 hosts torchrun's rendezvous: not survivable
                rec["victim"] = node
            self.kill_node(node)
            self.down.add(node)
            self.later(NODE_DOWN_S, f"restarting {node}", lambda n=node: self.start_agent(n))
        elif kind == "node_cut":
            rec["agent_log"] = self.agents[node].log
            f = cl.isolate(node)
            self.down.add(node)

            def heal(f=f, n=node):
                cl.heal(f)
                self.down.discard(n)
            self.later(NODE_DOWN_S, f"healing {node}", heal)
        elif kind == "rdzv_kill":
            rec["victim"] = "srv"
            self.server.signal(signal.SIGKILL)
            self.server.wait(10)
            self.later(2, "restarting rdzv-server", self.start_server)
        elif kind == "etcd_leader_kill":
            self.kill_etcd_leader(rec)
        elif kind == "ckpt_full":
            rec["victim"] = "ckpt dir"
            filler = os.path.join(self.ckpt_dir, "chaos-filler")
            st = os.statvfs(self.ckpt_dir)
            free = st.f_bavail * st.f_frsize
            with open(filler, "wb") as fh:
                try:
                    os.posix_fallocate(fh.fileno(), 0, free)
                except OSError:
                    pass
            rec["filled_bytes"] = free
            self.later(NODE_DOWN_S, "freeing the checkpoint directory",
                       lambda p=filler: os.unlink(p))
        else:
            raise ValueError(kind)
        return rec

    def kill_etcd_leader(self, rec):
        """SIGKILL to etcd's leader, started again ETCD_RESTART_S later on its data directory; a
        thread records when the others named a new leader and when the three agreed again."""
        cl = self.cl
        via = self.healthy()[0]  # etcdctl runs in a node's namespace
        leader = cl.etcd_leader(via)
        if leader is None:
            rec["victim"] = "etcd"
            rec["skipped"] = "etcd's members do not agree on a leader"
            return
        rec["victim"] = leader
        rec["agent_logs"] = [p.log for p in self.agents.values()]
        p = self.etcd_procs[leader]
        rec["t"] = t = time.time()
        p.signal(signal.SIGKILL)
        p.wait(10)
        self.etcd_down.add(leader)

        def restart(e=leader):
            old = self.etcd_procs[e]
            self.etcd_procs[e] = cl.spawn(e, old.name, old.argv)  # its log goes on
            self.etcd_down.discard(e)
            log(f"started etcd member {e} again (pid {self.etcd_procs[e].pid})")
        self.later(ETCD_RESTART_S, f"restarting etcd member {leader}", restart)

        def status(members):
            """etcd_status of `members`, each asked at once (an etcdctl run takes 0.1-0.5 s
            here: one after the other would blur the election this times)."""
            out = {}
            ths = [threading.Thread(target=lambda e=e: out.update(cl.etcd_status(via, [e])))
                   for e in members]
            for th in ths:
                th.start()
            for th in ths:
                th.join()
            return out

        def watch():
            deadline = t + ETCD_WATCH_S
            prev_start = t
            while (time.time() < deadline and "etcd_whole_s" not in rec
                   and not self.watch_stop.is_set()):
                # The survivors only while the killed member is down: asking it costs etcdctl's
                # dial timeout (1 s).
                down = leader in self.etcd_down
                start = time.time()
                st = status([e for e in cl.etcd if not (down and e == leader)])
                leads = {lead for _, lead in st.values()}
                lead = next((e for e, (mid, _) in st.items() if leads == {mid}), None)
                now = time.time()
                if lead is not None and "new_leader_s" not in rec:
                    # Named after the last poll without one began, before this one ended.
                    rec["new_leader"], rec["new_leader_s"] = lead, round(now - t, 2)
                    rec["new_leader_after_s"] = round(prev_start - t, 2)
                if lead is not None and len(st) == len(cl.etcd):
                    rec["etcd_whole_s"] = round(now - t, 2)
                prev_start = start
                self.watch_stop.wait(0.1)
        th = threading.Thread(target=watch, name=f"etcd-watch-{leader}", daemon=True)
        th.start()
        self.watchers.append(th)

    def kill_node(self, node):
        """SIGKILL to everything in the node's namespace; its memory root goes with it."""
        pids = [int(p) for p in _run(["ip", "netns", "pids", self.cl.ns(node)],
                                     check=False).stdout.split() if p.isdigit()]
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        old = self.agents.get(node)
        if old is not None:
            self.retired.append(old)
            for d in glob.glob(f"/dev/shm/ddpl-ckpt-{old.pid}-*"):
                shutil.rmtree(d, ignore_errors=True)

    def throttle(self, pid, rec):
        """pid into a cgroup of a third of a core for THROTTLE_S seconds."""
        cg = os.path.join(CGROUP_CPU, f"chaos-{os.getpid()}-{len(self.cgroups)}")
        os.mkdir(cg)
        self.cgroups.append(cg)
        with open(os.path.join(cg, "cpu.cfs_period_us"), "w") as f:
            f.write("100000")
        with open(os.path.join(cg, "cpu.cfs_quota_us"), "w") as f:
            f.write("33333")
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(pid))
        rec["cgroup"] = cg

        def undo(cg=cg, pid=pid):
            try:
                with open(os.path.join(CGROUP_CPU, "cgroup.procs"), "w") as f:
                    f.write(str(pid))
            except OSError:
                pass  # gone already
            self.rm_cgroup(cg)
        self.later(THROTTLE_S, f"unthrottling {pid}", undo)

    def rm_cgroup(self, cg):
        try:
            with open(os.path.join(cg, "cgroup.procs")) as f:
                left = f.read().split()
            for p in left:
                with open(os.path.join(CGROUP_CPU, "cgroup.procs"), "w") as f:
                    f.write(p)
            os.rmdir(cg)
        except OSError:
            pass

    def cleanup(self):
        self.run_pending(force=True)
        self.watch_stop.set()
        for th in self.watchers:
            th.join(ETCD_WATCH_S + 15)
        for cg in self.cgroups:
            self.rm_cgroup(cg)
        if self.mounted:
            _run(["umount", "-l", self.ckpt_dir], check=False)
            self.mounted = False

    # -------------------------------------------------------------- the soak
    def check_agents(self):
        dead = {n: p.poll() for n, p in self.agents.items()
                if p.poll() is not None and p not in self.retired and n not in self.down}
        if dead and self.reference:
            raise JobDied(f"agent(s) exited during the soak: {dead}")
        if dead:
            raise ScenarioFailure(f"agent(s) exited during the soak: {dead}")

    def run(self, minutes, interval, kinds):
        try:
            return self._run(minutes, interval, kinds)
        except JobDied as e:
            now = time.time()
            self.died = {"t": now, "why": str(e)}
            log(f"the {self.reference} job died: {e}; the rest of the run counts as lost")
            for p in self.agents.values():
                p.signal(signal.SIGKILL)
            return self.t0, max(now, self.t0 + minutes * 60), {
                n: p.poll() for n, p in self.agents.items()}

    def _run(self, minutes, interval, kinds):
        self.start()
        wait_until(lambda: (self.check_agents() or True) and self.max_step() >= 3, 240,
                   "the job's first steps")
        t0 = self.t0 = time.time()
        end = t0 + minutes * 60
        plan = draw(self.args.seed, kinds, minutes, interval, len(self.cl.nodes))
        self.planned = len(plan)
        log(plan_line(self.args, plan))
        for i, (kind, idx) in enumerate(plan):
            due = t0 + (i + 1) * interval
            while time.time() < due or self.pending_nodes():
                self.run_pending()
                self.check_agents()
                time.sleep(0.2)
            # A node killed or cut by an earlier fault is back in the group first (bounded):
            # the job keeps its minimum of 2 nodes, and each incident is one fault's.
            self.wait_whole(interval)
            if self.reference and kind not in TORCHRUN_KINDS:
                rec = {"kind": kind, "t": time.time(), "victim": None,
                       "skipped": "torchrun does not survive it (left out of its run)"}
            else:
                rec = self.inject(kind, idx)
            rec["waited_s"] = round(rec["t"] - due, 1)
            log(f"fault {i + 1}/{len(plan)} at {rec['t'] - t0:.0f}s: {kind} on {rec['victim']}"
                + (f" (skipped: {rec['skipped']})" if rec.get("skipped") else ""))
            self.faults.append(rec)
        # The last fault's undo, then its recovery (a step past where the job was), then the end.
        while time.time() < end or self.pending:
            self.run_pending()
            self.check_agents()
            time.sleep(0.2)
        if self.faults:
            pre = max([e.get("step") or 0 for e in self.events()
                       if e.get("event") == "step" and e["t"] <= self.faults[-1]["t"]] or [0])
            try:
                wait_until(lambda: self.max_step() > pre, 90, "the job past its last fault")
            except ScenarioFailure as e:
                log(f"{e}")
        self.wait_whole(90)  # a node that stops while one re-joins leaves it waiting
        stop = self.max_step() + 5
        with open(self.stop_file + ".tmp", "w") as f:
            f.write(str(stop))
        os.replace(self.stop_file + ".tmp", self.stop_file)
        t_stop = time.time()
        log(f"stopping every rank at step {stop}")
        rcs = {}
        deadline = time.monotonic() + 120
        for n, p in self.agents.items():
            try:
                rcs[n] = p.wait(max(1, deadline - time.monotonic()))
            except ScenarioFailure:
                rcs[n] = None
        return t0, t_stop, rcs

    def tails(self, lines=20):
        out = [f"--- {p.name} ({p.log}):\n{tail(p.log, lines)}" for p in self.agents.values()]
        if self.server:
            out.append(f"--- rdzv-server:\n{tail(self.server.log, 10)}")
        for e, p in self.etcd_procs.items():
            out.append(f"--- etcd {e}:\n{tail(p.log, 10)}")
        return "\n".join(out)


def _commit():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return ""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="build directory (bin/launch, bin/rdzv-server)")
    ap.add_argument("--python", default=os.path.join(ROOT, ".venv", "bin", "python"),
                    help="python with torch for the workers")
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--interval", type=float, default=60, help="seconds between faults")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--backend", choices=tuple(RDZV_FAULT), default="c10d",
                    help="launch's rendezvous: c10d on rdzv-server, or etcd on a 3-member etcd "
                         "cluster")
    ap.add_argument("--faults",
                    help=f"comma-separated subset of {','.join(backend_kinds('c10d'))} (c10d, "
                         f"the default) or {','.join(backend_kinds('etcd'))} (etcd)")
    ap.add_argument("--plan", action="store_true",
                    help="print the faults the seed draws and exit")
    ap.add_argument("--reference", choices=("torchrun",),
                    help="run the same faults against torchrun (disk checkpoints)")
    ap.add_argument("--disk-every", type=int, default=10,
                    help="torchrun's checkpoint interval in steps (--reference torchrun)")
    ap.add_argument("--step-seconds", type=float, default=0.15)
    ap.add_argument("--pg-timeout", type=float, default=8)
    ap.add_argument("--hang-timeout", type=float, default=3,
                    help="launch's --hang-timeout: a rank without a step this long is hung")
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--check", action="store_true",
                    help="fail (exit 1) on a violation, an unrecovered incident or ETTR under "
                         "--min-ettr")
    ap.add_argument("--min-ettr", type=float, default=0.6)
    args = ap.parse_args(argv)
    args.build = os.path.abspath(args.build)
    known = backend_kinds(args.backend)
    kinds = ([k.strip() for k in args.faults.split(",") if k.strip()] if args.faults
             else list(known))
    bad = [k for k in kinds if k not in known]
    if bad:
        ap.error(f"unknown fault kind(s) {bad} for --backend {args.backend}; known: "
                 f"{', '.join(known)}")
    if args.reference and args.backend != "c10d":
        ap.error("--reference torchrun runs torchrun's own c10d rendezvous: --backend c10d only")
    if args.plan:
        print(plan_line(args, draw(args.seed, kinds, args.minutes, args.interval, 3)))
        return 0
    if args.reference == "torchrun":
        dropped = [k for k in kinds if k not in TORCHRUN_KINDS]
        if dropped:  # drawn all the same, so that a seed gives launch's sequence
            log(f"torchrun cannot survive {', '.join(dropped)} here: those draws are skipped")
    elif not all(os.access(os.path.join(args.build, "bin", b), os.X_OK)
                 for b in ("launch", "rdzv-server")):
        print(f"FAIL: {args.build}/bin/launch or rdzv-server is missing: build them first")
        return 1
    start = time.time()
    cl = Cluster(nodes=3, name="chaos-soak", etcd=3 if args.backend == "etcd" else 0)
    soak = None
    try:
        with cl:
            soak = Soak(cl, args)
            try:
                ran, why = failure_of(lambda: soak.run(args.minutes, args.interval, kinds))
            finally:
                soak.cleanup()
            if why:
                cl.failed = True
                print(soak.tails())
                print(f"FAIL: {why}")
                return 1
            t0, t_stop, rcs = ran
            res = analyze(soak.events(), [f for f in soak.faults if not f.get("skipped")],
                          t_stop)
    except (Skip, Interrupted) as e:
        return stop_code(e)
    res.update({"t0": t0, "planned_faults": soak.planned, "launcher": args.reference or "launch",
                "backend": args.backend, "seed": args.seed,
                "minutes": args.minutes, "interval_s": args.interval, "kinds": kinds,
                "agents_exit": rcs,
                "skipped_faults": [f for f in soak.faults if f.get("skipped")],
                "job_died": soak.died,
                "commit": _commit(), "duration_s": round(time.time() - start, 1),
                "command": " ".join([os.path.basename(sys.argv[0])] + (argv or sys.argv[1:]))})
    print(f"\n== chaos soak ({res['launcher']}, {args.backend} rendezvous, seed {args.seed}, "
          f"{args.minutes} min, a fault every {args.interval:.0f}s, commit {res['commit']})")
    print(table(res))
    print(f"ETTR {res['ettr']:.3f}: {res['kept_s']}s on {res['steps_kept']} kept steps of "
          f"{res['wall_s']}s wall ({res['steps_recomputed']} steps recomputed, {res['attempts']} "
          f"attempts, median step {res['median_step_s']}s)")
    if soak.died:
        print(f"THE JOB DIED {soak.died['t'] - t0:.0f}s into the soak ({soak.died['why']}): the "
              f"faults after it were not injected, and the time to the soak's end counts as lost")
    print(f"invariant violations: {len(res['violations'])}")
    for k, m in res["violations"]:
        print(f"   VIOLATION {k}: {m}")
    for f in res["skipped_faults"]:
        print(f"   skipped fault: {f['kind']}: {f['skipped']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    if not args.check:
        return 0
    failed = []
    if res["violations"]:
        failed.append(f"{len(res['violations'])} invariant violation(s)")
    lost = [f"{f['kind']} at {f['t'] - t0:.0f}s" for f in res["incidents"] if not f["recovered"]]
    if lost:
        failed.append(f"incident(s) not recovered before the next fault: {', '.join(lost)}")
    if len(res["incidents"]) < res["planned_faults"]:
        failed.append(f"only {len(res['incidents'])} of {res['planned_faults']} fault(s) "
                      f"injected")
    # The fence: 2W/3 after the last answered heartbeat (etcd: keep-alive), so at most 2W/3 after
    # the cut; 1 s for a loaded machine's scheduling. Past W the server may let a round form
    # without the node (etcd: its lease expires).
    late = [f"{f['t'] - t0:.0f}s: fenced after {f['fence_s']}s" for f in res["incidents"]
            if f["kind"] == "node_cut" and (f.get("fence_s") is None
                                            or f["fence_s"] > 2 * WINDOW / 3 + 1)]
    if late:
        failed.append(f"a cut node did not fence within {2 * WINDOW / 3 + 1:.0f}s "
                      f"(2/3 of the {WINDOW}s window or lease TTL + 1s): {', '.join(late)}")
    # And its workers gone before the others may form a round without it: W after its last
    # answered heartbeat, so at most W after the cut (the fence fires at 2W/3 and SIGKILLs what
    # is left W/6 later, whatever stop was under way: tests/integration/multinode_test.cc,
    # AFenceCutsShortAStopThatAHangBegan).
    alive = [f"{f['t'] - t0:.0f}s: gone after {f.get('cut_workers_gone_s')}s"
             for f in res["incidents"]
             if f["kind"] == "node_cut" and (f.get("cut_workers_gone_s") is None
                                             or f["cut_workers_gone_s"] >= WINDOW)]
    if alive:
        failed.append(f"a cut node's workers were not all gone within the {WINDOW}s window "
                      f"of the cut: {', '.join(alive)}")
    if res["ettr"] < args.min_ettr:
        failed.append(f"ETTR {res['ettr']:.3f} under the floor {args.min_ettr}")
    if any(rc != 0 for rc in rcs.values()):
        failed.append(f"agents' exit codes {rcs}")
    if failed:
        print("FAIL: " + "; ".join(failed))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
