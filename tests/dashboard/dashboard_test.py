#!/usr/bin/env python3
"""launch --dashboard on a real job (issue 32, docs/monitoring.md): a 4-rank job with one slow
rank and, on its first attempt, one hung rank; the page's data over HTTP (rows, states, series
that grow, events, the hang's stacks, stacks on demand behind the token, log tails), the page
itself in headless Chromium where it is installed (its screenshot is docs/monitoring.png's
source), and the token rule for requests from another address.

    python3 tests/dashboard/dashboard_test.py build/bin [DashboardTest.test_name ...]
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/bin")
JOB = os.path.join(HERE, "job.py")


def http(url, method="GET", token=None, timeout=5):
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_for(what, pred, timeout=60, every=0.2):
    end = time.time() + timeout
    last = None
    while time.time() < end:
        last = pred()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Job:
    def __init__(self, flags, env):
        self.log = tempfile.NamedTemporaryFile(prefix="ddpl-dash-", suffix=".log", delete=False)
        e = dict(os.environ, PYTHON_EXEC=sys.executable, OMP_NUM_THREADS="1", **env)
        self.proc = subprocess.Popen([os.path.join(BIN, "launch")] + flags + [JOB],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=e,
                                     start_new_session=True)

    def output(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def dashboard(self):
        m = wait_for("launch to print the dashboard's address", lambda: re.search(
            r"dashboard of the job on (http://[^/]+/) .* token in (\S+)\)", self.output()), 30)
        with open(m.group(2)) as f:
            token = f.read().strip()
        st = os.stat(m.group(2))
        assert st.st_mode & 0o077 == 0, f"{m.group(2)} is readable by others: {oct(st.st_mode)}"
        return m.group(1), token

    def wait(self, timeout=120):
        return self.proc.wait(timeout)

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if os.path.exists(self.log.name):
            os.unlink(self.log.name)


def other_address():
    """An IPv4 address of this machine that is not loopback, or None."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for m in re.finditer(r"inet (\d+\.\d+\.\d+\.\d+)/", out):
        if not m.group(1).startswith("127."):
            return m.group(1)
    return None


class Browser:
    """The page in headless Chromium, driven by Selenium (Debian's chromium and chromedriver,
    which `make setup` installs); without them, `why_not` says so and the page's checks are left
    out (its data are still checked over HTTP), and the test ends skipped, never passed."""

    def __init__(self, url):
        self.driver = None
        self.why_not = None
        try:
            from selenium import webdriver
            from selenium.webdriver.chrome.service import Service
        except ImportError as e:
            self.why_not = f"no selenium ({e})"
            return
        chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
        if not chromium or not chromedriver:
            self.why_not = "no chromium/chromedriver in PATH"
            return
        opts = webdriver.ChromeOptions()
        opts.binary_location = chromium
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--window-size=1400,1100"):
            opts.add_argument(a)
        self.driver = webdriver.Chrome(service=Service(chromedriver), options=opts)
        self.driver.set_page_load_timeout(30)
        self.driver.get(url)

    def _wait(self, what, pred, timeout=60):
        if not self.driver:
            return None
        return wait_for(f"the page to show {what}", pred, timeout)

    def rows(self):
        return self.driver.execute_script("""
            return [...document.querySelectorAll('#ranks tr')].map(tr => ({
              rank: tr.children[1].textContent, state: tr.children[3].textContent,
              line: tr.children[13].textContent}));""")

    def wait_rows(self, n, pred):
        return self._wait(f"{n} rows", lambda: (lambda rows: rows if len(rows) == n and
                                                pred(rows) else None)(self.rows()))

    def text(self, element_id):
        if not self.driver:
            return ""
        return self.driver.execute_script(
            f"return document.getElementById('{element_id}').textContent")

    def wait_text(self, element_id, want):
        return self._wait(f"'{want}' in #{element_id}", lambda: want in self.text(element_id))

    def samples(self):
        """Points in the page's plots so far (0 without a browser)."""
        if not self.driver:
            return 0
        return self.driver.execute_script("return D && D.series ? D.series.t.length : 0")

    def click(self, element_id):
        self.driver.find_element("id", element_id).click()

    def screenshot(self, path):
        if self.driver:
            self.driver.save_screenshot(path)

    def close(self):
        if self.driver:
            self.driver.quit()
            self.driver = None


class DashboardTest(unittest.TestCase):
    def test_a_job_with_a_straggler_a_hang_and_a_restart(self):
        job = Job(["--nproc-per-node=4", "--max-restarts=1", "--monitor-interval=0.05",
                   "--hang-timeout=3", "--dashboard"],
                  {"SECONDS": "32", "STEP_SECONDS": "0.05", "SLOW_RANK": "1", "SLOW_FACTOR": "2",
                   "HANG_RANK": "3", "HANG_AT": "15"})
        try:
            url = self.check_job(job)
            # An open page (one reading every 0.3 s) gets the end: the state and the summary.
            last = {}
            live_incidents = []  # the incident table as the page had it while the job ran

            def page():
                while job.proc.poll() is None:
                    try:
                        d = json.loads(http(url + "api/job", timeout=2)[1])
                        last.update(d)
                        if d.get("incidents") and d.get("job", {}).get("state") == "training":
                            live_incidents.append(d["incidents"])
                    except OSError:
                        pass
                    time.sleep(0.3)
            reader = threading.Thread(target=page)
            reader.start()
            rc = job.wait(120)
            reader.join()
            self.assertEqual(rc, 0, job.output()[-3000:])
            self.assertEqual(last["job"]["state"], "finished")
            self.assertIn("per-rank summary", last["summary"] or "")
            # Issue 48: where each lost second went, live once the restarted group stepped,
            # and at the end; the hang named by its ranks (rank 3's, and those waiting for it
            # in a collective: a node's hang is every rank that stopped stepping).
            self.assertTrue(live_incidents, job.output()[-3000:])
            self.assertIn("where each lost second went", live_incidents[-1])
            self.assertRegex(last["incidents"] or "", r"hang: ranks? [0-9,]*\b3\b[0-9, +more]* made "
                             r"no step")
            self.assertRegex(last["incidents"], r"totals: 1 incident, [0-9.]+s lost")
        finally:
            job.stop()
        if self.page_not_driven:
            self.skipTest(f"the page was not driven in a browser ({self.page_not_driven}); "
                          "its data were checked over HTTP (make setup installs chromium, "
                          "chromium-driver and selenium)")

    def check_job(self, job):
        url, token = job.dashboard()
        status, page = http(url)
        self.assertEqual(status, 200)
        self.assertIn("<canvas", page)
        browser = Browser(url + "#token=" + token)
        self.page_not_driven = browser.why_not

        def api():
            s, body = http(url + "api/job")
            self.assertEqual(s, 200, body)
            return json.loads(body)

        try:
            j = wait_for("4 ranks training", lambda: (lambda d: d if len(d["ranks"]) == 4 and
                                                      d["job"]["state"] == "training"
                                                      else None)(api()), 90)
            self.assertEqual(sorted(r["global_rank"] for r in j["ranks"]), [0, 1, 2, 3])
            browser.wait_rows(4, lambda rows: all(r["state"] == "training" for r in rows))
            grown = browser.samples()
            # Rank 3 stops stepping, the others wait for it in the all_reduce: the group is
            # found hung (--hang-timeout=3) and its stacks are on the page.
            j = wait_for("the hang's stacks", lambda: (lambda d: d if d["stacks"] and
                                                       d["stacks"]["reason"] == "hang"
                                                       else None)(api()), 60)
            self.assertIn("rank 3", j["stacks"]["text"])
            self.assertIn("hang", [e["kind"] for e in j["events"]])
            if browser.wait_text("stmeta", "reason: hang"):
                self.assertIn("rank 3", browser.text("stpre"))
            # The group restarts; the same open page goes on with the new attempt.
            j = wait_for("the restart", lambda: (lambda d: d if d["job"]["attempt"] == 1 and
                                                 d["job"]["state"] == "training" else None)(api()),
                         90)
            self.assertIn("restart", [e["kind"] for e in j["events"]])
            self.assertEqual(j["job"]["restarts_used"], 1)
            # Rank 1 works twice as long: named a straggler (3 windows of 5 s), while the
            # others wait for it in the collective, some 50 ms a step. The waits shown are the
            # mean over the last readings: under load a descheduled fast rank makes the
            # straggler wait too, for a reading or two, so the page must show the difference
            # while rank 1 is straggling, not in the very reading that first names it.
            def rank(d, r):
                return next((x for x in d["ranks"] if x["global_rank"] == r), {})

            def straggling_and_waited_for(d):
                slow, fast = rank(d, 1), rank(d, 0)
                return d if (slow.get("state") == "straggling" and
                             fast.get("wait_ms") is not None and
                             slow.get("wait_ms") is not None and
                             fast["wait_ms"] > slow["wait_ms"] + 10) else None
            j = wait_for("rank 1 straggling, rank 0 waiting for it 10 ms a step more than it",
                         lambda: straggling_and_waited_for(api()), 90)
            self.assertNotIn("straggling", [r["state"] for r in j["ranks"]
                                            if r["global_rank"] != 1])
            fast = rank(j, 0)
            self.assertIn("not html", fast["last_line"])
            rows = browser.wait_rows(4, lambda rows: [r for r in rows if r["rank"] == "1" and
                                                      r["state"] == "straggling"])
            if rows:
                self.assertIn("<b>not html</b>", rows[0]["line"], "worker output shown as text")
                self.assertGreater(browser.samples(), grown, "the plots' series grew")
                self.assertIn("restart", browser.text("events"))
                self.assertIn("hang: rank", browser.text("incpre"), "the incident table")
            # Log tails.
            s, body = http(url + "api/logs?rank=2")
            self.assertEqual(s, 200)
            self.assertTrue(any("rank 2 attempt" in l for l in json.loads(body)["lines"]), body)
            # Stacks on demand: refused without the token, even from loopback; taken with it
            # from the page's button (over HTTP where there is no browser).
            s, body = http(url + "api/stacks", "POST")
            self.assertEqual(s, 401, body)
            self.assertIn("token", body)
            if browser.driver:
                browser.click("cap")
            else:
                self.assertEqual(http(url + "api/stacks", "POST", token)[0], 202)
            j = wait_for("stacks on demand", lambda: (lambda d: d if d["stacks"]["reason"] ==
                                                      "on demand" else None)(api()), 60)
            self.assertIn("rank 0", j["stacks"]["text"])
            browser.wait_text("stmeta", "reason: on demand")
            shot = os.environ.get("DDPL_DASHBOARD_SCREENSHOT")
            if shot:
                browser.screenshot(shot)
        finally:
            browser.close()
        return url

    def test_two_nodes_on_one_page(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server_log = tempfile.NamedTemporaryFile(prefix="ddpl-dash-srv-", delete=False)
        server = subprocess.Popen([os.path.join(BIN, "rdzv-server"), "--host", "127.0.0.1",
                                   "--port", str(port), "--dashboard"], stdout=server_log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        nodes = []

        def server_address():
            with open(server_log.name) as f:
                return re.search(r"dashboard of every job on (http://\S+/) ", f.read())
        try:
            # Listening before the agents come: an agent that finds no server at the endpoint
            # on its own host would host the job's store there itself.
            m = wait_for("rdzv-server to listen", server_address, 30)
            common = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                      f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=dash{port}",
                      "--monitor-interval=0.05"]
            env = {"SECONDS": "40", "STEP_SECONDS": "0.05"}
            # The same command line on both nodes, as usual: each serves a page of the job.
            nodes.append(Job(common + ["--dashboard"], env))
            nodes.append(Job(common + ["--dashboard"], env))
            url, _ = nodes[0].dashboard()

            def both():
                s, body = http(url + "api/job")
                d = json.loads(body) if s == 200 else {"ranks": []}
                ranks = [r for r in d["ranks"] if r["state"] == "training"]
                return d if len(ranks) == 4 else None
            d = wait_for("4 ranks of 2 nodes on one page", both, 60)
            self.assertEqual(sorted(r["global_rank"] for r in d["ranks"]), [0, 1, 2, 3])
            self.assertEqual(sorted({r["node_rank"] for r in d["ranks"]}), [0, 1])
            self.assertEqual(d["job"]["nodes"], 2)
            self.assertEqual(len(d["series"]["step_ms"]), 4, "every node's ranks plotted")
            # rdzv-server's page of every job it hosts: the list, this job's page and data.
            jobs_url, run = m.group(1), f"dash{port}"
            status, listing = http(jobs_url)
            self.assertEqual(status, 200)
            self.assertIn(f'href="job/{run}/"', listing)

            def served():
                s, body = http(f"{jobs_url}job/{run}/api/job")
                d = json.loads(body) if s == 200 else {"ranks": []}
                return d if len(d["ranks"]) == 4 else None
            d = wait_for("the job's 4 ranks on rdzv-server's page", served, 30)
            self.assertEqual(d["job"]["nodes"], 2)
            self.assertEqual(sorted({r["node_rank"] for r in d["ranks"]}), [0, 1])
            status, page = http(f"{jobs_url}job/{run}/")
            self.assertEqual(status, 200)
            self.assertIn("<canvas", page)
            self.assertEqual(http(f"{jobs_url}job/nosuch/api/job")[0], 404)
            self.assertEqual(http(f"{jobs_url}job/{run}/api/logs?rank=0")[0], 404)
        finally:
            for n in nodes:
                n.stop()
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(30)
            os.unlink(server_log.name)

    def test_another_address_needs_the_token(self):
        address = other_address()
        if not address and not os.environ.get("DDPL_DASHBOARD_NETNS"):
            # A machine with loopback alone: root makes the address in a network namespace of
            # the test's own (on its lo, which needs no kernel module) and runs this test there.
            self.in_own_network_namespace("test_another_address_needs_the_token")
            return
        if not address:
            self.skipTest("no IPv4 address but loopback, even in the test's own namespace")
        job = Job(["--nproc-per-node=1", "--dashboard=0.0.0.0:0"],
                  {"SECONDS": "60", "STEP_SECONDS": "0.05"})
        try:
            url, token = job.dashboard()
            port = url.rstrip("/").rsplit(":", 1)[1]
            remote = f"http://{address}:{port}/"
            for path in ("", "api/job", "api/logs?rank=0"):
                s, body = http(remote + path)
                self.assertEqual(s, 403, f"{path}: {body}")
            self.assertEqual(http(remote + "api/job", token=token)[0], 200)
            self.assertEqual(http(remote + "api/job", token=token + "x")[0], 403)
            self.assertEqual(http(url + "api/job")[0], 200)
        finally:
            job.stop()

    def in_own_network_namespace(self, test):
        if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
            self.skipTest("this machine has no IPv4 address but loopback, and only root (with "
                          "unshare and ip) could make one in a network namespace")
        setup = "ip link set lo up && ip addr add 10.254.0.1/32 dev lo"
        probe = subprocess.run(["unshare", "--net", "sh", "-c", setup], capture_output=True,
                               text=True, timeout=30)
        if probe.returncode != 0:
            self.skipTest("this machine has no IPv4 address but loopback, and no network "
                          f"namespace with one could be made: {probe.stderr.strip()}")
        r = subprocess.run(["unshare", "--net", "sh", "-c", setup + ' && exec "$@"', "sh",
                            sys.executable, os.path.abspath(__file__), BIN,
                            f"{type(self).__name__}.{test}"],
                           env=dict(os.environ, DDPL_DASHBOARD_NETNS="1"),
                           capture_output=True, text=True, timeout=180)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])

    def test_the_grafana_dashboard_asks_only_for_served_series(self):
        root = os.path.dirname(os.path.dirname(HERE))
        with open(os.path.join(root, "deploy", "grafana", "ddplaunch-job.json")) as f:
            board = json.load(f)
        asked = set()
        for panel in board["panels"]:
            for t in panel["targets"]:
                asked |= set(re.findall(r"\bddpl_[a-z_]+", t["expr"]))
        with open(os.path.join(root, "docs", "monitoring.md")) as f:
            # The documented series are the served ones (Metrics.TheDocumentedNamesAreTheServedOnes).
            documented = set(re.findall(r"\bddpl_[a-z_]+", f.read()))
        self.assertTrue(asked)
        self.assertLessEqual(asked, documented, asked - documented)

    def test_a_bad_address_is_a_usage_error(self):
        for bad, says in (("--dashboard=127.0.0.1:70000", "65535"),
                          ("--dashboard=:80", "no host")):
            r = subprocess.run([os.path.join(BIN, "launch"), bad, "--nproc-per-node=1", JOB],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(says, r.stderr)


if __name__ == "__main__":
    # Exit 77 when a test was skipped (SKIP_RETURN_CODE): never counted as passed.
    sys.path.insert(0, os.path.join(HERE, "..", "common"))
    import python_test_main  # noqa: E402
    python_test_main.main(argv=sys.argv[:1] + sys.argv[2:])
