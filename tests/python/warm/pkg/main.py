"""Run as `-m pkg.main`: a relative import, and what -m sets."""
import json
import os
import sys

from . import sibling

with open(os.path.join(os.environ["PROBE_DIR"], f"{os.environ['PROBE_MODE']}.{os.environ['RANK']}.json"), "w") as f:
    json.dump({"argv": sys.argv, "name": __name__, "package": __package__, "file": __file__,
               "spec_name": __spec__.name, "path0": sys.path[0], "sibling": sibling.VALUE,
               "main_keys": sorted(k for k in globals() if k.startswith("__"))}, f, sort_keys=True)
