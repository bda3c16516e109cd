# Stays alive until launch's probe child has finished the manifest at argv[1] (the probe is
# killed with the run, so a test that wants every field waits for it), at most 90 s.
import json, sys, time
deadline = time.time() + 90
while time.time() < deadline:
    try:
        with open(sys.argv[1]) as f:
            m = json.load(f)
        if isinstance(m.get("python"), dict) and "packages_sha256" in m["python"]:
            sys.exit(0)
    except (OSError, ValueError):
        pass
    time.sleep(0.1)
sys.exit("manifest never probed")
