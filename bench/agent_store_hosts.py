"""Name lookups for agent_store_bench.py: the run in a private mount namespace whose /etc/hosts
resolves ::ffff:127.0.0.1 (why: the comment below)."""
import os
import shutil
import subprocess
import sys
import tempfile

from agent_store_common import HERE, stop_process

# ---------------------------------------------------------------------------------------------
# Name lookups. torch's TCPStore client connects over IPv6 first (SocketOptions::prefer_ipv6), so
# 127.0.0.1 becomes ::ffff:127.0.0.1, and it formats both ends of every new socket with
# getnameinfo() (socket.cpp, formatSockAddr: SocketImpl's constructor, the "connected" log line)
# before it sends a byte. /etc/hosts knows 127.0.0.1, not ::ffff:127.0.0.1, so each connect asks
# DNS for 1.0.0.127.in-addr.arpa. This VM's resolver drops part of a burst of such queries, and
# a dropped one costs the resolver's 5 s timeout (2 tries: up to 10 s): at 32 and more
# simultaneous clients, "connect" was 5-10 s on either server, the same for both, and nothing
# else was measured. Both sides pay it alike (it is in torch's client), so by default the whole
# run goes into a private mount namespace (unshare -m, root only) where /etc/hosts is a copy
# with "::ffff:127.0.0.1 localhost" added; the machine's /etc/hosts is not touched.
# --no-hosts-fix measures with the machine's resolver as it is.
# ---------------------------------------------------------------------------------------------

NS_ENV = "AGENT_STORE_BENCH_PRIVATE_HOSTS"


def hosts_fix_needed():
    try:
        with open("/etc/hosts") as f:
            for line in f:
                if line.split("#")[0].split()[:1] == ["::ffff:127.0.0.1"]:
                    return False
    except OSError:
        pass
    return True


def run_with_private_hosts(a):
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or not unshare:
        print("note: cannot give this run a private /etc/hosts (needs root and unshare); "
              "torch's client may wait for DNS at each connect (see --no-hosts-fix)", flush=True)
        return None
    tmp = tempfile.mkdtemp(prefix="agent_store_bench_hosts.")
    try:
        hosts = os.path.join(tmp, "hosts")
        with open("/etc/hosts") as f:
            text = f.read()
        with open(hosts, "w") as f:
            f.write(text.rstrip("\n") + "\n::ffff:127.0.0.1 localhost  # agent_store_bench\n")
        cmd = [unshare, "--mount", "--propagation", "private", "sh", "-c",
               'mount --bind "$0" /etc/hosts && exec "$@"', hosts,
               sys.executable, HERE, *sys.argv[1:]]
        print("name lookups: this run sees a private /etc/hosts with '::ffff:127.0.0.1 localhost' "
              "(unshare -m; see --no-hosts-fix)", flush=True)
        budget = (a.child_timeout + 300 + len(a.pg_variants or []) * (a.pg_rounds + 1) * 2
                  * (a.pg_timeout + 30))
        p = subprocess.Popen(cmd, env=dict(os.environ, **{NS_ENV: "1"}))
        try:
            return p.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            stop_process(p, grace=30)
            print(f"FAILED: the run ran past {budget:.0f} s; stopped it", flush=True)
            return 1
        except KeyboardInterrupt:
            stop_process(p, grace=30)
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
