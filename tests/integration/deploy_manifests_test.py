"""deploy/: the Kubernetes manifests parse and agree with launch's flags, rdzv-server's flags,
and each other (ports, names, secrets, exit codes). Usage: deploy_manifests_test.py BIN_DIR"""
import glob
import os
import re
import subprocess
import sys
import unittest

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(ROOT, "build", "bin")


def docs():
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "deploy", "k8s", "*.yaml"))):
        with open(path) as f:
            out += [d for d in yaml.safe_load_all(f) if d]
    return out


def find(kind, name):
    for d in docs():
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    raise AssertionError(f"no {kind} named {name} in deploy/k8s")


def help_flags(binary):
    text = subprocess.run([os.path.join(BIN, binary), "--help"], capture_output=True,
                          text=True, check=True).stdout
    return set(re.findall(r"--[a-z][a-z0-9-]*", text))


def flag_value(args, flag):
    for i, a in enumerate(args):
        if a == flag:
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {args}")


class K8sManifests(unittest.TestCase):
    def test_every_document_parses_with_kind_and_name(self):
        ds = docs()
        self.assertGreaterEqual(len(ds), 5)
        for d in ds:
            self.assertIn("kind", d)
            self.assertIn("name", d["metadata"])

    def test_rdzv_server_flags_and_ports_agree(self):
        dep = find("Deployment", "ddpl-rdzv")
        c = dep["spec"]["template"]["spec"]["containers"][0]
        known = help_flags("rdzv-server")
        for a in c["args"]:
            if a.startswith("--"):
                self.assertIn(a.split("=")[0], known, f"rdzv-server has no flag {a}")
        port = int(flag_value(c["args"], "--port"))
        self.assertEqual(c["ports"][0]["containerPort"], port)
        # The open-file limit is raised for the server's configured connections.
        cmd = " ".join(c["command"])
        limit = int(re.search(r"ulimit -n (\d+)", cmd).group(1))
        self.assertGreaterEqual(limit, int(flag_value(c["args"], "--max-connections")) + 64)
        self.assertIn("exec /opt/ddplaunch/bin/rdzv-server", cmd)
        svc = find("Service", "ddpl-rdzv")
        self.assertEqual(svc["spec"]["ports"][0]["port"], port)
        self.assertEqual(svc["spec"]["ports"][0]["targetPort"], port)
        self.assertEqual(svc["spec"]["selector"], dep["spec"]["template"]["metadata"]["labels"])

    def test_training_job_uses_real_launch_flags_and_reaches_the_service(self):
        job = find("Job", "ddpl-train")
        c = job["spec"]["template"]["spec"]["containers"][0]
        args = c["args"]
        known = help_flags("launch")
        program_at = next(i for i, a in enumerate(args) if not a.startswith("-"))
        for a in args[:program_at]:
            self.assertIn(a.split("=")[0], known, f"launch has no flag {a}")
        host, port = flag_value(args, "--rdzv-endpoint").split(":")
        svc = find("Service", host)
        self.assertEqual(svc["spec"]["ports"][0]["port"], int(port))
        nnodes = flag_value(args, "--nnodes")
        lo, hi = (int(x) for x in nnodes.split(":"))
        self.assertEqual(job["spec"]["completions"], hi)
        self.assertLessEqual(lo, hi)
        # The Job's pods are the headless Service's endpoints.
        headless = find("Service", job["spec"]["template"]["spec"]["subdomain"])
        self.assertEqual(headless["spec"]["clusterIP"], "None")

    def test_token_comes_from_the_same_secret_everywhere(self):
        secret = find("Secret", "ddpl-rdzv-token")
        job = find("Job", "ddpl-train")
        env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        ref = env["DDPL_RDZV_TOKEN"]["valueFrom"]["secretKeyRef"]
        self.assertEqual(ref["name"], secret["metadata"]["name"])
        self.assertIn(ref["key"], secret["stringData"])
        dep = find("Deployment", "ddpl-rdzv")
        vols = dep["spec"]["template"]["spec"]["volumes"]
        self.assertEqual(vols[0]["secret"]["secretName"], secret["metadata"]["name"])

    def test_failure_policy_matches_launchs_usage_exit_code(self):
        r = subprocess.run([os.path.join(BIN, "launch"), "--no-such-flag", "x"],
                           capture_output=True)
        job = find("Job", "ddpl-train")
        rule = job["spec"]["podFailurePolicy"]["rules"][0]
        self.assertEqual(rule["action"], "FailJob")
        self.assertEqual(rule["onExitCodes"]["values"], [r.returncode])


    def test_rdzv_server_runs_hardened(self):
        dep = find("Deployment", "ddpl-rdzv")
        c = dep["spec"]["template"]["spec"]["containers"][0]
        sc = c["securityContext"]
        self.assertTrue(sc["runAsNonRoot"])
        self.assertNotEqual(sc["runAsUser"], 0)
        self.assertTrue(sc["readOnlyRootFilesystem"])
        self.assertFalse(sc["allowPrivilegeEscalation"])
        self.assertEqual(sc["capabilities"]["drop"], ["ALL"])
        for kind in ("requests", "limits"):
            self.assertIn("cpu", c["resources"][kind])
            self.assertIn("memory", c["resources"][kind])
        port = int(flag_value(c["args"], "--port"))
        for probe in ("readinessProbe", "livenessProbe"):
            self.assertEqual(c[probe]["tcpSocket"]["port"], port)

    def test_the_secret_as_shipped_gives_no_usable_token(self):
        secret = find("Secret", "ddpl-rdzv-token")
        self.assertEqual(secret["stringData"]["token"], "")
        # ... which both programs refuse, rather than run with it.
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".token") as f:
            f.write(secret["stringData"]["token"])
            f.flush()
            r = subprocess.run([os.path.join(BIN, "rdzv-server"), "--port", "0", "--token-file",
                                f.name], capture_output=True, text=True, timeout=30)
            self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn(f.name, r.stdout + r.stderr)
        r = subprocess.run([os.path.join(BIN, "launch"), "--nnodes=2", "--rdzv-backend=c10d",
                            "--rdzv-endpoint=127.0.0.1:1", "/bin/true"],
                           capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, DDPL_RDZV_TOKEN=""))
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("DDPL_RDZV_TOKEN is set but empty", r.stderr)


class Systemd(unittest.TestCase):
    def test_unit_starts_rdzv_server_with_real_flags(self):
        with open(os.path.join(ROOT, "deploy", "systemd", "rdzv-server.service")) as f:
            line = next(l for l in f if l.startswith("ExecStart="))
        known = help_flags("rdzv-server")
        for a in line.split()[1:]:
            if a.startswith("--"):
                self.assertIn(a, known)
        with open(os.path.join(ROOT, "deploy", "systemd", "rdzv-server.service")) as f:
            unit = f.read()
        nofile = int(re.search(r"^LimitNOFILE=(\d+)$", unit, re.M).group(1))
        args = line.split()
        self.assertGreaterEqual(nofile, int(flag_value(args, "--max-connections")) + 64)


if __name__ == "__main__":
    # Exit 77 when a test was skipped (SKIP_RETURN_CODE): never counted as passed.
    sys.path.insert(0, os.path.join(ROOT, "tests", "common"))
    import python_test_main  # noqa: E402
    python_test_main.main()
