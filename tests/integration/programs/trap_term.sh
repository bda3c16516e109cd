#!/bin/sh
# Records the signals it gets; exits 0 on TERM. With IGNORE_TERM=1 it ignores TERM instead.
if [ "${IGNORE_TERM:-0}" = 1 ]; then
  trap 'echo "ignored TERM" >> "$OUT_DIR/signals.$RANK"' TERM
else
  trap 'echo "got TERM" >> "$OUT_DIR/signals.$RANK"; exit 0' TERM
fi
trap 'echo "got USR1" >> "$OUT_DIR/signals.$RANK"' USR1
echo ready > "$OUT_DIR/ready.$RANK"
if [ "$RANK" = "${FAIL_RANK:--1}" ]; then sleep 0.2; exit 5; fi
i=0
while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
