#!/bin/sh
# Rank $FAIL_RANK (default 1) exits with $FAIL_CODE while TORCHELASTIC_RESTART_COUNT < $FAILS.
if [ "$RANK" = "${FAIL_RANK:-1}" ] && [ "$TORCHELASTIC_RESTART_COUNT" -lt "${FAILS:-1}" ]; then
  echo "boom on rank $RANK (attempt $TORCHELASTIC_RESTART_COUNT)" >&2
  if [ -n "$FAIL_SIGNAL" ]; then kill -"$FAIL_SIGNAL" $$; fi
  exit "${FAIL_CODE:-3}"
fi
sleep "${SLEEP:-0.3}"
echo "rank $RANK done in attempt $TORCHELASTIC_RESTART_COUNT"
