#!/bin/sh
# Leaves a grandchild in its group and one in a new session, records their pids, then waits.
sleep 300 &
echo $! >> "$OUT_DIR/pids"
setsid sleep 301 &
echo $! >> "$OUT_DIR/pids"
echo $$ >> "$OUT_DIR/pids"
echo ready > "$OUT_DIR/ready.$RANK"
if [ "${EXIT_NOW:-0}" = 1 ]; then exit 0; fi
sleep 302
