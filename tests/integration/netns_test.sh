#!/usr/bin/env bash
# Three "hosts" with their own addresses: network namespaces n1..n3 on a private bridge (made
# here, inside this machine, removed at exit). One launch agent per host, the rendezvous hosted
# by n1's agent at its address, a real Gloo job (one PyTorch worker per host). Checks that the
# job completes, that MASTER_ADDR is group rank 0's own interface address (what the others can
# reach, not loopback and not a reverse-DNS guess), and that every rank agrees on it.
# Exits 77 (CTest: skipped) saying why where namespaces cannot be made.
# Usage: netns_test.sh BIN_DIR SOURCE_DIR PYTHON
set -u
BIN="$1"; SRC="$2"; PY="$3"
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
[ "$(id -u)" = 0 ] || skip "needs root for ip netns"
command -v ip >/dev/null || skip "iproute2 not installed"
TAG="d$$"
SW="${TAG}sw"
NS=("${TAG}n1" "${TAG}n2" "${TAG}n3")
DIR="$(mktemp -d /tmp/ddpl-netns-XXXXXX)"
cleanup() {
  for n in "${NS[@]}" "$SW"; do
    ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$n" 2>/dev/null
  done
  rm -rf "$DIR"
}
trap cleanup EXIT
ip netns add "$SW" 2>/dev/null || skip "ip netns add failed (no CAP_SYS_ADMIN or no netns support)"
ip -n "$SW" link add br0 type bridge && ip -n "$SW" link set br0 up && ip -n "$SW" link set lo up \
  || skip "cannot create a bridge in a namespace"
for i in 1 2 3; do
  n="${NS[$((i-1))]}"
  ip netns add "$n" || skip "ip netns add $n failed"
  ip link add "${TAG}v$i" type veth peer name "${TAG}p$i" || skip "cannot create veth pairs"
  ip link set "${TAG}v$i" netns "$n"
  ip link set "${TAG}p$i" netns "$SW"
  ip -n "$SW" link set "${TAG}p$i" master br0 up
  ip -n "$n" link set lo up
  ip -n "$n" link set "${TAG}v$i" name eth0
  ip -n "$n" addr add "10.77.0.$i/24" dev eth0
  ip -n "$n" link set eth0 up
done

cat > "$DIR/worker.sh" <<W
#!/bin/sh
myip=\$(ip -o -4 addr show dev eth0 | awk '{print \$4}' | cut -d/ -f1)
echo "INFO group_rank=\$GROUP_RANK rank=\$RANK world=\$WORLD_SIZE master=\$MASTER_ADDR myip=\$myip"
exec "$PY" "$SRC/tests/python/elastic_gloo.py"
W
chmod +x "$DIR/worker.sh"
mkdir -p "$DIR/ckpt"
pids=()
for i in 1 2 3; do
  ip netns exec "${NS[$((i-1))]}" env GLOO_SOCKET_IFNAME=eth0 CKPT_DIR="$DIR/ckpt" TOTAL_STEPS=10 \
    STEP_SECONDS=0.05 OMP_NUM_THREADS=1 \
    "$BIN/launch" --nnodes=3 --nproc-per-node=1 --rdzv-backend=c10d \
    --rdzv-endpoint=10.77.0.1:29400 --rdzv-id=netns --rdzv-conf=join_timeout=60 \
    "$DIR/worker.sh" > "$DIR/agent$i.log" 2>&1 &
  pids+=($!)
  sleep 0.3
done
rc=0
for p in "${pids[@]}"; do
  # bounded: the job takes seconds; a hang is a failure, not a wait
  for t in $(seq 600); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$p" 2>/dev/null && { kill -9 "$p"; rc=1; }
  wait "$p" || rc=1
done
all="$(cat "$DIR"/agent*.log)"
[ "$rc" = 0 ] || fail "an agent failed or hung: $all"
echo "$all" | grep -q "hosted by this agent" || fail "nobody hosted the rendezvous: $all"
info="$(echo "$all" | grep -o 'INFO .*')"
[ "$(echo "$info" | wc -l)" = 3 ] || fail "expected 3 workers: $info"
masters="$(echo "$info" | sed 's/.*master=\([^ ]*\).*/\1/' | sort -u)"
[ "$(echo "$masters" | wc -l)" = 1 ] || fail "ranks disagree on MASTER_ADDR: $info"
rank0ip="$(echo "$info" | grep 'group_rank=0 ' | sed 's/.*myip=//')"
[ "$masters" = "$rank0ip" ] || fail "MASTER_ADDR $masters is not group rank 0's address $rank0ip: $info"
[ "$(echo "$all" | grep -c 'done rank=. world=3 step=10')" = 3 ] || fail "job did not finish on 3 hosts: $all"
echo "$info"
echo "netns_test: 1 passed, 0 failed"
