"""The include graph of the product folders against the one docs/architecture.md draws.

Every `#include "x/..."` line in common/, proto/, rendezvous/, web/, launcher/, worker/ and
examples/ is an arrow from the room of the file holding it to the room of the file it names. A
room is a top folder, or under launcher/, rendezvous/ and examples/ a sub-folder (launcher/ alone
for main.cc); deeper folders belong to their room (launcher/membership/etcd/ is
launcher/membership). An include whose first folder is not one of those (a system header, the
generated ddpl/config.h and etcd/...) is not an arrow.

docs/architecture.md draws the graph in its `include-graph` block: a line per room, from the top
of the layering to its bottom, `ROOM -> ROOM ROOM ...` (an indented line goes on with the list
above it). The tree passes when
- every arrow of the code is drawn (a failure names the files that make it),
- every drawn arrow is made by some file (the document does not drift the other way),
- every drawn arrow points down the block (an arrow to its own line or one above is an arrow
  back up: the order is the layering, so a cycle cannot be drawn either),
- every room of the tree has its line, and every line is a room of the tree.

Usage: include_graph_test.py (CTest runs it; standard library only)."""
import collections
import os
import re
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRODUCT = ("common", "proto", "rendezvous", "web", "launcher", "worker", "examples")
WINGS = ("launcher", "rendezvous", "examples")  # top folders whose sub-folders are rooms
SOURCES = (".h", ".hpp", ".cc", ".cpp", ".c", ".h.in", ".proto")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
BLOCK = re.compile(r"^```include-graph\n(.*?)^```", re.M | re.S)


def room_of(path, is_dir=lambda p: os.path.isdir(os.path.join(ROOT, p))):
    """The room of a repository path ("launcher/agent/agent.cc" -> "launcher/agent"), or None
    for a path outside the product folders."""
    parts = path.split("/")
    if parts[0] not in PRODUCT or len(parts) < 2:
        return None
    if parts[0] in WINGS and len(parts) > 2:
        return parts[0] + "/" + parts[1]
    if parts[0] in WINGS and is_dir("/".join(parts[:2])):
        return parts[0] + "/" + parts[1]
    return parts[0]


def scan(root=ROOT):
    """({(from, to): [file -> include, ...]}, {every room with a source file})."""
    arrows = collections.defaultdict(list)
    rooms = set()
    for top in PRODUCT:
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs.sort()
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.relpath(os.path.join(d, name), root)
                src = room_of(path, lambda p: os.path.isdir(os.path.join(root, p)))
                rooms.add(src)
                with open(os.path.join(d, name), errors="replace") as f:
                    for line in f:
                        m = INCLUDE.match(line)
                        if not m or "/" not in m.group(1):
                            continue
                        # What it names may be generated (proto/*.pb.h): its room by its path.
                        dst = room_of(m.group(1), lambda p: os.path.isdir(os.path.join(root, p)))
                        if dst and dst != src:
                            arrows[(src, dst)].append(f"{path} -> {m.group(1)}")
    return arrows, rooms


def parse_block(text):
    """The document's block as ([rooms top to bottom], {(from, to)}). Raises ValueError."""
    m = BLOCK.search(text)
    if not m:
        raise ValueError("docs/architecture.md has no ```include-graph block")
    order, drawn = [], set()
    for n, raw in enumerate(m.group(1).splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if raw[0].isspace() and "->" not in line and order:  # the last line's list goes on
            drawn.update((order[-1], t) for t in line.split())
            continue
        if "->" not in line:
            raise ValueError(f"include-graph line {n}: '{line}' is not 'ROOM -> ROOM ...'")
        src, targets = line.split("->", 1)
        src = src.strip()
        if src in order:
            raise ValueError(f"include-graph line {n}: {src} has a line already")
        order.append(src)
        drawn.update((src, t) for t in targets.split())
    return order, drawn


def problems(order, drawn, arrows, rooms):
    """What is wrong between the drawing and the code, one line each; [] when they agree."""
    out = []
    rank = {r: i for i, r in enumerate(order)}
    for r in sorted(rooms - set(rank)):
        out.append(f"room {r} has no line in the include-graph block (place it in the layering)")
    for r in sorted(set(rank) - rooms):
        out.append(f"the include-graph block has a line for {r}, which has no source file")
    for src, dst in sorted(drawn):
        if dst not in rank:
            out.append(f"drawn arrow {src} -> {dst}: {dst} has no line")
        elif rank[dst] <= rank[src]:
            out.append(f"drawn arrow {src} -> {dst} points back up (the block's order is the "
                       "layering: a room may include only rooms below its line)")
    for (src, dst), where in sorted(arrows.items()):
        if (src, dst) not in drawn:
            shown = "; ".join(where[:3]) + (f"; and {len(where) - 3} more" if len(where) > 3 else "")
            up = src in rank and dst in rank and rank[dst] <= rank[src]
            out.append(f"arrow {src} -> {dst} {'points back up and ' if up else ''}is not drawn "
                       f"in docs/architecture.md: {shown}")
    for src, dst in sorted(drawn - set(arrows)):
        out.append(f"drawn arrow {src} -> {dst} is made by no include (remove it from the block)")
    return out


class TheTree(unittest.TestCase):
    def test_the_code_includes_what_the_architecture_draws(self):
        with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
            order, drawn = parse_block(f.read())
        arrows, rooms = scan()
        found = problems(order, drawn, arrows, rooms)
        self.assertEqual(found, [], "\n" + "\n".join(found))

    def test_rendezvous_common_and_web_include_nothing_of_launcher(self):
        arrows, _ = scan()
        up = [w for (src, dst), where in arrows.items() for w in where
              if src.split("/")[0] in ("rendezvous", "common", "web") and dst.startswith("launcher")]
        self.assertEqual(up, [])


class TheChecker(unittest.TestCase):
    """The checks themselves, on made-up graphs: each kind of drift is caught."""

    DOC = "x\n```include-graph\n# top\nlauncher/agent -> launcher/cli common\n" \
            "launcher/cli -> common\ncommon ->\n```\n"

    def setUp(self):
        self.order, self.drawn = parse_block(self.DOC)
        self.rooms = {"launcher/agent", "launcher/cli", "common"}
        self.arrows = {("launcher/agent", "launcher/cli"): ["launcher/agent/a.cc -> launcher/cli/c.h"],
                       ("launcher/agent", "common"): ["launcher/agent/a.cc -> common/log.h"],
                       ("launcher/cli", "common"): ["launcher/cli/c.cc -> common/log.h"]}

    def test_agreement_is_no_problem(self):
        self.assertEqual(problems(self.order, self.drawn, self.arrows, self.rooms), [])

    def test_an_arrow_back_up_in_the_code_fails_naming_the_file(self):
        self.arrows[("launcher/cli", "launcher/agent")] = ["launcher/cli/c.cc -> launcher/agent/a.h"]
        found = problems(self.order, self.drawn, self.arrows, self.rooms)
        self.assertEqual(len(found), 1)
        self.assertIn("arrow launcher/cli -> launcher/agent points back up", found[0])
        self.assertIn("launcher/cli/c.cc -> launcher/agent/a.h", found[0])

    def test_an_arrow_back_up_cannot_be_drawn_either(self):
        self.drawn.add(("common", "launcher/cli"))
        self.arrows[("common", "launcher/cli")] = ["common/x.cc -> launcher/cli/c.h"]
        found = problems(self.order, self.drawn, self.arrows, self.rooms)
        self.assertEqual(len(found), 1)
        self.assertIn("drawn arrow common -> launcher/cli points back up", found[0])

    def test_an_undrawn_arrow_down_fails(self):
        self.drawn.discard(("launcher/agent", "common"))
        found = problems(self.order, self.drawn, self.arrows, self.rooms)
        self.assertEqual(len(found), 1)
        self.assertIn("arrow launcher/agent -> common is not drawn", found[0])

    def test_a_drawn_arrow_no_include_makes_fails(self):
        del self.arrows[("launcher/agent", "common")]
        found = problems(self.order, self.drawn, self.arrows, self.rooms)
        self.assertEqual(found, ["drawn arrow launcher/agent -> common is made by no include "
                                 "(remove it from the block)"])

    def test_rooms_without_a_line_and_lines_without_a_room_fail(self):
        found = problems(self.order, self.drawn, self.arrows, self.rooms | {"web"})
        self.assertEqual(found, ["room web has no line in the include-graph block (place it in "
                                 "the layering)"])
        found = problems(self.order, self.drawn, self.arrows, self.rooms - {"common"})
        self.assertIn("the include-graph block has a line for common, which has no source file",
                      found)

    def test_rooms_are_top_folders_or_the_wings_sub_folders(self):
        self.assertEqual(room_of("launcher/membership/etcd/etcd_join.cc"), "launcher/membership")
        self.assertEqual(room_of("launcher/main.cc"), "launcher")
        self.assertEqual(room_of("rendezvous/server/server.h"), "rendezvous/server")
        self.assertEqual(room_of("examples/ddp_resnet/train.cc"), "examples/ddp_resnet")
        self.assertEqual(room_of("web/dashboard.h"), "web")
        self.assertEqual(room_of("proto/rendezvous.grpc.pb.h"), "proto")
        self.assertIsNone(room_of("ddpl/config.h"))
        self.assertIsNone(room_of("tests/common/subprocess.h"))

    def test_a_malformed_block_is_refused(self):
        with self.assertRaises(ValueError):
            parse_block("no block here")
        with self.assertRaises(ValueError):
            parse_block("```include-graph\ncommon\n```\n")
        with self.assertRaises(ValueError):
            parse_block("```include-graph\ncommon ->\ncommon ->\n```\n")

    def test_an_indented_line_goes_on_with_the_list_above(self):
        order, drawn = parse_block("```include-graph\na -> b\n   c  # more\nb ->\nc ->\n```\n")
        self.assertEqual(order, ["a", "b", "c"])
        self.assertEqual(drawn, {("a", "b"), ("a", "c")})


if __name__ == "__main__":
    # Exit 77 when a test was skipped (SKIP_RETURN_CODE): never counted as passed.
    sys.path.insert(0, os.path.join(ROOT, "tests", "common"))
    import python_test_main  # noqa: E402
    python_test_main.main()
