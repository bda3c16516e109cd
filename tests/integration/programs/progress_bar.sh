#!/bin/sh
# A worker that draws a progress bar with carriage returns, as tqdm does, and waits between
# updates for the test ($OUT_DIR/go.N files) so the test can see each update arrive live.
# Rank 1 prints an ordinary line while rank 0's bar is on screen.
if [ -t 1 ] && [ -t 2 ]; then tty=terminal; else tty=pipe; fi
if [ "$RANK" = 0 ]; then
  printf 'stdout is a %s\n' "$tty"
  printf '\rprogress 1/3'
  while [ ! -e "$OUT_DIR/go.1" ]; do sleep 0.02; done
  printf '\rprogress 2/3'
  while [ ! -e "$OUT_DIR/go.2" ]; do sleep 0.02; done
  printf '\rprogress 3/3\n'
else
  while [ ! -e "$OUT_DIR/go.1" ]; do sleep 0.02; done
  echo "rank 1 says hello"
  touch "$OUT_DIR/said.1"
fi
