#!/usr/bin/env bash
# The wheel as a torchrun user meets it: built (make wheel's script), installed into a fresh
# virtual environment that is not .venv, and used without activating it: `venv/bin/launch` must
# run a 2-rank Gloo DDP script under that environment's interpreter (python3 on PATH has no
# torch here), and `venv/bin/rdzv-server --help` must work. The fresh environment sees the
# pinned torch through a .pth file naming .venv's site-packages (a re-install would copy GBs).
# Usage: wheel_test.sh SOURCE_DIR
set -euo pipefail
SRC="$1"
T=$(mktemp -d /tmp/ddpl-wheel-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "wheel_test: FAIL: $*" >&2; exit 1; }

cd "$SRC"
bash scripts/wheel.sh "$T/dist"
wheel=$(ls "$T"/dist/ddplaunch-*manylinux*.whl)

/usr/bin/python3 -m venv "$T/venv"
"$T/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps "$wheel"
site=$("$T/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$SRC/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/pinned-torch.pth"
"$T/venv/bin/python" -c 'import torch' || fail "the fresh environment cannot import the pinned torch"

# Neither venv on PATH, nothing that names an interpreter: launch must find its own.
clean_env=(env -u PYTHON_EXEC -u DDPL_LAUNCH_PYTHON -u VIRTUAL_ENV PATH=/usr/bin:/bin OMP_NUM_THREADS=1)
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "wheel_test: note: /usr/bin/python3 has torch too, so the interpreter check is weaker here"
fi
out=$("${clean_env[@]}" "$T/venv/bin/launch" --standalone --nproc-per-node=2 \
      "$SRC/tests/python/ddp_gloo.py" 2>&1) || fail "launch from the wheel failed: $out"
for r in 0 1; do
  grep -q "^\[default$r\]:DDP OK rank=$r world=2" <<<"$out" || fail "no DDP OK from rank $r in: $out"
done
out=$("${clean_env[@]}" "$T/venv/bin/launch" --log-level=debug --nproc-per-node=1 \
      "$SRC/tests/integration/programs/hello.py" 2>&1) || fail "hello.py: $out"
grep -q "Python: $T/venv/bin/python" <<<"$out" || fail "launch did not choose the wheel's environment: $out"

# The progress call from the wheel's own package (the script's directory holds no ddplaunch, so
# the checkout's python/ is not what answers), reaching the wheel's launch.
printf '%s\n' 'import ddplaunch' 'for _ in range(3): ddplaunch.step()' \
  'print("steps", ddplaunch.current(), ddplaunch.enabled(), ddplaunch.__file__)' > "$T/steps.py"
out=$("${clean_env[@]}" "$T/venv/bin/launch" --nproc-per-node=1 "$T/steps.py" 2>&1) || fail "steps.py: $out"
grep -q "^\[default0\]:steps 3 True $T/venv/.*/site-packages/ddplaunch/__init__.py" <<<"$out" ||
  fail "ddplaunch.step() from the wheel did not reach launch: $out"

"${clean_env[@]}" "$T/venv/bin/rdzv-server" --help | grep -q "usage: rdzv-server" || fail "rdzv-server --help"
echo "wheel_test: ok ($(basename "$wheel"))"
