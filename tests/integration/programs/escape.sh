#!/bin/sh
# Starts a descendant that leaves everything launch could follow it by: its process group and
# session (setsid), its parent (setsid -f forks, and the forking parent exits: a double fork)
# and its environment (env -i: no run marker). Records that process's pid, then waits or exits.
env -i /usr/bin/setsid -f /bin/sh -c 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1"; exec /bin/sleep 303' \
  escapee "$OUT_DIR/escapee.$RANK"
while [ ! -s "$OUT_DIR/escapee.$RANK" ]; do sleep 0.02; done
echo ready > "$OUT_DIR/ready.$RANK"
if [ "${EXIT_NOW:-0}" = 1 ]; then exit 0; fi
sleep 302
