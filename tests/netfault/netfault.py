"""Network-fault harness: hosts in network namespaces on a private bridge, faults as nftables
rules, delay and jitter from a transparent TCP relay, processes with logs and deadlines.

    with Cluster(nodes=3) as cl:            # namespaces <tag>-sw, -srv, -n1..-n3
        srv = cl.spawn("srv", "server", ["rdzv-server", ...])
        f = cl.partition("n3", "srv")       # packets dropped both ways, never rejected
        ...
        cl.heal(f)

Python 3 standard library only. Needs root (ip netns, nft); Skip (exit 77) otherwise.
Everything the cluster made (namespaces, their processes, the relay) is removed on exit, on an
exception, and on SIGTERM/SIGINT; the temp dir too unless NETFAULT_KEEP=1 or the run failed.
Run `python3 netfault.py relay ...` only through Cluster.delay().
"""
import asyncio
import ctypes
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback

SKIP = 77
RELAY_PORT = 39399
RELAY_MARK = 0x4E46  # "NF": the relay's own upstream connections, which nat leaves alone
SO_ORIGINAL_DST = 80
SERVER_HOST = 100  # the server's address is 10.<net>.0.100, etcd member i's 100 + i
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
_TABLE = "inet netfault"
_NAT_TABLE = "ip netfault_nat"
_CMD_TIMEOUT = 20  # every ip/nft call


class Skip(Exception):
    """The harness cannot run here (not root, no namespaces, no nft): exit 77."""


class ScenarioFailure(Exception):
    """An expectation did not hold or a deadline passed."""


class Interrupted(BaseException):
    """SIGTERM or SIGINT: tear down and exit."""


def failure_of(body):
    """Runs body(): (what it returned, "") when it went through, (None, why) when an expectation
    failed (ScenarioFailure) or the harness broke (any other exception: its traceback). Skip and
    Interrupted go on up, to the caller's exit (stop_code)."""
    try:
        return body(), ""
    except ScenarioFailure as e:
        return None, str(e)
    except (Interrupted, Skip):
        raise
    except Exception:
        return None, "harness error:\n" + traceback.format_exc()


def stop_code(e):
    """Says why a run stopped before its end (a Skip or an Interrupted, everything torn down) and
    returns its exit code: SKIP (77) when it cannot run here, 1 when interrupted."""
    if isinstance(e, Skip):
        print(f"SKIP: {e}")
        return SKIP
    print(f"FAIL: interrupted ({e}); everything torn down")
    return 1


def log(msg):
    print(f"[netfault {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _run(argv, input=None, check=True, timeout=_CMD_TIMEOUT):
    try:
        r = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ScenarioFailure(f"{' '.join(argv)} did not finish within {timeout}s") from None
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}"
                           + (f"\ninput:\n{input}" if input else ""))
    return r


def _pdeathsig():
    """In a child before exec: SIGKILL when the harness dies, however it dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    os.setsid()


def tail(path, lines=30):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(text.splitlines()[-lines:])


def wait_until(pred, timeout, what, interval=0.2):
    """pred()'s first truthy value, polling; ScenarioFailure after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise ScenarioFailure(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def stale_namespaces():
    """Namespaces left by harness runs whose process is gone (nf<pid>-*), e.g. after SIGKILL."""
    r = _run(["ip", "netns", "list"], check=False)
    out = []
    for line in r.stdout.splitlines():
        m = re.match(r"(nf(\d+)-\S+)", line)
        if m and not os.path.exists(f"/proc/{m.group(2)}"):
            out.append(m.group(1))
    return out


def _kill_netns(ns, deadline=5.0):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        pids = [int(p) for p in _run(["ip", "netns", "pids", ns], check=False).stdout.split()
                if p.isdigit()]
        if not pids:
            break
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    _run(["ip", "netns", "del", ns], check=False)


class Proc:
    """A process in a namespace with its own log file."""

    def __init__(self, cluster, ns, name, argv, env, log_path):
        self.ns, self.name, self.argv, self.log = ns, name, argv, log_path
        self.started = time.time()
        self._out = open(log_path, "ab", buffering=0)
        self.popen = subprocess.Popen(
            ["ip", "netns", "exec", cluster.ns(ns)] + list(argv), env=env, stdin=subprocess.DEVNULL,
            stdout=self._out, stderr=subprocess.STDOUT, preexec_fn=_pdeathsig, close_fds=True)
        self.pid = self.popen.pid

    def poll(self):
        return self.popen.poll()

    def wait(self, timeout):
        """The exit code, or ScenarioFailure after `timeout` seconds."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ScenarioFailure(f"{self.name} in {self.ns} still running after "
                                  f"{timeout:.0f}s") from None

    def signal(self, sig):
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def text(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def close(self):
        if self.popen.poll() is None:
            self.signal(signal.SIGKILL)
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._out.close()


class Fault:
    def __init__(self, fid, what, rules, t):
        self.id, self.what, self.rules, self.t_start, self.t_end = fid, what, rules, t, None

    def as_dict(self):
        return {"id": self.id, "what": self.what, "t_start": self.t_start, "t_end": self.t_end}


class Cluster:
    """`nodes` node namespaces n1..nN and "srv" on a bridge in a switch namespace.

    Addresses: 10.<net>.0.<i>/24 for node i, 10.<net>.0.100 for srv (ip(name))."""

    def __init__(self, nodes=3, name="netfault", etcd=0):
        self.tag = f"nf{os.getpid()}"
        self.net = 20 + os.getpid() % 200
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)]
        # etcd members e1..eN, each a host of its own (for the etcd backend's scenarios)
        self.etcd = [f"e{i}" for i in range(1, etcd + 1)]
        self.members = self.nodes + ["srv"] + self.etcd
        self.dir = tempfile.mkdtemp(prefix=f"{name}-")
        self.procs = []
        self.faults = []
        self.failed = False
        self._made = []
        self._next_fault = 1
        self._relays = {}
        self._old_handlers = {}

    # ------------------------------------------------------------------ naming
    def ns(self, name):
        return f"{self.tag}-{name}"

    def ip(self, name):
        if name == "srv":
            return f"10.{self.net}.0.{SERVER_HOST}"
        if name.startswith("e"):
            return f"10.{self.net}.0.{SERVER_HOST + int(name[1:])}"
        return f"10.{self.net}.0.{int(name[1:])}"

    # ------------------------------------------------------------------ life cycle
    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            self._check_prereqs()
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, etype, exc, tb):
        if etype is not None and not issubclass(etype, Skip):
            self.failed = True
        self.close()
        return False

    def _on_signal(self, signo, frame):
        raise Interrupted(f"received {signal.Signals(signo).name}")

    def _check_prereqs(self):
        if os.geteuid() != 0:
            raise Skip("needs root (ip netns, nft)")
        if shutil.which("ip") is None:
            raise Skip("iproute2 (ip) is not installed")
        if shutil.which("nft") is None:
            raise Skip("nft is not installed (apt-get install nftables)")
        for ns in stale_namespaces():
            log(f"removing a namespace left by a dead run: {ns}")
            _kill_netns(ns)

    def _build(self):
        sw = self.ns("sw")
        if _run(["ip", "netns", "add", sw], check=False).returncode != 0:
            raise Skip("ip netns add failed (no CAP_SYS_ADMIN or no netns support)")
        self._made.append(sw)
        _run(["ip", "-n", sw, "link", "set", "lo", "up"])
        if _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"], check=False).returncode:
            raise Skip("cannot create a bridge in a namespace")
        _run(["ip", "-n", sw, "link", "set", "br0", "up"])
        for m in self.members:
            ns = self.ns(m)
            _run(["ip", "netns", "add", ns])
            self._made.append(ns)
            port = f"p{m}"
            _run(["ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                  "netns", ns])
            _run(["ip", "-n", sw, "link", "set", port, "master", "br0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.ip(m)}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        # nftables must work in a namespace: load (and drop) an empty table of ours.
        r = _run(["ip", "netns", "exec", self.ns("n1"), "nft", "-f", "-"], check=False,
                 input=f"table {_TABLE} {{\n chain out {{ type filter hook output priority 0;"
                       f" policy accept; }}\n}}\n")
        if r.returncode != 0:
            raise Skip(f"nft cannot load a table in a namespace: {r.stderr.strip()}")
        _run(["ip", "netns", "exec", self.ns("n1"), "nft", "delete", "table"] + _TABLE.split())
        # The links are up once a ping crosses the bridge (bounded).
        r = _run(["ip", "netns", "exec", self.ns("n1"), "ping", "-c", "1", "-W", "5",
                  self.ip("srv")], check=False, timeout=10)
        if r.returncode != 0 and shutil.which("ping"):
            raise RuntimeError(f"n1 cannot ping srv over the bridge: {r.stdout}{r.stderr}")
        log(f"cluster {self.tag}: {', '.join(f'{m}={self.ip(m)}' for m in self.members)}; "
            f"files in {self.dir}")

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.signal(signal.SIGKILL)
        for ns in reversed(self._made):
            _kill_netns(ns)
        for p in self.procs:
            p.close()
        self._made.clear()
        for sig, h in self._old_handlers.items():
            signal.signal(sig, h)
        self._old_handlers.clear()
        if os.path.isdir(self.dir):
            if self.failed or os.environ.get("NETFAULT_KEEP"):
                log(f"kept the run's files in {self.dir}")
            else:
                shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ processes
    def spawn(self, member, name, argv, env=None):
        """argv in `member`'s namespace; env adds to (None removes from) the harness's own."""
        full = dict(os.environ)
        for k, v in (env or {}).items():
            if v is None:
                full.pop(k, None)
            else:
                full[k] = str(v)
        path = os.path.join(self.dir, f"{name}.log")
        p = Proc(self, member, name, argv, full, path)
        self.procs.append(p)
        return p

    def run(self, member, argv, env=None, timeout=60, name=None):
        """Runs argv to its end in `member`'s namespace (bounded); (exit code, output)."""
        p = self.spawn(member, name or f"{member}-cmd{len(self.procs)}", argv, env)
        rc = p.wait(timeout)
        return rc, p.text()

    # ------------------------------------------------------------------ etcd
    def etcd_endpoints(self, first=None):
        """host:port of every etcd member, `first` first (a client starts with it)."""
        order = sorted(self.etcd, key=lambda e: e != first)
        return ",".join(f"{self.ip(e)}:{ETCD_CLIENT_PORT}" for e in order)

    def start_etcd(self, etcd_bin="etcd"):
        """A cluster of the etcd members, each in its namespace; returns once it is healthy.
        Timings as etcd's for a LAN (100 ms heartbeats, elections after 1 s)."""
        if shutil.which(etcd_bin) is None or shutil.which("etcdctl") is None:
            raise Skip("etcd is not installed (make setup installs Debian's etcd-server and "
                       "etcd-client)")
        peers = ",".join(f"{e}=http://{self.ip(e)}:{ETCD_PEER_PORT}" for e in self.etcd)
        for e in self.etcd:
            url = f"http://{self.ip(e)}:{ETCD_CLIENT_PORT}"
            peer = f"http://{self.ip(e)}:{ETCD_PEER_PORT}"
            self.spawn(e, f"etcd-{e}", [
                etcd_bin, "--name", e, "--data-dir", os.path.join(self.dir, f"etcd-{e}"),
                "--listen-client-urls", url, "--advertise-client-urls", url,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", peers, "--initial-cluster-token", self.tag,
                "--heartbeat-interval", "100", "--election-timeout", "1000",
                "--log-level", "warn"])
        wait_until(lambda: self.etcd_leader() is not None, 60, "the etcd cluster to elect a leader")

    def etcd_status(self, via="n1", members=None):
        """{member: (its id, the leader's id as it sees it)} of the members (all by default)
        that answered."""
        out = {}
        for e in members or self.etcd:
            r = _run(["ip", "netns", "exec", self.ns(via), "etcdctl",
                      f"--endpoints=http://{self.ip(e)}:{ETCD_CLIENT_PORT}",
                      "--dial-timeout=1s", "--command-timeout=2s", "endpoint", "status",
                      "-w", "json"], check=False, timeout=10)
            try:
                st = json.loads(r.stdout)[0]["Status"]
                out[e] = (st["header"]["member_id"], st["leader"])
            except (ValueError, LookupError, TypeError):
                pass
        return out

    def etcd_leader(self, via="n1"):
        """The member every answering member agrees leads, or None."""
        st = self.etcd_status(via)
        leaders = {lead for _, lead in st.values()}
        if len(leaders) != 1:
            return None
        lead = leaders.pop()
        return next((e for e, (mid, _) in st.items() if mid == lead), None)

    # ------------------------------------------------------------------ faults (nftables)
    def _apply(self):
        """Each namespace's table from the faults in force: one nft transaction per namespace."""
        per_ns = {m: {"in": [], "out": []} for m in self.members}
        for f in self.faults:
            if f.t_end is None:
                for m, chain, rule in f.rules:
                    per_ns[m][chain].append(f"{rule} comment \"fault {f.id}\"")
        for m, chains in per_ns.items():
            script = f"table {_TABLE}\ndelete table {_TABLE}\n"
            if chains["in"] or chains["out"]:
                script += (f"table {_TABLE} {{\n"
                           f" chain in {{\n  type filter hook input priority 0; policy accept;\n"
                           + "".join(f"  {r}\n" for r in chains["in"]) + " }\n"
                           f" chain out {{\n  type filter hook output priority 0; policy accept;\n"
                           + "".join(f"  {r}\n" for r in chains["out"]) + " }\n}\n")
            _run(["ip", "netns", "exec", self.ns(m), "nft", "-f", "-"], input=script)

    def _fault(self, what, rules):
        f = Fault(self._next_fault, what, rules, time.time())
        self._next_fault += 1
        self.faults.append(f)
        self._apply()
        f.t_start = time.time()
        log(f"fault {f.id}: {what}")
        return f

    def _oneway_rules(self, src, dst):
        return [(src, "out", f"oifname \"eth0\" ip daddr {self.ip(dst)} drop"),
                (dst, "in", f"iifname \"eth0\" ip saddr {self.ip(src)} drop")]

    def partition_oneway(self, src, dst):
        """Packets from src to dst are dropped (dst to src still pass)."""
        return self._fault(f"one-way partition {src} -> {dst}", self._oneway_rules(src, dst))

    def partition(self, a, b):
        """No packet passes between a and b, either way."""
        return self._fault(f"partition {a} <-> {b}",
                           self._oneway_rules(a, b) + self._oneway_rules(b, a))

    def partition_groups(self, what, pairs):
        rules = []
        for a, b in pairs:
            rules += self._oneway_rules(a, b) + self._oneway_rules(b, a)
        return self._fault(what, rules)

    def cut_from_peers(self, node):
        """`node` reaches the server but none of the other nodes."""
        return self.partition_groups(f"{node} cut from its peers (not from the server)",
                                     [(node, o) for o in self.nodes if o != node])

    def cut_from_server(self, node):
        return self.partition_groups(f"{node} cut from the server (not from its peers)",
                                     [(node, "srv")])

    def cut_from_etcd(self, node):
        """`node` reaches none of the etcd members (its peers still)."""
        return self.partition_groups(f"{node} cut from every etcd member (not from its peers)",
                                     [(node, e) for e in self.etcd])

    def isolate(self, member):
        """No packet passes between `member` and any other host (nodes, server, etcd)."""
        return self.partition_groups(f"{member} isolated from every other host",
                                     [(member, o) for o in self.members if o != member])

    def isolate_server(self):
        return self.partition_groups("server isolated from every node",
                                     [("srv", n) for n in self.nodes])

    def loss(self, percent, members=None):
        """Each packet a member sends on eth0 is dropped with probability percent/100 (once per
        hop: a packet between two members crosses one such rule, its sender's)."""
        members = members or self.members
        rules = [(m, "out", f"oifname \"eth0\" numgen random mod 100 < {int(percent)} drop")
                 for m in members]
        return self._fault(f"{percent}% random loss on the links of {', '.join(members)}", rules)

    def heal(self, fault):
        if fault.t_end is None:
            fault.t_end = time.time()
            self._apply()
            fault.t_end = time.time()
            log(f"healed fault {fault.id} ({fault.what}) after "
                f"{fault.t_end - fault.t_start:.1f}s")

    def heal_all(self):
        for f in self.faults:
            if f.t_end is None:
                self.heal(f)

    def ruleset(self, member):
        return _run(["ip", "netns", "exec", self.ns(member), "nft", "list", "ruleset"],
                    check=False).stdout

    # ------------------------------------------------------------------ delay (relay or netem)
    def netem_available(self):
        r = _run(["ip", "netns", "exec", self.ns("sw"), "tc", "qdisc", "add", "dev", "lo", "root",
                  "netem", "delay", "1ms"], check=False)
        if r.returncode == 0:
            _run(["ip", "netns", "exec", self.ns("sw"), "tc", "qdisc", "del", "dev", "lo", "root"],
                 check=False)
        return r.returncode == 0

    def delay(self, delay_ms, jitter_ms, members=None, use_netem=None):
        """Every TCP connection a member opens to another member has each direction delayed by
        delay_ms +- jitter_ms (uniform), in order. netem where the kernel has it (and
        use_netem is not False), else a transparent relay in each member's namespace."""
        members = members or self.nodes
        if use_netem is None:
            use_netem = self.netem_available()
        if use_netem:
            for m in members:
                _run(["ip", "netns", "exec", self.ns(m), "tc", "qdisc", "add", "dev", "eth0",
                      "root", "netem", "delay", f"{delay_ms}ms", f"{jitter_ms}ms"])
            log(f"netem delay {delay_ms}ms +- {jitter_ms}ms on {', '.join(members)}")
            return "netem"
        for m in members:
            own = self.ip(m)
            p = self.spawn(m, f"relay-{m}", [sys.executable, os.path.abspath(__file__), "relay",
                                             "--port", str(RELAY_PORT),
                                             "--delay-ms", str(delay_ms),
                                             "--jitter-ms", str(jitter_ms),
                                             "--mark", str(RELAY_MARK)])
            self._relays[m] = p
            wait_until(lambda: "listening" in p.text() or p.poll() is not None, 20,
                       f"the relay in {m} to listen")
            if p.poll() is not None:
                raise RuntimeError(f"the relay in {m} exited: {tail(p.log)}")
            script = (f"table {_NAT_TABLE} {{\n chain out {{\n"
                      f"  type nat hook output priority -100; policy accept;\n"
                      f"  meta l4proto tcp meta mark != {RELAY_MARK} ip daddr 10.{self.net}.0.0/24"
                      f" ip daddr != {own} redirect to :{RELAY_PORT}\n }}\n}}\n")
            _run(["ip", "netns", "exec", self.ns(m), "nft", "-f", "-"], input=script)
        log(f"relay delay {delay_ms}ms +- {jitter_ms}ms on the TCP that "
            f"{', '.join(members)} open")
        return "relay"

    def undelay(self):
        for m, p in list(self._relays.items()):
            _run(["ip", "netns", "exec", self.ns(m), "nft", "delete", "table"] +
                 _NAT_TABLE.split(), check=False)
            p.signal(signal.SIGTERM)
        self._relays.clear()


# ---------------------------------------------------------------------- the relay
class _Relay:
    """Transparent TCP relay: the original destination from SO_ORIGINAL_DST, upstream with
    SO_MARK (so that nat leaves it alone), each chunk released at max(previous release,
    arrival + delay + uniform(-jitter, +jitter)): TCP order is kept. Bounded: max_conns
    connections, at most `queue` chunks of 64 KiB waiting per direction."""

    CHUNK = 64 * 1024

    def __init__(self, delay, jitter, mark, max_conns=256, queue=32):
        self.delay, self.jitter, self.mark = delay, jitter, mark
        self.max_conns, self.queue = max_conns, queue
        self.conns = 0

    async def handle(self, reader, writer):
        sock = writer.get_extra_info("socket")
        if self.conns >= self.max_conns:
            writer.transport.abort()
            return
        self.conns += 1
        up_writer = None
        try:
            raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
            port, packed = struct.unpack_from("!2xH4s", raw)
            host = socket.inet_ntoa(packed)
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, self.mark)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
            try:
                await asyncio.wait_for(asyncio.get_running_loop().sock_connect(s, (host, port)),
                                       timeout=30)
            except BaseException:
                s.close()
                raise
            up_reader, up_writer = await asyncio.open_connection(sock=s)
            await asyncio.gather(self.pump(reader, up_writer), self.pump(up_reader, writer))
            for w in (writer, up_writer):
                w.close()
        except Exception:
            # Upstream refused or unreachable: a reset, the nearest a relay that has already
            # accepted can come to "connection refused".
            for w in (writer, up_writer):
                if w is not None:
                    try:
                        w.get_extra_info("socket").setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    except (OSError, AttributeError):
                        pass
                    w.transport.abort()
        finally:
            self.conns -= 1

    async def pump(self, reader, writer):
        """reader's bytes to writer, each chunk held until its release time."""
        q = asyncio.Queue(self.queue)
        loop = asyncio.get_running_loop()

        async def read():
            last = 0.0
            while True:
                try:
                    data = await reader.read(self.CHUNK)
                except Exception:
                    data = None
                now = loop.time()
                last = max(last, now + self.delay + random.uniform(-self.jitter, self.jitter))
                await q.put((last, data))  # waits while the queue is full: backpressure
                if not data:
                    return

        reading = asyncio.ensure_future(read())
        try:
            while True:
                release, data = await q.get()
                wait = release - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if data is None:
                    writer.transport.abort()
                    return
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
        except Exception:
            writer.transport.abort()
        finally:
            reading.cancel()


def _relay_main(args):
    import argparse
    ap = argparse.ArgumentParser(prog="netfault.py relay")
    ap.add_argument("--port", type=int, default=RELAY_PORT)
    ap.add_argument("--delay-ms", type=float, required=True)
    ap.add_argument("--jitter-ms", type=float, default=0)
    ap.add_argument("--mark", type=int, default=RELAY_MARK)
    ap.add_argument("--max-conns", type=int, default=256)
    a = ap.parse_args(args)
    relay = _Relay(a.delay_ms / 1000, a.jitter_ms / 1000, a.mark, a.max_conns)

    async def main():
        server = await asyncio.start_server(relay.handle, "0.0.0.0", a.port, backlog=128)
        print(f"relay listening on :{a.port}, delay {a.delay_ms}ms +- {a.jitter_ms}ms",
              flush=True)
        async with server:
            await server.serve_forever()

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    asyncio.run(main())


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "relay":
        _relay_main(sys.argv[2:])
    else:
        print(__doc__)
