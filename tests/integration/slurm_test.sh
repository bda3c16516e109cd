#!/usr/bin/env bash
# launch under a real Slurm: a one-host cluster (munged, slurmctld, slurmd from Debian) started
# here in a private directory, with its own ports and munge socket. Exits 77 (CTest: skipped)
# saying why when such a cluster cannot be started on this machine.
# Usage: slurm_test.sh BIN_DIR SOURCE_DIR
set -u
BIN="$1"; SRC="$2"
PROGS="$SRC/tests/integration/programs"
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; for f in "$DIR"/*.log; do echo "--- $f"; tail -20 "$f"; done; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root to run slurmd"
for b in munged slurmctld slurmd srun sbatch sinfo scancel; do
  command -v "$b" >/dev/null || skip "$b not installed (make setup installs slurmctld slurmd slurm-client munge)"
done

DIR="$(mktemp -d /tmp/ddpl-slurm-XXXXXX)"
PIDS=()
# Job steps run in slurmstepd processes that slurmd daemonizes (parent 1): they are not in
# PIDS. Those that were here before the test are not ours.
stepds() { ps -o pid=,stat= -C slurmstepd | awk '$2 !~ /^Z/ {print $1}' | sort; }  # zombies are gone
STEPDS_BEFORE="$(stepds)"
our_stepds() { comm -13 <(echo "$STEPDS_BEFORE") <(stepds) | grep . || true; }
cleanup() {
  scancel --full "$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')" 2>/dev/null
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  for p in $(our_stepds); do kill -9 "$p" 2>/dev/null; done
  rm -rf "$DIR"
}
trap cleanup EXIT

# The reservation tests/common/subprocess.cc's freeLoopbackPort makes, so that tests running in
# parallel (ctest -j) never pick one port: below the ephemeral range (which port-0 binds of other
# programs draw from), claimed by an O_EXCL file in /tmp/ddpl-test-ports, then checked by a bind.
free_port() {
  python3 - <<'PY'
import os, random, socket, time
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
first, last = 10000, max(10000 + 1000, lo) - 1
d = "/tmp/ddpl-test-ports"
os.makedirs(d, mode=0o777, exist_ok=True)
for _ in range(1000):
    port = random.randint(first, last)
    lock = os.path.join(d, str(port))
    try:
        if time.time() - os.stat(lock).st_mtime < 600:
            continue
        os.unlink(lock)
    except FileNotFoundError:
        pass
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    except FileExistsError:
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("no free loopback port below the ephemeral range after 1000 tries")
PY
}
HOST="$(hostname -s)"
mkdir -p "$DIR/state" "$DIR/spool"
head -c 1024 /dev/urandom > "$DIR/munge.key"; chmod 400 "$DIR/munge.key"
munged --force --foreground --socket="$DIR/munge.sock" --key-file="$DIR/munge.key" \
  --pid-file="$DIR/munged.pid" --log-file="$DIR/munged.log" --seed-file="$DIR/munge.seed" &
PIDS+=($!)

cat > "$DIR/slurm.conf" <<CONF
ClusterName=ddpltest
SlurmctldHost=$HOST
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$DIR/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
MpiDefault=none
ReturnToService=2
NodeName=$HOST CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$DIR/slurm.conf"
for i in $(seq 50); do [ -S "$DIR/munge.sock" ] && break; sleep 0.1; done
[ -S "$DIR/munge.sock" ] || skip "munged did not start: $(tail -3 "$DIR/munged.log" 2>/dev/null)"
slurmctld -D -i > "$DIR/slurmctld.out.log" 2>&1 & PIDS+=($!)
slurmd -D > "$DIR/slurmd.out.log" 2>&1 & PIDS+=($!)
ready=""
for i in $(seq 150); do
  state="$(sinfo -h -o %T 2>/dev/null | head -1)"
  case "$state" in idle*|mixed*|allocated*) ready=1; break;; esac
  sleep 0.2
done
[ -n "$ready" ] || skip "the one-host Slurm cluster did not come up (node state '${state:-none}'): $(tail -3 "$DIR/slurmd.log" "$DIR/slurmctld.log" 2>/dev/null | tr '\n' ' ')"
echo "Slurm up on $HOST"

# 1. srun launch: workers get the torchrun environment from launch inside a Slurm step.
out="$(timeout 120 srun -N1 -n1 "$BIN/launch" --nproc-per-node=2 "$PROGS/env_dump.sh" 2>&1)" || fail "srun launch failed: $out"
echo "$out" | grep -q '^\[default1\]:RANK=1$' || fail "no rank 1 in: $out"
echo "$out" | grep -q '^\[default0\]:WORLD_SIZE=2$' || fail "wrong world size in: $out"
echo "ok: srun launch"

# 2. The ready sbatch script, as users submit it: no LAUNCH, launch on PATH (sbatch runs a
# spooled copy of the script, so nothing may be found relative to it).
jobout="$DIR/job.out"
PATH="$BIN:$PATH" NPROC_PER_NODE=2 timeout 120 sbatch --wait --nodes=1 -o "$jobout" \
  "$SRC/deploy/slurm/train.sbatch" "$PROGS/env_dump.sh" >/dev/null || fail "sbatch job failed: $(cat "$jobout")"
grep -q '^\[default1\]:RANK=1$' "$jobout" || fail "sbatch output lacks rank 1: $(cat "$jobout")"
# Without launch anywhere: a clear error, not a path into Slurm's spool directory.
(cd "$DIR" && env -u LAUNCH PATH=/usr/bin:/bin timeout 60 sbatch --wait --nodes=1 -o "$DIR/nolaunch.out" \
  "$SRC/deploy/slurm/train.sbatch" "$PROGS/env_dump.sh" >/dev/null) && fail "sbatch without launch succeeded"
grep -q "cannot find launch" "$DIR/nolaunch.out" || fail "no clear error without launch: $(cat "$DIR/nolaunch.out")"
echo "ok: deploy/slurm/train.sbatch"

# 3. Preemption warning: SIGUSR1 from Slurm reaches the workers through launch.
sigdir="$DIR/sig"; mkdir -p "$sigdir"
jobid="$(OUT_DIR="$sigdir" LAUNCH="$BIN/launch" NPROC_PER_NODE=2 sbatch --parsable --nodes=1 \
  -o "$DIR/sig.out" "$SRC/deploy/slurm/train.sbatch" "$PROGS/trap_term.sh")" || fail "sbatch failed"
for i in $(seq 150); do [ -f "$sigdir/ready.0" ] && [ -f "$sigdir/ready.1" ] && break; sleep 0.2; done
[ -f "$sigdir/ready.1" ] || fail "workers did not start: $(cat "$DIR/sig.out")"
scancel --signal=USR1 "$jobid"
# Slurm signals every process of the step, and launch forwards too: each worker must see it.
got_both() { grep -q "got USR1" "$sigdir/signals.0" 2>/dev/null && grep -q "got USR1" "$sigdir/signals.1" 2>/dev/null; }
launch_saw() { grep -q "forwarding SIGUSR1 to the workers" "$DIR/sig.out" 2>/dev/null; }
for i in $(seq 100); do got_both && launch_saw && break; sleep 0.1; done
got_both || fail "SIGUSR1 did not reach both workers: $(cat "$DIR/sig.out")"
launch_saw || fail "launch did not forward SIGUSR1: $(cat "$DIR/sig.out")"
scancel "$jobid"
echo "ok: SIGUSR1 forwarded to the workers"

# 4. Nothing of the test's cluster outlives it: every job ends, then every step daemon.
for i in $(seq 100); do [ -z "$(squeue -h 2>/dev/null)" ] && [ -z "$(our_stepds)" ] && break; sleep 0.2; done
[ -z "$(squeue -h 2>/dev/null)" ] || fail "jobs still queued or running: $(squeue 2>&1)"
[ -z "$(our_stepds)" ] || fail "slurmstepd still running after every job ended: $(our_stepds | tr '\n' ' ')"
echo "ok: no job or step left"
echo "slurm_test: 4 passed, 0 failed"
